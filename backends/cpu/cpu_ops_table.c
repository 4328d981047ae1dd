/* llmem: the CPU backend's ops table (<llmem/ops_impl.h>) and its thread
 * settings. The ops live in backends/cpu/ops_*.c, one file per family. */
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_ops.h"

const struct llmem_ops_i llmem_cpu_ops = {
    .struct_size = sizeof(struct llmem_ops_i),
    .matmul = cpu_op_matmul,
    .get_rows = cpu_op_get_rows,
    .add = cpu_op_add,
    .mul = cpu_op_mul,
    .scale = cpu_op_scale,
    .silu = cpu_op_silu,
    .relu2 = cpu_op_relu2,
    .softplus = cpu_op_softplus,
    .swiglu = cpu_op_swiglu,
    .rms_norm = cpu_op_rms_norm,
    .rms_norm_gated = cpu_op_rms_norm_gated,
    .rope = cpu_op_rope,
    .rope_shift = cpu_op_rope_shift,
    .kv_store = cpu_op_kv_store,
    .attention_paged = cpu_op_attention_paged,
    .ssm_conv = cpu_op_ssm_conv,
    .ssm_scan = cpu_op_ssm_scan,
    .copy = cpu_op_copy,
    .copy_blocks = cpu_op_copy_blocks,
    .log_softmax = cpu_op_log_softmax,
    .argmax = cpu_op_argmax,
    .sample = cpu_op_sample,
    .logprob_gather = cpu_op_logprob_gather,
    .top_logprobs = cpu_op_top_logprobs,
    .matmul_fast = cpu_op_matmul_fast,
    .matmul_swiglu = cpu_op_matmul_swiglu,
    .geglu = cpu_op_geglu,
    .softcap = cpu_op_softcap,
};

llmem_status llmem_backend_cpu_set_threads(llmem_backend *be, int32_t n)
{
    if (!be || !be->iface || be->iface->ops != &llmem_cpu_ops || n < 0)
        return LLMEM_E_INVALID;
    llmem_tp_set_threads(n);
    return LLMEM_OK;
}

int32_t llmem_backend_cpu_threads(void)
{
    return llmem_tp_threads();
}

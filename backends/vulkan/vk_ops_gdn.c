/* llmem Vulkan backend: the gated delta net ops (shaders/gdn.comp,
 * shaders/sigmoid_mul.comp). The gated delta rule runs in its recurrent
 * form for every ubatch, one invocation per state column (Yang, Kautz &
 * Hatamizadeh 2024, eq. (10); the CPU reference, backends/cpu/ops_gdn.c,
 * also has the chunked form).
 *
 * Slot discipline as vk_ops_mamba.c: an invocation reads its column of the
 * source before writing it anywhere; when a group's source slot is written
 * by another group (seen in the host tables), vk_rs_prepare first gathers
 * every group's source into an f32 snapshot that the op reads. The
 * snapshot inside the ubatch (llmem_rs_view.snap_tok / snap_slot) is
 * written like a checkpoint (vk_rs_snap_words).
 */
#include "llmem/ops_gdn.h"
#include "llmem/view.h"
#include "vk_internal.h"
#include "vk_rs.h"

#define GDN_WG 64
/* gdn.comp's WO (unset $LLMEM_VULKAN_GDN_WO): the loops over an invocation's state column
 * written out with literal indices where d_k <= 128, so that the column stays in registers
 * (rolled, the H200's driver kept its 512 bytes in local memory): H200 bench gdn decode
 * 0.106 ms against 0.308 (CUDA 0.453), prefill 1.30 against 2.41 (CUDA 2.26)
 * (docs/benchmarks.md, "Vulkan: register arrays out of local memory"). The same operations
 * in the same order; the driver's fma contraction may differ (within f32 rounding) */
#define GDN_WO 1
#define GDN_EW_WG 256

static llmem_status vk_op_gdn(llmem_backend *be, const llmem_gdn_params *p,
                              const llmem_view *view, int32_t state, llmem_ct *qkv, llmem_ct *a,
                              llmem_ct *b, llmem_ct *a_log, llmem_ct *dt_bias, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    if (p->d_k > 256)
        return LLMEM_E_UNSUPPORTED; /* an invocation keeps d_k floats of state */
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    vk_alloc snap = {0};
    bool use_snap = false;
    llmem_status st = vk_rs_prepare(v, view, state, &snap, &use_snap);
    if (st != LLMEM_OK)
        return st;
    uint32_t n_cb = (uint32_t)vk_div_up((uint64_t)p->d_v, GDN_WG);
    vk_op op;
    vk_op_init(&op, VK_SH_GDN, GDN_WG);
    vk_op_spec(&op, (uint32_t)p->d_k);
    vk_op_spec(&op, (uint32_t)sd->dtype);
    vk_op_spec(&op, (uint32_t)a_log->dtype);
    vk_op_spec(&op, (uint32_t)dt_bias->dtype);
    vk_op_spec(&op, use_snap);
    vk_op_spec(&op, llmem_rs_view_snap_used(view) != NULL); /* SNAPSHOT */
    vk_op_spec(&op, (uint32_t)VK_KNOB(v, gdn_wo, GDN_WO));
    uint32_t qo = vk_op_tensor(v, &op, qkv, false);
    uint32_t ao = vk_op_tensor(v, &op, a, false);
    uint32_t bo = vk_op_tensor(v, &op, b, false);
    uint32_t alo = vk_op_tensor(v, &op, a_log, false);
    uint32_t dbo = vk_op_tensor(v, &op, dt_bias, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_rs_bind(v, &op, view, state, use_snap ? &snap : NULL);
    vk_op_u32(&op, (uint32_t)rs->n_seqs);
    vk_op_u32(&op, (uint32_t)rs->n_seq_tokens);
    vk_op_u32(&op, (uint32_t)p->n_k_heads);
    vk_op_u32(&op, (uint32_t)p->n_v_heads);
    vk_op_u32(&op, (uint32_t)p->d_v);
    vk_op_u32(&op, (uint32_t)rs->n_ckpt);
    vk_op_u32(&op, (uint32_t)rs->n_slots);
    vk_op_u32(&op, n_cb);
    vk_op_u32(&op, qo);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, bo);
    vk_op_u32(&op, alo);
    vk_op_u32(&op, dbo);
    vk_op_u32(&op, oo);
    vk_rs_tables(&op, rs);
    vk_op_u32(&op, (uint32_t)(2 * p->n_k_heads * p->d_k + p->n_v_heads * p->d_v));
    vk_rs_snap_words(&op, view); /* the snapshot inside the ubatch, if any */
    st = vk_op_run(v, &op, (uint64_t)rs->n_seqs * (uint64_t)p->n_v_heads * n_cb);
    if (use_snap)
        vk_alloc_release(v, &snap);
    return st;
}

static llmem_status vk_op_sigmoid_mul(llmem_backend *be, llmem_ct *x, llmem_ct *gate,
                                      llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t n = llmem_tensor_nelements(x);
    int64_t cols = x->ne[x->n_dims - 1], cg = gate->ne[gate->n_dims - 1];
    vk_op op;
    vk_op_init(&op, VK_SH_SIGMOID_MUL, GDN_EW_WG);
    uint32_t xo = vk_op_tensor(v, &op, x, false);
    uint32_t go = vk_op_tensor(v, &op, gate, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, (uint32_t)n);
    vk_op_u32(&op, (uint32_t)cols);
    vk_op_u32(&op, (uint32_t)cg);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, go);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n, GDN_EW_WG));
}

/* Registered in the Vulkan backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_GDN, LLMEM_OP_GDN_LAYOUT, llmem_op_gdn_fn, vk_op_gdn);
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_SIGMOID_MUL, LLMEM_OP_SIGMOID_MUL_LAYOUT,
              llmem_op_sigmoid_mul_fn, vk_op_sigmoid_mul);

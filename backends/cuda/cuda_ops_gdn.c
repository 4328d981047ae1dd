/* llmem cuda plugin: the gated delta net ops of <llmem/ops_gdn.h>
 * (kernels/gdn.cu), registered in the plugin's list of open ops. The
 * wrappers of backends/ops_gdn.c have checked every argument; the kernel
 * skips slots outside [0, n_slots). When a group reads
 * a slot another group writes (copy-on-write, seen in the host tables),
 * every source is snapshotted first (cuda_rs_prepare), as for Mamba-2,
 * which also passes the snapshot inside the ubatch (snap_tok / snap_slot). */
#include "backends/cuda/cuda_backend.h"
#include "kernels/gdn.h"
#include "llmem/ops_gdn.h"

static llmem_status cuda_op_gdn(llmem_backend *be, const llmem_gdn_params *p,
                                const llmem_view *view, int32_t state, llmem_ct *qkv, llmem_ct *a,
                                llmem_ct *b, llmem_ct *a_log, llmem_ct *dt_bias, llmem_ct *out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (!cuk_gdn_supported(p->d_k))
        return LLMEM_E_UNSUPPORTED; /* registers hold a column of d_k */
    cuk_rs_args rs;
    if ((st = cuda_rs_prepare(cb, view, state, &rs)) != LLMEM_OK)
        return st;
    cuk_gdn_args ga = {
        .n_k_heads = p->n_k_heads,
        .n_v_heads = p->n_v_heads,
        .d_k = p->d_k,
        .d_v = p->d_v,
        .qkv = cuda_tensor_ptr(qkv),
        .a = cuda_tensor_ptr(a),
        .b = cuda_tensor_ptr(b),
        .a_log = cuda_tensor_ptr(a_log),
        .dt_bias = cuda_tensor_ptr(dt_bias),
        .al_dt = a_log->dtype,
        .db_dt = dt_bias->dtype,
        .out = cuda_tensor_ptr(out),
        .width = 2 * (int64_t)p->n_k_heads * p->d_k + (int64_t)p->n_v_heads * p->d_v,
        .split = cb->gdn_split, /* $LLMEM_CUDA_GDN_E (cuda_backend.c) */
    };
    return cuda_op_done(cb, cuk_gdn(&rs, &ga, cb->stream), "gdn");
}

static llmem_status cuda_op_sigmoid_mul(llmem_backend *be, llmem_ct *x, llmem_ct *gate,
                                        llmem_ct *out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    int64_t n = llmem_tensor_nelements(x);
    cudaError_t e = cuk_sigmoid_mul(cuda_tensor_ptr(x), cuda_tensor_ptr(gate), cuda_tensor_ptr(out),
                                    n, x->ne[x->n_dims - 1], gate->ne[gate->n_dims - 1],
                                    cb->stream);
    return cuda_op_done(cb, e, "sigmoid_mul");
}

/* Registered in the cuda plugin's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_GDN, LLMEM_OP_GDN_LAYOUT, llmem_op_gdn_fn, cuda_op_gdn);
LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_SIGMOID_MUL, LLMEM_OP_SIGMOID_MUL_LAYOUT,
              llmem_op_sigmoid_mul_fn, cuda_op_sigmoid_mul);

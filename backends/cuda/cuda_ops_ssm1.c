/* llmem cuda plugin: the short-conv (LFM2) and Mamba-1 scan slots of the
 * ops table (kernels/ssm1.cu, issue 16). The wrappers of
 * backends/ops_ssm1.c have checked every argument; the kernels skip slots
 * outside [0, n_slots). cuda_rs_prepare passes the snapshot inside the
 * ubatch (snap_tok / snap_slot) to both kernels. */
#include "backends/cuda/cuda_backend.h"
#include "kernels/ssm1.h"
#include "llmem/ops_ssm1.h"
#include "llmem/view.h"

static llmem_status cuda_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                                       llmem_ct *bcx, llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    const llmem_state_desc *d = &llmem_view_rs(view)->desc[state];
    int32_t L = (int32_t)d->shape[0] + 1, dim = (int32_t)d->shape[1];
    if (L > 16)
        return LLMEM_E_UNSUPPORTED; /* the kernel keeps the window in registers */
    cuk_rs_args rs;
    if ((st = cuda_rs_prepare(cb, view, state, &rs)) != LLMEM_OK)
        return st;
    cudaError_t e = cuk_short_conv(&rs, cuda_tensor_ptr(bcx), cuda_tensor_ptr(w), (int)w->dtype,
                                   cuda_tensor_ptr(b), b ? (int)b->dtype : 0,
                                   cuda_tensor_ptr(out), dim, L, cb->stream);
    return cuda_op_done(cb, e, "short_conv");
}

static llmem_status cuda_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                                      const llmem_view *view, int32_t state, llmem_ct *x,
                                      llmem_ct *dt, llmem_ct *b, llmem_ct *c, llmem_ct *a_log,
                                      llmem_ct *d, llmem_ct *dt_bias, llmem_ct *z, llmem_ct *y)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (!cuk_ssm_scan1_supported(p->d_state))
        return LLMEM_E_UNSUPPORTED; /* d_state > 256 */
    cuk_rs_args rs;
    if ((st = cuda_rs_prepare(cb, view, state, &rs)) != LLMEM_OK)
        return st;
    cuk_scan1_args a = {
        .d_inner = p->d_inner,
        .d_state = p->d_state,
        .x = cuda_tensor_ptr(x),
        .dt = cuda_tensor_ptr(dt),
        .b = cuda_tensor_ptr(b),
        .c = cuda_tensor_ptr(c),
        .z = cuda_tensor_ptr(z),
        .a_log = cuda_tensor_ptr(a_log),
        .d = cuda_tensor_ptr(d),
        .dt_bias = cuda_tensor_ptr(dt_bias),
        .a_dt = (int32_t)a_log->dtype,
        .d_dt = d ? (int32_t)d->dtype : 0,
        .b_dt = dt_bias ? (int32_t)dt_bias->dtype : 0,
        .y = cuda_tensor_ptr(y),
    };
    return cuda_op_done(cb, cuk_ssm_scan1(&rs, &a, cb->stream), "ssm_scan1");
}

/* Registered in the cuda plugin's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_SHORT_CONV, LLMEM_OP_SHORT_CONV_LAYOUT,
              llmem_op_short_conv_fn, cuda_op_short_conv);
LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_SSM_SCAN1, LLMEM_OP_SSM_SCAN1_LAYOUT,
              llmem_op_ssm_scan1_fn, cuda_op_ssm_scan1);

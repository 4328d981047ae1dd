/* llmem cuda plugin: the short-conv (LFM2) and Mamba-1 scan slots of the
 * ops table (kernels/ssm1.cu, issue 16). The wrappers of
 * backends/ops_ssm1.c have checked every argument; the kernels skip slots
 * outside [0, n_slots). */
#include "backends/cuda/cuda_ops_ssm1.h"
#include "llmem/view.h"

static void *s1_ptr(const llmem_tensor *t)
{
    return t ? (char *)cuda_dev(t->buf) + t->offset : NULL;
}

static llmem_status s1_done(cuda_backend *cb, cudaError_t e, const char *what)
{
    llmem_status st = cuda_check(cb, e, what);
    if (st == LLMEM_OK && cb->sync_each_op && !cb->recording)
        st = cuda_check(cb, cudaStreamSynchronize(cb->stream), what);
    return st;
}

llmem_status cuda_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
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
    return s1_done(cb,
                   cuk_short_conv(&rs, s1_ptr(bcx), s1_ptr(w), (int)w->dtype, s1_ptr(b),
                                  b ? (int)b->dtype : 0, s1_ptr(out), dim, L, cb->stream),
                   "short_conv");
}

llmem_status cuda_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                               const llmem_view *view, int32_t state, llmem_ct *x, llmem_ct *dt,
                               llmem_ct *b, llmem_ct *c, llmem_ct *a_log, llmem_ct *d,
                               llmem_ct *dt_bias, llmem_ct *z, llmem_ct *y)
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
        .x = s1_ptr(x),
        .dt = s1_ptr(dt),
        .b = s1_ptr(b),
        .c = s1_ptr(c),
        .z = s1_ptr(z),
        .a_log = s1_ptr(a_log),
        .d = s1_ptr(d),
        .dt_bias = s1_ptr(dt_bias),
        .a_dt = (int32_t)a_log->dtype,
        .d_dt = d ? (int32_t)d->dtype : 0,
        .b_dt = dt_bias ? (int32_t)dt_bias->dtype : 0,
        .y = s1_ptr(y),
    };
    return s1_done(cb, cuk_ssm_scan1(&rs, &a, cb->stream), "ssm_scan1");
}

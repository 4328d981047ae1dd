/* llmem: the short-conv (LFM2) and Mamba-1 ops of <llmem/ops_ssm1.h>
 * (issue 16), open ops (<llmem/ops_impl.h>, "Open ops"): their metadata,
 * registered when libllmem loads, and their wrappers: argument checks as in
 * ops.c, then the backend's implementation (llmem_backend_op_impl). The
 * view checks (tables, slots, state buffer sizes) are base/view.c's. */
#include <math.h>

#include "base/base_internal.h"
#include "backends/ops_internal.h"
#include "llmem/ops_ssm1.h"

/* short_conv: {view (state dtype), bcx, w, b, out} */
static llmem_op_info short_conv_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_SHORT_CONV,
    .name = "short_conv",
    .view = LLMEM_VIEW_RECURRENT,
    .view_desc_min = sizeof(llmem_rs_view),
    .n_operands = 5,
    .dtypes = {DT_FLOAT, DT_F32, DT_FLOAT, DT_FLOAT, DT_F32},
    .layout = LLMEM_OP_SHORT_CONV_LAYOUT,
    .flags = LLMEM_OP_WRITES_SNAPSHOT,
};
LLMEM_OP_DEFINE(short_conv_info);

/* ssm_scan1: {view (state dtype), x, dt, b, c, a_log, d, dt_bias, z, y} */
static llmem_op_info ssm_scan1_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_SSM_SCAN1,
    .name = "ssm_scan1",
    .view = LLMEM_VIEW_RECURRENT,
    .view_desc_min = sizeof(llmem_rs_view),
    .n_operands = 10,
    .dtypes = {DT_FLOAT, DT_F32, DT_F32, DT_F32, DT_F32, DT_FLOAT, DT_FLOAT, DT_FLOAT, DT_F32,
               DT_F32},
    .layout = LLMEM_OP_SSM_SCAN1_LAYOUT,
    .flags = LLMEM_OP_WRITES_SNAPSHOT,
};
LLMEM_OP_DEFINE(ssm_scan1_info);

/* A valid tensor of these dtypes that is a [rows, cols] matrix (matrix_ok). */
static bool mat_ok(llmem_backend *be, const llmem_tensor *t, unsigned dtypes, int64_t rows,
                   int64_t cols)
{
    return tensor_ok(be, t, dtypes) && matrix_ok(t, rows, cols);
}

llmem_status llmem_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                                 const llmem_tensor *bcx, const llmem_tensor *w,
                                 const llmem_tensor *b, const llmem_tensor *out)
{
    llmem_op_fn impl = NULL;
    llmem_status st = open_rs_op_begin(be, &short_conv_info, view, state, &impl);
    if (st != LLMEM_OK)
        return st;
    llmem_op_short_conv_fn fn = (llmem_op_short_conv_fn)impl;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    if (sd->n_dims != 2)
        return LLMEM_E_INVALID;
    int64_t L = sd->shape[0] + 1, D = sd->shape[1];
    int64_t n_tok = (int64_t)rs->n_seqs * rs->n_seq_tokens;
    if (!mat_ok(be, bcx, DT_F32, n_tok, 3 * D) || !mat_ok(be, out, DT_F32, n_tok, D) ||
        !tensor_ok(be, w, DT_FLOAT) || llmem_tensor_nelements(w) != D * L || w->ne[0] != D ||
        !optional_vec_ok(be, b, D))
        return LLMEM_E_INVALID;
    const llmem_buffer *sbuf = rs->state[state];
    if (overlaps(out, bcx) || overlaps(out, w) || overlaps(out, b) || in_buffer(out, sbuf) ||
        in_buffer(out, view->idx) || in_buffer(bcx, sbuf))
        return LLMEM_E_INVALID;
    if (n_tok == 0)
        return LLMEM_OK;
    return fn(be, view, state, bcx, w, b, out);
}

llmem_status llmem_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                                const llmem_view *view, int32_t state, const llmem_tensor *x,
                                const llmem_tensor *dt, const llmem_tensor *b,
                                const llmem_tensor *c, const llmem_tensor *a_log,
                                const llmem_tensor *d, const llmem_tensor *dt_bias,
                                const llmem_tensor *z, const llmem_tensor *y)
{
    llmem_op_fn impl = NULL;
    llmem_status st = open_rs_op_begin(be, &ssm_scan1_info, view, state, &impl);
    if (st != LLMEM_OK)
        return st;
    llmem_op_ssm_scan1_fn fn = (llmem_op_ssm_scan1_fn)impl;
    if (!p || p->d_inner < 1 || p->d_state < 1)
        return LLMEM_E_INVALID;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    if (sd->n_dims != 2 || sd->shape[0] != p->d_inner || sd->shape[1] != p->d_state)
        return LLMEM_E_INVALID;
    int64_t n_tok = (int64_t)rs->n_seqs * rs->n_seq_tokens, Din = p->d_inner, N = p->d_state;
    if (!mat_ok(be, x, DT_F32, n_tok, Din) || !mat_ok(be, dt, DT_F32, n_tok, Din) ||
        !mat_ok(be, b, DT_F32, n_tok, N) || !mat_ok(be, c, DT_F32, n_tok, N) ||
        !mat_ok(be, y, DT_F32, n_tok, Din) || (z && !mat_ok(be, z, DT_F32, n_tok, Din)) ||
        !vec_ok(be, a_log, Din * N) || !optional_vec_ok(be, d, Din) ||
        !optional_vec_ok(be, dt_bias, Din))
        return LLMEM_E_INVALID;
    const llmem_tensor *in[8] = {x, dt, b, c, a_log, d, dt_bias, z};
    const llmem_buffer *sbuf = rs->state[state];
    for (int i = 0; i < 8; i++)
        if (overlaps(y, in[i]) || (i < 4 && in_buffer(in[i], sbuf)) ||
            (i == 7 && in_buffer(z, sbuf)))
            return LLMEM_E_INVALID;
    if (in_buffer(y, sbuf) || in_buffer(y, view->idx))
        return LLMEM_E_INVALID;
    if (n_tok == 0)
        return LLMEM_OK;
    return fn(be, p, view, state, x, dt, b, c, a_log, d, dt_bias, z, y);
}

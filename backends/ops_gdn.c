/* llmem: the gated delta net ops of <llmem/ops_gdn.h> (llmem_op_gdn,
 * llmem_op_sigmoid_mul), open ops (<llmem/ops_impl.h>, "Open ops"): their
 * metadata, registered when libllmem loads, and their wrappers.
 *
 * Same contract as backends/ops.c: every argument the host can see is
 * checked (descriptors, buffer ranges, aliasing, the host copies of the
 * view's index tables through llmem_view_check_rs), then the backend's
 * implementation (llmem_backend_op_impl) is called.
 */
#include <math.h>

#include "base/base_internal.h"
#include "backends/ops_internal.h"
#include "llmem/ops_gdn.h"

/* gdn: {view (state dtype), qkv, a, b, a_log, dt_bias, out} */
static llmem_op_info gdn_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_GDN,
    .name = "gdn",
    .view = LLMEM_VIEW_RECURRENT,
    .view_desc_min = sizeof(llmem_rs_view),
    .n_operands = 7,
    .dtypes = {DT_FLOAT, DT_F32, DT_F32, DT_F32, DT_FLOAT, DT_FLOAT, DT_F32},
    .layout = LLMEM_OP_GDN_LAYOUT,
    .flags = LLMEM_OP_WRITES_SNAPSHOT,
};
LLMEM_OP_DEFINE(gdn_info);

/* sigmoid_mul: {x, gate, out} */
static llmem_op_info sigmoid_mul_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_SIGMOID_MUL,
    .name = "sigmoid_mul",
    .view = LLMEM_VIEW_NONE,
    .n_operands = 3,
    .dtypes = {DT_F32, DT_F32, DT_F32},
    .layout = LLMEM_OP_SIGMOID_MUL_LAYOUT,
};
LLMEM_OP_DEFINE(sigmoid_mul_info);

/* A [rows, cols] matrix, or rows outermost with the rest flattening to
 * cols (e.g. [T, H, d_v] for [T, H * d_v]). */
static bool gdn_matrix(const llmem_tensor *t, int64_t rows, int64_t cols)
{
    if (t->n_dims >= 2 && t->ne[0] == rows && llmem_tensor_nelements(t) == rows * cols)
        return true;
    return t->n_dims == 1 && rows == 1 && t->ne[0] == cols;
}

llmem_status llmem_op_gdn(llmem_backend *be, const llmem_gdn_params *p, const llmem_view *view,
                          int32_t state, const llmem_tensor *qkv, const llmem_tensor *a,
                          const llmem_tensor *b, const llmem_tensor *a_log,
                          const llmem_tensor *dt_bias, const llmem_tensor *out)
{
    llmem_op_fn impl = NULL;
    llmem_status st = open_rs_op_begin(be, &gdn_info, view, state, &impl);
    if (st != LLMEM_OK)
        return st;
    llmem_op_gdn_fn fn = (llmem_op_gdn_fn)impl;
    if (!p || p->n_k_heads < 1 || p->n_v_heads < 1 || p->d_k < 1 || p->d_v < 1 ||
        p->n_v_heads % p->n_k_heads != 0 || p->d_k > 4096 || p->d_v > 4096 ||
        p->n_v_heads > (1 << 20))
        return LLMEM_E_INVALID;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    if (sd->n_dims != 3 || sd->shape[0] != p->n_v_heads || sd->shape[1] != p->d_k ||
        sd->shape[2] != p->d_v)
        return LLMEM_E_INVALID;
    int64_t T = (int64_t)rs->n_seqs * rs->n_seq_tokens;
    int64_t Hv = p->n_v_heads;
    int64_t width = 2 * (int64_t)p->n_k_heads * p->d_k + Hv * p->d_v;
    if (!qkv || !a || !b || !a_log || !dt_bias || !out)
        return LLMEM_E_INVALID;
    if (!tensor_ok(be, qkv, DT_F32) || !tensor_ok(be, a, DT_F32) || !tensor_ok(be, b, DT_F32) ||
        !tensor_ok(be, out, DT_F32) || !gdn_matrix(qkv, T, width) || !gdn_matrix(a, T, Hv) ||
        !gdn_matrix(b, T, Hv) || !gdn_matrix(out, T, Hv * p->d_v) || !vec_ok(be, a_log, Hv) ||
        !vec_ok(be, dt_bias, Hv))
        return LLMEM_E_INVALID;
    if (overlaps(out, qkv) || overlaps(out, a) || overlaps(out, b) || overlaps(out, a_log) ||
        overlaps(out, dt_bias) || in_buffer(out, rs->state[state]) ||
        (view->idx && in_buffer(out, view->idx)) || in_buffer(qkv, rs->state[state]) ||
        in_buffer(a, rs->state[state]) || in_buffer(b, rs->state[state]))
        return LLMEM_E_INVALID;
    if (T == 0)
        return LLMEM_OK;
    return fn(be, p, view, state, qkv, a, b, a_log, dt_bias, out);
}

llmem_status llmem_op_sigmoid_mul(llmem_backend *be, const llmem_tensor *x,
                                  const llmem_tensor *gate, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_op_sigmoid_mul_fn fn =
        (llmem_op_sigmoid_mul_fn)llmem_backend_op_impl(be, &sigmoid_mul_info);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, gate, DT_F32) || !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(x) != llmem_tensor_nelements(out) || x->n_dims != out->n_dims)
        return LLMEM_E_INVALID;
    for (int32_t i = 0; i < x->n_dims; i++)
        if (x->ne[i] != out->ne[i])
            return LLMEM_E_INVALID;
    bool same = x->buf == out->buf && x->offset == out->offset;
    if ((overlaps(out, x) && !same) || overlaps(out, gate))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(x) == 0)
        return LLMEM_OK;
    int64_t rows = rows_of(x), C = cols_of(x), Cg = cols_of(gate);
    if (rows_of(gate) != rows || Cg < 1 || C % Cg != 0)
        return LLMEM_E_INVALID;
    return fn(be, x, gate, out);
}

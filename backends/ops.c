/* llmem: the op wrappers of <llmem/ops.h>.
 *
 * Each wrapper checks every argument it can see from the host (tensor
 * descriptors, buffer ranges, aliasing, the host copies of a view's index
 * tables), then calls the backend's slot. Slots may rely on these checks
 * (<llmem/ops_impl.h>). View checks live in the base layer (base/view.c),
 * which checks a ubatch's index tables once and caches the answer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"
#include "backends/ops_internal.h"

/* ---- tensors -------------------------------------------------------------------- */

/* ---- dense ------------------------------------------------------------------------ */

static llmem_status matmul_checked(llmem_backend *be, const llmem_tensor *a,
                                   const llmem_tensor *w, const llmem_tensor *out,
                                   llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *,
                                                      llmem_ct *));

llmem_status llmem_op_matmul(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *w,
                             const llmem_tensor *out)
{
    return be ? matmul_checked(be, a, w, out, SLOT(be, matmul)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_matmul_fast(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *w,
                                  const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    /* a backend without a fast path runs the precise one */
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *) =
        SLOT(be, matmul_fast);
    return matmul_checked(be, a, w, out, fn ? fn : SLOT(be, matmul));
}

llmem_status llmem_op_matmul_swiglu(llmem_backend *be, const llmem_tensor *a,
                                    const llmem_tensor *gate, const llmem_tensor *up,
                                    const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *, llmem_ct *) =
        SLOT(be, matmul_swiglu);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, a, DT_F32) || !tensor_ok(be, gate, DT_FLOAT) ||
        !tensor_ok(be, up, DT_FLOAT) || !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (a->n_dims != 2 || gate->n_dims != 2 || out->n_dims != 2 || gate->dtype != up->dtype ||
        !same_shape(gate, up) || a->ne[1] != gate->ne[1] || out->ne[0] != a->ne[0] ||
        out->ne[1] != gate->ne[0])
        return LLMEM_E_INVALID;
    if (overlaps(out, a) || overlaps(out, gate) || overlaps(out, up))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, a, gate, up, out);
}

static llmem_status matmul_checked(llmem_backend *be, const llmem_tensor *a,
                                   const llmem_tensor *w, const llmem_tensor *out,
                                   llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *,
                                                      llmem_ct *))
{
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, a, DT_F32) || !tensor_ok(be, w, DT_FLOAT) || !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (a->n_dims != 2 || w->n_dims != 2 || out->n_dims != 2 || a->ne[1] != w->ne[1] ||
        out->ne[0] != a->ne[0] || out->ne[1] != w->ne[0])
        return LLMEM_E_INVALID;
    if (overlaps(out, a) || overlaps(out, w))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, a, w, out); /* K = 0 gives zeros */
}

llmem_status llmem_op_get_rows(llmem_backend *be, const llmem_tensor *src, const llmem_tensor *idx,
                               const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *) = SLOT(be, get_rows);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, src, DT_FLOAT) || !tensor_ok(be, idx, DT_I32) ||
        !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (src->n_dims != 2 || idx->n_dims != 1 || out->n_dims != 2 || out->ne[0] != idx->ne[0] ||
        out->ne[1] != src->ne[1])
        return LLMEM_E_INVALID;
    if (overlaps(out, src) || overlaps(out, idx))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, src, idx, out);
}

static llmem_status binary(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *b,
                           const llmem_tensor *out,
                           llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *))
{
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, a, DT_F32) || !tensor_ok(be, b, DT_F32) || !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (!same_shape(a, out))
        return LLMEM_E_INVALID;
    if (!same_shape(a, b) && llmem_tensor_nelements(b) != cols_of(a))
        return LLMEM_E_INVALID;
    if (!alias_ok(out, a) || !alias_ok(out, b))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, a, b, out);
}

llmem_status llmem_op_add(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *b,
                          const llmem_tensor *out)
{
    return be ? binary(be, a, b, out, SLOT(be, add)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_mul(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *b,
                          const llmem_tensor *out)
{
    return be ? binary(be, a, b, out, SLOT(be, mul)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_swiglu(llmem_backend *be, const llmem_tensor *gate, const llmem_tensor *up,
                             const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    /* swiglu takes no broadcast: gate and up have one shape. */
    if (gate && up && !same_shape(gate, up))
        return LLMEM_E_INVALID;
    return binary(be, gate, up, out, SLOT(be, swiglu));
}

llmem_status llmem_op_scale(llmem_backend *be, const llmem_tensor *a, float s,
                            const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, float, llmem_ct *) = SLOT(be, scale);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, a, DT_F32) || !tensor_ok(be, out, DT_F32) || !same_shape(a, out) ||
        !alias_ok(out, a))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, a, s, out);
}

static llmem_status unary(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out,
                          llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *))
{
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, a, DT_F32) || !tensor_ok(be, out, DT_F32) || !same_shape(a, out) ||
        !alias_ok(out, a))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, a, out);
}

llmem_status llmem_op_silu(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out)
{
    return be ? unary(be, a, out, SLOT(be, silu)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_relu2(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out)
{
    return be ? unary(be, a, out, SLOT(be, relu2)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_softplus(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out)
{
    return be ? unary(be, a, out, SLOT(be, softplus)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_log_softmax(llmem_backend *be, const llmem_tensor *x,
                                  const llmem_tensor *out)
{
    return be ? unary(be, x, out, SLOT(be, log_softmax)) : LLMEM_E_INVALID;
}

llmem_status llmem_op_rms_norm(llmem_backend *be, const llmem_tensor *x, const llmem_tensor *w,
                               float eps, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, float, llmem_ct *) =
        SLOT(be, rms_norm);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, out, DT_F32) || !same_shape(x, out) ||
        !alias_ok(out, x) || !(eps >= 0.0f) || isinf(eps))
        return LLMEM_E_INVALID;
    if (!optional_vec_ok(be, w, cols_of(x)) || overlaps(out, w))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, x, w, eps, out);
}

llmem_status llmem_op_add_rms_norm(llmem_backend *be, const llmem_tensor *x, const llmem_tensor *r,
                                   const llmem_tensor *w, float eps, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *, float, llmem_ct *) =
        SLOT(be, add_rms_norm);
    bool out_is_r = out && r && out->buf == r->buf && out->offset == r->offset;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, r, DT_F32) || !tensor_ok(be, out, DT_F32) ||
        !same_shape(x, r) || !same_shape(x, out) || overlaps(x, r) || overlaps(out, x) ||
        (!out_is_r && overlaps(out, r)) || !(eps >= 0.0f) || isinf(eps))
        return LLMEM_E_INVALID;
    if (!optional_vec_ok(be, w, cols_of(x)) || overlaps(out, w) || overlaps(x, w))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    if (!fn) {
        llmem_status st = llmem_op_add(be, x, r, x);
        return st == LLMEM_OK ? llmem_op_rms_norm(be, x, w, eps, out) : st;
    }
    return fn(be, x, r, w, eps, out);
}

llmem_status llmem_op_rms_norm_gated(llmem_backend *be, const llmem_tensor *y,
                                     const llmem_tensor *z, const llmem_tensor *w,
                                     int32_t n_groups, float eps, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *, int32_t, float,
                       llmem_ct *) = SLOT(be, rms_norm_gated);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, y, DT_F32) || !tensor_ok(be, z, DT_F32) || !tensor_ok(be, out, DT_F32) ||
        !w || !same_shape(y, z) || !same_shape(y, out) || !alias_ok(out, y) ||
        !alias_ok(out, z) || !(eps >= 0.0f) || isinf(eps))
        return LLMEM_E_INVALID;
    int64_t d = cols_of(y);
    if (n_groups < 1 || (d > 0 && d % n_groups != 0) || !optional_vec_ok(be, w, d) ||
        overlaps(out, w))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, y, z, w, n_groups, eps, out);
}

llmem_status llmem_op_argmax(llmem_backend *be, const llmem_tensor *x, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *) = SLOT(be, argmax);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, out, DT_I32) || overlaps(out, x))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) != rows_of(x) || (rows_of(x) > 0 && cols_of(x) < 1))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, x, out);
}

/* ---- rope --------------------------------------------------------------------------- */

static bool rope_params_ok(const llmem_rope_params *p, int32_t head_dim)
{
    return p && (p->mode == LLMEM_ROPE_NORMAL || p->mode == LLMEM_ROPE_NEOX) && p->n_rot >= 2 &&
           p->n_rot % 2 == 0 && p->n_rot <= head_dim && p->theta_base > 0.0f &&
           isfinite(p->theta_base) && p->freq_scale > 0.0f && isfinite(p->freq_scale);
}

llmem_status llmem_op_rope(llmem_backend *be, const llmem_rope_params *p, const llmem_tensor *x,
                           const llmem_tensor *pos, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_rope_params *, llmem_ct *, llmem_ct *,
                       llmem_ct *) = SLOT(be, rope);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, pos, DT_I32) || !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (x->n_dims != 3 || pos->n_dims != 1 || pos->ne[0] != x->ne[0] || !same_shape(x, out) ||
        !alias_ok(out, x) || overlaps(out, pos) || !rope_params_ok(p, x->ne[2]))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, p, x, pos, out);
}

llmem_status llmem_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                                 const llmem_view *view)
{
    /* the view kind this op declares (backends/op_info.c) */
    if (llmem_op_check_view(LLMEM_OP_ROPE_SHIFT, view, NULL, 0) != LLMEM_OK)
        return LLMEM_E_INVALID;
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_rope_params *, const llmem_view *) =
        SLOT(be, rope_shift);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    llmem_status st = llmem_view_check_kv(be, view);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (!rope_params_ok(p, kv->head_dim))
        return LLMEM_E_INVALID;
    if (llmem_dtype_is_scaled(kv->dtype)) /* a rotation may leave the page's scale range */
        return LLMEM_E_UNSUPPORTED;
    if ((st = llmem_view_check_shift(be, view)) != LLMEM_OK)
        return st;
    if (kv->shift_slot.n == 0)
        return LLMEM_OK;
    return fn(be, p, view);
}

/* ---- attention ------------------------------------------------------------------------ */

llmem_status llmem_op_kv_store(llmem_backend *be, const llmem_view *view, const llmem_tensor *k,
                               const llmem_tensor *v)
{
    /* the view kind this op declares (backends/op_info.c) */
    if (llmem_op_check_view(LLMEM_OP_KV_STORE, view, NULL, 0) != LLMEM_OK)
        return LLMEM_E_INVALID;
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_view *, llmem_ct *, llmem_ct *) =
        SLOT(be, kv_store);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    llmem_status st = llmem_view_check_kv(be, view);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (!tensor_ok(be, k, DT_F32) || !tensor_ok(be, v, DT_F32) || k->n_dims != 3 ||
        !same_shape(k, v) || k->ne[1] != kv->n_kv_heads || k->ne[2] != kv->head_dim)
        return LLMEM_E_INVALID;
    if (in_buffer(k, kv->k) || in_buffer(k, kv->v) || in_buffer(v, kv->k) ||
        in_buffer(v, kv->v))
        return LLMEM_E_INVALID;
    if ((st = llmem_view_check_store(be, view, k->ne[0])) != LLMEM_OK)
        return st;
    if (kv->store_slot.n == 0)
        return LLMEM_OK;
    return fn(be, view, k, v);
}

llmem_status llmem_op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                      const llmem_view *view, const llmem_tensor *q,
                                      const llmem_tensor *out)
{
    /* the view kind this op declares (backends/op_info.c) */
    if (llmem_op_check_view(LLMEM_OP_ATTENTION_PAGED, view, NULL, 0) != LLMEM_OK)
        return LLMEM_E_INVALID;
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_attn_params *, const llmem_view *, llmem_ct *,
                       llmem_ct *) = SLOT(be, attention_paged);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    llmem_status st = llmem_view_check_kv(be, view);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (!p || !isfinite(p->scale) || !(p->softcap >= 0.0f) || isinf(p->softcap) || p->window < 0)
        return LLMEM_E_INVALID;
    if (!tensor_ok(be, q, DT_F32) || !tensor_ok(be, out, DT_F32) || q->n_dims != 3 ||
        !same_shape(q, out) || overlaps(out, q) || q->ne[2] != kv->head_dim || q->ne[1] < 1 ||
        q->ne[1] % kv->n_kv_heads != 0)
        return LLMEM_E_INVALID;
    if (in_buffer(out, kv->k) || in_buffer(out, kv->v) || in_buffer(out, view->idx))
        return LLMEM_E_INVALID;
    if ((st = llmem_view_check_attention(be, view, q->ne[0])) != LLMEM_OK)
        return st;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, p, view, q, out);
}

/* ---- Mamba-2 ---------------------------------------------------------------------------- */

llmem_status llmem_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                               const llmem_tensor *x, const llmem_tensor *w, const llmem_tensor *b,
                               const llmem_tensor *out)
{
    /* the view kind this op declares (backends/op_info.c) */
    if (llmem_op_check_view(LLMEM_OP_SSM_CONV, view, NULL, 0) != LLMEM_OK)
        return LLMEM_E_INVALID;
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_view *, int32_t, llmem_ct *, llmem_ct *,
                       llmem_ct *, llmem_ct *) = SLOT(be, ssm_conv);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    llmem_status st = llmem_view_check_rs(be, view, state);
    if (st != LLMEM_OK)
        return st;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    if (d->n_dims != 2 || llmem_dtype_is_scaled(d->dtype))
        return LLMEM_E_INVALID;
    int64_t d_conv = d->shape[0] + 1, conv_dim = d->shape[1];
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, w, DT_FLOAT) || !tensor_ok(be, out, DT_F32) ||
        !same_shape(x, out) || !matrix_ok(x, (int64_t)rs->n_seqs * rs->n_seq_tokens, conv_dim) ||
        rows_of(w) != conv_dim || cols_of(w) != d_conv ||
        !optional_vec_ok(be, b, conv_dim))
        return LLMEM_E_INVALID;
    if (overlaps(out, x) || overlaps(out, w) || overlaps(out, b) ||
        in_buffer(out, rs->state[state]) || in_buffer(out, view->idx) ||
        in_buffer(x, rs->state[state]))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, view, state, x, w, b, out);
}

llmem_status llmem_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p,
                               const llmem_view *view, int32_t state, const llmem_tensor *xbc,
                               const llmem_tensor *dt, const llmem_tensor *a_log,
                               const llmem_tensor *d, const llmem_tensor *dt_bias,
                               const llmem_tensor *y)
{
    /* the view kind this op declares (backends/op_info.c) */
    if (llmem_op_check_view(LLMEM_OP_SSM_SCAN, view, NULL, 0) != LLMEM_OK)
        return LLMEM_E_INVALID;
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_ssm_params *, const llmem_view *, int32_t,
                       llmem_ct *, llmem_ct *, llmem_ct *, llmem_ct *, llmem_ct *, llmem_ct *) =
        SLOT(be, ssm_scan);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    llmem_status st = llmem_view_check_rs_i8(be, view, state);
    if (st != LLMEM_OK)
        return st;
    if (!p || p->n_heads < 1 || p->head_dim < 1 || p->d_state < 1 || p->n_groups < 1 ||
        p->n_heads % p->n_groups != 0 || isnan(p->dt_min) || isnan(p->dt_max) ||
        p->dt_min > p->dt_max)
        return LLMEM_E_INVALID;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    if (sd->n_dims != 3 || sd->shape[0] != p->n_heads || sd->shape[1] != p->head_dim ||
        sd->shape[2] != p->d_state ||
        (sd->dtype == LLMEM_DTYPE_I8 && ((int64_t)p->head_dim * p->d_state) % 4 != 0))
        return LLMEM_E_INVALID;
    int64_t n_tok = (int64_t)rs->n_seqs * rs->n_seq_tokens;
    int64_t d_inner = (int64_t)p->n_heads * p->head_dim;
    int64_t conv_dim = d_inner + 2 * (int64_t)p->n_groups * p->d_state;
    if (!tensor_ok(be, xbc, DT_F32) || !tensor_ok(be, dt, DT_F32) || !tensor_ok(be, y, DT_F32) ||
        !matrix_ok(xbc, n_tok, conv_dim) || !matrix_ok(dt, n_tok, p->n_heads) ||
        !matrix_ok(y, n_tok, d_inner) ||
        !a_log || !optional_vec_ok(be, a_log, p->n_heads) || !optional_vec_ok(be, d, p->n_heads) ||
        !optional_vec_ok(be, dt_bias, p->n_heads))
        return LLMEM_E_INVALID;
    if (overlaps(y, xbc) || overlaps(y, dt) || overlaps(y, a_log) || overlaps(y, d) ||
        overlaps(y, dt_bias) || in_buffer(y, rs->state[state]) ||
        in_buffer(y, view->idx) || in_buffer(xbc, rs->state[state]) ||
        in_buffer(dt, rs->state[state]))
        return LLMEM_E_INVALID;
    if (n_tok == 0)
        return LLMEM_OK;
    return fn(be, p, view, state, xbc, dt, a_log, d, dt_bias, y);
}

/* ---- copies -------------------------------------------------------------------------------- */

llmem_status llmem_op_copy(llmem_backend *be, const llmem_tensor *src, int32_t col0,
                           const llmem_tensor *dst)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, int32_t, llmem_ct *) = SLOT(be, copy);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, src, DT_FLOAT) || !tensor_ok(be, dst, DT_FLOAT) || overlaps(dst, src) ||
        rows_of(src) != rows_of(dst) || col0 < 0 || cols_of(dst) + col0 > cols_of(src))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(dst) == 0)
        return LLMEM_OK;
    return fn(be, src, col0, dst);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Whether be has the batched device copy (llmem_backend_i.buffer_copy_ranges:
 * every built-in backend), which copy_blocks, kv_page_copy and
 * state_slot_copy then run on: one batch (CUDA: one kernel; Vulkan: one
 * dispatch per buffer pair) instead of a copy per block. */
static bool batches_copies(llmem_backend *be)
{
    const llmem_backend_i *i = be->iface;
    return i->struct_size >= offsetof(llmem_backend_i, buffer_copy_ranges) +
                                 sizeof(i->buffer_copy_ranges) &&
           i->buffer_copy_ranges;
}

llmem_status llmem_op_copy_blocks(llmem_backend *be, llmem_buffer *buf, size_t block_bytes,
                                  int32_t n, const int32_t *src, const int32_t *dst)
{
    if (!be || !buf || llmem_buffer_backend(buf) != be || block_bytes == 0 || n < 0 ||
        (n > 0 && (!src || !dst)))
        return LLMEM_E_INVALID;
    size_t n_blocks = llmem_buffer_size(buf) / block_bytes;
    for (int32_t i = 0; i < n; i++)
        if (src[i] < 0 || dst[i] < 0 || (size_t)src[i] >= n_blocks || (size_t)dst[i] >= n_blocks)
            return LLMEM_E_INVALID;
    if (n == 0)
        return LLMEM_OK;
    /* Order-free copies need no dst among the srcs and no dst twice. */
    int32_t *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted)
        return LLMEM_E_NO_MEMORY;
    memcpy(sorted, dst, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_i32);
    llmem_status st = LLMEM_OK;
    for (int32_t i = 1; i < n; i++)
        if (sorted[i] == sorted[i - 1])
            st = LLMEM_E_INVALID;
    for (int32_t i = 0; i < n && st == LLMEM_OK; i++)
        if (bsearch(&src[i], sorted, (size_t)n, sizeof *sorted, cmp_i32))
            st = LLMEM_E_INVALID;
    free(sorted);
    if (st != LLMEM_OK)
        return st;
    llmem_status (*fn)(llmem_backend *, llmem_buffer *, size_t, int32_t, const int32_t *,
                       const int32_t *) = SLOT(be, copy_blocks);
    if (fn && !batches_copies(be))
        return fn(be, buf, block_bytes, n, src, dst);
    llmem_copy_range *r = malloc((size_t)n * sizeof *r);
    if (!r)
        return LLMEM_E_NO_MEMORY;
    for (int32_t i = 0; i < n; i++)
        r[i] = (llmem_copy_range){buf, (size_t)dst[i] * block_bytes, buf,
                                  (size_t)src[i] * block_bytes, block_bytes};
    st = llmem_buffer_copy_ranges(r, n);
    free(r);
    return st;
}

llmem_status llmem_op_kv_page_copy(llmem_backend *be, const llmem_view *view, int32_t src_page,
                                   int32_t dst_page)
{
    /* the view kind this op declares (backends/op_info.c) */
    if (llmem_op_check_view(LLMEM_OP_KV_PAGE_COPY, view, NULL, 0) != LLMEM_OK)
        return LLMEM_E_INVALID;
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status st = llmem_view_check_kv(be, view);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (src_page < 0 || dst_page < 0 || src_page >= kv->n_pages || dst_page >= kv->n_pages ||
        src_page == dst_page)
        return LLMEM_E_INVALID;
    size_t page_bytes =
        llmem_kv_page_bytes(kv->dtype, kv->page_size, kv->n_kv_heads, kv->head_dim);
    if (!batches_copies(be)) {
        st = llmem_op_copy_blocks(be, kv->k, page_bytes, 1, &src_page, &dst_page);
        if (st != LLMEM_OK)
            return st;
        return llmem_op_copy_blocks(be, kv->v, page_bytes, 1, &src_page, &dst_page);
    }
    size_t so = (size_t)src_page * page_bytes, d_o = (size_t)dst_page * page_bytes;
    const llmem_copy_range r[2] = {{kv->k, d_o, kv->k, so, page_bytes},
                                   {kv->v, d_o, kv->v, so, page_bytes}};
    return llmem_buffer_copy_ranges(r, 2); /* checks the pools' ranges */
}

llmem_status llmem_op_state_slot_copy(llmem_backend *be, const llmem_view *view,
                                      int32_t src_slot, int32_t dst_slot)
{
    /* the view kind this op declares (backends/op_info.c) */
    llmem_status vst = llmem_op_check_view(LLMEM_OP_STATE_SLOT_COPY, view, NULL, 0);
    if (vst != LLMEM_OK) /* LLMEM_E_UNSUPPORTED: a snapshot inside the ubatch */
        return vst == LLMEM_E_UNSUPPORTED ? vst : LLMEM_E_INVALID;
    const llmem_rs_view *rs = llmem_view_rs(view);
    if (!be || !rs)
        return LLMEM_E_INVALID;
    if (rs->n_states < 0 || (rs->n_states > 0 && (!rs->desc || !rs->state)) || src_slot < 0 ||
        dst_slot < 0 || src_slot >= rs->n_slots || dst_slot >= rs->n_slots ||
        src_slot == dst_slot)
        return LLMEM_E_INVALID;
    size_t *bytes = malloc(((size_t)rs->n_states + 1) * sizeof *bytes);
    if (!bytes)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_OK;
    size_t top = (size_t)(src_slot > dst_slot ? src_slot : dst_slot);
    for (int32_t j = 0; j < rs->n_states && st == LLMEM_OK; j++) {
        const llmem_state_desc *d = &rs->desc[j];
        if ((unsigned)d->dtype >= LLMEM_DTYPE_COUNT || d->n_dims < 1 ||
            d->n_dims > LLMEM_STATE_MAX_DIMS || (bytes[j] = llmem_state_slot_bytes(d)) == 0 ||
            !rs->state[j] || llmem_buffer_backend(rs->state[j]) != be ||
            llmem_buffer_size(rs->state[j]) / bytes[j] <= top)
            st = LLMEM_E_INVALID;
    }
    /* every state checked before anything is copied: all or nothing */
    if (st != LLMEM_OK || rs->n_states == 0) {
        free(bytes);
        return st;
    }
    if (!batches_copies(be)) {
        for (int32_t j = 0; j < rs->n_states && st == LLMEM_OK; j++)
            st = llmem_op_copy_blocks(be, rs->state[j], bytes[j], 1, &src_slot, &dst_slot);
        free(bytes);
        return st;
    }
    llmem_copy_range *r = malloc((size_t)rs->n_states * sizeof *r);
    if (!r) {
        free(bytes);
        return LLMEM_E_NO_MEMORY;
    }
    for (int32_t j = 0; j < rs->n_states; j++)
        r[j] = (llmem_copy_range){rs->state[j], (size_t)dst_slot * bytes[j], rs->state[j],
                                  (size_t)src_slot * bytes[j], bytes[j]};
    st = llmem_buffer_copy_ranges(r, rs->n_states);
    free(r);
    free(bytes);
    return st;
}

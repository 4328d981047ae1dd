/* llmem: the wrappers of the sampling ops of <llmem/ops.h> (sample,
 * logprob_gather, top_logprobs).
 *
 * Like backends/ops.c, each wrapper checks every argument it can see from
 * the host, then calls the backend's slot; a backend whose table lacks the
 * slot (an older plugin, or one that has not implemented it yet) gets
 * LLMEM_E_UNSUPPORTED, so callers can fall back to downloading logits.
 */
#include <math.h>
#include <stddef.h>

#include "llmem/ops_impl.h"

#define SLOT_OF(be, name)                                                                     \
    ((be) && (be)->iface && (be)->iface->ops &&                                               \
             (be)->iface->ops->struct_size >= offsetof(struct llmem_ops_i, name) +            \
                                                  sizeof((be)->iface->ops->name)              \
         ? (be)->iface->ops->name                                                             \
         : NULL)

static int64_t rows_of(const llmem_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i + 1 < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

/* A valid descriptor of this backend with dtype dt, inside its buffer
 * (element counts capped at 2^48, as backends/ops.c). */
static bool tensor_ok(llmem_backend *be, const llmem_tensor *t, llmem_dtype dt)
{
    if (!t || !t->buf || t->dtype != dt || t->n_dims < 1 || t->n_dims > LLMEM_TENSOR_MAX_DIMS)
        return false;
    if (llmem_buffer_backend(t->buf) != be)
        return false;
    int64_t n = 1;
    for (int32_t i = 0; i < t->n_dims; i++) {
        if (t->ne[i] < 0)
            return false;
        n *= t->ne[i];
        if (n > ((int64_t)1 << 48))
            return false;
    }
    size_t es = llmem_dtype_size(t->dtype);
    size_t bytes = (size_t)n * es;
    size_t size = llmem_buffer_size(t->buf);
    return t->offset % es == 0 && t->offset <= size && bytes <= size - t->offset;
}

static bool overlaps(const llmem_tensor *a, const llmem_tensor *b)
{
    if (!a || !b || a->buf != b->buf)
        return false;
    size_t na = llmem_tensor_nbytes(a), nb = llmem_tensor_nbytes(b);
    if (na == 0 || nb == 0)
        return false;
    return a->offset < b->offset + nb && b->offset < a->offset + na;
}

/* logits [.., V >= 1] f32 (or zero rows). */
static bool logits_ok(llmem_backend *be, const llmem_tensor *x)
{
    return tensor_ok(be, x, LLMEM_DTYPE_F32) &&
           (rows_of(x) == 0 || x->ne[x->n_dims - 1] >= 1);
}

llmem_status llmem_op_sample(llmem_backend *be, const llmem_sample_params *p,
                             const llmem_tensor *logits, const llmem_tensor *ctr,
                             const llmem_tensor *out)
{
    if (!be || !p)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_sample_params *, llmem_ct *, llmem_ct *,
                       llmem_ct *) = SLOT_OF(be, sample);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (isnan(p->temperature) || !(p->top_p > 0.0f) || isnan(p->min_p) || p->min_p > 1.0f)
        return LLMEM_E_INVALID;
    if (!logits_ok(be, logits) || !tensor_ok(be, out, LLMEM_DTYPE_I32) || overlaps(out, logits))
        return LLMEM_E_INVALID;
    int64_t rows = rows_of(logits);
    if (llmem_tensor_nelements(out) != rows)
        return LLMEM_E_INVALID;
    if (ctr && (!tensor_ok(be, ctr, LLMEM_DTYPE_I32) || llmem_tensor_nelements(ctr) != rows ||
                overlaps(out, ctr)))
        return LLMEM_E_INVALID;
    if (rows == 0)
        return LLMEM_OK;
    return fn(be, p, logits, ctr, out);
}

llmem_status llmem_op_logprob_gather(llmem_backend *be, const llmem_tensor *logits,
                                     const llmem_tensor *ids, const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *) =
        SLOT_OF(be, logprob_gather);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!logits_ok(be, logits) || !tensor_ok(be, ids, LLMEM_DTYPE_I32) ||
        !tensor_ok(be, out, LLMEM_DTYPE_F32) || overlaps(out, logits) || overlaps(out, ids))
        return LLMEM_E_INVALID;
    int64_t rows = rows_of(logits);
    if (llmem_tensor_nelements(ids) != rows || llmem_tensor_nelements(out) != rows)
        return LLMEM_E_INVALID;
    if (rows == 0)
        return LLMEM_OK;
    return fn(be, logits, ids, out);
}

llmem_status llmem_op_top_logprobs(llmem_backend *be, const llmem_tensor *logits, int32_t n,
                                   const llmem_tensor *top_ids, const llmem_tensor *top_lp)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, int32_t, llmem_ct *, llmem_ct *) =
        SLOT_OF(be, top_logprobs);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!logits_ok(be, logits) || !tensor_ok(be, top_ids, LLMEM_DTYPE_I32) ||
        !tensor_ok(be, top_lp, LLMEM_DTYPE_F32) || overlaps(top_ids, logits) ||
        overlaps(top_lp, logits) || overlaps(top_ids, top_lp))
        return LLMEM_E_INVALID;
    int64_t rows = rows_of(logits);
    int64_t v = logits->ne[logits->n_dims - 1];
    if (n < 1 || n > 64 || n > v || llmem_tensor_nelements(top_ids) != rows * n ||
        llmem_tensor_nelements(top_lp) != rows * n)
        return LLMEM_E_INVALID;
    if (rows == 0)
        return LLMEM_OK;
    return fn(be, logits, n, top_ids, top_lp);
}

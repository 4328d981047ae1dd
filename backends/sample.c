/* llmem: the wrappers of the sampling ops of <llmem/ops.h> (sample,
 * logprob_gather, top_logprobs).
 *
 * Like backends/ops.c, each wrapper checks every argument it can see from
 * the host, then calls the backend's slot; a backend whose table lacks the
 * slot (an older plugin, or one that has not implemented it yet) gets
 * LLMEM_E_UNSUPPORTED, so callers can fall back to downloading logits.
 */
#include <math.h>

#include "backends/ops_internal.h"

/* logits [.., V >= 1] f32 (or zero rows). */
static bool logits_ok(llmem_backend *be, const llmem_tensor *x)
{
    return tensor_ok(be, x, DT_F32) &&
           (rows_of(x) == 0 || x->ne[x->n_dims - 1] >= 1);
}

llmem_status llmem_op_sample(llmem_backend *be, const llmem_sample_params *p,
                             const llmem_tensor *logits, const llmem_tensor *ctr,
                             const llmem_tensor *out)
{
    if (!be || !p)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, const llmem_sample_params *, llmem_ct *, llmem_ct *,
                       llmem_ct *) = SLOT(be, sample);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (isnan(p->temperature) || !(p->top_p > 0.0f) || isnan(p->min_p) || p->min_p > 1.0f)
        return LLMEM_E_INVALID;
    if (!logits_ok(be, logits) || !tensor_ok(be, out, DT_I32) || overlaps(out, logits))
        return LLMEM_E_INVALID;
    int64_t rows = rows_of(logits);
    if (llmem_tensor_nelements(out) != rows)
        return LLMEM_E_INVALID;
    if (ctr && (!tensor_ok(be, ctr, DT_I32) || llmem_tensor_nelements(ctr) != rows ||
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
        SLOT(be, logprob_gather);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!logits_ok(be, logits) || !tensor_ok(be, ids, DT_I32) ||
        !tensor_ok(be, out, DT_F32) || overlaps(out, logits) || overlaps(out, ids))
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
        SLOT(be, top_logprobs);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!logits_ok(be, logits) || !tensor_ok(be, top_ids, DT_I32) ||
        !tensor_ok(be, top_lp, DT_F32) || overlaps(top_ids, logits) ||
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

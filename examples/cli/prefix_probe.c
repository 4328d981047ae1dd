/* A new sequence's first chunk sized to its prefix-cache hit (prefix_probe.h). */
#include "examples/cli/prefix_probe.h"

/* Leading tokens of the `left` the prefix cache would serve: 0 when none, when
 * all would (the plan computes the last token anyway) or when the probe does
 * not plan. */
static int32_t cached_prefix(llmem_memory *mem, llmem_batch_buf *probe, int32_t n_ubatch,
                             int32_t seq, int32_t left, probe_token_fn tok, const void *ctx)
{
    llmem_batch_buf_clear(probe);
    for (int32_t p = 0; p < left; p++)
        if (llmem_batch_buf_add(probe, tok(ctx, p), p, &seq, 1, p == left - 1) != LLMEM_OK)
            return 0;
    llmem_plan *plan = NULL;
    char err[256];
    if (llmem_memory_plan(mem, llmem_batch_buf_get(probe), LLMEM_SPLIT_AUTO, n_ubatch, &plan, err,
                          sizeof err) != LLMEM_OK)
        return 0;
    int32_t hit = llmem_plan_n_cached(plan, seq);
    llmem_memory_release(mem, plan);
    return hit > 0 && hit < left ? hit : 0;
}

int32_t prefix_first_chunk(llmem_memory *mem, llmem_batch_buf *probe, int32_t n_ubatch,
                           int32_t seq, int32_t left, int32_t budget, probe_token_fn tok,
                           const void *ctx, int32_t *cost)
{
    int32_t k = left < budget ? left : budget;
    int32_t hit = probe && k < left && left >= 2
                      ? cached_prefix(mem, probe, n_ubatch, seq, left, tok, ctx)
                      : 0;
    if (hit > 0)
        k = hit + budget < left ? hit + budget : left;
    *cost = k - (hit < k - 1 ? hit : k - 1);
    return k;
}

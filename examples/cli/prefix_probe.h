/* A new sequence's first prefill chunk, sized to take its whole prefix-cache
 * hit: shared by `llmem replay` (replay_sched.c) and `llmem serve` (engine.c).
 * See docs/replay.md, "Each step", point 3. */
#ifndef LLMEM_CLI_PREFIX_PROBE_H
#define LLMEM_CLI_PREFIX_PROBE_H

#include <stdint.h>

#include "llmem/batch.h"
#include "llmem/memory.h"

/* Token at position p (0 <= p < the request's length) of a request. */
typedef int32_t (*probe_token_fn)(const void *ctx, int32_t p);

/* Length of the first chunk of a newly admitted request whose sequence seq is
 * empty and which has `left` tokens to feed, when the step has `budget`
 * (>= 1) tokens of compute left; *cost gets the budget it uses.
 *
 * Only a sequence's first chunk can be served by the prefix cache (a plan
 * skips cached tokens of empty sequences only), so when the budget cannot
 * hold the whole request, a probe plan of all `left` tokens
 * (llmem_memory_plan with LLMEM_SPLIT_AUTO and n_ubatch, then
 * llmem_plan_n_cached) asks how many leading tokens are cached, and is
 * released unapplied: plans are transactional and hits count only at commit,
 * so mem and its statistics are unchanged. The chunk then covers the cached
 * prefix plus the budget (cached tokens cost no compute; the plan never skips
 * a chunk's last token, so *cost >= 1). A probe that does not plan (e.g.
 * LLMEM_E_NO_SPACE) counts as no hit: the real plan decides admission.
 *
 * probe: a batch buffer of at least `left` tokens for one sequence each, or
 * NULL to skip the probe (the chunk is then min(left, budget)); tok/ctx give
 * the request's tokens. Returns a value in [1, left] when left >= 1. */
int32_t prefix_first_chunk(llmem_memory *mem, llmem_batch_buf *probe, int32_t n_ubatch,
                           int32_t seq, int32_t left, int32_t budget, probe_token_fn tok,
                           const void *ctx, int32_t *cost);

#endif

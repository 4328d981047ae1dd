/* llmem: recurrent-state memory (Mamba-1/2, RWKV, linear attention).
 *
 * Each layer declares its states by descriptor (name, shape, dtype), so
 * Mamba-2 (conv [d_conv-1, conv_dim], ssm [n_heads, head_dim, d_state]),
 * Mamba-1 and RWKV fit without code changes. A state slot holds one
 * sequence's states for every layer; each layer/state pair has one buffer
 * of [n_slots][elements]. Each sequence owns up to 1 + n_ckpt slots: its
 * current state and checkpoints. A ubatch of T tokens per sequence writes
 * the state after its last token (dst slot) and, into checkpoint slots, the
 * states after each of the min(n_ckpt, T - 1) tokens before it; the state
 * before the ubatch is kept as a checkpoint too. seq_rm back to a
 * checkpointed position is a slot switch (speculative-decoding rollback
 * without recompute). On release of a ubatch that was applied but not
 * committed, a sequence keeps its current state but may lose older
 * checkpoints whose slots the ubatch reused.
 *
 * References: Mamba-2 / SSD (Dao & Gu, ICML 2024) for the state shapes;
 * llama.cpp's llama_memory_recurrent and vLLM's MambaCacheManager for slot
 * management.
 */
#ifndef LLMEM_RECURRENT_H
#define LLMEM_RECURRENT_H

#include "llmem/memory.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef struct llmem_recurrent_params {
    int32_t n_layers;                      /* >= 1 */
    const int32_t *n_states;               /* [n_layers] states per layer (0 allowed) */
    const llmem_state_desc *const *states; /* [n_layers][n_states[il]] */
    int32_t n_seq_max;                     /* >= 1 */
    int32_t n_ckpt;                        /* checkpoints per sequence (>= 0) */
    bool poison;                           /* NaN-fill freed and fresh slots (also LLMEM_POISON=1) */
    /* Snapshots for prefix reuse (issue 13): up to n_snapshots states of
     * token prefixes, published at commit after the state is written, at
     * lengths that are multiples of snap_interval tokens (0: none), at the
     * end of each prompt ubatch, and where a composition asks the plan to
     * end a ubatch (the length its attention children already hold).
     * Verified by token ids, pinned by plans reading them, evicted LRU.
     * 0 = off; LLMEM_SNAPSHOTS=<n>[:<interval>] sets both when 0; -1: as
     * many as prefix_cache_bytes holds (floor(bytes / slot bytes), at
     * most 4096; needs prefix_cache_bytes). */
    int32_t n_snapshots;
    int32_t snap_interval;
    /* Host tier (issue 13): bytes of host memory (from
     * llmem_backend_host_alloc: pinned on CUDA) that snapshots evicted from
     * the n_snapshots device slots spill to; a prefix hit on one copies it
     * back into a device slot at the plan's first apply. 0: off, or
     * LLMEM_HOST_TIER_MB (MiB) when set; needs n_snapshots > 0. In a hybrid
     * the children share one tier (the largest budget among them): KV
     * pages and snapshots are then evicted least recently used together. */
    int64_t host_tier_bytes;
    /* Prefix budget (issue 13): device bytes the published snapshots (one
     * state slot of every layer each) may hold; a new snapshot past it
     * evicts the least recently used one first (to the host tier when
     * there is one), or is not published. In a hybrid the children share
     * one budget (the largest among them) and one LRU with the KV caches'
     * cached pages (llmem_kv_cache_params.prefix_cache_bytes): a page
     * becoming cached may evict a snapshot and a snapshot a page. 0: none
     * (the n_snapshots slots bound them); needs n_snapshots != 0. */
    int64_t prefix_cache_bytes;
    /* A prompt's snapshot where the plan would end a ubatch only to publish
     * one (the last multiple of snap_interval in a new prompt) is instead
     * written inside the ubatch (llmem_rs_view.snap_tok / snap_slot,
     * <llmem/view.h>) and published at commit, so the prompt's prefill
     * stays whole ubatches (the cut's extra ubatch reads every weight once
     * more: a 9B pp512 on an H200 took 50.9 -> 39.2 ms on cuda, 87.7 ->
     * 77.6 on vulkan without it). Set it only when every op the layers run
     * with the view writes such snapshots: ssm_conv, ssm_scan, ssm_scan1,
     * short_conv and gdn do on the in-tree cpu, cuda and vulkan backends;
     * other recurrent ops refuse the view (LLMEM_E_UNSUPPORTED). false:
     * the plan ends a ubatch there. */
    bool snap_in_ubatch;
} llmem_recurrent_params;

/* Fills a Mamba-2 layer's two descriptors (conv then ssm) in out[2]:
 * conv [d_conv - 1, conv_dim], conv_dim = d_inner + 2 * n_groups * d_state;
 * ssm [n_heads, head_dim, d_state]; both f32. */
void llmem_recurrent_mamba2_states(int32_t d_conv, int32_t d_inner, int32_t n_groups,
                                   int32_t d_state, int32_t n_heads, int32_t head_dim,
                                   llmem_state_desc out[2]);

/* Creates a recurrent memory with n_seq_max * (2 + n_ckpt) slots (each
 * sequence holds at most 1 + n_ckpt; one more lets a ubatch write a new
 * current state without overwriting the committed one), allocated
 * through `be` (one buffer per layer and state), plus n_snapshots snapshot
 * slots and, with host_tier_bytes (or LLMEM_HOST_TIER_MB) and snapshots on,
 * a host tier whose blocks come from llmem_backend_host_alloc as snapshots
 * spill. The memory keeps a reference to `be`; the caller closes it after
 * destroying the memory.
 * Returns LLMEM_OK; LLMEM_E_INVALID (bad parameter, e.g. host_tier_bytes
 * < 0, or a prefix_cache_bytes below one snapshot's bytes, or n_snapshots
 * -1 without prefix_cache_bytes; reason in err); LLMEM_E_NO_MEMORY. */
llmem_status llmem_recurrent_create(llmem_backend *be, const llmem_recurrent_params *params,
                                    llmem_memory **out, char *err, size_t err_len);

/* Current state slot of seq_id (-1 when empty or invalid), and the
 * positions it holds checkpoints for (up to cap; returns the count). */
int32_t llmem_recurrent_seq_slot(llmem_memory *mem, int32_t seq_id);
int32_t llmem_recurrent_checkpoints(llmem_memory *mem, int32_t seq_id, int32_t *pos,
                                    int32_t cap);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

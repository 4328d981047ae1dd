/* llmem: the paged unified KV cache.
 *
 * One page id space per cache; each layer has a K and a V pool of
 * [n_pages][page_size][n_kv_heads][head_dim] elements of `dtype`. Each
 * sequence has a page table. Pages are refcounted: seq_cp shares full pages
 * and copies a shared partial page before writing it (copy-on-write). Full
 * pages are published to a prefix cache at commit, keyed by a chained
 * XXH3-64 over their token ids and verified against the stored ids; when no
 * page is free, unreferenced cached pages are evicted in LRU order.
 *
 * References: PagedAttention (Kwon et al., SOSP 2023, "Efficient Memory
 * Management for Large Language Model Serving with PagedAttention"), vLLM's
 * automatic prefix caching (hash chain over full blocks), SGLang's
 * RadixAttention for the LRU eviction of unreferenced prefixes.
 */
#ifndef LLMEM_KV_CACHE_H
#define LLMEM_KV_CACHE_H

#include "llmem/memory.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef struct llmem_kv_cache_params {
    int32_t n_layers;    /* layers with K/V (>= 1) */
    int32_t n_kv_heads;  /* KV heads per layer (>= 1; GQA: fewer than query heads) */
    int32_t head_dim;    /* elements per head (>= 1) */
    llmem_dtype dtype;   /* F32, F16, BF16, or the scaled I8 / F8E4M3 (head_dim a
                            multiple of 4; per-page, per-head scales, see
                            llmem_kv_page_bytes and docs/memory.md) */
    int32_t page_size;   /* tokens per page (>= 1) */
    int32_t n_pages;     /* pages in the pool (>= 1) */
    int32_t n_seq_max;   /* sequence ids are [0, n_seq_max) (>= 1) */
    bool no_prefix_cache;/* disable prefix caching (default: enabled) */
    bool poison;         /* fill freed and fresh pages with NaN (also LLMEM_POISON=1) */
    /* Host tier (issue 13): bytes of host memory that published pages
     * evicted from the pool spill to (K and V of every layer per page),
     * found again by the prefix cache and copied back on a hit; LRU within
     * the budget. 0 = off; when 0, LLMEM_HOST_TIER_MB (MiB) decides. In a
     * hybrid the children share one tier (llmem_recurrent_params). */
    int64_t host_tier_bytes;
    /* Sliding window (issue 17; memory/swa.c). 0: every key is kept (a full
     * cache). > 0: every layer of this cache is a sliding-window layer whose
     * queries see at most their last `window` keys, their own included (the
     * attention op's llmem_attn_params.window, which the caller passes with
     * the same value for these layers; Gemma-3 / Mistral semantics, tokens
     * counted by index in the sequence). At each commit the pages that lie
     * wholly before index len + 1 - window - window_slack of a sequence of
     * len tokens leave its page table: freed, or kept in the prefix cache
     * when published, and kept while another sequence still holds them. The
     * views show each sequence from its first kept page on (page_off,
     * seq_len and tok_kv_len shifted by the dropped tokens), so the
     * attention op never sees a dropped page. Put layers with other windows
     * (or full attention) in other caches of a hybrid (<llmem/hybrid.h>).
     * A windowed cache cannot shift positions (seq_add/seq_div). */
    int32_t window;
    /* Tokens kept beyond the window (>= 0) so that a rollback (seq_rm of a
     * suffix, e.g. rejected speculative-decoding drafts) of up to this many
     * tokens never needs a dropped page: set it to the longest draft. A
     * longer cut succeeds only while the pages it needs are still held,
     * else returns LLMEM_E_STATE and changes nothing. */
    int32_t window_slack;
    /* Prefix budget (issue 13): device bytes that cached pages (published
     * pages no sequence holds, kept for prefix reuse; 2 * n_layers *
     * llmem_kv_page_bytes each) may hold. When a page becomes cached past
     * the budget, the least recently used cached page is evicted (to the
     * host tier when there is one). In a hybrid the children share one
     * budget (the largest among them) and one LRU with the recurrent
     * child's snapshots (llmem_recurrent_params.prefix_cache_bytes). 0:
     * none (cached pages use every page no sequence holds); ignored with
     * no_prefix_cache. */
    int64_t prefix_cache_bytes;
} llmem_kv_cache_params;

/* Default parameters (f16, page 16, prefix cache on); the caller fills the
 * geometry (layers, heads, head_dim, n_pages, n_seq_max). */
llmem_kv_cache_params llmem_kv_cache_default_params(void);

/* Creates a KV cache and allocates its pools through `be`
 * (2 * n_layers buffers of n_pages * llmem_kv_page_bytes(dtype, page_size,
 * n_kv_heads, head_dim) bytes: page_size * n_kv_heads * head_dim * dtype
 * size, plus the per-head scales for I8 / F8E4M3), plus the host tier when host_tier_bytes (or
 * LLMEM_HOST_TIER_MB) is set: host memory from llmem_backend_host_alloc
 * (pinned on CUDA), allocated as pages spill, for at most
 * floor(bytes / (2 * n_layers * page bytes)) pages; none when the prefix
 * cache is off. The memory keeps a reference to `be`; the caller keeps
 * ownership of `be` and must close it after destroying the memory.
 * Returns LLMEM_OK; LLMEM_E_INVALID (a parameter out of range, with the
 * reason in err; an overflowing pool size; or a prefix_cache_bytes below
 * one page's 2 * n_layers * page bytes, which could never cache a page);
 * LLMEM_E_NO_MEMORY. */
llmem_status llmem_kv_cache_create(llmem_backend *be, const llmem_kv_cache_params *params,
                                   llmem_memory **out, char *err, size_t err_len);

/* Page table of seq_id: copies up to `cap` page ids and returns the number
 * of pages it holds (-1 for an invalid id). Entries of pages that left a
 * sliding window (params.window) read -1; between a plan and its first
 * apply, an entry the plan copies on write still names the page it copies
 * (the copy is made at apply). For tests and tools. */
int32_t llmem_kv_cache_page_table(llmem_memory *mem, int32_t seq_id, int32_t *out, int32_t cap);

/* The sliding window of a KV cache (llmem_kv_cache_params.window): 0 for a
 * full cache, -1 when mem is not a KV cache (a composition: ask its
 * children, llmem_memory_child). A model passes it as the attention op's
 * window of the layers this cache serves. */
int32_t llmem_kv_cache_window(llmem_memory *mem);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

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

typedef struct llmem_kv_cache_params {
    int32_t n_layers;    /* layers with K/V (>= 1) */
    int32_t n_kv_heads;  /* KV heads per layer (>= 1; GQA: fewer than query heads) */
    int32_t head_dim;    /* elements per head (>= 1) */
    llmem_dtype dtype;   /* F32, F16 or BF16 */
    int32_t page_size;   /* tokens per page (>= 1) */
    int32_t n_pages;     /* pages in the pool (>= 1) */
    int32_t n_seq_max;   /* sequence ids are [0, n_seq_max) (>= 1) */
    bool no_prefix_cache;/* disable prefix caching (default: enabled) */
    bool poison;         /* fill freed and fresh pages with NaN (also LLMEM_POISON=1) */
    /* Host tier (issue 13): bytes of host memory that published pages
     * evicted from the pool spill to (K and V of every layer per page),
     * found again by the prefix cache and copied back on a hit; LRU within
     * the budget. 0 = off; when 0, LLMEM_HOST_TIER_MB (MiB) decides. */
    int64_t host_tier_bytes;
} llmem_kv_cache_params;

/* Default parameters (f16, page 16, prefix cache on); the caller fills the
 * geometry (layers, heads, head_dim, n_pages, n_seq_max). */
llmem_kv_cache_params llmem_kv_cache_default_params(void);

/* Creates a KV cache and allocates its pools through `be`
 * (2 * n_layers buffers of n_pages * page_size * n_kv_heads * head_dim *
 * dtype-size bytes), plus the host tier when host_tier_bytes (or
 * LLMEM_HOST_TIER_MB) is set: malloc'd host memory for
 * floor(bytes / (2 * n_layers * page bytes)) pages, none when that is 0 or
 * the prefix cache is off. The memory keeps a reference to `be`; the caller keeps
 * ownership of `be` and must close it after destroying the memory.
 * Returns LLMEM_OK; LLMEM_E_INVALID (a parameter out of range, with the
 * reason in err; or an overflowing pool size); LLMEM_E_NO_MEMORY. */
llmem_status llmem_kv_cache_create(llmem_backend *be, const llmem_kv_cache_params *params,
                                   llmem_memory **out, char *err, size_t err_len);

/* Page table of seq_id: copies up to `cap` page ids and returns the number
 * of pages it holds (-1 for an invalid id). For tests and tools. */
int32_t llmem_kv_cache_page_table(llmem_memory *mem, int32_t seq_id, int32_t *out, int32_t cap);

#ifdef __cplusplus
}
#endif
#endif

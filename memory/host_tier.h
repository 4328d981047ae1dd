/* llmem memory/: the host tier of the KV prefix cache (issue 13 item 3).
 *
 * A fixed set of host entries, each holding one evicted published page: its
 * chain hash, its parent's chain hash, its token ids and the page's K and V
 * bytes for every layer. Entries are found by the same content-keyed chain
 * as device pages (hash, parent hash, token ids verified) and evicted LRU
 * when the budget is full. An entry is either free, cached (on the LRU) or
 * pinned (taken off the LRU by a plan that restores it). */
#ifndef LLMEM_HOST_TIER_H
#define LLMEM_HOST_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct host_tier {
    int32_t cap, page_size;
    size_t entry_bytes;  /* 2 * n_layers * page bytes */
    uint8_t *data;       /* [cap][entry_bytes] */
    uint64_t *hash, *parent_hash;
    int32_t *tokens;     /* [cap][page_size] */
    uint8_t *state;      /* 0 free, 1 cached, 2 pinned */
    int32_t *lru_prev, *lru_next, lru_head, lru_tail;
    int32_t *free_stack, n_free;
    int32_t *bucket, *bucket_next, n_buckets;
    int32_t *restored;   /* device page a pinned entry went to, -1 none */
    int64_t n_spills, n_restores, n_evictions;
} host_tier;

/* Sizes the tier for floor(budget / entry_bytes) entries (0 entries: off,
 * nothing allocated). Returns false when host memory runs out. */
bool host_tier_init(host_tier *ht, size_t budget, size_t entry_bytes, int32_t page_size);
void host_tier_finish(host_tier *ht);
/* Drops every entry. */
void host_tier_reset(host_tier *ht);
/* Entries holding a page now (cached or pinned). */
int32_t host_tier_count(const host_tier *ht);
/* Cached or pinned entry with this chain key and tokens, or -1. */
int32_t host_tier_lookup(const host_tier *ht, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens);
/* Takes an entry for a new page (a free one, else evicts the least recently
 * used cached one) and indexes it under the key; the caller fills
 * ht->data + e * entry_bytes. Returns the entry (cached), or -1 when every
 * entry is pinned or the tier is off. */
int32_t host_tier_insert(host_tier *ht, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens);
/* Takes a cached entry off the LRU so that no insert evicts it. */
void host_tier_pin(host_tier *ht, int32_t e);
/* Puts a pinned entry back on the LRU (most recently used end). */
void host_tier_unpin(host_tier *ht, int32_t e);
/* Removes an entry (cached or pinned) from the index: it becomes free. */
void host_tier_remove(host_tier *ht, int32_t e);

/* Consistency check (free stack, LRU, index; no entry pinned: pins live
 * only inside a reserve); writes the first violation into err. */
bool host_tier_check(const host_tier *ht, char *err, size_t err_len);

#endif

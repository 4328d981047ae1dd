/* llmem memory/: the page pool and prefix index of the paged KV cache.
 *
 * Every page is in exactly one of three states:
 *   used   — refcount > 0 (held by page tables or pinned by a plan);
 *   cached — refcount 0 and published in the prefix index (on the LRU list,
 *            evictable);
 *   free   — refcount 0, unpublished (on the free stack).
 * Published pages are immutable: a sequence that must write into one copies
 * it first. */
#ifndef LLMEM_PAGE_POOL_H
#define LLMEM_PAGE_POOL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct page_pool {
    int32_t n_pages, page_size;
    int32_t *ref;
    uint8_t *published;
    uint8_t *hashed;     /* hash/parent valid: the page is full and its prefix canonical */
    uint64_t *hash;      /* chained XXH3-64 of the tokens up to and including this page */
    uint64_t *parent_hash; /* chain hash of the previous page, PAGE_HASH_SEED for the first */
    int32_t *tokens;     /* [n_pages][page_size] token ids the hash covers */
    int32_t *free_stack;
    int32_t n_free;
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail, n_cached; /* head = least recently used */
    int32_t *bucket, *bucket_next;        /* prefix index: hash -> chain of pages */
    int32_t n_buckets;
    int64_t n_used_peak, n_evictions;
    /* LRU stamps: stamp[p] is *clock (incremented) when page p became
     * cached; clock points to own_clock, or to the clock of the prefix
     * budget the cache shares (prefix_budget.h) */
    uint64_t *stamp;
    uint64_t own_clock, *clock;
} page_pool;

bool page_pool_init(page_pool *pp, int32_t n_pages, int32_t page_size);
void page_pool_finish(page_pool *pp);
/* Drops every reference and the whole index: all pages free. */
void page_pool_reset(page_pool *pp);

int32_t page_pool_used(const page_pool *pp);
/* Pages obtainable now: free + evictable. */
int32_t page_pool_available(const page_pool *pp);
/* Takes a page (free first, else evicts the least recently used cached
 * page); refcount 1. Returns -1 when none is available. *evicted tells
 * whether a cached page was evicted. */
int32_t page_pool_alloc(page_pool *pp, bool *was_cached);
/* Raises n_used_peak to the pages now used, not counting `idle` pages
 * that are taken but hold nothing (the KV cache's page magazines). */
static inline void page_pool_note_peak(page_pool *pp, int64_t idle)
{
    int64_t used = (int64_t)pp->n_pages - pp->n_free - pp->n_cached - idle;
    if (used > pp->n_used_peak)
        pp->n_used_peak = used;
}
/* Pops the top of the free stack (n_free > 0 required): refcount 1, no
 * hash; the peak is the caller's (page_pool_note_peak). */
static inline int32_t page_pool_pop_free(page_pool *pp)
{
    int32_t p = pp->free_stack[--pp->n_free];
    pp->ref[p] = 1;
    pp->hashed[p] = 0;
    return p;
}
/* page_pool_alloc's common case, inline: the top of the free stack when
 * there is one (refcount 1), else -1 and nothing changes (the caller then
 * calls page_pool_alloc, which may evict). A decode step in pages of 1
 * takes a page per sequence. */
static inline int32_t page_pool_take_free(page_pool *pp)
{
    if (pp->n_free <= 0)
        return -1;
    int32_t p = page_pool_pop_free(pp);
    page_pool_note_peak(pp, 0);
    return p;
}
void page_pool_ref(page_pool *pp, int32_t p);
/* Drops a reference; returns true when the page became free (not cached). */
bool page_pool_unref(page_pool *pp, int32_t p);
/* Evicts the least recently used cached page (it becomes free) and returns
 * it; -1 when no page is cached. Counted in n_evictions. */
int32_t page_pool_evict(page_pool *pp);
/* Prefix index. */
uint64_t page_hash(uint64_t parent_hash, const int32_t *tokens, int32_t n);
#define PAGE_HASH_SEED 0x6c6c6d656d2d6b76ull
/* Finds a published page holding `tokens` with chain hash `hash` whose
 * parent's chain hash is `parent_hash`, or -1. The chain is keyed by content
 * (this page's tokens and its parent's content hash), never by page id, so
 * every copy of a prefix is findable; among equal pages the most recently
 * published one is returned. */
int32_t page_pool_lookup(const page_pool *pp, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens);
/* Publishes a hashed page (duplicates of published pages included, so a
 * second copy stays reachable when the first is evicted); returns whether
 * it was published. */
static inline bool page_pool_publish(page_pool *pp, int32_t p)
{
    if (pp->published[p] || !pp->hashed[p])
        return false;
    /* head insertion: lookups find the newest copy first (inline: a
     * decode step in pages of 1 publishes a page per token) */
    int32_t b = (int32_t)(pp->hash[p] & (uint64_t)(pp->n_buckets - 1));
    pp->bucket_next[p] = pp->bucket[b];
    pp->bucket[b] = p;
    pp->published[p] = 1;
    return true;
}

/* Removes a page from the index (it stays used / becomes free). */
void page_pool_unpublish(page_pool *pp, int32_t p);
/* Consistency check; writes the first violation into err. */
bool page_pool_check(const page_pool *pp, const int32_t *expected_ref, char *err, size_t err_len);

#endif

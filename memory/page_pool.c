/* llmem memory/: page pool (refcounts, free stack, LRU of cached pages)
 * and the prefix index (chained XXH3-64 over full pages, verified against
 * stored token ids; vLLM's automatic prefix caching hashes full blocks the
 * same way, SGLang's RadixAttention evicts unreferenced prefixes LRU-first). */
#include <stdlib.h>
#include <string.h>
/* inline XXH3: a decode step in pages of 1 hashes a 4-byte page per token,
 * where a call into libxxhash costs as much as the hash */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "memory/internal.h"
#include "memory/page_pool.h"
#include "memory/seq_heap.h"

bool page_pool_init(page_pool *pp, int32_t n_pages, int32_t page_size)
{
    memset(pp, 0, sizeof *pp);
    pp->n_pages = n_pages;
    pp->page_size = page_size;
    size_t n = (size_t)n_pages;
    int32_t nb = 16;
    while (nb < n_pages && nb < (1 << 28))
        nb <<= 1;
    pp->n_buckets = nb;
    pp->ref = calloc(n, sizeof *pp->ref);
    pp->published = calloc(n, 1);
    pp->hashed = calloc(n, 1);
    pp->hash = calloc(n, sizeof *pp->hash);
    pp->parent_hash = calloc(n, sizeof *pp->parent_hash);
    pp->tokens = calloc(n * (size_t)page_size, sizeof *pp->tokens);
    pp->free_stack = malloc(n * sizeof *pp->free_stack);
    pp->lru_prev = malloc(n * sizeof *pp->lru_prev);
    pp->lru_next = malloc(n * sizeof *pp->lru_next);
    pp->bucket = malloc((size_t)nb * sizeof *pp->bucket);
    pp->bucket_next = malloc(n * sizeof *pp->bucket_next);
    pp->stamp = calloc(n, sizeof *pp->stamp);
    pp->clock = &pp->own_clock;
    if (!pp->stamp || !pp->ref || !pp->published || !pp->hashed || !pp->hash || !pp->parent_hash || !pp->tokens ||
        !pp->free_stack || !pp->lru_prev || !pp->lru_next || !pp->bucket || !pp->bucket_next) {
        page_pool_finish(pp);
        return false;
    }
    /* indexed by page id every step (refcounts, flags, the prefix index):
     * large pools are better on huge pages */
    seq_heap_advise(pp->ref, n * sizeof *pp->ref);
    seq_heap_advise(pp->published, n);
    seq_heap_advise(pp->hashed, n);
    seq_heap_advise(pp->hash, n * sizeof *pp->hash);
    seq_heap_advise(pp->parent_hash, n * sizeof *pp->parent_hash);
    seq_heap_advise(pp->tokens, n * (size_t)page_size * sizeof *pp->tokens);
    seq_heap_advise(pp->free_stack, n * sizeof *pp->free_stack);
    seq_heap_advise(pp->bucket, (size_t)nb * sizeof *pp->bucket);
    seq_heap_advise(pp->bucket_next, n * sizeof *pp->bucket_next);
    /* page_pool_reset writes the other per-page arrays; these four are
     * first written when a page is published (or cached), which a decode
     * step in pages of 1 does for a page of every sequence: their page
     * faults (~20 a step at 4,000 sequences, one per 512 pages' hashes)
     * happen here instead of in the steps (docs/benchmarks.md, "Host
     * bookkeeping, issue 10: first touches and row order") */
    seq_heap_prefault(pp->hash, n * sizeof *pp->hash);
    seq_heap_prefault(pp->parent_hash, n * sizeof *pp->parent_hash);
    seq_heap_prefault(pp->tokens, n * (size_t)page_size * sizeof *pp->tokens);
    seq_heap_prefault(pp->stamp, n * sizeof *pp->stamp);
    page_pool_reset(pp);
    return true;
}

void page_pool_finish(page_pool *pp)
{
    free(pp->ref);
    free(pp->published);
    free(pp->hashed);
    free(pp->hash);
    free(pp->parent_hash);
    free(pp->tokens);
    free(pp->free_stack);
    free(pp->lru_prev);
    free(pp->lru_next);
    free(pp->bucket);
    free(pp->bucket_next);
    free(pp->stamp);
    memset(pp, 0, sizeof *pp);
}

void page_pool_reset(page_pool *pp)
{
    /* free stack popped from the end: low page ids first */
    for (int32_t i = 0; i < pp->n_pages; i++) {
        pp->free_stack[i] = pp->n_pages - 1 - i;
        pp->ref[i] = 0;
        pp->published[i] = 0;
        pp->hashed[i] = 0;
        pp->lru_prev[i] = pp->lru_next[i] = -1;
        pp->bucket_next[i] = -1;
    }
    for (int32_t b = 0; b < pp->n_buckets; b++)
        pp->bucket[b] = -1;
    pp->n_free = pp->n_pages;
    pp->lru_head = pp->lru_tail = -1;
    pp->n_cached = 0;
}

int32_t page_pool_used(const page_pool *pp)
{
    return pp->n_pages - pp->n_free - pp->n_cached;
}

int32_t page_pool_available(const page_pool *pp)
{
    return pp->n_free + pp->n_cached;
}

static void lru_remove(page_pool *pp, int32_t p)
{
    int32_t a = pp->lru_prev[p], b = pp->lru_next[p];
    if (a >= 0)
        pp->lru_next[a] = b;
    else
        pp->lru_head = b;
    if (b >= 0)
        pp->lru_prev[b] = a;
    else
        pp->lru_tail = a;
    pp->lru_prev[p] = pp->lru_next[p] = -1;
    pp->n_cached--;
}

static void lru_push(page_pool *pp, int32_t p)
{
    pp->lru_prev[p] = pp->lru_tail;
    pp->lru_next[p] = -1;
    if (pp->lru_tail >= 0)
        pp->lru_next[pp->lru_tail] = p;
    else
        pp->lru_head = p;
    pp->lru_tail = p;
    pp->n_cached++;
    pp->stamp[p] = ++*pp->clock;
}

int32_t page_pool_alloc(page_pool *pp, bool *was_cached)
{
    int32_t p = -1;
    if (was_cached)
        *was_cached = false;
    if (pp->n_free > 0) {
        return page_pool_take_free(pp);
    } else if (pp->lru_head >= 0) {
        p = pp->lru_head;
        lru_remove(pp, p);
        pp->ref[p] = 1; /* so unpublish does not move it to the free stack */
        page_pool_unpublish(pp, p);
        pp->n_evictions++;
        if (was_cached)
            *was_cached = true;
    } else {
        return -1;
    }
    pp->ref[p] = 1;
    pp->hashed[p] = 0;
    page_pool_note_peak(pp, 0);
    return p;
}

int32_t page_pool_evict(page_pool *pp)
{
    int32_t p = pp->lru_head;
    if (p < 0)
        return -1;
    page_pool_unpublish(pp, p); /* ref 0: off the LRU, onto the free stack */
    pp->n_evictions++;
    return p;
}

void page_pool_ref(page_pool *pp, int32_t p)
{
    if (pp->ref[p] == 0 && pp->published[p])
        lru_remove(pp, p);
    pp->ref[p]++;
    page_pool_note_peak(pp, 0);
}

bool page_pool_unref(page_pool *pp, int32_t p)
{
    if (--pp->ref[p] > 0)
        return false;
    if (pp->published[p]) {
        lru_push(pp, p);
        return false;
    }
    pp->hashed[p] = 0;
    pp->free_stack[pp->n_free++] = p;
    return true;
}

uint64_t page_hash(uint64_t parent_hash, const int32_t *tokens, int32_t n)
{
    return XXH3_64bits_withSeed(tokens, (size_t)n * sizeof *tokens, parent_hash);
}

int32_t page_pool_lookup(const page_pool *pp, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens)
{
    size_t row = (size_t)pp->page_size * sizeof *tokens;
    for (int32_t p = pp->bucket[hash & (uint64_t)(pp->n_buckets - 1)]; p >= 0;
         p = pp->bucket_next[p])
        if (pp->hash[p] == hash && pp->parent_hash[p] == parent_hash &&
            memcmp(pp->tokens + (size_t)p * (size_t)pp->page_size, tokens, row) == 0)
            return p;
    return -1;
}

void page_pool_unpublish(page_pool *pp, int32_t p)
{
    if (!pp->published[p])
        return;
    int32_t b = (int32_t)(pp->hash[p] & (uint64_t)(pp->n_buckets - 1));
    int32_t *link = &pp->bucket[b];
    while (*link >= 0 && *link != p)
        link = &pp->bucket_next[*link];
    if (*link == p)
        *link = pp->bucket_next[p];
    pp->bucket_next[p] = -1;
    pp->published[p] = 0;
    if (pp->ref[p] == 0) {
        /* a cached page leaving the index becomes free */
        lru_remove(pp, p);
        pp->hashed[p] = 0;
        pp->free_stack[pp->n_free++] = p;
    }
}

bool page_pool_check(const page_pool *pp, const int32_t *expected_ref, char *err, size_t err_len)
{
    int32_t n = pp->n_pages, n_used = 0, n_pub_free = 0;
    for (int32_t p = 0; p < n; p++) {
        if (pp->ref[p] != expected_ref[p]) {
            llmem_errf(err, err_len, "page %d: refcount %d but %d references", p, pp->ref[p],
                       expected_ref[p]);
            return false;
        }
        if (pp->ref[p] > 0)
            n_used++;
        else if (pp->published[p])
            n_pub_free++;
        if (pp->published[p] && !pp->hashed[p]) {
            llmem_errf(err, err_len, "page %d published without a hash", p);
            return false;
        }
    }
    if (n_pub_free != pp->n_cached) {
        llmem_errf(err, err_len, "%d cached pages but LRU holds %d", n_pub_free, pp->n_cached);
        return false;
    }
    if (pp->n_free + n_used + pp->n_cached != n) {
        llmem_errf(err, err_len, "free %d + used %d + cached %d != total %d", pp->n_free, n_used,
                   pp->n_cached, n);
        return false;
    }
    int32_t cnt = 0;
    for (int32_t p = pp->lru_head, prev = -1; p >= 0; prev = p, p = pp->lru_next[p]) {
        if (pp->ref[p] != 0 || !pp->published[p] || pp->lru_prev[p] != prev || ++cnt > n ||
            (prev >= 0 && pp->stamp[p] <= pp->stamp[prev]) || pp->stamp[p] > *pp->clock) {
            llmem_errf(err, err_len, "LRU list corrupt at page %d", p);
            return false;
        }
    }
    if (cnt != pp->n_cached) {
        llmem_errf(err, err_len, "LRU list length %d != %d", cnt, pp->n_cached);
        return false;
    }
    for (int32_t i = 0; i < pp->n_free; i++) {
        int32_t p = pp->free_stack[i];
        if (p < 0 || p >= n || pp->ref[p] != 0 || pp->published[p]) {
            llmem_errf(err, err_len, "free stack entry %d (page %d) is not free", i, p);
            return false;
        }
    }
    int32_t n_index = 0;
    for (int32_t b = 0; b < pp->n_buckets; b++)
        for (int32_t p = pp->bucket[b]; p >= 0; p = pp->bucket_next[p]) {
            if (!pp->published[p] || (int32_t)(pp->hash[p] & (uint64_t)(pp->n_buckets - 1)) != b ||
                ++n_index > n) {
                llmem_errf(err, err_len, "prefix index corrupt at page %d", p);
                return false;
            }
        }
    int32_t n_pub = 0;
    for (int32_t p = 0; p < n; p++)
        n_pub += pp->published[p];
    if (n_pub != n_index) {
        llmem_errf(err, err_len, "%d published pages but the index holds %d", n_pub, n_index);
        return false;
    }
    return true;
}

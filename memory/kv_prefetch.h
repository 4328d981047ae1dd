/* llmem memory/: the KV cache's software prefetches, for the passes of
 * memory/kv_plan.c that walk thousands of sequences a decode step (each
 * sequence's entries a cache miss that the hardware prefetchers, following
 * a dozen other streams, leave to miss). Hints only: nothing they touch
 * changes. Header-only (always inlined into those loops); included by
 * kv_plan.c alone. */
#ifndef LLMEM_MEMORY_KV_PREFETCH_H
#define LLMEM_MEMORY_KV_PREFETCH_H

#include "memory/kv_internal.h"

/* Decode steps touch one page per sequence, the last of its table (kept
 * in kv_seq.last, so the table's tail is not read), and that page's pool
 * entries: with thousands of sequences each is a cache miss, so the pool
 * entries are fetched 8 sequences ahead. */
LLMEM_PREFETCH_FN void kv_prefetch_ahead(const kv_cache *kv, const llmem_plan *plan, int32_t k)
{
#if defined(__GNUC__)
    if (k + 8 < plan->n_seqs) {
        const kv_seq *q = &kv->seqs[plan->seqs[k + 8].id];
        int32_t p = q->pages.n > 0 ? q->last : -1;
        /* only a partly written last page is looked at (the copy-on-write
         * test); in pages of 1 it never is. A sliding window's dropped
         * entries are -1. */
        if (p >= 0 && kv_ps_mod(kv, q->tokens.n)) {
            __builtin_prefetch(kv->pool.ref + p, 0, 1);
            __builtin_prefetch(kv->pool.published + p, 0, 1);
            __builtin_prefetch(kv->pool.hashed + p, 0, 1);
        }
    }
#else
    (void)kv, (void)plan, (void)k;
#endif
}

/* The attach pass takes a page per sequence from the free stack in a
 * decode step in pages of 1 and writes its pool entries (refcount, hash
 * flag): those of the page the sequence 8 ahead will take, the free
 * stack's 9th from the top when each takes one (otherwise a guess, and
 * only a hint), are requested now. A pool has as many entries as pages and
 * a step takes thousands of them, which the hardware prefetchers,
 * following a dozen other streams, left to miss (4,000 sequences, 1K
 * context: this pass 16 -> 11-12 ns a sequence). The row entries the
 * pages go to are not touched here (rows_write_deferred). */
LLMEM_PREFETCH_FN void kv_prefetch_append(const kv_cache *kv, const llmem_plan *plan, int32_t k)
{
#if defined(__GNUC__)
    if (k + 8 < plan->n_seqs && kv->need[plan->seqs[k + 8].id] > 0) {
        const page_pool *pp = &kv->pool;
        if (pp->n_free > 9) {
            int32_t p = pp->free_stack[pp->n_free - 9];
            __builtin_prefetch(pp->ref + p, 1, 3);
            __builtin_prefetch(pp->hashed + p, 1, 3);
            if (pp->n_free > 32) /* the free stack itself, read downwards */
                __builtin_prefetch(pp->free_stack + pp->n_free - 32, 0, 3);
        }
    }
#else
    (void)kv, (void)plan, (void)k;
#endif
}

/* The commit of a decode step publishes the page a sequence's token fills
 * (publish_pages): its ids are read back from the sequence's token array
 * (where the stage is written first), hashed, copied into the pool, and
 * its pool entries and its predecessor's are read and written. Sequences
 * decoding in step fill their pages in the same step, every page-size
 * steps, and each of those accesses is a miss: for the sequence 8 ahead,
 * when its next token fills a page of more than one token, they are
 * requested now (hints only; nothing else changes). */
LLMEM_PREFETCH_FN void kv_prefetch_publish(const kv_cache *kv, const kv_seq *q)
{
#if defined(__GNUC__)
    int32_t ps = kv->p.page_size, n = q->tokens.n;
    if (ps < 2 || kv->p.no_prefix_cache || kv_ps_mod(kv, n + 1) != 0 || q->pages.n < 1)
        return;
    int32_t k = kv_ps_div(kv, n), p = k < q->pages.n ? kv_page_at(q, k) : -1;
    if (p < 0)
        return;
    const page_pool *pp = &kv->pool;
    const int32_t *row = pp->tokens + (size_t)p * (size_t)ps;
    __builtin_prefetch(pp->hashed + p, 1, 1);
    __builtin_prefetch(pp->hash + p, 1, 1);
    __builtin_prefetch(pp->parent_hash + p, 1, 1);
    __builtin_prefetch(row, 1, 1);
    __builtin_prefetch(row + ps - 1, 1, 1);
    if (q->tokens.v) { /* the page's ids in the array (the stage goes there first) */
        __builtin_prefetch(q->tokens.v + (size_t)k * (size_t)ps, 1, 1);
        __builtin_prefetch(q->tokens.v + (size_t)k * (size_t)ps + ps - 1, 1, 1);
    }
    int32_t pv = k > 0 ? kv_page_at(q, k - 1) : -1;
    if (pv >= 0) {
        __builtin_prefetch(pp->hashed + pv, 0, 1);
        __builtin_prefetch(pp->hash + pv, 0, 1);
    }
#else
    (void)kv, (void)q;
#endif
}

#endif

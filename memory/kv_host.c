/* llmem memory/: the KV cache's side of the host tier (memory/host_tier.h,
 * issue 13 item 3): evicted published pages spill into host memory, and
 * come back from it on a prefix hit. Split out of kv_cache.c. */
#include <stdlib.h>
#include <string.h>

#include "memory/kv_internal.h"

/* Copies evicted page p (published until now, so its K/V is written and its
 * chain key valid) into the host tier, unless the tier holds it already.
 * The downloads are queued (llmem_buffer_download_async: asynchronous on
 * CUDA into pinned memory, ordered before the ops that will overwrite the
 * page; synchronous elsewhere); nothing on the host reads the entry, only
 * later uploads on the same queue. */
void kv_host_spill(kv_cache *kv, int32_t p)
{
    page_pool *pp = &kv->pool;
    host_tier *ht = kv->host;
    int32_t ps = kv->p.page_size;
    const int32_t *tok = pp->tokens + (size_t)p * (size_t)ps;
    if (kv->page_shift[p] || host_tier_lookup(ht, kv, pp->hash[p], pp->parent_hash[p], tok, ps) >= 0)
        return;
    int32_t e = host_tier_insert(ht, kv, pp->hash[p], pp->parent_hash[p], tok, ps,
                                 2 * (size_t)kv->p.n_layers * kv->page_bytes);
    if (e < 0)
        return;
    uint8_t *d = ht->e[e].data;
    for (int32_t il = 0; il < kv->p.n_layers; il++) {
        size_t off = (size_t)p * kv->page_bytes;
        if (llmem_buffer_download_async(kv->k[il], off, d, kv->page_bytes) != LLMEM_OK ||
            llmem_buffer_download_async(kv->v[il], off, d + kv->page_bytes, kv->page_bytes) !=
                LLMEM_OK) {
            host_tier_remove(ht, e);
            return;
        }
        d += 2 * kv->page_bytes;
    }
}

/* Host-tier entries named in pages[0, n) (KV_HOST_MARK) go back on the LRU. */
void kv_host_unpin(kv_cache *kv, const int32_t *pages, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t e = -2 - pages[i];
        if (pages[i] < -1)
            host_tier_unpin(kv->host, e);
    }
}

/* Replaces every host-tier mark in pages[0, n) by a device page holding the
 * entry's K/V (published, one reference per mark; a mark listed twice gets
 * the same page), freeing each entry as soon as its page is written, so
 * that the pages the copies evict can spill into its place: a page lives on
 * the device or on the host. The marked entries must be pinned
 * (host_tier_pin) so that those spills cannot evict them; the caller has
 * checked that enough pages are free or evictable. The uploads are queued
 * (llmem_buffer_upload_async; the entry's block, now a spare of the tier,
 * is only reused by copies queued after them).
 * Returns LLMEM_OK; LLMEM_E_NO_MEMORY; LLMEM_E_NO_SPACE (no page); a backend
 * status. On error, marks not yet replaced stay (pinned, for kv_host_unpin)
 * and repeats of replaced ones become -1. */
llmem_status kv_host_restore(kv_cache *kv, int32_t *pages, int32_t n)
{
    host_tier *ht = kv->host;
    page_pool *pp = &kv->pool;
    int32_t ps = kv->p.page_size, n_marks = 0;
    for (int32_t i = 0; i < n; i++)
        n_marks += pages[i] < -1;
    if (n_marks == 0)
        return LLMEM_OK;
    int32_t *first = malloc((size_t)n * sizeof *first); /* first index of each mark */
    if (!first)
        return LLMEM_E_NO_MEMORY;
    for (int32_t i = 0; i < n; i++) { /* restored holds first indices meanwhile */
        int32_t e = -2 - pages[i];
        first[i] = i;
        if (pages[i] >= -1)
            continue;
        if (ht->e[e].restored >= 0)
            first[i] = ht->e[e].restored;
        else
            ht->e[e].restored = i;
    }
    llmem_status st = LLMEM_OK;
    for (int32_t i = 0; i < n; i++) {
        if (pages[i] >= -1)
            continue;
        int32_t e = -2 - pages[i];
        ht->e[e].restored = -1;
        if (first[i] != i) {
            if (st == LLMEM_OK) {
                pages[i] = pages[first[i]];
                page_pool_ref(pp, pages[i]);
            } else if (pages[first[i]] >= -1) {
                pages[i] = -1; /* its entry is gone, its page unreferenced by it */
            }
            continue;
        }
        if (st != LLMEM_OK)
            continue;
        int32_t p = kv_alloc_page(kv);
        if (p < 0) {
            st = LLMEM_E_NO_SPACE;
            continue;
        }
        const host_entry *x = &ht->e[e];
        const uint8_t *d = x->data;
        for (int32_t il = 0; il < kv->p.n_layers && st == LLMEM_OK; il++) {
            size_t off = (size_t)p * kv->page_bytes;
            st = llmem_buffer_upload_async(kv->k[il], off, d, kv->page_bytes);
            if (st == LLMEM_OK)
                st = llmem_buffer_upload_async(kv->v[il], off, d + kv->page_bytes,
                                               kv->page_bytes);
            d += 2 * kv->page_bytes;
        }
        if (st != LLMEM_OK) {
            kv_unref_page(kv, p);
            continue;
        }
        pp->hash[p] = x->hash;
        pp->parent_hash[p] = x->parent_hash;
        memcpy(pp->tokens + (size_t)p * (size_t)ps, x->tokens, (size_t)ps * sizeof *pp->tokens);
        pp->hashed[p] = 1;
        page_pool_publish(pp, p);
        host_tier_remove(ht, e);
        kv->host_restores++;
        pages[i] = p;
    }
    free(first);
    return st;
}

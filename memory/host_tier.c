/* llmem memory/: host tier of the KV prefix cache — entries keyed by the
 * content chain of page_pool.c, LRU eviction within a byte budget (SGLang
 * HiCache keeps evicted radix-tree nodes in host memory the same way). */
#include <stdlib.h>
#include <string.h>

#include "memory/host_tier.h"
#include "memory/internal.h"

bool host_tier_init(host_tier *ht, size_t budget, size_t entry_bytes, int32_t page_size)
{
    memset(ht, 0, sizeof *ht);
    ht->page_size = page_size;
    ht->entry_bytes = entry_bytes;
    ht->lru_head = ht->lru_tail = -1;
    size_t cap = entry_bytes ? budget / entry_bytes : 0;
    if (cap > (1u << 26))
        cap = 1u << 26;
    if (cap == 0)
        return true;
    ht->cap = (int32_t)cap;
    int32_t nb = 16;
    while (nb < ht->cap)
        nb <<= 1;
    ht->n_buckets = nb;
    ht->data = malloc(cap * entry_bytes);
    ht->hash = calloc(cap, sizeof *ht->hash);
    ht->parent_hash = calloc(cap, sizeof *ht->parent_hash);
    ht->tokens = calloc(cap * (size_t)page_size, sizeof *ht->tokens);
    ht->state = calloc(cap, 1);
    ht->lru_prev = malloc(cap * sizeof *ht->lru_prev);
    ht->lru_next = malloc(cap * sizeof *ht->lru_next);
    ht->free_stack = malloc(cap * sizeof *ht->free_stack);
    ht->bucket = malloc((size_t)nb * sizeof *ht->bucket);
    ht->bucket_next = malloc(cap * sizeof *ht->bucket_next);
    ht->restored = malloc(cap * sizeof *ht->restored);
    if (!ht->data || !ht->hash || !ht->parent_hash || !ht->tokens || !ht->state ||
        !ht->lru_prev || !ht->lru_next || !ht->free_stack || !ht->bucket || !ht->bucket_next ||
        !ht->restored) {
        host_tier_finish(ht);
        return false;
    }
    host_tier_reset(ht);
    return true;
}

void host_tier_finish(host_tier *ht)
{
    free(ht->data);
    free(ht->hash);
    free(ht->parent_hash);
    free(ht->tokens);
    free(ht->state);
    free(ht->lru_prev);
    free(ht->lru_next);
    free(ht->free_stack);
    free(ht->bucket);
    free(ht->bucket_next);
    free(ht->restored);
    memset(ht, 0, sizeof *ht);
}

void host_tier_reset(host_tier *ht)
{
    for (int32_t e = 0; e < ht->cap; e++) {
        ht->free_stack[e] = ht->cap - 1 - e;
        ht->state[e] = 0;
        ht->lru_prev[e] = ht->lru_next[e] = -1;
        ht->bucket_next[e] = -1;
        ht->restored[e] = -1;
    }
    for (int32_t b = 0; b < ht->n_buckets; b++)
        ht->bucket[b] = -1;
    ht->n_free = ht->cap;
    ht->lru_head = ht->lru_tail = -1;
}

int32_t host_tier_count(const host_tier *ht)
{
    return ht->cap - ht->n_free;
}

static void lru_unlink(host_tier *ht, int32_t e)
{
    int32_t a = ht->lru_prev[e], b = ht->lru_next[e];
    if (a >= 0)
        ht->lru_next[a] = b;
    else
        ht->lru_head = b;
    if (b >= 0)
        ht->lru_prev[b] = a;
    else
        ht->lru_tail = a;
    ht->lru_prev[e] = ht->lru_next[e] = -1;
}

static void lru_push(host_tier *ht, int32_t e)
{
    ht->lru_prev[e] = ht->lru_tail;
    ht->lru_next[e] = -1;
    if (ht->lru_tail >= 0)
        ht->lru_next[ht->lru_tail] = e;
    else
        ht->lru_head = e;
    ht->lru_tail = e;
}

int32_t host_tier_lookup(const host_tier *ht, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens)
{
    if (ht->cap == 0)
        return -1;
    size_t row = (size_t)ht->page_size * sizeof *tokens;
    for (int32_t e = ht->bucket[hash & (uint64_t)(ht->n_buckets - 1)]; e >= 0;
         e = ht->bucket_next[e])
        if (ht->hash[e] == hash && ht->parent_hash[e] == parent_hash &&
            memcmp(ht->tokens + (size_t)e * (size_t)ht->page_size, tokens, row) == 0)
            return e;
    return -1;
}

void host_tier_remove(host_tier *ht, int32_t e)
{
    if (ht->state[e] == 0)
        return;
    if (ht->state[e] == 1)
        lru_unlink(ht, e);
    int32_t *link = &ht->bucket[ht->hash[e] & (uint64_t)(ht->n_buckets - 1)];
    while (*link >= 0 && *link != e)
        link = &ht->bucket_next[*link];
    if (*link == e)
        *link = ht->bucket_next[e];
    ht->bucket_next[e] = -1;
    ht->state[e] = 0;
    ht->restored[e] = -1;
    ht->free_stack[ht->n_free++] = e;
}

int32_t host_tier_insert(host_tier *ht, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens)
{
    if (ht->cap == 0)
        return -1;
    if (ht->n_free == 0) {
        if (ht->lru_head < 0)
            return -1;
        host_tier_remove(ht, ht->lru_head);
        ht->n_evictions++;
    }
    int32_t e = ht->free_stack[--ht->n_free];
    ht->hash[e] = hash;
    ht->parent_hash[e] = parent_hash;
    memcpy(ht->tokens + (size_t)e * (size_t)ht->page_size, tokens,
           (size_t)ht->page_size * sizeof *tokens);
    int32_t b = (int32_t)(hash & (uint64_t)(ht->n_buckets - 1));
    ht->bucket_next[e] = ht->bucket[b];
    ht->bucket[b] = e;
    ht->state[e] = 1;
    ht->restored[e] = -1;
    lru_push(ht, e);
    return e;
}

void host_tier_pin(host_tier *ht, int32_t e)
{
    if (ht->state[e] != 1)
        return;
    lru_unlink(ht, e);
    ht->state[e] = 2;
}

void host_tier_unpin(host_tier *ht, int32_t e)
{
    if (ht->state[e] != 2)
        return;
    ht->state[e] = 1;
    ht->restored[e] = -1;
    lru_push(ht, e);
}

bool host_tier_check(const host_tier *ht, char *err, size_t err_len)
{
    int32_t n_live = 0, n_lru = 0, n_index = 0;
    if (ht->cap == 0)
        return true;
    for (int32_t e = 0; e < ht->cap; e++) {
        if (ht->state[e] > 2 || ht->state[e] == 2) {
            llmem_errf(err, err_len, "host tier entry %d in state %d", e, ht->state[e]);
            return false;
        }
        n_live += ht->state[e] != 0;
    }
    if (n_live + ht->n_free != ht->cap) {
        llmem_errf(err, err_len, "host tier: %d entries + %d free != %d", n_live, ht->n_free,
                   ht->cap);
        return false;
    }
    for (int32_t i = 0; i < ht->n_free; i++)
        if (ht->state[ht->free_stack[i]] != 0) {
            llmem_errf(err, err_len, "host tier: free entry %d is in use", ht->free_stack[i]);
            return false;
        }
    for (int32_t e = ht->lru_head, prev = -1; e >= 0; prev = e, e = ht->lru_next[e])
        if (ht->state[e] != 1 || ht->lru_prev[e] != prev || ++n_lru > ht->cap) {
            llmem_errf(err, err_len, "host tier: LRU list corrupt at entry %d", e);
            return false;
        }
    for (int32_t bk = 0; bk < ht->n_buckets; bk++)
        for (int32_t e = ht->bucket[bk]; e >= 0; e = ht->bucket_next[e])
            if (ht->state[e] == 0 || (int32_t)(ht->hash[e] & (uint64_t)(ht->n_buckets - 1)) != bk ||
                ++n_index > ht->cap) {
                llmem_errf(err, err_len, "host tier: index corrupt at entry %d", e);
                return false;
            }
    if (n_index != n_live || n_lru != n_live) {
        llmem_errf(err, err_len, "host tier: %d entries, %d indexed, %d on the LRU", n_live,
                   n_index, n_lru);
        return false;
    }
    return true;
}

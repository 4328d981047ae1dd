/* llmem memory/: host tier of the prefix cache — entries of any owner keyed
 * by a content chain, one LRU and one byte budget for all of them (SGLang
 * HiCache keeps evicted radix-tree nodes, KV and Mamba state alike, in host
 * memory the same way). */
#include <stdlib.h>
#include <string.h>

#include "memory/host_tier.h"
#include "memory/internal.h"

static uint64_t bucket_of(const host_tier *ht, const void *owner, uint64_t hash)
{
    uint64_t k = hash ^ ((uint64_t)(uintptr_t)owner * 0x9e3779b97f4a7c15ull);
    return (k ^ (k >> 29)) & (uint64_t)(ht->n_buckets - 1);
}

static void *block_alloc(host_tier *ht, size_t bytes)
{
    void *p = NULL;
    if (llmem_backend_host_alloc(ht->be, bytes, &p) != LLMEM_OK)
        return NULL;
    return p;
}

/* Waits for copies queued on the block first (llmem_backend_host_free). */
static void block_free(host_tier *ht, void *p)
{
    llmem_backend_host_free(ht->be, p);
}

host_tier *host_tier_create(size_t budget, llmem_backend *be)
{
    host_tier *ht = calloc(1, sizeof *ht);
    if (!ht)
        return NULL;
    ht->refs = 1;
    ht->budget = budget;
    ht->be = be;
    ht->lru_head = ht->lru_tail = -1;
    ht->n_buckets = 64;
    ht->bucket = malloc((size_t)ht->n_buckets * sizeof *ht->bucket);
    if (!ht->bucket) {
        free(ht);
        return NULL;
    }
    for (int32_t b = 0; b < ht->n_buckets; b++)
        ht->bucket[b] = -1;
    return ht;
}

void host_tier_ref(host_tier *ht)
{
    ht->refs++;
}

void host_tier_unref(host_tier *ht)
{
    if (!ht || --ht->refs > 0)
        return;
    for (int32_t e = 0; e < ht->cap; e++) {
        if (ht->e[e].state)
            block_free(ht, ht->e[e].data);
        free(ht->e[e].tokens);
    }
    for (int32_t i = 0; i < ht->n_spare; i++)
        block_free(ht, ht->spare[i].p);
    free(ht->e);
    free(ht->free_ids);
    free(ht->bucket);
    free(ht->spare);
    free(ht->lens);
    free(ht->own);
    free(ht);
}

/* --- LRU, index, lengths -------------------------------------------------------- */

static void lru_unlink(host_tier *ht, int32_t e)
{
    host_entry *x = &ht->e[e];
    if (x->lru_prev >= 0)
        ht->e[x->lru_prev].lru_next = x->lru_next;
    else
        ht->lru_head = x->lru_next;
    if (x->lru_next >= 0)
        ht->e[x->lru_next].lru_prev = x->lru_prev;
    else
        ht->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = -1;
}

static void lru_push(host_tier *ht, int32_t e)
{
    host_entry *x = &ht->e[e];
    x->lru_prev = ht->lru_tail;
    x->lru_next = -1;
    if (ht->lru_tail >= 0)
        ht->e[ht->lru_tail].lru_next = e;
    else
        ht->lru_head = e;
    ht->lru_tail = e;
}

static void index_add(host_tier *ht, int32_t e)
{
    uint64_t b = bucket_of(ht, ht->e[e].owner, ht->e[e].hash);
    ht->e[e].bucket_next = ht->bucket[b];
    ht->bucket[b] = e;
}

/* Doubles the bucket array when the index gets dense; false: out of memory
 * (the old index stays). */
static bool index_grow(host_tier *ht)
{
    if (ht->n_live < ht->n_buckets || ht->n_buckets > (1 << 28))
        return true;
    int32_t *nb = malloc((size_t)ht->n_buckets * 2 * sizeof *nb);
    if (!nb)
        return false;
    free(ht->bucket);
    ht->bucket = nb;
    ht->n_buckets *= 2;
    for (int32_t b = 0; b < ht->n_buckets; b++)
        ht->bucket[b] = -1;
    for (int32_t e = 0; e < ht->cap; e++)
        if (ht->e[e].state)
            index_add(ht, e);
    return true;
}

static host_own *own_find(const host_tier *ht, const void *owner)
{
    for (int32_t i = 0; ht && i < ht->n_own; i++)
        if (ht->own[i].owner == owner)
            return &ht->own[i];
    return NULL;
}

static host_own *own_get(host_tier *ht, const void *owner)
{
    host_own *o = own_find(ht, owner);
    if (o)
        return o;
    if (ht->n_own == ht->cap_own) {
        int32_t cap = ht->cap_own ? 2 * ht->cap_own : 4;
        host_own *n = realloc(ht->own, (size_t)cap * sizeof *n);
        if (!n)
            return NULL;
        ht->own = n;
        ht->cap_own = cap;
    }
    ht->own[ht->n_own] = (host_own){.owner = owner};
    return &ht->own[ht->n_own++];
}

static host_len *len_find(const host_tier *ht, const void *owner, int32_t len)
{
    for (int32_t i = 0; i < ht->n_lens; i++)
        if (ht->lens[i].owner == owner && ht->lens[i].len == len)
            return &ht->lens[i];
    return NULL;
}

static bool len_add(host_tier *ht, const void *owner, int32_t len)
{
    host_len *l = len_find(ht, owner, len);
    if (l) {
        l->count++;
        return true;
    }
    if (ht->n_lens == ht->cap_lens) {
        int32_t cap = ht->cap_lens ? 2 * ht->cap_lens : 8;
        host_len *n = realloc(ht->lens, (size_t)cap * sizeof *n);
        if (!n)
            return false;
        ht->lens = n;
        ht->cap_lens = cap;
    }
    ht->lens[ht->n_lens++] = (host_len){owner, len, 1};
    return true;
}

static void len_drop(host_tier *ht, const void *owner, int32_t len)
{
    host_len *l = len_find(ht, owner, len);
    if (l && --l->count == 0)
        *l = ht->lens[--ht->n_lens];
}

int32_t host_tier_next_len(const host_tier *ht, const void *owner, int32_t below)
{
    int32_t best = -1;
    for (int32_t i = 0; ht && i < ht->n_lens; i++)
        if (ht->lens[i].owner == owner && ht->lens[i].len < below && ht->lens[i].len > best)
            best = ht->lens[i].len;
    return best;
}

int32_t host_tier_lookup(const host_tier *ht, const void *owner, uint64_t hash,
                         uint64_t parent_hash, const int32_t *tokens, int32_t n_tokens)
{
    if (!ht || ht->n_live == 0)
        return -1;
    for (int32_t e = ht->bucket[bucket_of(ht, owner, hash)]; e >= 0; e = ht->e[e].bucket_next) {
        const host_entry *x = &ht->e[e];
        if (x->hash == hash && x->owner == owner && x->parent_hash == parent_hash &&
            x->n_tokens == n_tokens &&
            memcmp(x->tokens, tokens, (size_t)n_tokens * sizeof *tokens) == 0)
            return e;
    }
    return -1;
}

/* --- insert and remove ---------------------------------------------------------- */

/* Frees spares of other sizes than `keep`; true when any was freed. */
static bool drop_spares(host_tier *ht, size_t keep)
{
    bool any = false;
    for (int32_t i = 0; i < ht->n_spare;)
        if (ht->spare[i].bytes != keep) {
            block_free(ht, ht->spare[i].p);
            ht->used -= ht->spare[i].bytes;
            ht->spare[i] = ht->spare[--ht->n_spare];
            any = true;
        } else {
            i++;
        }
    return any;
}

/* A block of `bytes` within the budget: a spare of that size, a new one,
 * or room made by dropping spares of other sizes and evicting LRU entries. */
static uint8_t *take_block(host_tier *ht, size_t bytes)
{
    for (;;) {
        for (int32_t i = 0; i < ht->n_spare; i++)
            if (ht->spare[i].bytes == bytes) {
                uint8_t *p = ht->spare[i].p;
                ht->spare[i] = ht->spare[--ht->n_spare];
                return p; /* stays counted in used */
            }
        if (ht->used + bytes <= ht->budget) {
            uint8_t *p = block_alloc(ht, bytes);
            if (p)
                ht->used += bytes;
            return p;
        }
        if (drop_spares(ht, bytes))
            continue;
        if (ht->lru_head < 0)
            return NULL;
        host_tier_remove(ht, ht->lru_head); /* its block becomes a spare */
        ht->n_evictions++;
    }
}

static int32_t take_id(host_tier *ht)
{
    if (ht->n_free_ids == 0) {
        int32_t cap = ht->cap ? 2 * ht->cap : 16;
        host_entry *e = realloc(ht->e, (size_t)cap * sizeof *e);
        if (!e)
            return -1;
        ht->e = e;
        int32_t *f = realloc(ht->free_ids, (size_t)cap * sizeof *f);
        if (!f)
            return -1;
        ht->free_ids = f;
        for (int32_t i = cap - 1; i >= ht->cap; i--) {
            ht->e[i] = (host_entry){.lru_prev = -1, .lru_next = -1, .bucket_next = -1,
                                    .restored = -1};
            ht->free_ids[ht->n_free_ids++] = i;
        }
        ht->cap = cap;
    }
    return ht->free_ids[--ht->n_free_ids];
}

int32_t host_tier_insert(host_tier *ht, const void *owner, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens, int32_t n_tokens, size_t bytes)
{
    if (!ht || bytes == 0 || bytes > ht->budget || n_tokens <= 0)
        return -1;
    host_own *own = own_get(ht, owner);
    if (!own || !index_grow(ht) || !len_add(ht, owner, n_tokens))
        return -1;
    int32_t e = take_id(ht);
    host_entry *x = e >= 0 ? &ht->e[e] : NULL;
    if (x && x->n_tokens < n_tokens) { /* a free entry keeps its token array's size */
        int32_t *t = realloc(x->tokens, (size_t)n_tokens * sizeof *t);
        if (t) {
            x->tokens = t;
            x->n_tokens = n_tokens;
        } else {
            x = NULL;
        }
    }
    uint8_t *data = x ? take_block(ht, bytes) : NULL;
    if (!data) {
        if (e >= 0)
            ht->free_ids[ht->n_free_ids++] = e;
        len_drop(ht, owner, n_tokens);
        return -1;
    }
    x->owner = owner;
    x->hash = hash;
    x->parent_hash = parent_hash;
    x->n_tokens = n_tokens;
    memcpy(x->tokens, tokens, (size_t)n_tokens * sizeof *tokens);
    x->data = data;
    x->bytes = bytes;
    x->state = 1;
    x->restored = -1;
    index_add(ht, e);
    lru_push(ht, e);
    ht->n_live++;
    own = own_find(ht, owner); /* take_block's evictions never add owners */
    own->n++;
    own->bytes += (int64_t)bytes;
    return e;
}

void host_tier_remove(host_tier *ht, int32_t e)
{
    host_entry *x = &ht->e[e];
    if (x->state == 0)
        return;
    if (x->state == 1)
        lru_unlink(ht, e);
    int32_t *link = &ht->bucket[bucket_of(ht, x->owner, x->hash)];
    while (*link >= 0 && *link != e)
        link = &ht->e[*link].bucket_next;
    if (*link == e)
        *link = x->bucket_next;
    x->bucket_next = -1;
    len_drop(ht, x->owner, x->n_tokens);
    host_own *own = own_find(ht, x->owner);
    own->n--;
    own->bytes -= (int64_t)x->bytes;
    own->pinned -= x->state == 2;
    /* keep the block for the next insert of its size; if the spare list
     * cannot grow, free it */
    if (ht->n_spare == ht->cap_spare) {
        int32_t cap = ht->cap_spare ? 2 * ht->cap_spare : 8;
        host_block *s = realloc(ht->spare, (size_t)cap * sizeof *s);
        if (s) {
            ht->spare = s;
            ht->cap_spare = cap;
        }
    }
    if (ht->n_spare < ht->cap_spare) {
        ht->spare[ht->n_spare++] = (host_block){x->data, x->bytes};
    } else {
        block_free(ht, x->data);
        ht->used -= x->bytes;
    }
    x->data = NULL;
    x->bytes = 0;
    x->owner = NULL;
    x->state = 0;
    x->restored = -1;
    ht->free_ids[ht->n_free_ids++] = e;
    ht->n_live--;
}

void host_tier_pin(host_tier *ht, int32_t e)
{
    if (ht->e[e].state != 1)
        return;
    lru_unlink(ht, e);
    ht->e[e].state = 2;
    own_find(ht, ht->e[e].owner)->pinned++;
}

void host_tier_unpin(host_tier *ht, int32_t e)
{
    if (ht->e[e].state != 2)
        return;
    ht->e[e].state = 1;
    ht->e[e].restored = -1;
    lru_push(ht, e);
    own_find(ht, ht->e[e].owner)->pinned--;
}

void host_tier_drop_owner(host_tier *ht, const void *owner)
{
    for (int32_t e = 0; ht && e < ht->cap; e++)
        if (ht->e[e].state && ht->e[e].owner == owner)
            host_tier_remove(ht, e);
}

void host_tier_usage(const host_tier *ht, const void *owner, int64_t *n, int64_t *bytes,
                     int32_t *n_pinned)
{
    const host_own *o = own_find(ht, owner);
    if (n)
        *n = o ? o->n : 0;
    if (bytes)
        *bytes = o ? o->bytes : 0;
    if (n_pinned)
        *n_pinned = o ? o->pinned : 0;
}

bool host_tier_check(const host_tier *ht, char *err, size_t err_len)
{
    if (!ht)
        return true;
    int32_t n_live = 0, n_lru = 0, n_index = 0, n_cached = 0;
    size_t bytes = 0;
    for (int32_t e = 0; e < ht->cap; e++) {
        const host_entry *x = &ht->e[e];
        if (x->state > 2 || (x->state != 0) != (x->owner != NULL) ||
            (x->state && (!x->data || !x->bytes))) {
            llmem_errf(err, err_len, "host tier entry %d in state %d", e, x->state);
            return false;
        }
        n_live += x->state != 0;
        n_cached += x->state == 1;
        bytes += x->bytes;
        const host_len *l = x->state ? len_find(ht, x->owner, x->n_tokens) : NULL;
        if (x->state && (!l || l->count <= 0)) {
            llmem_errf(err, err_len, "host tier: entry %d's length %d is not listed", e,
                       x->n_tokens);
            return false;
        }
    }
    for (int32_t i = 0; i < ht->n_spare; i++)
        bytes += ht->spare[i].bytes;
    for (int32_t i = 0; i < ht->n_own; i++) { /* the per-owner totals, recounted */
        int64_t cn = 0, cb = 0;
        int32_t cp = 0;
        for (int32_t e = 0; e < ht->cap; e++)
            if (ht->e[e].state && ht->e[e].owner == ht->own[i].owner) {
                cn++;
                cb += (int64_t)ht->e[e].bytes;
                cp += ht->e[e].state == 2;
            }
        if (cn != ht->own[i].n || cb != ht->own[i].bytes || cp != ht->own[i].pinned) {
            llmem_errf(err, err_len,
                       "host tier: owner %d holds %lld entries, %lld bytes, %d pinned; "
                       "counted %lld, %lld, %d",
                       i, (long long)cn, (long long)cb, cp, (long long)ht->own[i].n,
                       (long long)ht->own[i].bytes, ht->own[i].pinned);
            return false;
        }
    }
    int64_t listed = 0;
    for (int32_t i = 0; i < ht->n_lens; i++)
        listed += ht->lens[i].count;
    if (n_live != ht->n_live || n_live + ht->n_free_ids != ht->cap || listed != n_live) {
        llmem_errf(err, err_len, "host tier: %d entries (%d counted, %lld by length) + %d free != %d",
                   n_live, ht->n_live, (long long)listed, ht->n_free_ids, ht->cap);
        return false;
    }
    if (bytes != ht->used || ht->used > ht->budget) {
        llmem_errf(err, err_len, "host tier: %zu bytes held, %zu counted, budget %zu", bytes,
                   ht->used, ht->budget);
        return false;
    }
    for (int32_t i = 0; i < ht->n_free_ids; i++)
        if (ht->e[ht->free_ids[i]].state != 0) {
            llmem_errf(err, err_len, "host tier: free entry %d is in use", ht->free_ids[i]);
            return false;
        }
    for (int32_t e = ht->lru_head, prev = -1; e >= 0; prev = e, e = ht->e[e].lru_next)
        if (ht->e[e].state != 1 || ht->e[e].lru_prev != prev || ++n_lru > ht->cap) {
            llmem_errf(err, err_len, "host tier: LRU list corrupt at entry %d", e);
            return false;
        }
    for (int32_t bk = 0; bk < ht->n_buckets; bk++)
        for (int32_t e = ht->bucket[bk]; e >= 0; e = ht->e[e].bucket_next)
            if (ht->e[e].state == 0 ||
                (int32_t)bucket_of(ht, ht->e[e].owner, ht->e[e].hash) != bk ||
                ++n_index > ht->cap) {
                llmem_errf(err, err_len, "host tier: index corrupt at entry %d", e);
                return false;
            }
    if (n_index != n_live || n_lru != n_cached) {
        llmem_errf(err, err_len, "host tier: %d entries, %d indexed, %d on the LRU (%d cached)",
                   n_live, n_index, n_lru, n_cached);
        return false;
    }
    return true;
}

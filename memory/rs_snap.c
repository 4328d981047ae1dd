/* llmem memory/: recurrent snapshots for prefix reuse (issue 13) — the
 * state after a token prefix, copied at commit into a snapshot slot (after
 * the forward pass wrote it: publish after write, DESIGN.md contract 4),
 * found by verified token ids, read in place by a hit (the first ubatch of
 * the new sequence takes it as its source slot; no copy), pinned by the
 * plans reading it and evicted least recently used. SGLang's Mamba radix
 * cache keeps one such state per tree node (sglang#31648); vLLM's hybrid
 * prefix caching keeps one per attention block. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "memory/prefix_budget.h"
#include "memory/rs_internal.h"

/* --- the snapshot key: a chain hash over blocks of tokens ----------------------
 * Blocks of RS_HASH_BLOCK tokens are hashed with XXH3-64, each seeded by the
 * previous block's hash (0 for the first); a length that ends inside a block
 * hashes the partial block seeded the same way. A sequence keeps its block
 * hashes (rs_seq.blk), so publishing a snapshot hashes only the tokens added
 * since its last publish plus at most one partial block: O(new tokens), not
 * O(length) (issue 13). The same blocked scheme as the KV cache's page chain
 * (page_pool.c), with a block size of its own: snapshot lengths need not be
 * page boundaries, and a recurrent memory has no pages. */

static uint64_t block_hash(const int32_t *t, int32_t n, uint64_t seed)
{
    return XXH3_64bits_withSeed(t, (size_t)n * sizeof *t, seed);
}

/* The chain hash of t[0, len) given blk[b] = chain hash of t[0, (b + 1) * B)
 * for b < len / B. */
static uint64_t chain_tail(const uint64_t *blk, const int32_t *t, int32_t len)
{
    int32_t nb = len / RS_HASH_BLOCK, r = len % RS_HASH_BLOCK;
    uint64_t prev = nb > 0 ? blk[nb - 1] : 0;
    return r > 0 ? block_hash(t + (size_t)nb * RS_HASH_BLOCK, r, prev) : prev;
}

/* The chain hash of t[0, len) from scratch (O(len), no storage). */
static uint64_t chain_hash(const int32_t *t, int32_t len)
{
    uint64_t h = 0;
    int32_t b = 0;
    for (; b + RS_HASH_BLOCK <= len; b += RS_HASH_BLOCK)
        h = block_hash(t + b, RS_HASH_BLOCK, h);
    return b < len ? block_hash(t + b, len - b, h) : h;
}

void snap_seq_cut(recurrent *rs, const rs_seq *seq, int32_t k)
{
    rs_chain *s = &rs->chain[seq - rs->seqs];
    int32_t nb = k / RS_HASH_BLOCK;
    if (nb < s->n_blk)
        s->n_blk = nb;
    if (s->neg1 > s->n_blk * RS_HASH_BLOCK)
        s->neg1 = 0;
}

/* Extends s's block chain to the first nb blocks of tokens (>= nb * B of
 * them). */
static bool seq_chain_extend(rs_chain *s, const int32_t *tokens, int32_t nb)
{
    if (nb <= s->n_blk)
        return true;
    if (nb > s->cap_blk) {
        int32_t cap = s->cap_blk > 0 ? s->cap_blk : 8;
        while (cap < nb)
            cap = cap > INT32_MAX / 2 ? nb : 2 * cap;
        uint64_t *b = realloc(s->blk, (size_t)cap * sizeof *b);
        if (!b)
            return false;
        s->blk = b;
        s->cap_blk = cap;
    }
    for (int32_t b = s->n_blk; b < nb; b++) {
        const int32_t *t = tokens + (size_t)b * RS_HASH_BLOCK;
        for (int32_t j = 0; j < RS_HASH_BLOCK && s->neg1 == 0; j++)
            if (t[j] < 0)
                s->neg1 = b * RS_HASH_BLOCK + j + 1;
        s->blk[b] = block_hash(t, RS_HASH_BLOCK, b > 0 ? s->blk[b - 1] : 0);
    }
    s->n_blk = nb;
    return true;
}

/* Blocks of a query's chain kept on the stack by a lookup; longer queries
 * hash lengths beyond them from scratch. */
#define FIND_BLOCKS 512

/* A lookup's token prefix and the block hashes computed of it so far. */
typedef struct query {
    const int32_t *t;
    int32_t n_blk;
    uint64_t blk[FIND_BLOCKS];
} query;

/* The chain hash of q->t[0, len), extending q's blocks as far as needed
 * (each block of the query is hashed once per lookup). */
static uint64_t query_hash(query *q, int32_t len)
{
    int32_t nb = len / RS_HASH_BLOCK;
    if (nb > FIND_BLOCKS)
        return chain_hash(q->t, len);
    for (; q->n_blk < nb; q->n_blk++)
        q->blk[q->n_blk] = block_hash(q->t + (size_t)q->n_blk * RS_HASH_BLOCK, RS_HASH_BLOCK,
                                      q->n_blk > 0 ? q->blk[q->n_blk - 1] : 0);
    return chain_tail(q->blk, q->t, len);
}

/* The longest device snapshot of q->t[0, len), len <= m; -1 when none.
 * O(snapshots) hash comparisons per distinct candidate length plus one
 * verification. */
static int32_t find_device(const recurrent *rs, query *qr, int32_t m)
{
    int32_t hashed_len = -1;
    for (;;) {
        /* the longest candidate length below the last one tried */
        int32_t len = -1;
        for (int32_t i = 0; i < rs->n_snap; i++) {
            int32_t l = rs->snap[i].len;
            if (l > 0 && l <= m && (hashed_len < 0 || l < hashed_len) && l > len)
                len = l;
        }
        if (len < 0)
            return -1;
        uint64_t h = query_hash(qr, len);
        hashed_len = len;
        for (int32_t i = 0; i < rs->n_snap; i++) {
            const rs_snap *q = &rs->snap[i];
            if (q->len == len && q->hash == h &&
                memcmp(q->tokens.v, qr->t, (size_t)len * sizeof *qr->t) == 0)
                return i;
        }
    }
}

static int cmp_desc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x < y) - (x > y);
}

/* Candidate lengths a host lookup collects at once (more: one at a time). */
#define HOST_LENS 256

/* The host-tier entry of the longest snapshot of q->t[0, len) with
 * above < len <= m; -1 when none. The owner's distinct lengths in range
 * are collected and sorted once: O(L log L) for L distinct lengths, plus
 * one hash lookup per length tried. */
static int32_t find_host(const recurrent *rs, query *qr, int32_t m, int32_t above)
{
    const host_tier *ht = rs->host;
    int32_t lens[HOST_LENS], n = 0;
    bool all = true;
    for (int32_t i = 0; i < ht->n_lens; i++) {
        const host_len *l = &ht->lens[i];
        if (l->owner != rs || l->len <= above || l->len > m)
            continue;
        if (n == HOST_LENS) {
            all = false;
            break;
        }
        lens[n++] = l->len;
    }
    if (all) {
        qsort(lens, (size_t)n, sizeof *lens, cmp_desc);
        for (int32_t k = 0; k < n; k++) {
            int32_t e = host_tier_lookup(ht, rs, query_hash(qr, lens[k]), 0, qr->t, lens[k]);
            if (e >= 0)
                return e;
        }
        return -1;
    }
    for (int32_t len = host_tier_next_len(ht, rs, m + 1); len > above;
         len = host_tier_next_len(ht, rs, len)) {
        int32_t e = host_tier_lookup(ht, rs, query_hash(qr, len), 0, qr->t, len);
        if (e >= 0)
            return e;
    }
    return -1;
}

int32_t snap_find(const recurrent *rs, const int32_t *tokens, int32_t m)
{
    query q = {.t = tokens};
    return find_device(rs, &q, m);
}

int32_t snap_host_find(const recurrent *rs, const int32_t *tokens, int32_t len)
{
    if (!rs->host || len <= 0)
        return -1;
    query q = {.t = tokens};
    return host_tier_lookup(rs->host, rs, query_hash(&q, len), 0, tokens, len);
}

int32_t snap_victim(const recurrent *rs, const int32_t *avoid, int32_t n_avoid)
{
    int32_t v = -1;
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const rs_snap *q = &rs->snap[i];
        bool skip = q->ref > 0;
        for (int32_t k = 0; k < n_avoid && !skip; k++)
            skip = avoid[k] == i;
        if (!skip && (v < 0 || (rs->snap[v].len > 0 && (q->len == 0 || q->lru < rs->snap[v].lru))))
            v = i;
    }
    return v;
}

/* A prefix hit is the longest snapshot on the device or, longer, in the
 * host tier (it comes back into a snapshot slot, or into a free state
 * slot when every snapshot is pinned). */
int32_t rs_prefix_match(llmem_memory *mem, const int32_t *tokens, int32_t n)
{
    recurrent *rs = rs_of(mem);
    if (rs->n_snap == 0)
        return 0;
    query q = {.t = tokens};
    int32_t i = find_device(rs, &q, n);
    int32_t len = i >= 0 ? rs->snap[i].len : 0;
    if (rs->host) {
        int32_t e = find_host(rs, &q, n, len);
        if (e >= 0)
            len = rs->host->e[e].n_tokens;
    }
    return len;
}

/* Copies snapshot i's state into a new host-tier entry (unless the tier
 * holds that snapshot already). Best effort: a full tier or a failed copy
 * only loses it. Downloads are queued (asynchronous into pinned memory on
 * CUDA, ordered before later writes of the slot). */
/* A snapshot whose copy is still queued gets it first (the spill, fill or
 * new copy that follows must see or replace the copied state). */
static void snap_settle(recurrent *rs, int32_t i)
{
    if (rs->snap[i].pend)
        (void)slot_copy_flush(rs); /* on failure it is dropped (len 0) */
}

static void snap_spill(recurrent *rs, int32_t i)
{
    snap_settle(rs, i);
    rs_snap *q = &rs->snap[i];
    if (!rs->host || q->len <= 0 ||
        host_tier_lookup(rs->host, rs, q->hash, 0, q->tokens.v, q->len) >= 0)
        return;
    int32_t e = host_tier_insert(rs->host, rs, q->hash, 0, q->tokens.v, q->len,
                                 rs_slot_bytes(rs));
    if (e < 0)
        return;
    uint8_t *d = rs->host->e[e].data;
    size_t slot = (size_t)(rs->snap_base + i);
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        const rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++) {
            if (llmem_buffer_download_async(L->buf[j], slot * L->bytes[j], d, L->bytes[j]) !=
                LLMEM_OK) {
                host_tier_remove(rs->host, e);
                return;
            }
            d += L->bytes[j];
        }
    }
}

llmem_status snap_upload(recurrent *rs, int32_t slot, int32_t e)
{
    const uint8_t *d = rs->host->e[e].data;
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        const rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++) {
            llmem_status st = llmem_buffer_upload_async(L->buf[j], (size_t)slot * L->bytes[j], d,
                                                        L->bytes[j]);
            if (st != LLMEM_OK)
                return st;
            d += L->bytes[j];
        }
    }
    rs->host_restores++;
    return LLMEM_OK;
}

llmem_status snap_restore(recurrent *rs, int32_t i, int32_t e)
{
    rs_snap *q = &rs->snap[i];
    if (!i32vec_reserve(&q->tokens, rs->host->e[e].n_tokens))
        return LLMEM_E_NO_MEMORY;
    /* room in the budget for one more snapshot; the plan pins this one, so
     * when nothing else can go the budget is exceeded until its release */
    if (q->len == 0)
        prefix_budget_make_room(rs->budget, (int64_t)rs_slot_bytes(rs));
    snap_spill(rs, i); /* may grow the tier's entry array: x is taken after */
    if (q->len > 0) {
        rs->n_live_snap--;
        rs->snap_evictions++;
    }
    q->len = 0; /* until the upload is done */
    llmem_status st = snap_upload(rs, rs->snap_base + i, e);
    if (st != LLMEM_OK)
        return st;
    const host_entry *x = &rs->host->e[e];
    i32_copy(q->tokens.v, x->tokens, x->n_tokens);
    q->tokens.n = q->len = x->n_tokens;
    rs->n_live_snap++;
    q->hash = x->hash;
    q->lru = ++*rs->clock;
    host_tier_remove(rs->host, e); /* a snapshot lives on the device or on the host */
    return LLMEM_OK;
}

static void snap_poison(recurrent *rs, int32_t i)
{
    if (!rs->poison)
        return;
    snap_settle(rs, i);
    size_t slot = (size_t)(rs->snap_base + i);
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++)
            llmem_buffer_fill(L->buf[j], slot * L->bytes[j], L->bytes[j],
                              llmem_nan_pattern(L->desc[j].dtype));
    }
}

/* Publishes the state in `slot` as the snapshot of s's first len tokens,
 * when they are token ids at canonical positions 0..len-1 (the same rule
 * as KV pages). An equal snapshot is only touched; else an unused entry or
 * the least recently used unpinned one is replaced. Nothing is published
 * when every entry is pinned. The state copy is only queued: the caller
 * runs slot_copy_flush before `slot` can change. */
llmem_status snap_publish(recurrent *rs, rs_seq *s, int32_t slot, int32_t len)
{
    rs_chain *c = &rs->chain[s - rs->seqs];
    if (rs->n_snap == 0 || len <= 0 || len > s->tokens.n || s->pos.pm.unsorted ||
        seq_pos_at(&s->pos, 0) != 0 || seq_pos_at(&s->pos, len - 1) != len - 1)
        return LLMEM_OK;
    rs_tokens_sync(rs, s);
    const int32_t *tok = s->tokens.v;
    int32_t nb = len / RS_HASH_BLOCK;
    if (!seq_chain_extend(c, tok, nb))
        return LLMEM_E_NO_MEMORY;
    if (c->neg1 > 0 && c->neg1 <= len)
        return LLMEM_OK; /* embeddings: not reusable */
    for (int32_t j = nb * RS_HASH_BLOCK; j < len; j++)
        if (tok[j] < 0)
            return LLMEM_OK;
    uint64_t h = chain_tail(c->blk, tok, len);
    int32_t victim = -1;
    for (int32_t i = 0; i < rs->n_snap; i++) {
        rs_snap *q = &rs->snap[i];
        if (q->len == len && q->hash == h &&
            memcmp(q->tokens.v, tok, (size_t)len * sizeof *tok) == 0) {
            q->lru = ++*rs->clock;
            return LLMEM_OK;
        }
        if (q->ref == 0 && (victim < 0 || (rs->snap[victim].len > 0 &&
                                           (q->len == 0 || q->lru < rs->snap[victim].lru))))
            victim = i;
    }
    if (victim < 0)
        return LLMEM_OK;
    if (rs->snap[victim].len == 0 && rs->budget) {
        /* a new snapshot: the least recently used cached data of any kind
         * (pages too) makes room, or it is not published */
        if (!prefix_budget_make_room(rs->budget, (int64_t)rs_slot_bytes(rs)))
            return LLMEM_OK;
        victim = snap_victim(rs, NULL, 0); /* the eviction may have freed a slot */
        if (victim < 0)
            return LLMEM_OK;
    }
    rs_snap *q = &rs->snap[victim];
    if (!i32vec_reserve(&q->tokens, len))
        return LLMEM_E_NO_MEMORY;
    snap_spill(rs, victim); /* the LRU snapshot it replaces goes to the host tier */
    if (q->len > 0) {
        rs->n_live_snap--;
        rs->snap_evictions++;
    }
    q->len = 0;
    /* queued: the commit runs all of its snapshot copies as one batch */
    llmem_status st = slot_copy_queue(rs, rs->snap_base + victim, slot);
    if (st != LLMEM_OK)
        return st;
    i32_copy(q->tokens.v, tok, len);
    q->tokens.n = len;
    q->len = len;
    rs->n_live_snap++;
    q->hash = h;
    q->lru = ++*rs->clock;
    return LLMEM_OK;
}

/* --- the prefix budget's view of the snapshots (prefix_budget.h) -------------- */

int64_t rs_budget_bytes(llmem_memory *mem)
{
    recurrent *rs = rs_of(mem);
    return (int64_t)rs->n_live_snap * (int64_t)rs_slot_bytes(rs);
}

/* The least recently used unpinned snapshot, -1 when none. O(snapshots). */
static int32_t oldest_unpinned(const recurrent *rs)
{
    int32_t v = -1;
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const rs_snap *q = &rs->snap[i];
        if (q->len > 0 && q->ref == 0 && (v < 0 || q->lru < rs->snap[v].lru))
            v = i;
    }
    return v;
}

bool rs_budget_oldest(llmem_memory *mem, uint64_t *stamp)
{
    recurrent *rs = rs_of(mem);
    int32_t i = oldest_unpinned(rs);
    if (i < 0)
        return false;
    *stamp = rs->snap[i].lru;
    return true;
}

void rs_budget_evict(llmem_memory *mem)
{
    recurrent *rs = rs_of(mem);
    int32_t i = oldest_unpinned(rs);
    if (i < 0)
        return;
    snap_spill(rs, i); /* to the host tier, when there is one */
    rs->snap[i].len = 0;
    rs->snap[i].tokens.n = 0;
    rs->n_live_snap--;
    rs->snap_evictions++;
    snap_poison(rs, i);
}

void snap_reset(recurrent *rs)
{
    host_tier_drop_owner(rs->host, rs);
    for (int32_t i = 0; i < rs->n_snap; i++) {
        rs->snap[i].len = 0;
        rs->snap[i].tokens.n = 0;
        rs->snap[i].ref = 0;
        snap_poison(rs, i);
    }
    rs->n_live_snap = 0;
}

void snap_finish(recurrent *rs)
{
    for (int32_t i = 0; rs->snap && i < rs->n_snap; i++)
        i32vec_free(&rs->snap[i].tokens);
    free(rs->snap);
    rs->snap = NULL;
}

int32_t snap_count(const recurrent *rs)
{
    return rs->n_live_snap;
}

bool snap_check(const recurrent *rs, char *err, size_t err_len)
{
    int32_t n_live = 0;
    for (int32_t i = 0; i < rs->n_snap; i++)
        n_live += rs->snap[i].len > 0;
    if (n_live != rs->n_live_snap) {
        llmem_errf(err, err_len, "%d snapshots held but %d counted", n_live, rs->n_live_snap);
        return false;
    }
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const rs_snap *q = &rs->snap[i];
        if (q->ref < 0 || (q->len > 0 && (q->tokens.n != q->len ||
                                          q->hash != chain_hash(q->tokens.v, q->len)))) {
            llmem_errf(err, err_len, "snapshot %d: length %d, %d tokens, ref %d, hash %s", i,
                       q->len, q->tokens.n, q->ref,
                       q->len > 0 && q->hash != chain_hash(q->tokens.v, q->len) ? "stale" : "ok");
            return false;
        }
        if (q->ref > 0 && rs->base.plan == NULL) {
            llmem_errf(err, err_len, "snapshot %d pinned %d times with no plan in flight", i,
                       q->ref);
            return false;
        }
    }
    return true;
}

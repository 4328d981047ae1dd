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

#include "memory/rs_internal.h"

static uint64_t tok_hash(const int32_t *t, int32_t n)
{
    return XXH3_64bits(t, (size_t)n * sizeof *t);
}

/* The longest published snapshot whose tokens are tokens[0, len), len <= m;
 * -1 when none. O(snapshots) hash comparisons plus one verification; the
 * prefix hash is computed once per distinct candidate length. */
int32_t snap_find(const recurrent *rs, const int32_t *tokens, int32_t m)
{
    int32_t best = -1, hashed_len = -1;
    uint64_t h = 0;
    for (;;) {
        /* the longest candidate length below the best found so far */
        int32_t len = -1;
        for (int32_t i = 0; i < rs->n_snap; i++) {
            int32_t l = rs->snap[i].len;
            if (l > 0 && l <= m && (hashed_len < 0 || l < hashed_len) && l > len)
                len = l;
        }
        if (len < 0)
            return best;
        h = tok_hash(tokens, len);
        hashed_len = len;
        for (int32_t i = 0; i < rs->n_snap; i++) {
            const rs_snap *q = &rs->snap[i];
            if (q->len == len && q->hash == h &&
                memcmp(q->tokens.v, tokens, (size_t)len * sizeof *tokens) == 0)
                return i;
        }
    }
}

int32_t rs_prefix_match(llmem_memory *mem, const int32_t *tokens, int32_t n)
{
    recurrent *rs = rs_of(mem);
    if (rs->n_snap == 0)
        return 0;
    int32_t i = snap_find(rs, tokens, n);
    return i >= 0 ? rs->snap[i].len : 0;
}

static void snap_poison(recurrent *rs, int32_t i)
{
    if (!rs->poison)
        return;
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
 * when every entry is pinned. */
llmem_status snap_publish(recurrent *rs, const rs_seq *s, int32_t slot, int32_t len)
{
    if (rs->n_snap == 0 || len <= 0 || len > s->tokens.n || s->pm.unsorted ||
        s->pos.v[0] != 0 || s->pos.v[len - 1] != len - 1)
        return LLMEM_OK;
    const int32_t *tok = s->tokens.v;
    uint64_t h = tok_hash(tok, len);
    int32_t victim = -1;
    for (int32_t i = 0; i < rs->n_snap; i++) {
        rs_snap *q = &rs->snap[i];
        if (q->len == len && q->hash == h &&
            memcmp(q->tokens.v, tok, (size_t)len * sizeof *tok) == 0) {
            q->lru = ++rs->snap_clock;
            return LLMEM_OK;
        }
        if (q->ref == 0 && (victim < 0 || (rs->snap[victim].len > 0 &&
                                           (q->len == 0 || q->lru < rs->snap[victim].lru))))
            victim = i;
    }
    if (victim < 0)
        return LLMEM_OK;
    for (int32_t j = 0; j < len; j++)
        if (tok[j] < 0)
            return LLMEM_OK; /* embeddings: not reusable */
    rs_snap *q = &rs->snap[victim];
    if (!i32vec_reserve(&q->tokens, len))
        return LLMEM_E_NO_MEMORY;
    llmem_status st = slot_copy(rs, rs->snap_base + victim, slot);
    if (st != LLMEM_OK) {
        q->len = 0;
        return st;
    }
    i32_copy(q->tokens.v, tok, len);
    q->tokens.n = len;
    q->len = len;
    q->hash = h;
    q->lru = ++rs->snap_clock;
    return LLMEM_OK;
}

void snap_reset(recurrent *rs)
{
    for (int32_t i = 0; i < rs->n_snap; i++) {
        rs->snap[i].len = 0;
        rs->snap[i].tokens.n = 0;
        rs->snap[i].ref = 0;
        snap_poison(rs, i);
    }
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
    int32_t n = 0;
    for (int32_t i = 0; i < rs->n_snap; i++)
        n += rs->snap[i].len > 0;
    return n;
}

bool snap_check(const recurrent *rs, char *err, size_t err_len)
{
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const rs_snap *q = &rs->snap[i];
        if (q->ref < 0 || (q->len > 0 && (q->tokens.n != q->len ||
                                          q->hash != tok_hash(q->tokens.v, q->len)))) {
            llmem_errf(err, err_len, "snapshot %d: length %d, %d tokens, ref %d, hash %s", i,
                       q->len, q->tokens.n, q->ref,
                       q->len > 0 && q->hash != tok_hash(q->tokens.v, q->len) ? "stale" : "ok");
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

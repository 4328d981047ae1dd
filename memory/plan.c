/* llmem memory/: building a plan — batch validation, prefix-cache skips
 * and the three splits (DESIGN.md "split"; llama.cpp's llama_batch_allocr
 * split_simple / split_equal / split_seq have the same meaning).
 *
 * Cost (DESIGN.md contract 9): O(tokens x sequence ids per token) plus
 * O(n_seq_max) for per-sequence arrays, never quadratic in sequences:
 * sequence-id sets are grouped through a per-sequence table (one id) or a
 * hash of the set (several ids), streams of a ubatch through a set ->
 * stream table, and the EQUAL / SEQ splits walk a list of the sets that
 * still have tokens. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "memory/internal.h"

typedef struct stream_set {
    int32_t off, n; /* into the flat id list */
} stream_set;

typedef struct plan_build {
    const llmem_batch *b;
    int32_t n_seq_max;
    /* per batch token */
    int32_t *stream;   /* global stream id */
    bool *skip;        /* served by the prefix cache */
    bool *out;
    /* streams */
    i32vec ids;        /* flat seq ids of each distinct stream */
    stream_set *sets;
    int32_t n_sets, cap_sets;
    /* grouping: one-id sets by sequence; larger sets by hash (chains) */
    int32_t *single;   /* [n_seq_max] set {s}, or -1 */
    uint32_t *mark;    /* [n_seq_max] stamp of the set being compared */
    uint32_t stamp;
    int32_t *bucket;   /* [n_buckets] first set of a chain, -1; made at the first
                          token in several sequences */
    int32_t n_buckets;
    i32vec chain;      /* [n_sets] next set of the same bucket */
    int32_t *local;    /* [n_sets] stream of a set in the ubatch being emitted, or -1 */
    int32_t *cut;      /* [n_seq_max] batch tokens of a sequence before which a ubatch
                          must end (llmem_plan.snap_at), 0 none; NULL when no cut */
    int32_t *cut_m;    /* [n_seq_max] its first batch token's position (the prefix hit) */
    int32_t *cut_every; /* [n_seq_max] below a cut, ubatches also end at multiples of
                           this length (0 none) */
} plan_build;

static int32_t tok_nseq(const llmem_batch *b, int32_t i)
{
    return b->n_seq_id ? b->n_seq_id[i] : 1;
}

static int32_t tok_seq(const llmem_batch *b, int32_t i, int32_t j)
{
    return b->seq_id ? b->seq_id[i][j] : 0;
}

/* New stamp for pb->mark (all marks cleared on wrap-around). */
static uint32_t next_stamp(plan_build *pb)
{
    if (++pb->stamp == 0) {
        memset(pb->mark, 0, (size_t)pb->n_seq_max * sizeof *pb->mark);
        pb->stamp = 1;
    }
    return pb->stamp;
}

/* Whether set s holds exactly token i's ids (distinct, validated). */
static bool same_set(plan_build *pb, int32_t s, int32_t i)
{
    const llmem_batch *b = pb->b;
    int32_t n = tok_nseq(b, i);
    if (pb->sets[s].n != n)
        return false;
    uint32_t st = next_stamp(pb);
    for (int32_t k = 0; k < n; k++)
        pb->mark[pb->ids.v[pb->sets[s].off + k]] = st;
    for (int32_t j = 0; j < n; j++)
        if (pb->mark[tok_seq(b, i, j)] != st)
            return false;
    return true;
}

/* Order-independent hash of token i's id set. */
static uint32_t set_hash(const llmem_batch *b, int32_t i)
{
    uint64_t h = 0;
    for (int32_t j = 0; j < tok_nseq(b, i); j++) {
        uint64_t z = (uint64_t)(uint32_t)tok_seq(b, i, j) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
        h += z ^ (z >> 32);
    }
    return (uint32_t)(h ^ (h >> 32));
}

static int32_t find_or_add_set(plan_build *pb, int32_t i)
{
    int32_t n = tok_nseq(pb->b, i), s0 = tok_seq(pb->b, i, 0), *head = NULL;
    if (n == 1) {
        if (pb->single[s0] >= 0)
            return pb->single[s0];
    } else {
        if (!pb->bucket) { /* the first token in several sequences: make the hash */
            int32_t nb = 16;
            while (nb < 2 * pb->b->n_tokens && nb < (1 << 30))
                nb *= 2;
            if (!(pb->bucket = malloc((size_t)nb * sizeof *pb->bucket)))
                return -1;
            memset(pb->bucket, 0xff, (size_t)nb * sizeof *pb->bucket);
            pb->n_buckets = nb;
        }
        head = &pb->bucket[set_hash(pb->b, i) & (uint32_t)(pb->n_buckets - 1)];
        for (int32_t s = *head; s >= 0; s = pb->chain.v[s])
            if (same_set(pb, s, i))
                return s;
    }
    if (!i32vec_push(&pb->chain, head ? *head : -1))
        return -1;
    if (pb->n_sets == pb->cap_sets) {
        int32_t nc = pb->cap_sets ? pb->cap_sets * 2 : 16;
        stream_set *ns = realloc(pb->sets, (size_t)nc * sizeof *ns);
        if (!ns)
            return -1;
        pb->sets = ns;
        pb->cap_sets = nc;
    }
    stream_set *st = &pb->sets[pb->n_sets];
    st->off = pb->ids.n;
    st->n = n;
    for (int32_t j = 0; j < st->n; j++)
        if (!i32vec_push(&pb->ids, tok_seq(pb->b, i, j)))
            return -1;
    if (head)
        *head = pb->n_sets;
    else
        pb->single[s0] = pb->n_sets;
    return pb->n_sets++;
}

static void ubatch_free(llmem_ubatch *u)
{
    free((void *)u->token);
    free((void *)u->embd);
    free((void *)u->pos);
    free((void *)u->seq);
    free((void *)u->seq_id);
    free((void *)u->batch_idx);
    free((void *)u->out_rows);
    free((void *)u->out_ids);
}

void llmem_plan_free_internal(llmem_plan *p)
{
    if (!p)
        return;
    for (int32_t u = 0; u < p->n_ubatch; u++) {
        ubatch_free(&p->ubatch[u]);
        if (p->group_off)
            free(p->group_off[u]);
        if (p->group_ids)
            free(p->group_ids[u]);
    }
    free(p->ubatch);
    free(p->group_off);
    free(p->group_ids);
    free(p->seq_tokens); /* the rows point into storage */
    free(p->storage);
    free(p->n_cached);
    free(p->n_new);
    free(p->first_pos);
    free(p->snap_at);
    free(p);
}

/* Emits one ubatch from `n` batch-token indices (already grouped as the
 * split wants). */
static llmem_status emit_ubatch(llmem_plan *p, plan_build *pb, const int32_t *tok, int32_t n,
                                llmem_split split, int32_t n_seq_tokens)
{
    const llmem_batch *b = pb->b;
    int32_t u = p->n_ubatch;
    llmem_ubatch *ub = &p->ubatch[u];
    memset(ub, 0, sizeof *ub);
    int32_t *token = b->token ? malloc((size_t)n * sizeof *token) : NULL;
    float *embd = b->embd ? malloc((size_t)n * (size_t)b->n_embd * sizeof *embd) : NULL;
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    int32_t *seq = malloc((size_t)n * sizeof *seq);
    int32_t *seq_id = malloc((size_t)n * sizeof *seq_id);
    int32_t *bidx = malloc((size_t)n * sizeof *bidx);
    int32_t *out_rows = malloc((size_t)n * sizeof *out_rows);
    int32_t *out_ids = malloc((size_t)n * sizeof *out_ids);
    int32_t *soff = malloc((size_t)(n + 1) * sizeof *soff);
    int32_t *local_of = malloc((size_t)n * sizeof *local_of); /* local stream -> global set */
    int32_t n_local = 0;
    i32vec sids = {0};
    ub->token = token;
    ub->embd = embd;
    ub->pos = pos;
    ub->seq = seq;
    ub->seq_id = seq_id;
    ub->batch_idx = bidx;
    ub->out_rows = out_rows;
    ub->out_ids = out_ids;
    p->group_off[u] = soff;
    p->n_ubatch++; /* from here on, plan_free releases the arrays */
    llmem_status rc = LLMEM_E_NO_MEMORY;
    if ((b->token && !token) || (b->embd && !embd) || !pos || !seq || !seq_id || !bidx ||
        !out_rows || !out_ids || !soff || !local_of)
        goto out;
    int32_t n_out = 0;
    soff[0] = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = tok[k];
        int32_t g = pb->stream[i];
        int32_t s = pb->local[g];
        if (s < 0) {
            s = pb->local[g] = n_local;
            local_of[n_local++] = g;
            const stream_set *st = &pb->sets[g];
            for (int32_t j = 0; j < st->n; j++)
                if (!i32vec_push(&sids, pb->ids.v[st->off + j])) {
                    i32vec_free(&sids);
                    goto out;
                }
            seq_id[s] = pb->ids.v[st->off];
            soff[s + 1] = sids.n;
        }
        if (token)
            token[k] = b->token[i];
        if (embd)
            memcpy(embd + (size_t)k * (size_t)b->n_embd, b->embd + (size_t)i * (size_t)b->n_embd,
                   (size_t)b->n_embd * sizeof *embd);
        pos[k] = b->pos[i];
        seq[k] = s;
        bidx[k] = i;
        if (pb->out[i]) {
            out_rows[n_out] = k;
            out_ids[n_out] = i;
            n_out++;
        }
    }
    p->group_ids[u] = sids.v ? sids.v : malloc(sizeof(int32_t));
    if (!p->group_ids[u])
        goto out;
    rc = LLMEM_OK;
    ub->n_tokens = n;
    ub->n_seqs = n_local;
    ub->n_seq_tokens = split == LLMEM_SPLIT_SIMPLE ? 0 : n_seq_tokens;
    ub->split = split;
    ub->n_embd = b->embd ? b->n_embd : 0;
    ub->n_outputs = n_out;
    p->info.n_outputs += n_out;
    p->info.n_tokens += n;
out:
    for (int32_t s = 0; local_of && s < n_local; s++)
        pb->local[local_of[s]] = -1;
    free(local_of);
    return rc;
}

/* Makes room for one more ubatch in p's arrays (grown by doubling; a
 * decode step of 4,000 sequences is one ubatch, and sizing the arrays for
 * the worst case of one token per ubatch would clear ~100 bytes per token
 * every step). On failure the arrays stay as they were. */
static bool ubatch_room(llmem_plan *p, int32_t *cap)
{
    if (p->n_ubatch < *cap)
        return true;
    int32_t nc = *cap ? *cap * 2 : 4;
    llmem_ubatch *u = realloc(p->ubatch, (size_t)nc * sizeof *u);
    if (u)
        p->ubatch = u;
    int32_t **o = realloc(p->group_off, (size_t)nc * sizeof *o);
    if (o)
        p->group_off = o;
    int32_t **g = realloc(p->group_ids, (size_t)nc * sizeof *g);
    if (g)
        p->group_ids = g;
    if (!u || !o || !g)
        return false;
    for (int32_t k = *cap; k < nc; k++)
        p->group_off[k] = p->group_ids[k] = NULL;
    *cap = nc;
    return true;
}

static llmem_status do_split(llmem_plan *p, plan_build *pb, const int32_t *list, int32_t n,
                             llmem_split split, int32_t n_ubatch)
{
    llmem_status st = LLMEM_OK;
    int32_t cap = 0;
    int32_t *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof *buf);
    if (!buf || !ubatch_room(p, &cap)) {
        free(buf);
        return LLMEM_E_NO_MEMORY;
    }
    if (split == LLMEM_SPLIT_SIMPLE) {
        for (int32_t k = 0; k < n && st == LLMEM_OK; k += n_ubatch) {
            int32_t m = n - k < n_ubatch ? n - k : n_ubatch;
            st = ubatch_room(p, &cap) ? emit_ubatch(p, pb, list + k, m, split, 0)
                                      : LLMEM_E_NO_MEMORY;
        }
        free(buf);
        return st;
    }
    /* EQUAL / SEQ: per-stream queues in batch order */
    int32_t ns = pb->n_sets;
    int32_t *start = calloc((size_t)ns + 1, sizeof *start);
    int32_t *head = calloc((size_t)ns + 1, sizeof *head);
    int32_t *q = malloc((size_t)(n > 0 ? n : 1) * sizeof *q);
    int32_t *nxt = malloc(((size_t)ns + 1) * sizeof *nxt);
    int32_t *cutq = NULL, *cbase = NULL, *cevery = NULL;
    if (!start || !head || !q || !nxt) {
        st = LLMEM_E_NO_MEMORY;
        goto out;
    }
    for (int32_t k = 0; k < n; k++)
        start[pb->stream[list[k]] + 1]++;
    for (int32_t s = 0; s < ns; s++)
        start[s + 1] += start[s];
    for (int32_t s = 0; s < ns; s++)
        head[s] = start[s];
    for (int32_t k = 0; k < n; k++)
        q[head[pb->stream[list[k]]]++] = list[k];
    for (int32_t s = 0; s < ns; s++)
        head[s] = start[s];
    /* cuts: a ubatch ends before token cut[seq] of a one-sequence set */
    if (pb->cut) {
        cutq = calloc((size_t)ns + 1, sizeof *cutq);
        cbase = calloc((size_t)ns + 1, sizeof *cbase);
        cevery = calloc((size_t)ns + 1, sizeof *cevery);
        if (!cutq || !cbase || !cevery) {
            st = LLMEM_E_NO_MEMORY;
            goto out;
        }
        for (int32_t a = 0; a < pb->n_seq_max; a++)
            if (pb->cut[a] > 0 && pb->single[a] >= 0 && pb->single[a] < ns &&
                pb->cut[a] < start[pb->single[a] + 1] - start[pb->single[a]]) {
                cutq[pb->single[a]] = start[pb->single[a]] + pb->cut[a];
                cbase[pb->single[a]] = start[pb->single[a]] - pb->cut_m[a];
                cevery[pb->single[a]] = pb->cut_every[a];
            }
    }
    /* sets that still have tokens, in order: nxt[s] follows s, nxt[ns] is
     * the first; each ubatch takes the first `chosen` of them */
    for (int32_t s = 0; s < ns; s++)
        nxt[s] = s + 1;
    nxt[ns] = 0;
    for (;;) {
        int32_t chosen = 0, min_rem = INT32_MAX, max_chosen = split == LLMEM_SPLIT_SEQ ? 1 : n_ubatch;
        int32_t m = 0;
        for (int32_t s = nxt[ns]; s < ns && chosen < max_chosen; s = nxt[s]) {
            int32_t rem = start[s + 1] - head[s];
            if (cutq && cutq[s] > head[s]) {
                /* up to the cut, also end at multiples of cut_every */
                int32_t end = cutq[s];
                if (cevery[s] > 0) {
                    int64_t next = ((int64_t)(head[s] - cbase[s]) / cevery[s] + 1) *
                                       cevery[s] + cbase[s];
                    if (next < end)
                        end = (int32_t)next;
                }
                rem = end - head[s];
            }
            chosen++;
            if (rem < min_rem)
                min_rem = rem;
        }
        if (chosen == 0)
            break;
        int32_t nst = min_rem < n_ubatch / chosen ? min_rem : n_ubatch / chosen;
        int32_t c = 0, prev = ns;
        for (int32_t s = nxt[ns]; s < ns && c < chosen; s = nxt[s], c++) {
            for (int32_t t = 0; t < nst; t++)
                buf[m++] = q[head[s]++];
            if (start[s + 1] - head[s] <= 0)
                nxt[prev] = nxt[s]; /* exhausted: unlink */
            else
                prev = s;
        }
        st = ubatch_room(p, &cap) ? emit_ubatch(p, pb, buf, m, split, nst) : LLMEM_E_NO_MEMORY;
        if (st != LLMEM_OK)
            break;
    }
out:
    free(cutq);
    free(cbase);
    free(cevery);
    free(start);
    free(head);
    free(q);
    free(nxt);
    free(buf);
    return st;
}

static llmem_status validate(llmem_memory *mem, plan_build *pb, llmem_split split, char *err,
                             size_t err_len, int32_t *next_pos, int32_t *seq_set)
{
    const llmem_batch *b = pb->b;
    if (b->n_tokens < 1) {
        llmem_errf(err, err_len, "empty batch (n_tokens = %d)", b->n_tokens);
        return LLMEM_E_INVALID;
    }
    if (!b->pos) {
        llmem_errf(err, err_len, "batch has no positions");
        return LLMEM_E_INVALID;
    }
    if (!b->token == !b->embd || (b->embd && b->n_embd <= 0)) {
        llmem_errf(err, err_len, "batch needs exactly one of token ids or embeddings (n_embd > 0)");
        return LLMEM_E_INVALID;
    }
    int32_t n_seq_max = pb->n_seq_max;
    for (int32_t s = 0; s < n_seq_max; s++) {
        next_pos[s] = INT32_MIN;
        seq_set[s] = -1;
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t ns = tok_nseq(b, i);
        if (ns < 1 || (ns > 1 && !b->seq_id)) {
            llmem_errf(err, err_len, "batch token %d: %d sequence ids (need >= 1)", i, ns);
            return LLMEM_E_INVALID;
        }
        if (b->pos[i] < 0 || b->pos[i] == INT32_MAX) {
            llmem_errf(err, err_len, "batch token %d: position %d outside [0, %d)", i, b->pos[i],
                       INT32_MAX);
            return LLMEM_E_INVALID;
        }
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = tok_seq(b, i, j);
            if (s < 0 || s >= n_seq_max) {
                llmem_errf(err, err_len, "batch token %d: sequence id %d out of range [0, %d)", i,
                           s, n_seq_max);
                return LLMEM_E_INVALID;
            }
            if (ns > 1) { /* marks, not a pairwise scan: a token may be in 4,000 sequences */
                if (j == 0)
                    next_stamp(pb);
                if (pb->mark[s] == pb->stamp) {
                    llmem_errf(err, err_len, "batch token %d: sequence id %d listed twice", i, s);
                    return LLMEM_E_INVALID;
                }
                pb->mark[s] = pb->stamp;
            }
            if (next_pos[s] == INT32_MIN) {
                int32_t pm = mem->iface->seq_pos_max(mem, s);
                next_pos[s] = pm >= 0 && pm < INT32_MAX ? pm + 1 : b->pos[i];
            }
            if (b->pos[i] != next_pos[s]) {
                llmem_errf(err, err_len,
                           "batch token %d: position %d of sequence %d does not follow its last "
                           "position (expected %d)",
                           i, b->pos[i], s, next_pos[s]);
                return LLMEM_E_INVALID;
            }
            if (next_pos[s] < INT32_MAX)
                next_pos[s]++;
        }
        int32_t g = find_or_add_set(pb, i);
        if (g < 0)
            return LLMEM_E_NO_MEMORY;
        pb->stream[i] = g;
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = tok_seq(b, i, j);
            if (seq_set[s] >= 0 && seq_set[s] != g && split != LLMEM_SPLIT_SIMPLE) {
                llmem_errf(err, err_len,
                           "batch token %d: sequence %d appears with different sequence-id sets; "
                           "the %s split needs each sequence in one set (submit shared tokens in "
                           "their own batch, then seq_cp)",
                           i, s, llmem_split_name(split));
                return LLMEM_E_INVALID;
            }
            seq_set[s] = g;
        }
        pb->out[i] = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
    }
    return LLMEM_OK;
}

/* In-batch shared prefixes (for prefix_cut): sequences whose batch tokens
 * are idx[first[s], first[s+1]) are sorted by their token ids (merge sort,
 * O(tokens log sequences)); each one's longest prefix shared with another
 * new sequence is its LCP with a neighbour in that order. */
typedef struct lcp_ctx {
    const llmem_batch *b;
    const int32_t *idx, *first;
} lcp_ctx;

static int32_t lcp(const lcp_ctx *c, int32_t s, int32_t t)
{
    int32_t na = c->first[s + 1] - c->first[s], nb = c->first[t + 1] - c->first[t];
    const int32_t *a = c->idx + c->first[s], *bb = c->idx + c->first[t];
    int32_t k = 0;
    while (k < na && k < nb && c->b->token[a[k]] == c->b->token[bb[k]])
        k++;
    return k;
}

static bool seq_less(const lcp_ctx *c, int32_t s, int32_t t)
{
    int32_t k = lcp(c, s, t);
    int32_t na = c->first[s + 1] - c->first[s], nb = c->first[t + 1] - c->first[t];
    if (k == na || k == nb)
        return na < nb;
    return c->b->token[c->idx[c->first[s] + k]] < c->b->token[c->idx[c->first[t] + k]];
}

static void merge_sort(const lcp_ctx *c, int32_t *v, int32_t *tmp, int32_t n)
{
    if (n < 2)
        return;
    int32_t h = n / 2;
    merge_sort(c, v, tmp, h);
    merge_sort(c, v + h, tmp, n - h);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = seq_less(c, v[j], v[i]) ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

/* shared[s] for every candidate (cand[0, n)); false on allocation failure. */
static bool shared_prefixes(const lcp_ctx *c, int32_t *cand, int32_t n, int32_t *shared)
{
    int32_t *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    if (!tmp)
        return false;
    merge_sort(c, cand, tmp, n);
    for (int32_t k = 0; k < n; k++) {
        int32_t a = k > 0 ? lcp(c, cand[k], cand[k - 1]) : 0;
        int32_t z = k + 1 < n ? lcp(c, cand[k], cand[k + 1]) : 0;
        shared[cand[k]] = a > z ? a : z;
    }
    free(tmp);
    return true;
}

/* Decides how many leading tokens of each new sequence the prefix cache
 * serves: only sequences that are empty, start at position 0, have token
 * ids and no shared tokens; never the last token of a sequence in the
 * batch, never a token that needs an output. */
static llmem_status prefix_skips(llmem_memory *mem, plan_build *pb, llmem_plan *p)
{
    const llmem_batch *b = pb->b;
    if (!b->token)
        return LLMEM_OK;
    bool any = false;
    for (int32_t s = 0; s < pb->n_seq_max && !any; s++)
        any = p->n_new[s] >= 2 && p->first_pos[s] == 0 && mem->iface->seq_pos_max(mem, s) < 0;
    if (!any)
        return LLMEM_OK;
    bool has_cut = mem->iface->struct_size > offsetof(llmem_memory_i, prefix_cut) &&
                   LLMEM_MEMORY_SLOT(mem, prefix_cut);
    /* each sequence's batch tokens, in order (counting sort of the
     * (token, sequence) pairs: O(pairs), not O(sequences x tokens)) */
    int64_t pairs = 0;
    for (int32_t i = 0; i < b->n_tokens; i++)
        pairs += tok_nseq(b, i);
    int32_t *toks = malloc((size_t)b->n_tokens * sizeof *toks);
    int32_t *idx = malloc((size_t)pairs * sizeof *idx);
    int32_t *first = calloc((size_t)pb->n_seq_max + 1, sizeof *first);
    if (!toks || !idx || !first || pairs > INT32_MAX) {
        free(toks);
        free(idx);
        free(first);
        return LLMEM_E_NO_MEMORY;
    }
    for (int32_t i = 0; i < b->n_tokens; i++)
        for (int32_t j = 0; j < tok_nseq(b, i); j++)
            first[tok_seq(b, i, j) + 1]++;
    for (int32_t s = 0; s < pb->n_seq_max; s++)
        first[s + 1] += first[s];
    for (int32_t i = 0; i < b->n_tokens; i++)
        for (int32_t j = 0; j < tok_nseq(b, i); j++)
            idx[first[tok_seq(b, i, j)]++] = i;
    for (int32_t s = pb->n_seq_max; s > 0; s--)
        first[s] = first[s - 1];
    first[0] = 0;
    int32_t *shared_len = NULL; /* with a cut: prefix shared with another new sequence */
    if (has_cut) {
        int32_t *cand = malloc((size_t)pb->n_seq_max * sizeof *cand), nc = 0;
        shared_len = calloc((size_t)pb->n_seq_max, sizeof *shared_len);
        bool ok = cand && shared_len;
        for (int32_t s = 0; ok && s < pb->n_seq_max; s++)
            if (p->n_new[s] >= 2 && p->first_pos[s] == 0 && mem->iface->seq_pos_max(mem, s) < 0)
                cand[nc++] = s;
        lcp_ctx lc = {b, idx, first};
        ok = ok && shared_prefixes(&lc, cand, nc, shared_len);
        free(cand);
        if (!ok) {
            free(shared_len);
            free(toks);
            free(idx);
            free(first);
            return LLMEM_E_NO_MEMORY;
        }
    }
    for (int32_t s = 0; s < pb->n_seq_max; s++) {
        if (p->n_new[s] < 2 || p->first_pos[s] != 0 || mem->iface->seq_pos_max(mem, s) >= 0)
            continue;
        int32_t n = 0, limit = -1;
        bool shared = false;
        const int32_t *list = idx + first[s];
        for (int32_t k = 0; k < first[s + 1] - first[s] && !shared; k++) {
            int32_t i = list[k];
            shared = tok_nseq(b, i) > 1;
            if (pb->out[i] && limit < 0)
                limit = n;
            toks[n++] = b->token[i];
        }
        if (shared)
            continue;
        if (limit < 0 || limit > n - 1)
            limit = n - 1;
        int32_t m = limit > 0 ? mem->iface->prefix_match(mem, toks, limit) : 0;
        if (m > limit)
            m = limit;
        if (m < 0)
            m = 0;
        int32_t every = 0;
        int32_t cut =
            has_cut ? LLMEM_MEMORY_SLOT(mem, prefix_cut)(mem, toks, limit, m, shared_len[s], &every) : 0;
        if (cut > m && cut < n) {
            if (!p->snap_at)
                p->snap_at = calloc((size_t)pb->n_seq_max, sizeof *p->snap_at);
            if (!pb->cut) {
                pb->cut = calloc((size_t)pb->n_seq_max, sizeof *pb->cut);
                pb->cut_m = calloc((size_t)pb->n_seq_max, sizeof *pb->cut_m);
                pb->cut_every = calloc((size_t)pb->n_seq_max, sizeof *pb->cut_every);
            }
            if (!p->snap_at || !pb->cut || !pb->cut_m || !pb->cut_every) {
                free(shared_len);
                free(toks);
                free(idx);
                free(first);
                return LLMEM_E_NO_MEMORY;
            }
            p->snap_at[s] = cut;
            if (every >= 0) { /* -1: written inside a ubatch, no cut */
                pb->cut[s] = cut - m;
                pb->cut_m[s] = m;
                pb->cut_every[s] = every;
            }
        }
        if (m <= 0)
            continue;
        p->n_cached[s] = m;
        p->info.n_tokens_cached += m;
        for (int32_t k = 0; k < m; k++)
            pb->skip[list[k]] = true;
    }
    free(shared_len);
    free(toks);
    free(idx);
    free(first);
    return LLMEM_OK;
}

llmem_status llmem_plan_build_internal(llmem_memory *mem, const llmem_batch *b, llmem_split split,
                                       int32_t n_ubatch, llmem_plan **out, char *err,
                                       size_t err_len)
{
    llmem_status st = LLMEM_E_NO_MEMORY;
    int32_t nsm = mem->n_seq_max;
    plan_build pb = {.b = b, .n_seq_max = nsm};
    int32_t *next_pos = malloc((size_t)nsm * sizeof *next_pos);
    int32_t *seq_set = malloc((size_t)nsm * sizeof *seq_set);
    int32_t *list = NULL;
    llmem_plan *p = calloc(1, sizeof *p);
    if (!next_pos || !seq_set || !p)
        goto fail;
    p->mem = mem;
    p->n_seq_max = nsm;
    p->n_cached = calloc((size_t)nsm, sizeof *p->n_cached);
    p->n_new = calloc((size_t)nsm, sizeof *p->n_new);
    p->first_pos = malloc((size_t)nsm * sizeof *p->first_pos);
    p->seq_tokens = calloc((size_t)nsm, sizeof *p->seq_tokens);
    if (b->n_tokens > 0) {
        pb.stream = malloc((size_t)b->n_tokens * sizeof *pb.stream);
        pb.skip = calloc((size_t)b->n_tokens, sizeof *pb.skip);
        pb.out = calloc((size_t)b->n_tokens, sizeof *pb.out);
        list = malloc((size_t)b->n_tokens * sizeof *list);
        pb.local = malloc((size_t)b->n_tokens * sizeof *pb.local); /* sets <= tokens */
    }
    pb.single = malloc((size_t)nsm * sizeof *pb.single);
    pb.mark = calloc((size_t)nsm, sizeof *pb.mark);
    if (!p->n_cached || !p->n_new || !p->first_pos || !p->seq_tokens || !pb.single ||
        !pb.mark ||
        (b->n_tokens > 0 && (!pb.stream || !pb.skip || !pb.out || !list || !pb.local)))
        goto fail;
    memset(pb.single, 0xff, (size_t)nsm * sizeof *pb.single);
    if (b->n_tokens > 0)
        memset(pb.local, 0xff, (size_t)b->n_tokens * sizeof *pb.local);
    st = validate(mem, &pb, split, err, err_len, next_pos, seq_set);
    if (st != LLMEM_OK)
        goto fail;
    for (int32_t s = 0; s < nsm; s++)
        p->first_pos[s] = -1;
    for (int32_t i = 0; i < b->n_tokens; i++)
        for (int32_t j = 0; j < tok_nseq(b, i); j++) {
            int32_t s = tok_seq(b, i, j);
            if (p->first_pos[s] < 0)
                p->first_pos[s] = b->pos[i];
            p->n_new[s]++;
        }
    if (b->token) {
        /* one block for every sequence's tokens (p->storage) */
        int64_t total = 0;
        for (int32_t s = 0; s < nsm; s++)
            total += p->n_new[s];
        int32_t *blk = malloc((size_t)(total > 0 ? total : 1) * sizeof *blk);
        if (!blk) {
            st = LLMEM_E_NO_MEMORY;
            goto fail;
        }
        p->storage = blk;
        for (int32_t s = 0; s < nsm; s++) {
            p->seq_tokens[s] = p->n_new[s] ? blk : NULL;
            blk += p->n_new[s];
        }
        int32_t *fill = next_pos; /* reuse as per-sequence cursor */
        memset(fill, 0, (size_t)nsm * sizeof *fill);
        for (int32_t i = 0; i < b->n_tokens; i++)
            for (int32_t j = 0; j < tok_nseq(b, i); j++) {
                int32_t s = tok_seq(b, i, j);
                p->seq_tokens[s][fill[s]++] = b->token[i];
            }
    }
    st = LLMEM_OK;
    if (mem->iface->prefix_match)
        st = prefix_skips(mem, &pb, p);
    if (st != LLMEM_OK)
        goto fail;
    int32_t n = 0;
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (!pb.skip[i])
            list[n++] = i;
    st = do_split(p, &pb, list, n, split, n_ubatch);
    if (st != LLMEM_OK)
        goto fail;
    p->info.n_ubatch = p->n_ubatch;
    p->info.split = split;
    *out = p;
    p = NULL;
fail:
    llmem_plan_free_internal(p);
    free(next_pos);
    free(seq_set);
    free(list);
    free(pb.stream);
    free(pb.skip);
    free(pb.out);
    free(pb.sets);
    free(pb.single);
    free(pb.mark);
    free(pb.bucket);
    free(pb.local);
    free(pb.cut);
    free(pb.cut_m);
    free(pb.cut_every);
    i32vec_free(&pb.chain);
    i32vec_free(&pb.ids);
    return st;
}

/* llmem memory/: building a plan — batch validation, prefix-cache skips
 * and the three splits (DESIGN.md "split"; llama.cpp's llama_batch_allocr
 * split_simple / split_equal / split_seq have the same meaning).
 *
 * Cost (DESIGN.md contract 9): O(tokens x sequence ids per token) plus
 * O(sequences of the batch), whatever n_seq_max is, and never quadratic
 * in sequences: the batch's sequences are listed (llmem_plan.seqs) and
 * found through a hash of their ids, sequence-id sets are grouped through
 * a per-sequence entry (one id) or a hash of the set (several ids),
 * streams of a ubatch through a set -> stream table, and the EQUAL / SEQ
 * splits walk a list of the sets that still have tokens. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "memory/internal.h"
#include "memory/plan_build.h"

/* New stamp for seq_tmp.mark (all marks cleared on wrap-around). */
static uint32_t next_stamp(plan_build *pb)
{
    if (++pb->stamp == 0) {
        for (int32_t k = 0; k < pb->n_seqs; k++)
            pb->tmp[k].mark = 0;
        pb->stamp = 1;
    }
    return pb->stamp;
}

/* Rebuilds the id -> k map: a hash of 1 << bits entries, or for bits 0 a
 * table of n_seq_max entries indexed by id (chosen when n_seq_max is at
 * most a few times the batch's tokens, so it still costs O(the batch)). */
static bool map_build(plan_build *pb, int32_t bits)
{
    size_t n = bits ? (size_t)1 << bits : (size_t)pb->n_seq_max;
    int32_t *m = malloc(n * sizeof *m);
    if (!m)
        return false;
    memset(m, 0xff, n * sizeof *m);
    uint32_t mask = (uint32_t)(n - 1);
    for (int32_t k = 0; k < pb->n_seqs; k++) {
        uint32_t h = bits ? llmem_plan_seq_hash(pb->seqs[k].id, bits) : (uint32_t)pb->seqs[k].id;
        while (m[h] >= 0)
            h = (h + 1) & mask;
        m[h] = k;
    }
    free(pb->map);
    pb->map = m;
    pb->map_bits = bits;
    return true;
}

/* k of sequence s (in range), added (with its first token at position pos)
 * when new; -1 on allocation failure. *added tells whether it was new. */
static int32_t seq_k(plan_build *pb, int32_t s, int32_t pos, bool *added)
{
    *added = false;
    if (s == pb->last_id)
        return pb->last_k;
    uint32_t mask = 0, h = (uint32_t)s;
    if (pb->map_bits) {
        mask = (1u << pb->map_bits) - 1;
        for (h = llmem_plan_seq_hash(s, pb->map_bits); pb->map[h] >= 0; h = (h + 1) & mask)
            if (pb->seqs[pb->map[h]].id == s)
                break;
    }
    if (pb->map[h] >= 0) {
        pb->last_id = s;
        return pb->last_k = pb->map[h];
    }
    if (pb->n_seqs == pb->cap_seqs) {
        if (pb->cap_seqs > INT32_MAX / 2)
            return -1;
        int32_t nc = pb->cap_seqs * 2;
        llmem_plan_seq *ns = realloc(pb->seqs, (size_t)nc * sizeof *ns);
        if (ns)
            pb->seqs = ns;
        seq_tmp *nt = realloc(pb->tmp, (size_t)nc * sizeof *nt);
        if (nt)
            pb->tmp = nt;
        if (!ns || !nt)
            return -1;
        pb->cap_seqs = nc;
    }
    int32_t k = pb->n_seqs++;
    if (k > 0 && pb->seqs[k - 1].id > s)
        pb->unsorted = true;
    pb->seqs[k] = (llmem_plan_seq){.id = s, .first_pos = pos};
    pb->tmp[k] = (seq_tmp){.set = -1, .single = -1};
    pb->map[h] = k;
    if (pb->map_bits && 2 * (int64_t)pb->n_seqs > (int64_t)mask + 1 &&
        (pb->map_bits >= 30 || !map_build(pb, pb->map_bits + 1)))
        return -1;
    *added = true;
    pb->last_id = s;
    return pb->last_k = k;
}

/* k of sequence s, which the plan already lists. */
static int32_t listed_k(const plan_build *pb, int32_t s)
{
    if (!pb->map_bits)
        return pb->map[s];
    uint32_t mask = (1u << pb->map_bits) - 1, h = llmem_plan_seq_hash(s, pb->map_bits);
    while (pb->seqs[pb->map[h]].id != s)
        h = (h + 1) & mask;
    return pb->map[h];
}

/* Whether set g holds exactly the ids of the n pairs at pk (distinct, validated). */
static bool same_set(plan_build *pb, int32_t g, const int32_t *pk, int32_t n)
{
    if (pb->sets[g].n != n)
        return false;
    uint32_t st = next_stamp(pb);
    for (int32_t j = 0; j < n; j++)
        pb->tmp[listed_k(pb, pb->ids.v[pb->sets[g].off + j])].mark = st;
    for (int32_t j = 0; j < n; j++)
        if (pb->tmp[pk[j]].mark != st)
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

/* The set of token i, whose pairs' plan indices are pk[0, n). */
static int32_t find_or_add_set(plan_build *pb, int32_t i, const int32_t *pk)
{
    int32_t n = tok_nseq(pb->b, i), *head = NULL;
    if (n == 1) {
        if (pb->tmp[pk[0]].single >= 0)
            return pb->tmp[pk[0]].single;
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
        for (int32_t g = *head; g >= 0; g = pb->chain.v[g])
            if (same_set(pb, g, pk, n))
                return g;
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
        pb->tmp[pk[0]].single = pb->n_sets;
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
    free((void *)p->seqs);
    free((void *)p->seq_tokens);
    free((void *)p->snap_at);
    free((void *)p->seq_map);
    free(p->storage); /* the sequences' tokens */
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
    if (pb->cuts) {
        cutq = calloc((size_t)ns + 1, sizeof *cutq);
        cbase = calloc((size_t)ns + 1, sizeof *cbase);
        cevery = calloc((size_t)ns + 1, sizeof *cevery);
        if (!cutq || !cbase || !cevery) {
            st = LLMEM_E_NO_MEMORY;
            goto out;
        }
        for (int32_t a = 0; a < pb->n_seqs; a++) {
            const seq_cut *t = &pb->cuts[a];
            int32_t g = pb->tmp[a].single;
            if (t->cut > 0 && g >= 0 && g < ns && t->cut < start[g + 1] - start[g]) {
                cutq[g] = start[g] + t->cut;
                cbase[g] = start[g] - t->cut_m;
                cevery[g] = t->cut_every;
            }
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

/* Checks the batch and lists its sequences (pb->seqs, first appearance
 * order; n_new and first_pos of each), every pair's k (pb->pair_k) and
 * every token's stream. */
static llmem_status validate(llmem_memory *mem, plan_build *pb, llmem_split split, char *err,
                             size_t err_len)
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
        if (pb->n_pairs > pb->cap_pairs - ns) { /* tokens in several sequences */
            if ((int64_t)pb->n_pairs + ns > INT32_MAX / 2)
                return LLMEM_E_NO_MEMORY;
            int32_t nc = 2 * (pb->n_pairs + ns);
            int32_t *v = realloc(pb->pair_k, (size_t)nc * sizeof *v);
            if (!v)
                return LLMEM_E_NO_MEMORY;
            pb->pair_k = v;
            pb->cap_pairs = nc;
        }
        int32_t off = pb->n_pairs;
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = tok_seq(b, i, j);
            if (s < 0 || s >= n_seq_max) {
                llmem_errf(err, err_len, "batch token %d: sequence id %d out of range [0, %d)", i,
                           s, n_seq_max);
                return LLMEM_E_INVALID;
            }
            bool added;
            int32_t k = seq_k(pb, s, b->pos[i], &added);
            if (k < 0)
                return LLMEM_E_NO_MEMORY;
            pb->pair_k[pb->n_pairs++] = k;
            seq_tmp *t = &pb->tmp[k];
            if (ns > 1) { /* marks, not a pairwise scan: a token may be in 4,000 sequences */
                if (j == 0)
                    next_stamp(pb);
                if (t->mark == pb->stamp) {
                    llmem_errf(err, err_len, "batch token %d: sequence id %d listed twice", i, s);
                    return LLMEM_E_INVALID;
                }
                t->mark = pb->stamp;
            }
            if (added) {
                int32_t pm = mem->iface->seq_pos_max(mem, s);
                t->next_pos = pm >= 0 && pm < INT32_MAX ? pm + 1 : b->pos[i];
            }
            if (b->pos[i] != t->next_pos) {
                llmem_errf(err, err_len,
                           "batch token %d: position %d of sequence %d does not follow its last "
                           "position (expected %d)",
                           i, b->pos[i], s, t->next_pos);
                return LLMEM_E_INVALID;
            }
            if (t->next_pos < INT32_MAX)
                t->next_pos++;
            pb->seqs[k].n_new++;
        }
        const int32_t *pk = pb->pair_k + off;
        int32_t g = find_or_add_set(pb, i, pk);
        if (g < 0)
            return LLMEM_E_NO_MEMORY;
        pb->stream[i] = g;
        for (int32_t j = 0; j < ns; j++) {
            seq_tmp *t = &pb->tmp[pk[j]];
            if (t->set >= 0 && t->set != g && split != LLMEM_SPLIT_SIMPLE) {
                llmem_errf(err, err_len,
                           "batch token %d: sequence %d appears with different sequence-id sets; "
                           "the %s split needs each sequence in one set (submit shared tokens in "
                           "their own batch, then seq_cp)",
                           i, tok_seq(b, i, j), llmem_split_name(split));
                return LLMEM_E_INVALID;
            }
            t->set = g;
        }
        pb->out[i] = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
    }
    return LLMEM_OK;
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Puts pb->seqs in increasing id order (readers walk them in the order
 * the memories always took sequences, on which slot choices depend):
 * nothing to do for a batch that lists them in order (decode steps);
 * otherwise a sort, O(sequences log sequences), and every k renamed. */
static bool sort_seqs(plan_build *pb)
{
    int32_t n = pb->n_seqs;
    if (!pb->unsorted)
        return true;
    int64_t *key = malloc((size_t)n * sizeof *key); /* id << 32 | old k */
    int32_t *nk = malloc((size_t)n * sizeof *nk);
    llmem_plan_seq *ns = malloc((size_t)pb->cap_seqs * sizeof *ns);
    seq_tmp *nt = malloc((size_t)pb->cap_seqs * sizeof *nt);
    bool ok = key && nk && ns && nt;
    if (ok) {
        for (int32_t k = 0; k < n; k++)
            key[k] = (int64_t)pb->seqs[k].id << 32 | k;
        qsort(key, (size_t)n, sizeof *key, cmp_id);
        for (int32_t k = 0; k < n; k++) {
            int32_t old = (int32_t)(key[k] & 0xffffffff);
            nk[old] = k;
            ns[k] = pb->seqs[old];
            nt[k] = pb->tmp[old];
        }
        for (int32_t q = 0; q < pb->n_pairs; q++)
            pb->pair_k[q] = nk[pb->pair_k[q]];
        free(pb->seqs);
        free(pb->tmp);
        pb->seqs = ns;
        pb->tmp = nt;
        ns = NULL;
        nt = NULL;
        ok = map_build(pb, pb->map_bits);
    }
    free(key);
    free(nk);
    free(ns);
    free(nt);
    return ok;
}

llmem_status llmem_plan_build_internal(llmem_memory *mem, const llmem_batch *b, llmem_split split,
                                       int32_t n_ubatch, llmem_plan **out, char *err,
                                       size_t err_len)
{
    llmem_status st = LLMEM_E_NO_MEMORY;
    plan_build pb = {.b = b, .n_seq_max = mem->n_seq_max, .last_id = -1};
    /* room for as many sequences as the batch can name (a decode step's
     * tokens are each in a sequence of its own), so that neither the list
     * nor the map grows while validate fills them */
    int32_t guess = b->n_tokens < mem->n_seq_max ? b->n_tokens : mem->n_seq_max, bits = 5;
    while (bits < 30 && (1 << bits) < 2 * (int64_t)guess)
        bits++;
    if (mem->n_seq_max <= 4 * (int64_t)(b->n_tokens > 16 ? b->n_tokens : 16))
        bits = 0; /* a table by id: no hashing, and as cheap to clear */
    pb.cap_seqs = guess > 16 ? guess : 16;
    int32_t *list = NULL;
    llmem_plan *p = calloc(1, sizeof *p);
    pb.seqs = malloc((size_t)pb.cap_seqs * sizeof *pb.seqs);
    pb.tmp = malloc((size_t)pb.cap_seqs * sizeof *pb.tmp);
    if (!p || !pb.seqs || !pb.tmp || !map_build(&pb, bits))
        goto fail;
    p->mem = mem;
    p->n_seq_max = mem->n_seq_max;
    if (b->n_tokens > 0) {
        pb.stream = malloc((size_t)b->n_tokens * sizeof *pb.stream);
        pb.skip = calloc((size_t)b->n_tokens, sizeof *pb.skip);
        pb.out = calloc((size_t)b->n_tokens, sizeof *pb.out);
        list = malloc((size_t)b->n_tokens * sizeof *list);
        pb.local = malloc((size_t)b->n_tokens * sizeof *pb.local); /* sets <= tokens */
        if (!pb.stream || !pb.skip || !pb.out || !list || !pb.local ||
            !(pb.pair_k = malloc((size_t)b->n_tokens * sizeof *pb.pair_k)))
            goto fail;
        memset(pb.local, 0xff, (size_t)b->n_tokens * sizeof *pb.local);
        pb.cap_pairs = b->n_tokens;
    }
    st = validate(mem, &pb, split, err, err_len);
    if (st != LLMEM_OK)
        goto fail;
    st = LLMEM_E_NO_MEMORY;
    if (!sort_seqs(&pb))
        goto fail;
    if (b->token) {
        /* one block for every sequence's tokens (p->storage), in k order */
        int32_t *blk = malloc((size_t)pb.n_pairs * sizeof *blk), at = 0;
        const int32_t **rows = malloc((size_t)pb.n_seqs * sizeof *rows);
        p->storage = blk;
        p->seq_tokens = rows;
        if (!blk || !rows)
            goto fail;
        if (pb.n_pairs == pb.n_seqs && pb.n_pairs == b->n_tokens) { /* decode: k is the place */
            for (int32_t q = 0; q < pb.n_pairs; q++) {
                rows[q] = blk + q;
                blk[pb.pair_k[q]] = b->token[q];
            }
        } else if (pb.n_seqs == 1 && pb.n_pairs == b->n_tokens) { /* one prompt */
            rows[0] = blk;
            memcpy(blk, b->token, (size_t)b->n_tokens * sizeof *blk);
        } else {
            for (int32_t k = 0; k < pb.n_seqs; k++) {
                rows[k] = blk + at;
                pb.tmp[k].next_pos = at; /* the cursor */
                at += pb.seqs[k].n_new;
            }
            for (int32_t i = 0, q = 0; i < b->n_tokens; i++)
                for (int32_t j = 0; j < tok_nseq(b, i); j++, q++)
                    blk[pb.tmp[pb.pair_k[q]].next_pos++] = b->token[i];
        }
    }
    /* the plan owns the list and the map from here on */
    p->seqs = pb.seqs;
    p->n_seqs = pb.n_seqs;
    p->seq_map = pb.map;
    p->seq_map_bits = pb.map_bits;
    pb.map = NULL;
    st = LLMEM_OK;
    if (mem->iface->prefix_match)
        st = plan_prefix_skips(mem, &pb, p);
    pb.seqs = NULL;
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
    free(pb.seqs);
    free(pb.tmp);
    free(pb.map);
    free(list);
    free(pb.stream);
    free(pb.skip);
    free(pb.out);
    free(pb.sets);
    free(pb.bucket);
    free(pb.local);
    free(pb.cuts);
    i32vec_free(&pb.chain);
    i32vec_free(&pb.ids);
    free(pb.pair_k);
    return st;
}

/* The memory reference, part 2: plans (validation, prefix hits, page
 * reservations, commit, release), predicted from the contract. Part 1
 * (memref.c) has the pages and states they work on; memref_seq.c the
 * sequence operations and state reads; part 3 (memref_data.c) the data
 * tags and checks, part 4 (memref_views.c) the views. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/memory_impl.h"
#include "support/memref_impl.h"

/* --- plans --------------------------------------------------------------------------- */

static bool has(const int32_t *v, int32_t n, int32_t x)
{
    for (int32_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

static bool same_set(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    if (na != nb)
        return false;
    for (int32_t i = 0; i < na; i++)
        if (!has(b, nb, a[i]))
            return false;
    return true;
}

static llmem_status validate(const memref *r, const llmem_batch *b, llmem_split split,
                             int32_t n_ubatch)
{
    if (n_ubatch < 1 || split < memref_split(r) || split > LLMEM_SPLIT_SEQ)
        return LLMEM_E_INVALID;
    if (b->n_tokens < 1 || b->n_tokens > 1024 || !b->pos || !b->token)
        return LLMEM_E_INVALID;
    int32_t next[MR_MAX_SEQ], set_tok[MR_MAX_SEQ];
    for (int32_t s = 0; s < r->n_seq; s++) {
        next[s] = r->seq[s].n ? memref_pos_max(r, s) + 1 : -1;
        set_tok[s] = -1;
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t ns = b->n_seq_id ? b->n_seq_id[i] : 1;
        if (ns < 1 || ns > MR_MAX_TOK_SEQ || b->pos[i] < 0 || b->pos[i] > INT32_MAX - 1)
            return LLMEM_E_INVALID;
        const int32_t *ids = b->seq_id[i];
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = ids[j];
            if (s < 0 || s >= r->n_seq || has(ids, j, s))
                return LLMEM_E_INVALID;
            if (next[s] < 0)
                next[s] = b->pos[i];
            if (b->pos[i] != next[s])
                return LLMEM_E_INVALID;
            next[s]++;
            if (split != LLMEM_SPLIT_SIMPLE && set_tok[s] >= 0) {
                int32_t k = set_tok[s];
                int32_t nk = b->n_seq_id ? b->n_seq_id[k] : 1;
                if (!same_set(ids, ns, b->seq_id[k], nk))
                    return LLMEM_E_INVALID;
            }
            set_tok[s] = i;
        }
    }
    return LLMEM_OK;
}

/* Pages and copy-on-write a KV child needs for the plan in r->plan. */
static int64_t kv_need(const mr_kv *kv, const memref *r, int32_t *need, bool *cow)
{
    int64_t total = 0;
    for (int32_t s = 0; s < r->n_seq; s++) {
        need[s] = 0;
        cow[s] = false;
        if (!r->plan.n_new[s])
            continue;
        int32_t c = r->plan.n_cached[s];
        int32_t len0 = c > 0 ? c : r->seq[s].n, nn = r->plan.n_new[s] - c;
        need[s] = mr_div_up(len0 + nn, kv->ps) - mr_div_up(len0, kv->ps);
        cow[s] = c == 0 && nn > 0 && len0 % kv->ps &&
                 !mr_kv_writable(kv, kv->tab[s].v[len0 / kv->ps]);
        total += need[s] + cow[s];
    }
    return total;
}

static void plan_reset(memref *r)
{
    mr_plan *p = &r->plan;
    p->active = false;
    p->n_tokens = 0;
    p->token.n = p->pos.n = p->nseq.n = p->out.n = 0;
    for (int32_t s = 0; s < MR_MAX_SEQ; s++) {
        p->n_new[s] = p->n_cached[s] = 0;
        p->pin[s] = -1;
        p->cached_done[s] = false;
        p->cached[s].n = 0;
    }
    p->n_committed = 0;
    p->captured = false;
}

llmem_status memref_plan(memref *r, const llmem_batch *b, llmem_split split, int32_t n_ubatch,
                         int32_t *n_cached)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (split == LLMEM_SPLIT_AUTO)
        split = memref_split(r);
    llmem_status st = validate(r, b, split, n_ubatch);
    if (st != LLMEM_OK)
        return st;
    plan_reset(r);
    mr_plan *p = &r->plan;
    p->n_tokens = b->n_tokens;
    p->split = split;
    p->n_ubatch = n_ubatch;
    int32_t *toks[MR_MAX_SEQ] = {0};
    bool shared[MR_MAX_SEQ] = {0};
    int32_t first_out[MR_MAX_SEQ], first_pos[MR_MAX_SEQ];
    for (int32_t s = 0; s < r->n_seq; s++) {
        first_out[s] = -1;
        first_pos[s] = -1;
        toks[s] = malloc((size_t)b->n_tokens * sizeof(int32_t));
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t ns = b->n_seq_id ? b->n_seq_id[i] : 1;
        bool out = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
        mr_ilist_push(&p->token, b->token[i]);
        mr_ilist_push(&p->pos, b->pos[i]);
        mr_ilist_push(&p->nseq, ns);
        mr_ilist_push(&p->out, out);
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = b->seq_id[i][j];
            p->ids[i][j] = s;
            if (first_pos[s] < 0)
                first_pos[s] = b->pos[i];
            if (out && first_out[s] < 0)
                first_out[s] = p->n_new[s];
            shared[s] |= ns > 1;
            toks[s][p->n_new[s]++] = b->token[i];
        }
    }
    /* prefix cache: empty sequences starting at 0, no shared tokens; never
     * the last token or one that needs an output; whole pages only; the
     * shortest prefix every child agrees on */
    for (int32_t s = 0; s < r->n_seq; s++) {
        int32_t n = p->n_new[s];
        if (n < 2 || first_pos[s] != 0 || r->seq[s].n || shared[s])
            continue;
        int32_t limit = first_out[s] >= 0 && first_out[s] < n - 1 ? first_out[s] : n - 1;
        int32_t m = limit, prev;
        do { /* whole pages in every child */
            prev = m;
            for (int32_t c = 0; c < r->n_ch && m > 0; c++) {
                const mr_kv *kv = &r->ch[c].kv;
                const mr_rs *rs = &r->ch[c].rs;
                int32_t k = 0;
                if (r->ch[c].cfg.kv && kv->prefix)
                    k = mr_kv_match(kv, toks[s], m, NULL) * kv->ps;
                else if (!r->ch[c].cfg.kv && rs->n_snap > 0) {
                    /* a recurrent child offers the longest snapshot */
                    int32_t i = mr_snap_longest(rs, toks[s], m);
                    k = i >= 0 ? rs->snap[i].prefix.n : 0;
                }
                m = k < m ? k : m;
            }
        } while (m != prev);
        p->n_cached[s] = m > 0 ? m : 0;
        uint64_t h = MR_H0;
        for (int32_t j = 0; j < p->n_cached[s]; j++) {
            h = memref_mix(h, toks[s][j]);
            mr_seqv_push(&p->cached[s], (mr_tok){toks[s][j], j, j, h});
        }
    }
    /* every KV child: pin the prefix pages, then check the space */
    int32_t pins[MR_MAX_CHILD][1024], n_pin[MR_MAX_CHILD] = {0};
    int32_t need[MR_MAX_CHILD][MR_MAX_SEQ];
    bool cow[MR_MAX_CHILD][MR_MAX_SEQ];
    st = LLMEM_OK;
    for (int32_t c = 0; c < r->n_ch && st == LLMEM_OK; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        for (int32_t s = 0; s < r->n_seq; s++) {
            if (!p->n_cached[s])
                continue;
            int32_t np = mr_kv_match(kv, toks[s], p->n_cached[s], pins[c] + n_pin[c]);
            for (int32_t k = 0; k < np; k++)
                mr_kv_ref(kv, pins[c][n_pin[c] + k]);
            n_pin[c] += np;
        }
        int64_t total = kv_need(kv, r, need[c], cow[c]);
        if (total > kv->n_pages - mr_kv_used(kv))
            st = LLMEM_E_NO_SPACE;
    }
    if (st != LLMEM_OK) /* a failed plan changes nothing, not even the LRU order */
        for (int32_t c = 0; c < r->n_ch; c++)
            for (int32_t k = 0; k < n_pin[c]; k++)
                r->ch[c].kv.pg[pins[c][k]].ref--;
    if (st != LLMEM_OK) {
        for (int32_t s = 0; s < r->n_seq; s++)
            free(toks[s]);
        plan_reset(r);
        return st;
    }
    /* reservations, in the order the cache makes them */
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv) {
            /* a hit's snapshot is pinned until release, and used now (LRU) */
            mr_rs *rs = &r->ch[c].rs;
            for (int32_t s = 0; s < r->n_seq && rs->n_snap > 0; s++) {
                if (!p->n_cached[s])
                    continue;
                int32_t i = mr_snap_find(rs, toks[s], p->n_cached[s]);
                if (i < 0)
                    abort(); /* the hit length is a snapshot's */
                rs->snap[i].ref++;
                rs->snap[i].lru = ++r->clock;
                p->pin[s] = i;
            }
            continue;
        }
        int32_t at = 0;
        for (int32_t s = 0; s < r->n_seq; s++) {
            if (!p->n_new[s])
                continue;
            mr_ilist *t = &kv->tab[s];
            for (int32_t k = 0; k < p->n_cached[s] / kv->ps; k++)
                mr_ilist_push(t, pins[c][at++]);
            if (cow[c][s]) { /* the page is taken now, the copy made at the first apply */
                mr_cow *w = &kv->cow[kv->n_cow++];
                *w = (mr_cow){s, r->seq[s].n / kv->ps, mr_kv_alloc(kv), r->seq[s].n, false};
            }
            for (int32_t k = 0; k < need[c][s]; k++)
                mr_ilist_push(t, mr_kv_alloc(kv));
        }
    }
    for (int32_t s = 0; s < r->n_seq; s++) {
        n_cached[s] = p->n_cached[s];
        free(toks[s]);
    }
    p->active = true;
    return LLMEM_OK;
}

/* Whether batch tokens i and k list the same set of sequences. */
static bool tok_same_set(const mr_plan *p, int32_t i, int32_t k)
{
    return same_set(p->ids[i], p->nseq.v[i], p->ids[k], p->nseq.v[k]);
}

bool memref_check_plan(const memref *r, const llmem_plan *plan, char *err, size_t n)
{
    const mr_plan *p = &r->plan;
    llmem_plan_info info;
    llmem_plan_get_info(plan, &info);
    int32_t n_ub = llmem_plan_n_ubatch(plan), seen[1024] = {0}, seen_out[1024] = {0};
    int32_t next[MR_MAX_SEQ], idx_in_seq[1024], cnt[MR_MAX_SEQ] = {0};
    int32_t n_out = 0, n_tok = 0, skipped = 0;
    for (int32_t i = 0; i < p->n_tokens; i++) {
        idx_in_seq[i] = cnt[p->ids[i][0]];
        for (int32_t j = 0; j < p->nseq.v[i]; j++)
            cnt[p->ids[i][j]]++;
    }
    for (int32_t s = 0; s < r->n_seq; s++) {
        next[s] = -1;
        skipped += p->n_cached[s];
    }
    for (int32_t u = 0; u < n_ub; u++) {
        const llmem_ubatch *ub = llmem_plan_ubatch(plan, u);
        if (!ub || ub->n_tokens < 1 || ub->n_tokens > p->n_ubatch || ub->split != p->split)
            return mr_fail(err, n, "ubatch %d: %d tokens (n_ubatch %d), split %d", u,
                       ub ? ub->n_tokens : -1, p->n_ubatch, ub ? (int)ub->split : -1);
        if (p->split == LLMEM_SPLIT_SIMPLE ? ub->n_seq_tokens != 0
                                           : (ub->n_tokens != ub->n_seqs * ub->n_seq_tokens ||
                                              (p->split == LLMEM_SPLIT_SEQ && ub->n_seqs != 1)))
            return mr_fail(err, n, "ubatch %d: %d tokens is not %d streams x %d", u, ub->n_tokens,
                       ub->n_seqs, ub->n_seq_tokens);
        for (int32_t k = 0; k < ub->n_tokens; k++) {
            int32_t i = ub->batch_idx[k], s = ub->seq[k];
            if (i < 0 || i >= p->n_tokens || seen[i]++ || ub->token[k] != p->token.v[i] ||
                ub->pos[k] != p->pos.v[i])
                return mr_fail(err, n, "ubatch %d token %d: batch index %d wrong or repeated", u, k,
                           i);
            if (s < 0 || s >= ub->n_seqs ||
                (p->split != LLMEM_SPLIT_SIMPLE && s != k / ub->n_seq_tokens))
                return mr_fail(err, n, "ubatch %d token %d: stream %d", u, k, s);
            if (!has(p->ids[i], p->nseq.v[i], ub->seq_id[s]))
                return mr_fail(err, n, "ubatch %d token %d: stream sequence %d not among the "
                                   "token's", u, k, ub->seq_id[s]);
            /* equal/seq: a stream is one sequence-id set */
            if (p->split != LLMEM_SPLIT_SIMPLE &&
                !tok_same_set(p, i, ub->batch_idx[s * ub->n_seq_tokens]))
                return mr_fail(err, n, "ubatch %d token %d: not the sequence-id set of its stream",
                           u, k);
            for (int32_t j = 0; j < p->nseq.v[i]; j++) {
                int32_t q = p->ids[i][j];
                if (next[q] >= 0 && p->pos.v[i] != next[q])
                    return mr_fail(err, n, "sequence %d: position %d out of order", q, p->pos.v[i]);
                next[q] = p->pos.v[i] + 1;
            }
            if (p->nseq.v[i] == 1 && idx_in_seq[i] < p->n_cached[p->ids[i][0]])
                return mr_fail(err, n, "ubatch %d: batch token %d is served by the prefix cache", u,
                           i);
        }
        for (int32_t j = 0; j < ub->n_outputs; j++) {
            int32_t i = ub->out_ids[j], row = ub->out_rows[j];
            if (row < 0 || row >= ub->n_tokens || i < 0 || i >= p->n_tokens || seen_out[i]++ ||
                ub->batch_idx[row] != i || !p->out.v[i])
                return mr_fail(err, n, "ubatch %d output %d: row %d, batch token %d", u, j, row, i);
        }
        n_out += ub->n_outputs;
        n_tok += ub->n_tokens;
    }
    int32_t want_out = 0;
    for (int32_t i = 0; i < p->n_tokens; i++)
        want_out += p->out.v[i] != 0;
    if (n_out != want_out || info.n_outputs != want_out)
        return mr_fail(err, n, "%d output rows (info %d), expected %d", n_out, info.n_outputs,
                   want_out);
    if (n_tok + skipped != p->n_tokens || info.n_tokens != n_tok ||
        info.n_tokens_cached != skipped || info.n_ubatch != n_ub)
        return mr_fail(err, n, "the plan covers %d + %d cached of %d tokens", n_tok, skipped,
                   p->n_tokens);
    /* the plan's sequence list (llmem_plan.seqs) against the batch: one
     * entry per sequence it appends to, in id order, found by its id */
    int32_t n_listed = 0;
    for (int32_t s = 0; s < r->n_seq; s++) {
        const llmem_plan_seq *e = llmem_plan_seq_find(plan, s);
        if (!e != !p->n_new[s] || (e && (e->id != s || e->n_new != p->n_new[s] ||
                                         e->n_cached != p->n_cached[s])))
            return mr_fail(err, n,
                           "sequence %d: plan entry %s (%d new, %d cached), expected %d new, "
                           "%d cached",
                           s, e ? "found" : "missing", e ? e->n_new : 0, e ? e->n_cached : 0,
                           p->n_new[s], p->n_cached[s]);
        n_listed += e != NULL;
        for (int32_t i = 0, m = 0; e && i < p->n_tokens; i++)
            if (has(p->ids[i], p->nseq.v[i], s)) {
                if ((m == 0 && e->first_pos != p->pos.v[i]) ||
                    (plan->seq_tokens &&
                     plan->seq_tokens[e - plan->seqs][m] != p->token.v[i]))
                    return mr_fail(err, n,
                                   "sequence %d: plan entry's token %d (position %d) is not "
                                   "batch token %d's",
                                   s, m, e->first_pos + m, i);
                m++;
            }
    }
    if (plan->n_seqs != n_listed)
        return mr_fail(err, n, "the plan lists %d sequences, the batch names %d", plan->n_seqs,
                       n_listed);
    for (int32_t k = 1; k < plan->n_seqs; k++)
        if (plan->seqs[k - 1].id >= plan->seqs[k].id)
            return mr_fail(err, n, "plan sequences %d and %d out of id order", k - 1, k);
    return true;
}

/* Appends a token to seq in every child (the cache's commit). */
static void push_token(memref *r, int32_t seq, mr_tok t)
{
    mr_seqv *s = &r->seq[seq];
    mr_seqv_push(s, t);
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        mr_page *pg = &kv->pg[kv->tab[seq].v[(s->n - 1) / kv->ps]];
        pg->hashed = false; /* a page written to is no longer what it was hashed as */
        if (s->n % kv->ps == 0)
            mr_kv_publish(kv, s, seq, s->n / kv->ps - 1);
    }
}

void memref_commit(memref *r, const llmem_ubatch *ub)
{
    mr_plan *p = &r->plan;
    /* recurrent children: the states after this ubatch */
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv)
            continue;
        for (int32_t k = 0; k < ch->n_str; k++) {
            const mr_stream *x = &ch->str[k];
            mr_hold add[MR_MAX_HOLD], out[2 * MR_MAX_HOLD];
            int32_t n_add = 0;
            for (int32_t j = 0; j < x->c; j++)
                add[n_add++] = (mr_hold){x->L + x->T - x->c + j, x->ckpt[j]};
            add[n_add++] = (mr_hold){x->L + x->T, x->dst};
            int32_t n = mr_rs_after(&ch->rs, x->primary, add, n_add, out);
            memcpy(ch->rs.h[x->primary], out, (size_t)n * sizeof *out);
            ch->rs.nh[x->primary] = n;
            for (int32_t m = 0; m < x->n_ids; m++) {
                int32_t b = x->ids[m];
                if (b == x->primary)
                    continue;
                /* a copy of the primary's final state, in a slot of its own */
                ch->rs.h[b][0] = (mr_hold){r->seq[b].n + x->T,
                                           llmem_recurrent_seq_slot(ch->mem, b)};
                ch->rs.nh[b] = 1;
            }
        }
    }
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        int32_t i = ub->batch_idx[k];
        for (int32_t j = 0; j < p->nseq.v[i]; j++) {
            int32_t q = p->ids[i][j];
            if (p->n_cached[q] > 0 && !p->cached_done[q]) {
                for (int32_t m = 0; m < p->cached[q].n; m++)
                    mr_seqv_push(&r->seq[q], p->cached[q].v[m]);
                for (int32_t c = 0; c < r->n_ch; c++)
                    if (r->ch[c].cfg.kv)
                        r->ch[c].kv.hits += p->n_cached[q];
                    else
                        r->ch[c].rs.snap_hits += p->n_cached[q];
                p->cached_done[q] = true;
            }
            mr_tok t = {p->token.v[i], p->pos.v[i], p->pos.v[i],
                        memref_mix(mr_last_h(&r->seq[q]), p->token.v[i])};
            push_token(r, q, t);
        }
    }
    if (p->n_committed == 0) {
        /* every pending K-shift was applied by this ubatch */
        for (int32_t s = 0; s < r->n_seq; s++)
            for (int32_t j = 0; j < r->seq[s].n; j++)
                r->seq[s].v[j].kpos = r->seq[s].v[j].pos;
        for (int32_t c = 0; c < r->n_ch; c++)
            for (int32_t a = 0; a < r->ch[c].kv.n_pg; a++)
                r->ch[c].kv.pg[a].shift = false;
    }
    /* snapshots: each stream's new state, in stream order, after the write */
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv || ch->rs.n_snap == 0)
            continue;
        for (int32_t k = 0; k < ch->n_str; k++)
            mr_snap_publish(r, &ch->rs, ch->str[k].primary, ch->str[k].L + ch->str[k].T);
    }
    p->n_committed++;
    p->captured = false;
}

void mr_apply_cows(memref *r)
{
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        for (int32_t k = 0; k < kv->n_cow; k++) {
            mr_cow *w = &kv->cow[k];
            if (w->applied)
                continue;
            int32_t *e = &kv->tab[w->seq].v[w->index], old = *e;
            kv->pg[w->page].shift = kv->pg[old].shift;
            *e = w->page;
            w->page = old; /* held until release */
            w->applied = true;
            kv->cows++;
        }
    }
}

void memref_release(memref *r, bool applied)
{
    mr_plan *p = &r->plan;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            /* the page not in the table goes: the copy when never applied
             * or when nothing was committed to the sequence (the old page
             * comes back), else the old page */
            for (int32_t k = 0; k < ch->kv.n_cow; k++) {
                mr_cow *w = &ch->kv.cow[k];
                if (w->applied && r->seq[w->seq].n == w->len0) {
                    int32_t *e = &ch->kv.tab[w->seq].v[w->index], copy = *e;
                    *e = w->page;
                    w->page = copy;
                    ch->kv.cows--; /* a copy given back is not counted */
                }
                mr_kv_unref(&ch->kv, w->page);
            }
            ch->kv.n_cow = 0;
            for (int32_t s = 0; s < r->n_seq; s++)
                if (p->n_new[s])
                    mr_kv_drop_from(&ch->kv, s, mr_div_up(r->seq[s].n, ch->kv.ps));
            continue;
        }
        /* the plan's snapshots: unpinned, used now; what it pinned past the
         * budget goes */
        if (ch->rs.n_snap > 0) {
            for (int32_t s = 0; s < r->n_seq; s++) {
                mr_snap *q = p->pin[s] >= 0 ? &ch->rs.snap[p->pin[s]] : NULL;
                if (!q)
                    continue;
                q->ref--;
                if (q->live)
                    q->lru = ++r->clock;
            }
            mr_budget_room(r, 0);
        }
        if (!applied || !p->captured)
            continue;
        /* states whose slots the applied ubatch writes are gone; the
         * current state of every sequence stays */
        for (int32_t s = 0; s < r->n_seq; s++) {
            mr_rs *rs = &ch->rs;
            int32_t n = 0;
            for (int32_t i = 0; i < rs->nh[s]; i++) {
                const mr_hold *h = &rs->h[s][i];
                bool written = false;
                for (int32_t k = 0; k < ch->n_str && !written; k++) {
                    written = ch->str[k].dst == h->slot;
                    for (int32_t j = 0; j < ch->str[k].c && !written; j++)
                        written = ch->str[k].ckpt[j] == h->slot;
                }
                if (!written || h->len == r->seq[s].n)
                    rs->h[s][n++] = *h;
            }
            rs->nh[s] = n;
        }
    }
    plan_reset(r);
}

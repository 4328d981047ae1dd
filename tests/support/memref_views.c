/* The memory reference, part 4: the views of an applied ubatch checked
 * against the reference (memref_capture): every view table's device copy
 * equals its host copy, KV page tables, sequence lengths and store slots
 * (physical pages learned here, then held to), and recurrent source and
 * destination state slots with their checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "support/memref_impl.h"

static bool grow(void **p, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    int32_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elem);
    if (!np)
        return false;
    *p = np;
    *cap = nc;
    return true;
}

/* The device copy of a view table equals its host copy. */
static bool table_ok(const llmem_view *v, const llmem_i32_table *t, const char *name, char *err,
                     size_t n)
{
    if (t->n == 0)
        return true;
    if (!t->host)
        return mr_fail(err, n, "view table %s: %d entries, no host copy", name, t->n);
    int32_t *dev = malloc((size_t)t->n * sizeof *dev);
    bool ok = dev && llmem_buffer_download(v->idx, t->offset, dev, (size_t)t->n * sizeof *dev) ==
                         LLMEM_OK &&
              memcmp(dev, t->host, (size_t)t->n * sizeof *dev) == 0;
    free(dev);
    return ok ? true : mr_fail(err, n, "view table %s: device copy differs from host copy", name);
}

static int cmp_pair(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* --- capture: views of the applied ubatch -------------------------------------------- */

static bool capture_kv(memref *r, mr_child *ch, int32_t c, const llmem_ubatch *ub, int32_t u,
                       char *err, size_t n)
{
    mr_kv *kv = &ch->kv;
    int32_t ps = kv->ps, len[MR_MAX_SEQ];
    uint64_t h[MR_MAX_SEQ];
    for (int32_t s = 0; s < r->n_seq; s++)
        mr_seq_head(r, s, &len[s], &h[s]);
    ch->n_st = 0;
    int32_t *kv_len = malloc((size_t)ub->n_tokens * sizeof *kv_len);
    if (!kv_len)
        return mr_fail(err, n, "out of memory");
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        const int32_t *ids;
        int32_t ns = mr_plan_ids(r, ub->batch_idx[k], &ids);
        for (int32_t j = 0; j < ns; j++) {
            int32_t q = ids[j];
            if (len[q] / ps >= kv->tab[q].n) {
                free(kv_len);
                return mr_fail(err, n, "child %d: sequence %d has no page reserved for token %d", c,
                               q, len[q]);
            }
            if (!grow((void **)&ch->st, &ch->cap_st, ch->n_st + 1, sizeof *ch->st))
                abort();
            h[q] = memref_mix(h[q], ub->token[k]);
            ch->st[ch->n_st++] = (mr_store){k, mr_phys(kv, q, len[q] / ps) * ps + len[q] % ps, q,
                                            h[q], ub->pos[k]};
            len[q]++;
        }
        kv_len[k] = len[ub->seq_id[ub->seq[k]]];
    }
    /* expected K-shifts: every held key whose rotation is behind its position */
    int32_t n_pend = 0, *pend = NULL, cap_pend = 0;
    for (int32_t s = 0; s < r->n_seq && u == 0; s++)
        for (int32_t j = 0; j < r->seq[s].n; j++) {
            const mr_tok *t = &r->seq[s].v[j];
            if (t->pos == t->kpos)
                continue;
            if (!grow((void **)&pend, &cap_pend, 2 * n_pend + 2, sizeof *pend))
                abort();
            pend[2 * n_pend] = mr_phys(kv, s, j / ps) * ps + j % ps;
            pend[2 * n_pend + 1] = t->pos - t->kpos;
            n_pend++;
        }
    bool ok = true;
    int32_t *pairs = malloc((size_t)(2 * ch->n_st + 2) * sizeof *pairs);
    int32_t *want = malloc((size_t)(2 * ch->n_st + 2) * sizeof *want);
    if (!pairs || !want)
        abort();
    for (int32_t li = 0; ok && li < ch->n_layers; li++) {
        llmem_view v;
        int32_t il = ch->layer[li];
        if (llmem_memory_view(r->mem, il, &v) != LLMEM_OK || v.kind != LLMEM_VIEW_KV) {
            ok = mr_fail(err, n, "layer %d: no KV view", il);
            break;
        }
        const llmem_kv_view *x = llmem_view_kv(&v);
        if (x->k != kv->k[li] || x->v != kv->v[li] || x->page_size != ps ||
            x->n_pages != kv->n_pages) {
            ok = mr_fail(err, n, "layer %d: view pools or geometry changed", il);
            break;
        }
        /* every table's device copy equals its host copy: with page rows,
         * the whole persistent table of every sequence (issue 10) */
        const llmem_i32_table *tabs[] = {&x->store_tok, &x->store_slot, &x->page_table,
                                         &x->seq_len, &x->tok_kv_len, &x->tok_seq,
                                         &x->shift_slot, &x->shift_delta, &x->page_off};
        const char *names[] = {"store_tok", "store_slot", "page_table", "seq_len",
                               "tok_kv_len", "tok_seq", "shift_slot", "shift_delta",
                               "page_off"};
        for (int32_t t = 0; ok && t < 9; t++)
            ok = table_ok(&v, tabs[t], names[t], err, n);
        if (!ok)
            break;
        /* stores: one per (token, sequence), in the sequence's next slot */
        if (x->store_tok.n != ch->n_st || x->store_slot.n != ch->n_st) {
            ok = mr_fail(err, n, "layer %d: %d stores, expected %d", il, x->store_tok.n, ch->n_st);
            break;
        }
        for (int32_t j = 0; j < ch->n_st; j++) {
            pairs[2 * j] = x->store_tok.host[j];
            pairs[2 * j + 1] = x->store_slot.host[j];
            want[2 * j] = ch->st[j].tok;
            want[2 * j + 1] = ch->st[j].slot;
        }
        qsort(pairs, (size_t)ch->n_st, 2 * sizeof *pairs, cmp_pair);
        qsort(want, (size_t)ch->n_st, 2 * sizeof *want, cmp_pair);
        for (int32_t j = 0; ok && j < ch->n_st; j++)
            if (pairs[2 * j] != want[2 * j] || pairs[2 * j + 1] != want[2 * j + 1])
                ok = mr_fail(err, n, "layer %d: store (token %d -> slot %d), expected (%d -> %d)",
                             il, pairs[2 * j], pairs[2 * j + 1], want[2 * j], want[2 * j + 1]);
        /* attention tables */
        if (ok && (x->tok_seq.n != ub->n_tokens || x->tok_kv_len.n != ub->n_tokens ||
                   x->seq_len.n != ub->n_seqs))
            ok = mr_fail(err, n, "layer %d: table sizes", il);
        for (int32_t k = 0; ok && k < ub->n_tokens; k++)
            if (x->tok_seq.host[k] != ub->seq[k] || x->tok_kv_len.host[k] != kv_len[k])
                ok = mr_fail(err, n, "layer %d token %d: tok_seq %d tok_kv_len %d, expected %d %d",
                             il, k, x->tok_seq.host[k], x->tok_kv_len.host[k], ub->seq[k],
                             kv_len[k]);
        int32_t max_pages = 0;
        for (int32_t s = 0; ok && s < ub->n_seqs; s++) {
            int32_t q = ub->seq_id[s];
            if (x->seq_len.host[s] != len[q])
                ok = mr_fail(err, n, "layer %d stream %d: seq_len %d, expected %d", il, s,
                             x->seq_len.host[s], len[q]);
            max_pages = mr_div_up(len[q], ps) > max_pages ? mr_div_up(len[q], ps) : max_pages;
        }
        /* dense rows (s * max_pages, padded with -1) or rows at page_off[s]
         * (entries past the stream's pages unspecified) */
        bool rows = x->page_off.n != 0;
        if (ok && (x->max_pages != max_pages ||
                   (rows ? x->page_off.n != ub->n_seqs
                         : x->page_table.n != ub->n_seqs * max_pages)))
            ok = mr_fail(err, n, "layer %d: max_pages %d (table %d, %d rows), expected %d", il,
                         x->max_pages, x->page_table.n, x->page_off.n, max_pages);
        for (int32_t s = 0; ok && s < ub->n_seqs; s++) {
            int32_t q = ub->seq_id[s], np = mr_div_up(len[q], ps);
            int64_t row = rows ? x->page_off.host[s] : (int64_t)s * max_pages;
            if (row < 0 || row + (rows ? np : max_pages) > x->page_table.n) {
                ok = mr_fail(err, n,
                             "layer %d stream %d: row %lld of %d pages outside the %d-entry table",
                             il, s, (long long)row, np, x->page_table.n);
                break;
            }
            for (int32_t k = 0; ok && k < (rows ? np : max_pages); k++) {
                int32_t w = k < np ? mr_phys(kv, q, k) : -1;
                if (x->page_table.host[row + k] != w)
                    ok = mr_fail(err, n, "layer %d stream %d: page %d is %d, expected %d", il, s, k,
                                 x->page_table.host[row + k], w);
            }
        }
        /* K-shifts: in the first ubatch, every pending key once with its delta */
        if (ok && x->shift_slot.n != x->shift_delta.n)
            ok = mr_fail(err, n, "layer %d: shift tables differ in size", il);
        if (ok && u > 0 && x->shift_slot.n)
            ok = mr_fail(err, n, "layer %d: K-shift listed in ubatch %d", il, u);
        for (int32_t k = 0; ok && k < n_pend; k++) {
            int32_t hits = 0;
            for (int32_t m = 0; m < x->shift_slot.n; m++)
                hits += x->shift_slot.host[m] == pend[2 * k] &&
                        x->shift_delta.host[m] == pend[2 * k + 1];
            if (hits != 1)
                ok = mr_fail(err, n, "layer %d: slot %d should shift by %d once (listed %d times)",
                             il, pend[2 * k], pend[2 * k + 1], hits);
        }
        /* every listed slot that holds a key is one of those */
        for (int32_t m = 0; ok && m < x->shift_slot.n; m++) {
            int32_t slot = x->shift_slot.host[m];
            for (int32_t s = 0; ok && s < r->n_seq; s++)
                for (int32_t j = 0; ok && j < r->seq[s].n; j++)
                    if (mr_phys(kv, s, j / ps) * ps + j % ps == slot &&
                        x->shift_delta.host[m] != r->seq[s].v[j].pos - r->seq[s].v[j].kpos)
                        ok = mr_fail(err, n, "layer %d: slot %d (seq %d token %d) shifted by %d",
                                     il, slot, s, j, x->shift_delta.host[m]);
        }
        if (ok && li == 0) {
            ch->n_shift = x->shift_slot.n;
            if (ch->n_shift > ch->cap_shift) {
                ch->cap_shift = ch->n_shift;
                ch->shift_slot = realloc(ch->shift_slot, (size_t)ch->cap_shift * sizeof(int32_t));
                ch->shift_delta = realloc(ch->shift_delta, (size_t)ch->cap_shift * sizeof(int32_t));
                if (!ch->shift_slot || !ch->shift_delta)
                    abort();
            }
            if (ch->n_shift) {
                memcpy(ch->shift_slot, x->shift_slot.host, (size_t)ch->n_shift * sizeof(int32_t));
                memcpy(ch->shift_delta, x->shift_delta.host, (size_t)ch->n_shift * sizeof(int32_t));
            }
        }
    }
    free(pairs);
    free(want);
    free(pend);
    free(kv_len);
    return ok;
}

static int32_t hold_slot(const mr_rs *rs, int32_t seq, int32_t len)
{
    for (int32_t i = 0; i < rs->nh[seq]; i++)
        if (rs->h[seq][i].len == len)
            return rs->h[seq][i].slot;
    return -2;
}

static bool capture_rs(memref *r, mr_child *ch, int32_t c, const llmem_ubatch *ub, char *err,
                       size_t n)
{
    mr_rs *rs = &ch->rs;
    int32_t T = ub->n_seq_tokens, cc = T - 1 < rs->n_ckpt ? T - 1 : rs->n_ckpt;
    if (T < 1 || ub->n_tokens != ub->n_seqs * T)
        return mr_fail(err, n, "recurrent ubatch is not equal-split (%d tokens, %d x %d)",
                       ub->n_tokens, ub->n_seqs, T);
    if (!grow((void **)&ch->str, &ch->cap_str, ub->n_seqs, sizeof *ch->str))
        abort();
    ch->n_str = ub->n_seqs;
    for (int32_t s = 0; s < ub->n_seqs; s++) {
        mr_stream *x = &ch->str[s];
        const int32_t *ids;
        x->n_ids = mr_plan_ids(r, ub->batch_idx[s * T], &ids);
        memcpy(x->ids, ids, (size_t)x->n_ids * sizeof *ids);
        x->primary = ub->seq_id[s];
        mr_seq_head(r, x->primary, &x->L, &x->h0);
        x->T = T;
        x->c = cc;
        x->src = x->L > 0 ? hold_slot(rs, x->primary, x->L) : -1;
        /* a prefix hit reads its snapshot's slot in place */
        x->snap = r->seq[x->primary].n == 0 && x->L > 0 ? r->plan.pin[x->primary] : -1;
        if (x->snap >= 0)
            x->src = rs->snap[x->snap].slot; /* -1: learned below */
    }
    for (int32_t li = 0; li < ch->n_layers; li++) {
        llmem_view v;
        int32_t il = ch->layer[li];
        if (llmem_memory_view(r->mem, il, &v) != LLMEM_OK || v.kind != LLMEM_VIEW_RECURRENT)
            return mr_fail(err, n, "layer %d: no recurrent view", il);
        const llmem_rs_view *x = llmem_view_rs(&v);
        bool same = x->n_states == rs->n_states && x->n_slots == rs->n_slots;
        for (int32_t j = 0; same && j < rs->n_states; j++)
            same = x->state[j] == rs->buf[li][j];
        if (!same)
            return mr_fail(err, n, "layer %d: recurrent view buffers or slot count changed", il);
        /* checkpoint entry j is the state after token T - vc + j (ops.h); the
         * last one (vc = cc + 1) is the dst state and stays -1 */
        int32_t vc = cc > 0 ? cc + 1 : 0;
        if (x->n_seqs != ub->n_seqs || x->n_seq_tokens != T || x->n_ckpt != vc ||
            x->src_slot.n != ub->n_seqs || x->dst_slot.n != ub->n_seqs ||
            x->ckpt_slot.n != ub->n_seqs * vc)
            return mr_fail(err, n, "layer %d: recurrent view has %d x %d tokens, %d checkpoints; "
                                   "expected %d x %d, %d",
                           il, x->n_seqs, x->n_seq_tokens, x->n_ckpt, ub->n_seqs, T, vc);
        if (!table_ok(&v, &x->src_slot, "src_slot", err, n) ||
            !table_ok(&v, &x->dst_slot, "dst_slot", err, n) ||
            !table_ok(&v, &x->ckpt_slot, "ckpt_slot", err, n))
            return false;
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            mr_stream *y = &ch->str[s];
            if (y->snap >= 0 && y->src < 0) {
                /* a snapshot slot no other live snapshot is known to hold */
                int32_t got = x->src_slot.host[s];
                bool taken = false;
                for (int32_t i = 0; i < rs->n_snap; i++)
                    taken |= i != y->snap && rs->snap[i].live && rs->snap[i].slot == got;
                if (got < rs->n_seq_slots || got >= rs->n_slots || taken)
                    return mr_fail(err, n, "layer %d stream %d (seq %d): a hit of %d tokens reads "
                                           "slot %d, not a snapshot slot of its own",
                                   il, s, y->primary, y->L, got);
                y->src = rs->snap[y->snap].slot = got;
            }
            if (x->src_slot.host[s] != y->src)
                return mr_fail(err, n, "layer %d stream %d (seq %d, %d tokens): src slot %d, "
                                       "expected %d",
                               il, s, y->primary, y->L, x->src_slot.host[s], y->src);
            if (vc && x->ckpt_slot.host[s * vc + cc] != -1)
                return mr_fail(err, n, "layer %d stream %d: the last checkpoint entry (the dst "
                                       "state) is %d, not -1",
                               il, s, x->ckpt_slot.host[s * vc + cc]);
            if (li == 0) {
                y->dst = x->dst_slot.host[s];
                for (int32_t j = 0; j < cc; j++)
                    y->ckpt[j] = x->ckpt_slot.host[s * vc + j];
            } else if (y->dst != x->dst_slot.host[s] ||
                       (cc && memcmp(y->ckpt, x->ckpt_slot.host + s * vc,
                                     (size_t)cc * sizeof(int32_t)) != 0)) {
                return mr_fail(err, n, "layer %d: destination slots differ between layers", il);
            }
        }
    }
    /* written slots: distinct, in range, and none holds a state that
     * survives this ubatch */
    int32_t nw = 0, w[MR_MAX_SEQ * MR_MAX_HOLD];
    for (int32_t s = 0; s < ch->n_str; s++) {
        w[nw++] = ch->str[s].dst;
        for (int32_t j = 0; j < cc; j++)
            w[nw++] = ch->str[s].ckpt[j];
    }
    for (int32_t i = 0; i < nw; i++) {
        if (w[i] < 0 || w[i] >= rs->n_seq_slots) /* snapshots are written by commits only */
            return mr_fail(err, n, "child %d: destination slot %d out of range", c, w[i]);
        for (int32_t k = 0; k < i; k++)
            if (w[k] == w[i])
                return mr_fail(err, n, "child %d: slot %d written twice by one ubatch", c, w[i]);
    }
    for (int32_t q = 0; q < r->n_seq; q++) {
        mr_hold surv[2 * MR_MAX_HOLD];
        int32_t ns = rs->nh[q];
        memcpy(surv, rs->h[q], (size_t)ns * sizeof *surv);
        for (int32_t s = 0; s < ch->n_str; s++) {
            const mr_stream *y = &ch->str[s];
            bool member = false;
            for (int32_t m = 0; m < y->n_ids; m++)
                member |= y->ids[m] == q;
            if (member && y->primary != q)
                ns = 0;
            if (y->primary == q) {
                mr_hold add[MR_MAX_HOLD];
                int32_t na = 0;
                for (int32_t j = 0; j < cc; j++)
                    add[na++] = (mr_hold){y->L + T - cc + j, y->ckpt[j]};
                add[na++] = (mr_hold){y->L + T, y->dst};
                ns = mr_rs_after(rs, q, add, na, surv);
                int32_t k = 0;
                for (int32_t i = 0; i < ns; i++)
                    if (surv[i].len <= y->L)
                        surv[k++] = surv[i];
                ns = k;
            }
        }
        for (int32_t i = 0; i < ns; i++)
            for (int32_t k = 0; k < nw; k++)
                if (surv[i].slot == w[k])
                    return mr_fail(err, n, "child %d: the ubatch writes slot %d, which holds the "
                                           "state of sequence %d after %d tokens (kept)",
                                   c, w[k], q, surv[i].len);
    }
    return true;
}

bool memref_capture(memref *r, const llmem_ubatch *ub, int32_t u, char *err, size_t n)
{
    mr_apply_cows(r);
    if (!memref_bind(r, err, n))
        return false;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        bool ok = ch->cfg.kv ? capture_kv(r, ch, c, ub, u, err, n)
                             : capture_rs(r, ch, c, ub, err, n);
        if (!ok)
            return false;
    }
    r->plan.captured = true;
    return true;
}

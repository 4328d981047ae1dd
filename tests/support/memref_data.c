/* The memory reference, part 3: views of a ubatch checked against the
 * reference, the emulated forward pass that writes a tag into every slot
 * it stores (K/V rows, recurrent states), and the checks after every step
 * (page tables, slots, tokens, positions, stats, checkpoints, data).
 *
 * Tag of a K row: (history hash of the token, the position its key was
 * rotated for, salt of child/layer/K); V row: (hash ^ V_XOR, 0, salt);
 * recurrent state: (history hash after `len` tokens, len, salt of
 * child/layer/state). A K-shift in a view adds its delta to the position
 * field, the way RoPE re-rotation moves a key. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memref_impl.h"

#define V_XOR 0x5bd1e9955bd1e995ull
#define TAG_BYTES 16

static bool fail(char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return false;
}

static uint32_t salt_kv(int32_t c, int32_t li, int32_t is_v)
{
    return 0x4b000000u | (uint32_t)c << 12 | (uint32_t)li << 4 | (uint32_t)is_v;
}

static uint32_t salt_rs(int32_t c, int32_t li, int32_t j)
{
    return 0x53000000u | (uint32_t)c << 12 | (uint32_t)li << 4 | (uint32_t)j;
}

static void tag_put(uint8_t *row, uint64_t h, int32_t a, uint32_t salt)
{
    memcpy(row, &h, 8);
    memcpy(row + 8, &a, 4);
    memcpy(row + 12, &salt, 4);
}

static bool tag_eq(const uint8_t *row, uint64_t h, int32_t a, uint32_t salt)
{
    uint8_t want[TAG_BYTES];
    tag_put(want, h, a, salt);
    return memcmp(row, want, TAG_BYTES) == 0;
}

static void tag_get(const uint8_t *row, uint64_t *h, int32_t *a, uint32_t *salt)
{
    memcpy(h, row, 8);
    memcpy(a, row + 8, 4);
    memcpy(salt, row + 12, 4);
}

static uint64_t h_at(const memref *r, int32_t seq, int32_t len)
{
    return len > 0 ? r->seq[seq].v[len - 1].h : MR_H0;
}

static int32_t div_up(int32_t a, int32_t b)
{
    return (a + b - 1) / b;
}

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
        return fail(err, n, "view table %s: %d entries, no host copy", name, t->n);
    int32_t *dev = malloc((size_t)t->n * sizeof *dev);
    bool ok = dev && llmem_buffer_download(v->idx, t->offset, dev, (size_t)t->n * sizeof *dev) ==
                         LLMEM_OK &&
              memcmp(dev, t->host, (size_t)t->n * sizeof *dev) == 0;
    free(dev);
    return ok ? true : fail(err, n, "view table %s: device copy differs from host copy", name);
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
        return fail(err, n, "out of memory");
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        const int32_t *ids;
        int32_t ns = mr_plan_ids(r, ub->batch_idx[k], &ids);
        for (int32_t j = 0; j < ns; j++) {
            int32_t q = ids[j];
            if (len[q] / ps >= kv->tab[q].n) {
                free(kv_len);
                return fail(err, n, "child %d: sequence %d has no page reserved for token %d", c,
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
            ok = fail(err, n, "layer %d: no KV view", il);
            break;
        }
        const llmem_kv_view *x = llmem_view_kv(&v);
        if (x->k != kv->k[li] || x->v != kv->v[li] || x->page_size != ps ||
            x->n_pages != kv->n_pages) {
            ok = fail(err, n, "layer %d: view pools or geometry changed", il);
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
            ok = fail(err, n, "layer %d: %d stores, expected %d", il, x->store_tok.n, ch->n_st);
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
                ok = fail(err, n, "layer %d: store (token %d -> slot %d), expected (%d -> %d)",
                          il, pairs[2 * j], pairs[2 * j + 1], want[2 * j], want[2 * j + 1]);
        /* attention tables */
        if (ok && (x->tok_seq.n != ub->n_tokens || x->tok_kv_len.n != ub->n_tokens ||
                   x->seq_len.n != ub->n_seqs))
            ok = fail(err, n, "layer %d: table sizes", il);
        for (int32_t k = 0; ok && k < ub->n_tokens; k++)
            if (x->tok_seq.host[k] != ub->seq[k] || x->tok_kv_len.host[k] != kv_len[k])
                ok = fail(err, n, "layer %d token %d: tok_seq %d tok_kv_len %d, expected %d %d",
                          il, k, x->tok_seq.host[k], x->tok_kv_len.host[k], ub->seq[k],
                          kv_len[k]);
        int32_t max_pages = 0;
        for (int32_t s = 0; ok && s < ub->n_seqs; s++) {
            int32_t q = ub->seq_id[s];
            if (x->seq_len.host[s] != len[q])
                ok = fail(err, n, "layer %d stream %d: seq_len %d, expected %d", il, s,
                          x->seq_len.host[s], len[q]);
            max_pages = div_up(len[q], ps) > max_pages ? div_up(len[q], ps) : max_pages;
        }
        /* dense rows (s * max_pages, padded with -1) or rows at page_off[s]
         * (entries past the stream's pages unspecified) */
        bool rows = x->page_off.n != 0;
        if (ok && (x->max_pages != max_pages ||
                   (rows ? x->page_off.n != ub->n_seqs
                         : x->page_table.n != ub->n_seqs * max_pages)))
            ok = fail(err, n, "layer %d: max_pages %d (table %d, %d rows), expected %d", il,
                      x->max_pages, x->page_table.n, x->page_off.n, max_pages);
        for (int32_t s = 0; ok && s < ub->n_seqs; s++) {
            int32_t q = ub->seq_id[s], np = div_up(len[q], ps);
            int64_t row = rows ? x->page_off.host[s] : (int64_t)s * max_pages;
            if (row < 0 || row + (rows ? np : max_pages) > x->page_table.n) {
                ok = fail(err, n, "layer %d stream %d: row %lld of %d pages outside the %d-entry "
                          "table", il, s, (long long)row, np, x->page_table.n);
                break;
            }
            for (int32_t k = 0; ok && k < (rows ? np : max_pages); k++) {
                int32_t w = k < np ? mr_phys(kv, q, k) : -1;
                if (x->page_table.host[row + k] != w)
                    ok = fail(err, n, "layer %d stream %d: page %d is %d, expected %d", il, s, k,
                              x->page_table.host[row + k], w);
            }
        }
        /* K-shifts: in the first ubatch, every pending key once with its delta */
        if (ok && x->shift_slot.n != x->shift_delta.n)
            ok = fail(err, n, "layer %d: shift tables differ in size", il);
        if (ok && u > 0 && x->shift_slot.n)
            ok = fail(err, n, "layer %d: K-shift listed in ubatch %d", il, u);
        for (int32_t k = 0; ok && k < n_pend; k++) {
            int32_t hits = 0;
            for (int32_t m = 0; m < x->shift_slot.n; m++)
                hits += x->shift_slot.host[m] == pend[2 * k] &&
                        x->shift_delta.host[m] == pend[2 * k + 1];
            if (hits != 1)
                ok = fail(err, n, "layer %d: slot %d should shift by %d once (listed %d times)",
                          il, pend[2 * k], pend[2 * k + 1], hits);
        }
        /* every listed slot that holds a key is one of those */
        for (int32_t m = 0; ok && m < x->shift_slot.n; m++) {
            int32_t slot = x->shift_slot.host[m];
            for (int32_t s = 0; ok && s < r->n_seq; s++)
                for (int32_t j = 0; ok && j < r->seq[s].n; j++)
                    if (mr_phys(kv, s, j / ps) * ps + j % ps == slot &&
                        x->shift_delta.host[m] != r->seq[s].v[j].pos - r->seq[s].v[j].kpos)
                        ok = fail(err, n, "layer %d: slot %d (seq %d token %d) shifted by %d",
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
        return fail(err, n, "recurrent ubatch is not equal-split (%d tokens, %d x %d)",
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
            return fail(err, n, "layer %d: no recurrent view", il);
        const llmem_rs_view *x = llmem_view_rs(&v);
        bool same = x->n_states == rs->n_states && x->n_slots == rs->n_slots;
        for (int32_t j = 0; same && j < rs->n_states; j++)
            same = x->state[j] == rs->buf[li][j];
        if (!same)
            return fail(err, n, "layer %d: recurrent view buffers or slot count changed", il);
        /* checkpoint entry j is the state after token T - vc + j (ops.h); the
         * last one (vc = cc + 1) is the dst state and stays -1 */
        int32_t vc = cc > 0 ? cc + 1 : 0;
        if (x->n_seqs != ub->n_seqs || x->n_seq_tokens != T || x->n_ckpt != vc ||
            x->src_slot.n != ub->n_seqs || x->dst_slot.n != ub->n_seqs ||
            x->ckpt_slot.n != ub->n_seqs * vc)
            return fail(err, n, "layer %d: recurrent view has %d x %d tokens, %d checkpoints; "
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
                    return fail(err, n, "layer %d stream %d (seq %d): a hit of %d tokens reads "
                                        "slot %d, not a snapshot slot of its own",
                                il, s, y->primary, y->L, got);
                y->src = rs->snap[y->snap].slot = got;
            }
            if (x->src_slot.host[s] != y->src)
                return fail(err, n, "layer %d stream %d (seq %d, %d tokens): src slot %d, "
                                    "expected %d",
                            il, s, y->primary, y->L, x->src_slot.host[s], y->src);
            if (vc && x->ckpt_slot.host[s * vc + cc] != -1)
                return fail(err, n, "layer %d stream %d: the last checkpoint entry (the dst "
                                    "state) is %d, not -1",
                            il, s, x->ckpt_slot.host[s * vc + cc]);
            if (li == 0) {
                y->dst = x->dst_slot.host[s];
                for (int32_t j = 0; j < cc; j++)
                    y->ckpt[j] = x->ckpt_slot.host[s * vc + j];
            } else if (y->dst != x->dst_slot.host[s] ||
                       (cc && memcmp(y->ckpt, x->ckpt_slot.host + s * vc,
                                     (size_t)cc * sizeof(int32_t)) != 0)) {
                return fail(err, n, "layer %d: destination slots differ between layers", il);
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
            return fail(err, n, "child %d: destination slot %d out of range", c, w[i]);
        for (int32_t k = 0; k < i; k++)
            if (w[k] == w[i])
                return fail(err, n, "child %d: slot %d written twice by one ubatch", c, w[i]);
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
                    return fail(err, n, "child %d: the ubatch writes slot %d, which holds the "
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

/* --- the forward pass ---------------------------------------------------------------- */

static bool put_row(llmem_buffer *b, size_t off, uint64_t h, int32_t a, uint32_t salt)
{
    uint8_t row[TAG_BYTES];
    tag_put(row, h, a, salt);
    return llmem_buffer_upload(b, off, row, sizeof row) == LLMEM_OK;
}

bool memref_forward(memref *r, const llmem_ubatch *ub, char *err, size_t n)
{
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            size_t rb = ch->kv.row_bytes;
            for (int32_t li = 0; li < ch->n_layers; li++) {
                llmem_buffer *K = ch->kv.k[li], *V = ch->kv.v[li];
                for (int32_t m = 0; m < ch->n_shift; m++) {
                    uint8_t row[TAG_BYTES];
                    uint64_t h;
                    int32_t a;
                    uint32_t salt;
                    size_t off = (size_t)ch->shift_slot[m] * rb;
                    if (llmem_buffer_download(K, off, row, sizeof row) != LLMEM_OK)
                        return fail(err, n, "download failed");
                    tag_get(row, &h, &a, &salt);
                    if (!put_row(K, off, h, a + ch->shift_delta[m], salt))
                        return fail(err, n, "upload failed");
                }
                for (int32_t j = 0; j < ch->n_st; j++) {
                    const mr_store *x = &ch->st[j];
                    size_t off = (size_t)x->slot * rb;
                    if (!put_row(K, off, x->h, x->pos, salt_kv(c, li, 0)) ||
                        !put_row(V, off, x->h ^ V_XOR, 0, salt_kv(c, li, 1)))
                        return fail(err, n, "upload failed");
                }
            }
            continue;
        }
        mr_rs *rs = &ch->rs;
        for (int32_t li = 0; li < ch->n_layers; li++)
            for (int32_t j = 0; j < rs->n_states; j++) {
                llmem_buffer *B = rs->buf[li][j];
                size_t sb = rs->bytes[j];
                /* every source is read before anything is written */
                for (int32_t s = 0; s < ch->n_str; s++) {
                    const mr_stream *x = &ch->str[s];
                    uint8_t row[TAG_BYTES];
                    if (x->src < 0)
                        continue;
                    if (llmem_buffer_download(B, (size_t)x->src * sb, row, sizeof row) != LLMEM_OK)
                        return fail(err, n, "download failed");
                    if (!tag_eq(row, x->h0, x->L, salt_rs(c, li, j)))
                        return fail(err, n, "child %d layer %d: source slot %d of sequence %d "
                                            "does not hold its state after %d tokens",
                                    c, li, x->src, x->primary, x->L);
                }
                for (int32_t s = 0; s < ch->n_str; s++) {
                    const mr_stream *x = &ch->str[s];
                    uint64_t h = x->h0;
                    for (int32_t t = 0; t < x->T; t++) {
                        h = memref_mix(h, ub->token[s * x->T + t]);
                        int32_t len = x->L + t + 1, k = len - (x->L + x->T - x->c);
                        int32_t slot = len == x->L + x->T ? x->dst : k >= 0 ? x->ckpt[k] : -1;
                        if (slot >= 0 && !put_row(B, (size_t)slot * sb, h, len, salt_rs(c, li, j)))
                            return fail(err, n, "upload failed");
                    }
                }
            }
    }
    return true;
}

/* --- after every step ---------------------------------------------------------------- */

bool memref_bind(memref *r, char *err, size_t n)
{
    int32_t buf[4096];
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            mr_kv *kv = &ch->kv;
            for (int32_t s = 0; s < r->n_seq; s++) {
                int32_t np = llmem_kv_cache_page_table(ch->mem, s, buf, 4096);
                if (np != kv->tab[s].n)
                    return fail(err, n, "child %d seq %d: %d pages, expected %d", c, s, np,
                                kv->tab[s].n);
                for (int32_t k = 0; k < np; k++) {
                    mr_page *p = &kv->pg[kv->tab[s].v[k]];
                    if (buf[k] < 0 || buf[k] >= kv->n_pages)
                        return fail(err, n, "child %d seq %d: page id %d", c, s, buf[k]);
                    if (p->phys < 0) {
                        for (int32_t a = 0; a < kv->n_pg; a++)
                            if (kv->pg[a].live && kv->pg[a].phys == buf[k])
                                return fail(err, n, "child %d seq %d page %d: new page %d is "
                                                    "still %s in the reference",
                                            c, s, k, buf[k],
                                            kv->pg[a].ref ? "held" : "cached (wrong eviction?)");
                        p->phys = buf[k];
                    } else if (p->phys != buf[k]) {
                        return fail(err, n, "child %d seq %d page %d: page %d, expected %d "
                                            "(sharing or copy-on-write differs)",
                                    c, s, k, buf[k], p->phys);
                    }
                }
            }
            for (int32_t a = 0; a < kv->n_pg; a++)
                for (int32_t b = 0; b < a; b++)
                    if (kv->pg[a].live && kv->pg[b].live && kv->pg[a].phys >= 0 &&
                        kv->pg[a].phys == kv->pg[b].phys)
                        return fail(err, n, "child %d: page %d stands for two reference pages", c,
                                    kv->pg[a].phys);
            continue;
        }
        mr_rs *rs = &ch->rs;
        for (int32_t s = 0; s < r->n_seq; s++) {
            int32_t len = r->seq[s].n, cur = llmem_recurrent_seq_slot(ch->mem, s);
            for (int32_t i = 0; i < rs->nh[s]; i++) {
                mr_hold *h = &rs->h[s][i];
                if (h->slot < 0 && h->len == len)
                    h->slot = cur;
                if (h->slot < 0)
                    return fail(err, n, "child %d seq %d: state after %d tokens has no slot", c,
                                s, h->len);
                if (h->len == len && h->slot != cur)
                    return fail(err, n, "child %d seq %d: current slot %d, expected %d", c, s,
                                cur, h->slot);
            }
            if (len == 0 && cur != -1)
                return fail(err, n, "child %d seq %d: empty but slot %d", c, s, cur);
            for (int32_t i = 0; i < rs->nh[s]; i++)
                for (int32_t q = 0; q <= s; q++)
                    for (int32_t k = 0; k < (q == s ? i : rs->nh[q]); k++)
                        if (rs->h[q][k].slot == rs->h[s][i].slot)
                            return fail(err, n, "child %d: slot %d held twice", c,
                                        rs->h[s][i].slot);
        }
    }
    return true;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* A bounded reader over one section of a state stream. */
typedef struct rdr {
    const uint8_t *p, *end;
    bool bad;
} rdr;

static const uint8_t *take(rdr *x, size_t k)
{
    if (x->bad || k > (size_t)(x->end - x->p)) {
        x->bad = true;
        return NULL;
    }
    const uint8_t *q = x->p;
    x->p += k;
    return q;
}

static int32_t take32(rdr *x)
{
    const uint8_t *q = take(x, 4);
    return q ? (int32_t)rd32(q) : 0;
}

/* Positions are visible only through the state stream: parse every
 * section's entries and compare (docs/state-format.md). */
static bool compare_stream(memref *r, char *err, size_t n)
{
    size_t size = 0, got = 0;
    if (llmem_memory_state_size(r->mem, -1, &size) != LLMEM_OK || size < 24)
        return fail(err, n, "state_size failed");
    uint8_t *b = malloc(size);
    if (!b || llmem_memory_state_write(r->mem, -1, b, size, &got) != LLMEM_OK || got != size) {
        free(b);
        return fail(err, n, "state_write failed or wrote %zu of %zu bytes", got, size);
    }
    bool ok = rd32(b + 12) == (uint32_t)r->n_ch || fail(err, n, "state stream: section count");
    size_t at = 16;
    for (int32_t c = 0; ok && c < r->n_ch; c++) {
        const mr_child *ch = &r->ch[c];
        uint64_t len = at + 16 <= size - 8 ? rd64(b + at) : UINT64_MAX;
        if (len > size - 8 - at - 16) {
            ok = fail(err, n, "state stream: section %d does not fit", c);
            break;
        }
        rdr x = {b + at + 16, b + at + 16 + len, false};
        at += 16 + (size_t)len;
        if (ch->cfg.kv) {
            take(&x, 16);
        } else {
            int32_t nl = take32(&x);
            for (int32_t il = 0; il < nl && !x.bad; il++) {
                int32_t ns = take32(&x);
                for (int32_t j = 0; j < ns && !x.bad; j++) {
                    take32(&x);
                    take(&x, 4 * (size_t)(uint32_t)take32(&x));
                }
            }
        }
        int32_t ne = take32(&x), live = 0;
        for (int32_t s = 0; s < r->n_seq; s++)
            live += r->seq[s].n > 0;
        if (ne != live) {
            ok = fail(err, n, "child %d: state stream has %d sequences, expected %d", c, ne, live);
            break;
        }
        for (int32_t e = 0; ok && e < ne; e++) {
            int32_t s = take32(&x), l = take32(&x);
            if (x.bad || s < 0 || s >= r->n_seq || l != r->seq[s].n) {
                ok = fail(err, n, "child %d: stream entry %d: seq %d len %d", c, e, s, l);
                break;
            }
            if (ch->cfg.kv) { /* page sharing: the rule of memref_save, from the tables */
                int32_t from = take32(&x), shared = take32(&x), wf = -1, ws = 0;
                const mr_ilist *a = &ch->kv.tab[s];
                for (int32_t s2 = 0, i = 0; s2 < s && l > 0 && wf < 0; s2++) {
                    const mr_ilist *o = &ch->kv.tab[s2];
                    if (r->seq[s2].n == 0)
                        continue;
                    if (o->n > 0 && a->n > 0 && o->v[0] == a->v[0]) {
                        int32_t k = 0;
                        while (k < a->n && k < o->n && a->v[k] == o->v[k])
                            k++;
                        ws = k * ch->kv.ps < l ? k * ch->kv.ps : l;
                        ws = ws < r->seq[s2].n ? ws : r->seq[s2].n;
                        wf = i;
                    }
                    i++;
                }
                if (!x.bad && (from != wf || shared != ws)) {
                    ok = fail(err, n, "child %d seq %d: stream shares %d tokens with entry %d, "
                                      "expected %d with %d", c, s, shared, from, ws, wf);
                    break;
                }
            }
            const uint8_t *q = take(&x, (ch->cfg.kv ? 12 : 8) * (size_t)l);
            for (int32_t j = 0; q && ok && j < l; j++) {
                const mr_tok *t = &r->seq[s].v[j];
                int32_t tok = (int32_t)rd32(q + 4 * (size_t)j);
                int32_t pos = (int32_t)rd32(q + 4 * ((size_t)l + (size_t)j));
                int32_t sh = ch->cfg.kv ? (int32_t)rd32(q + 4 * (2 * (size_t)l + (size_t)j))
                                        : t->pos - t->kpos;
                if (tok != t->token || pos != t->pos || sh != t->pos - t->kpos)
                    ok = fail(err, n, "child %d seq %d token %d: (%d @ %d, pending shift %d), "
                                      "expected (%d @ %d, %d)",
                              c, s, j, tok, pos, sh, t->token, t->pos, t->pos - t->kpos);
            }
            if (ch->cfg.kv)
                take(&x, (size_t)l * ch->kv.row_bytes * 2 * (size_t)ch->n_layers);
            else if (l > 0)
                take(&x, (ch->rs.bytes[0] + (ch->rs.n_states > 1 ? ch->rs.bytes[1] : 0)) *
                             (size_t)ch->n_layers);
        }
        if (ok && (x.bad || x.p != x.end))
            ok = fail(err, n, "child %d: state section is %s than its entries", c,
                      x.bad ? "shorter" : "longer");
    }
    free(b);
    return ok;
}

bool memref_compare(memref *r, char *err, size_t n)
{
    int32_t buf[4096];
    for (int32_t s = 0; s < r->n_seq; s++) {
        const mr_seqv *q = &r->seq[s];
        int32_t len = llmem_memory_seq_tokens(r->mem, s, buf, 4096);
        if (len != q->n || llmem_memory_seq_len(r->mem, s) != q->n)
            return fail(err, n, "seq %d: %d tokens, expected %d", s, len, q->n);
        for (int32_t j = 0; j < len; j++)
            if (buf[j] != q->v[j].token)
                return fail(err, n, "seq %d token %d: id %d, expected %d", s, j, buf[j],
                            q->v[j].token);
        if (llmem_memory_seq_pos_min(r->mem, s) != memref_pos_min(r, s) ||
            llmem_memory_seq_pos_max(r->mem, s) != memref_pos_max(r, s))
            return fail(err, n, "seq %d: positions [%d, %d], expected [%d, %d]", s,
                        llmem_memory_seq_pos_min(r->mem, s), llmem_memory_seq_pos_max(r->mem, s),
                        memref_pos_min(r, s), memref_pos_max(r, s));
        for (int32_t c = 0; c < r->n_ch; c++) {
            const mr_child *ch = &r->ch[c];
            if (ch->cfg.kv)
                continue;
            int32_t want[MR_MAX_HOLD], nw = 0;
            for (int32_t i = 0; i < ch->rs.nh[s]; i++)
                if (ch->rs.h[s][i].len != q->n)
                    want[nw++] = q->v[ch->rs.h[s][i].len - 1].pos;
            int32_t nc = llmem_recurrent_checkpoints(ch->mem, s, buf, 4096);
            if (nc != nw)
                return fail(err, n, "seq %d: %d checkpoints, expected %d", s, nc, nw);
            for (int32_t i = 0; i < nw; i++) {
                bool found = false;
                for (int32_t k = 0; k < nc && !found; k++)
                    if (buf[k] == want[i]) {
                        found = true;
                        buf[k] = INT32_MIN;
                    }
                if (!found)
                    return fail(err, n, "seq %d: no checkpoint at position %d", s, want[i]);
            }
        }
    }
    llmem_memory_stats a, b;
    if (llmem_memory_get_stats(r->mem, &a) != LLMEM_OK)
        return fail(err, n, "get_stats failed");
    memref_stats(r, &b);
    if (a.pages_total != b.pages_total || a.pages_used != b.pages_used ||
        a.pages_free != b.pages_free || a.pages_cached != b.pages_cached ||
        a.slots_total != b.slots_total || a.slots_used != b.slots_used ||
        a.prefix_hit_tokens != b.prefix_hit_tokens || a.prefix_evictions != b.prefix_evictions ||
        a.cow_copies != b.cow_copies || a.n_seqs_live != b.n_seqs_live)
        return fail(err, n,
                    "stats: pages total/used/free/cached %lld/%lld/%lld/%lld slots %lld/%lld "
                    "hits %lld evictions %lld copies %lld live %d; expected %lld/%lld/%lld/%lld "
                    "slots %lld/%lld hits %lld evictions %lld copies %lld live %d",
                    (long long)a.pages_total, (long long)a.pages_used, (long long)a.pages_free,
                    (long long)a.pages_cached, (long long)a.slots_total, (long long)a.slots_used,
                    (long long)a.prefix_hit_tokens, (long long)a.prefix_evictions,
                    (long long)a.cow_copies, a.n_seqs_live, (long long)b.pages_total,
                    (long long)b.pages_used, (long long)b.pages_free, (long long)b.pages_cached,
                    (long long)b.slots_total, (long long)b.slots_used,
                    (long long)b.prefix_hit_tokens, (long long)b.prefix_evictions,
                    (long long)b.cow_copies, b.n_seqs_live);
    if (a.snapshots != b.snapshots || a.snapshot_bytes != b.snapshot_bytes ||
        a.snapshot_evictions != b.snapshot_evictions ||
        a.snapshot_hit_tokens != b.snapshot_hit_tokens ||
        a.cached_kv_bytes != b.cached_kv_bytes || a.prefix_cache_bytes != b.prefix_cache_bytes)
        return fail(err, n,
                    "stats: snapshots %lld (%lld bytes, %lld evicted, %lld hit tokens), cached "
                    "KV %lld bytes, budget %lld; expected %lld (%lld, %lld, %lld), %lld, %lld",
                    (long long)a.snapshots, (long long)a.snapshot_bytes,
                    (long long)a.snapshot_evictions, (long long)a.snapshot_hit_tokens,
                    (long long)a.cached_kv_bytes, (long long)a.prefix_cache_bytes,
                    (long long)b.snapshots, (long long)b.snapshot_bytes,
                    (long long)b.snapshot_evictions, (long long)b.snapshot_hit_tokens,
                    (long long)b.cached_kv_bytes, (long long)b.prefix_cache_bytes);
    if (b.prefix_cache_bytes > 0 && b.cached_kv_bytes + b.snapshot_bytes > b.prefix_cache_bytes &&
        !r->plan.active)
        return fail(err, n, "%lld cached page bytes + %lld snapshot bytes exceed the budget of %lld",
                    (long long)b.cached_kv_bytes, (long long)b.snapshot_bytes,
                    (long long)b.prefix_cache_bytes);
    char cerr[256] = "";
    if (llmem_memory_check(r->mem, cerr, sizeof cerr) != LLMEM_OK)
        return fail(err, n, "llmem_memory_check: %s", cerr);
    if (!r->plan.active && !compare_stream(r, err, n))
        return false;
    return true;
}

bool memref_verify(memref *r, char *err, size_t n)
{
    bool ok = true;
    for (int32_t c = 0; c < r->n_ch && ok; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            mr_kv *kv = &ch->kv;
            size_t rb = kv->row_bytes, size = llmem_buffer_size(kv->k[0]);
            uint8_t *K = malloc(size), *V = malloc(size);
            for (int32_t li = 0; ok && li < ch->n_layers; li++) {
                if (!K || !V || llmem_buffer_download(kv->k[li], 0, K, size) != LLMEM_OK ||
                    llmem_buffer_download(kv->v[li], 0, V, size) != LLMEM_OK) {
                    ok = fail(err, n, "download failed");
                    break;
                }
                for (int32_t s = 0; ok && s < r->n_seq; s++)
                    for (int32_t j = 0; ok && j < r->seq[s].n; j++) {
                        const mr_tok *t = &r->seq[s].v[j];
                        size_t slot = (size_t)mr_phys(kv, s, j / kv->ps) * (size_t)kv->ps +
                                      (size_t)(j % kv->ps);
                        const uint8_t *kr = K + slot * rb, *vr = V + slot * rb;
                        if (!tag_eq(kr, t->h, t->kpos, salt_kv(c, li, 0)) ||
                            !tag_eq(vr, t->h ^ V_XOR, 0, salt_kv(c, li, 1))) {
                            uint64_t h;
                            int32_t a;
                            uint32_t salt;
                            tag_get(kr, &h, &a, &salt);
                            ok = fail(err, n, "child %d layer %d seq %d token %d (slot %zu): K/V "
                                              "data is not its own (key pos %d salt %x, "
                                              "expected %d %x%s)",
                                      c, li, s, j, slot, a, salt, t->kpos, salt_kv(c, li, 0),
                                      h == t->h ? "" : ", other token");
                        }
                    }
            }
            free(K);
            free(V);
            continue;
        }
        mr_rs *rs = &ch->rs;
        for (int32_t li = 0; ok && li < ch->n_layers; li++)
            for (int32_t j = 0; ok && j < rs->n_states; j++) {
                size_t size = llmem_buffer_size(rs->buf[li][j]);
                uint8_t *B = malloc(size);
                if (!B || llmem_buffer_download(rs->buf[li][j], 0, B, size) != LLMEM_OK)
                    ok = fail(err, n, "download failed");
                for (int32_t s = 0; ok && s < r->n_seq; s++)
                    for (int32_t i = 0; ok && i < rs->nh[s]; i++) {
                        const mr_hold *h = &rs->h[s][i];
                        if (!tag_eq(B + (size_t)h->slot * rs->bytes[j], h_at(r, s, h->len), h->len,
                                    salt_rs(c, li, j))) {
                            uint64_t hh;
                            int32_t a;
                            uint32_t salt;
                            tag_get(B + (size_t)h->slot * rs->bytes[j], &hh, &a, &salt);
                            ok = fail(err, n, "child %d layer %d state %d: slot %d of seq %d "
                                              "should hold the state after %d tokens (holds "
                                              "%d tokens, salt %x)",
                                      c, li, j, h->slot, s, h->len, a, salt);
                        }
                    }
                /* every snapshot whose slot a hit showed holds its prefix's state */
                for (int32_t i = 0; ok && i < rs->n_snap; i++) {
                    const mr_snap *q = &rs->snap[i];
                    if (q->live && q->slot >= 0 &&
                        !tag_eq(B + (size_t)q->slot * rs->bytes[j], q->h, q->prefix.n,
                                salt_rs(c, li, j)))
                        ok = fail(err, n, "child %d layer %d state %d: snapshot slot %d should "
                                          "hold the state after its %d tokens",
                                  c, li, j, q->slot, q->prefix.n);
                }
                free(B);
            }
    }
    return ok;
}

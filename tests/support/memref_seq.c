/* The memory reference, part 2b: sequence operations (seq_rm, seq_cp,
 * seq_keep, seq_add, seq_div, clear) and state reads, predicted from the
 * contract (memory.h; a recurrent memory cuts back only to a held state).
 * Plans are in memref_ops.c. */
#include <stdlib.h>
#include <string.h>

#include "support/memref_impl.h"

/* --- sequence operations ------------------------------------------------------------- */

static void norm(int32_t *p0, int32_t *p1)
{
    if (*p0 < 0)
        *p0 = 0;
    if (*p1 < 0)
        *p1 = INT32_MAX;
}

static bool in(int32_t pos, int32_t p0, int32_t p1)
{
    return pos >= p0 && pos < p1;
}

/* First index of the suffix [p0, p1) covers; -1 when it is not a suffix. */
static int32_t suffix(const mr_seqv *s, int32_t p0, int32_t p1)
{
    int32_t first = s->n;
    for (int32_t j = 0; j < s->n && first == s->n; j++)
        if (in(s->v[j].pos, p0, p1))
            first = j;
    for (int32_t j = first; j < s->n; j++)
        if (!in(s->v[j].pos, p0, p1))
            return -1;
    return first;
}

/* Cuts seq s to its first keep tokens; a seq_rm of the whole sequence
 * (publish) first publishes its state as a snapshot in each recurrent
 * child (after the KV children unreferenced their pages, in child order). */
static void drop_seq(memref *r, int32_t s, int32_t keep, bool publish)
{
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            mr_kv_drop_from(&ch->kv, s, mr_div_up(keep, ch->kv.ps));
            if (keep % ch->kv.ps) {
                /* rollback into a page no one else holds: it leaves the
                 * prefix index and is written in place */
                int32_t a = ch->kv.tab[s].v[ch->kv.tab[s].n - 1];
                if (ch->kv.pg[a].ref == 1) {
                    ch->kv.pg[a].pub = false;
                    ch->kv.pg[a].hashed = false;
                }
            }
        } else {
            mr_rs *rs = &ch->rs;
            int32_t n = 0;
            if (publish && keep == 0 && mr_rs_find(rs, s, r->seq[s].n) >= 0)
                mr_snap_publish(r, rs, s, r->seq[s].n);
            for (int32_t i = 0; i < rs->nh[s]; i++)
                if (keep > 0 && rs->h[s][i].len <= keep)
                    rs->h[s][n++] = rs->h[s][i];
            rs->nh[s] = n;
        }
    }
    r->seq[s].n = keep;
}

/* A removal that is not a suffix (context shift): one run [a, a + cnt) of
 * tokens, whole pages of every KV child, no recurrent child. */
static bool mid_run(const memref *r, int32_t s, int32_t p0, int32_t p1, int32_t *a, int32_t *cnt)
{
    const mr_seqv *q = &r->seq[s];
    *a = -1;
    *cnt = 0;
    for (int32_t j = 0; j < q->n; j++)
        if (in(q->v[j].pos, p0, p1)) {
            if (*a < 0)
                *a = j;
            (*cnt)++;
        }
    if (*a < 0)
        return false;
    for (int32_t j = *a; j < *a + *cnt; j++)
        if (!in(q->v[j].pos, p0, p1))
            return false;
    for (int32_t c = 0; c < r->n_ch; c++)
        if (!r->ch[c].cfg.kv || *a % r->ch[c].kv.ps || (*a + *cnt) % r->ch[c].kv.ps)
            return false;
    return true;
}

static void drop_mid(memref *r, int32_t s, int32_t a, int32_t cnt)
{
    mr_seqv *q = &r->seq[s];
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        mr_ilist *t = &kv->tab[s];
        int32_t pa = a / kv->ps, pb = (a + cnt) / kv->ps;
        for (int32_t k = pa; k < pb; k++)
            mr_kv_unref(kv, t->v[k]);
        for (int32_t k = pb; k < t->n; k++)
            t->v[k - (pb - pa)] = t->v[k];
        t->n -= pb - pa;
    }
    for (int32_t j = a + cnt; j < q->n; j++)
        q->v[j - cnt] = q->v[j];
    q->n -= cnt;
}

static llmem_status rm_check(const memref *r, int32_t s, int32_t p0, int32_t p1, int32_t *k)
{
    *k = suffix(&r->seq[s], p0, p1);
    if (*k < 0) {
        int32_t a, cnt;
        return mid_run(r, s, p0, p1, &a, &cnt) ? LLMEM_OK : LLMEM_E_STATE;
    }
    if (*k == r->seq[s].n || *k == 0)
        return LLMEM_OK;
    for (int32_t c = 0; c < r->n_ch; c++)
        if (!r->ch[c].cfg.kv && mr_rs_find(&r->ch[c].rs, s, *k) < 0)
            return LLMEM_E_STATE;
    return LLMEM_OK;
}

llmem_status memref_seq_rm(memref *r, int32_t seq, int32_t p0, int32_t p1)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < -1 || seq >= r->n_seq)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    int32_t k[MR_MAX_SEQ];
    int32_t s0 = seq < 0 ? 0 : seq, s1 = seq < 0 ? r->n_seq : seq + 1;
    for (int32_t s = s0; s < s1; s++) {
        llmem_status st = rm_check(r, s, p0, p1, &k[s]);
        if (st != LLMEM_OK)
            return st;
    }
    for (int32_t s = s0; s < s1; s++) {
        int32_t a, cnt;
        if (k[s] < 0 && mid_run(r, s, p0, p1, &a, &cnt))
            drop_mid(r, s, a, cnt);
        else if (k[s] >= 0 && k[s] < r->seq[s].n)
            drop_seq(r, s, k[s], true);
    }
    return LLMEM_OK;
}

llmem_status memref_seq_cp(memref *r, int32_t src, int32_t dst, int32_t p0, int32_t p1)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (src < 0 || src >= r->n_seq || dst < 0 || dst >= r->n_seq)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    if (src == dst)
        return LLMEM_OK;
    const mr_seqv *a = &r->seq[src];
    int32_t k = 0;
    while (k < a->n && in(a->v[k].pos, p0, p1))
        k++;
    for (int32_t j = k; j < a->n; j++)
        if (in(a->v[j].pos, p0, p1))
            return LLMEM_E_STATE;
    for (int32_t c = 0; c < r->n_ch; c++)
        if (!r->ch[c].cfg.kv && k > 0 && mr_rs_find(&r->ch[c].rs, src, k) < 0)
            return LLMEM_E_STATE;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            mr_kv_drop_from(&ch->kv, dst, 0);
            for (int32_t i = 0; i < mr_div_up(k, ch->kv.ps); i++) {
                mr_kv_ref(&ch->kv, ch->kv.tab[src].v[i]);
                mr_ilist_push(&ch->kv.tab[dst], ch->kv.tab[src].v[i]);
            }
        } else {
            ch->rs.nh[dst] = 0;
            if (k > 0)
                ch->rs.h[dst][ch->rs.nh[dst]++] = (mr_hold){k, -1};
        }
    }
    r->seq[dst].n = 0;
    for (int32_t j = 0; j < k; j++)
        mr_seqv_push(&r->seq[dst], a->v[j]);
    return LLMEM_OK;
}

llmem_status memref_seq_keep(memref *r, int32_t seq)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < 0 || seq >= r->n_seq)
        return LLMEM_E_INVALID;
    for (int32_t s = 0; s < r->n_seq; s++)
        if (s != seq)
            drop_seq(r, s, 0, false);
    return LLMEM_OK;
}

/* seq_add (d == 0) or seq_div (d > 0). */
static llmem_status shift(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t delta,
                          int32_t d)
{
    mr_seqv *s = &r->seq[seq];
    for (int32_t j = 0; j < s->n; j++) {
        int64_t np = d ? s->v[j].pos / d : (int64_t)s->v[j].pos + delta;
        if (in(s->v[j].pos, p0, p1) && (np < 0 || np > INT32_MAX - 1))
            return LLMEM_E_INVALID;
    }
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int32_t n_cow = 0, last = -1;
        for (int32_t j = 0; j < s->n; j++)
            if (in(s->v[j].pos, p0, p1) && j / kv->ps != last) {
                last = j / kv->ps;
                n_cow += kv->pg[kv->tab[seq].v[last]].ref > 1;
            }
        if (n_cow > kv->n_pages - mr_kv_used(kv))
            return LLMEM_E_NO_SPACE;
    }
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int32_t last = -1;
        for (int32_t j = 0; j < s->n; j++) {
            if (!in(s->v[j].pos, p0, p1) || j / kv->ps == last)
                continue;
            last = j / kv->ps;
            int32_t a = kv->tab[seq].v[last];
            if (kv->pg[a].ref > 1) {
                bool sh = kv->pg[a].shift;
                int32_t b = mr_kv_alloc(kv);
                kv->pg[b].shift = sh;
                kv->tab[seq].v[last] = b;
                mr_kv_unref(kv, a);
                kv->cows++;
                a = b;
            }
            kv->pg[a].pub = false;
            kv->pg[a].hashed = false;
            kv->pg[a].shift = true;
        }
    }
    for (int32_t j = 0; j < s->n; j++)
        if (in(s->v[j].pos, p0, p1))
            s->v[j].pos = d ? s->v[j].pos / d : s->v[j].pos + delta;
    return LLMEM_OK;
}

llmem_status memref_seq_add(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t delta)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < 0 || seq >= r->n_seq)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    if (delta == 0 || p0 >= p1)
        return LLMEM_OK;
    return shift(r, seq, p0, p1, delta, 0);
}

llmem_status memref_seq_div(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t d)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < 0 || seq >= r->n_seq || d <= 0)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    if (d == 1 || p0 >= p1)
        return LLMEM_OK;
    return shift(r, seq, p0, p1, 0, d);
}

void memref_clear(memref *r)
{
    for (int32_t s = 0; s < r->n_seq; s++)
        r->seq[s].n = 0;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        for (int32_t a = 0; a < ch->kv.n_pg; a++)
            mr_kv_die(&ch->kv, a);
        for (int32_t s = 0; s < r->n_seq; s++) {
            ch->kv.tab[s].n = 0;
            ch->rs.nh[s] = 0;
        }
        for (int32_t i = 0; i < ch->rs.n_snap; i++) {
            ch->rs.snap[i].live = false;
            ch->rs.snap[i].ref = 0;
        }
    }
}

/* Pages entry i of a saved state shares with an earlier entry on reading:
 * whole pages of the shared tokens, or all when it lies within them. */
static int32_t shared_pages(const mr_kv *kv, const mr_saved *sv, int32_t c, int32_t i)
{
    int32_t n = sv->tok[i].n, l = sv->share_len[c][i];
    if (sv->share_from[c][i] < 0)
        return 0;
    return l >= n ? mr_div_up(n, kv->ps) : l / kv->ps;
}

llmem_status memref_load(memref *r, int32_t seq, const mr_saved *sv)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < -1 || seq >= r->n_seq || sv->all != (seq < 0))
        return LLMEM_E_INVALID;
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int64_t need = 0, avail = kv->n_pages;
        for (int32_t i = 0; i < sv->n; i++)
            need += mr_div_up(sv->tok[i].n, kv->ps) - shared_pages(kv, sv, c, i);
        if (seq >= 0) {
            avail = kv->n_pages - mr_kv_used(kv);
            for (int32_t k = 0; k < kv->tab[seq].n; k++)
                avail += kv->pg[kv->tab[seq].v[k]].ref == 1;
        }
        if (need > avail)
            return LLMEM_E_NO_SPACE;
    }
    if (seq < 0)
        memref_clear(r);
    else
        drop_seq(r, seq, 0, false);
    for (int32_t i = 0; i < sv->n; i++) {
        int32_t s = seq >= 0 ? seq : sv->seq[i];
        for (int32_t j = 0; j < sv->tok[i].n; j++)
            mr_seqv_push(&r->seq[s], sv->tok[i].v[j]);
        int32_t n = r->seq[s].n;
        for (int32_t c = 0; c < r->n_ch; c++) {
            mr_child *ch = &r->ch[c];
            if (ch->cfg.kv) {
                int32_t nsh = shared_pages(&ch->kv, sv, c, i);
                for (int32_t k = 0; k < nsh; k++) { /* the earlier entry's pages */
                    int32_t a = ch->kv.tab[sv->seq[sv->share_from[c][i]]].v[k];
                    mr_kv_ref(&ch->kv, a);
                    mr_ilist_push(&ch->kv.tab[s], a);
                }
                for (int32_t k = nsh; k < mr_div_up(n, ch->kv.ps); k++)
                    mr_ilist_push(&ch->kv.tab[s], mr_kv_alloc(&ch->kv));
                /* pending K-shifts come back with the stream */
                for (int32_t j = 0; j < n; j++)
                    if (r->seq[s].v[j].pos != r->seq[s].v[j].kpos)
                        ch->kv.pg[ch->kv.tab[s].v[j / ch->kv.ps]].shift = true;
            } else if (n > 0) {
                ch->rs.h[s][0] = (mr_hold){n, -1};
                ch->rs.nh[s] = 1;
            }
        }
    }
    return LLMEM_OK;
}

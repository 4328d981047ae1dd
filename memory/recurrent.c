/* llmem memory/: recurrent-state memory — state slots per sequence,
 * checkpoints for rollback, planning over EQUAL-split ubatches.
 * References: Mamba-2 / SSD (Dao & Gu, ICML 2024) for the state shapes;
 * llama.cpp llama_memory_recurrent and vLLM's Mamba cache for slot
 * management; speculative-decoding rollback by checkpoint as in vLLM's
 * hybrid prefix caching of Mamba states. */
#include <stdlib.h>
#include <string.h>

#include "llmem/recurrent.h"
#include "memory/internal.h"

typedef struct rs_hold {
    i32vec slot, len; /* state after `len` tokens lives in `slot` */
} rs_hold;

typedef struct rs_seq {
    i32vec tokens, pos;
    rs_hold h;
} rs_seq;

typedef struct rs_layer {
    int32_t n_states;
    llmem_state_desc *desc;
    size_t *bytes;          /* [n_states] bytes of one slot */
    llmem_buffer **buf;     /* [n_states] */
} rs_layer;

/* What commit(u) does to one sequence. */
typedef struct rs_change {
    int32_t seq;
    int32_t copy_from;      /* >= 0: copy this slot into new_slot[0] at commit */
    int32_t n_new;
    int32_t *new_slot, *new_len; /* holdings after the ubatch */
} rs_change;

typedef struct rs_ub {
    int32_t src, dst, ckpt, n_seqs, n_ckpt, n_seq_tokens;
    int32_t n_change;
    rs_change *change;
} rs_ub;

typedef struct rs_res {
    int32_t n_ub, cur;
    rs_ub *ub;
} rs_res;

typedef struct recurrent {
    llmem_memory base;
    int32_t n_ckpt, n_slots, quota;
    bool poison;
    rs_layer *layers;
    rs_seq *seqs;
    int32_t *owner; /* [n_slots] owning sequence or -1 */
    llmem_buffer *idx;
    idx_builder ib;
} recurrent;

extern const llmem_memory_i recurrent_iface;

static recurrent *rs_of(llmem_memory *mem)
{
    return LLMEM_MEMORY_CAST(recurrent, mem, &recurrent_iface);
}

static int32_t hold_find(const rs_hold *h, int32_t len)
{
    for (int32_t i = 0; i < h->len.n; i++)
        if (h->len.v[i] == len)
            return i;
    return -1;
}

static llmem_status slot_copy(recurrent *rs, int32_t dst, int32_t src)
{
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++) {
            llmem_status st = llmem_buffer_copy(L->buf[j], (size_t)dst * L->bytes[j], L->buf[j],
                                                (size_t)src * L->bytes[j], L->bytes[j]);
            if (st != LLMEM_OK)
                return st;
        }
    }
    return LLMEM_OK;
}

static void slot_free(recurrent *rs, int32_t slot)
{
    rs->owner[slot] = -1;
    if (!rs->poison)
        return;
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++)
            llmem_buffer_fill(L->buf[j], (size_t)slot * L->bytes[j], L->bytes[j],
                              llmem_nan_pattern(L->desc[j].dtype));
    }
}

static void hold_drop_all(recurrent *rs, rs_seq *s)
{
    for (int32_t i = 0; i < s->h.slot.n; i++)
        slot_free(rs, s->h.slot.v[i]);
    s->h.slot.n = s->h.len.n = 0;
}

static int32_t take_free(int32_t *owner, int32_t n_slots, int32_t seq)
{
    for (int32_t i = 0; i < n_slots; i++)
        if (owner[i] < 0) {
            owner[i] = seq;
            return i;
        }
    return -1;
}

/* --- planning ------------------------------------------------------------------ */

static void res_free(rs_res *res)
{
    if (!res)
        return;
    for (int32_t u = 0; u < res->n_ub; u++) {
        for (int32_t c = 0; c < res->ub[u].n_change; c++) {
            free(res->ub[u].change[c].new_slot);
            free(res->ub[u].change[c].new_len);
        }
        free(res->ub[u].change);
    }
    free(res->ub);
    free(res);
}

static bool hold_copy(rs_hold *dst, const rs_hold *src)
{
    if (!i32vec_reserve(&dst->slot, src->slot.n) || !i32vec_reserve(&dst->len, src->len.n))
        return false;
    i32_copy(dst->slot.v, src->slot.v, src->slot.n);
    i32_copy(dst->len.v, src->len.v, src->len.n);
    dst->slot.n = src->slot.n;
    dst->len.n = src->len.n;
    return true;
}

static bool change_set(rs_change *c, int32_t seq, const rs_hold *h, int32_t copy_from)
{
    c->seq = seq;
    c->copy_from = copy_from;
    c->n_new = h->slot.n;
    c->new_slot = malloc((size_t)(h->slot.n + 1) * sizeof(int32_t));
    c->new_len = malloc((size_t)(h->slot.n + 1) * sizeof(int32_t));
    if (!c->new_slot || !c->new_len)
        return false;
    i32_copy(c->new_slot, h->slot.v, h->slot.n);
    i32_copy(c->new_len, h->len.v, h->slot.n);
    return true;
}

static llmem_status rs_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                               size_t err_len)
{
    recurrent *rs = rs_of(mem);
    int32_t nsm = mem->n_seq_max;
    llmem_status st = LLMEM_E_NO_MEMORY;
    rs_res *res = calloc(1, sizeof *res);
    rs_hold *sim = calloc((size_t)nsm, sizeof *sim);
    int32_t *len = calloc((size_t)nsm, sizeof *len);
    int32_t *owner = malloc((size_t)rs->n_slots * sizeof *owner);
    i32vec pending = {0}; /* slots a ubatch drops; free only after it */
    if (!res || !sim || !len || !owner)
        goto out;
    res->cur = -1;
    res->ub = calloc((size_t)plan->n_ubatch, sizeof *res->ub);
    if (!res->ub)
        goto out;
    res->n_ub = plan->n_ubatch;
    memcpy(owner, rs->owner, (size_t)rs->n_slots * sizeof *owner);
    for (int32_t s = 0; s < nsm; s++) {
        len[s] = rs->seqs[s].tokens.n;
        if (plan->n_new[s] && !hold_copy(&sim[s], &rs->seqs[s].h))
            goto out;
    }
    int64_t elems = 0;
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        int32_t T = ub->n_seq_tokens, c = T - 1 < rs->n_ckpt ? T - 1 : rs->n_ckpt;
        elems += (int64_t)ub->n_seqs * (3 + c);
    }
    rs->ib.data.n = 0;
    if (elems > INT32_MAX / 2 || !i32vec_reserve(&rs->ib.data, (int32_t)elems))
        goto out;
    if ((st = idx_ensure(mem->backend, &rs->idx, (int32_t)elems)) != LLMEM_OK) {
        llmem_errf(err, err_len, "recurrent memory: index buffer allocation failed");
        goto out;
    }
    st = LLMEM_E_NO_MEMORY;
    idx_builder *ib = &rs->ib;
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        rs_ub *t = &res->ub[u];
        int32_t T = ub->n_seq_tokens, c = T - 1 < rs->n_ckpt ? T - 1 : rs->n_ckpt;
        t->n_seqs = ub->n_seqs;
        /* the view's checkpoints cover the last c + 1 tokens (ops.h); the
         * last one is the dst slot's state, so its entry stays -1 */
        t->n_ckpt = c > 0 ? c + 1 : 0;
        t->n_seq_tokens = T;
        t->src = idx_append(ib, NULL, ub->n_seqs, -1);
        t->dst = idx_append(ib, NULL, ub->n_seqs, -1);
        t->ckpt = idx_append(ib, NULL, ub->n_seqs * t->n_ckpt, -1);
        int32_t n_change = plan->stream_off[u][ub->n_seqs];
        t->change = calloc((size_t)(n_change > 0 ? n_change : 1), sizeof *t->change);
        if (!t->change)
            goto out;
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            int32_t a = ub->seq_id[s];
            rs_hold *h = &sim[a];
            int32_t L = len[a];
            for (int32_t m = plan->stream_off[u][s] + 1; m < plan->stream_off[u][s + 1]; m++)
                if (len[plan->stream_ids[u][m]] != L) {
                    llmem_errf(err, err_len,
                               "recurrent memory: a token is shared by sequences %d (%d tokens) "
                               "and %d (%d tokens); shared tokens need equal histories",
                               a, L, plan->stream_ids[u][m], len[plan->stream_ids[u][m]]);
                    st = LLMEM_E_INVALID;
                    goto out;
                }
            int32_t cur = hold_find(h, L);
            ib->data.v[t->src + s] = L > 0 ? h->slot.v[cur] : -1;
            /* slots for the 1 + c new states: fresh ones up to the quota, then
             * the oldest checkpoints (never the current state) */
            int32_t need = 1 + c, got[64], *g = need <= 64 ? got : malloc((size_t)need * sizeof *g);
            if (!g)
                goto out;
            for (int32_t k = 0; k < need; k++) {
                int32_t slot = -1;
                if (h->slot.n + k < rs->quota)
                    slot = take_free(owner, rs->n_slots, a);
                if (slot < 0) {
                    int32_t oldest = -1;
                    for (int32_t i = 0; i < h->len.n; i++)
                        if (h->len.v[i] != L && (oldest < 0 || h->len.v[i] < h->len.v[oldest]))
                            oldest = i;
                    if (oldest < 0) {
                        if (g != got)
                            free(g);
                        llmem_errf(err, err_len, "recurrent memory: no state slot for sequence %d", a);
                        st = LLMEM_E_NO_SPACE;
                        goto out;
                    }
                    slot = h->slot.v[oldest];
                    h->slot.v[oldest] = h->slot.v[h->slot.n - 1];
                    h->len.v[oldest] = h->len.v[h->len.n - 1];
                    h->slot.n--;
                    h->len.n--;
                }
                g[k] = slot;
            }
            ib->data.v[t->dst + s] = g[c];
            for (int32_t j = 0; j < c; j++)
                ib->data.v[t->ckpt + s * t->n_ckpt + j] = g[j];
            for (int32_t k = 0; k < need; k++) {
                int32_t l = k < c ? L + T - c + k : L + T;
                if (!i32vec_push(&h->slot, g[k]) || !i32vec_push(&h->len, l)) {
                    if (g != got)
                        free(g);
                    goto out;
                }
            }
            if (g != got)
                free(g);
            /* keep the newest 1 + n_ckpt states */
            while (h->slot.n > 1 + rs->n_ckpt) {
                int32_t oldest = 0;
                for (int32_t i = 1; i < h->len.n; i++)
                    if (h->len.v[i] < h->len.v[oldest])
                        oldest = i;
                /* freed at this ubatch's commit: reusable from the next one */
                if (!i32vec_push(&pending, h->slot.v[oldest]))
                    goto out;
                h->slot.v[oldest] = h->slot.v[h->slot.n - 1];
                h->len.v[oldest] = h->len.v[h->len.n - 1];
                h->slot.n--;
                h->len.n--;
            }
            len[a] = L + T;
            if (!change_set(&t->change[t->n_change++], a, h, -1))
                goto out;
            /* other sequences of the stream get a copy of the final state */
            for (int32_t m = plan->stream_off[u][s] + 1; m < plan->stream_off[u][s + 1]; m++) {
                int32_t b = plan->stream_ids[u][m];
                rs_hold *hb = &sim[b];
                int32_t keep = hb->slot.n > 0 ? hb->slot.v[0] : take_free(owner, rs->n_slots, b);
                for (int32_t i = 1; i < hb->slot.n; i++)
                    if (!i32vec_push(&pending, hb->slot.v[i]))
                        goto out;
                if (!i32vec_reserve(&hb->slot, 1) || !i32vec_reserve(&hb->len, 1))
                    goto out;
                hb->slot.n = hb->len.n = 1;
                hb->slot.v[0] = keep;
                hb->len.v[0] = L + T;
                len[b] = L + T;
                if (!change_set(&t->change[t->n_change++], b, hb, ib->data.v[t->dst + s]))
                    goto out;
            }
        }
        for (int32_t k = 0; k < pending.n; k++)
            owner[pending.v[k]] = -1;
        pending.n = 0;
    }
    if ((st = idx_upload(rs->idx, ib)) != LLMEM_OK)
        goto out;
    *out = res;
    res = NULL;
out:
    res_free(res);
    for (int32_t s = 0; sim && s < nsm; s++) {
        i32vec_free(&sim[s].slot);
        i32vec_free(&sim[s].len);
    }
    free(sim);
    free(len);
    free(owner);
    i32vec_free(&pending);
    return st;
}

/* rs_reserve changes nothing the memory holds (slot choices are simulated
 * and applied at commit), so a trial reservation is the check. */
static llmem_status rs_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                       size_t err_len)
{
    void *res = NULL;
    llmem_status st = rs_reserve(mem, plan, &res, err, err_len);
    res_free(res);
    return st;
}

static llmem_status rs_apply(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    ((rs_res *)r)->cur = i;
    return LLMEM_OK;
}

static llmem_status rs_view(llmem_memory *mem, void *r, int32_t il, llmem_view *view)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = r;
    const rs_ub *t = &res->ub[res->cur];
    const rs_layer *L = &rs->layers[il];
    if (L->n_states == 0) {
        view->kind = LLMEM_VIEW_NONE;
        return LLMEM_OK;
    }
    llmem_rs_view *v = &view->u.rs;
    view->kind = LLMEM_VIEW_RECURRENT;
    view->idx = rs->idx;
    v->n_states = L->n_states;
    v->desc = L->desc;
    v->state = L->buf;
    v->n_slots = rs->n_slots;
    v->n_seqs = t->n_seqs;
    v->n_seq_tokens = t->n_seq_tokens;
    v->n_ckpt = t->n_ckpt;
    v->src_slot = idx_table(&rs->ib, t->src, t->n_seqs);
    v->dst_slot = idx_table(&rs->ib, t->dst, t->n_seqs);
    v->ckpt_slot = idx_table(&rs->ib, t->ckpt, t->n_seqs * t->n_ckpt);
    return LLMEM_OK;
}

static llmem_status rs_commit(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    recurrent *rs = rs_of(mem);
    const rs_ub *t = &((rs_res *)r)->ub[i];
    const llmem_ubatch *ub = &plan->ubatch[i];
    for (int32_t c = 0; c < t->n_change; c++) {
        const rs_change *ch = &t->change[c];
        if (ch->copy_from >= 0) {
            llmem_status st = slot_copy(rs, ch->new_slot[0], ch->copy_from);
            if (st != LLMEM_OK)
                return st;
        }
    }
    for (int32_t c = 0; c < t->n_change; c++) {
        const rs_change *ch = &t->change[c];
        rs_seq *s = &rs->seqs[ch->seq];
        /* free what the sequence no longer holds, take what it now holds */
        for (int32_t k = 0; k < s->h.slot.n; k++) {
            bool kept = false;
            for (int32_t m = 0; m < ch->n_new && !kept; m++)
                kept = ch->new_slot[m] == s->h.slot.v[k];
            if (!kept)
                slot_free(rs, s->h.slot.v[k]);
        }
        s->h.slot.n = s->h.len.n = 0;
        if (!i32vec_reserve(&s->h.slot, ch->n_new) || !i32vec_reserve(&s->h.len, ch->n_new))
            return LLMEM_E_NO_MEMORY;
        for (int32_t m = 0; m < ch->n_new; m++) {
            rs->owner[ch->new_slot[m]] = ch->seq;
            s->h.slot.v[m] = ch->new_slot[m];
            s->h.len.v[m] = ch->new_len[m];
        }
        s->h.slot.n = s->h.len.n = ch->n_new;
    }
    /* tokens: every sequence of a stream gets the stream's tokens */
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        int32_t st = ub->seq[k];
        for (int32_t m = plan->stream_off[i][st]; m < plan->stream_off[i][st + 1]; m++) {
            rs_seq *s = &rs->seqs[plan->stream_ids[i][m]];
            if (!i32vec_push(&s->tokens, ub->token ? ub->token[k] : -1) ||
                !i32vec_push(&s->pos, ub->pos[k]))
                return LLMEM_E_NO_MEMORY;
        }
    }
    return LLMEM_OK;
}

static void rs_release(llmem_memory *mem, const llmem_plan *plan, void *r)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = r;
    /* an applied, uncommitted ubatch may have overwritten checkpoints it reused */
    if (plan->n_applied > plan->n_committed) {
        const rs_ub *t = &res->ub[plan->n_applied - 1];
        int32_t n = t->n_seqs * (1 + t->n_ckpt);
        const int32_t *dst = rs->ib.data.v + t->dst, *ck = rs->ib.data.v + t->ckpt;
        for (int32_t k = 0; k < n; k++) {
            int32_t slot = k < t->n_seqs ? dst[k] : ck[k - t->n_seqs];
            int32_t o = slot >= 0 ? rs->owner[slot] : -1;
            if (o < 0)
                continue;
            rs_hold *h = &rs->seqs[o].h;
            for (int32_t i = 0; i < h->slot.n; i++)
                if (h->slot.v[i] == slot) {
                    h->slot.v[i] = h->slot.v[h->slot.n - 1];
                    h->len.v[i] = h->len.v[h->len.n - 1];
                    h->slot.n--;
                    h->len.n--;
                    slot_free(rs, slot);
                    break;
                }
        }
    }
    res_free(res);
}

/* --- sequences ------------------------------------------------------------------ */

/* Index of the first token whose position is in [p0, p1) if those tokens
 * form a suffix; -1 when they do not; len when there are none. */
static int32_t suffix_start(const rs_seq *s, int32_t p0, int32_t p1)
{
    int32_t n = s->pos.n, first = n;
    for (int32_t j = 0; j < n && first == n; j++)
        if (pos_in_range(s->pos.v[j], p0, p1))
            first = j;
    for (int32_t j = first; j < n; j++)
        if (!pos_in_range(s->pos.v[j], p0, p1))
            return -1;
    return first;
}

static void truncate_to(recurrent *rs, rs_seq *s, int32_t k)
{
    for (int32_t i = s->h.slot.n - 1; i >= 0; i--)
        if (s->h.len.v[i] > k || k == 0) {
            slot_free(rs, s->h.slot.v[i]);
            s->h.slot.v[i] = s->h.slot.v[s->h.slot.n - 1];
            s->h.len.v[i] = s->h.len.v[s->h.len.n - 1];
            s->h.slot.n--;
            s->h.len.n--;
        }
    s->tokens.n = s->pos.n = k;
}

static llmem_status rs_seq_rm(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, bool dry)
{
    recurrent *rs = rs_of(mem);
    rs_seq *s = &rs->seqs[seq];
    int32_t k = suffix_start(s, p0, p1);
    if (k < 0)
        return LLMEM_E_STATE;
    if (k == s->tokens.n)
        return LLMEM_OK;
    if (k > 0 && hold_find(&s->h, k) < 0)
        return LLMEM_E_STATE; /* no checkpoint at that position */
    if (!dry)
        truncate_to(rs, s, k);
    return LLMEM_OK;
}

static llmem_status rs_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                              int32_t p1, bool dry)
{
    recurrent *rs = rs_of(mem);
    rs_seq *a = &rs->seqs[src], *b = &rs->seqs[dst];
    int32_t n = a->tokens.n, k = 0;
    while (k < n && pos_in_range(a->pos.v[k], p0, p1))
        k++;
    for (int32_t j = k; j < n; j++)
        if (pos_in_range(a->pos.v[j], p0, p1))
            return LLMEM_E_STATE;
    int32_t from = k > 0 ? hold_find(&a->h, k) : -1;
    if (k > 0 && from < 0)
        return LLMEM_E_STATE; /* a prefix without a checkpoint */
    if (dry)
        return LLMEM_OK;
    if (!i32vec_reserve(&b->tokens, k) || !i32vec_reserve(&b->pos, k) ||
        !i32vec_reserve(&b->h.slot, 1) || !i32vec_reserve(&b->h.len, 1))
        return LLMEM_E_NO_MEMORY;
    int32_t slot = -1;
    if (k > 0) {
        slot = take_free(rs->owner, rs->n_slots, dst);
        if (slot < 0)
            return LLMEM_E_NO_SPACE;
        llmem_status st = slot_copy(rs, slot, a->h.slot.v[from]);
        if (st != LLMEM_OK) {
            slot_free(rs, slot);
            return st;
        }
    }
    hold_drop_all(rs, b);
    i32_copy(b->tokens.v, a->tokens.v, k);
    i32_copy(b->pos.v, a->pos.v, k);
    b->tokens.n = b->pos.n = k;
    if (k > 0) {
        b->h.slot.v[0] = slot;
        b->h.len.v[0] = k;
        b->h.slot.n = b->h.len.n = 1;
    }
    return LLMEM_OK;
}

static llmem_status rs_seq_keep(llmem_memory *mem, int32_t seq, bool dry)
{
    recurrent *rs = rs_of(mem);
    if (dry)
        return LLMEM_OK;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        if (s != seq)
            truncate_to(rs, &rs->seqs[s], 0);
    return LLMEM_OK;
}

/* Positions only: a recurrent state does not depend on them. */
static llmem_status shift(recurrent *rs, int32_t seq, int32_t p0, int32_t p1, int32_t delta,
                          int32_t div, bool dry)
{
    rs_seq *s = &rs->seqs[seq];
    for (int32_t j = 0; j < s->pos.n; j++) {
        int32_t pos = s->pos.v[j];
        int64_t np = div ? pos / div : (int64_t)pos + delta;
        if (pos_in_range(pos, p0, p1) && (np < 0 || np > INT32_MAX - 1))
            return LLMEM_E_INVALID;
    }
    if (dry)
        return LLMEM_OK;
    for (int32_t j = 0; j < s->pos.n; j++)
        if (pos_in_range(s->pos.v[j], p0, p1))
            s->pos.v[j] = div ? s->pos.v[j] / div : s->pos.v[j] + delta;
    return LLMEM_OK;
}

static llmem_status rs_seq_add(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1,
                               int32_t delta, bool dry)
{
    return shift(rs_of(mem), seq, p0, p1, delta, 0, dry);
}

static llmem_status rs_seq_div(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, int32_t d,
                               bool dry)
{
    return shift(rs_of(mem), seq, p0, p1, 0, d, dry);
}

static int32_t rs_pos_min(llmem_memory *mem, int32_t seq)
{
    return seq_pos_min(&rs_of(mem)->seqs[seq].pos);
}

static int32_t rs_pos_max(llmem_memory *mem, int32_t seq)
{
    return seq_pos_max(&rs_of(mem)->seqs[seq].pos);
}

static int32_t rs_seq_tokens(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap)
{
    return seq_copy_tokens(&rs_of(mem)->seqs[seq].tokens, out, cap);
}

static void fill_all(recurrent *rs, bool nan)
{
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++)
            llmem_buffer_fill(L->buf[j], 0, llmem_buffer_size(L->buf[j]),
                              nan ? llmem_nan_pattern(L->desc[j].dtype) : 0);
    }
}

static llmem_status rs_clear(llmem_memory *mem, bool data)
{
    recurrent *rs = rs_of(mem);
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        rs_seq *q = &rs->seqs[s];
        q->tokens.n = q->pos.n = q->h.slot.n = q->h.len.n = 0;
    }
    for (int32_t i = 0; i < rs->n_slots; i++)
        rs->owner[i] = -1;
    if (data || rs->poison)
        fill_all(rs, rs->poison);
    return LLMEM_OK;
}

/* --- state I/O -------------------------------------------------------------------
 * Payload: i32 n_layers; per layer i32 n_states and per state i32 dtype,
 * n_dims, shape[n_dims] (as i32); i32 n_entries; per entry i32 seq, len,
 * tokens[len], pos[len], then (len > 0) every layer's states of the current
 * slot. Checkpoints are not saved. */

static void put_geometry(recurrent *rs, llmem_state_writer *w)
{
    llmem_state_put_i32(w, rs->base.n_layers);
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        const rs_layer *L = &rs->layers[il];
        llmem_state_put_i32(w, L->n_states);
        for (int32_t j = 0; j < L->n_states; j++) {
            llmem_state_put_i32(w, (int32_t)L->desc[j].dtype);
            llmem_state_put_i32(w, L->desc[j].n_dims);
            for (int32_t d = 0; d < L->desc[j].n_dims; d++)
                llmem_state_put_i32(w, (int32_t)L->desc[j].shape[d]);
        }
    }
}

static llmem_status rs_state_write(llmem_memory *mem, int32_t seq, llmem_state_writer *w)
{
    recurrent *rs = rs_of(mem);
    put_geometry(rs, w);
    int32_t n = 0;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        n += seq >= 0 ? s == seq : rs->seqs[s].tokens.n > 0;
    llmem_state_put_i32(w, n);
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        const rs_seq *q = &rs->seqs[s];
        if (seq >= 0 ? s != seq : q->tokens.n == 0)
            continue;
        llmem_state_put_i32(w, s);
        llmem_state_put_i32(w, q->tokens.n);
        llmem_state_put(w, q->tokens.v, (size_t)q->tokens.n * sizeof(int32_t));
        llmem_state_put(w, q->pos.v, (size_t)q->tokens.n * sizeof(int32_t));
        if (q->tokens.n == 0)
            continue;
        int32_t slot = q->h.slot.v[hold_find(&q->h, q->tokens.n)];
        for (int32_t il = 0; il < mem->n_layers; il++) {
            const rs_layer *L = &rs->layers[il];
            for (int32_t j = 0; j < L->n_states; j++) {
                void *dst = llmem_state_reserve(w, L->bytes[j]);
                llmem_status st = dst ? llmem_buffer_download(L->buf[j],
                                                              (size_t)slot * L->bytes[j], dst,
                                                              L->bytes[j])
                                      : LLMEM_OK;
                if (st != LLMEM_OK)
                    return st;
            }
        }
    }
    return LLMEM_OK;
}

typedef struct rs_entry {
    int32_t seq, len;
    size_t at; /* offset of tokens in the stream */
} rs_entry;

typedef struct rs_tmp {
    const uint8_t *buf;
    int32_t n;
    rs_entry *e;
} rs_tmp;

static void rs_state_read_abort(llmem_memory *mem, void *tmp)
{
    rs_tmp *t = tmp;
    if (t)
        free(t->e);
    free(t);
}

static size_t slot_bytes(const recurrent *rs)
{
    size_t b = 0;
    for (int32_t il = 0; il < rs->base.n_layers; il++)
        for (int32_t j = 0; j < rs->layers[il].n_states; j++)
            b += rs->layers[il].bytes[j];
    return b;
}

static llmem_status rs_state_read_prepare(llmem_memory *mem, int32_t seq, llmem_state_reader *r,
                                          void **out, char *err, size_t err_len)
{
    recurrent *rs = rs_of(mem);
    llmem_state_writer gw = {0};
    put_geometry(rs, &gw);
    uint8_t *geo = malloc(gw.len);
    if (!geo)
        return LLMEM_E_NO_MEMORY;
    gw.buf = geo;
    gw.cap = gw.len;
    gw.len = 0;
    put_geometry(rs, &gw);
    const uint8_t *have = llmem_state_peek(r, gw.len);
    bool same = have && memcmp(have, geo, gw.len) == 0;
    free(geo);
    if (!same) {
        llmem_errf(err, err_len, "recurrent state has other layers or state shapes");
        return have ? LLMEM_E_INVALID : LLMEM_E_CORRUPT;
    }
    int32_t n;
    if (!llmem_state_get_i32(r, &n) || n < 0 || n > mem->n_seq_max || (seq >= 0 && n != 1)) {
        llmem_errf(err, err_len, "recurrent state: bad sequence count");
        return LLMEM_E_CORRUPT;
    }
    rs_tmp *t = calloc(1, sizeof *t);
    if (!t || !(t->e = calloc((size_t)(n > 0 ? n : 1), sizeof *t->e))) {
        free(t);
        return LLMEM_E_NO_MEMORY;
    }
    t->buf = r->buf;
    t->n = n;
    size_t sb = slot_bytes(rs);
    for (int32_t i = 0; i < n; i++) {
        rs_entry *e = &t->e[i];
        bool ok = llmem_state_get_i32(r, &e->seq) && llmem_state_get_i32(r, &e->len) &&
                  e->seq >= 0 && e->seq < mem->n_seq_max && e->len >= 0 &&
                  (size_t)e->len <= r->len / 8;
        for (int32_t k = 0; ok && k < i; k++)
            ok = t->e[k].seq != e->seq;
        e->at = r->pos;
        ok = ok && llmem_state_peek(r, (size_t)e->len * 8) &&
             (e->len == 0 || llmem_state_peek(r, sb));
        for (int32_t j = 0; ok && j < e->len; j++) {
            int32_t p;
            memcpy(&p, r->buf + e->at + (size_t)e->len * 4 + (size_t)j * 4, 4);
            ok = p >= 0 && p < INT32_MAX;
        }
        if (!ok) {
            llmem_errf(err, err_len, "recurrent state entry %d is damaged", i);
            rs_state_read_abort(mem, t);
            return LLMEM_E_CORRUPT;
        }
    }
    *out = t;
    return LLMEM_OK;
}

static bool rs_state_read_seq(llmem_memory *mem, void *tmp, int32_t seq, int32_t *len,
                              const void **tokens, const void **pos)
{
    const rs_tmp *t = tmp;
    for (int32_t i = 0; i < t->n; i++)
        if (t->e[i].seq == seq || (seq < 0 && i == 0)) {
            *len = t->e[i].len;
            *tokens = t->buf + t->e[i].at;
            *pos = t->buf + t->e[i].at + (size_t)t->e[i].len * 4;
            return true;
        }
    return false;
}

static llmem_status rs_state_read_apply(llmem_memory *mem, int32_t seq, void *tmp)
{
    recurrent *rs = rs_of(mem);
    rs_tmp *t = tmp;
    llmem_status st = LLMEM_OK;
    if (seq < 0)
        rs_clear(mem, false);
    else
        truncate_to(rs, &rs->seqs[seq], 0);
    for (int32_t i = 0; i < t->n && st == LLMEM_OK; i++) {
        const rs_entry *e = &t->e[i];
        int32_t id = seq >= 0 ? seq : e->seq;
        rs_seq *s = &rs->seqs[id];
        if (!i32vec_reserve(&s->tokens, e->len) || !i32vec_reserve(&s->pos, e->len) ||
            !i32vec_reserve(&s->h.slot, 1) || !i32vec_reserve(&s->h.len, 1)) {
            st = LLMEM_E_NO_MEMORY;
            break;
        }
        const uint8_t *p = t->buf + e->at;
        s->tokens.n = s->pos.n = e->len;
        if (e->len == 0)
            continue;
        memcpy(s->tokens.v, p, (size_t)e->len * 4);
        memcpy(s->pos.v, p + (size_t)e->len * 4, (size_t)e->len * 4);
        p += (size_t)e->len * 8;
        int32_t slot = take_free(rs->owner, rs->n_slots, id); /* quota guarantees one */
        s->h.slot.v[0] = slot;
        s->h.len.v[0] = e->len;
        s->h.slot.n = s->h.len.n = 1;
        for (int32_t il = 0; il < mem->n_layers && st == LLMEM_OK; il++) {
            const rs_layer *L = &rs->layers[il];
            for (int32_t j = 0; j < L->n_states && st == LLMEM_OK; j++) {
                st = llmem_buffer_upload(L->buf[j], (size_t)slot * L->bytes[j], p, L->bytes[j]);
                p += L->bytes[j];
            }
        }
    }
    rs_state_read_abort(mem, t);
    return st;
}

/* --- introspection ------------------------------------------------------------ */

static void rs_get_stats(llmem_memory *mem, llmem_memory_stats *st)
{
    recurrent *rs = rs_of(mem);
    st->type = "recurrent";
    st->slots_total = rs->n_slots;
    for (int32_t i = 0; i < rs->n_slots; i++)
        st->slots_used += rs->owner[i] >= 0;
    st->bytes_device = (int64_t)(slot_bytes(rs) * (size_t)rs->n_slots);
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        st->n_seqs_live += rs->seqs[s].tokens.n > 0;
}

static llmem_status rs_check(llmem_memory *mem, char *err, size_t err_len)
{
    recurrent *rs = rs_of(mem);
    int32_t held = 0, owned = 0;
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        const rs_seq *q = &rs->seqs[s];
        if (q->tokens.n != q->pos.n || q->h.slot.n != q->h.len.n) {
            llmem_errf(err, err_len, "sequence %d: inconsistent arrays", s);
            return LLMEM_E_STATE;
        }
        if ((q->tokens.n > 0) != (hold_find(&q->h, q->tokens.n) >= 0) ||
            (q->tokens.n == 0 && q->h.slot.n)) {
            llmem_errf(err, err_len, "sequence %d (%d tokens) has no current state slot", s,
                       q->tokens.n);
            return LLMEM_E_STATE;
        }
        if (q->h.slot.n > 1 + rs->n_ckpt) {
            llmem_errf(err, err_len, "sequence %d holds %d slots (max %d)", s, q->h.slot.n,
                       1 + rs->n_ckpt);
            return LLMEM_E_STATE;
        }
        for (int32_t i = 0; i < q->h.slot.n; i++) {
            int32_t slot = q->h.slot.v[i];
            if (slot < 0 || slot >= rs->n_slots || rs->owner[slot] != s ||
                q->h.len.v[i] > q->tokens.n || q->h.len.v[i] < 1) {
                llmem_errf(err, err_len, "sequence %d: slot %d (len %d) not owned or out of range",
                           s, slot, q->h.len.v[i]);
                return LLMEM_E_STATE;
            }
            for (int32_t k = 0; k < i; k++)
                if (q->h.slot.v[k] == slot || q->h.len.v[k] == q->h.len.v[i]) {
                    llmem_errf(err, err_len, "sequence %d: duplicate slot or checkpoint", s);
                    return LLMEM_E_STATE;
                }
        }
        held += q->h.slot.n;
    }
    for (int32_t i = 0; i < rs->n_slots; i++)
        owned += rs->owner[i] >= 0;
    if (owned != held) {
        llmem_errf(err, err_len, "%d slots owned but %d held by sequences", owned, held);
        return LLMEM_E_STATE;
    }
    return LLMEM_OK;
}

static void rs_destroy(llmem_memory *mem)
{
    recurrent *rs = rs_of(mem);
    for (int32_t il = 0; rs->layers && il < mem->n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++) {
            if (L->buf)
                llmem_buffer_free(L->buf[j]);
            if (L->desc)
                free((void *)L->desc[j].name);
        }
        free(L->buf);
        free(L->desc);
        free(L->bytes);
    }
    free(rs->layers);
    for (int32_t s = 0; rs->seqs && s < mem->n_seq_max; s++) {
        i32vec_free(&rs->seqs[s].tokens);
        i32vec_free(&rs->seqs[s].pos);
        i32vec_free(&rs->seqs[s].h.slot);
        i32vec_free(&rs->seqs[s].h.len);
    }
    free(rs->seqs);
    free(rs->owner);
    llmem_buffer_free(rs->idx);
    i32vec_free(&rs->ib.data);
    free(rs);
}

const llmem_memory_i recurrent_iface = {
    .struct_size = sizeof(llmem_memory_i),
    .type = "recurrent",
    .destroy = rs_destroy,
    .reserve = rs_reserve,
    .reserve_prepare = rs_reserve_prepare,
    .apply = rs_apply,
    .view = rs_view,
    .commit = rs_commit,
    .release = rs_release,
    .seq_rm = rs_seq_rm,
    .seq_cp = rs_seq_cp,
    .seq_keep = rs_seq_keep,
    .seq_add = rs_seq_add,
    .seq_div = rs_seq_div,
    .seq_pos_min = rs_pos_min,
    .seq_pos_max = rs_pos_max,
    .seq_tokens = rs_seq_tokens,
    .clear = rs_clear,
    .state_write = rs_state_write,
    .state_read_prepare = rs_state_read_prepare,
    .state_read_apply = rs_state_read_apply,
    .state_read_abort = rs_state_read_abort,
    .get_stats = rs_get_stats,
    .state_read_seq = rs_state_read_seq,
    .check = rs_check,
};

void llmem_recurrent_mamba2_states(int32_t d_conv, int32_t d_inner, int32_t n_groups,
                                   int32_t d_state, int32_t n_heads, int32_t head_dim,
                                   llmem_state_desc out[2])
{
    out[0] = (llmem_state_desc){.name = "conv", .n_dims = 2,
                                .shape = {d_conv - 1, (int64_t)d_inner + 2 * (int64_t)n_groups * d_state},
                                .dtype = LLMEM_DTYPE_F32};
    out[1] = (llmem_state_desc){.name = "ssm", .n_dims = 3,
                                .shape = {n_heads, head_dim, d_state},
                                .dtype = LLMEM_DTYPE_F32};
}

static const char *check_desc(const llmem_state_desc *d, size_t *bytes)
{
    if (d->n_dims < 1 || d->n_dims > LLMEM_STATE_MAX_DIMS)
        return "n_dims must be in [1, 4]";
    if (d->dtype != LLMEM_DTYPE_F32 && d->dtype != LLMEM_DTYPE_F16 && d->dtype != LLMEM_DTYPE_BF16)
        return "dtype must be f32, f16 or bf16";
    size_t n = llmem_dtype_size(d->dtype);
    for (int32_t k = 0; k < d->n_dims; k++) {
        if (d->shape[k] < 1 || d->shape[k] > INT32_MAX)
            return "every dimension must be in [1, 2^31)";
        if (n > SIZE_MAX / (size_t)d->shape[k])
            return "state size overflows";
        n *= (size_t)d->shape[k];
    }
    *bytes = n;
    return NULL;
}

llmem_status llmem_recurrent_create(llmem_backend *be, const llmem_recurrent_params *p,
                                    llmem_memory **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!be || !p || !out || (p->n_layers > 0 && (!p->n_states || !p->states))) {
        llmem_errf(err, err_len, "NULL argument");
        return LLMEM_E_INVALID;
    }
    if (p->n_layers < 1 || p->n_seq_max < 1 || p->n_ckpt < 0 || p->n_ckpt > 64 ||
        (int64_t)p->n_seq_max * (2 + p->n_ckpt) > INT32_MAX) {
        llmem_errf(err, err_len,
                   "recurrent memory: need n_layers >= 1, n_seq_max >= 1, 0 <= n_ckpt <= 64");
        return LLMEM_E_INVALID;
    }
    recurrent *rs = calloc(1, sizeof *rs);
    if (!rs)
        return LLMEM_E_NO_MEMORY;
    llmem_memory_init(&rs->base, &recurrent_iface, be, p->n_layers, p->n_seq_max,
                      LLMEM_SPLIT_EQUAL, true);
    rs->n_ckpt = p->n_ckpt;
    rs->quota = 2 + p->n_ckpt;
    rs->n_slots = p->n_seq_max * rs->quota;
    rs->poison = p->poison || llmem_env_poison();
    llmem_status st = LLMEM_E_NO_MEMORY;
    rs->layers = calloc((size_t)p->n_layers, sizeof *rs->layers);
    rs->seqs = calloc((size_t)p->n_seq_max, sizeof *rs->seqs);
    rs->owner = malloc((size_t)rs->n_slots * sizeof *rs->owner);
    if (!rs->layers || !rs->seqs || !rs->owner)
        goto fail;
    for (int32_t i = 0; i < rs->n_slots; i++)
        rs->owner[i] = -1;
    for (int32_t il = 0; il < p->n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        int32_t n = p->n_states[il];
        if (n < 0 || n > 16 || (n > 0 && !p->states[il])) {
            llmem_errf(err, err_len, "recurrent memory: layer %d: bad state count %d", il, n);
            st = LLMEM_E_INVALID;
            goto fail;
        }
        if (n == 0)
            continue;
        L->desc = calloc((size_t)n, sizeof *L->desc);
        L->bytes = calloc((size_t)n, sizeof *L->bytes);
        L->buf = calloc((size_t)n, sizeof *L->buf);
        if (!L->desc || !L->bytes || !L->buf)
            goto fail;
        L->n_states = n;
        for (int32_t j = 0; j < n; j++) {
            const llmem_state_desc *d = &p->states[il][j];
            const char *bad = check_desc(d, &L->bytes[j]);
            if (!bad && L->bytes[j] > SIZE_MAX / (size_t)rs->n_slots)
                bad = "state pool size overflows";
            if (bad) {
                llmem_errf(err, err_len, "recurrent memory: layer %d state %d: %s", il, j, bad);
                st = LLMEM_E_INVALID;
                goto fail;
            }
            L->desc[j] = *d;
            L->desc[j].name = NULL;
            char *name = malloc(d->name ? strlen(d->name) + 1 : 1);
            if (!name)
                goto fail;
            strcpy(name, d->name ? d->name : "");
            L->desc[j].name = name;
            st = llmem_buffer_alloc(be, L->bytes[j] * (size_t)rs->n_slots, &L->buf[j]);
            if (st != LLMEM_OK) {
                llmem_errf(err, err_len, "recurrent memory: cannot allocate %zu bytes for layer %d state %d",
                           L->bytes[j] * (size_t)rs->n_slots, il, j);
                goto fail;
            }
        }
    }
    if (rs->poison)
        fill_all(rs, true);
    *out = &rs->base;
    return LLMEM_OK;
fail:
    rs_destroy(&rs->base);
    return st;
}

int32_t llmem_recurrent_seq_slot(llmem_memory *mem, int32_t seq_id)
{
    recurrent *rs = rs_of(mem);
    if (!rs || seq_id < 0 || seq_id >= mem->n_seq_max)
        return -1;
    const rs_seq *s = &rs->seqs[seq_id];
    int32_t i = s->tokens.n > 0 ? hold_find(&s->h, s->tokens.n) : -1;
    return i >= 0 ? s->h.slot.v[i] : -1;
}

int32_t llmem_recurrent_checkpoints(llmem_memory *mem, int32_t seq_id, int32_t *pos, int32_t cap)
{
    recurrent *rs = rs_of(mem);
    if (!rs || seq_id < 0 || seq_id >= mem->n_seq_max)
        return -1;
    const rs_seq *s = &rs->seqs[seq_id];
    int32_t n = 0;
    for (int32_t i = 0; i < s->h.len.n; i++) {
        int32_t l = s->h.len.v[i];
        if (l == s->tokens.n)
            continue;
        if (pos && n < cap)
            pos[n] = s->pos.v[l - 1];
        n++;
    }
    return n;
}

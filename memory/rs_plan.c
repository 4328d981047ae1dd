/* llmem memory/: planning of the recurrent-state memory — slot choices
 * for every ubatch simulated at reserve time (nothing changes before
 * commit), the views' src / dst / checkpoint slot tables, commit and
 * release. References: Mamba-2 / SSD (Dao & Gu, ICML 2024); llama.cpp
 * llama_memory_recurrent; vLLM's Mamba cache. */
#include <stdlib.h>
#include <string.h>

#include "memory/prefix_budget.h"
#include "memory/rs_internal.h"

/* --- planning ------------------------------------------------------------------ */

/* Host-tier entries the plan pinned and has not restored go back on the LRU. */
static void unpin_host(recurrent *rs, rs_res *res)
{
    for (int32_t k = 0; k < res->rest_entry.n; k++)
        if (res->rest_entry.v[k] >= 0) {
            host_tier_unpin(rs->host, res->rest_entry.v[k]);
            res->rest_entry.v[k] = -1;
        }
}

static void res_free(recurrent *rs, rs_res *res)
{
    if (!res)
        return;
    unpin_host(rs, res);
    i32vec_free(&res->rest_snap);
    i32vec_free(&res->rest_entry);
    for (int32_t u = 0; u < res->n_ub; u++) {
        free(res->ub[u].change);
        free(res->ub[u].pool);
        free(res->ub[u].mid);
    }
    free(res->ub);
    i32vec_free(&res->pins);
    free(res);
}

static bool hold_copy(rs_hold *dst, const rs_hold *src)
{
    if (src->n > dst->cap)
        return false;
    i32_copy(dst->v, src->v, src->n);
    i32_copy(hold_lens(dst), hold_lens(src), src->n);
    dst->n = src->n;
    return true;
}

/* Records what a sequence holds after a ubatch, in the ubatch's pool
 * (room holdings per change: n_ckpt + 2 suffice for a trimmed hold, which
 * has at most n_ckpt + 1). Nothing is copied when h already lives in the
 * change's place (one_ubatch_hold). */
static bool change_set(rs_ub *t, int32_t room, int32_t seq, const rs_hold *h,
                       int32_t copy_from)
{
    rs_change *c = &t->change[t->n_change];
    if (h->n > room)
        return false;
    c->seq = seq;
    c->copy_from = copy_from;
    c->n_new = h->n;
    c->new_slot = t->pool + (size_t)t->n_change * 2 * (size_t)room;
    c->new_len = c->new_slot + room;
    t->n_change++;
    if (h->v != c->new_slot) {
        i32_copy(c->new_slot, h->v, h->n);
        i32_copy(c->new_len, hold_lens(h), h->n);
    }
    return true;
}

/* A plan of one ubatch (a decode step) meets each sequence once, so the
 * holdings it simulates for a sequence are that sequence's change: they
 * are simulated in the change's place in the ubatch's pool (room entries
 * each), copied there from what the sequence holds, instead of in a
 * per-sequence copy that change_set copies again (at thousands of
 * sequences, two arrays of ~80 bytes per sequence and step that missed
 * the cache). false when out of room (never: room bounds a hold). */
static bool one_ubatch_hold(const recurrent *rs, rs_ub *t, int32_t room, int32_t seq, rs_hold *h)
{
    int32_t *at = t->pool + (size_t)t->n_change * 2 * (size_t)room;
    *h = (rs_hold){at, 0, room};
    return hold_copy(h, &rs->seqs[seq].h);
}

/* Snapshots inside ubatch u (llmem_recurrent_params.snap_in_ubatch): for
 * each group whose sequence's snap_at (llmem_plan_seq) lies strictly inside its tokens
 * here, a slot off the simulated free stack fs, taken after every state
 * of the ubatch has its slot (so it never costs a sequence a fresh slot),
 * written by the kernels after that token and back on fs from the next
 * ubatch on (pending): the commit copies it into a snapshot
 * (publish_snapshots). No free slot: no snapshot (a cache entry). len[a]
 * is already the group's length after the ubatch. false: out of memory. */
static bool mid_snapshots(idx_builder *ib, const llmem_plan *plan, int32_t u, rs_ub *t,
                          const int32_t *len, sim_stack *fs, i32vec *pending)
{
    const llmem_ubatch *ub = &plan->ubatch[u];
    for (int32_t s = 0; s < ub->n_seqs && sim_stack_n(fs) > 0; s++) {
        int32_t a = ub->seq_id[s], T = ub->n_seq_tokens, L = len[a] - T;
        int32_t e = llmem_plan_seq_index(plan, a), k = e >= 0 ? plan->snap_at[e] : 0;
        if (k <= L || k >= L + T)
            continue;
        if (!t->mid) { /* the view's two tables (room reserved by simulate) */
            t->mid = malloc((size_t)ub->n_seqs * sizeof *t->mid);
            t->snap_tok = idx_append(ib, NULL, ub->n_seqs, -1);
            t->snap_slot = idx_append(ib, NULL, ub->n_seqs, -1);
            if (!t->mid || t->snap_tok < 0 || t->snap_slot < 0)
                return false;
        }
        int32_t slot = sim_stack_pop(fs);
        if (!i32vec_push(pending, slot))
            return false;
        t->mid[t->n_mid++] = (rs_mid){a, slot, k};
        ib->data.v[t->snap_tok + s] = k - L - 1; /* the state after token k - 1 of the group */
        ib->data.v[t->snap_slot + s] = slot;
    }
    return true;
}

/* Makes entry s of simulate's scratch this plan's (its length as the
 * memory holds it, no prefix hit), once per plan. false: out of memory. */
static bool sim_touch(recurrent *rs, int32_t s)
{
    if (rs->sim_stamp[s] == rs->sim_gen)
        return true;
    rs->sim_stamp[s] = rs->sim_gen;
    rs->sim_len[s] = rs->seqs[s].tokens.n;
    rs->sim_from[s] = -1;
    return i32vec_push(&rs->sim_seqs, s);
}

/* A new generation of simulate's scratch, holding the plan's sequences
 * (sim_seqs.v[i] is plan->seqs[i].id). O(the plan's sequences), not
 * n_seq_max. */
static bool sim_begin(recurrent *rs, const llmem_plan *plan)
{
    if (++rs->sim_gen == 0) { /* wrapped: every stamp is stale */
        memset(rs->sim_stamp, 0, (size_t)rs->base.n_seq_max * sizeof *rs->sim_stamp);
        rs->sim_gen = 1;
    }
    rs->sim_seqs.n = rs->sim_top.n = rs->sim_pending.n = 0;
    for (int32_t k = 0; k < plan->n_seqs; k++)
        if (!sim_touch(rs, plan->seqs[k].id))
            return false;
    return true;
}

static llmem_status simulate(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                             size_t err_len)
{
    recurrent *rs = rs_of(mem);
    llmem_status st = LLMEM_E_NO_MEMORY;
    rs_res *res = calloc(1, sizeof *res);
    /* a plan of one ubatch simulates in its changes (one_ubatch_hold) */
    bool one = plan->n_ubatch == 1;
    /* per sequence of the plan (sim_begin): its holdings, length and hit */
    rs_hold *sim = rs->sim_hold;
    int32_t *len = rs->sim_len, *from_snap = rs->sim_from;
    /* the free-slot stack as the plan's commits will leave it: slots are
     * taken from its top, those a ubatch drops come back after it */
    sim_stack fs = {rs->free_stack, rs->n_free, &rs->sim_top};
    int32_t *sim_pool = NULL; /* every sim[s]'s arrays (never reallocated: room suffices) */
    i32vec *pending = &rs->sim_pending; /* slots a ubatch drops; free only after it */
    if (!res || !sim_begin(rs, plan))
        goto out;
    res->cur = -1;
    res->prepared = res->copied = -1;
    res->ub = calloc((size_t)plan->n_ubatch, sizeof *res->ub);
    if (!res->ub)
        goto out;
    res->n_ub = plan->n_ubatch;
    /* prefix hits of empty sequences: device snapshots first (pinned as
     * they are), then host-tier ones, each to come back into a device
     * snapshot that no hit of this plan reads, or, when every snapshot is
     * taken, into a free state slot the first ubatch reads (rest_snap
     * -1 - slot; the entry then stays in the tier) */
    bool hits = plan->info.n_tokens_cached > 0; /* then in sequence order, as slot
                                                   choices depend on it */
    for (int32_t pass = 0; pass < 2 && hits; pass++)
        for (int32_t q = 0; q < plan->n_seqs; q++) {
            int32_t s = plan->seqs[q].id, c = plan->seqs[q].n_cached;
            const int32_t *tok = plan->seq_tokens ? plan->seq_tokens[q] : NULL;
            if (c <= 0 || rs->seqs[s].tokens.n != 0 || from_snap[s] >= 0)
                continue;
            if (pass == 0) {
                int32_t i = tok ? snap_find(rs, tok, c) : -1;
                if (i < 0 || rs->snap[i].len != c)
                    continue;
                from_snap[s] = rs->snap_base + i;
                if (!i32vec_push(&res->pins, i))
                    goto out;
                continue;
            }
            int32_t e = tok ? snap_host_find(rs, tok, c) : -1, to = INT32_MIN;
            for (int32_t k = 0; e >= 0 && k < res->rest_entry.n && to == INT32_MIN; k++)
                if (res->rest_entry.v[k] == e)
                    to = res->rest_snap.v[k]; /* another sequence brings it back */
            if (e >= 0 && to == INT32_MIN) {
                int32_t i = snap_victim(rs, res->pins.v, res->pins.n);
                if (i >= 0)
                    to = i;
                else if (sim_stack_n(&fs) > 0)
                    to = -1 - sim_stack_pop(&fs);
                if (to != INT32_MIN) {
                    if (!i32vec_push(&res->rest_snap, to) || !i32vec_push(&res->rest_entry, -1))
                        goto out;
                    host_tier_pin(rs->host, e);
                    res->rest_entry.v[res->rest_entry.n - 1] = e;
                }
            }
            if (to == INT32_MIN) {
                llmem_errf(err, err_len,
                           "recurrent memory: sequence %d: no snapshot of its first %d tokens%s",
                           s, c, e >= 0 ? " in a slot it can come back into" : "");
                st = e >= 0 ? LLMEM_E_NO_SPACE : LLMEM_E_STATE;
                goto out;
            }
            from_snap[s] = to >= 0 ? rs->snap_base + to : -1 - to;
            if (to >= 0 && !i32vec_push(&res->pins, to))
                goto out;
        }
    /* simulated holdings live in one pool: a hold has at most n_ckpt + 1
     * entries, plus the 1 + n_ckpt a ubatch adds before trimming */
    int32_t room = 2 * rs->n_ckpt + 4, n_sim = one ? 0 : rs->sim_seqs.n;
    sim_pool = one ? NULL : malloc((size_t)(n_sim > 0 ? n_sim : 1) * 2 * (size_t)room *
                                   sizeof *sim_pool);
    if (!one && !sim_pool)
        goto out;
    for (int32_t i = 0, k = 0; i < plan->n_seqs; i++) {
        const llmem_plan_seq *e = &plan->seqs[i];
        int32_t s = e->id;
        /* room for the ids and positions the commits append, so that a
         * commit needs no host memory (kv_reserve does the same) */
        if (!tok_stage_reserve(&rs->seqs[s].tokens, e->n_new) ||
            !seq_pos_reserve_push(&rs->seqs[s].pos, e->n_new, e->first_pos))
            goto out;
        if (from_snap[s] >= 0) /* a prefix hit: the first ubatch reads the snapshot in place */
            len[s] = e->n_cached;
        if (one)
            continue;
        sim[s] = (rs_hold){sim_pool + (size_t)k * 2 * (size_t)room, 0, room};
        k++;
        if (!hold_copy(&sim[s], &rs->seqs[s].h))
            goto out;
    }
    int64_t elems = 0;
    int32_t n_copy = 0; /* the most stream members of a ubatch: its commit's state copies */
    /* snapshots the plan asks for may be written inside ubatches (mid_snapshots) */
    bool mids = rs->snap_in_ubatch && plan->snap_at;
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        int32_t T = ub->n_seq_tokens, c = T - 1 < rs->n_ckpt ? T - 1 : rs->n_ckpt;
        elems += (int64_t)ub->n_seqs * (3 + c + (mids && T > 1 ? 2 : 0));
        if (plan->group_off[u][ub->n_seqs] - ub->n_seqs > n_copy)
            n_copy = plan->group_off[u][ub->n_seqs] - ub->n_seqs;
    }
    if (n_copy > 0 && slot_copy_reserve(rs, n_copy) != LLMEM_OK)
        goto out;
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
        t->snap_tok = t->snap_slot = -1;
        int32_t n_change = plan->group_off[u][ub->n_seqs];
        t->change = calloc((size_t)(n_change > 0 ? n_change : 1), sizeof *t->change);
        /* holdings per change: a trimmed hold has at most n_ckpt + 1; one
         * simulated in its change's place (one_ubatch_hold) also holds the
         * 1 + c new states before trimming, at most n_ckpt + 2 in a decode
         * step (c = 0), which is what commit then reads */
        int32_t room_c = one && c > 0 ? room : rs->n_ckpt + 2;
        t->pool = malloc((size_t)(n_change > 0 ? n_change : 1) * 2 * (size_t)room_c *
                         sizeof *t->pool);
        if (!t->change || !t->pool)
            goto out;
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            int32_t a = ub->seq_id[s];
            rs_hold loc, *h = one ? &loc : &sim[a];
            int32_t L = len[a];
            if (one && !one_ubatch_hold(rs, t, room_c, a, h))
                goto out;
            for (int32_t m = plan->group_off[u][s] + 1; m < plan->group_off[u][s + 1]; m++)
                if (len[plan->group_ids[u][m]] != L) {
                    llmem_errf(err, err_len,
                               "recurrent memory: a token is shared by sequences %d (%d tokens) "
                               "and %d (%d tokens); shared tokens need equal histories",
                               a, L, plan->group_ids[u][m], len[plan->group_ids[u][m]]);
                    st = LLMEM_E_INVALID;
                    goto out;
                }
            int32_t cur = hold_find(h, L);
            ib->data.v[t->src + s] = L <= 0 ? -1 : cur >= 0 ? h->v[cur] : from_snap[a];
            /* slots for the 1 + c new states: fresh ones up to the quota, then
             * the oldest checkpoints (never the current state) */
            int32_t need = 1 + c, got[64], *g = need <= 64 ? got : malloc((size_t)need * sizeof *g);
            if (!g)
                goto out;
            for (int32_t k = 0; k < need; k++) {
                int32_t slot = -1;
                if (h->n + k < rs->quota)
                    slot = sim_stack_pop(&fs);
                if (slot < 0) {
                    int32_t oldest = -1;
                    for (int32_t i = 0; i < h->n; i++)
                        if (hold_lens(h)[i] != L && (oldest < 0 || hold_lens(h)[i] < hold_lens(h)[oldest]))
                            oldest = i;
                    if (oldest < 0) {
                        if (g != got)
                            free(g);
                        llmem_errf(err, err_len, "recurrent memory: no state slot for sequence %d", a);
                        st = LLMEM_E_NO_SPACE;
                        goto out;
                    }
                    slot = h->v[oldest];
                    h->v[oldest] = h->v[h->n - 1];
                    hold_lens(h)[oldest] = hold_lens(h)[h->n - 1];
                    h->n--;
                }
                g[k] = slot;
            }
            ib->data.v[t->dst + s] = g[c];
            for (int32_t j = 0; j < c; j++)
                ib->data.v[t->ckpt + s * t->n_ckpt + j] = g[j];
            for (int32_t k = 0; k < need; k++) {
                int32_t l = k < c ? L + T - c + k : L + T;
                if (!hold_push(h, g[k], l)) { /* room is a bound */
                    if (g != got)
                        free(g);
                    goto out;
                }
            }
            if (g != got)
                free(g);
            /* keep the newest 1 + n_ckpt states */
            while (h->n > 1 + rs->n_ckpt) {
                int32_t oldest = 0;
                for (int32_t i = 1; i < h->n; i++)
                    if (hold_lens(h)[i] < hold_lens(h)[oldest])
                        oldest = i;
                /* freed at this ubatch's commit: reusable from the next one */
                if (!i32vec_push(pending, h->v[oldest]))
                    goto out;
                h->v[oldest] = h->v[h->n - 1];
                hold_lens(h)[oldest] = hold_lens(h)[h->n - 1];
                h->n--;
            }
            len[a] = L + T;
            if (!change_set(t, room_c, a, h, -1))
                goto out;
            /* other sequences of the stream get a copy of the final state */
            for (int32_t m = plan->group_off[u][s] + 1; m < plan->group_off[u][s + 1]; m++) {
                int32_t b = plan->group_ids[u][m];
                rs_hold locb, *hb = one ? &locb : &sim[b];
                if (one && !one_ubatch_hold(rs, t, room_c, b, hb))
                    goto out;
                /* the copy (rs_commit_prepare) goes to a free slot, or
                 * else to a held checkpoint, never over the state the
                 * member holds now while another is left: a failed copy,
                 * or a commit that does not follow it, then leaves every
                 * state the member holds intact (the quota leaves room for
                 * one slot more than a trimmed hold) */
                int32_t at = -1, keep = -1;
                if (sim_stack_n(&fs) > 0 && hb->n < rs->quota) {
                    keep = sim_stack_pop(&fs);
                } else {
                    for (int32_t i = 0; i < hb->n && at < 0; i++)
                        if (hold_lens(hb)[i] != L)
                            at = i;
                    at = at < 0 && hb->n > 0 ? 0 : at;
                    keep = at >= 0 ? hb->v[at] : -1;
                }
                for (int32_t i = 0; i < hb->n; i++)
                    if (i != at && !i32vec_push(pending, hb->v[i]))
                        goto out;
                hb->n = 1;
                hb->v[0] = keep;
                hold_lens(hb)[0] = L + T;
                len[b] = L + T;
                if (!change_set(t, room_c, b, hb, ib->data.v[t->dst + s]))
                    goto out;
            }
        }
        if (mids && T > 1 && !mid_snapshots(ib, plan, u, t, len, &fs, pending))
            goto out;
        for (int32_t k = 0; k < pending->n && u + 1 < plan->n_ubatch; k++)
            if (!i32vec_push(fs.top, pending->v[k]))
                goto out;
        pending->n = 0;
    }
    if ((st = idx_upload(rs->idx, ib)) != LLMEM_OK)
        goto out;
    *out = res;
    res = NULL;
out:
    res_free(rs, res);
    free(sim_pool);
    return st;
}

/* A reservation changes nothing the memory holds (slot choices are
 * simulated and applied at commit), so simulating is the check; the result
 * is kept for rs_reserve. */
llmem_status rs_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                size_t err_len)
{
    recurrent *rs = rs_of(mem);
    rs_drop_stash(rs);
    void *res = NULL;
    llmem_status st = simulate(mem, plan, &res, err, err_len);
    if (st == LLMEM_OK) {
        rs->stash = res;
        rs->stash_plan = plan;
    }
    return st;
}

llmem_status rs_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                        size_t err_len)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = NULL;
    if (rs->stash && rs->stash_plan == plan) {
        res = rs->stash;
        rs->stash = NULL;
        rs->stash_plan = NULL;
    } else {
        rs_drop_stash(rs);
        llmem_status st = simulate(mem, plan, (void **)&res, err, err_len);
        if (st != LLMEM_OK)
            return st;
    }
    /* the snapshots its hits read stay until release; a hit is a use (LRU) */
    for (int32_t k = 0; k < res->pins.n; k++) {
        rs->snap[res->pins.v[k]].ref++;
        rs->snap[res->pins.v[k]].lru = ++*rs->clock;
    }
    *out = res;
    return LLMEM_OK;
}

void rs_drop_stash(recurrent *rs)
{
    res_free(rs, rs->stash);
    rs->stash = NULL;
    rs->stash_plan = NULL;
}

llmem_status rs_apply(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    rs_res *res = r;
    res->cur = i;
    if (res->restored)
        return LLMEM_OK;
    /* host-tier hits come back before any ubatch reads them (all children
     * of a composition have reserved by now) */
    res->restored = true;
    recurrent *rs = rs_of(mem);
    for (int32_t k = 0; k < res->rest_entry.n; k++) {
        int32_t to = res->rest_snap.v[k], e = res->rest_entry.v[k];
        llmem_status st = to >= 0 ? snap_restore(rs, to, e) : snap_upload(rs, -1 - to, e);
        if (st != LLMEM_OK)
            return st; /* the rest stay pinned until release */
        if (to < 0)
            host_tier_unpin(rs->host, e);
        res->rest_entry.v[k] = -1;
    }
    return LLMEM_OK;
}

llmem_status rs_view(llmem_memory *mem, void *r, int32_t il, llmem_view *view)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = r;
    const rs_ub *t = &res->ub[res->cur];
    const rs_layer *L = &rs->layers[il];
    if (L->n_states == 0) {
        *view = llmem_view_make(LLMEM_VIEW_NONE, NULL, 0, NULL);
        return LLMEM_OK;
    }
    llmem_rs_view *v = &rs->layers[il].view; /* one per layer: views of a ubatch coexist */
    *view = llmem_view_make(LLMEM_VIEW_RECURRENT, v, sizeof *v, rs->idx);
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
    bool mid = t->n_mid > 0;
    v->snap_tok = idx_table(&rs->ib, mid ? t->snap_tok : 0, mid ? t->n_seqs : 0);
    v->snap_slot = idx_table(&rs->ib, mid ? t->snap_slot : 0, mid ? t->n_seqs : 0);
    return LLMEM_OK;
}

/* After ubatch i is written: publishes, for each sequence that computed
 * it, each new state whose length is a multiple of snap_interval, the
 * plan's cut for it (snap_at), or the end of its tokens in this plan when
 * it took more than one (the end of a prompt). Stream members that got a
 * copy of another's state publish nothing of their own. */
static llmem_status publish_snapshots(recurrent *rs, const llmem_plan *plan, const rs_ub *t,
                                      int32_t i)
{
    if (rs->n_snap == 0)
        return LLMEM_OK;
    for (int32_t c = 0; c < t->n_change; c++) {
        const rs_change *ch = &t->change[c];
        if (ch->copy_from >= 0)
            continue;
        int32_t q = ch->seq;
        rs_seq *s = &rs->seqs[q];
        int32_t before = s->tokens.n - t->n_seq_tokens;
        /* the plan's entry: looked up once a new state lies past the
         * sequence's length before this ubatch (a decode step's always does) */
        int32_t e = -2, end = -1, snap = 0;
        for (int32_t m = 0; m < ch->n_new; m++) {
            int32_t l = ch->new_len[m];
            if (l <= before)
                continue;
            if (e == -2) {
                e = llmem_plan_seq_index(plan, q);
                const llmem_plan_seq *pe = e >= 0 ? &plan->seqs[e] : NULL;
                end = pe && pe->n_new > 1 ? pe->first_pos + pe->n_new : -1;
                snap = e >= 0 && plan->snap_at ? plan->snap_at[e] : 0;
            }
            bool want = (rs->snap_interval > 0 && l % rs->snap_interval == 0) || l == end ||
                        (snap > 0 && snap == l);
            if (!want)
                continue;
            /* a snapshot that cannot be recorded (out of host memory) is
             * not published: it is a cache entry, and the commit has taken
             * the ubatch's tokens and states already, so failing it here
             * would leave them half done (snap_publish leaves the snapshot
             * slots consistent on every failure) */
            (void)snap_publish(rs, s, ch->new_slot[m], l);
        }
    }
    (void)i;
    /* the states written inside the ubatch at the plan's cuts */
    for (int32_t m = 0; m < t->n_mid; m++)
        (void)snap_publish(rs, &rs->seqs[t->mid[m].seq], t->mid[m].slot, t->mid[m].len);
    /* every snapshot copy of the ubatch, one batch. A failed one drops the
     * snapshots it was filling (and those they replaced): cache entries,
     * like a snapshot that could not be recorded above; the ubatch's own
     * states, which the copies only read, stand, and so does the commit */
    if (slot_copy_flush(rs) != LLMEM_OK)
        rs->snap_copy_failures++;
    /* their slots were never any sequence's: free (and poisoned) after the copies */
    for (int32_t m = 0; m < t->n_mid; m++)
        slot_free(rs, t->mid[m].slot);
    return LLMEM_OK;
}

/* The fallible device work of commit i, before the commit changes
 * anything: stream members take the state their stream computed, one
 * batch of copies into slots no sequence reads now (simulate picks them),
 * so a failure, or a commit that does not follow (another child of a
 * composition failed), leaves the memory as it was. */
llmem_status rs_commit_prepare(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = r;
    const rs_ub *t = &res->ub[i];
    (void)plan;
    for (int32_t c = 0; c < t->n_change; c++) {
        const rs_change *ch = &t->change[c];
        if (ch->copy_from >= 0) {
            llmem_status st = slot_copy_queue(rs, ch->new_slot[0], ch->copy_from);
            if (st != LLMEM_OK) {
                rs->n_pend = rs->pend_slot.n = 0; /* none of them ran */
                return st;
            }
        }
    }
    res->copied = i; /* a failed batch may have written some (rs_release) */
    llmem_status st = slot_copy_flush(rs);
    res->prepared = st == LLMEM_OK ? i : -1;
    return st;
}

llmem_status rs_commit(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = r;
    const rs_ub *t = &res->ub[i];
    const llmem_ubatch *ub = &plan->ubatch[i];
    if (res->prepared != i) { /* a caller that skipped commit_prepare */
        llmem_status st = rs_commit_prepare(mem, plan, r, i);
        if (st != LLMEM_OK)
            return st;
    }
    /* from here on nothing fails but a broken invariant's guard */
    for (int32_t c = 0; c < t->n_change; c++) {
        const rs_change *ch = &t->change[c];
        rs_seq *s = &rs->seqs[ch->seq];
#if defined(__GNUC__)
        if (c + 8 < t->n_change) { /* decode: records of thousands of sequences */
            int32_t q = t->change[c + 8].seq;
            __builtin_prefetch(&rs->seqs[q], 1, 1);
            __builtin_prefetch(rs->hold + (size_t)q * 2 * (size_t)(1 + rs->n_ckpt), 1, 1);
        }
#endif
        /* free what the sequence no longer holds, take what it now holds */
        for (int32_t k = 0; k < s->h.n; k++) {
            bool kept = false;
            for (int32_t m = 0; m < ch->n_new && !kept; m++)
                kept = ch->new_slot[m] == s->h.v[k];
            if (!kept)
                slot_free(rs, s->h.v[k]);
        }
        s->h.n = 0;
        if (ch->n_new > s->h.cap)
            return LLMEM_E_STATE; /* never: a trimmed hold has at most 1 + n_ckpt */
        for (int32_t m = 0; m < ch->n_new; m++) {
            slot_take(rs, ch->new_slot[m], ch->seq);
            s->h.v[m] = ch->new_slot[m];
            hold_lens(&s->h)[m] = ch->new_len[m];
        }
        s->h.n = ch->n_new;
    }
    /* a sequence that started from a snapshot takes its tokens first */
    for (int32_t c = 0; plan->info.n_tokens_cached > 0 && c < t->n_change; c++) {
        int32_t q = t->change[c].seq;
        rs_seq *s = &rs->seqs[q];
        if (s->tokens.n != 0)
            continue;
        int32_t e = llmem_plan_seq_index(plan, q);
        int32_t n = e >= 0 ? plan->seqs[e].n_cached : 0;
        if (n <= 0 || !plan->seq_tokens)
            continue;
        if (!i32vec_reserve(&s->tokens, n))
            return LLMEM_E_NO_MEMORY;
        for (int32_t j = 0; j < n; j++)
            s->tokens.v[j] = plan->seq_tokens[e][j];
        s->tokens.n = n;
        seq_pos_set_run(&s->pos, n, 0);
        rs->snap_hit_tokens += n;
    }
    /* tokens: every sequence of a stream gets the stream's tokens (loop
     * invariants in locals: a full stage's write and a stored position's
     * append call out, and the compiler reloaded them every token) */
    const int32_t *ids = plan->group_ids[i], *off = plan->group_off[i];
    const int32_t *tok = ub->token, *pos = ub->pos;
    rs_seq *seqs = rs->seqs;
    tok_stage *stage = rs->stage;
    const bool spread = rs->stage_spread;
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        int32_t st = ub->seq[k];
        if (k + 8 < ub->n_tokens) { /* decode: records of thousands of sequences */
            int32_t q = ids[off[ub->seq[k + 8]]];
            const rs_seq *ahead = &seqs[q];
#if defined(__GNUC__)
            __builtin_prefetch(&stage[q], 1, 1);
#endif
            if (ahead->pos.stored)
                i32vec_prefetch_tail(&ahead->pos.v);
        }
        for (int32_t m = off[st]; m < off[st + 1]; m++) {
            int32_t q = ids[m];
            rs_seq *s = &seqs[q];
            tok_stage *g = &stage[q];
            if (!tok_stage_push(g, &s->tokens, tok ? tok[k] : -1, spread ? q : -1))
                return LLMEM_E_NO_MEMORY;
            if (!seq_pos_push(&s->pos, pos[k])) {
                tok_stage_pop(g, &s->tokens); /* token and position go together */
                return LLMEM_E_NO_MEMORY;
            }
        }
    }
    return publish_snapshots(rs, plan, t, i);
}

/* Drops `slot`, whose state an uncommitted ubatch overwrote, from the
 * holdings of the sequence that owns it (if any); never a sequence's
 * current state when `keep_current`. */
static void drop_overwritten(recurrent *rs, int32_t slot, bool keep_current)
{
    int32_t o = slot >= 0 ? rs->owner[slot] : -1;
    if (o < 0)
        return;
    rs_hold *h = &rs->seqs[o].h;
    for (int32_t i = 0; i < h->n; i++)
        if (h->v[i] == slot) {
            if (keep_current && hold_lens(h)[i] == rs->seqs[o].tokens.n)
                return;
            h->v[i] = h->v[h->n - 1];
            hold_lens(h)[i] = hold_lens(h)[h->n - 1];
            h->n--;
            slot_free(rs, slot);
            return;
        }
}

void rs_release(llmem_memory *mem, const llmem_plan *plan, void *r)
{
    recurrent *rs = rs_of(mem);
    rs_res *res = r;
    /* an applied, uncommitted ubatch may have overwritten checkpoints it
     * reused, and its commit_prepare the checkpoints its stream copies
     * went to when no slot was free (simulate) */
    if (plan->n_applied > plan->n_committed) {
        int32_t u = plan->n_applied - 1;
        const rs_ub *t = &res->ub[u];
        int32_t n = t->n_seqs * (1 + t->n_ckpt);
        const int32_t *dst = rs->ib.data.v + t->dst, *ck = rs->ib.data.v + t->ckpt;
        for (int32_t k = 0; k < n; k++)
            drop_overwritten(rs, k < t->n_seqs ? dst[k] : ck[k - t->n_seqs], false);
        for (int32_t c = 0; res->copied == u && c < t->n_change; c++)
            if (t->change[c].copy_from >= 0)
                drop_overwritten(rs, t->change[c].new_slot[0], true);
    }
    /* a hit's snapshot is as recent as the pages it was read with, which
     * become cached at their release: a later eviction takes neither first */
    for (int32_t k = 0; k < res->pins.n; k++) {
        rs_snap *q = &rs->snap[res->pins.v[k]];
        q->ref--;
        if (q->len > 0)
            q->lru = ++*rs->clock;
    }
    res_free(rs, res);
    /* what the plan pinned past the budget (restored snapshots) goes now */
    if (rs->budget)
        prefix_budget_make_room(rs->budget, 0);
}


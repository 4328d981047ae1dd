/* llmem memory/: state I/O (section payload, framed by memory.c), stats
 * and the invariant checker of the recurrent-state memory. */
#include <stdlib.h>
#include <string.h>

#include "memory/prefix_budget.h"
#include "memory/rs_internal.h"

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

llmem_status rs_state_write(llmem_memory *mem, int32_t seq, llmem_state_writer *w)
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
        rs_tokens_sync(rs, q);
        llmem_state_put(w, q->tokens.v, (size_t)q->tokens.n * sizeof(int32_t));
        seq_pos_put(&q->pos, w, q->tokens.n);
        if (q->tokens.n == 0)
            continue;
        int32_t slot = q->h.v[hold_find(&q->h, q->tokens.n)];
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

void rs_state_read_abort(llmem_memory *mem, void *tmp)
{
    rs_tmp *t = tmp;
    if (t)
        free(t->e);
    free(t);
}

size_t rs_slot_bytes(const recurrent *rs)
{
    size_t b = 0;
    for (int32_t il = 0; il < rs->base.n_layers; il++)
        for (int32_t j = 0; j < rs->layers[il].n_states; j++)
            b += rs->layers[il].bytes[j];
    return b;
}

llmem_status rs_state_read_prepare(llmem_memory *mem, int32_t seq, llmem_state_reader *r,
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
    if (!llmem_state_get_i32(r, &n) || n < 0 || (seq >= 0 && n != 1)) {
        llmem_errf(err, err_len, "recurrent state: bad sequence count");
        return LLMEM_E_CORRUPT;
    }
    if (n > mem->n_seq_max) { /* written by a memory with a larger n_seq_max */
        llmem_errf(err, err_len, "recurrent state holds %d sequences; this memory has n_seq_max %d",
                   n, mem->n_seq_max);
        return LLMEM_E_INVALID;
    }
    rs_tmp *t = calloc(1, sizeof *t);
    if (!t || !(t->e = calloc((size_t)(n > 0 ? n : 1), sizeof *t->e))) {
        free(t);
        return LLMEM_E_NO_MEMORY;
    }
    t->buf = r->buf;
    t->n = n;
    size_t sb = rs_slot_bytes(rs);
    for (int32_t i = 0; i < n; i++) {
        rs_entry *e = &t->e[i];
        bool ok = llmem_state_get_i32(r, &e->seq) && llmem_state_get_i32(r, &e->len) &&
                  e->seq >= 0 && e->len >= 0 && (size_t)e->len <= r->len / 8;
        if (ok && e->seq >= mem->n_seq_max) { /* another geometry, not damage */
            llmem_errf(err, err_len, "recurrent state: sequence id %d, this memory has n_seq_max %d",
                       e->seq, mem->n_seq_max);
            rs_state_read_abort(mem, t);
            return LLMEM_E_INVALID;
        }
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
    /* the host room rs_state_read_apply takes, taken before it drops
     * anything (capacity only: the memory reads the same afterwards) */
    for (int32_t i = 0; i < n; i++) {
        rs_seq *s = &rs->seqs[seq >= 0 ? seq : t->e[i].seq];
        if (!i32vec_reserve(&s->tokens, t->e[i].len) || !seq_pos_reserve(&s->pos, t->e[i].len)) {
            llmem_errf(err, err_len, "recurrent state: out of host memory for its tokens");
            rs_state_read_abort(mem, t);
            return LLMEM_E_NO_MEMORY;
        }
    }
    *out = t;
    return LLMEM_OK;
}

bool rs_state_read_seq(llmem_memory *mem, void *tmp, int32_t seq, int32_t *len,
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

llmem_status rs_state_read_apply(llmem_memory *mem, int32_t seq, void *tmp)
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
        if (!i32vec_reserve(&s->tokens, e->len) || !seq_pos_reserve(&s->pos, e->len)) {
            st = LLMEM_E_NO_MEMORY;
            break;
        }
        const uint8_t *p = t->buf + e->at;
        snap_seq_cut(rs, s, 0);
        s->tokens.n = e->len;
        if (e->len == 0) {
            seq_pos_clear(&s->pos);
            continue;
        }
        memcpy(s->tokens.v, p, (size_t)e->len * 4);
        memcpy(s->pos.v.v, p + (size_t)e->len * 4, (size_t)e->len * 4);
        seq_pos_written(&s->pos, e->len);
        p += (size_t)e->len * 8;
        int32_t slot = slot_pop(rs, id); /* quota guarantees one */
        s->h.v[0] = slot;
        hold_lens(&s->h)[0] = e->len;
        s->h.n = 1;
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

void rs_get_stats(llmem_memory *mem, llmem_memory_stats *st)
{
    recurrent *rs = rs_of(mem);
    st->type = "recurrent";
    st->slots_total = rs->n_seq_slots;
    st->slots_used = rs->n_seq_slots - rs->n_free;
    st->bytes_device = (int64_t)(rs_slot_bytes(rs) * (size_t)rs->n_slots);
    st->snapshots = snap_count(rs);
    st->snapshot_bytes = st->snapshots * (int64_t)rs_slot_bytes(rs);
    st->snapshot_hit_tokens = rs->snap_hit_tokens;
    host_tier_usage(rs->host, rs, &st->host_tier_snapshots, &st->host_tier_snapshot_bytes, NULL);
    st->host_tier_snapshot_hits = rs->host_restores;
    st->snapshot_evictions = rs->snap_evictions;
    st->snapshot_copy_failures = rs->snap_copy_failures;
    st->prefix_cache_bytes = rs->budget ? rs->budget->bytes : 0;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        st->n_seqs_live += rs->seqs[s].tokens.n > 0;
}

llmem_status rs_check(llmem_memory *mem, char *err, size_t err_len)
{
    recurrent *rs = rs_of(mem);
    int32_t held = 0, owned = 0;
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        const rs_seq *q = &rs->seqs[s];
        if (q->tokens.n != q->pos.v.n || q->h.cap != 1 + rs->n_ckpt ||
            q->h.v != rs->hold + (size_t)s * 2 * (size_t)q->h.cap || !tok_stage_ok(&rs->stage[s], &q->tokens)) {
            llmem_errf(err, err_len, "sequence %d: inconsistent arrays", s);
            return LLMEM_E_STATE;
        }
        if (!seq_pos_ok(&q->pos)) {
            llmem_errf(err, err_len, "sequence %d: positions (min/max %d/%d, %s) inconsistent", s,
                       q->pos.pm.min, q->pos.pm.max, q->pos.stored ? "stored" : "a run");
            return LLMEM_E_STATE;
        }
        if ((q->tokens.n > 0) != (hold_find(&q->h, q->tokens.n) >= 0) ||
            (q->tokens.n == 0 && q->h.n)) {
            llmem_errf(err, err_len, "sequence %d (%d tokens) has no current state slot", s,
                       q->tokens.n);
            return LLMEM_E_STATE;
        }
        if (q->h.n > 1 + rs->n_ckpt) {
            llmem_errf(err, err_len, "sequence %d holds %d slots (max %d)", s, q->h.n,
                       1 + rs->n_ckpt);
            return LLMEM_E_STATE;
        }
        for (int32_t i = 0; i < q->h.n; i++) {
            int32_t slot = q->h.v[i];
            if (slot < 0 || slot >= rs->n_seq_slots || rs->owner[slot] != s ||
                hold_lens(&q->h)[i] > q->tokens.n || hold_lens(&q->h)[i] < 1) {
                llmem_errf(err, err_len, "sequence %d: slot %d (len %d) not owned or out of range",
                           s, slot, hold_lens(&q->h)[i]);
                return LLMEM_E_STATE;
            }
            for (int32_t k = 0; k < i; k++)
                if (q->h.v[k] == slot || hold_lens(&q->h)[k] == hold_lens(&q->h)[i]) {
                    llmem_errf(err, err_len, "sequence %d: duplicate slot or checkpoint", s);
                    return LLMEM_E_STATE;
                }
        }
        held += q->h.n;
    }
    for (int32_t i = 0; i < rs->n_seq_slots; i++) {
        owned += rs->owner[i] >= 0;
        int32_t at = rs->free_at[i];
        if ((rs->owner[i] >= 0) != (at < 0) ||
            (at >= 0 && (at >= rs->n_free || rs->free_stack[at] != i))) {
            llmem_errf(err, err_len, "slot %d: owner %d but free-stack place %d", i,
                       rs->owner[i], at);
            return LLMEM_E_STATE;
        }
    }
    if (owned != held || owned + rs->n_free != rs->n_seq_slots) {
        llmem_errf(err, err_len, "%d slots owned but %d held by sequences, %d free", owned,
                   held, rs->n_free);
        return LLMEM_E_STATE;
    }
    if (!snap_check(rs, err, err_len) || !host_tier_check(rs->host, err, err_len) ||
        !prefix_budget_check(rs->budget, mem, err, err_len))
        return LLMEM_E_STATE;
    if (rs->host && !rs->base.plan) { /* pins live only in a prepared plan */
        int32_t pinned = 0, want = 0;
        host_tier_usage(rs->host, rs, NULL, NULL, &pinned);
        const rs_res *res = rs->stash;
        for (int32_t k = 0; res && k < res->rest_entry.n; k++)
            want += res->rest_entry.v[k] >= 0;
        if (pinned != want) {
            llmem_errf(err, err_len, "host tier: %d snapshots pinned, %d by the prepared plan",
                       pinned, want);
            return LLMEM_E_STATE;
        }
    }
    return LLMEM_OK;
}


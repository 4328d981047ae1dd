/* llmem memory/: recurrent-state memory — state slots per sequence,
 * checkpoints for rollback, sequence operations, creation. Planning over
 * EQUAL-split ubatches is in rs_plan.c, state I/O and checks in rs_state.c.
 * References: Mamba-2 / SSD (Dao & Gu, ICML 2024) for the state shapes;
 * llama.cpp llama_memory_recurrent and vLLM's Mamba cache for slot
 * management; speculative-decoding rollback by checkpoint as in vLLM's
 * hybrid prefix caching of Mamba states. */
#include <stdlib.h>
#include <string.h>

#include "memory/prefix_budget.h"
#include "memory/rs_internal.h"

_Static_assert(sizeof(void *) != 8 || sizeof(rs_seq) == 64, "rs_seq is one cache line");

int32_t hold_find(const rs_hold *h, int32_t len)
{
    for (int32_t i = 0; i < h->n; i++)
        if (hold_lens(h)[i] == len)
            return i;
    return -1;
}

llmem_status slot_copy_reserve(recurrent *rs, int32_t n)
{
    int64_t need = 0;
    for (int32_t il = 0; il < rs->base.n_layers; il++)
        need += rs->layers[il].n_states;
    need = rs->n_pend + need * n;
    if (need > INT32_MAX || (int64_t)rs->pend_slot.n + n > INT32_MAX)
        return LLMEM_E_NO_MEMORY;
    if (need > rs->cap_pend) {
        int32_t cap = rs->cap_pend > 0 ? rs->cap_pend : 64;
        while (cap < need)
            cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
        llmem_copy_range *p = realloc(rs->pend, (size_t)cap * sizeof *p);
        if (!p)
            return LLMEM_E_NO_MEMORY;
        rs->pend = p;
        rs->cap_pend = cap;
    }
    return i32vec_reserve(&rs->pend_slot, rs->pend_slot.n + n) ? LLMEM_OK : LLMEM_E_NO_MEMORY;
}

llmem_status slot_copy_queue(recurrent *rs, int32_t dst, int32_t src)
{
    llmem_status st = slot_copy_reserve(rs, 1);
    if (st != LLMEM_OK)
        return st;
    rs->pend_slot.v[rs->pend_slot.n++] = dst;
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++)
            rs->pend[rs->n_pend++] = (llmem_copy_range){
                L->buf[j], (size_t)dst * L->bytes[j], L->buf[j], (size_t)src * L->bytes[j],
                L->bytes[j]};
    }
    if (dst >= rs->snap_base)
        rs->snap[dst - rs->snap_base].pend = true;
    return LLMEM_OK;
}

llmem_status slot_copy_flush(recurrent *rs)
{
    if (rs->pend_slot.n == 0)
        return LLMEM_OK;
    llmem_status st = llmem_buffer_copy_ranges(rs->pend, rs->n_pend);
    for (int32_t k = 0; k < rs->pend_slot.n; k++) {
        int32_t i = rs->pend_slot.v[k] - rs->snap_base;
        if (i < 0)
            continue;
        rs_snap *q = &rs->snap[i];
        q->pend = false;
        if (st != LLMEM_OK && q->len > 0) { /* its state never arrived */
            q->len = 0;
            q->tokens.n = 0;
            rs->n_live_snap--;
        }
    }
    rs->n_pend = 0;
    rs->pend_slot.n = 0;
    return st;
}

llmem_status slot_copy(recurrent *rs, int32_t dst, int32_t src)
{
    llmem_status st = slot_copy_flush(rs); /* nothing is queued here; be safe */
    if (st == LLMEM_OK)
        st = slot_copy_queue(rs, dst, src);
    if (st == LLMEM_OK)
        st = slot_copy_flush(rs);
    return st;
}

void slot_free(recurrent *rs, int32_t slot)
{
    if (rs->owner[slot] >= 0) {
        rs->free_at[slot] = rs->n_free;
        rs->free_stack[rs->n_free++] = slot;
    }
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

void hold_drop_all(recurrent *rs, rs_seq *s)
{
    for (int32_t i = 0; i < s->h.n; i++)
        slot_free(rs, s->h.v[i]);
    s->h.n = 0;
}

void slot_take(recurrent *rs, int32_t slot, int32_t seq)
{
    if (rs->owner[slot] < 0) {
        int32_t i = rs->free_at[slot], last = rs->free_stack[--rs->n_free];
        rs->free_stack[i] = last;
        rs->free_at[last] = i;
        rs->free_at[slot] = -1;
    }
    rs->owner[slot] = seq;
}

int32_t slot_pop(recurrent *rs, int32_t seq)
{
    if (rs->n_free == 0)
        return -1;
    int32_t slot = rs->free_stack[rs->n_free - 1];
    slot_take(rs, slot, seq);
    return slot;
}

/* LLMEM_SNAPSHOTS=<n>[:<interval>]; false when set but malformed. */
static bool env_snapshots(int32_t *n, int32_t *interval)
{
    const char *e = getenv("LLMEM_SNAPSHOTS");
    if (!e || !*e)
        return true;
    char *end = NULL;
    long a = strtol(e, &end, 10), b = *interval;
    if (end == e || a < 0 || a > (1 << 20))
        return false;
    if (*end == ':') {
        const char *f = end + 1;
        b = strtol(f, &end, 10);
        if (end == f || b < 0 || b > (1 << 30))
            return false;
    }
    if (*end)
        return false;
    *n = (int32_t)a;
    *interval = (int32_t)b;
    return true;
}

static void slots_reset(recurrent *rs)
{
    rs->n_free = 0;
    for (int32_t i = rs->n_seq_slots - 1; i >= 0; i--) {
        rs->owner[i] = -1;
        rs->free_at[i] = rs->n_free;
        rs->free_stack[rs->n_free++] = i;
    }
}

/* --- sequences ------------------------------------------------------------------ */

void truncate_to(recurrent *rs, rs_seq *s, int32_t k)
{
    rs_tokens_sync(rs, s);
    for (int32_t i = s->h.n - 1; i >= 0; i--)
        if (hold_lens(&s->h)[i] > k || k == 0) {
            slot_free(rs, s->h.v[i]);
            s->h.v[i] = s->h.v[s->h.n - 1];
            hold_lens(&s->h)[i] = hold_lens(&s->h)[s->h.n - 1];
            s->h.n--;
        }
    s->tokens.n = k;
    seq_pos_truncate(&s->pos, k);
    snap_seq_cut(rs, s, k);
}

static llmem_status rs_seq_rm(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, bool dry)
{
    recurrent *rs = rs_of(mem);
    rs_seq *s = &rs->seqs[seq];
    int32_t k = seq_pos_suffix_start(&s->pos, p0, p1);
    if (k < 0)
        return LLMEM_E_STATE;
    if (k == s->tokens.n)
        return LLMEM_OK;
    if (k > 0 && hold_find(&s->h, k) < 0)
        return LLMEM_E_STATE; /* no checkpoint at that position */
    if (dry)
        return LLMEM_OK;
    if (k == 0 && rs->n_snap > 0) {
        /* a finished conversation: its last state becomes a snapshot so a
         * prompt that extends it resumes there (best effort: a failed copy
         * only loses the snapshot) */
        int32_t i = hold_find(&s->h, s->tokens.n);
        if (i >= 0) {
            (void)snap_publish(rs, s, s->h.v[i], s->tokens.n);
            (void)slot_copy_flush(rs); /* before truncate_to frees (poisons) the slot */
        }
    }
    truncate_to(rs, s, k);
    return LLMEM_OK;
}

static llmem_status rs_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                              int32_t p1, bool dry)
{
    recurrent *rs = rs_of(mem);
    rs_seq *a = &rs->seqs[src], *b = &rs->seqs[dst];
    int32_t k = seq_pos_prefix_len(&a->pos, p0, p1);
    if (k < 0)
        return LLMEM_E_STATE;
    int32_t from = k > 0 ? hold_find(&a->h, k) : -1;
    if (k > 0 && from < 0)
        return LLMEM_E_STATE; /* a prefix without a checkpoint */
    if (dry)
        return LLMEM_OK;
    if (!i32vec_reserve(&b->tokens, k) || (a->pos.stored && !seq_pos_reserve(&b->pos, k)))
        return LLMEM_E_NO_MEMORY;
    int32_t slot = -1;
    if (k > 0) {
        slot = slot_pop(rs, dst);
        if (slot < 0)
            return LLMEM_E_NO_SPACE;
        llmem_status st = slot_copy(rs, slot, a->h.v[from]);
        if (st != LLMEM_OK) {
            slot_free(rs, slot);
            return st;
        }
    }
    hold_drop_all(rs, b);
    snap_seq_cut(rs, b, 0);
    rs_tokens_sync(rs, a);
    rs->stage[dst].n = 0; /* b's tokens are replaced */
    i32_copy(b->tokens.v, a->tokens.v, k);
    b->tokens.n = k;
    (void)seq_pos_copy_prefix(&b->pos, &a->pos, k); /* room reserved above */
    if (k > 0) {
        b->h.v[0] = slot;
        hold_lens(&b->h)[0] = k;
        b->h.n = 1;
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
    for (int32_t j = 0; j < s->pos.v.n; j++) {
        int32_t pos = seq_pos_at(&s->pos, j);
        int64_t np = div ? pos / div : (int64_t)pos + delta;
        if (pos_in_range(pos, p0, p1) && (np < 0 || np > INT32_MAX - 1))
            return LLMEM_E_INVALID;
    }
    /* shifted positions are stored (in the dry run too, so that the real
     * one cannot fail for it) */
    if (!seq_pos_store(&s->pos, 0))
        return LLMEM_E_NO_MEMORY;
    if (dry)
        return LLMEM_OK;
    int32_t *v = s->pos.v.v;
    for (int32_t j = 0; j < s->pos.v.n; j++)
        if (pos_in_range(v[j], p0, p1))
            v[j] = div ? v[j] / div : v[j] + delta;
    seq_pos_meta_reset(&s->pos);
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
    return rs_of(mem)->seqs[seq].pos.pm.min;
}

static int32_t rs_pos_max(llmem_memory *mem, int32_t seq)
{
    return rs_of(mem)->seqs[seq].pos.pm.max;
}

static int32_t rs_seq_tokens(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap)
{
    recurrent *rs = rs_of(mem);
    rs_tokens_sync(rs, &rs->seqs[seq]);
    return seq_copy_tokens(&rs->seqs[seq].tokens, out, cap);
}

void fill_all(recurrent *rs, bool nan)
{
    for (int32_t il = 0; il < rs->base.n_layers; il++) {
        rs_layer *L = &rs->layers[il];
        for (int32_t j = 0; j < L->n_states; j++)
            llmem_buffer_fill(L->buf[j], 0, llmem_buffer_size(L->buf[j]),
                              nan ? llmem_nan_pattern(L->desc[j].dtype) : 0);
    }
}

llmem_status rs_clear(llmem_memory *mem, bool data)
{
    recurrent *rs = rs_of(mem);
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        rs_seq *q = &rs->seqs[s];
        q->tokens.n = q->h.n = 0;
        rs->stage[s].n = 0;
        seq_pos_clear(&q->pos);
        snap_seq_cut(rs, q, 0);
    }
    rs_drop_stash(rs); /* it may pin host-tier snapshots */
    slots_reset(rs);
    snap_reset(rs);
    if (data || rs->poison)
        fill_all(rs, rs->poison);
    return LLMEM_OK;
}

static void rs_destroy(llmem_memory *mem)
{
    recurrent *rs = rs_of(mem);
    rs_drop_stash(rs);
    host_tier_unref(rs->host); /* first: it may wait for copies into its blocks */
    rs->host = NULL;
    prefix_budget_leave(rs->budget, mem);
    rs->budget = NULL;
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
        i32vec_free(&rs->seqs[s].pos.v);
    }
    for (int32_t s = 0; rs->chain && s < mem->n_seq_max; s++)
        free(rs->chain[s].blk);
    free(rs->chain);
    free(rs->stage);
    free(rs->hold);
    seq_heap_destroy(rs->heap);
    free(rs->seqs);
    free(rs->owner);
    snap_finish(rs);
    free(rs->pend);
    i32vec_free(&rs->pend_slot);
    free(rs->free_stack);
    free(rs->free_at);
    rs_drop_stash(rs);
    llmem_buffer_free(rs->idx);
    i32vec_free(&rs->ib.data);
    free(rs->sim_stamp);
    free(rs->sim_len);
    free(rs->sim_from);
    free(rs->sim_hold);
    i32vec_free(&rs->sim_seqs);
    i32vec_free(&rs->sim_top);
    i32vec_free(&rs->sim_pending);
    free(rs);
}

const llmem_memory_i recurrent_iface = {
    .struct_size = sizeof(llmem_memory_i),
    .type = "recurrent",
    .destroy = rs_destroy,
    .prefix_match = rs_prefix_match,
    .reserve = rs_reserve,
    .reserve_prepare = rs_reserve_prepare,
    .apply = rs_apply,
    .view = rs_view,
    .commit = rs_commit,
    .commit_prepare = rs_commit_prepare,
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
    if (d->dtype != LLMEM_DTYPE_F32 && d->dtype != LLMEM_DTYPE_F16 &&
        d->dtype != LLMEM_DTYPE_BF16 && d->dtype != LLMEM_DTYPE_I8)
        return "dtype must be f32, f16, bf16 or int8";
    for (int32_t k = 0; k < d->n_dims; k++)
        if (d->shape[k] < 1 || d->shape[k] > INT32_MAX)
            return "every dimension must be in [1, 2^31)";
    /* I8: codes plus one f32 scale per outermost index (llmem_state_slot_bytes) */
    size_t n = llmem_state_slot_bytes(d);
    if (n == 0)
        return "state size overflows";
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
    int32_t n_snap = p->n_snapshots, interval = p->snap_interval;
    if (n_snap == 0 && !env_snapshots(&n_snap, &interval)) {
        llmem_errf(err, err_len, "LLMEM_SNAPSHOTS must be <n>[:<interval>]");
        return LLMEM_E_INVALID;
    }
    if (p->prefix_cache_bytes < 0) {
        llmem_errf(err, err_len, "recurrent memory: prefix_cache_bytes must be >= 0");
        return LLMEM_E_INVALID;
    }
    if (n_snap == -1 || (n_snap > 0 && p->prefix_cache_bytes > 0)) {
        /* one snapshot is one state slot of every layer */
        size_t slot = 0, b = 0;
        for (int32_t il = 0; il < p->n_layers; il++)
            for (int32_t j = 0; p->states[il] && j < p->n_states[il] && j < 16; j++)
                if (!check_desc(&p->states[il][j], &b))
                    slot += b;
        if (p->prefix_cache_bytes <= 0 || slot == 0 || (uint64_t)p->prefix_cache_bytes < slot) {
            llmem_errf(err, err_len,
                       "recurrent memory: prefix_cache_bytes %lld cannot hold one snapshot "
                       "(%zu bytes: a state slot of every layer)%s",
                       (long long)p->prefix_cache_bytes, slot,
                       n_snap < 0 ? "; n_snapshots -1 sizes the snapshots from it" : "");
            return LLMEM_E_INVALID;
        }
        if (n_snap < 0) {
            uint64_t k = (uint64_t)p->prefix_cache_bytes / slot;
            n_snap = k > RS_SNAP_FROM_BUDGET_MAX ? RS_SNAP_FROM_BUDGET_MAX : (int32_t)k;
        }
    }
    if (n_snap < 0 || interval < 0 ||
        (int64_t)p->n_seq_max * (2 + p->n_ckpt) + n_snap > INT32_MAX / 2) {
        llmem_errf(err, err_len,
                   "recurrent memory: need n_snapshots >= -1, snap_interval >= 0");
        return LLMEM_E_INVALID;
    }
    recurrent *rs = calloc(1, sizeof *rs);
    if (!rs) {
        llmem_errf(err, err_len, "recurrent memory: out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    llmem_status st = llmem_memory_init(&rs->base, &recurrent_iface, be, p->n_layers,
                                        p->n_seq_max, LLMEM_SPLIT_EQUAL, true);
    if (st != LLMEM_OK) {
        llmem_memory_iface_check(&recurrent_iface, err, err_len);
        free(rs);
        return st;
    }
    rs->n_ckpt = p->n_ckpt;
    rs->quota = 2 + p->n_ckpt;
    rs->n_seq_slots = rs->snap_base = p->n_seq_max * rs->quota;
    rs->n_snap = n_snap;
    rs->snap_interval = interval;
    rs->snap_in_ubatch = p->snap_in_ubatch && n_snap != 0;
    rs->clock = &rs->snap_clock;
    rs->n_slots = rs->n_seq_slots + rs->n_snap;
    rs->poison = p->poison || llmem_env_poison();
    rs->stage_spread = tok_stage_spread_env();
    st = LLMEM_E_NO_MEMORY;
    rs->layers = calloc((size_t)p->n_layers, sizeof *rs->layers);
    /* line-aligned: a sequence's record is one cache line (rs_seq) */
    rs->seqs = aligned_alloc(64, (size_t)p->n_seq_max * sizeof *rs->seqs);
    rs->chain = calloc((size_t)p->n_seq_max, sizeof *rs->chain);
    rs->stage = aligned_alloc(64, (size_t)p->n_seq_max * sizeof *rs->stage);
    rs->hold = malloc((size_t)p->n_seq_max * 2 * (size_t)(1 + p->n_ckpt) * sizeof *rs->hold);
    rs->owner = malloc((size_t)rs->n_slots * sizeof *rs->owner);
    rs->free_stack = malloc((size_t)rs->n_slots * sizeof *rs->free_stack);
    rs->free_at = malloc((size_t)rs->n_slots * sizeof *rs->free_at);
    rs->sim_stamp = calloc((size_t)p->n_seq_max, sizeof *rs->sim_stamp);
    rs->sim_len = malloc((size_t)p->n_seq_max * sizeof *rs->sim_len);
    rs->sim_from = malloc((size_t)p->n_seq_max * sizeof *rs->sim_from);
    rs->sim_hold = malloc((size_t)p->n_seq_max * sizeof *rs->sim_hold);
    rs->snap = calloc((size_t)(rs->n_snap > 0 ? rs->n_snap : 1), sizeof *rs->snap);
    if (rs->seqs)
        memset(rs->seqs, 0, (size_t)p->n_seq_max * sizeof *rs->seqs);
    if (rs->stage)
        memset(rs->stage, 0, (size_t)p->n_seq_max * sizeof *rs->stage);
    if (!rs->layers || !rs->seqs || !rs->chain || !rs->stage || !rs->hold || !rs->owner || !rs->free_stack ||
        !rs->free_at || !rs->snap || !rs->sim_stamp || !rs->sim_len || !rs->sim_from ||
        !rs->sim_hold) {
        llmem_errf(err, err_len, "recurrent memory: out of host memory for %d slots",
                   rs->n_slots);
        goto fail;
    }
    slots_reset(rs);
    rs->heap = seq_heap_create();
    for (int32_t s = 0; s < p->n_seq_max; s++) {
        rs_seq *q = &rs->seqs[s];
        seq_pos_clear(&q->pos);
        q->h = (rs_hold){rs->hold + (size_t)s * 2 * (size_t)(1 + p->n_ckpt), 0, 1 + p->n_ckpt};
        if (!seq_heap_attach(rs->heap, &q->tokens) || !seq_heap_attach(rs->heap, &q->pos.v)) {
            llmem_errf(err, err_len, "recurrent memory: out of host memory for %d sequences",
                       p->n_seq_max);
            goto fail;
        }
    }
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
        st = LLMEM_E_NO_MEMORY;
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
            st = LLMEM_E_NO_MEMORY;
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
    int64_t host_bytes = p->host_tier_bytes;
    const char *mb = getenv("LLMEM_HOST_TIER_MB");
    if (host_bytes < 0) {
        llmem_errf(err, err_len, "recurrent memory: host_tier_bytes must be >= 0");
        st = LLMEM_E_INVALID;
        goto fail;
    }
    if (host_bytes == 0 && mb && atoll(mb) > 0)
        host_bytes = atoll(mb) * 1048576;
    if (host_bytes > 0 && rs->n_snap > 0 && !(rs->host = host_tier_create((size_t)host_bytes, be))) {
        llmem_errf(err, err_len, "recurrent memory: out of host memory for a %lld-byte host tier",
                   (long long)host_bytes);
        goto fail;
    }
    if (p->prefix_cache_bytes > 0 && rs->n_snap > 0) {
        st = LLMEM_E_NO_MEMORY;
        if (!(rs->budget = prefix_budget_create(p->prefix_cache_bytes)) ||
            !prefix_budget_join(rs->budget, &rs->base)) {
            llmem_errf(err, err_len, "recurrent memory: out of host memory");
            goto fail;
        }
        prefix_budget_unref(rs->budget); /* the member's reference remains */
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
    return i >= 0 ? s->h.v[i] : -1;
}

int32_t llmem_recurrent_checkpoints(llmem_memory *mem, int32_t seq_id, int32_t *pos, int32_t cap)
{
    recurrent *rs = rs_of(mem);
    if (!rs || seq_id < 0 || seq_id >= mem->n_seq_max)
        return -1;
    const rs_seq *s = &rs->seqs[seq_id];
    int32_t n = 0;
    for (int32_t i = 0; i < s->h.n; i++) {
        int32_t l = hold_lens(&s->h)[i];
        if (l == s->tokens.n)
            continue;
        if (pos && n < cap)
            pos[n] = seq_pos_at(&s->pos, l - 1);
        n++;
    }
    return n;
}

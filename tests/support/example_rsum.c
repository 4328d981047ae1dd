/* The running-sum cache type (example_rsum.h): an out-of-tree memory that
 * includes only public llmem headers. Its plan reserves nothing (sequence
 * s owns slot s), its views name each group's slot in an index table built
 * with llmem_idx_builder, and its sequences keep token ids and positions
 * with the public helpers of <llmem/memory_impl.h>.
 */
#include "support/example_rsum.h"

#include <stdlib.h>
#include <string.h>

#include "llmem/memory_impl.h"

typedef struct rsum_seq {
    llmem_i32vec tokens, pos;
    llmem_pos_meta pm;
} rsum_seq;

typedef struct rsum {
    llmem_memory base;
    int32_t dim;
    llmem_buffer **state; /* [n_layers] of [n_seq_max][dim] f32 */
    rsum_view *views;     /* [n_layers] what view() last described */
    rsum_seq *seqs;       /* [n_seq_max] */
    llmem_idx_builder ib;
    llmem_buffer *idx;
} rsum;

/* A plan's reservation: where each ubatch's slot table starts in ib. */
typedef struct rsum_res {
    const llmem_plan *plan; /* a composition's child has no plan of its own */
    int32_t n_ub, cur;
    int32_t off[];
} rsum_res;

static const llmem_memory_i rsum_iface;

static rsum *rsum_of(llmem_memory *mem)
{
    return LLMEM_MEMORY_CAST(rsum, mem, &rsum_iface);
}

static size_t slot_bytes(const rsum *r)
{
    return (size_t)r->dim * sizeof(float);
}

/* The running sum of an empty sequence is zero. */
static llmem_status zero_slot(rsum *r, int32_t s)
{
    for (int32_t il = 0; il < r->base.n_layers; il++) {
        llmem_status st = llmem_buffer_fill(r->state[il], (size_t)s * slot_bytes(r),
                                            slot_bytes(r), 0);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

static void seq_reset(rsum_seq *q)
{
    q->tokens.n = q->pos.n = 0;
    q->pm = (llmem_pos_meta){-1, -1, false};
}

static void rsum_destroy(llmem_memory *mem)
{
    rsum *r = rsum_of(mem);
    if (!r)
        return;
    for (int32_t il = 0; r->state && il < mem->n_layers; il++)
        llmem_buffer_free(r->state[il]);
    for (int32_t s = 0; r->seqs && s < mem->n_seq_max; s++) {
        llmem_i32vec_free(&r->seqs[s].tokens);
        llmem_i32vec_free(&r->seqs[s].pos);
    }
    llmem_i32vec_free(&r->ib.data);
    llmem_buffer_free(r->idx);
    free(r->state);
    free(r->views);
    free(r->seqs);
    free(r);
}

static llmem_status rsum_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                                 size_t err_len)
{
    rsum *r = rsum_of(mem);
    rsum_res *res = malloc(sizeof *res + (size_t)plan->n_ubatch * sizeof(int32_t));
    if (!res)
        return LLMEM_E_NO_MEMORY;
    res->plan = plan;
    res->n_ub = plan->n_ubatch;
    res->cur = -1;
    r->ib.data.n = 0;
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        for (int32_t s = 0; s < ub->n_seqs; s++)
            if (plan->group_off[u][s + 1] - plan->group_off[u][s] != 1) {
                llmem_errf(err, err_len, "rsum: a token in several sequences is not supported");
                free(res);
                return LLMEM_E_INVALID;
            }
        /* sequence s owns slot s: the table is the groups' sequence ids */
        res->off[u] = llmem_idx_append(&r->ib, ub->seq_id, ub->n_seqs, 0);
        if (res->off[u] < 0) {
            free(res);
            return LLMEM_E_NO_MEMORY;
        }
    }
    llmem_status st = llmem_idx_ensure(mem->backend, &r->idx, r->ib.data.n);
    if (st == LLMEM_OK)
        st = llmem_idx_upload(r->idx, &r->ib);
    if (st != LLMEM_OK) {
        free(res);
        return st;
    }
    *out = res;
    return LLMEM_OK;
}

static llmem_status rsum_apply(llmem_memory *mem, const llmem_plan *plan, void *res, int32_t i)
{
    (void)mem;
    (void)plan;
    ((rsum_res *)res)->cur = i;
    return LLMEM_OK;
}

static llmem_status rsum_view_fn(llmem_memory *mem, void *vres, int32_t il, llmem_view *view)
{
    rsum *r = rsum_of(mem);
    rsum_res *res = vres;
    const llmem_ubatch *ub = &res->plan->ubatch[res->cur];
    rsum_view *v = &r->views[il];
    v->state = r->state[il];
    v->dim = r->dim;
    v->n_slots = mem->n_seq_max;
    v->n_seqs = ub->n_seqs;
    v->n_seq_tokens = ub->n_seq_tokens;
    v->slot = llmem_idx_table(&r->ib, res->off[res->cur], ub->n_seqs);
    *view = llmem_view_make(RSUM_VIEW_KIND, v, sizeof *v, r->idx);
    return LLMEM_OK;
}

static llmem_status rsum_commit(llmem_memory *mem, const llmem_plan *plan, void *res, int32_t i)
{
    rsum *r = rsum_of(mem);
    const llmem_ubatch *ub = &plan->ubatch[i];
    (void)res;
    for (int32_t t = 0; t < ub->n_tokens; t++) {
        rsum_seq *q = &r->seqs[ub->seq_id[ub->seq[t]]];
        /* room was not reserved: a failed push leaves the sequence short,
         * which check() reports; the example keeps commit simple */
        if (llmem_i32vec_push(&q->tokens, ub->token ? ub->token[t] : -1) &&
            llmem_i32vec_push(&q->pos, ub->pos[t]))
            llmem_pos_meta_push(&q->pm, ub->pos[t]);
    }
    return LLMEM_OK;
}

static void rsum_release(llmem_memory *mem, const llmem_plan *plan, void *res)
{
    (void)mem;
    (void)plan;
    free(res);
}

/* Whole sequences only: a running sum cannot be cut back. */
static llmem_status rsum_seq_rm(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1,
                                bool dry_run)
{
    rsum *r = rsum_of(mem);
    for (int32_t s = seq < 0 ? 0 : seq; s < (seq < 0 ? mem->n_seq_max : seq + 1); s++) {
        rsum_seq *q = &r->seqs[s];
        int32_t cut = llmem_pos_suffix_start(&q->pos, &q->pm, p0 < 0 ? 0 : p0,
                                             p1 < 0 ? INT32_MAX : p1);
        if (cut == q->pos.n)
            continue; /* nothing of it in range */
        if (cut != 0)
            return LLMEM_E_STATE;
        if (!dry_run) {
            seq_reset(q);
            llmem_status st = zero_slot(r, s);
            if (st != LLMEM_OK)
                return st;
        }
    }
    return LLMEM_OK;
}

static llmem_status rsum_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0, int32_t p1,
                                bool dry_run)
{
    rsum *r = rsum_of(mem);
    rsum_seq *a = &r->seqs[src], *b = &r->seqs[dst];
    if (src == dst)
        return LLMEM_OK;
    if (llmem_pos_prefix_len(&a->pos, &a->pm, p0 < 0 ? 0 : p0, p1 < 0 ? INT32_MAX : p1) !=
        a->pos.n)
        return LLMEM_E_STATE; /* only the whole sequence */
    if (dry_run)
        return LLMEM_OK;
    if (!llmem_i32vec_reserve(&b->tokens, a->tokens.n) || !llmem_i32vec_reserve(&b->pos, a->pos.n))
        return LLMEM_E_NO_MEMORY;
    for (int32_t il = 0; il < mem->n_layers; il++) {
        llmem_status st = llmem_buffer_copy(r->state[il], (size_t)dst * slot_bytes(r), r->state[il],
                                            (size_t)src * slot_bytes(r), slot_bytes(r));
        if (st != LLMEM_OK)
            return st;
    }
    llmem_i32_copy(b->tokens.v, a->tokens.v, a->tokens.n);
    llmem_i32_copy(b->pos.v, a->pos.v, a->pos.n);
    b->tokens.n = a->tokens.n;
    b->pos.n = a->pos.n;
    b->pm = a->pm;
    return LLMEM_OK;
}

static llmem_status rsum_seq_keep(llmem_memory *mem, int32_t seq, bool dry_run)
{
    for (int32_t s = 0; s < mem->n_seq_max && !dry_run; s++)
        if (s != seq) {
            llmem_status st = rsum_seq_rm(mem, s, -1, -1, false);
            if (st != LLMEM_OK)
                return st;
        }
    return LLMEM_OK;
}

static int32_t rsum_pos_min(llmem_memory *mem, int32_t seq)
{
    return rsum_of(mem)->seqs[seq].pm.min;
}

static int32_t rsum_pos_max(llmem_memory *mem, int32_t seq)
{
    return rsum_of(mem)->seqs[seq].pm.max;
}

static int32_t rsum_seq_tokens(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap)
{
    return llmem_seq_copy_tokens(&rsum_of(mem)->seqs[seq].tokens, out, cap);
}

static llmem_status rsum_clear(llmem_memory *mem, bool data)
{
    (void)data; /* the slots of empty sequences are zero either way */
    return rsum_seq_rm(mem, -1, -1, -1, false);
}

static void rsum_get_stats(llmem_memory *mem, llmem_memory_stats *st)
{
    rsum *r = rsum_of(mem);
    st->type = "rsum";
    st->slots_total = mem->n_seq_max;
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        st->slots_used += r->seqs[s].tokens.n > 0;
        st->n_seqs_live += r->seqs[s].tokens.n > 0;
    }
    st->bytes_device = (int64_t)mem->n_layers * mem->n_seq_max * (int64_t)slot_bytes(r);
}

static llmem_status rsum_check(llmem_memory *mem, char *err, size_t err_len)
{
    rsum *r = rsum_of(mem);
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        const rsum_seq *q = &r->seqs[s];
        if (q->tokens.n != q->pos.n || !llmem_pos_meta_ok(&q->pm, &q->pos)) {
            llmem_errf(err, err_len, "rsum: sequence %d: tokens and positions disagree", s);
            return LLMEM_E_STATE;
        }
    }
    return LLMEM_OK;
}

static const llmem_memory_i rsum_iface = {
    .struct_size = sizeof(llmem_memory_i),
    .type = "rsum",
    .destroy = rsum_destroy,
    .reserve = rsum_reserve,
    .apply = rsum_apply,
    .view = rsum_view_fn,
    .commit = rsum_commit,
    .release = rsum_release,
    .seq_rm = rsum_seq_rm,
    .seq_cp = rsum_seq_cp,
    .seq_keep = rsum_seq_keep,
    .seq_pos_min = rsum_pos_min,
    .seq_pos_max = rsum_pos_max,
    .seq_tokens = rsum_seq_tokens,
    .clear = rsum_clear,
    .get_stats = rsum_get_stats,
    .check = rsum_check,
};

llmem_status rsum_create(llmem_backend *be, int32_t n_layers, int32_t n_seq_max, int32_t dim,
                         llmem_memory **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!be || !out || dim < 1 || dim > (1 << 20)) {
        llmem_errf(err, err_len, "rsum: need a backend, an out pointer and 1 <= dim <= 2^20");
        return LLMEM_E_INVALID;
    }
    rsum *r = calloc(1, sizeof *r);
    if (!r)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = llmem_memory_init(&r->base, &rsum_iface, be, n_layers, n_seq_max,
                                        LLMEM_SPLIT_EQUAL, false);
    if (st != LLMEM_OK) {
        llmem_memory_iface_check(&rsum_iface, err, err_len);
        if (err && err_len && !err[0])
            llmem_errf(err, err_len, "rsum: need n_layers >= 1 and n_seq_max >= 1");
        free(r);
        return st;
    }
    r->dim = dim;
    r->state = calloc((size_t)n_layers, sizeof *r->state);
    r->views = calloc((size_t)n_layers, sizeof *r->views);
    r->seqs = calloc((size_t)n_seq_max, sizeof *r->seqs);
    st = LLMEM_E_NO_MEMORY;
    if (!r->state || !r->views || !r->seqs)
        goto fail;
    for (int32_t s = 0; s < n_seq_max; s++)
        seq_reset(&r->seqs[s]);
    for (int32_t il = 0; il < n_layers; il++) {
        size_t bytes = (size_t)n_seq_max * slot_bytes(r);
        if ((st = llmem_buffer_alloc(be, bytes, &r->state[il])) != LLMEM_OK ||
            (st = llmem_buffer_fill(r->state[il], 0, bytes, 0)) != LLMEM_OK)
            goto fail;
    }
    *out = &r->base;
    return LLMEM_OK;
fail:
    llmem_errf(err, err_len, "rsum: %s", llmem_status_str(st));
    rsum_destroy(&r->base);
    return st;
}

llmem_status rsum_kernel(const llmem_view *view, const float *x, float *out)
{
    const rsum_view *v = llmem_view_desc(view, RSUM_VIEW_KIND, sizeof(rsum_view));
    if (!v || !x || !out)
        return LLMEM_E_INVALID;
    size_t row = (size_t)v->dim * sizeof(float);
    float *acc = malloc(row);
    if (!acc)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_OK;
    for (int32_t s = 0; s < v->n_seqs && st == LLMEM_OK; s++) {
        int32_t slot = v->slot.host[s];
        if (slot < 0 || slot >= v->n_slots) {
            st = LLMEM_E_INVALID;
            break;
        }
        if ((st = llmem_buffer_download(v->state, (size_t)slot * row, acc, row)) != LLMEM_OK)
            break;
        for (int32_t t = 0; t < v->n_seq_tokens; t++) {
            size_t r = (size_t)s * (size_t)v->n_seq_tokens + (size_t)t;
            for (int32_t d = 0; d < v->dim; d++)
                out[r * (size_t)v->dim + (size_t)d] = acc[d] += x[r * (size_t)v->dim + (size_t)d];
        }
        st = llmem_buffer_upload(v->state, (size_t)slot * row, acc, row);
    }
    free(acc);
    return st;
}

/* llmem base: checks of the view description (<llmem/view.h>) for the op
 * wrappers (backends/ops.c).
 *
 * The wrappers check the host copies of a view's index tables before a
 * backend reads the device copies (<llmem/ops.h>, "index tables"). Every
 * layer of a ubatch gets a view with the same tables, so these checks are
 * cached per backend: a check's key is everything it depends on, the index
 * buffer's write generation (renewed by every llmem_buffer_upload, copy and
 * fill, base/buffer.c) included, and an accepted key is not checked again.
 * The host copy must equal the device copy (the ops contract); a caller
 * that rewrites a host table also uploads it, which renews the generation.
 * Pools and state buffers change per layer and are checked on every call
 * (O(1) each).
 */
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"

#define DT_FLOAT ((1u << LLMEM_DTYPE_F32) | (1u << LLMEM_DTYPE_F16) | (1u << LLMEM_DTYPE_BF16))
#define DT_SCALED ((1u << LLMEM_DTYPE_I8) | (1u << LLMEM_DTYPE_F8E4M3))

/* ---- the cache --------------------------------------------------------------------- */

enum { CHECK_STORE = 1, CHECK_SHIFT, CHECK_ATTENTION, CHECK_RS };

#define KEY_WORDS 22
#define CACHE_ENTRIES 16

typedef struct check_key {
    uint64_t w[KEY_WORDS];
    int n;
} check_key;

#define VOUCH_BUFFERS 8

/* The page_off and seq_len tables of one ubatch a memory vouched for. */
typedef struct vouch_ub {
    llmem_i32_table off, len;
} vouch_ub;

/* Rows a memory vouched for (llmem_view_vouch_rows): valid while idx keeps
 * write generation gen. */
typedef struct vouch {
    const llmem_buffer *idx;
    uint64_t gen;
    llmem_i32_table table;
    int32_t n_pages, page_size;
    vouch_ub *ub;
    int32_t n_ub, cap_ub;
} vouch;

struct llmem_view_checks {
    uint64_t key[CACHE_ENTRIES][KEY_WORDS];
    int next;
    vouch vouch[VOUCH_BUFFERS];
    int vouch_next;
    bool full; /* LLMEM_VIEW_CHECK=full: vouches are not recorded, every check is full */
};

/* LLMEM_VIEW_CHECK=full, read when a backend's checks start and on
 * llmem_backend_reload_env (not at each check: getenv scans the
 * environment, and these checks run for every layer of every ubatch). */
static bool full_checks_env(void)
{
    const char *e = getenv("LLMEM_VIEW_CHECK");
    return e && strcmp(e, "full") == 0;
}

static struct llmem_view_checks *checks_of(llmem_backend *be)
{
    if (!be->view_checks) {
        be->view_checks = calloc(1, sizeof *be->view_checks);
        if (be->view_checks)
            be->view_checks->full = full_checks_env();
    }
    return be->view_checks;
}

void llmem_view_checks_reload(llmem_backend *be)
{
    struct llmem_view_checks *vc = be->view_checks;
    if (!vc)
        return;
    vc->full = full_checks_env();
    for (int i = 0; vc->full && i < VOUCH_BUFFERS; i++)
        vc->vouch[i].idx = NULL; /* no vouch outlives the switch to full checks */
}

static void key_init(check_key *k, int kind, const llmem_view *view)
{
    memset(k, 0, sizeof *k);
    k->w[k->n++] = (uint64_t)kind;
    k->w[k->n++] = (uint64_t)(uintptr_t)view->idx;
    k->w[k->n++] = view->idx ? view->idx->write_gen : 0;
}

static void key_add(check_key *k, uint64_t v)
{
    if (k->n < KEY_WORDS)
        k->w[k->n++] = v;
}

static void key_table(check_key *k, const llmem_i32_table *t)
{
    key_add(k, (uint64_t)(uintptr_t)t->host);
    key_add(k, (uint64_t)t->offset);
    key_add(k, (uint64_t)(uint32_t)t->n);
}

/* Only keys of an index buffer that was written through the core can be
 * trusted to change when its tables do. */
static bool cacheable(const llmem_view *view)
{
    return view->idx && view->idx->write_gen != 0;
}

static bool cache_hit(llmem_backend *be, const llmem_view *view, const check_key *k)
{
    const struct llmem_view_checks *vc = be->view_checks;
    if (!vc || !cacheable(view))
        return false;
    for (int i = 0; i < CACHE_ENTRIES; i++)
        if (memcmp(vc->key[i], k->w, sizeof k->w) == 0)
            return true;
    return false;
}

static void cache_put(llmem_backend *be, const llmem_view *view, const check_key *k)
{
    if (!cacheable(view))
        return;
    struct llmem_view_checks *vc = checks_of(be);
    if (!vc)
        return; /* no cache: every call checks again */
    memcpy(vc->key[vc->next], k->w, sizeof k->w);
    vc->next = (vc->next + 1) % CACHE_ENTRIES;
}

void llmem_view_checks_free(struct llmem_view_checks *vc)
{
    if (!vc)
        return;
    for (int i = 0; i < VOUCH_BUFFERS; i++)
        free(vc->vouch[i].ub);
    free(vc);
}

/* ---- rows vouched for by a memory -------------------------------------------------- */

static bool same_table(const llmem_i32_table *a, const llmem_i32_table *b)
{
    return a->host == b->host && a->offset == b->offset && a->n == b->n;
}

void llmem_view_vouch_rows(const llmem_buffer *idx, const llmem_i32_table *table,
                           int32_t n_pages, int32_t page_size, const llmem_i32_table *page_off,
                           const llmem_i32_table *seq_len, int32_t n_ub)
{
    llmem_backend *be = idx ? llmem_buffer_backend(idx) : NULL;
    struct llmem_view_checks *vc = be ? checks_of(be) : NULL;
    if (!vc)
        return;
    vouch *v = NULL;
    for (int i = 0; i < VOUCH_BUFFERS && !v; i++)
        if (vc->vouch[i].idx == idx)
            v = &vc->vouch[i];
    if (!v) {
        v = &vc->vouch[vc->vouch_next];
        vc->vouch_next = (vc->vouch_next + 1) % VOUCH_BUFFERS;
    }
    v->idx = NULL; /* invalid until complete */
    v->n_ub = 0;
    if (idx->write_gen == 0 || n_ub < 0 || vc->full)
        return;
    if (n_ub > v->cap_ub) {
        vouch_ub *nu = realloc(v->ub, (size_t)n_ub * sizeof *nu);
        if (!nu)
            return; /* nothing vouched: full checks */
        v->ub = nu;
        v->cap_ub = n_ub;
    }
    for (int32_t u = 0; u < n_ub; u++)
        v->ub[u] = (vouch_ub){page_off[u], seq_len[u]};
    v->n_ub = n_ub;
    v->gen = idx->write_gen;
    v->table = *table;
    v->n_pages = n_pages;
    v->page_size = page_size;
    v->idx = idx;
}

/* Whether the rows of a KV view (page_off non-empty) were vouched for by
 * the memory that wrote its index buffer, at its current generation. */
static bool vouched(const llmem_backend *be, const llmem_view *view)
{
    const struct llmem_view_checks *vc = be->view_checks;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (!vc || !view->idx || view->idx->write_gen == 0 || kv->page_off.n == 0)
        return false;
    for (int i = 0; i < VOUCH_BUFFERS; i++) {
        const vouch *v = &vc->vouch[i];
        if (v->idx != view->idx || v->gen != view->idx->write_gen ||
            !same_table(&v->table, &kv->page_table) || v->n_pages != kv->n_pages ||
            v->page_size != kv->page_size)
            continue;
        for (int32_t u = 0; u < v->n_ub; u++)
            if (same_table(&v->ub[u].off, &kv->page_off) &&
                same_table(&v->ub[u].len, &kv->seq_len))
                return true;
    }
    return false;
}

/* ---- index tables ------------------------------------------------------------------ */

bool llmem_view_table_ok(llmem_backend *be, const llmem_view *view, const llmem_i32_table *t)
{
    if (t->n < 0)
        return false;
    if (t->n == 0)
        return true;
    if (!t->host || !view->idx || llmem_buffer_backend(view->idx) != be || t->offset % 4 != 0)
        return false;
    size_t size = llmem_buffer_size(view->idx);
    return t->offset <= size && (size_t)t->n * 4 <= size - t->offset;
}

static bool values_in(const llmem_i32_table *t, int32_t lo, int32_t hi)
{
    for (int32_t i = 0; i < t->n; i++)
        if (t->host[i] < lo || t->host[i] >= hi)
            return false;
    return true;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Whether the n values v[] (may be NULL when n == 0) are pairwise distinct. */
static llmem_status distinct(const int32_t *v, int32_t n)
{
    if (n < 2)
        return LLMEM_OK;
    int64_t *s = malloc((size_t)n * sizeof *s);
    if (!s)
        return LLMEM_E_NO_MEMORY;
    for (int32_t i = 0; i < n; i++)
        s[i] = v[i];
    qsort(s, (size_t)n, sizeof *s, cmp_i64);
    llmem_status st = LLMEM_OK;
    for (int32_t i = 1; i < n; i++)
        if (s[i] == s[i - 1])
            st = LLMEM_E_INVALID;
    free(s);
    return st;
}

/* ---- KV views ---------------------------------------------------------------------- */

static bool pool_ok(llmem_backend *be, const llmem_buffer *pool, const llmem_kv_view *kv)
{
    if (!pool || llmem_buffer_backend(pool) != be)
        return false;
    int64_t n = (int64_t)kv->n_pages * kv->page_size;
    if (n > INT32_MAX) /* slots are int32 device indices */
        return false;
    n *= (int64_t)kv->n_kv_heads * kv->head_dim;
    if (n > ((int64_t)1 << 48))
        return false;
    size_t page = llmem_kv_page_bytes(kv->dtype, kv->page_size, kv->n_kv_heads, kv->head_dim);
    return page > 0 && (size_t)kv->n_pages <= llmem_buffer_size(pool) / page;
}

#define ROUND16(x) (((x) + 15u) & ~(size_t)15u)

size_t llmem_kv_scale_offset(llmem_dtype t, int32_t page_size, int32_t n_kv_heads,
                             int32_t head_dim)
{
    if (!llmem_dtype_is_scaled(t) || page_size < 1 || n_kv_heads < 1 || head_dim < 1)
        return 0;
    size_t n = (size_t)page_size * (size_t)n_kv_heads;
    if (n / (size_t)n_kv_heads != (size_t)page_size || n > (SIZE_MAX >> 2) / (size_t)head_dim)
        return 0;
    return ROUND16(n * (size_t)head_dim);
}

size_t llmem_kv_page_bytes(llmem_dtype t, int32_t page_size, int32_t n_kv_heads,
                           int32_t head_dim)
{
    if (page_size < 1 || n_kv_heads < 1 || head_dim < 1 || llmem_dtype_size(t) == 0)
        return 0;
    if (llmem_dtype_is_scaled(t)) {
        size_t off = llmem_kv_scale_offset(t, page_size, n_kv_heads, head_dim);
        return off ? ROUND16(off + 4 * (size_t)n_kv_heads) : 0;
    }
    size_t n = (size_t)page_size * (size_t)n_kv_heads;
    if (n / (size_t)n_kv_heads != (size_t)page_size || n > (SIZE_MAX >> 3) / (size_t)head_dim)
        return 0;
    return n * (size_t)head_dim * llmem_dtype_size(t);
}

static size_t state_elems(const llmem_state_desc *d)
{
    if (!d || d->n_dims < 1 || d->n_dims > LLMEM_STATE_MAX_DIMS || llmem_dtype_size(d->dtype) == 0)
        return 0;
    size_t n = 1;
    for (int32_t i = 0; i < d->n_dims; i++) {
        if (d->shape[i] < 1 || d->shape[i] > INT32_MAX || n > (SIZE_MAX >> 4) / (size_t)d->shape[i])
            return 0;
        n *= (size_t)d->shape[i];
    }
    return n;
}

size_t llmem_state_scale_offset(const llmem_state_desc *d)
{
    size_t n = state_elems(d);
    return n && d->dtype == LLMEM_DTYPE_I8 ? ROUND16(n) : 0;
}

size_t llmem_state_slot_bytes(const llmem_state_desc *d)
{
    size_t n = state_elems(d);
    if (!n || d->dtype == LLMEM_DTYPE_I32 || d->dtype == LLMEM_DTYPE_F8E4M3)
        return 0;
    if (d->dtype == LLMEM_DTYPE_I8)
        return ROUND16(ROUND16(n) + 4 * (size_t)d->shape[0]);
    return n * llmem_dtype_size(d->dtype);
}

llmem_status llmem_view_check_kv(llmem_backend *be, const llmem_view *view)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (!kv)
        return LLMEM_E_INVALID;
    if ((unsigned)kv->dtype >= LLMEM_DTYPE_COUNT ||
        !((DT_FLOAT | DT_SCALED) & (1u << kv->dtype)))
        return LLMEM_E_INVALID;
    if (llmem_dtype_is_scaled(kv->dtype) && kv->head_dim % 4 != 0)
        return LLMEM_E_INVALID;
    if (kv->n_pages < 1 || kv->page_size < 1 || kv->n_kv_heads < 1 || kv->head_dim < 1)
        return LLMEM_E_INVALID;
    if (!pool_ok(be, kv->k, kv) || !pool_ok(be, kv->v, kv) || kv->k == kv->v)
        return LLMEM_E_INVALID;
    return LLMEM_OK;
}

/* Call after llmem_view_check_kv: n_pages * page_size fits int32. */
static int32_t n_kv_slots(const llmem_kv_view *kv)
{
    return kv->n_pages * kv->page_size;
}

llmem_status llmem_view_check_store(llmem_backend *be, const llmem_view *view, int32_t n_tok)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    check_key k;
    key_init(&k, CHECK_STORE, view);
    key_table(&k, &kv->store_tok);
    key_table(&k, &kv->store_slot);
    key_add(&k, (uint64_t)(uint32_t)n_kv_slots(kv));
    key_add(&k, (uint64_t)(uint32_t)n_tok);
    if (cache_hit(be, view, &k))
        return LLMEM_OK;
    if (kv->store_tok.n != kv->store_slot.n || !llmem_view_table_ok(be, view, &kv->store_tok) ||
        !llmem_view_table_ok(be, view, &kv->store_slot) || !values_in(&kv->store_tok, 0, n_tok) ||
        !values_in(&kv->store_slot, 0, n_kv_slots(kv)))
        return LLMEM_E_INVALID;
    llmem_status st = distinct(kv->store_slot.host, kv->store_slot.n);
    if (st == LLMEM_OK)
        cache_put(be, view, &k);
    return st;
}

llmem_status llmem_view_check_shift(llmem_backend *be, const llmem_view *view)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    check_key k;
    key_init(&k, CHECK_SHIFT, view);
    key_table(&k, &kv->shift_slot);
    key_table(&k, &kv->shift_delta);
    key_add(&k, (uint64_t)(uint32_t)n_kv_slots(kv));
    if (cache_hit(be, view, &k))
        return LLMEM_OK;
    if (kv->shift_slot.n != kv->shift_delta.n || !llmem_view_table_ok(be, view, &kv->shift_slot) ||
        !llmem_view_table_ok(be, view, &kv->shift_delta) ||
        !values_in(&kv->shift_slot, 0, n_kv_slots(kv)))
        return LLMEM_E_INVALID;
    llmem_status st = distinct(kv->shift_slot.host, kv->shift_slot.n);
    if (st == LLMEM_OK)
        cache_put(be, view, &k);
    return st;
}

llmem_status llmem_view_check_attention(llmem_backend *be, const llmem_view *view,
                                        int32_t n_tok)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    check_key k;
    key_init(&k, CHECK_ATTENTION, view);
    key_table(&k, &kv->page_table);
    key_table(&k, &kv->seq_len);
    key_table(&k, &kv->tok_kv_len);
    key_table(&k, &kv->tok_seq);
    key_table(&k, &kv->page_off);
    key_add(&k, (uint64_t)(uint32_t)kv->n_pages);
    key_add(&k, (uint64_t)(uint32_t)kv->page_size);
    key_add(&k, (uint64_t)(uint32_t)kv->max_pages);
    key_add(&k, (uint64_t)(uint32_t)n_tok);
    if (cache_hit(be, view, &k))
        return LLMEM_OK;
    int32_t n_groups = kv->seq_len.n;
    bool rows = kv->page_off.n != 0; /* per-group row offsets, else dense */
    if (kv->max_pages < 0 || kv->tok_kv_len.n != n_tok || kv->tok_seq.n != n_tok ||
        (rows ? kv->page_off.n != n_groups
              : (int64_t)n_groups * kv->max_pages != kv->page_table.n))
        return LLMEM_E_INVALID;
    if (!llmem_view_table_ok(be, view, &kv->page_table) ||
        !llmem_view_table_ok(be, view, &kv->seq_len) ||
        !llmem_view_table_ok(be, view, &kv->tok_kv_len) ||
        !llmem_view_table_ok(be, view, &kv->tok_seq) ||
        !llmem_view_table_ok(be, view, &kv->page_off))
        return LLMEM_E_INVALID;
    /* rows vouched for by their writer: their entries are not read again,
     * so a decode step costs O(groups + tokens), not O(context) */
    bool trusted = rows && vouched(be, view);
    for (int32_t s = 0; s < n_groups; s++) {
        int32_t len = kv->seq_len.host[s];
        if (len < 0)
            return LLMEM_E_INVALID;
        int64_t pages = llmem_pages_for(0, len, kv->page_size);
        if (pages > kv->max_pages)
            return LLMEM_E_INVALID;
        int64_t row = rows ? kv->page_off.host[s] : (int64_t)s * kv->max_pages;
        if (row < 0 || row + pages > kv->page_table.n)
            return LLMEM_E_INVALID;
        const int32_t *pt = kv->page_table.host + row;
        for (int64_t j = 0; !trusted && j < pages; j++)
            if (pt[j] < 0 || pt[j] >= kv->n_pages)
                return LLMEM_E_INVALID;
    }
    for (int32_t i = 0; i < n_tok; i++) {
        int32_t s = kv->tok_seq.host[i];
        if (s < 0 || s >= n_groups)
            return LLMEM_E_INVALID;
        int32_t len = kv->tok_kv_len.host[i];
        if (len < 0 || len > kv->seq_len.host[s])
            return LLMEM_E_INVALID;
    }
    cache_put(be, view, &k);
    return LLMEM_OK;
}

/* ---- recurrent views ---------------------------------------------------------------- */

/* The slot tables of a recurrent view: sizes, ranges, checkpoints that can
 * exist, and no slot written by two groups. */
static llmem_status rs_tables_check(llmem_backend *be, const llmem_view *view)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    check_key k;
    key_init(&k, CHECK_RS, view);
    key_table(&k, &rs->src_slot);
    key_table(&k, &rs->dst_slot);
    key_table(&k, &rs->ckpt_slot);
    key_add(&k, (uint64_t)(uint32_t)rs->n_slots);
    key_add(&k, (uint64_t)(uint32_t)rs->n_seqs);
    key_add(&k, (uint64_t)(uint32_t)rs->n_seq_tokens);
    key_add(&k, (uint64_t)(uint32_t)rs->n_ckpt);
    const llmem_rs_view *sn = llmem_rs_view_snap(view);
    if (sn) {
        key_table(&k, &sn->snap_tok);
        key_table(&k, &sn->snap_slot);
    }
    if (cache_hit(be, view, &k))
        return LLMEM_OK;
    if ((int64_t)rs->n_seqs * rs->n_seq_tokens > INT32_MAX ||
        (int64_t)rs->n_seqs * rs->n_ckpt > INT32_MAX)
        return LLMEM_E_INVALID;
    if (rs->src_slot.n != rs->n_seqs || rs->dst_slot.n != rs->n_seqs ||
        rs->ckpt_slot.n != rs->n_seqs * rs->n_ckpt)
        return LLMEM_E_INVALID;
    if (!llmem_view_table_ok(be, view, &rs->src_slot) ||
        !llmem_view_table_ok(be, view, &rs->dst_slot) ||
        !llmem_view_table_ok(be, view, &rs->ckpt_slot))
        return LLMEM_E_INVALID;
    if (!values_in(&rs->src_slot, -1, rs->n_slots) || !values_in(&rs->dst_slot, -1, rs->n_slots) ||
        !values_in(&rs->ckpt_slot, -1, rs->n_slots))
        return LLMEM_E_INVALID;
    if (sn && (sn->snap_tok.n != rs->n_seqs || sn->snap_slot.n != rs->n_seqs ||
               !llmem_view_table_ok(be, view, &sn->snap_tok) ||
               !llmem_view_table_ok(be, view, &sn->snap_slot) ||
               !values_in(&sn->snap_slot, -1, rs->n_slots)))
        return LLMEM_E_INVALID;
    /* A snapshot lies before the group's last token, and its slot is
     * nobody's source (a kernel may write it before another group reads). */
    for (int32_t s = 0; sn && s < rs->n_seqs; s++) {
        int32_t slot = sn->snap_slot.host[s], t = sn->snap_tok.host[s];
        if (slot < 0)
            continue;
        if (t < 0 || t >= rs->n_seq_tokens - 1)
            return LLMEM_E_INVALID;
        for (int32_t q = 0; q < rs->n_seqs; q++)
            if (rs->src_slot.host[q] == slot)
                return LLMEM_E_INVALID;
    }
    /* A checkpoint can hold at most the state before the ubatch (token -1). */
    for (int32_t s = 0; s < rs->n_seqs; s++)
        for (int32_t c = 0; c < rs->n_ckpt; c++)
            if (rs->ckpt_slot.host[(int64_t)s * rs->n_ckpt + c] >= 0 &&
                rs->n_seq_tokens - rs->n_ckpt + c < -1)
                return LLMEM_E_INVALID;
    /* No slot may be written by two groups, nor a snapshot's slot twice:
     * (slot << 32 | writer) sorted, a snapshot's writer being its group
     * with bit 30 set (so it differs from the same group's dst). */
    int64_t n_w = (int64_t)rs->n_seqs * (1 + rs->n_ckpt + (sn ? 1 : 0));
    if (n_w >= 2) {
        int64_t *w = malloc((size_t)n_w * sizeof *w);
        if (!w)
            return LLMEM_E_NO_MEMORY;
        int64_t m = 0;
        for (int32_t s = 0; s < rs->n_seqs; s++) {
            if (rs->dst_slot.host[s] >= 0)
                w[m++] = ((int64_t)rs->dst_slot.host[s] << 32) | s;
            for (int32_t c = 0; c < rs->n_ckpt; c++) {
                int32_t slot = rs->ckpt_slot.host[(int64_t)s * rs->n_ckpt + c];
                if (slot >= 0)
                    w[m++] = ((int64_t)slot << 32) | s;
            }
            if (sn && sn->snap_slot.host[s] >= 0)
                w[m++] = ((int64_t)sn->snap_slot.host[s] << 32) | s | (1 << 30);
        }
        qsort(w, (size_t)m, sizeof *w, cmp_i64);
        bool twice = false;
        for (int64_t i = 1; i < m; i++)
            if ((w[i] >> 32) == (w[i - 1] >> 32) && w[i] != w[i - 1])
                twice = true;
        free(w);
        if (twice)
            return LLMEM_E_INVALID;
    }
    cache_put(be, view, &k);
    return LLMEM_OK;
}

static llmem_status check_rs(llmem_backend *be, const llmem_view *view, int32_t state,
                             bool allow_i8)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    if (!rs)
        return LLMEM_E_INVALID;
    if (rs->n_states < 1 || state < 0 || state >= rs->n_states || !rs->desc || !rs->state)
        return LLMEM_E_INVALID;
    if (rs->n_slots < 1 || rs->n_seqs < 0 || rs->n_seq_tokens < 0 || rs->n_ckpt < 0)
        return LLMEM_E_INVALID;
    const llmem_state_desc *d = &rs->desc[state];
    llmem_buffer *buf = rs->state[state];
    if (!buf || llmem_buffer_backend(buf) != be || d->n_dims < 1 ||
        d->n_dims > LLMEM_STATE_MAX_DIMS || (unsigned)d->dtype >= LLMEM_DTYPE_COUNT ||
        !((DT_FLOAT | (allow_i8 ? 1u << LLMEM_DTYPE_I8 : 0u)) & (1u << d->dtype)))
        return LLMEM_E_INVALID;
    int64_t elems = 1;
    for (int32_t i = 0; i < d->n_dims; i++) {
        if (d->shape[i] < 1 || d->shape[i] > INT32_MAX)
            return LLMEM_E_INVALID;
        elems *= d->shape[i];
        if (elems > ((int64_t)1 << 40))
            return LLMEM_E_INVALID;
    }
    size_t slot_bytes = llmem_state_slot_bytes(d);
    if (slot_bytes == 0 || slot_bytes > llmem_buffer_size(buf) / (size_t)rs->n_slots)
        return LLMEM_E_INVALID;
    return rs_tables_check(be, view);
}

llmem_status llmem_view_check_rs(llmem_backend *be, const llmem_view *view, int32_t state)
{
    return check_rs(be, view, state, false);
}

llmem_status llmem_view_check_rs_i8(llmem_backend *be, const llmem_view *view, int32_t state)
{
    return check_rs(be, view, state, true);
}

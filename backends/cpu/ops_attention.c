/* llmem: CPU paged attention: storing K/V into pages and causal attention
 * through page tables.
 *
 * Addressing follows PagedAttention (Kwon et al., SOSP 2023): key j of a
 * stream lives in slot page_table[j / page_size] * page_size +
 * j % page_size of a [n_pages][page_size][n_kv_heads][head_dim] pool. The
 * softmax is FlashAttention-2's (Dao 2023, Alg. 1): keys are visited in
 * blocks, each block rescales the running sum and accumulator by
 * exp(m_old - m_new). Only visible keys are visited, so masked, free or
 * padding slots are never read.
 *
 * Work item: one (query token, KV head) pair; the n_rep = H / n_kv_heads
 * query heads of a GQA group share each converted key/value row.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"

#define KB 32 /* keys per softmax block */

/* ---- store ------------------------------------------------------------------------ */

typedef struct store_ctx {
    const float *k, *v;
    char *kp, *vp;
    llmem_dtype dtype;
    const int32_t *tok, *slot;
    int64_t n_tok, n_slots_total, row; /* row = n_kv_heads * head_dim elements */
    atomic_int bad;
} store_ctx;

static void store_run(void *vctx, int64_t j0, int64_t j1, int32_t thread)
{
    store_ctx *c = vctx;
    size_t row_bytes = (size_t)c->row * llmem_dtype_size(c->dtype);
    for (int64_t j = j0; j < j1; j++) {
        int32_t t = c->tok[j], s = c->slot[j];
        if (t < 0 || t >= c->n_tok || s < 0 || s >= c->n_slots_total) {
            atomic_store(&c->bad, 1);
            continue;
        }
        store_f32(c->k + t * c->row, c->dtype, c->row, c->kp + (size_t)s * row_bytes);
        store_f32(c->v + t * c->row, c->dtype, c->row, c->vp + (size_t)s * row_bytes);
    }
}

/* Scaled dtypes (int8, fp8): one work item per page the ubatch writes, so
 * each page's scales have one writer. Per KV head, over the page's new
 * rows: amax; a page whose offset 0 is written starts over with scale
 * amax / code_max; otherwise the scale only grows (max(old, amax /
 * code_max)), and when it grows the page's other rows are requantized to
 * it (docs/memory.md, "Quantized KV and state"). */
typedef struct page_run {
    int32_t page, first; /* first index in the sorted entry order */
    int32_t n;
} page_run;

typedef struct qstore_ctx {
    const store_ctx *c;
    const int32_t *order; /* entry indices sorted by (page, index) */
    const page_run *runs;
    int32_t page_size, n_kv_heads, head_dim;
    size_t page_bytes, scale_off;
} qstore_ctx;

static void qstore_pool(const qstore_ctx *q, const page_run *r, const float *src, char *pool)
{
    const store_ctx *c = q->c;
    int32_t ps = q->page_size, d = q->head_dim;
    float cmax = llmem_dtype_code_max(c->dtype);
    char *page = pool + (size_t)r->page * q->page_bytes;
    float *scales = (float *)(void *)(page + q->scale_off);
    bool fresh = false;
    for (int32_t i = 0; i < r->n; i++)
        fresh |= c->slot[q->order[r->first + i]] % ps == 0;
    for (int32_t h = 0; h < q->n_kv_heads; h++) {
        float amax = 0.0f;
        for (int32_t i = 0; i < r->n; i++) {
            const float *x = src + (size_t)c->tok[q->order[r->first + i]] * (size_t)c->row +
                             (size_t)h * (size_t)d;
            for (int32_t e = 0; e < d; e++)
                amax = fabsf(x[e]) > amax ? fabsf(x[e]) : amax;
        }
        float s_new = amax / cmax, s_old = scales[h];
        if (!fresh && s_old >= s_new) {
            s_new = s_old;
        } else if (!fresh) { /* requantize the rows this ubatch does not write */
            for (int32_t o = 0; o < ps; o++) {
                bool mine = false;
                for (int32_t i = 0; i < r->n && !mine; i++)
                    mine = c->slot[q->order[r->first + i]] % ps == o;
                if (mine)
                    continue;
                uint8_t *row = (uint8_t *)page + ((size_t)o * (size_t)q->n_kv_heads + (size_t)h) *
                                                     (size_t)d;
                float tmp[256];
                for (int32_t e0 = 0; e0 < d; e0 += 256) {
                    int32_t m = d - e0 < 256 ? d - e0 : 256;
                    load_scaled(row + e0, c->dtype, m, s_old, tmp);
                    for (int32_t e = 0; e < m; e++)
                        row[e0 + e] = quant_one(tmp[e], c->dtype, s_new);
                }
            }
        }
        for (int32_t i = 0; i < r->n; i++) {
            int32_t j = q->order[r->first + i];
            const float *x = src + (size_t)c->tok[j] * (size_t)c->row + (size_t)h * (size_t)d;
            uint8_t *row = (uint8_t *)page +
                           ((size_t)(c->slot[j] % ps) * (size_t)q->n_kv_heads + (size_t)h) *
                               (size_t)d;
            for (int32_t e = 0; e < d; e++)
                row[e] = quant_one(x[e], c->dtype, s_new);
        }
        scales[h] = s_new;
    }
}

static void qstore_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    (void)thread;
    const qstore_ctx *q = vctx;
    for (int64_t r = r0; r < r1; r++) {
        qstore_pool(q, &q->runs[r], q->c->k, q->c->kp);
        qstore_pool(q, &q->runs[r], q->c->v, q->c->vp);
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static llmem_status kv_store_scaled(const llmem_kv_view *kv, store_ctx *c, int64_t n)
{
    /* Table values were checked by the op wrapper (llmem_view_check_store). */
    int64_t *key = malloc((size_t)n * sizeof *key);
    int32_t *order = malloc((size_t)n * sizeof *order);
    page_run *runs = malloc((size_t)n * sizeof *runs);
    if (!key || !order || !runs) {
        free(key);
        free(order);
        free(runs);
        return LLMEM_E_NO_MEMORY;
    }
    /* slots are distinct: sorting by slot groups the entries by page */
    for (int64_t j = 0; j < n; j++)
        key[j] = (int64_t)c->slot[j] << 32 | j;
    qsort(key, (size_t)n, sizeof *key, cmp_i64);
    for (int64_t j = 0; j < n; j++)
        order[j] = (int32_t)(key[j] & 0xffffffff);
    free(key);
    int32_t n_runs = 0, ps = kv->page_size;
    for (int32_t i = 0; i < (int32_t)n; i++) {
        int32_t page = c->slot[order[i]] / ps;
        if (n_runs == 0 || runs[n_runs - 1].page != page)
            runs[n_runs++] = (page_run){page, i, 0};
        runs[n_runs - 1].n++;
    }
    qstore_ctx q = {
        .c = c,
        .order = order,
        .runs = runs,
        .page_size = ps,
        .n_kv_heads = kv->n_kv_heads,
        .head_dim = kv->head_dim,
        .page_bytes = llmem_kv_page_bytes(kv->dtype, ps, kv->n_kv_heads, kv->head_dim),
        .scale_off = llmem_kv_scale_offset(kv->dtype, ps, kv->n_kv_heads, kv->head_dim),
    };
    llmem_tp_run(cpu_threads_for(n * c->row), n_runs, 1, qstore_run, &q);
    free(order);
    free(runs);
    return LLMEM_OK;
}

llmem_status cpu_op_kv_store(llmem_backend *be, const llmem_view *view, llmem_ct *k,
                             llmem_ct *v)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    store_ctx c = {
        .k = tensor_data(k),
        .v = tensor_data(v),
        .kp = llmem_buffer_host_ptr(kv->k),
        .vp = llmem_buffer_host_ptr(kv->v),
        .dtype = kv->dtype,
        .tok = view_table(view, &kv->store_tok),
        .slot = view_table(view, &kv->store_slot),
        .n_tok = k->ne[0],
        .n_slots_total = (int64_t)kv->n_pages * kv->page_size,
        .row = (int64_t)kv->n_kv_heads * kv->head_dim,
    };
    atomic_init(&c.bad, 0);
    int64_t n = kv->store_slot.n;
    if (llmem_dtype_is_scaled(kv->dtype))
        return kv_store_scaled(kv, &c, n);
    llmem_tp_run(cpu_threads_for(n * c.row), n, 8, store_run, &c);
    return atomic_load(&c.bad) ? LLMEM_E_INVALID : LLMEM_OK;
}

/* ---- attention ------------------------------------------------------------------------- */

typedef struct attn_ctx {
    const llmem_attn_params *p;
    const float *q;
    float *out;
    const char *kp, *vp;
    llmem_dtype dtype;
    const int32_t *page_table, *seq_len, *tok_kv_len, *tok_seq;
    const int32_t *page_off; /* [n_streams] row offsets, NULL: row s * max_pages */
    int32_t n_streams, max_pages, page_size, n_pages;
    int64_t n_heads, n_kv_heads, head_dim, n_rep;
    size_t page_bytes, scale_off; /* scaled dtypes: page stride, scales' offset */
    float *scratch; /* per thread, scratch_floats each */
    int64_t scratch_floats;
    atomic_int bad;
} attn_ctx;

/* Scores s of one query head against n key rows, then the online-softmax
 * update of (m, l, acc) with the n value rows. */
static void attn_block(const attn_ctx *c, const float *q, const float *const *krow,
                       const float *const *vrow, int64_t n, float *s, float *m, float *l,
                       float *acc)
{
    int64_t d = c->head_dim;
    float cap = c->p->softcap;
    float bmax = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float x = dot_f32(q, krow[j], d) * c->p->scale;
        if (cap > 0.0f)
            x = cap * tanhf(x / cap);
        s[j] = x;
        bmax = x > bmax ? x : bmax;
    }
    float m_new = bmax > *m ? bmax : *m;
    float corr = expf(*m - m_new); /* 0 on the first block (m = -inf) */
    float sum = 0.0f;
    scal_f32(acc, corr, d);
    for (int64_t j = 0; j < n; j++) {
        float pj = expf(s[j] - m_new);
        sum += pj;
        axpy_f32(acc, vrow[j], pj, d);
    }
    *l = *l * corr + sum;
    *m = m_new;
}

static void attn_run(void *vctx, int64_t it0, int64_t it1, int32_t thread)
{
    attn_ctx *c = vctx;
    int64_t d = c->head_dim, nrep = c->n_rep;
    size_t es = llmem_dtype_size(c->dtype);
    bool f32 = c->dtype == LLMEM_DTYPE_F32;
    float *base = c->scratch + (size_t)thread * (size_t)c->scratch_floats;
    float *kbuf = base, *vbuf = kbuf + KB * d, *acc = vbuf + KB * d;
    float *s = acc + nrep * d, *m = s + KB, *l = m + nrep;
    const float *krow[KB], *vrow[KB];
    for (int64_t it = it0; it < it1; it++) {
        int64_t i = it / c->n_kv_heads, g = it % c->n_kv_heads;
        int32_t sq = c->tok_seq[i];
        int32_t len = c->tok_kv_len[i];
        bool ok = sq >= 0 && sq < c->n_streams && len >= 0 && len <= c->seq_len[sq] &&
                  llmem_pages_for(0, c->seq_len[sq], c->page_size) <= c->max_pages;
        int64_t lo = c->p->window > 0 && len > c->p->window ? len - c->p->window : 0;
        for (int64_t r = 0; r < nrep; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(acc, 0, (size_t)(nrep * d) * sizeof *acc);
        if (!ok) {
            atomic_store(&c->bad, 1);
            len = 0;
        }
        const int32_t *pt =
            !ok ? NULL
                : c->page_table + (c->page_off ? (int64_t)c->page_off[sq] : (int64_t)sq * c->max_pages);
        for (int64_t j0 = lo; j0 < len; j0 += KB) {
            int64_t n = len - j0 < KB ? len - j0 : KB;
            int64_t got = 0;
            for (int64_t j = 0; j < n; j++) {
                int64_t key = j0 + j;
                int32_t page = pt[key / c->page_size];
                if (page < 0 || page >= c->n_pages) {
                    atomic_store(&c->bad, 1);
                    continue;
                }
                size_t off = (((size_t)page * (size_t)c->page_size +
                               (size_t)(key % c->page_size)) * (size_t)c->n_kv_heads +
                              (size_t)g) * (size_t)d * es;
                if (c->page_bytes) {
                    size_t pb = (size_t)page * c->page_bytes;
                    size_t ro = ((size_t)(key % c->page_size) * (size_t)c->n_kv_heads +
                                 (size_t)g) * (size_t)d;
                    const float *ks = (const float *)(const void *)(c->kp + pb + c->scale_off);
                    const float *vs = (const float *)(const void *)(c->vp + pb + c->scale_off);
                    load_scaled(c->kp + pb + ro, c->dtype, d, ks[g], kbuf + got * d);
                    load_scaled(c->vp + pb + ro, c->dtype, d, vs[g], vbuf + got * d);
                    krow[got] = kbuf + got * d;
                    vrow[got] = vbuf + got * d;
                } else if (f32) {
                    krow[got] = (const float *)(const void *)(c->kp + off);
                    vrow[got] = (const float *)(const void *)(c->vp + off);
                } else {
                    load_f32(c->kp + off, c->dtype, d, kbuf + got * d);
                    load_f32(c->vp + off, c->dtype, d, vbuf + got * d);
                    krow[got] = kbuf + got * d;
                    vrow[got] = vbuf + got * d;
                }
                got++;
            }
            if (got == 0)
                continue;
            for (int64_t r = 0; r < nrep; r++) {
                const float *qh = c->q + (i * c->n_heads + g * nrep + r) * d;
                attn_block(c, qh, krow, vrow, got, s, &m[r], &l[r], acc + r * d);
            }
        }
        for (int64_t r = 0; r < nrep; r++) {
            float *o = c->out + (i * c->n_heads + g * nrep + r) * d;
            float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            for (int64_t x = 0; x < d; x++)
                o[x] = acc[r * d + x] * inv;
        }
    }
}

llmem_status cpu_op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                    const llmem_view *view, llmem_ct *q, llmem_ct *out)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    attn_ctx c = {
        .p = p,
        .q = tensor_data(q),
        .out = tensor_data(out),
        .kp = llmem_buffer_host_ptr(kv->k),
        .vp = llmem_buffer_host_ptr(kv->v),
        .dtype = kv->dtype,
        .page_table = view_table(view, &kv->page_table),
        .page_off = kv->page_off.n ? view_table(view, &kv->page_off) : NULL,
        .seq_len = view_table(view, &kv->seq_len),
        .tok_kv_len = view_table(view, &kv->tok_kv_len),
        .tok_seq = view_table(view, &kv->tok_seq),
        .n_streams = kv->seq_len.n,
        .max_pages = kv->max_pages,
        .page_size = kv->page_size,
        .n_pages = kv->n_pages,
        .n_heads = q->ne[1],
        .n_kv_heads = kv->n_kv_heads,
        .head_dim = kv->head_dim,
    };
    if (llmem_dtype_is_scaled(kv->dtype)) {
        c.page_bytes = llmem_kv_page_bytes(kv->dtype, kv->page_size, kv->n_kv_heads, kv->head_dim);
        c.scale_off = llmem_kv_scale_offset(kv->dtype, kv->page_size, kv->n_kv_heads, kv->head_dim);
    }
    atomic_init(&c.bad, 0);
    c.n_rep = c.n_heads / c.n_kv_heads;
    int64_t n_tok = q->ne[0];
    /* kbuf, vbuf [KB][d]; acc [n_rep][d]; s [KB]; m, l [n_rep] */
    c.scratch_floats = 2 * KB * c.head_dim + c.n_rep * c.head_dim + KB + 2 * c.n_rep;
    int64_t items = n_tok * c.n_kv_heads;
    int64_t work = 0;
    for (int64_t i = 0; i < n_tok && work < 4096; i++)
        work += (int64_t)kv->tok_kv_len.host[i] * c.n_heads * c.head_dim;
    int32_t nth = cpu_threads_for(work);
    c.scratch = malloc((size_t)nth * (size_t)c.scratch_floats * sizeof *c.scratch);
    if (!c.scratch)
        return LLMEM_E_NO_MEMORY;
    llmem_tp_run(nth, items, 1, attn_run, &c);
    free(c.scratch);
    return atomic_load(&c.bad) ? LLMEM_E_INVALID : LLMEM_OK;
}

// ctest-labels: core
/* Op conformance suite, part 2: the KV store and paged attention (see
 * test_ops.c for the conventions; the K-shift and KV page copies are in
 * test_ops_kv.c).
 *
 * Views are built by hand (no memory module): pages are handed out in a
 * shuffled order, page tables are padded with -1, the ubatch's tokens are
 * shuffled across streams, and every slot no sequence owns, including the
 * rest of partly filled pages and free pages, holds NaN. Results must equal
 * the float64 reference over the logical (unpaged) keys and values, and
 * must not change when the pools hold zeros instead of NaN.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define I32 LLMEM_DTYPE_I32
#define MAX_STREAMS 8

typedef struct attn_case {
    int32_t n_streams;
    int32_t len[MAX_STREAMS];   /* seq_len after this ubatch; 0: an empty stream */
    int32_t n_new[MAX_STREAMS]; /* ubatch tokens of the stream (its last ones) */
    int32_t page_size, n_kv_heads, n_heads, head_dim;
    llmem_dtype dtype;
    float softcap;
    int32_t window;
    bool pad_token; /* one extra token that sees nothing (tok_kv_len 0) */
    bool rows;      /* page-table rows at page_off[s] (streams reversed, gaps of -1) */
    bool ordered;   /* ubatch tokens in stream order, as a prefill has them (else shuffled) */
} attn_case;

/* Everything the backend needs, generated once on the host. */
typedef struct attn_data {
    attn_case k;
    th_pages pg;                            /* the page tables (th_pages_make) */
    int32_t n_tok, row;                     /* row: n_kv_heads * head_dim */
    int32_t *tok_seq, *tok_kv_len;          /* [n_tok] */
    int32_t *store_tok, *store_slot, n_store;
    double *q, *kcur, *vcur;                /* [n_tok][..] */
    double *kl[MAX_STREAMS], *vl[MAX_STREAMS]; /* logical K/V [len][row], rounded */
} attn_data;

static void attn_make(th_ctx *h, const attn_case *k, uint64_t stream, attn_data *d)
{
    ref64_rng r = ref64_rng_make(ref64_seed(), stream);
    memset(d, 0, sizeof *d);
    d->k = *k;
    d->row = k->n_kv_heads * k->head_dim;
    for (int32_t s = 0; s < k->n_streams; s++)
        d->n_tok += k->n_new[s];
    /* free pages stay NaN; with rows, stream s's row starts 3 elements
     * after the end of stream s+1's (the last stream first) */
    th_pages_make(h, &r, k->n_streams, k->len, k->page_size, 2, k->rows, &d->pg);
    int32_t n_tok = d->n_tok + (k->pad_token ? 1 : 0);
    d->tok_seq = th_alloc(h, (size_t)n_tok * sizeof(int32_t));
    d->tok_kv_len = th_alloc(h, (size_t)n_tok * sizeof(int32_t));
    d->store_tok = th_alloc(h, (size_t)n_tok * sizeof(int32_t));
    d->store_slot = th_alloc(h, (size_t)n_tok * sizeof(int32_t));
    int32_t *order = th_alloc(h, (size_t)n_tok * sizeof(int32_t));
    ref64_shuffle(&r, order, n_tok);
    for (int32_t i = 0; k->ordered && i < n_tok; i++)
        order[i] = i;
    d->q = th_alloc(h, (size_t)n_tok * k->n_heads * k->head_dim * sizeof(double));
    d->kcur = th_alloc(h, (size_t)n_tok * d->row * sizeof(double));
    d->vcur = th_alloc(h, (size_t)n_tok * d->row * sizeof(double));
    ref64_fill(&r, d->q, (int64_t)n_tok * k->n_heads * k->head_dim, -3, 3, F32);
    ref64_fill(&r, d->kcur, (int64_t)n_tok * d->row, -1, 1, F32);
    ref64_fill(&r, d->vcur, (int64_t)n_tok * d->row, -1, 1, F32);
    int32_t t = 0;
    for (int32_t s = 0; s < k->n_streams; s++) {
        d->kl[s] = th_alloc(h, (size_t)(k->len[s] + 1) * d->row * sizeof(double));
        d->vl[s] = th_alloc(h, (size_t)(k->len[s] + 1) * d->row * sizeof(double));
        int32_t first_new = k->len[s] - k->n_new[s];
        ref64_fill(&r, d->kl[s], (int64_t)first_new * d->row, -1, 1, k->dtype);
        ref64_fill(&r, d->vl[s], (int64_t)first_new * d->row, -1, 1, k->dtype);
        for (int32_t j = first_new; j < k->len[s]; j++, t++) {
            int32_t i = order[t]; /* ubatch position of this token */
            d->tok_seq[i] = s;
            d->tok_kv_len[i] = j + 1;
            d->store_tok[d->n_store] = i;
            d->store_slot[d->n_store++] = th_pages_slot(&d->pg, s, j);
            for (int32_t e = 0; e < d->row; e++) {
                d->kl[s][(int64_t)j * d->row + e] = ref64_round(d->kcur[(int64_t)i * d->row + e], k->dtype);
                d->vl[s][(int64_t)j * d->row + e] = ref64_round(d->vcur[(int64_t)i * d->row + e], k->dtype);
            }
        }
    }
    if (k->pad_token) {
        int32_t i = order[t];
        int32_t s = 0;
        while (s + 1 < k->n_streams && k->len[s] > 0)
            s++;
        d->tok_seq[i] = s;
        d->tok_kv_len[i] = 0;
    }
    d->n_tok = n_tok;
}

/* The float64 attention of every (token, head) of d over its visible
 * logical keys: queries q ([n_tok][n_heads][head_dim], d->q or a rounded
 * copy) times scale, p's softcap; with abs_v the values are |v| (then out
 * is sum_j w_j |v_j|, the scale of the fast mode's rounding error). */
static void attn_reference_ex(const attn_data *d, const llmem_attn_params *p, const double *q,
                              double scale, bool abs_v, double *out)
{
    const attn_case *k = &d->k;
    int32_t hd = k->head_dim, rep = k->n_heads / k->n_kv_heads;
    int32_t max_len = 1;
    for (int32_t s = 0; s < k->n_streams; s++)
        max_len = k->len[s] > max_len ? k->len[s] : max_len;
    double *kk = malloc(sizeof(double) * (size_t)hd * (size_t)max_len);
    double *vv = malloc(sizeof(double) * (size_t)hd * (size_t)max_len);
    for (int32_t i = 0; i < d->n_tok; i++) {
        int32_t s = d->tok_seq[i], len = d->tok_kv_len[i];
        int32_t lo = k->window > 0 && len > k->window ? len - k->window : 0;
        for (int32_t hh = 0; hh < k->n_heads; hh++) {
            int32_t g = hh / rep;
            for (int32_t j = lo; j < len; j++)
                for (int32_t e = 0; e < hd; e++) {
                    double v = d->vl[s][(int64_t)j * d->row + g * hd + e];
                    kk[(j - lo) * hd + e] = d->kl[s][(int64_t)j * d->row + g * hd + e];
                    vv[(j - lo) * hd + e] = abs_v ? fabs(v) : v;
                }
            ref64_attention(q + ((int64_t)i * k->n_heads + hh) * hd, kk, vv, len - lo, hd, scale,
                            (double)p->softcap, out + ((int64_t)i * k->n_heads + hh) * hd);
        }
    }
    free(kk);
    free(vv);
}

static void attn_reference(const attn_data *d, const llmem_attn_params *p, double *out)
{
    attn_reference_ex(d, p, d->q, (double)p->scale, false, out);
}

/* Builds the view on `be` (pools filled with `fill`), runs kv_store then
 * attention; writes out and, when pools != NULL, the K and V pool bytes. */
static void attn_run(llmem_backend *be, const attn_data *d, const llmem_attn_params *p,
                     uint32_t fill, double *out, unsigned char **pools, th_ctx *keep)
{
    const attn_case *k = &d->k;
    th_ctx c;
    th_begin(&c, be);
    size_t es = llmem_dtype_size(k->dtype);
    size_t pool_bytes = (size_t)d->pg.n_pages * k->page_size * d->row * es;
    llmem_kv_view kvd = {0};
    llmem_kv_view *kv = &kvd;
    llmem_view view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->k = th_pool(&c, pool_bytes, k->dtype);
    kv->v = th_pool(&c, pool_bytes, k->dtype);
    ck_assert_int_eq(llmem_buffer_fill(kv->k, 0, llmem_buffer_size(kv->k), fill), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(kv->v, 0, llmem_buffer_size(kv->v), fill), LLMEM_OK);
    kv->dtype = k->dtype;
    kv->n_pages = d->pg.n_pages;
    kv->page_size = k->page_size;
    kv->n_kv_heads = k->n_kv_heads;
    kv->head_dim = k->head_dim;
    kv->max_pages = d->pg.max_pages;
    /* the past keys of every stream, written straight into their slots */
    unsigned char *rowbuf = th_alloc(&c, (size_t)d->row * es);
    for (int32_t s = 0; s < k->n_streams; s++)
        for (int32_t j = 0; j < k->len[s] - k->n_new[s]; j++) {
            size_t off = (size_t)th_pages_slot(&d->pg, s, j) * d->row * es;
            for (int32_t e = 0; e < d->row; e++)
                ref64_encode(d->kl[s][(int64_t)j * d->row + e], k->dtype, rowbuf + e * es);
            ck_assert_int_eq(llmem_buffer_upload(kv->k, off, rowbuf, (size_t)d->row * es), LLMEM_OK);
            for (int32_t e = 0; e < d->row; e++)
                ref64_encode(d->vl[s][(int64_t)j * d->row + e], k->dtype, rowbuf + e * es);
            ck_assert_int_eq(llmem_buffer_upload(kv->v, off, rowbuf, (size_t)d->row * es), LLMEM_OK);
        }
    int32_t seq_len[MAX_STREAMS];
    for (int32_t s = 0; s < k->n_streams; s++)
        seq_len[s] = k->len[s];
    th_idx b = {0};
    kv->store_tok = th_idx_add(&b, d->store_tok, d->n_store);
    kv->store_slot = th_idx_add(&b, d->store_slot, d->n_store);
    kv->page_table = th_idx_add(&b, d->pg.page_table, d->pg.n_pt);
    kv->seq_len = th_idx_add(&b, seq_len, k->n_streams);
    kv->tok_kv_len = th_idx_add(&b, d->tok_kv_len, d->n_tok);
    kv->tok_seq = th_idx_add(&b, d->tok_seq, d->n_tok);
    kv->page_off = th_idx_add(&b, d->pg.page_off, k->rows ? k->n_streams : 0);
    llmem_i32_table *tabs[] = {&kv->store_tok, &kv->store_slot, &kv->page_table,
                               &kv->seq_len, &kv->tok_kv_len, &kv->tok_seq, &kv->page_off};
    view.idx = th_idx_finish(&c, &b, tabs, 7);
    llmem_tensor q = th_tensor(&c, F32, 3, d->n_tok, k->n_heads, k->head_dim);
    llmem_tensor kc = th_tensor(&c, F32, 3, d->n_tok, k->n_kv_heads, k->head_dim);
    llmem_tensor vc = th_tensor(&c, F32, 3, d->n_tok, k->n_kv_heads, k->head_dim);
    llmem_tensor o = th_tensor(&c, F32, 3, d->n_tok, k->n_heads, k->head_dim);
    th_set(&q, d->q);
    th_set(&kc, d->kcur);
    th_set(&vc, d->vcur);
    ck_assert_int_eq(llmem_op_kv_store(be, &view, &kc, &vc), LLMEM_OK);
    ck_assert_int_eq(llmem_op_attention_paged(be, p, &view, &q, &o), LLMEM_OK);
    th_get(&o, out);
    if (pools) {
        pools[0] = th_keep(keep, th_snapshot(&c, kv->k));
        pools[1] = th_keep(keep, th_snapshot(&c, kv->v));
        c.n_keep -= 2; /* now owned by `keep` */
    }
    th_end(&c);
}

/* The bytes the pools must hold: fill everywhere, the rounded K/V of every
 * slot a sequence owns (past ones uploaded, new ones stored by the op). */
static void expect_pools(const attn_data *d, uint32_t fill, unsigned char *const *got)
{
    const attn_case *k = &d->k;
    size_t es = llmem_dtype_size(k->dtype);
    size_t bytes = (size_t)d->pg.n_pages * k->page_size * d->row * es;
    for (int kvi = 0; kvi < 2; kvi++) {
        unsigned char *want = malloc((bytes + 3) / 4 * 4);
        for (size_t i = 0; i < bytes; i += 4)
            memcpy(want + i, &fill, 4);
        for (int32_t s = 0; s < k->n_streams; s++)
            for (int32_t j = 0; j < k->len[s]; j++)
                for (int32_t e = 0; e < d->row; e++)
                    ref64_encode((kvi ? d->vl : d->kl)[s][(int64_t)j * d->row + e], k->dtype,
                                 want + ((size_t)th_pages_slot(&d->pg, s, j) * d->row + e) * es);
        th_expect_same_bytes(got[kvi], want, bytes, kvi ? "V pool after kv_store" : "K pool after kv_store");
        free(want);
    }
}

static const attn_case cases[] = {
    /* GQA 2, f16, pages of 16: a long stream, a one-token sequence, a
     * whole prefill, an empty stream and a padding token */
    {4, {37, 1, 16, 0}, {5, 1, 16, 0}, 16, 2, 4, 64, F16, 0.0f, 0, true, false, false},
    /* MQA, bf16, pages of 1, soft-capped */
    {2, {9, 4}, {1, 4}, 1, 1, 3, 80, BF16, 30.0f, 0, false, false, false},
    /* MHA, f32, pages of 64, sliding window */
    {2, {130, 65}, {3, 65}, 64, 4, 4, 128, F32, 0.0f, 20, false, false, false},
    /* GQA 4 decode step, window and softcap */
    {1, {100}, {1}, 16, 2, 8, 80, F32, 50.0f, 32, false, false, false},
    /* short sequences in pages of 64, f16 */
    {5, {1, 2, 3, 64, 65}, {1, 1, 1, 2, 1}, 64, 1, 2, 64, F16, 0.0f, 0, true, false, false},
    /* bf16 head_dim 128 with pages of 16 and a window longer than all */
    {3, {40, 17, 33}, {8, 17, 1}, 16, 2, 6, 128, BF16, 0.0f, 1000, false, false, false},
    /* long contexts: a 1500-token history with a chunk of 40, and a
     * 700-token prefill in one ubatch */
    {2, {1500, 700}, {40, 700}, 16, 2, 4, 64, F16, 0.0f, 0, false, false, false},
    /* page-table rows at page_off (llmem_kv_view.page_off): the first case,
     * a decode step of pages of 1 and a prefill chunk next to a decode */
    {4, {37, 1, 16, 0}, {5, 1, 16, 0}, 16, 2, 4, 64, F16, 0.0f, 0, true, true, false},
    {3, {70, 5, 33}, {1, 1, 1}, 1, 2, 4, 64, F32, 0.0f, 0, false, true, false},
    {2, {300, 64}, {1, 64}, 64, 2, 8, 128, BF16, 0.0f, 0, false, true, false},
    /* decode steps over long histories: several key splits per query and
     * many steps of the cuda kernel's cp.async ring per split; pages of 1
     * with a window and softcap, and head_dim 256 in f32 */
    {2, {1500, 900}, {1, 1}, 16, 2, 8, 128, BF16, 0.0f, 0, false, false, false},
    {3, {700, 64, 1}, {1, 1, 1}, 1, 2, 8, 64, F16, 30.0f, 300, false, false, false},
    {2, {600, 333}, {1, 1}, 64, 1, 4, 256, F32, 0.0f, 0, false, false, false},
};

/* Every case of cases[] on be, against cpu's result (NULL: the float64 reference);
 * `label` names the run in failure messages. */
static void attention_cases(llmem_backend *be, llmem_backend *cpu, const char *label)
{
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        th_ctx h;
        th_begin(&h, NULL);
        attn_data d;
        attn_make(&h, &cases[ci], 2000 + ci, &d);
        llmem_attn_params p = {.scale = 1.0f / sqrtf((float)cases[ci].head_dim),
                               .softcap = cases[ci].softcap, .window = cases[ci].window};
        int64_t n = (int64_t)d.n_tok * cases[ci].n_heads * cases[ci].head_dim;
        double *out = th_alloc(&h, (size_t)n * sizeof *out);
        double *clean = th_alloc(&h, (size_t)n * sizeof *clean);
        double *ref = th_alloc(&h, (size_t)n * sizeof *ref);
        uint32_t nan = llmem_nan_pattern(cases[ci].dtype);
        unsigned char *pools[2];
        attn_run(be, &d, &p, nan, out, pools, &h);
        expect_pools(&d, nan, pools);
        /* poisoned free pages and padding give exactly the clean result */
        attn_run(be, &d, &p, 0u, clean, NULL, NULL);
        char what[96];
        snprintf(what, sizeof what, "attention case %zu, NaN vs zero pools", ci);
        th_expect_same_bytes(out, clean, (size_t)n * sizeof *out, what);
        if (cpu)
            attn_run(cpu, &d, &p, nan, ref, NULL, NULL);
        else
            attn_reference(&d, &p, ref);
        snprintf(what, sizeof what, "attention case %zu (%s, ps %d, hd %d)%s", ci,
                 llmem_dtype_name(cases[ci].dtype), cases[ci].page_size, cases[ci].head_dim, label);
        th_expect_close(out, ref, n, ref64_tol(F32, cpu != NULL), what);
        /* a query that sees no key gets exact zeros */
        for (int32_t i = 0; i < d.n_tok; i++)
            if (d.tok_kv_len[i] == 0)
                for (int32_t e = 0; e < cases[ci].n_heads * cases[ci].head_dim; e++)
                    if (out[(int64_t)i * cases[ci].n_heads * cases[ci].head_dim + e] != 0.0)
                        ck_abort_msg("attention case %zu: token %d sees no key but is not 0", ci, i);
        th_end(&h);
    }
}

START_TEST(test_attention)
{
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    attention_cases(be, cpu, "");
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* The Vulkan decode attention's subgroup module (LLMEM_VULKAN_DEC_ATTN=1, chunks; 2,
 * streaming groups) and attention_decode_st.comp (3, subgroups streaming their keys; its
 * variant bits LLMEM_VULKAN_DEC_ST and L2 prefetch LLMEM_VULKAN_DEC_ATTN_PF) at several keys
 * per group (or lane) and round and workgroups, and the key split of
 * LLMEM_VULKAN_DEC_SPLIT_KEYS, against the float64 reference (read at
 * llmem_backend_reload_env; on devices without subgroup shuffles the plain module runs), and
 * module 3 over pools in several allocation chunks. */
START_TEST(test_attention_dec_modes)
{
    llmem_backend *be = th_open(_i);
    if (strcmp(llmem_backend_name(be), "vulkan") != 0) {
        llmem_backend_close(be);
        return;
    }
    static const char *const sets[][6] = {
        {"1", "8", "256", "64", NULL, NULL}, {"2", "1", "256", "128", NULL, NULL},
        {"3", NULL, NULL, NULL, NULL, NULL}, {"3", "4", "64", "64", "7", "1"},
        {"3", "8", "256", "128", "3", "3"},  {"3", "1", "32", NULL, "5", "2"},
        /* module 3's variant bits: 8 (the page-table words by blocks) off, with 16 (the
         * splits interleaved), and 16 alone */
        {"3", "2", NULL, "64", "0", NULL},   {"3", "4", "64", "128", "24", NULL},
        {"3", "1", "32", "64", "16", "2"},
        /* 32 (the loops written out) with the default 8, and with 1 and 2 */
        {"3", "2", NULL, "64", "40", NULL},  {"3", "4", "64", NULL, "35", "1"},
        {"3", "1", NULL, NULL, "34", NULL},
    };
    static const char *const names[6] = {"LLMEM_VULKAN_DEC_ATTN", "LLMEM_VULKAN_DEC_KPG",
                                         "LLMEM_VULKAN_DEC_WG", "LLMEM_VULKAN_DEC_SPLIT_KEYS",
                                         "LLMEM_VULKAN_DEC_ST", "LLMEM_VULKAN_DEC_ATTN_PF"};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        char label[128];
        snprintf(label, sizeof label, " DEC_ATTN=%s KPG=%s WG=%s SPLIT_KEYS=%s ST=%s PF=%s",
                 sets[si][0], sets[si][1] ? sets[si][1] : "-", sets[si][2] ? sets[si][2] : "-",
                 sets[si][3] ? sets[si][3] : "-", sets[si][4] ? sets[si][4] : "-",
                 sets[si][5] ? sets[si][5] : "-");
        for (int k = 0; k < 6; k++)
            if (sets[si][k])
                setenv(names[k], sets[si][k], 1);
        ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
        attention_cases(be, NULL, label);
        for (int k = 0; k < 6; k++)
            unsetenv(names[k]);
        ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
    }
    llmem_backend_close(be);
    /* module 3 over pools of 2 to 4 allocation chunks (a backend opened with 64 KiB chunks:
     * several cases' pools bind chunk by chunk, the shader picking each vector's chunk) */
    setenv("LLMEM_VULKAN_MAX_CHUNK", "64K", 1);
    setenv("LLMEM_VULKAN_DEC_ATTN", "3", 1);
    be = th_open(_i);
    unsetenv("LLMEM_VULKAN_MAX_CHUNK");
    unsetenv("LLMEM_VULKAN_DEC_ATTN");
    attention_cases(be, NULL, " DEC_ATTN=3 MAX_CHUNK=64K");
    llmem_backend_close(be);
}
END_TEST

/* attention_decode_st.comp's loops written out (LLMEM_VULKAN_DEC_ST bit 32, WO), at 1, 2 and
 * 4 keys a lane, with the page-table words a block ahead (bit 8) and not, on every case of
 * attention_cases (float64 reference, NaN pools). The same operations in the same order as the
 * [[unroll]] loops, but not always the same bits: lavapipe gives them, while NVIDIA's compiler
 * (driver 580) contracts the two forms' multiply-adds differently at 1 key a lane (the H200
 * differed in the last 3 bits of some outputs). */
START_TEST(test_attention_dec_wo)
{
    llmem_backend *be = th_open(_i);
    if (strcmp(llmem_backend_name(be), "vulkan") != 0) {
        llmem_backend_close(be);
        return;
    }
    static const char *const kpg[] = {"1", "2", "4"};
    static const char *const st[] = {"40", "32"}; /* the looped forms: test_attention_dec_modes */
    setenv("LLMEM_VULKAN_DEC_ATTN", "3", 1);
    for (size_t ki = 0; ki < 3; ki++)
        for (size_t si = 0; si < 2; si++) {
            setenv("LLMEM_VULKAN_DEC_KPG", kpg[ki], 1);
            setenv("LLMEM_VULKAN_DEC_ST", st[si], 1);
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
            char label[64];
            snprintf(label, sizeof label, " KPG=%s DEC_ST=%s", kpg[ki], st[si]);
            attention_cases(be, NULL, label);
        }
    unsetenv("LLMEM_VULKAN_DEC_ATTN");
    unsetenv("LLMEM_VULKAN_DEC_KPG");
    unsetenv("LLMEM_VULKAN_DEC_ST");
    llmem_backend_close(be);
}
END_TEST

/* ---- prefill, precise and fast mode -------------------------------------------------------- */

/* Prefill ubatches at the shapes of the CUDA prefill kernels (tokens in
 * stream order, so tiles of 32 tokens span stream boundaries): several
 * streams of unequal lengths, GQA 32/8, head_dim 64 and 128, pages of
 * 1 / 16 / 64, f16 and bf16 pools, a window and softcap, a chunk after a
 * history, and a padding token. */
static const attn_case prefill_cases[] = {
    {3, {200, 129, 77}, {200, 129, 77}, 16, 8, 32, 128, BF16, 0.0f, 0, false, false, true},
    {2, {330, 150}, {130, 150}, 1, 2, 8, 64, F16, 0.0f, 0, false, false, true},
    {2, {333, 200}, {333, 100}, 64, 2, 8, 64, BF16, 30.0f, 100, false, true, true},
    {4, {260, 65, 1, 0}, {130, 65, 1, 0}, 64, 4, 8, 128, F16, 0.0f, 0, true, false, true},
};

/* The cuda backend again with LLMEM_CUDA_ATTN_FAST=1 (read when a backend
 * opens), or NULL for backends without a fast attention mode. */
static llmem_backend *open_fast(int i)
{
    if (strcmp(th_backend_name(i), "cuda") != 0)
        return NULL;
    llmem_backend *be = NULL;
    char err[256] = "";
    setenv("LLMEM_CUDA_ATTN_FAST", "1", 1);
    llmem_status st = llmem_backend_open("cuda", -1, &be, err, sizeof err);
    unsetenv("LLMEM_CUDA_ATTN_FAST");
    ck_assert_msg(st == LLMEM_OK, "open cuda (fast): %s %s", llmem_status_str(st), err);
    return be;
}

/* Checks a fast-mode result against the float64 model of its arithmetic
 * (kernels/attention_prefill_tc.cuh; docs/cuda.md, "Precision of the
 * prefill"): q * scale rounded once to the pool dtype T (f32 product, then
 * round to nearest even), S = q' . k and the softmax exact, each
 * probability p_j rounded once to T. With w the softmax weights, the
 * rounding of p changes the output by sum_j w_j e_j v_j, |e_j| <= u (unit
 * roundoff of T: 2^-8 bf16, 2^-11 f16), hence per element
 *   |out - model| <= u * sum_j w_j |v_j|                       (p rounding)
 *                  + 2 D 2^-23 |q'|_1 max|k| max|v|            (f32 sums of S)
 *                  + n 2^-23 max|v| (+ n 2^-25 max|v| for f16 subnormal p)
 * (n keys; the f32 accumulations of P V and of the row sum, and f16's
 * subnormal probabilities, each at most half an ulp of 2^-24 per key).
 * The normalized error is checked against u: the relative rounding errors
 * of p spread over [-u, u] give about u / sqrt(3). */
static void expect_fast(const attn_data *d, const llmem_attn_params *p, const double *out,
                        const char *what)
{
    const attn_case *k = &d->k;
    int64_t n = (int64_t)d->n_tok * k->n_heads * k->head_dim;
    double u = k->dtype == F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    double *qm = malloc((size_t)n * sizeof *qm), *model = malloc((size_t)n * sizeof *model);
    double *wv = malloc((size_t)n * sizeof *wv);
    ck_assert(qm && model && wv);
    for (int64_t e = 0; e < n; e++)
        qm[e] = ref64_round((double)((float)d->q[e] * p->scale), k->dtype);
    attn_reference_ex(d, p, qm, 1.0, false, model);
    attn_reference_ex(d, p, qm, 1.0, true, wv);
    double vmax = 1.0, kmax = 1.0; /* attn_make fills K/V in [-1, 1] */
    for (int64_t r = 0; r < (int64_t)d->n_tok * k->n_heads; r++) {
        int32_t keys = d->tok_kv_len[r / k->n_heads];
        double q1 = 0.0;
        for (int32_t e = 0; e < k->head_dim; e++)
            q1 += fabs(qm[r * k->head_dim + e]);
        double bound_row = 2.0 * k->head_dim * ldexp(q1 * kmax, -23) * vmax +
                           keys * (ldexp(1.0, -23) + (k->dtype == F16 ? ldexp(1.0, -25) : 0.0)) * vmax;
        for (int32_t e = 0; e < k->head_dim; e++) {
            int64_t at = r * k->head_dim + e;
            double bound = u * wv[at] + bound_row;
            if (!(fabs(out[at] - model[at]) <= bound))
                ck_abort_msg("%s: element %lld is %.9g, model %.9g (bound %.3g), seed %llu", what,
                             (long long)at, out[at], model[at], bound,
                             (unsigned long long)ref64_seed());
        }
    }
    th_expect_close(out, model, n, u, what);
    free(qm);
    free(model);
    free(wv);
}

START_TEST(test_attention_prefill)
{
    llmem_backend *be = th_open(_i);
    llmem_backend *fast = open_fast(_i);
    for (size_t ci = 0; ci < sizeof prefill_cases / sizeof prefill_cases[0]; ci++) {
        const attn_case *k = &prefill_cases[ci];
        th_ctx h;
        th_begin(&h, NULL);
        attn_data d;
        attn_make(&h, k, 2500 + ci, &d);
        llmem_attn_params p = {.scale = 1.0f / sqrtf((float)k->head_dim), .softcap = k->softcap,
                               .window = k->window};
        int64_t n = (int64_t)d.n_tok * k->n_heads * k->head_dim;
        double *out = th_alloc(&h, (size_t)n * sizeof *out);
        double *clean = th_alloc(&h, (size_t)n * sizeof *clean);
        double *ref = th_alloc(&h, (size_t)n * sizeof *ref);
        uint32_t nan = llmem_nan_pattern(k->dtype);
        attn_reference(&d, &p, ref);
        char what[128];
        llmem_backend *runs[2] = {be, fast};
        for (int run = 0; run < (fast ? 2 : 1); run++) {
            attn_run(runs[run], &d, &p, nan, out, NULL, NULL);
            attn_run(runs[run], &d, &p, 0u, clean, NULL, NULL);
            snprintf(what, sizeof what, "prefill case %zu%s, NaN vs zero pools", ci,
                     run ? " (fast)" : "");
            th_expect_same_bytes(out, clean, (size_t)n * sizeof *out, what);
            snprintf(what, sizeof what, "prefill case %zu%s (%s, ps %d, hd %d, %d/%d heads)", ci,
                     run ? " (fast)" : "", llmem_dtype_name(k->dtype), k->page_size,
                     k->head_dim, k->n_heads, k->n_kv_heads);
            if (run == 0)
                th_expect_close(out, ref, n, ref64_tol(F32, !th_is_cpu(_i)), what);
            else
                expect_fast(&d, &p, out, what);
            for (int32_t i = 0; i < d.n_tok; i++)
                if (d.tok_kv_len[i] == 0)
                    for (int32_t e = 0; e < k->n_heads * k->head_dim; e++)
                        if (out[(int64_t)i * k->n_heads * k->head_dim + e] != 0.0)
                            ck_abort_msg("%s: token %d sees no key but is not 0", what, i);
        }
        th_end(&h);
    }
    llmem_backend_close(fast);
    llmem_backend_close(be);
}
END_TEST

/* ---- index-table checks ---------------------------------------------------------------- */

typedef struct small_view {
    llmem_view view;
    llmem_kv_view kv; /* view.desc */
    int32_t *host; /* the builder's array (to corrupt the device copy) */
    llmem_tensor q, o, kc;
} small_view;

/* A 2-stream view: lens {5, 3}, page size 4, pages {2, 0} and {1}; the
 * arrays may be altered by the caller before it is built. */
static void small_build_rows(th_ctx *c, small_view *sv, const int32_t *pt, const int32_t *seq_len,
                             const int32_t *kv_len, const int32_t *tok_seq, const int32_t *st_tok,
                             const int32_t *st_slot, int32_t n_store, const int32_t *page_off)
{
    memset(sv, 0, sizeof *sv);
    llmem_kv_view *kv = &sv->kv;
    sv->view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->dtype = F32;
    kv->n_pages = 4;
    kv->page_size = 4;
    kv->n_kv_heads = 1;
    kv->head_dim = 8;
    kv->max_pages = 2;
    kv->k = th_pool(c, 4 * 4 * 8 * 4, F32);
    kv->v = th_pool(c, 4 * 4 * 8 * 4, F32);
    ck_assert_int_eq(llmem_buffer_fill(kv->k, 0, 512, 0), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(kv->v, 0, 512, 0), LLMEM_OK);
    th_idx b = {0};
    kv->store_tok = th_idx_add(&b, st_tok, n_store);
    kv->store_slot = th_idx_add(&b, st_slot, n_store);
    kv->page_table = th_idx_add(&b, pt, 4);
    kv->seq_len = th_idx_add(&b, seq_len, 2);
    kv->tok_kv_len = th_idx_add(&b, kv_len, 3);
    kv->tok_seq = th_idx_add(&b, tok_seq, 3);
    kv->page_off = th_idx_add(&b, page_off, page_off ? 2 : 0);
    llmem_i32_table *tabs[] = {&kv->store_tok, &kv->store_slot, &kv->page_table,
                               &kv->seq_len, &kv->tok_kv_len, &kv->tok_seq, &kv->page_off};
    sv->view.idx = th_idx_finish(c, &b, tabs, 7);
    sv->host = (int32_t *)c->keep[c->n_keep - 1];
    sv->q = th_tensor(c, F32, 3, 3, 2, 8);
    sv->o = th_tensor(c, F32, 3, 3, 2, 8);
    sv->kc = th_tensor(c, F32, 3, 3, 1, 8);
    double z[48] = {0};
    th_set(&sv->q, z);
    th_set(&sv->kc, z);
}

static void small_build(th_ctx *c, small_view *sv, const int32_t *pt, const int32_t *seq_len,
                        const int32_t *kv_len, const int32_t *tok_seq, const int32_t *st_tok,
                        const int32_t *st_slot, int32_t n_store)
{
    small_build_rows(c, sv, pt, seq_len, kv_len, tok_seq, st_tok, st_slot, n_store, NULL);
}

START_TEST(test_attention_tables)
{
    llmem_backend *be = th_open(_i);
    llmem_attn_params p = {.scale = 0.5f};
    const int32_t pt[4] = {2, 0, 1, -1}, len[2] = {5, 3}, kvl[3] = {5, 4, 3}, ts[3] = {0, 0, 1};
    const int32_t stok[3] = {0, 1, 2}, sslot[3] = {8, 3, 6};
    th_ctx c;
    th_begin(&c, be);
    small_view sv;
    small_build(&c, &sv, pt, len, kvl, ts, stok, sslot, 3);
    ck_assert_int_eq(llmem_op_kv_store(be, &sv.view, &sv.kc, &sv.kc), LLMEM_OK);
    ck_assert_int_eq(llmem_op_attention_paged(be, &p, &sv.view, &sv.q, &sv.o), LLMEM_OK);
    /* out overlapping q, a q head count that is no multiple of n_kv_heads */
    ck_assert_int_eq(llmem_op_attention_paged(be, &p, &sv.view, &sv.q, &sv.q), LLMEM_E_INVALID);
    llmem_tensor q0 = sv.q;
    q0.ne[2] = 7;
    ck_assert_int_eq(llmem_op_attention_paged(be, &p, &sv.view, &q0, &q0), LLMEM_E_INVALID);
    llmem_attn_params bad_p = {.scale = 0.5f, .softcap = -1.0f};
    ck_assert_int_eq(llmem_op_attention_paged(be, &bad_p, &sv.view, &sv.q, &sv.o), LLMEM_E_INVALID);
    struct {
        int32_t pt[4], len[2], kvl[3], ts[3], sslot[3];
        const char *why;
    } bad[] = {
        {{2, 7, 1, -1}, {5, 3}, {5, 4, 3}, {0, 0, 1}, {8, 3, 6}, "page id out of range"},
        {{2, -1, 1, -1}, {5, 3}, {5, 4, 3}, {0, 0, 1}, {8, 3, 6}, "-1 inside seq_len"},
        {{2, 0, 1, -1}, {9, 3}, {5, 4, 3}, {0, 0, 1}, {8, 3, 6}, "more pages than max_pages"},
        {{2, 0, 1, -1}, {5, 3}, {6, 4, 3}, {0, 0, 1}, {8, 3, 6}, "tok_kv_len > seq_len"},
        {{2, 0, 1, -1}, {5, 3}, {5, 4, 3}, {0, 2, 1}, {8, 3, 6}, "tok_seq out of range"},
        {{2, 0, 1, -1}, {5, -1}, {5, 4, 3}, {0, 0, 0}, {8, 3, 6}, "negative seq_len"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        small_view b;
        small_build(&c, &b, bad[i].pt, bad[i].len, bad[i].kvl, bad[i].ts, stok, bad[i].sslot, 3);
        ck_assert_msg(llmem_op_attention_paged(be, &p, &b.view, &b.q, &b.o) == LLMEM_E_INVALID,
                      "%s accepted", bad[i].why);
        th_end(&c);
        th_begin(&c, be);
    }
    /* page-table rows (llmem_kv_view.page_off): {0, 2} is the dense layout;
     * a row that reads -1 or runs past the table, a negative offset */
    static const int32_t rows_ok[2] = {0, 2}, rows_bad[][2] = {{2, 0}, {0, 3}, {-1, 2}, {0, 4}};
    small_view b;
    small_build_rows(&c, &b, pt, len, kvl, ts, stok, sslot, 3, rows_ok);
    ck_assert_int_eq(llmem_op_attention_paged(be, &p, &b.view, &b.q, &b.o), LLMEM_OK);
    for (size_t i = 0; i < sizeof rows_bad / sizeof rows_bad[0]; i++) {
        small_build_rows(&c, &b, pt, len, kvl, ts, stok, sslot, 3, rows_bad[i]);
        ck_assert_msg(llmem_op_attention_paged(be, &p, &b.view, &b.q, &b.o) == LLMEM_E_INVALID,
                      "page_off {%d, %d} accepted", rows_bad[i][0], rows_bad[i][1]);
    }
    const int32_t dup[3] = {8, 3, 8}, oob[3] = {8, 3, 16}, tok_oob[3] = {0, 3, 2};
    small_build(&c, &b, pt, len, kvl, ts, stok, dup, 3);
    ck_assert_int_eq(llmem_op_kv_store(be, &b.view, &b.kc, &b.kc), LLMEM_E_INVALID);
    small_build(&c, &b, pt, len, kvl, ts, stok, oob, 3);
    ck_assert_int_eq(llmem_op_kv_store(be, &b.view, &b.kc, &b.kc), LLMEM_E_INVALID);
    small_build(&c, &b, pt, len, kvl, ts, tok_oob, sslot, 3);
    ck_assert_int_eq(llmem_op_kv_store(be, &b.view, &b.kc, &b.kc), LLMEM_E_INVALID);
    if (th_is_cpu(_i)) {
        /* a device table that disagrees with its host copy: the CPU kernel
         * checks what it reads instead of reading out of bounds */
        small_build(&c, &b, pt, len, kvl, ts, stok, sslot, 3);
        size_t off = b.kv.page_table.offset;
        int32_t evil = 1 << 20;
        ck_assert_int_eq(llmem_buffer_upload(b.view.idx, off, &evil, 4), LLMEM_OK);
        ck_assert_int_eq(llmem_op_attention_paged(be, &p, &b.view, &b.q, &b.o), LLMEM_E_INVALID);
        off = b.kv.store_slot.offset;
        ck_assert_int_eq(llmem_buffer_upload(b.view.idx, off, &evil, 4), LLMEM_OK);
        ck_assert_int_eq(llmem_op_kv_store(be, &b.view, &b.kc, &b.kc), LLMEM_E_INVALID);
    }
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_attention: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_attention, 0, n);
    tcase_add_loop_test(tc, test_attention_dec_modes, 0, n);
    tcase_add_loop_test(tc, test_attention_dec_wo, 0, n);
    tcase_add_loop_test(tc, test_attention_prefill, 0, n);
    tcase_add_loop_test(tc, test_attention_tables, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

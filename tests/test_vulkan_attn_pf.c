// ctest-labels: vulkan
/* The prefill attention on cooperative matrices (shaders/attention_prefill_cm.comp,
 * LLMEM_VULKAN_ATTN_PF; docs/vulkan.md) against float64.
 *
 * Each case is a prefill ubatch (tokens in stream order, so 128-row tiles
 * span stream boundaries) over a paged pool whose pages are handed out in a
 * shuffled order, whose unowned slots hold NaN, with GQA 4:1 and 1:1, head
 * dims 64 and 128, pages of 1, 16 and 64, f16 and bf16 pools, a chunk after
 * a history, a sliding window, a softcap and page-table rows (page_off).
 * Every backend runs:
 *  - the EMU modules (LLMEM_VULKAN_ATTN_PF=3: the shader's tiling, masks and
 *    online softmax with scalar loops for the matrix operations), which
 *    run on lavapipe: EMU (the KHR module's layout, LLMEM_VULKAN_ATTN_PF_CM2=0)
 *    and EMU2 (the CM2 module's: P in registers, reductions and the
 *    accumulator -> A conversion emulated, the K / V ring at head dim 64 and
 *    one stage at 128 on lavapipe's 32 KiB);
 *  - where the device has KHR cooperative matrices (the log's "KHR"), the
 *    real module (LLMEM_VULKAN_ATTN_PF=1 with a fast-mode call), and where it
 *    has VK_NV_cooperative_matrix2 (the log's "coopmat2 on") the CM2 module,
 *    whose result must differ from the KHR module's bits (it ran).
 * The result is checked against the float64 model of the fast arithmetic:
 * q * scale rounded once to f16 (f32 product first), exact scores and
 * softmax, each probability rounded once to f16. Rounding p by at most u =
 * 2^-11 relative moves an output element by at most u sum_j w_j |v_j| (w the
 * softmax weights); the f32 sums of S (D terms of |q'| max|k|) and of P V
 * and the row sum (n keys) add 2 D 2^-23 |q'|_1 max|k| max|v| + n 2^-23
 * max|v|, and f16's subnormal probabilities n 2^-25 max|v|; bf16 pools are
 * converted to f16 exactly (values drawn within f16's normal range). The
 * normalized error must stay within u. NaN pools and zero pools must give
 * the same bytes, and the result must be within 4u (normalized) of
 * attention_decode.comp's precise one (and not its very bits: the module
 * ran). Calls outside the route (a decode batch, head dim 80, an f32 pool)
 * give attention_decode.comp's bits under LLMEM_VULKAN_ATTN_PF=3.
 *
 * Precise-mode calls over f16 pools run the CM2 module's precise arithmetic
 * (EMU2, and CM2 with LLMEM_VULKAN_ATTN_PF_PRECISE=1): q * scale (f32) and
 * P (scaled by 2^15) as hi + lo f16 terms, f32 sums. Against float64 with
 * the f32 q * scale: per element 2^-20 sum_j w_j |v_j| (the two splits'
 * 2^-22 each, with slack) plus the f32 sums' bound above; normalized error
 * within ref64_tol(F32) (test_ops_attention's precise bound), and within
 * twice that of attention_decode.comp's precise result.
 *
 * Every module runs with LLMEM_VULKAN_ATTN_PF_VAR=0 and again with 259 (page
 * ids by shifts for pages of 2^k keys, O's rescale by exactly 1 skipped, the
 * CM2 module's loops over its Q, O matrices written out): the same bytes.
 *
 * The one-pass module (shaders/attention_prefill_fa.comp, LLMEM_VULKAN_ATTN_PF_FA=1) takes
 * fast-arithmetic calls whose tiles each hold one stream's tokens: its own cases (streams of
 * multiples of 32 new tokens) run its EMU module everywhere and, where the device has
 * coopmat2, the real one (head dim 128), with the same checks against float64, and the
 * backend's log must say that its pipeline ran; a case whose tiles span streams must leave
 * the call to the other modules (the EMU2 module's bytes, and no such pipeline). They run under
 * each LLMEM_VULKAN_ATTN_PF_FA variant (1; 3 lazy rescale: another reference max, the same
 * bound; 5 / 7 direct K / V loads where the pool is f16 in pages of >= 16 keys: the bytes of
 * 1 / 3; 11 64-key blocks, the same bound (the EMU module where their stage fits the device:
 * head dim 64 on lavapipe); 19 / 27 the ring refilled in halves: the bytes of 3 / 11; 35 V
 * fetched after the softmax: the bytes of 3; 139 O's loops written out, 235 with V late and
 * the Q tile's loads first: the bytes of 11).
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
#include "support/vk_test.h"

#define MAX_STREAMS 4
#define PF_VAR_EXACT "259" /* LLMEM_VULKAN_ATTN_PF_VAR's bits that keep the results */

/* LLMEM_VULKAN_ATTN_PF_FA of the backends open_mode_log opens with a log */
static const char *fa_knob = "1";

typedef struct pf_case {
    int32_t n_streams;
    int32_t len[MAX_STREAMS];   /* seq_len after the ubatch */
    int32_t n_new[MAX_STREAMS]; /* the stream's last n_new tokens are the ubatch's */
    int32_t page_size, n_kv_heads, n_heads, head_dim;
    llmem_dtype dtype;
    float softcap;
    int32_t window;
    bool rows; /* page-table rows at page_off (streams reversed) */
} pf_case;

static const pf_case cases[] = {
    /* GQA 2:1, hd 128, f16, pages of 64: a chunk of 130 after 130 (up to 9 blocks of keys),
     * a stream of one token and an empty one */
    {4, {260, 65, 1, 0}, {130, 65, 1, 0}, 64, 4, 8, 128, F16, 0.0f, 0, false},
    /* GQA 4:1, hd 128, f16, pages of 16, three whole prefills */
    {3, {100, 49, 37}, {100, 49, 37}, 16, 2, 8, 128, F16, 0.0f, 0, false},
    /* 1:1, hd 64, bf16, pages of 1, a chunk after a history */
    {2, {230, 50}, {70, 50}, 1, 2, 2, 64, BF16, 0.0f, 0, false},
    /* GQA 4:1, hd 64, f16, pages of 64, window and softcap, page-table rows */
    {2, {233, 100}, {133, 100}, 64, 1, 4, 64, F16, 30.0f, 60, true},
    /* GQA 4:1, hd 128, bf16, pages of 64, chunk + prefills and an empty stream */
    {4, {160, 65, 40, 0}, {30, 65, 40, 0}, 64, 1, 4, 128, BF16, 0.0f, 0, false},
};

typedef struct pf_data {
    pf_case k;
    th_pages pg; /* the page tables (th_pages_make) */
    int32_t n_tok, row;
    int32_t *tok_seq, *tok_kv_len;
    double *q;                   /* [n_tok][n_heads][hd] */
    double *kl[MAX_STREAMS], *vl[MAX_STREAMS]; /* [len][row], in the pool dtype */
} pf_data;

static void pf_make(th_ctx *h, const pf_case *k, uint64_t stream, pf_data *d)
{
    ref64_rng r = ref64_rng_make(ref64_seed(), stream);
    memset(d, 0, sizeof *d);
    d->k = *k;
    d->row = k->n_kv_heads * k->head_dim;
    for (int32_t s = 0; s < k->n_streams; s++)
        d->n_tok += k->n_new[s];
    /* unowned pages stay NaN; with rows, stream s's row after stream s +
     * 1's, two -1 between */
    th_pages_make(h, &r, k->n_streams, k->len, k->page_size, 1, k->rows, &d->pg);
    d->tok_seq = th_alloc(h, (size_t)d->n_tok * sizeof(int32_t));
    d->tok_kv_len = th_alloc(h, (size_t)d->n_tok * sizeof(int32_t));
    d->q = th_alloc(h, (size_t)d->n_tok * k->n_heads * k->head_dim * sizeof(double));
    ref64_fill(&r, d->q, (int64_t)d->n_tok * k->n_heads * k->head_dim, -3, 3, F32);
    for (int32_t s = 0, t = 0; s < k->n_streams; s++) {
        d->kl[s] = th_alloc(h, (size_t)(k->len[s] + 1) * d->row * sizeof(double));
        d->vl[s] = th_alloc(h, (size_t)(k->len[s] + 1) * d->row * sizeof(double));
        ref64_fill(&r, d->kl[s], (int64_t)k->len[s] * d->row, -1, 1, k->dtype);
        ref64_fill(&r, d->vl[s], (int64_t)k->len[s] * d->row, -1, 1, k->dtype);
        for (int32_t j = k->len[s] - k->n_new[s]; j < k->len[s]; j++, t++) {
            d->tok_seq[t] = s;
            d->tok_kv_len[t] = j + 1;
        }
    }
    /* within f16's normal range, where bf16 -> f16 is exact */
    for (int32_t s = 0; s < k->n_streams; s++)
        for (int64_t e = 0; e < (int64_t)k->len[s] * d->row; e++) {
            if (fabs(d->kl[s][e]) < 0x1p-13)
                d->kl[s][e] = 0.0;
            if (fabs(d->vl[s][e]) < 0x1p-13)
                d->vl[s][e] = 0.0;
        }
}

/* Starts a case: h begun, d made from k (random stream `stream`), p a fast call at k's scale,
 * soft-cap and window. Returns the output's elements (tokens x heads x head dim). */
static int64_t pf_begin(th_ctx *h, const pf_case *k, uint64_t stream, pf_data *d,
                        llmem_attn_params *p)
{
    th_begin(h, NULL);
    pf_make(h, k, stream, d);
    *p = (llmem_attn_params){.scale = 1.0f / sqrtf((float)k->head_dim), .softcap = k->softcap,
                             .window = k->window, .fast = 1};
    return (int64_t)d->n_tok * k->n_heads * k->head_dim;
}

/* The float64 model of the fast arithmetic (see the top), or with exact the f32 q * scale
 * unrounded (the precise arithmetic's model): out, and wv = sum_j w_j |v_j|. */
static void pf_model(const pf_data *d, const llmem_attn_params *p, bool exact, double *out,
                     double *wv)
{
    const pf_case *k = &d->k;
    int32_t hd = k->head_dim, rep = k->n_heads / k->n_kv_heads;
    int32_t max_len = 1;
    for (int32_t s = 0; s < k->n_streams; s++)
        max_len = k->len[s] > max_len ? k->len[s] : max_len;
    double *kk = malloc(sizeof(double) * (size_t)hd * max_len);
    double *vv = malloc(sizeof(double) * (size_t)hd * max_len);
    double *va = malloc(sizeof(double) * (size_t)hd * max_len);
    double qm[256];
    ck_assert(kk && vv && va && hd <= 256);
    for (int32_t i = 0; i < d->n_tok; i++) {
        int32_t s = d->tok_seq[i], len = d->tok_kv_len[i];
        int32_t lo = k->window > 0 && len > k->window ? len - k->window : 0;
        for (int32_t h = 0; h < k->n_heads; h++) {
            int32_t g = h / rep;
            int64_t at = ((int64_t)i * k->n_heads + h) * hd;
            for (int32_t e = 0; e < hd; e++)
                qm[e] = exact ? (double)((float)d->q[at + e] * p->scale)
                              : ref64_round((double)((float)d->q[at + e] * p->scale), F16);
            for (int32_t j = lo; j < len; j++)
                for (int32_t e = 0; e < hd; e++) {
                    kk[(j - lo) * hd + e] = d->kl[s][(int64_t)j * d->row + g * hd + e];
                    vv[(j - lo) * hd + e] = d->vl[s][(int64_t)j * d->row + g * hd + e];
                    va[(j - lo) * hd + e] = fabs(vv[(j - lo) * hd + e]);
                }
            ref64_attention(qm, kk, vv, len - lo, hd, 1.0, (double)p->softcap, out + at);
            ref64_attention(qm, kk, va, len - lo, hd, 1.0, (double)p->softcap, wv + at);
        }
    }
    free(kk);
    free(vv);
    free(va);
}

/* Runs the case on be (pools filled with `fill` before the keys are
 * written into their slots) and reads the output into out. */
static void pf_run(llmem_backend *be, const pf_data *d, const llmem_attn_params *p, uint32_t fill,
                   double *out)
{
    const pf_case *k = &d->k;
    th_ctx c;
    th_begin(&c, be);
    size_t es = llmem_dtype_size(k->dtype);
    size_t pool_bytes = (size_t)d->pg.n_pages * k->page_size * d->row * es;
    llmem_kv_view kvd = {0}, *kv = &kvd;
    llmem_view view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->k = th_pool(&c, pool_bytes, k->dtype);
    kv->v = th_pool(&c, pool_bytes, k->dtype);
    kv->dtype = k->dtype;
    kv->n_pages = d->pg.n_pages;
    kv->page_size = k->page_size;
    kv->n_kv_heads = k->n_kv_heads;
    kv->head_dim = k->head_dim;
    kv->max_pages = d->pg.max_pages;
    /* the pools built on the host (fill, then every owned slot) and uploaded whole */
    unsigned char *kh = th_alloc(&c, (pool_bytes + 3) / 4 * 4);
    unsigned char *vh = th_alloc(&c, (pool_bytes + 3) / 4 * 4);
    for (size_t i = 0; i < pool_bytes; i += 4) {
        memcpy(kh + i, &fill, 4);
        memcpy(vh + i, &fill, 4);
    }
    for (int32_t s = 0; s < k->n_streams; s++)
        for (int32_t j = 0; j < k->len[s]; j++) {
            size_t off = (size_t)th_pages_slot(&d->pg, s, j) * d->row * es;
            for (int32_t e = 0; e < d->row; e++) {
                ref64_encode(d->kl[s][(int64_t)j * d->row + e], k->dtype, kh + off + e * es);
                ref64_encode(d->vl[s][(int64_t)j * d->row + e], k->dtype, vh + off + e * es);
            }
        }
    OK(llmem_buffer_upload(kv->k, 0, kh, pool_bytes));
    OK(llmem_buffer_upload(kv->v, 0, vh, pool_bytes));
    th_idx b = {0};
    kv->page_table = th_idx_add(&b, d->pg.page_table, d->pg.n_pt);
    kv->seq_len = th_idx_add(&b, k->len, k->n_streams);
    kv->tok_kv_len = th_idx_add(&b, d->tok_kv_len, d->n_tok);
    kv->tok_seq = th_idx_add(&b, d->tok_seq, d->n_tok);
    kv->page_off = th_idx_add(&b, d->pg.page_off, k->rows ? k->n_streams : 0);
    llmem_i32_table *tabs[] = {&kv->page_table, &kv->seq_len, &kv->tok_kv_len, &kv->tok_seq,
                               &kv->page_off};
    view.idx = th_idx_finish(&c, &b, tabs, 5);
    llmem_tensor q = th_tensor(&c, F32, 3, d->n_tok, k->n_heads, k->head_dim);
    llmem_tensor o = th_tensor(&c, F32, 3, d->n_tok, k->n_heads, k->head_dim);
    th_set(&q, d->q);
    OK(llmem_op_attention_paged(be, p, &view, &q, &o));
    th_get(&o, out);
    th_end(&c);
}

/* The vulkan backend opened with LLMEM_VULKAN_ATTN_PF=mode, _CM2=cm2, _VAR=var, _PRECISE=1
 * where precise and _FA=fa_knob where keep_log (which then receives the path of its log, kept for
 * log_says; unlinked otherwise), else _FA=0 (the other modules take every call); *khr: whether it has KHR cooperative matrices (its log says
 * so), *cm2 (may be NULL) VK_NV_cooperative_matrix2. */
static llmem_backend *open_mode_log(const char *mode, const char *cm2_knob, const char *var,
                                    bool precise, bool *khr, bool *cm2, char *keep_log)
{
    char path[] = "/tmp/llmem_attn_pf_XXXXXX";
    log_to_temp(path);
    setenv("LLMEM_VULKAN_ATTN_PF", mode, 1);
    setenv("LLMEM_VULKAN_ATTN_PF_CM2", cm2_knob, 1);
    setenv("LLMEM_VULKAN_ATTN_PF_VAR", var, 1);
    if (precise)
        setenv("LLMEM_VULKAN_ATTN_PF_PRECISE", "1", 1);
    setenv("LLMEM_VULKAN_ATTN_PF_FA", keep_log ? fa_knob : "0", 1);
    llmem_backend *be = test_open("vulkan");
    unsetenv("LLMEM_VULKAN_ATTN_PF");
    unsetenv("LLMEM_VULKAN_ATTN_PF_CM2");
    unsetenv("LLMEM_VULKAN_ATTN_PF_VAR");
    unsetenv("LLMEM_VULKAN_ATTN_PF_PRECISE");
    unsetenv("LLMEM_VULKAN_ATTN_PF_FA");
    unsetenv("LLMEM_VULKAN_LOG");
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "log %s", path);
    char line[1024];
    bool has2 = false;
    *khr = false;
    while (fgets(line, sizeof line, f)) {
        *khr = *khr || strstr(line, "cooperative matrices on, KHR") != NULL;
        has2 = has2 || strstr(line, "coopmat2 on") != NULL;
    }
    if (cm2)
        *cm2 = has2;
    fclose(f);
    if (keep_log)
        strcpy(keep_log, path);
    else
        unlink(path);
    return be;
}

static llmem_backend *open_mode(const char *mode, const char *cm2_knob, const char *var,
                                bool precise, bool *khr, bool *cm2)
{
    return open_mode_log(mode, cm2_knob, var, precise, khr, cm2, NULL);
}

/* Whether the log at path holds a line containing what. */
static bool log_says(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "log %s", path);
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

/* The checks of the top on one module's output. */
static void pf_expect(const pf_data *d, float scale, bool precise, const double *out,
                      const double *model, const double *wv, const char *what)
{
    const pf_case *k = &d->k;
    int32_t hd = k->head_dim;
    int64_t n = (int64_t)d->n_tok * k->n_heads * hd;
    double u = precise ? ldexp(1.0, -20) : ldexp(1.0, -11);
    for (int64_t r = 0; r < (int64_t)d->n_tok * k->n_heads; r++) {
        double keys = d->tok_kv_len[r / k->n_heads], q1 = 0.0;
        for (int32_t e = 0; e < hd; e++) {
            double qs = (double)((float)d->q[r * hd + e] * scale);
            q1 += fabs(precise ? qs : ref64_round(qs, F16));
        }
        double bound_row = 2.0 * hd * ldexp(q1, -23) + keys * (ldexp(1.0, -23) + ldexp(1.0, -25));
        for (int32_t e = 0; e < hd; e++) {
            int64_t at = r * hd + e;
            double bound = u * wv[at] + bound_row;
            if (!(fabs(out[at] - model[at]) <= bound))
                ck_abort_msg("%s: element %lld is %.9g, model %.9g (bound %.3g), seed %llu", what,
                             (long long)at, out[at], model[at], bound,
                             (unsigned long long)ref64_seed());
        }
    }
    th_expect_close(out, model, n, precise ? ref64_tol(F32, false) : u, what);
}

START_TEST(test_attn_pf)
{
    bool khr = false, cm2 = false, unused = false;
    llmem_backend *emu = open_mode("3", "0", "0", false, &unused, NULL);
    llmem_backend *emu2 = open_mode("3", "1", "0", false, &unused, NULL);
    llmem_backend *real = open_mode("1", "0", "0", false, &khr, NULL);
    llmem_backend *real2 = open_mode("1", "1", "0", true, &unused, &cm2);
    llmem_backend *dec = open_mode("0", "0", "0", false, &unused, NULL);
    /* the same modules with LLMEM_VULKAN_ATTN_PF_VAR's exact bits (1 shifts for the pages, 2
     * O's rescale by 1 skipped, 256 the CM2 module's loops written out): the same bits as 0 */
    llmem_backend *emu_v = open_mode("3", "0", PF_VAR_EXACT, false, &unused, NULL);
    llmem_backend *emu2_v = open_mode("3", "1", PF_VAR_EXACT, false, &unused, NULL);
    llmem_backend *real_v = open_mode("1", "0", PF_VAR_EXACT, false, &unused, NULL);
    llmem_backend *real2_v = open_mode("1", "1", PF_VAR_EXACT, true, &unused, NULL);
    cm2 = cm2 && khr;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const pf_case *k = &cases[ci];
        th_ctx h;
        pf_data d;
        llmem_attn_params p;
        int64_t n = pf_begin(&h, k, 4100 + ci, &d, &p);
        double *out = th_vec(&h, n), *clean = th_vec(&h, n), *model = th_vec(&h, n);
        double *wv = th_vec(&h, n), *prec = th_vec(&h, n), *khr_out = th_vec(&h, n);
        double *exact = th_vec(&h, n), *wv_exact = th_vec(&h, n);
        pf_model(&d, &p, false, model, wv);
        pf_model(&d, &p, true, exact, wv_exact);
        llmem_attn_params pp = p;
        pp.fast = 0;
        pf_run(dec, &d, &pp, llmem_nan_pattern(k->dtype), prec);
        /* fast calls on EMU, EMU2, KHR, CM2; precise calls (f16 pools) on EMU2 and CM2 */
        llmem_backend *mods[6] = {emu,  emu2, khr ? real : NULL, cm2 ? real2 : NULL,
                                  k->dtype == F16 ? emu2 : NULL,
                                  k->dtype == F16 && cm2 ? real2 : NULL};
        llmem_backend *mods_v[6] = {emu_v, emu2_v, real_v, real2_v, emu2_v, real2_v};
        const char *names[6] = {"EMU", "EMU2", "KHR", "CM2", "EMU2 precise", "CM2 precise"};
        for (int m = 0; m < 6; m++) {
            if (!mods[m])
                continue;
            bool precise = m >= 4;
            const llmem_attn_params *pm = precise ? &pp : &p;
            char what[160];
            pf_run(mods[m], &d, pm, llmem_nan_pattern(k->dtype), out);
            pf_run(mods[m], &d, pm, 0u, clean);
            snprintf(what, sizeof what, "case %zu %s, NaN vs zero pools", ci, names[m]);
            th_expect_same_bytes(out, clean, (size_t)n * sizeof *out, what);
            snprintf(what, sizeof what, "case %zu %s (%s, ps %d, hd %d, %d/%d heads)", ci,
                     names[m], llmem_dtype_name(k->dtype), k->page_size, k->head_dim,
                     k->n_heads, k->n_kv_heads);
            pf_expect(&d, p.scale, precise, out, precise ? exact : model,
                      precise ? wv_exact : wv, what);
            snprintf(what, sizeof what, "case %zu %s against attention_decode", ci, names[m]);
            th_expect_close(out, prec, n, precise ? 2.0 * ref64_tol(F32, false) : 4.0 * ldexp(1.0, -11),
                            what);
            /* the module ran: attention_decode's result would be these very bits (and the
             * KHR module's, for CM2's fast calls) */
            ck_assert_msg(memcmp(out, prec, (size_t)n * sizeof *out) != 0,
                          "case %zu %s: the result is attention_decode's (the module did not run)",
                          ci, names[m]);
            pf_run(mods_v[m], &d, pm, llmem_nan_pattern(k->dtype), clean);
            snprintf(what, sizeof what, "case %zu %s, VAR %s vs 0", ci, names[m], PF_VAR_EXACT);
            th_expect_same_bytes(out, clean, (size_t)n * sizeof *out, what);
            if (m == 2)
                memcpy(khr_out, out, (size_t)n * sizeof *out);
            if (m == 3)
                ck_assert_msg(memcmp(out, khr_out, (size_t)n * sizeof *out) != 0,
                              "case %zu CM2: the result is the KHR module's (CM2 did not run)", ci);
        }
        th_end(&h);
    }
    /* calls outside the route keep attention_decode.comp, bit for bit: a decode batch (one
     * token a stream), a head dim of 80, an f32 pool */
    static const pf_case others[] = {
        {2, {40, 17}, {1, 1}, 16, 1, 4, 64, F16, 0.0f, 0, false},
        {1, {40}, {40}, 16, 1, 4, 80, F16, 0.0f, 0, false},
        {1, {40}, {40}, 16, 1, 4, 64, F32, 0.0f, 0, false},
    };
    for (size_t ci = 0; ci < sizeof others / sizeof others[0]; ci++) {
        const pf_case *k = &others[ci];
        th_ctx h;
        th_begin(&h, NULL);
        pf_data d;
        pf_make(&h, k, 4200 + ci, &d);
        llmem_attn_params p = {.scale = 1.0f / sqrtf((float)k->head_dim), .fast = 1};
        int64_t n = (int64_t)d.n_tok * k->n_heads * k->head_dim;
        double *out = th_vec(&h, n), *prec = th_vec(&h, n);
        pf_run(emu, &d, &p, 0u, out);
        pf_run(dec, &d, &p, 0u, prec);
        char what[96];
        snprintf(what, sizeof what, "outside the route, case %zu", ci);
        th_expect_same_bytes(out, prec, (size_t)n * sizeof *out, what);
        th_end(&h);
    }
    if (!khr)
        printf("test_vulkan_attn_pf: no KHR cooperative matrices here: the EMU modules only\n");
    else if (!cm2)
        printf("test_vulkan_attn_pf: no VK_NV_cooperative_matrix2 here: no CM2 module\n");
    llmem_backend_close(real2_v);
    llmem_backend_close(real_v);
    llmem_backend_close(emu2_v);
    llmem_backend_close(emu_v);
    llmem_backend_close(dec);
    llmem_backend_close(real2);
    llmem_backend_close(real);
    llmem_backend_close(emu2);
    llmem_backend_close(emu);
}
END_TEST

/* attention_prefill_fa.comp's cases: every stream's new tokens a multiple of 32 (the tiles of
 * 32, 64 or 128 tokens at GQA 4:1, 2:1, 1:1 on 256 invocations, half that on 128, each hold one
 * stream's tokens), after histories */
static const pf_case fa_cases[] = {
    /* GQA 4:1, hd 128, f16, pages of 16: chunks after histories, a whole prefill */
    {3, {100, 32, 160}, {64, 32, 96}, 16, 2, 8, 128, F16, 0.0f, 0, false},
    /* GQA 2:1, hd 128, bf16, pages of 1, a stream of 128 after 70 */
    {2, {198, 64}, {128, 64}, 1, 4, 8, 128, BF16, 0.0f, 0, false},
    /* GQA 4:1, hd 128, f16, pages of 64, window and softcap, page-table rows */
    {2, {233, 96}, {64, 96}, 64, 1, 4, 128, F16, 30.0f, 60, true},
    /* 1:1, hd 64 (the EMU module only), f16, pages of 64 */
    {2, {200, 128}, {128, 128}, 64, 2, 2, 64, F16, 0.0f, 0, false},
    /* GQA 4:1, hd 64 (the EMU module only: 64-key blocks on lavapipe), bf16, pages of 16,
     * window and softcap, page-table rows */
    {2, {233, 96}, {64, 96}, 16, 1, 4, 64, BF16, 30.0f, 60, true},
};

/* LLMEM_VULKAN_ATTN_PF_FA's variants: the module, + lazy rescale, + direct K / V loads, both;
 * + 64-key blocks, + the ring refilled in halves, both; V fetched after the softmax (32-key
 * blocks); 64-key blocks with O's loops written out, and with V late and the Q tile's loads
 * first too; direct loads, the ring in halves, V late, Q first and O's loops keep the bytes
 * of the variant without them (fa_same: the same arithmetic), the lazy rescale and 64-key
 * blocks (other reference maxima) keep the bound */
#define N_FA_VARIANTS 10
static const char *const fa_variants[N_FA_VARIANTS] = {"1",  "3",  "5",  "7",   "11",
                                                       "19", "27", "35", "139", "235"};
static const int fa_same[N_FA_VARIANTS] = {-1, -1, 0, 1, -1, 1, 4, 1, 4, 4};

START_TEST(test_attn_pf_fa)
{
    bool khr = false, cm2 = false, unused = false;
    char log_emu[N_FA_VARIANTS][64], log_real[N_FA_VARIANTS][64], log_other[64];
    llmem_backend *emu[N_FA_VARIANTS], *real[N_FA_VARIANTS];
    for (int vi = 0; vi < N_FA_VARIANTS; vi++) {
        bool cm2v = false;
        fa_knob = fa_variants[vi];
        emu[vi] = open_mode_log("3", "1", "0", false, &unused, NULL, log_emu[vi]);
        real[vi] = open_mode_log("1", "1", "0", false, &khr, &cm2v, log_real[vi]);
        cm2 = cm2v;
    }
    fa_knob = "1";
    llmem_backend *other = open_mode_log("3", "1", "0", false, &unused, NULL, log_other);
    llmem_backend *emu2 = open_mode("3", "1", "0", false, &unused, NULL);
    llmem_backend *dec = open_mode("0", "0", "0", false, &unused, NULL);
    cm2 = cm2 && khr;
    for (size_t ci = 0; ci < sizeof fa_cases / sizeof fa_cases[0]; ci++) {
        const pf_case *k = &fa_cases[ci];
        th_ctx h;
        pf_data d;
        llmem_attn_params p;
        int64_t n = pf_begin(&h, k, 4300 + ci, &d, &p);
        double *outs[N_FA_VARIANTS][2], *clean = th_vec(&h, n), *model = th_vec(&h, n);
        double *wv = th_vec(&h, n), *prec = th_vec(&h, n);
        pf_model(&d, &p, false, model, wv);
        llmem_attn_params pp = p;
        pp.fast = 0;
        pf_run(dec, &d, &pp, llmem_nan_pattern(k->dtype), prec);
        for (int vi = 0; vi < N_FA_VARIANTS; vi++) {
            llmem_backend *mods[2] = {emu[vi], cm2 && k->head_dim == 128 ? real[vi] : NULL};
            const char *names[2] = {"FA EMU", "FA"};
            for (int m = 0; m < 2; m++) {
                outs[vi][m] = NULL;
                if (!mods[m])
                    continue;
                char what[160];
                double *out = outs[vi][m] = th_vec(&h, n);
                pf_run(mods[m], &d, &p, llmem_nan_pattern(k->dtype), out);
                pf_run(mods[m], &d, &p, 0u, clean);
                snprintf(what, sizeof what, "case %zu %s _FA=%s, NaN vs zero pools", ci,
                         names[m], fa_variants[vi]);
                th_expect_same_bytes(out, clean, (size_t)n * sizeof *out, what);
                snprintf(what, sizeof what, "case %zu %s _FA=%s (%s, ps %d, hd %d, %d/%d heads)",
                         ci, names[m], fa_variants[vi], llmem_dtype_name(k->dtype), k->page_size,
                         k->head_dim, k->n_heads, k->n_kv_heads);
                pf_expect(&d, p.scale, false, out, model, wv, what);
                snprintf(what, sizeof what, "case %zu %s _FA=%s against attention_decode", ci,
                         names[m], fa_variants[vi]);
                th_expect_close(out, prec, n, 4.0 * ldexp(1.0, -11), what);
                if (fa_same[vi] >= 0) {
                    snprintf(what, sizeof what, "case %zu %s _FA=%s vs _FA=%s", ci, names[m],
                             fa_variants[vi], fa_variants[fa_same[vi]]);
                    th_expect_same_bytes(out, outs[fa_same[vi]][m], (size_t)n * sizeof *out,
                                         what);
                }
            }
        }
        th_end(&h);
    }
    for (int vi = 0; vi < N_FA_VARIANTS; vi++) {
        ck_assert_msg(log_says(log_emu[vi], "pipeline attention_prefill_fa_emu created"),
                      "the FA EMU module did not run (_FA=%s)", fa_variants[vi]);
        if (cm2)
            ck_assert_msg(log_says(log_real[vi], "pipeline attention_prefill_fa_khr created"),
                          "the FA module did not run (_FA=%s)", fa_variants[vi]);
    }
    /* tiles across streams (cases[1]: 100, 49 and 37 new tokens): the other modules */
    {
        th_ctx h;
        th_begin(&h, NULL);
        pf_data d;
        pf_make(&h, &cases[1], 4390, &d);
        llmem_attn_params p = {.scale = 1.0f / sqrtf(128.0f), .fast = 1};
        int64_t n = (int64_t)d.n_tok * cases[1].n_heads * cases[1].head_dim;
        double *out = th_vec(&h, n), *ref = th_vec(&h, n);
        pf_run(other, &d, &p, 0u, out);
        pf_run(emu2, &d, &p, 0u, ref);
        th_expect_same_bytes(out, ref, (size_t)n * sizeof *out, "tiles across streams");
        ck_assert_msg(!log_says(log_other, "attention_prefill_fa"),
                      "tiles across streams ran the FA module");
        th_end(&h);
    }
    if (!cm2)
        printf("test_vulkan_attn_pf: no VK_NV_cooperative_matrix2 here: the FA EMU module only\n");
    llmem_backend_close(dec);
    llmem_backend_close(emu2);
    llmem_backend_close(other);
    for (int vi = N_FA_VARIANTS - 1; vi >= 0; vi--) {
        llmem_backend_close(real[vi]);
        llmem_backend_close(emu[vi]);
        unlink(log_emu[vi]);
        unlink(log_real[vi]);
    }
    unlink(log_other);
}
END_TEST

int main(void)
{
    if (!vulkan_opens("test_vulkan_attn_pf", "nothing to run"))
        return 77;
    Suite *s = suite_create("vulkan_attn_pf");
    TCase *tc = tcase_create("attn_pf");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_attn_pf);
    tcase_add_test(tc, test_attn_pf_fa);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}

// ctest-labels: core
/* Op conformance suite, scaled 8-bit memories (issue 17): int8 and FP8 E4M3
 * KV pools with per-page, per-head scales, and int8 SSM states with a
 * per-head scale, on every backend in $LLMEM_TEST_BACKENDS.
 *
 * The expected values come from float64 computations written here, not
 * from the code under test: E4M3 codes are decoded by this file's own
 * formula (OCP FP8 spec v1.0: bias 7, 3 mantissa bits, no inf); a stored
 * value must lie within the rounding bound of its code grid (half a step
 * per quantization, summed over a requantization); attention and the scan
 * are compared with float64 references fed the dequantized pool/state
 * read back from the device.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/view.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define I8 LLMEM_DTYPE_I8
#define FP8 LLMEM_DTYPE_F8E4M3

/* ---- independent decoders --------------------------------------------------------------- */

/* E4M3 code -> value in float64 (NaN for 0x7f/0xff). */
static double e4m3_ref(unsigned c)
{
    int e = (int)((c >> 3) & 15), m = (int)(c & 7);
    double v = e == 15 && m == 7 ? NAN : e == 0 ? m / 512.0 : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (c & 0x80) ? -v : v;
}

static double code_value(unsigned char c, llmem_dtype t)
{
    return t == I8 ? (double)(signed char)c : e4m3_ref(c);
}

/* Half the code spacing around y = x / scale (in units of y). */
static double half_step(double y, llmem_dtype t)
{
    if (t == I8)
        return 0.5;
    double a = fabs(y);
    if (a < ldexp(1.0, -6))
        return ldexp(1.0, -10);
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 4);
}

START_TEST(test_e4m3_conversion)
{
    /* every code decodes to the spec's value */
    for (unsigned c = 0; c < 256; c++) {
        double want = e4m3_ref(c);
        float got = llmem_e4m3_to_f32((uint8_t)c);
        if (isnan(want))
            ck_assert(isnan(got));
        else
            ck_assert_msg((double)got == want, "code 0x%02x: %g, want %g", c, got, want);
    }
    /* encoding = the nearest finite code, ties to the even code, saturating */
    ref64_rng r = ref64_rng_make(ref64_seed(), 17);
    for (int i = 0; i < 200000; i++) {
        float x;
        if (i < 2048) /* every f32 midpoint region: k / 1024 steps around the grid */
            x = (float)((i - 1024) / 2.0 * ldexp(1.0, (i % 13) - 10));
        else
            x = (float)(ref64_uniform(&r, -1.0, 1.0) * ldexp(1.0, ref64_int(&r, -14, 10)));
        int best = -1;
        double bd = INFINITY;
        for (unsigned c = 0; c < 256; c++) {
            double v = e4m3_ref(c);
            if (isnan(v) || (v == 0.0 && c == 0x80))
                continue;
            double dd = fabs(v - (double)x);
            if (dd < bd || (dd == bd && (c & 1) == 0 && (best & 1) == 1)) {
                bd = dd;
                best = (int)c;
            }
        }
        if (fabs((double)x) > 448.0)
            best = x > 0 ? 0x7e : 0xfe;
        unsigned got = llmem_f32_to_e4m3(x);
        if (x == 0.0f || (best == 0 && signbit(x)))
            ck_assert_msg(got == 0 || got == 0x80, "x=%a -> 0x%02x", (double)x, got);
        else
            ck_assert_msg(got == (unsigned)best, "x=%a -> 0x%02x, want 0x%02x", (double)x, got,
                          best);
    }
    ck_assert_uint_eq(llmem_f32_to_e4m3(1e30f), 0x7e);
    ck_assert_uint_eq(llmem_f32_to_e4m3(-INFINITY), 0xfe);
    ck_assert(isnan(llmem_e4m3_to_f32(llmem_f32_to_e4m3(NAN))));
    /* int8: round half to even of x / scale, clamped */
    ck_assert_int_eq(llmem_f32_to_i8(2.5f, 1.0f), 2);
    ck_assert_int_eq(llmem_f32_to_i8(-3.5f, 1.0f), -4);
    ck_assert_int_eq(llmem_f32_to_i8(500.0f, 2.0f), 127);
    ck_assert_int_eq(llmem_f32_to_i8(-500.0f, 2.0f), -127);
    ck_assert_int_eq(llmem_f32_to_i8(1.0f, 0.0f), 0);
    ck_assert_int_eq(llmem_f32_to_i8(NAN, 1.0f), 0);
    llmem_dtype t;
    ck_assert_int_eq(llmem_dtype_parse("int8", &t), LLMEM_OK);
    ck_assert_int_eq(t, I8);
    ck_assert_int_eq(llmem_dtype_parse("fp8", &t), LLMEM_OK);
    ck_assert_int_eq(t, FP8);
    ck_assert_uint_eq(llmem_dtype_size(FP8), 1);
    /* layout: codes, scales at the next 16-byte boundary, padded to 16 */
    ck_assert_uint_eq(llmem_kv_scale_offset(I8, 3, 2, 4), 32);
    ck_assert_uint_eq(llmem_kv_page_bytes(I8, 3, 2, 4), 48);
    ck_assert_uint_eq(llmem_kv_page_bytes(LLMEM_DTYPE_BF16, 3, 2, 4), 48);
    llmem_state_desc d = {"ssm", 3, {3, 2, 2}, I8};
    ck_assert_uint_eq(llmem_state_scale_offset(&d), 16);
    ck_assert_uint_eq(llmem_state_slot_bytes(&d), 32);
}
END_TEST

/* ---- KV store + attention ----------------------------------------------------------------- */

#define PS 8
#define NKV 2
#define NH 4
#define HD 16
#define ROW (NKV * HD)
#define NPAGES 4

/* Two streams: stream 0 in page 2, stream 1 in pages 0 and 3; page 1 is
 * never written. Ubatch A writes stream 0 tokens 0..4 and stream 1 tokens
 * 0..9; ubatch B writes stream 0 tokens 5..7 with 4x larger values (page 2's
 * scale grows: requantization) and stream 1 tokens 10..11 with small values
 * (page 3's scale stays). */
static const int32_t pages0[] = {2}, pages1[] = {0, 3};

static int32_t slot_of(int32_t s, int32_t j)
{
    return (s == 0 ? pages0[j / PS] : pages1[j / PS]) * PS + j % PS;
}

typedef struct kv_model {
    double x[2][2][16][ROW];   /* [kv][stream][token][row] values stored */
    double bound[2][2][16][ROW];
    double amax[2][NPAGES][NKV];
    int32_t len[2];
} kv_model;

typedef struct ubatch_in {
    int32_t n_tok, n_store;
    int32_t tok_seq[16], store_tok[32], store_slot[32], tok_kv_len[16];
    double *k, *v; /* [n_tok][ROW] */
} ubatch_in;

/* Appends n tokens to each stream with values in [-amp, amp], entries in a
 * shuffled order; updates the model (values, amax per page/head). */
static void make_ubatch(ref64_rng *r, kv_model *m, const int32_t n[2], const double amp[2],
                        ubatch_in *u, th_ctx *h)
{
    u->n_tok = n[0] + n[1];
    u->k = th_vec(h, (int64_t)u->n_tok * ROW);
    u->v = th_vec(h, (int64_t)u->n_tok * ROW);
    int32_t t = 0;
    for (int32_t s = 0; s < 2; s++)
        for (int32_t i = 0; i < n[s]; i++, t++) {
            int32_t j = m->len[s]++;
            u->tok_seq[t] = s;
            u->tok_kv_len[t] = m->len[s];
            u->store_tok[t] = t;
            u->store_slot[t] = slot_of(s, j);
            for (int kvi = 0; kvi < 2; kvi++)
                for (int32_t e = 0; e < ROW; e++) {
                    double x = (double)(float)ref64_uniform(r, -amp[s], amp[s]);
                    (kvi ? u->v : u->k)[(int64_t)t * ROW + e] = x;
                    m->x[kvi][s][j][e] = x;
                }
        }
    u->n_store = t;
    /* shuffle the store entries (pages interleave) */
    for (int32_t i = t - 1; i > 0; i--) {
        int32_t k = ref64_int(r, 0, i);
        int32_t a = u->store_tok[i], b = u->store_slot[i];
        u->store_tok[i] = u->store_tok[k];
        u->store_slot[i] = u->store_slot[k];
        u->store_tok[k] = a;
        u->store_slot[k] = b;
    }
}

/* Runs kv_store of u then attention of u's tokens over pools kp/vp (host
 * images, updated); out [n_tok][NH][HD]. False when the backend (not cpu)
 * answers LLMEM_E_UNSUPPORTED (a backend without these kernels yet). */
static bool kv_step(llmem_backend *be, llmem_dtype dt, unsigned char *img[2], size_t pool_bytes,
                    const ubatch_in *u, const kv_model *m, const double *q, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_kv_view kvd = {0};
    llmem_kv_view *kv = &kvd;
    llmem_view view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->k = th_pool(&c, pool_bytes, dt);
    kv->v = th_pool(&c, pool_bytes, dt);
    ck_assert_int_eq(llmem_buffer_upload(kv->k, 0, img[0], pool_bytes), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(kv->v, 0, img[1], pool_bytes), LLMEM_OK);
    kv->dtype = dt;
    kv->n_pages = NPAGES;
    kv->page_size = PS;
    kv->n_kv_heads = NKV;
    kv->head_dim = HD;
    kv->max_pages = 2;
    int32_t pt[4] = {pages0[0], -1, pages1[0], pages1[1]};
    th_idx b = {0};
    kv->store_tok = th_idx_add(&b, u->store_tok, u->n_store);
    kv->store_slot = th_idx_add(&b, u->store_slot, u->n_store);
    kv->page_table = th_idx_add(&b, pt, 4);
    kv->seq_len = th_idx_add(&b, m->len, 2);
    kv->tok_kv_len = th_idx_add(&b, u->tok_kv_len, u->n_tok);
    kv->tok_seq = th_idx_add(&b, u->tok_seq, u->n_tok);
    llmem_i32_table *tabs[] = {&kv->store_tok, &kv->store_slot, &kv->page_table,
                               &kv->seq_len,   &kv->tok_kv_len, &kv->tok_seq};
    view.idx = th_idx_finish(&c, &b, tabs, 6);
    llmem_tensor qt = th_tensor(&c, F32, 3, u->n_tok, NH, HD);
    llmem_tensor kc = th_tensor(&c, F32, 3, u->n_tok, NKV, HD);
    llmem_tensor vc = th_tensor(&c, F32, 3, u->n_tok, NKV, HD);
    llmem_tensor o = th_tensor(&c, F32, 3, u->n_tok, NH, HD);
    th_set(&qt, q);
    th_set(&kc, u->k);
    th_set(&vc, u->v);
    llmem_status st = llmem_op_kv_store(be, &view, &kc, &vc);
    if (st == LLMEM_E_UNSUPPORTED && strcmp(llmem_backend_name(be), "cpu") != 0) {
        th_end(&c);
        return false;
    }
    ck_assert_int_eq(st, LLMEM_OK);
    llmem_attn_params p = {.scale = 0.25f};
    ck_assert_int_eq(llmem_op_attention_paged(be, &p, &view, &qt, &o), LLMEM_OK);
    th_get(&o, out);
    ck_assert_int_eq(llmem_buffer_download(kv->k, 0, img[0], pool_bytes), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download(kv->v, 0, img[1], pool_bytes), LLMEM_OK);
    th_end(&c);
    return true;
}

/* Checks the pool images against the model: scales, every stored value
 * within its bound, page 1 untouched; fills deq[kv][s][j][e] with the
 * dequantized values. */
static void check_pools(llmem_dtype dt, unsigned char *img[2], const unsigned char *fill,
                        size_t page_bytes, size_t scale_off, kv_model *m, double deq[2][2][16][ROW],
                        const char *what)
{
    double cmax = dt == I8 ? 127.0 : 448.0;
    th_expect_same_bytes(img[0] + page_bytes, fill + page_bytes, page_bytes, "page 1 of K");
    th_expect_same_bytes(img[1] + page_bytes, fill + page_bytes, page_bytes, "page 1 of V");
    for (int kvi = 0; kvi < 2; kvi++)
        for (int32_t s = 0; s < 2; s++)
            for (int32_t j = 0; j < m->len[s]; j++) {
                int32_t slot = slot_of(s, j), pg = slot / PS;
                const unsigned char *page = img[kvi] + (size_t)pg * page_bytes;
                for (int32_t g = 0; g < NKV; g++) {
                    float sc;
                    memcpy(&sc, page + scale_off + 4 * (size_t)g, 4);
                    double want = m->amax[kvi][pg][g] / cmax;
                    ck_assert_msg(fabs(sc - want) <= 1e-6 * want, "%s: scale of page %d head %d: %g, want %g",
                                  what, pg, g, (double)sc, want);
                    for (int32_t e = 0; e < HD; e++) {
                        unsigned char code = page[((size_t)(slot % PS) * NKV + g) * HD + e];
                        double v = code_value(code, dt) * (double)sc;
                        double x = m->x[kvi][s][j][g * HD + e];
                        double b = m->bound[kvi][s][j][g * HD + e] + 1e-6 * fabs(x);
                        ck_assert_msg(fabs(v - x) <= b, "%s: %s s%d j%d h%d e%d: %g, want %g +- %g",
                                      what, kvi ? "V" : "K", s, j, g, e, v, x, b);
                        deq[kvi][s][j][g * HD + e] = v;
                    }
                }
            }
}

/* Updates amax and bounds after a ubatch: a page whose scale grew
 * requantized its older rows (their bound adds half a step at the new
 * scale); new rows get half a step at the page's scale. */
static void model_commit(llmem_dtype dt, kv_model *m, const int32_t before[2])
{
    double cmax = dt == I8 ? 127.0 : 448.0;
    for (int kvi = 0; kvi < 2; kvi++) {
        double old[NPAGES][NKV];
        memcpy(old, m->amax[kvi], sizeof old);
        for (int32_t s = 0; s < 2; s++)
            for (int32_t j = before[s]; j < m->len[s]; j++)
                for (int32_t g = 0; g < NKV; g++)
                    for (int32_t e = 0; e < HD; e++) {
                        double *a = &m->amax[kvi][slot_of(s, j) / PS][g];
                        *a = fmax(*a, fabs(m->x[kvi][s][j][g * HD + e]));
                    }
        for (int32_t s = 0; s < 2; s++)
            for (int32_t j = 0; j < m->len[s]; j++)
                for (int32_t g = 0; g < NKV; g++) {
                    int32_t pg = slot_of(s, j) / PS;
                    double sc = m->amax[kvi][pg][g] / cmax;
                    bool fresh = j >= before[s];
                    if (!fresh && m->amax[kvi][pg][g] == old[pg][g])
                        continue;
                    for (int32_t e = 0; e < HD; e++) {
                        double x = m->x[kvi][s][j][g * HD + e];
                        double b = sc * half_step(x / sc, dt);
                        double *bd = &m->bound[kvi][s][j][g * HD + e];
                        *bd = fresh ? b : *bd + b;
                    }
                }
    }
}

static void attention_ref(const kv_model *m, double deq[2][2][16][ROW], const ubatch_in *u,
                          const double *q, double *ref)
{
    double kk[16 * HD], vv[16 * HD];
    for (int32_t i = 0; i < u->n_tok; i++) {
        int32_t s = u->tok_seq[i], n = u->tok_kv_len[i];
        for (int32_t h = 0; h < NH; h++) {
            int32_t g = h / (NH / NKV);
            for (int32_t j = 0; j < n; j++)
                for (int32_t e = 0; e < HD; e++) {
                    kk[j * HD + e] = deq[0][s][j][g * HD + e];
                    vv[j * HD + e] = deq[1][s][j][g * HD + e];
                }
            ref64_attention(q + ((int64_t)i * NH + h) * HD, kk, vv, n, HD, 0.25, 0.0,
                            ref + ((int64_t)i * NH + h) * HD);
        }
    }
    (void)m;
}

START_TEST(test_kv_scaled)
{
    llmem_backend *be = th_open(_i);
    /* another backend's pools are also compared with the cpu's, byte for
     * byte: the same f32 arithmetic gives the same codes (the fp8
     * conversion is bit-exact); only a division that is not correctly
     * rounded (allowed in Vulkan) may move a code by one step */
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (int di = 0; di < 2; di++) {
        llmem_dtype dt = di ? FP8 : I8;
        ref64_rng r = ref64_rng_make(ref64_seed(), 1700 + (uint64_t)di);
        th_ctx h;
        th_begin(&h, NULL);
        size_t page_bytes = llmem_kv_page_bytes(dt, PS, NKV, HD);
        size_t scale_off = llmem_kv_scale_offset(dt, PS, NKV, HD);
        size_t pool_bytes = page_bytes * NPAGES;
        unsigned char *fill = th_alloc(&h, pool_bytes);
        for (size_t i = 0; i < pool_bytes; i++)
            fill[i] = (unsigned char)(0x5a + i * 7); /* junk, scales included */
        unsigned char *img[2] = {th_alloc(&h, pool_bytes), th_alloc(&h, pool_bytes)};
        unsigned char *img_cpu[2] = {th_alloc(&h, pool_bytes), th_alloc(&h, pool_bytes)};
        memcpy(img[0], fill, pool_bytes);
        memcpy(img[1], fill, pool_bytes);
        memcpy(img_cpu[0], fill, pool_bytes);
        memcpy(img_cpu[1], fill, pool_bytes);
        kv_model *m = th_alloc(&h, sizeof *m);
        double (*deq)[2][16][ROW] = th_alloc(&h, sizeof(double) * 2 * 2 * 16 * ROW);
        const int32_t na[2] = {5, 10}, nb[2] = {3, 2};
        const double ampa[2] = {1.0, 2.0}, ampb[2] = {4.0, 0.25};
        for (int step = 0; step < 2; step++) {
            ubatch_in u;
            int32_t before[2] = {m->len[0], m->len[1]};
            make_ubatch(&r, m, step ? nb : na, step ? ampb : ampa, &u, &h);
            double *q = th_vec(&h, (int64_t)u.n_tok * NH * HD);
            ref64_fill(&r, q, (int64_t)u.n_tok * NH * HD, -1.0, 1.0, F32);
            double *out = th_vec(&h, (int64_t)u.n_tok * NH * HD);
            double *ref = th_vec(&h, (int64_t)u.n_tok * NH * HD);
            if (!kv_step(be, dt, img, pool_bytes, &u, m, q, out)) {
                printf("test_ops_quant: %s has no %s KV kernels (LLMEM_E_UNSUPPORTED), skipped\n",
                       th_backend_name(_i), llmem_dtype_name(dt));
                break;
            }
            if (cpu) {
                double *out_cpu = th_vec(&h, (int64_t)u.n_tok * NH * HD);
                ck_assert(kv_step(cpu, dt, img_cpu, pool_bytes, &u, m, q, out_cpu));
                size_t diff = 0, far = 0;
                for (int kvi = 0; kvi < 2; kvi++)
                    for (size_t i = 0; i < pool_bytes; i++) {
                        int a = img[kvi][i], b = img_cpu[kvi][i];
                        diff += a != b;
                        if (i % page_bytes >= scale_off) /* scales: compared via bounds */
                            continue;
                        far += abs(dt == I8 ? (signed char)a - (signed char)b : a - b) > 1;
                    }
                printf("test_ops_quant: %s %s ubatch %d: %zu of %zu pool bytes differ from cpu\n",
                       th_backend_name(_i), llmem_dtype_name(dt), step, diff, 2 * pool_bytes);
                if (strcmp(th_backend_name(_i), "cuda") == 0)
                    ck_assert_uint_eq(diff, 0);
                ck_assert_uint_le(far, 0);
            }
            model_commit(dt, m, before);
            char what[64];
            snprintf(what, sizeof what, "%s ubatch %d", llmem_dtype_name(dt), step);
            check_pools(dt, img, fill, page_bytes, scale_off, m, deq, what);
            attention_ref(m, deq, &u, q, ref);
            th_expect_close(out, ref, (int64_t)u.n_tok * NH * HD, 1e-5, what);
        }
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- int8 SSM state ------------------------------------------------------------------------ */

#define SH 2
#define SP 4
#define SN 8
#define SG 1
#define CONV (SH * SP + 2 * SG * SN)

/* Checks an int8 state slot against the float64 state S (SH x SP x SN):
 * per-head scale amax / 127, values within half a step; with `adopt`, S
 * becomes the stored (dequantized) state, where the next ubatch starts. */
static void check_i8_slot(const char *what, const unsigned char *slot, size_t soff, double *S,
                          bool adopt)
{
    for (int32_t hh = 0; hh < SH; hh++) {
        float sc;
        memcpy(&sc, slot + soff + 4 * (size_t)hh, 4);
        double amax = 0.0;
        for (int32_t e = 0; e < SP * SN; e++)
            amax = fmax(amax, fabs(S[hh * SP * SN + e]));
        ck_assert_msg(fabs(sc - amax / 127.0) <= 1e-4 * amax / 127.0, "%s: scale %g, want %g",
                      what, (double)sc, amax / 127.0);
        for (int32_t e = 0; e < SP * SN; e++) {
            int64_t k = hh * SP * SN + e;
            double got = (double)(signed char)slot[k] * (double)sc;
            ck_assert_msg(fabs(got - S[k]) <= 0.5 * sc + 1e-5 * amax, "%s: [%lld]: %g, want %g",
                          what, (long long)k, got, S[k]);
            if (adopt)
                S[k] = got;
        }
    }
}

/* Two sequences, two ubatches of 3 then 2 tokens: from the zero state into
 * slots 1 and 3 (and snapshots inside the ubatch into slots 2 and 0), then
 * from those into slots 3 and 0. */
START_TEST(test_ssm_i8)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 1717);
    th_ctx h;
    th_begin(&h, NULL);
    llmem_ssm_params p = {SH, SP, SN, SG, 0.0f, INFINITY, 0};
    llmem_state_desc d = {"ssm", 3, {SH, SP, SN}, I8};
    size_t slot_bytes = llmem_state_slot_bytes(&d), soff = llmem_state_scale_offset(&d);
    const int32_t n_slots = 4, E = SH * SP * SN;
    unsigned char *img = th_alloc(&h, slot_bytes * (size_t)n_slots);
    memset(img, 0x7f, slot_bytes * (size_t)n_slots);
    double a_log[SH], dd[SH], bias[SH];
    ref64_fill(&r, a_log, SH, -1.0, 0.5, F32);
    ref64_fill(&r, dd, SH, -1.0, 1.0, F32);
    ref64_fill(&r, bias, SH, -0.5, 0.5, F32);
    double S64[2][SH * SP * SN], snap64[2][SH * SP * SN];
    memset(S64, 0, sizeof S64);
    /* ubatch 1: sequence 0 writes slot 3, which sequence 1 reads
     * (copy-on-write order: every source is read before any write) */
    const int32_t ntok[2] = {3, 2}, src[2][2] = {{-1, -1}, {1, 3}}, dst[2][2] = {{1, 3}, {3, 0}};
    /* ubatch 0 also has snapshots inside the ubatch (llmem_rs_view.snap_tok /
     * snap_slot): sequence 0's state after its token 1 to slot 2, sequence
     * 1's after its token 0 to slot 0 */
    const int32_t snap_tok[2] = {1, 0}, snap_slot[2] = {2, 0};
    for (int step = 0; step < 2; step++) {
        int32_t T = 2 * ntok[step];
        double *xbc = th_vec(&h, (int64_t)T * CONV), *dtv = th_vec(&h, (int64_t)T * SH);
        ref64_fill(&r, xbc, (int64_t)T * CONV, -2.0, 2.0, F32);
        ref64_fill(&r, dtv, (int64_t)T * SH, -1.0, 1.0, F32);
        double *y = th_vec(&h, (int64_t)T * SH * SP), *ref = th_vec(&h, (int64_t)T * SH * SP);
        /* float64 reference from the states as stored (dequantized) */
        for (int32_t s = 0; s < 2; s++)
            for (int32_t t = 0; t < ntok[step]; t++) {
                int64_t tok = (int64_t)s * ntok[step] + t;
                ref64_ssm_token(S64[s], xbc + tok * CONV, dtv + tok * SH, a_log, dd, bias, &p,
                                ref + tok * SH * SP);
                if (step == 0 && t == snap_tok[s])
                    memcpy(snap64[s], S64[s], sizeof snap64[s]);
            }
        th_ctx c;
        th_begin(&c, be);
        llmem_rs_view rsd = {0};
        llmem_rs_view *v = &rsd;
        llmem_view view = llmem_view_make(LLMEM_VIEW_RECURRENT, v, sizeof *v, NULL);
        llmem_buffer *buf = th_pool(&c, slot_bytes * (size_t)n_slots, I8);
        ck_assert_int_eq(llmem_buffer_upload(buf, 0, img, slot_bytes * (size_t)n_slots), LLMEM_OK);
        v->n_states = 1;
        v->desc = &d;
        v->state = &buf;
        v->n_slots = n_slots;
        v->n_seqs = 2;
        v->n_seq_tokens = ntok[step];
        th_idx b = {0};
        v->src_slot = th_idx_add(&b, src[step], 2);
        v->dst_slot = th_idx_add(&b, dst[step], 2);
        v->ckpt_slot = th_idx_add(&b, NULL, 0);
        if (step == 0) {
            v->snap_tok = th_idx_add(&b, snap_tok, 2);
            v->snap_slot = th_idx_add(&b, snap_slot, 2);
        }
        llmem_i32_table *tabs[] = {&v->src_slot, &v->dst_slot, &v->ckpt_slot, &v->snap_tok,
                                   &v->snap_slot};
        view.idx = th_idx_finish(&c, &b, tabs, step == 0 ? 5 : 3);
        llmem_tensor xt = th_input(&c, F32, 2, T, CONV, 1, xbc);
        llmem_tensor dtt = th_input(&c, F32, 2, T, SH, 1, dtv);
        llmem_tensor at = th_input(&c, F32, 1, SH, 1, 1, a_log);
        llmem_tensor dt2 = th_input(&c, F32, 1, SH, 1, 1, dd);
        llmem_tensor bt = th_input(&c, F32, 1, SH, 1, 1, bias);
        llmem_tensor yt = th_tensor(&c, F32, 2, T, SH * SP, 1);
        llmem_status st = llmem_op_ssm_scan(be, &p, &view, 0, &xt, &dtt, &at, &dt2, &bt, &yt);
        if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(_i)) {
            printf("test_ops_quant: %s has no int8 state scan (LLMEM_E_UNSUPPORTED), skipped\n",
                   th_backend_name(_i));
            th_end(&c);
            break;
        }
        ck_assert_int_eq(st, LLMEM_OK);
        /* the conv op takes no int8 state */
        llmem_tensor w = th_tensor(&c, F32, 2, CONV, 4, 1);
        llmem_state_desc cd = {"conv", 2, {3, CONV}, I8};
        v->desc = &cd;
        ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, &xt, &w, NULL, &yt), LLMEM_E_INVALID);
        v->desc = &d;
        th_get(&yt, y);
        ck_assert_int_eq(llmem_buffer_download(buf, 0, img, slot_bytes * (size_t)n_slots), LLMEM_OK);
        th_end(&c);
        char what[48];
        snprintf(what, sizeof what, "int8 ssm_scan ubatch %d", step);
        th_expect_close(y, ref, (int64_t)T * SH * SP, 1e-5, what);
        /* stored states: per-head scale amax / 127, values within half a step */
        for (int32_t s = 0; s < 2; s++) {
            char sw[80];
            if (step == 0) {
                snprintf(sw, sizeof sw, "%s, snapshot of s%d", what, s);
                check_i8_slot(sw, img + (size_t)snap_slot[s] * slot_bytes, soff, snap64[s], false);
            }
            snprintf(sw, sizeof sw, "%s, state s%d", what, s);
            /* the next ubatch starts from what is stored */
            check_i8_slot(sw, img + (size_t)dst[step][s] * slot_bytes, soff, S64[s], true);
        }
        (void)E;
    }
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_quant: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_quant");
    TCase *tc = tcase_create("quant");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_e4m3_conversion);
    tcase_add_loop_test(tc, test_kv_scaled, 0, n);
    tcase_add_loop_test(tc, test_ssm_i8, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

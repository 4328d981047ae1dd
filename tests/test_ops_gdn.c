// ctest-labels: core
/* Op conformance suite, gated delta net: llmem_op_gdn with state slots,
 * checkpoints and rollback, in its recurrent (one token per group) and
 * chunked (prefill) forms, and llmem_op_sigmoid_mul (see test_ops.c for
 * the conventions).
 *
 * The reference is a float64 token-by-token recurrence written here from
 * the paper's rule (Yang, Kautz & Hatamizadeh 2024, eq. (10), with
 * transformers' Qwen3NextGatedDeltaNet conventions: q/k L2-normalized with
 * eps 1e-6, q scaled by 1/sqrt(d_k), beta = sigmoid(b), g = -exp(A_log) *
 * softplus(a + dt_bias)). Every backend, and both forms, is compared with
 * it. Views are built by hand: free slots hold NaN, sources may be -1,
 * the group's own dst, another group's dst (copy-on-write) or a
 * checkpoint; slots nobody writes must keep their bytes. A snapshot
 * inside the ubatch (snap_tok / snap_slot) is expected from the same
 * float64 pass, after its token.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/ops_gdn.h"
#include "support/ops_harness.h"
#include "support/ref64.h"
#include "support/rs_harness.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define MAXSLOTS 16

typedef struct gdn_in {
    llmem_gdn_params p;
    llmem_dtype pt; /* a_log, dt_bias dtype */
    const double *qkv, *a, *b, *a_log, *dt_bias;
} gdn_in;

static int64_t width_of(const llmem_gdn_params *p)
{
    return 2 * (int64_t)p->n_k_heads * p->d_k + (int64_t)p->n_v_heads * p->d_v;
}

static int64_t state_elems(const llmem_gdn_params *p)
{
    return (int64_t)p->n_v_heads * p->d_k * p->d_v;
}

/* One token of the float64 recurrence: S [H_v][d_k][d_v] updated in place,
 * out [H_v * d_v]. */
static void ref_token(const gdn_in *in, double *S, int64_t tok, double *out)
{
    const llmem_gdn_params *p = &in->p;
    int64_t dk = p->d_k, dv = p->d_v, Hk = p->n_k_heads, Hv = p->n_v_heads;
    const double *row = in->qkv + tok * width_of(p);
    double q[512], k[512], kv[512];
    for (int64_t h = 0; h < Hv; h++) {
        int64_t g = h / (Hv / Hk);
        double qq = 0, kk = 0;
        for (int64_t i = 0; i < dk; i++) {
            qq += row[g * dk + i] * row[g * dk + i];
            kk += row[Hk * dk + g * dk + i] * row[Hk * dk + g * dk + i];
        }
        for (int64_t i = 0; i < dk; i++) {
            q[i] = row[g * dk + i] / sqrt(qq + 1e-6) / sqrt((double)dk);
            k[i] = row[Hk * dk + g * dk + i] / sqrt(kk + 1e-6);
        }
        double beta = 1.0 / (1.0 + exp(-in->b[tok * Hv + h]));
        double lg = -exp(in->a_log[h]) * ref64_softplus(in->a[tok * Hv + h] + in->dt_bias[h]);
        double *Sh = S + h * dk * dv;
        const double *v = row + 2 * Hk * dk + h * dv;
        for (int64_t j = 0; j < dv; j++)
            kv[j] = 0;
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) {
                Sh[i * dv + j] *= exp(lg);
                kv[j] += Sh[i * dv + j] * k[i];
            }
        for (int64_t j = 0; j < dv; j++) {
            double d = beta * (v[j] - kv[j]), o = 0;
            for (int64_t i = 0; i < dk; i++) {
                Sh[i * dv + j] += k[i] * d;
                o += Sh[i * dv + j] * q[i];
            }
            out[h * dv + j] = o;
        }
    }
}

/* ---- the op on a backend ---------------------------------------------------------------- */

/* Runs the op on be: out [T, H_v * d_v] and the state image after. */
static llmem_status gdn_run(llmem_backend *be, const rs_setup *rs, const llmem_state_desc *d,
                            const gdn_in *in, const unsigned char *init, size_t bytes,
                            double *out, unsigned char *after)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_view view;
    llmem_buffer *buf;
    rs_build(&c, &view, th_alloc(&c, sizeof(llmem_rs_view)), rs, 1, d, &buf, &init);
    int32_t T = rs->n_seqs * rs->n_tok, Hv = in->p.n_v_heads;
    llmem_tensor qkv = th_input(&c, F32, 2, T, (int32_t)width_of(&in->p), 1, in->qkv);
    llmem_tensor a = th_input(&c, F32, 2, T, Hv, 1, in->a);
    llmem_tensor b = th_input(&c, F32, 2, T, Hv, 1, in->b);
    llmem_tensor al = th_input(&c, in->pt, 1, Hv, 1, 1, in->a_log);
    llmem_tensor db = th_input(&c, in->pt, 1, Hv, 1, 1, in->dt_bias);
    llmem_tensor o = th_tensor(&c, F32, 3, T, Hv, in->p.d_v);
    llmem_status st = llmem_op_gdn(be, &in->p, &view, 0, &qkv, &a, &b, &al, &db, &o);
    if (st == LLMEM_OK)
        th_get(&o, out);
    ck_assert_int_eq(llmem_buffer_download(buf, 0, after, bytes), LLMEM_OK);
    th_end(&c);
    return st;
}

static void gdn_inputs(th_ctx *h, ref64_rng *r, const llmem_gdn_params *p, llmem_dtype pt,
                       int64_t T, gdn_in *in)
{
    int64_t Hv = p->n_v_heads;
    double *qkv = th_vec(h, T * width_of(p)), *a = th_vec(h, T * Hv), *b = th_vec(h, T * Hv);
    double *al = th_vec(h, Hv), *db = th_vec(h, Hv);
    ref64_fill(r, qkv, T * width_of(p), -1, 1, F32);
    ref64_fill(r, a, T * Hv, -4, 2, F32);
    ref64_fill(r, b, T * Hv, -3, 3, F32);
    ref64_fill(r, al, Hv, -2, 1, pt);
    ref64_fill(r, db, Hv, -1, 1, pt);
    *in = (gdn_in){*p, pt, qkv, a, b, al, db};
}

/* The float64 expectation of a ubatch: outputs and every written slot. */
static void reference_ubatch(const rs_setup *rs, const gdn_in *in, const unsigned char *init,
                             llmem_dtype st, double *out, double *want, bool *written)
{
    int64_t e = state_elems(&in->p), ocols = (int64_t)in->p.n_v_heads * in->p.d_v;
    size_t es = llmem_dtype_size(st);
    double *S = malloc((size_t)e * sizeof *S);
    for (int32_t s = 0; s < rs->n_slots; s++)
        written[s] = false;
    for (int32_t s = 0; s < rs->n_seqs; s++) {
        for (int64_t i = 0; i < e; i++)
            S[i] = rs->src[s] >= 0 ? ref64_decode(init + (size_t)(rs->src[s] * e + i) * es, st) : 0;
        for (int32_t t = -1; t < rs->n_tok; t++) {
            if (t >= 0)
                ref_token(in, S, (int64_t)s * rs->n_tok + t, out + ((int64_t)s * rs->n_tok + t) * ocols);
            for (int32_t c = 0; c < rs->n_ckpt; c++) {
                int32_t slot = rs->ckpt[s * rs->n_ckpt + c];
                if (rs->n_tok - rs->n_ckpt + c == t && slot >= 0) {
                    memcpy(want + slot * e, S, (size_t)e * sizeof *S);
                    written[slot] = true;
                }
            }
            if (rs->snap && rs->snap_slot[s] >= 0 && rs->snap_tok[s] == t) {
                memcpy(want + rs->snap_slot[s] * e, S, (size_t)e * sizeof *S);
                written[rs->snap_slot[s]] = true;
            }
        }
        if (rs->dst[s] >= 0) {
            memcpy(want + rs->dst[s] * e, S, (size_t)e * sizeof *S);
            written[rs->dst[s]] = true;
        }
    }
    free(S);
}

static void check_slots(const rs_setup *rs, int64_t e, llmem_dtype st, const unsigned char *init,
                        const unsigned char *got, const double *want, const bool *written,
                        double tol, const char *what)
{
    size_t es = llmem_dtype_size(st);
    double *g = malloc((size_t)e * sizeof *g);
    char msg[160];
    for (int32_t s = 0; s < rs->n_slots; s++) {
        snprintf(msg, sizeof msg, "%s: slot %d", what, s);
        if (!written[s]) {
            th_expect_same_bytes(got + (size_t)(s * e) * es, init + (size_t)(s * e) * es,
                                 (size_t)e * es, msg);
            continue;
        }
        for (int64_t i = 0; i < e; i++)
            g[i] = ref64_decode(got + (size_t)(s * e + i) * es, st);
        th_expect_close(g, want + s * e, e, tol, msg);
    }
    free(g);
}

/* f32 math over up to a few hundred steps against float64: a few 1e-6
 * relative; 16-bit states: one rounding of the dtype. */
static double gdn_tol(llmem_dtype st)
{
    return st == F32 ? 2e-5 : ref64_tol(st, true);
}

/* ---- cases ------------------------------------------------------------------------------- */

typedef struct gdn_case {
    rs_setup rs;
    llmem_gdn_params p;
    llmem_dtype st, pt;
} gdn_case;

static const gdn_case cases[] = {
    /* decode (recurrent form): zero start, in place, reading group 0's dst
     * that group 0 overwrites (copy-on-write snapshot) */
    {{3, 1, 0, 8, {-1, 4, 1}, {1, 4, 7}, {0}}, {2, 4, 16, 16}, F32, F32},
    /* decode with checkpoints: before the token (the initial state) and after */
    {{2, 1, 2, 8, {0, 3}, {1, 4}, {2, 5, 6, -1}}, {1, 2, 8, 24}, F32, BF16},
    /* prefill, chunked: 150 tokens = two full chunks and a partial one */
    {{2, 150, 0, 4, {-1, 2}, {0, 2}, {0}}, {1, 2, 32, 24}, F32, F32},
    /* prefill with checkpoints: chunked for 67 tokens, recurrent tail of 3 */
    {{2, 70, 3, 10, {5, -1}, {0, 1}, {2, 3, 4, 6, 7, -1}}, {2, 4, 16, 16}, F32, F16},
    /* few tokens, equal head counts, wide values, f16 states */
    {{3, 5, 2, 12, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}}, {3, 3, 8, 40}, F16, F32},
    /* bf16 states, 64 tokens exactly (one chunk), one checkpoint equal to dst */
    {{1, 64, 1, 3, {1}, {2}, {2}}, {2, 6, 16, 8}, BF16, F32},
    /* snapshots inside the ubatch (snap_tok / snap_slot) beside checkpoints:
     * after token 0, the second-to-last token, none for group 1 */
    {{3, 5, 2, 14, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}, true, {0, 2, 3}, {10, -1, 12}},
     {3, 3, 8, 40}, F16, F32},
    /* chunked: group 0's snapshot mid-chunk (token 100), group 1's on a
     * chunk edge (token 63, the end of the first chunk) */
    {{2, 150, 0, 6, {-1, 2}, {0, 2}, {0}, true, {100, 63}, {4, 5}}, {1, 2, 32, 24}, F32, F32},
    /* chunked for 67 tokens then a recurrent tail of 3 (checkpoints): one
     * snapshot at the chunked part's last token (66), one in the tail (67) */
    {{2, 70, 3, 12, {5, -1}, {0, 1}, {2, 3, 4, 6, 7, -1}, true, {66, 67}, {9, 11}},
     {2, 4, 16, 16}, F32, F16},
    /* a snapshot one token into a chunk (token 64), bf16 states */
    {{1, 130, 0, 3, {1}, {2}, {0}, true, {64}, {0}}, {2, 6, 16, 8}, BF16, F32},
    /* Qwen3-Next's d_k 128 (the Vulkan module's written-out column, gdn.comp WO), a
     * partial second block of 64 columns */
    {{2, 3, 0, 4, {-1, 1}, {0, 2}, {0}}, {1, 2, 128, 72}, F32, F32},
    /* d_k 64 and 256 (the CUDA kernel's columns over 2 / 4 and 8 / 16
     * lanes), checkpoints, 16-bit states, d_k 72 inside the 128 columns */
    {{2, 4, 2, 8, {-1, 1}, {0, 2}, {3, 4, 5, 6}}, {2, 4, 64, 40}, BF16, F32},
    {{1, 3, 1, 3, {0}, {1}, {2}}, {1, 1, 256, 24}, F16, F32},
    {{1, 70, 0, 2, {0}, {1}, {0}}, {1, 2, 72, 20}, F32, F32},
};

START_TEST(test_gdn)
{
    llmem_backend *be = th_open(_i);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const gdn_case *k = &cases[ci];
        const rs_setup *rs = &k->rs;
        ref64_rng r = ref64_rng_make(ref64_seed(), 9100 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_state_desc d = {"delta", 3, {k->p.n_v_heads, k->p.d_k, k->p.d_v}, k->st};
        int64_t e = state_elems(&k->p), T = (int64_t)rs->n_seqs * rs->n_tok;
        int64_t no = T * k->p.n_v_heads * k->p.d_v;
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -0.5, 0.5);
        size_t bytes = (size_t)(e * rs->n_slots) * llmem_dtype_size(k->st);
        gdn_in in;
        gdn_inputs(&h, &r, &k->p, k->pt, T, &in);
        double *out = th_vec(&h, no), *ref = th_vec(&h, no), *want = th_vec(&h, e * rs->n_slots);
        unsigned char *after = th_alloc(&h, bytes + 4);
        bool written[MAXSLOTS];
        ck_assert_int_eq(gdn_run(be, rs, &d, &in, init, bytes, out, after), LLMEM_OK);
        reference_ubatch(rs, &in, init, k->st, ref, want, written);
        char what[96];
        snprintf(what, sizeof what, "gdn case %zu on %s", ci, th_backend_name(_i));
        th_expect_close(out, ref, no, 2e-5, what);
        check_slots(rs, e, k->st, init, after, want, written, gdn_tol(k->st), what);
        if (strcmp(th_backend_name(_i), "cuda") == 0) {
            /* the kernel of a column per thread ($LLMEM_CUDA_GDN_E=0, read again on
             * llmem_backend_reload_env) and
             * the split kernel's 16 rows per lane, beside the default's 32: other sums' orders,
             * each held to the float64 reference */
            static const char *const es[] = {"0", "16"};
            for (int ei = 0; ei < 2; ei++) {
                setenv("LLMEM_CUDA_GDN_E", es[ei], 1);
                ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
                llmem_status st = gdn_run(be, rs, &d, &in, init, bytes, out, after);
                unsetenv("LLMEM_CUDA_GDN_E");
                ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
                ck_assert_int_eq(st, LLMEM_OK);
                snprintf(what, sizeof what, "gdn case %zu on cuda, GDN_E=%s", ci, es[ei]);
                th_expect_close(out, ref, no, 2e-5, what);
                check_slots(rs, e, k->st, init, after, want, written, gdn_tol(k->st), what);
            }
        }
        if (strcmp(th_backend_name(_i), "vulkan") == 0) {
            /* gdn.comp's loops rolled ($LLMEM_VULKAN_GDN_WO=0), the default's written out: the
             * same operations in the same order, but the H200's driver contracts products and
             * sums into fma differently in the two (their bits differ there; lavapipe's are
             * the same), so each is held to the float64 reference */
            setenv("LLMEM_VULKAN_GDN_WO", "0", 1);
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
            ck_assert_int_eq(gdn_run(be, rs, &d, &in, init, bytes, out, after), LLMEM_OK);
            unsetenv("LLMEM_VULKAN_GDN_WO");
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
            snprintf(what, sizeof what, "gdn case %zu on vulkan, GDN_WO=0", ci);
            th_expect_close(out, ref, no, 2e-5, what);
            check_slots(rs, e, k->st, init, after, want, written, gdn_tol(k->st), what);
        }
        th_end(&h);
    }
    llmem_backend_close(be);
}
END_TEST

/* Speculative-decoding rollback: ubatch 1 runs 8 tokens per group with 3
 * checkpoints (chunked form then a recurrent tail); ubatch 2 resumes group
 * 0 from its checkpoint after token 5 (tokens 6, 7 rejected) and group 1
 * from its dst, one token each (recurrent form), then ubatch 3 runs 4
 * tokens more. Outputs are compared with each group's float64 history. */
START_TEST(test_gdn_rollback)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 9200);
    th_ctx h;
    th_begin(&h, NULL);
    llmem_gdn_params p = {2, 4, 16, 8};
    llmem_state_desc d = {"delta", 3, {4, 16, 8}, F32};
    enum { NS = 2, SLOTS = 10, HIST = 16 };
    int64_t W = width_of(&p), e = state_elems(&p), oc = 4 * 8;
    gdn_in hist; /* per group HIST tokens of inputs, group-major */
    gdn_inputs(&h, &r, &p, F32, NS * HIST, &hist);
    bool live[SLOTS] = {0};
    unsigned char *img = rs_state_image(&h, &r, &d, SLOTS, live, -0.5, 0.5);
    size_t bytes = (size_t)(e * SLOTS) * 4;
    /* group s's ubatch tokens start at history position start[u][s] */
    struct {
        rs_setup rs;
        int32_t start[NS];
    } ub[3] = {
        {{NS, 8, 3, SLOTS, {-1, -1}, {0, 1}, {2, 3, 4, 5, 6, 7}}, {0, 0}},
        {{NS, 1, 0, SLOTS, {2, 1}, {8, 1}, {0}}, {6, 8}},
        {{NS, 4, 0, SLOTS, {8, 1}, {8, 1}, {0}}, {7, 9}},
    };
    double *S = th_vec(&h, NS * e), *ro = th_vec(&h, oc);
    for (int u = 0; u < 3; u++) {
        const rs_setup *rs = &ub[u].rs;
        int32_t n = rs->n_tok;
        double *qkv = th_vec(&h, NS * n * W), *a = th_vec(&h, NS * n * 4), *b = th_vec(&h, NS * n * 4);
        for (int s = 0; s < NS; s++) {
            int64_t from = (int64_t)s * HIST + ub[u].start[s];
            memcpy(qkv + s * n * W, hist.qkv + from * W, sizeof(double) * (size_t)(n * W));
            memcpy(a + s * n * 4, hist.a + from * 4, sizeof(double) * (size_t)(n * 4));
            memcpy(b + s * n * 4, hist.b + from * 4, sizeof(double) * (size_t)(n * 4));
        }
        gdn_in in = {p, F32, qkv, a, b, hist.a_log, hist.dt_bias};
        double *out = th_vec(&h, NS * n * oc);
        unsigned char *after = th_alloc(&h, bytes + 4);
        ck_assert_int_eq(gdn_run(be, rs, &d, &in, img, bytes, out, after), LLMEM_OK);
        memcpy(img, after, bytes);
        /* float64: replay each group's history up to the ubatch's end */
        for (int s = 0; s < NS; s++) {
            memset(S, 0, sizeof(double) * (size_t)e);
            for (int32_t t = 0; t < ub[u].start[s] + n; t++) {
                ref_token(&hist, S, (int64_t)s * HIST + t, ro);
                if (t >= ub[u].start[s]) {
                    char what[96];
                    snprintf(what, sizeof what, "rollback ubatch %d group %d token %d on %s", u, s,
                             t, th_backend_name(_i));
                    th_expect_close(out + ((int64_t)s * n + t - ub[u].start[s]) * oc, ro, oc, 2e-5,
                                    what);
                }
            }
        }
    }
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

/* Bad arguments: a clear status and nothing written. */
START_TEST(test_gdn_args)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    ref64_rng r = ref64_rng_make(ref64_seed(), 9300);
    llmem_gdn_params p = {2, 4, 8, 8};
    llmem_state_desc d = {"delta", 3, {4, 8, 8}, F32};
    int64_t e = state_elems(&p);
    bool live[4] = {1, 1, 1, 1};
    const unsigned char *init = rs_state_image(&c, &r, &d, 4, live, -0.5, 0.5);
    size_t bytes = (size_t)(e * 4) * 4;
    rs_setup rs = {2, 2, 0, 4, {0, 1}, {2, 3}, {0}};
    llmem_view view;
    llmem_buffer *buf;
    rs_build(&c, &view, th_alloc(&c, sizeof(llmem_rs_view)), &rs, 1, &d, &buf, &init);
    int32_t W = (int32_t)width_of(&p);
    llmem_tensor qkv = th_tensor(&c, F32, 2, 4, W, 1), a = th_tensor(&c, F32, 2, 4, 4, 1);
    llmem_tensor b = th_tensor(&c, F32, 2, 4, 4, 1), al = th_tensor(&c, F32, 1, 4, 1, 1);
    llmem_tensor db = th_tensor(&c, F32, 1, 4, 1, 1), o = th_tensor(&c, F32, 2, 4, 32, 1);
    llmem_tensor bad_w = th_tensor(&c, F32, 2, 4, W - 1, 1), o3 = th_tensor(&c, F32, 2, 3, 32, 1);
    llmem_gdn_params odd = {3, 4, 8, 8}, wide = {2, 4, 8, 16};
    ck_assert_int_eq(llmem_op_gdn(be, &odd, &view, 0, &qkv, &a, &b, &al, &db, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, &wide, &view, 0, &qkv, &a, &b, &al, &db, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, &p, &view, 1, &qkv, &a, &b, &al, &db, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, &p, &view, 0, &bad_w, &a, &b, &al, &db, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, &p, &view, 0, &qkv, &a, &b, &al, &db, &o3), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, &p, &view, 0, &qkv, &a, &b, NULL, &db, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, &p, &view, 0, &qkv, &a, &b, &al, &db, &qkv), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_gdn(be, NULL, &view, 0, &qkv, &a, &b, &al, &db, &o), LLMEM_E_INVALID);
    th_expect_same_bytes(th_snapshot(&c, buf), init, bytes, "state after rejected calls");
    /* two groups writing one slot */
    rs_setup twice = {2, 2, 0, 4, {0, 1}, {2, 2}, {0}};
    llmem_view v2;
    llmem_buffer *buf2;
    rs_build(&c, &v2, th_alloc(&c, sizeof(llmem_rs_view)), &twice, 1, &d, &buf2, &init);
    ck_assert_int_eq(llmem_op_gdn(be, &p, &v2, 0, &qkv, &a, &b, &al, &db, &o), LLMEM_E_INVALID);
    th_expect_same_bytes(th_snapshot(&c, buf2), init, bytes, "state after a doubly written slot");
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_sigmoid_mul)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 9400);
    th_ctx c;
    th_begin(&c, be);
    const int32_t rows = 7, C = 96, cgs[] = {96, 1, 24};
    double *x = th_vec(&c, rows * C), *g = th_vec(&c, rows * C), *out = th_vec(&c, rows * C);
    double *ref = th_vec(&c, rows * C);
    ref64_fill(&r, x, rows * C, -3, 3, F32);
    ref64_fill(&r, g, rows * C, -8, 8, F32);
    for (int ci = 0; ci < 3; ci++) {
        int32_t Cg = cgs[ci];
        for (int32_t i = 0; i < rows; i++)
            for (int32_t j = 0; j < C; j++)
                ref[i * C + j] = x[i * C + j] / (1.0 + exp(-g[i * Cg + j / (C / Cg)]));
        llmem_tensor xt = th_input(&c, F32, 2, rows, C, 1, x);
        llmem_tensor gt = th_input(&c, F32, 2, rows, Cg, 1, g);
        llmem_tensor ot = th_tensor(&c, F32, 2, rows, C, 1);
        ck_assert_int_eq(llmem_op_sigmoid_mul(be, &xt, &gt, &ot), LLMEM_OK);
        th_get(&ot, out);
        th_expect_close(out, ref, rows * C, 3e-6, "sigmoid_mul");
        ck_assert_int_eq(llmem_op_sigmoid_mul(be, &xt, &gt, &xt), LLMEM_OK); /* in place */
        th_get(&xt, out);
        th_expect_close(out, ref, rows * C, 3e-6, "sigmoid_mul in place");
        ck_assert_int_eq(llmem_op_sigmoid_mul(be, &xt, &gt, &gt), LLMEM_E_INVALID);
    }
    llmem_tensor xt = th_tensor(&c, F32, 2, rows, C, 1), g5 = th_tensor(&c, F32, 2, rows, 5, 1);
    llmem_tensor g6 = th_tensor(&c, F32, 2, rows - 1, 1, 1);
    ck_assert_int_eq(llmem_op_sigmoid_mul(be, &xt, &g5, &xt), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_sigmoid_mul(be, &xt, &g6, &xt), LLMEM_E_INVALID);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_gdn: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_gdn");
    TCase *tc = tcase_create("gdn");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_gdn, 0, n);
    tcase_add_loop_test(tc, test_gdn_rollback, 0, n);
    tcase_add_loop_test(tc, test_gdn_args, 0, n);
    tcase_add_loop_test(tc, test_sigmoid_mul, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// ctest-labels: core
/* Op conformance suite, part 5: LFM2's gated short convolution
 * (llmem_op_short_conv) and the Mamba-1 selective scan (llmem_op_ssm_scan1),
 * with state slots and checkpoints (conventions of test_ops.c; the slot
 * helpers are support/rs_harness.h).
 *
 * References are float64 recurrences written here, one token at a time:
 * short conv from transformers Lfm2ShortConv (u = B * x; out = C *
 * conv1d(u), L taps, no activation), the scan from transformers
 * mamba_selective_scan's sequential loop (Gu & Dao 2023, Alg. 2). Views
 * are built by hand: free slots hold NaN; sources may be -1 (zeros), the
 * stream's own dst (in place), another stream's dst (copy-on-write) or a
 * checkpoint (rollback). Conv states are past u rows (rounded once to the
 * state dtype): their bytes must match the float64 reference rounded the
 * same way; ssm states within the dtype's threshold; slots nobody writes
 * keep their bytes. Cases with a snapshot inside the ubatch (snap_tok /
 * snap_slot) expect it from the same float64 pass (rs_reference_ubatch).
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/ops_ssm1.h"
#include "support/ops_harness.h"
#include "support/ref64.h"
#include "support/rs_harness.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16

/* ---- short conv ---------------------------------------------------------------------------- */

typedef struct sc_in {
    int32_t D, L;
    const double *bcx, *w, *b; /* bcx [T, 3D]; w [D, L]; b [D] or NULL */
} sc_in;

/* One token of LFM2's short conv in float64: state [L-1][D] of past u rows. */
static void sc_step(void *vctx, double *state, int32_t tok, double *out_row)
{
    const sc_in *in = vctx;
    int32_t D = in->D, L = in->L;
    const double *row = in->bcx + (int64_t)tok * 3 * D;
    for (int32_t c = 0; c < D; c++) {
        /* u is computed in f32 by the op (B * x rounded once) */
        double u = ref64_round(row[c] * row[2 * D + c], F32);
        double acc = in->b ? in->b[c] : 0.0;
        for (int32_t k = 0; k < L - 1; k++)
            acc += in->w[c * L + k] * state[k * D + c];
        acc += in->w[c * L + L - 1] * u;
        out_row[c] = row[D + c] * acc;
        for (int32_t k = 0; k + 1 < L - 1; k++)
            state[k * D + c] = state[(k + 1) * D + c];
        state[(L - 2) * D + c] = u;
    }
}

static void sc_run(llmem_backend *be, const rs_setup *rs, const llmem_state_desc *d,
                   const sc_in *in, llmem_dtype wt, const unsigned char *init, double *out,
                   unsigned char *state_after)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_view view;
    llmem_buffer *bufs[1];
    rs_build(&c, &view, th_alloc(&c, sizeof(llmem_rs_view)), rs, 1, d, bufs, &init);
    int32_t n_tok = rs->n_seqs * rs->n_tok;
    llmem_tensor bcx = th_tensor(&c, F32, 2, n_tok, 3 * in->D, 1);
    llmem_tensor w = th_tensor(&c, wt, 3, in->D, 1, in->L); /* HF layout [D, 1, L] */
    llmem_tensor b = th_tensor(&c, wt, 1, in->D, 1, 1);
    llmem_tensor o = th_tensor(&c, F32, 2, n_tok, in->D, 1);
    th_set(&bcx, in->bcx);
    th_set(&w, in->w);
    if (in->b)
        th_set(&b, in->b);
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &bcx, &w, in->b ? &b : NULL, &o), LLMEM_OK);
    th_get(&o, out);
    ck_assert_int_eq(llmem_buffer_download(bufs[0], 0, state_after, llmem_buffer_size(bufs[0])),
                     LLMEM_OK);
    th_end(&c);
}

typedef struct sc_case {
    rs_setup rs;
    int32_t D, L;
    llmem_dtype st, wt;
    bool bias;
} sc_case;

static const sc_case sc_cases[] = {
    /* decode step, f32, LFM2's L_cache 3 */
    {{1, 1, 0, 3, {2}, {2}, {0}}, 64, 3, F32, F32, false},
    /* zero start, in place, reading stream 0's dst (copy-on-write); 2 checkpoints */
    {{3, 5, 2, 12, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}}, 200, 3, F16, BF16, true},
    /* more checkpoints than tokens; the last equals dst; L = 2 (one state row) */
    {{2, 2, 4, 10, {3, 6}, {3, 5}, {-1, 0, 1, 3, -1, 6, 8, 9}}, 129, 2, BF16, F16, true},
    /* rollback from a checkpoint slot; L = 4; a long chunk */
    {{4, 7, 3, 16, {-1, 9, 2, 15}, {0, 1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -1}},
     96, 4, F32, F32, true},
    {{2, 40, 1, 4, {-1, 1}, {0, 1}, {2, 3}}, 33, 3, F32, BF16, false},
    /* snapshots inside the ubatch (snap_tok / snap_slot) beside checkpoints:
     * after token 0 (a window still holding source rows), after the
     * second-to-last token, none for stream 1 */
    {{3, 5, 2, 14, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}, true, {0, 2, 3}, {10, -1, 13}},
     200, 3, F16, BF16, true},
    /* L = 4 over two tokens: the only token a snapshot may follow */
    {{2, 2, 1, 8, {3, -1}, {3, 5}, {0, 1}, true, {0, 0}, {6, 7}}, 64, 4, BF16, F32, false},
    /* a long stream: snapshots mid-stream and one token before the end */
    {{2, 40, 1, 6, {-1, 1}, {0, 1}, {2, 3}, true, {17, 38}, {5, 4}}, 33, 3, F32, BF16, true},
};

START_TEST(test_short_conv)
{
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t ci = 0; ci < sizeof sc_cases / sizeof sc_cases[0]; ci++) {
        const sc_case *k = &sc_cases[ci];
        const rs_setup *rs = &k->rs;
        ref64_rng r = ref64_rng_make(ref64_seed(), 16000 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_state_desc d = {"conv", 2, {k->L - 1, k->D}, k->st};
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -2, 2);
        int64_t n_tok = (int64_t)rs->n_seqs * rs->n_tok;
        double *bcx = th_rand(&h, &r, n_tok * 3 * k->D, -2, 2, F32);
        double *w = th_rand(&h, &r, (int64_t)k->D * k->L, -1, 1, k->wt);
        double *b = th_rand(&h, &r, k->D, -0.5, 0.5, k->wt);
        sc_in in = {k->D, k->L, bcx, w, k->bias ? b : NULL};
        rs_case_bufs cb;
        rs_case_bufs_make(&h, rs, &d, n_tok * k->D, &cb);
        sc_run(be, rs, &d, &in, k->wt, init, cb.out, cb.after);
        rs_reference_ubatch(rs, &d, init, sc_step, &in, k->D, cb.ref, cb.want, cb.written);
        char what[64];
        snprintf(what, sizeof what, "short_conv case %zu", ci);
        /* against float64 always; against the CPU backend too on a device */
        th_expect_close(cb.out, cb.ref, n_tok * k->D, ref64_tol(F32, false), what);
        if (cpu) {
            sc_run(cpu, rs, &d, &in, k->wt, init, cb.ref_cpu, cb.after_cpu);
            th_expect_close(cb.out, cb.ref_cpu, n_tok * k->D, ref64_tol(F32, true), what);
        }
        /* conv states are u rows, each rounded once from f32: exact bytes */
        rs_check_slots(rs, &d, init, cb.after, cb.want, cb.written, true, cpu != NULL, what);
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- Mamba-1 scan ------------------------------------------------------------------------------ */

typedef struct s1_in {
    llmem_ssm1_params p;
    llmem_dtype pt; /* dtype of a_log, d, dt_bias */
    const double *x, *dt, *b, *c, *z, *a_log, *d, *dt_bias; /* z, d, dt_bias may be NULL */
} s1_in;

/* One token of the Mamba-1 recurrence in float64 (mamba_selective_scan). */
static void s1_step(void *vctx, double *S, int32_t tok, double *out_row)
{
    const s1_in *in = vctx;
    int32_t Din = in->p.d_inner, N = in->p.d_state;
    const double *B = in->b + (int64_t)tok * N, *C = in->c + (int64_t)tok * N;
    for (int32_t ch = 0; ch < Din; ch++) {
        double v = in->dt[(int64_t)tok * Din + ch] + (in->dt_bias ? in->dt_bias[ch] : 0.0);
        double dtv = v > 20.0 ? v : log1p(exp(v));
        double x = in->x[(int64_t)tok * Din + ch], acc = 0.0;
        for (int32_t n = 0; n < N; n++) {
            double A = -exp(in->a_log[(int64_t)ch * N + n]);
            double *s = &S[(int64_t)ch * N + n];
            *s = exp(dtv * A) * *s + dtv * B[n] * x;
            acc += *s * C[n];
        }
        double y = acc + (in->d ? in->d[ch] : 0.0) * x;
        if (in->z) {
            double z = in->z[(int64_t)tok * Din + ch];
            y *= z / (1.0 + exp(-z));
        }
        out_row[ch] = y;
    }
}

static void s1_run(llmem_backend *be, const rs_setup *rs, const llmem_state_desc *d,
                   const s1_in *in, const unsigned char *init, double *y,
                   unsigned char *state_after)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_view view;
    llmem_buffer *bufs[1];
    rs_build(&c, &view, th_alloc(&c, sizeof(llmem_rs_view)), rs, 1, d, bufs, &init);
    int32_t n_tok = rs->n_seqs * rs->n_tok, Din = in->p.d_inner, N = in->p.d_state;
    llmem_tensor x = th_tensor(&c, F32, 2, n_tok, Din, 1), dt = th_tensor(&c, F32, 2, n_tok, Din, 1);
    llmem_tensor bt = th_tensor(&c, F32, 2, n_tok, N, 1), ct = th_tensor(&c, F32, 2, n_tok, N, 1);
    llmem_tensor z = th_tensor(&c, F32, 2, n_tok, Din, 1), yt = th_tensor(&c, F32, 2, n_tok, Din, 1);
    llmem_tensor a = th_tensor(&c, in->pt, 2, Din, N, 1), dd = th_tensor(&c, in->pt, 1, Din, 1, 1);
    llmem_tensor bias = th_tensor(&c, in->pt, 1, Din, 1, 1);
    th_set(&x, in->x);
    th_set(&dt, in->dt);
    th_set(&bt, in->b);
    th_set(&ct, in->c);
    th_set(&a, in->a_log);
    if (in->z)
        th_set(&z, in->z);
    if (in->d)
        th_set(&dd, in->d);
    if (in->dt_bias)
        th_set(&bias, in->dt_bias);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &in->p, &view, 0, &x, &dt, &bt, &ct, &a,
                                        in->d ? &dd : NULL, in->dt_bias ? &bias : NULL,
                                        in->z ? &z : NULL, &yt),
                     LLMEM_OK);
    th_get(&yt, y);
    ck_assert_int_eq(llmem_buffer_download(bufs[0], 0, state_after, llmem_buffer_size(bufs[0])),
                     LLMEM_OK);
    th_end(&c);
}

typedef struct s1_case {
    rs_setup rs;
    llmem_ssm1_params p;
    llmem_dtype st, pt;
    bool has_z, has_d, has_bias;
} s1_case;

static const s1_case s1_cases[] = {
    /* Jamba's fixture sizes: d_inner 128, d_state 16; one decode step */
    {{1, 1, 0, 3, {2}, {2}, {0}}, {128, 16}, F32, F32, true, true, true},
    {{3, 5, 2, 12, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}}, {40, 16}, F32, BF16, true, true,
     true},
    {{2, 2, 4, 10, {3, 6}, {3, 5}, {-1, 0, 1, 3, -1, 6, 8, 9}}, {33, 7}, F16, F32, false, false,
     true},
    {{4, 3, 3, 16, {-1, 9, 2, 15}, {0, 1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -1}},
     {24, 64}, BF16, F16, true, true, false},
    /* a long prefill chunk: 128 steps of decay and accumulation */
    {{2, 128, 1, 5, {-1, 3}, {0, 3}, {1, 2}}, {16, 16}, F32, F32, true, true, true},
    /* snapshots inside the ubatch beside checkpoints: after token 0, after
     * the second-to-last token, none for stream 1 */
    {{3, 5, 2, 14, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}, true, {0, 1, 3}, {10, -1, 13}},
     {40, 16}, F32, BF16, true, true, true},
    /* 16-bit states, 2 columns a lane on cuda (d_state 40) */
    {{2, 4, 1, 7, {2, -1}, {2, 3}, {0, 1}, true, {1, 2}, {6, 4}}, {24, 40}, F16, F32, true,
     false, true},
    /* a long stream: snapshots at tokens 63 and 100 (a chunk edge and
     * mid-chunk for a 64-token chunking) */
    {{2, 128, 1, 7, {-1, 3}, {0, 3}, {1, 2}, true, {100, 63}, {4, 6}}, {16, 16}, BF16, F32, true,
     true, true},
};

START_TEST(test_ssm_scan1)
{
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t ci = 0; ci < sizeof s1_cases / sizeof s1_cases[0]; ci++) {
        const s1_case *k = &s1_cases[ci];
        const rs_setup *rs = &k->rs;
        ref64_rng r = ref64_rng_make(ref64_seed(), 17000 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        int32_t Din = k->p.d_inner, N = k->p.d_state;
        llmem_state_desc d = {"ssm", 2, {Din, N}, k->st};
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -1, 1);
        int64_t n_tok = (int64_t)rs->n_seqs * rs->n_tok;
        double *x = th_rand(&h, &r, n_tok * Din, -1, 1, F32);
        double *dt = th_rand(&h, &r, n_tok * Din, -5, 3, F32);
        double *z = th_rand(&h, &r, n_tok * Din, -3, 3, F32);
        double *b = th_rand(&h, &r, n_tok * N, -1, 1, F32);
        double *cc = th_rand(&h, &r, n_tok * N, -1, 1, F32);
        double *a = th_rand(&h, &r, (int64_t)Din * N, -1, 2, k->pt);
        double *dd = th_rand(&h, &r, Din, -1, 1, k->pt);
        double *bias = th_rand(&h, &r, Din, -2, 1, k->pt);
        s1_in in = {k->p, k->pt, x, dt, b, cc, k->has_z ? z : NULL, a, k->has_d ? dd : NULL,
                    k->has_bias ? bias : NULL};
        rs_case_bufs cb;
        rs_case_bufs_make(&h, rs, &d, n_tok * Din, &cb);
        s1_run(be, rs, &d, &in, init, cb.out, cb.after);
        rs_reference_ubatch(rs, &d, init, s1_step, &in, Din, cb.ref, cb.want, cb.written);
        char what[64];
        snprintf(what, sizeof what, "ssm_scan1 case %zu", ci);
        th_expect_close(cb.out, cb.ref, n_tok * Din, ref64_tol(F32, false), what);
        rs_check_slots(rs, &d, init, cb.after, cb.want, cb.written, false, false, what);
        if (cpu) {
            s1_run(cpu, rs, &d, &in, init, cb.ref_cpu, cb.after_cpu);
            th_expect_close(cb.out, cb.ref_cpu, n_tok * Din, ref64_tol(F32, true), what);
        }
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- two ubatches of a Jamba-like layer: conv + scan1, resuming from a checkpoint ---------- */

START_TEST(test_scan1_resume)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 18000);
    th_ctx h;
    th_begin(&h, NULL);
    enum { DIN = 24, N = 8, NS = 2, T1 = 6, T2 = 3, SLOTS = 8 };
    llmem_ssm1_params p = {DIN, N};
    llmem_state_desc d = {"ssm", 2, {DIN, N}, F32};
    int32_t total = T1 + T2;
    double *x = th_rand(&h, &r, (int64_t)NS * total * DIN, -1, 1, F32);
    double *dt = th_rand(&h, &r, (int64_t)NS * total * DIN, -4, 2, F32);
    double *b = th_rand(&h, &r, (int64_t)NS * total * N, -1, 1, F32);
    double *cc = th_rand(&h, &r, (int64_t)NS * total * N, -1, 1, F32);
    double *a = th_rand(&h, &r, DIN * N, -1, 1.5, F32), *dd = th_rand(&h, &r, DIN, -1, 1, F32);
    bool live[SLOTS] = {0};
    unsigned char *img = rs_state_image(&h, &r, &d, SLOTS, live, 0, 0);
    /* ubatch 1: tokens [0, T1) of both streams, 3 checkpoints each */
    double *u1x = th_alloc(&h, sizeof(double) * NS * T1 * DIN), *u1dt = th_alloc(&h, sizeof(double) * NS * T1 * DIN);
    double *u1b = th_alloc(&h, sizeof(double) * NS * T1 * N), *u1c = th_alloc(&h, sizeof(double) * NS * T1 * N);
    for (int s = 0; s < NS; s++) {
        memcpy(u1x + s * T1 * DIN, x + s * total * DIN, sizeof(double) * T1 * DIN);
        memcpy(u1dt + s * T1 * DIN, dt + s * total * DIN, sizeof(double) * T1 * DIN);
        memcpy(u1b + s * T1 * N, b + s * total * N, sizeof(double) * T1 * N);
        memcpy(u1c + s * T1 * N, cc + s * total * N, sizeof(double) * T1 * N);
    }
    rs_setup u1 = {NS, T1, 3, SLOTS, {-1, -1}, {0, 1}, {2, 3, 4, 5, 6, 7}};
    double *y1 = th_alloc(&h, sizeof(double) * NS * T1 * DIN);
    s1_in in = {p, F32, u1x, u1dt, u1b, u1c, NULL, a, dd, NULL};
    unsigned char *img2 = th_alloc(&h, (size_t)SLOTS * DIN * N * 4);
    s1_run(be, &u1, &d, &in, img, y1, img2);
    /* ubatch 2: stream 0 rolls back to its checkpoint after token 3 (slot 2)
     * and continues with tokens 4.. of its history; stream 1 from its dst */
    int32_t start[NS] = {T1 - 2, T1};
    double *u2x = th_alloc(&h, sizeof(double) * NS * T2 * DIN), *u2dt = th_alloc(&h, sizeof(double) * NS * T2 * DIN);
    double *u2b = th_alloc(&h, sizeof(double) * NS * T2 * N), *u2c = th_alloc(&h, sizeof(double) * NS * T2 * N);
    for (int s = 0; s < NS; s++) {
        memcpy(u2x + s * T2 * DIN, x + (s * total + start[s]) * DIN, sizeof(double) * T2 * DIN);
        memcpy(u2dt + s * T2 * DIN, dt + (s * total + start[s]) * DIN, sizeof(double) * T2 * DIN);
        memcpy(u2b + s * T2 * N, b + (s * total + start[s]) * N, sizeof(double) * T2 * N);
        memcpy(u2c + s * T2 * N, cc + (s * total + start[s]) * N, sizeof(double) * T2 * N);
    }
    rs_setup u2 = {NS, T2, 0, SLOTS, {2, 1}, {3, 1}, {0}};
    double *y2 = th_alloc(&h, sizeof(double) * NS * T2 * DIN);
    s1_in in2 = {p, F32, u2x, u2dt, u2b, u2c, NULL, a, dd, NULL};
    unsigned char *img3 = th_alloc(&h, (size_t)SLOTS * DIN * N * 4);
    s1_run(be, &u2, &d, &in2, img2, y2, img3);
    /* float64: each stream's own history in one pass */
    double *S = th_alloc(&h, sizeof(double) * DIN * N), *yr = th_alloc(&h, sizeof(double) * DIN);
    for (int s = 0; s < NS; s++) {
        memset(S, 0, sizeof(double) * DIN * N);
        s1_in hist = {p, F32, x + s * total * DIN, dt + s * total * DIN, b + s * total * N,
                      cc + s * total * N, NULL, a, dd, NULL};
        for (int32_t t = 0; t < start[s] + T2; t++) {
            s1_step(&hist, S, t, yr);
            if (t >= start[s])
                th_expect_close(y2 + (s * T2 + t - start[s]) * DIN, yr, DIN, ref64_tol(F32, false),
                                "scan1 ubatch 2 (resumed)");
            else if (t < T1)
                th_expect_close(y1 + (s * T1 + t) * DIN, yr, DIN, ref64_tol(F32, false),
                                "scan1 ubatch 1");
        }
    }
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

/* ---- argument checks ----------------------------------------------------------------------------- */

START_TEST(test_ssm1_args)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    enum { D = 8, L = 3, N = 4 };
    llmem_state_desc desc[2] = {{"conv", 2, {L - 1, D}, F32}, {"ssm", 2, {D, N}, F32}};
    unsigned char *img[2] = {th_alloc(&c, (size_t)((L - 1) * D * 4 * 6)),
                             th_alloc(&c, (size_t)(D * N * 4 * 6))};
    memset(img[0], 0, (size_t)((L - 1) * D * 4 * 6));
    memset(img[1], 0, (size_t)(D * N * 4 * 6));
    llmem_view view;
    llmem_buffer *bufs[2];
    const unsigned char *init[2] = {img[0], img[1]};
    rs_setup ok = {2, 2, 0, 6, {0, 1}, {2, 3}, {0}};
    rs_build(&c, &view, th_alloc(&c, sizeof(llmem_rs_view)), &ok, 2, desc, bufs, init);
    llmem_tensor bcx = th_tensor(&c, F32, 2, 4, 3 * D, 1), o = th_tensor(&c, F32, 2, 4, D, 1);
    llmem_tensor w = th_tensor(&c, F32, 2, D, L, 1), x = th_tensor(&c, F32, 2, 4, D, 1);
    llmem_tensor dt = th_tensor(&c, F32, 2, 4, D, 1), bt = th_tensor(&c, F32, 2, 4, N, 1);
    llmem_tensor ct = th_tensor(&c, F32, 2, 4, N, 1), a = th_tensor(&c, F32, 2, D, N, 1);
    llmem_tensor y = th_tensor(&c, F32, 2, 4, D, 1), w4 = th_tensor(&c, F32, 2, D, L + 1, 1);
    double zeros[4 * 3 * D] = {0};
    th_set(&bcx, zeros);
    th_set(&w, zeros);
    th_set(&x, zeros);
    th_set(&dt, zeros);
    th_set(&bt, zeros);
    th_set(&ct, zeros);
    th_set(&a, zeros);
    llmem_ssm1_params p = {D, N};
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &bcx, &w, NULL, &o), LLMEM_OK);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 1, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &y),
                     LLMEM_OK);
    /* wrong state for the op, wrong widths, overlaps, bad params, no A */
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 1, &bcx, &w, NULL, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &x, &w, NULL, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &bcx, &w4, NULL, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &bcx, &w, NULL, &bcx), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &bcx, &w, &o, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 0, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &y),
                     LLMEM_E_INVALID);
    llmem_ssm1_params bad = {D, N + 1};
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &bad, &view, 1, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &y),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, NULL, &view, 1, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &y),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 1, &x, &dt, &bt, &ct, NULL, NULL, NULL, NULL, &y),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 1, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &x),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 1, &x, &dt, &ct, &bt, &a, NULL, NULL, &y, &y),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 1, &x, &dt, &x, &ct, &a, NULL, NULL, NULL, &y),
                     LLMEM_E_INVALID);
    /* two streams writing one slot */
    rs_setup two = {2, 2, 0, 6, {0, 1}, {2, 2}, {0}};
    llmem_view v2;
    llmem_buffer *b2[2];
    rs_build(&c, &v2, th_alloc(&c, sizeof(llmem_rs_view)), &two, 2, desc, b2, init);
    ck_assert_int_eq(llmem_op_short_conv(be, &v2, 0, &bcx, &w, NULL, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &v2, 1, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &y),
                     LLMEM_E_INVALID);
    /* a snapshot inside the ubatch: after the last token, or into a dst slot */
    rs_setup late = {2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {1, 0}, {4, -1}};
    rs_setup onto = {2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {0, 0}, {3, -1}};
    const rs_setup *bad_snap[2] = {&late, &onto};
    for (int i = 0; i < 2; i++) {
        llmem_view v3;
        llmem_buffer *b3[2];
        rs_build(&c, &v3, th_alloc(&c, sizeof(llmem_rs_view)), bad_snap[i], 2, desc, b3, init);
        ck_assert_int_eq(llmem_op_short_conv(be, &v3, 0, &bcx, &w, NULL, &o), LLMEM_E_INVALID);
        ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &v3, 1, &x, &dt, &bt, &ct, &a, NULL, NULL,
                                            NULL, &y),
                         LLMEM_E_INVALID);
        th_expect_same_bytes(th_snapshot(&c, b3[0]), img[0], (size_t)((L - 1) * D * 4 * 6),
                             "conv state after a refused snapshot");
        th_expect_same_bytes(th_snapshot(&c, b3[1]), img[1], (size_t)(D * N * 4 * 6),
                             "ssm state after a refused snapshot");
    }
    /* the state buffers are untouched by the refused calls */
    th_expect_same_bytes(th_snapshot(&c, b2[0]), img[0], (size_t)((L - 1) * D * 4 * 6),
                         "conv state after refused calls");
    th_expect_same_bytes(th_snapshot(&c, b2[1]), img[1], (size_t)(D * N * 4 * 6),
                         "ssm state after refused calls");
    if (th_is_cpu(_i)) {
        /* the device copy disagrees with the host: the CPU kernel refuses */
        int32_t evil = 99;
        ck_assert_int_eq(llmem_buffer_upload(view.idx, llmem_view_rs(&view)->dst_slot.offset, &evil, 4), LLMEM_OK);
        ck_assert_int_eq(llmem_op_short_conv(be, &view, 0, &bcx, &w, NULL, &o), LLMEM_E_INVALID);
        ck_assert_int_eq(llmem_op_ssm_scan1(be, &p, &view, 1, &x, &dt, &bt, &ct, &a, NULL, NULL, NULL, &y),
                         LLMEM_E_INVALID);
    }
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_ssm1: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_ssm1");
    TCase *tc = tcase_create("ssm1");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_short_conv, 0, n);
    tcase_add_loop_test(tc, test_ssm_scan1, 0, n);
    tcase_add_loop_test(tc, test_scan1_resume, 0, n);
    tcase_add_loop_test(tc, test_ssm1_args, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

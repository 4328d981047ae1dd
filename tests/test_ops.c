// ctest-labels: core
/* Op conformance suite, part 1: dense and element-wise ops, norms, RoPE,
 * log_softmax/argmax, dtype conversions, copies and argument checks.
 * (Attention: test_ops_attention.c; Mamba-2: test_ops_mamba.c.)
 *
 * Every test runs once per backend that opens ($LLMEM_TEST_BACKENDS,
 * default "cpu,vulkan,cuda"). The cpu backend is compared with float64
 * references (tests/support/ref64.c); any other backend with the cpu
 * backend. Inputs are fresh random numbers from a printed seed
 * ($LLMEM_TEST_SEED repeats a run); outputs start as NaN, so an unwritten
 * element fails the NaN/inf check; guard bytes around every tensor catch
 * writes out of bounds (tests/support/ops_harness.c).
 */
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

static const llmem_dtype float_types[3] = {F32, F16, BF16};

static bool is_cpu(int i)
{
    return strcmp(th_backend_name(i), "cpu") == 0;
}

static double *vec(th_ctx *c, int64_t n)
{
    return th_alloc(c, (size_t)(n > 0 ? n : 1) * sizeof(double));
}

static llmem_tensor input(th_ctx *c, llmem_dtype t, int nd, int32_t n0, int32_t n1, int32_t n2,
                          const double *v)
{
    llmem_tensor x = th_tensor(c, t, nd, n0, n1, n2);
    th_set(&x, v);
    return x;
}

/* ---- matmul ------------------------------------------------------------------------------ */

static void run_matmul(llmem_backend *be, int32_t m, int32_t k, int32_t n, llmem_dtype wt,
                       const double *a, const double *w, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ta = input(&c, F32, 2, m, k, 1, a);
    llmem_tensor tw = input(&c, wt, 2, n, k, 1, w);
    llmem_tensor to = th_tensor(&c, F32, 2, m, n, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &ta, &tw, &to), LLMEM_OK);
    th_get(&to, out);
    th_end(&c);
}

START_TEST(test_matmul)
{
    static const int32_t shapes[][3] = {{1, 1, 1},   {1, 64, 33},  {3, 80, 17},  {7, 129, 65},
                                        {16, 128, 16}, {17, 257, 37}, {33, 64, 100}, {2, 7, 3}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = is_cpu(_i) ? NULL : th_open_cpu();
    for (int d = 0; d < 3; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
            ref64_rng r = ref64_rng_make(ref64_seed(), 100 + d * 16 + s);
            th_ctx h;
            th_begin(&h, NULL);
            double *a = vec(&h, (int64_t)m * k), *w = vec(&h, (int64_t)n * k);
            double *out = vec(&h, (int64_t)m * n), *ref = vec(&h, (int64_t)m * n);
            ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
            ref64_fill(&r, w, (int64_t)n * k, -1, 1, float_types[d]);
            run_matmul(be, m, k, n, float_types[d], a, w, out);
            if (cpu)
                run_matmul(cpu, m, k, n, float_types[d], a, w, ref);
            else
                ref64_matmul(a, w, m, k, n, ref);
            char what[96];
            snprintf(what, sizeof what, "matmul M=%d K=%d N=%d w=%s", m, k, n,
                     llmem_dtype_name(float_types[d]));
            th_expect_close(out, ref, (int64_t)m * n, ref64_tol(F32, cpu != NULL), what);
            th_end(&h);
        }
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* K = 0 gives zeros; M = 0 writes nothing and succeeds. */
START_TEST(test_matmul_degenerate)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor a = th_tensor(&c, F32, 2, 3, 0, 1), w = th_tensor(&c, F16, 2, 5, 0, 1);
    llmem_tensor o = th_tensor(&c, F32, 2, 3, 5, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &o), LLMEM_OK);
    double out[15];
    th_get(&o, out);
    for (int i = 0; i < 15; i++)
        ck_assert(out[i] == 0.0);
    llmem_tensor a0 = th_tensor(&c, F32, 2, 0, 8, 1), w0 = th_tensor(&c, F32, 2, 4, 8, 1);
    llmem_tensor o0 = th_tensor(&c, F32, 2, 0, 4, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &a0, &w0, &o0), LLMEM_OK);
    th_end(&c); /* guards: nothing written around the empty output */
    llmem_backend_close(be);
}
END_TEST

/* ---- get_rows ------------------------------------------------------------------------------ */

static llmem_status run_get_rows(llmem_backend *be, llmem_dtype t, int32_t rows, int32_t cols,
                                 int32_t n, const double *src, const int32_t *idx, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ts = input(&c, t, 2, rows, cols, 1, src);
    llmem_tensor ti = th_tensor(&c, I32, 1, n, 1, 1);
    th_set_i32(&ti, idx);
    llmem_tensor to = th_tensor(&c, F32, 2, n, cols, 1);
    llmem_status st = llmem_op_get_rows(be, &ts, &ti, &to);
    if (st == LLMEM_OK)
        th_get(&to, out);
    th_end(&c);
    return st;
}

START_TEST(test_get_rows)
{
    static const int32_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {50, 64, 17}, {9, 130, 9}};
    llmem_backend *be = th_open(_i);
    for (int d = 0; d < 3; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t rows = shapes[s][0], cols = shapes[s][1], n = shapes[s][2];
            ref64_rng r = ref64_rng_make(ref64_seed(), 200 + d * 16 + s);
            th_ctx h;
            th_begin(&h, NULL);
            double *src = vec(&h, (int64_t)rows * cols), *out = vec(&h, (int64_t)n * cols);
            double *ref = vec(&h, (int64_t)n * cols);
            int32_t *idx = th_alloc(&h, (size_t)n * sizeof *idx);
            ref64_fill(&r, src, (int64_t)rows * cols, -3, 3, float_types[d]);
            for (int32_t i = 0; i < n; i++) {
                idx[i] = ref64_int(&r, 0, rows - 1);
                memcpy(ref + (int64_t)i * cols, src + (int64_t)idx[i] * cols,
                       (size_t)cols * sizeof *ref);
            }
            ck_assert_int_eq(run_get_rows(be, float_types[d], rows, cols, n, src, idx, out),
                             LLMEM_OK);
            /* a lookup converts exactly: on every backend */
            th_expect_close(out, ref, (int64_t)n * cols, 0.0, "get_rows");
            th_end(&h);
        }
    }
    if (is_cpu(_i)) {
        double src[6] = {1, 2, 3, 4, 5, 6}, out[4];
        int32_t bad[2] = {0, 3};
        ck_assert_int_eq(run_get_rows(be, F32, 3, 2, 2, src, bad, out), LLMEM_E_INVALID);
        bad[1] = -1;
        ck_assert_int_eq(run_get_rows(be, F32, 3, 2, 2, src, bad, out), LLMEM_E_INVALID);
    }
    llmem_backend_close(be);
}
END_TEST

/* ---- element-wise ------------------------------------------------------------------------------ */

typedef enum ew_op { OP_ADD, OP_MUL, OP_SCALE, OP_SILU, OP_RELU2, OP_SOFTPLUS, OP_SWIGLU } ew_op;
static const char *const ew_names[] = {"add", "mul", "scale", "silu", "relu2", "softplus",
                                       "swiglu"};

/* mode 0: separate output; 1: in place on a; 2: in place on b */
static void run_ew(llmem_backend *be, ew_op op, int nd, const int32_t *ne, int64_t nb, int mode,
                   const double *a, const double *b, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ta = input(&c, F32, nd, ne[0], ne[1], ne[2], a);
    llmem_tensor tb = nb > 0 && nb != llmem_tensor_nelements(&ta)
                          ? input(&c, F32, 1, (int32_t)nb, 1, 1, b)
                          : input(&c, F32, nd, ne[0], ne[1], ne[2], b);
    llmem_tensor to = mode == 1 ? ta : mode == 2 ? tb : th_tensor(&c, F32, nd, ne[0], ne[1], ne[2]);
    llmem_status st = LLMEM_E_INVALID;
    switch (op) {
    case OP_ADD: st = llmem_op_add(be, &ta, &tb, &to); break;
    case OP_MUL: st = llmem_op_mul(be, &ta, &tb, &to); break;
    case OP_SCALE: st = llmem_op_scale(be, &ta, -0.375f, &to); break;
    case OP_SILU: st = llmem_op_silu(be, &ta, &to); break;
    case OP_RELU2: st = llmem_op_relu2(be, &ta, &to); break;
    case OP_SOFTPLUS: st = llmem_op_softplus(be, &ta, &to); break;
    case OP_SWIGLU: st = llmem_op_swiglu(be, &ta, &tb, &to); break;
    }
    ck_assert_int_eq(st, LLMEM_OK);
    th_get(&to, out);
    th_end(&c);
}

static double ew_ref(ew_op op, double a, double b)
{
    switch (op) {
    case OP_ADD: return a + b;
    case OP_MUL: return a * b;
    case OP_SCALE: return -0.375 * a;
    case OP_SILU: return ref64_silu(a);
    case OP_RELU2: return a > 0 ? a * a : 0.0;
    case OP_SOFTPLUS: return ref64_softplus(a);
    case OP_SWIGLU: return ref64_silu(a) * b;
    }
    return NAN;
}

START_TEST(test_elementwise)
{
    static const int32_t shapes[][4] = {{1, 1, 1, 1}, {1, 7, 1, 1}, {2, 3, 5, 1}, {1, 4097, 1, 1},
                                        {3, 2, 3, 67}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = is_cpu(_i) ? NULL : th_open_cpu();
    for (int op = OP_ADD; op <= OP_SWIGLU; op++) {
        bool binary = op == OP_ADD || op == OP_MUL || op == OP_SWIGLU;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int nd = shapes[s][0];
            const int32_t *ne = &shapes[s][1];
            int64_t n = (int64_t)ne[0] * ne[1] * ne[2], cols = ne[nd - 1];
            /* 0: same shape; 1: b broadcast as one row (add, mul) */
            for (int bc = 0; bc < (op == OP_ADD || op == OP_MUL ? 2 : 1); bc++) {
                for (int mode = 0; mode < (binary ? 3 : 2); mode++) {
                    if (bc && mode == 2)
                        continue; /* a row cannot hold the whole output */
                    ref64_rng r = ref64_rng_make(ref64_seed(), 300 + op * 64 + s * 8 + bc * 4 + mode);
                    th_ctx h;
                    th_begin(&h, NULL);
                    int64_t nb = bc ? cols : n;
                    double *a = vec(&h, n), *b = vec(&h, n), *out = vec(&h, n), *ref = vec(&h, n);
                    double lim = op == OP_SOFTPLUS || op == OP_SILU || op == OP_SWIGLU ? 30 : 3;
                    ref64_fill(&r, a, n, -lim, lim, F32);
                    ref64_fill(&r, b, nb, -2, 2, F32);
                    run_ew(be, (ew_op)op, nd, ne, bc ? nb : 0, mode, a, b, out);
                    if (cpu)
                        run_ew(cpu, (ew_op)op, nd, ne, bc ? nb : 0, mode, a, b, ref);
                    else
                        for (int64_t i = 0; i < n; i++)
                            ref[i] = ew_ref((ew_op)op, a[i], b[bc ? i % cols : i]);
                    char what[96];
                    snprintf(what, sizeof what, "%s n=%lld bcast=%d mode=%d", ew_names[op],
                             (long long)n, bc, mode);
                    th_expect_close(out, ref, n, ref64_tol(F32, cpu != NULL), what);
                    th_end(&h);
                }
            }
        }
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- norms -------------------------------------------------------------------------------------- */

/* wt < 0: no weight. gated: groups > 0. inplace: out = y. */
static void run_norm(llmem_backend *be, int32_t rows, int32_t d, int wt, int32_t groups,
                     bool inplace, const double *y, const double *z, const double *w, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ty = input(&c, F32, 2, rows, d, 1, y);
    llmem_tensor tw = wt >= 0 ? input(&c, (llmem_dtype)wt, 1, d, 1, 1, w) : ty;
    llmem_tensor to = inplace ? ty : th_tensor(&c, F32, 2, rows, d, 1);
    llmem_status st;
    if (groups > 0) {
        llmem_tensor tz = input(&c, F32, 2, rows, d, 1, z);
        st = llmem_op_rms_norm_gated(be, &ty, &tz, &tw, groups, 1e-5f, &to);
    } else {
        st = llmem_op_rms_norm(be, &ty, wt >= 0 ? &tw : NULL, 1e-6f, &to);
    }
    ck_assert_int_eq(st, LLMEM_OK);
    th_get(&to, out);
    th_end(&c);
}

START_TEST(test_rms_norm)
{
    /* rows, d, groups (0: plain rms_norm) */
    static const int32_t cases[][3] = {{1, 1, 0},  {3, 7, 0},  {5, 64, 0}, {2, 4096, 0},
                                       {1, 8, 1},  {3, 64, 2}, {2, 96, 8}, {4, 130, 5}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int32_t rows = cases[s][0], d = cases[s][1], g = cases[s][2];
        for (int wt = g > 0 ? 0 : -1; wt < 3; wt++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                ref64_rng r = ref64_rng_make(ref64_seed(), 400 + s * 16 + (wt + 1) * 2 + inplace);
                th_ctx h;
                th_begin(&h, NULL);
                int64_t n = (int64_t)rows * d;
                double *y = vec(&h, n), *z = vec(&h, n), *w = vec(&h, d);
                double *out = vec(&h, n), *ref = vec(&h, n);
                ref64_fill(&r, y, n, -2, 2, F32);
                ref64_fill(&r, z, n, -4, 4, F32);
                ref64_fill(&r, w, d, 0.5, 1.5, wt >= 0 ? float_types[wt] : F32);
                llmem_dtype wdt = wt >= 0 ? float_types[wt] : F32;
                run_norm(be, rows, d, wt >= 0 ? (int)wdt : -1, g, inplace, y, z, w, out);
                if (cpu)
                    run_norm(cpu, rows, d, wt >= 0 ? (int)wdt : -1, g, inplace, y, z, w, ref);
                else if (g > 0)
                    ref64_rms_norm_gated(y, z, w, rows, d, g, (double)1e-5f, ref);
                else
                    ref64_rms_norm(y, wt >= 0 ? w : NULL, rows, d, (double)1e-6f, ref);
                char what[96];
                snprintf(what, sizeof what, "rms_norm rows=%d d=%d groups=%d w=%d inplace=%d",
                         rows, d, g, wt, inplace);
                th_expect_close(out, ref, n, ref64_tol(F32, cpu != NULL), what);
                th_end(&h);
            }
        }
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- rope ------------------------------------------------------------------------------------------ */

static void run_rope(llmem_backend *be, const llmem_rope_params *p, int32_t t, int32_t nh,
                     int32_t hd, bool inplace, const double *x, const int32_t *pos, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor tx = input(&c, F32, 3, t, nh, hd, x);
    llmem_tensor tp = th_tensor(&c, I32, 1, t, 1, 1);
    th_set_i32(&tp, pos);
    llmem_tensor to = inplace ? tx : th_tensor(&c, F32, 3, t, nh, hd);
    ck_assert_int_eq(llmem_op_rope(be, p, &tx, &tp, &to), LLMEM_OK);
    th_get(&to, out);
    th_end(&c);
}

START_TEST(test_rope)
{
    /* tokens, heads, head_dim, n_rot */
    static const int32_t cases[][4] = {{1, 1, 64, 64}, {5, 3, 80, 40}, {7, 2, 128, 128},
                                       {3, 4, 64, 32}, {2, 1, 80, 2},  {9, 2, 128, 64}};
    static const float thetas[] = {10000.0f, 1e6f, 500000.0f};
    static const float scales[] = {1.0f, 0.25f, 1.0f};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int mode = 0; mode < 2; mode++) {
            int32_t t = cases[s][0], nh = cases[s][1], hd = cases[s][2];
            llmem_rope_params p = {mode ? LLMEM_ROPE_NEOX : LLMEM_ROPE_NORMAL, cases[s][3],
                                   thetas[s % 3], scales[s % 3]};
            ref64_rng r = ref64_rng_make(ref64_seed(), 500 + s * 4 + mode);
            th_ctx h;
            th_begin(&h, NULL);
            int64_t n = (int64_t)t * nh * hd;
            double *x = vec(&h, n), *out = vec(&h, n), *ref = vec(&h, n);
            int32_t *pos = th_alloc(&h, (size_t)t * sizeof *pos);
            ref64_fill(&r, x, n, -1, 1, F32);
            for (int32_t i = 0; i < t; i++)
                pos[i] = i == 0 ? 0 : ref64_int(&r, -64, 65536);
            bool inplace = (s + mode) % 2;
            run_rope(be, &p, t, nh, hd, inplace, x, pos, out);
            if (cpu)
                run_rope(cpu, &p, t, nh, hd, inplace, x, pos, ref);
            else
                for (int64_t row = 0; row < (int64_t)t * nh; row++)
                    ref64_rope(&p, hd, pos[row / nh], x + row * hd, ref + row * hd);
            char what[96];
            snprintf(what, sizeof what, "rope %s T=%d H=%d hd=%d n_rot=%d",
                     mode ? "neox" : "normal", t, nh, hd, p.n_rot);
            /* Devices may form angles in f32: at positions near 2^16 that is
             * an error of ~4e-3 rad, hence the wider bound against cpu. */
            th_expect_close(out, ref, n, cpu ? 5e-3 : ref64_tol(F32, false), what);
            th_end(&h);
        }
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- log_softmax, argmax ------------------------------------------------------------------------------ */

START_TEST(test_log_softmax)
{
    static const int32_t cases[][2] = {{1, 1}, {3, 7}, {2, 1000}, {1, 32003}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            int32_t rows = cases[s][0], v = cases[s][1];
            int64_t n = (int64_t)rows * v;
            ref64_rng r = ref64_rng_make(ref64_seed(), 600 + s * 2 + inplace);
            th_ctx h;
            th_begin(&h, NULL);
            double *x = vec(&h, n), *out = vec(&h, n), *ref = vec(&h, n);
            ref64_fill(&r, x, n, -20, 20, F32);
            for (int pass = 0; pass < (cpu ? 2 : 1); pass++) {
                llmem_backend *b = pass ? cpu : be;
                th_ctx c;
                th_begin(&c, b);
                llmem_tensor tx = input(&c, F32, 2, rows, v, 1, x);
                llmem_tensor to = inplace ? tx : th_tensor(&c, F32, 2, rows, v, 1);
                ck_assert_int_eq(llmem_op_log_softmax(b, &tx, &to), LLMEM_OK);
                th_get(&to, pass ? ref : out);
                th_end(&c);
            }
            if (!cpu)
                for (int32_t i = 0; i < rows; i++)
                    ref64_log_softmax(x + (int64_t)i * v, v, ref + (int64_t)i * v);
            char what[64];
            snprintf(what, sizeof what, "log_softmax rows=%d V=%d", rows, v);
            th_expect_close(out, ref, n, ref64_tol(F32, cpu != NULL), what);
            th_end(&h);
        }
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_argmax)
{
    static const int32_t cases[][2] = {{1, 1}, {4, 7}, {3, 1000}, {2, 32003}, {5, 3}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int32_t rows = cases[s][0], v = cases[s][1];
        int64_t n = (int64_t)rows * v;
        ref64_rng r = ref64_rng_make(ref64_seed(), 700 + s);
        th_ctx c;
        th_begin(&c, be);
        double *x = vec(&c, n);
        int32_t *out = th_alloc(&c, (size_t)rows * sizeof *out);
        int32_t *ref = th_alloc(&c, (size_t)rows * sizeof *ref);
        ref64_fill(&r, x, n, -5, 5, F32);
        for (int32_t i = 0; i < rows; i++) {
            double *row = x + (int64_t)i * v;
            /* plant a tie (the first must win) and NaNs (ignored) */
            if (v > 2) {
                int32_t a = ref64_int(&r, 0, v - 2), b = ref64_int(&r, a + 1, v - 1);
                row[a] = row[b] = 6.0;
                row[ref64_int(&r, 0, v - 1)] = NAN;
            }
            if (i == 4) /* the last case has an all-NaN row */
                for (int32_t j = 0; j < v; j++)
                    row[j] = NAN;
            int32_t best = -1;
            for (int32_t j = 0; j < v; j++)
                if (!isnan(row[j]) && (best < 0 || row[j] > row[best]))
                    best = j;
            ref[i] = best < 0 ? 0 : best;
        }
        llmem_tensor tx = input(&c, F32, 2, rows, v, 1, x);
        llmem_tensor to = th_tensor(&c, I32, 1, rows, 1, 1);
        ck_assert_int_eq(llmem_op_argmax(be, &tx, &to), LLMEM_OK);
        th_get_i32(&to, out);
        for (int32_t i = 0; i < rows; i++)
            ck_assert_msg(out[i] == ref[i], "argmax row %d of %dx%d: %d, want %d, seed %llu", i,
                          rows, v, out[i], ref[i], (unsigned long long)ref64_seed());
        th_end(&c);
    }
    llmem_backend_close(be);
}
END_TEST

/* ---- conversions and copies ---------------------------------------------------------------------------- */

/* Values that stress round-to-nearest-even in f16 and bf16: exact halfway
 * points (odd and even neighbours), subnormals, the overflow edge. */
static int32_t special_values(ref64_rng *r, double *v, int32_t cap)
{
    int32_t n = 0;
    static const double fixed[] = {0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0,
                                   1e-8, -3e-8, 5.96e-8, 2.98e-8, 2.9802322387695312e-08,
                                   6.103515625e-05, 6.1e-05, 3.0e38, 1e-40, -1e-42, 1e5, 0.1};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && n < cap; i++)
        v[n++] = ref64_round(fixed[i], F32);
    while (n + 4 <= cap) {
        /* halfway between neighbours of f16 / bf16, at a random exponent */
        int e16 = ref64_int(r, -24, 15), e16m = ref64_int(r, 0, 1023);
        double q16 = ldexp(1.0, e16 < -14 ? -24 : e16 - 10);
        double base16 = e16 < -14 ? e16m * q16 : ldexp(1.0 + e16m / 1024.0, e16);
        v[n++] = base16 + q16 / 2;
        int eb = ref64_int(r, -133, 127), ebm = ref64_int(r, 0, 127);
        double qb = ldexp(1.0, eb < -126 ? -133 : eb - 7);
        double baseb = eb < -126 ? ebm * qb : ldexp(1.0 + ebm / 128.0, eb);
        v[n++] = ref64_round(baseb + qb / 2, F32);
        v[n++] = ref64_round(ref64_uniform(r, -70000, 70000), F32);
        v[n++] = ref64_round(ldexp(ref64_uniform(r, -1, 1), ref64_int(r, -30, 20)), F32);
    }
    return n;
}

START_TEST(test_convert_exact)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 800);
    th_ctx c;
    th_begin(&c, be);
    /* f32 -> f16, bf16: every output equals the independent rounding */
    enum { NV = 4096 };
    double *v = vec(&c, NV), *out = vec(&c, NV);
    int32_t n = special_values(&r, v, NV);
    llmem_tensor src = input(&c, F32, 2, 1, n, 1, v);
    for (int d = 1; d < 3; d++) {
        llmem_tensor dst = th_tensor(&c, float_types[d], 2, 1, n, 1);
        ck_assert_int_eq(llmem_op_copy(be, &src, 0, &dst), LLMEM_OK);
        th_get(&dst, out);
        for (int32_t i = 0; i < n; i++) {
            double want = ref64_round(v[i], float_types[d]);
            ck_assert_msg(out[i] == want || (isnan(out[i]) && isnan(want)),
                          "f32 %.17g -> %s: %.17g, want %.17g", v[i],
                          llmem_dtype_name(float_types[d]), out[i], want);
        }
    }
    /* f16, bf16 -> f32: all 65536 encodings, NaN stays NaN, inf stays inf */
    uint16_t *bits = th_alloc(&c, 65536 * sizeof *bits);
    double *wide = vec(&c, 65536);
    for (uint32_t i = 0; i < 65536; i++)
        bits[i] = (uint16_t)i;
    for (int d = 1; d < 3; d++) {
        llmem_tensor s16 = th_tensor(&c, float_types[d], 2, 1, 65536, 1);
        ck_assert_int_eq(llmem_buffer_upload(s16.buf, s16.offset, bits, 65536 * 2), LLMEM_OK);
        llmem_tensor d32 = th_tensor(&c, F32, 2, 1, 65536, 1);
        ck_assert_int_eq(llmem_op_copy(be, &s16, 0, &d32), LLMEM_OK);
        th_get(&d32, wide);
        for (uint32_t i = 0; i < 65536; i++) {
            double want = ref64_decode(&bits[i], float_types[d]);
            ck_assert_msg(wide[i] == want || (isnan(wide[i]) && isnan(want)),
                          "%s 0x%04x -> f32: %.17g, want %.17g", llmem_dtype_name(float_types[d]),
                          i, wide[i], want);
        }
    }
    /* f32 NaN -> 16-bit NaN */
    double nan_in = NAN;
    llmem_tensor snan = input(&c, F32, 1, 1, 1, 1, &nan_in);
    for (int d = 1; d < 3; d++) {
        llmem_tensor dnan = th_tensor(&c, float_types[d], 1, 1, 1, 1);
        ck_assert_int_eq(llmem_op_copy(be, &snan, 0, &dnan), LLMEM_OK);
        double o;
        th_get(&dnan, &o);
        ck_assert(isnan(o));
    }
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_copy)
{
    /* rows, src cols, dst cols, col0 */
    static const int32_t cases[][4] = {{1, 1, 1, 0}, {3, 7, 5, 2}, {4, 300, 257, 43}, {2, 64, 64, 0}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int sd = 0; sd < 3; sd++) {
            for (int dd = 0; dd < 3; dd++) {
                int32_t rows = cases[s][0], sc = cases[s][1], dc = cases[s][2], c0 = cases[s][3];
                ref64_rng r = ref64_rng_make(ref64_seed(), 900 + s * 16 + sd * 4 + dd);
                th_ctx c;
                th_begin(&c, be);
                double *src = vec(&c, (int64_t)rows * sc), *out = vec(&c, (int64_t)rows * dc);
                double *ref = vec(&c, (int64_t)rows * dc);
                ref64_fill(&r, src, (int64_t)rows * sc, -4, 4, float_types[sd]);
                for (int32_t i = 0; i < rows; i++)
                    for (int32_t j = 0; j < dc; j++)
                        ref[(int64_t)i * dc + j] =
                            ref64_round(src[(int64_t)i * sc + c0 + j], float_types[dd]);
                llmem_tensor ts = input(&c, float_types[sd], 2, rows, sc, 1, src);
                llmem_tensor td = th_tensor(&c, float_types[dd], 2, rows, dc, 1);
                ck_assert_int_eq(llmem_op_copy(be, &ts, c0, &td), LLMEM_OK);
                th_get(&td, out);
                th_expect_close(out, ref, (int64_t)rows * dc, 0.0, "copy");
                th_end(&c);
            }
        }
    }
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_copy_blocks)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 1000);
    th_ctx c;
    th_begin(&c, be);
    enum { BLOCK = 96, NBLK = 10 };
    unsigned char *data = th_alloc(&c, BLOCK * NBLK);
    for (int i = 0; i < BLOCK * NBLK; i++)
        data[i] = (unsigned char)ref64_next(&r);
    llmem_buffer *buf = th_pool(&c, BLOCK * NBLK, F32);
    ck_assert_int_eq(llmem_buffer_upload(buf, 0, data, BLOCK * NBLK), LLMEM_OK);
    int32_t src[3] = {0, 7, 3}, dst[3] = {9, 2, 4};
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 3, src, dst), LLMEM_OK);
    unsigned char *got = th_snapshot(&c, buf);
    for (int b = 0; b < NBLK; b++) {
        int from = b;
        for (int j = 0; j < 3; j++)
            if (dst[j] == b)
                from = src[j];
        th_expect_same_bytes(got + b * BLOCK, data + from * BLOCK, BLOCK, "copy_blocks");
    }
    /* a dst that is also a src, a repeated dst, a block out of range */
    int32_t s2[2] = {1, 2}, d2[2] = {2, 5}, d3[2] = {5, 5}, d4[2] = {5, NBLK};
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 2, s2, d2), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 2, s2, d3), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 2, s2, d4), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 0, NULL, NULL), LLMEM_OK);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

/* ---- argument checks ------------------------------------------------------------------------------------ */

START_TEST(test_arguments)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor a = th_tensor(&c, F32, 2, 4, 8, 1), w = th_tensor(&c, F16, 2, 6, 8, 1);
    llmem_tensor o = th_tensor(&c, F32, 2, 4, 6, 1), a16 = th_tensor(&c, F16, 2, 4, 8, 1);
    ck_assert_int_eq(llmem_op_matmul(NULL, &a, &w, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_matmul(be, NULL, &w, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_matmul(be, &a16, &w, &o), LLMEM_E_INVALID); /* f16 activations */
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &a), LLMEM_E_INVALID);   /* wrong out shape */
    llmem_tensor bad = o;
    bad.ne[1] = 7;
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &bad), LLMEM_E_INVALID);
    bad = o;
    bad.offset += 2; /* misaligned */
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &bad), LLMEM_E_INVALID);
    bad = o;
    bad.offset = llmem_buffer_size(o.buf) - 8; /* past the end */
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &bad), LLMEM_E_INVALID);
    bad = o;
    bad.n_dims = 0;
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &bad), LLMEM_E_INVALID);
    /* partial overlap is refused, exact aliasing is allowed where documented */
    llmem_tensor x = th_tensor(&c, F32, 1, 64, 1, 1), half = x;
    half.ne[0] = 32;
    llmem_tensor shifted = half;
    shifted.offset += 16;
    th_set(&x, (double[64]){0});
    ck_assert_int_eq(llmem_op_silu(be, &half, &shifted), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_silu(be, &x, &x), LLMEM_OK);
    ck_assert_int_eq(llmem_op_add(be, &x, &half, &x), LLMEM_E_INVALID); /* b neither shape nor row */
    /* a buffer of another backend object */
    llmem_backend *other = th_open(_i);
    th_ctx c2;
    th_begin(&c2, other);
    llmem_tensor foreign = th_tensor(&c2, F32, 2, 4, 6, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &foreign), LLMEM_E_INVALID);
    th_end(&c2);
    llmem_backend_close(other);
    /* rope parameters */
    llmem_tensor q = th_tensor(&c, F32, 3, 2, 1, 8), pos = th_tensor(&c, I32, 1, 2, 1, 1);
    llmem_rope_params rp = {LLMEM_ROPE_NEOX, 10, 10000.0f, 1.0f};
    ck_assert_int_eq(llmem_op_rope(be, &rp, &q, &pos, &q), LLMEM_E_INVALID); /* n_rot > head_dim */
    rp.n_rot = 3;
    ck_assert_int_eq(llmem_op_rope(be, &rp, &q, &pos, &q), LLMEM_E_INVALID); /* odd */
    rp.n_rot = 8;
    rp.theta_base = 0.0f;
    ck_assert_int_eq(llmem_op_rope(be, &rp, &q, &pos, &q), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_rope(be, NULL, &q, &pos, &q), LLMEM_E_INVALID);
    /* norms */
    llmem_tensor y = th_tensor(&c, F32, 2, 2, 12, 1), nw = th_tensor(&c, F32, 1, 12, 1, 1);
    ck_assert_int_eq(llmem_op_rms_norm_gated(be, &y, &y, &nw, 5, 1e-5f, &y), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_rms_norm_gated(be, &y, &y, NULL, 2, 1e-5f, &y), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_rms_norm(be, &y, &nw, -1.0f, &y), LLMEM_E_INVALID);
    th_end(&c);
    if (is_cpu(_i)) {
        ck_assert_int_eq(llmem_backend_cpu_set_threads(be, -1), LLMEM_E_INVALID);
        ck_assert_int_eq(llmem_backend_cpu_set_threads(NULL, 1), LLMEM_E_INVALID);
    }
    llmem_backend_close(be);
}
END_TEST

/* A backend without ops gives LLMEM_E_UNSUPPORTED (the registry tests'
 * "testplug" plugin has no ops table). */
START_TEST(test_unsupported)
{
    setenv("LLMEM_BACKEND_PATH", LLMEM_BUILD_DIR "/tests/plugins", 1);
    llmem_backend *be = NULL;
    char err[256] = "";
    if (llmem_backend_open("testplug", -1, &be, err, sizeof err) != LLMEM_OK) {
        printf("ops: test_unsupported skipped: %s\n", err);
        return;
    }
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor a = th_tensor(&c, F32, 2, 2, 4, 1), w = th_tensor(&c, F32, 2, 3, 4, 1);
    llmem_tensor o = th_tensor(&c, F32, 2, 2, 3, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &o), LLMEM_E_UNSUPPORTED);
    ck_assert_int_eq(llmem_op_silu(be, &a, &a), LLMEM_E_UNSUPPORTED);
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 2), LLMEM_E_INVALID);
    /* copy_blocks falls back to buffer copies: a's data is blocks 16, 17 */
    double v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
    th_set(&a, v);
    int32_t s = TH_GUARD / 16, d = TH_GUARD / 16 + 1;
    ck_assert_int_eq(llmem_op_copy_blocks(be, a.buf, 16, 1, &s, &d), LLMEM_OK);
    th_get(&a, got);
    for (int i = 0; i < 8; i++)
        ck_assert(got[i] == v[i % 4]);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

/* CPU results do not depend on the thread count (each output element is
 * computed by one thread in a fixed order). */
START_TEST(test_cpu_threads)
{
    llmem_backend *be = th_open_cpu();
    ref64_rng r = ref64_rng_make(ref64_seed(), 1100);
    int32_t m = 37, k = 300, n = 129;
    th_ctx h;
    th_begin(&h, NULL);
    double *a = vec(&h, (int64_t)m * k), *w = vec(&h, (int64_t)n * k);
    double *o1 = vec(&h, (int64_t)m * n), *o3 = vec(&h, (int64_t)m * n);
    ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
    ref64_fill(&r, w, (int64_t)n * k, -1, 1, BF16);
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 1), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_cpu_threads(), 1);
    run_matmul(be, m, k, n, BF16, a, w, o1);
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 3), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_cpu_threads(), 3);
    run_matmul(be, m, k, n, BF16, a, w, o3);
    th_expect_same_bytes(o1, o3, (size_t)m * n * sizeof *o1, "matmul, 1 vs 3 threads");
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 0), LLMEM_OK);
    ck_assert_int_ge(llmem_backend_cpu_threads(), 1);
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_cpu_opens)
{
    llmem_backend_close(th_open_cpu());
}
END_TEST

int main(void)
{
    printf("test_ops: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cpu_opens);
    tcase_add_loop_test(tc, test_matmul, 0, n);
    tcase_add_loop_test(tc, test_matmul_degenerate, 0, n);
    tcase_add_loop_test(tc, test_get_rows, 0, n);
    tcase_add_loop_test(tc, test_elementwise, 0, n);
    tcase_add_loop_test(tc, test_rms_norm, 0, n);
    tcase_add_loop_test(tc, test_rope, 0, n);
    tcase_add_loop_test(tc, test_log_softmax, 0, n);
    tcase_add_loop_test(tc, test_argmax, 0, n);
    tcase_add_loop_test(tc, test_convert_exact, 0, n);
    tcase_add_loop_test(tc, test_copy, 0, n);
    tcase_add_loop_test(tc, test_copy_blocks, 0, n);
    tcase_add_loop_test(tc, test_arguments, 0, n);
    tcase_add_test(tc, test_unsupported);
    tcase_add_test(tc, test_cpu_threads);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

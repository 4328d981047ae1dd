// ctest-labels: core
/* Op conformance suite, part 1: dense and element-wise ops, norms, RoPE,
 * log_softmax/argmax and argument checks. (Conversions and copies:
 * test_ops_convert.c; attention: test_ops_attention.c; Mamba-2:
 * test_ops_mamba.c; a backend without ops and the CPU thread pool:
 * test_ops_backend.c.)
 *
 * Every test runs once per backend that opens ($LLMEM_TEST_BACKENDS,
 * default "cpu,vulkan,cuda"). The cpu backend is compared with float64
 * references (tests/support/ref64.c); any other backend with the cpu
 * backend. Inputs are fresh random numbers from a printed seed
 * ($LLMEM_TEST_SEED repeats a run); outputs start as NaN, so an unwritten
 * element fails the NaN/inf check; guard bytes around every tensor catch
 * writes out of bounds (tests/support/ops_harness.c).
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

static const llmem_dtype float_types[3] = {F32, F16, BF16};

/* ---- matmul ------------------------------------------------------------------------------ */

START_TEST(test_matmul)
{
    static const int32_t shapes[][3] = {{1, 1, 1},   {1, 64, 33},  {3, 80, 17},  {7, 129, 65},
                                        {16, 128, 16}, {17, 257, 37}, {33, 64, 100}, {2, 7, 3},
                                        {4, 4096, 33},
                                        /* Vulkan's matvec16 at its most rows a pass
                                         * (all rows' partials summed at once) */
                                        {8, 264, 37},
                                        /* Vulkan's register-tiled matmul: tiles of 64 and
                                         * 128 rows, split-K into 4 and 2 slices (the last
                                         * slice shorter), edges of every tile */
                                        {65, 1024, 130}, {40, 520, 300}, {130, 72, 129}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (int d = 0; d < 3; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
            ref64_rng r = ref64_rng_make(ref64_seed(), 100 + d * 16 + s);
            th_ctx h;
            th_begin(&h, NULL);
            double *a = th_vec(&h, (int64_t)m * k), *w = th_vec(&h, (int64_t)n * k);
            double *out = th_vec(&h, (int64_t)m * n), *ref = th_vec(&h, (int64_t)m * n);
            ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
            ref64_fill(&r, w, (int64_t)n * k, -1, 1, float_types[d]);
            th_matmul(be, m, k, n, float_types[d], a, w, out);
            if (cpu)
                th_matmul(cpu, m, k, n, float_types[d], a, w, ref);
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
    llmem_tensor ts = th_input(&c, t, 2, rows, cols, 1, src);
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
            double *src = th_vec(&h, (int64_t)rows * cols), *out = th_vec(&h, (int64_t)n * cols);
            double *ref = th_vec(&h, (int64_t)n * cols);
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
    if (th_is_cpu(_i)) {
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

typedef enum ew_op {
    OP_ADD, OP_MUL, OP_SCALE, OP_SILU, OP_RELU2, OP_SOFTPLUS, OP_SWIGLU, OP_GEGLU, OP_SOFTCAP
} ew_op;
static const char *const ew_names[] = {"add", "mul", "scale", "silu", "relu2", "softplus",
                                       "swiglu", "geglu", "softcap"};

/* mode 0: separate output; 1: in place on a; 2: in place on b */
static void run_ew(llmem_backend *be, ew_op op, int nd, const int32_t *ne, int64_t nb, int mode,
                   const double *a, const double *b, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ta = th_input(&c, F32, nd, ne[0], ne[1], ne[2], a);
    llmem_tensor tb = nb > 0 && nb != llmem_tensor_nelements(&ta)
                          ? th_input(&c, F32, 1, (int32_t)nb, 1, 1, b)
                          : th_input(&c, F32, nd, ne[0], ne[1], ne[2], b);
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
    case OP_GEGLU: st = llmem_op_geglu(be, &ta, &tb, &to); break;
    case OP_SOFTCAP: st = llmem_op_softcap(be, &ta, 7.5f, &to); break;
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
    case OP_GEGLU: /* torch gelu(approximate="tanh"): 0.5 a (1 + tanh(z)) = a / (1 + e^(-2z)) */
        return a / (1.0 + exp(-2.0 * sqrt(2.0 / 3.14159265358979323846) *
                              (a + 0.044715 * a * a * a))) * b;
    case OP_SOFTCAP: return 7.5 * tanh(a / 7.5);
    }
    return NAN;
}

START_TEST(test_elementwise)
{
    /* the last shape spans several 16384-element chunks of the CPU
     * backend, which then start in the middle of a broadcast row */
    static const int32_t shapes[][4] = {{1, 1, 1, 1}, {1, 7, 1, 1},  {2, 3, 5, 1},
                                        {1, 4097, 1, 1}, {3, 2, 3, 67}, {2, 9, 4099, 1}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (int op = OP_ADD; op <= OP_SOFTCAP; op++) {
        bool binary = op == OP_ADD || op == OP_MUL || op == OP_SWIGLU || op == OP_GEGLU;
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
                    double *a = th_vec(&h, n), *b = th_vec(&h, n), *out = th_vec(&h, n), *ref = th_vec(&h, n);
                    /* geglu within [-8, 8]: below, its f32 value is subnormal
                     * (e^-2z < 2^-126), flushed to zero by GPU drivers */
                    double lim = op == OP_SOFTPLUS || op == OP_SILU || op == OP_SWIGLU ||
                                         op == OP_SOFTCAP ? 30 : op == OP_GEGLU ? 8 : 3;
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
                    /* each element on its own: a few f32 roundings of expf/log1pf */
                    th_expect_close_elem(out, ref, n, cpu ? 1e-5 : 1e-6, what);
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
    llmem_tensor ty = th_input(&c, F32, 2, rows, d, 1, y);
    llmem_tensor tw = wt >= 0 ? th_input(&c, (llmem_dtype)wt, 1, d, 1, 1, w) : ty;
    llmem_tensor to = inplace ? ty : th_tensor(&c, F32, 2, rows, d, 1);
    llmem_status st;
    if (groups > 0) {
        llmem_tensor tz = th_input(&c, F32, 2, rows, d, 1, z);
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
    /* (cuda keeps rows of <= 16384 floats, cols % 4 == 0, in registers:
     * 12292 has a partly filled last float4 per thread, 16388 is past it,
     * 8192 is Bamba-9B's gated norm group) */
    static const int32_t cases[][3] = {{1, 1, 0},    {3, 7, 0},     {5, 64, 0},
                                       {2, 4096, 0}, {3, 12292, 0}, {1, 16388, 0},
                                       {1, 8, 1},    {3, 64, 2},    {2, 96, 8},
                                       {4, 130, 5},  {2, 8192, 1}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int32_t rows = cases[s][0], d = cases[s][1], g = cases[s][2];
        for (int wt = g > 0 ? 0 : -1; wt < 3; wt++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                ref64_rng r = ref64_rng_make(ref64_seed(), 400 + s * 16 + (wt + 1) * 2 + inplace);
                th_ctx h;
                th_begin(&h, NULL);
                int64_t n = (int64_t)rows * d;
                double *y = th_vec(&h, n), *z = th_vec(&h, n), *w = th_vec(&h, d);
                double *out = th_vec(&h, n), *ref = th_vec(&h, n);
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
    llmem_tensor tx = th_input(&c, F32, 3, t, nh, hd, x);
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
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int mode = 0; mode < 2; mode++) {
            int32_t t = cases[s][0], nh = cases[s][1], hd = cases[s][2];
            llmem_rope_params p = {mode ? LLMEM_ROPE_NEOX : LLMEM_ROPE_NORMAL, cases[s][3],
                                   thetas[s % 3], scales[s % 3]};
            ref64_rng r = ref64_rng_make(ref64_seed(), 500 + s * 4 + mode);
            th_ctx h;
            th_begin(&h, NULL);
            int64_t n = (int64_t)t * nh * hd;
            double *x = th_vec(&h, n), *out = th_vec(&h, n), *ref = th_vec(&h, n);
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
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            int32_t rows = cases[s][0], v = cases[s][1];
            int64_t n = (int64_t)rows * v;
            ref64_rng r = ref64_rng_make(ref64_seed(), 600 + s * 2 + inplace);
            th_ctx h;
            th_begin(&h, NULL);
            double *x = th_vec(&h, n), *out = th_vec(&h, n), *ref = th_vec(&h, n);
            ref64_fill(&r, x, n, -20, 20, F32);
            for (int pass = 0; pass < (cpu ? 2 : 1); pass++) {
                llmem_backend *b = pass ? cpu : be;
                th_ctx c;
                th_begin(&c, b);
                llmem_tensor tx = th_input(&c, F32, 2, rows, v, 1, x);
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
    /* cols % 4 == 0 (1000, 8192) take Vulkan's vec4 loads; 8192: the last row all NaN; one
     * row of 16384+ columns (% 4 == 0) is split over workgroups on Vulkan (argmax.comp's
     * SPLIT): ties in different parts and at a part boundary, 65536 all NaN */
    static const int32_t cases[][2] = {{1, 1},     {4, 7},      {3, 1000},  {2, 32003}, {5, 3},
                                       {5, 8192},  {1, 128256}, {1, 20000}, {1, 65536}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int32_t rows = cases[s][0], v = cases[s][1];
        int64_t n = (int64_t)rows * v;
        ref64_rng r = ref64_rng_make(ref64_seed(), 700 + s);
        th_ctx c;
        th_begin(&c, be);
        double *x = th_vec(&c, n);
        int32_t *out = th_alloc(&c, (size_t)rows * sizeof *out);
        int32_t *ref = th_alloc(&c, (size_t)rows * sizeof *ref);
        ref64_fill(&r, x, n, -5, 5, F32);
        for (int32_t i = 0; i < rows; i++) {
            double *row = x + (int64_t)i * v;
            /* plant a tie (the first must win) and NaNs (ignored) */
            if (v > 2) {
                int32_t a = ref64_int(&r, 0, v - 2), b = ref64_int(&r, a + 1, v - 1);
                row[a] = row[b] = 6.0;
                if (v % 4 == 0 && v >= 8) { /* a tie inside one 16-byte load too */
                    int32_t q = 4 * ref64_int(&r, 0, v / 4 - 1);
                    row[q + 1] = row[q + 2] = 6.0;
                }
                row[ref64_int(&r, 0, v - 1)] = NAN;
            }
            if (rows == 1 && v >= 16384) { /* the split's parts: 64 by default */
                int32_t per = (v / 4 + 63) / 64 * 4, k = ref64_int(&r, 1, v / per - 1);
                row[k * per - 1] = row[k * per] = 7.0; /* last of one part, first of the next */
                row[(k - 1) * per + 5] = 7.0;          /* the same value earlier: it must win */
            }
            if (i == 4 || (rows == 1 && v == 65536)) /* all-NaN rows */
                for (int32_t j = 0; j < v; j++)
                    row[j] = NAN;
            int32_t best = -1;
            for (int32_t j = 0; j < v; j++)
                if (!isnan(row[j]) && (best < 0 || row[j] > row[best]))
                    best = j;
            ref[i] = best < 0 ? 0 : best;
        }
        llmem_tensor tx = th_input(&c, F32, 2, rows, v, 1, x);
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
    /* geglu takes no broadcast; softcap needs a finite cap > 0 */
    ck_assert_int_eq(llmem_op_geglu(be, &x, &half, &x), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_geglu(be, &half, &half, &shifted), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_geglu(be, &x, &x, &x), LLMEM_OK);
    ck_assert_int_eq(llmem_op_softcap(be, &x, 0.0f, &x), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_softcap(be, &x, -3.0f, &x), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_softcap(be, &x, NAN, &x), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_softcap(be, &x, INFINITY, &x), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_softcap(be, &half, 2.0f, &shifted), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_softcap(be, &x, 2.0f, &x), LLMEM_OK);
    ck_assert_int_eq(llmem_op_softcap(NULL, &x, 2.0f, &x), LLMEM_E_INVALID);
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
    if (th_is_cpu(_i)) {
        ck_assert_int_eq(llmem_backend_cpu_set_threads(be, -1), LLMEM_E_INVALID);
        ck_assert_int_eq(llmem_backend_cpu_set_threads(NULL, 1), LLMEM_E_INVALID);
    }
    llmem_backend_close(be);
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
    tcase_add_loop_test(tc, test_matmul, 0, n);
    tcase_add_loop_test(tc, test_matmul_degenerate, 0, n);
    tcase_add_loop_test(tc, test_get_rows, 0, n);
    tcase_add_loop_test(tc, test_elementwise, 0, n);
    tcase_add_loop_test(tc, test_rms_norm, 0, n);
    tcase_add_loop_test(tc, test_rope, 0, n);
    tcase_add_loop_test(tc, test_log_softmax, 0, n);
    tcase_add_loop_test(tc, test_argmax, 0, n);
    tcase_add_loop_test(tc, test_arguments, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// ctest-labels: core
/* Op conformance suite of the fused decode matmul llmem_op_norm_matmul
 * (<llmem/ops_norm_matmul.h>) on every backend that opens
 * ($LLMEM_TEST_BACKENDS, default "cpu,vulkan,cuda"; a backend without the
 * op is skipped with a message), against a float64 norm (ref64_rms_norm,
 * ref64_rms_norm_gated), product (ref64_matmul) and epilogue written here.
 * Every norm x epilogue, weights of each dtype; shapes cover the CUDA
 * kernel's three slices of K (1, 2 and 4 chunks per thread: K = 4096,
 * 8192, 14336), rows past a CTA step (N = 37), one to four input rows, and
 * shapes a device may refuse (K = 12, K over its limit, T = 5), where
 * LLMEM_E_UNSUPPORTED must leave out as it was. Outputs start as NaN, or
 * as the values a residual add reads.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops_norm_matmul.h"
#include "support/ops_harness.h"
#include "support/ref64.h"
#include "support/rs_harness.h"

#define F32 LLMEM_DTYPE_F32

/* out = epilogue(norm(x) · wᵀ), float64 */
static void nm_ref(const llmem_norm_matmul_params *p, const double *x, const double *z,
                   const double *nw, const double *w, const double *w2, const double *out0,
                   int32_t T, int32_t K, int32_t N, double *a, double *s, double *u, double *ref)
{
    if (p->norm == LLMEM_NM_NORM_RMS)
        ref64_rms_norm(x, nw, T, K, p->eps, a);
    else if (p->norm == LLMEM_NM_NORM_GATED) {
        double *ones = NULL;
        if (!nw) { /* ref64_rms_norm_gated wants a weight */
            ones = malloc(sizeof(double) * (size_t)K);
            ck_assert_ptr_nonnull(ones);
            for (int32_t i = 0; i < K; i++)
                ones[i] = 1.0;
        }
        ref64_rms_norm_gated(x, z, nw ? nw : ones, T, K, 1, p->eps, a);
        free(ones);
    }
    else
        memcpy(a, x, sizeof(double) * (size_t)T * K);
    ref64_matmul(a, w, T, K, N, s);
    if (w2)
        ref64_matmul(a, w2, T, K, N, u);
    for (int64_t i = 0; i < (int64_t)T * N; i++)
        ref[i] = p->epilogue == LLMEM_NM_SWIGLU ? ref64_silu(s[i]) * u[i]
                 : p->epilogue == LLMEM_NM_ADD  ? out0[i] + s[i]
                                                : s[i];
}

static const char *nm_norm_name[] = {"none", "rms", "gated"};
static const char *nm_epi_name[] = {"store", "add", "swiglu"};

START_TEST(test_norm_matmul)
{
    /* T, K, N, whether a device may refuse it */
    static const int32_t shapes[][4] = {{1, 4096, 96, 0},  {3, 1024, 37, 0}, {1, 8192, 64, 0},
                                        {2, 14336, 20, 0}, {4, 512, 9, 0},   {1, 12, 5, 1},
                                        {1, 16392, 16, 1}, {5, 256, 7, 1}, {1, 512, 37, 0}};
    static const llmem_dtype wts[3] = {LLMEM_DTYPE_BF16, LLMEM_DTYPE_F16, F32};
    llmem_backend *be = th_open(_i);
    int refused = 0, ran = 0;
    for (int d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int norm = 0; norm < 3; norm++)
                for (int epi = 0; epi < 3; epi++) {
                    int32_t T = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
                    /* the largest shapes with one weight dtype and a few modes only */
                    if (K > 8192 && (d != 0 || (norm + epi) % 2))
                        continue;
                    bool now = norm != LLMEM_NM_NORM_NONE && d == 2 && s == 1; /* no weight */
                    llmem_norm_matmul_params p = {.norm = norm, .epilogue = epi, .eps = 1e-5f};
                    ref64_rng r = ref64_rng_make(ref64_seed(), 9000 + d * 256 + s * 16 + norm * 4 + epi);
                    th_ctx c;
                    th_begin(&c, be);
                    int64_t TK = (int64_t)T * K, TN = (int64_t)T * N, NK = (int64_t)N * K;
                    double *x = th_vec(&c, TK), *z = th_vec(&c, TK), *nw = th_vec(&c, K);
                    double *w = th_vec(&c, NK), *w2 = th_vec(&c, NK), *o0 = th_vec(&c, TN);
                    double *a = th_vec(&c, TK), *ps = th_vec(&c, TN), *pu = th_vec(&c, TN);
                    double *ref = th_vec(&c, TN), *out = th_vec(&c, TN);
                    ref64_fill(&r, x, TK, -2, 2, F32);
                    ref64_fill(&r, z, TK, -3, 3, F32);
                    ref64_fill(&r, nw, K, 0.5, 1.5, wts[d]);
                    ref64_fill(&r, w, NK, -1, 1, wts[d]);
                    ref64_fill(&r, w2, NK, -1, 1, wts[d]);
                    ref64_fill(&r, o0, TN, -4, 4, F32);
                    bool gated = norm == LLMEM_NM_NORM_GATED, sw = epi == LLMEM_NM_SWIGLU;
                    nm_ref(&p, x, gated ? z : NULL, now ? NULL : nw, w, sw ? w2 : NULL, o0, T,
                           K, N, a, ps, pu, ref);
                    llmem_tensor tx = th_input(&c, F32, 2, T, K, 1, x);
                    llmem_tensor tz = th_input(&c, F32, 2, T, K, 1, z);
                    llmem_tensor tn = th_input(&c, wts[d], 1, K, 1, 1, nw);
                    llmem_tensor tw = th_input(&c, wts[d], 2, N, K, 1, w);
                    llmem_tensor tw2 = th_input(&c, wts[d], 2, N, K, 1, w2);
                    llmem_tensor to = epi == LLMEM_NM_ADD ? th_input(&c, F32, 2, T, N, 1, o0)
                                                          : th_tensor(&c, F32, 2, T, N, 1);
                    const llmem_tensor *pn = norm == LLMEM_NM_NORM_NONE || now ? NULL : &tn;
                    llmem_status st = llmem_op_norm_matmul(be, &p, &tx, gated ? &tz : NULL, pn,
                                                           &tw, sw ? &tw2 : NULL, &to);
                    char what[128];
                    snprintf(what, sizeof what, "norm_matmul T=%d K=%d N=%d w=%s norm=%s%s epi=%s",
                             T, K, N, llmem_dtype_name(wts[d]), nm_norm_name[norm],
                             now ? "(no weight)" : "", nm_epi_name[epi]);
                    if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(_i) && ran == 0 && s == 0) {
                        printf("test_ops_norm_matmul: %s has no norm_matmul, skipped\n",
                               th_backend_name(_i));
                        th_end(&c);
                        llmem_backend_close(be);
                        return;
                    }
                    th_get(&to, out);
                    /* Vulkan's kernel takes one f16/bf16 row */
                    bool vk_may = !strcmp(th_backend_name(_i), "vulkan") && (T > 1 || d == 2);
                    if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(_i) && (shapes[s][3] || vk_may)) {
                        /* refused: out is as it was (NaN, or the add's input) */
                        for (int64_t i = 0; i < TN; i++)
                            ck_assert_msg(epi == LLMEM_NM_ADD ? out[i] == o0[i] : isnan(out[i]),
                                          "%s on %s: refused but wrote out", what,
                                          th_backend_name(_i));
                        refused++;
                        th_end(&c);
                        continue;
                    }
                    ck_assert_msg(st == LLMEM_OK, "%s on %s: status %d", what,
                                  th_backend_name(_i), (int)st);
                    ran++;
                    /* f32 sums of K terms: rounding grows as sqrt(K) */
                    th_expect_close(out, ref, TN, fmax(1e-5, 3e-7 * sqrt((double)K)), what);
                    /* rows are independent: row t of T rows equals the op on that row alone */
                    if (T > 1 && d == 0 && !th_is_cpu(_i)) {
                        int32_t t = T - 1;
                        llmem_tensor x1 = th_input(&c, F32, 2, 1, K, 1, x + (int64_t)t * K);
                        llmem_tensor z1 = th_input(&c, F32, 2, 1, K, 1, z + (int64_t)t * K);
                        llmem_tensor o1 = epi == LLMEM_NM_ADD
                                              ? th_input(&c, F32, 2, 1, N, 1, o0 + (int64_t)t * N)
                                              : th_tensor(&c, F32, 2, 1, N, 1);
                        ck_assert_int_eq(llmem_op_norm_matmul(be, &p, &x1, gated ? &z1 : NULL, pn,
                                                              &tw, sw ? &tw2 : NULL, &o1),
                                         LLMEM_OK);
                        double *one = th_vec(&c, N);
                        th_get(&o1, one);
                        ck_assert_msg(!memcmp(one, out + (int64_t)t * N, sizeof(double) * N),
                                      "%s on %s: row %d alone differs", what,
                                      th_backend_name(_i), t);
                    }
                    th_end(&c);
                }
    printf("test_ops_norm_matmul: %s ran %d cases, refused %d\n", th_backend_name(_i), ran,
           refused);
    ck_assert_int_gt(ran, 0);
    llmem_backend_close(be);
}
END_TEST

/* Bad arguments give LLMEM_E_INVALID and leave out as it was. */
START_TEST(test_norm_matmul_invalid)
{
    llmem_backend *be = th_open(_i);
    int32_t T = 1, K = 64, N = 8;
    th_ctx c;
    th_begin(&c, be);
    double *x = th_vec(&c, (int64_t)T * K), *w = th_vec(&c, (int64_t)N * K), *nw = th_vec(&c, K);
    ref64_rng r = ref64_rng_make(ref64_seed(), 9900);
    ref64_fill(&r, x, (int64_t)T * K, -1, 1, F32);
    ref64_fill(&r, w, (int64_t)N * K, -1, 1, LLMEM_DTYPE_BF16);
    ref64_fill(&r, nw, K, 0.5, 1.5, LLMEM_DTYPE_BF16);
    llmem_tensor tx = th_input(&c, F32, 2, T, K, 1, x);
    llmem_tensor tz = th_input(&c, F32, 2, T, K, 1, x);
    llmem_tensor tw = th_input(&c, LLMEM_DTYPE_BF16, 2, N, K, 1, w);
    llmem_tensor tw16 = th_input(&c, LLMEM_DTYPE_F16, 2, N, K, 1, w);
    llmem_tensor tn = th_input(&c, LLMEM_DTYPE_BF16, 1, K, 1, 1, nw);
    llmem_tensor tn2 = th_tensor(&c, LLMEM_DTYPE_BF16, 1, K + 1, 1, 1);
    llmem_tensor to = th_tensor(&c, F32, 2, T, N, 1);
    llmem_tensor tbig = th_tensor(&c, F32, 2, T, N + 1, 1);
    llmem_norm_matmul_params rms = {.norm = LLMEM_NM_NORM_RMS, .eps = 1e-5f};
    llmem_norm_matmul_params sw = {.norm = LLMEM_NM_NORM_RMS, .epilogue = LLMEM_NM_SWIGLU,
                                   .eps = 1e-5f};
    llmem_norm_matmul_params gated = {.norm = LLMEM_NM_NORM_GATED, .eps = 1e-5f};
    llmem_norm_matmul_params bad_norm = {.norm = 3, .eps = 1e-5f};
    llmem_norm_matmul_params bad_epi = {.norm = LLMEM_NM_NORM_RMS, .epilogue = -1, .eps = 1e-5f};
    llmem_norm_matmul_params bad_eps = {.norm = LLMEM_NM_NORM_RMS, .eps = NAN};
    llmem_norm_matmul_params neg_eps = {.norm = LLMEM_NM_NORM_RMS, .eps = -1.0f};
    llmem_norm_matmul_params none = {.norm = LLMEM_NM_NORM_NONE};
    if (llmem_op_norm_matmul(be, &rms, &tx, NULL, &tn, &tw, NULL, &to) == LLMEM_E_UNSUPPORTED &&
        !th_is_cpu(_i)) {
        printf("test_ops_norm_matmul: %s has no norm_matmul, skipped\n", th_backend_name(_i));
        th_end(&c);
        llmem_backend_close(be);
        return;
    }
    th_poison(&to);
#define BAD(...) ck_assert_int_eq(llmem_op_norm_matmul(__VA_ARGS__), LLMEM_E_INVALID)
    BAD(NULL, &rms, &tx, NULL, &tn, &tw, NULL, &to);
    BAD(be, NULL, &tx, NULL, &tn, &tw, NULL, &to);
    BAD(be, &rms, NULL, NULL, &tn, &tw, NULL, &to);
    BAD(be, &rms, &tx, NULL, &tn, NULL, NULL, &to);
    BAD(be, &rms, &tx, NULL, &tn, &tw, NULL, NULL);
    BAD(be, &bad_norm, &tx, NULL, &tn, &tw, NULL, &to);
    BAD(be, &bad_epi, &tx, NULL, &tn, &tw, NULL, &to);
    BAD(be, &bad_eps, &tx, NULL, &tn, &tw, NULL, &to);
    BAD(be, &neg_eps, &tx, NULL, &tn, &tw, NULL, &to);
    BAD(be, &rms, &tx, &tz, &tn, &tw, NULL, &to);     /* z without the gated norm */
    BAD(be, &gated, &tx, NULL, &tn, &tw, NULL, &to);  /* gated norm without z */
    BAD(be, &sw, &tx, NULL, &tn, &tw, NULL, &to);     /* SwiGLU without w2 */
    BAD(be, &rms, &tx, NULL, &tn, &tw, &tw, &to);     /* w2 without SwiGLU */
    BAD(be, &sw, &tx, NULL, &tn, &tw, &tw16, &to);    /* w2 of another dtype */
    BAD(be, &none, &tx, NULL, &tn, &tw, NULL, &to);   /* a norm weight without a norm */
    BAD(be, &rms, &tx, NULL, &tn2, &tw, NULL, &to);   /* norm weight of K + 1 */
    BAD(be, &rms, &tx, NULL, &tn, &tw, NULL, &tbig);  /* out of N + 1 columns */
    BAD(be, &rms, &tx, NULL, &tn, &tw, NULL, &tx);    /* out overlaps x */
#undef BAD
    double *got = th_vec(&c, (int64_t)T * N);
    th_get(&to, got);
    for (int64_t i = 0; i < (int64_t)T * N; i++)
        ck_assert_msg(isnan(got[i]), "norm_matmul on %s: a refused call wrote out",
                      th_backend_name(_i));
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

/* The CPU test knob LLMEM_NORM_MATMUL_CPU_MAX_K=n (backends/cpu/
 * ops_norm_matmul.c): rows longer than n are refused with
 * LLMEM_E_UNSUPPORTED and out is left as it was (the add's input), rows of
 * n or fewer still match the float64 reference, and without the knob the
 * long rows run. tests/fused_fallback.sh relies on it to drive
 * models/forward.c's fallback to the unfused ops. The backend reads it
 * when it opens and at llmem_backend_reload_env, not per call: set after
 * the open (pass 0) it changes nothing until the reload (pass 1); unset,
 * it still holds until the next reload (pass 2). CPU only. */
START_TEST(test_norm_matmul_cpu_max_k)
{
    if (!th_is_cpu(_i))
        return;
    ck_assert_int_eq(unsetenv("LLMEM_NORM_MATMUL_CPU_MAX_K"), 0);
    llmem_backend *be = th_open(_i);
    int32_t T = 1, N = 5, Ks[2] = {32, 33};
    llmem_norm_matmul_params p = {.norm = LLMEM_NM_NORM_RMS, .epilogue = LLMEM_NM_ADD,
                                  .eps = 1e-5f};
    ck_assert_int_eq(setenv("LLMEM_NORM_MATMUL_CPU_MAX_K", "32", 1), 0);
    for (int pass = 0; pass < 4; pass++) {
        if (pass == 1)
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
        if (pass == 2)
            ck_assert_int_eq(unsetenv("LLMEM_NORM_MATMUL_CPU_MAX_K"), 0);
        if (pass == 3) /* knob unset and read */
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
        bool limited = pass == 1 || pass == 2;
        for (int k = 0; k < 2; k++) {
            int32_t K = Ks[k];
            th_ctx c;
            th_begin(&c, be);
            double *x = th_vec(&c, (int64_t)T * K), *w = th_vec(&c, (int64_t)N * K);
            double *nw = th_vec(&c, K), *o0 = th_vec(&c, N), *a = th_vec(&c, (int64_t)T * K);
            double *ps = th_vec(&c, N), *pu = th_vec(&c, N), *ref = th_vec(&c, N);
            double *out = th_vec(&c, N);
            ref64_rng r = ref64_rng_make(ref64_seed(), 9950 + k);
            ref64_fill(&r, x, (int64_t)T * K, -2, 2, F32);
            ref64_fill(&r, w, (int64_t)N * K, -1, 1, LLMEM_DTYPE_BF16);
            ref64_fill(&r, nw, K, 0.5, 1.5, LLMEM_DTYPE_BF16);
            ref64_fill(&r, o0, N, -4, 4, F32);
            nm_ref(&p, x, NULL, nw, w, NULL, o0, T, K, N, a, ps, pu, ref);
            llmem_tensor tx = th_input(&c, F32, 2, T, K, 1, x);
            llmem_tensor tn = th_input(&c, LLMEM_DTYPE_BF16, 1, K, 1, 1, nw);
            llmem_tensor tw = th_input(&c, LLMEM_DTYPE_BF16, 2, N, K, 1, w);
            llmem_tensor to = th_input(&c, F32, 2, T, N, 1, o0);
            llmem_status st = llmem_op_norm_matmul(be, &p, &tx, NULL, &tn, &tw, NULL, &to);
            th_get(&to, out);
            if (limited && K > 32) {
                ck_assert_int_eq(st, LLMEM_E_UNSUPPORTED);
                for (int32_t i = 0; i < N; i++)
                    ck_assert_msg(out[i] == o0[i], "refused K=%d but out[%d] changed", K, i);
            } else {
                ck_assert_msg(st == LLMEM_OK, "K=%d pass %d: status %d", K, pass, (int)st);
                th_expect_close(out, ref, N, 1e-5, "norm_matmul under the MAX_K knob");
            }
            th_end(&c);
        }
    }
    llmem_backend_close(be);
}
END_TEST

/* Vulkan's two kernels and their launch-shape knobs
 * (backends/vulkan/vk_ops_norm_matmul.c), with a bf16 norm weight at an odd
 * element offset and an f32 one: each run is within the float64
 * tolerance; what only regroups rows (the rows kernel's rows per group
 * $LLMEM_VULKAN_NM_NR, loads in flight $LLMEM_VULKAN_NM_UNROLL and
 * workgroup size $LLMEM_VULKAN_NM_RWG at the same invocations per row; the persistent kernel's rows per step
 * $LLMEM_VULKAN_NM_R and workgroups $LLMEM_VULKAN_NM_GROUPS, where 1 and 3
 * make a workgroup walk many blocks of rows through both reduction
 * buffers) does not change any output bit, since every row is summed in
 * the same order; $LLMEM_VULKAN_NORM_MATMUL=0 refuses the op and leaves
 * out as it was. The backend reads the knobs when it opens, so each change
 * is followed by llmem_backend_reload_env (the refusal checks that it
 * took). Other backends: nothing to check. */
START_TEST(test_norm_matmul_vulkan_knobs)
{
    if (strcmp(th_backend_name(_i), "vulkan") != 0)
        return;
    enum { N_KNOB = 9 };
    static const char *const knobs[N_KNOB] = {
        "LLMEM_VULKAN_NORM_MATMUL", "LLMEM_VULKAN_NM_MODE", "LLMEM_VULKAN_NM_WG",
        "LLMEM_VULKAN_NM_R",        "LLMEM_VULKAN_NM_GROUPS", "LLMEM_VULKAN_NM_NR",
        "LLMEM_VULKAN_NM_TPR",      "LLMEM_VULKAN_NM_UNROLL", "LLMEM_VULKAN_NM_RWG"};
    test_env saved[N_KNOB];
    for (int i = 0; i < N_KNOB; i++) {
        saved[i] = test_env_save(knobs[i]);
        unsetenv(knobs[i]);
    }
    /* knobs[1..6] (NULL: unset); 'f': the first run of a mode, 's': must equal it bit for
     * bit, 'd': may differ */
    static const struct {
        const char *v[N_KNOB - 1];
        char same;
    } runs[] = {
        {{"0", NULL, NULL, NULL, NULL, NULL, NULL, NULL}, 'f'},
        {{"0", NULL, NULL, NULL, NULL, NULL, "2", NULL}, 's'}, /* the default above N 2048 */
        {{"0", NULL, NULL, NULL, "1", NULL, NULL, NULL}, 's'},
        {{"0", NULL, NULL, NULL, "4", NULL, NULL, NULL}, 's'},
        {{"0", NULL, NULL, NULL, "2", NULL, NULL, NULL}, 's'},
        {{"0", NULL, NULL, NULL, "8", NULL, "4", NULL}, 's'},
        {{"0", NULL, NULL, NULL, "1", NULL, "16", NULL}, 's'},
        {{"0", NULL, NULL, NULL, "2", NULL, "1", "1024"}, 's'},
        {{"0", NULL, NULL, NULL, NULL, NULL, "3", "512"}, 's'},
        {{"0", NULL, NULL, NULL, NULL, "64", NULL, NULL}, 'd'},
        {{"0", NULL, NULL, NULL, "4", "256", NULL, NULL}, 'd'},
        {{"0", NULL, NULL, NULL, "8", "32", "8", "128"}, 'd'},
        {{"1", NULL, NULL, NULL, NULL, NULL, NULL, NULL}, 'f'},
        {{"1", NULL, "1", "1", NULL, NULL, NULL, NULL}, 's'},
        {{"1", NULL, "4", "3", NULL, NULL, NULL, NULL}, 's'},
        {{"1", NULL, "2", "1", NULL, NULL, NULL, NULL}, 's'},
        {{"1", "512", NULL, "2", NULL, NULL, NULL, NULL}, 'd'},
        {{"1", "128", "1", NULL, NULL, NULL, NULL, NULL}, 'd'},
    };
    /* K, N: the persistent kernel's activation in 1 and 2 chunks per invocation at WG 512
     * (2 to 5 at 256, 128), N odd; K and N above NM_SHORT (the rows kernel's default takes 4
     * rows a group, 2 for the SwiGLU), the rows kernel only: one persistent workgroup walking
     * its 2101 rows loops more often than lavapipe runs a loop (llvmpipe's limiter, 65535
     * iterations an invocation, cuts it short from about 1000 rows) */
    static const int32_t shapes[][2] = {{4096, 301}, {5120, 67}, {2056, 2101}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < 3; s++)
        for (int mode = 0; mode < 3; mode++) {
            int32_t K = shapes[s][0], N = shapes[s][1];
            int norm = mode == 0 ? LLMEM_NM_NORM_GATED : mode == 1 ? LLMEM_NM_NORM_RMS : 0;
            int epi = mode == 0 ? LLMEM_NM_ADD : mode == 1 ? LLMEM_NM_SWIGLU : LLMEM_NM_STORE;
            llmem_norm_matmul_params p = {.norm = norm, .epilogue = epi, .eps = 1e-5f};
            ref64_rng r = ref64_rng_make(ref64_seed(), 9700 + s * 8 + mode);
            th_ctx c;
            th_begin(&c, be);
            int64_t NK = (int64_t)N * K;
            /* the norm weight: bf16 one element into its buffer (the rows kernel then
             * reads it element by element), or f32 at the start (16-byte loads) */
            llmem_dtype ndt = s != 1 ? LLMEM_DTYPE_BF16 : F32;
            int32_t nsh = s != 1 ? 1 : 0;
            double *x = th_vec(&c, K), *z = th_vec(&c, K), *nwb = th_vec(&c, K + 1);
            double *nw = nwb + nsh;
            double *w = th_vec(&c, NK), *w2 = th_vec(&c, NK), *o0 = th_vec(&c, N);
            double *a = th_vec(&c, K), *ps = th_vec(&c, N), *pu = th_vec(&c, N);
            double *ref = th_vec(&c, N), *out = th_vec(&c, N), *first = th_vec(&c, N);
            ref64_fill(&r, x, K, -2, 2, F32);
            ref64_fill(&r, z, K, -3, 3, F32);
            ref64_fill(&r, nw, K, 0.5, 1.5, ndt);
            ref64_fill(&r, w, NK, -1, 1, LLMEM_DTYPE_BF16);
            ref64_fill(&r, w2, NK, -1, 1, LLMEM_DTYPE_BF16);
            ref64_fill(&r, o0, N, -4, 4, F32);
            bool gated = norm == LLMEM_NM_NORM_GATED, sw = epi == LLMEM_NM_SWIGLU;
            const double *rnw = norm ? nw : NULL;
            nm_ref(&p, x, gated ? z : NULL, rnw, w, sw ? w2 : NULL, o0, 1, K, N, a, ps, pu, ref);
            llmem_tensor tx = th_input(&c, F32, 2, 1, K, 1, x);
            llmem_tensor tz = th_input(&c, F32, 2, 1, K, 1, z);
            llmem_tensor tn = th_input(&c, ndt, 1, K + nsh, 1, 1, nwb);
            tn.offset += (size_t)nsh * llmem_dtype_size(ndt);
            tn.ne[0] = K;
            llmem_tensor tw = th_input(&c, LLMEM_DTYPE_BF16, 2, N, K, 1, w);
            llmem_tensor tw2 = th_input(&c, LLMEM_DTYPE_BF16, 2, N, K, 1, w2);
            llmem_tensor to = th_tensor(&c, F32, 2, 1, N, 1);
            for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
                const char *const *vals = runs[k].v;
                if (s == 2 && strcmp(vals[0], "0") != 0)
                    continue;
                for (int i = 0; i < N_KNOB - 1; i++)
                    vals[i] ? setenv(knobs[i + 1], vals[i], 1) : unsetenv(knobs[i + 1]);
                ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
                th_set(&to, o0);
                ck_assert_int_eq(llmem_op_norm_matmul(be, &p, &tx, gated ? &tz : NULL,
                                                      norm ? &tn : NULL, &tw, sw ? &tw2 : NULL,
                                                      &to),
                                 LLMEM_OK);
                th_get(&to, out);
                char what[200];
                snprintf(what, sizeof what,
                         "vulkan norm_matmul K=%d N=%d norm=%s epi=%s mode=%s WG=%s R=%s "
                         "groups=%s NR=%s TPR=%s UNROLL=%s RWG=%s",
                         K, N, nm_norm_name[norm], nm_epi_name[epi], vals[0],
                         vals[1] ? vals[1] : "-", vals[2] ? vals[2] : "-",
                         vals[3] ? vals[3] : "-", vals[4] ? vals[4] : "-",
                         vals[5] ? vals[5] : "-", vals[6] ? vals[6] : "-",
                         vals[7] ? vals[7] : "-");
                th_expect_close(out, ref, N, fmax(1e-5, 3e-7 * sqrt((double)K)), what);
                if (runs[k].same == 'f')
                    memcpy(first, out, sizeof(double) * (size_t)N);
                else if (runs[k].same == 's')
                    ck_assert_msg(!memcmp(first, out, sizeof(double) * (size_t)N),
                                  "%s: differs from the mode's default launch", what);
            }
            for (int i = 1; i < N_KNOB; i++)
                unsetenv(knobs[i]);
            /* the switch: refused, out untouched */
            setenv(knobs[0], "0", 1);
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
            th_set(&to, o0);
            ck_assert_int_eq(llmem_op_norm_matmul(be, &p, &tx, gated ? &tz : NULL,
                                                  norm ? &tn : NULL, &tw, sw ? &tw2 : NULL, &to),
                             LLMEM_E_UNSUPPORTED);
            unsetenv(knobs[0]);
            ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
            th_get(&to, out);
            ck_assert_msg(!memcmp(out, o0, sizeof(double) * (size_t)N),
                          "LLMEM_VULKAN_NORM_MATMUL=0: out changed");
            th_end(&c);
        }
    printf("test_ops_norm_matmul: vulkan: %d knob settings x 6 cases checked\n",
           (int)(sizeof runs / sizeof runs[0]));
    for (int i = 0; i < N_KNOB; i++) /* a knob the runs set and that was unset: unset again */
        test_env_restore(&saved[i]);
    llmem_backend_close(be);
}
END_TEST

/* Vulkan's L2 prefetch ($LLMEM_VULKAN_L2_PREFETCH, vk_ops_norm_matmul.c):
 * a chain of three one-row products a -> b -> c (RMS + SwiGLU, gated +
 * add, none + store; distinct weights) run three times, so that from the
 * second round each dispatch also reads the first bytes of the next
 * product's weights (the whole slice, at $LLMEM_VULKAN_L2_PREFETCH_KB 1,
 * and the default); every output is within the float64 tolerance and
 * equal bit for bit to the run without the prefetch, and the weights are
 * unchanged. Then b's buffer is freed and a runs again (the remembered
 * successor must be dropped, not read). Other backends: nothing to check. */
START_TEST(test_norm_matmul_vulkan_prefetch)
{
    if (strcmp(th_backend_name(_i), "vulkan") != 0)
        return;
    static const char *const knobs[2] = {"LLMEM_VULKAN_L2_PREFETCH",
                                         "LLMEM_VULKAN_L2_PREFETCH_KB"};
    test_env saved[2] = {test_env_save(knobs[0]), test_env_save(knobs[1])};
    static const struct {
        const char *mode, *kb;
    } runs[] = {{"0", NULL}, {"1", NULL}, {"2", NULL}, {"1", "1"}, {"2", "1"}};
    enum { K = 2048, N = 160, NP = 3 };
    llmem_backend *be = th_open(_i);
    th_ctx c, cb;
    th_begin(&c, be);
    th_begin(&cb, be);
    ref64_rng r = ref64_rng_make(ref64_seed(), 9800);
    static const int norms[NP] = {LLMEM_NM_NORM_RMS, LLMEM_NM_NORM_GATED, LLMEM_NM_NORM_NONE};
    static const int epis[NP] = {LLMEM_NM_SWIGLU, LLMEM_NM_ADD, LLMEM_NM_STORE};
    double *x = th_vec(&c, K), *z = th_vec(&c, K), *nw = th_vec(&c, K), *o0 = th_vec(&c, N);
    double *a = th_vec(&c, K), *ps = th_vec(&c, N), *pu = th_vec(&c, N), *out = th_vec(&c, N);
    double *w[NP], *ref[NP], *first[NP], *w2 = th_vec(&c, (int64_t)N * K);
    ref64_fill(&r, x, K, -2, 2, F32);
    ref64_fill(&r, z, K, -3, 3, F32);
    ref64_fill(&r, nw, K, 0.5, 1.5, F32);
    ref64_fill(&r, o0, N, -4, 4, F32);
    ref64_fill(&r, w2, (int64_t)N * K, -1, 1, LLMEM_DTYPE_BF16);
    llmem_tensor tx = th_input(&c, F32, 2, 1, K, 1, x), tz = th_input(&c, F32, 2, 1, K, 1, z);
    llmem_tensor tn = th_input(&c, F32, 1, K, 1, 1, nw);
    llmem_tensor tw2 = th_input(&c, LLMEM_DTYPE_BF16, 2, N, K, 1, w2);
    llmem_tensor tw[NP], to = th_tensor(&c, F32, 2, 1, N, 1);
    llmem_norm_matmul_params p[NP];
    for (int j = 0; j < NP; j++) {
        w[j] = th_vec(&c, (int64_t)N * K);
        ref[j] = th_vec(&c, N);
        first[j] = th_vec(&c, N);
        ref64_fill(&r, w[j], (int64_t)N * K, -1, 1, LLMEM_DTYPE_BF16);
        tw[j] = th_input(j == 1 ? &cb : &c, LLMEM_DTYPE_BF16, 2, N, K, 1, w[j]);
        p[j] = (llmem_norm_matmul_params){.norm = norms[j], .epilogue = epis[j], .eps = 1e-5f};
        nm_ref(&p[j], x, norms[j] == LLMEM_NM_NORM_GATED ? z : NULL, norms[j] ? nw : NULL, w[j],
               epis[j] == LLMEM_NM_SWIGLU ? w2 : NULL, o0, 1, K, N, a, ps, pu, ref[j]);
    }
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        setenv(knobs[0], runs[k].mode, 1);
        runs[k].kb ? setenv(knobs[1], runs[k].kb, 1) : unsetenv(knobs[1]);
        ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK); /* read at open otherwise */
        for (int round = 0; round < 3; round++)
            for (int j = 0; j < NP; j++) {
                th_set(&to, o0);
                ck_assert_int_eq(
                    llmem_op_norm_matmul(be, &p[j], &tx,
                                         norms[j] == LLMEM_NM_NORM_GATED ? &tz : NULL,
                                         norms[j] ? &tn : NULL, &tw[j],
                                         epis[j] == LLMEM_NM_SWIGLU ? &tw2 : NULL, &to),
                    LLMEM_OK);
                th_get(&to, out);
                char what[160];
                snprintf(what, sizeof what, "vulkan prefetch=%s KB=%s product %d round %d",
                         runs[k].mode, runs[k].kb ? runs[k].kb : "-", j, round);
                th_expect_close(out, ref[j], N, fmax(1e-5, 3e-7 * sqrt((double)K)), what);
                if (k == 0 && round == 0)
                    memcpy(first[j], out, sizeof(double) * N);
                else
                    ck_assert_msg(!memcmp(first[j], out, sizeof(double) * N),
                                  "%s: differs from the run without the prefetch", what);
            }
    }
    for (int j = 0; j < NP; j++) { /* the weights the prefetch read are unchanged */
        double *back = th_vec(&c, (int64_t)N * K);
        th_get(&tw[j], back);
        ck_assert_msg(!memcmp(back, w[j], sizeof(double) * (size_t)N * K), "weight %d changed",
                      j);
    }
    th_end(&cb); /* frees b, a's remembered successor */
    setenv(knobs[0], "1", 1);
    unsetenv(knobs[1]);
    th_set(&to, o0);
    ck_assert_int_eq(llmem_op_norm_matmul(be, &p[0], &tx, NULL, &tn, &tw[0], &tw2, &to), LLMEM_OK);
    th_get(&to, out);
    ck_assert_msg(!memcmp(first[0], out, sizeof(double) * N), "a after b was freed differs");
    th_end(&c);
    printf("test_ops_norm_matmul: vulkan: L2 prefetch, %d settings x 3 products checked\n",
           (int)(sizeof runs / sizeof runs[0]));
    test_env_restore(&saved[0]);
    test_env_restore(&saved[1]);
    llmem_backend_close(be);
}
END_TEST

/* ---- a Mamba-2 decode front: in_proj, then the conv of its xBC slice ------------------------- */

/* in_proj [N = Z + CD + NH, K] (z, xBC, dt rows), d_conv, state slots */
enum { CV_K = 64, CV_Z = 18, CV_CD = 40, CV_NH = 5, CV_N = CV_Z + CV_CD + CV_NH, CV_DC = 4 };
enum { CV_SLOTS = 4 };

/* What runs between the product and the conv: nothing (the Vulkan backend
 * folds the conv into the product's dispatch), an unrelated op (the held
 * product is recorded alone first), or a copy of the slice that the conv
 * then reads (no fold: its input is not the product's output). */
typedef enum { CV_PLAIN, CV_BETWEEN, CV_ELSEWHERE, CV_MODES } cv_mode;

typedef struct cv_case {
    int32_t src, dst;
    llmem_dtype st, cw; /* state, conv weight and bias */
    bool bias;
} cv_case;

/* out = rms_norm(x) · wᵀ (llmem_op_norm_matmul: RMS, store) into act[0,
 * N), the conv of out[Z, Z + CD) into act[N, N + CD), one stream of one
 * token (k's slots; state image init); the product, the conv output and
 * the state image after into prod, co, after. */
static void cv_run(llmem_backend *be, const cv_case *k, cv_mode mode, const double *x,
                   const double *nw, const double *w, const double *cw, const double *cb,
                   const unsigned char *init, double *prod, double *co, unsigned char *after)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_state_desc d = {"conv", 2, {CV_DC - 1, CV_CD}, k->st};
    rs_setup rs = {1, 1, 0, CV_SLOTS, {k->src}, {k->dst}, {0}};
    llmem_view view;
    llmem_rs_view rsd;
    llmem_buffer *bufs[1];
    rs_build(&c, &view, &rsd, &rs, 1, &d, bufs, &init);
    llmem_tensor tx = th_input(&c, F32, 2, 1, CV_K, 1, x);
    llmem_tensor tn = th_input(&c, F32, 1, CV_K, 1, 1, nw);
    llmem_tensor tw = th_input(&c, LLMEM_DTYPE_BF16, 2, CV_N, CV_K, 1, w);
    llmem_tensor tcw = th_input(&c, k->cw, 3, CV_CD, 1, CV_DC, cw);
    llmem_tensor tcb = th_input(&c, k->cw, 1, CV_CD, 1, 1, cb);
    llmem_tensor act = th_tensor(&c, F32, 1, CV_N + CV_CD, 1, 1);
    llmem_tensor other = th_tensor(&c, F32, 2, 1, CV_CD, 1);
    llmem_tensor out = act, xin = act, cot = act;
    out.n_dims = xin.n_dims = cot.n_dims = 2;
    out.ne[0] = xin.ne[0] = cot.ne[0] = 1;
    out.ne[1] = CV_N;
    xin.ne[1] = cot.ne[1] = CV_CD;
    xin.offset += (size_t)CV_Z * 4;
    cot.offset += (size_t)CV_N * 4;
    th_set(&other, x);
    llmem_norm_matmul_params p = {.norm = LLMEM_NM_NORM_RMS, .epilogue = LLMEM_NM_STORE,
                                  .eps = 1e-5f};
    ck_assert_int_eq(llmem_op_norm_matmul(be, &p, &tx, NULL, &tn, &tw, NULL, &out), LLMEM_OK);
    if (mode == CV_BETWEEN)
        ck_assert_int_eq(llmem_op_scale(be, &other, 2.0f, &other), LLMEM_OK);
    if (mode == CV_ELSEWHERE)
        ck_assert_int_eq(llmem_op_copy(be, &out, CV_Z, &other), LLMEM_OK);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, mode == CV_ELSEWHERE ? &other : &xin, &tcw,
                                       k->bias ? &tcb : NULL, &cot),
                     LLMEM_OK);
    th_get(&out, prod);
    th_get(&cot, co);
    ck_assert_int_eq(llmem_buffer_download(bufs[0], 0, after, llmem_buffer_size(bufs[0])),
                     LLMEM_OK);
    th_end(&c);
}

/* The front of a Mamba-2 decode step as the model runs it at one token
 * (models/forward.c: in_proj with the input RMS norm, then the conv of
 * the xBC slice in place), where the Vulkan backend runs the conv in the
 * product's epilogue (norm_matvec16_conv; off with
 * $LLMEM_VULKAN_NM_CONV=0). The product against a float64 norm and
 * product, the conv output against ref64_conv_token over the float64
 * product, the state written to dst exactly (the source's last DC - 2
 * inputs, then the product's f32 output, in the state dtype), every other
 * slot unchanged; on Vulkan also bit-identical with the conv recorded
 * alone. Slots: in place, another slot, a zero state (src -1), no
 * destination (dst -1); f32 and bf16 states and conv weights, with and
 * without a bias; and, per case, an op recorded in between and a conv
 * that reads a copy (where nothing may be folded). */
START_TEST(test_norm_matmul_conv)
{
    static const cv_case cases[] = {
        {1, 1, F32, F32, true},  {2, 0, F32, LLMEM_DTYPE_BF16, true},
        {-1, 3, LLMEM_DTYPE_BF16, F32, false}, {1, -1, F32, F32, true},
        {3, 3, LLMEM_DTYPE_BF16, LLMEM_DTYPE_BF16, false},
    };
    bool vk = strcmp(th_backend_name(_i), "vulkan") == 0;
    test_env saved = test_env_save("LLMEM_VULKAN_NM_CONV");
    llmem_backend *be = th_open(_i);
    th_ctx h;
    th_begin(&h, NULL);
    ref64_rng r = ref64_rng_make(ref64_seed(), 9900);
    double *x = th_vec(&h, CV_K), *nw = th_vec(&h, CV_K), *w = th_vec(&h, (int64_t)CV_N * CV_K);
    double *a = th_vec(&h, CV_K), *s = th_vec(&h, CV_N), *prod = th_vec(&h, CV_N);
    double *cw = th_vec(&h, CV_CD * CV_DC), *cb = th_vec(&h, CV_CD), *co = th_vec(&h, CV_CD);
    double *st = th_vec(&h, (CV_DC - 1) * CV_CD), *ref = th_vec(&h, CV_CD);
    double *got = th_vec(&h, (CV_DC - 1) * CV_CD), *prod0 = th_vec(&h, CV_N);
    double *co0 = th_vec(&h, CV_CD);
    ref64_fill(&r, x, CV_K, -2, 2, F32);
    ref64_fill(&r, nw, CV_K, 0.5, 1.5, F32);
    ref64_fill(&r, w, (int64_t)CV_N * CV_K, -1, 1, LLMEM_DTYPE_BF16);
    ref64_rms_norm(x, nw, 1, CV_K, 1e-5, a);
    ref64_matmul(a, w, 1, CV_K, CV_N, s);
    int runs = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const cv_case *k = &cases[ci];
        llmem_state_desc d = {"conv", 2, {CV_DC - 1, CV_CD}, k->st};
        ref64_fill(&r, cw, CV_CD * CV_DC, -1, 1, k->cw);
        ref64_fill(&r, cb, CV_CD, -0.5, 0.5, k->cw);
        bool live[CV_SLOTS] = {1, 1, 1, 1};
        unsigned char *init = rs_state_image(&h, &r, &d, CV_SLOTS, live, -2, 2);
        size_t bytes = (size_t)CV_SLOTS * (CV_DC - 1) * CV_CD * (k->st == F32 ? 4 : 2);
        unsigned char *after = th_alloc(&h, bytes), *after0 = th_alloc(&h, bytes);
        /* float64: the conv of the exact product from the source state */
        if (k->src >= 0)
            rs_decode_slot(init, &d, k->src, st);
        else
            memset(st, 0, sizeof(double) * (CV_DC - 1) * CV_CD);
        double *old = th_vec(&h, (CV_DC - 1) * CV_CD);
        memcpy(old, st, sizeof(double) * (CV_DC - 1) * CV_CD);
        ref64_conv_token(st, s + CV_Z, cw, k->bias ? cb : NULL, CV_CD, CV_DC, ref);
        for (int mode = 0; mode < CV_MODES; mode++)
            for (int fold = vk ? 1 : 0; fold >= 0; fold--) {
                test_env_put("LLMEM_VULKAN_NM_CONV", fold ? "1" : "0");
                ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
                cv_run(be, k, (cv_mode)mode, x, nw, w, cw, cb, init, prod, co, after);
                char what[128];
                snprintf(what, sizeof what, "%s case %zu mode %d fold %d", th_backend_name(_i),
                         ci, mode, fold);
                th_expect_close(prod, s, CV_N, 1e-5, what);
                th_expect_close(co, ref, CV_CD, 1e-5, what);
                for (int32_t sl = 0; sl < CV_SLOTS; sl++) {
                    size_t sb = bytes / CV_SLOTS;
                    if (sl != k->dst) {
                        ck_assert_msg(!memcmp(after + sl * sb, init + sl * sb, sb),
                                      "%s: slot %d changed", what, sl);
                        continue;
                    }
                    rs_decode_slot(after, &d, sl, got);
                    for (int32_t c = 0; c < CV_CD; c++)
                        for (int32_t j = 0; j < CV_DC - 1; j++) {
                            double want = j + 1 < CV_DC - 1 ? old[(j + 1) * CV_CD + c]
                                                            : ref64_round(prod[CV_Z + c], k->st);
                            ck_assert_msg(got[j * CV_CD + c] == want,
                                          "%s: state of channel %d, row %d: %g, want %g", what,
                                          c, j, got[j * CV_CD + c], want);
                        }
                }
                if (fold) { /* the unfused run of this mode (next) must match it bit for bit */
                    memcpy(prod0, prod, sizeof(double) * CV_N);
                    memcpy(co0, co, sizeof(double) * CV_CD);
                    memcpy(after0, after, bytes);
                } else if (vk) {
                    ck_assert_msg(!memcmp(prod0, prod, sizeof(double) * CV_N) &&
                                      !memcmp(co0, co, sizeof(double) * CV_CD) &&
                                      !memcmp(after0, after, bytes),
                                  "%s: the fold's outputs differ from the unfused ones", what);
                }
                runs++;
            }
    }
    test_env_restore(&saved);
    th_end(&h);
    printf("test_ops_norm_matmul: %s: in_proj + conv, %d runs checked\n", th_backend_name(_i),
           runs);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_norm_matmul: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_norm_matmul");
    TCase *tc = tcase_create("ops_norm_matmul");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_norm_matmul, 0, n);
    tcase_add_loop_test(tc, test_norm_matmul_invalid, 0, n);
    tcase_add_loop_test(tc, test_norm_matmul_cpu_max_k, 0, n);
    tcase_add_loop_test(tc, test_norm_matmul_vulkan_knobs, 0, n);
    tcase_add_loop_test(tc, test_norm_matmul_vulkan_prefetch, 0, n);
    tcase_add_loop_test(tc, test_norm_matmul_conv, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

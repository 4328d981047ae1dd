// ctest-labels: core
/* Op conformance suite, fused ops: llmem_op_matmul_swiglu (and
 * llmem_op_add_rms_norm, test_add_rms_norm) on every backend
 * that opens ($LLMEM_TEST_BACKENDS, default "cpu,vulkan,cuda"; a backend
 * without the op is skipped with a message), against a float64
 * silu(a · gateᵀ) * (a · upᵀ) written here. Shapes cover the fused
 * batch-1 GEMV (M <= 4, 16-byte rows), rows it cannot vectorize (K = 7)
 * and the unfused path (M > 4); outputs start as NaN.
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

START_TEST(test_matmul_swiglu)
{
    static const int32_t shapes[][3] = {{1, 256, 64}, {3, 1024, 37}, {4, 4096, 96}, {2, 7, 5},
                                        {9, 512, 40}, {1, 1, 1}, {40, 1024, 300},
                                        /* Vulkan's matvec16 at 8 rows: one pass where
                                         * its shared sums fit, two where they do not */
                                        {8, 264, 21}};
    static const llmem_dtype wts[3] = {LLMEM_DTYPE_BF16, LLMEM_DTYPE_F16, F32};
    llmem_backend *be = th_open(_i);
    for (int d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
            ref64_rng r = ref64_rng_make(ref64_seed(), 6000 + d * 16 + s);
            th_ctx c;
            th_begin(&c, be);
            double *a = th_vec(&c, (int64_t)m * k), *g = th_vec(&c, (int64_t)n * k);
            double *u = th_vec(&c, (int64_t)n * k), *out = th_vec(&c, (int64_t)m * n);
            double *pg = th_vec(&c, (int64_t)m * n), *pu = th_vec(&c, (int64_t)m * n);
            double *ref = th_vec(&c, (int64_t)m * n);
            ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
            ref64_fill(&r, g, (int64_t)n * k, -1, 1, wts[d]);
            ref64_fill(&r, u, (int64_t)n * k, -1, 1, wts[d]);
            ref64_matmul(a, g, m, k, n, pg);
            ref64_matmul(a, u, m, k, n, pu);
            for (int64_t i = 0; i < (int64_t)m * n; i++)
                ref[i] = ref64_silu(pg[i]) * pu[i];
            llmem_tensor ta = th_input(&c, F32, 2, m, k, 1, a);
            llmem_tensor tg = th_input(&c, wts[d], 2, n, k, 1, g);
            llmem_tensor tu = th_input(&c, wts[d], 2, n, k, 1, u);
            llmem_tensor to = th_tensor(&c, F32, 2, m, n, 1);
            llmem_status st = llmem_op_matmul_swiglu(be, &ta, &tg, &tu, &to);
            if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(_i)) {
                printf("test_ops_fused: %s has no matmul_swiglu, skipped\n", th_backend_name(_i));
                th_end(&c);
                llmem_backend_close(be);
                return;
            }
            ck_assert_int_eq(st, LLMEM_OK);
            th_get(&to, out);
            char what[96];
            snprintf(what, sizeof what, "matmul_swiglu M=%d K=%d N=%d w=%s", m, k, n,
                     llmem_dtype_name(wts[d]));
            th_expect_close(out, ref, (int64_t)m * n, 1e-5, what);
            /* argument checks: dtypes of gate and up differ; out overlaps a */
            if (d == 0 && s == 0) {
                llmem_tensor tf = th_input(&c, F32, 2, n, k, 1, u);
                ck_assert_int_eq(llmem_op_matmul_swiglu(be, &ta, &tg, &tf, &to), LLMEM_E_INVALID);
                ck_assert_int_eq(llmem_op_matmul_swiglu(be, &ta, &tg, &tu, &ta), LLMEM_E_INVALID);
            }
            th_end(&c);
        }
    llmem_backend_close(be);
}
END_TEST

/* llmem_op_add_rms_norm against float64 (x' = x + r, out = x' / sqrt(mean(x'^2) + eps) * w)
 * and, bit for bit, against llmem_op_add then llmem_op_rms_norm on the same backend;
 * out separate and out == r; weights of each dtype and none. */
START_TEST(test_add_rms_norm)
{
    static const int32_t shapes[][2] = {{1, 4096}, {3, 1000}, {16, 256}, {2, 7}};
    static const llmem_dtype wts[4] = {LLMEM_DTYPE_BF16, LLMEM_DTYPE_F16, F32, F32};
    llmem_backend *be = th_open(_i);
    for (int d = 0; d < 4; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int alias = 0; alias < 2; alias++) {
                int32_t m = shapes[s][0], n = shapes[s][1];
                int64_t mn = (int64_t)m * n;
                bool now = d == 3; /* no weight */
                ref64_rng r = ref64_rng_make(ref64_seed(), 7000 + d * 16 + s * 2 + alias);
                th_ctx c;
                th_begin(&c, be);
                double *x = th_vec(&c, mn), *rs = th_vec(&c, mn), *w = th_vec(&c, n);
                double *rx = th_vec(&c, mn), *ro = th_vec(&c, mn), *gx = th_vec(&c, mn);
                double *go = th_vec(&c, mn), *ex = th_vec(&c, mn), *eo = th_vec(&c, mn);
                ref64_fill(&r, x, mn, -2, 2, F32);
                ref64_fill(&r, rs, mn, -2, 2, F32);
                ref64_fill(&r, w, n, 0.5, 1.5, wts[d]);
                for (int32_t i = 0; i < m; i++) {
                    double ss = 0;
                    for (int32_t j = 0; j < n; j++) {
                        double v = (double)(float)(x[i * n + j] + rs[i * n + j]);
                        rx[i * n + j] = v;
                        ss += v * v;
                    }
                    double sc = 1.0 / sqrt(ss / n + 1e-5);
                    for (int32_t j = 0; j < n; j++)
                        ro[i * n + j] = rx[i * n + j] * sc * (now ? 1.0 : w[j]);
                }
                llmem_tensor tx = th_input(&c, F32, 2, m, n, 1, x);
                llmem_tensor tr = th_input(&c, F32, 2, m, n, 1, rs);
                llmem_tensor tw = th_input(&c, wts[d], 1, n, 1, 1, w);
                llmem_tensor to = alias ? tr : th_tensor(&c, F32, 2, m, n, 1);
                ck_assert_int_eq(llmem_op_add_rms_norm(be, &tx, &tr, now ? NULL : &tw, 1e-5f, &to),
                                 LLMEM_OK);
                th_get(&tx, gx);
                th_get(&to, go);
                char what[96];
                snprintf(what, sizeof what, "add_rms_norm %dx%d w=%s%s", m, n,
                         now ? "none" : llmem_dtype_name(wts[d]), alias ? " out=r" : "");
                th_expect_close(gx, rx, mn, 1e-6, what);
                th_expect_close(go, ro, mn, 1e-5, what);
                /* the unfused pair on fresh copies */
                llmem_tensor ux = th_input(&c, F32, 2, m, n, 1, x);
                llmem_tensor ur = th_input(&c, F32, 2, m, n, 1, rs);
                llmem_tensor uo = alias ? ur : th_tensor(&c, F32, 2, m, n, 1);
                ck_assert_int_eq(llmem_op_add(be, &ux, &ur, &ux), LLMEM_OK);
                ck_assert_int_eq(llmem_op_rms_norm(be, &ux, now ? NULL : &tw, 1e-5f, &uo),
                                 LLMEM_OK);
                th_get(&ux, ex);
                th_get(&uo, eo);
                ck_assert_msg(!memcmp(gx, ex, sizeof(double) * (size_t)mn) &&
                                  !memcmp(go, eo, sizeof(double) * (size_t)mn),
                              "%s on %s: differs from add then rms_norm", what,
                              th_backend_name(_i));
                if (d == 0 && s == 1 && alias == 0) { /* out overlaps x; r is x */
                    ck_assert_int_eq(llmem_op_add_rms_norm(be, &tx, &tr, &tw, 1e-5f, &tx),
                                     LLMEM_E_INVALID);
                    ck_assert_int_eq(llmem_op_add_rms_norm(be, &tx, &tx, &tw, 1e-5f, &to),
                                     LLMEM_E_INVALID);
                }
                th_end(&c);
            }
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_fused: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_fused");
    TCase *tc = tcase_create("ops_fused");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_matmul_swiglu, 0, n);
    tcase_add_loop_test(tc, test_add_rms_norm, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

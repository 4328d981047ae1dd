// ctest-labels: core
/* Op conformance suite, fused ops: llmem_op_matmul_swiglu on every backend
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

#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32

START_TEST(test_matmul_swiglu)
{
    static const int32_t shapes[][3] = {{1, 256, 64}, {3, 1024, 37}, {4, 4096, 96}, {2, 7, 5},
                                        {9, 512, 40}, {1, 1, 1}};
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

int main(void)
{
    printf("test_ops_fused: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_fused");
    TCase *tc = tcase_create("ops_fused");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_matmul_swiglu, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

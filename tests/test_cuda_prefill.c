// ctest-labels: cuda
/* The cuda plugin's prefill paths of the FAST precision mode: the bf16
 * shadow (backends/cuda/cuda_ops.c) and the 16-byte copy and SwiGLU kernels
 * (kernels/prefill.cu). On a machine without a GPU every test skips.
 *
 * An RMS norm, add + RMS norm, gated RMS norm or SwiGLU of more than 4 rows
 * writes a bf16 copy of its output that llmem_op_matmul_fast then reads
 * instead of rounding the f32 tensor again. Checked here:
 *   - each producer followed by one and by two fast GEMMs (q/k/v and
 *     gate/up read one input twice) against a float64 reference: the
 *     producer in float64, its result rounded to f32 then to bf16 (what the
 *     op contract allows), the product in float64 (normalized error);
 *   - the same GEMMs bit for bit equal to a fast GEMM of the downloaded and
 *     re-uploaded producer output (the rounding pass the shadow replaces);
 *   - staleness: after the producer, the tensor rewritten by an upload or
 *     by another op (scale), or a different tensor of the same size, must
 *     give the product of the new values;
 *   - precise matmuls after a producer keep f32 accuracy (they never read
 *     the shadow);
 *   - the 16-byte column copy (aligned slices) and the scalar fallback
 *     (unaligned start column) equal the source columns exactly, and SwiGLU
 *     on the 4-wide kernel and the scalar one (odd length) is within f32
 *     rounding of float64.
 *
 * As in test_cuda.c, main() never opens "cuda": each test opens it itself
 * (run with CK_FORK=no on a GPU machine).
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"
#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define BF16 LLMEM_DTYPE_BF16

enum { M = 40, K = 256, N = 72 };

/* ref[M, N] = bf16(f32(h)) · wᵀ in float64 (the fast GEMM's input). */
static void fast_ref(const double *h, const double *w, int64_t m, int64_t k, int64_t n,
                     double *ref, double *tmp)
{
    for (int64_t i = 0; i < m * k; i++)
        tmp[i] = ref64_round(ref64_round(h[i], F32), BF16);
    ref64_matmul(tmp, w, m, k, n, ref);
}

/* out = matmul_fast(a, w), downloaded. */
static void fast_mm(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *w,
                    const llmem_tensor *o, double *out)
{
    ck_assert_int_eq(llmem_op_matmul_fast(be, a, w, o), LLMEM_OK);
    th_get(o, out);
}

/* matmul_fast of a copy of a made by download + upload (no shadow) must give
 * the same bytes as `got`. */
static void expect_same_as_rounding_pass(th_ctx *h, llmem_backend *be, const llmem_tensor *a,
                                         const llmem_tensor *w, const double *got,
                                         const char *what)
{
    int64_t ma = (int64_t)a->ne[0] * a->ne[1], mo = (int64_t)a->ne[0] * w->ne[0];
    double *v = th_vec(h, ma), *again = th_vec(h, mo);
    th_get(a, v);
    llmem_tensor c = th_input(h, F32, 2, a->ne[0], a->ne[1], 1, v);
    llmem_tensor o = th_tensor(h, F32, 2, a->ne[0], w->ne[0], 1);
    fast_mm(be, &c, w, &o, again);
    th_expect_same_bytes(got, again, (size_t)mo * sizeof(double), what);
}

START_TEST(test_shadow_norms)
{
    llmem_backend *be = test_open_or_skip("cuda");
    if (!be)
        return;
    ref64_rng r = ref64_rng_make(ref64_seed(), 9100);
    th_ctx h;
    th_begin(&h, be);
    double *x = th_vec(&h, M * K), *res = th_vec(&h, M * K), *g = th_vec(&h, K);
    double *w1 = th_vec(&h, N * K), *w2 = th_vec(&h, N * K), *xs = th_vec(&h, M * K);
    double *hn = th_vec(&h, M * K), *tmp = th_vec(&h, M * K);
    double *ref = th_vec(&h, M * N), *out = th_vec(&h, M * N);
    ref64_fill(&r, x, M * K, -2, 2, F32);
    ref64_fill(&r, res, M * K, -1, 1, F32);
    ref64_fill(&r, g, K, 0.5, 1.5, BF16);
    ref64_fill(&r, w1, N * K, -1, 1, BF16);
    ref64_fill(&r, w2, N * K, -1, 1, BF16);
    llmem_tensor tx = th_input(&h, F32, 2, M, K, 1, x), tr = th_input(&h, F32, 2, M, K, 1, res);
    llmem_tensor tg = th_input(&h, BF16, 1, K, 1, 1, g);
    llmem_tensor tw1 = th_input(&h, BF16, 2, N, K, 1, w1), tw2 = th_input(&h, BF16, 2, N, K, 1, w2);
    llmem_tensor th = th_tensor(&h, F32, 2, M, K, 1), to = th_tensor(&h, F32, 2, M, N, 1);
    const float eps = 1e-5f;
    /* a first fast GEMM of this size turns the shadow on (as a model's first
     * prefill GEMM does) */
    fast_mm(be, &tx, &tw1, &to, out);
    for (int64_t i = 0; i < M * K; i++)
        tmp[i] = ref64_round(x[i], BF16);
    ref64_matmul(tmp, w1, M, K, N, ref);
    th_expect_close(out, ref, M * N, 1e-5, "fast GEMM of an uploaded input");

    /* rms_norm -> two GEMMs over its output */
    ck_assert_int_eq(llmem_op_rms_norm(be, &tx, &tg, eps, &th), LLMEM_OK);
    ref64_rms_norm(x, g, M, K, eps, hn);
    for (int pass = 0; pass < 2; pass++) {
        const llmem_tensor *w = pass ? &tw2 : &tw1;
        fast_mm(be, &th, w, &to, out);
        fast_ref(hn, pass ? w2 : w1, M, K, N, ref, tmp);
        th_expect_close(out, ref, M * N, 2e-3, pass ? "rms_norm -> 2nd GEMM" : "rms_norm -> GEMM");
    }
    expect_same_as_rounding_pass(&h, be, &th, &tw2, out, "rms_norm GEMM = rounding pass");

    /* add_rms_norm with out = r (the model's form) -> GEMM */
    llmem_tensor tr2 = th_input(&h, F32, 2, M, K, 1, res);
    ck_assert_int_eq(llmem_op_add_rms_norm(be, &tx, &tr2, &tg, eps, &tr2), LLMEM_OK);
    for (int64_t i = 0; i < M * K; i++)
        xs[i] = ref64_round(x[i] + res[i], F32);
    ref64_rms_norm(xs, g, M, K, eps, hn);
    fast_mm(be, &tr2, &tw1, &to, out);
    fast_ref(hn, w1, M, K, N, ref, tmp);
    th_expect_close(out, ref, M * N, 2e-3, "add_rms_norm -> GEMM");
    expect_same_as_rounding_pass(&h, be, &tr2, &tw1, out, "add_rms_norm GEMM = rounding pass");

    /* staleness 1: the norm's output rewritten by an upload */
    ck_assert_int_eq(llmem_op_rms_norm(be, &tr, &tg, eps, &th), LLMEM_OK);
    th_set(&th, x);
    fast_mm(be, &th, &tw1, &to, out);
    fast_ref(x, w1, M, K, N, ref, tmp);
    th_expect_close(out, ref, M * N, 1e-5, "GEMM after an upload over the norm's output");
    /* staleness 2: rewritten by another op */
    ck_assert_int_eq(llmem_op_rms_norm(be, &tr, &tg, eps, &th), LLMEM_OK);
    ck_assert_int_eq(llmem_op_scale(be, &th, 4.0f, &th), LLMEM_OK);
    ref64_rms_norm(res, g, M, K, eps, hn);
    for (int64_t i = 0; i < M * K; i++)
        hn[i] = 4.0 * ref64_round(hn[i], F32);
    fast_mm(be, &th, &tw1, &to, out);
    fast_ref(hn, w1, M, K, N, ref, tmp);
    th_expect_close(out, ref, M * N, 2e-3, "GEMM after scale over the norm's output");
    /* staleness 3: a different tensor of the same size (tx holds x + res
     * since the add_rms_norm above) */
    ck_assert_int_eq(llmem_op_rms_norm(be, &tr, &tg, eps, &th), LLMEM_OK);
    fast_mm(be, &tx, &tw1, &to, out);
    fast_ref(xs, w1, M, K, N, ref, tmp);
    th_expect_close(out, ref, M * N, 1e-5, "GEMM of another tensor after a norm");
    /* precise mode after a producer: f32 accuracy */
    ck_assert_int_eq(llmem_op_rms_norm(be, &tr, &tg, eps, &th), LLMEM_OK);
    ck_assert_int_eq(llmem_op_matmul(be, &th, &tw1, &to), LLMEM_OK);
    th_get(&to, out);
    ref64_rms_norm(res, g, M, K, eps, hn);
    ref64_matmul(hn, w1, M, K, N, ref);
    th_expect_close(out, ref, M * N, 1e-5, "precise GEMM after a norm");

    /* gated norm (2 groups) -> GEMM */
    double *z = th_vec(&h, M * K);
    ref64_fill(&r, z, M * K, -3, 3, F32);
    llmem_tensor tz = th_input(&h, F32, 2, M, K, 1, z), ty = th_input(&h, F32, 2, M, K, 1, x);
    ck_assert_int_eq(llmem_op_rms_norm_gated(be, &ty, &tz, &tg, 2, eps, &ty), LLMEM_OK);
    ref64_rms_norm_gated(x, z, g, M, K, 2, eps, hn);
    fast_mm(be, &ty, &tw2, &to, out);
    fast_ref(hn, w2, M, K, N, ref, tmp);
    th_expect_close(out, ref, M * N, 2e-3, "rms_norm_gated -> GEMM");
    expect_same_as_rounding_pass(&h, be, &ty, &tw2, out, "gated GEMM = rounding pass");
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_shadow_swiglu_copy)
{
    llmem_backend *be = test_open_or_skip("cuda");
    if (!be)
        return;
    ref64_rng r = ref64_rng_make(ref64_seed(), 9200);
    th_ctx h;
    th_begin(&h, be);
    enum { I = 200, SRC = 100 };
    double *gate = th_vec(&h, M * I), *up = th_vec(&h, M * I), *wd = th_vec(&h, N * I);
    double *sw = th_vec(&h, M * I), *got = th_vec(&h, M * I), *tmp = th_vec(&h, M * I);
    double *ref = th_vec(&h, M * N), *out = th_vec(&h, M * N);
    ref64_fill(&r, gate, M * I, -6, 6, F32);
    ref64_fill(&r, up, M * I, -2, 2, F32);
    ref64_fill(&r, wd, N * I, -1, 1, BF16);
    llmem_tensor tg = th_input(&h, F32, 2, M, I, 1, gate), tu = th_input(&h, F32, 2, M, I, 1, up);
    llmem_tensor tw = th_input(&h, BF16, 2, N, I, 1, wd), to = th_tensor(&h, F32, 2, M, N, 1);
    fast_mm(be, &tu, &tw, &to, out); /* turns the shadow on */
    for (int64_t i = 0; i < M * I; i++)
        sw[i] = ref64_silu(gate[i]) * up[i];
    /* in place into up, as the model runs it */
    ck_assert_int_eq(llmem_op_swiglu(be, &tg, &tu, &tu), LLMEM_OK);
    th_get(&tu, got);
    th_expect_close_elem(got, sw, M * I, 1e-6, "swiglu (4-wide kernel)");
    fast_mm(be, &tu, &tw, &to, out);
    fast_ref(sw, wd, M, I, N, ref, tmp);
    th_expect_close(out, ref, M * N, 2e-3, "swiglu -> GEMM");
    expect_same_as_rounding_pass(&h, be, &tu, &tw, out, "swiglu GEMM = rounding pass");
    /* an odd element count takes the scalar kernel */
    llmem_tensor og = th_input(&h, F32, 1, 333, 1, 1, gate), ou = th_input(&h, F32, 1, 333, 1, 1, up);
    llmem_tensor oo = th_tensor(&h, F32, 1, 333, 1, 1);
    ck_assert_int_eq(llmem_op_swiglu(be, &og, &ou, &oo), LLMEM_OK);
    th_get(&oo, got);
    th_expect_close_elem(got, sw, 333, 1e-6, "swiglu (scalar kernel)");

    /* column copies: aligned slice (16-byte kernel) and unaligned start */
    double *src = th_vec(&h, M * SRC), *cp = th_vec(&h, M * SRC), *want = th_vec(&h, M * SRC);
    ref64_fill(&r, src, M * SRC, -1, 1, F32);
    llmem_tensor ts = th_input(&h, F32, 2, M, SRC, 1, src);
    static const int32_t col0[3] = {8, 3, 96}, cols[3] = {40, 40, 4};
    for (int c = 0; c < 3; c++) {
        llmem_tensor td = th_tensor(&h, F32, 2, M, cols[c], 1);
        ck_assert_int_eq(llmem_op_copy(be, &ts, col0[c], &td), LLMEM_OK);
        th_get(&td, cp);
        for (int32_t i = 0; i < M; i++)
            for (int32_t j = 0; j < cols[c]; j++)
                want[i * cols[c] + j] = src[i * SRC + col0[c] + j];
        char what[64];
        snprintf(what, sizeof what, "copy of columns [%d, %d)", col0[c], col0[c] + cols[c]);
        th_expect_same_bytes(cp, want, (size_t)M * cols[c] * sizeof(double), what);
    }
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_cuda_prefill: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    Suite *s = suite_create("cuda_prefill");
    TCase *tc = tcase_create("cuda_prefill");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_shadow_norms);
    tcase_add_test(tc, test_shadow_swiglu_copy);
    suite_add_tcase(s, tc);
    /* without a usable cuda backend only the checks that need no device ran:
     * skipped (77), not passed */
    return test_exit_status(test_run_suite(s), "cuda", "test_cuda_prefill");
}

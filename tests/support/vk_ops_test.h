/* Helpers shared by the Vulkan op suites test_vulkan_ops.c and
 * test_vulkan_matmul.c (one suite, split by topic): f32 tensors in
 * buffers of their own, weights converted on the device, a relative
 * error, random vectors, and a matmul run and compared on two backends.
 * Header-only over support/vk_test.h: each suite is its own program. */
#ifndef LLMEM_TESTS_VK_OPS_TEST_H
#define LLMEM_TESTS_VK_OPS_TEST_H

#include <math.h>
#include <string.h>

#include "support/vk_test.h"

/* A tensor of f32 [n0, n1, n2] (nd dims) in a new buffer of be (*keep,
 * the caller frees it), holding v when not NULL. */
static inline llmem_tensor up_f32(llmem_backend *be, llmem_buffer **keep, const float *v, int nd,
                                  int32_t n0, int32_t n1, int32_t n2)
{
    llmem_tensor t = {NULL, 0, F32, nd, {n0, n1, n2, 1}};
    size_t bytes = llmem_tensor_nbytes(&t);
    OK(llmem_buffer_alloc(be, bytes ? bytes : 4, keep));
    t.buf = *keep;
    if (v && bytes)
        OK(llmem_buffer_upload(*keep, 0, v, bytes));
    return t;
}

/* ||a - b|| / ||b|| over n elements (each of a finite). */
static inline double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(a[i]), "non-finite output at %zu", i);
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Weights w [n, k] of dtype wt in a new buffer of be (*keep), converted on
 * the device from their f32 upload (*keep_f32; llmem_op_copy: exact when w
 * holds wt's values); the caller frees both buffers. */
static inline llmem_tensor up_weight(llmem_backend *be, llmem_buffer **keep_f32,
                                     llmem_buffer **keep, const float *w, int32_t n, int32_t k,
                                     llmem_dtype wt)
{
    llmem_tensor tw = up_f32(be, keep_f32, w, 2, n, k, 1);
    llmem_tensor t = {NULL, 0, wt, 2, {n, k, 1, 1}};
    OK(llmem_buffer_alloc(be, llmem_tensor_nbytes(&t), keep));
    t.buf = *keep;
    OK(llmem_op_copy(be, &tw, 0, &t));
    return t;
}

/* out[m, n] = a[m, k] · w[n, k]ᵀ on be (llmem_op_matmul, or matmul_fast
 * when fast), with w uploaded as f32 and converted to dtype wt on the
 * device (llmem_op_copy: exact when w holds wt's values). */
static inline void run_matmul(llmem_backend *be, const float *a, const float *w, int32_t m,
                              int32_t k, int32_t n, llmem_dtype wt, bool fast, float *out)
{
    llmem_buffer *ba, *bw, *bw2, *bo;
    llmem_tensor ta = up_f32(be, &ba, a, 2, m, k, 1);
    llmem_tensor tw2 = up_weight(be, &bw, &bw2, w, n, k, wt);
    llmem_tensor to = up_f32(be, &bo, NULL, 2, m, n, 1);
    OK(fast ? llmem_op_matmul_fast(be, &ta, &tw2, &to) : llmem_op_matmul(be, &ta, &tw2, &to));
    get_f32(&to, out);
    llmem_buffer_free(ba), llmem_buffer_free(bw), llmem_buffer_free(bw2), llmem_buffer_free(bo);
}

/* A random a[m, k] times w[n, k] (as dtype wt) on vk and on cpu agree
 * within 1e-5 relative error. */
static inline void compare_matmul(llmem_backend *vk, llmem_backend *cpu, int32_t m, int32_t k,
                                  int32_t n, llmem_dtype wt)
{
    float *a = rand_vec((size_t)m * k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
    float *o[2] = {malloc((size_t)m * n * 4), malloc((size_t)m * n * 4)};
    ck_assert_ptr_nonnull(o[0]);
    ck_assert_ptr_nonnull(o[1]);
    run_matmul(vk, a, w, m, k, n, wt, false, o[0]);
    run_matmul(cpu, a, w, m, k, n, wt, false, o[1]);
    double e = rel_err(o[0], o[1], (size_t)m * n);
    ck_assert_msg(e <= 1e-5, "matmul %dx%dx%d %s: error %g", m, k, n, llmem_dtype_name(wt), e);
    free(a), free(w), free(o[0]), free(o[1]);
}

#endif

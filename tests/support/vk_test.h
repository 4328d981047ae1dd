/* Helpers shared by the Vulkan suites (test_vulkan*.c): tensors uploaded
 * from host arrays (f32, bf16), float64 references of the products and
 * norms they check (vk_ref_*), tolerances and comparisons, a seeded
 * xorshift generator ($LLMEM_TEST_SEED), the "does vulkan open here" probe
 * and $LLMEM_VULKAN_LOG redirection. Header-only: each suite is its own
 * program. */
#ifndef LLMEM_TESTS_VK_TEST_H
#define LLMEM_TESTS_VK_TEST_H

#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/ops.h"
#include "support/run.h"

#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define HAVE_VULKAN_H 1
#define VK_NO_PROTOTYPES
#include <dlfcn.h>
#include <vulkan/vulkan.h>
#endif
#endif

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define I32 LLMEM_DTYPE_I32
#define OK(expr) ck_assert_int_eq((expr), LLMEM_OK)

/* An f32 tensor [n0, n1] (1-D [n0] when n1 <= 0) in a new buffer *keep of
 * be (the caller frees it), filled from v when v is not NULL. */
static inline llmem_tensor vk_up_f32_2d(llmem_backend *be, llmem_buffer **keep, const float *v,
                                        int32_t n0, int32_t n1)
{
    llmem_tensor t = {NULL, 0, F32, n1 > 0 ? 2 : 1, {n0, n1 > 0 ? n1 : 1, 1, 1}};
    size_t bytes = llmem_tensor_nbytes(&t);
    OK(llmem_buffer_alloc(be, bytes, keep));
    t.buf = *keep;
    if (v)
        OK(llmem_buffer_upload(*keep, 0, v, bytes));
    return t;
}

/* [n, k] weights as bf16 in a new buffer *keep (the caller frees it),
 * uploaded as f32 and copied to bf16 on the device: the values should be
 * bf16-exact. */
static inline llmem_tensor vk_up_bf16_2d(llmem_backend *be, llmem_buffer **keep, const float *w,
                                         int32_t n, int32_t k)
{
    llmem_buffer *tmp;
    llmem_tensor tw = vk_up_f32_2d(be, &tmp, w, n, k);
    llmem_tensor t = {NULL, 0, BF16, 2, {n, k, 1, 1}};
    OK(llmem_buffer_alloc(be, llmem_tensor_nbytes(&t), keep));
    t.buf = *keep;
    OK(llmem_op_copy(be, &tw, 0, &t));
    OK(llmem_backend_synchronize(be));
    llmem_buffer_free(tmp);
    return t;
}

/* Float64 reference product o[m, n] = a[m, k] · w[n, k]ᵀ (w in f32) of activations in
 * float64 (ad) or f32 (af, read where ad is NULL): the one loop of the two below. */
static inline void vk_ref_mm_of(const double *ad, const float *af, const float *w, int32_t m,
                                int32_t k, int32_t n, double *o)
{
    for (int32_t r = 0; r < m; r++)
        for (int32_t j = 0; j < n; j++) {
            double acc = 0;
            for (int32_t i = 0; i < k; i++) {
                size_t at = (size_t)r * k + i;
                acc += (ad ? ad[at] : (double)af[at]) * w[(size_t)j * k + i];
            }
            o[(size_t)r * n + j] = acc;
        }
}

/* Float64 reference product o[m, n] = a[m, k] · w[n, k]ᵀ (w in f32). */
static inline void vk_ref_mm(const double *a, const float *w, int32_t m, int32_t k, int32_t n,
                             double *o)
{
    vk_ref_mm_of(a, NULL, w, m, k, n, o);
}

/* vk_ref_mm of f32 activations a[m, k]. */
static inline void vk_ref_mm_f32(const float *a, const float *w, int32_t m, int32_t k, int32_t n,
                                 double *o)
{
    vk_ref_mm_of(NULL, a, w, m, k, n, o);
}

/* Float64 RMS norm (Zhang and Sennrich 2019) of rows x[rows, d] with f32
 * weights w[d] and epsilon eps into o[rows, d]. */
static inline void vk_ref_rms_norm(const float *x, const float *w, int32_t rows, int32_t d,
                                   double eps, double *o)
{
    for (int32_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int32_t i = 0; i < d; i++)
            ss += (double)x[(size_t)r * d + i] * x[(size_t)r * d + i];
        double inv = 1.0 / sqrt(ss / d + eps);
        for (int32_t i = 0; i < d; i++)
            o[(size_t)r * d + i] = x[(size_t)r * d + i] * inv * w[i];
    }
}

/* In place over rows a[m, k] of doubles in `groups` groups of k / groups:
 * each group / sqrt(mean over the group(a²) + eps) * w (w NULL: 1), the
 * float64 grouped RMS norm (Zhang and Sennrich 2019; groups 1: the plain
 * norm) of the norm and gated-norm suites. */
static inline void vk_ref_norm_groups(double *a, const float *w, int32_t m, int32_t k,
                                      int32_t groups, double eps)
{
    int32_t gs = k / groups;
    for (int32_t r = 0; r < m; r++)
        for (int32_t g = 0; g < groups; g++) {
            double ss = 0, *row = a + (size_t)r * k + (size_t)g * gs;
            for (int32_t i = 0; i < gs; i++)
                ss += row[i] * row[i];
            double s = 1.0 / sqrt(ss / gs + eps);
            for (int32_t i = 0; i < gs; i++)
                row[i] = row[i] * s * (w ? w[g * gs + i] : 1.0);
        }
}

/* h = the float64 RMS norm of rows x[m, k] times nw (vk_ref_norm_groups
 * with one group); h may be x. */
static inline void vk_ref_norm(const double *x, const float *nw, int32_t m, int32_t k, double eps,
                               double *h)
{
    if (h != x)
        memcpy(h, x, (size_t)m * k * sizeof *h);
    vk_ref_norm_groups(h, nw, m, k, 1, eps);
}

/* silu(x) = x · sigmoid(x) in float64. */
static inline double vk_silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* A new copy (malloc'd: the caller frees it) of an f32 tensor's values,
 * or of a bf16 tensor's as f32 (the high half of an f32, exact). */
static inline float *vk_download_f32(const llmem_tensor *t)
{
    if (t->dtype != BF16) {
        size_t bytes = llmem_tensor_nbytes(t);
        float *o = malloc(bytes);
        ck_assert_ptr_nonnull(o);
        OK(llmem_buffer_download(t->buf, t->offset, o, bytes));
        return o;
    }
    size_t n = (size_t)llmem_tensor_nelements(t);
    float *o = malloc(n * sizeof *o);
    ck_assert_ptr_nonnull(o);
    uint16_t *h = malloc(n * 2);
    ck_assert_ptr_nonnull(h);
    OK(llmem_buffer_download(t->buf, t->offset, h, n * 2));
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&o[i], &u, 4);
    }
    free(h);
    return o;
}

/* The tolerance of a fast-mode product (llmem_op_matmul_fast) against its
 * float64 reference, relative to the row's largest |value| (vk_expect_close):
 * about four times the rounding of one activation term, 2^-11 for the f16
 * term of the default route, 2^-9 where $LLMEM_VULKAN_BF16 routes products
 * through bf16 cooperative matrices (the bf16 rounding <llmem/ops.h> allows
 * fast mode). */
static inline double vk_fast_rtol(void)
{
    const char *b = getenv("LLMEM_VULKAN_BF16");
    return b && *b && strcmp(b, "0") != 0 ? 4.0 / 512 : 2e-3;
}

/* Asserts each row of o [m, n] is finite and within rtol of the largest
 * |ref| of that row of the float64 reference ref [m, n]. */
static inline void vk_expect_close(const float *o, const double *ref, int32_t m, int32_t n,
                                   double rtol, const char *what)
{
    for (int32_t r = 0; r < m; r++) {
        double big = 0, err = 0;
        for (int32_t j = 0; j < n; j++) {
            double x = ref[(size_t)r * n + j], y = o[(size_t)r * n + j];
            ck_assert_msg(isfinite(y), "%s: row %d col %d not finite", what, r, j);
            big = fmax(big, fabs(x));
            err = fmax(err, fabs(y - x));
        }
        ck_assert_msg(err <= rtol * big, "%s row %d: error %g of %g", what, r, err, big);
    }
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* Seeds the generator from $LLMEM_TEST_SEED when set. */
static inline void vk_test_seed(void)
{
    const char *seed = getenv("LLMEM_TEST_SEED");
    if (seed && *seed)
        g_rng = strtoull(seed, NULL, 10) | 1u;
}

static inline uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static inline float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() % 1000003u) / 1000003.0f;
}

/* Cuts w[0, n) to bf16 values (the low 16 bits cleared): weights a bf16
 * copy on the device holds exactly. */
static inline void vk_trunc_bf16(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w[i], 4);
        u &= 0xffff0000u;
        memcpy(&w[i], &u, 4);
    }
}

/* n values from frand(lo, hi) (malloc'd: the caller frees them), each cut
 * to a bf16 value (vk_trunc_bf16) when bf16. */
static inline float *rand_vals(size_t n, float lo, float hi, bool bf16)
{
    float *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = frand(lo, hi);
    if (bf16)
        vk_trunc_bf16(v, n);
    return v;
}

/* n uniform values in [lo, hi) (malloc'd; the caller frees them). */
static inline float *rand_vec(size_t n, float lo, float hi)
{
    float *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = frand(lo, hi);
    return v;
}

/* t's f32 elements into out. */
static inline void get_f32(const llmem_tensor *t, float *out)
{
    OK(llmem_buffer_download(t->buf, t->offset, out, llmem_tensor_nbytes(t)));
}

/* Points $LLMEM_VULKAN_LOG at a new temporary file named from tmpl. */
static inline void log_to_temp(char *tmpl)
{
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    close(fd);
    setenv("LLMEM_VULKAN_LOG", tmpl, 1);
}

/* Whether the vulkan backend opens here; when not, says so on stdout under the suite's name. */
static inline bool vulkan_opens(const char *suite, const char *what_runs)
{
    char err[256] = "";
    llmem_backend *be = NULL;
    if (llmem_backend_open("vulkan", -1, &be, err, sizeof err) != LLMEM_OK) {
        printf("%s: no usable Vulkan device (%s); %s\n", suite, err, what_runs);
        return false;
    }
    llmem_backend_close(be);
    return true;
}

#endif

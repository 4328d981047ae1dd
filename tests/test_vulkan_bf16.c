// ctest-labels: core vulkan
/* The fast-mode decode products on bf16 cooperative matrices (issue 12;
 * matmul_dec.comp and matmul_cm.comp with -DBF16=1, backends/vulkan/
 * vk_mm_pick.c vk_bf16_used, vk_ops_matmul.c cm_product_as,
 * $LLMEM_VULKAN_BF16).
 *
 * Without a device (vk_mm_pick.c is compiled in): vk_bf16_used takes fast
 * mode (one term), bf16 weights and at most 64 rows, each shader only
 * where its module is on, nothing without cooperative matrices.
 *
 * On a Vulkan device, fast products at 16, 24 (matmul_dec.comp) and 64
 * rows (matmul_cm.comp) with $LLMEM_VULKAN_BF16 unset (off), 1 and 2:
 * - activations with 8 significant bits (bf16-exact, and f16-exact after
 *   any power-of-two row scale): every route computes the same exact
 *   products, so each output is within f32 accumulation of the float64
 *   sum (rtol 1e-5 of the row's largest);
 * - random activations, rows scaled by 2^-60 .. 2^60: each output within
 *   2^-8 sum_i |a_i w_i| (+ the f32 accumulation) of the float64 sum: one
 *   f16 term (2^-11 a term) rounded to bf16 (2^-9) at most;
 * - rounding: activations 1 + 3 2^-9, 1 + 2^-8, 1 + 3 2^-8 (times a row's
 *   power of two, either sign) with weights 1: where the device log says
 *   bf16 matrices are on and the route takes them (vk_bf16_used), each
 *   output is K times the value rounded to 8 significant bits by hand (to
 *   nearest, ties to even: 1 + 2^-7, 1, 1 + 2^-6), else K times the value
 *   itself (f16 and f32 paths hold it exactly).
 * Where the device has no cooperative matrices (lavapipe) the products take
 * the SIMT path: the same checks hold (the rounding one expects no
 * rounding). */
#include "support/run.h"
#include "support/vk_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk_mm_pick.c"

START_TEST(test_bf16_used)
{
    vk_mm_caps c = {.coopmat = true, .bf16_dec = true, .bf16_cm = true};
    for (int dec = 0; dec < 2; dec++) {
        ck_assert(vk_bf16_used(&c, 9, 1, LLMEM_DTYPE_BF16, dec));
        ck_assert(vk_bf16_used(&c, 64, 1, LLMEM_DTYPE_BF16, dec));
        ck_assert(!vk_bf16_used(&c, 65, 1, LLMEM_DTYPE_BF16, dec)); /* prefill: not these */
        ck_assert(!vk_bf16_used(&c, 16, 2, LLMEM_DTYPE_BF16, dec)); /* precise: f16 terms */
        ck_assert(!vk_bf16_used(&c, 16, 1, LLMEM_DTYPE_F16, dec));  /* f16 weights */
        ck_assert(!vk_bf16_used(&c, 16, 1, LLMEM_DTYPE_F32, dec));
    }
    c.bf16_cm = false; /* LLMEM_VULKAN_BF16=1: matmul_dec's module only */
    ck_assert(vk_bf16_used(&c, 16, 1, LLMEM_DTYPE_BF16, true));
    ck_assert(!vk_bf16_used(&c, 64, 1, LLMEM_DTYPE_BF16, false));
    c.bf16_dec = false;
    ck_assert(!vk_bf16_used(&c, 16, 1, LLMEM_DTYPE_BF16, true));
    c = (vk_mm_caps){.coopmat = false, .bf16_dec = true, .bf16_cm = true};
    ck_assert(!vk_bf16_used(&c, 16, 1, LLMEM_DTYPE_BF16, true));
    ck_assert(!vk_bf16_used(&c, 64, 1, LLMEM_DTYPE_BF16, false));
    ck_assert_int_eq(VK_BF16_DEFAULT, 0); /* off unless asked for */
}
END_TEST

/* ---- on a device -------------------------------------------------------------------------- */

/* out[m, n] = a · wᵀ in fast mode on be with w as bf16 (bf16-exact values). */
static void run_fast(llmem_backend *be, const float *a, const float *w, int32_t m, int32_t k,
                     int32_t n, float *out)
{
    llmem_buffer *ba, *bw, *bo;
    llmem_tensor ta = vk_up_f32_2d(be, &ba, a, m, k);
    llmem_tensor tw = vk_up_bf16_2d(be, &bw, w, n, k);
    llmem_tensor to = vk_up_f32_2d(be, &bo, NULL, m, n);
    OK(llmem_op_matmul_fast(be, &ta, &tw, &to));
    OK(llmem_buffer_download(bo, 0, out, (size_t)m * n * 4));
    llmem_buffer_free(ba), llmem_buffer_free(bw), llmem_buffer_free(bo);
}

/* v with its significand cut to `bits` significant bits (toward zero). */
static float cut_bits(float v, int bits)
{
    int e;
    double f = frexp(v, &e);
    return (float)ldexp(trunc(ldexp(f, bits)), e - bits);
}

/* Whether the log at path says the device opened with bf16 matrices. */
static bool log_says_bf16(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "log %s", path);
    char line[1024];
    bool on = false;
    while (fgets(line, sizeof line, f))
        on = on || strstr(line, "KHR and bf16 too") != NULL;
    fclose(f);
    return on;
}

/* The exact and the bounded checks of one product m x k x n (see the top). */
static void bf16_case(llmem_backend *vk, int32_t m, int32_t k, int32_t n, const char *cfg)
{
    float *a = malloc((size_t)m * k * 4), *w = malloc((size_t)n * k * 4);
    float *o = malloc((size_t)m * n * 4);
    double *ref = malloc((size_t)m * n * sizeof *ref), *mag = malloc((size_t)m * n * sizeof *mag);
    ck_assert(a && w && o && ref && mag);
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = cut_bits(ldexpf(frand(-1, 1), (int)(i % 20) - 10), 8);
    for (int exact = 1; exact >= 0; exact--) {
        for (int32_t r = 0; r < m; r++)
            for (int32_t i = 0; i < k; i++) {
                float v = ldexpf(frand(-1, 1), (r % 7) * 20 - 60);
                a[(size_t)r * k + i] = exact ? cut_bits(v, 8) : v;
            }
        for (int32_t r = 0; r < m; r++)
            for (int32_t j = 0; j < n; j++) {
                double s = 0, t = 0;
                for (int32_t i = 0; i < k; i++) {
                    double p = (double)a[(size_t)r * k + i] * w[(size_t)j * k + i];
                    s += p;
                    t += fabs(p);
                }
                ref[(size_t)r * n + j] = s, mag[(size_t)r * n + j] = t;
            }
        for (size_t i = 0; i < (size_t)m * n; i++)
            o[i] = NAN;
        run_fast(vk, a, w, m, k, n, o);
        char what[160];
        snprintf(what, sizeof what, "%s %s %dx%dx%d", cfg, exact ? "exact" : "bound", m, k, n);
        if (exact) {
            vk_expect_close(o, ref, m, n, 1e-5, what);
            continue;
        }
        for (size_t i = 0; i < (size_t)m * n; i++)
            ck_assert_msg(isfinite(o[i]) && fabs(o[i] - ref[i]) <= (0x1p-8 + 0x1p-12) * mag[i],
                          "%s: output %zu %g against %g (sum |a w| %g)", what, i, o[i], ref[i],
                          mag[i]);
    }
    free(a), free(w), free(o), free(ref), free(mag);
}

/* The rounding check of one product m x k x n; rounds: whether bf16 matrices
 * take it (see the top). */
static void round_case(llmem_backend *vk, int32_t m, int32_t k, int32_t n, bool rounds,
                       const char *cfg)
{
    /* value, and it rounded to 8 significant bits to nearest, ties to even (by hand) */
    static const double vals[3][2] = {
        {1 + 3 * 0x1p-9, 1 + 0x1p-7}, {1 + 0x1p-8, 1}, {1 + 3 * 0x1p-8, 1 + 0x1p-6}};
    float *a = malloc((size_t)m * k * 4), *w = malloc((size_t)n * k * 4);
    float *o = malloc((size_t)m * n * 4);
    ck_assert(a && w && o);
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = 1;
    for (int32_t r = 0; r < m; r++)
        for (int32_t i = 0; i < k; i++)
            a[(size_t)r * k + i] = (float)ldexp(vals[r % 3][0] * (r % 2 ? -1 : 1), r % 5 - 2);
    run_fast(vk, a, w, m, k, n, o);
    for (int32_t r = 0; r < m; r++) {
        double want = k * ldexp(vals[r % 3][rounds] * (r % 2 ? -1 : 1), r % 5 - 2);
        for (int32_t j = 0; j < n; j++)
            ck_assert_msg(o[(size_t)r * n + j] == want, "%s %dx%dx%d row %d col %d: %.9g, want %.9g",
                          cfg, m, k, n, r, j, o[(size_t)r * n + j], want);
    }
    free(a), free(w), free(o);
}

START_TEST(test_bf16_products)
{
    static const char *bfs[] = {NULL, "1", "2"}; /* $LLMEM_VULKAN_BF16 */
    /* m, k, n: matmul_dec at 16 and 24 rows (partial tiles, split-K), matmul_cm at 64 */
    static const int32_t shapes[][3] = {{16, 1024, 300}, {24, 512, 136}, {64, 1024, 96}};
    test_env keep = test_env_save("LLMEM_VULKAN_BF16");
    test_env keep_log = test_env_save("LLMEM_VULKAN_LOG");
    for (size_t bi = 0; bi < sizeof bfs / sizeof bfs[0]; bi++) {
        char path[] = "/tmp/llmem_vk_bf16XXXXXX";
        log_to_temp(path);
        test_env_put("LLMEM_VULKAN_BF16", bfs[bi]);
        llmem_backend *vk = test_open("vulkan");
        bool on = log_says_bf16(path);
        int level = bfs[bi] ? atoi(bfs[bi]) : VK_BF16_DEFAULT;
        char cfg[96];
        snprintf(cfg, sizeof cfg, "BF16=%s (bf16 matrices %s)", bfs[bi] ? bfs[bi] : "(unset)",
                 on ? "on" : "off");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
            bf16_case(vk, m, k, n, cfg);
            /* matmul_dec up to 32 rows (level 1), matmul_cm above (level 2) */
            round_case(vk, m, k, n, on && level >= (m <= 32 ? 1 : 2), cfg);
        }
        llmem_backend_close(vk);
        test_env_restore(&keep_log);
        remove(path);
    }
    test_env_restore(&keep);
}
END_TEST

int main(void)
{
    vk_test_seed();
    Suite *s = suite_create("vulkan_bf16");
    TCase *tc = tcase_create("pick");
    tcase_add_test(tc, test_bf16_used);
    suite_add_tcase(s, tc);
    if (vulkan_opens("test_vulkan_bf16", "the device products are skipped")) {
        TCase *td = tcase_create("device");
        tcase_set_timeout(td, 120);
        tcase_add_test(td, test_bf16_products);
        suite_add_tcase(s, td);
    }
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

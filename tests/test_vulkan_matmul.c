// ctest-labels: vulkan
/* Vulkan backend plugin tests, matmul side (split from test_vulkan_ops.c):
 * vulkan against cpu and float64 where the conformance shapes stop: tile
 * edges of the tiled matmul, per-row scales, and the cooperative-matrix
 * paths (raw, fused, staged, the function variants).
 * Run on lavapipe: VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json.
 * Without a usable Vulkan device the suite is skipped.
 */
#include "support/run.h"
#include "support/vk_ops_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/ops.h"

/* w[i] rounded toward zero to bf16 (its low 16 bits cleared), so the
 * device's bf16 copy holds exactly the values the reference multiplies. */
/* a[m, k] · w[n, k]ᵀ in float64 (malloc'd; the caller frees it). */
static double *ref_matmul(const float *a, const float *w, int32_t m, int32_t k, int32_t n)
{
    double *ref = malloc((size_t)m * n * sizeof *ref);
    ck_assert_ptr_nonnull(ref);
    vk_ref_mm_f32(a, w, m, k, n, ref);
    return ref;
}

START_TEST(test_matmul_tiles)
{
    llmem_backend *vk = test_open("vulkan"), *cpu = test_open("cpu");
    compare_matmul(vk, cpu, 70, 300, 130, BF16); /* partial tiles on every side */
    compare_matmul(vk, cpu, 128, 64, 64, F32);   /* exact tiles */
    compare_matmul(vk, cpu, 9, 17, 65, F16);     /* just above the matvec rows */
    compare_matmul(vk, cpu, 130, 264, 300, F16); /* f16 weights above 64 rows (matmul_cm2) */
    compare_matmul(vk, cpu, 5, 1000, 33, F16);   /* matvec, several rows */
    llmem_backend_close(vk);
    llmem_backend_close(cpu);
}
END_TEST

/* One shape of test_matmul_row_scales (below) on vk, precise and fast;
 * cfg names the configuration in failure messages. */
static void row_scales_case(llmem_backend *vk, int32_t m, int32_t k, int32_t n, const char *cfg)
{
    float *a = rand_vec((size_t)m * k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
    for (int32_t r = 0; r < m; r++)
        for (int32_t i = 0; i < k; i++)
            a[(size_t)r * k + i] = ldexpf(a[(size_t)r * k + i], (r % 7) * 20 - 60);
    for (size_t i = 0; i < (size_t)n * k; i++) /* 2^-17 .. 2^10 */
        w[i] = ldexpf(w[i], (int)(i % 28) - 17);
    vk_trunc_bf16(w, (size_t)n * k);
    double *ref = ref_matmul(a, w, m, k, n);
    float *o = malloc((size_t)m * n * sizeof *o);
    ck_assert_ptr_nonnull(o);
    for (int fast = 0; fast < 2; fast++) {
        run_matmul(vk, a, w, m, k, n, BF16, fast, o);
        char what[128];
        snprintf(what, sizeof what, "%s%s %dx%dx%d (row r scaled by 2^((r %% 7) * 20 - 60))", cfg,
                 fast ? "matmul_fast" : "matmul", m, k, n);
        vk_expect_close(o, ref, m, n, fast ? vk_fast_rtol() : 1e-5, what);
    }
    free(o), free(a), free(w), free(ref);
}

/* Rows of very different magnitudes (2^-60 .. 2^60) times bf16 weights
 * that span 2^-17 .. 2^10, against a float64 product row by row: the
 * tensor-core path (cooperative matrices, where the device has them)
 * scales each row into f16's range and splits it into hi + lo f16 terms,
 * so every row must be as accurate as an f32 product (fast mode: hi only,
 * about 2^-12 per element). 130 and 200 rows take several tile rows of
 * the tensor-core path (prefill sizes, partial tiles, split-K at K 1000).
 * Elsewhere this checks the SIMT fallback. */
START_TEST(test_matmul_row_scales)
{
    static const int32_t shapes[][3] = {{40, 1024, 96}, {130, 264, 136}, {16, 512, 40}, {200, 1000, 136}};
    llmem_backend *vk = test_open("vulkan");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        row_scales_case(vk, shapes[s][0], shapes[s][1], shapes[s][2], "");
    llmem_backend_close(vk);
}
END_TEST

/* matmul_cm.comp's epilogues and split-K ($LLMEM_VULKAN_CM_RAW: 0 scaled
 * through shared memory everywhere, 1 raw accumulators + sum_slices_cm.comp
 * where K is split, the default 2 that everywhere (in the tests above), 3
 * raw with the sum in the last slice's workgroup where K is split;
 * $LLMEM_VULKAN_CM_WAVE=132: the decode tiles' split-K within 132
 * workgroups, vk_cm_plan_wave), and above 64 rows matmul_cmp.comp's NV
 * module ($LLMEM_VULKAN_CMP=2; its KHR one, the default where the device
 * has it, runs in the tests above), matmul_cm2.comp where the device has
 * VK_NV_cooperative_matrix2 ($LLMEM_VULKAN_CM2_PREFILL=1: its default
 * plan, and 128 invocations with K steps of 64) or matmul_cm.comp there (0, with
 * $LLMEM_VULKAN_CM_KHR=0: matmul_cm.comp's NV module at every row count; its
 * KHR one, the default up to 64 rows where the device has it, runs in the
 * other settings), on the
 * row-scale shapes of test_matmul_row_scales plus the decode rows (split-K,
 * partial tiles, one slice, depth 3 at 16 rows) and 65 and 257 rows (split-K
 * in 4 slices; partial tiles of matmul_cmp), against float64. Lavapipe: the
 * SIMT path. */
START_TEST(test_matmul_cm_raw)
{
    /* up to four settings each (NULL: none); every backend opened costs (the NVIDIA driver
     * refused vkCreateInstance after about 30 in one process), so the NV module of
     * matmul_cm.comp shares its opening with matmul_cmp.comp off, and matmul_cm2.comp
     * (settings of rows above 64) shares those of matmul_cm.comp's epilogue and wave (rows up
     * to 64) */
    static const char *cfgs[][8] = {
        {"LLMEM_VULKAN_CM_RAW", "0", NULL, NULL, NULL, NULL, NULL, NULL},
        {"LLMEM_VULKAN_CM_RAW", "1", "LLMEM_VULKAN_CM2_PREFILL", "1", "LLMEM_VULKAN_CM2_WG", "128",
         "LLMEM_VULKAN_CM2_BK", "64"},
        {"LLMEM_VULKAN_CM_RAW", "3", NULL, NULL, NULL, NULL, NULL, NULL},
        {"LLMEM_VULKAN_CM_WAVE", "132", "LLMEM_VULKAN_CM2_PREFILL", "1", NULL, NULL, NULL, NULL},
        {"LLMEM_VULKAN_CMP", "0", "LLMEM_VULKAN_CM_KHR", "0", NULL, NULL, NULL, NULL},
        {"LLMEM_VULKAN_CMP", "2", NULL, NULL, NULL, NULL, NULL, NULL}};
    static const int32_t shapes[][3] = {{40, 1024, 96}, {200, 1000, 136}, {16, 1000, 300},
                                        {64, 1000, 300}, {9, 264, 17},    {65, 1024, 600},
                                        {257, 96, 520}};
    static const char *names[] = {"LLMEM_VULKAN_CM_RAW", "LLMEM_VULKAN_CM_WAVE",
                                  "LLMEM_VULKAN_CMP", "LLMEM_VULKAN_CM_KHR",
                                  "LLMEM_VULKAN_CM2_PREFILL", "LLMEM_VULKAN_CM2_WG",
                                  "LLMEM_VULKAN_CM2_BK"};
    enum { N_NAMES = sizeof names / sizeof names[0] };
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        test_env keep[N_NAMES];
        for (int i = 0; i < N_NAMES; i++)
            keep[i] = test_env_save(names[i]);
        char cfg[160] = "";
        for (int i = 0; i < 8 && cfgs[ci][i]; i += 2) {
            test_env_put(cfgs[ci][i], cfgs[ci][i + 1]);
            size_t len = strlen(cfg);
            snprintf(cfg + len, sizeof cfg - len, "%s=%s ", cfgs[ci][i], cfgs[ci][i + 1]);
        }
        llmem_backend *vk = test_open("vulkan");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            row_scales_case(vk, shapes[s][0], shapes[s][1], shapes[s][2], cfg);
        llmem_backend_close(vk);
        for (int i = N_NAMES - 1; i >= 0; i--)
            test_env_restore(&keep[i]);
    }
}
END_TEST

/* matmul_cmp.comp at the layouts of $LLMEM_VULKAN_CMP_CFG (vk_cmp_plan_cfg:
 * 128 x 128 tiles of 128 invocations, two workgroups an SM; 8 subgroups of
 * 2 x 8 matrices; a ring of two 16-deep slices) and with the tail split
 * ($LLMEM_VULKAN_CMP_TAIL=1, vk_cmp_plan_tail, at a wave of 4 workgroups,
 * so that 257 x 1000 x 300's 6 tiles take 2 slices), each read by
 * llmem_backend_reload_env on one backend (the NVIDIA driver refuses
 * instances after about two dozen in a process), precise and fast: at 257 x
 * 264 x 300 (partial tiles on both sides, K below two slices of
 * VK_MM_MIN_SLICE, so one slice) bit for bit the default plan's output
 * (each output's multiply-adds run in the same K order whatever the tile,
 * and one slice has no sum of slices to reorder), and at 130 x 2048 x 136,
 * 257 x 1000 x 300 and 496 x 1024 x 520 (split-K, partial tiles) within
 * an f32 product's error of a float64 product. Lavapipe (no cooperative
 * matrices): the SIMT path, for which the same holds. */
START_TEST(test_matmul_cmp_cfg)
{
    static const char *cfgs[][2] = {{NULL, NULL},
                                    {"128,2,4,4,32,1,264", NULL},
                                    {"256,4,2,8,32", NULL},
                                    {"256,2,4,4,16,2,4", "1"}};
    enum { N_CFG = sizeof cfgs / sizeof cfgs[0] };
    static const int32_t split_shapes[][3] = {{130, 2048, 136}, {257, 1000, 300}, {496, 1024, 520}};
    const int32_t m = 257, k = 264, n = 300;
    float *a = rand_vec((size_t)m * k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
    vk_trunc_bf16(w, (size_t)n * k);
    double *ref = ref_matmul(a, w, m, k, n);
    size_t mn = (size_t)m * n;
    float *base = malloc(2 * mn * sizeof *base), *o = malloc(mn * sizeof *o);
    ck_assert_ptr_nonnull(base);
    ck_assert_ptr_nonnull(o);
    test_env keep = test_env_save("LLMEM_VULKAN_CMP_CFG");
    test_env keep_tail = test_env_save("LLMEM_VULKAN_CMP_TAIL");
    llmem_backend *vk = test_open("vulkan");
    for (size_t ci = 0; ci < N_CFG; ci++) {
        test_env_restore(&keep);
        test_env_restore(&keep_tail);
        if (cfgs[ci][0])
            test_env_put("LLMEM_VULKAN_CMP_CFG", cfgs[ci][0]);
        if (cfgs[ci][1])
            test_env_put("LLMEM_VULKAN_CMP_TAIL", cfgs[ci][1]);
        OK(llmem_backend_reload_env(vk));
        char what[96];
        snprintf(what, sizeof what, "LLMEM_VULKAN_CMP_CFG=%s TAIL=%s ",
                 cfgs[ci][0] ? cfgs[ci][0] : "(unset)", cfgs[ci][1] ? cfgs[ci][1] : "(unset)");
        for (int fast = 0; fast < 2; fast++) {
            float *dst = ci == 0 ? base + fast * mn : o;
            run_matmul(vk, a, w, m, k, n, BF16, fast, dst);
            char full[160];
            snprintf(full, sizeof full, "%s%s %dx%dx%d", what, fast ? "matmul_fast" : "matmul", m,
                     k, n);
            vk_expect_close(dst, ref, m, n, fast ? vk_fast_rtol() : 1e-5, full);
            ck_assert_msg(memcmp(dst, base + fast * mn, mn * sizeof *dst) == 0,
                          "%s: not bit for bit the default plan's output", full);
        }
        for (size_t s = 0; s < sizeof split_shapes / sizeof split_shapes[0]; s++)
            row_scales_case(vk, split_shapes[s][0], split_shapes[s][1], split_shapes[s][2], what);
    }
    llmem_backend_close(vk);
    test_env_restore(&keep);
    test_env_restore(&keep_tail);
    free(base), free(o), free(a), free(w), free(ref);
}
END_TEST

/* out = a · wᵀ on vk `reps` times in a row (precise; w exact in bf16),
 * the output filled with NaN before each run; each run's result to
 * out + r m n. */
static void repeat_matmul(llmem_backend *vk, const float *a, const float *w, int32_t m, int32_t k,
                          int32_t n, int reps, float *out)
{
    llmem_buffer *ba, *bw, *bw2, *bo;
    llmem_tensor ta = up_f32(vk, &ba, a, 2, m, k, 1);
    llmem_tensor tw2 = up_weight(vk, &bw, &bw2, w, n, k, BF16);
    llmem_tensor to = up_f32(vk, &bo, NULL, 2, m, n, 1);
    for (int r = 0; r < reps; r++) {
        OK(llmem_buffer_fill(bo, 0, (size_t)m * n * 4, 0x7fc00000u));
        OK(llmem_op_matmul(vk, &ta, &tw2, &to));
        get_f32(&to, out + (size_t)r * m * n);
    }
    llmem_buffer_free(ba), llmem_buffer_free(bw), llmem_buffer_free(bw2), llmem_buffer_free(bo);
}

/* The sum of the split-K slices inside matmul_cm.comp ($LLMEM_VULKAN_CM_RAW
 * 3): at decode and prefill shapes (split-K in 3 .. 16 slices,
 * partial tiles, one slice), five runs in a row on one backend (so the
 * arrival counters must come back to zero after each dispatch; a tile
 * left unsummed stays NaN) are each within an f32 product's error of a
 * float64 product, bit for bit equal to each other (the slices are added
 * in slice order, whichever workgroup arrives last), and bit for bit equal
 * to the separate sum pass of $LLMEM_VULKAN_CM_RAW=2. Lavapipe: the SIMT
 * path for both, which this then checks for repeatability only. */
START_TEST(test_matmul_cm_fused)
{
    static const int32_t shapes[][3] = {
        {64, 4096, 520}, {16, 2048, 1000}, {40, 1000, 96}, {9, 264, 17}, {200, 1000, 136}};
    enum { REPS = 5 };
    /* the two settings' backends, opened once (the NVIDIA driver refuses instances after
     * about two dozen in a process) */
    llmem_backend *vks[2];
    for (int mode = 0; mode < 2; mode++) {
        test_env keep = test_env_set("LLMEM_VULKAN_CM_RAW", mode ? "2" : "3");
        vks[mode] = test_open("vulkan");
        test_env_restore(&keep);
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int32_t m = shapes[si][0], k = shapes[si][1], n = shapes[si][2];
        float *a = rand_vec((size_t)m * k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
        for (int32_t r = 0; r < m; r++) /* rows of different magnitudes: the row scales */
            for (int32_t i = 0; i < k; i++)
                a[(size_t)r * k + i] = ldexpf(a[(size_t)r * k + i], (r % 5) * 9 - 18);
        vk_trunc_bf16(w, (size_t)n * k);
        double *ref = ref_matmul(a, w, m, k, n);
        size_t mn = (size_t)m * n;
        float *o[2] = {malloc(REPS * mn * sizeof(float)), malloc(REPS * mn * sizeof(float))};
        ck_assert_ptr_nonnull(o[0]);
        ck_assert_ptr_nonnull(o[1]);
        for (int mode = 0; mode < 2; mode++)
            repeat_matmul(vks[mode], a, w, m, k, n, REPS, o[mode]);
        char what[96];
        for (int r = 0; r < REPS; r++) {
            snprintf(what, sizeof what, "fused sum %dx%dx%d run %d", m, k, n, r);
            vk_expect_close(o[0] + r * mn, ref, m, n, 1e-5, what);
            ck_assert_msg(memcmp(o[0] + r * mn, o[0], mn * sizeof(float)) == 0,
                          "%s: differs from run 0", what);
            ck_assert_msg(memcmp(o[1] + r * mn, o[0], mn * sizeof(float)) == 0,
                          "%s: differs from the sum pass (LLMEM_VULKAN_CM_RAW=2)", what);
        }
        free(o[0]), free(o[1]), free(a), free(w), free(ref);
    }
    llmem_backend_close(vks[0]);
    llmem_backend_close(vks[1]);
}
END_TEST

/* One m x k x n product of random a and bf16-exact w on vk (precise, or
 * fast: bf16 activations), each row against a float64 product of the same
 * values within tol (normalized, vk_expect_close); `what` names the
 * setting in a failure, followed by the precision and the shape. */
static void bf16_product_case(llmem_backend *vk, int32_t m, int32_t k, int32_t n, bool fast,
                              double tol, const char *what)
{
    float *a = rand_vec((size_t)m * k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
    vk_trunc_bf16(w, (size_t)n * k);
    double *ref = ref_matmul(a, w, m, k, n);
    float *o = malloc((size_t)m * n * sizeof *o);
    ck_assert_ptr_nonnull(o);
    run_matmul(vk, a, w, m, k, n, BF16, fast, o);
    char full[128];
    snprintf(full, sizeof full, "%s, %s %dx%dx%d", what, fast ? "fast" : "precise", (int)m,
             (int)k, (int)n);
    vk_expect_close(o, ref, m, n, tol, full);
    free(o), free(a), free(w), free(ref);
}

/* matmul_cm.comp at each depth of $LLMEM_VULKAN_CM_STAGES (1: one shared
 * slice; 2 .. 4: its ring), at row counts of its three tile heights
 * and K from one partial step (40) through odd and even step counts to
 * split-K slices (1000, 4096), against a float64 product of the same
 * values (w exact in bf16): each row as accurate as an f32 product. Where
 * the device has no cooperative matrices (lavapipe) the knob is read but
 * the SIMT path runs, and this checks that path. */
START_TEST(test_matmul_cm_stages)
{
    static const char *stages[] = {"1", "2", "3", "4"};
    static const int32_t ms[] = {16, 40, 64}, ks[] = {40, 96, 1000, 4096};
    const int32_t n = 136;
    test_env keep = test_env_save("LLMEM_VULKAN_CM_STAGES");
    /* the plans of vk_cm_plan_make at 40, 64 rows */
    test_env keep_mid = test_env_set("LLMEM_VULKAN_CM_MID", "0");
    for (size_t si = 0; si < 4; si++) {
        test_env_put("LLMEM_VULKAN_CM_STAGES", stages[si]);
        llmem_backend *vk = test_open("vulkan");
        for (size_t mi = 0; mi < 3; mi++)
            for (size_t ki = 0; ki < 4; ki++) {
                char what[64];
                snprintf(what, sizeof what, "stages %s", stages[si]);
                bf16_product_case(vk, ms[mi], ks[ki], n, false, 1e-5, what);
            }
        llmem_backend_close(vk);
    }
    test_env_restore(&keep_mid);
    test_env_restore(&keep);
}
END_TEST

/* matmul_cm.comp with 2 (and 4, which the planner cuts to 2 in 48 KiB)
 * 16-column matrices per subgroup ($LLMEM_VULKAN_CM_FN, tiles of 256
 * columns) at the decode row counts, with the ring (depth 3, 16 rows) and
 * without, N 300 (a partial second tile), K 1000 (split-K), precise and
 * fast, against float64 (w exact in bf16). Lavapipe: the SIMT path. */
START_TEST(test_matmul_cm_fn)
{
    static const char *fns[] = {"2", "4"};
    static const int32_t ms[] = {16, 40, 64};
    const int32_t n = 300, k = 1000;
    test_env keep = test_env_save("LLMEM_VULKAN_CM_FN");
    /* the plans of vk_cm_plan_make at 40, 64 rows */
    test_env keep_mid = test_env_set("LLMEM_VULKAN_CM_MID", "0");
    for (size_t fi = 0; fi < 2; fi++) {
        test_env_put("LLMEM_VULKAN_CM_FN", fns[fi]);
        llmem_backend *vk = test_open("vulkan");
        for (size_t mi = 0; mi < 3; mi++)
            for (int fast = 0; fast < 2; fast++) {
                char what[64];
                snprintf(what, sizeof what, "fn %s", fns[fi]);
                bf16_product_case(vk, ms[mi], k, n, fast != 0, fast ? vk_fast_rtol() : 1e-5, what);
            }
        llmem_backend_close(vk);
    }
    test_env_restore(&keep_mid);
    test_env_restore(&keep);
}
END_TEST

/* ---- matvec16.comp's one-row launch ($LLMEM_VULKAN_MV16_*) ------------------------------- */

#define MV16_KNOBS 4
static const char *const mv16_names[MV16_KNOBS] = {"LLMEM_VULKAN_MV16_WG", "LLMEM_VULKAN_MV16_TPR",
                                                   "LLMEM_VULKAN_MV16_NR",
                                                   "LLMEM_VULKAN_MV16_UNROLL"};

/* One knob setting: the values of mv16_names (NULL: unset), and whether
 * each row's sums keep the default's order (then its bits). */
typedef struct mv16_set {
    const char *val[MV16_KNOBS];
    bool same_order;
} mv16_set;

/* out [1, n] = a · wᵀ, or silu(a · wᵀ) * (a · uᵀ) when u, on vk with the
 * weights as dtype wt. */
static void run_mv16(llmem_backend *vk, const float *a, const float *w, const float *u, int32_t k,
                     int32_t n, llmem_dtype wt, float *out)
{
    llmem_buffer *ba, *bw, *bw2, *bu = NULL, *bu2 = NULL, *bo;
    llmem_tensor ta = up_f32(vk, &ba, a, 2, 1, k, 1);
    llmem_tensor tw = up_weight(vk, &bw, &bw2, w, n, k, wt), tu = tw;
    if (u)
        tu = up_weight(vk, &bu, &bu2, u, n, k, wt);
    llmem_tensor to = up_f32(vk, &bo, NULL, 2, 1, n, 1);
    OK(u ? llmem_op_matmul_swiglu(vk, &ta, &tw, &tu, &to) : llmem_op_matmul(vk, &ta, &tw, &to));
    get_f32(&to, out);
    llmem_buffer_free(ba), llmem_buffer_free(bw), llmem_buffer_free(bw2);
    llmem_buffer_free(bu), llmem_buffer_free(bu2), llmem_buffer_free(bo);
}

/* The one-row GEMV (and its SwiGLU) under the knobs of matvec16.comp's
 * launch, read at llmem_backend_reload_env: workgroup, invocations per
 * group of rows, weight rows per group, loads in flight; f16 and bf16
 * weights at K 1032 (129 chunks: some invocations take one more) and N 75
 * (a partial last block), against float64 within 1e-5 of each row's
 * largest value; the settings that keep each row's sums in the default's
 * order give the default's bits. $LLMEM_VULKAN_GEMV_ROWS=0 keeps the
 * product on matvec16; $LLMEM_VULKAN_SM_COUNT=2 makes a wave 16
 * workgroups of 256, so that the default takes 4 rows a group for the
 * plain product (38 blocks of 2 rows would be more than a wave, 10 of 8
 * fit) and 1 for the SwiGLU: NR 1 must give the same bits. */
START_TEST(test_matvec16_knobs)
{
    static const mv16_set sets[] = {
        {{NULL}, true},
        {{NULL, NULL, "1"}, true},
        {{NULL, NULL, "2"}, true},
        {{NULL, NULL, "8"}, true},
        {{NULL, NULL, NULL, "1"}, true},
        {{NULL, NULL, NULL, "8"}, true},
        {{NULL, NULL, "2", "4"}, true},
        {{"512"}, true},
        {{"128", NULL, "2", "1"}, true},
        {{"1024", "256", NULL, "4"}, false},
        {{"256", "64"}, false},
        {{"256", "32", "4"}, false},
        {{"64", "64", "1", "16"}, false},
    };
    const int32_t k = 1032, n = 75;
    test_env keep[MV16_KNOBS + 2];
    for (int i = 0; i < MV16_KNOBS; i++)
        keep[i] = test_env_save(mv16_names[i]);
    keep[MV16_KNOBS] = test_env_save("LLMEM_VULKAN_GEMV_ROWS");
    keep[MV16_KNOBS + 1] = test_env_save("LLMEM_VULKAN_SM_COUNT");
    setenv("LLMEM_VULKAN_GEMV_ROWS", "0", 1);
    setenv("LLMEM_VULKAN_SM_COUNT", "2", 1);
    llmem_backend *vk = test_open("vulkan");
    float *a = rand_vec(k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
    float *u = rand_vec((size_t)n * k, -1, 1);
    vk_trunc_bf16(w, (size_t)n * k); /* f16 and bf16 hold them (|w| >= 2^-14 aside) */
    vk_trunc_bf16(u, (size_t)n * k);
    double *ref[2] = {ref_matmul(a, w, 1, k, n), malloc((size_t)n * sizeof(double))};
    ck_assert_ptr_nonnull(ref[1]);
    for (int32_t j = 0; j < n; j++) {
        double g = ref[0][j], up = 0;
        for (int32_t i = 0; i < k; i++)
            up += (double)a[i] * u[(size_t)j * k + i];
        ref[1][j] = g / (1 + exp(-g)) * up;
    }
    float base[2][2][75], o[75];
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        char label[128] = "MV16";
        for (int i = 0; i < MV16_KNOBS; i++) {
            if (sets[si].val[i]) {
                setenv(mv16_names[i], sets[si].val[i], 1);
                size_t at = strlen(label);
                snprintf(label + at, sizeof label - at, " %s=%s", mv16_names[i] + 18,
                         sets[si].val[i]);
            } else {
                unsetenv(mv16_names[i]);
            }
        }
        ck_assert_int_eq(llmem_backend_reload_env(vk), LLMEM_OK);
        for (int dt = 0; dt < 2; dt++)
            for (int sw = 0; sw < 2; sw++) {
                llmem_dtype wt = dt ? BF16 : F16;
                run_mv16(vk, a, w, sw ? u : NULL, k, n, wt, o);
                char what[200];
                snprintf(what, sizeof what, "%s %s%s %dx%d", label, llmem_dtype_name(wt),
                         sw ? " swiglu" : "", n, k);
                vk_expect_close(o, ref[sw], 1, n, 1e-5, what);
                if (si == 0)
                    memcpy(base[dt][sw], o, sizeof o);
                else if (sets[si].same_order)
                    ck_assert_msg(memcmp(base[dt][sw], o, sizeof o) == 0,
                                  "%s: not the default's bits", what);
            }
    }
    llmem_backend_close(vk);
    for (int i = 0; i < MV16_KNOBS + 2; i++)
        test_env_restore(&keep[i]);
    free(a), free(w), free(u), free(ref[0]), free(ref[1]);
}
END_TEST

int main(void)
{
    vk_test_seed();
    /* without a device nothing here can run: ctest shows "skipped" (SKIP_RETURN_CODE 77) */
    if (!vulkan_opens("test_vulkan_matmul", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_matmul");
    TCase *tc = tcase_create("matmul");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_matmul_tiles);
    tcase_add_test(tc, test_matmul_row_scales);
    tcase_add_test(tc, test_matmul_cm_stages);
    tcase_add_test(tc, test_matmul_cm_fn);
    tcase_add_test(tc, test_matmul_cm_raw);
    tcase_add_test(tc, test_matmul_cm_fused);
    tcase_add_test(tc, test_matmul_cmp_cfg);
    tcase_add_test(tc, test_matvec16_knobs);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

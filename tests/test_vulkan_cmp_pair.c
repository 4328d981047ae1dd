// ctest-labels: vulkan
/* Vulkan: K split of the second product of a pair (issue 12; backends/
 * vulkan/vk_mm_pick.c vk_cmp_plan_pair, $LLMEM_VULKAN_CMP_PAIR). At prefill
 * rows the FFN's gate product records while up's split-K sum is held
 * (vk_sum_park), with no barrier after up's product, so its workgroups
 * start where up's last wave leaves SMs idle; the plan splits gate's K for
 * that.
 *   - the plan: the 9B shape's gate after up (224 tiles each, 132 SMs)
 *     takes 2 slices of 2048; products within a wave, wave 0 and an empty
 *     first product are left alone; over a grid (first product of one
 *     slice) the slice count is the best of 1 .. 4 by an independent
 *     reference, a list schedule of the two products' pieces onto the
 *     earliest free SM in float64, plus 0.1 tile times a slice more (the
 *     model's price of a slice); the invariants of a split;
 *   - on the device, at 65-512 rows (partial tiles, K of one and several
 *     slices), with $LLMEM_VULKAN_SM_COUNT=4 so that test shapes fill more
 *     than a wave: norm, up, gate, silu(gate) * up and down as the model
 *     runs them, precise and fast, $LLMEM_VULKAN_CMP_PAIR=1 against a
 *     float64 computation from the inputs and, where the plans are the
 *     same (up, and gate with K of one slice), bit for bit the setting 0.
 * Lavapipe (no cooperative matrices) runs the SIMT path, for which the
 * same holds. Without a usable Vulkan device that part is skipped.
 */
#include "support/run.h"
#include "support/vk_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk_mm_pick.c"
#include "llmem/ops.h"

#define EPS 1e-5f

/* The finish of the first product's t1 whole tiles then t2 tiles cut in s
 * pieces of 1 / s tile times each, every piece started in order on the SM
 * that is free first (wave SMs), in tile times. */
static double list_schedule(uint64_t t1, uint64_t t2, uint32_t s, uint32_t wave)
{
    double *free_at = calloc(wave, sizeof *free_at), end = 0;
    ck_assert_ptr_nonnull(free_at);
    for (uint64_t i = 0; i < t1 + t2 * s; i++) {
        uint32_t best = 0;
        for (uint32_t j = 1; j < wave; j++)
            if (free_at[j] < free_at[best])
                best = j;
        free_at[best] += i < t1 ? 1.0 : 1.0 / s;
        end = free_at[best] > end ? free_at[best] : end;
    }
    free(free_at);
    return end;
}

START_TEST(test_cmp_plan_pair)
{
    vk_cm_plan p, q;
    ck_assert(vk_cmp_plan_make(512, 14336, 4096, true, 49152, 132, &p));
    ck_assert_uint_eq(p.tiles_m * p.tiles_n, 224);
    ck_assert_uint_eq(p.slices, 1);
    q = p;
    vk_cmp_plan_pair(&q, 4096, 132, 224, 1);
    ck_assert_uint_eq(q.slices, 2);
    ck_assert_uint_eq(q.k_split, 2048);
    /* left alone: wave 0, no first product, a product within a wave */
    q = p;
    vk_cmp_plan_pair(&q, 4096, 0, 224, 1);
    ck_assert(memcmp(&p, &q, sizeof p) == 0);
    vk_cmp_plan_pair(&q, 4096, 132, 0, 1);
    ck_assert(memcmp(&p, &q, sizeof p) == 0);
    vk_cmp_plan_pair(&q, 4096, 132, 224, 0);
    ck_assert(memcmp(&p, &q, sizeof p) == 0);
    ck_assert(vk_cmp_plan_make(512, 4096, 4096, true, 49152, 132, &p));
    q = p;
    vk_cmp_plan_pair(&q, 4096, 132, 64, 2);
    ck_assert(memcmp(&p, &q, sizeof p) == 0);
    /* the grid: the slice count against the list schedule */
    static const uint32_t ms[] = {65, 257, 512};
    static const uint32_t ns[] = {1000, 8512, 14336, 16768};
    static const uint32_t ks[] = {136, 1000, 4096};
    static const uint32_t waves[] = {4, 66, 132};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t d = 0; d < 3; d++)
                for (size_t w = 0; w < 3; w++) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d], wave = waves[w];
                    ck_assert(vk_cmp_plan_make(m, n, k, true, 49152, wave, &p));
                    uint64_t tiles = (uint64_t)p.tiles_m * p.tiles_n;
                    for (uint64_t t1 = tiles / 2; t1 <= tiles * 2; t1 += tiles / 2 + 1) {
                        q = p;
                        vk_cmp_plan_pair(&q, k, wave, t1, 1);
                        ck_assert_uint_eq(q.k_split % q.bk, 0);
                        ck_assert(q.slices >= 1 && (uint64_t)q.slices * q.k_split >= k);
                        ck_assert((uint64_t)(q.slices - 1) * q.k_split < k);
                        if (tiles <= wave) {
                            ck_assert(memcmp(&p, &q, sizeof p) == 0);
                            continue;
                        }
                        uint32_t most = k / VK_MM_MIN_SLICE;
                        most = most < VK_CMP_TAIL_MAX ? most : VK_CMP_TAIL_MAX;
                        most = most > 1 ? most : 1;
                        double best = INFINITY;
                        for (uint32_t s = 1; s <= most; s++) {
                            double c = list_schedule(t1, tiles, s, wave) + 0.1 * (s - 1);
                            best = c < best ? c : best;
                        }
                        uint32_t s = q.slices;
                        double got = list_schedule(t1, tiles, s, wave) + 0.1 * (s - 1);
                        ck_assert_msg(got <= best + 0.002,
                                      "%ux%ux%u wave %u first %llu: %u slices finish %.3f, "
                                      "best %.3f",
                                      m, n, k, wave, (unsigned long long)t1, s, got, best);
                    }
                }
}
END_TEST

/* ---- on the device ---------------------------------------------------------------------- */

/* A vulkan backend with 4 compute units and $LLMEM_VULKAN_CMP_PAIR=pair. */
static llmem_backend *open_pair(const char *pair)
{
    static const char *const names[2] = {"LLMEM_VULKAN_CMP_PAIR", "LLMEM_VULKAN_SM_COUNT"};
    const char *const values[2] = {pair, "4"};
    return test_open_with("vulkan", 2, names, values);
}

enum { O_UP, O_GATE, O_SW, O_DOWN, N_O };

/* h = norm(x + r); up; gate; up = silu(gate) * up; down: the outputs to
 * o[] ([m, n] up, gate and the SwiGLU, [m, k] down; malloc'd here). */
static void run_ffn(llmem_backend *vk, bool fast, int32_t m, int32_t k, int32_t n, const float *x,
                    const float *r, const float *nw, const float *wu, const float *wg,
                    const float *wd, float *o[N_O])
{
    llmem_status (*mm)(llmem_backend *, const llmem_tensor *, const llmem_tensor *,
                       const llmem_tensor *) = fast ? llmem_op_matmul_fast : llmem_op_matmul;
    for (int i = 0; i < N_O; i++) {
        o[i] = malloc((size_t)m * (i == O_DOWN ? k : n) * sizeof(float));
        ck_assert_ptr_nonnull(o[i]);
    }
    llmem_buffer *b[10];
    llmem_tensor tx = vk_up_f32_2d(vk, &b[0], x, m, k), tr = vk_up_f32_2d(vk, &b[1], r, m, k);
    llmem_tensor tnw = vk_up_f32_2d(vk, &b[2], nw, k, 0);
    llmem_tensor twu = vk_up_bf16_2d(vk, &b[3], wu, n, k), twg = vk_up_bf16_2d(vk, &b[4], wg, n, k);
    llmem_tensor twd = vk_up_bf16_2d(vk, &b[5], wd, k, n);
    llmem_tensor h = vk_up_f32_2d(vk, &b[6], NULL, m, k), up = vk_up_f32_2d(vk, &b[7], NULL, m, n);
    llmem_tensor gate = vk_up_f32_2d(vk, &b[8], NULL, m, n), dn = vk_up_f32_2d(vk, &b[9], NULL, m, k);
    OK(llmem_op_add_rms_norm(vk, &tx, &tr, &tnw, EPS, &h));
    OK(mm(vk, &h, &twu, &up));
    OK(mm(vk, &h, &twg, &gate));
    get_f32(&up, o[O_UP]);
    get_f32(&gate, o[O_GATE]);
    OK(llmem_op_rms_norm(vk, &tx, &tnw, EPS, &h)); /* (x is x + r now: the same h) */
    OK(mm(vk, &h, &twu, &up));
    OK(mm(vk, &h, &twg, &gate));
    OK(llmem_op_swiglu(vk, &gate, &up, &up));
    OK(mm(vk, &up, &twd, &dn));
    get_f32(&up, o[O_SW]);
    get_f32(&dn, o[O_DOWN]);
    for (int i = 0; i < 10; i++)
        llmem_buffer_free(b[i]);
}

static void check_shape(llmem_backend *on, llmem_backend *off, int32_t m, int32_t k, int32_t n,
                        bool fast)
{
    size_t mk = (size_t)m * k, mn = (size_t)m * n, nk = (size_t)n * k;
    float *x = rand_vals(mk, -2, 2, false), *r = rand_vals(mk, -2, 2, false);
    float *nw = rand_vals((size_t)k, 0.5f, 1.5f, false);
    float *wu = rand_vals(nk, -1, 1, true), *wg = rand_vals(nk, -1, 1, true);
    float *wd = rand_vals(nk, -1, 1, true);
    float *a[N_O], *b[N_O];
    run_ffn(on, fast, m, k, n, x, r, nw, wu, wg, wd, a);
    run_ffn(off, fast, m, k, n, x, r, nw, wu, wg, wd, b);
    char what[128];
    snprintf(what, sizeof what, "%dx%dx%d %s", m, k, n, fast ? "fast" : "precise");
    /* up records first, planned as with the setting off */
    ck_assert_msg(memcmp(a[O_UP], b[O_UP], mn * sizeof(float)) == 0, "%s: up differs", what);
    if (k < 2 * VK_MM_MIN_SLICE) /* K of one slice: the same plan for gate */
        ck_assert_msg(memcmp(a[O_GATE], b[O_GATE], mn * sizeof(float)) == 0, "%s: gate differs",
                      what);
    /* float64 */
    double *h = calloc(mk, sizeof *h), *up = calloc(mn, sizeof *up), *g = calloc(mn, sizeof *g);
    double *sw = calloc(mn, sizeof *sw), *d = calloc(mk, sizeof *d);
    ck_assert(h && up && g && sw && d);
    for (int32_t i = 0; i < m; i++) {
        double ss = 0;
        for (int32_t j = 0; j < k; j++) {
            double v = (double)x[(size_t)i * k + j] + r[(size_t)i * k + j];
            ss += v * v;
        }
        double s = 1.0 / sqrt(ss / k + EPS);
        for (int32_t j = 0; j < k; j++)
            h[(size_t)i * k + j] = ((double)x[(size_t)i * k + j] + r[(size_t)i * k + j]) * s * nw[j];
    }
    vk_ref_mm(h, wu, m, k, n, up);
    vk_ref_mm(h, wg, m, k, n, g);
    for (size_t i = 0; i < mn; i++)
        sw[i] = g[i] / (1.0 + exp(-g[i])) * up[i];
    vk_ref_mm(sw, wd, m, n, k, d);
    double tol = fast ? 4e-3 : 2e-5;
    for (int s = 0; s < 2; s++) {
        float **o = s == 0 ? a : b;
        vk_expect_close(o[O_UP], up, m, n, tol, what);
        vk_expect_close(o[O_GATE], g, m, n, tol, what);
        vk_expect_close(o[O_SW], sw, m, n, tol, what);
        vk_expect_close(o[O_DOWN], d, m, k, 2 * tol, what);
    }
    for (int i = 0; i < N_O; i++)
        free(a[i]), free(b[i]);
    free(h), free(up), free(g), free(sw), free(d);
    free(x), free(r), free(nw), free(wu), free(wg), free(wd);
}

/* 65 rows (one partial row tile), 129 and 257 (partial last tiles), 512
 * (whole 128-row tiles); K 264 (one slice) and 1024 (up to 4); n 1032
 * (5 column tiles, the last partial) and 2048 (8): more tiles than the
 * 4-SM wave */
START_TEST(test_cmp_pair_ffn)
{
    static const int32_t shapes[][3] = {
        {65, 1024, 1032}, {129, 264, 1032}, {257, 1024, 1032}, {512, 1024, 2048}};
    llmem_backend *on = open_pair("1"), *off = open_pair("0");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int fast = 0; fast < 2; fast++)
            check_shape(on, off, shapes[i][0], shapes[i][1], shapes[i][2], fast == 1);
    llmem_backend_close(on);
    llmem_backend_close(off);
}
END_TEST

int main(void)
{
    vk_test_seed();
    Suite *s = suite_create("vulkan_cmp_pair");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_cmp_plan_pair);
    suite_add_tcase(s, tc);
    if (vulkan_opens("test_vulkan_cmp_pair", "the plan only")) {
        TCase *td = tcase_create("device");
        tcase_set_timeout(td, 300);
        tcase_add_test(td, test_cmp_pair_ffn);
        suite_add_tcase(s, td);
    }
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

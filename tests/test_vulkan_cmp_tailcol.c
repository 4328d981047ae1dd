// ctest-labels: vulkan
/* Vulkan: matmul_cmp.comp's tail-column plan (issue 12; backends/vulkan/
 * vk_mm_pick.c vk_cmp_plan_tailcol and vk_cm_raw_tail, $LLMEM_VULKAN_CMP_TAILCOL).
 * A prefill product whose tiles pass one wave by a few (the 2b shape's
 * in_proj, 4 x 34 tiles of 128 x 256 on 132 SMs) keeps the column tiles of
 * the full waves whole and splits only the last column tiles' K, whose
 * pieces then run in one short wave; the sum pass adds those columns'
 * slices, the others' one.
 *   - the plan: the 2b in_proj takes 33 whole column tiles and 8 slices of
 *     256; the 9B shape's products (224 and 264 tiles) and products within
 *     a wave are left alone; over a grid, by a model of the shader's
 *     workgroup -> (tile, slice, K range) mapping written here from the
 *     plan's description: every tile's K ranges partition [0, K) in whole
 *     steps, every output element of every slice lands in the partial
 *     buffer once (no two pieces share a float, all inside vk_cm_raw_tail's
 *     size), the head's tiles one slice, the tail within one short wave;
 *   - on the device, with $LLMEM_VULKAN_SM_COUNT set so that small products
 *     pass a wave by a few tiles, at 65-496 rows (partial row tiles), N with
 *     a partial last column tile, K of 2-4 slices, precise and fast:
 *     the product against a float64 one from the inputs, its columns of
 *     the whole tiles bit for bit those of $LLMEM_VULKAN_CMP_TAILCOL=0 with
 *     $LLMEM_VULKAN_CMP_TAIL=0 (one slice each way: the same multiply-adds
 *     in the same order), and the three
 *     column copies the held sum writes (z, xBC, dt across the split
 *     column) bit for bit the product's columns.
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

START_TEST(test_tailcol_plan_2b)
{
    vk_cm_plan p, q;
    ck_assert(vk_cmp_plan_make(496, 8512, 2048, true, 49152, 132, &p));
    ck_assert_uint_eq(p.tiles_m, 4);
    ck_assert_uint_eq(p.tiles_n, 34);
    ck_assert_uint_eq(p.slices, 1);
    ck_assert_uint_eq(p.head_tn, 0);
    q = p;
    ck_assert(vk_cmp_plan_tailcol(&q, 2048, 132, VK_CMP_TAILCOL_DEFAULT));
    ck_assert_uint_eq(q.head_tn, 33);
    ck_assert_uint_eq(q.slices, 8);
    ck_assert_uint_eq(q.k_split, 256);
    uint32_t ldt, ldp;
    uint64_t tail, slice;
    vk_cm_raw_layout(&q, &ldp, &slice);
    uint64_t all = vk_cm_raw_tail(&q, &ldt, &tail);
    ck_assert_uint_eq(ldp, 34 * 256);
    ck_assert_uint_eq(ldt, 256);
    ck_assert_uint_eq(tail, 512 * 256);
    ck_assert_uint_eq(all, 512ull * 34 * 256 + 7ull * 512 * 256);
    /* max_slices and K bound S */
    q = p;
    ck_assert(vk_cmp_plan_tailcol(&q, 2048, 132, 4));
    ck_assert_uint_eq(q.slices, 4);
    q = p;
    ck_assert(vk_cmp_plan_tailcol(&q, 1024, 132, 8));
    ck_assert_uint_eq(q.slices, 4);
    /* left alone: off, wave 0, a wave of tiles or fewer, the 9B shapes (gate / up: a last
     * wave of 92 tiles; in_proj: two whole waves), K of one slice */
    static const uint32_t left[][5] = {{496, 8512, 2048, 132, 0}, {496, 8512, 2048, 0, 8},
                                       {496, 8192, 2048, 132, 8}, {496, 14336, 4096, 132, 8},
                                       {496, 16896, 4096, 132, 8}, {496, 8512, 264, 132, 8}};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        const uint32_t *c = left[i];
        ck_assert(vk_cmp_plan_make(c[0], c[1], c[2], true, 49152, 132, &p));
        q = p;
        ck_assert(!vk_cmp_plan_tailcol(&q, c[2], c[3], c[4]));
        ck_assert(memcmp(&p, &q, sizeof p) == 0);
        uint32_t l1, l2;
        uint64_t s1, s2;
        vk_cm_raw_layout(&q, &l1, &s1);
        ck_assert_uint_eq(vk_cm_raw_tail(&q, &l2, &s2), q.slices * s1);
        ck_assert_uint_eq(l1, l2);
        ck_assert_uint_eq(s1, s2);
    }
}
END_TEST

/* The shader's mapping as the plan describes it (matmul_cmp.comp's header):
 * workgroup g < head = head_tn tiles_m is tile g in one slice of [0, k);
 * after it, slice (g - head) / rest of tile head + (g - head) % rest, K
 * [s k_split, min(k, (s + 1) k_split)); slice 0 stored in the whole grid
 * (ldp a row), slice s >= 1 at slice + (s - 1) tail, ldt a row, columns
 * from head_tn bn. Checks the invariants for plan q. */
static void check_mapping(const vk_cm_plan *q, uint32_t m, uint32_t n, uint32_t k)
{
    uint64_t tiles = (uint64_t)q->tiles_m * q->tiles_n;
    uint64_t head = (uint64_t)q->head_tn * q->tiles_m, rest = tiles - head;
    uint64_t groups = head + rest * q->slices;
    uint32_t ldp, ldt;
    uint64_t slice, tail;
    vk_cm_raw_layout(q, &ldp, &slice);
    uint64_t all = vk_cm_raw_tail(q, &ldt, &tail);
    ck_assert(q->tiles_m * q->bm >= m && q->tiles_n * q->bn >= n);
    ck_assert_uint_eq(q->k_split % q->bk, 0);
    /* K covered per tile: a count of K elements each tile's pieces cover, and the start of
     * the next expected range */
    /* each piece's row is one whole run of bn floats at a multiple of bn (ldp, ldt, the
     * slices' sizes and its first column are multiples of bn): one mark a run */
    ck_assert(ldp % q->bn == 0 && ldt % q->bn == 0 && slice % q->bn == 0 && tail % q->bn == 0);
    uint64_t *next = calloc(tiles, sizeof *next);
    uint8_t *seen = calloc(all / q->bn, 1);
    ck_assert(next && seen);
    for (uint64_t g = 0; g < groups; g++) {
        bool split = g >= head;
        uint64_t s = split ? (g - head) / rest : 0, t = split ? head + (g - head) % rest : g;
        uint64_t kb = s * q->k_split, ke = split ? kb + q->k_split : k;
        ke = ke < k ? ke : k;
        ck_assert_uint_lt(t, tiles);
        ck_assert_uint_eq(kb, next[t]); /* slices in order, none skipped or repeated */
        ck_assert_uint_gt(ke, kb);
        next[t] = ke;
        uint64_t tm = t % q->tiles_m, tn = t / q->tiles_m;
        ck_assert(split == (tn >= q->head_tn));
        uint64_t base = s == 0 ? 0 : slice + (s - 1) * tail, ld = s == 0 ? ldp : ldt;
        uint64_t c0 = s == 0 ? tn * q->bn : (tn - q->head_tn) * q->bn;
        ck_assert_uint_le(c0 + q->bn, ld);
        for (uint64_t r = tm * q->bm; r < (tm + 1) * q->bm; r++) {
            uint64_t at = base + r * ld + c0;
            ck_assert_uint_le(at + q->bn, all);
            ck_assert_msg(!seen[at / q->bn], "floats at %llu stored twice",
                          (unsigned long long)at);
            seen[at / q->bn] = 1;
        }
    }
    for (uint64_t t = 0; t < tiles; t++)
        ck_assert_uint_eq(next[t], k); /* every tile's K ranges partition [0, k) */
    free(next), free(seen);
}

START_TEST(test_tailcol_plan_grid)
{
    static const uint32_t ms[] = {65, 257, 496, 512};
    static const uint32_t ns[] = {300, 1000, 1088, 2100, 8512};
    static const uint32_t ks[] = {264, 1000, 2048, 4096};
    static const uint32_t waves[] = {4, 5, 16, 132};
    uint32_t applied = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t d = 0; d < 4; d++)
                for (size_t w = 0; w < 4; w++) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d], wave = waves[w];
                    vk_cm_plan p, q;
                    ck_assert(vk_cmp_plan_make(m, n, k, true, 49152, wave, &p));
                    q = p;
                    bool on = vk_cmp_plan_tailcol(&q, k, wave, 8);
                    uint64_t tiles = (uint64_t)p.tiles_m * p.tiles_n;
                    if (!on) {
                        ck_assert(memcmp(&p, &q, sizeof p) == 0);
                        continue;
                    }
                    applied++;
                    ck_assert_uint_gt(tiles, wave);
                    uint64_t head = (uint64_t)q.head_tn * q.tiles_m, rest = tiles - head;
                    /* the head fills whole waves at most, the rest one short wave */
                    ck_assert_uint_gt(head, 0);
                    ck_assert(head <= tiles / wave * wave && head + q.tiles_m > tiles / wave * wave);
                    ck_assert(rest > 0 && rest * 2 <= wave && rest * q.slices <= wave);
                    ck_assert(q.slices >= 2 && q.slices <= 8 && q.k_split >= VK_MM_MIN_SLICE);
                    check_mapping(&q, m, n, k);
                }
    ck_assert_uint_gt(applied, 10); /* the grid reaches the plan */
}
END_TEST

/* ---- on the device ---------------------------------------------------------------------- */

/* out = a · wᵀ ([m, n]) on vk, then copies of columns [0, c1), [c1, c2),
 * [c2, n) (the in_proj split; the held sum writes them): to o (m n floats)
 * and cp (m n floats, the three copies side by side as the columns). */
static void run_split(llmem_backend *vk, bool fast, int32_t m, int32_t k, int32_t n,
                      const float *a, const float *w, int32_t c1, int32_t c2, float *o, float *cp)
{
    llmem_buffer *b[6];
    llmem_tensor ta = vk_up_f32_2d(vk, &b[0], a, m, k), tw = vk_up_bf16_2d(vk, &b[1], w, n, k);
    llmem_tensor to = vk_up_f32_2d(vk, &b[2], NULL, m, n);
    int32_t c[4] = {0, c1, c2, n};
    llmem_tensor td[3];
    for (int i = 0; i < 3; i++)
        td[i] = vk_up_f32_2d(vk, &b[3 + i], NULL, m, c[i + 1] - c[i]);
    OK((fast ? llmem_op_matmul_fast : llmem_op_matmul)(vk, &ta, &tw, &to));
    for (int i = 0; i < 3; i++)
        OK(llmem_op_copy(vk, &to, c[i], &td[i]));
    get_f32(&to, o);
    float *t = malloc((size_t)m * n * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < 3; i++) {
        int32_t wdt = c[i + 1] - c[i];
        get_f32(&td[i], t);
        for (int32_t r = 0; r < m; r++)
            memcpy(cp + (size_t)r * n + c[i], t + (size_t)r * wdt, (size_t)wdt * sizeof *t);
    }
    free(t);
    for (int i = 0; i < 6; i++)
        llmem_buffer_free(b[i]);
}

/* m x k x n on `sms` units: head_cols, the columns of the whole tiles under the plan (those
 * bit for bit the setting 0's) */
static void check_case(llmem_backend *on, llmem_backend *off, int32_t m, int32_t k, int32_t n,
                       int32_t head_cols, bool fast)
{
    size_t mk = (size_t)m * k, mn = (size_t)m * n, nk = (size_t)n * k;
    float *a = rand_vals(mk, -1, 1, false), *w = rand_vals(nk, -1, 1, true);
    for (int32_t r = 0; r < m; r++) /* rows of different magnitudes: the row scales */
        for (int32_t i = 0; i < k; i++)
            a[(size_t)r * k + i] = ldexpf(a[(size_t)r * k + i], (r % 5) * 7 - 14);
    float *o1 = malloc(mn * 4), *c1 = malloc(mn * 4), *o0 = malloc(mn * 4), *c0 = malloc(mn * 4);
    double *ref = malloc(mn * sizeof *ref), *ad = malloc(mk * sizeof *ad);
    ck_assert(o1 && c1 && o0 && c0 && ref && ad);
    /* z / xBC / dt with the split column inside xBC */
    int32_t z = head_cols / 2, x = n - 8;
    run_split(on, fast, m, k, n, a, w, z, x, o1, c1);
    run_split(off, fast, m, k, n, a, w, z, x, o0, c0);
    for (size_t i = 0; i < mk; i++)
        ad[i] = a[i];
    vk_ref_mm(ad, w, m, k, n, ref);
    char what[128];
    snprintf(what, sizeof what, "%dx%dx%d %s tailcol", m, k, n, fast ? "fast" : "precise");
    vk_expect_close(o1, ref, m, n, fast ? vk_fast_rtol() : 1e-5, what);
    vk_expect_close(o0, ref, m, n, fast ? vk_fast_rtol() : 1e-5, what);
    ck_assert_msg(memcmp(o1, c1, mn * 4) == 0, "%s: the copies differ from the product", what);
    ck_assert_msg(memcmp(o0, c0, mn * 4) == 0, "%s: the copies differ (setting 0)", what);
    for (int32_t r = 0; r < m; r++)
        ck_assert_msg(memcmp(o1 + (size_t)r * n, o0 + (size_t)r * n, (size_t)head_cols * 4) == 0,
                      "%s: row %d of the whole tiles differs from the setting 0", what, r);
    free(a), free(w), free(o1), free(c1), free(o0), free(c0), free(ref), free(ad);
}

/* 65 rows (one partial row tile) on 5 units: 6 column tiles, the last partial (1320 = 5 x
 * 256 + 40), K 1024 in 4 slices; 257 rows on 6 units: 3 x 3 tiles, K 600 in 2 slices (the
 * last shorter); 496 rows on 16: 4 x 5 tiles (1088 = 4 x 256 + 64), K 2048 in 4 slices */
START_TEST(test_tailcol_device)
{
    static const struct {
        const char *sms;
        int32_t m, k, n, head_cols;
    } cases[] = {{"5", 65, 1024, 1320, 1280}, {"6", 257, 600, 612, 512}, {"16", 496, 2048, 1088, 1024}};
    /* two backends, on: $LLMEM_VULKAN_CMP_TAILCOL=8; off: =0 and $LLMEM_VULKAN_CMP_TAIL=0
     * (one slice a tile for products above a wave); the knobs and the unit count read per
     * case by llmem_backend_reload_env (the NVIDIA driver refuses instances after about two
     * dozen in a process, and each open builds its pipelines again) */
    llmem_backend *on = test_open("vulkan"), *off = test_open("vulkan");
    test_env keep_sm = test_env_save("LLMEM_VULKAN_SM_COUNT");
    test_env keep = test_env_save("LLMEM_VULKAN_CMP_TAILCOL");
    test_env keep_tail = test_env_save("LLMEM_VULKAN_CMP_TAIL");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_env_put("LLMEM_VULKAN_SM_COUNT", cases[i].sms);
        for (int b = 0; b < 2; b++) {
            test_env_restore(&keep);
            test_env_restore(&keep_tail);
            test_env_put("LLMEM_VULKAN_CMP_TAILCOL", b == 0 ? "8" : "0");
            if (b == 1)
                test_env_put("LLMEM_VULKAN_CMP_TAIL", "0");
            OK(llmem_backend_reload_env(b == 0 ? on : off));
        }
        for (int fast = 0; fast < 2; fast++)
            check_case(on, off, cases[i].m, cases[i].k, cases[i].n, cases[i].head_cols,
                       fast == 1);
    }
    test_env_restore(&keep_sm);
    test_env_restore(&keep);
    test_env_restore(&keep_tail);
    llmem_backend_close(on);
    llmem_backend_close(off);
}
END_TEST

int main(void)
{
    vk_test_seed();
    Suite *s = suite_create("vulkan_cmp_tailcol");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_tailcol_plan_2b);
    tcase_add_test(tc, test_tailcol_plan_grid);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    if (vulkan_opens("test_vulkan_cmp_tailcol", "the plan only")) {
        TCase *td = tcase_create("device");
        tcase_set_timeout(td, 300);
        tcase_add_test(td, test_tailcol_device);
        suite_add_tcase(s, td);
    }
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ctest-labels: core vulkan
/* matmul_dec.comp, the Vulkan decode GEMM of 9-64 rows that streams the
 * weights with each subgroup on its own (issue 12; backends/vulkan/
 * vk_mm_pick.c vk_dec_plan_make, vk_ops_matmul.c cm_product_as).
 *
 * Without a device (vk_mm_pick.c is compiled in): its plans keep the
 * invariants the shader relies on (row tiles of the blocking's rows, or
 * one of all rows, covering m, column
 * tiles covering n, split-K slices of whole K steps covering k, a chunk
 * of whole K steps no longer than a slice, apf exactly when a slice has
 * several chunks, the shared memory within the device's limit) over a
 * grid of shapes at the default blocking and at every blocking the
 * shader takes; two shapes worked by hand; blockings it does not take and
 * shapes outside 1-64 rows are refused; vk_dec_used's row range, and the
 * default (AUTO) taking 9-16 rows in both modes, AUTO_FAST in fast mode only;
 * matmul_cm.comp's layouts at 17-64 rows (vk_cm_plan_mid) by hand, refused
 * and within shared memory.
 *
 * On a Vulkan device: products at 9, 16, 17, 40 and 64 rows (partial
 * row and column tiles, K not a multiple of the K step, split-K, one and
 * several activation chunks a slice), rows scaled by 2^-60 .. 2^60 and
 * bf16 weights spanning 2^-17 .. 2^10, precise and fast, against float64
 * row by row, at the default blocking ($LLMEM_VULKAN_DEC=1), the old plans
 * ($LLMEM_VULKAN_DEC=0), the default route (AUTO), fast mode only (4) and three other
 * blockings ($LLMEM_VULKAN_DEC_CFG), in 32-row and 16-row tiles
 * ($LLMEM_VULKAN_DEC_ROWS), with the L2 prefetch at its default,
 * off and at two other settings ($LLMEM_VULKAN_DEC_PF, _PF_LAG, _PF_SEG);
 * the prefetch loads only feed a store that never runs, so its products
 * equal those without it bit for bit; and a product whose shapes do not
 * match returns an error and leaves its output as it was; matmul_cm.comp at
 * its 17-64-row layouts ($LLMEM_VULKAN_CM_MID) against float64 and bit for
 * bit the plans of vk_cm_plan_make. Where the device has no cooperative matrices
 * (lavapipe) the same products take the SIMT path. */
#include "support/run.h"
#include "support/vk_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk_mm_pick.c"

/* the SM count the plans below were written for (the H200's; vk_mm_pick.h) */
#define H200_SMS 132u

#define SMEM 49152u /* the H200's maxComputeSharedMemorySize */

static uint32_t ceil_div(uint32_t a, uint32_t b)
{
    return (a + b - 1) / b;
}

/* The invariants of a plan of m x n x k with split terms (see the top). */
static void check_plan(const vk_dec_plan *p, const vk_dec_cfg *c, uint32_t m, uint32_t n,
                       uint32_t k, uint32_t split, uint32_t smem)
{
    const vk_cm_plan *q = &p->cm;
    ck_assert_uint_eq(q->sgm, 1);
    ck_assert_uint_eq(q->sgn * 32, c->wg);
    ck_assert_uint_eq(p->wg, c->wg);
    ck_assert_uint_eq(q->fn, c->fn);
    ck_assert_uint_eq(q->bk, c->bk);
    ck_assert_uint_eq(q->stages, c->depth);
    /* rows a tile: the blocking's, or all m rounded up to 16 */
    uint32_t rows = c->rows && c->rows < m ? c->rows : m;
    ck_assert_uint_ge(q->bm, rows);
    ck_assert_uint_lt(q->bm - rows, 16);
    ck_assert_uint_eq(q->bm % 16, 0);
    ck_assert_uint_ge((uint64_t)q->tiles_m * q->bm, m);
    ck_assert_uint_lt((uint64_t)(q->tiles_m - 1) * q->bm, m);
    ck_assert_uint_eq(q->fm * 16, q->bm);
    ck_assert_uint_eq(q->bn, 16 * c->fn * (c->wg / 32));
    ck_assert_uint_ge((uint64_t)q->tiles_n * q->bn, n);
    ck_assert_uint_lt((uint64_t)(q->tiles_n - 1) * q->bn, n);
    ck_assert_uint_eq(q->k_split % q->bk, 0);
    ck_assert_uint_ge((uint64_t)q->slices * q->k_split, k);
    ck_assert_uint_lt((uint64_t)(q->slices - 1) * q->k_split, k);
    uint32_t most = k / VK_MM_MIN_SLICE > 1 ? k / VK_MM_MIN_SLICE : 1;
    ck_assert_uint_le(q->slices, most);
    ck_assert_uint_eq(p->ka % q->bk, 0);
    ck_assert_uint_ge(p->ka, q->bk);
    ck_assert_uint_le(p->ka, c->ka);
    ck_assert_uint_le(p->ka, q->k_split);
    ck_assert_uint_eq(p->apf, q->k_split > p->ka ? 1u : 0u);
    /* shared memory counted by hand: terms, then 16 fn staged columns per subgroup */
    uint32_t bytes = split * q->bm * (p->ka + 8) * 2 + (c->wg / 32) * 16 * c->fn * (c->bk + 8) * 2;
    ck_assert_uint_le(bytes + 1024, smem);
}

START_TEST(test_dec_plan_grid)
{
    static const uint32_t ns[] = {1, 17, 300, 2048, 4096, 8512, 14336, 16768, 128256};
    static const uint32_t ks[] = {8, 264, 1000, 2048, 4096, 8192, 14336};
    static const vk_dec_cfg cfgs[] = {{256, 1, 64, 2, 512, 264, 0}, {128, 2, 128, 3, 128, 264, 0},
                                      {64, 1, 32, 1, 64, 1000, 0},  {256, 2, 64, 3, 1024, 132, 0},
                                      {128, 2, 64, 3, 128, 264, 0}, {64, 1, 128, 3, 256, 1000, 0},
                                      {96, 1, 64, 2, 192, 7, 0},
                                      {256, 1, 64, 2, 128, 264, 32},
                                      {256, 1, 64, 2, 512, 264, 16},
                                      {128, 2, 64, 3, 256, 528, 48}};
    int planned = 0;
    for (uint32_t split = 1; split <= 2; split++)
        for (uint32_t m = 1; m <= 64; m++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                    for (size_t ci = 0; ci <= sizeof cfgs / sizeof cfgs[0]; ci++) {
                        vk_dec_cfg c;
                        if (ci == 0)
                            vk_dec_cfg_default(m, split, H200_SMS, &c);
                        else
                            c = cfgs[ci - 1];
                        vk_dec_plan p;
                        bool ok = vk_dec_plan_make(m, ns[ni], ks[ki], split, &c, SMEM, &p);
                        /* refused exactly when not even a chunk of one K step fits */
                        uint32_t rows = c.rows && c.rows < m ? c.rows : m;
                        uint32_t least = split * ceil_div(rows, 16) * 16 * (c.bk + 8) * 2 +
                                         (c.wg / 32) * 16 * c.fn * (c.bk + 8) * 2;
                        ck_assert_msg(ok == (least + 1024 <= SMEM),
                                      "m %u n %u k %u split %u cfg %zu: %s", m, ns[ni], ks[ki],
                                      split, ci, ok ? "taken" : "refused");
                        ck_assert_msg(ok || ci > 0, "the default blocking refused");
                        if (ok) {
                            check_plan(&p, &c, m, ns[ni], ks[ki], split, SMEM);
                            planned++;
                        }
                    }
    ck_assert_int_gt(planned, 2 * 64 * 9 * 7 * 6); /* most of them */
}
END_TEST

/* Two plans worked by hand (the default blocking at 16 rows: 256
 * invocations, 128 columns a tile, K steps of 64, depth 2, chunks of 512,
 * 264 workgroups aimed at). */
START_TEST(test_dec_plan_by_hand)
{
    vk_dec_cfg c = {256, 1, 64, 2, 512, 264, 0};
    vk_dec_plan p;
    /* 16 x 14336 x 4096, fast: 112 tiles, 264 / 112 = 2.36 -> 2 slices of 2048; the terms
     * 16 x 520 halves (16,640 bytes) + 8 x 16 x 72 halves (18,432) fit: chunks of 512, 4 a
     * slice */
    ck_assert(vk_dec_plan_make(16, 14336, 4096, 1, &c, SMEM, &p));
    ck_assert_uint_eq(p.cm.tiles_n, 112);
    ck_assert_uint_eq(p.cm.slices, 2);
    ck_assert_uint_eq(p.cm.k_split, 2048);
    ck_assert_uint_eq(p.ka, 512);
    ck_assert_uint_eq(p.apf, 1);
    /* precise: 2 x 16,640 + 18,432 = 51,712 > 48 KiB - 1 KiB, so chunks of 256 (35,328) */
    ck_assert(vk_dec_plan_make(16, 14336, 4096, 2, &c, SMEM, &p));
    ck_assert_uint_eq(p.ka, 256);
    ck_assert_uint_eq(p.apf, 1);
    /* 9 x 4096 x 1000 (a 2b-sized row count, K not a multiple of 64): 32 tiles, 264 / 32 =
     * 8.25 -> 8, but at most 1000 / 256 = 3 slices: k_split ceil(334 / 64) 64 = 384, 3
     * slices (384, 384, 232); one chunk of 384 a slice */
    ck_assert(vk_dec_plan_make(9, 4096, 1000, 1, &c, SMEM, &p));
    ck_assert_uint_eq(p.cm.bm, 16);
    ck_assert_uint_eq(p.cm.tiles_n, 32);
    ck_assert_uint_eq(p.cm.slices, 3);
    ck_assert_uint_eq(p.cm.k_split, 384);
    ck_assert_uint_eq(p.ka, 384);
    ck_assert_uint_eq(p.apf, 0);
    /* 64 x 14336 x 4096 as two 32-row tiles, chunks of 128: 112 x 2 = 224 tiles, 264 / 224 =
     * 1.18 -> 1 slice of 4096; the terms 32 x 136 halves (8,704 bytes) fast, 17,408 precise */
    c = (vk_dec_cfg){256, 1, 64, 2, 128, 264, 32};
    ck_assert(vk_dec_plan_make(64, 14336, 4096, 1, &c, SMEM, &p));
    ck_assert_uint_eq(p.cm.bm, 32);
    ck_assert_uint_eq(p.cm.fm, 2);
    ck_assert_uint_eq(p.cm.tiles_m, 2);
    ck_assert_uint_eq(p.cm.tiles_n, 112);
    ck_assert_uint_eq(p.cm.slices, 1);
    ck_assert_uint_eq(p.cm.k_split, 4096);
    ck_assert_uint_eq(p.ka, 128);
    ck_assert_uint_eq(p.apf, 1);
    /* 40 x 4096 x 14336 in 32-row tiles: 2 (the second of 8 rows) x 32 = 64 tiles, 264 / 64 =
     * 4.1 -> 4 slices of 3584 */
    ck_assert(vk_dec_plan_make(40, 4096, 14336, 2, &c, SMEM, &p));
    ck_assert_uint_eq(p.cm.bm, 32);
    ck_assert_uint_eq(p.cm.tiles_m, 2);
    ck_assert_uint_eq(p.cm.tiles_n, 32);
    ck_assert_uint_eq(p.cm.slices, 4);
    ck_assert_uint_eq(p.cm.k_split, 3584);
    /* rows at or above m: one tile of all rows */
    c.rows = 64;
    ck_assert(vk_dec_plan_make(40, 4096, 14336, 2, &c, SMEM, &p));
    ck_assert_uint_eq(p.cm.bm, 48);
    ck_assert_uint_eq(p.cm.tiles_m, 1);
}
END_TEST

START_TEST(test_dec_plan_refused)
{
    vk_dec_cfg ok = {256, 1, 64, 2, 512, 264, 0};
    vk_dec_plan p;
    ck_assert(!vk_dec_plan_make(0, 4096, 4096, 1, &ok, SMEM, &p));
    ck_assert(!vk_dec_plan_make(65, 4096, 4096, 1, &ok, SMEM, &p));
    ck_assert(!vk_dec_plan_make(16, 4096, 0, 1, &ok, SMEM, &p));
    ck_assert(!vk_dec_plan_make(16, 4096, 4100, 1, &ok, SMEM, &p)); /* K % 8 */
    ck_assert(!vk_dec_plan_make(16, 4096, 4096, 3, &ok, SMEM, &p)); /* split 1 or 2 */
    ck_assert(!vk_dec_plan_make(16, 4096, 4096, 1, &ok, 4096, &p)); /* 4 KiB of shared memory */
    static const vk_dec_cfg bad[] = {
        {48, 1, 64, 2, 512, 264, 0},  {512, 1, 64, 2, 512, 264, 0}, {100, 1, 64, 2, 512, 264, 0},
        {256, 3, 64, 2, 512, 264, 0}, {256, 1, 48, 2, 512, 264, 0}, {256, 1, 256, 2, 512, 264, 0},
        {256, 1, 64, 0, 512, 264, 0}, {256, 1, 64, 4, 512, 264, 0}, {256, 1, 64, 2, 96, 264, 0},
        {256, 1, 64, 2, 32, 264, 0},  {256, 1, 64, 2, 512, 0, 0},   {256, 1, 64, 2, 512, 264, 8},
        {256, 1, 64, 2, 512, 264, 24}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!vk_dec_plan_make(16, 4096, 4096, 1, &bad[i], SMEM, &p), "cfg %zu taken", i);
}
END_TEST

/* vk_cm_plan_mid (matmul_cm.comp's layouts at 17-64 rows, $LLMEM_VULKAN_CM_MID): two plans
 * worked by hand, the layouts it refuses, and the shared memory it counts (the arithmetic in
 * the comments); a refused plan leaves *p as it was. */
START_TEST(test_cm_mid_plan)
{
    vk_cm_plan p;
    /* 64 x 14336 x 4096 at 256,2,2,64,1: 8 subgroups as 2 x 4 of FM 2 x FN 2 matrices: a 64 x
     * 128 tile, 14336 / 128 = 112 column tiles, one slice of 4096 */
    const uint32_t a[5] = {256, 2, 2, 64, 1};
    ck_assert(vk_cm_plan_mid(64, 14336, 4096, 2, a, SMEM, &p));
    ck_assert_uint_eq(p.sgm, 2);
    ck_assert_uint_eq(p.sgn, 4);
    ck_assert_uint_eq(p.fm, 2);
    ck_assert_uint_eq(p.fn, 2);
    ck_assert_uint_eq(p.bm, 64);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.bk, 64);
    ck_assert_uint_eq(p.stages, 1);
    ck_assert_uint_eq(p.tiles_m, 1);
    ck_assert_uint_eq(p.tiles_n, 112);
    ck_assert_uint_eq(p.slices, 1);
    ck_assert_uint_eq(p.k_split, 4096);
    /* 40 x 300 x 1000 at 512,2,1,64,2: 16 subgroups as 2 x 8, FM ceil(40 / 32) = 2: 64 x 128,
     * 3 column tiles (the last of 44 columns), K rounded up to 16 steps of 64 = 1024 */
    const uint32_t b[5] = {512, 2, 1, 64, 2};
    ck_assert(vk_cm_plan_mid(40, 300, 1000, 2, b, SMEM, &p));
    ck_assert_uint_eq(p.sgn, 8);
    ck_assert_uint_eq(p.fm, 2);
    ck_assert_uint_eq(p.bm, 64);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.tiles_m, 1);
    ck_assert_uint_eq(p.tiles_n, 3);
    ck_assert_uint_eq(p.k_split, 1024);
    /* shared memory: 512,2,1,64 at 64 rows holds (2 x 64 + 128) rows x 9 uvec4s = 36,864 bytes;
     * with one register set also 16 subgroups' epilogue matrices, 16 x 16 x 20 floats = 20,480:
     * 36,864 + 20,480 + 1,024 > 49,152, refused; with 2 sets 37,888, taken */
    const uint32_t c1[5] = {512, 2, 1, 64, 1}, c2[5] = {512, 2, 1, 64, 2};
    ck_assert(!vk_cm_plan_mid(64, 4096, 4096, 2, c1, SMEM, &p));
    ck_assert(vk_cm_plan_mid(64, 4096, 4096, 2, c2, SMEM, &p));
    ck_assert(!vk_cm_plan_mid(64, 4096, 4096, 2, c2, 37887, &p));
    ck_assert(vk_cm_plan_mid(64, 4096, 4096, 2, c2, 37888, &p));
    /* 512,2,2,64,2: precise (128 + 256) x 144 + 1,024 = 56,320 bytes, refused at 48 KiB; fast
     * (64 + 256) x 144 + 1,024 = 47,104, taken */
    const uint32_t c3[5] = {512, 2, 2, 64, 2};
    ck_assert(!vk_cm_plan_mid(64, 4096, 4096, 2, c3, SMEM, &p));
    ck_assert(vk_cm_plan_mid(64, 4096, 4096, 1, c3, SMEM, &p));
    ck_assert(!vk_cm_plan_mid(64, 4096, 4096, 1, c3, 47103, &p));
    ck_assert(!vk_cm_plan_mid(64, 4096, 4096, 3, c3, SMEM, &p)); /* split 1 or 2 */
    static const uint32_t bad[][5] = {
        {256, 0, 2, 64, 1}, {96, 2, 2, 64, 1},  {32, 1, 2, 64, 1},  {2048, 2, 1, 64, 2},
        {256, 2, 3, 64, 1}, {256, 2, 2, 48, 1}, {256, 2, 2, 128, 1}, {256, 2, 2, 64, 0},
        {256, 2, 2, 64, 4}, {256, 3, 2, 64, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&p, 0xab, sizeof p);
        ck_assert_msg(!vk_cm_plan_mid(64, 4096, 4096, 2, bad[i], SMEM, &p), "cfg %zu taken", i);
        ck_assert_uint_eq(p.sgm, 0xabababab);
        ck_assert_uint_eq(p.k_split, 0xabababab);
    }
    /* rows outside 17-64 */
    ck_assert(!vk_cm_plan_mid(16, 4096, 4096, 2, a, SMEM, &p));
    ck_assert(!vk_cm_plan_mid(65, 4096, 4096, 2, a, SMEM, &p));
    ck_assert(vk_cm_plan_mid(17, 4096, 4096, 2, a, SMEM, &p));
    ck_assert_uint_eq(p.fm, 1);
    ck_assert_uint_eq(p.bm, 32);
    /* the default layouts fit 48 KiB at 64 rows in their modes */
    const uint32_t df[5] = VK_CM_MID_FAST, dp[5] = VK_CM_MID_PRECISE;
    ck_assert(vk_cm_plan_mid(64, 14336, 4096, 1, df, SMEM, &p));
    ck_assert_uint_eq(p.bn, 256);
    ck_assert_uint_eq(p.tiles_n, 56);
    ck_assert(vk_cm_plan_mid(64, 14336, 4096, 2, dp, SMEM, &p));
    ck_assert_uint_eq(p.bn, 128);
}
END_TEST

/* vk_cm_mid_cfg: the defaults by mode from VK_CM_MID_ROWS (33) to 64 rows; $LLMEM_VULKAN_CM_MID's
 * layout in both modes from its rows; "0": none. */
START_TEST(test_cm_mid_cfg)
{
    vk_mm_caps c = {.coopmat = true};
    uint32_t cfg[5];
    const uint32_t df[5] = VK_CM_MID_FAST, dp[5] = VK_CM_MID_PRECISE;
    ck_assert(!vk_cm_mid_cfg(&c, 32, 1, cfg));
    ck_assert(vk_cm_mid_cfg(&c, 33, 1, cfg));
    ck_assert(memcmp(cfg, df, sizeof cfg) == 0);
    ck_assert(vk_cm_mid_cfg(&c, 64, 2, cfg));
    ck_assert(memcmp(cfg, dp, sizeof cfg) == 0);
    ck_assert(!vk_cm_mid_cfg(&c, 65, 1, cfg));
    c.cm_mid_set = true; /* "0" */
    ck_assert(!vk_cm_mid_cfg(&c, 64, 1, cfg));
    ck_assert(!vk_cm_mid_cfg(&c, 64, 2, cfg));
    const uint32_t set[5] = {256, 1, 2, 32, 3};
    memcpy(c.cm_mid, set, sizeof set);
    c.cm_mid_rows = 17;
    ck_assert(!vk_cm_mid_cfg(&c, 16, 2, cfg));
    ck_assert(vk_cm_mid_cfg(&c, 17, 2, cfg));
    ck_assert(memcmp(cfg, set, sizeof cfg) == 0);
    ck_assert(vk_cm_mid_cfg(&c, 40, 1, cfg));
    ck_assert(memcmp(cfg, set, sizeof cfg) == 0);
}
END_TEST

/* vk_cm_plan_narrow: the 64 x 64 layout for short fast-mode products, worked by hand at the 2b
 * and 9B shapes' products (the default plan: VK_CM_MID_FAST at 132 workgroups); refused in
 * precise mode, under $LLMEM_VULKAN_CM_MID, and at "0". */
START_TEST(test_cm_plan_narrow)
{
    vk_mm_caps c = {.coopmat = true};
    const uint32_t df[5] = VK_CM_MID_FAST, nar[7] = VK_CM_NARROW;
    uint32_t cfg[5];
    vk_cm_plan p, q;
    /* 64 x 2048 x 4096 (2b out_proj): 8 tiles of 64 x 256, 132 / 8 = 16 slices of 256 = 4 K
     * steps, below 10: 32 tiles of 64 x 64, round(264 / 32) = 8 slices of 512 */
    ck_assert(vk_cm_plan_mid(64, 2048, 4096, 1, df, SMEM, &p));
    vk_cm_plan_wave(&p, 4096, 132);
    ck_assert_uint_eq(p.slices, 16);
    ck_assert(vk_cm_plan_narrow(&c, 64, 2048, 4096, 1, &p, SMEM, cfg, &q));
    ck_assert(memcmp(cfg, nar, sizeof cfg) == 0);
    ck_assert_uint_eq(q.sgm, 2);
    ck_assert_uint_eq(q.sgn, 4);
    ck_assert_uint_eq(q.fm, 2);
    ck_assert_uint_eq(q.fn, 1);
    ck_assert_uint_eq(q.bm, 64);
    ck_assert_uint_eq(q.bn, 64);
    ck_assert_uint_eq(q.tiles_n, 32);
    ck_assert_uint_eq(q.slices, 8);
    ck_assert_uint_eq(q.k_split, 512);
    /* 64 x 8192 x 2048 (2b MLP up): 32 tiles, 4 slices of 512 = 8 steps: 128 tiles of 64 x 64,
     * round(264 / 128) = 2 slices of 1024 */
    ck_assert(vk_cm_plan_mid(64, 8192, 2048, 1, df, SMEM, &p));
    vk_cm_plan_wave(&p, 2048, 132);
    ck_assert_uint_eq(p.k_split, 512);
    ck_assert(vk_cm_plan_narrow(&c, 64, 8192, 2048, 1, &p, SMEM, cfg, &q));
    ck_assert_uint_eq(q.tiles_n, 128);
    ck_assert_uint_eq(q.slices, 2);
    ck_assert_uint_eq(q.k_split, 1024);
    /* 64 x 8512 x 2048 (2b in_proj): 34 tiles, 3 slices of 704 = 11 steps: kept */
    ck_assert(vk_cm_plan_mid(64, 8512, 2048, 1, df, SMEM, &p));
    vk_cm_plan_wave(&p, 2048, 132);
    ck_assert_uint_eq(p.k_split, 704);
    memset(&q, 0xab, sizeof q);
    ck_assert(!vk_cm_plan_narrow(&c, 64, 8512, 2048, 1, &p, SMEM, cfg, &q));
    ck_assert_uint_eq(q.k_split, 0xabababab);
    /* 64 x 4096 x 8192 (9B out_proj): 16 tiles, 8 slices of 1024 = 16 steps: kept */
    ck_assert(vk_cm_plan_mid(64, 4096, 8192, 1, df, SMEM, &p));
    vk_cm_plan_wave(&p, 8192, 132);
    ck_assert(!vk_cm_plan_narrow(&c, 64, 4096, 8192, 1, &p, SMEM, cfg, &q));
    /* 64 x 2048 x 2048 (2b attention output): 8 slices of 256 either way (k / 256 = 8) */
    ck_assert(vk_cm_plan_mid(64, 2048, 2048, 1, df, SMEM, &p));
    vk_cm_plan_wave(&p, 2048, 132);
    ck_assert(vk_cm_plan_narrow(&c, 64, 2048, 2048, 1, &p, SMEM, cfg, &q));
    ck_assert_uint_eq(q.slices, 8);
    ck_assert_uint_eq(q.k_split, 256);
    /* precise mode, $LLMEM_VULKAN_CM_MID given, "0": none */
    ck_assert(vk_cm_plan_mid(64, 2048, 4096, 1, df, SMEM, &p));
    vk_cm_plan_wave(&p, 4096, 132);
    ck_assert(!vk_cm_plan_narrow(&c, 64, 2048, 4096, 2, &p, SMEM, cfg, &q));
    c.cm_mid_set = true;
    ck_assert(!vk_cm_plan_narrow(&c, 64, 2048, 4096, 1, &p, SMEM, cfg, &q));
    c.cm_mid_set = false;
    c.cm_narrow_set = true; /* cm_narrow[0] 0: "0" */
    ck_assert(!vk_cm_plan_narrow(&c, 64, 2048, 4096, 1, &p, SMEM, cfg, &q));
    /* a layout of its own: 128 invocations as 2 x 2 of 32 x 32 (64 x 64), at most 100 steps,
     * 528 workgroups: 32 tiles, round(528 / 32) = 17 slices, at most 4096 / 256 = 16 */
    const uint32_t own[7] = {128, 2, 2, 64, 3, 100, 528};
    memcpy(c.cm_narrow, own, sizeof own);
    ck_assert(vk_cm_plan_narrow(&c, 64, 2048, 4096, 1, &p, SMEM, cfg, &q));
    ck_assert(memcmp(cfg, own, sizeof cfg) == 0);
    ck_assert_uint_eq(q.sgn, 2);
    ck_assert_uint_eq(q.bn, 64);
    ck_assert_uint_eq(q.slices, 16);
    ck_assert_uint_eq(q.k_split, 256);
    /* one that vk_cm_plan_mid refuses (SETS 4) */
    c.cm_narrow[4] = 4;
    ck_assert(!vk_cm_plan_narrow(&c, 64, 2048, 4096, 1, &p, SMEM, cfg, &q));
}
END_TEST

START_TEST(test_dec_used_rows)
{
    vk_mm_caps c = {.coopmat = true, .dec = VK_DEC_KHR};
    for (uint32_t split = 1; split <= 2; split++) {
        c.dec = VK_DEC_KHR;
        ck_assert(!vk_dec_used(&c, 8, split));
        ck_assert(vk_dec_used(&c, 9, split));
        ck_assert(vk_dec_used(&c, 64, split));
        ck_assert(!vk_dec_used(&c, 65, split));
        c.dec = VK_DEC_NV;
        ck_assert(vk_dec_used(&c, 16, split));
        c.dec = VK_DEC_OFF;
        ck_assert(!vk_dec_used(&c, 16, split));
    }
    c = (vk_mm_caps){.coopmat = false, .dec = VK_DEC_KHR};
    ck_assert(!vk_dec_used(&c, 16, 1));
    /* the default: 9-16 rows, both modes, and 17-32 in fast mode (dec_fast_rows 0: 32; 16: the
     * route before); AUTO_FAST: 9-16 rows in fast mode (one term) only */
    ck_assert_int_eq(VK_DEC_DEFAULT, VK_DEC_AUTO);
    c = (vk_mm_caps){.coopmat = true, .dec = VK_DEC_AUTO};
    for (uint32_t split = 1; split <= 2; split++) {
        ck_assert(!vk_dec_used(&c, 8, split));
        ck_assert(vk_dec_used(&c, 9, split));
        ck_assert(vk_dec_used(&c, 16, split));
        ck_assert(vk_dec_used(&c, 17, split) == (split == 1));
        ck_assert(vk_dec_used(&c, 32, split) == (split == 1));
        ck_assert(!vk_dec_used(&c, 33, split));
        ck_assert(!vk_dec_used(&c, 64, split));
    }
    c.dec_fast_rows = 16;
    ck_assert(vk_dec_used(&c, 16, 1));
    ck_assert(!vk_dec_used(&c, 17, 1));
    c.dec_fast_rows = 0;
    /* from cm_min rows ($LLMEM_VULKAN_CM_MIN; 0 unset: VK_MM_CM_MIN) */
    c.cm_min = 2;
    ck_assert(!vk_dec_used(&c, 1, 1));
    ck_assert(vk_dec_used(&c, 2, 1) && vk_dec_used(&c, 8, 2));
    c.cm_min = 0;
    vk_dec_cfg dc;
    vk_dec_cfg_default(32, 1, H200_SMS, &dc);
    ck_assert_uint_eq(dc.ka, 64);
    vk_dec_cfg_default(32, 2, H200_SMS, &dc);
    ck_assert_uint_eq(dc.ka, 128);
    vk_dec_cfg_default(33, 1, H200_SMS, &dc);
    ck_assert_uint_eq(dc.ka, 128);
    c.dec = VK_DEC_AUTO_FAST;
    ck_assert(!vk_dec_used(&c, 8, 1));
    ck_assert(vk_dec_used(&c, 9, 1));
    ck_assert(vk_dec_used(&c, 16, 1));
    ck_assert(!vk_dec_used(&c, 17, 1));
    ck_assert(!vk_dec_used(&c, 16, 2));
    ck_assert(!vk_dec_used(&c, 9, 2));
    c.dec = VK_DEC_AUTO;
    c.coopmat = false;
    ck_assert(!vk_dec_used(&c, 16, 1));
    ck_assert(!vk_dec_used(&c, 16, 2));
}
END_TEST

/* ---- on a device -------------------------------------------------------------------------- */

/* out[m, n] = a · wᵀ on be with w as bf16 (precise, or fast). */
static void run_mm(llmem_backend *be, const float *a, const float *w, int32_t m, int32_t k,
                   int32_t n, bool fast, float *out)
{
    llmem_buffer *ba, *bw, *bw2, *bo;
    llmem_tensor ta = vk_up_f32_2d(be, &ba, a, m, k);
    llmem_tensor tw = vk_up_f32_2d(be, &bw, w, n, k);
    llmem_tensor t16 = {NULL, 0, BF16, 2, {n, k, 1, 1}};
    OK(llmem_buffer_alloc(be, llmem_tensor_nbytes(&t16), &bw2));
    t16.buf = bw2;
    OK(llmem_op_copy(be, &tw, 0, &t16));
    llmem_tensor to = vk_up_f32_2d(be, &bo, NULL, m, n);
    OK(fast ? llmem_op_matmul_fast(be, &ta, &t16, &to) : llmem_op_matmul(be, &ta, &t16, &to));
    OK(llmem_buffer_download(bo, 0, out, (size_t)m * n * 4));
    llmem_buffer_free(ba), llmem_buffer_free(bw), llmem_buffer_free(bw2), llmem_buffer_free(bo);
}

/* One product of m x k x n: rows scaled by 2^((r % 7) 20 - 60), bf16-exact
 * weights of 2^-17 .. 2^10, each output row within rtol (precise 1e-5:
 * an f32 product; fast vk_fast_rtol(): one f16 term, 2^-11 per element, or
 * one bf16 term with $LLMEM_VULKAN_BF16) of its
 * largest |float64 reference|. */
static void dec_case(llmem_backend *vk, int32_t m, int32_t k, int32_t n, const char *cfg)
{
    float *a = malloc((size_t)m * k * 4), *w = malloc((size_t)n * k * 4);
    float *o = malloc((size_t)m * n * 4);
    double *ref = malloc((size_t)m * n * sizeof *ref);
    ck_assert(a && w && o && ref);
    for (int32_t r = 0; r < m; r++)
        for (int32_t i = 0; i < k; i++)
            a[(size_t)r * k + i] = ldexpf(frand(-1, 1), (r % 7) * 20 - 60);
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = ldexpf(frand(-1, 1), (int)(i % 28) - 17);
    vk_trunc_bf16(w, (size_t)n * k); /* bf16-exact: the device's copy holds these values */
    vk_ref_mm_f32(a, w, m, k, n, ref);
    for (int fast = 0; fast < 2; fast++) {
        for (size_t i = 0; i < (size_t)m * n; i++)
            o[i] = NAN;
        run_mm(vk, a, w, m, k, n, fast, o);
        char what[160];
        snprintf(what, sizeof what, "%s%s %dx%dx%d", cfg, fast ? " fast" : "", m, k, n);
        vk_expect_close(o, ref, m, n, fast ? vk_fast_rtol() : 1e-5, what);
    }
    free(a), free(w), free(o), free(ref);
}

START_TEST(test_dec_products)
{
    /* $LLMEM_VULKAN_DEC, $LLMEM_VULKAN_DEC_CFG, $LLMEM_VULKAN_DEC_ROWS (NULL: unset) */
    static const char *cfgs[][3] = {{"1", NULL, NULL},
                                    {"0", NULL, NULL},
                                    {"3", NULL, NULL},
                                    {"4", NULL, NULL},
                                    {"1", "128,2,64,3,128,264", NULL},
                                    {"1", "64,1,128,3,256,1000", NULL},
                                    {"1", "64,1,32,1,64,528", NULL},
                                    {"1", NULL, "32"},
                                    {"1", "256,1,64,2,512,264", "16"}};
    /* m, k, n: partial tiles; K 1000 (not a multiple of 64 or 128: a partial last step);
     * 4096 with several chunks a slice; one slice (K 264) */
    static const int32_t shapes[][3] = {{9, 264, 17},   {16, 1000, 300}, {17, 520, 136},
                                        {40, 1024, 96}, {64, 1000, 300}, {16, 4096, 72},
                                        {64, 2048, 40}};
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        test_env keep = test_env_set("LLMEM_VULKAN_DEC", cfgs[ci][0]);
        test_env keep2 = test_env_set("LLMEM_VULKAN_DEC_CFG", cfgs[ci][1]);
        test_env keep3 = test_env_set("LLMEM_VULKAN_DEC_ROWS", cfgs[ci][2]);
        llmem_backend *vk = test_open("vulkan");
        char cfg[128];
        snprintf(cfg, sizeof cfg, "DEC=%s DEC_CFG=%s DEC_ROWS=%s", cfgs[ci][0],
                 cfgs[ci][1] ? cfgs[ci][1] : "(unset)", cfgs[ci][2] ? cfgs[ci][2] : "(unset)");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            dec_case(vk, shapes[s][0], shapes[s][1], shapes[s][2], cfg);
        llmem_backend_close(vk);
        test_env_restore(&keep3);
        test_env_restore(&keep2);
        test_env_restore(&keep);
    }
}
END_TEST

/* The inputs and outputs of the bit-identity tests below, one shape {m, k,
 * n}: a [m, k] and w [n, k] in [-1, 1), and both modes' products (precise,
 * then fast: [2, m, n]) of the reference setting (base) and of the setting
 * under test (o). */
typedef struct dec_io {
    int32_t m, k, n;
    float *a, *w, *base, *o;
} dec_io;

static void dec_io_make(dec_io *d, const int32_t shape[3])
{
    int32_t m = shape[0], k = shape[1], n = shape[2];
    *d = (dec_io){m, k, n, malloc((size_t)m * k * 4), malloc((size_t)n * k * 4),
                  malloc((size_t)2 * m * n * 4), malloc((size_t)2 * m * n * 4)};
    ck_assert(d->a && d->w && d->base && d->o);
    for (size_t i = 0; i < (size_t)m * k; i++)
        d->a[i] = frand(-1, 1);
    for (size_t i = 0; i < (size_t)n * k; i++)
        d->w[i] = frand(-1, 1);
}

static void dec_io_free(dec_io *d)
{
    free(d->a), free(d->w), free(d->base), free(d->o);
}

/* Runs d's product on vk in both modes into d->base (ref) or d->o; whether
 * d->o is bit for bit d->base (true for the reference itself). */
static bool dec_io_run(llmem_backend *vk, dec_io *d, bool ref)
{
    size_t mn = (size_t)d->m * d->n;
    float *out = ref ? d->base : d->o;
    run_mm(vk, d->a, d->w, d->m, d->k, d->n, false, out);
    run_mm(vk, d->a, d->w, d->m, d->k, d->n, true, out + mn);
    return ref || memcmp(d->o, d->base, 2 * mn * 4) == 0;
}

/* The L2 prefetch (matmul_dec.comp's PFD, PFL, PFS) and the chunk of
 * activations (KA) change no bit: each shape's products (precise and fast,
 * at 9-64 rows with DEC=1, so that both split counts run matmul_dec; with
 * one tile of all rows and 32-row tiles) with it off and at chunks of 512
 * (halved where shared memory is short: the default before
 * VK_DEC_KA_FAST / VK_DEC_KA_PRECISE, $LLMEM_VULKAN_DEC_CFG=256,1,64,2,512,264)
 * are the reference for the same products at the default blocking (chunks
 * of 128 fast, 64 precise at 9-16 rows, 128 above) with the default
 * prefetch and at three other settings (one step ahead with the smallest
 * segments; far ahead with the largest segments; a lag of 8 steps);
 * test_dec_products checks the values against float64. (No backend opened
 * for the chunks alone: the NVIDIA driver refuses vkCreateInstance, -9,
 * after about 30 in one process. Without cooperative matrices, lavapipe,
 * every setting runs the SIMT path: trivially equal.) */
START_TEST(test_dec_prefetch_identical)
{
    /* $LLMEM_VULKAN_DEC_PF, _PF_LAG, _PF_SEG (NULL: unset, the default) */
    static const char *pfs[][3] = {
        {"0", NULL, NULL}, {NULL, NULL, NULL}, {"1", "1", "16"}, {"16", "2", "128"}, {"4", "8", "64"}};
    static const int32_t shapes[][3] = {{9, 264, 17},   {16, 1000, 300}, {16, 4096, 72},
                                        {64, 2048, 40}, {40, 1024, 96}};
    /* $LLMEM_VULKAN_DEC_ROWS: one tile of all rows, 32-row tiles */
    static const char *rows[] = {NULL, "32"};
    enum { NS = sizeof shapes / sizeof shapes[0] };
    dec_io io[NS];
    for (size_t s = 0; s < NS; s++)
        dec_io_make(&io[s], shapes[s]);
    test_env keep0 = test_env_save("LLMEM_VULKAN_DEC");
    test_env keep4 = test_env_save("LLMEM_VULKAN_DEC_ROWS");
    test_env_put("LLMEM_VULKAN_DEC", "1");
    enum { NP = sizeof pfs / sizeof pfs[0], NR = sizeof rows / sizeof rows[0] };
    for (size_t q = 0; q < NR * NP; q++) {
        size_t ri = q / NP, pi = q % NP;
        test_env_put("LLMEM_VULKAN_DEC_ROWS", rows[ri]);
        test_env keep1 = test_env_set("LLMEM_VULKAN_DEC_PF", pfs[pi][0]);
        test_env keep2 = test_env_set("LLMEM_VULKAN_DEC_PF_LAG", pfs[pi][1]);
        test_env keep3 = test_env_set("LLMEM_VULKAN_DEC_PF_SEG", pfs[pi][2]);
        test_env keep5 =
            test_env_set("LLMEM_VULKAN_DEC_CFG", pi == 0 ? "256,1,64,2,512,264" : NULL);
        llmem_backend *vk = test_open("vulkan");
        test_env_restore(&keep5);
        for (size_t s = 0; s < NS; s++) /* the first setting: the prefetch off */
            ck_assert_msg(dec_io_run(vk, &io[s], pi == 0),
                          "DEC_ROWS=%s DEC_PF=%s,%s,%s %dx%dx%d: not bit-identical to the "
                          "prefetch off at chunks of 512",
                          rows[ri] ? rows[ri] : "-", pfs[pi][0] ? pfs[pi][0] : "-",
                          pfs[pi][1] ? pfs[pi][1] : "-", pfs[pi][2] ? pfs[pi][2] : "-",
                          io[s].m, io[s].k, io[s].n);
        llmem_backend_close(vk);
        test_env_restore(&keep3);
        test_env_restore(&keep2);
        test_env_restore(&keep1);
    }
    test_env_restore(&keep4);
    test_env_restore(&keep0);
    for (size_t s = 0; s < NS; s++)
        dec_io_free(&io[s]);
}
END_TEST

/* matmul_cm.comp's layouts at 17-64 rows ($LLMEM_VULKAN_CM_MID, vk_cm_plan_mid: 2 x 4
 * subgroups of 32 x 32, 16 subgroups with 2 and 3 register sets of loads in flight, 2 x 4
 * with 3 sets, 2 x 8 of 32 x 32 with 2 sets; unset: the defaults by mode from 33 rows):
 * products at 17, 40 and 64 rows (partial tiles, K not a multiple of the step, split-K),
 * precise and fast, against float64 (dec_case), and bit for bit those of the plans of
 * vk_cm_plan_make ($LLMEM_VULKAN_CM_MID=0): at these shapes both plans take the same K step
 * and slices (the same k_split), so every output takes the same multiply-adds in the same
 * order, whatever the tile. (Lavapipe: the SIMT path, trivially equal.) */
START_TEST(test_cm_mid_products)
{
    static const char *mids[] = {"0", "256,2,2,64,1", "512,2,1,64,2", "512,2,1,64,3",
                                 "256,2,2,64,3", "512,2,2,64,2", NULL, NULL, NULL};
    /* with the defaults: the narrow layout of short fast products (vk_cm_plan_narrow) as
     * such, off, and at 128 invocations in every fast product at 528 workgroups (at these
     * shapes the slices are K / 256 or one in every plan) */
    static const char *narrows[] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, "0",
                                    "128,2,2,64,3,1000,528"};
    static const int32_t shapes[][3] = {
        {17, 520, 136}, {40, 1024, 96}, {64, 1000, 300}, {64, 2048, 40}};
    enum { NM = sizeof mids / sizeof mids[0], NS = sizeof shapes / sizeof shapes[0] };
    dec_io io[NS];
    for (size_t s = 0; s < NS; s++)
        dec_io_make(&io[s], shapes[s]);
    test_env keep0 = test_env_save("LLMEM_VULKAN_DEC");
    test_env keep1 = test_env_save("LLMEM_VULKAN_CM_MID");
    test_env keep2 = test_env_save("LLMEM_VULKAN_CM_NARROW");
    test_env_put("LLMEM_VULKAN_DEC", "0");
    for (size_t mi = 0; mi < NM; mi++) {
        test_env_put("LLMEM_VULKAN_CM_MID", mids[mi]);
        test_env_put("LLMEM_VULKAN_CM_NARROW", narrows[mi]);
        llmem_backend *vk = test_open("vulkan");
        char cfg[96];
        snprintf(cfg, sizeof cfg, "CM_MID=%s CM_NARROW=%s", mids[mi] ? mids[mi] : "(unset)",
                 narrows[mi] ? narrows[mi] : "(unset)");
        for (size_t s = 0; s < NS; s++) {
            dec_io *d = &io[s];
            ck_assert_msg(dec_io_run(vk, d, mi == 0), "%s %dx%dx%d: not bit-identical to CM_MID=0",
                          cfg, d->m, d->k, d->n);
            if (mi > 0 && s > 0)
                dec_case(vk, d->m, d->k, d->n, cfg);
        }
        llmem_backend_close(vk);
    }
    test_env_restore(&keep2);
    test_env_restore(&keep1);
    test_env_restore(&keep0);
    for (size_t s = 0; s < NS; s++)
        dec_io_free(&io[s]);
}
END_TEST

/* A decode-sized product whose shapes do not match (w's K differs from
 * a's) is refused with LLMEM_E_INVALID and leaves its output as it was. */
START_TEST(test_dec_bad_shapes)
{
    llmem_backend *vk = test_open("vulkan");
    int32_t m = 16, k = 256, n = 64;
    float *a = malloc((size_t)m * k * 4), *w = malloc((size_t)n * (k + 8) * 4);
    float *o = malloc((size_t)m * n * 4);
    ck_assert(a && w && o);
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = frand(-1, 1);
    for (size_t i = 0; i < (size_t)n * (k + 8); i++)
        w[i] = frand(-1, 1);
    llmem_buffer *ba, *bw, *bo;
    llmem_tensor ta = vk_up_f32_2d(vk, &ba, a, m, k);
    llmem_tensor tw = vk_up_f32_2d(vk, &bw, w, n, k + 8);
    for (size_t i = 0; i < (size_t)m * n; i++)
        o[i] = 1.5f;
    llmem_tensor to = vk_up_f32_2d(vk, &bo, o, m, n);
    ck_assert_int_eq(llmem_op_matmul(vk, &ta, &tw, &to), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_matmul_fast(vk, &ta, &tw, &to), LLMEM_E_INVALID);
    OK(llmem_buffer_download(bo, 0, o, (size_t)m * n * 4));
    for (size_t i = 0; i < (size_t)m * n; i++)
        ck_assert_float_eq(o[i], 1.5f);
    llmem_buffer_free(ba), llmem_buffer_free(bw), llmem_buffer_free(bo);
    free(a), free(w), free(o);
    llmem_backend_close(vk);
}
END_TEST

int main(void)
{
    vk_test_seed();
    Suite *s = suite_create("vulkan_dec");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_dec_plan_grid);
    tcase_add_test(tc, test_dec_plan_by_hand);
    tcase_add_test(tc, test_dec_plan_refused);
    tcase_add_test(tc, test_dec_used_rows);
    tcase_add_test(tc, test_cm_mid_plan);
    tcase_add_test(tc, test_cm_mid_cfg);
    tcase_add_test(tc, test_cm_plan_narrow);
    suite_add_tcase(s, tc);
    if (vulkan_opens("test_vulkan_dec", "the device products are skipped")) {
        TCase *td = tcase_create("device");
        tcase_set_timeout(td, 120);
        tcase_add_test(td, test_dec_products);
        tcase_add_test(td, test_dec_prefetch_identical);
        tcase_add_test(td, test_dec_bad_shapes);
        suite_add_tcase(s, td);
        TCase *tm = tcase_create("mid"); /* (alone: CK_RUN_CASE=mid) */
        tcase_set_timeout(tm, 120);
        tcase_add_test(tm, test_cm_mid_products);
        suite_add_tcase(s, tm);
    }
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ctest-labels: core vulkan
/* The Vulkan matmul path choices without a device (backends/vulkan/
 * vk_mm_pick.c, compiled in here): which shader a shape takes with and
 * without cooperative matrices, the blocking and split-K of matmul_cm.comp,
 * and which cooperative-matrix shape lists make it usable. Expected paths
 * follow the rules of docs/vulkan.md ("matmul"); blocking is checked by
 * its invariants over a grid of shapes and by two shapes worked by hand.
 * CI's lavapipe has no cooperative matrices, so this is where the
 * selection of the tensor-core path is tested off the GPU machine. */
#include "support/run.h"
#include <check.h>
#include <stdlib.h>

#include "backends/vulkan/vk_mm_pick.c"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16

START_TEST(test_pick_paths)
{
    vk_mm_caps cm = {.coopmat = true, .cm_bk = VK_CM_BK_SMALL, .mv16_max = 8, .cm_min = VK_MM_CM_MIN,
                     .cm_max = VK_MM_CM_MAX};
    vk_mm_caps no = cm;
    no.coopmat = false;
    /* decode rows stay on the GEMVs whatever the device */
    ck_assert_int_eq(vk_mm_pick(&cm, 1, 4096, BF16), VK_MM_MATVEC16);
    ck_assert_int_eq(vk_mm_pick(&cm, 8, 4096, F16), VK_MM_MATVEC16);
    ck_assert_int_eq(vk_mm_pick(&cm, 8, 4096, F32), VK_MM_MATVEC);
    ck_assert_int_eq(vk_mm_pick(&cm, 8, 4100, BF16), VK_MM_MATVEC); /* K % 8 != 0 */
    /* above them, up to 64 rows: tensor cores for 16-bit weights with K % 8 == 0 */
    ck_assert_int_eq(vk_mm_pick(&cm, 9, 4096, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 16, 4096, F16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 64, 14336, BF16), VK_MM_COOPMAT);
    /* prefill sizes: the f32 SIMT tiles (faster there on the H200) */
    ck_assert_int_eq(vk_mm_pick(&cm, 65, 4096, BF16), VK_MM_RT);
    ck_assert_int_eq(vk_mm_pick(&cm, 512, 14336, BF16), VK_MM_RT);
    ck_assert_int_eq(vk_mm_pick(&cm, 64, 4096, F32), VK_MM_RT);     /* f32 weights: SIMT */
    ck_assert_int_eq(vk_mm_pick(&cm, 64, 4100, BF16), VK_MM_TILED); /* K % 8 != 0 */
    /* the fallback: a device without them (lavapipe) */
    ck_assert_int_eq(vk_mm_pick(&no, 9, 4096, BF16), VK_MM_RT);
    ck_assert_int_eq(vk_mm_pick(&no, 512, 4096, F16), VK_MM_RT);
    ck_assert_int_eq(vk_mm_pick(&no, 512, 4099, F16), VK_MM_TILED);
    /* the environment's knobs */
    vk_mm_caps c = cm;
    c.cm_min = 33;
    ck_assert_int_eq(vk_mm_pick(&c, 32, 4096, BF16), VK_MM_RT);
    ck_assert_int_eq(vk_mm_pick(&c, 33, 4096, BF16), VK_MM_COOPMAT);
    c.cm_max = 4096;
    ck_assert_int_eq(vk_mm_pick(&c, 512, 4096, BF16), VK_MM_COOPMAT);
    c = cm;
    c.mv16_max = 32;
    ck_assert_int_eq(vk_mm_pick(&c, 32, 4096, BF16), VK_MM_MATVEC16);
    ck_assert_int_eq(vk_mm_pick(&c, 33, 4096, BF16), VK_MM_COOPMAT);
    c = no;
    c.matmul_old = true;
    ck_assert_int_eq(vk_mm_pick(&c, 64, 4096, BF16), VK_MM_TILED);
    c.matvec_old = true;
    ck_assert_int_eq(vk_mm_pick(&c, 4, 4096, BF16), VK_MM_MATVEC);
}
END_TEST

/* Split-K by hand: 32 tiles of K 4096 (bk 16) reach 264 workgroups with
 * ceil(264 / 32) = 9 slices of ceil(4096 / 9) = 456, rounded up to 464
 * (so 9 slices); enough tiles, or too short a K, keep one slice. */
START_TEST(test_split_k)
{
    uint32_t s, ks;
    vk_mm_split_k(32, 4096, 16, &s, &ks);
    ck_assert_uint_eq(s, 9);
    ck_assert_uint_eq(ks, 464);
    vk_mm_split_k(VK_MM_GROUPS, 4096, 16, &s, &ks);
    ck_assert_uint_eq(s, 1);
    ck_assert_uint_eq(ks, 4096);
    vk_mm_split_k(1, 300, 32, &s, &ks); /* 300 / VK_MM_MIN_SLICE: one slice at most */
    ck_assert_uint_eq(s, 1);
    ck_assert_uint_eq(ks, 320);
    vk_mm_split_k(1, 4096, 16, &s, &ks); /* capped at 4096 / 256 = 16 slices of 256 */
    ck_assert_uint_eq(s, 16);
    ck_assert_uint_eq(ks, 256);
    vk_mm_split_k(5, 0, 16, &s, &ks);
    ck_assert_uint_eq(s, 1);
}
END_TEST

START_TEST(test_cm_plan_invariants)
{
    static const uint32_t ms[] = {1, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 128, 129, 512, 2048};
    static const uint32_t ns[] = {1, 16, 100, 128, 129, 1024, 4096, 14336, 128256};
    static const uint32_t ks[] = {8, 32, 40, 256, 264, 1000, 4096, 14336};
    static const uint32_t small_bks[] = {64, 32, 0};
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++)
                for (size_t e = 0; e < 3; e++) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d];
                    vk_cm_plan p;
                    vk_cm_plan_make(m, n, k, small_bks[e], &p);
                    ck_assert_uint_eq(p.sgm * p.sgn * 32, VK_CM_WG);
                    ck_assert_uint_eq(p.bm, 16 * p.fm * p.sgm);
                    ck_assert_uint_eq(p.bn, 16 * p.fn * p.sgn);
                    /* the K step: 64 up to 64 rows unless 32 was asked for (0: the default, 64) */
                    ck_assert_uint_eq(p.bk, m > 64 ? 32 : small_bks[e] == 32 ? 32 : 64);
                    /* tiles cover the output, and no tile row or column is empty */
                    ck_assert_uint_ge((uint64_t)p.tiles_m * p.bm, m);
                    ck_assert_uint_lt((uint64_t)(p.tiles_m - 1) * p.bm, m);
                    ck_assert_uint_ge((uint64_t)p.tiles_n * p.bn, n);
                    ck_assert_uint_lt((uint64_t)(p.tiles_n - 1) * p.bn, n);
                    /* up to 64 rows the weights are read once: one tile row */
                    if (m <= 64)
                        ck_assert_uint_eq(p.tiles_m, 1);
                    /* slices: whole K steps, covering K, none empty */
                    ck_assert_uint_eq(p.k_split % p.bk, 0);
                    ck_assert_uint_ge((uint64_t)p.slices * p.k_split, k);
                    ck_assert_uint_lt((uint64_t)(p.slices - 1) * p.k_split, k);
                    uint64_t tiles = (uint64_t)p.tiles_m * p.tiles_n;
                    if (tiles >= VK_MM_GROUPS || k < 2 * VK_MM_MIN_SLICE)
                        ck_assert_uint_eq(p.slices, 1);
                    else
                        ck_assert_uint_ge(tiles * p.slices, tiles * 2);
                    /* shared memory of this blocking (precise: hi and lo rows of BK + 8
                     * halves, the weight rows, 8 epilogue matrices of 16 x 20 floats,
                     * 1 KiB slack) fits the 48 KiB of NVIDIA's devices, and the
                     * constants the host checks the device against cover it */
                    uint32_t row = (p.bk + 8) * 2;
                    uint32_t smem = 2 * p.bm * row + p.bn * row + 8 * 16 * 20 * 4 + 1024;
                    ck_assert_uint_le(smem, 48 * 1024);
                    ck_assert_uint_le(smem, p.bk == 64 ? VK_CM_SHARED_BYTES_SMALL : VK_CM_SHARED_BYTES);
                }
}
END_TEST

/* Two shapes worked by hand: the 9B model's 512-token prefill through a
 * 4096 x 4096 projection (4 x 32 = 128 tiles of 128 x 128: 264 / 128 ->
 * 3 slices of ceil(4096 / 3) = 1366 -> 1376 (43 steps of 32), the last
 * 1344), and batch-16 decode (one 16-row tile row, 128 columns: 32 tiles,
 * 264 / 32 -> 9 slices, capped at 4096 / 256 = 16: 9 slices of 456 ->
 * 512 with steps of 64 (8 slices), 480 with steps of 32 (4096 / 480 -> 9)). */
START_TEST(test_cm_plan_shapes)
{
    vk_cm_plan p;
    vk_cm_plan_make(512, 4096, 4096, 64, &p);
    ck_assert_uint_eq(p.bm, 128);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.bk, 32);
    ck_assert_uint_eq(p.tiles_m, 4);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.k_split, 1376);
    ck_assert_uint_eq(p.slices, 3);
    vk_cm_plan_make(16, 4096, 4096, 64, &p);
    ck_assert_uint_eq(p.bm, 16);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.bk, 64);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.k_split, 512);
    ck_assert_uint_eq(p.slices, 8);
    vk_cm_plan_make(16, 4096, 4096, 32, &p);
    ck_assert_uint_eq(p.bk, 32);
    ck_assert_uint_eq(p.k_split, 480);
    ck_assert_uint_eq(p.slices, 9);
}
END_TEST

START_TEST(test_cm_usable)
{
    const vk_cm_shape good = {16, 16, 16, true, true, true};
    vk_cm_shape list[3] = {{16, 8, 16, true, true, true}, {16, 16, 16, true, false, true}, good};
    uint32_t smem = 48 * 1024;
    ck_assert(vk_cm_usable(list, 3, 32, smem));
    ck_assert(!vk_cm_usable(list, 2, 32, smem));   /* 16x8x16, and f16 accumulators only */
    ck_assert(!vk_cm_usable(list, 0, 32, smem));   /* none listed */
    ck_assert(!vk_cm_usable(list, 3, 64, smem));   /* subgroups of 64 */
    ck_assert(!vk_cm_usable(list, 3, 32, 32768));  /* too little shared memory */
    vk_cm_shape wide = good;
    wide.subgroup_scope = false;
    ck_assert(!vk_cm_usable(&wide, 1, 32, smem));
    wide = good;
    wide.ab_f16 = false; /* int8 or bf16 inputs */
    ck_assert(!vk_cm_usable(&wide, 1, 32, smem));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("vulkan_pick");
    TCase *tc = tcase_create("pick");
    tcase_add_test(tc, test_pick_paths);
    tcase_add_test(tc, test_split_k);
    tcase_add_test(tc, test_cm_plan_invariants);
    tcase_add_test(tc, test_cm_plan_shapes);
    tcase_add_test(tc, test_cm_usable);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

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
#include <string.h>

#include "backends/vulkan/vk_mm_pick.c"

/* the SM count the plans below were written for (the H200's; vk_mm_pick.h) */
#define H200_SMS 132u

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
    /* above them, any number of rows (prefill too): tensor cores for 16-bit weights with
     * K % 8 == 0 */
    ck_assert_int_eq(vk_mm_pick(&cm, 9, 4096, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 16, 4096, F16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 64, 14336, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 65, 4096, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 512, 14336, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 1u << 20, 4096, F16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&cm, 64, 4096, F32), VK_MM_RT);     /* f32 weights: SIMT */
    ck_assert_int_eq(vk_mm_pick(&cm, 512, 4096, F32), VK_MM_RT);
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
    c.cm_max = 64; /* $LLMEM_VULKAN_CM_MAX=64: the old routing, prefill on the SIMT tiles */
    ck_assert_int_eq(vk_mm_pick(&c, 64, 4096, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&c, 65, 4096, BF16), VK_MM_RT);
    ck_assert_int_eq(vk_mm_pick(&c, 512, 4096, BF16), VK_MM_RT);
    c = cm;
    c.mv16_max = 32;
    ck_assert_int_eq(vk_mm_pick(&c, 32, 4096, BF16), VK_MM_MATVEC16);
    ck_assert_int_eq(vk_mm_pick(&c, 33, 4096, BF16), VK_MM_COOPMAT);
    c = no;
    c.matmul_old = true;
    ck_assert_int_eq(vk_mm_pick(&c, 64, 4096, BF16), VK_MM_TILED);
    c.matvec_old = true;
    ck_assert_int_eq(vk_mm_pick(&c, 4, 4096, BF16), VK_MM_MATVEC);
    /* tensor cores from fewer rows ($LLMEM_VULKAN_CM_MIN below the GEMVs' rows): where
     * matvec16 stops (mv16_max), 16-bit weights with K % 8 == 0 go to them, the rest to
     * matvec.comp as before */
    vk_mm_caps low = cm;
    low.mv16_max = 1;
    low.cm_min = 2;
    ck_assert_int_eq(vk_mm_pick(&low, 1, 4096, BF16), VK_MM_MATVEC16);
    ck_assert_int_eq(vk_mm_pick(&low, 2, 4096, BF16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&low, 8, 4096, F16), VK_MM_COOPMAT);
    ck_assert_int_eq(vk_mm_pick(&low, 4, 4096, F32), VK_MM_MATVEC);
    ck_assert_int_eq(vk_mm_pick(&low, 4, 4100, BF16), VK_MM_MATVEC);
    low.coopmat = false;
    ck_assert_int_eq(vk_mm_pick(&low, 4, 4096, BF16), VK_MM_MATVEC);
}
END_TEST

/* Split-K by hand: 32 tiles of K 4096 (bk 16) reach 264 workgroups with
 * ceil(264 / 32) = 9 slices of ceil(4096 / 9) = 456, rounded up to 464
 * (so 9 slices); enough tiles, or too short a K, keep one slice. */
START_TEST(test_split_k)
{
    uint32_t s, ks;
    vk_mm_split_k(32, 4096, 16, H200_SMS, &s, &ks);
    ck_assert_uint_eq(s, 9);
    ck_assert_uint_eq(ks, 464);
    vk_mm_split_k(264, 4096, 16, H200_SMS, &s, &ks);
    ck_assert_uint_eq(s, 1);
    ck_assert_uint_eq(ks, 4096);
    vk_mm_split_k(1, 300, 32, H200_SMS, &s, &ks); /* 300 / VK_MM_MIN_SLICE: one slice at most */
    ck_assert_uint_eq(s, 1);
    ck_assert_uint_eq(ks, 320);
    vk_mm_split_k(1, 4096, 16, H200_SMS, &s, &ks); /* capped at 4096 / 256 = 16 slices of 256 */
    ck_assert_uint_eq(s, 16);
    ck_assert_uint_eq(ks, 256);
    vk_mm_split_k(5, 0, 16, H200_SMS, &s, &ks);
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
                for (size_t e = 0; e < 3; e++)
                for (uint32_t fn = 1; fn <= 4; fn *= 2) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d];
                    vk_cm_plan p;
                    vk_cm_plan_make_fn(m, n, k, small_bks[e], 1, 48 * 1024, H200_SMS, fn, &p);
                    ck_assert_uint_eq(p.stages, 1);
                    /* fn matrices per subgroup up to 64 rows, fewer (and a K step of 32)
                     * only where the 64-wide step of that tile would not fit 48 KiB */
                    if (m <= 64) {
                        ck_assert_uint_le(p.fn, fn);
                        ck_assert(p.fn == fn || VK_CM_SMEM(p.bm, 2 * p.bn, 32u) > 48 * 1024);
                        if (p.bk == 32 && small_bks[e] != 32) {
                            ck_assert_uint_gt(p.fn, 1);
                            ck_assert_uint_gt(VK_CM_SMEM(p.bm, p.bn, 64u), 48 * 1024);
                        }
                    }
                    ck_assert_uint_eq(p.sgm * p.sgn * 32, VK_CM_WG);
                    ck_assert_uint_eq(p.bm, 16 * p.fm * p.sgm);
                    ck_assert_uint_eq(p.bn, 16 * p.fn * p.sgn);
                    /* the K step (fn 1): 64 up to 64 rows unless 32 was asked for (0: the
                     * default, 64) */
                    if (fn == 1)
                        ck_assert_uint_eq(p.bk, m > 64 ? 32 : small_bks[e] == 32 ? 32 : 64);
                    /* matmul_cm.comp's epilogue spells out 16 matrices per subgroup at most */
                    ck_assert_uint_le(p.fm * p.fn, 16);
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
                    if (tiles >= 264 || k < 2 * VK_MM_MIN_SLICE ||
                        (m > 64 && tiles >= 66))
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

/* Shapes worked by hand: the 9B model's 512-token prefill through a
 * 4096 x 4096 projection (4 x 32 = 128 tiles of 128 x 128, at least
 * VK_CM_FULL_TILES(132) = 66: one slice of K), 200 rows through 1024 columns (2 x 8
 * = 16 tiles: 264 / 16 -> 17 slices, capped at 4096 / 256 = 16 slices of
 * 256), and batch-16 decode (one 16-row tile row, 128 columns: 32 tiles,
 * 264 / 32 -> 9 slices, capped at 4096 / 256 = 16: 9 slices of 456 ->
 * 512 with steps of 64 (8 slices), 480 with steps of 32 (4096 / 480 -> 9)). */
START_TEST(test_cm_plan_shapes)
{
    vk_cm_plan p;
    vk_cm_plan_make(512, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.bm, 128);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.bk, 32);
    ck_assert_uint_eq(p.tiles_m, 4);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.k_split, 4096);
    ck_assert_uint_eq(p.slices, 1);
    /* 16 rows, 2 matrices per subgroup: 256 columns a tile, (32 + 256) x 144 bytes +
     * 11264 > 48 KiB with steps of 64, so steps of 32; 16 tiles -> 16 slices of 256 */
    vk_cm_plan_make_fn(16, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, 2, &p);
    ck_assert_uint_eq(p.fn, 2);
    ck_assert_uint_eq(p.bn, 256);
    ck_assert_uint_eq(p.bk, 32);
    ck_assert_uint_eq(p.tiles_n, 16);
    ck_assert_uint_eq(p.slices, 16);
    vk_cm_plan_make_fn(16, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, 4, &p); /* 512 columns: too big */
    ck_assert_uint_eq(p.fn, 2);
    vk_cm_plan_make(200, 1024, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.tiles_m, 2);
    ck_assert_uint_eq(p.tiles_n, 8);
    ck_assert_uint_eq(p.k_split, 256);
    ck_assert_uint_eq(p.slices, 16);
    vk_cm_plan_make(16, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.bm, 16);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.bk, 64);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.k_split, 512);
    ck_assert_uint_eq(p.slices, 8);
    vk_cm_plan_make(16, 4096, 4096, 32, 1, 48 * 1024, H200_SMS, &p);
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

/* The ring plans (stages >= 2): over shapes, asked depths, K steps and
 * shared-memory sizes (lavapipe's 32 KiB, NVIDIA's 48 KiB, 64 KiB), the
 * ring's bytes, counted here from the layout of matmul_cm.comp (two
 * slices, each 2 BM rows of a and BN weight rows of BK + 8 halves; the
 * epilogue's 8 matrices of 16 x 20 floats inside them; 1 KiB slack), fit
 * the device; the depth is the asked one (at most 4), never above 64
 * rows; the widest step that fits is taken. */
START_TEST(test_cm_ring_plans)
{
    static const uint32_t ms[] = {9, 16, 17, 32, 33, 48, 49, 64, 65, 512};
    static const uint32_t smems[] = {32 * 1024, 48 * 1024, 64 * 1024};
    static const uint32_t small_bks[] = {64, 32};
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
        for (uint32_t asked = 0; asked <= 6; asked++)
            for (size_t b = 0; b < 3; b++)
                for (size_t e = 0; e < 2; e++) {
                    uint32_t m = ms[a], smem = smems[b];
                    vk_cm_plan p, one;
                    vk_cm_plan_make(m, 4096, 4096, small_bks[e], asked, smem, H200_SMS, &p);
                    vk_cm_plan_make(m, 4096, 4096, small_bks[e], 1, smem, H200_SMS, &one);
                    ck_assert_uint_eq(p.bm, one.bm);
                    ck_assert_uint_eq(p.bn, one.bn);
                    uint32_t best_bk = 0;
                    for (uint32_t bk = 32; bk <= (small_bks[e] == 32 ? 32u : 64u); bk += 32)
                        if (2 * (2 * p.bm + p.bn) * (bk + 8) * 2 + 1024 <= smem)
                            best_bk = bk;
                    if (m > 64 || asked <= 1 || best_bk == 0) { /* the one-slice plan */
                        ck_assert_uint_eq(p.stages, 1);
                        ck_assert_uint_eq(p.bk, one.bk);
                        continue;
                    }
                    ck_assert_uint_eq(p.stages, asked > 4 ? 4 : asked);
                    ck_assert_uint_eq(p.bk, best_bk);
                    uint32_t slice = (2 * p.bm + p.bn) * (p.bk + 8) * 2;
                    ck_assert_uint_le(2 * slice + 1024, smem);
                    ck_assert_uint_le(8 * 16 * 20 * 4, 2 * slice); /* epilogue in the ring */
                    ck_assert_uint_eq(VK_CM_RING_SMEM(p.bm, p.bn, p.bk), 2 * slice + 1024);
                    ck_assert_uint_eq(p.k_split % p.bk, 0);
                    ck_assert_uint_ge((uint64_t)p.slices * p.k_split, 4096);
                }
    /* worked by hand on 48 KiB: 16 rows, steps of 64: 2 x (32 + 128) rows x 144 bytes =
     * 46080 (+ 1024); 32 rows: 2 x 192 x 144 = 55296, too much, steps of 32: 2 x 192 x 80
     * = 30720; 64 rows: 2 x 256 x 80 = 40960. On lavapipe's 32 KiB, 64 rows: no ring. */
    vk_cm_plan p;
    vk_cm_plan_make(16, 4096, 4096, 64, 3, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 3);
    ck_assert_uint_eq(p.bk, 64);
    vk_cm_plan_make(32, 4096, 4096, 64, 2, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 2);
    ck_assert_uint_eq(p.bk, 32);
    vk_cm_plan_make(64, 4096, 4096, 64, 4, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 4);
    ck_assert_uint_eq(p.bk, 32);
    vk_cm_plan_make(64, 4096, 4096, 64, 2, 32 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 1);
    ck_assert_uint_eq(p.bk, 64);
}
END_TEST

/* matmul_cm.comp's raw epilogue (RAW_EMIT): simulated on the host for
 * each plan, the 16 x 16 matrices of every tile, subgroup and accumulator
 * stay inside their slice of the padded partial buffer of
 * vk_cm_raw_layout and write each element of it exactly once, so every
 * out[r, c] (r < M, c < N) that sum_slices_cm.comp reads at r ldp + c was
 * written; and the mode picks raw only where asked. Expected sizes worked
 * out by hand for two shapes. */
START_TEST(test_cm_raw_layout)
{
    static const uint32_t shapes[][3] = {{16, 4096, 4096}, {40, 96, 1024}, {64, 300, 1000},
                                         {9, 17, 520}, {200, 1000, 136}, {130, 136, 264}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        uint32_t m = shapes[i][0], n = shapes[i][1], k = shapes[i][2], ldp;
        uint64_t sf;
        vk_cm_plan p;
        vk_cm_plan_make(m, n, k, 64, vk_cm_stages_for(0, m), 48 * 1024, H200_SMS, &p);
        vk_cm_raw_layout(&p, &ldp, &sf);
        ck_assert_uint_ge(ldp, n);
        unsigned char *hit = calloc(sf, 1);
        ck_assert_ptr_nonnull(hit);
        for (uint32_t t = 0; t < p.tiles_m * p.tiles_n; t++) {
            uint32_t m0 = (t % p.tiles_m) * p.bm, n0 = (t / p.tiles_m) * p.bn;
            for (uint32_t sg = 0; sg < VK_CM_WG / 32; sg++) {
                uint32_t sm = (sg % p.sgm) * p.fm * 16, sn = (sg / p.sgm) * p.fn * 16;
                for (uint32_t q = 0; q < p.fm * p.fn; q++) {
                    uint64_t at = (uint64_t)(m0 + sm + 16 * (q / p.fn)) * ldp + n0 + sn +
                                  16 * (q % p.fn);
                    for (uint32_t r = 0; r < 16; r++)
                        for (uint32_t c = 0; c < 16; c++) {
                            uint64_t e = at + (uint64_t)r * ldp + c;
                            ck_assert_uint_lt(e, sf);
                            ck_assert_uint_eq(hit[e], 0);
                            hit[e] = 1;
                        }
                }
            }
        }
        for (uint64_t e = 0; e < sf; e++)
            ck_assert_uint_eq(hit[e], 1);
        free(hit);
        ck_assert(!vk_cm_raw_used(VK_CM_RAW_NONE, &p));
        ck_assert(vk_cm_raw_used(VK_CM_RAW_ALL, &p));
        ck_assert(vk_cm_raw_used(VK_CM_RAW_SPLIT, &p) == (p.slices > 1));
        ck_assert(!vk_cm_raw_used(7, &p));
    }
    /* 16 x 4096 x 4096: one 16 x 128 tile row of 32 tiles, 8 slices of 512 (by hand) */
    vk_cm_plan p;
    uint32_t ldp;
    uint64_t sf;
    vk_cm_plan_make(16, 4096, 4096, 64, 3, 48 * 1024, H200_SMS, &p);
    vk_cm_raw_layout(&p, &ldp, &sf);
    ck_assert_uint_eq(p.slices, 8);
    ck_assert_uint_eq(ldp, 4096);
    ck_assert_uint_eq(sf, 16 * 4096);
    ck_assert(vk_cm_raw_used(VK_CM_RAW_SPLIT, &p));
    /* 40 x 96 x 1024: 48-row tiles of 128 columns (3 matrices, 1 subgroup row), 4 slices */
    vk_cm_plan_make(40, 96, 1024, 64, 1, 48 * 1024, H200_SMS, &p);
    vk_cm_raw_layout(&p, &ldp, &sf);
    ck_assert_uint_eq(p.slices, 4);
    ck_assert_uint_eq(ldp, 128);
    ck_assert_uint_eq(sf, 48 * 128);
    /* 512 x 4096 x 4096: 128 tiles of 128 x 128, one slice: raw only when asked for all */
    vk_cm_plan_make(512, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.slices, 1);
    ck_assert(!vk_cm_raw_used(VK_CM_RAW_SPLIT, &p));
    ck_assert(vk_cm_raw_used(VK_CM_RAW_ALL, &p));
    ck_assert(vk_cm_raw_used(VK_CM_RAW_FUSED, &p));
}
END_TEST

/* vk_cm_ctr_take: runs of arrival counters in turn, by hand on 10 slots,
 * then over many requests: every run inside the slots, and a run never
 * overlaps the one taken just before it (two calls in a row, which may
 * run at the same time, never share a counter). */
START_TEST(test_cm_ctr_take)
{
    uint32_t next = 0;
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 4, 10), 0);
    ck_assert_uint_eq(next, 4);
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 4, 10), 4);
    ck_assert_uint_eq(next, 8);
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 4, 10), 0); /* 8 + 4 > 10: from the start */
    ck_assert_uint_eq(next, 4);
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 6, 10), 4); /* exactly to the end */
    ck_assert_uint_eq(next, 10);
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 1, 10), 0);
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 11, 10), UINT32_MAX); /* more than all of them */
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 0, 10), UINT32_MAX);
    ck_assert_uint_eq(next, 1);
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 10, 10), 0);
    next = 12; /* a cursor past the end (not produced here): from the start */
    ck_assert_uint_eq(vk_cm_ctr_take(&next, 3, 10), 0);
    uint32_t prev_at = UINT32_MAX, prev_n = 0, seed = 1;
    next = 0;
    for (int i = 0; i < 10000; i++) {
        seed = seed * 1103515245u + 12345u;
        uint32_t n = 1 + (seed >> 16) % 300;
        uint32_t at = vk_cm_ctr_take(&next, n, VK_CM_CTR_SLOTS);
        ck_assert_uint_le((uint64_t)at + n, VK_CM_CTR_SLOTS);
        if (prev_at != UINT32_MAX)
            ck_assert(at + n <= prev_at || prev_at + prev_n <= at);
        prev_at = at, prev_n = n;
    }
}
END_TEST

/* vk_cm_plan_wave ($LLMEM_VULKAN_CM_WAVE): split-K of the <= 64-row plans
 * within a workgroup budget. By hand: 64 x 4096 x 4096 and 16 x 4096 x 4096
 * (32 tiles of 128 columns) at 132 workgroups take 4 slices of 1024; 64 x
 * 14336 x 4096 (112 tiles) one slice of 4096; budget 0 and 128 x 128
 * plans stay as planned. Then over many shapes: slices cover K in whole
 * steps, none empty, and tiles x slices stays within the budget unless
 * the tiles alone exceed it (then one slice). */
START_TEST(test_cm_plan_wave)
{
    vk_cm_plan p, q;
    vk_cm_plan_make(64, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    vk_cm_plan_wave(&p, 4096, 132);
    ck_assert_uint_eq(p.slices, 4);
    ck_assert_uint_eq(p.k_split, 1024);
    vk_cm_plan_make(16, 4096, 4096, 64, 3, 48 * 1024, H200_SMS, &p);
    vk_cm_plan_wave(&p, 4096, 132);
    ck_assert_uint_eq(p.slices, 4);
    ck_assert_uint_eq(p.k_split, 1024);
    vk_cm_plan_make(64, 14336, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    vk_cm_plan_wave(&p, 4096, 132);
    ck_assert_uint_eq(p.slices, 1);
    ck_assert_uint_eq(p.k_split, 4096);
    vk_cm_plan_make(64, 4096, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    q = p;
    vk_cm_plan_wave(&p, 4096, 0);
    ck_assert_mem_eq(&p, &q, sizeof p);
    vk_cm_plan_make(512, 1024, 4096, 64, 1, 48 * 1024, H200_SMS, &p);
    q = p;
    vk_cm_plan_wave(&p, 4096, 132);
    ck_assert_mem_eq(&p, &q, sizeof p);
    static const uint32_t ms[] = {9, 16, 33, 64}, ns[] = {1, 100, 4096, 14336, 128256};
    static const uint32_t ks[] = {0, 8, 40, 511, 512, 1000, 4096, 14336};
    static const uint32_t gs[] = {1, 64, 132, 264, 1000};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t d = 0; d < 8; d++)
                for (size_t e = 0; e < 5; e++) {
                    uint32_t k = ks[d], g = gs[e];
                    vk_cm_plan_make(ms[a], ns[b], k, 64, vk_cm_stages_for(0, ms[a]), 48 * 1024, H200_SMS, &p);
                    vk_cm_plan_wave(&p, k, g);
                    uint64_t tiles = (uint64_t)p.tiles_m * p.tiles_n;
                    ck_assert_uint_eq(p.k_split % p.bk, 0);
                    ck_assert_uint_ge(p.slices, 1);
                    ck_assert_uint_ge((uint64_t)p.slices * p.k_split, k);
                    if (k > 0)
                        ck_assert_uint_lt((uint64_t)(p.slices - 1) * p.k_split, k);
                    ck_assert_uint_le(tiles * p.slices, tiles > g ? tiles : g);
                    ck_assert_uint_le(p.slices, k / VK_MM_MIN_SLICE > 1 ? k / VK_MM_MIN_SLICE : 1);
                }
}
END_TEST

/* matmul_cmp.comp's routing and plans (vk_cmp_used, vk_cmp_plan_make):
 * two shapes worked by hand, the shared-memory refusal, and invariants over
 * a grid (whole K steps, every K element in exactly one slice, tiles
 * covering [M, N), at most 16 matrices a subgroup as the shader's
 * epilogue spells out, workgroups within one wave when K is split). */
START_TEST(test_cmp_plan)
{
    vk_mm_caps c = {.coopmat = true, .cmp = VK_CMP_KHR};
    ck_assert(!vk_cmp_used(&c, 64) && vk_cmp_used(&c, 65) && vk_cmp_used(&c, 8192));
    c.cmp = VK_CMP_OFF;
    ck_assert(!vk_cmp_used(&c, 512));
    c.cmp = VK_CMP_NV;
    c.coopmat = false;
    ck_assert(!vk_cmp_used(&c, 512));
    vk_cm_plan p;
    /* 512 x 4096 x 4096, KHR: 4 x 16 tiles of 128 x 256, 132 / 64 = 2 slices of 2048 */
    ck_assert(vk_cmp_plan_make(512, 4096, 4096, true, 49152, H200_SMS, &p));
    ck_assert_uint_eq(p.bm, 128);
    ck_assert_uint_eq(p.bn, 256);
    ck_assert_uint_eq(p.bk, 32);
    ck_assert_uint_eq(32 * p.sgm * p.sgn, 256);
    ck_assert_uint_eq(p.fm * p.fn, 16);
    ck_assert_uint_eq(p.tiles_m, 4);
    ck_assert_uint_eq(p.tiles_n, 16);
    ck_assert_uint_eq(p.slices, 2);
    ck_assert_uint_eq(p.k_split, 2048);
    /* NV: 8 x 32 tiles of 64 x 128, 264 / 256 = 1 slice */
    ck_assert(vk_cmp_plan_make(512, 4096, 4096, false, 49152, H200_SMS, &p));
    ck_assert_uint_eq(p.bm, 64);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(32 * p.sgm * p.sgn, 128);
    ck_assert_uint_eq(p.tiles_m, 8);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.slices, 1);
    /* 65 x 600 x 1024, KHR: 1 x 3 tiles, 44 slices capped at 1024 / 256 = 4 of 256 */
    ck_assert(vk_cmp_plan_make(65, 600, 1024, true, 49152, H200_SMS, &p));
    ck_assert_uint_eq(p.slices, 4);
    ck_assert_uint_eq(p.k_split, 256);
    /* shared memory: (2 x 128 + 256) rows of 80 bytes = 40960; the NV plan 20480 */
    ck_assert(!vk_cmp_plan_make(512, 4096, 4096, true, 40959, H200_SMS, &p));
    ck_assert(vk_cmp_plan_make(512, 4096, 4096, true, 40960, H200_SMS, &p));
    ck_assert(!vk_cmp_plan_make(512, 4096, 4096, false, 20479, H200_SMS, &p));
    ck_assert(vk_cmp_plan_make(512, 4096, 4096, false, 32768, H200_SMS, &p));
    static const uint32_t ms[] = {65, 100, 128, 129, 257, 512, 2048, 8192};
    static const uint32_t ns[] = {136, 1000, 4096, 14336};
    static const uint32_t ks[] = {8, 96, 136, 1000, 4096, 14336};
    for (int khr = 0; khr < 2; khr++)
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d];
                    ck_assert(vk_cmp_plan_make(m, n, k, khr, 49152, H200_SMS, &p));
                    ck_assert_uint_le(VK_CMP_SMEM(p.bm, p.bn, p.bk), 49152);
                    ck_assert_uint_le(p.fm * p.fn, 16);
                    ck_assert_uint_eq(p.bm, 16 * p.fm * p.sgm);
                    ck_assert_uint_eq(p.bn, 16 * p.fn * p.sgn);
                    ck_assert_uint_eq(p.stages, 1);
                    ck_assert(p.tiles_m * p.bm >= m && (p.tiles_m - 1) * p.bm < m);
                    ck_assert(p.tiles_n * p.bn >= n && (p.tiles_n - 1) * p.bn < n);
                    ck_assert_uint_eq(p.k_split % p.bk, 0);
                    ck_assert(p.slices >= 1 && (uint64_t)p.slices * p.k_split >= k);
                    ck_assert((uint64_t)(p.slices - 1) * p.k_split < k);
                    uint64_t tiles = (uint64_t)p.tiles_m * p.tiles_n;
                    if (p.slices > 1) {
                        ck_assert_uint_le(tiles * p.slices, khr ? 132 : 264);
                        ck_assert_uint_ge(p.k_split, 256);
                    }
                }
}
END_TEST

/* matmul_cmp.comp at a given layout (vk_cmp_plan_cfg, $LLMEM_VULKAN_CMP_CFG):
 * two plans worked by hand, the refusals (workgroup, subgroup split, more
 * than 16 matrices a subgroup, K step, depth, shared memory of both ring
 * slices), the default layout planned as vk_cmp_plan_make plans it, and
 * the invariants of test_cmp_plan over a grid of shapes and layouts. */
/* Plan p's tiles cover [m, n] with no tile wholly outside, its K slices
 * (multiples of the K step) cover k with none empty, and a split into
 * slices stays within `groups` workgroups at K slices of 256 or more. */
static void expect_covers(const vk_cm_plan *p, uint32_t m, uint32_t n, uint32_t k,
                          uint64_t groups)
{
    ck_assert(p->tiles_m * p->bm >= m && (p->tiles_m - 1) * p->bm < m);
    ck_assert(p->tiles_n * p->bn >= n && (p->tiles_n - 1) * p->bn < n);
    ck_assert_uint_eq(p->k_split % p->bk, 0);
    ck_assert(p->slices >= 1 && (uint64_t)p->slices * p->k_split >= k);
    ck_assert((uint64_t)(p->slices - 1) * p->k_split < k);
    if (p->slices > 1) {
        ck_assert_uint_le((uint64_t)p->tiles_m * p->tiles_n * p->slices, groups);
        ck_assert_uint_ge(p->k_split, 256);
    }
}

START_TEST(test_cmp_plan_cfg)
{
    vk_cm_plan p, q;
    /* 496 x 4096 x 8192 at 128 x 128 tiles of 128 invocations: 4 x 32 tiles, 264 / 128 = 2
     * slices of 4096 */
    static const uint32_t c128[7] = {128, 2, 4, 4, 32, 1, 264};
    ck_assert(vk_cmp_plan_cfg(496, 4096, 8192, c128, 49152, 1024, &p));
    ck_assert_uint_eq(p.bm, 128);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.sgm * p.sgn, 4);
    ck_assert_uint_eq(p.tiles_m, 4);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.slices, 2);
    ck_assert_uint_eq(p.k_split, 4096);
    ck_assert_uint_eq(p.stages, 1);
    /* 496 x 8512 x 2048 at 64 x 256, ring of 16: 8 x 34 tiles, more than the wave: one slice */
    static const uint32_t c64[7] = {128, 1, 4, 4, 16, 2, 264};
    ck_assert(vk_cmp_plan_cfg(496, 8512, 2048, c64, 49152, 1024, &p));
    ck_assert_uint_eq(p.bm, 64);
    ck_assert_uint_eq(p.bn, 256);
    ck_assert_uint_eq(p.bk, 16);
    ck_assert_uint_eq(p.stages, 2);
    ck_assert_uint_eq(p.tiles_m, 8);
    ck_assert_uint_eq(p.tiles_n, 34);
    ck_assert_uint_eq(p.slices, 1);
    ck_assert_uint_eq(p.k_split, 2048);
    /* refusals */
    static const uint32_t bad[][7] = {
        {32, 1, 4, 4, 32, 1, 132},   /* fewer than 64 invocations */
        {2048, 2, 4, 4, 32, 1, 132}, /* more than max_wg */
        {192, 4, 4, 4, 32, 1, 132},  /* not a multiple of 32 SGM */
        {256, 0, 4, 4, 32, 1, 132},  {256, 2, 0, 4, 32, 1, 132},
        {256, 2, 8, 4, 32, 1, 132},  /* 32 matrices a subgroup */
        {256, 2, 4, 4, 24, 1, 132},  {256, 2, 4, 4, 32, 3, 132},
        {256, 2, 4, 4, 32, 2, 132},  /* two slices of 40960 bytes */
        {256, 4, 4, 4, 32, 1, 132},  /* 256 x 128 at BK 32: 51200 bytes */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!vk_cmp_plan_cfg(496, 4096, 4096, bad[i], 49152, 1024, &p), "bad[%zu]", i);
    static const uint32_t r16[7] = {256, 2, 4, 4, 16, 2, 132}; /* 2 x 24576: exactly 48 KiB */
    ck_assert(vk_cmp_plan_cfg(496, 4096, 4096, r16, 49152, 1024, &p));
    ck_assert(!vk_cmp_plan_cfg(496, 4096, 4096, r16, 49151, 1024, &p));
    /* the default layout at its wave: vk_cmp_plan_make's plan */
    static const uint32_t def[7] = {256, 2, 4, 4, VK_CMP_BK, 1, 132};
    static const uint32_t ms[] = {65, 129, 496, 2048};
    static const uint32_t ns[] = {136, 2048, 4096, 8512, 14336, 16768};
    static const uint32_t ks[] = {8, 136, 1000, 2048, 8192, 14336};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t d = 0; d < 6; d++) {
                ck_assert(vk_cmp_plan_cfg(ms[a], ns[b], ks[d], def, 49152, 1024, &p));
                ck_assert(vk_cmp_plan_make(ms[a], ns[b], ks[d], true, 49152, H200_SMS, &q));
                ck_assert(memcmp(&p, &q, sizeof p) == 0);
            }
    static const uint32_t cfgs[][7] = {{128, 2, 4, 4, 32, 1, 264}, {128, 1, 4, 4, 32, 1, 264},
                                       {128, 4, 4, 4, 32, 1, 264}, {256, 2, 4, 2, 32, 1, 264},
                                       {128, 2, 4, 4, 16, 2, 264}, {256, 4, 4, 4, 16, 1, 132},
                                       {256, 4, 2, 8, 32, 1, 132}, {256, 2, 4, 4, 64, 1, 0}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 6; b++)
                for (size_t d = 0; d < 6; d++) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d];
                    bool ok = vk_cmp_plan_cfg(m, n, k, cfgs[c], 49152, 1024, &p);
                    /* BK 64 at 128 x 256: 73728 bytes, more than 48 KiB */
                    ck_assert(ok == (cfgs[c][4] != 64));
                    if (!ok)
                        continue;
                    ck_assert_uint_le(p.stages * VK_CMP_SMEM(p.bm, p.bn, p.bk), 49152);
                    ck_assert_uint_le(p.fm * p.fn, 16);
                    ck_assert_uint_eq(32 * p.sgm * p.sgn, cfgs[c][0]);
                    expect_covers(&p, m, n, k, cfgs[c][6]);
                }
}
END_TEST

/* vk_cmp_plan_tail: the 2b shape's in_proj (136 tiles, 4 over one wave of
 * 132) takes 3 slices of 704 (H200 harness, precise: 0.220 -> 0.182 ms); the 9B shape's gate / up (224 tiles) and
 * in_proj (264: two whole waves) and every product within a wave keep
 * vk_cmp_plan_make's split; K of one slice, wave 0 leave the plan alone;
 * and the invariants (whole K steps, each K element in one slice, at most
 * VK_CMP_TAIL_MAX slices) over a grid; vk_cmp_tail_used by setting and
 * precision. */
START_TEST(test_cmp_plan_tail)
{
    vk_cm_plan p, q;
    ck_assert(vk_cmp_plan_make(496, 8512, 2048, true, 49152, H200_SMS, &p));
    ck_assert_uint_eq(p.tiles_m * p.tiles_n, 136);
    ck_assert_uint_eq(p.slices, 1);
    vk_cmp_plan_tail(&p, 2048, 132);
    ck_assert_uint_eq(p.slices, 3);
    ck_assert_uint_eq(p.k_split, 704);
    static const uint32_t keep[][3] = {{496, 14336, 4096}, {496, 16768, 4096}, {496, 4096, 8192},
                                       {496, 4096, 14336}, {496, 8192, 2048}, {496, 2048, 8192},
                                       {496, 6144, 4096}, {496, 8512, 256}};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        ck_assert(vk_cmp_plan_make(keep[i][0], keep[i][1], keep[i][2], true, 49152, H200_SMS, &p));
        q = p;
        vk_cmp_plan_tail(&q, keep[i][2], 132);
        ck_assert_msg(memcmp(&p, &q, sizeof p) == 0, "keep[%zu]", i);
    }
    ck_assert(vk_cmp_plan_make(496, 8512, 2048, true, 49152, H200_SMS, &p));
    q = p;
    vk_cmp_plan_tail(&q, 2048, 0);
    ck_assert(memcmp(&p, &q, sizeof p) == 0);
    /* which products take it: none, all, precise (two terms) only, the default */
    vk_mm_caps c = {.cmp_tail = VK_CMP_TAIL_OFF};
    ck_assert(!vk_cmp_tail_used(&c, 1) && !vk_cmp_tail_used(&c, 2));
    c.cmp_tail = VK_CMP_TAIL_ALL;
    ck_assert(vk_cmp_tail_used(&c, 1) && vk_cmp_tail_used(&c, 2));
    c.cmp_tail = VK_CMP_TAIL_PRECISE;
    ck_assert(!vk_cmp_tail_used(&c, 1) && vk_cmp_tail_used(&c, 2));
    ck_assert_uint_eq(VK_CMP_TAIL_DEFAULT, VK_CMP_TAIL_PRECISE);
    static const uint32_t ms[] = {65, 257, 496, 2048};
    static const uint32_t ns[] = {136, 2048, 8512, 14336, 16768};
    static const uint32_t ks[] = {8, 136, 1000, 2048, 8192};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t d = 0; d < 5; d++) {
                uint32_t m = ms[a], n = ns[b], k = ks[d];
                ck_assert(vk_cmp_plan_make(m, n, k, true, 49152, H200_SMS, &p));
                vk_cmp_plan_tail(&p, k, 132);
                ck_assert_uint_eq(p.k_split % p.bk, 0);
                ck_assert(p.slices >= 1 && (uint64_t)p.slices * p.k_split >= k);
                ck_assert((uint64_t)(p.slices - 1) * p.k_split < k);
                if ((uint64_t)p.tiles_m * p.tiles_n > 132)
                    ck_assert_uint_le(p.slices, VK_CMP_TAIL_MAX);
            }
}
END_TEST

/* matmul_cm.comp's KHR module (vk_cm_khr_used): only for its decode plans
 * (1 .. 64 rows; matmul_cmp.comp or the NV module above), only with the
 * cooperative-matrix path and the KHR module both on. */
START_TEST(test_cm_khr_route)
{
    vk_mm_caps c = {.coopmat = true, .cm_khr = true, .cmp = VK_CMP_KHR};
    ck_assert(vk_cm_khr_used(&c, 9) && vk_cm_khr_used(&c, 16) && vk_cm_khr_used(&c, 64));
    ck_assert(!vk_cm_khr_used(&c, 65) && !vk_cm_khr_used(&c, 512));
    /* above 64 rows with matmul_cmp off, matmul_cm's NV module (the KHR one is not measured there) */
    c.cmp = VK_CMP_OFF;
    ck_assert(!vk_cm_khr_used(&c, 65));
    c.cm_khr = false;
    ck_assert(!vk_cm_khr_used(&c, 16));
    c.cm_khr = true;
    c.coopmat = false;
    ck_assert(!vk_cm_khr_used(&c, 16));
}
END_TEST

/* matmul_cm2.comp's routing and plans (vk_cm2_used, vk_cm2_plan_make):
 * only above 64 rows with the cooperative-matrix path and cm2 both on
 * (with matmul_cmp off too: cm2 does not need it); the default plan of
 * 512 x 4096 x 4096 worked by hand; the granularity refusal; the plan
 * fields the shader reads as matmul_cmp's (bm = 16 fm sgm, bn = 16 fn
 * sgn, 32 sgm sgn invocations), at 256 and 128 invocations; and over a grid, tiles covering [M, N), every K
 * element in exactly one slice of whole steps, workgroups within one wave
 * when K is split. */
START_TEST(test_cm2_plan)
{
    vk_mm_caps c = {.coopmat = true, .cm2 = true, .cmp = VK_CMP_OFF};
    ck_assert(!vk_cm2_used(&c, 64) && vk_cm2_used(&c, 65) && vk_cm2_used(&c, 8192));
    c.cm2 = false;
    ck_assert(!vk_cm2_used(&c, 512));
    c.cm2 = true;
    c.coopmat = false;
    ck_assert(!vk_cm2_used(&c, 512));
    static const uint32_t h200[3] = {32, 32, 16}, none[3] = {0, 0, 0};
    vk_cm_plan p;
    /* 4 x 16 tiles of 128 x 256, 132 / 64 = 2 slices of 2048 */
    ck_assert(vk_cm2_plan_make(512, 4096, 4096, 256, 256, 32, h200, H200_SMS, &p));
    ck_assert_uint_eq(p.bm, 128);
    ck_assert_uint_eq(p.bn, 256);
    ck_assert_uint_eq(p.bk, 32);
    ck_assert_uint_eq(32 * p.sgm * p.sgn, 256);
    ck_assert_uint_eq(p.tiles_m, 4);
    ck_assert_uint_eq(p.tiles_n, 16);
    ck_assert_uint_eq(p.slices, 2);
    ck_assert_uint_eq(p.k_split, 2048);
    /* 128-column tiles: 4 x 32 = 128 tiles, one slice; K step 64 */
    ck_assert(vk_cm2_plan_make(512, 4096, 4096, 256, 128, 64, h200, H200_SMS, &p));
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.bk, 64);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.slices, 1);
    ck_assert_uint_eq(p.k_split, 4096);
    /* odd asks fall back to 256 columns and steps of 32 */
    ck_assert(vk_cm2_plan_make(512, 4096, 4096, 256, 200, 48, none, H200_SMS, &p));
    ck_assert_uint_eq(p.bn, 256);
    ck_assert_uint_eq(p.bk, 32);
    /* a K granularity of 32 refuses steps of 16; an N one of 512 any tile */
    static const uint32_t k32[3] = {32, 32, 32}, n512[3] = {32, 512, 16};
    ck_assert(!vk_cm2_plan_make(512, 4096, 4096, 256, 256, 16, k32, H200_SMS, &p));
    ck_assert(vk_cm2_plan_make(512, 4096, 4096, 256, 256, 32, k32, H200_SMS, &p));
    ck_assert(!vk_cm2_plan_make(512, 4096, 4096, 256, 256, 32, n512, H200_SMS, &p));
    /* 128 invocations: 128 x 128 tiles at most (a 256-column ask is cut), 4 x 32 tiles, 264 /
     * 128 = 2 slices */
    ck_assert(vk_cm2_plan_make(512, 4096, 4096, 128, 256, 32, h200, H200_SMS, &p));
    ck_assert_uint_eq(32 * p.sgm * p.sgn, 128);
    ck_assert_uint_eq(p.bm, 128);
    ck_assert_uint_eq(p.bn, 128);
    ck_assert_uint_eq(p.fn, 4);
    ck_assert_uint_eq(p.tiles_n, 32);
    ck_assert_uint_eq(p.slices, 2);
    ck_assert_uint_eq(p.k_split, 2048);
    static const uint32_t ms[] = {65, 100, 128, 129, 257, 512, 2048, 8192};
    static const uint32_t ns[] = {136, 1000, 4096, 14336};
    static const uint32_t ks[] = {8, 96, 136, 1000, 4096, 14336};
    static const uint32_t wb[][2] = {{256, 256}, {256, 128}, {256, 64}, {128, 128}, {128, 64}};
    for (size_t t = 0; t < sizeof wb / sizeof wb[0]; t++)
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++) {
                    uint32_t m = ms[a], n = ns[b], k = ks[d], wg = wb[t][0], bn = wb[t][1];
                    ck_assert(vk_cm2_plan_make(m, n, k, wg, bn, 32, h200, H200_SMS, &p));
                    ck_assert_uint_eq(p.bm, 16 * p.fm * p.sgm);
                    ck_assert_uint_eq(p.bn, 16 * p.fn * p.sgn);
                    ck_assert_uint_eq(p.bn, bn);
                    ck_assert_uint_eq(32 * p.sgm * p.sgn, wg);
                    ck_assert(p.fn >= 1 && p.fn <= 4);
                    expect_covers(&p, m, n, k, 132 * 256 / wg);
                }
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
    tcase_add_test(tc, test_cm_khr_route);
    tcase_add_test(tc, test_cm_usable);
    tcase_add_test(tc, test_cm_ring_plans);
    tcase_add_test(tc, test_cm_raw_layout);
    tcase_add_test(tc, test_cm_ctr_take);
    tcase_add_test(tc, test_cm_plan_wave);
    tcase_add_test(tc, test_cmp_plan);
    tcase_add_test(tc, test_cmp_plan_cfg);
    tcase_add_test(tc, test_cmp_plan_tail);
    tcase_add_test(tc, test_cm2_plan);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

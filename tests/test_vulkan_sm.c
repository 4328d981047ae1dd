// ctest-labels: vulkan
/* The Vulkan plans by the device's compute units ("SMs"; backends/vulkan/
 * vk_mm_pick.c, compiled in here, and the backend's $LLMEM_VULKAN_SM_COUNT):
 *   - vk_sm_count and vk_sm_pick: which extension's count wins, the cap,
 *     the knob over the device, the fallback;
 *   - at 132 SMs (the H200's, and the fallback) every plan is the one the
 *     absolute counts of before gave: split-K, matmul_cm's, matmul_cmp's,
 *     matmul_cm2's and matmul_dec's plans, the narrow layout's wave and the
 *     norms' row split, against the old formulas with 264 / 132 / 66 spelled
 *     out below (not the code under test), over grids of shapes;
 *   - the decode scan's fewest workgroups: 1024 at 132, scaled by the units elsewhere;
 *   - at 1, 24, 96, 128, 142 and 4096 SMs the invariants (tiles cover
 *     [M, N), every K element in exactly one slice of whole K steps, tiles x
 *     slices within the wave the plan aims at) and the direction: never more
 *     slices on fewer SMs, and shapes worked by hand;
 *   - with a device (lavapipe here, which lists none of the extensions):
 *     the count in $LLMEM_VULKAN_LOG (the fallback, the knob, a refused
 *     value, llmem_backend_reload_env), and products and RMS norms under
 *     several counts against float64.
 */
#include "support/run.h"
#include "support/vk_ops_test.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk_mm_pick.c"

static const uint32_t other_sms[] = {1, 24, 96, 128, 142, 4096};
#define N_OTHER (sizeof other_sms / sizeof other_sms[0])

static uint64_t ceil_div(uint64_t n, uint64_t d)
{
    return (n + d - 1) / d;
}

/* K of k in slices of whole bk steps as before the SM count: n slices
 * aimed at (at least 1, at most k / 256), k_split = ceil(ceil(k / n) / bk)
 * bk (bk where that is 0), slices = ceil(k / k_split) (1 for k 0). */
static void old_slices(uint64_t n, uint32_t k, uint32_t bk, uint32_t *slices, uint32_t *ks)
{
    uint64_t most = k / 256;
    n = n > most ? most : n;
    n = n < 1 ? 1 : n;
    uint64_t s = ceil_div(ceil_div(k, n), bk) * bk;
    if (s == 0)
        s = bk;
    *ks = (uint32_t)s;
    *slices = k == 0 ? 1 : (uint32_t)ceil_div(k, s);
}

/* The old vk_mm_split_k: 264 workgroups aimed at (2 per SM of the H200). */
static void old_split_k(uint64_t tiles, uint32_t k, uint32_t bk, uint32_t *slices, uint32_t *ks)
{
    old_slices(tiles < 264 ? ceil_div(264, tiles) : 1, k, bk, slices, ks);
}

/* The old one-wave split (matmul_cmp, matmul_cm2): floor(wave / tiles) slices of K at least 1
 * deep. */
static void old_wave(uint64_t tiles, uint32_t k, uint32_t bk, uint64_t wave, uint32_t *slices,
                     uint32_t *ks)
{
    old_slices(tiles ? wave / tiles : 1, k ? k : 1, bk, slices, ks);
    if (k == 0)
        *slices = 1;
}

/* Tiles of p cover [m, n) with none wholly outside; its slices, whole K steps, cover k with
 * none empty (each K element in exactly one slice). */
static void expect_cover(const vk_cm_plan *p, uint32_t m, uint32_t n, uint32_t k, const char *what)
{
    ck_assert_msg(p->tiles_m * p->bm >= m && (p->tiles_m - 1) * p->bm < m, "%s: rows", what);
    ck_assert_msg(p->tiles_n * p->bn >= n && (p->tiles_n - 1) * p->bn < n, "%s: columns", what);
    ck_assert_msg(p->bk && p->k_split % p->bk == 0, "%s: k_split %u", what, p->k_split);
    ck_assert_msg(p->slices >= 1 && (uint64_t)p->slices * p->k_split >= k, "%s: K", what);
    ck_assert_msg((uint64_t)(p->slices - 1) * p->k_split < (k ? k : 1), "%s: empty slice", what);
}

/* p and q the same blocking (all but the split of K). */
static bool same_tiles(const vk_cm_plan *p, const vk_cm_plan *q)
{
    return p->sgm == q->sgm && p->sgn == q->sgn && p->fm == q->fm && p->fn == q->fn &&
           p->bm == q->bm && p->bn == q->bn && p->bk == q->bk && p->stages == q->stages &&
           p->tiles_m == q->tiles_m && p->tiles_n == q->tiles_n;
}

START_TEST(test_sm_count)
{
    const char *src = NULL;
    vk_sm_info q = {.nv_sms = 132};
    ck_assert_uint_eq(vk_sm_count(&q, &src), 132);
    ck_assert_str_eq(src, "VK_NV_shader_sm_builtins");
    /* an RX 7900 XTX's layout: 6 engines x 2 arrays x 8 units = 96 */
    q = (vk_sm_info){.amd_engines = 6, .amd_arrays = 2, .amd_cus = 8};
    ck_assert_uint_eq(vk_sm_count(&q, &src), 96);
    ck_assert_str_eq(src, "VK_AMD_shader_core_properties");
    q.amd_active = 84; /* harvested units: the active count wins */
    ck_assert_uint_eq(vk_sm_count(&q, &src), 84);
    ck_assert_str_eq(src, "VK_AMD_shader_core_properties2");
    q = (vk_sm_info){.amd_engines = 6, .amd_arrays = 0, .amd_cus = 8}; /* incomplete */
    ck_assert_uint_eq(vk_sm_count(&q, &src), 0);
    ck_assert_str_eq(src, "none");
    q = (vk_sm_info){.arm_cores = 10};
    ck_assert_uint_eq(vk_sm_count(&q, &src), 10);
    ck_assert_str_eq(src, "VK_ARM_shader_core_builtins");
    q = (vk_sm_info){.nv_sms = 24, .arm_cores = 10};
    ck_assert_uint_eq(vk_sm_count(&q, NULL), 24);
    q = (vk_sm_info){.amd_engines = 1000, .amd_arrays = 1000, .amd_cus = 1000};
    ck_assert_uint_eq(vk_sm_count(&q, NULL), VK_SM_MAX);
    q = (vk_sm_info){0};
    ck_assert_uint_eq(vk_sm_count(&q, &src), 0);
    ck_assert_str_eq(src, "none");
    /* the knob over the device, the device over the fallback */
    ck_assert_uint_eq(vk_sm_pick(-1, 0), 132);
    ck_assert_uint_eq(vk_sm_pick(-1, 24), 24);
    ck_assert_uint_eq(vk_sm_pick(66, 132), 66);
    ck_assert_uint_eq(vk_sm_pick(4096, 0), 4096);
    ck_assert_uint_eq(vk_sm_pick(0, 24), 24);    /* outside 1..4096: not taken */
    ck_assert_uint_eq(vk_sm_pick(4097, 24), 24);
    ck_assert_uint_eq(VK_SM_FALLBACK, 132);
}
END_TEST

/* Split-K and matmul_cm.comp's plans (vk_mm_split_k, vk_cm_plan_make_fn) at 132 SMs and at 0
 * (the fallback) against the old formulas; at other counts the same tiles, the invariants and
 * the direction. */
START_TEST(test_sm_cm_plans)
{
    static const uint32_t ms[] = {1, 9, 16, 17, 33, 64, 65, 128, 129, 512, 2048};
    static const uint32_t ns[] = {1, 100, 128, 1024, 4096, 14336, 128256};
    static const uint32_t ks[] = {0, 8, 40, 256, 1000, 4096, 14336};
    for (uint64_t tiles = 1; tiles <= 600; tiles += tiles < 40 ? 1 : 7)
        for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++)
            for (uint32_t bk = 16; bk <= 64; bk *= 2) {
                uint32_t s, ks_, os, oks;
                old_split_k(tiles, ks[d], bk, &os, &oks);
                vk_mm_split_k(tiles, ks[d], bk, 132, &s, &ks_);
                ck_assert(s == os && ks_ == oks);
                vk_mm_split_k(tiles, ks[d], bk, 0, &s, &ks_);
                ck_assert(s == os && ks_ == oks);
                uint32_t prev = 1;
                for (size_t i = 0; i < N_OTHER; i++) {
                    uint32_t sms = other_sms[i];
                    vk_mm_split_k(tiles, ks[d], bk, sms, &s, &ks_);
                    ck_assert(ks_ % bk == 0 && (uint64_t)s * ks_ >= ks[d]);
                    ck_assert((uint64_t)(s - 1) * ks_ < (ks[d] ? ks[d] : 1));
                    ck_assert(s <= (tiles >= 2 * sms ? 1 : ceil_div(2 * sms, tiles)));
                    ck_assert_uint_ge(s, prev); /* more SMs, never fewer slices */
                    prev = s;
                }
            }
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++)
                for (uint32_t fn = 1; fn <= 4; fn *= 2)
                    for (uint32_t stages = 1; stages <= 3; stages += 2) {
                        uint32_t m = ms[a], n = ns[b], k = ks[d], s, ks_;
                        vk_cm_plan p, z, o;
                        vk_cm_plan_make_fn(m, n, k, 64, stages, 48 * 1024, 132, fn, &p);
                        vk_cm_plan_make_fn(m, n, k, 64, stages, 48 * 1024, 0, fn, &z);
                        ck_assert(memcmp(&p, &z, sizeof p) == 0);
                        uint64_t tiles = (uint64_t)p.tiles_m * p.tiles_n;
                        if (m > 64 && tiles >= 66) {
                            s = 1;
                            ks_ = (uint32_t)(ceil_div(k ? k : 1, p.bk) * p.bk);
                        } else {
                            old_split_k(tiles, k, p.bk, &s, &ks_);
                        }
                        ck_assert_msg(p.slices == s && p.k_split == ks_,
                                      "%ux%ux%u fn %u: %u slices of %u, before %u of %u", m, n,
                                      k, fn, p.slices, p.k_split, s, ks_);
                        uint32_t prev = 1;
                        for (size_t i = 0; i < N_OTHER; i++) {
                            vk_cm_plan_make_fn(m, n, k, 64, stages, 48 * 1024, other_sms[i], fn,
                                               &o);
                            ck_assert(same_tiles(&o, &p));
                            expect_cover(&o, m, n, k, "vk_cm_plan_make_fn");
                            if (m > 64 && tiles >= other_sms[i] / 2)
                                ck_assert_uint_eq(o.slices, 1);
                            ck_assert_uint_ge(o.slices, prev);
                            prev = o.slices;
                        }
                    }
    /* by hand: 32 tiles of K 4096 in steps of 16 aim at 264 workgroups on the H200 (9
     * slices of 464), 48 on 24 SMs (2 of 2048); 16 x 4096 x 4096 (32 tiles of 128 columns,
     * steps of 64): 8 slices of 512 on the H200, 2 of 2048 on 24 SMs */
    uint32_t s, ks_;
    vk_mm_split_k(32, 4096, 16, 24, &s, &ks_);
    ck_assert(s == 2 && ks_ == 2048);
    vk_cm_plan p;
    vk_cm_plan_make(16, 4096, 4096, 64, 1, 48 * 1024, 24, &p);
    ck_assert(p.slices == 2 && p.k_split == 2048);
    /* its one-wave split (LLMEM_VULKAN_CM_WAVE's default, one workgroup an SM): 4 slices of
     * 1024 on the H200, 3 of 1408 on 96 compute units, one on 24 */
    vk_cm_plan_wave(&p, 4096, VK_CM_WAVE_SM * 132);
    ck_assert(p.slices == 4 && p.k_split == 1024);
    vk_cm_plan_wave(&p, 4096, VK_CM_WAVE_SM * 96);
    ck_assert(p.slices == 3 && p.k_split == 1408);
    vk_cm_plan_wave(&p, 4096, VK_CM_WAVE_SM * 24);
    ck_assert(p.slices == 1 && p.k_split == 4096);
}
END_TEST

/* matmul_cmp.comp (vk_cmp_plan_make, vk_cmp_wave, vk_cmp_plan_tail) and matmul_cm2.comp
 * (vk_cm2_plan_make) likewise. */
START_TEST(test_sm_prefill_plans)
{
    static const uint32_t ms[] = {65, 129, 496, 2048, 8192};
    static const uint32_t ns[] = {136, 2048, 4096, 8512, 14336, 16768};
    static const uint32_t ks[] = {0, 8, 136, 1000, 2048, 8192, 14336};
    static const uint32_t g[3] = {32, 32, 16};
    ck_assert_uint_eq(vk_cmp_wave(true, 132), 132);
    ck_assert_uint_eq(vk_cmp_wave(false, 132), 264);
    ck_assert_uint_eq(vk_cmp_wave(true, 0), 132);
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++) {
                uint32_t m = ms[a], n = ns[b], k = ks[d], s, ks_;
                vk_cm_plan p, o;
                for (int khr = 0; khr < 2; khr++) {
                    ck_assert(vk_cmp_plan_make(m, n, k, khr, 49152, 132, &p));
                    old_wave((uint64_t)p.tiles_m * p.tiles_n, k, p.bk, khr ? 132 : 264, &s, &ks_);
                    ck_assert_msg(p.slices == s && p.k_split == ks_, "cmp %ux%ux%u", m, n, k);
                    ck_assert(vk_cmp_plan_make(m, n, k, khr, 49152, 0, &o));
                    ck_assert(memcmp(&p, &o, sizeof p) == 0);
                    uint32_t prev = 1;
                    for (size_t i = 0; i < N_OTHER; i++) {
                        uint32_t wave = vk_cmp_wave(khr, other_sms[i]);
                        ck_assert_uint_eq(wave, (khr ? 1 : 2) * other_sms[i]);
                        ck_assert(vk_cmp_plan_make(m, n, k, khr, 49152, other_sms[i], &o));
                        ck_assert(same_tiles(&o, &p));
                        expect_cover(&o, m, n, k, "vk_cmp_plan_make");
                        if (o.slices > 1)
                            ck_assert_uint_le((uint64_t)o.tiles_m * o.tiles_n * o.slices, wave);
                        ck_assert_uint_ge(o.slices, prev);
                        prev = o.slices;
                        vk_cmp_plan_tail(&o, k, wave); /* a last wave's tail: 4 slices at most */
                        expect_cover(&o, m, n, k, "vk_cmp_plan_tail");
                        ck_assert_uint_le(o.slices, (uint64_t)o.tiles_m * o.tiles_n > wave
                                                        ? VK_CMP_TAIL_MAX : prev);
                    }
                }
                for (uint32_t wg = 128; wg <= 256; wg *= 2) {
                    ck_assert(vk_cm2_plan_make(m, n, k, wg, 128, 32, g, 132, &p));
                    old_wave((uint64_t)p.tiles_m * p.tiles_n, k, p.bk, 132 * 256 / wg, &s, &ks_);
                    ck_assert_msg(p.slices == s && p.k_split == ks_, "cm2 %ux%ux%u", m, n, k);
                    uint32_t prev = 1;
                    for (size_t i = 0; i < N_OTHER; i++) {
                        ck_assert(vk_cm2_plan_make(m, n, k, wg, 128, 32, g, other_sms[i], &o));
                        ck_assert(same_tiles(&o, &p));
                        expect_cover(&o, m, n, k, "vk_cm2_plan_make");
                        if (o.slices > 1)
                            ck_assert_uint_le((uint64_t)o.tiles_m * o.tiles_n * o.slices,
                                              (uint64_t)other_sms[i] * 256 / wg);
                        ck_assert_uint_ge(o.slices, prev);
                        prev = o.slices;
                    }
                }
            }
    /* by hand, 512 x 4096 x 4096 on the KHR plan (64 tiles of 128 x 256): 2 slices of 2048 on
     * the H200 and on 142 SMs, one on 24, 16 of 256 on 4096 (k / 256 at most) */
    vk_cm_plan p;
    static const uint32_t sms[] = {132, 142, 24, 4096}, want[] = {2, 2, 1, 16};
    for (int i = 0; i < 4; i++) {
        ck_assert(vk_cmp_plan_make(512, 4096, 4096, true, 49152, sms[i], &p));
        ck_assert_uint_eq(p.slices, want[i]);
    }
    /* the 2b shape's in_proj, 496 x 8512 x 2048: 136 tiles, one slice each; a tail of 4 tiles
     * past the H200's wave (3 slices of 704, as before) and past an RTX 4090's 128 SMs (3
     * slices: ceil(408 / 128) / 3 + 0.2 = 1.53 waves against 2, 1.6, 1.55 with 1, 2, 4);
     * within one wave of an L40S's 142: kept */
    static const uint32_t tail_sms[] = {132, 128, 142}, tail_want[] = {3, 3, 1};
    for (int i = 0; i < 3; i++) {
        ck_assert(vk_cmp_plan_make(496, 8512, 2048, true, 49152, tail_sms[i], &p));
        ck_assert_uint_eq(p.slices, 1);
        vk_cmp_plan_tail(&p, 2048, vk_cmp_wave(true, tail_sms[i]));
        ck_assert_uint_eq(p.slices, tail_want[i]);
    }
    ck_assert_uint_eq(p.k_split, 2048);
}
END_TEST

/* matmul_dec.comp's default blocking (vk_dec_cfg_default: 264 workgroups on the H200), the
 * narrow layout's wave (vk_cm_plan_narrow: 264 on the H200, VK_CM_NARROW_WAVE before) and the
 * norms' row split (vk_row_split_wgs: 128 on the H200, ROW_SPLIT_WGS before). */
START_TEST(test_sm_decode_plans)
{
    static const uint32_t ns[] = {1, 136, 2048, 4096, 8512, 14336};
    static const uint32_t ks[] = {64, 1000, 2048, 4096, 8192, 14336};
    const uint32_t old_narrow[7] = {256, 2, 1, 64, 2, 10, 264}, df[5] = VK_CM_MID_FAST;
    vk_mm_caps h200 = {.n_sm = 132}, fallback = {.n_sm = 0}, old = {.cm_narrow_set = true};
    memcpy(old.cm_narrow, old_narrow, sizeof old_narrow);
    for (uint32_t m = 1; m <= 64; m++)
        for (uint32_t split = 1; split <= 2; split++) {
            vk_dec_cfg c, z;
            vk_dec_cfg_default(m, split, 132, &c);
            vk_dec_cfg_default(m, split, 0, &z);
            ck_assert_uint_eq(c.groups, 264);
            ck_assert(memcmp(&c, &z, sizeof c) == 0);
            for (size_t i = 0; i < N_OTHER; i++) {
                vk_dec_cfg_default(m, split, other_sms[i], &z);
                ck_assert_uint_eq(z.groups, 2 * other_sms[i]);
                z.groups = c.groups; /* nothing else follows the SMs */
                ck_assert(memcmp(&c, &z, sizeof c) == 0);
            }
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
                for (size_t d = 0; d < sizeof ks / sizeof ks[0]; d++) {
                    uint32_t n = ns[b], k = ks[d], prev = 1;
                    for (size_t i = 0; i < N_OTHER; i++) {
                        vk_dec_plan p;
                        vk_dec_cfg_default(m, split, other_sms[i], &c);
                        ck_assert(vk_dec_plan_make(m, n, k, split, &c, 49152, &p));
                        expect_cover(&p.cm, m, n, k, "vk_dec_plan_make");
                        uint64_t tiles = (uint64_t)p.cm.tiles_m * p.cm.tiles_n;
                        if (p.cm.slices > 1) /* round(groups / tiles) slices */
                            ck_assert_uint_le(tiles * p.cm.slices, c.groups + tiles / 2);
                        ck_assert_uint_ge(p.cm.slices, prev);
                        prev = p.cm.slices;
                    }
                    if (m < 33 || split != 1)
                        continue;
                    /* the narrow layout: at 132 SMs and at 0 the old constant's */
                    vk_cm_plan w, q0, q1;
                    uint32_t c0[5], c1[5];
                    ck_assert(vk_cm_plan_mid(m, n, k, 1, df, 49152, &w));
                    vk_cm_plan_wave(&w, k, 132);
                    bool b0 = vk_cm_plan_narrow(&old, m, n, k, 1, &w, 49152, c0, &q0);
                    ck_assert(b0 == vk_cm_plan_narrow(&h200, m, n, k, 1, &w, 49152, c1, &q1));
                    ck_assert(!b0 || (memcmp(c0, c1, sizeof c0) == 0 &&
                                      memcmp(&q0, &q1, sizeof q0) == 0));
                    ck_assert(b0 == vk_cm_plan_narrow(&fallback, m, n, k, 1, &w, 49152, c1, &q1));
                    ck_assert(!b0 || memcmp(&q0, &q1, sizeof q0) == 0);
                    for (size_t i = 0; i < N_OTHER; i++) {
                        vk_mm_caps o = {.n_sm = other_sms[i]};
                        if (!vk_cm_plan_narrow(&o, m, n, k, 1, &w, 49152, c1, &q1))
                            continue;
                        expect_cover(&q1, m, n, k, "vk_cm_plan_narrow");
                        uint64_t t = (uint64_t)q1.tiles_m * q1.tiles_n, wave = 2 * o.n_sm;
                        if (q1.slices > 1) /* round(wave / tiles) slices */
                            ck_assert_uint_le(t * q1.slices, wave + t / 2);
                    }
                }
        }
    /* 64 x 2048 x 4096 narrow (32 tiles of 64 x 64): round(264 / 32) = 8 slices on the
     * H200, round(48 / 32) = 2 on 24 SMs */
    vk_cm_plan w, q;
    uint32_t cfg[5];
    vk_mm_caps small = {.n_sm = 24};
    ck_assert(vk_cm_plan_mid(64, 2048, 4096, 1, df, 49152, &w));
    vk_cm_plan_wave(&w, 4096, 132);
    ck_assert(vk_cm_plan_narrow(&h200, 64, 2048, 4096, 1, &w, 49152, cfg, &q));
    ck_assert_uint_eq(q.slices, 8);
    ck_assert(vk_cm_plan_narrow(&small, 64, 2048, 4096, 1, &w, 49152, cfg, &q));
    ck_assert_uint_eq(q.slices, 2);
    /* the norms' row split and the waves' defaults */
    ck_assert_uint_eq(vk_row_split_wgs(132), 128);
    ck_assert_uint_eq(vk_row_split_wgs(0), 128);
    ck_assert_uint_eq(vk_row_split_wgs(24), 16);
    ck_assert_uint_eq(vk_row_split_wgs(1), 16);
    ck_assert_uint_eq(vk_row_split_wgs(142), 128);
    ck_assert_uint_eq(vk_row_split_wgs(96), 96);
    ck_assert_uint_eq(VK_CM_WAVE_SM * 132, 132);
    ck_assert_uint_eq(VK_CM_NARROW_WAVE_SM * 132, 264);
    ck_assert_uint_eq(VK_MM_GROUPS_SM * 132, 264);
    ck_assert_uint_eq(VK_CM_FULL_TILES(132), 66);
}
END_TEST

/* f(u) is ceil(ref x u / 132) at every unit count 1 .. VK_SM_MAX, so never
 * fewer on more units: an H200 figure (ref at its 132 units) scaled by the
 * device's count. */
static void expect_scaled(uint32_t (*f)(uint32_t), uint64_t ref)
{
    for (uint32_t u = 1; u <= VK_SM_MAX; u++) {
        uint64_t w = f(u);
        ck_assert_uint_ge(w * 132, ref * u);
        ck_assert_uint_lt((w - 1) * 132, ref * u);
        ck_assert_uint_ge(w, f(u - 1 ? u - 1 : 1));
    }
}

/* The decode scan's fewest workgroups (vk_scan_dec_wgs, vk_ops_mamba.c's SCAN_DEC_WGS 1024
 * before): 1024 at 132 units and at the fallback, so the H200's plans are the old ones;
 * elsewhere ceil(1024 units / 132) (hand-worked values), never fewer on more units, and
 * the items a lane group takes (the op's rule: items / (groups x wgs), 1 .. 8) never fewer
 * on fewer units. */
START_TEST(test_sm_scan_grid)
{
    ck_assert_uint_eq(vk_scan_dec_wgs(132), 1024);
    ck_assert_uint_eq(vk_scan_dec_wgs(0), 1024);
    ck_assert_uint_eq(vk_scan_dec_wgs(66), 512);
    ck_assert_uint_eq(vk_scan_dec_wgs(1), 8);       /* 1024 / 132 = 7.76 */
    ck_assert_uint_eq(vk_scan_dec_wgs(24), 187);    /* 24576 / 132 = 186.2 */
    ck_assert_uint_eq(vk_scan_dec_wgs(142), 1102);  /* 145408 / 132 = 1101.6 */
    ck_assert_uint_eq(vk_scan_dec_wgs(4096), 31776); /* 4194304 / 132 = 31775.03 */
    expect_scaled(vk_scan_dec_wgs, 1024);
    /* d_state 128 / 64 (32 / 16 lanes, 8 / 16 lane groups of 256), 4 rows an item, head_dim
     * 64, 8 .. 128 heads, 1 .. 64 sequences */
    for (uint64_t groups = 8; groups <= 16; groups *= 2)
        for (uint64_t heads = 8; heads <= 128; heads *= 4)
            for (uint64_t seqs = 1; seqs <= 64; seqs *= 2) {
                uint64_t items = seqs * heads * 64 / 4, prev = 0;
                for (size_t i = N_OTHER; i-- > 0;) { /* most units first */
                    uint64_t ipg = items / (groups * vk_scan_dec_wgs(other_sms[i]));
                    ipg = ipg < 1 ? 1 : ipg > 8 ? 8 : ipg;
                    ck_assert_uint_ge(ipg, prev);
                    prev = ipg;
                }
            }
}
END_TEST

/* The wide SwiGLU fold's target (vk_fold_wide_wgs, vk_presplit.c's 128 before): 128 at 132
 * units and at the fallback, so the H200's rows take the old ceil(128 / rows) workgroups;
 * elsewhere ceil(128 units / 132) (hand-worked values), never fewer on more units. */
START_TEST(test_sm_fold_wide)
{
    ck_assert_uint_eq(vk_fold_wide_wgs(132), 128);
    ck_assert_uint_eq(vk_fold_wide_wgs(0), 128);
    ck_assert_uint_eq(vk_fold_wide_wgs(66), 64);
    ck_assert_uint_eq(vk_fold_wide_wgs(1), 1);     /* 128 / 132 = 0.97 */
    ck_assert_uint_eq(vk_fold_wide_wgs(24), 24);   /* 3072 / 132 = 23.3 */
    ck_assert_uint_eq(vk_fold_wide_wgs(142), 138); /* 18176 / 132 = 137.7 */
    expect_scaled(vk_fold_wide_wgs, 128);
}
END_TEST

/* ---- with a device ------------------------------------------------------------------------ */

/* The count of the last "compute units: N (...)" line of the $LLMEM_VULKAN_LOG file at path,
 * the rest of that line into why (0 where none); refused: whether a line said a value of
 * LLMEM_VULKAN_SM_COUNT was refused. */
static uint32_t logged_sms(const char *path, char *why, size_t len, bool *refused)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    uint32_t n = 0;
    *refused = false;
    while (fgets(line, sizeof line, f)) {
        unsigned u;
        int at = 0;
        if (sscanf(line, "compute units: %u %n", &u, &at) == 1) {
            n = u;
            snprintf(why, len, "%s", line + at);
        }
        if (strstr(line, "LLMEM_VULKAN_SM_COUNT=") && strstr(line, "ignored"))
            *refused = true;
    }
    fclose(f);
    return n;
}

/* The count in the log at open and after llmem_backend_reload_env: unset, the device's (on
 * lavapipe, which lists none of the extensions, the fallback 132, said so); a value in range,
 * that; 0, 4097, "-3" and "many" refused with a line and the device's count kept. */
START_TEST(test_sm_knob)
{
    char path[] = "/tmp/llmem_vk_smXXXXXX", why[256];
    bool refused;
    test_env keep_log = test_env_save("LLMEM_VULKAN_LOG");
    test_env keep_sm = test_env_set("LLMEM_VULKAN_SM_COUNT", NULL);
    log_to_temp(path);
    llmem_backend *be = test_open("vulkan");
    uint32_t dev = logged_sms(path, why, sizeof why, &refused);
    ck_assert(!refused);
    ck_assert_uint_ge(dev, 1);
    if (strstr(why, "reports none"))
        ck_assert_uint_eq(dev, 132); /* the fallback */
    else
        ck_assert_msg(strstr(why, "VK_"), "the source of %u: %s", dev, why);
    static const char *good[] = {"24", "1", "4096", "66"};
    for (size_t i = 0; i < 4; i++) {
        test_env_put("LLMEM_VULKAN_SM_COUNT", good[i]);
        OK(llmem_backend_reload_env(be));
        ck_assert_uint_eq(logged_sms(path, why, sizeof why, &refused), (uint32_t)atoi(good[i]));
        ck_assert(!refused && strstr(why, "LLMEM_VULKAN_SM_COUNT"));
    }
    static const char *bad[] = {"0", "4097", "-3", "many"};
    for (size_t i = 0; i < 4; i++) {
        test_env_put("LLMEM_VULKAN_SM_COUNT", bad[i]);
        OK(llmem_backend_reload_env(be));
        ck_assert_uint_eq(logged_sms(path, why, sizeof why, &refused), dev);
        ck_assert_msg(refused, "LLMEM_VULKAN_SM_COUNT=%s not refused", bad[i]);
    }
    llmem_backend_close(be);
    test_env_put("LLMEM_VULKAN_SM_COUNT", "24"); /* at open too */
    be = test_open("vulkan");
    ck_assert_uint_eq(logged_sms(path, why, sizeof why, &refused), 24);
    llmem_backend_close(be);
    unlink(path);
    test_env_restore(&keep_sm);
    test_env_restore(&keep_log);
}
END_TEST

/* Products (precise and fast, bf16 weights: split-K of every path by the count) and RMS norms
 * at 12 rows (rows over several workgroups) under several counts, read by
 * llmem_backend_reload_env on one backend, against float64. */
START_TEST(test_sm_results)
{
    static const int32_t shapes[][3] = {{16, 1024, 520}, {40, 2048, 136}, {130, 1000, 300}};
    static const char *counts[] = {NULL, "1", "24", "96", "142", "4096"};
    enum { NS = sizeof shapes / sizeof shapes[0], ROWS = 12, D = 2048 };
    test_env keep_sm = test_env_save("LLMEM_VULKAN_SM_COUNT");
    llmem_backend *be = test_open("vulkan");
    float *x = rand_vec((size_t)ROWS * D, -2, 2), *g = rand_vec(D, 0.5f, 1.5f);
    double *nref = malloc((size_t)ROWS * D * sizeof *nref);
    ck_assert_ptr_nonnull(nref);
    vk_ref_rms_norm(x, g, ROWS, D, 1e-6, nref);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        test_env_put("LLMEM_VULKAN_SM_COUNT", counts[c]);
        OK(llmem_backend_reload_env(be));
        char what[128];
        for (size_t s = 0; s < NS; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
            float *a = rand_vec((size_t)m * k, -1, 1), *w = rand_vec((size_t)n * k, -1, 1);
            vk_trunc_bf16(w, (size_t)n * k); /* bf16-exact weights */
            double *ref = malloc((size_t)m * n * sizeof *ref);
            float *o = malloc((size_t)m * n * sizeof *o);
            ck_assert_ptr_nonnull(ref);
            ck_assert_ptr_nonnull(o);
            vk_ref_mm_f32(a, w, m, k, n, ref);
            for (int fast = 0; fast < 2; fast++) {
                run_matmul(be, a, w, m, k, n, BF16, fast, o);
                snprintf(what, sizeof what, "LLMEM_VULKAN_SM_COUNT=%s %s %dx%dx%d",
                         counts[c] ? counts[c] : "(unset)", fast ? "matmul_fast" : "matmul", m,
                         k, n);
                vk_expect_close(o, ref, m, n, fast ? vk_fast_rtol() : 1e-5, what);
            }
            free(a), free(w), free(ref), free(o);
        }
        llmem_buffer *bx, *bg, *bo;
        llmem_tensor tx = up_f32(be, &bx, x, 2, ROWS, D, 1), tg = up_f32(be, &bg, g, 1, D, 1, 1);
        llmem_tensor to = up_f32(be, &bo, NULL, 2, ROWS, D, 1);
        OK(llmem_op_rms_norm(be, &tx, &tg, 1e-6f, &to));
        float *got = malloc((size_t)ROWS * D * sizeof *got);
        ck_assert_ptr_nonnull(got);
        get_f32(&to, got);
        snprintf(what, sizeof what, "LLMEM_VULKAN_SM_COUNT=%s rms_norm %dx%d",
                 counts[c] ? counts[c] : "(unset)", ROWS, D);
        vk_expect_close(got, nref, ROWS, D, 1e-5, what);
        free(got);
        llmem_buffer_free(bx), llmem_buffer_free(bg), llmem_buffer_free(bo);
    }
    llmem_backend_close(be);
    test_env_restore(&keep_sm);
    free(x), free(g), free(nref);
}
END_TEST

int main(void)
{
    vk_test_seed();
    Suite *s = suite_create("vulkan_sm");
    TCase *tc = tcase_create("sm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sm_count);
    tcase_add_test(tc, test_sm_cm_plans);
    tcase_add_test(tc, test_sm_prefill_plans);
    tcase_add_test(tc, test_sm_decode_plans);
    tcase_add_test(tc, test_sm_scan_grid);
    tcase_add_test(tc, test_sm_fold_wide);
    /* the plans above need no device; these do */
    if (vulkan_opens("test_vulkan_sm", "only the plans without a device")) {
        tcase_add_test(tc, test_sm_knob);
        tcase_add_test(tc, test_sm_results);
    }
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

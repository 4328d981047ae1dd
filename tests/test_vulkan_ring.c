// ctest-labels: core vulkan
/* The ring schedule of matmul_cm.comp without a device
 * (backends/vulkan/vk_mm_pick.c, compiled in here): a model of the
 * shader's prologue and K-loop steps run against the workgroup barrier
 * rules, for every stage count the planner picks, and the stage counts it
 * picks by default. Split from test_vulkan_pick.c, which tests the path
 * choices and the blockings. */
#include "support/run.h"
#include <check.h>
#include <stdlib.h>

#include "backends/vulkan/vk_mm_pick.c"

/* the SM count the plans below were written for (the H200's; vk_mm_pick.h) */
#define H200_SMS 132u

/* A model of matmul_cm.comp's ring schedule (its prologue and STEP macro,
 * in the shader's order: R = stages - 1 register sets, two shared
 * slices), run against a checker of the workgroup barrier rules: a shared
 * slice is read only after a barrier that follows its write, and written
 * only after a barrier that follows its last read; a register set is
 * stored only with the slice it was loaded with, and loaded only once
 * emptied; every slice is loaded, stored and computed once, in order;
 * the epilogue reuses the ring only after a barrier that follows the last
 * read. */
typedef struct ring_sim {
    uint32_t r, ns, epoch;
    int64_t held[2], wr[2], rd[2]; /* per shared slice: K slice, epochs of last write, read */
    int64_t reg[3], reg_at[3];     /* per register set: K slice (-1 empty), step of its load */
    uint32_t fetched, stored, computed;
    uint32_t min_ahead; /* fewest steps from a loop load to the MMAs of its slice */
    bool ok;
} ring_sim;

static void sim_fetch(ring_sim *r, uint32_t set, uint32_t slice, int64_t step)
{
    r->ok = r->ok && set < r->r && r->reg[set] < 0 && slice == r->fetched && slice < r->ns;
    r->reg[set] = slice;
    r->reg_at[set] = step;
    if (step >= 0 && slice - (uint32_t)step < r->min_ahead)
        r->min_ahead = slice - (uint32_t)step;
    r->fetched++;
}

static void sim_store(ring_sim *r, uint32_t set, uint32_t st)
{
    r->ok = r->ok && set < r->r && st < 2 && r->reg[set] == (int64_t)r->stored &&
            r->wr[st] < (int64_t)r->epoch && r->rd[st] < (int64_t)r->epoch;
    r->held[st] = r->reg[set];
    r->wr[st] = r->epoch;
    r->reg[set] = -1;
    r->stored++;
}

static void sim_compute(ring_sim *r, uint32_t st)
{
    r->ok = r->ok && r->held[st] == (int64_t)r->computed && r->wr[st] < (int64_t)r->epoch;
    r->rd[st] = r->epoch;
    r->computed++;
}

static void sim_step(ring_sim *r, uint32_t j, uint32_t set)
{
    r->epoch++; /* barrier() */
    if (j + 1 < r->ns) {
        sim_store(r, set, (j + 1) % 2);
        if (j + 1 + r->r < r->ns)
            sim_fetch(r, set, j + 1 + r->r, j);
    }
    sim_compute(r, j % 2);
}

static void ring_schedule(uint32_t stages, uint32_t ns, ring_sim *r)
{
    *r = (ring_sim){.r = stages - 1, .ns = ns, .ok = true, .min_ahead = UINT32_MAX};
    for (int i = 0; i < 2; i++)
        r->held[i] = r->wr[i] = r->rd[i] = -1;
    for (int i = 0; i < 3; i++)
        r->reg[i] = r->reg_at[i] = -1;
    /* prologue (the shader's loads past k_end give zeros; only real slices here):
     * slice 0 through set R - 1, slices 1 .. R into sets 0 .. R - 1 */
    uint32_t last = r->r - 1;
    if (ns > 0)
        sim_fetch(r, last, 0, -1);
    for (uint32_t q = 1; q < r->r && q < ns; q++)
        sim_fetch(r, q - 1, q, -1);
    if (ns > 0)
        sim_store(r, last, 0);
    if (r->r < ns)
        sim_fetch(r, last, r->r, -1);
    for (uint32_t j = 0; j < ns; j += r->r) {
        sim_step(r, j, 0);
        if (r->r >= 2 && j + 1 < ns)
            sim_step(r, j + 1, 1);
        if (r->r >= 3 && j + 2 < ns)
            sim_step(r, j + 2, 2);
    }
    r->epoch++; /* the epilogue's barrier */
    for (uint32_t st = 0; st < 2; st++)
        r->ok = r->ok && r->rd[st] < (int64_t)r->epoch;
}

/* The default depth by rows (measured on the H200, vk_mm_pick.h): the
 * ring, 3 deep, up to 16 rows, one slice above; an asked depth is kept
 * whatever the rows; on 48 KiB the 16-row plan gets the ring and the
 * 17- and 64-row plans do not. */
START_TEST(test_cm_stages_default)
{
    ck_assert_uint_eq(vk_cm_stages_for(0, 1), 3);
    ck_assert_uint_eq(vk_cm_stages_for(0, 9), 3);
    ck_assert_uint_eq(vk_cm_stages_for(0, 16), 3);
    ck_assert_uint_eq(vk_cm_stages_for(0, 17), 1);
    ck_assert_uint_eq(vk_cm_stages_for(0, 64), 1);
    ck_assert_uint_eq(vk_cm_stages_for(0, 512), 1);
    for (uint32_t asked = 1; asked <= 4; asked++) {
        ck_assert_uint_eq(vk_cm_stages_for(asked, 16), asked);
        ck_assert_uint_eq(vk_cm_stages_for(asked, 64), asked);
    }
    vk_cm_plan p;
    vk_cm_plan_make(16, 4096, 4096, 64, vk_cm_stages_for(0, 16), 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 3);
    vk_cm_plan_make(17, 4096, 4096, 64, vk_cm_stages_for(0, 17), 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 1);
    vk_cm_plan_make(64, 4096, 4096, 64, vk_cm_stages_for(0, 64), 48 * 1024, H200_SMS, &p);
    ck_assert_uint_eq(p.stages, 1);
}
END_TEST

START_TEST(test_cm_ring_schedule)
{
    for (uint32_t stages = 2; stages <= VK_CM_STAGES_MAX; stages++)
        for (uint32_t ns = 0; ns <= 40; ns++) {
            ring_sim r;
            ring_schedule(stages, ns, &r);
            ck_assert_msg(r.ok, "depth %u, %u steps: a race or a slice out of order", stages, ns);
            ck_assert_uint_eq(r.fetched, ns);
            ck_assert_uint_eq(r.stored, ns);
            ck_assert_uint_eq(r.computed, ns);
            ck_assert(r.reg[0] < 0 && r.reg[1] < 0 && r.reg[2] < 0);
            /* every load issued in the loop is `stages` steps ahead of its MMAs */
            if (ns > stages)
                ck_assert_uint_eq(r.min_ahead, stages);
        }
    /* the checker catches a race: shared slice 0 stored while step 4 may still read it */
    ring_sim r;
    ring_schedule(2, 4, &r);
    ck_assert(r.ok);
    r.rd[0] = r.epoch;
    r.reg[0] = 4;
    r.stored = 4;
    sim_store(&r, 0, 0);
    ck_assert(!r.ok);
}
END_TEST

/* The ring's index arithmetic, as matmul_cm.comp computes it, for every
 * plan up to 64 rows: invocation l's i-th load of a slice (e = l + i WG)
 * lands on row e / RV, uvec4 e % RV of its stage; each of the stage's
 * rows gets each of its RV uvec4s exactly once, nothing lands in the
 * padding or outside the stage, the tensor-core loads of A (rows sm + 16 i
 * and BM + ..., uvec4s 2 kk, 2 kk + 1) and B read only written uvec4s of
 * the same stage, and the epilogue's matrices (sg 16 CSV + r CSV + c / 4)
 * stay inside the ring and apart from each other. */
START_TEST(test_cm_ring_indices)
{
    for (uint32_t m = 9; m <= 64; m++)
        for (uint32_t asked = 2; asked <= 4; asked += 2)
            for (uint32_t split = 1; split <= 2; split++) {
                vk_cm_plan p;
                vk_cm_plan_make(m, 4096, 4096, 64, asked, 48 * 1024, H200_SMS, &p);
                ck_assert_uint_ge(p.stages, 2);
                const uint32_t wg = VK_CM_WG, rv = p.bk / 8, ld = rv + 1;
                const uint32_t stg = (split * p.bm + p.bn) * ld, csv = 5;
                const uint32_t na = (split * p.bm * rv + wg - 1) / wg, nw = (p.bn * rv + wg - 1) / wg;
                uint8_t *hits = calloc(stg, 1);
                ck_assert_ptr_nonnull(hits);
                for (uint32_t l = 0; l < wg; l++) {
                    for (uint32_t i = 0; i < na; i++) {
                        uint32_t e = l + i * wg;
                        if (e < split * p.bm * rv)
                            hits[(e / rv) * ld + e % rv]++;
                    }
                    for (uint32_t i = 0; i < nw; i++) {
                        uint32_t e = l + i * wg;
                        if (e < p.bn * rv)
                            hits[split * p.bm * ld + (e / rv) * ld + e % rv]++;
                    }
                }
                for (uint32_t x = 0; x < stg; x++)
                    ck_assert_uint_eq(hits[x], x % ld < rv ? 1 : 0);
                for (uint32_t sg = 0; sg < 8; sg++) {
                    uint32_t sm = (sg % p.sgm) * p.fm * 16, sn = (sg / p.sgm) * p.fn * 16;
                    for (uint32_t kk = 0; kk < p.bk / 16; kk++)
                        for (uint32_t r = 0; r < 16; r++)
                            for (uint32_t c = 0; c < 2; c++) {
                                for (uint32_t i = 0; i < p.fm; i++)
                                    for (uint32_t t = 0; t < split; t++)
                                        ck_assert_uint_eq(
                                            hits[(t * p.bm + sm + 16 * i + r) * ld + 2 * kk + c], 1);
                                for (uint32_t j = 0; j < p.fn; j++)
                                    ck_assert_uint_eq(
                                        hits[split * p.bm * ld + (sn + 16 * j + r) * ld + 2 * kk + c],
                                        1);
                            }
                }
                free(hits);
                uint32_t ring = 2 * stg;
                uint8_t *ep = calloc(ring, 1);
                ck_assert_ptr_nonnull(ep);
                for (uint32_t sg = 0; sg < 8; sg++)
                    for (uint32_t r = 0; r < 16; r++)
                        for (uint32_t c = 0; c < 16; c += 4) {
                            uint32_t x = sg * 16 * csv + r * csv + c / 4;
                            ck_assert_uint_lt(x, ring);
                            ck_assert_uint_eq(ep[x]++, 0);
                        }
                free(ep);
            }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("vulkan_ring");
    TCase *tc = tcase_create("ring");
    tcase_add_test(tc, test_cm_stages_default);
    tcase_add_test(tc, test_cm_ring_schedule);
    tcase_add_test(tc, test_cm_ring_indices);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

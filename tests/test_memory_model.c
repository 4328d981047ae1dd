// ctest-labels: core
/* Model-based randomized test of the memory modules.
 *
 * Random operation sequences (plans with random batches applied and
 * committed ubatch by ubatch, early releases, plans that must fail,
 * seq_rm / seq_cp / seq_keep / seq_add / seq_div, clear, state round trips
 * with corrupted streams, prefix hits by re-submitting earlier prompts)
 * run on KV caches (page sizes 1, 16, 64, few pages so that NO_SPACE and
 * eviction happen), recurrent memories (0 and 3 checkpoints) and hybrids
 * (KV + recurrent, KV + KV). After every step the memory is compared with
 * a brute-force reference (tests/support/memref*.c): predicted status,
 * every sequence's tokens and positions, page tables (sharing and
 * copy-on-write included), recurrent checkpoints and slots, stats,
 * llmem_memory_check, and the data held in every K/V slot and state slot
 * (tags written by an emulated forward pass). docs/testing.md has the
 * rules the reference follows. The engine is tests/support/memmodel.c;
 * this file holds the configurations.
 *
 *   LLMEM_TEST_SEED=<n>   base seed (default fixed; printed on failure)
 *   LLMEM_TEST_ITERS=<n>  operations per configuration (default 3000-6000)
 *   LLMEM_TEST_TRACE=1    print every operation, batch and sequence
 */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "support/memmodel.h"

static mr_config kv_config(int32_t ps, int32_t n_pages, int32_t n_seq, int32_t n_layers,
                           bool prefix, bool poison)
{
    mr_config c = {.n_seq_max = n_seq, .n_children = 1};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = n_layers, .page_size = ps,
                                   .n_pages = n_pages, .prefix = prefix, .poison = poison};
    return c;
}

static mr_config rs_config(int32_t n_ckpt, int32_t n_seq, int32_t n_layers)
{
    mr_config c = {.n_seq_max = n_seq, .n_children = 1};
    c.child[0] = (mr_child_config){.kv = false, .n_layers = n_layers, .n_ckpt = n_ckpt};
    return c;
}

START_TEST(model_kv_page1)
{
    mr_config c = kv_config(1, 40, 5, 1, true, false);
    memmodel_run("kv page 1", &c, 6000, 1);
}
END_TEST

/* Pools with room for page magazines (kv_cache.mag: a decoding sequence
 * takes up to 16 tokens' worth of pages ahead, which go back whenever
 * anything else needs them): pages of 1 and of 2. */
START_TEST(model_kv_magazines)
{
    mr_config c = kv_config(1 + _i, 160 / (1 + _i), 5, 1, _i == 0, false);
    memmodel_run(_i == 0 ? "kv page 1, magazines" : "kv page 2, magazines (no prefix cache)", &c,
                 4000, 11 + _i);
}
END_TEST

START_TEST(model_kv_page16)
{
    mr_config c = kv_config(16, 20, 6, 2, true, true);
    memmodel_run("kv page 16 (poison)", &c, 6000, 2);
}
END_TEST

START_TEST(model_kv_page64)
{
    mr_config c = kv_config(64, 7, 4, 1, true, false);
    memmodel_run("kv page 64", &c, 5000, 3);
}
END_TEST

START_TEST(model_kv_page4_no_prefix)
{
    mr_config c = kv_config(4, 24, 6, 1, false, false);
    memmodel_run("kv page 4 (no prefix cache)", &c, 3000, 4);
}
END_TEST

START_TEST(model_recurrent_ckpt0)
{
    mr_config c = rs_config(0, 5, 1);
    memmodel_run("recurrent n_ckpt 0", &c, 5000, 5);
}
END_TEST

START_TEST(model_recurrent_ckpt3)
{
    mr_config c = rs_config(3, 5, 2);
    memmodel_run("recurrent n_ckpt 3", &c, 6000, 6);
}
END_TEST

START_TEST(model_hybrid)
{
    mr_config c = {.n_seq_max = 5, .n_children = 2, .n_layers = 3, .layer_child = {0, 1, 0}};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = 2, .page_size = 8, .n_pages = 30,
                                   .prefix = true};
    c.child[1] = (mr_child_config){.kv = false, .n_layers = 1, .n_ckpt = 2};
    memmodel_run("hybrid kv page 8 + recurrent n_ckpt 2", &c, 6000, 7);
}
END_TEST

START_TEST(model_hybrid_kv_kv)
{
    mr_config c = {.n_seq_max = 5, .n_children = 2, .n_layers = 3, .layer_child = {0, 1, 0}};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = 2, .page_size = 3, .n_pages = 40,
                                   .prefix = true};
    c.child[1] = (mr_child_config){.kv = true, .n_layers = 1, .page_size = 4, .n_pages = 24,
                                   .prefix = true};
    memmodel_run("hybrid kv page 3 + kv page 4", &c, 5000, 8);
}
END_TEST

/* The state layouts of issue 16 (gated delta net, LFM2 short conv,
 * Mamba-1; memref.h mr_rs_layout), each beside a KV cache. */
START_TEST(model_hybrid_state_kinds)
{
    for (int32_t layout = MR_RS_GDN; layout <= MR_RS_MAMBA1; layout++) {
        mr_config c = {.n_seq_max = 4, .n_children = 2, .n_layers = 3, .layer_child = {1, 0, 1}};
        c.child[0] = (mr_child_config){.kv = true, .n_layers = 1, .page_size = 4, .n_pages = 24,
                                       .prefix = true};
        c.child[1] = (mr_child_config){.kv = false, .n_layers = 2, .n_ckpt = 2, .layout = layout};
        memmodel_run("hybrid kv page 4 + recurrent state kind", &c, 1500, 9 + (uint64_t)layout);
    }
}
END_TEST

/* Recurrent snapshots and the device prefix budget (issue 13 items 1 and
 * 8; memref.h): hybrid hits at the length where a page chain and a
 * snapshot agree, read from the snapshot's slot (its data tag checked),
 * never published by a failed or aborted step; under a budget smaller than
 * the pages and snapshot slots, cached pages (256 bytes: 2 layers of K and
 * V, 4 tokens of 16 bytes) and snapshots (48 bytes) are evicted least
 * recently used together, and stay within it after every step. */
START_TEST(model_hybrid_snapshots)
{
    static const int64_t budgets[3] = {0, 6 * 256 + 3 * 48, 2 * 256 + 2 * 48};
    static const char *const names[3] = {
        "hybrid kv page 4 + recurrent, 6 snapshots",
        "hybrid kv page 4 + recurrent, 8 snapshots, budget of 6 pages + 3 snapshots",
        "hybrid kv page 4 + recurrent, 8 snapshots, budget of 2 pages + 2 snapshots (poison)"};
    int64_t budget = budgets[_i];
    mr_config c = {.n_seq_max = 4, .n_children = 2, .n_layers = 3, .layer_child = {0, 1, 0}};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = 2, .page_size = 4, .n_pages = 40,
                                   .prefix = true, .poison = _i == 2, .budget = budget};
    c.child[1] = (mr_child_config){.kv = false, .n_layers = 1, .n_ckpt = 0,
                                   .n_snap = _i == 0 ? 6 : 8, .poison = _i == 2};
    memmodel_run(names[_i], &c, 3000, 20 + (uint64_t)_i);
}
END_TEST

/* A recurrent memory alone with snapshots under a budget of 3 of its 6
 * slots: its own prefix hits (no attention child to agree with). */
START_TEST(model_recurrent_snapshots)
{
    mr_config c = rs_config(0, 4, 2);
    c.child[0].n_snap = 6;
    c.child[0].budget = 3 * 96;
    memmodel_run("recurrent, 6 snapshots, budget of 3", &c, 3000, 23);
}
END_TEST

Suite *memory_model_suite(void);
Suite *memory_model_suite(void)
{
    Suite *s = suite_create("memory_model");
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {{"kv1", model_kv_page1},        {"kv16", model_kv_page16},
                 {"kv64", model_kv_page64},      {"kv4", model_kv_page4_no_prefix},
                 {"rs0", model_recurrent_ckpt0}, {"rs3", model_recurrent_ckpt3},
                 {"hybrid", model_hybrid},        {"hybrid2", model_hybrid_kv_kv},
                 {"kinds", model_hybrid_state_kinds}};
    /* issue 13: snapshots and the prefix budget (three configurations) */
    TCase *snap = tcase_create("snapshots");
    tcase_set_timeout(snap, 300);
    tcase_add_loop_test(snap, model_hybrid_snapshots, 0, 3);
    tcase_add_test(snap, model_recurrent_snapshots);
    suite_add_tcase(s, snap);
    TCase *mag = tcase_create("magazines");
    tcase_set_timeout(mag, 300);
    tcase_add_loop_test(mag, model_kv_magazines, 0, 2);
    suite_add_tcase(s, mag);
    /* one case per configuration: CK_RUN_CASE=hybrid runs only that one */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    int failed = test_run_suite(memory_model_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

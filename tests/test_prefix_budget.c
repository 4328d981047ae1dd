// ctest-labels: core
/* The device prefix budget (issue 13 item 1; memory/prefix_budget.h): one
 * byte budget and one LRU for cached KV pages and recurrent snapshots,
 * shared by a hybrid's children.
 *
 * Geometry everywhere: KV 1 layer, 1 head, head_dim 2, f32, pages of 4
 * tokens, so a cached page costs 2 (K, V) * 4 tokens * 2 * 4 bytes = 64
 * bytes; recurrent 1 layer with one f32 state of 4 elements, so a snapshot
 * costs 16 bytes. Every expected eviction, hit length and byte count below
 * is derived by hand from the rules in prefix_budget.h (stamps: a page
 * when it becomes cached, a snapshot when published, re-published or read
 * by a hit; the oldest unpinned entry of either kind goes first), written
 * out in the comments, never read back from the memory under test. */
#include "support/run.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memtest.h"

#define PAGE_B 64
#define SNAP_B 16

static llmem_kv_cache_params kv_params(int64_t budget, int64_t host)
{
    llmem_kv_cache_params p = mt_kv_params(4, 32, 2);
    p.prefix_cache_bytes = budget;
    p.host_tier_bytes = host;
    return p;
}

static llmem_recurrent_params rs_params(int32_t n_snap, int64_t budget)
{
    llmem_recurrent_params p = mt_rs_params(2, 0);
    p.poison = true;
    p.n_snapshots = n_snap;
    p.snap_interval = 4;
    p.prefix_cache_bytes = budget;
    return p;
}

/* A hybrid whose KV cache carries the budget (the recurrent child joins it). */
static llmem_memory *hybrid(llmem_backend *be, int64_t budget, int32_t n_snap)
{
    llmem_kv_cache_params kp = kv_params(budget, 0);
    llmem_recurrent_params rp = rs_params(n_snap, 0);
    llmem_memory *ch[2] = {mt_kv_create(be, &kp), mt_rs_create(be, &rp)}, *h = NULL;
    const int32_t map[2] = {0, 1};
    char err[256] = "";
    ck_assert_msg(llmem_hybrid_create(ch, 2, map, 2, &h, err, sizeof err) == LLMEM_OK, "%s", err);
    return h;
}

/* Writes K/V and states of every ubatch (their values are not checked
 * here: tests/test_snapshot_model.c compares them with a cache-off twin). */
static void forward(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    (void)c;
    for (int32_t il = 0; il < llmem_memory_n_layers(mem); il++) {
        llmem_view v;
        ck_assert_int_eq(llmem_memory_view(mem, il, &v), LLMEM_OK);
        if (v.kind == LLMEM_VIEW_KV) {
            const llmem_kv_view *kv = llmem_view_kv(&v);
            for (int32_t j = 0; j < kv->store_slot.n; j++) {
                float k[2] = {(float)ub->token[kv->store_tok.host[j]], 1.0f};
                size_t off = (size_t)kv->store_slot.host[j] * 8;
                ck_assert_int_eq(llmem_buffer_upload(kv->k, off, k, 8), LLMEM_OK);
                ck_assert_int_eq(llmem_buffer_upload(kv->v, off, k, 8), LLMEM_OK);
            }
        } else if (v.kind == LLMEM_VIEW_RECURRENT) {
            const llmem_rs_view *r = llmem_view_rs(&v);
            for (int32_t s = 0; s < r->n_seqs; s++) {
                float f[4] = {1, 2, 3, 4};
                ck_assert_int_eq(llmem_buffer_upload(r->state[0],
                                                     (size_t)r->dst_slot.host[s] * 16, f, 16),
                                 LLMEM_OK);
            }
        }
    }
}

/* Runs tokens tok[0, n) as a new prompt of seq in ubatches of n_ubatch. */
static void run_prompt(llmem_memory *m, int32_t seq, const int32_t *tok, int32_t n,
                       int32_t n_ubatch)
{
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(64, 1, &b), LLMEM_OK);
    for (int32_t j = 0; j < n; j++)
        ck_assert_int_eq(llmem_batch_buf_add(b, tok[j], j, &seq, 1, j == n - 1), LLMEM_OK);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), n_ubatch, forward, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_destroy(b);
    mt_assert_check(m);
}

/* The prefix-cache hit a prompt tok[0, n) of (empty) seq gets, planned and
 * released without running: nothing changes but LRU stamps. */
static int32_t hit_of(llmem_memory *m, int32_t seq, const int32_t *tok, int32_t n)
{
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(64, 1, &b), LLMEM_OK);
    for (int32_t j = 0; j < n; j++)
        ck_assert_int_eq(llmem_batch_buf_add(b, tok[j], j, &seq, 1, j == n - 1), LLMEM_OK);
    llmem_plan *plan = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 64, &plan, err,
                                    sizeof err) == LLMEM_OK,
                  "%s", err);
    int32_t c = llmem_plan_n_cached(plan, seq);
    llmem_memory_release(m, plan);
    llmem_batch_buf_destroy(b);
    mt_assert_check(m);
    return c;
}

static llmem_memory_stats stats(llmem_memory *m)
{
    llmem_memory_stats st;
    ck_assert_int_eq(llmem_memory_get_stats(m, &st), LLMEM_OK);
    return st;
}

static void end_seq(llmem_memory *m, int32_t seq)
{
    ck_assert_int_eq(llmem_memory_seq_rm(m, seq, -1, -1), LLMEM_OK);
    mt_assert_check(m);
}

/* Pages and snapshots trade places under one budget of 3 pages + 2
 * snapshots = 224 bytes (stamps in brackets, one shared clock):
 *  1. X = 1..8 in seq 0, ubatches of 4: snapshots sX4 [1], sX8 [2] at
 *     commit; pages X0, X1 held. Used 32.
 *  2. seq_rm 0: X1 cached [3] (96), X0 [4] (160); the recurrent child
 *     re-publishes the end state, touching sX8 [5].
 *  3. Y = 101..104 in seq 1: sY4 [6] (176). seq_rm 1: Y0 cached [7] (240 >
 *     224: the oldest, sX4 [1], goes: 224); sY4 touched [8].
 *     Now X1 X0 sX8 Y0 sY4: 3 pages + 2 snapshots = 224 exactly.
 *  4. 1,2,3,4,9,9: KV holds X0 (4 tokens) but sX4 is gone: hit 0 (a twin
 *     with room for everything hits 4). 1..8,9,9: X0 X1 and sX8: hit 8
 *     (pins and releases them: X pages and sX8 become the newest).
 *  5. Z = 201..212 in seq 1, one ubatch: sZ12 needs 16 bytes: the oldest,
 *     Y0 [7], goes (160 + 16 = 176). seq_rm 1: Z2 (240: sY4 goes, 224), Z1
 *     (288: an X page goes, 224), Z0 (288: the other X page, 224); sZ12
 *     touched. Now sX8 Z2 Z1 Z0 sZ12 = 224.
 *  6. 1..8,9,9: sX8 is held but no X page: hit 0. 201..212,7,7: hit 12. */
START_TEST(test_budget_lru_across_kinds)
{
    llmem_backend *be = mt_cpu();
    int64_t budget = _i == 0 ? 3 * PAGE_B + 2 * SNAP_B : 1 << 20; /* 1: room for everything */
    llmem_memory *h = hybrid(be, budget, 8);
    int32_t x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 9}, y[4] = {101, 102, 103, 104};
    int32_t p[6] = {1, 2, 3, 4, 9, 9};
    int32_t z[14] = {201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 7, 7};
    run_prompt(h, 0, x, 8, 4);
    llmem_memory_stats st = stats(h);
    ck_assert_int_eq(st.snapshots, 2);
    ck_assert_int_eq(st.cached_kv_bytes, 0);
    ck_assert_int_eq(st.prefix_cache_bytes, budget);
    end_seq(h, 0);
    st = stats(h);
    ck_assert_int_eq(st.pages_cached, 2);
    ck_assert_int_eq(st.cached_kv_bytes, 2 * PAGE_B);
    run_prompt(h, 1, y, 4, 4);
    end_seq(h, 1);
    st = stats(h);
    if (_i == 0) {
        ck_assert_int_eq(st.pages_cached, 3);
        ck_assert_int_eq(st.snapshots, 2);
        ck_assert_int_eq(st.snapshot_evictions, 1);
        ck_assert_int_eq(st.prefix_evictions, 0);
        ck_assert_int_eq(st.cached_kv_bytes + st.snapshot_bytes, budget);
    } else {
        ck_assert_int_eq(st.pages_cached, 3);
        ck_assert_int_eq(st.snapshots, 3);
        ck_assert_int_eq(st.snapshot_evictions, 0);
    }
    ck_assert_int_eq(hit_of(h, 0, p, 6), _i == 0 ? 0 : 4);
    ck_assert_int_eq(hit_of(h, 0, x, 10), 8);
    run_prompt(h, 1, z, 12, 64);
    end_seq(h, 1);
    st = stats(h);
    if (_i == 0) {
        ck_assert_int_eq(st.pages_cached, 3);
        ck_assert_int_eq(st.snapshots, 2);
        ck_assert_int_eq(st.snapshot_evictions, 2);
        ck_assert_int_eq(st.prefix_evictions, 3);
        ck_assert_int_eq(st.cached_kv_bytes, 3 * PAGE_B);
        ck_assert_int_eq(st.snapshot_bytes, 2 * SNAP_B);
    }
    ck_assert_int_eq(hit_of(h, 0, x, 10), _i == 0 ? 0 : 8);
    ck_assert_int_eq(hit_of(h, 0, z, 14), 12);
    llmem_memory_destroy(h);
    llmem_backend_close(be);
}
END_TEST

/* A KV cache alone under a budget of 2 pages (128 bytes), with a host
 * tier of 4 pages: A = 1..4 and B = 11..14 end (A0 [1], B0 [2]); C =
 * 21..24 ends: C0 [3] is one page too many, A0 (the oldest) spills to the
 * host. A, B and C each still hit 4: A from the host tier (its page comes
 * back, evicting B0 [2] to the host in turn, since A0 is now the newest
 * once released). */
START_TEST(test_budget_kv_alone)
{
    llmem_backend *be = mt_cpu();
    llmem_kv_cache_params kp = kv_params(2 * PAGE_B, 4 * PAGE_B);
    llmem_memory *m = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_kv_cache_create(be, &kp, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    int32_t a[6] = {1, 2, 3, 4, 0, 0}, b[6] = {11, 12, 13, 14, 0, 0}, c[6] = {21, 22, 23, 24, 0, 0};
    run_prompt(m, 0, a, 4, 64);
    end_seq(m, 0);
    run_prompt(m, 0, b, 4, 64);
    end_seq(m, 0);
    llmem_memory_stats st = stats(m);
    ck_assert_int_eq(st.pages_cached, 2);
    ck_assert_int_eq(st.host_tier_pages, 0);
    run_prompt(m, 0, c, 4, 64);
    end_seq(m, 0);
    st = stats(m);
    ck_assert_int_eq(st.pages_cached, 2);
    ck_assert_int_eq(st.cached_kv_bytes, 2 * PAGE_B);
    ck_assert_int_eq(st.prefix_evictions, 1);
    ck_assert_int_eq(st.host_tier_pages, 1); /* A0 */
    ck_assert_int_eq(st.snapshot_evictions, 0);
    ck_assert_int_eq(hit_of(m, 0, a, 6), 4);
    st = stats(m);
    ck_assert_int_eq(st.host_tier_hits, 1);
    ck_assert_int_eq(st.pages_cached, 2);     /* A0 back, B0 out */
    ck_assert_int_eq(st.host_tier_pages, 1);  /* B0 */
    ck_assert_int_eq(st.prefix_evictions, 2);
    ck_assert_int_eq(hit_of(m, 0, b, 6), 4);  /* from the host again */
    ck_assert_int_eq(hit_of(m, 0, c, 6), 4);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* A recurrent memory alone: 8 snapshot slots but a budget of 2 snapshots
 * (32 bytes). X = 1..12 in ubatches of 4 publishes sX4 [1], sX8 [2] and
 * sX12 [3]; the third evicts sX4. n_snapshots -1 sizes the slots from the
 * budget: floor(40 / 16) = 2 snapshot slots, so bytes_device = 16 * (2
 * sequences * (2 + 0 checkpoints) + 2) = 96; a budget of 1 GiB gives the
 * documented cap of 4096 slots. */
START_TEST(test_budget_recurrent_alone)
{
    llmem_backend *be = mt_cpu();
    llmem_recurrent_params rp = rs_params(8, 2 * SNAP_B);
    llmem_memory *m = mt_rs_create(be, &rp);
    int32_t x[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    run_prompt(m, 0, x, 12, 4);
    llmem_memory_stats st = stats(m);
    ck_assert_int_eq(st.snapshots, 2);
    ck_assert_int_eq(st.snapshot_bytes, 2 * SNAP_B);
    ck_assert_int_eq(st.snapshot_evictions, 1);
    ck_assert_int_eq(st.prefix_cache_bytes, 2 * SNAP_B);
    llmem_memory_destroy(m);
    rp = rs_params(-1, 40);
    m = mt_rs_create(be, &rp);
    st = stats(m);
    ck_assert_int_eq(st.bytes_device, 16 * (2 * 2 + 2));
    llmem_memory_destroy(m);
    /* at most 4096 slots from a budget (recurrent.h), however large */
    rp = rs_params(-1, (int64_t)1 << 30);
    m = mt_rs_create(be, &rp);
    ck_assert_int_eq(stats(m).bytes_device, 16 * (2 * 2 + 4096));
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* Budgets that cannot work are refused at creation with a reason, and
 * what was handed in is freed (the sanitizer build checks no leak). */
START_TEST(test_budget_errors)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = (llmem_memory *)&m, *ch[2] = {NULL, NULL};
    char err[256] = "";
    llmem_kv_cache_params kp = kv_params(PAGE_B - 1, 0); /* below one page */
    ck_assert_int_eq(llmem_kv_cache_create(be, &kp, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(err, "cannot hold one cached page"));
    kp = kv_params(-1, 0);
    ck_assert_int_eq(llmem_kv_cache_create(be, &kp, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "prefix_cache_bytes"));
    kp = kv_params(PAGE_B - 1, 0); /* without a prefix cache the budget means nothing */
    kp.no_prefix_cache = true;
    ck_assert_int_eq(llmem_kv_cache_create(be, &kp, &m, err, sizeof err), LLMEM_OK);
    llmem_memory_destroy(m);
    llmem_recurrent_params rp = rs_params(4, SNAP_B - 1); /* below one snapshot */
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "cannot hold one snapshot"));
    rp = rs_params(-1, 0); /* sized from a budget there is not */
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "n_snapshots -1"));
    rp = rs_params(-2, 1 << 10);
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &m, err, sizeof err), LLMEM_E_INVALID);
    rp = rs_params(4, -5);
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &m, err, sizeof err), LLMEM_E_INVALID);
    /* a hybrid: one page and one snapshot must fit together (80 bytes) */
    kp = kv_params(PAGE_B + SNAP_B - 1, 0);
    rp = rs_params(4, 0);
    ck_assert_int_eq(llmem_kv_cache_create(be, &kp, &ch[0], err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &ch[1], err, sizeof err), LLMEM_OK);
    const int32_t map[2] = {0, 1};
    m = (llmem_memory *)&m;
    ck_assert_int_eq(llmem_hybrid_create(ch, 2, map, 2, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(err, "what one hit needs"));
    /* exactly enough works; the budget is shared (reported once) */
    kp = kv_params(PAGE_B + SNAP_B, 0);
    ck_assert_int_eq(llmem_kv_cache_create(be, &kp, &ch[0], err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &ch[1], err, sizeof err), LLMEM_OK);
    ck_assert_msg(llmem_hybrid_create(ch, 2, map, 2, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(stats(m).prefix_cache_bytes, PAGE_B + SNAP_B);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("prefix_budget");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_budget_lru_across_kinds, 0, 2);
    tcase_add_test(tc, test_budget_kv_alone);
    tcase_add_test(tc, test_budget_recurrent_alone);
    tcase_add_test(tc, test_budget_errors);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

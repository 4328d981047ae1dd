// ctest-labels: core
/* Paged KV cache unit tests of what sequences share: copy-on-write of a
 * shared partial page (also when the plan that would copy it is released
 * unapplied), the prefix cache (publish at commit, token-verified hits,
 * LRU eviction) and state I/O round trips. Page counts and slot values are
 * derived by hand in each test, never from the cache; slot values are the
 * token ids the test's forward pass (write_tokens) stored. */
#include "support/run.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/kv_test.h"
#include "support/memtest.h"

/* A KV cache of 4-token pages whose sequence 0 holds tokens 100..105 at
 * positions 0..5 (page 0 full, page 1 holds 2), shared whole with
 * sequence 1 by seq_cp: the start of the copy-on-write checks. b holds
 * that batch after. */
static llmem_memory *cow_shared(llmem_backend *be, llmem_batch_buf *b)
{
    llmem_memory *m = mt_kv(be, 4, 16, 2, false, false);
    mt_add(b, 0, 0, 6, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    return m;
}

/* seq_cp shares full pages; a shared partial page is copied before written. */
START_TEST(test_cow_partial_page)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = cow_shared(be, b);
    int32_t a[4], c[4];
    llmem_kv_cache_page_table(m, 0, a, 4);
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 1, c, 4), 2);
    ck_assert_int_eq(a[0], c[0]);
    ck_assert_int_eq(a[1], c[1]);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, 2);
    /* seq 1 appends: its partial page must be copied first */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 6, 1, 200, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    llmem_kv_cache_page_table(m, 1, c, 4);
    ck_assert_int_eq(c[0], a[0]);
    ck_assert_int_ne(c[1], a[1]);
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, 3);
    ck_assert_int_eq(st.cow_copies, 1);
    /* the copy carries the shared slots; the source is untouched */
    for (int32_t i = 0; i < 6; i++) {
        ck_assert_float_eq(slot_value(m, 1, i), (float)(100 + i));
        ck_assert_float_eq(slot_value(m, 0, i), (float)(100 + i));
    }
    ck_assert_float_eq(slot_value(m, 1, 6), 200.0f);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 6);
    /* seq 0 appends too: after seq 1 left, its page is private again: no copy */
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 6, 1, 300, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.cow_copies, 1);
    ck_assert_float_eq(slot_value(m, 0, 6), 300.0f);
    ck_assert_float_eq(slot_value(m, 1, 6), 200.0f);
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

/* A plan that copies a shared partial page on write, released before
 * apply, changes nothing: the page table names the shared page again,
 * the copy's page is free, the invariant checker (device rows equal the
 * page tables) passes with the plan in flight and after it. The page ids
 * expected are the ones the table held before the plan. */
START_TEST(test_cow_released_before_apply)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = cow_shared(be, b);
    int32_t a[4], c[4];
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 1, a, 4), 2);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    int32_t free0 = st.pages_free;
    for (int32_t round = 0; round < 2; round++) {
        llmem_batch_buf_clear(b);
        mt_add(b, 1, 6, 1, 200, true);
        llmem_plan *plan = NULL;
        char err[256] = "";
        ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan,
                                           err, sizeof err),
                         LLMEM_OK);
        /* the copy's page is taken; the table shows the copy only once applied */
        llmem_memory_get_stats(m, &st);
        ck_assert_int_eq(st.pages_free, free0 - 1);
        ck_assert_int_eq(llmem_kv_cache_page_table(m, 1, c, 4), 2);
        ck_assert_int_eq(c[0], a[0]);
        ck_assert_int_eq(c[1], a[1]);
        mt_assert_check(m);
        if (round == 1) { /* applied: the table names the copy */
            const llmem_ubatch *ub;
            ck_assert_int_eq(llmem_memory_apply(m, plan, 0, &ub), LLMEM_OK);
            ck_assert_int_eq(llmem_kv_cache_page_table(m, 1, c, 4), 2);
            ck_assert_int_eq(c[0], a[0]);
            ck_assert_int_ne(c[1], a[1]);
            write_tokens(m, ub, NULL);
            ck_assert_int_eq(llmem_memory_commit(m, plan, 0), LLMEM_OK);
        }
        llmem_memory_release(m, plan);
        mt_assert_check(m);
        llmem_memory_get_stats(m, &st);
        ck_assert_int_eq(llmem_kv_cache_page_table(m, 1, c, 4), 2);
        if (round == 0) { /* released: as before the plan */
            ck_assert_int_eq(st.pages_free, free0);
            ck_assert_int_eq(c[1], a[1]);
            ck_assert_int_eq(st.cow_copies, 0);
            ck_assert_int_eq(llmem_memory_seq_len(m, 1), 6);
        } else {
            ck_assert_int_eq(st.pages_free, free0 - 1);
            ck_assert_int_ne(c[1], a[1]);
            ck_assert_int_eq(st.cow_copies, 1);
            for (int32_t i = 0; i < 6; i++)
                ck_assert_float_eq(slot_value(m, 1, i), (float)(100 + i));
            ck_assert_float_eq(slot_value(m, 1, 6), 200.0f);
        }
    }
    mt_free(m, b, be);
}
END_TEST

static llmem_status plan_cached(llmem_memory *m, const llmem_batch *b, int32_t seq, int32_t *n_cached)
{
    llmem_plan *plan = NULL;
    char err[256];
    llmem_status st = llmem_memory_plan(m, b, LLMEM_SPLIT_AUTO, 512, &plan, err, sizeof err);
    if (st != LLMEM_OK)
        return st;
    *n_cached = llmem_plan_n_cached(plan, seq);
    for (int32_t i = 0; i < llmem_plan_n_ubatch(plan); i++) {
        const llmem_ubatch *ub;
        ck_assert_int_eq(llmem_memory_apply(m, plan, i, &ub), LLMEM_OK);
        write_tokens(m, ub, NULL);
        ck_assert_int_eq(llmem_memory_commit(m, plan, i), LLMEM_OK);
    }
    llmem_memory_release(m, plan);
    return LLMEM_OK;
}

/* Prefix cache: pages published at commit, verified by token ids, hits
 * counted, shared without copying; LRU eviction under pressure. */
START_TEST(test_prefix_cache)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 4, 8, 4, true, false);
    int32_t cached = -1;
    mt_add(b, 0, 0, 10, 0, true); /* tokens 0..9: 2 full pages */
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 0, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 0);
    /* the same prompt in seq 1: 2 pages (8 tokens) need no compute */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 10, 0, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 1, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 8);
    int32_t a[4], c[4];
    llmem_kv_cache_page_table(m, 0, a, 4);
    llmem_kv_cache_page_table(m, 1, c, 4);
    ck_assert_int_eq(a[0], c[0]);
    ck_assert_int_eq(a[1], c[1]);
    ck_assert_int_ne(a[2], c[2]);
    for (int32_t i = 0; i < 10; i++)
        ck_assert_float_eq(slot_value(m, 1, i), (float)i);
    /* a prompt that differs in token 5: only page 0 matches */
    llmem_batch_buf_clear(b);
    for (int32_t i = 0; i < 10; i++) {
        int32_t s = 2;
        llmem_batch_buf_add(b, i == 5 ? 99 : i, i, &s, 1, i == 9);
    }
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 2, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 4);
    /* exactly 8 tokens: the last one is always computed, so only 1 page */
    llmem_batch_buf_clear(b);
    mt_add(b, 3, 0, 8, 0, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 3, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 4);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.prefix_hit_tokens, 16);
    mt_assert_check(m);

    /* eviction: free everything, then fill the pool with new prompts; the
     * least recently used cached pages go first */
    ck_assert_int_eq(llmem_memory_seq_rm(m, -1, -1, -1), LLMEM_OK);
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, 0);
    ck_assert_int_gt(st.pages_cached, 0);
    int32_t n_cached_pages = (int32_t)st.pages_cached;
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 0, 4 * 8, 1000, true); /* needs all 8 pages */
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 0, &cached), LLMEM_OK);
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.prefix_evictions, n_cached_pages);
    ck_assert_int_eq(st.pages_free, 0);
    mt_assert_check(m);
    /* nothing of the old prompt is found any more */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 10, 0, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 1, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 0);
    llmem_memory_destroy(m);

    /* prefix cache off: never a hit */
    m = mt_kv(be, 4, 8, 2, false, false);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 0, 10, 0, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 0, &cached), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 10, 0, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 1, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 0);
    mt_free(m, b, be);
}
END_TEST

/* LRU order: of two cached prompts, the one used longer ago is evicted. */
START_TEST(test_prefix_lru_order)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 4, 6, 3, true, false);
    int32_t cached;
    mt_add(b, 0, 0, 5, 100, true); /* prompt A: 1 full page */
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 0, &cached), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 5, 200, true); /* prompt B */
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 1, &cached), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK); /* A cached first */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, -1, -1), LLMEM_OK); /* then B */
    /* 2 cached + 4 free; a 20-token prompt needs 5 pages: evicts exactly A */
    llmem_batch_buf_clear(b);
    mt_add(b, 2, 0, 20, 300, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 2, &cached), LLMEM_OK);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.prefix_evictions, 1);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 2, -1, -1), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 0, 5, 200, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 0, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 4); /* B survived */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 5, 100, true);
    ck_assert_int_eq(plan_cached(m, llmem_batch_buf_get(b), 1, &cached), LLMEM_OK);
    ck_assert_int_eq(cached, 0); /* A was evicted */
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_state_roundtrip)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 8, 2, true, false);
    llmem_batch_buf *b = mt_batch_new();
    mt_add(b, 0, 0, 7, 40, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    size_t sz;
    ck_assert_int_eq(llmem_memory_state_size(m, 0, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    size_t w = 0;
    ck_assert_int_eq(llmem_memory_state_write(m, 0, buf, sz - 1, &w), LLMEM_E_NO_SPACE);
    ck_assert_int_eq(llmem_memory_state_write(m, 0, buf, sz, &w), LLMEM_OK);
    ck_assert_uint_eq(w, sz);
    /* load into seq 1 (page size independent format) */
    char err[256];
    ck_assert_int_eq(llmem_memory_state_read(m, 1, buf, sz, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(m, 1), 7);
    for (int32_t i = 0; i < 7; i++)
        ck_assert_float_eq(slot_value(m, 1, i), (float)(40 + i));
    mt_assert_check(m);
    /* every flipped byte and every truncation is refused; nothing changes */
    mt_snap before, after;
    mt_snapshot(m, &before);
    for (size_t i = 0; i < sz; i += 3) {
        buf[i] ^= 0x5a;
        ck_assert_int_ne(llmem_memory_state_read(m, 1, buf, sz, err, sizeof err), LLMEM_OK);
        buf[i] ^= 0x5a;
    }
    for (size_t n = 0; n < sz; n += 5)
        ck_assert_int_ne(llmem_memory_state_read(m, 1, buf, n, err, sizeof err), LLMEM_OK);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    for (int32_t i = 0; i < 7; i++)
        ck_assert_float_eq(slot_value(m, 1, i), (float)(40 + i));
    /* a stream of one sequence cannot be read as "all" */
    ck_assert_int_eq(llmem_memory_state_read(m, -1, buf, sz, err, sizeof err), LLMEM_E_INVALID);
    free(buf);
    /* whole-memory round trip into a cache of another page size */
    ck_assert_int_eq(llmem_memory_state_size(m, -1, &sz), LLMEM_OK);
    buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(m, -1, buf, sz, NULL), LLMEM_OK);
    llmem_memory *m2 = mt_kv(be, 3, 8, 2, true, false);
    ck_assert_int_eq(llmem_memory_state_read(m2, -1, buf, sz, err, sizeof err), LLMEM_OK);
    for (int32_t q = 0; q < 2; q++) {
        ck_assert_int_eq(llmem_memory_seq_len(m2, q), 7);
        for (int32_t i = 0; i < 7; i++)
            ck_assert_float_eq(slot_value(m2, q, i), (float)(40 + i));
    }
    /* too small a cache: NO_SPACE, unchanged */
    llmem_memory *m3 = mt_kv(be, 4, 3, 2, true, false);
    ck_assert_int_eq(llmem_memory_state_read(m3, -1, buf, sz, err, sizeof err), LLMEM_E_NO_SPACE);
    ck_assert_int_eq(llmem_memory_seq_len(m3, 0), 0);
    mt_assert_check(m2);
    mt_assert_check(m3);
    free(buf);
    llmem_memory_destroy(m3);
    llmem_memory_destroy(m2);
    mt_free(m, b, be);
}
END_TEST

/* Decode steps append token ids through a per-sequence stage that reaches
 * the sequence's array once every few tokens (memory/tok_stage.h): seq_cp,
 * state I/O, seq_rm (a suffix, and a context shift's whole first page),
 * seq_tokens, clear and the pages decode steps publish must all see every
 * id in order, whatever the stage holds. Pages of 1 (every step publishes
 * the id it appends) and of 16. The reference is the list of ids the test
 * submitted; the prefix hit of a prompt of those ids is its full pages. */
START_TEST(test_decode_tokens_read_back)
{
    const int32_t ps = _i == 0 ? 1 : 16;
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, ps, 1024, 4, true, false);
    llmem_batch_buf *b = mt_batch(128, 2);
    /* every sequence decodes; 0 is read, 1 and 2 are overwritten by its
     * seq_cp and state read while they hold ids of their own */
    int32_t ref[3][128], n[3];
    mt_decode_read_back(m, b, ref, n);
    /* a prompt of sequence 0's ids and one more reuses its full pages */
    llmem_batch_buf_clear(b);
    int32_t s3 = 3;
    for (int32_t j = 0; j <= n[0]; j++)
        ck_assert_int_eq(llmem_batch_buf_add(b, j < n[0] ? ref[0][j] : 1, j, &s3, 1, j == n[0]),
                         LLMEM_OK);
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, &info), LLMEM_OK);
    ck_assert_int_eq(info.n_tokens_cached, n[0] / ps * ps);
    /* back one token (a suffix), then on */
    mt_rm_last_and_on(m, b, ref[0], &n[0], 9000);
    /* a context shift drops the first page: the ids after it stay */
    mt_decode_steps(m, b, ref[0], &n[0], 9500, 2);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 0, ps), LLMEM_OK);
    mt_expect_tokens(m, 0, ref[0] + ps, n[0] - ps);
    mt_assert_check(m);
    if (ps == 1) { /* and a page in the middle of the staged ids (position j is ref[0][j]) */
        mt_decode_steps(m, b, ref[0], &n[0], 9600, 3);
        ck_assert_int_eq(llmem_memory_seq_rm(m, 0, n[0] - 2, n[0] - 1), LLMEM_OK);
        ref[0][n[0] - 2] = ref[0][n[0] - 1];
        n[0]--;
        mt_expect_tokens(m, 0, ref[0] + 1, n[0] - 1);
        mt_assert_check(m);
    }
    mt_clear_staged_then_prompt(m, b, n[1]);
    mt_free(m, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_sharing");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_cow_partial_page);
    tcase_add_test(tc, test_cow_released_before_apply);
    tcase_add_test(tc, test_prefix_cache);
    tcase_add_test(tc, test_prefix_lru_order);
    tcase_add_test(tc, test_state_roundtrip);
    tcase_add_loop_test(tc, test_decode_tokens_read_back, 0, 2);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

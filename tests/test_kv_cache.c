// ctest-labels: core
/* Paged KV cache unit tests: the page-accounting bugs this field keeps
 * shipping, sequence isolation, K-shift, poison, batch validation, create
 * errors and page rows. Copy-on-write, the prefix cache and state I/O are
 * tests/test_kv_sharing.c. Expected page counts are derived by hand from
 * page arithmetic in each test, never from the cache. */
#include "support/run.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/memory_impl.h" /* llmem_pages_for, the one count */
#include "support/kv_test.h"
#include "support/memtest.h"


/* A multi-token append crossing two page boundaries reserves both pages,
 * and plan fails cleanly when only one is free. */
START_TEST(test_append_crosses_two_pages)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    /* page 4; seq 0 holds 3 tokens (1 page); 6 more -> 9 tokens = 3 pages: 2 new */
    llmem_memory *m = mt_kv(be, 4, 3, 2, false, false);
    mt_add(b, 0, 0, 3, 10, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(n_pages_of(m, 0), 1);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 3, 6, 20, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(n_pages_of(m, 0), 3);
    mt_assert_check(m);
    llmem_memory_destroy(m);

    /* same with only 2 pages in the pool: one free page is not enough */
    m = mt_kv(be, 4, 2, 2, false, false);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 0, 3, 10, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    mt_snap before, after;
    mt_snapshot(m, &before);
    int32_t pt_before[4], pt_after[4];
    llmem_kv_cache_page_table(m, 0, pt_before, 4);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 3, 6, 20, true);
    llmem_plan *plan = NULL;
    char err[256] = "";
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan, err,
                                       sizeof err),
                     LLMEM_E_NO_SPACE);
    ck_assert_ptr_null(plan);
    ck_assert_ptr_nonnull(strstr(err, "needs 2 pages"));
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 0, pt_after, 4), 1);
    ck_assert_int_eq(pt_after[0], pt_before[0]);
    mt_assert_check(m);
    /* 5 more tokens (8 total) need exactly one page: fits */
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 3, 5, 20, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(n_pages_of(m, 0), 2);
    mt_free(m, b, be);
}
END_TEST

/* Freeing a sequence whose last page is partial returns every page. */
START_TEST(test_free_partial_last_page)
{
    static const int32_t sizes[3] = {1, 16, 64};
    int32_t ps = sizes[_i];
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    int32_t n_tok = 2 * ps + (ps > 1 ? ps / 2 + 1 : 0) + 1; /* partial last page for ps > 1 */
    int32_t want = 0; /* brute force: tokens t that start a page (t % ps == 0) */
    for (int32_t t = 0; t < n_tok; t++)
        want += t % ps == 0;
    llmem_memory *m = mt_kv(be, ps, want + 2, 3, true, false);
    mt_add(b, 1, 0, n_tok, 0, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 7, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(n_pages_of(m, 1), want);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, -1, -1), LLMEM_OK);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, 0);
    /* full pages stay reusable in the prefix cache, the partial one is free */
    ck_assert_int_eq(st.pages_cached, n_tok / ps);
    ck_assert_int_eq(st.pages_free + st.pages_cached, want + 2);
    ck_assert_int_eq(n_pages_of(m, 1), 0);
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

/* An empty sequence has last-page length 0 and nothing underflows. */
START_TEST(test_empty_sequence)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 16, 4, 2, true, false);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), -1);
    ck_assert_int_eq(llmem_memory_seq_pos_min(m, 0), -1);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 0);
    ck_assert_int_eq(n_pages_of(m, 0), 0);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 0, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 5, 9), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, 0, -1, 3), LLMEM_OK);
    ck_assert_int_eq(llmem_pages_for(0, 1, 16), 1);
    ck_assert_int_eq(llmem_pages_for(0, 16, 16), 1);
    ck_assert_int_eq(llmem_pages_for(0, 17, 16), 2);
    ck_assert_int_eq(llmem_pages_for(16, 1, 16), 1);
    ck_assert_int_eq(llmem_pages_for(15, 1, 16), 0);
    ck_assert_int_eq(llmem_pages_for(0, 0, 16), 0);
    size_t sz = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, 0, &sz), LLMEM_OK);
    ck_assert_uint_gt(sz, 0);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_free, 4);
    mt_assert_check(m);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* Tokens of one sequence never reserve or touch another's pages. */
typedef struct touch_ctx {
    int32_t other_pages[16];
    int32_t n_other, ps;
    int32_t n_stores;
} touch_ctx;

static void check_no_touch(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    touch_ctx *t = c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    ck_assert_int_eq(v.kind, LLMEM_VIEW_KV);
    for (int32_t j = 0; j < llmem_view_kv(&v)->store_slot.n; j++) {
        int32_t page = llmem_view_kv(&v)->store_slot.host[j] / t->ps;
        for (int32_t k = 0; k < t->n_other; k++)
            ck_assert_int_ne(page, t->other_pages[k]);
        t->n_stores++;
    }
    /* the cache shows persistent page-table rows (llmem_kv_view.page_off):
     * each stream's row lies inside the table and lists only this
     * ubatch's sequence's pages, none of the other sequence's */
    ck_assert_int_eq(llmem_view_kv(&v)->page_off.n, llmem_view_kv(&v)->seq_len.n);
    for (int32_t s = 0; s < llmem_view_kv(&v)->seq_len.n; s++) {
        int32_t np = llmem_pages_for(0, llmem_view_kv(&v)->seq_len.host[s], t->ps);
        int32_t row = llmem_view_kv(&v)->page_off.host[s];
        ck_assert_int_le(np, llmem_view_kv(&v)->max_pages);
        ck_assert(row >= 0 && row + np <= llmem_view_kv(&v)->page_table.n);
        for (int32_t k = 0; k < np; k++)
            for (int32_t o = 0; o < t->n_other; o++)
                ck_assert_int_ne(llmem_view_kv(&v)->page_table.host[row + k], t->other_pages[o]);
    }
}

START_TEST(test_no_touch_other_sequence)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 4, 16, 3, false, false);
    mt_add(b, 0, 0, 6, 0, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    touch_ctx t = {.ps = 4};
    t.n_other = llmem_kv_cache_page_table(m, 0, t.other_pages, 16);
    ck_assert_int_eq(t.n_other, 2);
    /* a batch for seqs 1 and 2 must store only outside seq 0's pages */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 5, 50, true);
    mt_add(b, 2, 0, 3, 70, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 3, check_no_touch, &t, NULL), LLMEM_OK);
    ck_assert_int_eq(t.n_stores, 8);
    int32_t pt[16];
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 0, pt, 16), 2);
    ck_assert_int_eq(pt[0], t.other_pages[0]);
    ck_assert_int_eq(pt[1], t.other_pages[1]);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 6);
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

/* seq_rm back to any position frees every whole page past it. */
START_TEST(test_seq_rm_frees_pages)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 4, 8, 1, false, false);
    mt_add(b, 0, 0, 17, 0, true); /* 5 pages */
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    const int32_t cut[] = {16, 13, 12, 9, 1, 0};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) {
        ck_assert_int_eq(llmem_memory_seq_rm(m, 0, cut[i], -1), LLMEM_OK);
        ck_assert_int_eq(llmem_memory_seq_len(m, 0), cut[i]);
        ck_assert_int_eq(n_pages_of(m, 0), (cut[i] + 3) / 4);
        llmem_memory_stats st;
        llmem_memory_get_stats(m, &st);
        ck_assert_int_eq(st.pages_free, 8 - (cut[i] + 3) / 4);
        mt_assert_check(m);
    }
    /* a hole in the middle is refused and changes nothing */
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 0, 10, 0, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 2, 5), LLMEM_E_STATE);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 10);
    mt_free(m, b, be);
}
END_TEST

typedef struct shift_ctx {
    int32_t n_shift, delta_sum, calls;
} shift_ctx;

static void record_shift(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    shift_ctx *s = c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    s->calls++;
    s->n_shift += llmem_view_kv(&v)->shift_slot.n;
    for (int32_t j = 0; j < llmem_view_kv(&v)->shift_delta.n; j++)
        s->delta_sum += llmem_view_kv(&v)->shift_delta.host[j];
}

START_TEST(test_seq_add_records_shift)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 4, 8, 2, true, false);
    ck_assert(llmem_memory_can_shift(m));
    mt_add(b, 0, 0, 6, 0, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    /* positions 2..5 move by +10, then 0..1 by +3: 4*10 + 2*3 = 46 */
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, 2, -1, 10), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, 0, 2, 3), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_pos_min(m, 0), 3);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), 15);
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, 0, -1, -100), LLMEM_E_INVALID);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 16, 5, 50, true);
    shift_ctx s = {0};
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 2, record_shift, &s, NULL), LLMEM_OK);
    ck_assert_int_eq(s.calls, 3);
    ck_assert_int_eq(s.n_shift, 6); /* only in the first ubatch */
    ck_assert_int_eq(s.delta_sum, 46);
    /* committed: no shift left; seq_div halves positions */
    shift_ctx s2 = {0};
    ck_assert_int_eq(llmem_memory_seq_div(m, 0, 0, -1, 2), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), 10);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 11, 1, 60, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, record_shift, &s2, NULL), LLMEM_OK);
    ck_assert_int_eq(s2.n_shift, 11); /* every old slot whose position changed (pos 0 -> 0 excluded? none is 0) */
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_poison)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 2, 4, 1, false, true);
    mt_add(b, 0, 0, 3, 0, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    int32_t pt[2];
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 0, pt, 2), 2);
    /* slot 3 (second slot of page 1) was never written: NaN */
    llmem_batch_buf_clear(b);
    size_t sz;
    ck_assert_int_eq(llmem_memory_state_size(m, 0, &sz), LLMEM_OK);
    /* read the raw pool through a view of a new plan */
    mt_add(b, 0, 3, 1, 9, true);
    llmem_plan *plan = NULL;
    char err[128];
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_apply(m, plan, 0, NULL), LLMEM_OK);
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(m, 0, &v), LLMEM_OK);
    float f[2];
    ck_assert_int_eq(llmem_buffer_download(llmem_view_kv(&v)->k, (size_t)(pt[1] * 2 + 1) * 8, f, 8), LLMEM_OK);
    ck_assert(isnan(f[0]) && isnan(f[1]));
    ck_assert_int_eq(llmem_buffer_download(llmem_view_kv(&v)->k, (size_t)(pt[1] * 2) * 8, f, 8), LLMEM_OK);
    ck_assert_float_eq(f[0], 2.0f);
    /* free pages are NaN too */
    for (int32_t p = 0; p < 4; p++) {
        if (p == pt[0] || p == pt[1])
            continue;
        ck_assert_int_eq(llmem_buffer_download(llmem_view_kv(&v)->k, (size_t)p * 16, f, 8), LLMEM_OK);
        ck_assert(isnan(f[0]));
    }
    ck_assert_int_eq(llmem_memory_commit(m, plan, 0), LLMEM_OK);
    llmem_memory_release(m, plan);
    /* freeing poisons */
    llmem_buffer *k = llmem_view_kv(&v)->k;
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download(k, (size_t)(pt[0] * 2) * 8, f, 8), LLMEM_OK);
    ck_assert(isnan(f[0]));
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_validation)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 8, 2, true, false);
    llmem_batch_buf *b = mt_batch_new();
    char err[256];
    llmem_plan *plan = NULL;
    mt_snap before, after;
    mt_add(b, 0, 0, 3, 0, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    mt_snapshot(m, &before);
    /* empty batch */
    llmem_batch_buf_clear(b);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    /* gap in positions */
    mt_add(b, 0, 4, 1, 0, true);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "expected 3"));
    /* sequence id out of range, negative */
    llmem_batch_buf_clear(b);
    mt_add(b, 2, 0, 1, 0, true);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "out of range"));
    llmem_batch_buf_clear(b);
    mt_add(b, -1, 0, 1, 0, true);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    /* a token listed twice in one sequence */
    llmem_batch_buf_clear(b);
    int32_t twice[2] = {1, 1};
    ck_assert_int_eq(llmem_batch_buf_add(b, 5, 0, twice, 2, true), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "twice"));
    /* same position twice in a sequence */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 1, 0, false);
    mt_add(b, 1, 0, 1, 0, true);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    /* n_ubatch 0 */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 1, 0, true);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 0, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(plan);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    /* a plan in flight blocks a second plan and sequence operations */
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_OK);
    llmem_plan *p2 = NULL;
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &p2, err, sizeof err), LLMEM_E_BUSY);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_E_BUSY);
    ck_assert_int_eq(llmem_memory_commit(m, plan, 0), LLMEM_E_STATE); /* not applied */
    llmem_memory_release(m, plan);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_create_errors)
{
    llmem_backend *be = mt_cpu();
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    llmem_memory *m = (llmem_memory *)0x1;
    char err[256];
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(err, "n_layers"));
    p.n_layers = 1; p.n_kv_heads = 1; p.head_dim = 8; p.n_pages = 4; p.n_seq_max = 1;
    p.page_size = 0;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "page_size"));
    p.page_size = 16;
    p.dtype = LLMEM_DTYPE_I32;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    p.dtype = LLMEM_DTYPE_BF16;
    p.n_pages = INT32_MAX;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    llmem_backend_close(be);
}
END_TEST

/* Page rows (issue 10): during decode, each stream's row lists exactly the
 * sequence's page table (as llmem_kv_cache_page_table reports it), the
 * device copy equals the host copy, and a row keeps its offset between
 * steps but for a logarithmic number of moves as it grows. */
typedef struct rows_ctx {
    int32_t last_row[2], moves[2], steps;
} rows_ctx;

/* The device copy of the whole table equals the host's. */
static void check_table(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    (void)ub;
    (void)c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    const llmem_kv_view *x = llmem_view_kv(&v);
    int32_t *dev = malloc((size_t)x->page_table.n * sizeof *dev);
    ck_assert_ptr_nonnull(dev);
    ck_assert_int_eq(llmem_buffer_download(v.idx, x->page_table.offset, dev,
                                           (size_t)x->page_table.n * sizeof *dev), LLMEM_OK);
    ck_assert_mem_eq(dev, x->page_table.host, (size_t)x->page_table.n * sizeof *dev);
    free(dev);
}

static void check_rows(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    rows_ctx *t = c;
    llmem_view v;
    check_table(mem, ub, NULL);
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    const llmem_kv_view *x = llmem_view_kv(&v);
    ck_assert_int_eq(x->page_off.n, ub->n_seqs);
    for (int32_t s = 0; s < ub->n_seqs; s++) {
        int32_t seq = ub->seq_id[s], pt[256];
        int32_t np = llmem_kv_cache_page_table(mem, seq, pt, 256); /* page size 1 */
        ck_assert_int_eq(np, x->seq_len.host[s]);
        int32_t row = x->page_off.host[s];
        ck_assert(row >= 0 && row + np <= x->page_table.n);
        for (int32_t k = 0; k < np; k++)
            ck_assert_int_eq(x->page_table.host[row + k], pt[k]);
        if (t->steps > 0 && row != t->last_row[seq])
            t->moves[seq]++;
        t->last_row[seq] = row;
    }
}

START_TEST(test_page_rows)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 1, 256, 2, false, false);
    rows_ctx t = {{-1, -1}, {0, 0}, 0};
    int32_t pos[2] = {0, 0};
    for (int32_t step = 0; step < 120; step++, t.steps++) {
        llmem_batch_buf_clear(b);
        for (int32_t q = 0; q < 2; q++, pos[q - 1]++)
            mt_add(b, q, pos[q], 1, 10 + 500 * q + step, true);
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, check_rows, &t, NULL), LLMEM_OK);
        mt_assert_check(m);
        if (step == 60) { /* a cut: regrowth rewrites only the entries past it */
            ck_assert_int_eq(llmem_memory_seq_rm(m, 1, 30, -1), LLMEM_OK);
            pos[1] = 30;
            mt_assert_check(m);
        }
    }
    /* up to 120 entries: classes grow by a quarter, so rows move ~log1.25 times */
    ck_assert_int_le(t.moves[0], 24);
    ck_assert_int_le(t.moves[1], 24);
    mt_free(m, b, be);
}
END_TEST

/* Few changed entries in a long table (2 decode tokens, ~3,000 entries):
 * reserve uploads from the sorted flag list, not a scan of every flag. */
START_TEST(test_page_rows_sparse)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv(be, 1, 4096, 3, false, false);
    for (int32_t q = 0; q < 3; q++) {
        llmem_batch_buf_clear(b);
        mt_add(b, 2 - q, 0, 1000, 7 + q, true); /* seq 0 gets the last row */
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, check_table, 0, 0), LLMEM_OK);
    }
    for (int32_t step = 0; step < 20; step++) {
        llmem_batch_buf_clear(b);
        for (int32_t j = 0; j < 2; j++) /* both orders */
            mt_add(b, (step + j) % 2 ? 0 : 2, 1000 + step, 1, 50 + step + 30 * j, true);
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, check_table, 0, 0), LLMEM_OK);
        mt_assert_check(m);
    }
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), 1019);
    mt_free(m, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_append_crosses_two_pages);
    tcase_add_loop_test(tc, test_free_partial_last_page, 0, 3);
    tcase_add_test(tc, test_empty_sequence);
    tcase_add_test(tc, test_no_touch_other_sequence);
    tcase_add_test(tc, test_seq_rm_frees_pages);
    tcase_add_test(tc, test_seq_add_records_shift);
    tcase_add_test(tc, test_poison);
    tcase_add_test(tc, test_validation);
    tcase_add_test(tc, test_create_errors);
    tcase_add_test(tc, test_page_rows);
    tcase_add_test(tc, test_page_rows_sparse);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

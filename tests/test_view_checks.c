// ctest-labels: core
/* The view checks of the base layer (base/view.c): a ubatch's index tables
 * are checked once and the answer is cached per backend, but a cached
 * answer never survives a change to the tables. Each test changes a table
 * that was accepted (host copy and upload, as a memory does for its next
 * ubatch) into one that breaks a rule of <llmem/ops.h> and expects the op
 * to refuse it, then restores it and expects acceptance again.
 */
#include "support/run.h"
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"
#include "llmem/ops.h"

/* A KV view over 4 pages of 2 slots, 1 KV head of 4 floats, with 3 tokens
 * stored and the index tables laid out in idx as [store_tok | store_slot |
 * page_table | seq_len | tok_kv_len | tok_seq | page_off (unused: dense)]. */
typedef struct fixture {
    llmem_backend *be;
    llmem_buffer *pool_k, *pool_v, *idx, *act;
    int32_t host[3 + 3 + 4 + 1 + 3 + 3 + 1];
    llmem_view view;
    llmem_kv_view kv; /* view.desc */
    llmem_tensor k, q, out;
} fixture;

static void fx_upload(fixture *f)
{
    ck_assert_int_eq(llmem_buffer_upload(f->idx, 0, f->host, sizeof f->host), LLMEM_OK);
}

static llmem_i32_table tab(fixture *f, int32_t at, int32_t n)
{
    llmem_i32_table t = {f->host + at, (size_t)at * 4, n};
    return t;
}

static void fx_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    char err[256];
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &f->be, err, sizeof err), LLMEM_OK);
    size_t pool = 4 * 2 * 1 * 4 * sizeof(float);
    ck_assert_int_eq(llmem_buffer_alloc(f->be, pool, &f->pool_k), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_alloc(f->be, pool, &f->pool_v), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(f->pool_k, 0, pool, 0), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(f->pool_v, 0, pool, 0), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_alloc(f->be, sizeof f->host, &f->idx), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_alloc(f->be, 3 * 3 * 4 * sizeof(float), &f->act), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(f->act, 0, 3 * 3 * 4 * sizeof(float), 0x3f800000u),
                     LLMEM_OK);
    /* one group of 3 tokens in pages 2 and 0: slots 4, 5, 0 */
    const int32_t init[] = {0, 1, 2, /* store_tok */ 4, 5, 0, /* store_slot */
                            2, 0, -1, -1, /* page_table, max_pages 4 */ 3, /* seq_len */
                            1, 2, 3, /* tok_kv_len */ 0, 0, 0, /* tok_seq */ 0 /* page_off */};
    memcpy(f->host, init, sizeof init);
    fx_upload(f);
    llmem_kv_view *kv = &f->kv;
    f->view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, f->idx);
    kv->k = f->pool_k;
    kv->v = f->pool_v;
    kv->dtype = LLMEM_DTYPE_F32;
    kv->n_pages = 4;
    kv->page_size = 2;
    kv->n_kv_heads = 1;
    kv->head_dim = 4;
    kv->max_pages = 4;
    kv->store_tok = tab(f, 0, 3);
    kv->store_slot = tab(f, 3, 3);
    kv->page_table = tab(f, 6, 4);
    kv->seq_len = tab(f, 10, 1);
    kv->tok_kv_len = tab(f, 11, 3);
    kv->tok_seq = tab(f, 14, 3);
    f->k = llmem_tensor_3d(f->act, 0, LLMEM_DTYPE_F32, 3, 1, 4);
    f->q = llmem_tensor_3d(f->act, 12 * sizeof(float), LLMEM_DTYPE_F32, 3, 1, 4);
    f->out = llmem_tensor_3d(f->act, 24 * sizeof(float), LLMEM_DTYPE_F32, 3, 1, 4);
}

static void fx_finish(fixture *f)
{
    llmem_buffer_free(f->act);
    llmem_buffer_free(f->idx);
    llmem_buffer_free(f->pool_k);
    llmem_buffer_free(f->pool_v);
    llmem_backend_close(f->be);
}

START_TEST(test_store_check_follows_uploads)
{
    fixture f;
    fx_init(&f);
    /* accepted twice: the second answer comes from the cache */
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_OK);
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_OK);
    /* two tokens into one slot: the next ubatch's tables, uploaded */
    f.host[5] = 4;
    fx_upload(&f);
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_E_INVALID);
    /* a slot outside the 8 slots of the pools */
    f.host[5] = 8;
    fx_upload(&f);
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_E_INVALID);
    f.host[5] = 0;
    fx_upload(&f);
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_OK);
    /* the same tables against fewer tokens: store_tok 2 is out of range */
    llmem_tensor k2 = llmem_tensor_3d(f.act, 0, LLMEM_DTYPE_F32, 2, 1, 4);
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &k2, &k2), LLMEM_E_INVALID);
    fx_finish(&f);
}
END_TEST

START_TEST(test_attention_check_follows_uploads)
{
    fixture f;
    fx_init(&f);
    ck_assert_int_eq(llmem_op_attention_paged(f.be, &(llmem_attn_params){.scale = 0.5f},
                                              &f.view, &f.q, &f.out),
                     LLMEM_OK);
    /* a page id past n_pages inside seq_len */
    f.host[7] = 4;
    fx_upload(&f);
    ck_assert_int_eq(llmem_op_attention_paged(f.be, &(llmem_attn_params){.scale = 0.5f},
                                              &f.view, &f.q, &f.out),
                     LLMEM_E_INVALID);
    f.host[7] = 0;
    /* a token that sees more keys than its group holds */
    f.host[13] = 4;
    fx_upload(&f);
    ck_assert_int_eq(llmem_op_attention_paged(f.be, &(llmem_attn_params){.scale = 0.5f},
                                              &f.view, &f.q, &f.out),
                     LLMEM_E_INVALID);
    f.host[13] = 3;
    fx_upload(&f);
    ck_assert_int_eq(llmem_op_attention_paged(f.be, &(llmem_attn_params){.scale = 0.5f},
                                              &f.view, &f.q, &f.out),
                     LLMEM_OK);
    /* the same tables with a smaller pool geometry: page 2 no longer exists */
    f.kv.n_pages = 2;
    ck_assert_int_eq(llmem_op_attention_paged(f.be, &(llmem_attn_params){.scale = 0.5f},
                                              &f.view, &f.q, &f.out),
                     LLMEM_E_INVALID);
    fx_finish(&f);
}
END_TEST

START_TEST(test_fresh_index_buffer_is_checked)
{
    /* A new index buffer may reuse a freed one's address; its tables are
     * checked anew (its write generation is new). */
    fixture f;
    fx_init(&f);
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_OK);
    llmem_buffer_free(f.idx);
    f.host[5] = 4; /* duplicate slot */
    ck_assert_int_eq(llmem_buffer_alloc(f.be, sizeof f.host, &f.idx), LLMEM_OK);
    fx_upload(&f);
    f.view.idx = f.idx;
    ck_assert_int_eq(llmem_op_kv_store(f.be, &f.view, &f.k, &f.k), LLMEM_E_INVALID);
    fx_finish(&f);
}
END_TEST

START_TEST(test_vouched_rows_end_with_a_write)
{
    /* A memory vouches for the rows it uploaded (llmem_view_vouch_rows):
     * the attention check then does not re-read them, but only for the
     * exact tables vouched for, only until the next write to the index
     * buffer, and never with LLMEM_VIEW_CHECK=full. The row here holds a
     * bad page id, so whenever the check reads it, it refuses. */
    fixture f;
    fx_init(&f);
    llmem_kv_view *kv = &f.kv;
    kv->page_off = tab(&f, 17, 1);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &f.view, 3), LLMEM_OK);
    f.host[7] = 4; /* page 4 of 4 */
    fx_upload(&f);
    llmem_view_vouch_rows(f.idx, &kv->page_table, 4, 2, &kv->page_off, &kv->seq_len, 1);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &f.view, 3), LLMEM_OK);
    /* rules outside the rows are still checked */
    llmem_kv_view fewer_kv = f.kv;
    fewer_kv.max_pages = 1;
    llmem_view fewer = llmem_view_make(LLMEM_VIEW_KV, &fewer_kv, sizeof fewer_kv, f.idx);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &fewer, 3), LLMEM_E_INVALID);
    /* other tables (an equal copy of page_off) are checked in full */
    int32_t off_copy = 0;
    llmem_kv_view other_kv = f.kv;
    other_kv.page_off.host = &off_copy;
    llmem_view other = llmem_view_make(LLMEM_VIEW_KV, &other_kv, sizeof other_kv, f.idx);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &other, 3), LLMEM_E_INVALID);
    /* another page geometry is checked in full */
    other_kv = f.kv;
    other_kv.page_table.n = 3;
    ck_assert_int_eq(llmem_view_check_attention(f.be, &other, 3), LLMEM_E_INVALID);
    /* a write (same bytes, new generation) ends the vouch */
    fx_upload(&f);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &f.view, 3), LLMEM_E_INVALID);
    /* the full-check mode ignores vouches */
    ck_assert_int_eq(setenv("LLMEM_VIEW_CHECK", "full", 1), 0);
    ck_assert_int_eq(llmem_backend_reload_env(NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_reload_env(f.be), LLMEM_OK); /* read once otherwise */
    llmem_view_vouch_rows(f.idx, &kv->page_table, 4, 2, &kv->page_off, &kv->seq_len, 1);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &f.view, 3), LLMEM_E_INVALID);
    ck_assert_int_eq(unsetenv("LLMEM_VIEW_CHECK"), 0);
    ck_assert_int_eq(llmem_backend_reload_env(f.be), LLMEM_OK);
    /* a good row, vouched for, is accepted */
    f.host[7] = 0;
    fx_upload(&f);
    llmem_view_vouch_rows(f.idx, &kv->page_table, 4, 2, &kv->page_off, &kv->seq_len, 1);
    ck_assert_int_eq(llmem_view_check_attention(f.be, &f.view, 3), LLMEM_OK);
    fx_finish(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("view_checks");
    TCase *tc = tcase_create("view_checks");
    tcase_add_test(tc, test_store_check_follows_uploads);
    tcase_add_test(tc, test_attention_check_follows_uploads);
    tcase_add_test(tc, test_fresh_index_buffer_is_checked);
    tcase_add_test(tc, test_vouched_rows_end_with_a_write);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

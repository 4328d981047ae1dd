// ctest-labels: core
/* Where a KV cache's page rows live (memory/page_rows.h, page_rows_share).
 * On the cpu backend, whose buffers are host memory, the rows are the
 * index buffer's own memory: the views' page table is that buffer's host
 * pointer. With LLMEM_KV_ROW_MIRROR=1 the cache keeps a host copy and
 * uploads the entries it writes, as on a GPU. In both, through prompts, a
 * seq_cp (rows written outside a plan), copy-on-write of a shared partial
 * page, decode steps, a seq_rm and a prompt long enough to move the row
 * table and the index buffer (the tables re-pointed, the rows carried
 * over), each stream's entries read back from
 * the index buffer are the pages the test itself saw the views store that
 * sequence's tokens into (store_slot / page_size), and the invariant
 * checker passes. A refused state read leaves the page tables in their
 * rows. */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "llmem/hybrid.h"
#include "llmem/memory_impl.h"
#include "llmem/recurrent.h"
#include "support/memtest.h"

#define PS 2
#define NSEQ 3
#define MAXP 6000

typedef struct rows_ctx {
    int32_t pages[NSEQ][MAXP]; /* page of each (sequence, page index) the views stored into */
    bool mirror;
    int32_t checked; /* streams compared */
} rows_ctx;

static void on_ubatch(llmem_memory *mem, const llmem_ubatch *ub, void *arg)
{
    rows_ctx *c = arg;
    llmem_view view;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &view), LLMEM_OK);
    const llmem_kv_view *v = llmem_view_kv(&view);
    for (int32_t j = 0; j < v->store_slot.n; j++) {
        int32_t k = v->store_tok.host[j], seq = ub->seq_id[ub->seq[k]];
        int32_t slot = v->store_slot.host[j];
        ck_assert_int_lt(ub->pos[k] / PS, MAXP);
        c->pages[seq][ub->pos[k] / PS] = slot / PS;
    }
    void *host = llmem_buffer_host_ptr(view.idx);
    if (c->mirror)
        ck_assert_ptr_ne(v->page_table.host, host);
    else
        ck_assert_ptr_eq(v->page_table.host, host);
    ck_assert_int_eq(v->page_table.offset, 0);
    for (int32_t s = 0; s < v->seq_len.n; s++) {
        int32_t seq = ub->seq_id[s], np = llmem_pages_for(0, v->seq_len.host[s], PS);
        static int32_t dev[MAXP];
        ck_assert_int_le(np, MAXP);
        ck_assert_int_eq(llmem_buffer_download(view.idx,
                                               v->page_table.offset +
                                                   (size_t)v->page_off.host[s] * sizeof(int32_t),
                                               dev, (size_t)np * sizeof(int32_t)),
                         LLMEM_OK);
        for (int32_t e = 0; e < np; e++)
            ck_assert_msg(dev[e] == c->pages[seq][e], "sequence %d entry %d: %d, stored into %d",
                          seq, e, dev[e], c->pages[seq][e]);
        c->checked++;
    }
}

static void step(llmem_memory *m, llmem_batch_buf *b, rows_ctx *c)
{
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, on_ubatch, c, NULL), LLMEM_OK);
    mt_assert_check(m);
    llmem_batch_buf_clear(b);
}

START_TEST(test_rows_read_back)
{
    static rows_ctx c;
    memset(&c, 0xff, sizeof c.pages);
    c.mirror = _i == 1;
    c.checked = 0;
    if (c.mirror)
        setenv("LLMEM_KV_ROW_MIRROR", "1", 1);
    else
        unsetenv("LLMEM_KV_ROW_MIRROR");
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(16384, 2, &b), LLMEM_OK);
    llmem_memory *m = mt_kv(be, PS, 2 * MAXP, NSEQ, false, false);
    mt_add(b, 0, 0, 5, 100, true);
    mt_add(b, 1, 0, 3, 200, true);
    step(m, b, &c);
    /* seq 2 shares seq 0's pages, the partial last one included */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 2, -1, -1), LLMEM_OK);
    memcpy(c.pages[2], c.pages[0], sizeof c.pages[0]);
    mt_assert_check(m);
    int32_t len[NSEQ] = {5, 3, 5};
    for (int32_t t = 0; t < 6; t++) { /* decode; seq 2's first one copies the shared page */
        for (int32_t s = 0; s < NSEQ; s++) {
            mt_add(b, s, len[s], 1, 300 + 10 * s + t, true);
            len[s]++;
        }
        step(m, b, &c);
    }
    ck_assert_int_ne(c.pages[2][2], c.pages[0][2]);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, 2, -1), LLMEM_OK); /* entries dropped outside a plan */
    len[1] = 2;
    mt_assert_check(m);
    for (int32_t t = 0; t < 3; t++) {
        mt_add(b, 1, len[1], 2, 400 + t, true); /* two tokens: crosses into new pages */
        len[1] += 2;
        mt_add(b, 0, len[0]++, 1, 500 + t, true);
        step(m, b, &c);
    }
    /* 11,000 tokens: seq 1's row outgrows the first table (4,096 + entries),
     * the plan's tables the first index buffer */
    mt_add(b, 1, len[1], 11000, 1000, true);
    len[1] += 11000;
    step(m, b, &c);
    for (int32_t s = 0; s < NSEQ; s++) {
        mt_add(b, s, len[s], 1, 600 + s, true);
        len[s]++;
    }
    step(m, b, &c);
    ck_assert_int_ge(c.checked, 2 + 6 * NSEQ + 3 * 2 + 1 + NSEQ);
    mt_free(m, b, be);
    unsetenv("LLMEM_KV_ROW_MIRROR");
}
END_TEST

/* A KV cache (pages of 1) and a recurrent memory of `width` floats per
 * state, in a hybrid of two sequences. */
static llmem_memory *hybrid_of(llmem_backend *be, int32_t width)
{
    const llmem_state_desc d = {.name = "s", .n_dims = 1, .shape = {width},
                                .dtype = LLMEM_DTYPE_F32};
    const llmem_state_desc *states[1] = {&d};
    const int32_t n_states[1] = {1};
    llmem_recurrent_params rp = {.n_layers = 1, .n_states = n_states, .states = states,
                                 .n_seq_max = 2, .n_ckpt = 1};
    llmem_memory *rs = NULL, *h = NULL, *children[2];
    char err[256] = "";
    ck_assert_msg(llmem_recurrent_create(be, &rp, &rs, err, sizeof err) == LLMEM_OK, "%s", err);
    children[0] = mt_kv(be, 1, 8192, 2, false, false);
    children[1] = rs;
    const int32_t map[2] = {0, 1};
    ck_assert_msg(llmem_hybrid_create(children, 2, map, 2, &h, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    return h;
}

/* A whole-memory state read whose KV part grows the row table, refused
 * afterwards by the recurrent part (other state shape): the memory is as
 * it was, its page tables still their rows (the table moved: they were
 * re-pointed), and it decodes on. */
START_TEST(test_refused_state_read_keeps_tables)
{
    if (_i == 1)
        setenv("LLMEM_KV_ROW_MIRROR", "1", 1);
    else
        unsetenv("LLMEM_KV_ROW_MIRROR");
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(8192, 2, &b), LLMEM_OK);
    llmem_memory *a = hybrid_of(be, 4), *m = hybrid_of(be, 8);
    for (int32_t s = 0; s < 2; s++)
        mt_add(b, s, 0, 3000, 10 + s, true); /* rows of >= 3,000 entries each */
    ck_assert_int_eq(mt_run(a, llmem_batch_buf_get(b), 4096, NULL, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_clear(b);
    size_t size = 0, wrote = 0;
    ck_assert_int_eq(llmem_memory_state_size(a, -1, &size), LLMEM_OK);
    void *buf = malloc(size);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(llmem_memory_state_write(a, -1, buf, size, &wrote), LLMEM_OK);
    for (int32_t s = 0; s < 2; s++)
        mt_add(b, s, 0, 3, 20 + s, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_snap before, after;
    mt_snapshot(m, &before);
    char err[256] = "";
    ck_assert_int_eq(llmem_memory_state_read(m, -1, buf, wrote, err, sizeof err), LLMEM_E_INVALID);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    mt_assert_check(m);
    for (int32_t s = 0; s < 2; s++)
        mt_add(b, s, 3, 1, 30 + s, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    mt_assert_check(m);
    free(buf);
    llmem_memory_destroy(a);
    mt_free(m, b, be);
    unsetenv("LLMEM_KV_ROW_MIRROR");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_rows");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_rows_read_back, 0, 2);
    tcase_add_loop_test(tc, test_refused_state_read_keeps_tables, 0, 2);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

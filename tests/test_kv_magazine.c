// ctest-labels: core
/* Page magazines of the KV cache (memory/kv_internal.h kv_cache.mag): in
 * pages of fewer than 16 tokens a decoding sequence takes up to 16
 * tokens' worth of pages at once and writes their ids into its row ahead
 * of the steps that use them.
 *
 * - Read-ahead (pages of 1 and 4): during each decode step into a new
 *   page, the row entry just past each sequence's table (read back from
 *   the index buffer the views give, so on the device copy with
 *   LLMEM_KV_ROW_MIRROR=1) names the page the next step into a new page
 *   stores that sequence's token into, except on the steps that refill
 *   the magazine; every stored page is also checked against the row, and
 *   the stats count magazine pages as free (used = the pages the tokens
 *   need, every page private here).
 * - Exhaustion: a prompt that needs every free page, magazines included,
 *   fits (the magazines go back to the pool), the next step is refused
 *   with NO_SPACE and changes nothing, and the invariant checker (which
 *   verifies each magazine against its row and counts its pages'
 *   references) passes throughout. */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "llmem/memory_impl.h"
#include "support/memtest.h"

#define NSEQ 4
#define STEPS 40

typedef struct mag_ctx {
    int32_t ps;           /* page size */
    int32_t next[NSEQ];   /* row entry past each table during the last new page, -2 none */
    int32_t stored[NSEQ]; /* slot the last step stored each sequence's token into */
    int32_t hits, steps;  /* decode steps into a new page, and those into the named one */
} mag_ctx;

static int32_t read_entry(const llmem_kv_view *v, llmem_buffer *idx, int32_t s, int32_t e)
{
    int32_t x = -3;
    ck_assert_int_eq(llmem_buffer_download(idx,
                                           v->page_table.offset +
                                               ((size_t)v->page_off.host[s] + (size_t)e) *
                                                   sizeof(int32_t),
                                           &x, sizeof x),
                     LLMEM_OK);
    return x;
}

static void on_ubatch(llmem_memory *mem, const llmem_ubatch *ub, void *arg)
{
    mag_ctx *c = arg;
    llmem_view view;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &view), LLMEM_OK);
    const llmem_kv_view *v = llmem_view_kv(&view);
    int32_t ps = c->ps;
    ck_assert_int_eq(v->page_size, ps);
    for (int32_t j = 0; j < v->store_slot.n; j++) {
        int32_t k = v->store_tok.host[j], seq = ub->seq_id[ub->seq[k]];
        c->stored[seq] = v->store_slot.host[j];
    }
    for (int32_t s = 0; s < v->seq_len.n; s++) {
        int32_t seq = ub->seq_id[s], len = v->seq_len.host[s];
        /* the page stored into is the table's last entry */
        ck_assert_int_eq(read_entry(v, view.idx, s, (len - 1) / ps), c->stored[seq] / ps);
        if (ub->n_tokens != NSEQ || (len - 1) % ps != 0)
            continue; /* a prompt, or a token into a page the table held */
        c->hits += c->next[seq] == c->stored[seq] / ps;
        c->steps++;
        /* the next new page, if it comes from the magazine */
        c->next[seq] = read_entry(v, view.idx, s, (len + ps - 1) / ps);
    }
}

/* Runs b's tokens through m (ubatches of n_ubatch, fn after each apply),
 * expects `want`, empties b and runs the invariant checker. */
static void step(llmem_memory *m, llmem_batch_buf *b, int32_t n_ubatch, mt_ubatch_fn fn,
                 void *ctx, llmem_status want)
{
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), n_ubatch, fn, ctx, NULL), want);
    llmem_batch_buf_clear(b);
    mt_assert_check(m);
}

/* b's tokens are refused for want of pages, and m holds what it held. */
static void refused(llmem_memory *m, llmem_batch_buf *b)
{
    mt_snap before, after;
    mt_snapshot(m, &before);
    step(m, b, 512, NULL, NULL, LLMEM_E_NO_SPACE);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
}

/* _i: 0 pages of 1, 1 the same with the host mirror and uploads (as on a
 * GPU), 2 pages of 4 (magazines of 4 pages: tokens into a page the table
 * holds in between must not give the magazine back) */
START_TEST(test_magazine_read_ahead)
{
    int32_t ps = _i == 2 ? 4 : 1, cap = 16 / ps;
    if (_i == 1)
        setenv("LLMEM_KV_ROW_MIRROR", "1", 1);
    else
        unsetenv("LLMEM_KV_ROW_MIRROR");
    unsetenv("LLMEM_KV_MAGAZINE");
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch(8192, 1);
    llmem_memory *m = mt_kv(be, ps, 16384, NSEQ, false, false);
    static mag_ctx c;
    memset(&c, 0, sizeof c);
    c.ps = ps;
    int32_t len[NSEQ];
    for (int32_t s = 0; s < NSEQ; s++) { /* rows of ~2,000 entries: room for whole magazines */
        mt_add(b, s, 0, 2000 + 7 * s, 100 * (s + 1), true);
        len[s] = 2000 + 7 * s;
        c.next[s] = -2;
    }
    step(m, b, 8192, on_ubatch, &c, LLMEM_OK);
    for (int32_t t = 0; t < STEPS; t++) {
        for (int32_t s = 0; s < NSEQ; s++)
            mt_add(b, s, len[s]++, 1, 10000 + 100 * s + t, true);
        step(m, b, 512, on_ubatch, &c, LLMEM_OK);
        llmem_memory_stats st;
        llmem_memory_get_stats(m, &st);
        int64_t held = 0;
        for (int32_t s = 0; s < NSEQ; s++)
            held += (len[s] + ps - 1) / ps;
        ck_assert_int_eq(st.pages_used, held); /* private pages; magazines count as free */
        ck_assert_int_eq(st.pages_free, st.pages_total - held);
    }
    ck_assert_int_ge(c.steps, STEPS / ps * NSEQ);
    /* every step into a new page but the refills (one in cap, and the
     * first and one after a row moves, a sequence) took the page its row
     * already named */
    ck_assert_msg(c.hits >= c.steps * (cap - 1) / cap - 2 * NSEQ,
                  "%d of %d steps took the named page", c.hits, c.steps);
    mt_free(m, b, be);
    unsetenv("LLMEM_KV_ROW_MIRROR");
}
END_TEST

/* Pages of 1, 96 pages (mag_floor 6), NSEQ + 1 sequences: after one
 * decode step the magazines hold most free pages; a prompt needing every
 * obtainable page must still fit. */
START_TEST(test_magazine_gives_back)
{
    unsetenv("LLMEM_KV_ROW_MIRROR");
    unsetenv("LLMEM_KV_MAGAZINE");
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch(512, 1);
    llmem_memory *m = mt_kv(be, 1, 96, NSEQ + 1, _i == 1, false);
    int32_t len[NSEQ];
    for (int32_t s = 0; s < NSEQ; s++) {
        mt_add(b, s, 0, 4, 10 * (s + 1), true);
        len[s] = 4;
    }
    step(m, b, 512, NULL, NULL, LLMEM_OK);
    for (int32_t t = 0; t < 2; t++) {
        for (int32_t s = 0; s < NSEQ; s++)
            mt_add(b, s, len[s]++, 1, 500 + 10 * s + t, true);
        step(m, b, 512, NULL, NULL, LLMEM_OK);
    }
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, 4 * NSEQ + 2 * NSEQ);
    int32_t rest = (int32_t)(st.pages_free + st.pages_cached);
    ck_assert_int_eq(rest, 96 - 6 * NSEQ);
    /* one more page than obtainable: refused, nothing changed */
    mt_add(b, NSEQ, 0, rest + 1, 900, true);
    refused(m, b);
    /* exactly every obtainable page: fits */
    mt_add(b, NSEQ, 0, rest, 900, true);
    step(m, b, 512, NULL, NULL, LLMEM_OK);
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_free + st.pages_cached, 0);
    /* a decode step now: no page left, refused, nothing changed */
    for (int32_t s = 0; s < NSEQ; s++)
        mt_add(b, s, len[s], 1, 700 + s, true);
    refused(m, b);
    /* the prompt's sequence gone, decoding goes on */
    ck_assert_int_eq(llmem_memory_seq_rm(m, NSEQ, -1, -1), LLMEM_OK);
    for (int32_t s = 0; s < NSEQ; s++)
        mt_add(b, s, len[s]++, 1, 800 + s, true);
    step(m, b, 512, NULL, NULL, LLMEM_OK);
    mt_free(m, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_magazine");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_magazine_read_ahead, 0, 3);
    tcase_add_loop_test(tc, test_magazine_gives_back, 0, 2);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

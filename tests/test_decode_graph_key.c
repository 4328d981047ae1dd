// ctest-labels: core
/* Which decode steps models/decode_graph.c may record (an internal test:
 * hf_graph_view_recordable, beside test_decode_graph's end-to-end runs).
 *
 * A recording's key holds each view's buffers, sizes and table (offset, n)
 * pairs and the host contents of the tables that steer launch choices,
 * but none of the recurrent view's snapshot tables (llmem_rs_view
 * snap_tok / snap_slot): a backend picks a kernel's snapshot instance and
 * its push words from their host contents. So a step whose views carry
 * them must run eagerly, as one with a pending K-shift does. One-token
 * views carry none today (a snapshot lies before a group's last token),
 * so this holds the rule for the day a memory hands them over anyway.
 */
#include "support/run.h"
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/view.h"
#include "models/model_internal.h"

enum { N_SEQS = 3 };

static const int32_t src[N_SEQS] = {0, 1, 2}, dst[N_SEQS] = {3, 4, 5};
static const int32_t no_snap[N_SEQS] = {-1, -1, -1}, tok0[N_SEQS] = {0, 0, 0};
static const int32_t snap[N_SEQS] = {6, -1, 7};

/* A one-token recurrent view of 3 groups over 8 slots; the tables' device
 * offsets lie in idx as [src | dst | snap_tok | snap_slot]. */
static llmem_rs_view rs_desc(void)
{
    llmem_rs_view rs = {
        .n_slots = 8,
        .n_seqs = N_SEQS,
        .n_seq_tokens = 1,
        .src_slot = {src, 0, N_SEQS},
        .dst_slot = {dst, N_SEQS * 4, N_SEQS},
        .ckpt_slot = {NULL, 0, 0},
    };
    return rs;
}

static llmem_view view_of(llmem_view_kind kind, const void *desc, size_t size)
{
    llmem_view v = {.kind = kind, .desc_size = (uint32_t)size, .desc = desc};
    return v;
}

START_TEST(test_recurrent_snapshot_tables)
{
    llmem_rs_view rs = rs_desc();
    llmem_view v = view_of(LLMEM_VIEW_RECURRENT, &rs, sizeof rs);
    ck_assert(hf_graph_view_recordable(&v)); /* no tables (n == 0) */

    /* tables of n_seqs entries, every slot -1: a backend picks no snapshot
     * instance, but the key would not see a change to them either */
    rs.snap_tok = (llmem_i32_table){tok0, 2 * N_SEQS * 4, N_SEQS};
    rs.snap_slot = (llmem_i32_table){no_snap, 3 * N_SEQS * 4, N_SEQS};
    ck_assert(!hf_graph_view_recordable(&v));

    /* slots in use (a multi-token view's, as decode_graph never gets) */
    rs.n_seq_tokens = 4;
    rs.snap_slot.host = snap;
    ck_assert(!hf_graph_view_recordable(&v));

    /* the tables gone again: recordable */
    rs.snap_tok.n = rs.snap_slot.n = 0;
    ck_assert(hf_graph_view_recordable(&v));
}
END_TEST

/* A description of LLMEM_RS_VIEW_V1_SIZE bytes has no snapshot tables: the
 * check must not read past it (a heap block of exactly that size, so a
 * sanitizer build catches a read of the tables). */
START_TEST(test_recurrent_v1_size)
{
    llmem_rs_view full = rs_desc();
    void *v1 = malloc(LLMEM_RS_VIEW_V1_SIZE);
    ck_assert_ptr_nonnull(v1);
    memcpy(v1, &full, LLMEM_RS_VIEW_V1_SIZE);
    llmem_view v = view_of(LLMEM_VIEW_RECURRENT, v1, LLMEM_RS_VIEW_V1_SIZE);
    ck_assert(hf_graph_view_recordable(&v));
    free(v1);

    /* the same bytes with tables beyond desc_size: still none */
    full.snap_tok = (llmem_i32_table){tok0, 2 * N_SEQS * 4, N_SEQS};
    full.snap_slot = (llmem_i32_table){snap, 3 * N_SEQS * 4, N_SEQS};
    v = view_of(LLMEM_VIEW_RECURRENT, &full, LLMEM_RS_VIEW_V1_SIZE);
    ck_assert(hf_graph_view_recordable(&v));
    v.desc_size = sizeof full;
    ck_assert(!hf_graph_view_recordable(&v));
}
END_TEST

START_TEST(test_kv_shift_and_other_kinds)
{
    static const int32_t shift[1] = {0}, delta[1] = {5};
    llmem_kv_view kv = {.n_pages = 4, .page_size = 16, .n_kv_heads = 1, .head_dim = 8};
    llmem_view v = view_of(LLMEM_VIEW_KV, &kv, sizeof kv);
    ck_assert(hf_graph_view_recordable(&v));
    kv.shift_slot = (llmem_i32_table){shift, 0, 1}; /* a pending K-shift */
    kv.shift_delta = (llmem_i32_table){delta, 4, 1};
    ck_assert(!hf_graph_view_recordable(&v));

    llmem_view none = {.kind = LLMEM_VIEW_NONE};
    ck_assert(hf_graph_view_recordable(&none));
    ck_assert(hf_graph_view_recordable(NULL));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("decode_graph_key");
    TCase *tc = tcase_create("decode_graph_key");
    tcase_add_test(tc, test_recurrent_snapshot_tables);
    tcase_add_test(tc, test_recurrent_v1_size);
    tcase_add_test(tc, test_kv_shift_and_other_kinds);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// ctest-labels: core
/* A cache type defined outside the core, through the public interface only
 * (tests/support/example_rsum.c: the running-sum state, built against
 * <llmem/memory.h> and <llmem/memory_impl.h>): it plans, views, commits and
 * edits sequences through llmem_memory_*, its view kind is its own tag,
 * the built-in ops refuse that kind, and it composes with a KV cache in a
 * hybrid. Expected sums are float64 sums of the inputs, computed here.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"
#include "llmem/ops.h"
#include "support/example_rsum.h"
#include "support/memtest.h"

#define DIM 4

/* The input row of (sequence, position), dimension d. */
static float x_of(int32_t seq, int32_t pos, int32_t d)
{
    return (float)sin(0.7 * seq + 0.1 * pos + 1.3 * d) + 0.25f * (float)d;
}

/* Brute force: sum of x over positions [0, pos] of seq, in float64. */
static double sum_of(int32_t seq, int32_t pos, int32_t d)
{
    double s = 0;
    for (int32_t p = 0; p <= pos; p++)
        s += x_of(seq, p, d);
    return s;
}

/* Reference of what each sequence holds: its first position (positions
 * are contiguous) and length, or for a copy, whose inputs it summed. */
typedef struct ref {
    int32_t src[3]; /* the sequence whose inputs seq's sum holds */
    int32_t len[3];
} ref;

typedef struct run_ctx {
    const ref *r;
    int32_t layer0; /* first layer of the memory that is an rsum layer */
    int32_t n_layers;
    int32_t checked;
} run_ctx;

static void on_ubatch(llmem_memory *mem, const llmem_ubatch *ub, void *vctx)
{
    run_ctx *c = vctx;
    for (int32_t il = c->layer0; il < c->n_layers; il++) {
        llmem_view v;
        ck_assert_int_eq(llmem_memory_view(mem, il, &v), LLMEM_OK);
        ck_assert_uint_eq(v.kind, RSUM_VIEW_KIND);
        const rsum_view *rv = llmem_view_desc(&v, RSUM_VIEW_KIND, sizeof(rsum_view));
        ck_assert_ptr_nonnull(rv);
        ck_assert_ptr_null(llmem_view_kv(&v));
        ck_assert_int_eq(rv->n_seqs * rv->n_seq_tokens, ub->n_tokens);
        float *x = malloc((size_t)ub->n_tokens * DIM * sizeof *x);
        float *out = malloc((size_t)ub->n_tokens * DIM * sizeof *out);
        for (int32_t t = 0; t < ub->n_tokens; t++)
            for (int32_t d = 0; d < DIM; d++)
                x[t * DIM + d] = x_of(c->r->src[ub->seq_id[ub->seq[t]]], ub->pos[t], d);
        ck_assert_int_eq(rsum_kernel(&v, x, out), LLMEM_OK);
        for (int32_t t = 0; t < ub->n_tokens; t++) {
            int32_t q = c->r->src[ub->seq_id[ub->seq[t]]];
            for (int32_t d = 0; d < DIM; d++) {
                double want = sum_of(q, ub->pos[t], d);
                ck_assert_msg(fabs(out[t * DIM + d] - want) <= 1e-4 * (1 + fabs(want)),
                              "layer %d seq %d pos %d: %g vs %g", il, q, ub->pos[t],
                              out[t * DIM + d], want);
                c->checked++;
            }
        }
        free(x);
        free(out);
    }
}

START_TEST(test_rsum_through_public_interface)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *mem;
    char err[256];
    ck_assert_msg(rsum_create(be, 2, 3, DIM, &mem, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_str_eq(llmem_memory_type(mem), "rsum");
    ck_assert_int_eq(llmem_memory_split(mem), LLMEM_SPLIT_EQUAL);
    ref r = {{0, 1, 2}, {0, 0, 0}};
    run_ctx c = {&r, 0, 2, 0};
    llmem_batch_buf *b;
    ck_assert_int_eq(llmem_batch_buf_create(64, 1, &b), LLMEM_OK);
    /* prompts of 5 and 3 tokens, then decode steps of one token each */
    mt_add(b, 0, 0, 5, 10, true);
    mt_add(b, 1, 0, 3, 20, true);
    ck_assert_int_eq(mt_run(mem, llmem_batch_buf_get(b), 16, on_ubatch, &c, NULL), LLMEM_OK);
    r.len[0] = 5, r.len[1] = 3;
    for (int step = 0; step < 4; step++) {
        llmem_batch_buf_clear(b);
        mt_add(b, 0, r.len[0], 1, 30 + step, true);
        mt_add(b, 1, r.len[1], 1, 40 + step, true);
        ck_assert_int_eq(mt_run(mem, llmem_batch_buf_get(b), 16, on_ubatch, &c, NULL), LLMEM_OK);
        r.len[0]++, r.len[1]++;
        mt_assert_check(mem);
    }
    ck_assert_int_eq(llmem_memory_seq_pos_max(mem, 0), 8);
    ck_assert_int_eq(llmem_memory_seq_len(mem, 1), 7);
    /* a fork: sequence 2 continues sequence 0's sum */
    ck_assert_int_eq(llmem_memory_seq_cp(mem, 0, 2, -1, -1), LLMEM_OK);
    r.src[2] = 0;
    r.len[2] = r.len[0];
    llmem_batch_buf_clear(b);
    mt_add(b, 2, r.len[2], 2, 50, true);
    ck_assert_int_eq(mt_run(mem, llmem_batch_buf_get(b), 16, on_ubatch, &c, NULL), LLMEM_OK);
    r.len[2] += 2;
    /* a running sum cannot be cut back: refused, nothing changes */
    mt_snap before, after;
    mt_snapshot(mem, &before);
    ck_assert_int_eq(llmem_memory_seq_rm(mem, 0, 3, -1), LLMEM_E_STATE);
    mt_snapshot(mem, &after);
    mt_assert_same(&before, &after);
    /* the whole sequence goes, and starts again from zero */
    ck_assert_int_eq(llmem_memory_seq_rm(mem, 1, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(mem, 1), 0);
    r.len[1] = 0;
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 3, 60, true);
    ck_assert_int_eq(mt_run(mem, llmem_batch_buf_get(b), 16, on_ubatch, &c, NULL), LLMEM_OK);
    mt_assert_check(mem);
    llmem_memory_stats st;
    ck_assert_int_eq(llmem_memory_get_stats(mem, &st), LLMEM_OK);
    ck_assert_int_eq(st.slots_used, 3);
    ck_assert_int_gt(c.checked, 100);
    mt_free(mem, b, be);
}
END_TEST

START_TEST(test_builtin_ops_refuse_the_kind)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *mem;
    ck_assert_int_eq(rsum_create(be, 1, 2, DIM, &mem, NULL, 0), LLMEM_OK);
    llmem_batch_buf *b;
    ck_assert_int_eq(llmem_batch_buf_create(8, 1, &b), LLMEM_OK);
    mt_add(b, 0, 0, 2, 1, true);
    llmem_plan *plan;
    ck_assert_int_eq(llmem_memory_plan(mem, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan,
                                       NULL, 0),
                     LLMEM_OK);
    const llmem_ubatch *ub;
    ck_assert_int_eq(llmem_memory_apply(mem, plan, 0, &ub), LLMEM_OK);
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    char err[128];
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_STATE_SLOT_COPY, &v, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_str_eq(err, "op state_slot_copy accepts views of kind recurrent, not rsum");
    ck_assert_int_eq(llmem_op_state_slot_copy(be, &v, 0, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &v, 0, 1), LLMEM_E_INVALID);
    /* and its own kernel refuses the built-in kinds */
    llmem_kv_view kv = {0};
    llmem_view other = llmem_view_make(LLMEM_VIEW_KV, &kv, sizeof kv, NULL);
    float x[DIM * 2] = {0}, out[DIM * 2];
    ck_assert_int_eq(rsum_kernel(&other, x, out), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_commit(mem, plan, 0), LLMEM_OK);
    llmem_memory_release(mem, plan);
    mt_free(mem, b, be);
}
END_TEST

/* A hybrid of a KV cache (layer 0) and the running sum (layer 1): both
 * plan together, and a cut the sum refuses changes neither child. */
START_TEST(test_rsum_in_a_hybrid)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kids[2];
    kids[0] = mt_kv(be, 4, 16, 3, false, false);
    ck_assert_int_eq(rsum_create(be, 1, 3, DIM, &kids[1], NULL, 0), LLMEM_OK);
    const int32_t layer_child[2] = {0, 1};
    llmem_memory *h;
    char err[256];
    ck_assert_msg(llmem_hybrid_create(kids, 2, layer_child, 2, &h, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(llmem_memory_split(h), LLMEM_SPLIT_EQUAL); /* the strictest child's */
    ref r = {{0, 1, 2}, {0, 0, 0}};
    run_ctx c = {&r, 1, 2, 0};
    llmem_batch_buf *b;
    ck_assert_int_eq(llmem_batch_buf_create(32, 1, &b), LLMEM_OK);
    mt_add(b, 0, 0, 6, 1, true);
    mt_add(b, 1, 0, 6, 100, true);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 8, on_ubatch, &c, NULL), LLMEM_OK);
    ck_assert_int_gt(c.checked, 0);
    mt_assert_check(h);
    mt_snap before, after;
    mt_snapshot(h, &before);
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, 4, -1), LLMEM_E_STATE);
    mt_snapshot(h, &after);
    mt_assert_same(&before, &after);
    ck_assert_int_eq(llmem_memory_seq_len(llmem_memory_child(h, 0), 0), 6);
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(llmem_memory_child(h, 0), 0), 0);
    ck_assert_int_eq(llmem_memory_seq_len(llmem_memory_child(h, 1), 0), 0);
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("example_cache");
    TCase *tc = tcase_create("example_cache");
    tcase_add_test(tc, test_rsum_through_public_interface);
    tcase_add_test(tc, test_builtin_ops_refuse_the_kind);
    tcase_add_test(tc, test_rsum_in_a_hybrid);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

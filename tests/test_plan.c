// ctest-labels: core
/* Batch splitting: simple / equal / seq, output ids back to batch order.
 * Each property is checked against the batch itself, token by token. */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "support/memtest.h"

static llmem_plan *plan_of(llmem_memory *m, const llmem_batch *b, llmem_split split, int32_t n_ub)
{
    llmem_plan *p = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, b, split, n_ub, &p, err, sizeof err) == LLMEM_OK, "%s", err);
    return p;
}

/* Every batch token appears exactly once, in position order per sequence,
 * and out_ids are exactly the tokens with output flags. */
static void check_cover(const llmem_plan *p, const llmem_batch *b, int32_t n_ub)
{
    int32_t *seen = calloc((size_t)b->n_tokens, sizeof *seen);
    int32_t *outs = calloc((size_t)b->n_tokens, sizeof *outs);
    int32_t last_pos[16];
    for (int k = 0; k < 16; k++)
        last_pos[k] = -1;
    for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
        const llmem_ubatch *ub = llmem_plan_ubatch(p, u);
        ck_assert_int_le(ub->n_tokens, n_ub);
        ck_assert_int_ge(ub->n_tokens, 1);
        for (int32_t k = 0; k < ub->n_tokens; k++) {
            int32_t i = ub->batch_idx[k];
            seen[i]++;
            ck_assert_int_eq(ub->token[k], b->token[i]);
            ck_assert_int_eq(ub->pos[k], b->pos[i]);
            int32_t seq = b->seq_id[i][0];
            ck_assert_int_eq(ub->seq_id[ub->seq[k]], seq);
            ck_assert_int_gt(ub->pos[k], last_pos[seq]);
            last_pos[seq] = ub->pos[k];
        }
        for (int32_t o = 0; o < ub->n_outputs; o++) {
            ck_assert_int_eq(ub->batch_idx[ub->out_rows[o]], ub->out_ids[o]);
            outs[ub->out_ids[o]]++;
        }
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        ck_assert_int_eq(seen[i], 1);
        int want = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
        ck_assert_int_eq(outs[i], want);
    }
    free(seen);
    free(outs);
}

/* interleaved batch: seq lengths 5, 2, 7 */
static llmem_batch_buf *interleaved(void)
{
    llmem_batch_buf *b;
    llmem_batch_buf_create(64, 2, &b);
    const int32_t len[3] = {5, 2, 7};
    int32_t pos[3] = {0, 0, 0};
    for (int32_t round = 0; round < 7; round++)
        for (int32_t s = 0; s < 3; s++)
            if (pos[s] < len[s]) {
                ck_assert_int_eq(llmem_batch_buf_add(b, 10 * s + pos[s], pos[s], &s, 1,
                                                     pos[s] == len[s] - 1 || pos[s] == 1),
                                 LLMEM_OK);
                pos[s]++;
            }
    return b;
}

START_TEST(test_simple)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 32, 3, false, false);
    llmem_batch_buf *bb = interleaved();
    const llmem_batch *b = llmem_batch_buf_get(bb);
    for (int32_t n_ub = 1; n_ub <= 15; n_ub++) {
        llmem_plan *p = plan_of(m, b, LLMEM_SPLIT_SIMPLE, n_ub);
        ck_assert_int_eq(llmem_plan_n_ubatch(p), (14 + n_ub - 1) / n_ub);
        /* simple keeps batch order */
        int32_t next = 0;
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
            const llmem_ubatch *ub = llmem_plan_ubatch(p, u);
            for (int32_t k = 0; k < ub->n_tokens; k++)
                ck_assert_int_eq(ub->batch_idx[k], next++);
        }
        check_cover(p, b, n_ub);
        llmem_plan_info info;
        llmem_plan_get_info(p, &info);
        ck_assert_int_eq(info.n_outputs, 5); /* positions 1 and last: 2 + 1 + 2 */
        ck_assert_int_eq(info.n_tokens, 14);
        llmem_memory_release(m, p);
    }
    llmem_batch_buf_destroy(bb);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_equal_and_seq)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 32, 3, false, false);
    llmem_batch_buf *bb = interleaved();
    const llmem_batch *b = llmem_batch_buf_get(bb);
    for (int32_t n_ub = 1; n_ub <= 16; n_ub++) {
        llmem_plan *p = plan_of(m, b, LLMEM_SPLIT_EQUAL, n_ub);
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
            const llmem_ubatch *ub = llmem_plan_ubatch(p, u);
            ck_assert_int_eq(ub->n_seqs * ub->n_seq_tokens, ub->n_tokens);
            for (int32_t k = 0; k < ub->n_tokens; k++)
                ck_assert_int_eq(ub->seq[k], k / ub->n_seq_tokens); /* stream-major */
            for (int32_t s = 0; s < ub->n_seqs; s++)
                for (int32_t s2 = 0; s2 < s; s2++)
                    ck_assert_int_ne(ub->seq_id[s], ub->seq_id[s2]);
        }
        check_cover(p, b, n_ub);
        llmem_memory_release(m, p);
        p = plan_of(m, b, LLMEM_SPLIT_SEQ, n_ub);
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++)
            ck_assert_int_eq(llmem_plan_ubatch(p, u)->n_seqs, 1);
        ck_assert_int_ge(llmem_plan_n_ubatch(p), 3);
        check_cover(p, b, n_ub);
        llmem_memory_release(m, p);
    }
    /* with room for everything: equal needs 3 ubatches (2, then 3, then 2
     * tokens per stream for lengths 5, 2, 7 -> min-length groups) */
    llmem_plan *p = plan_of(m, b, LLMEM_SPLIT_EQUAL, 64);
    ck_assert_int_eq(llmem_plan_n_ubatch(p), 3);
    ck_assert_int_eq(llmem_plan_ubatch(p, 0)->n_seqs, 3);
    ck_assert_int_eq(llmem_plan_ubatch(p, 0)->n_seq_tokens, 2);
    ck_assert_int_eq(llmem_plan_ubatch(p, 1)->n_seqs, 2);
    ck_assert_int_eq(llmem_plan_ubatch(p, 1)->n_seq_tokens, 3);
    ck_assert_int_eq(llmem_plan_ubatch(p, 2)->n_seqs, 1);
    ck_assert_int_eq(llmem_plan_ubatch(p, 2)->n_seq_tokens, 2);
    llmem_memory_release(m, p);
    llmem_batch_buf_destroy(bb);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_default_output_and_embd)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 8, 1, false, false);
    int32_t pos[3] = {0, 1, 2};
    float embd[3 * 2] = {1, 2, 3, 4, 5, 6};
    llmem_batch b = {.n_tokens = 3, .embd = embd, .n_embd = 2, .pos = pos};
    llmem_plan *p = plan_of(m, &b, LLMEM_SPLIT_AUTO, 2);
    ck_assert_int_eq(llmem_plan_n_ubatch(p), 2);
    const llmem_ubatch *u1 = llmem_plan_ubatch(p, 1);
    ck_assert_ptr_null(u1->token);
    ck_assert_int_eq(u1->n_outputs, 1);
    ck_assert_int_eq(u1->out_ids[0], 2);
    ck_assert_float_eq(u1->embd[0], 5.0f);
    ck_assert_int_eq(llmem_plan_ubatch(p, 0)->n_outputs, 0);
    llmem_memory_release(m, p);
    /* token ids and embeddings together are refused */
    int32_t tok[3] = {1, 2, 3};
    b.token = tok;
    char err[128];
    ck_assert_int_eq(llmem_memory_plan(m, &b, LLMEM_SPLIT_AUTO, 2, &p, err, sizeof err), LLMEM_E_INVALID);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_simple);
    tcase_add_test(tc, test_equal_and_seq);
    tcase_add_test(tc, test_default_output_and_embd);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

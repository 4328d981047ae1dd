// ctest-labels: core
/* Recurrent memory unit tests: separate state slots per sequence within
 * one ubatch, checkpoints and rollback, seq_cp copies, shared-token
 * streams, state I/O. States are written by the test through the views
 * (value = tag of (sequence, length)), so each check compares against what
 * the test itself put there. */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "support/memtest.h"

static float tag(int32_t seq, int32_t len)
{
    return (float)(1000 * seq + len);
}

/* Acts as the scan kernel: the state after token t of stream s is
 * tag(first seq, length after t). Also checks the source slot holds the
 * state after the previous token. */
typedef struct scan_ctx {
    int32_t len[8];   /* tokens per sequence before this ubatch (test-side count) */
    int32_t from[8];  /* 1 + the sequence whose tag its state carries (0: itself) */
    int32_t distinct; /* ubatches where every stream had distinct src/dst slots */
    int32_t ubatches;
} scan_ctx;

static void fake_scan(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    scan_ctx *x = c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    ck_assert_int_eq(v.kind, LLMEM_VIEW_RECURRENT);
    const llmem_rs_view *r = llmem_view_rs(&v);
    ck_assert_int_eq(r->n_seqs * r->n_seq_tokens, ub->n_tokens);
    bool distinct = true;
    for (int32_t s = 0; s < r->n_seqs; s++) {
        int32_t seq = ub->seq_id[s], L = x->len[seq], T = r->n_seq_tokens;
        /* stream-major tokens */
        for (int32_t t = 0; t < T; t++)
            ck_assert_int_eq(ub->seq[s * T + t], s);
        float src[4];
        mt_rs_src_state(r, s, L == 0, src);
        if (L != 0)
            ck_assert_float_eq(src[0], tag(x->from[seq] ? x->from[seq] - 1 : seq, L));
        for (int32_t s2 = 0; s2 < r->n_seqs; s2++) {
            if (s2 == s)
                continue;
            distinct &= r->dst_slot.host[s] != r->dst_slot.host[s2];
            for (int32_t j = 0; j < r->n_ckpt; j++)
                distinct &= r->ckpt_slot.host[s2 * r->n_ckpt + j] != r->dst_slot.host[s];
        }
        for (int32_t j = 0; j < r->n_ckpt; j++) {
            int32_t after = T - r->n_ckpt + j; /* 0-based token index */
            float f[4] = {tag(seq, L + after + 1), 0, 0, 0};
            if (j == r->n_ckpt - 1) { /* the last token's state is the dst slot */
                ck_assert_int_eq(r->ckpt_slot.host[s * r->n_ckpt + j], -1);
                continue;
            }
            ck_assert_int_ge(r->ckpt_slot.host[s * r->n_ckpt + j], 0);
            ck_assert_int_ne(r->ckpt_slot.host[s * r->n_ckpt + j], r->dst_slot.host[s]);
            ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)r->ckpt_slot.host[s * r->n_ckpt + j] * 16, f, 16), LLMEM_OK);
        }
        float f[4] = {tag(seq, L + T), 0, 0, 0};
        ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)r->dst_slot.host[s] * 16, f, 16), LLMEM_OK);
        x->len[seq] = L + T;
        x->from[seq] = 0;
    }
    x->distinct += distinct;
    x->ubatches++;
}

static float cur_state(llmem_memory *m, llmem_backend *be, int32_t seq)
{
    int32_t slot = llmem_recurrent_seq_slot(m, seq);
    ck_assert_int_ge(slot, 0);
    size_t sz;
    ck_assert_int_eq(llmem_memory_state_size(m, seq, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(m, seq, buf, sz, NULL), LLMEM_OK);
    float f;
    memcpy(&f, buf + sz - 8 - 16, 4); /* the state is the last 16 bytes before the trailer */
    free(buf);
    (void)be;
    return f;
}

/* Runs b through m in ubatches of n_ubatch with fake_scan as the kernel;
 * every step must succeed. */
static void scan_run(llmem_memory *m, llmem_batch_buf *b, int32_t n_ubatch, scan_ctx *x)
{
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), n_ubatch, fake_scan, x, NULL), LLMEM_OK);
}

START_TEST(test_separate_slots)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 4, 0);
    ck_assert_int_eq(llmem_memory_split(m), LLMEM_SPLIT_EQUAL);
    llmem_batch_buf *b = mt_batch(64, 2);
    for (int32_t s = 0; s < 4; s++)
        mt_add(b, s, 0, 3, 0, true);
    scan_ctx x = {{0}, {0}, 0, 0};
    scan_run(m, b, 512, &x);
    ck_assert_int_eq(x.ubatches, 1);
    ck_assert_int_eq(x.distinct, 1);
    for (int32_t s = 0; s < 4; s++)
        ck_assert_float_eq(cur_state(m, be, s), tag(s, 3));
    /* decode steps for all four: each reads its own state */
    for (int32_t step = 0; step < 3; step++) {
        llmem_batch_buf_clear(b);
        for (int32_t s = 0; s < 4; s++)
            mt_add(b, s, 3 + step, 1, 7, true);
        scan_run(m, b, 512, &x);
    }
    for (int32_t s = 0; s < 4; s++)
        ck_assert_float_eq(cur_state(m, be, s), tag(s, 6));
    ck_assert_int_eq(x.distinct, x.ubatches);
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_checkpoint_rollback)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 2, 3);
    llmem_batch_buf *b = mt_batch(64, 2);
    scan_ctx x = {{0}, {0}, 0, 0};
    mt_add(b, 0, 0, 5, 0, true);
    mt_add(b, 1, 0, 5, 0, true);
    scan_run(m, b, 512, &x);
    /* speculative step: 1 + 3 draft tokens; checkpoints after lengths 6, 7, 8 */
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 5, 4, 0, true);
    mt_add(b, 1, 5, 4, 0, true);
    scan_run(m, b, 512, &x);
    int32_t pos[8];
    ck_assert_int_eq(llmem_recurrent_checkpoints(m, 0, pos, 8), 3);
    /* seq 0 accepts 1 draft: keep positions 0..6 (length 7) */
    mt_snap before, after;
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 7, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 7);
    ck_assert_float_eq(cur_state(m, be, 0), tag(0, 7));
    ck_assert_float_eq(cur_state(m, be, 1), tag(1, 9));
    /* seq 1 rejects all drafts: length 6 */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, 6, -1), LLMEM_OK);
    ck_assert_float_eq(cur_state(m, be, 1), tag(1, 6));
    /* the state at length 5 (before the step) was dropped: only the newest
     * 1 + n_ckpt = 4 states (6..9) are kept; lengths 5 and 3 are refused
     * and nothing changes */
    mt_snapshot(m, &before);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, 5, -1), LLMEM_E_STATE);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, 3, -1), LLMEM_E_STATE);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    ck_assert_float_eq(cur_state(m, be, 1), tag(1, 6));
    /* continuing after a rollback reads the rolled-back state; with a
     * 2-token step the state before it (length 6 / 7) stays a checkpoint */
    x.len[0] = 7;
    x.len[1] = 6;
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 7, 2, 0, true);
    mt_add(b, 1, 6, 2, 0, true);
    scan_run(m, b, 512, &x);
    ck_assert_float_eq(cur_state(m, be, 0), tag(0, 9));
    ck_assert_float_eq(cur_state(m, be, 1), tag(1, 8));
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, 6, -1), LLMEM_OK);
    ck_assert_float_eq(cur_state(m, be, 1), tag(1, 6));
    /* removing everything always works */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 0, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_recurrent_seq_slot(m, 0), -1);
    mt_assert_check(m);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.slots_total, 2 * (2 + 3));
    ck_assert_int_le(st.slots_used, 4);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_seq_cp_and_shared_stream)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 3, 1);
    llmem_batch_buf *b = mt_batch(64, 3);
    scan_ctx x = {{0}, {0}, 0, 0};
    /* a shared prompt: tokens in sequences {0, 1} */
    int32_t both[2] = {0, 1};
    for (int32_t t = 0; t < 4; t++)
        ck_assert_int_eq(llmem_batch_buf_add(b, t, t, both, 2, t == 3), LLMEM_OK);
    scan_run(m, b, 512, &x);
    ck_assert_int_eq(llmem_memory_seq_len(m, 1), 4);
    ck_assert_int_ne(llmem_recurrent_seq_slot(m, 0), llmem_recurrent_seq_slot(m, 1));
    ck_assert_float_eq(cur_state(m, be, 1), tag(0, 4)); /* a copy of the stream's state */
    /* seq_cp gives the copy its own slot */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 2, -1, -1), LLMEM_OK);
    ck_assert_int_ne(llmem_recurrent_seq_slot(m, 2), llmem_recurrent_seq_slot(m, 0));
    ck_assert_float_eq(cur_state(m, be, 2), tag(0, 4));
    /* a prefix without a checkpoint cannot be copied */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 2, 0, 2), LLMEM_E_STATE);
    /* diverging: sequences now write separately */
    x.len[1] = 4;
    x.len[2] = 4;
    x.from[1] = 1; /* both carry sequence 0's state */
    x.from[2] = 1;
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 4, 1, 0, true);
    mt_add(b, 2, 4, 1, 0, true);
    scan_run(m, b, 512, &x);
    ck_assert_float_eq(cur_state(m, be, 0), tag(0, 4));
    ck_assert_float_eq(cur_state(m, be, 1), tag(1, 5));
    ck_assert_float_eq(cur_state(m, be, 2), tag(2, 5));
    /* a sequence appearing in two different id-sets cannot be split EQUAL */
    llmem_batch_buf_clear(b);
    int32_t s01[2] = {0, 1}, s0 = 0;
    ck_assert_int_eq(llmem_batch_buf_add(b, 1, 4, &s0, 1, false), LLMEM_OK);
    ck_assert_int_eq(llmem_batch_buf_add(b, 1, 5, s01, 2, true), LLMEM_OK);
    llmem_plan *plan = NULL;
    char err[256];
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 64, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_SIMPLE, 64, &plan, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "weaker"));
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_release_uncommitted)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 2, 2);
    llmem_batch_buf *b = mt_batch(64, 2);
    scan_ctx x = {{0}, {0}, 0, 0};
    mt_add(b, 0, 0, 3, 0, true);
    scan_run(m, b, 512, &x);
    /* a ubatch is applied and its kernel runs, but the pass fails: release */
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 3, 3, 0, true);
    llmem_plan *plan = NULL;
    char err[256];
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan, err, sizeof err), LLMEM_OK);
    const llmem_ubatch *ub;
    ck_assert_int_eq(llmem_memory_apply(m, plan, 0, &ub), LLMEM_OK);
    fake_scan(m, ub, &x);
    llmem_memory_release(m, plan);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 3);
    ck_assert_float_eq(cur_state(m, be, 0), tag(0, 3)); /* current state intact */
    mt_assert_check(m);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_state_io)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 2, 1);
    llmem_batch_buf *b = mt_batch(64, 2);
    scan_ctx x = {{0}, {0}, 0, 0};
    mt_add(b, 0, 0, 4, 0, true);
    scan_run(m, b, 512, &x);
    size_t sz;
    ck_assert_int_eq(llmem_memory_state_size(m, 0, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(m, 0, buf, sz, NULL), LLMEM_OK);
    char err[256];
    ck_assert_int_eq(llmem_memory_state_read(m, 1, buf, sz, err, sizeof err), LLMEM_OK);
    ck_assert_float_eq(cur_state(m, be, 1), tag(0, 4));
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 1), 3);
    mt_snap before, after;
    mt_snapshot(m, &before);
    for (size_t i = 0; i < sz; i++) {
        buf[i] ^= 1;
        ck_assert_int_ne(llmem_memory_state_read(m, 1, buf, sz, err, sizeof err), LLMEM_OK);
        buf[i] ^= 1;
    }
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    ck_assert_float_eq(cur_state(m, be, 1), tag(0, 4));
    /* another geometry is refused */
    static const llmem_state_desc d = {.name = "s", .n_dims = 1, .shape = {5}, .dtype = LLMEM_DTYPE_F32};
    const llmem_state_desc *states[1] = {&d};
    const int32_t n_states[1] = {1};
    llmem_recurrent_params p = {.n_layers = 1, .n_states = n_states, .states = states, .n_seq_max = 2};
    llmem_memory *m2 = NULL;
    ck_assert_int_eq(llmem_recurrent_create(be, &p, &m2, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_state_read(m2, 0, buf, sz, err, sizeof err), LLMEM_E_INVALID);
    llmem_memory_destroy(m2);
    /* bad parameters */
    p.n_ckpt = -1;
    ck_assert_int_eq(llmem_recurrent_create(be, &p, &m2, err, sizeof err), LLMEM_E_INVALID);
    free(buf);
    mt_free(m, b, be);
}
END_TEST

/* Regression: a slot dropped by one sequence in ubatch u must not be given
 * to another sequence's new state in the same ubatch (its poisoning at
 * commit destroyed that state). Found by `llmem score --poison`. */
START_TEST(test_multi_ubatch_poison)
{
    setenv("LLMEM_POISON", "1", 1);
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 3, 0);
    llmem_batch_buf *b = mt_batch(128, 2);
    scan_ctx x = {{0}, {0}, 0, 0};
    const int32_t len[3] = {15, 4, 9};
    for (int32_t round = 0; round < 3; round++) {
        llmem_batch_buf_clear(b);
        for (int32_t s = 0; s < 3; s++)
            mt_add(b, s, x.len[s], len[s], 0, true);
        scan_run(m, b, 7, &x);
        for (int32_t s = 0; s < 3; s++)
            ck_assert_float_eq(cur_state(m, be, s), tag(s, x.len[s]));
        mt_assert_check(m);
    }
    mt_free(m, b, be);
    unsetenv("LLMEM_POISON");
}
END_TEST

/* Decode steps append token ids through a per-sequence stage that reaches
 * the sequence's array once every few tokens (memory/rs_internal.h
 * rs_stage): seq_cp, state I/O, seq_rm and seq_tokens must see every id, in
 * order, whatever the stage holds. The reference is the list of ids the
 * test submitted. */
START_TEST(test_decode_tokens_read_back)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 3, 1);
    llmem_batch_buf *b = mt_batch(64, 3);
    /* every sequence decodes; 0 is read, 1 and 2 are overwritten by its
     * seq_cp and state read while they hold ids of their own */
    int32_t ref[3][128], n[3];
    mt_decode_read_back(m, b, ref, n);
    /* back to the checkpoint before the last token, then on */
    mt_rm_last_and_on(m, b, ref[0], &n[0], 9000);
    mt_assert_check(m);
    mt_clear_staged_then_prompt(m, b, n[1]);
    mt_free(m, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("recurrent");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_separate_slots);
    tcase_add_test(tc, test_checkpoint_rollback);
    tcase_add_test(tc, test_seq_cp_and_shared_stream);
    tcase_add_test(tc, test_release_uncommitted);
    tcase_add_test(tc, test_state_io);
    tcase_add_test(tc, test_multi_ubatch_poison);
    tcase_add_test(tc, test_decode_tokens_read_back);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

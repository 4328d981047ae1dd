// ctest-labels: core
/* Host out-of-memory inside a commit: the N-th host allocation (malloc,
 * calloc, realloc or aligned_alloc, interposed over glibc's by
 * support/host_faults.h) after the ubatch is applied fails, for N = 0, 1,
 * 2, ... until the commit makes no more allocations. A commit either
 * succeeds (the sequence holds the prompt) or fails having changed nothing
 * (the sequence is still empty); llmem_memory_check passes either way.
 *
 * The recurrent memory with snapshots publishes one at the end of a
 * prompt ubatch, after it has taken the prompt's tokens: queueing that
 * snapshot's copy used to fail the whole commit with the tokens already
 * in (a hybrid then reported the prompt's length after a failed decode).
 * A snapshot is a cache entry; one that cannot be recorded is not
 * published, and the commit stands.
 *
 * A commit makes no host allocation that can fail it: the plan reserves
 * the room for the token ids and positions its commits append (a long
 * prompt, positions stored after a seq_add) and for a stream's state
 * copies. The long-append cases sweep the commit alone (it must succeed)
 * and the whole step from the plan on (the plan fails with the memory as
 * it was, or the step succeeds), on a KV cache and a hybrid.
 *
 * Interposing malloc needs glibc and no sanitizer (ASan brings its own
 * allocator): elsewhere the suite exits 77 (skipped). */
#include "support/memtest.h"
#include "support/run.h"
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmem/hybrid.h"
#include "llmem/recurrent.h"
#include "support/host_faults.h"

#ifdef HOST_FAULTS

#define PROMPT 6 /* tokens: within one token stage (memory/tok_stage.h) */

/* A recurrent memory of 2 sequences, 1 checkpoint each and 4 snapshots
 * (published at the end of each prompt ubatch, none by interval). */
static llmem_memory *rs_with_snapshots(llmem_backend *be)
{
    llmem_recurrent_params p = mt_rs_params(2, 1);
    p.n_snapshots = 4;
    return mt_rs_create(be, &p);
}

/* A hybrid of the KV cache kv and rs_with_snapshots: a recurrent layer,
 * then an attention layer. */
static llmem_memory *hybrid_of(llmem_backend *be, llmem_memory *kv)
{
    return mt_hybrid_rs_kv(kv, rs_with_snapshots(be));
}

/* Attention in pages of 4: the composition of tidy9's bamba repro. */
static llmem_memory *hybrid_with_snapshots(llmem_backend *be)
{
    return hybrid_of(be, mt_kv(be, 4, 64, 2, false, false));
}

static void prompt_commit_under_host_oom(bool hybrid)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    mt_add(b, 0, 0, PROMPT, 100, true);
    int32_t n_ok = 0, n_failed = 0;
    bool hit = true;
    for (int64_t n = 0; hit; n++) {
        llmem_memory *m = hybrid ? hybrid_with_snapshots(be) : rs_with_snapshots(be);
        llmem_plan *plan = NULL;
        const llmem_ubatch *ub = NULL;
        char err[256] = "";
        ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan,
                                           err, sizeof err),
                         LLMEM_OK);
        ck_assert_int_eq(llmem_plan_n_ubatch(plan), 1);
        ck_assert_int_eq(llmem_memory_apply(m, plan, 0, &ub), LLMEM_OK);
        hf_arm(n);
        llmem_status st = llmem_memory_commit(m, plan, 0);
        hit = hf_disarm();
        llmem_memory_release(m, plan);
        if (st == LLMEM_OK) {
            ck_assert_msg(llmem_memory_seq_len(m, 0) == PROMPT,
                          "allocation %lld failed: commit succeeded with %d tokens", (long long)n,
                          llmem_memory_seq_len(m, 0));
            n_ok++;
        } else {
            ck_assert_msg(llmem_memory_seq_len(m, 0) == 0,
                          "allocation %lld failed: commit returned %s with %d tokens taken",
                          (long long)n, llmem_status_str(st), llmem_memory_seq_len(m, 0));
            n_failed++;
        }
        mt_assert_check(m);
        /* the memory goes on: the prompt (again, or the next token) commits */
        llmem_batch_buf *c = mt_batch_new();
        int32_t len = llmem_memory_seq_len(m, 0);
        if (len == 0)
            mt_add(c, 0, 0, PROMPT, 100, true);
        else
            mt_add(c, 0, len, 1, 100 + len, true);
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(c), 512, NULL, NULL, NULL), LLMEM_OK);
        ck_assert_int_eq(llmem_memory_seq_len(m, 0), len == 0 ? PROMPT : PROMPT + 1);
        mt_assert_check(m);
        llmem_batch_buf_destroy(c);
        llmem_memory_destroy(m);
    }
    /* the sweep reached the snapshot's allocations (a commit that failed
     * or absorbed a failure) and ended with one that made them all */
    ck_assert_int_gt(n_ok + n_failed, 1);
    llmem_batch_buf_destroy(b);
    llmem_backend_close(be);
}

START_TEST(test_recurrent_prompt_commit)
{
    prompt_commit_under_host_oom(false);
}
END_TEST

START_TEST(test_hybrid_prompt_commit)
{
    prompt_commit_under_host_oom(true);
}
END_TEST

/* ---- long appends: the token and position arrays grow -------------------- */

/* LONG tokens need a token array of 65,536 entries (256 KiB + a header):
 * more than the first chunk of a memory's seq heap (memory/seq_heap.h), so
 * growing it takes a host allocation, as a long prompt does in service. */
#define LONG 40000
#define LONG_PAGES 5100 /* pages of 16 for two sequences of LONG + 8 tokens */

static llmem_memory *kv_long(llmem_backend *be)
{
    return mt_kv(be, 16, LONG_PAGES, 2, true, false);
}

/* hybrid_with_snapshots's layout with a KV cache big enough for LONG. */
static llmem_memory *hybrid_long(llmem_backend *be)
{
    return hybrid_of(be, kv_long(be));
}

/* Sequence 0 before the swept step: empty, or (stored) 8 tokens 100..107
 * at positions 0..3, 7..10: seq_add moved the last four, so the positions
 * are no run and are stored (memory/seq_pos.h); the step appends to them. */
static void long_setup(llmem_memory *m, bool stored)
{
    if (!stored)
        return;
    llmem_batch_buf *b = mt_batch_new();
    mt_add(b, 0, 0, 8, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, 4, 8, 3), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), 10);
    llmem_batch_buf_destroy(b);
}

/* Sequence seq holds len tokens, ids 100, 101, ... (the setup's, then the
 * step's: the batches built here), the last at position pmax. */
static void expect_seq(llmem_memory *m, int32_t seq, int32_t *buf, int32_t len, int32_t pmax)
{
    ck_assert_int_eq(llmem_memory_seq_len(m, seq), len);
    ck_assert_int_eq(llmem_memory_seq_tokens(m, seq, buf, LONG + 16), len);
    for (int32_t j = 0; j < len; j++)
        ck_assert_msg(buf[j] == 100 + j, "sequence %d: token %d is %d, not %d", seq, j, buf[j],
                      100 + j);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, seq), len > 0 ? pmax : -1);
}

/* The memory goes on: one more token commits after whatever happened. */
static void one_more(llmem_memory *m, int32_t *buf)
{
    int32_t len = llmem_memory_seq_len(m, 0), pmax = llmem_memory_seq_pos_max(m, 0);
    llmem_batch_buf *c = mt_batch_new();
    mt_add(c, 0, pmax + 1, 1, 100 + len, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(c), 512, NULL, NULL, NULL), LLMEM_OK);
    expect_seq(m, 0, buf, len + 1, pmax + 1);
    mt_assert_check(m);
    llmem_batch_buf_destroy(c);
}

enum {
    STORED = 1,     /* long_setup's stored positions first */
    SHARED = 2,     /* every token of the step in sequences 0 and 1 (a stream) */
    WHOLE_STEP = 4, /* arm from the plan on, not only around the commit */
};

/* Appends LONG tokens to sequence 0 (set up by long_setup), and with SHARED
 * to sequence 1 as well, in one ubatch while host allocation n (n = 0, 1,
 * ...) fails. With WHOLE_STEP, from the plan on: the plan (or apply) fails
 * with the memory as it was, or the step succeeds. Otherwise only the
 * commit is armed, and it must succeed: the plan reserved everything the
 * commit fills (the tokens' and positions' room, a stream's state copies),
 * so a commit cannot fail for host memory. A composition commits its
 * children one after the other and cannot undo the first, so this is also
 * what keeps a hybrid's commit whole. */
static void long_append_under_host_oom(llmem_memory *(*make)(llmem_backend *), int flags)
{
    bool stored = flags & STORED, whole_step = flags & WHOLE_STEP;
    llmem_backend *be = mt_cpu();
    int32_t *buf = malloc((LONG + 16) * sizeof *buf);
    ck_assert_ptr_nonnull(buf);
    int32_t n0 = stored ? 8 : 0, p0 = stored ? 11 : 0, n_seq = flags & SHARED ? 2 : 1;
    const int32_t seqs[2] = {0, 1};
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(LONG, 2, &b), LLMEM_OK);
    for (int32_t i = 0; i < LONG; i++)
        ck_assert_int_eq(llmem_batch_buf_add(b, 100 + n0 + i, p0 + i, seqs, n_seq, i == LONG - 1),
                         LLMEM_OK);
    int32_t n_refused = 0, n_plan_failed = 0;
    bool hit = true;
    for (int64_t n = 0; hit; n++) {
        llmem_memory *m = make(be);
        long_setup(m, stored);
        llmem_plan *plan = NULL;
        const llmem_ubatch *ub = NULL;
        char err[256] = "";
        if (whole_step)
            hf_arm(n);
        llmem_status st = llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, LONG,
                                            &plan, err, sizeof err);
        if (st == LLMEM_OK)
            st = llmem_memory_apply(m, plan, 0, &ub);
        llmem_status cst = LLMEM_OK;
        if (st == LLMEM_OK) {
            if (!whole_step)
                hf_arm(n);
            cst = llmem_memory_commit(m, plan, 0);
        }
        hit = hf_disarm(); /* before any assertion: Check allocates too */
        ck_assert_msg(cst == LLMEM_OK, "allocation %lld failed: commit returned %s",
                      (long long)n, llmem_status_str(cst));
        if (plan)
            ck_assert_int_eq(llmem_plan_n_ubatch(plan), 1);
        n_refused += hit;
        if (plan)
            llmem_memory_release(m, plan);
        if (st == LLMEM_OK) {
            for (int32_t q = 0; q < n_seq; q++)
                expect_seq(m, q, buf, n0 + LONG, p0 + LONG - 1);
        } else {
            ck_assert_msg(st == LLMEM_E_NO_MEMORY, "allocation %lld failed: %s (%s)",
                          (long long)n, llmem_status_str(st), err);
            for (int32_t q = 0; q < n_seq; q++)
                expect_seq(m, q, buf, n0, stored ? 10 : -1);
            n_plan_failed++;
        }
        mt_assert_check(m);
        one_more(m, buf);
        llmem_memory_destroy(m);
    }
    /* the plan's own allocations were refused in turn; a commit may make
     * none at all */
    if (whole_step)
        ck_assert_int_gt(n_plan_failed, 0);
    ck_assert_int_ge(n_refused, whole_step ? 1 : 0);
    llmem_batch_buf_destroy(b);
    free(buf);
    llmem_backend_close(be);
}

START_TEST(test_kv_long_prompt_commit)
{
    long_append_under_host_oom(kv_long, 0);
}
END_TEST

START_TEST(test_kv_stored_positions_commit)
{
    long_append_under_host_oom(kv_long, STORED);
}
END_TEST

START_TEST(test_hybrid_long_prompt_commit)
{
    long_append_under_host_oom(hybrid_long, 0);
}
END_TEST

START_TEST(test_hybrid_shared_prompt_commit)
{
    long_append_under_host_oom(hybrid_long, SHARED);
}
END_TEST

START_TEST(test_hybrid_stored_positions_commit)
{
    long_append_under_host_oom(hybrid_long, STORED);
}
END_TEST

START_TEST(test_kv_long_prompt_step)
{
    long_append_under_host_oom(kv_long, STORED | WHOLE_STEP);
}
END_TEST

START_TEST(test_hybrid_long_prompt_step)
{
    long_append_under_host_oom(hybrid_long, SHARED | WHOLE_STEP);
}
END_TEST
#endif

int main(void)
{
#ifdef HOST_FAULTS
    Suite *s = suite_create("commit_oom");
    TCase *tc = tcase_create("commit");
    tcase_set_timeout(tc, 120); /* not Check's 4 s: the sweeps of long prompts */
    tcase_add_test(tc, test_recurrent_prompt_commit);
    tcase_add_test(tc, test_hybrid_prompt_commit);
    tcase_add_test(tc, test_kv_long_prompt_commit);
    tcase_add_test(tc, test_kv_stored_positions_commit);
    tcase_add_test(tc, test_hybrid_long_prompt_commit);
    tcase_add_test(tc, test_hybrid_shared_prompt_commit);
    tcase_add_test(tc, test_hybrid_stored_positions_commit);
    tcase_add_test(tc, test_kv_long_prompt_step);
    tcase_add_test(tc, test_hybrid_long_prompt_step);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
#else
    puts("commit_oom: needs glibc without a sanitizer (interposes malloc); skipped");
    return 77;
#endif
}

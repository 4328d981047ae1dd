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
    static const llmem_state_desc d = {.name = "s", .n_dims = 1, .shape = {4},
                                       .dtype = LLMEM_DTYPE_F32};
    const llmem_state_desc *states[1] = {&d};
    const int32_t n_states[1] = {1};
    llmem_recurrent_params p = {.n_layers = 1, .n_states = n_states, .states = states,
                                .n_seq_max = 2, .n_ckpt = 1, .n_snapshots = 4};
    llmem_memory *m = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_recurrent_create(be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    return m;
}

/* The same in a hybrid (a recurrent layer, then an attention layer in
 * pages of 4): the composition of tidy9's bamba repro. */
static llmem_memory *hybrid_with_snapshots(llmem_backend *be)
{
    llmem_memory *children[2] = {mt_kv(be, 4, 64, 2, false, false), rs_with_snapshots(be)};
    const int32_t map[2] = {1, 0};
    llmem_memory *h = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_hybrid_create(children, 2, map, 2, &h, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    return h;
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
#endif

int main(void)
{
#ifdef HOST_FAULTS
    Suite *s = suite_create("commit_oom");
    TCase *tc = tcase_create("commit");
    tcase_add_test(tc, test_recurrent_prompt_commit);
    tcase_add_test(tc, test_hybrid_prompt_commit);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
#else
    puts("commit_oom: needs glibc without a sanitizer (interposes malloc); skipped");
    return 77;
#endif
}

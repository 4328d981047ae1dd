// ctest-labels: core
/* Host out-of-memory during state reads: the N-th host allocation (malloc,
 * calloc, realloc or aligned_alloc, interposed over glibc's by
 * support/host_faults.h) fails, for N = 0, 1, 2, ... until
 * llmem_memory_state_read succeeds. Every failed read must return an error
 * and leave the memory as it was: the sequence being replaced keeps its
 * tokens, positions and page table or state slot (DESIGN.md: bad input and
 * out-of-memory lose nothing), and llmem_memory_check passes. The KV cache
 * and the recurrent memory used to drop the sequence first and then grow
 * its token, position and page-table (slot-list) arrays, so a failure
 * there emptied it.
 *
 * Interposing malloc needs glibc and no sanitizer (ASan brings its own
 * allocator): elsewhere the suite exits 77 (skipped). */
#include "support/memtest.h"
#include "support/run.h"
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "support/host_faults.h"

#ifdef HOST_FAULTS

#define LONG 70000 /* tokens: past the first chunks of the token store and page rows */

/* A KV cache of pages of `ps` tokens (ps 0: a recurrent memory) holding a short sequence 0 (5 tokens),
 * a long sequence 1 (LONG) and, for a whole-cache read, a sequence 2 (9
 * tokens) that the saved state lacks. */
static llmem_memory *filled(llmem_backend *be, llmem_batch_buf *b, int32_t ps, bool with_2)
{
    llmem_memory *m = ps > 0 ? mt_kv(be, ps, 2 * LONG / ps + 64, 3, false, false) : mt_rs(be, 3, 0);
    llmem_batch_buf_clear(b);
    mt_add(b, 0, 0, 5, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    for (int32_t at = 0; at < LONG; at += 1000) { /* a batch buffer holds 1024 tokens */
        llmem_batch_buf_clear(b);
        mt_add(b, 1, at, 1000, 300 + at, true);
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 1000, NULL, NULL, NULL), LLMEM_OK);
    }
    if (with_2) {
        llmem_batch_buf_clear(b);
        mt_add(b, 2, 0, 9, 700, true);
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    }
    return m;
}

/* Sequence 1's state read into sequence 0 (seq >= 0), or the whole
 * cache's state (without sequence 2) into a cache (seq -1), on a fresh
 * cache per N while the N-th host allocation fails. A failed allocation
 * may be absorbed (a pending-upload list that cannot grow uploads the
 * whole table instead); a read that fails must fail cleanly. */
static void state_read_under_host_oom(int32_t ps, int32_t seq)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = filled(be, b, ps, false);
    size_t size = 0, written = 0;
    int32_t from = seq >= 0 ? 1 : -1, dst = seq >= 0 ? seq : 1;
    ck_assert_int_eq(llmem_memory_state_size(m, from, &size), LLMEM_OK);
    unsigned char *buf = __libc_malloc(size);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(llmem_memory_state_write(m, from, buf, size, &written), LLMEM_OK);
    llmem_memory_destroy(m);
    int64_t failures = 0;
    for (int64_t n = 0;; n++) {
        ck_assert_int_lt(n, 10000);
        m = filled(be, b, ps, seq < 0);
        mt_snap before, after;
        mt_snapshot(m, &before);
        char err[256] = "";
        hf_arm(n);
        llmem_status st = llmem_memory_state_read(m, seq, buf, size, err, sizeof err);
        bool hit = hf_disarm(); /* the armed allocation happened and failed */
        if (st == LLMEM_OK) { /* sequence 1's tokens where they belong */
            ck_assert_int_eq(llmem_memory_seq_len(m, dst), LONG);
            ck_assert_int_eq(llmem_memory_seq_pos_max(m, dst), LONG - 1);
            ck_assert_int_eq(llmem_memory_seq_len(m, 2), 0);
        } else {
            ck_assert_msg(hit, "read failed (%s) with no allocation failing", err);
            ck_assert_int_eq(st, LLMEM_E_NO_MEMORY);
            mt_snapshot(m, &after);
            mt_assert_same(&before, &after);
            failures++;
        }
        mt_assert_check(m);
        llmem_memory_destroy(m);
        if (!hit)
            break; /* every allocation of the read has had its turn */
    }
    ck_assert_int_gt(failures, 0); /* the read allocates: the loop tested something */
    free(buf);
    llmem_batch_buf_destroy(b);
    llmem_backend_close(be);
}

START_TEST(test_seq_read_page1)
{
    state_read_under_host_oom(1, 0);
}
END_TEST

START_TEST(test_seq_read_page16)
{
    state_read_under_host_oom(16, 0);
}
END_TEST

START_TEST(test_all_read_page4)
{
    state_read_under_host_oom(4, -1);
}
END_TEST

START_TEST(test_recurrent_seq_read)
{
    state_read_under_host_oom(0, 0);
}
END_TEST

START_TEST(test_recurrent_all_read)
{
    state_read_under_host_oom(0, -1);
}
END_TEST
#endif

int main(void)
{
#ifdef HOST_FAULTS
    Suite *s = suite_create("host_oom");
    TCase *tc = tcase_create("state_read");
    tcase_add_test(tc, test_seq_read_page1);
    tcase_add_test(tc, test_seq_read_page16);
    tcase_add_test(tc, test_all_read_page4);
    tcase_add_test(tc, test_recurrent_seq_read);
    tcase_add_test(tc, test_recurrent_all_read);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
#else
    puts("host_oom: needs glibc without a sanitizer (interposes malloc); skipped");
    return 77;
#endif
}

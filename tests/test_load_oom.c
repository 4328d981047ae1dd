/* Host out-of-memory while a model loads: the N-th host allocation
 * (support/host_faults.h interposes malloc, calloc, realloc and
 * aligned_alloc) fails, for N = 0, 1, 2, ... until llmem_model_load
 * succeeds, on fixtures of each memory layout: llama (one KV cache), mamba2
 * (a recurrent memory), bamba (a hybrid of both) and gemma3_text (two KV
 * caches, global and sliding window, in a hybrid). Every failed load must
 * return LLMEM_E_NO_MEMORY with a message and no model, and nothing may
 * crash. tests/support/load_faults.c does the same for device allocations
 * (lf_every_allocation_fails) at the same shape (lf_params).
 * The sweep found a KV cache whose creation failed between its K and V
 * tables crashing in its own destroy, and a recurrent memory returning
 * LLMEM_OK and no memory when a state's name found no memory (the model
 * then said it had "neither attention nor Mamba layers").
 *
 * Interposing malloc needs glibc and no sanitizer: elsewhere the suite
 * exits 77 (skipped). */
// ctest-labels: core
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/host_faults.h"
#include "support/load_faults.h"
#include "support/run.h"

#ifdef HOST_FAULTS

static const char *const fixtures[] = {"llama", "mamba2", "bamba", "gemma3_text"};

START_TEST(every_host_allocation_fails)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", test_source_dir(), fixtures[_i]);
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, err, sizeof err), LLMEM_OK);
    llmem_model_params p = lf_params();
    int64_t failures = 0;
    for (int64_t n = 0;; n++) {
        ck_assert_int_lt(n, 100000);
        llmem_model *m = (llmem_model *)1;
        strcpy(err, "stale");
        hf_arm(n);
        llmem_status s = llmem_model_load(dir, be, &p, &m, err, sizeof err);
        bool hit = hf_disarm();
        if (s == LLMEM_OK) {
            llmem_model_free(m);
            if (!hit)
                break; /* every allocation of the load has had its turn */
            continue;  /* the failed allocation had a fallback */
        }
        ck_assert_msg(s == LLMEM_E_NO_MEMORY, "%s, allocation %lld failing: %s (%s)",
                      fixtures[_i], (long long)n, llmem_status_str(s), err);
        ck_assert_ptr_null(m);
        ck_assert_msg(err[0] && strcmp(err, "stale"), "%s, allocation %lld: no message",
                      fixtures[_i], (long long)n);
        failures++;
    }
    ck_assert_int_gt(failures, 100); /* the loop reached the loader's allocations */
    llmem_backend_close(be);
}
END_TEST
#endif

int main(void)
{
#ifdef HOST_FAULTS
    Suite *s = suite_create("load_oom");
    TCase *tc = tcase_create("load_oom");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, every_host_allocation_fails, 0,
                        (int)(sizeof fixtures / sizeof *fixtures));
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
#else
    puts("load_oom: needs glibc without a sanitizer (interposes malloc); skipped");
    return 77;
#endif
}

// ctest-labels: core
/* Every failure of llmem_model_load has a reason (issue 18): each device
 * allocation of a load is failed in turn (fault injection through the
 * backend's alloc hook), and each load must return LLMEM_E_NO_MEMORY with a
 * non-empty message and leave nothing allocated. The llama fixture is the
 * model (tests/fixtures/llama, written by transformers).
 */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/load_faults.h"

START_TEST(test_every_allocation_failure_has_a_reason)
{
    lf_every_allocation_fails(test_fixture("llama"), 3);
}
END_TEST

/* --check-tensors: the option reaches the loader (a clean fixture loads
 * with it; test_config.c plants NaN and infinity). */
START_TEST(test_check_tensors_option)
{
    char err[512];
    llmem_backend *be = test_open("cpu");
    llmem_model_params p = llmem_model_default_params();
    ck_assert(!p.check_tensors);
    p.check_tensors = true;
    p.n_seq_max = 1;
    p.n_ctx = 32;
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(test_fixture("llama"), be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_model_free(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_errors");
    TCase *tc = tcase_create("model_errors");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_allocation_failure_has_a_reason);
    tcase_add_test(tc, test_check_tensors_option);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

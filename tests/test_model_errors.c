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

typedef struct hook_state {
    int64_t calls; /* allocations seen */
    int64_t fail_at; /* the allocation (0-based) that fails; -1: none */
} hook_state;

static bool hook(size_t size, void *ctx)
{
    hook_state *h = ctx;
    (void)size;
    return h->calls++ != h->fail_at;
}

static const char *fixture(void)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/tests/fixtures/llama", LLMEM_SOURCE_DIR);
    return p;
}

START_TEST(test_every_allocation_failure_has_a_reason)
{
    char err[512];
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, err, sizeof err), LLMEM_OK);
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = 2;
    p.n_ctx = 64;
    p.n_ubatch = 16;
    hook_state h = {0, -1};
    llmem_backend_set_alloc_hook(be, hook, &h);
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(fixture(), be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_model_free(m);
    int64_t total = h.calls;
    ck_assert_int_gt(total, 3);
    for (int64_t k = 0; k < total; k++) {
        h.calls = 0;
        h.fail_at = k;
        m = NULL;
        strcpy(err, "stale");
        llmem_status s = llmem_model_load(fixture(), be, &p, &m, err, sizeof err);
        ck_assert_msg(s == LLMEM_E_NO_MEMORY, "allocation %lld of %lld: status %d (%s)",
                      (long long)k, (long long)total, (int)s, err);
        ck_assert_ptr_null(m);
        if (getenv("LLMEM_TEST_VERBOSE"))
            printf("allocation %lld of %lld: %s\n", (long long)k, (long long)total, err);
        ck_assert_msg(err[0] && strcmp(err, "stale") != 0,
                      "allocation %lld of %lld failed without a reason", (long long)k,
                      (long long)total);
    }
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    llmem_backend_close(be);
}
END_TEST

/* --check-tensors: the option reaches the loader (a clean fixture loads
 * with it; test_config.c plants NaN and infinity). */
START_TEST(test_check_tensors_option)
{
    char err[512];
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, err, sizeof err), LLMEM_OK);
    llmem_model_params p = llmem_model_default_params();
    ck_assert(!p.check_tensors);
    p.check_tensors = true;
    p.n_seq_max = 1;
    p.n_ctx = 32;
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(fixture(), be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
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

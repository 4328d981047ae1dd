/* llmem tests: fault injection into model loads (see load_faults.h). */
#include "support/load_faults.h"

#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/runtime.h"

bool lf_alloc(size_t size, void *ctx)
{
    lf_hook *h = ctx;
    (void)size;
    return h->calls++ != h->fail_at;
}

llmem_model_params lf_params(void)
{
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = 2;
    p.n_ctx = 64;
    p.n_ubatch = 16;
    return p;
}

void lf_every_allocation_fails(const char *dir, int64_t min_allocs)
{
    char err[512];
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, err, sizeof err), LLMEM_OK);
    llmem_model_params p = lf_params();
    lf_hook h = {0, -1};
    llmem_backend_set_alloc_hook(be, lf_alloc, &h);
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_model_free(m);
    int64_t total = h.calls;
    ck_assert_int_gt(total, min_allocs);
    for (int64_t k = 0; k < total; k++) {
        h.calls = 0;
        h.fail_at = k;
        m = NULL;
        strcpy(err, "stale");
        llmem_status s = llmem_model_load(dir, be, &p, &m, err, sizeof err);
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

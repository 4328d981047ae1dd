#include <string.h>

#include "llmem/backend.h"
#include "support/run.h"

int test_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

int test_exit_status(int failed, const char *backend, const char *name)
{
    if (failed)
        return EXIT_FAILURE;
    llmem_backend *be = NULL;
    char err[512] = "";
    if (llmem_backend_open(backend, -1, &be, err, sizeof err) != LLMEM_OK) {
        printf("%s: skipped: %s\n", name, err);
        return 77;
    }
    llmem_backend_close(be);
    return EXIT_SUCCESS;
}

llmem_backend *test_open_or_skip(const char *backend)
{
    char err[512] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open(backend, -1, &be, err, sizeof err);
    if (st == LLMEM_E_NOT_FOUND) {
        printf("%s: skipped (%s)\n", backend, err);
        return NULL;
    }
    ck_assert_msg(st == LLMEM_OK, "open %s: %s: %s", backend, llmem_status_str(st), err);
    return be;
}

llmem_backend *test_open(const char *backend)
{
    char err[512] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open(backend, -1, &be, err, sizeof err);
    ck_assert_msg(st == LLMEM_OK, "open %s: %s: %s", backend, llmem_status_str(st), err);
    ck_assert_ptr_nonnull(be);
    return be;
}

llmem_backend *test_open_with(const char *backend, int n, const char *const *names,
                             const char *const *values)
{
    test_env keep[16];
    ck_assert_int_le(n, 16);
    for (int i = 0; i < n; i++)
        keep[i] = test_env_set(names[i], values[i]);
    char err[512] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open(backend, -1, &be, err, sizeof err);
    for (int i = n - 1; i >= 0; i--)
        test_env_restore(&keep[i]);
    ck_assert_msg(st == LLMEM_OK, "open %s: %s: %s", backend, llmem_status_str(st), err);
    ck_assert_ptr_nonnull(be);
    return be;
}

test_env test_env_save(const char *name)
{
    const char *v = getenv(name);
    test_env e = {name, v ? strdup(v) : NULL};
    ck_assert_msg(!v || e.value, "cannot save $%s: out of memory", name);
    return e;
}

void test_env_put(const char *name, const char *value)
{
    if (value)
        ck_assert_int_eq(setenv(name, value, 1), 0);
    else
        ck_assert_int_eq(unsetenv(name), 0);
}

test_env test_env_set(const char *name, const char *value)
{
    test_env e = test_env_save(name);
    test_env_put(name, value);
    return e;
}

void test_env_restore(test_env *e)
{
    test_env_put(e->name, e->value);
    free(e->value);
    e->value = NULL;
}

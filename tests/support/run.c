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

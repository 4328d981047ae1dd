/* Runs a Check suite (fork mode, CK_NORMAL output) and returns the number
 * of failed tests; the runner is freed. Every tests/test_*.c main uses it. */
#ifndef LLMEM_TEST_RUN_H
#define LLMEM_TEST_RUN_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int test_run_suite(Suite *s);

/* One step of a 64-bit linear congruential generator (Knuth's MMIX
 * constants) over *s: its high 31 bits, for the randomized tests that
 * replay a sequence from a seed. */
static inline uint32_t test_rand32(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* The exit status of a suite whose checks need `backend` ("cuda", ...):
 * EXIT_FAILURE when `failed` (test_run_suite's count) is not 0; else 77,
 * ctest's SKIP_RETURN_CODE, with "NAME: skipped: <why>" on stdout when
 * the backend cannot be opened here (only the checks that need no device
 * ran); else EXIT_SUCCESS. Opens and closes the backend: call it after the
 * suite, when no test forks any more. */
int test_exit_status(int failed, const char *backend, const char *name);

/* Opens `backend` at its default device for a check that needs it: NULL,
 * with "<backend>: skipped (<why>)" on stdout, when this machine has none
 * (LLMEM_E_NOT_FOUND); any other failure fails the check. The caller
 * closes what it gets. */
struct llmem_backend;
struct llmem_backend *test_open_or_skip(const char *backend);
/* Opens `backend` at its default device for a check that needs it; any
 * failure fails the check (with the library's status and message). The
 * caller closes what it gets. */
struct llmem_backend *test_open(const char *backend);

/* One environment variable as it was before a check changed it (a knob
 * the check sets for a backend it opens), to give back at the end so a
 * later check of an unforked run (CK_FORK=no) sees the environment as it
 * was. */
typedef struct test_env {
    const char *name;
    char *value; /* malloc'd copy; NULL: it was unset */
} test_env;

/* Saves variable `name` (a string that outlives the test_env); a failed
 * copy fails the check. */
test_env test_env_save(const char *name);
/* Sets variable `name` to `value`, or unsets it when value is NULL. */
void test_env_put(const char *name, const char *value);
/* test_env_save(name), then test_env_put(name, value): the saved value to
 * give back with test_env_restore. */
test_env test_env_set(const char *name, const char *value);
/* Opens `backend` at its default device with the n environment variables
 * names[i] set to values[i] (NULL: unset) while it opens (a backend reads
 * its knobs then); the variables are given back their values before it
 * returns. Any failure to open fails the check (test_open's message). */
struct llmem_backend *test_open_with(const char *backend, int n, const char *const *names,
                                     const char *const *values);
/* Gives variable e->name back the value test_env_save saw (unset if it
 * was unset) and frees the copy; e->value is NULL after. */
void test_env_restore(test_env *e);

#ifdef LLMEM_SOURCE_DIR
/* The source tree a test reads fixtures from: $LLMEM_SOURCE_DIR, else the
 * build's source folder, else the current folder when that is absent (a
 * build carried to another machine and run from a checkout's root). */
static inline const char *test_source_dir(void)
{
    const char *e = getenv("LLMEM_SOURCE_DIR");
    if (e && *e)
        return e;
    return access(LLMEM_SOURCE_DIR "/tests/fixtures", F_OK) == 0 ? LLMEM_SOURCE_DIR : ".";
}

/* test_source_dir()/tests/fixtures/name, in a buffer of the including
 * file that the next call overwrites. */
static inline const char *test_fixture(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", test_source_dir(), name);
    return path;
}
#endif

#endif

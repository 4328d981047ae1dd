/* Helpers shared by the backend suites test_backend.c (the buffer API) and
 * test_backend_registry.c (the registry and plugin loading): a seeded
 * xorshift generator ($LLMEM_TEST_SEED, default fixed), pointing
 * LLMEM_BACKEND_PATH at the test plugins tests/extra.cmake builds (found
 * beside the program when the build tree was copied elsewhere), whether
 * a plugin module is mapped (dlopen RTLD_NOLOAD), and opening a backend
 * with a failing assertion. Header-only: each suite is its own program. */
#ifndef LLMEM_TESTS_BACKEND_TEST_H
#define LLMEM_TESTS_BACKEND_TEST_H

#include <check.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/backend.h"
#include "support/run.h"

#ifndef LLMEM_TEST_PLUGIN_DIR
#define LLMEM_TEST_PLUGIN_DIR LLMEM_BUILD_DIR "/tests/plugins"
#endif

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static inline void rng_seed(uint64_t salt)
{
    const char *s = getenv("LLMEM_TEST_SEED");
    rng = (s ? strtoull(s, NULL, 0) : 0x9e3779b97f4a7c15ull) ^ (salt * 0xff51afd7ed558ccdull);
    if (rng == 0)
        rng = 1;
}

static inline uint64_t rng_next(void) /* xorshift64* */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

static inline size_t rng_below(size_t n)
{
    return n ? (size_t)(rng_next() % n) : 0;
}

static inline void rng_bytes(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rng_next() >> 56);
}

/* The folder of the test plugins: the build tree's (LLMEM_TEST_PLUGIN_DIR)
 * where it exists, else tests/plugins of the tree this program's bin/
 * folder is in (a build tree copied to another machine); sub = "/alt" gives
 * the alternate plugins' folder. The string lives until the next call. */
static inline const char *test_plugin_dir(const char *sub)
{
    static char dir[1024];
    char base[900] = LLMEM_TEST_PLUGIN_DIR;
    if (access(LLMEM_TEST_PLUGIN_DIR, F_OK) != 0) {
        char exe[800];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        char *slash = NULL;
        if (n > 0) {
            exe[n] = '\0';
            if ((slash = strrchr(exe, '/')) != NULL) /* .../bin/test_x -> .../bin */
                *slash = '\0';
            if ((slash = strrchr(exe, '/')) != NULL) /* .../bin -> ... */
                *slash = '\0';
        }
        if (slash)
            snprintf(base, sizeof base, "%s/tests/plugins", exe);
    }
    snprintf(dir, sizeof dir, "%s%s", base, sub ? sub : "");
    return dir;
}

static inline void use_test_plugins(void)
{
    /* An empty entry and a missing folder first: both must be skipped. */
    char path[1100];
    snprintf(path, sizeof path, "/nonexistent/llmem::%s", test_plugin_dir(NULL));
    ck_assert_int_eq(setenv("LLMEM_BACKEND_PATH", path, 1), 0);
}

static inline bool plugin_loaded(const char *file)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", test_plugin_dir(NULL), file);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

#endif

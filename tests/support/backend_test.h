/* Helpers shared by the backend suites test_backend.c (the buffer API) and
 * test_backend_registry.c (the registry and plugin loading): a seeded
 * xorshift generator ($LLMEM_TEST_SEED, default fixed), pointing
 * LLMEM_BACKEND_PATH at the test plugins tests/extra.cmake builds, whether
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

#include "llmem/backend.h"

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

static inline void use_test_plugins(void)
{
    /* An empty entry and a missing folder first: both must be skipped. */
    ck_assert_int_eq(setenv("LLMEM_BACKEND_PATH", "/nonexistent/llmem::" LLMEM_TEST_PLUGIN_DIR, 1),
                     0);
}

static inline bool plugin_loaded(const char *file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", LLMEM_TEST_PLUGIN_DIR, file);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

static inline llmem_backend *open_ok(const char *name)
{
    char err[512] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open(name, -1, &be, err, sizeof err);
    ck_assert_msg(st == LLMEM_OK, "open %s: %s (%s)", name, llmem_status_str(st), err);
    ck_assert_ptr_nonnull(be);
    return be;
}

#endif

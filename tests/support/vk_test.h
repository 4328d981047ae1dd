/* Helpers shared by the Vulkan plugin suites test_vulkan.c and
 * test_vulkan_ops.c: a seeded xorshift generator ($LLMEM_TEST_SEED), opening
 * a backend with a failing assertion, the "does vulkan open here" probe and
 * $LLMEM_VULKAN_LOG redirection. Header-only: each suite is its own program. */
#ifndef LLMEM_TESTS_VK_TEST_H
#define LLMEM_TESTS_VK_TEST_H

#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "llmem/ops.h"

#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define HAVE_VULKAN_H 1
#define VK_NO_PROTOTYPES
#include <dlfcn.h>
#include <vulkan/vulkan.h>
#endif
#endif

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define I32 LLMEM_DTYPE_I32
#define OK(expr) ck_assert_int_eq((expr), LLMEM_OK)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* Seeds the generator from $LLMEM_TEST_SEED when set. */
static inline void vk_test_seed(void)
{
    const char *seed = getenv("LLMEM_TEST_SEED");
    if (seed && *seed)
        g_rng = strtoull(seed, NULL, 10) | 1u;
}

static inline uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static inline float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() % 1000003u) / 1000003.0f;
}

static inline llmem_backend *open_be(const char *name)
{
    char err[256] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open(name, -1, &be, err, sizeof err);
    ck_assert_msg(st == LLMEM_OK, "open %s: %s %s", name, llmem_status_str(st), err);
    return be;
}

/* Points $LLMEM_VULKAN_LOG at a new temporary file named from tmpl. */
static inline void log_to_temp(char *tmpl)
{
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    close(fd);
    setenv("LLMEM_VULKAN_LOG", tmpl, 1);
}

/* Whether the vulkan backend opens here; when not, says so on stdout under the suite's name. */
static inline bool vulkan_opens(const char *suite, const char *what_runs)
{
    char err[256] = "";
    llmem_backend *be = NULL;
    if (llmem_backend_open("vulkan", -1, &be, err, sizeof err) != LLMEM_OK) {
        printf("%s: no usable Vulkan device (%s); %s\n", suite, err, what_runs);
        return false;
    }
    llmem_backend_close(be);
    return true;
}

#endif

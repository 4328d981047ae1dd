/* llmem tests: host allocation failure injection. Including this header
 * (in ONE translation unit of a test program) interposes malloc, calloc,
 * realloc and aligned_alloc over glibc's, so that the N-th host allocation
 * after hf_arm(N) fails -- inside libllmem, libcjson and every other
 * library the program loads, as an exhausted heap would. It defines
 * functions, not only declarations, so it is not part of the support
 * library: a static archive member defining malloc would be pulled into
 * every test program.
 *
 * Interposing needs glibc (__libc_malloc and friends) and no sanitizer
 * (ASan and MSan bring their own allocator): HOST_FAULTS is defined only
 * where it works; elsewhere a suite should exit 77 (skipped). */
#ifndef LLMEM_TEST_HOST_FAULTS_H
#define LLMEM_TEST_HOST_FAULTS_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define HOST_FAULTS_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define HOST_FAULTS_SANITIZER 1
#endif
#if defined(__GLIBC__) && !defined(HOST_FAULTS_SANITIZER)
#define HOST_FAULTS 1
#endif

#ifdef HOST_FAULTS
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t align, size_t size);

static int64_t hf_fail_at = -1; /* the allocation that fails, counted from arming; -1: none */
static int64_t hf_seen;         /* allocations since arming */

/* Whether this allocation fails; sets errno to ENOMEM then, as glibc's
 * allocator does (opendir, fopen and strdup report through it). */
static bool hf_refuse(void)
{
    if (hf_fail_at < 0 || hf_seen++ != hf_fail_at)
        return false;
    errno = ENOMEM;
    return true;
}

void *malloc(size_t size)
{
    return hf_refuse() ? NULL : __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    return hf_refuse() ? NULL : __libc_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
    return hf_refuse() ? NULL : __libc_realloc(p, size);
}

void *aligned_alloc(size_t align, size_t size)
{
    return hf_refuse() ? NULL : __libc_memalign(align, size);
}

/* From now on, allocation n (0-based) fails, and only that one. */
static inline void hf_arm(int64_t n)
{
    hf_seen = 0;
    hf_fail_at = n;
}

/* Allocations succeed again. Returns whether the armed one was reached
 * (and failed) since hf_arm. */
static inline bool hf_disarm(void)
{
    bool hit = hf_fail_at >= 0 && hf_seen > hf_fail_at;
    hf_fail_at = -1;
    return hit;
}
#endif

#endif

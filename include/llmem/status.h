/* llmem: status codes shared by every API.
 *
 * Every function that acts returns an llmem_status: 0 is success, negative
 * values are errors. Errors are local to the call; there is no global
 * "last error". Functions that can give more context take a caller-owned
 * message buffer (char *err, size_t err_len), which may be NULL.
 */
#ifndef LLMEM_STATUS_H
#define LLMEM_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The public API's visibility. libllmem is built with hidden visibility
 * by default (-fvisibility=hidden), so that only what the public headers
 * declare is exported: each header of include/llmem/ wraps its declarations
 * in LLMEM_API_BEGIN / LLMEM_API_END, which give them default visibility
 * (GCC and clang `#pragma GCC visibility`: the role of ggml's GGML_API
 * export macro, given to a whole header at once rather than to each
 * declaration). Internal functions (base/, memory/, backends/, models/
 * headers) stay hidden; plugins need none of them (the host table). In a
 * program that only includes the headers the pragma changes nothing.
 * tests/exports.py checks what libllmem.so exports. */
#if defined(__GNUC__)
#define LLMEM_API_BEGIN _Pragma("GCC visibility push(default)")
#define LLMEM_API_END _Pragma("GCC visibility pop")
#else
#define LLMEM_API_BEGIN
#define LLMEM_API_END
#endif

LLMEM_API_BEGIN

typedef enum llmem_status {
    LLMEM_OK = 0,
    LLMEM_E_INVALID = -1,      /* an argument is out of range or inconsistent */
    LLMEM_E_NO_MEMORY = -2,    /* host or device allocation failed */
    LLMEM_E_NO_SPACE = -3,     /* the memory has no free page / slot for the plan */
    LLMEM_E_UNSUPPORTED = -4,  /* the object does not implement this (NULL vtable slot) */
    LLMEM_E_NOT_FOUND = -5,    /* backend, plugin, driver, device or file missing */
    LLMEM_E_ABI = -6,          /* plugin or state file built for another ABI/format version */
    LLMEM_E_CORRUPT = -7,      /* damaged state file or checkpoint: checksum, size or magic */
    LLMEM_E_BUSY = -8,         /* a plan is in flight; release or finish it first */
    LLMEM_E_STATE = -9,        /* the operation is not valid in the current state
                                  (e.g. seq_rm to a position with no checkpoint) */
    LLMEM_E_BACKEND = -10,     /* the device or driver reported an error */
    LLMEM_E_IO = -11,          /* reading or writing a file failed */
} llmem_status;

/* Name of a status, e.g. "LLMEM_E_NO_SPACE: no free pages or state slots".
 * Returns a static string; unknown values give "unknown status". */
const char *llmem_status_str(llmem_status s);

/* The error formatter of every llmem layer: writes one printf-style line
 * into the caller's message buffer err[err_len], truncating (always
 * NUL-terminated). Does nothing when err is NULL or err_len is 0, so a
 * function can pass its optional (err, err_len) straight through. Plugins
 * reach it through the host table (<llmem/backend_impl.h>). */
void llmem_errf(char *err, size_t err_len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* llmem_errf with a va_list, for a module's own variadic wrapper (one that
 * adds a prefix or records the failure) so that it formats through the same
 * function. `ap` is consumed as by vsnprintf. */
void llmem_verrf(char *err, size_t err_len, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 0)))
#endif
    ;

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

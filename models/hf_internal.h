/* llmem models/: helpers shared by the checkpoint loader files. */
#ifndef LLMEM_MODELS_HF_INTERNAL_H
#define LLMEM_MODELS_HF_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Writes one formatted error line into err[err_len] (no-op when err is
 * NULL or err_len is 0). */
static inline void hf_errf(char *err, size_t err_len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static inline void hf_errf(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || !err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* Largest integer a JSON number (an IEEE double) holds exactly: 2^53. */
#define HF_JSON_INT_MAX 9007199254740992.0

#endif

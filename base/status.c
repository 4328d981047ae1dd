/* llmem base: status names and the one error formatter every layer uses
 * (memories, the registry, model loaders and, through the host table of
 * <llmem/backend_impl.h>, backend plugins). */
#include <stdarg.h>
#include <stdio.h>

#include "llmem/status.h"

const char *llmem_status_str(llmem_status s)
{
    switch (s) {
    case LLMEM_OK: return "LLMEM_OK: success";
    case LLMEM_E_INVALID: return "LLMEM_E_INVALID: invalid argument";
    case LLMEM_E_NO_MEMORY: return "LLMEM_E_NO_MEMORY: host or device allocation failed";
    case LLMEM_E_NO_SPACE: return "LLMEM_E_NO_SPACE: no free pages or state slots";
    case LLMEM_E_UNSUPPORTED: return "LLMEM_E_UNSUPPORTED: not supported by this object";
    case LLMEM_E_NOT_FOUND: return "LLMEM_E_NOT_FOUND: backend, plugin, driver, device or file not found";
    case LLMEM_E_ABI: return "LLMEM_E_ABI: built for another ABI or format version";
    case LLMEM_E_CORRUPT: return "LLMEM_E_CORRUPT: damaged stream or file";
    case LLMEM_E_BUSY: return "LLMEM_E_BUSY: a plan is in flight";
    case LLMEM_E_STATE: return "LLMEM_E_STATE: not valid in the current state";
    case LLMEM_E_BACKEND: return "LLMEM_E_BACKEND: device or driver error";
    case LLMEM_E_IO: return "LLMEM_E_IO: file read or write failed";
    }
    return "unknown status";
}

void llmem_verrf(char *err, size_t err_len, const char *fmt, va_list ap)
{
    if (!err || err_len == 0)
        return;
    /* An encoding error leaves err unspecified: never hand back garbage. */
    if (vsnprintf(err, err_len, fmt, ap) < 0)
        err[0] = '\0';
}

void llmem_errf(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    llmem_verrf(err, err_len, fmt, ap);
    va_end(ap);
}

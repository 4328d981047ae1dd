/* llmem: what a backend plugin module includes (for backend authors).
 *
 * A plugin (libllmem-<name>.so) calls llmem only through the host table the
 * registry passes to its entry point (llmem_host_api, <llmem/backend_impl.h>),
 * never through linked symbols: it needs no libllmem at link time and loads
 * into any host, including one that dlopened libllmem with RTLD_LOCAL
 * (Python ctypes does). This follows SQLite's loadable extensions
 * (sqlite3ext.h: SQLITE_EXTENSION_INIT1/INIT2 and the sqlite3_api macros).
 *
 * Use:
 *     #include "llmem/plugin.h"          // first llmem header of each file
 *     static const llmem_plugin my_plugin = {
 *         .abi_version = LLMEM_BACKEND_ABI_VERSION,
 *         .layout = LLMEM_BACKEND_ABI_LAYOUT,
 *         .name = "mine", .open = my_open,
 *     };
 *     LLMEM_PLUGIN_DEFINE(my_plugin)       // in exactly one file
 *
 * After this header, the llmem functions a plugin may call (llmem_status_str,
 * llmem_errf, llmem_dtype_size, llmem_dtype_name, llmem_nan_pattern,
 * llmem_buffer_size, llmem_buffer_backend, llmem_buffer_host_ptr,
 * llmem_tensor_nelements, llmem_tensor_nbytes) are macros that call through
 * the table; any other llmem_* call fails to link (the plugin links with
 * --no-undefined) or, in a plugin built without it, is caught by
 * tests/test_plugin_load.c. The table pointer is a hidden global of the
 * plugin, set once by the entry point before any other plugin code runs.
 */
#ifndef LLMEM_PLUGIN_H
#define LLMEM_PLUGIN_H

#include "llmem/backend_impl.h"
#include "llmem/ops_impl.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

#if defined(__GNUC__)
#define LLMEM_PLUGIN_HIDDEN __attribute__((visibility("hidden")))
#define LLMEM_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define LLMEM_PLUGIN_HIDDEN
#define LLMEM_PLUGIN_EXPORT
#endif

/* The host table of this plugin (set by LLMEM_PLUGIN_DEFINE's entry). */
extern LLMEM_PLUGIN_HIDDEN const llmem_host_api *llmem_plugin_host;

#define llmem_status_str (llmem_plugin_host->status_str)
#define llmem_errf (llmem_plugin_host->errf)
#define llmem_dtype_size (llmem_plugin_host->dtype_size)
#define llmem_dtype_name (llmem_plugin_host->dtype_name)
#define llmem_nan_pattern (llmem_plugin_host->nan_pattern)
#define llmem_buffer_size (llmem_plugin_host->buffer_size)
#define llmem_buffer_backend (llmem_plugin_host->buffer_backend)
#define llmem_buffer_host_ptr (llmem_plugin_host->buffer_host_ptr)
#define llmem_tensor_nelements (llmem_plugin_host->tensor_nelements)
#define llmem_tensor_nbytes (llmem_plugin_host->tensor_nbytes)

/* Defines the plugin's host-table pointer and its one exported entry point,
 * which keeps the table and returns &plugin_var (a const llmem_plugin with
 * static storage). A table smaller than this plugin needs yields NULL,
 * which the registry reports as an ABI mismatch. */
#define LLMEM_PLUGIN_DEFINE(plugin_var)                                                   \
    LLMEM_PLUGIN_HIDDEN const llmem_host_api *llmem_plugin_host;                          \
    LLMEM_PLUGIN_EXPORT const llmem_plugin *llmem_backend_plugin_entry(                   \
        const llmem_host_api *host);                                                      \
    const llmem_plugin *llmem_backend_plugin_entry(const llmem_host_api *host)            \
    {                                                                                     \
        if (!host || host->struct_size < LLMEM_HOST_API_MIN_SIZE)                         \
            return NULL;                                                                  \
        llmem_plugin_host = host;                                                         \
        return &(plugin_var);                                                             \
    }

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

/* llmem: the interface a backend implements (for backend authors).
 *
 * Modelled on ggml-backend-impl.h and sqlite3_io_methods: a const vtable
 * filled with designated initialisers, a base object whose first member is
 * the vtable pointer, and an implementation struct that embeds the base
 * object first. The vtable only grows by appending; `struct_size` says how
 * much of it an implementation fills. A NULL optional slot means
 * "unsupported" and the core returns LLMEM_E_UNSUPPORTED.
 */
#ifndef LLMEM_BACKEND_IMPL_H
#define LLMEM_BACKEND_IMPL_H

#include "llmem/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever llmem_backend_i, llmem_buffer or llmem_ops_i change in a
 * way that breaks already-built plugins. */
#define LLMEM_BACKEND_ABI_VERSION 1

struct llmem_ops_i; /* <llmem/ops_impl.h> */
struct llmem_plugin_handle;

typedef struct llmem_backend_i {
    size_t struct_size; /* sizeof(struct llmem_backend_i) the implementation was built with */

    /* Required. Frees the backend's own state (called once all buffers are gone). */
    void (*destroy)(llmem_backend *be);
    /* Required. Fills the info struct; strings owned by the backend. */
    void (*get_info)(llmem_backend *be, llmem_backend_info *info);

    /* Required. Allocates `size` > 0 bytes; sets buf->host when host visible.
     * The core has already checked arguments and the fault-injection hook. */
    llmem_status (*buffer_alloc)(llmem_backend *be, size_t size, llmem_buffer **out);
    /* Required. Frees a buffer made by buffer_alloc. */
    void (*buffer_free)(llmem_backend *be, llmem_buffer *buf);
    /* Required. Ranges are checked by the core. */
    llmem_status (*buffer_upload)(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                  const void *src, size_t size);
    llmem_status (*buffer_download)(llmem_backend *be, llmem_buffer *src, size_t offset,
                                    void *dst, size_t size);
    llmem_status (*buffer_copy)(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                                llmem_buffer *src, size_t src_offset, size_t size);
    llmem_status (*buffer_fill)(llmem_backend *be, llmem_buffer *dst, size_t offset, size_t size,
                                uint32_t pattern);
    llmem_status (*synchronize)(llmem_backend *be);

    /* Ops table (<llmem/ops_impl.h>); NULL when the backend has no ops yet. */
    const struct llmem_ops_i *ops;
} llmem_backend_i;

/* Base object. Implementations embed it as their first member. */
struct llmem_backend {
    const llmem_backend_i *iface;
    /* Set by the core: */
    const char *name;                   /* registry name */
    struct llmem_plugin_handle *plugin; /* NULL for built-in backends */
    int32_t refcount;                   /* 1 for the open handle + 1 per live buffer */
    bool closed;                        /* llmem_backend_close was called */
    llmem_alloc_hook alloc_hook;
    void *alloc_hook_ctx;
};

/* Base buffer object. Implementations embed it as their first member. */
struct llmem_buffer {
    llmem_backend *backend;
    size_t size; /* bytes */
    void *host;  /* host pointer when host visible, else NULL */
};

/* A plugin module (libllmem-<name>.so) exports exactly one symbol,
 * LLMEM_PLUGIN_ENTRY_SYMBOL, of type llmem_plugin_entry_fn. */
#define LLMEM_PLUGIN_ENTRY_SYMBOL "llmem_backend_plugin_entry"

typedef struct llmem_plugin {
    uint32_t abi_version; /* LLMEM_BACKEND_ABI_VERSION the plugin was built with */
    const char *name;     /* "cuda", "vulkan", ... */
    /* Opens device `device` (-1: default). On failure writes a one-line
     * reason to err (may be NULL). The returned object's base must have
     * iface set; the core fills the rest. */
    llmem_status (*open)(int32_t device, llmem_backend **out, char *err, size_t err_len);
    /* Optional. Lists the plugin's devices for `llmem info`; calls fn once a
     * device (or once with the reason there are none). */
    void (*list_devices)(void (*fn)(const char *line, void *ctx), void *ctx);
} llmem_plugin;

typedef const llmem_plugin *(*llmem_plugin_entry_fn)(void);

/* Helper for implementations: checked downcast from the base object. */
#define LLMEM_BACKEND_CAST(type, be, iface_ptr) \
    ((be) && (be)->iface == (iface_ptr) ? (type *)(void *)(be) : (type *)NULL)

#ifdef __cplusplus
}
#endif
#endif

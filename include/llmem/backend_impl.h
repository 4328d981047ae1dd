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
#include "llmem/view.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Bumped whenever llmem_backend_i, llmem_buffer, llmem_ops_i, the host
 * table or the entry point change in a way that breaks already-built
 * plugins. 2: the entry point takes the host table (llmem_host_api), the
 * plugin reports its struct layout (llmem_plugin.layout), the base objects
 * carry core-private fields. 3: llmem_view is open (kind id, typed
 * description pointer, desc_size) instead of a union of the known kinds.
 * 4: open ops (llmem_op_impl lists, llmem_backend_i.op_impls); the gated
 * delta net's slots left llmem_ops_i, and the slots of the ops that became
 * open ops later (short conv, Mamba-1, MoE) stay as reserved members. */
#define LLMEM_BACKEND_ABI_VERSION 4

struct llmem_ops_i; /* <llmem/ops_impl.h> */
struct llmem_comm; /* below; its vtable in <llmem/comm_impl.h> */
struct llmem_tensor; /* <llmem/ops.h> */
struct llmem_plugin_handle;

/* ---- open ops: a backend's implementations of ops outside llmem_ops_i ----
 *
 * An open op (<llmem/ops_impl.h>, "Open ops") has no slot in llmem_ops_i.
 * A backend lists its implementations instead: each source file that
 * implements one adds it to the backend's list with LLMEM_OP_IMPL, at load
 * time (a constructor of the module: libllmem for the cpu backend, the
 * plugin for the others), and the backend's vtable points at the list
 * (llmem_backend_i.op_impls). No table of the backend names the op, so a
 * new op's kernels are new files only; the build finds them by glob. */

/* A function pointer of no particular type: an implementation is stored as
 * this and cast back to its op's own type (the op header's llmem_op_*_fn)
 * by the wrapper that calls it (C11 6.3.2.3p8: a round trip through another
 * function pointer type compares equal to the original). */
typedef void (*llmem_op_fn)(void);

/* One implementation of an open op by a backend: a node of the backend's
 * list. `layout` is the op header's LLMEM_OP_*_LAYOUT as the backend was
 * compiled; the core uses the implementation only when it equals the
 * layout the core was compiled with (the op's argument structs have the
 * same shape on both sides), so a plugin built against another version of
 * an op header sees the op as absent rather than misreading its arguments. */
typedef struct llmem_op_impl {
    int32_t op;                       /* the op's id, an llmem_op (<llmem/ops.h>) */
    uint64_t layout;                  /* LLMEM_OP_*_LAYOUT of the op header */
    llmem_op_fn fn;                   /* the implementation, of the op's llmem_op_*_fn type */
    const struct llmem_op_impl *next; /* the next node; NULL ends the list */
} llmem_op_impl;

#if defined(__GNUC__)
#define LLMEM_OP_IMPL_HIDDEN __attribute__((visibility("hidden")))
#define LLMEM_OP_IMPL_CTOR __attribute__((constructor))
#else
#error "open ops register through constructors: GCC or Clang needed"
#endif

/* Defines `head`, the list of one backend's open-op implementations (one
 * per backend, beside its vtable, which sets op_impls = &head). Hidden: each
 * module has its own. */
#define LLMEM_OP_IMPL_LIST(head) LLMEM_OP_IMPL_HIDDEN const llmem_op_impl *head = NULL

/* Adds function `impl`, of type `fn_type` (the op header's llmem_op_*_fn,
 * checked by the compiler), to list `head` as the implementation of op
 * `op_id` with argument layout `op_layout`, when the module loads. Use once
 * per implementation, at file scope of the file that defines it, e.g.
 *   LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_GDN, LLMEM_OP_GDN_LAYOUT, llmem_op_gdn_fn,
 *                 cpu_op_gdn);
 * The constructors run before the module's code can be called (at
 * libllmem's load; at the plugin's dlopen, before its entry point), on one
 * thread, so the list needs no lock and is read-only afterwards. */
#define LLMEM_OP_IMPL(head, op_id, op_layout, fn_type, impl)                         \
    extern LLMEM_OP_IMPL_HIDDEN const llmem_op_impl *head;                          \
    static llmem_op_impl llmem_op_impl_##impl = {(op_id), (op_layout), NULL, NULL}; \
    static void llmem_op_impl_add_##impl(void) LLMEM_OP_IMPL_CTOR;                  \
    static void llmem_op_impl_add_##impl(void)                                      \
    {                                                                               \
        fn_type typed = impl;                                                       \
        llmem_op_impl_##impl.fn = (llmem_op_fn)typed;                               \
        llmem_op_impl_##impl.next = head;                                           \
        head = &llmem_op_impl_##impl;                                               \
    }                                                                               \
    typedef int llmem_op_impl_semicolon_##impl

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

    /* ---- appended: recorded op sequences (optional: all four or none; NULL
     * means the core re-runs the ops at each replay, see llmem_backend_record).
     * record_begin: from now until record_end, ops and buffer copies/fills
     * called on this thread are recorded, not run. record_end: stops
     * recording; on LLMEM_OK *graph is the backend's replayable object; on an
     * error (an op that cannot be recorded, e.g. one that must synchronize)
     * nothing is kept and the backend records no more. replay: runs the
     * recorded work again, in order, on the backend's queue (asynchronous as
     * ops are); LLMEM_E_STATE when something it captured has moved (the
     * caller records again). graph_free: releases it. */
    llmem_status (*record_begin)(llmem_backend *be);
    llmem_status (*record_end)(llmem_backend *be, void **graph);
    llmem_status (*graph_replay)(llmem_backend *be, void *graph);
    void (*graph_free)(llmem_backend *be, void *graph);

    /* ---- appended (issue 13): host memory and copies for the host tier
     * (optional: all four or none; NULL means llmem_backend_host_alloc
     * falls back to malloc and the _async copies to the synchronous ones).
     * host_alloc: `size` > 0 bytes of host memory the device copies to and
     * from without staging (CUDA: page-locked, cudaHostAlloc); host_free
     * frees it (after the queue has drained: the core synchronizes first).
     * buffer_upload_async / buffer_download_async: queue the copy on the
     * backend's queue, in order with ops and the other copies, and return;
     * the host memory must not be read, written or freed until
     * synchronize returns (the fence). Ranges are checked by the core. */
    llmem_status (*host_alloc)(llmem_backend *be, size_t size, void **out);
    void (*host_free)(llmem_backend *be, void *ptr);
    llmem_status (*buffer_upload_async)(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                        const void *src, size_t size);
    llmem_status (*buffer_download_async)(llmem_backend *be, llmem_buffer *src, size_t offset,
                                          void *dst, size_t size);

    /* ---- appended (issue 16): capability query (optional; NULL: every op
     * whose ops-table slot is set runs every dtype its contract allows).
     * Called by llmem_backend_supports (<llmem/ops.h>) after the core's own
     * checks (slot present, dtypes allowed by the op's contract) with op an
     * llmem_op id and the n_dtypes (>= 0) operand dtypes asked about;
     * returns false for a combination the backend's kernels refuse with
     * LLMEM_E_UNSUPPORTED. As ggml's supports_op. */
    bool (*supports_op)(llmem_backend *be, int32_t op, const llmem_dtype *dtypes,
                        int32_t n_dtypes);

    /* ---- appended (issue 19): the backend's own communicator group
     * (optional; NULL: llmem_comm_group_create uses the CPU in-process
     * one). bes[0..n) are backends of this implementation (bes[0] is the
     * one whose table is called); on LLMEM_OK comms[r] is rank r's
     * communicator over bes[r] (<llmem/comm_impl.h>); on an error none is
     * left. Statuses as llmem_comm_group_create. */
    llmem_status (*comm_group)(llmem_backend *const *bes, int32_t n, struct llmem_comm **comms,
                               char *err, size_t err_len);

    /* ---- appended (ABI 4): open ops (optional; NULL: none). The address of
     * the backend's list of open-op implementations (LLMEM_OP_IMPL_LIST),
     * read by llmem_backend_op_impl (<llmem/ops_impl.h>) each time a wrapper
     * looks an implementation up, so constructors may still be filling it
     * when the vtable is initialised. */
    const llmem_op_impl *const *op_impls;

    /* ---- appended (issue 11): batched device copies (optional; NULL:
     * llmem_buffer_copy_ranges loops over buffer_copy). Queues the n >= 1
     * copies of ranges[0..n) on the backend's queue, in order with ops and
     * the other copies, and returns (asynchronous as buffer_copy). The core
     * has checked everything llmem_buffer_copy_ranges (<llmem/backend.h>)
     * promises: every buffer is this backend's, every range lies inside its
     * buffers, no destination overlaps another range's destination or any
     * source, so the ranges may run in any order or all at once. Ranges of
     * size 0 may be present and are skipped. `ranges` is valid during the
     * call only. Returns LLMEM_OK, LLMEM_E_NO_MEMORY (host memory for the
     * range table; nothing queued) or LLMEM_E_BACKEND. While a step is being
     * recorded (record_begin) the copies are recorded like buffer_copy's. */
    llmem_status (*buffer_copy_ranges)(llmem_backend *be, const llmem_copy_range *ranges,
                                       int32_t n);

    /* Optional (NULL: the backend keeps no environment variables it read).
     * Reads again the LLMEM_* variables the backend read into its state
     * when it opened (llmem_backend_reload_env). */
    void (*reload_env)(llmem_backend *be);
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
    struct llmem_view_checks *view_checks; /* core-owned cache of checked view tables */
};

/* Base buffer object. Implementations embed it as their first member. */
struct llmem_buffer {
    llmem_backend *backend;
    size_t size; /* bytes */
    void *host;  /* host pointer when host visible, else NULL */
    /* Set by the core: a process-wide unique number taken at every write
     * through llmem_buffer_upload/copy/fill (never 0 after the first; the
     * destinations of one llmem_buffer_copy_ranges batch share one), so
     * checks of a view's index tables can be cached per write. */
    uint64_t write_gen;
};

/* Base communicator object (<llmem/comm_impl.h> has its vtable).
 * Implementations embed it as their first member. */
struct llmem_comm_i;
struct llmem_comm {
    const struct llmem_comm_i *iface;
    int32_t rank, size;
    llmem_backend *backend; /* borrowed */
};

/* Host functions a plugin may call. The registry passes one const table to
 * the plugin's entry point; a plugin calls llmem through it only and links
 * nothing of libllmem, so it loads into any host, also one that loaded
 * libllmem with RTLD_LOCAL (the pattern of SQLite's sqlite3_api_routines
 * and SQLITE_EXTENSION_INIT2). <llmem/plugin.h> maps the usual llmem_*
 * names onto it. The table only grows by appending; `struct_size` says how
 * much of it the host fills. Each slot behaves as the public function of
 * the same name. */
typedef struct llmem_host_api {
    size_t struct_size; /* sizeof(llmem_host_api) the host was built with */
    const char *(*status_str)(llmem_status s);
    void (*errf)(char *err, size_t err_len, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 3, 4)))
#endif
        ;
    size_t (*dtype_size)(llmem_dtype t);
    const char *(*dtype_name)(llmem_dtype t);
    uint32_t (*nan_pattern)(llmem_dtype t);
    size_t (*buffer_size)(const llmem_buffer *buf);
    llmem_backend *(*buffer_backend)(const llmem_buffer *buf);
    void *(*buffer_host_ptr)(llmem_buffer *buf);
    /* <llmem/ops.h> tensor helpers (llmem_tensor is declared there). */
    int64_t (*tensor_nelements)(const struct llmem_tensor *t);
    size_t (*tensor_nbytes)(const struct llmem_tensor *t);
} llmem_host_api;

/* Every slot of the ABI-2 host table: a plugin refuses a smaller table. */
#define LLMEM_HOST_API_MIN_SIZE \
    (offsetof(llmem_host_api, tensor_nbytes) + sizeof(((llmem_host_api *)0)->tensor_nbytes))

/* A plugin module (libllmem-<name>.so) exports exactly one symbol,
 * LLMEM_PLUGIN_ENTRY_SYMBOL, of type llmem_plugin_entry_fn; define it with
 * LLMEM_PLUGIN_DEFINE of <llmem/plugin.h>. */
#define LLMEM_PLUGIN_ENTRY_SYMBOL "llmem_backend_plugin_entry"

/* One term of a layout fingerprint: value v of line i, weighted by an odd
 * constant of its own (wrapping unsigned arithmetic, a constant expression). */
#define LLMEM_ABI_TERM(i, v) \
    ((uint64_t)(v) * (UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(2 * (i) + 1)))

/* Fingerprint of every struct a plugin reads or embeds directly: the base
 * objects, the backend info, the view description (<llmem/view.h>) and the
 * op argument structs (<llmem/ops.h>), by size and the offset of a late
 * member. The registry refuses a plugin whose fingerprint differs from its
 * own (LLMEM_E_ABI), so a change to any of these layouts never goes
 * unnoticed, even without a version bump. The vtables (llmem_backend_i,
 * llmem_ops_i) and the host table are not in it: they grow by appending and
 * carry struct_size. The argument structs of open ops (<llmem/ops_impl.h>)
 * are not in it: each implementation carries its op's own fingerprint
 * (llmem_op_impl.layout), so a new op touches nothing here (terms 27-30,
 * the MoE parameter structs, left with MoE in ABI 4). Terms 35-36: the
 * range struct buffer_copy_ranges reads (llmem_copy_range, issue 11). Lines
 * are only appended. Usable where <llmem/ops.h> is included (LLMEM_PLUGIN_DEFINE,
 * the registry). */
#define LLMEM_BACKEND_ABI_LAYOUT                                                    \
    (LLMEM_ABI_TERM(1, sizeof(struct llmem_backend)) +                              \
     LLMEM_ABI_TERM(2, offsetof(struct llmem_backend, view_checks)) +               \
     LLMEM_ABI_TERM(3, sizeof(struct llmem_buffer)) +                               \
     LLMEM_ABI_TERM(4, offsetof(struct llmem_buffer, write_gen)) +                  \
     LLMEM_ABI_TERM(5, sizeof(llmem_backend_info)) +                                \
     LLMEM_ABI_TERM(6, offsetof(llmem_backend_info, host_visible)) +                \
     LLMEM_ABI_TERM(7, sizeof(llmem_i32_table)) +                                   \
     LLMEM_ABI_TERM(8, offsetof(llmem_i32_table, n)) +                              \
     LLMEM_ABI_TERM(9, sizeof(llmem_state_desc)) +                                  \
     LLMEM_ABI_TERM(10, offsetof(llmem_state_desc, dtype)) +                        \
     LLMEM_ABI_TERM(11, sizeof(llmem_kv_view)) +                                    \
     LLMEM_ABI_TERM(12, offsetof(llmem_kv_view, page_off)) +                        \
     LLMEM_ABI_TERM(13, sizeof(llmem_rs_view)) +                                    \
     LLMEM_ABI_TERM(14, offsetof(llmem_rs_view, n_ckpt)) +                          \
     LLMEM_ABI_TERM(15, sizeof(llmem_view)) +                                       \
     LLMEM_ABI_TERM(16, offsetof(llmem_view, idx)) +                                \
     LLMEM_ABI_TERM(17, sizeof(struct llmem_tensor)) +                              \
     LLMEM_ABI_TERM(18, offsetof(struct llmem_tensor, ne)) +                        \
     LLMEM_ABI_TERM(19, sizeof(llmem_rope_params)) +                                \
     LLMEM_ABI_TERM(20, sizeof(llmem_attn_params)) +                                \
     LLMEM_ABI_TERM(21, sizeof(llmem_ssm_params)) +                                 \
     LLMEM_ABI_TERM(22, offsetof(llmem_ssm_params, dt_max)) +                      \
     LLMEM_ABI_TERM(23, LLMEM_TENSOR_MAX_DIMS) +                                    \
     LLMEM_ABI_TERM(24, LLMEM_STATE_MAX_DIMS) +                                     \
     LLMEM_ABI_TERM(25, sizeof(llmem_sample_params)) +                              \
     LLMEM_ABI_TERM(26, offsetof(llmem_sample_params, seed)) +                      \
     LLMEM_ABI_TERM(31, sizeof(llmem_op_impl)) +                                    \
     LLMEM_ABI_TERM(32, offsetof(llmem_op_impl, next)) +                            \
     LLMEM_ABI_TERM(33, sizeof(struct llmem_comm)) +                                \
     LLMEM_ABI_TERM(34, offsetof(struct llmem_comm, backend)) +                     \
     LLMEM_ABI_TERM(35, sizeof(llmem_copy_range)) +                                 \
     LLMEM_ABI_TERM(36, offsetof(llmem_copy_range, size)))

typedef struct llmem_plugin {
    uint32_t abi_version; /* LLMEM_BACKEND_ABI_VERSION the plugin was built with */
    uint64_t layout;      /* LLMEM_BACKEND_ABI_LAYOUT the plugin was built with */
    const char *name;     /* "cuda", "vulkan", ... */
    /* Opens device `device` (-1: default). On failure writes a one-line
     * reason to err (may be NULL). The returned object's base must have
     * iface set; the core fills the rest. */
    llmem_status (*open)(int32_t device, llmem_backend **out, char *err, size_t err_len);
    /* Optional. Lists the plugin's devices for `llmem info`; calls fn once a
     * device (or once with the reason there are none). */
    void (*list_devices)(void (*fn)(const char *line, void *ctx), void *ctx);
} llmem_plugin;

/* The entry point: keeps `host` (valid while the plugin is loaded) and
 * returns the plugin's description, or NULL when the host table is too
 * small. */
typedef const llmem_plugin *(*llmem_plugin_entry_fn)(const llmem_host_api *host);

/* Helper for implementations: checked downcast from the base object. */
#define LLMEM_BACKEND_CAST(type, be, iface_ptr) \
    ((be) && (be)->iface == (iface_ptr) ? (type *)(void *)(be) : (type *)NULL)

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

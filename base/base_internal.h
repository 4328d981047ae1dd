/* llmem base: declarations shared by the registry, the buffer wrappers and
 * the op wrappers of backends/ (internal; not installed).
 *
 * The base layer (base/) holds what memories and backends both build on:
 * status names and the error formatter (status.c), dtypes (dtype.c),
 * buffers (buffer.c), tensor descriptors (tensor.c), the backend registry
 * and plugin loader (registry.c),
 * and the checks of the view description (view.c: index tables validated
 * once per ubatch, cached per backend).
 * It includes only public headers and this one; it knows no memory and no
 * backend internals. The built-in backends are reached through the same
 * llmem_plugin description a plugin exports, declared below and defined
 * by backends/.
 */
#ifndef LLMEM_BASE_INTERNAL_H
#define LLMEM_BASE_INTERNAL_H

#include "llmem/backend_impl.h"

/* Takes one reference on a live backend (one per buffer). Returns
 * LLMEM_E_NO_MEMORY when the count would overflow. */
llmem_status llmem_backend_retain(llmem_backend *be);

/* Drops one reference; the last one destroys the backend and then unloads
 * its plugin. */
void llmem_backend_release(llmem_backend *be);

/* The built-in "cpu" backend (backends/cpu/cpu_backend.c). */
extern const llmem_plugin llmem_cpu_plugin;

/* The host table handed to every plugin's entry point (registry.c). */
extern const llmem_host_api llmem_host_table;

/* Frees the view-check cache of a backend (view.c); called by the
 * registry just before the backend's destroy. Accepts NULL. */
void llmem_view_checks_free(struct llmem_view_checks *vc);
/* Reads LLMEM_VIEW_CHECK again for be's view checks (view.c;
 * llmem_backend_reload_env). */
void llmem_view_checks_reload(llmem_backend *be);

/* ---- view checks (view.c), used by the op wrappers of backends/ops.c ----
 * Each returns LLMEM_OK, LLMEM_E_INVALID (a violated rule of <llmem/ops.h>)
 * or LLMEM_E_NO_MEMORY. A check whose inputs (the view's tables, the
 * index buffer's write generation and the bounds named) were already
 * accepted on this backend is answered from the cache: the index tables of
 * a ubatch are checked once, not once per layer and op. */

/* A KV view: dtype, pool geometry, pools of `be` and large enough. */
llmem_status llmem_view_check_kv(llmem_backend *be, const llmem_view *view);
/* store_tok in [0, n_tok), store_slot in the pools, slots distinct. */
llmem_status llmem_view_check_store(llmem_backend *be, const llmem_view *view, int32_t n_tok);
/* shift_slot in the pools and distinct; as many deltas as slots. */
llmem_status llmem_view_check_shift(llmem_backend *be, const llmem_view *view);
/* page_table, seq_len, tok_kv_len, tok_seq of a ubatch of n_tok queries. */
llmem_status llmem_view_check_attention(llmem_backend *be, const llmem_view *view,
                                        int32_t n_tok);
/* A recurrent view and its state `state`: descriptors, buffers, slot
 * tables in [-1, n_slots), no slot written by two groups. */
llmem_status llmem_view_check_rs(llmem_backend *be, const llmem_view *view, int32_t state);
/* The same, also accepting an I8 state (per-head scales; the ops that
 * implement them: ssm_scan). llmem_view_check_rs refuses I8. */
llmem_status llmem_view_check_rs_i8(llmem_backend *be, const llmem_view *view, int32_t state);
/* A table inside view->idx of `be` (n >= 0, 4-aligned, in range). */
bool llmem_view_table_ok(llmem_backend *be, const llmem_view *view, const llmem_i32_table *t);

/* out = "<folder of the loaded libllmem>/<rel>" (dladdr on the library
 * itself): where an install keeps plugins ("llmem") and data
 * ("../share/llmem"), in a build tree and after a prefix moves alike.
 * False when the folder is unknown or out[cap] is too small. */
bool llmem_lib_relative_path(const char *rel, char *out, size_t cap);

#endif

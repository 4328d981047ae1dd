/* llmem: the built-in CPU backend (internal declarations). */
#ifndef LLMEM_CPU_BACKEND_H
#define LLMEM_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/base_internal.h"
#include "llmem/backend_impl.h"

/* The CPU backend registers as a built-in plugin, llmem_cpu_plugin
 * (base/base_internal.h, defined in cpu_backend.c): its open takes device
 * -1 or 0 and returns LLMEM_OK, LLMEM_E_NOT_FOUND (another device index,
 * reason in err) or LLMEM_E_NO_MEMORY; its list_devices writes the
 * `llmem info` line, e.g. "available, 16 threads, AMD EPYC 9654 ...". */

/* $LLMEM_NORM_MATMUL_CPU_MAX_K of the CPU backend be as read when it opened
 * (or at llmem_backend_reload_env): llmem_op_norm_matmul refuses rows
 * longer than this many elements (a test knob: tests/fused_fallback.sh);
 * -1 when unset, or when be is not the CPU backend. */
int64_t cpu_norm_matmul_max_k(llmem_backend *be)
#if defined(__GNUC__)
    __attribute__((visibility("hidden")))
#endif
    ;

/* Ops table of the CPU backend (backends/cpu/cpu_ops_table.c), constant,
 * so the backend vtable that points at it is constant too. */
extern const struct llmem_ops_i llmem_cpu_ops
#if defined(__GNUC__)
    __attribute__((visibility("hidden")))
#endif
    ;

#endif

/* llmem: the built-in CPU backend (internal declarations). */
#ifndef LLMEM_CPU_BACKEND_H
#define LLMEM_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/backend_impl.h"

/* Opens the CPU backend. device must be -1 or 0.
 * Returns LLMEM_OK; LLMEM_E_NOT_FOUND (another device index, reason in
 * err); LLMEM_E_NO_MEMORY. */
llmem_status llmem_cpu_backend_open(int32_t device, llmem_backend **out, char *err,
                                    size_t err_len);

/* Writes the `llmem info` line of the CPU backend without its "cpu: "
 * prefix, e.g. "available, 16 threads, AMD EPYC 9654 96-Core Processor". */
void llmem_cpu_backend_describe(char *line, size_t len);

/* Ops table of the CPU backend (backends/cpu/cpu_ops_table.c); NULL until
 * the ops exist. */
const struct llmem_ops_i *llmem_cpu_ops_table(void);

#endif

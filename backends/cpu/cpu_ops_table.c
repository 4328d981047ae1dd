/* llmem: the CPU backend's ops table.
 * Placeholder for the foundation issue: the ops issue replaces this file
 * with the real table (<llmem/ops_impl.h>). */
#include "llmem/backend_impl.h"

const struct llmem_ops_i *llmem_cpu_ops_table(void) { return NULL; }

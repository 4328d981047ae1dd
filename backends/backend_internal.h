/* llmem: declarations shared by the registry and the buffer wrappers
 * (internal; not installed). */
#ifndef LLMEM_BACKEND_INTERNAL_H
#define LLMEM_BACKEND_INTERNAL_H

#include "llmem/backend_impl.h"

/* Takes one reference on a live backend (one per buffer). Returns
 * LLMEM_E_NO_MEMORY when the count would overflow. */
llmem_status llmem_backend_retain(llmem_backend *be);

/* Drops one reference; the last one destroys the backend and then unloads
 * its plugin. */
void llmem_backend_release(llmem_backend *be);

#endif

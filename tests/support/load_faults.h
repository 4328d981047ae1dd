/* llmem tests: fault injection into llmem_model_load through the backend's
 * alloc hook (llmem_backend_set_alloc_hook), shared by test_model_errors.c,
 * test_qwen3_next.c and test_tp.c. */
#ifndef LLMEM_TEST_LOAD_FAULTS_H
#define LLMEM_TEST_LOAD_FAULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/runtime.h"

/* The state of lf_alloc: one device allocation fails. */
typedef struct lf_hook {
    int64_t calls;   /* allocations seen */
    int64_t fail_at; /* the allocation (0-based) that fails; -1: none */
} lf_hook;

/* An alloc hook (llmem_backend_set_alloc_hook) over an lf_hook ctx: counts
 * every device allocation and refuses the fail_at-th. */
bool lf_alloc(size_t size, void *ctx);

/* The small model shape the load-fault sweeps use: n_seq_max 2, n_ctx 64,
 * n_ubatch 16, the rest llmem_model_default_params. */
llmem_model_params lf_params(void);

/* Loads the checkpoint folder dir on a fresh "cpu" backend (lf_params) once to count its device allocations (asserting
 * more than min_allocs), then again once per allocation with that one
 * failing: each load must return LLMEM_E_NO_MEMORY, leave the model NULL
 * and write a non-empty error message. Set LLMEM_TEST_VERBOSE to print
 * every message. Failures are Check assertions; the backend is closed. */
void lf_every_allocation_fails(const char *dir, int64_t min_allocs);

#endif

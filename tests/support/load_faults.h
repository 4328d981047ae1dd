/* llmem tests: fault injection into llmem_model_load through the backend's
 * alloc hook (llmem_backend_set_alloc_hook), shared by test_model_errors.c
 * and test_qwen3_next.c. */
#ifndef LLMEM_TEST_LOAD_FAULTS_H
#define LLMEM_TEST_LOAD_FAULTS_H

#include <stdint.h>

#include "llmem/runtime.h"

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

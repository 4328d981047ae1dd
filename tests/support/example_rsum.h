/* An example cache type defined outside llmem's core (docs/adding-a-cache-
 * type.md): the "running sum" state, the simplest linear recurrence
 * (linear attention without decay, k = v = 1): per sequence and layer one
 * slot of `dim` f32 that holds the sum of every input row the sequence has
 * seen. It is built only against the public headers <llmem/memory.h> and
 * <llmem/memory_impl.h>, brings its own view kind (a four-character tag)
 * and its own kernel, and is driven, composed (llmem_hybrid_create) and
 * checked like the built-in memories. Tests: tests/test_example_cache.c.
 */
#ifndef LLMEM_TEST_EXAMPLE_RSUM_H
#define LLMEM_TEST_EXAMPLE_RSUM_H

#include "llmem/memory.h"

/* The view kind of this cache: no registration, only a tag of its own. */
#define RSUM_VIEW_KIND LLMEM_VIEW_KIND_TAG('r', 's', 'u', 'm')

/* What its kernel sees of one layer for the current ubatch (EQUAL split:
 * n_seqs groups of n_seq_tokens rows, group-major). state is
 * [n_slots][dim] f32; group s reads and then writes slot slot[s]. */
typedef struct rsum_view {
    llmem_buffer *state;
    int32_t dim, n_slots;
    int32_t n_seqs, n_seq_tokens;
    llmem_i32_table slot; /* [n_seqs], in llmem_view.idx */
} rsum_view;

/* Creates the memory: n_layers layers of one [n_seq_max][dim] f32 state
 * buffer each on `be` (zeroed); sequence s owns slot s. Split EQUAL; no
 * K-shift; a token shared by several sequences is refused at plan time.
 * Returns LLMEM_OK, LLMEM_E_INVALID (bad sizes, with err), LLMEM_E_NO_MEMORY,
 * or the buffer allocation's status. The memory owns its buffers;
 * llmem_memory_destroy frees them. */
llmem_status rsum_create(llmem_backend *be, int32_t n_layers, int32_t n_seq_max, int32_t dim,
                         llmem_memory **out, char *err, size_t err_len);

/* The kernel, on host copies (any backend): for each group s and row t,
 * out[row] = state[slot[s]] + x[group rows 0..t] summed, then the group's
 * slot holds its last out row. x, out: [n_seqs * n_seq_tokens][dim] f32
 * host arrays. Returns LLMEM_E_INVALID for a view of another kind (or a
 * slot out of range), else the buffer transfers' status. */
llmem_status rsum_kernel(const llmem_view *view, const float *x, float *out);

#endif

/* llmem: batches, the caller's unit of work.
 *
 * A batch lists tokens (or embeddings), their positions, the sequences each
 * token belongs to, and which tokens need an output row (logits). The
 * memory's plan splits it into ubatches (<llmem/memory.h>).
 *
 * The struct can point at caller-owned arrays directly, or be built with
 * llmem_batch_create/llmem_batch_add, which own their arrays.
 * Reference: llama.cpp's llama_batch (same fields, same meaning).
 */
#ifndef LLMEM_BATCH_H
#define LLMEM_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef struct llmem_batch {
    int32_t n_tokens;          /* tokens in the batch, >= 1 */
    const int32_t *token;      /* [n_tokens] token ids, or NULL when embd is used */
    const float *embd;         /* [n_tokens][n_embd] f32 embeddings, or NULL */
    int32_t n_embd;            /* row length of embd (elements) */
    const int32_t *pos;        /* [n_tokens] positions (tokens), >= 0 */
    const int32_t *n_seq_id;   /* [n_tokens] number of sequence ids of each token (>= 1); NULL: 1 each */
    const int32_t *const *seq_id; /* [n_tokens][n_seq_id[i]] sequence ids in [0, n_seq_max).
                                     A token in several sequences is computed once, in
                                     the context of the first; the caller guarantees the
                                     sequences hold the same history (e.g. all empty
                                     before a shared system prompt). */
    const int8_t *output;      /* [n_tokens] 1 = this token needs an output row; NULL: last token only */
} llmem_batch;

/* An owning batch builder (like llama_batch_init). */
typedef struct llmem_batch_buf llmem_batch_buf;

/* Creates a builder for up to n_tokens_max tokens, each in up to
 * n_seq_per_token_max sequences. Caller owns it (llmem_batch_buf_destroy).
 * Returns LLMEM_E_INVALID (non-positive sizes), LLMEM_E_NO_MEMORY. */
llmem_status llmem_batch_buf_create(int32_t n_tokens_max, int32_t n_seq_per_token_max,
                                    llmem_batch_buf **out);
void llmem_batch_buf_destroy(llmem_batch_buf *b); /* accepts NULL */
/* Empties the builder (keeps its capacity). */
void llmem_batch_buf_clear(llmem_batch_buf *b);
/* Appends one token at `pos` in the n_seq sequences `seq_ids`.
 * Returns LLMEM_E_NO_SPACE when full, LLMEM_E_INVALID for n_seq outside
 * [1, n_seq_per_token_max]. */
llmem_status llmem_batch_buf_add(llmem_batch_buf *b, int32_t token, int32_t pos,
                                 const int32_t *seq_ids, int32_t n_seq, bool output);
/* The batch view of the builder; valid until the next add/clear/destroy. */
const llmem_batch *llmem_batch_buf_get(llmem_batch_buf *b);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

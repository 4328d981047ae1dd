/* llmem memory/: the owning batch builder (llmem_batch_buf). */
#include <stdlib.h>

#include "llmem/batch.h"

struct llmem_batch_buf {
    llmem_batch batch;
    int32_t cap, seq_cap;
    int32_t *token, *pos, *n_seq_id;
    int32_t **seq_id;
    int32_t *seq_store;
    int8_t *output;
};

llmem_status llmem_batch_buf_create(int32_t n_tokens_max, int32_t n_seq_per_token_max,
                                    llmem_batch_buf **out)
{
    if (!out || n_tokens_max <= 0 || n_seq_per_token_max <= 0)
        return LLMEM_E_INVALID;
    *out = NULL;
    llmem_batch_buf *b = calloc(1, sizeof *b);
    if (!b)
        return LLMEM_E_NO_MEMORY;
    size_t n = (size_t)n_tokens_max;
    b->token = malloc(n * sizeof *b->token);
    b->pos = malloc(n * sizeof *b->pos);
    b->n_seq_id = malloc(n * sizeof *b->n_seq_id);
    b->seq_id = malloc(n * sizeof *b->seq_id);
    b->seq_store = malloc(n * (size_t)n_seq_per_token_max * sizeof *b->seq_store);
    b->output = malloc(n * sizeof *b->output);
    if (!b->token || !b->pos || !b->n_seq_id || !b->seq_id || !b->seq_store || !b->output) {
        llmem_batch_buf_destroy(b);
        return LLMEM_E_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        b->seq_id[i] = b->seq_store + i * (size_t)n_seq_per_token_max;
    b->cap = n_tokens_max;
    b->seq_cap = n_seq_per_token_max;
    b->batch.token = b->token;
    b->batch.pos = b->pos;
    b->batch.n_seq_id = b->n_seq_id;
    b->batch.seq_id = (const int32_t *const *)b->seq_id;
    b->batch.output = b->output;
    *out = b;
    return LLMEM_OK;
}

void llmem_batch_buf_destroy(llmem_batch_buf *b)
{
    if (!b)
        return;
    free(b->token);
    free(b->pos);
    free(b->n_seq_id);
    free(b->seq_id);
    free(b->seq_store);
    free(b->output);
    free(b);
}

void llmem_batch_buf_clear(llmem_batch_buf *b)
{
    if (b)
        b->batch.n_tokens = 0;
}

llmem_status llmem_batch_buf_add(llmem_batch_buf *b, int32_t token, int32_t pos,
                                 const int32_t *seq_ids, int32_t n_seq, bool output)
{
    if (!b || !seq_ids || n_seq < 1 || n_seq > b->seq_cap)
        return LLMEM_E_INVALID;
    if (b->batch.n_tokens >= b->cap)
        return LLMEM_E_NO_SPACE;
    int32_t i = b->batch.n_tokens++;
    b->token[i] = token;
    b->pos[i] = pos;
    b->n_seq_id[i] = n_seq;
    for (int32_t j = 0; j < n_seq; j++)
        b->seq_id[i][j] = seq_ids[j];
    b->output[i] = output ? 1 : 0;
    return LLMEM_OK;
}

const llmem_batch *llmem_batch_buf_get(llmem_batch_buf *b)
{
    return b ? &b->batch : NULL;
}

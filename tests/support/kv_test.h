/* Helpers of the KV cache suites (tests/test_kv_cache.c,
 * tests/test_kv_sharing.c, tests/test_kv_abandon.c): a sequence's page count, a
 * forward pass that stores each token's id as its K, and reading a stored
 * K back through a state write of the sequence. */
#ifndef LLMEM_TEST_KV_TEST_H
#define LLMEM_TEST_KV_TEST_H

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

static inline int32_t n_pages_of(llmem_memory *m, int32_t seq)
{
    return llmem_kv_cache_page_table(m, seq, NULL, 0);
}

/* Writes a recognisable value per (token id) into every stored slot. */
static inline void write_tokens(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    for (int32_t j = 0; j < llmem_view_kv(&v)->store_slot.n; j++) {
        float val[2] = {(float)ub->token[llmem_view_kv(&v)->store_tok.host[j]], 1.0f};
        ck_assert_int_eq(llmem_buffer_upload(llmem_view_kv(&v)->k, (size_t)llmem_view_kv(&v)->store_slot.host[j] * 8, val, 8),
                         LLMEM_OK);
    }
}

/* K of token i of seq, read through a state write of the sequence (its
 * rows follow the sequence's tokens, independent of the page layout). */
static inline float slot_value(llmem_memory *m, int32_t seq, int32_t i)
{
    size_t sz = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, seq, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(m, seq, buf, sz, NULL), LLMEM_OK);
    int32_t len = llmem_memory_seq_len(m, seq);
    /* header 16 + section header 16 + geometry 20 + id, len, share_from,
     * shared_len 16 + tokens + pos + shift (docs/state-format.md) */
    size_t off = 16 + 16 + 20 + 16 + (size_t)len * 12 + (size_t)i * 8;
    float f;
    memcpy(&f, buf + off, 4);
    free(buf);
    return f;
}

#endif

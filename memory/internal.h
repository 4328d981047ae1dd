/* llmem memory/: helpers shared by the memory implementations (not public). */
#ifndef LLMEM_MEMORY_INTERNAL_H
#define LLMEM_MEMORY_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/memory_impl.h"

/* Growable int32 array: malloc-backed when cap >= 0; cap < 0 marks one
 * backed by a seq heap (seq_heap.h) with capacity -cap. Both grow through
 * i32vec_reserve and are freed by i32vec_free. */
typedef struct i32vec {
    int32_t *v;
    int32_t n, cap;
} i32vec;

bool i32vec_reserve(i32vec *a, int32_t cap);
/* memcpy of n int32 that accepts NULL pointers when n is 0 (memcpy does not). */
void i32_copy(int32_t *dst, const int32_t *src, int32_t n);
bool i32vec_push(i32vec *a, int32_t x);
void i32vec_free(i32vec *a);

/* What a sequence holds, shared by every memory that keeps token ids and
 * positions on the host: a copy of up to cap token ids (returns the count). */
int32_t seq_copy_tokens(const i32vec *tokens, int32_t *out, int32_t cap);

/* O(1) facts about a sequence's positions (DESIGN.md contract 9): smallest
 * and largest (-1 when empty) and whether they are out of order. Appends
 * always come at pos_max + 1 (plan validation), so positions stay
 * nondecreasing until a seq_add / seq_div reorders them; while they are in
 * order, range lookups are binary searches. */
typedef struct pos_meta {
    int32_t min, max;
    bool unsorted;
} pos_meta;

/* Recomputes m from every position (O(n): shifts, state reads, checks). */
void pos_meta_reset(pos_meta *m, const i32vec *pos);
/* After appending `pos` (O(1)). */
void pos_meta_push(pos_meta *m, int32_t pos);
/* After pos->n shrank (O(1) in order, else O(n)). */
void pos_meta_truncated(pos_meta *m, const i32vec *pos);
/* Index of the first token with a position in [p0, p1) when those tokens
 * are a suffix, n when there are none, -1 when they are not a suffix. */
int32_t pos_suffix_start(const i32vec *pos, const pos_meta *m, int32_t p0, int32_t p1);
/* Number of leading tokens with a position in [p0, p1) when those are all
 * such tokens (0 when none), -1 otherwise. */
int32_t pos_prefix_len(const i32vec *pos, const pos_meta *m, int32_t p0, int32_t p1);
/* Whether m describes pos (for invariant checks). */
bool pos_meta_ok(const pos_meta *m, const i32vec *pos);
static inline bool pos_in_range(int32_t pos, int32_t p0, int32_t p1)
{
    return pos >= p0 && pos < p1;
}

/* Hint that the next append to v will soon be made: with thousands of
 * sequences their arrays' tails are cache (and TLB) misses, and fetching
 * a few sequences ahead hides them. */
static inline void i32vec_prefetch_tail(const i32vec *v)
{
#if defined(__GNUC__)
    if (v->v)
        __builtin_prefetch(v->v + v->n, 1, 1);
#else
    (void)v;
#endif
}

/* snprintf into an optional caller buffer. */
void llmem_errf(char *err, size_t err_len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Index tables of views: built on the host for every ubatch of a plan at
 * reserve time, then uploaded once into one device buffer the memory keeps
 * (grown, never shrunk). */
typedef struct idx_builder {
    i32vec data;
} idx_builder;

/* Appends n values (or n copies of `fill` when vals is NULL) and returns
 * their element offset. */
int32_t idx_append(idx_builder *b, const int32_t *vals, int32_t n, int32_t fill);

/* Makes *buf hold at least n int32 (allocating a new buffer before freeing
 * the old one, so a failure leaves *buf as it was). */
llmem_status idx_ensure(llmem_backend *be, llmem_buffer **buf, int32_t n);
/* Uploads the built tables into *buf (which idx_ensure sized). */
llmem_status idx_upload(llmem_buffer *buf, const idx_builder *b);

/* A table of a view from an element offset of a built index. */
llmem_i32_table idx_table(const idx_builder *b, int32_t off, int32_t n);

/* Poison mode requested by environment (LLMEM_POISON=1). */
bool llmem_env_poison(void);



/* plan.c */
llmem_status llmem_plan_build_internal(llmem_memory *mem, const llmem_batch *b, llmem_split split,
                                       int32_t n_ubatch, llmem_plan **out, char *err,
                                       size_t err_len);
void llmem_plan_free_internal(llmem_plan *p);
#endif

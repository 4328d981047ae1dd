/* llmem memory/: helpers shared by the memory implementations (not public). */
#ifndef LLMEM_MEMORY_INTERNAL_H
#define LLMEM_MEMORY_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/memory_impl.h"

/* The implementation helpers are public (<llmem/memory_impl.h>); the
 * built-in memories use them under these short names. */
typedef llmem_i32vec i32vec;
typedef llmem_pos_meta pos_meta;
typedef llmem_idx_builder idx_builder;
#define i32vec_reserve llmem_i32vec_reserve
#define i32vec_free llmem_i32vec_free
#define i32_copy llmem_i32_copy
#define seq_copy_tokens llmem_seq_copy_tokens
#define pos_meta_reset llmem_pos_meta_reset
#define pos_meta_truncated llmem_pos_meta_truncated
#define pos_suffix_start llmem_pos_suffix_start
#define pos_prefix_len llmem_pos_prefix_len
#define pos_meta_ok llmem_pos_meta_ok
#define idx_append llmem_idx_append
#define idx_ensure llmem_idx_ensure
#define idx_upload llmem_idx_upload
#define idx_table llmem_idx_table

/* llmem_i32vec_push with its common case inline: room is left (a
 * heap-backed vector's cap is minus its capacity). A decode step appends
 * to every sequence's arrays, and the call through the PLT cost more than
 * the append (perf: 5% of a 4,000-sequence step). */
static inline bool i32vec_push(i32vec *a, int32_t x)
{
    int32_t cap = a->cap < 0 ? -a->cap : a->cap;
    if (a->n < cap) {
        a->v[a->n++] = x;
        return true;
    }
    return llmem_i32vec_push(a, x);
}

/* llmem_pos_meta_push (which calls it), inline: every commit appends a
 * position to every sequence it names, and the call through the PLT cost
 * a reload of the commit loop's state after it as well as the call. */
static inline void pos_meta_push(pos_meta *m, int32_t pos)
{
    if (m->max >= 0 && pos < m->max)
        m->unsorted = true;
    if (m->min < 0 || pos < m->min)
        m->min = pos;
    if (pos > m->max)
        m->max = pos;
}

static inline bool pos_in_range(int32_t pos, int32_t p0, int32_t p1)
{
    return pos >= p0 && pos < p1;
}

/* For helpers whose only effect is a prefetch: GCC deems such a function
 * pure (a prefetch has no side effect) and deletes calls to it that it has
 * not inlined yet, prefetch included; forced inlining keeps it. */
#if defined(__GNUC__)
#define LLMEM_PREFETCH_FN static inline __attribute__((always_inline))
#else
#define LLMEM_PREFETCH_FN static inline
#endif

/* Hint that the next append to v will soon be made: with thousands of
 * sequences their arrays' tails are cache (and TLB) misses, and fetching
 * a few sequences ahead hides them. */
LLMEM_PREFETCH_FN void i32vec_prefetch_tail(const i32vec *v)
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

/* plan.c */
llmem_status llmem_plan_build_internal(llmem_memory *mem, const llmem_batch *b, llmem_split split,
                                       int32_t n_ubatch, llmem_plan **out, char *err,
                                       size_t err_len);
void llmem_plan_free_internal(llmem_plan *p);
#endif

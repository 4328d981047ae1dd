/* llmem memory/: a sequence's positions, kept as a run while they are one.
 *
 * Plans append each token of a sequence at pos_max + 1 (plan validation),
 * so until a seq_add / seq_div, a removal from the middle or a state read
 * of other positions, a sequence's positions are first, first + 1, ...,
 * first + n - 1. While they are, nothing is stored per token: position j
 * is pm.min + j. A decode step then appends to one per-sequence array
 * (token ids) instead of two, one cache line fewer per sequence and step
 * (at thousands of sequences each tail line is a miss), and a sequence's
 * host bookkeeping is 4 bytes per token instead of 8. The first change
 * that breaks the run stores the positions (seq_pos_store, O(n), once) and
 * from then on they are an array as before.
 *
 * v.n is the number of positions in both forms (= the sequence's token
 * count); while `stored` is false, v.v holds nothing (it may be shorter
 * than v.n). A zero-initialised seq_pos is not valid: seq_pos_clear it. */
#ifndef LLMEM_SEQ_POS_H
#define LLMEM_SEQ_POS_H

#include "memory/internal.h"

typedef struct seq_pos {
    i32vec v;    /* stored positions (v.n: the count, in both forms) */
    pos_meta pm; /* min = the first position of a run, -1 when empty */
    bool stored; /* false: positions are the run pm.min, pm.min + 1, ... */
} seq_pos;

/* Position of token j (0 <= j < v.n). */
static inline int32_t seq_pos_at(const seq_pos *p, int32_t j)
{
    return p->stored ? p->v.v[j] : p->pm.min + j;
}

/* Makes the positions the run first, ..., first + n - 1 (n >= 0); no
 * allocation. */
static inline void seq_pos_set_run(seq_pos *p, int32_t n, int32_t first)
{
    p->stored = false;
    p->v.n = n;
    p->pm = n > 0 ? (pos_meta){first, first + n - 1, false} : (pos_meta){-1, -1, false};
}

/* No positions (a run of none). */
static inline void seq_pos_clear(seq_pos *p)
{
    seq_pos_set_run(p, 0, 0);
}

/* Stores a run's positions in v with room for `extra` more (no-op when
 * stored). Returns false, nothing changed, when out of host memory. */
bool seq_pos_store(seq_pos *p, int32_t extra);

/* Room for cap stored positions (also in a run, whose v may be shorter
 * than v.n: reserve v, never i32vec_reserve it directly). false,
 * nothing changed, when out of host memory. */
bool seq_pos_reserve(seq_pos *p, int32_t cap);

/* Appends position x; false (nothing changed) when out of host memory.
 * Inline: a decode step appends one position per sequence. */
static inline bool seq_pos_push(seq_pos *p, int32_t x)
{
    if (!p->stored) {
        if (p->v.n == 0 || x == p->pm.max + 1) {
            p->v.n++;
            pos_meta_push(&p->pm, x);
            return true;
        }
        if (!seq_pos_store(p, 1))
            return false;
    }
    if (!i32vec_push(&p->v, x))
        return false;
    pos_meta_push(&p->pm, x);
    return true;
}

/* Room for n seq_pos_push calls of first, first + 1, ... that cannot
 * fail (tok_stage_reserve's reason): none while they continue a run,
 * stored room otherwise. false, with only the capacity possibly changed,
 * when out of host memory. Inline: a decode step calls it per sequence. */
static inline bool seq_pos_reserve_push(seq_pos *p, int32_t n, int32_t first)
{
    int64_t want = (int64_t)p->v.n + n, cap = p->v.cap < 0 ? -(int64_t)p->v.cap : p->v.cap;
    if (p->stored ? want <= cap : p->v.n == 0 || (int64_t)first == (int64_t)p->pm.max + 1)
        return true;
    return want <= INT32_MAX && seq_pos_reserve(p, (int32_t)want);
}

/* Keeps the first k positions (0 <= k <= v.n). */
void seq_pos_truncate(seq_pos *p, int32_t k);
/* Makes the positions a copy of src[0, n) (a run when they are one: no
 * allocation then). false, nothing changed, when out of host memory. */
bool seq_pos_assign(seq_pos *p, const int32_t *src, int32_t n);
/* Positions were written into v.v[0, n) (room reserved with
 * seq_pos_reserve): they become the positions, as a run when they are one. */
void seq_pos_written(seq_pos *p, int32_t n);
/* Makes dst's positions the first k of src's. false, dst unchanged, when
 * out of host memory. */
bool seq_pos_copy_prefix(seq_pos *dst, const seq_pos *src, int32_t k);
/* Copies positions [0, n) into out[0, n) (n <= v.n). */
void seq_pos_get(const seq_pos *p, int32_t *out, int32_t n);
/* Writes the n first positions into a state stream (int32 each). */
void seq_pos_put(const seq_pos *p, llmem_state_writer *w, int32_t n);
/* pos_suffix_start / pos_prefix_len (memory_impl.h) of these positions. */
int32_t seq_pos_suffix_start(const seq_pos *p, int32_t p0, int32_t p1);
int32_t seq_pos_prefix_len(const seq_pos *p, int32_t p0, int32_t p1);
/* After stored positions were rewritten in place: pm from them. */
void seq_pos_meta_reset(seq_pos *p);
/* Whether pm (and a run's form) describes the positions, none negative
 * (for llmem_memory_i.check). */
bool seq_pos_ok(const seq_pos *p);

#endif

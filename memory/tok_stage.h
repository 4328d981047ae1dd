/* llmem memory/: staged token appends.
 *
 * A decode step appends one token id to every sequence's token array. At
 * thousands of sequences each array's tail is a cache line of its own (a
 * miss per sequence and step), and at 64K tokens and more each tail also
 * sits in its own huge page (a TLB miss). A memory that keeps one
 * tok_stage per sequence in a dense, line-aligned array walked in sequence
 * order appends there instead (tok_stage_push), and writes the array's
 * tail once every TOK_STAGE tokens.
 *
 * Sequences that decode in step at equal lengths (samples of one prompt,
 * copies of one sequence) write their tails in the same step, once in
 * TOK_STAGE steps; at 4,000 sequences and 64K tokens, where each tail is
 * also a TLB miss, that step takes several times the median one (the
 * recurrent memory 3-4x, the hybrid, whose KV pages fill in step too,
 * more: docs/benchmarks.md, book16). With
 * LLMEM_TOK_STAGE_SPREAD=1 (read when a memory is created) a stage is
 * also written when its length plus its sequence's id is a multiple of
 * TOK_STAGE (tok_stage_push's phase), so each step writes about one
 * sequence in TOK_STAGE: the longest step ~3x shorter, but the median and
 * the mean step longer (the tails' misses no longer come in one burst),
 * hence off by default. What is stored is the same either way.
 *
 * The sequence's i32vec t counts the staged ids: t->v[t->n - g->n, t->n)
 * are g->tok[0, g->n), and t has room for them (t->n <= capacity), so a
 * count of tokens reads t->n as before. Code that reads token values calls
 * tok_stage_sync first (or reads through tok_stage_at); code that sets t->n
 * other than by tok_stage_push / tok_stage_pop syncs first, or empties the
 * stage (g->n = 0) when it replaces every token. Like the memory, one
 * thread at a time. */
#ifndef LLMEM_TOK_STAGE_H
#define LLMEM_TOK_STAGE_H

#include <stdlib.h>
#include <string.h>

#include "memory/internal.h"

#define TOK_STAGE 15 /* ids per stage: with the count, one 64-byte line */

typedef struct tok_stage {
    int32_t n;
    int32_t tok[TOK_STAGE];
} tok_stage;

/* Writes g's ids into t's array; g is empty afterwards. */
static inline void tok_stage_sync(tok_stage *g, const i32vec *t)
{
    if (g->n > 0) {
        i32_copy(t->v + t->n - g->n, g->tok, g->n);
        g->n = 0;
    }
}

/* Appends id x to t through g; false (nothing changed) when t cannot grow
 * (out of host memory). The stage is written into t before the append
 * when full, when t is, and, for a phase >= 0 (the sequence's id when
 * spreading, else -1), when t->n + phase is a multiple of TOK_STAGE. */
static inline bool tok_stage_push(tok_stage *g, i32vec *t, int32_t x, int32_t phase)
{
    int32_t cap = t->cap < 0 ? -t->cap : t->cap;
    if (g->n == TOK_STAGE || t->n >= cap ||
        (phase >= 0 && g->n > 0 && ((uint32_t)t->n + (uint32_t)phase) % TOK_STAGE == 0)) {
        tok_stage_sync(g, t);
        if (t->n >= cap && !i32vec_reserve(t, t->n + 1))
            return false;
    }
    g->tok[g->n++] = x;
    t->n++;
    return true;
}

/* Room in t for n more ids (staged ones count), so that the next n
 * tok_stage_push calls cannot fail: a plan reserves what its commits
 * append, and a commit then needs no host memory (a composition could not
 * undo a child that committed before another failed). false, with only
 * t's capacity possibly changed, when out of host memory. Inline: a decode
 * step reserves for every sequence, one comparison while there is room. */
static inline bool tok_stage_reserve(i32vec *t, int32_t n)
{
    int64_t want = (int64_t)t->n + n;
    if (want <= (t->cap < 0 ? -(int64_t)t->cap : t->cap))
        return true;
    return want <= INT32_MAX && i32vec_reserve(t, (int32_t)want);
}

/* Whether LLMEM_TOK_STAGE_SPREAD asks for stages written by phase (set,
 * not "0"); a memory reads it once, when created. */
static inline bool tok_stage_spread_env(void)
{
    const char *s = getenv("LLMEM_TOK_STAGE_SPREAD");
    return s && *s && strcmp(s, "0") != 0;
}

/* Takes back the id tok_stage_push just appended. */
static inline void tok_stage_pop(tok_stage *g, i32vec *t)
{
    g->n--;
    t->n--;
}

/* Token j (0 <= j < t->n), staged or not. */
static inline int32_t tok_stage_at(const tok_stage *g, const i32vec *t, int32_t j)
{
    int32_t first = t->n - g->n;
    return j >= first ? g->tok[j - first] : t->v[j];
}

/* Whether g's count is consistent with t's (for the memories' checks). */
static inline bool tok_stage_ok(const tok_stage *g, const i32vec *t)
{
    return g->n >= 0 && g->n <= TOK_STAGE && g->n <= t->n;
}

#endif

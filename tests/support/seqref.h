/* A generic sequence-level reference for any memory, reached through the
 * public interface only (<llmem/memory.h>): what each sequence holds
 * (token ids and positions), predicted for every plan and sequence
 * operation from the semantics the memory's kind declares, and compared
 * after every step together with llmem_memory_check. Refused operations
 * must leave the memory exactly as it was.
 *
 * A cache type joins the randomized test (tests/test_memory_generic.c) by
 * declaring its semantics (seqref_semantics); a composition's are the
 * strictest of its children's (seqref_combine). The detailed references of
 * the built-in memories (memref.h: pages, slots, prefix hits, data tags)
 * sit on top of this for KV caches and recurrent memories.
 */
#ifndef LLMEM_TEST_SEQREF_H
#define LLMEM_TEST_SEQREF_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/llmem.h"

/* Which suffixes of a sequence the memory can remove (contract 5). */
typedef enum seqref_cut {
    SEQREF_CUT_ANY = 0,        /* a per-token cache (KV): any suffix */
    SEQREF_CUT_CHECKPOINT = 1, /* per-sequence state with checkpoints (recurrent): a
                                  suffix when a checkpoint sits at its start, so
                                  either answer is valid and must be all-or-nothing */
    SEQREF_CUT_WHOLE = 2,      /* a running state without checkpoints: only the
                                  whole sequence */
} seqref_cut;

typedef struct seqref_semantics {
    seqref_cut cut;
    bool copy_prefix;  /* seq_cp of a proper prefix works (else: whole sequences) */
    bool shift;        /* seq_add / seq_div are supported */
    bool may_fill;     /* plans and copies may fail for lack of space (LLMEM_E_NO_SPACE) */
    int32_t n_kinds;
    llmem_view_kind kinds[4]; /* the view kinds its layers show */
    /* Recurrent views (LLMEM_VIEW_RECURRENT, f32 states): at every apply the
     * reference reads the tag in each group's src slot (first and last f32
     * of every state of every layer; 0 for src -1, the zero state), checks
     * it names the tokens the sequence holds before the group, and writes
     * the tags of the longer prefixes into the dst and checkpoint slots the
     * view names. Slot, checkpoint, copy and rollback bookkeeping is then
     * checked through the public view tables, whatever the state layout. */
    bool state_tags;
} seqref_semantics;

/* The strictest of a and b (for a composition). */
seqref_semantics seqref_combine(seqref_semantics a, seqref_semantics b);

typedef struct seqref seqref;

/* A reference for mem (empty, n_seq_max <= 16) with semantics sem. */
seqref *seqref_create(llmem_memory *mem, const seqref_semantics *sem);
void seqref_destroy(seqref *r);

/* One random step (an append batch, seq_rm, seq_cp, seq_keep, seq_add,
 * seq_div or clear), run on the memory and predicted by the reference;
 * then every sequence is compared and llmem_memory_check must pass.
 * rng: the caller's state. Fails the Check test on a mismatch, naming the
 * step. */
void seqref_step(seqref *r, uint64_t *rng);

/* A content check a cache type can add (seqref_set_state_check): called
 * at every apply for each layer whose view is LLMEM_VIEW_RECURRENT, after
 * the state_tags check, with prefix[g] / prefix_n[g] the token ids the
 * sequence of ubatch group g holds before the group (what its src state
 * must encode); e.g. it runs the kind's op through the view on the cpu
 * backend and compares the output with a float64 recurrence over the
 * prefix and the group's tokens. Fails the Check test on a mismatch. */
typedef void (*seqref_state_fn)(void *ctx, const llmem_ubatch *ub, const llmem_view *view,
                                int32_t layer, const int32_t *const *prefix,
                                const int32_t *prefix_n);
void seqref_set_state_check(seqref *r, seqref_state_fn fn, void *ctx);

/* Counts of what the steps did, so a test can assert they covered ground. */
typedef struct seqref_counts {
    int32_t plans_ok, plans_full, cuts_ok, cuts_refused, copies, shifts;
    int32_t states_checked; /* non-empty src states whose tags were checked (state_tags) */
} seqref_counts;
seqref_counts seqref_get_counts(const seqref *r);

#endif

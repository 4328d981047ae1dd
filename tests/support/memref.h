/* A brute-force reference of what llmem's memory modules hold, for the
 * model-based randomized test (tests/test_memory_model.c) and the fault
 * injection test.
 *
 * The reference keeps, per sequence, the list of tokens it holds (token id,
 * position, the position its stored key was rotated for, and a hash of the
 * token history), and per child memory:
 *   - KV cache: one page list per sequence over abstract pages with
 *     refcounts, a published flag, the chain key (parent page, whole token
 *     prefix) and an LRU stamp. Every rule is written from the contract
 *     (memory.h, kv_cache.h, docs/testing.md), with plain arrays and linear
 *     scans: no hashing, no free stack. Physical page ids are learned by
 *     observing the page tables (memref_bind) and then must stay consistent,
 *     so sharing, copy-on-write and eviction choices are all checked.
 *   - recurrent memory: per sequence the set of (length, slot) states it
 *     holds; the lengths are predicted, the slot ids learned from views.
 *     With snapshots (issue 13): the published snapshots (token prefix,
 *     pins, LRU stamp; their slot learned when a hit reads it), predicted
 *     at commit and at seq_rm, read by hits, evicted least recently used.
 *   - the device prefix budget (prefix_cache_bytes): cached pages and
 *     snapshots of every child stamped from one clock; when a page becomes
 *     cached or a snapshot needs room past the budget, the oldest unpinned
 *     entry of either kind is evicted.
 *
 * Data: the test writes a tag into every K/V slot and state slot it is told
 * to write (memref_forward), derived from the token history; memref_verify
 * then downloads the pools and checks every held slot still has its tag.
 *
 * Not thread-safe; one reference per memory.
 */
#ifndef LLMEM_TEST_MEMREF_H
#define LLMEM_TEST_MEMREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/llmem.h"

#define MR_MAX_CHILD 4
#define MR_MAX_LAYERS 8
#define MR_MAX_SEQ 16

typedef struct mr_child_config {
    bool kv;              /* KV cache (else recurrent) */
    int32_t n_layers;     /* layers of this child */
    /* KV */
    int32_t page_size, n_pages;
    bool prefix;          /* prefix cache on */
    bool poison;
    /* recurrent */
    int32_t n_ckpt;
    int32_t layout;       /* the state layout of every layer (mr_rs_layout) */
    /* Snapshots for prefix reuse (issue 13): n_snap slots, one published
     * after every ubatch of a sequence (snap_interval 1: the reference
     * then never needs the plan's cut points) and at the end of a removed
     * sequence; needs n_ckpt 0 (one new state per ubatch). 0: off. */
    int32_t n_snap;
    /* Device prefix budget (prefix_cache_bytes) of this child, KV or
     * recurrent; a hybrid shares the largest. 0: none. */
    int64_t budget;
} mr_child_config;

/* Recurrent state layouts, all f32, shapes small (models/runtime.c
 * layer_states for the real ones): MR_RS_PLAIN conv {2, 4} + ssm {4};
 * MR_RS_GDN (qwen3_next) conv {3, 2*H_k*d_k + H_v*d_v} = {3, 16} + delta
 * {H_v, d_k, d_v} = {2, 4, 4}; MR_RS_SHORTCONV (LFM2) conv {L - 1,
 * hidden} = {2, 8} only; MR_RS_MAMBA1 (jamba) conv {d_conv - 1, d_inner} =
 * {3, 8} + ssm {d_inner, d_state} = {8, 4}. */
typedef enum mr_rs_layout {
    MR_RS_PLAIN = 0,
    MR_RS_GDN = 1,
    MR_RS_SHORTCONV = 2,
    MR_RS_MAMBA1 = 3,
} mr_rs_layout;

typedef struct mr_config {
    int32_t n_seq_max;
    int32_t n_children;   /* 1: a plain memory; > 1: a hybrid */
    bool hybrid;          /* wrap even a single child in a hybrid */
    mr_child_config child[MR_MAX_CHILD];
    int32_t n_layers;     /* hybrid: model layers; layer_child maps them */
    int32_t layer_child[MR_MAX_LAYERS];
} mr_config;

/* One token a sequence holds. */
typedef struct mr_tok {
    int32_t token, pos;
    int32_t kpos;         /* position its stored key encodes (pos once K-shifts are applied) */
    uint64_t h;           /* hash of the sequence's token ids up to and including this one */
} mr_tok;

typedef struct memref memref;

/* Creates the memory described by cfg on `be` (KV: f32, 1 KV head,
 * head_dim 4; recurrent: per layer an f32 [2, 4] "conv" and [4] "ssm"
 * state) and its reference. Returns NULL with a reason in err. */
memref *memref_create(llmem_backend *be, const mr_config *cfg, llmem_memory **mem, char *err,
                      size_t err_len);
void memref_destroy(memref *r);

/* Sequence contents. */
int32_t memref_seq_len(const memref *r, int32_t seq);
const mr_tok *memref_seq_tok(const memref *r, int32_t seq);
int32_t memref_pos_max(const memref *r, int32_t seq);
int32_t memref_pos_min(const memref *r, int32_t seq);
/* Whether any held key still waits for its K-shift (KV children). */
bool memref_seq_shift_pending(const memref *r, int32_t seq);
llmem_split memref_split(const memref *r);
const mr_config *memref_config(const memref *r);
/* The memory of child c (the memory itself when there is no hybrid). */
llmem_memory *memref_child_mem(const memref *r, int32_t c);
/* Recurrent children: the held state lengths of seq (ascending); count. */
int32_t memref_rs_lengths(const memref *r, int32_t seq, int32_t *len, int32_t cap);
/* Whether any prefix page was evicted since the last clear. */
int64_t memref_evictions(const memref *r);

/* --- plans --------------------------------------------------------------------------- */

/* Predicts llmem_memory_plan on the batch. On LLMEM_OK the reference now
 * has the plan in flight (reservations made, n_cached[] filled for every
 * sequence); on an error it is unchanged. */
llmem_status memref_plan(memref *r, const llmem_batch *b, llmem_split split, int32_t n_ubatch,
                         int32_t *n_cached);
/* Checks the ubatches of a plan the reference predicted (memref_plan
 * returned LLMEM_OK): sizes and split shapes, every token not served by
 * the prefix cache exactly once with its position, in order per sequence,
 * streams made of one sequence-id set, output rows and ids, plan info. */
bool memref_check_plan(const memref *r, const llmem_plan *plan, char *err, size_t err_len);
/* Call right after llmem_memory_apply of ubatch `ub` (index u): records
 * the apply (the plan's copies-on-write happen at its first one), reads
 * every layer's view, checks it against the reference (store slots, page
 * tables, lengths, K-shifts, recurrent source/destination slots, device
 * copies of the tables) and remembers what the ubatch writes. */
bool memref_capture(memref *r, const llmem_ubatch *ub, int32_t u, char *err, size_t err_len);
/* The forward pass of the captured ubatch: checks the data it reads
 * (recurrent sources), applies K-shifts and writes every tag. */
bool memref_forward(memref *r, const llmem_ubatch *ub, char *err, size_t err_len);
/* Records llmem_memory_commit of the captured ubatch; call it after the
 * commit (it learns the slots of copied recurrent states). */
void memref_commit(memref *r, const llmem_ubatch *ub);
/* Records llmem_memory_release. `applied` tells whether the last captured
 * ubatch was applied and not committed. */
void memref_release(memref *r, bool applied);
bool memref_plan_active(const memref *r);

/* --- sequence operations (predicted status; applied when LLMEM_OK) ------------------- */

llmem_status memref_seq_rm(memref *r, int32_t seq, int32_t p0, int32_t p1);
llmem_status memref_seq_cp(memref *r, int32_t src, int32_t dst, int32_t p0, int32_t p1);
llmem_status memref_seq_keep(memref *r, int32_t seq);
llmem_status memref_seq_add(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t delta);
llmem_status memref_seq_div(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t d);
void memref_clear(memref *r);

/* State I/O: a saved copy of seq (or -1: every non-empty sequence), and
 * the predicted llmem_memory_state_read of it into seq. */
typedef struct mr_saved mr_saved;
mr_saved *memref_save(const memref *r, int32_t seq);
void memref_saved_free(mr_saved *s);
llmem_status memref_load(memref *r, int32_t seq, const mr_saved *s);

/* --- checks -------------------------------------------------------------------------- */

/* Learns the physical page ids of new pages and the slots of new recurrent
 * states, then checks that the memory's page tables and slots match the
 * reference one to one. */
bool memref_bind(memref *r, char *err, size_t err_len);
/* Every sequence's tokens, positions, lengths; stats; checkpoints;
 * llmem_memory_check. */
bool memref_compare(memref *r, char *err, size_t err_len);
/* Downloads every pool and checks the tag of every held slot. */
bool memref_verify(memref *r, char *err, size_t err_len);
/* Predicted stats: pages, slots, prefix hits, evictions, copies. */
void memref_stats(const memref *r, llmem_memory_stats *st);

/* Tags (also used by the fuzzers' seed builders). */
uint64_t memref_mix(uint64_t h, int32_t token);
#define MR_H0 0x243f6a8885a308d3ull

#endif

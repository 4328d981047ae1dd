/* llmem memory/: internal structure of the recurrent-state memory, shared
 * by recurrent.c (slots, sequences, creation), rs_plan.c (planning) and
 * rs_state.c (state I/O, stats, checks). */
#ifndef LLMEM_RS_INTERNAL_H
#define LLMEM_RS_INTERNAL_H

#include "llmem/recurrent.h"
#include "memory/host_tier.h"
#include "memory/internal.h"
#include "memory/seq_heap.h"
#include "memory/seq_pos.h"
#include "memory/tok_stage.h"

/* The states a sequence holds: the state after hold_lens(h)[i] tokens lives
 * in state slot v[i], i < n. v has room for cap slots, then cap lengths
 * (hold_lens); cap never changes: a sequence holds at most 1 + n_ckpt
 * states (rs_check), and a plan's simulated holdings get the room a ubatch
 * can add. A sequence's v is its part of recurrent.hold, one dense array
 * for all sequences, so that a decode step reads and writes the holdings
 * of thousands of sequences in order, a cache line per few sequences,
 * instead of two heap blocks each (two misses per sequence at 4,000). */
typedef struct rs_hold {
    int32_t *v;
    int32_t n, cap;
} rs_hold;

static inline int32_t *hold_lens(const rs_hold *h)
{
    return h->v + h->cap;
}

/* Appends slot `slot` holding the state after `len` tokens; false (nothing
 * changed) when the hold is full. */
static inline bool hold_push(rs_hold *h, int32_t slot, int32_t len)
{
    if (h->n >= h->cap)
        return false;
    h->v[h->n] = slot;
    hold_lens(h)[h->n++] = len;
    return true;
}

/* Snapshots n_snapshots -1 makes at most (sized from prefix_cache_bytes): a
 * device lookup compares every snapshot once per distinct candidate length
 * (rs_snap.c find_device), so more slots cost every new request's plan. */
#define RS_SNAP_FROM_BUDGET_MAX 4096

/* Tokens per block of a sequence's snapshot hash chain (rs_snap.c). */
#define RS_HASH_BLOCK 64

/* What a decode step reads and writes of a sequence: 64 bytes, one cache
 * line (recurrent.seqs is line-aligned), so that a step at thousands of
 * sequences misses once per sequence here, not on two lines of a
 * 104-byte record. */
typedef struct rs_seq {
    i32vec tokens;
    seq_pos pos; /* a run while they are one */
    rs_hold h;
} rs_seq;

/* A sequence's snapshot hash chain of tokens, extended lazily by rs_snap.c:
 * blk[b] = chain hash of tokens[0, (b + 1) * RS_HASH_BLOCK) for b < n_blk;
 * neg1: 1 + the index of the first token < 0 (an embedding) among them, 0
 * when none. Every change of tokens other than an append cuts the chain
 * (snap_seq_cut). Kept beside rs_seq (recurrent.chain), which a decode
 * step reads, as a decode step without snapshots never reads it. */
typedef struct rs_chain {
    uint64_t *blk;
    int32_t n_blk, cap_blk, neg1;
} rs_chain;

typedef struct rs_layer {
    int32_t n_states;
    llmem_state_desc *desc;
    size_t *bytes;          /* [n_states] bytes of one slot */
    llmem_buffer **buf;     /* [n_states] */
    llmem_rs_view view;     /* what rs_view last described of this layer */
} rs_layer;

/* What commit(u) does to one sequence. */
typedef struct rs_change {
    int32_t seq;
    int32_t copy_from;      /* >= 0: copy this slot into new_slot[0] at commit */
    int32_t n_new;
    int32_t *new_slot, *new_len; /* holdings after the ubatch */
} rs_change;

/* A snapshot written inside a ubatch (llmem_rs_view.snap_slot): the state
 * of sequence seq after len tokens, in slot `slot`, which no sequence
 * holds (free again once the commit has copied it into a snapshot). */
typedef struct rs_mid {
    int32_t seq, slot, len;
} rs_mid;

typedef struct rs_ub {
    int32_t src, dst, ckpt, n_seqs, n_ckpt, n_seq_tokens;
    int32_t snap_tok, snap_slot; /* index-table offsets, -1: no snapshot inside */
    int32_t n_change;
    rs_change *change;
    int32_t *pool; /* the changes' new_slot / new_len arrays, 2 * (n_ckpt + 2) each change */
    int32_t n_mid;
    rs_mid *mid; /* [n_seqs] */
} rs_ub;

typedef struct rs_res {
    int32_t n_ub, cur;
    rs_ub *ub;
    i32vec pins; /* snapshots this plan reads (pinned until release) */
    /* Host-tier hits: entry rest_entry[k] (pinned in the host tier from
     * planning on) comes back into snapshot rest_snap[k] (one of pins), or,
     * when rest_snap[k] < 0, into the free state slot -1 - rest_snap[k]
     * (the entry stays in the tier), at the plan's first apply, when every child of a composition has
     * reserved (so no spill of this one evicts what another counted on). */
    i32vec rest_snap, rest_entry;
    bool restored;
    int32_t prepared; /* the ubatch whose commit_prepare succeeded last (-1: none) */
    int32_t copied;   /* the ubatch whose commit_prepare ran its copies last, even failing */
} rs_res;

/* A snapshot: the state after the first `len` tokens of a prefix, in slot
 * snap_base + its index, published at commit (rs_snap.c). */
typedef struct rs_snap {
    int32_t len;     /* 0: unused */
    uint64_t hash;   /* snap_chain_hash of tokens[0, len) */
    i32vec tokens;   /* verified on every match */
    int32_t ref;     /* plans reading it; never evicted while > 0 */
    uint64_t lru;    /* last publish or hit */
    bool pend;       /* its state copy is queued (recurrent.pend), not yet run */
} rs_snap;

typedef struct recurrent {
    llmem_memory base;
    int32_t n_ckpt, n_slots, quota;
    /* slots [0, n_seq_slots) belong to sequences; [snap_base, n_slots) to
     * snapshots (snap_base == n_seq_slots) */
    int32_t n_seq_slots, snap_base, n_snap, snap_interval;
    bool snap_in_ubatch; /* llmem_recurrent_params.snap_in_ubatch */
    rs_snap *snap;
    int32_t n_live_snap;   /* snapshots with len > 0 */
    uint64_t snap_clock;   /* own LRU clock; clock points to it or to the budget's */
    uint64_t *clock;
    int64_t snap_hit_tokens;
    int64_t snap_evictions; /* snapshots evicted from the device (LRU) */
    /* the device byte budget of snapshots (NULL: none), shared with the
     * other children of a hybrid: one LRU with their cached KV pages
     * (prefix_budget.h) */
    struct prefix_budget *budget;
    /* Evicted snapshots in host memory (NULL: off); shared with the other
     * children of a hybrid (one LRU, one byte budget with KV pages). */
    host_tier *host;
    int64_t host_restores; /* snapshots copied back from the host tier */
    int64_t snap_copy_failures; /* commits whose snapshot copies failed (dropped) */
    bool poison;
    rs_layer *layers;
    rs_seq *seqs;     /* [n_seq_max], 64-byte aligned */
    rs_chain *chain;  /* [n_seq_max] */
    /* [n_seq_max], 64-byte aligned: each sequence's staged token appends
     * (memory/tok_stage.h) */
    tok_stage *stage;
    bool stage_spread; /* LLMEM_TOK_STAGE_SPREAD (tok_stage.h) */
    /* [n_seq_max][2 * (1 + n_ckpt)]: every sequence's holdings (rs_hold) */
    int32_t *hold;
    seq_heap *heap; /* the sequences' tokens and pos arrays */
    int32_t *owner; /* [n_slots] owning sequence or -1 */
    /* free slots: a stack, and each free slot's place in it (-1: owned), so
     * that taking any given slot is O(1) */
    int32_t *free_stack, *free_at, n_free;
    llmem_buffer *idx;
    idx_builder ib;
    /* State copies queued by slot_copy_queue, run as one batch
     * (llmem_buffer_copy_ranges) by slot_copy_flush: the copies of a
     * commit's snapshots, every layer's states of every sequence. */
    llmem_copy_range *pend;
    int32_t n_pend, cap_pend;
    i32vec pend_slot; /* the destination slot of each queued slot copy */
    /* The reservation reserve_prepare made for `stash_plan`, which reserve
     * then takes instead of simulating the plan again (the core and the
     * hybrid always prepare a plan right before reserving it). */
    void *stash;
    const llmem_plan *stash_plan;
    /* simulate's per-sequence scratch, kept across plans so that a plan
     * costs the sequences it names, not n_seq_max zeroed entries: entry s
     * belongs to the plan being simulated only when sim_stamp[s] ==
     * sim_gen (rs_plan.c sim_touch); sim_seqs lists those sequences */
    uint32_t *sim_stamp, sim_gen;
    int32_t *sim_len;  /* its length as the plan's ubatches leave it */
    int32_t *sim_from; /* source slot of a prefix hit, -1 none */
    rs_hold *sim_hold; /* its simulated holdings (plans of several ubatches) */
    i32vec sim_seqs;
    i32vec sim_top, sim_pending; /* sim_stack's pushes; slots a ubatch drops */
} recurrent;

/* The free-slot stack as a plan's commits will leave it, simulated without
 * copying it: the memory's stack's first lo entries (base, only read),
 * then the slots the plan gave back (*top, pushed after them). Pops take
 * the top, as on a copy of the stack, in the same order. */
typedef struct sim_stack {
    const int32_t *base;
    int32_t lo;
    i32vec *top;
} sim_stack;

static inline int32_t sim_stack_n(const sim_stack *f)
{
    return f->lo + f->top->n;
}

/* The top slot, taken off; -1 when empty. */
static inline int32_t sim_stack_pop(sim_stack *f)
{
    return f->top->n > 0 ? f->top->v[--f->top->n] : f->lo > 0 ? f->base[--f->lo] : -1;
}

extern const llmem_memory_i recurrent_iface;

static inline recurrent *rs_of(llmem_memory *mem)
{
    return LLMEM_MEMORY_CAST(recurrent, mem, &recurrent_iface);
}

/* Writes s's staged token appends into its token array (tok_stage.h). */
static inline void rs_tokens_sync(recurrent *rs, const rs_seq *s)
{
    tok_stage_sync(&rs->stage[s - rs->seqs], &s->tokens);
}

/* recurrent.c */
int32_t hold_find(const rs_hold *h, int32_t len);
/* Copies state slot src into slot dst, every layer's states, in one batch. */
llmem_status slot_copy(recurrent *rs, int32_t dst, int32_t src);
/* Room for n more queued slot copies (LLMEM_E_NO_MEMORY: none made), so
 * that queueing them cannot fail: a plan reserves its commits' copies. */
llmem_status slot_copy_reserve(recurrent *rs, int32_t n);
/* Queues that copy for slot_copy_flush (LLMEM_E_NO_MEMORY: nothing queued).
 * A queued destination must not be queued again, read, spilled or filled
 * before the flush (snapshots mark it: rs_snap.pend). */
llmem_status slot_copy_queue(recurrent *rs, int32_t dst, int32_t src);
/* Runs the queued copies as one llmem_buffer_copy_ranges call. On an error
 * the snapshots they were filling are dropped (unused). */
llmem_status slot_copy_flush(recurrent *rs);
void slot_free(recurrent *rs, int32_t slot);
void hold_drop_all(recurrent *rs, rs_seq *s);
/* Gives a free slot to seq: `slot`, or (slot_pop) the top of the stack;
 * -1 when none is free. */
void slot_take(recurrent *rs, int32_t slot, int32_t seq);
int32_t slot_pop(recurrent *rs, int32_t seq);
void truncate_to(recurrent *rs, rs_seq *s, int32_t k);
llmem_status rs_clear(llmem_memory *mem, bool data);

/* rs_snap.c */
int32_t snap_find(const recurrent *rs, const int32_t *tokens, int32_t m);
int32_t rs_prefix_match(llmem_memory *mem, const int32_t *tokens, int32_t n);
llmem_status snap_publish(recurrent *rs, rs_seq *s, int32_t slot, int32_t len);
/* Tokens of s changed other than by an append: only its first k stay. */
void snap_seq_cut(recurrent *rs, const rs_seq *s, int32_t k);
void snap_reset(recurrent *rs);
void snap_finish(recurrent *rs);
int32_t snap_count(const recurrent *rs);
bool snap_check(const recurrent *rs, char *err, size_t err_len);
/* Bytes of one state slot over all layers (a snapshot's data). */
size_t rs_slot_bytes(const recurrent *rs);
/* Host-tier entry holding the snapshot of exactly tokens[0, len), or -1. */
int32_t snap_host_find(const recurrent *rs, const int32_t *tokens, int32_t len);
/* Device snapshot a host-tier hit can come back into: unused or least
 * recently used, unpinned, not in avoid[0, n_avoid); -1 when none. */
int32_t snap_victim(const recurrent *rs, const int32_t *avoid, int32_t n_avoid);
/* Uploads host entry e's state into state slot `slot` (queued copies);
 * counts a host restore. Returns LLMEM_OK or a backend status. */
llmem_status snap_upload(recurrent *rs, int32_t slot, int32_t e);
/* Spills snapshot i to the host tier (when it holds one), then uploads host
 * entry e into it and removes e: the snapshot of e's tokens now lives on the
 * device. Returns LLMEM_OK or a backend status (snapshot i then unused). */
llmem_status snap_restore(recurrent *rs, int32_t i, int32_t e);

/* rs_plan.c */
void rs_drop_stash(recurrent *rs);
llmem_status rs_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                        size_t err_len);
llmem_status rs_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                size_t err_len);
llmem_status rs_apply(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i);
llmem_status rs_view(llmem_memory *mem, void *r, int32_t il, llmem_view *view);
llmem_status rs_commit_prepare(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i);
llmem_status rs_commit(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i);
void rs_release(llmem_memory *mem, const llmem_plan *plan, void *r);

/* rs_state.c */
llmem_status rs_state_write(llmem_memory *mem, int32_t seq, llmem_state_writer *w);
llmem_status rs_state_read_prepare(llmem_memory *mem, int32_t seq, llmem_state_reader *r,
                                   void **out, char *err, size_t err_len);
llmem_status rs_state_read_apply(llmem_memory *mem, int32_t seq, void *tmp);
void rs_state_read_abort(llmem_memory *mem, void *tmp);
bool rs_state_read_seq(llmem_memory *mem, void *tmp, int32_t seq, int32_t *len,
                       const void **tokens, const void **pos);
void rs_get_stats(llmem_memory *mem, llmem_memory_stats *st);
llmem_status rs_check(llmem_memory *mem, char *err, size_t err_len);

#endif

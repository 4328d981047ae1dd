/* llmem: the abstract memory interface (what callers use).
 *
 * A memory holds what a model remembers of each sequence: K/V pages
 * (<llmem/kv_cache.h>), recurrent state slots (<llmem/recurrent.h>), or a
 * per-layer composition of both (<llmem/hybrid.h>). All of them are driven
 * the same way (see DESIGN.md, "Vocabulary"):
 *
 *     llmem_plan *plan;
 *     llmem_memory_plan(mem, &batch, LLMEM_SPLIT_AUTO, 512, &plan, err, sizeof err);
 *     for (int32_t i = 0; i < llmem_plan_n_ubatch(plan); i++) {
 *         const llmem_ubatch *ub;
 *         llmem_memory_apply(mem, plan, i, &ub);
 *         for each layer il: llmem_memory_view(mem, il, &view); ...kernels...
 *         llmem_memory_commit(mem, plan, i);
 *     }
 *     llmem_memory_release(mem, plan);
 *
 * Reference: llama.cpp's llama_memory_i (init_batch / apply / seq_*), vLLM's
 * block manager (paged KV, prefix caching), Mamba-2 state caching in
 * vLLM/llama.cpp for the recurrent part.
 *
 * Threading: a memory is used by one thread at a time. One plan may be in
 * flight per memory; sequence operations during it return LLMEM_E_BUSY.
 * Positions and lengths are in tokens. Sequence ids are int32 in
 * [0, n_seq_max). Empty sequences are valid: pos_min = pos_max = -1.
 */
#ifndef LLMEM_MEMORY_H
#define LLMEM_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"
#include "llmem/batch.h"
#include "llmem/status.h"
#include "llmem/view.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

#define LLMEM_MEMORY_API_VERSION 1

typedef struct llmem_memory llmem_memory;
typedef struct llmem_plan llmem_plan;

/* How a batch becomes ubatches (strictest last).
 *  SIMPLE: token order kept, any mix of sequences, up to n_ubatch tokens.
 *  EQUAL:  each ubatch holds n_seqs sequence groups with the same number of
 *          tokens each, grouped sequence-major (for recurrent scans).
 *  SEQ:    one sequence group per ubatch.
 * A sequence group (group) is the set of tokens sharing one seq-id set. */
typedef enum llmem_split {
    LLMEM_SPLIT_AUTO = -1, /* the memory's own (strictest of its children) */
    LLMEM_SPLIT_SIMPLE = 0,
    LLMEM_SPLIT_EQUAL = 1,
    LLMEM_SPLIT_SEQ = 2,
} llmem_split;

/* The split's name: "auto", "simple", "equal" or "seq"; "?" for any other
 * value. A static string. */
const char *llmem_split_name(llmem_split s);

/* One micro-batch: what one forward pass processes. All arrays are owned
 * by the plan and valid until llmem_memory_release. */
typedef struct llmem_ubatch {
    int32_t n_tokens;
    int32_t n_seqs;         /* sequence groups in this ubatch */
    int32_t n_seq_tokens;   /* tokens per group for EQUAL/SEQ splits; 0 for SIMPLE */
    llmem_split split;      /* the split that made it */
    const int32_t *token;   /* [n_tokens] token ids, or NULL when the batch has embeddings */
    const float *embd;      /* [n_tokens][n_embd], or NULL */
    int32_t n_embd;
    const int32_t *pos;     /* [n_tokens] positions */
    const int32_t *seq;     /* [n_tokens] group index in [0, n_seqs) */
    const int32_t *seq_id;  /* [n_seqs] first sequence id of each group */
    const int32_t *batch_idx; /* [n_tokens] index of each token in the caller's batch */
    int32_t n_outputs;
    const int32_t *out_rows; /* [n_outputs] ubatch token index of each output row */
    const int32_t *out_ids;  /* [n_outputs] caller-batch index of each output row */
} llmem_ubatch;

typedef struct llmem_plan_info {
    int32_t n_ubatch;
    int32_t n_outputs;        /* output rows over all ubatches */
    int32_t n_tokens;         /* tokens that need compute */
    int32_t n_tokens_cached;  /* tokens served by the prefix cache (no compute) */
    llmem_split split;
} llmem_plan_info;

typedef struct llmem_memory_stats {
    const char *type;            /* "kv_cache", "recurrent", "hybrid" */
    int64_t pages_total, pages_used, pages_free, pages_cached, pages_peak;
    int64_t slots_total, slots_used;
    int64_t prefix_hit_tokens;   /* tokens served by the prefix cache since creation */
    int64_t prefix_evictions;    /* cached pages evicted (LRU) */
    int64_t cow_copies;          /* pages or state slots copied on write (a copy an
                                  * abandoned plan gave back is not counted) */
    int64_t bytes_device;        /* device bytes held by pools and slots */
    int32_t n_seqs_live;         /* non-empty sequences */
    int64_t snapshots;           /* recurrent snapshots published now (issue 13) */
    int64_t snapshot_bytes;      /* device bytes those snapshots hold */
    int64_t snapshot_hit_tokens; /* tokens whose state came from a snapshot */
    int64_t host_tier_pages;     /* evicted pages held in the host tier now */
    int64_t host_tier_bytes;     /* host bytes those pages hold */
    int64_t host_tier_hits;      /* pages copied back from the host tier on a prefix hit */
    int64_t host_tier_snapshots;      /* evicted snapshots held in the host tier now */
    int64_t host_tier_snapshot_bytes; /* host bytes those snapshots hold */
    int64_t host_tier_snapshot_hits;  /* snapshots copied back from the host tier on a hit */
    /* The device prefix budget (issue 13; llmem_kv_cache_params and
     * llmem_recurrent_params.prefix_cache_bytes): its size in bytes (0: no
     * budget; a hybrid's children share one, reported once), the device
     * bytes cached pages hold now (pages_cached * 2 * n_layers * page
     * bytes; snapshot_bytes holds the snapshots' share), and the snapshots
     * evicted from the device (LRU, for the budget or for a slot; pages:
     * prefix_evictions). */
    int64_t prefix_cache_bytes;
    int64_t cached_kv_bytes;
    int64_t snapshot_evictions;
    /* Commits whose snapshot copies the device refused (llmem_buffer_copy_ranges
     * returned an error): those snapshots were dropped, not published (cache
     * entries; the commit itself stood). Non-zero means the device failed. */
    int64_t snapshot_copy_failures;
} llmem_memory_stats;

/* Plans a batch: validates it, looks up the prefix cache, splits it into
 * ubatches of at most n_ubatch tokens with `split` (AUTO: the memory's),
 * and reserves every page and slot they need. Transactional: on any error
 * the memory is unchanged.
 *   batch: caller-owned; copied, may be freed after the call.
 *   out:   receives the plan, owned by the memory until llmem_memory_release.
 * Validation (LLMEM_E_INVALID, with a reason in err): empty batch; NULL
 * pos/token; sequence id < 0 or >= n_seq_max; a token listed twice in one
 * sequence; a position that does not follow the sequence's last position
 * (pos_max + 1; any start >= 0 for an empty sequence); tokens of one
 * sequence out of position order; a split weaker than the memory needs.
 * Returns LLMEM_OK; LLMEM_E_INVALID; LLMEM_E_BUSY (a plan is in flight);
 * LLMEM_E_NO_SPACE (not enough free pages/slots, memory unchanged);
 * LLMEM_E_NO_MEMORY; LLMEM_E_BACKEND. */
llmem_status llmem_memory_plan(llmem_memory *mem, const llmem_batch *batch, llmem_split split,
                               int32_t n_ubatch, llmem_plan **out, char *err, size_t err_len);

int32_t llmem_plan_n_ubatch(const llmem_plan *plan);
void llmem_plan_get_info(const llmem_plan *plan, llmem_plan_info *info);
/* Tokens of `seq_id` this plan takes from the prefix cache (0 if none). */
int32_t llmem_plan_n_cached(const llmem_plan *plan, int32_t seq_id);
/* Ubatch i of the plan (no state change), or NULL when out of range. */
const llmem_ubatch *llmem_plan_ubatch(const llmem_plan *plan, int32_t i);

/* Makes ubatch i current and returns it. Ubatches must be applied in order,
 * each committed before the next is applied.
 * Returns LLMEM_E_INVALID (wrong plan or index), LLMEM_E_STATE (out of order),
 * LLMEM_E_BACKEND (copy-on-write or index upload failed). */
llmem_status llmem_memory_apply(llmem_memory *mem, llmem_plan *plan, int32_t i,
                                const llmem_ubatch **ub);

/* Fills the view of layer `il` for the current ubatch. Valid until the
 * next apply/commit/release. Returns LLMEM_E_INVALID (layer out of range),
 * LLMEM_E_STATE (no ubatch applied). */
llmem_status llmem_memory_view(llmem_memory *mem, int32_t il, llmem_view *view);

/* Records that the forward pass of ubatch i wrote its K/V and states:
 * sequences grow, full pages are published to the prefix cache. Makes no
 * host allocation that can fail it (llmem_memory_plan reserved the room).
 * All or nothing, in a hybrid across every child: the device copies it
 * needs (a recurrent memory's state copies to the sequences sharing a
 * stream) run before anything changes, so a failure leaves the memory as
 * it was and the ubatch applied (commit again, or release the plan). A
 * failed snapshot copy only drops that snapshot (a cache entry;
 * llmem_memory_stats.snapshot_copy_failures). Returns LLMEM_E_INVALID
 * (NULL argument, wrong plan or index), LLMEM_E_STATE when ubatch i is not
 * the current one, LLMEM_E_BACKEND (a device copy failed). */
llmem_status llmem_memory_commit(llmem_memory *mem, llmem_plan *plan, int32_t i);

/* Ends the plan: reservations of ubatches not committed are returned
 * (their sequences stay as after the last commit), and the plan is freed.
 * Accepts NULL plan. */
void llmem_memory_release(llmem_memory *mem, llmem_plan *plan);

/* Sequence operations. seq_id -1 means every sequence where noted;
 * p0 < 0 means 0, p1 < 0 means "to the end". Ranges are [p0, p1).
 * All are all-or-nothing; all return LLMEM_E_BUSY while a plan is in flight
 * and LLMEM_E_INVALID for an id out of range. */

/* Removes positions [p0, p1) of seq_id (-1: all sequences).
 * KV cache: any suffix (p1 past the end) or the whole sequence; frees every
 * page wholly past the cut. Also a run of whole pages elsewhere (context
 * shift, as llama.cpp's: remove [n_keep, n_keep + n_discard), then
 * llmem_memory_seq_add the rest by -n_discard; the later tokens keep their
 * positions until then). Recurrent: the whole sequence, or a suffix whose
 * first removed position is one past a checkpoint (a slot switch).
 * Returns LLMEM_E_STATE when the cut is not possible (nothing changes). */
llmem_status llmem_memory_seq_rm(llmem_memory *mem, int32_t seq_id, int32_t p0, int32_t p1);
/* Makes dst hold what src holds in [p0, p1) (only the whole sequence or a
 * prefix of it). KV: full pages are shared; a partial page is shared and
 * copied before it is written. dst's previous content is dropped.
 * Returns LLMEM_E_NO_SPACE when no slot is free for dst. */
llmem_status llmem_memory_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                                 int32_t p1);
/* Removes every sequence but seq_id. */
llmem_status llmem_memory_seq_keep(llmem_memory *mem, int32_t seq_id);
/* Adds delta to positions in [p0, p1) of seq_id; KV caches record a K-shift.
 * Returns LLMEM_E_UNSUPPORTED when the memory cannot shift; LLMEM_E_NO_SPACE
 * (nothing changed) when a KV cache has no free page to copy a page it
 * shares with another sequence before re-rotating its keys (also for
 * llmem_memory_seq_div). */
llmem_status llmem_memory_seq_add(llmem_memory *mem, int32_t seq_id, int32_t p0, int32_t p1,
                                  int32_t delta);
/* Divides positions in [p0, p1) of seq_id by d (> 0), rounding down. */
llmem_status llmem_memory_seq_div(llmem_memory *mem, int32_t seq_id, int32_t p0, int32_t p1,
                                  int32_t d);
/* Smallest / largest position held by seq_id, -1 when empty or invalid. */
int32_t llmem_memory_seq_pos_min(llmem_memory *mem, int32_t seq_id);
int32_t llmem_memory_seq_pos_max(llmem_memory *mem, int32_t seq_id);
/* Number of tokens held by seq_id (0 when empty or invalid). */
int32_t llmem_memory_seq_len(llmem_memory *mem, int32_t seq_id);
/* Whether K-shifts (seq_add/seq_div) are supported. */
bool llmem_memory_can_shift(llmem_memory *mem);
/* Drops every sequence and the prefix cache. With `data`, also fills the
 * device storage with NaN (poison) or zeros. Returns LLMEM_E_BUSY. */
llmem_status llmem_memory_clear(llmem_memory *mem, bool data);

/* Token ids held by seq_id: copies up to `cap` ids into `out` and returns
 * the sequence length (tokens), -1 for an invalid id. Tokens that came as
 * embeddings read as -1. */
int32_t llmem_memory_seq_tokens(llmem_memory *mem, int32_t seq_id, int32_t *out, int32_t cap);

/* State I/O (format: docs/state-format.md; magic "LLMS", version, per-section
 * sizes, XXH3-64 checksum). seq_id -1 = every sequence.
 * size: exact bytes write will produce.
 * write: writes into buf (cap bytes); *written gets the size.
 *   Returns LLMEM_E_NO_SPACE when cap is too small, LLMEM_E_BACKEND.
 * read: replaces seq_id's content (or, with -1, the whole memory) by the
 *   serialized state. A truncated, corrupted or mismatched state returns
 *   LLMEM_E_CORRUPT or LLMEM_E_ABI (other version), LLMEM_E_INVALID (other
 *   memory geometry: layers, shapes, dtypes, section count, or sequence ids
 *   beyond this memory's n_seq_max), LLMEM_E_NO_SPACE (does not fit), and
 *   leaves the
 *   memory exactly as it was. */
llmem_status llmem_memory_state_size(llmem_memory *mem, int32_t seq_id, size_t *size);
llmem_status llmem_memory_state_write(llmem_memory *mem, int32_t seq_id, void *buf, size_t cap,
                                      size_t *written);
llmem_status llmem_memory_state_read(llmem_memory *mem, int32_t seq_id, const void *buf,
                                     size_t size, char *err, size_t err_len);

/* Fills stats (sums over children for a hybrid). */
llmem_status llmem_memory_get_stats(llmem_memory *mem, llmem_memory_stats *stats);
/* Children of a composition (0 / NULL for other memories). */
int32_t llmem_memory_n_children(llmem_memory *mem);
llmem_memory *llmem_memory_child(llmem_memory *mem, int32_t i);
/* Layers the memory serves, its split, its type name. */
int32_t llmem_memory_n_layers(llmem_memory *mem);
llmem_split llmem_memory_split(llmem_memory *mem);
int32_t llmem_memory_n_seq_max(llmem_memory *mem);
const char *llmem_memory_type(llmem_memory *mem);

/* Checks every internal invariant (refcounts equal page-table references,
 * free + used = total, prefix index consistent, slot ownership). For tests
 * and debugging; O(size of the memory). Returns LLMEM_E_STATE with the first
 * violation in err. */
llmem_status llmem_memory_check(llmem_memory *mem, char *err, size_t err_len);

/* Destroys a memory and frees its device storage. A plan in flight is
 * released first. Accepts NULL. */
void llmem_memory_destroy(llmem_memory *mem);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

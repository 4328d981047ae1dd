/* llmem: the view description, what a kernel sees of a memory.
 *
 * A view is one layer of one memory for the current ubatch: buffers plus
 * int32 index tables (DESIGN.md, "Vocabulary"). Memories produce views
 * (llmem_memory_view, <llmem/memory.h>); backend ops consume them
 * (<llmem/ops.h>). This header belongs to the base layer, below both: it
 * needs only buffers and dtypes (<llmem/backend.h>), so a backend plugin
 * reads views without knowing any memory.
 *
 * Words: a "sequence group" (group) is the set of a ubatch's tokens that
 * share one sequence-id set (llmem_ubatch.seq gives each token's group).
 *
 * Every struct here is part of the backend plugin ABI: plugins read them
 * directly, so LLMEM_BACKEND_ABI_LAYOUT (<llmem/backend_impl.h>) covers
 * their sizes and member offsets.
 *
 * Threading: a view is plain data, valid until the ubatch is committed or
 * released; it is read by the thread that drives the memory.
 */
#ifndef LLMEM_VIEW_H
#define LLMEM_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LLMEM_STATE_MAX_DIMS 4

typedef struct llmem_state_desc llmem_state_desc;

/* One state tensor of a layer, e.g. {"conv", 2, {3, 1536}, F32}; a
 * recurrent memory keeps [n_slots][elements] of it per layer. */
struct llmem_state_desc {
    const char *name;                     /* copied by the memory */
    int32_t n_dims;                       /* 1..LLMEM_STATE_MAX_DIMS */
    int64_t shape[LLMEM_STATE_MAX_DIMS];  /* outermost first; all >= 1 */
    llmem_dtype dtype;                    /* F32, F16, BF16, or I8 (ssm state only) */
};

/* Bytes of one state slot of desc d: elements * dtype size for F32, F16
 * and BF16. For I8 (a per-head scale, the head being the outermost
 * dimension): the codes, then shape[0] f32 scales at the next 16-byte
 * boundary, the slot padded to 16 bytes (docs/memory.md, "Quantized KV
 * and state"). 0 for an invalid desc or on overflow. */
size_t llmem_state_slot_bytes(const llmem_state_desc *d);
/* Byte offset of the f32 scales in an I8 slot (see above); 0 otherwise. */
size_t llmem_state_scale_offset(const llmem_state_desc *d);

/* An int32 index table of a view: host copy plus its place in the view's
 * device index buffer (llmem_view.idx), so kernels need no upload. */
typedef struct llmem_i32_table {
    const int32_t *host; /* NULL when the table is empty */
    size_t offset;       /* byte offset in llmem_view.idx */
    int32_t n;           /* elements */
} llmem_i32_table;

typedef enum llmem_view_kind {
    LLMEM_VIEW_NONE = 0, /* the memory keeps nothing for this layer */
    LLMEM_VIEW_KV = 1,
    LLMEM_VIEW_RECURRENT = 2,
} llmem_view_kind;

/* Bytes of one KV page of a pool (page_size slots of n_kv_heads *
 * head_dim elements). For F32, F16 and BF16 the plain product with the
 * dtype size. For the scaled dtypes (I8, F8E4M3): the page's 1-byte codes
 * [page_size][n_kv_heads][head_dim], then its n_kv_heads f32 scales (one
 * per page and KV head) at the next 16-byte boundary
 * (llmem_kv_scale_offset), the page padded to 16 bytes; element = code *
 * scale (docs/memory.md, "Quantized KV and state"). 0 for invalid
 * arguments or on overflow. */
size_t llmem_kv_page_bytes(llmem_dtype t, int32_t page_size, int32_t n_kv_heads,
                           int32_t head_dim);
/* Byte offset of the scales inside a page of a scaled dtype; 0 otherwise. */
size_t llmem_kv_scale_offset(llmem_dtype t, int32_t page_size, int32_t n_kv_heads,
                             int32_t head_dim);

/* What attention kernels see of one KV layer for the current ubatch.
 * Pools are [n_pages][page_size][n_kv_heads][head_dim] of dtype; the slot of
 * page p, offset o is p * page_size + o. With a scaled dtype (I8, F8E4M3)
 * page p starts at byte p * llmem_kv_page_bytes(...) and holds its codes
 * in that layout followed by its per-head scales; head_dim is then a
 * multiple of 4. */
typedef struct llmem_kv_view {
    llmem_buffer *k, *v;
    llmem_dtype dtype;
    int32_t n_pages, page_size, n_kv_heads, head_dim;
    /* Store: ubatch token store_tok[j] writes its K/V to slot store_slot[j]
     * (a token in several sequences has one entry per sequence). */
    llmem_i32_table store_tok, store_slot;
    /* Attention: sequence group s sees page_table[s * max_pages .. +
     * ceil(seq_len[s]/page_size)), padded with -1; token i sees the first
     * tok_kv_len[i] keys of group ubatch.seq[i] (causal: its own key
     * included). Only slots in [0, seq_len) of a group may be read. */
    int32_t max_pages;
    llmem_i32_table page_table, seq_len, tok_kv_len, tok_seq;
    /* Pending K-shift (after seq_add/seq_div): re-rotate the key in
     * shift_slot[j] by shift_delta[j] positions, before attention, once.
     * Listed in the first ubatch of a plan and cleared by its commit; if that
     * ubatch is released uncommitted, the shift counts as not done and is
     * listed again by the next plan (a forward pass that failed after
     * rotating must clear the memory, or rotate back). */
    llmem_i32_table shift_slot, shift_delta;
    /* Page-table rows (optional). Empty (n == 0): the dense layout above,
     * group s's row starts at element s * max_pages of page_table. Else
     * n == n_groups and group s's row starts at element page_off[s] of
     * page_table, which then is a persistent table of every sequence's
     * row (the KV cache's page rows, docs/memory.md), written only where
     * pages change; max_pages still bounds ceil(seq_len[s] / page_size).
     * Rows of groups may overlap (shared pages) and need not be in group
     * order; entries past ceil(seq_len[s] / page_size) are unspecified
     * (not -1) and must not be read. Consumers index
     * page_table[row(s) + j / page_size] and nothing else changes. */
    llmem_i32_table page_off;
} llmem_kv_view;

/* What recurrent kernels see of one layer for the current ubatch (EQUAL
 * split: n_seqs sequence groups of n_seq_tokens tokens, group-major).
 * state[j] is [n_slots][elements of desc[j]] of desc[j].dtype. */
typedef struct llmem_rs_view {
    int32_t n_states;
    const llmem_state_desc *desc;  /* [n_states] */
    llmem_buffer *const *state;    /* [n_states] */
    int32_t n_slots;
    int32_t n_seqs, n_seq_tokens;
    /* src_slot[s]: slot to read the initial state from, -1 = zero state.
     * dst_slot[s]: slot that receives the state after the group's last token.
     * ckpt_slot[s * n_ckpt + j]: slot that receives the state after token
     * n_seq_tokens - n_ckpt + j of the group (0-based); -1 = none. The
     * recurrent memory leaves the last entry (the dst state) at -1. A kernel
     * must read its part of src before writing any dst/ckpt slot: they may
     * alias. */
    llmem_i32_table src_slot, dst_slot, ckpt_slot;
    int32_t n_ckpt;
} llmem_rs_view;

typedef struct llmem_view {
    llmem_view_kind kind;
    llmem_buffer *idx; /* device copy of every llmem_i32_table below */
    union {
        llmem_kv_view kv;
        llmem_rs_view rs;
    } u;
} llmem_view;

/* For memory implementations, right after their last write to idx for a
 * plan (the write generation vouched for): the rows they wrote into
 * page_table hold valid page ids (in [0, n_pages)) for the first
 * ceil(seq_len[s] / page_size) entries of row page_off[s], for every group
 * s of each of the n_ub ubatch table pairs (page_off[u], seq_len[u]), arrays
 * of [n_ub] read during the call only. The attention check of the op
 * wrappers (<llmem/ops.h>) then skips re-reading those row entries for a
 * view with exactly these tables (same host pointers, offsets and sizes),
 * the same page_table, n_pages and page_size, while idx keeps that
 * generation: O(groups + tokens) per ubatch instead of O(context). Every
 * other rule is still checked, and any later write to idx ends the vouch.
 * A false vouch breaks the ops contract like a host table that differs
 * from its device copy. One vouch per index buffer (a new one replaces
 * it), a few buffers per backend. Does nothing when the environment has
 * LLMEM_VIEW_CHECK=full (every check reads every row: debug and tests), for
 * an index buffer never written or on host allocation failure; no status
 * (a vouch is only an optimization). */
void llmem_view_vouch_rows(const llmem_buffer *idx, const llmem_i32_table *page_table,
                           int32_t n_pages, int32_t page_size, const llmem_i32_table *page_off,
                           const llmem_i32_table *seq_len, int32_t n_ub);

#ifdef __cplusplus
}
#endif
#endif

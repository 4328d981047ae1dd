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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

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

/* The kind of a view: which typed description llmem_view.desc points at.
 * Kinds are open: the well-known ones below are small numbers, and a cache
 * type defined outside llmem names its own kind with a four-character tag,
 * LLMEM_VIEW_KIND_TAG('s','w','a','k') (characters printable ASCII,
 * 0x21..0x7e, so a tag never equals a well-known id), with no registration
 * (as FourCC codes of RIFF or Vulkan's VkStructureType extensions): its
 * memory sets that tag and points desc at its own struct, and the ops that
 * read it (<llmem/ops.h>, "view kinds") accept that tag. Two out-of-tree
 * kinds must not share a tag; llmem_view_kind_name spells it. */
typedef uint32_t llmem_view_kind;

#define LLMEM_VIEW_NONE ((llmem_view_kind)0)      /* the memory keeps nothing for this layer */
#define LLMEM_VIEW_KV ((llmem_view_kind)1)        /* desc: llmem_kv_view */
#define LLMEM_VIEW_RECURRENT ((llmem_view_kind)2) /* desc: llmem_rs_view */

/* A four-character kind tag, first character in the most significant byte. */
#define LLMEM_VIEW_KIND_TAG(a, b, c, d)                                             \
    ((llmem_view_kind)(((uint32_t)(uint8_t)(a) << 24) | ((uint32_t)(uint8_t)(b) << 16) | \
                       ((uint32_t)(uint8_t)(c) << 8) | (uint32_t)(uint8_t)(d)))

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
    /* Appended (a description of LLMEM_RS_VIEW_V1_SIZE bytes has none;
     * consumers ask llmem_rs_view_snap): the snapshot inside the ubatch.
     * When snap_slot.n == n_seqs, group s's state after its token
     * snap_tok[s] (0-based, in [0, n_seq_tokens - 1): before the group's
     * last token, whose state is dst's) is also written to slot
     * snap_slot[s]; -1 there: none for that group. Written like a
     * checkpoint, after the sources are read; a snapshot slot is no
     * group's src, dst, checkpoint or other snapshot. Empty tables (n ==
     * 0): no snapshot. Only ssm_conv, ssm_scan, short_conv, ssm_scan1 and
     * gdn take a view with one; every other op refuses it
     * (LLMEM_E_UNSUPPORTED). A recurrent memory
     * made with snap_in_ubatch (<llmem/recurrent.h>) publishes a prompt's
     * snapshot this way instead of ending a ubatch at it (the extra ubatch
     * costs a read of every weight). */
    llmem_i32_table snap_tok, snap_slot;
} llmem_rs_view;

/* Bytes of an llmem_rs_view before the snapshot tables were appended: the
 * least a recurrent description may have (llmem_view_rs). */
#define LLMEM_RS_VIEW_V1_SIZE offsetof(llmem_rs_view, snap_tok)

/* One layer of one memory for the current ubatch: a kind, the typed
 * description of that kind, and the device buffer holding every index
 * table (llmem_i32_table) of the description.
 *   kind:      LLMEM_VIEW_NONE, LLMEM_VIEW_KV, LLMEM_VIEW_RECURRENT or an
 *              out-of-tree tag (LLMEM_VIEW_KIND_TAG);
 *   desc:      the typed description (NULL for NONE), owned by the memory
 *              and valid as the view is (until the next apply, commit or
 *              release of its memory, or the next view of the same layer);
 *   desc_size: bytes of *desc the producer filled (sizeof its struct), so
 *              a description may grow by appending fields: a consumer reads
 *              a field only when desc_size covers it (the accessors below
 *              refuse a description smaller than the struct they return).
 * Read the description through the typed accessors, never by casting. */
typedef struct llmem_view {
    llmem_view_kind kind;
    uint32_t desc_size;
    const void *desc;
    llmem_buffer *idx; /* device copy of every llmem_i32_table of desc */
} llmem_view;

/* The view's description when `kind` matches and desc_size covers `size`
 * bytes, else NULL (NULL view too). For typed accessors of a kind,
 * including an out-of-tree one:
 *   const my_view *my = llmem_view_desc(v, MY_KIND, sizeof(my_view)); */
static inline const void *llmem_view_desc(const llmem_view *v, llmem_view_kind kind, size_t size)
{
    return v && v->kind == kind && v->desc && v->desc_size >= size ? v->desc : NULL;
}

/* The KV description of a view, or NULL when the view is not of kind
 * LLMEM_VIEW_KV (or is NULL, or its description is too small). */
static inline const llmem_kv_view *llmem_view_kv(const llmem_view *v)
{
    return (const llmem_kv_view *)llmem_view_desc(v, LLMEM_VIEW_KV, sizeof(llmem_kv_view));
}

/* The recurrent description of a view, or NULL when it is not of kind
 * LLMEM_VIEW_RECURRENT (or is NULL, or its description is too small). */
static inline const llmem_rs_view *llmem_view_rs(const llmem_view *v)
{
    return (const llmem_rs_view *)llmem_view_desc(v, LLMEM_VIEW_RECURRENT,
                                                  LLMEM_RS_VIEW_V1_SIZE);
}

/* The recurrent description of v when it asks for a snapshot inside the
 * ubatch (its description has the snapshot tables and snap_slot.n > 0),
 * else NULL: read snap_tok / snap_slot through it, never past
 * llmem_view_rs's result. */
static inline const llmem_rs_view *llmem_rs_view_snap(const llmem_view *v)
{
    const llmem_rs_view *rs =
        (const llmem_rs_view *)llmem_view_desc(v, LLMEM_VIEW_RECURRENT, sizeof(llmem_rs_view));
    return rs && rs->snap_slot.n > 0 ? rs : NULL;
}

/* llmem_rs_view_snap's description when some group of v has a snapshot
 * slot (an entry >= 0 in the host copy of snap_slot), else NULL: what a
 * backend asks before it passes the tables to a kernel or picks the
 * kernel's snapshot instance. Never for a one-token view (a snapshot lies
 * before a group's last token), so recorded decode steps see none. */
static inline const llmem_rs_view *llmem_rs_view_snap_used(const llmem_view *v)
{
    const llmem_rs_view *rs = llmem_rs_view_snap(v);
    for (int32_t s = 0; rs && s < rs->snap_slot.n; s++)
        if (rs->snap_slot.host[s] >= 0)
            return rs;
    return NULL;
}

/* Fills a view of a kind: kind, desc and desc_size = size, idx. For memory
 * implementations and for tests or benchmarks that describe pools by hand. */
static inline llmem_view llmem_view_make(llmem_view_kind kind, const void *desc, size_t size,
                                         llmem_buffer *idx)
{
    llmem_view v;
    v.kind = kind;
    v.desc_size = (uint32_t)size;
    v.desc = desc;
    v.idx = idx;
    return v;
}

/* The name of a kind: "none", "kv", "recurrent", the four characters of a
 * tag, or "0x%08x" for anything else, written into buf (at least 12 bytes,
 * always NUL-terminated) and returned. Usable from plugins (header only). */
static inline const char *llmem_view_kind_name(llmem_view_kind kind, char buf[12])
{
    static const char hex[] = "0123456789abcdef";
    const char *known = kind == LLMEM_VIEW_NONE ? "none"
                        : kind == LLMEM_VIEW_KV ? "kv"
                        : kind == LLMEM_VIEW_RECURRENT ? "recurrent" : NULL;
    int i = 0;
    if (known) {
        for (; known[i] && i < 11; i++)
            buf[i] = known[i];
        buf[i] = 0;
        return buf;
    }
    bool tag = true;
    for (int k = 0; k < 4; k++) {
        uint32_t c = (kind >> (24 - 8 * k)) & 0xffu;
        tag = tag && c >= 0x21 && c <= 0x7e;
    }
    if (tag) {
        for (; i < 4; i++)
            buf[i] = (char)((kind >> (24 - 8 * i)) & 0xffu);
        buf[4] = 0;
        return buf;
    }
    buf[0] = '0';
    buf[1] = 'x';
    for (i = 0; i < 8; i++)
        buf[2 + i] = hex[(kind >> (28 - 4 * i)) & 0xfu];
    buf[10] = 0;
    return buf;
}

/* The one page count (DESIGN.md contract 2): pages needed to hold len + n
 * tokens when len are held, page_size tokens per page (so ceil(len /
 * page_size) pages hold len tokens: llmem_pages_for(0, len, page_size)).
 * len >= 0, n > 0, page_size > 0, else 0. Computed in int64, so no
 * overflow for any int32 input. Every page count of llmem (allocation,
 * admission, view checks, kernels, tests) calls it. */
static inline int32_t llmem_pages_for(int32_t len, int32_t n, int32_t page_size)
{
    if (len < 0 || n <= 0 || page_size <= 0)
        return 0;
    int64_t have = ((int64_t)len + page_size - 1) / page_size;
    int64_t need = ((int64_t)len + n + page_size - 1) / page_size;
    return (int32_t)(need - have);
}

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

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

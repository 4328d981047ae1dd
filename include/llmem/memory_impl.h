/* llmem: the interface a memory implements (for model authors adding a
 * cache type). Read together with <llmem/memory.h>.
 *
 * The core (memory/memory.c) owns batch validation, prefix-skip decisions,
 * splitting, serialized-state framing and the one-plan-at-a-time rule; an
 * implementation only reserves, exposes views, commits and edits its
 * sequences. Every sequence operation has a `dry_run` argument: with it the
 * implementation only says whether the operation would succeed, so a
 * composition can check all children before it acts on any.
 *
 * Vtable rules (STYLE.md): const, designated initialisers, grows only by
 * appending, `struct_size` set to sizeof(llmem_memory_i); NULL optional
 * slots mean unsupported. llmem_memory_init checks the table: a
 * struct_size smaller than the first version of the table or larger than
 * this llmem knows, or a NULL required slot, is refused.
 *
 * A cache type with its own view kind (<llmem/view.h>, LLMEM_VIEW_KIND_TAG)
 * needs this header and <llmem/memory.h> only: the helpers at the end
 * (growable int32 arrays, index-table builder, position bookkeeping) are
 * the ones the built-in memories use. docs/adding-a-cache-type.md walks
 * through one.
 */
#ifndef LLMEM_MEMORY_IMPL_H
#define LLMEM_MEMORY_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/memory.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* What a plan appends to one sequence (llmem_plan.seqs; 16 bytes, so
 * that a pass over a decode step's thousands of entries reads few cache
 * lines). Positions given by the batch: [first_pos, first_pos + n_new). */
typedef struct llmem_plan_seq {
    int32_t id;                /* sequence id, in [0, n_seq_max) */
    int32_t n_new;             /* tokens this plan appends (>= 1, cached ones included) */
    int32_t first_pos;         /* position of the first appended token */
    int32_t n_cached;          /* leading ones the prefix cache serves (0 none) */
} llmem_plan_seq;

/* A plan as the core builds it; implementations read it, never change it.
 * Nothing in it has n_seq_max entries (DESIGN.md contract 9: a plan costs
 * O(its tokens and sequences)); a sequence's entry is found through
 * llmem_plan_seq_find. */
struct llmem_plan {
    llmem_memory *mem;
    int32_t n_ubatch;
    llmem_ubatch *ubatch;      /* [n_ubatch] */
    /* Full sequence-id set of each sequence group: group s of ubatch u holds
     * group_ids[u][group_off[u][s] .. group_off[u][s+1]), first id first. */
    int32_t **group_off;       /* [n_ubatch][n_seqs + 1] */
    int32_t **group_ids;       /* [n_ubatch][...] */
    int32_t n_seq_max;
    int32_t n_seqs;            /* distinct sequences the batch appends to */
    const llmem_plan_seq *seqs; /* [n_seqs] in increasing id order */
    /* [n_seqs] entry k's token ids (seqs[k].n_new, cached ones first); NULL
     * for a batch of embeddings */
    const int32_t *const *seq_tokens;
    /* [n_seqs] length at which entry k's state snapshot is published: the
     * plan ends a ubatch there, or the memory writes it inside one
     * (prefix_cut's *every -1); 0 none. NULL when no entry has one. */
    const int32_t *snap_at;
    llmem_plan_info info;
    int32_t n_applied;         /* ubatches applied so far */
    int32_t n_committed;       /* ubatches committed so far */
    void *res;                 /* the implementation's reservation */
    /* core-owned map id -> index into seqs (-1 none): an open-addressing
     * hash of 1 << seq_map_bits entries, at most half full, or for
     * seq_map_bits 0 a table of n_seq_max entries indexed by id (when
     * n_seq_max is at most a few times the batch) */
    const int32_t *seq_map;
    int32_t seq_map_bits;
    void *storage;             /* core-owned arrays */
};

/* Slot of sequence id `seq` in plan->seq_map (Fibonacci hashing). */
static inline uint32_t llmem_plan_seq_hash(int32_t seq, int32_t bits)
{
    return (uint32_t)(((uint32_t)seq * 0x9e3779b1u) >> (32 - bits));
}

/* Index k of sequence `seq` in plan->seqs, or -1 when the batch appends
 * nothing to it (or seq is out of range). O(1) expected: one hash and a
 * short linear probe of plan->seq_map, or one load of its table. */
static inline int32_t llmem_plan_seq_index(const llmem_plan *plan, int32_t seq)
{
    if (!plan->seq_map)
        return -1;
    if (plan->seq_map_bits == 0)
        return (uint32_t)seq < (uint32_t)plan->n_seq_max ? plan->seq_map[seq] : -1;
    uint32_t mask = (1u << plan->seq_map_bits) - 1;
    for (uint32_t h = llmem_plan_seq_hash(seq, plan->seq_map_bits);; h = (h + 1) & mask) {
        int32_t k = plan->seq_map[h];
        if (k < 0 || plan->seqs[k].id == seq)
            return k;
    }
}

/* The plan's entry for sequence `seq`, or NULL (llmem_plan_seq_index). */
static inline const llmem_plan_seq *llmem_plan_seq_find(const llmem_plan *plan, int32_t seq)
{
    int32_t k = llmem_plan_seq_index(plan, seq);
    return k >= 0 ? &plan->seqs[k] : NULL;
}

/* The reader/writer used by state I/O. */
typedef struct llmem_state_writer {
    uint8_t *buf;
    size_t cap, len; /* len may exceed cap while only sizing (buf NULL) */
} llmem_state_writer;

typedef struct llmem_state_reader {
    const uint8_t *buf;
    size_t len, pos;
    bool failed;
} llmem_state_reader;

void llmem_state_put(llmem_state_writer *w, const void *data, size_t n);
void llmem_state_put_i32(llmem_state_writer *w, int32_t v);
/* Room for n bytes at the writer's end: a pointer to fill (e.g. by a
 * device download), or NULL while only sizing or when it does not fit;
 * either way the length advances by n. */
void *llmem_state_reserve(llmem_state_writer *w, size_t n);
bool llmem_state_get(llmem_state_reader *r, void *data, size_t n);
/* Pointer to the next n bytes of the serialized state (no copy), or NULL (and
 * failed set) when fewer remain. */
const void *llmem_state_peek(llmem_state_reader *r, size_t n);
bool llmem_state_get_i32(llmem_state_reader *r, int32_t *v);

/* One section of a state stream: its payload, size and checksum verified. */
typedef struct llmem_state_section {
    const uint8_t *data;
    size_t size;
} llmem_state_section;

/* Writes one section (u64 size, u64 XXH3-64, then mem's state_write
 * payload). For compositions that write a section per child. Returns
 * state_write's status, LLMEM_E_UNSUPPORTED when mem cannot write state. */
llmem_status llmem_state_write_section(llmem_memory *mem, int32_t seq, llmem_state_writer *w);
/* Parses one section into *tmp with mem's state_read_prepare and checks
 * that the payload was used exactly (else LLMEM_E_CORRUPT, nothing kept).
 * Statuses as state_read_prepare; err gets the reason, naming section i. */
llmem_status llmem_state_prepare_section(llmem_memory *mem, int32_t seq,
                                         const llmem_state_section *sec, int32_t i, void **tmp,
                                         char *err, size_t err_len);

typedef struct llmem_memory_i {
    size_t struct_size;
    const char *type; /* "kv_cache", "recurrent", "hybrid", ... */

    void (*destroy)(llmem_memory *mem);

    /* Planning. prefix_match (optional): how many leading tokens of `tokens`
     * (a new sequence starting at position 0) the memory already holds for
     * reuse. reserve: reserve everything the plan's ubatches need or fail
     * leaving the memory unchanged; *res receives the reservation. */
    int32_t (*prefix_match)(llmem_memory *mem, const int32_t *tokens, int32_t n);
    llmem_status (*reserve)(llmem_memory *mem, const llmem_plan *plan, void **res, char *err,
                            size_t err_len);
    llmem_status (*apply)(llmem_memory *mem, const llmem_plan *plan, void *res, int32_t i);
    llmem_status (*view)(llmem_memory *mem, void *res, int32_t il, llmem_view *view);
    llmem_status (*commit)(llmem_memory *mem, const llmem_plan *plan, void *res, int32_t i);
    void (*release)(llmem_memory *mem, const llmem_plan *plan, void *res);

    /* Sequences (seq -1 = all where the public API allows it). */
    llmem_status (*seq_rm)(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, bool dry_run);
    llmem_status (*seq_cp)(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0, int32_t p1,
                           bool dry_run);
    llmem_status (*seq_keep)(llmem_memory *mem, int32_t seq, bool dry_run);
    llmem_status (*seq_add)(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1,
                            int32_t delta, bool dry_run); /* optional */
    llmem_status (*seq_div)(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, int32_t d,
                            bool dry_run); /* optional */
    int32_t (*seq_pos_min)(llmem_memory *mem, int32_t seq);
    int32_t (*seq_pos_max)(llmem_memory *mem, int32_t seq);
    int32_t (*seq_tokens)(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap);
    llmem_status (*clear)(llmem_memory *mem, bool data);

    /* State I/O of one sequence (seq >= 0) or all (seq -1): the section
     * payload only; the core adds framing and checksums. state_read_prepare
     * parses and validates the whole section into *tmp without touching the
     * memory; state_read_apply then cannot fail for lack of space; abort
     * frees tmp. */
    llmem_status (*state_write)(llmem_memory *mem, int32_t seq, llmem_state_writer *w);
    llmem_status (*state_read_prepare)(llmem_memory *mem, int32_t seq, llmem_state_reader *r,
                                       void **tmp, char *err, size_t err_len);
    llmem_status (*state_read_apply)(llmem_memory *mem, int32_t seq, void *tmp);
    void (*state_read_abort)(llmem_memory *mem, void *tmp);

    void (*get_stats)(llmem_memory *mem, llmem_memory_stats *stats);
    llmem_status (*check)(llmem_memory *mem, char *err, size_t err_len);

    /* Optional composition accessors. */
    int32_t (*n_children)(llmem_memory *mem);
    llmem_memory *(*child)(llmem_memory *mem, int32_t i);

    /* Optional: what a prepared state section holds for sequence `seq` (-1:
     * the only entry of a one-sequence serialized state): its length and the raw bytes
     * of its token ids and positions (len int32 each, possibly unaligned). Returns false when the section does not
     * hold the sequence. A composition uses it to refuse states whose
     * sections disagree. */
    bool (*state_read_seq)(llmem_memory *mem, void *tmp, int32_t seq, int32_t *len,
                           const void **tokens, const void **pos);

    /* Optional: everything of reserve that can fail (space, validation,
     * index-buffer growth), without changing what the memory holds. The
     * core calls it before reserve; a composition calls it on every child
     * before reserving any, so a child that cannot plan leaves the others
     * untouched (no page taken, no cached page evicted). */
    llmem_status (*reserve_prepare)(llmem_memory *mem, const llmem_plan *plan, char *err,
                                    size_t err_len);

    /* Optional: state I/O over several sections (a composition writes one
     * per child). NULL: the memory is one section (state_write and
     * state_read_*). state_write_sections writes its sections with
     * llmem_state_write_section and sets *n_sections. state_read_sections
     * receives the stream's sections (framing, sizes and checksums already
     * verified) and reads all of them or none, with the statuses of
     * llmem_memory_state_read (LLMEM_E_INVALID for a section count other
     * than its own). */
    llmem_status (*state_write_sections)(llmem_memory *mem, int32_t seq, llmem_state_writer *w,
                                         int32_t *n_sections);
    llmem_status (*state_read_sections)(llmem_memory *mem, int32_t seq,
                                        const llmem_state_section *sec, int32_t n_sections,
                                        char *err, size_t err_len);

    /* Optional (issue 13): for a new sequence `tokens[0, n)` of which the
     * plan serves the first m from the prefix cache and whose first
     * `shared` tokens another new sequence of the batch also starts with,
     * a length in (m, n) at which the plan should end a ubatch of that
     * sequence so the memory can publish reusable state there (a hybrid:
     * the prefix its attention children hold, or the shared one, where its
     * recurrent children have no snapshot); 0 for none. The plan records
     * it in llmem_plan.snap_at. *every (0: none) asks for ubatch ends at
     * every multiple of that length below the cut too, so that a later
     * request whose first chunk stops earlier still finds a state; -1:
     * the memory writes the state at that length inside a ubatch
     * (llmem_rs_view.snap_slot), so the plan records snap_at and ends no
     * ubatch there. */
    int32_t (*prefix_cut)(llmem_memory *mem, const int32_t *tokens, int32_t n, int32_t m,
                          int32_t shared, int32_t *every);

    /* Optional: everything of commit i that can fail (device copies,
     * e.g. a recurrent memory's stream copies), without changing what the
     * memory holds or any state a sequence reads; after it returns LLMEM_OK,
     * commit i cannot fail (but for the guard of a broken invariant). The
     * core calls it right before commit; a composition calls it on every
     * child before committing any, so a child whose device work fails
     * leaves the others uncommitted (all or nothing). A memory must accept
     * a commit without it (doing that work itself), and a commit_prepare
     * that no commit follows (the plan is released instead). */
    llmem_status (*commit_prepare)(llmem_memory *mem, const llmem_plan *plan, void *res,
                                   int32_t i);
} llmem_memory_i;

/* Base object; implementations embed it first and call llmem_memory_init. */
struct llmem_memory {
    const llmem_memory_i *iface;
    int32_t n_layers;
    int32_t n_seq_max;
    llmem_split split;     /* the split this memory needs */
    bool can_shift;
    bool is_child;         /* owned by a composition: no plans of its own */
    llmem_plan *plan;      /* in flight, or NULL */
    llmem_backend *backend;
};

/* struct_size of the first version of llmem_memory_i (through `child`);
 * the slots after it were appended and are optional. */
#define LLMEM_MEMORY_I_MIN_SIZE \
    (offsetof(llmem_memory_i, child) + sizeof(((llmem_memory_i *)0)->child))

/* The slot `name` of mem's vtable, or NULL when the table is too old to
 * have it (its struct_size ends before the slot) or leaves it NULL. Every
 * call of an optional slot, by the core or by a composition calling its
 * children, goes through it. */
#define LLMEM_MEMORY_SLOT(mem, name)                                                 \
    ((mem)->iface->struct_size >=                                                    \
             offsetof(llmem_memory_i, name) + sizeof(((llmem_memory_i *)0)->name)    \
         ? (mem)->iface->name                                                        \
         : NULL)

/* Checks a memory vtable without using it: LLMEM_OK, or the first problem
 * in err (e.g. "kv_cache: struct_size 96 is smaller than the first
 * llmem_memory_i (216 bytes)", "...: reserve is NULL").
 * Returns LLMEM_E_INVALID (NULL iface or type, a NULL required slot:
 * destroy, reserve, apply, view, commit, release, seq_rm, seq_cp,
 * seq_keep, seq_pos_min, seq_pos_max, seq_tokens, clear, get_stats; or
 * state_read_prepare without state_read_apply and state_read_abort);
 * LLMEM_E_ABI (struct_size below LLMEM_MEMORY_I_MIN_SIZE, or above
 * sizeof(llmem_memory_i): built against a newer llmem, whose slots this
 * core would not call). As the backend registry checks llmem_backend_i. */
llmem_status llmem_memory_iface_check(const llmem_memory_i *iface, char *err, size_t err_len);

/* Initialises the base object (implementations call it from their create
 * function, before anything can fail later): checks iface with
 * llmem_memory_iface_check and the numbers (n_layers >= 1, n_seq_max >= 1,
 * split SIMPLE, EQUAL or SEQ), then sets every field; on an error mem is
 * zeroed (iface NULL) and the caller frees what it took and returns the
 * status. `be` is borrowed (the memory's device storage lives there).
 * Returns LLMEM_OK, LLMEM_E_INVALID or LLMEM_E_ABI (see
 * llmem_memory_iface_check). */
llmem_status llmem_memory_init(llmem_memory *mem, const llmem_memory_i *iface, llmem_backend *be,
                               int32_t n_layers, int32_t n_seq_max, llmem_split split,
                               bool can_shift);

#define LLMEM_MEMORY_CAST(type, mem, iface_ptr) \
    ((mem) && (mem)->iface == (iface_ptr) ? (type *)(void *)(mem) : (type *)NULL)


/* ---- helpers for implementations ------------------------------------------------ */

/* A growable int32 array (host memory, owned by whoever holds the struct;
 * zero-initialise it, free with llmem_i32vec_free). A negative cap marks
 * an array the built-in memories place in their per-memory sequence heap
 * (memory/seq_heap.h); an implementation never sets cap itself. */
typedef struct llmem_i32vec {
    int32_t *v;
    int32_t n, cap;
} llmem_i32vec;

/* Makes room for cap elements (n unchanged). false on allocation failure
 * (a unchanged). */
bool llmem_i32vec_reserve(llmem_i32vec *a, int32_t cap);
/* Appends x (amortised O(1)); false on allocation failure (a unchanged). */
bool llmem_i32vec_push(llmem_i32vec *a, int32_t x);
/* Frees the elements; a is empty again. Accepts an empty vector and NULL. */
void llmem_i32vec_free(llmem_i32vec *a);
/* memcpy of n int32 that accepts NULL pointers when n is 0 (memcpy does not). */
void llmem_i32_copy(int32_t *dst, const int32_t *src, int32_t n);

/* A sequence's token ids (as a memory that keeps them on the host holds
 * them): copies up to cap of them into out (may be NULL when cap is 0) and
 * returns how many the sequence holds. For llmem_memory_i.seq_tokens. */
int32_t llmem_seq_copy_tokens(const llmem_i32vec *tokens, int32_t *out, int32_t cap);

/* O(1) facts about a sequence's positions (DESIGN.md contract 9): smallest
 * and largest (-1 when empty) and whether they are out of order. Appends
 * always come at pos_max + 1 (plan validation), so positions stay
 * nondecreasing until a seq_add / seq_div reorders them; while they are in
 * order, range lookups are binary searches. For seq_pos_min / seq_pos_max
 * and the range checks of seq_rm / seq_cp. */
typedef struct llmem_pos_meta {
    int32_t min, max;
    bool unsorted;
} llmem_pos_meta;

/* Recomputes m from every position (O(n): shifts, state reads, checks). */
void llmem_pos_meta_reset(llmem_pos_meta *m, const llmem_i32vec *pos);
/* After appending `pos` (O(1)). */
void llmem_pos_meta_push(llmem_pos_meta *m, int32_t pos);
/* After pos->n shrank (O(1) in order, else O(n)). */
void llmem_pos_meta_truncated(llmem_pos_meta *m, const llmem_i32vec *pos);
/* Index of the first token with a position in [p0, p1) when those tokens
 * are a suffix, n when there are none, -1 when they are not a suffix. */
int32_t llmem_pos_suffix_start(const llmem_i32vec *pos, const llmem_pos_meta *m, int32_t p0,
                               int32_t p1);
/* Number of leading tokens with a position in [p0, p1) when those are all
 * such tokens (0 when none), -1 otherwise. */
int32_t llmem_pos_prefix_len(const llmem_i32vec *pos, const llmem_pos_meta *m, int32_t p0,
                             int32_t p1);
/* Whether m describes pos (for llmem_memory_i.check). */
bool llmem_pos_meta_ok(const llmem_pos_meta *m, const llmem_i32vec *pos);

/* Index tables of views (llmem_i32_table, <llmem/view.h>): a memory builds
 * them on the host for every ubatch of a plan at reserve time, then uploads
 * them once into one device buffer it keeps (grown, never shrunk), which
 * its views name as llmem_view.idx. Zero-initialise; free with
 * llmem_i32vec_free(&b->data). */
typedef struct llmem_idx_builder {
    llmem_i32vec data;
} llmem_idx_builder;

/* Appends n values (or n copies of `fill` when vals is NULL) and returns
 * their element offset, or -1 on allocation failure (b unchanged). */
int32_t llmem_idx_append(llmem_idx_builder *b, const int32_t *vals, int32_t n, int32_t fill);
/* Makes *buf (a buffer of be, or NULL) hold at least n int32, allocating a
 * new buffer before freeing the old one, so a failure leaves *buf as it
 * was. Returns LLMEM_OK, LLMEM_E_NO_MEMORY, LLMEM_E_BACKEND. */
llmem_status llmem_idx_ensure(llmem_backend *be, llmem_buffer **buf, int32_t n);
/* Uploads the built tables into buf (sized by llmem_idx_ensure). Returns
 * llmem_buffer_upload's status. */
llmem_status llmem_idx_upload(llmem_buffer *buf, const llmem_idx_builder *b);
/* The view table of n elements at element offset off of a built index:
 * host pointer into b (valid until b changes), byte offset off * 4. An
 * empty table (n 0) has host NULL. */
llmem_i32_table llmem_idx_table(const llmem_idx_builder *b, int32_t off, int32_t n);

/* Whether the environment asks for poisoned storage (LLMEM_POISON set and
 * not "0"): free pages and slots are then filled with NaN (DESIGN.md
 * contract 3) and results must not change. */
bool llmem_env_poison(void);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

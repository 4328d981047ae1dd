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
 * appending, `struct_size` set; NULL optional slots mean unsupported.
 */
#ifndef LLMEM_MEMORY_IMPL_H
#define LLMEM_MEMORY_IMPL_H

#include "llmem/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A plan as the core builds it; implementations read it, never change it. */
struct llmem_plan {
    llmem_memory *mem;
    int32_t n_ubatch;
    llmem_ubatch *ubatch;      /* [n_ubatch] */
    /* Full sequence-id set of each sequence group: group s of ubatch u holds
     * group_ids[u][group_off[u][s] .. group_off[u][s+1]), first id first. */
    int32_t **group_off;       /* [n_ubatch][n_seqs + 1] */
    int32_t **group_ids;       /* [n_ubatch][...] */
    int32_t n_seq_max;
    int32_t *n_cached;         /* [n_seq_max] tokens a sequence takes from the prefix cache */
    int32_t **seq_tokens;      /* [n_seq_max] token ids this plan appends to each sequence,
                                  cached ones first (NULL when none or embeddings) */
    /* Per sequence, positions given by this batch: [first_pos, first_pos + n_new) */
    int32_t *n_new;            /* [n_seq_max] tokens this plan appends (cached ones included) */
    int32_t *first_pos;        /* [n_seq_max] position of the first appended token, -1 none */
    llmem_plan_info info;
    int32_t n_applied;         /* ubatches applied so far */
    int32_t n_committed;       /* ubatches committed so far */
    void *res;                 /* the implementation's reservation */
    int32_t *snap_at;          /* [n_seq_max] length at which the plan ends a ubatch so that
                                  a state snapshot can be published there; 0 none */
    void *storage;             /* core-owned arrays */
};

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
     * request whose first chunk stops earlier still finds a state. */
    int32_t (*prefix_cut)(llmem_memory *mem, const int32_t *tokens, int32_t n, int32_t m,
                          int32_t shared, int32_t *every);
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

/* Initialises the base object. */
void llmem_memory_init(llmem_memory *mem, const llmem_memory_i *iface, llmem_backend *be,
                       int32_t n_layers, int32_t n_seq_max, llmem_split split, bool can_shift);

/* The one count (DESIGN.md contract 2): pages needed to hold `len + n`
 * tokens when `len` are held, with page_size tokens per page. */
int32_t llmem_pages_for(int32_t len, int32_t n, int32_t page_size);

#define LLMEM_MEMORY_CAST(type, mem, iface_ptr) \
    ((mem) && (mem)->iface == (iface_ptr) ? (type *)(void *)(mem) : (type *)NULL)

#ifdef __cplusplus
}
#endif
#endif

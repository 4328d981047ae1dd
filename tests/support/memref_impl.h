/* Internal structure of the memory reference: memref.c (pages, states,
 * creation), memref_ops.c (plans), memref_seq.c (sequence operations,
 * state reads), memref_data.c (data tags and comparisons), memref_views.c
 * (views). Test code only. */
#ifndef LLMEM_TEST_MEMREF_IMPL_H
#define LLMEM_TEST_MEMREF_IMPL_H

#include "support/memref.h"

#define MR_MAX_HOLD 80   /* states one sequence holds, transiently (1 + n_ckpt + 1 + n_ckpt) */
#define MR_MAX_TOK_SEQ 8 /* sequence ids per batch token */

typedef struct mr_ilist {
    int32_t *v;
    int32_t n, cap;
} mr_ilist;

/* An abstract page. Live while referenced (ref > 0) or published (cached
 * when ref == 0); a dead entry is reused for the next new page. */
typedef struct mr_page {
    bool live;
    int32_t ref;
    bool pub;     /* in the prefix index */
    bool hashed;  /* full, canonical, its whole chain known: may parent a published page */
    bool shift;   /* holds keys whose K-shift has not been applied yet */
    int32_t phys; /* physical page id, learned by memref_bind; -1 unknown */
    uint64_t pubstamp; /* when it was last published: among equal pages the newest is found */
    mr_ilist prefix;  /* token ids from position 0 through the end of this page */
    uint64_t lru;     /* when it last became cached */
} mr_page;

/* A copy-on-write a plan reserved: page table entry `index` of `seq`
 * becomes `page` when the plan's first ubatch is applied, and `page` then
 * holds the old page, which the plan keeps referenced until release. The
 * release of a plan that committed no token to `seq` (its length is still
 * `len0`) puts the old page back and drops the copy: the sharing is as
 * before the plan; otherwise it drops the old page. */
typedef struct mr_cow {
    int32_t seq, index, page, len0;
    bool applied;
} mr_cow;

typedef struct mr_kv {
    memref *owner;   /* for the prefix budget */
    int32_t ps, n_pages;
    bool prefix;
    mr_cow cow[MR_MAX_SEQ];
    int32_t n_cow;
    mr_page *pg;
    int32_t n_pg, cap_pg;
    mr_ilist tab[MR_MAX_SEQ]; /* page table of each sequence (abstract ids) */
    uint64_t *clock; /* the memref's one LRU clock (pages and snapshots) */
    uint64_t pubclock;
    int64_t hits, evictions, cows;
    /* pools, from the first view of each local layer */
    llmem_buffer *k[MR_MAX_LAYERS], *v[MR_MAX_LAYERS];
    size_t row_bytes;
} mr_kv;

typedef struct mr_hold {
    int32_t len;  /* the state after this many tokens */
    int32_t slot; /* -1 until learned */
} mr_hold;

/* A published snapshot (issue 13): the state after tokens prefix.v[0, len). */
typedef struct mr_snap {
    bool live;
    int32_t ref;     /* plans reading it */
    uint64_t lru;    /* publish, re-publish or hit (the memref's clock) */
    uint64_t h;      /* tag hash of the prefix (its state's data tag) */
    int32_t slot;    /* its state slot, learned when a hit reads it; -1 unknown */
    mr_ilist prefix;
} mr_snap;

#define MR_MAX_SNAP 16

typedef struct mr_rs {
    memref *owner;
    int32_t n_ckpt, n_slots, n_seq_slots; /* n_slots = n_seq_slots + n_snap */
    int32_t n_snap;
    mr_snap snap[MR_MAX_SNAP];
    int64_t snap_evictions, snap_hits;
    size_t slot_bytes; /* one snapshot: a state slot of every layer */
    mr_hold h[MR_MAX_SEQ][MR_MAX_HOLD];
    int32_t nh[MR_MAX_SEQ];
    /* state buffers of each local layer: conv, then ssm/delta (n_states) */
    int32_t n_states;
    llmem_buffer *buf[MR_MAX_LAYERS][2];
    size_t bytes[2];
} mr_rs;

/* What the captured ubatch does in one child. */
typedef struct mr_store {
    int32_t tok, slot, seq;
    uint64_t h;
    int32_t pos;
} mr_store;

typedef struct mr_stream {
    int32_t primary, L, T, c;
    uint64_t h0;  /* tag hash of the L tokens before the ubatch */
    int32_t snap; /* the snapshot a hit's src slot is (-1 none) */
    int32_t src, dst;
    int32_t ckpt[MR_MAX_HOLD];
    int32_t ids[MR_MAX_TOK_SEQ], n_ids;
} mr_stream;

typedef struct mr_child {
    mr_child_config cfg;
    llmem_memory *mem;
    int32_t n_layers;                 /* model layers served */
    int32_t layer[MR_MAX_LAYERS];     /* model layer of each local layer */
    mr_kv kv;
    mr_rs rs;
    /* capture */
    mr_store *st;
    int32_t n_st, cap_st;
    int32_t *shift_slot, *shift_delta, n_shift, cap_shift;
    mr_stream *str;
    int32_t n_str, cap_str;
} mr_child;

typedef struct mr_seqv {
    mr_tok *v;
    int32_t n, cap;
} mr_seqv;

typedef struct mr_plan {
    bool active;
    llmem_split split; /* resolved (never AUTO) */
    int32_t n_ubatch;
    int32_t n_tokens;
    mr_ilist token, pos, nseq, out;
    int32_t ids[1024][MR_MAX_TOK_SEQ];
    int32_t n_new[MR_MAX_SEQ], n_cached[MR_MAX_SEQ];
    int32_t pin[MR_MAX_SEQ]; /* the snapshot a hit of seq reads (recurrent child), -1 */
    bool cached_done[MR_MAX_SEQ];
    /* tokens served by the prefix cache, committed with the sequence's first ubatch */
    mr_seqv cached[MR_MAX_SEQ];
    int32_t n_committed;
    bool captured; /* a ubatch was captured (applied) and not committed */
} mr_plan;

struct memref {
    mr_config cfg;
    uint64_t clock;     /* one LRU clock for every child's pages and snapshots */
    int64_t budget;     /* the device prefix budget (bytes; 0: none) */
    llmem_memory *mem;
    int32_t n_seq;
    int32_t n_ch;
    mr_child ch[MR_MAX_CHILD];
    int32_t layer_child[MR_MAX_LAYERS], layer_local[MR_MAX_LAYERS];
    mr_seqv seq[MR_MAX_SEQ];
    mr_plan plan;
};

struct mr_saved {
    bool all;
    int32_t n;
    int32_t seq[MR_MAX_SEQ];
    mr_seqv tok[MR_MAX_SEQ];
    /* per KV child: entry i's first share_len tokens share pages with entry
     * share_from (-1 none): the first earlier entry with the same first
     * page, for their common run of pages (docs/state-format.md) */
    int32_t share_from[MR_MAX_CHILD][MR_MAX_SEQ], share_len[MR_MAX_CHILD][MR_MAX_SEQ];
};

/* memref_data.c: writes the message into err (n bytes); returns false */
bool mr_fail(char *err, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* memref.c: containers, pages and states shared by the parts */
bool mr_ilist_push(mr_ilist *l, int32_t x);
bool mr_seqv_push(mr_seqv *s, mr_tok t);
uint64_t mr_last_h(const mr_seqv *s); /* hash of the last token, MR_H0 when empty */
int32_t mr_div_up(int32_t a, int32_t b);
int32_t mr_kv_used(const mr_kv *kv);
int32_t mr_kv_cached(const mr_kv *kv);
int32_t mr_phys(const mr_kv *kv, int32_t seq, int32_t idx); /* physical page of page idx of seq */
/* A new page (ref 1): a free one, else the least recently cached page is
 * evicted; -1 when there is none. */
int32_t mr_kv_alloc(mr_kv *kv);
void mr_kv_die(mr_kv *kv, int32_t a);
void mr_kv_ref(mr_kv *kv, int32_t a);
void mr_kv_unref(mr_kv *kv, int32_t a);      /* ref 0: cached when published, else dead */
/* Drops page table entries [keep, n) of seq, last first. */
void mr_kv_drop_from(mr_kv *kv, int32_t seq, int32_t keep);
bool mr_kv_writable(const mr_kv *kv, int32_t a);
/* Published pages matching tokens[0, n), whole pages from the first; count. */
int32_t mr_kv_match(const mr_kv *kv, const int32_t *tokens, int32_t n, int32_t *out);
/* Page k of seq just became full at commit: publish it if the contract says so. */
void mr_kv_publish(mr_kv *kv, const mr_seqv *s, int32_t seq, int32_t k);
int32_t mr_rs_find(const mr_rs *rs, int32_t seq, int32_t len); /* holding index, -1 */
/* Length of seq and hash of its last token as the forward pass sees them
 * (prefix-cache tokens of the plan in flight included). */
void mr_seq_head(const memref *r, int32_t seq, int32_t *len, uint64_t *h);
/* Ids of batch token i of the plan in flight. */
int32_t mr_plan_ids(const memref *r, int32_t i, const int32_t **ids);
/* The prefix budget: evicts the least recently used unpinned cached page or
 * snapshot of any child until used + extra fits; false when it cannot. */
bool mr_budget_room(memref *r, int64_t extra);
/* Publishes (or touches) the snapshot of seq's first len tokens when the
 * contract says so (canonical positions, token ids). */
void mr_snap_publish(memref *r, mr_rs *rs, int32_t seq, int32_t len);
/* The live snapshot of exactly tokens[0, len), -1 none; the longest with
 * length <= m (mr_snap_longest). */
int32_t mr_snap_find(const mr_rs *rs, const int32_t *tokens, int32_t len);
int32_t mr_snap_longest(const mr_rs *rs, const int32_t *tokens, int32_t m);
/* memref_ops.c: the reserved copies-on-write happen (the first apply). */
void mr_apply_cows(memref *r);
/* Lengths of the states a primary sequence keeps after a ubatch adding new[] (n_new). */
int32_t mr_rs_after(const mr_rs *rs, int32_t seq, const mr_hold *add, int32_t n_add, mr_hold *out);

#endif

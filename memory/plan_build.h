/* llmem memory/: a plan while memory/plan.c builds it, shared with
 * memory/plan_prefix.c (the prefix-cache skips). Internal. */
#ifndef LLMEM_MEMORY_PLAN_BUILD_H
#define LLMEM_MEMORY_PLAN_BUILD_H

#include <stdbool.h>
#include <stdint.h>

#include "memory/internal.h"

typedef struct stream_set {
    int32_t off, n; /* into the flat id lists */
} stream_set;

/* Per sequence of the plan (index k of plan_build.seqs), while it is built. */
typedef struct seq_tmp {
    int32_t next_pos;  /* the position its next batch token must have (validate);
                          then its cursor into the plan's token block */
    int32_t set;       /* the id set its tokens came in so far, -1 none */
    int32_t single;    /* the set {this sequence}, or -1 */
    uint32_t mark;     /* stamp of the set being compared */
} seq_tmp;

/* A sequence's cut (prefix_skips), for do_split. */
typedef struct seq_cut {
    int32_t cut;       /* batch tokens of it before which a ubatch must end
                          (llmem_plan.snap_at), 0 none */
    int32_t cut_m;     /* its first batch token's position (the prefix hit) */
    int32_t cut_every; /* below a cut, ubatches also end at multiples of this (0 none) */
} seq_cut;

typedef struct plan_build {
    const llmem_batch *b;
    int32_t n_seq_max;
    /* per batch token */
    int32_t *stream;   /* global stream id */
    bool *skip;        /* served by the prefix cache */
    bool *out;
    /* the plan's sequences, in the order they first appear until sorted */
    llmem_plan_seq *seqs;
    seq_tmp *tmp;
    int32_t n_seqs, cap_seqs;
    int32_t *map;      /* [1 << map_bits] id -> k, -1 empty; at most half full */
    int32_t map_bits;
    int32_t last_id, last_k; /* the previous pair's (a prompt's tokens: all one) */
    bool unsorted;     /* a sequence was listed after one of a larger id */
    int32_t *pair_k;   /* [n_pairs] k of every (token, id) pair, in batch order */
    int32_t n_pairs, cap_pairs;
    seq_cut *cuts;     /* [n_seqs] once a sequence has a cut, else NULL */
    int32_t *snap_at;  /* llmem_plan.snap_at, writable */
    /* streams */
    i32vec ids;        /* flat seq ids of each distinct stream */
    stream_set *sets;
    int32_t n_sets, cap_sets;
    /* grouping: one-id sets through seq_tmp.single; larger sets by hash (chains) */
    uint32_t stamp;
    int32_t *bucket;   /* [n_buckets] first set of a chain, -1; made at the first
                          token in several sequences */
    int32_t n_buckets;
    i32vec chain;      /* [n_sets] next set of the same bucket */
    int32_t *local;    /* [n_sets] stream of a set in the ubatch being emitted, or -1 */
} plan_build;

static inline int32_t tok_nseq(const llmem_batch *b, int32_t i)
{
    return b->n_seq_id ? b->n_seq_id[i] : 1;
}

static inline int32_t tok_seq(const llmem_batch *b, int32_t i, int32_t j)
{
    return b->seq_id ? b->seq_id[i][j] : 0;
}

/* Decides how many leading tokens of each new sequence the prefix cache
 * serves (llmem_plan_seq.n_cached, pb->skip, the cuts and
 * llmem_plan.snap_at): only sequences that are empty, start at position 0,
 * have token ids and no shared tokens; never the last token of a sequence
 * in the batch, never a token that needs an output. LLMEM_OK or
 * LLMEM_E_NO_MEMORY. */
llmem_status plan_prefix_skips(llmem_memory *mem, plan_build *pb, llmem_plan *p);

#endif

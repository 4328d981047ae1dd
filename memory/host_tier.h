/* llmem memory/: the host tier of the prefix cache (issue 13 item 3).
 *
 * Host memory that evicted prefix-cache data spills to: published KV pages
 * (kv_host.c) and recurrent snapshots (rs_snap.c), of any number of
 * memories. A hybrid's children share one tier (hybrid.c), so pages and
 * snapshots are evicted least recently used together, under one byte
 * budget. Each entry holds its owner (the memory whose data it is: part of
 * the key), a chain key (hash, parent hash), its token ids (verified on
 * every lookup) and its data bytes. An entry is free, cached (on the LRU)
 * or pinned (off the LRU: a plan will restore it, so no insert evicts it).
 * The budget counts data bytes (entries' and kept spare blocks'); keys and
 * token ids are bookkeeping outside it, like the device pool's.
 *
 * Data blocks come from the backend's host allocator when it has one
 * (llmem_backend_host_alloc: pinned memory on CUDA, so that copies to and
 * from the device can be asynchronous), else from malloc. Blocks of
 * removed entries are kept as spares for the next insert of the same size
 * (pinned allocations are slow). Single-threaded, like its owners. */
#ifndef LLMEM_HOST_TIER_H
#define LLMEM_HOST_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"

typedef struct host_entry {
    const void *owner;   /* NULL: free */
    uint64_t hash, parent_hash;
    int32_t n_tokens;
    int32_t *tokens;     /* [n_tokens], malloc'd */
    uint8_t *data;       /* [bytes] */
    size_t bytes;
    uint8_t state;       /* 0 free, 1 cached, 2 pinned */
    int32_t lru_prev, lru_next, bucket_next;
    int32_t restored;    /* scratch of kv_host_restore, -1 between calls */
} host_entry;

typedef struct host_block {
    uint8_t *p;
    size_t bytes;
} host_block;

typedef struct host_len {
    const void *owner;
    int32_t len, count;
} host_len;

/* Per-owner totals, kept so that stats are O(owners), not O(entries). */
typedef struct host_own {
    const void *owner;
    int64_t n, bytes;
    int32_t pinned;
} host_own;

typedef struct host_tier {
    int32_t refs;          /* memories sharing it */
    size_t budget, used;   /* data bytes: budget, and held (entries + spares) */
    llmem_backend *be;     /* host allocator (pinned on CUDA), or NULL: malloc */
    host_entry *e;
    int32_t cap, n_live;
    int32_t *free_ids, n_free_ids;
    int32_t *bucket, n_buckets;
    int32_t lru_head, lru_tail;
    host_block *spare;
    int32_t n_spare, cap_spare;
    host_len *lens;        /* distinct (owner, n_tokens) of live entries */
    int32_t n_lens, cap_lens;
    host_own *own;         /* owners that ever inserted (a memory's children: few) */
    int32_t n_own, cap_own;
    int64_t n_evictions;
} host_tier;

/* Creates a tier of `budget` data bytes (> 0) whose blocks come from be's
 * host allocator (NULL: malloc); the caller holds the one reference.
 * Returns NULL when host memory runs out. */
host_tier *host_tier_create(size_t budget, llmem_backend *be);
/* Takes one more reference (a memory sharing the tier). */
void host_tier_ref(host_tier *ht);
/* Drops one reference; frees the tier with the last. Accepts NULL. */
void host_tier_unref(host_tier *ht);
/* Removes every entry of `owner` (its memory was cleared). */
void host_tier_drop_owner(host_tier *ht, const void *owner);
/* Cached or pinned entry of owner with this key and tokens[0, n_tokens),
 * or -1. Accepts ht NULL (-1). */
int32_t host_tier_lookup(const host_tier *ht, const void *owner, uint64_t hash,
                         uint64_t parent_hash, const int32_t *tokens, int32_t n_tokens);
/* The longest n_tokens < below of owner's entries, or -1: the candidate
 * lengths of a lookup by prefix, longest first. O(distinct lengths). */
int32_t host_tier_next_len(const host_tier *ht, const void *owner, int32_t below);
/* Takes an entry of `bytes` data bytes for owner under the key (a spare
 * block, a new one within the budget, else evicting least recently used
 * cached entries of any owner) and returns it, cached; the caller fills
 * ht->e[e].data. -1 when it cannot fit (every entry pinned, bytes over
 * the budget) or host memory runs out: nothing changed then, except
 * entries evicted on the way. */
int32_t host_tier_insert(host_tier *ht, const void *owner, uint64_t hash, uint64_t parent_hash,
                         const int32_t *tokens, int32_t n_tokens, size_t bytes);
/* Takes a cached entry off the LRU so that no insert evicts it. */
void host_tier_pin(host_tier *ht, int32_t e);
/* Puts a pinned entry back on the LRU (most recently used end). */
void host_tier_unpin(host_tier *ht, int32_t e);
/* Removes an entry (cached or pinned); its block becomes a spare. */
void host_tier_remove(host_tier *ht, int32_t e);
/* owner's entries now: count, data bytes, pinned ones (any out-param may
 * be NULL). O(owners). */
void host_tier_usage(const host_tier *ht, const void *owner, int64_t *n, int64_t *bytes,
                     int32_t *n_pinned);

/* Consistency check (free list, LRU, index, lengths, byte count); writes
 * the first violation into err. Accepts NULL (true). */
bool host_tier_check(const host_tier *ht, char *err, size_t err_len);

#endif

/* llmem memory/: one device byte budget for cached prefix data (issue 13
 * item 1).
 *
 * Cached prefix data is what a memory keeps on the device only so that a
 * later request can skip its prefix: KV pages no sequence holds that stay
 * in the prefix index (a KV cache's cached pages), and recurrent snapshots.
 * A budget is shared by the memories that join it (a hybrid's children),
 * with one LRU clock: every cached page is stamped when it becomes cached,
 * every snapshot when it is published or read by a hit. When an entry
 * needs room, the least recently used unpinned entry of any member, page
 * or snapshot, is evicted (to the host tier when there is one) until the
 * bytes fit. Pinned entries (pages a sequence or plan holds, snapshots a
 * plan reads) are never evicted: while a plan pins more than the budget,
 * the bytes may exceed it, and its release evicts down again.
 *
 * The budget counts data bytes on the device (2 * n_layers * page bytes
 * per KV page, one state slot per snapshot), not the fixed allocations
 * they live in (the KV pool, the snapshot slots). vLLM's
 * --kv-cache-memory-bytes and SGLang's radix cache size one pool for both
 * kinds the same way; SGLang's Mamba radix cache keeps two LRU lists, this
 * keeps one. Single-threaded, like its members. */
#ifndef LLMEM_PREFIX_BUDGET_H
#define LLMEM_PREFIX_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/memory.h"

/* Memories one budget can serve (a hybrid's KV caches and recurrent child). */
#define PREFIX_BUDGET_MAX_MEMBERS 16

typedef struct prefix_budget {
    int32_t refs;
    int64_t bytes;   /* the budget (> 0) */
    uint64_t clock;  /* the members' LRU clock (pages and snapshots stamp from it) */
    llmem_memory *member[PREFIX_BUDGET_MAX_MEMBERS];
    int32_t n_member;
    bool busy;       /* an eviction is running (no re-entry) */
} prefix_budget;

/* Creates a budget of `bytes` (> 0) with no member; the caller holds the
 * one reference. NULL when host memory runs out. */
prefix_budget *prefix_budget_create(int64_t bytes);
/* Drops one reference; frees the budget with the last. Accepts NULL. */
void prefix_budget_unref(prefix_budget *pb);
/* mem (a KV cache or recurrent memory) joins pb, taking a reference, and
 * stamps its entries from pb's clock from now on. False when pb is full. */
bool prefix_budget_join(prefix_budget *pb, llmem_memory *mem);
/* mem leaves pb (its destroy) and drops its reference. Accepts NULL pb. */
void prefix_budget_leave(prefix_budget *pb, llmem_memory *mem);
/* Device bytes the members' cached pages and snapshots hold now. O(members). */
int64_t prefix_budget_used(const prefix_budget *pb);
/* Evicts least recently used unpinned entries of any member until used +
 * extra <= bytes. Returns whether they fit (false: nothing left to evict;
 * what was evicted on the way stays evicted). Accepts NULL pb (true). */
bool prefix_budget_make_room(prefix_budget *pb, int64_t extra);

/* Consistency check of mem's budget (accepts NULL pb): mem is a member,
 * and with no plan in flight (mem->plan NULL: nothing pinned) the cached
 * bytes are within the budget. Writes the violation into err. */
bool prefix_budget_check(const prefix_budget *pb, const llmem_memory *mem, char *err,
                         size_t err_len);

/* What a member provides (kv_cache.c, rs_snap.c): its cached bytes, the
 * stamp of its least recently used unpinned entry (false: none), and the
 * eviction of that entry. */
int64_t kv_budget_bytes(llmem_memory *mem);
bool kv_budget_oldest(llmem_memory *mem, uint64_t *stamp);
void kv_budget_evict(llmem_memory *mem);
int64_t rs_budget_bytes(llmem_memory *mem);
bool rs_budget_oldest(llmem_memory *mem, uint64_t *stamp);
void rs_budget_evict(llmem_memory *mem);

#endif

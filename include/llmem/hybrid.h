/* llmem: a composition of memories, one child per layer.
 *
 * Model layer il is served by child layer_child[il]; its index inside that
 * child is the number of earlier layers mapped to the same child. The
 * split is the strictest child's; plans and sequence operations are
 * all-or-nothing across children (check all, then act); the reusable prefix
 * is the shortest all children agree on; state I/O concatenates the
 * children's sections.
 *
 * Reference: llama.cpp's llama_memory_hybrid (attention + recurrent), with
 * any number of children.
 */
#ifndef LLMEM_HYBRID_H
#define LLMEM_HYBRID_H

#include "llmem/memory.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Creates a hybrid over n_children memories; takes ownership of them (on
 * success and on failure). Every child must have the same n_seq_max and
 * exactly as many layers as layer_child maps to it.
 *   layer_child: [n_layers] child index of each model layer, copied.
 * Children that cache prefix data (KV caches with a prefix cache,
 * recurrent memories with snapshots) share one host tier and one device
 * prefix budget: the largest prefix_cache_bytes any of them was created
 * with, one LRU over their cached pages and snapshots (issue 13; vLLM and
 * SGLang size one cache pool for both kinds likewise).
 * Returns LLMEM_OK; LLMEM_E_INVALID (mismatched children or map, or a
 * prefix budget below what one hybrid hit needs: a page of every KV cache
 * plus one snapshot; reason in err); LLMEM_E_NO_MEMORY. */
llmem_status llmem_hybrid_create(llmem_memory *const *children, int32_t n_children,
                                 const int32_t *layer_child, int32_t n_layers,
                                 llmem_memory **out, char *err, size_t err_len);

/* Creates the composition of tensor-parallel ranks (issue 19; Megatron-LM,
 * Shoeybi et al. 2019): n_ranks memories with the same layers, rank r's
 * memory holding the KV heads and recurrent heads of rank r. One plan per
 * batch is computed once (splitting, prefix-cache decisions, snapshot
 * cuts: those of rank 0's memory) and applied to every rank; sequence
 * operations and state I/O act on all ranks or none, as a hybrid's.
 * Layer r * L + l of the composition is layer l of rank r (L = each
 * rank's n_layers), so rank r's forward pass reads its own views. Host
 * tiers and prefix budgets are not shared between ranks (a page of rank r
 * holds other heads than the same page of rank 0); each rank's evicts
 * alike, as every rank sees the same operations. Takes ownership of the ranks' memories
 * (on success and on failure); every one needs the same n_seq_max,
 * n_layers, split and memory type. llmem_memory_get_stats (type "tp")
 * reports rank 0's counts (pages, slots, hits, snapshots: the same on
 * every rank) and the bytes summed over ranks.
 * Returns LLMEM_OK; LLMEM_E_INVALID (n_ranks < 1, NULL or mismatched
 * memories, reason in err); LLMEM_E_NO_MEMORY. */
llmem_status llmem_hybrid_create_ranks(llmem_memory *const *ranks, int32_t n_ranks,
                                       llmem_memory **out, char *err, size_t err_len);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

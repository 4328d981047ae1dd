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

#ifdef __cplusplus
}
#endif
#endif

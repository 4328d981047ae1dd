/* llmem memory/: dense storage for per-sequence arrays.
 *
 * A decode step appends to every sequence's token and position arrays and
 * reads the tail of its page table and its state holdings. As separate
 * malloc blocks of 128 KiB and more, each of those arrays is a mapping of
 * its own, and at 4,000 sequences a step touches some 10,000 scattered
 * pages. A seq heap carves these arrays out of a few large chunks instead,
 * packed by size class. The chunks were advised as transparent huge pages
 * until the twelfth session's measurements: with that advice the commit of
 * a 4,000-sequence step at 64K tokens in pages of 1 doubled in some
 * processes, and without it the 4,000 x 64K steps took 25-30% less
 * (docs/benchmarks.md, "Final check of the twelfth session"); the large
 * arrays indexed at random every step (page rows, the page pool's
 * per-page arrays) keep the advice (seq_heap_advise).
 *
 * A heap-backed i32vec (internal.h) keeps its fields' meaning except that
 * cap holds minus the capacity; its block starts with a 16-byte header that
 * names the heap and the block's size class, so i32vec_reserve and
 * i32vec_free (util.c) grow and free it without being told the heap. Size
 * classes are powers of two from 4 entries; a freed block goes to its
 * class's free list and is reused by the next block of that class (memory
 * goes back to the system only when the heap is destroyed, as with page
 * rows); blocks over SEQ_HEAP_BIG bytes get their own allocation and are
 * freed at once. Chunks grow geometrically from 256 KiB to 32 MiB, so a
 * memory of a few sequences stays small; chunk k's blocks start 17 k
 * cache lines into it, so that the tails of equally long arrays in
 * different (2 MiB-aligned) chunks do not share cache sets. One heap per
 * memory; like the memory, it is used by one thread at a time. */
#ifndef LLMEM_SEQ_HEAP_H
#define LLMEM_SEQ_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memory/internal.h"

#define SEQ_HEAP_BIG ((size_t)4 << 20) /* bytes: larger blocks are allocated on their own */

typedef struct seq_heap seq_heap;

/* A new, empty heap, or NULL when out of host memory. */
seq_heap *seq_heap_create(void);
/* Frees every chunk (the vectors using it must be freed or no longer
 * used). Accepts NULL. */
void seq_heap_destroy(seq_heap *h);
/* Makes the empty, unallocated vector *a (v NULL, n 0, cap 0) heap-backed
 * with room for 4 entries. Returns false, with *a unchanged, when out of
 * host memory. */
bool seq_heap_attach(seq_heap *h, i32vec *a);
/* Host bytes the heap holds (chunks and big blocks). */
size_t seq_heap_bytes(const seq_heap *h);

/* Advises the whole 2 MiB-aligned huge pages inside [p, p + bytes) as
 * transparent huge pages (no-op for ranges shorter than two of them, or
 * without MADV_HUGEPAGE): for large arrays indexed at random every step
 * (page rows, the page pool's per-page arrays). Advice only: nothing
 * changes but the page size the kernel may use. */
void seq_heap_advise(void *p, size_t bytes);

/* Touches every 4 KiB page of [p, p + bytes) (a write of the byte already
 * there), so that the page faults of arrays a step would otherwise touch
 * for the first time happen now: calloc hands out large blocks as
 * untouched zero pages, and in a virtual machine a first touch can cost
 * the host a fault as well. The contents do not change; the host memory
 * is committed. p NULL or bytes 0: nothing. */
void seq_heap_prefault(void *p, size_t bytes);

/* For util.c: grows the heap-backed *a to at least cap entries (contents
 * kept) / gives its block back and leaves it {NULL, 0, 0}. */
bool seq_heap_grow(i32vec *a, int32_t cap);
void seq_heap_release(i32vec *a);

#endif

/* llmem memory/: dense storage for per-sequence arrays (seq_heap.h).
 * Transparent huge pages for seq_heap_advise's arrays: Linux
 * Documentation/admin-guide/mm/transhuge.rst (MADV_HUGEPAGE on a 2 MiB-aligned
 * range). */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "memory/seq_heap.h"

#define SEQ_HDR 16                  /* bytes before a block's entries */
#define SEQ_MIN_CAP 4               /* entries of class 0 (a block of 32 bytes) */
#define SEQ_CLASSES 29              /* class 28: 1 << 30 entries */
#define SEQ_HUGE ((size_t)2 << 20)  /* huge page size: chunk alignment, seq_heap_advise */
#define SEQ_CHUNK0 ((size_t)256 << 10)
#define SEQ_CHUNK_MAX ((size_t)32 << 20)

typedef struct blk_hdr {
    seq_heap *heap;
    int32_t cls;
    int32_t big; /* allocated on its own */
} blk_hdr;

_Static_assert(sizeof(blk_hdr) <= SEQ_HDR, "block header must fit SEQ_HDR bytes");

struct seq_heap {
    void **chunks;
    int32_t n_chunks, cap_chunks;
    char *bump, *bump_end;  /* unused tail of the newest chunk */
    size_t next_chunk;      /* bytes of the next chunk */
    blk_hdr *free_list[SEQ_CLASSES]; /* next block stored in the entries */
    size_t bytes;
};

static size_t class_bytes(int32_t c)
{
    return SEQ_HDR + sizeof(int32_t) * ((size_t)SEQ_MIN_CAP << c);
}

static int32_t *entries(blk_hdr *b)
{
    return (int32_t *)(void *)((char *)b + SEQ_HDR);
}

static blk_hdr *hdr_of(int32_t *v)
{
    return (blk_hdr *)(void *)((char *)v - SEQ_HDR);
}

/* Host memory of `bytes`, aligned to 2 MiB when at least that long (the
 * chunks' cache colours count from that alignment). Not advised as huge
 * pages: with MADV_HUGEPAGE on the chunks, a decode step's commit at 4,000
 * sequences of 64K tokens in pages of 1 ran at about twice its time in
 * some processes (0.16 -> 0.27-0.39 ms, 6 of 18 runs), and without it in
 * none (docs/benchmarks.md, "Final check of the twelfth session"). */
static void *big_alloc(size_t bytes)
{
    if (bytes < SEQ_HUGE)
        return malloc(bytes);
    size_t n = (bytes + SEQ_HUGE - 1) / SEQ_HUGE * SEQ_HUGE;
    return aligned_alloc(SEQ_HUGE, n);
}

static size_t big_size(size_t bytes)
{
    return bytes < SEQ_HUGE ? bytes : (bytes + SEQ_HUGE - 1) / SEQ_HUGE * SEQ_HUGE;
}

static void push_free(seq_heap *h, blk_hdr *b, int32_t c)
{
    b->heap = h;
    b->cls = c;
    b->big = 0;
    memcpy(entries(b), &h->free_list[c], sizeof(blk_hdr *));
    h->free_list[c] = b;
}

/* Starts a new chunk of at least `bytes`; the old chunk's tail is cut into
 * free blocks so nothing is lost. */
static bool new_chunk(seq_heap *h, size_t bytes)
{
    if (h->n_chunks == h->cap_chunks) {
        int32_t nc = h->cap_chunks ? 2 * h->cap_chunks : 8;
        void **c = realloc(h->chunks, (size_t)nc * sizeof *c);
        if (!c)
            return false;
        h->chunks = c;
        h->cap_chunks = nc;
    }
    /* Cache colour: chunk k's blocks start 17 k lines (mod the 2,048 sets
     * of a 2 MiB, 16-way L2) into it. Blocks of 128 KiB and more span a
     * whole number of set cycles, so within a chunk the tails of equally
     * long arrays climb one set per four blocks from the chunk's start,
     * and every chunk (2 MiB-aligned) started at the same set: at 1,000
     * sequences of 128K tokens all token tails fell into 8 sets and
     * missed every step. */
    size_t color = (size_t)((h->n_chunks * 17) % 2048) * 64;
    /* room for the block after the cache-line alignment below (a chunk
     * from malloc is only 16-byte aligned) and the colour */
    size_t need = bytes + 64 + color;
    size_t sz = h->next_chunk > need ? h->next_chunk : need;
    char *p = big_alloc(sz);
    if (!p)
        return false;
    for (int32_t c = SEQ_CLASSES - 1; c >= 0; c--)
        while (h->bump && (size_t)(h->bump_end - h->bump) >= class_bytes(c)) {
            push_free(h, (blk_hdr *)(void *)h->bump, c);
            h->bump += class_bytes(c);
        }
    h->chunks[h->n_chunks++] = p;
    h->bytes += big_size(sz);
    /* blocks from a cache-line boundary: two class-0 blocks attached one
     * after the other (a sequence's state slots and their lengths) share
     * one line */
    h->bump = p + (64 - (uintptr_t)p % 64) % 64 + color;
    h->bump_end = p + sz;
    if (h->next_chunk < SEQ_CHUNK_MAX)
        h->next_chunk *= 2;
    return true;
}

static int32_t *blk_alloc(seq_heap *h, int32_t c)
{
    size_t bytes = class_bytes(c);
    blk_hdr *b;
    if (bytes > SEQ_HEAP_BIG) {
        if (!(b = big_alloc(bytes)))
            return NULL;
        h->bytes += big_size(bytes);
        b->big = 1;
    } else if (h->free_list[c]) {
        b = h->free_list[c];
        memcpy(&h->free_list[c], entries(b), sizeof(blk_hdr *));
        b->big = 0;
    } else {
        if ((!h->bump || (size_t)(h->bump_end - h->bump) < bytes) && !new_chunk(h, bytes))
            return NULL;
        b = (blk_hdr *)(void *)h->bump;
        h->bump += bytes;
        b->big = 0;
    }
    b->heap = h;
    b->cls = c;
    return entries(b);
}

static void blk_free(int32_t *v)
{
    blk_hdr *b = hdr_of(v);
    seq_heap *h = b->heap;
    if (b->big) {
        h->bytes -= big_size(class_bytes(b->cls));
        free(b);
    } else {
        push_free(h, b, b->cls);
    }
}

void seq_heap_prefault(void *p, size_t bytes)
{
    /* volatile: a store of the value just read, which a compiler would
     * otherwise drop (calloc's memory reads 0 and is written 0) */
    volatile unsigned char *c = p;
    for (size_t off = 0; c && off < bytes; off += 4096)
        c[off] = c[off];
    if (c && bytes > 0)
        c[bytes - 1] = c[bytes - 1];
}

void seq_heap_advise(void *p, size_t bytes)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a = ((uintptr_t)p + SEQ_HUGE - 1) / SEQ_HUGE * SEQ_HUGE;
    uintptr_t e = ((uintptr_t)p + bytes) / SEQ_HUGE * SEQ_HUGE;
    if (p && e > a && e - a >= SEQ_HUGE)
        (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

seq_heap *seq_heap_create(void)
{
    seq_heap *h = calloc(1, sizeof *h);
    if (h)
        h->next_chunk = SEQ_CHUNK0;
    return h;
}

void seq_heap_destroy(seq_heap *h)
{
    if (!h)
        return;
    for (int32_t k = 0; k < h->n_chunks; k++)
        free(h->chunks[k]);
    free(h->chunks);
    free(h);
}

size_t seq_heap_bytes(const seq_heap *h)
{
    return h ? h->bytes : 0;
}

bool seq_heap_attach(seq_heap *h, i32vec *a)
{
    if (!h || a->v || a->cap != 0)
        return false;
    int32_t *v = blk_alloc(h, 0);
    if (!v)
        return false;
    a->v = v;
    a->n = 0;
    a->cap = -SEQ_MIN_CAP;
    return true;
}

bool seq_heap_grow(i32vec *a, int32_t cap)
{
    if (cap <= -a->cap)
        return true;
    int32_t c = hdr_of(a->v)->cls;
    while (c < SEQ_CLASSES - 1 && ((int64_t)SEQ_MIN_CAP << c) < cap)
        c++;
    if (((int64_t)SEQ_MIN_CAP << c) < cap)
        return false;
    int32_t *nv = blk_alloc(hdr_of(a->v)->heap, c);
    if (!nv)
        return false;
    i32_copy(nv, a->v, a->n);
    blk_free(a->v);
    a->v = nv;
    a->cap = -(SEQ_MIN_CAP << c);
    return true;
}

void seq_heap_release(i32vec *a)
{
    if (a->v)
        blk_free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

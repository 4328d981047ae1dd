/* llmem memory/: persistent page-table rows with incremental uploads.
 *
 * Every sequence of a paged memory owns one row: a run of int32 entries of
 * one table that lives on the host and, at the same element offsets, at
 * the start of the memory's device index buffer. A step writes only the
 * entries that changed (a decode step: one entry every page_size tokens)
 * and uploads only the entries it wrote, so a step never costs in
 * proportion to context length. Views point kernels at a row through
 * llmem_kv_view.page_off.
 *
 * Capacity: a row's capacity is a size class (4, 5, 6, 7, 8, 10, 12, 14,
 * 16, 20, ... : four classes per doubling, at most 25% slack; from 256
 * entries on one cache line more, an odd number of lines, so that the
 * tails of equally long rows side by side spread over the cache sets
 * instead of sharing a few); a row that
 * outgrows its class moves to a larger one (amortized O(1) per entry) and
 * freed rows are reused by their class. The table therefore holds about
 * the entries the sequences hold, not n_seq_max x the longest sequence:
 * 4,000 sequences of 128K tokens in pages of 1 take ~2.1 GB per copy (host
 * and device), in pages of 16 ~130 MB, where a dense [n_seq_max][max_pages]
 * table would take the same only when every sequence is at the maximum and
 * a fixed maximum otherwise. Freed rows are not coalesced; a workload that
 * keeps growing new long rows while freeing short ones can leave up to
 * the freed capacity unused (reported by page_rows_bytes). */
#ifndef LLMEM_PAGE_ROWS_H
#define LLMEM_PAGE_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "memory/internal.h"

#define PAGE_ROWS_CLASSES 116 /* class 115: 7 << 28 entries */
#define PAGE_ROWS_GAP 16      /* pending ranges this close (entries) upload as one */
#define PAGE_ROWS_CHUNK 256   /* page_rows_write_upload: pairs per upload, host-visible */

typedef struct page_rows {
    int32_t *v;          /* [cap] host copy of every row; -1 where unused */
    int32_t n, cap;      /* entries in use (high-water), allocated */
    i32vec free_rows[PAGE_ROWS_CLASSES];
    /* entries written since the last upload, as (first, count) pairs in
     * write order; a write that continues the last range extends it. A
     * list, not a flag per block of the table: a decode step in pages of
     * 1 writes one entry into every row, and a flag per row would be one
     * more scattered cache line per sequence */
    i32vec pend;
    bool full;           /* the whole table must be uploaded (new device buffer) */
    /* one upload's byte runs: collected, then handed to
     * llmem_buffer_upload_ranges in one call */
    size_t *run_off, *run_len;
    int32_t n_runs, run_cap;
    /* Shared storage (page_rows_share), NULL otherwise: v is not a block
     * of this table's own but the host memory of a host-visible device
     * buffer, which share_grow replaces by a larger one (v's first cap
     * entries kept, the new ones -1, then v and cap set; false when out of
     * memory, nothing changed). The device then reads what the host
     * writes: nothing is recorded, nothing uploaded. */
    bool (*share_grow)(void *ctx, struct page_rows *r, int64_t cap);
    void *share_ctx;
    /* page_rows_write_upload's direction: flips at every call */
    bool back;
} page_rows;

void page_rows_finish(page_rows *r);
/* Puts an empty table (nothing allocated yet) into shared storage: from
 * now on grow(ctx, r, cap) provides v (see page_rows.share_grow). For a
 * device whose buffers are host memory (llmem_backend_info.host_visible):
 * a decode step in pages of 1 then writes each row's new entry once, into
 * the memory the views read, instead of into a host copy and then, at the
 * upload, a second scattered line. */
void page_rows_share(page_rows *r, bool (*grow)(void *ctx, page_rows *r, int64_t cap),
                     void *ctx);
/* Entries of size class c. */
int32_t page_rows_class_cap(int32_t c);
/* Entries the table would use if a row of at least n entries were taken
 * now without reuse (an upper bound for planning). */
int64_t page_rows_cost(int32_t n);
/* Gives *row (-1: none) a capacity of at least n entries: keeps it when it
 * fits, else moves to a row of a larger class (contents not kept: the
 * caller rewrites them). Returns false on host allocation failure, with
 * *row and *cap unchanged. */
bool page_rows_fit(page_rows *r, int32_t *row, int32_t *cap, int32_t n);
/* page_rows_fit that keeps the first `keep` entries of the row when it
 * moves (copied into the new row and recorded for the next upload): for
 * a page table that lives in its row (kv_internal.h). */
bool page_rows_fit_keep(page_rows *r, int32_t *row, int32_t *cap, int32_t n, int32_t keep);
/* Returns a row to its class (*row becomes -1). */
void page_rows_free(page_rows *r, int32_t *row, int32_t *cap);
/* Room for n entries in all (the sum of page_rows_cost of the rows to
 * come), so that those rows, taken after page_rows_reset, fit without
 * allocating. false, nothing changed, when out of host memory. */
bool page_rows_reserve(page_rows *r, int64_t n);
/* Drops every row (all free; the device copy is re-uploaded in full). */
void page_rows_reset(page_rows *r);
/* Writes n entries at element `at` and records them for the next upload
 * (when the list cannot grow, the next upload sends the whole table). */
void page_rows_write(page_rows *r, int32_t at, const int32_t *v, int32_t n);
/* Records entries [at, at + n), written in place through r->v, for the
 * next upload. */
void page_rows_note(page_rows *r, int32_t at, int32_t n);
/* Whether any entry of [lo, hi) waits for an upload (O(ranges pending)). */
bool page_rows_pending_in(const page_rows *r, int32_t lo, int32_t hi);
/* page_rows_write of one entry, inline (a decode step writes one entry
 * into each row that gained a page). */
static inline void page_rows_write1(page_rows *r, int32_t at, int32_t v)
{
    r->v[at] = v;
    i32vec *l = &r->pend;
    if (r->full || r->share_grow)
        return;
    if (l->n >= 2 && l->v[l->n - 2] + l->v[l->n - 1] == at) {
        l->v[l->n - 1]++;
    } else if (l->cap >= 0 && l->n + 2 <= l->cap) {
        l->v[l->n++] = at;
        l->v[l->n++] = 1;
    } else {
        page_rows_write(r, at, &v, 1); /* grows the list (or falls back to full) */
    }
}
/* Whether writes wait for an upload. */
static inline bool page_rows_pending(const page_rows *r)
{
    return !r->share_grow && (r->full || r->pend.n > 0);
}
/* Uploads the entries written since the last upload (everything when
 * full) to buf at byte 0, in one llmem_buffer_upload_ranges call (one
 * llmem_buffer_upload per run when the run list cannot grow): the ranges
 * in table order (sorted unless they were written in ascending or
 * descending order already), those at most PAGE_ROWS_GAP entries apart
 * merged into one run. On failure the next upload sends everything. In
 * shared storage nothing is sent: buf's host memory must be r->v
 * (LLMEM_E_STATE otherwise). */
llmem_status page_rows_upload(page_rows *r, llmem_buffer *buf);
/* Writes n (entry, value) pairs (pairs: [2n] int32, entry first; element
 * offsets into the table, each inside a row) into the table and to buf at
 * the same offsets, after page_rows_upload of the same step (these writes
 * are newer). A host-visible buf (the cpu backend) gets them in chunks of
 * PAGE_ROWS_CHUNK pairs, each written and then uploaded, so that the
 * upload reads back entries whose address translations are still cached:
 * a decode step in pages of 1 writes one entry into each of thousands of
 * rows, each in a 4 KiB page of its own, more than the TLB holds. Another
 * buf gets them in one llmem_buffer_upload_ranges call. In shared storage
 * they are only written (the device reads the host's memory); when the run
 * list cannot grow they are written and recorded (page_rows_write1), then
 * page_rows_upload runs. Every other call writes the pairs (and the chunks)
 * in reverse order: the pairs of consecutive decode steps name the same
 * rows in the same order, and a pass that starts where the last one ended
 * finds the translations (and lines) of the rows that pass wrote last
 * still cached, which a pass in the same order has evicted by the time it
 * gets to them (4,000 rows are twice the TLB). Returns LLMEM_OK or the
 * upload's status; on failure every entry is written on the host and the
 * next upload sends the whole table. */
llmem_status page_rows_write_upload(page_rows *r, llmem_buffer *buf, const int32_t *pairs,
                                    int32_t n);
/* Checks that the device copy equals the host's on every entry not
 * waiting for an upload (O(table size); for llmem_memory_check). In shared
 * storage, that buf's host memory is the table (O(1)). */
bool page_rows_check_device(const page_rows *r, llmem_buffer *buf, char *err, size_t err_len);
/* page_rows_check_device over the first n_dev entries only (the rows a
 * device buffer sized before later rows were taken holds; the rest wait
 * for the next full upload). A NULL buf passes (nothing uploaded yet). */
bool page_rows_check_device_upto(const page_rows *r, llmem_buffer *buf, int32_t n_dev, char *err,
                                 size_t err_len);

#endif

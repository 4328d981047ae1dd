/* llmem memory/: persistent page-table rows (see page_rows.h). */
#include <stdlib.h>
#include <string.h>

#include "memory/page_rows.h"
#include "memory/seq_heap.h"

int32_t page_rows_class_cap(int32_t c)
{
    return (4 + (c & 3)) << (c >> 2);
}

static int32_t class_for(int32_t n)
{
    int32_t c = 0;
    while (c < PAGE_ROWS_CLASSES - 1 && page_rows_class_cap(c) < n)
        c++;
    return c;
}

static int32_t class_of_cap(int32_t cap)
{
    int32_t c = class_for(cap);
    return page_rows_class_cap(c) == cap ? c : -1;
}

/* Class chosen for a row that must hold n entries: a quarter of headroom,
 * so that a growing row moves at most once per 25% of growth. */
static int32_t class_grow(int32_t n)
{
    int64_t want = (int64_t)n + n / 4;
    return class_for(want > INT32_MAX ? INT32_MAX : (int32_t)want);
}

int64_t page_rows_cost(int32_t n)
{
    return page_rows_class_cap(class_grow(n));
}

void page_rows_finish(page_rows *r)
{
    free(r->v);
    free(r->dirty);
    for (int32_t c = 0; c < PAGE_ROWS_CLASSES; c++)
        i32vec_free(&r->free_rows[c]);
    i32vec_free(&r->dirty_list);
    free(r->run_off);
    free(r->run_len);
    memset(r, 0, sizeof *r);
}

static bool grow(page_rows *r, int64_t need)
{
    if (need <= r->cap)
        return true;
    if (need > INT32_MAX)
        return false;
    int64_t ncap = r->cap + r->cap / 4 + 4096; /* 1.25x: the table can be GBs */
    ncap = ncap < need ? need : ncap > INT32_MAX ? INT32_MAX : ncap;
    int64_t nb = (ncap + PAGE_ROWS_BLOCK - 1) / PAGE_ROWS_BLOCK;
    int64_t ob = ((int64_t)r->cap + PAGE_ROWS_BLOCK - 1) / PAGE_ROWS_BLOCK;
    /* a decode step touches one entry (and flag) of every row: with
     * thousands of long rows, 4 KiB pages would cost a TLB miss each. The
     * new arrays are advised before the old contents are copied in (a
     * realloc would copy, or mremap, the old contents into plain pages
     * that the advice no longer changes) */
    int32_t *nv = malloc((size_t)ncap * sizeof *nv);
    uint8_t *nd = malloc((size_t)nb);
    if (!nv || !nd) {
        free(nv);
        free(nd);
        return false;
    }
    seq_heap_advise(nv, (size_t)ncap * sizeof *nv);
    seq_heap_advise(nd, (size_t)nb);
    if (r->cap > 0) {
        memcpy(nv, r->v, (size_t)r->cap * sizeof *nv);
        memcpy(nd, r->dirty, (size_t)ob);
    }
    free(r->v);
    free(r->dirty);
    r->v = nv;
    r->dirty = nd;
    memset(r->dirty + ob, 0, (size_t)(nb - ob));
    for (int64_t i = r->cap; i < ncap; i++)
        r->v[i] = -1;
    r->cap = (int32_t)ncap;
    return true;
}

/* Flags the blocks of entries [at, at + n). */
static void flag(page_rows *r, int32_t at, int32_t n)
{
    if (r->full || n <= 0)
        return;
    for (int32_t b = at / PAGE_ROWS_BLOCK; b <= (at + n - 1) / PAGE_ROWS_BLOCK; b++) {
        if (r->dirty[b])
            continue;
        if (!i32vec_push(&r->dirty_list, b)) {
            r->full = true; /* out of host memory: upload everything next time */
            return;
        }
        r->dirty[b] = 1;
    }
}

bool page_rows_fit(page_rows *r, int32_t *row, int32_t *cap, int32_t n)
{
    if (*row >= 0 && n <= *cap)
        return true;
    int32_t c = class_grow(n);
    int32_t ncap = page_rows_class_cap(c), at;
    if (!i32vec_reserve(&r->dirty_list, r->dirty_list.n + 1))
        return false;
    if (r->free_rows[c].n > 0) {
        at = r->free_rows[c].v[--r->free_rows[c].n];
    } else {
        if (!grow(r, (int64_t)r->n + ncap))
            return false;
        at = r->n;
        r->n += ncap;
        /* fresh entries (-1) reach the device too, so that the whole table
         * agrees with the host (what check verifies) */
        flag(r, at, ncap);
    }
    if (*row >= 0)
        page_rows_free(r, row, cap);
    *row = at;
    *cap = ncap;
    return true;
}

void page_rows_free(page_rows *r, int32_t *row, int32_t *cap)
{
    int32_t c = *row >= 0 ? class_of_cap(*cap) : -1;
    /* a failed push only leaks the row's capacity until page_rows_reset */
    if (c >= 0)
        (void)i32vec_push(&r->free_rows[c], *row);
    *row = -1;
    *cap = 0;
}

void page_rows_reset(page_rows *r)
{
    for (int32_t c = 0; c < PAGE_ROWS_CLASSES; c++)
        r->free_rows[c].n = 0;
    r->n = 0;
    r->full = true;
}

void page_rows_write(page_rows *r, int32_t at, const int32_t *v, int32_t n)
{
    if (n <= 0)
        return;
    memcpy(r->v + at, v, (size_t)n * sizeof *v);
    flag(r, at, n);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Queues blocks [b0, b1) for flush_runs; uploads at once when the run list
 * cannot grow (after flushing what is queued, so the order is kept). */
static llmem_status upload_blocks(page_rows *r, llmem_buffer *buf, int32_t b0, int32_t b1)
{
    int64_t lo = (int64_t)b0 * PAGE_ROWS_BLOCK, hi = (int64_t)b1 * PAGE_ROWS_BLOCK;
    hi = hi < r->n ? hi : r->n;
    if (hi <= lo)
        return LLMEM_OK;
    size_t off = (size_t)lo * sizeof(int32_t), len = (size_t)(hi - lo) * sizeof(int32_t);
    if (r->n_runs == r->run_cap) {
        int32_t cap = r->run_cap ? 2 * r->run_cap : 256;
        size_t *o = cap > r->run_cap ? realloc(r->run_off, (size_t)cap * sizeof *o) : NULL;
        if (o)
            r->run_off = o;
        size_t *l = o ? realloc(r->run_len, (size_t)cap * sizeof *l) : NULL;
        if (l)
            r->run_len = l;
        if (!o || !l) {
            llmem_status st = llmem_buffer_upload_ranges(buf, r->v, r->n_runs, r->run_off,
                                                         r->run_len);
            r->n_runs = 0;
            if (st != LLMEM_OK)
                return st;
            return llmem_buffer_upload(buf, off, r->v + lo, len);
        }
        r->run_cap = cap;
    }
    r->run_off[r->n_runs] = off;
    r->run_len[r->n_runs++] = len;
    return LLMEM_OK;
}

/* Uploads the queued runs in one call. */
static llmem_status flush_runs(page_rows *r, llmem_buffer *buf)
{
    llmem_status st = llmem_buffer_upload_ranges(buf, r->v, r->n_runs, r->run_off, r->run_len);
    r->n_runs = 0;
    return st;
}

static int64_t blocks_of(int64_t n)
{
    return (n + PAGE_ROWS_BLOCK - 1) / PAGE_ROWS_BLOCK;
}

/* Uploads the runs of flagged blocks found by scanning every flag (eight
 * at a time over clean stretches). O(blocks of n). */
static llmem_status upload_scan(page_rows *r, llmem_buffer *buf)
{
    int32_t nb = (int32_t)blocks_of(r->n);
    const uint8_t *f = r->dirty;
    llmem_status st = LLMEM_OK;
    for (int32_t b = 0; b < nb && st == LLMEM_OK;) {
        if (!f[b]) {
            uint64_t w;
            if ((b & 7) == 0 && b + 8 <= nb && (memcpy(&w, f + b, 8), w == 0))
                b += 8;
            else
                b++;
            continue;
        }
        int32_t e = b + 1;
        while (e < nb && f[e])
            e++;
        st = upload_blocks(r, buf, b, e);
        b = e;
    }
    return st;
}

llmem_status page_rows_upload(page_rows *r, llmem_buffer *buf)
{
    llmem_status st = LLMEM_OK;
    int32_t *d = r->dirty_list.v, nd = r->dirty_list.n;
    if (r->full) {
        st = upload_blocks(r, buf, 0, (r->n + PAGE_ROWS_BLOCK - 1) / PAGE_ROWS_BLOCK);
    } else if (nd > 0 && (int64_t)nd * PAGE_ROWS_SCAN >= blocks_of(r->n)) {
        /* dense (a decode step in pages of 1 flags a block per sequence):
         * the flags in block order are runs already, no sort needed */
        st = upload_scan(r, buf);
    } else if (nd > 0) {
        /* sorted runs of adjacent blocks, one copy each (bridging gaps costs
         * more bytes than it saves calls on the host: a decode step of 4,000
         * sequences flags one block per sequence) */
        bool sorted = true;
        for (int32_t i = 1; i < nd && sorted; i++)
            sorted = d[i - 1] < d[i];
        if (!sorted)
            qsort(d, (size_t)nd, sizeof *d, cmp_i32);
        for (int32_t i = 0; i < nd && st == LLMEM_OK;) {
            int32_t j = i + 1;
            while (j < nd && d[j] - d[j - 1] <= 1)
                j++;
            st = upload_blocks(r, buf, d[i], d[j - 1] + 1);
            i = j;
        }
    }
    llmem_status fl = flush_runs(r, buf);
    st = st != LLMEM_OK ? st : fl;
    for (int32_t i = 0; i < nd; i++)
        r->dirty[d[i]] = 0;
    r->dirty_list.n = 0;
    r->full = st != LLMEM_OK;
    return st;
}

bool page_rows_check_device(const page_rows *r, llmem_buffer *buf, char *err, size_t err_len)
{
    if (r->full || r->n == 0)
        return true;
    if (!buf || llmem_buffer_size(buf) < (size_t)r->n * sizeof(int32_t)) {
        llmem_errf(err, err_len, "page rows: device buffer smaller than the %d-entry table", r->n);
        return false;
    }
    int32_t *dev = malloc((size_t)r->n * sizeof *dev);
    if (!dev)
        return true; /* cannot check without memory; not a violation */
    bool ok = llmem_buffer_download(buf, 0, dev, (size_t)r->n * sizeof *dev) == LLMEM_OK;
    if (!ok)
        llmem_errf(err, err_len, "page rows: device download failed");
    for (int32_t i = 0; ok && i < r->n; i++)
        if (!r->dirty[i / PAGE_ROWS_BLOCK] && dev[i] != r->v[i]) {
            llmem_errf(err, err_len, "page rows: device entry %d is %d, host %d", i, dev[i],
                       r->v[i]);
            ok = false;
        }
    free(dev);
    return ok;
}

/* llmem memory/: persistent page-table rows (see page_rows.h). */
#include <stdlib.h>
#include <string.h>

#include "memory/page_rows.h"
#include "memory/seq_heap.h"

int32_t page_rows_class_cap(int32_t c)
{
    int32_t base = (4 + (c & 3)) << (c >> 2);
    /* From 256 entries on, one cache line (16 entries) more, so that a
     * row spans an odd number of lines. Rows of one class lie side by
     * side, and sequences of equal length keep their tails at equal
     * offsets: with an even stride of (4..7) << k lines those tails fall
     * into 1 / 2^k of the cache sets (all 1,000 rows of 128K tokens into
     * one set of L1 and L2), so thousands of sequences missed on their
     * row every step; an odd stride spreads them over every set. */
    return base >= 256 ? base + 16 : base;
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

void page_rows_share(page_rows *r, bool (*grow)(void *ctx, page_rows *r, int64_t cap),
                     void *ctx)
{
    r->share_grow = grow;
    r->share_ctx = ctx;
    r->full = false;
    r->pend.n = 0;
}

void page_rows_finish(page_rows *r)
{
    if (!r->share_grow) /* shared storage belongs to its buffer */
        free(r->v);
    for (int32_t c = 0; c < PAGE_ROWS_CLASSES; c++)
        i32vec_free(&r->free_rows[c]);
    i32vec_free(&r->pend);
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
    if (r->share_grow)
        return r->share_grow(r->share_ctx, r, ncap);
    /* a decode step touches one entry of every row: with thousands of long
     * rows, 4 KiB pages would cost a TLB miss each. The new array is
     * advised before the old contents are copied in (a realloc would copy,
     * or mremap, them into plain pages that the advice no longer changes) */
    int32_t *nv = malloc((size_t)ncap * sizeof *nv);
    if (!nv)
        return false;
    seq_heap_advise(nv, (size_t)ncap * sizeof *nv);
    if (r->cap > 0)
        memcpy(nv, r->v, (size_t)r->cap * sizeof *nv);
    free(r->v);
    r->v = nv;
    for (int64_t i = r->cap; i < ncap; i++)
        r->v[i] = -1;
    r->cap = (int32_t)ncap;
    return true;
}

/* Records entries [at, at + n) for the next upload. */
static void note(page_rows *r, int32_t at, int32_t n)
{
    i32vec *l = &r->pend;
    if (r->full || r->share_grow || n <= 0)
        return;
    if (l->n >= 2 && l->v[l->n - 2] <= at && at <= l->v[l->n - 2] + l->v[l->n - 1]) {
        int32_t end = at + n > l->v[l->n - 2] + l->v[l->n - 1] ? at + n
                                                               : l->v[l->n - 2] + l->v[l->n - 1];
        l->v[l->n - 1] = end - l->v[l->n - 2];
        return;
    }
    if (!i32vec_reserve(l, l->n + 2)) {
        r->full = true; /* out of host memory: upload everything next time */
        l->n = 0;
        return;
    }
    l->v[l->n++] = at;
    l->v[l->n++] = n;
}

bool page_rows_fit_keep(page_rows *r, int32_t *row, int32_t *cap, int32_t n, int32_t keep)
{
    if (*row >= 0 && n <= *cap)
        return true;
    int32_t c = class_grow(n);
    int32_t ncap = page_rows_class_cap(c), at;
    if (!i32vec_reserve(&r->pend, r->pend.n + 4))
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
        note(r, at, ncap);
    }
    keep = *row >= 0 ? (keep < *cap ? keep : *cap) : 0;
    if (keep > 0) { /* after grow: r->v may have moved */
        memcpy(r->v + at, r->v + *row, (size_t)keep * sizeof *r->v);
        note(r, at, keep);
    }
    if (*row >= 0)
        page_rows_free(r, row, cap);
    *row = at;
    *cap = ncap;
    return true;
}

bool page_rows_fit(page_rows *r, int32_t *row, int32_t *cap, int32_t n)
{
    return page_rows_fit_keep(r, row, cap, n, 0);
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

bool page_rows_reserve(page_rows *r, int64_t n)
{
    return grow(r, n) && i32vec_reserve(&r->pend, r->pend.n + 4);
}

void page_rows_reset(page_rows *r)
{
    for (int32_t c = 0; c < PAGE_ROWS_CLASSES; c++)
        r->free_rows[c].n = 0;
    r->n = 0;
    r->pend.n = 0;
    r->full = !r->share_grow;
}

void page_rows_write(page_rows *r, int32_t at, const int32_t *v, int32_t n)
{
    if (n <= 0)
        return;
    memcpy(r->v + at, v, (size_t)n * sizeof *v);
    note(r, at, n);
}

void page_rows_note(page_rows *r, int32_t at, int32_t n)
{
    note(r, at, n);
}

bool page_rows_pending_in(const page_rows *r, int32_t lo, int32_t hi)
{
    if (r->share_grow)
        return false;
    if (r->full)
        return hi > lo;
    for (int32_t i = 0; i < r->pend.n; i += 2)
        if (r->pend.v[i] < hi && lo < r->pend.v[i] + r->pend.v[i + 1])
            return true;
    return false;
}

/* Room for cap runs in run_off / run_len; false when out of host memory
 * (nothing lost). */
static bool runs_fit(page_rows *r, int32_t cap)
{
    if (cap <= r->run_cap)
        return true;
    size_t *o = realloc(r->run_off, (size_t)cap * sizeof *o);
    if (o)
        r->run_off = o;
    size_t *l = o ? realloc(r->run_len, (size_t)cap * sizeof *l) : NULL;
    if (l)
        r->run_len = l;
    if (!o || !l)
        return false;
    r->run_cap = cap;
    return true;
}

/* Queues entries [lo, hi) for flush_runs; uploads at once when the run
 * list cannot grow (after flushing what is queued, so the order is kept). */
static llmem_status upload_run(page_rows *r, llmem_buffer *buf, int64_t lo, int64_t hi)
{
    hi = hi < r->n ? hi : r->n;
    if (hi <= lo)
        return LLMEM_OK;
    size_t off = (size_t)lo * sizeof(int32_t), len = (size_t)(hi - lo) * sizeof(int32_t);
    if (r->n_runs == r->run_cap) {
        int32_t cap = r->run_cap ? 2 * r->run_cap : 256;
        if (cap <= r->run_cap || !runs_fit(r, cap)) {
            llmem_status st = llmem_buffer_upload_ranges(buf, r->v, r->n_runs, r->run_off,
                                                         r->run_len);
            r->n_runs = 0;
            if (st != LLMEM_OK)
                return st;
            return llmem_buffer_upload(buf, off, r->v + lo, len);
        }
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

llmem_status page_rows_write_upload(page_rows *r, llmem_buffer *buf, const int32_t *pairs,
                                    int32_t n)
{
    if (n <= 0)
        return LLMEM_OK;
    /* every other call walks the pairs backwards (see page_rows.h) */
    bool back = r->back = !r->back;
    int32_t chunk = llmem_buffer_host_ptr(buf) ? PAGE_ROWS_CHUNK : n;
    if (r->share_grow) { /* nothing recorded, nothing uploaded: any order */
        for (int32_t i = 0; i < n; i++) {
            int32_t j = back ? n - 1 - i : i;
            r->v[pairs[2 * j]] = pairs[2 * j + 1];
        }
        return page_rows_upload(r, buf); /* checks that buf is this storage */
    }
    if (r->full || r->n_runs > 0 || !runs_fit(r, chunk)) {
        for (int32_t i = 0; i < n; i++) /* recorded: the next upload sends them */
            page_rows_write1(r, pairs[2 * i], pairs[2 * i + 1]);
        return page_rows_upload(r, buf);
    }
    llmem_status st = LLMEM_OK;
    for (int32_t c = 0; c < n; c += chunk) {
        int32_t m = n - c < chunk ? n - c : chunk, k = 0;
        int32_t i0 = back ? n - c - m : c; /* the chunk's first pair */
        for (int32_t t = 0; t < m; t++) {
            int32_t j = back ? i0 + m - 1 - t : i0 + t;
            int32_t at = pairs[2 * j];
            r->v[at] = pairs[2 * j + 1];
            size_t off = (size_t)at * sizeof(int32_t);
            if (k > 0 && r->run_off[k - 1] + r->run_len[k - 1] == off) { /* a prefill's run */
                r->run_len[k - 1] += sizeof(int32_t);
                continue;
            }
            if (k > 0 && off + sizeof(int32_t) == r->run_off[k - 1]) { /* the same, backwards */
                r->run_off[k - 1] = off;
                r->run_len[k - 1] += sizeof(int32_t);
                continue;
            }
            r->run_off[k] = off;
            r->run_len[k++] = sizeof(int32_t);
        }
        if (st == LLMEM_OK)
            st = llmem_buffer_upload_ranges(buf, r->v, k, r->run_off, r->run_len);
    }
    if (st != LLMEM_OK) /* the device copy is unknown: send everything next time */
        r->full = true;
    return st;
}

static int cmp_range(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Puts the (first, count) pairs of l in ascending order of first: nothing
 * to do or a reversal for the orders decode steps write in (rows are
 * taken from free lists, so the rows of sequences 0, 1, 2, ... can lie in
 * descending order), a sort otherwise. */
static void order_ranges(i32vec *l)
{
    int32_t n = l->n / 2, *v = l->v;
    bool asc = true, desc = true;
    for (int32_t i = 1; i < n && (asc || desc); i++) {
        asc = asc && v[2 * i - 2] <= v[2 * i];
        desc = desc && v[2 * i - 2] >= v[2 * i];
    }
    if (asc)
        return;
    if (desc) {
        for (int32_t i = 0, j = n - 1; i < j; i++, j--) {
            int32_t a = v[2 * i], c = v[2 * i + 1];
            v[2 * i] = v[2 * j];
            v[2 * i + 1] = v[2 * j + 1];
            v[2 * j] = a;
            v[2 * j + 1] = c;
        }
        return;
    }
    qsort(v, (size_t)n, 2 * sizeof *v, cmp_range);
}

llmem_status page_rows_upload(page_rows *r, llmem_buffer *buf)
{
    llmem_status st = LLMEM_OK;
    i32vec *l = &r->pend;
    if (r->share_grow)
        return r->n == 0 || llmem_buffer_host_ptr(buf) == (void *)r->v ? LLMEM_OK : LLMEM_E_STATE;
    if (r->full) {
        st = upload_run(r, buf, 0, r->n);
    } else if (l->n > 0) {
        order_ranges(l);
        int64_t lo = l->v[0], hi = (int64_t)l->v[0] + l->v[1];
        for (int32_t i = 2; i < l->n && st == LLMEM_OK; i += 2) {
            int64_t a = l->v[i], b = a + l->v[i + 1];
            if (a <= hi + PAGE_ROWS_GAP) { /* overlapping or close: one run */
                hi = b > hi ? b : hi;
                continue;
            }
            st = upload_run(r, buf, lo, hi);
            lo = a;
            hi = b;
        }
        if (st == LLMEM_OK)
            st = upload_run(r, buf, lo, hi);
    }
    llmem_status fl = flush_runs(r, buf);
    st = st != LLMEM_OK ? st : fl;
    l->n = 0;
    r->full = st != LLMEM_OK;
    return st;
}

bool page_rows_check_device(const page_rows *r, llmem_buffer *buf, char *err, size_t err_len)
{
    if (r->share_grow)
        return page_rows_check_device_upto(r, buf, r->n, err, err_len);
    if (r->full || r->n == 0)
        return true;
    if (!buf || llmem_buffer_size(buf) < (size_t)r->n * sizeof(int32_t)) {
        llmem_errf(err, err_len, "page rows: device buffer smaller than the %d-entry table", r->n);
        return false;
    }
    return page_rows_check_device_upto(r, buf, r->n, err, err_len);
}

bool page_rows_check_device_upto(const page_rows *r, llmem_buffer *buf, int32_t n_dev, char *err,
                                 size_t err_len)
{
    if (r->share_grow) {
        if (r->n == 0 || (buf && llmem_buffer_host_ptr(buf) == (void *)r->v &&
                          llmem_buffer_size(buf) >= (size_t)r->cap * sizeof(int32_t)))
            return true;
        llmem_errf(err, err_len, "page rows: shared table is not the index buffer's memory");
        return false;
    }
    if (r->full || r->n == 0 || !buf)
        return true; /* nothing on the device yet, or all of it waits for an upload */
    size_t cmp = llmem_buffer_size(buf) / sizeof(int32_t);
    int32_t n = n_dev < r->n ? n_dev : r->n;
    n = cmp < (size_t)n ? (int32_t)cmp : n;
    if (n <= 0)
        return true;
    int32_t *dev = malloc((size_t)n * sizeof *dev);
    uint8_t *skip = r->pend.n > 0 ? calloc((size_t)n, 1) : NULL;
    if (!dev || (r->pend.n > 0 && !skip)) {
        free(dev);
        free(skip);
        return true; /* cannot check without memory; not a violation */
    }
    for (int32_t i = 0; i < r->pend.n; i += 2) /* written, not uploaded yet */
        for (int32_t k = r->pend.v[i]; k < r->pend.v[i] + r->pend.v[i + 1] && k < n; k++)
            skip[k] = 1;
    bool ok = llmem_buffer_download(buf, 0, dev, (size_t)n * sizeof *dev) == LLMEM_OK;
    if (!ok)
        llmem_errf(err, err_len, "page rows: device download failed");
    for (int32_t i = 0; ok && i < n; i++)
        if ((!skip || !skip[i]) && dev[i] != r->v[i]) {
            llmem_errf(err, err_len, "page rows: device entry %d is %d, host %d", i, dev[i],
                       r->v[i]);
            ok = false;
        }
    free(dev);
    free(skip);
    return ok;
}

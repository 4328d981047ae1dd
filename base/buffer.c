/* llmem base: the public buffer API.
 *
 * Thin wrappers over a backend's vtable: they check arguments and byte
 * ranges (overflow-safe), run the fault-injection hook, and keep the
 * backend's reference count (one per live buffer), so a backend and its
 * plugin outlive llmem_backend_close while buffers remain. Backends see
 * only valid, non-empty ranges.
 */
#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"

/* Source of llmem_buffer.write_gen: unique across buffers and writes, so a
 * new buffer at a freed one's address never repeats its generation. */
static atomic_uint_fast64_t write_gen_next = 1;

static void mark_written(llmem_buffer *buf)
{
    buf->write_gen = (uint64_t)atomic_fetch_add(&write_gen_next, 1);
}

/* [offset, offset + size) lies inside the buffer; no overflow possible. */
static bool range_ok(const llmem_buffer *buf, size_t offset, size_t size)
{
    return offset <= buf->size && size <= buf->size - offset;
}

void llmem_backend_set_alloc_hook(llmem_backend *be, llmem_alloc_hook hook, void *ctx)
{
    if (!be)
        return;
    be->alloc_hook = hook;
    be->alloc_hook_ctx = hook ? ctx : NULL;
}

llmem_status llmem_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out)
{
    if (!out)
        return LLMEM_E_INVALID;
    *out = NULL;
    if (!be || size == 0)
        return LLMEM_E_INVALID;
    if (be->alloc_hook && !be->alloc_hook(size, be->alloc_hook_ctx))
        return LLMEM_E_NO_MEMORY;
    llmem_status st = llmem_backend_retain(be);
    if (st != LLMEM_OK)
        return st;
    llmem_buffer *buf = NULL;
    st = be->iface->buffer_alloc(be, size, &buf);
    if (st == LLMEM_OK && !buf)
        st = LLMEM_E_BACKEND;
    if (st != LLMEM_OK) {
        /* The caller still holds its own reference: this never destroys. */
        llmem_backend_release(be);
        return st;
    }
    buf->backend = be;
    buf->size = size;
    mark_written(buf);
    *out = buf;
    return LLMEM_OK;
}

void llmem_buffer_free(llmem_buffer *buf)
{
    if (!buf)
        return;
    llmem_backend *be = buf->backend;
    be->iface->buffer_free(be, buf);
    llmem_backend_release(be);
}

size_t llmem_buffer_size(const llmem_buffer *buf)
{
    return buf ? buf->size : 0;
}

llmem_backend *llmem_buffer_backend(const llmem_buffer *buf)
{
    return buf ? buf->backend : NULL;
}

void *llmem_buffer_host_ptr(llmem_buffer *buf)
{
    return buf ? buf->host : NULL;
}

llmem_status llmem_buffer_upload(llmem_buffer *dst, size_t offset, const void *src, size_t size)
{
    if (!dst || (!src && size) || !range_ok(dst, offset, size))
        return LLMEM_E_INVALID;
    if (size == 0)
        return LLMEM_OK;
    llmem_backend *be = dst->backend;
    mark_written(dst);
    return be->iface->buffer_upload(be, dst, offset, src, size);
}

llmem_status llmem_buffer_upload_ranges(llmem_buffer *dst, const void *src, int32_t n,
                                        const size_t *offset, const size_t *size)
{
    if (!dst || n < 0 || (n > 0 && (!src || !offset || !size)))
        return LLMEM_E_INVALID;
    bool any = false;
    for (int32_t j = 0; j < n; j++) {
        if (!range_ok(dst, offset[j], size[j]))
            return LLMEM_E_INVALID;
        any = any || size[j] > 0;
    }
    if (!any)
        return LLMEM_OK;
    llmem_backend *be = dst->backend;
    mark_written(dst);
    const unsigned char *s = src;
    for (int32_t j = 0; j < n; j++) {
        if (size[j] == 0)
            continue;
#if defined(__GNUC__)
        /* host-visible buffers: the scattered destination lines are cache
         * misses; requesting them a few ranges ahead overlaps the misses */
        if (dst->host && j + 8 < n)
            __builtin_prefetch((unsigned char *)dst->host + offset[j + 8], 1, 1);
#endif
        llmem_status st = be->iface->buffer_upload(be, dst, offset[j], s + offset[j], size[j]);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

llmem_status llmem_buffer_download(llmem_buffer *src, size_t offset, void *dst, size_t size)
{
    if (!src || (!dst && size) || !range_ok(src, offset, size))
        return LLMEM_E_INVALID;
    if (size == 0)
        return LLMEM_OK;
    llmem_backend *be = src->backend;
    return be->iface->buffer_download(be, src, offset, dst, size);
}

llmem_status llmem_buffer_copy(llmem_buffer *dst, size_t dst_offset, llmem_buffer *src,
                               size_t src_offset, size_t size)
{
    if (!dst || !src || dst->backend != src->backend)
        return LLMEM_E_INVALID;
    if (!range_ok(dst, dst_offset, size) || !range_ok(src, src_offset, size))
        return LLMEM_E_INVALID;
    if (size == 0)
        return LLMEM_OK;
    /* Both ranges are in bounds, so these sums cannot overflow. */
    if (dst == src && dst_offset < src_offset + size && src_offset < dst_offset + size)
        return LLMEM_E_INVALID;
    llmem_backend *be = dst->backend;
    mark_written(dst);
    return be->iface->buffer_copy(be, dst, dst_offset, src, src_offset, size);
}

/* ---- batched copies (llmem_buffer_copy_ranges) ---- */

/* One side of a range for the overlap check: bytes [begin, end) of the
 * buffer numbered id (numbers handed out per call). */
typedef struct span {
    uint64_t begin, end;
    uint32_t id, write;
} span;

/* Byte d of the sort key (id, begin), least significant first. */
static inline unsigned span_digit(const span *s, int d)
{
    return d < 8 ? (unsigned)(s->begin >> (8 * d)) & 255u : (s->id >> (8 * (d - 8))) & 255u;
}

/* LSD radix sort of a[0..m) by (id, begin), 8-bit digits, only over the
 * digits that differ between spans (offsets within a few MiB and a few
 * hundred buffers: about 4 passes). Returns the array that holds the
 * result (a or tmp). O(m). */
static span *sort_spans(span *a, span *tmp, size_t m)
{
    static_assert(sizeof(((span *)0)->id) == 4, "id is 4 digits");
    uint64_t vb = 0;
    uint32_t vi = 0;
    for (size_t k = 1; k < m; k++) {
        vb |= a[k].begin ^ a[0].begin;
        vi |= a[k].id ^ a[0].id;
    }
    for (int d = 0; d < 12; d++) {
        if (((d < 8 ? vb >> (8 * d) : vi >> (8 * (d - 8))) & 255u) == 0)
            continue;
        size_t h[256] = {0};
        for (size_t k = 0; k < m; k++)
            h[span_digit(&a[k], d)]++;
        size_t at = 0;
        for (int v = 0; v < 256; v++) {
            size_t c = h[v];
            h[v] = at;
            at += c;
        }
        for (size_t k = 0; k < m; k++)
            tmp[h[span_digit(&a[k], d)]++] = a[k];
        span *t = a;
        a = tmp;
        tmp = t;
    }
    return a;
}

/* Number of buffer b in this call: an open-addressing table of cap (a
 * power of two, more than twice the buffers) entries. */
static uint32_t buf_id(const llmem_buffer **key, uint32_t *val, size_t cap, uint32_t *n_ids,
                       const llmem_buffer *b)
{
    size_t i = (size_t)(((uint64_t)(uintptr_t)b >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 32) &
               (cap - 1);
    while (key[i] && key[i] != b)
        i = (i + 1) & (cap - 1);
    if (!key[i]) {
        key[i] = b;
        val[i] = (*n_ids)++;
    }
    return val[i];
}

/* Whether some destination overlaps another range's destination or any
 * source: the spans sorted by buffer and start, each one compared with the
 * furthest end of the spans before it in its buffer (of all of them, and of
 * the destinations). O(n). *ok false on success means an overlap; returns
 * false when out of memory. */
static bool ranges_disjoint(const llmem_copy_range *r, int32_t n, bool *ok)
{
    *ok = true;
    size_t m = 2 * (size_t)n, cap = 16;
    while (cap < 2 * m)
        cap *= 2;
    span *sp = malloc(2 * m * sizeof *sp);
    const llmem_buffer **key = calloc(cap, sizeof *key);
    uint32_t *val = malloc(cap * sizeof *val);
    if (!sp || !key || !val) {
        free(sp);
        free(key);
        free(val);
        return false;
    }
    uint32_t n_ids = 0, id_d = 0, id_s = 0;
    const llmem_buffer *last_d = NULL, *last_s = NULL;
    m = 0;
    for (int32_t j = 0; j < n; j++) {
        if (r[j].size == 0)
            continue;
        /* consecutive ranges mostly share buffers: skip the table then */
        if (r[j].dst != last_d)
            id_d = buf_id(key, val, cap, &n_ids, last_d = r[j].dst);
        if (r[j].src != last_s)
            id_s = buf_id(key, val, cap, &n_ids, last_s = r[j].src);
        sp[m++] = (span){r[j].dst_offset, r[j].dst_offset + r[j].size, id_d, 1};
        sp[m++] = (span){r[j].src_offset, r[j].src_offset + r[j].size, id_s, 0};
    }
    span *o = sort_spans(sp, sp + m, m);
    uint64_t end_any = 0, end_dst = 0;
    for (size_t k = 0; k < m && *ok; k++) {
        if (k == 0 || o[k].id != o[k - 1].id)
            end_any = end_dst = 0;
        /* a destination may touch nothing before it; a source no destination */
        if (o[k].begin < (o[k].write ? end_any : end_dst))
            *ok = false;
        if (o[k].end > end_any)
            end_any = o[k].end;
        if (o[k].write && o[k].end > end_dst)
            end_dst = o[k].end;
    }
    free(sp);
    free(key);
    free(val);
    return true;
}

static bool spans_meet(const llmem_buffer *a, size_t a_off, const llmem_buffer *b, size_t b_off,
                       size_t size_a, size_t size_b)
{
    return a == b && a_off < b_off + size_b && b_off < a_off + size_a;
}

/* ranges_disjoint's answer without memory: every pair, O(n^2) (a few
 * ranges, as a commit copies, or no memory for the sort). */
static bool ranges_disjoint_pairs(const llmem_copy_range *r, int32_t n)
{
    for (int32_t a = 0; a < n; a++) {
        if (r[a].size == 0)
            continue;
        for (int32_t b = a; b < n; b++) {
            size_t sa = r[a].size, sb = r[b].size;
            if (sb == 0)
                continue;
            /* a destination meets no other destination, and no source at all
             * (its own included) */
            if ((b != a && spans_meet(r[a].dst, r[a].dst_offset, r[b].dst, r[b].dst_offset, sa,
                                      sb)) ||
                spans_meet(r[a].dst, r[a].dst_offset, r[b].src, r[b].src_offset, sa, sb) ||
                (b != a && spans_meet(r[b].dst, r[b].dst_offset, r[a].src, r[a].src_offset, sb,
                                      sa)))
                return false;
        }
    }
    return true;
}

/* LLMEM_COPY_RANGES=0: the loop of buffer_copy even where the backend
 * batches (to compare the two). Read at the first batch of the process and
 * again on llmem_backend_reload_env, not at each call (getenv scans the
 * environment; a step copies ranges several times). -1: not read yet. */
static atomic_int copy_ranges_off = -1;

static void copy_ranges_env(void)
{
    const char *e = getenv("LLMEM_COPY_RANGES");
    atomic_store(&copy_ranges_off, e && strcmp(e, "0") == 0);
}

static bool batch_off(void)
{
    if (atomic_load(&copy_ranges_off) < 0)
        copy_ranges_env();
    return atomic_load(&copy_ranges_off) == 1;
}

llmem_status llmem_buffer_copy_ranges(const llmem_copy_range *ranges, int32_t n)
{
    if (n < 0 || (n > 0 && !ranges))
        return LLMEM_E_INVALID;
    llmem_backend *be = NULL;
    int32_t n_live = 0;
    for (int32_t j = 0; j < n; j++) {
        const llmem_copy_range *r = &ranges[j];
        if (!r->dst || !r->src || r->dst->backend != r->src->backend ||
            (be && r->dst->backend != be))
            return LLMEM_E_INVALID;
        be = r->dst->backend;
        if (!range_ok(r->dst, r->dst_offset, r->size) || !range_ok(r->src, r->src_offset, r->size))
            return LLMEM_E_INVALID;
        n_live += r->size > 0;
    }
    if (n_live == 0)
        return LLMEM_OK;
    if (n_live == 1) {
        for (int32_t j = 0; j < n; j++)
            if (ranges[j].size > 0)
                return llmem_buffer_copy(ranges[j].dst, ranges[j].dst_offset, ranges[j].src,
                                         ranges[j].src_offset, ranges[j].size);
    }
    /* few ranges (a commit's state copies): every pair, with no allocation
     * that could fail after the caller's state moved on */
    bool ok;
    if (n_live <= 16 || !ranges_disjoint(ranges, n, &ok))
        ok = ranges_disjoint_pairs(ranges, n);
    if (!ok)
        return LLMEM_E_INVALID;
    /* one generation for the whole batch: (buffer, generation) pairs stay
     * unique, which is all the view-check cache needs */
    uint64_t gen = (uint64_t)atomic_fetch_add(&write_gen_next, 1);
    for (int32_t j = 0; j < n; j++)
        if (ranges[j].size > 0)
            ranges[j].dst->write_gen = gen;
    const llmem_backend_i *i = be->iface;
    if (i->struct_size >= offsetof(llmem_backend_i, buffer_copy_ranges) +
                              sizeof(i->buffer_copy_ranges) &&
        i->buffer_copy_ranges && !batch_off())
        return i->buffer_copy_ranges(be, ranges, n);
    for (int32_t j = 0; j < n; j++) {
        const llmem_copy_range *r = &ranges[j];
        if (r->size == 0)
            continue;
        llmem_status st = i->buffer_copy(be, r->dst, r->dst_offset, r->src, r->src_offset, r->size);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

llmem_status llmem_buffer_fill(llmem_buffer *dst, size_t offset, size_t size, uint32_t pattern)
{
    if (!dst || offset % 4 || size % 4 || !range_ok(dst, offset, size))
        return LLMEM_E_INVALID;
    if (size == 0)
        return LLMEM_OK;
    llmem_backend *be = dst->backend;
    mark_written(dst);
    return be->iface->buffer_fill(be, dst, offset, size, pattern);
}

llmem_status llmem_backend_reload_env(llmem_backend *be)
{
    if (!be)
        return LLMEM_E_INVALID;
    const llmem_backend_i *i = be->iface;
    llmem_view_checks_reload(be);
    copy_ranges_env();
    if (i->struct_size >= offsetof(llmem_backend_i, reload_env) + sizeof(i->reload_env) &&
        i->reload_env)
        i->reload_env(be);
    return LLMEM_OK;
}

llmem_status llmem_backend_synchronize(llmem_backend *be)
{
    if (!be)
        return LLMEM_E_INVALID;
    return be->iface->synchronize(be);
}

/* ---- host memory and asynchronous copies (issue 13: the host tier) ---- */

/* Whether be's vtable is long enough for the host-memory slots and fills all four. */
static bool has_host_slots(const llmem_backend *be)
{
    const llmem_backend_i *i = be ? be->iface : NULL;
    if (!i || i->struct_size < offsetof(llmem_backend_i, buffer_download_async) +
                                   sizeof(i->buffer_download_async))
        return false;
    return i->host_alloc && i->host_free && i->buffer_upload_async && i->buffer_download_async;
}

bool llmem_backend_async_copies(const llmem_backend *be)
{
    return has_host_slots(be);
}

llmem_status llmem_backend_host_alloc(llmem_backend *be, size_t size, void **out)
{
    if (!out)
        return LLMEM_E_INVALID;
    *out = NULL;
    if (size == 0)
        return LLMEM_E_INVALID;
    if (be && be->alloc_hook && !be->alloc_hook(size, be->alloc_hook_ctx))
        return LLMEM_E_NO_MEMORY;
    if (!has_host_slots(be)) {
        *out = malloc(size);
        return *out ? LLMEM_OK : LLMEM_E_NO_MEMORY;
    }
    llmem_status st = be->iface->host_alloc(be, size, out);
    if (st == LLMEM_OK && !*out)
        st = LLMEM_E_NO_MEMORY;
    return st;
}

void llmem_backend_host_free(llmem_backend *be, void *ptr)
{
    if (!ptr)
        return;
    if (!has_host_slots(be)) {
        free(ptr);
        return;
    }
    (void)be->iface->synchronize(be);
    be->iface->host_free(be, ptr);
}

llmem_status llmem_buffer_upload_async(llmem_buffer *dst, size_t offset, const void *src,
                                       size_t size)
{
    if (!dst || (!src && size) || !range_ok(dst, offset, size))
        return LLMEM_E_INVALID;
    if (size == 0)
        return LLMEM_OK;
    llmem_backend *be = dst->backend;
    mark_written(dst);
    if (!has_host_slots(be))
        return be->iface->buffer_upload(be, dst, offset, src, size);
    return be->iface->buffer_upload_async(be, dst, offset, src, size);
}

llmem_status llmem_buffer_download_async(llmem_buffer *src, size_t offset, void *dst,
                                         size_t size)
{
    if (!src || (!dst && size) || !range_ok(src, offset, size))
        return LLMEM_E_INVALID;
    if (size == 0)
        return LLMEM_OK;
    llmem_backend *be = src->backend;
    if (!has_host_slots(be))
        return be->iface->buffer_download(be, src, offset, dst, size);
    return be->iface->buffer_download_async(be, src, offset, dst, size);
}

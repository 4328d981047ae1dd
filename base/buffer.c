/* llmem base: the public buffer API.
 *
 * Thin wrappers over a backend's vtable: they check arguments and byte
 * ranges (overflow-safe), run the fault-injection hook, and keep the
 * backend's reference count (one per live buffer), so a backend and its
 * plugin outlive llmem_backend_close while buffers remain. Backends see
 * only valid, non-empty ranges.
 */
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

/* One side of a range for the overlap check: bytes [begin, end) of buf. */
typedef struct span {
    uintptr_t buf;
    size_t begin, end;
    bool write;
} span;

static int span_cmp(const void *pa, const void *pb)
{
    const span *a = pa, *b = pb;
    if (a->buf != b->buf)
        return a->buf < b->buf ? -1 : 1;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

/* Whether some destination overlaps another range's destination or any
 * source: the spans sorted by buffer and start, each one compared with the
 * furthest end of the spans before it in its buffer (of all of them, and of
 * the destinations). O(n log n). *ok false on success means an overlap;
 * returns false when out of memory. */
static bool ranges_disjoint(const llmem_copy_range *r, int32_t n, bool *ok)
{
    *ok = true;
    span *sp = malloc((size_t)n * 2 * sizeof *sp);
    if (!sp)
        return false;
    size_t m = 0;
    for (int32_t j = 0; j < n; j++) {
        if (r[j].size == 0)
            continue;
        sp[m++] = (span){(uintptr_t)r[j].dst, r[j].dst_offset, r[j].dst_offset + r[j].size, true};
        sp[m++] = (span){(uintptr_t)r[j].src, r[j].src_offset, r[j].src_offset + r[j].size, false};
    }
    qsort(sp, m, sizeof *sp, span_cmp);
    size_t end_any = 0, end_dst = 0;
    for (size_t k = 0; k < m && *ok; k++) {
        if (k == 0 || sp[k].buf != sp[k - 1].buf)
            end_any = end_dst = 0;
        /* a destination may touch nothing before it; a source no destination */
        if (sp[k].begin < (sp[k].write ? end_any : end_dst))
            *ok = false;
        if (sp[k].end > end_any)
            end_any = sp[k].end;
        if (sp[k].write && sp[k].end > end_dst)
            end_dst = sp[k].end;
    }
    free(sp);
    return true;
}

/* LLMEM_COPY_RANGES=0: the loop of buffer_copy even where the backend
 * batches (to compare the two; tests switch it per call). */
static bool batch_off(void)
{
    const char *e = getenv("LLMEM_COPY_RANGES");
    return e && strcmp(e, "0") == 0;
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
    bool ok;
    if (!ranges_disjoint(ranges, n, &ok))
        return LLMEM_E_NO_MEMORY;
    if (!ok)
        return LLMEM_E_INVALID;
    for (int32_t j = 0; j < n; j++)
        if (ranges[j].size > 0 && (j == 0 || ranges[j].dst != ranges[j - 1].dst))
            mark_written(ranges[j].dst);
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

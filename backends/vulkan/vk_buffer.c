/* llmem Vulkan backend: the buffer slots of llmem_backend_i.
 *
 * A buffer is a sub-allocation (vk_alloc.c). Transfers are recorded into
 * the current command buffer like ops, so they keep their order with the
 * ops around them: an upload copies the host data into staging memory at
 * once (the caller may reuse it on return) and records a copy; a download
 * records a copy into staging, submits and waits, then copies out; copies
 * and fills are vkCmdCopyBuffer / vkCmdFillBuffer.
 */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* Largest piece of one upload or download (the staging chunk size). */
#define PIECE ((size_t)16 << 20)

llmem_status vk_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out)
{
    vk_backend *v = vk_from(be);
    if (v->error != LLMEM_OK)
        return v->error;
    vk_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return LLMEM_E_NO_MEMORY;
    llmem_status st;
    b->base.size = size;
    b->n_chunks = 1;
    b->chunk = size;
    if (size > v->chunk_max) {
        uint64_t n = vk_div_up(size, v->chunk_max);
        if (n > UINT32_MAX || !(b->more = calloc((size_t)(n - 1), sizeof *b->more))) {
            free(b);
            return LLMEM_E_NO_MEMORY;
        }
        b->chunk = v->chunk_max;
        b->n_chunks = (uint32_t)n;
    }
    for (uint32_t i = 0; i < b->n_chunks; i++) {
        st = vk_alloc_make(v, vk_chunk_bytes(b, i), (vk_alloc *)vk_chunk(b, i));
        if (st != LLMEM_OK) {
            b->n_chunks = i;
            goto fail;
        }
    }
    b->base.host = NULL;
    *out = &b->base;
    return LLMEM_OK;
fail:
    for (uint32_t i = 0; i < b->n_chunks; i++)
        vk_alloc_release(v, (vk_alloc *)vk_chunk(b, i));
    free(b->more);
    free(b);
    return st;
}

void vk_buffer_free(llmem_backend *be, llmem_buffer *buf)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(buf);
    /* Recorded work may still use the ranges; that is safe: a later user of
     * a range conflicts with it in the hazard tracker and gets a barrier,
     * and blocks are destroyed only when nothing is recorded. */
    vk_nm_pf_forget(v, buf);
    vk_pair_forget(v, buf);
    for (uint32_t i = 0; i < b->n_chunks; i++)
        vk_alloc_release(v, (vk_alloc *)vk_chunk(b, i));
    free(b->more);
    free(b);
}

/* Copies (src != NULL) or fills n bytes with a compute shader when the
 * offsets and the size are whole words; returns false to ask for the
 * transfer command instead. 16-byte units when everything is 16-aligned.
 * A workgroup moves 4 * 256 units. */
static bool compute_copy(vk_backend *v, const vk_piece *src, const vk_piece *dst,
                         uint32_t pattern, llmem_status *st)
{
    VkDeviceSize n = dst->n;
    if (v->transfer_copy || n % 4 || dst->at % 4 || (src && src->at % 4))
        return false;
    VkDeviceSize unit = n % 16 || dst->at % 16 || (src && src->at % 16) ? 4 : 16;
    if (n / unit > UINT32_MAX)
        return false;
    vk_op op;
    vk_op_init(&op, unit == 16 ? VK_SH_MEMCPY : VK_SH_MEMCPY_W, 256);
    vk_op_spec(&op, src ? 0u : 1u);
    uint32_t so = 0;
    if (src)
        so = vk_op_raw(v, &op, src->buf, src->at, n, unit, false);
    else
        vk_op_dummy(v, &op);
    uint32_t d_o = vk_op_raw(v, &op, dst->buf, dst->at, n, unit, true);
    vk_op_u32(&op, (uint32_t)(n / unit));
    vk_op_u32(&op, so);
    vk_op_u32(&op, d_o);
    vk_op_u32(&op, pattern);
    *st = vk_op_run(v, &op, vk_div_up(n / unit, 4 * 256));
    return true;
}

static vk_access access(vk_piece p, bool write)
{
    return (vk_access){p.buf, p.at / 4 * 4, (p.at + p.n + 3) / 4 * 4, write};
}

/* Pieces of at most this many bytes (whole words at a word offset) go
 * into the command buffer itself (vkCmdUpdateBuffer: at most 65536)
 * unless $LLMEM_VULKAN_UPLOAD_INLINE is 0: no staging copy for the device
 * to read over the bus, e.g. a decode step's token ids, positions and
 * index tables (the 2b Bamba batch-1 step's uploads 15 -> 7.5 us of GPU
 * time on the H200: docs/benchmarks.md "Vulkan batch-1 step: the host
 * gap"). */
#define INLINE_MAX 4096
#define UPLOAD_INLINE 1

llmem_status vk_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset, const void *src,
                              size_t size)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(dst);
    if (v->capture) /* a replay would copy the contents of now */
        return vk_capture_refuse(v, "an upload");
    bool inl = VK_KNOB(v, upload_inline, UPLOAD_INLINE) != 0;
    for (size_t done = 0; done < size;) {
        vk_piece p = vk_piece_at(b, offset + done, size - done < PIECE ? size - done : PIECE);
        llmem_status st;
        vk_access a = access(p, true);
        if (inl && p.n <= INLINE_MAX && p.n % 4 == 0 && p.at % 4 == 0) {
            if ((st = vk_cmd_track(v, &a, 1)) != LLMEM_OK)
                return st;
            v->vk.vkCmdUpdateBuffer(v->cmd, p.buf, p.at, p.n, (const char *)src + done);
            v->n_transfer++;
            done += p.n;
            continue;
        }
        vk_stage_ref s;
        if ((st = vk_stage_get(v, p.n, 4, &s)) != LLMEM_OK)
            return st;
        memcpy(s.ptr, (const char *)src + done, p.n);
        if ((st = vk_cmd_track(v, &a, 1)) != LLMEM_OK)
            return st;
        VkBufferCopy r = {s.offset, p.at, p.n};
        v->vk.vkCmdCopyBuffer(v->cmd, s.buf, p.buf, 1, &r);
        v->n_transfer++;
        done += p.n;
    }
    return LLMEM_OK;
}

llmem_status vk_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset, void *dst,
                                size_t size)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(src);
    for (size_t done = 0; done < size;) {
        vk_piece p = vk_piece_at(b, offset + done, size - done < PIECE ? size - done : PIECE);
        vk_stage_ref s;
        llmem_status st = vk_stage_get(v, p.n, 4, &s);
        if (st != LLMEM_OK)
            return st;
        vk_access a = access(p, false);
        if ((st = vk_cmd_track(v, &a, 1)) != LLMEM_OK)
            return st;
        VkBufferCopy r = {p.at, s.offset, p.n};
        v->vk.vkCmdCopyBuffer(v->cmd, p.buf, s.buf, 1, &r);
        v->n_transfer++;
        if ((st = vk_readback_add(v, s.ptr, (char *)dst + done, p.n)) != LLMEM_OK)
            return st;
        done += p.n;
    }
    return vk_cmd_flush(v);
}

/* Copies one piece (both sides inside one chunk): memcpy.comp when whole
 * words, else vkCmdCopyBuffer. */
static llmem_status copy_piece(vk_backend *v, vk_piece ps, vk_piece pd)
{
    llmem_status st;
    if (compute_copy(v, &ps, &pd, 0, &st))
        return st;
    vk_access a[2] = {access(ps, false), access(pd, true)};
    if ((st = vk_cmd_track(v, a, 2)) != LLMEM_OK)
        return st;
    VkBufferCopy r = {ps.at, pd.at, pd.n};
    v->vk.vkCmdCopyBuffer(v->cmd, ps.buf, pd.buf, 1, &r);
    v->n_transfer++;
    return LLMEM_OK;
}

llmem_status vk_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                            llmem_buffer *src, size_t src_offset, size_t size)
{
    vk_backend *v = vk_from(be);
    vk_buffer *d = vk_buf(dst), *s = vk_buf(src);
    for (size_t done = 0; done < size;) {
        vk_piece ps = vk_piece_at(s, src_offset + done, size - done);
        vk_piece pd = vk_piece_at(d, dst_offset + done, ps.n);
        ps.n = pd.n;
        llmem_status st = copy_piece(v, ps, pd);
        if (st != LLMEM_OK)
            return st;
        done += pd.n;
    }
    return LLMEM_OK;
}

/* ---- batched copies (buffer_copy_ranges) ---- */

/* A piece of a batched copy: both sides inside one chunk, 16-byte units;
 * si, di: its source and destination bindings in its dispatch. */
typedef struct cr_piece {
    VkBuffer sb, db;
    VkDeviceSize s_at, d_at, n; /* bytes */
    uint32_t si, di;
} cr_piece;

/* One buffer binding of a dispatch: bytes [lo, hi) of buf. */
typedef struct cr_bind {
    VkBuffer buf;
    VkDeviceSize lo, hi;
} cr_bind;

#define CR_BINDS (VK_MAX_BINDINGS - 1) /* binding 0 is the piece table */
#define CR_UNITS 4096u                 /* 16-byte units per workgroup: 64 KiB */

static int cr_cmp(const void *pa, const void *pb)
{
    const cr_piece *a = pa, *b = pb;
    if (a->sb != b->sb)
        return (uintptr_t)a->sb < (uintptr_t)b->sb ? -1 : 1;
    if (a->db != b->db)
        return (uintptr_t)a->db < (uintptr_t)b->db ? -1 : 1;
    return a->s_at < b->s_at ? -1 : a->s_at > b->s_at;
}

/* The binding of bytes [at, at + n) of buf: one of the *nb bindings on
 * buf whose span still fits lim once widened to it (each binding starts up
 * to storage_align before its span), else a new one; -1 when all CR_BINDS
 * are taken. A lone piece always fits (it lies inside one chunk). */
static int cr_slot(const vk_backend *v, cr_bind *b, uint32_t *nb, VkBuffer buf, VkDeviceSize at,
                   VkDeviceSize n, VkDeviceSize lim)
{
    for (uint32_t i = 0; i < *nb; i++) {
        if (b[i].buf != buf)
            continue;
        VkDeviceSize lo = at < b[i].lo ? at : b[i].lo;
        VkDeviceSize hi = at + n > b[i].hi ? at + n : b[i].hi;
        if (hi - lo + v->storage_align <= lim) {
            b[i].lo = lo;
            b[i].hi = hi;
            return (int)i;
        }
    }
    if (*nb == CR_BINDS)
        return -1;
    b[*nb] = (cr_bind){buf, at, at + n};
    return (int)(*nb)++;
}

/* One dispatch of memcpy_ranges.comp over pieces p[0..n) of the nb
 * bindings b (p[k].si, p[k].di name them): one workgroup per CR_UNITS of
 * a piece, its entry in a table in staging memory. */
static llmem_status cr_dispatch(vk_backend *v, const cr_piece *p, uint32_t n, const cr_bind *b,
                                uint32_t nb)
{
    uint64_t groups = 0;
    for (uint32_t k = 0; k < n; k++)
        groups += vk_div_up(p[k].n / 16, CR_UNITS);
    if (groups > UINT32_MAX)
        return LLMEM_E_UNSUPPORTED;
    vk_stage_ref tab;
    llmem_status st = vk_stage_get(v, (VkDeviceSize)groups * 16, 16, &tab);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    vk_op_init(&op, VK_SH_MEMCPY_RANGES, 256);
    vk_op_stage(v, &op, &tab, (VkDeviceSize)groups * 16);
    uint32_t base[CR_BINDS];
    for (uint32_t i = 0; i < nb; i++) /* read and written: tracked as a write */
        base[i] = vk_op_raw(v, &op, b[i].buf, b[i].lo, b[i].hi - b[i].lo, 16, true);
    uint32_t *t = tab.ptr;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t so = base[p[k].si] + (uint32_t)((p[k].s_at - b[p[k].si].lo) / 16);
        uint32_t dof = base[p[k].di] + (uint32_t)((p[k].d_at - b[p[k].di].lo) / 16);
        uint32_t units = (uint32_t)(p[k].n / 16);
        for (uint32_t u = 0; u < units; u += CR_UNITS, t += 4) {
            t[0] = so + u;
            t[1] = dof + u;
            t[2] = units - u < CR_UNITS ? units - u : CR_UNITS;
            t[3] = p[k].si | p[k].di << 8;
        }
    }
    vk_op_u32(&op, (uint32_t)groups);
    return vk_op_run(v, &op, groups);
}

/* buffer_copy_ranges: the ranges cut at chunk boundaries into pieces;
 * pieces of whole 16-byte units sorted by buffer and offset and copied by
 * memcpy_ranges.comp dispatches of up to CR_BINDS bindings each (one per
 * buffer, or more where a buffer's span would pass the binding limit),
 * with their piece tables in staging memory; the rest (and everything
 * while a step is captured, whose replay could not re-read the staging
 * table, or with LLMEM_VULKAN_TRANSFER_COPY) as llmem_buffer_copy does it. */
llmem_status vk_buffer_copy_ranges(llmem_backend *be, const llmem_copy_range *ranges, int32_t n)
{
    vk_backend *v = vk_from(be);
    if (v->error != LLMEM_OK)
        return v->error;
    bool batch = !v->capture && !v->transfer_copy;
    cr_piece *p = NULL;
    uint32_t m = 0, cap = 0;
    llmem_status st = LLMEM_OK;
    for (int32_t j = 0; j < n && st == LLMEM_OK; j++) {
        const llmem_copy_range *r = &ranges[j];
        vk_buffer *d = vk_buf(r->dst), *s = vk_buf(r->src);
        for (size_t done = 0; done < r->size && st == LLMEM_OK;) {
            vk_piece ps = vk_piece_at(s, r->src_offset + done, r->size - done);
            vk_piece pd = vk_piece_at(d, r->dst_offset + done, ps.n);
            ps.n = pd.n;
            done += pd.n;
            if (!batch || (ps.at | pd.at | pd.n) % 16 || pd.n / 16 > UINT32_MAX) {
                st = copy_piece(v, ps, pd);
                continue;
            }
            if (!vk_grow((void **)&p, &cap, m, sizeof *p)) {
                st = LLMEM_E_NO_MEMORY;
                break;
            }
            p[m++] = (cr_piece){ps.buf, pd.buf, ps.at, pd.at, pd.n, 0, 0};
        }
    }
    if (st == LLMEM_OK && m > 0)
        qsort(p, m, sizeof *p, cr_cmp);
    VkDeviceSize lim = v->max_range < (VkDeviceSize)UINT32_MAX * 16 ? v->max_range
                                                                     : (VkDeviceSize)UINT32_MAX * 16;
    for (uint32_t i = 0; i < m && st == LLMEM_OK;) {
        cr_bind b[CR_BINDS] = {{0}}, keep[CR_BINDS];
        uint32_t nb = 0, k = i;
        for (; k < m; k++) {
            uint32_t nb0 = nb;
            memcpy(keep, b, sizeof b);
            int si = cr_slot(v, b, &nb, p[k].sb, p[k].s_at, p[k].n, lim);
            int di = si < 0 ? -1 : cr_slot(v, b, &nb, p[k].db, p[k].d_at, p[k].n, lim);
            if (di < 0) { /* no binding left: the next dispatch takes it */
                nb = nb0;
                memcpy(b, keep, sizeof b);
                break;
            }
            p[k].si = (uint32_t)si;
            p[k].di = (uint32_t)di;
        }
        st = cr_dispatch(v, p + i, k - i, b, nb);
        i = k;
    }
    free(p);
    return st;
}

llmem_status vk_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset, size_t size,
                            uint32_t pattern)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(dst);
    for (size_t done = 0; done < size;) {
        vk_piece p = vk_piece_at(b, offset + done, size - done);
        llmem_status st;
        if (compute_copy(v, NULL, &p, pattern, &st)) {
            if (st != LLMEM_OK)
                return st;
            done += p.n;
            continue;
        }
        vk_access a = access(p, true);
        if ((st = vk_cmd_track(v, &a, 1)) != LLMEM_OK)
            return st;
        /* vkCmdFillBuffer writes the 32-bit word in host byte order, as an
         * upload of uint32 values would (little-endian on every Vulkan
         * host). Chunks are multiples of 4 bytes, so pieces stay whole words. */
        v->vk.vkCmdFillBuffer(v->cmd, p.buf, p.at, p.n, pattern);
        v->n_transfer++;
        done += p.n;
    }
    return LLMEM_OK;
}

llmem_status vk_synchronize(llmem_backend *be)
{
    vk_backend *v = vk_from(be);
    if (!v->recording && v->error == LLMEM_OK && v->validation_errors > 0 && v->validation_fatal)
        return LLMEM_E_BACKEND;
    return vk_cmd_flush(v);
}

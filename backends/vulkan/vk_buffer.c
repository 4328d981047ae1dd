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
    llmem_status st = vk_alloc_make(v, size, &b->a);
    if (st != LLMEM_OK) {
        free(b);
        return st;
    }
    b->base.host = NULL;
    *out = &b->base;
    return LLMEM_OK;
}

void vk_buffer_free(llmem_backend *be, llmem_buffer *buf)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(buf);
    /* Recorded work may still use the range; that is safe: a later user of
     * the range conflicts with it in the hazard tracker and gets a
     * barrier, and blocks are destroyed only when nothing is recorded. */
    vk_alloc_release(v, &b->a);
    free(b);
}

static vk_access access(const vk_buffer *b, size_t offset, size_t size, bool write)
{
    VkDeviceSize begin = b->a.offset + offset, end = begin + size;
    return (vk_access){vk_alloc_buffer(&b->a), begin / 4 * 4, (end + 3) / 4 * 4, write};
}

llmem_status vk_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset, const void *src,
                              size_t size)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(dst);
    for (size_t done = 0; done < size;) {
        size_t n = size - done < PIECE ? size - done : PIECE;
        vk_stage_ref s;
        llmem_status st = vk_stage_get(v, n, 4, &s);
        if (st != LLMEM_OK)
            return st;
        memcpy(s.ptr, (const char *)src + done, n);
        vk_access a = access(b, offset + done, n, true);
        if ((st = vk_cmd_track(v, &a, 1)) != LLMEM_OK)
            return st;
        VkBufferCopy r = {s.offset, b->a.offset + offset + done, n};
        v->vk.vkCmdCopyBuffer(v->cmd, s.buf, vk_alloc_buffer(&b->a), 1, &r);
        v->n_transfer++;
        done += n;
    }
    return LLMEM_OK;
}

llmem_status vk_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset, void *dst,
                                size_t size)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(src);
    for (size_t done = 0; done < size;) {
        size_t n = size - done < PIECE ? size - done : PIECE;
        vk_stage_ref s;
        llmem_status st = vk_stage_get(v, n, 4, &s);
        if (st != LLMEM_OK)
            return st;
        vk_access a = access(b, offset + done, n, false);
        if ((st = vk_cmd_track(v, &a, 1)) != LLMEM_OK)
            return st;
        VkBufferCopy r = {b->a.offset + offset + done, s.offset, n};
        v->vk.vkCmdCopyBuffer(v->cmd, vk_alloc_buffer(&b->a), s.buf, 1, &r);
        v->n_transfer++;
        if ((st = vk_readback_add(v, s.ptr, (char *)dst + done, n)) != LLMEM_OK)
            return st;
        done += n;
    }
    return vk_cmd_flush(v);
}

llmem_status vk_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                            llmem_buffer *src, size_t src_offset, size_t size)
{
    vk_backend *v = vk_from(be);
    vk_buffer *d = vk_buf(dst), *s = vk_buf(src);
    vk_access a[2] = {access(s, src_offset, size, false), access(d, dst_offset, size, true)};
    llmem_status st = vk_cmd_track(v, a, 2);
    if (st != LLMEM_OK)
        return st;
    VkBufferCopy r = {s->a.offset + src_offset, d->a.offset + dst_offset, size};
    v->vk.vkCmdCopyBuffer(v->cmd, vk_alloc_buffer(&s->a), vk_alloc_buffer(&d->a), 1, &r);
    v->n_transfer++;
    return LLMEM_OK;
}

llmem_status vk_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset, size_t size,
                            uint32_t pattern)
{
    vk_backend *v = vk_from(be);
    vk_buffer *b = vk_buf(dst);
    vk_access a = access(b, offset, size, true);
    llmem_status st = vk_cmd_track(v, &a, 1);
    if (st != LLMEM_OK)
        return st;
    /* vkCmdFillBuffer writes the 32-bit word in host byte order, as an
     * upload of uint32 values would (little-endian on every Vulkan host). */
    v->vk.vkCmdFillBuffer(v->cmd, vk_alloc_buffer(&b->a), b->a.offset + offset, size, pattern);
    v->n_transfer++;
    return LLMEM_OK;
}

llmem_status vk_synchronize(llmem_backend *be)
{
    vk_backend *v = vk_from(be);
    if (!v->recording && v->error == LLMEM_OK && v->validation_errors > 0 && v->validation_fatal)
        return LLMEM_E_BACKEND;
    return vk_cmd_flush(v);
}

/* llmem Vulkan backend: the sub-allocator.
 *
 * Drivers limit the number of device allocations (maxMemoryAllocationCount
 * is 4096 on many) and make each one slow, so llmem buffers are ranges of
 * large blocks: one VkDeviceMemory with one VkBuffer over all of it, of
 * v->block_size bytes. A request above half the block size gets a block of
 * its own. Each block keeps its free ranges sorted by offset; allocation is
 * first fit, freeing merges with the neighbours (the classic boundary-tag
 * free list, Knuth TAOCP vol. 1, 2.5). All sizes and offsets are multiples
 * of VK_ALIGN (>= minStorageBufferOffsetAlignment on every known device,
 * checked at open).
 *
 * Emptied blocks are destroyed once no recorded work can use them, except
 * one spare shared block and one spare dedicated block of at most
 * v->spare_max bytes: an op's large temporaries (a prefill GEMM's raw
 * tiles, its activation terms) would otherwise cost a vkAllocateMemory and
 * a vkFreeMemory of hundreds of MiB on every call. A dedicated request
 * reuses the spare when it fits with at most half of it idle. Out of device
 * memory, every spare is given back before the allocation is tried again.
 */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* Largest power of two <= x (x >= 1). */
static VkDeviceSize pow2_floor(VkDeviceSize x)
{
    VkDeviceSize p = 1;
    while (p <= x / 2)
        p *= 2;
    return p;
}

/* Parses "<n>[K|M|G][iB]" as bytes; 0 when absent or malformed. */
static VkDeviceSize env_bytes(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    unsigned long long n = strtoull(s, &end, 10);
    int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20
              : *end == 'G' || *end == 'g' ? 30 : 0;
    if (shift)
        end++;
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end || n == 0 || n > (~0ull >> shift))
        return 0;
    return (VkDeviceSize)n << shift;
}

void vk_alloc_limits(vk_backend *v)
{
    uint32_t heap = v->mem_props.memoryTypes[v->mem_type_device].heapIndex;
    VkDeviceSize hs = v->mem_props.memoryHeaps[heap].size;
    /* A chunk must be one allocation and one binding; a power of two so
     * that chunk boundaries fall on page and element boundaries. */
    VkDeviceSize lim = v->max_alloc < v->max_range ? v->max_alloc : v->max_range;
    VkDeviceSize env = env_bytes("LLMEM_VULKAN_MAX_CHUNK");
    if (env && env < lim)
        lim = env < 4 * VK_ALIGN ? 4 * VK_ALIGN : env;
    v->chunk_max = pow2_floor(lim);
    const char *tc = getenv("LLMEM_VULKAN_TRANSFER_COPY");
    v->transfer_copy = tc && *tc && strcmp(tc, "0") != 0;
    v->block_size = (VkDeviceSize)256 << 20;
    if (v->block_size > hs / 8)
        v->block_size = hs / 8 / VK_ALIGN * VK_ALIGN;
    if (v->block_size < ((VkDeviceSize)4 << 20))
        v->block_size = (VkDeviceSize)4 << 20;
    if (v->block_size > v->chunk_max)
        v->block_size = v->chunk_max;
    /* $LLMEM_VULKAN_SPARE_MAX: the largest emptied dedicated block kept for
     * reuse (bytes, K/M/G suffix; "0": none); default 1 GiB, at most the
     * heap's 1/16. */
    const char *sm = getenv("LLMEM_VULKAN_SPARE_MAX");
    VkDeviceSize spare = (VkDeviceSize)1 << 30;
    if (sm && *sm)
        spare = strcmp(sm, "0") == 0 ? 0 : env_bytes("LLMEM_VULKAN_SPARE_MAX");
    if (spare > hs / 16)
        spare = hs / 16;
    v->spare_max = spare;
}

static VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a)
{
    return (x + a - 1) / a * a;
}

static llmem_status free_push(vk_block *b, uint32_t at, vk_range r)
{
    if (b->n_free == b->cap_free) {
        uint32_t cap = b->cap_free ? b->cap_free * 2 : 8;
        vk_range *f = realloc(b->free, cap * sizeof *f);
        if (!f)
            return LLMEM_E_NO_MEMORY;
        b->free = f;
        b->cap_free = cap;
    }
    memmove(b->free + at + 1, b->free + at, (b->n_free - at) * sizeof *b->free);
    b->free[at] = r;
    b->n_free++;
    return LLMEM_OK;
}

static void free_remove(vk_block *b, uint32_t at)
{
    memmove(b->free + at, b->free + at + 1, (b->n_free - at - 1) * sizeof *b->free);
    b->n_free--;
}

static void block_destroy(vk_backend *v, vk_block *b)
{
    if (b->buf)
        v->vk.vkDestroyBuffer(v->dev, b->buf, NULL);
    if (b->mem) {
        v->vk.vkFreeMemory(v->dev, b->mem, NULL);
        v->bytes_device -= b->size;
        vk_log(v, "block -%llu bytes%s", (unsigned long long)b->size,
               b->dedicated ? " dedicated" : "");
    }
    free(b->free);
    free(b);
}

static llmem_status block_create(vk_backend *v, VkDeviceSize size, bool dedicated,
                                 vk_block **out)
{
    vk_block *b = calloc(1, sizeof *b);
    if (!b)
        return LLMEM_E_NO_MEMORY;
    llmem_status st;
    VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = v->vk.vkCreateBuffer(v->dev, &bi, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        st = vk_status(r);
        goto fail;
    }
    VkMemoryRequirements req;
    v->vk.vkGetBufferMemoryRequirements(v->dev, b->buf, &req);
    if (!(req.memoryTypeBits & (1u << v->mem_type_device))) {
        st = LLMEM_E_BACKEND;
        goto fail;
    }
    VkMemoryAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = v->mem_type_device,
    };
    r = v->vk.vkAllocateMemory(v->dev, &ai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        b->mem = VK_NULL_HANDLE;
        st = vk_status(r);
        goto fail;
    }
    v->bytes_device += size;
    b->size = size;
    r = v->vk.vkBindBufferMemory(v->dev, b->buf, b->mem, 0);
    if (r != VK_SUCCESS) {
        st = vk_status(r);
        goto fail;
    }
    b->dedicated = dedicated;
    vk_log(v, "block +%llu bytes%s", (unsigned long long)size, dedicated ? " dedicated" : "");
    st = free_push(b, 0, (vk_range){0, size});
    if (st != LLMEM_OK)
        goto fail;
    *out = b;
    return LLMEM_OK;
fail:
    block_destroy(v, b);
    return st;
}

/* First fit inside one block. */
static bool block_take(vk_block *b, VkDeviceSize size, VkDeviceSize *offset)
{
    for (uint32_t i = 0; i < b->n_free; i++) {
        vk_range *f = &b->free[i];
        if (f->size < size)
            continue;
        *offset = f->offset;
        f->offset += size;
        f->size -= size;
        if (f->size == 0)
            free_remove(b, i);
        b->used += size;
        b->n_live++;
        return true;
    }
    return false;
}

llmem_status vk_alloc_make(vk_backend *v, VkDeviceSize size, vk_alloc *out)
{
    memset(out, 0, sizeof *out);
    if (size == 0)
        return LLMEM_E_INVALID;
    if (size > v->max_alloc)
        return LLMEM_E_NO_MEMORY;
    size = round_up(size, VK_ALIGN);
    bool dedicated = size > v->block_size / 2;
    VkDeviceSize off;
    for (vk_block *b = v->blocks; b; b = b->next) {
        bool fits = dedicated ? b->dedicated && b->n_live == 0 && b->size >= size &&
                                    b->size / 2 <= size
                              : !b->dedicated && b->size - b->used >= size;
        if (fits && block_take(b, size, &off)) {
            *out = (vk_alloc){b, off, size};
            return LLMEM_OK;
        }
    }
    vk_block *b = NULL;
    llmem_status st = block_create(v, dedicated ? size : v->block_size, dedicated, &b);
    if (st != LLMEM_OK && st != LLMEM_E_NO_MEMORY)
        return st;
    if (st == LLMEM_E_NO_MEMORY) {
        /* Give back what no recorded work uses, then try once more. */
        if (!v->recording) {
            vk_alloc_trim(v, false);
            st = block_create(v, dedicated ? size : v->block_size, dedicated, &b);
        }
        if (st != LLMEM_OK)
            return st;
    }
    b->next = v->blocks;
    v->blocks = b;
    if (!block_take(b, size, &off))
        return LLMEM_E_BACKEND; /* cannot happen: the block is empty and large enough */
    *out = (vk_alloc){b, off, size};
    return LLMEM_OK;
}

void vk_alloc_release(vk_backend *v, vk_alloc *a)
{
    vk_block *b = a->block;
    if (!b)
        return;
    if (v->capture && vk_capture_keep(v, a)) { /* the recorded step uses it at each replay */
        memset(a, 0, sizeof *a);
        return;
    }
    /* insert [offset, offset + size) into the sorted free list, merging */
    uint32_t at = 0;
    while (at < b->n_free && b->free[at].offset < a->offset)
        at++;
    bool merge_prev = at > 0 && b->free[at - 1].offset + b->free[at - 1].size == a->offset;
    bool merge_next = at < b->n_free && a->offset + a->size == b->free[at].offset;
    if (merge_prev && merge_next) {
        b->free[at - 1].size += a->size + b->free[at].size;
        free_remove(b, at);
    } else if (merge_prev) {
        b->free[at - 1].size += a->size;
    } else if (merge_next) {
        b->free[at].offset = a->offset;
        b->free[at].size += a->size;
    } else if (free_push(b, at, (vk_range){a->offset, a->size}) != LLMEM_OK) {
        /* No host memory for the list entry: the range leaks until the
         * block is destroyed with the backend. */
    }
    b->used -= a->size;
    b->n_live--;
    memset(a, 0, sizeof *a);
    if (b->n_live == 0 && !v->recording)
        vk_alloc_trim(v, true);
}

void vk_alloc_trim(vk_backend *v, bool keep_spare)
{
    bool spare_shared = false, spare_dedicated = false;
    vk_block **pp = &v->blocks;
    while (*pp) {
        vk_block *b = *pp;
        if (b->n_live == 0) {
            bool *kept = b->dedicated ? &spare_dedicated : &spare_shared;
            bool keep = keep_spare && !*kept && (!b->dedicated || b->size <= v->spare_max);
            if (!keep) {
                *pp = b->next;
                block_destroy(v, b);
                continue;
            }
            *kept = true;
        }
        pp = &b->next;
    }
}

VkBuffer vk_alloc_buffer(const vk_alloc *a)
{
    return a->block ? a->block->buf : VK_NULL_HANDLE;
}

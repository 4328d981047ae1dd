/* llmem Vulkan backend: lazy command recording.
 *
 * Every op, upload, copy and fill is recorded into one command buffer; it
 * is submitted once, when the host needs a result (download, synchronize)
 * or when the staging budget is spent, and the submit is waited for. So a
 * ubatch's forward pass is one submit.
 *
 * Barriers. Each command declares the byte ranges it reads and writes
 * (widened to 32-bit words, the unit of a shader's 16-bit stores). A
 * global memory barrier (compute + transfer, both ways) is recorded before
 * a command only when one of its ranges overlaps a range used since the
 * last barrier with at least one of the two writing (read-after-write,
 * write-after-read, write-after-write); independent commands run without
 * one.
 *
 * Descriptors. One set layout of VK_MAX_BINDINGS storage buffers and one
 * pipeline layout with 128 bytes of push constants serve every shader.
 * Sets come from descriptor pools that are reset after each submit.
 *
 * Pipelines are created on first use per (shader, specialization
 * constants) and cached for the backend's life (plus a VkPipelineCache).
 *
 * Recorded steps (vk_record.c). A replay ends the lazy command buffer and
 * queues the step's own command buffer after it; later work goes into a
 * fresh lazy command buffer that starts with a full barrier. The next
 * flush submits them all, in order, in one vkQueueSubmit.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

#define DESC_POOL_SETS 256
#define STAGE_CHUNK ((VkDeviceSize)16 << 20)
#define STAGE_BUDGET ((VkDeviceSize)64 << 20)
#define CAPTURE_STAGE_CHUNK ((VkDeviceSize)64 << 10) /* a recorded step's tables */

llmem_status vk_status(VkResult r)
{
    if (r == VK_SUCCESS)
        return LLMEM_OK;
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY)
        return LLMEM_E_NO_MEMORY;
    return LLMEM_E_BACKEND;
}

void vk_log(vk_backend *v, const char *fmt, ...)
{
    if (!v->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(v->log, fmt, ap);
    va_end(ap);
    fputc('\n', v->log);
    fflush(v->log);
}

/* Grows *arr (of elem bytes) to hold at least n + 1 entries. */
static bool grow(void **arr, uint32_t *cap, uint32_t n, size_t elem)
{
    if (n < *cap)
        return true;
    uint32_t c = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = c;
    return true;
}

/* ---- init / finish ------------------------------------------------------------------- */

llmem_status vk_cmd_init(vk_backend *v)
{
    VkResult r;
    VkCommandPoolCreateInfo pi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = v->queue_family,
    };
    if ((r = v->vk.vkCreateCommandPool(v->dev, &pi, NULL, &v->cmd_pool)) != VK_SUCCESS)
        return vk_status(r);
    VkCommandBufferAllocateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = v->cmd_pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    if ((r = v->vk.vkAllocateCommandBuffers(v->dev, &ci, &v->cmd)) != VK_SUCCESS)
        return vk_status(r);
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = v->vk.vkCreateFence(v->dev, &fi, NULL, &v->fence)) != VK_SUCCESS)
        return vk_status(r);

    VkDescriptorSetLayoutBinding b[VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < VK_MAX_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){
            .binding = i,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .descriptorCount = 1,
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        };
    VkDescriptorSetLayoutCreateInfo li = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .bindingCount = VK_MAX_BINDINGS,
        .pBindings = b,
    };
    if ((r = v->vk.vkCreateDescriptorSetLayout(v->dev, &li, NULL, &v->set_layout)) != VK_SUCCESS)
        return vk_status(r);
    VkPushConstantRange pr = {
        .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        .offset = 0,
        .size = VK_MAX_PUSH,
    };
    VkPipelineLayoutCreateInfo pli = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
        .setLayoutCount = 1,
        .pSetLayouts = &v->set_layout,
        .pushConstantRangeCount = 1,
        .pPushConstantRanges = &pr,
    };
    if ((r = v->vk.vkCreatePipelineLayout(v->dev, &pli, NULL, &v->pipe_layout)) != VK_SUCCESS)
        return vk_status(r);
    VkPipelineCacheCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    if ((r = v->vk.vkCreatePipelineCache(v->dev, &pci, NULL, &v->pipe_cache)) != VK_SUCCESS)
        return vk_status(r);
    return vk_alloc_make(v, VK_ALIGN, &v->dummy);
}

void vk_cmd_finish(vk_backend *v)
{
    if (!v->dev)
        return;
    if (v->recording || v->n_segs > 0)
        vk_cmd_flush(v);
    v->vk.vkDeviceWaitIdle(v->dev);
    vk_prof_finish(v);
    vk_alloc_release(v, &v->dummy);
    for (uint32_t i = 0; i < v->n_pipes; i++)
        v->vk.vkDestroyPipeline(v->dev, v->pipes[i].pipe, NULL);
    free(v->pipes);
    for (uint32_t i = 0; i < VK_SH_COUNT; i++)
        if (v->modules[i])
            v->vk.vkDestroyShaderModule(v->dev, v->modules[i], NULL);
    for (uint32_t i = 0; i < v->n_desc_pools; i++)
        v->vk.vkDestroyDescriptorPool(v->dev, v->desc_pools[i], NULL);
    free(v->desc_pools);
    vk_stage_destroy(v, v->stages);
    v->stages = NULL;
    free(v->acc);
    free(v->rb);
    free(v->segs);
    free(v->spare);
    if (v->pipe_cache)
        v->vk.vkDestroyPipelineCache(v->dev, v->pipe_cache, NULL);
    if (v->pipe_layout)
        v->vk.vkDestroyPipelineLayout(v->dev, v->pipe_layout, NULL);
    if (v->set_layout)
        v->vk.vkDestroyDescriptorSetLayout(v->dev, v->set_layout, NULL);
    if (v->fence)
        v->vk.vkDestroyFence(v->dev, v->fence, NULL);
    if (v->cmd_pool)
        v->vk.vkDestroyCommandPool(v->dev, v->cmd_pool, NULL);
    vk_alloc_trim(v, false);
}

/* ---- recording and barriers -------------------------------------------------------------- */

llmem_status vk_cmd_begin(vk_backend *v)
{
    if (v->error != LLMEM_OK)
        return v->error;
    if (v->recording)
        return LLMEM_OK;
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    VkResult r = v->vk.vkBeginCommandBuffer(v->cmd, &bi);
    if (r != VK_SUCCESS)
        return v->error = vk_status(r);
    v->recording = true;
    vk_prof_begin(v);
    if (v->n_segs == 0)
        v->n_dispatch = v->n_transfer = v->n_barrier = 0;
    v->n_acc = 0;
    if (v->after_graph) { /* after a recorded step, in submission order */
        vk_cmd_barrier(v);
        v->after_graph = false;
    }
    return LLMEM_OK;
}

void vk_cmd_barrier(vk_backend *v)
{
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                         VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
    };
    VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    v->vk.vkCmdPipelineBarrier(v->cmd, stages, stages, 0, 1, &mb, 0, NULL, 0, NULL);
    v->n_acc = 0;
    v->n_barrier++;
}

static bool conflicts(const vk_access *a, const vk_access *b)
{
    return a->buf == b->buf && a->begin < b->end && b->begin < a->end && (a->write || b->write);
}

llmem_status vk_cmd_track(vk_backend *v, const vk_access *acc, uint32_t n)
{
    llmem_status st = vk_cmd_begin(v);
    if (st != LLMEM_OK)
        return st;
    bool need = false;
    for (uint32_t i = 0; i < n && !need; i++)
        for (uint32_t j = 0; j < v->n_acc && !need; j++)
            need = conflicts(&acc[i], &v->acc[j]);
    if (need)
        vk_cmd_barrier(v);
    for (uint32_t i = 0; i < n; i++) {
        if (!grow((void **)&v->acc, &v->cap_acc, v->n_acc, sizeof *v->acc)) {
            /* Without room to remember, order everything after this. */
            vk_cmd_barrier(v);
            continue;
        }
        v->acc[v->n_acc++] = acc[i];
    }
    return LLMEM_OK;
}

/* ---- readbacks, staging ---------------------------------------------------------- */

llmem_status vk_readback_add(vk_backend *v, const void *src, void *dst, size_t size)
{
    if (v->capture)
        return vk_capture_refuse(v, "a download");
    if (!grow((void **)&v->rb, &v->cap_rb, v->n_rb, sizeof *v->rb))
        return LLMEM_E_NO_MEMORY;
    v->rb[v->n_rb++] = (vk_readback){src, dst, size};
    return LLMEM_OK;
}

static llmem_status stage_create(vk_backend *v, VkDeviceSize size, vk_stage **out)
{
    vk_stage *s = calloc(1, sizeof *s);
    if (!s)
        return LLMEM_E_NO_MEMORY;
    llmem_status st;
    VkBufferCreateInfo bi = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                 VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = v->vk.vkCreateBuffer(v->dev, &bi, NULL, &s->buf);
    if (r != VK_SUCCESS) {
        st = vk_status(r);
        goto fail;
    }
    VkMemoryRequirements req;
    v->vk.vkGetBufferMemoryRequirements(v->dev, s->buf, &req);
    VkMemoryAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = v->mem_type_host,
    };
    if (!(req.memoryTypeBits & (1u << v->mem_type_host))) {
        st = LLMEM_E_BACKEND;
        goto fail;
    }
    if ((r = v->vk.vkAllocateMemory(v->dev, &ai, NULL, &s->mem)) != VK_SUCCESS) {
        st = vk_status(r);
        goto fail;
    }
    if ((r = v->vk.vkBindBufferMemory(v->dev, s->buf, s->mem, 0)) != VK_SUCCESS ||
        (r = v->vk.vkMapMemory(v->dev, s->mem, 0, VK_WHOLE_SIZE, 0, &s->map)) != VK_SUCCESS) {
        st = vk_status(r);
        goto fail;
    }
    s->size = size;
    *out = s;
    return LLMEM_OK;
fail:
    if (s->buf)
        v->vk.vkDestroyBuffer(v->dev, s->buf, NULL);
    if (s->mem)
        v->vk.vkFreeMemory(v->dev, s->mem, NULL);
    free(s);
    return st;
}

static bool stage_fit(vk_stage *s, VkDeviceSize size, VkDeviceSize align, VkDeviceSize *off)
{
    VkDeviceSize o = (s->used + align - 1) / align * align;
    if (o > s->size || s->size - o < size)
        return false;
    *off = o;
    return true;
}

llmem_status vk_stage_get(vk_backend *v, VkDeviceSize size, VkDeviceSize align, vk_stage_ref *out)
{
    if (align < 4)
        align = 4;
    for (int pass = 0; pass < 2; pass++) {
        VkDeviceSize off;
        for (vk_stage *s = v->stages; s; s = s->next) {
            if (stage_fit(s, size, align, &off)) {
                s->used = off + size;
                *out = (vk_stage_ref){s->buf, off, (char *)s->map + off};
                return LLMEM_OK;
            }
        }
        if (pass == 0 && v->stage_total + (size > STAGE_CHUNK ? size : STAGE_CHUNK) > STAGE_BUDGET &&
            v->recording) {
            /* Budget spent: run what is recorded, then reuse the chunks. */
            llmem_status st = vk_cmd_flush(v);
            if (st != LLMEM_OK)
                return st;
            continue;
        }
        break;
    }
    vk_stage *s = NULL;
    VkDeviceSize chunk = v->capture ? CAPTURE_STAGE_CHUNK : STAGE_CHUNK;
    llmem_status st = stage_create(v, size > chunk ? size : chunk, &s);
    if (st != LLMEM_OK)
        return st;
    s->next = v->stages;
    v->stages = s;
    v->stage_total += s->size;
    s->used = size;
    *out = (vk_stage_ref){s->buf, 0, s->map};
    return LLMEM_OK;
}

void vk_stage_destroy(vk_backend *v, vk_stage *list)
{
    while (list) {
        vk_stage *s = list;
        list = s->next;
        v->vk.vkDestroyBuffer(v->dev, s->buf, NULL);
        v->vk.vkFreeMemory(v->dev, s->mem, NULL);
        free(s);
    }
}

/* Keeps the staging chunks within the budget once idle (large one-off
 * chunks are given back). */
static void stage_reset(vk_backend *v)
{
    vk_stage **pp = &v->stages;
    VkDeviceSize kept = 0;
    while (*pp) {
        vk_stage *s = *pp;
        s->used = 0;
        if (s->size > STAGE_CHUNK || kept + s->size > STAGE_BUDGET) {
            *pp = s->next;
            v->stage_total -= s->size;
            v->vk.vkDestroyBuffer(v->dev, s->buf, NULL);
            v->vk.vkFreeMemory(v->dev, s->mem, NULL);
            free(s);
            continue;
        }
        kept += s->size;
        pp = &s->next;
    }
}

/* ---- submit ------------------------------------------------------------------------------------ */

static bool seg_push(vk_backend *v, VkCommandBuffer cmd, vk_graph *g)
{
    if (!grow((void **)&v->segs, &v->cap_segs, v->n_segs, sizeof *v->segs))
        return false;
    v->segs[v->n_segs++] = (vk_seg){cmd, g};
    return true;
}

llmem_status vk_cmd_queue_graph(vk_backend *v, VkCommandBuffer cmd, vk_graph *g)
{
    if (v->error != LLMEM_OK)
        return v->error;
    /* room for the lazy buffer, the step and a spare first: nothing half done */
    if (!grow((void **)&v->segs, &v->cap_segs, v->n_segs + 1, sizeof *v->segs))
        return LLMEM_E_NO_MEMORY;
    if (v->recording) {
        VkCommandBuffer next;
        if (v->n_spare > 0) {
            next = v->spare[--v->n_spare];
        } else {
            VkCommandBufferAllocateInfo ci = {
                .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                .commandPool = v->cmd_pool,
                .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                .commandBufferCount = 1,
            };
            VkResult r = v->vk.vkAllocateCommandBuffers(v->dev, &ci, &next);
            if (r != VK_SUCCESS)
                return vk_status(r);
        }
        VkResult r = v->vk.vkEndCommandBuffer(v->cmd);
        if (r != VK_SUCCESS) {
            v->vk.vkFreeCommandBuffers(v->dev, v->cmd_pool, 1, &next);
            return v->error = vk_status(r);
        }
        seg_push(v, v->cmd, NULL);
        v->cmd = next;
        v->recording = false;
    }
    seg_push(v, cmd, g);
    v->after_graph = true;
    return LLMEM_OK;
}

llmem_status vk_cmd_flush(vk_backend *v)
{
    if (v->capture)
        return vk_capture_refuse(v, "a wait for the device");
    if (!v->recording && v->n_segs == 0)
        return v->error;
    if (!v->recording) { /* only recorded steps: a lazy buffer ends the submit */
        llmem_status st = vk_cmd_begin(v);
        if (st != LLMEM_OK)
            return st;
    }
    /* Device writes (readback copies) become visible to the host. */
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_HOST_READ_BIT,
    };
    v->vk.vkCmdPipelineBarrier(v->cmd,
                               VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                               VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    VkResult r = v->vk.vkEndCommandBuffer(v->cmd);
    /* the queued command buffers in order, then the lazy one */
    VkCommandBuffer *cmds = &v->cmd;
    uint32_t n_cmds = 1;
    VkCommandBuffer few[8];
    if (v->n_segs > 0) {
        n_cmds = v->n_segs + 1;
        cmds = n_cmds <= 8 ? few : malloc(n_cmds * sizeof *cmds);
        if (!cmds && r == VK_SUCCESS)
            r = VK_ERROR_OUT_OF_HOST_MEMORY;
        for (uint32_t i = 0; cmds && i < v->n_segs; i++)
            cmds[i] = v->segs[i].cmd;
        if (cmds)
            cmds[v->n_segs] = v->cmd;
    }
    if (r == VK_SUCCESS)
        r = v->vk.vkResetFences(v->dev, 1, &v->fence);
    if (r == VK_SUCCESS) {
        VkSubmitInfo si = {
            .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
            .commandBufferCount = n_cmds,
            .pCommandBuffers = cmds,
        };
        r = v->vk.vkQueueSubmit(v->queue, 1, &si, v->fence);
    }
    if (r == VK_SUCCESS)
        r = v->vk.vkWaitForFences(v->dev, 1, &v->fence, VK_TRUE, UINT64_MAX);
    if (cmds != &v->cmd && cmds != few)
        free(cmds);
    v->n_submits++;
    uint32_t n_steps = 0;
    for (uint32_t i = 0; i < v->n_segs; i++)
        n_steps += v->segs[i].graph != NULL;
    vk_log(v, "submit %llu: %u dispatches, %u transfers, %u barriers, %u recorded steps",
           (unsigned long long)v->n_submits, v->n_dispatch, v->n_transfer, v->n_barrier, n_steps);
    if (r != VK_SUCCESS) {
        /* The results are lost; a lost device stays lost. */
        v->error = LLMEM_E_BACKEND;
        vk_log(v, "submit failed: VkResult %d", (int)r);
    } else {
        for (uint32_t i = 0; i < v->n_rb; i++)
            memcpy(v->rb[i].dst, v->rb[i].src, v->rb[i].size);
        vk_prof_collect(v);
    }
    /* the recorded steps may be queued again; ended lazy buffers are reused */
    for (uint32_t i = 0; i < v->n_segs; i++) {
        if (v->segs[i].graph) {
            vk_graph_done(v->segs[i].graph);
        } else if (r == VK_SUCCESS &&
                   grow((void **)&v->spare, &v->cap_spare, v->n_spare, sizeof *v->spare)) {
            v->vk.vkResetCommandBuffer(v->segs[i].cmd, 0);
            v->spare[v->n_spare++] = v->segs[i].cmd;
        } else {
            v->vk.vkFreeCommandBuffers(v->dev, v->cmd_pool, 1, &v->segs[i].cmd);
        }
    }
    v->n_segs = 0;
    v->after_graph = false;
    v->n_rb = 0;
    v->recording = false;
    v->n_acc = 0;
    if (r == VK_SUCCESS) {
        v->vk.vkResetCommandBuffer(v->cmd, 0);
        for (uint32_t i = 0; i < v->n_desc_pools && i <= v->cur_desc_pool; i++)
            v->vk.vkResetDescriptorPool(v->dev, v->desc_pools[i], 0);
        v->cur_desc_pool = 0;
        stage_reset(v);
        vk_alloc_trim(v, true);
    }
    if (v->error == LLMEM_OK && v->validation_errors > 0 && v->validation_fatal)
        return LLMEM_E_BACKEND;
    return v->error;
}

/* ---- dispatches ------------------------------------------------------------------------------------ */

void vk_op_init(vk_op *op, vk_shader_id shader, uint32_t wg)
{
    memset(op, 0, sizeof *op);
    op->shader = shader;
    op->spec[op->n_spec++] = wg;
}

void vk_op_spec(vk_op *op, uint32_t value)
{
    if (op->n_spec < VK_MAX_SPEC)
        op->spec[op->n_spec++] = value;
    else
        op->bad = true;
}

void vk_op_u32(vk_op *op, uint32_t value)
{
    if (op->n_push < VK_MAX_PUSH / 4)
        op->push[op->n_push++] = value;
    else
        op->bad = true;
}

void vk_op_i32(vk_op *op, int32_t value)
{
    vk_op_u32(op, (uint32_t)value);
}

void vk_op_f32(vk_op *op, float value)
{
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    vk_op_u32(op, u);
}

static void op_bind(vk_backend *v, vk_op *op, VkBuffer buf, VkDeviceSize offset, VkDeviceSize range)
{
    if (op->n_bind >= VK_MAX_BINDINGS || range > v->max_range) {
        op->bad = true;
        return;
    }
    op->bind[op->n_bind++] = (VkDescriptorBufferInfo){buf, offset, range};
}

static void op_access(vk_op *op, VkBuffer buf, VkDeviceSize begin, VkDeviceSize end, bool write)
{
    if (op->n_acc < VK_MAX_BINDINGS)
        op->acc[op->n_acc++] = (vk_access){buf, begin / 4 * 4, (end + 3) / 4 * 4, write};
}

void vk_op_dummy(vk_backend *v, vk_op *op)
{
    op_bind(v, op, vk_alloc_buffer(&v->dummy), v->dummy.offset, v->dummy.size);
}

/* Copies bytes [lo, hi) of b into tmp (in) or back (out), one region per
 * chunk piece. */
static llmem_status tmp_copy(vk_backend *v, const struct vk_op_tmp *t, bool out)
{
    VkBuffer tb = vk_alloc_buffer(&t->tmp);
    for (VkDeviceSize x = t->lo; x < t->hi;) {
        vk_piece p = vk_piece_at(t->b, x, t->hi - x);
        VkDeviceSize at = t->tmp.offset + (x - t->lo);
        vk_access a[2] = {{p.buf, p.at, p.at + p.n, out}, {tb, at, at + p.n, !out}};
        llmem_status st = vk_cmd_track(v, a, 2);
        if (st != LLMEM_OK)
            return st;
        VkBufferCopy r = out ? (VkBufferCopy){at, p.at, p.n} : (VkBufferCopy){p.at, at, p.n};
        v->vk.vkCmdCopyBuffer(v->cmd, out ? tb : p.buf, out ? p.buf : tb, 1, &r);
        v->n_transfer++;
        x += p.n;
    }
    return LLMEM_OK;
}

/* Binds bytes [start, end) of a buffer of several chunks that they cross
 * through a contiguous temporary (bytes [start & ~3, end rounded up to 4)
 * are copied, so 16-bit halves keep their word positions); returns the
 * binding's offset of `start` in bytes. Rare by construction: pools and
 * weights are placed so that bindings stay inside a chunk
 * (docs/vulkan.md); it keeps any other binding correct. */
static VkDeviceSize op_bind_tmp(vk_backend *v, vk_op *op, const vk_buffer *b, VkDeviceSize start,
                                VkDeviceSize end, bool write)
{
    if (op->n_tmp >= VK_MAX_BINDINGS) {
        op->bad = true;
        return 0;
    }
    struct vk_op_tmp *t = &op->tmp[op->n_tmp];
    t->b = b;
    t->lo = start / 4 * 4;
    t->hi = (end + 3) / 4 * 4;
    t->write = write;
    if (t->hi - t->lo > v->max_range || vk_alloc_make(v, t->hi - t->lo, &t->tmp) != LLMEM_OK) {
        op->bad = true;
        return 0;
    }
    op->n_tmp++;
    if (tmp_copy(v, t, false) != LLMEM_OK) {
        op->bad = true;
        return 0;
    }
    VkBuffer tb = vk_alloc_buffer(&t->tmp);
    op_bind(v, op, tb, t->tmp.offset, t->hi - t->lo);
    op_access(op, tb, t->tmp.offset, t->tmp.offset + (t->hi - t->lo), write);
    return start - t->lo;
}

uint32_t vk_op_tensor(vk_backend *v, vk_op *op, const llmem_tensor *t, bool write)
{
    size_t bytes = t ? llmem_tensor_nbytes(t) : 0;
    if (bytes == 0) {
        vk_op_dummy(v, op);
        return 0;
    }
    vk_buffer *b = vk_buf(t->buf);
    uint32_t ci = (uint32_t)(t->offset / b->chunk);
    VkDeviceSize local = t->offset - (VkDeviceSize)ci * b->chunk;
    if (local + bytes > b->chunk) {
        VkDeviceSize at = op_bind_tmp(v, op, b, t->offset, t->offset + bytes, write);
        return (uint32_t)(at / llmem_dtype_size(t->dtype));
    }
    const vk_alloc *a = vk_chunk(b, ci);
    VkDeviceSize start = a->offset + local, end = start + bytes;
    VkDeviceSize bstart = start / v->storage_align * v->storage_align;
    VkDeviceSize range = (end - bstart + 3) / 4 * 4;
    VkBuffer buf = vk_alloc_buffer(a);
    op_bind(v, op, buf, bstart, range);
    op_access(op, buf, start, end, write);
    return (uint32_t)((start - bstart) / llmem_dtype_size(t->dtype));
}

void vk_op_buffer(vk_backend *v, vk_op *op, llmem_buffer *buf, bool write)
{
    vk_buffer *b = vk_buf(buf);
    if (b->n_chunks > 1) {
        vk_log(v, "%s: a buffer of %zu bytes spans %u chunks: bound through a copy",
               vk_shader_codes[op->shader].name, buf->size, b->n_chunks);
        op_bind_tmp(v, op, b, 0, buf->size, write);
        return;
    }
    VkBuffer vb = vk_alloc_buffer(&b->a);
    op_bind(v, op, vb, b->a.offset, (buf->size + 3) / 4 * 4);
    op_access(op, vb, b->a.offset, b->a.offset + buf->size, write);
}

void vk_op_chunk(vk_backend *v, vk_op *op, llmem_buffer *buf, uint32_t i, bool write)
{
    vk_buffer *b = vk_buf(buf);
    if (i >= b->n_chunks) {
        vk_op_dummy(v, op);
        return;
    }
    const vk_alloc *a = vk_chunk(b, i);
    VkDeviceSize n = vk_chunk_bytes(b, i);
    VkBuffer vb = vk_alloc_buffer(a);
    op_bind(v, op, vb, a->offset, (n + 3) / 4 * 4);
    op_access(op, vb, a->offset, a->offset + n, write);
}

VkDeviceSize vk_op_buffer_chunks(vk_backend *v, vk_op *op, llmem_buffer *buf, bool write,
                                 uint32_t n_slot)
{
    vk_buffer *b = vk_buf(buf);
    if (b->n_chunks > n_slot) {
        vk_log(v, "%s: a buffer of %zu bytes spans %u chunks, more than %u",
               vk_shader_codes[op->shader].name, buf->size, b->n_chunks, n_slot);
        op->bad = true;
    }
    for (uint32_t i = 0; i < n_slot; i++) {
        if (i >= b->n_chunks) {
            vk_op_dummy(v, op);
            continue;
        }
        const vk_alloc *a = vk_chunk(b, i);
        VkDeviceSize n = vk_chunk_bytes(b, i);
        VkBuffer vb = vk_alloc_buffer(a);
        op_bind(v, op, vb, a->offset, (n + 3) / 4 * 4);
        op_access(op, vb, a->offset, a->offset + n, write);
    }
    return b->n_chunks > 1 ? b->chunk : buf->size;
}

uint32_t vk_op_raw(vk_backend *v, vk_op *op, VkBuffer buf, VkDeviceSize at, VkDeviceSize n,
                   VkDeviceSize unit, bool write)
{
    VkDeviceSize b0 = at / v->storage_align * v->storage_align;
    op_bind(v, op, buf, b0, (at + n - b0 + 3) / 4 * 4);
    op_access(op, buf, at, at + n, write);
    return (uint32_t)((at - b0) / unit);
}

void vk_op_alloc(vk_backend *v, vk_op *op, const vk_alloc *a, bool write)
{
    VkBuffer vb = vk_alloc_buffer(a);
    op_bind(v, op, vb, a->offset, a->size);
    op_access(op, vb, a->offset, a->offset + a->size, write);
}

void vk_op_stage(vk_backend *v, vk_op *op, const vk_stage_ref *s, VkDeviceSize size)
{
    /* Host-written before the submit: no device hazard to track. */
    op_bind(v, op, s->buf, s->offset, (size + 3) / 4 * 4);
}

static llmem_status pipeline_get(vk_backend *v, const vk_op *op, VkPipeline *out)
{
    for (uint32_t i = 0; i < v->n_pipes; i++) {
        const vk_pipeline *p = &v->pipes[i];
        if (p->shader == op->shader && p->n_spec == op->n_spec &&
            memcmp(p->spec, op->spec, op->n_spec * sizeof op->spec[0]) == 0) {
            *out = p->pipe;
            return LLMEM_OK;
        }
    }
    VkResult r;
    if (!v->modules[op->shader]) {
        const vk_shader_code *c = &vk_shader_codes[op->shader];
        VkShaderModuleCreateInfo mi = {
            .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            .codeSize = c->size,
            .pCode = c->code,
        };
        if ((r = v->vk.vkCreateShaderModule(v->dev, &mi, NULL, &v->modules[op->shader])) !=
            VK_SUCCESS)
            return vk_status(r);
    }
    if (!grow((void **)&v->pipes, &v->cap_pipes, v->n_pipes, sizeof *v->pipes))
        return LLMEM_E_NO_MEMORY;
    VkSpecializationMapEntry map[VK_MAX_SPEC];
    for (uint32_t i = 0; i < op->n_spec; i++)
        map[i] = (VkSpecializationMapEntry){i, i * 4, 4};
    VkSpecializationInfo si = {
        .mapEntryCount = op->n_spec,
        .pMapEntries = map,
        .dataSize = op->n_spec * 4,
        .pData = op->spec,
    };
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage =
            {
                .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = v->modules[op->shader],
                .pName = "main",
                .pSpecializationInfo = &si,
            },
        .layout = v->pipe_layout,
    };
    vk_pipeline *p = &v->pipes[v->n_pipes];
    r = v->vk.vkCreateComputePipelines(v->dev, v->pipe_cache, 1, &ci, NULL, &p->pipe);
    if (r != VK_SUCCESS) {
        vk_log(v, "pipeline %s: vkCreateComputePipelines failed (VkResult %d)",
               vk_shader_codes[op->shader].name, (int)r);
        return vk_status(r);
    }
    p->shader = op->shader;
    p->n_spec = op->n_spec;
    memcpy(p->spec, op->spec, sizeof p->spec);
    v->n_pipes++;
    vk_log(v, "pipeline %s created (%u specialization constants)",
           vk_shader_codes[op->shader].name, op->n_spec);
    *out = p->pipe;
    return LLMEM_OK;
}

static llmem_status desc_alloc(vk_backend *v, VkDescriptorSet *out)
{
    for (;;) {
        bool fresh = false;
        if (v->cur_desc_pool == v->n_desc_pools) {
            VkDescriptorPool *pools =
                realloc(v->desc_pools, (v->n_desc_pools + 1) * sizeof *pools);
            if (!pools)
                return LLMEM_E_NO_MEMORY;
            v->desc_pools = pools;
            VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       DESC_POOL_SETS * VK_MAX_BINDINGS};
            VkDescriptorPoolCreateInfo ci = {
                .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                .maxSets = DESC_POOL_SETS,
                .poolSizeCount = 1,
                .pPoolSizes = &ps,
            };
            VkResult r = v->vk.vkCreateDescriptorPool(v->dev, &ci, NULL,
                                                      &v->desc_pools[v->n_desc_pools]);
            if (r != VK_SUCCESS)
                return vk_status(r);
            v->n_desc_pools++;
            fresh = true;
        }
        VkDescriptorSetAllocateInfo ai = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
            .descriptorPool = v->desc_pools[v->cur_desc_pool],
            .descriptorSetCount = 1,
            .pSetLayouts = &v->set_layout,
        };
        VkResult r = v->vk.vkAllocateDescriptorSets(v->dev, &ai, out);
        if (r == VK_SUCCESS)
            return LLMEM_OK;
        /* A full pool moves on to the next; a fresh one failing is an error. */
        if (fresh || (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL))
            return vk_status(r);
        v->cur_desc_pool++;
    }
}

/* Copies written temporaries back, then returns every temporary (safe
 * with recorded work still using it: a later user of the range conflicts
 * with these accesses and gets a barrier). */
static llmem_status op_tmp_finish(vk_backend *v, vk_op *op, bool ran)
{
    llmem_status st = LLMEM_OK;
    for (uint32_t i = 0; i < op->n_tmp; i++) {
        if (ran && op->tmp[i].write && st == LLMEM_OK)
            st = tmp_copy(v, &op->tmp[i], true);
        vk_alloc_release(v, &op->tmp[i].tmp);
    }
    op->n_tmp = 0;
    return st;
}

static llmem_status op_dispatch(vk_backend *v, vk_op *op, uint64_t n_groups)
{
    if (v->error != LLMEM_OK)
        return v->error;
    if (op->bad) {
        vk_log(v, "%s: a tensor exceeds maxStorageBufferRange (%llu bytes) or too many arguments",
               vk_shader_codes[op->shader].name, (unsigned long long)v->max_range);
        return LLMEM_E_UNSUPPORTED;
    }
    if (n_groups == 0)
        return LLMEM_OK;
    uint64_t gx = n_groups < v->max_groups ? n_groups : v->max_groups;
    uint64_t gy = vk_div_up(n_groups, gx);
    if (gy > v->max_groups)
        return LLMEM_E_UNSUPPORTED;
    VkPipeline pipe;
    llmem_status st = pipeline_get(v, op, &pipe);
    if (st != LLMEM_OK)
        return st;
    if ((st = vk_cmd_track(v, op->acc, op->n_acc)) != LLMEM_OK)
        return st;
    VkDescriptorSet set;
    if ((st = desc_alloc(v, &set)) != LLMEM_OK)
        return st;
    while (op->n_bind < VK_MAX_BINDINGS)
        vk_op_dummy(v, op);
    VkWriteDescriptorSet w = {
        .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
        .dstSet = set,
        .dstBinding = 0,
        .descriptorCount = VK_MAX_BINDINGS,
        .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        .pBufferInfo = op->bind,
    };
    v->vk.vkUpdateDescriptorSets(v->dev, 1, &w, 0, NULL);
    v->vk.vkCmdBindPipeline(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    v->vk.vkCmdBindDescriptorSets(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, v->pipe_layout, 0, 1, &set,
                                  0, NULL);
    if (op->n_push)
        v->vk.vkCmdPushConstants(v->cmd, v->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                 op->n_push * 4, op->push);
    vk_prof_before(v, (uint32_t)op->shader);
    v->vk.vkCmdDispatch(v->cmd, (uint32_t)gx, (uint32_t)gy, 1);
    vk_prof_after(v);
    v->n_dispatch++;
    return LLMEM_OK;
}

llmem_status vk_op_run(vk_backend *v, vk_op *op, uint64_t n_groups)
{
    llmem_status st = op_dispatch(v, op, n_groups);
    llmem_status st2 = op_tmp_finish(v, op, st == LLMEM_OK);
    return st != LLMEM_OK ? st : st2;
}

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
 * Descriptors and pipelines (one set layout, one pipeline layout, created
 * here) are used by the dispatches of vk_op.c.
 *
 * Recorded steps (vk_record.c). A replay ends the lazy command buffer and
 * queues the step's own command buffer after it; later work goes into a
 * fresh lazy command buffer that starts with a full barrier. The next
 * flush submits them all, in order, in one vkQueueSubmit.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vk_internal.h"
#include "vk_presplit.h"

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

bool vk_grow(void **arr, uint32_t *cap, uint32_t n, size_t elem)
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
    vk_steptime_finish(v);
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
    free(v->seg_cmd);
    free(v->seg_graph);
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
    if (vk_held_any(v)) { /* a held-back conv or product goes first */
        llmem_status fs = vk_held_flush(v);
        if (fs != LLMEM_OK)
            return fs;
    }
    llmem_status st = vk_cmd_begin(v);
    if (st != LLMEM_OK)
        return st;
    bool need = false;
    for (uint32_t i = 0; i < n && !need; i++)
        for (uint32_t j = 0; j < v->n_acc && !need; j++)
            need = conflicts(&acc[i], &v->acc[j]);
    if (need)
        vk_cmd_barrier(v);
    vk_presplit_written(v, acc, n);
    for (uint32_t i = 0; i < n; i++) {
        if (!vk_grow((void **)&v->acc, &v->cap_acc, v->n_acc, sizeof *v->acc)) {
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
    if (!vk_grow((void **)&v->rb, &v->cap_rb, v->n_rb, sizeof *v->rb))
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

/* Microseconds vk_fence_wait polls the fence before it blocks where
 * $LLMEM_VULKAN_SPIN_US is unset: on a GPU, 20 ms (a decode step's
 * submit; the 2b Bamba batch-1 step gains 0.12 ms of ~2.5, docs/benchmarks.md
 * "Vulkan batch-1 step: the host gap"); 0 on a CPU device (lavapipe),
 * whose own threads need the host's cores. */
#define SPIN_US_GPU 20000

double vk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

VkResult vk_fence_wait(vk_backend *v)
{
    bool cpu = v->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    long spin = VK_KNOB(v, spin_us, cpu ? 0 : SPIN_US_GPU);
    if (spin > 0) {
        double t0 = vk_now_ms();
        do {
            VkResult r = v->vk.vkGetFenceStatus(v->dev, v->fence);
            if (r != VK_NOT_READY)
                return r; /* signaled, or the device is lost */
        } while (vk_now_ms() - t0 < (double)spin * 1e-3);
    }
    return v->vk.vkWaitForFences(v->dev, 1, &v->fence, VK_TRUE, UINT64_MAX);
}

/* Room for n more command buffers in the next submit. */
static bool seg_room(vk_backend *v, uint32_t n)
{
    return vk_grow((void **)&v->seg_cmd, &v->cap_seg_cmd, v->n_segs + n - 1, sizeof *v->seg_cmd) &&
           vk_grow((void **)&v->seg_graph, &v->cap_seg_graph, v->n_segs + n - 1,
                   sizeof *v->seg_graph);
}

static void seg_push(vk_backend *v, VkCommandBuffer cmd, vk_graph *g)
{
    v->seg_cmd[v->n_segs] = cmd;
    v->seg_graph[v->n_segs++] = g;
}

llmem_status vk_cmd_queue_graph(vk_backend *v, VkCommandBuffer cmd, vk_graph *g)
{
    if (v->error != LLMEM_OK)
        return v->error;
    if (vk_held_any(v)) { /* a held-back conv or product runs before the step */
        llmem_status fs = vk_held_flush(v);
        if (fs != LLMEM_OK)
            return fs;
    }
    /* room first, nothing half done: the lazy buffer, the step, and the
     * lazy buffer that ends the submit (vk_cmd_flush) */
    if (!seg_room(v, 3))
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
    vk_presplit_drop(v); /* the step's writes are not tracked here */
    return LLMEM_OK;
}

llmem_status vk_cmd_flush(vk_backend *v)
{
    if (vk_held_any(v)) {
        llmem_status fs = vk_held_flush(v);
        if (fs != LLMEM_OK)
            return fs;
    }
    if (v->capture)
        return vk_capture_refuse(v, "a wait for the device");
    vk_presplit_drop(v);
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
    /* the queued command buffers in order, then the lazy one (its room was
     * made by vk_cmd_queue_graph) */
    const VkCommandBuffer *cmds = &v->cmd;
    uint32_t n_cmds = 1;
    if (v->n_segs > 0) {
        v->seg_cmd[v->n_segs] = v->cmd;
        cmds = v->seg_cmd;
        n_cmds = v->n_segs + 1;
    }
    uint32_t n_steps = 0;
    for (uint32_t i = 0; i < v->n_segs; i++)
        n_steps += v->seg_graph[i] != NULL;
    if (r == VK_SUCCESS)
        r = v->vk.vkResetFences(v->dev, 1, &v->fence);
    if (r == VK_SUCCESS) {
        cmds = vk_steptime_submit(v, cmds, &n_cmds, n_steps == 1 && v->n_segs == 2 && v->seg_graph[1]);
        VkSubmitInfo si = {
            .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
            .commandBufferCount = n_cmds,
            .pCommandBuffers = cmds,
        };
        r = v->vk.vkQueueSubmit(v->queue, 1, &si, v->fence);
        vk_steptime_submitted(v);
    }
    if (r == VK_SUCCESS)
        r = vk_fence_wait(v);
    vk_steptime_waited(v, r == VK_SUCCESS);
    v->n_submits++;
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
        if (v->seg_graph[i]) {
            vk_graph_done(v->seg_graph[i]);
        } else if (r == VK_SUCCESS &&
                   vk_grow((void **)&v->spare, &v->cap_spare, v->n_spare, sizeof *v->spare)) {
            v->vk.vkResetCommandBuffer(v->seg_cmd[i], 0);
            v->spare[v->n_spare++] = v->seg_cmd[i];
        } else {
            v->vk.vkFreeCommandBuffers(v->dev, v->cmd_pool, 1, &v->seg_cmd[i]);
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

/* llmem Vulkan backend: recorded op sequences (the record slots of
 * <llmem/backend_impl.h>, llmem_backend_record), as reusable command
 * buffers: the Vulkan form of a CUDA graph (issue 11 item 2, issue 12).
 *
 * record_begin submits what is pending, then points the backend's command
 * buffer, descriptor pools and staging list at the new step's own. The ops
 * then record into them exactly as they do eagerly (push constants,
 * descriptor sets and barriers included) and nothing runs. record_end
 * ends the command buffer and gives the backend its own state back. A
 * replay queues the command buffer after the work recorded so far
 * (vk_cmd_queue_graph): no descriptor writes, pipeline lookups or hazard
 * tracking on the host, and the same single submit per ubatch.
 *
 * What a step keeps for its life: its descriptor sets (in its own pools),
 * its staging chunks (small constant tables such as RoPE frequencies,
 * written once while recording), and every temporary an op released while
 * recording (vk_capture_keep), so no later allocation can take a range the
 * step writes at each replay. What cannot be recorded: an upload (its
 * contents would be those of the recording), a download or a wait, and
 * any call while $LLMEM_VULKAN_PROFILE is set (the timestamps belong to
 * one submit). Those fail the recording with LLMEM_E_UNSUPPORTED, and the
 * caller runs the step eagerly (models/decode_graph.c).
 *
 * Buffers the step uses must outlive it (the contract of
 * llmem_backend_record). A step is submitted at most once per submit: a
 * replay of a step still queued flushes first.
 */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"
#include "vk_presplit.h"

struct vk_graph {
    VkCommandBuffer cmd;
    VkDescriptorPool *desc_pools;
    uint32_t n_desc_pools, cur_desc_pool;
    vk_stage *stages;
    VkDeviceSize stage_total;
    vk_alloc *keep; /* temporaries released while recording */
    uint32_t n_keep, cap_keep;
    uint32_t n_dispatch;
    bool failed;  /* something could not be recorded */
    bool pending; /* queued for the next submit */
    VkCommandBuffer lazy; /* the backend's command buffer while recording */
};

/* Exchanges the backend's descriptor pools and staging list with g's. */
static void swap_state(vk_backend *v, vk_graph *g)
{
    VkDescriptorPool *pools = v->desc_pools;
    uint32_t n = v->n_desc_pools, cur = v->cur_desc_pool;
    v->desc_pools = g->desc_pools, v->n_desc_pools = g->n_desc_pools,
    v->cur_desc_pool = g->cur_desc_pool;
    g->desc_pools = pools, g->n_desc_pools = n, g->cur_desc_pool = cur;
    vk_stage *st = v->stages;
    VkDeviceSize total = v->stage_total;
    v->stages = g->stages, v->stage_total = g->stage_total;
    g->stages = st, g->stage_total = total;
}

static void graph_destroy(vk_backend *v, vk_graph *g)
{
    if (g->cmd)
        v->vk.vkFreeCommandBuffers(v->dev, v->cmd_pool, 1, &g->cmd);
    for (uint32_t i = 0; i < g->n_desc_pools; i++)
        v->vk.vkDestroyDescriptorPool(v->dev, g->desc_pools[i], NULL);
    free(g->desc_pools);
    vk_stage_destroy(v, g->stages);
    for (uint32_t i = 0; i < g->n_keep; i++)
        vk_alloc_release(v, &g->keep[i]);
    free(g->keep);
    free(g);
}

llmem_status vk_record_begin(llmem_backend *be)
{
    vk_backend *v = vk_from(be);
    if (v->error != LLMEM_OK)
        return v->error;
    if (v->capture)
        return LLMEM_E_STATE;
    if (v->prof)
        return LLMEM_E_UNSUPPORTED;
    llmem_status st = vk_cmd_flush(v); /* earlier work is submitted first */
    if (st != LLMEM_OK)
        return st;
    vk_graph *g = calloc(1, sizeof *g);
    if (!g)
        return LLMEM_E_NO_MEMORY;
    VkCommandBufferAllocateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = v->cmd_pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    VkResult r = v->vk.vkAllocateCommandBuffers(v->dev, &ci, &g->cmd);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    if (r == VK_SUCCESS)
        r = v->vk.vkBeginCommandBuffer(g->cmd, &bi);
    if (r != VK_SUCCESS) {
        graph_destroy(v, g);
        return vk_status(r);
    }
    swap_state(v, g);
    g->lazy = v->cmd;
    v->cmd = g->cmd;
    v->recording = true;
    v->n_dispatch = v->n_transfer = v->n_barrier = 0;
    v->n_acc = 0;
    v->capture = g;
    vk_presplit_drop(v);
    vk_cmd_barrier(v); /* after whatever was submitted before the replay */
    return LLMEM_OK;
}

llmem_status vk_record_end(llmem_backend *be, void **graph)
{
    vk_backend *v = vk_from(be);
    *graph = NULL;
    vk_graph *g = v->capture;
    if (!g)
        return LLMEM_E_STATE;
    if (vk_held_any(v) && vk_held_flush(v) != LLMEM_OK)
        g->failed = true; /* a held-back conv or product belongs to the step */
    VkResult r = v->vk.vkEndCommandBuffer(g->cmd);
    g->n_dispatch = v->n_dispatch;
    uint32_t n_barrier = v->n_barrier;
    v->capture = NULL;
    vk_presplit_drop(v);
    v->cmd = g->lazy;
    v->recording = false;
    v->n_acc = 0;
    v->n_dispatch = v->n_transfer = v->n_barrier = 0;
    swap_state(v, g);
    llmem_status st = r != VK_SUCCESS ? vk_status(r)
                      : v->error != LLMEM_OK ? v->error
                      : g->failed ? LLMEM_E_UNSUPPORTED
                                  : LLMEM_OK;
    if (st != LLMEM_OK) {
        graph_destroy(v, g);
        return st;
    }
    vk_log(v, "recorded a step: %u dispatches, %u barriers, %u descriptor pools, %u kept "
           "temporaries",
           g->n_dispatch, n_barrier, g->n_desc_pools, g->n_keep);
    *graph = g;
    return LLMEM_OK;
}

llmem_status vk_graph_replay(llmem_backend *be, void *graph)
{
    vk_backend *v = vk_from(be);
    vk_graph *g = graph;
    if (v->capture)
        return LLMEM_E_STATE;
    if (g->pending) { /* once per submit */
        llmem_status st = vk_cmd_flush(v);
        if (st != LLMEM_OK)
            return st;
    }
    llmem_status st = vk_cmd_queue_graph(v, g->cmd, g);
    if (st == LLMEM_OK)
        g->pending = true;
    return st;
}

void vk_graph_free(llmem_backend *be, void *graph)
{
    vk_backend *v = vk_from(be);
    vk_graph *g = graph;
    if (g->pending)
        vk_cmd_flush(v); /* its command buffer must not be pending when freed */
    graph_destroy(v, g);
}

void vk_graph_done(vk_graph *g)
{
    g->pending = false;
}

bool vk_capture_keep(vk_backend *v, const vk_alloc *a)
{
    vk_graph *g = v->capture;
    if (!vk_grow((void **)&g->keep, &g->cap_keep, g->n_keep, sizeof *g->keep)) {
        g->failed = true;
        return false;
    }
    g->keep[g->n_keep++] = *a;
    return true;
}

llmem_status vk_capture_refuse(vk_backend *v, const char *what)
{
    vk_log(v, "recording a step: %s cannot be recorded; the step runs eagerly", what);
    v->capture->failed = true;
    return LLMEM_E_UNSUPPORTED;
}

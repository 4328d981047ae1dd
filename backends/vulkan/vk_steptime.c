/* llmem Vulkan backend: where a recorded step's wall time goes
 * ($LLMEM_VULKAN_STEP_TIMES=1; docs/vulkan.md).
 *
 * A decode step that replays a recording is one submit of three command
 * buffers: the lazy one with the step's uploads, the recorded step, and
 * the lazy one after it (sampling, the download of its result). While the
 * variable is set, such a submit gets a timestamp at the top of the pipe
 * before the first and one at the bottom of the pipe after each (four
 * small command buffers recorded once), and the host clock is read around
 * vkQueueSubmit and the fence wait. For each such submit that follows
 * another one (the steady state of a decode loop), the wall time since
 * the previous one's wait returned splits into: GPU time from the first
 * timestamp to the last (and its three parts), the host time in
 * vkQueueSubmit, the wait's time beyond the GPU span (submit-to-start
 * latency plus the fence's wake-up; negative where the device starts
 * before vkQueueSubmit returns), and the host time from the previous
 * step's wait to this submit (the rest of that flush, submits of
 * transfers alone in between such as `llmem generate`'s download of the
 * log-probs, the model's bookkeeping, recording the uploads and
 * sampling): the four add up to the wall time. A submit with other
 * dispatches in between (a prefill) starts the chain again. Means per
 * step go to stderr when the backend closes. Off by default; the
 * timestamps add four command buffers to a step's submit and nothing to
 * its dispatches, so the figures are those of the unprofiled step
 * (docs/benchmarks.md, "Vulkan batch-1 step: the host gap").
 */
#include <stdio.h>
#include <stdlib.h>

#include "vk_internal.h"

enum { STAMPS = 4 };

struct vk_steptime {
    VkQueryPool pool;
    VkCommandBuffer stamp[STAMPS]; /* [0] resets, stamps 0 at the top; [i] stamps i at the bottom */
    VkCommandBuffer wrapped[2 * 3 + 1];
    double period_ms;     /* ms per timestamp tick */
    double t_submit, t_submitted, t_last; /* host clock, ms; t_last: the last step's wait end */
    bool timed, chained;  /* this submit is timed; so was the previous one */
    uint64_t n;
    double wall, gpu, part[3], submit, wake, host;
};

static void steptime_free(vk_backend *v, vk_steptime *t)
{
    for (int i = 0; i < STAMPS; i++)
        if (t->stamp[i])
            v->vk.vkFreeCommandBuffers(v->dev, v->cmd_pool, 1, &t->stamp[i]);
    if (t->pool)
        v->vk.vkDestroyQueryPool(v->dev, t->pool, NULL);
    free(t);
}

void vk_steptime_init(vk_backend *v)
{
    const char *e = getenv("LLMEM_VULKAN_STEP_TIMES");
    if (!e || *e != '1' || v->props.limits.timestampPeriod <= 0.0f)
        return;
    vk_steptime *t = calloc(1, sizeof *t);
    if (!t)
        return;
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                .queryCount = STAMPS};
    VkCommandBufferAllocateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = v->cmd_pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VkResult r = v->vk.vkCreateQueryPool(v->dev, &qi, NULL, &t->pool);
    for (uint32_t i = 0; i < STAMPS && r == VK_SUCCESS; i++) {
        if ((r = v->vk.vkAllocateCommandBuffers(v->dev, &ci, &t->stamp[i])) != VK_SUCCESS ||
            (r = v->vk.vkBeginCommandBuffer(t->stamp[i], &bi)) != VK_SUCCESS)
            break;
        if (i == 0)
            v->vk.vkCmdResetQueryPool(t->stamp[0], t->pool, 0, STAMPS);
        v->vk.vkCmdWriteTimestamp(t->stamp[i], i == 0 ? VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT
                                                      : VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                  t->pool, i);
        r = v->vk.vkEndCommandBuffer(t->stamp[i]);
    }
    if (r != VK_SUCCESS) {
        vk_log(v, "step times: cannot set up the timestamps (VkResult %d)", (int)r);
        steptime_free(v, t);
        return;
    }
    t->period_ms = (double)v->props.limits.timestampPeriod * 1e-6;
    v->steptime = t;
}

const VkCommandBuffer *vk_steptime_submit(vk_backend *v, const VkCommandBuffer *cmds,
                                          uint32_t *n_cmds, bool one_step)
{
    vk_steptime *t = v->steptime;
    if (!t)
        return cmds;
    t->timed = one_step && *n_cmds == 3;
    if (!t->timed && v->n_dispatch > 0)
        t->chained = false; /* eager work (a prefill) is no part of a decode step */
    if (t->timed) {
        t->wrapped[0] = t->stamp[0];
        for (uint32_t i = 0; i < 3; i++) {
            t->wrapped[1 + 2 * i] = cmds[i];
            t->wrapped[2 + 2 * i] = t->stamp[i + 1];
        }
        cmds = t->wrapped;
        *n_cmds = 2 * 3 + 1;
    }
    t->t_submit = vk_now_ms();
    return cmds;
}

void vk_steptime_submitted(vk_backend *v)
{
    if (v->steptime)
        v->steptime->t_submitted = vk_now_ms();
}

void vk_steptime_waited(vk_backend *v, bool ok)
{
    vk_steptime *t = v->steptime;
    if (!t)
        return;
    if (!t->timed) /* a download between steps: host time of the next one */
        return;
    double now = vk_now_ms();
    uint64_t q[STAMPS];
    bool read = ok &&
                v->vk.vkGetQueryPoolResults(v->dev, t->pool, 0, STAMPS, sizeof q, q, sizeof q[0],
                                            VK_QUERY_RESULT_64_BIT) == VK_SUCCESS;
    if (read && t->chained) {
        double gpu = (double)(q[STAMPS - 1] - q[0]) * t->period_ms;
        t->n++;
        t->wall += now - t->t_last;
        t->gpu += gpu;
        for (int i = 0; i < 3; i++)
            t->part[i] += (double)(q[i + 1] - q[i]) * t->period_ms;
        t->submit += t->t_submitted - t->t_submit;
        t->wake += (now - t->t_submitted) - gpu;
        t->host += t->t_submit - t->t_last;
    }
    t->chained = read;
    t->t_last = now;
}

void vk_steptime_finish(vk_backend *v)
{
    vk_steptime *t = v->steptime;
    if (!t)
        return;
    double n = t->n ? (double)t->n : 1.0;
    fprintf(stderr,
            "vulkan step times (%s): %llu recorded steps, ms per step: wall %.4f = GPU %.4f "
            "(before the step %.4f, the step %.4f, after it %.4f) + submit %.4f + wait beyond "
            "the GPU %.4f + host %.4f\n",
            v->device_name, (unsigned long long)t->n, t->wall / n, t->gpu / n, t->part[0] / n,
            t->part[1] / n, t->part[2] / n, t->submit / n, t->wake / n, t->host / n);
    steptime_free(v, t);
    v->steptime = NULL;
}

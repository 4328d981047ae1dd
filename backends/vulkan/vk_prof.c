/* llmem Vulkan backend: GPU time per shader ($LLMEM_VULKAN_PROFILE=1).
 *
 * Each dispatch gets a timestamp pair (vkCmdWriteTimestamp, bottom of
 * pipe) around it; after each submit's fence the pairs are read back and
 * summed per shader; when the backend closes, a table of total time, calls
 * and mean per call, slowest shader first, goes to stderr. A dispatch's
 * interval runs from "everything recorded before it has finished" to "it
 * has finished", so dispatches that overlap (no barrier between them) share
 * their time, and the column sums to the device time of the submits. At
 * most PROF_CAP / 2 dispatches of one submit are timed (the rest count in
 * "untimed dispatches"). Off by default: a profiled run does extra work.
 *
 * $LLMEM_VULKAN_PROFILE=N with N >= 2 also prints, as it goes, the table of
 * each submit whose timed dispatches took at least N ms (submit number and
 * dispatch count in its header): a pp512 run's ubatches (e.g. the 496-row
 * and the 16-row one) and a warm run apart from a cold one, while decode
 * steps below N ms stay out.
 *
 * $LLMEM_VULKAN_PROFILE_SEQ=S (with the profile on) prints the dispatches of
 * submit S one by one, in recorded order (index, shader, µs): which product
 * of a decode step takes what, where the tables sum them per shader.
 */
#include <stdio.h>
#include <stdlib.h>

#include "vk_internal.h"

#define PROF_CAP 16384 /* timestamps per submit */

struct vk_prof {
    VkQueryPool pool;
    uint32_t n;              /* pairs written in the current command buffer */
    uint16_t shader[PROF_CAP / 2];
    uint64_t ts[PROF_CAP];   /* read back after each submit */
    double ns[VK_SH_COUNT];  /* summed per shader */
    uint64_t calls[VK_SH_COUNT];
    uint64_t untimed;
    double period;           /* ns per timestamp tick */
    uint64_t mask;           /* valid timestamp bits */
    double each_ms;          /* per-submit tables from this many ms; 0: none */
    uint64_t submits;        /* submits collected so far */
    uint64_t seq;            /* $LLMEM_VULKAN_PROFILE_SEQ: the submit listed dispatch by dispatch */
    double sub_ns[VK_SH_COUNT]; /* the current submit's, for the per-submit table */
    uint64_t sub_calls[VK_SH_COUNT];
};

/* The rows of a table, slowest shader first: ns and calls per shader
 * (calls zeroed as they are printed), total the ns summed. */
static void prof_table(double *ns, uint64_t *calls, double total)
{
    fprintf(stderr, "  %-22s %12s %7s %10s %12s\n", "shader", "ms", "share", "calls", "us/call");
    for (;;) {
        int best = -1;
        for (uint32_t i = 0; i < VK_SH_COUNT; i++)
            if (calls[i] && (best < 0 || ns[i] > ns[best]))
                best = (int)i;
        if (best < 0)
            break;
        fprintf(stderr, "  %-22s %12.3f %6.1f%% %10llu %12.2f\n", vk_shader_codes[best].name,
                ns[best] * 1e-6, total > 0 ? 100.0 * ns[best] / total : 0.0,
                (unsigned long long)calls[best], ns[best] * 1e-3 / (double)calls[best]);
        calls[best] = 0;
    }
}

void vk_prof_init(vk_backend *v)
{
    const char *e = getenv("LLMEM_VULKAN_PROFILE");
    if (!e || !*e || *e == '0' || v->props.limits.timestampPeriod <= 0.0f)
        return;
    uint32_t n_fam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(v->phys, &n_fam, NULL);
    VkQueueFamilyProperties *fam = calloc(n_fam ? n_fam : 1, sizeof *fam);
    if (!fam)
        return;
    vkGetPhysicalDeviceQueueFamilyProperties(v->phys, &n_fam, fam);
    uint32_t bits = v->queue_family < n_fam ? fam[v->queue_family].timestampValidBits : 0;
    free(fam);
    vk_prof *p = calloc(1, sizeof *p);
    if (!p || bits == 0) {
        free(p);
        vk_log(v, "profile: this queue has no timestamps");
        return;
    }
    VkQueryPoolCreateInfo qi = {
        .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
        .queryType = VK_QUERY_TYPE_TIMESTAMP,
        .queryCount = PROF_CAP,
    };
    if (v->vk.vkCreateQueryPool(v->dev, &qi, NULL, &p->pool) != VK_SUCCESS) {
        free(p);
        return;
    }
    p->period = v->props.limits.timestampPeriod;
    p->mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
    long each = strtol(e, NULL, 10);
    p->each_ms = each >= 2 ? (double)each : 0.0;
    const char *sq = getenv("LLMEM_VULKAN_PROFILE_SEQ");
    p->seq = sq ? strtoull(sq, NULL, 10) : 0;
    v->prof = p;
}

void vk_prof_begin(vk_backend *v)
{
    if (!v->prof)
        return;
    v->vk.vkCmdResetQueryPool(v->cmd, v->prof->pool, 0, PROF_CAP);
    v->prof->n = 0;
}

void vk_prof_before(vk_backend *v, uint32_t shader)
{
    vk_prof *p = v->prof;
    if (!p)
        return;
    if (p->n >= PROF_CAP / 2) {
        p->untimed++;
        return;
    }
    p->shader[p->n] = (uint16_t)shader;
    v->vk.vkCmdWriteTimestamp(v->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->pool, 2 * p->n);
}

void vk_prof_after(vk_backend *v)
{
    vk_prof *p = v->prof;
    if (!p || p->n >= PROF_CAP / 2)
        return;
    v->vk.vkCmdWriteTimestamp(v->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->pool,
                              2 * p->n + 1);
    p->n++;
}

void vk_prof_collect(vk_backend *v)
{
    vk_prof *p = v->prof;
    if (!p || p->n == 0)
        return;
    uint64_t *ts = p->ts;
    if (v->vk.vkGetQueryPoolResults(v->dev, p->pool, 0, 2 * p->n, sizeof p->ts, ts, sizeof ts[0],
                                    VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) !=
        VK_SUCCESS)
        return;
    double sub = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        uint64_t d = ((ts[2 * i + 1] & p->mask) - (ts[2 * i] & p->mask)) & p->mask;
        double ns = (double)d * p->period;
        p->ns[p->shader[i]] += ns;
        p->calls[p->shader[i]]++;
        p->sub_ns[p->shader[i]] += ns;
        p->sub_calls[p->shader[i]]++;
        sub += ns;
    }
    p->submits++;
    if (p->seq == p->submits) {
        fprintf(stderr, "vulkan profile, submit %llu dispatch by dispatch (%u):\n",
                (unsigned long long)p->submits, p->n);
        for (uint32_t i = 0; i < p->n; i++) {
            uint64_t d = ((ts[2 * i + 1] & p->mask) - (ts[2 * i] & p->mask)) & p->mask;
            fprintf(stderr, "  %5u %-22s %10.2f us\n", i, vk_shader_codes[p->shader[i]].name,
                    (double)d * p->period * 1e-3);
        }
    }
    if (p->each_ms > 0 && sub * 1e-6 >= p->each_ms) {
        fprintf(stderr, "vulkan profile, submit %llu (%u dispatches): %.3f ms\n",
                (unsigned long long)p->submits, p->n, sub * 1e-6);
        prof_table(p->sub_ns, p->sub_calls, sub);
    }
    for (uint32_t i = 0; i < VK_SH_COUNT; i++) {
        p->sub_ns[i] = 0;
        p->sub_calls[i] = 0;
    }
    p->n = 0;
}

void vk_prof_finish(vk_backend *v)
{
    vk_prof *p = v->prof;
    if (!p)
        return;
    double total = 0;
    for (uint32_t i = 0; i < VK_SH_COUNT; i++)
        total += p->ns[i];
    fprintf(stderr, "vulkan profile (%s): GPU time per shader, %.3f ms in all\n", v->device_name,
            total * 1e-6);
    prof_table(p->ns, p->calls, total);
    if (p->untimed)
        fprintf(stderr, "  untimed dispatches: %llu\n", (unsigned long long)p->untimed);
    v->vk.vkDestroyQueryPool(v->dev, p->pool, NULL);
    free(p);
    v->prof = NULL;
}

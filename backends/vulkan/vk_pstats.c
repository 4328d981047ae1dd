/* Pipeline statistics for tuning shaders: with $LLMEM_VULKAN_PIPELINE_STATS=1
 * the backend enables VK_KHR_pipeline_executable_properties where the device
 * has it, creates every compute pipeline with
 * VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR, and writes one line per
 * executable of each new pipeline to stderr (and to $LLMEM_VULKAN_LOG):
 *
 *   pipeline stats: attention_decode [spec 2,128,..] exe 0 "Compute" sg 32: <name>=<value> ...
 *
 * The statistics are the driver's own (NVIDIA 580: the register count,
 * shared and local memory bytes, spills; Mesa's lavapipe: LLVM's
 * instruction counts), which is what decides occupancy and whether an array
 * lives in registers. The Vulkan specification, "Pipeline Properties and
 * Statistics" (VK_KHR_pipeline_executable_properties); used for measuring
 * only, so off by default (capturing may slow pipeline creation). */
#include "vk_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PSTATS_EXE_MAX 4
#define PSTATS_STAT_MAX 32

static bool pstats_asked(void)
{
    const char *e = getenv("LLMEM_VULKAN_PIPELINE_STATS");
    return e && *e && strcmp(e, "0") != 0;
}

bool vk_pstats_query(VkPhysicalDevice pd, VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR *f,
                     const char **why)
{
    *f = (VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR){
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
    *why = NULL;
    if (!pstats_asked())
        return false;
    if (vk_instance_api() < VK_API_VERSION_1_1) {
        *why = "needs Vulkan 1.1";
        return false;
    }
    if (!vk_has_device_ext(pd, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME)) {
        *why = "the device does not list " VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
        return false;
    }
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = f};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!f->pipelineExecutableInfo) {
        *why = "the device does not support pipelineExecutableInfo";
        return false;
    }
    f->pNext = NULL;
    return true;
}

void vk_pstats_report_open(vk_backend *v, const char *why)
{
    if (!pstats_asked())
        return;
    if (v->pstats)
        vk_log(v, "pipeline stats: on (LLMEM_VULKAN_PIPELINE_STATS)");
    else {
        fprintf(stderr, "llmem: vulkan: LLMEM_VULKAN_PIPELINE_STATS ignored: %s\n",
                why ? why : "unavailable");
        vk_log(v, "pipeline stats: off (%s)", why ? why : "unavailable");
    }
}

/* One statistic as text into buf. */
static void stat_text(const VkPipelineExecutableStatisticKHR *s, char *buf, size_t len)
{
    switch (s->format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
        snprintf(buf, len, "%u", (unsigned)s->value.b32);
        break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
        snprintf(buf, len, "%" PRId64, s->value.i64);
        break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
        snprintf(buf, len, "%" PRIu64, s->value.u64);
        break;
    default:
        snprintf(buf, len, "%g", s->value.f64);
        break;
    }
}

void vk_pstats_print(vk_backend *v, VkPipeline pipe, const char *name, const uint32_t *spec,
                     uint32_t n_spec)
{
    if (!v->pstats || !v->vk.vkGetPipelineExecutablePropertiesKHR ||
        !v->vk.vkGetPipelineExecutableStatisticsKHR)
        return;
    char head[320];
    int at = snprintf(head, sizeof head, "pipeline stats: %s [spec", name);
    for (uint32_t i = 0; i < n_spec && at > 0 && (size_t)at < sizeof head; i++)
        at += snprintf(head + at, sizeof head - (size_t)at, "%s%u", i ? "," : " ", spec[i]);
    if (at > 0 && (size_t)at < sizeof head)
        snprintf(head + at, sizeof head - (size_t)at, "]");
    VkPipelineInfoKHR pi = {.sType = VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, .pipeline = pipe};
    VkPipelineExecutablePropertiesKHR ep[PSTATS_EXE_MAX];
    uint32_t ne = PSTATS_EXE_MAX;
    for (uint32_t i = 0; i < ne; i++)
        ep[i] = (VkPipelineExecutablePropertiesKHR){
            .sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR};
    if (v->vk.vkGetPipelineExecutablePropertiesKHR(v->dev, &pi, &ne, ep) < 0) {
        vk_log(v, "%s: no executables (vkGetPipelineExecutablePropertiesKHR failed)", head);
        return;
    }
    for (uint32_t e = 0; e < ne; e++) {
        VkPipelineExecutableInfoKHR ei = {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                                          .pipeline = pipe,
                                          .executableIndex = e};
        VkPipelineExecutableStatisticKHR st[PSTATS_STAT_MAX];
        uint32_t ns = PSTATS_STAT_MAX;
        for (uint32_t i = 0; i < ns; i++)
            st[i] = (VkPipelineExecutableStatisticKHR){
                .sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR};
        if (v->vk.vkGetPipelineExecutableStatisticsKHR(v->dev, &ei, &ns, st) < 0)
            ns = 0;
        char line[2048];
        int n = snprintf(line, sizeof line, "%s exe %u \"%s\" sg %u:", head, e, ep[e].name,
                         ep[e].subgroupSize);
        for (uint32_t i = 0; i < ns && n > 0 && (size_t)n < sizeof line; i++) {
            char val[64];
            stat_text(&st[i], val, sizeof val);
            n += snprintf(line + n, sizeof line - (size_t)n, " %s=%s", st[i].name, val);
        }
        fprintf(stderr, "llmem: vulkan: %s\n", line);
        vk_log(v, "%s", line);
    }
}

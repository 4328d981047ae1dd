/* llmem Vulkan backend: the plugin entry, device listing and selection,
 * and the backend object (the loader and the instances: vk_instance.c).
 *
 * Device order, which is also the order of the device indices: discrete
 * GPUs, integrated GPUs, virtual GPUs, CPU implementations (lavapipe),
 * others; within a kind, the driver's order. Devices that lack what the
 * shaders need are listed last, with the reason.
 *
 */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"
#include "vk_presplit.h"
#include "vk_sum.h"

#define REQ_BINDINGS VK_MAX_BINDINGS

/* The host's one error formatter (<llmem/plugin.h>). */
#define fmt llmem_errf

/* ---- devices ----------------------------------------------------------------------------- */

typedef struct dev_entry {
    VkPhysicalDevice pd;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceSubgroupProperties sg;
    VkPhysicalDeviceMaintenance3Properties m3;
    int rank;
    uint32_t queue_family;
    char why[160]; /* empty when usable */
} dev_entry;

static int type_rank(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static const char *type_name(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

/* Memory type with all of `want`, preferring `prefer` and avoiding
 * `avoid`; UINT32_MAX when none. */
static uint32_t pick_memory(const VkPhysicalDeviceMemoryProperties *mp, VkMemoryPropertyFlags want,
                            VkMemoryPropertyFlags prefer, VkMemoryPropertyFlags avoid)
{
    uint32_t best = UINT32_MAX;
    int best_score = -1;
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp->memoryTypes[i].propertyFlags;
        if ((f & want) != want)
            continue;
        int score = ((f & prefer) == prefer ? 2 : 0) + ((f & avoid) ? 0 : 1);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

static void check_device(dev_entry *e)
{
    const VkPhysicalDeviceLimits *l = &e->props.limits;
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(e->pd, &mp);
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(e->pd, &nq, NULL);
    VkQueueFamilyProperties q[32];
    if (nq > 32)
        nq = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(e->pd, &nq, q);
    e->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && e->queue_family == UINT32_MAX; i++)
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            e->queue_family = i;
    e->why[0] = '\0';
    if (e->props.apiVersion < VK_API_VERSION_1_1)
        fmt(e->why, sizeof e->why, "Vulkan 1.0 device (1.1 needed)");
    else if (e->queue_family == UINT32_MAX)
        fmt(e->why, sizeof e->why, "no compute queue");
    else if (l->maxPerStageDescriptorStorageBuffers < REQ_BINDINGS ||
             l->maxDescriptorSetStorageBuffers < REQ_BINDINGS)
        fmt(e->why, sizeof e->why, "fewer than %d storage buffers per stage", REQ_BINDINGS);
    else if (l->maxPushConstantsSize < VK_MAX_PUSH || l->maxComputeWorkGroupInvocations < 256 ||
             l->maxComputeWorkGroupSize[0] < 256 || l->maxComputeSharedMemorySize < 16384)
        fmt(e->why, sizeof e->why, "compute limits too small");
    else if (l->minStorageBufferOffsetAlignment > VK_ALIGN)
        fmt(e->why, sizeof e->why, "minStorageBufferOffsetAlignment %llu > %d",
            (unsigned long long)l->minStorageBufferOffsetAlignment, VK_ALIGN);
    else if (pick_memory(&mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                         0, 0) == UINT32_MAX)
        fmt(e->why, sizeof e->why, "no host-coherent memory for staging");
}

/* Enumerates the devices of an instance in llmem's order. */
static uint32_t list_sorted(VkInstance inst, dev_entry *out, uint32_t cap)
{
    uint32_t n = 0;
    if (vkEnumeratePhysicalDevices(inst, &n, NULL) != VK_SUCCESS || n == 0)
        return 0;
    VkPhysicalDevice pd[VK_MAX_DEVICES];
    if (n > VK_MAX_DEVICES)
        n = VK_MAX_DEVICES;
    VkResult r = vkEnumeratePhysicalDevices(inst, &n, pd);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return 0;
    if (n > cap)
        n = cap;
    for (uint32_t i = 0; i < n; i++) {
        dev_entry *e = &out[i];
        memset(e, 0, sizeof *e);
        e->pd = pd[i];
        e->m3.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES;
        e->sg.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
        e->sg.pNext = &e->m3;
        VkPhysicalDeviceProperties2 p2 = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
            .pNext = &e->sg,
        };
        vkGetPhysicalDeviceProperties(pd[i], &e->props);
        if (e->props.apiVersion >= VK_API_VERSION_1_1) {
            vkGetPhysicalDeviceProperties2(pd[i], &p2);
            e->props = p2.properties;
        }
        e->sg.pNext = NULL;
        e->m3.pNext = NULL;
        check_device(e);
        e->rank = type_rank(e->props.deviceType) + (e->why[0] ? 8 : 0);
    }
    /* stable insertion sort by rank */
    for (uint32_t i = 1; i < n; i++) {
        dev_entry t = out[i];
        uint32_t j = i;
        while (j > 0 && out[j - 1].rank > t.rank) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = t;
    }
    return n;
}

static bool subgroup_usable(const dev_entry *e)
{
    const char *off = getenv("LLMEM_VULKAN_NO_SUBGROUP");
    if (off && *off && strcmp(off, "0") != 0)
        return false;
    VkSubgroupFeatureFlags need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    return (e->sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
           (e->sg.supportedOperations & need) == need && e->sg.subgroupSize >= 1 &&
           e->sg.subgroupSize <= 128;
}

static void describe(const dev_entry *e, int32_t index, char *line, size_t len)
{
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(e->pd, &mp);
    VkDeviceSize heap = 0;
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if ((mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[i].size > heap)
            heap = mp.memoryHeaps[i].size;
    uint32_t api = e->props.apiVersion;
    if (e->why[0]) {
        fmt(line, len, "device %d: %s (%s, Vulkan %u.%u.%u) unusable: %s", (int)index,
            e->props.deviceName, type_name(e->props.deviceType), VK_API_VERSION_MAJOR(api),
            VK_API_VERSION_MINOR(api), VK_API_VERSION_PATCH(api), e->why);
        return;
    }
    fmt(line, len, "device %d: %s (%s, Vulkan %u.%u.%u, %.1f GiB, subgroup %u%s)%s", (int)index,
        e->props.deviceName, type_name(e->props.deviceType), VK_API_VERSION_MAJOR(api),
        VK_API_VERSION_MINOR(api), VK_API_VERSION_PATCH(api), (double)heap / (1u << 30),
        e->sg.subgroupSize, subgroup_usable(e) ? "" : ", no subgroup arithmetic",
        index == 0 ? " [default]" : "");
}

static void list_devices(void (*fn)(const char *line, void *ctx), void *ctx)
{
    char why[256], line[512];
    VkInstance inst;
    bool owned;
    if (vk_instance_open(NULL, &inst, &owned, why, sizeof why) != LLMEM_OK) {
        fmt(line, sizeof line, "unavailable: %s", why);
        fn(line, ctx);
        return;
    }
    dev_entry e[VK_MAX_DEVICES];
    uint32_t n = list_sorted(inst, e, VK_MAX_DEVICES);
    if (n == 0)
        fn("unavailable: no Vulkan device (the loader found no driver; see VK_DRIVER_FILES)", ctx);
    for (uint32_t i = 0; i < n; i++) {
        describe(&e[i], (int32_t)i, line, sizeof line);
        fn(line, ctx);
    }
    if (owned)
        vkDestroyInstance(inst, NULL);
}

/* ---- the backend object ---------------------------------------------------------------------- */

static void vk_destroy(llmem_backend *be)
{
    vk_backend *v = vk_from(be);
    if (!v)
        return;
    if (v->dev) {
        if (v->cm_ctr)
            vk_buffer_free(be, v->cm_ctr);
        if (v->argmax_part)
            vk_buffer_free(be, v->argmax_part);
        vk_sum_finish(v);
        vk_rope_finish(v);
        vk_nm_conv_finish(v);
        vk_conv_fold_finish(be, v);
        vk_presplit_finish(be, v);
        vk_cmd_finish(v);
        v->vk.vkDestroyDevice(v->dev, NULL);
    }
    if (v->messenger)
        vkDestroyDebugUtilsMessengerEXT(v->instance, v->messenger, NULL);
    if (v->instance && v->instance_owned) /* else kept for later opens (vk_instance.c) */
        vkDestroyInstance(v->instance, NULL);
    if (v->log)
        fclose(v->log);
    free(v);
}

static void vk_get_info(llmem_backend *be, llmem_backend_info *info)
{
    vk_backend *v = vk_from(be);
    info->backend = "vulkan";
    info->device_name = v->device_name;
    info->device = v->device_index;
    info->host_visible = false;
    uint32_t heap = v->mem_props.memoryTypes[v->mem_type_device].heapIndex;
    info->memory_total = v->mem_props.memoryHeaps[heap].size;
    info->memory_free = info->memory_total > v->bytes_device ? info->memory_total - v->bytes_device : 0;
    if (v->has_budget) {
        VkPhysicalDeviceMemoryBudgetPropertiesEXT b = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT,
        };
        VkPhysicalDeviceMemoryProperties2 mp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
            .pNext = &b,
        };
        vkGetPhysicalDeviceMemoryProperties2(v->phys, &mp);
        if (b.heapBudget[heap] > 0)
            info->memory_free = b.heapBudget[heap] > b.heapUsage[heap]
                                    ? b.heapBudget[heap] - b.heapUsage[heap]
                                    : 0;
    }
}

bool vk_has_device_ext(VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkExtensionProperties *e = calloc(n, sizeof *e);
    if (!e)
        return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

/* Whether matmul_cm.comp may run (tensor cores): VK_NV_cooperative_matrix
 * with its feature, shaderFloat16 and the Vulkan memory model (glslang
 * emits that model for NV cooperative matrices), and a 16 x 16 x 16 shape
 * of f16 A/B and f32 C/D at subgroup scope among
 * vkGetPhysicalDeviceCooperativeMatrixPropertiesNV's (vk_cm_usable decides,
 * with the subgroup size and shared memory). $LLMEM_VULKAN_COOPMAT=0 turns
 * it off, and the extension is then not enabled. The KHR extension would
 * do as well, but Debian 12's glslang 12 cannot compile its GLSL. */
static bool coopmat_usable(const dev_entry *e)
{
    const char *off = getenv("LLMEM_VULKAN_COOPMAT");
    if ((off && strcmp(off, "0") == 0) || e->props.apiVersion < VK_API_VERSION_1_2 ||
        !vkGetPhysicalDeviceCooperativeMatrixPropertiesNV ||
        !vk_has_device_ext(e->pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME))
        return false;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
    };
    VkPhysicalDeviceVulkanMemoryModelFeatures mf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        .pNext = &cf,
    };
    VkPhysicalDeviceShaderFloat16Int8Features hf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .pNext = &mf,
    };
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &hf};
    vkGetPhysicalDeviceFeatures2(e->pd, &f2);
    if (!cf.cooperativeMatrix || !hf.shaderFloat16 || !mf.vulkanMemoryModel)
        return false;
    uint32_t n = 0;
    if (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(e->pd, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
    vk_cm_shape *sh = calloc(n, sizeof *sh);
    bool ok = false;
    if (p && sh) {
        for (uint32_t i = 0; i < n; i++)
            p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
        if (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(e->pd, &n, p) == VK_SUCCESS) {
            for (uint32_t i = 0; i < n; i++)
                sh[i] = (vk_cm_shape){
                    .m = p[i].MSize,
                    .n = p[i].NSize,
                    .k = p[i].KSize,
                    .ab_f16 = p[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                              p[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV,
                    .cd_f32 = p[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                              p[i].DType == VK_COMPONENT_TYPE_FLOAT32_NV,
                    .subgroup_scope = p[i].scope == VK_SCOPE_SUBGROUP_NV,
                };
            ok = vk_cm_usable(sh, n, e->sg.subgroupSize,
                              e->props.limits.maxComputeSharedMemorySize);
        }
    }
    free(p);
    free(sh);
    return ok;
}

void vk_sm_query(vk_backend *v)
{
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV nv = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amd = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    VkPhysicalDeviceShaderCoreProperties2AMD amd2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_2_AMD};
    VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM arm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_BUILTINS_PROPERTIES_ARM};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    const struct {
        const char *ext;
        void *props, **next;
    } chain[] = {{VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME, &nv, &nv.pNext},
                 {VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME, &amd, &amd.pNext},
                 {VK_AMD_SHADER_CORE_PROPERTIES_2_EXTENSION_NAME, &amd2, &amd2.pNext},
                 {VK_ARM_SHADER_CORE_BUILTINS_EXTENSION_NAME, &arm, &arm.pNext}};
    v->sm_device = 0;
    v->sm_source = "none";
    if (vk_instance_api() < VK_API_VERSION_1_1 || v->props.apiVersion < VK_API_VERSION_1_1)
        return;
    /* a structure goes on the chain only where its extension is listed (valid usage) */
    void **tail = &p2.pNext;
    for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++)
        if (vk_has_device_ext(v->phys, chain[i].ext)) {
            *tail = chain[i].props;
            tail = chain[i].next;
        }
    if (!p2.pNext)
        return;
    vkGetPhysicalDeviceProperties2(v->phys, &p2);
    vk_sm_info q = {.nv_sms = nv.shaderSMCount,
                    .amd_engines = amd.shaderEngineCount,
                    .amd_arrays = amd.shaderArraysPerEngineCount,
                    .amd_cus = amd.computeUnitsPerShaderArray,
                    .amd_active = amd2.activeComputeUnitCount,
                    .arm_cores = arm.shaderCoreCount};
    v->sm_device = vk_sm_count(&q, &v->sm_source);
}

static llmem_status device_create(vk_backend *v, const dev_entry *e, char *err, size_t len)
{
    v->phys = e->pd;
    v->props = e->props;
    v->queue_family = e->queue_family;
    vkGetPhysicalDeviceMemoryProperties(v->phys, &v->mem_props);
    v->has_budget = vk_has_device_ext(v->phys, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    v->coopmat = coopmat_usable(e);
    /* VK_NV_cooperative_matrix2 (vk_cm2.c) needs the KHR extension under it */
    bool khr_want = vk_khr_modules_wanted();
    bool cm2 = v->coopmat && vk_instance_api() >= VK_API_VERSION_1_3 &&
               e->props.apiVersion >= VK_API_VERSION_1_3 &&
               vk_cm2_query(v->instance, e->pd, &v->cm2);
    bool khr = v->coopmat && (khr_want || cm2) &&
               vk_khr_cm_usable(v->instance, e->pd, e->sg.subgroupSize,
                                e->props.limits.maxComputeSharedMemorySize);
    v->coopmat_khr = khr && khr_want;
    v->coopmat2 = khr && cm2;
    /* bf16 matrices for the fast-mode decode modules (vk_khr_bf16_usable) */
    v->coopmat_bf16 = v->coopmat_khr && vk_khr_bf16_usable(v->instance, e->pd);
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pf;
    const char *pstats_why;
    v->pstats = vk_pstats_query(v->phys, &pf, &pstats_why);
    const char *exts[6];
    uint32_t n_exts = 0;
    if (v->pstats)
        exts[n_exts++] = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
    if (v->has_budget)
        exts[n_exts++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    if (v->coopmat)
        exts[n_exts++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    if (khr)
        exts[n_exts++] = VK_KHR_CM_NAME;
    if (v->coopmat2)
        exts[n_exts++] = VK_CM2_NAME;
    if (v->coopmat_bf16)
        exts[n_exts++] = VK_KHR_BF16_NAME;
    /* features of matmul_cm.comp (and the KHR and coopmat2 modules), chained
     * only when they may run */
    VkPhysicalDeviceBufferDeviceAddressFeatures bda;
    if (!v->coopmat2)
        v->cm2.usable = false;
    vk_khr_bf16_features bf = {.sType = VK_KHR_BF16_STYPE_FEATURES,
                               .pNext = vk_cm2_chain(&v->cm2, &bda, NULL),
                               .shaderBFloat16Type = VK_TRUE,
                               .shaderBFloat16CooperativeMatrix = VK_TRUE};
    vk_khr_cm_features kf = {.sType = VK_KHR_CM_STYPE_FEATURES,
                          .pNext = v->coopmat_bf16 ? (void *)&bf : bf.pNext,
                          .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
        .pNext = khr ? &kf : NULL,
        .cooperativeMatrix = VK_TRUE,
    };
    VkPhysicalDeviceVulkanMemoryModelFeatures mf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        .pNext = &cf,
        .vulkanMemoryModel = VK_TRUE,
    };
    VkPhysicalDeviceShaderFloat16Int8Features hf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .pNext = &mf,
        .shaderFloat16 = VK_TRUE,
    };
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = v->queue_family,
        .queueCount = 1,
        .pQueuePriorities = &prio,
    };
    VkDeviceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = v->coopmat ? &hf : NULL,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &qi,
        .enabledExtensionCount = n_exts,
        .ppEnabledExtensionNames = exts,
    };
    if (v->pstats) {
        pf.pNext = (void *)ci.pNext;
        ci.pNext = &pf;
    }
    VkResult r = vkCreateDevice(v->phys, &ci, NULL, &v->dev);
    if (r != VK_SUCCESS) {
        v->dev = VK_NULL_HANDLE;
        fmt(err, len, "vulkan: vkCreateDevice failed on %s (%d)", e->props.deviceName, (int)r);
        return vk_status(r);
    }
    volkLoadDeviceTable(&v->vk, v->dev);
    v->vk.vkGetDeviceQueue(v->dev, v->queue_family, 0, &v->queue);
    vk_pstats_report_open(v, pstats_why);

    const VkPhysicalDeviceLimits *l = &v->props.limits;
    v->mem_type_device = pick_memory(&v->mem_props, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0,
                                     VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (v->mem_type_device == UINT32_MAX)
        v->mem_type_device = pick_memory(&v->mem_props, 0, 0, 0);
    v->mem_type_host = pick_memory(&v->mem_props,
                                   VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                       VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                   VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
                                   VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    v->storage_align = l->minStorageBufferOffsetAlignment < 4 ? 4 : l->minStorageBufferOffsetAlignment;
    v->max_range = l->maxStorageBufferRange;
    v->max_alloc = e->m3.maxMemoryAllocationSize ? e->m3.maxMemoryAllocationSize : ((VkDeviceSize)1 << 30);
    vk_alloc_limits(v);
    v->max_groups = l->maxComputeWorkGroupCount[0] < l->maxComputeWorkGroupCount[1]
                        ? l->maxComputeWorkGroupCount[0]
                        : l->maxComputeWorkGroupCount[1];
    v->subgroup = subgroup_usable(e);
    v->sg_shuffle = (e->sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                    (e->sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
    v->subgroup_size = e->sg.subgroupSize;
    llmem_status st = vk_cmd_init(v);
    if (st != LLMEM_OK)
        fmt(err, len, "vulkan: cannot set up %s (%s)", e->props.deviceName, llmem_status_str(st));
    else {
        vk_prof_init(v);
        vk_steptime_init(v);
        vk_sm_query(v);
        vk_knobs_read(&v->knobs);
        vk_matmul_config(v);
        vk_scan_config(v);
        vk_conv_fold_config(v);
    }
    return st;
}

static llmem_status vk_open(int32_t device, llmem_backend **out, char *err, size_t err_len)
{
    char why[512] = "";
    llmem_status st;
    vk_backend *v = calloc(1, sizeof *v);
    if (!v) {
        fmt(err, err_len, "vulkan: out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    v->base.iface = &vk_iface;
    v->error = LLMEM_OK;
    const char *val = getenv("LLMEM_VULKAN_VALIDATION");
    v->validation_fatal = !(val && strcmp(val, "warn") == 0);
    const char *log = getenv("LLMEM_VULKAN_LOG");
    if (log && *log)
        v->log = fopen(log, "a");
    if ((st = vk_instance_open(v, &v->instance, &v->instance_owned, why, sizeof why)) != LLMEM_OK) {
        fmt(err, err_len, "vulkan: %s", why);
        goto fail;
    }
    dev_entry e[VK_MAX_DEVICES];
    uint32_t n = list_sorted(v->instance, e, VK_MAX_DEVICES);
    if (n == 0) {
        fmt(err, err_len, "vulkan: no Vulkan device (the loader found no driver; see VK_DRIVER_FILES)");
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    uint32_t pick = device < 0 ? 0 : (uint32_t)device;
    if (pick >= n) {
        fmt(err, err_len, "vulkan: no device %d (%u device%s)", (int)device, n, n == 1 ? "" : "s");
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    if (e[pick].why[0]) {
        fmt(err, err_len, "vulkan: device %u (%s) is unusable: %s", pick, e[pick].props.deviceName,
            e[pick].why);
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    v->device_index = (int32_t)pick;
    snprintf(v->device_name, sizeof v->device_name, "%s", e[pick].props.deviceName);
    if ((st = device_create(v, &e[pick], err, err_len)) != LLMEM_OK)
        goto fail;
    vk_log(v, "opened device %u: %s (subgroup arithmetic %s, size %u; cooperative matrices %s%s)",
           pick, v->device_name, v->subgroup ? "on" : "off", v->subgroup_size,
           v->coopmat_bf16  ? "on, KHR and bf16 too"
           : v->coopmat_khr ? "on, KHR too"
           : v->coopmat     ? "on"
                            : "off",
           v->coopmat2 ? "; coopmat2 on" : "");
    if (v->coopmat2)
        vk_log(v, "coopmat2: workgroup scope up to %u invocations, flexible dimensions up to %u, "
                  "%u bytes of shared memory reserved, f16 -> f32 granularity %u x %u x %u at %u",
               v->cm2.wg_max, v->cm2.flex_max, v->cm2.smem_reserved, v->cm2.gran_m,
               v->cm2.gran_n, v->cm2.gran_k, VK_CM2_WG);
    *out = &v->base;
    return LLMEM_OK;
fail:
    vk_destroy(&v->base);
    return st;
}

/* Operand dtypes the Vulkan kernels refuse (llmem_backend_supports): none
 * at present (int8 Mamba-2 states: vk_ops_quant.c; a head whose f32 state
 * exceeds the device's shared memory still gets LLMEM_E_UNSUPPORTED from
 * the op itself). */
static bool vk_supports_op(llmem_backend *be, int32_t op, const llmem_dtype *dtypes,
                           int32_t n_dtypes)
{
    (void)be;
    (void)op;
    (void)dtypes;
    (void)n_dtypes;
    return true;
}

/* The open ops this backend implements: each vk_ops_*.c file adds its own
 * (LLMEM_OP_IMPL, <llmem/backend_impl.h>). */
LLMEM_OP_IMPL_LIST(vk_op_impls);

const llmem_backend_i vk_iface = {
    .struct_size = sizeof(llmem_backend_i),
    .destroy = vk_destroy,
    .get_info = vk_get_info,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_free = vk_buffer_free,
    .buffer_upload = vk_buffer_upload,
    .buffer_download = vk_buffer_download,
    .buffer_copy = vk_buffer_copy,
    .buffer_fill = vk_buffer_fill,
    .synchronize = vk_synchronize,
    .ops = &vk_ops,
    .record_begin = vk_record_begin,
    .record_end = vk_record_end,
    .graph_replay = vk_graph_replay,
    .graph_free = vk_graph_free,
    .supports_op = vk_supports_op,
    .op_impls = &vk_op_impls,
    .buffer_copy_ranges = vk_buffer_copy_ranges,
    .reload_env = vk_reload_env,
};

static const llmem_plugin vk_plugin = {
    .abi_version = LLMEM_BACKEND_ABI_VERSION,
    .layout = LLMEM_BACKEND_ABI_LAYOUT,
    .name = "vulkan",
    .open = vk_open,
    .list_devices = list_devices,
};

/* The entry point; every llmem call of this plugin goes through the host
 * table it receives (<llmem/plugin.h>). */
LLMEM_PLUGIN_DEFINE(vk_plugin)

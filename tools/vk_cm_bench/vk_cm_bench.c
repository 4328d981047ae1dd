/* vk_cm_bench: a standalone Vulkan harness for tensor-core (cooperative
 * matrix) shader experiments, outside the llmem plugin, so that a variant
 * costs a glslang run here and a few seconds on the GPU machine
 * (tools/vk_cm_bench/README.md; docs/benchmarks.md, "Vulkan cooperative
 * matrices, second look"). Not built by CMake or CI.
 *
 *   vk_cm_bench DIR [LIST]  runs the entries of DIR/LIST (default
 *                        list.txt), one per line:
 *     NAME mma  GROUPS ITERS FLOPS   throughput of DIR/NAME.spv (mma.comp /
 *                                    mma_sh.comp): workgroups of 128, FLOPS
 *                                    per subgroup and round
 *     NAME simt GROUPS ITERS FLOPS   the same with FLOPS per invocation
 *     NAME fa   GROUPS ITERS FLOPS   the same with workgroups of 256 (fa_probe.comp),
 *                                    also ns a round (block) an SM: GROUPS
 *                                    a multiple of the H200's 132 SMs
 *     NAME gemm M N K WG SGM FM FN SPLIT BK [STAGES [SLICES [RAW]]]
 *                                    a shader with matmul_cm.comp's bindings,
 *                                    push and specialization constants (ids
 *                                    0-8: WG, W_DT = 2, SGM, FM, FN, SPLIT,
 *                                    BK, STAGES: 1 when not given, RAW: 0
 *                                    when not given; RAW 1: the output is the
 *                                    padded partial buffer of
 *                                    vk_cm_raw_layout; RAW 2: that, summed
 *                                    into binding 4 by the last slice of
 *                                    each tile), split-K as
 *                                    vk_mm_split_k, or into SLICES slices
 *                                    when given and not 0; K a multiple
 *                                    of 8 with N K <= 14336 x 4096 and
 *                                    M K <= 2048 x 4096; $VKCM_ROTATE=1: the
 *                                    weights read from copies in turn
 *                                    (rot_copies)
 *
 * With VK_KHR_pipeline_executable_properties, each pipeline's statistics
 * (NVIDIA: register count and more) are printed before its figures; with
 * VKCM_DUMP=DIR, its internal representations and pipeline cache data are
 * written to DIR/NAME.SPEC....
 *
 * mma/simt: best of 3 single dispatches. gemm: bf16 weights and f16
 * activations (hi and lo terms, exponents 0) of small multiples of 1/64
 * and 1/4096, so every product is exact; best of 3 batches of 20 dispatches;
 * each entry first runs 100 ms of its dispatches (warm_up: the clocks);
 * 64 outputs (slices summed) compared with a float64 sum ("err"). Timing
 * by timestamp queries. Put each API's entries (NV, KHR) in its own run:
 * on the H200 timings drifted within one process after its first KHR
 * pipeline. Exit status 1 on a setup failure; a variant whose pipeline
 * fails is reported and skipped. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

#include "vk_mm_pick.h"

#define CK(x)                                                                                  \
    do {                                                                                       \
        VkResult r_ = (x);                                                                     \
        if (r_ != VK_SUCCESS) {                                                                \
            fprintf(stderr, "vk_cm_bench: %s failed (%d)\n", #x, (int)r_);                     \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* VK_KHR_cooperative_matrix is newer than Debian 12's Vulkan headers. */
#define STYPE_CM_FEATURES_KHR 1000506000
#define STYPE_CM_PROPERTIES_KHR 1000506001
typedef struct khr_cm_props {
    VkStructureType sType;
    void *pNext;
    uint32_t m, n, k;
    int a, b, c, r; /* VkComponentTypeKHR: 0 f16, 1 f32, 1000141000 bf16, ... */
    VkBool32 saturating;
    int scope; /* 3 subgroup */
} khr_cm_props;
typedef struct khr_cm_feat {
    VkStructureType sType;
    void *pNext;
    VkBool32 cm, robust;
} khr_cm_feat;
typedef VkResult (*khr_props_fn)(VkPhysicalDevice, uint32_t *, khr_cm_props *);
/* VK_NV_cooperative_matrix2 (registry: extension 594), newer than those headers too */
#define STYPE_CM2_FEATURES 1000593000
#define STYPE_CM2_FLEX_PROPERTIES 1000593001
#define STYPE_CM2_PROPERTIES 1000593002
typedef struct cm2_feat {
    VkStructureType sType;
    void *pNext;
    VkBool32 wg_scope, flex_dims, reductions, conversions, per_element, tensor_addr, block_loads;
} cm2_feat;
typedef struct cm2_props {
    VkStructureType sType;
    void *pNext;
    uint32_t wg_max, flex_max, smem_reserved;
} cm2_props;
typedef struct cm2_flex {
    VkStructureType sType;
    void *pNext;
    uint32_t mg, ng, kg;
    int a, b, c, r; /* VkComponentTypeKHR */
    VkBool32 saturating;
    int scope;      /* 2 workgroup, 3 subgroup */
    uint32_t invocations;
} cm2_flex;
typedef VkResult (*cm2_flex_fn)(VkPhysicalDevice, uint32_t *, cm2_flex *);
/* VK_KHR_shader_bfloat16 (registry: extension 142), newer than those headers too */
#define STYPE_BF16_FEATURES 1000141000
typedef struct bf16_feat {
    VkStructureType sType;
    void *pNext;
    VkBool32 type, dot, cm;
} bf16_feat;

/* bindings 0-5 (matmul_cm.comp's: weights, activations, out or partial, exponents, final out
 * and arrival counters of RAW 2), then the host-visible staging buffer */
enum { B_W, B_A, B_O, B_E, B_F, B_C, B_STAGE, N_BUF };
#define N_BIND 6
static const VkDeviceSize buf_size[N_BUF] = {128u << 20, 64u << 20, 512u << 20, 1u << 20,
                                             128u << 20, 1u << 20, 512u << 20};

static struct {
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue q;
    VkCommandPool pool;
    VkQueryPool qp;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout pl;
    VkDescriptorSet ds;
    VkBuffer buf[N_BUF];
    char *stage;
    float tick_ns;
    int nv, khr, pexec, cm2, bf16;
} g;

#define WN 14336u /* weight rows */
#define KK 4096u  /* K */
#define AM 2048u  /* activation rows */
static uint16_t *w_host, *a_host;

static uint32_t mem_type(uint32_t bits, VkMemoryPropertyFlags want)
{
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(g.pd, &mp);
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++)
        if ((bits >> i & 1) && (mp.memoryTypes[i].propertyFlags & want) == want)
            return i;
    return 0;
}

static VkCommandBuffer cmd_begin(void)
{
    VkCommandBufferAllocateInfo ai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, g.pool,
                                      VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    VkCommandBuffer cb;
    vkAllocateCommandBuffers(g.dev, &ai, &cb);
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    vkBeginCommandBuffer(cb, &bi);
    return cb;
}

static void cmd_submit(VkCommandBuffer cb)
{
    vkEndCommandBuffer(cb);
    VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &cb, 0, NULL};
    vkQueueSubmit(g.q, 1, &si, VK_NULL_HANDLE);
    vkQueueWaitIdle(g.q);
    vkFreeCommandBuffers(g.dev, g.pool, 1, &cb);
}

static void copy(int from, int to, VkDeviceSize n)
{
    VkCommandBuffer cb = cmd_begin();
    VkBufferCopy c = {0, 0, n};
    vkCmdCopyBuffer(cb, g.buf[from], g.buf[to], 1, &c);
    cmd_submit(cb);
}

/* One timed command buffer of `reps` dispatches of `groups` workgroups (a
 * barrier between them); seconds per dispatch. */
/* gemm entries under $VKCM_ROTATE=1: dispatch d of a batch of reps reads the weight copy
 * (reps - 1 - d) % rot_copies, rot_stride uvec4s apart (push constant 5, w_off), so that
 * products of less than the L2's 50 MB stream their weights from memory as in the plugin's
 * step (each layer its own weights); the last dispatch reads copy 0, which the check uses. */
static uint32_t rot_copies = 1, rot_stride;

static double timed(VkPipeline pipe, const void *pc, uint32_t pc_size, uint32_t groups, int reps)
{
    VkCommandBuffer cb = cmd_begin();
    vkCmdResetQueryPool(cb, g.qp, 0, 2);
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, g.pl, 0, 1, &g.ds, 0, NULL);
    vkCmdPushConstants(cb, g.pl, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc_size, pc);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, g.qp, 0);
    uint32_t rpc[16];
    bool rot = rot_copies > 1 && pc_size == sizeof rpc;
    if (rot)
        memcpy(rpc, pc, sizeof rpc);
    for (int d = 0; d < reps; d++) {
        if (rot) {
            rpc[5] = (uint32_t)(reps - 1 - d) % rot_copies * rot_stride;
            vkCmdPushConstants(cb, g.pl, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof rpc, rpc);
        }
        vkCmdDispatch(cb, groups, 1, 1);
        VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_SHADER_WRITE_BIT,
                              VK_ACCESS_SHADER_WRITE_BIT};
        vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    }
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, g.qp, 1);
    cmd_submit(cb);
    uint64_t t[2];
    vkGetQueryPoolResults(g.dev, g.qp, 0, 2, sizeof t, t, 8,
                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    return (double)(t[1] - t[0]) * g.tick_ns * 1e-9 / reps;
}

/* Writes n bytes to $VKCM_DUMP/<base of path>[.s0-s1-...]<suffix> when VKCM_DUMP is set. */
static void dump(const char *path, const uint32_t *spec, uint32_t n_spec, const char *suffix,
                 const void *data, size_t n)
{
    const char *dir = getenv("VKCM_DUMP");
    if (!dir || !data || !n)
        return;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[1024];
    int len = snprintf(name, sizeof name, "%s/%.*s", dir, (int)strcspn(base, "."), base);
    for (uint32_t i = 0; i < n_spec && len > 0 && (size_t)len < sizeof name; i++)
        len += snprintf(name + len, sizeof name - (size_t)len, "%c%u", i ? '-' : '.', spec[i]);
    if (len > 0 && (size_t)len < sizeof name)
        snprintf(name + len, sizeof name - (size_t)len, "%s", suffix);
    FILE *f = fopen(name, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

/* One line of the driver's statistics of each executable of pipe
 * (VK_KHR_pipeline_executable_properties: on NVIDIA the register count,
 * among others), its internal representations and the pipeline cache's
 * data to $VKCM_DUMP (see dump). */
static void describe(VkPipeline pipe, VkPipelineCache cache, const char *path, const uint32_t *spec,
                     uint32_t n_spec)
{
    if (g.pexec) {
        PFN_vkGetPipelineExecutablePropertiesKHR gp = (PFN_vkGetPipelineExecutablePropertiesKHR)
            vkGetDeviceProcAddr(g.dev, "vkGetPipelineExecutablePropertiesKHR");
        PFN_vkGetPipelineExecutableStatisticsKHR gs = (PFN_vkGetPipelineExecutableStatisticsKHR)
            vkGetDeviceProcAddr(g.dev, "vkGetPipelineExecutableStatisticsKHR");
        PFN_vkGetPipelineExecutableInternalRepresentationsKHR gi =
            (PFN_vkGetPipelineExecutableInternalRepresentationsKHR)vkGetDeviceProcAddr(
                g.dev, "vkGetPipelineExecutableInternalRepresentationsKHR");
        VkPipelineInfoKHR pi = {VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, NULL, pipe};
        VkPipelineExecutablePropertiesKHR ep[4];
        uint32_t ne = 4;
        for (uint32_t i = 0; i < ne; i++)
            ep[i] = (VkPipelineExecutablePropertiesKHR){.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR};
        if (!gp || !gs || gp(g.dev, &pi, &ne, ep) < 0)
            ne = 0;
        for (uint32_t e = 0; e < ne; e++) {
            VkPipelineExecutableInfoKHR ei = {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, NULL, pipe, e};
            VkPipelineExecutableStatisticKHR st[32];
            uint32_t ns = 32;
            for (uint32_t i = 0; i < ns; i++)
                st[i] = (VkPipelineExecutableStatisticKHR){.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR};
            if (gs(g.dev, &ei, &ns, st) < 0)
                ns = 0;
            printf("  [stats %s sg %u]", ep[e].name, ep[e].subgroupSize);
            for (uint32_t i = 0; i < ns; i++) {
                printf(" %s=", st[i].name);
                switch (st[i].format) {
                case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: printf("%u", st[i].value.b32); break;
                case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: printf("%lld", (long long)st[i].value.i64); break;
                case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: printf("%llu", (unsigned long long)st[i].value.u64); break;
                default: printf("%g", st[i].value.f64); break;
                }
            }
            printf("\n");
            VkPipelineExecutableInternalRepresentationKHR ir[8];
            uint32_t ni = 8;
            for (uint32_t i = 0; i < ni; i++)
                ir[i] = (VkPipelineExecutableInternalRepresentationKHR){
                    .sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR};
            if (!gi || gi(g.dev, &ei, &ni, ir) < 0)
                ni = 0;
            for (uint32_t i = 0; i < ni; i++) {
                ir[i].pData = ir[i].dataSize ? malloc(ir[i].dataSize) : NULL;
            }
            if (ni && gi(g.dev, &ei, &ni, ir) >= 0)
                for (uint32_t i = 0; i < ni; i++) {
                    char suf[320];
                    snprintf(suf, sizeof suf, ".ir%u.%u.%s", e, i, ir[i].isText ? "txt" : "bin");
                    printf("  [ir %s: %s, %zu bytes]\n", ir[i].name, ir[i].description, ir[i].dataSize);
                    dump(path, spec, n_spec, suf, ir[i].pData, ir[i].dataSize);
                }
            for (uint32_t i = 0; i < ni; i++)
                free(ir[i].pData);
        }
    }
    size_t n = 0;
    if (cache && vkGetPipelineCacheData(g.dev, cache, &n, NULL) == VK_SUCCESS && n) {
        void *d = malloc(n);
        if (d && vkGetPipelineCacheData(g.dev, cache, &n, d) == VK_SUCCESS)
            dump(path, spec, n_spec, ".cache", d, n);
        free(d);
    }
}

/* Dispatches until at least 100 ms of GPU time have passed (at most 2,000
 * command buffers), so that the clocks are up before a measurement: on
 * the H200 the SM clock fell from 1980 to 345-800 MHz within a second of
 * host-side work between two entries (a pipeline compile, a float64
 * check), and a batch of 20 short dispatches measured at those clocks ran
 * 2-5x slow (docs/benchmarks.md, "Vulkan GEMM: the accumulators in local
 * memory"). */
static void warm_up(VkPipeline pipe, const void *pc, uint32_t pc_size, uint32_t groups, int reps)
{
    double t = 0;
    for (int i = 0; i < 2000 && t < 0.1; i++)
        t += timed(pipe, pc, pc_size, groups, reps) * reps;
}

static VkPipeline pipeline(const char *path, const uint32_t *spec, uint32_t n_spec)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return VK_NULL_HANDLE;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint32_t *code = malloc((size_t)n);
    size_t got = code ? fread(code, 1, (size_t)n, f) : 0;
    fclose(f);
    VkPipeline pipe = VK_NULL_HANDLE;
    VkShaderModule sm = VK_NULL_HANDLE;
    VkShaderModuleCreateInfo mi = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, (size_t)n, code};
    if (got == (size_t)n && vkCreateShaderModule(g.dev, &mi, NULL, &sm) == VK_SUCCESS) {
        VkSpecializationMapEntry me[9];
        for (uint32_t i = 0; i < n_spec; i++)
            me[i] = (VkSpecializationMapEntry){i, 4 * i, 4};
        VkSpecializationInfo si = {n_spec, me, 4 * n_spec, spec};
        VkComputePipelineCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
        ci.stage = (VkPipelineShaderStageCreateInfo){VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                     NULL, 0, VK_SHADER_STAGE_COMPUTE_BIT, sm, "main",
                                                     n_spec ? &si : NULL};
        ci.layout = g.pl;
        if (g.pexec)
            ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR |
                        VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
        VkPipelineCacheCreateInfo pci = {VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, NULL, 0, 0, NULL};
        VkPipelineCache cache = VK_NULL_HANDLE;
        if (vkCreatePipelineCache(g.dev, &pci, NULL, &cache) != VK_SUCCESS)
            cache = VK_NULL_HANDLE;
        if (vkCreateComputePipelines(g.dev, cache, 1, &ci, NULL, &pipe) != VK_SUCCESS)
            pipe = VK_NULL_HANDLE;
        if (pipe)
            describe(pipe, cache, path, spec, n_spec);
        if (cache)
            vkDestroyPipelineCache(g.dev, cache, NULL);
        vkDestroyShaderModule(g.dev, sm, NULL);
    }
    free(code);
    return pipe;
}

static void list_shapes(VkInstance inst)
{
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV nvp =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)vkGetInstanceProcAddr(
            inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    khr_props_fn kp = (khr_props_fn)vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
    uint32_t n = 0;
    if (g.nv && nvp && nvp(g.pd, &n, NULL) == VK_SUCCESS && n) {
        VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
        for (uint32_t i = 0; p && i < n; i++)
            p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
        if (p && nvp(g.pd, &n, p) == VK_SUCCESS)
            for (uint32_t i = 0; i < n; i++)
                printf("NV  %ux%ux%u A%d B%d C%d D%d scope %d\n", p[i].MSize, p[i].NSize, p[i].KSize,
                       p[i].AType, p[i].BType, p[i].CType, p[i].DType, p[i].scope);
        free(p);
    }
    n = 0;
    if (g.khr && kp && kp(g.pd, &n, NULL) == VK_SUCCESS && n) {
        khr_cm_props *p = calloc(n, sizeof *p);
        for (uint32_t i = 0; p && i < n; i++)
            p[i].sType = STYPE_CM_PROPERTIES_KHR;
        if (p && kp(g.pd, &n, p) == VK_SUCCESS)
            for (uint32_t i = 0; i < n; i++)
                printf("KHR %ux%ux%u A%d B%d C%d R%d scope %d\n", p[i].m, p[i].n, p[i].k, p[i].a,
                       p[i].b, p[i].c, p[i].r, p[i].scope);
        free(p);
    }
    cm2_flex_fn fp = (cm2_flex_fn)vkGetInstanceProcAddr(
        inst, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
    n = 0;
    if (g.cm2 && fp && fp(g.pd, &n, NULL) == VK_SUCCESS && n) {
        cm2_flex *p = calloc(n, sizeof *p);
        for (uint32_t i = 0; p && i < n; i++)
            p[i].sType = STYPE_CM2_FLEX_PROPERTIES;
        if (p && fp(g.pd, &n, p) == VK_SUCCESS)
            for (uint32_t i = 0; i < n; i++)
                printf("CM2 flexible %ux%ux%u A%d B%d C%d R%d sat %u scope %d invocations %u\n",
                       p[i].mg, p[i].ng, p[i].kg, p[i].a, p[i].b, p[i].c, p[i].r, p[i].saturating,
                       p[i].scope, p[i].invocations);
        free(p);
    }
}

static int setup(void)
{
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "vk_cm_bench", 0, NULL, 0,
                             VK_API_VERSION_1_3};
    VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
    VkInstance inst;
    CK(vkCreateInstance(&ici, NULL, &inst));
    uint32_t npd = 1;
    VkResult r = vkEnumeratePhysicalDevices(inst, &npd, &g.pd);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || npd == 0) {
        fprintf(stderr, "vk_cm_bench: no Vulkan device\n");
        return 1;
    }
    VkPhysicalDeviceProperties pr;
    vkGetPhysicalDeviceProperties(g.pd, &pr);
    g.tick_ns = pr.limits.timestampPeriod;
    uint32_t ne = 0;
    vkEnumerateDeviceExtensionProperties(g.pd, NULL, &ne, NULL);
    VkExtensionProperties *ep = calloc(ne ? ne : 1, sizeof *ep);
    if (!ep)
        return 1;
    vkEnumerateDeviceExtensionProperties(g.pd, NULL, &ne, ep);
    for (uint32_t i = 0; i < ne; i++) {
        g.nv |= strcmp(ep[i].extensionName, "VK_NV_cooperative_matrix") == 0;
        g.khr |= strcmp(ep[i].extensionName, "VK_KHR_cooperative_matrix") == 0;
        g.pexec |= strcmp(ep[i].extensionName, "VK_KHR_pipeline_executable_properties") == 0;
        g.cm2 |= strcmp(ep[i].extensionName, "VK_NV_cooperative_matrix2") == 0;
        g.bf16 |= strcmp(ep[i].extensionName, "VK_KHR_shader_bfloat16") == 0;
    }
    free(ep);
    const char *cm2_env = getenv("LLMEM_VULKAN_CM2");
    g.cm2 = g.cm2 && g.khr && pr.apiVersion >= VK_API_VERSION_1_3 &&
            !(cm2_env && strcmp(cm2_env, "0") == 0);
    /* coopmat2: every feature the device has, and bufferDeviceAddress (decode functions) */
    cm2_feat c2 = {STYPE_CM2_FEATURES, NULL, 0, 0, 0, 0, 0, 0, 0};
    cm2_props c2p = {STYPE_CM2_PROPERTIES, NULL, 0, 0, 0};
    if (g.cm2) {
        VkPhysicalDeviceFeatures2 q2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &c2};
        vkGetPhysicalDeviceFeatures2(g.pd, &q2);
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &c2p};
        vkGetPhysicalDeviceProperties2(g.pd, &p2);
        c2.pNext = NULL;
    }
    printf("%s: NV cooperative matrices %s, KHR %s, coopmat2 %s\n", pr.deviceName, g.nv ? "yes" : "no",
           g.khr ? "yes" : "no", g.cm2 ? "yes" : "no");
    if (g.cm2)
        printf("CM2 features: workgroup scope %u, flexible dimensions %u, reductions %u, conversions %u, "
               "per-element %u, tensor addressing %u, block loads %u; workgroup scope up to %u "
               "invocations, flexible dimensions up to %u, %u bytes of shared memory reserved\n",
               c2.wg_scope, c2.flex_dims, c2.reductions, c2.conversions, c2.per_element,
               c2.tensor_addr, c2.block_loads, c2p.wg_max, c2p.flex_max, c2p.smem_reserved);
    list_shapes(inst);

    /* features: only those the device has */
    VkPhysicalDeviceVulkan12Features h12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features h11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &h12};
    VkPhysicalDeviceFeatures2 hf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &h11};
    vkGetPhysicalDeviceFeatures2(g.pd, &hf);
    khr_cm_feat kf = {STYPE_CM_FEATURES_KHR, NULL, VK_TRUE, VK_FALSE};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV nf = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, g.khr ? &kf : NULL, VK_TRUE, VK_FALSE};
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pf = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
        g.nv ? (void *)&nf : g.khr ? (void *)&kf : NULL, VK_TRUE};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = g.pexec ? (void *)&pf : pf.pNext};
    f12.shaderFloat16 = h12.shaderFloat16;
    f12.vulkanMemoryModel = h12.vulkanMemoryModel;
    f12.bufferDeviceAddress = g.cm2 && h12.bufferDeviceAddress;
    if (g.cm2) { /* in front of the KHR features (the extension needs them) */
        c2.pNext = kf.pNext;
        kf.pNext = &c2;
    }
    /* bf16 scalars and cooperative matrices (shaders/matmul_bf.comp), where the device has them */
    bf16_feat bf = {STYPE_BF16_FEATURES, NULL, 0, 0, 0};
    if (g.bf16 && g.khr) {
        VkPhysicalDeviceFeatures2 q2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &bf};
        vkGetPhysicalDeviceFeatures2(g.pd, &q2);
        printf("bf16 features: type %u, dot %u, cooperative matrix %u\n", bf.type, bf.dot, bf.cm);
    }
    g.bf16 = g.bf16 && g.khr && bf.type && bf.cm;
    if (g.bf16) {
        bf.dot = VK_FALSE;
        bf.pNext = kf.pNext;
        kf.pNext = &bf;
    }
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    f11.storageBuffer16BitAccess = h11.storageBuffer16BitAccess;
    const char *exts[5];
    uint32_t nx = 0;
    if (g.cm2)
        exts[nx++] = "VK_NV_cooperative_matrix2";
    if (g.pexec)
        exts[nx++] = "VK_KHR_pipeline_executable_properties";
    if (g.nv)
        exts[nx++] = "VK_NV_cooperative_matrix";
    if (g.khr)
        exts[nx++] = "VK_KHR_cooperative_matrix";
    if (g.bf16)
        exts[nx++] = "VK_KHR_shader_bfloat16";
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0, 0, 1, &prio};
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &f11, 0, 1, &qi, 0, NULL, nx, exts, NULL};
    CK(vkCreateDevice(g.pd, &dci, NULL, &g.dev)); /* queue family 0 computes on NVIDIA and lavapipe */
    vkGetDeviceQueue(g.dev, 0, 0, &g.q);

    VkDescriptorSetLayoutBinding b[N_BIND];
    VkDescriptorBufferInfo dbi[N_BIND];
    VkWriteDescriptorSet wr[N_BIND];
    for (int i = 0; i < N_BUF; i++) {
        VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, buf_size[i],
                                  VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                  VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
        CK(vkCreateBuffer(g.dev, &bci, NULL, &g.buf[i]));
        VkMemoryRequirements mr;
        vkGetBufferMemoryRequirements(g.dev, g.buf[i], &mr);
        VkMemoryPropertyFlags want = i == B_STAGE ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                         VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                                   : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
        VkMemoryAllocateInfo mai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, mr.size,
                                    mem_type(mr.memoryTypeBits, want)};
        VkDeviceMemory mem;
        CK(vkAllocateMemory(g.dev, &mai, NULL, &mem));
        CK(vkBindBufferMemory(g.dev, g.buf[i], mem, 0));
        if (i == B_STAGE)
            CK(vkMapMemory(g.dev, mem, 0, buf_size[i], 0, (void **)&g.stage));
        else {
            b[i] = (VkDescriptorSetLayoutBinding){(uint32_t)i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                                  VK_SHADER_STAGE_COMPUTE_BIT, NULL};
            dbi[i] = (VkDescriptorBufferInfo){g.buf[i], 0, buf_size[i]};
        }
    }
    VkCommandPoolCreateInfo cpi = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL, 0, 0};
    CK(vkCreateCommandPool(g.dev, &cpi, NULL, &g.pool));
    VkQueryPoolCreateInfo qpi = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, NULL, 0, VK_QUERY_TYPE_TIMESTAMP, 2, 0};
    CK(vkCreateQueryPool(g.dev, &qpi, NULL, &g.qp));
    VkDescriptorSetLayoutCreateInfo li = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0, N_BIND, b};
    CK(vkCreateDescriptorSetLayout(g.dev, &li, NULL, &g.dsl));
    VkPushConstantRange pcr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
    VkPipelineLayoutCreateInfo pli = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &g.dsl, 1, &pcr};
    CK(vkCreatePipelineLayout(g.dev, &pli, NULL, &g.pl));
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, N_BIND};
    VkDescriptorPoolCreateInfo dpi = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0, 1, 1, &ps};
    VkDescriptorPool dp;
    CK(vkCreateDescriptorPool(g.dev, &dpi, NULL, &dp));
    VkDescriptorSetAllocateInfo dai = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, NULL, dp, 1, &g.dsl};
    CK(vkAllocateDescriptorSets(g.dev, &dai, &g.ds));
    for (int i = 0; i < N_BIND; i++)
        wr[i] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, g.ds, (uint32_t)i, 0, 1,
                                       VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, NULL, &dbi[i], NULL};
    vkUpdateDescriptorSets(g.dev, N_BIND, wr, 0, NULL);
    return 0;
}

static float f16_value(uint16_t h)
{
    int e = h >> 10 & 31, m = h & 1023;
    float v = e ? ldexpf((float)(1024 + m), e - 25) : ldexpf((float)m, -24);
    return h >> 15 ? -v : v;
}

static float bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The f16 bits of v, a normal f16 value or zero (exact: no rounding). */
static uint16_t f16_bits(float v)
{
    int e;
    if (v == 0)
        return 0;
    float m = frexpf(fabsf(v), &e);
    return (uint16_t)(((e + 14) << 10) | (uint16_t)((m * 2 - 1) * 1024) | (v < 0 ? 0x8000 : 0));
}

/* Inputs of the gemm entries: weights [WN, KK] bf16 and activations hi
 * [AM, KK] f16, (r - 8) / 64 for r in [0, 16], then lo [AM, KK] f16,
 * (r - 8) / 4096, so that the lo products are checked too (every product a
 * multiple of 2^-18 and every partial sum far below 2^6: exact in f32). */
static int inputs(void)
{
    w_host = malloc((size_t)WN * KK * 2);
    a_host = malloc((size_t)AM * KK * 2 * 2);
    if (!w_host || !a_host)
        return 1;
    srand(7);
    for (size_t i = 0; i < (size_t)WN * KK; i++) {
        float v = (float)(rand() % 17 - 8) / 64;
        uint32_t u;
        memcpy(&u, &v, 4);
        w_host[i] = (uint16_t)(u >> 16);
    }
    for (size_t i = 0; i < (size_t)AM * KK; i++) {
        a_host[i] = f16_bits((float)(rand() % 17 - 8) / 64);
        a_host[(size_t)AM * KK + i] = f16_bits((float)(rand() % 17 - 8) / 4096);
    }
    memcpy(g.stage, w_host, (size_t)WN * KK * 2);
    copy(B_STAGE, B_W, (size_t)WN * KK * 2);
    memcpy(g.stage, a_host, (size_t)AM * KK * 4);
    copy(B_STAGE, B_A, (size_t)AM * KK * 4);
    memset(g.stage, 0, 1u << 20);
    copy(B_STAGE, B_E, 1u << 20);
    copy(B_STAGE, B_C, 1u << 20); /* RAW 2's counters start at zero */
    return 0;
}

static void run_gemm(const char *name, VkPipeline pipe, const uint32_t *v)
{
    uint32_t m = v[0], n = v[1], k = v[2], wg = v[3], sgm = v[4], fm = v[5], fn = v[6], bk = v[8];
    uint32_t bm = 16 * fm * sgm, bn = 16 * fn * (wg / 32 / sgm);
    uint32_t tm = (m + bm - 1) / bm, tn = (n + bn - 1) / bn, slices, ks;
    vk_mm_split_k((uint64_t)tm * tn, k, bk, VK_SM_FALLBACK, &slices, &ks); /* the H200's 132 */
    if (v[10]) { /* forced slice count */
        ks = (k / v[10] + bk - 1) / bk * bk;
        slices = (k + ks - 1) / ks;
    }
    uint32_t raw = v[11], ldp = raw ? tn * bn : n, ss = raw ? tm * bm * ldp : m * n;
    /* (the last three: matmul_cmp.comp's uniform plan, head 0, ldt ldp, tail_stride ss) */
    uint32_t pc[19] = {m, n, k, 0, AM * KK / 8, 0, 0, 0, tm, tm * tn, ks, ss, tm * tn * slices, ldp, 0, 0,
                       0, ldp, ss};
    size_t out_bytes = (size_t)slices * ss * 4;
    if (out_bytes > buf_size[B_O] || out_bytes > buf_size[B_STAGE]) {
        printf("%-24s output of %zu bytes too large\n", name, out_bytes);
        return;
    }
    memset(g.stage, 0, out_bytes);
    copy(B_STAGE, B_O, out_bytes);
    const char *re = getenv("VKCM_ROTATE");
    rot_copies = re && atoi(re) == 1 ? (uint32_t)((size_t)WN * KK / ((size_t)n * k)) : 1;
    rot_stride = n * k / 8;
    warm_up(pipe, pc, sizeof pc, tm * tn * slices, 20);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double s = timed(pipe, pc, sizeof pc, tm * tn * slices, 20);
        best = s < best ? s : best;
    }
    bool fused = raw == 2; /* the final out, summed in the shader */
    if (fused)
        copy(B_F, B_STAGE, (size_t)m * n * 4);
    else
        copy(B_O, B_STAGE, out_bytes);
    const float *o = (const float *)g.stage;
    double err = 0, big = 0;
    for (uint32_t t = 0; t < 64; t++) {
        uint32_t i = t ? t * 7919u % m : m - 1, j = t ? t * 104729u % n : n - 1;
        double ref = 0, got = 0;
        for (uint32_t c = 0; c < k; c++)
            ref += ((double)f16_value(a_host[(size_t)i * k + c]) +
                    (v[7] == 2 ? f16_value(a_host[(size_t)AM * KK + (size_t)i * k + c]) : 0)) *
                   bf16_value(w_host[(size_t)j * k + c]);
        for (uint32_t s = 0; s < slices && !fused; s++)
            got += o[(size_t)s * ss + (size_t)i * ldp + j];
        if (fused)
            got = o[(size_t)i * n + j];
        err = fmax(err, fabs(got - ref));
        big = fmax(big, fabs(ref));
    }
    printf("%-24s %ux%ux%u split %u depth %u raw %u %5ux%5ux%5u  slices %2u  %8.4f ms %7.1f TFLOP/s  err %.2g (largest %.3g) wg %u copies %u\n",
           name, sgm, fm, fn, v[7], v[9], raw, m, n, k, slices, best * 1e3, 2.0 * m * n * k / best * 1e-12, err, big, wg, rot_copies);
    rot_copies = 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: vk_cm_bench DIR [LIST]   (DIR/LIST, default list.txt; DIR/NAME.spv)\n");
        return 2;
    }
    if (setup() != 0 || inputs() != 0)
        return 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], argc == 3 ? argv[2] : "list.txt");
    FILE *lf = fopen(path, "r");
    if (!lf) {
        fprintf(stderr, "vk_cm_bench: cannot open %s\n", path);
        return 1;
    }
    char line[512], name[256], kind[16];
    while (fgets(line, sizeof line, lf)) {
        uint32_t v[12] = {0};
        int got = sscanf(line, "%255s %15s %u %u %u %u %u %u %u %u %u %u %u %u", name, kind, &v[0],
                         &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11]);
        bool gemm = got >= 11 && got <= 14 && strcmp(kind, "gemm") == 0;
        if (got == 11)
            v[9] = 1;
        bool mma = got == 5 && (strcmp(kind, "mma") == 0 || strcmp(kind, "simt") == 0 ||
                                 strcmp(kind, "fa") == 0);
        if (!gemm && !mma) {
            if (got > 0 && name[0] != '#')
                fprintf(stderr, "vk_cm_bench: skipped line: %s", line);
            continue;
        }
        /* any K (a multiple of 8) whose [N, K] weights and [M, K] terms fit the buffers,
         * read as row-major [N, K] and [M, K] (the lo terms stay at AM KK) */
        if (gemm && (v[2] == 0 || v[2] % 8 || (size_t)v[1] * v[2] > (size_t)WN * KK ||
                     (size_t)v[0] * v[2] > (size_t)AM * KK || v[0] == 0 || v[1] == 0 ||
                     (size_t)v[0] * v[1] * 4 * (v[10] > 16 ? v[10] : 16) > buf_size[B_O] || v[8] == 0 || v[4] == 0)) {
            fprintf(stderr, "vk_cm_bench: %s: shape out of range\n", name);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s.spv", argv[1], name);
        uint32_t spec[9] = {gemm ? v[3] : 128, 2, v[4], v[5], v[6], v[7], v[8], v[9], v[11]};
        VkPipeline pipe = pipeline(path, spec, gemm ? 9 : 0);
        if (!pipe) {
            printf("%-24s no module or pipeline (%s)\n", name, path);
            continue;
        }
        if (gemm)
            run_gemm(name, pipe, v);
        else {
            double best = 1e30;
            warm_up(pipe, &v[1], 4, v[0], 1);
            for (int rep = 0; rep < 3; rep++) {
                double s = timed(pipe, &v[1], 4, v[0], 1);
                best = s < best ? s : best;
            }
            bool fa = strcmp(kind, "fa") == 0;
            double units = (double)v[0] * (strcmp(kind, "simt") == 0 ? 128 : fa ? 8 : 4);
            printf("%-24s %8.3f ms %8.1f TFLOP/s", name, best * 1e3, units * v[1] * v[2] / best * 1e-12);
            if (fa) /* rounds an SM: ITERS for each of GROUPS / 132 workgroups */
                printf(" %8.1f ns a block an SM (%u a SM)", best * 1e9 / v[1] / (v[0] / 132.0), v[0] / 132);
            printf("\n");
        }
        fflush(stdout);
        vkDestroyPipeline(g.dev, pipe, NULL);
    }
    fclose(lf);
    return 0;
}

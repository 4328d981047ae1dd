/* llmem Vulkan backend: the cooperative-matrix extensions newer than
 * Debian 12's Vulkan headers (1.3.239), queried once when the device is
 * made (vk_plugin.c device_create): VK_KHR_cooperative_matrix (under the
 * KHR modules and coopmat2) and VK_NV_cooperative_matrix2 (workgroup-scope
 * cooperative matrices, tensor-addressed loads and stores, decode
 * functions; Khronos registry, VK_NV_cooperative_matrix2 revision 1, and
 * GL_NV_cooperative_matrix2 / SPV_NV_cooperative_matrix2). Their
 * structures, structure types and queries are defined here and in
 * vk_internal.h as the registry gives them (VK_NV_cooperative_matrix2 is
 * extension 594, so structure types 1000593000 +). */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

#define CM2_STYPE_FEATURES ((VkStructureType)1000593000)
#define CM2_STYPE_FLEX_PROPERTIES ((VkStructureType)1000593001)
#define CM2_STYPE_PROPERTIES ((VkStructureType)1000593002)
#define KHR_COMPONENT_F16 0 /* VkComponentTypeKHR */
#define KHR_COMPONENT_F32 1
#define KHR_SCOPE_WORKGROUP 2 /* VkScopeKHR */

typedef struct cm2_properties {
    VkStructureType sType;
    void *pNext;
    uint32_t cooperativeMatrixWorkgroupScopeMaxWorkgroupSize;
    uint32_t cooperativeMatrixFlexibleDimensionsMaxDimension;
    uint32_t cooperativeMatrixWorkgroupScopeReservedSharedMemory;
} cm2_properties;

typedef struct cm2_flex_properties {
    VkStructureType sType;
    void *pNext;
    uint32_t MGranularity, NGranularity, KGranularity;
    int32_t AType, BType, CType, ResultType; /* VkComponentTypeKHR */
    VkBool32 saturatingAccumulation;
    int32_t scope; /* VkScopeKHR */
    uint32_t workgroupInvocations;
} cm2_flex_properties;

typedef VkResult (*cm2_flex_query)(VkPhysicalDevice, uint32_t *, cm2_flex_properties *);

/* The granularities of the workgroup-scope f16 x f16 -> f32 entries for
 * VK_CM2_WG and 128 invocations among the device's flexible-dimension
 * shapes (into *c); false when there is none for VK_CM2_WG. */
static bool flex_entry(VkInstance inst, VkPhysicalDevice pd, vk_cm2_caps *c)
{
    PFN_vkVoidFunction f = vkGetInstanceProcAddr(
        inst, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
    cm2_flex_query q;
    uint32_t n = 0;
    if (!f)
        return false;
    memcpy(&q, &f, sizeof q);
    if (q(pd, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    cm2_flex_properties *p = calloc(n, sizeof *p);
    if (!p)
        return false;
    for (uint32_t i = 0; i < n; i++)
        p[i].sType = CM2_STYPE_FLEX_PROPERTIES;
    bool ok = false;
    if (q(pd, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++) {
            if (p[i].AType != KHR_COMPONENT_F16 || p[i].BType != KHR_COMPONENT_F16 ||
                p[i].CType != KHR_COMPONENT_F32 || p[i].ResultType != KHR_COMPONENT_F32 ||
                p[i].scope != KHR_SCOPE_WORKGROUP || p[i].saturatingAccumulation)
                continue;
            if (p[i].workgroupInvocations == VK_CM2_WG && !ok) {
                c->gran_m = p[i].MGranularity;
                c->gran_n = p[i].NGranularity;
                c->gran_k = p[i].KGranularity;
                ok = true;
            } else if (p[i].workgroupInvocations == 128 && !c->gran128[0]) {
                c->gran128[0] = p[i].MGranularity;
                c->gran128[1] = p[i].NGranularity;
                c->gran128[2] = p[i].KGranularity;
            }
        }
    free(p);
    return ok;
}

/* VK_KHR_cooperative_matrix's property structure and query (its feature
 * structure: vk_internal.h). */
#define KHR_CM_STYPE_PROPERTIES ((VkStructureType)1000506001)
typedef struct khr_cm_properties {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize, NSize, KSize;
    int32_t AType, BType, CType, ResultType; /* VkComponentTypeKHR: 0 f16, 1 f32 */
    VkBool32 saturatingAccumulation;
    int32_t scope; /* VkScopeKHR: 3 subgroup */
} khr_cm_properties;
typedef VkResult (*khr_cm_query)(VkPhysicalDevice, uint32_t *, khr_cm_properties *);

bool vk_khr_modules_wanted(void)
{
    const char *cmp = getenv("LLMEM_VULKAN_CMP"), *cmk = getenv("LLMEM_VULKAN_CM_KHR");
    const char *apf = getenv("LLMEM_VULKAN_ATTN_PF");
    bool want_cmp = !(cmp && (strcmp(cmp, "0") == 0 || strcmp(cmp, "2") == 0)) &&
                    vk_shader_codes[VK_SH_MATMUL_CMP_KHR].size >= 20;
    bool want_cm = !(cmk && strcmp(cmk, "0") == 0) &&
                   vk_shader_codes[VK_SH_MATMUL_CM_KHR].size >= 20;
    bool want_pf = !(apf && (strcmp(apf, "0") == 0 || strcmp(apf, "3") == 0)) &&
                   vk_shader_codes[VK_SH_ATTENTION_PREFILL_CM_KHR].size >= 20;
    return want_cmp || want_cm || want_pf;
}

/* The device's VK_KHR_cooperative_matrix shapes (calloc'd, *n of them:
 * the caller frees), or NULL (*n 0) where the query is missing, fails or
 * lists none, or out of host memory. */
static khr_cm_properties *khr_cm_shapes(VkInstance inst, VkPhysicalDevice pd, uint32_t *n)
{
    *n = 0;
    PFN_vkVoidFunction f =
        vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
    khr_cm_query q;
    if (!f)
        return NULL;
    memcpy(&q, &f, sizeof q);
    uint32_t c = 0;
    if (q(pd, &c, NULL) != VK_SUCCESS || c == 0)
        return NULL;
    khr_cm_properties *p = calloc(c, sizeof *p);
    if (!p)
        return NULL;
    for (uint32_t i = 0; i < c; i++)
        p[i].sType = KHR_CM_STYPE_PROPERTIES;
    if (q(pd, &c, p) != VK_SUCCESS) {
        free(p);
        return NULL;
    }
    *n = c;
    return p;
}

bool vk_khr_cm_usable(VkInstance inst, VkPhysicalDevice pd, uint32_t subgroup_size,
                      uint32_t shared_bytes)
{
    if (!vk_has_device_ext(pd, VK_KHR_CM_NAME))
        return false;
    vk_khr_cm_features cf = {.sType = VK_KHR_CM_STYPE_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &cf};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!cf.cooperativeMatrix)
        return false;
    uint32_t n = 0;
    khr_cm_properties *p = khr_cm_shapes(inst, pd, &n);
    vk_cm_shape *sh = p ? calloc(n, sizeof *sh) : NULL;
    bool ok = false;
    if (sh) {
        for (uint32_t i = 0; i < n; i++)
            sh[i] = (vk_cm_shape){
                .m = p[i].MSize,
                .n = p[i].NSize,
                .k = p[i].KSize,
                .ab_f16 = p[i].AType == 0 && p[i].BType == 0,
                .cd_f32 = p[i].CType == 1 && p[i].ResultType == 1,
                .subgroup_scope = p[i].scope == 3,
            };
        ok = vk_cm_usable(sh, n, subgroup_size, shared_bytes);
    }
    free(p);
    free(sh);
    return ok;
}

bool vk_khr_bf16_usable(VkInstance inst, VkPhysicalDevice pd)
{
    if (vk_env_u32("LLMEM_VULKAN_BF16", VK_BF16_DEFAULT, 0, 2) == 0 ||
        !vk_has_device_ext(pd, VK_KHR_BF16_NAME) ||
        (vk_shader_codes[VK_SH_MATMUL_DEC_BF_KHR].size < 20 &&
         vk_shader_codes[VK_SH_MATMUL_CM_BF_KHR].size < 20))
        return false;
    vk_khr_bf16_features bf = {.sType = VK_KHR_BF16_STYPE_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &bf};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!bf.shaderBFloat16Type || !bf.shaderBFloat16CooperativeMatrix)
        return false;
    uint32_t n = 0;
    khr_cm_properties *p = khr_cm_shapes(inst, pd, &n);
    bool ok = false;
    for (uint32_t i = 0; i < n && !ok; i++)
        ok = p[i].MSize == 16 && p[i].NSize == 16 && p[i].KSize == 16 &&
             p[i].AType == VK_KHR_BF16_COMPONENT && p[i].BType == VK_KHR_BF16_COMPONENT &&
             p[i].CType == 1 && p[i].ResultType == 1 && p[i].scope == 3;
    free(p);
    return ok;
}

bool vk_cm2_query(VkInstance inst, VkPhysicalDevice pd, vk_cm2_caps *c)
{
    *c = (vk_cm2_caps){0};
    const char *env = getenv("LLMEM_VULKAN_CM2");
    if ((env && strcmp(env, "0") == 0) || !vk_has_device_ext(pd, VK_CM2_NAME))
        return false;
    VkPhysicalDeviceBufferDeviceAddressFeatures bda = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES,
    };
    vk_cm2_features *cf = &c->features;
    cf->sType = CM2_STYPE_FEATURES;
    cf->pNext = &bda;
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = cf};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    cf->pNext = NULL;
    /* workgroup scope, flexible sizes, tensor addressing and decode functions (block
     * loads; a decode function takes a buffer_reference, so buffer device addresses too) */
    if (!cf->cooperativeMatrixWorkgroupScope || !cf->cooperativeMatrixFlexibleDimensions ||
        !cf->cooperativeMatrixTensorAddressing || !cf->cooperativeMatrixBlockLoads ||
        !bda.bufferDeviceAddress)
        return false;
    cm2_properties pr = {.sType = CM2_STYPE_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &pr};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    c->wg_max = pr.cooperativeMatrixWorkgroupScopeMaxWorkgroupSize;
    c->flex_max = pr.cooperativeMatrixFlexibleDimensionsMaxDimension;
    c->smem_reserved = pr.cooperativeMatrixWorkgroupScopeReservedSharedMemory;
    if (c->wg_max < VK_CM2_WG || !flex_entry(inst, pd, c))
        return false;
    c->usable = true;
    return true;
}

void *vk_cm2_chain(vk_cm2_caps *c, VkPhysicalDeviceBufferDeviceAddressFeatures *bda, void *next)
{
    if (!c->usable)
        return next;
    /* every feature the device reported stays enabled (decode plans may use the
     * conversions, reductions and per-element operations) */
    c->features.sType = CM2_STYPE_FEATURES;
    c->features.pNext = next;
    *bda = (VkPhysicalDeviceBufferDeviceAddressFeatures){
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES,
        .pNext = &c->features,
        .bufferDeviceAddress = VK_TRUE,
    };
    return bda;
}

/* llmem Vulkan backend: the device-extension queries for cooperative
 * matrices newer than Debian 12's Vulkan headers (1.3.239):
 * VK_KHR_cooperative_matrix and VK_NV_cooperative_matrix2, whose
 * structures are defined here as the Khronos registry gives them
 * (internal; vk_cm2.c and vk_plugin.c implement them, docs/vulkan.md
 * describes the paths that use them). */
#ifndef LLMEM_VK_CM2_H
#define LLMEM_VK_CM2_H

#include <stdbool.h>
#include <stdint.h>

#include <volk.h>

/* VK_KHR_cooperative_matrix's feature structure (newer than Debian 12's
 * Vulkan headers; vk_cm2.c queries the extension). */
#define VK_KHR_CM_NAME "VK_KHR_cooperative_matrix"
#define VK_KHR_CM_STYPE_FEATURES ((VkStructureType)1000506000)
typedef struct vk_khr_cm_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
} vk_khr_cm_features;

/* Whether one of the KHR cooperative-matrix modules is wanted and
 * embedded (shaders/shaders.cmake): matmul_cmp.comp's with
 * $LLMEM_VULKAN_CMP not 0 or 2, or matmul_cm.comp's with
 * $LLMEM_VULKAN_CM_KHR not 0. Reads the environment; no device. */
bool vk_khr_modules_wanted(void);

/* Whether the physical device pd lists the device extension name
 * (vkEnumerateDeviceExtensionProperties; name is a NUL-terminated
 * extension name, not owned). false, too, when the query fails or the
 * host runs out of memory for the list. */
bool vk_has_device_ext(VkPhysicalDevice pd, const char *name);

/* Whether VK_KHR_cooperative_matrix may be enabled on pd (for the KHR
 * modules, v->coopmat_khr, or for VK_NV_cooperative_matrix2, which
 * depends on it); the caller has checked the NV path (shaderFloat16 and
 * the memory model come with it): the extension, its feature and the
 * 16 x 16 x 16 f16 x f16 -> f32 shape at subgroup scope, with subgroups
 * of subgroup_size and shared_bytes of shared memory a workgroup
 * (vk_cm_usable, the NV check's rule). false, too, when the host runs out
 * of memory for the shape list. */
bool vk_khr_cm_usable(VkInstance inst, VkPhysicalDevice pd, uint32_t subgroup_size,
                      uint32_t shared_bytes);

/* VK_KHR_shader_bfloat16 (registry: extension 142), newer than Debian
 * 12's Vulkan headers too: its feature structure and the bf16 component
 * type of VkCooperativeMatrixPropertiesKHR. */
#define VK_KHR_BF16_NAME "VK_KHR_shader_bfloat16"
#define VK_KHR_BF16_STYPE_FEATURES ((VkStructureType)1000141000)
#define VK_KHR_BF16_COMPONENT 1000141000
typedef struct vk_khr_bf16_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 shaderBFloat16Type, shaderBFloat16DotProduct, shaderBFloat16CooperativeMatrix;
} vk_khr_bf16_features;

/* Whether the bf16 modules (matmul_dec.comp and matmul_cm.comp with
 * -DBF16=1: bf16 A and B matrices, shaders/shaders.cmake's
 * LLMEM_VK_BF16_SHADERS) may run on pd, where VK_KHR_cooperative_matrix
 * is already usable (vk_khr_cm_usable): the extension
 * VK_KHR_shader_bfloat16 with shaderBFloat16Type and
 * shaderBFloat16CooperativeMatrix, and a 16 x 16 x 16 shape of bf16 A and
 * B with f32 C and result at subgroup scope among
 * vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR's. false, too, when
 * $LLMEM_VULKAN_BF16 is 0 (then the extension is not enabled), when no
 * bf16 module is embedded, or when the host runs out of memory for the
 * shape list. The H200 (driver 580) lists all of it. */
bool vk_khr_bf16_usable(VkInstance inst, VkPhysicalDevice pd);

/* VK_NV_cooperative_matrix2 (vk_cm2.c): newer than Debian 12's Vulkan
 * headers (1.3.239), so its feature structure is defined here as the
 * Khronos registry gives it (structure type 1000593000). */
#define VK_CM2_NAME "VK_NV_cooperative_matrix2"
#define VK_CM2_WG 256 /* the workgroup size whose workgroup-scope shape must be listed */
typedef struct vk_cm2_features {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrixWorkgroupScope, cooperativeMatrixFlexibleDimensions,
        cooperativeMatrixReductions, cooperativeMatrixConversions,
        cooperativeMatrixPerElementOperations, cooperativeMatrixTensorAddressing,
        cooperativeMatrixBlockLoads;
} vk_cm2_features;

/* What the device offers of VK_NV_cooperative_matrix2 (vk_cm2_query). */
typedef struct vk_cm2_caps {
    bool usable;            /* everything below holds and the extension may be enabled */
    uint32_t wg_max;        /* cooperativeMatrixWorkgroupScopeMaxWorkgroupSize, invocations */
    uint32_t flex_max;      /* cooperativeMatrixFlexibleDimensionsMaxDimension, elements */
    uint32_t smem_reserved; /* cooperativeMatrixWorkgroupScopeReservedSharedMemory, bytes */
    uint32_t gran_m, gran_n, gran_k; /* granularities of the workgroup-scope f16 x f16 -> f32
                                      * shape at VK_CM2_WG invocations, elements */
    uint32_t gran128[3];    /* the same at 128 invocations (M, N, K; zeros: none listed) */
    vk_cm2_features features; /* as the device reported them; all enabled */
} vk_cm2_caps;

/* Whether the device can run VK_NV_cooperative_matrix2 modules: the
 * extension, its workgroup-scope, flexible-dimension, tensor-addressing
 * and block-load (decode function) features, bufferDeviceAddress (decode
 * functions take buffer references), a workgroup-scope limit of at least
 * VK_CM2_WG invocations and a flexible f16 x f16 -> f32 workgroup shape
 * at VK_CM2_WG invocations; $LLMEM_VULKAN_CM2=0 says no. Fills *c
 * (caller-owned; c->usable is the answer). Needs the instance's
 * vkGetPhysicalDeviceFeatures2 (Vulkan 1.1). The extension depends on
 * VK_KHR_cooperative_matrix, which the caller checks and enables. */
bool vk_cm2_query(VkInstance inst, VkPhysicalDevice pd, vk_cm2_caps *c);

/* Chains the features to enable for c (when c->usable: its feature
 * structure as reported, and bufferDeviceAddress in *bda, caller-owned
 * storage that must outlive vkCreateDevice) in front of next; returns the
 * new head (next itself when not usable). */
void *vk_cm2_chain(vk_cm2_caps *c, VkPhysicalDeviceBufferDeviceAddressFeatures *bda, void *next);

#endif

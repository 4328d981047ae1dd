/* llmem Vulkan backend: what a dispatch may hand a shader, checked
 * against what the shader's SPIR-V declares, as pure functions with no
 * Vulkan types, so that tests check every embedded module without a device
 * (tests/test_vulkan_spirv.c includes vk_spirv.c): cooperative-matrix
 * shaders, which lavapipe cannot run, included. */
#ifndef LLMEM_VK_SPIRV_H
#define LLMEM_VK_SPIRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#define VK_MAX_BINDINGS 12 /* storage buffers of the one descriptor set layout */
#define VK_MAX_SPEC 12     /* specialization constants per pipeline (the pipeline cache's key) */
#define VK_MAX_PUSH 128    /* bytes of push constants (the guaranteed minimum) */

/* What a compute shader module declares. */
typedef struct vk_spirv_info {
    int32_t n_spec;      /* its highest SpecId + 1; 0 when it has none */
    uint32_t push_bytes; /* bytes its push-constant block spans (highest member offset + size) */
} vk_spirv_info;

/* Reads a SPIR-V module (code: size bytes, host word order; SPIR-V
 * specification 1.6, section 2.3 "Physical layout", OpDecorate SpecId,
 * OpVariable PushConstant and its struct's Offset / ArrayStride
 * decorations). Returns true with *info filled; false with the reason in
 * why (a damaged module, a push-constant member of a type it cannot size:
 * anything but 32/64-bit scalars, vectors, matrices, arrays of constant
 * length and structs of those). */
bool vk_spirv_inspect(const uint32_t *code, size_t size, vk_spirv_info *info, char *why,
                      size_t why_len);

/* The arguments one dispatch asked for: how many specialization
 * constants, push-constant bytes and storage-buffer bindings the op's
 * code tried to add (counted past the limits, which vk_op refuses). */
typedef struct vk_op_asked {
    uint32_t n_spec, push_bytes, n_bind;
} vk_op_asked;

/* Checks a dispatch of shader `name` (its module's info; NULL: not
 * inspected) against the pipeline layout's limits (VK_MAX_SPEC,
 * VK_MAX_PUSH, VK_MAX_BINDINGS: llmem's own, the same on every device) and
 * against what the module declares. Returns LLMEM_OK, or LLMEM_E_INVALID
 * with one line in why naming the shader, what was asked and what is
 * allowed: an op that asks for more, or a module that declares a
 * specialization constant id or a push-constant block beyond them, is a
 * bug of llmem, not a device limit. */
llmem_status vk_op_args_check(const char *name, const vk_spirv_info *info,
                              const vk_op_asked *asked, char *why, size_t why_len);

#endif

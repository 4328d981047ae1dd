/* llmem Vulkan backend: the mixture-of-experts ops (shaders/moe_route.comp,
 * shaders/moe_ffn.comp), one workgroup per token each. Semantics are those
 * of the CPU reference (backends/cpu/ops_moe.c); the shaders never read an
 * expert whose id lies outside [0, E).
 */
#include "llmem/ops_moe.h"
#include "vk_internal.h"

#define MOE_WG 64
#define MOE_MAX_SHARED 4096 /* floats of shared memory per table (16 KiB) */

/* Specialization values are rounded up so few pipelines serve every size. */
static uint32_t round64(int64_t n)
{
    return (uint32_t)((n + 63) / 64 * 64);
}

static llmem_status vk_op_moe_route(llmem_backend *be, const llmem_moe_route_params *p,
                                    llmem_ct *logits, llmem_ct *bias, llmem_ct *ids,
                                    llmem_ct *weights)
{
    vk_backend *v = vk_from(be);
    if (round64(p->n_expert) > MOE_MAX_SHARED)
        return LLMEM_E_UNSUPPORTED;
    vk_op op;
    vk_op_init(&op, VK_SH_MOE_ROUTE, MOE_WG);
    vk_op_spec(&op, bias ? (uint32_t)bias->dtype : 3u);
    vk_op_spec(&op, round64(p->n_expert));
    uint32_t lo = vk_op_tensor(v, &op, logits, false);
    uint32_t bo = vk_op_tensor(v, &op, bias, false);
    uint32_t io = vk_op_tensor(v, &op, ids, true);
    uint32_t wo = vk_op_tensor(v, &op, weights, true);
    uint32_t T = (uint32_t)logits->ne[0];
    vk_op_u32(&op, T);
    vk_op_u32(&op, (uint32_t)p->n_expert);
    vk_op_u32(&op, (uint32_t)p->n_expert_used);
    vk_op_u32(&op, p->scoring == LLMEM_MOE_SIGMOID);
    vk_op_u32(&op, p->norm_topk);
    vk_op_u32(&op, (uint32_t)(p->n_group > 1 ? p->n_group : 1));
    vk_op_u32(&op, (uint32_t)p->topk_group);
    vk_op_u32(&op, lo);
    vk_op_u32(&op, bo);
    vk_op_u32(&op, io);
    vk_op_u32(&op, wo);
    vk_op_f32(&op, p->scale);
    return vk_op_run(v, &op, T);
}

static llmem_status vk_op_moe_ffn(llmem_backend *be, const llmem_moe_ffn_params *p, llmem_ct *x,
                                  llmem_ct *ids, llmem_ct *weights, llmem_ct *w_up,
                                  llmem_ct *w_down, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t I = w_down->ne[2];
    if (round64(I) > MOE_MAX_SHARED)
        return LLMEM_E_UNSUPPORTED;
    vk_op op;
    vk_op_init(&op, VK_SH_MOE_FFN, MOE_WG);
    vk_op_spec(&op, (uint32_t)w_up->dtype);
    vk_op_spec(&op, round64(I > 0 ? I : 1));
    vk_op_spec(&op, p->gated ? 1u : 0u);
    vk_op_spec(&op, p->act == LLMEM_MOE_ACT_RELU2 ? 1u : 0u);
    uint32_t xo = vk_op_tensor(v, &op, x, false);
    uint32_t io = vk_op_tensor(v, &op, ids, false);
    uint32_t wo = vk_op_tensor(v, &op, weights, false);
    uint32_t uo = vk_op_tensor(v, &op, w_up, false);
    uint32_t dno = vk_op_tensor(v, &op, w_down, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    uint32_t T = (uint32_t)x->ne[0];
    vk_op_u32(&op, T);
    vk_op_u32(&op, (uint32_t)x->ne[1]);
    vk_op_u32(&op, (uint32_t)I);
    vk_op_u32(&op, (uint32_t)w_up->ne[0]);
    vk_op_u32(&op, (uint32_t)ids->ne[1]);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, io);
    vk_op_u32(&op, wo);
    vk_op_u32(&op, uo);
    vk_op_u32(&op, dno);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, T);
}

/* Registered in the Vulkan backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_MOE_ROUTE, LLMEM_OP_MOE_ROUTE_LAYOUT, llmem_op_moe_route_fn,
              vk_op_moe_route);
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_MOE_FFN, LLMEM_OP_MOE_FFN_LAYOUT, llmem_op_moe_ffn_fn,
              vk_op_moe_ffn);

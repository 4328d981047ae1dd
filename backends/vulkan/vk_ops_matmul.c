/* llmem Vulkan backend: matmul, out[M, N] = a[M, K] · w[N, K]ᵀ with f32
 * accumulation (a linear layer; w f32, f16 or bf16).
 *
 * Few activation rows (decode, M <= MV_MAX) use shaders/matvec.comp: one
 * workgroup per weight row, the weight read once and coalesced, which is
 * what bounds decode. Otherwise shaders/matmul.comp tiles the output in
 * shared memory (tile sizes are specialization constants).
 */
#include "vk_internal.h"

#define MV_MAX 8  /* activation rows handled by the matvec path */
#define MV_WG 128
#define MM_BM 64
#define MM_BN 64
#define MM_BK 16
#define MM_TM 4
#define MM_TN 4

llmem_status vk_op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1], n = (uint32_t)w->ne[0];
    vk_op op;
    if (m <= MV_MAX) {
        vk_op_init(&op, v->subgroup ? VK_SH_MATVEC_SG : VK_SH_MATVEC, MV_WG);
        vk_op_spec(&op, (uint32_t)w->dtype);
        vk_op_spec(&op, m); /* rows per workgroup: all of them */
    } else {
        vk_op_init(&op, VK_SH_MATMUL, (MM_BM / MM_TM) * (MM_BN / MM_TN));
        vk_op_spec(&op, (uint32_t)w->dtype);
        vk_op_spec(&op, MM_BM);
        vk_op_spec(&op, MM_BN);
        vk_op_spec(&op, MM_BK);
        vk_op_spec(&op, MM_TM);
        vk_op_spec(&op, MM_TN);
    }
    uint32_t ao = vk_op_tensor(v, &op, a, false);
    uint32_t wo = vk_op_tensor(v, &op, w, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, m);
    vk_op_u32(&op, n);
    vk_op_u32(&op, k);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, wo);
    vk_op_u32(&op, oo);
    if (m <= MV_MAX) {
        vk_op_u32(&op, n);
        return vk_op_run(v, &op, n);
    }
    uint64_t tiles_m = vk_div_up(m, MM_BM), tiles = tiles_m * vk_div_up(n, MM_BN);
    vk_op_u32(&op, (uint32_t)tiles_m);
    vk_op_u32(&op, (uint32_t)tiles);
    return vk_op_run(v, &op, tiles);
}

/* llmem Vulkan backend: RoPE and the K-shift of cached keys.
 *
 * RoFormer (Su et al. 2021, eq. 34), pairs per mode (NORMAL (2i, 2i+1),
 * NEOX (i, i + n_rot/2)). The angle of pair i at position p is
 * p * f_i, f_i = freq_scale * theta^(-2i/n_rot) (formed in double, as on
 * the CPU). The host hands each shader f_i / (2 pi) as a 64-bit fraction
 * of a turn in a small staging table, so the shader reduces p * f_i
 * exactly with integer arithmetic (shaders/rope.glsl): positions of any
 * size keep f32 accuracy.
 */
#include <math.h>

#include "vk_internal.h"

#define WG 256
#define TWO_PI 6.283185307179586476925

/* Table [n_rot/2] of (lo, hi) words of frac(f_i / 2pi) * 2^64. */
static llmem_status rope_table(vk_backend *v, const llmem_rope_params *p, vk_stage_ref *s)
{
    uint32_t half = (uint32_t)p->n_rot / 2;
    llmem_status st = vk_stage_get(v, (VkDeviceSize)half * 8, v->storage_align, s);
    if (st != LLMEM_OK)
        return st;
    uint32_t *t = s->ptr;
    for (uint32_t i = 0; i < half; i++) {
        double f = (double)p->freq_scale * pow((double)p->theta_base, -2.0 * i / p->n_rot);
        double turns = f / TWO_PI;
        double frac = turns - floor(turns); /* exact, in [0, 1) */
        uint64_t fx = (uint64_t)ldexp(frac, 64);
        t[2 * i] = (uint32_t)fx;
        t[2 * i + 1] = (uint32_t)(fx >> 32);
    }
    return LLMEM_OK;
}

llmem_status vk_op_rope(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x, llmem_ct *pos,
                        llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    vk_stage_ref tab;
    llmem_status st = rope_table(v, p, &tab);
    if (st != LLMEM_OK)
        return st;
    uint32_t n_rows = (uint32_t)(x->ne[0] * x->ne[1]), hd = (uint32_t)x->ne[2];
    uint32_t units = (uint32_t)p->n_rot / 2 + hd - (uint32_t)p->n_rot;
    vk_op op;
    vk_op_init(&op, VK_SH_ROPE, WG);
    vk_op_spec(&op, p->mode == LLMEM_ROPE_NEOX ? 1u : 0u);
    uint32_t xo = vk_op_tensor(v, &op, x, false);
    uint32_t po = vk_op_tensor(v, &op, pos, false);
    vk_op_stage(v, &op, &tab, (VkDeviceSize)p->n_rot * 4);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, n_rows);
    vk_op_u32(&op, (uint32_t)x->ne[1]);
    vk_op_u32(&op, hd);
    vk_op_u32(&op, (uint32_t)p->n_rot);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, po);
    vk_op_u32(&op, 0); /* table offset in its binding */
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n_rows * units, WG));
}

llmem_status vk_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                              const llmem_view *view)
{
    vk_backend *v = vk_from(be);
    const llmem_kv_view *kv = llmem_view_kv(view);
    vk_stage_ref tab;
    llmem_status st = rope_table(v, p, &tab);
    if (st != LLMEM_OK)
        return st;
    uint32_t n = (uint32_t)kv->shift_slot.n;
    vk_op op;
    vk_op_init(&op, VK_SH_ROPE_SHIFT, WG);
    vk_op_spec(&op, p->mode == LLMEM_ROPE_NEOX ? 1u : 0u);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_stage(v, &op, &tab, (VkDeviceSize)p->n_rot * 4);
    vk_op_buffer(v, &op, kv->k, true);
    vk_op_u32(&op, n);
    vk_op_u32(&op, (uint32_t)kv->n_kv_heads);
    vk_op_u32(&op, (uint32_t)kv->head_dim);
    vk_op_u32(&op, (uint32_t)p->n_rot);
    vk_op_u32(&op, (uint32_t)((int64_t)kv->n_pages * kv->page_size));
    vk_op_u32(&op, vk_table_word(&kv->shift_slot));
    vk_op_u32(&op, vk_table_word(&kv->shift_delta));
    vk_op_u32(&op, 0);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n * kv->n_kv_heads * (p->n_rot / 2), WG));
}

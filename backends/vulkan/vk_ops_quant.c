/* llmem Vulkan backend: scaled 8-bit KV pools (int8, FP8 E4M3; issue 17).
 * The store (shaders/kv_store_q.comp) and paged attention
 * (shaders/attention_q.comp) of pools whose pages hold 1-byte codes and
 * per-head f32 scales (<llmem/view.h> llmem_kv_page_bytes; docs/memory.md,
 * "Quantized KV and state"). Pools must be one buffer chunk (a chunked pool
 * gives LLMEM_E_UNSUPPORTED through vk_op_buffer), page_size <= 256 and
 * head_dim <= 256. */
#include "backends/vulkan/vk_internal.h"

/* llmem_kv_scale_offset / llmem_kv_page_bytes (<llmem/view.h>), here because
 * the plugin links no core library function: codes, then the per-head f32
 * scales at the next 16-byte boundary, the page padded to 16 bytes. The op
 * wrapper checked that the pools hold n_pages such pages. */
static uint32_t scale_off(const llmem_kv_view *kv)
{
    return ((uint32_t)kv->page_size * (uint32_t)kv->n_kv_heads * (uint32_t)kv->head_dim + 15u) &
           ~15u;
}

static uint32_t page_bytes(const llmem_kv_view *kv)
{
    return (scale_off(kv) + 4u * (uint32_t)kv->n_kv_heads + 15u) & ~15u;
}

#define QSTORE_WG 128 /* kv_store_q.comp's shared reduction is sized for it */
#define QATTN_WG 64   /* attention_q.comp: 64 invocations x 4 elements */

llmem_status vk_op_kv_store_q(llmem_backend *be, const llmem_view *view, llmem_ct *k, llmem_ct *vv)
{
    vk_backend *v = vk_from(be);
    const llmem_kv_view *kv = llmem_view_kv(view);
    /* shaders address bytes in 32 bits */
    if (kv->page_size > 256 || (uint64_t)page_bytes(kv) * (uint64_t)kv->n_pages > UINT32_MAX)
        return LLMEM_E_UNSUPPORTED;
    uint32_t n = (uint32_t)kv->store_slot.n;
    vk_op op;
    vk_op_init(&op, VK_SH_KV_STORE_Q, QSTORE_WG);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    uint32_t ko = vk_op_tensor(v, &op, k, false);
    uint32_t vo = vk_op_tensor(v, &op, vv, false);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_buffer(v, &op, kv->k, true);
    vk_op_buffer(v, &op, kv->v, true);
    vk_op_u32(&op, n);
    vk_op_u32(&op, (uint32_t)k->ne[0]);
    vk_op_u32(&op, (uint32_t)kv->page_size);
    vk_op_u32(&op, (uint32_t)kv->n_pages);
    vk_op_u32(&op, (uint32_t)kv->n_kv_heads);
    vk_op_u32(&op, (uint32_t)kv->head_dim);
    vk_op_u32(&op, ko);
    vk_op_u32(&op, vo);
    vk_op_u32(&op, vk_table_word(&kv->store_tok));
    vk_op_u32(&op, vk_table_word(&kv->store_slot));
    vk_op_u32(&op, page_bytes(kv));
    vk_op_u32(&op, scale_off(kv));
    return vk_op_run(v, &op, n);
}

llmem_status vk_op_attention_q(llmem_backend *be, const llmem_attn_params *p,
                               const llmem_view *view, llmem_ct *q, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (kv->head_dim > 4 * QATTN_WG ||
        (uint64_t)page_bytes(kv) * (uint64_t)kv->n_pages > UINT32_MAX)
        return LLMEM_E_UNSUPPORTED;
    uint32_t n_tok = (uint32_t)q->ne[0], n_heads = (uint32_t)q->ne[1];
    vk_op op;
    vk_op_init(&op, VK_SH_ATTENTION_Q, QATTN_WG);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    uint32_t qo = vk_op_tensor(v, &op, q, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_buffer(v, &op, kv->k, false);
    vk_op_buffer(v, &op, kv->v, false);
    vk_op_u32(&op, n_tok);
    vk_op_u32(&op, n_heads);
    vk_op_u32(&op, (uint32_t)kv->n_kv_heads);
    vk_op_u32(&op, (uint32_t)kv->head_dim);
    vk_op_u32(&op, (uint32_t)kv->max_pages);
    vk_op_u32(&op, (uint32_t)kv->page_size);
    vk_op_u32(&op, (uint32_t)kv->n_pages);
    vk_op_u32(&op, (uint32_t)kv->seq_len.n);
    vk_op_i32(&op, p->window);
    vk_op_f32(&op, p->scale);
    vk_op_f32(&op, p->softcap);
    vk_op_u32(&op, qo);
    vk_op_u32(&op, oo);
    vk_op_u32(&op, vk_table_word(&kv->page_table));
    vk_op_u32(&op, vk_table_word(&kv->seq_len));
    vk_op_u32(&op, vk_table_word(&kv->tok_kv_len));
    vk_op_u32(&op, vk_table_word(&kv->tok_seq));
    vk_op_u32(&op, kv->page_off.n ? vk_table_word(&kv->page_off) : 0xffffffffu);
    vk_op_u32(&op, page_bytes(kv));
    vk_op_u32(&op, scale_off(kv));
    return vk_op_run(v, &op, (uint64_t)n_tok * n_heads);
}

/* llmem Vulkan backend: scaled 8-bit KV pools (int8, FP8 E4M3) and the int8
 * SSM state scan (shaders/ssm_scan_q.comp; issue 17).
 * The store (shaders/kv_store_q.comp) and paged attention
 * (shaders/attention_q.comp) of pools whose pages hold 1-byte codes and
 * per-head f32 scales (<llmem/view.h> llmem_kv_page_bytes; docs/memory.md,
 * "Quantized KV and state"). Pools must be one buffer chunk (a chunked pool
 * gives LLMEM_E_UNSUPPORTED through vk_op_buffer), page_size <= 256 and
 * head_dim <= 256. */
#include "backends/vulkan/vk_internal.h"
#include "backends/vulkan/vk_rs.h"

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
    uint32_t qo, oo;
    vk_attn_bind(v, &op, view, q, out, &qo, &oo);
    vk_op_u32(&op, n_tok);
    vk_op_u32(&op, n_heads);
    vk_op_u32(&op, (uint32_t)kv->n_kv_heads);
    vk_op_u32(&op, (uint32_t)kv->head_dim);
    vk_attn_push_kv(&op, kv, p, qo, oo);
    vk_op_u32(&op, kv->page_off.n ? vk_table_word(&kv->page_off) : 0xffffffffu);
    vk_op_u32(&op, page_bytes(kv));
    vk_op_u32(&op, scale_off(kv));
    return vk_op_run(v, &op, (uint64_t)n_tok * n_heads);
}

#define QSCAN_WG 128

/* One dispatch of ssm_scan_q.comp (mode 1: copy the sources to snap). */
static llmem_status scan_q_run(vk_backend *v, const llmem_ssm_params *p, const llmem_view *view,
                               int32_t state, llmem_ct *xbc, llmem_ct *dt, llmem_ct *a_log,
                               llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y, const vk_alloc *snap,
                               uint32_t mode)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    uint32_t hs = (uint32_t)p->head_dim * (uint32_t)p->d_state;
    /* llmem_state_slot_bytes (the plugin links no core function) */
    uint32_t elems = hs * (uint32_t)p->n_heads;
    uint32_t scale_off = (elems + 15u) & ~15u;
    uint32_t slot_bytes = (scale_off + 4u * (uint32_t)p->n_heads + 15u) & ~15u;
    vk_op op;
    vk_op_init(&op, VK_SH_SSM_SCAN_Q, QSCAN_WG);
    vk_op_spec(&op, hs);
    vk_op_spec(&op, (uint32_t)a_log->dtype);
    vk_op_spec(&op, d ? (uint32_t)d->dtype : 3u);
    vk_op_spec(&op, dt_bias ? (uint32_t)dt_bias->dtype : 3u);
    vk_op_spec(&op, snap ? 1u : 0u);
    vk_op_spec(&op, mode);
    vk_op_spec(&op, llmem_rs_view_snap_used(view) != NULL); /* SNAPSHOT */
    uint32_t xo = vk_op_tensor(v, &op, xbc, false);
    uint32_t dto = vk_op_tensor(v, &op, dt, false);
    uint32_t ao = vk_op_tensor(v, &op, a_log, false);
    uint32_t d_o = vk_op_tensor(v, &op, d, false);
    uint32_t bo = vk_op_tensor(v, &op, dt_bias, false);
    uint32_t yo = vk_op_tensor(v, &op, y, mode == 0);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_buffer(v, &op, rs->state[state], mode == 0);
    if (snap)
        vk_op_alloc(v, &op, snap, mode == 1);
    else
        vk_op_dummy(v, &op);
    vk_op_u32(&op, (uint32_t)rs->n_seqs);
    vk_op_u32(&op, (uint32_t)rs->n_seq_tokens);
    vk_op_u32(&op, (uint32_t)p->n_heads);
    vk_op_u32(&op, (uint32_t)p->head_dim);
    vk_op_u32(&op, (uint32_t)p->d_state);
    vk_op_u32(&op, (uint32_t)p->n_groups);
    vk_op_u32(&op, (uint32_t)rs->n_ckpt);
    vk_op_u32(&op, (uint32_t)rs->n_slots);
    vk_op_f32(&op, p->dt_min);
    vk_op_f32(&op, p->dt_max);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, dto);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, d_o);
    vk_op_u32(&op, bo);
    vk_op_u32(&op, yo);
    vk_rs_tables(&op, rs);
    vk_op_u32(&op, (uint32_t)(p->n_heads * p->head_dim + 2 * p->n_groups * p->d_state));
    vk_op_u32(&op, slot_bytes / 4u);
    vk_op_u32(&op, scale_off / 4u);
    vk_rs_snap_words(&op, view);
    return vk_op_run(v, &op, (uint64_t)rs->n_seqs * (uint64_t)p->n_heads);
}

llmem_status vk_op_ssm_scan_q(llmem_backend *be, const llmem_ssm_params *p,
                              const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                              llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y)
{
    vk_backend *v = vk_from(be);
    const llmem_rs_view *rs = llmem_view_rs(view);
    uint64_t hs = (uint64_t)p->head_dim * (uint64_t)p->d_state;
    /* one head's f32 state and the reduction in shared memory; 32-bit words */
    if ((hs + QSCAN_WG) * 4 > v->props.limits.maxComputeSharedMemorySize ||
        (uint64_t)rs->n_slots * (hs * (uint64_t)p->n_heads + 4u * (uint64_t)p->n_heads + 32u) >
            UINT32_MAX)
        return LLMEM_E_UNSUPPORTED;
    bool use_snap = false;
    llmem_status st = vk_rs_needs_snapshot(rs, &use_snap);
    if (st != LLMEM_OK)
        return st;
    if (!use_snap)
        return scan_q_run(v, p, view, state, xbc, dt, a_log, d, dt_bias, y, NULL, 0);
    vk_alloc snap = {0};
    if ((st = vk_alloc_make(v, (VkDeviceSize)rs->n_seqs * p->n_heads * hs * 4, &snap)) != LLMEM_OK)
        return st;
    st = scan_q_run(v, p, view, state, xbc, dt, a_log, d, dt_bias, y, &snap, 1);
    if (st == LLMEM_OK)
        st = scan_q_run(v, p, view, state, xbc, dt, a_log, d, dt_bias, y, &snap, 0);
    vk_alloc_release(v, &snap);
    return st;
}

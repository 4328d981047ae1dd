/* llmem Vulkan backend: the prefill attention on cooperative matrices
 * (shaders/attention_prefill_cm.comp; FlashAttention-2, Dao 2023, Alg. 1, over
 * the paged pool of PagedAttention, Kwon et al. SOSP 2023). vk_op_attention_paged
 * (vk_ops_attention.c) offers every call to vk_attn_pf first; the calls it does
 * not take run attention_decode.comp / attention.comp there.
 */
#include "vk_internal.h"

/* The prefill attention on cooperative matrices (shaders/attention_prefill_cm.comp):
 * LLMEM_VULKAN_ATTN_PF 0 off; 1 (default) fast-mode ubatches (p->fast) on the KHR module;
 * 2 precise-mode ones too (measuring, as LLMEM_CUDA_ATTN_FAST=1 on cuda); 3 the EMU module
 * (scalar loops in place of the matrix operations, any device: tests on lavapipe) for every
 * call whose shape fits. Ubatches of at least PF_TOKENS tokens a run of one stream's tokens
 * (prefill, not decode batches), f16 / bf16 pools of one chunk, head dims 64 and 128. */
#define PF_WG 256     /* 8 subgroups of 16 rows: tiles of 128 (token, head) rows (default) */
#define PF_BN 32      /* keys a block (the shader's BN) */
#define PF_TOKENS 16  /* tokens a stream's run, on average, from which the route is taken */
#define PF_DEFAULT 1

/* Bytes of shared memory of attention_prefill_cm.comp at workgroup wg and head dim d (its
 * NSH uvec4s, row tables and pass words; EMU's pair exchange too). */
static uint32_t attn_pf_smem(uint32_t wg, uint32_t d, bool emu)
{
    uint32_t bm = 16 * (wg / 32), ldk = d / 8 + 1;
    uint32_t nsh = 2 * PF_BN * ldk + (wg / 32) * 16 * (PF_BN / 4 + 1);
    nsh = nsh > bm * ldk ? nsh : bm * ldk;
    return nsh * 16 + bm * 16 + 32 + (emu ? wg * 4 : 0);
}

/* The module and workgroup size (*wg) of the prefill attention for this call, or VK_SH_COUNT
 * where attention_decode.comp runs it (see PF_WG). */
static vk_shader_id attn_pf_pick(const vk_backend *v, const llmem_attn_params *p,
                                 const llmem_kv_view *kv, uint32_t n_tok, uint32_t *wg)
{
    long mode = VK_KNOB(v, attn_pf, PF_DEFAULT);
    uint32_t d = (uint32_t)kv->head_dim;
    if (mode == 0 || (mode == 1 && !p->fast))
        return VK_SH_COUNT;
    if ((kv->dtype != LLMEM_DTYPE_F16 && kv->dtype != LLMEM_DTYPE_BF16) || (d != 64 && d != 128))
        return VK_SH_COUNT;
    if (vk_buf(kv->k)->n_chunks != 1 || vk_buf(kv->v)->n_chunks != 1)
        return VK_SH_COUNT;
    /* runs of consecutive tokens of one stream (a stream's tokens come together) */
    const int32_t *ts = kv->tok_seq.host;
    if (!ts || kv->tok_seq.n != (int32_t)n_tok)
        return VK_SH_COUNT;
    uint32_t runs = 1;
    for (uint32_t i = 1; i < n_tok; i++)
        runs += ts[i] != ts[i - 1];
    if (n_tok < (uint64_t)PF_TOKENS * runs)
        return VK_SH_COUNT;
    /* PF_WG invocations (LLMEM_VULKAN_ATTN_PF_WG), or 128 where that does not fit (lavapipe's
     * 32 KiB at d 128) */
    uint32_t lim = v->props.limits.maxComputeSharedMemorySize;
    *wg = (uint32_t)VK_KNOB(v, attn_pf_wg, PF_WG);
    *wg = attn_pf_smem(*wg, d, mode == 3) <= lim ? *wg : 128;
    if (attn_pf_smem(*wg, d, mode == 3) > lim)
        return VK_SH_COUNT;
    if (mode == 3)
        return VK_SH_ATTENTION_PREFILL_EMU;
    if (!v->coopmat_khr || !v->sg_shuffle ||
        vk_shader_codes[VK_SH_ATTENTION_PREFILL_CM_KHR].size < 20)
        return VK_SH_COUNT;
    return VK_SH_ATTENTION_PREFILL_CM_KHR;
}

/* One dispatch of attention_prefill_cm.comp (module sh): workgroups of PF_WG over (token
 * tiles, chunks of query heads, KV heads), long tiles first; see the shader for the rest. */
static llmem_status attn_pf_run(vk_backend *v, vk_shader_id sh, uint32_t wg,
                                const llmem_attn_params *p, const llmem_view *view, llmem_ct *q,
                                llmem_ct *out)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    uint32_t n_tok = (uint32_t)q->ne[0], n_heads = (uint32_t)q->ne[1];
    uint32_t n_kv = (uint32_t)kv->n_kv_heads, n_rep = n_heads / n_kv;
    uint32_t bm = 16 * (wg / 32);
    uint32_t hh = n_rep < bm ? n_rep : bm, tt = bm / hh;
    uint32_t n_hc = (n_rep + hh - 1) / hh, n_tiles = (n_tok + tt - 1) / tt;
    vk_op op;
    vk_op_init(&op, sh, wg);
    vk_op_spec(&op, (uint32_t)kv->head_dim);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    uint32_t qo = vk_op_tensor(v, &op, q, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_buffer(v, &op, kv->k, false);
    vk_op_buffer(v, &op, kv->v, false);
    vk_op_u32(&op, n_tok);
    vk_op_u32(&op, n_heads);
    vk_op_u32(&op, n_kv);
    vk_op_u32(&op, n_rep);
    vk_op_u32(&op, hh);
    vk_op_u32(&op, tt);
    vk_op_u32(&op, n_hc);
    vk_op_u32(&op, n_tiles);
    vk_attn_push_kv(&op, kv, p, qo, oo);
    vk_op_u32(&op, kv->page_off.n ? vk_table_word(&kv->page_off) : 0xffffffffu);
    return vk_op_run(v, &op, (uint64_t)n_tiles * n_hc * n_kv);
}

llmem_status vk_attn_pf(vk_backend *v, const llmem_attn_params *p, const llmem_view *view,
                        llmem_ct *q, llmem_ct *out, bool *taken)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    uint32_t wg = PF_WG;
    vk_shader_id sh = attn_pf_pick(v, p, kv, (uint32_t)q->ne[0], &wg);
    *taken = sh != VK_SH_COUNT;
    return *taken ? attn_pf_run(v, sh, wg, p, view, q, out) : LLMEM_OK;
}

/* llmem Vulkan backend: the prefill attention on cooperative matrices
 * (shaders/attention_prefill_cm.comp; FlashAttention-2, Dao 2023, Alg. 1, over
 * the paged pool of PagedAttention, Kwon et al. SOSP 2023). vk_op_attention_paged
 * (vk_ops_attention.c) offers every call to vk_attn_pf first; the calls it does
 * not take run attention_decode.comp / attention.comp there.
 */
#include "vk_internal.h"

/* The prefill attention on cooperative matrices (shaders/attention_prefill_cm.comp):
 * LLMEM_VULKAN_ATTN_PF 0 off; 1 (default) fast-mode ubatches (p->fast), and precise-mode ones
 * over f16 pools on the CM2 module (LLMEM_VULKAN_ATTN_PF_PRECISE, default 1; H200: 5.0 ms
 * against attention_decode.comp's 18.6 at the bench shape); 2 precise-mode ones with the fast
 * arithmetic too (measuring, as LLMEM_CUDA_ATTN_FAST=1 on cuda); 3 the EMU modules (scalar
 * loops in place of the matrix operations, any device: tests on lavapipe) for every call whose
 * shape fits. Ubatches of at least PF_TOKENS tokens a run of one stream's tokens (prefill, not
 * decode batches), f16 / bf16 pools of one chunk, head dims 64 and 128.
 * Two modules: the KHR one (S / P through shared memory) and, where the device has
 * VK_NV_cooperative_matrix2's row reductions and conversions, its CM2 build
 * (LLMEM_VULKAN_ATTN_PF_CM2: P in registers, a two-stage K / V ring, and the precise
 * arithmetic: q * scale and P as hi + lo f16 terms, f16 pools only). Fast-arithmetic calls
 * whose tiles each hold one stream's tokens run shaders/attention_prefill_fa.comp instead
 * (LLMEM_VULKAN_ATTN_PF_FA bit 1, default 139: one pass a tile; bit 2 its lazy rescale, bit 4
 * K / V fragments straight from f16 pools of pages of >= 16 keys, bit 8 blocks of 64 keys, bit 16
 * its K / V ring refilled in halves, bit 32 the next block's V rows fetched after the softmax,
 * bit 64 the Q tile's loads first, bit 128 O's loops written out; head dim 128 where the device
 * also has coopmat2's per-element operations; its EMU module under mode 3). */
#define PF_WG 256     /* 8 subgroups of 16 rows: tiles of 128 (token, head) rows (default) */
#define PF_BN 32      /* keys a block (the shader's BN) */
#define PF_TOKENS 16  /* tokens a stream's run, on average, from which the route is taken */
#define PF_DEFAULT 1
#define PF_CM2_DEFAULT 1     /* the CM2 module where the device runs it (H200: 4.76 ms
                              * against the KHR module's 5.43, docs/benchmarks.md) */
#define PF_STAGES 2          /* its K / V stages (2: the ring) */
#define PF_PRECISE_DEFAULT 1 /* precise-mode calls on the CM2 module's hi + lo arithmetic */
#define PF_FA_DEFAULT 139    /* attention_prefill_fa.comp for the calls it takes, with its lazy
                              * rescale, 64-key blocks and O's loops written out (H200 bench
                              * shape, fast: 1.70 ms against 2.84 without the last, CUDA's
                              * 0.88; the CM2 module's 4.30) */
/* LLMEM_VULKAN_ATTN_PF_FA's bits (attention_prefill_fa.comp's FAV): the module on, its lazy
 * rescale, direct K / V loads, 64-key blocks, ring refilled in halves, V rows fetched after
 * the softmax, the Q tile's loads first, O's loops written out */
enum {
    FA_ON = 1,
    FA_LAZY = 2,
    FA_DIRECT = 4,
    FA_B64 = 8,
    FA_KV_SEP = 16,
    FA_VLATE = 32,
    FA_QFIRST = 64,
    FA_OUNR = 128,
};
#define PF_VAR_DEFAULT 259   /* the shader's VAR bits (LLMEM_VULKAN_ATTN_PF_VAR): page ids by
                              * shifts, O's rescale by 1 skipped (H200: precise 5.03 -> 4.39-4.51
                              * ms with the Q tile read once, fast 4.77 -> 4.34-4.45), the CM2
                              * module's loops over Q and O written out (precise 4.37 -> 3.02) */

/* What runs a call: the module, its workgroup (invocations), SPLIT (1 fast, 2 precise),
 * STAGES, VAR (variant bits) and PSL (log2 of a power-of-two page size where VAR & 1, else 32):
 * the shader's specialization constants 3 to 6. */
typedef struct pf_cfg {
    vk_shader_id sh;
    uint32_t wg, split, stages, var, psl;
    bool fa; /* attention_prefill_fa.comp: its own constants (attn_pf_run) */
    uint32_t fav; /* its FAV: LLMEM_VULKAN_ATTN_PF_FA's bits 2 and up where the call has them */
} pf_cfg;

/* Bytes of shared memory of attention_prefill_cm.comp at workgroup wg and head dim d (its
 * NSH uvec4s, row tables and pass words; EMU's exchanges too). */
static uint32_t attn_pf_smem(uint32_t wg, uint32_t d, bool emu, bool cm2, uint32_t stages)
{
    uint32_t nw = wg / 32, bm = 16 * nw, ldk = d / 8 + 1, kvt = PF_BN * ldk;
    uint32_t nsh = cm2 ? stages * 2 * kvt : 2 * kvt + nw * 16 * (PF_BN / 4 + 1);
    nsh = cm2 && nsh < nw * 80 ? nw * 80 : nsh;
    nsh = nsh > bm * ldk ? nsh : bm * ldk;
    return nsh * 16 + bm * 16 + 36 + (emu ? wg * 4 : 0) + (emu && cm2 ? wg * 32 : 0);
}

/* Bytes of shared memory of attention_prefill_fa.comp at blocks of bn keys (its NSH uvec4s, row
 * bounds, pass and bad-page words; EMU's exchanges). */
static uint32_t attn_fa_smem(uint32_t wg, uint32_t d, bool emu, uint32_t stages, uint32_t bn)
{
    uint32_t nw = wg / 32, bm = 16 * nw, ldk = d / 8 + 1, kvt = bn * ldk;
    uint32_t nsh = stages * 2 * kvt > nw * 80 ? stages * 2 * kvt : nw * 80;
    nsh = nsh > bm * ldk ? nsh : bm * ldk;
    return nsh * 16 + bm * 8 + 48 + (emu ? wg * 4 + wg * 32 : 0);
}

/* One step down when a module's shared memory does not fit the device: one stage first, then
 * 128 invocations (lavapipe's 32 KiB); false when nothing smaller is left. */
static bool pf_shrink(pf_cfg *c)
{
    if (c->stages > 1)
        c->stages = 1;
    else if (c->wg > 128)
        c->wg = 128;
    else
        return false;
    return true;
}

/* Whether every tile of tt consecutive tokens holds one stream's tokens (ts: the tokens'
 * streams, n_tok of them): attention_prefill_fa.comp runs one pass a tile. */
static bool tiles_one_stream(const int32_t *ts, uint32_t n_tok, uint32_t tt)
{
    for (uint32_t t0 = 0; t0 < n_tok; t0 += tt) {
        uint32_t end = n_tok - t0 > tt ? t0 + tt : n_tok;
        for (uint32_t i = t0 + 1; i < end; i++)
            if (ts[i] != ts[t0])
                return false;
    }
    return true;
}

/* log2 of kv's page size where it is a power of two, else 32 (the shaders' PSL) */
static uint32_t page_log2(const llmem_kv_view *kv)
{
    uint32_t ps = (uint32_t)kv->page_size, l = 0;
    if (ps == 0 || (ps & (ps - 1)) != 0)
        return 32;
    while ((1u << l) < ps)
        l++;
    return l;
}

/* attention_prefill_fa.comp for a fast-arithmetic call (mode 1 fast, mode 2 any, mode 3 its
 * EMU module), where LLMEM_VULKAN_ATTN_PF_FA asks for it, the device runs it and the tiles
 * each hold one stream's tokens; false leaves the call to the other modules. */
static bool attn_fa_pick(const vk_backend *v, const llmem_attn_params *p,
                         const llmem_kv_view *kv, uint32_t n_tok, uint32_t n_heads, long mode,
                         pf_cfg *c)
{
    uint32_t d = (uint32_t)kv->head_dim;
    long fa = VK_KNOB(v, attn_pf_fa, PF_FA_DEFAULT);
    if ((fa & FA_ON) == 0 || (!p->fast && mode != 2))
        return false;
    if (mode == 3) {
        c->sh = VK_SH_ATTENTION_PREFILL_FA_EMU;
    } else {
        const vk_cm2_features *f = &v->cm2.features;
        if (d != 128 || !v->coopmat_khr || !v->coopmat2 || !v->subgroup ||
            v->subgroup_size != 32 || !f->cooperativeMatrixReductions ||
            !f->cooperativeMatrixConversions || !f->cooperativeMatrixPerElementOperations ||
            vk_shader_codes[VK_SH_ATTENTION_PREFILL_FA_KHR].size < 20)
            return false;
        c->sh = VK_SH_ATTENTION_PREFILL_FA_KHR;
    }
    uint32_t lim = v->props.limits.maxComputeSharedMemorySize;
    c->wg = (uint32_t)VK_KNOB(v, attn_pf_wg, PF_WG);
    c->stages = (uint32_t)VK_KNOB(v, attn_pf_stages, PF_STAGES);
    /* the variant's bits: direct loads for f16 pools of pages of 2^k >= 16 keys (a 16-key group
     * of a block in one page); 64-key blocks, the ring in halves and V late with the ring only;
     * the first two in one stage, 64-key blocks back to 32 where their stage does not fit */
    c->fav = (uint32_t)fa & (FA_LAZY | FA_DIRECT | FA_B64 | FA_KV_SEP | FA_VLATE | FA_QFIRST |
                             FA_OUNR);
    uint32_t psl = page_log2(kv);
    if (kv->dtype != LLMEM_DTYPE_F16 || psl < 4 || psl >= 32)
        c->fav &= ~(uint32_t)FA_DIRECT;
    if (c->fav & FA_DIRECT)
        c->fav &= ~(uint32_t)(FA_B64 | FA_KV_SEP | FA_VLATE);
    if (c->fav & (FA_B64 | FA_KV_SEP))
        c->stages = 1;
    if ((c->fav & FA_B64) && attn_fa_smem(c->wg, d, mode == 3, 1, 64) > lim)
        c->fav &= ~(uint32_t)FA_B64;
    while (attn_fa_smem(c->wg, d, mode == 3, c->stages, (c->fav & FA_B64) ? 64 : PF_BN) > lim)
        if (!pf_shrink(c))
            return false;
    if (mode != 3 && c->wg != PF_WG)
        return false; /* the real module is built for PF_WG invocations */
    uint32_t bm = 16 * (c->wg / 32), n_rep = n_heads / (uint32_t)kv->n_kv_heads;
    uint32_t hh = n_rep < bm ? n_rep : bm;
    if (!tiles_one_stream(kv->tok_seq.host, n_tok, bm / hh))
        return false;
    c->split = 1;
    c->var = 0;
    c->fa = true;
    c->psl = psl;
    return true;
}

/* Whether the prefill attention takes this call, and how (*c); false where
 * attention_decode.comp runs it (see above). */
static bool attn_pf_pick(const vk_backend *v, const llmem_attn_params *p,
                         const llmem_kv_view *kv, uint32_t n_tok, uint32_t n_heads, pf_cfg *c)
{
    long mode = VK_KNOB(v, attn_pf, PF_DEFAULT);
    uint32_t d = (uint32_t)kv->head_dim;
    if (mode == 0)
        return false;
    if ((kv->dtype != LLMEM_DTYPE_F16 && kv->dtype != LLMEM_DTYPE_BF16) || (d != 64 && d != 128))
        return false;
    if (vk_buf(kv->k)->n_chunks != 1 || vk_buf(kv->v)->n_chunks != 1)
        return false;
    /* runs of consecutive tokens of one stream (a stream's tokens come together) */
    const int32_t *ts = kv->tok_seq.host;
    if (!ts || kv->tok_seq.n != (int32_t)n_tok)
        return false;
    uint32_t runs = 1;
    for (uint32_t i = 1; i < n_tok; i++)
        runs += ts[i] != ts[i - 1];
    if (n_tok < (uint64_t)PF_TOKENS * runs)
        return false;
    c->fa = false;
    if (attn_fa_pick(v, p, kv, n_tok, n_heads, mode, c))
        return true;
    bool khr = v->coopmat_khr && v->sg_shuffle &&
               vk_shader_codes[VK_SH_ATTENTION_PREFILL_CM_KHR].size >= 20;
    bool cm2_dev = khr && v->coopmat2 && v->cm2.features.cooperativeMatrixReductions &&
                   v->cm2.features.cooperativeMatrixConversions &&
                   vk_shader_codes[VK_SH_ATTENTION_PREFILL_CM2_KHR].size >= 20;
    bool cm2 = VK_KNOB(v, attn_pf_cm2, PF_CM2_DEFAULT) != 0 && (mode == 3 || cm2_dev);
    c->split = 1;
    if (!p->fast && mode != 2) {
        /* precise arithmetic: the CM2 module over f16 pools (bf16 -> f16 is exact only within
         * f16's normal range); the plain EMU module keeps the fast arithmetic for mode 3 */
        if (mode == 1 && VK_KNOB(v, attn_pf_precise, PF_PRECISE_DEFAULT) == 0)
            return false;
        if (cm2 && kv->dtype != LLMEM_DTYPE_F16)
            return false;
        if (!cm2 && mode != 3)
            return false;
        c->split = cm2 ? 2 : 1;
    }
    if (mode == 3)
        c->sh = cm2 ? VK_SH_ATTENTION_PREFILL_EMU2 : VK_SH_ATTENTION_PREFILL_EMU;
    else if (cm2)
        c->sh = VK_SH_ATTENTION_PREFILL_CM2_KHR;
    else if (khr)
        c->sh = VK_SH_ATTENTION_PREFILL_CM_KHR;
    else
        return false;
    /* PF_WG invocations (LLMEM_VULKAN_ATTN_PF_WG) and PF_STAGES (_STAGES), made smaller by
     * pf_shrink where that does not fit the device's shared memory */
    uint32_t lim = v->props.limits.maxComputeSharedMemorySize;
    c->wg = (uint32_t)VK_KNOB(v, attn_pf_wg, PF_WG);
    c->stages = cm2 ? (uint32_t)VK_KNOB(v, attn_pf_stages, PF_STAGES) : 1;
    /* VAR (LLMEM_VULKAN_ATTN_PF_VAR): bits 2, 32, 64, 128, 256 are the CM2 module's only */
    c->var = (uint32_t)VK_KNOB(v, attn_pf_var, PF_VAR_DEFAULT);
    if (!cm2)
        c->var &= 1u | 16u;
    c->psl = (c->var & 1u) ? page_log2(kv) : 32;
    while (attn_pf_smem(c->wg, d, mode == 3, cm2, c->stages) > lim)
        if (!pf_shrink(c))
            return false;
    return true;
}

/* One dispatch of attention_prefill_cm.comp (c): workgroups of c->wg over (token
 * tiles, chunks of query heads, KV heads), long tiles first; see the shader for the rest. */
static llmem_status attn_pf_run(vk_backend *v, const pf_cfg *c, const llmem_attn_params *p,
                                const llmem_view *view, llmem_ct *q, llmem_ct *out)
{
    uint32_t wg = c->wg;
    const llmem_kv_view *kv = llmem_view_kv(view);
    uint32_t n_tok = (uint32_t)q->ne[0], n_heads = (uint32_t)q->ne[1];
    uint32_t n_kv = (uint32_t)kv->n_kv_heads, n_rep = n_heads / n_kv;
    uint32_t bm = 16 * (wg / 32);
    uint32_t hh = n_rep < bm ? n_rep : bm, tt = bm / hh;
    uint32_t n_hc = (n_rep + hh - 1) / hh, n_tiles = (n_tok + tt - 1) / tt;
    vk_op op;
    vk_op_init(&op, c->sh, wg);
    uint32_t qo, oo;
    vk_attn_bind(v, &op, view, q, out, &qo, &oo);
    vk_op_spec(&op, (uint32_t)kv->head_dim);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    if (c->fa) {
        /* attention_prefill_fa.comp: STAGES, SOFTCAP, PSL, VEC (16-byte Q and O vectors where
         * the bindings start on 16 bytes and both tensors 4 floats into them), FAV (the
         * variant's bits) */
        vk_op_spec(&op, c->stages);
        vk_op_spec(&op, p->softcap > 0.0f ? 1u : 0u);
        vk_op_spec(&op, c->psl);
        vk_op_spec(&op, v->storage_align % 16 == 0 && qo % 4 == 0 && oo % 4 == 0 ? 1u : 0u);
        vk_op_spec(&op, c->fav);
    } else {
        vk_op_spec(&op, c->split);
        vk_op_spec(&op, c->stages);
        vk_op_spec(&op, c->var);
        vk_op_spec(&op, c->psl);
    }
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
    pf_cfg c;
    *taken = attn_pf_pick(v, p, llmem_view_kv(view), (uint32_t)q->ne[0], (uint32_t)q->ne[1], &c);
    return *taken ? attn_pf_run(v, &c, p, view, q, out) : LLMEM_OK;
}

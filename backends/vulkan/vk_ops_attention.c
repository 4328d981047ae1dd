/* llmem Vulkan backend: storing K/V into pages and causal paged attention
 * (PagedAttention, Kwon et al. SOSP 2023; FlashAttention-2, Dao 2023,
 * Alg. 1). The shaders (shaders/kv_store.comp, shaders/attention*.comp)
 * read the view's index tables straight from its device index buffer and
 * bound-check every index they read, so no table is uploaded and no slot
 * outside [0, seq_len) of a stream is touched. Decode batches split each
 * query's keys over several workgroups and merge the partial softmax
 * states (flash-decoding, as in FlashAttention-2's split-KV decode).
 *
 * Two attention shaders with the same bindings and push constants:
 * attention_decode.comp loads K/V rows as 16-byte vectors and serves every
 * row of a whole number of them (head_dim a multiple of 8 for f16/bf16, of
 * 4 for f32); attention.comp (element loads) serves the other head dims.
 * attention_decode_st.comp (subgroups streaming their keys, no barrier in
 * the loop; same bindings) takes those rows of decode batches by default on
 * NVIDIA devices,
 * attention_decode.comp's subgroup module (shuffles for its sums) where
 * LLMEM_VULKAN_DEC_ATTN asks for it (dec_attn_pick).
 */
#include "vk_internal.h"

#define STORE_WG 256
#define ATTN_WG 128
#define ATTN_BK 64     /* keys per online-softmax block (<= ATTN_WG) */
#define ATTN_QS 2048   /* floats of shared memory for the queries of a workgroup */
#define ATTN_RMAX 8    /* query heads of one GQA group per workgroup */
#define DEC_RMAX 4     /* the same for attention_decode.comp (a power of two) */
#define DEC_CK 256     /* keys per online-softmax chunk of attention_decode.comp */
/* Key splits (flash-decoding, for decode batches that give too few
 * workgroups to fill a GPU): used when the work items number fewer than
 * SPLIT_ITEMS and some query sees more than 2 * SPLIT_KEYS keys. */
#define SPLIT_ITEMS 2048
#define SPLIT_KEYS 512
#define SPLIT_KEYS_ST 1024 /* attention_decode_st.comp's where they give SPLIT_ST_WGS groups */
#define SPLIT_ST_WGS 2048
#define SPLIT_MAX 64
#define KEY_BUCKET 256 /* as models/decode_graph.c's KV_BUCKET */
#define COMBINE_WG 128
/* The decode attention's module where LLMEM_VULKAN_DEC_ATTN is unset: attention_decode_st.comp
 * on NVIDIA devices (measured there: 1.4x the plain module at the bench shape, docs/
 * benchmarks.md "Vulkan decode attention streamed by subgroups"), the plain module elsewhere. */
#define DEC_ATTN_NVIDIA 3
#define DEC_ATTN_OTHER 0
#define VENDOR_NVIDIA 0x10de
/* calls of at most DEC_TOKENS tokens a stream of the view are decode batches (the default
 * above measured there; prefill ubatches keep the plain module unless asked) */
#define DEC_TOKENS 4
/* ... of at least DEC_ST_ITEMS work items (tokens x KV heads x chunks of query heads) on f16 /
 * bf16 pools: with fewer, a workgroup of DEC_ST_WG invocations streaming its keys has a quarter
 * of the plain module's lanes in flight, and f32 pools were not measured: the 2b shape's batch-1
 * decode (8 items, 16 / 8 heads) took +0.17 ms a step fast (bf16 pool) and +0.40 precise (f32)
 * with attention_decode_st.comp, where the 16- and 64-row batches (128 and 512 items) gained or
 * kept their time (docs/benchmarks.md, "Final check of the seventeenth session") */
#define DEC_ST_ITEMS 64
/* attention_decode.comp's subgroup module (LLMEM_VULKAN_DEC_ATTN=1 chunks, 2 streaming
 * groups): its keys per group and round (LLMEM_VULKAN_DEC_KPG) in each loop */
#define DEC_KPG 4
#define DEC_KPG_GS 2
/* attention_decode_st.comp (LLMEM_VULKAN_DEC_ATTN=3): keys a lane loads a step
 * (LLMEM_VULKAN_DEC_KPG), its workgroup (LLMEM_VULKAN_DEC_WG), variant bits
 * (LLMEM_VULKAN_DEC_ST, the shader's VAR) and L2 prefetch, steps ahead
 * (LLMEM_VULKAN_DEC_ATTN_PF, 0 off). VAR 8 (PTB): the page-table words loaded a block of
 * steps ahead, 13% / 8% / 8% faster than VAR 0 at pages of 1 / 16 / 64 of the bench shape on
 * the H200 (docs/benchmarks.md, "Vulkan decode attention: the page-table words a block
 * ahead"); VAR 32 (WO): the loops over the queries, accumulators, partials and loads written
 * out with literal indices, the same bits: at two query heads a workgroup (the Bamba-2B
 * layer) the driver kept loops over the heads rolled and those arrays in local memory (400
 * bytes), 1.71 -> 0.32 ms at the bench shape with 16/8 heads on bf16 (CUDA 0.26); at four,
 * unchanged (docs/benchmarks.md, "Vulkan: register arrays out of local memory") */
#define DEC_KPL 2
#define DEC_ST_WG 64
#define DEC_ST_VAR 40
#define DEC_ATTN_PFD 0

void vk_attn_push_kv(vk_op *op, const llmem_kv_view *kv, const llmem_attn_params *p, uint32_t qo,
                     uint32_t oo)
{
    vk_op_u32(op, kv->page_off.n ? 0xffffffffu : (uint32_t)kv->max_pages);
    vk_op_u32(op, (uint32_t)kv->page_size);
    vk_op_u32(op, (uint32_t)kv->n_pages);
    vk_op_u32(op, (uint32_t)kv->seq_len.n);
    vk_op_i32(op, p->window);
    vk_op_f32(op, p->scale);
    vk_op_f32(op, p->softcap);
    vk_op_u32(op, qo);
    vk_op_u32(op, oo);
    vk_op_u32(op, vk_table_word(&kv->page_table));
    vk_op_u32(op, vk_table_word(&kv->seq_len));
    vk_op_u32(op, vk_table_word(&kv->tok_kv_len));
    vk_op_u32(op, vk_table_word(&kv->tok_seq));
}

void vk_attn_bind(vk_backend *v, vk_op *op, const llmem_view *view, llmem_ct *q,
                  llmem_ct *out, uint32_t *qo, uint32_t *oo)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    *qo = vk_op_tensor(v, op, q, false);
    *oo = vk_op_tensor(v, op, out, true);
    vk_op_buffer(v, op, view->idx, false);
    vk_op_buffer(v, op, kv->k, false);
    vk_op_buffer(v, op, kv->v, false);
}

/* The decode attention's module (LLMEM_VULKAN_DEC_ATTN), its workgroup and, for the subgroup
 * modules, specialization constants 6.. (attention_decode_sg: KPG_SG and GS;
 * attention_decode_st: KPL, SGS, VAR and PFD). */
typedef struct dec_pick {
    vk_shader_id sh;
    uint32_t wg;
    uint32_t n_spec; /* 0, 2 or 4 */
    uint32_t spec[4];
} dec_pick;

/* Keys a split where LLMEM_VULKAN_DEC_SPLIT_KEYS is unset, for `items` work items whose longest
 * query sees max_len keys: SPLIT_KEYS, or SPLIT_KEYS_ST for attention_decode_st.comp where
 * those splits still give at least SPLIT_ST_WGS workgroups (fewer merges; measured at the bench
 * shape's 2048, docs/benchmarks.md; smaller batches keep the smaller splits' parallelism). */
static int32_t split_keys_default(vk_shader_id sh, uint64_t items, int32_t max_len)
{
    if (sh != VK_SH_ATTENTION_DECODE_ST)
        return SPLIT_KEYS;
    uint64_t n = (uint64_t)(max_len + SPLIT_KEYS_ST - 1) / SPLIT_KEYS_ST;
    n = n > SPLIT_MAX ? SPLIT_MAX : n;
    return items * n >= SPLIT_ST_WGS ? SPLIT_KEYS_ST : SPLIT_KEYS;
}

/* The module for rows of nv 16-byte vectors of ev elements at r query heads a workgroup:
 *  0 (the default but for decode batches on NVIDIA) attention_decode.comp's plain module at
 *    ATTN_WG;
 *  1 | 2 its subgroup module (GS = 1 for 2 where kpg x r <= nv);
 *  3 (the default on NVIDIA for decode batches, `decode`, of at least DEC_ST_ITEMS work
 *    items on 16-bit pools, ev 8) attention_decode_st.comp
 *    (subgroups streaming their keys) at DEC_ST_WG, KPL the largest power of two up to
 *    LLMEM_VULKAN_DEC_KPG (default DEC_KPL) with KPL x r <= nv, variant bits
 *    LLMEM_VULKAN_DEC_ST (default DEC_ST_VAR), L2 prefetch LLMEM_VULKAN_DEC_ATTN_PF steps
 *    ahead (default DEC_ATTN_PFD);
 * each where the device runs it (shuffles in compute shaders, nv a power of two within a
 * subgroup of at most 64 lanes, a workgroup of whole subgroups, the shared memory within the
 * limit), else the plain module. */
static dec_pick dec_attn_pick(const vk_backend *v, uint32_t nv, uint32_t ev, uint32_t r,
                              bool decode, uint64_t items)
{
    dec_pick pk = {VK_SH_ATTENTION_DECODE, ATTN_WG, 0, {0, 0, 0, 0}};
    bool st_default = v->props.vendorID == VENDOR_NVIDIA && decode && items >= DEC_ST_ITEMS &&
                      ev == 8;
    long mode = VK_KNOB(v, dec_attn, st_default ? DEC_ATTN_NVIDIA : DEC_ATTN_OTHER);
    if (mode == 0 || !v->subgroup || !v->sg_shuffle)
        return pk;
    uint32_t sgs = v->subgroup_size;
    uint32_t w = (uint32_t)VK_KNOB(v, dec_wg, mode == 3 ? DEC_ST_WG : ATTN_WG);
    if ((nv & (nv - 1)) != 0 || sgs == 0 || nv > sgs || sgs % r != 0 || w % sgs != 0 ||
        w > v->props.limits.maxComputeWorkGroupInvocations)
        return pk;
    uint32_t lim = v->props.limits.maxComputeSharedMemorySize;
    if (mode == 3) {
        uint32_t kpl = (uint32_t)VK_KNOB(v, dec_kpg, DEC_KPL);
        while (kpl > 1 && kpl * r > nv)
            kpl /= 2;
        uint32_t var = (uint32_t)VK_KNOB(v, dec_st, DEC_ST_VAR);
        /* sm_acc, sm_m, sm_l, q_s (VAR bit 1) and common.glsl's red_f */
        uint32_t nsg = w / sgs, bytes = nsg * r * (nv * ev + 2) * 4 + w * 4;
        bytes += (var & 1) ? r * nv * ev * 4 : 0;
        if (kpl * r > nv || sgs > 64 || bytes > lim)
            return pk;
        uint32_t pfd = (uint32_t)VK_KNOB(v, dec_attn_pf, DEC_ATTN_PFD);
        return (dec_pick){VK_SH_ATTENTION_DECODE_ST, w, 4, {kpl, sgs, var, pfd}};
    }
    /* kb_s, sc, red (the shader's RED), range_s and common.glsl's red_f */
    uint32_t red = (w / nv / 2) * nv * r * ev;
    red = red > w ? red : w;
    uint32_t bytes = DEC_CK * 4 + DEC_CK * r * 4 + red * 4 + 8 + w * 4;
    if (bytes > lim)
        return pk;
    uint32_t kpg = (uint32_t)VK_KNOB(v, dec_kpg, mode == 2 ? DEC_KPG_GS : DEC_KPG);
    return (dec_pick){VK_SH_ATTENTION_DECODE_SG, w, 2, {kpg, mode == 2 && kpg * r <= nv, 0, 0}};
}

llmem_status vk_op_kv_store(llmem_backend *be, const llmem_view *view, llmem_ct *k, llmem_ct *vv)
{
    vk_backend *v = vk_from(be);
    const llmem_kv_view *kv = llmem_view_kv(view);
    bool taken = false; /* the ropes of q and k held for this store (vk_ops_rope.c) */
    llmem_status rs = vk_rope_store_take(v, view, k, vv, &taken);
    if (rs != LLMEM_OK || taken)
        return rs;
    if (vk_dtype_scaled(kv->dtype)) /* int8 / fp8 pools: vk_ops_quant.c */
        return vk_op_kv_store_q(be, view, k, vv);
    uint32_t row = (uint32_t)kv->n_kv_heads * (uint32_t)kv->head_dim;
    uint32_t n = (uint32_t)kv->store_slot.n;
    /* 16-bit pools with even rows: one invocation per pool word */
    uint32_t pairs = kv->dtype != LLMEM_DTYPE_F32 && row % 2 == 0;
    vk_op op;
    vk_op_init(&op, VK_SH_KV_STORE, STORE_WG);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    /* pools of 2 to 4 chunks: chunk bindings selected per store */
    const vk_buffer *kb = vk_buf(kv->k), *vb = vk_buf(kv->v);
    bool chunked = kb->n_chunks > 1 && kb->n_chunks <= 4 && vb->n_chunks == kb->n_chunks &&
                   vb->chunk == kb->chunk;
    uint32_t csh = 31;
    if (chunked)
        for (csh = 0; ((VkDeviceSize)4 << csh) < kb->chunk; csh++)
            ;
    vk_op_spec(&op, csh);
    uint32_t ko = vk_op_tensor(v, &op, k, false);
    uint32_t vo = vk_op_tensor(v, &op, vv, false);
    vk_op_buffer(v, &op, view->idx, false);
    if (chunked) {
        vk_op_chunk(v, &op, kv->k, 0, true);
        vk_op_chunk(v, &op, kv->v, 0, true);
        for (uint32_t i = 1; i < 4; i++)
            vk_op_chunk(v, &op, kv->k, i, true);
        for (uint32_t i = 1; i < 4; i++)
            vk_op_chunk(v, &op, kv->v, i, true);
    } else {
        vk_op_buffer(v, &op, kv->k, true);
        vk_op_buffer(v, &op, kv->v, true);
    }
    vk_op_u32(&op, n);
    vk_op_u32(&op, row);
    vk_op_u32(&op, (uint32_t)k->ne[0]);
    vk_op_u32(&op, (uint32_t)((int64_t)kv->n_pages * kv->page_size));
    vk_op_u32(&op, ko);
    vk_op_u32(&op, vo);
    vk_op_u32(&op, vk_table_word(&kv->store_tok));
    vk_op_u32(&op, vk_table_word(&kv->store_slot));
    vk_op_u32(&op, pairs);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n * (pairs ? row / 2 : row), STORE_WG));
}

llmem_status vk_op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                   const llmem_view *view, llmem_ct *q, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (vk_dtype_scaled(kv->dtype)) /* int8 / fp8 pools: vk_ops_quant.c */
        return vk_op_attention_q(be, p, view, q, out);
    uint32_t n_tok = (uint32_t)q->ne[0], n_heads = (uint32_t)q->ne[1];
    bool taken = false; /* a prefill ubatch on cooperative matrices (vk_ops_attn_pf.c) */
    llmem_status pst = vk_attn_pf(v, p, view, q, out, &taken);
    if (taken)
        return pst;
    uint32_t d = (uint32_t)kv->head_dim, n_kv = (uint32_t)kv->n_kv_heads;
    uint32_t n_rep = n_heads / n_kv;
    /* elements of a 16-byte vector; rows of whole vectors take the vector shader */
    uint32_t ev = kv->dtype == LLMEM_DTYPE_F32 ? 4 : 8;
    bool vec = d % ev == 0 && d / ev <= ATTN_WG;
    uint32_t r = ATTN_QS / d;
    r = r < 1 ? 1 : r > ATTN_RMAX ? ATTN_RMAX : r;
    r = r > n_rep ? n_rep : r;
    if (vec) { /* the largest power of two up to DEC_RMAX and n_rep: it divides ATTN_WG */
        r = DEC_RMAX;
        while (r > n_rep)
            r /= 2;
    }
    uint32_t n_chunks = (n_rep + r - 1) / r;
    uint64_t items = (uint64_t)n_tok * n_kv * n_chunks;
    int32_t max_len = 0;
    for (int32_t i = 0; i < kv->tok_kv_len.n; i++) {
        int32_t len = kv->tok_kv_len.host[i];
        if (p->window > 0 && len > p->window)
            len = p->window;
        max_len = len > max_len ? len : max_len;
    }
    /* the split depends on the key count rounded up to KEY_BUCKET only, so a
     * recorded step (models/decode_graph.c keys on the same bucket) replays
     * correctly at any length inside it */
    max_len = (max_len + KEY_BUCKET - 1) / KEY_BUCKET * KEY_BUCKET;
    dec_pick pk = {v->subgroup ? VK_SH_ATTENTION_SG : VK_SH_ATTENTION, ATTN_WG, 0, {0, 0, 0, 0}};
    if (vec)
        pk = dec_attn_pick(v, d / ev, ev, r,
                           (uint64_t)n_tok <= (uint64_t)DEC_TOKENS * (uint64_t)kv->seq_len.n, items);
    uint32_t n_split = 1, split_keys = 0;
    int32_t sk = (int32_t)VK_KNOB(v, dec_split_keys, split_keys_default(pk.sh, items, max_len));
    if (items < SPLIT_ITEMS && max_len > 2 * sk) {
        n_split = (uint32_t)((max_len + sk - 1) / sk);
        n_split = n_split > SPLIT_MAX ? SPLIT_MAX : n_split;
        split_keys = (uint32_t)((max_len + (int32_t)n_split - 1) / (int32_t)n_split);
    }
    vk_alloc part = {0};
    if (n_split > 1) {
        llmem_status st = vk_alloc_make(v, (VkDeviceSize)n_tok * n_heads * n_split * (d + 2) * 4, &part);
        if (st != LLMEM_OK)
            return st;
    }
    vk_op op;
    vk_op_init(&op, pk.sh, pk.wg);
    vk_op_spec(&op, d);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    vk_op_spec(&op, r);
    vk_op_spec(&op, vec ? DEC_CK : ATTN_BK);
    /* pools of 2 to 4 chunks: chunk bindings that the vector shader selects
     * per load (others are bound through a copy by vk_op_buffer) */
    const vk_buffer *kb = vk_buf(kv->k), *vb = vk_buf(kv->v);
    bool chunked = vec && kb->n_chunks > 1 && kb->n_chunks <= 4 && vb->n_chunks == kb->n_chunks &&
                   vb->chunk == kb->chunk;
    if (vec) {
        uint32_t csh = 31;
        if (chunked)
            for (csh = 0; ((VkDeviceSize)16 << csh) < kb->chunk; csh++)
                ;
        vk_op_spec(&op, csh);
        for (uint32_t j = 0; j < pk.n_spec; j++)
            vk_op_spec(&op, pk.spec[j]);
    }
    uint32_t qo = vk_op_tensor(v, &op, q, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_buffer(v, &op, view->idx, false);
    if (chunked) {
        vk_op_chunk(v, &op, kv->k, 0, false);
        vk_op_chunk(v, &op, kv->v, 0, false);
    } else {
        vk_op_buffer(v, &op, kv->k, false);
        vk_op_buffer(v, &op, kv->v, false);
    }
    if (n_split > 1)
        vk_op_alloc(v, &op, &part, true);
    else
        vk_op_dummy(v, &op);
    if (chunked) {
        for (uint32_t i = 1; i < 4; i++)
            vk_op_chunk(v, &op, kv->k, i, false);
        for (uint32_t i = 1; i < 4; i++)
            vk_op_chunk(v, &op, kv->v, i, false);
    }
    vk_op_u32(&op, n_tok);
    vk_op_u32(&op, n_heads);
    vk_op_u32(&op, n_kv);
    vk_op_u32(&op, n_rep);
    vk_op_u32(&op, n_chunks);
    vk_attn_push_kv(&op, kv, p, qo, oo);
    vk_op_u32(&op, n_split);
    vk_op_u32(&op, split_keys);
    /* llmem_kv_view.page_off: per-stream page-table rows, or the dense layout */
    vk_op_u32(&op, kv->page_off.n ? vk_table_word(&kv->page_off) : 0xffffffffu);
    llmem_status st = vk_op_run(v, &op, items * n_split);
    if (st == LLMEM_OK && n_split > 1) {
        vk_op c;
        vk_op_init(&c, VK_SH_ATTN_COMBINE, COMBINE_WG);
        vk_op_alloc(v, &c, &part, false);
        uint32_t co = vk_op_tensor(v, &c, out, true);
        vk_op_u32(&c, n_tok * n_heads);
        vk_op_u32(&c, d);
        vk_op_u32(&c, n_split);
        vk_op_u32(&c, co);
        st = vk_op_run(v, &c, (uint64_t)n_tok * n_heads);
    }
    if (n_split > 1)
        vk_alloc_release(v, &part);
    return st;
}

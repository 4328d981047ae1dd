/* llmem Vulkan backend: LFM2's gated short conv and the Mamba-1 selective
 * scan (shaders/short_conv.comp, shaders/ssm_scan1.comp), with state slots
 * and checkpoints of a recurrent view (issue 16). Semantics: transformers
 * Lfm2ShortConv and mamba_selective_scan (Gu & Dao 2023, Alg. 2); the CPU
 * reference is backends/cpu/ops_ssm1.c. Slot discipline as vk_ops_mamba.c:
 * a stream reads its source before writing, and a source another stream
 * writes is read from an f32 snapshot (vk_rs_prepare). Both shaders write
 * the snapshot inside the ubatch (llmem_rs_view.snap_tok / snap_slot) like
 * a checkpoint, from the last two push words (vk_rs_snap_words).
 */
#include "llmem/ops_ssm1.h"
#include "llmem/view.h"
#include "vk_internal.h"
#include "vk_rs.h"

#define S1_WG 64

static llmem_status vk_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                                     llmem_ct *bcx, llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    const llmem_state_desc *d = &llmem_view_rs(view)->desc[state];
    if (d->shape[0] + 1 > 64)
        return LLMEM_E_UNSUPPORTED; /* the shader keeps the window in registers */
    return vk_rs_conv(vk_from(be), VK_SH_SHORT_CONV, view, state, bcx, w, b, out);
}

static llmem_status vk_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                                    const llmem_view *view, int32_t state, llmem_ct *x,
                                    llmem_ct *dt, llmem_ct *b, llmem_ct *c, llmem_ct *a_log,
                                    llmem_ct *d, llmem_ct *dt_bias, llmem_ct *z, llmem_ct *y)
{
    vk_backend *v = vk_from(be);
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    if (p->d_state > 256)
        return LLMEM_E_UNSUPPORTED; /* the shader keeps a state row in registers */
    vk_alloc snap = {0};
    bool use_snap = false;
    llmem_status st = vk_rs_prepare(v, view, state, &snap, &use_snap);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    vk_op_init(&op, VK_SH_SSM_SCAN1, S1_WG);
    vk_op_spec(&op, (uint32_t)p->d_state);
    vk_op_spec(&op, (uint32_t)sd->dtype);
    vk_op_spec(&op, (uint32_t)a_log->dtype);
    vk_op_spec(&op, d ? (uint32_t)d->dtype : 3u);
    vk_op_spec(&op, dt_bias ? (uint32_t)dt_bias->dtype : 3u);
    vk_op_spec(&op, z != NULL);
    vk_op_spec(&op, use_snap);
    vk_op_spec(&op, llmem_rs_view_snap_used(view) != NULL); /* SNAPSHOT */
    uint32_t xo = vk_op_tensor(v, &op, x, false);
    uint32_t dto = vk_op_tensor(v, &op, dt, false);
    uint32_t bo = vk_op_tensor(v, &op, b, false);
    uint32_t co = vk_op_tensor(v, &op, c, false);
    uint32_t ao = vk_op_tensor(v, &op, a_log, false);
    uint32_t d_o = vk_op_tensor(v, &op, d, false);
    uint32_t dbo = vk_op_tensor(v, &op, dt_bias, false);
    uint32_t zo = vk_op_tensor(v, &op, z, false);
    uint32_t yo = vk_op_tensor(v, &op, y, true);
    vk_rs_bind(v, &op, view, state, use_snap ? &snap : NULL);
    vk_op_u32(&op, (uint32_t)rs->n_seqs);
    vk_op_u32(&op, (uint32_t)rs->n_seq_tokens);
    vk_op_u32(&op, (uint32_t)p->d_inner);
    vk_op_u32(&op, (uint32_t)rs->n_ckpt);
    vk_op_u32(&op, (uint32_t)rs->n_slots);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, dto);
    vk_op_u32(&op, bo);
    vk_op_u32(&op, co);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, d_o);
    vk_op_u32(&op, dbo);
    vk_op_u32(&op, zo);
    vk_op_u32(&op, yo);
    vk_rs_tables(&op, rs);
    vk_rs_snap_words(&op, view);
    st = vk_op_run(v, &op, vk_div_up((uint64_t)rs->n_seqs * (uint64_t)p->d_inner, S1_WG));
    if (use_snap)
        vk_alloc_release(v, &snap);
    return st;
}

/* Registered in the Vulkan backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_SHORT_CONV, LLMEM_OP_SHORT_CONV_LAYOUT, llmem_op_short_conv_fn,
              vk_op_short_conv);
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_SSM_SCAN1, LLMEM_OP_SSM_SCAN1_LAYOUT, llmem_op_ssm_scan1_fn,
              vk_op_ssm_scan1);

/* llmem vulkan backend: tuning variables read once (vk_knobs.h). */
#include <stddef.h>
#include <stdlib.h>

#include "vk_internal.h"
#include "vk_presplit.h"

enum { NUM, POW2, CHAR };

/* One variable: where it goes, its range and how it reads: NUM a decimal
 * number (strtol: "8x" is 8, "" is 0), POW2 one that is a power of two
 * too, CHAR its first character only (lo, hi unused). */
typedef struct knob_def {
    const char *name;
    size_t off;
    long lo, hi;
    int kind;
} knob_def;

#define K(name, field, lo, hi, kind) {name, offsetof(vk_knobs, field), lo, hi, kind}
static const knob_def defs[] = {
    K("LLMEM_VULKAN_NORM_WG", norm_wg, 64, 1024, POW2),
    K("LLMEM_VULKAN_ARGMAX_WG", argmax_wg, 64, 1024, POW2),
    K("LLMEM_VULKAN_ARGMAX_VEC", argmax_vec, 0, 0, CHAR),
    K("LLMEM_VULKAN_GATHER_OLD", gather_old, 0, 0, CHAR),
    K("LLMEM_VULKAN_NORM_MATMUL", norm_matmul, 0, 1, NUM),
    K("LLMEM_VULKAN_NM_MODE", nm_mode, 0, 1, NUM),
    K("LLMEM_VULKAN_NM_WG", nm_wg, 64, 1024, NUM),
    K("LLMEM_VULKAN_NM_R", nm_r, 1, 4, NUM),
    K("LLMEM_VULKAN_NM_GROUPS", nm_groups, 1, 65535, NUM),
    K("LLMEM_VULKAN_NM_RWG", nm_rwg, 64, 1024, NUM),
    K("LLMEM_VULKAN_NM_TPR", nm_tpr, 32, 1024, NUM),
    K("LLMEM_VULKAN_NM_NR", nm_nr, 1, 8, NUM),
    K("LLMEM_VULKAN_NM_UNROLL", nm_unroll, 1, 16, NUM),
    K("LLMEM_VULKAN_GEMV_ROWS", gemv_rows, 0, 1, NUM),
    K("LLMEM_VULKAN_L2_PREFETCH", l2_prefetch, 0, 2, NUM),
    K("LLMEM_VULKAN_L2_PREFETCH_KB", l2_prefetch_kb, 1, 65536, NUM),
    K("LLMEM_VULKAN_NM_CONV", nm_conv, 0, 1, NUM),
    K("LLMEM_VULKAN_ROPE_STORE", rope_store, 0, 1, NUM),
    K("LLMEM_VULKAN_ARGMAX_SPLIT", argmax_split, 0, VK_ARGMAX_SPLIT_MAX, NUM),
    K("LLMEM_VULKAN_SPIN_US", spin_us, 0, 1000000, NUM),
    K("LLMEM_VULKAN_UPLOAD_INLINE", upload_inline, 0, 1, NUM),
    K("LLMEM_VULKAN_PF_SUM_VEC", pf_sum_vec, 0, 1, NUM),
    K("LLMEM_VULKAN_PF_NORM", pf_norm, 0, 2, NUM),
    K("LLMEM_VULKAN_PF_SWIGLU", pf_swiglu, 0, 1, NUM),
    K("LLMEM_VULKAN_DEC_PF", dec_pf, 0, 255, NUM),
    K("LLMEM_VULKAN_DEC_PF_LAG", dec_pf_lag, 1, 8, NUM),
    K("LLMEM_VULKAN_DEC_PF_SEG", dec_pf_seg, 16, 128, POW2),
    K("LLMEM_VULKAN_DEC_ROWS", dec_rows, 0, 64, NUM),
    K("LLMEM_VULKAN_SUM_HOLD", sum_hold, 0, 15, NUM),
    K("LLMEM_VULKAN_ROW_SPLIT", row_split, 0, VK_ROW_SPLIT_MAX, NUM),
    K("LLMEM_VULKAN_SWIGLU_FOLD", swiglu_fold, 0, 15, NUM),
    K("LLMEM_VULKAN_NORM_FOLD", norm_fold, 0, 7, NUM),
    K("LLMEM_VULKAN_SM_COUNT", sm_count, 1, VK_SM_MAX, NUM),
    K("LLMEM_VULKAN_NORM_FOLD_WGS", norm_fold_wgs, 1, 1024, NUM),
    K("LLMEM_VULKAN_DEC_NORM", dec_norm, 0, 31, NUM),
    K("LLMEM_VULKAN_SUM_CONV", sum_conv, 0, 3, NUM),
    K("LLMEM_VULKAN_DISCARD", discard, 0, 3, NUM),
    K("LLMEM_VULKAN_ATTN_PF", attn_pf, 0, 3, NUM),
    K("LLMEM_VULKAN_ATTN_PF_WG", attn_pf_wg, 128, 256, POW2),
    K("LLMEM_VULKAN_DEC_ATTN", dec_attn, 0, 3, NUM),
    K("LLMEM_VULKAN_DEC_KPG", dec_kpg, 1, 8, POW2),
    K("LLMEM_VULKAN_DEC_WG", dec_wg, 32, 256, POW2),
    K("LLMEM_VULKAN_DEC_SPLIT_KEYS", dec_split_keys, 64, 8192, NUM),
    K("LLMEM_VULKAN_DEC_ST", dec_st, 0, 63, NUM),
    K("LLMEM_VULKAN_DEC_ATTN_PF", dec_attn_pf, 0, 15, NUM),
    K("LLMEM_VULKAN_ATTN_PF_CM2", attn_pf_cm2, 0, 1, NUM),
    K("LLMEM_VULKAN_ATTN_PF_STAGES", attn_pf_stages, 1, 2, NUM),
    K("LLMEM_VULKAN_ATTN_PF_PRECISE", attn_pf_precise, 0, 1, NUM),
    K("LLMEM_VULKAN_ATTN_PF_VAR", attn_pf_var, 0, 511, NUM),
    K("LLMEM_VULKAN_MV16_WG", mv16_wg, 64, 1024, POW2),
    K("LLMEM_VULKAN_MV16_TPR", mv16_tpr, 32, 1024, POW2),
    K("LLMEM_VULKAN_MV16_NR", mv16_nr, 1, 8, POW2),
    K("LLMEM_VULKAN_MV16_UNROLL", mv16_unroll, 1, 16, NUM),
    K("LLMEM_VULKAN_PAIR_PLAN", pair_plan, 0, 1, NUM),
    K("LLMEM_VULKAN_ATTN_PF_FA", attn_pf_fa, 0, 255, NUM),
    K("LLMEM_VULKAN_GDN_WO", gdn_wo, 0, 1, NUM),
};
#undef K

void vk_knobs_read(vk_knobs *k)
{
    for (size_t i = 0; i < sizeof defs / sizeof *defs; i++) {
        const knob_def *d = &defs[i];
        const char *e = getenv(d->name);
        long x = e ? strtol(e, NULL, 10) : -1;
        if (d->kind == CHAR)
            x = e ? (unsigned char)e[0] : -1;
        else if (x < d->lo || x > d->hi || (d->kind == POW2 && (x & (x - 1))))
            x = -1;
        *(int32_t *)((char *)k + d->off) = (int32_t)x;
    }
}

uint32_t vk_env_u32(const char *name, uint32_t dflt, long lo, long hi)
{
    const char *e = getenv(name);
    if (!e)
        return dflt;
    long x = strtol(e, NULL, 10);
    return x < lo || x > hi ? dflt : (uint32_t)x;
}

/* The llmem_backend_i slot (vk_plugin.c's vk_iface). */
void vk_reload_env(llmem_backend *be)
{
    vk_knobs_read(&((vk_backend *)be)->knobs);
    vk_sm_config((vk_backend *)be);
}

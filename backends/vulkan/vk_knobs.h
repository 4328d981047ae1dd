/* llmem vulkan backend: the tuning variables that ops used to read with
 * getenv at each call, read into the backend's state when it opens
 * (vk_knobs_read) and again on llmem_backend_reload_env, so that an op
 * reads a field: getenv scans the whole environment and is not safe
 * against a setenv in another thread. Each field holds the variable's
 * value when it is set and within the range its op accepts (docs/vulkan.md
 * gives the ranges and defaults), else -1: the op's own default, which may
 * depend on the shape (VK_KNOB). */
#ifndef LLMEM_VK_KNOBS_H
#define LLMEM_VK_KNOBS_H

#include <stdint.h>

typedef struct vk_knobs {
    int32_t norm_wg;    /* LLMEM_VULKAN_NORM_WG: the RMS norms' workgroup, 64..1024, 2^k */
    int32_t argmax_wg;  /* LLMEM_VULKAN_ARGMAX_WG: 64..1024, 2^k */
    int32_t argmax_vec; /* LLMEM_VULKAN_ARGMAX_VEC's first character: '0' the scalar loop */
    int32_t gather_old; /* LLMEM_VULKAN_GATHER_OLD's first character: '1' sample.comp's 2 passes */
    /* llmem_op_norm_matmul (vk_ops_norm_matmul.c) */
    int32_t norm_matmul;    /* LLMEM_VULKAN_NORM_MATMUL: 0 refused, 1 */
    int32_t nm_mode;        /* LLMEM_VULKAN_NM_MODE: 0 rows kernel, 1 persistent */
    int32_t nm_wg;          /* LLMEM_VULKAN_NM_WG: 64..1024 */
    int32_t nm_r;           /* LLMEM_VULKAN_NM_R: 1..4 */
    int32_t nm_groups;      /* LLMEM_VULKAN_NM_GROUPS: 1..65535 */
    int32_t nm_rwg;         /* LLMEM_VULKAN_NM_RWG: 64..1024 */
    int32_t nm_tpr;         /* LLMEM_VULKAN_NM_TPR: 32..1024 */
    int32_t nm_nr;          /* LLMEM_VULKAN_NM_NR: 1..8 */
    int32_t nm_unroll;      /* LLMEM_VULKAN_NM_UNROLL: 1..16 */
    int32_t gemv_rows;      /* LLMEM_VULKAN_GEMV_ROWS: 0, 1 */
    int32_t l2_prefetch;    /* LLMEM_VULKAN_L2_PREFETCH: 0..2 */
    int32_t l2_prefetch_kb; /* LLMEM_VULKAN_L2_PREFETCH_KB: 1..65536 */
    int32_t nm_conv;        /* LLMEM_VULKAN_NM_CONV: 0, 1 */
    int32_t rope_store;     /* LLMEM_VULKAN_ROPE_STORE: 0, 1 */
    int32_t argmax_split;   /* LLMEM_VULKAN_ARGMAX_SPLIT: 0..256 */
    int32_t spin_us;        /* LLMEM_VULKAN_SPIN_US: 0..1000000 (vk_fence_wait) */
    int32_t upload_inline;  /* LLMEM_VULKAN_UPLOAD_INLINE: 0, 1 (vk_buffer_upload) */
    /* prefill rows (above VK_CMP_ROWS), docs/benchmarks.md "Vulkan prefill around the GEMM" */
    int32_t pf_sum_vec;     /* LLMEM_VULKAN_PF_SUM_VEC: 0 scalar sum_slices_cm, 1 (default) vec4 */
    int32_t pf_norm;        /* LLMEM_VULKAN_PF_NORM: 0 REG / loop, 1 (default) V4, 2 gated SMEM */
    int32_t pf_swiglu;      /* LLMEM_VULKAN_PF_SWIGLU: 0 cm_split's two reads, 1 (default) V4 */
    /* matmul_dec.comp's L2 prefetch (vk_ops_matmul.c, VK_DEC_PF_*) */
    int32_t dec_pf;         /* LLMEM_VULKAN_DEC_PF: K steps ahead, 0..255 (0 off) */
    int32_t dec_pf_lag;     /* LLMEM_VULKAN_DEC_PF_LAG: steps a burst, 1..8 */
    int32_t dec_pf_seg;     /* LLMEM_VULKAN_DEC_PF_SEG: bytes a touched segment, 16..128, 2^k */
    int32_t dec_rows;       /* LLMEM_VULKAN_DEC_ROWS: rows a tile, 0..64 (0 all; vk_dec_cfg) */
    int32_t sum_hold;       /* LLMEM_VULKAN_SUM_HOLD: 0..15, the held split-K sums (vk_sum.c) */
    int32_t row_split;      /* LLMEM_VULKAN_ROW_SPLIT: 0..64 workgroups a row (vk_row_split) */
    int32_t swiglu_fold;    /* LLMEM_VULKAN_SWIGLU_FOLD: 0..15 up's and gate's sums in the SwiGLU (vk_sum.h) */
    int32_t norm_fold;      /* LLMEM_VULKAN_NORM_FOLD: 0..7 the residual sums in the norm (vk_sum.h) */
    int32_t sm_count;       /* LLMEM_VULKAN_SM_COUNT: 1..VK_SM_MAX compute units (vk_sm_config) */
    int32_t norm_fold_wgs;  /* LLMEM_VULKAN_NORM_FOLD_WGS: 1..1024 workgroups in all of that norm */
    int32_t dec_norm;       /* LLMEM_VULKAN_DEC_NORM: 0..31 the decode rows' norms */
    int32_t sum_conv;       /* LLMEM_VULKAN_SUM_CONV: 0..3 the decode conv in in_proj's sum (vk_sum.h) */
    int32_t discard;        /* LLMEM_VULKAN_DISCARD: 0..3 discarded held writes dropped (vk_sum.h) */
    int32_t attn_pf;        /* LLMEM_VULKAN_ATTN_PF: 0..3 the prefill attention on cooperative
                             * matrices (vk_ops_attn_pf.c, attn_pf_pick) */
    int32_t attn_pf_wg;     /* LLMEM_VULKAN_ATTN_PF_WG: 128 or 256, its workgroup */
    /* the decode attention (vk_ops_attention.c, dec_attn_pick) */
    int32_t dec_attn;       /* LLMEM_VULKAN_DEC_ATTN: 0 plain, 1 subgroup module, 2 streaming groups,
                             * 3 attention_decode_st (subgroups streaming) */
    int32_t dec_kpg;        /* LLMEM_VULKAN_DEC_KPG: 1..8, 2^k, keys per group and round */
    int32_t dec_wg;         /* LLMEM_VULKAN_DEC_WG: 32..256, 2^k, its workgroup (modules 1..3) */
    int32_t dec_split_keys; /* LLMEM_VULKAN_DEC_SPLIT_KEYS: 64..8192 keys a split */
    int32_t dec_st;         /* LLMEM_VULKAN_DEC_ST: 0..63, attention_decode_st's variant bits */
    int32_t dec_attn_pf;    /* LLMEM_VULKAN_DEC_ATTN_PF: 0..15, its L2 prefetch, steps ahead */
    /* the prefill attention's CM2 module (vk_ops_attn_pf.c, attn_pf_pick) */
    int32_t attn_pf_cm2;     /* LLMEM_VULKAN_ATTN_PF_CM2: 0 the KHR module, 1 the CM2 one */
    int32_t attn_pf_stages;  /* LLMEM_VULKAN_ATTN_PF_STAGES: 1 or 2 K / V stages (CM2) */
    int32_t attn_pf_precise; /* LLMEM_VULKAN_ATTN_PF_PRECISE: 0..1 precise calls on CM2 */
    int32_t attn_pf_var;     /* LLMEM_VULKAN_ATTN_PF_VAR: 0..511 variant bits (the shader's VAR) */
    /* matvec16.comp's one-row launch (vk_ops_matvec16.c, mv16_pick) */
    int32_t mv16_wg;     /* LLMEM_VULKAN_MV16_WG: 64..1024, 2^k, the workgroup */
    int32_t mv16_tpr;    /* LLMEM_VULKAN_MV16_TPR: 32..1024, 2^k, invocations per row group */
    int32_t mv16_nr;     /* LLMEM_VULKAN_MV16_NR: 1..8, 2^k, weight rows per group */
    int32_t mv16_unroll; /* LLMEM_VULKAN_MV16_UNROLL: 1..16, 16-byte loads in flight a row */
    int32_t pair_plan;      /* LLMEM_VULKAN_PAIR_PLAN: 0, 1 the SwiGLU's products in one wave (vk_sum.c) */
    int32_t attn_pf_fa;     /* LLMEM_VULKAN_ATTN_PF_FA: 0..255 the prefill attention's one-pass
                             * module, attention_prefill_fa.comp (vk_ops_attn_pf.c): bit 0 on,
                             * 2 its lazy rescale, 4 its direct K / V loads, 8 blocks of 64
                             * keys, 16 its K / V ring refilled in halves, 32 V fetched
                             * after the softmax, 64 the Q tile's loads first, 128 O's
                             * loops written out */
    int32_t gdn_wo;         /* LLMEM_VULKAN_GDN_WO: 0..1 gdn.comp's loops over its state column
                             * written out (vk_ops_gdn.c, GDN_WO) */
} vk_knobs;

/* The knob's value, or dflt where its variable is unset or out of range. */
#define VK_KNOB(v, field, dflt) ((v)->knobs.field >= 0 ? (long)(v)->knobs.field : (long)(dflt))

/* Reads every variable above into *k (never fails: a variable that is
 * unset, malformed or out of range reads as -1). */
void vk_knobs_read(vk_knobs *k);

/* $name as a decimal integer (strtol) when it is set and within [lo, hi],
 * else dflt: for the variables a backend reads once when it opens into
 * its own configuration (vk_matmul_config, the scan's). */
uint32_t vk_env_u32(const char *name, uint32_t dflt, long lo, long hi);

#endif

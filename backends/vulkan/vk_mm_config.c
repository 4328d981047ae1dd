/* llmem Vulkan backend: the matmul path choices (v->mm), read once when the
 * backend opens from the device's capabilities and the variables of
 * docs/vulkan.md's table (vk_mm_pick.c decides with them per product). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"
#include "vk_presplit.h"

/* A layout variable "A,B,C,..." of n_min to n_max (at most 8) unsigned
 * numbers into out[0..n_max) (the ones not given keep their value): how
 * many were read; 0 when unset, "0" or malformed, the last with a line on
 * stderr naming the variable and its form. Where the variable is set, the
 * caller reads 0 as "0": no layout of its own. */
static int env_layout(const char *name, const char *form, int n_min, int n_max, uint32_t *out)
{
    const char *s = getenv(name);
    if (!s || strcmp(s, "0") == 0)
        return 0;
    uint32_t v[8] = {0};
    int n = 0;
    const char *p = s;
    while (n < n_max && n < 8) {
        char *end;
        unsigned long x = strtoul(p, &end, 10);
        if (end == p || x > UINT32_MAX || *p == '-')
            break;
        v[n++] = (uint32_t)x;
        p = end;
        if (*p != ',')
            break;
        p++;
    }
    if (n < n_min || *p != '\0') {
        fprintf(stderr, "vulkan: %s=%s is not %s or 0: taken as 0\n", name, s, form);
        return 0;
    }
    for (int i = 0; i < n; i++)
        out[i] = v[i];
    return n;
}

void vk_sm_config(vk_backend *v)
{
    const char *set = getenv("LLMEM_VULKAN_SM_COUNT");
    if (set && v->knobs.sm_count < 0) {
        fprintf(stderr, "vulkan: LLMEM_VULKAN_SM_COUNT=%s is not a number in 1..%d: ignored\n",
                set, VK_SM_MAX);
        vk_log(v, "LLMEM_VULKAN_SM_COUNT=%s is not a number in 1..%d: ignored", set, VK_SM_MAX);
    }
    uint32_t sms = vk_sm_pick(v->knobs.sm_count, v->sm_device);
    v->mm.n_sm = sms;
    if (v->knobs.sm_count >= 1 && v->sm_device)
        vk_log(v, "compute units: %u (LLMEM_VULKAN_SM_COUNT; the device reports %u through %s)",
               sms, v->sm_device, v->sm_source);
    else if (v->knobs.sm_count >= 1)
        vk_log(v, "compute units: %u (LLMEM_VULKAN_SM_COUNT; the device reports none)", sms);
    else if (v->sm_device)
        vk_log(v, "compute units: %u (%s)", sms, v->sm_source);
    else
        vk_log(v, "compute units: %u (the device reports none: the fallback, as on the H200)",
               sms);
    /* split-K of matmul_cm's <= 64-row tiles within this many workgroups (default one wave,
     * VK_CM_WAVE_SM an SM: on the H200 9B precise tg128 b16 16.75 -> 15.79 ms, b64 29.07 ->
     * 26.54); 0: vk_mm_split_k's 2 per SM */
    v->mm.cm_wave = vk_env_u32("LLMEM_VULKAN_CM_WAVE", VK_CM_WAVE_SM * sms, 0, 1u << 20);
    /* its narrow layout of short fast-mode products: "WG,SGM,FN,BK,SETS[,STEPS[,WAVE]]"
     * (vk_cm_plan_narrow; STEPS VK_CM_NARROW_STEPS and WAVE VK_CM_NARROW_WAVE_SM an SM where
     * not given), "0" none; unset: VK_CM_NARROW */
    uint32_t *cnv = v->mm.cm_narrow;
    memset(v->mm.cm_narrow, 0, sizeof v->mm.cm_narrow);
    v->mm.cm_narrow_set = getenv("LLMEM_VULKAN_CM_NARROW") != NULL;
    cnv[5] = VK_CM_NARROW_STEPS;
    cnv[6] = VK_CM_NARROW_WAVE_SM * sms;
    if (env_layout("LLMEM_VULKAN_CM_NARROW", "WG,SGM,FN,BK,SETS[,STEPS[,WAVE]]", 5, 7, cnv) < 5)
        cnv[0] = 0;
    /* matmul_cmp's products with more tiles than a wave: K split by vk_cmp_plan_tail in none
     * (0), all (1), or the precise ones (2, default) */
    v->mm.cmp_tail = vk_env_u32("LLMEM_VULKAN_CMP_TAIL", VK_CMP_TAIL_DEFAULT, 0, 2);
    /* ... or, before that, only the last column tiles' K in at most this many slices, the
     * others whole (vk_cmp_plan_tailcol; precise and fast); 0 off */
    v->mm.cmp_tailcol = vk_env_u32("LLMEM_VULKAN_CMP_TAILCOL", VK_CMP_TAILCOL_DEFAULT, 0, 64);
    /* the second product of a pair (vk_sum_park, no barrier after the first): K split for the
     * SMs the first's last wave leaves idle (vk_cmp_plan_pair); 0 off */
    v->mm.cmp_pair = vk_env_u32("LLMEM_VULKAN_CMP_PAIR", VK_CMP_PAIR_DEFAULT, 0, 1) != 0;
    /* its layout "WG,SGM,FM,FN,BK[,STAGES[,WAVE]]" for every product (vk_cmp_plan_cfg; STAGES 1
     * and WAVE the KHR plan's, vk_cmp_wave, when not given); unset or "0": vk_cmp_plan_make's */
    uint32_t *cc = v->mm.cmp_cfg;
    memset(v->mm.cmp_cfg, 0, sizeof v->mm.cmp_cfg);
    cc[5] = 1;
    cc[6] = vk_cmp_wave(true, sms);
    if (env_layout("LLMEM_VULKAN_CMP_CFG", "WG,SGM,FM,FN,BK[,STAGES[,WAVE]]", 5, 7, cc) < 5)
        cc[0] = 0;
}

void vk_matmul_config(vk_backend *v)
{
    v->mm.coopmat = v->coopmat;
    v->mm.mv16_max = vk_env_u32("LLMEM_VULKAN_MV16_MAX", VK_MM_MV16_MAX, 0, 64);
    v->mm.cm_min = vk_env_u32("LLMEM_VULKAN_CM_MIN", VK_MM_CM_MIN, 1, 1u << 30);
    v->mm.cm_max = vk_env_u32("LLMEM_VULKAN_CM_MAX", VK_MM_CM_MAX, 1, 1u << 30);
    /* the 64-wide K step where its shared memory fits; $LLMEM_VULKAN_CM_BK=32: the old step */
    v->mm.cm_bk = vk_env_u32("LLMEM_VULKAN_CM_BK", VK_CM_BK_SMALL, 32, 64) == 32 ? 32 : VK_CM_BK_SMALL;
    if (v->props.limits.maxComputeSharedMemorySize < VK_CM_SHARED_BYTES_SMALL)
        v->mm.cm_bk = 32;
    /* matmul_cm's pipeline depth up to 64 rows: its ring (2 .. 4), or one shared slice (1);
     * unset (0): by rows, vk_cm_stages_for */
    v->mm.cm_stages = vk_env_u32("LLMEM_VULKAN_CM_STAGES", 0, 1, VK_CM_STAGES_MAX);
    v->mm.cm_fn = vk_env_u32("LLMEM_VULKAN_CM_FN", 1, 1, 4); /* vk_cm_plan_make_fn */
    /* its layout up to 64 rows: "WG,SGM,FN,BK,SETS[,ROWS]" (vk_cm_plan_mid, from ROWS rows,
     * default 17) in both modes; "0" the plans of vk_cm_plan_make; unset: VK_CM_MID_FAST /
     * _PRECISE from VK_CM_MID_ROWS rows (vk_cm_mid_cfg) */
    v->mm.cm_mid_set = getenv("LLMEM_VULKAN_CM_MID") != NULL;
    uint32_t mid[6] = {0, 0, 0, 0, 0, 17};
    int got = env_layout("LLMEM_VULKAN_CM_MID", "WG,SGM,FN,BK,SETS[,ROWS]", 5, 6, mid);
    for (int i = 0; i < 5; i++)
        v->mm.cm_mid[i] = got ? mid[i] : 0;
    v->mm.cm_mid_rows = mid[5];
    /* matmul_cm's epilogue: 0 scaled through shared memory, 1 raw where K is split, 2 raw
     * everywhere, 3 raw with the sum in the last slice's workgroup (vk_mm_pick.h VK_CM_RAW_*) */
    v->mm.cm_raw = vk_env_u32("LLMEM_VULKAN_CM_RAW", VK_CM_RAW_DEFAULT, 0, 3);
    /* matmul_swiglu's two tensor-core products share one split of their activations */
    v->mm.cm_split_once = vk_env_u32("LLMEM_VULKAN_CM_SPLIT_ONCE", VK_CM_SPLIT_ONCE, 0, 1) == 1;
    /* the wave's slices per tile rounded to nearest instead of down (a 67-tile product: 2
     * slices, 134 workgroups, instead of 1) */
    v->mm.cm_wave_round = vk_env_u32("LLMEM_VULKAN_CM_WAVE_ROUND", 0, 0, 1) == 1;
    uint32_t swg = vk_env_u32("LLMEM_VULKAN_SPLIT_WG", 0, 64, 1024);
    v->mm.split_wg = (swg & (swg - 1)) == 0 ? swg : 0;
    v->mm.smem = v->props.limits.maxComputeSharedMemorySize;
    /* above 64 rows: matmul_cmp.comp's KHR module where the device and the build have it (1,
     * default; else matmul_cm.comp), its NV module (2, slower in fast mode), matmul_cm (0) */
    uint32_t cmp = vk_env_u32("LLMEM_VULKAN_CMP", 1, 0, 2);
    v->mm.cmp = cmp == 2 ? VK_CMP_NV
                : cmp == 1 && v->coopmat_khr && vk_shader_codes[VK_SH_MATMUL_CMP_KHR].size >= 20
                    ? VK_CMP_KHR
                    : VK_CMP_OFF;
    /* the SM count, matmul_cm's waves, matmul_cmp's layout and tail split */
    vk_sm_config(v);
    /* up to 64 rows: matmul_cm.comp's KHR module where the device and the build have it (1,
     * default), its NV module (0) */
    v->mm.cm_khr = vk_env_u32("LLMEM_VULKAN_CM_KHR", 1, 0, 1) == 1 && v->coopmat_khr &&
                   vk_shader_codes[VK_SH_MATMUL_CM_KHR].size >= 20;
    /* 9-64 rows: matmul_dec.comp (1: its KHR module where the device and the build have it,
     * else its NV one; 2 its NV module; 3, the default: its KHR module at 9-16 rows, 4 the
     * same in fast mode only, vk_dec_used), 0 the old plans of matmul_cm.comp */
    uint32_t dec = vk_env_u32("LLMEM_VULKAN_DEC", VK_DEC_DEFAULT, 0, 4);
    bool dec_khr = v->coopmat_khr && vk_shader_codes[VK_SH_MATMUL_DEC_KHR].size >= 20;
    if (dec == VK_DEC_KHR && !dec_khr)
        dec = VK_DEC_NV;
    if ((dec == VK_DEC_AUTO || dec == VK_DEC_AUTO_FAST) && !dec_khr)
        dec = VK_DEC_OFF;
    v->mm.dec = dec;
    /* fast mode, bf16 weights, where the device has bf16 matrices (vk_khr_bf16_usable, which
     * leaves them off at $LLMEM_VULKAN_BF16=0, the default): matmul_dec's bf16 module from 1,
     * matmul_cm's too at 2 (slower on the H200: vk_bf16_used) */
    uint32_t bf = v->coopmat_bf16 ? vk_env_u32("LLMEM_VULKAN_BF16", VK_BF16_DEFAULT, 0, 2) : 0;
    v->mm.bf16_dec = bf >= 1 && dec_khr && vk_shader_codes[VK_SH_MATMUL_DEC_BF_KHR].size >= 20;
    v->mm.bf16_cm = bf >= 2 && v->mm.cm_khr &&
                    vk_shader_codes[VK_SH_MATMUL_CM_BF_KHR].size >= 20;
    /* AUTO's rows in fast mode (vk_dec_used): 16 gives the route before VK_DEC_AUTO_FAST_ROWS */
    v->mm.dec_fast_rows = vk_env_u32("LLMEM_VULKAN_DEC_FAST_ROWS", VK_DEC_AUTO_FAST_ROWS, 9, 64);
    /* its blocking for every row count, "WG,FN,BK,DEPTH,KA,GROUPS" (vk_dec_cfg) */
    v->mm.dec_cfg_set =
        env_layout("LLMEM_VULKAN_DEC_CFG", "WG,FN,BK,DEPTH,KA,GROUPS", 6, 6, v->mm.dec_cfg) == 6;
    /* above 64 rows: matmul_cm2.comp where VK_NV_cooperative_matrix2 is on and the build has
     * its module (1), else (0, default: slower on the H200) matmul_cmp as above; its
     * invocations (where the device lists a workgroup shape for them), tile columns and K step */
    v->mm.cm2_wg = vk_env_u32("LLMEM_VULKAN_CM2_WG", 256, 128, 256) == 128 ? 128 : 256;
    uint32_t g256[3] = {v->cm2.gran_m, v->cm2.gran_n, v->cm2.gran_k};
    const uint32_t *gran = v->mm.cm2_wg == 128 ? v->cm2.gran128 : g256;
    v->mm.cm2 = vk_env_u32("LLMEM_VULKAN_CM2_PREFILL", VK_CM2_PREFILL, 0, 1) == 1 && v->coopmat2 &&
                vk_shader_codes[VK_SH_MATMUL_CM2_KHR].size >= 20 && gran[0] != 0;
    v->mm.cm2_bn = vk_env_u32("LLMEM_VULKAN_CM2_BN", VK_CM2_BN, 64, 256);
    v->mm.cm2_bk = vk_env_u32("LLMEM_VULKAN_CM2_BK", VK_CM2_BK, 16, 64);
    for (int i = 0; i < 3; i++)
        v->mm.cm2_gran[i] = gran[i];
    v->mv16_rows = vk_env_u32("LLMEM_VULKAN_MV16_ROWS", VK_MM_MV16_ROWS, 1, 32);
    v->mm.matvec_old = getenv("LLMEM_VULKAN_MATVEC_OLD") != NULL;
    v->mm.matmul_old = getenv("LLMEM_VULKAN_MATMUL_OLD") != NULL;
    vk_presplit_config(v);
}

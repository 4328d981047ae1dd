/* llmem Vulkan backend: which matmul shader runs, as pure functions of the
 * shape, the weight dtype and the device's capabilities, so that tests can
 * check the choice without a device (tests/test_vulkan_pick.c includes
 * vk_mm_pick.c). No Vulkan types here. */
#ifndef LLMEM_VK_MM_PICK_H
#define LLMEM_VK_MM_PICK_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/backend.h"

#define VK_MM_MV_MAX 8      /* activation rows handled by matvec.comp */
#define VK_MM_MV16_ROWS 16  /* activation rows per matvec16.comp pass ($LLMEM_VULKAN_MV16_ROWS) */
/* activation rows up to which matvec16 replaces matmul_rt ($LLMEM_VULKAN_MV16_MAX; H200, 9B
 * Bamba: at 16 and 32 rows matmul_rt takes 0.87x and 0.54x of matvec16's step) */
#define VK_MM_MV16_MAX 8
#define VK_MM_CM_MIN 9      /* rows from which matmul_cm.comp runs (above matvec16's 8) */
#define VK_MM_CM_MAX 0xffffffffu /* rows up to which it runs: all. Up to 64 until its 128 x 128
                                  * tiles' accumulators left local memory (they had run at ~30
                                  * TFLOP/s, below matmul_rt); 512 x 4096 x 4096 precise 0.656 ->
                                  * 0.279 ms then (H200; $LLMEM_VULKAN_CM_MAX=64: the old routing;
                                  * docs/benchmarks.md, "Vulkan GEMM: the accumulators in local
                                  * memory") */
/* The plans below size split-K and their waves by the device's compute units ("SMs": NVIDIA's
 * streaming multiprocessors, AMD's compute units, Arm's shader cores), a parameter `sms` (the
 * backend's vk_mm_caps.n_sm: vk_sm_count's, or $LLMEM_VULKAN_SM_COUNT), times the per-SM
 * factors *_SM below. Those were measured on the H200 (132 SMs), where every plan is the one
 * the absolute counts of before gave (264 = 2 x 132 workgroups, and so on;
 * tests/test_vulkan_sm.c). A plan function given 0 SMs takes VK_SM_FALLBACK. */
#define VK_SM_FALLBACK 132  /* SMs where the device reports none: the H200's, today's plans */
#define VK_SM_MAX 4096      /* $LLMEM_VULKAN_SM_COUNT: 1 .. this */
#define VK_MM_GROUPS_SM 2   /* workgroups split-K aims for, per SM (264 on the H200) */
/* matmul_cm's <= 64-row tiles split K within one wave, one workgroup per SM
 * (vk_cm_plan_wave; $LLMEM_VULKAN_CM_WAVE, 0: vk_mm_split_k):
 * with the raw epilogue fewer, longer slices pay (docs/benchmarks.md,
 * "Vulkan GEMM: raw split-K slices" and "Final check of the fifth session") */
#define VK_CM_WAVE_SM 1
#define VK_MM_MIN_SLICE 256 /* K per split-K slice, at least */
#define VK_CM_WG 256        /* matmul_cm.comp: 8 subgroups of 32 */
#define VK_CM_BK_BIG 32     /* its K step above 64 rows (the 128 x 128 tiles) */
/* above 64 rows, no split-K from this many tiles: half the SMs (66 on the H200; one
 * 256-invocation workgroup of 150-170 registers fits an SM): 512 x 4096 x 4096 precise, 128
 * tiles: 3 slices 0.234 ms, one 0.191 (H200, docs/benchmarks.md) */
#define VK_CM_FULL_TILES(sms) ((sms) / 2u)
#define VK_CM_BK_SMALL 64   /* its K step up to 64 rows, by default ($LLMEM_VULKAN_CM_BK=32: the
                             * old one): half the barriers and loop trips per weight byte, 0.061 ->
                             * 0.048 ms at 64 x 4096 x 4096 precise (H200, docs/benchmarks.md) */

#define VK_CM_STAGES_AUTO 3  /* its pipeline depth by default up to VK_CM_STAGES_AUTO_ROWS rows, 1
                              * above ($LLMEM_VULKAN_CM_STAGES=1 .. 4 forces one depth everywhere:
                              * 1 = one shared slice, the next slice's loads in registers; 2 .. 4
                              * = matmul_cm.comp's ring, loads issued that many K steps before
                              * their MMAs, where its two shared slices fit the device). H200, 9B
                              * tg128 precise: depth 3 takes batch 16 from 18.46 to 17.52 ms but
                              * batch 64 from 32.1 to 38.0 ms (docs/benchmarks.md) */
#define VK_CM_STAGES_AUTO_ROWS 16
#define VK_CM_STAGES_MAX 4

typedef enum vk_mm_path {
    VK_MM_MATVEC16, /* matvec16.comp: f16/bf16 weights, few rows */
    VK_MM_MATVEC,   /* matvec.comp: other weights, up to VK_MM_MV_MAX rows */
    VK_MM_COOPMAT,  /* cm_split.comp + matmul_cm.comp: tensor cores */
    VK_MM_RT,       /* matmul_rt.comp: register-tiled f32 SIMT */
    VK_MM_TILED,    /* matmul.comp: any shape */
} vk_mm_path;

/* What the device and the environment allow (vk_matmul_config). */
typedef struct vk_mm_caps {
    bool coopmat;      /* 16x16x16 f16 x f16 -> f32 cooperative matrices enabled on the device */
    uint32_t cm_bk;    /* matmul_cm's K step up to 64 rows: VK_CM_BK_SMALL, or 32 */
    uint32_t cm_stages; /* its pipeline depth up to 64 rows asked for: 1 .. VK_CM_STAGES_MAX,
                         * 0 = by rows (vk_cm_stages_for) */
    uint32_t cm_mid[5]; /* its layout at 17-64 rows (vk_cm_plan_mid: WG, SGM, FN, BK, SETS), from
                         * cm_mid_rows rows, where cm_mid_set ($LLMEM_VULKAN_CM_MID; cm_mid[0]
                         * 0: none; vk_cm_mid_cfg) */
    uint32_t cm_mid_rows;
    bool cm_mid_set;   /* $LLMEM_VULKAN_CM_MID was given (else the defaults, vk_cm_mid_cfg) */
    uint32_t cm_narrow[7]; /* the narrow layout of short fast-mode products (vk_cm_plan_narrow:
                            * WG, SGM, FN, BK, SETS, STEPS, WAVE), where cm_narrow_set
                            * ($LLMEM_VULKAN_CM_NARROW; cm_narrow[0] 0: none) */
    bool cm_narrow_set;
    uint32_t cm_fn;    /* its 16-column matrices per subgroup up to 64 rows: 1 (default), 2 or
                        * 4 ($LLMEM_VULKAN_CM_FN; vk_cm_plan_make_fn) */
    uint32_t cm_raw;   /* its epilogue: VK_CM_RAW_* ($LLMEM_VULKAN_CM_RAW; vk_cm_raw_used) */
    uint32_t cm_wave;  /* split-K up to 64 rows within this many workgroups, 0: vk_mm_split_k
                        * ($LLMEM_VULKAN_CM_WAVE; vk_cm_plan_wave) */
    bool cm_split_once; /* matmul_swiglu's gate and up products share one cm_split.comp pass of
                         * their activations ($LLMEM_VULKAN_CM_SPLIT_ONCE) */
    uint32_t smem;     /* the device's maxComputeSharedMemorySize, bytes */
    uint32_t mv16_max; /* rows up to which matvec16 runs */
    uint32_t cm_min;   /* rows from which matmul_cm runs ($LLMEM_VULKAN_CM_MIN) */
    uint32_t cm_max;   /* rows up to which it runs ($LLMEM_VULKAN_CM_MAX) */
    uint32_t cmp;      /* more than 64 rows: VK_CMP_* (matmul_cmp.comp), VK_CMP_OFF: matmul_cm */
    uint32_t cmp_tail; /* its products with more tiles than a wave split K by vk_cmp_plan_tail:
                        * VK_CMP_TAIL_* ($LLMEM_VULKAN_CMP_TAIL; vk_cmp_tail_used) */
    uint32_t cmp_tailcol; /* its products with a short last wave split only the last column
                           * tiles' K, in at most this many slices (vk_cmp_plan_tailcol;
                           * $LLMEM_VULKAN_CMP_TAILCOL; 0: off, vk_cmp_plan_tail's plans) */
    bool cmp_pair;     /* the second product of a pair split K by vk_cmp_plan_pair
                        * ($LLMEM_VULKAN_CMP_PAIR) */
    uint32_t cmp_cfg[7]; /* its layout, WG, SGM, FM, FN, BK, STAGES, WAVE (vk_cmp_plan_cfg), where
                          * cmp_cfg[0] is not 0 ($LLMEM_VULKAN_CMP_CFG; else vk_cmp_plan_make) */
    bool matvec_old;   /* $LLMEM_VULKAN_MATVEC_OLD */
    bool matmul_old;   /* $LLMEM_VULKAN_MATMUL_OLD */
    bool cm_wave_round; /* $LLMEM_VULKAN_CM_WAVE_ROUND: slices per tile by round(wave / tiles) */
    uint32_t split_wg;  /* cm_split.comp's workgroup ($LLMEM_VULKAN_SPLIT_WG; 0: by K, split_wg
                         * in vk_ops_matmul.c) */
    uint32_t presplit; /* decode-sized norms and SwiGLU write matmul_cm's f16 terms of their
                        * output ($LLMEM_VULKAN_PRESPLIT: 0 off, 1 on (default), 2 even
                        * without cooperative matrices; vk_presplit.c) */
    bool cm_khr;       /* up to VK_CMP_ROWS rows: matmul_cm.comp's KHR module (vk_cm_khr_used) */
    uint32_t dec;      /* 9 .. VK_CMP_ROWS rows: VK_DEC_* (matmul_dec.comp; vk_dec_used); AUTO
                        * only where the KHR module can run */
    uint32_t dec_fast_rows; /* AUTO in fast mode: up to these rows (0: VK_DEC_AUTO_FAST_ROWS;
                             * $LLMEM_VULKAN_DEC_FAST_ROWS) */
    bool bf16_dec, bf16_cm; /* fast mode, bf16 weights: matmul_dec.comp's / matmul_cm.comp's
                             * bf16 module instead of their f16 KHR one (VK_KHR_shader_bfloat16
                             * on, the module embedded, $LLMEM_VULKAN_BF16; vk_bf16_used) */
    bool dec_cfg_set;  /* dec_cfg replaces vk_dec_cfg_default ($LLMEM_VULKAN_DEC_CFG) */
    uint32_t dec_cfg[6]; /* WG, FN, BK, DEPTH, KA, GROUPS (vk_dec_cfg) */
    bool cm2;          /* above VK_CMP_ROWS rows: matmul_cm2.comp (VK_NV_cooperative_matrix2 on,
                        * its module embedded, $LLMEM_VULKAN_CM2_PREFILL not 0; vk_cm2_used) */
    uint32_t cm2_wg;   /* its invocations: 256 or 128 */
    uint32_t cm2_bn, cm2_bk; /* its tile columns (64 .. 256) and K step (16, 32 or 64) */
    uint32_t cm2_gran[3]; /* the device's workgroup-scope granularities M, N, K (elements)
                           * at cm2_wg invocations (0: none listed) */
    uint32_t n_sm;     /* the device's compute units the plans size their waves by (vk_sm_count
                        * or $LLMEM_VULKAN_SM_COUNT; 0: VK_SM_FALLBACK) */
} vk_mm_caps;

/* What the device says of its compute units, each 0 where its extension is not listed:
 * VK_NV_shader_sm_builtins' shaderSMCount; VK_AMD_shader_core_properties' shader engines,
 * shader arrays per engine and compute units per array; VK_AMD_shader_core_properties2's
 * activeComputeUnitCount; VK_ARM_shader_core_builtins' shaderCoreCount. */
typedef struct vk_sm_info {
    uint32_t nv_sms;
    uint32_t amd_engines, amd_arrays, amd_cus;
    uint32_t amd_active;
    uint32_t arm_cores;
} vk_sm_info;

/* The device's compute units from *q: NVIDIA's SM count; else AMD's active compute units
 * where listed, else engines x arrays x compute units per array (the whole chip, harvested
 * units included); else Arm's shader cores; 0 where none (the caller then takes
 * VK_SM_FALLBACK). *source (where not NULL) names the extension the count came from, or
 * "none". Counts above VK_SM_MAX are cut to it. Pure (tests/test_vulkan_sm.c). */
uint32_t vk_sm_count(const vk_sm_info *q, const char **source);

/* The compute units the plans use: `knob` ($LLMEM_VULKAN_SM_COUNT as vk_knobs reads it: -1
 * unset or refused) where 1 .. VK_SM_MAX, else `device` (vk_sm_count) where not 0, else
 * VK_SM_FALLBACK. Pure. */
uint32_t vk_sm_pick(int32_t knob, uint32_t device);

/* The workgroups the RMS norms' rows share at 9 .. VK_ROW_SPLIT_ROWS decode rows
 * (vk_row_split, vk_ops_basic.c), in all: sms (0: VK_SM_FALLBACK) rounded down to a multiple
 * of VK_ROW_SPLIT_ROWS, at least VK_ROW_SPLIT_ROWS, so that at 16 rows each row gets a whole
 * number of them and all fit the SMs at once (128 on the H200's 132). Pure. */
#define VK_ROW_SPLIT_ROWS 16
uint32_t vk_row_split_wgs(uint32_t sms);

/* The fewest workgroups the decode scan's grid keeps (ssm_scan_decode.comp: items per lane
 * group grow only while the grid stays at least this large; vk_ops_mamba.c) for sms compute
 * units (0: VK_SM_FALLBACK): ceil(VK_SCAN_DEC_WGS_REF x sms / VK_SM_FALLBACK), the H200's
 * measured 1024 at its 132 units scaled by the unit count (about 7.8 a unit; 512 at 66, 8 at
 * 1). $LLMEM_VULKAN_SCAN_WGS, when set, replaces it. Pure (tests/test_vulkan_sm.c). */
#define VK_SCAN_DEC_WGS_REF 1024
uint32_t vk_scan_dec_wgs(uint32_t sms);

/* The workgroups the wide SwiGLU fold aims its decode rows at (vk_presplit.c: ceil(this / rows)
 * workgroups a row, at most a row's parts) for sms compute units (0: VK_SM_FALLBACK):
 * ceil(VK_FOLD_WIDE_WGS_REF x sms / VK_SM_FALLBACK), the H200's 128 at its 132 units scaled by
 * the unit count (64 at 66, 1 at 1). Pure (tests/test_vulkan_sm.c). */
#define VK_FOLD_WIDE_WGS_REF 128
uint32_t vk_fold_wide_wgs(uint32_t sms);

/* The path of out[M, N] = a[M, K] · w[N, K]ᵀ with w of dtype w_dt, before
 * the run-time alignment checks (a shader that finds its operands
 * unaligned falls through to the next path: coopmat -> rt -> tiled). */
vk_mm_path vk_mm_pick(const vk_mm_caps *c, uint32_t m, uint32_t k, llmem_dtype w_dt);

/* The blocking of matmul_cm.comp for an [M, K] x [N, K] product: SGM x SGN
 * subgroups (SGM SGN = 8) of FM x FN 16x16 matrices, a BM x BN output tile
 * (BM = 16 FM SGM rows, BN = 16 FN SGN columns), K walked in steps of bk
 * `stages` deep (matmul_cm.comp's STAGES), and split-K into `slices` slices
 * of k_split (a multiple of bk) when the tiles alone number fewer than
 * VK_MM_GROUPS_SM workgroups an SM. Few rows (M <= 64): one subgroup row of ceil(M / 16)
 * matrices, so each weight is loaded once, and bk = small_bk; more:
 * 128 x 128 and bk = VK_CM_BK_BIG (a 64-wide step of 128 x 128 tiles would
 * not fit in 48 KiB of shared memory), depth 1, and split-K only below
 * VK_CM_FULL_TILES(sms) tiles (H200, 512 x 4096 x 4096 precise: 0.191 ms, 64 x
 * 128 tiles 0.200, either with split-K 0.22-0.23; docs/benchmarks.md). */
typedef struct vk_cm_plan {
    uint32_t sgm, sgn, fm, fn, bm, bn, bk;
    uint32_t stages; /* 1: sa + sw + cs of matmul_cm.comp; 2 .. 4: its ring, that deep */
    uint32_t tiles_m, tiles_n;
    uint32_t slices, k_split;
    /* matmul_cmp.comp only (vk_cmp_plan_tailcol): the column tiles [0, head_tn) in one slice
     * of the whole K, the rest in `slices` slices of k_split; 0: every tile in `slices` */
    uint32_t head_tn;
} vk_cm_plan;

/* Plans matmul_cm.comp's blocking for out[m, n] = a[m, k] · w[n, k]ᵀ into
 * *p (caller-owned; m, n, k in elements). small_bk: 32 or 64
 * (vk_mm_caps.cm_bk); any other value is taken as 64. stages: the depth
 * asked for up to 64 rows (vk_mm_caps.cm_stages; 0 or 1: 1, above
 * VK_CM_STAGES_MAX: that). smem: the device's shared memory per workgroup
 * in bytes. A ring (stages >= 2) takes the widest K step (64 before 32,
 * 64 only if small_bk allows it) whose VK_CM_RING_SMEM fits in smem; when
 * not even 32 fits, depth 1 as without the ring. sms: the device's compute
 * units (vk_mm_caps.n_sm; 0: VK_SM_FALLBACK), for split-K (vk_mm_split_k)
 * and VK_CM_FULL_TILES. Never fails; pure
 * (tests/test_vulkan_pick.c, tests/test_vulkan_sm.c). The pipelining follows the multistage
 * mainloops of CUTLASS's sm80 GEMMs (written from their description),
 * with the slices in flight held in registers, as GLSL has no
 * asynchronous copies. */
void vk_cm_plan_make(uint32_t m, uint32_t n, uint32_t k, uint32_t small_bk, uint32_t stages,
                     uint32_t smem, uint32_t sms, vk_cm_plan *p);

/* vk_cm_plan_make with fn 16-column matrices per subgroup up to 64 rows
 * (1, 2 or 4; others are taken as 1; vk_cm_plan_make: 1): tiles of 128 fn
 * columns, so that each activation fragment a subgroup loads from shared
 * memory feeds fn multiply-adds instead of one. The K step falls to 32
 * where the 64-wide one does not fit smem (VK_CM_SMEM), and fn halves
 * while not even that fits. Never fails; pure. */
void vk_cm_plan_make_fn(uint32_t m, uint32_t n, uint32_t k, uint32_t small_bk, uint32_t stages,
                        uint32_t smem, uint32_t sms, uint32_t fn, vk_cm_plan *p);

/* matmul_cm.comp's blocking at cfg = {WG, SGM, FN, BK, SETS}
 * (vk_mm_caps.cm_mid, $LLMEM_VULKAN_CM_MID) for an out[m, n] = a[m, k] ·
 * w[n, k]ᵀ product of 17-64 rows with `split` terms of a (2 precise, 1
 * fast) into *p (caller-owned; m, n, k in
 * elements): WG / 32 subgroups as SGM x (WG / 32 / SGM), each of FM =
 * ceil(m / (16 SGM)) x FN 16 x 16 matrices, depth 1 (one shared slice)
 * with SETS register sets of loads in flight (the shader's constant 9:
 * more than 1 only with raw tiles, which the caller sees to), K step BK,
 * one slice (the caller's vk_cm_plan_wave splits K). Against
 * vk_cm_plan_make's 1 x 8 subgroups of 64 x 16 at 64 rows, where every
 * subgroup loads the fragments of all 64 activation rows from shared
 * memory, SGM 2 (2 x 4 subgroups of 32 x 32) takes 4 fragments per 4
 * multiply-adds instead of 5, and 6 instead of 9 with precise mode's two
 * terms: 64 x 14336 x 4096 precise 0.0867 -> 0.0748 ms on the H200
 * (docs/benchmarks.md, "Vulkan decode GEMM at 32 and 64 rows: fragment
 * traffic"). Returns false, *p untouched, where cfg is not a valid layout
 * (WG 64 .. 1024 a multiple of 32 SGM, BK 32 or 64, FN 1, 2 or 4, SETS
 * 1 .. 3; m outside 17-64, split not 1 or 2) or its shared memory (split
 * terms of a, the weights, the epilogue matrices of every subgroup where
 * SETS is 1, 1 KiB of slack) passes smem bytes. Pure. */
bool vk_cm_plan_mid(uint32_t m, uint32_t n, uint32_t k, uint32_t split, const uint32_t cfg[5],
                    uint32_t smem, vk_cm_plan *p);

/* matmul_cm.comp's layouts by default (vk_cm_mid_cfg) from VK_CM_MID_ROWS to 64 rows:
 * WG, SGM, FN, BK, SETS in fast mode (16 subgroups as 2 x 8 of 32 x 32, tiles of 64 x 256,
 * two register sets of loads in flight; H200 64 x 14336 x 4096 0.0533 ms against the old
 * plan's 0.0672, 64 x 4096 x 14336 0.0497 against 0.0618) and in precise mode (2 x 4 of 32 x
 * 32, tiles of 64 x 128: 0.0748 / 0.0677 against 0.0867 / 0.0770); 9B tg128 batch 64 fast
 * 17.15-17.20 ms against 18.95-19.00, precise 19.84 against 21.41 (docs/benchmarks.md,
 * "Vulkan decode GEMM at 32 and 64 rows: fragment traffic") */
#define VK_CM_MID_ROWS 33
/* $LLMEM_VULKAN_PAIR_PLAN unset (vk_ops_matmul.c pair_plan): at VK_CM_MID_ROWS-64 rows in
 * fast mode the SwiGLU's up and gate products each planned into half the wave, so that the
 * pair is one wave (H200, 9B fast tg128 batch 64: 15.60 / 15.65 -> 15.28 / 15.29 ms, the
 * recorded step's GPU time 14.98 -> 14.68; docs/benchmarks.md, "Vulkan decode at 64 rows:
 * the SwiGLU's pair in one wave") */
#define VK_PAIR_PLAN_DEFAULT 1
#define VK_CM_MID_FAST {512u, 2u, 2u, 64u, 2u}
#define VK_CM_MID_PRECISE {256u, 2u, 2u, 64u, 1u}

/* Whether matmul_cm.comp takes a vk_cm_plan_mid layout for m rows with
 * `split` terms (2 precise, 1 fast), and which (into cfg[5]): c->cm_mid
 * from c->cm_mid_rows rows where $LLMEM_VULKAN_CM_MID set one (cm_mid[0]
 * not 0, c->cm_mid_set); none where it was "0" (c->cm_mid_set, cm_mid[0]
 * 0: the plans of vk_cm_plan_make); else VK_CM_MID_FAST or
 * VK_CM_MID_PRECISE from VK_CM_MID_ROWS rows. Up to 64 rows only. Pure. */
bool vk_cm_mid_cfg(const vk_mm_caps *c, uint32_t m, uint32_t split, uint32_t cfg[5]);

/* The narrow layout of fast mode at 33-64 rows: where VK_CM_MID_FAST's plan (after its split-K
 * into vk_mm_caps.cm_wave workgroups, VK_CM_WAVE_SM an SM by default) gives each workgroup fewer than
 * VK_CM_NARROW_STEPS K steps, 8 subgroups as 2 x 4 of 32 x 16 accumulators (VK_CM_NARROW: WG,
 * SGM, FN, BK, SETS, STEPS, WAVE; tiles of 64 x 64, two register sets, 96 registers: two
 * workgroups an SM) with K split into round(VK_CM_NARROW_WAVE_SM x SMs / tiles) slices.
 * The 64 x 256 tiles suit the 9B shape's MLP and Mamba products (16-32 K steps a workgroup),
 * but the 2b shape's short ones (N 2048 or K 2048: 4-8 steps, up to 16 slices and a large
 * sum) wait on a few memory round trips each: H200 harness with the weights streamed from
 * memory, 64 x 2048 x 4096 13.1 us against 16.9, 64 x 8192 x 2048 20.2 against 23.0, 64 x
 * 2048 x 8192 20.2 against 22.8, 64 x 1024 x 4096 9.6 against 13.0; 2b tg128 batch 64 fast
 * 8.88-8.93 -> 8.30-8.32 ms. The 9B MLP and Mamba products run 4-17% slower so (they keep the
 * wide tiles), as does 2b's in_proj (11 steps; 133 tiles: 2 slices are 266 workgroups, a wave
 * and 2), and the plugin at 3 sets, 12 or 40 steps, 132 or 528 workgroups, 128 invocations
 * (docs/benchmarks.md, "Vulkan decode at 64 rows: layouts by shape"). */
#define VK_CM_NARROW_STEPS 10
#define VK_CM_NARROW_WAVE_SM 2 /* 264 workgroups on the H200 */
/* ... its WAVE 0 here stands for VK_CM_NARROW_WAVE_SM x vk_mm_caps.n_sm */
#define VK_CM_NARROW {256u, 2u, 1u, 64u, 2u, VK_CM_NARROW_STEPS, 0u}

/* Whether an out[m, n] = a[m, k] · w[n, k]ᵀ product with `split` terms of a whose
 * vk_cm_plan_mid plan (after vk_cm_plan_wave) is *p takes the narrow layout instead, and
 * which: c->cm_narrow where c->cm_narrow_set (none where its first field is 0), else
 * VK_CM_NARROW with a wave of VK_CM_NARROW_WAVE_SM x c->n_sm (0: VK_SM_FALLBACK) workgroups;
 * only in fast mode (split 1), only where the 33-64-row layouts are the defaults
 * (c->cm_mid_set false), only where p->k_split / p->bk is below STEPS. Then cfg[5] (caller-owned) gets its WG, SGM, FN, BK, SETS and *q (caller-owned)
 * its plan: vk_cm_plan_mid at cfg, K split into round(WAVE / tiles) slices (at least 1, at most
 * k / VK_MM_MIN_SLICE; vk_cm_plan_wave). false, cfg and *q untouched, where it does not apply
 * or vk_cm_plan_mid refuses the layout (smem bytes of shared memory). Pure. */
bool vk_cm_plan_narrow(const vk_mm_caps *c, uint32_t m, uint32_t n, uint32_t k, uint32_t split,
                       const vk_cm_plan *p, uint32_t smem, uint32_t cfg[5], vk_cm_plan *q);

/* The pipeline depth to ask vk_cm_plan_make for at m activation rows:
 * `asked` (vk_mm_caps.cm_stages) when it is 1 or more, else by rows:
 * VK_CM_STAGES_AUTO up to VK_CM_STAGES_AUTO_ROWS rows and 1 above (the
 * measured choice; the planner still falls back to 1 where the ring does
 * not fit). Pure; never fails. */
uint32_t vk_cm_stages_for(uint32_t asked, uint32_t m);

/* Split-K of a product whose output tiles number `tiles` (matmul_rt.comp,
 * matmul_cm.comp): K in *slices slices of *k_split (a multiple of bk, the
 * last one shorter) so that tiles x slices reaches VK_MM_GROUPS_SM x sms
 * workgroups (sms: the device's compute units, 0: VK_SM_FALLBACK) with every
 * slice at least VK_MM_MIN_SLICE long; one slice when the tiles alone
 * reach it (or K is 0). Pure; never fails. */
void vk_mm_split_k(uint64_t tiles, uint32_t k, uint32_t bk, uint32_t sms, uint32_t *slices,
                   uint32_t *k_split);

/* matmul_cm.comp's epilogue (vk_mm_caps.cm_raw). NONE: each slice
 * writes its tile through shared memory with the row scale 2^e_r applied,
 * rows and columns outside [M, N) skipped, and split-K slices are added by
 * sum_slices.comp. RAW: each slice stores its raw accumulators with
 * coopMatStoreNV into a padded partial buffer (vk_cm_raw_layout) and
 * sum_slices_cm.comp adds them and applies 2^e_r: no shared-memory round
 * trip, no per-element stores, at the price of the partial buffer and a
 * pass even without split-K. RAW_SPLIT: RAW where K is split, NONE
 * otherwise. RAW_ALL (default): RAW everywhere (the host falls back to
 * NONE for one slice when the partial buffer cannot be allocated). H200,
 * 9B precise: tg128 batch 64 32.2 -> 29.1 ms (RAW_SPLIT), pp512 batch 1 /
 * 16 / 64 152.5 / 2025 / 9150 -> 150.5 / 1990 / 8920 ms (RAW_ALL over
 * RAW_SPLIT; docs/benchmarks.md, "Vulkan GEMM: raw split-K slices"). */
#define VK_CM_RAW_NONE 0
#define VK_CM_RAW_SPLIT 1
#define VK_CM_RAW_ALL 2
/* RAW_FUSED: RAW everywhere, and where K is split no sum pass (one slice:
 * as RAW_ALL): the workgroup that finishes a tile's last slice (an arrival counter per tile) adds the tile's
 * slices in slice order and scales its rows (matmul_cm.comp's RAW 2; the
 * results are RAW_ALL's bit for bit). The host falls back to RAW_ALL for
 * a call that gets no counters (vk_cm_ctr_take). H200, 9B precise tg128
 * batch 64: 26.88 ms against RAW_ALL's 26.72 (the last workgroup's sum
 * costs what the pass did; docs/benchmarks.md, "Vulkan GEMM: the split-K
 * sum in the last slice"), so not the default. */
#define VK_CM_RAW_FUSED 3
/* Arrival counters of RAW_FUSED: 32-bit words in one device buffer of the
 * backend, zero between dispatches (each tile's last workgroup puts its
 * counter back); calls take consecutive runs of them in turn. */
#define VK_CM_CTR_SLOTS 8192
/* matmul_swiglu's two tensor-core products share one cm_split.comp pass by
 * default (1) or not (0; $LLMEM_VULKAN_CM_SPLIT_ONCE). 0: 1 measured 26.83
 * against 26.72 ms a 9B precise batch-64 step on the H200 (noise). */
#define VK_CM_SPLIT_ONCE 0
/* the default epilogue ($LLMEM_VULKAN_CM_RAW) */
#define VK_CM_RAW_DEFAULT VK_CM_RAW_ALL

/* Whether matmul_cm.comp runs with the raw epilogue for plan *p under
 * mode raw (VK_CM_RAW_*; other values are taken as VK_CM_RAW_NONE). Pure. */
bool vk_cm_raw_used(uint32_t raw, const vk_cm_plan *p);

/* The first of `tiles` consecutive arrival counters (VK_CM_RAW_FUSED) out
 * of `slots`, taken in turn from *next (caller-owned cursor, advanced past
 * them; a run that would pass the end starts again at 0), so that calls
 * close together use different counters and the hazard tracker orders a
 * call only after the last user of the same counters. UINT32_MAX (and
 * *next unchanged) when tiles is 0 or more than slots. Pure. */
uint32_t vk_cm_ctr_take(uint32_t *next, uint64_t tiles, uint32_t slots);

/* The padded partial buffer of the raw epilogue for plan *p: *ldp floats
 * per row (tiles_n bn: whole tiles), *slice_floats floats per slice
 * (tiles_m bm ldp); the buffer holds slices x *slice_floats floats. Pure;
 * never fails. */
void vk_cm_raw_layout(const vk_cm_plan *p, uint32_t *ldp, uint64_t *slice_floats);

/* The partial buffer of a raw-tile plan *p with head_tn column tiles in
 * one slice (vk_cmp_plan_tailcol): slice 0 holds every tile as
 * vk_cm_raw_layout says (ldp floats a row, slice_floats floats); slices 1
 * .. slices - 1 hold only the split column tiles [head_tn, tiles_n), each
 * *tail_floats floats (tiles_m bm rows of *ldt = (tiles_n - head_tn) bn
 * floats) after slice 0, column c of the product at column c - head_tn bn
 * of its rows. A uniform plan (head_tn 0): *ldt = ldp, *tail_floats =
 * slice_floats, so that slice s lies at s slice_floats as before. Returns
 * the floats of the whole buffer. Pure; never fails. */
uint64_t vk_cm_raw_tail(const vk_cm_plan *p, uint32_t *ldt, uint64_t *tail_floats);

/* Re-splits K of plan *p (made for k) so that its workgroups, tiles x
 * slices, number at most `groups` (one wave where groups is the device's
 * SM count and one workgroup fits an SM): slices = floor(groups / tiles),
 * at most k / VK_MM_MIN_SLICE, at least 1; k_split whole K steps. Leaves
 * *p alone when groups is 0 or the plan has more than 64 rows of tile
 * (bm > 64). H200, raw epilogue, 64 x 4096 x 4096 precise: 4 slices (one
 * wave of 128 workgroups) 0.0280 ms, 8 (vk_mm_split_k) 0.0319, 6 0.0385;
 * 16 rows 0.0147 / 0.0166 (docs/benchmarks.md, "Vulkan GEMM: raw split-K
 * slices"). Pure; never fails. */
void vk_cm_plan_wave(vk_cm_plan *p, uint32_t k, uint32_t groups);

/* matmul_cmp.comp, the prefill GEMM with larger warp tiles, for more than
 * 64 rows (vk_mm_caps.cmp; $LLMEM_VULKAN_CMP: 1 (default) its KHR module
 * where the device lists VK_KHR_cooperative_matrix's 16 x 16 x 16 f16 x
 * f16 -> f32 shape and the build has the module, else off; 2 its NV
 * module; 0 off: matmul_cm.comp). H200, raw tiles without the sum pass
 * (tools/vk_cm_bench), precise: 512 x 4096 x 4096 matmul_cm.comp 0.173
 * ms, KHR 128 x 256 tiles in 2 slices 0.125, NV 64 x 128 tiles 0.159 (but
 * fast 0.137 against 0.115); 2048 x 4096 x 4096 0.681 -> 0.456 (KHR);
 * plugin with split and sum, 9B precise pp512 batch 1 127.6 -> 98.6 ms
 * (docs/benchmarks.md, "Vulkan prefill GEMM with larger warp tiles"). */
#define VK_CMP_OFF 0
#define VK_CMP_KHR 1
#define VK_CMP_NV 2
#define VK_CMP_ROWS 64 /* matmul_cmp runs above this many rows (matmul_cm's decode plans below) */
#define VK_CMP_BK 32
/* workgroups of one wave, per SM: the KHR plan's 256 invocations of ~232
 * registers fit once per SM of the H200 (132 workgroups), the NV plan's 128
 * of ~176 twice (264) */
#define VK_CMP_WAVE_KHR_SM 1
#define VK_CMP_WAVE_NV_SM 2

/* The workgroups of one wave of matmul_cmp.comp's default plans on a device
 * of sms compute units (0: VK_SM_FALLBACK): VK_CMP_WAVE_KHR_SM or
 * VK_CMP_WAVE_NV_SM (khr false) times sms. Pure. */
uint32_t vk_cmp_wave(bool khr, uint32_t sms);
/* vk_mm_caps.cmp_tail: vk_cmp_plan_tail for no product, every one, or precise ones (two f16
 * terms) only, the default (H200, 2b pp512 precise 39.05 -> 38.32 ms; fast within the spread:
 * docs/benchmarks.md, "Vulkan prefill GEMM: layouts and the last wave") */
#define VK_CMP_TAIL_OFF 0
#define VK_CMP_TAIL_ALL 1
#define VK_CMP_TAIL_PRECISE 2
#define VK_CMP_TAIL_DEFAULT VK_CMP_TAIL_PRECISE
/* vk_mm_caps.cmp_pair's default (vk_cmp_plan_pair; H200 9B pp512 b1 precise 87.4 -> 85.0 ms,
 * fast 66.1 -> 65.4: docs/benchmarks.md, "Vulkan prefill: gate in up's last wave") */
#define VK_CMP_PAIR_DEFAULT 1
/* Shared memory of matmul_cmp.comp, bytes: one slice of hi + lo rows of a
 * and the rows of w, each BK + 8 halves. */
#define VK_CMP_SMEM(bm, bn, bk) ((2u * (bm) + (bn)) * ((bk) / 8u + 1u) * 16u)

/* Whether matmul_cmp.comp runs for m activation rows on the tensor-core
 * path: c->coopmat, c->cmp not VK_CMP_OFF and m > VK_CMP_ROWS. Pure. */
bool vk_cmp_used(const vk_mm_caps *c, uint32_t m);

/* Plans matmul_cmp.comp for out[m, n] = a[m, k] · w[n, k]ᵀ into *p
 * (caller-owned; m, n, k in elements; p->stages 1). khr (the KHR module):
 * 128 x 256 tiles, 8 subgroups of 4 x 4 matrices (2 x 4 subgroups), else
 * 64 x 128 tiles, 4 subgroups of 2 x 4 (2 x 2); K steps of VK_CMP_BK.
 * Split-K fills one wave of vk_cmp_wave(khr, sms) workgroups (sms: the
 * device's compute units, 0: VK_SM_FALLBACK): slices = floor(wave / tiles), at most k / VK_MM_MIN_SLICE, at least 1
 * (512 x 4096 x 4096, KHR: 64 tiles, 2 slices, 0.127 ms against 0.333 in
 * one). false (and *p unusable) when the plan's shared memory
 * (VK_CMP_SMEM) exceeds smem bytes. Pure. The warp-tile hierarchy follows
 * CUTLASS's description. */
bool vk_cmp_plan_make(uint32_t m, uint32_t n, uint32_t k, bool khr, uint32_t smem, uint32_t sms,
                      vk_cm_plan *p);

/* Plans matmul_cmp.comp as vk_cmp_plan_make does but at the layout cfg[7]
 * ($LLMEM_VULKAN_CMP_CFG, "WG,SGM,FM,FN,BK,STAGES,WAVE"): WG invocations
 * (64 .. max_wg, a multiple of 32 SGM) as SGM x WG / (32 SGM) subgroups
 * of FM x FN matrices (FM FN <= 16, the shader's epilogue), K steps of BK
 * (16, 32 or 64), STAGES shared slices (1, or 2: matmul_cmp.comp's ring),
 * and split-K within WAVE workgroups (0: no split; e.g. 264 for two
 * 128-invocation workgroups an SM of the H200), as vk_cmp_plan_make
 * splits. m, n, k in elements; *p caller-owned. false (and *p unusable)
 * when cfg is out of those ranges or STAGES x VK_CMP_SMEM exceeds smem
 * bytes. Pure. */
bool vk_cmp_plan_cfg(uint32_t m, uint32_t n, uint32_t k, const uint32_t cfg[7], uint32_t smem,
                     uint32_t max_wg, vk_cm_plan *p);

/* Re-splits K of a matmul_cmp.comp plan *p (made for k, caller-owned)
 * whose tiles outnumber `wave` workgroups (one a time on each SM, all of
 * a tile's slices equally long), so that the last, partly filled wave
 * costs less: the slice count S (1 .. min(VK_CMP_TAIL_MAX, k /
 * VK_MM_MIN_SLICE)) with the least ceil(tiles S / wave) / S +
 * VK_CMP_SLICE_COST / 1000 (S - 1) tile times (the second term: each slice
 * more writes and the sum pass reads one more raw tile), the smallest S
 * on a tie; k_split whole K steps. A 496 x 8512 x 2048 product (the 2b
 * shape's in_proj, 4 x 34 = 136 tiles of 128 x 256, 4 more than one
 * wave of the H200) takes 3 slices: 408 workgroups in 4 waves of a third
 * of the work each, instead of 2 waves of whole tiles. Leaves *p alone at
 * wave 0 or at most wave tiles (vk_cmp_plan_make's one-wave split stands).
 * Pure; never fails. */
#define VK_CMP_TAIL_MAX 4
#define VK_CMP_SLICE_COST 100
void vk_cmp_plan_tail(vk_cm_plan *p, uint32_t k, uint32_t wave);

/* Re-splits K of a matmul_cmp.comp plan *p (made for k, caller-owned) for
 * the second product of a pair that nothing orders after the first (vk_sum.c
 * vk_sum_park: up's sum held while gate records, no barrier between the two
 * products), whose workgroups start as the first's last wave leaves SMs idle.
 * The first: first_tiles tiles in first_slices slices (pieces of 1 /
 * first_slices tile times, the same K and tile), ceil(first_tiles
 * first_slices / wave) rounds, the last leaving the rest of `wave` idle for
 * one piece's time, in which each idle SM runs floor(S / first_slices) of
 * this product's pieces; the rest run in ceil(rest / wave) rounds of 1 / S.
 * S (1 .. min(VK_CMP_TAIL_MAX, k / VK_MM_MIN_SLICE)) with the least finish
 * plus VK_CMP_SLICE_COST / 1000 (S - 1) tile times, the smallest on a tie;
 * k_split whole K steps. The 9B shape's gate after up (512 x 14336 x 4096,
 * 224 tiles of 128 x 256 each, 132 SMs): up's second wave leaves 40 SMs
 * idle; gate in 2 slices ends at 3.5 tile times instead of 4. Leaves *p
 * alone at wave 0, first_tiles or first_slices 0, or at most wave tiles
 * (vk_cmp_plan_make's one-wave split stands). Pure; never fails. */
void vk_cmp_plan_pair(vk_cm_plan *p, uint32_t k, uint32_t wave, uint64_t first_tiles,
                      uint32_t first_slices);

/* Re-plans a matmul_cmp.comp plan *p (made for k, caller-owned; uniform,
 * head_tn 0) whose tiles outnumber `wave` workgroups by a last wave of at
 * most wave / 2 tiles (issue 12): the column tiles of the full waves, head_tn =
 * floor(floor(tiles / wave) wave / tiles_m) of them, keep one slice of
 * the whole K, and only the remaining column tiles (rest = (tiles_n -
 * head_tn) tiles_m tiles) split K, into S = min(max_slices, k /
 * VK_MM_MIN_SLICE, floor(wave / rest)) slices of whole K steps, so that
 * their rest S pieces of 1 / S tile times run in one short wave after the
 * full ones. The 2b shape's in_proj (496 x 8512 x 2048, 4 x 34 tiles of
 * 128 x 256 on the H200's 132 SMs): 132 whole tiles, then the last column
 * tile's 4 in 8 slices of 256: about 1.125 tile times against 2 in one
 * slice and 1.33 + the slices' writes in vk_cmp_plan_tail's 3. Leaves *p
 * alone (false) at wave 0, at most wave tiles, a last wave of more than
 * wave / 2 tiles, tiles that fill whole waves, or S below 2; true when it
 * re-planned. Pure; never fails. */
#define VK_CMP_TAILCOL_DEFAULT 8 /* max_slices ($LLMEM_VULKAN_CMP_TAILCOL; 0: off) */
bool vk_cmp_plan_tailcol(vk_cm_plan *p, uint32_t k, uint32_t wave, uint32_t max_slices);

/* Whether matmul_cmp.comp's plan for a product with `split` f16 terms of
 * its activations (2 precise, 1 fast) takes vk_cmp_plan_tail: c->cmp_tail
 * VK_CMP_TAIL_ALL, or VK_CMP_TAIL_PRECISE and split 2. Pure. */
bool vk_cmp_tail_used(const vk_mm_caps *c, uint32_t split);

/* matmul_cm2.comp, the prefill GEMM on VK_NV_cooperative_matrix2's
 * workgroup-scope matrices (vk_mm_caps.cm2; off by default: slower than
 * matmul_cmp.comp on the H200, docs/benchmarks.md, "Vulkan prefill on
 * VK_NV_cooperative_matrix2"): 128-row tiles of VK_CM2_BN columns by
 * default, K steps of VK_CM2_BK, VK_CM2_WG invocations (or 128), raw
 * tiles + sum_slices_cm.comp as matmul_cmp.comp. Split-K fills one wave
 * of VK_CM2_WAVE_SM workgroups of 256 invocations an SM (twice as many of
 * 128; 132 of 256 on the H200). */
#define VK_CM2_BN 256
#define VK_CM2_BK 32
#define VK_CM2_WAVE_SM 1
#define VK_CM2_PREFILL 0 /* the default of $LLMEM_VULKAN_CM2_PREFILL */

/* Whether matmul_cm2.comp runs for m activation rows on the tensor-core
 * path: c->coopmat, c->cm2 and m > VK_CMP_ROWS. Pure. */
bool vk_cm2_used(const vk_mm_caps *c, uint32_t m);

/* Plans matmul_cm2.comp for out[m, n] = a[m, k] · w[n, k]ᵀ into *p
 * (caller-owned; m, n, k in elements) with wg invocations (128, else
 * 256): a 128 x bn tile (bn 64, 128 or 256, at most wg; others:
 * the largest allowed) in the shader's terms (sgm 2, sgn wg / 64, fm 4,
 * fn bn / (16 sgn)), K steps of bk (16, 32 or 64; others: VK_CM2_BK),
 * split-K as vk_cmp_plan_make's over VK_CM2_WAVE_SM x sms x 256 / wg
 * workgroups (sms: the device's compute units, 0: VK_SM_FALLBACK; slices =
 * floor(wave / tiles), at most k / VK_MM_MIN_SLICE, at least 1). false (and *p unusable) when the tile or the step is not a multiple
 * of the granularities gran[0..2] (M, N, K; 0 counts as 1). Pure. */
bool vk_cm2_plan_make(uint32_t m, uint32_t n, uint32_t k, uint32_t wg, uint32_t bn, uint32_t bk,
                      const uint32_t gran[3], uint32_t sms, vk_cm_plan *p);

/* One cooperative-matrix shape of the device (VkCooperativeMatrixPropertiesNV
 * with the component types and scope as booleans). */
typedef struct vk_cm_shape {
    uint32_t m, n, k;
    bool ab_f16, cd_f32, subgroup_scope;
} vk_cm_shape;

/* Whether matmul_cm.comp can run: the 16 x 16 x 16 shape with f16 A/B and
 * f32 C/D at subgroup scope is listed, subgroups are 32 wide, and the
 * workgroup's shared memory fits. */
bool vk_cm_usable(const vk_cm_shape *shapes, uint32_t n_shapes, uint32_t subgroup_size,
                  uint32_t shared_bytes);

/* Shared memory of matmul_cm.comp, in bytes, for a BM x BN tile with K
 * step bk (precise: hi and lo rows of a; rows padded by 16 bytes), plus
 * its epilogue matrices and 1 KiB of slack for the driver. */
#define VK_CM_SMEM(bm, bn, bk) \
    ((2u * (bm) + (bn)) * ((bk) / 8u + 1u) * 16u + 8u * 16u * 20u * 4u + 1024u)
/* ... at the largest blocking of each K step: what a device needs for the
 * tensor-core path at all (128 x 128, 32), and for the 64-wide step (64 x 128). */
/* ... of its ring (two slices; the epilogue matrices share their memory),
 * in bytes. */
#define VK_CM_RING_SMEM(bm, bn, bk) (2u * (2u * (bm) + (bn)) * ((bk) / 8u + 1u) * 16u + 1024u)
#define VK_CM_SHARED_BYTES VK_CM_SMEM(128u, 128u, VK_CM_BK_BIG)
#define VK_CM_SHARED_BYTES_SMALL VK_CM_SMEM(64u, 128u, VK_CM_BK_SMALL)

/* Whether matmul_cm.comp's decode plans (vk_cm_plan_make, m <= VK_CMP_ROWS
 * activation rows) run as its GL_KHR_cooperative_matrix module
 * (VK_SH_MATMUL_CM_KHR, shaders/khr/matmul_cm.spv) instead of the NV one:
 * c->coopmat and c->cm_khr (the device has VK_KHR_cooperative_matrix with
 * the 16 x 16 x 16 f16 -> f32 subgroup shape, the build embedded the
 * module, $LLMEM_VULKAN_CM_KHR is not 0) and m <= VK_CMP_ROWS. Same blocking,
 * same f16 products into f32 accumulators as the NV module. H200 harness, matmul_cm's
 * blocking at 512 x 4096 x 4096: KHR 0.155 ms, NV 0.174 (docs/benchmarks.md,
 * "Vulkan prefill GEMM with larger warp tiles"); plugin, 2b shape batch 64
 * precise: 32.1 us a call against 34.1, the step 10.56 -> 10.26 ms ("Decode
 * tiles as KHR cooperative matrices"). Pure. */
bool vk_cm_khr_used(const vk_mm_caps *c, uint32_t m);

/* matmul_dec.comp, the decode GEMM of 9 .. VK_CMP_ROWS rows that streams
 * the weights with each subgroup on its own (vk_mm_caps.dec;
 * $LLMEM_VULKAN_DEC): OFF the old plans (matmul_cm.comp's, vk_cm_plan_make);
 * KHR its GL_KHR_cooperative_matrix module where the device and the build
 * have it (else its NV one); NV its NV module; AUTO its KHR module at 9 ..
 * VK_DEC_AUTO_ROWS rows in both modes, the old plans elsewhere (and
 * everywhere without the KHR module); AUTO_FAST the same in fast mode (one
 * f16 term of the activations) only (AUTO before precise mode took it). */
#define VK_DEC_OFF 0
#define VK_DEC_KHR 1
#define VK_DEC_NV 2
#define VK_DEC_AUTO 3
#define VK_DEC_AUTO_FAST 4
#define VK_DEC_AUTO_ROWS 16
/* AUTO in fast mode runs matmul_dec up to this many rows (vk_mm_caps.dec_fast_rows where set),
 * with chunks of VK_DEC_KA_FAST_MID above VK_DEC_AUTO_ROWS. H200 harness (docs/benchmarks.md,
 * "Vulkan decode at 16 rows: GEMM layouts and the scan"): 32 x 14336 x 4096 / 32 x 4096 x 14336
 * fast 0.0476 / 0.0428 ms against the old plans' 0.0660 / 0.0597; plugin figure in
 * "Final check of the tenth session". */
#define VK_DEC_AUTO_FAST_ROWS 32
#define VK_DEC_KA_FAST_MID 64
/* $LLMEM_VULKAN_DEC unset: AUTO. H200, 16 rows fast: matmul_dec with its L2 prefetch
 * (VK_DEC_PF_*) 0.0454 / 0.0431 ms at 16 x 14336 x 4096 / 16 x 4096 x 14336 against the old
 * plans' 0.0558 / 0.0513, 9B tg128 batch 16 11.41 ms against 13.08, 2b 5.70 against 6.12
 * (docs/benchmarks.md, "Vulkan decode GEMM: the weights into L2 ahead of the stream"); 16 rows
 * precise, with 64-byte segments (VK_DEC_PF_SEG_PRECISE): 0.0540 / 0.0493 against 0.0569 /
 * 0.0527. The prefetch in the old plans, and matmul_dec at 64 rows (one tile of all rows, or
 * 32- and 16-row tiles sharing the weights through L2: 0.099-0.166 against 0.062-0.067), were
 * slower, so matmul_cm.comp stays there ("Vulkan decode GEMM at 64 rows: row tiles"; from 33
 * rows at the layouts of vk_cm_mid_cfg; matmul_dec at 64 rows with fewer registers, smaller
 * steps and chunks, touches, 4 subgroups a workgroup: 0.0703 at best against 0.0672, "Vulkan
 * decode GEMM at 32 and 64 rows: fragment traffic") */
#define VK_DEC_DEFAULT VK_DEC_AUTO
/* matmul_dec.comp's L2 prefetch (its PFD, PFL, PFS; $LLMEM_VULKAN_DEC_PF, _PF_LAG, _PF_SEG):
 * every LAG K steps each subgroup loads 4 bytes of each SEG-byte segment of its weight rows for
 * the LAG steps that start DIST steps ahead, and folds them in LAG steps later (DIST 0: off).
 * 2, 2, 32: the harness's fastest of 24 settings (4 ahead: 0.0480 ms, plugin 11.63 ms) */
#define VK_DEC_PF_DIST 2
#define VK_DEC_PF_LAG 2
#define VK_DEC_PF_SEG 32
/* ... in precise mode (two terms: twice the activations' registers and multiply-adds): a
 * touch per 64 bytes, 0.0540 ms at 16 x 14336 x 4096 against 0.0581 with 32 */
#define VK_DEC_PF_SEG_PRECISE 64

/* The blocking of matmul_dec.comp: workgroups of wg invocations (wg / 32
 * subgroups, each owning 16 fn output columns), weight K steps of bk (32,
 * 64 or 128), depth (1 .. 3) steps of weight loads in flight per
 * subgroup, the activations' terms in shared chunks of ka (a multiple of
 * bk), split-K aiming at `groups` workgroups in all, and the rows split
 * into tiles of `rows` (0: one tile of all rows; tiles of one column
 * block run side by side and share its weights through L2). */
typedef struct vk_dec_cfg {
    uint32_t wg, fn, bk, depth, ka, groups;
    uint32_t rows; /* rows a tile, a multiple of 16 (0, or m or more: all rows, one tile) */
} vk_dec_cfg;

/* A plan of matmul_dec.comp: cm as matmul_cm's (sgm 1, sgn wg / 32, fm =
 * ceil(min(m, rows) / 16), bm 16 fm, tiles_m ceil(m / bm): one tile of all
 * rows where cfg rows is 0; bn 16 fn sgn; bk; stages = the depth; tiles,
 * slices, k_split), plus the chunk ka actually used
 * (at most k_split) and apf (1: a slice has several chunks, the next one
 * is loaded during the current one). */
typedef struct vk_dec_plan {
    vk_cm_plan cm;
    uint32_t wg, ka, apf;
} vk_dec_plan;

/* Shared memory of matmul_dec.comp, bytes: the chunk's terms (split
 * terms x bm rows x ka + 8 halves) and each subgroup's staged weights (16
 * fn columns x bk + 8 halves). */
#define VK_DEC_SMEM(split, bm, ka, wg, fn, bk) \
    ((split) * (bm) * ((ka) / 8u + 1u) * 16u + (wg) / 32u * 16u * (fn) * ((bk) / 8u + 1u) * 16u)

/* The chunk of activations (KA) of matmul_dec.comp's default blocking at
 * 9-16 rows: 128 in fast mode, 64 in precise mode. H200, 16 x 14336 x 4096
 * / 16 x 4096 x 14336 (docs/benchmarks.md, "Vulkan decode at 16 rows: GEMM
 * layouts and the scan"): fast 0.0380 / 0.0357 ms against 0.0458 / 0.0433
 * with chunks of 512 (105 against 126 registers; 64: 0.0412 / 0.0386),
 * precise 0.0460 / 0.0410 against 0.0539 / 0.0493 with 512 (halved to 256
 * by shared memory; 128: 0.0632 / 0.0570). The chunk only sets how much of
 * the activations is staged at once: the same multiply-adds in the same
 * order, the same bits (tests/test_vulkan_dec.c). */
#define VK_DEC_KA_FAST 128
#define VK_DEC_KA_PRECISE 64

/* The default blocking of matmul_dec.comp at m rows with `split` f16
 * terms of a (1 fast, 2 precise) into *c (caller-owned): 256 invocations,
 * FN 1, K steps of 64, depth 2, VK_DEC_GROUPS_SM workgroups an SM of the
 * sms the device has (0: VK_SM_FALLBACK; 264 on the H200), chunks of VK_DEC_KA_FAST /
 * VK_DEC_KA_PRECISE up to 16 rows, VK_DEC_KA_FAST_MID in fast mode up to
 * VK_DEC_AUTO_FAST_ROWS rows, and 128 above (vk_dec_plan_make halves
 * them where shared memory is short): the harness's fastest at 105-122
 * registers, two workgroups an SM (docs/benchmarks.md). Pure; never
 * fails. */
#define VK_DEC_GROUPS_SM 2
void vk_dec_cfg_default(uint32_t m, uint32_t split, uint32_t sms, vk_dec_cfg *c);

/* Plans matmul_dec.comp for out[m, n] = a[m, k] · w[n, k]ᵀ with `split`
 * terms of a and blocking *c into *p (caller-owned; m, n, k in elements):
 * tiles_n = ceil(n / bn) column tiles of tiles_m row tiles (one of all
 * m rows where c->rows is 0 or at least m); slices = round(groups /
 * (tiles_n tiles_m)), at least 1, at most k / VK_MM_MIN_SLICE; k_split whole K steps;
 * ka = min(c->ka, k_split), halved (to whole K steps) while VK_DEC_SMEM
 * and 1 KiB for the driver exceed smem bytes. false (and *p unusable) when
 * m is 0 or above VK_CMP_ROWS, k is 0 or not a multiple of 8, or the
 * blocking is not one the shader takes (wg 64 .. 256 a multiple of 32; fn
 * 1 or 2; bk 32, 64 or 128; depth 1 .. 3; ka a multiple of bk; groups 1
 * or more; rows a multiple of 16), or even a chunk of one K step does not fit smem. Pure
 * (tests/test_vulkan_pick.c). */
bool vk_dec_plan_make(uint32_t m, uint32_t n, uint32_t k, uint32_t split, const vk_dec_cfg *c,
                      uint32_t smem, vk_dec_plan *p);

/* Whether matmul_dec.comp runs for m activation rows with `split` f16
 * terms of a (1 fast, 2 precise) on the tensor-core path: c->coopmat, and
 * c->dec KHR or NV with 9 <= m <= VK_CMP_ROWS, or AUTO with 9 <= m <=
 * VK_DEC_AUTO_ROWS (in fast mode, split 1, up to c->dec_fast_rows, or
 * VK_DEC_AUTO_FAST_ROWS where that is 0), or AUTO_FAST with 9 .. VK_DEC_AUTO_ROWS rows and split 1 (the caller also checks vk_mm_pick's
 * VK_MM_COOPMAT). Pure. */
bool vk_dec_used(const vk_mm_caps *c, uint32_t m, uint32_t split);

/* $LLMEM_VULKAN_BF16 unset: 0, the f16 modules everywhere. 1: fast-mode
 * products of matmul_dec.comp (9-32 rows) on bf16 matrices where the
 * device has them; 2: matmul_cm.comp's (33-64 rows) too (vk_bf16_used).
 * H200, fast mode, f16 -> bf16 module (docs/benchmarks.md, "Vulkan decode
 * GEMM on bf16 cooperative matrices"): harness, matmul_dec 16 x 14336 x
 * 4096 0.0382 -> 0.0376 ms, 16 x 4096 x 14336 0.0355 -> 0.0349, 32 rows
 * unchanged; matmul_cm at 64 rows +1% (wide layout) to +9% (narrow): the
 * activations' rounding to bf16 costs more than the weights' conversion it
 * saves; tg128 9B b16 9.98 -> 9.89 ms (-1%), 2b b16 unchanged, b64 (2)
 * +0.2 ms. Off by default: that 1% comes with bf16 instead of f16
 * activations (2^-9 against 2^-11 an element). */
#define VK_BF16_DEFAULT 0

/* Whether a fast-mode product (split 1: one f16 term of a) of m rows with
 * weights of dtype w_dt runs matmul_dec.comp's (dec true) or matmul_cm.comp's
 * (dec false) bf16 module (-DBF16=1: bf16 A and B matrices, the weights
 * staged as they are instead of converted to f16, each term of a rounded
 * to bf16 on its way into shared memory: fast mode's "bf16 activations",
 * docs/ops.md matmul_fast) instead of its f16 KHR module, same blocking and
 * interface: c->coopmat, c->bf16_dec / c->bf16_cm, split 1, bf16 weights,
 * m <= VK_CMP_ROWS (the caller has picked that shader's KHR module). Pure
 * (tests/test_vulkan_pick.c). */
bool vk_bf16_used(const vk_mm_caps *c, uint32_t m, uint32_t split, llmem_dtype w_dt, bool dec);

#endif

/* llmem Vulkan backend: activations split by their producer (issue 12):
 * the f16 terms a norm or the SwiGLU writes for the next tensor-core
 * product (vk_presplit.c), the ranges they and the residual's copies were
 * made from (vk_kept_range), and the row-wise ops' split of a row over
 * workgroups (vk_ops_basic.c). Included by the backend's sources that
 * produce, take or invalidate the terms. */
#ifndef LLMEM_VK_PRESPLIT_H
#define LLMEM_VK_PRESPLIT_H

#include "vk_internal.h"

/* Activations split by their producer (vk_presplit.c, issue 12). Rows up
 * to which a producer writes them, and the terms buffer's size (64 rows of
 * up to 32768 columns). */
#define VK_PRESPLIT_ROWS 64u
#define VK_PRESPLIT_BYTES (((size_t)8 << 20) + 4096)
/* With $LLMEM_VULKAN_PRESPLIT_ROWS above VK_PRESPLIT_ROWS (prefill-sized
 * producers too; matmul_cmp.comp reads the same terms): 512 rows of
 * 14336 columns (the 9B shape's SwiGLU output at pp512) past the norm's
 * terms of 512 x 4096 (the folded SwiGLU's place, vk_sum.h). */
#define VK_PRESPLIT_BYTES_PF (((size_t)40 << 20) + 8192)
/* The prefill ubatch of 512 rows (every pp512 product at batch 1, 16 and
 * 64), and $LLMEM_VULKAN_PRESPLIT_ROWS when unset */
#define VK_PRESPLIT_ROWS_PF 512u
#define VK_PRESPLIT_ROWS_DEFAULT VK_PRESPLIT_ROWS_PF
/* Reads $LLMEM_VULKAN_PRESPLIT into v->mm.presplit (at backend open). */
void vk_presplit_config(vk_backend *v);
/* Whether an op making an f32 [rows, cols] output should also write its
 * terms: the knob on, cooperative matrices, matmul_cm's decode rows
 * (VK_MM_MV_MAX < rows <= presplit.rows_max, rows >= cm_min), cols % 8 == 0,
 * and the terms fit in presplit.bytes. */
bool vk_presplit_want(const vk_backend *v, int64_t rows, int64_t cols);
/* Bytes of the terms of an [m, k] tensor: hi and lo f16, then e [m] i32. */
size_t vk_presplit_bytes(uint32_t m, uint32_t k);
/* *terms: the terms buffer's first vk_presplit_bytes(m, k) bytes as f32
 * words, for the producer to bind written (hi at word 0, lo at word
 * m k / 2, e at word m k). Makes the buffer on first use; LLMEM_E_NO_MEMORY
 * when it cannot (and no later producer tries again). */
llmem_status vk_presplit_target(llmem_backend *be, vk_backend *v, uint32_t m, uint32_t k,
                                llmem_tensor *terms);
/* vk_presplit_target's region starting at byte `from` rounded up to 256
 * (a producer that reads exponents from [0, from) of the buffer while it
 * writes: the folded SwiGLU, vk_sum.h); LLMEM_E_UNSUPPORTED where it does
 * not fit in the buffer. */
llmem_status vk_presplit_target_at(llmem_backend *be, vk_backend *v, uint32_t m, uint32_t k,
                                   size_t from, llmem_tensor *terms);
/* After the producer's dispatch was recorded: the terms are of out [m, k]
 * (vk_presplit_set: written at the buffer's start; _at: at byte off, the
 * target's offset), with lo where `lo`, else hi alone. */
void vk_presplit_set(vk_backend *v, llmem_ct *out, uint32_t m, uint32_t k, bool lo);
void vk_presplit_set_at(vk_backend *v, llmem_ct *out, uint32_t m, uint32_t k, size_t off,
                        bool lo);
/* Whether the terms held are those of a [m, k] (f32) as it is now (they
 * start at byte v->presplit.off of v->presplit.terms) and serve a product
 * that reads hi alone (split 1, fast mode) or hi and lo (split 2; terms
 * with lo only). The product's split is remembered for vk_presplit_lo. */
bool vk_presplit_take(vk_backend *v, llmem_ct *a, uint32_t m, uint32_t k, uint32_t split);
/* Whether a producer of `rows` rows should write lo too: false (hi alone,
 * a fast product's split 1) where $LLMEM_VULKAN_DEC_NORM has
 * VK_DEC_NORM_HI, rows <= VK_PRESPLIT_ROWS and the last product that looked
 * for terms read hi alone; a precise product then finds no lo and splits
 * its own activations (vk_presplit_take), so a wrong guess costs a
 * dispatch, never a value. */
bool vk_presplit_lo(const vk_backend *v, int64_t rows);
/* $LLMEM_VULKAN_DEC_NORM's bits (issue 12, the decode rows' norms; default
 * VK_DEC_NORM_DEFAULT): the norms' straight-line loads (rms_norm.comp DN
 * bit 0), hi-alone terms for fast products (vk_presplit_lo), the row's
 * largest output by wg_max_sg (DN bit 2): the same values at every
 * setting of these three; the sum of squares by wg_sum_sg (DN bit 3:
 * another order of the additions, within f32 rounding). Default 7: on the
 * H200, fast tg128 ms (0 -> 7, two processes each), 9B b64 16.23 / 16.19
 * -> 15.92 / 15.81, b16 9.61 / 9.58 -> 9.38 / 9.38, 2b b64 7.90 / 7.95 ->
 * 7.75 / 7.77, b16 4.73 / 4.73 -> 4.60 / 4.60 (docs/benchmarks.md
 * "Vulkan decode: the norms at 64 rows"); 15 gained at most 0.05 ms more
 * and changes bits, so it stays off. */
#define VK_DEC_NORM_LOADS 1
#define VK_DEC_NORM_HI 2
#define VK_DEC_NORM_MAX 4
#define VK_DEC_NORM_SUM 8
/* bit 4: rms_norm_gated.comp's REG loops written out (DN bit 4, WO: the same
 * bits; at REG 8 with terms its 32 bytes of local memory gone, but 16.2 us a
 * call against 14.7 on the H200, 9B precise b64: off by default) */
#define VK_DEC_NORM_WO 16
#define VK_DEC_NORM_DEFAULT (VK_DEC_NORM_LOADS | VK_DEC_NORM_HI | VK_DEC_NORM_MAX)
static inline long vk_dec_norm_mode(const vk_backend *v)
{
    return VK_KNOB(v, dec_norm, VK_DEC_NORM_DEFAULT);
}
/* Forgets the terms (a replayed step, a recording's start or end, a submit),
 * and the residual's copy (vk_resid_drop). */
void vk_presplit_drop(vk_backend *v);
/* Keeps t's device range in *k (not valid when t crosses a chunk of its
 * buffer: bound through a temporary, nothing to keep). */
void vk_kept_set(vk_kept_range *k, llmem_ct *t);
/* Whether *k is valid and t's device range is exactly it. */
bool vk_kept_is(const vk_kept_range *k, llmem_ct *t);
/* Invalidates *k when one of acc[0..n) writes into its range. */
void vk_kept_written(vk_kept_range *k, const vk_access *acc, uint32_t n);
/* vk_cmd_track's hook: forgets the terms when one of acc[0..n) writes their range
 * (and the residual's copy: vk_resid_written). */
void vk_presplit_written(vk_backend *v, const vk_access *acc, uint32_t n);
/* Frees the terms buffer (backend destroy). */
void vk_presplit_finish(llmem_backend *be, vk_backend *v);
/* out = silu(g) * u (2-D [m, k] f32, llmem_op_swiglu's arithmetic; out may
 * be g or u) through cm_split.comp's SWIGLU mode, which also writes the
 * terms of out for the next product, when vk_presplit_want says so and
 * every operand is 16-byte aligned (vk_presplit.c); where g and u are the
 * held pair of split-K sums (vk_sum.h, $LLMEM_VULKAN_SWIGLU_FOLD) it reads
 * their raw tiles instead (FOLD). *done says whether it ran (else the
 * caller runs the element-wise swiglu, which records a held pair first).
 * Statuses of vk_op_run. */
llmem_status vk_swiglu_split(llmem_backend *be, vk_backend *v, llmem_ct *g, llmem_ct *u,
                             llmem_ct *out, bool *done);
/* cm_split.comp's workgroup for m rows of k elements (vk_ops_matmul.c):
 * $LLMEM_VULKAN_SPLIT_WG when set, else 1024 at decode rows from 2048
 * elements, else 256. */
uint32_t vk_split_wg(const vk_backend *v, uint32_t m, uint32_t k);
/* Groups of 8 elements a workgroup of a split cm_split.comp converts at
 * least (vk_row_split): 256 elements. */
#define VK_SPLIT_PART_MIN 32
/* Workgroups that share each row of a row-wise op with `units` units a row
 * (the NS of rms_norm*.comp and cm_split.comp; vk_ops_basic.c). */
#define VK_ROW_SPLIT_MAX 64
uint32_t vk_row_split(const vk_backend *v, int64_t rows, int64_t units, int64_t unit_min);
/* cm_split.comp's V4 for the SwiGLU pass of m rows of k elements (vk_ops_basic.c): above
 * VK_CMP_ROWS rows (unless $LLMEM_VULKAN_PF_SWIGLU=0), the row in registers, in runs of 4
 * an invocation of 1024 (*wg set); 0 elsewhere (*wg unchanged). */
uint32_t vk_pf_split_v4(const vk_backend *v, uint32_t m, uint32_t k, uint32_t *wg);

#endif

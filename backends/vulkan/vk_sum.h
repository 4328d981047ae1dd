/* llmem Vulkan backend: the split-K sum pass after a tensor-core product
 * and its hold for the op that reads the product (vk_sum.c). Included
 * by the backend's sources that record, hold or take that pass. */
#ifndef LLMEM_VK_SUM_H
#define LLMEM_VK_SUM_H

#include "llmem/view.h"
#include "vk_presplit.h"

/* The split-K sum pass after a tensor-core product (vk_sum.c): its
 * raw-tile partial buffer part (owned; NULL: none), pt the whole of it,
 * te the rows' exponents [m] i32 (cm_split.comp's), out [m, n] f32; tiles
 * ldp floats a row, slices pslice floats apart; VK_SUM_RAW from column
 * tc0 on (matmul_cmp.comp's tail-column plan, vk_cm_raw_tail; tc0 = n:
 * none) tslices slices instead, slice 0 as the others' and slice s >= 1
 * at pslice + (s - 1) tslice, ldt floats a row from column tc0. VK_SUM_RAW:
 * sum_slices_cm.comp (slices added in order, the row's 2^e applied once);
 * VK_SUM_SCALED: sum_slices.comp (scaled tiles); VK_SUM_NONE: no pass. */
enum { VK_SUM_NONE, VK_SUM_RAW, VK_SUM_SCALED };
typedef struct vk_cm_sum {
    int kind;
    llmem_buffer *part;
    llmem_tensor pt, te, out;
    uint32_t m, n, ldp, slices, pslice;
    uint32_t tc0, tslices, ldt, tslice;
} vk_cm_sum;
/* Records the pass *s describes (nothing for VK_SUM_NONE, or when run is
 * false: an earlier failure) and frees its partial buffer; s->kind is
 * VK_SUM_NONE after. Errors: those of vk_op_run. */
llmem_status vk_cm_sum_run(llmem_backend *be, vk_backend *v, vk_cm_sum *s, bool run);
/* $LLMEM_VULKAN_SUM_HOLD unset: bit 0 (the copies) at 9-64 rows (9B fast
 * tg128 on the H200 b16 11.26 -> 11.16-11.24 ms, b64 18.91 ->
 * 18.61-18.68; 9B precise b64 21.39 -> 21.02), bit 1 (the norm) too above
 * VK_SUM_NORM_ROWS rows of at most VK_SUM_NORM_COLS (2b b64 fast 9.19 ->
 * 9.02, precise 9.86 -> 9.68; where the norm's 9-64 workgroups read every
 * slice of fewer or wider rows they lose: 9B fast b16 11.29, b64 18.83;
 * docs/benchmarks.md "The decode step around the GEMM"). Where the norm's
 * rows are split over workgroups (vk_row_split; by default at 9-16 rows):
 * bit 3, the held sum folds into the split norm (x's values from the
 * residual's copy, below) at most VK_SUM_NORM_COLS columns (2b fast b16
 * on the H200 5.24-5.27 -> 5.10-5.17 ms); bit 2,
 * elsewhere the pass adds itself into x first (vk_sum_add_into; 9B fast
 * b16 10.11-10.15 -> 9.95-10.05, where the fold took 10.06; docs/
 * benchmarks.md "Vulkan decode at 16 rows: rows over several
 * workgroups"). Above VK_PRESPLIT_ROWS rows (the prefill ubatches) bits 0
 * and 1 alone: the pass writes z / xBC / dt itself (9B pp512 precise on the
 * H200: `copy` 1.20 ms a prefill -> 0, `sum_slices_cm` +0.22) and the
 * residual add + norm reads the raw tiles (rms_norm.comp V4 with ADD 2;
 * docs/benchmarks.md "Vulkan prefill around the GEMM, twelfth session").
 * The folds' width limit (VK_SUM_NORM_COLS) holds only with
 * $LLMEM_VULKAN_NORM_FOLD=0 or 1 (below): with the slices unrolled they
 * pay at 4096 columns too. A set value (0..15) applies at every shape. */
#define VK_SUM_NORM_ROWS 16
#define VK_SUM_NORM_COLS 2048

/* $LLMEM_VULKAN_NORM_FOLD where set, else VK_NORM_FOLD_DEFAULT (issue 12,
 * the residual sums of out_proj, down and o_proj in the add + RMS norm):
 * bit 0 (VK_NORM_FOLD_UNROLL), the norm that reads a held sum's raw tiles
 * (rms_norm.comp ADD 2) gets the slice count as a specialization constant
 * (SL, at most VK_NORM_FOLD_SLICES) and unrolls the slices' loads; bit 1
 * (VK_NORM_FOLD_WIDE), the one-workgroup-a-row fold (SUM_HOLD bit 1) above
 * VK_SUM_NORM_ROWS rows at every width, not only up to VK_SUM_NORM_COLS;
 * bit 2 (VK_NORM_FOLD_SPLIT), the split fold (SUM_HOLD bit 3) at every
 * width. Only the unset SUM_HOLD's defaults widen; the same bits at every
 * value (the sums in slice order, then 2^e, as the pass). Default 7: on
 * the H200, fast tg128 ms (0 -> 7), 9B b16 9.73 -> 9.57-9.62, b64 16.45 ->
 * 16.21-16.26, 2b b16 4.79-4.83 -> 4.71-4.73, b64 7.96-8.00 -> 7.85
 * (docs/benchmarks.md "Vulkan decode: the residual sums in the norm"). */
#define VK_NORM_FOLD_UNROLL 1
#define VK_NORM_FOLD_WIDE 2
#define VK_NORM_FOLD_SPLIT 4
#define VK_NORM_FOLD_SLICES 16
#define VK_NORM_FOLD_DEFAULT (VK_NORM_FOLD_UNROLL | VK_NORM_FOLD_WIDE | VK_NORM_FOLD_SPLIT)
static inline long vk_norm_fold_mode(const vk_backend *v)
{
    return VK_KNOB(v, norm_fold, VK_NORM_FOLD_DEFAULT);
}

/* Holds *s (issue 12, the decode step and prefill) where the mode allows
 * (bit 0: for column copies, bits 1-3: for add + RMS norm) and *s is a
 * VK_SUM_RAW pass of more than VK_MM_MV_MAX rows with an f32 output, nothing else being
 * held: takes its partial buffer and `terms` (the exponents' buffer when
 * the caller would free it; NULL when borrowed from the presplit buffer),
 * records nothing, returns true; else false and nothing is taken. The
 * held pass is recorded (vk_sum_flush) before anything else is tracked
 * (vk_held_flush, as the other holds), except by its readers below. Every
 * path gives the same bits as the pass followed by the op. */
bool vk_sum_hold(llmem_backend *be, vk_backend *v, vk_cm_sum *s, llmem_buffer *terms);
/* The fold of the up and gate products' sums into the SwiGLU (issue 12;
 * $LLMEM_VULKAN_SWIGLU_FOLD, unset: on). At 9-VK_PRESPLIT_ROWS rows the
 * FFN records up = x · W_upᵀ, gate = x · W_gateᵀ, then silu(gate) * up:
 * two sum passes whose only reader is the SwiGLU. vk_sum_park, called by
 * matmul_cm before it records a product of m rows whose output touches
 * nothing the held pass reads or writes and whose reads[0..n_reads) (its
 * weights and terms) are clear of what it writes, while the previous
 * product's sum is held alone (no copies taken, the same m): sets that
 * hold aside so that the product's recording does not record it, and
 * returns true; vk_sum_unpark(v, parked, pair) after the recording puts
 * it back, and where pair (the product ran) the product's own sum, if
 * the next vk_sum_hold takes it, is held beside it (the pair). A pair is
 * recorded in the order the products came (vk_sum_flush) by everything
 * but its reader below; the other readers (copies, norms) take no pair.
 * Ownership: the hold frees both products' partial buffers (and
 * exponents' buffers it took). vk_sum_swiglu_ok: whether the
 * pair is g's and u's sums ([m, n] f32 each, the held outputs); if so
 * *gs and *us describe them (the hold keeps their buffers): the caller
 * (vk_swiglu_split) binds their raw tiles and exponents to cm_split.comp
 * FOLD, takes the hold off the pending list (v->sum_pending = false)
 * before it records, and calls vk_sum_taken after. */
/* $LLMEM_VULKAN_SWIGLU_FOLD where set, else VK_FOLD_DEFAULT: bits 0-1
 * the decode rows' SwiGLU (0 no fold, 1 each of a row's workgroups keeps
 * the row in registers, 2 the row read twice), VK_FOLD_PREFILL the fold
 * above VK_PRESPLIT_ROWS rows too (its terms past the norm's: needs
 * VK_PRESPLIT_BYTES_PF), VK_FOLD_WIDE at 9-64 rows ceil(vk_fold_wide_wgs /
 * rows) workgroups a row at least (128 at the H200's 132 units) (vk_row_split's 1 above 16 rows). Default
 * 1 | 4 | 8, on the H200 (docs/benchmarks.md "Vulkan decode: the up and
 * gate sums in the SwiGLU"): 9B fast tg128 b16 9.93-10.00 -> 9.72 ms,
 * b64 16.88-16.90 -> 16.70-16.78 (1), -> 16.41-16.44 (9); 2b fast b16
 * 5.05 -> 4.85, b64 8.36 -> 8.03 (1); 9B precise b16 11.00 -> 10.66;
 * 9B pp512 precise 87.4-88.1 -> 86.8-87.0 (5). */
#define VK_FOLD_PREFILL 4
#define VK_FOLD_WIDE 8
#define VK_FOLD_DEFAULT (1 | VK_FOLD_PREFILL | VK_FOLD_WIDE)
static inline long vk_sum_fold_mode(const vk_backend *v)
{
    return VK_KNOB(v, swiglu_fold, VK_FOLD_DEFAULT);
}
bool vk_sum_park(vk_backend *v, uint32_t m, llmem_ct *out, llmem_ct *const *reads,
                 uint32_t n_reads);
void vk_sum_unpark(vk_backend *v, bool parked, bool pair);
bool vk_sum_swiglu_ok(vk_backend *v, llmem_ct *g, llmem_ct *u, vk_cm_sum *gs, vk_cm_sum *us);
/* Records the held pass (both, for a pair), with the copies it took, and
 * frees the hold's buffers (nothing when none is held). Errors: those of
 * vk_op_run. */
llmem_status vk_sum_flush(vk_backend *v);
/* vk_sum_flush when t overlaps what the held pass reads or writes (for an
 * op that consults host-side state about t before it records: the
 * presplit take of cm_split_run). */
llmem_status vk_sum_flush_if(vk_backend *v, const llmem_tensor *t);
/* llmem_op_copy (vk_ops_basic.c) of dst [rows, w] f32 = src[:, col0 ..
 * col0 + w): where src is the held output, dst clear of everything the
 * pass touches and fewer than 3 copies taken, the pass will write dst too
 * (*taken true, nothing recorded); else the held pass is recorded first
 * (*taken false: the caller copies). Errors: those of vk_sum_flush. */
llmem_status vk_sum_take_copy(vk_backend *v, llmem_ct *src, int32_t col0, llmem_ct *dst,
                              bool *taken);
/* The decode conv folded into in_proj's held sum (issue 12, fifteenth
 * session; $LLMEM_VULKAN_SUM_CONV where set, else VK_SUM_CONV_DEFAULT):
 * bit 0 (VK_SUM_CONV_FOLD) the fold below; bit 1 (VK_SUM_CONV_VEC4) at
 * 9-VK_PRESPLIT_ROWS rows a held pass with copies moves 4 columns an
 * invocation where everything is 16-byte aligned (sum_slices_cm.comp
 * VEC4; the conv four channels, an f32 state as 16-byte vectors).
 * For vk_op_ssm_conv (vk_ops_mamba.c), the Mamba-2 causal conv1d with conv
 * state `state` of view (x [T, conv_dim] f32, w [conv_dim, 1, d_conv], b
 * [conv_dim] or NULL, f32/f16/bf16; out [T, conv_dim] f32; checked by the
 * backends/ops wrapper): where bit 0 is set, a held pass of 9 to
 * VK_PRESPLIT_ROWS rows took x as one of its column copies, the view has
 * one token for each of its rows (stream r = row r), no checkpoints, no
 * snapshot table, no source slot another stream writes, d_conv - 1 <= 14,
 * and out and the state buffer are clear of everything the pass touches,
 * the pass will do the conv too (sum_slices_cm.comp CONV: the conv's
 * arithmetic in ssm_conv.comp's order, so the same bits; the state read
 * from src_slot, shifted into dst_slot) and *taken is true: nothing is
 * recorded, the conv's 9B Bamba dispatch (one of 29 a step) and its
 * barrier go. Else *taken is false and nothing changes (the conv's own
 * recording records the held pass first). The tensors, the tables' offsets
 * and the view's index and state buffers are kept (those buffers must live
 * until the pass is recorded, as for any recorded op). Errors: none today
 * (LLMEM_OK). Default 1: on the H200, fast tg128 ms, 0 -> 1, 9B b64
 * 15.80-15.85 -> 15.67 (CUDA 11.92), b16 9.34-9.39 -> 9.24-9.25, 2b b64
 * 7.74-7.78 -> 7.57-7.59, b16 4.64 -> 4.57; 3 at 9B b64 15.68-15.87, no
 * gain (docs/benchmarks.md "Vulkan decode: the conv in in_proj's sum"). */
#define VK_SUM_CONV_FOLD 1
#define VK_SUM_CONV_VEC4 2
#define VK_SUM_CONV_DEFAULT VK_SUM_CONV_FOLD
/* llmem_op_discard of what a held pass with column copies writes
 * (vk_ops_discard.c, vk_sum_drop_dead below; $LLMEM_VULKAN_DISCARD 0..3 where set, else
 * VK_DISCARD_DEFAULT): bit 0 (VK_DISCARD_OUT) a discarded output is not
 * written, the copies and the conv are; bit 1 (VK_DISCARD_COPY) a
 * discarded copy is not written (the conv that took it reads the value
 * in registers); 0: the discard does nothing. Default 3: on the H200,
 * fast tg128 (0 -> 3), 9B b64 15.77 -> 15.68 ms (means of five pairs in
 * three calls), b16 9.35 -> 9.32; 2b b16 / b64 within the spread
 * (docs/benchmarks.md "Vulkan decode: dead outputs"). */
#define VK_DISCARD_OUT 1
#define VK_DISCARD_COPY 2
#define VK_DISCARD_DEFAULT (VK_DISCARD_OUT | VK_DISCARD_COPY)
/* While a pass with column copies is held (SUM_HOLD bit 0: in_proj's z,
 * xBC and dt; models/forward.c discards the product once they are copied,
 * and xBC once the conv has read it) and t's contents are dead: with
 * VK_DISCARD_OUT in mode, where t covers the pass's whole output, the pass
 * does not write it (raw_pass's no_out); with VK_DISCARD_COPY, where t
 * covers a copy's destination, not that copy (a conv folded into the pass
 * reads its input in registers). At 9B Bamba b64 each is 2.2 MB of the
 * pass's writes a layer. Anything else (nothing held, another pass, t
 * covering neither): nothing is dropped. */
void vk_sum_drop_dead(vk_backend *v, llmem_ct *t, long mode);
llmem_status vk_sum_take_conv(vk_backend *v, const llmem_view *view, int32_t state, llmem_ct *x,
                              llmem_ct *w, llmem_ct *b, llmem_ct *out, bool *taken);
/* For rms_norm (vk_ops_basic.c): whether x += r; out = norm(x) may read r
 * from the held sum (mode bit 1, or bit 3 where the norm's rows are split
 * over workgroups: parts; r and out the held output, x clear of the pass,
 * the norm's terms (split, the first split_bytes of the presplit buffer)
 * clear of the exponents it reads, but for each row's own unless parts).
 * vk_sum_norm_bind: if so binds the partial buffer and the exponents as
 * bindings 5 and 6 of op, pushes rms_norm.comp's five ADD 2 words and
 * takes the hold off the pending list. vk_sum_taken, after the norm is
 * recorded (or failed), frees the hold's buffers. */
bool vk_sum_norm_ok(vk_backend *v, llmem_ct *x, llmem_ct *r, llmem_ct *out, bool split,
                    size_t split_bytes, bool parts);
bool vk_sum_norm_bind(vk_backend *v, vk_op *op, llmem_ct *x, llmem_ct *r, llmem_ct *out,
                      bool split, size_t split_bytes, bool parts);
void vk_sum_taken(vk_backend *v);
/* After vk_sum_norm_bind took the hold (before vk_sum_taken): rms_norm.comp's
 * SL, the held sum's slice count where vk_norm_fold_mode has
 * VK_NORM_FOLD_UNROLL and it is at most VK_NORM_FOLD_SLICES, else 0 (the
 * loop over the push constant's count). */
uint32_t vk_sum_norm_slices(const vk_backend *v);
/* For rms_norm (vk_ops_basic.c) of rows rows, before it plans its row
 * split: where r is the held output (the add + norm may fold its sum) at
 * 9-VK_PRESPLIT_ROWS rows and $LLMEM_VULKAN_NORM_FOLD_WGS is set, the
 * workgroups that norm should have in all (its rows split over
 * ceil(wgs / rows) each); else 0 (vk_row_split's default). Unset by
 * default: on the H200 9B fast tg128 b64 16.20-16.25 ms unset, 16.27-16.28
 * with 128 (2 a row); b16 9.50-9.53 unset (8 a row), 9.51-9.52 with 64;
 * 2b the same within the spread (docs/benchmarks.md "Vulkan decode: the
 * residual sums in the norm"). */
uint32_t vk_sum_norm_wgs(const vk_backend *v, int64_t rows, llmem_ct *r);
/* Whether a held sum's raw tiles can be read as 16-byte runs (rms_norm.comp
 * V4 with ADD 2): the tile pitch and slice stride multiples of 4 floats,
 * the partial buffer's range 16-byte aligned. False when none is held. */
bool vk_sum_norm_vec4(const vk_backend *v);
/* For rms_norm split over workgroups (vk_ops_basic.c), which cannot add
 * r into x in place itself (each workgroup reads the whole row of x):
 * where mode bit 2 is on, r and out are the held output and
 * x [m, n] f32 is clear of the pass, records the held pass now adding its
 * sum into x (sum_slices_cm.comp ADDX: x = x + r, the norm's own add on
 * the same values; r is not written, out is the norm's) and sets *added;
 * else does nothing (*added false: the caller adds r itself, where the
 * held pass is taken by vk_sum_norm_bind or recorded first as usual).
 * Errors: those of vk_op_run. */
llmem_status vk_sum_add_into(vk_backend *v, llmem_ct *x, llmem_ct *r, llmem_ct *out, bool *added);
/* Records a held pass and frees the hold and the residual's copies (at
 * close, before vk_cmd_finish). */
void vk_sum_finish(vk_backend *v);

/* The residual's copies (issue 12). An add + RMS norm (x += r; out =
 * norm(x)) split over workgroups a row cannot read x where it writes it:
 * another workgroup of the row may have written its part already. So the
 * split norms also write x as they leave it to one of two backend-owned
 * copies (VK_RESID_ROWS x VK_RESID_COLS f32 each), and the next add + norm
 * of the same x reads x's values from that copy (rms_norm.comp XS) while
 * it writes x and the other copy: the residual add folds into the norm,
 * which reads the held split-K sum itself (ADD 2), with each row over
 * several workgroups. The copy is x's only while nothing else writes x:
 * every tracked write that overlaps x forgets it (vk_resid_written, with
 * the presplit's hook), and so do a replayed step, a recording's start or
 * end and a submit (vk_resid_drop, vk_presplit_drop). */
#define VK_RESID_ROWS VK_PRESPLIT_ROWS
#define VK_RESID_COLS 8192u
/* Whether a copy holds x ([rows, cols] f32) as it is now; if so *src is
 * that copy as a tensor of x's shape. */
bool vk_resid_src(vk_backend *v, llmem_ct *x, llmem_tensor *src);
/* *dst: the copy that does not hold x, as a tensor of x's shape, for the
 * norm to write (the buffers made on first use). LLMEM_E_INVALID: x is
 * not f32 of at most VK_RESID_ROWS x VK_RESID_COLS; LLMEM_E_NO_MEMORY. */
llmem_status vk_resid_dst(llmem_backend *be, vk_backend *v, llmem_ct *x, llmem_tensor *dst);
/* After the norm that wrote *dst was recorded: that copy holds x. */
void vk_resid_set(vk_backend *v, llmem_ct *x, const llmem_tensor *dst);
/* Forgets the copy when one of acc[0..n) writes x's range; forgets it. */
void vk_resid_written(vk_backend *v, const vk_access *acc, uint32_t n);
void vk_resid_drop(vk_backend *v);

/* The SwiGLU's pair planned as one wave (vk_sum.c, $LLMEM_VULKAN_PAIR_PLAN, unset:
 * VK_PAIR_PLAN_DEFAULT). vk_pair_plan: whether a product of m rows with `split` terms of a
 * and weights w (buffer, byte offset, n rows of k) gets half the wave: at VK_CM_MID_ROWS-64
 * rows in fast mode, where w was the first of a pair before (not parked) or the product
 * whose held sum this one parked (parked) was planned so. vk_pair_learn, after such a
 * product recorded (planned: it got half the wave): remembers the product before as the
 * first of a pair where this one parked its sum with the same m, n and k, and this one as
 * the last. vk_pair_forget (vk_buffer_free): drops what names buf. */
bool vk_pair_plan(const vk_backend *v, const struct vk_pair_w *w, uint32_t m, uint32_t split,
                  bool parked);
void vk_pair_learn(vk_backend *v, const struct vk_pair_w *w, uint32_t m, bool parked,
                   bool planned);

#endif

/* llmem CUDA launchers for prefill-sized ubatches (kernels/prefill.cu, and
 * the bf16-shadow norms of kernels/basic.cu). Each returns
 * cudaErrorNotSupported, launching nothing, when its alignment or shape
 * conditions do not hold; the caller then runs the general kernel. All
 * tensors are row-major device arrays; "bf16 of x" is cuk_f32_to_bf16
 * (round to nearest even, NaN kept quiet), which is what
 * cuk_split_bf16's hi term holds. */
#ifndef LLMEM_KERNELS_PREFILL_H
#define LLMEM_KERNELS_PREFILL_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst [rows, cols] f32 = columns [col0, col0 + cols) of src [rows,
 * src_cols] f32, 16 bytes per thread. Needs src_cols, col0 and cols
 * multiples of 4, src and dst 16-byte aligned, rows and cols > 0. Equal to
 * cuk_copy(src, f32, src_cols, col0, dst, f32, rows, cols). */
cudaError_t cuk_copy_cols_f32(const float *src, int64_t src_cols, int64_t col0, float *dst,
                              int64_t rows, int64_t cols, cudaStream_t stream);

/* out[i] = silu(gate[i]) * up[i] for n f32 elements (out may be gate or
 * up), bit for bit cuk_elementwise(CUK_EW_SWIGLU); o16, when not NULL,
 * receives bf16(out[i]). Needs n a positive multiple of 4, gate, up and out
 * 16-byte aligned, o16 8-byte aligned. */
cudaError_t cuk_swiglu4(const float *gate, const float *up, float *out, uint16_t *o16, int64_t n,
                        cudaStream_t stream);

/* (kernels/basic.cu) cuk_add_rms_norm (r not NULL) or cuk_rms_norm (r
 * NULL) on the register path, plus o16 [rows, cols] = bf16(out). Needs
 * cols a multiple of 4 and at most 16384, x, r and out 16-byte aligned, o16
 * 8-byte aligned. */
cudaError_t cuk_rms_norm_b16(float *x, const float *r, const void *w, int wdt, int64_t rows,
                             int64_t cols, float eps, float *out, uint16_t *o16,
                             cudaStream_t stream);

/* (kernels/basic.cu) cuk_rms_norm_gated on the register path, plus o16
 * [rows, cols] = bf16(out). Needs cols and cols / groups multiples of 4,
 * cols / groups at most 16384, y, z and out 16-byte aligned, o16 8-byte
 * aligned. */
cudaError_t cuk_rms_norm_gated_b16(const float *y, const float *z, const void *w, int wdt,
                                   int64_t rows, int64_t cols, int64_t groups, float eps,
                                   float *out, uint16_t *o16, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

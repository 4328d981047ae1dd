/* llmem CUDA kernels: the launchers of moe.cu (mixture of experts,
 * <llmem/ops_moe.h>), declared beside their kernels so that
 * kernels/kernels.h names no open op (<llmem/ops_impl.h>, "Open ops").
 * Rules as kernels/kernels.h. */
#ifndef LLMEM_CUDA_KERNELS_MOE_H
#define LLMEM_CUDA_KERNELS_MOE_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llmem_op_moe_route: logits [T, E] -> ids [T, k], wts [T, k]; bias [E] of
 * dtype bdt or NULL. Needs n_group <= 32 and 2E floats of shared memory. */
cudaError_t cuk_moe_route(const float *logits, const void *bias, int bdt, int32_t *ids,
                          float *wts, int64_t T, int32_t E, int32_t k, int sigmoid, int norm,
                          int32_t n_group, int32_t topk_group, float scale, cudaStream_t stream);
/* llmem_op_moe_ffn: x [T, D], ids/wts [T, k], up [E, (gated ? 2 : 1) I, D],
 * down [E, D, I] of dtype wdt -> out [T, D]; scratch holds T*k*(I + D)
 * floats, then E + 1 + T*k int32; act 0 silu, 1 relu2. From
 * CUK_MOE_GROUP_MIN pairs up, the pairs are grouped by expert on the device
 * (each expert row read once per step); below, one warp per (pair, row). */
#define CUK_MOE_GROUP_MIN 16
cudaError_t cuk_moe_ffn(const float *x, const int32_t *ids, const float *wts, const void *up,
                        const void *down, int wdt, float *out, float *scratch, int64_t T,
                        int32_t D, int32_t I, int32_t E, int32_t k, int gated, int act,
                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

/* llmem CUDA kernels: the launchers of ssd.cu, the chunked SSD prefill scan
 * of the Mamba-2 ssm_scan op (Dao & Gu 2024, "Transformers are SSMs",
 * Sec. 6), declared beside their kernels. Rules as kernels/kernels.h. */
#ifndef LLMEM_CUDA_KERNELS_SSD_H
#define LLMEM_CUDA_KERNELS_SSD_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether cuk_ssd_scan takes this call (1) or the per-token cuk_ssm_scan
 * should (0): f32/f16/bf16 state, head_dim <= 64, d_state <= 128, n_groups
 * dividing n_heads, and at least $LLMEM_CUDA_SSD_MIN tokens per stream
 * (default 64; 0 = never). The variable is read once per process. */
int cuk_ssd_applies(const cuk_rs_args *rs, const cuk_scan_args *p);

/* The Mamba-2 selective scan of cuk_ssm_scan (<llmem/ops.h>
 * llmem_op_ssm_scan: same inputs, y [T, H * P] f32, state read from each
 * stream's source or snapshot, written to its checkpoints and dst) as
 * chunks of 64 tokens on tensor cores, one CTA per (stream, head). Operands
 * are bf16 hi + lo splits (three MMAs per product, about 2^-16 relative
 * error), or single bf16 when p->fast (the FAST precision mode) or with
 * $LLMEM_CUDA_SSD_FAST=1. Enqueued on `stream`;
 * cudaErrorInvalidValue outside the shapes of cuk_ssd_applies or for
 * negative counts, else the launch status. */
cudaError_t cuk_ssd_scan(const cuk_rs_args *rs, const cuk_scan_args *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

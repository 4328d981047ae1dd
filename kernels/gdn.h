/* llmem CUDA kernels: the launchers of gdn.cu (gated delta net,
 * <llmem/ops_gdn.h>), declared beside their kernels so that
 * kernels/kernels.h names no open op (<llmem/ops_impl.h>, "Open ops").
 * Rules as kernels/kernels.h. */
#ifndef LLMEM_CUDA_KERNELS_GDN_H
#define LLMEM_CUDA_KERNELS_GDN_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuk_gdn_args {
    int32_t n_k_heads, n_v_heads, d_k, d_v;
    const float *qkv, *a, *b; /* [T, width], [T, H_v], [T, H_v] */
    const void *a_log, *dt_bias;
    int32_t al_dt, db_dt;
    float *out;               /* [T, H_v * d_v] */
    int64_t width;            /* 2 * H_k * d_k + H_v * d_v */
} cuk_gdn_args;

/* Whether the gated delta rule kernel handles this d_k (1..256: one column of
 * d_k floats per thread in registers). */
int cuk_gdn_supported(int32_t d_k);
/* Gated delta rule, recurrent form, with the state {H_v, d_k, d_v}. */
cudaError_t cuk_gdn(const cuk_rs_args *rs, const cuk_gdn_args *a, cudaStream_t stream);
/* out[i] = x[i] * sigmoid(gate[row, col / (cols / cg)]), n elements. */
cudaError_t cuk_sigmoid_mul(const float *x, const float *gate, float *out, int64_t n,
                            int64_t cols, int64_t cg, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

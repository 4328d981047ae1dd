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
    int32_t split;            /* rows of a state column per thread: 16 or 32
                               * (gdn_split_kernel, the column over d_k / split
                               * lanes), or 0: gdn_kernel, a column per thread */
} cuk_gdn_args;

/* Whether the gated delta rule kernels handle this d_k (1..256: a column of
 * d_k floats in the registers of one to 16 threads). */
int cuk_gdn_supported(int32_t d_k);
/* Gated delta rule, recurrent form, with the state {H_v, d_k, d_v};
 * cudaErrorInvalidValue for a->split other than 0, 16, 32. */
cudaError_t cuk_gdn(const cuk_rs_args *rs, const cuk_gdn_args *a, cudaStream_t stream);
/* out[i] = x[i] * sigmoid(gate[row, col / (cols / cg)]), n elements. */
cudaError_t cuk_sigmoid_mul(const float *x, const float *gate, float *out, int64_t n,
                            int64_t cols, int64_t cg, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

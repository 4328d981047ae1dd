/* llmem CUDA kernels: the launchers of ssm1.cu (LFM2 short conv, Mamba-1
 * scan), declared beside their kernels so that kernels/kernels.h names no
 * open op (<llmem/ops_impl.h>, "Open ops"). Rules as kernels/kernels.h. */
#ifndef LLMEM_CUDA_KERNELS_SSM1_H
#define LLMEM_CUDA_KERNELS_SSM1_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LFM2 gated short conv: bcx [T, 3 dim] = [B | C | x] -> out [T, dim],
 * conv state {L - 1, dim} (2 <= L <= 16). */
cudaError_t cuk_short_conv(const cuk_rs_args *rs, const float *bcx, const void *w, int wdt,
                           const void *b, int bdt, float *out, int32_t dim, int32_t L,
                           cudaStream_t stream);

typedef struct cuk_scan1_args {
    int32_t d_inner, d_state;
    const float *x, *dt, *b, *c, *z; /* z may be NULL */
    const void *a_log, *d, *dt_bias; /* d, dt_bias may be NULL */
    int32_t a_dt, d_dt, b_dt;
    float *y;
} cuk_scan1_args;

/* Whether the Mamba-1 scan kernel handles this d_state (<= 256). */
int cuk_ssm_scan1_supported(int32_t d_state);
/* Mamba-1 selective scan, recurrent form, with ssm state {d_inner, d_state}. */
cudaError_t cuk_ssm_scan1(const cuk_rs_args *rs, const cuk_scan1_args *a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

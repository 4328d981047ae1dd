/* llmem CUDA kernels: the row-block GEMV of one activation row (gemv.cu),
 * with an RMS norm of its input and a residual add or SwiGLU of its output
 * fused in (issue 11, batch-1 decode). Declared beside its kernel so that
 * kernels/kernels.h names no open op. Rules as kernels/kernels.h. */
#ifndef LLMEM_CUDA_KERNELS_GEMV_H
#define LLMEM_CUDA_KERNELS_GEMV_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Input transforms (cuk_gemv_rows.norm). */
enum {
    CUK_GN_NONE = 0,  /* a = x */
    CUK_GN_RMS = 1,   /* a = x * r * nw,          r = 1 / sqrt(mean(x²) + eps) */
    CUK_GN_GATED = 2, /* a = g * r * nw, g = x * silu(z), r = 1 / sqrt(mean(g²) + eps) */
};
/* Output epilogues (cuk_gemv_rows.epi). */
enum {
    CUK_GE_STORE = 0,  /* out[j] = a · w[j] */
    CUK_GE_ADD = 1,    /* out[j] += a · w[j] (a residual add) */
    CUK_GE_SWIGLU = 2, /* out[j] = silu(a · w[j]) * (a · w2[j]) */
};

typedef struct cuk_gemv_rows {
    const float *x;  /* [M, K] f32, the activation rows (y of the gated norm) */
    const float *z;  /* [M, K] f32, the gate of CUK_GN_GATED, else NULL */
    const void *nw;  /* [K] norm weight of dtype nwdt, or NULL (no weight) */
    int32_t nwdt;    /* llmem_dtype code: 0 f32, 1 f16, 2 bf16 */
    int32_t norm;    /* CUK_GN_* */
    float eps;
    const void *w;   /* [N, K] of dtype wdt, rows 16-byte aligned */
    const void *w2;  /* [N, K] up projection of CUK_GE_SWIGLU, else NULL */
    int32_t wdt;     /* llmem_dtype code: 0 f32, 1 f16, 2 bf16 */
    int32_t epi;     /* CUK_GE_* */
    float *out;      /* [N] f32; must not overlap x, z */
    int32_t m;       /* rows of x, z and out ([M, K], [M, N]): 1..CUK_GEMV_MAX_M (0: 1) */
    int32_t n, k;
    int32_t trig;    /* set by the launcher: 1 triggers the next kernel early */
    int32_t pf;      /* set by the launcher: L2 prefetch distance in steps */
} cuk_gemv_rows;

/* Launch shape of cuk_gemv_rows_tuned (0 = the default of cuk_gemv_rows):
 * threads per CTA (256 or 512), output rows per CTA step (1, 2, 4), CTAs
 * per SM (capped by occupancy), next rows' weights loaded before this
 * step's products (pipe 1) or after them (0), weights loaded with an L2
 * 256-byte prefetch hint (hint 1) or __ldg (0). */
typedef struct cuk_gemv_rows_cfg {
    int32_t threads, rows, ctas_per_sm, pipe, hint;
} cuk_gemv_rows_cfg;

/* Whether cuk_gemv_rows takes this shape: K a whole number of 16-byte
 * weight chunks, at most 2048 of them, x / z / w / w2 16-byte aligned. */
int cuk_gemv_rows_ok(const cuk_gemv_rows *p);
/* The GEMV of each activation row described above (rows independent, each
 * computed as if alone: grid.y = M): a CTA keeps its slice of the
 * activation (times the norm weight) in registers and streams R weight
 * rows at a time through all its threads, with a fixed-order block
 * reduction (runs give equal results); the norm's r scales each output in
 * the epilogue. Launched as a programmatic dependent while the stream is
 * captured ($LLMEM_CUDA_GEMV_PDL, gemv.cu): w and w2 are then read before
 * the kernel before has finished, so inside a recorded step no kernel may
 * write them. cudaErrorNotSupported when !cuk_gemv_rows_ok. */
cudaError_t cuk_gemv_rows_run(const cuk_gemv_rows *p, cudaStream_t stream);
cudaError_t cuk_gemv_rows_tuned(const cuk_gemv_rows *p, const cuk_gemv_rows_cfg *cfg,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

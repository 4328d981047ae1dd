/* llmem: the fused decode matmul (issue 11): an RMS norm of the input, the
 * matmul, and a residual add or SwiGLU of its output in one op, an open op
 * (<llmem/ops_impl.h>, "Open ops") that no central table names. Layout of
 * the header as <llmem/ops_gdn.h>: op id, parameter struct, wrapper (the
 * common rules of <llmem/ops.h> apply), then the implementation type and
 * argument layout for backend authors. Metadata and wrapper:
 * backends/ops_norm_matmul.c; kernels: backends/cpu/ops_norm_matmul.c,
 * backends/cuda/cuda_ops_norm_matmul.c + kernels/gemv.cu,
 * backends/vulkan/vk_ops_norm_matmul.c + shaders/norm_matvec16_rows.comp
 * and norm_matvec16.comp (one f16/bf16 row; other shapes are refused and
 * callers run the unfused ops, models/forward.c).
 */
#ifndef LLMEM_OPS_NORM_MATMUL_H
#define LLMEM_OPS_NORM_MATMUL_H

#include "llmem/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Op id (llmem_backend_supports, llmem_op_name: "norm_matmul"). */
#define LLMEM_OP_NORM_MATMUL LLMEM_OP_TAG('n', 'r', 'm', 'm')

/* What is done to each input row before the product (llmem_norm_matmul_params.norm). */
typedef enum llmem_nm_norm {
    LLMEM_NM_NORM_NONE = 0,  /* a = x */
    LLMEM_NM_NORM_RMS = 1,   /* a = x * r * nw, r = 1 / sqrt(mean(x²) + eps) */
    LLMEM_NM_NORM_GATED = 2, /* a = g * r * nw, g = x * silu(z), r = 1 / sqrt(mean(g²) + eps) */
} llmem_nm_norm;

/* What is done with each product (llmem_norm_matmul_params.epilogue). */
typedef enum llmem_nm_epilogue {
    LLMEM_NM_STORE = 0,  /* out = a · wᵀ */
    LLMEM_NM_ADD = 1,    /* out += a · wᵀ (a residual add) */
    LLMEM_NM_SWIGLU = 2, /* out = silu(a · wᵀ) * (a · w2ᵀ) */
} llmem_nm_epilogue;

typedef struct llmem_norm_matmul_params {
    int32_t norm;     /* llmem_nm_norm */
    int32_t epilogue; /* llmem_nm_epilogue */
    float eps;        /* the norm's epsilon (>= 0; unused with LLMEM_NM_NORM_NONE) */
} llmem_norm_matmul_params;

/* The fused matmul of a decode step's projections, per input row t:
 *   a[t] = norm(x[t])          (p->norm: none, RMS norm, or Mamba-2's gated
 *                               RMS norm with one group over the row)
 *   out[t] = epilogue(a[t] · wᵀ)
 * RMS norm: Zhang & Sennrich 2019, as llmem_op_rms_norm; gated: y * silu(z)
 * normed (Dao & Gu 2024, Mamba-2; transformers MambaRMSNormGated with
 * n_groups 1), as llmem_op_rms_norm_gated with groups = 1; SwiGLU: Shazeer
 * 2020, as llmem_op_matmul_swiglu. Equal to the unfused ops up to the
 * order of f32 summation.
 *   x   [T, K] f32, K >= 1;  z [T, K] f32 with LLMEM_NM_NORM_GATED, else NULL;
 *   nw  [K] f32|f16|bf16 or NULL (no weight) when normed, else NULL;
 *   w   [N, K] f32|f16|bf16;  w2 [N, K] of w's dtype with LLMEM_NM_SWIGLU,
 *       else NULL;
 *   out [T, N] f32, read and written with LLMEM_NM_ADD; must not overlap
 *       any input.
 * Meant for decode-sized T (1 to 4 rows, the GEMV regime): backends may
 * refuse larger T or shapes their kernel does not take with
 * LLMEM_E_UNSUPPORTED, and the caller then runs the unfused ops
 * (llmem_op_rms_norm, llmem_op_matmul, llmem_op_add, ...).
 * Returns LLMEM_OK; LLMEM_E_INVALID for a NULL or malformed argument
 * (shapes, dtypes, ranges, overlap, an unknown norm or epilogue, eps < 0
 * or not finite), leaving out untouched; LLMEM_E_UNSUPPORTED as above;
 * LLMEM_E_BACKEND when the device fails. Same thread rules as every op. */
llmem_status llmem_op_norm_matmul(llmem_backend *be, const llmem_norm_matmul_params *p,
                                  const llmem_tensor *x, const llmem_tensor *z,
                                  const llmem_tensor *nw, const llmem_tensor *w,
                                  const llmem_tensor *w2, const llmem_tensor *out);

/* ---- for backend authors ---------------------------------------------------------- */

/* The implementation's type: called by the wrapper after every check it
 * lists has passed, never with zero rows or columns; optional tensors
 * arrive as NULL. */
typedef llmem_status (*llmem_op_norm_matmul_fn)(llmem_backend *be,
                                                const llmem_norm_matmul_params *p,
                                                const llmem_tensor *x, const llmem_tensor *z,
                                                const llmem_tensor *nw, const llmem_tensor *w,
                                                const llmem_tensor *w2, const llmem_tensor *out);

/* Argument layout (LLMEM_OP_LAYOUT, <llmem/ops.h>). */
#define LLMEM_OP_NORM_MATMUL_LAYOUT                                                            \
    LLMEM_OP_LAYOUT(sizeof(llmem_norm_matmul_params), offsetof(llmem_norm_matmul_params, eps))

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

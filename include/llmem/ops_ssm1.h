/* llmem: LFM2's short convolution and the Mamba-1 selective scan (issue
 * 16), an op header of their own: open ops (<llmem/ops_impl.h>, "Open
 * ops") that no central table names. Layout of the header as
 * <llmem/ops_gdn.h>: op ids, parameter struct, wrappers (the common rules
 * of <llmem/ops.h> apply), then the implementation types and argument
 * layouts for backend authors. Metadata and wrappers: backends/ops_ssm1.c;
 * kernels: backends/cpu/ops_ssm1.c, backends/cuda/cuda_ops_ssm1.c +
 * kernels/ssm1.cu, backends/vulkan/vk_ops_ssm1.c + shaders/short_conv.comp,
 * ssm_scan1.comp.
 */
#ifndef LLMEM_OPS_SSM1_H
#define LLMEM_OPS_SSM1_H

#include "llmem/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Op ids (llmem_backend_supports, llmem_op_name: "short_conv", "ssm_scan1"). */
#define LLMEM_OP_SHORT_CONV LLMEM_OP_TAG('s', 'c', 'n', 'v')
#define LLMEM_OP_SSM_SCAN1 LLMEM_OP_TAG('s', 's', 'm', '1')

/* LFM2's gated short convolution (transformers Lfm2ShortConv.forward;
 * Liquid AI, LFM2 2025): from the in_proj output bcx = [B | C | x],
 *   u[t] = B[t] * x[t];   out[t, c] = C[t, c] * (b[c] + sum_k w[c, k] * u'[t + k, c])
 * where u' is the group's conv state rows followed by its u rows (a causal
 * depthwise conv1d of L = d_conv taps, no activation).
 *   view: kind LLMEM_VIEW_RECURRENT; state index `state` has desc
 *         {L - 1, D}: the previous L - 1 rows of u, oldest first;
 *   bcx [T, 3 * D] f32 (columns B, then C, then x, as transformers'
 *       BCx.chunk(3));
 *   w   [D, L] (or [D, 1, L]) f32|f16|bf16;  b [D] f32|f16|bf16 or NULL;
 *   out [T, D] f32, must not overlap bcx.
 * The state after token t is u'[t + 1 .. t + L - 1]. Slots, checkpoints,
 * the snapshot inside the ubatch and EQUAL-split layout as
 * llmem_op_ssm_conv (<llmem/ops.h>). 2 <= L. */
llmem_status llmem_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                                 const llmem_tensor *bcx, const llmem_tensor *w,
                                 const llmem_tensor *b, const llmem_tensor *out);

typedef struct llmem_ssm1_params {
    int32_t d_inner; /* Din, channels */
    int32_t d_state; /* N */
} llmem_ssm1_params;

/* Mamba-1 selective scan, recurrent form (Gu & Dao 2023, "Mamba", Alg. 2
 * with the zero-order-hold A and Euler B of Sec. 3.5 as in the reference
 * selective_scan_ref; transformers JambaMambaMixer / mamba_selective_scan
 * slow path), per channel c and state column n:
 *   dt' = softplus(dt[t, c] + dt_bias[c])                (torch threshold 20)
 *   S[c, n] = exp(dt' * A[c, n]) * S[c, n] + dt' * B[t, n] * x[t, c]
 *   y[t, c] = (sum_n S[c, n] * C[t, n] + D[c] * x[t, c]) * silu(z[t, c])
 * with A = -exp(a_log); the z factor only when z is given.
 *   view: kind LLMEM_VIEW_RECURRENT; state index `state` has desc
 *         {Din, N} (S[c, n]);
 *   x, dt [T, Din] f32 (the conv output and dt_proj(dt) without its bias);
 *   b, c [T, N] f32 (B and C, shared by every channel);
 *   a_log [Din, N], d [Din] or NULL, dt_bias [Din] or NULL: f32|f16|bf16;
 *   z [T, Din] f32 or NULL (the gate);
 *   y [T, Din] f32, must not overlap any input.
 * Slots, checkpoints, the snapshot inside the ubatch and EQUAL-split
 * layout as llmem_op_ssm_conv. */
llmem_status llmem_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                                const llmem_view *view, int32_t state, const llmem_tensor *x,
                                const llmem_tensor *dt, const llmem_tensor *b,
                                const llmem_tensor *c, const llmem_tensor *a_log,
                                const llmem_tensor *d, const llmem_tensor *dt_bias,
                                const llmem_tensor *z, const llmem_tensor *y);

/* ---- for backend authors ---------------------------------------------------------- */

/* The implementations' types: called by the wrappers above after every
 * check they list has passed, never with zero tokens. State `state` of
 * the recurrent view has desc {L - 1, D} (short_conv) or {Din, N}
 * (ssm_scan1); optional tensors arrive as NULL. */
typedef llmem_status (*llmem_op_short_conv_fn)(llmem_backend *be, const llmem_view *view,
                                               int32_t state, const llmem_tensor *bcx,
                                               const llmem_tensor *w, const llmem_tensor *b,
                                               const llmem_tensor *out);
typedef llmem_status (*llmem_op_ssm_scan1_fn)(llmem_backend *be, const llmem_ssm1_params *p,
                                              const llmem_view *view, int32_t state,
                                              const llmem_tensor *x, const llmem_tensor *dt,
                                              const llmem_tensor *b, const llmem_tensor *c,
                                              const llmem_tensor *a_log, const llmem_tensor *d,
                                              const llmem_tensor *dt_bias, const llmem_tensor *z,
                                              const llmem_tensor *y);

/* Argument layouts (LLMEM_OP_LAYOUT, <llmem/ops.h>). */
#define LLMEM_OP_SHORT_CONV_LAYOUT LLMEM_OP_LAYOUT(0, 1)
#define LLMEM_OP_SSM_SCAN1_LAYOUT \
    LLMEM_OP_LAYOUT(sizeof(llmem_ssm1_params), offsetof(llmem_ssm1_params, d_state))

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

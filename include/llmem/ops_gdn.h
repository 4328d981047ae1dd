/* llmem: the gated delta net ops (Qwen3-Next linear attention), an op
 * header of their own: open ops (<llmem/ops_impl.h>, "Open ops") that no
 * central table names.
 *
 * What it holds, as a model for a new op header: the op ids (four-character
 * tags), the parameter struct, the wrappers a model calls (checked like
 * every op of <llmem/ops.h>, whose common rules apply here), and for
 * backend authors the type of each implementation and the layout
 * fingerprint the backend registers it with (LLMEM_OP_IMPL,
 * <llmem/backend_impl.h>). Their metadata (name, view kind, operand
 * dtypes) sits beside the wrappers in backends/ops_gdn.c; the kernels in
 * backends/cpu/ops_gdn.c, backends/cuda/cuda_ops_gdn.c + kernels/gdn.cu and
 * backends/vulkan/vk_ops_gdn.c + shaders/gdn.comp, sigmoid_mul.comp.
 */
#ifndef LLMEM_OPS_GDN_H
#define LLMEM_OPS_GDN_H

#include "llmem/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Op ids (llmem_backend_supports, llmem_op_name: "gdn", "sigmoid_mul"). */
#define LLMEM_OP_GDN LLMEM_OP_TAG('g', 'd', 'n', '_')
#define LLMEM_OP_SIGMOID_MUL LLMEM_OP_TAG('s', 'g', 'm', 'l')

/* Sizes of a gated delta net layer. Query/key heads are shared by groups of
 * value heads: value head h reads key head h / (n_v_heads / n_k_heads)
 * (transformers' repeat_interleave). */
typedef struct llmem_gdn_params {
    int32_t n_k_heads; /* H_k, query and key heads (>= 1) */
    int32_t n_v_heads; /* H_v, value heads, a multiple of H_k */
    int32_t d_k;       /* query/key head dim (>= 1) */
    int32_t d_v;       /* value head dim (>= 1) */
} llmem_gdn_params;

/* The gated delta rule over a ubatch with the delta-rule state (Yang, Kautz
 * & Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta
 * Rule", eq. (10); transformers 5 Qwen3NextGatedDeltaNet with
 * torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule and
 * use_qk_l2norm_in_kernel). Per token t and value head h (k head g):
 *   q = l2norm(q_g) / sqrt(d_k),  k = l2norm(k_g),  l2norm(x) = x * rsqrt(x.x + 1e-6)
 *   beta = sigmoid(b[t, h]),  g = -exp(a_log[h]) * softplus(a[t, h] + dt_bias[h])
 *   S = exp(g) S;  S += k ⊗ beta (v_h - Sᵀ k);  out[t, h] = Sᵀ q
 * with S_h [d_k][d_v] f32 (softplus as llmem_op_softplus, threshold 20).
 *   view: kind LLMEM_VIEW_RECURRENT; state index `state` has desc {H_v,
 *         d_k, d_v} (any float dtype; f32 for exact rollback);
 *   qkv [T, 2 * H_k * d_k + H_v * d_v] f32, the conv output, columns
 *       [q (H_k heads of d_k) | k (H_k x d_k) | v (H_v x d_v)];
 *   a, b [T, H_v] f32 (in_proj_ba's a and b parts);
 *   a_log, dt_bias [H_v] f32|f16|bf16;
 *   out [T, H_v * d_v] (or [T, H_v, d_v]) f32, must not overlap an input.
 * Slots, checkpoints and the snapshot inside the ubatch follow the
 * recurrent rules of <llmem/ops.h> (EQUAL ubatch, group-major). Ubatches
 * of one token per group run the recurrent form; longer ones the chunked
 * form (chunks of 64 tokens: a forward
 * substitution solves each chunk's delta-rule corrections, then one
 * state update per chunk), except for the last n_ckpt tokens of a group
 * when checkpoints are requested, which run the recurrent form so that
 * each checkpointed state exists (a snapshot inside the ubatch ends its
 * chunk at its token). Both forms compute the same recurrence
 * (within f32 rounding). */
llmem_status llmem_op_gdn(llmem_backend *be, const llmem_gdn_params *p, const llmem_view *view,
                          int32_t state, const llmem_tensor *qkv, const llmem_tensor *a,
                          const llmem_tensor *b, const llmem_tensor *a_log,
                          const llmem_tensor *dt_bias, const llmem_tensor *out);

/* out[r, c] = x[r, c] * sigmoid(gate[r, c / (C / Cg)]): an output gate
 * (Qwen3-Next's gated attention, attn_output * sigmoid(gate); its shared
 * expert, sigmoid(shared_expert_gate(x)) * shared_expert(x)).
 *   x [.., C] f32; gate [rows, Cg] f32 with x's rows and Cg dividing C
 *   (Cg = C: one gate per element; Cg = 1: one per row); out x's shape, may
 *   equal x; must not overlap gate. sigmoid(v) = 1 / (1 + exp(-v)). */
llmem_status llmem_op_sigmoid_mul(llmem_backend *be, const llmem_tensor *x,
                                  const llmem_tensor *gate, const llmem_tensor *out);

/* ---- for backend authors ---------------------------------------------------------- */

/* The implementations' types: called by the wrappers above after every
 * check they list has passed (as the slots of <llmem/ops_impl.h>), never
 * with zero tokens or elements.
 *   gdn: operands as llmem_op_gdn; state `state` of the recurrent view has
 *        desc {H_v, d_k, d_v}.
 *   sigmoid_mul: x [rows, C], gate [rows, Cg] with Cg dividing C, out x's
 *        shape (may equal x). */
typedef llmem_status (*llmem_op_gdn_fn)(llmem_backend *be, const llmem_gdn_params *p,
                                        const llmem_view *view, int32_t state,
                                        const llmem_tensor *qkv, const llmem_tensor *a,
                                        const llmem_tensor *b, const llmem_tensor *a_log,
                                        const llmem_tensor *dt_bias, const llmem_tensor *out);
typedef llmem_status (*llmem_op_sigmoid_mul_fn)(llmem_backend *be, const llmem_tensor *x,
                                                const llmem_tensor *gate,
                                                const llmem_tensor *out);

/* Argument layouts (LLMEM_OP_LAYOUT, <llmem/ops.h>). */
#define LLMEM_OP_GDN_LAYOUT \
    LLMEM_OP_LAYOUT(sizeof(llmem_gdn_params), offsetof(llmem_gdn_params, d_v))
#define LLMEM_OP_SIGMOID_MUL_LAYOUT LLMEM_OP_LAYOUT(0, 1)

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

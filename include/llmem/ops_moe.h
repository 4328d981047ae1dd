/* llmem: the mixture-of-experts ops (top-k routing and the routed expert
 * MLPs of Granite-4.0-H, Nemotron-H, Qwen3-Next and Jamba), an op header of
 * their own: open ops (<llmem/ops_impl.h>, "Open ops") that no central
 * table names. Layout as <llmem/ops_gdn.h>: op ids, parameter structs,
 * wrappers (the common rules of <llmem/ops.h> apply), then the
 * implementation types and argument layouts for backend authors. Metadata
 * and wrappers: backends/ops_moe.c; kernels: backends/cpu/ops_moe.c,
 * backends/cuda/cuda_ops_moe.c + kernels/moe.cu, backends/vulkan/vk_ops_moe.c
 * + shaders/moe_route.comp, moe_ffn.comp.
 */
#ifndef LLMEM_OPS_MOE_H
#define LLMEM_OPS_MOE_H

#include "llmem/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Op ids (llmem_backend_supports, llmem_op_name: "moe_route", "moe_ffn"). */
#define LLMEM_OP_MOE_ROUTE LLMEM_OP_TAG('m', 'o', 'e', 'r')
#define LLMEM_OP_MOE_FFN LLMEM_OP_TAG('m', 'o', 'e', 'f')

/* How router logits become expert scores. */
typedef enum llmem_moe_scoring {
    LLMEM_MOE_SOFTMAX = 0, /* softmax over the E logits (Mixtral, Granite-MoE) */
    LLMEM_MOE_SIGMOID = 1, /* sigmoid of each logit (DeepSeek-V3, Nemotron-H) */
} llmem_moe_scoring;

typedef struct llmem_moe_route_params {
    int32_t n_expert;      /* E, the router's logits per token */
    int32_t n_expert_used; /* k, experts kept per token, 1..E */
    llmem_moe_scoring scoring;
    bool norm_topk;        /* divide the k weights by (their sum + 1e-20) */
    int32_t n_group;       /* 0 or 1: no groups; else E % n_group == 0 and
                              E / n_group >= 2 */
    int32_t topk_group;    /* groups kept when n_group > 1, 1..n_group */
    float scale;           /* routed scaling factor applied last (1 for none) */
} llmem_moe_route_params;

/* Top-k expert routing of T tokens.
 *   logits [T, E] f32; bias [E] f32|f16|bf16 or NULL (the selection-only
 *   correction bias, e_score_correction_bias); ids [T, k] i32;
 *   weights [T, k] f32. No output overlaps an input or the other output.
 * s = softmax(logits) or sigmoid(logits); c = s + bias. With n_group > 1,
 * each group of E / n_group consecutive experts scores the sum of its two
 * largest c, and only the topk_group best groups stay selectable. ids[t] =
 * the k largest selectable c in descending order (lower index first on
 * ties); weights[t, j] = s[ids[t, j]] (the bias only selects), divided by
 * their sum + 1e-20 when norm_topk, then times p->scale.
 * Softmax + norm_topk equals Granite-MoE's softmax over the top-k logits.
 * References: Shazeer et al. 2017 (top-k gating); DeepSeek-V3 (2024) Sec.
 * 2.1.2 (sigmoid affinities, bias-adjusted selection, node-limited groups);
 * transformers NemotronHTopkRouter, GraniteMoeHybridTopKRouter. */
llmem_status llmem_op_moe_route(llmem_backend *be, const llmem_moe_route_params *p,
                                const llmem_tensor *logits, const llmem_tensor *bias,
                                const llmem_tensor *ids, const llmem_tensor *weights);

/* The expert MLP's activation. */
typedef enum llmem_moe_act {
    LLMEM_MOE_ACT_SILU = 0,  /* x * sigmoid(x) */
    LLMEM_MOE_ACT_RELU2 = 1, /* max(x, 0)^2 */
} llmem_moe_act;

typedef struct llmem_moe_ffn_params {
    llmem_moe_act act;
    bool gated; /* w_up holds [gate | up] (2I rows per expert): h = act(gate x) * (up x);
                   else w_up holds I rows: h = act(up x) */
} llmem_moe_ffn_params;

/* The routed experts of T tokens, weighted and summed:
 *   out[t] = sum_j weights[t, j] * down[ids[t, j]] · h(ids[t, j], x[t]).
 *   x [T, D] f32; ids [T, k] i32 in [0, E); weights [T, k] f32;
 *   w_up [E, I, D] or [E, 2I, D] (gated; rows [0, I) gate, [I, 2I) up, as
 *   transformers' gate_up_proj) f32|f16|bf16; w_down [E, D, I] of w_up's
 *   dtype; out [T, D] f32, not overlapping any input.
 * Tokens are grouped per expert and each expert's weights are read only
 * when a token selected it (a decode step reads k experts per token, at
 * most). An id outside [0, E) is never read: the CPU backend returns
 * LLMEM_E_INVALID. Shared experts are ordinary matmuls (or this op with
 * E = 1). Reference: transformers' eager experts (GraniteMoeHybridExperts,
 * NemotronHExperts). */
llmem_status llmem_op_moe_ffn(llmem_backend *be, const llmem_moe_ffn_params *p,
                              const llmem_tensor *x, const llmem_tensor *ids,
                              const llmem_tensor *weights, const llmem_tensor *w_up,
                              const llmem_tensor *w_down, const llmem_tensor *out);

/* ---- for backend authors ---------------------------------------------------------- */

/* The implementations' types: called by the wrappers above after every
 * check they list has passed, never with zero tokens. An implementation
 * must not read an expert whose id (read from the device) lies outside
 * [0, E). */
typedef llmem_status (*llmem_op_moe_route_fn)(llmem_backend *be, const llmem_moe_route_params *p,
                                              const llmem_tensor *logits,
                                              const llmem_tensor *bias, const llmem_tensor *ids,
                                              const llmem_tensor *weights);
typedef llmem_status (*llmem_op_moe_ffn_fn)(llmem_backend *be, const llmem_moe_ffn_params *p,
                                            const llmem_tensor *x, const llmem_tensor *ids,
                                            const llmem_tensor *weights,
                                            const llmem_tensor *w_up,
                                            const llmem_tensor *w_down,
                                            const llmem_tensor *out);

/* Argument layouts (LLMEM_OP_LAYOUT, <llmem/ops.h>). */
#define LLMEM_OP_MOE_ROUTE_LAYOUT \
    LLMEM_OP_LAYOUT(sizeof(llmem_moe_route_params), offsetof(llmem_moe_route_params, scale))
#define LLMEM_OP_MOE_FFN_LAYOUT \
    LLMEM_OP_LAYOUT(sizeof(llmem_moe_ffn_params), offsetof(llmem_moe_ffn_params, gated))

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

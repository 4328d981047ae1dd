/* llmem: backend ops, the math of a hybrid Mamba/transformer forward pass.
 *
 * Every op here is a function-pointer slot of the backend's ops table
 * (<llmem/ops_impl.h>); the wrappers here check their arguments, then call
 * the slot. Ops added since live in op headers of their own (open ops,
 * e.g. <llmem/ops_gdn.h>; <llmem/ops_impl.h>, "Open ops"), whose wrappers
 * follow the same rules. The built-in "cpu" backend implements every op and is the
 * reference; tests/test_ops*.c check every available backend against it.
 *
 * Tensors. An llmem_tensor describes a dense row-major array in a buffer:
 * `ne[0]` is the OUTERMOST dimension and `ne[n_dims - 1]` the innermost
 * (contiguous) one, as in PyTorch and safetensors, and as llmem_state_desc.
 * Shapes below are written outermost first: x [T, D] has D contiguous floats
 * per row. "Rows" of a tensor are the product of every dimension but the
 * last; a [T, H, Dh] tensor has T * H rows of Dh. A descriptor is cheap:
 * reinterpret memory by making another one (a [T, H * Dh] matmul output is
 * the [T, H, Dh] input of rope).
 *
 * Common rules, checked by every wrapper:
 *   - every buffer belongs to `be`; [offset, offset + bytes) lies inside it;
 *     offset is a multiple of the element size; 1 <= n_dims <= 4; ne >= 0.
 *   - activations are f32; weights (matmul, get_rows, norm weights, conv
 *     weights and biases, A_log, D, dt_bias) may be f32, f16 or bf16; all
 *     math is done in f32 (f32 accumulate) on every backend.
 *   - an output may alias an input exactly (same buffer, offset and size)
 *     where the op says "in place allowed"; any other overlap of an output
 *     with an input is LLMEM_E_INVALID.
 *   - a tensor with zero elements makes the op do nothing (LLMEM_OK).
 *   - index tables of a memory view (llmem_i32_table) are read from the
 *     view's device index buffer `view->idx` at the table's byte offset, so
 *     device backends need no upload; the wrapper checks the host copies
 *     (`table.host`), and the CPU backend checks again what it reads.
 * Ops run on the backend's stream (its execution queue) in call order; results are visible to
 * llmem_buffer_download (which waits). The CPU backend runs them
 * synchronously on its thread pool.
 *
 * Every wrapper returns LLMEM_OK; LLMEM_E_INVALID (NULL argument, shape,
 * dtype, alias or index-table violation); LLMEM_E_UNSUPPORTED (the backend
 * has no such op: NULL slot or an older ops table); LLMEM_E_NO_MEMORY (host
 * scratch); LLMEM_E_BACKEND (device error). Listed per op only when others
 * apply. Threading: a backend is used by one thread at a time.
 *
 * docs/ops.md lists the ops with shapes and references.
 */
#ifndef LLMEM_OPS_H
#define LLMEM_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"
#include "llmem/view.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

#define LLMEM_TENSOR_MAX_DIMS 4

/* A dense row-major tensor in a buffer (see the file comment). */
typedef struct llmem_tensor {
    llmem_buffer *buf;
    size_t offset;                     /* bytes from the start of buf */
    llmem_dtype dtype;
    int32_t n_dims;                    /* 1..LLMEM_TENSOR_MAX_DIMS */
    int32_t ne[LLMEM_TENSOR_MAX_DIMS]; /* outermost first; entries past n_dims unused */
} llmem_tensor;

static inline llmem_tensor llmem_tensor_1d(llmem_buffer *buf, size_t offset, llmem_dtype dtype,
                                           int32_t n0)
{
    llmem_tensor t = {buf, offset, dtype, 1, {n0, 1, 1, 1}};
    return t;
}

static inline llmem_tensor llmem_tensor_2d(llmem_buffer *buf, size_t offset, llmem_dtype dtype,
                                           int32_t n0, int32_t n1)
{
    llmem_tensor t = {buf, offset, dtype, 2, {n0, n1, 1, 1}};
    return t;
}

static inline llmem_tensor llmem_tensor_3d(llmem_buffer *buf, size_t offset, llmem_dtype dtype,
                                           int32_t n0, int32_t n1, int32_t n2)
{
    llmem_tensor t = {buf, offset, dtype, 3, {n0, n1, n2, 1}};
    return t;
}

/* Elements (product of ne[0..n_dims)), 0 for an invalid descriptor. */
int64_t llmem_tensor_nelements(const llmem_tensor *t);
/* Bytes of the tensor's data (elements * dtype size), 0 when invalid. */
size_t llmem_tensor_nbytes(const llmem_tensor *t);

/* ---- dense ------------------------------------------------------------------ */

/* out = a · wᵀ (a linear layer without bias, as torch.nn.Linear).
 *   a   [M, K] f32 activations
 *   w   [N, K] f32 | f16 | bf16 weights, row-major [out, in] as stored in
 *       safetensors
 *   out [M, N] f32; must not overlap a or w.
 * f32 accumulation. Reference: the plain GEMM definition. */
llmem_status llmem_op_matmul(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *w,
                             const llmem_tensor *out);

/* The matmul of the FAST precision mode (<llmem/runtime.h>): as
 * llmem_op_matmul, but a backend may round a to bf16 (nearest even) before
 * the product, with f32 accumulation, and run bf16 weights through one
 * tensor-core GEMM (no hi + lo split). The result is within bf16 rounding
 * of a (relative error about 2^-9 per product) of the exact one. A backend
 * without a fast path (NULL slot) runs llmem_op_matmul. Same shapes,
 * dtypes and statuses as llmem_op_matmul. */
llmem_status llmem_op_matmul_fast(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *w,
                                  const llmem_tensor *out);

/* The first half of a gated SwiGLU FFN in one op (Shazeer 2020; the llama
 * MLP's act(gate(x)) * up(x)):
 *   out = silu(a · gateᵀ) * (a · upᵀ)
 *   a [M, K] f32; gate, up [N, K] f32 | f16 | bf16, one dtype; out [M, N]
 *   f32, must not overlap a, gate or up.
 * f32 accumulation as llmem_op_matmul, silu(x) = x / (1 + exp(-x)). A
 * device backend fuses it where that pays (the batch-1 GEMV reads both
 * weight matrices in one launch and never writes the two products);
 * LLMEM_E_UNSUPPORTED from a backend without it (callers then run two
 * matmuls and llmem_op_swiglu). */
llmem_status llmem_op_matmul_swiglu(llmem_backend *be, const llmem_tensor *a,
                                    const llmem_tensor *gate, const llmem_tensor *up,
                                    const llmem_tensor *out);

/* out[i] = src[idx[i]] (embedding lookup, output-row selection).
 *   src [R, C] f32 | f16 | bf16;  idx [n] i32 in [0, R);  out [n, C] f32.
 * Index values live on the device, so the wrapper cannot check them: the
 * CPU backend returns LLMEM_E_INVALID for one outside [0, R) (the output is
 * then undefined); device backends must not read outside src.
 * Reference: torch.nn.functional.embedding. */
llmem_status llmem_op_get_rows(llmem_backend *be, const llmem_tensor *src, const llmem_tensor *idx,
                               const llmem_tensor *out);

/* out = a + b and out = a * b, element-wise, f32. b has a's shape, or is a
 * single row broadcast over a's rows (b has as many elements as a's last
 * dimension, any n_dims). out has a's shape. In place allowed (out may be
 * a or b). */
llmem_status llmem_op_add(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *b,
                          const llmem_tensor *out);
llmem_status llmem_op_mul(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *b,
                          const llmem_tensor *out);

/* out = s * a, f32, any shape; in place allowed. */
llmem_status llmem_op_scale(llmem_backend *be, const llmem_tensor *a, float s,
                            const llmem_tensor *out);

/* Activations, f32, out has a's shape, in place allowed.
 *   silu(x)     = x / (1 + exp(-x))                (torch.nn.functional.silu)
 *   relu2(x)    = max(x, 0)^2                      (squared ReLU, Nemotron-H MLP;
 *                                                   So et al. 2021, "Primer")
 *   softplus(x) = log(1 + exp(x)), x when x > 20   (torch.nn.functional.softplus,
 *                                                   beta 1, threshold 20)
 *   swiglu(g,u) = silu(g) * u                      (Shazeer 2020, "GLU Variants
 *                                                   Improve Transformer"; the
 *                                                   llama MLP act(gate) * up);
 *                 gate, up, out of one shape. */
llmem_status llmem_op_silu(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out);
llmem_status llmem_op_relu2(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out);
llmem_status llmem_op_softplus(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out);
llmem_status llmem_op_swiglu(llmem_backend *be, const llmem_tensor *gate, const llmem_tensor *up,
                             const llmem_tensor *out);

/* GeGLU with the tanh GELU (Shazeer 2020, "GLU Variants Improve
 * Transformer"; GELU tanh approximation of Hendrycks & Gimpel 2016, as
 * torch.nn.functional.gelu(approximate="tanh") and HF "gelu_pytorch_tanh"):
 *   out = 0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3))) * up
 * element-wise; gate, up, out f32 of one shape (no broadcast), out may
 * equal gate or up. Used by Gemma-3's MLP (down(gelu(gate(x)) * up(x))).
 * Returns LLMEM_OK; LLMEM_E_INVALID (a bad descriptor, shapes differ, out
 * partly overlapping an input); LLMEM_E_UNSUPPORTED (the backend lacks the
 * op); a backend status. */
llmem_status llmem_op_geglu(llmem_backend *be, const llmem_tensor *gate, const llmem_tensor *up,
                            const llmem_tensor *out);

/* Soft-capping (Gemma 2, Team et al. 2024, Sec. 2; HF Gemma3ForCausalLM
 * final_logit_softcapping): out = cap * tanh(a / cap), element-wise, f32,
 * out of a's shape, in place allowed. cap must be finite and > 0.
 * Returns LLMEM_OK; LLMEM_E_INVALID (a bad descriptor or cap, out partly
 * overlapping a); LLMEM_E_UNSUPPORTED; a backend status. */
llmem_status llmem_op_softcap(llmem_backend *be, const llmem_tensor *a, float cap,
                              const llmem_tensor *out);

/* RMS norm over the last dimension (Zhang & Sennrich 2019; HF LlamaRMSNorm):
 *   out = x / sqrt(mean(x^2) + eps) * w
 *   x [.., D] f32;  w [D] f32 | f16 | bf16, or NULL for no weight;
 *   out x's shape, in place allowed;  eps > 0 (or 0 with no zero rows). */
llmem_status llmem_op_rms_norm(llmem_backend *be, const llmem_tensor *x, const llmem_tensor *w,
                               float eps, const llmem_tensor *out);

/* Residual add fused with the next RMS norm (a pre-norm block's
 *   x = x + r;  out = rms_norm(x, w, eps)):
 *   x [.., D] f32, updated in place; r and out x's shape, f32; out may be r
 *   itself (exactly, not a partial overlap) but must not overlap x; w as in
 *   llmem_op_rms_norm. Equal, bit for bit, to llmem_op_add then
 *   llmem_op_rms_norm on the same backend (what a backend without the fused
 *   slot runs). */
llmem_status llmem_op_add_rms_norm(llmem_backend *be, const llmem_tensor *x, const llmem_tensor *r,
                                   const llmem_tensor *w, float eps, const llmem_tensor *out);

/* Gated RMS norm of Mamba-2 (HF transformers MambaRMSNormGated, as used by
 * Mamba2, Bamba, Nemotron-H: gate first, then normalize in n_groups groups):
 *   h = y * silu(z);  each row of h is split into n_groups groups of
 *   D / n_groups; out = h / sqrt(mean_group(h^2) + eps) * w
 *   y, z [.., D] f32 (same shape);  w [D] f32 | f16 | bf16;
 *   n_groups >= 1 divides D;  out y's shape, in place allowed (out may be
 *   y or z). */
llmem_status llmem_op_rms_norm_gated(llmem_backend *be, const llmem_tensor *y,
                                     const llmem_tensor *z, const llmem_tensor *w,
                                     int32_t n_groups, float eps, const llmem_tensor *out);

/* ---- rotary position embedding ------------------------------------------------- */

typedef enum llmem_rope_mode {
    /* GPT-J / "normal": rotates the pairs (2i, 2i + 1). */
    LLMEM_ROPE_NORMAL = 0,
    /* GPT-NeoX / HF rotate_half (llama, Bamba, Granite, ...): rotates the
     * pairs (i, i + n_rot / 2). */
    LLMEM_ROPE_NEOX = 1,
} llmem_rope_mode;

/* RoPE (Su et al. 2021, "RoFormer", eq. 34): for i in [0, n_rot / 2) the
 * pair (x_a, x_b) of mode's layout is rotated by the angle
 *   pos * freq_scale * theta_base^(-2i / n_rot);
 * dimensions [n_rot, head_dim) are copied unchanged (partial rotary,
 * e.g. partial_rotary_factor 0.5). */
typedef struct llmem_rope_params {
    llmem_rope_mode mode;
    int32_t n_rot;      /* rotated dimensions, even, 2 <= n_rot <= head_dim */
    float theta_base;   /* rope_theta, > 0 (e.g. 10000, 500000) */
    float freq_scale;   /* linear position scaling, 1 = none (> 0) */
} llmem_rope_params;

/* Applies RoPE to the queries or keys of a ubatch.
 *   x   [T, H, head_dim] f32;  pos [T] i32 per-token positions (any value,
 *       negative allowed);  out x's shape, in place allowed.
 * Angles are computed in double on the CPU backend (positions up to 2^24
 * stay accurate to f32 rounding of the result). */
llmem_status llmem_op_rope(llmem_backend *be, const llmem_rope_params *p, const llmem_tensor *x,
                           const llmem_tensor *pos, const llmem_tensor *out);

/* K-shift: re-rotates cached keys after seq_add/seq_div. For every j, the
 * key in slot kv.shift_slot[j] of the view's K pool (all KV heads) is rotated by
 * the angle of kv.shift_delta[j] positions (RoPE rotations compose:
 * R(p + d) = R(d) R(p)), in f32, and stored back in the pool's dtype.
 *   view: kind LLMEM_VIEW_KV; shift slots in [0, n_pages * page_size),
 *   pairwise distinct; p->n_rot <= head_dim. V is not touched.
 * Scaled pools (I8, F8E4M3): LLMEM_E_UNSUPPORTED. */
llmem_status llmem_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                                 const llmem_view *view);

/* ---- paged attention ------------------------------------------------------------ */

typedef struct llmem_attn_params {
    float scale;    /* multiplies q·k; usually 1 / sqrt(head_dim) */
    float softcap;  /* > 0: score s becomes softcap * tanh(s / softcap) after scaling
                       (Gemma 2 attn_logit_softcapping); 0: off */
    int32_t window; /* > 0: a query sees only its last `window` keys (its own
                       included; Mistral sliding window); 0: all its keys */
    int32_t fast;   /* nonzero: the FAST precision mode (<llmem/runtime.h>): a backend with a
                       tensor-core prefill (cuda) may round q * scale and the probabilities
                       once to the KV pool's 16-bit dtype, as FlashAttention does
                       (docs/cuda.md, "Prefill attention, fast mode"); 0: the precise
                       arithmetic. Backends without such a kernel ignore it. */
} llmem_attn_params;

/* Stores this ubatch's keys and values in the KV pools of the view:
 * token kv.store_tok[j] goes to slot kv.store_slot[j] of the view's K / V pools,
 * converted to the pool dtype (round to nearest even).
 *   view: kind LLMEM_VIEW_KV;  k, v [T, n_kv_heads, head_dim] f32;
 *   store_tok in [0, T); store_slot in [0, n_pages * page_size), pairwise
 *   distinct. Only the named slots are written.
 * Scaled pools (I8, F8E4M3; <llmem/view.h> llmem_kv_page_bytes): per page
 * written and KV head, amax over its new rows; a page whose offset 0 is
 * written gets scale amax / code_max; otherwise the scale becomes max(old,
 * amax / code_max) and, when it grew, the page's other rows are requantized
 * to it first (docs/memory.md, "Quantized KV and state"). Backends without
 * these kernels answer LLMEM_E_UNSUPPORTED. */
llmem_status llmem_op_kv_store(llmem_backend *be, const llmem_view *view, const llmem_tensor *k,
                               const llmem_tensor *v);

/* Causal paged attention of the ubatch's queries over the KV pools
 * (PagedAttention, Kwon et al. SOSP 2023, for the page-table addressing;
 * FlashAttention-2, Dao 2023, Alg. 1, online softmax, for the math).
 *   q   [T, H, head_dim] f32, H a multiple of n_kv_heads (GQA/MQA: query
 *       head h reads KV head h / (H / n_kv_heads));
 *   out [T, H, head_dim] f32, must not overlap q.
 * Query token i belongs to sequence group s = kv.tok_seq[i] and sees the
 * keys with group index j in [lo, kv.tok_kv_len[i]), lo = 0 or, with a window,
 * max(0, tok_kv_len[i] - window); key j lives in slot
 * kv.page_table[s * max_pages + j / page_size] * page_size + j % page_size.
 * out = sum_j softmax_j(score(q, k_j)) v_j over visible keys only: masked
 * keys are never read, so free pages, -1 page ids past ceil(seq_len /
 * page_size) and unwritten slots may hold anything (NaN). A query that sees
 * no key (tok_kv_len 0) gets zeros.
 * Checked: tok_seq in [0, n_groups), n_groups = kv.seq_len.n;
 * 0 <= tok_kv_len[i] <= seq_len[s]; ceil(seq_len / page_size) <= max_pages;
 * the page ids those cover in [0, n_pages). Nothing outside [0, seq_len[s])
 * of a group is read. Scaled pools (I8, F8E4M3) are read as code * the
 * page's scale of the KV head, in f32. */
llmem_status llmem_op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                      const llmem_view *view, const llmem_tensor *q,
                                      const llmem_tensor *out);

/* ---- Mamba-2 -------------------------------------------------------------------- */

/* The recurrent ops work on an EQUAL-split ubatch as the llmem_rs_view
 * describes it: n_seqs sequence groups x n_seq_tokens tokens, group-major
 * (row s * n_seq_tokens + t is token t of group s), T = n_seqs *
 * n_seq_tokens. For group s the state is read from slot src_slot[s] (-1:
 * zeros), and written after the group's last token to dst_slot[s] (-1: not
 * written)
 * and after token n_seq_tokens - n_ckpt + c to ckpt_slot[s * n_ckpt + c]
 * (-1: none; a checkpoint before token 0 gets the initial state), and, in
 * ssm_conv and ssm_scan (and the open ops short_conv, ssm_scan1 and gdn)
 * when the view asks for a snapshot inside the ubatch (llmem_rs_view_snap,
 * <llmem/view.h>), after token snap_tok[s] to snap_slot[s] (-1: none;
 * other recurrent ops refuse such a view with LLMEM_E_UNSUPPORTED). Sources
 * are read before anything is written, so a group's src may equal its own
 * dst or a checkpoint, and another group's dst (copy-on-write). Slots in
 * [-1, n_slots); a slot written by two groups is LLMEM_E_INVALID; when a
 * group's checkpoint equals its dst, the dst value wins. States are
 * stored in their desc dtype (f32, f16 or bf16, round to nearest even;
 * the SSM state of ssm_scan also I8: per head (desc shape[0]) scale = amax /
 * 127 of the stored state, codes round half to even, with head_dim *
 * d_state a multiple of 4; llmem_state_slot_bytes); within a ubatch the
 * running state is kept in f32. ssm_conv takes no I8 state
 * (LLMEM_E_INVALID). */

/* Causal depthwise conv1d over [xBC] with the conv state, then SiLU
 * (HF transformers Mamba2Mixer.torch_forward: conv1d(groups=conv_dim,
 * padding=d_conv-1)[..., :seq_len] then act; Dao & Gu 2024, Sec. 7.1).
 *   view: kind LLMEM_VIEW_RECURRENT; state index `state` has desc
 *         {d_conv - 1, conv_dim}: the previous d_conv - 1 inputs, oldest
 *         first;
 *   x   [T, conv_dim] f32, the xBC part of in_proj's output;
 *   w   [conv_dim, d_conv] (or HF's [conv_dim, 1, d_conv]) f32|f16|bf16;
 *   b   [conv_dim] f32|f16|bf16 or NULL;
 *   out [T, conv_dim] f32, must not overlap x.
 * out[t, c] = silu(b[c] + sum_k w[c, k] * u[t + k, c]) where u is the
 * group's state rows followed by its x rows; the state after token t is
 * u[t + 1 .. t + d_conv - 1]. d_conv >= 2. */
llmem_status llmem_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                               const llmem_tensor *x, const llmem_tensor *w, const llmem_tensor *b,
                               const llmem_tensor *out);

typedef struct llmem_ssm_params {
    int32_t n_heads;   /* H */
    int32_t head_dim;  /* P; d_inner = H * P */
    int32_t d_state;   /* N */
    int32_t n_groups;  /* G, divides H; head h uses group h / (H / G) */
    float dt_min, dt_max; /* time_step_limit; HF default (0, INFINITY) */
    /* 1: the FAST precision mode (<llmem/runtime.h>): a backend may run the
     * scan's products on bf16-rounded operands with f32 accumulation (the
     * CUDA chunked SSD of a prefill ubatch does; relative error of y about
     * 2e-3 to 5e-3, docs/benchmarks.md "Chunked SSD prefill scan"); 0: f32
     * arithmetic. Appended: set it (or initialize designated). */
    int32_t fast;
} llmem_ssm_params;

/* Mamba-2 selective scan, recurrent form (Dao & Gu 2024, "Transformers are
 * SSMs", Sec. 3 / eq. (2) with scalar A per head; HF transformers
 * Mamba2Mixer.torch_forward single-step path applied token by token):
 *   dt_h = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max)
 *   S_h  = exp(dt_h * A_h) * S_h + dt_h * x_h ⊗ B_g      A_h = -exp(A_log[h])
 *   y_h  = S_h · C_g + D[h] * x_h
 *   view: kind LLMEM_VIEW_RECURRENT; state index `state` has desc
 *         {H, P, N} (S_h[p, n]);
 *   xbc [T, conv_dim] f32, the conv output, columns [x (H*P) | B (G*N) |
 *       C (G*N)], conv_dim = H*P + 2*G*N;
 *   dt  [T, H] f32;  a_log [H], d [H] or NULL, dt_bias [H] or NULL:
 *       f32|f16|bf16;
 *   y   [T, H * P] (or [T, H, P]) f32, must not overlap xbc or dt.
 * (Matrices [T, n] here may also be given as [T, ...] flattening to n.)
 * The gate z is applied afterwards by llmem_op_rms_norm_gated. p->fast
 * allows bf16 products (above); the cpu and vulkan backends ignore it. */
llmem_status llmem_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p,
                               const llmem_view *view, int32_t state, const llmem_tensor *xbc,
                               const llmem_tensor *dt, const llmem_tensor *a_log,
                               const llmem_tensor *d, const llmem_tensor *dt_bias,
                               const llmem_tensor *y);

/* ---- copies ----------------------------------------------------------------------- */

/* dst[r, c] = src[r, col0 + c], converting dtypes (f32, f16, bf16; round to
 * nearest even). Rows of src and dst (product of the outer dimensions) are
 * equal; dst's last dimension + col0 <= src's. Splits fused projections and
 * converts weights at load time. dst must not overlap src. */
llmem_status llmem_op_copy(llmem_backend *be, const llmem_tensor *src, int32_t col0,
                           const llmem_tensor *dst);

/* Copies n blocks of block_bytes inside buf: block src[i] -> block dst[i]
 * (device to device, queued in order with ops; block b is bytes
 * [b * block_bytes, (b + 1) * block_bytes)). src, dst: host arrays of n
 * block indices inside buf (read during the call; the caller keeps them);
 * no dst equals any src or another dst (a src may repeat). Runs as one
 * llmem_buffer_copy_ranges batch where the backend batches copies (every
 * built-in backend), else on the backend's copy_blocks slot, else block by
 * block (llmem_buffer_copy). For copy-on-write of pages and state slots
 * (vLLM's copy_blocks). LLMEM_E_INVALID: be or buf NULL, buf of another
 * backend, block_bytes 0, n < 0, a NULL array with n > 0, an index outside
 * buf, a repeated dst or a dst among the srcs; nothing is copied then.
 * LLMEM_E_NO_MEMORY: host memory for the check or the batch. */
llmem_status llmem_op_copy_blocks(llmem_backend *be, llmem_buffer *buf, size_t block_bytes,
                                  int32_t n, const int32_t *src, const int32_t *dst);

/* Copies KV page src_page to dst_page in both pools of one layer's view
 * (kind LLMEM_VIEW_KV), as one batch of two ranges (K and V) where the
 * backend batches copies, else two llmem_op_copy_blocks. Pages in
 * [0, n_pages), distinct. LLMEM_E_INVALID (nothing copied): a view of
 * another kind, one that fails llmem_view_check_kv, a page out of range or
 * src_page == dst_page. */
llmem_status llmem_op_kv_page_copy(llmem_backend *be, const llmem_view *view, int32_t src_page,
                                   int32_t dst_page);

/* Copies state slot src_slot to dst_slot in every state buffer of one
 * layer's view (kind LLMEM_VIEW_RECURRENT), as one batch of n_states
 * ranges where the backend batches copies. Slots in [0, n_slots),
 * distinct. Every state is checked before any is copied:
 * LLMEM_E_INVALID (nothing copied) for a view of another kind, a slot out
 * of range or equal ones, a state with a bad description (dtype, dims, 0
 * bytes), a NULL buffer, one of another backend or too small for the
 * slot. LLMEM_E_NO_MEMORY: host memory for the batch. */
llmem_status llmem_op_state_slot_copy(llmem_backend *be, const llmem_view *view,
                                      int32_t src_slot, int32_t dst_slot);

/* ---- output ----------------------------------------------------------------------- */

/* out = x - log(sum(exp(x))) over the last dimension (the vocabulary),
 * computed as x - max - log(sum(exp(x - max))). x [.., V] f32; out x's
 * shape, in place allowed. Reference: torch.log_softmax. */
llmem_status llmem_op_log_softmax(llmem_backend *be, const llmem_tensor *x,
                                  const llmem_tensor *out);

/* out[r] = index of the largest element of row r (the first one on ties;
 * NaN elements are ignored; an all-NaN row gives 0), for greedy decoding.
 *   x [.., V] f32 with V >= 1;  out [rows] i32. */
llmem_status llmem_op_argmax(llmem_backend *be, const llmem_tensor *x, const llmem_tensor *out);

/* ---- sampling --------------------------------------------------------------------- */

/* How llmem_op_sample picks one token per row of logits. One set for all
 * rows of a call. The filters follow Hugging Face transformers' order
 * (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
 * MinPLogitsWarper); ties are defined by value so that every backend keeps
 * the same set without sorting. */
typedef struct llmem_sample_params {
    float temperature; /* <= 0: greedy (the row's argmax, as llmem_op_argmax) */
    int32_t top_k;     /* keep tokens with fewer than top_k larger logits; <= 0: off */
    float top_p;       /* nucleus (Holtzman et al. 2020): keep tokens whose strictly
                          more probable tokens hold < top_p of the (top-k) mass;
                          >= 1: off; must be > 0 */
    float min_p;       /* keep tokens with p >= min_p * p_max (Nguyen et al. 2024);
                          <= 0: off; must be <= 1 */
    uint64_t seed;     /* selects the random sequence; change it (or ctr) per step */
} llmem_sample_params;

/* The uniform number of a row (part of the op's contract, so that every
 * backend and a test draw the same one): with c = ctr[r] (row r's counter,
 * or r when ctr is NULL) as uint32,
 *   h = mix(mix(mix(c) ^ (uint32)seed) ^ (uint32)(seed >> 32)),
 *   u = (h >> 8) * 2^-24, in [0, 1),
 * where mix(x) is the "lowbias32" integer hash (C. Wellons, 2018):
 *   x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16. */
static inline uint32_t llmem_sample_mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline float llmem_sample_uniform(uint64_t seed, uint32_t c)
{
    uint32_t h = llmem_sample_mix32(llmem_sample_mix32(llmem_sample_mix32(c) ^ (uint32_t)seed) ^
                                    (uint32_t)(seed >> 32));
    return (float)(h >> 8) * 0x1p-24f;
}

/* Samples one token id per row of logits, on the device: only ids need to
 * cross to the host.
 *   logits [.., V] f32, V >= 1 (rows = product of the outer dimensions);
 *   ctr    [rows] i32 per-row counters into the random sequence, or NULL (the
 *          row index); e.g. the token's position, so that a sequence's draws
 *          do not depend on which other rows share the batch;
 *   out    [rows] i32, must not overlap logits or ctr.
 * With temperature <= 0 the result is the argmax (first index on ties).
 * Otherwise, per row, with x the logits and T the temperature (NaN and
 * -inf entries have weight 0 and are never chosen; comparisons are on x, so
 * they are exact on every backend), a token i is kept when all hold:
 *   top-k:  #{j : x_j > x_i} < top_k;
 *   top-p:  sum_{j kept by top-k, x_j > x_i} w_j < top_p * W_k, where
 *           w_j = exp((x_j - max x) / T) (1 where x_j = max x = +inf) and
 *           W_k = sum of w over top-k's tokens;
 *   min-p:  w_i >= min_p (that is, p_i >= min_p * p_max).
 * The token is then the smallest index i (vocabulary order) whose running
 * sum of kept weights, sum_{j <= i, j kept} w_j, exceeds u * W, W the kept
 * total and u the row's uniform number (above); the last kept index if
 * rounding leaves none. Equal inputs give equal tokens on one backend;
 * backends may differ only where u * W falls within float rounding of a
 * running-sum boundary. A row with no finite logit gives 0.
 * Returns LLMEM_E_INVALID also for top_p <= 0 or NaN, min_p > 1 or NaN,
 * NaN temperature. References: Holtzman et al. 2020 ("The Curious Case of
 * Neural Text Degeneration", top-p); Nguyen et al. 2024 ("Turning Up the
 * Heat: Min-p Sampling"); transformers' logits warpers for the order. */
llmem_status llmem_op_sample(llmem_backend *be, const llmem_sample_params *p,
                             const llmem_tensor *logits, const llmem_tensor *ctr,
                             const llmem_tensor *out);

/* out[r] = logits[r, ids[r]] - log(sum_j exp(logits[r, j])), the
 * log-probability of one token per row (what `score` and the log-probs of
 * sampled tokens need), without writing the [rows, V] log-softmax.
 *   logits [.., V] f32; ids [rows] i32 in [0, V) (device values: a backend
 *   must not read outside the row; the CPU backend returns LLMEM_E_INVALID);
 *   out [rows] f32, no overlap. Max-subtracted as llmem_op_log_softmax;
 *   reference: torch.log_softmax(x, -1).gather(-1, ids). */
llmem_status llmem_op_logprob_gather(llmem_backend *be, const llmem_tensor *logits,
                                     const llmem_tensor *ids, const llmem_tensor *out);

/* The n most probable tokens of each row and their log-probabilities
 * (OpenAI "top_logprobs"), largest first, the lower index first on ties.
 *   logits [.., V] f32 (NaN entries never listed); 1 <= n <= min(V, 64);
 *   top_ids [rows, n] i32; top_lp [rows, n] f32 (log_softmax values, as
 *   llmem_op_logprob_gather); no overlaps. */
llmem_status llmem_op_top_logprobs(llmem_backend *be, const llmem_tensor *logits, int32_t n,
                                   const llmem_tensor *top_ids, const llmem_tensor *top_lp);
/* ---- op ids, view kinds and capability queries ------------------------------------- */

/* An op's id, for llmem_backend_supports and for the view kinds ops accept.
 * Ids are open, as view kinds are (<llmem/view.h>): the ops of this header
 * have the small numbers of enum llmem_op_id below (stable; new ones are no
 * longer added here), and an op declared in an op header of its own (an
 * "open op", e.g. the gated delta net of <llmem/ops_gdn.h>) is named by a
 * four-character tag, LLMEM_OP_TAG('g','d','n','_') (characters 0x21..0x7e,
 * so a tag never equals a numbered id), registered by the op's wrapper file
 * when libllmem loads (<llmem/ops_impl.h>, "Open ops"). Two open ops must
 * not share a tag (llmem_op_registry_check reports it). */
typedef int32_t llmem_op;

/* A four-character op tag, first character in the most significant byte. */
#define LLMEM_OP_TAG(a, b, c, d)                                                \
    ((llmem_op)(((uint32_t)(uint8_t)(a) << 24) | ((uint32_t)(uint8_t)(b) << 16) | \
                ((uint32_t)(uint8_t)(c) << 8) | (uint32_t)(uint8_t)(d)))

/* An open op's argument-layout fingerprint (llmem_op_info.layout,
 * <llmem/ops_impl.h>): the size of its parameter struct and the offset of
 * that struct's last member, e.g. LLMEM_OP_LAYOUT(sizeof(llmem_gdn_params),
 * offsetof(llmem_gdn_params, d_v)); (0, n) for an op without one, n a
 * version number to bump when its signature changes. */
#define LLMEM_OP_LAYOUT(size, last_offset) \
    ((((uint64_t)(size)) << 32) | (uint64_t)(uint32_t)(last_offset))

enum llmem_op_id {
    LLMEM_OP_MATMUL = 0,
    LLMEM_OP_GET_ROWS,
    LLMEM_OP_ADD,
    LLMEM_OP_MUL,
    LLMEM_OP_SCALE,
    LLMEM_OP_SILU,
    LLMEM_OP_RELU2,
    LLMEM_OP_SOFTPLUS,
    LLMEM_OP_SWIGLU,
    LLMEM_OP_RMS_NORM,
    LLMEM_OP_RMS_NORM_GATED,
    LLMEM_OP_ROPE,
    LLMEM_OP_ROPE_SHIFT,
    LLMEM_OP_KV_STORE,
    LLMEM_OP_ATTENTION_PAGED,
    LLMEM_OP_SSM_CONV,
    LLMEM_OP_SSM_SCAN,
    LLMEM_OP_COPY,
    LLMEM_OP_COPY_BLOCKS,
    LLMEM_OP_LOG_SOFTMAX,
    LLMEM_OP_ARGMAX,
    LLMEM_OP_SAMPLE,
    LLMEM_OP_LOGPROB_GATHER,
    LLMEM_OP_TOP_LOGPROBS,
    LLMEM_OP_MATMUL_FAST,
    LLMEM_OP_RESERVED_25_, /* was moe_route: now in <llmem/ops_moe.h> */
    LLMEM_OP_RESERVED_26_, /* was moe_ffn: now in <llmem/ops_moe.h> */
    LLMEM_OP_MATMUL_SWIGLU,
    LLMEM_OP_ADD_RMS_NORM,
    LLMEM_OP_RESERVED_29_, /* was gdn: now LLMEM_OP_GDN of <llmem/ops_gdn.h> */
    LLMEM_OP_RESERVED_30_, /* was sigmoid_mul: now in <llmem/ops_gdn.h> */
    LLMEM_OP_GEGLU,
    LLMEM_OP_SOFTCAP,
    LLMEM_OP_RESERVED_33_, /* was short_conv: now in <llmem/ops_ssm1.h> */
    LLMEM_OP_RESERVED_34_, /* was ssm_scan1: now in <llmem/ops_ssm1.h> */
    LLMEM_OP_KV_PAGE_COPY,    /* runs on batched copies (or copy_blocks) */
    LLMEM_OP_STATE_SLOT_COPY, /* runs on batched copies (or copy_blocks) */
    LLMEM_OP_COUNT
};

/* The op's name as in its wrapper (LLMEM_OP_KV_STORE: "kv_store";
 * LLMEM_OP_GDN: "gdn"), or "unknown" for an id that names no op (outside
 * [0, LLMEM_OP_COUNT), a reserved number, or a tag nobody registered).
 * Static string (an open op's: owned by its registration). */
const char *llmem_op_name(llmem_op op);

/* Every op id this process knows: the numbered ops of this header in
 * ascending order, then every registered open op (<llmem/ops_impl.h>) in
 * ascending tag order. Writes the first min(cap, total) ids to ids (which
 * may be NULL when cap is 0) and returns the total, so a caller can size
 * its array with a first call; -1 for cap < 0 or ids NULL with cap > 0.
 * Safe against concurrent registration (an op registered meanwhile may or
 * may not be listed). */
int32_t llmem_op_list(llmem_op *ids, int32_t cap);

/* The view kind an op accepts (<llmem/view.h>): LLMEM_VIEW_KV for rope_shift,
 * kv_store, attention_paged and kv_page_copy; LLMEM_VIEW_RECURRENT for
 * ssm_conv, ssm_scan and state_slot_copy (and the open ops gdn, short_conv
 * and ssm_scan1); an open op's registered kind, which may be an out-of-tree
 * tag; LLMEM_VIEW_NONE for ops that take no view (and unknown ids). */
llmem_view_kind llmem_op_view_kind(llmem_op op);

/* Whether `view` is of the kind op accepts (the first check of every view
 * op's wrapper, which returns LLMEM_E_INVALID when it fails). Returns
 * LLMEM_OK; LLMEM_E_INVALID (NULL view, an op without a view, another kind,
 * or a description smaller than the kind's struct) with a message naming
 * the op and both kinds in err, e.g. "op kv_store accepts views of kind
 * kv, not recurrent". */
llmem_status llmem_op_check_view(llmem_op op, const llmem_view *view, char *err,
                                 size_t err_len);

/* Operands of an op for llmem_backend_supports, in the order of the
 * wrapper's arguments, counting each tensor (optional ones included) and a
 * view as one operand (its storage dtype: the KV pool dtype or the state's
 * desc dtype). E.g. matmul: {a, w, out}; kv_store: {view, k, v};
 * ssm_scan: {view, xbc, dt, a_log, d, dt_bias, y}. 0 for copy_blocks and
 * unknown ids. */
int32_t llmem_op_n_operands(llmem_op op);

/* Capability query, modelled on ggml's supports_op (ggml-backend-impl.h):
 * whether `be` runs op with operands of these dtypes.
 *   dtypes: the first n_dtypes operand dtypes in llmem_op_n_operands order
 *           (NULL when n_dtypes is 0: only "does the backend have the op");
 *           operands past n_dtypes are not asked about.
 * True when (1) the backend's ops table has the op's slot (struct_size
 * covers it and it is non-NULL), or the op's documented fallback runs
 * instead (matmul_fast -> matmul, add_rms_norm -> add and rms_norm,
 * copy_blocks / kv_page_copy / state_slot_copy -> buffer copies), or, for
 * an open op, the backend lists an implementation of it built with the
 * op's argument layout (llmem_backend_op_impl, <llmem/ops_impl.h>); (2) each
 * given dtype is one the op's contract allows for that operand (e.g. a
 * matmul weight f32, f16 or bf16; activations f32); and (3) the backend's
 * optional supports_op slot (<llmem/backend_impl.h>) does not refuse it
 * (e.g. Vulkan has no int8 Mamba-2 states). False for a NULL backend, an
 * unknown op (a reserved number, an unregistered tag), n_dtypes < 0 or
 * above the operand count, or a dtype out of range. A true answer does not
 * promise every shape (a kernel may still return LLMEM_E_UNSUPPORTED for
 * one it cannot hold, e.g. a conv window wider than its registers). The
 * model runtime asks it for every op a model will call when it loads
 * (llmem_model_load, docs/models.md). */
bool llmem_backend_supports(llmem_backend *be, llmem_op op, const llmem_dtype *dtypes,
                            int32_t n_dtypes);

/* ---- CPU backend ------------------------------------------------------------------- */

/* Sets the number of threads the CPU backend's ops use (process-wide; every
 * CPU backend shares one pool). n >= 1; 0 restores the default: $LLMEM_THREADS
 * when set, else the number of online cores.
 * Returns LLMEM_E_INVALID for n < 0 or a backend that is not "cpu". */
llmem_status llmem_backend_cpu_set_threads(llmem_backend *be, int32_t n);
/* Threads the CPU backend's ops use now (>= 1). */
int32_t llmem_backend_cpu_threads(void);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

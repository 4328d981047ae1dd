/* llmem: the ops table a backend implements (for backend authors).
 *
 * A backend's vtable (llmem_backend_i, <llmem/backend_impl.h>) points at one
 * `const struct llmem_ops_i`, filled with designated initialisers, for the
 * numbered ops of <llmem/ops.h>, and at a list of its implementations of
 * open ops (see "Open ops" at the end: ops in files of their own). The
 * table grows only by appending; `struct_size` says how much of it the
 * backend was built with, and a slot past it or NULL means "unsupported"
 * (the wrapper returns LLMEM_E_UNSUPPORTED).
 *
 * Slots are called by the wrappers of <llmem/ops.h> only after every
 * argument check listed there has passed: shapes, dtypes, buffers of this
 * backend and in range, aliasing rules, and every host copy of a view's
 * index tables. A slot may trust all of that, except the index values it
 * reads from device memory (get_rows indices, and the view tables it reads
 * at view->idx + table.offset), which must not make it read outside its
 * inputs. Zero-element calls never reach a slot.
 *
 * Layouts (see <llmem/ops.h>): tensors are dense row-major, shapes outermost
 * first. KV pools are [n_pages][page_size][n_kv_heads][head_dim] of the
 * view's dtype; slot = page * page_size + offset. Recurrent state buffers
 * are [n_slots][desc elements] of desc.dtype.
 *
 * The CPU backend (backends/cpu/ops_*.c) is the reference: every other
 * backend must match it within the thresholds of tests/test_ops*.c.
 */
#ifndef LLMEM_OPS_IMPL_H
#define LLMEM_OPS_IMPL_H

#include "llmem/backend_impl.h"
#include "llmem/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef const llmem_tensor llmem_ct; /* shorthand for the slot signatures */

struct llmem_ops_i {
    size_t struct_size; /* sizeof(struct llmem_ops_i) the backend was built with */

    /* out[M, N] f32 = a[M, K] f32 · w[N, K]ᵀ (w f32|f16|bf16, row-major
     * [out, in]). f32 accumulation; no overlap. Reference: GEMM. */
    llmem_status (*matmul)(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out);

    /* out[n, C] f32 = src[idx[i], :] (src [R, C] f32|f16|bf16, idx [n] i32
     * on the device). An index outside [0, R) must not be read; the CPU
     * backend returns LLMEM_E_INVALID. Reference: torch embedding. */
    llmem_status (*get_rows)(llmem_backend *be, llmem_ct *src, llmem_ct *idx, llmem_ct *out);

    /* Element-wise f32 out = a + b, a * b; b is a's shape or one row of a's
     * last dimension broadcast over a's rows. out may equal a or b. */
    llmem_status (*add)(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out);
    llmem_status (*mul)(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out);
    /* out = s * a, f32; out may equal a. */
    llmem_status (*scale)(llmem_backend *be, llmem_ct *a, float s, llmem_ct *out);

    /* Activations, f32, out may equal the input(s):
     * silu x/(1+e^-x); relu2 max(x,0)^2 (Primer, So et al. 2021);
     * softplus log1p(e^x), x above 20 (torch threshold);
     * swiglu silu(gate) * up (Shazeer 2020). */
    llmem_status (*silu)(llmem_backend *be, llmem_ct *a, llmem_ct *out);
    llmem_status (*relu2)(llmem_backend *be, llmem_ct *a, llmem_ct *out);
    llmem_status (*softplus)(llmem_backend *be, llmem_ct *a, llmem_ct *out);
    llmem_status (*swiglu)(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out);

    /* RMS norm over the last dimension D (Zhang & Sennrich 2019):
     * out = x * rsqrt(mean(x^2) + eps) * w; x, out [.., D] f32, w [D]
     * f32|f16|bf16 or NULL (no weight). out may equal x. */
    llmem_status (*rms_norm)(llmem_backend *be, llmem_ct *x, llmem_ct *w, float eps,
                             llmem_ct *out);
    /* Mamba-2 gated RMS norm (HF MambaRMSNormGated): h = y * silu(z), then
     * RMS norm within each of n_groups contiguous groups of D / n_groups,
     * times w [D]. y, z, out [.., D] f32; out may equal y or z. */
    llmem_status (*rms_norm_gated)(llmem_backend *be, llmem_ct *y, llmem_ct *z, llmem_ct *w,
                                   int32_t n_groups, float eps, llmem_ct *out);

    /* RoPE (RoFormer, Su et al. 2021, eq. 34) on x [T, H, Dh] f32 with
     * pos [T] i32 (device); pairs per p->mode (NORMAL: (2i, 2i+1); NEOX:
     * (i, i + n_rot/2)), angle pos * freq_scale * theta_base^(-2i/n_rot),
     * dims >= n_rot copied. out [T, H, Dh] may equal x. */
    llmem_status (*rope)(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x,
                         llmem_ct *pos, llmem_ct *out);
    /* K-shift: rotates the key of every KV head in slot shift_slot[j] of the
     * view's K pool by shift_delta[j] positions (same angles as rope), in
     * f32, stored back in the pool dtype (RNE). Slots distinct. */
    llmem_status (*rope_shift)(llmem_backend *be, const llmem_rope_params *p,
                               const llmem_view *view);

    /* Stores k, v [T, n_kv_heads, head_dim] f32: row store_tok[j] -> slot
     * store_slot[j] of the K and V pools, converted to the pool dtype (RNE).
     * Slots distinct; nothing else written. */
    llmem_status (*kv_store)(llmem_backend *be, const llmem_view *view, llmem_ct *k,
                             llmem_ct *v);
    /* Causal paged attention, q, out [T, H, Dh] f32, GQA by H / n_kv_heads.
     * Query i reads keys j in [lo, tok_kv_len[i]) of sequence group tok_seq[i]
     * through the page table (lo from p->window); masked keys are skipped,
     * never read (PagedAttention, Kwon et al. 2023); scores scaled, then
     * soft-capped; softmax by FlashAttention-2 Alg. 1 (online softmax over
     * key blocks, Dao 2023). No visible key: zeros. */
    llmem_status (*attention_paged)(llmem_backend *be, const llmem_attn_params *p,
                                    const llmem_view *view, llmem_ct *q, llmem_ct *out);

    /* Mamba-2 causal depthwise conv1d + SiLU with conv state {d_conv-1,
     * conv_dim} (oldest first), x, out [T, conv_dim] f32, w [conv_dim,
     * d_conv], b [conv_dim] or NULL (f32|f16|bf16). EQUAL ubatch, group
     * major; reads src slots before writing dst/ckpt slots (see ops.h).
     * Reference: HF Mamba2Mixer.torch_forward (conv1d + act). */
    llmem_status (*ssm_conv)(llmem_backend *be, const llmem_view *view, int32_t state,
                             llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out);
    /* Mamba-2 selective scan, recurrent form (Dao & Gu 2024, Sec. 3 eq. (2);
     * HF Mamba2Mixer.torch_forward cached single step), ssm state {H, P, N}:
     * dt' = clamp(softplus(dt + dt_bias)), S = exp(dt' A) S + dt' x ⊗ B,
     * y = S·C + D x, A = -exp(A_log). xbc [T, H*P + 2*G*N], dt [T, H],
     * y [T, H*P] f32; a_log, d, dt_bias [H] f32|f16|bf16 (d, dt_bias may be
     * NULL). Same slot rules as ssm_conv. */
    llmem_status (*ssm_scan)(llmem_backend *be, const llmem_ssm_params *p,
                             const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                             llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);

    /* dst[r, c] = src[r, col0 + c] with dtype conversion (f32|f16|bf16,
     * RNE). No overlap. */
    llmem_status (*copy)(llmem_backend *be, llmem_ct *src, int32_t col0, llmem_ct *dst);
    /* Block copies inside buf: src[i] -> dst[i], block_bytes each; host
     * index arrays, checked (in range; no dst equals a src or another dst).
     * Called only for a backend without buffer_copy_ranges (the built-in
     * ones have it and leave this NULL). */
    llmem_status (*copy_blocks)(llmem_backend *be, llmem_buffer *buf, size_t block_bytes,
                                int32_t n, const int32_t *src, const int32_t *dst);

    /* Row-wise log-softmax over the last dimension, f32, out may equal x
     * (torch.log_softmax; max-subtracted). */
    llmem_status (*log_softmax)(llmem_backend *be, llmem_ct *x, llmem_ct *out);
    /* Row-wise argmax, x [.., V] f32 -> out [rows] i32, first index on ties,
     * NaN ignored, all-NaN row -> 0. */
    llmem_status (*argmax)(llmem_backend *be, llmem_ct *x, llmem_ct *out);

    /* ---- appended: sampling (see <llmem/ops.h> for the exact contract) ---- */
    /* One token id per row of logits [rows, V] f32 -> out [rows] i32, by
     * llmem_sample_params (greedy, temperature, top-k, top-p, min-p), with
     * the row's uniform from llmem_sample_uniform(p->seed, ctr ? ctr[r] : r);
     * ctr [rows] i32 (device) or NULL. */
    llmem_status (*sample)(llmem_backend *be, const llmem_sample_params *p, llmem_ct *logits,
                           llmem_ct *ctr, llmem_ct *out);
    /* out[r] f32 = log_softmax(logits[r])[ids[r]]; ids [rows] i32 on the
     * device, one outside [0, V) must not be read (CPU: LLMEM_E_INVALID). */
    llmem_status (*logprob_gather)(llmem_backend *be, llmem_ct *logits, llmem_ct *ids,
                                   llmem_ct *out);
    /* The n (1..64) largest log-probabilities of each row, descending, lower
     * index first on ties: top_ids [rows, n] i32, top_lp [rows, n] f32. */
    llmem_status (*top_logprobs)(llmem_backend *be, llmem_ct *logits, int32_t n,
                                 llmem_ct *top_ids, llmem_ct *top_lp);

    /* ---- appended: precision modes ---- */
    /* matmul of the FAST mode: as matmul, a may be rounded to bf16 (RNE)
     * first; bf16 weights in one tensor-core GEMM, f32 accumulation. */
    llmem_status (*matmul_fast)(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out);
    /* Reserved: the mixture-of-experts slots of the first ABI-4 tables, open
     * ops now (<llmem/ops_moe.h>); kept so that the slots after them keep
     * their offsets. Never read; leave them NULL. */
    llmem_op_fn reserved_moe_route;
    llmem_op_fn reserved_moe_ffn;

    /* ---- appended: fused ops ---- */
    /* out[M, N] = silu(a · gateᵀ) * (a · upᵀ); gate, up [N, K] of one
     * dtype; f32 accumulation; no overlaps (llmem_op_matmul_swiglu). */
    llmem_status (*matmul_swiglu)(llmem_backend *be, llmem_ct *a, llmem_ct *gate, llmem_ct *up,
                                  llmem_ct *out);
    /* x += r; out = rms_norm(x, w, eps) (llmem_op_add_rms_norm; checked by
     * the core: out == r or disjoint from x and r; w may be NULL). */
    llmem_status (*add_rms_norm)(llmem_backend *be, llmem_ct *x, llmem_ct *r, llmem_ct *w,
                                 float eps, llmem_ct *out);

    /* (ABI 3 had the gated delta net's gdn and sigmoid_mul slots here; since
     * ABI 4 they are open ops, <llmem/ops_gdn.h>.) */

    /* ---- appended: Gemma activations (llmem_op_geglu, llmem_op_softcap) ---- */
    /* out = gelu_tanh(gate) * up, f32, one shape; out may equal either
     * (GELU tanh approximation, Hendrycks & Gimpel 2016; torch
     * gelu(approximate="tanh")). */
    llmem_status (*geglu)(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out);
    /* out = cap * tanh(a / cap), cap > 0, f32; out may equal a (Gemma 2/3
     * final_logit_softcapping). */
    llmem_status (*softcap)(llmem_backend *be, llmem_ct *a, float cap, llmem_ct *out);

    /* ---- reserved: the short conv and Mamba-1 slots of the first ABI-4
     * tables, open ops now (<llmem/ops_ssm1.h>). Kept so that their offsets
     * never come to mean another slot for a plugin built before the move;
     * never read, leave them NULL. The next appended slot goes after them. */
    llmem_op_fn reserved_short_conv;
    llmem_op_fn reserved_ssm_scan1;
};

/* ---- Open ops ---------------------------------------------------------------------
 *
 * An op need not have a slot above. An "open op" lives in files of its own:
 *   - an op header (e.g. <llmem/ops_gdn.h>): its id, a four-character tag
 *     (LLMEM_OP_TAG), its parameter struct, its wrapper, the type of its
 *     implementations (llmem_op_<name>_fn) and its argument layout
 *     (LLMEM_OP_<NAME>_LAYOUT, LLMEM_OP_LAYOUT);
 *   - the wrapper's file (e.g. backends/ops_gdn.c): an llmem_op_info with
 *     its metadata, registered by LLMEM_OP_DEFINE when the library that
 *     holds it loads; the wrapper checks its arguments as every op does,
 *     finds the backend's implementation with llmem_backend_op_impl and
 *     calls it (LLMEM_E_UNSUPPORTED when there is none);
 *   - in each backend, the file of its kernel, which registers it in the
 *     backend's list with LLMEM_OP_IMPL (<llmem/backend_impl.h>).
 * llmem_backend_supports, llmem_op_name, llmem_op_view_kind,
 * llmem_op_check_view and llmem_op_list (<llmem/ops.h>) answer for open ops
 * from their registered info. No central table, enum or backend table
 * names an open op, and the build finds new sources by glob
 * (docs/adding-a-cache-type.md counts the files).
 */

#define LLMEM_OP_MAX_OPERANDS 16

/* What an open op declares about itself (the analogue of a line of
 * backends/op_info.c for the numbered ops). Static storage of the file
 * that registers it; the registry links it through `next` and never
 * frees or copies it. */
typedef struct llmem_op_info {
    size_t struct_size;    /* sizeof(llmem_op_info) the op was built with */
    llmem_op op;           /* LLMEM_OP_TAG(...): four characters 0x21..0x7e */
    const char *name;      /* as its wrapper, e.g. "gdn"; unique; static string */
    llmem_view_kind view;  /* the view kind it accepts (a tag allowed), or LLMEM_VIEW_NONE */
    size_t view_desc_min;  /* the smallest description of that kind it reads, bytes */
    int32_t n_operands;    /* operand count of llmem_op_n_operands, 0..LLMEM_OP_MAX_OPERANDS */
    uint32_t dtypes[LLMEM_OP_MAX_OPERANDS]; /* per operand: the dtypes its contract
                                               allows, bit (1u << llmem_dtype) */
    uint64_t layout;       /* LLMEM_OP_<NAME>_LAYOUT; implementations must match it */
    const struct llmem_op_info *next; /* set by llmem_op_register */
    /* Appended (an info of LLMEM_OP_INFO_V1_SIZE bytes has none):
     * LLMEM_OP_WRITES_SNAPSHOT bits. */
    uint32_t flags;
} llmem_op_info;

/* llmem_op_info.flags: a recurrent op whose every implementation writes
 * the snapshot inside the ubatch of its view (llmem_rs_view.snap_tok /
 * snap_slot, <llmem/view.h>) as it writes checkpoints; llmem_op_check_view
 * refuses a view with a snapshot (LLMEM_E_UNSUPPORTED) to every recurrent
 * op without it. */
#define LLMEM_OP_WRITES_SNAPSHOT (1u << 0)

/* Bytes of an llmem_op_info before `flags` was appended: the least
 * llmem_op_register takes. */
#define LLMEM_OP_INFO_V1_SIZE (offsetof(llmem_op_info, next) + sizeof(const llmem_op_info *))

/* Adds an open op to the process-wide registry. `info` must stay valid and
 * unchanged while llmem is loaded (static storage); the registry writes
 * only info->next. Thread-safe; normally called through LLMEM_OP_DEFINE.
 * Returns LLMEM_OK; LLMEM_E_ABI for a struct_size below LLMEM_OP_INFO_V1_SIZE
 * (an info from before open ops had a struct_size); LLMEM_E_INVALID for a NULL info or name, an id that is not
 * a four-character tag (e.g. a numbered id of <llmem/ops.h>), or
 * n_operands outside [0, LLMEM_OP_MAX_OPERANDS]; LLMEM_E_STATE when an op
 * with the same id or name is registered already, or a numbered op has the
 * name (the registry keeps the first; llmem_op_registry_check reports the
 * clash). On error nothing is registered. */
llmem_status llmem_op_register(llmem_op_info *info);

/* Whether every registration so far succeeded. Returns LLMEM_OK, or the
 * status of the first failed llmem_op_register with a message naming the
 * op in err (may be NULL), e.g. "op gdn2 (id gdn_): another op has its tag
 * or name". tests/test_backend_supports.c calls it, so that a clash of two
 * in-tree tags shows up there instead of as a missing op. Thread-safe. */
llmem_status llmem_op_registry_check(char *err, size_t err_len);

/* The registered info of open op `op`, or NULL (not registered, or a
 * numbered id). */
const llmem_op_info *llmem_op_info_find(llmem_op op);

/* Registers `info` (an llmem_op_info variable of static storage) when the
 * library or program holding this line loads (a constructor). Use once per
 * op, at file scope beside the op's wrapper; a failure is reported by
 * llmem_op_registry_check. */
#define LLMEM_OP_DEFINE(info)                                     \
    static void llmem_op_define_##info(void) LLMEM_OP_IMPL_CTOR; \
    static void llmem_op_define_##info(void)                      \
    {                                                             \
        (void)llmem_op_register(&(info));                         \
    }                                                             \
    typedef int llmem_op_define_semicolon_##info

/* Adds an implementation of an open op to every backend registered under
 * the name `backend` ("cpu", "vulkan", ...), from outside that backend: how
 * an out-of-tree op brings a kernel for a built-in backend (e.g. a host
 * kernel for "cpu", reading buffers through llmem_buffer_host_ptr). `impl`
 * must stay valid while llmem is loaded (static storage); its `next` is not
 * used. The backend's own list (LLMEM_OP_IMPL) wins over it. Thread-safe.
 * Returns LLMEM_OK; LLMEM_E_INVALID for a NULL argument or fn, an op that
 * is not a four-character tag, or a name of 32 bytes or more; LLMEM_E_STATE
 * when this backend name has an implementation of the op registered here
 * already; LLMEM_E_NO_MEMORY when the registry's 256 entries are used. */
llmem_status llmem_op_impl_register(const char *backend, const llmem_op_impl *impl);

/* The implementation of open op `info` for backend be: from be's own list
 * (llmem_backend_i.op_impls; absent for a NULL slot or a vtable older than
 * ABI 4), else one llmem_op_impl_register added for be's name; NULL when
 * there is none, or when the one found was built with a layout other than
 * info->layout (against another version of the op header). The caller
 * casts the result to the op's llmem_op_<name>_fn type. O(length of the
 * lists); no locking (a backend's list is complete once its module
 * loaded). */
llmem_op_fn llmem_backend_op_impl(llmem_backend *be, const llmem_op_info *info);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

/* llmem CUDA kernels: the C launchers the cuda plugin calls (internal).
 *
 * Every launcher enqueues its kernels on `stream` and returns the status of
 * the launch (cudaGetLastError); execution errors surface at the next
 * synchronization. Pointers are device pointers; dtype codes are
 * llmem_dtype values (0 f32, 1 f16, 2 bf16). The argument checks of
 * backends/ops.c have already run; kernels still bounds-check every index
 * they read from device memory (get_rows indices, view tables) and skip
 * what is out of range instead of reading outside their inputs.
 *
 * One file per op family: basic.cu (element-wise, norms, rope, copies,
 * output), matmul.cu (small-M GEMV, activation splitting for cuBLAS),
 * attention.cu (paged K/V store and attention), mamba.cu (conv1d, scan).
 */
#ifndef LLMEM_CUDA_KERNELS_H
#define LLMEM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- basic.cu ----------------------------------------------------------------------- */

typedef enum cuk_ew_kind {
    CUK_EW_ADD,
    CUK_EW_MUL,
    CUK_EW_SCALE,
    CUK_EW_SILU,
    CUK_EW_RELU2,
    CUK_EW_SOFTPLUS,
    CUK_EW_SWIGLU,
    CUK_EW_GEGLU,   /* gelu_tanh(a) * b */
    CUK_EW_SOFTCAP, /* s * tanh(a / s) */
} cuk_ew_kind;

/* Fills n 32-bit words at dst (4-byte aligned) with pattern. */
cudaError_t cuk_fill32(void *dst, int64_t n_words, uint32_t pattern, cudaStream_t stream);
/* out[i] = op(a[i], b[i or i % b_cols]); b_cols 0: b has a's shape. */
cudaError_t cuk_elementwise(cuk_ew_kind kind, const float *a, const float *b, int64_t b_cols,
                            float s, float *out, int64_t n, cudaStream_t stream);
/* out[i, :] = src[idx[i], :] as f32; rows with idx outside [0, rows) get NaN. */
cudaError_t cuk_get_rows(const void *src, int dtype, int64_t rows, int64_t cols,
                         const int32_t *idx, int64_t n, float *out, cudaStream_t stream);
/* RMS norm of rows of x [rows, cols]; w (dtype wdt) NULL for none. */
cudaError_t cuk_rms_norm(const float *x, const void *w, int wdt, int64_t rows, int64_t cols,
                         float eps, float *out, cudaStream_t stream);
/* x += r; out = rms_norm(x) * w (out may be r). */
cudaError_t cuk_add_rms_norm(float *x, const float *r, const void *w, int wdt, int64_t rows,
                             int64_t cols, float eps, float *out, cudaStream_t stream);
/* Gated RMS norm (MambaRMSNormGated) in `groups` groups per row. */
cudaError_t cuk_rms_norm_gated(const float *y, const float *z, const void *w, int wdt,
                               int64_t rows, int64_t cols, int64_t groups, float eps, float *out,
                               cudaStream_t stream);
cudaError_t cuk_log_softmax(const float *x, int64_t rows, int64_t cols, float *out,
                            cudaStream_t stream);
cudaError_t cuk_argmax(const float *x, int64_t rows, int64_t cols, int32_t *out,
                       cudaStream_t stream);

/* out[M, N] = silu(a · wgᵀ) * (a · wuᵀ) for M <= CUK_GEMV_MAX_M (matmul.cu);
 * cudaErrorNotSupported when a, wg, wu or K do not allow 16-byte loads. */
cudaError_t cuk_gemv_swiglu(const float *a, const void *wg, const void *wu, int wdt, float *out,
                            int32_t m, int32_t n, int32_t k, cudaStream_t stream);

/* ---- sample.cu ---------------------------------------------------------------------- */

/* One token per row of logits [rows, cols] by <llmem/ops.h> llmem_op_sample
 * (temperature <= 0: cuk_argmax); ctr [rows] or NULL (the row index). */
cudaError_t cuk_sample(const float *logits, int64_t rows, int64_t cols, const int32_t *ctr,
                       float temperature, int32_t top_k, float top_p, float min_p,
                       uint64_t seed, int32_t *out, cudaStream_t stream);
/* out[r] = log_softmax(logits[r])[ids[r]]; NaN for an id outside [0, cols). */
cudaError_t cuk_logprob_gather(const float *logits, int64_t rows, int64_t cols,
                               const int32_t *ids, float *out, cudaStream_t stream);
/* The n (1..64) best of each row, descending, lower index first on ties. */
cudaError_t cuk_top_logprobs(const float *logits, int64_t rows, int64_t cols, int32_t n,
                             int32_t *top_ids, float *top_lp, cudaStream_t stream);
/* dst[r, c] = src[r, col0 + c] converted from sdt to ddt. */
cudaError_t cuk_copy(const void *src, int sdt, int64_t src_cols, int64_t col0, void *dst,
                     int ddt, int64_t rows, int64_t cols, cudaStream_t stream);

typedef struct cuk_rope_args {
    int32_t mode; /* 0 normal (2i, 2i+1), 1 neox (i, i + n_rot/2) */
    int32_t n_rot;
    float theta_base, freq_scale;
} cuk_rope_args;

/* x, out [T, H, D] f32 (out may equal x); pos [T] i32. */
cudaError_t cuk_rope(const cuk_rope_args *p, const float *x, const int32_t *pos, float *out,
                     int64_t n_tok, int64_t n_heads, int64_t head_dim, cudaStream_t stream);
/* Rotates the key of every KV head in slot[j] by delta[j] positions. */
cudaError_t cuk_rope_shift(const cuk_rope_args *p, void *pool, int dtype, const int32_t *slot,
                           const int32_t *delta, int64_t n, int64_t n_slots_total,
                           int64_t n_kv_heads, int64_t head_dim, cudaStream_t stream);

/* ---- matmul.cu ---------------------------------------------------------------------------- */

/* Largest M the GEMV kernel takes. */
#define CUK_GEMV_MAX_M 4

/* out[M, N] = a[M, K] · w[N, K]ᵀ for M <= CUK_GEMV_MAX_M, f32 accumulation. */
cudaError_t cuk_gemv(const float *a, const void *w, int wdt, float *out, int32_t m, int32_t n,
                     int32_t k, cudaStream_t stream);
/* a = hi + lo with hi = bf16(a), lo = bf16(a - hi) (n elements); lo NULL:
 * hi only. */
cudaError_t cuk_split_bf16(const float *a, uint16_t *hi, uint16_t *lo, int64_t n,
                           cudaStream_t stream);

/* ---- attention.cu ------------------------------------------------------------------------- */

typedef struct cuk_attn_args {
    const float *q; /* [T, H, D] */
    float *out;     /* [T, H, D] */
    const void *k, *v;
    int32_t dtype;
    const int32_t *page_table, *seq_len, *tok_kv_len, *tok_seq;
    const int32_t *page_off; /* [n_streams] page-table row offsets; NULL: row s * max_pages */
    int32_t n_tok, n_heads, n_kv_heads, head_dim;
    int32_t n_streams, max_pages, page_size, n_pages;
    float scale, softcap;
    int32_t window;
    /* prefill: 1 = queries and probabilities as hi + lo pairs of the pool
     * dtype (two MMAs each; about f32 accuracy), 0 = one rounding each
     * (FlashAttention's precision, twice the speed) */
    int32_t precise;
} cuk_attn_args;

/* Stores k, v [n_tok, row] f32 rows tok[j] into slots slot[j] (n entries). */
cudaError_t cuk_kv_store(const float *k, const float *v, void *kp, void *vp, int dtype,
                         const int32_t *tok, const int32_t *slot, int64_t n, int64_t n_tok,
                         int64_t n_slots_total, int64_t row, cudaStream_t stream);

/* Whether the split-K decode kernel handles this head dim and dtype. */
int cuk_attn_decode_supported(int32_t head_dim, int32_t dtype);
/* Scratch floats the decode kernel needs for n_split > 1. */
size_t cuk_attn_decode_scratch(const cuk_attn_args *a, int32_t n_split);
/* One query token per work item, keys split into n_split ranges (flash
 * decoding); part: scratch of cuk_attn_decode_scratch floats (n_split > 1).
 * f16/bf16 pools with head_dim 64 or 128 and 16-byte aligned queries run on
 * tensor cores (attention_decode_tc.cuh) unless LLMEM_CUDA_DEC_TC=0. */
cudaError_t cuk_attn_decode(const cuk_attn_args *a, int32_t n_split, int32_t max_kv,
                            float *part, cudaStream_t stream);
/* Whether the tensor-core prefill kernel handles this head dim and dtype. */
int cuk_attn_prefill_supported(int32_t head_dim, int32_t dtype);
/* Tiles of query tokens x heads of a GQA group against K/V blocks with
 * mma.sync (FlashAttention-2 forward). */
cudaError_t cuk_attn_prefill(const cuk_attn_args *a, cudaStream_t stream);
/* The fast mode's prefill: the same rows, passes and key ranges as
 * cuk_attn_prefill with q * scale and the probabilities rounded once to the
 * pool dtype, f32 accumulation (FlashAttention-2 forward, Dao 2023, Alg. 1);
 * a->precise is ignored. On a compute capability 9.0 device with sm_90a
 * code built (LLMEM_CUDA_ARCHS naming 90a) it runs on wgmma
 * (attention_prefill_wg.cuh, 2 warpgroups x 64 rows per CTA, 2 CTAs per
 * SM, as in FlashAttention-3, Shah et al. 2024) unless LLMEM_CUDA_PF_WG=0; otherwise
 * on mma.sync (attention_prefill_tc.cuh, 8 warps x 32 rows per CTA;
 * LLMEM_CUDA_PF_PIPE=1 picks its pipelined variant). f16/bf16 pools,
 * head_dim 64 or 128. Returns cudaErrorMisalignedAddress for q, k or v not
 * 16-byte aligned or out not 8-byte aligned, cudaErrorInvalidValue for
 * another dtype or head_dim, or the launch's error. */
cudaError_t cuk_attn_prefill_fast(const cuk_attn_args *a, cudaStream_t stream);
/* Any head dim and dtype: one warp per (token, query head). */
cudaError_t cuk_attn_generic(const cuk_attn_args *a, cudaStream_t stream);

/* ---- mamba.cu -------------------------------------------------------------------------------- */

typedef struct cuk_rs_args {
    void *state;        /* [n_slots][elems] of dtype */
    const void *snap;   /* NULL, or [n_seqs][elems] snapshots of every source */
    int32_t dtype;
    int64_t elems;      /* elements of one slot */
    int32_t n_slots, n_seqs, n_seq_tokens, n_ckpt;
    const int32_t *src, *dst, *ckpt; /* device tables */
    /* The snapshot inside the ubatch (<llmem/view.h> llmem_rs_view.snap_tok /
     * snap_slot), device tables [n_seqs], both NULL when no stream has one:
     * stream s's state after its token snap_tok[s] also goes to slot
     * snap_slot[s] (-1: none). Set for the ops that take such a view
     * (ssm_conv, ssm_scan, short_conv, ssm_scan1, gdn); the Mamba-2
     * kernels then run an instance of their own (the common one stays as it
     * was). */
    const int32_t *snap_tok, *snap_slot;
} cuk_rs_args;

/* Copies each stream's source slot (zeros for -1) to snap [n_seqs][elems]. */
cudaError_t cuk_rs_snapshot(const cuk_rs_args *rs, void *snap, cudaStream_t stream);

/* Causal depthwise conv1d + SiLU with conv state {d_conv - 1, conv_dim}. */
cudaError_t cuk_ssm_conv(const cuk_rs_args *rs, const float *x, const void *w, int wdt,
                         const void *b, int bdt, float *out, int32_t conv_dim, int32_t d_conv,
                         cudaStream_t stream);

typedef struct cuk_scan_args {
    int32_t n_heads, head_dim, d_state, n_groups;
    float dt_min, dt_max;
    const float *xbc, *dt;
    const void *a_log, *d, *dt_bias;
    int32_t a_dt, d_dt, b_dt;
    float *y;
    int32_t conv_dim;
    int32_t n_sms; /* multiprocessors of the device (grid of the decode scan) */
    int32_t fast;  /* llmem_ssm_params.fast: the chunked SSD may use single bf16 products */
} cuk_scan_args;

/* Whether the scan kernel handles this d_state (<= 256). */
int cuk_ssm_scan_supported(int32_t d_state);
/* Mamba-2 selective scan, recurrent form, with ssm state {H, P, N}. One
 * token per stream without checkpoints and N = 64, 128 or 256 runs the
 * streaming decode kernel (ssm_scan1_kernel, p->n_sms sizes its grid). */
cudaError_t cuk_ssm_scan(const cuk_rs_args *rs, const cuk_scan_args *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

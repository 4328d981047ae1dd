/* llmem CUDA kernels for scaled 8-bit KV pools (kernels/attention_q.cu;
 * issue 17). C interface for backends/cuda/cuda_ops.c. */
#ifndef LLMEM_KERNELS_ATTENTION_Q_H
#define LLMEM_KERNELS_ATTENTION_Q_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUK_I8 4 /* LLMEM_DTYPE_I8 */
#define CUK_F8 5 /* LLMEM_DTYPE_F8E4M3 */

/* Stores k, v [n_tok, n_kv_heads, head_dim] f32 rows tok[j] into slots
 * slot[j] (n entries) of scaled pools (dtype CUK_I8 | CUK_F8), updating the
 * per-page, per-head scales (docs/memory.md, "Quantized KV and state").
 * page_size * 5 bytes of shared memory (page_size <= 9830). */
cudaError_t cuk_kv_store_q(const float *k, const float *v, void *kp, void *vp, int dtype,
                           const int32_t *tok, const int32_t *slot, int32_t n, int32_t n_tok,
                           int32_t page_size, int32_t n_pages, int32_t n_kv_heads,
                           int32_t head_dim, cudaStream_t stream);
/* Whether cuk_attn_q handles this head dim (a multiple of 4, <= 256). */
int cuk_attn_q_supported(int32_t head_dim);
/* Scratch floats cuk_attn_q needs for n_split > 1. */
size_t cuk_attn_q_scratch(const cuk_attn_args *a, int32_t n_split);
/* Paged attention over scaled pools (a->dtype CUK_I8 | CUK_F8), any number
 * of query tokens, keys split into n_split ranges (flash decoding). */
cudaError_t cuk_attn_q(const cuk_attn_args *a, int32_t n_split, float *part, cudaStream_t stream);

/* ---- mamba_q.cu: int8 SSM state -------------------------------------------------------------- */

typedef struct cuk_scan_q_args {
    uint8_t *state;        /* [n_slots][slot_bytes]: H x P x N codes, then H f32 scales */
    const uint8_t *snap;   /* NULL, or [n_seqs][slot_bytes] raw copies of every source */
    size_t slot_bytes, scale_off;
    int32_t n_slots, n_seqs, n_seq_tokens, n_ckpt;
    const int32_t *src, *dst, *ckpt; /* device tables */
    /* the snapshot inside the ubatch (cuk_rs_args snap_tok / snap_slot):
     * device tables [n_seqs], NULL when the view has none */
    const int32_t *snap_tok, *snap_slot;
} cuk_scan_q_args;

/* llmem_op_ssm_scan with an int8 state (head_dim * d_state <= 12288). */
cudaError_t cuk_ssm_scan_q(const cuk_scan_args *p, const cuk_scan_q_args *q, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

/* llmem: the reference model runtime — runs a Hugging Face checkpoint
 * (llama, mamba2, bamba, nemotron_h; <llmem/model.h>) through llmem's
 * memories and backend ops.
 *
 * The model builds its own memory from its config: attention layers get a
 * paged KV cache, Mamba-2 layers a recurrent memory, both a hybrid. Each
 * batch runs per ubatch through plan / apply / commit, and logits are
 * computed only for output rows.
 *
 * References: transformers' modeling_llama.py, modeling_mamba2.py,
 * modeling_bamba.py, modeling_nemotron_h.py (block structure, residuals,
 * norms); Dao & Gu 2024 (Mamba-2).
 * Threading: a model is used by one thread at a time.
 */
#ifndef LLMEM_RUNTIME_H
#define LLMEM_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/backend.h"
#include "llmem/batch.h"
#include "llmem/memory.h"
#include "llmem/ops.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef struct llmem_model llmem_model;
struct llmem_model_config;

/* Arithmetic of the forward pass.
 *   PRECISE: f32 activations; matmuls with f32 (or split hi + lo bf16)
 *            inputs, so results match a float64 reference to f32 rounding.
 *            The parity reference, and the default of `score`.
 *   FAST:    activations rounded to bf16 at the inputs of the tensor-core
 *            GEMMs (f32 accumulation), as vLLM and llama.cpp run bf16
 *            models; attention with one rounding of q and the
 *            probabilities (llmem_attn_params.fast); KV cache bf16 unless
 *            kv_dtype says otherwise.
 * A backend without a fast path runs FAST as PRECISE. */
typedef enum llmem_precision {
    LLMEM_PRECISION_PRECISE = 0,
    LLMEM_PRECISION_FAST = 1,
} llmem_precision;

/* "precise", "fast"; "?" otherwise. */
const char *llmem_precision_name(llmem_precision p);
/* Parses "precise" | "fast". Returns LLMEM_OK or LLMEM_E_INVALID. */
llmem_status llmem_precision_parse(const char *name, llmem_precision *out);

typedef struct llmem_model_params {
    int32_t n_seq_max;     /* sequences in flight at once (default 8) */
    int32_t n_ubatch;      /* tokens per ubatch (default 512) */
    int32_t n_ctx;         /* tokens per sequence the KV cache is sized for (default 4096) */
    int32_t page_size;     /* KV page size in tokens (default 16) */
    int32_t n_pages;       /* KV pages; 0: n_seq_max * ceil(n_ctx / page_size) */
    llmem_dtype kv_dtype;  /* KV cache dtype; LLMEM_DTYPE_COUNT (the default): by
                              precision, f32 when PRECISE, bf16 when FAST; also
                              I8 / F8E4M3 (per-page, per-head scales) */
    int32_t n_ckpt;        /* recurrent checkpoints per sequence (speculative decoding) */
    bool no_prefix_cache;  /* disable KV prefix reuse */
    bool poison;           /* NaN-fill free pages and state slots */
    /* appended fields */
    llmem_precision precision; /* default PRECISE */
    llmem_dtype ssm_dtype;     /* Mamba-2 SSM state dtype: f32 (default), f16, bf16
                                  or I8 (per-head scale; the conv state keeps f32) */
    bool check_tensors;        /* at load, refuse weights holding NaN or infinity
                                  (llmem_model_check_weights_finite; reads every
                                  weight once); default false */
    int32_t n_snapshots;       /* hybrids: recurrent-state snapshots kept for prefix
                                  reuse (llmem_recurrent_params.n_snapshots, one state
                                  slot each). -1 (default): max(n_seq_max, 16) when
                                  the prefix cache is on, unless LLMEM_SNAPSHOTS is
                                  set in the environment; 0: off */
    int32_t snap_interval;     /* tokens between snapshot points; 0 (default):
                                  page_size, at least 16 */
    int32_t tp;                /* tensor-parallel ranks (issue 19; docs/tp.md): 1
                                  (default; 0 too) runs on `be` alone; N in 2..64
                                  splits heads and widths over N ranks (Megatron-LM),
                                  rank 0 on `be`, rank r on a backend of the same
                                  kind that the model opens (cuda: device
                                  be's + r; cpu: another instance), joined by a
                                  communicator (<llmem/comm.h>; NCCL on cuda,
                                  in-process threads otherwise; LLMEM_TP_COMM=cpu
                                  forces the latter); prefix_cache_bytes is then
                                  shared out, 1/N per rank */
    int64_t prefix_cache_bytes; /* device bytes cached prefix data may hold: KV
                                  pages no sequence holds and, in hybrids, the
                                  recurrent snapshots, under one LRU
                                  (llmem_kv_cache_params.prefix_cache_bytes);
                                  with n_snapshots -1 (and no LLMEM_SNAPSHOTS) a
                                  hybrid's snapshot slots are sized from it (one
                                  per state slot's bytes, at most 4096).
                                  0 (default): none */
} llmem_model_params;

/* Defaults as listed above. */
llmem_model_params llmem_model_default_params(void);

/* Loads config.json and the safetensors of directory `dir`, validates every
 * tensor, uploads the weights to `be` (kept in their stored dtype) and
 * creates the model's memory. The model keeps `be` (caller closes it after
 * llmem_model_free).
 * Returns LLMEM_OK; LLMEM_E_NOT_FOUND (missing files or tensors);
 * LLMEM_E_CORRUPT (malformed files); LLMEM_E_UNSUPPORTED (architecture or
 * dtype); LLMEM_E_INVALID (parameters); LLMEM_E_NO_MEMORY; LLMEM_E_BACKEND.
 * err gets one line naming the problem. */
llmem_status llmem_model_load(const char *dir, llmem_backend *be, const llmem_model_params *p,
                              llmem_model **out, char *err, size_t err_len);
void llmem_model_free(llmem_model *m); /* accepts NULL */

const struct llmem_model_config *llmem_model_get_config(const llmem_model *m);
/* The model's memory (owned by the model): use it for sequence operations. */
llmem_memory *llmem_model_memory(llmem_model *m);
int32_t llmem_model_n_vocab(const llmem_model *m);

/* Runs a batch: plans it on the model's memory, runs the forward pass of
 * every ubatch and commits it. For the batch's output tokens, in batch
 * order, writes one row of n_vocab floats to out (caller-owned, at least
 * n_outputs * n_vocab floats): log-probabilities when log_softmax, else
 * logits. *n_outputs gets the number of rows.
 * Returns LLMEM_OK; the plan's errors (LLMEM_E_INVALID with the reason in
 * err, LLMEM_E_NO_SPACE — the memory is unchanged); LLMEM_E_INVALID for a
 * token id outside [0, n_vocab); an op's error (the plan is released and
 * sequences stay as after the last committed ubatch). */
llmem_status llmem_model_decode(llmem_model *m, const llmem_batch *batch, bool log_softmax,
                                float *out, int32_t out_cap_rows, int32_t *n_outputs, char *err,
                                size_t err_len);

/* What llmem_model_decode_sample does with each output row. Host arrays
 * are indexed by output row (batch order), out_cap_rows entries each
 * (times n_top for the top lists). */
typedef struct llmem_model_sampling {
    llmem_sample_params params;   /* <llmem/ops.h>; temperature <= 0: greedy */
    const int32_t *ctr;           /* per-row counters into the random sequence, or NULL
                                     (the row index); e.g. positions, so that a
                                     sequence's draws do not depend on its batch */
    const int32_t *force_ids;     /* NULL: sample; else these tokens are "chosen"
                                     (scoring: their log-probs are computed) */
    int32_t *ids;                 /* out: the chosen token of each row (required) */
    float *logprob;               /* out, or NULL: log_softmax of the logits at ids */
    int32_t n_top;                /* 0, or 1..64: also the n_top best tokens */
    int32_t *top_ids;             /* out [rows * n_top] when n_top > 0 */
    float *top_logprob;           /* out [rows * n_top] when n_top > 0 */
} llmem_model_sampling;

/* Runs a batch as llmem_model_decode does, but keeps the logits on the
 * device: the backend's sample, logprob_gather and top_logprobs ops pick
 * the tokens (and their log-probabilities), and only those are downloaded.
 * A backend that lacks one of these ops gets the logits computed on it,
 * downloaded and handed to the CPU backend's reference ops (same results,
 * slower). *n_outputs gets the number of output rows.
 * Returns what llmem_model_decode returns, plus LLMEM_E_INVALID for a NULL
 * s or s->ids, a force id outside [0, n_vocab), n_top outside [0, 64] or
 * above n_vocab, or sampling parameters llmem_op_sample refuses. */
llmem_status llmem_model_decode_sample(llmem_model *m, const llmem_batch *batch,
                                       const llmem_model_sampling *s, int32_t out_cap_rows,
                                       int32_t *n_outputs, char *err, size_t err_len);

/* Counters since llmem_model_load. */
typedef struct llmem_model_stats {
    int64_t n_ubatch;  /* ubatches run */
    int64_t n_tokens;  /* tokens computed (prefix-cache hits excluded) */
    int64_t n_outputs; /* output rows computed */
    int64_t n_recorded; /* decode steps recorded (CUDA graphs; docs/cuda.md) */
    int64_t n_replayed; /* ubatches run by replaying a recorded decode step */
} llmem_model_stats;
/* Copies m's counters into *stats (a snapshot; no reset). Does nothing
 * when m or stats is NULL. Never fails. */
void llmem_model_get_stats(const llmem_model *m, llmem_model_stats *stats);

/* Directory of the built-in model: $LLMEM_MODEL_DIR when set, else the
 * installed copy (<datadir>/llmem/builtin), else the source tree's
 * models/builtin. Returns NULL when none of them has a config.json. */
const char *llmem_builtin_model_dir(void);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

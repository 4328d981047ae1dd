/* llmem models/: the model object shared by the loader (runtime.c) and the
 * forward pass (forward.c). Internal; not installed. */
#ifndef LLMEM_MODELS_MODEL_INTERNAL_H
#define LLMEM_MODELS_MODEL_INTERNAL_H

#include "base/base_internal.h"
#include "llmem/model.h"
#include "llmem/runtime.h"
#include "models/hf_internal.h"

#define ALIGN 256

typedef struct wt {
    bool present;
    llmem_tensor t;
} wt;

typedef struct layer_w {
    wt w[LLMEM_W_COUNT];
    int32_t mem_layer; /* layer index in the memory, -1 for MLP-only layers */
    int32_t mem_layer2; /* falcon_h1 parallel layers: the Mamba-2 one (else -1) */
    /* attention: the window its KV cache keeps (0: full; passed to the
     * attention op), its RoPE base and linear scale (gemma3 per layer type) */
    int32_t window;
    float rope_theta, rope_scale;
} layer_w;

struct llmem_model {
    llmem_model_config cfg;
    llmem_model_params p;
    llmem_backend *be;
    llmem_buffer **weights; /* one buffer per weight tensor */
    int32_t n_weights;
    wt embed, final_norm, lm_head;
    layer_w *layers;
    llmem_memory *mem;
    llmem_buffer *scratch;
    /* scratch tensors, [n_ubatch, ...] f32 */
    size_t off_x, off_h, off_a, off_b, off_c, off_d, off_e, off_tok, off_pos, off_rows, off_logits;
    /* sampling outputs: ids, counters, log-probs [n_ubatch]; top lists [n_ubatch, 64] */
    size_t off_ids, off_ctr, off_lp, off_top_ids, off_top_lp;
    /* CPU backend and buffer for the sampling ops of a backend that lacks them */
    llmem_backend *fb_be;
    llmem_buffer *fb_buf;
    size_t fb_size;
    int32_t width_a, width_b, width_c, width_d, width_e;
    llmem_model_stats stats;
    hf_moe *moe; /* MoE / shared-expert FFN scratch (models/moe.c), or NULL */
    hf_falcon *fal; /* falcon_h1 scratch (models/falcon_h1.c), or NULL */
    hf_qwen3n *q3n; /* qwen3_next weights and scratch (models/qwen3_next.c), or NULL */
    struct hf_graphs *graphs; /* recorded decode steps (models/decode_graph.c), or NULL */
    /* tensor parallelism (models/tp.c). The leader (params.tp > 1) keeps the
     * full config, the ranks' composed memory (llmem_hybrid_create_ranks)
     * and rank 0's scratch (borrowed); tp holds the rank models and their
     * threads. A rank model holds its shard: cfg with its share of the heads
     * and widths, tp_full the leader's config, its communicator. */
    struct hf_tp *tp;
    int32_t tp_rank, tp_size; /* 0, 1 outside tensor parallelism */
    int32_t tp_vocab;         /* LM head rows of this rank (the vocabulary shard) */
    bool tp_norm_full;        /* the gated norm's groups span ranks: gather y and z */
    bool mem_borrowed;        /* mem belongs to the leader */
    const llmem_model_config *tp_full;
    struct llmem_comm *comm;
    size_t off_tpl, off_tpg;  /* vocab-shard logits [T, tp_vocab]; gathered y, z [T, d_inner] */
    /* fused decode path (llmem_op_norm_matmul, models/forward.c): whether the
     * model and backend allow it (1 no, 2 yes: hf_fused_setup), and whether
     * the ubatch being run takes it; the attention layers' q/k/v there
     * (LLMEM_NM_QKV): 0 (Vulkan's default) a norm launch and plain matmuls,
     * 1 the norm in each of the three matmuls, 2 (default) one fused matmul
     * of the packed q | k | v, 3 a norm launch and one plain matmul of the
     * packed q | k | v */
    int8_t nm_path;
    bool nm_on;
    int8_t nm_qkv;
    /* LLMEM_NO_GRAPHS=1 when the model was built (hf_fused_setup): every
     * decode step runs eagerly, none is recorded (models/decode_graph.c) */
    bool no_graphs;
};

static inline size_t round_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* The forward pass's ops for ubatch shape (n_tokens, n_outputs), token ids,
 * positions and output rows already in the scratch (models/forward.c). */
/* ops_check.c: asks the backend (llmem_backend_supports) for every op the
 * forward pass of m will call, for its layer kinds, weight dtypes and the
 * KV / SSM state dtypes of m->p. Returns LLMEM_OK, or LLMEM_E_UNSUPPORTED
 * with err naming the first missing op, its operand dtypes, the layer that
 * needs it and the backend. Called by llmem_model_load once the weights
 * are on the device. */
llmem_status hf_check_ops(llmem_model *m, char *err, size_t err_len);
/* forward.c: decides once, when m is built (hf_model_build, weights on the
 * device), whether its one-token steps take the fused decode path and how
 * its q/k/v run there (m->nm_path, m->nm_qkv), and whether its decode steps
 * may be recorded (m->no_graphs), reading LLMEM_NO_NORM_MATMUL,
 * LLMEM_NORM_MATMUL_CPU, LLMEM_NM_QKV and LLMEM_NO_GRAPHS then rather than
 * at a step (getenv scans the environment, and is not safe against a
 * setenv in another thread). Cannot fail. */
void hf_fused_setup(llmem_model *m);
llmem_status hf_forward_ops(llmem_model *m, int32_t n_tokens, int32_t n_outputs, int32_t n_vocab);

/* Runs hf_forward_ops for ub through a recorded decode step when it can
 * (one token per sequence group, LLMEM_NO_GRAPHS unset), else eagerly
 * (models/decode_graph.c). Returns hf_forward_ops' status. */
llmem_status hf_graph_forward(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab);
/* Whether a decode step with view v (one memory layer's) may be recorded
 * or replayed: false for a KV view with a pending K-shift (shift_slot.n >
 * 0) and for a recurrent view carrying snapshot tables (llmem_rs_view_snap,
 * even with every snap_slot entry -1), whose contents no recording key
 * holds; such a step runs eagerly. v is borrowed; NULL or any other kind:
 * true. Pure, thread-safe. */
bool hf_graph_view_recordable(const llmem_view *v);

/* qwen3_next (models/qwen3_next.c). hf_qwen3n_load uploads every weight
 * (norms as 1 + w, in_proj rows de-interleaved, experts' gate and up
 * concatenated) and sets m->q3n, m->embed, m->final_norm, m->lm_head;
 * on failure m->q3n may hold what was loaded (llmem_model_free frees it).
 * hf_qwen3n_layer runs layer il of a T-token ubatch on m->off_x / m->off_h
 * as hf_forward_ops does (pend: h holds the previous block's output, not
 * yet added to x), leaving the MoE output in h, pending. */
llmem_status hf_qwen3n_load(llmem_model *m, const llmem_safetensors *st, char *err,
                            size_t err_len);
llmem_status hf_qwen3n_layer(llmem_model *m, int32_t il, int32_t T, const llmem_view *v,
                             bool pend);
/* gemma3: RMSNorm (q_norm / k_norm weights, (1 + w) already) of every
 * head's row of q [T, n_heads, head_dim] at off_q and k [T, n_kv_heads,
 * head_dim] at off_k of the scratch, in place (models/gemma3.c). */
llmem_status hf_gemma3_qk_norm(llmem_model *m, const layer_w *L, int32_t T, size_t off_q,
                               size_t off_k);

/* Builds m on m->be from the open checkpoint st (m->cfg and m->p set):
 * layer table, weights (a rank's shard when m->tp_size > 1), op check,
 * memory, scratch. *step names the stage that failed. Statuses of
 * llmem_model_load (models/runtime.c). */
llmem_status hf_model_build(llmem_model *m, const llmem_safetensors *st, const char **step,
                            char *err, size_t err_len);

/* ---- tensor parallelism (models/tp.c) ---- */
/* Builds the ranks of leader m (m->p.tp > 1, m->cfg the full config):
 * checks that the model splits (LLMEM_E_INVALID naming the dimension
 * that --tp does not divide; LLMEM_E_UNSUPPORTED for architectures or
 * layer kinds without a split), opens a backend per further rank, builds
 * each rank model, its communicator, the composed memory and the rank
 * threads. On failure m->tp holds what was built (llmem_model_free frees
 * it). */
llmem_status hf_tp_load(llmem_model *m, const llmem_safetensors *st, char *err, size_t err_len);
/* Frees the rank models, communicators, threads and rank backends. */
void hf_tp_destroy(struct hf_tp *tp);
/* A rank model's slice of weight w: *info is rewritten to describe the
 * slice (shape, bytes, data in *shard, malloc'd, the caller frees it after
 * the upload); *skip when this rank keeps no copy (a row-parallel bias
 * lives on rank 0 only). LLMEM_OK, LLMEM_E_NO_MEMORY, LLMEM_E_UNSUPPORTED
 * (a weight without a split rule). */
llmem_status hf_tp_shard(const llmem_model *m, llmem_weight w, llmem_tensor_info *info,
                         void **shard, bool *skip, char *err, size_t err_len);
/* hf_slice_fn of a rank model (ctx: the llmem_model): hf_tp_shard of one
 * expert's tensor of a split MoE weight. */
llmem_status hf_tp_slice(const void *ctx, llmem_weight w, llmem_tensor_info *ti, void **shard,
                         char *err, size_t err_len);
/* A rank model with a vocabulary-sharded LM head tied to the embedding:
 * copies its rows of the embedding into an LM head of its own. */
llmem_status hf_tp_lm_head(llmem_model *m, char *err, size_t err_len);
/* The leader's forward pass of ubatch ub: each rank, on its thread, gets
 * the ubatch's tokens, positions and output rows and runs hf_forward_ops;
 * the logits end in rank 0's scratch (the leader's). First failing rank's
 * status. */
llmem_status hf_tp_forward(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab);
/* A rank model's collectives inside the forward pass: the all-reduce of
 * the row-parallel output h [T, hidden] at off (no-op without TP), and
 * dst [T, w * size] = every rank's src [T, w] side by side, column block r
 * from rank r (w * 4 bytes per row, f32). */
llmem_status hf_tp_all_reduce(llmem_model *m, size_t off, int32_t T);
llmem_status hf_tp_gather_cols(llmem_model *m, size_t src_off, size_t dst_off, int32_t T,
                               int32_t w);

/* Frees every recording (NULL is a no-op); the backend must still be open. */
void hf_graphs_free(struct hf_graphs *g);

/* out = a · wᵀ in the model's precision mode (models/forward.c). */
llmem_status hf_matmul(llmem_model *m, const llmem_tensor *a, const llmem_tensor *w,
                       const llmem_tensor *out);
/* Mixers of recurrent layer kinds beyond Mamba-2, h [T, hidden] (the
 * normalized input, at off_h) -> h, on the layer's recurrent view v:
 * LFM2's gated short conv (models/lfm2.c, state 0 conv) and Jamba's
 * Mamba-1 (models/jamba.c, state 0 conv, 1 ssm). Statuses of the ops. */
llmem_status hf_lfm2_shortconv(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v);
llmem_status hf_jamba_mamba(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v);

#endif

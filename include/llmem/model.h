/* llmem: Hugging Face checkpoints -- safetensors tensor sets and config.json.
 *
 * A checkpoint directory holds config.json and one or more *.safetensors
 * files (optionally with model.safetensors.index.json). This header loads
 * both, validates them, and tells which tensors an architecture needs:
 *
 *   llmem_safetensors_open()        maps the files read-only and validates
 *                                   every tensor's dtype, shape and bytes;
 *   llmem_model_config_load()       parses config.json into llmem_model_config
 *                                   (llama, mamba2, bamba, nemotron_h);
 *   llmem_model_config_check_tensors()  checks that every tensor the
 *                                   architecture needs is there, well shaped.
 *
 * Every failure is one line in a caller-owned buffer (err, err_len; NULL is
 * allowed), e.g. "model.safetensors: tensor 'x.weight' bytes [108, 5008)
 * past end of file (4200 bytes)".
 *
 * References: the safetensors format (huggingface/safetensors, README
 * "Format"); the configuration_*.py and modeling_*.py files of
 * huggingface/transformers 5 for llama, mamba2, bamba and nemotron_h
 * (tensor names, defaults, the transformers-5 config spellings).
 */
#ifndef LLMEM_MODEL_H
#define LLMEM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* ---- safetensors ------------------------------------------------------- */

#define LLMEM_SAFETENSORS_MAX_DIMS 8

/* A set of tensors from one or more safetensors files, memory-mapped
 * read-only. Opaque; one thread at a time, or many readers once opened. */
typedef struct llmem_safetensors llmem_safetensors;

/* What the set knows of one tensor. Pointers are owned by the set and stay
 * valid until llmem_safetensors_close(). */
typedef struct llmem_tensor_info {
    const char *name;       /* e.g. "model.layers.0.self_attn.q_proj.weight" */
    const char *file;       /* path of the file that holds it */
    const char *st_dtype;   /* dtype as written in the file: "F32", "BF16", "I64", ... */
    llmem_dtype dtype;      /* F32, F16 or BF16; LLMEM_DTYPE_COUNT when the
                               file's dtype is one llmem does not support */
    int32_t n_dims;         /* 0 (a scalar) .. LLMEM_SAFETENSORS_MAX_DIMS */
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS]; /* row-major, outermost first */
    int64_t n_elements;     /* product of shape (1 for a scalar) */
    const void *data;       /* first byte, inside the read-only mapping; NOT
                               necessarily aligned to the element size */
    size_t n_bytes;         /* n_elements * element size */
} llmem_tensor_info;

/* Opens `path`: one .safetensors file, or a directory. For a directory, the
 * files named by model.safetensors.index.json ("weight_map") are loaded
 * when that index exists, otherwise every "*.safetensors" file in it; all
 * of them form one tensor set. Each file is mmap'ed read-only and checked:
 * the 8-byte little-endian header length lies within the file (and is at
 * most 100 MB), the header is a JSON object, every entry but
 * "__metadata__" has "dtype" (string), "shape" (non-negative integers) and
 * "data_offsets" [begin, end] with begin <= end <= data size and
 * end - begin == product(shape) * element size (computed without
 * overflow), tensors do not overlap, and no name appears twice in the set
 * (nor is missing from the file the index names for it). Tensors of a
 * dtype other than F32/F16/BF16 load, but finding them fails (below).
 * On success *out owns the mappings; free it with llmem_safetensors_close.
 * Returns LLMEM_OK; LLMEM_E_NOT_FOUND (no such path, or a directory with no
 * safetensors file, or a file named by the index missing); LLMEM_E_IO
 * (open, stat, read or mmap failed); LLMEM_E_CORRUPT (any check above,
 * with the file, the tensor and the numbers in err); LLMEM_E_NO_MEMORY;
 * LLMEM_E_INVALID (path or out NULL). Nothing is left open on failure. */
llmem_status llmem_safetensors_open(const char *path, llmem_safetensors **out,
                                    char *err, size_t err_len);

/* Unmaps and frees the set. Accepts NULL. */
void llmem_safetensors_close(llmem_safetensors *st);

/* Number of tensors in the set (0 for NULL). */
int32_t llmem_safetensors_count(const llmem_safetensors *st);

/* The i-th tensor in name order, i in [0, count). Unsupported dtypes are
 * reported as they are (dtype LLMEM_DTYPE_COUNT). Returns LLMEM_OK or
 * LLMEM_E_INVALID (i out of range, NULL argument). */
llmem_status llmem_safetensors_get(const llmem_safetensors *st, int32_t i,
                                   llmem_tensor_info *out);

/* Looks a tensor up by exact name (binary search, O(log n)).
 * Returns LLMEM_OK; LLMEM_E_NOT_FOUND ("no tensor 'x' in DIR");
 * LLMEM_E_UNSUPPORTED (the tensor exists but its dtype is not F32, F16 or
 * BF16; err names the tensor and the dtype; *out is still filled);
 * LLMEM_E_INVALID (NULL argument). */
llmem_status llmem_safetensors_find(const llmem_safetensors *st, const char *name,
                                    llmem_tensor_info *out, char *err, size_t err_len);

/* ---- config.json --------------------------------------------------------- */

#define LLMEM_MODEL_MAX_LAYERS 512

typedef enum llmem_arch {
    LLMEM_ARCH_LLAMA = 0,      /* model_type "llama": attention + SwiGLU FFN in every layer */
    LLMEM_ARCH_MAMBA2 = 1,     /* "mamba2": a Mamba-2 mixer in every layer, no FFN */
    LLMEM_ARCH_BAMBA = 2,      /* "bamba": Mamba-2 or attention mixer, SwiGLU FFN after each */
    LLMEM_ARCH_NEMOTRON_H = 3, /* "nemotron_h": each layer one of Mamba-2, attention, MLP, MoE */
    LLMEM_ARCH_GRANITEMOEHYBRID = 4, /* "granitemoehybrid" (Granite-4.0-H): Mamba-2 or
                                        attention mixer, then a shared MLP (+ routed MoE) */
    LLMEM_ARCH_FALCON_H1 = 5,  /* "falcon_h1": attention and Mamba-2 in parallel, then MLP */
    LLMEM_ARCH_QWEN3_NEXT = 6, /* "qwen3_next": gated delta net or gated attention mixer,
                                  then a sparse MoE block with a shared expert */
    LLMEM_ARCH_GEMMA3_TEXT = 7, /* "gemma3_text" (Gemma3ForCausalLM): sliding-window and
                                   global attention layers, Gemma norms, GeGLU MLP */
    LLMEM_ARCH_LFM2 = 8,       /* "lfm2": gated short conv or attention (q/k norms), SwiGLU
                                  FFN after each (models/lfm2.c) */
    LLMEM_ARCH_JAMBA = 9,      /* "jamba": Mamba-1 or attention (no RoPE), then a SwiGLU MLP
                                  or a routed MoE (models/jamba.c) */
    LLMEM_ARCH_COUNT
} llmem_arch;

typedef enum llmem_layer_kind {
    LLMEM_LAYER_ATTENTION = 0, /* causal self-attention (GQA) mixer */
    LLMEM_LAYER_MAMBA2 = 1,    /* Mamba-2 SSD mixer (conv + selective state space) */
    LLMEM_LAYER_MLP = 2,       /* nemotron_h's MLP-only layer: the mixer is the MLP */
    LLMEM_LAYER_MOE = 3,       /* nemotron_h's MoE layer: routed + shared experts */
    LLMEM_LAYER_PARALLEL = 4,  /* falcon_h1: attention and Mamba-2 side by side (two
                                  memory layers: a KV one and a recurrent one) */
    LLMEM_LAYER_GDN = 5,       /* qwen3_next: gated delta net (conv state + delta-rule
                                  state; sizes in the ssm_* fields, models/qwen3_next.c) */
    LLMEM_LAYER_SHORTCONV = 6, /* LFM2's gated short convolution (conv state only) */
    LLMEM_LAYER_MAMBA1 = 7,    /* Mamba-1 selective SSM mixer (conv + ssm state; jamba) */
    LLMEM_LAYER_KIND_COUNT
} llmem_layer_kind;

typedef enum llmem_activation {
    LLMEM_ACT_SILU = 0,  /* x * sigmoid(x) */
    LLMEM_ACT_RELU2 = 1, /* relu(x)^2 (nemotron_h MLP) */
    LLMEM_ACT_GELU_TANH = 2, /* GELU, tanh approximation ("gelu_pytorch_tanh", Gemma) */
} llmem_activation;

typedef struct llmem_layer_config {
    llmem_layer_kind kind;
    bool has_ffn; /* a separate feed-forward sub-block follows the mixer
                     (llama, bamba); false for mamba2 and nemotron_h, whose
                     MLP layers are their own kind */
    /* Attention layers (gemma3_text's per-layer types; 0 elsewhere): */
    int32_t sliding_window;  /* > 0: queries see their last sliding_window keys,
                                their own included (layer type "sliding_attention") */
    double rope_theta;       /* > 0: this layer's RoPE base (else the config's) */
    double rope_freq_scale;  /* > 0: this layer's linear RoPE scaling 1/factor (else 1) */
    bool ffn_moe; /* that sub-block is a routed MoE (jamba's expert layers) */
} llmem_layer_config;

/* The architecture, as read from config.json. Sizes are element counts.
 * Fields that do not apply to the architecture are 0 / false. */
typedef struct llmem_model_config {
    llmem_arch arch;
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_layers;
    double norm_eps;           /* RMSNorm epsilon (rms_norm_eps / layer_norm_epsilon) */
    bool tie_word_embeddings;  /* the LM head is the embedding matrix */
    char tensor_prefix[16];    /* "model." or "backbone." (see check_tensors) */

    /* Feed-forward (llama and bamba FFN sub-blocks, nemotron_h MLP layers). */
    int32_t intermediate_size;
    bool ffn_gated;            /* down(act(gate(x)) * up(x)); else down(act(up(x))) */
    llmem_activation ffn_act;
    bool mlp_bias;

    /* Attention layers. */
    int32_t n_heads;
    int32_t n_kv_heads;        /* n_heads % n_kv_heads == 0 */
    int32_t head_dim;
    bool attention_bias;       /* q, k, v and o projections have a bias */
    bool use_rope;             /* false for nemotron_h (no positional encoding) */
    double rope_theta;         /* RoPE base */
    double partial_rotary_factor; /* share of head_dim that is rotated */
    int32_t rope_dim;          /* head_dim * partial_rotary_factor, even; the
                                  first rope_dim elements of each head are
                                  rotated, pairing i with i + rope_dim/2 */
    int32_t max_position_embeddings; /* informational; 0 if absent */

    /* Mamba-2 layers. */
    int32_t ssm_n_heads;
    int32_t ssm_head_dim;
    int32_t ssm_d_inner;       /* ssm_n_heads * ssm_head_dim */
    int32_t ssm_d_state;
    int32_t ssm_n_groups;      /* B and C groups; ssm_n_heads % ssm_n_groups == 0 */
    int32_t ssm_d_conv;        /* causal depthwise conv kernel width */
    int32_t ssm_conv_dim;      /* ssm_d_inner + 2 * ssm_n_groups * ssm_d_state */
    int32_t ssm_in_proj_dim;   /* ssm_d_inner + ssm_conv_dim + ssm_n_heads: rows of
                                  in_proj, split as [z | x B C | dt] */
    int32_t ssm_chunk_size;
    int32_t ssm_norm_group_size; /* gated RMSNorm group (elements): ssm_d_inner
                                    for mamba2 and bamba (one group, as
                                    transformers' torch path), ssm_d_inner /
                                    ssm_n_groups for nemotron_h */
    bool ssm_conv_bias;
    bool ssm_proj_bias;        /* in_proj and out_proj have a bias */
    double time_step_min, time_step_max, time_step_floor; /* dt init (informational) */
    double time_step_limit[2]; /* dt is clamped to [lo, hi]; hi may be +inf */

    int32_t n_attention_layers;
    int32_t n_mamba_layers;
    int32_t n_mlp_layers;
    llmem_layer_config layers[LLMEM_MODEL_MAX_LAYERS];

    /* Mixture of experts: nemotron_h 'moe' layers, granitemoehybrid FFNs
     * (routed experts beside the shared MLP). n_expert 0: no routed experts. */
    int32_t n_expert;              /* routed experts E */
    int32_t n_expert_used;         /* k, experts per token */
    int32_t moe_intermediate_size; /* I of each routed expert */
    int32_t moe_shared_intermediate_size; /* shared expert / shared MLP width (0: none) */
    bool moe_gated;                /* experts are down(act(gate x) * up x) (granite), else
                                      down(act(up x)) (nemotron_h, relu2) */
    bool moe_sigmoid;              /* sigmoid scores (nemotron_h), else softmax */
    bool moe_norm_topk;            /* renormalize the k weights */
    int32_t moe_n_group, moe_topk_group; /* group-limited routing (n_group > 1) */
    double moe_routed_scale;       /* routed_scaling_factor */
    bool moe_router_bias;          /* e_score_correction_bias (selection only) */
    bool moe_split_experts;        /* checkpoint holds one tensor per expert */

    /* Multipliers (granitemoehybrid; 1 elsewhere). */
    double embedding_multiplier;   /* x = embed(tokens) * m */
    double residual_multiplier;    /* x += block(x) * m */
    double attention_scale;        /* softmax scale: attention_multiplier, else 1/sqrt(head_dim) */
    double logits_scaling;         /* logits = lm_head(x) / s */

    /* falcon_h1's muP multipliers (1 elsewhere). */
    double attention_in_multiplier, attention_out_multiplier, key_multiplier;
    double ssm_in_multiplier, ssm_out_multiplier;
    double ssm_multipliers[5];     /* in_proj output segments z, x, B, C, dt */
    double mlp_gate_multiplier, mlp_down_multiplier;
    bool ssm_gate_only;            /* y * silu(z) without the gated RMS norm
                                      (falcon_h1 mamba_rms_norm false) */

    /* gemma3_text (false / 0 elsewhere). */
    bool gemma_norms;              /* RMSNorm scales by (1 + w); attention and FFN outputs
                                      pass post norms; q and k have per-head RMSNorms */
    double attn_softcap;           /* attn_logit_softcapping (0: off) */
    double final_softcap;          /* final_logit_softcapping (0: off) */

    /* Short-conv (lfm2) and Mamba-1 (jamba) layers reuse the Mamba-2 sizes:
     * ssm_d_conv is lfm2's conv_L_cache / jamba's mamba_d_conv,
     * ssm_conv_bias their conv bias, ssm_d_inner the conv channels (lfm2:
     * hidden_size; jamba: mamba_expand * hidden_size), ssm_in_proj_dim the
     * in_proj rows (lfm2: 3 * hidden [B | C | x]; jamba: 2 * d_inner
     * [x | z]), ssm_conv_dim = ssm_d_inner, ssm_d_state jamba's
     * mamba_d_state; and: */
    int32_t ssm_dt_rank;           /* jamba's mamba_dt_rank (x_proj -> dt, B, C) */
} llmem_model_config;

/* Parses a config.json text of `len` bytes (need not be NUL-terminated)
 * into *out. Reads both the classic keys and the transformers-5 spellings:
 * rope_parameters {rope_theta, rope_type, partial_rotary_factor} or
 * rope_theta; time_step_limit as numbers or [0.0, {"__float__":
 * "Infinity"}]; the layer list from attn_layer_indices (bamba),
 * layers_block_type ("mamba"/"linear_attention", "attention"/
 * "full_attention", "mlp", "moe") or hybrid_override_pattern ('M', '*',
 * '-', 'E') for nemotron_h; the legacy mamba_* names for nemotron_h.
 * Returns LLMEM_OK; LLMEM_E_CORRUPT (not JSON, a required key missing, a
 * value of the wrong type or out of range, inconsistent sizes; err names
 * the key); LLMEM_E_UNSUPPORTED (a model_type other than llama, mamba2,
 * bamba, nemotron_h; MoE layers; a rope_type other than "default"; an
 * activation other than silu / relu2; a layer type the family does not
 * define in layer_types / layers_block_type; more than
 * LLMEM_MODEL_MAX_LAYERS layers); LLMEM_E_NO_MEMORY; LLMEM_E_INVALID (NULL
 * argument). */
llmem_status llmem_model_config_parse(const char *json, size_t len, llmem_model_config *out,
                                      char *err, size_t err_len);

/* Reads and parses `path`: a config.json file, or a directory holding one.
 * Returns what llmem_model_config_parse returns (messages prefixed with the
 * path), plus LLMEM_E_NOT_FOUND (no such file: err names the path tried),
 * LLMEM_E_IO (a folder where the file should be, no permission, a read
 * error), LLMEM_E_CORRUPT (larger than 16 MiB) and LLMEM_E_NO_MEMORY
 * (also when cJSON ran out of memory parsing it). */
llmem_status llmem_model_config_load(const char *path, llmem_model_config *out,
                                     char *err, size_t err_len);

/* "llama", "mamba2", "bamba", "nemotron_h"; "?" otherwise. */
const char *llmem_arch_name(llmem_arch a);
/* "attention", "mamba2", "mlp"; "?" otherwise. */
const char *llmem_layer_kind_name(llmem_layer_kind k);

/* The weights an architecture uses. Per-layer weights exist only in layers
 * of the matching kind (attention weights in attention layers, ...). */
typedef enum llmem_weight {
    LLMEM_W_EMBED = 0,      /* [vocab, hidden] */
    LLMEM_W_FINAL_NORM,     /* [hidden] */
    LLMEM_W_LM_HEAD,        /* [vocab, hidden]; absent when tied */
    LLMEM_W_MIXER_NORM,     /* [hidden] RMSNorm before the mixer */
    LLMEM_W_FFN_NORM,       /* [hidden] RMSNorm before the FFN sub-block */
    LLMEM_W_ATTN_Q,         /* [n_heads * head_dim, hidden] */
    LLMEM_W_ATTN_K,         /* [n_kv_heads * head_dim, hidden] */
    LLMEM_W_ATTN_V,         /* [n_kv_heads * head_dim, hidden] */
    LLMEM_W_ATTN_O,         /* [hidden, n_heads * head_dim] */
    LLMEM_W_ATTN_Q_BIAS,    /* [n_heads * head_dim] (attention_bias) */
    LLMEM_W_ATTN_K_BIAS,    /* [n_kv_heads * head_dim] */
    LLMEM_W_ATTN_V_BIAS,    /* [n_kv_heads * head_dim] */
    LLMEM_W_ATTN_O_BIAS,    /* [hidden] */
    LLMEM_W_FFN_GATE,       /* [intermediate, hidden] (gated FFN only) */
    LLMEM_W_FFN_UP,         /* [intermediate, hidden] */
    LLMEM_W_FFN_DOWN,       /* [hidden, intermediate] */
    LLMEM_W_FFN_GATE_BIAS,  /* [intermediate] (mlp_bias) */
    LLMEM_W_FFN_UP_BIAS,    /* [intermediate] */
    LLMEM_W_FFN_DOWN_BIAS,  /* [hidden] */
    LLMEM_W_SSM_IN,         /* [ssm_in_proj_dim, hidden] */
    LLMEM_W_SSM_IN_BIAS,    /* [ssm_in_proj_dim] (ssm_proj_bias) */
    LLMEM_W_SSM_CONV,       /* [ssm_conv_dim, 1, ssm_d_conv] */
    LLMEM_W_SSM_CONV_BIAS,  /* [ssm_conv_dim] (ssm_conv_bias) */
    LLMEM_W_SSM_DT_BIAS,    /* [ssm_n_heads] */
    LLMEM_W_SSM_A_LOG,      /* [ssm_n_heads]; A = -exp(A_log) */
    LLMEM_W_SSM_D,          /* [ssm_n_heads] */
    LLMEM_W_SSM_NORM,       /* [ssm_d_inner] gated RMSNorm weight */
    LLMEM_W_SSM_OUT,        /* [hidden, ssm_d_inner] */
    LLMEM_W_SSM_OUT_BIAS,   /* [hidden] (ssm_proj_bias) */
    LLMEM_W_MOE_ROUTER,     /* [n_expert, hidden] router (gate) */
    LLMEM_W_MOE_ROUTER_BIAS, /* [n_expert] e_score_correction_bias (moe_router_bias) */
    LLMEM_W_MOE_UP,         /* [n_expert, I or 2I (gated: gate then up), hidden]; with
                               moe_split_experts the checkpoint holds n_expert tensors
                               "<name without .weight>.E.up_proj.weight" (see docs) */
    LLMEM_W_MOE_DOWN,       /* [n_expert, hidden, I] */
    LLMEM_W_SHARED_UP,      /* [Is or 2Is (granite: gate then up), hidden] shared expert */
    LLMEM_W_SHARED_DOWN,    /* [hidden, Is] */
    LLMEM_W_ATTN_Q_NORM,    /* [head_dim] gemma3 q_norm (per head, before RoPE) */
    LLMEM_W_ATTN_K_NORM,    /* [head_dim] gemma3 k_norm */
    LLMEM_W_POST_ATTN_NORM, /* [hidden] gemma3 post_attention_layernorm (on the attention output) */
    LLMEM_W_POST_FFN_NORM,  /* [hidden] gemma3 post_feedforward_layernorm */
    /* appended for lfm2 and jamba (issue 16); lfm2 also uses ATTN_Q_NORM and
     * ATTN_K_NORM (q_layernorm, k_layernorm), its short conv SSM_IN [3 *
     * hidden, hidden], SSM_CONV [hidden, 1, L], SSM_OUT; jamba's Mamba-1 uses
     * SSM_IN, SSM_CONV(_BIAS), SSM_A_LOG [d_inner, d_state], SSM_D,
     * SSM_DT_BIAS (dt_proj.bias) [d_inner], SSM_OUT */
    LLMEM_W_SSM_X_PROJ,     /* [dt_rank + 2 * d_state, d_inner] Mamba-1 x_proj */
    LLMEM_W_SSM_DT_PROJ,    /* [d_inner, dt_rank] Mamba-1 dt_proj */
    LLMEM_W_SSM_DT_NORM,    /* [dt_rank] jamba dt_layernorm */
    LLMEM_W_SSM_B_NORM,     /* [d_state] jamba b_layernorm */
    LLMEM_W_SSM_C_NORM,     /* [d_state] jamba c_layernorm */
    LLMEM_W_COUNT
} llmem_weight;

/* Whether the architecture has weight `w` in `layer` (ignored for the
 * global weights EMBED, FINAL_NORM, LM_HEAD), given the layer's kind and the
 * bias and tie flags. If so, writes its Hugging Face tensor name to
 * buf[buf_len] (e.g. "model.layers.3.mamba.in_proj.weight") and its shape to
 * shape[0..*n_dims) (at most 3 entries are written). Returns true if the
 * weight exists; false (buf empty) if it does not, the name does not fit,
 * or an argument is out of range. Pure function of cfg; thread-safe. */
bool llmem_model_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer,
                        char *buf, size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS],
                        int32_t *n_dims);

/* Checks that every weight the architecture uses (llmem_model_weight over
 * all layers) is in `st` with exactly the expected shape and a supported
 * dtype. A nemotron_h checkpoint may use the "backbone." or the "model."
 * prefix; this picks the one whose embedding exists and stores it in
 * cfg->tensor_prefix, which is why cfg is not const. A tensor of the
 * checkpoint that the configuration does not use is an error (a config.json
 * with fewer layers than the checkpoint must not load), except rotary
 * "*.rotary_emb.inv_freq" buffers and an "lm_head.weight" saved beside tied
 * embeddings.
 * Returns LLMEM_OK; LLMEM_E_NOT_FOUND (err: "missing tensor
 * 'model.layers.2.mamba.D' (layer 2, mamba2)"); LLMEM_E_CORRUPT (err:
 * "tensor 'x' has shape [64, 32], expected [64, 64]", or "2 checkpoint
 * tensors are not used by config.json (llama, 1 layers):
 * 'model.layers.1.input_layernorm.weight', ..."); LLMEM_E_UNSUPPORTED (a
 * needed tensor's dtype); LLMEM_E_NO_MEMORY; LLMEM_E_INVALID (NULL
 * argument). */
llmem_status llmem_model_config_check_tensors(llmem_model_config *cfg,
                                              const llmem_safetensors *st,
                                              char *err, size_t err_len);

/* Checks that every weight the configuration uses (as check_tensors lists
 * them, which must have passed) holds only finite values: no NaN, no
 * infinity, in its stored dtype (f32, f16, bf16). Reads every byte of those
 * tensors once (O(model size); the `--check-tensors` option of `llmem`,
 * llmem_model_params.check_tensors). Thread-safe for distinct err buffers.
 * Returns LLMEM_OK; LLMEM_E_CORRUPT (err: "<file>: tensor 'x' has a
 * non-finite value (NaN or infinity) at element 17 of 4096");
 * LLMEM_E_NOT_FOUND / LLMEM_E_UNSUPPORTED (a weight is missing or of an
 * unsupported dtype: run check_tensors first); LLMEM_E_NO_MEMORY;
 * LLMEM_E_INVALID (NULL argument). */
llmem_status llmem_model_check_weights_finite(const llmem_model_config *cfg,
                                              const llmem_safetensors *st, char *err,
                                              size_t err_len);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

/* llmem models/: helpers shared by the checkpoint loader files. */
#ifndef LLMEM_MODELS_HF_INTERNAL_H
#define LLMEM_MODELS_HF_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "llmem/status.h" /* llmem_errf, the one error formatter */

/* Returns expr's status from the enclosing function unless it is LLMEM_OK. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        llmem_status s_ = (expr);                                                                  \
        if (s_ != LLMEM_OK)                                                                        \
            return s_;                                                                             \
    } while (0)

/* Reads the whole file at path into *out (malloc'd, NUL-terminated, the
 * caller frees it) and its length in bytes, without the NUL, into *len
 * (may be NULL). max: the most bytes a sound file of its kind holds (0:
 * no limit); what names that kind in the message ("config.json"; may be
 * NULL). Returns LLMEM_OK; or, with *out NULL and err naming path:
 * LLMEM_E_NOT_FOUND (no such file, or a part of the path is not a
 * folder), LLMEM_E_IO (a folder, no permission, a read error),
 * LLMEM_E_CORRUPT (more than max bytes), LLMEM_E_NO_MEMORY. Reads with
 * read(2) to the end of the file, so a pipe or a file that grows or shrinks
 * meanwhile reads as what it held; O(file size) memory and time. */
llmem_status hf_read_file(const char *path, size_t max, const char *what, char **out,
                          size_t *len, char *err, size_t err_len);

/* The JSON text checks: hf_json_parse, hf_json_read, hf_json_nul_at, ... */
#include "models/hf_json.h"

/* ---- mixture of experts (models/moe.c) ------------------------------------------- */

#include "llmem/model.h"
#include "llmem/ops.h"

/* llmem_model_weight for the LLMEM_W_MOE_* and LLMEM_W_SHARED_* weights. */
bool hf_moe_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                   size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims);
/* Whether weight w is stored as one tensor per expert (nemotron_h). */
bool hf_moe_is_split(const llmem_model_config *cfg, llmem_weight w);
/* Tensors a split weight is stored as: n_expert, or 2 * n_expert for a
 * gated up (jamba: each expert's gate_proj then up_proj). */
int32_t hf_moe_split_count(const llmem_model_config *cfg, llmem_weight w);
/* The checkpoint name of tensor e in [0, hf_moe_split_count) of a split weight. */
bool hf_moe_split_name(const llmem_model_config *cfg, llmem_weight w, int32_t layer, int32_t e,
                       char *buf, size_t len);
/* check_tensors for a split weight: every expert's tensor present, 2-D,
 * of one dtype and the expected shape. Statuses as check_tensors. */
llmem_status hf_moe_check_split(const llmem_model_config *cfg, const llmem_safetensors *st,
                                llmem_weight w, int32_t layer, char *err, size_t err_len);
/* Rewrites ti to describe a slice of the tensor (data in *shard, malloc'd;
 * the caller frees it after the upload): a tensor-parallel rank's part
 * (models/tp.c). LLMEM_OK or an error with a reason in err. */
typedef llmem_status (*hf_slice_fn)(const void *ctx, llmem_weight w, llmem_tensor_info *ti,
                                    void **shard, char *err, size_t err_len);
/* Uploads a split weight's experts back to back at buf + off (buf NULL:
 * only sizes); *bytes gets the total, *t the [E, rows, cols] tensor. With
 * slice (NULL: none) each expert's tensor is sliced first (rows and cols
 * then come from cfg, the sliced config). */
llmem_status hf_moe_load_split(const llmem_model_config *cfg, const llmem_safetensors *st,
                               llmem_weight w, int32_t layer, llmem_buffer *buf, size_t off,
                               size_t *bytes, llmem_tensor *t, hf_slice_fn slice,
                               const void *slice_ctx, char *err, size_t err_len);

/* Scratch and forward pass of an MoE / shared-expert FFN. */
typedef struct hf_moe hf_moe;
/* NULL *out (and LLMEM_OK) when the model has no MoE or shared-MLP FFN. */
llmem_status hf_moe_create(llmem_backend *be, const llmem_model_config *cfg, int32_t n_ubatch,
                           hf_moe **out);
void hf_moe_destroy(hf_moe *mo);
/* h [T, hidden] f32 (the normalized input) is replaced by
 * shared(h) + sum_k w_k expert_k(h). w[i] is weight LLMEM_W_MOE_ROUTER + i
 * of the layer, NULL when absent. */
llmem_status hf_moe_ffn(hf_moe *mo, llmem_backend *be, const llmem_model_config *cfg,
                        const llmem_tensor *const w[6], const llmem_tensor *h, int32_t T);

/* ---- gemma3_text (models/gemma3.c) ------------------------------------------------ */

/* llmem_model_weight for LLMEM_W_ATTN_Q_NORM .. LLMEM_W_POST_FFN_NORM. */
bool hf_gemma3_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                      size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims);
/* Whether w is a Gemma norm weight, stored at load as f32 (1 + w). */
bool hf_gemma3_is_norm(const llmem_model_config *cfg, llmem_weight w);
/* Allocates *buf on be holding (1 + w) of the checkpoint tensor as f32
 * ([n] in *t). Returns LLMEM_OK, LLMEM_E_NO_MEMORY or a backend status
 * (nothing allocated then). */
llmem_status hf_gemma3_load_norm(llmem_backend *be, const llmem_tensor_info *info,
                                 llmem_buffer **buf, llmem_tensor *t);
/* The embedding scale as transformers applies it: rounded to the
 * embedding dtype (bf16: sqrt(3072) = 55.4256 becomes 55.5). */
double hf_gemma3_embed_scale(double scale, llmem_dtype embed_dtype);

/* ---- falcon_h1 (models/falcon_h1.c) ---------------------------------------------- */

/* Scratch of falcon_h1's parallel layers and its muP vector. */
typedef struct hf_falcon hf_falcon;
/* NULL *out (and LLMEM_OK) for other architectures. */
llmem_status hf_falcon_create(llmem_backend *be, const llmem_model_config *cfg, int32_t n_ubatch,
                              hf_falcon **out);
void hf_falcon_destroy(hf_falcon *f);
/* save, sum [T, hidden] f32 (the normed input, the Mamba-2 branch) and the
 * muP vector [ssm_in_proj_dim] f32. */
void hf_falcon_tensors(const hf_falcon *f, int32_t T, llmem_tensor *save, llmem_tensor *sum,
                       llmem_tensor *mup);

/* ---- qwen3_next (models/qwen3_next.c) --------------------------------------------- */

/* The qwen3_next weights (loaded by hf_qwen3n_load, <models/model_internal.h>)
 * and its forward scratch. */
typedef struct hf_qwen3n hf_qwen3n;
void hf_qwen3n_destroy(hf_qwen3n *q);
/* check_tensors for qwen3_next: every tensor config.json implies is there
 * (float dtype, expected shape; concatenated parts of one dtype) and the
 * checkpoint holds no other. LLMEM_E_NOT_FOUND, LLMEM_E_CORRUPT,
 * LLMEM_E_UNSUPPORTED with a message in err. */
llmem_status hf_qwen3n_check_tensors(const llmem_model_config *cfg, const llmem_safetensors *st,
                                     char *err, size_t err_len);
/* The recurrent states of a gated delta net layer: conv {d_conv - 1,
 * conv_dim} f32 and the delta-rule state {H_v, d_k, d_v} of delta_dtype. */
void hf_qwen3n_states(const llmem_model_config *cfg, llmem_dtype delta_dtype,
                      llmem_state_desc d[2]);

/* ---- tensor names and shapes (models/weights.c) ------------------------------- */

/* Writes "<pre><leaf>" (layer < 0) or "<pre>layers.<layer>.<leaf>" into
 * buf (len bytes, NUL-terminated). Returns false, with buf emptied, when
 * the name does not fit. */
bool hf_layer_name(char *buf, size_t len, const char *pre, int32_t layer, const char *leaf);
/* Sets shape[0..2] = {a, b, c} and *n_dims = n (a weight's n-dim shape,
 * outermost first; unused trailing entries are given as 0). */
void hf_shape(int64_t *shape, int32_t *n_dims, int32_t n, int64_t a, int64_t b, int64_t c);
/* llmem_model_weight for the global weights of a transformers checkpoint:
 * LLMEM_W_EMBED "<prefix>embed_tokens.weight" [V, H], LLMEM_W_FINAL_NORM
 * "<prefix><final_norm>" [H] and LLMEM_W_LM_HEAD "lm_head.weight" [V, H]
 * (none with tied embeddings). False for any other w or a name longer
 * than buf_len. */
bool hf_global_weight(const llmem_model_config *cfg, llmem_weight w, const char *final_norm,
                      char *buf, size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS],
                      int32_t *n_dims);

/* ---- lfm2 and jamba (models/lfm2.c, models/jamba.c) ----------------------------- */

/* llmem_model_weight for the lfm2 and jamba architectures (the same
 * contract); jamba's MoE weights go through hf_moe_weight. */
bool hf_lfm2_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                    size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims);
bool hf_jamba_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                     size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims);

#endif

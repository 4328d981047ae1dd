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

/* Largest integer a JSON number (an IEEE double) holds exactly: 2^53. */
#define HF_JSON_INT_MAX 9007199254740992.0

/* Deepest nesting of arrays and objects cJSON parses (CJSON_NESTING_LIMIT);
 * a deeper text fails to parse although it may be valid JSON. */
#define HF_JSON_MAX_DEPTH CJSON_NESTING_LIMIT

/* Whether text[0, len) opens more than HF_JSON_MAX_DEPTH arrays or objects
 * at once (brackets inside strings do not count). Lets a loader name that
 * fault instead of "invalid JSON" when cJSON refuses the text. */
static inline bool hf_json_too_deep(const char *text, size_t len)
{
    long depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > HF_JSON_MAX_DEPTH)
                return true;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return false;
}
/* What hf_json_parse found. */
typedef enum hf_json_fault {
    HF_JSON_OK = 0,
    HF_JSON_SYNTAX,   /* not JSON (or nested deeper than HF_JSON_MAX_DEPTH) */
    HF_JSON_TRAILING, /* a JSON value, then bytes other than whitespace */
} hf_json_fault;

/* Parses text[0, len) (need not be NUL-terminated) as one JSON text: a
 * value with only whitespace after it (RFC 8259, section 2), as Python's
 * json.loads and serde_json read config.json and tokenizer.json; cJSON on
 * its own stops after the value and ignores the rest. On HF_JSON_OK *root
 * is the tree (the caller frees it with cJSON_Delete); otherwise *root is
 * NULL and *at the byte offset of the fault. */
static inline hf_json_fault hf_json_parse(const char *text, size_t len, cJSON **root, size_t *at)
{
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    *at = end && end >= text ? (size_t)(end - text) : 0;
    if (!*root)
        return HF_JSON_SYNTAX;
    for (size_t i = *at; i < len; i++) {
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\n' && text[i] != '\r') {
            cJSON_Delete(*root);
            *root = NULL;
            *at = i;
            return HF_JSON_TRAILING;
        }
    }
    return HF_JSON_OK;
}

/* Offset of the first \u0000 escape inside a string of the JSON text
 * text[0, len), or len when there is none. cJSON ends its C strings at
 * that NUL, so "llama\u0000x" would read as "llama" and a tensor name
 * would lose its tail; the loaders refuse such text instead. */
static inline size_t hf_json_nul_at(const char *text, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_str)
            in_str = text[i] == '"';
        else if (text[i] == '"')
            in_str = false;
        else if (text[i] == '\\' && i + 1 < len && text[++i] == 'u' && i + 4 < len &&
                 text[i + 1] == '0' && text[i + 2] == '0' && text[i + 3] == '0' && text[i + 4] == '0')
            return i - 1;
    }
    return len;
}

/* Looks for a name that one object of the tree v (at any depth) holds
 * twice. JSON leaves duplicate names to the reader (RFC 8259, section 4):
 * cJSON's lookups take the first, Python's json.loads the last, so such a
 * file would read one way in llmem and another in transformers. On
 * LLMEM_OK *dup is that name (owned by the tree) or NULL when there is
 * none; LLMEM_E_NO_MEMORY otherwise. O(n log n) in the names of each
 * object. (models/config.c) */
llmem_status hf_json_dup_key(const cJSON *v, const char **dup);

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

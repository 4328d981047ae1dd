/* llmem models/: the config.json helpers shared by config.c and
 * config_hybrid.c (internal). The short names map to hf_cfg_* symbols. */
#ifndef LLMEM_MODELS_CONFIG_INTERNAL_H
#define LLMEM_MODELS_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "llmem/model.h"
#include "models/hf_internal.h" /* TRY */

#define CFG_MAX_DIM (1 << 24) /* bound on any size, so derived sizes fit int32 */
typedef struct cfgctx {
    const cJSON *root;
    const char *src; /* message prefix: "config.json" or the file path */
    char *err;
    size_t err_len;
} cfgctx;
#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})
/* Mamba-2 mixer sizes. Key spellings per architecture. */
typedef struct ssm_keys {
    const char *const *heads, *const *head_dim, *const *state, *const *groups, *const *conv,
        *const *expand, *const *chunk, *const *conv_bias, *const *proj_bias, *const *dt_min,
        *const *dt_max, *const *dt_floor, *const *dt_limit;
    int32_t def_groups, def_chunk;
} ssm_keys;
/* BambaConfig's spelling of them (mamba_n_heads, mamba_d_head, ...), which
 * GraniteMoeHybridConfig and FalconH1Config share. */
extern const ssm_keys hf_cfg_bamba_ssm_keys;

/* config.c: key readers and the blocks the families share (see config.c). */
#define find_any hf_cfg_find_any
#define json_num hf_cfg_json_num
#define get_int hf_cfg_get_int
#define get_num_in hf_cfg_get_num_in
#define get_pos hf_cfg_get_pos
#define get_finite hf_cfg_get_finite
#define get_bool hf_cfg_get_bool
#define get_str hf_cfg_get_str
#define get_act hf_cfg_get_act
#define bad hf_cfg_bad
#define set_layers hf_cfg_set_layers
#define parse_ssm hf_cfg_parse_ssm
#define parse_attention hf_cfg_parse_attention
#define parse_rope hf_cfg_parse_rope
#define parse_ffn hf_cfg_parse_ffn
const cJSON *find_any(const cJSON *obj, const char *const *keys, const char **which);
bool json_num(const cJSON *v, double *out);
llmem_status get_int(cfgctx *c, const char *const *keys, bool required, int32_t def,
                     int32_t lo, int32_t hi, int32_t *out);
llmem_status get_num_in(cfgctx *c, const cJSON *obj, const char *const *keys,
                        bool required, double def, double *out);
llmem_status get_pos(cfgctx *c, const cJSON *obj, const char *const *keys, double def,
                     double *out);
llmem_status get_finite(cfgctx *c, const cJSON *obj, const char *const *keys, double def,
                        double *out);
llmem_status get_bool(cfgctx *c, const char *const *keys, bool def, bool *out);
llmem_status get_str(cfgctx *c, const char *const *keys, bool required, const char *def,
                     const char **out);
llmem_status get_act(cfgctx *c, const char *const *keys, const char *def, bool allow_relu2,
                     llmem_activation *out);
llmem_status bad(cfgctx *c, const char *what);
llmem_status set_layers(cfgctx *c, llmem_model_config *m, int32_t n, llmem_layer_kind kind,
                        bool has_ffn);
llmem_status parse_ssm(cfgctx *c, llmem_model_config *m, const ssm_keys *k);
llmem_status parse_attention(cfgctx *c, llmem_model_config *m);
llmem_status parse_rope(cfgctx *c, llmem_model_config *m, double default_partial);
llmem_status parse_ffn(cfgctx *c, llmem_model_config *m, bool gated);
/* A name a layer list may hold and what it stands for (a llmem_layer_kind,
 * or a family's own code). */
typedef struct hf_kind_name {
    const char *name;
    int32_t value;
} hf_kind_name;
/* The per-layer list under the first of keys present (transformers'
 * layer_types, layers_block_type): n strings, each a name of
 * names[0, n_names); out[i] gets entry i's value. Absent or null: LLMEM_OK
 * with *found false and out untouched. LLMEM_E_CORRUPT: not an array of n
 * strings; LLMEM_E_UNSUPPORTED: a name the family lacks (a layer type llmem
 * does not implement; err names the layer, the name, arch and the names it
 * knows). */
llmem_status hf_cfg_layer_names(cfgctx *c, const char *const *keys, int32_t n, const char *arch,
                                const hf_kind_name *names, int n_names, int32_t *out,
                                bool *found);

/* config_hybrid.c: the MoE and muP families. nemotron_h's MoE keys (called
 * after its layer list when a layer is 'moe'); granitemoehybrid; falcon_h1;
 * the routing sizes every MoE model must satisfy (llmem_op_moe_route's). */
llmem_status hf_cfg_parse_nemotron_moe(cfgctx *c, llmem_model_config *m);
llmem_status hf_cfg_parse_granite(cfgctx *c, llmem_model_config *m);
llmem_status hf_cfg_parse_falcon_h1(cfgctx *c, llmem_model_config *m);
/* models/qwen3_next.c: Qwen3NextConfig (layer_types, linear_*, MoE keys). */
llmem_status hf_cfg_parse_qwen3_next(cfgctx *c, llmem_model_config *m);
/* models/gemma3.c: gemma3_text (layer types, per-type RoPE, soft-capping). */
llmem_status hf_cfg_parse_gemma3(cfgctx *c, llmem_model_config *m);
llmem_status hf_cfg_check_moe(cfgctx *c, const llmem_model_config *m);

/* models/lfm2.c and models/jamba.c: their config.json (Lfm2Config, JambaConfig). */
llmem_status hf_cfg_parse_lfm2(cfgctx *c, llmem_model_config *m);
llmem_status hf_cfg_parse_jamba(cfgctx *c, llmem_model_config *m);

#endif

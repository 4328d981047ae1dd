/* llmem models/: the tensors each architecture needs, by Hugging Face name.
 *
 * Names follow what transformers 5 writes with save_pretrained:
 *   llama       model.embed_tokens, model.layers.N.{input_layernorm,
 *               post_attention_layernorm, self_attn.{q,k,v,o}_proj,
 *               mlp.{gate,up,down}_proj}, model.norm, lm_head
 *   mamba2      backbone.embeddings, backbone.layers.N.{norm, mixer.*},
 *               backbone.norm_f, lm_head
 *   bamba       model.embed_tokens, model.layers.N.{input_layernorm,
 *               pre_ff_layernorm, mamba.* | self_attn.*, feed_forward.*},
 *               model.final_layernorm, lm_head
 *   nemotron_h  backbone.embeddings, backbone.layers.N.{norm, mixer.*},
 *               backbone.norm_f, lm_head (transformers' module names use
 *               "model."; both prefixes are accepted)
 * where a Mamba-2 mixer is {in_proj, conv1d, dt_bias, A_log, D, norm,
 * out_proj} (modeling_mamba2.py, modeling_bamba.py, modeling_nemotron_h.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "models/hf_internal.h"

static bool is_global(llmem_weight w)
{
    return w == LLMEM_W_EMBED || w == LLMEM_W_FINAL_NORM || w == LLMEM_W_LM_HEAD;
}

void hf_shape(int64_t *shape, int32_t *n_dims, int32_t n, int64_t a, int64_t b, int64_t c)
{
    shape[0] = a;
    shape[1] = b;
    shape[2] = c;
    *n_dims = n;
}

bool hf_layer_name(char *buf, size_t len, const char *pre, int32_t layer, const char *leaf)
{
    int n = layer < 0 ? snprintf(buf, len, "%s%s", pre, leaf)
                      : snprintf(buf, len, "%slayers.%d.%s", pre, (int)layer, leaf);
    if (n < 0 || (size_t)n >= len) {
        buf[0] = '\0';
        return false;
    }
    return true;
}

bool hf_global_weight(const llmem_model_config *cfg, llmem_weight w, const char *final_norm,
                      char *buf, size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS],
                      int32_t *n_dims)
{
    const int64_t H = cfg->hidden_size, V = cfg->vocab_size;
    switch (w) {
    case LLMEM_W_EMBED:
        hf_shape(shape, n_dims, 2, V, H, 0);
        return hf_layer_name(buf, buf_len, cfg->tensor_prefix, -1, "embed_tokens.weight");
    case LLMEM_W_FINAL_NORM:
        hf_shape(shape, n_dims, 1, H, 0, 0);
        return hf_layer_name(buf, buf_len, cfg->tensor_prefix, -1, final_norm);
    case LLMEM_W_LM_HEAD:
        if (cfg->tie_word_embeddings)
            return false;
        hf_shape(shape, n_dims, 2, V, H, 0);
        return hf_layer_name(buf, buf_len, "", -1, "lm_head.weight");
    default:
        return false;
    }
}

bool llmem_model_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                        size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims)
{
    if (buf && buf_len)
        buf[0] = '\0';
    if (!cfg || !buf || !buf_len || !shape || !n_dims || (unsigned)w >= LLMEM_W_COUNT ||
        (unsigned)cfg->arch >= LLMEM_ARCH_COUNT)
        return false;
    if (!is_global(w) && (layer < 0 || layer >= cfg->n_layers))
        return false;
    if (cfg->arch == LLMEM_ARCH_LFM2)
        return hf_lfm2_weight(cfg, w, layer, buf, buf_len, shape, n_dims);
    if (cfg->arch == LLMEM_ARCH_JAMBA)
        return hf_jamba_weight(cfg, w, layer, buf, buf_len, shape, n_dims);
    if (w >= LLMEM_W_ATTN_Q_NORM) /* gemma3's extra norms: models/gemma3.c */
        return hf_gemma3_weight(cfg, w, layer, buf, buf_len, shape, n_dims);
    if (w >= LLMEM_W_MOE_ROUTER) /* mixture of experts: models/moe.c */
        return hf_moe_weight(cfg, w, layer, buf, buf_len, shape, n_dims);
    const llmem_arch a = cfg->arch;
    const bool granite = a == LLMEM_ARCH_GRANITEMOEHYBRID, falcon = a == LLMEM_ARCH_FALCON_H1;
    const bool qwen3n = a == LLMEM_ARCH_QWEN3_NEXT; /* layers: models/qwen3_next.c */
    const bool gemma = a == LLMEM_ARCH_GEMMA3_TEXT;
    const bool hf_model = a == LLMEM_ARCH_LLAMA || a == LLMEM_ARCH_BAMBA || granite || falcon ||
                          qwen3n || gemma;
    const char *pre = cfg->tensor_prefix;
    const int64_t H = cfg->hidden_size, V = cfg->vocab_size, I = cfg->intermediate_size;
    const int64_t q = (int64_t)cfg->n_heads * cfg->head_dim;
    const int64_t kv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    const int64_t din = cfg->ssm_d_inner, nh = cfg->ssm_n_heads;
    const char *leaf = NULL, *sub = "";
    int n = 0;

    if (is_global(w)) {
        if (w == LLMEM_W_EMBED) {
            hf_shape(shape, n_dims, 2, V, H, 0);
            n = snprintf(buf, buf_len, "%s%s", pre, hf_model ? "embed_tokens.weight"
                                                               : "embeddings.weight");
        } else if (w == LLMEM_W_FINAL_NORM) {
            hf_shape(shape, n_dims, 1, H, 0, 0);
            n = snprintf(buf, buf_len, "%s%s", pre,
                         a == LLMEM_ARCH_LLAMA || granite || qwen3n || gemma ? "norm.weight"
                         : a == LLMEM_ARCH_BAMBA || falcon ? "final_layernorm.weight"
                                                            : "norm_f.weight");
        } else {
            if (cfg->tie_word_embeddings)
                return false;
            hf_shape(shape, n_dims, 2, V, H, 0);
            n = snprintf(buf, buf_len, "lm_head.weight");
        }
        if (n < 0 || (size_t)n >= buf_len) {
            buf[0] = '\0';
            return false;
        }
        return true;
    }

    if (qwen3n)
        return false;
    const llmem_layer_config *L = &cfg->layers[layer];
    /* falcon_h1's parallel layers hold both mixers */
    const bool par = L->kind == LLMEM_LAYER_PARALLEL;
    const bool attn = L->kind == LLMEM_LAYER_ATTENTION || par;
    const bool ssm = L->kind == LLMEM_LAYER_MAMBA2 || par;
    /* granite's FFN is its shared MLP and experts (LLMEM_W_MOE_*, LLMEM_W_SHARED_*) */
    const bool ffn = (L->has_ffn && !granite) || L->kind == LLMEM_LAYER_MLP;
    const char *attn_sub = hf_model ? "self_attn." : "mixer.";
    const char *ffn_sub = a == LLMEM_ARCH_LLAMA || gemma ? "mlp."
                          : a == LLMEM_ARCH_BAMBA || falcon ? "feed_forward." : "mixer.";
    const char *ssm_sub = a == LLMEM_ARCH_BAMBA || granite || falcon ? "mamba." : "mixer.";
    switch (w) {
    case LLMEM_W_MIXER_NORM:
        leaf = hf_model ? "input_layernorm.weight" : "norm.weight";
        hf_shape(shape, n_dims, 1, H, 0, 0);
        break;
    case LLMEM_W_FFN_NORM:
        if (!L->has_ffn)
            return false;
        leaf = a == LLMEM_ARCH_LLAMA || granite ? "post_attention_layernorm.weight"
               : gemma ? "pre_feedforward_layernorm.weight" : "pre_ff_layernorm.weight";
        hf_shape(shape, n_dims, 1, H, 0, 0);
        break;
    case LLMEM_W_ATTN_Q: case LLMEM_W_ATTN_K: case LLMEM_W_ATTN_V: case LLMEM_W_ATTN_O:
        if (!attn)
            return false;
        sub = attn_sub;
        leaf = w == LLMEM_W_ATTN_Q ? "q_proj.weight" : w == LLMEM_W_ATTN_K ? "k_proj.weight"
               : w == LLMEM_W_ATTN_V ? "v_proj.weight" : "o_proj.weight";
        if (w == LLMEM_W_ATTN_O)
            hf_shape(shape, n_dims, 2, H, q, 0);
        else
            hf_shape(shape, n_dims, 2, w == LLMEM_W_ATTN_Q ? q : kv, H, 0);
        break;
    case LLMEM_W_ATTN_Q_BIAS: case LLMEM_W_ATTN_K_BIAS: case LLMEM_W_ATTN_V_BIAS:
    case LLMEM_W_ATTN_O_BIAS:
        if (!attn || !cfg->attention_bias)
            return false;
        sub = attn_sub;
        leaf = w == LLMEM_W_ATTN_Q_BIAS ? "q_proj.bias" : w == LLMEM_W_ATTN_K_BIAS ? "k_proj.bias"
               : w == LLMEM_W_ATTN_V_BIAS ? "v_proj.bias" : "o_proj.bias";
        hf_shape(shape, n_dims, 1, w == LLMEM_W_ATTN_Q_BIAS ? q : w == LLMEM_W_ATTN_O_BIAS ? H : kv,
                  0, 0);
        break;
    case LLMEM_W_FFN_GATE: case LLMEM_W_FFN_UP: case LLMEM_W_FFN_DOWN:
        if (!ffn || (w == LLMEM_W_FFN_GATE && !cfg->ffn_gated))
            return false;
        sub = ffn_sub;
        leaf = w == LLMEM_W_FFN_GATE ? "gate_proj.weight" : w == LLMEM_W_FFN_UP ? "up_proj.weight"
                                                                              : "down_proj.weight";
        if (w == LLMEM_W_FFN_DOWN)
            hf_shape(shape, n_dims, 2, H, I, 0);
        else
            hf_shape(shape, n_dims, 2, I, H, 0);
        break;
    case LLMEM_W_FFN_GATE_BIAS: case LLMEM_W_FFN_UP_BIAS: case LLMEM_W_FFN_DOWN_BIAS:
        if (!ffn || !cfg->mlp_bias || (w == LLMEM_W_FFN_GATE_BIAS && !cfg->ffn_gated))
            return false;
        sub = ffn_sub;
        leaf = w == LLMEM_W_FFN_GATE_BIAS ? "gate_proj.bias" : w == LLMEM_W_FFN_UP_BIAS
               ? "up_proj.bias" : "down_proj.bias";
        hf_shape(shape, n_dims, 1, w == LLMEM_W_FFN_DOWN_BIAS ? H : I, 0, 0);
        break;
    case LLMEM_W_SSM_IN:
    case LLMEM_W_SSM_IN_BIAS:
        if (!ssm || (w == LLMEM_W_SSM_IN_BIAS && !cfg->ssm_proj_bias))
            return false;
        sub = ssm_sub;
        leaf = w == LLMEM_W_SSM_IN ? "in_proj.weight" : "in_proj.bias";
        if (w == LLMEM_W_SSM_IN)
            hf_shape(shape, n_dims, 2, cfg->ssm_in_proj_dim, H, 0);
        else
            hf_shape(shape, n_dims, 1, cfg->ssm_in_proj_dim, 0, 0);
        break;
    case LLMEM_W_SSM_CONV:
        if (!ssm)
            return false;
        sub = ssm_sub;
        leaf = "conv1d.weight";
        hf_shape(shape, n_dims, 3, cfg->ssm_conv_dim, 1, cfg->ssm_d_conv);
        break;
    case LLMEM_W_SSM_CONV_BIAS:
        if (!ssm || !cfg->ssm_conv_bias)
            return false;
        sub = ssm_sub;
        leaf = "conv1d.bias";
        hf_shape(shape, n_dims, 1, cfg->ssm_conv_dim, 0, 0);
        break;
    case LLMEM_W_SSM_DT_BIAS: case LLMEM_W_SSM_A_LOG: case LLMEM_W_SSM_D:
        if (!ssm)
            return false;
        sub = ssm_sub;
        leaf = w == LLMEM_W_SSM_DT_BIAS ? "dt_bias" : w == LLMEM_W_SSM_A_LOG ? "A_log" : "D";
        hf_shape(shape, n_dims, 1, nh, 0, 0);
        break;
    case LLMEM_W_SSM_NORM:
        if (!ssm || cfg->ssm_gate_only) /* falcon_h1 without mamba_rms_norm has none */
            return false;
        sub = ssm_sub;
        leaf = "norm.weight";
        hf_shape(shape, n_dims, 1, din, 0, 0);
        break;
    case LLMEM_W_SSM_OUT:
    case LLMEM_W_SSM_OUT_BIAS:
        if (!ssm || (w == LLMEM_W_SSM_OUT_BIAS && !cfg->ssm_proj_bias))
            return false;
        sub = ssm_sub;
        leaf = w == LLMEM_W_SSM_OUT ? "out_proj.weight" : "out_proj.bias";
        if (w == LLMEM_W_SSM_OUT)
            hf_shape(shape, n_dims, 2, H, din, 0);
        else
            hf_shape(shape, n_dims, 1, H, 0, 0);
        break;
    default:
        return false;
    }
    n = snprintf(buf, buf_len, "%slayers.%d.%s%s", pre, (int)layer, sub, leaf);
    if (n < 0 || (size_t)n >= buf_len) {
        buf[0] = '\0';
        return false;
    }
    return true;
}

static void shape_str(char *buf, size_t len, const int64_t *shape, int32_t n_dims)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int32_t i = 0; i < n_dims && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < len)
        snprintf(buf + k, len - k, "]");
}

static llmem_status check_one(const llmem_model_config *cfg, const llmem_safetensors *st,
                              llmem_weight w, int32_t layer, char *err, size_t err_len)
{
    char name[256], what[96], got[160], want[160];
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS] = {0};
    int32_t nd = 0;
    if (!llmem_model_weight(cfg, w, layer, name, sizeof name, shape, &nd))
        return LLMEM_OK;
    if (is_global(w))
        snprintf(what, sizeof what, "%s", w == LLMEM_W_EMBED ? "the token embedding"
                 : w == LLMEM_W_FINAL_NORM ? "the final norm"
                 : "the LM head; config.json has tie_word_embeddings false");
    else
        snprintf(what, sizeof what, "layer %d, %s", (int)layer,
                 llmem_layer_kind_name(cfg->layers[layer].kind));
    if (hf_moe_is_split(cfg, w)) /* one tensor per expert */
        return hf_moe_check_split(cfg, st, w, layer, err, err_len);
    llmem_tensor_info ti;
    llmem_status s = llmem_safetensors_find(st, name, &ti, NULL, 0);
    if (s == LLMEM_E_NOT_FOUND) {
        llmem_errf(err, err_len, "missing tensor '%s' (%s)", name, what);
        return s;
    }
    if (s == LLMEM_E_UNSUPPORTED) {
        llmem_errf(err, err_len, "%s: tensor '%s' (%s) has dtype %s; llmem reads F32, F16 and BF16",
                ti.file, name, what, ti.st_dtype);
        return s;
    }
    if (s != LLMEM_OK)
        return s;
    bool same = ti.n_dims == nd;
    for (int32_t i = 0; same && i < nd; i++)
        same = ti.shape[i] == shape[i];
    if (!same) {
        shape_str(got, sizeof got, ti.shape, ti.n_dims);
        shape_str(want, sizeof want, shape, nd);
        llmem_errf(err, err_len, "%s: tensor '%s' (%s) has shape %s, expected %s from config.json",
                ti.file, name, what, got, want);
        return LLMEM_E_CORRUPT;
    }
    return LLMEM_OK;
}

/* Names of every weight cfg uses, sorted (strcmp), in one allocation. */
typedef struct name_set {
    char (*v)[256];
    int32_t n;
} name_set;

static int cmp_name256(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static llmem_status used_names(const llmem_model_config *cfg, name_set *out)
{
    /* split experts: one name per expert (nemotron_h) */
    int64_t cap = 3 + (int64_t)cfg->n_layers * (LLMEM_W_COUNT + 3 * (int64_t)cfg->n_expert);
    out->n = 0;
    out->v = malloc((size_t)cap * sizeof *out->v);
    if (!out->v)
        return LLMEM_E_NO_MEMORY;
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS];
    int32_t nd;
    for (int w = LLMEM_W_EMBED; w <= LLMEM_W_LM_HEAD; w++)
        if (llmem_model_weight(cfg, (llmem_weight)w, 0, out->v[out->n], sizeof out->v[0], shape,
                               &nd))
            out->n++;
    for (int32_t l = 0; l < cfg->n_layers; l++)
        for (int w = LLMEM_W_MIXER_NORM; w < LLMEM_W_COUNT; w++)
            if (llmem_model_weight(cfg, (llmem_weight)w, l, out->v[out->n], sizeof out->v[0],
                                   shape, &nd)) {
                if (!hf_moe_is_split(cfg, (llmem_weight)w)) {
                    out->n++;
                    continue;
                }
                for (int32_t e = 0; e < hf_moe_split_count(cfg, (llmem_weight)w); e++)
                    if (hf_moe_split_name(cfg, (llmem_weight)w, l, e, out->v[out->n],
                                          sizeof out->v[0]))
                        out->n++;
            }
    qsort(out->v, (size_t)out->n, sizeof out->v[0], cmp_name256);
    return LLMEM_OK;
}

/* Tensors a checkpoint may carry although no forward pass reads them:
 * rotary inverse-frequency buffers (older transformers saved them) and an
 * lm_head saved beside tied embeddings. */
static bool ignorable(const llmem_model_config *cfg, const char *name)
{
    size_t n = strlen(name);
    static const char inv_freq[] = ".rotary_emb.inv_freq";
    if (n >= sizeof inv_freq - 1 && strcmp(name + n - (sizeof inv_freq - 1), inv_freq) == 0)
        return true;
    return cfg->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0;
}

/* Every checkpoint tensor must be one the configuration uses: a config.json
 * with fewer layers (or another layer pattern) than the checkpoint would
 * otherwise run a different model than the one saved. */
static llmem_status check_unused(const llmem_model_config *cfg, const llmem_safetensors *st,
                                 char *err, size_t err_len)
{
    name_set used;
    if (used_names(cfg, &used) != LLMEM_OK) {
        llmem_errf(err, err_len, "out of host memory checking the checkpoint's tensor names");
        return LLMEM_E_NO_MEMORY;
    }
    char list[400] = "";
    size_t len = 0;
    int32_t n_unused = 0;
    for (int32_t i = 0; i < llmem_safetensors_count(st); i++) {
        llmem_tensor_info ti;
        if (llmem_safetensors_get(st, i, &ti) != LLMEM_OK)
            continue;
        if (ignorable(cfg, ti.name) ||
            bsearch(ti.name, used.v, (size_t)used.n, sizeof used.v[0], cmp_name256))
            continue;
        if (n_unused++ < 3 && len < sizeof list) {
            int w = snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "", ti.name);
            len = w < 0 ? len : len + (size_t)w;
        }
    }
    free(used.v);
    if (n_unused == 0)
        return LLMEM_OK;
    llmem_errf(err, err_len, "%d checkpoint tensor%s not used by config.json (%s, %d layers): "
               "%s%s; config.json and the checkpoint disagree", (int)n_unused,
               n_unused == 1 ? " is" : "s are", llmem_arch_name(cfg->arch), (int)cfg->n_layers,
               list, n_unused > 3 ? ", ..." : "");
    return LLMEM_E_CORRUPT;
}

llmem_status llmem_model_config_check_tensors(llmem_model_config *cfg, const llmem_safetensors *st,
                                              char *err, size_t err_len)
{
    if (!cfg || !st) {
        llmem_errf(err, err_len, "llmem_model_config_check_tensors: NULL argument");
        return LLMEM_E_INVALID;
    }
    if (cfg->arch == LLMEM_ARCH_NEMOTRON_H) {
        /* Use whichever of the two prefixes the checkpoint's embedding has. */
        static const char *prefixes[2] = {"backbone.", "model."};
        llmem_tensor_info ti;
        char name[64];
        for (int i = 0; i < 2; i++) {
            snprintf(name, sizeof name, "%sembeddings.weight", prefixes[i]);
            if (llmem_safetensors_find(st, name, &ti, NULL, 0) != LLMEM_E_NOT_FOUND) {
                snprintf(cfg->tensor_prefix, sizeof cfg->tensor_prefix, "%s", prefixes[i]);
                break;
            }
        }
    }
    if (cfg->arch == LLMEM_ARCH_QWEN3_NEXT)
        return hf_qwen3n_check_tensors(cfg, st, err, err_len);
    for (int w = LLMEM_W_EMBED; w <= LLMEM_W_LM_HEAD; w++) {
        llmem_status s = check_one(cfg, st, (llmem_weight)w, 0, err, err_len);
        if (s != LLMEM_OK)
            return s;
    }
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        for (int w = LLMEM_W_MIXER_NORM; w < LLMEM_W_COUNT; w++) {
            llmem_status s = check_one(cfg, st, (llmem_weight)w, l, err, err_len);
            if (s != LLMEM_OK)
                return s;
        }
    }
    return check_unused(cfg, st, err, err_len);
}

/* ---- finite weights --------------------------------------------------------- */

/* Index of the first non-finite element of a tensor, or -1: exponent bits
 * all ones (IEEE 754 binary32 / binary16, bfloat16). Elements are copied
 * out (the data need not be aligned) and read in host order, which is the
 * file's little-endian order on the little-endian hosts llmem supports. */
static int64_t first_nonfinite(const llmem_tensor_info *ti)
{
    const unsigned char *p = ti->data;
    for (int64_t i = 0; i < ti->n_elements; i++) {
        switch (ti->dtype) {
        case LLMEM_DTYPE_F32: {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u)
                return i;
            break;
        }
        case LLMEM_DTYPE_F16: {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            if ((u & 0x7c00u) == 0x7c00u)
                return i;
            break;
        }
        case LLMEM_DTYPE_BF16: {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            if ((u & 0x7f80u) == 0x7f80u)
                return i;
            break;
        }
        default:
            return -1;
        }
    }
    return -1;
}

llmem_status llmem_model_check_weights_finite(const llmem_model_config *cfg,
                                              const llmem_safetensors *st, char *err,
                                              size_t err_len)
{
    if (!cfg || !st) {
        llmem_errf(err, err_len, "llmem_model_check_weights_finite: NULL argument");
        return LLMEM_E_INVALID;
    }
    name_set used;
    if (used_names(cfg, &used) != LLMEM_OK) {
        llmem_errf(err, err_len, "out of host memory checking the weights");
        return LLMEM_E_NO_MEMORY;
    }
    llmem_status s = LLMEM_OK;
    /* qwen3_next names its layer tensors itself (models/qwen3_next.c); its
     * check_tensors admits no tensor it does not use, so check them all */
    bool all = cfg->arch == LLMEM_ARCH_QWEN3_NEXT;
    int32_t n = all ? llmem_safetensors_count(st) : used.n;
    for (int32_t i = 0; i < n && s == LLMEM_OK; i++) {
        llmem_tensor_info ti;
        s = all ? llmem_safetensors_get(st, i, &ti)
                : llmem_safetensors_find(st, used.v[i], &ti, err, err_len);
        if (s != LLMEM_OK)
            break;
        if (all && ti.dtype == LLMEM_DTYPE_COUNT)
            continue; /* not a float tensor: none the model reads */
        int64_t bad = first_nonfinite(&ti);
        if (bad >= 0) {
            llmem_errf(err, err_len, "%s: tensor '%s' has a non-finite value (NaN or infinity) "
                       "at element %lld of %lld", ti.file, ti.name, (long long)bad,
                       (long long)ti.n_elements);
            s = LLMEM_E_CORRUPT;
        }
    }
    free(used.v);
    return s;
}

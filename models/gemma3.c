/* llmem models/: gemma3_text (Gemma3ForCausalLM) — config, tensor names,
 * norm weights and the per-head q/k norms (transformers 5.17
 * modeling_gemma3.py / configuration_gemma3.py; Gemma Team 2025, "Gemma 3
 * Technical Report").
 *
 * A layer is, with Gemma's RMSNorm n(x) = x / rms(x) * (1 + w):
 *   x += n_post_attn(attn(n_in(x)));  x += n_post_ffn(mlp(n_pre_ffn(x)))
 *   attn: q = n_q(q_proj h) and k = n_k(k_proj h) per head, then RoPE with
 *         the layer type's rope_parameters; softmax(q k^T *
 *         query_pre_attn_scalar^-0.5 [soft-capped]) v over the layer's keys:
 *         a "sliding_attention" layer sees its last sliding_window keys
 *         (its own included: transformers' mask kv_idx > q_idx - window),
 *         a "full_attention" layer all of them;
 *   mlp:  down(gelu_tanh(gate h) * up h).
 * Embeddings are scaled by sqrt(hidden_size) rounded to the embedding
 * dtype; logits are lm_head (tied to the embeddings by default) of the
 * final norm, optionally soft-capped (final_logit_softcapping).
 *
 * The runtime stores (1 + w) of every Gemma norm as f32 at load, so the
 * ordinary RMSNorm op computes n(x); the sliding layers share one windowed
 * KV cache (memory/swa.c) and the full layers a full one, composed per
 * layer by the hybrid (models/runtime.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"
#include "models/config_internal.h"
#include "models/model_internal.h"

/* One layer type's entry of rope_parameters (transformers 5) or the
 * classic rope_theta / rope_local_base_freq / rope_scaling keys. */
static llmem_status rope_of(cfgctx *c, const char *type, double def_theta, double *theta,
                            double *scale)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c->root, "rope_parameters");
    const cJSON *e = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, type) : NULL;
    if (e && !cJSON_IsNull(e) && !cJSON_IsObject(e)) {
        llmem_errf(c->err, c->err_len, "%s: rope_parameters.%s must be an object", c->src, type);
        return LLMEM_E_CORRUPT;
    }
    *theta = def_theta;
    *scale = 1.0;
    bool global = strcmp(type, "full_attention") == 0;
    if (!cJSON_IsObject(e)) { /* transformers 4 spellings */
        TRY(get_pos(c, c->root, global ? KEYS("rope_theta") : KEYS("rope_local_base_freq"),
                    def_theta, theta));
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->root, "rope_scaling");
        e = global && cJSON_IsObject(rs) ? rs : NULL;
        if (!e)
            return LLMEM_OK;
    }
    TRY(get_pos(c, e, KEYS("rope_theta"), *theta, theta));
    const cJSON *t = find_any(e, KEYS("rope_type", "type"), NULL);
    if (t && !cJSON_IsString(t))
        return bad(c, "'rope_type' must be a string");
    const char *name = t ? t->valuestring : "default";
    if (strcmp(name, "linear") == 0) {
        double f;
        TRY(get_num_in(c, e, KEYS("factor"), true, 1.0, &f));
        if (!(f >= 1.0) || !isfinite(f))
            return bad(c, "linear rope_parameters 'factor' must be a finite number >= 1");
        *scale = 1.0 / f;
    } else if (strcmp(name, "default") != 0) {
        llmem_errf(c->err, c->err_len,
                   "%s: %s rope_type '%.40s' is not supported (only 'default' and 'linear')",
                   c->src, type, name);
        return LLMEM_E_UNSUPPORTED;
    }
    return LLMEM_OK;
}

/* A soft-capping value: absent / null is off, else a finite number > 0. */
static llmem_status softcap_of(cfgctx *c, const char *const *key, double *out)
{
    TRY(get_num_in(c, c->root, key, false, 0.0, out));
    if (*out != 0.0 && !(*out > 0.0 && isfinite(*out))) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be null or a finite number > 0", c->src,
                   key[0]);
        return LLMEM_E_CORRUPT;
    }
    return LLMEM_OK;
}

llmem_status hf_cfg_parse_gemma3(cfgctx *c, llmem_model_config *m)
{
    int32_t n, window, pattern;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_ATTENTION, true));
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-6, &m->norm_eps));
    TRY(parse_attention(c, m));
    TRY(parse_ffn(c, m, true));
    const char *act;
    TRY(get_str(c, KEYS("hidden_activation", "hidden_act"), false, "gelu_pytorch_tanh", &act));
    if (strcmp(act, "gelu_pytorch_tanh") != 0 && strcmp(act, "gelu_tanh") != 0) {
        llmem_errf(c->err, c->err_len,
                   "%s: hidden_activation '%.40s' is not supported (gemma3_text: "
                   "gelu_pytorch_tanh)", c->src, act);
        return LLMEM_E_UNSUPPORTED;
    }
    m->ffn_act = LLMEM_ACT_GELU_TANH;
    bool bidir;
    TRY(get_bool(c, KEYS("use_bidirectional_attention"), false, &bidir));
    if (bidir)
        return bad(c, "use_bidirectional_attention is not supported (causal decoding only)");
    double qpas;
    TRY(get_pos(c, c->root, KEYS("query_pre_attn_scalar"), 256.0, &qpas));
    m->attention_scale = 1.0 / sqrt(qpas);
    TRY(softcap_of(c, KEYS("attn_logit_softcapping"), &m->attn_softcap));
    TRY(softcap_of(c, KEYS("final_logit_softcapping"), &m->final_softcap));
    TRY(get_int(c, KEYS("sliding_window"), false, 4096, 1, INT32_MAX, &window));
    TRY(get_int(c, KEYS("sliding_window_pattern", "_sliding_window_pattern"), false, 6, 1,
                INT32_MAX, &pattern));
    /* tied unless the config says otherwise (Gemma3TextConfig's default) */
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(c->root, "tie_word_embeddings");
    m->tie_word_embeddings = !cJSON_IsBool(tie) || cJSON_IsTrue(tie);
    double th[2], sc[2]; /* [0] sliding, [1] full */
    TRY(rope_of(c, "sliding_attention", 10000.0, &th[0], &sc[0]));
    TRY(rope_of(c, "full_attention", 1000000.0, &th[1], &sc[1]));
    static const hf_kind_name types[] = {{"sliding_attention", 1}, {"full_attention", 0}};
    int32_t slid[LLMEM_MODEL_MAX_LAYERS];
    bool listed;
    TRY(hf_cfg_layer_names(c, KEYS("layer_types"), n, "gemma3_text", types, 2, slid, &listed));
    for (int32_t i = 0; i < n; i++) {
        /* else transformers' default layer_types: every pattern-th is full */
        bool sliding = listed ? slid[i] != 0 : (i + 1) % pattern != 0;
        m->layers[i].sliding_window = sliding ? window : 0;
        m->layers[i].rope_theta = th[sliding ? 0 : 1];
        m->layers[i].rope_freq_scale = sc[sliding ? 0 : 1];
    }
    m->use_rope = true;
    m->rope_theta = th[1];
    m->partial_rotary_factor = 1.0;
    m->rope_dim = m->head_dim;
    if (m->rope_dim < 2 || m->rope_dim % 2)
        return bad(c, "head_dim must be even and >= 2 for RoPE");
    m->embedding_multiplier = sqrt((double)m->hidden_size); /* rounded at load */
    m->gemma_norms = true;
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

bool hf_gemma3_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                      size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims)
{
    if (!cfg->gemma_norms || cfg->layers[layer].kind != LLMEM_LAYER_ATTENTION)
        return false;
    const char *leaf = w == LLMEM_W_ATTN_Q_NORM    ? "self_attn.q_norm.weight"
                       : w == LLMEM_W_ATTN_K_NORM  ? "self_attn.k_norm.weight"
                       : w == LLMEM_W_POST_ATTN_NORM ? "post_attention_layernorm.weight"
                       : w == LLMEM_W_POST_FFN_NORM  ? "post_feedforward_layernorm.weight"
                                                     : NULL;
    if (!leaf)
        return false;
    bool head = w == LLMEM_W_ATTN_Q_NORM || w == LLMEM_W_ATTN_K_NORM;
    shape[0] = head ? cfg->head_dim : cfg->hidden_size;
    shape[1] = shape[2] = 0;
    *n_dims = 1;
    int n = snprintf(buf, buf_len, "%slayers.%d.%s", cfg->tensor_prefix, layer, leaf);
    if (n < 0 || (size_t)n >= buf_len) {
        buf[0] = '\0';
        return false;
    }
    return true;
}

bool hf_gemma3_is_norm(const llmem_model_config *cfg, llmem_weight w)
{
    return cfg->gemma_norms &&
           (w == LLMEM_W_FINAL_NORM || w == LLMEM_W_MIXER_NORM || w == LLMEM_W_FFN_NORM ||
            w == LLMEM_W_ATTN_Q_NORM || w == LLMEM_W_ATTN_K_NORM ||
            w == LLMEM_W_POST_ATTN_NORM || w == LLMEM_W_POST_FFN_NORM);
}

/* IEEE binary16 / bfloat16 bits to float (exact). */
static float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, bits;
    if (em >= 0x7c00u)
        bits = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
    else if (em >= 0x0400u)
        bits = sign | ((em + (112u << 10)) << 13);
    else {
        float f = (float)em * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float elem_f32(const llmem_tensor_info *info, int64_t i)
{
    const uint8_t *p = (const uint8_t *)info->data;
    if (info->dtype == LLMEM_DTYPE_F32) {
        float f;
        memcpy(&f, p + i * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + i * 2, 2);
    if (info->dtype == LLMEM_DTYPE_F16)
        return half_to_f32(h);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

llmem_status hf_gemma3_load_norm(llmem_backend *be, const llmem_tensor_info *info,
                                 llmem_buffer **buf, llmem_tensor *t)
{
    *buf = NULL;
    int64_t n = info->n_elements;
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h)
        return LLMEM_E_NO_MEMORY;
    /* Gemma3RMSNorm: x * (1 + w.float()), in f32 as transformers computes it */
    for (int64_t i = 0; i < n; i++)
        h[i] = 1.0f + elem_f32(info, i);
    llmem_status s = llmem_buffer_alloc(be, round_up((size_t)(n > 0 ? n : 1) * 4), buf);
    if (s == LLMEM_OK)
        s = llmem_buffer_upload(*buf, 0, h, (size_t)n * 4);
    free(h);
    if (s != LLMEM_OK) {
        llmem_buffer_free(*buf);
        *buf = NULL;
        return s;
    }
    *t = llmem_tensor_1d(*buf, 0, LLMEM_DTYPE_F32, (int32_t)n);
    return LLMEM_OK;
}

double hf_gemma3_embed_scale(double scale, llmem_dtype embed_dtype)
{
    /* transformers multiplies by embed_scale.to(weight dtype): sqrt(3072)
     * = 55.4256 becomes 55.5 in bf16 */
    float f = (float)scale;
    uint32_t b;
    memcpy(&b, &f, 4);
    if (embed_dtype == LLMEM_DTYPE_BF16) {
        b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u; /* round to nearest even */
    } else if (embed_dtype == LLMEM_DTYPE_F16) {
        /* scale in [1, 65504): keep 10 mantissa bits, nearest even */
        uint32_t drop = 13, half = 1u << (drop - 1), low = b & ((1u << drop) - 1);
        b &= ~((1u << drop) - 1);
        if (low > half || (low == half && (b >> drop) & 1u))
            b += 1u << drop;
    }
    memcpy(&f, &b, 4);
    return f;
}

llmem_status hf_gemma3_qk_norm(llmem_model *m, const layer_w *L, int32_t T, size_t off_q,
                               size_t off_k)
{
    const llmem_model_config *c = &m->cfg;
    const wt *qn = &L->w[LLMEM_W_ATTN_Q_NORM], *kn = &L->w[LLMEM_W_ATTN_K_NORM];
    float eps = (float)c->norm_eps;
    if (qn->present) { /* every head's row of head_dim normalized on its own */
        llmem_tensor q = llmem_tensor_2d(m->scratch, off_q, LLMEM_DTYPE_F32,
                                         T * c->n_heads, c->head_dim);
        llmem_status s = llmem_op_rms_norm(m->be, &q, &qn->t, eps, &q);
        if (s != LLMEM_OK)
            return s;
    }
    if (kn->present) {
        llmem_tensor k = llmem_tensor_2d(m->scratch, off_k, LLMEM_DTYPE_F32,
                                         T * c->n_kv_heads, c->head_dim);
        return llmem_op_rms_norm(m->be, &k, &kn->t, eps, &k);
    }
    return LLMEM_OK;
}

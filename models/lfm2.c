/* llmem models/: LFM2 (transformers 5.17 Lfm2ForCausalLM; Liquid AI 2025):
 * its config.json, tensor names and gated short-conv mixer.
 *
 * Block structure (Lfm2DecoderLayer):
 *   x += mixer(operator_norm(x))        mixer: short conv or attention
 *   x += w2(silu(w1(h)) * w3(h)),  h = ffn_norm(x)
 *   then embedding_norm (the final norm, despite its name) and the tied LM
 *   head. Attention applies an RMSNorm over head_dim to each query and key
 *   head (q_layernorm, k_layernorm) before RoPE (rotate_half, NEOX pairs).
 * Short conv (Lfm2ShortConv): [B | C | x] = in_proj(h); u = B * x;
 *   y = C * conv1d(u) (depthwise, conv_L_cache taps, causal, no
 *   activation); out_proj(y). The recurrent state of a layer is the last
 *   L_cache - 1 rows of u ({L - 1, hidden} f32), kept by the recurrent
 *   memory (state slots, checkpoints, snapshots) and composed with the KV
 *   cache of the attention layers by the hybrid.
 * Tensor names: model.embed_tokens, model.embedding_norm, model.layers.N.
 *   {operator_norm, ffn_norm, feed_forward.{w1,w3,w2}, conv.{in_proj,
 *   conv, out_proj} | self_attn.{q,k,v,out}_proj, self_attn.{q,k}_layernorm}.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/ops_ssm1.h"
#include "models/config_internal.h"
#include "models/hf_internal.h"
#include "models/model_internal.h"

/* ---- config.json ---------------------------------------------------------------- */

/* Layer kinds from layer_types ("conv", "full_attention") or, without it,
 * full_attn_idxs (Lfm2Config.__post_init__). */
static llmem_status lfm2_layers(cfgctx *c, llmem_model_config *m, int32_t n)
{
    static const hf_kind_name kinds[] = {{"conv", LLMEM_LAYER_SHORTCONV},
                                          {"full_attention", LLMEM_LAYER_ATTENTION}};
    int32_t kind[LLMEM_MODEL_MAX_LAYERS];
    bool listed;
    TRY(hf_cfg_layer_names(c, KEYS("layer_types"), n, "lfm2", kinds, 2, kind, &listed));
    for (int32_t i = 0; listed && i < n; i++)
        m->layers[i].kind = (llmem_layer_kind)kind[i];
    if (listed)
        return LLMEM_OK;
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c->root, "full_attn_idxs");
    if (!idx || cJSON_IsNull(idx))
        return LLMEM_OK; /* every layer a short conv */
    if (!cJSON_IsArray(idx))
        return bad(c, "'full_attn_idxs' must be an array of layer indices");
    for (const cJSON *e = idx->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
            e->valuedouble < 0 || e->valuedouble >= n)
            return bad(c, "'full_attn_idxs' holds a value that is not a layer index");
        m->layers[(int32_t)e->valuedouble].kind = LLMEM_LAYER_ATTENTION;
    }
    return LLMEM_OK;
}

llmem_status hf_cfg_parse_lfm2(cfgctx *c, llmem_model_config *m)
{
    int32_t n, ff, multiple = 256;
    bool adjust = true;
    double mult = 1.0;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_SHORTCONV, true));
    TRY(lfm2_layers(c, m, n));
    TRY(get_pos(c, c->root, KEYS("norm_eps"), 1e-5, &m->norm_eps));
    TRY(get_bool(c, KEYS("tie_word_embeddings", "tie_embedding"), true, &m->tie_word_embeddings));
    TRY(parse_attention(c, m));
    TRY(parse_rope(c, m, 1.0));
    /* Lfm2MLP: the width may be adjusted to 2/3, scaled and rounded up */
    TRY(get_int(c, KEYS("intermediate_size", "block_ff_dim"), false, 12288, 1, CFG_MAX_DIM, &ff));
    TRY(get_bool(c, KEYS("block_auto_adjust_ff_dim"), true, &adjust));
    TRY(get_int(c, KEYS("block_multiple_of"), false, 256, 1, CFG_MAX_DIM, &multiple));
    const cJSON *mj = cJSON_GetObjectItemCaseSensitive(c->root, "block_ffn_dim_multiplier");
    bool has_mult = mj && !cJSON_IsNull(mj);
    if (has_mult)
        TRY(get_pos(c, c->root, KEYS("block_ffn_dim_multiplier"), 1.0, &mult));
    if (adjust) {
        ff = (int32_t)(2 * (int64_t)ff / 3);
        if (has_mult) {
            double scaled = mult * ff;
            if (!(scaled >= 1.0 && scaled <= CFG_MAX_DIM))
                return bad(c, "block_ffn_dim_multiplier gives an FFN width out of range");
            ff = (int32_t)scaled;
            ff = (int32_t)(((int64_t)ff + multiple - 1) / multiple * multiple);
        }
    }
    if (ff < 1 || ff > CFG_MAX_DIM)
        return bad(c, "the adjusted FFN width is out of range");
    m->intermediate_size = ff;
    m->ffn_gated = true;
    m->ffn_act = LLMEM_ACT_SILU;
    TRY(get_int(c, KEYS("conv_L_cache"), false, 3, 2, 64, &m->ssm_d_conv));
    TRY(get_bool(c, KEYS("conv_bias"), false, &m->ssm_conv_bias));
    m->ssm_proj_bias = m->ssm_conv_bias; /* in_proj and out_proj share the flag */
    m->ssm_d_inner = m->ssm_conv_dim = m->hidden_size;
    m->ssm_in_proj_dim = 3 * m->hidden_size;
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

/* ---- tensor names ----------------------------------------------------------------- */

bool hf_lfm2_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                    size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims)
{
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t q = (int64_t)cfg->n_heads * cfg->head_dim;
    const int64_t kv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    const char *pre = cfg->tensor_prefix, *leaf = NULL;
    if (w == LLMEM_W_EMBED || w == LLMEM_W_FINAL_NORM || w == LLMEM_W_LM_HEAD)
        return hf_global_weight(cfg, w, "embedding_norm.weight", buf, buf_len, shape, n_dims);
    bool attn = cfg->layers[layer].kind == LLMEM_LAYER_ATTENTION;
    bool bias = cfg->ssm_proj_bias;
    switch (w) {
    case LLMEM_W_MIXER_NORM: leaf = "operator_norm.weight"; hf_shape(shape, n_dims, 1, H, 0, 0); break;
    case LLMEM_W_FFN_NORM: leaf = "ffn_norm.weight"; hf_shape(shape, n_dims, 1, H, 0, 0); break;
    case LLMEM_W_FFN_GATE: leaf = "feed_forward.w1.weight"; hf_shape(shape, n_dims, 2, I, H, 0); break;
    case LLMEM_W_FFN_UP: leaf = "feed_forward.w3.weight"; hf_shape(shape, n_dims, 2, I, H, 0); break;
    case LLMEM_W_FFN_DOWN: leaf = "feed_forward.w2.weight"; hf_shape(shape, n_dims, 2, H, I, 0); break;
    case LLMEM_W_ATTN_Q: case LLMEM_W_ATTN_K: case LLMEM_W_ATTN_V: case LLMEM_W_ATTN_O:
        if (!attn)
            return false;
        leaf = w == LLMEM_W_ATTN_Q ? "self_attn.q_proj.weight"
               : w == LLMEM_W_ATTN_K ? "self_attn.k_proj.weight"
               : w == LLMEM_W_ATTN_V ? "self_attn.v_proj.weight" : "self_attn.out_proj.weight";
        if (w == LLMEM_W_ATTN_O)
            hf_shape(shape, n_dims, 2, H, q, 0);
        else
            hf_shape(shape, n_dims, 2, w == LLMEM_W_ATTN_Q ? q : kv, H, 0);
        break;
    case LLMEM_W_ATTN_Q_NORM: case LLMEM_W_ATTN_K_NORM:
        if (!attn)
            return false;
        leaf = w == LLMEM_W_ATTN_Q_NORM ? "self_attn.q_layernorm.weight"
                                        : "self_attn.k_layernorm.weight";
        hf_shape(shape, n_dims, 1, cfg->head_dim, 0, 0);
        break;
    case LLMEM_W_SSM_IN: case LLMEM_W_SSM_IN_BIAS:
        if (attn || (w == LLMEM_W_SSM_IN_BIAS && !bias))
            return false;
        leaf = w == LLMEM_W_SSM_IN ? "conv.in_proj.weight" : "conv.in_proj.bias";
        if (w == LLMEM_W_SSM_IN)
            hf_shape(shape, n_dims, 2, 3 * H, H, 0);
        else
            hf_shape(shape, n_dims, 1, 3 * H, 0, 0);
        break;
    case LLMEM_W_SSM_CONV: case LLMEM_W_SSM_CONV_BIAS:
        if (attn || (w == LLMEM_W_SSM_CONV_BIAS && !cfg->ssm_conv_bias))
            return false;
        leaf = w == LLMEM_W_SSM_CONV ? "conv.conv.weight" : "conv.conv.bias";
        if (w == LLMEM_W_SSM_CONV)
            hf_shape(shape, n_dims, 3, H, 1, cfg->ssm_d_conv);
        else
            hf_shape(shape, n_dims, 1, H, 0, 0);
        break;
    case LLMEM_W_SSM_OUT: case LLMEM_W_SSM_OUT_BIAS:
        if (attn || (w == LLMEM_W_SSM_OUT_BIAS && !bias))
            return false;
        leaf = w == LLMEM_W_SSM_OUT ? "conv.out_proj.weight" : "conv.out_proj.bias";
        if (w == LLMEM_W_SSM_OUT)
            hf_shape(shape, n_dims, 2, H, H, 0);
        else
            hf_shape(shape, n_dims, 1, H, 0, 0);
        break;
    default:
        return false;
    }
    return hf_layer_name(buf, buf_len, pre, layer, leaf);
}

/* ---- forward --------------------------------------------------------------------------- */

llmem_status hf_lfm2_shortconv(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v)
{
    const llmem_model_config *c = &m->cfg;
    int32_t D = c->hidden_size;
    llmem_tensor h = llmem_tensor_2d(m->scratch, m->off_h, LLMEM_DTYPE_F32, T, D);
    llmem_tensor bcx = llmem_tensor_2d(m->scratch, m->off_a, LLMEM_DTYPE_F32, T, 3 * D);
    llmem_tensor y = llmem_tensor_2d(m->scratch, m->off_b, LLMEM_DTYPE_F32, T, D);
    const wt *ib = &L->w[LLMEM_W_SSM_IN_BIAS], *cb = &L->w[LLMEM_W_SSM_CONV_BIAS];
    const wt *ob = &L->w[LLMEM_W_SSM_OUT_BIAS];
    TRY(hf_matmul(m, &h, &L->w[LLMEM_W_SSM_IN].t, &bcx));
    if (ib->present)
        TRY(llmem_op_add(m->be, &bcx, &ib->t, &bcx));
    TRY(llmem_op_short_conv(m->be, v, 0, &bcx, &L->w[LLMEM_W_SSM_CONV].t,
                            cb->present ? &cb->t : NULL, &y));
    TRY(hf_matmul(m, &y, &L->w[LLMEM_W_SSM_OUT].t, &h));
    if (ob->present)
        TRY(llmem_op_add(m->be, &h, &ob->t, &h));
    return LLMEM_OK;
}

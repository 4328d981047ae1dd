/* llmem models/: Jamba (transformers 5.17 JambaForCausalLM; Lieber et al.
 * 2024, "Jamba: A Hybrid Transformer-Mamba Language Model"): its
 * config.json, tensor names and Mamba-1 mixer.
 *
 * Block structure (JambaMambaDecoderLayer, JambaAttentionDecoderLayer):
 *   x += mixer(input_layernorm(x))      Mamba-1, or attention without RoPE
 *   x += ffn(pre_ff_layernorm(x))       SwiGLU MLP, or a routed MoE on the
 *                                       expert layers (softmax over all
 *                                       router logits, top-k, weights not
 *                                       renormalized: JambaSparseMoeBlock)
 *   then final_layernorm and lm_head. Layer i is attention when
 *   i % attn_layer_period == attn_layer_offset, an expert layer when
 *   i % expert_layer_period == expert_layer_offset and num_experts > 1.
 * Mamba-1 mixer (JambaMambaMixer, Gu & Dao 2023):
 *   [x | z] = in_proj(h); x = silu(conv1d(x)) with the conv state;
 *   [dt | B | C] = x_proj(x), each through its own RMSNorm (dt_layernorm,
 *   b_layernorm, c_layernorm); dt = dt_proj.weight · dt (its bias goes into
 *   the scan's softplus); y = selective_scan(x, dt, A = -exp(A_log), B, C,
 *   D) * silu(z) with the ssm state; out_proj(y).
 * States per Mamba layer: conv {d_conv - 1, d_inner} and ssm {d_inner,
 * d_state}, f32 (the ssm state in the model's ssm_dtype).
 * Tensor names: model.embed_tokens, model.final_layernorm, lm_head,
 *   model.layers.N.{input_layernorm, pre_ff_layernorm, mamba.{in_proj,
 *   conv1d, x_proj, dt_proj, A_log, D, out_proj, dt_layernorm, b_layernorm,
 *   c_layernorm} | self_attn.{q,k,v,o}_proj, feed_forward.{gate,up,down}_proj
 *   | feed_forward.router, feed_forward.experts.E.{gate,up,down}_proj}.
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

llmem_status hf_cfg_parse_jamba(cfgctx *c, llmem_model_config *m)
{
    int32_t n, ap, ao, ep, eo, expand, n_exp, rank = 0;
    llmem_activation act;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_MAMBA1, true));
    TRY(get_int(c, KEYS("attn_layer_period"), false, 8, 1, INT32_MAX, &ap));
    TRY(get_int(c, KEYS("attn_layer_offset"), false, 4, 0, INT32_MAX, &ao));
    TRY(get_int(c, KEYS("expert_layer_period"), false, 2, 1, INT32_MAX, &ep));
    TRY(get_int(c, KEYS("expert_layer_offset"), false, 1, 0, INT32_MAX, &eo));
    if (ao >= ap || eo >= ep)
        return bad(c, "attn_layer_offset and expert_layer_offset must be smaller than their "
                   "periods");
    TRY(get_int(c, KEYS("num_experts"), false, 16, 1, 1 << 16, &n_exp));
    for (int32_t i = 0; i < n; i++) {
        if (i % ap == ao)
            m->layers[i].kind = LLMEM_LAYER_ATTENTION;
        m->layers[i].ffn_moe = n_exp > 1 && i % ep == eo;
    }
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-6, &m->norm_eps));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    m->ffn_act = act;
    TRY(parse_ffn(c, m, true));
    TRY(parse_attention(c, m));
    m->use_rope = false; /* JambaAttention has no positional encoding */
    TRY(get_int(c, KEYS("mamba_d_state"), false, 16, 1, 1 << 12, &m->ssm_d_state));
    TRY(get_int(c, KEYS("mamba_d_conv"), false, 4, 2, 64, &m->ssm_d_conv));
    TRY(get_int(c, KEYS("mamba_expand"), false, 2, 1, 1 << 10, &expand));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c->root, "mamba_dt_rank");
    if (!r || cJSON_IsNull(r) || (cJSON_IsString(r) && !strcmp(r->valuestring, "auto")))
        rank = (m->hidden_size + 15) / 16; /* math.ceil(hidden_size / 16) */
    else
        TRY(get_int(c, KEYS("mamba_dt_rank"), true, 0, 1, CFG_MAX_DIM, &rank));
    m->ssm_dt_rank = rank;
    TRY(get_bool(c, KEYS("mamba_conv_bias"), true, &m->ssm_conv_bias));
    TRY(get_bool(c, KEYS("mamba_proj_bias"), false, &m->ssm_proj_bias));
    if ((int64_t)expand * m->hidden_size > CFG_MAX_DIM)
        return bad(c, "mamba_expand * hidden_size is too large");
    m->ssm_d_inner = m->ssm_conv_dim = expand * m->hidden_size;
    m->ssm_in_proj_dim = 2 * m->ssm_d_inner;
    /* routed experts: JambaSparseMoeBlock */
    m->n_expert = n_exp > 1 ? n_exp : 0;
    TRY(get_int(c, KEYS("num_experts_per_tok"), false, 2, 1, 1 << 16, &m->n_expert_used));
    if (m->n_expert == 0)
        m->n_expert_used = 0;
    m->moe_intermediate_size = m->intermediate_size;
    m->moe_gated = true;
    m->moe_split_experts = true;
    m->moe_routed_scale = 1.0;
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

/* ---- tensor names ----------------------------------------------------------------- */

bool hf_jamba_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                     size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims)
{
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t q = (int64_t)cfg->n_heads * cfg->head_dim;
    const int64_t kv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    const int64_t din = cfg->ssm_d_inner, N = cfg->ssm_d_state, R = cfg->ssm_dt_rank;
    const char *pre = cfg->tensor_prefix, *leaf = NULL;
    if (w == LLMEM_W_EMBED || w == LLMEM_W_FINAL_NORM || w == LLMEM_W_LM_HEAD)
        return hf_global_weight(cfg, w, "final_layernorm.weight", buf, buf_len, shape, n_dims);
    const llmem_layer_config *L = &cfg->layers[layer];
    bool attn = L->kind == LLMEM_LAYER_ATTENTION, ssm = L->kind == LLMEM_LAYER_MAMBA1;
    if (w >= LLMEM_W_MOE_ROUTER && w <= LLMEM_W_SHARED_DOWN)
        return hf_moe_weight(cfg, w, layer, buf, buf_len, shape, n_dims);
    switch (w) {
    case LLMEM_W_MIXER_NORM: leaf = "input_layernorm.weight"; hf_shape(shape, n_dims, 1, H, 0, 0); break;
    case LLMEM_W_FFN_NORM: leaf = "pre_ff_layernorm.weight"; hf_shape(shape, n_dims, 1, H, 0, 0); break;
    case LLMEM_W_FFN_GATE: case LLMEM_W_FFN_UP: case LLMEM_W_FFN_DOWN:
        if (L->ffn_moe)
            return false;
        leaf = w == LLMEM_W_FFN_GATE ? "feed_forward.gate_proj.weight"
               : w == LLMEM_W_FFN_UP ? "feed_forward.up_proj.weight"
                                     : "feed_forward.down_proj.weight";
        if (w == LLMEM_W_FFN_DOWN)
            hf_shape(shape, n_dims, 2, H, I, 0);
        else
            hf_shape(shape, n_dims, 2, I, H, 0);
        break;
    case LLMEM_W_ATTN_Q: case LLMEM_W_ATTN_K: case LLMEM_W_ATTN_V: case LLMEM_W_ATTN_O:
        if (!attn)
            return false;
        leaf = w == LLMEM_W_ATTN_Q ? "self_attn.q_proj.weight"
               : w == LLMEM_W_ATTN_K ? "self_attn.k_proj.weight"
               : w == LLMEM_W_ATTN_V ? "self_attn.v_proj.weight" : "self_attn.o_proj.weight";
        if (w == LLMEM_W_ATTN_O)
            hf_shape(shape, n_dims, 2, H, q, 0);
        else
            hf_shape(shape, n_dims, 2, w == LLMEM_W_ATTN_Q ? q : kv, H, 0);
        break;
    case LLMEM_W_SSM_IN: leaf = "mamba.in_proj.weight"; hf_shape(shape, n_dims, 2, 2 * din, H, 0); break;
    case LLMEM_W_SSM_IN_BIAS:
        if (!cfg->ssm_proj_bias)
            return false;
        leaf = "mamba.in_proj.bias";
        hf_shape(shape, n_dims, 1, 2 * din, 0, 0);
        break;
    case LLMEM_W_SSM_CONV: leaf = "mamba.conv1d.weight"; hf_shape(shape, n_dims, 3, din, 1, cfg->ssm_d_conv); break;
    case LLMEM_W_SSM_CONV_BIAS:
        if (!cfg->ssm_conv_bias)
            return false;
        leaf = "mamba.conv1d.bias";
        hf_shape(shape, n_dims, 1, din, 0, 0);
        break;
    case LLMEM_W_SSM_X_PROJ: leaf = "mamba.x_proj.weight"; hf_shape(shape, n_dims, 2, R + 2 * N, din, 0); break;
    case LLMEM_W_SSM_DT_PROJ: leaf = "mamba.dt_proj.weight"; hf_shape(shape, n_dims, 2, din, R, 0); break;
    case LLMEM_W_SSM_DT_BIAS: leaf = "mamba.dt_proj.bias"; hf_shape(shape, n_dims, 1, din, 0, 0); break;
    case LLMEM_W_SSM_A_LOG: leaf = "mamba.A_log"; hf_shape(shape, n_dims, 2, din, N, 0); break;
    case LLMEM_W_SSM_D: leaf = "mamba.D"; hf_shape(shape, n_dims, 1, din, 0, 0); break;
    case LLMEM_W_SSM_DT_NORM: leaf = "mamba.dt_layernorm.weight"; hf_shape(shape, n_dims, 1, R, 0, 0); break;
    case LLMEM_W_SSM_B_NORM: leaf = "mamba.b_layernorm.weight"; hf_shape(shape, n_dims, 1, N, 0, 0); break;
    case LLMEM_W_SSM_C_NORM: leaf = "mamba.c_layernorm.weight"; hf_shape(shape, n_dims, 1, N, 0, 0); break;
    case LLMEM_W_SSM_OUT: leaf = "mamba.out_proj.weight"; hf_shape(shape, n_dims, 2, H, din, 0); break;
    case LLMEM_W_SSM_OUT_BIAS:
        if (!cfg->ssm_proj_bias)
            return false;
        leaf = "mamba.out_proj.bias";
        hf_shape(shape, n_dims, 1, H, 0, 0);
        break;
    default:
        return false;
    }
    /* the mamba.* weights exist in Mamba layers only */
    if (!strncmp(leaf, "mamba.", 6) && !ssm)
        return false;
    return hf_layer_name(buf, buf_len, pre, layer, leaf);
}

/* ---- forward --------------------------------------------------------------------------- */

/* h (normalized input) -> h. Scratch (models/runtime.c alloc_scratch):
 * a [T, 2 d_inner] holds in_proj's [x | z], later dt and y; c the conv
 * input x, e the gate z, b the conv output; d x_proj's output and its
 * three parts (width_d >= 2 * (dt_rank + 2 d_state)). */
llmem_status hf_jamba_mamba(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v)
{
    const llmem_model_config *c = &m->cfg;
    int32_t din = c->ssm_d_inner, N = c->ssm_d_state, R = c->ssm_dt_rank, P = R + 2 * N;
    float eps = (float)c->norm_eps;
    llmem_buffer *s = m->scratch;
    size_t T4 = (size_t)T * 4;
    llmem_tensor h = llmem_tensor_2d(s, m->off_h, LLMEM_DTYPE_F32, T, c->hidden_size);
    llmem_tensor xz = llmem_tensor_2d(s, m->off_a, LLMEM_DTYPE_F32, T, 2 * din);
    llmem_tensor xin = llmem_tensor_2d(s, m->off_c, LLMEM_DTYPE_F32, T, din);
    llmem_tensor z = llmem_tensor_2d(s, m->off_e, LLMEM_DTYPE_F32, T, din);
    llmem_tensor xc = llmem_tensor_2d(s, m->off_b, LLMEM_DTYPE_F32, T, din);
    llmem_tensor xp = llmem_tensor_2d(s, m->off_d, LLMEM_DTYPE_F32, T, P);
    llmem_tensor dtin = llmem_tensor_2d(s, m->off_d + T4 * (size_t)P, LLMEM_DTYPE_F32, T, R);
    llmem_tensor B = llmem_tensor_2d(s, m->off_d + T4 * (size_t)(P + R), LLMEM_DTYPE_F32, T, N);
    llmem_tensor C = llmem_tensor_2d(s, m->off_d + T4 * (size_t)(P + R + N), LLMEM_DTYPE_F32, T, N);
    llmem_tensor dt = llmem_tensor_2d(s, m->off_a, LLMEM_DTYPE_F32, T, din);
    llmem_tensor y = llmem_tensor_2d(s, m->off_a + T4 * (size_t)din, LLMEM_DTYPE_F32, T, din);
    const wt *ib = &L->w[LLMEM_W_SSM_IN_BIAS], *cb = &L->w[LLMEM_W_SSM_CONV_BIAS];
    const wt *ob = &L->w[LLMEM_W_SSM_OUT_BIAS], *D = &L->w[LLMEM_W_SSM_D];
    TRY(hf_matmul(m, &h, &L->w[LLMEM_W_SSM_IN].t, &xz));
    if (ib->present)
        TRY(llmem_op_add(m->be, &xz, &ib->t, &xz));
    TRY(llmem_op_copy(m->be, &xz, 0, &xin));
    TRY(llmem_op_copy(m->be, &xz, din, &z));
    TRY(llmem_op_ssm_conv(m->be, v, 0, &xin, &L->w[LLMEM_W_SSM_CONV].t,
                          cb->present ? &cb->t : NULL, &xc));
    TRY(hf_matmul(m, &xc, &L->w[LLMEM_W_SSM_X_PROJ].t, &xp));
    TRY(llmem_op_copy(m->be, &xp, 0, &dtin));
    TRY(llmem_op_copy(m->be, &xp, R, &B));
    TRY(llmem_op_copy(m->be, &xp, R + N, &C));
    TRY(llmem_op_rms_norm(m->be, &dtin, &L->w[LLMEM_W_SSM_DT_NORM].t, eps, &dtin));
    TRY(llmem_op_rms_norm(m->be, &B, &L->w[LLMEM_W_SSM_B_NORM].t, eps, &B));
    TRY(llmem_op_rms_norm(m->be, &C, &L->w[LLMEM_W_SSM_C_NORM].t, eps, &C));
    TRY(hf_matmul(m, &dtin, &L->w[LLMEM_W_SSM_DT_PROJ].t, &dt));
    llmem_ssm1_params sp = {.d_inner = din, .d_state = N};
    TRY(llmem_op_ssm_scan1(m->be, &sp, v, 1, &xc, &dt, &B, &C, &L->w[LLMEM_W_SSM_A_LOG].t,
                           D->present ? &D->t : NULL, &L->w[LLMEM_W_SSM_DT_BIAS].t, &z, &y));
    TRY(hf_matmul(m, &y, &L->w[LLMEM_W_SSM_OUT].t, &h));
    if (ob->present)
        TRY(llmem_op_add(m->be, &h, &ob->t, &h));
    return LLMEM_OK;
}

/* llmem models/: config.json of the mixture-of-experts and muP families:
 * nemotron_h's MoE keys (transformers NemotronHConfig: n_routed_experts,
 * n_group, topk_group, routed_scaling_factor, ...), granitemoehybrid
 * (GraniteMoeHybridConfig) and falcon_h1 (FalconH1Config). Defaults are
 * transformers 5's. Helpers: config_internal.h.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/config_internal.h"
#include "models/hf_internal.h"

/* NemotronHTopkRouter / NemotronHMoE: sigmoid scores, selection bias,
 * group-limited top-k, relu2 experts and one shared expert. */
llmem_status hf_cfg_parse_nemotron_moe(cfgctx *c, llmem_model_config *m)
{
    bool moe = false;
    for (int32_t i = 0; i < m->n_layers; i++)
        moe |= m->layers[i].kind == LLMEM_LAYER_MOE;
    if (!moe)
        return LLMEM_OK;
    const cJSON *lat = cJSON_GetObjectItemCaseSensitive(c->root, "moe_latent_size");
    if (lat && !cJSON_IsNull(lat)) {
        llmem_errf(c->err, c->err_len, "%s: 'moe_latent_size' (latent MoE projections) is not "
                "supported", c->src);
        return LLMEM_E_UNSUPPORTED;
    }
    TRY(get_int(c, KEYS("n_routed_experts", "num_local_experts"), false, 8, 1, 1 << 16,
                &m->n_expert));
    TRY(get_int(c, KEYS("num_experts_per_tok"), false, 2, 1, 1 << 16, &m->n_expert_used));
    TRY(get_int(c, KEYS("moe_intermediate_size"), false, 7688, 1, CFG_MAX_DIM,
                &m->moe_intermediate_size));
    TRY(get_int(c, KEYS("moe_shared_expert_intermediate_size"), false, 7688, 1, CFG_MAX_DIM,
                &m->moe_shared_intermediate_size));
    TRY(get_int(c, KEYS("n_group"), false, 1, 1, 1 << 16, &m->moe_n_group));
    TRY(get_int(c, KEYS("topk_group"), false, 1, 1, 1 << 16, &m->moe_topk_group));
    TRY(get_pos(c, c->root, KEYS("routed_scaling_factor"), 1.0, &m->moe_routed_scale));
    TRY(get_bool(c, KEYS("norm_topk_prob"), true, &m->moe_norm_topk));
    m->moe_sigmoid = true;
    m->moe_router_bias = true;
    m->moe_split_experts = true;
    m->moe_gated = false;
    return LLMEM_OK;
}

/* GraniteMoeHybridConfig: bamba's Mamba-2 keys, a shared SwiGLU MLP in every
 * layer plus num_local_experts routed experts (softmax over the top-k
 * logits), optional RoPE, and the four multipliers. */
llmem_status hf_cfg_parse_granite(cfgctx *c, llmem_model_config *m)
{
    int32_t n;
    llmem_activation act;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_MAMBA2, true));
    static const hf_kind_name kinds[] = {
        {"mamba", LLMEM_LAYER_MAMBA2}, {"linear_attention", LLMEM_LAYER_MAMBA2},
        {"attention", LLMEM_LAYER_ATTENTION}, {"full_attention", LLMEM_LAYER_ATTENTION}};
    int32_t kind[LLMEM_MODEL_MAX_LAYERS];
    bool listed;
    TRY(hf_cfg_layer_names(c, KEYS("layer_types", "layers_block_type"), n, "granitemoehybrid",
                           kinds, 4, kind, &listed));
    for (int32_t i = 0; listed && i < n; i++)
        m->layers[i].kind = (llmem_layer_kind)kind[i];
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-6, &m->norm_eps));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    m->ffn_act = act;
    TRY(parse_ssm(c, m, &hf_cfg_bamba_ssm_keys));
    TRY(parse_attention(c, m));
    const char *pe;
    TRY(get_str(c, KEYS("position_embedding_type"), false, "nope", &pe));
    if (!strcmp(pe, "rope")) {
        TRY(parse_rope(c, m, 1.0));
    } else if (strcmp(pe, "nope") != 0) {
        llmem_errf(c->err, c->err_len, "%s: position_embedding_type '%.40s' is not supported "
                "(rope, nope)", c->src, pe);
        return LLMEM_E_UNSUPPORTED;
    }
    TRY(get_int(c, KEYS("num_local_experts"), false, 8, 0, 1 << 16, &m->n_expert));
    TRY(get_int(c, KEYS("num_experts_per_tok"), false, 2, 1, 1 << 16, &m->n_expert_used));
    TRY(get_int(c, KEYS("intermediate_size"), false, 11008, 1, CFG_MAX_DIM,
                &m->moe_intermediate_size));
    TRY(get_int(c, KEYS("shared_intermediate_size"), false, 1024, 1, CFG_MAX_DIM,
                &m->moe_shared_intermediate_size));
    if (m->n_expert == 0)
        m->n_expert_used = 0;
    m->moe_gated = true;
    m->moe_norm_topk = true; /* softmax over the top-k logits */
    m->moe_routed_scale = 1.0;
    TRY(get_pos(c, c->root, KEYS("embedding_multiplier"), 1.0, &m->embedding_multiplier));
    TRY(get_pos(c, c->root, KEYS("residual_multiplier"), 1.0, &m->residual_multiplier));
    TRY(get_pos(c, c->root, KEYS("attention_multiplier"), 1.0, &m->attention_scale));
    TRY(get_pos(c, c->root, KEYS("logits_scaling"), 1.0, &m->logits_scaling));
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

/* FalconH1Config: every layer runs attention and Mamba-2 side by side on
 * the same normed input, then a SwiGLU MLP; muP multipliers everywhere. */
llmem_status hf_cfg_parse_falcon_h1(cfgctx *c, llmem_model_config *m)
{
    int32_t n;
    llmem_activation act;
    bool rms = false, bias = false;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_PARALLEL, true));
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-5, &m->norm_eps));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    m->ffn_act = act;
    TRY(parse_ffn(c, m, true));
    TRY(parse_ssm(c, m, &hf_cfg_bamba_ssm_keys));
    TRY(parse_attention(c, m));
    TRY(parse_rope(c, m, 1.0));
    TRY(get_bool(c, KEYS("mamba_rms_norm"), false, &rms));
    TRY(get_bool(c, KEYS("projectors_bias"), false, &bias));
    if (rms || bias || m->ssm_proj_bias) {
        llmem_errf(c->err, c->err_len, "%s: falcon_h1 with %s is not supported", c->src,
                   rms ? "mamba_rms_norm" : bias ? "projectors_bias" : "mamba_proj_bias");
        return LLMEM_E_UNSUPPORTED;
    }
    m->ssm_gate_only = true;
    const struct { const char *key; double *v; } mult[] = {
        {"embedding_multiplier", &m->embedding_multiplier},
        {"key_multiplier", &m->key_multiplier},
        {"attention_in_multiplier", &m->attention_in_multiplier},
        {"attention_out_multiplier", &m->attention_out_multiplier},
        {"ssm_in_multiplier", &m->ssm_in_multiplier},
        {"ssm_out_multiplier", &m->ssm_out_multiplier}};
    for (size_t i = 0; i < sizeof mult / sizeof mult[0]; i++)
        TRY(get_finite(c, c->root, KEYS(mult[i].key), 1.0, mult[i].v));
    double lm = 1.0;
    TRY(get_pos(c, c->root, KEYS("lm_head_multiplier"), 1.0, &lm));
    m->logits_scaling = 1.0 / lm;
    const char *lists[2] = {"mlp_multipliers", "ssm_multipliers"};
    double *dst[2] = {NULL, m->ssm_multipliers};
    double mlp[2] = {1.0, 1.0};
    dst[0] = mlp;
    for (int l = 0; l < 2; l++) {
        int want = l ? 5 : 2;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->root, lists[l]);
        if (!a || cJSON_IsNull(a))
            continue;
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != want) {
            llmem_errf(c->err, c->err_len, "%s: '%s' must be an array of %d numbers", c->src,
                       lists[l], want);
            return LLMEM_E_CORRUPT;
        }
        for (int i = 0; i < want; i++)
            if (!json_num(cJSON_GetArrayItem(a, i), &dst[l][i]) || !(fabs(dst[l][i]) <= FLT_MAX))
                return bad(c, "multiplier lists must hold finite numbers in f32's range");
    }
    m->mlp_gate_multiplier = mlp[0];
    m->mlp_down_multiplier = mlp[1];
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

/* Routing sizes every MoE model must satisfy (llmem_op_moe_route's rules). */
llmem_status hf_cfg_check_moe(cfgctx *c, const llmem_model_config *m)
{
    if (m->n_expert == 0)
        return LLMEM_OK;
    if (m->arch == LLMEM_ARCH_NEMOTRON_H && m->mlp_bias) {
        llmem_errf(c->err, c->err_len, "%s: MoE layers with mlp_bias are not supported", c->src);
        return LLMEM_E_UNSUPPORTED;
    }
    if (m->n_expert_used > m->n_expert)
        return bad(c, "num_experts_per_tok is larger than the number of experts");
    if (m->moe_n_group > 1) {
        int32_t gs = m->n_expert / m->moe_n_group;
        if (m->n_expert % m->moe_n_group || gs < 2 || m->moe_topk_group > m->moe_n_group ||
            (int64_t)m->moe_topk_group * gs < m->n_expert_used)
            return bad(c, "n_group / topk_group do not fit the experts (n_group must divide "
                       "them into groups of >= 2, topk_group <= n_group, and the kept groups "
                       "must hold num_experts_per_tok experts)");
    }
    return LLMEM_OK;
}


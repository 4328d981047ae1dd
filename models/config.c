/* llmem models/: config.json parsing for llama, mamba2, bamba, nemotron_h
 * (with MoE layers) and granitemoehybrid.
 *
 * Key names, defaults and derived sizes follow transformers 5's
 * configuration_{llama,mamba2,bamba,nemotron_h}.py and the modules that read
 * them (modeling_*.py); the classic spellings written by transformers 4
 * (rope_theta, hybrid_override_pattern, the mamba_* names of nemotron_h)
 * are read too. A key whose value is JSON null counts as absent.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "llmem/model.h"
#include "models/config_internal.h"
#include "models/hf_internal.h"

#define CFG_MAX_FILE ((size_t)16 * 1024 * 1024)


static const char *arch_names[LLMEM_ARCH_COUNT] = {"llama", "mamba2", "bamba", "nemotron_h",
                                                   "granitemoehybrid", "falcon_h1",
                                                   "qwen3_next", "gemma3_text", "lfm2", "jamba"};

const char *llmem_arch_name(llmem_arch a)
{
    return (unsigned)a < LLMEM_ARCH_COUNT ? arch_names[a] : "?";
}

const char *llmem_layer_kind_name(llmem_layer_kind k)
{
    static const char *names[LLMEM_LAYER_KIND_COUNT] = {"attention", "mamba2", "mlp", "moe",
                                                         "parallel", "gdn", "shortconv",
                                                         "mamba1"};
    return (unsigned)k < LLMEM_LAYER_KIND_COUNT ? names[k] : "?";
}

static const char *json_type(const cJSON *v)
{
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}

/* The first of the NULL-terminated key names present (and not null) in obj;
 * *which gets its name. */
const cJSON *find_any(const cJSON *obj, const char *const *keys, const char **which)
{
    for (; *keys; keys++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, *keys);
        if (v && !cJSON_IsNull(v)) {
            if (which)
                *which = *keys;
            return v;
        }
    }
    return NULL;
}


static llmem_status missing(cfgctx *c, const char *const *keys)
{
    if (keys[1])
        llmem_errf(c->err, c->err_len, "%s: missing key '%s' (or '%s')", c->src, keys[0], keys[1]);
    else
        llmem_errf(c->err, c->err_len, "%s: missing key '%s'", c->src, keys[0]);
    return LLMEM_E_CORRUPT;
}

/* Integer in [lo, hi]; `def` when absent unless `required`. */
llmem_status get_int(cfgctx *c, const char *const *keys, bool required, int32_t def,
                            int32_t lo, int32_t hi, int32_t *out)
{
    const char *k = keys[0];
    const cJSON *v = find_any(c->root, keys, &k);
    if (!v) {
        if (required)
            return missing(c, keys);
        *out = def;
        return LLMEM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be an integer, got %s", c->src, k,
                cJSON_IsNumber(v) ? "a fraction" : json_type(v));
        return LLMEM_E_CORRUPT;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        llmem_errf(c->err, c->err_len, "%s: '%s' is %.17g, outside [%d, %d]", c->src, k,
                v->valuedouble, lo, hi);
        return LLMEM_E_CORRUPT;
    }
    *out = (int32_t)v->valuedouble;
    return LLMEM_OK;
}

/* A JSON number, or transformers 5's {"__float__": "Infinity" | "-Infinity" | "NaN"}. */
bool json_num(const cJSON *v, double *out)
{
    if (cJSON_IsNumber(v)) {
        *out = v->valuedouble;
        return true;
    }
    const cJSON *f = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "__float__") : NULL;
    if (!cJSON_IsString(f))
        return false;
    if (strcmp(f->valuestring, "Infinity") == 0)
        *out = INFINITY;
    else if (strcmp(f->valuestring, "-Infinity") == 0)
        *out = -INFINITY;
    else if (strcmp(f->valuestring, "NaN") == 0)
        *out = NAN;
    else
        return false;
    return true;
}

llmem_status get_num_in(cfgctx *c, const cJSON *obj, const char *const *keys,
                               bool required, double def, double *out)
{
    const char *k = keys[0];
    const cJSON *v = obj ? find_any(obj, keys, &k) : NULL;
    if (!v) {
        if (required)
            return missing(c, keys);
        *out = def;
        return LLMEM_OK;
    }
    if (!json_num(v, out)) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be a number, got %s", c->src, k,
                json_type(v));
        return LLMEM_E_CORRUPT;
    }
    return LLMEM_OK;
}

/* A finite number >= 0 (the dt initialisation values). transformers
 * stores Infinity and NaN as {"__float__": ...}; neither is a valid dt. */
static llmem_status get_finite_nonneg(cfgctx *c, const char *const *keys, double def,
                                      double *out)
{
    const char *k = keys[0];
    find_any(c->root, keys, &k);
    llmem_status s = get_num_in(c, c->root, keys, false, def, out);
    if (s == LLMEM_OK && !(*out >= 0 && isfinite(*out))) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be a finite number >= 0, got %g", c->src,
                   k, *out);
        return LLMEM_E_CORRUPT;
    }
    return s;
}

/* A number > 0 that f32 holds as a normal number, [FLT_MIN, FLT_MAX]: the
 * forward pass computes in f32, where a larger one is infinity (an
 * rms_norm_eps of 1e305 made every norm 0) and a smaller one 0 or
 * denormal. */
llmem_status get_pos(cfgctx *c, const cJSON *obj, const char *const *keys, double def,
                            double *out)
{
    llmem_status s = get_num_in(c, obj, keys, false, def, out);
    if (s == LLMEM_OK && !(*out >= FLT_MIN && *out <= FLT_MAX)) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be a positive number in f32's range "
                   "[%g, %g], got %g", c->src, keys[0], FLT_MIN, FLT_MAX, *out);
        return LLMEM_E_CORRUPT;
    }
    return s;
}

/* A number f32 holds, |x| <= FLT_MAX (a scale factor, any sign). */
llmem_status get_finite(cfgctx *c, const cJSON *obj, const char *const *keys, double def,
                        double *out)
{
    llmem_status s = get_num_in(c, obj, keys, false, def, out);
    if (s == LLMEM_OK && !(fabs(*out) <= FLT_MAX)) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be a finite number in f32's range, got %g",
                   c->src, keys[0], *out);
        return LLMEM_E_CORRUPT;
    }
    return s;
}

llmem_status get_bool(cfgctx *c, const char *const *keys, bool def, bool *out)
{
    const char *k = keys[0];
    const cJSON *v = find_any(c->root, keys, &k);
    if (!v) {
        *out = def;
        return LLMEM_OK;
    }
    if (!cJSON_IsBool(v)) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be true or false, got %s", c->src, k,
                json_type(v));
        return LLMEM_E_CORRUPT;
    }
    *out = cJSON_IsTrue(v);
    return LLMEM_OK;
}

llmem_status get_str(cfgctx *c, const char *const *keys, bool required, const char *def,
                            const char **out)
{
    const char *k = keys[0];
    const cJSON *v = find_any(c->root, keys, &k);
    if (!v) {
        if (required)
            return missing(c, keys);
        *out = def;
        return LLMEM_OK;
    }
    if (!cJSON_IsString(v)) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be a string, got %s", c->src, k,
                json_type(v));
        return LLMEM_E_CORRUPT;
    }
    *out = v->valuestring;
    return LLMEM_OK;
}

/* An activation name that must be one of `allowed` (silu and/or relu2). */
llmem_status get_act(cfgctx *c, const char *const *keys, const char *def, bool allow_relu2,
                            llmem_activation *out)
{
    const char *name;
    llmem_status s = get_str(c, keys, false, def, &name);
    if (s != LLMEM_OK)
        return s;
    if (strcmp(name, "silu") == 0 || strcmp(name, "swish") == 0) {
        *out = LLMEM_ACT_SILU;
        return LLMEM_OK;
    }
    if (allow_relu2 && strcmp(name, "relu2") == 0) {
        *out = LLMEM_ACT_RELU2;
        return LLMEM_OK;
    }
    llmem_errf(c->err, c->err_len, "%s: %s '%.40s' is not supported (llmem has %s)", c->src,
            keys[0], name, allow_relu2 ? "silu and relu2" : "silu");
    return LLMEM_E_UNSUPPORTED;
}


llmem_status bad(cfgctx *c, const char *what)
{
    llmem_errf(c->err, c->err_len, "%s: %s", c->src, what);
    return LLMEM_E_CORRUPT;
}

/* RoPE: rope_parameters (transformers 5) or rope_theta / rope_scaling (4). */
llmem_status parse_rope(cfgctx *c, llmem_model_config *m, double default_partial)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c->root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp) && !cJSON_IsObject(rp)) {
        llmem_errf(c->err, c->err_len, "%s: 'rope_parameters' must be an object, got %s", c->src,
                json_type(rp));
        return LLMEM_E_CORRUPT;
    }
    if (!cJSON_IsObject(rp))
        rp = NULL;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->root, "rope_scaling");
    const char *type = "default";
    const cJSON *src[2] = {rp, cJSON_IsObject(rs) ? rs : NULL};
    for (int i = 1; i >= 0; i--) {
        const cJSON *t = src[i] ? find_any(src[i], KEYS("rope_type", "type"), NULL) : NULL;
        if (t && !cJSON_IsString(t))
            return bad(c, "'rope_type' must be a string");
        if (t)
            type = t->valuestring;
    }
    if (strcmp(type, "default") != 0) {
        llmem_errf(c->err, c->err_len, "%s: rope_type '%.40s' is not supported (only 'default')",
                c->src, type);
        return LLMEM_E_UNSUPPORTED;
    }
    double theta = 10000.0, partial = default_partial;
    TRY(get_pos(c, c->root, KEYS("rope_theta"), theta, &theta));
    TRY(get_pos(c, c->root, KEYS("partial_rotary_factor"), partial, &partial));
    if (rp) {
        TRY(get_pos(c, rp, KEYS("rope_theta"), theta, &theta));
        TRY(get_pos(c, rp, KEYS("partial_rotary_factor"), partial, &partial));
    }
    /* partial is > 0 and finite (get_pos); above 1 it is refused before the
     * cast, which would be undefined for a product past INT32_MAX */
    int32_t dim = partial > 1.0 ? 0 : (int32_t)(m->head_dim * partial);
    if (partial > 1.0 || dim < 2 || dim % 2) {
        llmem_errf(c->err, c->err_len, "%s: partial_rotary_factor %g of head_dim %d gives %d "
                "rotary dimensions (must be even, >= 2, <= head_dim)", c->src, partial,
                m->head_dim, dim);
        return LLMEM_E_CORRUPT;
    }
    m->use_rope = true;
    m->rope_theta = theta;
    m->partial_rotary_factor = partial;
    m->rope_dim = dim;
    return LLMEM_OK;
}

llmem_status parse_attention(cfgctx *c, llmem_model_config *m)
{
    TRY(get_int(c, KEYS("num_attention_heads"), true, 0, 1, 1 << 16, &m->n_heads));
    TRY(get_int(c, KEYS("num_key_value_heads"), false, m->n_heads, 1, 1 << 16, &m->n_kv_heads));
    if (m->n_heads % m->n_kv_heads)
        return bad(c, "num_attention_heads must be a multiple of num_key_value_heads");
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(c->root, "head_dim");
    if ((!hd || cJSON_IsNull(hd)) && m->hidden_size % m->n_heads)
        return bad(c, "no 'head_dim', and hidden_size is not a multiple of num_attention_heads");
    TRY(get_int(c, KEYS("head_dim"), false, m->hidden_size / m->n_heads, 1, 1 << 16,
                &m->head_dim));
    TRY(get_bool(c, KEYS("attention_bias"), false, &m->attention_bias));
    TRY(get_int(c, KEYS("max_position_embeddings"), false, 0, 0, INT32_MAX,
                &m->max_position_embeddings));
    return LLMEM_OK;
}

llmem_status parse_ffn(cfgctx *c, llmem_model_config *m, bool gated)
{
    TRY(get_int(c, KEYS("intermediate_size"), true, 0, 1, CFG_MAX_DIM, &m->intermediate_size));
    TRY(get_bool(c, KEYS("mlp_bias"), false, &m->mlp_bias));
    m->ffn_gated = gated;
    return LLMEM_OK;
}

const ssm_keys hf_cfg_bamba_ssm_keys = {
    KEYS("mamba_n_heads"), KEYS("mamba_d_head"), KEYS("mamba_d_state"),
    KEYS("mamba_n_groups"), KEYS("mamba_d_conv"), KEYS("mamba_expand"),
    KEYS("mamba_chunk_size"), KEYS("mamba_conv_bias"), KEYS("mamba_proj_bias"),
    KEYS("time_step_min"), KEYS("time_step_max"), KEYS("time_step_floor"),
    KEYS("time_step_limit"), 1, 256};

llmem_status parse_ssm(cfgctx *c, llmem_model_config *m, const ssm_keys *k)
{
    int32_t expand = 2, ssm_width = 0;
    TRY(get_int(c, k->heads, true, 0, 1, 1 << 16, &m->ssm_n_heads));
    TRY(get_int(c, k->state, true, 0, 1, 1 << 16, &m->ssm_d_state));
    TRY(get_int(c, k->groups, false, k->def_groups, 1, 1 << 16, &m->ssm_n_groups));
    TRY(get_int(c, k->conv, false, 4, 1, 1 << 10, &m->ssm_d_conv));
    TRY(get_int(c, k->expand, false, 2, 1, 1 << 10, &expand));
    TRY(get_int(c, k->chunk, false, k->def_chunk, 1, 1 << 20, &m->ssm_chunk_size));
    TRY(get_bool(c, k->conv_bias, true, &m->ssm_conv_bias));
    TRY(get_bool(c, k->proj_bias, false, &m->ssm_proj_bias));
    int64_t d_inner = (int64_t)expand * m->hidden_size;
    if (m->arch == LLMEM_ARCH_FALCON_H1) /* mamba_d_ssm overrides expand * hidden */
        TRY(get_int(c, KEYS("mamba_d_ssm"), false, (int32_t)d_inner, 1, CFG_MAX_DIM, &ssm_width));
    d_inner = ssm_width > 0 ? ssm_width : d_inner;
    if (m->arch == LLMEM_ARCH_BAMBA || m->arch == LLMEM_ARCH_GRANITEMOEHYBRID ||
        m->arch == LLMEM_ARCH_FALCON_H1) {
        /* mamba_d_head may be "auto": d_inner / n_heads. */
        const cJSON *dh = cJSON_GetObjectItemCaseSensitive(c->root, "mamba_d_head");
        if (!dh || cJSON_IsNull(dh) || (cJSON_IsString(dh) && !strcmp(dh->valuestring, "auto")))
            m->ssm_head_dim = (int32_t)(d_inner / m->ssm_n_heads);
        else
            TRY(get_int(c, k->head_dim, true, 0, 1, 1 << 16, &m->ssm_head_dim));
    } else {
        TRY(get_int(c, k->head_dim, true, 0, 1, 1 << 16, &m->ssm_head_dim));
    }
    int64_t inner = (int64_t)m->ssm_n_heads * m->ssm_head_dim;
    if (m->arch != LLMEM_ARCH_NEMOTRON_H && inner != d_inner) {
        llmem_errf(c->err, c->err_len, "%s: mamba heads x head_dim = %lld, but expand x "
                "hidden_size = %lld", c->src, (long long)inner, (long long)d_inner);
        return LLMEM_E_CORRUPT;
    }
    if (m->ssm_n_heads % m->ssm_n_groups)
        return bad(c, "the mamba head count must be a multiple of its group count");
    int64_t conv_dim = inner + 2 * (int64_t)m->ssm_n_groups * m->ssm_d_state;
    int64_t in_proj = inner + conv_dim + m->ssm_n_heads;
    if (in_proj > CFG_MAX_DIM)
        return bad(c, "mamba sizes are too large");
    m->ssm_d_inner = (int32_t)inner;
    m->ssm_conv_dim = (int32_t)conv_dim;
    m->ssm_in_proj_dim = (int32_t)in_proj;
    m->ssm_norm_group_size = m->arch == LLMEM_ARCH_NEMOTRON_H
                                 ? m->ssm_d_inner / m->ssm_n_groups
                                 : m->ssm_d_inner;
    TRY(get_finite_nonneg(c, k->dt_min, 0.001, &m->time_step_min));
    TRY(get_finite_nonneg(c, k->dt_max, 0.1, &m->time_step_max));
    TRY(get_finite_nonneg(c, k->dt_floor, 1e-4, &m->time_step_floor));
    m->time_step_limit[0] = 0.0;
    m->time_step_limit[1] = INFINITY;
    const char *lk = k->dt_limit[0];
    const cJSON *lim = find_any(c->root, k->dt_limit, &lk);
    if (lim) {
        if (!cJSON_IsArray(lim) || cJSON_GetArraySize(lim) != 2 ||
            !json_num(cJSON_GetArrayItem(lim, 0), &m->time_step_limit[0]) ||
            !json_num(cJSON_GetArrayItem(lim, 1), &m->time_step_limit[1])) {
            llmem_errf(c->err, c->err_len, "%s: '%s' must be [lo, hi] (numbers or "
                    "{\"__float__\": \"Infinity\"})", c->src, lk);
            return LLMEM_E_CORRUPT;
        }
        /* hi may be +Infinity (no upper clamp, the transformers default);
         * lo must be finite, and NaN fails the <= test. */
        if (!(m->time_step_limit[0] <= m->time_step_limit[1]) || m->time_step_limit[0] < 0 ||
            !isfinite(m->time_step_limit[0])) {
            llmem_errf(c->err, c->err_len, "%s: '%s' [%g, %g] is not a range of >= 0 values "
                    "with a finite lower end", c->src, lk, m->time_step_limit[0],
                    m->time_step_limit[1]);
            return LLMEM_E_CORRUPT;
        }
    }
    /* transformers 5's NemotronHMamba2Mixer ignores config.time_step_limit
     * and clamps dt to (time_step_min, inf) in its prefill path
     * (self.time_step_limit = (config.time_step_min, float("inf"))); follow
     * it, or parity with transformers breaks wherever softplus(dt) is small. */
    if (m->arch == LLMEM_ARCH_NEMOTRON_H) {
        m->time_step_limit[0] = m->time_step_min;
        m->time_step_limit[1] = INFINITY;
    }
    return LLMEM_OK;
}

llmem_status set_layers(cfgctx *c, llmem_model_config *m, int32_t n, llmem_layer_kind kind,
                               bool has_ffn)
{
    if (n > LLMEM_MODEL_MAX_LAYERS) {
        llmem_errf(c->err, c->err_len, "%s: %d layers; llmem supports at most %d", c->src, n,
                LLMEM_MODEL_MAX_LAYERS);
        return LLMEM_E_UNSUPPORTED;
    }
    m->n_layers = n;
    for (int32_t i = 0; i < n; i++) {
        m->layers[i].kind = kind;
        m->layers[i].has_ffn = has_ffn;
    }
    return LLMEM_OK;
}

llmem_status hf_cfg_layer_names(cfgctx *c, const char *const *keys, int32_t n, const char *arch,
                                const hf_kind_name *names, int n_names, int32_t *out,
                                bool *found)
{
    const char *k = keys[0];
    const cJSON *lt = find_any(c->root, keys, &k);
    *found = lt && !cJSON_IsNull(lt);
    if (!*found)
        return LLMEM_OK;
    bool strings = cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == n;
    for (const cJSON *e = strings ? lt->child : NULL; e; e = e->next)
        strings = strings && cJSON_IsString(e);
    if (!strings) {
        llmem_errf(c->err, c->err_len, "%s: '%s' must be an array of num_hidden_layers (%d) "
                   "strings", c->src, k, n);
        return LLMEM_E_CORRUPT;
    }
    int32_t i = 0;
    for (const cJSON *e = lt->child; e; e = e->next, i++) {
        int j = 0;
        while (j < n_names && strcmp(e->valuestring, names[j].name) != 0)
            j++;
        if (j == n_names) {
            char known[160] = "";
            for (int q = 0; q < n_names; q++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         q ? ", " : "", names[q].name);
            llmem_errf(c->err, c->err_len, "%s: layer %d has type '%.40s', which %s does not "
                       "define (%s)", c->src, i, e->valuestring, arch, known);
            return LLMEM_E_UNSUPPORTED;
        }
        out[i] = names[j].value;
    }
    return LLMEM_OK;
}

static llmem_status parse_llama(cfgctx *c, llmem_model_config *m)
{
    int32_t n;
    llmem_activation act;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_ATTENTION, true));
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-6, &m->norm_eps));
    TRY(parse_attention(c, m));
    TRY(parse_rope(c, m, 1.0));
    TRY(parse_ffn(c, m, true));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    m->ffn_act = act;
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

static llmem_status parse_mamba2(cfgctx *c, llmem_model_config *m)
{
    const ssm_keys k = {
        KEYS("num_heads"), KEYS("head_dim"), KEYS("state_size"), KEYS("n_groups"),
        KEYS("conv_kernel"), KEYS("expand"), KEYS("chunk_size"), KEYS("use_conv_bias"),
        KEYS("use_bias"), KEYS("time_step_min"), KEYS("time_step_max"),
        KEYS("time_step_floor"), KEYS("time_step_limit"), 8, 256};
    int32_t n;
    llmem_activation act;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_MAMBA2, false));
    TRY(get_pos(c, c->root, KEYS("layer_norm_epsilon"), 1e-5, &m->norm_eps));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    TRY(parse_ssm(c, m, &k));
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "backbone.");
    return LLMEM_OK;
}

static llmem_status parse_bamba(cfgctx *c, llmem_model_config *m)
{
    int32_t n;
    llmem_activation act;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_MAMBA2, true));
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c->root, "attn_layer_indices");
    if (idx && !cJSON_IsNull(idx)) {
        if (!cJSON_IsArray(idx))
            return bad(c, "'attn_layer_indices' must be an array of layer indices");
        for (const cJSON *e = idx->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
                e->valuedouble < 0 || e->valuedouble >= n) {
                llmem_errf(c->err, c->err_len, "%s: 'attn_layer_indices' holds %s, not a layer "
                        "index in [0, %d)", c->src, cJSON_IsNumber(e) ? "a bad number"
                        : json_type(e), n);
                return LLMEM_E_CORRUPT;
            }
            m->layers[(int32_t)e->valuedouble].kind = LLMEM_LAYER_ATTENTION;
        }
    }
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-5, &m->norm_eps));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    TRY(parse_ffn(c, m, true));
    m->ffn_act = act;
    TRY(parse_ssm(c, m, &hf_cfg_bamba_ssm_keys));
    TRY(parse_attention(c, m));
    /* BambaConfig always sets partial_rotary_factor = 0.5. */
    TRY(parse_rope(c, m, 0.5));
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

static llmem_status nemotron_kind(cfgctx *c, int32_t i, const char *name, char ch,
                                  llmem_layer_kind *out)
{
    if (name ? !strcmp(name, "mamba") || !strcmp(name, "linear_attention") : ch == 'M')
        *out = LLMEM_LAYER_MAMBA2;
    else if (name ? !strcmp(name, "attention") || !strcmp(name, "full_attention") : ch == '*')
        *out = LLMEM_LAYER_ATTENTION;
    else if (name ? !strcmp(name, "mlp") : ch == '-')
        *out = LLMEM_LAYER_MLP;
    else if (name ? !strcmp(name, "moe") : ch == 'E')
        *out = LLMEM_LAYER_MOE;
    else if (name) {
        llmem_errf(c->err, c->err_len, "%s: layer %d has type '%.40s', which llmem does not "
                "support (mamba, attention, mlp, moe)", c->src, i, name);
        return LLMEM_E_UNSUPPORTED;
    } else {
        llmem_errf(c->err, c->err_len, "%s: hybrid_override_pattern has '%c' at layer %d "
                "(expected M, *, - or E)", c->src, ch, i);
        return LLMEM_E_CORRUPT;
    }
    return LLMEM_OK;
}

static llmem_status parse_nemotron_h(cfgctx *c, llmem_model_config *m)
{
    const ssm_keys k = {
        KEYS("mamba_num_heads"), KEYS("mamba_head_dim"), KEYS("ssm_state_size"),
        KEYS("n_groups", "mamba_n_groups"), KEYS("conv_kernel", "mamba_d_conv"),
        KEYS("expand", "mamba_expand"), KEYS("chunk_size", "mamba_chunk_size"),
        KEYS("use_conv_bias", "mamba_conv_bias"), KEYS("use_bias"),
        KEYS("time_step_min", "mamba_dt_min"), KEYS("time_step_max", "mamba_dt_max"),
        KEYS("time_step_floor", "mamba_dt_init_floor"),
        KEYS("time_step_limit", "mamba_dt_limit"), 8, 128};
    /* The layer list decides the layer count (transformers 5 derives
     * num_hidden_layers from it and ignores a stale stored value). */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c->root, "layers_block_type");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(c->root, "hybrid_override_pattern");
    llmem_activation act;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt))
            return bad(c, "'layers_block_type' must be an array of strings");
        TRY(set_layers(c, m, cJSON_GetArraySize(lt), LLMEM_LAYER_MAMBA2, false));
        int32_t i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            if (!cJSON_IsString(e))
                return bad(c, "'layers_block_type' must be an array of strings");
            TRY(nemotron_kind(c, i, e->valuestring, 0, &m->layers[i].kind));
        }
    } else if (pat && !cJSON_IsNull(pat)) {
        if (!cJSON_IsString(pat))
            return bad(c, "'hybrid_override_pattern' must be a string");
        size_t n = strlen(pat->valuestring);
        TRY(set_layers(c, m, n > INT32_MAX ? INT32_MAX : (int32_t)n, LLMEM_LAYER_MAMBA2, false));
        for (int32_t i = 0; i < m->n_layers; i++)
            TRY(nemotron_kind(c, i, NULL, pat->valuestring[i], &m->layers[i].kind));
    } else {
        return missing(c, KEYS("layers_block_type", "hybrid_override_pattern"));
    }
    if (m->n_layers < 1)
        return bad(c, "the layer list is empty");
    TRY(get_pos(c, c->root, KEYS("layer_norm_epsilon"), 1e-5, &m->norm_eps));
    TRY(get_act(c, KEYS("mamba_hidden_act"), "silu", false, &act));
    TRY(get_act(c, KEYS("mlp_hidden_act"), "relu2", true, &act));
    m->ffn_act = act;
    TRY(parse_ffn(c, m, false));
    TRY(parse_ssm(c, m, &k));
    TRY(parse_attention(c, m));
    m->use_rope = false; /* nemotron_h attention has no positional encoding */
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "backbone.");
    return hf_cfg_parse_nemotron_moe(c, m);
}

static llmem_status parse_root(cfgctx *c, llmem_model_config *m)
{
    const char *type;
    TRY(get_str(c, KEYS("model_type"), true, NULL, &type));
    int a = 0;
    while (a < LLMEM_ARCH_COUNT && strcmp(type, arch_names[a]) != 0)
        a++;
    if (a == LLMEM_ARCH_COUNT) {
        llmem_errf(c->err, c->err_len, "%s: model_type '%.40s' is not supported (llmem runs "
                "llama, mamba2, bamba, nemotron_h, granitemoehybrid, falcon_h1, qwen3_next, "
                "gemma3_text, lfm2 and jamba)", c->src, type);
        return LLMEM_E_UNSUPPORTED;
    }
    m->arch = (llmem_arch)a;
    m->embedding_multiplier = m->residual_multiplier = m->logits_scaling = 1.0;
    m->attention_in_multiplier = m->attention_out_multiplier = m->key_multiplier = 1.0;
    m->ssm_in_multiplier = m->ssm_out_multiplier = 1.0;
    m->mlp_gate_multiplier = m->mlp_down_multiplier = 1.0;
    for (int i = 0; i < 5; i++)
        m->ssm_multipliers[i] = 1.0;
    TRY(get_int(c, KEYS("vocab_size"), true, 0, 1, CFG_MAX_DIM, &m->vocab_size));
    TRY(get_int(c, KEYS("hidden_size"), true, 0, 1, CFG_MAX_DIM, &m->hidden_size));
    TRY(get_bool(c, KEYS("tie_word_embeddings"), false, &m->tie_word_embeddings));
    switch (m->arch) {
    case LLMEM_ARCH_LLAMA: TRY(parse_llama(c, m)); break;
    case LLMEM_ARCH_MAMBA2: TRY(parse_mamba2(c, m)); break;
    case LLMEM_ARCH_BAMBA: TRY(parse_bamba(c, m)); break;
    case LLMEM_ARCH_GRANITEMOEHYBRID: TRY(hf_cfg_parse_granite(c, m)); break;
    case LLMEM_ARCH_FALCON_H1: TRY(hf_cfg_parse_falcon_h1(c, m)); break;
    case LLMEM_ARCH_QWEN3_NEXT: TRY(hf_cfg_parse_qwen3_next(c, m)); break;
    case LLMEM_ARCH_GEMMA3_TEXT: TRY(hf_cfg_parse_gemma3(c, m)); break;
    case LLMEM_ARCH_LFM2: TRY(hf_cfg_parse_lfm2(c, m)); break;
    case LLMEM_ARCH_JAMBA: TRY(hf_cfg_parse_jamba(c, m)); break;
    default: TRY(parse_nemotron_h(c, m)); break;
    }
    TRY(hf_cfg_check_moe(c, m));
    if (m->attention_scale == 0.0 && m->head_dim > 0)
        m->attention_scale = 1.0 / sqrt((double)m->head_dim);
    for (int32_t i = 0; i < m->n_layers; i++) {
        llmem_layer_kind lk = m->layers[i].kind;
        m->n_attention_layers += lk == LLMEM_LAYER_ATTENTION || lk == LLMEM_LAYER_PARALLEL;
        m->n_mamba_layers += lk == LLMEM_LAYER_MAMBA2 || lk == LLMEM_LAYER_PARALLEL ||
                             lk == LLMEM_LAYER_SHORTCONV || lk == LLMEM_LAYER_MAMBA1;
        m->n_mlp_layers += m->layers[i].kind == LLMEM_LAYER_MLP;
    }
    return LLMEM_OK;
}

static llmem_status parse_impl(const char *json, size_t len, llmem_model_config *out,
                               const char *src, char *err, size_t err_len)
{
    if (!json || !out) {
        llmem_errf(err, err_len, "llmem_model_config_parse: NULL argument");
        return LLMEM_E_INVALID;
    }
    cJSON *root = NULL;
    hf_json_where w;
    hf_json_fault jf = hf_json_read(json, len, &root, &w);
    llmem_status s = LLMEM_OK;
    if (jf != HF_JSON_OK) {
        char why[128];
        llmem_errf(err, err_len, "%s: %s", src, hf_json_describe(jf, &w, why, sizeof why));
        s = jf == HF_JSON_NO_MEMORY ? LLMEM_E_NO_MEMORY : LLMEM_E_CORRUPT;
    } else if (!cJSON_IsObject(root)) {
        llmem_errf(err, err_len, "%s: not a JSON object", src);
        s = LLMEM_E_CORRUPT;
    } else {
        /* Parse into a scratch copy so *out is untouched on failure. */
        llmem_model_config *m = calloc(1, sizeof *m);
        cfgctx c = {root, src, err, err_len};
        s = m ? parse_root(&c, m) : LLMEM_E_NO_MEMORY;
        if (s == LLMEM_OK)
            *out = *m;
        else if (!m)
            llmem_errf(err, err_len, "%s: out of memory", src);
        free(m);
    }
    cJSON_Delete(root);
    return s;
}

llmem_status llmem_model_config_parse(const char *json, size_t len, llmem_model_config *out,
                                      char *err, size_t err_len)
{
    return parse_impl(json, len, out, "config.json", err, err_len);
}

llmem_status llmem_model_config_load(const char *path, llmem_model_config *out, char *err,
                                     size_t err_len)
{
    if (!path || !out) {
        llmem_errf(err, err_len, "llmem_model_config_load: NULL argument");
        return LLMEM_E_INVALID;
    }
    size_t pl = strlen(path);
    bool is_json = pl >= 5 && strcmp(path + pl - 5, ".json") == 0;
    char *file = malloc(pl + sizeof "/config.json");
    if (!file) {
        llmem_errf(err, err_len, "%s: out of memory", path);
        return LLMEM_E_NO_MEMORY;
    }
    snprintf(file, pl + sizeof "/config.json", is_json ? "%s" : "%s/config.json", path);
    char *buf = NULL;
    size_t n = 0;
    llmem_status s = hf_read_file(file, CFG_MAX_FILE, "config.json", &buf, &n, err, err_len);
    if (s == LLMEM_OK)
        s = parse_impl(buf, n, out, file, err, err_len);
    free(buf);
    free(file);
    return s;
}

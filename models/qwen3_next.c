/* llmem models/: qwen3_next (transformers 5.17 Qwen3NextForCausalLM):
 * config.json, tensor checks, weight loading and the layer forward pass.
 *
 * Layer (Qwen3NextDecoderLayer): x += mixer(norm(x)); x += moe(norm(x)),
 * norms x / rms(x) * (1 + w) (Qwen3NextRMSNorm; the loader stores 1 + w).
 *   linear_attention: gated delta net (Qwen3NextGatedDeltaNet; Yang, Kautz
 *     & Hatamizadeh 2024): in_proj_qkvz and in_proj_ba, whose rows are
 *     interleaved per key head ([q k v z] and [b a] per group of
 *     H_v / H_k value heads; fix_query_key_value_ordering), are permuted
 *     at load time to [q | k | v | z] and [b | a] over all heads;
 *     qkv = silu(causal depthwise conv(qkv)) with the conv state;
 *     y = gated delta rule (llmem_op_gdn) with the delta-rule state;
 *     y = rms_norm(y per value head, w) * silu(z) (Qwen3NextRMSNormGated:
 *     norm first, then gate; plain weight); out_proj.
 *   full_attention: gated attention (Qwen3NextAttention): q_proj gives
 *     [query | gate] per head; q and k RMS-normed per head with (1 + w);
 *     partial RoPE (NeoX pairs over the first head_dim *
 *     partial_rotary_factor dims); paged attention; o * sigmoid(gate);
 *     o_proj.
 *   MoE (Qwen3NextSparseMoeBlock): softmax top-k routing (norm_topk_prob),
 *     gated SiLU experts, plus a shared SwiGLU expert scaled by
 *     sigmoid(shared_expert_gate(h)).
 * Memory: the recurrent child keeps per GDN layer the conv state
 * {d_conv - 1, conv_dim} (f32) and the delta-rule state {H_v, d_k, d_v}; the
 * KV cache keeps the full-attention layers (hybrid, as for Bamba). The GDN
 * sizes live in the config's ssm_* fields: ssm_n_groups = H_k, ssm_n_heads
 * = H_v, ssm_d_state = d_k, ssm_head_dim = d_v, ssm_d_conv = conv kernel.
 * Only configurations whose every layer has the sparse MoE block are run
 * (decoder_sparse_step 1, no mlp_only_layers), as in the released models.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/ops_gdn.h"
#include "llmem/ops_moe.h"
#include "models/config_internal.h"
#include "models/model_internal.h"

/* ---- config.json ------------------------------------------------------------------- */

llmem_status hf_cfg_parse_qwen3_next(cfgctx *c, llmem_model_config *m)
{
    int32_t n, interval, step;
    llmem_activation act;
    TRY(get_int(c, KEYS("num_hidden_layers"), true, 0, 1, INT32_MAX, &n));
    TRY(set_layers(c, m, n, LLMEM_LAYER_GDN, true));
    TRY(get_int(c, KEYS("full_attention_interval"), false, 4, 1, INT32_MAX, &interval));
    static const hf_kind_name kinds[] = {{"linear_attention", LLMEM_LAYER_GDN},
                                          {"full_attention", LLMEM_LAYER_ATTENTION}};
    int32_t kind[LLMEM_MODEL_MAX_LAYERS];
    bool listed;
    TRY(hf_cfg_layer_names(c, KEYS("layer_types"), n, "qwen3_next", kinds, 2, kind, &listed));
    for (int32_t i = 0; i < n; i++) /* else every interval-th layer is attention */
        m->layers[i].kind = listed ? (llmem_layer_kind)kind[i]
                            : (i + 1) % interval == 0 ? LLMEM_LAYER_ATTENTION : LLMEM_LAYER_GDN;
    TRY(get_pos(c, c->root, KEYS("rms_norm_eps"), 1e-6, &m->norm_eps));
    TRY(parse_attention(c, m));
    TRY(parse_rope(c, m, 0.25));
    TRY(parse_ffn(c, m, true));
    TRY(get_act(c, KEYS("hidden_act"), "silu", false, &act));
    m->ffn_act = act;
    if (act != LLMEM_ACT_SILU)
        return bad(c, "qwen3_next needs hidden_act 'silu'");
    int32_t hk, hv, dk, dv, kc;
    TRY(get_int(c, KEYS("linear_num_key_heads"), true, 0, 1, 1 << 16, &hk));
    TRY(get_int(c, KEYS("linear_num_value_heads"), true, 0, 1, 1 << 16, &hv));
    TRY(get_int(c, KEYS("linear_key_head_dim"), true, 0, 1, 4096, &dk));
    TRY(get_int(c, KEYS("linear_value_head_dim"), true, 0, 1, 4096, &dv));
    TRY(get_int(c, KEYS("linear_conv_kernel_dim"), false, 4, 2, 64, &kc));
    if (hv % hk)
        return bad(c, "linear_num_value_heads must be a multiple of linear_num_key_heads");
    m->ssm_n_groups = hk;
    m->ssm_n_heads = hv;
    m->ssm_d_state = dk;
    m->ssm_head_dim = dv;
    m->ssm_d_conv = kc;
    m->ssm_d_inner = hv * dv;
    m->ssm_conv_dim = 2 * hk * dk + hv * dv;
    m->ssm_in_proj_dim = 2 * hk * dk + 2 * hv * dv;
    TRY(get_int(c, KEYS("num_experts"), true, 0, 1, 1 << 16, &m->n_expert));
    TRY(get_int(c, KEYS("num_experts_per_tok"), true, 0, 1, 1 << 16, &m->n_expert_used));
    TRY(get_int(c, KEYS("moe_intermediate_size"), true, 0, 1, CFG_MAX_DIM,
                &m->moe_intermediate_size));
    TRY(get_int(c, KEYS("shared_expert_intermediate_size"), true, 0, 1, CFG_MAX_DIM,
                &m->moe_shared_intermediate_size));
    TRY(get_bool(c, KEYS("norm_topk_prob"), true, &m->moe_norm_topk));
    TRY(get_int(c, KEYS("decoder_sparse_step"), false, 1, 1, INT32_MAX, &step));
    const cJSON *mlp_only = cJSON_GetObjectItemCaseSensitive(c->root, "mlp_only_layers");
    if (step != 1 || (cJSON_IsArray(mlp_only) && cJSON_GetArraySize(mlp_only) > 0)) {
        llmem_errf(c->err, c->err_len, "%s: qwen3_next with dense MLP layers (decoder_sparse_step "
                   "%d, mlp_only_layers) is not supported; every layer must be sparse MoE",
                   c->src, step);
        return LLMEM_E_UNSUPPORTED;
    }
    m->moe_gated = true;
    m->moe_routed_scale = 1.0;
    snprintf(m->tensor_prefix, sizeof m->tensor_prefix, "model.");
    return LLMEM_OK;
}

/* ---- tensors ------------------------------------------------------------------------ */

enum {
    QW_NORM_IN, QW_NORM_POST,
    QW_QKVZ, QW_BA, QW_CONV, QW_DT_BIAS, QW_A_LOG, QW_GNORM, QW_OUT,        /* GDN */
    QW_Q, QW_K, QW_V, QW_O, QW_QNORM, QW_KNORM,                            /* attention */
    QW_ROUTER, QW_EXP_UP, QW_EXP_DOWN, QW_SH_UP, QW_SH_DOWN, QW_SH_GATE,    /* MoE */
    QW_COUNT
};

/* How a checkpoint tensor becomes a device tensor. */
typedef enum { X_PLAIN, X_ONE_PLUS, X_QKVZ, X_BA, X_EXP_UP, X_EXP_DOWN, X_SH_UP } xform;

typedef struct wspec {
    const char *leaf; /* after "model.layers.N." */
    xform x;
    int32_t nd;
    int64_t shape[3];
} wspec;

/* The spec of weight w of layer il; false when the layer has none. */
static bool layer_spec(const llmem_model_config *c, int32_t il, int w, wspec *s)
{
    int64_t H = c->hidden_size, q = (int64_t)c->n_heads * c->head_dim;
    int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, Dh = c->head_dim;
    int64_t hv = c->ssm_n_heads, E = c->n_expert, I = c->moe_intermediate_size;
    int64_t Is = c->moe_shared_intermediate_size;
    bool gdn = c->layers[il].kind == LLMEM_LAYER_GDN;
    static const wspec gdn_w[] = {
        [QW_QKVZ] = {"linear_attn.in_proj_qkvz.weight", X_QKVZ, 2, {0}},
        [QW_BA] = {"linear_attn.in_proj_ba.weight", X_BA, 2, {0}},
        [QW_CONV] = {"linear_attn.conv1d.weight", X_PLAIN, 3, {0}},
        [QW_DT_BIAS] = {"linear_attn.dt_bias", X_PLAIN, 1, {0}},
        [QW_A_LOG] = {"linear_attn.A_log", X_PLAIN, 1, {0}},
        [QW_GNORM] = {"linear_attn.norm.weight", X_PLAIN, 1, {0}},
        [QW_OUT] = {"linear_attn.out_proj.weight", X_PLAIN, 2, {0}},
    };
    static const wspec attn_w[] = {
        [QW_Q] = {"self_attn.q_proj.weight", X_PLAIN, 2, {0}},
        [QW_K] = {"self_attn.k_proj.weight", X_PLAIN, 2, {0}},
        [QW_V] = {"self_attn.v_proj.weight", X_PLAIN, 2, {0}},
        [QW_O] = {"self_attn.o_proj.weight", X_PLAIN, 2, {0}},
        [QW_QNORM] = {"self_attn.q_norm.weight", X_ONE_PLUS, 1, {0}},
        [QW_KNORM] = {"self_attn.k_norm.weight", X_ONE_PLUS, 1, {0}},
    };
    switch (w) {
    case QW_NORM_IN: *s = (wspec){"input_layernorm.weight", X_ONE_PLUS, 1, {H}}; return true;
    case QW_NORM_POST:
        *s = (wspec){"post_attention_layernorm.weight", X_ONE_PLUS, 1, {H}};
        return true;
    case QW_QKVZ: case QW_BA: case QW_CONV: case QW_DT_BIAS: case QW_A_LOG: case QW_GNORM:
    case QW_OUT:
        if (!gdn)
            return false;
        *s = gdn_w[w];
        if (w == QW_QKVZ)
            s->shape[0] = c->ssm_in_proj_dim, s->shape[1] = H;
        else if (w == QW_BA)
            s->shape[0] = 2 * hv, s->shape[1] = H;
        else if (w == QW_CONV)
            s->shape[0] = c->ssm_conv_dim, s->shape[1] = 1, s->shape[2] = c->ssm_d_conv;
        else if (w == QW_GNORM)
            s->shape[0] = c->ssm_head_dim;
        else if (w == QW_OUT)
            s->shape[0] = H, s->shape[1] = c->ssm_d_inner;
        else
            s->shape[0] = hv;
        return true;
    case QW_Q: case QW_K: case QW_V: case QW_O: case QW_QNORM: case QW_KNORM:
        if (gdn)
            return false;
        *s = attn_w[w];
        if (w == QW_Q)
            s->shape[0] = 2 * q, s->shape[1] = H;
        else if (w == QW_K || w == QW_V)
            s->shape[0] = kv, s->shape[1] = H;
        else if (w == QW_O)
            s->shape[0] = H, s->shape[1] = q;
        else
            s->shape[0] = Dh;
        return true;
    case QW_ROUTER: *s = (wspec){"mlp.gate.weight", X_PLAIN, 2, {E, H}}; return true;
    case QW_EXP_UP: *s = (wspec){"mlp.experts.%d.%s_proj.weight", X_EXP_UP, 2, {I, H}}; return true;
    case QW_EXP_DOWN:
        *s = (wspec){"mlp.experts.%d.%s_proj.weight", X_EXP_DOWN, 2, {H, I}};
        return true;
    case QW_SH_UP: *s = (wspec){"mlp.shared_expert.%s_proj.weight", X_SH_UP, 2, {Is, H}}; return true;
    case QW_SH_DOWN:
        *s = (wspec){"mlp.shared_expert.down_proj.weight", X_PLAIN, 2, {H, Is}};
        return true;
    case QW_SH_GATE: *s = (wspec){"mlp.shared_expert_gate.weight", X_PLAIN, 2, {1, H}}; return true;
    default: return false;
    }
}

/* Checkpoint names of a spec: the parts concatenated into one tensor. */
typedef char name160[160];

/* Room for the part names of any spec (2 per expert), or NULL. */
static name160 *names_alloc(const llmem_model_config *c)
{
    return malloc((size_t)(2 * c->n_expert + 2) * sizeof(name160));
}

static int32_t part_names(const llmem_model_config *c, int32_t il, const wspec *s,
                          name160 *names)
{
    int32_t n = 0;
    if (s->x == X_EXP_UP || s->x == X_EXP_DOWN) {
        for (int32_t e = 0; e < c->n_expert; e++) {
            char leaf[96];
            if (s->x == X_EXP_UP) {
                snprintf(leaf, sizeof leaf, s->leaf, (int)e, "gate");
                snprintf(names[n++], 160, "model.layers.%d.%s", (int)il, leaf);
                snprintf(leaf, sizeof leaf, s->leaf, (int)e, "up");
            } else {
                snprintf(leaf, sizeof leaf, s->leaf, (int)e, "down");
            }
            snprintf(names[n++], 160, "model.layers.%d.%s", (int)il, leaf);
        }
        return n;
    }
    if (s->x == X_SH_UP) {
        const char *part[2] = {"gate", "up"};
        for (int i = 0; i < 2; i++) {
            char leaf[96];
            snprintf(leaf, sizeof leaf, s->leaf, part[i]);
            snprintf(names[n++], 160, "model.layers.%d.%s", (int)il, leaf);
        }
        return n;
    }
    snprintf(names[0], 160, "model.layers.%d.%s", (int)il, s->leaf);
    return 1;
}

static bool is_float(llmem_dtype d)
{
    return d == LLMEM_DTYPE_F32 || d == LLMEM_DTYPE_F16 || d == LLMEM_DTYPE_BF16;
}

static llmem_status check_tensor(const llmem_safetensors *st, const char *name, int32_t nd,
                                 const int64_t *shape, llmem_dtype *dt, char *err, size_t err_len)
{
    llmem_tensor_info ti;
    llmem_status s = llmem_safetensors_find(st, name, &ti, NULL, 0);
    if (s == LLMEM_E_NOT_FOUND) {
        llmem_errf(err, err_len, "missing tensor '%s' (qwen3_next)", name);
        return s;
    }
    if (s != LLMEM_OK || !is_float(ti.dtype)) {
        llmem_errf(err, err_len, "tensor '%s' has dtype %s; llmem reads F32, F16 and BF16", name,
                   s == LLMEM_OK || s == LLMEM_E_UNSUPPORTED ? ti.st_dtype : "?");
        return s != LLMEM_OK ? s : LLMEM_E_UNSUPPORTED;
    }
    bool ok = ti.n_dims == nd;
    for (int32_t d = 0; ok && d < nd; d++)
        ok = ti.shape[d] == shape[d];
    if (!ok) {
        llmem_errf(err, err_len, "%s: tensor '%s' does not have the shape config.json gives "
                   "(qwen3_next)", ti.file, name);
        return LLMEM_E_CORRUPT;
    }
    if (*dt != LLMEM_DTYPE_COUNT && ti.dtype != *dt) {
        llmem_errf(err, err_len, "%s: tensor '%s' has another dtype than the tensors it is "
                   "concatenated with", ti.file, name);
        return LLMEM_E_UNSUPPORTED;
    }
    *dt = ti.dtype;
    return LLMEM_OK;
}

llmem_status hf_qwen3n_check_tensors(const llmem_model_config *c, const llmem_safetensors *st,
                                     char *err, size_t err_len)
{
    int64_t V = c->vocab_size, H = c->hidden_size, want = 2 + !c->tie_word_embeddings;
    const int64_t emb[2] = {V, H}, norm[1] = {H};
    llmem_dtype dt = LLMEM_DTYPE_COUNT;
    TRY(check_tensor(st, "model.embed_tokens.weight", 2, emb, &dt, err, err_len));
    dt = LLMEM_DTYPE_COUNT;
    TRY(check_tensor(st, "model.norm.weight", 1, norm, &dt, err, err_len));
    dt = LLMEM_DTYPE_COUNT;
    if (!c->tie_word_embeddings)
        TRY(check_tensor(st, "lm_head.weight", 2, emb, &dt, err, err_len));
    name160 *names = names_alloc(c);
    if (!names)
        return LLMEM_E_NO_MEMORY;
    llmem_status st_ = LLMEM_OK;
    for (int32_t il = 0; il < c->n_layers && st_ == LLMEM_OK; il++)
        for (int w = 0; w < QW_COUNT && st_ == LLMEM_OK; w++) {
            wspec s;
            if (!layer_spec(c, il, w, &s))
                continue;
            int32_t n = part_names(c, il, &s, names);
            dt = LLMEM_DTYPE_COUNT;
            for (int32_t i = 0; i < n && st_ == LLMEM_OK; i++)
                st_ = check_tensor(st, names[i], s.nd, s.shape, &dt, err, err_len);
            want += n;
        }
    free(names);
    if (st_ != LLMEM_OK)
        return st_;
    /* every checkpoint tensor must be one of these (rotary buffers aside) */
    int64_t have = 0;
    for (int32_t i = 0; i < llmem_safetensors_count(st); i++) {
        llmem_tensor_info ti;
        if (llmem_safetensors_get(st, i, &ti) != LLMEM_OK)
            continue;
        size_t len = strlen(ti.name);
        bool inv = len > 20 && strcmp(ti.name + len - 20, ".rotary_emb.inv_freq") == 0;
        bool tied_head = c->tie_word_embeddings && strcmp(ti.name, "lm_head.weight") == 0;
        have += !inv && !tied_head;
    }
    if (have != want) {
        llmem_errf(err, err_len, "the checkpoint has %lld tensors, config.json (qwen3_next, %d "
                   "layers) uses %lld; config.json and the checkpoint disagree", (long long)have,
                   (int)c->n_layers, (long long)want);
        return LLMEM_E_CORRUPT;
    }
    return LLMEM_OK;
}

/* ---- loading ------------------------------------------------------------------------ */

struct hf_qwen3n {
    llmem_buffer **bufs; /* one per device tensor */
    int32_t n_bufs, cap_bufs;
    llmem_tensor (*w)[QW_COUNT]; /* [n_layers][QW_COUNT] */
    llmem_buffer *scratch;
    int32_t n_ubatch;
    size_t off_proj, off_ba, off_xbc, off_conv, off_z, off_y, off_a, off_b;
    size_t off_q, off_g, off_k, off_v, off_o;
    size_t off_logits, off_ids, off_wts, off_routed, off_sh, off_shg, off_shu, off_shared, off_sg;
};

void hf_qwen3n_destroy(hf_qwen3n *q)
{
    if (!q)
        return;
    for (int32_t i = 0; i < q->n_bufs; i++)
        llmem_buffer_free(q->bufs[i]);
    llmem_buffer_free(q->scratch);
    free(q->bufs);
    free(q->w);
    free(q);
}

/* A host element of a float tensor as f32 (f16 decoded exactly). */
static float host_f32(const void *p, llmem_dtype dt, int64_t i)
{
    if (dt == LLMEM_DTYPE_F32) {
        float f;
        memcpy(&f, (const char *)p + i * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)p + i * 2, 2);
    uint32_t u;
    if (dt == LLMEM_DTYPE_BF16) {
        u = (uint32_t)h << 16;
    } else {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
        if (e == 0) { /* zero or subnormal: mant * 2^-24 */
            float f = (float)mant * 0x1p-24f;
            return (h & 0x8000u) ? -f : f;
        }
        u = e == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((e + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Uploads host bytes into a new buffer of their own: t gets the buffer. */
static llmem_status upload(hf_qwen3n *q, llmem_backend *be, const void *data, size_t bytes,
                           llmem_tensor *t)
{
    if (q->n_bufs == q->cap_bufs) {
        int32_t cap = q->cap_bufs ? 2 * q->cap_bufs : 64;
        llmem_buffer **nb = realloc(q->bufs, (size_t)cap * sizeof *nb);
        if (!nb)
            return LLMEM_E_NO_MEMORY;
        q->bufs = nb;
        q->cap_bufs = cap;
    }
    llmem_buffer *buf = NULL;
    TRY(llmem_buffer_alloc(be, round_up(bytes ? bytes : 1), &buf));
    q->bufs[q->n_bufs++] = buf;
    t->buf = buf;
    t->offset = 0;
    return llmem_buffer_upload(buf, 0, data, bytes);
}

/* Source row of destination row r of the permuted in_proj_qkvz (qkvz) or
 * in_proj_ba (!qkvz): per key head g the checkpoint holds [q k v z] (or
 * [b a]) of its H_v / H_k value heads; the device rows are [q | k | v | z]
 * (or [b | a]) over all heads. */
static int64_t perm_row(const llmem_model_config *c, bool qkvz, int64_t r)
{
    int64_t hk = c->ssm_n_groups, hv = c->ssm_n_heads, dk = c->ssm_d_state;
    int64_t rv = hv / hk * c->ssm_head_dim, rh = hv / hk;
    if (!qkvz) { /* [b (hv) | a (hv)] <- per g [b (rh) | a (rh)] */
        int64_t part = r / hv, i = r % hv;
        return (i / rh) * 2 * rh + part * rh + i % rh;
    }
    int64_t per = 2 * dk + 2 * rv;
    if (r < 2 * hk * dk) { /* q or k of head g */
        int64_t part = r / (hk * dk), i = r % (hk * dk);
        return (i / dk) * per + part * dk + i % dk;
    }
    r -= 2 * hk * dk; /* v or z of value heads */
    int64_t part = r / (hv * c->ssm_head_dim), i = r % (hv * c->ssm_head_dim);
    return (i / rv) * per + 2 * dk + part * rv + i % rv;
}

/* Builds and uploads one device tensor from its checkpoint parts. */
static llmem_status load_spec(hf_qwen3n *q, llmem_backend *be, const llmem_model_config *c,
                              const llmem_safetensors *st, const wspec *s, name160 *names,
                              int32_t n_parts, llmem_tensor *t, char *err, size_t err_len)
{
    llmem_tensor_info ti;
    TRY(llmem_safetensors_find(st, names[0], &ti, err, err_len));
    size_t es = llmem_dtype_size(ti.dtype), part = ti.n_bytes;
    memset(t, 0, sizeof *t);
    t->dtype = ti.dtype;
    if (s->x == X_PLAIN) {
        /* conv1d weights [C, 1, K] are used as [C, K] */
        t->n_dims = ti.n_dims == 3 && ti.shape[1] == 1 ? 2 : ti.n_dims;
        t->ne[0] = (int32_t)ti.shape[0];
        for (int32_t d = 1; d < t->n_dims; d++)
            t->ne[d] = (int32_t)ti.shape[t->n_dims == ti.n_dims ? d : d + 1];
        return upload(q, be, ti.data, ti.n_bytes, t);
    }
    void *host = malloc(s->x == X_ONE_PLUS ? (size_t)ti.n_elements * 4 : part * (size_t)n_parts);
    if (!host)
        return LLMEM_E_NO_MEMORY;
    llmem_status r = LLMEM_OK;
    if (s->x == X_ONE_PLUS) {
        float *f = host;
        for (int64_t i = 0; i < ti.n_elements; i++)
            f[i] = 1.0f + host_f32(ti.data, ti.dtype, i);
        *t = llmem_tensor_1d(NULL, 0, LLMEM_DTYPE_F32, (int32_t)ti.n_elements);
        r = upload(q, be, host, (size_t)ti.n_elements * 4, t);
    } else if (s->x == X_QKVZ || s->x == X_BA) {
        size_t row = (size_t)ti.shape[1] * es;
        for (int64_t i = 0; i < ti.shape[0]; i++)
            memcpy((char *)host + (size_t)i * row,
                   (const char *)ti.data + (size_t)perm_row(c, s->x == X_QKVZ, i) * row, row);
        *t = llmem_tensor_2d(NULL, 0, ti.dtype, (int32_t)ti.shape[0], (int32_t)ti.shape[1]);
        r = upload(q, be, host, ti.n_bytes, t);
    } else { /* concatenations: experts' [gate; up] or [down], shared [gate; up] */
        for (int32_t i = 0; i < n_parts && r == LLMEM_OK; i++) {
            llmem_tensor_info pi;
            r = llmem_safetensors_find(st, names[i], &pi, err, err_len);
            if (r == LLMEM_OK)
                memcpy((char *)host + (size_t)i * part, pi.data, part);
        }
        int32_t rows = (int32_t)ti.shape[0], cols = (int32_t)ti.shape[1];
        if (s->x == X_SH_UP)
            *t = llmem_tensor_2d(NULL, 0, ti.dtype, 2 * rows, cols);
        else
            *t = llmem_tensor_3d(NULL, 0, ti.dtype, c->n_expert,
                                 s->x == X_EXP_UP ? 2 * rows : rows, cols);
        if (r == LLMEM_OK)
            r = upload(q, be, host, part * (size_t)n_parts, t);
    }
    free(host);
    return r;
}

llmem_status hf_qwen3n_load(llmem_model *m, const llmem_safetensors *st, char *err,
                            size_t err_len)
{
    const llmem_model_config *c = &m->cfg;
    hf_qwen3n *q = calloc(1, sizeof *q);
    name160 *names = names_alloc(c);
    llmem_status s = LLMEM_E_NO_MEMORY;
    m->q3n = q; /* freed by llmem_model_free, whatever happens below */
    if (!q || !names || !(q->w = calloc((size_t)c->n_layers, sizeof *q->w)))
        goto fail;
    static const wspec globals[3] = {{"model.embed_tokens.weight", X_PLAIN, 2, {0}},
                                     {"model.norm.weight", X_ONE_PLUS, 1, {0}},
                                     {"lm_head.weight", X_PLAIN, 2, {0}}};
    wt *gdst[3] = {&m->embed, &m->final_norm, &m->lm_head};
    for (int i = 0; i < 3; i++) {
        if (i == 2 && c->tie_word_embeddings) {
            m->lm_head = m->embed;
            continue;
        }
        snprintf(names[0], sizeof names[0], "%s", globals[i].leaf);
        if ((s = load_spec(q, m->be, c, st, &globals[i], names, 1, &gdst[i]->t, err, err_len)) !=
            LLMEM_OK)
            goto fail;
        gdst[i]->present = true;
    }
    for (int32_t il = 0; il < c->n_layers; il++)
        for (int w = 0; w < QW_COUNT; w++) {
            wspec sp;
            if (!layer_spec(c, il, w, &sp))
                continue;
            int32_t n = part_names(c, il, &sp, names);
            if ((s = load_spec(q, m->be, c, st, &sp, names, n, &q->w[il][w], err, err_len)) !=
                LLMEM_OK)
                goto fail;
        }
    /* scratch, [n_ubatch, ...] f32 */
    size_t T = (size_t)m->p.n_ubatch, off = 0;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t hv = (size_t)c->ssm_n_heads, dvi = (size_t)c->ssm_d_inner, E = (size_t)c->n_expert;
    size_t k = (size_t)c->n_expert_used, Is = (size_t)c->moe_shared_intermediate_size;
    size_t H = (size_t)c->hidden_size;
    size_t proj = (size_t)c->ssm_in_proj_dim > 2 * qd ? (size_t)c->ssm_in_proj_dim : 2 * qd;
#define TAKE(field, n) do { q->field = off; off += round_up((n) * 4); } while (0)
    TAKE(off_proj, T * proj);
    TAKE(off_ba, T * 2 * hv);
    TAKE(off_xbc, T * (size_t)c->ssm_conv_dim);
    TAKE(off_conv, T * (size_t)c->ssm_conv_dim);
    TAKE(off_z, T * dvi);
    TAKE(off_y, T * dvi);
    TAKE(off_a, T * hv);
    TAKE(off_b, T * hv);
    TAKE(off_q, T * qd);
    TAKE(off_g, T * qd);
    TAKE(off_k, T * kvd);
    TAKE(off_v, T * kvd);
    TAKE(off_o, T * qd);
    TAKE(off_logits, T * E);
    TAKE(off_ids, T * k);
    TAKE(off_wts, T * k);
    TAKE(off_routed, T * H);
    TAKE(off_sh, T * 2 * Is);
    TAKE(off_shg, T * Is);
    TAKE(off_shu, T * Is);
    TAKE(off_shared, T * H);
    TAKE(off_sg, T);
#undef TAKE
    q->n_ubatch = m->p.n_ubatch;
    if ((s = llmem_buffer_alloc(m->be, off, &q->scratch)) != LLMEM_OK) {
        llmem_errf(err, err_len, "cannot allocate qwen3_next scratch for %d-token ubatches",
                   m->p.n_ubatch);
        goto fail;
    }
    free(names);
    return LLMEM_OK;
fail:
    free(names);
    if (err && err_len && !err[0])
        llmem_errf(err, err_len, "loading the qwen3_next weights failed: %s",
                   llmem_status_str(s));
    return s; /* m->q3n (if set) is freed by llmem_model_free */
}

void hf_qwen3n_states(const llmem_model_config *c, llmem_dtype delta_dtype, llmem_state_desc d[2])
{
    d[0] = (llmem_state_desc){"conv", 2, {c->ssm_d_conv - 1, c->ssm_conv_dim}, LLMEM_DTYPE_F32};
    d[1] = (llmem_state_desc){"delta", 3, {c->ssm_n_heads, c->ssm_d_state, c->ssm_head_dim},
                              delta_dtype};
}

/* ---- forward ------------------------------------------------------------------------ */

static llmem_tensor sc(const hf_qwen3n *q, size_t off, int32_t rows, int32_t cols)
{
    return llmem_tensor_2d(q->scratch, off, LLMEM_DTYPE_F32, rows, cols);
}

static llmem_status matmul(llmem_model *m, const llmem_tensor *a, const llmem_tensor *w,
                           const llmem_tensor *out)
{
    if (m->p.precision == LLMEM_PRECISION_FAST)
        return llmem_op_matmul_fast(m->be, a, w, out);
    return llmem_op_matmul(m->be, a, w, out);
}

/* h [T, D] -> h: the gated delta net mixer. */
static llmem_status gdn_mixer(llmem_model *m, const llmem_tensor *W, int32_t T,
                              const llmem_view *v, const llmem_tensor *h)
{
    const llmem_model_config *c = &m->cfg;
    const hf_qwen3n *q = m->q3n;
    int32_t hv = c->ssm_n_heads, cd = c->ssm_conv_dim, din = c->ssm_d_inner;
    float eps = (float)c->norm_eps;
    llmem_tensor proj = sc(q, q->off_proj, T, c->ssm_in_proj_dim), ba = sc(q, q->off_ba, T, 2 * hv);
    TRY(matmul(m, h, &W[QW_QKVZ], &proj));
    TRY(matmul(m, h, &W[QW_BA], &ba));
    llmem_tensor xbc = sc(q, q->off_xbc, T, cd), z = sc(q, q->off_z, T, din);
    llmem_tensor b = sc(q, q->off_b, T, hv), a = sc(q, q->off_a, T, hv);
    if (T == 1) { /* one row: the parts are contiguous slices */
        xbc = sc(q, q->off_proj, 1, cd);
        z = sc(q, q->off_proj + (size_t)cd * 4, 1, din);
        b = sc(q, q->off_ba, 1, hv);
        a = sc(q, q->off_ba + (size_t)hv * 4, 1, hv);
    } else {
        TRY(llmem_op_copy(m->be, &proj, 0, &xbc));
        TRY(llmem_op_copy(m->be, &proj, cd, &z));
        TRY(llmem_op_copy(m->be, &ba, 0, &b));
        TRY(llmem_op_copy(m->be, &ba, hv, &a));
    }
    llmem_tensor conv = sc(q, q->off_conv, T, cd), y = sc(q, q->off_y, T, din);
    TRY(llmem_op_ssm_conv(m->be, v, 0, &xbc, &W[QW_CONV], NULL, &conv));
    llmem_gdn_params gp = {c->ssm_n_groups, hv, c->ssm_d_state, c->ssm_head_dim};
    TRY(llmem_op_gdn(m->be, &gp, v, 1, &conv, &a, &b, &W[QW_A_LOG], &W[QW_DT_BIAS], &y));
    llmem_tensor yh = sc(q, q->off_y, T * hv, c->ssm_head_dim);
    TRY(llmem_op_rms_norm(m->be, &yh, &W[QW_GNORM], eps, &yh));
    TRY(llmem_op_swiglu(m->be, &z, &y, &y)); /* norm(y) * silu(z) */
    return matmul(m, &y, &W[QW_OUT], h);
}

/* h [T, D] -> h: gated full attention with q/k norms and partial RoPE. */
static llmem_status attn_mixer(llmem_model *m, const llmem_tensor *W, int32_t T,
                               const llmem_view *v, const llmem_tensor *h)
{
    const llmem_model_config *c = &m->cfg;
    const hf_qwen3n *q = m->q3n;
    int32_t H = c->n_heads, Hk = c->n_kv_heads, Dh = c->head_dim;
    float eps = (float)c->norm_eps;
    llmem_tensor qg = sc(q, q->off_proj, T, 2 * H * Dh);
    TRY(matmul(m, h, &W[QW_Q], &qg));
    llmem_tensor qg_rows = sc(q, q->off_proj, T * H, 2 * Dh);
    llmem_tensor qr = sc(q, q->off_q, T * H, Dh), gr = sc(q, q->off_g, T * H, Dh);
    TRY(llmem_op_copy(m->be, &qg_rows, 0, &qr));
    TRY(llmem_op_copy(m->be, &qg_rows, Dh, &gr));
    llmem_tensor k = sc(q, q->off_k, T, Hk * Dh), vv = sc(q, q->off_v, T, Hk * Dh);
    TRY(matmul(m, h, &W[QW_K], &k));
    TRY(matmul(m, h, &W[QW_V], &vv));
    llmem_tensor kr = sc(q, q->off_k, T * Hk, Dh);
    TRY(llmem_op_rms_norm(m->be, &qr, &W[QW_QNORM], eps, &qr));
    TRY(llmem_op_rms_norm(m->be, &kr, &W[QW_KNORM], eps, &kr));
    llmem_tensor q3 = llmem_tensor_3d(q->scratch, q->off_q, LLMEM_DTYPE_F32, T, H, Dh);
    llmem_tensor k3 = llmem_tensor_3d(q->scratch, q->off_k, LLMEM_DTYPE_F32, T, Hk, Dh);
    llmem_tensor v3 = llmem_tensor_3d(q->scratch, q->off_v, LLMEM_DTYPE_F32, T, Hk, Dh);
    llmem_tensor o3 = llmem_tensor_3d(q->scratch, q->off_o, LLMEM_DTYPE_F32, T, H, Dh);
    llmem_rope_params rp = {.mode = LLMEM_ROPE_NEOX, .n_rot = c->rope_dim,
                            .theta_base = (float)c->rope_theta, .freq_scale = 1.0f};
    llmem_tensor pos = llmem_tensor_1d(m->scratch, m->off_pos, LLMEM_DTYPE_I32, T);
    if (llmem_view_kv(v)->shift_slot.n > 0)
        TRY(llmem_op_rope_shift(m->be, &rp, v));
    TRY(llmem_op_rope(m->be, &rp, &q3, &pos, &q3));
    TRY(llmem_op_rope(m->be, &rp, &k3, &pos, &k3));
    TRY(llmem_op_kv_store(m->be, v, &k3, &v3));
    llmem_attn_params ap = {.scale = (float)c->attention_scale,
                            .fast = m->p.precision == LLMEM_PRECISION_FAST};
    TRY(llmem_op_attention_paged(m->be, &ap, v, &q3, &o3));
    llmem_tensor o = sc(q, q->off_o, T, H * Dh), g = sc(q, q->off_g, T, H * Dh);
    TRY(llmem_op_sigmoid_mul(m->be, &o, &g, &o));
    return matmul(m, &o, &W[QW_O], h);
}

/* h [T, D] -> h: routed experts plus the sigmoid-gated shared expert. */
static llmem_status moe(llmem_model *m, const llmem_tensor *W, int32_t T, const llmem_tensor *h)
{
    const llmem_model_config *c = &m->cfg;
    const hf_qwen3n *q = m->q3n;
    int32_t E = c->n_expert, k = c->n_expert_used, D = c->hidden_size;
    int32_t Is = c->moe_shared_intermediate_size;
    llmem_tensor logits = sc(q, q->off_logits, T, E);
    llmem_tensor ids = llmem_tensor_2d(q->scratch, q->off_ids, LLMEM_DTYPE_I32, T, k);
    llmem_tensor wts = sc(q, q->off_wts, T, k), routed = sc(q, q->off_routed, T, D);
    TRY(llmem_op_matmul(m->be, h, &W[QW_ROUTER], &logits));
    llmem_moe_route_params rp = {.n_expert = E, .n_expert_used = k,
                                 .scoring = LLMEM_MOE_SOFTMAX, .norm_topk = c->moe_norm_topk,
                                 .scale = 1.0f};
    TRY(llmem_op_moe_route(m->be, &rp, &logits, NULL, &ids, &wts));
    llmem_moe_ffn_params fp = {.act = LLMEM_MOE_ACT_SILU, .gated = true};
    TRY(llmem_op_moe_ffn(m->be, &fp, h, &ids, &wts, &W[QW_EXP_UP], &W[QW_EXP_DOWN], &routed));
    llmem_tensor sh = sc(q, q->off_sh, T, 2 * Is), g = sc(q, q->off_shg, T, Is);
    llmem_tensor u = sc(q, q->off_shu, T, Is), shared = sc(q, q->off_shared, T, D);
    llmem_tensor sg = sc(q, q->off_sg, T, 1);
    TRY(matmul(m, h, &W[QW_SH_UP], &sh));
    TRY(llmem_op_copy(m->be, &sh, 0, &g));
    TRY(llmem_op_copy(m->be, &sh, Is, &u));
    TRY(llmem_op_swiglu(m->be, &g, &u, &u));
    TRY(matmul(m, &u, &W[QW_SH_DOWN], &shared));
    TRY(llmem_op_matmul(m->be, h, &W[QW_SH_GATE], &sg));
    TRY(llmem_op_sigmoid_mul(m->be, &shared, &sg, &shared));
    return llmem_op_add(m->be, &routed, &shared, h);
}

llmem_status hf_qwen3n_layer(llmem_model *m, int32_t il, int32_t T, const llmem_view *v,
                             bool pend)
{
    const hf_qwen3n *q = m->q3n;
    const llmem_tensor *W = q->w[il];
    float eps = (float)m->cfg.norm_eps;
    if (T > q->n_ubatch)
        return LLMEM_E_INVALID;
    llmem_tensor x = llmem_tensor_2d(m->scratch, m->off_x, LLMEM_DTYPE_F32, T, m->cfg.hidden_size);
    llmem_tensor h = llmem_tensor_2d(m->scratch, m->off_h, LLMEM_DTYPE_F32, T, m->cfg.hidden_size);
    TRY(pend ? llmem_op_add_rms_norm(m->be, &x, &h, &W[QW_NORM_IN], eps, &h)
             : llmem_op_rms_norm(m->be, &x, &W[QW_NORM_IN], eps, &h));
    if (m->cfg.layers[il].kind == LLMEM_LAYER_GDN)
        TRY(gdn_mixer(m, W, T, v, &h));
    else
        TRY(attn_mixer(m, W, T, v, &h));
    TRY(llmem_op_add_rms_norm(m->be, &x, &h, &W[QW_NORM_POST], eps, &h));
    return moe(m, W, T, &h);
}

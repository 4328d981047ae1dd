/* llmem models/: mixture-of-experts FFNs of granitemoehybrid and nemotron_h.
 *
 * Tensor names (transformers 5.17 save_pretrained):
 *   granitemoehybrid  model.layers.N.block_sparse_moe.{router.layer,
 *                     input_linear, output_linear}.weight ([E, H], [E, 2I, H]
 *                     with gate rows first, [E, H, I]) and
 *                     model.layers.N.shared_mlp.{input_linear, output_linear}
 *                     ([2Is, H] gate then up, [H, Is]);
 *   nemotron_h        backbone.layers.N.mixer.gate.{weight,
 *                     e_score_correction_bias}, mixer.experts.E.{up,down}_proj
 *                     .weight (one [I, H] / [H, I] tensor per expert), and
 *                     mixer.shared_experts.{up,down}_proj.weight.
 * The forward pass (GraniteMoeHybridMoE + GraniteMoeHybridMLP; NemotronHMoE):
 *   out = shared(h) + sum_j w_j expert_{e_j}(h), with the routing of
 *   llmem_op_moe_route and the experts of llmem_op_moe_ffn.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/ops.h"
#include "llmem/ops_moe.h"
#include "models/hf_internal.h"

static void shape3(int64_t *shape, int32_t *nd, int32_t n, int64_t a, int64_t b, int64_t c)
{
    shape[0] = a;
    shape[1] = b;
    shape[2] = c;
    *nd = n;
}

/* Whether layer `layer` computes an MoE / shared-expert FFN. */
static bool moe_layer(const llmem_model_config *cfg, int32_t layer)
{
    const llmem_layer_config *L = &cfg->layers[layer];
    if (cfg->arch == LLMEM_ARCH_JAMBA)
        return L->ffn_moe;
    if (cfg->arch == LLMEM_ARCH_GRANITEMOEHYBRID)
        return L->has_ffn;
    return cfg->arch == LLMEM_ARCH_NEMOTRON_H && L->kind == LLMEM_LAYER_MOE;
}

bool hf_moe_weight(const llmem_model_config *cfg, llmem_weight w, int32_t layer, char *buf,
                   size_t buf_len, int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS], int32_t *n_dims)
{
    if (layer < 0 || layer >= cfg->n_layers || !moe_layer(cfg, layer))
        return false;
    const bool granite = cfg->arch == LLMEM_ARCH_GRANITEMOEHYBRID;
    const bool jamba = cfg->arch == LLMEM_ARCH_JAMBA;
    const int64_t H = cfg->hidden_size, E = cfg->n_expert, I = cfg->moe_intermediate_size;
    const int64_t Is = cfg->moe_shared_intermediate_size;
    const int64_t g = cfg->moe_gated ? 2 : 1;
    const char *leaf;
    bool routed = E > 0;
    switch (w) {
    case LLMEM_W_MOE_ROUTER:
        leaf = granite ? "block_sparse_moe.router.layer.weight"
               : jamba ? "feed_forward.router.weight" : "mixer.gate.weight";
        shape3(shape, n_dims, 2, E, H, 0);
        break;
    case LLMEM_W_MOE_ROUTER_BIAS:
        routed = routed && cfg->moe_router_bias;
        leaf = "mixer.gate.e_score_correction_bias";
        shape3(shape, n_dims, 1, E, 0, 0);
        break;
    case LLMEM_W_MOE_UP:
        leaf = granite ? "block_sparse_moe.input_linear.weight"
               : jamba ? "feed_forward.experts.gate_up_proj" : "mixer.experts.up_proj";
        shape3(shape, n_dims, 3, E, g * I, H);
        break;
    case LLMEM_W_MOE_DOWN:
        leaf = granite ? "block_sparse_moe.output_linear.weight"
               : jamba ? "feed_forward.experts.down_proj" : "mixer.experts.down_proj";
        shape3(shape, n_dims, 3, E, H, I);
        break;
    case LLMEM_W_SHARED_UP:
        routed = Is > 0;
        leaf = granite ? "shared_mlp.input_linear.weight" : "mixer.shared_experts.up_proj.weight";
        shape3(shape, n_dims, 2, g * Is, H, 0);
        break;
    case LLMEM_W_SHARED_DOWN:
        routed = Is > 0;
        leaf = granite ? "shared_mlp.output_linear.weight"
                       : "mixer.shared_experts.down_proj.weight";
        shape3(shape, n_dims, 2, H, Is, 0);
        break;
    default:
        return false;
    }
    if (!routed)
        return false;
    int n = snprintf(buf, buf_len, "%slayers.%d.%s", cfg->tensor_prefix, (int)layer, leaf);
    if (n < 0 || (size_t)n >= buf_len) {
        buf[0] = '\0';
        return false;
    }
    return true;
}

bool hf_moe_is_split(const llmem_model_config *cfg, llmem_weight w)
{
    return cfg->moe_split_experts && (w == LLMEM_W_MOE_UP || w == LLMEM_W_MOE_DOWN);
}

/* Tensors per expert of a split weight: a gated up (jamba) is stored as
 * gate_proj then up_proj, packed in that order ([2I, H], gate rows first). */
static int32_t split_parts(const llmem_model_config *cfg, llmem_weight w)
{
    return cfg->moe_gated && w == LLMEM_W_MOE_UP ? 2 : 1;
}

int32_t hf_moe_split_count(const llmem_model_config *cfg, llmem_weight w)
{
    return cfg->n_expert * split_parts(cfg, w);
}

/* Name and 2-D shape of tensor i (expert i / parts, part i % parts) of a
 * split weight. */
static bool expert_name(const llmem_model_config *cfg, llmem_weight w, int32_t layer, int32_t i,
                        char *buf, size_t len, int64_t *rows, int64_t *cols)
{
    bool up = w == LLMEM_W_MOE_UP;
    int32_t parts = split_parts(cfg, w), e = i / parts;
    *rows = up ? cfg->moe_intermediate_size : cfg->hidden_size;
    *cols = up ? cfg->hidden_size : cfg->moe_intermediate_size;
    const char *leaf = !up ? "down_proj" : parts == 2 && i % parts == 0 ? "gate_proj" : "up_proj";
    int n = snprintf(buf, len, "%slayers.%d.%s.experts.%d.%s.weight", cfg->tensor_prefix,
                     (int)layer, cfg->arch == LLMEM_ARCH_JAMBA ? "feed_forward" : "mixer",
                     (int)e, leaf);
    return n > 0 && (size_t)n < len;
}

bool hf_moe_split_name(const llmem_model_config *cfg, llmem_weight w, int32_t layer, int32_t e,
                       char *buf, size_t len)
{
    int64_t rows, cols;
    return expert_name(cfg, w, layer, e, buf, len, &rows, &cols);
}

llmem_status hf_moe_check_split(const llmem_model_config *cfg, const llmem_safetensors *st,
                                llmem_weight w, int32_t layer, char *err, size_t err_len)
{
    llmem_dtype dt = LLMEM_DTYPE_COUNT;
    for (int32_t i = 0; i < hf_moe_split_count(cfg, w); i++) {
        char name[256];
        int64_t rows, cols;
        int32_t e = i / split_parts(cfg, w);
        if (!expert_name(cfg, w, layer, i, name, sizeof name, &rows, &cols))
            return LLMEM_E_INVALID;
        llmem_tensor_info ti;
        llmem_status s = llmem_safetensors_find(st, name, &ti, NULL, 0);
        if (s == LLMEM_E_NOT_FOUND) {
            llmem_errf(err, err_len, "missing tensor '%s' (layer %d, moe, expert %d of %d)", name,
                    (int)layer, (int)e, (int)cfg->n_expert);
            return s;
        }
        if (s == LLMEM_E_UNSUPPORTED) {
            llmem_errf(err, err_len, "%s: tensor '%s' has dtype %s; llmem reads F32, F16 and BF16",
                    ti.file, name, ti.st_dtype);
            return s;
        }
        if (s != LLMEM_OK)
            return s;
        if (ti.n_dims != 2 || ti.shape[0] != rows || ti.shape[1] != cols) {
            llmem_errf(err, err_len, "%s: tensor '%s' (layer %d, moe) is not [%lld, %lld] as "
                    "config.json says", ti.file, name, (int)layer, (long long)rows,
                    (long long)cols);
            return LLMEM_E_CORRUPT;
        }
        if (i > 0 && ti.dtype != dt) {
            llmem_errf(err, err_len, "%s: tensor '%s' has dtype %s, unlike expert 0's", ti.file,
                    name, ti.st_dtype);
            return LLMEM_E_UNSUPPORTED;
        }
        dt = ti.dtype;
    }
    return LLMEM_OK;
}

llmem_status hf_moe_load_split(const llmem_model_config *cfg, const llmem_safetensors *st,
                               llmem_weight w, int32_t layer, llmem_buffer *buf, size_t off,
                               size_t *bytes, llmem_tensor *t, hf_slice_fn slice,
                               const void *slice_ctx, char *err, size_t err_len)
{
    size_t total = 0;
    int64_t rows = 0, cols = 0;
    llmem_dtype dt = LLMEM_DTYPE_F32;
    for (int32_t i = 0; i < hf_moe_split_count(cfg, w); i++) {
        char name[256];
        if (!expert_name(cfg, w, layer, i, name, sizeof name, &rows, &cols))
            return LLMEM_E_INVALID;
        llmem_tensor_info ti;
        llmem_status s = llmem_safetensors_find(st, name, &ti, err, err_len);
        if (s != LLMEM_OK)
            return s;
        dt = ti.dtype;
        void *shard = NULL;
        if (slice && (s = slice(slice_ctx, w, &ti, &shard, err, err_len)) != LLMEM_OK)
            return s;
        if (buf && (s = llmem_buffer_upload(buf, off + total, ti.data, ti.n_bytes)) != LLMEM_OK) {
            free(shard);
            llmem_errf(err, err_len, "uploading '%s' failed: %s", name, llmem_status_str(s));
            return s;
        }
        free(shard);
        total += ti.n_bytes;
    }
    *bytes = total;
    *t = llmem_tensor_3d(buf, off, dt, cfg->n_expert, (int32_t)rows * split_parts(cfg, w),
                         (int32_t)cols);
    return LLMEM_OK;
}

/* ---- forward ----------------------------------------------------------------------------- */

struct hf_moe {
    llmem_buffer *scratch;
    int32_t n_ubatch;
    size_t off_logits, off_ids, off_w, off_sh, off_g, off_u, off_routed, off_shared;
};

static size_t take(size_t *off, size_t bytes)
{
    size_t at = *off;
    *off += (bytes + 255) / 256 * 256;
    return at;
}

llmem_status hf_moe_create(llmem_backend *be, const llmem_model_config *cfg, int32_t n_ubatch,
                           hf_moe **out)
{
    *out = NULL;
    bool any = false;
    for (int32_t l = 0; l < cfg->n_layers; l++)
        any |= moe_layer(cfg, l);
    if (!any)
        return LLMEM_OK;
    hf_moe *mo = calloc(1, sizeof *mo);
    if (!mo)
        return LLMEM_E_NO_MEMORY;
    size_t T = (size_t)n_ubatch, off = 0;
    size_t E = (size_t)cfg->n_expert, k = (size_t)cfg->n_expert_used;
    size_t Is = (size_t)cfg->moe_shared_intermediate_size, H = (size_t)cfg->hidden_size;
    mo->n_ubatch = n_ubatch;
    mo->off_logits = take(&off, T * (E ? E : 1) * 4);
    mo->off_ids = take(&off, T * (k ? k : 1) * 4);
    mo->off_w = take(&off, T * (k ? k : 1) * 4);
    mo->off_sh = take(&off, T * (2 * Is + 1) * 4);
    mo->off_g = take(&off, T * (Is + 1) * 4);
    mo->off_u = take(&off, T * (Is + 1) * 4);
    mo->off_routed = take(&off, T * H * 4);
    mo->off_shared = take(&off, T * H * 4);
    llmem_status s = llmem_buffer_alloc(be, off, &mo->scratch);
    if (s != LLMEM_OK) {
        free(mo);
        return s;
    }
    *out = mo;
    return LLMEM_OK;
}

void hf_moe_destroy(hf_moe *mo)
{
    if (!mo)
        return;
    llmem_buffer_free(mo->scratch);
    free(mo);
}

/* The shared expert / shared MLP: out = down(act(gate h) * up h) (granite,
 * gated SiLU) or down(act(up h)) (nemotron_h). */
static llmem_status shared_mlp(hf_moe *mo, llmem_backend *be, const llmem_model_config *cfg,
                               const llmem_tensor *up_w, const llmem_tensor *down_w,
                               const llmem_tensor *h, int32_t T, const llmem_tensor *out)
{
    int32_t Is = cfg->moe_shared_intermediate_size;
    llmem_buffer *b = mo->scratch;
    if (cfg->moe_gated) {
        llmem_tensor sh = llmem_tensor_2d(b, mo->off_sh, LLMEM_DTYPE_F32, T, 2 * Is);
        llmem_tensor g = llmem_tensor_2d(b, mo->off_g, LLMEM_DTYPE_F32, T, Is);
        llmem_tensor u = llmem_tensor_2d(b, mo->off_u, LLMEM_DTYPE_F32, T, Is);
        TRY(llmem_op_matmul(be, h, up_w, &sh));
        TRY(llmem_op_copy(be, &sh, 0, &g));
        TRY(llmem_op_copy(be, &sh, Is, &u));
        if (cfg->ffn_act == LLMEM_ACT_SILU) {
            TRY(llmem_op_swiglu(be, &g, &u, &u));
        } else {
            TRY(llmem_op_relu2(be, &g, &g));
            TRY(llmem_op_mul(be, &g, &u, &u));
        }
        return llmem_op_matmul(be, &u, down_w, out);
    }
    llmem_tensor u = llmem_tensor_2d(b, mo->off_u, LLMEM_DTYPE_F32, T, Is);
    TRY(llmem_op_matmul(be, h, up_w, &u));
    if (cfg->ffn_act == LLMEM_ACT_RELU2)
        TRY(llmem_op_relu2(be, &u, &u));
    else
        TRY(llmem_op_silu(be, &u, &u));
    return llmem_op_matmul(be, &u, down_w, out);
}

llmem_status hf_moe_ffn(hf_moe *mo, llmem_backend *be, const llmem_model_config *cfg,
                        const llmem_tensor *const w[6], const llmem_tensor *h, int32_t T)
{
    if (!mo || T > mo->n_ubatch)
        return LLMEM_E_INVALID;
    int32_t H = cfg->hidden_size, E = cfg->n_expert, k = cfg->n_expert_used;
    llmem_buffer *b = mo->scratch;
    llmem_tensor shared = llmem_tensor_2d(b, mo->off_shared, LLMEM_DTYPE_F32, T, H);
    llmem_tensor routed = llmem_tensor_2d(b, mo->off_routed, LLMEM_DTYPE_F32, T, H);
    const llmem_tensor *sh_up = w[LLMEM_W_SHARED_UP - LLMEM_W_MOE_ROUTER];
    const llmem_tensor *sh_down = w[LLMEM_W_SHARED_DOWN - LLMEM_W_MOE_ROUTER];
    const llmem_tensor *router = w[0], *bias = w[1], *up = w[2], *down = w[3];
    bool has_shared = sh_up && sh_down, has_routed = E > 0 && router && up && down;
    if (has_shared)
        TRY(shared_mlp(mo, be, cfg, sh_up, sh_down, h, T, &shared));
    if (has_routed) {
        llmem_tensor logits = llmem_tensor_2d(b, mo->off_logits, LLMEM_DTYPE_F32, T, E);
        llmem_tensor ids = llmem_tensor_2d(b, mo->off_ids, LLMEM_DTYPE_I32, T, k);
        llmem_tensor wts = llmem_tensor_2d(b, mo->off_w, LLMEM_DTYPE_F32, T, k);
        TRY(llmem_op_matmul(be, h, router, &logits));
        llmem_moe_route_params rp = {
            .n_expert = E, .n_expert_used = k,
            .scoring = cfg->moe_sigmoid ? LLMEM_MOE_SIGMOID : LLMEM_MOE_SOFTMAX,
            .norm_topk = cfg->moe_norm_topk, .n_group = cfg->moe_n_group,
            .topk_group = cfg->moe_topk_group, .scale = (float)cfg->moe_routed_scale};
        TRY(llmem_op_moe_route(be, &rp, &logits, bias, &ids, &wts));
        llmem_moe_ffn_params fp = {
            .act = cfg->ffn_act == LLMEM_ACT_RELU2 ? LLMEM_MOE_ACT_RELU2 : LLMEM_MOE_ACT_SILU,
            .gated = cfg->moe_gated};
        TRY(llmem_op_moe_ffn(be, &fp, h, &ids, &wts, up, down, &routed));
    }
    if (has_shared && has_routed)
        return llmem_op_add(be, &shared, &routed, h);
    if (has_shared)
        return llmem_op_scale(be, &shared, 1.0f, h);
    if (has_routed)
        return llmem_op_scale(be, &routed, 1.0f, h);
    return LLMEM_E_INVALID;
}

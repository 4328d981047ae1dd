/* llmem models/: the reference forward pass of llama, mamba2, bamba and
 * nemotron_h over llmem memories and backend ops.
 *
 * Block structure (transformers 5):
 *   llama       x += attn(norm(x)); x += mlp(norm(x))
 *   bamba       x += mixer(norm(x)) (mamba or attention); x += mlp(norm(x))
 *   mamba2      x += mamba(norm(x))
 *   nemotron_h  x += mixer(norm(x)) (mamba, attention or relu2 MLP)
 *   then final norm, lm_head on output rows only.
 * Mamba-2 mixer: in_proj -> [z | xBC | dt]; xBC = silu(conv1d(xBC)) with
 * the conv state; y = SSM scan(x, dt, A, B, C, D) with the ssm state;
 * y = gated_rms_norm(y, z); out_proj (Dao & Gu 2024; transformers
 * Mamba2Mixer.torch_forward). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"
#include "llmem/comm.h"
#include "llmem/model.h"
#include "llmem/hybrid.h"
#include "llmem/kv_cache.h"
#include "llmem/ops.h"
#include "llmem/recurrent.h"
#include "llmem/runtime.h"
#include "models/hf_internal.h"

#include "models/model_internal.h"

llmem_model_params llmem_model_default_params(void)
{
    llmem_model_params p = {0};
    p.n_seq_max = 8;
    p.n_ubatch = 512;
    p.n_ctx = 4096;
    p.page_size = 16;
    p.kv_dtype = LLMEM_DTYPE_COUNT; /* by precision (resolve_params) */
    p.precision = LLMEM_PRECISION_PRECISE;
    p.ssm_dtype = LLMEM_DTYPE_F32;
    p.n_snapshots = -1;
    p.tp = 1;
    return p;
}

const char *llmem_precision_name(llmem_precision p)
{
    return p == LLMEM_PRECISION_PRECISE ? "precise" : p == LLMEM_PRECISION_FAST ? "fast" : "?";
}

llmem_status llmem_precision_parse(const char *name, llmem_precision *out)
{
    if (!name || !out)
        return LLMEM_E_INVALID;
    if (!strcmp(name, "precise"))
        *out = LLMEM_PRECISION_PRECISE;
    else if (!strcmp(name, "fast"))
        *out = LLMEM_PRECISION_FAST;
    else
        return LLMEM_E_INVALID;
    return LLMEM_OK;
}

/* Fills the defaults that depend on other fields, and checks the dtypes. */
static bool resolve_params(llmem_model_params *p)
{
    if (p->precision != LLMEM_PRECISION_PRECISE && p->precision != LLMEM_PRECISION_FAST)
        return false;
    if (p->kv_dtype == LLMEM_DTYPE_COUNT)
        p->kv_dtype = p->precision == LLMEM_PRECISION_FAST ? LLMEM_DTYPE_BF16 : LLMEM_DTYPE_F32;
    bool float_kv = p->kv_dtype == LLMEM_DTYPE_F32 || p->kv_dtype == LLMEM_DTYPE_F16 ||
                    p->kv_dtype == LLMEM_DTYPE_BF16 || llmem_dtype_is_scaled(p->kv_dtype);
    bool float_ssm = p->ssm_dtype == LLMEM_DTYPE_F32 || p->ssm_dtype == LLMEM_DTYPE_F16 ||
                     p->ssm_dtype == LLMEM_DTYPE_BF16 || p->ssm_dtype == LLMEM_DTYPE_I8;
    return float_kv && float_ssm;
}

/* A hybrid's recurrent child keeps snapshots so that prompts sharing a
 * prefix skip it (issue 13): by default one per sequence in flight, at
 * least 16, at every page boundary (every 16 tokens at smaller pages).
 * LLMEM_SNAPSHOTS, when set, decides instead (the recurrent memory reads it
 * when n_snapshots is 0). */
static void hybrid_snapshots(const llmem_model_params *p, llmem_recurrent_params *rp)
{
    const char *env = getenv("LLMEM_SNAPSHOTS");
    int32_t n = p->n_snapshots;
    if (n < 0) /* a budget sizes them (-1: as many as it holds) */
        n = p->no_prefix_cache || (env && *env) ? 0
            : p->prefix_cache_bytes > 0       ? -1
            : (p->n_seq_max > 16 ? p->n_seq_max : 16);
    rp->n_snapshots = n;
    rp->prefix_cache_bytes = p->no_prefix_cache ? 0 : p->prefix_cache_bytes;
    rp->snap_interval = p->snap_interval > 0 ? p->snap_interval
                                             : (p->page_size > 16 ? p->page_size : 16);
}

static llmem_tensor tensor_from(llmem_buffer *buf, size_t off, llmem_dtype dt, const int64_t *shape,
                                int32_t n_dims)
{
    llmem_tensor t = {0};
    t.buf = buf;
    t.offset = off;
    t.dtype = dt;
    /* conv1d weights [C, 1, K] are used as [C, K] */
    if (n_dims == 3 && shape[1] == 1) {
        t.n_dims = 2;
        t.ne[0] = (int32_t)shape[0];
        t.ne[1] = (int32_t)shape[2];
        return t;
    }
    t.n_dims = n_dims;
    for (int32_t d = 0; d < n_dims; d++)
        t.ne[d] = (int32_t)shape[d];
    return t;
}

/* Largest q | k | v buffer packed by pack_qkv: well under the 4 GiB that
 * Vulkan drivers refuse (a 9B model's embedding, 1 GiB, loads the same way). */
#define QKV_PACK_MAX ((size_t)1 << 30)

/* Attention layer il's q, k and v projections back to back in one buffer
 * ([Nq + Nk + Nv, hidden], no gap), so that a one-token step can run them
 * as one matmul (models/forward.c, qkv_decode). Packs only where the three
 * are 2-D, of one dtype and width, each a multiple of ALIGN bytes, and
 * LLMEM_NO_QKV_PACK is not 1; *packed says whether it did. Anything it
 * does not pack is left to the per-tensor path, which reports the errors.
 * Returns LLMEM_OK, or the failed allocation's or upload's status with err
 * set. */
static llmem_status pack_qkv(llmem_model *m, const llmem_safetensors *st, int32_t il,
                             bool *packed, char *err, size_t err_len)
{
    static const llmem_weight ws[3] = {LLMEM_W_ATTN_Q, LLMEM_W_ATTN_K, LLMEM_W_ATTN_V};
    llmem_tensor_info info[3];
    char name[256], ferr[64];
    int64_t shape[8];
    int32_t nd;
    size_t total = 0;
    const char *e = getenv("LLMEM_NO_QKV_PACK");
    *packed = false;
    if (m->tp_size > 1 || (e && atoi(e) == 1))
        return LLMEM_OK;
    for (int i = 0; i < 3; i++) {
        if (!llmem_model_weight(&m->cfg, ws[i], il, name, sizeof name, shape, &nd) || nd != 2 ||
            llmem_safetensors_find(st, name, &info[i], ferr, sizeof ferr) != LLMEM_OK)
            return LLMEM_OK;
        const llmem_tensor_info *t = &info[i];
        if (t->n_dims != 2 || t->shape[0] != shape[0] || t->shape[1] != shape[1] ||
            t->dtype != info[0].dtype || t->shape[1] != info[0].shape[1] ||
            (t->dtype != LLMEM_DTYPE_F32 && t->dtype != LLMEM_DTYPE_F16 &&
             t->dtype != LLMEM_DTYPE_BF16) ||
            t->n_bytes == 0 || t->n_bytes % ALIGN != 0 || t->n_bytes > QKV_PACK_MAX - total)
            return LLMEM_OK;
        total += t->n_bytes;
    }
    llmem_buffer *buf = NULL;
    llmem_status s = llmem_buffer_alloc(m->be, total, &buf);
    if (s != LLMEM_OK) {
        llmem_errf(err, err_len, "cannot allocate %zu bytes for layer %d's q/k/v on %s", total,
                   (int)il, llmem_backend_name(m->be));
        return s;
    }
    m->weights[m->n_weights++] = buf;
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        if ((s = llmem_buffer_upload(buf, off, info[i].data, info[i].n_bytes)) != LLMEM_OK) {
            llmem_errf(err, err_len, "uploading layer %d's q/k/v failed: %s", (int)il,
                       llmem_status_str(s));
            return s;
        }
        m->layers[il].w[ws[i]] = (wt){
            .present = true, .t = tensor_from(buf, off, info[i].dtype, info[i].shape, 2)};
        off += info[i].n_bytes;
    }
    *packed = true;
    return LLMEM_OK;
}

/* Uploads every weight the architecture uses, each into a buffer of its
 * own: a backend then never needs one allocation larger than its largest
 * tensor (Vulkan drivers refuse allocations from 4 GiB up, and bind at most
 * maxStorageBufferRange bytes), and sub-allocating backends pack the small
 * ones (docs/vulkan.md). */
static llmem_status load_weights(llmem_model *m, const llmem_safetensors *st, char *err,
                                 size_t err_len)
{
    const llmem_model_config *cfg = &m->cfg;
    char name[256];
    int64_t shape[8];
    int32_t nd;
    llmem_tensor_info info;
    int32_t cap = (cfg->n_layers + 1) * LLMEM_W_COUNT;
    if (!(m->weights = calloc((size_t)cap, sizeof *m->weights)))
        return LLMEM_E_NO_MEMORY;
    for (int32_t il = -1; il < cfg->n_layers; il++) {
        bool qkv = false; /* q, k, v packed into one buffer (pack_qkv) */
        for (int32_t w = 0; w < LLMEM_W_COUNT; w++) {
            bool global = w == LLMEM_W_EMBED || w == LLMEM_W_FINAL_NORM || w == LLMEM_W_LM_HEAD;
            if (global != (il < 0))
                continue;
            if (w == LLMEM_W_ATTN_Q) {
                llmem_status s = pack_qkv(m, st, il, &qkv, err, err_len);
                if (s != LLMEM_OK)
                    return s;
            }
            if (qkv && (w == LLMEM_W_ATTN_Q || w == LLMEM_W_ATTN_K || w == LLMEM_W_ATTN_V))
                continue;
            if (!llmem_model_weight(cfg, (llmem_weight)w, il < 0 ? 0 : il, name, sizeof name,
                                    shape, &nd))
                continue;
            if (hf_moe_is_split(cfg, (llmem_weight)w)) { /* experts packed back to back */
                size_t nb = 0;
                llmem_tensor t;
                llmem_buffer *buf = NULL;
                hf_slice_fn slice = m->tp_size > 1 ? hf_tp_slice : NULL;
                llmem_status s = hf_moe_load_split(cfg, st, (llmem_weight)w, il, NULL, 0, &nb,
                                                   &t, slice, m, err, err_len);
                if (s == LLMEM_OK && (s = llmem_buffer_alloc(m->be, round_up(nb), &buf)) != LLMEM_OK)
                    snprintf(err, err_len, "cannot allocate %zu bytes for '%s' on %s", nb, name,
                             llmem_backend_name(m->be));
                if (s != LLMEM_OK)
                    return s;
                m->weights[m->n_weights++] = buf;
                s = hf_moe_load_split(cfg, st, (llmem_weight)w, il, buf, 0, &nb, &t, slice, m,
                                      err, err_len);
                if (s != LLMEM_OK)
                    return s;
                m->layers[il].w[w] = (wt){.present = true, .t = t};
                continue;
            }
            llmem_status s = llmem_safetensors_find(st, name, &info, err, err_len);
            if (s != LLMEM_OK)
                return s;
            wt *dst = il < 0 ? (w == LLMEM_W_EMBED ? &m->embed
                                : w == LLMEM_W_FINAL_NORM ? &m->final_norm : &m->lm_head)
                             : &m->layers[il].w[w];
            llmem_buffer *buf = NULL;
            if (hf_gemma3_is_norm(cfg, (llmem_weight)w)) { /* f32 (1 + w) */
                if ((s = hf_gemma3_load_norm(m->be, &info, &buf, &dst->t)) != LLMEM_OK) {
                    llmem_errf(err, err_len, "loading norm '%s' failed: %s", name,
                               llmem_status_str(s));
                    return s;
                }
                m->weights[m->n_weights++] = buf;
                dst->present = true;
                continue;
            }
            void *shard = NULL; /* a tensor-parallel rank's slice (models/tp.c) */
            bool skip = false;
            if (m->tp_size > 1 &&
                (s = hf_tp_shard(m, (llmem_weight)w, &info, &shard, &skip, err, err_len)) != LLMEM_OK)
                return s;
            if (skip)
                continue;
            s = llmem_buffer_alloc(m->be, info.n_bytes ? round_up(info.n_bytes) : ALIGN, &buf);
            if (s != LLMEM_OK) {
                free(shard);
                llmem_errf(err, err_len, "cannot allocate %zu bytes for '%s' on %s", info.n_bytes,
                         name, llmem_backend_name(m->be));
                return s;
            }
            m->weights[m->n_weights++] = buf;
            s = llmem_buffer_upload(buf, 0, info.data, info.n_bytes);
            free(shard);
            if (s != LLMEM_OK) {
                llmem_errf(err, err_len, "uploading '%s' failed: %s", name, llmem_status_str(s));
                return s;
            }
            dst->present = true;
            dst->t = tensor_from(buf, 0, info.dtype, info.shape, info.n_dims);
        }
    }
    if (cfg->tie_word_embeddings || !m->lm_head.present)
        m->lm_head = m->embed;
    if (cfg->gemma_norms) /* applied in the embedding dtype, as transformers does */
        m->cfg.embedding_multiplier = hf_gemma3_embed_scale(cfg->embedding_multiplier,
                                                            m->embed.t.dtype);
    return LLMEM_OK;
}

#define MAX_WINDOWS 8

/* Attention layers grouped by their sliding window (0: full attention),
 * one KV cache per distinct window (memory/swa.c): the window a cache keeps
 * is the window of the layers it serves, never shared with layers of
 * another window (vllm#51756). n_attn[g] layers have window win[g]. */
static llmem_status window_groups(const llmem_model_config *c, int32_t *win, int32_t *n_attn,
                                  int32_t *n_groups, char *err, size_t err_len)
{
    *n_groups = 0;
    for (int32_t il = 0; il < c->n_layers; il++) {
        llmem_layer_kind k = c->layers[il].kind;
        if (k != LLMEM_LAYER_ATTENTION && k != LLMEM_LAYER_PARALLEL)
            continue;
        int32_t w = c->layers[il].sliding_window, g = 0;
        while (g < *n_groups && win[g] != w)
            g++;
        if (g == *n_groups) {
            if (g == MAX_WINDOWS) {
                llmem_errf(err, err_len, "more than %d distinct attention windows", MAX_WINDOWS);
                return LLMEM_E_UNSUPPORTED;
            }
            win[g] = w;
            n_attn[g] = 0;
            (*n_groups)++;
        }
        n_attn[g]++;
    }
    return LLMEM_OK;
}

static int32_t window_group(const int32_t *win, int32_t n_groups, int32_t w)
{
    int32_t g = 0;
    while (g < n_groups - 1 && win[g] != w)
        g++;
    return g;
}

/* The recurrent states of a layer of kind k (0 when it keeps none):
 * Mamba-2 conv + ssm, qwen3_next's gated delta net (models/qwen3_next.c),
 * LFM2's short-conv conv {L - 1, hidden}, Mamba-1
 * conv {d_conv - 1, d_inner} + ssm {d_inner, d_state}. The ssm state takes
 * the model's ssm_dtype. */
static int32_t layer_states(const llmem_model_config *c, const llmem_model_params *p,
                            llmem_layer_kind k, llmem_state_desc d[2])
{
    if (k == LLMEM_LAYER_MAMBA2 || k == LLMEM_LAYER_PARALLEL) {
        llmem_recurrent_mamba2_states(c->ssm_d_conv, c->ssm_d_inner, c->ssm_n_groups,
                                      c->ssm_d_state, c->ssm_n_heads, c->ssm_head_dim, d);
        d[1].dtype = p->ssm_dtype;
        return 2;
    }
    if (k == LLMEM_LAYER_GDN) { /* qwen3_next: conv + delta-rule state */
        hf_qwen3n_states(c, p->ssm_dtype, d);
        return 2;
    }
    if (k != LLMEM_LAYER_SHORTCONV && k != LLMEM_LAYER_MAMBA1)
        return 0;
    d[0] = (llmem_state_desc){"conv", 2, {c->ssm_d_conv - 1, c->ssm_d_inner}, LLMEM_DTYPE_F32};
    if (k == LLMEM_LAYER_SHORTCONV)
        return 1;
    d[1] = (llmem_state_desc){"ssm", 2, {c->ssm_d_inner, c->ssm_d_state}, p->ssm_dtype};
    return 2;
}

/* Whether the recurrent memory may write a prompt's snapshot inside a
 * ubatch instead of the plan ending one there
 * (llmem_recurrent_params.snap_in_ubatch): every recurrent op a model
 * layer runs (ssm_conv, ssm_scan, ssm_scan1, short_conv, gdn) writes such
 * snapshots on the in-tree backends. LLMEM_SNAP_IN_UBATCH=0 keeps the cut
 * (for comparison: docs/benchmarks.md, "The snapshot inside the ubatch on
 * CUDA and Vulkan"). */
static bool snap_in_ubatch(void)
{
    const char *e = getenv("LLMEM_SNAP_IN_UBATCH");
    return !(e && strcmp(e, "0") == 0);
}

static llmem_status create_memory(llmem_model *m, char *err, size_t err_len)
{
    const llmem_model_config *c = &m->cfg;
    const llmem_model_params *p = &m->p;
    llmem_memory *kv = NULL, *rs = NULL, *kvs[MAX_WINDOWS] = {NULL};
    int32_t n_attn = 0, n_mamba = 0, win[MAX_WINDOWS], n_win[MAX_WINDOWS], n_groups = 0;
    llmem_status st = window_groups(c, win, n_win, &n_groups, err, err_len);
    if (st != LLMEM_OK)
        return st;
    for (int32_t il = 0; il < c->n_layers; il++) {
        llmem_layer_kind k = c->layers[il].kind;
        int32_t at = n_attn + n_mamba;
        m->layers[il].mem_layer = k == LLMEM_LAYER_MLP || k == LLMEM_LAYER_MOE ? -1 : at;
        m->layers[il].mem_layer2 = k == LLMEM_LAYER_PARALLEL ? at + 1 : -1;
        n_attn += k == LLMEM_LAYER_ATTENTION || k == LLMEM_LAYER_PARALLEL;
        n_mamba += k == LLMEM_LAYER_MAMBA2 || k == LLMEM_LAYER_PARALLEL || k == LLMEM_LAYER_GDN ||
                   k == LLMEM_LAYER_SHORTCONV || k == LLMEM_LAYER_MAMBA1;
        const llmem_layer_config *lc = &c->layers[il];
        m->layers[il].window = lc->sliding_window;
        m->layers[il].rope_theta = (float)(lc->rope_theta > 0 ? lc->rope_theta : c->rope_theta);
        m->layers[il].rope_scale = (float)(lc->rope_freq_scale > 0 ? lc->rope_freq_scale : 1.0);
    }
    for (int32_t g = 0; g < n_groups; g++) {
        llmem_kv_cache_params kp = llmem_kv_cache_default_params();
        kp.n_layers = n_win[g];
        kp.window = win[g];
        /* rollback room: speculative drafts (n_ckpt) or one page, at least 16 tokens */
        kp.window_slack = win[g] > 0 ? (p->n_ckpt > 16 ? p->n_ckpt : 16) : 0;
        kp.n_kv_heads = c->n_kv_heads;
        kp.head_dim = c->head_dim;
        kp.dtype = p->kv_dtype;
        kp.page_size = p->page_size;
        kp.n_seq_max = p->n_seq_max;
        int64_t np = p->n_pages > 0 ? p->n_pages
                                    : (int64_t)p->n_seq_max * llmem_pages_for(0, p->n_ctx, p->page_size);
        kp.n_pages = np > INT32_MAX ? INT32_MAX : (int32_t)np;
        kp.no_prefix_cache = p->no_prefix_cache;
        kp.prefix_cache_bytes = p->prefix_cache_bytes;
        kp.poison = p->poison;
        if ((st = llmem_kv_cache_create(m->be, &kp, &kvs[g], err, err_len)) != LLMEM_OK) {
            for (int32_t j = 0; j < g; j++)
                llmem_memory_destroy(kvs[j]);
            return st;
        }
    }
    kv = kvs[0];
    if (n_mamba > 0) {
        const llmem_state_desc **states = malloc((size_t)n_mamba * sizeof *states);
        int32_t *n_states = malloc((size_t)n_mamba * sizeof *n_states);
        llmem_state_desc (*d)[2] = malloc((size_t)n_mamba * sizeof *d);
        st = LLMEM_E_NO_MEMORY;
        if (!states || !n_states || !d) {
            free(states);
            free(n_states);
            free(d);
            goto fail;
        }
        /* recurrent memory layers in model order (the hybrid's map below) */
        for (int32_t il = 0, i = 0; il < c->n_layers; il++) {
            int32_t ns = layer_states(c, p, c->layers[il].kind, d[i]);
            if (ns > 0) {
                states[i] = d[i];
                n_states[i++] = ns;
            }
        }
        llmem_recurrent_params rp = {.n_layers = n_mamba, .n_states = n_states, .states = states,
                                     .n_seq_max = p->n_seq_max, .n_ckpt = p->n_ckpt,
                                     .poison = p->poison};
        if (kv) {
            hybrid_snapshots(p, &rp);
            rp.snap_in_ubatch = snap_in_ubatch();
        }
        st = llmem_recurrent_create(m->be, &rp, &rs, err, err_len);
        free(d);
        free(states);
        free(n_states);
        if (st != LLMEM_OK)
            goto fail;
    }
    if (n_groups + (rs != NULL) > 1) {
        /* children: one KV cache per window, then the recurrent memory */
        int32_t n = n_attn + n_mamba, n_ch = n_groups + (rs != NULL);
        llmem_memory *children[MAX_WINDOWS + 1];
        int32_t *map = malloc((size_t)n * sizeof *map);
        if (!map) {
            st = LLMEM_E_NO_MEMORY;
            goto fail;
        }
        for (int32_t g = 0; g < n_groups; g++)
            children[g] = kvs[g];
        children[n_groups] = rs;
        for (int32_t il = 0; il < c->n_layers; il++) {
            llmem_layer_kind k = c->layers[il].kind;
            if (m->layers[il].mem_layer >= 0)
                map[m->layers[il].mem_layer] =
                    k == LLMEM_LAYER_ATTENTION || k == LLMEM_LAYER_PARALLEL
                        ? window_group(win, n_groups, c->layers[il].sliding_window)
                        : n_groups;
            if (m->layers[il].mem_layer2 >= 0)
                map[m->layers[il].mem_layer2] = n_groups;
        }
        /* the hybrid owns its children, also when it fails */
        st = llmem_hybrid_create(children, n_ch, map, n, &m->mem, err, err_len);
        free(map);
        return st;
    }
    m->mem = kv ? kv : rs;
    if (!m->mem) {
        llmem_errf(err, err_len, "model has neither attention nor Mamba layers");
        return LLMEM_E_UNSUPPORTED;
    }
    return LLMEM_OK;
fail:
    for (int32_t g = 0; g < n_groups; g++)
        llmem_memory_destroy(kvs[g]);
    llmem_memory_destroy(rs);
    return st;
}

static int32_t max_i(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static llmem_status alloc_scratch(llmem_model *m)
{
    const llmem_model_config *c = &m->cfg;
    size_t T = (size_t)m->p.n_ubatch;
    int32_t D = c->hidden_size;
    int32_t qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    /* a: q | in_proj output | ffn gate; b: k | xbc (conv out) | ffn up;
     * c: v | y; d: attention out | dt; e: z */
    m->width_a = max_i(max_i(qd, c->ssm_in_proj_dim), c->intermediate_size);
    m->width_b = max_i(max_i(kvd, c->ssm_conv_dim), c->intermediate_size);
    m->width_c = max_i(max_i(kvd, c->ssm_d_inner), c->ssm_conv_dim);
    m->width_d = max_i(qd, c->ssm_n_heads);
    if (c->ssm_dt_rank > 0) /* jamba: x_proj's output and its three parts */
        m->width_d = max_i(m->width_d, 2 * (c->ssm_dt_rank + 2 * c->ssm_d_state));
    m->width_e = max_i(c->ssm_d_inner, 1);
    size_t off = 0;
#define TAKE(field, bytes) do { m->field = off; off += round_up(bytes); } while (0)
    TAKE(off_x, T * (size_t)D * 4);
    TAKE(off_h, T * (size_t)D * 4);
    TAKE(off_a, T * (size_t)max_i(m->width_a, 1) * 4);
    TAKE(off_b, T * (size_t)max_i(m->width_b, 1) * 4);
    TAKE(off_c, T * (size_t)max_i(m->width_c, 1) * 4);
    TAKE(off_d, T * (size_t)max_i(m->width_d, 1) * 4);
    TAKE(off_e, T * (size_t)m->width_e * 4);
    TAKE(off_tok, T * 4);
    TAKE(off_pos, T * 4);
    TAKE(off_rows, T * 4);
    TAKE(off_logits, T * (size_t)c->vocab_size * 4);
    TAKE(off_ids, T * 4);
    TAKE(off_ctr, T * 4);
    TAKE(off_lp, T * 4);
    TAKE(off_top_ids, T * 64 * 4);
    TAKE(off_top_lp, T * 64 * 4);
    if (m->tp_size > 1) { /* models/tp.c: vocab-shard logits, gathered y and z */
        TAKE(off_tpl, T * (size_t)m->tp_vocab * 4);
        TAKE(off_tpg, 2 * T * (size_t)max_i(m->tp_full->ssm_d_inner, 1) * 4);
    }
#undef TAKE
    return llmem_buffer_alloc(m->be, off, &m->scratch);
}

llmem_status llmem_model_load(const char *dir, llmem_backend *be, const llmem_model_params *p,
                              llmem_model **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!dir || !be || !out) {
        llmem_errf(err, err_len, "NULL argument");
        return LLMEM_E_INVALID;
    }
    llmem_model_params pp = p ? *p : llmem_model_default_params();
    if (pp.n_seq_max < 1 || pp.n_ubatch < 1 || pp.page_size < 1 || pp.n_ctx < 1 ||
        pp.n_pages < 0 || pp.n_ckpt < 0 || pp.n_snapshots < -1 || pp.snap_interval < 0 ||
        pp.tp < 0 || pp.tp > LLMEM_COMM_MAX_RANKS || pp.prefix_cache_bytes < 0 ||
        !resolve_params(&pp)) {
        llmem_errf(err, err_len, "invalid model parameters (n_seq_max, n_ubatch, page_size, n_ctx "
                               "must be >= 1; n_snapshots >= -1; tp 0 to 64; prefix_cache_bytes "
                               ">= 0; precision precise or fast; kv and ssm dtypes f32, f16 or "
                               "bf16)");
        return LLMEM_E_INVALID;
    }
    llmem_model *m = calloc(1, sizeof *m);
    llmem_safetensors *st = NULL;
    if (!m) {
        llmem_errf(err, err_len, "%s: out of host memory for the model", dir);
        return LLMEM_E_NO_MEMORY;
    }
    m->p = pp;
    m->be = be;
    m->tp_size = 1;
    /* Every failure gets a reason: a step that returns a bare status (an
     * allocation deep in a memory) is named by `step` below. */
    if (err && err_len)
        err[0] = '\0';
    const char *step = "reading config.json";
    llmem_status s = llmem_model_config_load(dir, &m->cfg, err, err_len);
    if (s == LLMEM_OK && (step = "opening the safetensors"))
        s = llmem_safetensors_open(dir, &st, err, err_len);
    if (s == LLMEM_OK && (step = "checking the tensors against config.json"))
        s = llmem_model_config_check_tensors(&m->cfg, st, err, err_len);
    if (s == LLMEM_OK && pp.check_tensors && (step = "checking the weights for NaN and infinity"))
        s = llmem_model_check_weights_finite(&m->cfg, st, err, err_len);
    if (s == LLMEM_OK && pp.tp > 1 && (step = "building the tensor-parallel ranks"))
        s = hf_tp_load(m, st, err, err_len);
    else if (s == LLMEM_OK)
        s = hf_model_build(m, st, &step, err, err_len);
    llmem_safetensors_close(st);
    if (s != LLMEM_OK) {
        if (err && err_len && !err[0])
            llmem_errf(err, err_len, "%s failed: %s", step, llmem_status_str(s));
        llmem_model_free(m);
        return s;
    }
    *out = m;
    return LLMEM_OK;
}

llmem_status hf_model_build(llmem_model *m, const llmem_safetensors *st, const char **step,
                            char *err, size_t err_len)
{
    const llmem_model_params *pp = &m->p;
    llmem_status s = LLMEM_OK;
    if ((*step = "allocating the layer table") &&
        !(m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers)))
        s = LLMEM_E_NO_MEMORY;
    if (s == LLMEM_OK && (*step = "uploading the weights"))
        s = m->cfg.arch == LLMEM_ARCH_QWEN3_NEXT ? hf_qwen3n_load(m, st, err, err_len)
                                                 : load_weights(m, st, err, err_len);
    if (s == LLMEM_OK && m->tp_size > 1 && (*step = "slicing the LM head by vocabulary"))
        s = hf_tp_lm_head(m, err, err_len);
    if (s == LLMEM_OK && (*step = "checking that the backend has every op the model needs"))
        s = hf_check_ops(m, err, err_len);
    if (s == LLMEM_OK && (*step = "creating the model's memory (KV cache, recurrent state)"))
        s = create_memory(m, err, err_len);
    if (s == LLMEM_OK && (s = alloc_scratch(m)) != LLMEM_OK)
        llmem_errf(err, err_len, "cannot allocate scratch for %d-token ubatches", pp->n_ubatch);
    if (s == LLMEM_OK && (s = hf_moe_create(m->be, &m->cfg, pp->n_ubatch, &m->moe)) != LLMEM_OK)
        llmem_errf(err, err_len, "cannot allocate MoE scratch for %d-token ubatches", pp->n_ubatch);
    if (s == LLMEM_OK && (s = hf_falcon_create(m->be, &m->cfg, pp->n_ubatch, &m->fal)) != LLMEM_OK)
        llmem_errf(err, err_len, "cannot allocate falcon_h1 scratch for %d-token ubatches",
                   pp->n_ubatch);
    if (s == LLMEM_OK) /* reads what the steps above set (m->moe, m->fal, ...) */
        hf_fused_setup(m);
    return s;
}

void llmem_model_free(llmem_model *m)
{
    if (!m)
        return;
    hf_graphs_free(m->graphs);
    if (m->tp) { /* the ranks' memory first (their backends still open), then the ranks */
        llmem_memory_destroy(m->mem);
        m->mem = NULL;
        m->scratch = NULL; /* rank 0's */
        hf_tp_destroy(m->tp);
    }
    if (!m->mem_borrowed)
        llmem_memory_destroy(m->mem);
    for (int32_t i = 0; i < m->n_weights; i++)
        llmem_buffer_free(m->weights[i]);
    free(m->weights);
    llmem_buffer_free(m->scratch);
    llmem_buffer_free(m->fb_buf);
    llmem_backend_close(m->fb_be);
    hf_moe_destroy(m->moe);
    hf_falcon_destroy(m->fal);
    hf_qwen3n_destroy(m->q3n);
    free(m->layers);
    free(m);
}

const llmem_model_config *llmem_model_get_config(const llmem_model *m)
{
    return m ? &m->cfg : NULL;
}

llmem_memory *llmem_model_memory(llmem_model *m)
{
    return m ? m->mem : NULL;
}

int32_t llmem_model_n_vocab(const llmem_model *m)
{
    return m ? m->cfg.vocab_size : 0;
}

void llmem_model_get_stats(const llmem_model *m, llmem_model_stats *stats)
{
    if (m && stats)
        *stats = m->stats;
}

static bool has_config(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

/* <prefix>/share/llmem/builtin beside the loaded library (relative, so a
 * moved install works; the build tree links build/share/llmem/builtin to
 * the source's models/builtin). */
static char builtin_dir[4096];
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void find_builtin(void)
{
    if (!llmem_lib_relative_path("../share/llmem/builtin", builtin_dir, sizeof builtin_dir) ||
        !has_config(builtin_dir))
        builtin_dir[0] = '\0';
}

const char *llmem_builtin_model_dir(void)
{
    const char *env = getenv("LLMEM_MODEL_DIR");
    if (env && *env)
        return has_config(env) ? env : NULL;
    pthread_once(&builtin_once, find_builtin);
    return builtin_dir[0] ? builtin_dir : NULL;
}

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
#include "llmem/model.h"
#include "llmem/hybrid.h"
#include "llmem/kv_cache.h"
#include "llmem/ops.h"
#include "llmem/recurrent.h"
#include "llmem/runtime.h"
#include "models/hf_internal.h"

#define ALIGN 256

typedef struct wt {
    bool present;
    llmem_tensor t;
} wt;

typedef struct layer_w {
    wt w[LLMEM_W_COUNT];
    int32_t mem_layer; /* layer index in the memory, -1 for MLP-only layers */
    int32_t mem_layer2; /* falcon_h1 parallel layers: the Mamba-2 one (else -1) */
} layer_w;

struct llmem_model {
    llmem_model_config cfg;
    llmem_model_params p;
    llmem_backend *be;
    llmem_buffer **weights; /* one buffer per weight tensor */
    int32_t n_weights;
    wt embed, final_norm, lm_head;
    layer_w *layers;
    llmem_memory *mem;
    llmem_buffer *scratch;
    /* scratch tensors, [n_ubatch, ...] f32 */
    size_t off_x, off_h, off_a, off_b, off_c, off_d, off_e, off_tok, off_pos, off_rows, off_logits;
    /* sampling outputs: ids, counters, log-probs [n_ubatch]; top lists [n_ubatch, 64] */
    size_t off_ids, off_ctr, off_lp, off_top_ids, off_top_lp;
    /* CPU backend and buffer for the sampling ops of a backend that lacks them */
    llmem_backend *fb_be;
    llmem_buffer *fb_buf;
    size_t fb_size;
    int32_t width_a, width_b, width_c, width_d, width_e;
    llmem_model_stats stats;
    hf_moe *moe; /* MoE / shared-expert FFN scratch (models/moe.c), or NULL */
    hf_falcon *fal; /* falcon_h1 scratch (models/falcon_h1.c), or NULL */
};

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
                    p->kv_dtype == LLMEM_DTYPE_BF16;
    bool float_ssm = p->ssm_dtype == LLMEM_DTYPE_F32 || p->ssm_dtype == LLMEM_DTYPE_F16 ||
                     p->ssm_dtype == LLMEM_DTYPE_BF16;
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
    if (n < 0)
        n = p->no_prefix_cache || (env && *env) ? 0 : (p->n_seq_max > 16 ? p->n_seq_max : 16);
    rp->n_snapshots = n;
    rp->snap_interval = p->snap_interval > 0 ? p->snap_interval
                                             : (p->page_size > 16 ? p->page_size : 16);
}

static size_t round_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
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
        for (int32_t w = 0; w < LLMEM_W_COUNT; w++) {
            bool global = w == LLMEM_W_EMBED || w == LLMEM_W_FINAL_NORM || w == LLMEM_W_LM_HEAD;
            if (global != (il < 0))
                continue;
            if (!llmem_model_weight(cfg, (llmem_weight)w, il < 0 ? 0 : il, name, sizeof name,
                                    shape, &nd))
                continue;
            if (hf_moe_is_split(cfg, (llmem_weight)w)) { /* experts packed back to back */
                size_t nb = 0;
                llmem_tensor t;
                llmem_buffer *buf = NULL;
                llmem_status s = hf_moe_load_split(cfg, st, (llmem_weight)w, il, NULL, 0, &nb,
                                                   &t, err, err_len);
                if (s == LLMEM_OK && (s = llmem_buffer_alloc(m->be, round_up(nb), &buf)) != LLMEM_OK)
                    snprintf(err, err_len, "cannot allocate %zu bytes for '%s' on %s", nb, name,
                             llmem_backend_name(m->be));
                if (s != LLMEM_OK)
                    return s;
                m->weights[m->n_weights++] = buf;
                s = hf_moe_load_split(cfg, st, (llmem_weight)w, il, buf, 0, &nb, &t, err, err_len);
                if (s != LLMEM_OK)
                    return s;
                m->layers[il].w[w] = (wt){.present = true, .t = t};
                continue;
            }
            llmem_status s = llmem_safetensors_find(st, name, &info, err, err_len);
            if (s != LLMEM_OK)
                return s;
            llmem_buffer *buf = NULL;
            s = llmem_buffer_alloc(m->be, info.n_bytes ? round_up(info.n_bytes) : ALIGN, &buf);
            if (s != LLMEM_OK) {
                llmem_errf(err, err_len, "cannot allocate %zu bytes for '%s' on %s", info.n_bytes,
                         name, llmem_backend_name(m->be));
                return s;
            }
            m->weights[m->n_weights++] = buf;
            s = llmem_buffer_upload(buf, 0, info.data, info.n_bytes);
            if (s != LLMEM_OK) {
                llmem_errf(err, err_len, "uploading '%s' failed: %s", name, llmem_status_str(s));
                return s;
            }
            wt *dst = il < 0 ? (w == LLMEM_W_EMBED ? &m->embed
                                : w == LLMEM_W_FINAL_NORM ? &m->final_norm : &m->lm_head)
                             : &m->layers[il].w[w];
            dst->present = true;
            dst->t = tensor_from(buf, 0, info.dtype, info.shape, info.n_dims);
        }
    }
    if (cfg->tie_word_embeddings || !m->lm_head.present)
        m->lm_head = m->embed;
    return LLMEM_OK;
}

static llmem_status create_memory(llmem_model *m, char *err, size_t err_len)
{
    const llmem_model_config *c = &m->cfg;
    const llmem_model_params *p = &m->p;
    llmem_memory *kv = NULL, *rs = NULL;
    int32_t n_attn = 0, n_mamba = 0;
    for (int32_t il = 0; il < c->n_layers; il++) {
        llmem_layer_kind k = c->layers[il].kind;
        int32_t at = n_attn + n_mamba;
        m->layers[il].mem_layer = k == LLMEM_LAYER_MLP || k == LLMEM_LAYER_MOE ? -1 : at;
        m->layers[il].mem_layer2 = k == LLMEM_LAYER_PARALLEL ? at + 1 : -1;
        n_attn += k == LLMEM_LAYER_ATTENTION || k == LLMEM_LAYER_PARALLEL;
        n_mamba += k == LLMEM_LAYER_MAMBA2 || k == LLMEM_LAYER_PARALLEL;
    }
    llmem_status st;
    if (n_attn > 0) {
        llmem_kv_cache_params kp = llmem_kv_cache_default_params();
        kp.n_layers = n_attn;
        kp.n_kv_heads = c->n_kv_heads;
        kp.head_dim = c->head_dim;
        kp.dtype = p->kv_dtype;
        kp.page_size = p->page_size;
        kp.n_seq_max = p->n_seq_max;
        int64_t np = p->n_pages > 0 ? p->n_pages
                                    : (int64_t)p->n_seq_max * ((p->n_ctx + p->page_size - 1) / p->page_size);
        kp.n_pages = np > INT32_MAX ? INT32_MAX : (int32_t)np;
        kp.no_prefix_cache = p->no_prefix_cache;
        kp.poison = p->poison;
        if ((st = llmem_kv_cache_create(m->be, &kp, &kv, err, err_len)) != LLMEM_OK)
            return st;
    }
    if (n_mamba > 0) {
        llmem_state_desc d[2];
        llmem_recurrent_mamba2_states(c->ssm_d_conv, c->ssm_d_inner, c->ssm_n_groups,
                                      c->ssm_d_state, c->ssm_n_heads, c->ssm_head_dim, d);
        d[1].dtype = p->ssm_dtype;
        const llmem_state_desc **states = malloc((size_t)n_mamba * sizeof *states);
        int32_t *n_states = malloc((size_t)n_mamba * sizeof *n_states);
        if (!states || !n_states) {
            free(states);
            free(n_states);
            llmem_memory_destroy(kv);
            return LLMEM_E_NO_MEMORY;
        }
        for (int32_t i = 0; i < n_mamba; i++) {
            states[i] = d;
            n_states[i] = 2;
        }
        llmem_recurrent_params rp = {.n_layers = n_mamba, .n_states = n_states, .states = states,
                                     .n_seq_max = p->n_seq_max, .n_ckpt = p->n_ckpt,
                                     .poison = p->poison};
        if (kv)
            hybrid_snapshots(p, &rp);
        st = llmem_recurrent_create(m->be, &rp, &rs, err, err_len);
        free(states);
        free(n_states);
        if (st != LLMEM_OK) {
            llmem_memory_destroy(kv);
            return st;
        }
    }
    if (kv && rs) {
        int32_t n = n_attn + n_mamba;
        int32_t *map = malloc((size_t)n * sizeof *map);
        if (!map) {
            llmem_memory_destroy(kv);
            llmem_memory_destroy(rs);
            return LLMEM_E_NO_MEMORY;
        }
        for (int32_t il = 0; il < c->n_layers; il++) {
            llmem_layer_kind k = c->layers[il].kind;
            if (m->layers[il].mem_layer >= 0)
                map[m->layers[il].mem_layer] =
                    k == LLMEM_LAYER_ATTENTION || k == LLMEM_LAYER_PARALLEL ? 0 : 1;
            if (m->layers[il].mem_layer2 >= 0)
                map[m->layers[il].mem_layer2] = 1;
        }
        llmem_memory *children[2] = {kv, rs};
        st = llmem_hybrid_create(children, 2, map, n, &m->mem, err, err_len);
        free(map);
        return st;
    }
    m->mem = kv ? kv : rs;
    if (!m->mem) {
        llmem_errf(err, err_len, "model has neither attention nor Mamba layers");
        return LLMEM_E_UNSUPPORTED;
    }
    return LLMEM_OK;
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
        !resolve_params(&pp)) {
        llmem_errf(err, err_len, "invalid model parameters (n_seq_max, n_ubatch, page_size, n_ctx "
                               "must be >= 1; n_snapshots >= -1; precision precise or fast; "
                               "kv and ssm dtypes f32, f16 or bf16)");
        return LLMEM_E_INVALID;
    }
    llmem_model *m = calloc(1, sizeof *m);
    llmem_safetensors *st = NULL;
    if (!m)
        return LLMEM_E_NO_MEMORY;
    m->p = pp;
    m->be = be;
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
    if (s == LLMEM_OK && (step = "allocating the layer table") &&
        !(m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers)))
        s = LLMEM_E_NO_MEMORY;
    if (s == LLMEM_OK && (step = "uploading the weights"))
        s = load_weights(m, st, err, err_len);
    llmem_safetensors_close(st);
    if (s == LLMEM_OK && (step = "creating the model's memory (KV cache, recurrent state)"))
        s = create_memory(m, err, err_len);
    if (s == LLMEM_OK && (s = alloc_scratch(m)) != LLMEM_OK)
        llmem_errf(err, err_len, "cannot allocate scratch for %d-token ubatches", pp.n_ubatch);
    if (s == LLMEM_OK && (s = hf_moe_create(be, &m->cfg, pp.n_ubatch, &m->moe)) != LLMEM_OK)
        llmem_errf(err, err_len, "cannot allocate MoE scratch for %d-token ubatches", pp.n_ubatch);
    if (s == LLMEM_OK && (s = hf_falcon_create(be, &m->cfg, pp.n_ubatch, &m->fal)) != LLMEM_OK)
        llmem_errf(err, err_len, "cannot allocate falcon_h1 scratch for %d-token ubatches",
                   pp.n_ubatch);
    if (s != LLMEM_OK) {
        if (err && err_len && !err[0])
            llmem_errf(err, err_len, "%s failed: %s", step, llmem_status_str(s));
        llmem_model_free(m);
        return s;
    }
    *out = m;
    return LLMEM_OK;
}

void llmem_model_free(llmem_model *m)
{
    if (!m)
        return;
    llmem_memory_destroy(m->mem);
    for (int32_t i = 0; i < m->n_weights; i++)
        llmem_buffer_free(m->weights[i]);
    free(m->weights);
    llmem_buffer_free(m->scratch);
    llmem_buffer_free(m->fb_buf);
    llmem_backend_close(m->fb_be);
    hf_moe_destroy(m->moe);
    hf_falcon_destroy(m->fal);
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

/* --- forward ---------------------------------------------------------------------- */

static llmem_tensor act(const llmem_model *m, size_t off, int32_t T, int32_t width)
{
    return llmem_tensor_2d(m->scratch, off, LLMEM_DTYPE_F32, T, width);
}

/* out = a · wᵀ in the model's precision mode (FAST: bf16 activations into
 * one tensor-core GEMM, <llmem/runtime.h>). */
static llmem_status matmul(llmem_model *m, const llmem_tensor *a, const llmem_tensor *w,
                           const llmem_tensor *out)
{
    if (m->p.precision == LLMEM_PRECISION_FAST)
        return llmem_op_matmul_fast(m->be, a, w, out);
    return llmem_op_matmul(m->be, a, w, out);
}

/* out = a · wᵀ (+ bias) */
static llmem_status linear(llmem_model *m, const llmem_tensor *a, const wt *w, const wt *bias,
                           const llmem_tensor *out)
{
    llmem_status s = matmul(m, a, &w->t, out);
    if (s == LLMEM_OK && bias && bias->present)
        s = llmem_op_add(m->be, out, &bias->t, out);
    return s;
}

#define TRY(x) do { llmem_status s_ = (x); if (s_ != LLMEM_OK) return s_; } while (0)

/* x = x * s when s != 1 (granite's and falcon_h1's multipliers). */
static llmem_status scale_by(llmem_model *m, const llmem_tensor *x, double s)
{
    return s == 1.0 ? LLMEM_OK : llmem_op_scale(m->be, x, (float)s, x);
}

static llmem_status attention(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v)
{
    const llmem_model_config *c = &m->cfg;
    int32_t H = c->n_heads, Hk = c->n_kv_heads, Dh = c->head_dim;
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size);
    llmem_tensor q = act(m, m->off_a, T, H * Dh), k = act(m, m->off_b, T, Hk * Dh),
                 vv = act(m, m->off_c, T, Hk * Dh), o = act(m, m->off_d, T, H * Dh);
    TRY(linear(m, &h, &L->w[LLMEM_W_ATTN_Q], &L->w[LLMEM_W_ATTN_Q_BIAS], &q));
    TRY(linear(m, &h, &L->w[LLMEM_W_ATTN_K], &L->w[LLMEM_W_ATTN_K_BIAS], &k));
    TRY(scale_by(m, &k, c->key_multiplier)); /* falcon_h1 */
    TRY(linear(m, &h, &L->w[LLMEM_W_ATTN_V], &L->w[LLMEM_W_ATTN_V_BIAS], &vv));
    llmem_tensor q3 = llmem_tensor_3d(m->scratch, m->off_a, LLMEM_DTYPE_F32, T, H, Dh);
    llmem_tensor k3 = llmem_tensor_3d(m->scratch, m->off_b, LLMEM_DTYPE_F32, T, Hk, Dh);
    llmem_tensor v3 = llmem_tensor_3d(m->scratch, m->off_c, LLMEM_DTYPE_F32, T, Hk, Dh);
    llmem_tensor o3 = llmem_tensor_3d(m->scratch, m->off_d, LLMEM_DTYPE_F32, T, H, Dh);
    if (c->use_rope && c->rope_dim > 0) {
        llmem_rope_params rp = {.mode = LLMEM_ROPE_NEOX, .n_rot = c->rope_dim,
                                .theta_base = (float)c->rope_theta, .freq_scale = 1.0f};
        llmem_tensor pos = llmem_tensor_1d(m->scratch, m->off_pos, LLMEM_DTYPE_I32, T);
        if (v->u.kv.shift_slot.n > 0)
            TRY(llmem_op_rope_shift(m->be, &rp, v));
        TRY(llmem_op_rope(m->be, &rp, &q3, &pos, &q3));
        TRY(llmem_op_rope(m->be, &rp, &k3, &pos, &k3));
    }
    TRY(llmem_op_kv_store(m->be, v, &k3, &v3));
    llmem_attn_params ap = {.scale = (float)c->attention_scale}; /* 1/sqrt(Dh) but granite */
    TRY(llmem_op_attention_paged(m->be, &ap, v, &q3, &o3));
    llmem_tensor out = act(m, m->off_h, T, c->hidden_size);
    return linear(m, &o, &L->w[LLMEM_W_ATTN_O], &L->w[LLMEM_W_ATTN_O_BIAS], &out);
}

static llmem_status mamba(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v)
{
    const llmem_model_config *c = &m->cfg;
    int32_t din = c->ssm_d_inner, cd = c->ssm_conv_dim, nh = c->ssm_n_heads;
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size);
    llmem_tensor zxbcdt = act(m, m->off_a, T, c->ssm_in_proj_dim);
    TRY(linear(m, &h, &L->w[LLMEM_W_SSM_IN], &L->w[LLMEM_W_SSM_IN_BIAS], &zxbcdt));
    if (m->fal) { /* falcon_h1's muP vector over [z | x B C | dt] */
        llmem_tensor save, sum, mup;
        hf_falcon_tensors(m->fal, T, &save, &sum, &mup);
        TRY(llmem_op_mul(m->be, &zxbcdt, &mup, &zxbcdt));
    }
    llmem_tensor z = act(m, m->off_e, T, din), xbc = act(m, m->off_c, T, cd),
                 dt = act(m, m->off_d, T, nh), conv = act(m, m->off_b, T, cd);
    llmem_tensor y = act(m, m->off_a, T, din); /* zxbcdt is consumed */
    if (T == 1) {
        /* one token: [z | xBC | dt] are contiguous slices of in_proj's row,
         * so the ops read them in place (three launches fewer per layer);
         * y then goes where z would have been copied */
        z = act(m, m->off_a, 1, din);
        xbc = act(m, m->off_a + (size_t)din * 4, 1, cd);
        dt = act(m, m->off_a + (size_t)(din + cd) * 4, 1, nh);
        y = act(m, m->off_e, 1, din);
    } else {
        TRY(llmem_op_copy(m->be, &zxbcdt, 0, &z));
        TRY(llmem_op_copy(m->be, &zxbcdt, din, &xbc));
        TRY(llmem_op_copy(m->be, &zxbcdt, din + cd, &dt));
    }
    const wt *cb = &L->w[LLMEM_W_SSM_CONV_BIAS];
    TRY(llmem_op_ssm_conv(m->be, v, 0, &xbc, &L->w[LLMEM_W_SSM_CONV].t, cb->present ? &cb->t : NULL,
                          &conv));
    llmem_ssm_params sp = {.n_heads = nh, .head_dim = c->ssm_head_dim, .d_state = c->ssm_d_state,
                           .n_groups = c->ssm_n_groups, .dt_min = (float)c->time_step_limit[0],
                           .dt_max = (float)c->time_step_limit[1]};
    const wt *D = &L->w[LLMEM_W_SSM_D], *dtb = &L->w[LLMEM_W_SSM_DT_BIAS];
    TRY(llmem_op_ssm_scan(m->be, &sp, v, 1, &conv, &dt, &L->w[LLMEM_W_SSM_A_LOG].t,
                          D->present ? &D->t : NULL, dtb->present ? &dtb->t : NULL, &y));
    int32_t groups = din / (c->ssm_norm_group_size > 0 ? c->ssm_norm_group_size : din);
    if (c->ssm_gate_only) /* falcon_h1 without mamba_rms_norm: y * silu(z) */
        TRY(llmem_op_swiglu(m->be, &z, &y, &y));
    else
        TRY(llmem_op_rms_norm_gated(m->be, &y, &z, &L->w[LLMEM_W_SSM_NORM].t, groups,
                                (float)c->norm_eps, &y));
    llmem_tensor out = act(m, m->off_h, T, c->hidden_size);
    return linear(m, &y, &L->w[LLMEM_W_SSM_OUT], &L->w[LLMEM_W_SSM_OUT_BIAS], &out);
}

/* h (normalized input) -> h (output), for MoE layers and granite FFNs. */
static llmem_status moe_ffn(llmem_model *m, const layer_w *L, int32_t T)
{
    const llmem_tensor *w[6];
    for (int i = 0; i < 6; i++) {
        const wt *x = &L->w[LLMEM_W_MOE_ROUTER + i];
        w[i] = x->present ? &x->t : NULL;
    }
    llmem_tensor h = act(m, m->off_h, T, m->cfg.hidden_size);
    return hf_moe_ffn(m->moe, m->be, &m->cfg, w, &h, T);
}

/* up = silu(h · gateᵀ) * (h · upᵀ) in one fused op, for decode-sized
 * ubatches (T <= 4: the GEMV regime, where the fused op saves a launch and
 * a round trip of both products) of a gated SiLU FFN without biases (not in
 * FAST mode on the CPU backend, below).
 * LLMEM_E_UNSUPPORTED when it does not apply or the backend lacks the op:
 * the caller then runs the unfused ops. */
static llmem_status fused_gate_up(llmem_model *m, const layer_w *L, int32_t T,
                                  const llmem_tensor *h, const llmem_tensor *up)
{
    const llmem_model_config *c = &m->cfg;
    const wt *g = &L->w[LLMEM_W_FFN_GATE], *u = &L->w[LLMEM_W_FFN_UP];
    /* the CPU backend's FAST matmul rounds every activation row to bf16,
     * which the fused op (f32 activations) does not: there it would make a
     * row's result depend on the ubatch size (speculative decoding compares
     * them). Device backends run M <= 4 as the same f32 GEMV in both modes. */
    bool cpu_fast = m->p.precision == LLMEM_PRECISION_FAST &&
                    strcmp(llmem_backend_name(m->be), "cpu") == 0;
    if (cpu_fast || T > 4 || c->mlp_gate_multiplier != 1.0 || !c->ffn_gated || c->ffn_act != LLMEM_ACT_SILU || !g->present ||
        !u->present || L->w[LLMEM_W_FFN_GATE_BIAS].present ||
        L->w[LLMEM_W_FFN_UP_BIAS].present || g->t.dtype != u->t.dtype)
        return LLMEM_E_UNSUPPORTED;
    return llmem_op_matmul_swiglu(m->be, h, &g->t, &u->t, up);
}

/* h (normalized input) -> h (output) */
static llmem_status ffn(llmem_model *m, const layer_w *L, int32_t T)
{
    const llmem_model_config *c = &m->cfg;
    if (c->arch == LLMEM_ARCH_GRANITEMOEHYBRID)
        return moe_ffn(m, L, T);
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size);
    llmem_tensor up = act(m, m->off_b, T, c->intermediate_size);
    llmem_status fs = fused_gate_up(m, L, T, &h, &up);
    if (fs == LLMEM_OK) {
        TRY(linear(m, &up, &L->w[LLMEM_W_FFN_DOWN], &L->w[LLMEM_W_FFN_DOWN_BIAS], &h));
        return scale_by(m, &h, c->mlp_down_multiplier);
    }
    if (fs != LLMEM_E_UNSUPPORTED)
        return fs;
    TRY(linear(m, &h, &L->w[LLMEM_W_FFN_UP], &L->w[LLMEM_W_FFN_UP_BIAS], &up));
    if (c->ffn_gated) {
        llmem_tensor gate = act(m, m->off_a, T, c->intermediate_size);
        TRY(linear(m, &h, &L->w[LLMEM_W_FFN_GATE], &L->w[LLMEM_W_FFN_GATE_BIAS], &gate));
        TRY(scale_by(m, &gate, c->mlp_gate_multiplier)); /* falcon_h1 */
        if (c->ffn_act == LLMEM_ACT_SILU)
            TRY(llmem_op_swiglu(m->be, &gate, &up, &up));
        else {
            TRY(llmem_op_relu2(m->be, &gate, &gate));
            TRY(llmem_op_mul(m->be, &gate, &up, &up));
        }
    } else if (c->ffn_act == LLMEM_ACT_RELU2) {
        TRY(llmem_op_relu2(m->be, &up, &up));
    } else {
        TRY(llmem_op_silu(m->be, &up, &up));
    }
    TRY(linear(m, &up, &L->w[LLMEM_W_FFN_DOWN], &L->w[LLMEM_W_FFN_DOWN_BIAS], &h));
    return scale_by(m, &h, c->mlp_down_multiplier); /* falcon_h1 */
}

/* Runs one ubatch and leaves the logits of its n_outputs rows, in ubatch
 * output order, at off_logits ([n_outputs, n_vocab] f32). */
/* falcon_h1: h (normalized input) -> ssm_out * mamba(ssm_in * h) +
 * attn_out * attention(attn_in * h), the two branches on their own memory
 * layers (view va: KV, L->mem_layer2: recurrent). */
static llmem_status parallel(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *va)
{
    const llmem_model_config *c = &m->cfg;
    llmem_view vs = {0};
    TRY(llmem_memory_view(m->mem, L->mem_layer2, &vs));
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size), save, sum, mup;
    hf_falcon_tensors(m->fal, T, &save, &sum, &mup);
    TRY(llmem_op_scale(m->be, &h, 1.0f, &save));
    TRY(scale_by(m, &h, c->ssm_in_multiplier));
    TRY(mamba(m, L, T, &vs));
    TRY(llmem_op_scale(m->be, &h, (float)c->ssm_out_multiplier, &sum));
    TRY(llmem_op_scale(m->be, &save, (float)c->attention_in_multiplier, &h));
    TRY(attention(m, L, T, va));
    TRY(scale_by(m, &h, c->attention_out_multiplier));
    return llmem_op_add(m->be, &sum, &h, &h);
}

static llmem_status forward(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab)
{
    const llmem_model_config *c = &m->cfg;
    int32_t T = ub->n_tokens, D = c->hidden_size;
    TRY(llmem_buffer_upload(m->scratch, m->off_tok, ub->token, (size_t)T * 4));
    TRY(llmem_buffer_upload(m->scratch, m->off_pos, ub->pos, (size_t)T * 4));
    llmem_tensor tok = llmem_tensor_1d(m->scratch, m->off_tok, LLMEM_DTYPE_I32, T);
    llmem_tensor x = act(m, m->off_x, T, D), h = act(m, m->off_h, T, D);
    TRY(llmem_op_get_rows(m->be, &m->embed.t, &tok, &x));
    TRY(scale_by(m, &x, c->embedding_multiplier));
    /* pend: h holds a block's output not yet added to x; the add is fused
     * into the next RMS norm (llmem_op_add_rms_norm: equal to add then norm) */
    bool pend = false;
    float eps = (float)c->norm_eps;
    for (int32_t il = 0; il < c->n_layers; il++) {
        const layer_w *L = &m->layers[il];
        const llmem_layer_config *lc = &c->layers[il];
        llmem_view v = {0};
        if (L->mem_layer >= 0)
            TRY(llmem_memory_view(m->mem, L->mem_layer, &v));
        const llmem_tensor *nw = &L->w[LLMEM_W_MIXER_NORM].t;
        TRY(pend ? llmem_op_add_rms_norm(m->be, &x, &h, nw, eps, &h)
                 : llmem_op_rms_norm(m->be, &x, nw, eps, &h));
        if (lc->kind == LLMEM_LAYER_PARALLEL)
            TRY(parallel(m, L, T, &v));
        else if (lc->kind == LLMEM_LAYER_ATTENTION)
            TRY(attention(m, L, T, &v));
        else if (lc->kind == LLMEM_LAYER_MAMBA2)
            TRY(mamba(m, L, T, &v));
        else if (lc->kind == LLMEM_LAYER_MOE)
            TRY(moe_ffn(m, L, T));
        else
            TRY(ffn(m, L, T));
        TRY(scale_by(m, &h, c->residual_multiplier));
        if (lc->has_ffn) {
            TRY(llmem_op_add_rms_norm(m->be, &x, &h, &L->w[LLMEM_W_FFN_NORM].t, eps, &h));
            TRY(ffn(m, L, T));
            TRY(scale_by(m, &h, c->residual_multiplier));
        }
        pend = true;
    }
    if (pend)
        TRY(llmem_op_add(m->be, &x, &h, &x));
    int32_t n_out = ub->n_outputs;
    if (n_out == 0)
        return LLMEM_OK;
    TRY(llmem_buffer_upload(m->scratch, m->off_rows, ub->out_rows, (size_t)n_out * 4));
    llmem_tensor rows = llmem_tensor_1d(m->scratch, m->off_rows, LLMEM_DTYPE_I32, n_out);
    llmem_tensor xo = act(m, m->off_h, n_out, D);
    TRY(llmem_op_get_rows(m->be, &x, &rows, &xo));
    TRY(llmem_op_rms_norm(m->be, &xo, &m->final_norm.t, (float)c->norm_eps, &xo));
    llmem_tensor logits = act(m, m->off_logits, n_out, n_vocab);
    TRY(matmul(m, &xo, &m->lm_head.t, &logits));
    return scale_by(m, &logits, 1.0 / c->logits_scaling); /* granite's logits_scaling */
}

/* What a decode does with the logits of each ubatch. */
typedef llmem_status (*emit_fn)(llmem_model *m, const llmem_ubatch *ub, const int32_t *row,
                                void *ctx);

typedef struct logits_out {
    bool log_softmax;
    float *out;
} logits_out;

/* Downloads the output rows' logits (or log-probabilities) in one transfer,
 * then scatters them to their batch rows: one wait per ubatch, not one per
 * row (a download is a submit and a wait on a device backend). */
static llmem_status emit_logits(llmem_model *m, const llmem_ubatch *ub, const int32_t *row,
                                void *vctx)
{
    const logits_out *c = vctx;
    int32_t n_out = ub->n_outputs, V = m->cfg.vocab_size;
    llmem_tensor logits = act(m, m->off_logits, n_out, V);
    if (c->log_softmax)
        TRY(llmem_op_log_softmax(m->be, &logits, &logits));
    size_t row_bytes = (size_t)V * 4;
    bool in_order = true; /* output o goes to batch row o: download in place */
    for (int32_t o = 0; o < n_out && in_order; o++)
        in_order = row[ub->out_ids[o]] == row[ub->out_ids[0]] + o;
    if (in_order && n_out > 0)
        return llmem_buffer_download(m->scratch, m->off_logits,
                                     c->out + (size_t)row[ub->out_ids[0]] * (size_t)V,
                                     (size_t)n_out * row_bytes);
    float *tmp = malloc((size_t)n_out * row_bytes);
    if (!tmp)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = llmem_buffer_download(m->scratch, m->off_logits, tmp, (size_t)n_out * row_bytes);
    for (int32_t o = 0; st == LLMEM_OK && o < n_out; o++)
        memcpy(c->out + (size_t)row[ub->out_ids[o]] * (size_t)V, tmp + (size_t)o * (size_t)V,
               row_bytes);
    free(tmp);
    return st;
}

/* Plans the batch, runs every ubatch through forward and `emit`, commits. */
static llmem_status decode_batch(llmem_model *m, const llmem_batch *b, int32_t out_cap_rows,
                                 int32_t *n_outputs, emit_fn emit, void *ctx, char *err,
                                 size_t err_len)
{
    *n_outputs = 0;
    if (!b->token) {
        llmem_errf(err, err_len, "the model runtime takes token ids, not embeddings");
        return LLMEM_E_INVALID;
    }
    int32_t V = m->cfg.vocab_size;
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (b->token[i] < 0 || b->token[i] >= V) {
            llmem_errf(err, err_len, "batch token %d: id %d outside the vocabulary [0, %d)", i,
                     b->token[i], V);
            return LLMEM_E_INVALID;
        }
    int32_t *row = malloc((size_t)(b->n_tokens > 0 ? b->n_tokens : 1) * sizeof *row);
    if (!row)
        return LLMEM_E_NO_MEMORY;
    int32_t n = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        bool o = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
        row[i] = o ? n++ : -1;
    }
    if (n > out_cap_rows) {
        free(row);
        llmem_errf(err, err_len, "the batch has %d output rows, the output holds %d", n, out_cap_rows);
        return LLMEM_E_INVALID;
    }
    llmem_plan *plan = NULL;
    llmem_status s = llmem_memory_plan(m->mem, b, LLMEM_SPLIT_AUTO, m->p.n_ubatch, &plan, err,
                                       err_len);
    for (int32_t i = 0; s == LLMEM_OK && i < llmem_plan_n_ubatch(plan); i++) {
        const llmem_ubatch *ub;
        s = llmem_memory_apply(m->mem, plan, i, &ub);
        if (s == LLMEM_OK) {
            m->stats.n_ubatch++;
            m->stats.n_tokens += ub->n_tokens;
            m->stats.n_outputs += ub->n_outputs;
        }
        if (s == LLMEM_OK && (s = forward(m, ub, V)) != LLMEM_OK)
            llmem_errf(err, err_len, "forward pass of ubatch %d failed: %s", i, llmem_status_str(s));
        if (s == LLMEM_OK && ub->n_outputs > 0 && (s = emit(m, ub, row, ctx)) != LLMEM_OK)
            llmem_errf(err, err_len, "output of ubatch %d failed: %s", i, llmem_status_str(s));
        if (s == LLMEM_OK)
            s = llmem_memory_commit(m->mem, plan, i);
    }
    llmem_memory_release(m->mem, plan);
    free(row);
    if (s == LLMEM_OK)
        *n_outputs = n;
    return s;
}

llmem_status llmem_model_decode(llmem_model *m, const llmem_batch *b, bool log_softmax, float *out,
                                int32_t out_cap_rows, int32_t *n_outputs, char *err,
                                size_t err_len)
{
    if (!m || !b || !n_outputs || (!out && out_cap_rows > 0)) {
        llmem_errf(err, err_len, "NULL argument");
        return LLMEM_E_INVALID;
    }
    logits_out c = {.log_softmax = log_softmax, .out = out};
    return decode_batch(m, b, out_cap_rows, n_outputs, emit_logits, &c, err, err_len);
}

/* --- sampling on the device ------------------------------------------------------ */

/* Where the output ops of a ubatch run: the model's backend and scratch,
 * or the CPU fallback (a CPU backend and a buffer laid out the same way). */
typedef struct out_place {
    llmem_backend *be;
    llmem_buffer *buf;
    size_t off_logits, off_ids, off_ctr, off_lp, off_top_ids, off_top_lp;
} out_place;

/* Sample (or take forced ids), gather log-probs and top lists at `p`; the
 * host arrays ctr/ids are per ubatch output row. */
static llmem_status sample_at(const out_place *p, const llmem_model_sampling *s, int32_t n_out,
                              int32_t V, const int32_t *ctr, int32_t *ids)
{
    llmem_tensor logits = llmem_tensor_2d(p->buf, p->off_logits, LLMEM_DTYPE_F32, n_out, V);
    llmem_tensor tid = llmem_tensor_1d(p->buf, p->off_ids, LLMEM_DTYPE_I32, n_out);
    if (s->force_ids) {
        TRY(llmem_buffer_upload(p->buf, p->off_ids, ids, (size_t)n_out * 4));
    } else {
        llmem_tensor tc = llmem_tensor_1d(p->buf, p->off_ctr, LLMEM_DTYPE_I32, n_out);
        TRY(llmem_buffer_upload(p->buf, p->off_ctr, ctr, (size_t)n_out * 4));
        TRY(llmem_op_sample(p->be, &s->params, &logits, &tc, &tid));
    }
    if (s->logprob) {
        llmem_tensor lp = llmem_tensor_1d(p->buf, p->off_lp, LLMEM_DTYPE_F32, n_out);
        TRY(llmem_op_logprob_gather(p->be, &logits, &tid, &lp));
    }
    if (s->n_top > 0) {
        llmem_tensor ti = llmem_tensor_2d(p->buf, p->off_top_ids, LLMEM_DTYPE_I32, n_out, s->n_top);
        llmem_tensor tl = llmem_tensor_2d(p->buf, p->off_top_lp, LLMEM_DTYPE_F32, n_out, s->n_top);
        TRY(llmem_op_top_logprobs(p->be, &logits, s->n_top, &ti, &tl));
    }
    return LLMEM_OK;
}

/* Copies the ubatch's logits to the CPU fallback place (growing it). */
static llmem_status fallback_place(llmem_model *m, int32_t n_out, int32_t V, out_place *p)
{
    size_t rows = (size_t)n_out, logits = round_up(rows * (size_t)V * 4);
    size_t small = round_up(rows * 4), top = round_up(rows * 64 * 4);
    size_t need = logits + 3 * small + 2 * top;
    if (!m->fb_be)
        TRY(llmem_backend_open("cpu", -1, &m->fb_be, NULL, 0));
    if (m->fb_size < need) {
        llmem_buffer_free(m->fb_buf);
        m->fb_buf = NULL;
        m->fb_size = 0;
        TRY(llmem_buffer_alloc(m->fb_be, need, &m->fb_buf));
        m->fb_size = need;
    }
    *p = (out_place){.be = m->fb_be, .buf = m->fb_buf, .off_logits = 0, .off_ids = logits,
                     .off_ctr = logits + small, .off_lp = logits + 2 * small,
                     .off_top_ids = logits + 3 * small, .off_top_lp = logits + 3 * small + top};
    float *host = malloc(rows * (size_t)V * 4);
    if (!host)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = llmem_buffer_download(m->scratch, m->off_logits, host, rows * (size_t)V * 4);
    if (st == LLMEM_OK)
        st = llmem_buffer_upload(m->fb_buf, 0, host, rows * (size_t)V * 4);
    free(host);
    return st;
}

static llmem_status emit_sampled(llmem_model *m, const llmem_ubatch *ub, const int32_t *row,
                                 void *vctx)
{
    const llmem_model_sampling *s = vctx;
    int32_t n_out = ub->n_outputs, V = m->cfg.vocab_size;
    int32_t *ctr = malloc((size_t)n_out * 2 * sizeof *ctr);
    float *f = malloc((size_t)n_out * 64 * sizeof *f);
    if (!ctr || !f) {
        free(ctr);
        free(f);
        return LLMEM_E_NO_MEMORY;
    }
    int32_t *ids = ctr + n_out;
    for (int32_t o = 0; o < n_out; o++) {
        int32_t r = row[ub->out_ids[o]];
        ctr[o] = s->ctr ? s->ctr[r] : r;
        ids[o] = s->force_ids ? s->force_ids[r] : 0;
        if (ids[o] < 0 || ids[o] >= V) {
            free(ctr);
            free(f);
            return LLMEM_E_INVALID; /* a forced token outside the vocabulary */
        }
    }
    out_place p = {.be = m->be, .buf = m->scratch, .off_logits = m->off_logits,
                   .off_ids = m->off_ids, .off_ctr = m->off_ctr, .off_lp = m->off_lp,
                   .off_top_ids = m->off_top_ids, .off_top_lp = m->off_top_lp};
    llmem_status st = sample_at(&p, s, n_out, V, ctr, ids);
    if (st == LLMEM_E_UNSUPPORTED) {
        st = fallback_place(m, n_out, V, &p);
        if (st == LLMEM_OK)
            st = sample_at(&p, s, n_out, V, ctr, ids);
    }
    if (st == LLMEM_OK && !s->force_ids)
        st = llmem_buffer_download(p.buf, p.off_ids, ids, (size_t)n_out * 4);
    for (int32_t o = 0; st == LLMEM_OK && o < n_out; o++)
        s->ids[row[ub->out_ids[o]]] = ids[o];
    if (st == LLMEM_OK && s->logprob && (st = llmem_buffer_download(p.buf, p.off_lp, f,
                                                                     (size_t)n_out * 4)) == LLMEM_OK)
        for (int32_t o = 0; o < n_out; o++)
            s->logprob[row[ub->out_ids[o]]] = f[o];
    if (st == LLMEM_OK && s->n_top > 0) {
        size_t k = (size_t)s->n_top;
        int32_t *ti = (int32_t *)(void *)f;
        for (int pass = 0; st == LLMEM_OK && pass < 2; pass++) {
            st = llmem_buffer_download(p.buf, pass ? p.off_top_lp : p.off_top_ids, f,
                                       (size_t)n_out * k * 4);
            for (int32_t o = 0; st == LLMEM_OK && o < n_out; o++) {
                size_t r = (size_t)row[ub->out_ids[o]];
                if (pass)
                    memcpy(s->top_logprob + r * k, f + (size_t)o * k, k * 4);
                else
                    memcpy(s->top_ids + r * k, ti + (size_t)o * k, k * 4);
            }
        }
    }
    free(ctr);
    free(f);
    return st;
}

llmem_status llmem_model_decode_sample(llmem_model *m, const llmem_batch *b,
                                       const llmem_model_sampling *s, int32_t out_cap_rows,
                                       int32_t *n_outputs, char *err, size_t err_len)
{
    if (!m || !b || !n_outputs || !s || (!s->ids && out_cap_rows > 0) || s->n_top < 0 ||
        s->n_top > 64 || s->n_top > m->cfg.vocab_size ||
        (s->n_top > 0 && out_cap_rows > 0 && (!s->top_ids || !s->top_logprob))) {
        llmem_errf(err, err_len, "invalid sampling arguments (NULL output, or n_top outside "
                               "[0, min(64, n_vocab)])");
        return LLMEM_E_INVALID;
    }
    const llmem_sample_params *sp = &s->params;
    if (isnan(sp->temperature) || !(sp->top_p > 0.0f) || isnan(sp->min_p) || sp->min_p > 1.0f) {
        llmem_errf(err, err_len, "invalid sampling parameters (top_p in (0, 1], min_p <= 1)");
        return LLMEM_E_INVALID;
    }
    return decode_batch(m, b, out_cap_rows, n_outputs, emit_sampled, (void *)s, err, err_len);
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

/* llmem models/: the load-time op check. Before a model is used, every op
 * its forward pass will call (for its architecture, layer kinds, weight
 * dtypes and the KV / SSM state dtypes of its parameters) is asked of the
 * backend with llmem_backend_supports (<llmem/ops.h>), so a partial backend
 * fails at llmem_model_load with the op and backend named, not in the
 * middle of a forward pass. Output ops with a CPU fallback (sample,
 * logprob_gather, top_logprobs: run on the CPU backend with explicit copies
 * of the logits) and ops whose wrapper falls back (matmul_fast,
 * add_rms_norm, matmul_swiglu's callers) are not required.
 */
#include <stdio.h>
#include <string.h>

#include "llmem/ops_gdn.h"
#include "llmem/ops_moe.h"
#include "llmem/ops_ssm1.h"
#include "models/model_internal.h"

#define F LLMEM_DTYPE_F32
#define I LLMEM_DTYPE_I32

typedef struct checker {
    llmem_model *m;
    char *err;
    size_t err_len;
    llmem_status st;
} checker;

/* Asks for op with n operand dtypes; the first refusal is kept, naming
 * the op, the dtypes, what needs it and the backend. */
static void need(checker *c, int32_t il, llmem_op op, int32_t n, const llmem_dtype *dt)
{
    if (c->st != LLMEM_OK || llmem_backend_supports(c->m->be, op, dt, n))
        return;
    char types[96] = "";
    size_t used = 0;
    for (int32_t k = 0; k < n && used < sizeof types; k++)
        used += (size_t)snprintf(types + used, sizeof types - used, "%s%s", k ? ", " : "",
                                 llmem_dtype_name(dt[k]));
    char what[64];
    if (il >= 0)
        snprintf(what, sizeof what, "layer %d (%s)", il,
                 llmem_layer_kind_name(c->m->cfg.layers[il].kind));
    else
        snprintf(what, sizeof what, "every layer");
    llmem_errf(c->err, c->err_len,
               "the %s backend does not support op %s%s%s%s, which this %s model needs for %s",
               llmem_backend_name(c->m->be), llmem_op_name(op), n ? " (operand dtypes " : "",
               types, n ? ")" : "", llmem_arch_name(c->m->cfg.arch), what);
    c->st = LLMEM_E_UNSUPPORTED;
}

#define NEED(c, il, op, ...)                                                           \
    do {                                                                               \
        const llmem_dtype dt_[] = {__VA_ARGS__};                                       \
        need(c, il, op, (int32_t)(sizeof dt_ / sizeof dt_[0]), dt_);                   \
    } while (0)
#define NEED0(c, il, op) need(c, il, op, 0, NULL)

/* A matmul for the weight dtype of every present 2-D weight. */
static void need_matmul(checker *c, const llmem_tensor *w, int32_t il)
{
    if (w->buf && w->n_dims == 2)
        NEED(c, il, LLMEM_OP_MATMUL, F, w->dtype, F);
}

static void need_ffn(checker *c, int32_t il)
{
    const llmem_model_config *cfg = &c->m->cfg;
    if (cfg->ffn_gated) {
        if (cfg->ffn_act == LLMEM_ACT_SILU)
            NEED(c, il, LLMEM_OP_SWIGLU, F, F, F);
        else if (cfg->ffn_act == LLMEM_ACT_GELU_TANH)
            NEED(c, il, LLMEM_OP_GEGLU, F, F, F);
        else {
            NEED(c, il, LLMEM_OP_RELU2, F, F);
            NEED(c, il, LLMEM_OP_MUL, F, F, F);
        }
    } else {
        NEED(c, il, cfg->ffn_act == LLMEM_ACT_RELU2 ? LLMEM_OP_RELU2 : LLMEM_OP_SILU, F, F);
    }
}

static void need_moe(checker *c, int32_t il)
{
    NEED(c, il, LLMEM_OP_MOE_ROUTE, F);
    NEED(c, il, LLMEM_OP_MOE_FFN, F, I, F);
    /* the shared expert and the routed sum (models/moe.c) */
    NEED(c, il, LLMEM_OP_COPY, F, F);
    NEED(c, il, LLMEM_OP_SCALE, F, F);
    NEED(c, il, LLMEM_OP_MUL, F, F, F);
}

static void need_attention(checker *c, int32_t il)
{
    const llmem_model *m = c->m;
    if (m->cfg.use_rope)
        NEED(c, il, LLMEM_OP_ROPE, F, I, F);
    NEED(c, il, LLMEM_OP_KV_STORE, m->p.kv_dtype, F, F);
    NEED(c, il, LLMEM_OP_ATTENTION_PAGED, m->p.kv_dtype, F, F);
    if (m->cfg.arch == LLMEM_ARCH_QWEN3_NEXT)
        NEED(c, il, LLMEM_OP_SIGMOID_MUL, F, F, F); /* the output gate */
}

static void need_mamba2(checker *c, int32_t il)
{
    NEED0(c, il, LLMEM_OP_SSM_CONV);
    NEED(c, il, LLMEM_OP_SSM_SCAN, c->m->p.ssm_dtype);
    NEED(c, il, LLMEM_OP_COPY, F, F);
    if (c->m->cfg.ssm_gate_only)
        NEED(c, il, LLMEM_OP_SWIGLU, F, F, F);
    else
        NEED(c, il, LLMEM_OP_RMS_NORM_GATED, F, F);
}

static void need_layer(checker *c, int32_t il)
{
    const llmem_model *m = c->m;
    const llmem_layer_config *L = &m->cfg.layers[il];
    switch (L->kind) {
    case LLMEM_LAYER_ATTENTION: need_attention(c, il); break;
    case LLMEM_LAYER_PARALLEL:
        need_attention(c, il);
        NEED(c, il, LLMEM_OP_SCALE, F, F);
        need_mamba2(c, il);
        break;
    case LLMEM_LAYER_MAMBA2: need_mamba2(c, il); break;
    case LLMEM_LAYER_MLP: need_ffn(c, il); break;
    case LLMEM_LAYER_MOE: need_moe(c, il); break;
    case LLMEM_LAYER_GDN:
        NEED0(c, il, LLMEM_OP_SSM_CONV);
        NEED0(c, il, LLMEM_OP_GDN);
        NEED(c, il, LLMEM_OP_COPY, F, F);
        NEED(c, il, LLMEM_OP_SIGMOID_MUL, F, F, F);
        break;
    case LLMEM_LAYER_SHORTCONV: NEED0(c, il, LLMEM_OP_SHORT_CONV); break;
    case LLMEM_LAYER_MAMBA1:
        NEED0(c, il, LLMEM_OP_SSM_CONV);
        NEED(c, il, LLMEM_OP_SSM_SCAN1, c->m->p.ssm_dtype); /* no int8 Mamba-1 state */
        NEED(c, il, LLMEM_OP_COPY, F, F);
        break;
    case LLMEM_LAYER_KIND_COUNT: break;
    }
    if (L->has_ffn) {
        bool moe = L->ffn_moe || (m->cfg.n_expert > 0 &&
                                  (m->cfg.arch == LLMEM_ARCH_GRANITEMOEHYBRID ||
                                   m->cfg.arch == LLMEM_ARCH_QWEN3_NEXT));
        if (moe)
            need_moe(c, il);
        else
            need_ffn(c, il);
    }
    for (int32_t k = 0; k < LLMEM_W_COUNT; k++)
        if (m->layers[il].w[k].present)
            need_matmul(c, &m->layers[il].w[k].t, il);
}

llmem_status hf_check_ops(llmem_model *m, char *err, size_t err_len)
{
    checker c = {m, err, err_len, LLMEM_OK};
    NEED(&c, -1, LLMEM_OP_GET_ROWS, m->embed.t.dtype, I, F);
    NEED(&c, -1, LLMEM_OP_ADD, F, F, F);
    NEED(&c, -1, LLMEM_OP_RMS_NORM, F, m->final_norm.t.dtype, F);
    need_matmul(&c, &m->lm_head.t, -1);
    if (m->cfg.final_softcap > 0)
        NEED(&c, -1, LLMEM_OP_SOFTCAP, F, F);
    /* granite / falcon_h1 multipliers (scale_by, muP segments) */
    if (m->cfg.embedding_multiplier != 1 || m->cfg.residual_multiplier != 1 ||
        m->cfg.logits_scaling != 1 || m->cfg.arch == LLMEM_ARCH_FALCON_H1) {
        NEED(&c, -1, LLMEM_OP_SCALE, F, F);
        NEED(&c, -1, LLMEM_OP_MUL, F, F, F);
    }
    for (int32_t il = 0; il < m->cfg.n_layers && c.st == LLMEM_OK; il++)
        need_layer(&c, il);
    return c.st;
}

/* llmem: CPU gated delta net ops: the gated delta rule with a delta-rule
 * state from a recurrent view (slots and checkpoints), in its recurrent
 * and its chunked form, and the sigmoid output gate.
 *
 * Math: Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks", eq. (10),
 * with q/k L2-normalized and q scaled by 1/sqrt(d_k), as transformers'
 * Qwen3NextGatedDeltaNet (use_qk_l2norm_in_kernel). Recurrent form, per
 * token: S = e^g S; S += k ⊗ beta (v - Sᵀk); o = Sᵀq.
 *
 * Chunked form (derived here from the recurrence): within a chunk starting
 * from state S0, with c_i = g_1 + .. + g_i the cumulative log decay,
 *   S_i = e^{c_i} S0 + sum_{j<=i} e^{c_i - c_j} k_j ⊗ d_j
 * where d_j is token j's correction beta_j (v_j - S_{j-1}ᵀ k_j e^{g_j}).
 * Substituting gives a unit lower-triangular system per chunk,
 *   d_i + sum_{j<i} beta_i e^{c_i - c_j} (k_i·k_j) d_j = beta_i (v_i - e^{c_i} S0ᵀ k_i),
 * solved by forward substitution; then
 *   o_i = e^{c_i} S0ᵀ q_i + sum_{j<=i} e^{c_i - c_j} (q_i·k_j) d_j,
 *   S_n = e^{c_n} S0 + sum_j e^{c_n - c_j} k_j ⊗ d_j.
 * Every exponent is <= 0 (g <= 0), so nothing overflows. This is the
 * "UT transform" form of DeltaNet's chunkwise algorithm (Yang et al. 2024,
 * "Parallelizing Linear Transformers with the Delta Rule over Sequence
 * Length", Sec. 3), solved row by row.
 *
 * Slot discipline as ops_mamba.c: a work item reads its source slot before
 * writing any destination; a source that another group writes is
 * snapshotted before the parallel part starts (cpu_rs_io_init). The
 * snapshot inside the ubatch (llmem_rs_view.snap_tok / snap_slot) is
 * written like a checkpoint: in the chunked part, the chunk that holds its
 * token is split there.
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"
#include "llmem/ops_gdn.h"
#include "llmem/view.h"

#define GDN_CHUNK 64

typedef struct gdn_ctx {
    const rs_io *io;
    const llmem_gdn_params *p;
    const float *qkv, *a, *b, *a_log, *dt_bias;
    float *out;
    int64_t width; /* qkv row */
    size_t scratch_per;
    float *scratch;
} gdn_ctx;

/* Token tok's normalized query (scaled) and key of key head g, its beta and
 * log decay for value head h. */
static void gdn_token(const gdn_ctx *c, int64_t tok, int64_t g, int64_t h, float *q, float *k,
                      float *beta, float *lg)
{
    int64_t dk = c->p->d_k, Hk = c->p->n_k_heads, Hv = c->p->n_v_heads;
    const float *row = c->qkv + tok * c->width;
    const float *qs = row + g * dk, *ks = row + Hk * dk + g * dk;
    float qq = 0.0f, kk = 0.0f;
    for (int64_t i = 0; i < dk; i++) {
        qq += qs[i] * qs[i];
        kk += ks[i] * ks[i];
    }
    float qn = 1.0f / sqrtf(qq + 1e-6f) / sqrtf((float)dk), kn = 1.0f / sqrtf(kk + 1e-6f);
    for (int64_t i = 0; i < dk; i++) {
        q[i] = qs[i] * qn;
        k[i] = ks[i] * kn;
    }
    *beta = 1.0f / (1.0f + expf(-c->b[tok * Hv + h]));
    float x = c->a[tok * Hv + h] + c->dt_bias[h];
    float sp = x > 20.0f ? x : log1pf(expf(x));
    *lg = -expf(c->a_log[h]) * sp;
}

static void gdn_store(const gdn_ctx *c, const float *S, int64_t h, int32_t slot)
{
    int64_t hs = (int64_t)c->p->d_k * c->p->d_v;
    size_t es = llmem_dtype_size(c->io->dtype);
    store_f32(S, c->io->dtype, hs, cpu_rs_slot(c->io, slot) + (size_t)(h * hs) * es);
}

/* One recurrent step of value head h on state S [d_k][d_v]. */
static void gdn_step(const gdn_ctx *c, float *S, const float *q, const float *k, const float *v,
                     float beta, float lg, float *kv, float *o)
{
    int64_t dk = c->p->d_k, dv = c->p->d_v;
    float decay = expf(lg);
    memset(kv, 0, (size_t)dv * sizeof *kv);
    for (int64_t i = 0; i < dk; i++) {
        scal_f32(S + i * dv, decay, dv);
        axpy_f32(kv, S + i * dv, k[i], dv);
    }
    for (int64_t j = 0; j < dv; j++)
        kv[j] = beta * (v[j] - kv[j]);
    memset(o, 0, (size_t)dv * sizeof *o);
    for (int64_t i = 0; i < dk; i++) {
        axpy_f32(S + i * dv, kv, k[i], dv);
        axpy_f32(o, S + i * dv, q[i], dv);
    }
}

/* Tokens [t0, t0 + n) of group s, value head h, in one chunk (n <= 64). */
static void gdn_chunk(const gdn_ctx *c, float *S, int64_t s, int64_t h, int64_t t0, int64_t n,
                      float *Q, float *K, float *D, float *cum, float *beta, float *tmp)
{
    int64_t dk = c->p->d_k, dv = c->p->d_v, Hv = c->p->n_v_heads;
    int64_t g = h / (Hv / c->p->n_k_heads);
    const int64_t v0 = 2 * (int64_t)c->p->n_k_heads * dk + h * dv;
    float run = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        int64_t tok = s * c->io->n_tok + t0 + i;
        float lg;
        gdn_token(c, tok, g, h, Q + i * dk, K + i * dk, &beta[i], &lg);
        run += lg;
        cum[i] = run;
    }
    /* corrections d_i by forward substitution */
    for (int64_t i = 0; i < n; i++) {
        const float *ki = K + i * dk;
        const float *v = c->qkv + (s * c->io->n_tok + t0 + i) * c->width + v0;
        float *di = D + i * dv;
        memset(tmp, 0, (size_t)dv * sizeof *tmp);
        for (int64_t r = 0; r < dk; r++)
            axpy_f32(tmp, S + r * dv, ki[r], dv); /* S0ᵀ k_i */
        float e = expf(cum[i]);
        for (int64_t j = 0; j < dv; j++)
            di[j] = beta[i] * (v[j] - e * tmp[j]);
        for (int64_t j = 0; j < i; j++) {
            float w = beta[i] * expf(cum[i] - cum[j]) * dot_f32(ki, K + j * dk, dk);
            axpy_f32(di, D + j * dv, -w, dv);
        }
    }
    /* outputs */
    for (int64_t i = 0; i < n; i++) {
        const float *qi = Q + i * dk;
        float *o = c->out + (s * c->io->n_tok + t0 + i) * Hv * dv + h * dv;
        memset(tmp, 0, (size_t)dv * sizeof *tmp);
        for (int64_t r = 0; r < dk; r++)
            axpy_f32(tmp, S + r * dv, qi[r], dv);
        float e = expf(cum[i]);
        for (int64_t j = 0; j < dv; j++)
            o[j] = e * tmp[j];
        for (int64_t j = 0; j <= i; j++)
            axpy_f32(o, D + j * dv, expf(cum[i] - cum[j]) * dot_f32(qi, K + j * dk, dk), dv);
    }
    /* state at the chunk's end */
    float eN = expf(cum[n - 1]);
    for (int64_t r = 0; r < dk; r++)
        scal_f32(S + r * dv, eN, dv);
    for (int64_t j = 0; j < n; j++) {
        float w = expf(cum[n - 1] - cum[j]);
        const float *kj = K + j * dk;
        for (int64_t r = 0; r < dk; r++)
            axpy_f32(S + r * dv, D + j * dv, w * kj[r], dv);
    }
}

static void gdn_run(void *vctx, int64_t it0, int64_t it1, int32_t thread)
{
    const gdn_ctx *c = vctx;
    const rs_io *io = c->io;
    int64_t dk = c->p->d_k, dv = c->p->d_v, Hv = c->p->n_v_heads;
    int64_t hs = dk * dv;
    float *S = c->scratch + (size_t)thread * c->scratch_per;
    float *Q = S + hs, *K = Q + GDN_CHUNK * dk, *D = K + GDN_CHUNK * dk, *cum = D + GDN_CHUNK * dv;
    float *beta = cum + GDN_CHUNK, *tmp = beta + GDN_CHUNK, *o = tmp + dv;
    for (int64_t it = it0; it < it1; it++) {
        int64_t s = it / Hv, h = it % Hv, g = h / (Hv / c->p->n_k_heads);
        const char *src = io->src_ptr[s];
        size_t es = llmem_dtype_size(io->dtype);
        if (src)
            load_f32(src + (size_t)(h * hs) * es, io->dtype, hs, S);
        else
            memset(S, 0, (size_t)hs * sizeof *S);
        const int32_t *ck = io->ckpt + (int64_t)s * io->n_ckpt;
        bool any_ckpt = false;
        for (int32_t k = 0; k < io->n_ckpt; k++) {
            any_ckpt |= ck[k] >= 0;
            if (cpu_rs_ckpt_token(io, k) == -1 && ck[k] >= 0)
                gdn_store(c, S, h, ck[k]);
        }
        /* chunked up to the checkpointed tail (all of it for one token) */
        int64_t t_rec = io->n_tok == 1 ? 0 : io->n_tok;
        if (any_ckpt && io->n_tok - io->n_ckpt < t_rec)
            t_rec = io->n_tok - io->n_ckpt > 0 ? io->n_tok - io->n_ckpt : 0;
        /* the snapshot inside the ubatch: a chunk holding its token ends
         * there (the state exists only at chunk ends) and goes on after it */
        int32_t snap = cpu_rs_snap_slot(io, s);
        int64_t snap_end = snap >= 0 ? (int64_t)io->snap_tok[s] + 1 : -1;
        for (int64_t t0 = 0; t0 < t_rec; t0 += GDN_CHUNK) {
            int64_t n = t_rec - t0 < GDN_CHUNK ? t_rec - t0 : GDN_CHUNK;
            if (snap_end > t0 && snap_end <= t0 + n) {
                gdn_chunk(c, S, s, h, t0, snap_end - t0, Q, K, D, cum, beta, tmp);
                gdn_store(c, S, h, snap);
                if (snap_end < t0 + n)
                    gdn_chunk(c, S, s, h, snap_end, t0 + n - snap_end, Q, K, D, cum, beta,
                              tmp);
            } else {
                gdn_chunk(c, S, s, h, t0, n, Q, K, D, cum, beta, tmp);
            }
        }
        for (int64_t t = t_rec; t < io->n_tok; t++) {
            int64_t tok = s * io->n_tok + t;
            float bt, lg;
            gdn_token(c, tok, g, h, Q, K, &bt, &lg);
            const float *v = c->qkv + tok * c->width + 2 * (int64_t)c->p->n_k_heads * dk + h * dv;
            gdn_step(c, S, Q, K, v, bt, lg, tmp, o);
            memcpy(c->out + tok * Hv * dv + h * dv, o, (size_t)dv * sizeof *o);
            for (int32_t k = 0; k < io->n_ckpt; k++)
                if (cpu_rs_ckpt_token(io, k) == t && ck[k] >= 0)
                    gdn_store(c, S, h, ck[k]);
            if (snap >= 0 && snap_end == t + 1)
                gdn_store(c, S, h, snap);
        }
        if (io->dst[s] >= 0)
            gdn_store(c, S, h, io->dst[s]);
    }
}

static llmem_status cpu_op_gdn(llmem_backend *be, const llmem_gdn_params *p,
                               const llmem_view *view, int32_t state, llmem_ct *qkv, llmem_ct *a,
                               llmem_ct *b, llmem_ct *a_log, llmem_ct *dt_bias, llmem_ct *out)
{
    (void)be;
    gdn_ctx c = {
        .p = p,
        .qkv = tensor_data(qkv),
        .a = tensor_data(a),
        .b = tensor_data(b),
        .out = tensor_data(out),
        .width = 2 * (int64_t)p->n_k_heads * p->d_k + (int64_t)p->n_v_heads * p->d_v,
    };
    rs_io io;
    llmem_status st = cpu_rs_io_init(&io, view, state);
    if (st != LLMEM_OK)
        return st;
    c.io = &io;
    float *own_a = NULL, *own_b = NULL;
    int64_t dk = p->d_k, dv = p->d_v;
    int64_t items = (int64_t)io.n_seqs * p->n_v_heads;
    c.scratch_per = (size_t)(dk * dv + 2 * GDN_CHUNK * dk + GDN_CHUNK * dv + 2 * GDN_CHUNK + 2 * dv);
    int32_t nth = cpu_threads_for(items * dk * dv * io.n_tok * 4);
    if (nth > items)
        nth = items > 0 ? (int32_t)items : 1;
    c.scratch = malloc((size_t)nth * c.scratch_per * sizeof *c.scratch);
    if (!c.scratch) {
        st = LLMEM_E_NO_MEMORY;
        goto fail;
    }
    if ((st = cpu_param_f32(a_log, &c.a_log, &own_a)) != LLMEM_OK ||
        (st = cpu_param_f32(dt_bias, &c.dt_bias, &own_b)) != LLMEM_OK)
        goto fail;
    llmem_tp_run(nth, items, 1, gdn_run, &c);
fail:
    free(own_a);
    free(own_b);
    free(c.scratch);
    cpu_rs_io_finish(&io);
    return st;
}

/* ---- sigmoid gate -------------------------------------------------------------------- */

static llmem_status cpu_op_sigmoid_mul(llmem_backend *be, llmem_ct *x, llmem_ct *gate,
                                       llmem_ct *out)
{
    (void)be;
    const float *xs = tensor_data(x), *gs = tensor_data(gate);
    float *o = tensor_data(out);
    int64_t rows = tensor_rows(x), C = tensor_cols(x), Cg = tensor_cols(gate), per = C / Cg;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < C; j++)
            o[r * C + j] = xs[r * C + j] / (1.0f + expf(-gs[r * Cg + j / per]));
    return LLMEM_OK;
}

/* Registered in the cpu backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_GDN, LLMEM_OP_GDN_LAYOUT, llmem_op_gdn_fn, cpu_op_gdn);
LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_SIGMOID_MUL, LLMEM_OP_SIGMOID_MUL_LAYOUT,
              llmem_op_sigmoid_mul_fn, cpu_op_sigmoid_mul);

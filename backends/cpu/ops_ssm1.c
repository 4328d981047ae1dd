/* llmem: CPU reference of the short-conv (LFM2) and Mamba-1 ops, both with
 * state slots and checkpoints from a recurrent view (issue 16).
 *
 * short_conv follows transformers Lfm2ShortConv.forward: B, C, x =
 * in_proj(h).chunk(3); out = C * conv1d(B * x) (depthwise, L_cache taps,
 * causal, no activation). ssm_scan1 follows transformers
 * mamba_selective_scan's sequential path (JambaMambaMixer), the recurrent
 * form of Mamba's selective scan (Gu & Dao 2023, Alg. 2): per channel c,
 * S = exp(dt A) S + dt B x, y = S . C + D x, times silu(z).
 *
 * Slot discipline as ops_mamba.c (cpu_rs_io_init): every stream reads its
 * source before it writes a destination, checkpoint or snapshot slot (the
 * snapshot inside the ubatch, llmem_rs_view.snap_tok / snap_slot, is
 * written like a checkpoint after token snap_tok[s]).
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"
#include "llmem/ops_ssm1.h"
#include "llmem/view.h"

#define SC_CB 64 /* channels per short-conv work item */

/* ---- short conv ------------------------------------------------------------------------ */

typedef struct sc_ctx {
    const rs_io *io;
    const float *bcx; /* [T, 3D] */
    float *out;       /* [T, D] */
    const float *wt;  /* [L][D] transposed taps */
    const float *b;   /* [D] or NULL */
    int64_t D, L, n_cb;
    float *scratch;   /* per thread: u [(L - 1 + n_tok)][SC_CB] */
} sc_ctx;

/* Stores the state after token tt: rows u[tt + 1 .. tt + L - 1]. */
static void sc_store(const sc_ctx *c, const float *u, int64_t c0, int64_t nc, int32_t tt,
                     int32_t slot)
{
    size_t es = llmem_dtype_size(c->io->dtype);
    char *dst = cpu_rs_slot(c->io, slot);
    for (int64_t r = 0; r < c->L - 1; r++)
        store_f32(u + (tt + 1 + r) * SC_CB, c->io->dtype, nc,
                  dst + ((size_t)r * (size_t)c->D + (size_t)c0) * es);
}

static void sc_run(void *vctx, int64_t it0, int64_t it1, int32_t thread)
{
    const sc_ctx *c = vctx;
    const rs_io *io = c->io;
    int64_t L1 = c->L - 1, D = c->D;
    size_t es = llmem_dtype_size(io->dtype);
    float *u = c->scratch + (size_t)thread * (size_t)(L1 + io->n_tok) * SC_CB;
    for (int64_t it = it0; it < it1; it++) {
        int64_t s = it / c->n_cb, c0 = (it % c->n_cb) * SC_CB;
        int64_t nc = D - c0 < SC_CB ? D - c0 : SC_CB;
        const char *src = io->src_ptr[s];
        for (int64_t r = 0; r < L1; r++) {
            if (src)
                load_f32(src + ((size_t)r * (size_t)D + (size_t)c0) * es, io->dtype, nc,
                         u + r * SC_CB);
            else
                memset(u + r * SC_CB, 0, (size_t)nc * sizeof *u);
        }
        for (int32_t t = 0; t < io->n_tok; t++) {
            const float *row = c->bcx + (s * io->n_tok + t) * 3 * D;
            float *ut = u + (L1 + t) * SC_CB;
            for (int64_t j = 0; j < nc; j++)
                ut[j] = row[c0 + j] * row[2 * D + c0 + j];
        }
        for (int32_t t = 0; t < io->n_tok; t++) {
            const float *row = c->bcx + (s * io->n_tok + t) * 3 * D;
            float *o = c->out + (s * io->n_tok + t) * D + c0;
            for (int64_t j = 0; j < nc; j++) {
                float acc = c->b ? c->b[c0 + j] : 0.0f;
                for (int64_t k = 0; k < c->L; k++)
                    acc += c->wt[k * D + c0 + j] * u[(t + k) * SC_CB + j];
                o[j] = row[D + c0 + j] * acc;
            }
        }
        for (int32_t k = 0; k < io->n_ckpt; k++) {
            int32_t slot = io->ckpt[s * io->n_ckpt + k];
            if (slot >= 0)
                sc_store(c, u, c0, nc, cpu_rs_ckpt_token(io, k), slot);
        }
        if (cpu_rs_snap_slot(io, s) >= 0) /* the snapshot inside the ubatch */
            sc_store(c, u, c0, nc, io->snap_tok[s], cpu_rs_snap_slot(io, s));
        if (io->dst[s] >= 0)
            sc_store(c, u, c0, nc, io->n_tok - 1, io->dst[s]);
    }
}

static llmem_status cpu_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                                      llmem_ct *bcx, llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    (void)be;
    const llmem_state_desc *d = &llmem_view_rs(view)->desc[state];
    sc_ctx c = {.bcx = tensor_data(bcx), .out = tensor_data(out), .D = d->shape[1],
                .L = d->shape[0] + 1};
    c.n_cb = (c.D + SC_CB - 1) / SC_CB;
    rs_io io;
    llmem_status st = cpu_rs_io_init(&io, view, state);
    if (st != LLMEM_OK)
        return st;
    c.io = &io;
    float *b_owned = NULL, *w_owned = NULL;
    float *wt = malloc((size_t)(c.D * c.L) * sizeof *wt);
    int64_t items = (int64_t)io.n_seqs * c.n_cb;
    int32_t nth = cpu_threads_for(items * SC_CB * io.n_tok * c.L);
    c.scratch = malloc((size_t)nth * (size_t)(c.L - 1 + io.n_tok) * SC_CB * sizeof *c.scratch);
    const float *wf = NULL;
    if (!wt || !c.scratch) {
        st = LLMEM_E_NO_MEMORY;
        goto fail;
    }
    if ((st = cpu_param_f32(w, &wf, &w_owned)) != LLMEM_OK ||
        (st = cpu_param_f32(b, &c.b, &b_owned)) != LLMEM_OK)
        goto fail;
    for (int64_t ch = 0; ch < c.D; ch++)
        for (int64_t k = 0; k < c.L; k++)
            wt[k * c.D + ch] = wf[ch * c.L + k];
    c.wt = wt;
    llmem_tp_run(nth, items, 1, sc_run, &c);
fail:
    free(b_owned);
    free(w_owned);
    free(c.scratch);
    free(wt);
    cpu_rs_io_finish(&io);
    return st;
}

/* ---- Mamba-1 scan ------------------------------------------------------------------------ */

typedef struct s1_ctx {
    const rs_io *io;
    int64_t Din, N;
    const float *x, *dt, *b, *c, *A, *d, *dt_bias, *z; /* A = -exp(a_log) [Din, N] */
    float *y;
    float *scratch; /* per thread: S [N] */
} s1_ctx;

static void s1_store(const s1_ctx *c, const float *S, int64_t ch, int32_t slot)
{
    store_f32(S, c->io->dtype, c->N,
              cpu_rs_slot(c->io, slot) + (size_t)(ch * c->N) * llmem_dtype_size(c->io->dtype));
}

static void s1_run(void *vctx, int64_t it0, int64_t it1, int32_t thread)
{
    const s1_ctx *c = vctx;
    const rs_io *io = c->io;
    int64_t Din = c->Din, N = c->N;
    float *S = c->scratch + (size_t)thread * (size_t)N;
    size_t es = llmem_dtype_size(io->dtype);
    for (int64_t it = it0; it < it1; it++) {
        int64_t s = it / Din, ch = it % Din;
        const char *src = io->src_ptr[s];
        if (src)
            load_f32(src + (size_t)(ch * N) * es, io->dtype, N, S);
        else
            memset(S, 0, (size_t)N * sizeof *S);
        const float *A = c->A + ch * N;
        float D = c->d ? c->d[ch] : 0.0f, bias = c->dt_bias ? c->dt_bias[ch] : 0.0f;
        for (int32_t k = 0; k < io->n_ckpt; k++)
            if (cpu_rs_ckpt_token(io, k) == -1 && io->ckpt[s * io->n_ckpt + k] >= 0)
                s1_store(c, S, ch, io->ckpt[s * io->n_ckpt + k]);
        for (int32_t t = 0; t < io->n_tok; t++) {
            int64_t tok = s * io->n_tok + t;
            float v = c->dt[tok * Din + ch] + bias;
            float dtv = v > 20.0f ? v : log1pf(expf(v));
            float xv = c->x[tok * Din + ch], bx = dtv * xv;
            const float *B = c->b + tok * N, *C = c->c + tok * N;
            float acc = 0.0f;
            for (int64_t n = 0; n < N; n++) {
                S[n] = expf(dtv * A[n]) * S[n] + bx * B[n];
                acc += S[n] * C[n];
            }
            float yv = acc + D * xv;
            if (c->z) {
                float zv = c->z[tok * Din + ch];
                yv *= zv / (1.0f + expf(-zv));
            }
            c->y[tok * Din + ch] = yv;
            for (int32_t k = 0; k < io->n_ckpt; k++)
                if (cpu_rs_ckpt_token(io, k) == t && io->ckpt[s * io->n_ckpt + k] >= 0)
                    s1_store(c, S, ch, io->ckpt[s * io->n_ckpt + k]);
            if (cpu_rs_snap_slot(io, s) >= 0 && io->snap_tok[s] == t)
                s1_store(c, S, ch, cpu_rs_snap_slot(io, s));
        }
        if (io->dst[s] >= 0)
            s1_store(c, S, ch, io->dst[s]);
    }
}

static llmem_status cpu_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                                     const llmem_view *view, int32_t state, llmem_ct *x,
                                     llmem_ct *dt, llmem_ct *b, llmem_ct *c, llmem_ct *a_log,
                                     llmem_ct *d, llmem_ct *dt_bias, llmem_ct *z, llmem_ct *y)
{
    (void)be;
    s1_ctx k = {.Din = p->d_inner, .N = p->d_state, .x = tensor_data(x), .dt = tensor_data(dt),
                .b = tensor_data(b), .c = tensor_data(c), .z = z ? tensor_data(z) : NULL,
                .y = tensor_data(y)};
    rs_io io;
    llmem_status st = cpu_rs_io_init(&io, view, state);
    if (st != LLMEM_OK)
        return st;
    k.io = &io;
    float *own_a = NULL, *own_d = NULL, *own_b = NULL, *A = NULL;
    const float *a_f32 = NULL;
    int64_t items = (int64_t)io.n_seqs * k.Din;
    int32_t nth = cpu_threads_for(items * k.N * io.n_tok);
    k.scratch = malloc((size_t)nth * (size_t)k.N * sizeof *k.scratch);
    A = malloc((size_t)(k.Din * k.N) * sizeof *A);
    if (!k.scratch || !A) {
        st = LLMEM_E_NO_MEMORY;
        goto fail;
    }
    if ((st = cpu_param_f32(a_log, &a_f32, &own_a)) != LLMEM_OK ||
        (st = cpu_param_f32(d, &k.d, &own_d)) != LLMEM_OK ||
        (st = cpu_param_f32(dt_bias, &k.dt_bias, &own_b)) != LLMEM_OK)
        goto fail;
    for (int64_t i = 0; i < k.Din * k.N; i++) /* once per call, not per stream */
        A[i] = -expf(a_f32[i]);
    k.A = A;
    llmem_tp_run(nth, items, 16, s1_run, &k);
fail:
    free(A);
    free(own_a);
    free(own_d);
    free(own_b);
    free(k.scratch);
    cpu_rs_io_finish(&io);
    return st;
}

/* Registered in the cpu backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_SHORT_CONV, LLMEM_OP_SHORT_CONV_LAYOUT,
              llmem_op_short_conv_fn, cpu_op_short_conv);
LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_SSM_SCAN1, LLMEM_OP_SSM_SCAN1_LAYOUT, llmem_op_ssm_scan1_fn,
              cpu_op_ssm_scan1);

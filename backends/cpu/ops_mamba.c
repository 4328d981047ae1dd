/* llmem: CPU Mamba-2 ops: causal conv1d with conv state, and the selective
 * scan (recurrent form) with ssm state, both with state slots and
 * checkpoints from a recurrent view.
 *
 * Semantics follow HF transformers Mamba2Mixer.torch_forward (conv over
 * [xBC] then SiLU; dt + dt_bias, softplus, clamp to time_step_limit;
 * A = -exp(A_log); D skip; B/C shared by the heads of a group) applied
 * token by token, which is the recurrent form of Mamba-2's SSD (Dao & Gu,
 * "Transformers are SSMs", ICML 2024, Sec. 3).
 *
 * Slot discipline: a work item reads its part of the source slot into
 * local memory before writing any destination or checkpoint slot, so a
 * stream's own slots may alias. A source slot that another stream writes
 * (copy-on-write of a shared state) is snapshotted before the parallel
 * part starts.
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"
#include "llmem/view.h"

/* ---- slots -------------------------------------------------------------------------- */

void cpu_rs_io_finish(rs_io *io)
{
    free(io->src_ptr);
    free(io->src_copy);
}

/* Reads the view's tables (the device copies), re-checks them, and
 * resolves every stream's source. */
llmem_status cpu_rs_io_init(rs_io *io, const llmem_view *view, int32_t state)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    memset(io, 0, sizeof *io);
    io->base = llmem_buffer_host_ptr(rs->state[state]);
    io->dtype = d->dtype;
    io->elems = 1;
    for (int32_t i = 0; i < d->n_dims; i++)
        io->elems *= d->shape[i];
    io->slot_bytes = llmem_state_slot_bytes(d);
    io->scale_off = llmem_state_scale_offset(d);
    io->src = view_table(view, &rs->src_slot);
    io->dst = view_table(view, &rs->dst_slot);
    io->ckpt = view_table(view, &rs->ckpt_slot);
    io->n_seqs = rs->n_seqs;
    io->n_tok = rs->n_seq_tokens;
    io->n_ckpt = rs->n_ckpt;
    const llmem_rs_view *sn = llmem_rs_view_snap(view);
    if (sn) {
        io->snap_tok = view_table(view, &sn->snap_tok);
        io->snap_slot = view_table(view, &sn->snap_slot);
    }
    int32_t n_slots = rs->n_slots;

    /* writer[slot]: the stream writing it, -1 none */
    int32_t *writer = malloc((size_t)n_slots * sizeof *writer);
    io->src_ptr = calloc((size_t)(io->n_seqs > 0 ? io->n_seqs : 1), sizeof *io->src_ptr);
    if (!writer || !io->src_ptr) {
        free(writer);
        cpu_rs_io_finish(io);
        return LLMEM_E_NO_MEMORY;
    }
    for (int32_t i = 0; i < n_slots; i++)
        writer[i] = -1;
    llmem_status st = LLMEM_OK;
    for (int32_t s = 0; s < io->n_seqs && st == LLMEM_OK; s++) {
        for (int32_t c = -1; c < io->n_ckpt; c++) {
            int32_t slot = c < 0 ? io->dst[s] : io->ckpt[(int64_t)s * io->n_ckpt + c];
            if (slot < -1 || slot >= n_slots || (slot >= 0 && writer[slot] >= 0 &&
                                                 writer[slot] != s)) {
                st = LLMEM_E_INVALID;
                break;
            }
            if (slot >= 0)
                writer[slot] = s;
        }
        if (io->src[s] < -1 || io->src[s] >= n_slots)
            st = LLMEM_E_INVALID;
        int32_t sl = cpu_rs_snap_slot(io, s); /* no one else's, before the last token */
        if (sl >= 0 && (sl >= n_slots || writer[sl] >= 0 || io->snap_tok[s] < 0 ||
                        io->snap_tok[s] >= io->n_tok - 1))
            st = LLMEM_E_INVALID;
        else if (sl >= 0)
            writer[sl] = s;
    }
    int32_t n_copy = 0;
    for (int32_t s = 0; s < io->n_seqs && st == LLMEM_OK; s++)
        if (io->src[s] >= 0 && writer[io->src[s]] >= 0 && writer[io->src[s]] != s)
            n_copy++;
    if (st == LLMEM_OK && n_copy > 0) {
        io->src_copy = malloc((size_t)n_copy * io->slot_bytes);
        if (!io->src_copy)
            st = LLMEM_E_NO_MEMORY;
    }
    n_copy = 0;
    for (int32_t s = 0; s < io->n_seqs && st == LLMEM_OK; s++) {
        int32_t slot = io->src[s];
        if (slot < 0)
            continue;
        const char *p = io->base + (size_t)slot * io->slot_bytes;
        if (writer[slot] >= 0 && writer[slot] != s) {
            char *copy = io->src_copy + (size_t)n_copy++ * io->slot_bytes;
            memcpy(copy, p, io->slot_bytes);
            p = copy;
        }
        io->src_ptr[s] = p;
    }
    free(writer);
    if (st != LLMEM_OK)
        cpu_rs_io_finish(io);
    return st;
}

/* ---- conv ---------------------------------------------------------------------------- */

#define CB 64 /* channels per work item */

typedef struct conv_ctx {
    const rs_io *io;
    const float *x;
    float *out;
    const float *wt; /* [d_conv][conv_dim] transposed weights */
    const float *b;  /* [conv_dim] or NULL */
    int64_t conv_dim, d_conv, n_cb;
    float *scratch;  /* per thread: state [d_conv - 1][CB] + acc [CB] */
} conv_ctx;

/* Row e of the stream's input u = [state rows; x rows], channels c0.. */
static const float *conv_u(const conv_ctx *c, const float *st, int64_t s, int64_t e, int64_t c0)
{
    int64_t dc1 = c->d_conv - 1;
    if (e < dc1)
        return st + e * CB;
    return c->x + ((s * c->io->n_tok) + (e - dc1)) * c->conv_dim + c0;
}

/* Stores the state after token tt (rows u[tt + 1 .. tt + d_conv - 1]). */
static void conv_store(const conv_ctx *c, const float *st, int64_t s, int64_t c0, int64_t nc,
                       int32_t tt, int32_t slot)
{
    size_t es = llmem_dtype_size(c->io->dtype);
    char *dst = cpu_rs_slot(c->io, slot);
    for (int64_t r = 0; r < c->d_conv - 1; r++)
        store_f32(conv_u(c, st, s, tt + 1 + r, c0), c->io->dtype, nc,
                  dst + ((size_t)r * (size_t)c->conv_dim + (size_t)c0) * es);
}

static void conv_run(void *vctx, int64_t it0, int64_t it1, int32_t thread)
{
    const conv_ctx *c = vctx;
    const rs_io *io = c->io;
    int64_t dc1 = c->d_conv - 1;
    size_t es = llmem_dtype_size(io->dtype);
    float *st = c->scratch + (size_t)thread * (size_t)(dc1 + 1) * CB;
    float *acc = st + dc1 * CB;
    for (int64_t it = it0; it < it1; it++) {
        int64_t s = it / c->n_cb, c0 = (it % c->n_cb) * CB;
        int64_t nc = c->conv_dim - c0 < CB ? c->conv_dim - c0 : CB;
        const char *src = io->src_ptr[s];
        for (int64_t r = 0; r < dc1; r++) {
            if (src)
                load_f32(src + ((size_t)r * (size_t)c->conv_dim + (size_t)c0) * es, io->dtype,
                         nc, st + r * CB);
            else
                memset(st + r * CB, 0, (size_t)nc * sizeof *st);
        }
        for (int32_t t = 0; t < io->n_tok; t++) {
            for (int64_t j = 0; j < nc; j++)
                acc[j] = c->b ? c->b[c0 + j] : 0.0f;
            for (int64_t k = 0; k < c->d_conv; k++) {
                const float *u = conv_u(c, st, s, t + k, c0);
                fma_f32(acc, c->wt + k * c->conv_dim + c0, u, nc);
            }
            float *o = c->out + (s * io->n_tok + t) * c->conv_dim + c0;
            for (int64_t j = 0; j < nc; j++)
                o[j] = acc[j] / (1.0f + expf(-acc[j]));
        }
        for (int32_t k = 0; k < io->n_ckpt; k++) {
            int32_t slot = io->ckpt[s * io->n_ckpt + k];
            if (slot >= 0)
                conv_store(c, st, s, c0, nc, cpu_rs_ckpt_token(io, k), slot);
        }
        if (cpu_rs_snap_slot(io, s) >= 0)
            conv_store(c, st, s, c0, nc, io->snap_tok[s], cpu_rs_snap_slot(io, s));
        if (io->dst[s] >= 0)
            conv_store(c, st, s, c0, nc, io->n_tok - 1, io->dst[s]);
    }
}

llmem_status cpu_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                             llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    const llmem_state_desc *d = &llmem_view_rs(view)->desc[state];
    conv_ctx c = {
        .x = tensor_data(x),
        .out = tensor_data(out),
        .conv_dim = d->shape[1],
        .d_conv = d->shape[0] + 1,
    };
    c.n_cb = (c.conv_dim + CB - 1) / CB;
    rs_io io;
    llmem_status st = cpu_rs_io_init(&io, view, state);
    if (st != LLMEM_OK)
        return st;
    c.io = &io;
    float *b_owned = NULL;
    float *wt = malloc((size_t)(c.conv_dim * c.d_conv) * sizeof *wt);
    float *wrow = malloc((size_t)c.d_conv * sizeof *wrow);
    int64_t items = (int64_t)io.n_seqs * c.n_cb;
    int32_t nth = cpu_threads_for(items * CB * io.n_tok * c.d_conv);
    c.scratch = malloc((size_t)nth * (size_t)c.d_conv * CB * sizeof *c.scratch);
    if (!wt || !wrow || !c.scratch) {
        st = LLMEM_E_NO_MEMORY;
        goto fail;
    }
    {
        const char *wd = tensor_data(w);
        size_t wes = llmem_dtype_size(w->dtype);
        for (int64_t ch = 0; ch < c.conv_dim; ch++) {
            load_f32(wd + (size_t)(ch * c.d_conv) * wes, w->dtype, c.d_conv, wrow);
            for (int64_t k = 0; k < c.d_conv; k++)
                wt[k * c.conv_dim + ch] = wrow[k];
        }
    }
    c.wt = wt;
    if ((st = cpu_param_f32(b, &c.b, &b_owned)) != LLMEM_OK)
        goto fail;
    llmem_tp_run(nth, items, 1, conv_run, &c);
fail:
    free(b_owned);
    free(c.scratch);
    free(wrow);
    free(wt);
    cpu_rs_io_finish(&io);
    return st;
}

/* ---- scan ----------------------------------------------------------------------------- */

typedef struct scan_ctx {
    const rs_io *io;
    const llmem_ssm_params *p;
    const float *xbc, *dt, *a_log, *d, *dt_bias;
    float *y;
    int64_t conv_dim;
    float *scratch; /* per thread: S [P][N] */
} scan_ctx;

static void scan_store(const scan_ctx *c, const float *S, int64_t h, int32_t slot)
{
    int64_t hs = (int64_t)c->p->head_dim * c->p->d_state;
    char *base = cpu_rs_slot(c->io, slot);
    if (c->io->dtype == LLMEM_DTYPE_I8) { /* per-head scale: amax / 127 */
        float amax = 0.0f;
        for (int64_t i = 0; i < hs; i++)
            amax = fabsf(S[i]) > amax ? fabsf(S[i]) : amax;
        float scale = amax / 127.0f;
        int8_t *q = (int8_t *)base + h * hs;
        for (int64_t i = 0; i < hs; i++)
            q[i] = llmem_f32_to_i8(S[i], scale);
        memcpy(base + c->io->scale_off + (size_t)h * sizeof scale, &scale, sizeof scale);
        return;
    }
    store_f32(S, c->io->dtype, hs, base + (size_t)(h * hs) * llmem_dtype_size(c->io->dtype));
}

static void scan_run(void *vctx, int64_t it0, int64_t it1, int32_t thread)
{
    const scan_ctx *c = vctx;
    const rs_io *io = c->io;
    int64_t H = c->p->n_heads, P = c->p->head_dim, N = c->p->d_state, G = c->p->n_groups;
    int64_t hs = P * N;
    float *S = c->scratch + (size_t)thread * (size_t)hs;
    for (int64_t it = it0; it < it1; it++) {
        int64_t s = it / H, h = it % H, g = h / (H / G);
        const char *src = io->src_ptr[s];
        if (src && io->dtype == LLMEM_DTYPE_I8) {
            float scale;
            memcpy(&scale, src + io->scale_off + (size_t)h * sizeof scale, sizeof scale);
            load_scaled(src + h * hs, io->dtype, hs, scale, S);
        } else if (src)
            load_f32(src + (size_t)(h * hs) * llmem_dtype_size(io->dtype), io->dtype, hs, S);
        else
            memset(S, 0, (size_t)hs * sizeof *S);
        float A = -expf(c->a_log[h]);
        float D = c->d ? c->d[h] : 0.0f;
        float bias = c->dt_bias ? c->dt_bias[h] : 0.0f;
        for (int32_t k = 0; k < io->n_ckpt; k++)
            if (cpu_rs_ckpt_token(io, k) == -1 && io->ckpt[s * io->n_ckpt + k] >= 0)
                scan_store(c, S, h, io->ckpt[s * io->n_ckpt + k]);
        for (int32_t t = 0; t < io->n_tok; t++) {
            int64_t tok = s * io->n_tok + t;
            const float *row = c->xbc + tok * c->conv_dim;
            const float *x = row + h * P;
            const float *B = row + H * P + g * N;
            const float *C = row + H * P + G * N + g * N;
            float v = c->dt[tok * H + h] + bias;
            float dtv = v > 20.0f ? v : log1pf(expf(v));
            dtv = dtv < c->p->dt_min ? c->p->dt_min : dtv;
            dtv = dtv > c->p->dt_max ? c->p->dt_max : dtv;
            float dA = expf(dtv * A);
            float *y = c->y + tok * H * P + h * P;
            for (int64_t pp = 0; pp < P; pp++) {
                float *Sp = S + pp * N;
                decay_add_f32(Sp, B, dA, x[pp] * dtv, N);
                y[pp] = dot_f32(Sp, C, N) + D * x[pp];
            }
            for (int32_t k = 0; k < io->n_ckpt; k++)
                if (cpu_rs_ckpt_token(io, k) == t && io->ckpt[s * io->n_ckpt + k] >= 0)
                    scan_store(c, S, h, io->ckpt[s * io->n_ckpt + k]);
            if (cpu_rs_snap_slot(io, s) >= 0 && io->snap_tok[s] == t)
                scan_store(c, S, h, cpu_rs_snap_slot(io, s));
        }
        if (io->dst[s] >= 0)
            scan_store(c, S, h, io->dst[s]);
    }
}

llmem_status cpu_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p,
                             const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                             llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y)
{
    scan_ctx c = {
        .p = p,
        .xbc = tensor_data(xbc),
        .dt = tensor_data(dt),
        .y = tensor_data(y),
        /* the row length is H*P + 2*G*N whatever way xbc's dims are split */
        .conv_dim = (int64_t)p->n_heads * p->head_dim + 2 * (int64_t)p->n_groups * p->d_state,
    };
    rs_io io;
    llmem_status st = cpu_rs_io_init(&io, view, state);
    if (st != LLMEM_OK)
        return st;
    c.io = &io;
    float *own_a = NULL, *own_d = NULL, *own_b = NULL;
    int64_t items = (int64_t)io.n_seqs * p->n_heads;
    int64_t hs = (int64_t)p->head_dim * p->d_state;
    int32_t nth = cpu_threads_for(items * hs * io.n_tok);
    c.scratch = malloc((size_t)nth * (size_t)hs * sizeof *c.scratch);
    if (!c.scratch) {
        st = LLMEM_E_NO_MEMORY;
        goto fail;
    }
    if ((st = cpu_param_f32(a_log, &c.a_log, &own_a)) != LLMEM_OK ||
        (st = cpu_param_f32(d, &c.d, &own_d)) != LLMEM_OK ||
        (st = cpu_param_f32(dt_bias, &c.dt_bias, &own_b)) != LLMEM_OK)
        goto fail;
    llmem_tp_run(nth, items, 1, scan_run, &c);
fail:
    free(own_a);
    free(own_d);
    free(own_b);
    free(c.scratch);
    cpu_rs_io_finish(&io);
    return st;
}

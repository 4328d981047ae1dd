/* llmem models/: the decode entry points over the forward pass of
 * forward.c: planning a batch into ubatches, running each, and what is
 * done with its output rows (logits or log-probabilities downloaded in
 * one transfer per ubatch, or tokens sampled on the device). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "models/model_internal.h"

/* Uploads the ubatch's token ids, positions and output rows (to stable
 * scratch offsets, before any recorded step), then runs the ops. */
static llmem_status forward(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab)
{
    if (m->tp) /* every rank on its thread (models/tp.c) */
        return hf_tp_forward(m, ub, n_vocab);
    int32_t T = ub->n_tokens;
    TRY(llmem_buffer_upload(m->scratch, m->off_tok, ub->token, (size_t)T * 4));
    TRY(llmem_buffer_upload(m->scratch, m->off_pos, ub->pos, (size_t)T * 4));
    if (ub->n_outputs > 0)
        TRY(llmem_buffer_upload(m->scratch, m->off_rows, ub->out_rows, (size_t)ub->n_outputs * 4));
    return hf_graph_forward(m, ub, n_vocab);
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
    llmem_tensor logits = llmem_tensor_2d(m->scratch, m->off_logits, LLMEM_DTYPE_F32, n_out, V);
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

/* One piece of a download: size bytes at byte off of the buffer into dst
 * (size 0: not wanted). */
typedef struct dl_part {
    size_t off, size;
    void *dst;
} dl_part;

/* Downloads the wanted parts of buf. Parts that lie close together (the
 * sampled ids, their log-probabilities and the top alternatives sit side
 * by side in the scratch layout of models/runtime.c) come down as one
 * span, since each download is a submit and a wait on a device backend:
 * the ids and log-probs of a step in two downloads cost llmem generate
 * ~1 ms a token on Vulkan. Parts far apart, or a span whose staging copy
 * cannot be allocated, are downloaded one by one. Returns LLMEM_OK or the
 * download's error (LLMEM_E_BACKEND, LLMEM_E_INVALID). */
static llmem_status download_parts(llmem_buffer *buf, const dl_part *part, int n)
{
    size_t lo = SIZE_MAX, hi = 0, sum = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        if (part[i].size == 0)
            continue;
        lo = part[i].off < lo ? part[i].off : lo;
        hi = part[i].off + part[i].size > hi ? part[i].off + part[i].size : hi;
        sum += part[i].size;
        used++;
    }
    unsigned char *span = used > 1 && hi - lo <= sum + ((size_t)256 << 10) ? malloc(hi - lo) : NULL;
    if (span) {
        llmem_status st = llmem_buffer_download(buf, lo, span, hi - lo);
        for (int i = 0; st == LLMEM_OK && i < n; i++)
            if (part[i].size)
                memcpy(part[i].dst, span + (part[i].off - lo), part[i].size);
        free(span);
        return st;
    }
    for (int i = 0; i < n; i++)
        if (part[i].size)
            TRY(llmem_buffer_download(buf, part[i].off, part[i].dst, part[i].size));
    return LLMEM_OK;
}

static llmem_status emit_sampled(llmem_model *m, const llmem_ubatch *ub, const int32_t *row,
                                 void *vctx)
{
    const llmem_model_sampling *s = vctx;
    int32_t n_out = ub->n_outputs, V = m->cfg.vocab_size;
    size_t k = s->n_top > 0 ? (size_t)s->n_top : 0;
    int32_t *ctr = malloc((size_t)n_out * 2 * sizeof *ctr);
    float *f = malloc((size_t)n_out * (1 + 2 * k) * sizeof *f); /* lp, top ids, top lp */
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
    float *lp = f, *top_lp = f + (size_t)n_out * (1 + k);
    int32_t *top_ids = (int32_t *)(void *)(f + n_out);
    size_t rows4 = (size_t)n_out * 4;
    dl_part part[4] = {{p.off_ids, s->force_ids ? 0 : rows4, ids},
                       {p.off_lp, s->logprob ? rows4 : 0, lp},
                       {p.off_top_ids, rows4 * k, top_ids},
                       {p.off_top_lp, rows4 * k, top_lp}};
    if (st == LLMEM_OK)
        st = download_parts(p.buf, part, 4);
    for (int32_t o = 0; st == LLMEM_OK && o < n_out; o++) {
        size_t r = (size_t)row[ub->out_ids[o]];
        s->ids[r] = ids[o];
        if (s->logprob)
            s->logprob[r] = lp[o];
        if (k) {
            memcpy(s->top_ids + r * k, top_ids + (size_t)o * k, k * 4);
            memcpy(s->top_logprob + r * k, top_lp + (size_t)o * k, k * 4);
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


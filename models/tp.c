/* llmem models/: tensor parallelism (issue 19), Megatron-LM style
 * (Shoeybi et al. 2019, "Megatron-LM", sec. 3): the residual stream is
 * replicated on every rank; each block's first projection is split by
 * output columns (heads, FFN columns) and its last by input rows, whose
 * partial outputs one all-reduce sums.
 *   attention  q, k, v by heads (KV heads replicated when fewer than
 *              ranks: rank r keeps KV head r * Hk / N), o_proj by rows;
 *   FFN / MLP  gate and up by columns, down by rows;
 *   Mamba-2    heads split: in_proj's z, x and dt slices by head, B and C
 *              by group (groups replicated when fewer than ranks), the
 *              conv1d channels of x, B, C, A_log / D / dt_bias by head,
 *              out_proj by rows. The gated RMS norm (transformers'
 *              MambaRMSNormGated; groups of ssm_norm_group_size) runs per
 *              rank when its groups split evenly, else on y and z
 *              gathered from every rank (mamba2 and bamba: one group);
 *   MoE        by tensor: every rank routes every token (router
 *              replicated) through its columns of each expert's and the
 *              shared MLP's up (gate and up) and rows of their down, then
 *              the all-reduce;
 *   LM head    by vocabulary rows, the logits gathered on every rank
 *              (llmem_comm_all_gather_rows; the sampling then runs on
 *              rank 0).
 * Biases of row-parallel layers live on rank 0 only (added once).
 * Each rank is a model of its own (its shard of the weights, its memory
 * holding its KV and state heads, its scratch) on its own backend and
 * thread; the leader composes the ranks' memories (llmem_hybrid_create_ranks)
 * so one plan per batch is computed once and applied on every rank.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/comm.h"
#include "llmem/hybrid.h"
#include "models/model_internal.h"

typedef struct hf_tp {
    int32_t n;
    llmem_model *rank[LLMEM_COMM_MAX_RANKS];
    llmem_backend *be[LLMEM_COMM_MAX_RANKS]; /* be[0] is the leader's (not owned) */
    llmem_comm *comm[LLMEM_COMM_MAX_RANKS];
    bool cpu_comm; /* the in-process communicator: every step ends in a barrier */
    bool graphs;   /* ranks run decode steps through recordings (hf_graph_forward) */
    pthread_t th[LLMEM_COMM_MAX_RANKS];
    int32_t n_threads; /* started workers (ranks 1..n_threads) */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    bool sync_init;
    uint64_t gen;
    int32_t pending;
    bool quit;
    const llmem_ubatch *ub;
    int32_t n_vocab;
    llmem_status st[LLMEM_COMM_MAX_RANKS];
} hf_tp;

/* ---- the split ------------------------------------------------------------------ */

static bool splits(int32_t dim, int32_t n)
{
    return dim > 0 && dim % n == 0;
}

/* Whether the config splits over n ranks; fills the rank config c (every
 * rank's shapes are equal). */
static llmem_status shard_config(const llmem_model_config *f, int32_t n, llmem_model_config *c,
                                 bool *norm_full, char *err, size_t err_len)
{
    const char *why = NULL;
    int32_t dim = 0;
    bool granite = f->arch == LLMEM_ARCH_GRANITEMOEHYBRID;
    if (f->arch != LLMEM_ARCH_LLAMA && f->arch != LLMEM_ARCH_MAMBA2 &&
        f->arch != LLMEM_ARCH_BAMBA && f->arch != LLMEM_ARCH_NEMOTRON_H && !granite) {
        llmem_errf(err, err_len, "tensor parallelism: %s models are not split yet (llama, mamba2, "
                                 "bamba, nemotron_h, granitemoehybrid are)",
                   llmem_arch_name(f->arch));
        return LLMEM_E_UNSUPPORTED;
    }
    bool attn = false, mamba = false, ffn = false, moe = false;
    for (int32_t il = 0; il < f->n_layers; il++) {
        llmem_layer_kind k = f->layers[il].kind;
        if (k != LLMEM_LAYER_ATTENTION && k != LLMEM_LAYER_MAMBA2 && k != LLMEM_LAYER_MLP &&
            k != LLMEM_LAYER_MOE) {
            llmem_errf(err, err_len, "tensor parallelism: layer %d is a %s layer, which is not "
                                     "split yet", il, llmem_layer_kind_name(k));
            return LLMEM_E_UNSUPPORTED;
        }
        attn |= k == LLMEM_LAYER_ATTENTION;
        mamba |= k == LLMEM_LAYER_MAMBA2;
        /* granite's FFN is its MoE / shared MLP (models/moe.c) */
        ffn |= !granite && (k == LLMEM_LAYER_MLP || f->layers[il].has_ffn);
        moe |= k == LLMEM_LAYER_MOE || (granite && f->layers[il].has_ffn);
    }
    int32_t ie = f->n_expert > 0 ? f->moe_intermediate_size : 0,
            is = f->moe_shared_intermediate_size;
    int32_t hk = f->n_kv_heads, g = f->ssm_n_groups;
    if (attn && !splits(f->n_heads, n))
        why = "attention heads (num_attention_heads)", dim = f->n_heads;
    else if (attn && !splits(hk, n) && !(hk > 0 && n % hk == 0))
        why = "KV heads (num_key_value_heads), nor is it a multiple of them", dim = hk;
    else if (ffn && !splits(f->intermediate_size, n))
        why = "FFN width (intermediate_size)", dim = f->intermediate_size;
    else if (moe && ie > 0 && !splits(ie, n))
        why = "experts' width (moe_intermediate_size)", dim = ie;
    else if (moe && is > 0 && !splits(is, n))
        why = "shared expert's width (shared_intermediate_size)", dim = is;
    else if (mamba && !splits(f->ssm_n_heads, n))
        why = "Mamba-2 heads (mamba_n_heads / n_heads)", dim = f->ssm_n_heads;
    else if (mamba && !splits(g, n) && !(g > 0 && n % g == 0))
        why = "Mamba-2 groups (n_groups), nor is it a multiple of them", dim = g;
    if (why) {
        llmem_errf(err, err_len, "--tp %d does not divide the %s: %d", n, why, dim);
        return LLMEM_E_INVALID;
    }
    *c = *f;
    if (attn) {
        c->n_heads = f->n_heads / n;
        c->n_kv_heads = hk >= n ? hk / n : 1;
    }
    if (ffn)
        c->intermediate_size = f->intermediate_size / n;
    if (moe) { /* by tensor: each expert's and the shared MLP's columns split */
        c->moe_intermediate_size = ie / n;
        c->moe_shared_intermediate_size = is / n;
    }
    *norm_full = false;
    if (mamba) {
        c->ssm_n_heads = f->ssm_n_heads / n;
        c->ssm_d_inner = f->ssm_d_inner / n;
        c->ssm_n_groups = g >= n ? g / n : 1;
        c->ssm_conv_dim = c->ssm_d_inner + 2 * c->ssm_n_groups * f->ssm_d_state;
        c->ssm_in_proj_dim = c->ssm_d_inner + c->ssm_conv_dim + c->ssm_n_heads;
        int32_t gs = f->ssm_norm_group_size > 0 ? f->ssm_norm_group_size : f->ssm_d_inner;
        *norm_full = (f->ssm_d_inner / gs) % n != 0; /* a norm group spans ranks */
    }
    return LLMEM_OK;
}

/* ---- weight slices ------------------------------------------------------------ */

typedef struct seg {
    int64_t start, len; /* rows (dim 0), or columns (dim 1) when cols */
} seg;

/* Copies the segments of info's rows (or, cols, of every row's columns)
 * into a new host buffer and points info at it. A row is the last
 * dimension (a 1-D tensor: one element); conv1d's [C, 1, K] rows are K
 * wide. In rows mode a 3-D [E, R, C] tensor (packed experts) keeps E:
 * the segments then select total / E rows of each expert. */
static llmem_status take_slice(llmem_tensor_info *info, const seg *sg, int32_t n_seg, bool cols,
                               void **shard)
{
    size_t es = llmem_dtype_size(info->dtype);
    int32_t nd = info->n_dims;
    int64_t row_el = nd <= 1 ? 1 : info->shape[nd - 1];
    int64_t rows = row_el > 0 ? info->n_elements / row_el : 0;
    int64_t total = 0;
    for (int32_t i = 0; i < n_seg; i++) {
        int64_t lim = cols ? row_el : rows;
        if (sg[i].start < 0 || sg[i].len < 0 || sg[i].start + sg[i].len > lim || nd < 1)
            return LLMEM_E_CORRUPT;
        total += sg[i].len;
    }
    size_t bytes = (size_t)(cols ? total * rows : total * row_el) * es;
    uint8_t *out = malloc(bytes ? bytes : 1), *o = out;
    const uint8_t *src = info->data;
    if (!out)
        return LLMEM_E_NO_MEMORY;
    if (cols) {
        for (int64_t r = 0; r < rows; r++)
            for (int32_t i = 0; i < n_seg; i++) {
                size_t nb = (size_t)sg[i].len * es;
                memcpy(o, src + ((size_t)r * (size_t)row_el + (size_t)sg[i].start) * es, nb);
                o += nb;
            }
        info->shape[nd - 1] = total;
    } else {
        for (int32_t i = 0; i < n_seg; i++) {
            size_t nb = (size_t)(sg[i].len * row_el) * es;
            memcpy(o, src + (size_t)(sg[i].start * row_el) * es, nb);
            o += nb;
        }
        if (nd == 3 && info->shape[1] != 1)
            info->shape[1] = total / info->shape[0];
        else
            info->shape[0] = total;
    }
    info->n_elements = cols ? total * rows : total * row_el;
    info->n_bytes = bytes;
    info->data = out;
    *shard = out;
    return LLMEM_OK;
}

/* Segments of the gated (gate then up, parts 2) or plain (parts 1) rows
 * of width i each, for n_blocks blocks (experts) of parts * i rows:
 * rank r's i_r rows of each part. sg holds n_blocks * parts entries. */
static int32_t part_segs(seg *sg, int64_t n_blocks, int64_t parts, int64_t i, int64_t i_r,
                         int32_t r)
{
    int32_t ns = 0;
    for (int64_t e = 0; e < n_blocks; e++)
        for (int64_t p = 0; p < parts; p++)
            sg[ns++] = (seg){(e * parts + p) * i + (int64_t)r * i_r, i_r};
    return ns;
}

llmem_status hf_tp_shard(const llmem_model *m, llmem_weight w, llmem_tensor_info *info,
                         void **shard, bool *skip, char *err, size_t err_len)
{
    const llmem_model_config *f = m->tp_full, *c = &m->cfg;
    int32_t r = m->tp_rank, n = m->tp_size;
    *shard = NULL;
    *skip = false;
    seg sg[5];
    int32_t ns = 0;
    bool cols = false;
    int64_t dh = f->head_dim, ds = f->ssm_d_state, din = f->ssm_d_inner, dr = c->ssm_d_inner;
    int64_t g = f->ssm_n_groups, g0 = (int64_t)r * g / n, gr = c->ssm_n_groups;
    int64_t nhr = c->ssm_n_heads, kh0 = (int64_t)r * f->n_kv_heads / n;
    switch (w) {
    case LLMEM_W_EMBED:
    case LLMEM_W_FINAL_NORM:
    case LLMEM_W_MIXER_NORM:
    case LLMEM_W_FFN_NORM:
        return LLMEM_OK; /* replicated */
    case LLMEM_W_LM_HEAD:
        if (m->tp_vocab == f->vocab_size)
            return LLMEM_OK;
        sg[ns++] = (seg){(int64_t)r * m->tp_vocab, m->tp_vocab};
        break;
    case LLMEM_W_ATTN_Q:
    case LLMEM_W_ATTN_Q_BIAS:
        sg[ns++] = (seg){(int64_t)r * c->n_heads * dh, c->n_heads * dh};
        break;
    case LLMEM_W_ATTN_K:
    case LLMEM_W_ATTN_V:
    case LLMEM_W_ATTN_K_BIAS:
    case LLMEM_W_ATTN_V_BIAS:
        sg[ns++] = (seg){kh0 * dh, c->n_kv_heads * dh};
        break;
    case LLMEM_W_ATTN_O:
        sg[ns++] = (seg){(int64_t)r * c->n_heads * dh, c->n_heads * dh};
        cols = true;
        break;
    case LLMEM_W_FFN_GATE:
    case LLMEM_W_FFN_UP:
    case LLMEM_W_FFN_GATE_BIAS:
    case LLMEM_W_FFN_UP_BIAS:
        sg[ns++] = (seg){(int64_t)r * c->intermediate_size, c->intermediate_size};
        break;
    case LLMEM_W_FFN_DOWN:
        sg[ns++] = (seg){(int64_t)r * c->intermediate_size, c->intermediate_size};
        cols = true;
        break;
    case LLMEM_W_ATTN_O_BIAS:
    case LLMEM_W_FFN_DOWN_BIAS:
    case LLMEM_W_SSM_OUT_BIAS:
        *skip = r > 0; /* added once, after the all-reduce sums the ranks' parts */
        return LLMEM_OK;
    case LLMEM_W_SSM_IN: /* [z | x | B | C | dt] */
    case LLMEM_W_SSM_IN_BIAS:
        sg[ns++] = (seg){r * dr, dr};
        sg[ns++] = (seg){din + r * dr, dr};
        sg[ns++] = (seg){2 * din + g0 * ds, gr * ds};
        sg[ns++] = (seg){2 * din + g * ds + g0 * ds, gr * ds};
        sg[ns++] = (seg){2 * din + 2 * g * ds + r * nhr, nhr};
        break;
    case LLMEM_W_SSM_CONV: /* channels [x | B | C] */
    case LLMEM_W_SSM_CONV_BIAS:
        sg[ns++] = (seg){r * dr, dr};
        sg[ns++] = (seg){din + g0 * ds, gr * ds};
        sg[ns++] = (seg){din + g * ds + g0 * ds, gr * ds};
        break;
    case LLMEM_W_SSM_DT_BIAS:
    case LLMEM_W_SSM_A_LOG:
    case LLMEM_W_SSM_D:
        sg[ns++] = (seg){r * nhr, nhr};
        break;
    case LLMEM_W_SSM_NORM:
        if (m->tp_norm_full)
            return LLMEM_OK; /* the norm runs on the gathered rows */
        sg[ns++] = (seg){r * dr, dr};
        break;
    case LLMEM_W_SSM_OUT:
        sg[ns++] = (seg){r * dr, dr};
        cols = true;
        break;
    case LLMEM_W_MOE_ROUTER:
    case LLMEM_W_MOE_ROUTER_BIAS:
        return LLMEM_OK; /* every rank routes every token alike */
    case LLMEM_W_MOE_UP:   /* [E, I or 2I, H], or one expert's [I, H] (split experts) */
    case LLMEM_W_SHARED_UP: { /* [Is or 2Is, H] */
        bool shared = w == LLMEM_W_SHARED_UP;
        int64_t i = shared ? f->moe_shared_intermediate_size : f->moe_intermediate_size;
        int64_t i_r = shared ? c->moe_shared_intermediate_size : c->moe_intermediate_size;
        int64_t blocks = info->n_dims == 3 ? info->shape[0] : 1;
        int64_t parts = i > 0 ? (info->n_dims == 3 ? info->shape[1] : info->shape[0]) / i : 0;
        if (parts < 1 || parts > 2 || blocks < 1)
            break; /* take_slice refuses the empty split below */
        seg *many = malloc((size_t)(blocks * parts) * sizeof *many);
        if (!many) {
            llmem_errf(err, err_len, "tensor parallelism: no memory to slice '%s'", info->name);
            return LLMEM_E_NO_MEMORY;
        }
        int32_t nm = part_segs(many, blocks, parts, i, i_r, r);
        llmem_status st = take_slice(info, many, nm, false, shard);
        free(many);
        if (st != LLMEM_OK)
            llmem_errf(err, err_len, "tensor parallelism: cannot slice '%s': %s", info->name,
                       llmem_status_str(st));
        return st;
    }
    case LLMEM_W_MOE_DOWN:    /* [E, H, I] or [H, I]: rows of each expert's input */
    case LLMEM_W_SHARED_DOWN: { /* [H, Is] */
        int64_t i_r = w == LLMEM_W_SHARED_DOWN ? c->moe_shared_intermediate_size
                                                : c->moe_intermediate_size;
        sg[ns++] = (seg){(int64_t)r * i_r, i_r};
        cols = true;
        break;
    }
    default:
        llmem_errf(err, err_len, "tensor parallelism: no split rule for '%s'", info->name);
        return LLMEM_E_UNSUPPORTED;
    }
    llmem_status st = ns > 0 ? take_slice(info, sg, ns, cols, shard) : LLMEM_E_CORRUPT;
    if (st == LLMEM_E_CORRUPT) {
        llmem_errf(err, err_len, "tensor parallelism: '%s' is smaller than its split needs",
                   info->name);
        return LLMEM_E_CORRUPT;
    }
    if (st != LLMEM_OK)
        llmem_errf(err, err_len, "tensor parallelism: no memory to slice '%s'", info->name);
    return st;
}

llmem_status hf_tp_slice(const void *ctx, llmem_weight w, llmem_tensor_info *ti, void **shard,
                         char *err, size_t err_len)
{
    bool skip = false;
    return hf_tp_shard(ctx, w, ti, shard, &skip, err, err_len);
}

llmem_status hf_tp_lm_head(llmem_model *m, char *err, size_t err_len)
{
    if (m->tp_vocab == m->tp_full->vocab_size || m->lm_head.t.buf != m->embed.t.buf)
        return LLMEM_OK; /* replicated, or sliced at load (an untied LM head) */
    const llmem_tensor *e = &m->embed.t;
    size_t row = (size_t)e->ne[1] * llmem_dtype_size(e->dtype);
    size_t bytes = row * (size_t)m->tp_vocab;
    llmem_buffer *buf = NULL;
    llmem_status st = llmem_buffer_alloc(m->be, round_up(bytes), &buf);
    if (st == LLMEM_OK)
        st = llmem_buffer_copy(buf, 0, e->buf, e->offset + row * (size_t)m->tp_rank *
                                                              (size_t)m->tp_vocab, bytes);
    if (st != LLMEM_OK) {
        llmem_buffer_free(buf);
        llmem_errf(err, err_len, "cannot copy the LM head's vocabulary shard: %s",
                   llmem_status_str(st));
        return st;
    }
    m->weights[m->n_weights++] = buf;
    m->lm_head.t = *e;
    m->lm_head.t.buf = buf;
    m->lm_head.t.offset = 0;
    m->lm_head.t.ne[0] = m->tp_vocab;
    return LLMEM_OK;
}

/* ---- collectives inside the forward pass -------------------------------------- */

llmem_status hf_tp_all_reduce(llmem_model *m, size_t off, int32_t T)
{
    if (!m->comm)
        return LLMEM_OK;
    return llmem_comm_all_reduce(m->comm, m->scratch, off, (int64_t)T * m->cfg.hidden_size,
                                 LLMEM_DTYPE_F32);
}

llmem_status hf_tp_gather_cols(llmem_model *m, size_t src_off, size_t dst_off, int32_t T,
                               int32_t w)
{
    return llmem_comm_all_gather_rows(m->comm, m->scratch, src_off, m->scratch, dst_off, T,
                                      (size_t)w * 4);
}

/* ---- rank threads ---------------------------------------------------------------- */

/* Rank r's part of a step. With the in-process communicator every rank
 * ends with a barrier, repeated while it fails: a rank whose op failed
 * stops calling collectives, so the others, waiting in one, see its
 * barrier as a mismatch and fail too, then all meet in the barrier — no
 * rank is left waiting. NCCL cannot exchange that verdict, so there a rank
 * whose step failed aborts the group (llmem_comm_abort): the others return
 * LLMEM_E_BACKEND from the collective they wait in instead of waiting for
 * ever, and the model's later steps fail with it too. */
static void rank_step(hf_tp *tp, int32_t r)
{
    llmem_model *rm = tp->rank[r];
    const llmem_ubatch *ub = tp->ub;
    int32_t T = ub->n_tokens;
    llmem_status st = llmem_buffer_upload(rm->scratch, rm->off_tok, ub->token, (size_t)T * 4);
    if (st == LLMEM_OK)
        st = llmem_buffer_upload(rm->scratch, rm->off_pos, ub->pos, (size_t)T * 4);
    if (st == LLMEM_OK && ub->n_outputs > 0)
        st = llmem_buffer_upload(rm->scratch, rm->off_rows, ub->out_rows,
                                 (size_t)ub->n_outputs * 4);
    if (st == LLMEM_OK)
        st = tp->graphs ? hf_graph_forward(rm, ub, tp->n_vocab)
                        : hf_forward_ops(rm, T, ub->n_outputs, tp->n_vocab);
    for (int32_t k = 0; tp->cpu_comm && k < 1000; k++)
        if (llmem_comm_barrier(tp->comm[r]) != LLMEM_E_INVALID)
            break;
    if (st != LLMEM_OK && !tp->cpu_comm)
        (void)llmem_comm_abort(tp->comm[r]); /* idempotent: several ranks may fail */
    tp->st[r] = st;
}

typedef struct worker_arg {
    hf_tp *tp;
    int32_t r;
} worker_arg;

static void *worker_main(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    hf_tp *tp = wa.tp;
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (tp->gen == seen && !tp->quit)
            pthread_cond_wait(&tp->go, &tp->mu);
        if (tp->quit)
            break;
        seen = tp->gen;
        pthread_mutex_unlock(&tp->mu);
        rank_step(tp, wa.r);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0)
            pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

llmem_status hf_tp_forward(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab)
{
    hf_tp *tp = m->tp;
    pthread_mutex_lock(&tp->mu);
    tp->ub = ub;
    tp->n_vocab = n_vocab;
    tp->pending = tp->n - 1;
    tp->gen++;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    rank_step(tp, 0);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0)
        pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    m->stats.n_recorded = tp->rank[0]->stats.n_recorded; /* every rank records alike */
    m->stats.n_replayed = tp->rank[0]->stats.n_replayed;
    for (int32_t r = 0; r < tp->n; r++)
        if (tp->st[r] != LLMEM_OK)
            return tp->st[r];
    return LLMEM_OK;
}

/* ---- load and free ---------------------------------------------------------------- */

void hf_tp_destroy(hf_tp *tp)
{
    if (!tp)
        return;
    if (tp->sync_init) {
        pthread_mutex_lock(&tp->mu);
        tp->quit = true;
        pthread_cond_broadcast(&tp->go);
        pthread_mutex_unlock(&tp->mu);
        for (int32_t r = 1; r <= tp->n_threads; r++)
            pthread_join(tp->th[r], NULL);
        pthread_mutex_destroy(&tp->mu);
        pthread_cond_destroy(&tp->go);
        pthread_cond_destroy(&tp->done);
    }
    for (int32_t r = 0; r < tp->n; r++) {
        if (tp->rank[r] && tp->rank[r]->mem_borrowed)
            tp->rank[r]->mem = NULL;
        llmem_model_free(tp->rank[r]);
        llmem_comm_destroy(tp->comm[r]);
    }
    for (int32_t r = 1; r < tp->n; r++)
        llmem_backend_close(tp->be[r]);
    free(tp);
}

/* Opens rank r's backend: a backend of be's kind, device be's + r (cpu:
 * another instance; every rank on be's device when LLMEM_TP_ONE_DEVICE=1,
 * for testing), with be's allocation hook (called from rank r's thread
 * too, once decoding runs). */
static llmem_status open_rank_backend(llmem_backend *be, int32_t r, llmem_backend **out,
                                      char *err, size_t err_len)
{
    llmem_backend_info info = {0};
    llmem_backend_get_info(be, &info);
    const char *one = getenv("LLMEM_TP_ONE_DEVICE");
    bool same = !strcmp(llmem_backend_name(be), "cpu") || (one && !strcmp(one, "1"));
    int32_t dev = same ? info.device : info.device + r;
    char why[256] = "";
    llmem_status st = llmem_backend_open(llmem_backend_name(be), dev, out, why, sizeof why);
    if (st != LLMEM_OK)
        llmem_errf(err, err_len, "tensor-parallel rank %d: cannot open %s device %d: %s", r,
                   llmem_backend_name(be), dev, why);
    else /* be's allocation hook (fault injection) covers every rank's allocations */
        llmem_backend_set_alloc_hook(*out, be->alloc_hook, be->alloc_hook_ctx);
    return st;
}

static llmem_status build_rank(llmem_model *m, hf_tp *tp, const llmem_model_config *rc,
                               bool norm_full, const llmem_safetensors *st, int32_t r, char *err,
                               size_t err_len)
{
    llmem_model *rm = calloc(1, sizeof *rm);
    if (!rm)
        return LLMEM_E_NO_MEMORY;
    tp->rank[r] = rm;
    rm->cfg = *rc;
    rm->p = m->p;
    rm->p.tp = 1;
    /* the prefix budget is the model's: each rank caches its heads' share */
    if (rm->p.prefix_cache_bytes > 0)
        rm->p.prefix_cache_bytes = (rm->p.prefix_cache_bytes + tp->n - 1) / tp->n;
    rm->be = tp->be[r];
    rm->tp_rank = r;
    rm->tp_size = tp->n;
    rm->tp_full = &m->cfg;
    rm->tp_norm_full = norm_full;
    rm->tp_vocab = m->cfg.vocab_size % tp->n == 0 ? m->cfg.vocab_size / tp->n : m->cfg.vocab_size;
    const char *step = "";
    char why[384] = "";
    llmem_status s = hf_model_build(rm, st, &step, why, sizeof why);
    if (s != LLMEM_OK)
        llmem_errf(err, err_len, "rank %d: %s", r, why[0] ? why : step);
    return s;
}

llmem_status hf_tp_load(llmem_model *m, const llmem_safetensors *st, char *err, size_t err_len)
{
    int32_t n = m->p.tp;
    llmem_model_config rc;
    bool norm_full = false;
    llmem_status s = shard_config(&m->cfg, n, &rc, &norm_full, err, err_len);
    if (s != LLMEM_OK)
        return s;
    hf_tp *tp = calloc(1, sizeof *tp);
    if (!tp)
        return LLMEM_E_NO_MEMORY;
    m->tp = tp;
    tp->n = n;
    tp->be[0] = m->be;
    for (int32_t r = 1; r < n && s == LLMEM_OK; r++)
        s = open_rank_backend(m->be, r, &tp->be[r], err, err_len);
    for (int32_t r = 0; r < n && s == LLMEM_OK; r++)
        s = build_rank(m, tp, &rc, norm_full, st, r, err, err_len);
    if (s != LLMEM_OK)
        return s;
    const char *kind = getenv("LLMEM_TP_COMM");
    if ((s = llmem_comm_group_create(tp->be, n, kind && *kind ? kind : NULL, tp->comm, err,
                                     err_len)) != LLMEM_OK) {
        if (s == LLMEM_E_NOT_FOUND && err && err_len) { /* NCCL missing: say what else works */
            size_t k = strlen(err);
            snprintf(err + k, err_len - k, "; LLMEM_TP_COMM=cpu runs the ranks over the CPU "
                                           "communicator instead");
        }
        return s;
    }
    tp->cpu_comm = !strcmp(llmem_comm_name(tp->comm[0]), "cpu");
    /* Recorded decode steps (models/decode_graph.c) hold the collectives:
     * NCCL's are captured into each rank's CUDA graph with the ops (every
     * rank records and replays the same steps, as each sees the same
     * ubatches); the cpu backend's recordings call the step again, CPU
     * collectives included. The CPU communicator on a device backend copies
     * through the host, which a recording cannot hold: eager there. */
    tp->graphs = !tp->cpu_comm || !strcmp(llmem_backend_name(m->be), "cpu");
    /* one memory over every rank's: plans computed once, applied to all */
    llmem_memory *mems[LLMEM_COMM_MAX_RANKS];
    int32_t L = llmem_memory_n_layers(tp->rank[0]->mem);
    for (int32_t r = 0; r < n; r++) {
        mems[r] = tp->rank[r]->mem;
        tp->rank[r]->mem = NULL;
    }
    if ((s = llmem_hybrid_create_ranks(mems, n, &m->mem, err, err_len)) != LLMEM_OK)
        return s;
    for (int32_t r = 0; r < n; r++) {
        llmem_model *rm = tp->rank[r];
        rm->mem = m->mem;
        rm->mem_borrowed = true;
        rm->comm = tp->comm[r];
        for (int32_t il = 0; il < rm->cfg.n_layers; il++) {
            if (rm->layers[il].mem_layer >= 0)
                rm->layers[il].mem_layer += r * L;
            if (rm->layers[il].mem_layer2 >= 0)
                rm->layers[il].mem_layer2 += r * L;
        }
    }
    /* the leader reads logits and runs the sampling ops in rank 0's scratch */
    llmem_model *r0 = tp->rank[0];
    m->scratch = r0->scratch;
    m->off_logits = r0->off_logits;
    m->off_ids = r0->off_ids;
    m->off_ctr = r0->off_ctr;
    m->off_lp = r0->off_lp;
    m->off_top_ids = r0->off_top_ids;
    m->off_top_lp = r0->off_top_lp;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->go, NULL);
    pthread_cond_init(&tp->done, NULL);
    tp->sync_init = true;
    for (int32_t r = 1; r < n; r++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa)
            *wa = (worker_arg){tp, r};
        if (!wa || pthread_create(&tp->th[r], NULL, worker_main, wa) != 0) {
            free(wa);
            llmem_errf(err, err_len, "cannot start the thread of tensor-parallel rank %d", r);
            return LLMEM_E_NO_MEMORY;
        }
        tp->n_threads = r;
    }
    return LLMEM_OK;
}

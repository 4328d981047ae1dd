/* llmem models/: the forward pass over memory views and backend ops
 * (hf_forward_ops: every layer of one ubatch, and the fused one-token decode
 * path); the decode entry points that run it are in decode.c. The block
 * structures and the Mamba-2 mixer are described at the top of runtime.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/hybrid.h"
#include "llmem/ops.h"
#include "llmem/ops_discard.h"
#include "llmem/ops_norm_matmul.h"
#include "models/model_internal.h"

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

llmem_status hf_matmul(llmem_model *m, const llmem_tensor *a, const llmem_tensor *w,
                       const llmem_tensor *out)
{
    return matmul(m, a, w, out);
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

/* x = x * s when s != 1 (granite's and falcon_h1's multipliers). */
static llmem_status scale_by(llmem_model *m, const llmem_tensor *x, double s)
{
    return s == 1.0 ? LLMEM_OK : llmem_op_scale(m->be, x, (float)s, x);
}

/* ---- fused decode path ---------------------------------------------------------------- */

/* Whether m takes the fused decode path: a device backend with
 * llmem_op_norm_matmul (the CPU gains nothing from it; LLMEM_NORM_MATMUL_CPU=1
 * takes it there too, so the path's wiring is tested without a GPU: ctest
 * parity_fused_*), and only Mamba-2 and attention layers with plain pre-norm
 * blocks (a SwiGLU FFN without biases or multipliers, Mamba-2's gated norm
 * over the whole row, no post norms, no tensor parallelism).
 * LLMEM_NO_NORM_MATMUL=1 turns it off. */
static bool nm_model_ok(llmem_model *m)
{
    const llmem_model_config *c = &m->cfg;
    const char *e = getenv("LLMEM_NO_NORM_MATMUL"), *ec = getenv("LLMEM_NORM_MATMUL_CPU");
    bool cpu = strcmp(llmem_backend_name(m->be), "cpu") == 0;
    if ((e && atoi(e) == 1) || (cpu && !(ec && atoi(ec) == 1)) ||
        !llmem_backend_supports(m->be, LLMEM_OP_NORM_MATMUL, NULL, 0))
        return false;
    if (m->tp_size > 1 || m->q3n || m->fal || m->moe || m->tp_norm_full || c->ssm_gate_only ||
        c->residual_multiplier != 1.0 || c->mlp_down_multiplier != 1.0 ||
        c->mlp_gate_multiplier != 1.0 || c->arch == LLMEM_ARCH_GRANITEMOEHYBRID ||
        c->arch == LLMEM_ARCH_JAMBA)
        return false;
    for (int32_t il = 0; il < c->n_layers; il++) {
        const layer_w *L = &m->layers[il];
        const llmem_layer_config *lc = &c->layers[il];
        if (L->w[LLMEM_W_POST_ATTN_NORM].present || L->w[LLMEM_W_POST_FFN_NORM].present)
            return false;
        if (lc->kind == LLMEM_LAYER_MAMBA2) {
            if (L->w[LLMEM_W_SSM_IN_BIAS].present || L->w[LLMEM_W_SSM_OUT_BIAS].present ||
                (c->ssm_norm_group_size > 0 && c->ssm_norm_group_size != c->ssm_d_inner))
                return false;
        } else if (lc->kind == LLMEM_LAYER_ATTENTION) {
            if (L->w[LLMEM_W_ATTN_O_BIAS].present)
                return false;
        } else {
            return false;
        }
        const wt *g = &L->w[LLMEM_W_FFN_GATE], *u = &L->w[LLMEM_W_FFN_UP];
        if (lc->has_ffn &&
            (!c->ffn_gated || c->ffn_act != LLMEM_ACT_SILU || !g->present || !u->present ||
             g->t.dtype != u->t.dtype || L->w[LLMEM_W_MOE_ROUTER].present ||
             L->w[LLMEM_W_FFN_GATE_BIAS].present || L->w[LLMEM_W_FFN_UP_BIAS].present ||
             L->w[LLMEM_W_FFN_DOWN_BIAS].present))
            return false;
    }
    return true;
}

/* out = epilogue(norm(x) · wᵀ) (llmem_op_norm_matmul) on the fused path;
 * when the backend refuses the shape, the unfused ops: the RMS norm into h,
 * the gated norm in place on x (y, consumed), the product (into h for the
 * residual add, then out += h). Epilogue ADD takes no RMS norm here. */
static llmem_status nm_linear(llmem_model *m, int32_t norm, int32_t epi, const llmem_tensor *x,
                              const llmem_tensor *z, const wt *nw, const wt *w, const wt *w2,
                              const llmem_tensor *out)
{
    llmem_norm_matmul_params p = {.norm = norm, .epilogue = epi, .eps = (float)m->cfg.norm_eps};
    const llmem_tensor *tn = norm != LLMEM_NM_NORM_NONE && nw->present ? &nw->t : NULL;
    llmem_status s = llmem_op_norm_matmul(m->be, &p, x, z, tn, &w->t, w2 ? &w2->t : NULL, out);
    if (s != LLMEM_E_UNSUPPORTED)
        return s;
    int32_t T = (int32_t)x->ne[0];
    llmem_tensor hn = act(m, m->off_h, T, (int32_t)x->ne[1]);
    const llmem_tensor *a = x;
    if (norm == LLMEM_NM_NORM_RMS) {
        if (epi == LLMEM_NM_ADD)
            return LLMEM_E_INVALID;
        TRY(llmem_op_rms_norm(m->be, x, tn, p.eps, &hn));
        a = &hn;
    } else if (norm == LLMEM_NM_NORM_GATED) {
        TRY(llmem_op_rms_norm_gated(m->be, x, z, tn, 1, p.eps, x));
    }
    if (epi == LLMEM_NM_SWIGLU)
        return llmem_op_matmul_swiglu(m->be, a, &w->t, &w2->t, out);
    if (epi == LLMEM_NM_STORE)
        return matmul(m, a, &w->t, out);
    llmem_tensor ph = act(m, m->off_h, T, (int32_t)w->t.ne[0]);
    TRY(matmul(m, a, &w->t, &ph));
    return llmem_op_add(m->be, out, &ph, out);
}

/* The fused path's q, k, v of one token (m->nm_qkv, LLMEM_NM_QKV, 1-3):
 * 1, 2: the layer's input norm of x inside their matmuls; 3: of h, which
 * the caller normed. With q, k, v packed back to back (models/runtime.c,
 * pack_qkv) and nm_qkv 2 or 3, one matmul of the packed
 * [Nq + Nk + Nv, hidden] weight into [q | k | v] at off_a, and the offsets
 * of k and v are moved there (*ko, *vo); else one per projection. Biases
 * are added after. */
static llmem_status qkv_decode(llmem_model *m, const layer_w *L, size_t *ko, size_t *vo)
{
    const llmem_model_config *c = &m->cfg;
    int32_t nq = c->n_heads * c->head_dim, nk = c->n_kv_heads * c->head_dim;
    const wt *wq = &L->w[LLMEM_W_ATTN_Q], *wk = &L->w[LLMEM_W_ATTN_K], *wv = &L->w[LLMEM_W_ATTN_V];
    const wt *nw = &L->w[LLMEM_W_MIXER_NORM];
    llmem_tensor x = act(m, m->off_x, 1, c->hidden_size), h = act(m, m->off_h, 1, c->hidden_size);
    size_t rq = llmem_tensor_nbytes(&wq->t), rk = llmem_tensor_nbytes(&wk->t);
    bool packed = m->nm_qkv >= 2 && wq->t.buf == wk->t.buf && wk->t.buf == wv->t.buf &&
                  wq->t.dtype == wk->t.dtype && wk->t.dtype == wv->t.dtype &&
                  wk->t.offset == wq->t.offset + rq && wv->t.offset == wk->t.offset + rk &&
                  wq->t.ne[0] == nq && wk->t.ne[0] == nk && wv->t.ne[0] == nk &&
                  (int64_t)nq + 2 * (int64_t)nk <= (int64_t)m->p.n_ubatch * m->width_a;
    if (packed) {
        wt w = *wq;
        w.t.ne[0] = nq + 2 * nk;
        llmem_tensor out = act(m, m->off_a, 1, nq + 2 * nk);
        *ko = m->off_a + (size_t)nq * 4;
        *vo = *ko + (size_t)nk * 4;
        if (m->nm_qkv == 3)
            TRY(matmul(m, &h, &w.t, &out));
        else
            TRY(nm_linear(m, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE, &x, NULL, nw, &w, NULL, &out));
    } else {
        const wt *ws[3] = {wq, wk, wv};
        size_t os[3] = {m->off_a, *ko, *vo};
        for (int i = 0; i < 3; i++) {
            llmem_tensor y = act(m, os[i], 1, i == 0 ? nq : nk);
            if (m->nm_qkv == 3)
                TRY(matmul(m, &h, &ws[i]->t, &y));
            else
                TRY(nm_linear(m, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE, &x, NULL, nw, ws[i], NULL, &y));
        }
    }
    const wt *b[3] = {&L->w[LLMEM_W_ATTN_Q_BIAS], &L->w[LLMEM_W_ATTN_K_BIAS],
                      &L->w[LLMEM_W_ATTN_V_BIAS]};
    size_t bo[3] = {m->off_a, *ko, *vo};
    for (int i = 0; i < 3; i++) {
        llmem_tensor y = act(m, bo[i], 1, i == 0 ? nq : nk);
        if (b[i]->present)
            TRY(llmem_op_add(m->be, &y, &b[i]->t, &y));
    }
    return LLMEM_OK;
}

static llmem_status attention(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v)
{
    const llmem_model_config *c = &m->cfg;
    int32_t H = c->n_heads, Hk = c->n_kv_heads, Dh = c->head_dim;
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size);
    size_t ko = m->off_b, vo = m->off_c;
    if (m->nm_on && m->nm_qkv > 0) {
        TRY(qkv_decode(m, L, &ko, &vo));
    } else {
        llmem_tensor q = act(m, m->off_a, T, H * Dh), k = act(m, ko, T, Hk * Dh),
                     vv = act(m, vo, T, Hk * Dh);
        TRY(linear(m, &h, &L->w[LLMEM_W_ATTN_Q], &L->w[LLMEM_W_ATTN_Q_BIAS], &q));
        TRY(linear(m, &h, &L->w[LLMEM_W_ATTN_K], &L->w[LLMEM_W_ATTN_K_BIAS], &k));
        TRY(linear(m, &h, &L->w[LLMEM_W_ATTN_V], &L->w[LLMEM_W_ATTN_V_BIAS], &vv));
    }
    llmem_tensor k = act(m, ko, T, Hk * Dh), o = act(m, m->off_d, T, H * Dh);
    TRY(scale_by(m, &k, c->key_multiplier)); /* falcon_h1 */
    if (c->gemma_norms) /* gemma3: per-head q/k RMSNorm before RoPE */
        TRY(hf_gemma3_qk_norm(m, L, T, m->off_a, ko));
    else if (L->w[LLMEM_W_ATTN_Q_NORM].present) { /* lfm2: RMSNorm of each q and k head */
        llmem_tensor qh = llmem_tensor_2d(m->scratch, m->off_a, LLMEM_DTYPE_F32, T * H, Dh);
        llmem_tensor kh = llmem_tensor_2d(m->scratch, ko, LLMEM_DTYPE_F32, T * Hk, Dh);
        TRY(llmem_op_rms_norm(m->be, &qh, &L->w[LLMEM_W_ATTN_Q_NORM].t, (float)c->norm_eps, &qh));
        TRY(llmem_op_rms_norm(m->be, &kh, &L->w[LLMEM_W_ATTN_K_NORM].t, (float)c->norm_eps, &kh));
    }
    llmem_tensor q3 = llmem_tensor_3d(m->scratch, m->off_a, LLMEM_DTYPE_F32, T, H, Dh);
    llmem_tensor k3 = llmem_tensor_3d(m->scratch, ko, LLMEM_DTYPE_F32, T, Hk, Dh);
    llmem_tensor v3 = llmem_tensor_3d(m->scratch, vo, LLMEM_DTYPE_F32, T, Hk, Dh);
    llmem_tensor o3 = llmem_tensor_3d(m->scratch, m->off_d, LLMEM_DTYPE_F32, T, H, Dh);
    if (c->use_rope && c->rope_dim > 0) {
        llmem_rope_params rp = {.mode = LLMEM_ROPE_NEOX, .n_rot = c->rope_dim,
                                .theta_base = L->rope_theta, .freq_scale = L->rope_scale};
        llmem_tensor pos = llmem_tensor_1d(m->scratch, m->off_pos, LLMEM_DTYPE_I32, T);
        if (llmem_view_kv(v)->shift_slot.n > 0)
            TRY(llmem_op_rope_shift(m->be, &rp, v));
        if (T == 1 && ko == m->off_a + (size_t)(H * Dh) * 4) {
            /* one token, k right after q (qkv_decode): both in one launch */
            llmem_tensor qk3 = llmem_tensor_3d(m->scratch, m->off_a, LLMEM_DTYPE_F32, 1, H + Hk, Dh);
            TRY(llmem_op_rope(m->be, &rp, &qk3, &pos, &qk3));
        } else {
            TRY(llmem_op_rope(m->be, &rp, &q3, &pos, &q3));
            TRY(llmem_op_rope(m->be, &rp, &k3, &pos, &k3));
        }
    }
    TRY(llmem_op_kv_store(m->be, v, &k3, &v3));
    /* scale 1/sqrt(Dh) but granite / gemma3; the window is the one the
     * layer's KV cache keeps (memory/swa.c), so the view and the op agree */
    llmem_attn_params ap = {.scale = (float)c->attention_scale,
                            .softcap = (float)c->attn_softcap, .window = L->window,
                            .fast = m->p.precision == LLMEM_PRECISION_FAST};
    TRY(llmem_op_attention_paged(m->be, &ap, v, &q3, &o3));
    if (m->nm_on) { /* x += o · W_oᵀ */
        llmem_tensor x = act(m, m->off_x, T, c->hidden_size);
        return nm_linear(m, LLMEM_NM_NORM_NONE, LLMEM_NM_ADD, &o, NULL, NULL,
                         &L->w[LLMEM_W_ATTN_O], NULL, &x);
    }
    llmem_tensor out = act(m, m->off_h, T, c->hidden_size);
    TRY(linear(m, &o, &L->w[LLMEM_W_ATTN_O], &L->w[LLMEM_W_ATTN_O_BIAS], &out));
    return hf_tp_all_reduce(m, m->off_h, T); /* o_proj is row-parallel (models/tp.c) */
}

/* The gated RMS norm of a tensor-parallel rank whose norm groups span
 * ranks (models/tp.c): y and z [T, d] of every rank gathered side by side
 * into [T, d * ranks], normed there with the full weight, and this rank's
 * columns copied back into y. With one group over the whole row the gate
 * is applied first (y * silu(z), as the gated norm does) and only that is
 * gathered. */
static llmem_status tp_norm_full(llmem_model *m, const layer_w *L, int32_t T,
                                 const llmem_tensor *y, const llmem_tensor *z)
{
    const llmem_model_config *f = m->tp_full;
    int32_t d = m->cfg.ssm_d_inner, din = f->ssm_d_inner;
    size_t off_z = m->off_tpg + (size_t)T * (size_t)din * 4;
    int32_t groups = din / (f->ssm_norm_group_size > 0 ? f->ssm_norm_group_size : din);
    if (groups == 1) { /* one norm over the row (mamba2, bamba): gate first, gather once */
        TRY(llmem_op_swiglu(m->be, z, y, y));
        TRY(hf_tp_gather_cols(m, y->offset, m->off_tpg, T, d));
        llmem_tensor gf = act(m, m->off_tpg, T, din);
        TRY(llmem_op_rms_norm(m->be, &gf, &L->w[LLMEM_W_SSM_NORM].t, (float)f->norm_eps, &gf));
        return llmem_op_copy(m->be, &gf, m->tp_rank * d, y);
    }
    TRY(hf_tp_gather_cols(m, y->offset, m->off_tpg, T, d));
    TRY(hf_tp_gather_cols(m, z->offset, off_z, T, d));
    llmem_tensor yf = act(m, m->off_tpg, T, din), zf = act(m, off_z, T, din);
    TRY(llmem_op_rms_norm_gated(m->be, &yf, &zf, &L->w[LLMEM_W_SSM_NORM].t, groups,
                                (float)f->norm_eps, &yf));
    return llmem_op_copy(m->be, &yf, m->tp_rank * d, y);
}

static llmem_status mamba(llmem_model *m, const layer_w *L, int32_t T, const llmem_view *v)
{
    const llmem_model_config *c = &m->cfg;
    int32_t din = c->ssm_d_inner, cd = c->ssm_conv_dim, nh = c->ssm_n_heads;
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size);
    llmem_tensor zxbcdt = act(m, m->off_a, T, c->ssm_in_proj_dim);
    if (m->nm_on) { /* zxbcdt = rms_norm(x) · W_inᵀ */
        llmem_tensor x = act(m, m->off_x, T, c->hidden_size);
        TRY(nm_linear(m, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE, &x, NULL, &L->w[LLMEM_W_MIXER_NORM],
                      &L->w[LLMEM_W_SSM_IN], NULL, &zxbcdt));
    } else {
        TRY(linear(m, &h, &L->w[LLMEM_W_SSM_IN], &L->w[LLMEM_W_SSM_IN_BIAS], &zxbcdt));
    }
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
        /* the product is dead now (the scan's y overwrites it): a backend
         * that still holds its write back may drop it (Vulkan: in_proj's
         * held split-K sum writes z / xBC / dt alone) */
        TRY(llmem_op_discard(m->be, &zxbcdt));
    }
    const wt *cb = &L->w[LLMEM_W_SSM_CONV_BIAS];
    TRY(llmem_op_ssm_conv(m->be, v, 0, &xbc, &L->w[LLMEM_W_SSM_CONV].t, cb->present ? &cb->t : NULL,
                          &conv));
    if (T > 1) /* xBC's copy too (Vulkan's held pass doing the conv reads it in registers) */
        TRY(llmem_op_discard(m->be, &xbc));
    llmem_ssm_params sp = {.n_heads = nh, .head_dim = c->ssm_head_dim, .d_state = c->ssm_d_state,
                           .n_groups = c->ssm_n_groups, .dt_min = (float)c->time_step_limit[0],
                           .dt_max = (float)c->time_step_limit[1],
                           .fast = m->p.precision == LLMEM_PRECISION_FAST};
    const wt *D = &L->w[LLMEM_W_SSM_D], *dtb = &L->w[LLMEM_W_SSM_DT_BIAS];
    TRY(llmem_op_ssm_scan(m->be, &sp, v, 1, &conv, &dt, &L->w[LLMEM_W_SSM_A_LOG].t,
                          D->present ? &D->t : NULL, dtb->present ? &dtb->t : NULL, &y));
    if (m->nm_on) { /* x += gated_norm(y, z) · W_outᵀ */
        llmem_tensor x = act(m, m->off_x, T, c->hidden_size);
        return nm_linear(m, LLMEM_NM_NORM_GATED, LLMEM_NM_ADD, &y, &z, &L->w[LLMEM_W_SSM_NORM],
                         &L->w[LLMEM_W_SSM_OUT], NULL, &x);
    }
    int32_t groups = din / (c->ssm_norm_group_size > 0 ? c->ssm_norm_group_size : din);
    if (c->ssm_gate_only) /* falcon_h1 without mamba_rms_norm: y * silu(z) */
        TRY(llmem_op_swiglu(m->be, &z, &y, &y));
    else if (m->tp_norm_full)
        TRY(tp_norm_full(m, L, T, &y, &z));
    else { /* into conv's space (read by the scan, free now) rather than in place: an
            * output apart from y and z lets a backend split each row over several
            * workgroups (Vulkan at the decode rows) */
        llmem_tensor yn = act(m, m->off_b, T, din);
        TRY(llmem_op_rms_norm_gated(m->be, &y, &z, &L->w[LLMEM_W_SSM_NORM].t, groups,
                                    (float)c->norm_eps, &yn));
        y = yn;
    }
    llmem_tensor out = act(m, m->off_h, T, c->hidden_size);
    TRY(linear(m, &y, &L->w[LLMEM_W_SSM_OUT], &L->w[LLMEM_W_SSM_OUT_BIAS], &out));
    return hf_tp_all_reduce(m, m->off_h, T); /* out_proj is row-parallel */
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
    TRY(hf_moe_ffn(m->moe, m->be, &m->cfg, w, &h, T));
    return hf_tp_all_reduce(m, m->off_h, T); /* experts split by tensor (models/tp.c) */
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
    if (c->arch == LLMEM_ARCH_GRANITEMOEHYBRID ||
        (c->arch == LLMEM_ARCH_JAMBA && L->w[LLMEM_W_MOE_ROUTER].present))
        return moe_ffn(m, L, T);
    llmem_tensor h = act(m, m->off_h, T, c->hidden_size);
    llmem_tensor up = act(m, m->off_b, T, c->intermediate_size);
    if (m->nm_on) { /* up = swiglu(rms_norm(x) · W_gateᵀ, · W_upᵀ); x += up · W_downᵀ */
        llmem_tensor x = act(m, m->off_x, T, c->hidden_size);
        TRY(nm_linear(m, LLMEM_NM_NORM_RMS, LLMEM_NM_SWIGLU, &x, NULL, &L->w[LLMEM_W_FFN_NORM],
                      &L->w[LLMEM_W_FFN_GATE], &L->w[LLMEM_W_FFN_UP], &up));
        return nm_linear(m, LLMEM_NM_NORM_NONE, LLMEM_NM_ADD, &up, NULL, NULL,
                         &L->w[LLMEM_W_FFN_DOWN], NULL, &x);
    }
    llmem_status fs = fused_gate_up(m, L, T, &h, &up);
    if (fs == LLMEM_OK) {
        TRY(linear(m, &up, &L->w[LLMEM_W_FFN_DOWN], &L->w[LLMEM_W_FFN_DOWN_BIAS], &h));
        TRY(hf_tp_all_reduce(m, m->off_h, T)); /* down is row-parallel */
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
        else if (c->ffn_act == LLMEM_ACT_GELU_TANH) /* gemma3 */
            TRY(llmem_op_geglu(m->be, &gate, &up, &up));
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
    TRY(hf_tp_all_reduce(m, m->off_h, T));
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

void hf_fused_setup(llmem_model *m)
{
    /* q/k/v (qkv_decode): one fused launch on every backend (Vulkan too
     * since its one-token ropes and kv store became one dispatch:
     * docs/benchmarks.md, "Vulkan batch-1 step: rope with the kv store, a
     * split argmax") */
    const char *e = getenv("LLMEM_NM_QKV"), *ng = getenv("LLMEM_NO_GRAPHS");
    m->nm_path = nm_model_ok(m) ? 2 : 1;
    m->nm_qkv = (int8_t)(e && atoi(e) >= 0 && atoi(e) <= 3 ? atoi(e) : 2);
    m->no_graphs = ng && strcmp(ng, "1") == 0;
}

llmem_status hf_forward_ops(llmem_model *m, int32_t T, int32_t n_out, int32_t n_vocab)
{
    const llmem_model_config *c = &m->cfg;
    int32_t D = c->hidden_size;
    llmem_tensor tok = llmem_tensor_1d(m->scratch, m->off_tok, LLMEM_DTYPE_I32, T);
    llmem_tensor x = act(m, m->off_x, T, D), h = act(m, m->off_h, T, D);
    TRY(llmem_op_get_rows(m->be, &m->embed.t, &tok, &x));
    TRY(scale_by(m, &x, c->embedding_multiplier));
    /* pend: h holds a block's output not yet added to x; the add is fused
     * into the next RMS norm (llmem_op_add_rms_norm: equal to add then norm) */
    bool pend = false;
    float eps = (float)c->norm_eps;
    /* one-token ubatches (batch-1 decode): each block's norm in the matmul
     * after it and its output added to x by the matmul that makes it (no h
     * pending). Not for 2-4 tokens: the fused kernel reads the weights once
     * per row, where matmul.cu's GEMV reads them once for all rows. */
    m->nm_on = m->nm_path == 2 && T == 1;
    for (int32_t il = 0; il < c->n_layers; il++) {
        const layer_w *L = &m->layers[il];
        const llmem_layer_config *lc = &c->layers[il];
        llmem_view v = {0};
        if (L->mem_layer >= 0)
            TRY(llmem_memory_view(m->mem, L->mem_layer, &v));
        if (m->nm_on) {
            if (lc->kind == LLMEM_LAYER_ATTENTION) {
                if (m->nm_qkv == 0 || m->nm_qkv == 3) /* else in q/k/v's matmuls (qkv_decode) */
                    TRY(llmem_op_rms_norm(m->be, &x, &L->w[LLMEM_W_MIXER_NORM].t, eps, &h));
                TRY(attention(m, L, T, &v));
            } else {
                TRY(mamba(m, L, T, &v));
            }
            if (lc->has_ffn)
                TRY(ffn(m, L, T));
            continue;
        }
        if (m->q3n) { /* models/qwen3_next.c */
            TRY(hf_qwen3n_layer(m, il, T, &v, pend));
            pend = true;
            continue;
        }
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
        else if (lc->kind == LLMEM_LAYER_SHORTCONV)
            TRY(hf_lfm2_shortconv(m, L, T, &v));
        else if (lc->kind == LLMEM_LAYER_MAMBA1)
            TRY(hf_jamba_mamba(m, L, T, &v));
        else
            TRY(ffn(m, L, T));
        if (L->w[LLMEM_W_POST_ATTN_NORM].present) /* gemma3: norm of the block output */
            TRY(llmem_op_rms_norm(m->be, &h, &L->w[LLMEM_W_POST_ATTN_NORM].t, eps, &h));
        TRY(scale_by(m, &h, c->residual_multiplier));
        if (lc->has_ffn) {
            TRY(llmem_op_add_rms_norm(m->be, &x, &h, &L->w[LLMEM_W_FFN_NORM].t, eps, &h));
            TRY(ffn(m, L, T));
            if (L->w[LLMEM_W_POST_FFN_NORM].present)
                TRY(llmem_op_rms_norm(m->be, &h, &L->w[LLMEM_W_POST_FFN_NORM].t, eps, &h));
            TRY(scale_by(m, &h, c->residual_multiplier));
        }
        pend = true;
    }
    if (pend)
        TRY(llmem_op_add(m->be, &x, &h, &x));
    if (n_out == 0)
        return LLMEM_OK;
    llmem_tensor logits = act(m, m->off_logits, n_out, n_vocab);
    if (m->nm_on && n_out == 1 && m->lm_head.t.ne[0] == n_vocab) {
        /* the one token is the one output row: the final norm goes into
         * the LM head's matmul (no row gather, no norm launch) */
        TRY(nm_linear(m, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE, &x, NULL, &m->final_norm, &m->lm_head,
                      NULL, &logits));
        if (c->final_softcap > 0)
            TRY(llmem_op_softcap(m->be, &logits, (float)c->final_softcap, &logits));
        return scale_by(m, &logits, 1.0 / c->logits_scaling);
    }
    llmem_tensor rows = llmem_tensor_1d(m->scratch, m->off_rows, LLMEM_DTYPE_I32, n_out);
    llmem_tensor xo = act(m, m->off_h, n_out, D);
    TRY(llmem_op_get_rows(m->be, &x, &rows, &xo));
    TRY(llmem_op_rms_norm(m->be, &xo, &m->final_norm.t, (float)c->norm_eps, &xo));
    if (m->tp_size > 1 && m->tp_vocab < n_vocab) { /* this rank's vocabulary rows, gathered */
        llmem_tensor part = act(m, m->off_tpl, n_out, m->tp_vocab);
        TRY(matmul(m, &xo, &m->lm_head.t, &part));
        TRY(hf_tp_gather_cols(m, m->off_tpl, m->off_logits, n_out, m->tp_vocab));
    } else {
        TRY(matmul(m, &xo, &m->lm_head.t, &logits));
    }
    if (c->final_softcap > 0) /* gemma3 final_logit_softcapping */
        TRY(llmem_op_softcap(m->be, &logits, (float)c->final_softcap, &logits));
    return scale_by(m, &logits, 1.0 / c->logits_scaling); /* granite's logits_scaling */
}

/* llmem Vulkan backend: the split-K sum after a tensor-core product, and
 * that sum held back for the op that reads the product (issue 12, the
 * batched decode step).
 *
 * At 9-64 rows every product (matmul_dec.comp / matmul_cm.comp, raw
 * tiles) is followed by sum_slices_cm.comp, which adds its K slices and
 * scales each row by its 2^e: 167 small dispatches a 9B Bamba step, each
 * behind a barrier, and after in_proj three column copies of z, xBC and
 * dt (87 more). With $LLMEM_VULKAN_SUM_HOLD (unset: bit 0 everywhere,
 * bit 1 above VK_SUM_NORM_ROWS rows of at most VK_SUM_NORM_COLS) that sum
 * is held (not recorded) when the product is recorded; the next op either
 * reads it or records it first:
 *   - bit 0: llmem_op_copy of f32 columns of the product's output (the
 *     Mamba-2 split of in_proj's output): the held pass writes those
 *     columns to the copy's destination too (sum_slices_cm.comp NDST), up
 *     to three copies, and the copies record nothing. With
 *     $LLMEM_VULKAN_SUM_CONV (default on) the Mamba-2 decode conv
 *     whose input is one of those copies is done by the same pass too
 *     (sum_slices_cm.comp CONV; vk_sum_take_conv). A discard of the
 *     product's output, or of a copy the conv took (llmem_op_discard,
 *     models/forward.c; vk_ops_discard.c, vk_sum_drop_dead), drops that write from the pass;
 *   - bit 1: llmem_op_add_rms_norm(x, r = the output, out = r) (the
 *     residual add of out_proj, down and o_proj): rms_norm.comp adds the
 *     raw tiles itself (ADD 2) and the pass is never recorded;
 *   - bits 3 and 2, that norm with its rows split over workgroups
 *     (vk_ops_basic.c): the same fold, x's values read from the residual's
 *     copy (below), or else the pass, recorded at once, adds its sum into
 *     x (sum_slices_cm.comp ADDX) and the norm reads x alone.
 *   - $LLMEM_VULKAN_SWIGLU_FOLD (default on, 9-64 rows): a second product
 *     recorded right after (vk_sum_park) holds its sum beside the first
 *     (a pair, recorded in order by everything else), and llmem_op_swiglu
 *     of the two outputs reads both products' raw tiles (cm_split.comp
 *     FOLD, vk_swiglu_split): neither pass is recorded.
 * Above VK_PRESPLIT_ROWS rows (prefill) bits 0 and 1 alone, with the pass
 * and the norm moving 4 columns an invocation (sum_slices_cm.comp VEC4 with
 * NDST, rms_norm.comp V4 with ADD 2).
 * A product of matmul_cmp.comp's tail-column plan (vk_cmp_plan_tailcol:
 * its last column tiles in more slices than the rest) is summed by the
 * pass alone (with its copies, or adding into x): the folds read uniform
 * slices and take no such sum.
 * The residual's copies (vk_resid_*): see vk_sum.h.
 * Both compute each value as the pass does (the slices added in slice
 * order, then 2^e; a copy moves the bits), so the results are bit for bit
 * those of the pass and the op. Anything else that records a command
 * first records the held pass (vk_held_flush from vk_cmd_track,
 * vk_cmd_flush, vk_cmd_queue_graph, vk_record_end), so every command stays
 * in the order the ops were called. The reference for the arithmetic is
 * sum_slices_cm.comp's own header; the hold follows the conv fold's
 * pattern (vk_ops_mamba.c).
 */
#include <stdlib.h>

#include "llmem/view.h"
#include "vk_rs.h"
#include "vk_sum.h"

#define SUM_WG 256
#define SUM_DST_MAX 3 /* sum_slices_cm.comp's NDST */

struct vk_sum_hold {
    llmem_backend *be;
    vk_cm_sum s;
    llmem_buffer *terms; /* the exponents' buffer when the hold frees it */
    uint32_t n_dst;
    llmem_tensor dst[SUM_DST_MAX];
    uint32_t c0[SUM_DST_MAX];
    bool out_dead;     /* the output discarded (vk_sum_drop_dead): not written */
    uint32_t dst_dead; /* bit j: copy j discarded (vk_sum_drop_dead): not written */
    /* the pair (vk_sum_park): s set aside while the next product records,
     * then that product's sum s2 held beside it (kind VK_SUM_NONE: none) */
    bool parked;
    vk_cm_sum s2;
    llmem_buffer *terms2;
    /* the decode conv folded into the pass (vk_sum_take_conv) */
    bool conv;
    struct {
        llmem_tensor w, b, out;
        bool has_b;
        llmem_buffer *idx, *state; /* the view's index buffer and conv state buffer */
        uint32_t spec;             /* sum_slices_cm.comp's CV */
        uint32_t c0, conv_dim, n_slots, src_word, dst_word;
    } cv;
};
typedef struct vk_sum_hold sum_held;

/* Whether s splits its last columns apart (matmul_cmp.comp's tail-column
 * plan): only the pass reads those (the folds into the norm and the SwiGLU
 * read uniform slices). */
static bool tail_split(const vk_cm_sum *s)
{
    return s->kind == VK_SUM_RAW && s->tc0 < s->n;
}

/* The tail's words allow 16-byte runs (uniform plans: always). */
static bool tail_vec4(const vk_cm_sum *s)
{
    return !tail_split(s) || (s->tc0 % 4 == 0 && s->ldt % 4 == 0 && s->tslice % 4 == 0);
}

/* sum_slices_cm.comp's o_off where o is not written (a discarded output) */
#define SUM_NO_OUT 0xffffffffu

/* Records sum_slices_cm.comp for s (VK_SUM_RAW) with n_dst column
 * destinations, or, addx, adding the sum into dst[0] ([m, n] f32, c0[0]
 * 0) instead of writing s->out (ADDX; n_dst 0). no_out (n_dst >= 1, the
 * output discarded): s->out is neither bound nor written; bit j of
 * dead: destination j neither (width 0); the other destinations and
 * the conv get the same values. */
static llmem_status raw_pass(vk_backend *v, const vk_cm_sum *s, uint32_t n_dst,
                             const llmem_tensor *dst, const uint32_t *c0, bool addx,
                             const sum_held *conv, bool no_out, uint32_t dead)
{
    uint32_t n_bind = addx ? 1u : n_dst;
    size_t count = (size_t)s->m * s->n;
    vk_op sum;
    vk_op_init(&sum, conv ? VK_SH_SUM_SLICES_CM_CONV : VK_SH_SUM_SLICES_CM, SUM_WG);
    uint32_t po = vk_op_tensor(v, &sum, &s->pt, false);
    uint32_t o2 = SUM_NO_OUT;
    if (no_out)
        vk_op_dummy(v, &sum);
    else
        o2 = vk_op_tensor(v, &sum, &s->out, true);
    uint32_t e2 = vk_op_tensor(v, &sum, &s->te, false);
    /* prefill rows: 4 columns an invocation as vec4s where everything is
     * 16-byte aligned, the copies' destinations too ($LLMEM_VULKAN_PF_SUM_VEC
     * =0: one each); at decode rows the same for a pass with copies where
     * $LLMEM_VULKAN_SUM_CONV has VK_SUM_CONV_VEC4, the conv's channels and
     * output too; spec[1] is set once those are bound */
    bool dec4 = n_dst > 0 && (VK_KNOB(v, sum_conv, VK_SUM_CONV_DEFAULT) & VK_SUM_CONV_VEC4);
    bool vec4 = !addx && (s->m > VK_CMP_ROWS ? VK_KNOB(v, pf_sum_vec, 1) != 0 : dec4) &&
                s->n % 4 == 0 && s->ldp % 4 == 0 && s->pslice % 4 == 0 && po % 4 == 0 &&
                (no_out || o2 % 4 == 0) && tail_vec4(s);
    vk_op_spec(&sum, 0u);
    vk_op_spec(&sum, n_dst);
    vk_op_spec(&sum, addx ? 1u : 0u);
    vk_op_u32(&sum, s->m);
    vk_op_u32(&sum, s->n);
    vk_op_u32(&sum, s->ldp);
    vk_op_u32(&sum, s->slices);
    vk_op_u32(&sum, s->pslice);
    vk_op_u32(&sum, po);
    vk_op_u32(&sum, o2);
    vk_op_u32(&sum, e2);
    for (uint32_t j = 0; j < SUM_DST_MAX; j++) {
        bool on = j < n_bind && !(dead >> j & 1);
        uint32_t d = on ? vk_op_tensor(v, &sum, &dst[j], true) : 0;
        if (!on)
            vk_op_dummy(v, &sum);
        uint32_t w = on ? (uint32_t)dst[j].ne[1] : 0;
        vk_op_u32(&sum, on ? c0[j] : 0);
        vk_op_u32(&sum, w);
        vk_op_u32(&sum, d);
        if (j < n_dst && (c0[j] % 4 || w % 4 || d % 4))
            vec4 = false;
    }
    if (conv) { /* CONV: constant 4, bindings 6-10, eight more words */
        vk_op_spec(&sum, conv->cv.spec);
        uint32_t cw = vk_op_tensor(v, &sum, &conv->cv.w, false);
        uint32_t cb = vk_op_tensor(v, &sum, conv->cv.has_b ? &conv->cv.b : NULL, false);
        uint32_t co = vk_op_tensor(v, &sum, &conv->cv.out, true);
        vk_op_buffer(v, &sum, conv->cv.idx, false);
        vk_op_buffer(v, &sum, conv->cv.state, true);
        uint32_t words[8] = {conv->cv.c0, conv->cv.conv_dim, conv->cv.n_slots, cw, cb, co,
                             conv->cv.src_word, conv->cv.dst_word};
        for (int i = 0; i < 8; i++)
            vk_op_u32(&sum, words[i]);
        if (conv->cv.c0 % 4 || conv->cv.conv_dim % 4 || co % 4)
            vec4 = false;
    }
    /* the tail columns' four words, last (matmul_cmp.comp's tail-column plan; tc0 = n:
     * none) */
    vk_op_u32(&sum, s->tc0 < s->n ? s->tc0 : s->n);
    vk_op_u32(&sum, s->tslices);
    vk_op_u32(&sum, s->ldt);
    vk_op_u32(&sum, s->tslice);
    sum.spec[1] = vec4 ? 1u : 0u;
    return vk_op_run(v, &sum, vk_div_up(vec4 ? count / 4 : count, SUM_WG));
}

llmem_status vk_cm_sum_run(llmem_backend *be, vk_backend *v, vk_cm_sum *s, bool run)
{
    llmem_status st = LLMEM_OK;
    size_t count = (size_t)s->m * s->n;
    if (run && s->kind == VK_SUM_RAW) {
        st = raw_pass(v, s, 0, NULL, NULL, false, NULL, false, 0);
    } else if (run && s->kind == VK_SUM_SCALED) {
        vk_op sum;
        vk_op_init(&sum, VK_SH_SUM_SLICES, SUM_WG);
        uint32_t po = vk_op_tensor(v, &sum, &s->pt, false);
        uint32_t o2 = vk_op_tensor(v, &sum, &s->out, true);
        vk_op_u32(&sum, (uint32_t)count);
        vk_op_u32(&sum, s->slices);
        vk_op_u32(&sum, po);
        vk_op_u32(&sum, o2);
        st = vk_op_run(v, &sum, vk_div_up(count, SUM_WG));
    }
    if (s->part)
        vk_buffer_free(be, s->part);
    s->part = NULL;
    s->kind = VK_SUM_NONE;
    return st;
}

/* Whether t is exactly the held output: the same buffer, offset and
 * [m, n] f32 shape. */
static bool is_out(const sum_held *h, const llmem_tensor *t)
{
    const llmem_tensor *o = &h->s.out;
    return t->buf == o->buf && t->offset == o->offset && t->dtype == LLMEM_DTYPE_F32 &&
           t->n_dims == 2 && t->ne[0] == o->ne[0] && t->ne[1] == o->ne[1];
}

/* Whether t overlaps what the pass s reads or writes (s->out, s->pt, s->te). */
static bool touches_sum(const vk_cm_sum *s, const llmem_tensor *t)
{
    return s->kind != VK_SUM_NONE &&
           (vk_overlap(t, &s->out) || vk_overlap(t, &s->pt) || vk_overlap(t, &s->te));
}

/* Whether t overlaps anything the held passes read or write. */
static bool touches(const sum_held *h, const llmem_tensor *t)
{
    if (touches_sum(&h->s, t) || touches_sum(&h->s2, t))
        return true;
    for (uint32_t j = 0; j < h->n_dst; j++)
        if (vk_overlap(t, &h->dst[j]))
            return true;
    return h->conv && (vk_overlap(t, &h->cv.out) || t->buf == h->cv.state);
}

/* The hold's mode for a product of m rows and n columns. Above
 * VK_PRESPLIT_ROWS rows (prefill): bits 0 and 1 of $LLMEM_VULKAN_SUM_HOLD
 * where set, else both. At most that many rows: $LLMEM_VULKAN_SUM_HOLD
 * where set, else the copies (bit 0) and the add into x for a split norm
 * (bit 2) always, and at most VK_SUM_NORM_COLS columns (at
 * every width with VK_NORM_FOLD_SPLIT, VK_NORM_FOLD_WIDE) the fold into
 * the norm: split (bit 3), and one workgroup a row (bit 1) above
 * VK_SUM_NORM_ROWS rows (vk_sum.h). */
static long hold_mode(const vk_backend *v, uint32_t m, uint32_t n)
{
    if (m > VK_PRESPLIT_ROWS) /* prefill rows: the copies and the norm (vk_sum.h) */
        return VK_KNOB(v, sum_hold, 3) & 3;
    long nf = vk_norm_fold_mode(v);
    bool narrow = n <= VK_SUM_NORM_COLS;
    bool one = narrow || (nf & VK_NORM_FOLD_WIDE), split = narrow || (nf & VK_NORM_FOLD_SPLIT);
    long dflt = 1 | 4 | (split ? 8 : 0) | (one && m > VK_SUM_NORM_ROWS ? 2 : 0);
    return VK_KNOB(v, sum_hold, dflt);
}

/* Frees what the hold owns and empties it. */
static void hold_clear(sum_held *h)
{
    if (h->s.part)
        vk_buffer_free(h->be, h->s.part);
    if (h->terms)
        vk_buffer_free(h->be, h->terms);
    if (h->s2.part)
        vk_buffer_free(h->be, h->s2.part);
    if (h->terms2)
        vk_buffer_free(h->be, h->terms2);
    h->s.part = NULL;
    h->terms = NULL;
    h->s.kind = VK_SUM_NONE;
    h->s2.part = NULL;
    h->terms2 = NULL;
    h->s2.kind = VK_SUM_NONE;
    h->n_dst = 0;
    h->out_dead = false;
    h->dst_dead = 0;
    h->parked = false;
    h->conv = false;
}

/* Whether the fold of two held sums into the SwiGLU is on for m rows
 * (vk_sum_fold_mode): at 9 to VK_PRESPLIT_ROWS rows, and above with
 * VK_FOLD_PREFILL. */
static bool fold_on(const vk_backend *v, uint32_t m)
{
    long mode = vk_sum_fold_mode(v);
    return (mode & 3) != 0 && m > VK_MM_MV_MAX &&
           (m <= VK_PRESPLIT_ROWS || (mode & VK_FOLD_PREFILL));
}

bool vk_sum_hold(llmem_backend *be, vk_backend *v, vk_cm_sum *s, llmem_buffer *terms)
{
    long mode = hold_mode(v, s->m, s->n);
    bool ok = s->kind == VK_SUM_RAW && s->m > VK_MM_MV_MAX && s->out.dtype == LLMEM_DTYPE_F32;
    if (v->sum_pending && v->sumh->parked) { /* the pair's second (vk_sum_park) */
        sum_held *h = v->sumh;
        h->parked = false;
        if (!ok || s->m != h->s.m || touches(h, &s->out))
            return false;
        h->s2 = *s;
        h->terms2 = terms;
        s->part = NULL;
        s->kind = VK_SUM_NONE;
        return true;
    }
    if (mode == 0 || !ok || v->sum_pending || vk_held_any(v))
        return false;
    if (!v->sumh && !(v->sumh = calloc(1, sizeof *v->sumh)))
        return false;
    sum_held *h = v->sumh;
    *h = (sum_held){.be = be, .s = *s, .terms = terms};
    s->part = NULL;
    s->kind = VK_SUM_NONE;
    v->sum_pending = true;
    return true;
}

llmem_status vk_sum_flush(vk_backend *v)
{
    if (!v->sum_pending)
        return LLMEM_OK;
    sum_held *h = v->sumh;
    v->sum_pending = false; /* first: recording it tracks, which calls back here */
    llmem_status st = raw_pass(v, &h->s, h->n_dst, h->dst, h->c0, false, h->conv ? h : NULL,
                               h->out_dead && h->n_dst > 0, h->dst_dead);
    if (st == LLMEM_OK && h->s2.kind == VK_SUM_RAW)
        st = raw_pass(v, &h->s2, 0, NULL, NULL, false, NULL, false, 0);
    hold_clear(h);
    return st;
}

bool vk_sum_park(vk_backend *v, uint32_t m, llmem_ct *out, llmem_ct *const *reads,
                 uint32_t n_reads)
{
    if (!v->sum_pending || v->fold_pending || v->nmc_pending || v->rope_pending)
        return false;
    sum_held *h = v->sumh;
    if (!fold_on(v, m) || h->s.m != m || h->n_dst != 0 || h->s2.kind != VK_SUM_NONE)
        return false;
    if (touches(h, out))
        return false;
    for (uint32_t i = 0; i < n_reads; i++) /* (reads of what the pass reads are no hazard) */
        if (vk_overlap(reads[i], &h->s.out))
            return false;
    h->parked = true;
    v->sum_pending = false; /* the product's recording does not record the held pass */
    return true;
}

void vk_sum_unpark(vk_backend *v, bool parked, bool pair)
{
    if (!parked)
        return;
    v->sum_pending = true;
    v->sumh->parked = pair; /* set: vk_sum_hold of the product's sum makes the pair */
}

bool vk_sum_swiglu_ok(vk_backend *v, llmem_ct *g, llmem_ct *u, vk_cm_sum *gs, vk_cm_sum *us)
{
    if (!v->sum_pending)
        return false;
    sum_held *h = v->sumh;
    if (h->s2.kind != VK_SUM_RAW || !fold_on(v, h->s.m) || tail_split(&h->s) ||
        tail_split(&h->s2))
        return false;
    const vk_cm_sum *a = &h->s, *b = &h->s2;
    if (is_out(h, u)) {
        const vk_cm_sum *t = a;
        a = b;
        b = t;
    }
    /* a: the gate's pass, b: up's (as is_out, on each) */
    sum_held ga = {.s = *a}, ua = {.s = *b};
    if (!is_out(&ga, g) || !is_out(&ua, u))
        return false;
    *gs = *a;
    *us = *b;
    return true;
}

llmem_status vk_sum_flush_if(vk_backend *v, const llmem_tensor *t)
{
    return v->sum_pending && touches(v->sumh, t) ? vk_sum_flush(v) : LLMEM_OK;
}

llmem_status vk_sum_take_copy(vk_backend *v, llmem_ct *src, int32_t col0, llmem_ct *dst,
                              bool *taken)
{
    *taken = false;
    if (!v->sum_pending)
        return LLMEM_OK;
    sum_held *h = v->sumh;
    if (!(hold_mode(v, h->s.m, h->s.n) & 1) || h->n_dst >= SUM_DST_MAX ||
        h->s2.kind != VK_SUM_NONE || h->conv ||
        !is_out(h, src) || dst->dtype != LLMEM_DTYPE_F32 || dst->n_dims != 2 ||
        dst->ne[0] != src->ne[0] || dst->ne[1] < 1 || col0 < 0 ||
        (int64_t)col0 + dst->ne[1] > src->ne[1] || touches(h, dst))
        return vk_sum_flush(v);
    h->dst[h->n_dst] = *dst;
    h->c0[h->n_dst++] = (uint32_t)col0;
    *taken = true;
    return LLMEM_OK;
}

static bool conv_dtype(llmem_dtype t)
{
    return t == LLMEM_DTYPE_F32 || t == LLMEM_DTYPE_F16 || t == LLMEM_DTYPE_BF16;
}

/* Whether the conv (x -> out, conv state `state` of view) may be done by
 * the held pass: one token for each of the pass's m streams, no
 * checkpoints and no snapshot (inside the ubatch, or a source another
 * stream writes), x exactly one of the copies the pass writes, dtypes and
 * d_conv the shader carries, and nothing the conv writes (out, the state
 * buffer) read or written by the pass, nor its weights among the pass's
 * outputs. */
static bool conv_matches(const sum_held *h, const llmem_view *view, int32_t state, llmem_ct *x,
                         llmem_ct *w, llmem_ct *b, llmem_ct *out, uint32_t *j)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    if (h->conv || h->n_dst == 0 || h->s2.kind != VK_SUM_NONE || rs->n_seq_tokens != 1 ||
        rs->n_ckpt != 0 || (int64_t)rs->n_seqs != (int64_t)h->s.m ||
        llmem_rs_view_snap_used(view) || d->n_dims != 2 || d->shape[0] < 1 || d->shape[0] > 14 ||
        !conv_dtype(d->dtype) || !conv_dtype(w->dtype) || (b && !conv_dtype(b->dtype)) ||
        x->dtype != LLMEM_DTYPE_F32 || out->dtype != LLMEM_DTYPE_F32)
        return false;
    uint64_t dc = (uint64_t)d->shape[0] + 1, cd = (uint64_t)d->shape[1], m = h->s.m;
    for (*j = 0; *j < h->n_dst; (*j)++) {
        const llmem_tensor *t = &h->dst[*j];
        if (t->buf == x->buf && t->offset == x->offset && (uint64_t)t->ne[1] == cd &&
            llmem_tensor_nbytes(x) == llmem_tensor_nbytes(t))
            break;
    }
    if (*j == h->n_dst || llmem_tensor_nbytes(out) < m * cd * 4 ||
        (uint64_t)llmem_tensor_nelements(w) < cd * dc ||
        (b && (uint64_t)llmem_tensor_nelements(b) < cd))
        return false;
    llmem_buffer *sb = rs->state[state];
    if (touches(h, out) || h->s.out.buf == sb || h->s.pt.buf == sb || h->s.te.buf == sb ||
        vk_overlap(w, &h->s.out) || vk_overlap(b, &h->s.out) || out->buf == sb)
        return false;
    for (uint32_t i = 0; i < h->n_dst; i++)
        if (h->dst[i].buf == sb || vk_overlap(w, &h->dst[i]) || vk_overlap(b, &h->dst[i]))
            return false;
    bool snap = true;
    return vk_rs_needs_snapshot(rs, &snap) == LLMEM_OK && !snap;
}

llmem_status vk_sum_take_conv(vk_backend *v, const llmem_view *view, int32_t state, llmem_ct *x,
                              llmem_ct *w, llmem_ct *b, llmem_ct *out, bool *taken)
{
    *taken = false;
    if (!v->sum_pending || !(VK_KNOB(v, sum_conv, VK_SUM_CONV_DEFAULT) & VK_SUM_CONV_FOLD))
        return LLMEM_OK;
    sum_held *h = v->sumh;
    uint32_t j;
    if (h->s.m > VK_PRESPLIT_ROWS || !conv_matches(h, view, state, x, w, b, out, &j))
        return LLMEM_OK; /* the conv's own recording records the pass first */
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    h->conv = true;
    h->cv.w = *w;
    h->cv.has_b = b != NULL;
    if (b)
        h->cv.b = *b;
    h->cv.out = *out;
    h->cv.idx = view->idx;
    h->cv.state = rs->state[state];
    h->cv.spec = (uint32_t)(d->shape[0] + 1) | (uint32_t)w->dtype << 4 |
                 (b ? (uint32_t)b->dtype : 3u) << 6 | (uint32_t)d->dtype << 8;
    h->cv.c0 = h->c0[j];
    h->cv.conv_dim = (uint32_t)d->shape[1];
    h->cv.n_slots = (uint32_t)rs->n_slots;
    h->cv.src_word = vk_table_word(&rs->src_slot);
    h->cv.dst_word = vk_table_word(&rs->dst_slot);
    *taken = true;
    return LLMEM_OK;
}

bool vk_sum_norm_ok(vk_backend *v, llmem_ct *x, llmem_ct *r, llmem_ct *out, bool split,
                    size_t split_bytes, bool parts)
{
    if (!v->sum_pending)
        return false;
    sum_held *h = v->sumh;
    if (!(hold_mode(v, h->s.m, h->s.n) & (parts ? 8 : 2)) || h->n_dst != 0 ||
        h->s2.kind != VK_SUM_NONE || tail_split(&h->s) || !is_out(h, r) ||
        !is_out(h, out) || touches(h, x))
        return false;
    /* the norm's terms ([0, split_bytes) of the presplit buffer) must not
     * reach the exponents the norm reads: rows' own e_r (same k) is read
     * before it is written, but not where several workgroups share a row
     * (one writes e_r, the others read it); a different k must keep clear
     * of it */
    return !(split && h->s.te.buf == v->presplit.terms && h->s.te.offset < split_bytes &&
             (parts || h->s.te.offset != split_bytes - (size_t)4 * h->s.m));
}

bool vk_sum_norm_vec4(const vk_backend *v)
{
    const sum_held *h = v->sumh;
    return v->sum_pending && h->s2.kind == VK_SUM_NONE && h->s.ldp % 4 == 0 &&
           h->s.pslice % 4 == 0 &&
           h->s.pt.offset % 16 == 0;
}

bool vk_sum_norm_bind(vk_backend *v, vk_op *op, llmem_ct *x, llmem_ct *r, llmem_ct *out,
                      bool split, size_t split_bytes, bool parts)
{
    if (!vk_sum_norm_ok(v, x, r, out, split, split_bytes, parts))
        return false;
    sum_held *h = v->sumh;
    uint32_t po = vk_op_tensor(v, op, &h->s.pt, false);
    uint32_t eo = vk_op_tensor(v, op, &h->s.te, false);
    vk_op_u32(op, h->s.ldp);
    vk_op_u32(op, h->s.slices);
    vk_op_u32(op, h->s.pslice);
    vk_op_u32(op, po);
    vk_op_u32(op, eo);
    /* taken: the norm's own recording must not record the pass (its
     * buffers stay with the hold until vk_sum_taken) */
    v->sum_pending = false;
    return true;
}

llmem_status vk_sum_add_into(vk_backend *v, llmem_ct *x, llmem_ct *r, llmem_ct *out, bool *added)
{
    *added = false;
    if (!v->sum_pending)
        return LLMEM_OK;
    sum_held *h = v->sumh;
    long mode = hold_mode(v, h->s.m, h->s.n);
    if (!(mode & 4) || h->n_dst != 0 || h->s2.kind != VK_SUM_NONE || !is_out(h, r) ||
        !is_out(h, out) ||
        x->dtype != LLMEM_DTYPE_F32 || x->n_dims != 2 || x->ne[0] != r->ne[0] ||
        x->ne[1] != r->ne[1] || touches(h, x))
        return LLMEM_OK; /* the norm's usual add: vk_sum_norm_bind, or the pass first */
    v->sum_pending = false; /* recorded here, as vk_sum_flush does */
    uint32_t c0 = 0;
    llmem_status st = raw_pass(v, &h->s, 0, x, &c0, true, NULL, false, 0);
    hold_clear(h);
    *added = st == LLMEM_OK;
    return st;
}

uint32_t vk_sum_norm_slices(const vk_backend *v)
{
    const sum_held *h = v->sumh;
    return h && h->s.kind == VK_SUM_RAW && (vk_norm_fold_mode(v) & VK_NORM_FOLD_UNROLL) &&
                   h->s.slices <= VK_NORM_FOLD_SLICES
               ? h->s.slices
               : 0u;
}

uint32_t vk_sum_norm_wgs(const vk_backend *v, int64_t rows, llmem_ct *r)
{
    const sum_held *h = v->sumh;
    if (v->knobs.norm_fold_wgs <= 0 || !v->sum_pending || h->s2.kind != VK_SUM_NONE || !r ||
        !is_out(h, r) || rows <= VK_MM_MV_MAX || rows > (int64_t)VK_PRESPLIT_ROWS)
        return 0;
    return (uint32_t)v->knobs.norm_fold_wgs;
}

void vk_sum_taken(vk_backend *v)
{
    v->sum_pending = false;
    hold_clear(v->sumh);
}

/* Whether t covers all of u (the same buffer). */
static bool covers(llmem_ct *t, const llmem_tensor *u)
{
    return t->buf == u->buf && t->offset <= u->offset &&
           t->offset + llmem_tensor_nbytes(t) >= u->offset + llmem_tensor_nbytes(u);
}

/* Drops from the held pass the writes t makes dead (the Vulkan side of
 * llmem_op_discard, <llmem/ops_discard.h>; vk_ops_discard.c calls it): see
 * vk_sum.h. */
void vk_sum_drop_dead(vk_backend *v, llmem_ct *t, long mode)
{
    if (mode == 0 || !v->sum_pending)
        return;
    sum_held *h = v->sumh;
    if (h->n_dst == 0 || h->s2.kind != VK_SUM_NONE)
        return;
    if ((mode & VK_DISCARD_OUT) && covers(t, &h->s.out))
        h->out_dead = true;
    for (uint32_t j = 0; j < h->n_dst && (mode & VK_DISCARD_COPY); j++)
        if (covers(t, &h->dst[j]))
            h->dst_dead |= 1u << j;
}

/* ---- the residual's copies ------------------------------------------------------------------ */

struct vk_resid {
    llmem_backend *be;
    llmem_buffer *copy[2];
    int held;             /* the copy that holds x while x.valid */
    vk_kept_range x;      /* x's device range */
    int64_t rows, cols;
};

static bool resid_fits(llmem_ct *x)
{
    return x->dtype == LLMEM_DTYPE_F32 && x->n_dims == 2 && x->ne[0] >= 1 &&
           x->ne[0] <= (int64_t)VK_RESID_ROWS && x->ne[1] >= 1 &&
           x->ne[1] <= (int64_t)VK_RESID_COLS;
}

bool vk_resid_src(vk_backend *v, llmem_ct *x, llmem_tensor *src)
{
    const struct vk_resid *c = v->resid;
    if (!c || !resid_fits(x) || x->ne[0] != c->rows || x->ne[1] != c->cols ||
        !vk_kept_is(&c->x, x))
        return false;
    *src = llmem_tensor_2d(c->copy[c->held], 0, LLMEM_DTYPE_F32, x->ne[0], x->ne[1]);
    return true;
}

llmem_status vk_resid_dst(llmem_backend *be, vk_backend *v, llmem_ct *x, llmem_tensor *dst)
{
    if (!resid_fits(x))
        return LLMEM_E_INVALID;
    if (!v->resid) {
        if (!(v->resid = calloc(1, sizeof *v->resid)))
            return LLMEM_E_NO_MEMORY;
        v->resid->be = be;
    }
    struct vk_resid *c = v->resid;
    int k = c->x.valid && c->held == 0 ? 1 : 0;
    if (!c->copy[k]) {
        size_t bytes = (size_t)4 * VK_RESID_ROWS * VK_RESID_COLS;
        llmem_status st = vk_buffer_alloc(be, bytes, &c->copy[k]);
        if (st != LLMEM_OK) {
            c->copy[k] = NULL;
            return st;
        }
        c->copy[k]->size = bytes;
    }
    *dst = llmem_tensor_2d(c->copy[k], 0, LLMEM_DTYPE_F32, x->ne[0], x->ne[1]);
    return LLMEM_OK;
}

void vk_resid_set(vk_backend *v, llmem_ct *x, const llmem_tensor *dst)
{
    struct vk_resid *c = v->resid;
    vk_kept_set(&c->x, x);
    c->held = dst->buf == c->copy[0] ? 0 : 1;
    c->rows = x->ne[0];
    c->cols = x->ne[1];
}

void vk_resid_written(vk_backend *v, const vk_access *acc, uint32_t n)
{
    if (v->resid)
        vk_kept_written(&v->resid->x, acc, n);
}

void vk_resid_drop(vk_backend *v)
{
    if (v->resid)
        v->resid->x.valid = false;
}

void vk_sum_finish(vk_backend *v)
{
    vk_sum_flush(v); /* recorded; vk_cmd_finish submits it */
    free(v->sumh);
    v->sumh = NULL;
    struct vk_resid *c = v->resid;
    if (c) {
        for (int k = 0; k < 2; k++)
            if (c->copy[k])
                vk_buffer_free(c->be, c->copy[k]);
        free(c);
        v->resid = NULL;
    }
}

/* The SwiGLU's pair planned as one wave ($LLMEM_VULKAN_PAIR_PLAN, unset: VK_PAIR_PLAN_DEFAULT;
 * issue 12). At 33-64 rows in fast mode the FFN's up and gate products (vk_sum_park: nothing
 * orders them) were each split into a wave (9B: 56 tiles x 2 slices, 112 of 132 SMs): two
 * waves of 32-step workgroups for the pair, each paying a workgroup's start and end. Each
 * planned into half the wave (9B: 1 slice), the pair is one wave of 64-step workgroups.
 * Nothing says at up that gate follows, so the backend remembers the weights of each
 * product a second one paired with (vk_pair_learn) and plans that product as a first the next
 * time (a decode step runs eagerly before it is recorded); the second is planned so where
 * it parks the first's sum and the first was. A first whose second does not come ran at
 * half the wave: slower, never wrong. Fast mode only (precise bits kept); narrow plans (2b)
 * keep theirs (vk_ops_matmul.c cm_product_as, CM_PAIR_PLAN). */
static bool pair_w_eq(const struct vk_pair_w *a, const struct vk_pair_w *b)
{
    return a->buf == b->buf && a->off == b->off && a->n == b->n && a->k == b->k;
}

/* Whether the product before (v->pair_last) had m rows and w's shape: the first of a pair
 * whose second w is. */
static bool pair_last_fits(const vk_backend *v, const struct vk_pair_w *w, uint32_t m)
{
    return v->pair_last.m == m && v->pair_last.w.n == w->n && v->pair_last.w.k == w->k;
}

/* Whether w is remembered as the first of a pair (vk_pair_learn). */
static bool pair_first_known(const vk_backend *v, const struct vk_pair_w *w)
{
    for (uint32_t i = 0; i < v->pair_n; i++)
        if (pair_w_eq(&v->pair_first[i], w))
            return true;
    return false;
}

bool vk_pair_plan(const vk_backend *v, const struct vk_pair_w *w, uint32_t m, uint32_t split,
                  bool parked)
{
    if (VK_KNOB(v, pair_plan, VK_PAIR_PLAN_DEFAULT) != 1 || split != 1 || m < VK_CM_MID_ROWS ||
        m > 64)
        return false;
    if (parked) /* the second: where the first (the product just before) was planned so */
        return v->pair_last.planned && pair_last_fits(v, w, m);
    return pair_first_known(v, w);
}

void vk_pair_learn(vk_backend *v, const struct vk_pair_w *w, uint32_t m, bool parked,
                   bool planned)
{
    const struct vk_pair_w *f = &v->pair_last.w;
    if (parked && f->buf && pair_last_fits(v, w, m) && !pair_first_known(v, f) &&
        v->pair_n < VK_PAIR_FIRST_MAX)
        v->pair_first[v->pair_n++] = *f;
    v->pair_last = (struct vk_pair_last){*w, m, planned && !parked};
}

void vk_pair_forget(vk_backend *v, const llmem_buffer *buf)
{
    for (uint32_t i = 0; i < v->pair_n;) {
        if (v->pair_first[i].buf == buf)
            v->pair_first[i] = v->pair_first[--v->pair_n];
        else
            i++;
    }
    if (v->pair_last.w.buf == buf)
        v->pair_last = (struct vk_pair_last){0};
}

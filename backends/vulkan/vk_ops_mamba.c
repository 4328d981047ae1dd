/* llmem Vulkan backend: the Mamba-2 ops, causal conv1d with conv state and
 * the selective scan with ssm state (shaders/ssm_conv.comp,
 * shaders/ssm_scan.comp), both with state slots and checkpoints from a
 * recurrent view (and the snapshot inside the ubatch, snap_tok /
 * snap_slot, in the shaders that take several tokens: vk_rs_snap_words).
 * Semantics: HF transformers Mamba2Mixer.torch_forward
 * applied token by token, the recurrent form of Mamba-2's SSD (Dao & Gu,
 * ICML 2024, Sec. 3); the CPU reference is backends/cpu/ops_mamba.c.
 *
 * Slot discipline. Each invocation reads its part of the source slot before
 * writing its part of any destination, so a stream's own slots may alias.
 * When a stream's source slot is written by another stream (copy-on-write
 * of a shared state, seen in the host copies of the tables), a
 * state_gather dispatch first copies every stream's source into an f32
 * scratch snapshot, and the op reads the snapshot.
 */
#include <stdlib.h>
#include <string.h>

#include "llmem/view.h"
#include "vk_internal.h"
#include "vk_rs.h"
#include "vk_sum.h"

#define CONV_WG 128
#define SCAN_WG 64
#define SCAN_DEC_WG 256  /* ssm_scan_decode.comp: d_state / 4 lanes per state row */
#define SCAN_DEC_RPI 4   /* its state rows per item */
#define SCAN_DEC_IPG 8   /* at most this many items per lane group */
/* ... while the grid keeps at least vk_scan_dec_wgs(units) workgroups (1024 at 132) */
#define GATHER_WG 256

static int64_t state_elems(const llmem_state_desc *d)
{
    int64_t n = 1;
    for (int32_t i = 0; i < d->n_dims; i++)
        n *= d->shape[i];
    return n;
}

llmem_status vk_rs_needs_snapshot(const llmem_rs_view *rs, bool *out)
{
    *out = false;
    int32_t *writer = malloc((size_t)rs->n_slots * sizeof *writer);
    if (!writer)
        return LLMEM_E_NO_MEMORY;
    for (int32_t i = 0; i < rs->n_slots; i++)
        writer[i] = -1;
    for (int32_t s = 0; s < rs->n_seqs; s++) {
        for (int32_t c = -1; c < rs->n_ckpt; c++) {
            int32_t slot = c < 0 ? rs->dst_slot.host[s]
                                 : rs->ckpt_slot.host[(int64_t)s * rs->n_ckpt + c];
            if (slot >= 0 && slot < rs->n_slots)
                writer[slot] = s;
        }
    }
    for (int32_t s = 0; s < rs->n_seqs && !*out; s++) {
        int32_t src = rs->src_slot.host[s];
        *out = src >= 0 && src < rs->n_slots && writer[src] >= 0 && writer[src] != s;
    }
    free(writer);
    return LLMEM_OK;
}

void vk_rs_bind(vk_backend *v, vk_op *op, const llmem_view *view, int32_t state,
                const vk_alloc *snap)
{
    vk_op_buffer(v, op, view->idx, false);
    vk_op_buffer(v, op, llmem_view_rs(view)->state[state], true);
    if (snap)
        vk_op_alloc(v, op, snap, false);
    else
        vk_op_dummy(v, op);
}

void vk_rs_tables(vk_op *op, const llmem_rs_view *rs)
{
    vk_op_u32(op, vk_table_word(&rs->src_slot));
    vk_op_u32(op, vk_table_word(&rs->dst_slot));
    vk_op_u32(op, vk_table_word(&rs->ckpt_slot));
}

void vk_rs_snap_words(vk_op *op, const llmem_view *view)
{
    /* none without a snapshot slot, so in no one-token view (a snapshot
     * lies before the last token): a recorded decode step (vk_record.c)
     * reads no snapshot table, whose offsets are not part of its key
     * (models/decode_graph.c) */
    const llmem_rs_view *sn = llmem_rs_view_snap_used(view);
    vk_op_u32(op, sn ? vk_table_word(&sn->snap_tok) : 0xffffffffu);
    vk_op_u32(op, sn ? vk_table_word(&sn->snap_slot) : 0xffffffffu);
}


/* Records the gather of every stream's source state into a new f32
 * scratch allocation (*snap); released by the caller after recording the
 * op that reads it (the hazard tracker orders any later reuse). */
static llmem_status gather(vk_backend *v, const llmem_view *view, int32_t state, vk_alloc *snap)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    uint64_t elems = (uint64_t)state_elems(d), n = elems * (uint64_t)rs->n_seqs;
    llmem_status st = vk_alloc_make(v, n * 4, snap);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    vk_op_init(&op, VK_SH_STATE_GATHER, GATHER_WG);
    vk_op_spec(&op, (uint32_t)d->dtype);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_buffer(v, &op, rs->state[state], false);
    vk_op_alloc(v, &op, snap, true);
    vk_op_u32(&op, (uint32_t)rs->n_seqs);
    vk_op_u32(&op, (uint32_t)elems);
    vk_op_u32(&op, (uint32_t)rs->n_slots);
    vk_op_u32(&op, vk_table_word(&rs->src_slot));
    st = vk_op_run(v, &op, vk_div_up(n, GATHER_WG));
    if (st != LLMEM_OK)
        vk_alloc_release(v, snap);
    return st;
}

llmem_status vk_rs_prepare(vk_backend *v, const llmem_view *view, int32_t state,
                           vk_alloc *snap, bool *use_snap)
{
    llmem_status st = vk_rs_needs_snapshot(llmem_view_rs(view), use_snap);
    if (st != LLMEM_OK || !*use_snap)
        return st;
    return gather(v, view, state, snap);
}

llmem_status vk_rs_conv(vk_backend *v, vk_shader_id shader, const llmem_view *view,
                        int32_t state, llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    return vk_rs_conv_blocks(v, shader, CONV_WG, 0, view, state, x, w, b, out);
}

/* Fills *op with vk_rs_conv_blocks's dispatch (snap: the sources'
 * snapshot, or NULL) and *groups with its workgroup count; records nothing
 * (the caller runs or drops *op with vk_op_run). */
static void conv_build(vk_backend *v, vk_shader_id shader, uint32_t wg, uint32_t tb,
                       const llmem_view *view, int32_t state, const vk_alloc *snap, llmem_ct *x,
                       llmem_ct *w, llmem_ct *b, llmem_ct *out, vk_op *op, uint64_t *groups)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    uint32_t d_conv = (uint32_t)d->shape[0] + 1, conv_dim = (uint32_t)d->shape[1];
    uint32_t n_blocks = tb > 0 ? (uint32_t)vk_div_up((uint64_t)rs->n_seq_tokens, tb) : 1;
    vk_op_init(op, shader, wg);
    vk_op_spec(op, d_conv);
    vk_op_spec(op, (uint32_t)w->dtype);
    vk_op_spec(op, b ? (uint32_t)b->dtype : 3u);
    vk_op_spec(op, (uint32_t)d->dtype);
    vk_op_spec(op, snap != NULL);
    if (tb > 0)
        vk_op_spec(op, tb);
    /* SNAPSHOT: ssm_conv, ssm_conv_pre, short_conv */
    vk_op_spec(op, llmem_rs_view_snap_used(view) != NULL);
    uint32_t xo = vk_op_tensor(v, op, x, false);
    uint32_t wo = vk_op_tensor(v, op, w, false);
    uint32_t bo = vk_op_tensor(v, op, b, false);
    uint32_t oo = vk_op_tensor(v, op, out, true);
    vk_rs_bind(v, op, view, state, snap);
    vk_op_u32(op, (uint32_t)rs->n_seqs);
    vk_op_u32(op, (uint32_t)rs->n_seq_tokens);
    vk_op_u32(op, conv_dim);
    vk_op_u32(op, (uint32_t)rs->n_ckpt);
    vk_op_u32(op, (uint32_t)rs->n_slots);
    vk_op_u32(op, xo);
    vk_op_u32(op, wo);
    vk_op_u32(op, bo);
    vk_op_u32(op, oo);
    vk_rs_tables(op, rs);
    if (tb > 0)
        vk_op_u32(op, n_blocks);
    vk_rs_snap_words(op, view);
    *groups = vk_div_up((uint64_t)rs->n_seqs * n_blocks * conv_dim, wg);
}

llmem_status vk_rs_conv_blocks(vk_backend *v, vk_shader_id shader, uint32_t wg, uint32_t tb,
                               const llmem_view *view, int32_t state, llmem_ct *x, llmem_ct *w,
                               llmem_ct *b, llmem_ct *out)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    if (tb > 0 && (uint32_t)d->shape[0] > tb)
        return LLMEM_E_UNSUPPORTED;
    vk_alloc snap = {0};
    bool use_snap = false;
    llmem_status st = vk_rs_prepare(v, view, state, &snap, &use_snap);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    uint64_t groups;
    conv_build(v, shader, wg, tb, view, state, use_snap ? &snap : NULL, x, w, b, out, &op, &groups);
    st = vk_op_run(v, &op, groups);
    if (use_snap)
        vk_alloc_release(v, &snap);
    return st;
}

/* ---- the decode conv folded into the decode scan (vk_internal.h) ---------------------------- */

#define FOLD_CNT 65536 /* arrival counters: streams x groups of one folded scan, at most */

/* The conv held back (v->fold_pending): its dispatch alone, and what the
 * folded scan needs of it. */
typedef struct vk_conv_fold {
    vk_op op;       /* the conv alone, ready to record */
    uint64_t groups;
    llmem_tensor x, w, b, out;
    bool has_b;
    llmem_buffer *idx, *state; /* the view's index buffer and conv state buffer */
    uint32_t dc, conv_dim, st_dt, n_seqs, src_word, dst_word;
    llmem_buffer *cnt; /* FOLD_CNT words, zero between dispatches; made on first use */
} vk_conv_fold;

/* Off unless $LLMEM_VULKAN_CONV_FOLD=1: measured slower on the H200 (2b
 * shape precise tg128, batch 1 2.819 -> 2.843-2.850 ms, batch 64 10.18 ->
 * 11.42; the folded scan takes 14.75 us a call at batch 1 against 7.1 +
 * 5.7 for the two dispatches: its conv loads and the arrival counters add
 * dependent memory round trips to every workgroup; docs/benchmarks.md,
 * "Decode tiles as KHR cooperative matrices, the decode conv in the scan"). */
void vk_conv_fold_config(vk_backend *v)
{
    const char *e = getenv("LLMEM_VULKAN_CONV_FOLD");
    v->fold = e && strcmp(e, "1") == 0 ? calloc(1, sizeof *v->fold) : NULL;
    v->fold_pending = false;
}

void vk_conv_fold_finish(llmem_backend *be, vk_backend *v)
{
    if (!v->fold)
        return;
    vk_conv_fold_flush(v); /* a held conv is recorded, and submitted with the rest at close */
    if (v->fold->cnt)
        vk_buffer_free(be, v->fold->cnt);
    free(v->fold);
    v->fold = NULL;
}

llmem_status vk_conv_fold_flush(vk_backend *v)
{
    if (!v->fold_pending)
        return LLMEM_OK;
    v->fold_pending = false; /* first: recording it tracks, which calls back here */
    return vk_op_run(v, &v->fold->op, v->fold->groups);
}

static bool dt_2bit(llmem_dtype t)
{
    return t == LLMEM_DTYPE_F32 || t == LLMEM_DTYPE_F16 || t == LLMEM_DTYPE_BF16;
}

/* Holds back a one-token conv for the scan (vk_internal.h): only without
 * checkpoints, with no snapshot needed, f32 x and out, and dtypes and
 * d_conv that ssm_scan_decode.comp's CONV constant can carry. *held says
 * whether it did (else the caller records the conv as usual). */
static llmem_status conv_hold(llmem_backend *be, vk_backend *v, const llmem_view *view,
                              int32_t state, llmem_ct *x, llmem_ct *w, llmem_ct *b,
                              llmem_ct *out, bool *held)
{
    *held = false;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    vk_conv_fold *f = v->fold;
    if (!f || rs->n_seq_tokens != 1 || rs->n_ckpt != 0 || d->n_dims != 2 ||
        d->shape[0] < 1 || d->shape[0] > 14 || !dt_2bit(d->dtype) || !dt_2bit(w->dtype) ||
        (b && !dt_2bit(b->dtype)) || x->dtype != LLMEM_DTYPE_F32 ||
        out->dtype != LLMEM_DTYPE_F32)
        return LLMEM_OK;
    bool snap = false;
    llmem_status st = vk_rs_needs_snapshot(rs, &snap);
    if (st != LLMEM_OK || snap)
        return st;
    if ((st = vk_conv_fold_flush(v)) != LLMEM_OK) /* an earlier one, not taken */
        return st;
    if (!f->cnt) {
        llmem_buffer *c = NULL;
        if ((st = vk_buffer_alloc(be, FOLD_CNT * 4, &c)) != LLMEM_OK)
            return st == LLMEM_E_NO_MEMORY ? LLMEM_OK : st; /* no fold without them */
        c->size = FOLD_CNT * 4;
        if ((st = vk_buffer_fill(be, c, 0, c->size, 0)) != LLMEM_OK) {
            vk_buffer_free(be, c);
            return st;
        }
        f->cnt = c;
    }
    /* an open command buffer keeps the allocator from destroying a block the
     * held conv binds (vk_alloc_release trims only when nothing is recorded);
     * the submit that ends it records the conv first (vk_cmd_flush) */
    if ((st = vk_cmd_begin(v)) != LLMEM_OK)
        return st;
    conv_build(v, VK_SH_SSM_CONV, CONV_WG, 0, view, state, NULL, x, w, b, out, &f->op, &f->groups);
    f->x = *x;
    f->w = *w;
    f->has_b = b != NULL;
    if (b)
        f->b = *b;
    f->out = *out;
    f->idx = view->idx;
    f->state = rs->state[state];
    f->dc = (uint32_t)d->shape[0] + 1;
    f->conv_dim = (uint32_t)d->shape[1];
    f->st_dt = (uint32_t)d->dtype;
    f->n_seqs = (uint32_t)rs->n_seqs;
    f->src_word = vk_table_word(&rs->src_slot);
    f->dst_word = vk_table_word(&rs->dst_slot);
    v->fold_pending = true;
    *held = true;
    return LLMEM_OK;
}

/* Whether the held conv is the one whose output xbc is, for a decode scan
 * of view writing y: same streams and tables, y and the conv's output in
 * one buffer without overlap (ssm_scan_decode.comp writes both through
 * one binding), few enough arrival counters. */
static bool fold_matches(const vk_backend *v, const llmem_ssm_params *p, const llmem_view *view,
                         llmem_ct *xbc, llmem_ct *y)
{
    const vk_conv_fold *f = v->fold;
    const llmem_rs_view *rs = llmem_view_rs(view);
    if (!v->fold_pending || !f->cnt)
        return false;
    size_t ob = (size_t)f->n_seqs * f->conv_dim * 4, yb = llmem_tensor_nbytes(y);
    uint64_t conv_dim = (uint64_t)p->n_heads * p->head_dim + 2ull * p->n_groups * p->d_state;
    return xbc->buf == f->out.buf && xbc->offset == f->out.offset &&
           xbc->dtype == LLMEM_DTYPE_F32 && view->idx == f->idx &&
           (uint32_t)rs->n_seqs == f->n_seqs && conv_dim == f->conv_dim &&
           vk_table_word(&rs->src_slot) == f->src_word &&
           vk_table_word(&rs->dst_slot) == f->dst_word && y->buf == f->out.buf &&
           y->dtype == LLMEM_DTYPE_F32 && llmem_tensor_nbytes(&f->out) >= ob &&
           (y->offset + yb <= f->out.offset || f->out.offset + ob <= y->offset) &&
           (uint64_t)rs->n_seqs * p->n_groups <= FOLD_CNT;
}

llmem_status vk_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state, llmem_ct *x,
                            llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    /* The fused one-token paths (the conv in in_proj's epilogue, the conv
     * held for the decode scan) write no snapshot. They take one-token
     * views only, which never have one (a snapshot lies before a stream's
     * last token, base/view.c); a view with one skips them all the same. */
    bool snap = llmem_rs_view_snap_used(view) != NULL;
    bool taken = false; /* one token: in the epilogue of the product that made x */
    llmem_status ts =
        snap ? vk_nm_conv_flush(v) : vk_nm_conv_take(v, view, state, x, w, b, out, &taken);
    if (ts != LLMEM_OK || taken)
        return ts;
    /* 9-64 streams of one token: in the held split-K sum of the product
     * that made x (vk_sum.h) */
    ts = vk_sum_take_conv(v, view, state, x, w, b, out, &taken);
    if (ts != LLMEM_OK || taken)
        return ts;
    if (vk_conv_pre_takes(v, view, state)) /* prefill: vk_ops_scan_pre.c */
        return vk_conv_pre(v, view, state, x, w, b, out);
    bool held = false; /* one token: held back for the decode scan (vk_conv_fold_flush) */
    llmem_status st = snap ? LLMEM_OK : conv_hold(be, v, view, state, x, w, b, out, &held);
    if (st != LLMEM_OK || held)
        return st;
    return vk_rs_conv(v, VK_SH_SSM_CONV, view, state, x, w, b, out);
}

/* The scan path variables, read once when the backend opens (for before/after
 * measurements): LLMEM_VULKAN_SCAN_OLD keeps the row-per-invocation shader for
 * one-token scans; for the decode shader LLMEM_VULKAN_SCAN_RPI (1..8) sets the
 * state rows per item, LLMEM_VULKAN_SCAN_IPG (1..64) the most items per lane
 * group, LLMEM_VULKAN_SCAN_WGS (1..65536) the fewest workgroups the grid keeps
 * (unset: vk_scan_dec_wgs of the compute units, v->mm.n_sm)
 * and LLMEM_VULKAN_SCAN_WG (64, 128, 256, 512) the workgroup size. Also
 * LLMEM_VULKAN_NORM_LOOP=1: the RMS norms (vk_ops_basic.c) loop over a row
 * twice instead of keeping it in registers. The prefill scan's
 * (vk_ops_scan_pre.c): LLMEM_VULKAN_SCAN_PRE=0 turns it off,
 * LLMEM_VULKAN_SCAN_PRE_RPL (1..8), _T (1..64) and _WG (32..1024) fix its rows
 * per lane group, tokens per block and invocations, _WIDE=0 keeps the
 * default layout where the grid is small, LLMEM_VULKAN_SCAN_PRE_VAR=rolled|nopf
 * picks a variant (docs/vulkan.md). */
void vk_scan_config(vk_backend *v)
{
    const char *pre = getenv("LLMEM_VULKAN_SCAN_PRE"), *var = getenv("LLMEM_VULKAN_SCAN_PRE_VAR");
    v->scan.pre = !pre || strcmp(pre, "0") != 0;
    v->scan.pre_rpl = vk_env_u32("LLMEM_VULKAN_SCAN_PRE_RPL", 0, 1, 8);
    v->scan.pre_t = vk_env_u32("LLMEM_VULKAN_SCAN_PRE_T", 0, 1, 64);
    v->scan.pre_wg = vk_env_u32("LLMEM_VULKAN_SCAN_PRE_WG", 0, 32, 1024);
    v->scan.pre_wide = vk_env_u32("LLMEM_VULKAN_SCAN_PRE_WIDE", 1, 0, 1) != 0;
    v->scan.pre_shader = var && !strcmp(var, "rolled") ? VK_SH_SSM_SCAN_PRE_ROLLED
                         : var && !strcmp(var, "nopf") ? VK_SH_SSM_SCAN_PRE_NOPF
                                                       : VK_SH_SSM_SCAN_PRE;
    v->scan.old = getenv("LLMEM_VULKAN_SCAN_OLD") != NULL;
    v->scan.rpi = vk_env_u32("LLMEM_VULKAN_SCAN_RPI", SCAN_DEC_RPI, 1, 8);
    v->scan.ipg = vk_env_u32("LLMEM_VULKAN_SCAN_IPG", SCAN_DEC_IPG, 1, 64);
    v->scan.wgs = vk_env_u32("LLMEM_VULKAN_SCAN_WGS", 0, 1, 65536); /* 0: by the units */
    v->scan.wg = vk_env_u32("LLMEM_VULKAN_SCAN_WG", SCAN_DEC_WG, 64, 512);
    if (v->scan.wg & (v->scan.wg - 1))
        v->scan.wg = SCAN_DEC_WG;
    v->scan.norm_loop = getenv("LLMEM_VULKAN_NORM_LOOP") != NULL;
}

llmem_status vk_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p, const llmem_view *view,
                            int32_t state, llmem_ct *xbc, llmem_ct *dt, llmem_ct *a_log,
                            llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y)
{
    vk_backend *v = vk_from(be);
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    /* the held-back conv (vk_conv_fold_flush) folds in only where this
     * scan takes the decode shader without a source copy (and without a
     * snapshot inside the ubatch, which the decode shader does not write);
     * else it goes first */
    bool fold = v->fold_pending && sd->dtype != LLMEM_DTYPE_I8 && !llmem_rs_view_snap_used(view) &&
                fold_matches(v, p, view, xbc, y);
    if (fold) {
        bool snap = false;
        llmem_status st = vk_rs_needs_snapshot(rs, &snap);
        if (st != LLMEM_OK)
            return st;
        fold = !snap;
    }
    if (v->fold_pending && !fold) {
        llmem_status st = vk_conv_fold_flush(v);
        if (st != LLMEM_OK)
            return st;
    }
    if (sd->dtype == LLMEM_DTYPE_I8) /* int8 states: vk_ops_quant.c */
        return vk_op_ssm_scan_q(be, p, view, state, xbc, dt, a_log, d, dt_bias, y);
    uint32_t n_chunks = (uint32_t)vk_div_up((uint64_t)p->head_dim, SCAN_WG);
    /* one token, no checkpoints (so no snapshot inside the ubatch either):
     * lanes over d_state (ssm_scan_decode.comp), unless v->scan.old */
    uint32_t lanes = (uint32_t)p->d_state / 4, wg = v->scan.wg;
    bool dec = rs->n_seq_tokens == 1 && rs->n_ckpt == 0 && p->d_state % 4 == 0 &&
               lanes >= 1 && lanes <= wg && !v->scan.old;
    if (!dec && vk_scan_pre_takes(v, p, rs)) /* prefill: vk_ops_scan_pre.c */
        return vk_scan_pre(v, p, view, state, xbc, dt, a_log, d, dt_bias, y);
    /* items of rpi rows inside one head; as many items per lane group as
     * keep the grid at v->scan.wgs workgroups or more, at most v->scan.ipg */
    uint32_t rpi = v->scan.rpi;
    while (p->head_dim % (int32_t)rpi)
        rpi--;
    uint64_t rows = (uint64_t)rs->n_seqs * p->n_heads * p->head_dim;
    uint64_t groups = dec ? wg / lanes : 1, items = rows / rpi;
    uint64_t wgs = v->scan.wgs ? v->scan.wgs : vk_scan_dec_wgs(v->mm.n_sm);
    uint64_t ipg = items / (groups * wgs);
    ipg = ipg < 1 ? 1 : ipg > v->scan.ipg ? v->scan.ipg : ipg;
    vk_scan_launch l = {.shader = VK_SH_SSM_SCAN, .wg = SCAN_WG, .n_chunks = n_chunks,
                        .groups = (uint64_t)rs->n_seqs * p->n_heads * n_chunks};
    if (dec) {
        l.shader = v->subgroup ? VK_SH_SSM_SCAN_DEC_SG : VK_SH_SSM_SCAN_DEC;
        l.wg = wg;
        l.spec[l.n_spec++] = rpi;
        l.spec[l.n_spec++] = (uint32_t)ipg;
        l.groups = vk_div_up(items, groups * ipg);
    }
    if (fold && !dec) {
        llmem_status st = vk_conv_fold_flush(v);
        if (st != LLMEM_OK)
            return st;
        fold = false;
    }
    if (fold) { /* taken: the scan records the conv's work too */
        vk_conv_fold *f = v->fold;
        v->fold_pending = false;
        vk_op_run(v, &f->op, 0); /* gives its temporaries back */
        l.fold = f;
    }
    return vk_rs_scan(v, &l, p, view, state, xbc, dt, a_log, d, dt_bias, y);
}

llmem_status vk_rs_scan(vk_backend *v, const vk_scan_launch *l, const llmem_ssm_params *p,
                        const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                        llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *sd = &rs->desc[state];
    vk_alloc snap = {0};
    bool use_snap = false;
    llmem_status st = vk_rs_prepare(v, view, state, &snap, &use_snap);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    vk_op_init(&op, l->shader, l->wg);
    vk_op_spec(&op, (uint32_t)p->d_state);
    vk_op_spec(&op, (uint32_t)sd->dtype);
    vk_op_spec(&op, (uint32_t)a_log->dtype);
    vk_op_spec(&op, d ? (uint32_t)d->dtype : 3u);
    vk_op_spec(&op, dt_bias ? (uint32_t)dt_bias->dtype : 3u);
    vk_op_spec(&op, use_snap);
    for (uint32_t k = 0; k < l->n_spec; k++)
        vk_op_spec(&op, l->spec[k]);
    /* ssm_scan.comp and ssm_scan_pre.comp: SNAPSHOT, two more push words */
    bool snap_words = l->shader != VK_SH_SSM_SCAN_DEC && l->shader != VK_SH_SSM_SCAN_DEC_SG;
    if (snap_words)
        vk_op_spec(&op, llmem_rs_view_snap_used(view) != NULL);
    const vk_conv_fold *f = l->fold;
    if (f) /* ssm_scan_decode.comp's CONV */
        vk_op_spec(&op, f->dc | (uint32_t)f->w.dtype << 4 |
                            (f->has_b ? (uint32_t)f->b.dtype : 3u) << 6 | f->st_dt << 8);
    /* with the fold, xbc is the conv's input, and y and the conv's output
     * share binding 5 (one range of their buffer: fold_matches) */
    uint32_t xo = vk_op_tensor(v, &op, f ? &f->x : xbc, false);
    uint32_t dto = vk_op_tensor(v, &op, dt, false);
    uint32_t ao = vk_op_tensor(v, &op, a_log, false);
    uint32_t d_o = vk_op_tensor(v, &op, d, false);
    uint32_t bo = vk_op_tensor(v, &op, dt_bias, false);
    uint32_t yo, co = 0;
    if (f) {
        size_t ob = (size_t)f->n_seqs * f->conv_dim * 4, yb = llmem_tensor_nbytes(y);
        size_t lo = y->offset < f->out.offset ? y->offset : f->out.offset;
        size_t hi = y->offset + yb > f->out.offset + ob ? y->offset + yb : f->out.offset + ob;
        llmem_tensor u = llmem_tensor_1d(y->buf, lo, LLMEM_DTYPE_F32, (int64_t)((hi - lo) / 4));
        uint32_t uo = vk_op_tensor(v, &op, &u, true);
        yo = uo + (uint32_t)((y->offset - lo) / 4);
        co = uo + (uint32_t)((f->out.offset - lo) / 4);
    } else {
        yo = vk_op_tensor(v, &op, y, true);
    }
    if (f) {
        vk_op_buffer(v, &op, view->idx, false);
        vk_op_buffer(v, &op, llmem_view_rs(view)->state[state], true);
        vk_op_buffer(v, &op, f->cnt, true);
    } else {
        vk_rs_bind(v, &op, view, state, use_snap ? &snap : NULL);
    }
    uint32_t cwo = f ? vk_op_tensor(v, &op, &f->w, false) : 0;
    uint32_t cbo = f ? vk_op_tensor(v, &op, f->has_b ? &f->b : NULL, false) : 0;
    if (f)
        vk_op_buffer(v, &op, f->state, true);
    vk_op_u32(&op, (uint32_t)rs->n_seqs);
    vk_op_u32(&op, (uint32_t)rs->n_seq_tokens);
    vk_op_u32(&op, (uint32_t)p->n_heads);
    vk_op_u32(&op, (uint32_t)p->head_dim);
    vk_op_u32(&op, (uint32_t)p->n_groups);
    vk_op_u32(&op, (uint32_t)rs->n_ckpt);
    vk_op_u32(&op, (uint32_t)rs->n_slots);
    vk_op_u32(&op, l->n_chunks);
    vk_op_f32(&op, p->dt_min);
    vk_op_f32(&op, p->dt_max);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, dto);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, d_o);
    vk_op_u32(&op, bo);
    vk_op_u32(&op, yo);
    vk_rs_tables(&op, rs);
    /* conv_dim from the params: xbc may be given as [T, ...] flattening to it */
    vk_op_u32(&op, (uint32_t)(p->n_heads * p->head_dim + 2 * p->n_groups * p->d_state));
    if (snap_words)
        vk_rs_snap_words(&op, view);
    if (f) {
        vk_op_u32(&op, cwo);
        vk_op_u32(&op, cbo);
        vk_op_u32(&op, co);
        vk_op_u32(&op, 0); /* counters from word 0: every folded scan returns them to zero */
    }
    st = vk_op_run(v, &op, l->groups);
    if (use_snap)
        vk_alloc_release(v, &snap);
    return st;
}

/* llmem cuda plugin: the Mamba-2 slots of the ops table (ssm_conv,
 * ssm_scan; kernels/mamba.cu, and kernels/ssd.cu for the chunked prefill
 * scan) and the recurrent-view helpers every recurrent op shares
 * (cuda_rs_prepare, cuda_rs_need_snapshot, cuda_scan_args). The wrappers
 * of backends/ops.c have checked every argument. Mamba-2: Dao & Gu 2024. */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_ops_quant.h"
#include "kernels/kernels.h"
#include "kernels/ssd.h"
#include "llmem/view.h"

llmem_status cuda_rs_need_snapshot(const llmem_rs_view *v, bool *need)
{
    *need = false;
    if (v->n_seqs == 0)
        return LLMEM_OK;
    int32_t *writer = malloc((size_t)v->n_slots * sizeof *writer);
    if (!writer)
        return LLMEM_E_NO_MEMORY;
    for (int32_t i = 0; i < v->n_slots; i++)
        writer[i] = -1;
    for (int32_t s = 0; s < v->n_seqs; s++) {
        int32_t sl = v->dst_slot.host[s];
        if (sl >= 0)
            writer[sl] = s;
        for (int32_t c = 0; c < v->n_ckpt; c++) {
            sl = v->ckpt_slot.host[(int64_t)s * v->n_ckpt + c];
            if (sl >= 0)
                writer[sl] = s;
        }
    }
    for (int32_t s = 0; s < v->n_seqs && !*need; s++) {
        int32_t sl = v->src_slot.host[s];
        *need = sl >= 0 && writer[sl] >= 0 && writer[sl] != s;
    }
    free(writer);
    return LLMEM_OK;
}

/* Fills the slot arguments of state `state` (with the snapshot tables
 * when the view has a snapshot inside the ubatch: llmem_op_check_view
 * refused it to the ops that write none) and, when some
 * stream reads a slot another stream writes, copies every source into
 * scratch first (a snapshot's slot is nobody's source, base/view.c). */
llmem_status cuda_rs_prepare(cuda_backend *cb, const llmem_view *view, int32_t state,
                             cuk_rs_args *rs)
{
    const llmem_rs_view *v = llmem_view_rs(view);
    const llmem_state_desc *d = &v->desc[state];
    memset(rs, 0, sizeof *rs);
    rs->state = cuda_dev(v->state[state]);
    rs->dtype = d->dtype;
    rs->elems = 1;
    for (int32_t i = 0; i < d->n_dims; i++)
        rs->elems *= d->shape[i];
    rs->n_slots = v->n_slots;
    rs->n_seqs = v->n_seqs;
    rs->n_seq_tokens = v->n_seq_tokens;
    rs->n_ckpt = v->n_ckpt;
    rs->src = cuda_view_table(view, &v->src_slot);
    rs->dst = cuda_view_table(view, &v->dst_slot);
    rs->ckpt = cuda_view_table(view, &v->ckpt_slot);
    /* the ops that take such a view (llmem_op_check_view), only where some
     * group has a snapshot slot: never in a one-token view (a snapshot lies before the last
     * token), so a recorded decode step (models/decode_graph.c, whose key
     * has no snapshot table) reads none */
    const llmem_rs_view *sn = llmem_rs_view_snap_used(view);
    if (sn) {
        rs->snap_tok = cuda_view_table(view, &sn->snap_tok);
        rs->snap_slot = cuda_view_table(view, &sn->snap_slot);
    }
    bool need;
    llmem_status st = cuda_rs_need_snapshot(v, &need);
    if (st != LLMEM_OK || !need)
        return st;
    void *snap;
    size_t bytes = (size_t)v->n_seqs * (size_t)rs->elems * (d->dtype == LLMEM_DTYPE_F16 || d->dtype == LLMEM_DTYPE_BF16 ? 2u : 4u);
    if ((st = cuda_scratch(cb, bytes, &snap)) != LLMEM_OK)
        return st;
    st = cuda_check(cb, cuk_rs_snapshot(rs, snap, cb->stream), "state snapshot");
    rs->snap = snap;
    return st;
}

llmem_status cuda_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                              llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    const llmem_state_desc *d = &llmem_view_rs(view)->desc[state];
    int32_t d_conv = (int32_t)d->shape[0] + 1, conv_dim = (int32_t)d->shape[1];
    if (d_conv > 16)
        return LLMEM_E_UNSUPPORTED; /* the kernel keeps the window in registers */
    cuk_rs_args rs;
    if ((st = cuda_rs_prepare(cb, view, state, &rs)) != LLMEM_OK)
        return st;
    return cuda_op_done(cb,
                cuk_ssm_conv(&rs, cuda_tensor_ptr(x), cuda_tensor_ptr(w), w->dtype, cuda_tensor_ptr(b), b ? (int)b->dtype : 0,
                             cuda_tensor_ptr(out), conv_dim, d_conv, cb->stream),
                "ssm_conv");
}

cuk_scan_args cuda_scan_args(const llmem_ssm_params *p, llmem_ct *xbc, llmem_ct *dt,
                             llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y)
{
    return (cuk_scan_args){
        .n_heads = p->n_heads,
        .head_dim = p->head_dim,
        .d_state = p->d_state,
        .n_groups = p->n_groups,
        .dt_min = p->dt_min,
        .dt_max = p->dt_max,
        .xbc = cuda_tensor_ptr(xbc),
        .dt = cuda_tensor_ptr(dt),
        .a_log = cuda_tensor_ptr(a_log),
        .d = cuda_tensor_ptr(d),
        .dt_bias = cuda_tensor_ptr(dt_bias),
        .a_dt = a_log->dtype,
        .d_dt = d ? (int32_t)d->dtype : 0,
        .b_dt = dt_bias ? (int32_t)dt_bias->dtype : 0,
        .y = cuda_tensor_ptr(y),
        /* xbc may be [T, ...] flattening to conv_dim columns (<llmem/ops.h>) */
        .conv_dim = p->n_heads * p->head_dim + 2 * p->n_groups * p->d_state,
    };
}

llmem_status cuda_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p,
                              const llmem_view *view, int32_t state, llmem_ct *xbc,
                              llmem_ct *dt, llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias,
                              llmem_ct *y)
{
    if (llmem_view_rs(view)->desc[state].dtype == LLMEM_DTYPE_I8) /* cuda_ops_quant.c */
        return cuda_op_ssm_scan_q(be, p, view, state, xbc, dt, a_log, d, dt_bias, y);
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (!cuk_ssm_scan_supported(p->d_state))
        return LLMEM_E_UNSUPPORTED; /* d_state > 256 */
    cuk_rs_args rs;
    if ((st = cuda_rs_prepare(cb, view, state, &rs)) != LLMEM_OK)
        return st;
    cuk_scan_args sa = cuda_scan_args(p, xbc, dt, a_log, d, dt_bias, y);
    sa.n_sms = cb->n_sms;
    sa.fast = p->fast != 0;
    if (cuk_ssd_applies(&rs, &sa)) /* prefill: chunked SSD, kernels/ssd.cu */
        return cuda_op_done(cb, cuk_ssd_scan(&rs, &sa, cb->stream), "ssm_scan (chunked)");
    return cuda_op_done(cb, cuk_ssm_scan(&rs, &sa, cb->stream), "ssm_scan");
}

/* llmem cuda plugin: llmem_op_ssm_scan over an int8 SSM state with a
 * per-head scale (kernels/mamba_q.cu; issue 17). The wrapper in
 * backends/ops.c has checked every argument. When a stream reads a slot
 * another stream writes (copy-on-write, seen in the host tables), the raw
 * bytes of every source slot are copied to scratch first, so no stream
 * reads a slot after another one has written it. */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_ops_quant.h"
#include "kernels/attention_q.h"

static const int32_t *q_table(const llmem_view *v, const llmem_i32_table *t)
{
    return t->n > 0 ? (const int32_t *)(const void *)((const char *)cuda_dev(v->idx) + t->offset)
                    : NULL;
}

llmem_status cuda_op_ssm_scan_q(llmem_backend *be, const llmem_ssm_params *p,
                                const llmem_view *view, int32_t state, llmem_ct *xbc,
                                llmem_ct *dt, llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias,
                                llmem_ct *y)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if ((size_t)p->head_dim * (size_t)p->d_state * sizeof(float) > 48 * 1024)
        return LLMEM_E_UNSUPPORTED; /* one head's state in shared memory */
    const llmem_rs_view *v = llmem_view_rs(view);
    /* llmem_state_slot_bytes (the plugin links no core function) */
    size_t elems = (size_t)p->n_heads * (size_t)p->head_dim * (size_t)p->d_state;
    size_t scale_off = (elems + 15) & ~(size_t)15;
    size_t slot_bytes = (scale_off + 4 * (size_t)p->n_heads + 15) & ~(size_t)15;
    cuk_scan_q_args q = {
        .state = cuda_dev(v->state[state]),
        .slot_bytes = slot_bytes,
        .scale_off = scale_off,
        .n_slots = v->n_slots,
        .n_seqs = v->n_seqs,
        .n_seq_tokens = v->n_seq_tokens,
        .n_ckpt = v->n_ckpt,
        .src = q_table(view, &v->src_slot),
        .dst = q_table(view, &v->dst_slot),
        .ckpt = q_table(view, &v->ckpt_slot),
    };
    const llmem_rs_view *sn = llmem_rs_view_snap_used(view);
    if (sn) { /* a snapshot inside the ubatch (as cuda_rs_prepare) */
        q.snap_tok = q_table(view, &sn->snap_tok);
        q.snap_slot = q_table(view, &sn->snap_slot);
    }
    bool need;
    if ((st = cuda_rs_need_snapshot(v, &need)) != LLMEM_OK)
        return st;
    if (need) {
        void *snap;
        if ((st = cuda_scratch(cb, (size_t)v->n_seqs * slot_bytes, &snap)) != LLMEM_OK)
            return st;
        for (int32_t s = 0; s < v->n_seqs && st == LLMEM_OK; s++) {
            int32_t sl = v->src_slot.host[s];
            uint8_t *to = (uint8_t *)snap + (size_t)s * slot_bytes;
            cudaError_t e =
                sl >= 0 ? cudaMemcpyAsync(to, q.state + (size_t)sl * slot_bytes, slot_bytes,
                                          cudaMemcpyDeviceToDevice, cb->stream)
                        : cudaMemsetAsync(to, 0, slot_bytes, cb->stream);
            st = cuda_check(cb, e, "ssm_scan (int8 state): source copy");
        }
        if (st != LLMEM_OK)
            return st;
        q.snap = snap;
    }
    cuk_scan_args sa = cuda_scan_args(p, xbc, dt, a_log, d, dt_bias, y);
    return cuda_op_done(cb, cuk_ssm_scan_q(&sa, &q, cb->stream), "ssm_scan (int8 state)");
}

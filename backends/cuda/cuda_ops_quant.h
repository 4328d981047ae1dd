/* llmem cuda plugin: int8 SSM state scan (cuda_ops_quant.c, kernels/mamba_q.cu) and
 * the ssm_scan helpers it shares with cuda_ops_mamba2.c (defined there). */
#ifndef LLMEM_CUDA_OPS_QUANT_H
#define LLMEM_CUDA_OPS_QUANT_H

#include "kernels/kernels.h"
#include "llmem/ops_impl.h"

/* The ssm_scan slot for a state of dtype I8 (called by cuda_ops_mamba2.c's). */
llmem_status cuda_op_ssm_scan_q(llmem_backend *be, const llmem_ssm_params *p,
                                const llmem_view *view, int32_t state, llmem_ct *xbc,
                                llmem_ct *dt, llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias,
                                llmem_ct *y);

/* The scan arguments of one llmem_op_ssm_scan call (cuda_ops_mamba2.c, shared by
 * the f32 and the int8 paths): p's shape and dt clamp, the device pointers
 * of the tensors (NULL for an absent d or dt_bias, dtype word 0 then),
 * conv_dim = n_heads * head_dim + 2 * n_groups * d_state (xbc's columns),
 * n_sms 0 (the caller sets it where its kernel sizes a grid by it). The
 * tensors stay the caller's; nothing is checked (backends/ops.c has). */
cuk_scan_args cuda_scan_args(const llmem_ssm_params *p, llmem_ct *xbc, llmem_ct *dt,
                             llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);

/* Whether some stream of v reads (src_slot) a slot that another stream
 * writes (dst_slot or a checkpoint slot) in the same call, from the host
 * copies of the tables (cuda_ops_mamba2.c): then the sources must be copied
 * before any write. *need is false for a view without streams.
 * Returns LLMEM_OK, or LLMEM_E_NO_MEMORY when the n_slots-entry writer
 * table cannot be allocated (*need false then). */
llmem_status cuda_rs_need_snapshot(const llmem_rs_view *v, bool *need);

#endif

/* llmem cuda plugin: int8 SSM state scan (cuda_ops_quant.c, kernels/mamba_q.cu). */
#ifndef LLMEM_CUDA_OPS_QUANT_H
#define LLMEM_CUDA_OPS_QUANT_H

#include "llmem/ops_impl.h"

/* The ssm_scan slot for a state of dtype I8 (called by cuda_ops.c's). */
llmem_status cuda_op_ssm_scan_q(llmem_backend *be, const llmem_ssm_params *p,
                                const llmem_view *view, int32_t state, llmem_ct *xbc,
                                llmem_ct *dt, llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias,
                                llmem_ct *y);

#endif

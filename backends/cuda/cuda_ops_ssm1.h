/* llmem cuda plugin: the short-conv and Mamba-1 slots (cuda_ops_ssm1.c). */
#ifndef LLMEM_CUDA_OPS_SSM1_H
#define LLMEM_CUDA_OPS_SSM1_H

#include "backends/cuda/cuda_backend.h"
#include "kernels/ssm1.h"
#include "llmem/ops_impl.h"

llmem_status cuda_op_short_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                                llmem_ct *bcx, llmem_ct *w, llmem_ct *b, llmem_ct *out);
llmem_status cuda_op_ssm_scan1(llmem_backend *be, const llmem_ssm1_params *p,
                               const llmem_view *view, int32_t state, llmem_ct *x, llmem_ct *dt,
                               llmem_ct *b, llmem_ct *c, llmem_ct *a_log, llmem_ct *d,
                               llmem_ct *dt_bias, llmem_ct *z, llmem_ct *y);

#endif

/* llmem cuda plugin: the gated delta net slots (cuda_ops_gdn.c). */
#ifndef LLMEM_CUDA_OPS_GDN_H
#define LLMEM_CUDA_OPS_GDN_H

#include "llmem/ops_impl.h"

llmem_status cuda_op_gdn(llmem_backend *be, const llmem_gdn_params *p, const llmem_view *view,
                         int32_t state, llmem_ct *qkv, llmem_ct *a, llmem_ct *b, llmem_ct *a_log,
                         llmem_ct *dt_bias, llmem_ct *out);
llmem_status cuda_op_sigmoid_mul(llmem_backend *be, llmem_ct *x, llmem_ct *gate, llmem_ct *out);

#endif

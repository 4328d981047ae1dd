/* llmem cuda plugin: the mixture-of-experts slots (cuda_ops_moe.c). */
#ifndef LLMEM_CUDA_OPS_MOE_H
#define LLMEM_CUDA_OPS_MOE_H

#include "llmem/ops_impl.h"

llmem_status cuda_op_moe_route(llmem_backend *be, const llmem_moe_route_params *p,
                               llmem_ct *logits, llmem_ct *bias, llmem_ct *ids,
                               llmem_ct *weights);
llmem_status cuda_op_moe_ffn(llmem_backend *be, const llmem_moe_ffn_params *p, llmem_ct *x,
                             llmem_ct *ids, llmem_ct *weights, llmem_ct *w_up, llmem_ct *w_down,
                             llmem_ct *out);

#endif

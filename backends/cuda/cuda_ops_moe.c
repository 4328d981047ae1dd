/* llmem cuda plugin: the mixture-of-experts slots of the ops table
 * (kernels/moe.cu). The wrappers of backends/ops_moe.c have checked every
 * argument; the kernels skip expert ids outside [0, E). */
#include "backends/cuda/cuda_backend.h"
#include "kernels/moe.h"
#include "llmem/ops_moe.h"

static llmem_status cuda_op_moe_route(llmem_backend *be, const llmem_moe_route_params *p,
                                      llmem_ct *logits, llmem_ct *bias, llmem_ct *ids,
                                      llmem_ct *weights)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (p->n_group > 32 || (size_t)p->n_expert * 8 > 48 * 1024)
        return LLMEM_E_UNSUPPORTED;
    cudaError_t e = cuk_moe_route(
        cuda_tensor_ptr(logits), cuda_tensor_ptr(bias), bias ? (int)bias->dtype : 0,
        cuda_tensor_ptr(ids), cuda_tensor_ptr(weights), logits->ne[0], p->n_expert,
        p->n_expert_used, p->scoring == LLMEM_MOE_SIGMOID, p->norm_topk, p->n_group,
        p->topk_group, p->scale, cb->stream);
    return cuda_op_done(cb, e, "moe_route");
}

static llmem_status cuda_op_moe_ffn(llmem_backend *be, const llmem_moe_ffn_params *p, llmem_ct *x,
                                    llmem_ct *ids, llmem_ct *weights, llmem_ct *w_up,
                                    llmem_ct *w_down, llmem_ct *out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    int64_t T = x->ne[0], D = x->ne[1], k = ids->ne[1], I = w_down->ne[2];
    if ((I + 7) / 8 > 65535 || (D + 7) / 8 > 65535)
        return LLMEM_E_UNSUPPORTED;
    void *scratch;
    size_t bytes = (size_t)(T * k * (I + D)) * sizeof(float) +
                   (size_t)(w_up->ne[0] + 1 + T * k) * sizeof(int32_t) + 256;
    if ((st = cuda_scratch(cb, bytes, &scratch)) != LLMEM_OK)
        return st;
    cudaError_t e = cuk_moe_ffn(cuda_tensor_ptr(x), cuda_tensor_ptr(ids), cuda_tensor_ptr(weights),
                                cuda_tensor_ptr(w_up), cuda_tensor_ptr(w_down), (int)w_up->dtype,
                                cuda_tensor_ptr(out), scratch, T, (int32_t)D, (int32_t)I,
                                w_up->ne[0], (int32_t)k, p->gated,
                                p->act == LLMEM_MOE_ACT_RELU2, cb->stream);
    return cuda_op_done(cb, e, "moe_ffn");
}

/* Registered in the cuda plugin's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_MOE_ROUTE, LLMEM_OP_MOE_ROUTE_LAYOUT,
              llmem_op_moe_route_fn, cuda_op_moe_route);
LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_MOE_FFN, LLMEM_OP_MOE_FFN_LAYOUT, llmem_op_moe_ffn_fn,
              cuda_op_moe_ffn);

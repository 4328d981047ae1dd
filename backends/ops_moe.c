/* llmem: the mixture-of-experts ops of <llmem/ops_moe.h>
 * (llmem_op_moe_route, llmem_op_moe_ffn), open ops (<llmem/ops_impl.h>,
 * "Open ops"): their metadata, registered when libllmem loads, and their
 * wrappers.
 *
 * Same contract as backends/ops.c: every argument the host can see is
 * checked (descriptors, buffer ranges, aliasing), then the backend's
 * implementation (llmem_backend_op_impl) is called. The expert ids live on
 * the device, so their range is checked by the backends, which must never
 * read an expert outside [0, E).
 */
#include "backends/ops_internal.h"
#include "llmem/ops_moe.h"

/* moe_route: {logits, bias, ids, weights} */
static llmem_op_info moe_route_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_MOE_ROUTE,
    .name = "moe_route",
    .view = LLMEM_VIEW_NONE,
    .n_operands = 4,
    .dtypes = {DT_F32, DT_FLOAT, DT_I32, DT_F32},
    .layout = LLMEM_OP_MOE_ROUTE_LAYOUT,
};
LLMEM_OP_DEFINE(moe_route_info);

/* moe_ffn: {x, ids, weights, w_up, w_down, out} */
static llmem_op_info moe_ffn_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_MOE_FFN,
    .name = "moe_ffn",
    .view = LLMEM_VIEW_NONE,
    .n_operands = 6,
    .dtypes = {DT_F32, DT_I32, DT_F32, DT_FLOAT, DT_FLOAT, DT_F32},
    .layout = LLMEM_OP_MOE_FFN_LAYOUT,
};
LLMEM_OP_DEFINE(moe_ffn_info);

llmem_status llmem_op_moe_route(llmem_backend *be, const llmem_moe_route_params *p,
                                const llmem_tensor *logits, const llmem_tensor *bias,
                                const llmem_tensor *ids, const llmem_tensor *weights)
{
    if (!be || !p)
        return LLMEM_E_INVALID;
    llmem_op_moe_route_fn fn = (llmem_op_moe_route_fn)llmem_backend_op_impl(be, &moe_route_info);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, logits, DT_F32) || !tensor_ok(be, ids, DT_I32) ||
        !tensor_ok(be, weights, DT_F32) || (bias && !tensor_ok(be, bias, DT_FLOAT)))
        return LLMEM_E_INVALID;
    int32_t E = p->n_expert, k = p->n_expert_used;
    if (E < 1 || k < 1 || k > E || (p->scoring != LLMEM_MOE_SOFTMAX &&
                                    p->scoring != LLMEM_MOE_SIGMOID))
        return LLMEM_E_INVALID;
    if (p->n_group > 1) {
        if (E % p->n_group != 0 || E / p->n_group < 2 || p->topk_group < 1 ||
            p->topk_group > p->n_group || (int64_t)p->topk_group * (E / p->n_group) < k)
            return LLMEM_E_INVALID;
    } else if (p->n_group < 0) {
        return LLMEM_E_INVALID;
    }
    if (logits->n_dims != 2 || logits->ne[1] != E)
        return LLMEM_E_INVALID;
    int64_t T = logits->ne[0];
    if (!is_matrix(ids, T, k) || !is_matrix(weights, T, k))
        return LLMEM_E_INVALID;
    if (bias && llmem_tensor_nelements(bias) != E)
        return LLMEM_E_INVALID;
    const llmem_tensor *in[2] = {logits, bias};
    for (int i = 0; i < 2; i++)
        if (overlaps(ids, in[i]) || overlaps(weights, in[i]))
            return LLMEM_E_INVALID;
    if (overlaps(ids, weights))
        return LLMEM_E_INVALID;
    if (T == 0)
        return LLMEM_OK;
    return fn(be, p, logits, bias, ids, weights);
}

llmem_status llmem_op_moe_ffn(llmem_backend *be, const llmem_moe_ffn_params *p,
                              const llmem_tensor *x, const llmem_tensor *ids,
                              const llmem_tensor *weights, const llmem_tensor *w_up,
                              const llmem_tensor *w_down, const llmem_tensor *out)
{
    if (!be || !p)
        return LLMEM_E_INVALID;
    llmem_op_moe_ffn_fn fn = (llmem_op_moe_ffn_fn)llmem_backend_op_impl(be, &moe_ffn_info);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (p->act != LLMEM_MOE_ACT_SILU && p->act != LLMEM_MOE_ACT_RELU2)
        return LLMEM_E_INVALID;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, ids, DT_I32) ||
        !tensor_ok(be, weights, DT_F32) || !tensor_ok(be, w_up, DT_FLOAT) ||
        !tensor_ok(be, w_down, DT_FLOAT) || !tensor_ok(be, out, DT_F32))
        return LLMEM_E_INVALID;
    if (x->n_dims != 2 || ids->n_dims != 2 || w_up->n_dims != 3 || w_down->n_dims != 3 ||
        w_up->dtype != w_down->dtype)
        return LLMEM_E_INVALID;
    int64_t T = x->ne[0], D = x->ne[1], k = ids->ne[1], E = w_up->ne[0], I = w_down->ne[2];
    if (ids->ne[0] != T || !is_matrix(weights, T, k) || !is_matrix(out, T, D) || k < 1 || E < 1)
        return LLMEM_E_INVALID;
    if (w_up->ne[1] != (p->gated ? 2 * I : I) || w_up->ne[2] != D || w_down->ne[0] != E ||
        w_down->ne[1] != D)
        return LLMEM_E_INVALID;
    const llmem_tensor *in[5] = {x, ids, weights, w_up, w_down};
    for (int i = 0; i < 5; i++)
        if (overlaps(out, in[i]))
            return LLMEM_E_INVALID;
    if (T == 0 || D == 0)
        return LLMEM_OK;
    return fn(be, p, x, ids, weights, w_up, w_down, out); /* I = 0 gives zeros */
}

/* llmem: the fused decode matmul of <llmem/ops_norm_matmul.h>
 * (llmem_op_norm_matmul), an open op (<llmem/ops_impl.h>, "Open ops"): its
 * metadata, registered when libllmem loads, and its wrapper.
 *
 * Same contract as backends/ops.c: every argument the host can see is
 * checked (descriptors, buffer ranges, aliasing, parameters), then the
 * backend's implementation (llmem_backend_op_impl) is called.
 */
#include <math.h>

#include "base/base_internal.h"
#include "backends/ops_internal.h"
#include "llmem/ops_norm_matmul.h"

/* norm_matmul: {x, z, nw, w, w2, out} */
static llmem_op_info norm_matmul_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_NORM_MATMUL,
    .name = "norm_matmul",
    .view = LLMEM_VIEW_NONE,
    .n_operands = 6,
    .dtypes = {DT_F32, DT_F32, DT_FLOAT, DT_FLOAT, DT_FLOAT, DT_F32},
    .layout = LLMEM_OP_NORM_MATMUL_LAYOUT,
};
LLMEM_OP_DEFINE(norm_matmul_info);

llmem_status llmem_op_norm_matmul(llmem_backend *be, const llmem_norm_matmul_params *p,
                                  const llmem_tensor *x, const llmem_tensor *z,
                                  const llmem_tensor *nw, const llmem_tensor *w,
                                  const llmem_tensor *w2, const llmem_tensor *out)
{
    if (!be || !p || !x || !w || !out)
        return LLMEM_E_INVALID;
    llmem_op_norm_matmul_fn fn =
        (llmem_op_norm_matmul_fn)llmem_backend_op_impl(be, &norm_matmul_info);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (p->norm < LLMEM_NM_NORM_NONE || p->norm > LLMEM_NM_NORM_GATED ||
        p->epilogue < LLMEM_NM_STORE || p->epilogue > LLMEM_NM_SWIGLU)
        return LLMEM_E_INVALID;
    if (p->norm != LLMEM_NM_NORM_NONE && (!isfinite(p->eps) || p->eps < 0.0f))
        return LLMEM_E_INVALID;
    bool gated = p->norm == LLMEM_NM_NORM_GATED, swiglu = p->epilogue == LLMEM_NM_SWIGLU;
    /* optional operands exactly where their mode needs them */
    if ((z != NULL) != gated || (w2 != NULL) != swiglu ||
        (p->norm == LLMEM_NM_NORM_NONE && nw != NULL))
        return LLMEM_E_INVALID;
    if (!tensor_ok(be, x, DT_F32) || !tensor_ok(be, w, DT_FLOAT) || !tensor_ok(be, out, DT_F32) ||
        x->n_dims != 2 || w->n_dims != 2)
        return LLMEM_E_INVALID;
    int64_t T = x->ne[0], K = x->ne[1], N = w->ne[0];
    if (w->ne[1] != K || !is_matrix(out, T, N))
        return LLMEM_E_INVALID;
    if (z && (!tensor_ok(be, z, DT_F32) || !is_matrix(z, T, K)))
        return LLMEM_E_INVALID;
    if (nw && (!tensor_ok(be, nw, DT_FLOAT) || llmem_tensor_nelements(nw) != K))
        return LLMEM_E_INVALID;
    if (w2 && (!tensor_ok(be, w2, DT_FLOAT) || w2->dtype != w->dtype || !is_matrix(w2, N, K)))
        return LLMEM_E_INVALID;
    if (overlaps(out, x) || overlaps(out, z) || overlaps(out, nw) || overlaps(out, w) ||
        overlaps(out, w2))
        return LLMEM_E_INVALID;
    if (T == 0 || N == 0)
        return LLMEM_OK;
    if (K == 0) /* an empty row: no norm is defined over it */
        return LLMEM_E_INVALID;
    return fn(be, p, x, z, nw, w, w2, out);
}

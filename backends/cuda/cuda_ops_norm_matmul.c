/* llmem cuda plugin: the fused decode matmul (<llmem/ops_norm_matmul.h>,
 * issue 11) on the row-block GEMV of kernels/gemv.cu. The wrapper of
 * backends/ops_norm_matmul.c has checked every argument. Shapes the kernel
 * does not take (more than CUK_GEMV_MAX_M rows, K over 2048 16-byte chunks,
 * unaligned rows) give LLMEM_E_UNSUPPORTED before anything is launched, and
 * the caller runs the unfused ops. */
#include "backends/cuda/cuda_backend.h"
#include "kernels/gemv.h"
#include "llmem/ops_norm_matmul.h"

static llmem_status cuda_op_norm_matmul(llmem_backend *be, const llmem_norm_matmul_params *p,
                                        const llmem_tensor *x, const llmem_tensor *z,
                                        const llmem_tensor *nw, const llmem_tensor *w,
                                        const llmem_tensor *w2, const llmem_tensor *out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (x->ne[0] > CUK_GEMV_MAX_M || x->ne[1] > INT32_MAX || w->ne[0] > INT32_MAX)
        return LLMEM_E_UNSUPPORTED;
    cuk_gemv_rows a = {
        .x = cuda_tensor_ptr(x),
        .z = z ? cuda_tensor_ptr(z) : NULL,
        .nw = nw ? cuda_tensor_ptr(nw) : NULL,
        .nwdt = nw ? (int32_t)nw->dtype : 0,
        .norm = p->norm == LLMEM_NM_NORM_RMS     ? CUK_GN_RMS
                : p->norm == LLMEM_NM_NORM_GATED ? CUK_GN_GATED
                                                 : CUK_GN_NONE,
        .eps = p->eps,
        .w = cuda_tensor_ptr(w),
        .w2 = w2 ? cuda_tensor_ptr(w2) : NULL,
        .wdt = (int32_t)w->dtype,
        .epi = p->epilogue == LLMEM_NM_ADD      ? CUK_GE_ADD
               : p->epilogue == LLMEM_NM_SWIGLU ? CUK_GE_SWIGLU
                                                : CUK_GE_STORE,
        .out = cuda_tensor_ptr(out),
        .m = (int32_t)x->ne[0],
        .n = (int32_t)w->ne[0],
        .k = (int32_t)x->ne[1],
    };
    if (!cuk_gemv_rows_ok(&a))
        return LLMEM_E_UNSUPPORTED;
    return cuda_op_done(cb, cuk_gemv_rows_run(&a, cb->stream), "norm_matmul");
}

LLMEM_OP_IMPL(cuda_op_impls, LLMEM_OP_NORM_MATMUL, LLMEM_OP_NORM_MATMUL_LAYOUT,
              llmem_op_norm_matmul_fn, cuda_op_norm_matmul);

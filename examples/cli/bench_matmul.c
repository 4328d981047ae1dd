/* llmem bench: GEMM figures (`--only matmul`): out[M, N] = a[M, K] ·
 * w[N, K]ᵀ with f32 activations and bf16 weights at the 9B Bamba shape's
 * projections (hidden 4096, MLP 14336) and row counts of batched decode
 * (16, 64) and prefill (512, 2048), through llmem_op_matmul (precise) and
 * llmem_op_matmul_fast; reported as time and TFLOP/s (2 M N K). Run on cuda
 * (cuBLAS) and vulkan (cooperative matrices where the device has them) to
 * compare the two at the same shapes. See bench.c's usage text. */
#include <stdio.h>
#include <stdlib.h>

#include "examples/cli/bench.h"

typedef struct mm_ctx {
    llmem_backend *be;
    llmem_tensor a, w, out;
    bool fast;
} mm_ctx;

static llmem_status mm_run(void *vctx)
{
    mm_ctx *c = vctx;
    return c->fast ? llmem_op_matmul_fast(c->be, &c->a, &c->w, &c->out)
                   : llmem_op_matmul(c->be, &c->a, &c->w, &c->out);
}

llmem_status bench_matmul(bench *b)
{
    static const int32_t shapes[][3] = {
        {16, 4096, 4096}, {64, 4096, 4096}, {512, 4096, 4096}, {512, 14336, 4096},
        {512, 4096, 14336}, {2048, 4096, 4096}};
    const int32_t m_max = 2048, k_max = 14336, n_max = 14336;
    size_t a_bytes = (size_t)m_max * k_max * 4, w_bytes = (size_t)n_max * 4096 * 2;
    size_t o_bytes = (size_t)m_max * n_max * 4;
    llmem_buffer *ba = NULL, *bw = NULL, *bo = NULL;
    /* $LLMEM_BENCH_MATMUL_F16: f16 weights instead (a diagnostic) */
    llmem_dtype wt = getenv("LLMEM_BENCH_MATMUL_F16") ? LLMEM_DTYPE_F16 : LLMEM_DTYPE_BF16;
    llmem_status st =
        bench_new_filled(b, a_bytes, (int64_t)(a_bytes / 4), LLMEM_DTYPE_F32, false, &ba);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, w_bytes, (int64_t)(w_bytes / 2), wt, true, &bw);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, o_bytes, &bo);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && st == LLMEM_OK; s++)
        for (int fast = 0; fast < 2 && st == LLMEM_OK; fast++) {
            int32_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            mm_ctx c = {b->be, llmem_tensor_2d(ba, 0, LLMEM_DTYPE_F32, m, k),
                        llmem_tensor_2d(bw, 0, wt, n, k),
                        llmem_tensor_2d(bo, 0, LLMEM_DTYPE_F32, m, n), fast != 0};
            char what[64];
            snprintf(what, sizeof what, "matmul %s %dx%dx%d", fast ? "fast" : "precise", m, n, k);
            double sec = 0;
            st = bench_time_it(b, what, mm_run, &c, &sec);
            if (st == LLMEM_OK)
                printf("%-34s %9.3f ms  %7.1f TFLOP/s  (M x N x K, %s weights)\n", what,
                       sec * 1e3, 2.0 * m * n * k / sec / 1e12, llmem_dtype_name(wt));
        }
    llmem_buffer_free(ba);
    llmem_buffer_free(bw);
    llmem_buffer_free(bo);
    return st;
}

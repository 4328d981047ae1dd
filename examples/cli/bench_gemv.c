/* llmem bench: decode GEMV figures (`--only gemv`): out[M, N] = a[M, K] ·
 * w[N, K]ᵀ with f32 activations, bf16 weights and M = 1 (a batch-1 decode
 * step) at the projections of the 9B Bamba shape (hidden 4096, MLP 14336,
 * Mamba-2 in_proj 16768 rows, 8 KV heads of 128, vocab 128256), plus the
 * fused gate/up + SwiGLU GEMV (llmem_op_matmul_swiglu) of the MLP. A
 * decode GEMV is bound by reading the weights once, so each figure is the
 * bandwidth of weights + activations + outputs against the copy ceiling of
 * the same run (and the CUDA copy on a vulkan run). Each figure cycles
 * through copies of its weights that together span at least 512 MiB, far
 * beyond the GPU's L2 (60 MiB on the H200), so every call reads them from
 * memory. See bench.c's usage text. */
#include <stdio.h>

#include "examples/cli/bench.h"

#define ROT_BYTES ((size_t)512 << 20) /* weights a figure cycles through, at least */
enum { ROT_MAX = 64 };                  /* copies of them, at most */

typedef struct gemv_ctx {
    llmem_backend *be;
    llmem_tensor a, w[ROT_MAX], u[ROT_MAX], out;
    int next, rot;
    bool swiglu;
} gemv_ctx;

static llmem_status gemv_run(void *vctx)
{
    gemv_ctx *c = vctx;
    int i = c->next;
    c->next = (c->next + 1) % c->rot;
    return c->swiglu ? llmem_op_matmul_swiglu(c->be, &c->a, &c->w[i], &c->u[i], &c->out)
                     : llmem_op_matmul(c->be, &c->a, &c->w[i], &c->out);
}

/* One figure: rot copies of the weights (gate and up for SwiGLU), each its
 * own buffer so that no matrix straddles a chunk of a large buffer. */
static llmem_status gemv_figure(bench *b, const char *what, int32_t n, int32_t k, bool swiglu,
                                llmem_buffer *ba, llmem_buffer *bo)
{
    size_t wb = (size_t)n * k * 2, set = wb * (swiglu ? 2 : 1);
    gemv_ctx c = {.be = b->be, .swiglu = swiglu};
    c.rot = (int)((ROT_BYTES + set - 1) / set);
    c.rot = c.rot < 2 ? 2 : c.rot > ROT_MAX ? ROT_MAX : c.rot;
    c.a = llmem_tensor_2d(ba, 0, LLMEM_DTYPE_F32, 1, k);
    c.out = llmem_tensor_2d(bo, 0, LLMEM_DTYPE_F32, 1, n);
    llmem_buffer *bw[ROT_MAX] = {0};
    llmem_status st = LLMEM_OK;
    for (int r = 0; r < c.rot && st == LLMEM_OK; r++) {
        st = bench_new_buffer(b, set, &bw[r]);
        if (st == LLMEM_OK)
            st = bench_fill(b, bw[r], 0, (int64_t)(set / 2), LLMEM_DTYPE_BF16, true);
        c.w[r] = llmem_tensor_2d(bw[r], 0, LLMEM_DTYPE_BF16, n, k);
        c.u[r] = llmem_tensor_2d(bw[r], swiglu ? wb : 0, LLMEM_DTYPE_BF16, n, k);
    }
    double sec = 0;
    if (st == LLMEM_OK)
        st = bench_time_it(b, what, gemv_run, &c, &sec);
    if (st == LLMEM_OK)
        bench_report_bw(b, what, sec, (double)set + 4.0 * k + 4.0 * n, "(M 1, bf16 weights)");
    if (st == LLMEM_E_UNSUPPORTED) { /* e.g. a matrix beyond lavapipe's 128 MiB bindings */
        printf("%-28s (not run: the backend cannot hold this shape)\n", what);
        st = LLMEM_OK;
    }
    for (int r = 0; r < c.rot; r++)
        llmem_buffer_free(bw[r]);
    return st;
}

llmem_status bench_gemv(bench *b)
{
    static const struct {
        const char *what;
        int32_t n, k;
        bool swiglu;
    } shapes[] = {
        {"gemv k/v 1024x4096", 1024, 4096, false},
        {"gemv q/o 4096x4096", 4096, 4096, false},
        {"gemv up 14336x4096", 14336, 4096, false},
        {"gemv down 4096x14336", 4096, 14336, false},
        {"gemv in_proj 16768x4096", 16768, 4096, false},
        {"gemv gate+up swiglu", 14336, 4096, true},
        {"gemv lm head 128256x4096", 128256, 4096, false},
    };
    const int32_t k_max = 14336, n_max = 128256;
    llmem_buffer *ba = NULL, *bo = NULL;
    llmem_status st = bench_new_buffer(b, (size_t)k_max * 4, &ba);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, (size_t)n_max * 4, &bo);
    if (st == LLMEM_OK)
        st = bench_fill(b, ba, 0, k_max, LLMEM_DTYPE_F32, false);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && st == LLMEM_OK; s++)
        st = gemv_figure(b, shapes[s].what, shapes[s].n, shapes[s].k, shapes[s].swiglu, ba, bo);
    llmem_buffer_free(ba);
    llmem_buffer_free(bo);
    return st;
}

/* Stand-alone timing of the prefill GEMMs of the Bamba-9B shape at M = 512
 * rows (one pp512 ubatch) with cuBLAS, in the ways a fast-mode prefill could
 * call it (not part of the build; docs/benchmarks.md "pp512 at batch 1"
 * has the command). Build:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. kernels/bench_pp_gemm.cu \
 *        kernels/matmul.cu -lcublasLt -lcublas -o bench_pp_gemm
 * Per shape (N outputs, K inputs) it prints the median of 20 calls (after 3
 * warm-ups) in µs and TFLOP/s of:
 *   cvt      the f32 -> bf16 rounding of the [M, K] activations (cuk_split_bf16)
 *   ex32     cublasGemmEx, bf16 x bf16 -> f32 out, CUBLAS_GEMM_DEFAULT (the landed path)
 *   ex16     the same with a bf16 output
 *   lt32     cublasLt, f32 out: the fastest of up to 16 heuristic algorithms
 *   lt16     cublasLt, bf16 out, likewise
 * FLOPs are 2 M N K. */
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/kernels.h"

#include "kernels/bench_common.cuh"
#define CB(x)                                                                                  \
    do {                                                                                       \
        int e_ = (int)(x);                                                                     \
        if (e_ != 0) {                                                                         \
            fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, e_);      \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static cudaStream_t S;
static cudaEvent_t E0, E1;

template <class F> static float time_us(F f)
{
    return bench_time_ms(S, E0, E1, 3, 20, 1, [&](int) { f(); }) * 1e3f;
}

static float lt_best(cublasLtHandle_t lt, void *ws, size_t ws_bytes, const void *w, const void *a,
                     void *out, cudaDataType_t otype, int m, int n, int k, int *n_algo)
{
    cublasLtMatmulDesc_t op;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
    cublasLtMatrixLayout_t la, lb, lc;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
    CB(cublasLtMatrixLayoutCreate(&lc, otype, n, m, n));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[16];
    int got = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &got));
    float alpha = 1.0f, beta = 0.0f, best = 1e30f;
    for (int i = 0; i < got; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        float us = time_us([&] {
            CB(cublasLtMatmul(lt, op, &alpha, w, la, a, lb, &beta, out, lc, out, lc,
                              &res[i].algo, ws, ws_bytes, S));
        });
        if (i == 0)
            printf(" [lt first %.1f]", us);
        best = std::min(best, us);
    }
    *n_algo = got;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    return best;
}

int main()
{
    CK(cudaStreamCreate(&S));
    CK(cudaEventCreate(&E0));
    CK(cudaEventCreate(&E1));
    cublasHandle_t blas;
    CB(cublasCreate(&blas));
    CB(cublasSetStream(blas, S));
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    size_t ws_bytes = (size_t)32 << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    struct shape {
        const char *name;
        int m, n, k;
    } shapes[] = {
        {"in_proj", 512, 16768, 4096},   {"out_proj", 512, 4096, 8192},
        {"ffn gate|up", 512, 14336, 4096}, {"gate+up fused", 512, 28672, 4096},
        {"ffn down", 512, 4096, 14336},  {"attn q|o", 512, 4096, 4096},
        {"attn k|v", 512, 1024, 4096},   {"attn qkv fused", 512, 6144, 4096},
        {"lm_head 1 row", 8, 128256, 4096}, {"peak", 8192, 8192, 8192},
    };
    size_t max_a = 8192ull * 14336, max_w = 128256ull * 4096, max_o = 8192ull * 128256;
    float *a32, *o;
    uint16_t *a16, *w;
    CK(cudaMalloc(&a32, max_a * 4));
    CK(cudaMalloc(&a16, max_a * 2));
    CK(cudaMalloc(&w, max_w * 2));
    CK(cudaMalloc(&o, max_o * 4));
    CK(cudaMemset(a32, 0, max_a * 4));
    CK(cudaMemset(w, 0x3c, max_w * 2)); /* bf16 ~0.01: finite products */
    CK(cudaMemset(a16, 0x3c, max_a * 2));
    printf("%-16s %5s %6s %6s %9s %14s %14s %14s %14s\n", "shape", "M", "N", "K", "cvt us",
           "ex32 us (TF)", "ex16 us (TF)", "lt32 us (TF)", "lt16 us (TF)");
    for (const shape &s : shapes) {
        double fl = 2.0 * s.m * s.n * s.k;
        float alpha = 1.0f, beta = 0.0f;
        float cvt = time_us([&] {
            CK(cuk_split_bf16(a32, a16, nullptr, (int64_t)s.m * s.k, S));
        });
        float ex32 = time_us([&] {
            CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, w, CUDA_R_16BF,
                            s.k, a16, CUDA_R_16BF, s.k, &beta, o, CUDA_R_32F, s.n,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        float ex16 = time_us([&] {
            CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, w, CUDA_R_16BF,
                            s.k, a16, CUDA_R_16BF, s.k, &beta, o, CUDA_R_16BF, s.n,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        printf("%-16s %5d %6d %6d %9.1f", s.name, s.m, s.n, s.k, cvt);
        int na = 0, nb = 0;
        float lt32 = lt_best(lt, ws, ws_bytes, w, a16, o, CUDA_R_32F, s.m, s.n, s.k, &na);
        float lt16 = lt_best(lt, ws, ws_bytes, w, a16, o, CUDA_R_16BF, s.m, s.n, s.k, &nb);
        printf(" %7.1f (%4.0f) %7.1f (%4.0f) %7.1f (%4.0f) %7.1f (%4.0f)  [%d/%d algos]\n", ex32,
               fl / ex32 * 1e-6, ex16, fl / ex16 * 1e-6, lt32, fl / lt32 * 1e-6, lt16,
               fl / lt16 * 1e-6, na, nb);
    }
    return 0;
}

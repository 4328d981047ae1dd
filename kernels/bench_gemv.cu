/* Stand-alone timing of the batch-1 GEMV (cuk_gemv) at the matmul shapes
 * of the Bamba-9B decode step, against a device copy of the same bytes
 * (not part of the build; docs/benchmarks.md "CUDA, issue 11" has the
 * command). Build:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I. \
 *        kernels/bench_gemv.cu kernels/matmul.cu kernels/gemv.cu kernels/basic.cu -o bench_gemv
 * Prints, per shape and M in {1, 4}: time (median of 50 after 5 warm-ups,
 * rotating over enough weight copies to defeat the 60 MB L2), GB/s of
 * weight bytes, and the fraction of the copy bandwidth measured here
 * (bytes read + written per second). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/kernels.h"

#include "kernels/bench_common.cuh"

int main()
{
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double copy_bw = bench_copy_bw(s, e0, e1);
    printf("copy %.1f GB/s (read + written)\n", copy_bw / 1e9);
    struct shape {
        const char *name;
        int n, k;
    } shapes[] = {{"in_proj", 16768, 4096}, {"out_proj", 4096, 8192}, {"ffn up/gate", 14336, 4096},
                  {"ffn down", 4096, 14336}, {"attn q/o", 4096, 4096}, {"attn k/v", 1024, 4096},
                  {"lm_head", 128256, 4096}};
    float *a, *out;
    CK(cudaMalloc(&a, 4 * 14336 * sizeof(float)));
    CK(cudaMalloc(&out, 8 * 128256 * sizeof(float)));
    std::vector<float> ha(4 * 14336);
    for (size_t i = 0; i < ha.size(); i++)
        ha[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    CK(cudaMemcpy(a, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
    printf("%-12s %7s %7s %3s %10s %10s %8s\n", "shape", "N", "K", "M", "us", "GB/s", "of copy");
    for (const shape &sh : shapes) {
        size_t wbytes = (size_t)sh.n * sh.k * 2;
        int copies = (int)std::max<size_t>(1, (size_t)(256u << 20) / wbytes + 1);
        std::vector<void *> w(copies);
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&w[c], wbytes));
            CK(cudaMemset(w[c], 0x3c, wbytes)); /* bf16 ~0.0115, not zero */
        }
        for (int m : {1, 4}) {
            double sec = bench_time_ms(s, e0, e1, 5, 50, 1, [&](int c) {
                CK(cuk_gemv(a, w[c % copies], 2, out, m, sh.n, sh.k, s));
            }) * 1e-3;
            /* 20 back-to-back launches between two events: launch latency
             * hidden, ramp and drain of each kernel still serial */
            double sb = bench_time_ms(s, e0, e1, 2, 5, 20, [&](int c) {
                CK(cuk_gemv(a, w[c % copies], 2, out, m, sh.n, sh.k, s));
            }) * 1e-3;
            printf("%-12s %7d %7d %3d %10.1f %10.1f %7.1f%%   x20: %7.1f us %6.1f%%\n", sh.name,
                   sh.n, sh.k, m, sec * 1e6, wbytes / sec / 1e9, 100.0 * wbytes / sec / copy_bw,
                   sb * 1e6, 100.0 * wbytes / sb / copy_bw);
        }
        if (sh.n == 14336) { /* fused gate/up + SwiGLU against two GEMVs + swiglu */
            for (int m : {1, 4}) {
                double sf = bench_time_ms(s, e0, e1, 2, 25, 10, [&](int c) {
                    CK(cuk_gemv_swiglu(a, w[(2 * c) % copies], w[(2 * c + 1) % copies], 2, out,
                                       m, sh.n, sh.k, s));
                }) * 1e-3;
                double su = bench_time_ms(s, e0, e1, 2, 25, 10, [&](int c) {
                    CK(cuk_gemv(a, w[(2 * c) % copies], 2, out, m, sh.n, sh.k, s));
                    CK(cuk_gemv(a, w[(2 * c + 1) % copies], 2, out + 4 * 14336, m, sh.n, sh.k, s));
                    CK(cuk_elementwise(CUK_EW_SWIGLU, out, out + 4 * 14336, 0, 0.0f, out,
                                       (int64_t)m * sh.n, s));
                }) * 1e-3;
                printf("gate+up+swiglu M=%d: fused %.1f us (%.1f%% of copy), unfused %.1f us\n", m,
                       sf * 1e6, 100.0 * 2 * wbytes / sf / copy_bw, su * 1e6);
            }
        }
        for (int c = 0; c < copies; c++)
            CK(cudaFree(w[c]));
    }
    return 0;
}

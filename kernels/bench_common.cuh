/* Helpers of the stand-alone CUDA timing harnesses (kernels/bench_*.cu;
 * not part of the build): a CUDA status check that exits the harness with
 * the failing call's text, the median of a set of timings, and the device
 * copy ceiling the figures are compared with. */
#ifndef LLMEM_BENCH_COMMON_CUH
#define LLMEM_BENCH_COMMON_CUH

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

/* Exits with file:line, the call and CUDA's message when x fails. */
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* The median of v (the upper one of an even count); v not empty. */
static inline float bench_median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The device copy ceiling: bytes read + written per second of a 1 GiB
 * device-to-device cudaMemcpyAsync on stream st, the median of 20 copies
 * after 5 warm-ups, timed with the caller's events e0, e1. */
static inline double bench_copy_bw(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1)
{
    size_t cb = (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, cb));
    CK(cudaMalloc(&dst, cb));
    CK(cudaMemset(src, 1, cb));
    std::vector<float> t;
    for (int i = 0; i < 25; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 5)
            t.push_back(ms);
    }
    CK(cudaFree(src));
    CK(cudaFree(dst));
    return 2.0 * cb / (bench_median(t) * 1e-3);
}

#endif

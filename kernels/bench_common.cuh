/* Helpers of the stand-alone CUDA timing harnesses (kernels/bench_*.cu;
 * not part of the build): a CUDA status check that exits the harness with
 * the failing call's text, a bf16 fill, the median of a set of timings, event timing of
 * a body of launches, and the device copy ceiling the figures are compared
 * with. */
#ifndef LLMEM_BENCH_COMMON_CUH
#define LLMEM_BENCH_COMMON_CUH

#include <algorithm>
#include <cstdint>
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

/* Fills p[0, n) with bf16 values uniform in [-amp/2, amp/2), a hash of
 * each index and seed (reproducible on the host), rounded to nearest even. */
__global__ void bench_fill_bf16(uint16_t *p, size_t n, uint32_t seed, float amp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        float f = ((float)(h & 0xffff) / 65536.0f - 0.5f) * amp;
        uint32_t u = __float_as_uint(f);
        p[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
}

/* The median of v (the upper one of an even count); v not empty. */
static inline float bench_median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* Event timing of a body of launches on stream st: warmup + reps runs,
 * each recording e0, calling body(c) per_run times back to back (c counts
 * every call from 0, e.g. to rotate over weight copies), recording e1 and
 * waiting for it; the median over the last reps runs of one call's share
 * (run time / per_run), in ms. per_run > 1 hides launch latency, not each
 * kernel's ramp and drain. */
template <class F>
static inline float bench_time_ms(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int warmup,
                                  int reps, int per_run, F body)
{
    std::vector<float> t;
    for (int i = 0; i < warmup + reps; i++) {
        CK(cudaEventRecord(e0, st));
        for (int j = 0; j < per_run; j++)
            body(i * per_run + j);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= warmup)
            t.push_back(ms / per_run);
    }
    return bench_median(t);
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
    float ms = bench_time_ms(st, e0, e1, 5, 20, 1, [&](int) {
        CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, st));
    });
    CK(cudaFree(src));
    CK(cudaFree(dst));
    return 2.0 * cb / (ms * 1e-3);
}

#endif

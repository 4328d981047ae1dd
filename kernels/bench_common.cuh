/* Helpers of the stand-alone CUDA timing harnesses (kernels/bench_*.cu;
 * not part of the build): a CUDA status check that exits the harness with
 * the failing call's text, and the median of a set of timings. */
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

#endif

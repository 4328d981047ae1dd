/* llmem CUDA kernels: batched device copies (llmem_buffer_copy_ranges).
 *
 * One launch copies every range of a batch, instead of one
 * cudaMemcpyAsync per range (each costs microseconds of host time while
 * the GPU waits; a recurrent memory's snapshots at batch 64 are 3,712
 * ranges every 16 tokens). The table layout and the chunk walk are
 * described in kernels/copy.h; the idea is that of vLLM's copy_blocks
 * kernel (one launch over a table of block pairs), with chunks so that a
 * range of megabytes spreads over many CTAs.
 */
#include "kernels/common.cuh"
#include "kernels/copy.h"

#define COPY_THREADS 256
#define COPY_UNROLL 4

/* Index of the range holding chunk c: the last j with first[j] <= c. */
__device__ __forceinline__ int32_t range_of(const cuk_copy_range *r, int32_t n, uint64_t c)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) >> 1;
        if (r[mid].first <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Copies n units of T from s to d, COPY_UNROLL loads in flight per thread. */
template <typename T>
__device__ __forceinline__ void copy_units(const T *__restrict__ s, T *__restrict__ d, uint32_t n)
{
    const uint32_t step = COPY_THREADS * COPY_UNROLL;
    uint32_t i = threadIdx.x;
    for (; i + (COPY_UNROLL - 1) * COPY_THREADS < n; i += step) {
        T v[COPY_UNROLL];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++)
            v[u] = s[i + u * COPY_THREADS];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++)
            d[i + u * COPY_THREADS] = v[u];
    }
    for (; i < n; i += COPY_THREADS)
        d[i] = s[i];
}

__global__ void __launch_bounds__(COPY_THREADS)
    copy_ranges_kernel(const cuk_copy_range *__restrict__ r, int32_t n, uint64_t n_chunks)
{
    for (uint64_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        int32_t j = range_of(r, n, c);
        uint64_t off = (c - r[j].first) * CUK_COPY_CHUNK, size = r[j].size;
        if (off >= size)
            continue; /* cannot happen with a consistent table */
        uint32_t len = (uint32_t)(size - off < CUK_COPY_CHUNK ? size - off : CUK_COPY_CHUNK);
        const unsigned char *s = (const unsigned char *)r[j].src + off;
        unsigned char *d = (unsigned char *)r[j].dst + off;
        uint64_t mis = (uint64_t)s | (uint64_t)d;
        uint32_t done;
        if ((mis & 15) == 0) {
            copy_units<uint4>((const uint4 *)s, (uint4 *)d, len / 16);
            done = len / 16 * 16;
        } else if ((mis & 3) == 0) {
            copy_units<uint32_t>((const uint32_t *)s, (uint32_t *)d, len / 4);
            done = len / 4 * 4;
        } else {
            done = 0;
        }
        for (uint32_t k = done + threadIdx.x; k < len; k += COPY_THREADS)
            d[k] = s[k];
    }
}

extern "C" cudaError_t cuk_copy_ranges(const cuk_copy_range *ranges, int32_t n, uint64_t n_chunks,
                                       int n_sms, cudaStream_t stream)
{
    if (n <= 0 || n_chunks == 0)
        return cudaSuccess;
    /* 8 resident CTAs of 256 threads fill an SM; more chunks loop */
    uint64_t cap = (uint64_t)(n_sms > 0 ? n_sms : 1) * 8;
    unsigned grid = (unsigned)(n_chunks < cap ? n_chunks : cap);
    copy_ranges_kernel<<<grid, COPY_THREADS, 0, stream>>>(ranges, n, n_chunks);
    return cudaGetLastError();
}

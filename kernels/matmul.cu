/* llmem CUDA kernels, matmul family: the small-M GEMV and the activation
 * split used with cuBLAS.
 *
 * Decode runs matmuls with one to a few activation rows, where the time is
 * reading the weights once: one warp per output column reads its weight
 * row with 16-byte loads (eight in flight per lane), converts to f32 and
 * accumulates in f32 against every activation row, then reduces across the
 * warp. Larger M goes to cuBLAS (backends/cuda/cuda_matmul.c); for bf16
 * weights the activations are split into two bf16 terms, hi = bf16(a) and
 * lo = bf16(a - hi), so two tensor-core GEMMs with f32 accumulation give a
 * product accurate to about 2^-16 relative instead of the 2^-8 of a single
 * rounding (the "bf16x2" splitting of Henry, Tang & Heinecke 2019,
 * "Leveraging the bfloat16 Artificial Intelligence Datatype For
 * Higher-Precision Computations").
 */
#include <cuda_fp16.h>

#include "kernels/common.cuh"

#define GEMV_WARPS 8
#define GEMV_UNROLL 8


/* VEC: rows of w and a start 16-byte aligned and K is a whole number of
 * 16-byte chunks of w; otherwise one element per lane per step. */
template <typename WT, bool VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const float *__restrict__ a, const void *__restrict__ w, float *__restrict__ out,
                int32_t m, int32_t n, int32_t k)
{
    int lane = threadIdx.x & 31;
    int64_t col = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (col >= n)
        return;
    float acc[CUK_GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < CUK_GEMV_MAX_M; i++)
        acc[i] = 0.0f;
    if (VEC) {
        constexpr int E = cuk_unpack16<WT>::n;
        const uint4 *wr = (const uint4 *)((const char *)w + col * (int64_t)k * sizeof(WT));
        int64_t chunks = k / E;
        for (int64_t c0 = lane; c0 < chunks; c0 += 32 * GEMV_UNROLL) {
            uint4 wv[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int64_t c = c0 + 32 * u;
                wv[u] = c < chunks ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int64_t c = c0 + 32 * u;
                if (c >= chunks)
                    break;
                float wf[E];
                cuk_unpack16<WT>::run(wv[u], wf);
#pragma unroll
                for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
                    if (i >= m)
                        break;
                    const float4 *ar = (const float4 *)(a + (int64_t)i * k + c * E);
#pragma unroll
                    for (int e = 0; e < E / 4; e++) {
                        float4 av = __ldg(ar + e);
                        acc[i] += av.x * wf[4 * e] + av.y * wf[4 * e + 1] + av.z * wf[4 * e + 2] +
                                  av.w * wf[4 * e + 3];
                    }
                }
            }
        }
    } else {
        const void *wr = (const char *)w + col * (int64_t)k * sizeof(WT);
        for (int64_t c = lane; c < k; c += 32) {
            float wv = cuk_elem<WT>::load(wr, c);
#pragma unroll
            for (int i = 0; i < CUK_GEMV_MAX_M; i++)
                if (i < m)
                    acc[i] += a[(int64_t)i * k + c] * wv;
        }
    }
#pragma unroll
    for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
        if (i >= m)
            break;
        float s = cuk_warp_sum(acc[i]);
        if (lane == 0)
            out[(int64_t)i * n + col] = s;
    }
}

template <typename WT>
static cudaError_t gemv_launch(const float *a, const void *w, float *out, int32_t m, int32_t n,
                               int32_t k, cudaStream_t stream)
{
    constexpr int E = 16 / sizeof(WT);
    bool vec = ((uintptr_t)a % 16 == 0) && ((uintptr_t)w % 16 == 0) && k % E == 0 && k % 4 == 0;
    unsigned g = (unsigned)((n + GEMV_WARPS - 1) / GEMV_WARPS);
    if (vec)
        gemv_kernel<WT, true><<<g, GEMV_WARPS * 32, 0, stream>>>(a, w, out, m, n, k);
    else
        gemv_kernel<WT, false><<<g, GEMV_WARPS * 32, 0, stream>>>(a, w, out, m, n, k);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_gemv(const float *a, const void *w, int wdt, float *out, int32_t m,
                                int32_t n, int32_t k, cudaStream_t stream)
{
    if (m < 1 || m > CUK_GEMV_MAX_M)
        return cudaErrorInvalidValue;
    switch (wdt) {
    case CUK_F32: return gemv_launch<float>(a, w, out, m, n, k, stream);
    case CUK_F16: return gemv_launch<cuk_f16_t>(a, w, out, m, n, k, stream);
    case CUK_BF16: return gemv_launch<cuk_bf16_t>(a, w, out, m, n, k, stream);
    default: return cudaErrorInvalidValue;
    }
}

__global__ void split_bf16_kernel(const float *a, uint16_t *hi, uint16_t *lo, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = a[i];
        uint16_t h = cuk_f32_to_bf16(x);
        hi[i] = h;
        /* x - hi is exact in f32 (Sterbenz); inf/NaN give NaN, as they would. */
        lo[i] = cuk_f32_to_bf16(x - cuk_bf16_to_f32(h));
    }
}

extern "C" cudaError_t cuk_split_bf16(const float *a, uint16_t *hi, uint16_t *lo, int64_t n,
                                      cudaStream_t stream)
{
    split_bf16_kernel<<<cuk_grid(n, 256), 256, 0, stream>>>(a, hi, lo, n);
    return cudaGetLastError();
}

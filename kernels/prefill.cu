/* llmem CUDA kernels for prefill-sized ubatches: 16-byte column-slice
 * copies and the SwiGLU product with an optional bf16 copy of its output
 * (the "bf16 shadow" that fast-mode GEMMs read instead of rounding the f32
 * activations again; backends/cuda/cuda_ops.c). Memory-bound one-pass
 * kernels; each computes exactly the f32 values of its general
 * counterpart in basic.cu (copy_kernel, ew_kernel<CUK_EW_SWIGLU>), four
 * elements per thread. */
#include <math.h>

#include "kernels/common.cuh"
#include "kernels/prefill.h"

/* dst[r, c4] = src[r, col0 / 4 + c4] in float4 units. */
__global__ void copy_cols4_kernel(const float4 *src, int64_t src_c4, int64_t col0_4, float4 *dst,
                                  int64_t rows, int64_t c4)
{
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= c4)
        return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        dst[r * c4 + c] = src[r * src_c4 + col0_4 + c];
}

extern "C" cudaError_t cuk_copy_cols_f32(const float *src, int64_t src_cols, int64_t col0,
                                         float *dst, int64_t rows, int64_t cols,
                                         cudaStream_t stream)
{
    if (src_cols % 4 || col0 % 4 || cols % 4 || (uintptr_t)src % 16 || (uintptr_t)dst % 16 ||
        rows <= 0 || cols <= 0)
        return cudaErrorNotSupported;
    int64_t c4 = cols / 4;
    int threads = c4 >= 256 ? 256 : (int)((c4 + 31) / 32 * 32);
    dim3 g((unsigned)((c4 + threads - 1) / threads), (unsigned)(rows < 65535 ? rows : 65535));
    copy_cols4_kernel<<<g, threads, 0, stream>>>((const float4 *)src, src_cols / 4, col0 / 4,
                                                 (float4 *)dst, rows, c4);
    return cudaGetLastError();
}

/* basic.cu's silu_f, the same expression. */
__device__ __forceinline__ float pf_silu(float x)
{
    return x / (1.0f + expf(-x));
}

__global__ void swiglu4_kernel(const float4 *gate, const float4 *up, float4 *out, uint16_t *o16,
                               int64_t n4)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 g = gate[i], u = up[i];
        float4 r = make_float4(pf_silu(g.x) * u.x, pf_silu(g.y) * u.y, pf_silu(g.z) * u.z,
                               pf_silu(g.w) * u.w);
        out[i] = r;
        if (o16)
            cuk_store_bf16x4(o16 + 4 * i, r);
    }
}

extern "C" cudaError_t cuk_swiglu4(const float *gate, const float *up, float *out, uint16_t *o16,
                                   int64_t n, cudaStream_t stream)
{
    if (n <= 0 || n % 4 || (uintptr_t)gate % 16 || (uintptr_t)up % 16 || (uintptr_t)out % 16 ||
        (uintptr_t)o16 % 8)
        return cudaErrorNotSupported;
    swiglu4_kernel<<<cuk_grid(n / 4, 256), 256, 0, stream>>>(
        (const float4 *)gate, (const float4 *)up, (float4 *)out, o16, n / 4);
    return cudaGetLastError();
}

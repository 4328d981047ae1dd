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
#include <stdlib.h>

#include "kernels/common.cuh"
#include "kernels/gemv.h"

#define GEMV_WARPS 8
#define GEMV_UNROLL 8


/* The first UNR chunks per lane of weight chunks [c_lo, c_hi) of row wr
 * into L2: issued before cuk_pdl_wait, so under a programmatic launch
 * they stream while the kernel before finishes. */
template <int UNR>
__device__ __forceinline__ void gemv_prefetch(const uint4 *wr, int64_t c_lo, int64_t c_hi,
                                              int lane)
{
#pragma unroll
    for (int u = 0; u < UNR; u++) {
        int64_t c = c_lo + lane + 32 * u;
        if (c < c_hi)
            cuk_prefetch_l2(wr + c);
    }
}

/* One warp's share of a VEC dot product: 16-byte weight chunks
 * [c_lo, c_hi) of row wr, lane-strided, UNR chunks in flight per lane,
 * accumulated in f32 against each of the m activation rows of a. */
template <typename WT, int UNR>
__device__ __forceinline__ void gemv_chunks(const float *__restrict__ a, const uint4 *wr,
                                            int32_t m, int32_t k, int64_t c_lo, int64_t c_hi,
                                            int lane, float (&acc)[CUK_GEMV_MAX_M])
{
    constexpr int E = cuk_unpack16<WT>::n;
    for (int64_t c0 = c_lo + lane; c0 < c_hi; c0 += 32 * UNR) {
        uint4 wv[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int64_t c = c0 + 32 * u;
            wv[u] = c < c_hi ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            int64_t c = c0 + 32 * u;
            if (c >= c_hi)
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
}

/* VEC: rows of w and a start 16-byte aligned and K is a whole number of
 * 16-byte chunks of w; otherwise one element per lane per step. */
template <typename WT, bool VEC, int UNR = GEMV_UNROLL>
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
        gemv_prefetch<UNR>(wr, 0, k / E, lane);
        cuk_pdl_wait();
        gemv_chunks<WT, UNR>(a, wr, m, k, 0, k / E, lane, acc);
        cuk_pdl_trigger();
    } else {
        cuk_pdl_wait();
        const void *wr = (const char *)w + col * (int64_t)k * sizeof(WT);
        for (int64_t c = lane; c < k; c += 32) {
            float wv = cuk_elem<WT>::load(wr, c);
#pragma unroll
            for (int i = 0; i < CUK_GEMV_MAX_M; i++)
                if (i < m)
                    acc[i] += a[(int64_t)i * k + c] * wv;
        }
        cuk_pdl_trigger();
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

/* Variant (issue 11): each warp computes COLS adjacent columns, so one
 * load of an activation chunk serves COLS weight chunks (the activation
 * traffic through L1 drops by COLS); GEMV_UNROLL / COLS chunks of each of
 * the COLS rows are in flight per lane. VEC layout only. */
template <typename WT, int COLS>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_cols_kernel(const float *__restrict__ a, const void *__restrict__ w,
                     float *__restrict__ out, int32_t m, int32_t n, int32_t k)
{
    constexpr int E = cuk_unpack16<WT>::n;
    constexpr int U = GEMV_UNROLL / COLS > 0 ? GEMV_UNROLL / COLS : 1;
    int lane = threadIdx.x & 31;
    int64_t col0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * COLS;
    if (col0 >= n)
        return;
    float acc[COLS][CUK_GEMV_MAX_M];
#pragma unroll
    for (int j = 0; j < COLS; j++)
#pragma unroll
        for (int i = 0; i < CUK_GEMV_MAX_M; i++)
            acc[j][i] = 0.0f;
    int64_t chunks = k / E;
    const uint4 *wr[COLS];
#pragma unroll
    for (int j = 0; j < COLS; j++) /* rows past n re-read the last row; never stored */
        wr[j] = (const uint4 *)((const char *)w +
                                (col0 + j < n ? col0 + j : n - 1) * (int64_t)k * sizeof(WT));
#pragma unroll
    for (int j = 0; j < COLS; j++)
        gemv_prefetch<U>(wr[j], 0, chunks, lane);
    cuk_pdl_wait();
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
        uint4 wv[U][COLS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t c = c0 + 32 * u;
#pragma unroll
            for (int j = 0; j < COLS; j++)
                wv[u][j] = c < chunks ? __ldg(wr[j] + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t c = c0 + 32 * u;
            if (c >= chunks)
                break;
            float wf[COLS][E];
#pragma unroll
            for (int j = 0; j < COLS; j++)
                cuk_unpack16<WT>::run(wv[u][j], wf[j]);
#pragma unroll
            for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
                if (i >= m)
                    break;
                const float4 *ar = (const float4 *)(a + (int64_t)i * k + c * E);
#pragma unroll
                for (int e = 0; e < E / 4; e++) {
                    float4 av = __ldg(ar + e);
#pragma unroll
                    for (int j = 0; j < COLS; j++)
                        acc[j][i] += av.x * wf[j][4 * e] + av.y * wf[j][4 * e + 1] +
                                     av.z * wf[j][4 * e + 2] + av.w * wf[j][4 * e + 3];
                }
            }
        }
    }
    cuk_pdl_trigger();
#pragma unroll
    for (int j = 0; j < COLS; j++)
#pragma unroll
        for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
            if (i >= m)
                break;
            float s = cuk_warp_sum(acc[j][i]);
            if (lane == 0 && col0 + j < n)
                out[(int64_t)i * n + col0 + j] = s;
        }
}

/* Variant (issue 11): split-K for outputs too narrow to fill the device
 * with one warp per column (N = 4096 rows of 8-28 KB in the Bamba-9B
 * step). The 8 warps of a block take ROWS = 8 / S columns times S
 * contiguous K segments each; the S partial sums of a column are added in
 * a fixed order through shared memory, so results do not vary between
 * runs. VEC layout only. */
template <typename WT, int S>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_splitk_kernel(const float *__restrict__ a, const void *__restrict__ w,
                       float *__restrict__ out, int32_t m, int32_t n, int32_t k)
{
    constexpr int E = cuk_unpack16<WT>::n;
    constexpr int ROWS = GEMV_WARPS / S;
    __shared__ float part[GEMV_WARPS][CUK_GEMV_MAX_M];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t col = (int64_t)blockIdx.x * ROWS + warp / S;
    int seg = warp % S;
    float acc[CUK_GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < CUK_GEMV_MAX_M; i++)
        acc[i] = 0.0f;
    if (col < n) {
        int64_t chunks = k / E, per = (chunks + S - 1) / S;
        int64_t c_lo = seg * per, c_hi = c_lo + per < chunks ? c_lo + per : chunks;
        const uint4 *wr = (const uint4 *)((const char *)w + col * (int64_t)k * sizeof(WT));
        gemv_prefetch<GEMV_UNROLL>(wr, c_lo, c_hi, lane);
        cuk_pdl_wait();
        gemv_chunks<WT, GEMV_UNROLL>(a, wr, m, k, c_lo, c_hi, lane, acc);
    } else {
        cuk_pdl_wait(); /* out below is written after the kernel before has finished */
    }
    cuk_pdl_trigger();
#pragma unroll
    for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
        float s = cuk_warp_sum(acc[i]);
        if (lane == 0)
            part[warp][i] = s;
    }
    __syncthreads();
    if (threadIdx.x < ROWS * CUK_GEMV_MAX_M) {
        int r = threadIdx.x / CUK_GEMV_MAX_M, i = threadIdx.x % CUK_GEMV_MAX_M;
        int64_t c = (int64_t)blockIdx.x * ROWS + r;
        if (c < n && i < m) {
            float s = 0.0f;
#pragma unroll
            for (int q = 0; q < S; q++)
                s += part[r * S + q][i];
            out[(int64_t)i * n + c] = s;
        }
    }
}

/* K segments of the split-K GEMV: $LLMEM_CUDA_GEMV_SPLIT (1, 2, 4, 8)
 * when set; else 1 for n >= 8192, otherwise the smallest S with n * S >=
 * 16384 warps, keeping segments of at least 512 elements. */
static int gemv_split(int32_t n, int32_t k)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_SPLIT");
        int c = e ? atoi(e) : 0;
        env = c == 1 || c == 2 || c == 4 || c == 8 ? c : 0;
    }
    if (env)
        return env;
    if (n >= 8192)
        return 1;
    int sp = 1;
    while (sp < 8 && (int64_t)n * sp < 16384 && k / (sp * 2) >= 512)
        sp *= 2;
    return sp;
}

/* Columns per warp of the VEC GEMV: $LLMEM_CUDA_GEMV_COLS (1, 2 or 4)
 * when set, else 4 for n >= 8192 and 1 below (measured on the H200 at the
 * Bamba-9B shapes, docs/benchmarks.md: 4 columns win for the wide in_proj
 * and FFN up/gate, lose for the 4096-wide outputs with long rows). */
static int gemv_cols(int32_t n)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_COLS");
        int c = e ? atoi(e) : 0;
        env = c == 1 || c == 2 || c == 4 ? c : 0;
    }
    return env ? env : n >= 8192 ? 4 : 1;
}

/* Lanes' loads in flight of the one-column GEMV: $LLMEM_CUDA_GEMV_UNROLL
 * (8 or 16), default 8. */
static int gemv_unroll(void)
{
    static int u = 0;
    if (u == 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_UNROLL");
        u = e && atoi(e) == 16 ? 16 : 8;
    }
    return u;
}

template <typename WT>
static cudaError_t gemv_launch(const float *a, const void *w, float *out, int32_t m, int32_t n,
                               int32_t k, cudaStream_t stream)
{
    constexpr int E = 16 / sizeof(WT);
    bool vec = ((uintptr_t)a % 16 == 0) && ((uintptr_t)w % 16 == 0) && k % E == 0 && k % 4 == 0;
    int cols = gemv_cols(n), split = vec ? gemv_split(n, k) : 1;
    if (vec && split > 1) {
        unsigned gs = (unsigned)((n + GEMV_WARPS / split - 1) / (GEMV_WARPS / split));
        if (split == 2)
            return cuk_launch_pdl(gemv_splitk_kernel<WT, 2>, gs, GEMV_WARPS * 32, stream, a, w, out,
                                  m, n, k);
        else if (split == 4)
            return cuk_launch_pdl(gemv_splitk_kernel<WT, 4>, gs, GEMV_WARPS * 32, stream, a, w, out,
                                  m, n, k);
        else
            return cuk_launch_pdl(gemv_splitk_kernel<WT, 8>, gs, GEMV_WARPS * 32, stream, a, w, out,
                                  m, n, k);
    }
    if (vec && cols > 1) {
        unsigned gc = (unsigned)((n + GEMV_WARPS * cols - 1) / (GEMV_WARPS * cols));
        if (cols == 2)
            return cuk_launch_pdl(gemv_cols_kernel<WT, 2>, gc, GEMV_WARPS * 32, stream, a, w, out,
                                  m, n, k);
        else
            return cuk_launch_pdl(gemv_cols_kernel<WT, 4>, gc, GEMV_WARPS * 32, stream, a, w, out,
                                  m, n, k);
    }
    unsigned g = (unsigned)((n + GEMV_WARPS - 1) / GEMV_WARPS);
    if (vec && gemv_unroll() == 16)
        return cuk_launch_pdl(gemv_kernel<WT, true, 16>, g, GEMV_WARPS * 32, stream, a, w, out, m,
                              n, k);
    else if (vec)
        return cuk_launch_pdl(gemv_kernel<WT, true>, g, GEMV_WARPS * 32, stream, a, w, out, m,
                              n, k);
    else
        return cuk_launch_pdl(gemv_kernel<WT, false>, g, GEMV_WARPS * 32, stream, a, w, out, m,
                              n, k);
}

/* Whether one-row GEMVs go to the row-block kernel of gemv.cu:
 * $LLMEM_CUDA_GEMV_ROWS (0 = this file's kernels), default on (on the H200
 * it streams the Bamba-9B matrices at 85-95% of copy against 58-85% here;
 * docs/benchmarks.md, "Batch-1 GEMV and fused norms"). */
static bool gemv_rows_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_ROWS");
        on = !(e && atoi(e) == 0);
    }
    return on == 1;
}

extern "C" cudaError_t cuk_gemv(const float *a, const void *w, int wdt, float *out, int32_t m,
                                int32_t n, int32_t k, cudaStream_t stream)
{
    if (m < 1 || m > CUK_GEMV_MAX_M)
        return cudaErrorInvalidValue;
    if (m == 1 && gemv_rows_on()) {
        cuk_gemv_rows r = {};
        r.x = a;
        r.w = w;
        r.wdt = wdt;
        r.out = out;
        r.m = 1;
        r.n = n;
        r.k = k;
        if (cuk_gemv_rows_ok(&r))
            return cuk_gemv_rows_run(&r, stream);
    }
    switch (wdt) {
    case CUK_F32: return gemv_launch<float>(a, w, out, m, n, k, stream);
    case CUK_F16: return gemv_launch<cuk_f16_t>(a, w, out, m, n, k, stream);
    case CUK_BF16: return gemv_launch<cuk_bf16_t>(a, w, out, m, n, k, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Fused gate/up GEMV + SwiGLU (issue 11): one warp per output column reads
 * row j of gate and of up (GEMV_UNROLL / 2 chunks of each in flight per
 * lane) against the same activation chunk, and writes silu(g) * u: one
 * launch instead of two GEMVs and an element-wise kernel, and neither
 * product goes through memory. VEC layout only. */
template <typename WT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_swiglu_kernel(const float *__restrict__ a, const void *__restrict__ wg,
                       const void *__restrict__ wu, float *__restrict__ out, int32_t m,
                       int32_t n, int32_t k)
{
    constexpr int E = cuk_unpack16<WT>::n;
    constexpr int U = GEMV_UNROLL / 2;
    int lane = threadIdx.x & 31;
    int64_t col = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (col >= n)
        return;
    float ag[CUK_GEMV_MAX_M], au[CUK_GEMV_MAX_M];
#pragma unroll
    for (int i = 0; i < CUK_GEMV_MAX_M; i++)
        ag[i] = au[i] = 0.0f;
    int64_t chunks = k / E;
    const uint4 *rg = (const uint4 *)((const char *)wg + col * (int64_t)k * sizeof(WT));
    const uint4 *ru = (const uint4 *)((const char *)wu + col * (int64_t)k * sizeof(WT));
    gemv_prefetch<U>(rg, 0, chunks, lane);
    gemv_prefetch<U>(ru, 0, chunks, lane);
    cuk_pdl_wait();
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
        uint4 vg[U], vu[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t c = c0 + 32 * u;
            vg[u] = c < chunks ? __ldg(rg + c) : make_uint4(0, 0, 0, 0);
            vu[u] = c < chunks ? __ldg(ru + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t c = c0 + 32 * u;
            if (c >= chunks)
                break;
            float fg[E], fu[E];
            cuk_unpack16<WT>::run(vg[u], fg);
            cuk_unpack16<WT>::run(vu[u], fu);
#pragma unroll
            for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
                if (i >= m)
                    break;
                const float4 *ar = (const float4 *)(a + (int64_t)i * k + c * E);
#pragma unroll
                for (int e = 0; e < E / 4; e++) {
                    float4 av = __ldg(ar + e);
                    ag[i] += av.x * fg[4 * e] + av.y * fg[4 * e + 1] + av.z * fg[4 * e + 2] +
                             av.w * fg[4 * e + 3];
                    au[i] += av.x * fu[4 * e] + av.y * fu[4 * e + 1] + av.z * fu[4 * e + 2] +
                             av.w * fu[4 * e + 3];
                }
            }
        }
    }
    cuk_pdl_trigger();
#pragma unroll
    for (int i = 0; i < CUK_GEMV_MAX_M; i++) {
        if (i >= m)
            break;
        float g = cuk_warp_sum(ag[i]), u = cuk_warp_sum(au[i]);
        if (lane == 0)
            out[(int64_t)i * n + col] = g / (1.0f + expf(-g)) * u;
    }
}

template <typename WT>
static cudaError_t gemv_swiglu_launch(const float *a, const void *wg, const void *wu, float *out,
                                      int32_t m, int32_t n, int32_t k, cudaStream_t stream)
{
    constexpr int E = 16 / sizeof(WT);
    bool vec = ((uintptr_t)a % 16 == 0) && ((uintptr_t)wg % 16 == 0) &&
               ((uintptr_t)wu % 16 == 0) && k % E == 0 && k % 4 == 0;
    if (!vec)
        return cudaErrorNotSupported;
    unsigned g = (unsigned)((n + GEMV_WARPS - 1) / GEMV_WARPS);
    return cuk_launch_pdl(gemv_swiglu_kernel<WT>, g, GEMV_WARPS * 32, stream, a, wg, wu, out, m,
                          n, k);
}

extern "C" cudaError_t cuk_gemv_swiglu(const float *a, const void *wg, const void *wu, int wdt,
                                       float *out, int32_t m, int32_t n, int32_t k,
                                       cudaStream_t stream)
{
    if (m < 1 || m > CUK_GEMV_MAX_M)
        return cudaErrorInvalidValue;
    switch (wdt) {
    case CUK_F32: return gemv_swiglu_launch<float>(a, wg, wu, out, m, n, k, stream);
    case CUK_F16: return gemv_swiglu_launch<cuk_f16_t>(a, wg, wu, out, m, n, k, stream);
    case CUK_BF16: return gemv_swiglu_launch<cuk_bf16_t>(a, wg, wu, out, m, n, k, stream);
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
        /* x - hi is exact in f32 (Sterbenz); inf/NaN give NaN, as they would.
         * No lo (fast mode's single GEMM): hi only. */
        if (lo)
            lo[i] = cuk_f32_to_bf16(x - cuk_bf16_to_f32(h));
    }
}

extern "C" cudaError_t cuk_split_bf16(const float *a, uint16_t *hi, uint16_t *lo, int64_t n,
                                      cudaStream_t stream)
{
    split_bf16_kernel<<<cuk_grid(n, 256), 256, 0, stream>>>(a, hi, lo, n);
    return cudaGetLastError();
}

/* llmem CUDA kernels: mixture of experts (llmem_op_moe_route, llmem_op_moe_ffn).
 *
 * moe_route: one block per token; the threads compute the scores in shared
 * memory, then thread 0 selects the groups and the top-k exactly as the CPU
 * reference (backends/cpu/ops_moe.c), so the chosen ids agree.
 * moe_ffn: three kernels over the T*k (token, choice) pairs, which read
 * only the chosen experts' weights (the decode bound counts k experts a
 * token):
 *   up:      h[q, i] = act(gate_e[i] · x_t) * (up_e[i] · x_t)   one warp per (q, i)
 *   down:    y[q, d] = w[q] * (down_e[d] · h[q])                one warp per (q, d)
 *   combine: out[t, d] = sum_j y[t*k + j, d], in choice order (deterministic).
 * From CUK_MOE_GROUP_MIN pairs up (batched decode, prefill) the pairs are
 * first grouped by expert on the device, and up/down run one warp per
 * (expert, row) over that expert's pairs, so each chosen expert's rows are
 * read from memory once per step instead of once per pair.
 * Pairs whose id lies outside [0, E) contribute zero and read nothing.
 * Rows are dotted with 16-byte vector loads when aligned (as the GEMV of
 * matmul.cu), f32 accumulation.
 */
#include "kernels/common.cuh"
#include "kernels/moe.h"

#define MOE_WARPS 8

/* warp-wide dot of x[0..k) (f32) with a weight row of type WT */
template <typename WT, bool VEC>
__device__ __forceinline__ float row_dot(const float *__restrict__ x, const void *__restrict__ wr,
                                         int64_t k, int lane)
{
    float acc = 0.0f;
    if (VEC) {
        constexpr int E = cuk_unpack16<WT>::n;
        const uint4 *w4 = (const uint4 *)wr;
        int64_t chunks = k / E;
        for (int64_t c = lane; c < chunks; c += 32) {
            float wf[E];
            cuk_unpack16<WT>::run(__ldg(w4 + c), wf);
            const float4 *xr = (const float4 *)(x + c * E);
#pragma unroll
            for (int e = 0; e < E / 4; e++) {
                float4 xv = xr[e];
                acc += xv.x * wf[4 * e] + xv.y * wf[4 * e + 1] + xv.z * wf[4 * e + 2] +
                       xv.w * wf[4 * e + 3];
            }
        }
    } else {
        for (int64_t c = lane; c < k; c += 32)
            acc += x[c] * cuk_elem<WT>::load(wr, c);
    }
    return cuk_warp_sum(acc);
}

__device__ __forceinline__ float moe_act(int act, float v)
{
    return act == 1 ? (v > 0.0f ? v * v : 0.0f) : v / (1.0f + expf(-v));
}

template <typename WT, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_up_kernel(const float *__restrict__ x, const int32_t *__restrict__ ids, const void *up,
                  float *__restrict__ h, int32_t D, int32_t I, int32_t E, int32_t k, int gated,
                  int act)
{
    int lane = threadIdx.x & 31;
    int64_t i = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    int64_t q = blockIdx.x;
    if (i >= I)
        return;
    int32_t e = ids[q];
    if (e < 0 || e >= E) {
        if (lane == 0)
            h[q * I + i] = 0.0f;
        return;
    }
    const float *xr = x + (q / k) * (int64_t)D;
    int64_t rows = gated ? 2 * (int64_t)I : I;
    const char *base = (const char *)up + (int64_t)e * rows * D * (int64_t)sizeof(WT);
    float u = row_dot<WT, VEC>(xr, base + ((gated ? I : 0) + i) * D * (int64_t)sizeof(WT), D, lane);
    float v;
    if (gated) {
        float g = row_dot<WT, VEC>(xr, base + i * D * (int64_t)sizeof(WT), D, lane);
        v = moe_act(act, g) * u;
    } else {
        v = moe_act(act, u);
    }
    if (lane == 0)
        h[q * I + i] = v;
}

template <typename WT, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_kernel(const float *__restrict__ h, const int32_t *__restrict__ ids,
                    const float *__restrict__ wts, const void *down, float *__restrict__ y,
                    int32_t D, int32_t I, int32_t E)
{
    int lane = threadIdx.x & 31;
    int64_t d = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    int64_t q = blockIdx.x;
    if (d >= D)
        return;
    int32_t e = ids[q];
    float v = 0.0f;
    if (e >= 0 && e < E) {
        const char *row = (const char *)down + ((int64_t)e * D + d) * I * (int64_t)sizeof(WT);
        v = wts[q] * row_dot<WT, VEC>(h + q * I, row, I, lane);
    }
    if (lane == 0)
        y[q * D + d] = v;
}

__global__ void moe_combine_kernel(const float *__restrict__ y, float *__restrict__ out,
                                   int64_t T, int32_t D, int32_t k)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * D)
        return;
    int64_t t = i / D, d = i % D;
    float s = 0.0f;
    for (int32_t j = 0; j < k; j++)
        s += y[(t * k + j) * D + d];
    out[i] = s;
}


/* ---- grouped path (many pairs): pairs sorted by expert ----------------------------------- */

/* start[e] .. start[e + 1] index sorted[], the pairs of expert e in pair
 * order; ids outside [0, E) are left out. One block; E * P work, which is
 * small beside the GEMVs it orders. */
__global__ void moe_group_kernel(const int32_t *__restrict__ ids, int64_t P, int32_t E,
                                 int32_t *__restrict__ start, int32_t *__restrict__ sorted)
{
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t n = 0;
        for (int64_t q = 0; q < P; q++)
            n += ids[q] == e;
        start[e + 1] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        start[0] = 0;
        for (int32_t e = 0; e < E; e++)
            start[e + 1] += start[e];
    }
    __syncthreads();
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t at = start[e];
        for (int64_t q = 0; q < P; q++)
            if (ids[q] == e)
                sorted[at++] = (int32_t)q;
    }
}

/* One warp per weight row of one expert, over all of that expert's pairs:
 * the row is read from memory once and from L1 after that. */
template <typename WT, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_up_grouped_kernel(const float *__restrict__ x, const int32_t *__restrict__ start,
                          const int32_t *__restrict__ sorted, const void *up,
                          float *__restrict__ h, int32_t D, int32_t I, int32_t k, int gated,
                          int act)
{
    int lane = threadIdx.x & 31;
    int32_t e = blockIdx.x;
    int64_t i = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (i >= I)
        return;
    int64_t rows = gated ? 2 * (int64_t)I : I;
    const char *base = (const char *)up + (int64_t)e * rows * D * (int64_t)sizeof(WT);
    const char *ur = base + ((gated ? I : 0) + i) * D * (int64_t)sizeof(WT);
    const char *gr = base + i * D * (int64_t)sizeof(WT);
    for (int32_t s = start[e]; s < start[e + 1]; s++) {
        int64_t q = sorted[s];
        const float *xr = x + (q / k) * (int64_t)D;
        float u = row_dot<WT, VEC>(xr, ur, D, lane);
        float v = gated ? moe_act(act, row_dot<WT, VEC>(xr, gr, D, lane)) * u : moe_act(act, u);
        if (lane == 0)
            h[q * I + i] = v;
    }
}

template <typename WT, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_grouped_kernel(const float *__restrict__ h, const int32_t *__restrict__ start,
                            const int32_t *__restrict__ sorted, const float *__restrict__ wts,
                            const void *down, float *__restrict__ y, int32_t D, int32_t I)
{
    int lane = threadIdx.x & 31;
    int32_t e = blockIdx.x;
    int64_t d = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (d >= D)
        return;
    const char *row = (const char *)down + ((int64_t)e * D + d) * I * (int64_t)sizeof(WT);
    for (int32_t s = start[e]; s < start[e + 1]; s++) {
        int64_t q = sorted[s];
        float v = wts[q] * row_dot<WT, VEC>(h + q * I, row, I, lane);
        if (lane == 0)
            y[q * D + d] = v;
    }
}

/* Pairs with an id outside [0, E) are in no group: zero their rows of y. */
__global__ void moe_zero_bad_kernel(const int32_t *__restrict__ ids, int64_t P, int32_t E,
                                    float *__restrict__ y, int32_t D)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= P * D)
        return;
    int32_t e = ids[i / D];
    if (e < 0 || e >= E)
        y[i] = 0.0f;
}

template <typename WT>
static cudaError_t ffn_launch(const float *x, const int32_t *ids, const float *wts,
                              const void *up, const void *down, float *out, float *h, float *y,
                              int64_t T, int32_t D, int32_t I, int32_t E, int32_t k, int gated,
                              int act, bool grouped, cudaStream_t stream)
{
    constexpr int EL = 16 / sizeof(WT);
    int64_t P = T * k;
    bool vec_up = (uintptr_t)x % 16 == 0 && (uintptr_t)up % 16 == 0 && D % EL == 0 && D % 4 == 0;
    bool vec_dn = (uintptr_t)h % 16 == 0 && (uintptr_t)down % 16 == 0 && I % EL == 0 &&
                  I % 4 == 0;
    if (grouped) {
        int32_t *start = (int32_t *)(y + P * D), *sorted = start + E + 1;
        moe_group_kernel<<<1, 256, 0, stream>>>(ids, P, E, start, sorted);
        dim3 gu((unsigned)E, (unsigned)((I + MOE_WARPS - 1) / MOE_WARPS));
        dim3 gd((unsigned)E, (unsigned)((D + MOE_WARPS - 1) / MOE_WARPS));
        if (I > 0) {
            if (vec_up)
                moe_up_grouped_kernel<WT, true><<<gu, MOE_WARPS * 32, 0, stream>>>(
                    x, start, sorted, up, h, D, I, k, gated, act);
            else
                moe_up_grouped_kernel<WT, false><<<gu, MOE_WARPS * 32, 0, stream>>>(
                    x, start, sorted, up, h, D, I, k, gated, act);
            if (vec_dn)
                moe_down_grouped_kernel<WT, true><<<gd, MOE_WARPS * 32, 0, stream>>>(
                    h, start, sorted, wts, down, y, D, I);
            else
                moe_down_grouped_kernel<WT, false><<<gd, MOE_WARPS * 32, 0, stream>>>(
                    h, start, sorted, wts, down, y, D, I);
        }
        int64_t ny = P * D;
        if (I > 0)
            moe_zero_bad_kernel<<<(unsigned)((ny + 255) / 256), 256, 0, stream>>>(ids, P, E, y,
                                                                                D);
        else
            cudaMemsetAsync(y, 0, (size_t)ny * sizeof(float), stream);
        moe_combine_kernel<<<(unsigned)((T * D + 255) / 256), 256, 0, stream>>>(y, out, T, D, k);
        return cudaGetLastError();
    }
    /* pairs on x (up to 2^31 - 1), row tiles on y (<= 65535 tiles of 8 rows) */
    dim3 gu((unsigned)P, (unsigned)((I + MOE_WARPS - 1) / MOE_WARPS));
    dim3 gd((unsigned)P, (unsigned)((D + MOE_WARPS - 1) / MOE_WARPS));
    if (I > 0) {
        if (vec_up)
            moe_up_kernel<WT, true><<<gu, MOE_WARPS * 32, 0, stream>>>(x, ids, up, h, D, I, E, k,
                                                                       gated, act);
        else
            moe_up_kernel<WT, false><<<gu, MOE_WARPS * 32, 0, stream>>>(x, ids, up, h, D, I, E,
                                                                        k, gated, act);
    }
    if (vec_dn && I > 0)
        moe_down_kernel<WT, true><<<gd, MOE_WARPS * 32, 0, stream>>>(h, ids, wts, down, y, D, I,
                                                                     E);
    else
        moe_down_kernel<WT, false><<<gd, MOE_WARPS * 32, 0, stream>>>(h, ids, wts, down, y, D,
                                                                      I, E);
    int64_t n = T * D;
    moe_combine_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(y, out, T, D, k);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_moe_ffn(const float *x, const int32_t *ids, const float *wts,
                                   const void *up, const void *down, int wdt, float *out,
                                   float *scratch, int64_t T, int32_t D, int32_t I, int32_t E,
                                   int32_t k, int gated, int act, cudaStream_t stream)
{
    if ((I + MOE_WARPS - 1) / MOE_WARPS > 65535 || (D + MOE_WARPS - 1) / MOE_WARPS > 65535)
        return cudaErrorInvalidValue;
    float *h = scratch, *y = scratch + T * k * (int64_t)I;
    /* few pairs (decode): one warp per (pair, row) keeps the GPU busy; many:
     * group them by expert so each expert row is read once */
    bool grouped = T * k >= CUK_MOE_GROUP_MIN;
    switch (wdt) {
    case CUK_F32:
        return ffn_launch<float>(x, ids, wts, up, down, out, h, y, T, D, I, E, k, gated, act,
                                 grouped, stream);
    case CUK_F16:
        return ffn_launch<cuk_f16_t>(x, ids, wts, up, down, out, h, y, T, D, I, E, k, gated, act,
                                     grouped, stream);
    case CUK_BF16:
        return ffn_launch<cuk_bf16_t>(x, ids, wts, up, down, out, h, y, T, D, I, E, k, gated,
                                      act, grouped, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- routing ------------------------------------------------------------------------------ */

__global__ void moe_route_kernel(const float *__restrict__ logits, const void *bias, int bdt,
                                 int32_t *__restrict__ ids, float *__restrict__ wts, int32_t E,
                                 int32_t k, int sigmoid, int norm, int32_t G, int32_t topk_group,
                                 float scale)
{
    extern __shared__ float sm[];
    float *s = sm, *c = sm + E;
    __shared__ float red[32];
    int64_t t = blockIdx.x;
    const float *l = logits + t * E;
    float mx = -INFINITY;
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
        mx = fmaxf(mx, l[e]);
    if (!sigmoid)
        mx = cuk_block_max(mx, red);
    float sum = 0.0f;
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) {
        float v = sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - mx);
        s[e] = v;
        sum += v;
    }
    if (!sigmoid)
        sum = cuk_block_sum(sum, red);
    __syncthreads();
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) {
        if (!sigmoid)
            s[e] = s[e] / sum;
        c[e] = s[e] + (bias ? cuk_load(bias, bdt, e) : 0.0f);
    }
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    int32_t gs = E / G;
    uint32_t keep = G == 1 ? 1u : 0u; /* bit g: group g selectable (G <= 32 checked) */
    for (int32_t n = 0; G > 1 && n < topk_group; n++) {
        int32_t best = -1;
        float bs = 0.0f;
        for (int32_t g = 0; g < G; g++) {
            if (keep >> g & 1u)
                continue;
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int32_t e = g * gs; e < (g + 1) * gs; e++) {
                if (c[e] > m1) {
                    m2 = m1;
                    m1 = c[e];
                } else if (c[e] > m2) {
                    m2 = c[e];
                }
            }
            if (best < 0 || m1 + m2 > bs) {
                best = g;
                bs = m1 + m2;
            }
        }
        keep |= 1u << best;
    }
    float wsum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            if (!(G == 1 || (keep >> (e / gs) & 1u)) || c[e] == -INFINITY)
                continue;
            if (best < 0 || c[e] > c[best])
                best = e;
        }
        if (best < 0)
            for (int32_t e = 0; e < E && best < 0; e++)
                if (c[e] != -INFINITY)
                    best = e;
        ids[t * k + j] = best;
        wts[t * k + j] = s[best];
        wsum += s[best];
        c[best] = -INFINITY;
    }
    for (int32_t j = 0; j < k; j++) {
        float w = wts[t * k + j];
        if (norm)
            w = w / (wsum + 1e-20f);
        wts[t * k + j] = w * scale;
    }
}

extern "C" cudaError_t cuk_moe_route(const float *logits, const void *bias, int bdt,
                                     int32_t *ids, float *wts, int64_t T, int32_t E, int32_t k,
                                     int sigmoid, int norm, int32_t n_group, int32_t topk_group,
                                     float scale, cudaStream_t stream)
{
    int32_t G = n_group > 1 ? n_group : 1;
    if (G > 32 || (size_t)E * 2 * sizeof(float) > 48 * 1024)
        return cudaErrorInvalidValue;
    moe_route_kernel<<<(unsigned)T, 64, (size_t)E * 2 * sizeof(float), stream>>>(
        logits, bias, bdt, ids, wts, E, k, sigmoid, norm, G, topk_group, scale);
    return cudaGetLastError();
}

/* llmem CUDA kernels: sampling on the device — sample (temperature, top-k,
 * top-p, min-p), logprob_gather and top_logprobs (<llmem/ops.h>).
 *
 * One block of SAMPLE_THREADS threads per row; the row (up to a few
 * hundred KB) is read several times and stays in L2. No sort: the kept
 * sets are thresholds on a monotone integer key of each logit,
 *   key(x) = bits(x) ^ (x < 0 ? 0xffffffff : 0x80000000),
 * so x_a > x_b exactly when key_a > key_b and ties are kept together, as
 * the contract defines them:
 *   - top-k and the n-th best of top_logprobs: an MSB-first radix select
 *     (four 8-bit histogram passes with integer shared-memory atomics,
 *     deterministic) finds the key of the k-th largest entry;
 *   - top-p: a 32-step bisection on the key finds the smallest threshold
 *     whose strictly-larger mass is below top_p * W_k; each step is a
 *     block sum in a fixed order, so the result does not change between
 *     runs;
 *   - the draw: each thread owns a contiguous chunk of the row, an
 *     exclusive scan of the chunk sums (fixed order) finds the chunk that
 *     holds u * W, and its thread walks it in vocabulary order.
 * References: Holtzman et al. 2020 (top-p); Nguyen et al. 2024 (min-p);
 * radix select as in Alabi et al. 2012, "Fast k-selection algorithms for
 * graphics processing units".
 */
#include "kernels/common.cuh"

#define SAMPLE_THREADS 1024

__device__ __forceinline__ uint32_t sample_key(float x)
{
    uint32_t u = __float_as_uint(x);
    return u ^ ((u & 0x80000000u) ? 0xffffffffu : 0x80000000u);
}

/* Entries that can be drawn: not NaN, not -inf. Their key is > 0. */
__device__ __forceinline__ uint32_t draw_key(float x)
{
    return isnan(x) || x == -INFINITY ? 0u : sample_key(x);
}

/* Entries that can be listed by top_logprobs: not NaN (key 0). */
__device__ __forceinline__ uint32_t list_key(float x)
{
    return isnan(x) ? 0u : sample_key(x);
}

__device__ __forceinline__ uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* The key of the k-th largest (1-based) of the row's keys, given that at
 * least k keys are >= 1 (or k counts key 0 too when `list`). */
__device__ uint32_t radix_select(const float *x, int64_t n, int64_t k, bool list, int *hist,
                                 uint32_t *bcast)
{
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            uint32_t key = list ? list_key(x[i]) : draw_key(x[i]);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int64_t above = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (above + hist[b] >= k)
                    break;
                above += hist[b];
            }
            bcast[0] = (uint32_t)b;
            bcast[1] = (uint32_t)above;
        }
        __syncthreads();
        prefix |= bcast[0] << shift;
        mask |= 255u << shift;
        k -= (int64_t)bcast[1];
        __syncthreads();
    }
    return prefix;
}

/* Inclusive block scan of one float per thread (fixed order). */
__device__ float block_scan_incl(float v, float *warp_sums)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        float t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += t;
    }
    __syncthreads();
    if (lane == 31)
        warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < n_warps ? warp_sums[lane] : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            float t = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o)
                s += t;
        }
        warp_sums[lane] = s; /* inclusive over warps */
    }
    __syncthreads();
    return v + (warp > 0 ? warp_sums[warp - 1] : 0.0f);
}

struct sample_args {
    float inv_t, top_p, min_p;
    int32_t top_k;
    uint32_t seed_lo, seed_hi;
};

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *logits, int64_t rows, int64_t cols, const int32_t *ctr,
                  sample_args a, int32_t *out)
{
    __shared__ int hist[256];
    __shared__ uint32_t bcast[2];
    __shared__ float red[32];
    __shared__ float bounds[SAMPLE_THREADS + 1];
    __shared__ int32_t pick;
    __shared__ int32_t last_kept;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * cols;
        /* max and count of drawable entries */
        float mx = -INFINITY;
        float cnt = 0.0f; /* exact up to 2^24 entries */
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = x[i];
            if (draw_key(v)) {
                mx = fmaxf(mx, v);
                cnt += 1.0f;
            }
        }
        mx = cuk_block_max(mx, red);
        int64_t n_valid = (int64_t)cuk_block_sum(cnt, red);
        if (n_valid == 0) {
            if (threadIdx.x == 0)
                out[r] = 0;
            __syncthreads();
            continue;
        }
        /* top-k threshold on the key (0: off) */
        uint32_t tk = 1;
        if (a.top_k > 0 && a.top_k < n_valid)
            tk = radix_select(x, cols, a.top_k, false, hist, bcast);
#define W_OF(v) ((v) == mx ? 1.0f : expf(((v) - mx) * a.inv_t))
        /* top-p threshold: smallest t with mass(key > t, key >= tk) < top_p * W_k */
        uint32_t tp = 1;
        if (a.top_p < 1.0f) {
            float wk = 0.0f;
            for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
                float v = x[i];
                uint32_t key = draw_key(v);
                if (key >= tk)
                    wk += W_OF(v);
            }
            float limit = a.top_p * cuk_block_sum(wk, red);
            uint32_t lo = tk, hi = sample_key(mx); /* mass(key > key(max)) = 0 < limit */
            while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;
                float s = 0.0f;
                for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
                    float v = x[i];
                    uint32_t key = draw_key(v);
                    if (key > mid && key >= tk)
                        s += W_OF(v);
                }
                s = cuk_block_sum(s, red);
                if (s < limit)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            tp = lo;
        }
        uint32_t thr = tk > tp ? tk : tp;
        /* the draw: contiguous chunks, exclusive scan of chunk sums */
        int64_t chunk = (cols + blockDim.x - 1) / blockDim.x;
        int64_t c0 = (int64_t)threadIdx.x * chunk, c1 = c0 + chunk < cols ? c0 + chunk : cols;
        float local = 0.0f;
        int32_t my_last = -1;
        for (int64_t i = c0; i < c1; i++) {
            float v = x[i];
            if (draw_key(v) >= thr) {
                float w = W_OF(v);
                if (w >= a.min_p) {
                    local += w;
                    my_last = (int32_t)i;
                }
            }
        }
        if (threadIdx.x == 0) {
            pick = INT32_MAX;
            last_kept = -1;
            bounds[0] = 0.0f;
        }
        /* thread t's interval is [bounds[t], bounds[t + 1]), both taken
         * from one inclusive scan, so neighbours agree on their border */
        float incl = block_scan_incl(local, red);
        bounds[threadIdx.x + 1] = incl;
        __syncthreads();
        float total = bounds[blockDim.x], excl = bounds[threadIdx.x];
        uint32_t c = ctr ? (uint32_t)ctr[r] : (uint32_t)r;
        uint32_t h = mix32(mix32(mix32(c) ^ a.seed_lo) ^ a.seed_hi);
        float target = (float)(h >> 8) * 0x1p-24f * total;
        atomicMax(&last_kept, my_last);
        if (local > 0.0f && excl <= target && target < incl) {
            float run = excl;
            int32_t got = my_last;
            for (int64_t i = c0; i < c1; i++) {
                float v = x[i];
                if (draw_key(v) >= thr) {
                    float w = W_OF(v);
                    if (w >= a.min_p) {
                        run += w;
                        if (run > target) {
                            got = (int32_t)i;
                            break;
                        }
                    }
                }
            }
            /* the intervals are disjoint unless rounding made the scan
             * non-monotone; then the lowest index wins, deterministically */
            atomicMin(&pick, got);
        }
        __syncthreads();
        if (threadIdx.x == 0)
            out[r] = pick != INT32_MAX ? pick : last_kept;
        __syncthreads();
#undef W_OF
    }
}

extern "C" cudaError_t cuk_sample(const float *logits, int64_t rows, int64_t cols,
                                  const int32_t *ctr, float temperature, int32_t top_k,
                                  float top_p, float min_p, uint64_t seed, int32_t *out,
                                  cudaStream_t stream)
{
    if (!(temperature > 0.0f))
        return cuk_argmax(logits, rows, cols, out, stream);
    sample_args a = {1.0f / temperature, top_p, min_p, top_k, (uint32_t)seed,
                     (uint32_t)(seed >> 32)};
    unsigned g = (unsigned)(rows < 65535 ? rows : 65535);
    sample_kernel<<<g, SAMPLE_THREADS, 0, stream>>>(logits, rows, cols, ctr, a, out);
    return cudaGetLastError();
}

/* log-sum-exp of a row over non-NaN entries (as the CPU reference); an
 * infinite max is returned as is. Every thread gets the value. */
__device__ float row_lse(const float *x, int64_t cols, float *red)
{
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
        if (!isnan(x[i]))
            mx = fmaxf(mx, x[i]);
    mx = cuk_block_max(mx, red);
    if (isinf(mx))
        return mx;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
        if (!isnan(x[i]))
            s += expf(x[i] - mx);
    s = cuk_block_sum(s, red);
    return mx + logf(s);
}

__global__ void logprob_gather_kernel(const float *logits, int64_t rows, int64_t cols,
                                      const int32_t *ids, float *out)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * cols;
        float lse = row_lse(x, cols, red);
        if (threadIdx.x == 0) {
            int32_t id = ids[r];
            out[r] = id >= 0 && id < cols ? x[id] - lse : __int_as_float(0x7fc00000);
        }
    }
}

extern "C" cudaError_t cuk_logprob_gather(const float *logits, int64_t rows, int64_t cols,
                                          const int32_t *ids, float *out, cudaStream_t stream)
{
    int threads = cols >= 8192 ? 1024 : cols >= 256 ? 256 : 64;
    unsigned g = (unsigned)(rows < 65535 ? rows : 65535);
    logprob_gather_kernel<<<g, threads, 0, stream>>>(logits, rows, cols, ids, out);
    return cudaGetLastError();
}

/* The n best of each row: radix-select the n-th largest list key, take
 * every entry above it and the lowest-index entries equal to it (ordered
 * by a chunk scan), then thread 0 sorts the n (<= 64) candidates. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    top_logprobs_kernel(const float *logits, int64_t rows, int64_t cols, int32_t n,
                        int32_t *top_ids, float *top_lp)
{
    __shared__ int hist[256];
    __shared__ uint32_t bcast[2];
    __shared__ float red[32];
    __shared__ int32_t cand[64];
    __shared__ int n_above;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = logits + r * cols;
        uint32_t t = radix_select(x, cols, n, true, hist, bcast);
        if (threadIdx.x == 0)
            n_above = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
            if (list_key(x[i]) > t)
                cand[atomicAdd(&n_above, 1)] = (int32_t)i; /* fewer than n of them */
        __syncthreads();
        int need = n - n_above;
        /* ties at t, lowest indices first */
        int64_t chunk = (cols + blockDim.x - 1) / blockDim.x;
        int64_t c0 = (int64_t)threadIdx.x * chunk, c1 = c0 + chunk < cols ? c0 + chunk : cols;
        float ties = 0.0f;
        for (int64_t i = c0; i < c1; i++)
            ties += list_key(x[i]) == t ? 1.0f : 0.0f;
        float incl = block_scan_incl(ties, red);
        int rank = (int)(incl - ties);
        for (int64_t i = c0; i < c1 && rank < need; i++)
            if (list_key(x[i]) == t)
                cand[n_above + rank++] = (int32_t)i;
        __syncthreads();
        float lse = row_lse(x, cols, red);
        if (threadIdx.x == 0) {
            for (int a = 1; a < n; a++) { /* insertion sort: larger key, then lower index */
                int32_t c = cand[a];
                uint32_t kc = list_key(x[c]);
                int b = a;
                while (b > 0) {
                    int32_t p = cand[b - 1];
                    uint32_t kp = list_key(x[p]);
                    if (kp > kc || (kp == kc && p < c))
                        break;
                    cand[b] = p;
                    b--;
                }
                cand[b] = c;
            }
            for (int a = 0; a < n; a++) {
                top_ids[r * n + a] = cand[a];
                top_lp[r * n + a] = x[cand[a]] - lse;
            }
        }
        __syncthreads();
    }
}

extern "C" cudaError_t cuk_top_logprobs(const float *logits, int64_t rows, int64_t cols,
                                        int32_t n, int32_t *top_ids, float *top_lp,
                                        cudaStream_t stream)
{
    unsigned g = (unsigned)(rows < 65535 ? rows : 65535);
    top_logprobs_kernel<<<g, SAMPLE_THREADS, 0, stream>>>(logits, rows, cols, n, top_ids,
                                                          top_lp);
    return cudaGetLastError();
}

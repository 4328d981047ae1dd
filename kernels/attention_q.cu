/* llmem CUDA kernels: scaled 8-bit KV pools (int8, FP8 E4M3; issue 17).
 *
 * Page layout (<llmem/view.h> llmem_kv_page_bytes): page p starts at byte
 * p * page_bytes and holds its [page_size][n_kv_heads][head_dim] 1-byte
 * codes, then n_kv_heads f32 scales at the next 16-byte boundary; a value
 * is code * scale.
 *
 * - store: one CTA per store entry; the entry with the lowest index among
 *   those writing its page does the page's work, so each page's scales have
 *   one writer (docs/memory.md, "Quantized KV and state": a page whose
 *   offset 0 is written starts over at amax / code_max, otherwise the scale
 *   only grows and the other rows are requantized when it does). Same f32
 *   arithmetic as the cpu backend: IEEE division x / scale, then rintf
 *   (int8) or __nv_cvt_float_to_fp8(SATFINITE, E4M3), which the cpu's
 *   llmem_f32_to_e4m3 matches bit for bit.
 * - attention: flash-decoding (Dao et al. 2023) with the FlashAttention-2
 *   online softmax (Dao 2023, Alg. 1): one CTA per (query token, KV head,
 *   group of up to QNR query heads, key split); each warp takes one key at a
 *   time, a lane holds 4 consecutive elements per 128 of head_dim (one
 *   32-bit load of codes), partial dots are summed across the warp. Warps
 *   and splits are merged at the end. Used for decode and prefill alike
 *   (prefill with these pools is not tensor-core accelerated).
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/common.cuh"
#include "kernels/attention_q.h"

#define QNR 4    /* query heads per CTA */
#define QWARPS 4 /* warps per CTA */
#define QMAXC 2  /* 128-element chunks per row: head_dim <= 256 */

__device__ __forceinline__ size_t q_round16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

__device__ __forceinline__ size_t q_scale_off(int32_t ps, int32_t nkv, int32_t hd)
{
    return q_round16((size_t)ps * nkv * hd);
}

__device__ __forceinline__ size_t q_page_bytes(int32_t ps, int32_t nkv, int32_t hd)
{
    return q_round16(q_scale_off(ps, nkv, hd) + 4 * (size_t)nkv);
}

__device__ __forceinline__ float q_value(uint8_t c, int dt)
{
    if (dt == CUK_I8)
        return (float)(int8_t)c;
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

__device__ __forceinline__ uint8_t q_code(float x, float scale, int dt)
{
    if (!(scale > 0.0f))
        return 0;
    float y = __fdiv_rn(x, scale);
    if (dt == CUK_I8) {
        float r = rintf(y);
        if (r != r)
            return 0;
        r = fminf(fmaxf(r, -127.0f), 127.0f);
        return (uint8_t)(int8_t)r;
    }
    return (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

/* ---- store ------------------------------------------------------------------------------------- */

__device__ float q_block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        r = fmaxf(r, red[w]);
    return r;
}

/* Dynamic shared memory: run entries [page_size] int32, mine flags
 * [page_size] bytes. */
__global__ void kv_store_q_kernel(const float *k, const float *v, uint8_t *kp, uint8_t *vp, int dt,
                                  const int32_t *tok, const int32_t *slot, int32_t n,
                                  int32_t n_tok, int32_t ps, int32_t n_pages, int32_t nkv,
                                  int32_t hd)
{
    extern __shared__ int32_t q_smem[];
    __shared__ float red[32];
    __shared__ int32_t s_n;
    __shared__ int s_fresh;
    int32_t *run = q_smem;
    uint8_t *mine = (uint8_t *)(q_smem + ps);
    int32_t j = blockIdx.x;
    int32_t sj = slot[j];
    if (sj < 0 || sj >= ps * n_pages)
        return;
    int32_t page = sj / ps;
    /* the lowest-indexed entry of the page leads */
    int earlier = 0;
    for (int32_t i = threadIdx.x; i < j; i += blockDim.x) {
        int32_t si = slot[i];
        earlier |= si >= 0 && si / ps == page;
    }
    if (__syncthreads_or(earlier))
        return;
    for (int32_t o = threadIdx.x; o < ps; o += blockDim.x)
        mine[o] = 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t m = 0;
        int fresh = 0;
        for (int32_t i = j; i < n && m < ps; i++) {
            int32_t si = slot[i], ti = tok[i];
            if (si >= 0 && si / ps == page && ti >= 0 && ti < n_tok) {
                run[m++] = i;
                mine[si % ps] = 1;
                fresh |= si % ps == 0;
            }
        }
        s_n = m;
        s_fresh = fresh;
    }
    __syncthreads();
    int32_t m = s_n;
    int fresh = s_fresh;
    float cmax = dt == CUK_I8 ? 127.0f : 448.0f;
    size_t pb = q_page_bytes(ps, nkv, hd), so = q_scale_off(ps, nkv, hd);
    for (int kvi = 0; kvi < 2; kvi++) {
        const float *src = kvi ? v : k;
        uint8_t *base = (kvi ? vp : kp) + (size_t)page * pb;
        float *scales = (float *)(base + so);
        for (int32_t h = 0; h < nkv; h++) {
            float a = 0.0f;
            for (int32_t e = threadIdx.x; e < m * hd; e += blockDim.x) {
                int32_t i = run[e / hd];
                a = fmaxf(a, fabsf(src[((int64_t)tok[i] * nkv + h) * hd + e % hd]));
            }
            a = q_block_max(a, red);
            float s_new = __fdiv_rn(a, cmax), s_old = scales[h];
            if (!fresh && s_old >= s_new) {
                s_new = s_old;
            } else if (!fresh) {
                for (int32_t e = threadIdx.x; e < ps * hd; e += blockDim.x) {
                    int32_t o = e / hd;
                    if (mine[o])
                        continue;
                    uint8_t *c = base + ((size_t)o * nkv + h) * hd + e % hd;
                    *c = q_code(q_value(*c, dt) * s_old, s_new, dt);
                }
            }
            for (int32_t e = threadIdx.x; e < m * hd; e += blockDim.x) {
                int32_t i = run[e / hd];
                uint8_t *c = base + ((size_t)(slot[i] % ps) * nkv + h) * hd + e % hd;
                *c = q_code(src[((int64_t)tok[i] * nkv + h) * hd + e % hd], s_new, dt);
            }
            __syncthreads();
            if (threadIdx.x == 0)
                scales[h] = s_new;
        }
    }
}

extern "C" cudaError_t cuk_kv_store_q(const float *k, const float *v, void *kp, void *vp, int dtype,
                                      const int32_t *tok, const int32_t *slot, int32_t n,
                                      int32_t n_tok, int32_t page_size, int32_t n_pages,
                                      int32_t n_kv_heads, int32_t head_dim, cudaStream_t stream)
{
    if (n <= 0)
        return cudaSuccess;
    size_t smem = (size_t)page_size * 5;
    if (smem > 48 * 1024)
        return cudaErrorInvalidValue;
    kv_store_q_kernel<<<n, 128, smem, stream>>>(k, v, (uint8_t *)kp, (uint8_t *)vp, dtype, tok,
                                               slot, n, n_tok, page_size, n_pages, n_kv_heads,
                                               head_dim);
    return cudaGetLastError();
}

/* ---- attention ----------------------------------------------------------------------------------- */

__device__ __forceinline__ void q_unpack4(uint32_t w, int dt, float s, float out[4])
{
    for (int b = 0; b < 4; b++)
        out[b] = q_value((uint8_t)(w >> (8 * b)), dt) * s;
}

/* Work item x = (token * n_kv + g) * n_hc + hc; blockIdx.y = split. With
 * n_split == 1 the CTA writes out; otherwise part[(x * n_split + split) *
 * QNR + r] holds (acc[D], m, l). */
__global__ void __launch_bounds__(QWARPS * 32)
attn_q_kernel(cuk_attn_args a, int32_t n_hc, int32_t n_split, float *part)
{
    __shared__ float sm_m[QWARPS][QNR], sm_l[QWARPS][QNR];
    __shared__ float sm_acc[QWARPS][QNR][QMAXC * 128];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t D = a.head_dim, n_rep = a.n_heads / a.n_kv_heads;
    int64_t x = blockIdx.x;
    int32_t hc = (int32_t)(x % n_hc);
    int64_t tg = x / n_hc;
    int32_t g = (int32_t)(tg % a.n_kv_heads);
    int64_t tok = tg / a.n_kv_heads;
    int32_t nr = n_rep - hc * QNR < QNR ? n_rep - hc * QNR : QNR;
    int32_t h0 = g * n_rep + hc * QNR;
    /* keys [lo, hi) of the token, this split's share */
    int32_t s = a.tok_seq[tok], lo = 0, hi = 0;
    if (s >= 0 && s < a.n_streams) {
        int32_t len = a.tok_kv_len[tok], sl = a.seq_len[s];
        if (len >= 0 && sl >= 0 && len <= sl &&
            (int64_t)sl <= (int64_t)a.max_pages * a.page_size) {
            hi = len;
            lo = a.window > 0 && len > a.window ? len - a.window : 0;
        }
    }
    int32_t per = (hi - lo + n_split - 1) / n_split;
    int32_t k0 = lo + (int32_t)blockIdx.y * per, k1 = min(hi, k0 + per);
    const float *qb = a.q + (tok * a.n_heads + h0) * D;
    float q[QNR][QMAXC][4], acc[QNR][QMAXC][4], m[QNR], l[QNR];
    for (int r = 0; r < QNR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int c = 0; c < QMAXC; c++)
            for (int b = 0; b < 4; b++) {
                int e = c * 128 + lane * 4 + b;
                q[r][c][b] = r < nr && e < D ? qb[(int64_t)r * D + e] * a.scale : 0.0f;
                acc[r][c][b] = 0.0f;
            }
    }
    size_t pb = q_page_bytes(a.page_size, a.n_kv_heads, D), so = q_scale_off(a.page_size, a.n_kv_heads, D);
    int64_t row = a.page_off ? (int64_t)a.page_off[s < 0 ? 0 : s] : (int64_t)s * a.max_pages;
    const uint8_t *kp = (const uint8_t *)a.k, *vp = (const uint8_t *)a.v;
    for (int32_t j = k0 + warp; j < k1; j += QWARPS) {
        int32_t page = a.page_table[row + j / a.page_size];
        if (page < 0 || page >= a.n_pages)
            continue;
        size_t pbase = (size_t)page * pb;
        size_t roff = pbase + ((size_t)(j % a.page_size) * a.n_kv_heads + g) * D;
        float ks = *(const float *)(kp + pbase + so + 4 * (size_t)g);
        float vs = *(const float *)(vp + pbase + so + 4 * (size_t)g);
        float kv[QMAXC][4], vv[QMAXC][4];
        for (int c = 0; c < QMAXC; c++) {
            int e = c * 128 + lane * 4;
            uint32_t kw = 0, vw = 0;
            if (e < D) {
                kw = *(const uint32_t *)(kp + roff + e);
                vw = *(const uint32_t *)(vp + roff + e);
            }
            q_unpack4(kw, a.dtype, ks, kv[c]);
            q_unpack4(vw, a.dtype, vs, vv[c]);
        }
        for (int r = 0; r < QNR; r++) {
            if (r >= nr)
                break;
            float d = 0.0f;
            for (int c = 0; c < QMAXC; c++)
                for (int b = 0; b < 4; b++)
                    d += q[r][c][b] * kv[c][b];
            d = cuk_warp_sum(d);
            if (a.softcap > 0.0f)
                d = a.softcap * tanhf(d / a.softcap);
            float mn = fmaxf(m[r], d);
            float corr = expf(m[r] - mn), p = expf(d - mn);
            l[r] = l[r] * corr + p;
            for (int c = 0; c < QMAXC; c++)
                for (int b = 0; b < 4; b++)
                    acc[r][c][b] = acc[r][c][b] * corr + p * vv[c][b];
            m[r] = mn;
        }
    }
    /* merge the warps */
    for (int r = 0; r < QNR; r++) {
        if (lane == 0) {
            sm_m[warp][r] = m[r];
            sm_l[warp][r] = l[r];
        }
        for (int c = 0; c < QMAXC; c++)
            for (int b = 0; b < 4; b++)
                sm_acc[warp][r][c * 128 + lane * 4 + b] = acc[r][c][b];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < QNR * D; idx += blockDim.x) {
        int r = idx / D, e = idx % D;
        if (r >= nr)
            continue;
        float M = -INFINITY;
        for (int w = 0; w < QWARPS; w++)
            M = fmaxf(M, sm_m[w][r]);
        float L = 0.0f, O = 0.0f;
        if (M > -INFINITY)
            for (int w = 0; w < QWARPS; w++) {
                float f = expf(sm_m[w][r] - M);
                L += sm_l[w][r] * f;
                O += sm_acc[w][r][e] * f;
            }
        if (n_split == 1) {
            a.out[(tok * a.n_heads + h0 + r) * D + e] = L > 0.0f ? O / L : 0.0f;
        } else {
            float *pp = part + ((x * n_split + blockIdx.y) * QNR + r) * (int64_t)(D + 2);
            pp[e] = O;
            if (e == 0) {
                pp[D] = M;
                pp[D + 1] = L;
            }
        }
    }
}

__global__ void attn_q_combine(cuk_attn_args a, int32_t n_hc, int32_t n_split, const float *part,
                               int64_t items)
{
    int32_t D = a.head_dim, n_rep = a.n_heads / a.n_kv_heads;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < items * QNR * D;
         it += (int64_t)gridDim.x * blockDim.x) {
        int32_t e = (int32_t)(it % D);
        int32_t r = (int32_t)((it / D) % QNR);
        int64_t x = it / D / QNR;
        int32_t hc = (int32_t)(x % n_hc);
        int64_t tg = x / n_hc;
        int32_t g = (int32_t)(tg % a.n_kv_heads);
        int64_t tok = tg / a.n_kv_heads;
        if (hc * QNR + r >= n_rep)
            continue;
        float M = -INFINITY;
        for (int32_t sp = 0; sp < n_split; sp++)
            M = fmaxf(M, part[((x * n_split + sp) * QNR + r) * (int64_t)(D + 2) + D]);
        float L = 0.0f, O = 0.0f;
        if (M > -INFINITY)
            for (int32_t sp = 0; sp < n_split; sp++) {
                const float *pp = part + ((x * n_split + sp) * QNR + r) * (int64_t)(D + 2);
                float f = expf(pp[D] - M);
                L += pp[D + 1] * f;
                O += pp[e] * f;
            }
        a.out[(tok * a.n_heads + g * n_rep + hc * QNR + r) * D + e] = L > 0.0f ? O / L : 0.0f;
    }
}

static int32_t q_n_hc(const cuk_attn_args *a)
{
    return (a->n_heads / a->n_kv_heads + QNR - 1) / QNR;
}

extern "C" int cuk_attn_q_supported(int32_t head_dim)
{
    return head_dim % 4 == 0 && head_dim <= QMAXC * 128;
}

extern "C" size_t cuk_attn_q_scratch(const cuk_attn_args *a, int32_t n_split)
{
    int64_t items = (int64_t)a->n_tok * a->n_kv_heads * q_n_hc(a);
    return (size_t)items * (size_t)n_split * QNR * (size_t)(a->head_dim + 2);
}

extern "C" cudaError_t cuk_attn_q(const cuk_attn_args *a, int32_t n_split, float *part,
                                  cudaStream_t stream)
{
    if (!cuk_attn_q_supported(a->head_dim) || n_split < 1 || n_split > 65535 ||
        (n_split > 1 && !part))
        return cudaErrorInvalidValue;
    int32_t n_hc = q_n_hc(a);
    int64_t items = (int64_t)a->n_tok * a->n_kv_heads * n_hc;
    if (items == 0)
        return cudaSuccess;
    dim3 grid((unsigned)items, (unsigned)n_split);
    attn_q_kernel<<<grid, QWARPS * 32, 0, stream>>>(*a, n_hc, n_split, part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1)
        return e;
    attn_q_combine<<<cuk_grid(items * QNR * a->head_dim, 256), 256, 0, stream>>>(*a, n_hc, n_split,
                                                                                  part, items);
    return cudaGetLastError();
}

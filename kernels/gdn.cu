/* llmem CUDA kernels, gated delta net: the gated delta rule with a
 * delta-rule state {H_v, d_k, d_v} of a recurrent view (Yang, Kautz &
 * Hatamizadeh 2024, "Gated Delta Networks", eq. (10); transformers
 * Qwen3NextGatedDeltaNet, torch_recurrent_gated_delta_rule with
 * use_qk_l2norm_in_kernel), and the sigmoid output gate.
 *
 * The rule runs in its recurrent form for every ubatch (the CPU reference,
 * backends/cpu/ops_gdn.c, runs prefill chunked; both are the same
 * recurrence). Column j of S_h evolves on its own:
 *   S[:, j] = e^g S[:, j] + k * beta (v_j - S[:, j]·k),  o_j = S[:, j]·q,
 * so each column stays in registers for the whole ubatch and is read and
 * written once. gdn_split_kernel (the default) spreads a column over
 * L = DK / E lanes of one warp, E rows each (rows r, r + L, ...), and sums
 * the partial dot products (S·k, S·q and the norms of q and k) with
 * shuffles; a block of 128 threads covers 128 / L columns of one (group s,
 * value head h), with the token's q and k in shared memory (two buffers:
 * one barrier a token). gdn_kernel, one column of DK floats per thread,
 * spilled from d_k 64 up (sm_90a: 7.5 KB of spill stores a thread at
 * DK 256, 3.9 KB at 128); $LLMEM_CUDA_GDN_E=0 keeps it for A/B runs.
 * Sources are read before any write (snapshots from cuk_rs_snapshot when
 * another group writes a source slot); the snapshot inside the ubatch
 * (rs.snap_tok / snap_slot) is written like a checkpoint.
 */
#include "kernels/common.cuh"
#include "kernels/gdn.h"

#define GDN_THREADS 64

/* Rows i0, i0 + step, ... of a column of a slot (N of them, those < dk;
 * zeros past it), element m at at + m * stride, in dtype dt. The loops are
 * unrolled with the dtype test outside them, so S stays in registers (a
 * lambda or a run-time dtype per element put it in local memory: 1.8 KB
 * of spills per thread at d_k 128). */
template <int DK, typename T>
__device__ __forceinline__ void gdn_load_t(float (&S)[DK], const void *p, int64_t at,
                                           int64_t stride, int dk, int i0 = 0, int step = 1)
{
#pragma unroll
    for (int i = 0; i < DK; i++)
        S[i] = i0 + i * step < dk ? cuk_elem<T>::load(p, at + (int64_t)i * stride) : 0.0f;
}

template <int DK>
__device__ __forceinline__ void gdn_load(float (&S)[DK], const void *p, int dt, int64_t at,
                                         int64_t stride, int dk, int i0 = 0, int step = 1)
{
    if (dt == CUK_F32)
        gdn_load_t<DK, float>(S, p, at, stride, dk, i0, step);
    else if (dt == CUK_F16)
        gdn_load_t<DK, cuk_f16_t>(S, p, at, stride, dk, i0, step);
    else
        gdn_load_t<DK, cuk_bf16_t>(S, p, at, stride, dk, i0, step);
}

template <int DK, typename T>
__device__ __forceinline__ void gdn_store_t(const float (&S)[DK], void *p, int64_t at,
                                            int64_t stride, int dk, int i0 = 0, int step = 1)
{
#pragma unroll
    for (int i = 0; i < DK; i++)
        if (i0 + i * step < dk)
            cuk_elem<T>::store(p, at + (int64_t)i * stride, S[i]);
}

template <int DK>
__device__ __forceinline__ void gdn_store(const float (&S)[DK], void *p, int dt, int64_t at,
                                          int64_t stride, int dk, int i0 = 0, int step = 1)
{
    if (dt == CUK_F32)
        gdn_store_t<DK, float>(S, p, at, stride, dk, i0, step);
    else if (dt == CUK_F16)
        gdn_store_t<DK, cuk_f16_t>(S, p, at, stride, dk, i0, step);
    else
        gdn_store_t<DK, cuk_bf16_t>(S, p, at, stride, dk, i0, step);
}

/* Softplus-gated decay e^g and beta of token tok, head h (the Qwen3-Next
 * conventions of the file comment). */
__device__ __forceinline__ void gdn_gates(const cuk_gdn_args &a, int64_t tok, int h, float A,
                                          float bias, float &decay, float &beta)
{
    int Hv = a.n_v_heads;
    beta = 1.0f / (1.0f + expf(-a.b[tok * Hv + h]));
    float x = a.a[tok * Hv + h] + bias;
    decay = expf(A * (x > 20.0f ? x : log1pf(expf(x))));
}

/* DK: d_k rounded up to a power of two (>= 16); loops stop at d_k. */
template <int DK>
__global__ void __launch_bounds__(GDN_THREADS) gdn_kernel(cuk_rs_args rs, cuk_gdn_args a)
{
    /* volatile: q and k are re-read from shared memory in each pass rather
     * than kept in registers beside the state column */
    volatile __shared__ float qs[DK], ks[DK];
    int Hv = a.n_v_heads, dv = a.d_v, dk = a.d_k;
    int n_cb = (dv + GDN_THREADS - 1) / GDN_THREADS;
    int64_t item = blockIdx.x;
    int cb = (int)(item % n_cb);
    int h = (int)((item / n_cb) % Hv);
    int64_t s = item / ((int64_t)n_cb * Hv);
    int j = cb * GDN_THREADS + threadIdx.x;
    bool act = j < dv;
    int g = h / (Hv / a.n_k_heads);
    int64_t col = (int64_t)h * dk * dv + j; /* element of S[h][0][j] in a slot */
    float S[DK];
    int64_t base = 0;
    const void *src = cuk_rs_source(rs, s, base);
    if (act && src)
        gdn_load<DK>(S, src, rs.dtype, base + col, dv, dk);
    else
        gdn_load_t<DK, float>(S, nullptr, 0, 0, 0); /* zeros */
    float A = -expf(cuk_load(a.a_log, a.al_dt, h));
    float bias = cuk_load(a.dt_bias, a.db_dt, h);
    int first = rs.n_seq_tokens - rs.n_ckpt;
#define GDN_STORE(slot_expr)                                                                   \
    do {                                                                                       \
        int32_t slot_ = (slot_expr);                                                           \
        if (act && slot_ >= 0 && slot_ < rs.n_slots)                                           \
            gdn_store<DK>(S, rs.state, rs.dtype, (int64_t)slot_ * rs.elems + col, dv, dk);    \
    } while (0)
    for (int c = 0; c < rs.n_ckpt; c++)
        if (first + c == -1)
            GDN_STORE(rs.ckpt[s * rs.n_ckpt + c]);
    int32_t snap_t, snap = cuk_rs_snap(rs, s, snap_t); /* the same for the whole block */
    for (int t = 0; t < rs.n_seq_tokens; t++) {
        int64_t tok = s * rs.n_seq_tokens + t;
        const float *row = a.qkv + tok * a.width;
        __syncthreads();
        for (int i = threadIdx.x; i < DK; i += GDN_THREADS) {
            qs[i] = i < dk ? row[g * dk + i] : 0.0f; /* zeros past d_k add nothing */
            ks[i] = i < dk ? row[a.n_k_heads * dk + g * dk + i] : 0.0f;
        }
        __syncthreads();
        float qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            qq += qs[i] * qs[i];
            kk += ks[i] * ks[i];
        }
        float qn = rsqrtf(qq + 1e-6f) * rsqrtf((float)dk), kn = rsqrtf(kk + 1e-6f);
        float decay, beta;
        gdn_gates(a, tok, h, A, bias, decay, beta);
        if (act) {
            float kv = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; i++) {
                S[i] *= decay;
                kv += S[i] * ks[i];
            }
            float v = row[2 * a.n_k_heads * dk + h * dv + j];
            float d = beta * (v - kv * kn) * kn;
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; i++) {
                S[i] += ks[i] * d;
                acc += S[i] * qs[i];
            }
            a.out[tok * (int64_t)Hv * dv + (int64_t)h * dv + j] = acc * qn;
        }
        int c = t - first;
        if (c >= 0 && c < rs.n_ckpt)
            GDN_STORE(rs.ckpt[s * rs.n_ckpt + c]);
        if (t == snap_t)
            GDN_STORE(snap);
    }
    GDN_STORE(rs.dst[s]);
#undef GDN_STORE
}

#define GDN_SPLIT_THREADS 128

/* DK: d_k rounded up to a power of two (>= 16); E rows of a column per
 * thread (E <= 32: at most 32 state floats and the 2 E values of q and k
 * in registers); L = DK / E lanes of one warp share the column. */
template <int DK, int E>
__global__ void __launch_bounds__(GDN_SPLIT_THREADS)
    gdn_split_kernel(cuk_rs_args rs, cuk_gdn_args a)
{
    constexpr int L = DK / E, CB = GDN_SPLIT_THREADS / L;
    static_assert(L >= 1 && L <= 32 && DK % E == 0, "a column's lanes lie in one warp");
    __shared__ float qs[2][DK], ks[2][DK];
    int Hv = a.n_v_heads, dv = a.d_v, dk = a.d_k;
    int n_cb = (dv + CB - 1) / CB;
    int64_t item = blockIdx.x;
    int cb = (int)(item % n_cb);
    int h = (int)((item / n_cb) % Hv);
    int64_t s = item / ((int64_t)n_cb * Hv);
    int r = (int)threadIdx.x % L; /* rows r, r + L, ... of column j */
    int j = cb * CB + (int)threadIdx.x / L;
    bool act = j < dv; /* idle lanes still take part in the shuffles */
    int g = h / (Hv / a.n_k_heads);
    /* element of S[h][r][j] in a slot; rows L apart are L * d_v elements apart */
    int64_t col = (int64_t)h * dk * dv + (int64_t)r * dv + j, rstep = (int64_t)L * dv;
    float S[E];
    int64_t base = 0;
    const void *src = cuk_rs_source(rs, s, base);
    if (act && src)
        gdn_load<E>(S, src, rs.dtype, base + col, rstep, dk, r, L);
    else
        gdn_load_t<E, float>(S, nullptr, 0, 0, 0); /* zeros */
    float A = -expf(cuk_load(a.a_log, a.al_dt, h));
    float bias = cuk_load(a.dt_bias, a.db_dt, h);
    int first = rs.n_seq_tokens - rs.n_ckpt;
#define GDN_STORE(slot_expr)                                                                   \
    do {                                                                                       \
        int32_t slot_ = (slot_expr);                                                           \
        if (act && slot_ >= 0 && slot_ < rs.n_slots)                                           \
            gdn_store<E>(S, rs.state, rs.dtype, (int64_t)slot_ * rs.elems + col, rstep, dk, r, \
                         L);                                                                   \
    } while (0)
    for (int c = 0; c < rs.n_ckpt; c++)
        if (first + c == -1)
            GDN_STORE(rs.ckpt[s * rs.n_ckpt + c]);
    int32_t snap_t, snap = cuk_rs_snap(rs, s, snap_t); /* the same for the whole block */
    for (int t = 0; t < rs.n_seq_tokens; t++) {
        int64_t tok = s * rs.n_seq_tokens + t;
        const float *row = a.qkv + tok * a.width;
        /* buffer t & 1 was last read in token t - 2, before every thread
         * passed token t - 1's barrier */
        float *qt = qs[t & 1], *kt = ks[t & 1];
        for (int i = threadIdx.x; i < DK; i += GDN_SPLIT_THREADS) {
            qt[i] = i < dk ? row[g * dk + i] : 0.0f; /* zeros past d_k add nothing */
            kt[i] = i < dk ? row[a.n_k_heads * dk + g * dk + i] : 0.0f;
        }
        float decay, beta;
        gdn_gates(a, tok, h, A, bias, decay, beta);
        float v = act ? row[2 * a.n_k_heads * dk + h * dv + j] : 0.0f;
        __syncthreads();
        float qq = 0.0f, kk = 0.0f, kv = 0.0f;
#pragma unroll
        for (int m = 0; m < E; m++) {
            float qx = qt[r + m * L], kx = kt[r + m * L];
            qq += qx * qx;
            kk += kx * kx;
            S[m] *= decay;
            kv += S[m] * kx;
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) {
            qq += __shfl_xor_sync(0xffffffffu, qq, o);
            kk += __shfl_xor_sync(0xffffffffu, kk, o);
            kv += __shfl_xor_sync(0xffffffffu, kv, o);
        }
        float qn = rsqrtf(qq + 1e-6f) * rsqrtf((float)dk), kn = rsqrtf(kk + 1e-6f);
        float d = beta * (v - kv * kn) * kn;
        float acc = 0.0f;
#pragma unroll
        for (int m = 0; m < E; m++) {
            S[m] += kt[r + m * L] * d;
            acc += S[m] * qt[r + m * L];
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (act && r == 0)
            a.out[tok * (int64_t)Hv * dv + (int64_t)h * dv + j] = acc * qn;
        int c = t - first;
        if (c >= 0 && c < rs.n_ckpt)
            GDN_STORE(rs.ckpt[s * rs.n_ckpt + c]);
        if (t == snap_t)
            GDN_STORE(snap);
    }
    GDN_STORE(rs.dst[s]);
#undef GDN_STORE
}

template <int DK, int E>
static cudaError_t gdn_split_launch(const cuk_rs_args *rs, const cuk_gdn_args *a,
                                    cudaStream_t stream)
{
    constexpr int CB = GDN_SPLIT_THREADS / (DK / E);
    int64_t blocks = (int64_t)rs->n_seqs * a->n_v_heads * ((a->d_v + CB - 1) / CB);
    if (blocks == 0)
        return cudaSuccess;
    if (blocks > 2147483647)
        return cudaErrorInvalidConfiguration;
    gdn_split_kernel<DK, E><<<(unsigned)blocks, GDN_SPLIT_THREADS, 0, stream>>>(*rs, *a);
    return cudaGetLastError();
}

/* a->split rows per thread (16 or 32; d_k 16: 16 either way) */
template <int DK>
static cudaError_t gdn_split_e(const cuk_rs_args *rs, const cuk_gdn_args *a, cudaStream_t stream)
{
    if (a->split == 16)
        return gdn_split_launch<DK, 16>(rs, a, stream);
    return gdn_split_launch<DK, (DK < 32 ? DK : 32)>(rs, a, stream);
}

extern "C" int cuk_gdn_supported(int32_t d_k)
{
    return d_k >= 1 && d_k <= 256;
}

extern "C" cudaError_t cuk_gdn(const cuk_rs_args *rs, const cuk_gdn_args *a, cudaStream_t stream)
{
    int dk2 = 16;
    while (dk2 < a->d_k)
        dk2 *= 2;
    if (a->split == 16 || a->split == 32) {
        switch (dk2) {
        case 16: return gdn_split_e<16>(rs, a, stream);
        case 32: return gdn_split_e<32>(rs, a, stream);
        case 64: return gdn_split_e<64>(rs, a, stream);
        case 128: return gdn_split_e<128>(rs, a, stream);
        case 256: return gdn_split_e<256>(rs, a, stream);
        default: return cudaErrorInvalidValue;
        }
    }
    if (a->split != 0)
        return cudaErrorInvalidValue;
    int64_t n_cb = (a->d_v + GDN_THREADS - 1) / GDN_THREADS;
    int64_t blocks = (int64_t)rs->n_seqs * a->n_v_heads * n_cb;
    if (blocks == 0)
        return cudaSuccess;
    if (blocks > 2147483647)
        return cudaErrorInvalidConfiguration;
    switch (dk2) {
    case 16: gdn_kernel<16><<<(unsigned)blocks, GDN_THREADS, 0, stream>>>(*rs, *a); break;
    case 32: gdn_kernel<32><<<(unsigned)blocks, GDN_THREADS, 0, stream>>>(*rs, *a); break;
    case 64: gdn_kernel<64><<<(unsigned)blocks, GDN_THREADS, 0, stream>>>(*rs, *a); break;
    case 128: gdn_kernel<128><<<(unsigned)blocks, GDN_THREADS, 0, stream>>>(*rs, *a); break;
    case 256: gdn_kernel<256><<<(unsigned)blocks, GDN_THREADS, 0, stream>>>(*rs, *a); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

__global__ void sigmoid_mul_kernel(const float *x, const float *gate, float *out, int64_t n,
                                   int64_t cols, int64_t cg)
{
    int64_t per = cols / cg;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        out[i] = x[i] / (1.0f + expf(-gate[r * cg + c / per]));
    }
}

extern "C" cudaError_t cuk_sigmoid_mul(const float *x, const float *gate, float *out, int64_t n,
                                       int64_t cols, int64_t cg, cudaStream_t stream)
{
    sigmoid_mul_kernel<<<cuk_grid(n, 256), 256, 0, stream>>>(x, gate, out, n, cols, cg);
    return cudaGetLastError();
}

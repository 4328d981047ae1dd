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
 * so a thread keeps one column (DK floats) in registers for the whole
 * ubatch and reads and writes it once; a block of 64 threads covers 64
 * columns of one (group s, value head h), with the token's q and k in
 * shared memory. Sources are read before any write (snapshots from
 * cuk_rs_snapshot when another group writes a source slot); the snapshot
 * inside the ubatch (rs.snap_tok / snap_slot) is written like a checkpoint.
 */
#include "kernels/common.cuh"
#include "kernels/gdn.h"

#define GDN_THREADS 64

/* Column S[0 .. dk) of a slot, elements at + i * stride, in dtype dt. The
 * loops are unrolled with the dtype test outside them, so S stays in
 * registers (a lambda or a run-time dtype per element put it in local
 * memory: 1.8 KB of spills per thread at d_k 128). */
template <int DK, typename T>
__device__ __forceinline__ void gdn_load_t(float (&S)[DK], const void *p, int64_t at,
                                           int64_t stride, int dk)
{
#pragma unroll
    for (int i = 0; i < DK; i++)
        S[i] = i < dk ? cuk_elem<T>::load(p, at + (int64_t)i * stride) : 0.0f;
}

template <int DK>
__device__ __forceinline__ void gdn_load(float (&S)[DK], const void *p, int dt, int64_t at,
                                         int64_t stride, int dk)
{
    if (dt == CUK_F32)
        gdn_load_t<DK, float>(S, p, at, stride, dk);
    else if (dt == CUK_F16)
        gdn_load_t<DK, cuk_f16_t>(S, p, at, stride, dk);
    else
        gdn_load_t<DK, cuk_bf16_t>(S, p, at, stride, dk);
}

template <int DK, typename T>
__device__ __forceinline__ void gdn_store_t(const float (&S)[DK], void *p, int64_t at,
                                            int64_t stride, int dk)
{
#pragma unroll
    for (int i = 0; i < DK; i++)
        if (i < dk)
            cuk_elem<T>::store(p, at + (int64_t)i * stride, S[i]);
}

template <int DK>
__device__ __forceinline__ void gdn_store(const float (&S)[DK], void *p, int dt, int64_t at,
                                          int64_t stride, int dk)
{
    if (dt == CUK_F32)
        gdn_store_t<DK, float>(S, p, at, stride, dk);
    else if (dt == CUK_F16)
        gdn_store_t<DK, cuk_f16_t>(S, p, at, stride, dk);
    else
        gdn_store_t<DK, cuk_bf16_t>(S, p, at, stride, dk);
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
        float beta = 1.0f / (1.0f + expf(-a.b[tok * Hv + h]));
        float x = a.a[tok * Hv + h] + bias;
        float decay = expf(A * (x > 20.0f ? x : log1pf(expf(x))));
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

extern "C" int cuk_gdn_supported(int32_t d_k)
{
    return d_k >= 1 && d_k <= 256;
}

extern "C" cudaError_t cuk_gdn(const cuk_rs_args *rs, const cuk_gdn_args *a, cudaStream_t stream)
{
    int64_t blocks = (int64_t)rs->n_seqs * a->n_v_heads * ((a->d_v + GDN_THREADS - 1) / GDN_THREADS);
    if (blocks == 0)
        return cudaSuccess;
    if (blocks > 2147483647)
        return cudaErrorInvalidConfiguration;
    int dkmax = 16;
    while (dkmax < a->d_k)
        dkmax *= 2;
    switch (dkmax) {
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

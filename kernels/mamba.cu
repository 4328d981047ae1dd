/* llmem CUDA kernels, Mamba-2 family: causal conv1d with conv state and the
 * selective scan (recurrent form) with ssm state, reading and writing state
 * slots and checkpoints of a recurrent view.
 *
 * The snapshot inside the ubatch (cuk_rs_args snap_tok / snap_slot) is one
 * more state taken after a token, like a checkpoint; the one-token kernels
 * (ssm_conv1_kernel, ssm_scan1_kernel) never see one, since a snapshot lies
 * before a stream's last token.
 *
 * Semantics are those of the CPU reference (backends/cpu/ops_mamba.c): HF
 * transformers Mamba2Mixer.torch_forward applied token by token, the
 * recurrent form of SSD (Dao & Gu, "Transformers are SSMs", ICML 2024,
 * Sec. 3). Each thread reads its part of the source slot into registers
 * before it writes any destination or checkpoint slot, so a stream's own
 * slots may alias. When a stream's source is written by another stream
 * (copy-on-write), the host first snapshots every source (cuk_rs_snapshot)
 * and the kernels read the snapshots.
 *
 * Scan layout: a CTA of 4 warps owns 32 rows p of one (stream, head); a lane
 * owns NPL consecutive state columns n of 8 rows, so the state stays in
 * registers across the ubatch's tokens and is read and written once (with
 * 16-byte accesses for f32 states). y[p] = S[p, :] · C is a warp reduction.
 */
#include <stdlib.h>

#include "kernels/common.cuh"

/* ---- snapshots ------------------------------------------------------------------------------- */

__global__ void rs_snapshot_kernel(cuk_rs_args rs, void *snap)
{
    int64_t n = (int64_t)rs.n_seqs * rs.elems;
    int es = rs.dtype == CUK_F32 ? 4 : 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = i / rs.elems, e = i - s * rs.elems;
        int32_t sl = rs.src[s];
        bool ok = sl >= 0 && sl < rs.n_slots;
        if (es == 4)
            ((uint32_t *)snap)[i] = ok ? ((const uint32_t *)rs.state)[sl * rs.elems + e] : 0u;
        else
            ((uint16_t *)snap)[i] = ok ? ((const uint16_t *)rs.state)[sl * rs.elems + e] : 0u;
    }
}

extern "C" cudaError_t cuk_rs_snapshot(const cuk_rs_args *rs, void *snap, cudaStream_t stream)
{
    rs_snapshot_kernel<<<cuk_grid((int64_t)rs->n_seqs * rs->elems, 256), 256, 0, stream>>>(*rs,
                                                                                          snap);
    return cudaGetLastError();
}

/* The slot that receives the state after token t of stream s (-1: the
 * state before the first token) by checkpoint c, or -1. */
__device__ __forceinline__ int32_t rs_ckpt_slot(const cuk_rs_args &rs, int64_t s, int32_t c)
{
    int32_t sl = rs.ckpt[s * rs.n_ckpt + c];
    return sl >= 0 && sl < rs.n_slots ? sl : -1;
}

__device__ __forceinline__ int32_t rs_dst_slot(const cuk_rs_args &rs, int64_t s)
{
    int32_t sl = rs.dst[s];
    return sl >= 0 && sl < rs.n_slots ? sl : -1;
}

/* ---- conv ------------------------------------------------------------------------------------ */

#define CONV_MAX 16
/* Tokens per thread. At least CONV_MAX - 1, so only a stream's first chunk
 * reads the conv state, and that chunk's thread also writes the states:
 * each slot is read before it is written, by the same thread. */
#define CONV_TCH 16

/* Thread per (stream, chunk of CONV_TCH tokens, channel), channels fastest.
 * u = [state rows; x rows] of the stream; the chunk's outputs need
 * u[t0 .. t0 + CONV_TCH + d_conv - 1), loaded together before any sum, so
 * a long prefill does not wait for one load per token. */
template <bool SNAP>
__global__ void ssm_conv_kernel(cuk_rs_args rs, const float *x, const void *w, int wdt,
                                const void *b, int bdt, float *out, int32_t conv_dim,
                                int32_t d_conv)
{
    int32_t dc1 = d_conv - 1, n_tok = rs.n_seq_tokens;
    int32_t n_ch = n_tok > CONV_TCH ? (n_tok + CONV_TCH - 1) / CONV_TCH : 1;
    int64_t n = (int64_t)rs.n_seqs * n_ch * conv_dim;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < n;
         it += (int64_t)gridDim.x * blockDim.x) {
        int32_t c = (int32_t)(it % conv_dim);
        int64_t rest = it / conv_dim, s = rest / n_ch;
        int32_t ch = (int32_t)(rest % n_ch), t0 = ch * CONV_TCH;
        float st[CONV_MAX], wr[CONV_MAX], u[CONV_TCH + CONV_MAX - 1];
        int64_t sb = 0;
        const void *src = ch == 0 ? cuk_rs_source(rs, s, sb) : nullptr;
#pragma unroll
        for (int32_t r = 0; r < CONV_MAX - 1; r++)
            st[r] = src && r < dc1 ? cuk_load(src, rs.dtype, sb + (int64_t)r * conv_dim + c) : 0.0f;
#pragma unroll
        for (int32_t k = 0; k < CONV_MAX; k++)
            wr[k] = k < d_conv ? cuk_load(w, wdt, (int64_t)c * d_conv + k) : 0.0f;
        float bias = b ? cuk_load(b, bdt, c) : 0.0f;
        const float *xs = x + s * n_tok * (int64_t)conv_dim + c;
#pragma unroll
        for (int32_t j = 0; j < CONV_TCH + CONV_MAX - 1; j++) {
            int32_t e = t0 + j; /* position in u */
            float v = 0.0f;
            if (e < dc1) {
#pragma unroll
                for (int32_t r = 0; r < CONV_MAX - 1; r++)
                    v = r == e ? st[r] : v;
            } else if (e - dc1 < n_tok && j < CONV_TCH + dc1) {
                v = __ldg(xs + (int64_t)(e - dc1) * conv_dim);
            }
            u[j] = v;
        }
#pragma unroll
        for (int32_t i = 0; i < CONV_TCH; i++) {
            int32_t t = t0 + i;
            if (t >= n_tok)
                break;
            float acc = bias;
#pragma unroll
            for (int32_t k = 0; k < CONV_MAX; k++)
                if (k < d_conv)
                    acc += wr[k] * u[i + k];
            out[(s * n_tok + t) * (int64_t)conv_dim + c] = acc / (1.0f + expf(-acc));
        }
        if (ch != 0)
            continue;
        /* states after token tt: rows u[tt + 1 .. tt + dc1]; checkpoints, the
         * snapshot inside the ubatch (SNAP), then dst */
        for (int32_t ci = 0; ci <= rs.n_ckpt + (SNAP ? 1 : 0); ci++) {
            int32_t sl, tt;
            if (ci < rs.n_ckpt) {
                sl = rs_ckpt_slot(rs, s, ci);
                tt = n_tok - rs.n_ckpt + ci;
            } else if (SNAP && ci == rs.n_ckpt) {
                sl = cuk_rs_snap(rs, s, tt);
            } else {
                sl = rs_dst_slot(rs, s);
                tt = n_tok - 1;
            }
            if (sl < 0 || tt < -1)
                continue;
            for (int32_t r = 0; r < dc1; r++) {
                int32_t e = tt + 1 + r;
                float v = 0.0f;
                if (e < dc1) {
#pragma unroll
                    for (int32_t q = 0; q < CONV_MAX - 1; q++)
                        v = q == e ? st[q] : v;
                } else {
                    v = xs[(int64_t)(e - dc1) * conv_dim];
                }
                cuk_store(rs.state, rs.dtype, (int64_t)sl * rs.elems + (int64_t)r * conv_dim + c,
                          v);
            }
        }
    }
}

/* Whether the one-token conv and scan are launched as programmatic
 * dependents of the kernel before them: $LLMEM_CUDA_SSM_PDL (default 1; 0
 * turns it off, read once) on a device of compute capability 9.0 or later,
 * for at most CUK_GEMV_MAX_M streams, where the row-block GEMVs around them
 * are programmatic too and the launch gaps are a visible share of the step
 * (Bamba-9B batch 1 on the H200: 5.161 -> 5.108 ms; docs/benchmarks.md,
 * "Batch-1 step: norms in the epilogue"). Both kernels wait for the kernel
 * before them before they read anything. */
static bool ssm_pdl(const cuk_rs_args *rs)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMEM_CUDA_SSM_PDL");
        int dev = 0, major = 0;
        on = !(e && atoi(e) == 0) && cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                 cudaSuccess &&
             major >= 9;
    }
    return on == 1 && rs->n_seqs <= CUK_GEMV_MAX_M;
}

/* One token per stream (decode), f32 state, DC taps (issue 11): a thread
 * per (stream, 4 channels) with 16-byte loads of the state rows, x and the
 * output, all loads issued before any sum; the same sums in the same order
 * as ssm_conv_kernel (bias, then tap by tap), the same checkpoint and dst
 * writes. At batch 64 the thread-per-channel kernel took 32 µs a call for
 * 21 MB, latency-bound over several waves of small threads. */
template <int DC>
__global__ void ssm_conv1_kernel(cuk_rs_args rs, const float *x, const void *w, int wdt,
                                 const void *b, int bdt, float *out, int32_t conv_dim)
{
    /* launched as a programmatic dependent of the input projection when
     * ssm_pdl: everything it reads may come from the kernels before, so it
     * waits first; the scan after it may launch then */
    cuk_pdl_wait();
    cuk_pdl_trigger();
    int64_t n4 = conv_dim / 4, n = (int64_t)rs.n_seqs * n4;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < n;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = it / n4;
        int32_t c = (int32_t)(it % n4) * 4;
        int64_t sb = 0;
        const float *src = (const float *)cuk_rs_source(rs, s, sb);
        float4 u[DC];
#pragma unroll
        for (int r = 0; r < DC - 1; r++)
            u[r] = src ? *(const float4 *)(src + sb + (int64_t)r * conv_dim + c)
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        u[DC - 1] = __ldg((const float4 *)(x + s * (int64_t)conv_dim + c));
        float wr[4 * DC], bias[4];
#pragma unroll
        for (int k = 0; k < 4 * DC; k++)
            wr[k] = cuk_load(w, wdt, (int64_t)c * DC + k);
#pragma unroll
        for (int e = 0; e < 4; e++)
            bias[e] = b ? cuk_load(b, bdt, c + e) : 0.0f;
        float acc[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            acc[e] = bias[e];
#pragma unroll
            for (int k = 0; k < DC; k++) {
                float uv = e == 0 ? u[k].x : e == 1 ? u[k].y : e == 2 ? u[k].z : u[k].w;
                acc[e] += wr[e * DC + k] * uv;
            }
            acc[e] = acc[e] / (1.0f + expf(-acc[e]));
        }
        *(float4 *)(out + s * (int64_t)conv_dim + c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        /* states after token tt (-1: before it): rows u[tt + 1 .. tt + DC - 1] */
        for (int32_t ci = 0; ci <= rs.n_ckpt; ci++) {
            int32_t sl = ci < rs.n_ckpt ? rs_ckpt_slot(rs, s, ci) : rs_dst_slot(rs, s);
            int32_t tt = ci < rs.n_ckpt ? 1 - rs.n_ckpt + ci : 0;
            if (sl < 0 || tt < -1)
                continue;
            float *d = (float *)rs.state + (int64_t)sl * rs.elems + c;
#pragma unroll
            for (int r = 0; r < DC - 1; r++)
                *(float4 *)(d + (int64_t)r * conv_dim) = tt == 0 ? u[r + 1] : u[r];
        }
    }
}

extern "C" cudaError_t cuk_ssm_conv(const cuk_rs_args *rs, const float *x, const void *w, int wdt,
                                    const void *b, int bdt, float *out, int32_t conv_dim,
                                    int32_t d_conv, cudaStream_t stream)
{
    if (rs->n_seq_tokens == 1 && d_conv == 4 && rs->dtype == CUK_F32 && conv_dim % 4 == 0 &&
        rs->elems % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)out % 16 == 0 &&
        (uintptr_t)rs->state % 16 == 0 && (uintptr_t)rs->snap % 16 == 0) {
        int64_t n = (int64_t)rs->n_seqs * (conv_dim / 4);
        return cuk_launch_dep(ssm_conv1_kernel<4>, dim3(cuk_grid(n, 128)), 128, 0, stream,
                              ssm_pdl(rs), *rs, x, w, wdt, b, bdt, out, conv_dim);
    }
    if (d_conv < 2 || d_conv > CONV_MAX)
        return cudaErrorInvalidValue;
    int32_t n_tok = rs->n_seq_tokens;
    int64_t n_ch = n_tok > CONV_TCH ? (n_tok + CONV_TCH - 1) / CONV_TCH : 1;
    int64_t n = (int64_t)rs->n_seqs * n_ch * conv_dim;
    /* the snapshot inside the ubatch in its own instance: the common
     * kernel stays as it was */
    if (rs->snap_slot)
        ssm_conv_kernel<true><<<cuk_grid(n, 128), 128, 0, stream>>>(*rs, x, w, wdt, b, bdt, out,
                                                                   conv_dim, d_conv);
    else
        ssm_conv_kernel<false><<<cuk_grid(n, 128), 128, 0, stream>>>(*rs, x, w, wdt, b, bdt, out,
                                                                    conv_dim, d_conv);
    return cudaGetLastError();
}

/* ---- scan ------------------------------------------------------------------------------------- */

#define SCAN_WARPS 4
#define SCAN_RPW 8 /* rows per warp */

/* NPL consecutive elements at element index i (vec: one aligned access). */
template <typename ST, int NPL>
__device__ __forceinline__ void scan_load(const void *p, int64_t i, bool vec, int valid, float *f)
{
    if (vec && valid == NPL) {
        if (sizeof(ST) == 4) {
            const float *q = (const float *)p + i;
            if (NPL == 8) {
                float4 a = *(const float4 *)q, b = *(const float4 *)(q + 4);
                f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
                f[4 % NPL] = b.x; f[5 % NPL] = b.y; f[6 % NPL] = b.z; f[7 % NPL] = b.w;
                return;
            }
            if (NPL == 4) {
                float4 a = *(const float4 *)q;
                f[0] = a.x; f[1 % NPL] = a.y; f[2 % NPL] = a.z; f[3 % NPL] = a.w;
                return;
            }
        } else if (NPL >= 4) {
            const uint16_t *q = (const uint16_t *)p + i;
#pragma unroll
            for (int h = 0; h < NPL / 4; h++) {
                uint2 v = *(const uint2 *)(q + 4 * h);
                uint16_t e[4] = {(uint16_t)(v.x & 0xffffu), (uint16_t)(v.x >> 16),
                                 (uint16_t)(v.y & 0xffffu), (uint16_t)(v.y >> 16)};
#pragma unroll
                for (int k = 0; k < 4; k++)
                    f[(4 * h + k) % NPL] = cuk_elem<ST>::load(e, k);
            }
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < NPL; e++)
        f[e] = e < valid ? cuk_elem<ST>::load(p, i + e) : 0.0f;
}

template <typename ST, int NPL>
__device__ __forceinline__ void scan_store(void *p, int64_t i, bool vec, int valid, const float *f)
{
    if (vec && valid == NPL && sizeof(ST) == 4 && NPL >= 4) {
        float *q = (float *)p + i;
#pragma unroll
        for (int h = 0; h < NPL / 4; h++)
            *(float4 *)(q + 4 * h) =
                make_float4(f[(4 * h) % NPL], f[(4 * h + 1) % NPL], f[(4 * h + 2) % NPL],
                            f[(4 * h + 3) % NPL]);
        return;
    }
    if (vec && valid == NPL && sizeof(ST) == 2 && NPL >= 4) {
        uint16_t *q = (uint16_t *)p + i;
#pragma unroll
        for (int h = 0; h < NPL / 4; h++) {
            uint16_t e[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                cuk_elem<ST>::store(e, k, f[(4 * h + k) % NPL]);
            *(uint2 *)(q + 4 * h) = make_uint2((uint32_t)e[0] | (uint32_t)e[1] << 16,
                                               (uint32_t)e[2] | (uint32_t)e[3] << 16);
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < NPL; e++)
        if (e < valid)
            cuk_elem<ST>::store(p, i + e, f[e]);
}

/* Sums each of the 8 values v[0..7] over the warp's 32 lanes in 9 shuffles
 * (a butterfly that halves the values each lane carries at every step,
 * instead of 8 full reductions of 5). On return v[0] of every lane with
 * (lane & 3) == 0 holds the sum of row r = the return value; all lanes
 * must call it. */
__device__ __forceinline__ int scan_sum8(float (&v)[SCAN_RPW], int lane)
{
    static_assert(SCAN_RPW == 8, "butterfly over 8 rows");
    bool hi = lane & 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float send = hi ? v[i] : v[i + 4], keep = hi ? v[i + 4] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
    hi = lane & 8;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float send = hi ? v[i] : v[i + 2], keep = hi ? v[i + 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    hi = lane & 4;
    {
        float send = hi ? v[0] : v[1], keep = hi ? v[1] : v[0];
        v[0] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    }
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
    return ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
}

/* SNAP: the view has a snapshot inside the ubatch (its own instance, so
 * that the common one stays as it was). */
template <typename ST, int NPL, bool SNAP>
__global__ void __launch_bounds__(SCAN_WARPS * 32)
    ssm_scan_kernel(cuk_rs_args rs, cuk_scan_args p)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t H = p.n_heads, P = p.head_dim, N = p.d_state, G = p.n_groups;
    int64_t s = blockIdx.x / H;
    int32_t h = (int32_t)(blockIdx.x % H), g = h / (H / G);
    int32_t p0 = blockIdx.y * (SCAN_WARPS * SCAN_RPW) + warp * SCAN_RPW;
    int32_t n0 = lane * NPL;
    int valid = N - n0 < NPL ? (N - n0 > 0 ? N - n0 : 0) : NPL;
    bool vec = N % NPL == 0;
    int64_t hs = (int64_t)P * N, n_tok = rs.n_seq_tokens;

    float S[SCAN_RPW][NPL];
    int64_t sb = 0;
    const void *src = cuk_rs_source(rs, s, sb);
#pragma unroll
    for (int i = 0; i < SCAN_RPW; i++) {
        int32_t pp = p0 + i;
        if (src && pp < P)
            scan_load<ST, NPL>(src, sb + h * hs + (int64_t)pp * N + n0, vec, valid, S[i]);
        else
#pragma unroll
            for (int e = 0; e < NPL; e++)
                S[i][e] = 0.0f;
    }
    float A = -expf(cuk_load(p.a_log, p.a_dt, h));
    float Dh = cuk_param(p.d, p.d_dt, h, 0.0f);
    float bias = cuk_param(p.dt_bias, p.b_dt, h, 0.0f);

    auto store_state = [&](int32_t sl) {
#pragma unroll
        for (int i = 0; i < SCAN_RPW; i++) {
            int32_t pp = p0 + i;
            if (pp < P)
                scan_store<ST, NPL>(rs.state, (int64_t)sl * rs.elems + h * hs + (int64_t)pp * N + n0,
                                    vec, valid, S[i]);
        }
    };
    for (int32_t c = 0; c < rs.n_ckpt; c++) {
        int32_t sl = rs_ckpt_slot(rs, s, c);
        if (sl >= 0 && n_tok - rs.n_ckpt + c == -1)
            store_state(sl);
    }
    int64_t d_inner = (int64_t)H * P;
    /* The inputs of token t + 1 (B, C, x of the rows, dt) are loaded while
     * token t is computed: the loop is bound by issue, not by load latency. */
    float nB[NPL], nC[NPL], nx[SCAN_RPW], ndt = 0.0f;
    auto fetch = [&](int64_t t) {
        int64_t tok = s * n_tok + t;
        const float *row = p.xbc + tok * p.conv_dim;
        ndt = __ldg(p.dt + tok * H + h);
#pragma unroll
        for (int e = 0; e < NPL; e++) {
            nB[e] = e < valid ? __ldg(row + d_inner + (int64_t)g * N + n0 + e) : 0.0f;
            nC[e] = e < valid ? __ldg(row + d_inner + (int64_t)G * N + (int64_t)g * N + n0 + e)
                              : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < SCAN_RPW; i++)
            nx[i] = p0 + i < P ? __ldg(row + (int64_t)h * P + p0 + i) : 0.0f;
    };
    int32_t snap_t = -1;
    const int32_t snap_sl = SNAP ? cuk_rs_snap(rs, s, snap_t) : -1;
    if (n_tok > 0)
        fetch(0);
    for (int64_t t = 0; t < n_tok; t++) {
        int64_t tok = s * n_tok + t;
        float B[NPL], C[NPL], xr[SCAN_RPW], v = ndt + bias;
#pragma unroll
        for (int e = 0; e < NPL; e++) {
            B[e] = nB[e];
            C[e] = nC[e];
        }
#pragma unroll
        for (int i = 0; i < SCAN_RPW; i++)
            xr[i] = nx[i];
        if (t + 1 < n_tok)
            fetch(t + 1);
        float dtv = v > 20.0f ? v : log1pf(expf(v));
        dtv = dtv < p.dt_min ? p.dt_min : dtv;
        dtv = dtv > p.dt_max ? p.dt_max : dtv;
        float dA = expf(dtv * A);
        float yv[SCAN_RPW];
#pragma unroll
        for (int i = 0; i < SCAN_RPW; i++) {
            float coef = xr[i] * dtv, acc = 0.0f;
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                S[i][e] = S[i][e] * dA + coef * B[e];
                acc += S[i][e] * C[e];
            }
            yv[i] = acc;
        }
        /* y[p] = S[p, :] . C: the 8 row sums in 9 shuffles, lane 4r holding row r's */
        int r = scan_sum8(yv, lane);
        float xs = 0.0f;
#pragma unroll
        for (int i = 0; i < SCAN_RPW; i++)
            xs = i == r ? xr[i] : xs;
        if ((lane & 3) == 0 && p0 + r < P)
            p.y[tok * d_inner + (int64_t)h * P + p0 + r] = yv[0] + Dh * xs;
        for (int32_t c = 0; c < rs.n_ckpt; c++) {
            int32_t sl = rs_ckpt_slot(rs, s, c);
            if (sl >= 0 && n_tok - rs.n_ckpt + c == t)
                store_state(sl);
        }
        if (SNAP && snap_sl >= 0 && t == snap_t)
            store_state(snap_sl);
    }
    int32_t sl = rs_dst_slot(rs, s);
    if (sl >= 0)
        store_state(sl);
}

/* ---- scan, one token per stream ---------------------------------------------------------- */

/* A decode step (one token per stream, no checkpoints) reads and writes
 * each state once and does a few flops per element, so its speed is the
 * bytes in flight. Each warp takes a contiguous range of items (RPW rows of
 * one (stream, head)) and streams their state rows through an NS-stage
 * cp.async ring in shared memory: the rows of items k + 1 .. k + NS - 1 are
 * in flight while item k is updated and written back. B, C, the dst slot
 * and the head's parameters are reloaded only when the stream or the head
 * changes, which happens a few times per warp. Lane l owns state columns
 * [l * NPL, (l + 1) * NPL), so d_state must be 32 * NPL. */
#define SD_WARPS 4

template <int BYTES> __device__ __forceinline__ void sd_cp(void *dst, const void *src, bool valid)
{
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    int n = valid ? BYTES : 0;
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src),
                     "n"(BYTES), "r"(n));
}

template <typename ST, int NPL> struct sd_shape {
    static constexpr int BPL = NPL * (int)sizeof(ST); /* state bytes per lane and row */
    static constexpr int CB = BPL < 16 ? BPL : 16;    /* bytes per cp.async */
    static constexpr int NC = BPL / CB;
    static constexpr int ROWB = 32 * BPL;             /* one state row */
    /* rows per item: about 2 KiB of state, at most 8 rows */
    static constexpr int RPW = 2048 / ROWB < 1 ? 1 : 2048 / ROWB > 8 ? 8 : 2048 / ROWB;
    /* one stage: RPW rows, then x of the rows and dt, padded to 16 bytes */
    static constexpr int STAGE = RPW * ROWB + ((RPW + 1) * 4 + 15) / 16 * 16;
};

template <typename ST, int NPL, int NS>
__global__ void __launch_bounds__(SD_WARPS * 32, 4)
    ssm_scan1_kernel(cuk_rs_args rs, cuk_scan_args p, int64_t n_items, int64_t per_warp)
{
    /* launched as a programmatic dependent of the conv when ssm_pdl, so
     * it waits first; the output projection (a GEMV launched as a
     * programmatic dependent) follows: its CTAs may take the room this
     * grid leaves and fetch their first weights while the scan runs (they
     * wait for its end before reading y) */
    cuk_pdl_wait();
    cuk_pdl_trigger();
    using Z = sd_shape<ST, NPL>;
    constexpr int RPW = Z::RPW;
    extern __shared__ __align__(16) unsigned char sd_ring[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned char *ring = sd_ring + (size_t)warp * NS * Z::STAGE;
    int32_t H = p.n_heads, P = p.head_dim, N = p.d_state, G = p.n_groups, PB = P / RPW;
    int64_t hs = (int64_t)P * N, d_inner = (int64_t)H * P;
    int64_t i0 = ((int64_t)blockIdx.x * SD_WARPS + warp) * per_warp;
    int64_t n = n_items - i0 < per_warp ? n_items - i0 : per_warp;

    /* (stream, head, row block) of the next item to issue and to compute */
    int64_t is = i0 / ((int64_t)H * PB), cs_ = is;
    int32_t ih = (int32_t)(i0 / PB % H), ib = (int32_t)(i0 % PB), chh = ih, cb = ib;
    int64_t src_s = -1, sb = 0;
    const unsigned char *src = nullptr;
    auto issue = [&](int64_t k) {
        if (k < n) {
            int64_t s = is;
            int32_t h = ih, p0 = ib * RPW;
            if (++ib == PB) {
                ib = 0;
                if (++ih == H) {
                    ih = 0;
                    is++;
                }
            }
            if (s != src_s) {
                src_s = s;
                src = (const unsigned char *)cuk_rs_source(rs, s, sb);
            }
            unsigned char *dst = ring + (k % NS) * Z::STAGE;
            const unsigned char *row0 =
                src ? src + (sb + h * hs + (int64_t)p0 * N) * (int64_t)sizeof(ST) + lane * Z::BPL
                    : (const unsigned char *)p.xbc;
#pragma unroll
            for (int i = 0; i < RPW; i++)
#pragma unroll
                for (int c = 0; c < Z::NC; c++)
                    sd_cp<Z::CB>(dst + i * Z::ROWB + lane * Z::BPL + c * Z::CB,
                                 src ? row0 + (int64_t)i * Z::ROWB + c * Z::CB : row0,
                                 src != nullptr);
            float *xd = (float *)(dst + RPW * Z::ROWB);
            if (lane < RPW)
                sd_cp<4>(xd + lane, p.xbc + s * p.conv_dim + (int64_t)h * P + p0 + lane, true);
            else if (lane == RPW)
                sd_cp<4>(xd + RPW, p.dt + s * H + h, true);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    int64_t cs = -1;
    int32_t cg = -1, ch = -1, dsl = -1;
    float B[NPL], C[NPL], A = 0.0f, Dh = 0.0f, bias = 0.0f;
#pragma unroll
    for (int k = 0; k < NS - 1; k++)
        issue(k);
    for (int64_t k = 0; k < n; k++) {
        __syncwarp(); /* every lane is done with the stage issue() refills */
        issue(k + NS - 1);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 1));
        __syncwarp(); /* x and dt were copied by other lanes */
        int64_t s = cs_;
        int32_t h = chh, p0 = cb * RPW, g = h / (H / G);
        if (++cb == PB) {
            cb = 0;
            if (++chh == H) {
                chh = 0;
                cs_++;
            }
        }
        if (s != cs || g != cg) {
            const float *bc = p.xbc + s * p.conv_dim + d_inner + (int64_t)g * N + lane * NPL;
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                B[e] = bc[e];
                C[e] = bc[(int64_t)G * N + e];
            }
            if (s != cs)
                dsl = rs_dst_slot(rs, s);
            cs = s;
            cg = g;
        }
        if (h != ch) {
            A = -expf(cuk_load(p.a_log, p.a_dt, h));
            Dh = cuk_param(p.d, p.d_dt, h, 0.0f);
            bias = cuk_param(p.dt_bias, p.b_dt, h, 0.0f);
            ch = h;
        }
        const unsigned char *st = ring + (k % NS) * Z::STAGE;
        const float *xd = (const float *)(st + RPW * Z::ROWB);
        float v = xd[RPW] + bias;
        float dtv = v > 20.0f ? v : log1pf(expf(v));
        dtv = dtv < p.dt_min ? p.dt_min : dtv;
        dtv = dtv > p.dt_max ? p.dt_max : dtv;
        float dA = expf(dtv * A);
        float yv[RPW];
        int64_t out =
            dsl >= 0 ? (int64_t)dsl * rs.elems + h * hs + (int64_t)p0 * N + lane * NPL : 0;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            float S[NPL];
            scan_load<ST, NPL>(st + i * Z::ROWB + lane * Z::BPL, 0, true, NPL, S);
            float coef = xd[i] * dtv, acc = 0.0f;
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                S[e] = S[e] * dA + coef * B[e];
                acc += S[e] * C[e];
            }
            yv[i] = acc;
            if (dsl >= 0)
                scan_store<ST, NPL>(rs.state, out + (int64_t)i * N, true, NPL, S);
        }
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            float acc = cuk_warp_sum(yv[i]);
            if (lane == i)
                p.y[s * d_inner + (int64_t)h * P + p0 + i] = acc + Dh * xd[i];
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

/* Stages of the decode scan's ring: $LLMEM_CUDA_SCAN_NS (2 to 5), default 4;
 * $LLMEM_CUDA_SCAN_OLD=1 runs the general kernel instead. */
static int sd_stages(void)
{
    static int ns = 0;
    if (ns == 0) {
        const char *e = getenv("LLMEM_CUDA_SCAN_NS"), *o = getenv("LLMEM_CUDA_SCAN_OLD");
        int v = e ? atoi(e) : 4;
        ns = o && atoi(o) ? -1 : v >= 2 && v <= 5 ? v : 4;
    }
    return ns;
}

/* Resident CTAs per SM the decode scan's grid aims at: $LLMEM_CUDA_SCAN_CTAS
 * (1 to 8), default 4. */
static int sd_ctas(void)
{
    static int c = 0;
    if (c == 0) {
        const char *e = getenv("LLMEM_CUDA_SCAN_CTAS");
        int v = e ? atoi(e) : 4;
        c = v >= 1 && v <= 8 ? v : 4;
    }
    return c;
}

template <typename ST, int NPL, int NS>
static cudaError_t sd_launch(const cuk_rs_args *rs, const cuk_scan_args *p, cudaStream_t stream)
{
    using Z = sd_shape<ST, NPL>;
    constexpr size_t smem = (size_t)SD_WARPS * NS * Z::STAGE;
    static_assert(smem <= 48 * 1024, "no opt-in for more dynamic shared memory");
    int64_t n_items = (int64_t)rs->n_seqs * p->n_heads * (p->head_dim / Z::RPW);
    /* at least NS + 2 items per warp (every stage is refilled at least once),
     * at most sd_ctas() CTAs per SM; but when the items fit in that cap (a
     * few streams: 2048 items at batch 1 on Bamba-9B) a warp per item, so
     * every state row is in flight at once instead of 86 CTAs' rings
     * (7.6 µs a call at batch 1 for 8.4 MB) */
    int64_t cap = (int64_t)(p->n_sms > 0 ? p->n_sms : 1) * sd_ctas() * SD_WARPS;
    int64_t warps = (n_items + NS + 1) / (NS + 2);
    if (n_items <= cap)
        warps = n_items;
    warps = warps < cap ? warps : cap;
    warps = warps < 1 ? 1 : warps;
    int64_t per = (n_items + warps - 1) / warps;
    warps = (n_items + per - 1) / per;
    unsigned blocks = (unsigned)((warps + SD_WARPS - 1) / SD_WARPS);
    return cuk_launch_dep(ssm_scan1_kernel<ST, NPL, NS>, dim3(blocks), SD_WARPS * 32, smem, stream,
                          ssm_pdl(rs), *rs, *p, n_items, per);
}

/* The decode scan for this call, or cudaErrorNotSupported when the general
 * kernel must run (several tokens, checkpoints, other shapes). */
template <typename ST, int NPL>
static cudaError_t sd_try(const cuk_rs_args *rs, const cuk_scan_args *p, cudaStream_t stream)
{
    using Z = sd_shape<ST, NPL>;
    int ns = sd_stages();
    if (ns < 0 || Z::BPL < 4 || p->d_state != 32 * NPL || p->head_dim % Z::RPW ||
        rs->n_seq_tokens != 1 || rs->n_ckpt != 0 || rs->n_seqs < 1)
        return cudaErrorNotSupported;
    if constexpr (sizeof(ST) == 4 && NPL == 4) { /* the measured alternatives */
        if (ns != 4)
            return ns == 2   ? sd_launch<ST, NPL, 2>(rs, p, stream)
                   : ns == 3 ? sd_launch<ST, NPL, 3>(rs, p, stream)
                             : sd_launch<ST, NPL, 5>(rs, p, stream);
    }
    return sd_launch<ST, NPL, 4>(rs, p, stream);
}

extern "C" int cuk_ssm_scan_supported(int32_t d_state)
{
    return d_state >= 1 && d_state <= 32 * 8;
}

template <typename ST, bool SNAP>
static cudaError_t scan_general(const cuk_rs_args *rs, const cuk_scan_args *p, dim3 grid,
                                int32_t npl, cudaStream_t stream)
{
    if (npl <= 1)
        ssm_scan_kernel<ST, 1, SNAP><<<grid, SCAN_WARPS * 32, 0, stream>>>(*rs, *p);
    else if (npl <= 2)
        ssm_scan_kernel<ST, 2, SNAP><<<grid, SCAN_WARPS * 32, 0, stream>>>(*rs, *p);
    else if (npl <= 4)
        ssm_scan_kernel<ST, 4, SNAP><<<grid, SCAN_WARPS * 32, 0, stream>>>(*rs, *p);
    else
        ssm_scan_kernel<ST, 8, SNAP><<<grid, SCAN_WARPS * 32, 0, stream>>>(*rs, *p);
    return cudaGetLastError();
}

template <typename ST>
static cudaError_t scan_dispatch(const cuk_rs_args *rs, const cuk_scan_args *p,
                                 cudaStream_t stream)
{
    dim3 grid((unsigned)((int64_t)rs->n_seqs * p->n_heads),
              (unsigned)((p->head_dim + SCAN_WARPS * SCAN_RPW - 1) / (SCAN_WARPS * SCAN_RPW)));
    int32_t npl = (p->d_state + 31) / 32;
    if (npl * 32 == p->d_state && npl >= 2) {
        cudaError_t e = npl == 2   ? sd_try<ST, 2>(rs, p, stream)
                        : npl == 4 ? sd_try<ST, 4>(rs, p, stream)
                        : npl == 8 ? sd_try<ST, 8>(rs, p, stream)
                                   : cudaErrorNotSupported;
        if (e != cudaErrorNotSupported)
            return e;
    }
    if (npl > 8)
        return cudaErrorInvalidValue;
    return rs->snap_slot ? scan_general<ST, true>(rs, p, grid, npl, stream)
                         : scan_general<ST, false>(rs, p, grid, npl, stream);
}

extern "C" cudaError_t cuk_ssm_scan(const cuk_rs_args *rs, const cuk_scan_args *p,
                                    cudaStream_t stream)
{
    if (p->head_dim > 65535 * SCAN_WARPS * SCAN_RPW)
        return cudaErrorInvalidValue;
    switch (rs->dtype) {
    case CUK_F32: return scan_dispatch<float>(rs, p, stream);
    case CUK_F16: return scan_dispatch<cuk_f16_t>(rs, p, stream);
    case CUK_BF16: return scan_dispatch<cuk_bf16_t>(rs, p, stream);
    default: return cudaErrorInvalidValue;
    }
}

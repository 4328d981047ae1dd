/* llmem CUDA kernels: LFM2's gated short conv and the Mamba-1 selective scan
 * (recurrent form), reading and writing state slots and checkpoints of a
 * recurrent view (issue 16).
 *
 * Semantics are those of the CPU reference (backends/cpu/ops_ssm1.c):
 * transformers Lfm2ShortConv (u = B * x, out = C * conv1d(u), no
 * activation) and mamba_selective_scan's sequential loop (Gu & Dao 2023,
 * Alg. 2; JambaMambaMixer). As in mamba.cu, each thread reads its part of
 * the source slot into registers before writing any destination, and a
 * source another stream writes is read from the host-requested snapshot
 * (cuk_rs_snapshot, rs.snap). The snapshot inside the ubatch (rs.snap_tok /
 * snap_slot, cuk_rs_snap) is written like a checkpoint after its token.
 *
 * short conv: a thread per (stream, channel), the window in registers.
 * scan1: a warp per (stream, channel); lane l owns state columns l, l + 32,
 * ... (NPL per lane), so the state stays in registers across the ubatch's
 * tokens; y = S · C is a warp reduction.
 */
#include "kernels/common.cuh"
#include "kernels/ssm1.h"

/* Slot written by checkpoint ci (ci == n_ckpt: the dst, ci == n_ckpt + 1:
 * the snapshot inside the ubatch) and the token it follows (-1: before the
 * first); -1 slot when none. */
__device__ __forceinline__ int32_t s1_out_slot(const cuk_rs_args &rs, int64_t s, int32_t ci,
                                               int32_t &tt)
{
    int32_t sl;
    if (ci < rs.n_ckpt) {
        sl = rs.ckpt[s * rs.n_ckpt + ci];
        tt = rs.n_seq_tokens - rs.n_ckpt + ci;
    } else if (ci > rs.n_ckpt) {
        return cuk_rs_snap(rs, s, tt);
    } else {
        sl = rs.dst[s];
        tt = rs.n_seq_tokens - 1;
    }
    return sl >= 0 && sl < rs.n_slots && tt >= -1 ? sl : -1;
}

/* ---- short conv ------------------------------------------------------------------------------- */

#define SC_MAX 64 /* taps, as the vulkan shader and the config allow */

__global__ void short_conv_kernel(cuk_rs_args rs, const float *bcx, const void *w, int wdt,
                                  const void *b, int bdt, float *out, int32_t dim, int32_t L)
{
    int32_t L1 = L - 1, n_tok = rs.n_seq_tokens;
    int64_t n = (int64_t)rs.n_seqs * dim;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < n;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = it / dim;
        int32_t c = (int32_t)(it - s * dim);
        float st[SC_MAX], wr[SC_MAX];
        int64_t sb = 0;
        const void *src = cuk_rs_source(rs, s, sb);
        for (int32_t r = 0; r < L1; r++)
            st[r] = src ? cuk_load(src, rs.dtype, sb + (int64_t)r * dim + c) : 0.0f;
        for (int32_t k = 0; k < L; k++)
            wr[k] = cuk_load(w, wdt, (int64_t)c * L + k);
        float bias = b ? cuk_load(b, bdt, c) : 0.0f;
        const float *rows = bcx + s * n_tok * 3 * (int64_t)dim + c;
        /* u[e] of the stream: state rows, then B * x of token e - L1 */
#define SC_U(e) ((e) < L1 ? st[(e)] : rows[(int64_t)((e) - L1) * 3 * dim] * \
                                          rows[(int64_t)((e) - L1) * 3 * dim + 2 * dim])
        for (int32_t t = 0; t < n_tok; t++) {
            float acc = bias;
            for (int32_t k = 0; k < L; k++)
                acc += wr[k] * SC_U(t + k);
            out[(s * n_tok + t) * (int64_t)dim + c] = rows[(int64_t)t * 3 * dim + dim] * acc;
        }
        for (int32_t ci = 0; ci <= rs.n_ckpt + 1; ci++) {
            int32_t tt;
            int32_t sl = s1_out_slot(rs, s, ci, tt);
            if (sl < 0)
                continue;
            for (int32_t r = 0; r < L1; r++)
                cuk_store(rs.state, rs.dtype, (int64_t)sl * rs.elems + (int64_t)r * dim + c,
                          SC_U(tt + 1 + r));
        }
#undef SC_U
    }
}

extern "C" cudaError_t cuk_short_conv(const cuk_rs_args *rs, const float *bcx, const void *w,
                                      int wdt, const void *b, int bdt, float *out, int32_t dim,
                                      int32_t L, cudaStream_t stream)
{
    if (L < 2 || L > SC_MAX)
        return cudaErrorInvalidValue;
    int64_t n = (int64_t)rs->n_seqs * dim;
    short_conv_kernel<<<cuk_grid(n, 128), 128, 0, stream>>>(*rs, bcx, w, wdt, b, bdt, out, dim, L);
    return cudaGetLastError();
}

/* ---- Mamba-1 scan --------------------------------------------------------------------------- */

/* Stores this lane's columns of S to state slot sl (row c). */
template <int NPL>
__device__ __forceinline__ void s1_store(const cuk_rs_args &rs, int32_t sl, int32_t c, int32_t N,
                                         int lane, const float *S)
{
#pragma unroll
    for (int j = 0; j < NPL; j++)
        if (lane + 32 * j < N)
            cuk_store(rs.state, rs.dtype, (int64_t)sl * rs.elems + (int64_t)c * N + lane + 32 * j,
                      S[j]);
}

template <int NPL>
__global__ void scan1_kernel(cuk_rs_args rs, cuk_scan1_args a)
{
    int lane = threadIdx.x & 31;
    int64_t n_warps = (int64_t)rs.n_seqs * a.d_inner;
    int64_t stride = ((int64_t)gridDim.x * blockDim.x) >> 5;
    int32_t N = a.d_state, n_tok = rs.n_seq_tokens;
    for (int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; warp < n_warps;
         warp += stride) {
        int64_t s = warp / a.d_inner;
        int32_t c = (int32_t)(warp - s * a.d_inner);
        float S[NPL], A[NPL];
        int64_t sb = 0;
        const void *src = cuk_rs_source(rs, s, sb);
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            int n = lane + 32 * j;
            bool on = n < N;
            S[j] = on && src ? cuk_load(src, rs.dtype, sb + (int64_t)c * N + n) : 0.0f;
            A[j] = on ? -expf(cuk_load(a.a_log, a.a_dt, (int64_t)c * N + n)) : 0.0f;
        }
        /* every lane has read its source columns before any lane writes */
        __syncwarp();
        float D = a.d ? cuk_load(a.d, a.d_dt, c) : 0.0f;
        float bias = a.dt_bias ? cuk_load(a.dt_bias, a.b_dt, c) : 0.0f;
        for (int32_t ci = 0; ci < rs.n_ckpt; ci++) {
            int32_t tt, sl = s1_out_slot(rs, s, ci, tt);
            if (sl >= 0 && tt == -1)
                s1_store<NPL>(rs, sl, c, N, lane, S);
        }
        for (int32_t t = 0; t < n_tok; t++) {
            int64_t row = s * n_tok + t;
            float v = a.dt[row * a.d_inner + c] + bias;
            float dtv = v > 20.0f ? v : log1pf(expf(v));
            float xv = a.x[row * a.d_inner + c], bx = dtv * xv, acc = 0.0f;
#pragma unroll
            for (int j = 0; j < NPL; j++) {
                int n = lane + 32 * j;
                if (n < N) {
                    S[j] = expf(dtv * A[j]) * S[j] + bx * a.b[row * N + n];
                    acc += S[j] * a.c[row * N + n];
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) {
                float yv = acc + D * xv;
                if (a.z) {
                    float zv = a.z[row * a.d_inner + c];
                    yv *= zv / (1.0f + expf(-zv));
                }
                a.y[row * a.d_inner + c] = yv;
            }
            /* checkpoints after this token, (last token) the dst, the
             * snapshot inside the ubatch */
            for (int32_t ci = 0; ci <= rs.n_ckpt + 1; ci++) {
                int32_t tt, sl = s1_out_slot(rs, s, ci, tt);
                if (sl >= 0 && tt == t)
                    s1_store<NPL>(rs, sl, c, N, lane, S);
            }
        }
    }
}

extern "C" int cuk_ssm_scan1_supported(int32_t d_state)
{
    return d_state >= 1 && d_state <= 256;
}

extern "C" cudaError_t cuk_ssm_scan1(const cuk_rs_args *rs, const cuk_scan1_args *a,
                                     cudaStream_t stream)
{
    int64_t threads = (int64_t)rs->n_seqs * a->d_inner * 32;
    unsigned grid = cuk_grid(threads, 128);
    int npl = (a->d_state + 31) / 32;
    if (npl <= 1)
        scan1_kernel<1><<<grid, 128, 0, stream>>>(*rs, *a);
    else if (npl <= 2)
        scan1_kernel<2><<<grid, 128, 0, stream>>>(*rs, *a);
    else if (npl <= 4)
        scan1_kernel<4><<<grid, 128, 0, stream>>>(*rs, *a);
    else if (npl <= 8)
        scan1_kernel<8><<<grid, 128, 0, stream>>>(*rs, *a);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

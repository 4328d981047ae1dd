/* llmem CUDA kernels: Mamba-2 selective scan as chunked SSD on tensor cores
 * for prefill ubatches (Dao & Gu, "Transformers are SSMs", ICML 2024,
 * Sec. 6, the SSD algorithm: block decomposition of the semiseparable
 * matrix into diagonal blocks, chunk states and state passing).
 *
 * Same op and semantics as the per-token scan (kernels/mamba.cu,
 * backends/cpu/ops_mamba.c; <llmem/ops.h> llmem_op_ssm_scan): per head h,
 *   dt_t = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max),
 *   a_t = dt_t * A_h, A_h = -exp(A_log[h]),
 *   S_t = exp(a_t) S_{t-1} + dt_t x_t ⊗ B_t,  y_t = S_t · C_t + D_h x_t.
 * With cum[t] = a_0 + ... + a_t inside a chunk of SSD_L tokens and S_-1 the
 * state before the chunk, this unrolls to
 *   y_t = exp(cum[t]) (S_-1 · C_t) + sum_{s<=t} (C_t · B_s) exp(cum[t] - cum[s]) dt_s x_s
 *   S_e = exp(cum[e]) S_-1 + sum_{s<=e} exp(cum[e] - cum[s]) dt_s x_s ⊗ B_s
 * i.e. three matrix products per chunk: the masked diagonal block
 * M = (C Bᵀ) ∘ decay ∘ dt, Yᵀ = Xᵀ Mᵀ + exp(cum) ∘ (S Cᵀ), and the state
 * update S += (w ∘ X)ᵀ B. One CTA owns one (stream, head) and walks its
 * chunks in order (the inter-chunk scan is this loop; with 128 heads or
 * more per ubatch the heads fill the GPU). Each of the 4 warps owns 16
 * state rows p, kept in registers as mma accumulators for the whole
 * ubatch; all products run on mma.sync.m16n8k16 with f32 accumulation.
 * B, C and M are split into bf16 tiles once per chunk and read as
 * fragments with ldmatrix (.trans for the state update's B); the fragments
 * of x, of S and of the weighted x are split in registers, once per k-step.
 *
 * Precision: every operand is split as hi + lo in bf16 (hi = bf16(v),
 * lo = bf16(v - hi)) and each product takes three MMAs (hi·hi + hi·lo +
 * lo·hi), about 2^-16 relative error per product, as the precise mode's
 * GEMMs (docs/cuda.md). The FAST precision mode (llmem_ssm_params.fast)
 * and $LLMEM_CUDA_SSD_FAST=1 run hi·hi only (one rounding to bf16 of the
 * operands, the fast mode's arithmetic). The
 * cumulative sums of a_t are taken in f64, so exp(cum[t] - cum[s]) is as
 * exact as the per-token products of exp(a_t).
 *
 * Checkpoints (the state after token n_tok - n_ckpt + c) and the snapshot
 * inside the ubatch (after token snap_tok[s]) are the state update
 * evaluated at that token of its chunk, so rollback works as with the
 * per-token kernel. Shapes: head_dim <= 64, d_state <= 128 (zero
 * padded inside the tiles); f32, f16 and bf16 states (I8 states stay on
 * kernels/mamba_q.cu).
 */
#include <cuda_bf16.h>
#include <stdlib.h>

#include "kernels/common.cuh"
#include "kernels/ssd.h"

#define SSD_L 64     /* chunk length (tokens) */
#define SSD_PM 64    /* largest head_dim: 16 state rows per warp */
#define SSD_NM 128   /* largest d_state */
#define SSD_WARPS 4
#define SSD_NT (SSD_NM / 8) /* n-tiles of a state row block */
/* Row strides of the shared tiles, in floats, = 4 (mod 32): the column
 * reads of a fragment (rows 2q, 2q + 1 of lane (r, q) at column r) then
 * fall into 32 different banks. */
#define SSD_LDX 68
/* Row strides of the bf16 tiles, in elements: 272 and 144 bytes = 16
 * (mod 128), so the 8 rows of an ldmatrix phase hit 8 different 16-byte
 * bank groups. */
#define SSD_LDH 136
#define SSD_LDM 72

/* B, C and M are stored split once per chunk (hi and lo bf16 tiles) and
 * read as mma fragments with ldmatrix; x stays f32 because the state
 * update scales it by a per-token weight first. */
struct ssd_smem {
    float x[SSD_L][SSD_LDX];                        /* x of the chunk's tokens, [t][p] */
    uint16_t bh[SSD_L][SSD_LDH], bl[SSD_L][SSD_LDH]; /* B, [t][n] */
    uint16_t ch[SSD_L][SSD_LDH], cl[SSD_L][SSD_LDH]; /* C, [t][n] */
    uint16_t mh[SSD_L][SSD_LDM], ml[SSD_L][SSD_LDM]; /* the masked diagonal block, [t][s] */
    double cum[SSD_L]; /* inclusive cumulative sum of dt * A */
    float dt[SSD_L];   /* dt after bias, softplus and limits (0 past the chunk) */
};

/* ---- tensor-core helpers ------------------------------------------------------------------- */

/* (x0, x1) as a bf16 pair (x0 in the low half); with SPLIT the residual
 * pair goes to lo. */
template <bool SPLIT>
__device__ __forceinline__ uint32_t ssd_split(float x0, float x1, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    if (SPLIT) {
        float2 f = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(x0 - f.x, x1 - f.y);
        lo = *reinterpret_cast<uint32_t *>(&l);
    }
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ void ssd_mma1(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += a · b with split operands: the small cross terms first. */
template <bool SPLIT>
__device__ __forceinline__ void ssd_mma(float *d, const uint32_t *ah, const uint32_t *al,
                                        const uint32_t *bh, const uint32_t *bl)
{
    if (SPLIT) {
        ssd_mma1(d, al, bh[0], bh[1]);
        ssd_mma1(d, ah, bl[0], bl[1]);
    }
    ssd_mma1(d, ah, bh[0], bh[1]);
}

/* Four 8x8 b16 matrices from shared memory; lane l gives the address of
 * row l % 8 of matrix l / 8 (.trans: each matrix transposed). */
__device__ __forceinline__ void ssd_ldsm4(uint32_t (&d)[4], const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a));
}

__device__ __forceinline__ void ssd_ldsm4t(uint32_t (&d)[4], const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a));
}

/* The B operand (k16 x n8, hi in b[0..1], lo in b[2..3]) of an mma whose
 * column j is row `row0 + j` of tile hi/lo and whose k runs along that row
 * from column k0. */
__device__ __forceinline__ void ssd_bfrag(uint32_t (&b)[4], const uint16_t *hi, const uint16_t *lo,
                                          int ld, int row0, int k0, int lane)
{
    const uint16_t *t = lane >> 4 ? lo : hi;
    ssd_ldsm4(b, t + (row0 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}

/* (v0, v1) split as bf16 hi + lo into two adjacent elements of tiles hi, lo. */
__device__ __forceinline__ void ssd_put2(uint16_t *hi, uint16_t *lo, float v0, float v1)
{
    uint32_t l, h = ssd_split<true>(v0, v1, l);
    *(uint32_t *)hi = h;
    *(uint32_t *)lo = l;
}

/* ---- slots ---------------------------------------------------------------------------------- */

__device__ __forceinline__ int32_t ssd_slot(int32_t sl, int32_t n_slots)
{
    return sl >= 0 && sl < n_slots ? sl : -1;
}

/* Lane (r, q) of the warp owning rows p0.. holds state element (p0 + r +
 * 8 (e >> 1), 8 j + 2 q + (e & 1)) in S[j][e] (the m16n8 accumulator
 * layout). */
__device__ __forceinline__ void ssd_state_store(const cuk_rs_args &rs, int32_t sl, int64_t off,
                                                int32_t P, int32_t N, int p0, int r, int q,
                                                const float (&S)[SSD_NT][4])
{
#pragma unroll
    for (int j = 0; j < SSD_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int32_t row = p0 + r + 8 * (e >> 1), col = 8 * j + 2 * q + (e & 1);
            if (row < P && col < N)
                cuk_store(rs.state, rs.dtype, (int64_t)sl * rs.elems + off + (int64_t)row * N + col,
                          S[j][e]);
        }
}

/* out = the state after token te of the chunk: exp(cum[te]) S + (w ∘ X)ᵀ B
 * with w_s = exp(cum[te] - cum[s]) dt_s for s <= te, 0 after (out may be
 * S). The warp's rows p0..p0+15. */
template <bool SPLIT>
__device__ __forceinline__ void ssd_state_at(const ssd_smem &sm, const float (&S)[SSD_NT][4],
                                             float (&out)[SSD_NT][4], int te, int nnt, int p0,
                                             int r, int q)
{
    float dec = expf((float)sm.cum[te]);
#pragma unroll
    for (int j = 0; j < SSD_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            out[j][e] = S[j][e] * dec;
#pragma unroll
    for (int kk = 0; kk < SSD_L / 16; kk++) {
        if (16 * kk > te)
            break;
        int s0 = 16 * kk + 2 * q;
        float w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int ss = s0 + (i & 1) + 8 * (i >> 1);
            w[i] = ss <= te ? expf((float)(sm.cum[te] - sm.cum[ss])) * sm.dt[ss] : 0.0f;
        }
        /* A = (w ∘ X)ᵀ: row p, k = s */
        uint32_t ah[4], al[4];
        ah[0] = ssd_split<SPLIT>(w[0] * sm.x[s0][p0 + r], w[1] * sm.x[s0 + 1][p0 + r], al[0]);
        ah[1] = ssd_split<SPLIT>(w[0] * sm.x[s0][p0 + r + 8], w[1] * sm.x[s0 + 1][p0 + r + 8],
                                 al[1]);
        ah[2] = ssd_split<SPLIT>(w[2] * sm.x[s0 + 8][p0 + r], w[3] * sm.x[s0 + 9][p0 + r], al[2]);
        ah[3] = ssd_split<SPLIT>(w[2] * sm.x[s0 + 8][p0 + r + 8],
                                 w[3] * sm.x[s0 + 9][p0 + r + 8], al[3]);
        /* B operand: k = s, column n = 8 j + r, from the [t][n] tile transposed */
        const int lane = 4 * r + q;
        const uint16_t *bt = (lane >> 4 ? &sm.bl[0][0] : &sm.bh[0][0]) +
                             (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * SSD_LDH;
#pragma unroll
        for (int j = 0; j < SSD_NT; j++) {
            if (j >= nnt)
                break;
            uint32_t b[4];
            ssd_ldsm4t(b, bt + 8 * j);
            ssd_mma<SPLIT>(out[j], ah, al, b, b + 2);
        }
    }
}

/* ---- the kernel ------------------------------------------------------------------------------ */

/* SNAP: the view has a snapshot inside the ubatch (its own instance, so
 * that the common one stays as it was). */
template <bool SPLIT, bool SNAP>
__global__ void __launch_bounds__(SSD_WARPS * 32) ssd_scan_kernel(cuk_rs_args rs, cuk_scan_args p)
{
    extern __shared__ __align__(16) unsigned char ssd_raw[];
    ssd_smem &sm = *reinterpret_cast<ssd_smem *>(ssd_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = lane >> 2, q = lane & 3;
    const int32_t H = p.n_heads, P = p.head_dim, N = p.d_state, G = p.n_groups;
    const int64_t s = blockIdx.x / H;
    const int32_t h = (int32_t)(blockIdx.x % H), g = h / (H / G);
    const int64_t hs = (int64_t)P * N, d_inner = (int64_t)H * P, n_tok = rs.n_seq_tokens;
    const int nk = (N + 15) / 16, nnt = (N + 7) / 8; /* k-steps and n-tiles over d_state */
    const int p0 = warp * 16;
    const bool vec = P % 4 == 0 && N % 4 == 0 && p.conv_dim % 4 == 0 &&
                     ((uintptr_t)p.xbc & 15) == 0;
    const float A = -expf(cuk_load(p.a_log, p.a_dt, h));
    const float Dh = cuk_param(p.d, p.d_dt, h, 0.0f), bias = cuk_param(p.dt_bias, p.b_dt, h, 0.0f);

    /* the whole (stream, head) state is read before any slot is written */
    float S[SSD_NT][4];
    {
        int64_t sb = 0;
        const void *src = cuk_rs_source(rs, s, sb);
#pragma unroll
        for (int j = 0; j < SSD_NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int32_t row = p0 + r + 8 * (e >> 1), col = 8 * j + 2 * q + (e & 1);
                S[j][e] = src && row < P && col < N
                              ? cuk_load(src, rs.dtype, sb + h * hs + (int64_t)row * N + col)
                              : 0.0f;
            }
    }
    for (int32_t c = 0; c < rs.n_ckpt; c++) {
        int32_t sl = ssd_slot(rs.ckpt[s * rs.n_ckpt + c], rs.n_slots);
        if (sl >= 0 && n_tok - rs.n_ckpt + c == -1)
            ssd_state_store(rs, sl, h * hs, P, N, p0, r, q, S);
    }

    int32_t snap_t = -1;
    const int32_t snap_sl = SNAP ? cuk_rs_snap(rs, s, snap_t) : -1;
    for (int64_t t0 = 0; t0 < n_tok; t0 += SSD_L) {
        const int Lc = n_tok - t0 < SSD_L ? (int)(n_tok - t0) : SSD_L;
        const int64_t tok0 = s * n_tok + t0;
        /* ---- the chunk's x (f32), B and C (split), zeros past the chunk and the shape */
        if (vec) { /* 16-byte loads: rows, offsets and widths are multiples of 4 floats */
            for (int i = tid; i < SSD_L * SSD_PM / 4; i += SSD_WARPS * 32) {
                int t = i / (SSD_PM / 4), pp = 4 * (i % (SSD_PM / 4));
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (t < Lc && pp < P)
                    v = __ldg((const float4 *)(p.xbc + (tok0 + t) * p.conv_dim +
                                               (int64_t)h * P + pp));
                *(float4 *)&sm.x[t][pp] = v;
            }
            for (int i = tid; i < SSD_L * SSD_NM / 4; i += SSD_WARPS * 32) {
                int t = i / (SSD_NM / 4), n = 4 * (i % (SSD_NM / 4));
                float4 vb = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vc = vb;
                if (t < Lc && n < N) {
                    const float *row =
                        p.xbc + (tok0 + t) * p.conv_dim + d_inner + (int64_t)g * N + n;
                    vb = __ldg((const float4 *)row);
                    vc = __ldg((const float4 *)(row + (int64_t)G * N));
                }
                ssd_put2(&sm.bh[t][n], &sm.bl[t][n], vb.x, vb.y);
                ssd_put2(&sm.bh[t][n + 2], &sm.bl[t][n + 2], vb.z, vb.w);
                ssd_put2(&sm.ch[t][n], &sm.cl[t][n], vc.x, vc.y);
                ssd_put2(&sm.ch[t][n + 2], &sm.cl[t][n + 2], vc.z, vc.w);
            }
        } else {
            for (int i = tid; i < SSD_L * SSD_PM; i += SSD_WARPS * 32) {
                int t = i / SSD_PM, pp = i % SSD_PM;
                sm.x[t][pp] = t < Lc && pp < P
                                  ? __ldg(p.xbc + (tok0 + t) * p.conv_dim + (int64_t)h * P + pp)
                                  : 0.0f;
            }
            for (int i = tid; i < SSD_L * SSD_NM / 2; i += SSD_WARPS * 32) {
                int t = i / (SSD_NM / 2), n = 2 * (i % (SSD_NM / 2));
                const float *row = p.xbc + (tok0 + t) * p.conv_dim + d_inner + (int64_t)g * N + n;
                bool ok0 = t < Lc && n < N, ok1 = t < Lc && n + 1 < N;
                ssd_put2(&sm.bh[t][n], &sm.bl[t][n], ok0 ? __ldg(row) : 0.0f,
                         ok1 ? __ldg(row + 1) : 0.0f);
                ssd_put2(&sm.ch[t][n], &sm.cl[t][n], ok0 ? __ldg(row + (int64_t)G * N) : 0.0f,
                         ok1 ? __ldg(row + (int64_t)G * N + 1) : 0.0f);
            }
        }
        if (warp == 0) { /* dt and the f64 cumulative sum, two tokens per lane */
            float a2[2];
            for (int k = 0; k < 2; k++) {
                int t = 2 * lane + k;
                float dtv = 0.0f;
                if (t < Lc) {
                    float v = __ldg(p.dt + (tok0 + t) * H + h) + bias;
                    dtv = v > 20.0f ? v : log1pf(expf(v));
                    dtv = dtv < p.dt_min ? p.dt_min : dtv;
                    dtv = dtv > p.dt_max ? p.dt_max : dtv;
                }
                sm.dt[t] = dtv;
                a2[k] = dtv * A;
            }
            double pair = (double)a2[0] + (double)a2[1], incl = pair;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                double o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off)
                    incl += o;
            }
            sm.cum[2 * lane] = incl - pair + (double)a2[0];
            sm.cum[2 * lane + 1] = incl;
        }
        __syncthreads();

        /* ---- M = (C Bᵀ) ∘ exp(cum[t] - cum[s]) ∘ dt[s], s <= t; warp rows t in m0.. */
        {
            const int m0 = warp * 16, nj = 2 * warp + 2; /* s-tiles up to the diagonal */
            float ga[SSD_L / 8][4];
#pragma unroll
            for (int j = 0; j < SSD_L / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ga[j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < SSD_NM / 16; kk++) {
                if (kk >= nk)
                    break;
                /* A = C rows m0.., k = n, via ldmatrix: lane l gives row (l % 8) + 8 ((l / 8) % 2)
                 * at column 16 kk + 8 (l / 16) */
                uint32_t ah[4], al[4];
                int ar = m0 + (lane & 7) + ((lane >> 3) & 1) * 8, ac = 16 * kk + (lane >> 4) * 8;
                ssd_ldsm4(ah, &sm.ch[ar][ac]);
                if (SPLIT)
                    ssd_ldsm4(al, &sm.cl[ar][ac]);
#pragma unroll
                for (int j = 0; j < SSD_L / 8; j++) {
                    if (j >= nj)
                        break;
                    uint32_t b[4]; /* column s = 8 j + r is row s of B */
                    ssd_bfrag(b, &sm.bh[0][0], &sm.bl[0][0], SSD_LDH, 8 * j, 16 * kk, lane);
                    ssd_mma<SPLIT>(ga[j], ah, al, b, b + 2);
                }
            }
#pragma unroll
            for (int j = 0; j < SSD_L / 8; j++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    int t = m0 + r + 8 * e2, sj = 8 * j + 2 * q;
                    float v[2];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        v[i] = 0.0f; /* above the diagonal: exp would grow, and is not taken */
                        if (j < nj && sj + i <= t)
                            v[i] = ga[j][2 * e2 + i] * expf((float)(sm.cum[t] - sm.cum[sj + i])) *
                                   sm.dt[sj + i];
                    }
                    ssd_put2(&sm.mh[t][sj], &sm.ml[t][sj], v[0], v[1]);
                }
        }
        __syncthreads();

        /* ---- yᵀ[p][t] = exp(cum[t]) (S Cᵀ)[p][t] + (Xᵀ Mᵀ)[p][t] + D x[t][p] */
        {
            float ya[SSD_L / 8][4];
#pragma unroll
            for (int j = 0; j < SSD_L / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ya[j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < SSD_NM / 16; kk++) { /* k = n; A = S from the accumulators */
                if (kk >= nk)
                    break;
                uint32_t ah[4], al[4];
                ah[0] = ssd_split<SPLIT>(S[2 * kk][0], S[2 * kk][1], al[0]);
                ah[1] = ssd_split<SPLIT>(S[2 * kk][2], S[2 * kk][3], al[1]);
                ah[2] = ssd_split<SPLIT>(S[2 * kk + 1][0], S[2 * kk + 1][1], al[2]);
                ah[3] = ssd_split<SPLIT>(S[2 * kk + 1][2], S[2 * kk + 1][3], al[3]);
#pragma unroll
                for (int jt = 0; jt < SSD_L / 8; jt++) {
                    uint32_t b[4]; /* column t = 8 jt + r is row t of C */
                    ssd_bfrag(b, &sm.ch[0][0], &sm.cl[0][0], SSD_LDH, 8 * jt, 16 * kk, lane);
                    ssd_mma<SPLIT>(ya[jt], ah, al, b, b + 2);
                }
            }
#pragma unroll
            for (int jt = 0; jt < SSD_L / 8; jt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ya[jt][e] *= expf((float)sm.cum[8 * jt + 2 * q + (e & 1)]);
#pragma unroll
            for (int kk = 0; kk < SSD_L / 16; kk++) { /* k = s; A = Xᵀ */
                if (16 * kk >= Lc)
                    break;
                int s0 = 16 * kk + 2 * q;
                uint32_t ah[4], al[4];
                ah[0] = ssd_split<SPLIT>(sm.x[s0][p0 + r], sm.x[s0 + 1][p0 + r], al[0]);
                ah[1] = ssd_split<SPLIT>(sm.x[s0][p0 + r + 8], sm.x[s0 + 1][p0 + r + 8], al[1]);
                ah[2] = ssd_split<SPLIT>(sm.x[s0 + 8][p0 + r], sm.x[s0 + 9][p0 + r], al[2]);
                ah[3] = ssd_split<SPLIT>(sm.x[s0 + 8][p0 + r + 8], sm.x[s0 + 9][p0 + r + 8],
                                         al[3]);
#pragma unroll
                for (int jt = 0; jt < SSD_L / 8; jt++) {
                    if (2 * kk > jt) /* the block is above the diagonal: all zeros */
                        continue;
                    uint32_t b[4]; /* column t = 8 jt + r is row t of M */
                    ssd_bfrag(b, &sm.mh[0][0], &sm.ml[0][0], SSD_LDM, 8 * jt, 16 * kk, lane);
                    ssd_mma<SPLIT>(ya[jt], ah, al, b, b + 2);
                }
            }
#pragma unroll
            for (int jt = 0; jt < SSD_L / 8; jt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int t = 8 * jt + 2 * q + (e & 1), pp = p0 + r + 8 * (e >> 1);
                    if (t < Lc && pp < P)
                        p.y[(tok0 + t) * d_inner + (int64_t)h * P + pp] =
                            ya[jt][e] + Dh * sm.x[t][pp];
                }
        }

        /* ---- checkpoints and the snapshot inside the chunk, then the state after it */
        for (int32_t c = 0; c < rs.n_ckpt; c++) {
            int64_t tc = n_tok - rs.n_ckpt + c;
            int32_t sl = ssd_slot(rs.ckpt[s * rs.n_ckpt + c], rs.n_slots);
            if (sl < 0 || tc < t0 || tc >= t0 + Lc)
                continue;
            float T[SSD_NT][4];
            ssd_state_at<SPLIT>(sm, S, T, (int)(tc - t0), nnt, p0, r, q);
            ssd_state_store(rs, sl, h * hs, P, N, p0, r, q, T);
        }
        if (SNAP && snap_sl >= 0 && snap_t >= t0 && snap_t < t0 + Lc) {
            float T[SSD_NT][4];
            ssd_state_at<SPLIT>(sm, S, T, (int)(snap_t - t0), nnt, p0, r, q);
            ssd_state_store(rs, snap_sl, h * hs, P, N, p0, r, q, T);
        }
        ssd_state_at<SPLIT>(sm, S, S, Lc - 1, nnt, p0, r, q);
        __syncthreads(); /* the tiles are refilled */
    }
    int32_t sl = ssd_slot(rs.dst[s], rs.n_slots);
    if (sl >= 0)
        ssd_state_store(rs, sl, h * hs, P, N, p0, r, q, S);
}

/* ---- host side ------------------------------------------------------------------------------ */

/* $LLMEM_CUDA_SSD_MIN: tokens per stream from which the chunked kernel runs
 * (default 64; 0 turns it off); $LLMEM_CUDA_SSD_FAST=1: single bf16
 * products. Read once. */
static int ssd_min_tokens(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LLMEM_CUDA_SSD_MIN");
        int x = e ? atoi(e) : 64;
        v = x < 0 ? 0 : x;
    }
    return v;
}

static int ssd_fast(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LLMEM_CUDA_SSD_FAST");
        v = e && atoi(e) ? 1 : 0;
    }
    return v;
}

extern "C" int cuk_ssd_applies(const cuk_rs_args *rs, const cuk_scan_args *p)
{
    int min = ssd_min_tokens();
    return min > 0 && rs->n_seq_tokens >= min && rs->n_seqs >= 1 &&
           (rs->dtype == CUK_F32 || rs->dtype == CUK_F16 || rs->dtype == CUK_BF16) &&
           p->head_dim >= 1 && p->head_dim <= SSD_PM && p->d_state >= 1 &&
           p->d_state <= SSD_NM && p->n_groups >= 1 && p->n_heads % p->n_groups == 0;
}

template <bool SPLIT, bool SNAP>
static cudaError_t ssd_launch(const cuk_rs_args *rs, const cuk_scan_args *p, cudaStream_t stream)
{
    /* the shared-memory attribute is per device (tensor parallelism runs
     * several in one process, one thread each) */
    static unsigned long long sized = 0;
    const int smem = (int)sizeof(ssd_smem);
    cudaError_t e = cuk_smem_once(ssd_scan_kernel<SPLIT, SNAP>, smem, &sized);
    if (e != cudaSuccess)
        return e;
    int64_t blocks = (int64_t)rs->n_seqs * p->n_heads;
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    ssd_scan_kernel<SPLIT, SNAP><<<(unsigned)blocks, SSD_WARPS * 32, smem, stream>>>(*rs, *p);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_ssd_scan(const cuk_rs_args *rs, const cuk_scan_args *p,
                                    cudaStream_t stream)
{
    if (p->head_dim < 1 || p->head_dim > SSD_PM || p->d_state < 1 || p->d_state > SSD_NM ||
        p->n_groups < 1 || p->n_heads % p->n_groups ||
        (rs->dtype != CUK_F32 && rs->dtype != CUK_F16 && rs->dtype != CUK_BF16))
        return cudaErrorInvalidValue;
    if (rs->n_seqs < 0 || rs->n_seq_tokens < 0)
        return cudaErrorInvalidValue;
    if (rs->n_seqs == 0)
        return cudaSuccess;
    /* single bf16 products in the FAST precision mode (p->fast) or with
     * $LLMEM_CUDA_SSD_FAST=1; hi + lo splits otherwise */
    bool one = ssd_fast() || p->fast;
    if (rs->snap_slot) /* a snapshot inside the ubatch: the kernel's own instance */
        return one ? ssd_launch<false, true>(rs, p, stream) : ssd_launch<true, true>(rs, p, stream);
    return one ? ssd_launch<false, false>(rs, p, stream) : ssd_launch<true, false>(rs, p, stream);
}

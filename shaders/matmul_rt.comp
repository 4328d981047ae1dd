#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[M, N] = a[M, K] · w[N, K]ᵀ with f32 accumulation, register-tiled for
 * many activation rows (batched decode above 32 rows, prefill).
 *
 * A workgroup of 256 invocations computes a BM x 128 tile of out; each
 * invocation owns TM x 8 outputs (rows ty + i * BM/TM, columns tx + j * 16),
 * so a step of the K loop does TM + 8 shared-memory loads for 8 * TM FMAs.
 * Global loads are 16 bytes wide: a vec4 of activations, a uvec4 of weights
 * (8 f16/bf16 or 4 f32). Tiles of K are BK = 16 wide and stored transposed
 * in shared memory with rows padded by two words: a warp's transposing
 * stores then hit 32 distinct banks (row (4c + i) or (8q + i) times the
 * padded width, plus the tile row, is 8c + r + 2i or 16q + c + 2i modulo
 * 32), and the compute loads are broadcasts or consecutive words.
 *
 * Split-K: workgroup g computes slice s = g / (tiles_m * tiles_n) of K,
 * [s * k_split, min(k, (s + 1) * k_split)), and writes its partial tile to
 * out + s * slice_stride; with more than one slice the host points out at a
 * scratch buffer and sums the slices with sum_slices.comp in a fixed order
 * (results do not depend on scheduling). Narrow outputs (attention and FFN
 * down projections at decode batch sizes) otherwise fill too few SMs.
 *
 * Needs k % 8 == 0 (k % 4 for f32 weights), k_split % BK == 0, and 16-byte
 * aligned rows and offsets; the host uses matmul.comp otherwise. This is
 * the classic SIMT GEMM blocking (Volkov & Demmel 2008; the CUTLASS
 * "threadblock / thread tile" hierarchy), written from the description. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 2; /* 0 f32, 1 f16, 2 bf16 */
layout(constant_id = 2) const uint BM = 128; /* 16, 32, 64 or 128 */
layout(constant_id = 3) const uint TM = 8;   /* BM / 16 */

const uint BN = 128u, TN = 8u, BK = 16u; /* 16.6 KB of shared memory (lavapipe allows 32) */
const uint RM = BM / TM, RN = BN / TN; /* 16 x 16 invocations */
const uint EPV = W_DT == 0u ? 4u : 8u; /* weights per uvec4 */
const uint SA = BM + 2u, SW = BN + 2u; /* padded shared-memory rows: see the header */

layout(binding = 0) readonly buffer A { vec4 a[]; };
layout(binding = 1) readonly buffer W { uvec4 w[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint m, n, k;
    uint a_off;        /* vec4s */
    uint w_off;        /* uvec4s */
    uint o_off;        /* floats */
    uint tiles_m, tiles_mn;
    uint k_split;      /* K per slice, a multiple of BK */
    uint slice_stride; /* floats between two slices' outputs */
    uint n_groups;     /* tiles_mn * slices */
} p;

shared float as_[BK * SA];
shared float ws_[BK * SW];

void store_w(uint kk, uint c, uvec4 u)
{
    if (W_DT == 0u) {
        ws_[(kk + 0u) * SW + c] = uintBitsToFloat(u.x);
        ws_[(kk + 1u) * SW + c] = uintBitsToFloat(u.y);
        ws_[(kk + 2u) * SW + c] = uintBitsToFloat(u.z);
        ws_[(kk + 3u) * SW + c] = uintBitsToFloat(u.w);
        return;
    }
    for (uint h = 0u; h < 4u; h++) {
        uint x = u[h];
        vec2 f = W_DT == 1u ? unpackHalf2x16(x)
                            : vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u));
        ws_[(kk + 2u * h) * SW + c] = f.x;
        ws_[(kk + 2u * h + 1u) * SW + c] = f.y;
    }
}

void main()
{
    uint g = group_id();
    if (g >= p.n_groups)
        return;
    uint s = g / p.tiles_mn, t = g % p.tiles_mn;
    uint m0 = (t % p.tiles_m) * BM, n0 = (t / p.tiles_m) * BN;
    uint k_begin = s * p.k_split, k_end = min(p.k, k_begin + p.k_split);
    uint l = gl_LocalInvocationID.x;
    uint tx = l % RN, ty = l / RN;
    float acc[TM * TN];
    for (uint i = 0u; i < TM * TN; i++)
        acc[i] = 0.0;
    const uint AV = BK / 4u, WV = BK / EPV; /* 16-byte loads per tile row */
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        for (uint e = l; e < BM * AV; e += WG) {
            uint r = e / AV, c = e % AV;
            uint gm = m0 + r, gk = k0 + 4u * c;
            vec4 v = gm < p.m && gk < k_end ? a[p.a_off + (gm * p.k + gk) / 4u] : vec4(0.0);
            as_[(4u * c + 0u) * SA + r] = v.x;
            as_[(4u * c + 1u) * SA + r] = v.y;
            as_[(4u * c + 2u) * SA + r] = v.z;
            as_[(4u * c + 3u) * SA + r] = v.w;
        }
        for (uint e = l; e < BN * WV; e += WG) {
            uint c = e / WV, q = e % WV;
            uint gn = n0 + c, gk = k0 + q * EPV;
            uvec4 u = gn < p.n && gk < k_end ? w[p.w_off + (gn * p.k + gk) / EPV] : uvec4(0u);
            store_w(q * EPV, c, u);
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float ar[TM], wr[TN];
            for (uint i = 0u; i < TM; i++)
                ar[i] = as_[kk * SA + ty + i * RM];
            for (uint j = 0u; j < TN; j++)
                wr[j] = ws_[kk * SW + tx + j * RN];
            for (uint i = 0u; i < TM; i++)
                for (uint j = 0u; j < TN; j++)
                    acc[i * TN + j] = fma(ar[i], wr[j], acc[i * TN + j]);
        }
        barrier();
    }
    uint base = p.o_off + s * p.slice_stride;
    for (uint i = 0u; i < TM; i++) {
        uint gm = m0 + ty + i * RM;
        if (gm >= p.m)
            continue;
        for (uint j = 0u; j < TN; j++) {
            uint gn = n0 + tx + j * RN;
            if (gn < p.n)
                o[base + gm * p.n + gn] = acc[i * TN + j];
        }
    }
}

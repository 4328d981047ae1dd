#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[M, N] = a[M, K] · w[N, K]ᵀ with f32 accumulation (a linear layer).
 * Classic shared-memory tiling: a workgroup computes a BM x BN tile of
 * out, stepping through K in slices of BK; each invocation owns TM x TN
 * outputs spread with stride BM/TM (rows) and BN/TN (columns) so that
 * neighbouring invocations read neighbouring shared-memory words.
 * W_DT is the weight dtype (f32, f16, bf16; converted to f32 on load).
 * Tile sizes are specialization constants; WG must equal
 * (BM / TM) * (BN / TN). */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 0;
layout(constant_id = 2) const uint BM = 64;
layout(constant_id = 3) const uint BN = 64;
layout(constant_id = 4) const uint BK = 16;
layout(constant_id = 5) const uint TM = 4;
layout(constant_id = 6) const uint TN = 4;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint m, n, k, a_off, w_off, o_off, tiles_m, n_tiles;
} p;

shared float as_[BK * BM];
shared float ws_[BK * BN];

void main()
{
    uint tile = group_id();
    if (tile >= p.n_tiles)
        return;
    uint m0 = (tile % p.tiles_m) * BM, n0 = (tile / p.tiles_m) * BN;
    uint l = gl_LocalInvocationID.x;
    const uint RM = BM / TM, RN = BN / TN;
    uint tx = l % RN, ty = l / RN;
    float acc[TM * TN];
    for (uint i = 0; i < TM * TN; i++)
        acc[i] = 0.0;
    for (uint k0 = 0; k0 < p.k; k0 += BK) {
        for (uint e = l; e < BM * BK; e += WG) {
            uint r = e / BK, kk = e % BK;
            uint gm = m0 + r, gk = k0 + kk;
            as_[kk * BM + r] = gm < p.m && gk < p.k ? a[p.a_off + gm * p.k + gk] : 0.0;
        }
        for (uint e = l; e < BN * BK; e += WG) {
            uint c = e / BK, kk = e % BK;
            uint gn = n0 + c, gk = k0 + kk;
            ws_[kk * BN + c] = gn < p.n && gk < p.k ? LOAD_F(w, p.w_off + gn * p.k + gk, W_DT) : 0.0;
        }
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            float ar[TM], wr[TN];
            for (uint i = 0; i < TM; i++)
                ar[i] = as_[kk * BM + ty + i * RM];
            for (uint j = 0; j < TN; j++)
                wr[j] = ws_[kk * BN + tx + j * RN];
            for (uint i = 0; i < TM; i++)
                for (uint j = 0; j < TN; j++)
                    acc[i * TN + j] += ar[i] * wr[j];
        }
        barrier();
    }
    for (uint i = 0; i < TM; i++) {
        uint gm = m0 + ty + i * RM;
        if (gm >= p.m)
            continue;
        for (uint j = 0; j < TN; j++) {
            uint gn = n0 + tx + j * RN;
            if (gn < p.n)
                o[p.o_off + gm * p.n + gn] = acc[i * TN + j];
        }
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[0 .. MR, n] = a · wᵀ for f16/bf16 weights and few activation rows
 * (decode), with 16-byte weight loads: TPR invocations share one weight
 * row, each loading a uvec4 (8 weights) per step and UNROLL steps ahead,
 * so a warp reads 512 contiguous bytes per load instruction (matvec.comp
 * reads 2 bytes per invocation, which left NVIDIA's GEMV at about a quarter
 * of the copy bandwidth). Needs k % 8 == 0 and 16-byte aligned rows (the
 * host falls back to matvec.comp otherwise). f32 accumulation; the TPR
 * partial sums of a row are added in a fixed order through shared memory,
 * so the result does not depend on the subgroup size. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 2; /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint MR = 1;   /* activation rows */
layout(constant_id = 3) const uint TPR = 32; /* invocations per weight-row group; divides WG */
layout(constant_id = 4) const uint NR = 1;   /* weight rows per group: each activation load
                                                 serves NR rows (L1 traffic / NR for MR > 1) */

layout(constant_id = 5) const uint SWI = 0; /* 1: out = silu(a · wᵀ) * (a · uᵀ) (matmul_swiglu) */
layout(constant_id = 6) const uint UNR = 0; /* 16-byte loads in flight per weight row and
                                                invocation; 0: 2 */

const uint UNROLL = UNR != 0u ? UNR : 2u;

layout(binding = 0) readonly buffer A { vec4 a[]; };
layout(binding = 1) readonly buffer W { uvec4 w[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(binding = 3) readonly buffer U { uvec4 uw[]; }; /* up weights (SWI) */

layout(push_constant) uniform P {
    uint m, n, k, a_off, w_off, o_off; /* a_off in vec4s, w_off in uvec4s, o_off in floats */
    uint u_off;                        /* uvec4s (SWI) */
} p;

const uint NW = SWI != 0u ? 2u : 1u; /* weight matrices */
const uint CH = TPR < 8u ? TPR : 8u;   /* partial sums per run */
const uint NRUN = TPR / CH;            /* runs per output */
/* every activation row's partials at once ([row][matrix][weight row][WG]):
 * acc is then only indexed in loops without barriers, which the compiler
 * unrolls; with a loop over the rows around the barriers (as before), it
 * kept acc in local memory at 4-8 rows (H200, driver 580: 240-384 bytes) */
shared float part[MR * NW * NR * WG];
shared float runs[MR * NW * NR * WG / CH];

vec2 widen(uint u)
{
    if (W_DT == 1u)
        return unpackHalf2x16(u);
    return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xffff0000u));
}

void main()
{
    const uint RPW = WG / TPR; /* weight-row groups per workgroup */
    uint l = gl_LocalInvocationID.x;
    uint lane = l % TPR;
    uint n0 = (group_id() * RPW + l / TPR) * NR; /* first weight row of the group */
    uint kv = p.k / 8u, ka = p.k / 4u;
    float acc[NW * MR * NR]; /* [matrix][activation row][weight row] */
    for (uint i = 0; i < NW * MR * NR; i++)
        acc[i] = 0.0;
    for (uint j = lane; j < kv; j += TPR * UNROLL) {
        uvec4 q[UNROLL * NR * NW];
        for (uint u = 0; u < UNROLL; u++)
            for (uint r = 0; r < NR; r++) {
                uint jj = j + u * TPR;
                bool inb = jj < kv && n0 + r < p.n;
                q[u * NR + r] = inb ? w[p.w_off + (n0 + r) * kv + jj] : uvec4(0u);
                if (SWI != 0u)
                    q[(UNROLL + u) * NR + r] = inb ? uw[p.u_off + (n0 + r) * kv + jj] : uvec4(0u);
            }
        for (uint u = 0; u < UNROLL; u++) {
            uint jj = j + u * TPR;
            if (jj >= kv)
                break;
            for (uint i = 0; i < MR; i++) {
                if (i >= p.m)
                    continue;
                vec4 x0 = a[p.a_off + i * ka + 2u * jj], x1 = a[p.a_off + i * ka + 2u * jj + 1u];
                for (uint mt = 0; mt < NW; mt++)
                    for (uint r = 0; r < NR; r++) {
                        uvec4 qq = q[(mt * UNROLL + u) * NR + r];
                        acc[(mt * MR + i) * NR + r] += dot(x0, vec4(widen(qq.x), widen(qq.y))) +
                                                       dot(x1, vec4(widen(qq.z), widen(qq.w)));
                    }
            }
        }
    }
    /* TPR partial sums per output, added in a fixed order through shared
     * memory: runs of CH consecutive partials first (many invocations),
     * then the runs of each output; all activation rows together */
    for (uint i = 0; i < MR; i++)
        for (uint mt = 0; mt < NW; mt++)
            for (uint r = 0; r < NR; r++)
                part[((i * NW + mt) * NR + r) * WG + l] = acc[(mt * MR + i) * NR + r];
    barrier();
    for (uint t = l; t < MR * NW * NR * RPW * NRUN; t += WG) {
        uint c = t % NRUN, g = (t / NRUN) % RPW, rr = (t / (NRUN * RPW)) % NR;
        uint mi = t / (NRUN * RPW * NR); /* i * NW + mt */
        uint base = (mi * NR + rr) * WG + g * TPR + c * CH;
        float s = 0.0;
        for (uint x = 0; x < CH; x++)
            s += part[base + x];
        runs[t] = s;
    }
    barrier();
    for (uint t = l; t < MR * RPW * NR; t += WG) {
        uint i = t / (RPW * NR), g = (t / NR) % RPW, r = t % NR;
        uint nn = (group_id() * RPW + g) * NR + r;
        uint ri = i * NW * NR * RPW * NRUN; /* row i's runs */
        float s = 0.0, su = 0.0;
        for (uint c = 0; c < NRUN; c++)
            s += runs[ri + (r * RPW + g) * NRUN + c];
        if (SWI != 0u) {
            for (uint c = 0; c < NRUN; c++)
                su += runs[ri + ((NR + r) * RPW + g) * NRUN + c];
            s = silu(s) * su;
        }
        if (nn < p.n && i < p.m)
            o[p.o_off + i * p.n + nn] = s;
    }
}

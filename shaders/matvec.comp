#version 450
#extension GL_GOOGLE_include_directive : enable
/* out = a · wᵀ for few activation rows (decode): a workgroup computes
 * out[m0 .. m0 + MR, n] for one weight row n; its invocations split K
 * (reading the weight row coalesced), then reduce each of the MR partial
 * sums (subgroup arithmetic where available). f32 accumulation. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 0;
layout(constant_id = 2) const uint MR = 1;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint m, n, k, a_off, w_off, o_off, n_items;
} p;

void main()
{
    uint item = group_id();
    if (item >= p.n_items)
        return;
    uint n = item % p.n, m0 = (item / p.n) * MR;
    uint l = gl_LocalInvocationID.x;
    float acc[MR];
    for (uint i = 0; i < MR; i++)
        acc[i] = 0.0;
    uint wrow = p.w_off + n * p.k;
    for (uint kk = l; kk < p.k; kk += WG) {
        float wv = LOAD_F(w, wrow + kk, W_DT);
        for (uint i = 0; i < MR; i++)
            if (m0 + i < p.m)
                acc[i] += a[p.a_off + (m0 + i) * p.k + kk] * wv;
    }
    for (uint i = 0; i < MR; i++) {
        float s = wg_sum(acc[i]);
        if (l == 0u && m0 + i < p.m)
            o[p.o_off + (m0 + i) * p.n + n] = s;
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Routed experts of a mixture of experts (llmem_op_moe_ffn):
 *   out[t] = sum_j w[t, j] * down[e] · h,  h = act(gate[e] x[t]) * (up[e] x[t])
 * (gated) or act(up[e] x[t]), e = ids[t, j].
 * One workgroup per token: for each of its k experts the invocations split
 * the I hidden rows (h kept in shared memory), then the D output rows,
 * each invocation accumulating the output elements it owns in choice
 * order, so no atomics are needed and the sum order is fixed. Only the
 * chosen experts' rows are read; an id outside [0, E) is skipped.
 * Weights are f32/f16/bf16 (W_DT), math in f32. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 0;
layout(constant_id = 2) const uint MAXI = 64;  /* shared h capacity (>= I) */
layout(constant_id = 3) const uint GATED = 1;
layout(constant_id = 4) const uint ACT = 0;    /* 0 silu, 1 relu2 */

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer ID { int ids[]; };
layout(binding = 2) readonly buffer WT { float wt[]; };
layout(binding = 3) readonly buffer U { uint up[]; };
layout(binding = 4) readonly buffer DN { uint dn[]; };
layout(binding = 5) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint T, D, I, E, k, x_off, id_off, w_off, up_off, dn_off, o_off;
} p;

shared float h[MAXI];

float act(float v)
{
    return ACT == 1u ? (v > 0.0 ? v * v : 0.0) : silu(v);
}

void main()
{
    uint t = group_id();
    if (t >= p.T)
        return;
    uint l = gl_LocalInvocationID.x;
    uint xr = p.x_off + t * p.D;
    for (uint d = l; d < p.D; d += WG)
        o[p.o_off + t * p.D + d] = 0.0;
    uint rows = GATED == 1u ? 2u * p.I : p.I;
    for (uint j = 0u; j < p.k; j++) {
        int e = ids[p.id_off + t * p.k + j];
        if (e < 0 || uint(e) >= p.E)
            continue; /* uniform over the workgroup */
        float wj = wt[p.w_off + t * p.k + j];
        uint ub = p.up_off + uint(e) * rows * p.D;
        for (uint i = l; i < p.I; i += WG) {
            uint ur = ub + ((GATED == 1u ? p.I : 0u) + i) * p.D;
            float u = 0.0, g = 0.0;
            for (uint d = 0u; d < p.D; d++)
                u += x[xr + d] * LOAD_F(up, ur + d, W_DT);
            if (GATED == 1u) {
                uint gr = ub + i * p.D;
                for (uint d = 0u; d < p.D; d++)
                    g += x[xr + d] * LOAD_F(up, gr + d, W_DT);
                h[i] = act(g) * u;
            } else {
                h[i] = act(u);
            }
        }
        barrier();
        uint db = p.dn_off + uint(e) * p.D * p.I;
        for (uint d = l; d < p.D; d += WG) {
            float y = 0.0;
            uint dr = db + d * p.I;
            for (uint i = 0u; i < p.I; i++)
                y += h[i] * LOAD_F(dn, dr + i, W_DT);
            o[p.o_off + t * p.D + d] += wj * y;
        }
        barrier();
    }
}

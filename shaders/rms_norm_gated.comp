#version 450
#extension GL_GOOGLE_include_directive : enable
/* Gated RMS norm of Mamba-2 (HF MambaRMSNormGated): h = y * silu(z), then
 * each group of gs = D / n_groups elements is normalized:
 * out = h / sqrt(mean_group(h^2) + eps) * w. One workgroup per (row,
 * group). out may be y or z: an invocation recomputes h from its own
 * elements before writing them. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 0;

layout(binding = 0) readonly buffer Y { float y[]; };
layout(binding = 1) readonly buffer Z { float z[]; };
layout(binding = 2) readonly buffer W { uint w[]; };
layout(binding = 3) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n_items, cols, gs, n_groups, y_off, z_off, w_off, o_off;
    float eps;
} p;

void main()
{
    uint item = group_id();
    if (item >= p.n_items)
        return;
    uint row = item / p.n_groups, grp = item % p.n_groups;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.cols + grp * p.gs;
    float ss = 0.0;
    for (uint c = l; c < p.gs; c += WG) {
        float h = y[p.y_off + base + c] * silu(z[p.z_off + base + c]);
        ss += h * h;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(p.gs) + p.eps);
    for (uint c = l; c < p.gs; c += WG) {
        float h = y[p.y_off + base + c] * silu(z[p.z_off + base + c]);
        o[p.o_off + base + c] = h * scale * LOAD_F(w, p.w_off + grp * p.gs + c, W_DT);
    }
}

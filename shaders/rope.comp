#version 450
#extension GL_GOOGLE_include_directive : enable
/* RoPE (RoFormer, Su et al. 2021, eq. 34) on x [T, H, hd] f32 with pos [T]
 * i32: pair i of mode's layout (NORMAL: (2i, 2i+1); NEOX: (i, i + n_rot/2))
 * is rotated by pos * freq_scale * theta^(-2i/n_rot); dims >= n_rot are
 * copied. One invocation per pair or copied element; in place allowed
 * (each invocation reads then writes its own elements). */
#include "common.glsl"
#include "rope.glsl"

layout(constant_id = 1) const uint NEOX = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer Tab { uint tab[]; }; /* [n_rot/2] (lo, hi) */
layout(binding = 3) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n_rows, n_heads, hd, n_rot, x_off, pos_off, tab_off, o_off;
} p;

void main()
{
    uint half_ = p.n_rot / 2u;
    uint units = half_ + (p.hd - p.n_rot);
    uint g = global_id();
    if (g >= p.n_rows * units)
        return;
    uint row = g / units, u = g % units;
    uint base = row * p.hd;
    if (u >= half_) {
        uint e = p.n_rot + (u - half_);
        o[p.o_off + base + e] = x[p.x_off + base + e];
        return;
    }
    uint t = row / p.n_heads;
    vec2 cs = rope_cos_sin(pos[p.pos_off + t], tab[p.tab_off + 2u * u], tab[p.tab_off + 2u * u + 1u]);
    uint i0 = NEOX != 0u ? u : 2u * u;
    uint i1 = NEOX != 0u ? u + half_ : 2u * u + 1u;
    float x0 = x[p.x_off + base + i0], x1 = x[p.x_off + base + i1];
    o[p.o_off + base + i0] = x0 * cs.x - x1 * cs.y;
    o[p.o_off + base + i1] = x0 * cs.y + x1 * cs.x;
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* K-shift: the key of every KV head in slot shift_slot[j] of the K pool
 * [n_slots][n_kv_heads][hd] (dtype POOL_DT) is rotated by shift_delta[j]
 * positions (RoPE rotations compose: R(p + d) = R(d) R(p)), in f32, and
 * stored back in the pool dtype (RNE). One invocation per rotated pair;
 * dims >= n_rot are untouched. A slot outside the pool is skipped. */
#include "common.glsl"
#include "rope.glsl"

layout(constant_id = 1) const uint NEOX = 0;
layout(constant_id = 2) const uint POOL_DT = 0;

layout(binding = 0) readonly buffer Idx { int idx[]; };
layout(binding = 1) readonly buffer Tab { uint tab[]; };
layout(binding = 2) buffer K { uint kp[]; };

layout(push_constant) uniform P {
    uint n, n_kv, hd, n_rot, n_slots, slot_off, delta_off, tab_off;
} p;

void main()
{
    uint half_ = p.n_rot / 2u;
    uint g = global_id();
    if (g >= p.n * p.n_kv * half_)
        return;
    uint u = g % half_, jh = g / half_;
    uint j = jh / p.n_kv, h = jh % p.n_kv;
    int slot = idx[p.slot_off + j];
    if (slot < 0 || uint(slot) >= p.n_slots)
        return;
    vec2 cs = rope_cos_sin(idx[p.delta_off + j], tab[p.tab_off + 2u * u], tab[p.tab_off + 2u * u + 1u]);
    uint base = (uint(slot) * p.n_kv + h) * p.hd;
    uint i0 = base + (NEOX != 0u ? u : 2u * u);
    uint i1 = base + (NEOX != 0u ? u + half_ : 2u * u + 1u);
    float x0 = LOAD_F(kp, i0, POOL_DT), x1 = LOAD_F(kp, i1, POOL_DT);
    float y0 = x0 * cs.x - x1 * cs.y;
    float y1 = x0 * cs.y + x1 * cs.x;
    STORE_F(kp, i0, POOL_DT, y0);
    STORE_F(kp, i1, POOL_DT, y1);
}

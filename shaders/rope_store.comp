#version 450
#extension GL_GOOGLE_include_directive : enable
/* The one-token attention prologue in one dispatch: RoPE (RoFormer, Su et
 * al. 2021, eq. 34) of q [n_q_rows, hd] and k [n_k_rows, hd] f32 in place,
 * then the store of the rotated k and of v [n_k_rows, hd] into the K and V
 * pools [n_slots][row] of dtype POOL_DT (row = n_k_rows * hd), as rope.comp
 * then kv_store.comp would do them (vk_ops_rope.c, vk_rope_store_take).
 * Each value is formed by the same expression as in rope.comp and converted
 * as kv_store.comp does, so results are bit for bit those of the three
 * dispatches.
 *
 * Workgroup w < n_q_rows rotates q head w (one invocation per pair, read
 * then written by that invocation, as rope.comp). Workgroup n_q_rows + h
 * rotates k head h into shared memory, waits, writes it back to k, then
 * stores it and v head h to store entry j's slot for every j whose token
 * is 0 (the only token; an index outside the range is skipped, as in
 * kv_store.comp). hd is even and at most SMAX (the host checks). */
#include "common.glsl"
#include "rope.glsl"

layout(constant_id = 1) const uint NEOX = 0;
layout(constant_id = 2) const uint POOL_DT = 0;

#define SMAX 512u

layout(binding = 0) buffer Q { float q[]; };
layout(binding = 1) buffer K { float k[]; };
layout(binding = 2) readonly buffer V { float vin[]; };
layout(binding = 3) readonly buffer Pos { int pos[]; };
layout(binding = 4) readonly buffer Tab { uint tab[]; }; /* [n_rot/2] (lo, hi) */
layout(binding = 5) readonly buffer Idx { int idx[]; };
layout(binding = 6) buffer Kp { uint kp[]; };
layout(binding = 7) buffer Vp { uint vp[]; };

layout(push_constant) uniform P {
    uint n_q_rows, n_k_rows, hd, n_rot, q_off, k_off, v_off, pos_off;
    uint n, n_slots, tok_off, slot_off;
} p;

shared float sk[SMAX];

void main()
{
    uint w = group_id();
    if (w >= p.n_q_rows + p.n_k_rows)
        return;
    uint l = gl_LocalInvocationID.x;
    uint half_ = p.n_rot / 2u;
    uint units = half_ + (p.hd - p.n_rot);
    int ps = pos[p.pos_off];
    if (w < p.n_q_rows) {
        uint base = p.q_off + w * p.hd;
        for (uint u = l; u < units; u += WG) {
            if (u >= half_) /* copied dims: in place, nothing to do */
                continue;
            vec2 cs = rope_cos_sin(ps, tab[2u * u], tab[2u * u + 1u]);
            uint i0 = NEOX != 0u ? u : 2u * u;
            uint i1 = NEOX != 0u ? u + half_ : 2u * u + 1u;
            float x0 = q[base + i0], x1 = q[base + i1];
            q[base + i0] = x0 * cs.x - x1 * cs.y;
            q[base + i1] = x0 * cs.y + x1 * cs.x;
        }
        return;
    }
    uint h = w - p.n_q_rows;
    uint base = p.k_off + h * p.hd;
    for (uint u = l; u < units; u += WG) {
        if (u >= half_) {
            uint e = p.n_rot + (u - half_);
            sk[e] = k[base + e];
            continue;
        }
        vec2 cs = rope_cos_sin(ps, tab[2u * u], tab[2u * u + 1u]);
        uint i0 = NEOX != 0u ? u : 2u * u;
        uint i1 = NEOX != 0u ? u + half_ : 2u * u + 1u;
        float x0 = k[base + i0], x1 = k[base + i1];
        sk[i0] = x0 * cs.x - x1 * cs.y;
        sk[i1] = x0 * cs.y + x1 * cs.x;
    }
    barrier(); /* every read of k head h is done before it is written */
    for (uint e = l; e < p.hd; e += WG)
        k[base + e] = sk[e];
    uint row = p.n_k_rows * p.hd, vb = p.v_off + h * p.hd;
    for (uint j = 0u; j < p.n; j++) {
        int t = idx[p.tok_off + j], s = idx[p.slot_off + j];
        if (t != 0 || s < 0 || uint(s) >= p.n_slots)
            continue;
        uint dst = uint(s) * row + h * p.hd;
        if (POOL_DT == DT_F32) {
            for (uint e = l; e < p.hd; e += WG) {
                kp[dst + e] = floatBitsToUint(sk[e]);
                vp[dst + e] = floatBitsToUint(vin[vb + e]);
            }
        } else {
            for (uint e = 2u * l; e < p.hd; e += 2u * WG) {
                uint wd = (dst + e) >> 1;
                kp[wd] = f32_to_half(sk[e], POOL_DT) | (f32_to_half(sk[e + 1u], POOL_DT) << 16);
                vp[wd] = f32_to_half(vin[vb + e], POOL_DT) |
                         (f32_to_half(vin[vb + e + 1u], POOL_DT) << 16);
            }
        }
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Stores k, v [T, row] f32 (row = n_kv_heads * head_dim) into the K and V
 * pools [n_slots][row] of dtype POOL_DT: token store_tok[j] goes to slot
 * store_slot[j] (RNE conversion). One invocation per element, or per
 * element pair (one pool word) for 16-bit pools with an even row; odd
 * 16-bit rows share words between slots and use atomic half stores. An
 * index outside [0, T) or [0, n_slots) is skipped (never read/written). */
#include "common.glsl"

layout(constant_id = 1) const uint POOL_DT = 0;

layout(binding = 0) readonly buffer Kin { float kin[]; };
layout(binding = 1) readonly buffer Vin { float vin[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) buffer Kp { uint kp[]; };
layout(binding = 4) buffer Vp { uint vp[]; };

layout(push_constant) uniform P {
    uint n, row, n_tok, n_slots, k_off, v_off, tok_off, slot_off, pairs;
} p;

void main()
{
    uint per = p.pairs != 0u ? p.row / 2u : p.row;
    uint g = global_id();
    if (g >= p.n * per)
        return;
    uint j = g / per, u = g % per;
    int t = idx[p.tok_off + j], s = idx[p.slot_off + j];
    if (t < 0 || uint(t) >= p.n_tok || s < 0 || uint(s) >= p.n_slots)
        return;
    uint src = uint(t) * p.row, dst = uint(s) * p.row;
    if (p.pairs != 0u) {
        uint e = 2u * u;
        uint w = (dst + e) >> 1;
        kp[w] = f32_to_half(kin[p.k_off + src + e], POOL_DT) |
                (f32_to_half(kin[p.k_off + src + e + 1u], POOL_DT) << 16);
        vp[w] = f32_to_half(vin[p.v_off + src + e], POOL_DT) |
                (f32_to_half(vin[p.v_off + src + e + 1u], POOL_DT) << 16);
        return;
    }
    float kv = kin[p.k_off + src + u], vv = vin[p.v_off + src + u];
    STORE_F(kp, dst + u, POOL_DT, kv);
    STORE_F(vp, dst + u, POOL_DT, vv);
}

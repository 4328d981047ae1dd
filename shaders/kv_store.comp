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
/* Pools larger than one allocation are bound as up to 4 chunks each: word
 * w is word w & (2^CSH - 1) of chunk w >> CSH (docs/vulkan.md, "Large
 * buffers"). CSH = 31: one chunk. */
layout(constant_id = 2) const uint CSH = 31;
layout(binding = 5) buffer Kp1 { uint kp1[]; };
layout(binding = 6) buffer Kp2 { uint kp2[]; };
layout(binding = 7) buffer Kp3 { uint kp3[]; };
layout(binding = 8) buffer Vp1 { uint vp1[]; };
layout(binding = 9) buffer Vp2 { uint vp2[]; };
layout(binding = 10) buffer Vp3 { uint vp3[]; };

/* Word w of pool P. */
#define POOL_WORD(P, w, val)                                                          \
    {                                                                                 \
        uint pw_ = (w), pv_ = (val);                                                  \
        if (CSH >= 31u) {                                                             \
            P[pw_] = pv_;                                                             \
        } else {                                                                      \
            uint c_ = pw_ >> CSH, l_ = pw_ & ((1u << CSH) - 1u);                      \
            if (c_ == 0u)                                                             \
                P[l_] = pv_;                                                          \
            else if (c_ == 1u)                                                        \
                P##1[l_] = pv_;                                                       \
            else if (c_ == 2u)                                                        \
                P##2[l_] = pv_;                                                       \
            else                                                                      \
                P##3[l_] = pv_;                                                       \
        }                                                                             \
    }

/* Element e of pool P (STORE_F within the element's chunk). */
#define POOL_STORE(P, e, x)                                                           \
    {                                                                                 \
        uint pe_ = (e);                                                               \
        float px_ = (x);                                                              \
        if (CSH >= 31u) {                                                             \
            STORE_F(P, pe_, POOL_DT, px_)                                             \
        } else {                                                                      \
            uint sh_ = POOL_DT == DT_F32 ? CSH : CSH + 1u;                            \
            uint c_ = pe_ >> sh_, l_ = pe_ - (c_ << sh_);                             \
            if (c_ == 0u)                                                             \
                STORE_F(P, l_, POOL_DT, px_)                                          \
            else if (c_ == 1u)                                                        \
                STORE_F(P##1, l_, POOL_DT, px_)                                       \
            else if (c_ == 2u)                                                        \
                STORE_F(P##2, l_, POOL_DT, px_)                                       \
            else                                                                      \
                STORE_F(P##3, l_, POOL_DT, px_)                                       \
        }                                                                             \
    }

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
        POOL_WORD(kp, w, f32_to_half(kin[p.k_off + src + e], POOL_DT) |
                             (f32_to_half(kin[p.k_off + src + e + 1u], POOL_DT) << 16))
        POOL_WORD(vp, w, f32_to_half(vin[p.v_off + src + e], POOL_DT) |
                             (f32_to_half(vin[p.v_off + src + e + 1u], POOL_DT) << 16))
        return;
    }
    float kv = kin[p.k_off + src + u], vv = vin[p.v_off + src + u];
    POOL_STORE(kp, dst + u, kv)
    POOL_STORE(vp, dst + u, vv)
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Stores k, v [T, n_kv_heads, head_dim] f32 into scaled 8-bit pools (int8,
 * fp8; one pool chunk): one workgroup per store entry; the lowest-indexed
 * entry of each page written does the page's work, so a page's scales have
 * one writer (docs/memory.md, "Quantized KV and state"): per KV head, amax
 * over the page's new rows; a page whose offset 0 is written starts over
 * at amax / code_max, otherwise the scale only grows and, when it does, the
 * page's other rows are requantized first. Bytes are written with word
 * atomics (neighbouring invocations share words). page_size <= 256. */
#include "common.glsl"
#include "quant.glsl"

layout(constant_id = 1) const uint POOL_DT = 4;

layout(binding = 0) readonly buffer Kin { float kin[]; };
layout(binding = 1) readonly buffer Vin { float vin[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) buffer Kp { uint kp[]; };
layout(binding = 4) buffer Vp { uint vp[]; };

layout(push_constant) uniform P {
    uint n, n_tok, ps, n_pages, nkv, hd, k_off, v_off, tok_off, slot_off, page_bytes, scale_off;
} p;

shared int run[256];
shared uint mine[256];
shared float red[128];
shared uint s_n, s_fresh, s_earlier;

#define PUT_BYTE(P, b, c)                                                             \
    {                                                                                 \
        uint b_ = (b), sh_ = (b_ & 3u) * 8u;                                          \
        atomicAnd(P[b_ >> 2], ~(0xffu << sh_));                                       \
        atomicOr(P[b_ >> 2], (c) << sh_);                                             \
    }
#define GET_BYTE(P, b) ((P[(b) >> 2] >> (((b) & 3u) * 8u)) & 0xffu)

float block_max(float v)
{
    uint lid = gl_LocalInvocationID.x;
    barrier();
    red[lid] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s)
            red[lid] = max(red[lid], red[lid + s]);
        barrier();
    }
    return red[0];
}

void main()
{
    uint j = group_id(), lid = gl_LocalInvocationID.x;
    if (j >= p.n)
        return;
    int sj = idx[p.slot_off + j];
    if (sj < 0 || uint(sj) >= p.ps * p.n_pages)
        return;
    uint page = uint(sj) / p.ps;
    if (lid == 0u)
        s_earlier = 0u;
    barrier();
    for (uint i = lid; i < j; i += WG) {
        int si = idx[p.slot_off + i];
        if (si >= 0 && uint(si) / p.ps == page)
            atomicOr(s_earlier, 1u);
    }
    barrier();
    if (s_earlier != 0u)
        return;
    for (uint o = lid; o < p.ps; o += WG)
        mine[o] = 0u;
    barrier();
    if (lid == 0u) {
        uint m = 0u, fresh = 0u;
        for (uint i = j; i < p.n && m < p.ps; i++) {
            int si = idx[p.slot_off + i], ti = idx[p.tok_off + i];
            if (si >= 0 && uint(si) / p.ps == page && ti >= 0 && uint(ti) < p.n_tok) {
                run[m++] = int(i);
                mine[uint(si) % p.ps] = 1u;
                if (uint(si) % p.ps == 0u)
                    fresh = 1u;
            }
        }
        s_n = m;
        s_fresh = fresh;
    }
    barrier();
    uint m = s_n;
    bool fresh = s_fresh != 0u;
    float cmax = POOL_DT == QDT_I8 ? 127.0 : 448.0;
    uint base = page * p.page_bytes;
    for (uint kvi = 0u; kvi < 2u; kvi++) {
        for (uint h = 0u; h < p.nkv; h++) {
            float a = 0.0;
            for (uint e = lid; e < m * p.hd; e += WG) {
                int i = run[e / p.hd];
                uint t = uint(idx[p.tok_off + i]);
                uint at = (t * p.nkv + h) * p.hd + e % p.hd;
                a = max(a, abs(kvi == 0u ? kin[p.k_off + at] : vin[p.v_off + at]));
            }
            a = block_max(a);
            uint sw = (base + p.scale_off) / 4u + h;
            float s_old = uintBitsToFloat(kvi == 0u ? kp[sw] : vp[sw]);
            float s_new = a / cmax;
            if (!fresh && s_old >= s_new) {
                s_new = s_old;
            } else if (!fresh) {
                for (uint e = lid; e < p.ps * p.hd; e += WG) {
                    uint o = e / p.hd;
                    if (mine[o] != 0u)
                        continue;
                    uint b = base + (o * p.nkv + h) * p.hd + e % p.hd;
                    if (kvi == 0u) {
                        uint c = q_code(q_value(GET_BYTE(kp, b), POOL_DT) * s_old, s_new, POOL_DT);
                        PUT_BYTE(kp, b, c)
                    } else {
                        uint c = q_code(q_value(GET_BYTE(vp, b), POOL_DT) * s_old, s_new, POOL_DT);
                        PUT_BYTE(vp, b, c)
                    }
                }
            }
            for (uint e = lid; e < m * p.hd; e += WG) {
                int i = run[e / p.hd];
                uint t = uint(idx[p.tok_off + i]), sl = uint(idx[p.slot_off + i]);
                uint at = (t * p.nkv + h) * p.hd + e % p.hd;
                uint b = base + ((sl % p.ps) * p.nkv + h) * p.hd + e % p.hd;
                if (kvi == 0u) {
                    PUT_BYTE(kp, b, q_code(kin[p.k_off + at], s_new, POOL_DT))
                } else {
                    PUT_BYTE(vp, b, q_code(vin[p.v_off + at], s_new, POOL_DT))
                }
            }
            barrier();
            if (lid == 0u) {
                if (kvi == 0u)
                    kp[sw] = floatBitsToUint(s_new);
                else
                    vp[sw] = floatBitsToUint(s_new);
            }
            barrier();
        }
    }
}

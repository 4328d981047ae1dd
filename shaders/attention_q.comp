#version 450
#extension GL_GOOGLE_include_directive : enable
/* Paged attention over scaled 8-bit pools (int8, fp8; one pool chunk), any
 * number of query tokens: one workgroup per (query token, query head); the
 * invocations split head_dim (up to 4 elements each), reduce each key's dot
 * product in shared memory, and keep the FlashAttention-2 online softmax
 * (Dao 2023, Alg. 1) over the visible keys [lo, tok_kv_len) of the token
 * (PagedAttention addressing, Kwon et al. 2023). A plain reference-speed
 * shader: correctness on every Vulkan device, not speed. */
#include "common.glsl"
#include "quant.glsl"

layout(constant_id = 1) const uint POOL_DT = 4;

layout(binding = 0) readonly buffer Q { float qv[]; };
layout(binding = 1) writeonly buffer O { float ov[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) readonly buffer Kp { uint kp[]; };
layout(binding = 4) readonly buffer Vp { uint vp[]; };

layout(push_constant) uniform P {
    uint n_tok, n_heads, nkv, hd, max_pages, ps, n_pages, n_streams;
    int window;
    float scale, softcap;
    uint q_off, o_off, pt_off, sl_off, kl_off, ts_off, po_off, page_bytes, scale_off;
} p;

shared float red[64];

#define GET_BYTE(P, b) ((P[(b) >> 2] >> (((b) & 3u) * 8u)) & 0xffu)

float block_sum(float v)
{
    uint lid = gl_LocalInvocationID.x;
    red[lid] = v;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (lid < s)
            red[lid] += red[lid + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main()
{
    uint item = group_id(), lid = gl_LocalInvocationID.x;
    if (item >= p.n_tok * p.n_heads)
        return;
    uint tok = item / p.n_heads, h = item % p.n_heads;
    uint g = h / (p.n_heads / p.nkv);
    int s = idx[p.ts_off + tok];
    int lo = 0, hi = 0;
    if (s >= 0 && uint(s) < p.n_streams) {
        int len = idx[p.kl_off + tok], sl = idx[p.sl_off + uint(s)];
        if (len >= 0 && sl >= 0 && len <= sl &&
            (uint(sl) + p.ps - 1u) / p.ps <= p.max_pages) {
            hi = len;
            lo = p.window > 0 && len > p.window ? len - p.window : 0;
        }
    }
    uint row = p.po_off != 0xffffffffu && s >= 0 ? uint(idx[p.po_off + uint(s)])
                                                 : uint(max(s, 0)) * p.max_pages;
    float q[4], acc[4];
    for (uint c = 0u; c < 4u; c++) {
        uint e = lid + 64u * c;
        q[c] = e < p.hd ? qv[p.q_off + (tok * p.n_heads + h) * p.hd + e] : 0.0;
        acc[c] = 0.0;
    }
    float m = uintBitsToFloat(0xff800000u), l = 0.0;
    for (int j = lo; j < hi; j++) {
        int page = idx[p.pt_off + row + uint(j) / p.ps];
        if (page < 0 || uint(page) >= p.n_pages)
            continue;
        uint base = uint(page) * p.page_bytes;
        uint rb = base + ((uint(j) % p.ps) * p.nkv + g) * p.hd;
        float ks = uintBitsToFloat(kp[(base + p.scale_off) / 4u + g]);
        float vs = uintBitsToFloat(vp[(base + p.scale_off) / 4u + g]);
        float d = 0.0;
        for (uint c = 0u; c < 4u; c++) {
            uint e = lid + 64u * c;
            if (e < p.hd)
                d += q[c] * (q_value(GET_BYTE(kp, rb + e), POOL_DT) * ks);
        }
        d = block_sum(d) * p.scale;
        if (p.softcap > 0.0)
            d = p.softcap * tanh(d / p.softcap);
        float mn = max(m, d);
        float corr = exp(m - mn), pr = exp(d - mn);
        l = l * corr + pr;
        for (uint c = 0u; c < 4u; c++) {
            uint e = lid + 64u * c;
            float vv = e < p.hd ? q_value(GET_BYTE(vp, rb + e), POOL_DT) * vs : 0.0;
            acc[c] = acc[c] * corr + pr * vv;
        }
        m = mn;
    }
    for (uint c = 0u; c < 4u; c++) {
        uint e = lid + 64u * c;
        if (e < p.hd)
            ov[p.o_off + (tok * p.n_heads + h) * p.hd + e] = l > 0.0 ? acc[c] / l : 0.0;
    }
}

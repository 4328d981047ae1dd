#version 450
#extension GL_GOOGLE_include_directive : enable
/* Merges the key splits of paged attention (flash-decoding): for each
 * query token i and head h, split s left unnormalized accumulators
 * acc_s[D], its running max m_s and sum l_s (FlashAttention-2's online
 * softmax state) in part[(i, h, s)][D + 2]. With M = max_s m_s:
 *   out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,
 * zeros when no split saw a key. One workgroup per (i, h). */
#include "common.glsl"

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n_items, d, n_split, o_off;
} p;

void main()
{
    uint item = group_id();
    if (item >= p.n_items)
        return;
    uint stride = p.d + 2u;
    uint base = item * p.n_split * stride;
    float m = uintBitsToFloat(0xff800000u);
    for (uint s = 0; s < p.n_split; s++)
        m = max(m, part[base + s * stride + p.d]);
    float l = 0.0;
    if (!isinf(m))
        for (uint s = 0; s < p.n_split; s++) {
            float ms = part[base + s * stride + p.d];
            if (!isinf(ms))
                l += exp(ms - m) * part[base + s * stride + p.d + 1u];
        }
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (uint d = gl_LocalInvocationID.x; d < p.d; d += WG) {
        float acc = 0.0;
        if (l > 0.0)
            for (uint s = 0; s < p.n_split; s++) {
                float ms = part[base + s * stride + p.d];
                if (!isinf(ms))
                    acc += exp(ms - m) * part[base + s * stride + d];
            }
        o[p.o_off + item * p.d + d] = acc * inv;
    }
}

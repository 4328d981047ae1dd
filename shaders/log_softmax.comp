#version 450
#extension GL_GOOGLE_include_directive : enable
/* Row-wise log-softmax over the last dimension (torch.log_softmax):
 * out = x - (max + log(sum(exp(x - max)))). One workgroup per row; in
 * place allowed (each invocation rewrites only elements it read). */
#include "common.glsl"

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint rows, cols, x_off, o_off;
} p;

void main()
{
    uint row = group_id();
    if (row >= p.rows)
        return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.cols;
    float m = uintBitsToFloat(0xff800000u); /* -inf */
    for (uint c = l; c < p.cols; c += WG)
        m = max(m, x[p.x_off + base + c]);
    m = wg_max(m);
    float s = 0.0;
    for (uint c = l; c < p.cols; c += WG)
        s += exp(x[p.x_off + base + c] - m);
    s = wg_sum(s);
    float lse = m + log(s);
    for (uint c = l; c < p.cols; c += WG)
        o[p.o_off + base + c] = x[p.x_off + base + c] - lse;
}

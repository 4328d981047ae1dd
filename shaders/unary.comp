#version 450
#extension GL_GOOGLE_include_directive : enable
/* Element-wise f32 activations: OP 0 scale (s * x), 1 silu, 2 relu2
 * (max(x, 0)^2, Primer), 3 softplus (torch threshold 20), 4 softcap
 * (s * tanh(x / s), Gemma). In place allowed. */
#include "common.glsl"

layout(constant_id = 1) const uint OP = 0;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n, a_off, o_off;
    float s;
} p;

void main()
{
    uint i = global_id();
    if (i >= p.n)
        return;
    float x = a[p.a_off + i];
    float r;
    if (OP == 0u) {
        r = x * p.s;
    } else if (OP == 1u) {
        r = silu(x);
    } else if (OP == 2u) {
        float m = x > 0.0 ? x : 0.0;
        r = m * m;
    } else if (OP == 3u) {
        r = softplus(x);
    } else {
        r = p.s * tanh_safe(x / p.s);
    }
    o[p.o_off + i] = r;
}

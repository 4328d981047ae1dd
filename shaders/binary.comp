#version 450
#extension GL_GOOGLE_include_directive : enable
/* Element-wise f32 out = a op b: OP 0 add, 1 mul, 2 swiglu (silu(a) * b),
 * 3 geglu (torch gelu(approximate="tanh")(a) * b).
 * b has a's shape (b_cols 0) or is one row of b_cols elements broadcast
 * over a's rows. out may be a or b: each invocation reads then writes its
 * own element. */
#include "common.glsl"

layout(constant_id = 1) const uint OP = 0;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n, b_cols, a_off, b_off, o_off;
} p;

void main()
{
    uint i = global_id();
    if (i >= p.n)
        return;
    float x = a[p.a_off + i];
    float y = b[p.b_off + (p.b_cols > 0u ? i % p.b_cols : i)];
    float r;
    if (OP == 0u)
        r = x + y;
    else if (OP == 1u)
        r = x * y;
    else if (OP == 2u)
        r = silu(x) * y;
    else
        /* 0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z)): no cancellation in the tail */
        r = x / (1.0 + exp(-1.5957691216 * (x + 0.044715 * x * x * x))) * y;
    o[p.o_off + i] = r;
}

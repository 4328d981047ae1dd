#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[r, c] = x[r, c] * sigmoid(gate[r, c / per]), per = C / Cg (Qwen3-Next's
 * output gates). In place allowed (out may be x). */
#include "common.glsl"

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer G { float gt[]; };
layout(binding = 2) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n, cols, cg, x_off, g_off, o_off;
} p;

void main()
{
    uint i = global_id();
    if (i >= p.n)
        return;
    uint r = i / p.cols, c = i % p.cols;
    float gv = gt[p.g_off + r * p.cg + c / (p.cols / p.cg)];
    o[p.o_off + i] = x[p.x_off + i] / (1.0 + exp(-gv));
}

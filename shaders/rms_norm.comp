#version 450
#extension GL_GOOGLE_include_directive : enable
/* RMS norm over the last dimension (Zhang & Sennrich 2019; HF
 * LlamaRMSNorm): out = x / sqrt(mean(x^2) + eps) * w. One workgroup per
 * row. W_DT is the weight dtype, DT_NONE for no weight. In place allowed:
 * each invocation reads and writes only its own (strided) elements. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint rows, cols, x_off, w_off, o_off;
    float eps;
} p;

void main()
{
    uint row = group_id();
    if (row >= p.rows)
        return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.cols;
    float ss = 0.0;
    for (uint c = l; c < p.cols; c += WG) {
        float v = x[p.x_off + base + c];
        ss += v * v;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(p.cols) + p.eps);
    for (uint c = l; c < p.cols; c += WG) {
        float v = x[p.x_off + base + c] * scale;
        if (W_DT != DT_NONE)
            v *= LOAD_F(w, p.w_off + c, W_DT);
        o[p.o_off + base + c] = v;
    }
}

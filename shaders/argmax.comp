#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[r] = index of the largest element of row r of x [rows, V] f32: the
 * first one on ties, NaN ignored, an all-NaN row gives 0. One workgroup
 * per row; each invocation scans a strided part of the row (ascending
 * indices, so strict > keeps the first), then a shared-memory tree keeps
 * (larger value, then smaller index). */
#include "common.glsl"

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer O { int o[]; };

layout(push_constant) uniform P {
    uint rows, cols, x_off, o_off;
} p;

shared float sv[WG];
shared int si[WG];

void main()
{
    uint row = group_id();
    if (row >= p.rows)
        return;
    uint l = gl_LocalInvocationID.x;
    float best = 0.0;
    int bi = -1;
    for (uint c = l; c < p.cols; c += WG) {
        float v = x[p.x_off + row * p.cols + c];
        if (!isnan(v) && (bi < 0 || v > best)) {
            best = v;
            bi = int(c);
        }
    }
    sv[l] = best;
    si[l] = bi;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s) {
            int j = si[l + s];
            float v = sv[l + s];
            int i = si[l];
            if (j >= 0 && (i < 0 || v > sv[l] || (v == sv[l] && j < i))) {
                sv[l] = v;
                si[l] = j;
            }
        }
        barrier();
    }
    if (l == 0u)
        o[p.o_off + row] = si[0] < 0 ? 0 : si[0];
}

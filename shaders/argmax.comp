#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
/* out[r] = index of the largest element of row r of x [rows, V] f32: the
 * first one on ties, NaN ignored, an all-NaN row gives 0. One workgroup
 * per row; each invocation scans a strided part of the row (ascending
 * indices, so strict > keeps the first), then a shared-memory tree keeps
 * (larger value, then smaller index). VEC 1 (the row 16-byte aligned and
 * V % 4 == 0, the host checks): the invocation reads vec4s through
 * binding 2 (the same bytes as binding 0), U of them issued before any
 * compare, so a batch-1 step's 128K-entry row is read with many loads in
 * flight instead of one scalar load per invocation and step. */
#include "common.glsl"

layout(constant_id = 1) const uint VEC = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer O { int o[]; };
layout(binding = 2) readonly buffer XV { vec4 xv[]; };

layout(push_constant) uniform P {
    uint rows, cols, x_off, o_off;
} p;

const uint U = 4u; /* vec4 loads in flight per invocation */

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
    if (VEC != 0u) {
        uint base = (p.x_off + row * p.cols) / 4u, nv = p.cols / 4u;
        for (uint c = l; c < nv; c += WG * U) {
            vec4 q[U];
            [[unroll]] for (uint u = 0u; u < U; u++) {
                uint cc = c + u * WG;
                q[u] = cc < nv ? xv[base + cc] : vec4(uintBitsToFloat(0x7fc00000u));
            }
            [[unroll]] for (uint u = 0u; u < U; u++)
                [[unroll]] for (uint i = 0u; i < 4u; i++) {
                    float v = q[u][i];
                    if (!isnan(v) && (bi < 0 || v > best)) {
                        best = v;
                        bi = int(4u * (c + u * WG) + i);
                    }
                }
        }
    } else {
        for (uint c = l; c < p.cols; c += WG) {
            float v = x[p.x_off + row * p.cols + c];
            if (!isnan(v) && (bi < 0 || v > best)) {
                best = v;
                bi = int(c);
            }
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

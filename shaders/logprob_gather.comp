#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
/* logprob_gather (the contract is in <llmem/ops.h>): out[r] =
 * log_softmax(x[r])[ids[r]] for rows of logits x [rows, V] f32, the same
 * values as sample.comp's MODE 2 (NaN entries ignored; a row whose largest
 * entry is -inf or +inf has that as its log-sum-exp; an id outside the row
 * gives NaN) in one pass instead of two: each invocation keeps a running
 * maximum m and sum s of exp(x - m) over a strided part of the row,
 * rescaling s when m grows (the online softmax normaliser of Milakov &
 * Gimelshein 2018, "Online normalizer calculation for softmax"), and the
 * workgroup merges the (m, s) pairs in a fixed tree order. One workgroup
 * per row, WG up to 1024 invocations; VEC 1 (the row 16-byte aligned and V
 * % 4 == 0, the host checks) reads vec4s through binding 3, U of them
 * issued before any exp, so a batch-1 step's 128K-entry row is not read by
 * one load per invocation at a time (sample.comp's 128 invocations: ~99 us
 * a row on the H200). */
#include "common.glsl"

layout(constant_id = 1) const uint VEC = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer I { int ids[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(binding = 3) readonly buffer XV { vec4 xv[]; };

layout(push_constant) uniform P {
    uint rows, V, x_off, i_off, o_off;
} p;

const uint U = 4u; /* vec4 loads in flight per invocation */

shared float sm[WG];
shared float ss[WG];

#define NEG_INF uintBitsToFloat(0xff800000u)

/* Adds entry v to the running (m, s). */
void add(inout float m, inout float s, float v)
{
    if (isnan(v) || v == NEG_INF)
        return; /* ignored; -inf adds exp(-inf) = 0 */
    if (v > m) {
        s = s * exp(m - v) + 1.0; /* exp(-inf) = 0 on the first entry */
        m = v;
    } else {
        s += exp(v - m);
    }
}

/* (m, s) of two parts of the row; s is meaningless where m is infinite. */
void merge(inout float m, inout float s, float m2, float s2)
{
    float mm = max(m, m2);
    s = isinf(mm) ? 0.0 : s * exp(m - mm) + s2 * exp(m2 - mm);
    m = mm;
}

void main()
{
    uint row = group_id();
    if (row >= p.rows)
        return;
    uint l = gl_LocalInvocationID.x;
    uint base = p.x_off + row * p.V;
    float m = NEG_INF, s = 0.0;
    if (VEC != 0u) {
        uint vb = base / 4u, nv = p.V / 4u;
        for (uint c = l; c < nv; c += WG * U) {
            vec4 q[U];
            [[unroll]] for (uint u = 0u; u < U; u++) {
                uint cc = c + u * WG;
                q[u] = cc < nv ? xv[vb + cc] : vec4(NEG_INF);
            }
            [[unroll]] for (uint u = 0u; u < U; u++)
                [[unroll]] for (uint i = 0u; i < 4u; i++)
                    add(m, s, q[u][i]);
        }
    } else {
        for (uint c = l; c < p.V; c += WG)
            add(m, s, x[base + c]);
    }
    sm[l] = m;
    ss[l] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (l < h) {
            float a = sm[l], b = ss[l];
            merge(a, b, sm[l + h], ss[l + h]);
            sm[l] = a;
            ss[l] = b;
        }
        barrier();
    }
    if (l == 0u) {
        float mm = sm[0];
        float lse = isinf(mm) ? mm : mm + log(ss[0]);
        int id = ids[p.i_off + row];
        float r = uintBitsToFloat(0x7fc00000u); /* NaN: an id outside the row is not read */
        if (id >= 0 && uint(id) < p.V)
            r = x[base + uint(id)] - lse;
        o[p.o_off + row] = r;
    }
}

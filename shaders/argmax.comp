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
 * flight instead of one scalar load per invocation and step.
 *
 * SPLIT > 1 (one row, VEC, the host checks): SPLIT workgroups each scan one
 * contiguous part of the row's vec4s and reduce it as above; each writes
 * its (value, index) to binding 3 (coherent), then adds one to the
 * arrival counter there (word 0); the workgroup that arrives last reduces
 * the SPLIT pairs with the same rule, writes the id and puts the counter
 * back to zero for the next dispatch (the pattern of matmul_cm.comp's
 * RAW 2). The rule (larger value, then smaller index, NaN never kept) is
 * associative and commutative, so the id is the one of a single
 * workgroup whatever the arrival order, ties included. */
#include "common.glsl"

layout(constant_id = 1) const uint VEC = 0;
layout(constant_id = 2) const uint SPLIT = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer O { int o[]; };
layout(binding = 2) readonly buffer XV { vec4 xv[]; };
/* SPLIT: [0] the arrival counter (zero between dispatches), [4 + 2g] the
 * value bits and [5 + 2g] the index of workgroup g */
layout(binding = 3) coherent buffer Part { uint part[]; };

layout(push_constant) uniform P {
    uint rows, cols, x_off, o_off;
} p;

const uint U = 4u; /* vec4 loads in flight per invocation */

shared float sv[WG];
shared int si[WG];
shared uint last_sh;

/* Keeps in (sv[l], si[l]) the better of it and (sv[l + s], si[l + s]) for
 * s = WG/2 .. 1: (sv[0], si[0]) the workgroup's best. */
void reduce_shared(uint l)
{
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
}

void main()
{
    uint g = group_id();
    uint row = SPLIT > 1u ? 0u : g;
    if (row >= p.rows || (SPLIT > 1u && g >= SPLIT))
        return;
    uint l = gl_LocalInvocationID.x;
    float best = 0.0;
    int bi = -1;
    if (VEC != 0u) {
        uint base = (p.x_off + row * p.cols) / 4u, nv = p.cols / 4u;
        uint c0 = 0u, c1 = nv;
        if (SPLIT > 1u) { /* this workgroup's part */
            uint per = (nv + SPLIT - 1u) / SPLIT;
            c0 = min(g * per, nv);
            c1 = min(c0 + per, nv);
        }
        for (uint c = c0 + l; c < c1; c += WG * U) {
            vec4 q[U];
            [[unroll]] for (uint u = 0u; u < U; u++) {
                uint cc = c + u * WG;
                q[u] = cc < c1 ? xv[base + cc] : vec4(uintBitsToFloat(0x7fc00000u));
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
    reduce_shared(l);
    if (SPLIT > 1u) {
        if (l == 0u) {
            part[4u + 2u * g] = floatBitsToUint(sv[0]);
            part[5u + 2u * g] = uint(si[0]);
        }
        memoryBarrierBuffer();
        barrier();
        if (l == 0u) {
            uint before = atomicAdd(part[0], 1u);
            if (before == SPLIT - 1u)
                atomicExchange(part[0], 0u);
            last_sh = before == SPLIT - 1u ? 1u : 0u;
        }
        barrier();
        if (last_sh == 0u)
            return;
        memoryBarrierBuffer();
        best = 0.0;
        bi = -1;
        for (uint j = l; j < SPLIT; j += WG) { /* ascending parts: strict > keeps the first */
            float v = uintBitsToFloat(part[4u + 2u * j]);
            int i = int(part[5u + 2u * j]);
            if (i >= 0 && (bi < 0 || v > best)) {
                best = v;
                bi = i;
            }
        }
        sv[l] = best;
        si[l] = bi;
        reduce_shared(l);
    }
    if (l == 0u)
        o[p.o_off + row] = si[0] < 0 ? 0 : si[0];
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* snap[s][e] = state[src_slot[s]][e] as f32 (zeros for -1 or a slot
 * outside [0, n_slots)). Runs before ssm_conv/ssm_scan when a stream's
 * source slot is written by another stream in the same ubatch
 * (copy-on-write), so every source is read before anything is written. */
#include "common.glsl"

layout(constant_id = 1) const uint ST_DT = 0;

layout(binding = 0) readonly buffer Idx { int idx[]; };
layout(binding = 1) readonly buffer St { uint st[]; };
layout(binding = 2) writeonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, elems, n_slots, src_off;
} p;

void main()
{
    uint g = global_id();
    if (g >= p.n_seqs * p.elems)
        return;
    uint s = g / p.elems, e = g % p.elems;
    int src = idx[p.src_off + s];
    snap[g] = src >= 0 && uint(src) < p.n_slots ? LOAD_F(st, uint(src) * p.elems + e, ST_DT) : 0.0;
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* The reduction of matmul_cm.comp's raw split-K slices (its RAW 1):
 * out[r, c] = 2^e_r * sum over s < n_slices of part[s * slice_stride +
 * r * ldp + c], the slices added in order (deterministic) and the row's
 * scale applied once to the sum (exact: a power of two), for r < m,
 * c < n. part holds whole tiles (ldp >= n floats a row; vk_cm_raw_layout);
 * its padding is never read. f32; e_r as cm_split.comp wrote it. */
#include "common.glsl"

layout(binding = 0) readonly buffer S { float part[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(binding = 2) readonly buffer E { int ex[]; };

layout(push_constant) uniform P {
    uint m, n, ldp, n_slices, slice_stride;
    uint part_off, o_off, e_off; /* floats, floats, ints */
} p;

void main()
{
    uint i = global_id();
    if (i >= p.m * p.n)
        return;
    uint r = i / p.n, c = i % p.n, at = p.part_off + r * p.ldp + c;
    float sum = part[at];
    for (uint s = 1u; s < p.n_slices; s++)
        sum += part[at + s * p.slice_stride];
    o[p.o_off + i] = ldexp(sum, ex[p.e_off + r]);
}

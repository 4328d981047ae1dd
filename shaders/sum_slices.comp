#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[i] = sum over s < n_slices of part[s * count + i], added in slice
 * order (deterministic), for i < count: the reduction of a split-K matmul
 * (matmul_rt.comp). f32. */
#include "common.glsl"

layout(binding = 0) readonly buffer S { float part[]; };
layout(binding = 1) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint count, n_slices, part_off, o_off; /* offsets in floats */
} p;

void main()
{
    uint i = global_id();
    if (i >= p.count)
        return;
    float sum = part[p.part_off + i];
    for (uint s = 1u; s < p.n_slices; s++)
        sum += part[p.part_off + s * p.count + i];
    o[p.o_off + i] = sum;
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Batched device copies for llmem_buffer_copy_ranges: one dispatch copies
 * every range of a table between one pair of bindings, in 16-byte units.
 * Table entry r: (source offset, destination offset, length), in units from
 * the start of each binding. Workgroup g works on range g / SPLIT, on the
 * passes part, part + SPLIT, ... of it (part = g % SPLIT), each pass 4 * WG
 * units with all four loads issued before the stores, as memcpy.comp. The
 * host checked that no destination overlaps another range. */
#include "common.glsl"

layout(binding = 0) readonly buffer S { uvec4 s[]; };
layout(binding = 1) writeonly buffer D { uvec4 d[]; };
layout(binding = 2) readonly buffer T { uvec4 t[]; };

layout(push_constant) uniform P {
    uint n_ranges, split;
} p;

void main()
{
    uint g = group_id();
    uint r = g / p.split, part = g % p.split;
    if (r >= p.n_ranges)
        return;
    uvec4 e = t[r];
    uint step = p.split * WG * 4u;
    for (uint base = part * WG * 4u + gl_LocalInvocationID.x; base < e.z; base += step) {
        uvec4 v[4];
        for (uint u = 0; u < 4u; u++) {
            uint i = base + u * WG;
            v[u] = i < e.z ? s[e.x + i] : uvec4(0);
        }
        for (uint u = 0; u < 4u; u++) {
            uint i = base + u * WG;
            if (i < e.z)
                d[e.y + i] = v[u];
        }
    }
}

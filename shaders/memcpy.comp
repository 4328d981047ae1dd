#version 450
#extension GL_GOOGLE_include_directive : enable
/* Device copy and fill of raw bytes, for llmem_buffer_copy and
 * llmem_buffer_fill: one 16-byte vector (or, with UNIT_WORD, one 32-bit
 * word) per invocation. NVIDIA's vkCmdCopyBuffer moved about a fifth of
 * what its CUDA copy moves on the same GPU (docs/benchmarks.md); a compute
 * copy with 16-byte accesses runs near the memory's speed. Offsets are in
 * units from the start of each binding; MODE 1 fills dst with `pattern`. */
#include "common.glsl"

#ifdef UNIT_WORD
#define UNIT uint
#define SPLAT(x) (x)
#else
#define UNIT uvec4
#define SPLAT(x) uvec4(x)
#endif

layout(constant_id = 1) const uint MODE = 0;

layout(binding = 0) readonly buffer S { UNIT s[]; };
layout(binding = 1) writeonly buffer D { UNIT d[]; };

layout(push_constant) uniform P {
    uint n, s_off, d_off, pattern;
} p;

/* Each workgroup moves 4 * WG units: all four loads are issued before the
 * stores, so more bytes are in flight per invocation. */
void main()
{
    uint base = group_id() * WG * 4u + gl_LocalInvocationID.x;
    UNIT v[4];
    for (uint u = 0; u < 4u; u++) {
        uint i = base + u * WG;
        v[u] = MODE == 1u || i >= p.n ? SPLAT(p.pattern) : s[p.s_off + i];
    }
    for (uint u = 0; u < 4u; u++) {
        uint i = base + u * WG;
        if (i < p.n)
            d[p.d_off + i] = v[u];
    }
}

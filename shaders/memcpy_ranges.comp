#version 450
#extension GL_GOOGLE_include_directive : enable
/* Batched device copies for llmem_buffer_copy_ranges: one dispatch copies
 * pieces between up to 11 buffer bindings (1..11), in 16-byte units.
 * Table entry g (binding 0) is workgroup g's piece: (source offset,
 * destination offset, length <= 4096 units, source binding - 1 | (destination
 * binding - 1) << 8), offsets in units from the start of each binding. A
 * workgroup copies its piece in passes of 4 * WG units, all four loads
 * issued before the stores, as memcpy.comp. The core checked that no
 * destination overlaps another range's destination or any source, so one
 * binding may serve as source and destination at once. */
#include "common.glsl"

layout(binding = 0) readonly buffer T { uvec4 t[]; };
#define BUF(k) layout(binding = k) buffer B##k { uvec4 v[]; } b##k;
BUF(1) BUF(2) BUF(3) BUF(4) BUF(5) BUF(6) BUF(7) BUF(8) BUF(9) BUF(10) BUF(11)

layout(push_constant) uniform P {
    uint n_pieces;
} p;

/* b is the same for the whole workgroup: the switch does not diverge */
uvec4 ld(uint b, uint i)
{
    switch (b) {
    case 0u: return b1.v[i];
    case 1u: return b2.v[i];
    case 2u: return b3.v[i];
    case 3u: return b4.v[i];
    case 4u: return b5.v[i];
    case 5u: return b6.v[i];
    case 6u: return b7.v[i];
    case 7u: return b8.v[i];
    case 8u: return b9.v[i];
    case 9u: return b10.v[i];
    default: return b11.v[i];
    }
}

void st(uint b, uint i, uvec4 x)
{
    switch (b) {
    case 0u: b1.v[i] = x; break;
    case 1u: b2.v[i] = x; break;
    case 2u: b3.v[i] = x; break;
    case 3u: b4.v[i] = x; break;
    case 4u: b5.v[i] = x; break;
    case 5u: b6.v[i] = x; break;
    case 6u: b7.v[i] = x; break;
    case 7u: b8.v[i] = x; break;
    case 8u: b9.v[i] = x; break;
    case 9u: b10.v[i] = x; break;
    default: b11.v[i] = x; break;
    }
}

void main()
{
    uint g = group_id();
    if (g >= p.n_pieces)
        return;
    uvec4 e = t[g];
    uint sb = e.w & 0xffu, db = e.w >> 8;
    for (uint base = gl_LocalInvocationID.x; base < e.z; base += 4u * WG) {
        uvec4 x[4];
        for (uint u = 0; u < 4u; u++) {
            uint i = base + u * WG;
            x[u] = i < e.z ? ld(sb, e.x + i) : uvec4(0);
        }
        for (uint u = 0; u < 4u; u++) {
            uint i = base + u * WG;
            if (i < e.z)
                st(db, e.y + i, x[u]);
        }
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* out[i, c] = src[idx[i], c] as f32 (embedding lookup). One invocation per
 * output element. An index outside [0, R) is never read (the row is
 * written as zeros; the CPU backend reports LLMEM_E_INVALID instead). */
#include "common.glsl"

layout(constant_id = 1) const uint SRC_DT = 0;

layout(binding = 0) readonly buffer Src { uint src[]; };
layout(binding = 1) readonly buffer Idx { uint idx[]; };
layout(binding = 2) writeonly buffer Out { uint dst[]; };

layout(push_constant) uniform P {
    uint n, cols, rows, src_off, idx_off, out_off;
} p;

void main()
{
    uint g = global_id();
    if (g >= p.n * p.cols)
        return;
    uint i = g / p.cols, c = g % p.cols;
    int r = int(idx[p.idx_off + i]);
    uint bits = 0u;
    if (r >= 0 && uint(r) < p.rows) {
        uint e = p.src_off + uint(r) * p.cols + c;
        bits = SRC_DT == DT_F32 ? src[e] : floatBitsToUint(LOAD_F(src, e, SRC_DT));
    }
    dst[p.out_off + g] = bits;
}

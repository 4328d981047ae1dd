#version 450
#extension GL_GOOGLE_include_directive : enable
/* dst[r, c] = src[r, col0 + c] with dtype conversion (f32, f16, bf16;
 * round to nearest even). f32 destinations: one invocation per element.
 * 16-bit destinations: one invocation per destination word, so interior
 * words are written whole; the (at most two) words the tensor shares with
 * its neighbours are written half by half with atomics. Same dtypes copy
 * the bits. */
#include "common.glsl"

layout(constant_id = 1) const uint SRC_DT = 0;
layout(constant_id = 2) const uint DST_DT = 0;

layout(binding = 0) readonly buffer S { uint src[]; };
layout(binding = 1) buffer D { uint dst[]; };

layout(push_constant) uniform P {
    uint rows, cols, src_cols, col0, src_off, dst_off, n_units;
} p;

uint src_bits(uint e, uint dt)
{
    uint r = e / p.cols, c = e % p.cols;
    uint s = p.src_off + r * p.src_cols + p.col0 + c;
    if (SRC_DT == dt) {
        if (dt == DT_F32)
            return src[s];
        return (src[s >> 1] >> ((s & 1u) * 16u)) & 0xffffu;
    }
    float v = LOAD_F(src, s, SRC_DT);
    return dt == DT_F32 ? floatBitsToUint(v) : f32_to_half(v, dt);
}

void main()
{
    uint g = global_id();
    if (g >= p.n_units)
        return;
    uint n = p.rows * p.cols;
    if (DST_DT == DT_F32) {
        dst[p.dst_off + g] = src_bits(g, DT_F32);
        return;
    }
    /* word w holds absolute elements 2w, 2w + 1; element e of the tensor is
     * absolute element dst_off + e */
    uint w = (p.dst_off >> 1) + g;
    uint e0 = 2u * w;
    bool in0 = e0 >= p.dst_off && e0 - p.dst_off < n;
    bool in1 = e0 + 1u >= p.dst_off && e0 + 1u - p.dst_off < n;
    if (in0 && in1) {
        dst[w] = src_bits(e0 - p.dst_off, DST_DT) | (src_bits(e0 + 1u - p.dst_off, DST_DT) << 16);
    } else if (in0) {
        atomicAnd(dst[w], 0xffff0000u);
        atomicOr(dst[w], src_bits(e0 - p.dst_off, DST_DT));
    } else if (in1) {
        atomicAnd(dst[w], 0x0000ffffu);
        atomicOr(dst[w], src_bits(e0 + 1u - p.dst_off, DST_DT) << 16);
    }
}

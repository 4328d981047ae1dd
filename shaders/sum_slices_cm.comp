#version 450
#extension GL_GOOGLE_include_directive : enable
/* The reduction of matmul_cm.comp's raw split-K slices (its RAW 1):
 * out[r, c] = 2^e_r * sum over s < n_slices of part[s * slice_stride +
 * r * ldp + c], the slices added in order (deterministic) and the row's
 * scale applied once to the sum (exact: a power of two), for r < m,
 * c < n. part holds whole tiles (ldp >= n floats a row; vk_cm_raw_layout);
 * its padding is never read. f32; e_r as cm_split.comp wrote it.
 *
 * VEC4 = 1 (the host's choice when n, ldp, slice_stride and both offsets
 * are multiples of 4): one invocation per 4 consecutive columns, moved as
 * 16-byte vectors (one index division per 4 elements instead of one each);
 * the same additions in the same order, so the same bits.
 *
 * NDST = 1..3 (vk_sum.c, a held sum that took column copies of its
 * output; with VEC4 where every destination's first column, width and
 * offset are multiples of 4 too, so a run of 4 lies in one): each sum also
 * goes to the destinations whose
 * column range [col0_j, col0_j + cols_j) holds c, at dst_j[dst_off_j +
 * r * cols_j + c - col0_j] (llmem_op_copy's layout: the same f32 value
 * the copy would have read from o).
 *
 * ADDX = 1 (scalar path, NDST 0; vk_sum.c, a held sum whose output is the
 * residual r of an add + RMS norm that runs split over workgroups): the
 * sum is added into destination 0 instead of written to o (x[r, c] +=
 * sum: d0[d_0 + r * w_0 + c - c0_0], the add of rms_norm.comp's ADD 1 on
 * the same f32 values, so the same x; o, which the norm overwrites, is
 * not written). */
#include "common.glsl"

layout(constant_id = 1) const uint VEC4 = 0;
layout(constant_id = 2) const uint NDST = 0;
layout(constant_id = 3) const uint ADDX = 0;

layout(binding = 0) readonly buffer S { float part[]; };
layout(binding = 0) readonly buffer S4 { vec4 part4[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(binding = 1) writeonly buffer O4 { vec4 o4[]; };
layout(binding = 2) readonly buffer E { int ex[]; };
layout(binding = 3) buffer D0 { float d0[]; }; /* read too: ADDX */
layout(binding = 4) writeonly buffer D1 { float d1[]; };
layout(binding = 5) writeonly buffer D2 { float d2[]; };
layout(binding = 3) writeonly buffer D04 { vec4 d04[]; };
layout(binding = 4) writeonly buffer D14 { vec4 d14[]; };
layout(binding = 5) writeonly buffer D24 { vec4 d24[]; };

layout(push_constant) uniform P {
    uint m, n, ldp, n_slices, slice_stride;
    uint part_off, o_off, e_off; /* floats, floats, ints */
    /* NDST: the destinations, first column, columns, offset (floats) */
    uint c0_0, w_0, d_0, c0_1, w_1, d_1, c0_2, w_2, d_2;
} p;

void main()
{
    uint i = global_id();
    if (VEC4 != 0u) {
        uint n4 = p.n / 4u;
        if (i >= p.m * n4)
            return;
        uint r = i / n4, c4 = i % n4, at = (p.part_off + r * p.ldp) / 4u + c4;
        vec4 sum = part4[at];
        for (uint s = 1u; s < p.n_slices; s++)
            sum += part4[at + s * (p.slice_stride / 4u)];
        vec4 val = ldexp(sum, ivec4(ex[p.e_off + r]));
        o4[p.o_off / 4u + i] = val;
        uint c = 4u * c4;
        if (NDST > 0u && c - p.c0_0 < p.w_0)
            d04[(p.d_0 + r * p.w_0 + c - p.c0_0) / 4u] = val;
        if (NDST > 1u && c - p.c0_1 < p.w_1)
            d14[(p.d_1 + r * p.w_1 + c - p.c0_1) / 4u] = val;
        if (NDST > 2u && c - p.c0_2 < p.w_2)
            d24[(p.d_2 + r * p.w_2 + c - p.c0_2) / 4u] = val;
        return;
    }
    if (i >= p.m * p.n)
        return;
    uint r = i / p.n, c = i % p.n, at = p.part_off + r * p.ldp + c;
    float sum = part[at];
    for (uint s = 1u; s < p.n_slices; s++)
        sum += part[at + s * p.slice_stride];
    float val = ldexp(sum, ex[p.e_off + r]);
    if (ADDX != 0u) {
        uint at_x = p.d_0 + r * p.w_0 + c - p.c0_0;
        d0[at_x] = d0[at_x] + val;
        return;
    }
    o[p.o_off + i] = val;
    if (NDST > 0u && c - p.c0_0 < p.w_0)
        d0[p.d_0 + r * p.w_0 + c - p.c0_0] = val;
    if (NDST > 1u && c - p.c0_1 < p.w_1)
        d1[p.d_1 + r * p.w_1 + c - p.c0_1] = val;
    if (NDST > 2u && c - p.c0_2 < p.w_2)
        d2[p.d_2 + r * p.w_2 + c - p.c0_2] = val;
}

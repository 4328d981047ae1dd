#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
/* The activations of a cooperative-matrix matmul (matmul_cm.comp) as f16
 * terms, one workgroup per row r of a [M, K] (f32):
 *
 *   e_r  = the exponent that brings max_k |a[r, k]| into [2^14, 2^15)
 *          (frexp's exponent - 15, clamped to [-100, 100]; 0 for a row of
 *          zeros, infinities or NaN),
 *   x    = a[r, k] * 2^-e_r (exact: a power of two),
 *   hi   = f16(x), lo = f16(x - hi) (SPLIT 2; round to nearest even),
 *
 * so that a[r, k] = 2^e_r (hi + lo) up to lo's rounding: 2^-22 |x|, or
 * 2^-25 absolute where lo is an f16 subnormal, i.e. 2^-39 of the row's
 * largest element. Products of f16 terms are exact in the f32 accumulators
 * of the tensor cores, so this splitting is what makes the tensor-core
 * product as accurate as an f32 one (the hi + lo split of the activations
 * that llmem's CUDA precise mode does with bf16 terms, and, for the
 * per-row power-of-two scale, the usual loss-scaling of mixed-precision
 * training). The scale keeps x inside f16's range whatever the row's
 * magnitude. SPLIT 1 (fast mode) writes hi only: 11 significant bits.
 *
 * Output, one buffer: hi [M, K] f16 at word hi_off (packed pairs, element
 * k of row r in the low (k even) or high half of word (r K + k) / 2), lo
 * [M, K] f16 at word lo_off, e [M] i32 at word e_off. Needs K % 8 == 0.
 *
 * SWIGLU = 1 (matmul_swiglu's last step at decode rows, vk_presplit.c):
 * the row is silu(a[r, k]) * u[r, k] (a the gate, u the up product, f32,
 * binding 2), written to out (binding 3, vec4 offset o_off) as well as
 * split, with presplit.glsl's arithmetic (the same as above), the terms
 * of the values written.
 *
 * NS > 1 (vk_row_split; out, SWIGLU, clear of a and u): NS workgroups
 * share a row: each finds the whole row's largest element (so the same
 * e_r) and converts and writes only its part of the row's groups of 8
 * elements (row_part): the same bits as NS = 1.
 *
 * V4 > 0 (prefill rows, NS 1; vk_swiglu_split): each invocation keeps V4
 * runs of 4 consecutive elements of the row (run j = l + k WG) in
 * registers, so a and u are read once (not once for the largest element
 * and again for the terms); the same values, e and terms. */
#include "common.glsl"
#include "presplit.glsl"

layout(constant_id = 1) const uint SPLIT = 2;
layout(constant_id = 2) const uint SWIGLU = 0;
layout(constant_id = 3) const uint NS = 1; /* workgroups a row */
layout(constant_id = 4) const uint V4 = 0; /* runs of 4 an invocation in registers; 0: off */

layout(binding = 0) readonly buffer A { vec4 a[]; };
layout(binding = 1) buffer S { uint s[]; };
layout(binding = 1) buffer S2 { uvec2 s2[]; };
layout(binding = 2) readonly buffer U { vec4 u[]; };
layout(binding = 3) writeonly buffer O { vec4 ov[]; };

layout(push_constant) uniform P {
    uint m, k;
    uint a_off; /* vec4s */
    uint hi_off, lo_off, e_off; /* words of s */
    uint u_off, o_off; /* SWIGLU: vec4s */
} p;

/* element vec4 c of row r: a, or silu(a) * u */
vec4 load_x(uint row, uint c)
{
    vec4 x = a[p.a_off + row + c];
    if (SWIGLU != 0u) {
        vec4 y = u[p.u_off + row + c];
        x = vec4(silu(x.x) * y.x, silu(x.y) * y.y, silu(x.z) * y.z, silu(x.w) * y.w);
    }
    return x;
}

/* The V4 path (see above): row r, its vec4s from `row`. */
void main_v4(uint r, uint row)
{
    uint l = gl_LocalInvocationID.x, n4 = p.k / 4u;
    vec4 v[V4 > 0u ? V4 : 1u];
    float mx = 0.0;
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        v[k] = vec4(0.0);
        if (j < n4) {
            v[k] = load_x(row, j);
            vec4 a = abs(v[k]);
            mx = max(mx, max(max(a.x, a.y), max(a.z, a.w)));
        }
    }
    int e = presplit_exp(wg_max(mx));
    if (l == 0u)
        s[p.e_off + r] = uint(e);
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        if (j >= n4)
            continue;
        if (SWIGLU != 0u)
            ov[p.o_off + row + j] = v[k];
        uint o2 = ((r * p.k) / 2u) / 2u + j; /* 8-byte units of the row's halves */
        PRESPLIT_STORE4_TERMS(v[k], e, s2, p.hi_off / 2u + o2, p.lo_off / 2u + o2, SPLIT == 2u)
    }
}

void main()
{
    uint r = group_id() / NS;
    if (r >= p.m)
        return;
    if (V4 > 0u) {
        main_v4(r, r * (p.k / 4u));
        return;
    }
    uint g0 = 0u, g1 = p.k / 8u; /* the groups of 8 this workgroup converts */
    if (NS > 1u)
        row_part(p.k / 8u, NS, group_id() % NS, g0, g1);
    uint l = gl_LocalInvocationID.x;
    uint row = r * (p.k / 4u);
    float mx = 0.0;
    for (uint c = l; c < p.k / 4u; c += WG) {
        vec4 v = abs(load_x(row, c));
        mx = max(mx, max(max(v.x, v.y), max(v.z, v.w)));
    }
    int e = presplit_exp(wg_max(mx));
    if (l == 0u && g0 == 0u)
        s[p.e_off + r] = uint(e);
    for (uint c = g0 + l; c < g1; c += WG) {
        vec4 v[2] = vec4[2](load_x(row, 2u * c), load_x(row, 2u * c + 1u));
        if (SWIGLU != 0u) {
            ov[p.o_off + row + 2u * c] = v[0];
            ov[p.o_off + row + 2u * c + 1u] = v[1];
        }
        uint hw[4], lw[4];
        for (uint j = 0u; j < 4u; j++) {
            vec2 x = vec2(v[j / 2u][(j % 2u) * 2u], v[j / 2u][(j % 2u) * 2u + 1u]);
            x = ldexp(x, ivec2(-e));
            uint h0 = f32_to_f16(x.x), h1 = f32_to_f16(x.y);
            hw[j] = h0 | (h1 << 16);
            if (SPLIT == 2u)
                lw[j] = f32_to_f16(x.x - f16_to_f32(h0)) | (f32_to_f16(x.y - f16_to_f32(h1)) << 16);
        }
        uint o = (r * p.k) / 2u + 4u * c;
        for (uint j = 0u; j < 4u; j++)
            s[p.hi_off + o + j] = hw[j];
        if (SPLIT == 2u)
            for (uint j = 0u; j < 4u; j++)
                s[p.lo_off + o + j] = lw[j];
    }
}

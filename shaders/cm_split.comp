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
 * elements (row_part): the same bits as NS = 1; with V4 too (FOLD at
 * decode rows: each workgroup keeps the whole row in registers).
 *
 * V4 > 0 (prefill rows, NS 1, or FOLD; vk_swiglu_split): each invocation keeps V4
 * runs of 4 consecutive elements of the row (run j = l + k WG) in
 * registers, so a and u are read once (not once for the largest element
 * and again for the terms); the same values, e and terms.
 *
 * FOLD = 1 (SWIGLU; vk_swiglu_split with vk_sum.c's vk_sum_swiglu_ok,
 * the held split-K sums of the gate and up products): a and u are those products' raw partial
 * tiles (matmul_dec.comp / matmul_cm.comp RAW 1), and element c of row r
 * is sum_slices_cm.comp's value, 2^e_r * the sum of the slices in slice
 * order (gate: a[a_off + r ga_ldp + c + s ga_ps] over s < ga_n, exponent
 * ge[ga_e + r], binding 4; up the same from u, ue, binding 5; offsets,
 * pitches and strides in vec4s), so the same f32 gate and up values as
 * the sum passes would have written, and the same out and terms (GS,
 * US > 0: the slice counts, the sums unrolled, all loads in flight). FOLD
 * bit 1 also writes the gate's values to binding 6 (vec4 offset go_off,
 * [M, K]), bit 2 up's to binding 7 (uo_off): the outputs the sum passes
 * would have written, where out is not them. */
#include "common.glsl"
#include "presplit.glsl"

layout(constant_id = 1) const uint SPLIT = 2;
layout(constant_id = 2) const uint SWIGLU = 0;
layout(constant_id = 3) const uint NS = 1; /* workgroups a row */
layout(constant_id = 4) const uint V4 = 0; /* runs of 4 an invocation in registers; 0: off */
layout(constant_id = 5) const uint FOLD = 0; /* SWIGLU: a and u are raw split-K tiles */
layout(constant_id = 6) const uint GS = 0; /* FOLD: the gate's slices, unrolled; 0: ga_n */
layout(constant_id = 7) const uint US = 0; /* up's */

layout(binding = 0) readonly buffer A { vec4 a[]; };
layout(binding = 1) buffer S { uint s[]; };
layout(binding = 1) buffer S2 { uvec2 s2[]; };
layout(binding = 2) readonly buffer U { vec4 u[]; };
layout(binding = 3) writeonly buffer O { vec4 ov[]; };
layout(binding = 4) readonly buffer GE { int ge[]; };
layout(binding = 5) readonly buffer UE { int ue[]; };
layout(binding = 6) writeonly buffer GO { vec4 gv[]; };
layout(binding = 7) writeonly buffer UO { vec4 uv[]; };

layout(push_constant) uniform P {
    uint m, k;
    uint a_off; /* vec4s */
    uint hi_off, lo_off, e_off; /* words of s */
    uint u_off, o_off; /* SWIGLU: vec4s */
    /* FOLD: the gate's and up's tiles: row pitch, slices, slice stride
     * (vec4s), exponents (ints) */
    uint ga_ldp, ga_n, ga_ps, ga_e, ua_ldp, ua_n, ua_ps, ua_e;
    uint go_off, uo_off; /* FOLD bits 1, 2: vec4s */
} p;

/* FOLD: vec4 c of row r of the gate (sum_slices_cm.comp's VEC4 sum) */
vec4 fold_gate(uint r, uint c)
{
    uint at = p.a_off + r * p.ga_ldp + c;
    vec4 sum = a[at];
    if (GS > 0u) {
        [[unroll]] for (uint s = 1u; s < GS; s++)
            sum += a[at + s * p.ga_ps];
    } else {
        for (uint s = 1u; s < p.ga_n; s++)
            sum += a[at + s * p.ga_ps];
    }
    return ldexp(sum, ivec4(ge[p.ga_e + r]));
}

/* FOLD: vec4 c of row r of up */
vec4 fold_up(uint r, uint c)
{
    uint at = p.u_off + r * p.ua_ldp + c;
    vec4 sum = u[at];
    if (US > 0u) {
        [[unroll]] for (uint s = 1u; s < US; s++)
            sum += u[at + s * p.ua_ps];
    } else {
        for (uint s = 1u; s < p.ua_n; s++)
            sum += u[at + s * p.ua_ps];
    }
    return ldexp(sum, ivec4(ue[p.ua_e + r]));
}

/* element vec4 c of row r (its vec4s from `row`): a, or silu(a) * u;
 * FOLD: the gate's and up's values stored too where asked and store */
vec4 load_x(uint r, uint row, uint c, bool store)
{
    vec4 x = FOLD != 0u ? fold_gate(r, c) : a[p.a_off + row + c];
    if (SWIGLU != 0u) {
        vec4 y = FOLD != 0u ? fold_up(r, c) : u[p.u_off + row + c];
        if (store && (FOLD & 2u) != 0u)
            gv[p.go_off + row + c] = x;
        if (store && (FOLD & 4u) != 0u)
            uv[p.uo_off + row + c] = y;
        x = vec4(silu(x.x) * y.x, silu(x.y) * y.y, silu(x.z) * y.z, silu(x.w) * y.w);
    }
    return x;
}

/* The V4 path (see above): row r, its vec4s from `row`; with NS > 1
 * (FOLD) every workgroup of the row loads it all (the same e_r) and
 * writes its part's runs (a run j is in group j / 2). */
void main_v4(uint r, uint row)
{
    uint l = gl_LocalInvocationID.x, n4 = p.k / 4u;
    uint g0 = 0u, g1 = p.k / 8u;
    if (NS > 1u)
        row_part(p.k / 8u, NS, group_id() % NS, g0, g1);
    vec4 v[V4 > 0u ? V4 : 1u];
    vec4 gq[FOLD != 0u && V4 > 0u ? V4 : 1u], uq[FOLD != 0u && V4 > 0u ? V4 : 1u];
    float mx = 0.0;
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        v[k] = vec4(0.0);
        if (j < n4) {
            if (FOLD != 0u) { /* the gate and up kept for their stores */
                gq[k] = fold_gate(r, j);
                uq[k] = fold_up(r, j);
                vec4 x = gq[k], y = uq[k];
                v[k] = vec4(silu(x.x) * y.x, silu(x.y) * y.y, silu(x.z) * y.z, silu(x.w) * y.w);
            } else {
                v[k] = load_x(r, row, j, true);
            }
            vec4 a = abs(v[k]);
            mx = max(mx, max(max(a.x, a.y), max(a.z, a.w)));
        }
    }
    int e = presplit_exp(wg_max(mx));
    if (l == 0u && g0 == 0u)
        s[p.e_off + r] = uint(e);
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        if (j >= n4 || j / 2u < g0 || j / 2u >= g1)
            continue;
        if ((FOLD & 2u) != 0u)
            gv[p.go_off + row + j] = gq[k];
        if ((FOLD & 4u) != 0u)
            uv[p.uo_off + row + j] = uq[k];
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
        vec4 v = abs(load_x(r, row, c, false));
        mx = max(mx, max(max(v.x, v.y), max(v.z, v.w)));
    }
    int e = presplit_exp(wg_max(mx));
    if (l == 0u && g0 == 0u)
        s[p.e_off + r] = uint(e);
    for (uint c = g0 + l; c < g1; c += WG) {
        vec4 v[2] = vec4[2](load_x(r, row, 2u * c, true), load_x(r, row, 2u * c + 1u, true));
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

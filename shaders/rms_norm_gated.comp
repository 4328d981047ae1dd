#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
/* Gated RMS norm of Mamba-2 (HF MambaRMSNormGated): h = y * silu(z), then
 * each group of gs = D / n_groups elements is normalized:
 * out = h / sqrt(mean_group(h^2) + eps) * w. One workgroup per (row,
 * group). out may be y or z: an invocation recomputes h from its own
 * elements before writing them. REG > 0 (the host sets it when
 * gs <= REG * WG): each invocation keeps its REG values of h and their
 * weights in registers, all loaded at once, so y and z are read once (the
 * same values in the same order as the loop). SPLIT = 1 (REG path, one
 * group; vk_presplit.c) also writes matmul_cm.comp's f16 terms of each
 * output row (presplit.glsl) to binding 4: hi at word hi_off, lo at
 * lo_off, e [rows] i32 at e_off. NS > 1 (REG path, out clear of y and z;
 * vk_ops_basic.c, vk_row_split): NS workgroups share a (row, group), each
 * computes its whole sum of squares (and, SPLIT, its largest output) as
 * one workgroup does and writes only its part of the columns (row_part)
 * and of the terms: the same bits as NS = 1.
 * V4 > 0 (prefill rows; vk_ops_basic.c, norm_v4; NS 1, cols, gs and every
 * offset multiples of 4): each invocation keeps V4 runs of 4 consecutive
 * elements of the group (run j = l + k WG) in registers, moved as 16-byte
 * loads and stores, the weights loaded once the sum is known (fewer
 * registers held across the reduction), and with SPLIT writes its runs' terms itself (no pass
 * through shared memory); its sum of squares adds each run's 4 squares in
 * column order, another order than REG's (see rms_norm.comp). SMEM = 1
 * (V4; $LLMEM_VULKAN_PF_NORM=2) keeps the runs in shared memory instead of
 * registers between the reductions, so that more rows are resident at
 * once where a row does not fit the registers (the same values).
 * SPLIT = 2 and DN: as in rms_norm.comp (hi alone; bit 0 straight-line
 * loads of y, z and the weights, bit 2 wg_max_sg: the same bits; bit 3
 * wg_sum_sg: within f32 rounding). DN bit 4 (WO): the REG path's loops over
 * hv and wv written out with literal indices (the W16 macro): at REG 8 with
 * the terms (SPLIT 1) driver 580 kept a loop rolled at 1024 invocations,
 * so one 8-element array lived in local memory (32 bytes); the same
 * operations in the same order: the same bits. Without local memory it ran
 * 10% slower a call on the H200 (docs/benchmarks.md, "Vulkan: register
 * arrays out of local memory"), so the host leaves it off by default. */
#include "common.glsl"
#include "presplit.glsl"

layout(constant_id = 1) const uint W_DT = 0;
layout(constant_id = 2) const uint REG = 0; /* elements per invocation in registers; 0: loop */
layout(constant_id = 3) const uint SPLIT = 0; /* 1: also the f16 terms of the output */
layout(constant_id = 4) const uint NS = 1; /* workgroups a (row, group) (REG) */
layout(constant_id = 5) const uint V4 = 0; /* runs of 4 elements per invocation (prefill); 0: off */
layout(constant_id = 6) const uint SMEM = 0; /* V4: the runs kept in shared memory */
layout(constant_id = 7) const uint DN = 0; /* REG: 1 straight loads, 4 wg_max_sg, 8 wg_sum_sg, 16 WO */
const bool WO = (DN & 16u) != 0u;

layout(binding = 0) readonly buffer Y { float y[]; };
layout(binding = 1) readonly buffer Z { float z[]; };
layout(binding = 2) readonly buffer W { uint w[]; };
layout(binding = 3) buffer O { float o[]; };
layout(binding = 4) writeonly buffer S { uint s[]; };
/* the same buffers as 16-byte runs (V4) and 8-byte term pairs */
layout(binding = 0) readonly buffer Y4 { vec4 y4[]; };
layout(binding = 1) readonly buffer Z4 { vec4 z4[]; };
layout(binding = 2) readonly buffer W4 { uvec4 w4[]; };
layout(binding = 2) readonly buffer W2 { uvec2 w2[]; };
layout(binding = 3) writeonly buffer O4 { vec4 o4[]; };
layout(binding = 4) writeonly buffer S2 { uvec2 s2[]; };

layout(push_constant) uniform P {
    uint n_items, cols, gs, n_groups, y_off, z_off, w_off, o_off;
    float eps;
    uint hi_off, lo_off, e_off; /* SPLIT: words of binding 4 */
} p;

shared uint pk[SPLIT != 0u && REG > 0u ? REG * WG : 1u];
shared vec4 hrow[SMEM != 0u && V4 > 0u ? V4 * WG : 1u];

/* WO: m(k) for k = 0 .. 15, each guarded by k < REG (NORM_REG_MAX = 16, vk_ops_basic.c) */
#define W16(m) m(0u) m(1u) m(2u) m(3u) m(4u) m(5u) m(6u) m(7u) m(8u) m(9u) m(10u) m(11u) \
               m(12u) m(13u) m(14u) m(15u)
/* the REG path's loop bodies for element k of the invocation */
#define WO_LD1(k) if (k < REG) { uint c = l + k * WG, cc = min(c, p.gs - 1u); \
    float h = y[p.y_off + base + cc] * silu(z[p.z_off + base + cc]); \
    float ww = LOAD_F(w, p.w_off + grp * p.gs + cc, W_DT); \
    hv[k] = c < p.gs ? h : 0.0; wv[k] = c < p.gs ? ww : 0.0; }
#define WO_LD0(k) if (k < REG) { uint c = l + k * WG; hv[k] = wv[k] = 0.0; \
    if (c < p.gs) { hv[k] = y[p.y_off + base + c] * silu(z[p.z_off + base + c]); \
        if (SPLIT != 0u || (c >= c0 && c < c1)) wv[k] = LOAD_F(w, p.w_off + grp * p.gs + c, W_DT); } }
#define WO_SS(k) if (k < REG) ss += hv[k] * hv[k];
#define WO_OUT(k) if (k < REG) { uint c = l + k * WG; hv[k] = hv[k] * scale * wv[k]; \
    if (c >= c0 && c < c1) o[p.o_off + base + c] = hv[k]; \
    if (c < p.gs) mx = max(mx, abs(hv[k])); }
#define WO_PK(k) if (k < REG) { uint c = l + k * WG; \
    if (c >= c0 && c < c1) pk[c] = SPLIT == 2u ? presplit_hi(hv[k], e) : presplit_terms(hv[k], e); }

vec4 silu4(vec4 z)
{
    return vec4(silu(z.x), silu(z.y), silu(z.z), silu(z.w));
}

/* weights of elements e .. e + 3 (e a multiple of 4), as f32 */
vec4 load_w4(uint e)
{
    if (W_DT == DT_F32)
        return uintBitsToFloat(w4[e / 4u]);
    uvec2 h = w2[e / 4u];
    return vec4(half_to_f32(h.x & 0xffffu, W_DT), half_to_f32(h.x >> 16, W_DT),
                half_to_f32(h.y & 0xffffu, W_DT), half_to_f32(h.y >> 16, W_DT));
}

/* The V4 path (see above): group grp of row `row`, at element base. With
 * SMEM the runs wait in shared memory (each invocation reads back only
 * its own) instead of registers across the reductions: the same values. */
void main_v4(uint row, uint grp, uint base)
{
    uint l = gl_LocalInvocationID.x, n4 = p.gs / 4u, b4 = base / 4u;
    vec4 hv[V4 > 0u ? V4 : 1u];
    float ss = 0.0;
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        vec4 h = vec4(0.0);
        if (j < n4)
            h = y4[p.y_off / 4u + b4 + j] * silu4(z4[p.z_off / 4u + b4 + j]);
        ss += h.x * h.x;
        ss += h.y * h.y;
        ss += h.z * h.z;
        ss += h.w * h.w;
        if (SMEM != 0u)
            hrow[k * WG + l] = h;
        else
            hv[k] = h;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(p.gs) + p.eps);
    float mx = 0.0;
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        if (j < n4) {
            vec4 h = SMEM != 0u ? hrow[k * WG + l] : hv[k];
            h = h * scale * load_w4(p.w_off + grp * p.gs + 4u * j);
            o4[p.o_off / 4u + b4 + j] = h;
            mx = max(mx, max(max(abs(h.x), abs(h.y)), max(abs(h.z), abs(h.w))));
            if (SMEM != 0u)
                hrow[k * WG + l] = h;
            else
                hv[k] = h;
        }
    }
    if (SPLIT != 0u) { /* one group per row: item = row */
        int e = presplit_exp(wg_max(mx));
        [[unroll]] for (uint k = 0u; k < V4; k++) {
            uint j = l + k * WG;
            if (j < n4) {
                vec4 h = SMEM != 0u ? hrow[k * WG + l] : hv[k];
                PRESPLIT_STORE4_TERMS(h, e, s2, (p.hi_off + base / 2u) / 2u + j,
                                      (p.lo_off + base / 2u) / 2u + j, SPLIT == 1u)
            }
        }
        if (l == 0u)
            s[p.e_off + row] = uint(e);
    }
}

void main()
{
    uint item = group_id() / NS;
    if (item >= p.n_items)
        return;
    uint row = item / p.n_groups, grp = item % p.n_groups;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.cols + grp * p.gs;
    if (V4 > 0u) {
        main_v4(row, grp, base);
        return;
    }
    float ss = 0.0;
    if (REG > 0u) {
        uint c0 = 0u, c1 = p.gs; /* the columns this workgroup writes */
        if (NS > 1u)
            row_part(p.gs, NS, group_id() % NS, c0, c1);
        /* WO: 16 elements, so that every literal index is within the array */
        float hv[WO ? 16u : REG > 0u ? REG : 1u], wv[WO ? 16u : REG > 0u ? REG : 1u];
        if (WO && (DN & 1u) != 0u) {
            W16(WO_LD1)
        } else if (WO) {
            W16(WO_LD0)
        } else if ((DN & 1u) != 0u) {
            [[unroll]] for (uint k = 0u; k < REG; k++) {
                uint c = l + k * WG, cc = min(c, p.gs - 1u);
                float h = y[p.y_off + base + cc] * silu(z[p.z_off + base + cc]);
                float ww = LOAD_F(w, p.w_off + grp * p.gs + cc, W_DT);
                hv[k] = c < p.gs ? h : 0.0;
                wv[k] = c < p.gs ? ww : 0.0;
            }
        }
        for (uint k = 0u; k < REG && (DN & 1u) == 0u && !WO; k++) {
            uint c = l + k * WG;
            hv[k] = wv[k] = 0.0;
            if (c < p.gs) {
                hv[k] = y[p.y_off + base + c] * silu(z[p.z_off + base + c]);
                if (SPLIT != 0u || (c >= c0 && c < c1))
                    wv[k] = LOAD_F(w, p.w_off + grp * p.gs + c, W_DT);
            }
        }
        if (WO) {
            W16(WO_SS)
        } else for (uint k = 0u; k < REG; k++)
            ss += hv[k] * hv[k];
        ss = (DN & 8u) != 0u ? wg_sum_sg(ss) : wg_sum(ss);
        float scale = 1.0 / sqrt(ss / float(p.gs) + p.eps);
        float mx = 0.0;
        if (WO) {
            W16(WO_OUT)
        } else for (uint k = 0u; k < REG; k++) {
            uint c = l + k * WG;
            hv[k] = hv[k] * scale * wv[k];
            if (c >= c0 && c < c1)
                o[p.o_off + base + c] = hv[k];
            if (c < p.gs)
                mx = max(mx, abs(hv[k]));
        }
        if (SPLIT != 0u) { /* one group per row: item = row */
            int e = presplit_exp((DN & 4u) != 0u ? wg_max_sg(mx) : wg_max(mx));
            if (WO) {
                W16(WO_PK)
            } else for (uint k = 0u; k < REG; k++) {
                uint c = l + k * WG;
                if (c >= c0 && c < c1)
                    pk[c] = SPLIT == 2u ? presplit_hi(hv[k], e) : presplit_terms(hv[k], e);
            }
            if (l == 0u && c0 == 0u)
                s[p.e_off + row] = uint(e);
            barrier();
            PRESPLIT_STORE_WORDS_T(pk, c0 / 2u, c1 / 2u, s, p.hi_off + base / 2u,
                                   p.lo_off + base / 2u, SPLIT == 1u)
        }
        return;
    }
    for (uint c = l; c < p.gs; c += WG) {
        float h = y[p.y_off + base + c] * silu(z[p.z_off + base + c]);
        ss += h * h;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(p.gs) + p.eps);
    for (uint c = l; c < p.gs; c += WG) {
        float h = y[p.y_off + base + c] * silu(z[p.z_off + base + c]);
        o[p.o_off + base + c] = h * scale * LOAD_F(w, p.w_off + grp * p.gs + c, W_DT);
    }
}

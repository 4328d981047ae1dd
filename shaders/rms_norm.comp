#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
/* RMS norm over the last dimension (Zhang & Sennrich 2019; HF
 * LlamaRMSNorm): out = x / sqrt(mean(x^2) + eps) * w. One workgroup per
 * row. W_DT is the weight dtype, DT_NONE for no weight. In place allowed:
 * each invocation reads and writes only its own (strided) elements.
 * ADD = 1 first adds the residual r into x (llmem_op_add_rms_norm:
 * x = x + r, stored, then normalized): the same values, in the same order,
 * as the add shader followed by this one. out may be r itself.
 * REG > 0 (the host sets it when cols <= REG * WG): each invocation keeps
 * its REG elements and their weights in registers, all loaded at once, so
 * the row is read once and a workgroup waits for one round of loads
 * instead of cols / WG (the same values in the same order as the loop).
 * ADD = 2 (vk_sum.c: the product that makes r held its split-K sum back)
 * reads r as that sum, sum_slices_cm.comp's arithmetic on its raw tiles:
 * r[row, c] = 2^e_row * (part[part_off + row * ldp + c] + the slices at
 * slice_stride, added in slice order), e from binding 6, so the same bits
 * as the sum pass followed by ADD = 1; r itself is never read (the host
 * takes this path only when out is r: the sum is not needed after).
 * SPLIT = 1 (REG path only; vk_presplit.c) also writes matmul_cm.comp's
 * f16 terms of each output row (presplit.glsl) to binding 4: hi [rows,
 * cols] at word hi_off, lo at lo_off, e [rows] i32 at e_off.
 * NS > 1 (REG path, out clear of x; vk_ops_basic.c, vk_row_split): NS
 * workgroups share a row (the decode rows: 16 rows would be 16
 * workgroups): each computes the whole row's sum of squares (and, SPLIT,
 * its largest output), the same sums in the same order as one workgroup,
 * and writes only its part of the columns (row_part) and of the terms; so
 * the same bits as NS = 1. A workgroup must not read what another writes:
 * with ADD != 0 (x written) x's values come from a copy, XS = 1 (r, ADD 1,
 * clear of out).
 * XS (vk_sum.c, the residual's copies): 1, x's values are read from xa
 * (binding 7, float xa_off; x as it is, the copy an earlier norm wrote)
 * instead of x, and the updated x (ADD != 0) is written to x and to xb
 * (binding 8, float xb_off); 2, x (ADD 0) is also written to xb. The same
 * values: the copy holds x's bits.
 * V4 > 0 (prefill rows; vk_ops_basic.c, norm_v4; NS 1, XS 0, cols and
 * every offset, with ADD 2 ldp and slice_stride too, multiples of 4): each
 * invocation keeps V4 runs of 4 consecutive elements (run j = l + k WG:
 * columns 4j .. 4j + 3) in registers, moved as 16-byte loads and stores;
 * the weights are loaded once the row's sum is known (fewer registers held
 * across the reduction: more workgroups resident); with SPLIT it writes
 * its runs' terms itself (4 f16 of hi and of lo: one 8-byte store each, no
 * pass through shared memory). Its sum of squares adds each run's 4
 * squares in column order into the invocation's sum, so another order than
 * REG's: the same values within f32 rounding, the same bits from one call
 * to the next, with or without SPLIT, with ADD 1 or 2.
 * SL > 0 (ADD 2; vk_sum.c, $LLMEM_VULKAN_NORM_FOLD bit 0): the held sum's
 * slice count, known when the norm is recorded, so the slices' loads are
 * unrolled and go out together instead of one round trip a slice; the
 * same additions in the same order (SL 0: the loop over n_slices).
 * SPLIT = 2 (fast mode's products at the decode rows, which read hi only;
 * vk_presplit.c, vk_presplit_lo): the terms without lo (nor its
 * computation), hi as SPLIT 1 writes it.
 * DN (REG path; the decode rows, $LLMEM_VULKAN_DEC_NORM): bit 0, every
 * invocation loads its REG elements (x, the residual or the held sum's
 * slices, the weights) from columns clamped to the row, then keeps 0 (1
 * for weights) past its end: straight-line loads that all go out at once
 * rather than one guarded round per element; bit 2, the row's largest
 * output reduced by wg_max_sg (the same bits either way); bit 3, the sum
 * of squares by wg_sum_sg (another order of the same additions: within
 * f32 rounding). */
#include "common.glsl"
#include "presplit.glsl"

layout(constant_id = 1) const uint W_DT = 0;
layout(constant_id = 2) const uint ADD = 0;
layout(constant_id = 3) const uint REG = 0; /* elements per invocation in registers; 0: loop */
layout(constant_id = 4) const uint SPLIT = 0; /* 1: also the f16 terms of the output */
layout(constant_id = 5) const uint NS = 1; /* workgroups a row (REG) */
layout(constant_id = 6) const uint XS = 0; /* x read from a copy (1), written to one (1, 2) */
layout(constant_id = 7) const uint V4 = 0; /* runs of 4 elements per invocation (prefill); 0: off */
layout(constant_id = 8) const uint SL = 0; /* ADD 2: the slices, unrolled; 0: the loop */
layout(constant_id = 9) const uint DN = 0; /* REG: 1 straight loads, 4 wg_max_sg, 8 wg_sum_sg */

layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) buffer O { float o[]; };
layout(binding = 3) readonly buffer R { float r[]; };
layout(binding = 4) writeonly buffer S { uint s[]; };
layout(binding = 5) readonly buffer PT { float part[]; };
layout(binding = 6) readonly buffer PE { int ex[]; };
layout(binding = 7) readonly buffer XA { float xa[]; };
layout(binding = 8) writeonly buffer XB { float xb[]; };
/* the same buffers as 16-byte runs (V4) and 8-byte term pairs */
layout(binding = 0) buffer X4 { vec4 x4[]; };
layout(binding = 1) readonly buffer W4 { uvec4 w4[]; };
layout(binding = 1) readonly buffer W2 { uvec2 w2[]; };
layout(binding = 2) writeonly buffer O4 { vec4 o4[]; };
layout(binding = 3) readonly buffer R4 { vec4 r4[]; };
layout(binding = 4) writeonly buffer S2 { uvec2 s2[]; };
layout(binding = 5) readonly buffer PT4 { vec4 part4[]; };

layout(push_constant) uniform P {
    uint rows, cols, x_off, w_off, o_off;
    float eps;
    uint r_off;
    uint hi_off, lo_off, e_off; /* SPLIT: words of binding 4 */
    uint ldp, n_slices, slice_stride, part_off, pe_off; /* ADD = 2 */
    uint xa_off, xb_off; /* XS */
} p;

/* the residual r[row, c] (ADD 1: read; ADD 2: the held sum, see above) */
float resid(uint row, uint c)
{
    if (ADD == 2u) {
        uint at = p.part_off + row * p.ldp + c;
        float sum = part[at];
        if (SL > 0u) {
            [[unroll]] for (uint k = 1u; k < SL; k++)
                sum += part[at + k * p.slice_stride];
        } else {
            for (uint k = 1u; k < p.n_slices; k++)
                sum += part[at + k * p.slice_stride];
        }
        return ldexp(sum, ex[p.pe_off + row]);
    }
    return r[p.r_off + row * p.cols + c];
}

shared uint pk[SPLIT != 0u && REG > 0u ? REG * WG : 1u];

/* weights of elements e .. e + 3 (e a multiple of 4), as f32 */
vec4 load_w4(uint e)
{
    if (W_DT == DT_NONE)
        return vec4(1.0);
    if (W_DT == DT_F32)
        return uintBitsToFloat(w4[e / 4u]);
    uvec2 h = w2[e / 4u];
    return vec4(half_to_f32(h.x & 0xffffu, W_DT), half_to_f32(h.x >> 16, W_DT),
                half_to_f32(h.y & 0xffffu, W_DT), half_to_f32(h.y >> 16, W_DT));
}

/* r's run j of row `row` (V4; resid's arithmetic on 4 columns at once) */
vec4 resid4(uint row, uint b4, uint j)
{
    if (ADD == 2u) {
        uint at = (p.part_off + row * p.ldp) / 4u + j;
        vec4 sum = part4[at];
        if (SL > 0u) {
            [[unroll]] for (uint k = 1u; k < SL; k++)
                sum += part4[at + k * (p.slice_stride / 4u)];
        } else {
            for (uint k = 1u; k < p.n_slices; k++)
                sum += part4[at + k * (p.slice_stride / 4u)];
        }
        return ldexp(sum, ivec4(ex[p.pe_off + row]));
    }
    return r4[p.r_off / 4u + b4 + j];
}

/* The V4 path (see above): row `row` of cols elements at element base. */
void main_v4(uint row, uint base)
{
    uint l = gl_LocalInvocationID.x, n4 = p.cols / 4u, b4 = base / 4u;
    vec4 v[V4 > 0u ? V4 : 1u];
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        v[k] = vec4(0.0);
        if (j < n4) {
            v[k] = x4[p.x_off / 4u + b4 + j];
            if (ADD != 0u)
                v[k] += resid4(row, b4, j);
        }
    }
    float ss = 0.0;
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        if (ADD != 0u && j < n4)
            x4[p.x_off / 4u + b4 + j] = v[k];
        ss += v[k].x * v[k].x;
        ss += v[k].y * v[k].y;
        ss += v[k].z * v[k].z;
        ss += v[k].w * v[k].w;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(p.cols) + p.eps);
    float mx = 0.0;
    [[unroll]] for (uint k = 0u; k < V4; k++) {
        uint j = l + k * WG;
        v[k] = W_DT != DT_NONE && j < n4 ? v[k] * scale * load_w4(p.w_off + 4u * j) : v[k] * scale;
        if (j < n4) {
            o4[p.o_off / 4u + b4 + j] = v[k];
            mx = max(mx, max(max(abs(v[k].x), abs(v[k].y)), max(abs(v[k].z), abs(v[k].w))));
        }
    }
    if (SPLIT != 0u) {
        int e = presplit_exp(wg_max(mx));
        [[unroll]] for (uint k = 0u; k < V4; k++) {
            uint j = l + k * WG;
            if (j < n4)
                PRESPLIT_STORE4_TERMS(v[k], e, s2, (p.hi_off + base / 2u) / 2u + j,
                                      (p.lo_off + base / 2u) / 2u + j, SPLIT == 1u)
        }
        if (l == 0u)
            s[p.e_off + row] = uint(e);
    }
}

void main()
{
    uint row = group_id() / NS;
    if (row >= p.rows)
        return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.cols;
    if (V4 > 0u) {
        main_v4(row, base);
        return;
    }
    float ss = 0.0;
    if (REG > 0u) {
        uint c0 = 0u, c1 = p.cols; /* the columns this workgroup writes */
        if (NS > 1u)
            row_part(p.cols, NS, group_id() % NS, c0, c1);
        float v[REG > 0u ? REG : 1u], wv[REG > 0u ? REG : 1u];
        if ((DN & 1u) != 0u) {
            [[unroll]] for (uint k = 0u; k < REG; k++) {
                uint c = l + k * WG, cc = min(c, p.cols - 1u);
                float xv = XS == 1u ? xa[p.xa_off + base + cc] : x[p.x_off + base + cc];
                if (ADD != 0)
                    xv += resid(row, cc);
                float ww = W_DT != DT_NONE ? LOAD_F(w, p.w_off + cc, W_DT) : 1.0;
                v[k] = c < p.cols ? xv : 0.0;
                wv[k] = c < p.cols ? ww : 1.0;
            }
        }
        for (uint k = 0u; k < REG && (DN & 1u) == 0u; k++) {
            uint c = l + k * WG;
            v[k] = 0.0;
            wv[k] = 1.0;
            if (c < p.cols) {
                v[k] = XS == 1u ? xa[p.xa_off + base + c] : x[p.x_off + base + c];
                if (ADD != 0)
                    v[k] += resid(row, c);
                /* the weights of the columns it writes (all of them for the
                 * row's largest output) */
                if (W_DT != DT_NONE && (SPLIT != 0u || (c >= c0 && c < c1)))
                    wv[k] = LOAD_F(w, p.w_off + c, W_DT);
            }
        }
        for (uint k = 0u; k < REG; k++) {
            uint c = l + k * WG;
            if (ADD != 0 && c >= c0 && c < c1)
                x[p.x_off + base + c] = v[k];
            if (XS != 0u && c >= c0 && c < c1)
                xb[p.xb_off + base + c] = v[k];
            ss += v[k] * v[k];
        }
        ss = (DN & 8u) != 0u ? wg_sum_sg(ss) : wg_sum(ss);
        float scale = 1.0 / sqrt(ss / float(p.cols) + p.eps);
        float mx = 0.0;
        for (uint k = 0u; k < REG; k++) {
            uint c = l + k * WG;
            v[k] = W_DT != DT_NONE ? v[k] * scale * wv[k] : v[k] * scale;
            if (c >= c0 && c < c1)
                o[p.o_off + base + c] = v[k];
            if (c < p.cols)
                mx = max(mx, abs(v[k]));
        }
        if (SPLIT != 0u) {
            int e = presplit_exp((DN & 4u) != 0u ? wg_max_sg(mx) : wg_max(mx));
            for (uint k = 0u; k < REG; k++) {
                uint c = l + k * WG;
                if (c >= c0 && c < c1)
                    pk[c] = SPLIT == 2u ? presplit_hi(v[k], e) : presplit_terms(v[k], e);
            }
            if (l == 0u && c0 == 0u)
                s[p.e_off + row] = uint(e);
            barrier();
            PRESPLIT_STORE_WORDS_T(pk, c0 / 2u, c1 / 2u, s, p.hi_off + base / 2u,
                                   p.lo_off + base / 2u, SPLIT == 1u)
        }
        return;
    }
    for (uint c = l; c < p.cols; c += WG) {
        float v = x[p.x_off + base + c];
        if (ADD != 0) {
            v += resid(row, c);
            x[p.x_off + base + c] = v;
        }
        ss += v * v;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(p.cols) + p.eps);
    for (uint c = l; c < p.cols; c += WG) {
        float v = x[p.x_off + base + c] * scale;
        if (W_DT != DT_NONE)
            v *= LOAD_F(w, p.w_off + c, W_DT);
        o[p.o_off + base + c] = v;
    }
}

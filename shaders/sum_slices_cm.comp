#version 450
#extension GL_GOOGLE_include_directive : enable
// llmem-shader: sum_slices_cm
// llmem-shader: sum_slices_cm_conv:CONV=1
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
 * the copy would have read from o). o_off = NO_OUT (the model discarded
 * o, vk_sum.c vk_op_discard): o is not written, binding 1 is a dummy.
 *
 * Tail columns (matmul_cmp.comp's tail-column plan, vk_cm_raw_tail):
 * columns c >= tc0 add t_slices slices instead, slice 0 at the place
 * above and slice s >= 1 at part_off + slice_stride + (s - 1) t_stride + r
 * t_ld + c - tc0, in slice order (the same additions as a plan of
 * t_slices slices everywhere, so the same bits for those columns); tc0 = n:
 * none (the host passes t_ld = ldp, t_stride = slice_stride). With VEC4
 * tc0, t_ld and t_stride are multiples of 4 too.
 *
 * ADDX = 1 (scalar path, NDST 0; vk_sum.c, a held sum whose output is the
 * residual r of an add + RMS norm that runs split over workgroups): the
 * sum is added into destination 0 instead of written to o (x[r, c] +=
 * sum: d0[d_0 + r * w_0 + c - c0_0], the add of rms_norm.comp's ADD 1 on
 * the same f32 values, so the same x; o, which the norm overwrites, is
 * not written).
 *
 * CONV (the module sum_slices_cm_conv, vk_sum.c's decode conv fold; scalar
 * path, NDST >= 1): row r is stream r's one token, and each column c in
 * [cv_c0, cv_c0 + conv_dim) is also input channel cc = c - cv_c0 of
 * Mamba-2's causal conv1d with the conv state, done by the invocation that
 * writes the sum, as ssm_conv.comp does it (the same arithmetic in the
 * same order, so the same bits): co[r, cc] = silu(b[cc] + sum_k cw[cc, k]
 * * u_k), u = the DC - 1 states of slot src_slot[r] (zeros outside [0,
 * n_slots)), then the sum; the state shifted by one into slot dst_slot[r]
 * (skipped outside [0, n_slots)). Each invocation reads its channel of
 * the source slot before it writes the destination, so a stream's own
 * slots may alias (the host refuses views where a stream reads another's
 * destination). Constant 4 packs d_conv and the dtypes as
 * norm_matvec16_rows.comp's CV. With VEC4 (the host's choice where
 * cv_c0, conv_dim and co_off are multiples of 4 too) an invocation does
 * four channels, an f32 state's rows as 16-byte vectors. */
#include "common.glsl"

layout(constant_id = 1) const uint VEC4 = 0;
layout(constant_id = 2) const uint NDST = 0;
layout(constant_id = 3) const uint ADDX = 0;
const uint NO_OUT = 0xffffffffu; /* o_off of a discarded output: o not written */
#ifdef CONV
/* d_conv | conv weight dtype << 4 | bias dtype (DT_NONE: none) << 6 | state dtype << 8 */
layout(constant_id = 4) const uint CV = 4u | (3u << 6);
const uint DC = CV & 15u, CW_DT = (CV >> 4) & 3u, CB_DT = (CV >> 6) & 3u, CS_DT = (CV >> 8) & 3u;
layout(binding = 6) readonly buffer CW { uint cw[]; };
layout(binding = 7) readonly buffer CB { uint cb[]; };
layout(binding = 8) writeonly buffer CO { float co[]; };
layout(binding = 9) readonly buffer Idx { int idx[]; };
layout(binding = 10) buffer CS { uint cst[]; };
layout(binding = 8) writeonly buffer CO4 { vec4 co4[]; };
layout(binding = 10) buffer CS4 { vec4 cst4[]; };
#endif

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
#ifdef CONV
    /* the conv: column of channel 0, channels, state slots; offsets of
     * cw, cb, co (elements) and of the src / dst slot tables in idx */
    uint cv_c0, conv_dim, n_slots, cw_off, cb_off, co_off, src_off, dst_off;
#endif
    uint tc0, t_slices, t_ld, t_stride; /* the tail columns (above; after CONV's words) */
} p;

#ifdef CONV
/* Channel cc of stream r's conv, x its token's input. */
void conv_one(uint r, uint cc, float x)
{
    float win[DC > 1u ? DC - 1u : 1u], wk[DC];
    int src = idx[p.src_off + r];
    bool ok = src >= 0 && uint(src) < p.n_slots;
    uint base = (ok ? uint(src) : 0u) * (DC - 1u) * p.conv_dim + cc;
    for (uint k = 0u; k + 1u < DC; k++)
        win[k] = ok ? LOAD_F(cst, base + k * p.conv_dim, CS_DT) : 0.0;
    for (uint k = 0u; k < DC; k++)
        wk[k] = LOAD_F(cw, p.cw_off + cc * DC + k, CW_DT);
    float acc = CB_DT != DT_NONE ? LOAD_F(cb, p.cb_off + cc, CB_DT) : 0.0;
    for (uint k = 0u; k + 1u < DC; k++)
        acc += wk[k] * win[k];
    acc += wk[DC - 1u] * x;
    co[p.co_off + r * p.conv_dim + cc] = silu(acc);
    int dst = idx[p.dst_off + r];
    if (dst >= 0 && uint(dst) < p.n_slots) {
        uint db = uint(dst) * (DC - 1u) * p.conv_dim + cc;
        for (uint k = 0u; k + 2u < DC; k++)
            STORE_F(cst, db + k * p.conv_dim, CS_DT, win[k + 1u]);
        STORE_F(cst, db + (DC - 2u) * p.conv_dim, CS_DT, x);
    }
}

/* Channels cc .. cc + 3 of stream r's conv (VEC4: cc, conv_dim and co_off
 * multiples of 4), x their inputs: with an f32 state its rows move as
 * 16-byte vectors and each channel's arithmetic is conv_one's, component
 * by component; other states channel by channel. */
void conv_four(uint r, uint cc, vec4 x)
{
    if (CS_DT != DT_F32) {
        for (uint j = 0u; j < 4u; j++)
            conv_one(r, cc + j, x[j]);
        return;
    }
    vec4 win[DC > 1u ? DC - 1u : 1u], wk[DC];
    uint cd4 = p.conv_dim / 4u;
    int src = idx[p.src_off + r];
    bool ok = src >= 0 && uint(src) < p.n_slots;
    uint base = (ok ? uint(src) : 0u) * (DC - 1u) * cd4 + cc / 4u;
    for (uint k = 0u; k + 1u < DC; k++)
        win[k] = ok ? cst4[base + k * cd4] : vec4(0.0);
    for (uint k = 0u; k < DC; k++)
        for (uint j = 0u; j < 4u; j++)
            wk[k][j] = LOAD_F(cw, p.cw_off + (cc + j) * DC + k, CW_DT);
    vec4 acc = vec4(0.0);
    if (CB_DT != DT_NONE)
        for (uint j = 0u; j < 4u; j++)
            acc[j] = LOAD_F(cb, p.cb_off + cc + j, CB_DT);
    for (uint k = 0u; k + 1u < DC; k++)
        acc += wk[k] * win[k];
    acc += wk[DC - 1u] * x;
    co4[(p.co_off + r * p.conv_dim + cc) / 4u] =
        vec4(silu(acc.x), silu(acc.y), silu(acc.z), silu(acc.w));
    int dst = idx[p.dst_off + r];
    if (dst >= 0 && uint(dst) < p.n_slots) {
        uint db = uint(dst) * (DC - 1u) * cd4 + cc / 4u;
        for (uint k = 0u; k + 2u < DC; k++)
            cst4[db + k * cd4] = win[k + 1u];
        cst4[db + (DC - 2u) * cd4] = x;
    }
}
#endif

/* floats (part_off included) of slice 1 of row r's column c at c >= tc0,
 * the slices after it t_stride apart */
uint tail_at(uint r, uint c)
{
    return p.part_off + p.slice_stride + r * p.t_ld + c - p.tc0;
}

void main()
{
    uint i = global_id();
    if (VEC4 != 0u) {
        uint n4 = p.n / 4u;
        if (i >= p.m * n4)
            return;
        uint r = i / n4, c4 = i % n4, at = (p.part_off + r * p.ldp) / 4u + c4;
        vec4 sum = part4[at];
        uint c = 4u * c4;
        if (c < p.tc0) {
            for (uint s = 1u; s < p.n_slices; s++)
                sum += part4[at + s * (p.slice_stride / 4u)];
        } else {
            uint at_t = tail_at(r, c) / 4u;
            for (uint s = 1u; s < p.t_slices; s++)
                sum += part4[at_t + (s - 1u) * (p.t_stride / 4u)];
        }
        vec4 val = ldexp(sum, ivec4(ex[p.e_off + r]));
        if (p.o_off != NO_OUT)
            o4[p.o_off / 4u + i] = val;
        if (NDST > 0u && c - p.c0_0 < p.w_0)
            d04[(p.d_0 + r * p.w_0 + c - p.c0_0) / 4u] = val;
        if (NDST > 1u && c - p.c0_1 < p.w_1)
            d14[(p.d_1 + r * p.w_1 + c - p.c0_1) / 4u] = val;
        if (NDST > 2u && c - p.c0_2 < p.w_2)
            d24[(p.d_2 + r * p.w_2 + c - p.c0_2) / 4u] = val;
#ifdef CONV
        if (c - p.cv_c0 < p.conv_dim)
            conv_four(r, c - p.cv_c0, val);
#endif
        return;
    }
    if (i >= p.m * p.n)
        return;
    uint r = i / p.n, c = i % p.n, at = p.part_off + r * p.ldp + c;
    float sum = part[at];
    if (c < p.tc0) {
        for (uint s = 1u; s < p.n_slices; s++)
            sum += part[at + s * p.slice_stride];
    } else {
        uint at_t = tail_at(r, c);
        for (uint s = 1u; s < p.t_slices; s++)
            sum += part[at_t + (s - 1u) * p.t_stride];
    }
    float val = ldexp(sum, ex[p.e_off + r]);
    if (ADDX != 0u) {
        uint at_x = p.d_0 + r * p.w_0 + c - p.c0_0;
        d0[at_x] = d0[at_x] + val;
        return;
    }
    if (p.o_off != NO_OUT)
        o[p.o_off + i] = val;
    if (NDST > 0u && c - p.c0_0 < p.w_0)
        d0[p.d_0 + r * p.w_0 + c - p.c0_0] = val;
    if (NDST > 1u && c - p.c0_1 < p.w_1)
        d1[p.d_1 + r * p.w_1 + c - p.c0_1] = val;
    if (NDST > 2u && c - p.c0_2 < p.w_2)
        d2[p.d_2 + r * p.w_2 + c - p.c0_2] = val;
#ifdef CONV
    if (c - p.cv_c0 < p.conv_dim)
        conv_one(r, c - p.cv_c0, val);
#endif
}

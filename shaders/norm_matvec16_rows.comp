#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
// llmem-shader: norm_matvec16_rows:USE_SUBGROUP=1
// llmem-shader: norm_matvec16_conv:CONV=1
/* The fused decode matmul of one activation row (llmem_op_norm_matmul,
 * T = 1), laid out as matvec16.comp's one-row GEMV: out[n] =
 * epilogue(r * (g * nw) · w[n]ᵀ), g = x (gated: x * silu(z)), r = 1 /
 * sqrt(mean(g²) + eps) (1 without a norm); the same contract as
 * norm_matvec16.comp, with a different launch: no persistent workgroups
 * and no activation kept in registers. TPR invocations share a group of
 * NR weight rows; each loads a uvec4 (8 f16/bf16 weights) of each row per
 * step, UNROLL steps ahead, and forms the matching 8 elements of g * nw
 * from x (z, nw) as it goes (L1/L2 hits: every group reads the same row),
 * adding g² once per group. So the norm costs no pass before the first
 * weight load and no barrier: r is one scalar for the row, applied to the
 * finished dot products. The TPR partial sums (and the sum of squares) are
 * reduced by subgroupAdd, then the group's subgroups in order through
 * shared memory; every group sums its rows, and the squares, in the same
 * order, so every output uses the same r and does not depend on which
 * workgroup ran it. Needs k % 8 == 0, x (and z) and weight rows 16-byte
 * aligned, subgroups that divide TPR; the host checks them. RMS norm:
 * Zhang & Sennrich 2019; gated: Mamba-2 (Dao & Gu 2024); SwiGLU: Shazeer
 * 2020.
 * PF (vk_ops_norm_matmul.c, $LLMEM_VULKAN_L2_PREFETCH): the workgroup also
 * loads one uvec4 of each 32-byte sector of its share of binding 7, the
 * first bytes of the next product's weights, so that they are in L2 when
 * that dispatch starts (what CUDA's programmatic dependent launch gives a
 * kernel that reads its weights before waiting); 1: after the outputs, 2:
 * at most 2 loads per invocation issued before the weights. Their values
 * feed a store that never happens (p.n == 0 means no workgroups).
 * CONV (the module norm_matvec16_conv, vk_ops_norm_matmul.c's decode conv
 * fold; EPI 0, one stream): constant 9 is the conv's d_conv and dtypes
 * instead of PF, and each output n in [c0, c0 + conv_dim) is also input
 * channel c = n - c0 of Mamba-2's one-token causal conv1d, done by the
 * invocation that stores it, as ssm_conv.comp does it (the same arithmetic
 * in the same order): out_c = silu(b[c] + sum_k cw[c, k] * u_k), u = the
 * DC - 1 states of slot src_slot[0] (zeros outside [0, n_slots)), then
 * out[n]; the state shifted by one into slot dst_slot[0] (skipped outside
 * [0, n_slots)). Its state, weights and bias are read before the weights,
 * as the residual is. */
#if defined(CONV) && !defined(USE_SUBGROUP)
#define USE_SUBGROUP 1
#endif
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 2;  /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint NORM = 1;  /* 0 none, 1 RMS, 2 gated RMS */
layout(constant_id = 3) const uint EPI = 0;   /* 0 store, 1 add, 2 SwiGLU */
layout(constant_id = 4) const uint NW_DT = 3; /* the norm weight's dtype; DT_NONE: none */
layout(constant_id = 5) const uint TPR = 128; /* invocations per group of rows; divides WG */
layout(constant_id = 6) const uint NR = 1;    /* weight rows per group */
layout(constant_id = 7) const uint NW_VEC = 0; /* 1: the norm weight read as uvec4 (binding 6) */
layout(constant_id = 8) const uint UNR = 0;    /* 16-byte loads per row and invocation issued
                                                  before their FMAs; 0: 2 */
#ifdef CONV
/* d_conv | conv weight dtype << 4 | bias dtype (DT_NONE: none) << 6 | state dtype << 8 */
layout(constant_id = 9) const uint CV = 4u | (3u << 6);
const uint PF = 0u;
const uint DC = CV & 15u, CW_DT = (CV >> 4) & 3u, CB_DT = (CV >> 6) & 3u, CS_DT = (CV >> 8) & 3u;
#else
layout(constant_id = 9) const uint PF = 0;     /* 0 off, 1 prefetch at the end, 2 at the start */
#endif

const uint UNROLL = UNR != 0u ? UNR : 2u;

layout(binding = 0) readonly buffer X { vec4 x[]; };
layout(binding = 1) readonly buffer Z { vec4 z[]; };
layout(binding = 2) readonly buffer NWB { uint nw[]; };
layout(binding = 3) readonly buffer W { uvec4 w[]; };
layout(binding = 4) readonly buffer W2 { uvec4 w2[]; };
layout(binding = 5) buffer O { float o[]; };
layout(binding = 6) readonly buffer NWV { uvec4 nwv[]; };
#ifdef CONV
layout(binding = 7) readonly buffer CW { uint cw[]; };
layout(binding = 8) readonly buffer CB { uint cb[]; };
layout(binding = 9) readonly buffer Idx { int idx[]; };
layout(binding = 10) buffer CS { uint cst[]; };
layout(binding = 11) writeonly buffer CO { float co[]; };
#else
layout(binding = 7) readonly buffer PFB { uvec4 pf[]; };
#endif

layout(push_constant) uniform P {
    uint n, k;
    uint x_off, z_off;  /* vec4s */
    uint nw_off;        /* elements of NW_DT (NW_VEC: uvec4s) */
    uint w_off, w2_off; /* uvec4s */
    uint o_off;         /* floats */
    float eps;
    uint pf_off;        /* uvec4s */
    uint pf_n, pf_per;  /* 32-byte sectors of the slice, per workgroup */
#ifdef CONV
    uint c0, conv_dim, n_slots; /* output row of channel 0; channels; state slots */
    uint cw_off, cb_off, co_off; /* elements of bindings 7, 8, 11 */
    uint src_off, dst_off;       /* words of binding 9: the slot tables */
#endif
} p;

const uint NW = EPI == 2u ? 2u : 1u; /* weight matrices */
const uint S = NW * NR + 1u;         /* sums per subgroup: products, sum of squares */
const uint NSUB = WG / 4u;           /* subgroups at most */
shared float red[NSUB * S];

vec2 widen(uint u)
{
    if (W_DT == 1u)
        return unpackHalf2x16(u);
    return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xffff0000u));
}

vec2 widen_nw(uint u)
{
    if (NW_DT == DT_F16)
        return unpackHalf2x16(u);
    return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xffff0000u));
}

vec4 silu4(vec4 v)
{
    return vec4(silu(v.x), silu(v.y), silu(v.z), silu(v.w));
}

/* norm weight elements [8 jj, 8 jj + 8) */
void nw8(uint jj, out vec4 n0, out vec4 n1)
{
    if (NW_VEC != 0u && NW_DT == DT_F32) {
        n0 = uintBitsToFloat(nwv[p.nw_off + 2u * jj]);
        n1 = uintBitsToFloat(nwv[p.nw_off + 2u * jj + 1u]);
    } else if (NW_VEC != 0u) {
        uvec4 q = nwv[p.nw_off + jj];
        n0 = vec4(widen_nw(q.x), widen_nw(q.y));
        n1 = vec4(widen_nw(q.z), widen_nw(q.w));
    } else {
        uint e = p.nw_off + 8u * jj;
        n0 = vec4(LOAD_F(nw, e, NW_DT), LOAD_F(nw, e + 1u, NW_DT), LOAD_F(nw, e + 2u, NW_DT),
                  LOAD_F(nw, e + 3u, NW_DT));
        n1 = vec4(LOAD_F(nw, e + 4u, NW_DT), LOAD_F(nw, e + 5u, NW_DT),
                  LOAD_F(nw, e + 6u, NW_DT), LOAD_F(nw, e + 7u, NW_DT));
    }
}

/* sector i of the slice, 0 past its end */
uint pf_load(uint i)
{
#ifdef CONV
    return 0u;
#else
    return i < p.pf_n ? pf[p.pf_off + 2u * i].x : 0u;
#endif
}

void main()
{
    const uint RPW = WG / TPR; /* groups per workgroup */
    uint l = gl_LocalInvocationID.x;
    uint lane = l % TPR, grp = l / TPR;
    uint n0 = (group_id() * RPW + grp) * NR; /* first weight row of the group */
    uint kv = p.k / 8u;
    float acc[NW * NR];
    [[unroll]] for (uint i = 0u; i < NW * NR; i++)
        acc[i] = 0.0;
    float ss = 0.0;
    /* the residual of this invocation's output (EPI 1), read before the weights so that its
     * load is not one more round trip after the reduction */
    uint per = gl_NumSubgroups / RPW; /* subgroups per group */
    bool outv = l < RPW * NR;
    uint nn = (group_id() * RPW + l / NR) * NR + l % NR;
    float res = 0.0;
    if (EPI == 1u && outv && nn < p.n)
        res = o[p.o_off + nn];
#ifdef CONV
    bool cv = outv && nn < p.n && nn >= p.c0 && nn - p.c0 < p.conv_dim;
    uint cc = cv ? nn - p.c0 : 0u;
    float win[DC > 1u ? DC - 1u : 1u], wk[DC];
    float cbias = 0.0;
    int cdst = -1;
    if (cv) {
        int src = idx[p.src_off];
        cdst = idx[p.dst_off];
        bool ok = src >= 0 && uint(src) < p.n_slots;
        uint base = (ok ? uint(src) : 0u) * (DC - 1u) * p.conv_dim + cc;
        for (uint k = 0u; k + 1u < DC; k++)
            win[k] = ok ? LOAD_F(cst, base + k * p.conv_dim, CS_DT) : 0.0;
        for (uint k = 0u; k < DC; k++)
            wk[k] = LOAD_F(cw, p.cw_off + cc * DC + k, CW_DT);
        cbias = CB_DT != DT_NONE ? LOAD_F(cb, p.cb_off + cc, CB_DT) : 0.0;
    }
#endif
    uint pfb = group_id() * p.pf_per, pfh = 0u;
    if (PF == 2u) /* the host keeps pf_per <= 2 WG */
        pfh = (l < p.pf_per ? pf_load(pfb + l) : 0u) ^
              (l + WG < p.pf_per ? pf_load(pfb + l + WG) : 0u);
    for (uint j = lane; j < kv; j += TPR * UNROLL) {
        uvec4 q[UNROLL * NR * NW];
        [[unroll]] for (uint u = 0u; u < UNROLL; u++)
            [[unroll]] for (uint r = 0u; r < NR; r++) {
                uint jj = j + u * TPR;
                bool inb = jj < kv && n0 + r < p.n;
                uint at = (n0 + r) * kv + jj;
                q[u * NR + r] = inb ? w[p.w_off + at] : uvec4(0u);
                if (NW == 2u)
                    q[(UNROLL + u) * NR + r] = inb ? w2[p.w2_off + at] : uvec4(0u);
            }
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            uint jj = j + u * TPR;
            if (jj >= kv)
                break;
            vec4 a0 = x[p.x_off + 2u * jj], a1 = x[p.x_off + 2u * jj + 1u];
            if (NORM == 2u) {
                a0 *= silu4(z[p.z_off + 2u * jj]);
                a1 *= silu4(z[p.z_off + 2u * jj + 1u]);
            }
            if (NORM != 0u) {
                ss += dot(a0, a0) + dot(a1, a1);
                if (NW_DT != DT_NONE) {
                    vec4 m0, m1;
                    nw8(jj, m0, m1);
                    a0 *= m0;
                    a1 *= m1;
                }
            }
            [[unroll]] for (uint mt = 0u; mt < NW; mt++)
                [[unroll]] for (uint r = 0u; r < NR; r++) {
                    uvec4 qq = q[(mt * UNROLL + u) * NR + r];
                    acc[mt * NR + r] += dot(a0, vec4(widen(qq.x), widen(qq.y))) +
                                        dot(a1, vec4(widen(qq.z), widen(qq.w)));
                }
        }
    }
    [[unroll]] for (uint i = 0u; i < NW * NR; i++) {
        float s = subgroupAdd(acc[i]);
        if (subgroupElect())
            red[gl_SubgroupID * S + i] = s;
    }
    if (NORM != 0u) {
        float s = subgroupAdd(ss);
        if (subgroupElect())
            red[gl_SubgroupID * S + NW * NR] = s;
    }
    barrier();
    /* one invocation per output: the group's subgroups in order */
    if (outv) {
        uint g = l / NR, r = l % NR;
        float s = 0.0, u = 0.0, t = 0.0;
        for (uint sg = g * per; sg < (g + 1u) * per; sg++) {
            s += red[sg * S + r];
            if (NW == 2u)
                u += red[sg * S + NR + r];
            if (NORM != 0u)
                t += red[sg * S + NW * NR];
        }
        float sc = NORM != 0u ? 1.0 / sqrt(t / float(p.k) + p.eps) : 1.0;
        if (nn < p.n) {
            s *= sc;
            if (EPI == 2u)
                o[p.o_off + nn] = silu(s) * (u * sc);
            else if (EPI == 1u)
                o[p.o_off + nn] = res + s;
            else
                o[p.o_off + nn] = s;
#ifdef CONV
            if (cv) {
                float acc = cbias;
                for (uint k = 0u; k + 1u < DC; k++)
                    acc += wk[k] * win[k];
                acc += wk[DC - 1u] * s;
                co[p.co_off + cc] = silu(acc);
                if (cdst >= 0 && uint(cdst) < p.n_slots) {
                    uint db = uint(cdst) * (DC - 1u) * p.conv_dim + cc;
                    for (uint k = 0u; k + 2u < DC; k++)
                        STORE_F(cst, db + k * p.conv_dim, CS_DT, win[k + 1u]);
                    STORE_F(cst, db + (DC - 2u) * p.conv_dim, CS_DT, s);
                }
            }
#endif
        }
    }
    if (PF == 1u)
        for (uint i = l; i < p.pf_per; i += WG)
            pfh ^= pf_load(pfb + i);
    if (PF != 0u && pfh == 0x9e3779b9u && p.n == 0u)
        o[p.o_off] = 0.0;
}

#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : require
// llmem-shader: norm_matvec16:USE_SUBGROUP=1
/* The fused decode matmul of one activation row (llmem_op_norm_matmul,
 * <llmem/ops_norm_matmul.h>, T = 1): out[n] = epilogue(a · w[n]ᵀ) with
 *   a = x                            (NORM 0)
 *   a = x * r * nw                   (NORM 1, RMS norm, Zhang & Sennrich 2019)
 *   a = g * r * nw, g = x * silu(z)  (NORM 2, Mamba-2's gated norm, one group)
 *   r = 1 / sqrt(mean(g²) + eps)     (g = x without the gate)
 * and the epilogue a store, a residual add (out += ...) or SwiGLU
 * (silu(a · wᵀ) * (a · w2ᵀ), Shazeer 2020).
 *
 * r is one scalar per row, so it is not applied to the row before the
 * products: every invocation keeps its C 16-byte chunks of K (8 elements
 * each, chunks l, l + WG, ...) as g * nw in registers for the whole
 * dispatch, and r multiplies the finished dot products in the epilogue.
 * The sum of squares of g comes from the same registers and is reduced
 * with the first step's products, so there is no prologue and no barrier
 * before the first weight load: the first rows' weights are requested
 * before x (and z) are read. A workgroup walks blocks of R weight rows
 * p.groups apart (the host dispatches about as many workgroups as stay
 * resident); each step loads its chunks of the R rows (16-byte loads of 8
 * f16/bf16 weights), adds the products per invocation, issues the next
 * step's loads, then reduces: subgroupAdd, then the subgroups' sums in
 * subgroup order through shared memory (two buffers, one barrier a step).
 * Every row is summed in the same order whichever workgroup takes it.
 * The design follows kernels/gemv.cu (the CUDA row-block GEMV). Needs
 * subgroups of 4 or more invocations, k % 8 == 0, k <= 8 * C * WG, x (and
 * z) 16-byte aligned, weight rows 16-byte aligned; the host checks them. */
#include "common.glsl"

layout(constant_id = 1) const uint W_DT = 2;  /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint NORM = 1;  /* 0 none, 1 RMS, 2 gated RMS */
layout(constant_id = 3) const uint EPI = 0;   /* 0 store, 1 add, 2 SwiGLU */
layout(constant_id = 4) const uint NW_DT = 3; /* the norm weight's dtype; DT_NONE: none */
layout(constant_id = 5) const uint C = 1;     /* 16-byte chunks of K per invocation */
layout(constant_id = 6) const uint R = 2;     /* weight rows per step */

layout(binding = 0) readonly buffer X { vec4 x[]; };
layout(binding = 1) readonly buffer Z { vec4 z[]; };
layout(binding = 2) readonly buffer NWB { uint nw[]; };
layout(binding = 3) readonly buffer W { uvec4 w[]; };
layout(binding = 4) readonly buffer W2 { uvec4 w2[]; };
layout(binding = 5) buffer O { float o[]; };

layout(push_constant) uniform P {
    uint n, k;
    uint x_off, z_off;  /* vec4s */
    uint nw_off;        /* elements of NW_DT */
    uint w_off, w2_off; /* uvec4s */
    uint o_off;         /* floats */
    float eps;
    uint groups; /* workgroups dispatched */
} p;

const uint NW = EPI == 2u ? 2u : 1u; /* weight matrices */
const uint S = NW * R + 1u;          /* sums a step reduces: products, sum of squares */
const uint NSUB = WG / 4u;           /* subgroups at most */
shared float red[2u * NSUB * S];

vec2 widen(uint u)
{
    if (W_DT == 1u)
        return unpackHalf2x16(u);
    return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xffff0000u));
}

float dot8(vec4 a0, vec4 a1, uvec4 q)
{
    return dot(a0, vec4(widen(q.x), widen(q.y))) + dot(a1, vec4(widen(q.z), widen(q.w)));
}

vec4 silu4(vec4 v)
{
    return vec4(silu(v.x), silu(v.y), silu(v.z), silu(v.w));
}

vec4 nw4(uint e)
{
    return vec4(LOAD_F(nw, e, NW_DT), LOAD_F(nw, e + 1u, NW_DT), LOAD_F(nw, e + 2u, NW_DT),
                LOAD_F(nw, e + 3u, NW_DT));
}

/* This invocation's chunks of weight rows [gg R, gg R + R) into wv (zero
 * past n and past k) */
#define FETCH(gg)                                                                             \
    [[unroll]] for (uint mt = 0u; mt < NW; mt++)                                              \
        [[unroll]] for (uint rr = 0u; rr < R; rr++)                                           \
            [[unroll]] for (uint j = 0u; j < C; j++) {                                        \
                uint row_ = (gg) * R + rr, c_ = l + j * WG;                                   \
                bool in_ = row_ < p.n && c_ < kv;                                             \
                uint at_ = row_ * kv + c_;                                                    \
                wv[(mt * R + rr) * C + j] =                                                   \
                    !in_ ? uvec4(0u) : mt == 0u ? w[p.w_off + at_] : w2[p.w2_off + at_];      \
            }

void main()
{
    uint l = gl_LocalInvocationID.x;
    uint kv = p.k / 8u;
    uint nblk = (p.n + R - 1u) / R;
    uint g = group_id();
    if (g >= nblk) /* the whole workgroup (the host dispatches at most nblk) */
        return;
    uvec4 wv[NW * R * C];
    FETCH(g);

    /* the activation chunks, g * nw, and the sum of squares of g */
    vec4 av[2u * C];
    float ss = 0.0;
    [[unroll]] for (uint j = 0u; j < C; j++) {
        uint c = l + j * WG;
        vec4 a0 = vec4(0.0), a1 = vec4(0.0);
        if (c < kv) {
            a0 = x[p.x_off + 2u * c];
            a1 = x[p.x_off + 2u * c + 1u];
            if (NORM == 2u) {
                a0 *= silu4(z[p.z_off + 2u * c]);
                a1 *= silu4(z[p.z_off + 2u * c + 1u]);
            }
            if (NORM != 0u) {
                ss += dot(a0, a0) + dot(a1, a1);
                if (NW_DT != DT_NONE) {
                    a0 *= nw4(p.nw_off + 8u * c);
                    a1 *= nw4(p.nw_off + 8u * c + 4u);
                }
            }
        }
        av[2u * j] = a0;
        av[2u * j + 1u] = a1;
    }

    float r = 1.0; /* the norm's scale, known to the epilogue invocations after step 1 */
    uint buf = 0u;
    bool first = true;
    for (;;) {
        /* the residual add's input, loaded now so its latency hides behind the step */
        float prev = 0.0;
        if (EPI == 1u && l < R && g * R + l < p.n)
            prev = o[p.o_off + g * R + l];
        float acc[NW * R];
        [[unroll]] for (uint i = 0u; i < NW * R; i++)
            acc[i] = 0.0;
        [[unroll]] for (uint j = 0u; j < C; j++)
            [[unroll]] for (uint i = 0u; i < NW * R; i++)
                acc[i] += dot8(av[2u * j], av[2u * j + 1u], wv[i * C + j]);
        uint gn = g + p.groups;
        if (gn < nblk) {
            FETCH(gn);
        }
        uint base = (buf * NSUB + gl_SubgroupID) * S;
        [[unroll]] for (uint i = 0u; i < NW * R; i++) {
            float s = subgroupAdd(acc[i]);
            if (subgroupElect())
                red[base + i] = s;
        }
        if (NORM != 0u && first) {
            float s = subgroupAdd(ss);
            if (subgroupElect())
                red[base + NW * R] = s;
        }
        barrier();
        if (l < R) {
            uint b0 = buf * NSUB * S;
            if (NORM != 0u && first) {
                float t = 0.0;
                for (uint sg = 0u; sg < gl_NumSubgroups; sg++)
                    t += red[b0 + sg * S + NW * R];
                r = 1.0 / sqrt(t / float(p.k) + p.eps);
            }
            uint row = g * R + l;
            if (row < p.n) {
                float s = 0.0, u = 0.0;
                for (uint sg = 0u; sg < gl_NumSubgroups; sg++) {
                    s += red[b0 + sg * S + l];
                    if (NW == 2u)
                        u += red[b0 + sg * S + R + l];
                }
                s *= r;
                if (EPI == 2u)
                    o[p.o_off + row] = silu(s) * (u * r);
                else if (EPI == 1u)
                    o[p.o_off + row] = prev + s;
                else
                    o[p.o_off + row] = s;
            }
        }
        first = false;
        buf ^= 1u;
        g = gn;
        if (g >= nblk)
            break;
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-2 selective scan, one token per stream (decode): the same update
 * as ssm_scan.comp (Dao & Gu 2024, "Transformers are SSMs", Sec. 3 eq. (2),
 * scalar A per head; HF Mamba2Mixer.torch_forward single-step path):
 *   dt_h = clamp(softplus(dt[s, h] + dt_bias[h]), dt_min, dt_max)
 *   S_h  = exp(dt_h * A_h) * S_h + dt_h * x_h ⊗ B_g,   A_h = -exp(A_log[h])
 *   y_h  = S_h · C_g + D[h] * x_h
 * Lanes over d_state: a state row S[s, h, p, 0..N) is owned by L = N / 4
 * consecutive invocations, each holding 4 consecutive elements, loaded
 * and stored as one 16-byte vector (f32 state) or one 8-byte vector
 * (f16/bf16), so a warp moves whole 512-byte rows; WG / L invocation
 * groups per workgroup, each doing RPI rows (all loads issued first). y = C · S is reduced over the
 * row's lanes through shared memory (USE_SUBGROUP: with subgroupAdd when
 * a row is exactly one subgroup). The host uses this shader when
 * n_seq_tokens == 1, there are no checkpoints and N % 4 == 0,
 * N / 4 <= WG. States are read from src_slot[s] (-1: zeros; with SNAP
 * from the f32 snapshot of state_gather) and written, in the state dtype,
 * to dst_slot[s]; each invocation reads its elements before writing them,
 * so src and dst may alias. */
#include "common.glsl"

layout(constant_id = 1) const uint N = 128; /* d_state, N % 4 == 0 */
layout(constant_id = 2) const uint ST_DT = 0;
layout(constant_id = 3) const uint A_DT = 0;
layout(constant_id = 4) const uint D_DT = 0;  /* DT_NONE: no D */
layout(constant_id = 5) const uint DB_DT = 0; /* DT_NONE: no dt_bias */
layout(constant_id = 6) const uint SNAP = 0;
layout(constant_id = 7) const uint RPI = 2; /* rows per invocation group */

layout(binding = 0) readonly buffer Xbc { float xbc[]; };
layout(binding = 1) readonly buffer Dt { float dt[]; };
layout(binding = 2) readonly buffer Al { uint a_log[]; };
layout(binding = 3) readonly buffer Dd { uint dd[]; };
layout(binding = 4) readonly buffer Db { uint dt_bias[]; };
layout(binding = 5) writeonly buffer Y { float y[]; };
layout(binding = 6) readonly buffer Idx { int idx[]; };
/* the state buffer, seen as 16-byte (f32) or 8-byte (f16/bf16) vectors */
layout(binding = 7) buffer St4 { uvec4 st4[]; };
layout(binding = 7) buffer St2 { uvec2 st2[]; };
layout(binding = 8) readonly buffer Snap { vec4 snap4[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, n_heads, head_dim, n_groups, n_ckpt, n_slots, n_chunks;
    float dt_min, dt_max;
    uint xbc_off, dt_off, a_off, d_off, db_off, y_off, src_off, dst_off, ckpt_off, conv_dim;
} p;

const uint L = N / 4u;  /* lanes per state row */
const uint R = WG / L;  /* rows per workgroup */

shared float part[WG];

vec4 half4(uvec2 w)
{
    return vec4(half_to_f32(w.x & 0xffffu, ST_DT), half_to_f32(w.x >> 16, ST_DT),
                half_to_f32(w.y & 0xffffu, ST_DT), half_to_f32(w.y >> 16, ST_DT));
}

uvec2 pack4(vec4 v)
{
    return uvec2(f32_to_half(v.x, ST_DT) | (f32_to_half(v.y, ST_DT) << 16),
                 f32_to_half(v.z, ST_DT) | (f32_to_half(v.w, ST_DT) << 16));
}

/* Where row `row` (of all streams' rows) lives; false past the last one. */
bool locate(uint row, out uint s, out uint hp)
{
    uint rows_per_seq = p.n_heads * p.head_dim;
    s = row / rows_per_seq;
    hp = row % rows_per_seq;
    return s < p.n_seqs;
}

void main()
{
#if USE_SUBGROUP
    /* lanes numbered subgroup by subgroup, so that a row of L lanes lies in
     * one subgroup whatever the invocation-to-subgroup mapping (WG is a
     * multiple of the subgroup size) */
    uint l = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#else
    uint l = gl_LocalInvocationID.x;
#endif
    uint rl = l / L, j = l % L; /* row group in the workgroup, lane in the row */
    uint rows_per_seq = p.n_heads * p.head_dim;
    uint slot_elems = rows_per_seq * N;
    /* RPI rows per invocation group, R rows apart: all state loads are
     * issued before any arithmetic, RPI 16-byte loads in flight per lane */
    vec4 S[RPI];
    for (uint k = 0u; k < RPI; k++) {
        uint s, hp;
        S[k] = vec4(0.0);
        if (rl < R && locate((group_id() * RPI + k) * R + rl, s, hp)) {
            uint at = hp * N + 4u * j; /* element of the slot */
            if (SNAP != 0u) {
                S[k] = snap4[(s * slot_elems + at) >> 2];
            } else {
                int src = idx[p.src_off + s];
                if (src >= 0 && uint(src) < p.n_slots) {
                    uint e = uint(src) * slot_elems + at;
                    S[k] = ST_DT == DT_F32 ? uintBitsToFloat(st4[e >> 2]) : half4(st2[e >> 2]);
                }
            }
        }
    }
    for (uint k = 0u; k < RPI; k++) {
        uint s, hp;
        bool act = rl < R && locate((group_id() * RPI + k) * R + rl, s, hp);
        float acc = 0.0, xv = 0.0, Dh = 0.0;
        if (act) {
            uint h = hp / p.head_dim;
            uint grp = h / (p.n_heads / p.n_groups);
            uint at = hp * N + 4u * j;
            float A = -exp(LOAD_F(a_log, p.a_off + h, A_DT));
            Dh = D_DT != DT_NONE ? LOAD_F(dd, p.d_off + h, D_DT) : 0.0;
            float bias = DB_DT != DT_NONE ? LOAD_F(dt_bias, p.db_off + h, DB_DT) : 0.0;
            float dtv = softplus(dt[p.dt_off + s * p.n_heads + h] + bias);
            dtv = dtv < p.dt_min ? p.dt_min : dtv;
            dtv = dtv > p.dt_max ? p.dt_max : dtv;
            float dA = exp(dtv * A);
            uint rb = p.xbc_off + s * p.conv_dim;
            uint bo = rb + rows_per_seq + grp * N + 4u * j;
            uint co = bo + p.n_groups * N;
            vec4 Bv = vec4(xbc[bo], xbc[bo + 1u], xbc[bo + 2u], xbc[bo + 3u]);
            vec4 Cv = vec4(xbc[co], xbc[co + 1u], xbc[co + 2u], xbc[co + 3u]);
            xv = xbc[rb + hp];
            vec4 Sn = S[k] * dA + (xv * dtv) * Bv;
            acc = dot(Sn, Cv);
            int dst = idx[p.dst_off + s];
            if (dst >= 0 && uint(dst) < p.n_slots) {
                uint e = uint(dst) * slot_elems + at;
                if (ST_DT == DT_F32)
                    st4[e >> 2] = floatBitsToUint(Sn);
                else
                    st2[e >> 2] = pack4(Sn);
            }
        }
        uint yo = p.y_off + s * rows_per_seq + hp;
#if USE_SUBGROUP
        if (L == gl_SubgroupSize) {
            /* a row is one subgroup (rows start at multiples of L) */
            acc = subgroupAdd(acc);
            if (act && j == 0u)
                y[yo] = acc + Dh * xv;
            continue;
        }
#endif
        barrier();
        part[l] = acc;
        barrier();
        if (act && j == 0u) {
            float sum = 0.0;
            for (uint q = 0u; q < L; q++)
                sum += part[l + q];
            y[yo] = sum + Dh * xv;
        }
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-2 selective scan, one token per stream (decode): the same update
 * as ssm_scan.comp (Dao & Gu 2024, "Transformers are SSMs", Sec. 3 eq. (2),
 * scalar A per head; HF Mamba2Mixer.torch_forward single-step path):
 *   dt_h = clamp(softplus(dt[s, h] + dt_bias[h]), dt_min, dt_max)
 *   S_h  = exp(dt_h * A_h) * S_h + dt_h * x_h ⊗ B_g,   A_h = -exp(A_log[h])
 *   y_h  = S_h · C_g + D[h] * x_h
 * Lanes over d_state: a state row S[s, h, p, 0..N) is owned by L = N / 4
 * consecutive invocations (a lane group), each holding 4 consecutive
 * elements, loaded and stored as one 16-byte vector (f32 state) or one
 * 8-byte vector (f16/bf16), so a warp moves whole 512-byte rows.
 *
 * Work. An item is RPI consecutive rows of one (stream, head) (the host
 * makes RPI divide head_dim). Each lane group does IPG items one after
 * the other, R = WG / L lane groups of a workgroup taking R consecutive
 * items at each step, and loads the state rows of its next item before it
 * updates the current one (a register double buffer: the loads of item
 * k + 1 are in flight while item k is computed and stored). The head's
 * parameters, dt and B, C are reloaded only when the lane group's item
 * moves to another (stream, head) or (stream, group). y = C · S is
 * reduced over the row's lanes with subgroupAdd when a row is exactly
 * one subgroup (USE_SUBGROUP, d_state 128 on NVIDIA), else through shared
 * memory. The host uses this shader when n_seq_tokens == 1, there are no
 * checkpoints, N % 4 == 0 and N / 4 <= WG. States are read from
 * src_slot[s] (-1: zeros; with SNAP from the f32 snapshot of
 * state_gather) and written, in the state dtype, to dst_slot[s]; each
 * invocation reads its elements before writing them, and no invocation
 * reads an element another one writes, so src and dst may alias.
 *
 * CONV != 0 (the decode conv folded in, vk_ops_mamba.c): xbc is the
 * conv's input, and each value the scan reads of it (x of its rows, B and
 * C of its groups) is first put through ssm_conv.comp's one-token conv
 * with the conv state of slot src_slot[s] (same arithmetic, same order):
 *   u[c] = silu(b[c] + sum_k<DC-1 w[c, k] st[k][c] + w[c, DC-1] x[c]).
 * After its scan each workgroup writes the conv's effects: u[c] to the
 * conv output (binding 5, floats at co_off) and the shifted state
 * (st[1..DC-2], x[c]) to dst_slot[s], for the x channel of each of its
 * rows (no other workgroup reads those), and, for the B and C channels
 * of a (stream, group), only the last of the workgroups whose rows read
 * them: each takes a ticket on the group's arrival counter (binding 8)
 * after its reads, and the one that arrives last puts the counter back
 * to zero and writes (the arrival pattern of matmul_cm.comp's RAW 2), so
 * no workgroup reads a conv-state column after it is rewritten, and src
 * and dst may alias here too. Needs SNAP 0. */
#include "common.glsl"

layout(constant_id = 1) const uint N = 128; /* d_state, N % 4 == 0 */
layout(constant_id = 2) const uint ST_DT = 0;
layout(constant_id = 3) const uint A_DT = 0;
layout(constant_id = 4) const uint D_DT = 0;  /* DT_NONE: no D */
layout(constant_id = 5) const uint DB_DT = 0; /* DT_NONE: no dt_bias */
layout(constant_id = 6) const uint SNAP = 0;
layout(constant_id = 7) const uint RPI = 2; /* state rows per item, divides head_dim */
layout(constant_id = 8) const uint IPG = 1; /* items per lane group */
/* 0: xbc is the conv's output; else the conv folded in (see the top):
 * DC | conv weight dtype << 4 | conv bias dtype << 6 | conv state dtype << 8 */
layout(constant_id = 9) const uint CONV = 0;
const uint DC = CONV & 15u, CW_DT = (CONV >> 4) & 3u, CB_DT = (CONV >> 6) & 3u;
const uint CS_DT = (CONV >> 8) & 3u;

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
/* CONV: the arrival counters (binding 8 again: SNAP is 0), the conv's
 * weights [conv_dim][DC], bias and state [n_slots][DC - 1][conv_dim] */
layout(binding = 8) coherent buffer Cnt { uint cnt[]; };
layout(binding = 9) readonly buffer Cw { uint cw[]; };
layout(binding = 10) readonly buffer Cb { uint cb[]; };
layout(binding = 11) buffer Cs { uint cst[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, n_heads, head_dim, n_groups, n_ckpt, n_slots, n_chunks;
    float dt_min, dt_max;
    uint xbc_off, dt_off, a_off, d_off, db_off, y_off, src_off, dst_off, ckpt_off, conv_dim;
    uint cw_off, cb_off, co_off, cnt_off; /* CONV: elements of bindings 9, 10, 5, 8 */
} p;

const uint L = N / 4u;  /* lanes per state row */
const uint R = WG / L;  /* lane groups per workgroup */

shared float part[WG];
shared uint last_sh;

/* CONV: the conv output of channel c of stream s from the conv state of
 * slot src (ssm_conv.comp's one-token arithmetic, in its order). */
float conv_at(uint s, uint c, int src)
{
    uint cd = p.conv_dim;
    bool ok = src >= 0 && uint(src) < p.n_slots;
    uint base = uint(src) * (DC - 1u) * cd + c;
    float acc = CB_DT != DT_NONE ? LOAD_F(cb, p.cb_off + c, CB_DT) : 0.0;
    for (uint k = 0u; k + 1u < DC; k++) {
        float u = ok ? LOAD_F(cst, base + k * cd, CS_DT) : 0.0;
        acc += LOAD_F(cw, p.cw_off + c * DC + k, CW_DT) * u;
    }
    acc += LOAD_F(cw, p.cw_off + c * DC + DC - 1u, CW_DT) * xbc[p.xbc_off + s * cd + c];
    return silu(acc);
}

/* CONV: the conv's effects for channel c of stream s: its output, and
 * the state shifted by one input into slot dst_slot[s] (every old value
 * read before any is written). */
void conv_commit(uint s, uint c)
{
    uint cd = p.conv_dim;
    int src = idx[p.src_off + s], dst = idx[p.dst_off + s];
    y[p.co_off + s * cd + c] = conv_at(s, c, src);
    if (dst < 0 || uint(dst) >= p.n_slots)
        return;
    bool ok = src >= 0 && uint(src) < p.n_slots;
    float win[DC > 1u ? DC - 1u : 1u];
    uint sb = uint(src) * (DC - 1u) * cd + c;
    for (uint k = 0u; k + 1u < DC; k++)
        win[k] = ok && k + 2u < DC ? LOAD_F(cst, sb + (k + 1u) * cd, CS_DT) : 0.0;
    win[DC - 2u] = xbc[p.xbc_off + s * cd + c];
    for (uint k = 0u; k + 1u < DC; k++)
        STORE_F(cst, uint(dst) * (DC - 1u) * cd + k * cd + c, CS_DT, win[k]);
}

/* CONV: after the scan, the conv's effects for the channels this
 * workgroup read (see the top); called by every invocation. */
void conv_finish(uint l)
{
    uint rows_per_seq = p.n_heads * p.head_dim, total = p.n_seqs * rows_per_seq;
    uint W = IPG * R * RPI, r0 = group_id() * W, r1 = min(r0 + W, total);
    barrier(); /* this workgroup's reads of its x channels' states are done */
    for (uint r = r0 + l; r < r1; r += WG)
        conv_commit(r / rows_per_seq, r % rows_per_seq);
    uint GR = (p.n_heads / p.n_groups) * p.head_dim; /* rows of one (stream, group) */
    if (r0 >= r1)
        return;
    for (uint q = r0 / GR; q <= (r1 - 1u) / GR; q++) {
        uint readers = ((q + 1u) * GR - 1u) / W - (q * GR) / W + 1u;
        memoryBarrierBuffer();
        barrier();
        if (l == 0u) {
            uint before = readers > 1u ? atomicAdd(cnt[p.cnt_off + q], 1u) : 0u;
            if (readers > 1u && before == readers - 1u)
                atomicExchange(cnt[p.cnt_off + q], 0u);
            last_sh = before == readers - 1u ? 1u : 0u;
        }
        barrier();
        if (last_sh != 0u) {
            memoryBarrierBuffer();
            uint s = q / p.n_groups, g = q % p.n_groups;
            for (uint e = l; e < 2u * N; e += WG)
                conv_commit(s, rows_per_seq + (e < N ? 0u : p.n_groups * N) + g * N + e % N);
        }
    }
}

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

/* The first row of item k of lane group rl; false past the last row. */
bool item_row(uint k, uint rl, out uint row)
{
    row = ((group_id() * IPG + k) * R + rl) * RPI;
    return rl < R && row < p.n_seqs * p.n_heads * p.head_dim;
}

/* Loads the RPI state rows of item k (zeros past the end, for src -1). */
void load_item(uint k, uint rl, uint j, out vec4 S[RPI])
{
    uint rows_per_seq = p.n_heads * p.head_dim, row;
    for (uint i = 0u; i < RPI; i++)
        S[i] = vec4(0.0);
    if (!item_row(k, rl, row))
        return;
    uint s = row / rows_per_seq;
    uint at = (row % rows_per_seq) * N + 4u * j; /* element of the slot */
    uint slot_elems = rows_per_seq * N;
    if (SNAP != 0u) {
        for (uint i = 0u; i < RPI; i++)
            S[i] = snap4[(s * slot_elems + at + i * N) >> 2];
        return;
    }
    int src = idx[p.src_off + s];
    if (src < 0 || uint(src) >= p.n_slots)
        return;
    uint e = uint(src) * slot_elems + at;
    for (uint i = 0u; i < RPI; i++) {
        uint ei = (e + i * N) >> 2;
        S[i] = ST_DT == DT_F32 ? uintBitsToFloat(st4[ei]) : half4(st2[ei]);
    }
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
    uint rl = l / L, j = l % L; /* lane group in the workgroup, lane in the row */
    uint rows_per_seq = p.n_heads * p.head_dim;
    uint slot_elems = rows_per_seq * N;
    uint hpg = p.n_heads / p.n_groups;
    /* what the lane group holds: (stream, head) of its parameters and dt,
     * (stream, group) of its B and C; ~0u: nothing yet */
    uint c_sh = ~0u, c_sg = ~0u;
    float Dh = 0.0, dtv = 0.0, dA = 1.0;
    vec4 Bv = vec4(0.0), Cv = vec4(0.0);
    int dst = -1, csrc = -1;
    vec4 S[RPI], Sn[RPI];
    load_item(0u, rl, j, S);
    for (uint k = 0u; k < IPG; k++) {
        /* the next item's rows are in flight while this one is updated */
        if (k + 1u < IPG)
            load_item(k + 1u, rl, j, Sn);
        uint row;
        bool act = item_row(k, rl, row);
        float acc[RPI], xv[RPI];
        uint s = 0u, hp = 0u;
        for (uint i = 0u; i < RPI; i++)
            acc[i] = xv[i] = 0.0;
        if (act) {
            s = row / rows_per_seq;
            hp = row % rows_per_seq;
            uint h = hp / p.head_dim, grp = h / hpg;
            uint rb = p.xbc_off + s * p.conv_dim;
            if (s * p.n_heads + h != c_sh) {
                c_sh = s * p.n_heads + h;
                float A = -exp(LOAD_F(a_log, p.a_off + h, A_DT));
                Dh = D_DT != DT_NONE ? LOAD_F(dd, p.d_off + h, D_DT) : 0.0;
                float bias = DB_DT != DT_NONE ? LOAD_F(dt_bias, p.db_off + h, DB_DT) : 0.0;
                dtv = softplus(dt[p.dt_off + s * p.n_heads + h] + bias);
                dtv = dtv < p.dt_min ? p.dt_min : dtv;
                dtv = dtv > p.dt_max ? p.dt_max : dtv;
                dA = exp(dtv * A);
                dst = idx[p.dst_off + s];
                csrc = CONV != 0u ? idx[p.src_off + s] : -1;
            }
            if (s * p.n_groups + grp != c_sg) {
                c_sg = s * p.n_groups + grp;
                uint bo = rb + rows_per_seq + grp * N + 4u * j;
                uint co = bo + p.n_groups * N;
                if (CONV != 0u) {
                    uint bc = rows_per_seq + grp * N + 4u * j, cc = bc + p.n_groups * N;
                    Bv = vec4(conv_at(s, bc, csrc), conv_at(s, bc + 1u, csrc),
                              conv_at(s, bc + 2u, csrc), conv_at(s, bc + 3u, csrc));
                    Cv = vec4(conv_at(s, cc, csrc), conv_at(s, cc + 1u, csrc),
                              conv_at(s, cc + 2u, csrc), conv_at(s, cc + 3u, csrc));
                } else {
                    Bv = vec4(xbc[bo], xbc[bo + 1u], xbc[bo + 2u], xbc[bo + 3u]);
                    Cv = vec4(xbc[co], xbc[co + 1u], xbc[co + 2u], xbc[co + 3u]);
                }
            }
            bool store = dst >= 0 && uint(dst) < p.n_slots;
            uint e = uint(dst) * slot_elems + hp * N + 4u * j;
            for (uint i = 0u; i < RPI; i++) {
                xv[i] = CONV != 0u ? conv_at(s, hp + i, csrc) : xbc[rb + hp + i];
                vec4 v = S[i] * dA + (xv[i] * dtv) * Bv;
                acc[i] = dot(v, Cv);
                if (store) {
                    uint ei = (e + i * N) >> 2;
                    if (ST_DT == DT_F32)
                        st4[ei] = floatBitsToUint(v);
                    else
                        st2[ei] = pack4(v);
                }
            }
        }
        uint yo = p.y_off + s * rows_per_seq + hp;
#if USE_SUBGROUP
        if (L == gl_SubgroupSize) {
            /* a row is one subgroup (rows start at multiples of L) */
            for (uint i = 0u; i < RPI; i++) {
                float t = subgroupAdd(acc[i]);
                if (act && j == 0u)
                    y[yo + i] = t + Dh * xv[i];
            }
        } else
#endif
        {
            for (uint i = 0u; i < RPI; i++) {
                barrier();
                part[l] = acc[i];
                barrier();
                if (act && j == 0u) {
                    float sum = 0.0;
                    for (uint q = 0u; q < L; q++)
                        sum += part[l + q];
                    y[yo + i] = sum + Dh * xv[i];
                }
            }
        }
        if (k + 1u < IPG)
            for (uint i = 0u; i < RPI; i++)
                S[i] = Sn[i];
    }
    if (CONV != 0u)
        conv_finish(l);
}

#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_EXT_control_flow_attributes : enable
// llmem-shader: ssm_scan_pre
// llmem-shader: ssm_scan_pre_rolled:ROLLED=1
// llmem-shader: ssm_scan_pre_nopf:NOPF=1
/* Mamba-2 selective scan over many tokens (prefill, checkpoints): the
 * recurrent form of ssm_scan.comp (Dao & Gu 2024, "Transformers are SSMs",
 * Sec. 3 eq. (2), scalar A per head; HF Mamba2Mixer.torch_forward applied
 * token by token):
 *   dt_h = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max)
 *   S_h  = exp(dt_h * A_h) * S_h + dt_h * x_h ⊗ B_g,   A_h = -exp(A_log[h])
 *   y_h  = S_h · C_g + D[h] * x_h
 *
 * Lanes over d_state, as ssm_scan_decode.comp: a state row is owned by
 * L = N / 4 consecutive invocations (a lane group), each holding 4
 * consecutive elements of it, moved as one 16-byte (f32) or 8-byte
 * (f16/bf16) vector. A lane group holds RPL consecutive rows, so that each
 * B and C element it reads from shared memory serves RPL rows. One
 * workgroup per (stream s, head h, block of RW = LG * RPL rows of the
 * head); every invocation of it is busy on every token.
 *
 * Tokens go in blocks of T: the block's B and C rows, x of the
 * workgroup's rows, dt and exp(dt A) are staged in shared memory once
 * (three barriers per block, none per token); when one pass of the
 * workgroup covers a block, each invocation loads its part of the next
 * block into registers before the current block's tokens run (prefetch:
 * the global-memory latency hides behind them; 0.280 -> 0.211 ms at 512
 * tokens on the H200), and the token loop of a full block without
 * checkpoints is unrolled. Each lane writes its
 * 4-element share of S · C for every (token, row) to shared memory; after
 * the block, one invocation per (token, row) sums the L shares, adds
 * D x and writes y (T * RW values, consecutive rows of a token together).
 * (Summing the shares with subgroupAdd instead, one row per subgroup on
 * NVIDIA, measured 2.2x slower at 512 tokens: docs/benchmarks.md.)
 *
 * States are read from src_slot[s] (-1: zeros; with SNAP from the f32
 * snapshot of state_gather) and written, in the state dtype, to the
 * checkpoint slots (after token n_tok - n_ckpt + k; -1 = before the
 * first), to snap_slot[s] after token snap_tok[s] (the snapshot inside the
 * ubatch, when the view has one; its block takes the rolled loop, as a
 * checkpoint's does) and to dst_slot[s] after the last token; slots
 * outside [0, n_slots) are skipped. Every lane reads its elements before writing
 * them, so a stream's own slots may alias. The host uses this shader when
 * N % 4 == 0 and the shared arrays fit (vk_ops_scan_pre.c). */
#include "common.glsl"

#ifndef ROLLED
#define ROLLED 0 /* 1: the token loop of full blocks is not unrolled (measurements) */
#endif
#ifndef NOPF
#define NOPF 0 /* 1: no prefetch of the next block (measurements) */
#endif

layout(constant_id = 1) const uint N = 128; /* d_state, N % 4 == 0 */
layout(constant_id = 2) const uint ST_DT = 0;
layout(constant_id = 3) const uint A_DT = 0;
layout(constant_id = 4) const uint D_DT = 0;  /* DT_NONE: no D */
layout(constant_id = 5) const uint DB_DT = 0; /* DT_NONE: no dt_bias */
layout(constant_id = 6) const uint SNAP = 0;
layout(constant_id = 7) const uint RPL = 4; /* rows per lane group */
layout(constant_id = 8) const uint T = 4;   /* tokens per staged block */
layout(constant_id = 9) const uint LG = 8;  /* lane groups; WG = LG * N / 4 */
/* 1: the view has a snapshot inside the ubatch (vk_rs_snap_words) */
layout(constant_id = 10) const uint SNAPSHOT = 0;

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
    uint n_seqs, n_tok, n_heads, head_dim, n_groups, n_ckpt, n_slots, n_blocks;
    float dt_min, dt_max;
    uint xbc_off, dt_off, a_off, d_off, db_off, y_off, src_off, dst_off, ckpt_off, conv_dim;
    uint snap_tok_off, snap_slot_off;
} p;

const uint L = N / 4u;     /* lanes per lane group */
const uint RW = LG * RPL;  /* rows per workgroup */
const uint LP = L + 1u;    /* padded stride of the shares (no bank conflicts) */

/* B and C of the block in four planes (element 4 j + c of token t at
 * [c][t][j]): the lanes of a lane group read consecutive words of each,
 * conflict-free whatever width the driver gives the loads */
shared float bsh[4u * T * L];
shared float csh[4u * T * L];
shared float xsh[T * RW];
shared float dtsh[T];
shared float dash[T];
shared float part[T * RW * LP];

vec4 S[RPL];

/* Stream s's snapshot inside the ubatch (<llmem/view.h> snap_tok /
 * snap_slot; snap_slot_off 0xffffffff: the view has none): its slot, -1
 * for none or an entry out of range, with its token in t (-1 with none).
 * Without SNAPSHOT every use of it is compiled out (the prefill hot path
 * of views without one stays as it was). */
int snap_of(uint s, out int t)
{
    t = -1;
    if (SNAPSHOT == 0u || p.snap_slot_off == 0xffffffffu)
        return -1;
    int sl = idx[p.snap_slot_off + s], tt = idx[p.snap_tok_off + s];
    if (sl < 0 || uint(sl) >= p.n_slots || tt < 0 || tt + 1 >= int(p.n_tok))
        return -1;
    t = tt;
    return sl;
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

/* Writes this lane's elements of its rows (first element of the slot
 * `at0`) to `slot` in the state dtype; nothing outside the pool. */
void store_state(int slot, uint at0, uint slot_elems, uint row0, bool lane)
{
    if (!lane || slot < 0 || uint(slot) >= p.n_slots)
        return;
    /* S is only ever indexed by unrolled loops: it stays in registers */
    [[unroll]] for (uint k = 0u; k < RPL; k++) {
        uint e = uint(slot) * slot_elems + at0 + k * N;
        if (row0 + k < p.head_dim) {
            if (ST_DT == DT_F32)
                st4[e >> 2] = floatBitsToUint(S[k]);
            else
                st2[e >> 2] = pack4(S[k]);
        }
    }
}

/* The workgroup's (stream, head, first row, group) and per-head values. */
uint c_s, c_h, c_pw, c_grp, c_dinner;
float c_A, c_bias;

/* Prefetch: when one pass of the workgroup stages a whole block, every
 * invocation loads its part of the next block into registers before the
 * current block's tokens run and writes it to shared memory after them,
 * so that global-memory latency is hidden behind the arithmetic. */
const bool PF = NOPF == 0 && T * L <= WG && T * RW <= WG;
float f_b[4], f_c[4], f_x, f_dt;

/* B and C element group e (token e / L, elements 4 (e % L) ..) of the
 * block at t0 to shared memory, from global memory. */
void stage_bc(uint e, uint t0)
{
    uint rb = p.xbc_off + (c_s * p.n_tok + t0 + e / L) * p.conv_dim + c_dinner + c_grp * N +
              4u * (e % L);
    uint rc = rb + p.n_groups * N;
    [[unroll]] for (uint c = 0u; c < 4u; c++) {
        bsh[c * T * L + e] = xbc[rb + c];
        csh[c * T * L + e] = xbc[rc + c];
    }
}

/* x of row e % RW of the workgroup at token t0 + e / RW (0 past head_dim). */
float load_x(uint e, uint t0)
{
    uint r = c_pw + e % RW;
    uint tok = c_s * p.n_tok + t0 + e / RW;
    return r < p.head_dim ? xbc[p.xbc_off + tok * p.conv_dim + c_h * p.head_dim + r] : 0.0;
}

/* dt and exp(dt A) of token e of the block from the raw dt value v. */
void put_dt(uint e, float v)
{
    float dtv = softplus(v + c_bias);
    dtv = dtv < p.dt_min ? p.dt_min : dtv;
    dtv = dtv > p.dt_max ? p.dt_max : dtv;
    dtsh[e] = dtv;
    dash[e] = exp(dtv * c_A);
}

void fetch(uint l, uint t0, uint nt)
{
    if (l < nt * L) {
        uint rb = p.xbc_off + (c_s * p.n_tok + t0 + l / L) * p.conv_dim + c_dinner + c_grp * N +
                  4u * (l % L);
        uint rc = rb + p.n_groups * N;
        [[unroll]] for (uint c = 0u; c < 4u; c++) {
            f_b[c] = xbc[rb + c];
            f_c[c] = xbc[rc + c];
        }
    }
    if (l < nt * RW)
        f_x = load_x(l, t0);
    if (l < nt)
        f_dt = dt[p.dt_off + (c_s * p.n_tok + t0 + l) * p.n_heads + c_h];
}

void put(uint l, uint nt)
{
    if (l < nt * L) {
        [[unroll]] for (uint c = 0u; c < 4u; c++) {
            bsh[c * T * L + l] = f_b[c];
            csh[c * T * L + l] = f_c[c];
        }
    }
    if (l < nt * RW)
        xsh[l] = f_x;
    if (l < nt)
        put_dt(l, f_dt);
}

/* One token of the block: the state update and the lanes' shares of y. */
void token(uint t, uint lg, uint j, bool lane)
{
    float dA = dash[t], dtv = dtsh[t];
    if (!lane)
        return;
    uint q = t * L + j;
    vec4 Bv = vec4(bsh[q], bsh[T * L + q], bsh[2u * T * L + q], bsh[3u * T * L + q]);
    vec4 Cv = vec4(csh[q], csh[T * L + q], csh[2u * T * L + q], csh[3u * T * L + q]);
    [[unroll]] for (uint k = 0u; k < RPL; k++) {
        uint r = lg * RPL + k;
        float xv = xsh[t * RW + r];
        S[k] = S[k] * dA + (xv * dtv) * Bv;
        part[(t * RW + r) * LP + j] = dot(S[k], Cv);
    }
}

void main()
{
    uint item = group_id();
    if (item >= p.n_seqs * p.n_heads * p.n_blocks)
        return;
    uint blk = item % p.n_blocks;
    uint h = (item / p.n_blocks) % p.n_heads;
    uint s = item / (p.n_blocks * p.n_heads);
    uint l = gl_LocalInvocationID.x;
    uint lg = l / L, j = l % L;
    bool lane = lg < LG;            /* WG may hold a few spare invocations */
    uint pw = blk * RW;             /* the workgroup's first row of the head */
    uint row0 = pw + lg * RPL;      /* this lane group's first row */
    uint grp = h / (p.n_heads / p.n_groups);
    uint d_inner = p.n_heads * p.head_dim;
    uint slot_elems = d_inner * N;
    uint at0 = (h * p.head_dim + row0) * N + 4u * j; /* element of the slot */

    int src = SNAP != 0u ? 0 : idx[p.src_off + s];
    bool ok = SNAP != 0u || (src >= 0 && uint(src) < p.n_slots);
    [[unroll]] for (uint k = 0u; k < RPL; k++) {
        S[k] = vec4(0.0);
        if (lane && ok && row0 + k < p.head_dim) {
            uint e = at0 + k * N;
            if (SNAP != 0u)
                S[k] = snap4[(s * slot_elems + e) >> 2];
            else if (ST_DT == DT_F32)
                S[k] = uintBitsToFloat(st4[(uint(src) * slot_elems + e) >> 2]);
            else
                S[k] = half4(st2[(uint(src) * slot_elems + e) >> 2]);
        }
    }
    c_s = s;
    c_h = h;
    c_pw = pw;
    c_grp = grp;
    c_dinner = d_inner;
    c_A = -exp(LOAD_F(a_log, p.a_off + h, A_DT));
    c_bias = DB_DT != DT_NONE ? LOAD_F(dt_bias, p.db_off + h, DB_DT) : 0.0;
    float Dh = D_DT != DT_NONE ? LOAD_F(dd, p.d_off + h, D_DT) : 0.0;
    if (PF)
        fetch(l, 0u, min(T, p.n_tok));
    int first_ckpt = int(p.n_tok) - int(p.n_ckpt);
    for (uint k = 0u; k < p.n_ckpt; k++)
        if (first_ckpt + int(k) == -1)
            store_state(idx[p.ckpt_off + s * p.n_ckpt + k], at0, slot_elems, row0, lane);
    int snap_t, snap = snap_of(s, snap_t);

    for (uint t0 = 0u; t0 < p.n_tok; t0 += T) {
        uint nt = min(T, p.n_tok - t0);
        barrier(); /* the previous block's shares and x are consumed */
        if (PF) {
            put(l, nt);
            barrier();
            /* the next block's loads fly during this block's tokens */
            if (t0 + T < p.n_tok)
                fetch(l, t0 + T, min(T, p.n_tok - t0 - T));
        } else {
            for (uint e = l; e < nt * L; e += WG)
                stage_bc(e, t0);
            for (uint e = l; e < nt * RW; e += WG)
                xsh[e] = load_x(e, t0);
            for (uint e = l; e < nt; e += WG)
                put_dt(e, dt[p.dt_off + (c_s * p.n_tok + t0 + e) * p.n_heads + c_h]);
            barrier();
        }
        barrier();
        /* checkpoints or the snapshot in this block: the token loop stores states */
        bool ck = int(t0 + nt) > first_ckpt && p.n_ckpt > 0u;
        if (SNAPSHOT != 0u)
            ck = ck || (snap_t >= int(t0) && snap_t < int(t0 + nt));
        if (ROLLED == 0 && nt == T && !ck) {
            /* a full block without checkpoints: unrolled, so that the
             * compiler may issue the shared loads of several tokens early */
            [[unroll]] for (uint t = 0u; t < T; t++)
                token(t, lg, j, lane);
        } else {
            for (uint t = 0u; t < nt; t++) {
                token(t, lg, j, lane);
                int k = int(t0 + t) - first_ckpt;
                if (k >= 0 && k < int(p.n_ckpt))
                    store_state(idx[p.ckpt_off + s * p.n_ckpt + uint(k)], at0, slot_elems, row0,
                                lane);
                if (SNAPSHOT != 0u && int(t0 + t) == snap_t)
                    store_state(snap, at0, slot_elems, row0, lane);
            }
        }
        barrier();
        for (uint e = l; e < nt * RW; e += WG) {
            uint r = e % RW, t = e / RW;
            if (pw + r >= p.head_dim)
                continue;
            /* four partial sums: a shorter chain of dependent adds */
            vec4 a4 = vec4(0.0);
            [[unroll]] for (uint q = 0u; q + 3u < L; q += 4u)
                a4 += vec4(part[e * LP + q], part[e * LP + q + 1u], part[e * LP + q + 2u],
                           part[e * LP + q + 3u]);
            float acc = (a4.x + a4.y) + (a4.z + a4.w);
            [[unroll]] for (uint q = L & ~3u; q < L; q++)
                acc += part[e * LP + q];
            uint tok = s * p.n_tok + t0 + t;
            y[p.y_off + tok * d_inner + h * p.head_dim + pw + r] = acc + Dh * xsh[e];
        }
    }
    store_state(idx[p.dst_off + s], at0, slot_elems, row0, lane);
}

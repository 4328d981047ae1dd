#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-2 selective scan, recurrent form (Dao & Gu 2024, "Transformers are
 * SSMs", Sec. 3 eq. (2), scalar A per head; HF Mamba2Mixer.torch_forward
 * single-step path applied token by token):
 *   dt_h = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max)
 *   S_h  = exp(dt_h * A_h) * S_h + dt_h * x_h ⊗ B_g,   A_h = -exp(A_log[h])
 *   y_h  = S_h · C_g + D[h] * x_h
 * One workgroup per (stream s, head h, chunk of WG rows p of the head);
 * an invocation keeps its state row S[p, 0..N) in registers (N is a
 * specialization constant) and B, C of the token go through shared
 * memory. States are read from src_slot[s] (-1: zeros; with SNAP from
 * the f32 snapshot of state_gather) and written, in the state dtype, to
 * the checkpoint slots (after token n_tok - n_ckpt + k; -1 = before the
 * first), to snap_slot[s] after token snap_tok[s] (the snapshot inside the
 * ubatch, when the view has one) and to dst_slot[s] after the last token. */
#include "common.glsl"

layout(constant_id = 1) const uint N = 128; /* d_state */
layout(constant_id = 2) const uint ST_DT = 0;
layout(constant_id = 3) const uint A_DT = 0;
layout(constant_id = 4) const uint D_DT = 0;  /* DT_NONE: no D */
layout(constant_id = 5) const uint DB_DT = 0; /* DT_NONE: no dt_bias */
layout(constant_id = 6) const uint SNAP = 0;
/* 1: the view has a snapshot inside the ubatch (vk_rs_snap_words) */
layout(constant_id = 7) const uint SNAPSHOT = 0;

layout(binding = 0) readonly buffer Xbc { float xbc[]; };
layout(binding = 1) readonly buffer Dt { float dt[]; };
layout(binding = 2) readonly buffer Al { uint a_log[]; };
layout(binding = 3) readonly buffer Dd { uint dd[]; };
layout(binding = 4) readonly buffer Db { uint dt_bias[]; };
layout(binding = 5) writeonly buffer Y { float y[]; };
layout(binding = 6) readonly buffer Idx { int idx[]; };
layout(binding = 7) buffer St { uint st[]; };
layout(binding = 8) readonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, n_heads, head_dim, n_groups, n_ckpt, n_slots, n_chunks;
    float dt_min, dt_max;
    uint xbc_off, dt_off, a_off, d_off, db_off, y_off, src_off, dst_off, ckpt_off, conv_dim;
    uint snap_tok_off, snap_slot_off;
} p;

shared float bs[N];
shared float cs[N];

/* State rows move between memory and the invocations' registers through
 * shared memory, TR rows at a time, so that loads and stores are
 * coalesced (consecutive invocations touch consecutive elements of a row;
 * each invocation reading its own row directly left NVIDIA's decode scan
 * at a sixth of the CUDA one's bandwidth). Rows are padded by one word
 * against bank conflicts. */
const uint TR = N <= 128u ? 16u : 4u;
shared float tile[TR * (N + 1u)];

float S[N];

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

/* Loads this workgroup's state rows (rows0 .. rows0 + rows of the slot
 * layout) into S: from the snapshot, from src_slot[s], or zeros. Called by
 * every invocation. */
void load_state(uint s, uint row0, uint rows, uint slot_elems)
{
    uint l = gl_LocalInvocationID.x;
    int src = SNAP != 0u ? 0 : idx[p.src_off + s];
    bool ok = SNAP != 0u || (src >= 0 && uint(src) < p.n_slots);
    for (uint r0 = 0; r0 < rows; r0 += TR) {
        uint tr = min(TR, rows - r0);
        barrier();
        for (uint e = l; e < tr * N; e += WG) {
            uint r = e / N, n = e % N;
            uint at = (row0 + r0 + r) * N + n;
            float val = 0.0;
            if (SNAP != 0u)
                val = snap[s * slot_elems + at];
            else if (ok)
                val = LOAD_F(st, uint(src) * slot_elems + at, ST_DT);
            tile[r * (N + 1u) + n] = val;
        }
        barrier();
        if (l >= r0 && l < r0 + tr)
            for (uint n = 0; n < N; n++)
                S[n] = tile[(l - r0) * (N + 1u) + n];
    }
}

float tile_at(uint e)
{
    return tile[(e / N) * (N + 1u) + e % N];
}

/* Writes this workgroup's state rows to `slot` in the state dtype (nothing
 * for a slot outside the pool). Called by every invocation. */
void store_state(int slot, uint row0, uint rows)
{
    if (slot < 0 || uint(slot) >= p.n_slots)
        return;
    uint l = gl_LocalInvocationID.x;
    for (uint r0 = 0; r0 < rows; r0 += TR) {
        uint tr = min(TR, rows - r0);
        barrier();
        if (l >= r0 && l < r0 + tr)
            for (uint n = 0; n < N; n++)
                tile[(l - r0) * (N + 1u) + n] = S[n];
        barrier();
        uint base = (uint(slot) * p.n_heads * p.head_dim + row0 + r0) * N;
        if (ST_DT == DT_F32) {
            for (uint e = l; e < tr * N; e += WG)
                st[base + e] = floatBitsToUint(tile_at(e));
        } else if ((base & 1u) == 0u && (N & 1u) == 0u) {
            /* the rows own whole words */
            for (uint e = 2u * l; e < tr * N; e += 2u * WG)
                st[(base + e) >> 1] = f32_to_half(tile_at(e), ST_DT) |
                                      (f32_to_half(tile_at(e + 1u), ST_DT) << 16);
        } else {
            for (uint e = l; e < tr * N; e += WG)
                STORE_F(st, base + e, ST_DT, tile_at(e));
        }
    }
}

void main()
{
    uint item = group_id();
    if (item >= p.n_seqs * p.n_heads * p.n_chunks)
        return;
    uint chunk = item % p.n_chunks;
    uint h = (item / p.n_chunks) % p.n_heads;
    uint s = item / (p.n_chunks * p.n_heads);
    uint l = gl_LocalInvocationID.x;
    uint pp = chunk * WG + l;
    bool act = pp < p.head_dim;
    uint grp = h / (p.n_heads / p.n_groups);
    uint slot_elems = p.n_heads * p.head_dim * N;

    uint row0 = h * p.head_dim + chunk * WG; /* the workgroup's first state row */
    uint rows = min(WG, p.head_dim - chunk * WG);
    load_state(s, row0, rows, slot_elems);
    float A = -exp(LOAD_F(a_log, p.a_off + h, A_DT));
    float Dh = D_DT != DT_NONE ? LOAD_F(dd, p.d_off + h, D_DT) : 0.0;
    float bias = DB_DT != DT_NONE ? LOAD_F(dt_bias, p.db_off + h, DB_DT) : 0.0;
    int first_ckpt = int(p.n_tok) - int(p.n_ckpt);
    for (uint k = 0; k < p.n_ckpt; k++)
        if (first_ckpt + int(k) == -1)
            store_state(idx[p.ckpt_off + s * p.n_ckpt + k], row0, rows);
    int snap_t, snap = snap_of(s, snap_t); /* the same for the whole workgroup */

    uint d_inner = p.n_heads * p.head_dim;
    for (uint t = 0; t < p.n_tok; t++) {
        uint tok = s * p.n_tok + t;
        uint rb = p.xbc_off + tok * p.conv_dim;
        barrier();
        for (uint n = l; n < N; n += WG) {
            bs[n] = xbc[rb + d_inner + grp * N + n];
            cs[n] = xbc[rb + d_inner + p.n_groups * N + grp * N + n];
        }
        barrier();
        float v = dt[p.dt_off + tok * p.n_heads + h] + bias;
        float dtv = softplus(v);
        dtv = dtv < p.dt_min ? p.dt_min : dtv;
        dtv = dtv > p.dt_max ? p.dt_max : dtv;
        float dA = exp(dtv * A);
        if (act) {
            float xv = xbc[rb + h * p.head_dim + pp];
            float xd = xv * dtv;
            float acc = 0.0;
            for (uint n = 0; n < N; n++) {
                S[n] = S[n] * dA + xd * bs[n];
                acc += S[n] * cs[n];
            }
            y[p.y_off + tok * d_inner + h * p.head_dim + pp] = acc + Dh * xv;
        }
        int k = int(t) - first_ckpt;
        if (k >= 0 && k < int(p.n_ckpt))
            store_state(idx[p.ckpt_off + s * p.n_ckpt + uint(k)], row0, rows);
        if (SNAPSHOT != 0u && int(t) == snap_t)
            store_state(snap, row0, rows);
    }
    store_state(idx[p.dst_off + s], row0, rows);
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-1 selective scan, recurrent form (Gu & Dao 2023, Alg. 2;
 * transformers mamba_selective_scan's sequential path, JambaMambaMixer),
 * with the ssm state {d_inner, d_state}, for an EQUAL ubatch of n_seqs
 * streams x n_tok tokens, stream-major. Per channel c:
 *   dt' = softplus(dt[t, c] + dt_bias[c]);  A = -exp(a_log[c, :])
 *   S = exp(dt' A) * S + dt' x[t, c] B[t, :]
 *   y[t, c] = (S . C[t, :] + D[c] x[t, c]) * silu(z[t, c])   (z optional)
 * One invocation per (stream s, channel c) keeps S[c, :] in registers
 * across the tokens. Sources, snapshots (SNAP), checkpoints, the snapshot
 * inside the ubatch (snap_tok / snap_slot) and skipped slots as
 * short_conv.comp. The CPU reference is backends/cpu/ops_ssm1.c. */
#include "common.glsl"

layout(constant_id = 1) const uint NS = 16; /* d_state */
layout(constant_id = 2) const uint ST_DT = 0;
layout(constant_id = 3) const uint A_DT = 0;
layout(constant_id = 4) const uint D_DT = 0;  /* DT_NONE: no D */
layout(constant_id = 5) const uint DB_DT = 0; /* DT_NONE: no dt_bias */
layout(constant_id = 6) const uint HAS_Z = 0;
layout(constant_id = 7) const uint SNAP = 0;
layout(constant_id = 8) const uint SNAPSHOT = 0; /* some stream has a snapshot inside the ubatch */

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Dt { float dt[]; };
layout(binding = 2) readonly buffer Bb { float bm[]; };
layout(binding = 3) readonly buffer Cc { float cm[]; };
layout(binding = 4) readonly buffer Alog { uint a_log[]; };
layout(binding = 5) readonly buffer Dd { uint dd[]; };
layout(binding = 6) readonly buffer Db { uint db[]; };
layout(binding = 7) readonly buffer Z { float z[]; };
layout(binding = 8) writeonly buffer Y { float y[]; };
layout(binding = 9) readonly buffer Idx { int idx[]; };
layout(binding = 10) buffer St { uint st[]; };
layout(binding = 11) readonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, din, n_ckpt, n_slots;
    uint x_off, dt_off, b_off, c_off, a_off, d_off, db_off, z_off, y_off;
    uint src_off, dst_off, ckpt_off;
    uint snap_tok_off, snap_slot_off;
} p;

float S[NS];
float A[NS];

/* Stream s's snapshot inside the ubatch (<llmem/view.h> snap_tok /
 * snap_slot; snap_slot_off 0xffffffff: the view has none): its slot, -1
 * for none or an entry out of range, with its token in t (-1 with none).
 * Without SNAPSHOT every use of it is compiled out. */
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

void store_state(int slot, uint c)
{
    if (slot < 0 || uint(slot) >= p.n_slots)
        return;
    uint base = (uint(slot) * p.din + c) * NS;
    for (uint n = 0; n < NS; n++)
        STORE_F(st, base + n, ST_DT, S[n]);
}

void main()
{
    uint g = global_id();
    if (g >= p.n_seqs * p.din)
        return;
    uint s = g / p.din, c = g % p.din;
    uint slot_elems = p.din * NS;
    if (SNAP != 0u) {
        for (uint n = 0; n < NS; n++)
            S[n] = snap[s * slot_elems + c * NS + n];
    } else {
        int src = idx[p.src_off + s];
        bool ok = src >= 0 && uint(src) < p.n_slots;
        for (uint n = 0; n < NS; n++)
            S[n] = ok ? LOAD_F(st, uint(src) * slot_elems + c * NS + n, ST_DT) : 0.0;
    }
    for (uint n = 0; n < NS; n++)
        A[n] = -exp(LOAD_F(a_log, p.a_off + c * NS + n, A_DT));
    float Dc = D_DT != DT_NONE ? LOAD_F(dd, p.d_off + c, D_DT) : 0.0;
    float bias = DB_DT != DT_NONE ? LOAD_F(db, p.db_off + c, DB_DT) : 0.0;
    int first_ckpt = int(p.n_tok) - int(p.n_ckpt);
    for (uint k = 0; k < p.n_ckpt; k++)
        if (first_ckpt + int(k) == -1)
            store_state(idx[p.ckpt_off + s * p.n_ckpt + k], c);
    int snap_t, snap = snap_of(s, snap_t);
    for (uint t = 0; t < p.n_tok; t++) {
        uint row = s * p.n_tok + t;
        float dtv = softplus(dt[p.dt_off + row * p.din + c] + bias);
        float xv = x[p.x_off + row * p.din + c], bx = dtv * xv;
        float acc = 0.0;
        for (uint n = 0; n < NS; n++) {
            S[n] = exp(dtv * A[n]) * S[n] + bx * bm[p.b_off + row * NS + n];
            acc += S[n] * cm[p.c_off + row * NS + n];
        }
        float yv = acc + Dc * xv;
        if (HAS_Z != 0u)
            yv *= silu(z[p.z_off + row * p.din + c]);
        y[p.y_off + row * p.din + c] = yv;
        int k = int(t) - first_ckpt;
        if (k >= 0 && k < int(p.n_ckpt))
            store_state(idx[p.ckpt_off + s * p.n_ckpt + uint(k)], c);
        if (SNAPSHOT != 0u && int(t) == snap_t)
            store_state(snap, c);
    }
    store_state(idx[p.dst_off + s], c);
}

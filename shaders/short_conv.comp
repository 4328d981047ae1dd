#version 450
#extension GL_GOOGLE_include_directive : enable
/* LFM2's gated short convolution (transformers Lfm2ShortConv.forward) with
 * the conv state, for an EQUAL ubatch of n_seqs streams x n_tok tokens,
 * stream-major: bcx = [B | C | x] (in_proj output), u = B * x,
 *   out[t, c] = C[t, c] * (b[c] + sum_k w[c, k] * u'[t + k, c]),
 * u' = the state's last L - 1 rows of u (oldest first) then the u rows.
 *
 * One invocation per (stream s, channel c) walks the stream's tokens with
 * the window in registers. The state is read from slot src_slot[s] (-1:
 * zeros) or, with SNAP, from the f32 snapshot [n_seqs][slot] a
 * state_gather dispatch made, and written after token n_tok - n_ckpt + k
 * to ckpt_slot[s][k] (the state before token 0 for index -1), after token
 * snap_tok[s] to snap_slot[s] (the snapshot inside the ubatch, when the
 * view has one) and after the last token to dst_slot[s]. Slots outside
 * [0, n_slots) are skipped. The CPU reference is backends/cpu/ops_ssm1.c. */
#include "common.glsl"

layout(constant_id = 1) const uint L = 3; /* taps (conv_L_cache) */
layout(constant_id = 2) const uint W_DT = 0;
layout(constant_id = 3) const uint B_DT = 0; /* DT_NONE: no bias */
layout(constant_id = 4) const uint ST_DT = 0;
layout(constant_id = 5) const uint SNAP = 0;
layout(constant_id = 6) const uint SNAPSHOT = 0; /* some stream has a snapshot inside the ubatch */

layout(binding = 0) readonly buffer X { float bcx[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) readonly buffer B { uint b[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer Idx { int idx[]; };
layout(binding = 5) buffer St { uint st[]; };
layout(binding = 6) readonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, dim, n_ckpt, n_slots;
    uint x_off, w_off, b_off, o_off, src_off, dst_off, ckpt_off;
    uint snap_tok_off, snap_slot_off;
} p;

float win[L];

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
    uint base = uint(slot) * (L - 1u) * p.dim + c;
    for (uint r = 0; r + 1u < L; r++)
        STORE_F(st, base + r * p.dim, ST_DT, win[r]);
}

void main()
{
    uint g = global_id();
    if (g >= p.n_seqs * p.dim)
        return;
    uint s = g / p.dim, c = g % p.dim;
    uint slot_elems = (L - 1u) * p.dim;
    if (SNAP != 0u) {
        for (uint r = 0; r + 1u < L; r++)
            win[r] = snap[s * slot_elems + r * p.dim + c];
    } else {
        int src = idx[p.src_off + s];
        bool ok = src >= 0 && uint(src) < p.n_slots;
        for (uint r = 0; r + 1u < L; r++)
            win[r] = ok ? LOAD_F(st, uint(src) * slot_elems + r * p.dim + c, ST_DT) : 0.0;
    }
    float wk[L];
    for (uint k = 0; k < L; k++)
        wk[k] = LOAD_F(w, p.w_off + c * L + k, W_DT);
    float bias = B_DT != DT_NONE ? LOAD_F(b, p.b_off + c, B_DT) : 0.0;
    int first_ckpt = int(p.n_tok) - int(p.n_ckpt); /* token of checkpoint 0 */
    for (uint k = 0; k < p.n_ckpt; k++)
        if (first_ckpt + int(k) == -1)
            store_state(idx[p.ckpt_off + s * p.n_ckpt + k], c);
    int snap_t, snap = snap_of(s, snap_t);
    for (uint t = 0; t < p.n_tok; t++) {
        uint row = s * p.n_tok + t;
        uint rb = p.x_off + row * 3u * p.dim + c;
        float u = bcx[rb] * bcx[rb + 2u * p.dim];
        float acc = bias;
        for (uint k = 0; k + 1u < L; k++)
            acc += wk[k] * win[k];
        acc += wk[L - 1u] * u;
        o[p.o_off + row * p.dim + c] = bcx[rb + p.dim] * acc;
        for (uint k = 0; k + 2u < L; k++)
            win[k] = win[k + 1u];
        win[L - 2u] = u;
        int k = int(t) - first_ckpt;
        if (k >= 0 && k < int(p.n_ckpt))
            store_state(idx[p.ckpt_off + s * p.n_ckpt + uint(k)], c);
        if (SNAPSHOT != 0u && int(t) == snap_t)
            store_state(snap, c);
    }
    store_state(idx[p.dst_off + s], c);
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-2 causal depthwise conv1d over xBC with the conv state, then SiLU
 * (HF transformers Mamba2Mixer.torch_forward; Dao & Gu 2024, Sec. 7.1),
 * for an EQUAL ubatch of n_seqs streams x n_tok tokens, stream-major.
 *
 * One invocation per (stream s, channel c) walks the stream's tokens with
 * the last DC - 1 inputs in registers (the conv state, oldest first):
 *   out[t, c] = silu(b[c] + sum_k w[c, k] * u[t + k, c]),
 * u = state rows then x rows. The state is read from slot src_slot[s]
 * (-1: zeros) or, with SNAP, from the f32 snapshot [n_seqs][slot] that a
 * state_gather dispatch made (when another stream writes this stream's
 * source slot), and written after token n_tok - n_ckpt + k to
 * ckpt_slot[s][k] (the state before token 0 for index -1), after token
 * snap_tok[s] to snap_slot[s] (the snapshot inside the ubatch, when the
 * view has one) and after the last token to dst_slot[s]. Slots outside
 * [0, n_slots) are skipped. */
#include "common.glsl"

layout(constant_id = 1) const uint DC = 4; /* d_conv */
layout(constant_id = 2) const uint W_DT = 0;
layout(constant_id = 3) const uint B_DT = 0; /* DT_NONE: no bias */
layout(constant_id = 4) const uint ST_DT = 0;
layout(constant_id = 5) const uint SNAP = 0;
/* 1: the view has a snapshot inside the ubatch (vk_rs_snap_words) */
layout(constant_id = 6) const uint SNAPSHOT = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) readonly buffer B { uint b[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer Idx { int idx[]; };
layout(binding = 5) buffer St { uint st[]; };
layout(binding = 6) readonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, conv_dim, n_ckpt, n_slots;
    uint x_off, w_off, b_off, o_off, src_off, dst_off, ckpt_off;
    uint snap_tok_off, snap_slot_off;
} p;

float win[DC];

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

void store_state(int slot, uint c)
{
    if (slot < 0 || uint(slot) >= p.n_slots)
        return;
    uint base = uint(slot) * (DC - 1u) * p.conv_dim + c;
    for (uint r = 0; r + 1u < DC; r++)
        STORE_F(st, base + r * p.conv_dim, ST_DT, win[r]);
}

void main()
{
    uint g = global_id();
    if (g >= p.n_seqs * p.conv_dim)
        return;
    uint s = g / p.conv_dim, c = g % p.conv_dim;
    uint slot_elems = (DC - 1u) * p.conv_dim;
    if (SNAP != 0u) {
        for (uint r = 0; r + 1u < DC; r++)
            win[r] = snap[s * slot_elems + r * p.conv_dim + c];
    } else {
        int src = idx[p.src_off + s];
        bool ok = src >= 0 && uint(src) < p.n_slots;
        for (uint r = 0; r + 1u < DC; r++)
            win[r] = ok ? LOAD_F(st, uint(src) * slot_elems + r * p.conv_dim + c, ST_DT) : 0.0;
    }
    float wk[DC];
    for (uint k = 0; k < DC; k++)
        wk[k] = LOAD_F(w, p.w_off + c * DC + k, W_DT);
    float bias = B_DT != DT_NONE ? LOAD_F(b, p.b_off + c, B_DT) : 0.0;
    int first_ckpt = int(p.n_tok) - int(p.n_ckpt); /* token of checkpoint 0 */
    for (uint k = 0; k < p.n_ckpt; k++)
        if (first_ckpt + int(k) == -1)
            store_state(idx[p.ckpt_off + s * p.n_ckpt + k], c);
    int snap_t, snap = snap_of(s, snap_t);
    for (uint t = 0; t < p.n_tok; t++) {
        uint row = s * p.n_tok + t;
        float xv = x[p.x_off + row * p.conv_dim + c];
        float acc = bias;
        for (uint k = 0; k + 1u < DC; k++)
            acc += wk[k] * win[k];
        acc += wk[DC - 1u] * xv;
        o[p.o_off + row * p.conv_dim + c] = silu(acc);
        for (uint k = 0; k + 2u < DC; k++)
            win[k] = win[k + 1u];
        win[DC - 2u] = xv;
        int k = int(t) - first_ckpt;
        if (k >= 0 && k < int(p.n_ckpt))
            store_state(idx[p.ckpt_off + s * p.n_ckpt + uint(k)], c);
        if (SNAPSHOT != 0u && int(t) == snap_t)
            store_state(snap, c);
    }
    store_state(idx[p.dst_off + s], c);
}

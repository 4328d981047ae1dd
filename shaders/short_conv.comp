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
 * to ckpt_slot[s][k] (the state before token 0 for index -1) and after the
 * last token to dst_slot[s]. Slots outside [0, n_slots) are skipped. The
 * CPU reference is backends/cpu/ops_ssm1.c. */
#include "common.glsl"

layout(constant_id = 1) const uint L = 3; /* taps (conv_L_cache) */
layout(constant_id = 2) const uint W_DT = 0;
layout(constant_id = 3) const uint B_DT = 0; /* DT_NONE: no bias */
layout(constant_id = 4) const uint ST_DT = 0;
layout(constant_id = 5) const uint SNAP = 0;

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
} p;

float win[L];

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
    }
    store_state(idx[p.dst_off + s], c);
}

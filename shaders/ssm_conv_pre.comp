#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-2 causal depthwise conv1d over xBC with the conv state, then SiLU,
 * for many tokens per stream (prefill): the op of ssm_conv.comp (HF
 * transformers Mamba2Mixer.torch_forward; Dao & Gu 2024, Sec. 7.1),
 *   out[t, c] = silu(b[c] + sum_k w[c, k] * u[t + k, c]),
 * u = the DC - 1 state rows then the x rows, over an EQUAL ubatch of
 * n_seqs streams x n_tok tokens, stream-major.
 *
 * ssm_conv.comp walks all of a stream's tokens in one invocation per
 * (stream, channel): too few invocations for a prefill. Here one
 * invocation per (stream s, block of TB tokens, channel c) computes its
 * block's outputs from the DC - 1 inputs before the block (x rows, or the
 * state for the first block) and its x rows. Every output depends only on
 * inputs, so the blocks are independent.
 *
 * States. The state after token t is u[t - DC + 2 .. t] (t = -1: the
 * source state). Only the invocations of block 0 read the source slot
 * src_slot[s] (-1: zeros; with SNAP the f32 snapshot [n_seqs][slot] of
 * state_gather), and the same invocation writes channel c of every state
 * the ubatch stores: ckpt_slot[s][k] after token n_tok - n_ckpt + k,
 * snap_slot[s] after token snap_tok[s] (the snapshot inside the ubatch,
 * when the view has one) and dst_slot[s] after the last token, from its
 * registers and x. It reads
 * before it writes, so a stream's own slots may alias. Slots outside
 * [0, n_slots) are skipped. */
#include "common.glsl"

layout(constant_id = 1) const uint DC = 4; /* d_conv */
layout(constant_id = 2) const uint W_DT = 0;
layout(constant_id = 3) const uint B_DT = 0; /* DT_NONE: no bias */
layout(constant_id = 4) const uint ST_DT = 0;
layout(constant_id = 5) const uint SNAP = 0;
layout(constant_id = 6) const uint TB = 16; /* tokens per invocation */
/* 1: the view has a snapshot inside the ubatch (vk_rs_snap_words) */
layout(constant_id = 7) const uint SNAPSHOT = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { uint w[]; };
layout(binding = 2) readonly buffer B { uint b[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
layout(binding = 4) readonly buffer Idx { int idx[]; };
layout(binding = 5) buffer St { uint st[]; };
layout(binding = 6) readonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, conv_dim, n_ckpt, n_slots;
    uint x_off, w_off, b_off, o_off, src_off, dst_off, ckpt_off, n_blocks;
    uint snap_tok_off, snap_slot_off;
} p;

float win[DC]; /* win[0 .. DC - 2]: the inputs before the current token */
float st0[DC]; /* block 0: the source state, oldest first */

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

/* Input u at token q of stream s (q < 0: the source state). */
float u_at(uint s, int q, uint c)
{
    if (q < 0)
        return st0[uint(q + int(DC) - 1)];
    return x[p.x_off + (s * p.n_tok + uint(q)) * p.conv_dim + c];
}

/* Writes channel c of the state after token t to `slot`. */
void store_state(int slot, uint s, int t, uint c)
{
    if (slot < 0 || uint(slot) >= p.n_slots || t < -1)
        return;
    uint base = uint(slot) * (DC - 1u) * p.conv_dim + c;
    for (uint r = 0; r + 1u < DC; r++)
        STORE_F(st, base + r * p.conv_dim, ST_DT, u_at(s, t - int(DC) + 2 + int(r), c));
}

void main()
{
    uint g = global_id();
    if (g >= p.n_seqs * p.n_blocks * p.conv_dim)
        return;
    uint c = g % p.conv_dim;
    uint blk = (g / p.conv_dim) % p.n_blocks;
    uint s = g / (p.conv_dim * p.n_blocks);
    uint t0 = blk * TB;
    for (uint r = 0; r + 1u < DC; r++)
        st0[r] = 0.0;
    if (blk == 0u) {
        uint slot_elems = (DC - 1u) * p.conv_dim;
        if (SNAP != 0u) {
            for (uint r = 0; r + 1u < DC; r++)
                st0[r] = snap[s * slot_elems + r * p.conv_dim + c];
        } else {
            int src = idx[p.src_off + s];
            if (src >= 0 && uint(src) < p.n_slots)
                for (uint r = 0; r + 1u < DC; r++)
                    st0[r] = LOAD_F(st, uint(src) * slot_elems + r * p.conv_dim + c, ST_DT);
        }
        int first_ckpt = int(p.n_tok) - int(p.n_ckpt); /* token of checkpoint 0 */
        for (uint k = 0; k < p.n_ckpt; k++)
            store_state(idx[p.ckpt_off + s * p.n_ckpt + k], s, first_ckpt + int(k), c);
        if (SNAPSHOT != 0u) {
            int snap_t, snap = snap_of(s, snap_t);
            store_state(snap, s, snap_t, c);
        }
        store_state(idx[p.dst_off + s], s, int(p.n_tok) - 1, c);
    }
    for (uint r = 0; r + 1u < DC; r++)
        win[r] = u_at(s, int(t0) - int(DC) + 1 + int(r), c);
    float wk[DC];
    for (uint k = 0; k < DC; k++)
        wk[k] = LOAD_F(w, p.w_off + c * DC + k, W_DT);
    float bias = B_DT != DT_NONE ? LOAD_F(b, p.b_off + c, B_DT) : 0.0;
    uint t1 = min(t0 + TB, p.n_tok);
    for (uint t = t0; t < t1; t++) {
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
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Mamba-2 selective scan (the recurrence of ssm_scan.comp; Dao & Gu 2024,
 * Sec. 3) with an int8 SSM state and one f32 scale per head (issue 17;
 * <llmem/view.h> llmem_state_slot_bytes: a slot is its [H][P][N] codes, then
 * H f32 scales at the next 16-byte boundary; value = code * scale). One
 * workgroup per (stream, head) keeps the head's state in shared memory as
 * f32, so the scale of each stored state, amax / 127 over the head, is one
 * workgroup reduction; codes are roundEven(x / scale) clamped to
 * [-127, 127] (the cpu backend's arithmetic); stored are the checkpoints,
 * the snapshot inside the ubatch (snap_slot[s] after token snap_tok[s],
 * when the view has one) and dst_slot[s]. MODE 1 only copies every
 * stream's source state, dequantized, into the f32 scratch `snap`
 * ([n_seqs][H][P * N]) and MODE 0 with SNAP then reads it: used when a
 * stream reads a slot another stream writes (copy-on-write). P * N % 4 == 0. */
#include "common.glsl"

layout(constant_id = 1) const uint SMAX = 4; /* P * N */
layout(constant_id = 2) const uint A_DT = 0;
layout(constant_id = 3) const uint D_DT = 0;  /* DT_NONE: no D */
layout(constant_id = 4) const uint DB_DT = 0; /* DT_NONE: no dt_bias */
layout(constant_id = 5) const uint SNAP = 0;
layout(constant_id = 6) const uint MODE = 0;
/* 1: the view has a snapshot inside the ubatch (vk_rs_snap_words) */
layout(constant_id = 7) const uint SNAPSHOT = 0;

layout(binding = 0) readonly buffer Xbc { float xbc[]; };
layout(binding = 1) readonly buffer Dt { float dt[]; };
layout(binding = 2) readonly buffer Al { uint a_log[]; };
layout(binding = 3) readonly buffer Dd { uint dd[]; };
layout(binding = 4) readonly buffer Db { uint dt_bias[]; };
layout(binding = 5) buffer Y { float y[]; };
layout(binding = 6) readonly buffer Idx { int idx[]; };
layout(binding = 7) buffer St { uint st[]; };
layout(binding = 8) buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, n_heads, head_dim, d_state, n_groups, n_ckpt, n_slots;
    float dt_min, dt_max;
    uint xbc_off, dt_off, a_off, d_off, db_off, y_off, src_off, dst_off, ckpt_off, conv_dim;
    uint slot_words, scale_word;
    uint snap_tok_off, snap_slot_off;
} p;

shared float S[SMAX];
shared float red[WG];

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

void store_state(int sl, uint h, uint hs)
{
    uint lid = gl_LocalInvocationID.x;
    if (sl < 0 || uint(sl) >= p.n_slots)
        return;
    float a = 0.0;
    for (uint i = lid; i < hs; i += WG)
        a = max(a, abs(S[i]));
    red[lid] = a;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s)
            red[lid] = max(red[lid], red[lid + s]);
        barrier();
    }
    float scale = red[0] / 127.0;
    uint base = uint(sl) * p.slot_words;
    for (uint w = lid; w < hs / 4u; w += WG) {
        uint word = 0u;
        for (uint b = 0u; b < 4u; b++) {
            float r = scale > 0.0 ? roundEven(S[4u * w + b] / scale) : 0.0;
            r = isnan(r) ? 0.0 : clamp(r, -127.0, 127.0);
            word |= (uint(int(r)) & 0xffu) << (8u * b);
        }
        st[base + (h * hs) / 4u + w] = word;
    }
    if (lid == 0u)
        st[base + p.scale_word + h] = floatBitsToUint(scale);
    barrier();
}

void main()
{
    uint item = group_id(), lid = gl_LocalInvocationID.x;
    if (item >= p.n_seqs * p.n_heads)
        return;
    uint H = p.n_heads, P = p.head_dim, N = p.d_state, G = p.n_groups;
    uint s = item / H, h = item % H, g = h / (H / G), hs = P * N;
    /* the source state, as f32 */
    if (SNAP != 0u && MODE == 0u) {
        for (uint i = lid; i < hs; i += WG)
            S[i] = snap[(s * H + h) * hs + i];
    } else {
        int sl = idx[p.src_off + s];
        bool ok = sl >= 0 && uint(sl) < p.n_slots;
        uint base = ok ? uint(sl) * p.slot_words : 0u;
        float sc = ok ? uintBitsToFloat(st[base + p.scale_word + h]) : 0.0;
        for (uint i = lid; i < hs; i += WG) {
            uint b = h * hs + i;
            uint c = ok ? (st[base + (b >> 2)] >> (8u * (b & 3u))) & 0xffu : 0u;
            float v = ok ? float(int(c << 24) >> 24) * sc : 0.0;
            if (MODE == 1u)
                snap[(s * H + h) * hs + i] = v;
            else
                S[i] = v;
        }
        if (MODE == 1u)
            return;
    }
    barrier();
    float A = -exp(LOAD_F(a_log, p.a_off + h, A_DT));
    float Dh = D_DT == DT_NONE ? 0.0 : LOAD_F(dd, p.d_off + h, D_DT);
    float bias = DB_DT == DT_NONE ? 0.0 : LOAD_F(dt_bias, p.db_off + h, DB_DT);
    uint n_tok = p.n_tok, n_ckpt = p.n_ckpt;
    for (uint c = 0u; c < n_ckpt; c++)
        if (n_tok + c == n_ckpt - 1u)
            store_state(idx[p.ckpt_off + s * n_ckpt + c], h, hs);
    int snap_t, snap = snap_of(s, snap_t); /* the same for the whole workgroup */
    uint d_inner = H * P;
    for (uint t = 0u; t < n_tok; t++) {
        uint tok = s * n_tok + t;
        uint row = p.xbc_off + tok * p.conv_dim;
        float v = dt[p.dt_off + tok * H + h] + bias;
        float dtv = v > 20.0 ? v : log(1.0 + exp(v));
        dtv = dtv < p.dt_min ? p.dt_min : dtv;
        dtv = dtv > p.dt_max ? p.dt_max : dtv;
        float dA = exp(dtv * A);
        for (uint i = lid; i < hs; i += WG) {
            uint pp = i / N, n = i % N;
            S[i] = S[i] * dA + xbc[row + h * P + pp] * dtv * xbc[row + d_inner + g * N + n];
        }
        barrier();
        for (uint pp = lid; pp < P; pp += WG) {
            float acc = 0.0;
            for (uint n = 0u; n < N; n++)
                acc += S[pp * N + n] * xbc[row + d_inner + G * N + g * N + n];
            y[p.y_off + tok * d_inner + h * P + pp] = acc + Dh * xbc[row + h * P + pp];
        }
        barrier();
        for (uint c = 0u; c < n_ckpt; c++)
            if (n_tok + c == n_ckpt + t)
                store_state(idx[p.ckpt_off + s * n_ckpt + c], h, hs);
        if (SNAPSHOT != 0u && int(t) == snap_t)
            store_state(snap, h, hs);
    }
    store_state(idx[p.dst_off + s], h, hs);
}

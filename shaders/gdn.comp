#version 450
#extension GL_GOOGLE_include_directive : enable
/* Gated delta rule, recurrent form (Yang, Kautz & Hatamizadeh 2024, "Gated
 * Delta Networks", eq. (10); transformers Qwen3NextGatedDeltaNet with
 * torch_recurrent_gated_delta_rule, use_qk_l2norm_in_kernel), token by
 * token for every ubatch (the CPU reference, backends/cpu/ops_gdn.c, runs
 * prefill in its chunked form; both are the same recurrence):
 *   q = l2norm(q_g) / sqrt(d_k), k = l2norm(k_g), beta = sigmoid(b),
 *   g = -exp(A_log) * softplus(a + dt_bias),
 *   S = e^g S;  S += k ⊗ beta (v - Sᵀ k);  o = Sᵀ q.
 * Columns j of S_h [d_k][d_v] evolve independently, so one invocation keeps
 * one column S[0..DK, j] in registers; a workgroup covers WG columns of one
 * (group s, value head h). q and k of the token go through shared memory.
 * States come from src_slot[s] (-1: zeros; with SNAP from state_gather's
 * f32 snapshot) and are written in the state dtype to the checkpoint slots
 * (after token n_tok - n_ckpt + k; -1 = before the first), to snap_slot[s]
 * after token snap_tok[s] (the snapshot inside the ubatch, when the view
 * has one) and to dst_slot[s]. WO (DK <= 128; $LLMEM_VULKAN_GDN_WO, the
 * host's default): every loop over S written out with literal indices (the
 * G128 macro): driver 580 kept them rolled, so S lived in local memory (512
 * bytes an invocation at DK 128, 32 registers; written out 255 and none:
 * H200 bench gdn decode 0.106 ms against 0.308, prefill 1.30 against 2.41).
 * The same operations in the same order, but a driver may contract a
 * product and a sum into an fma in one form and not the other (the H200's
 * bits differ, lavapipe's do not): both within f32 rounding of float64. */
#include "common.glsl"

layout(constant_id = 1) const uint DK = 128; /* d_k */
layout(constant_id = 2) const uint ST_DT = 0;
layout(constant_id = 3) const uint A_DT = 0;
layout(constant_id = 4) const uint DB_DT = 0;
layout(constant_id = 5) const uint SNAP = 0;
layout(constant_id = 6) const uint SNAPSHOT = 0; /* some group has a snapshot inside the ubatch */
layout(constant_id = 7) const uint WO_ON = 0;    /* 1: S's loops written out (DK <= 128) */
const bool WO = WO_ON != 0u && DK <= 128u;

layout(binding = 0) readonly buffer Qkv { float qkv[]; };
layout(binding = 1) readonly buffer Aa { float aa[]; };
layout(binding = 2) readonly buffer Bb { float bb[]; };
layout(binding = 3) readonly buffer Al { uint a_log[]; };
layout(binding = 4) readonly buffer Db { uint dt_bias[]; };
layout(binding = 5) writeonly buffer O { float o[]; };
layout(binding = 6) readonly buffer Idx { int idx[]; };
layout(binding = 7) buffer St { uint st[]; };
layout(binding = 8) readonly buffer Snap { float snap[]; };

layout(push_constant) uniform P {
    uint n_seqs, n_tok, n_k_heads, n_v_heads, d_v, n_ckpt, n_slots, n_cb;
    uint qkv_off, a_off, b_off, al_off, db_off, o_off, src_off, dst_off, ckpt_off, width;
    uint snap_tok_off, snap_slot_off;
} p;

shared float qs[DK];
shared float ks[DK];

float S[WO ? 128u : DK]; /* WO: 128, so that every literal index is within the array */

/* WO: m(i) for i = 0 .. 127 (parenthesized), each body guarded by i < DK */
#define G16(m, b_) m((b_ + 0u)) m((b_ + 1u)) m((b_ + 2u)) m((b_ + 3u)) m((b_ + 4u)) \
    m((b_ + 5u)) m((b_ + 6u)) m((b_ + 7u)) m((b_ + 8u)) m((b_ + 9u)) m((b_ + 10u)) \
    m((b_ + 11u)) m((b_ + 12u)) m((b_ + 13u)) m((b_ + 14u)) m((b_ + 15u))
#define G128(m) G16(m, 0u) G16(m, 16u) G16(m, 32u) G16(m, 48u) G16(m, 64u) G16(m, 80u) \
    G16(m, 96u) G16(m, 112u)
/* the loops' bodies at element i of the column */
#define G_STORE(i) if (i < DK) STORE_F(st, base + i * p.d_v, ST_DT, S[i]);
#define G_LOAD(i) if (i < DK) { float val = 0.0; \
    if (act) { if (SNAP != 0u) val = snap[s * slot_elems + at + i * p.d_v]; \
               else if (src >= 0 && uint(src) < p.n_slots) \
                   val = LOAD_F(st, uint(src) * slot_elems + at + i * p.d_v, ST_DT); } \
    S[i] = val; }
#define G_DECAY(i) if (i < DK) { S[i] *= decay; kv += S[i] * ks[i]; }
#define G_UPDATE(i) if (i < DK) { S[i] += ks[i] * kn * d; acc += S[i] * qs[i]; }

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

/* Column j of head h of a slot: elements (h * DK + i) * d_v + j. */
void store_col(int slot, uint h, uint j, bool act)
{
    if (!act || slot < 0 || uint(slot) >= p.n_slots)
        return;
    uint base = uint(slot) * p.n_v_heads * DK * p.d_v + h * DK * p.d_v + j;
    if (WO) {
        G128(G_STORE)
        return;
    }
    for (uint i = 0; i < DK; i++)
        STORE_F(st, base + i * p.d_v, ST_DT, S[i]);
}

void main()
{
    uint item = group_id();
    if (item >= p.n_seqs * p.n_v_heads * p.n_cb)
        return;
    uint cb = item % p.n_cb;
    uint h = (item / p.n_cb) % p.n_v_heads;
    uint s = item / (p.n_cb * p.n_v_heads);
    uint l = gl_LocalInvocationID.x;
    uint j = cb * WG + l;
    bool act = j < p.d_v;
    uint g = h / (p.n_v_heads / p.n_k_heads);
    uint slot_elems = p.n_v_heads * DK * p.d_v;
    uint at = h * DK * p.d_v + j;

    int src = idx[p.src_off + s];
    if (WO) {
        G128(G_LOAD)
    } else for (uint i = 0; i < DK; i++) {
        float val = 0.0;
        if (act) {
            if (SNAP != 0u)
                val = snap[s * slot_elems + at + i * p.d_v];
            else if (src >= 0 && uint(src) < p.n_slots)
                val = LOAD_F(st, uint(src) * slot_elems + at + i * p.d_v, ST_DT);
        }
        S[i] = val;
    }
    float A = -exp(LOAD_F(a_log, p.al_off + h, A_DT));
    float bias = LOAD_F(dt_bias, p.db_off + h, DB_DT);
    int first_ckpt = int(p.n_tok) - int(p.n_ckpt);
    for (uint k = 0; k < p.n_ckpt; k++)
        if (first_ckpt + int(k) == -1)
            store_col(idx[p.ckpt_off + s * p.n_ckpt + k], h, j, act);
    int snap_t, snap = snap_of(s, snap_t); /* the same for the whole workgroup */

    for (uint t = 0; t < p.n_tok; t++) {
        uint tok = s * p.n_tok + t;
        uint rb = p.qkv_off + tok * p.width;
        barrier();
        for (uint i = l; i < DK; i += WG) {
            qs[i] = qkv[rb + g * DK + i];
            ks[i] = qkv[rb + p.n_k_heads * DK + g * DK + i];
        }
        barrier();
        float qq = 0.0, kk = 0.0;
        for (uint i = 0; i < DK; i++) {
            qq += qs[i] * qs[i];
            kk += ks[i] * ks[i];
        }
        float qn = inversesqrt(qq + 1e-6) * inversesqrt(float(DK)), kn = inversesqrt(kk + 1e-6);
        float beta = 1.0 / (1.0 + exp(-bb[p.b_off + tok * p.n_v_heads + h]));
        float decay = exp(A * softplus(aa[p.a_off + tok * p.n_v_heads + h] + bias));
        if (act) {
            float kv = 0.0;
            if (WO) {
                G128(G_DECAY)
            } else for (uint i = 0; i < DK; i++) {
                S[i] *= decay;
                kv += S[i] * ks[i];
            }
            float v = qkv[rb + 2u * p.n_k_heads * DK + h * p.d_v + j];
            float d = beta * (v - kv * kn);
            float acc = 0.0;
            if (WO) {
                G128(G_UPDATE)
            } else for (uint i = 0; i < DK; i++) {
                S[i] += ks[i] * kn * d;
                acc += S[i] * qs[i];
            }
            o[p.o_off + tok * p.n_v_heads * p.d_v + h * p.d_v + j] = acc * qn;
        }
        int k = int(t) - first_ckpt;
        if (k >= 0 && k < int(p.n_ckpt))
            store_col(idx[p.ckpt_off + s * p.n_ckpt + uint(k)], h, j, act);
        if (SNAPSHOT != 0u && int(t) == snap_t)
            store_col(snap, h, j, act);
    }
    store_col(idx[p.dst_off + s], h, j, act);
}

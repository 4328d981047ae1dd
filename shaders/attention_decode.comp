#version 450
#extension GL_GOOGLE_include_directive : enable
/* Causal paged attention with 16-byte K/V loads, for rows of a whole
 * number of 16-byte vectors (PagedAttention, Kwon et al. SOSP 2023, for
 * the page-table addressing; FlashAttention-2, Dao 2023, Alg. 1, online
 * softmax over key chunks; flash-decoding key splits as in
 * FlashAttention-2's split-KV decode). Same bindings, push constants and
 * partial-result layout as attention.comp, which serves the other shapes.
 *
 * One workgroup per (query token i, KV head g, chunk of R of the n_rep
 * query heads sharing g, key split). Every K and V row it loads serves
 * all R heads. A row of D elements is NV = D / EV vectors of 16 bytes
 * (EV = 8 f16/bf16 or 4 f32 elements); the invocations form NG = WG / NV
 * groups of NV lanes, and lane l of a group owns elements [l EV, l EV +
 * EV) of a row. Per chunk of CK keys:
 *  (a) the keys' slots are looked up once per key (a page id outside the
 *      pool marks the key invalid: skipped, never read);
 *  (b) scores: group gi takes keys gi, gi + NG, ...; each lane loads one
 *      16-byte vector of K per key and forms R partial dot products with
 *      its slice of the queries (held in registers); the NV partials of a
 *      key meet in shared memory and one invocation per (key, head) adds
 *      them, scales and soft-caps;
 *  (c) the chunk's maximum per head (a shared-memory tree), the online
 *      softmax rescale, and exp() of each score once;
 *  (d) values: group gi accumulates p * v over the same keys into R x EV
 *      registers per lane (one 16-byte vector of V per key).
 * Loads run one round ahead: a lane issues the vectors of the next round
 * of keys before it uses those of the current one (and the first round
 * of V before the softmax step), so 2 x KPG vectors are in flight.
 * At the end the NG groups' accumulators are added (a tree through shared
 * memory). Only keys below tok_kv_len, which the host checked against
 * seq_len, are touched: unwritten slots are never read. A token whose
 * stream or length fails the device-side check sees no key (zeros).
 *
 * f16 is widened with unpackHalf2x16 (exact; a driver that flushes f16
 * subnormals to zero changes a value by less than 2^-14), bf16 by a shift.
 * No 16-bit storage feature and no subgroup operation is needed. */
#include "common.glsl"

layout(constant_id = 1) const uint D = 128;
layout(constant_id = 2) const uint KV_DT = 1;
layout(constant_id = 3) const uint R = 4;    /* 1, 2 or 4; divides WG */
layout(constant_id = 4) const uint CK = 256; /* keys per online-softmax chunk */

const uint EV = KV_DT == DT_F32 ? 4u : 8u; /* elements per 16-byte vector */
const uint NV = D / EV;                    /* vectors per row = lanes per group */
const uint NG = WG / NV;                   /* key groups */
const uint PS = NV * R + R;                /* floats per key of partials, padded against bank conflicts */
const uint RED = 2304u;                    /* >= SUB * PS, WG and (NG / 2) * NV * R * EV */
const uint KPG0 = RED / (NG * PS);
const uint KPG = KPG0 < 1u ? 1u : KPG0 > 4u ? 4u : KPG0; /* keys per group and round */
const uint SUB = NG * KPG;                 /* keys per round */
const uint HG = NG / 2u;                   /* groups that store in one step of the final tree */
const uint INVALID = 0xffffffffu;

#define NEG_INF uintBitsToFloat(0xff800000u)
/* Lane l's vector of the row of chunk key k in pool buf; zeros for keys
 * past nb and invalid keys, which are never read. */
#define ROW(buf, k) ((k) < nb && kb_s[(k)] != INVALID ? buf##_at(kb_s[(k)] + l) : uvec4(0u))

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) readonly buffer Kp { uvec4 kp[]; };
layout(binding = 4) readonly buffer Vp { uvec4 vp[]; };
layout(binding = 5) writeonly buffer Part { float part[]; };
/* Pools larger than one allocation (docs/vulkan.md, "Large buffers") are
 * bound as up to 4 chunks each: vector i of a pool is vector
 * i & (2^CSH - 1) of chunk i >> CSH. CSH = 31: one chunk, no selection. */
layout(constant_id = 5) const uint CSH = 31;
layout(binding = 6) readonly buffer Kp1 { uvec4 kp1[]; };
layout(binding = 7) readonly buffer Kp2 { uvec4 kp2[]; };
layout(binding = 8) readonly buffer Kp3 { uvec4 kp3[]; };
layout(binding = 9) readonly buffer Vp1 { uvec4 vp1[]; };
layout(binding = 10) readonly buffer Vp2 { uvec4 vp2[]; };
layout(binding = 11) readonly buffer Vp3 { uvec4 vp3[]; };

uvec4 kp_at(uint i)
{
    if (CSH >= 31u)
        return kp[i];
    uint c = i >> CSH, j = i & ((1u << CSH) - 1u);
    return c == 0u ? kp[j] : c == 1u ? kp1[j] : c == 2u ? kp2[j] : kp3[j];
}

uvec4 vp_at(uint i)
{
    if (CSH >= 31u)
        return vp[i];
    uint c = i >> CSH, j = i & ((1u << CSH) - 1u);
    return c == 0u ? vp[j] : c == 1u ? vp1[j] : c == 2u ? vp2[j] : vp3[j];
}

layout(push_constant) uniform P {
    uint n_tok, n_heads, n_kv, n_rep, n_chunks, max_pages, ps, n_pages, n_streams;
    int window;
    float scale, softcap;
    uint q_off, o_off, pt_off, sl_off, kl_off, ts_off;
    uint n_split, split_keys;
    uint po_off; /* page_off table (word offset in idx), NO_ROWS: rows at s * max_pages */
} p;

const uint NO_ROWS = 0xffffffffu;

shared uint kb_s[CK];    /* first vector of each key's row, or INVALID */
shared float sc[CK * R]; /* scores, then probabilities: [key][head] */
shared float red[RED];   /* partial dot products; reductions */
shared int range_s[2];
/* 14.5 KiB of shared memory with red_f of common.glsl, within the 16 KiB
 * every usable device has (R <= 4, CK = 256, WG = 128). */

/* Element e (constant after unrolling) of a 16-byte vector of KV_DT. */
float elem(uvec4 w, uint e)
{
    if (KV_DT == DT_F32)
        return uintBitsToFloat(w[e]);
    uint word = w[e >> 1];
    if (KV_DT == DT_F16)
        return unpackHalf2x16(word)[e & 1u];
    return uintBitsToFloat((e & 1u) != 0u ? word & 0xffff0000u : word << 16);
}

void main()
{
    uint item = group_id();
    if (item >= p.n_tok * p.n_kv * p.n_chunks * p.n_split)
        return;
    uint split = item % p.n_split;
    item /= p.n_split;
    uint chunk = item % p.n_chunks;
    uint g = (item / p.n_chunks) % p.n_kv;
    uint i = item / (p.n_chunks * p.n_kv);
    uint r0 = chunk * R;
    uint nr = min(R, p.n_rep - r0);
    uint head0 = g * p.n_rep + r0;
    uint t = gl_LocalInvocationID.x;
    uint gi = t / NV, l = t % NV;
    bool lane_on = gi < NG; /* the WG % NV last invocations only reduce */
    uint rt = t % R;         /* the head whose scores this invocation adds up */

    if (t == 0u) {
        int s = idx[p.ts_off + i];
        int len = idx[p.kl_off + i];
        bool ok = s >= 0 && uint(s) < p.n_streams && len >= 0;
        if (ok) {
            int sl = idx[p.sl_off + uint(s)];
            ok = len <= sl && (uint(sl) + p.ps - 1u) / p.ps <= p.max_pages;
        }
        if (!ok)
            len = 0;
        int lo = p.window > 0 && len > p.window ? len - p.window : 0;
        if (p.n_split > 1u) {
            int lo_s = lo + int(split * p.split_keys);
            len = min(len, lo_s + int(p.split_keys));
            lo = lo_s;
        }
        range_s[0] = lo;
        range_s[1] = len;
    }
    float qv[R * EV];
    for (uint r = 0; r < R; r++)
        for (uint e = 0; e < EV; e++)
            qv[r * EV + e] = lane_on && r < nr
                                 ? q[p.q_off + (i * p.n_heads + head0 + r) * D + l * EV + e]
                                 : 0.0;
    barrier();
    int lo = range_s[0], hi = range_s[1];
    uint s = hi > lo ? uint(idx[p.ts_off + i]) : 0u;
    uint pt = p.pt_off + (p.po_off != NO_ROWS ? uint(idx[p.po_off + s]) : s * p.max_pages);

    float acc[R * EV];
    for (uint a = 0; a < R * EV; a++)
        acc[a] = 0.0;
    float m_run[R]; /* running maximum per head, the same in every invocation */
    for (uint r = 0; r < R; r++)
        m_run[r] = NEG_INF;
    float l_part = 0.0; /* this invocation's share of head rt's running sum */

    for (int c0 = lo; c0 < hi; c0 += int(CK)) {
        uint nb = uint(min(int(CK), hi - c0));
        /* (a) slots */
        for (uint kk = t; kk < nb; kk += WG) {
            uint key = uint(c0) + kk;
            int page = idx[pt + key / p.ps];
            kb_s[kk] = page >= 0 && uint(page) < p.n_pages
                           ? ((uint(page) * p.ps + key % p.ps) * p.n_kv + g) * NV
                           : INVALID;
        }
        barrier();
        /* (b) scores, SUB keys per round */
        float m_loc = NEG_INF;
        uvec4 w[KPG], wn[KPG];
        for (uint u = 0; u < KPG; u++)
            w[u] = lane_on ? ROW(kp, u * NG + gi) : uvec4(0u);
        for (uint s0 = 0; s0 < nb; s0 += SUB) {
            if (lane_on) {
                for (uint u = 0; u < KPG; u++)
                    wn[u] = ROW(kp, s0 + SUB + u * NG + gi);
                for (uint u = 0; u < KPG; u++) {
                    float dt[R];
                    for (uint r = 0; r < R; r++)
                        dt[r] = 0.0;
                    for (uint e = 0; e < EV; e++) {
                        float x = elem(w[u], e);
                        for (uint r = 0; r < R; r++)
                            dt[r] += qv[r * EV + e] * x;
                    }
                    for (uint r = 0; r < R; r++)
                        red[(u * NG + gi) * PS + l * R + r] = dt[r];
                }
                for (uint u = 0; u < KPG; u++)
                    w[u] = wn[u];
            }
            barrier();
            for (uint e = t; e < SUB * R; e += WG) {
                uint kl = e / R, kk = s0 + kl;
                if (kk < nb) {
                    float x = 0.0;
                    for (uint j = 0; j < NV; j++)
                        x += red[kl * PS + j * R + rt];
                    x *= p.scale;
                    if (p.softcap > 0.0)
                        x = p.softcap * tanh(x / p.softcap);
                    if (kb_s[kk] == INVALID)
                        x = NEG_INF;
                    sc[kk * R + rt] = x;
                    m_loc = max(m_loc, x);
                }
            }
            barrier();
        }
        /* the first round of V, in flight during (c) */
        for (uint u = 0; u < KPG; u++)
            w[u] = lane_on ? ROW(vp, u * NG + gi) : uvec4(0u);
        /* (c) the chunk's maximum per head, rescale, probabilities */
        red[t] = m_loc;
        barrier();
        for (uint st = WG / 2u; st >= R && st > 0u; st >>= 1) {
            if (t < st)
                red[t] = max(red[t], red[t + st]);
            barrier();
        }
        float corr[R];
        float m_t = NEG_INF;
        for (uint r = 0; r < R; r++) {
            float m_new = max(m_run[r], red[r]);
            if (isinf(m_new))
                corr[r] = 1.0; /* no valid key yet: nothing changes */
            else
                corr[r] = isinf(m_run[r]) ? 0.0 : exp(m_run[r] - m_new);
            m_run[r] = m_new;
            if (r == rt)
                m_t = m_new;
        }
        for (uint r = 0; r < R; r++)
            if (r == rt)
                l_part *= corr[r];
        for (uint e = t; e < nb * R; e += WG) {
            float x = sc[e];
            float pj = isinf(x) ? 0.0 : exp(x - m_t);
            sc[e] = pj;
            l_part += pj;
        }
        for (uint a = 0; a < R * EV; a++)
            acc[a] *= corr[a / EV];
        barrier();
        /* (d) values */
        if (lane_on) {
            for (uint s0 = 0; s0 < nb; s0 += SUB) {
                for (uint u = 0; u < KPG; u++)
                    wn[u] = ROW(vp, s0 + SUB + u * NG + gi);
                for (uint u = 0; u < KPG; u++) {
                    uint k = s0 + u * NG + gi;
                    float pr[R];
                    for (uint r = 0; r < R; r++)
                        pr[r] = k < nb ? sc[k * R + r] : 0.0;
                    for (uint e = 0; e < EV; e++) {
                        float x = elem(w[u], e);
                        for (uint r = 0; r < R; r++)
                            acc[r * EV + e] += pr[r] * x;
                    }
                }
                for (uint u = 0; u < KPG; u++)
                    w[u] = wn[u];
            }
        }
        barrier();
    }

    /* sums per head */
    red[t] = l_part;
    barrier();
    for (uint st = WG / 2u; st >= R && st > 0u; st >>= 1) {
        if (t < st)
            red[t] += red[t + st];
        barrier();
    }
    float lsum[R];
    for (uint r = 0; r < R; r++)
        lsum[r] = red[r];
    barrier();
    /* the groups' accumulators, added pairwise into group 0 */
    for (uint n = NG; n > 1u;) {
        uint h = (n + 1u) / 2u;
        if (lane_on && gi >= h && gi < n)
            for (uint a = 0; a < R * EV; a++)
                red[(a * HG + (gi - h)) * NV + l] = acc[a];
        barrier();
        if (lane_on && gi + h < n)
            for (uint a = 0; a < R * EV; a++)
                acc[a] += red[(a * HG + gi) * NV + l];
        barrier();
        n = h;
    }
    if (p.n_split > 1u) {
        /* partial results of this split, merged by attn_combine.comp */
        if (gi == 0u)
            for (uint r = 0; r < R; r++)
                if (r < nr)
                    for (uint e = 0; e < EV; e++)
                        part[((i * p.n_heads + head0 + r) * p.n_split + split) * (D + 2u) + l * EV + e] =
                            acc[r * EV + e];
        for (uint r = 0; r < R; r++)
            if (r < nr && t == r) {
                uint b = ((i * p.n_heads + head0 + r) * p.n_split + split) * (D + 2u) + D;
                part[b] = m_run[r];
                part[b + 1u] = lsum[r];
            }
        return;
    }
    if (gi == 0u)
        for (uint r = 0; r < R; r++) {
            float inv = lsum[r] > 0.0 ? 1.0 / lsum[r] : 0.0;
            if (r < nr)
                for (uint e = 0; e < EV; e++)
                    o[p.o_off + (i * p.n_heads + head0 + r) * D + l * EV + e] = acc[r * EV + e] * inv;
        }
}

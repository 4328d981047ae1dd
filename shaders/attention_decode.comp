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
 * No 16-bit storage feature and no subgroup operation is needed.
 *
 * The USE_SUBGROUP=1 module (attention_decode_sg; the host takes it where
 * NV is a power of two within a subgroup, LLMEM_VULKAN_DEC_ATTN) adds a
 * key's NV partials with subgroupShuffleXor instead of shared memory: a
 * lane's M = KPG x R partials (KPG keys, R heads) are halved per exchange
 * (a reduce-scatter: at mask h the lane keeps the half of its values that
 * bit h of its lane index selects and adds its partner's copy of that
 * half), so after log2(NV) exchanges lane l holds the complete sums of
 * the values [l M / NV, (l + 1) M / NV) (M >= NV; for M < NV the last
 * exchanges add whole values and NV / M lanes hold each sum). Scores go
 * straight to sc: no barrier per round, and the chunk's maximum and the
 * sums per head are shuffles within a subgroup plus one exchange between
 * subgroups; GS = 1 streams each group's keys with its own softmax state
 * (gs_stream). The dot products are added in another order (a tree), so
 * its results differ from the plain module's in the last bits. On the
 * H200 both loops ran 4-5x slower than the plain module at the bench
 * shape (docs/benchmarks.md, "Vulkan decode attention on subgroup
 * shuffles"): the host takes it only when asked. */
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : enable
#endif
#include "common.glsl"

layout(constant_id = 1) const uint D = 128;
layout(constant_id = 2) const uint KV_DT = 1;
layout(constant_id = 3) const uint R = 4;    /* 1, 2 or 4; divides WG */
layout(constant_id = 4) const uint CK = 256; /* keys per online-softmax chunk */
/* keys per group and round of the subgroup module (1, 2, 4 or 8; 0: 4) */
layout(constant_id = 6) const uint KPG_SG = 0;
/* the subgroup module's loop: 0 chunks of CK keys as the plain module, 1 each group streams
 * its keys with its own softmax state (gs_stream; the host asks KPG x R <= NV) */
layout(constant_id = 7) const uint GS = 0;

const uint EV = KV_DT == DT_F32 ? 4u : 8u; /* elements per 16-byte vector */
const uint NV = D / EV;                    /* vectors per row = lanes per group */
const uint NG = WG / NV;                   /* key groups */
const uint PS = NV * R + R;                /* floats per key of partials, padded against bank conflicts */
#if USE_SUBGROUP
const uint RED0 = (NG / 2u) * NV * R * EV;
const uint RED = RED0 > WG ? RED0 : WG;    /* >= WG and (NG / 2) * NV * R * EV */
const uint KPG = KPG_SG == 0u ? 4u : KPG_SG; /* keys per group and round */
const uint M = KPG * R;                    /* partials per lane and round */
const uint MF = M >= NV ? M / NV : 1u;     /* complete sums per lane after the exchanges */
const uint REP = M >= NV ? 1u : NV / M;    /* lanes holding each sum */
#else
const uint RED = 2304u;                    /* >= SUB * PS, WG and (NG / 2) * NV * R * EV */
const uint KPG0 = RED / (NG * PS);
const uint KPG = KPG0 < 1u ? 1u : KPG0 > 4u ? 4u : KPG0; /* keys per group and round */
#endif
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
 * every usable device has (R <= 4, CK = 256, WG = 128); the subgroup
 * module's RED grows with WG (the host checks it against the limit). */

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

/* Per invocation (private): the queries' slice, the accumulators (main) and a group's final
 * maximum and sum per head (gs_stream); global so that gs_stream reads and writes them. */
float qv[R * EV];
float acc[R * EV];
float m_out[R], l_out[R];

#if USE_SUBGROUP
/* x combined (max when is_max, else added) over the invocations of the
 * workgroup whose index is rt modulo R, returned to every invocation: a
 * butterfly over the subgroup's lanes of that head (the subgroup size is
 * a multiple of R, checked on the host), then the subgroups' results
 * through red[]. Every invocation calls it (it has barriers); red[] is
 * free again after it returns. */
float head_reduce(float x, bool is_max, uint rt)
{
    for (uint h = R; h < gl_SubgroupSize; h <<= 1) {
        float y = subgroupShuffleXor(x, h);
        x = is_max ? max(x, y) : x + y;
    }
    if (gl_SubgroupInvocationID < R)
        red[gl_SubgroupID * R + rt] = x;
    barrier();
    x = red[rt];
    for (uint sg = 1; sg < gl_NumSubgroups; sg++) {
        float y = red[sg * R + rt];
        x = is_max ? max(x, y) : x + y;
    }
    barrier();
    return x;
}

/* The slot (first vector of the row) of key `key` of KV head g in [.., hi) through page-table
 * row pt, or INVALID (past hi, or a page outside the pool). */
uint gs_slot(int key, int hi, uint pt, uint g)
{
    if (key >= hi)
        return INVALID;
    uint k = uint(key);
    int page = idx[pt + k / p.ps];
    return page >= 0 && uint(page) < p.n_pages ? ((uint(page) * p.ps + k % p.ps) * p.n_kv + g) * NV
                                                : INVALID;
}

/* GS = 1: group gi streams keys [lo, hi) of rounds of SUB keys (its keys lo + q SUB + u NG +
 * gi, u < KPG), K and V of round q + 1 in flight during round q and the slots of round q + 2
 * (lane u < KPG looks up key u of the group; shuffles hand the slots to the group), with no
 * barrier: the round's M = KPG R dot products are reduce-scattered (M <= NV: lane l holds the
 * complete sum of value l / REP = u R + r), the group's maximum per head is a butterfly over
 * the lanes of that head, and the probabilities and rescale factors are shuffled back to every
 * lane for the V accumulation (FlashAttention-2's online softmax per group). Leaves the
 * group's accumulators in acc and its maximum and sum per head in m_out, l_out (the same in
 * every lane of the group); the caller merges the groups. */
void gs_stream(int lo, int hi, uint pt, uint g, uint gi, uint l)
{
    uint gb = (gl_SubgroupInvocationID / NV) * NV; /* the group's first lane in the subgroup */
    uint my = l / REP, my_u = my / R;             /* value held after the exchanges */
    float m_run = NEG_INF, l_run = 0.0;           /* head my % R of this group */
    uint s0 = gs_slot(lo + int(l * NG + gi), l < KPG ? hi : lo, pt, g);
    uint s1 = gs_slot(lo + int(SUB + l * NG + gi), l < KPG ? hi : lo, pt, g);
    uvec4 kw[KPG], vw[KPG], kn[KPG], vn[KPG];
    for (uint u = 0; u < KPG; u++) {
        uint su = subgroupShuffle(s0, gb + u);
        kw[u] = su != INVALID ? kp_at(su + l) : uvec4(0u);
        vw[u] = su != INVALID ? vp_at(su + l) : uvec4(0u);
    }
    for (int b = lo; b < hi; b += int(SUB)) {
        uint s2 = gs_slot(b + int(2u * SUB + l * NG + gi), l < KPG ? hi : lo, pt, g);
        for (uint u = 0; u < KPG; u++) {
            uint su = subgroupShuffle(s1, gb + u);
            kn[u] = su != INVALID ? kp_at(su + l) : uvec4(0u);
            vn[u] = su != INVALID ? vp_at(su + l) : uvec4(0u);
        }
        float pv[M];
        for (uint a = 0; a < M; a++)
            pv[a] = 0.0;
        for (uint u = 0; u < KPG; u++)
            for (uint e = 0; e < EV; e++) {
                float x = elem(kw[u], e);
                for (uint r = 0; r < R; r++)
                    pv[u * R + r] += qv[r * EV + e] * x;
            }
        uint hm = M;
        for (uint h = NV / 2u; h > 0u; h >>= 1) {
            bool up = (l & h) != 0u;
            if (hm > 1u) {
                hm >>= 1;
                for (uint a = 0; a < M / 2u; a++)
                    if (a < hm) {
                        float keep = up ? pv[a + hm] : pv[a];
                        float send = up ? pv[a] : pv[a + hm];
                        pv[a] = keep + subgroupShuffleXor(send, h);
                    }
            } else
                pv[0] += subgroupShuffleXor(pv[0], h);
        }
        float x = pv[0] * p.scale;
        if (p.softcap > 0.0)
            x = p.softcap * tanh(x / p.softcap);
        if (subgroupShuffle(s0, gb + my_u) == INVALID)
            x = NEG_INF;
        float mx = x;
        for (uint h = REP * R; h < NV; h <<= 1)
            mx = max(mx, subgroupShuffleXor(mx, h));
        float m_new = max(m_run, mx);
        float corr = isinf(m_new) ? 1.0 : isinf(m_run) ? 0.0 : exp(m_run - m_new);
        float pr = isinf(x) ? 0.0 : exp(x - m_new);
        m_run = m_new;
        l_run = l_run * corr + (l % REP == 0u ? pr : 0.0);
        for (uint r = 0; r < R; r++) {
            float c = subgroupShuffle(corr, gb + r * REP);
            for (uint e = 0; e < EV; e++)
                acc[r * EV + e] *= c;
        }
        for (uint u = 0; u < KPG; u++) {
            float pu[R];
            for (uint r = 0; r < R; r++)
                pu[r] = subgroupShuffle(pr, gb + (u * R + r) * REP);
            for (uint e = 0; e < EV; e++) {
                float y = elem(vw[u], e);
                for (uint r = 0; r < R; r++)
                    acc[r * EV + e] += pu[r] * y;
            }
        }
        for (uint u = 0; u < KPG; u++) {
            kw[u] = kn[u];
            vw[u] = vn[u];
        }
        s0 = s1;
        s1 = s2;
    }
    /* the group's sum per head: lanes of other keys and replicas (zeros) */
    for (uint h = 1u; h < NV; h <<= 1)
        if (h < REP || h >= REP * R)
            l_run += subgroupShuffleXor(l_run, h);
    for (uint r = 0; r < R; r++) {
        m_out[r] = subgroupShuffle(m_run, gb + r * REP);
        l_out[r] = subgroupShuffle(l_run, gb + r * REP);
    }
}
#endif

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
    for (uint r = 0; r < R; r++)
        for (uint e = 0; e < EV; e++)
            qv[r * EV + e] = lane_on && r < nr
                                 ? q[p.q_off + (i * p.n_heads + head0 + r) * D + l * EV + e]
                                 : 0.0;
    barrier();
    int lo = range_s[0], hi = range_s[1];
    uint s = hi > lo ? uint(idx[p.ts_off + i]) : 0u;
    uint pt = p.pt_off + (p.po_off != NO_ROWS ? uint(idx[p.po_off + s]) : s * p.max_pages);

    for (uint a = 0; a < R * EV; a++)
        acc[a] = 0.0;
    float m_run[R]; /* running maximum per head, the same in every invocation */
    for (uint r = 0; r < R; r++)
        m_run[r] = NEG_INF;
    float l_part = 0.0; /* this invocation's share of head rt's running sum */
    float lsum[R];
#if USE_SUBGROUP
    if (GS != 0u) {
        /* the groups' states merged (as attn_combine.comp merges splits) */
        gs_stream(lo, hi, pt, g, gi, l);
        if (l == 0u)
            for (uint r = 0; r < R; r++) {
                red[gi * 2u * R + r] = m_out[r];
                red[gi * 2u * R + R + r] = l_out[r];
            }
        barrier();
        for (uint r = 0; r < R; r++) {
            float mm = NEG_INF;
            for (uint j = 0; j < NG; j++)
                mm = max(mm, red[j * 2u * R + r]);
            float ls = 0.0;
            for (uint j = 0; j < NG; j++) {
                float mj = red[j * 2u * R + r];
                ls += isinf(mj) ? 0.0 : exp(mj - mm) * red[j * 2u * R + R + r];
            }
            float f = isinf(m_out[r]) ? 0.0 : exp(m_out[r] - mm);
            for (uint e = 0; e < EV; e++)
                acc[r * EV + e] *= f;
            m_run[r] = mm;
            lsum[r] = ls;
        }
        barrier();
    } else {
#endif
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
#if USE_SUBGROUP
        /* every lane is on (WG % NV == 0) */
        for (uint s0 = 0; s0 < nb; s0 += SUB) {
            for (uint u = 0; u < KPG; u++)
                wn[u] = ROW(kp, s0 + SUB + u * NG + gi);
            float pv[M]; /* [key u][head r] */
            for (uint a = 0; a < M; a++)
                pv[a] = 0.0;
            for (uint u = 0; u < KPG; u++)
                for (uint e = 0; e < EV; e++) {
                    float x = elem(w[u], e);
                    for (uint r = 0; r < R; r++)
                        pv[u * R + r] += qv[r * EV + e] * x;
                }
            for (uint u = 0; u < KPG; u++)
                w[u] = wn[u];
            /* the reduce-scatter of the header; hm values left per lane */
            uint hm = M;
            for (uint h = NV / 2u; h > 0u; h >>= 1) {
                bool up = (l & h) != 0u;
                if (hm > 1u) {
                    hm >>= 1;
                    for (uint a = 0; a < M / 2u; a++)
                        if (a < hm) {
                            float keep = up ? pv[a + hm] : pv[a];
                            float send = up ? pv[a] : pv[a + hm];
                            pv[a] = keep + subgroupShuffleXor(send, h);
                        }
                } else
                    pv[0] += subgroupShuffleXor(pv[0], h);
            }
            if (l % REP == 0u)
                for (uint a = 0; a < MF; a++) {
                    uint x_i = a + MF * (l / REP); /* = u R + r */
                    uint kk = s0 + (x_i / R) * NG + gi;
                    if (kk < nb) {
                        float x = pv[a] * p.scale;
                        if (p.softcap > 0.0)
                            x = p.softcap * tanh(x / p.softcap);
                        if (kb_s[kk] == INVALID)
                            x = NEG_INF;
                        sc[kk * R + x_i % R] = x;
                    }
                }
        }
        barrier();
        for (uint e = t; e < nb * R; e += WG)
            m_loc = max(m_loc, sc[e]); /* head e % R = rt */
#else
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
#endif
        /* the first round of V, in flight during (c) */
        for (uint u = 0; u < KPG; u++)
            w[u] = lane_on ? ROW(vp, u * NG + gi) : uvec4(0u);
        /* (c) the chunk's maximum per head, rescale, probabilities */
        float m_chunk[R];
#if USE_SUBGROUP
        m_loc = head_reduce(m_loc, true, rt);
        for (uint r = 0; r < R; r++)
            m_chunk[r] = subgroupShuffle(m_loc, r); /* lane r's head is r */
#else
        red[t] = m_loc;
        barrier();
        for (uint st = WG / 2u; st >= R && st > 0u; st >>= 1) {
            if (t < st)
                red[t] = max(red[t], red[t + st]);
            barrier();
        }
        for (uint r = 0; r < R; r++)
            m_chunk[r] = red[r];
#endif
        float corr[R];
        float m_t = NEG_INF;
        for (uint r = 0; r < R; r++) {
            float m_new = max(m_run[r], m_chunk[r]);
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
#if USE_SUBGROUP
    l_part = head_reduce(l_part, false, rt);
    for (uint r = 0; r < R; r++)
        lsum[r] = subgroupShuffle(l_part, r);
#else
    red[t] = l_part;
    barrier();
    for (uint st = WG / 2u; st >= R && st > 0u; st >>= 1) {
        if (t < st)
            red[t] += red[t + st];
        barrier();
    }
    for (uint r = 0; r < R; r++)
        lsum[r] = red[r];
    barrier();
#endif
#if USE_SUBGROUP
    }
#endif
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

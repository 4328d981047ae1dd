#version 450
#extension GL_GOOGLE_include_directive : enable
/* Sampling ops over rows of logits x [rows, V] f32 (the contract is in
 * <llmem/ops.h>), one workgroup per row:
 *   MODE 0  sample: one token id per row (temperature > 0; greedy rows use
 *           argmax.comp) with top-k, top-p and min-p;
 *   MODE 1  top_logprobs: the n largest entries, descending, lower index
 *           first on ties, with their log-probabilities;
 *   MODE 2  logprob_gather: log_softmax(x)[ids[r]].
 *
 * Thresholds without sorting. An entry's key is its value's bits mapped to
 * an unsigned order (negatives flipped, -0 as +0), so "x_j > x_i" is
 * "key_j > key_i". The top-k threshold is the k-th largest key, found by a
 * radix select (4-bit digits from the top, 8 passes over the row: a
 * histogram per pass, then the bucket that holds the k-th; Alabi et al.
 * 2012, "Fast k-selection algorithms for graphics processing units"). The
 * top-p threshold is the smallest kept value v whose strictly larger kept
 * mass S(v) is below top_p * W_k: S falls as v grows, so the same radix
 * walk, on mass instead of counts, finds it. Kept: key >= both thresholds,
 * weight >= min_p, weight > 0. The draw scans the row in vocabulary order:
 * each invocation sums its contiguous segment, an exclusive scan places
 * u * W in one segment, and that invocation walks it.
 * Sums are f32 (the CPU reference sums in double): a draw may differ from
 * the CPU's only where u * W, or top_p * W_k, is within rounding of a
 * boundary, as the contract allows. */
#include "common.glsl"

layout(constant_id = 1) const uint MODE = 0;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer I { int iv[]; };  /* ctr (MODE 0), ids (MODE 2) */
layout(binding = 2) buffer O { uint o[]; };           /* ids (MODE 0, 1), f32 bits (MODE 2) */
layout(binding = 3) writeonly buffer O2 { float o2[]; }; /* top log-probs (MODE 1) */

layout(push_constant) uniform P {
    uint rows, V, x_off, i_off, o_off, o2_off, has_ctr, top_k;
    float temp, top_p, min_p;
    uint seed_lo, seed_hi, n_top;
} p;

shared uint red[16 * WG];
shared uint s_u[4];
shared float s_f[2];
shared uint s_top_key[64];
shared int s_top_idx[64];

#define NEG_INF uintBitsToFloat(0xff800000u)
#define POS_INF uintBitsToFloat(0x7f800000u)

uint key_of(float v)
{
    uint u = v == 0.0 ? 0u : floatBitsToUint(v);
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

uint mix32(uint v)
{
    v ^= v >> 16;
    v *= 0x7feb352du;
    v ^= v >> 15;
    v *= 0x846ca68bu;
    v ^= v >> 16;
    return v;
}

/* Largest non-NaN entry of the row (-inf when there is none). */
float row_max(uint base)
{
    float m = NEG_INF;
    for (uint c = gl_LocalInvocationID.x; c < p.V; c += WG) {
        float v = x[base + c];
        if (!isnan(v))
            m = max(m, v);
    }
    return wg_max(m);
}

/* log(sum_j exp(x_j)) over non-NaN entries, max-subtracted (m = row_max). */
float row_lse(uint base, float m)
{
    if (m == NEG_INF || m == POS_INF)
        return m;
    float s = 0.0;
    for (uint c = gl_LocalInvocationID.x; c < p.V; c += WG) {
        float v = x[base + c];
        if (!isnan(v))
            s += exp(v - m);
    }
    return m + log(wg_sum(s));
}

float weight(float v, float m)
{
    if (isnan(v) || v == NEG_INF)
        return 0.0;
    return v == m ? 1.0 : exp((v - m) / p.temp);
}

/* Sums digit d's 16 partial values across the workgroup into red[d * WG]
 * (invocation d does digit d, in a fixed order). */
void reduce16(bool as_float)
{
    barrier();
    uint l = gl_LocalInvocationID.x;
    if (l < 16u) {
        if (as_float) {
            float s = 0.0;
            for (uint i = 0; i < WG; i++)
                s += uintBitsToFloat(red[l * WG + i]);
            red[l * WG] = floatBitsToUint(s);
        } else {
            uint s = 0u;
            for (uint i = 0; i < WG; i++)
                s += red[l * WG + i];
            red[l * WG] = s;
        }
    }
    barrier();
}

/* The k-th largest key among the non-NaN entries (k >= 1); 0 (every key)
 * when there are fewer than k. */
uint select_kth(uint base, uint k)
{
    uint l = gl_LocalInvocationID.x;
    uint prefix = 0u, rem = k;
    for (int shift = 28; shift >= 0; shift -= 4) {
        uint hi = shift == 28 ? 0u : 0xffffffffu << uint(shift + 4);
        uint cnt[16];
        for (uint d = 0; d < 16u; d++)
            cnt[d] = 0u;
        for (uint c = l; c < p.V; c += WG) {
            float v = x[base + c];
            uint key = key_of(v);
            if (!isnan(v) && (key & hi) == prefix)
                cnt[(key >> uint(shift)) & 15u]++;
        }
        for (uint d = 0; d < 16u; d++)
            red[d * WG + l] = cnt[d];
        reduce16(false);
        if (l == 0u) {
            uint r = rem;
            s_u[2] = 1u; /* fewer candidates than r */
            for (int d = 15; d >= 0; d--) {
                uint n = red[uint(d) * WG];
                if (n >= r) {
                    s_u[0] = prefix | (uint(d) << uint(shift));
                    s_u[1] = r;
                    s_u[2] = 0u;
                    break;
                }
                r -= n;
            }
        }
        barrier();
        bool all = s_u[2] != 0u;
        prefix = s_u[0];
        rem = s_u[1];
        barrier();
        if (all)
            return 0u;
    }
    return prefix;
}

/* The smallest key among entries with key >= tk whose strictly larger
 * mass (over those entries) is below lim; see the header. */
uint select_mass(uint base, uint tk, float m, float lim)
{
    uint l = gl_LocalInvocationID.x;
    uint prefix = 0u;
    float above = 0.0;
    for (int shift = 28; shift >= 0; shift -= 4) {
        uint hi = shift == 28 ? 0u : 0xffffffffu << uint(shift + 4);
        float ws[16];
        for (uint d = 0; d < 16u; d++)
            ws[d] = 0.0;
        for (uint c = l; c < p.V; c += WG) {
            float v = x[base + c];
            uint key = key_of(v);
            if (!isnan(v) && key >= tk && (key & hi) == prefix)
                ws[(key >> uint(shift)) & 15u] += weight(v, m);
        }
        for (uint d = 0; d < 16u; d++)
            red[d * WG + l] = floatBitsToUint(ws[d]);
        reduce16(true);
        if (l == 0u) {
            float a = above;
            s_u[2] = 1u; /* every candidate is kept */
            for (int d = 15; d >= 0; d--) {
                float h = uintBitsToFloat(red[uint(d) * WG]);
                if (a + h >= lim) {
                    s_u[0] = prefix | (uint(d) << uint(shift));
                    s_f[0] = a;
                    s_u[2] = 0u;
                    break;
                }
                a += h;
            }
        }
        barrier();
        bool all = s_u[2] != 0u;
        if (!all) {
            prefix = s_u[0];
            above = s_f[0];
        }
        barrier();
        if (all)
            return prefix;
    }
    return prefix;
}

void do_sample(uint row, uint base)
{
    uint l = gl_LocalInvocationID.x;
    float m = row_max(base);
    if (m == NEG_INF) {
        if (l == 0u)
            o[p.o_off + row] = 0u;
        return;
    }
    uint tk = p.top_k > 0u ? select_kth(base, p.top_k) : 0u;
    uint tp = 0u;
    if (p.top_p < 1.0) {
        float wk = 0.0;
        for (uint c = l; c < p.V; c += WG) {
            float v = x[base + c];
            if (!isnan(v) && key_of(v) >= tk)
                wk += weight(v, m);
        }
        wk = wg_sum(wk);
        tp = select_mass(base, tk, m, p.top_p * wk);
    }
    uint t = max(tk, tp);
    /* contiguous segments, in vocabulary order */
    uint len = (p.V + WG - 1u) / WG, lo = min(l * len, p.V), hi = min(lo + len, p.V);
    float seg = 0.0;
    uint last = 0u; /* last kept index + 1 */
    for (uint c = lo; c < hi; c++) {
        float v = x[base + c];
        float w = weight(v, m);
        if (!isnan(v) && key_of(v) >= t && w > 0.0 && w >= p.min_p) {
            seg += w;
            last = c + 1u;
        }
    }
    barrier();
    red[l] = floatBitsToUint(seg);
    red[WG + l] = last;
    barrier();
    if (l == 0u) {
        float run = 0.0;
        uint lk = 0u;
        for (uint i = 0; i < WG; i++) {
            float s = uintBitsToFloat(red[i]);
            red[i] = floatBitsToUint(run);
            run += s;
            lk = max(lk, red[WG + i]);
        }
        s_f[0] = run;
        s_u[3] = lk == 0u ? 0u : lk - 1u; /* rounding left no token: the last kept */
    }
    barrier();
    uint c0 = p.has_ctr != 0u ? uint(iv[p.i_off + row]) : row;
    uint h = mix32(mix32(mix32(c0) ^ p.seed_lo) ^ p.seed_hi);
    float u = float(h >> 8) * (1.0 / 16777216.0);
    float target = u * s_f[0];
    float excl = uintBitsToFloat(red[l]);
    if (seg > 0.0 && excl <= target && target < excl + seg) {
        float r = excl;
        uint pick = last - 1u;
        for (uint c = lo; c < hi; c++) {
            float v = x[base + c];
            float w = weight(v, m);
            if (!isnan(v) && key_of(v) >= t && w > 0.0 && w >= p.min_p) {
                r += w;
                if (r > target) {
                    pick = c;
                    break;
                }
            }
        }
        s_u[3] = pick;
    }
    barrier();
    if (l == 0u)
        o[p.o_off + row] = s_u[3];
}

/* Entry a ranks before entry b: larger value, then lower index. */
bool before(uint ka, int ia, uint kb, int ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

void do_top(uint row, uint base)
{
    uint l = gl_LocalInvocationID.x, n = p.n_top;
    float m = row_max(base);
    float lse = row_lse(base, m);
    uint t = select_kth(base, n);
    if (l == 0u)
        s_u[0] = 0u;
    barrier();
    /* entries above the threshold: fewer than n */
    for (uint c = l; c < p.V; c += WG) {
        float v = x[base + c];
        uint key = key_of(v);
        if (!isnan(v) && key > t) {
            uint at = atomicAdd(s_u[0], 1u);
            s_top_key[at] = key;
            s_top_idx[at] = int(c);
        }
    }
    barrier();
    uint have = s_u[0];
    /* ties at the threshold, lowest indices first (NaN last when the row
     * has fewer than n non-NaN entries: t is then 0, no key equals it) */
    uint len = (p.V + WG - 1u) / WG, lo = min(l * len, p.V), hi = min(lo + len, p.V);
    uint ties = 0u, nans = 0u;
    for (uint c = lo; c < hi; c++) {
        float v = x[base + c];
        ties += uint(!isnan(v) && key_of(v) == t);
        nans += uint(isnan(v));
    }
    barrier();
    red[l] = ties;
    red[WG + l] = nans;
    barrier();
    if (l == 0u) {
        uint a = 0u, b = 0u;
        for (uint i = 0; i < WG; i++) {
            uint ta = red[i], tb = red[WG + i];
            red[i] = a;
            red[WG + i] = b;
            a += ta;
            b += tb;
        }
        s_u[1] = a; /* ties in all */
    }
    barrier();
    uint rank = red[l], nrank = red[WG + l];
    uint tie_take = min(s_u[1], n - have);
    for (uint c = lo; c < hi; c++) {
        float v = x[base + c];
        if (!isnan(v) && key_of(v) == t) {
            if (rank < tie_take) {
                s_top_key[have + rank] = t;
                s_top_idx[have + rank] = int(c);
            }
            rank++;
        } else if (isnan(v)) {
            uint at = have + tie_take + nrank;
            if (at < n) {
                s_top_key[at] = 0u;
                s_top_idx[at] = int(c);
            }
            nrank++;
        }
    }
    barrier();
    if (l == 0u) {
        uint filled = min(n, have + tie_take);
        /* insertion sort of the non-NaN entries (at most 64) */
        for (uint i = 1; i < filled; i++) {
            uint k = s_top_key[i];
            int id = s_top_idx[i];
            uint j = i;
            while (j > 0u && before(k, id, s_top_key[j - 1u], s_top_idx[j - 1u])) {
                s_top_key[j] = s_top_key[j - 1u];
                s_top_idx[j] = s_top_idx[j - 1u];
                j--;
            }
            s_top_key[j] = k;
            s_top_idx[j] = id;
        }
    }
    barrier();
    for (uint j = l; j < n; j += WG) {
        int id = s_top_idx[j];
        o[p.o_off + row * n + j] = uint(id);
        o2[p.o2_off + row * n + j] = x[base + uint(id)] - lse;
    }
}

void do_gather(uint row, uint base)
{
    float m = row_max(base);
    float lse = row_lse(base, m);
    if (gl_LocalInvocationID.x == 0u) {
        int id = iv[p.i_off + row];
        float r = uintBitsToFloat(0x7fc00000u); /* NaN: an id outside the row is not read */
        if (id >= 0 && uint(id) < p.V)
            r = x[base + uint(id)] - lse;
        o[p.o_off + row] = floatBitsToUint(r);
    }
}

void main()
{
    uint row = group_id();
    if (row >= p.rows)
        return;
    uint base = p.x_off + row * p.V;
    if (MODE == 0u)
        do_sample(row, base);
    else if (MODE == 1u)
        do_top(row, base);
    else
        do_gather(row, base);
}

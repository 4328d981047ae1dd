#version 450
#extension GL_GOOGLE_include_directive : enable
/* Causal paged attention (PagedAttention, Kwon et al. SOSP 2023, for the
 * page-table addressing; FlashAttention-2, Dao 2023, Alg. 1, online
 * softmax over key blocks).
 *
 * One workgroup per (query token i, KV head g, chunk of up to R of the
 * n_rep query heads sharing g). Query i of stream s = tok_seq[i] sees keys
 * j in [lo, tok_kv_len[i]); key j is slot page_table[s][j / ps] * ps +
 * j % ps of the pools [n_slots][n_kv][D] (dtype KV_DT). Per block of BK
 * keys: (a) the invocations look up the slots (a page id outside the pool
 * marks the key invalid: skipped, never read), (b) compute the scores
 * (with USE_SUBGROUP one subgroup per score, lanes over D, so K rows are
 * read coalesced), (c) one invocation per head updates the running max and
 * sum, (d) every invocation updates its (head, dim) accumulators with the
 * value rows. Only keys below tok_kv_len, which the host checked against
 * seq_len, are touched: unwritten slots are never read. A token whose
 * stream or length fails the device-side check sees no key (zeros).
 *
 * Split keys (flash-decoding): with n_split > 1, workgroup `split` of an
 * item takes only keys [lo + split * split_keys, ..) of the range and
 * writes its unnormalized accumulators and its running max and sum to
 * part[(i, head, split)][D + 2]; attn_combine.comp merges the splits. */
#include "common.glsl"

layout(constant_id = 1) const uint D = 128;
layout(constant_id = 2) const uint KV_DT = 0;
layout(constant_id = 3) const uint R = 4;
layout(constant_id = 4) const uint BK = 64;

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) readonly buffer Kp { uint kp[]; };
layout(binding = 4) readonly buffer Vp { uint vp[]; };
layout(binding = 5) writeonly buffer Part { float part[]; };

layout(push_constant) uniform P {
    uint n_tok, n_heads, n_kv, n_rep, n_chunks, max_pages, ps, n_pages, n_streams;
    int window;
    float scale, softcap;
    uint q_off, o_off, pt_off, sl_off, kl_off, ts_off;
    uint n_split, split_keys;
    uint po_off; /* page_off table (word offset in idx), NO_ROWS: rows at s * max_pages */
} p;

const uint NO_ROWS = 0xffffffffu;

const uint NACC = (R * D + WG - 1) / WG;
const uint INVALID = 0xffffffffu;

shared float qs[R * D];
shared float sc[R * BK];
shared uint kbase[BK];
shared float corr_s[R];
shared int range_s[2];

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
    uint l = gl_LocalInvocationID.x;
    uint head0 = g * p.n_rep + r0;

    if (l == 0u) {
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
        if (p.n_split > 1) {
            int lo_s = lo + int(split * p.split_keys);
            len = min(len, lo_s + int(p.split_keys));
            lo = lo_s;
        }
        range_s[0] = lo;
        range_s[1] = len;
    }
    for (uint e = l; e < R * D; e += WG) {
        uint r = e / D;
        qs[e] = r < nr ? q[p.q_off + (i * p.n_heads + head0 + r) * D + e % D] : 0.0;
    }
    barrier();
    int lo = range_s[0], len = range_s[1];
    uint s = len > lo ? uint(idx[p.ts_off + i]) : 0u;
    uint pt = p.pt_off + (p.po_off != NO_ROWS ? uint(idx[p.po_off + s]) : s * p.max_pages);

    float acc[NACC];
    for (uint a = 0; a < NACC; a++)
        acc[a] = 0.0;
    /* running max and sum of head r live with invocation r */
    float m_run = uintBitsToFloat(0xff800000u), l_run = 0.0;

    for (int j0 = lo; j0 < len; j0 += int(BK)) {
        uint nb = uint(min(int(BK), len - j0));
        /* (a) slots of the block */
        if (l < nb) {
            uint key = uint(j0) + l;
            int page = idx[pt + key / p.ps];
            kbase[l] = page >= 0 && uint(page) < p.n_pages
                           ? ((uint(page) * p.ps + key % p.ps) * p.n_kv + g) * D
                           : INVALID;
        }
        barrier();
        /* (b) scores s[r][jj] = scale * q_r . k_jj (soft-capped) */
#if USE_SUBGROUP
        for (uint pr = gl_SubgroupID; pr < nr * nb; pr += gl_NumSubgroups) {
            uint r = pr / nb, jj = pr % nb;
            uint kb = kbase[jj];
            float d_ = 0.0;
            if (kb != INVALID)
                for (uint d = gl_SubgroupInvocationID; d < D; d += gl_SubgroupSize)
                    d_ += qs[r * D + d] * LOAD_F(kp, kb + d, KV_DT);
            d_ = subgroupAdd(d_);
            if (subgroupElect()) {
                float x = d_ * p.scale;
                if (p.softcap > 0.0)
                    x = p.softcap * tanh(x / p.softcap);
                sc[r * BK + jj] = kb != INVALID ? x : uintBitsToFloat(0xff800000u);
            }
        }
#else
        for (uint pr = l; pr < nr * nb; pr += WG) {
            uint r = pr / nb, jj = pr % nb;
            uint kb = kbase[jj];
            float x = uintBitsToFloat(0xff800000u);
            if (kb != INVALID) {
                float d_ = 0.0;
                for (uint d = 0; d < D; d++)
                    d_ += qs[r * D + d] * LOAD_F(kp, kb + d, KV_DT);
                x = d_ * p.scale;
                if (p.softcap > 0.0)
                    x = p.softcap * tanh(x / p.softcap);
            }
            sc[r * BK + jj] = x;
        }
#endif
        barrier();
        /* (c) online softmax update per head */
        if (l < nr) {
            float bmax = uintBitsToFloat(0xff800000u);
            for (uint jj = 0; jj < nb; jj++)
                bmax = max(bmax, sc[l * BK + jj]);
            if (isinf(bmax)) { /* no valid key in the block: nothing changes */
                corr_s[l] = 1.0;
                for (uint jj = 0; jj < nb; jj++)
                    sc[l * BK + jj] = 0.0;
            } else {
                float m_new = max(m_run, bmax);
                float c = exp(m_run - m_new); /* 0 on the first block */
                float sum = 0.0;
                for (uint jj = 0; jj < nb; jj++) {
                    float x = sc[l * BK + jj];
                    float pj = isinf(x) ? 0.0 : exp(x - m_new);
                    sc[l * BK + jj] = pj;
                    sum += pj;
                }
                l_run = l_run * c + sum;
                m_run = m_new;
                corr_s[l] = c;
            }
        }
        barrier();
        /* (d) acc[r][d] = acc * corr + sum_jj p[r][jj] v_jj[d] */
        for (uint a = 0; a < NACC; a++) {
            uint e = l + a * WG;
            uint r = e / D, d = e % D;
            if (r >= nr)
                continue;
            float v = acc[a] * corr_s[r];
            for (uint jj = 0; jj < nb; jj++) {
                uint kb = kbase[jj];
                if (kb != INVALID)
                    v += sc[r * BK + jj] * LOAD_F(vp, kb + d, KV_DT);
            }
            acc[a] = v;
        }
        barrier();
    }
    if (p.n_split > 1) {
        /* partial results of this split, merged by attn_combine.comp */
        for (uint a = 0; a < NACC; a++) {
            uint e = l + a * WG;
            uint r = e / D, d = e % D;
            if (r < nr)
                part[((i * p.n_heads + head0 + r) * p.n_split + split) * (D + 2u) + d] = acc[a];
        }
        if (l < nr) {
            uint b = ((i * p.n_heads + head0 + l) * p.n_split + split) * (D + 2u) + D;
            part[b] = m_run;
            part[b + 1u] = l_run;
        }
        return;
    }
    /* the sums reach every invocation through shared memory */
    if (l < nr)
        corr_s[l] = l_run > 0.0 ? 1.0 / l_run : 0.0;
    barrier();
    for (uint a = 0; a < NACC; a++) {
        uint e = l + a * WG;
        uint r = e / D, d = e % D;
        if (r < nr)
            o[p.o_off + (i * p.n_heads + head0 + r) * D + d] = acc[a] * corr_s[r];
    }
}

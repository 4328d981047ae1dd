#version 450
#extension GL_GOOGLE_include_directive : enable
/* Top-k expert routing (llmem_op_moe_route), one workgroup per token:
 * the invocations compute the scores s (softmax or sigmoid) and the
 * selection scores c = s + bias into shared memory, then invocation 0 keeps
 * the topk_group best groups (each scored by the sum of its two best c)
 * and selects the k largest c in descending order, lower index first on
 * ties, exactly as the CPU reference. Weights are s of the chosen experts,
 * renormalized by (sum + 1e-20) when asked, times the routed scale. */
#include "common.glsl"

layout(constant_id = 1) const uint B_DT = 3; /* DT_NONE: no bias */
layout(constant_id = 2) const uint MAXE = 64;

layout(binding = 0) readonly buffer L { float lg[]; };
layout(binding = 1) readonly buffer B { uint bias[]; };
layout(binding = 2) writeonly buffer ID { int ids[]; };
layout(binding = 3) buffer WT { float wt[]; };

layout(push_constant) uniform P {
    uint T, E, k, sigmoid, norm, n_group, topk_group, l_off, b_off, id_off, w_off;
    float scale;
} p;

shared float s[MAXE];
shared float c[MAXE];
shared uint keep[MAXE];

void main()
{
    uint t = group_id();
    if (t >= p.T)
        return;
    uint l = gl_LocalInvocationID.x;
    uint lr = p.l_off + t * p.E;
    const float NEG_INF = uintBitsToFloat(0xff800000u);
    float mx = NEG_INF;
    for (uint e = l; e < p.E; e += WG)
        mx = max(mx, lg[lr + e]);
    mx = p.sigmoid == 1u ? 0.0 : wg_max(mx);
    float sum = 0.0;
    for (uint e = l; e < p.E; e += WG) {
        float v = p.sigmoid == 1u ? 1.0 / (1.0 + exp(-lg[lr + e])) : exp(lg[lr + e] - mx);
        s[e] = v;
        sum += v;
    }
    sum = p.sigmoid == 1u ? 1.0 : wg_sum(sum);
    barrier();
    for (uint e = l; e < p.E; e += WG) {
        if (p.sigmoid == 0u)
            s[e] = s[e] / sum;
        c[e] = s[e] + (B_DT == DT_NONE ? 0.0 : LOAD_F(bias, p.b_off + e, B_DT));
    }
    barrier();
    if (l != 0u)
        return;
    uint G = p.n_group > 1u ? p.n_group : 1u, gs = p.E / G;
    for (uint g = 0u; g < G; g++)
        keep[g] = G == 1u ? 1u : 0u;
    if (G > 1u) {
        /* each round rescans the groups' top-2 sums (G is small) */
        for (uint n = 0u; n < p.topk_group; n++) {
            int best = -1;
            float bs = 0.0;
            for (uint g = 0u; g < G; g++) {
                if (keep[g] != 0u)
                    continue;
                float m1 = NEG_INF, m2 = NEG_INF;
                for (uint e = g * gs; e < (g + 1u) * gs; e++) {
                    if (c[e] > m1) {
                        m2 = m1;
                        m1 = c[e];
                    } else if (c[e] > m2) {
                        m2 = c[e];
                    }
                }
                float sc = m1 + m2;
                if (best < 0 || sc > bs) {
                    best = int(g);
                    bs = sc;
                }
            }
            keep[uint(best)] = 1u;
        }
    }
    float wsum = 0.0;
    float neg = NEG_INF;
    for (uint j = 0u; j < p.k; j++) {
        int best = -1;
        for (uint e = 0u; e < p.E; e++) {
            if (keep[e / gs] == 0u || c[e] == neg)
                continue;
            if (best < 0 || c[e] > c[uint(best)])
                best = int(e);
        }
        if (best < 0) /* NaN scores: the lowest unused expert */
            for (uint e = 0u; e < p.E && best < 0; e++)
                if (c[e] != neg)
                    best = int(e);
        ids[p.id_off + t * p.k + j] = best;
        float w = s[uint(best)];
        wt[p.w_off + t * p.k + j] = w;
        wsum += w;
        c[uint(best)] = neg;
    }
    for (uint j = 0u; j < p.k; j++) {
        float w = wt[p.w_off + t * p.k + j];
        if (p.norm == 1u)
            w = w / (wsum + 1e-20);
        wt[p.w_off + t * p.k + j] = w * p.scale;
    }
}

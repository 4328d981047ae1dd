#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#if CM2
#extension GL_NV_cooperative_matrix2 : require
#endif
/* The per-block work of shaders/attention_prefill_cm.comp (CM2 module, fast mode) on registers,
 * for finding which primitive of its loop costs what (vk_cm_bench "mma" entries; fa_probe.sh
 * builds the variants, docs/benchmarks.md "Vulkan prefill attention: a probe of the block's
 * primitives"). 8 subgroups a workgroup, each with 16 query rows (8 A matrices, head dim 128)
 * and 8 output accumulators; a round is one block of BN keys: S = Q K^T (BN / 16 tiles, 8
 * k-steps each), the softmax's parts, P -> A, O += P V. One K pair and one V pair of B
 * fragments serve every step (loaded once: no memory in the loop unless SHK), and S starts
 * from a value the compiler cannot know to be 0, so nothing is hoisted. Switches (-D):
 *   CM2   1: GL_NV_cooperative_matrix2 enabled (needed by CONV 1 / 4 and RMAX 1)
 *   BN    keys a block, 32 or 64
 *   SK    chains a tile of S: 1 (8 dependent steps) or 2 (k halves, added at the end)
 *   PV    0: S only (summed into a carried accumulator); 1: O += P V
 *   CONV  P -> A: 0 a fixed A (no conversion), 1 CM2 FA(ACC16(s)), 4 CM2 FA(s),
 *         2 through shared memory (f16 accumulator stored, loaded as A), 3 element copy
 *         (A's element i = the accumulator's element i: NVIDIA's layouts)
 *   EW    0: P = S; 1: p = exp(s - m); 2: also the causal mask by row / column from rcm
 *   RMAX  0: m = 0; 1 coopMatReduceNV; 2 quad shuffles (NVIDIA's layout)
 *   SOFT  1: online softmax (running max and sum, O rescaled by element every block)
 *   BAR   workgroup barriers a block
 *   SHK   1: K / V fragments loaded from shared memory at every step (as the module)
 *   RING  1: with SHK, each block's K and V rows (32 keys x 16 uvec4 each) loaded from binding
 *         0 through a page-table word (binding 3) into registers before the block's math and
 *         stored into the other of two shared stages after it (the module's ring)
 *   RING  2: the module's ring as it stood: loads only for keys inside a range (push-free: the
 *         block count) and valid page ids, a bit a bad slot, shared atomics for them, the
 *         block's bad-key word read back after the barrier, and the loads and the store
 *         skipped after the last block
 *   PRO   1: the module's prologue and epilogue: the Q tile from binding 1 (f32, scaled,
 *         packed, through shared memory) and O to binding 2 row by row; run with many
 *         workgroups of few rounds to see a workgroup's fixed cost */
#ifndef CM2
#define CM2 0
#endif
#ifndef BN
#define BN 32
#endif
#ifndef SK
#define SK 1
#endif
#ifndef PV
#define PV 1
#endif
#ifndef CONV
#define CONV 0
#endif
#ifndef EW
#define EW 0
#endif
#ifndef RMAX
#define RMAX 0
#endif
#ifndef SOFT
#define SOFT 0
#endif
#ifndef BAR
#define BAR 0
#endif
#ifndef SHK
#define SHK 0
#endif
#ifndef RING
#define RING 0
#endif
#ifndef PRO
#define PRO 0
#endif
#define NT (BN / 16)
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer H { float16_t h[]; };
layout(binding = 2) writeonly buffer O { float res[]; };
layout(binding = 0) readonly buffer H4 { uvec4 h4[]; };
layout(binding = 1) readonly buffer QF { float qg[]; };
layout(binding = 3) readonly buffer PT { int ptab[]; };
layout(push_constant) uniform Pc { uint iters; } p;

#define FA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ACC16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MMA(c_, a_, b_) c_ = coopMatMulAdd(a_, b_, c_)

/* K / V fragments (SHK) and P's staging (CONV 2): 2 x 16 rows of 17 uvec4 (head dim 128) */
/* K then V rows of a stage (RING: two stages; PRO stages the Q tile over them first) */
const uint NSHK = RING != 0 || PRO != 0 ? 4u * 2u * 16u * 17u : 2u * 16u * 17u;
const uint KO1 = 16u * 17u, VO0 = RING != 0 ? 32u * 17u : 0u, VO1 = VO0 + 16u * 17u;
shared uvec4 shk[NSHK];
shared uvec4 shp[CONV == 2 ? 8u * NT * 16u * 3u : 640u];
shared uint kbad_s[3];

#if CM2
float red_max(const in float a, const in float b)
{
    return max(a, b);
}
#endif

void main()
{
    const uint t = gl_LocalInvocationID.x, lane = t % 32u, warp = t / 32u;
    /* 0 at run time, unknown to the compiler */
    const uint z = p.iters > 0x40000000u ? 1u : 0u;
    FA qf[8];
#if PRO
    {
        /* the module's Q tile: 128 rows x 16 uvec4, 8 an invocation, f32 scaled and packed */
        const uint tile = gl_WorkGroupID.x;
        [[unroll]] for (uint n = 0u; n < 8u; n++) {
            uint e = t + n * 256u, r = e / 16u, c = e % 16u;
            uint b = ((tile * 32u + r / 4u) * 32u + (tile % 8u) * 4u + r % 4u) * 128u + 8u * c;
            b = b % (16u << 20);
            vec4 xa = vec4(qg[b], qg[b + 1u], qg[b + 2u], qg[b + 3u]) * 0.088;
            vec4 xb = vec4(qg[b + 4u], qg[b + 5u], qg[b + 6u], qg[b + 7u]) * 0.088;
            shk[r * 17u + c] = uvec4(packHalf2x16(xa.xy), packHalf2x16(xa.zw),
                                              packHalf2x16(xb.xy), packHalf2x16(xb.zw));
        }
        barrier();
        [[unroll]] for (uint k = 0u; k < 8u; k++)
            coopMatLoad(qf[k], shk, warp * 16u * 17u + 2u * k, 17u, gl_CooperativeMatrixLayoutRowMajor);
        barrier();
    }
#else
    [[unroll]] for (uint k = 0u; k < 8u; k++)
        coopMatLoad(qf[k], h, 256u * k, 16u, gl_CooperativeMatrixLayoutRowMajor);
#endif
    FB kb[2], vb[2];
    [[unroll]] for (uint n = 0u; n < 2u; n++) {
        coopMatLoad(kb[n], h, 4096u + 256u * n, 16u, gl_CooperativeMatrixLayoutColumnMajor);
        coopMatLoad(vb[n], h, 8192u + 256u * n, 16u, gl_CooperativeMatrixLayoutRowMajor);
    }
    for (uint e = t; e < NSHK; e += 256u)
        shk[e] = uvec4(e * 0x00010001u);
    uvec4 ld[4];
    uint kbm = 0u;
    /* rcm: element i of an accumulator lies in row rcm[i] / 16, column rcm[i] % 16 (NVIDIA) */
    ACC rcm = ACC(0.0);
    {
        float rc[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++)
            rc[i] = float(16u * (lane / 4u + 8u * ((i / 2u) % 2u)) + 2u * (lane % 4u) + (i % 2u) +
                          8u * (i / 4u));
        [[unroll]] for (uint i = 0u; i < uint(rcm.length()); i++)
            rcm[i] = rc[i % 8u];
    }
    barrier();
    FA pfix = qf[3];
    ACC o[8];
    [[unroll]] for (uint j = 0u; j < 8u; j++)
        o[j] = ACC(0.0);
    ACC m_acc = ACC(-1e30), l_acc = ACC(0.0), ssum = ACC(0.0);
    float m_row[2] = {-1e30, -1e30};
    for (uint it = 0u; it < p.iters; it++) {
        const float bias = float(it * z);
        uint badw = 0u; /* RING 2: the block's bad keys */
#if RING
        /* block it + 1's K and V rows: 32 keys x 16 uvec4, 2 + 2 an invocation */
        const uint kt = (it & 1u) * 2u * 2u * 16u * 17u;
#if RING == 2
        if (t == 0u)
            kbad_s[(it + 2u) % 3u] = 0u;
        if (it + 1u < p.iters) {
            kbm = 0u;
            [[unroll]] for (uint u = 0u; u < 2u; u++) {
                uint f = t + u * 256u, key = (it + 1u) * 32u + f / 16u;
                uvec4 xk = uvec4(0u), xv = uvec4(0u);
                if (key < p.iters * 32u) {
                    int pg = ptab[(gl_WorkGroupID.x * 64u + key / 16u) % 65536u];
                    if (pg >= 0 && uint(pg) < 1024u) {
                        uint a = ((uint(pg) * 16u + key) * 8u + gl_WorkGroupID.x % 8u) * 16u + f % 16u;
                        a = a % (4u << 20);
                        xk = h4[a];
                        xv = h4[a + (4u << 20)];
                    } else {
                        kbm |= 1u << u;
                    }
                }
                ld[u] = xk;
                ld[2u + u] = xv;
            }
        }
        badw = kbad_s[it % 3u];
#else
        [[unroll]] for (uint u = 0u; u < 2u; u++) {
            uint f = t + u * 256u, key = (it + 1u) * 32u + f / 16u;
            int pg = ptab[(gl_WorkGroupID.x * 64u + key / 16u) % 65536u];
            uint a = ((uint(pg) * 16u + key) * 8u + gl_WorkGroupID.x % 8u) * 16u + f % 16u;
            a = a % (4u << 20);
            ld[u] = h4[a];
            ld[2u + u] = h4[a + (4u << 20)];
        }
#endif
#else
        const uint kt = 0u;
#endif
        /* S = Q K^T */
        ACC s[NT];
#if SK == 2
        ACC s2[NT];
#endif
        [[unroll]] for (uint n = 0u; n < NT; n++) {
            s[n] = ACC(bias);
#if SK == 2
            s2[n] = ACC(0.0);
#endif
        }
        [[unroll]] for (uint k = 0u; k < 8u; k++) {
#if SHK
            FB b0, b1;
            coopMatLoad(b0, shk, kt + 2u * k, 17u, gl_CooperativeMatrixLayoutColumnMajor);
            coopMatLoad(b1, shk, kt + KO1 + 2u * k, 17u, gl_CooperativeMatrixLayoutColumnMajor);
#else
            FB b0 = kb[0], b1 = kb[1];
#endif
            [[unroll]] for (uint n = 0u; n < NT; n++) {
#if SK == 2
                if (k >= 4u) {
                    MMA(s2[n], qf[k], (n % 2u) == 0u ? b0 : b1);
                    continue;
                }
#endif
                MMA(s[n], qf[k], (n % 2u) == 0u ? b0 : b1);
            }
        }
#if SK == 2
        [[unroll]] for (uint n = 0u; n < NT; n++)
            s[n] = s[n] + s2[n];
#endif
#if !PV
        [[unroll]] for (uint n = 0u; n < NT; n++)
            ssum = ssum + s[n];
#else
        /* masks: row r's keys up to bias-relative r (a causal diagonal) */
#if EW >= 2
        [[unroll]] for (uint i = 0u; i < uint(rcm.length()); i++) {
            uint r = uint(rcm[i]) / 16u, c = uint(rcm[i]) % 16u;
            [[unroll]] for (uint n = 0u; n < NT; n++) {
                int j = int(it * z) + int(16u * n + c);
                s[n][i] = j <= int(r + 8u * warp) && (badw & (1u << (16u * n + c))) == 0u ? s[n][i] : -1e30;
            }
        }
#endif
        /* the rows' maxima of this block into tm */
        ACC tm = ACC(0.0);
#if RMAX
        [[unroll]] for (uint i = 0u; i < uint(tm.length()); i++) {
            float x = s[0][i];
            [[unroll]] for (uint n = 1u; n < NT; n++)
                x = max(x, s[n][i]);
            tm[i] = x;
        }
#if RMAX == 1
        coopMatReduceNV(tm, tm, gl_CooperativeMatrixReduceRowNV, red_max);
#else
        {
            /* NVIDIA: elements 0, 1, 4, 5 in row lane / 4, 2, 3, 6, 7 in row lane / 4 + 8 */
            float a = max(max(tm[0], tm[1]), max(tm[4], tm[5]));
            float b = max(max(tm[2], tm[3]), max(tm[6], tm[7]));
            a = max(a, subgroupShuffleXor(a, 1u));
            b = max(b, subgroupShuffleXor(b, 1u));
            a = max(a, subgroupShuffleXor(a, 2u));
            b = max(b, subgroupShuffleXor(b, 2u));
#if SOFT
            /* one exponential a row for the rescale factor */
            float na = max(m_row[0], a), nb = max(m_row[1], b);
            float ca = exp(m_row[0] - na), cb = exp(m_row[1] - nb);
            m_row[0] = na;
            m_row[1] = nb;
            a = na;
            b = nb;
#endif
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                tm[i] = ((i / 2u) % 2u) == 0u ? a : b;
#if SOFT
                m_acc[i] = ((i / 2u) % 2u) == 0u ? ca : cb; /* the factors, in m_acc */
#endif
            }
        }
#endif
#endif
#if EW >= 1
        ACC cf = ACC(1.0);
        [[unroll]] for (uint i = 0u; i < uint(tm.length()); i++) {
            float mn = tm[i];
#if SOFT && RMAX != 2
            float mo = m_acc[i];
            mn = max(mo, mn);
            cf[i] = exp(mo - mn);
            m_acc[i] = mn;
#elif SOFT
            cf[i] = m_acc[i];
#endif
            float ls = 0.0;
            [[unroll]] for (uint n = 0u; n < NT; n++) {
                float pe = exp(s[n][i] - mn);
                ls += pe;
                s[n][i] = pe;
            }
#if SOFT
            l_acc[i] = l_acc[i] * cf[i] + ls;
#else
            l_acc[i] += ls;
#endif
        }
#if SOFT
        [[unroll]] for (uint j = 0u; j < 8u; j++)
            [[unroll]] for (uint i = 0u; i < uint(cf.length()); i++)
                o[j][i] *= cf[i];
#endif
#endif
        /* P -> A */
        FA pa[NT];
        [[unroll]] for (uint n = 0u; n < NT; n++) {
#if CONV == 0
            pa[n] = pfix;
            l_acc = l_acc + s[n];
#elif CONV == 1
            pa[n] = FA(ACC16(s[n]));
#elif CONV == 4
            pa[n] = FA(s[n]);
#elif CONV == 2
            const uint po = (warp * NT + n) * 48u;
            coopMatStore(ACC16(s[n]), shp, po, 3u, gl_CooperativeMatrixLayoutRowMajor);
            controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,
                           gl_SemanticsAcquireRelease);
            coopMatLoad(pa[n], shp, po, 3u, gl_CooperativeMatrixLayoutRowMajor);
#else
            [[unroll]] for (uint i = 0u; i < uint(pa[n].length()); i++)
                pa[n][i] = float16_t(s[n][i]);
#endif
        }
#if CONV == 2
        controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,
                       gl_SemanticsAcquireRelease);
#endif
        /* O += P V */
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
#if SHK
            FB v0, v1;
            coopMatLoad(v0, shk, kt + VO0 + 2u * j, 17u, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(v1, shk, kt + VO1 + 2u * j, 17u, gl_CooperativeMatrixLayoutRowMajor);
#else
            FB v0 = vb[0], v1 = vb[1];
#endif
            [[unroll]] for (uint n = 0u; n < NT; n++)
                MMA(o[j], pa[n], (n % 2u) == 0u ? v0 : v1);
        }
#endif
#if RING
        /* into the other stage, read last in the block before */
#if RING == 2
        if (it + 1u < p.iters)
#endif
        [[unroll]] for (uint u = 0u; u < 2u; u++) {
            uint f = t + u * 256u;
            uint so = (kt ^ (2u * 2u * 16u * 17u)) + (f / 16u) * 17u + f % 16u;
#if RING == 2
            if (f % 16u == 0u && (kbm & (1u << u)) != 0u)
                atomicOr(kbad_s[(it + 1u) % 3u], 1u << (f / 16u));
#endif
            shk[so] = ld[u];
            shk[so + 2u * 16u * 17u] = ld[2u + u];
        }
#endif
        [[unroll]] for (uint b = 0u; b < BAR; b++)
            barrier();
    }
    ACC sum = ssum + l_acc + m_acc;
    [[unroll]] for (uint j = 0u; j < 8u; j++)
        sum = sum + o[j];
    uint sg = gl_WorkGroupID.x * 8u + warp;
#if PRO
    /* the module's epilogue: each matrix through shared memory, 16 floats a row-half */
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        coopMatStore(o[j] + sum, shp, warp * 80u, 5u, gl_CooperativeMatrixLayoutRowMajor);
        controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,
                       gl_SemanticsAcquireRelease);
        const uint so = warp * 80u + (lane / 2u) * 5u + 2u * (lane % 2u);
        const uint ob = ((gl_WorkGroupID.x * 128u + warp * 16u + lane / 2u) * 128u) % (100u << 20);
        [[unroll]] for (uint c = 0u; c < 2u; c++) {
            vec4 y = uintBitsToFloat(shp[so + c]);
            [[unroll]] for (uint e = 0u; e < 4u; e++)
                res[ob + 16u * j + 8u * (lane % 2u) + 4u * c + e] = y[e];
        }
        controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,
                       gl_SemanticsAcquireRelease);
    }
#else
    coopMatStore(sum, res, (sg % 4096u) * 256u, 16u, gl_CooperativeMatrixLayoutRowMajor);
#endif
}

#version 450
#extension GL_GOOGLE_include_directive : enable
/* Causal paged decode attention streamed by subgroups, with no barrier in
 * the key loop (PagedAttention, Kwon et al. SOSP 2023, for the page-table
 * addressing; FlashAttention-2, Dao 2023, Alg. 1, online softmax, here per
 * subgroup; flash-decoding key splits as FlashAttention-2's split-KV
 * decode). Same bindings, push constants, work items and partial-result
 * layout as attention_decode.comp (its plain module serves the devices and
 * shapes this one does not; vk_ops_attention.c dec_attn_pick).
 *
 * One workgroup per (query token i, KV head g, chunk of R of the n_rep
 * query heads sharing g, key split), NSG = WG / SGS subgroups of SGS lanes.
 * A row of D elements is NV = D / EV vectors of 16 bytes (EV = 8 f16/bf16
 * or 4 f32 elements); a subgroup is KH = SGS / NV groups of NV lanes, and
 * lane l of a group owns elements [l EV, l EV + EV) of a row and holds the
 * R queries' slices in registers. Subgroup s takes steps of KS = KH x KPL
 * keys, step j covering keys lo + (j NSG + s) KS + [0, KS); group h loads
 * the keys u KH + h, u < KPL, of a step. Per step:
 *  - the step's M = KPL x R partial dot products of a lane (M <= NV) are
 *    added over the group's NV lanes by a subgroupShuffleXor
 *    reduce-scatter: at mask NV / 2, NV / 4, .. the lane keeps the half of
 *    its values that its lane bit selects and adds its partner's copy of
 *    that half, so lane l ends with the whole sum of value v = l / REP
 *    (REP = NV / M lanes hold each; v = u R + r: key u, head r);
 *  - the step's maximum per head is a butterfly over the lanes of that
 *    head; every lane rescales and exponentiates its own value;
 *  - the probabilities and rescale factors are shuffled to the lanes that
 *    hold V, which accumulate p v into R x EV registers.
 * Loads run one step ahead (K and V of step j + 1 in flight during step j,
 * 2 x KPL vectors a lane), the slots two steps ahead (lane k < KS of a
 * subgroup holds key k's slot of a step; shuffles hand the slots to the
 * loading lanes). With VAR bit 8 (PTB, the host's default) the page-table
 * words come a block of SGS / KS steps ahead, one word a lane: a word is
 * first read (its load waited for) a block after its load, where a word
 * looked up two steps ahead is waited for at the end of the step that
 * loads it (0.282 / 0.281 / 0.281 ms against 0.325 / 0.305 / 0.304 at
 * pages of 1 / 16 / 64 of the bench shape on the H200). Every loop over a
 * register array has literal bounds and [[unroll]]
 * (GL_EXT_control_flow_attributes), and the reduce-scatter's indices are
 * literals (RS_STAGE), so the arrays stay in registers (an index through a
 * loop variable put them in local memory on the H200: 0.73 ms against 0.33
 * at the bench shape). At the end the key groups of a subgroup are added
 * by shuffles and the subgroups' states merged through shared memory (as
 * attn_combine.comp merges splits). Only keys below tok_kv_len, which the
 * host checked against seq_len, are touched; an invalid page id or a key
 * past the range is masked and never read. A token whose stream or length
 * fails the device-side check sees no key (zeros).
 *
 * The host takes this module where the device has subgroup shuffles, NV
 * is a power of two within a subgroup, SGS (its reported subgroup size,
 * which the shader's subgroups must have) divides WG and the shared
 * memory fits. The dot products are added in a tree, so results differ
 * from the plain module's in the last bits (float64-checked). f16 is
 * widened with unpackHalf2x16 (exact), bf16 by a shift. On the H200
 * (driver 580) it reads the bench shape's 1 GiB at ~3,800 GB/s (the Vulkan
 * copy's rate), the plain module at ~2,400, CUDA's tensor-core kernel at
 * ~4,250 (docs/benchmarks.md, "Vulkan decode attention streamed by
 * subgroups" and "Vulkan decode attention: the page-table words a block
 * ahead"). */
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

layout(constant_id = 1) const uint D = 128;
layout(constant_id = 2) const uint KV_DT = 1;
layout(constant_id = 3) const uint R = 4;   /* 1, 2 or 4 */
layout(constant_id = 4) const uint CK = 0;  /* the plain module's chunk (unused here) */
layout(constant_id = 5) const uint CSH = 31;
layout(constant_id = 6) const uint KPL = 4; /* keys a lane loads a step: 1..8, KPL x R <= NV */
layout(constant_id = 7) const uint SGS = 32; /* subgroup size */
/* variants (LLMEM_VULKAN_DEC_ST): 1 the queries read from shared memory each step instead of
 * held in registers; 2 V loaded at the start of its own step instead of one step ahead; 4 the
 * L2 prefetch touches 64-byte segments instead of 32; 8 (PTB) the page-table words by blocks:
 * one word a lane, those of the next SGS / KS steps, loaded a block (SGS / KS steps) before
 * they are used, instead of the KS words of a step two steps ahead (at pages of 1 each step's
 * words are a new load from L2 or DRAM, whose wait the two-step lookahead may not cover);
 * 16 (ILV) the splits interleaved: split s takes the subgroup steps s, s + n_split, .. of the
 * whole key range instead of a contiguous range of split_keys keys; 32 (WO) every loop over
 * the queries, the accumulators, the partials and the loads written out with literal indices
 * (the W* macros below) instead of [[unroll]] loops: at R = 2 driver 580 kept loops over the
 * heads rolled, so qv, acc, pv and pu (400 bytes an invocation) lived in local memory (58
 * registers; 128 and none at R = 4); written out 80 registers and none, 0.32 ms against 1.71
 * at the bench shape with 16/8 heads on bf16 (the host's default with 8). The same operations
 * in the same order: the same bits */
layout(constant_id = 8) const uint VAR = 0;
const bool QSH = (VAR & 1u) != 0u, VIN = (VAR & 2u) != 0u, PTB = (VAR & 8u) != 0u,
           ILV = (VAR & 16u) != 0u, WO = (VAR & 32u) != 0u;
/* L2 prefetch (LLMEM_VULKAN_DEC_ATTN_PF; 0 off): at step j each subgroup loads one word per PFS
 * bytes of the K and V rows of its step j + PFD into registers pt and folds them into px one
 * step later; px feeds a store that never runs (n_tok == 0 is never dispatched), so the loads
 * stay and change nothing else. They bring the rows into L2 ahead of the 16-byte loads, which
 * then wait for L2 instead of HBM: more bytes in flight at 4 bytes of register per PFS (as
 * matmul_dec.comp's PFD). The slots of step j + PFD are looked up a step before. */
layout(constant_id = 9) const uint PFD = 0;

const uint EV = KV_DT == DT_F32 ? 4u : 8u; /* elements per 16-byte vector */
const uint NV = D / EV;                    /* vectors per row = lanes per group */
const uint M = KPL * R;                    /* partials of a lane a step */
const uint REP = NV / M;                   /* lanes holding each sum */
const uint KH = SGS / NV;                  /* key groups of a subgroup */
const uint KS = KH * KPL;                  /* keys of a subgroup step */
const uint NSG = WG / SGS;                 /* subgroups */
const uint INVALID = 0xffffffffu;
const uint PFS0 = (VAR & 4u) != 0u ? 64u : 32u;
const uint PFS = NV * 16u < PFS0 ? NV * 16u : PFS0; /* bytes a prefetch touch covers */
const uint TPK = 2u * NV * 16u / PFS;          /* touches a key (K, then V) */
const uint NPT = (KS * TPK + SGS - 1u) / SGS;   /* touches a lane a step (<= 8) */
/* literal bounds of the unrolled loops (M <= 32, R EV <= 32, KPL <= 8, NV <= 64) */
#define MMAX 32
#define AMAX 32
#define KMAX 8
#define LOGMAX 6

#define NEG_INF uintBitsToFloat(0xff800000u)

/* One exchange of the reduce-scatter at mask h with hm values kept (up: the lane keeps the
 * upper half): the indices are literals, so pv stays in registers whatever the driver unrolls
 * (an index through a loop variable put the array in local memory: docs/benchmarks.md). */
#define RS1(a, n) { float k_ = up ? pv[a + n] : pv[a]; float s_ = up ? pv[a] : pv[a + n]; \
                    pv[a] = k_ + subgroupShuffleXor(s_, h); }
#define RS_2(n) RS1(0, n) RS1(1, n)
#define RS_4(n) RS_2(n) RS1(2, n) RS1(3, n)
#define RS_8(n) RS_4(n) RS1(4, n) RS1(5, n) RS1(6, n) RS1(7, n)
#define RS_16(n) RS_8(n) RS1(8, n) RS1(9, n) RS1(10, n) RS1(11, n) RS1(12, n) RS1(13, n) \
                 RS1(14, n) RS1(15, n)
/* WO's written-out loops: m applied to the literal indices 0 .. n - 1 after the arguments a_,
 * b_, c_ (one macro per nesting depth, as a macro does not expand inside itself) */
#define W2_2(m, a_) m(a_, 0u) m(a_, 1u)
#define W4_1(m) m(0u) m(1u) m(2u) m(3u)
#define W4_3(m, a_, b_) m(a_, b_, 0u) m(a_, b_, 1u) m(a_, b_, 2u) m(a_, b_, 3u)
#define W4_4(m, a_, b_, c_) m(a_, b_, c_, 0u) m(a_, b_, c_, 1u) m(a_, b_, c_, 2u) m(a_, b_, c_, 3u)
#define W8_1(m) m(0u) m(1u) m(2u) m(3u) m(4u) m(5u) m(6u) m(7u)
#define W8_2(m, a_) m(a_, 0u) m(a_, 1u) m(a_, 2u) m(a_, 3u) m(a_, 4u) m(a_, 5u) m(a_, 6u) m(a_, 7u)
#define W8_3(m, a_, b_) m(a_, b_, 0u) m(a_, b_, 1u) m(a_, b_, 2u) m(a_, b_, 3u) m(a_, b_, 4u) \
                        m(a_, b_, 5u) m(a_, b_, 6u) m(a_, b_, 7u)
#define W32_1(m) W8_2(m, 0u) W8_2(m, 8u) W8_2(m, 16u) W8_2(m, 24u)

#define RS_STAGE(j) { uint h = NV >> (j + 1u), hm = M >> (j + 1u); \
    if (h > 0u) { bool up = (l & h) != 0u; \
        if (hm == 16u) { RS_16(16) } else if (hm == 8u) { RS_8(8) } \
        else if (hm == 4u) { RS_4(4) } else if (hm == 2u) { RS_2(2) } \
        else if (hm == 1u) { RS1(0, 1) } else { pv[0] += subgroupShuffleXor(pv[0], h); } } }

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) readonly buffer Kp { uvec4 kp[]; };
layout(binding = 4) readonly buffer Vp { uvec4 vp[]; };
layout(binding = 5) writeonly buffer Part { float part[]; };
/* Pools larger than one allocation: up to 4 chunks each, vector i of a
 * pool is vector i & (2^CSH - 1) of chunk i >> CSH (attention_decode.comp) */
layout(binding = 6) readonly buffer Kp1 { uvec4 kp1[]; };
layout(binding = 7) readonly buffer Kp2 { uvec4 kp2[]; };
layout(binding = 8) readonly buffer Kp3 { uvec4 kp3[]; };
layout(binding = 9) readonly buffer Vp1 { uvec4 vp1[]; };
layout(binding = 10) readonly buffer Vp2 { uvec4 vp2[]; };
layout(binding = 11) readonly buffer Vp3 { uvec4 vp3[]; };

layout(push_constant) uniform P {
    uint n_tok, n_heads, n_kv, n_rep, n_chunks, max_pages, ps, n_pages, n_streams;
    int window;
    float scale, softcap;
    uint q_off, o_off, pt_off, sl_off, kl_off, ts_off;
    uint n_split, split_keys;
    uint po_off; /* page_off table (word offset in idx), NO_ROWS: rows at s * max_pages */
} p;

const uint NO_ROWS = 0xffffffffu;

/* the subgroups' accumulators [s][r][D], maxima and sums [s][r] */
shared float sm_acc[NSG * R * D];
shared float sm_m[NSG * R];
shared float sm_l[NSG * R];
shared vec4 q_s[QSH ? R * D / 4u : 1u]; /* QSH: the queries [r][D] */

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

/* The first vector of the row of key `key` (< hi) of KV head g in page `page`, or INVALID
 * (at or past hi, or a page outside the pool). */
uint slot_at(int page, int key, int hi, uint g)
{
    if (key >= hi || page < 0 || uint(page) >= p.n_pages)
        return INVALID;
    uint k = uint(key);
    /* pages of 2^k tokens (the usual case, uniform) by shifts */
    uint in_pg = (p.ps & (p.ps - 1u)) == 0u ? k & (p.ps - 1u) : k % p.ps;
    return ((uint(page) * p.ps + in_pg) * p.n_kv + g) * NV;
}

/* The page-table word of key `key` through page-table row pt; at or past hi the row's first
 * word (read, never used: the load needs no branch, so its value is waited for only where
 * slot_at reads it). */
int page_word(int key, int hi, uint pt)
{
    uint k = key < hi ? uint(key) : 0u;
    return idx[pt + ((p.ps & (p.ps - 1u)) == 0u ? k >> findLSB(p.ps) : k / p.ps)];
}

/* The first vector of the row of key `key` of KV head g through page-table row pt, or INVALID
 * (at or past hi, or a page outside the pool). */
uint slot_of(int key, int hi, uint pt, uint g)
{
    return key >= hi ? INVALID : slot_at(page_word(key, hi, pt), key, hi, g);
}

/* WO's bodies (the [[unroll]] loops' bodies below with literal indices) */
/* qv, acc: element a = b_ + k_ */
#define WO_INIT(b_, k_) { const uint a = b_ + k_, r = a / EV, e = a % EV; acc[a] = 0.0; \
    qv[a] = 0.0; \
    if (a < R * EV && r < nr) qv[a] = q[p.q_off + (i * p.n_heads + head0 + r) * D + l * EV + e]; }
/* S: pv[u R + r] += q . k over the lane's slice */
#define WO_S_C(r_, e4_, u_, c_) pv[u_ * R + r_] += qq[c_] * elem(kw[u_], e4_ * 4u + c_);
#define WO_S_U(r_, e4_, u_) if (u_ < KPL) { W4_4(WO_S_C, r_, e4_, u_) }
#define WO_S_E4(r_, e4_) if (e4_ * 4u < EV) { \
    vec4 qq = QSH ? q_s[(r_ * D + l * EV) / 4u + e4_] \
                  : vec4(qv[r_ * EV + e4_ * 4u], qv[r_ * EV + e4_ * 4u + 1u], \
                         qv[r_ * EV + e4_ * 4u + 2u], qv[r_ * EV + e4_ * 4u + 3u]); \
    W8_3(WO_S_U, r_, e4_) }
#define WO_S_R(r_) if (r_ < R) { W2_2(WO_S_E4, r_) }
/* O *= corr of head r */
#define WO_RESC_E(r_, e_) if (e_ < EV) acc[r_ * EV + e_] *= cr;
#define WO_RESC_R(r_) if (r_ < R) { float cr = subgroupShuffle(corr, r_ * REP); W8_2(WO_RESC_E, r_) }
/* O += P V for key u of the step */
#define WO_PV_R(u_, e_, r_) if (r_ < R) acc[r_ * EV + e_] += pu[r_] * y;
#define WO_PV_E(u_, e_) if (e_ < EV) { float y = elem(vw[u_], e_); W4_3(WO_PV_R, u_, e_) }
#define WO_PU(u_, r_) pu[r_] = r_ < R ? subgroupShuffle(pr, hg * NV + (u_ * R + r_) * REP) : 0.0;
#define WO_PV_U(u_) if (u_ < KPL) { float pu[4]; \
    WO_PU(u_, 0u) WO_PU(u_, 1u) WO_PU(u_, 2u) WO_PU(u_, 3u) W8_2(WO_PV_E, u_) }
/* K and V of key u of step j + 1 (kn, vn), V of step j (VIN), the shift of kn, vn */
#define WO_LD_U(u_) if (u_ < KPL) { uint su = subgroupShuffle(s1, u_ * KH + hg); \
    kn[u_] = uvec4(0u); vn[u_] = uvec4(0u); \
    if (su != INVALID) { kn[u_] = kp_at(su + l); if (!VIN) vn[u_] = vp_at(su + l); } \
    if (VIN) { uint sv = subgroupShuffle(s0, u_ * KH + hg); \
               vw[u_] = sv != INVALID ? vp_at(sv + l) : uvec4(0u); } }
#define WO_SH_U(u_) if (u_ < KPL) { kw[u_] = kn[u_]; if (!VIN) vw[u_] = vn[u_]; }
#define WO_PV0(b_, k_) pv[b_ + k_] = 0.0;
/* the first step's K and V loads */
#define WO_LD0_U(u_) { kw[u_] = uvec4(0u); vw[u_] = uvec4(0u); kn[u_] = uvec4(0u); \
    vn[u_] = uvec4(0u); \
    if (u_ < KPL) { uint su = subgroupShuffle(s0, u_ * KH + hg); \
        if (su != INVALID) { kw[u_] = kp_at(su + l); if (!VIN) vw[u_] = vp_at(su + l); } } }
/* the key groups' accumulators added (mask h), stored */
#define WO_RED(b_, k_) if (b_ + k_ < R * EV) acc[b_ + k_] += subgroupShuffleXor(acc[b_ + k_], h);
#define WO_ST(b_, k_) if (b_ + k_ < R * EV) \
    sm_acc[(sg * R + (b_ + k_) / EV) * D + l * EV + (b_ + k_) % EV] = acc[b_ + k_];

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
    uint sg = t / SGS, ln = t % SGS;
    uint hg = ln / NV, l = ln % NV;

    /* the token's key range (every invocation reads the same words) */
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
    int hi = len;
    if (p.n_split > 1u && !ILV) {
        lo += int(split * p.split_keys);
        hi = min(hi, lo + int(p.split_keys));
    }
    uint pt = 0u;
    if (hi > lo)
        pt = p.pt_off +
             (p.po_off != NO_ROWS ? uint(idx[p.po_off + uint(s)]) : uint(s) * p.max_pages);

    float qv[AMAX], acc[AMAX];
    if (WO) {
        W32_1(WO_INIT)
    } else [[unroll]] for (uint a = 0; a < AMAX; a++) {
        uint r = a / EV, e = a % EV;
        acc[a] = 0.0;
        qv[a] = 0.0;
        if (a < R * EV && r < nr)
            qv[a] = q[p.q_off + (i * p.n_heads + head0 + r) * D + l * EV + e];
    }
    if (QSH) {
        for (uint a = t; a < R * D / 4u; a += WG) {
            uint r = a / (D / 4u);
            uint qb = p.q_off + (i * p.n_heads + head0 + r) * D + (a % (D / 4u)) * 4u;
            q_s[a] = r < nr ? vec4(q[qb], q[qb + 1u], q[qb + 2u], q[qb + 3u]) : vec4(0.0);
        }
        barrier();
    }
    float m_run = NEG_INF, l_run = 0.0; /* head (l / REP) % R of this lane */
    uint v_me = l / REP;                /* the value this lane sums: key v_me / R, head v_me % R */

    /* ILV: this split's steps are every n_split-th of the whole range */
    const int stride = int(NSG * KS * (ILV ? p.n_split : 1u));
    int b = lo + int((ILV ? split * NSG + sg : sg) * KS);
    bool lk = ln < KS; /* looks up key ln of a step */
    uint s0 = slot_of(lk ? b + int(ln) : hi, hi, pt, g);
    uint s1 = slot_of(lk ? b + stride + int(ln) : hi, hi, pt, g);
    /* PTB: lane ln holds the page word of key ln % KS of step ln / KS of a block of BS steps:
     * ptc those of steps j0 + 2 .. j0 + BS + 1 (j0 the block's first step), ptn the next
     * block's, loaded when ptc's block starts; jb = j - j0 */
    const uint BS = SGS / KS;
    const int lkb = int((ln / KS) * uint(stride) + ln % KS);
    int ptc = 0, ptn = 0;
    uint jb = 0u;
    if (PTB) {
        ptc = page_word(b + 2 * stride + lkb, hi, pt);
        ptn = page_word(b + int(BS + 2u) * stride + lkb, hi, pt);
    }
    uvec4 kw[KMAX], vw[KMAX], kn[KMAX], vn[KMAX];
    if (WO) {
        W8_1(WO_LD0_U)
    } else [[unroll]] for (uint u = 0; u < KMAX; u++) {
        kw[u] = uvec4(0u);
        vw[u] = uvec4(0u);
        kn[u] = uvec4(0u);
        vn[u] = uvec4(0u);
        if (u < KPL) {
            uint su = subgroupShuffle(s0, u * KH + hg);
            if (su != INVALID) {
                kw[u] = kp_at(su + l);
                if (!VIN)
                    vw[u] = vp_at(su + l);
            }
        }
    }
    uint sp = PFD > 0u ? slot_of(lk ? b + int(PFD) * stride + int(ln) : hi, hi, pt, g) : INVALID;
    uint px = 0u, pw[8];
    [[unroll]] for (uint j = 0; j < 8u; j++)
        pw[j] = 0u;
    for (; b < hi; b += stride) {
        uint s2 = PTB ? 0u : slot_of(lk ? b + 2 * stride + int(ln) : hi, hi, pt, g);
        if (PFD > 0u) {
            [[unroll]] for (uint j = 0; j < 8u; j++)
                px ^= pw[j];
            uint sp_next = slot_of(lk ? b + int(PFD + 1u) * stride + int(ln) : hi, hi, pt, g);
            [[unroll]] for (uint j = 0; j < 8u; j++)
                if (j < NPT) {
                    uint e = ln + SGS * j, kk = min(e / TPK, KS - 1u), w = e % TPK;
                    uint ss = subgroupShuffle(sp, kk);
                    uint off = (w % (TPK / 2u)) * (PFS / 16u);
                    if (e < KS * TPK && ss != INVALID)
                        pw[j] = w >= TPK / 2u ? vp_at(ss + off).x : kp_at(ss + off).x;
                }
            sp = sp_next;
        }
        if (WO) {
            W8_1(WO_LD_U)
        } else [[unroll]] for (uint u = 0; u < KMAX; u++)
            if (u < KPL) {
                uint su = subgroupShuffle(s1, u * KH + hg);
                kn[u] = uvec4(0u);
                vn[u] = uvec4(0u);
                if (su != INVALID) {
                    kn[u] = kp_at(su + l);
                    if (!VIN)
                        vn[u] = vp_at(su + l);
                }
                if (VIN) {
                    uint sv = subgroupShuffle(s0, u * KH + hg);
                    vw[u] = sv != INVALID ? vp_at(sv + l) : uvec4(0u);
                }
            }
        /* S = Q K^T for the lane's slices: pv[u R + r] */
        float pv[MMAX];
        if (WO) {
            W32_1(WO_PV0)
        } else [[unroll]] for (uint a = 0; a < MMAX; a++)
            pv[a] = 0.0;
        if (WO) {
            W4_1(WO_S_R)
        } else [[unroll]] for (uint r = 0; r < 4u; r++)
            if (r < R)
                [[unroll]] for (uint e4 = 0; e4 < 2u; e4++)
                    if (e4 * 4u < EV) {
                        vec4 qq = QSH ? q_s[(r * D + l * EV) / 4u + e4]
                                      : vec4(qv[r * EV + e4 * 4u], qv[r * EV + e4 * 4u + 1u],
                                             qv[r * EV + e4 * 4u + 2u], qv[r * EV + e4 * 4u + 3u]);
                        [[unroll]] for (uint u = 0; u < KMAX; u++)
                            if (u < KPL)
                                [[unroll]] for (uint c = 0; c < 4u; c++)
                                    pv[u * R + r] += qq[c] * elem(kw[u], e4 * 4u + c);
                    }
        /* the reduce-scatter over the group's lanes (see the header) */
        RS_STAGE(0u) RS_STAGE(1u) RS_STAGE(2u) RS_STAGE(3u) RS_STAGE(4u) RS_STAGE(5u)
        float x = pv[0] * p.scale;
        if (p.softcap > 0.0)
            x = p.softcap * tanh(x / p.softcap);
        if (subgroupShuffle(s0, (v_me / R) * KH + hg) == INVALID)
            x = NEG_INF;
        /* the step's maximum of this lane's head: the lanes of other keys and groups */
        float mx = x;
        [[unroll]] for (uint j = 0; j < LOGMAX; j++) {
            uint h = (REP * R) << j;
            if (h < SGS)
                mx = max(mx, subgroupShuffleXor(mx, h));
        }
        float m_new = max(m_run, mx);
        float corr = isinf(m_new) ? 1.0 : isinf(m_run) ? 0.0 : exp(m_run - m_new);
        float pr = isinf(x) ? 0.0 : exp(x - m_new);
        m_run = m_new;
        l_run = l_run * corr + (l % REP == 0u ? pr : 0.0);
        /* O = O corr + P V (every step: skipping the rescale where no maximum grew, a uniform
         * branch on a shuffled flag, ran 2.5x slower on the H200, docs/benchmarks.md) */
        if (WO) {
            W4_1(WO_RESC_R)
            W8_1(WO_PV_U)
            W8_1(WO_SH_U)
        } else {
        [[unroll]] for (uint r = 0; r < 4u; r++)
            if (r < R) {
                float c = subgroupShuffle(corr, r * REP);
                [[unroll]] for (uint e = 0; e < 8u; e++)
                    if (e < EV)
                        acc[r * EV + e] *= c;
            }
        [[unroll]] for (uint u = 0; u < KMAX; u++)
            if (u < KPL) {
                float pu[4];
                [[unroll]] for (uint r = 0; r < 4u; r++)
                    pu[r] = r < R ? subgroupShuffle(pr, hg * NV + (u * R + r) * REP) : 0.0;
                [[unroll]] for (uint e = 0; e < 8u; e++)
                    if (e < EV) {
                        float y = elem(vw[u], e);
                        [[unroll]] for (uint r = 0; r < 4u; r++)
                            if (r < R)
                                acc[r * EV + e] += pu[r] * y;
                    }
            }
        [[unroll]] for (uint u = 0; u < KMAX; u++)
            if (u < KPL) {
                kw[u] = kn[u];
                if (!VIN)
                    vw[u] = vn[u];
            }
        }
        if (PTB) {
            /* step j + 2's slots from the block's words. Lanes ln >= KS (their key is hi, so
             * INVALID whatever the word) may ask for a lane past the subgroup, an undefined
             * value (not undefined behaviour); the in-range index jb KS + ln % KS, the same
             * slots, ran the bench shape 20% slower on the H200 (driver 580's code for it;
             * docs/benchmarks.md), so the index stays as it is */
            s2 = slot_at(subgroupShuffle(ptc, jb * KS + ln), lk ? b + 2 * stride + int(ln) : hi,
                         hi, g);
            if (++jb == BS) {
                jb = 0u;
                ptc = ptn;
                ptn = page_word(b + int(BS + 3u) * stride + lkb, hi, pt);
            }
        }
        s0 = s1;
        s1 = s2;
    }

    if (PFD > 0u) {
        [[unroll]] for (uint j = 0; j < 8u; j++)
            px ^= pw[j];
        if (px == 0x9e3779b9u && p.n_tok == 0u)
            o[p.o_off] = 0.0;
    }
    /* the subgroup's sum per head (lanes of other keys and groups; replicas hold zeros) and
     * its key groups' accumulators (the same maximum per head in every lane) */
    [[unroll]] for (uint j = 0; j < LOGMAX; j++) {
        uint h = 1u << j;
        if (h < SGS && (h < REP || h >= REP * R))
            l_run += subgroupShuffleXor(l_run, h);
    }
    [[unroll]] for (uint j = 0; j < LOGMAX; j++) {
        uint h = NV << j;
        if (h < SGS && WO) {
            W32_1(WO_RED)
        } else if (h < SGS)
            [[unroll]] for (uint a = 0; a < AMAX; a++)
                if (a < R * EV)
                    acc[a] += subgroupShuffleXor(acc[a], h);
    }
    if (hg == 0u) {
        if (WO) {
            W32_1(WO_ST)
        } else [[unroll]] for (uint a = 0; a < AMAX; a++)
            if (a < R * EV)
                sm_acc[(sg * R + a / EV) * D + l * EV + a % EV] = acc[a];
        if (l % REP == 0u && v_me < R) {
            sm_m[sg * R + v_me] = m_run;
            sm_l[sg * R + v_me] = l_run;
        }
    }
    barrier();
    /* the subgroups merged: output (r, d) by invocation t, t + WG, .. */
    for (uint od = t; od < R * D; od += WG) {
        uint r = od / D, d = od % D;
        if (r >= nr)
            continue;
        float mm = NEG_INF;
        for (uint j = 0; j < NSG; j++)
            mm = max(mm, sm_m[j * R + r]);
        float ls = 0.0, a = 0.0;
        for (uint j = 0; j < NSG; j++) {
            float mj = sm_m[j * R + r];
            float f = isinf(mj) ? 0.0 : exp(mj - mm);
            ls += f * sm_l[j * R + r];
            a += f * sm_acc[(j * R + r) * D + d];
        }
        if (p.n_split > 1u) {
            /* partial results of this split, merged by attn_combine.comp */
            uint pb = ((i * p.n_heads + head0 + r) * p.n_split + split) * (D + 2u);
            part[pb + d] = a;
            if (d == 0u) {
                part[pb + D] = mm;
                part[pb + D + 1u] = ls;
            }
        } else {
            o[p.o_off + (i * p.n_heads + head0 + r) * D + d] = ls > 0.0 ? a / ls : 0.0;
        }
    }
}

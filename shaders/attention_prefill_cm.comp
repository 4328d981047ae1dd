#version 450
#extension GL_EXT_control_flow_attributes : require
/* Prefill attention on cooperative matrices: FlashAttention-2's forward pass (Dao 2023,
 * "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", Alg. 1)
 * over the paged KV cache (PagedAttention, Kwon et al. SOSP 2023), S = Q K^T and O += P V as
 * 16 x 16 x 16 GL_KHR_cooperative_matrix multiply-adds (f16 A and B, f32 accumulators). Fast
 * mode: q * scale and the probabilities rounded once to f16 (FlashAttention-2's arithmetic and
 * the CUDA fast kernel's, kernels/attention_prefill_tc.cuh, whose tiling this follows); running
 * max and sum in f32. bf16 pools are converted to f16 on their way into shared memory (exact
 * for magnitudes in [2^-14, 65504], as matmul_cm.comp does with bf16 weights).
 *
 * A workgroup of NW = WG / 32 subgroups takes BM = 16 NW rows of (query token, query head)
 * pairs: hh heads of one GQA group times tt = BM / hh consecutive tokens (row r: token t0 + r /
 * hh, head g n_rep + hc0 + r % hh), so every K/V block in shared memory serves all the heads
 * that share it. Subgroup w owns rows [16 w, 16 w + 16), holding their scaled queries as D / 16
 * A matrices and their output as D / 16 accumulators. Per block of BN = 32 keys:
 *  (a) the next block's K and V rows (16-byte loads through the page table, zeros outside the
 *      pass's key range and for page ids outside the pool) go into registers before this
 *      block's work and into shared memory after it (two workgroup barriers a block);
 *  (b) S = Q K^T goes to the subgroup's part of shared memory (KHR does not say which
 *      invocation holds which element), where two invocations a row take its maximum;
 *  (c) the online softmax (soft-cap, masks, running max, sum) in f32; each invocation writes
 *      its 16 probabilities as f16 in place of its scores (P's row 32 bytes into S's, so the
 *      two invocations of a row never write what the other still reads), corr to corr_s;
 *  (d) O *= corr (each element's row from rowm, a matrix of row indices loaded once), then
 *      O += P V.
 * Causal and window masks come from tok_kv_len and the window (as attention_decode.comp); a
 * pass visits only the blocks between its rows' lowest first and highest last key (blocks
 * wholly above the diagonal are never loaded), masking only blocks that cross a row's range
 * or hold a bad page id. A tile of several streams (a SIMPLE ubatch) runs one pass a stream.
 * A query failing the device-side check of its stream or length sees no key: zeros.
 *
 * EMU (-DEMU=1, attention_prefill_emu, by glslangValidator): the same tiling, layout, masks and
 * softmax with scalar loops for the matrix operations (an accumulator: 8 elements an invocation,
 * row lane / 2, columns 8 (lane % 2) + i; an A matrix: its row of 16 halves; a B matrix read
 * where it lies), so that lavapipe checks the indexing against float64
 * (tests/test_vulkan_attn_pf.c). Shared memory (D = 128): K and V tiles 2 x 32 x 17 uvec4 (rows
 * padded by 16 bytes against bank conflicts), S/P 8 x 16 x 9 uvec4: 35 KiB of NVIDIA's 48.
 *
 * CM2 (-DCM2=1: shaders/khr/attention_prefill_cm2.spv, where the device has
 * VK_NV_cooperative_matrix2's reductions and conversions; -DEMU=2 emulates it): no S / P
 * region. S stays in s0 / s1; masks and soft-cap element by element (row and column from rcm,
 * a matrix of indices loaded once); the row maxima are one coopMatReduceNV; m_acc (each row's
 * running max) and l_acc (each element's share of its row's sum, added up at the end) are
 * accumulators of the same type, so O is rescaled element by element; P reaches P V as an A
 * matrix converted from the accumulator. The K / V tiles fit STAGES = 2 stages (one barrier a
 * block). SPLIT 2 (precise calls, f16 pools): q * scale * QSC and P * PSC as hi (cut11) + lo f16
 * terms, two multiply-adds each. VAR: variant bits (below). H200, 8 x 2048 causal, 32/8 heads,
 * hd 128, precise: VAR 3 4.37 ms (O in local memory), 259 3.02 (CUDA 2.28; docs/benchmarks.md,
 * "Vulkan prefill attention in precise mode: the CM2 module's O out of local memory").
 *
 * Self-contained (no common.glsl): the .spv of shaders/khr/ are embedded while their recorded
 * SHA-256 matches this file (shaders/shaders.cmake). */
// llmem-shader: attention_prefill_emu:EMU=1
// llmem-shader: attention_prefill_emu2:EMU=2
#ifndef EMU
#define EMU 0
#endif
#ifndef CM2
#if EMU == 2
#define CM2 1
#else
#define CM2 0
#endif
#endif
#if !EMU
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#if CM2
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_shader_subgroup_vote : require
#endif
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256; /* 32 NW */
layout(constant_id = 1) const uint D = 128;  /* head dim: a multiple of 16 */
layout(constant_id = 2) const uint KV_DT = 1; /* 1 f16, 2 bf16 */
/* CM2 only: 2 (precise) q * scale and P as hi + lo f16 terms, two multiply-adds each;
 * 1 (fast) one rounding. STAGES: K / V tiles in shared memory (2: a ring, one barrier a
 * block; 1: two barriers a block, as the KHR module). */
layout(constant_id = 3) const uint SPLIT = 1;
layout(constant_id = 4) const uint STAGES = 2;
/* VAR (LLMEM_VULKAN_ATTN_PF_VAR): 1 page ids by shift and mask (PSL < 32: log2 of a
 * power-of-two page size); 2 (CM2) O's rescale skipped where every factor of the subgroup is 1;
 * 256 (CM2) every loop over qf, ql and o written out (OUNR). Measuring only, wrong results: 16 no
 * K / V loads from the pool, 32 / 64 (CM2) K / V fragments read once a block, 128 (CM2) no row
 * maxima or exponentials. */
layout(constant_id = 5) const uint VAR = 0;
layout(constant_id = 6) const uint PSL = 32;
/* the Q tile's, S's, O's rescale, P V's, the normalization's and the store's loops over the
 * DT <= 8 matrices as steps with literal indices (DT_LOOP): a loop the driver keeps rolled
 * indexes qf / ql / o with a value it does not know, and the array then lives in local memory */
const uint OUNR = (VAR >> 8u) & 1u;
#define DT_BF16 2u

const uint BN = 32u;           /* keys a block */
const uint NW = WG / 32u;      /* subgroups */
const uint BM = 16u * NW;      /* rows a tile */
const uint DV = D / 8u;        /* uvec4s of a K / V / Q row */
const uint LDK = DV + 1u;      /* padded row of the K, V and Q tiles (uvec4s) */
const uint KVT = BN * LDK;     /* uvec4s of a K or V tile */
const uint SLD = BN / 4u + 1u; /* padded S row (uvec4s of 4 floats) */
const uint SPW = 16u * SLD;    /* uvec4s of a subgroup's S / P */
const uint SB = 2u * KVT;      /* where the subgroups' S / P start */
const uint POFF = 2u;          /* P's row starts 2 uvec4s (32 bytes) into S's */
const uint NL2 = BN * DV / WG; /* K (and V) uvec4 loads an invocation a block */
#if !CM2
const uint NSH0 = SB + NW * SPW, NSH1 = BM * LDK;
#else
/* the K / V stages, the Q tile once, the output through 16 x 5 uvec4s a subgroup at the end */
const uint NSH0 = STAGES * 2u * KVT > NW * 80u ? STAGES * 2u * KVT : NW * 80u, NSH1 = BM * LDK;
#endif
const uint NSH = NSH0 > NSH1 ? NSH0 : NSH1; /* the Q tile is staged over all of it once */
const uint DT = D / 16u;       /* output matrices a subgroup */
const uint DTL = 8u;           /* qf, ql, o's size: DT at most, a literal (DT_STEPS) */
const uint NQ = (BM * DV + WG - 1u) / WG; /* Q tile uvec4s an invocation */
const uint NO_ROWS = 0xffffffffu;
/* m_(j) for j < DT (D 64 or 128: vk_ops_attn_pf.c), written out; DT_LOOP: so where OUNR */
#define DT_STEPS(m_)                                                                               \
    m_(0u) m_(1u) m_(2u) m_(3u) if (DT > 4u) { m_(4u) m_(5u) m_(6u) m_(7u) }
#define DT_LOOP(m_)                                                                                \
    if (OUNR != 0u) {                                                                              \
        DT_STEPS(m_)                                                                               \
    } else                                                                                         \
        UNROLL for (uint j_ = 0u; j_ < DT; j_++)                                                   \
            m_(j_)
#if EMU
/* the steps of the scalar MMAs stay a loop: written out, a driver's compile takes minutes */
#define DT_LOOP_MMA(m_) UNROLL for (uint j_ = 0u; j_ < DT; j_++) m_(j_)
#else
#define DT_LOOP_MMA(m_) DT_LOOP(m_)
#endif
/* SPLIT 2: q * scale enters the hi + lo split times QSC (so that lo stays clear of f16's
 * subnormals, which a driver may flush), S is divided by it again */
const float QSC = 64.0, QINV = SPLIT == 2u ? 1.0 / QSC : 1.0;

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) writeonly buffer O { float res[]; };
layout(binding = 2) readonly buffer Idx { int idx[]; };
layout(binding = 3) readonly buffer Kp { uvec4 kp[]; };
layout(binding = 4) readonly buffer Vp { uvec4 vp[]; };

layout(push_constant) uniform P {
    uint n_tok, n_heads, n_kv, n_rep;
    uint hh, tt, n_hc, n_tiles; /* heads and tokens a tile, head chunks, token tiles */
    uint max_pages, ps, n_pages, n_streams;
    int window;
    float scale, softcap;
    uint q_off, o_off; /* floats */
    uint pt_off, sl_off, kl_off, ts_off, po_off; /* words of idx; po_off NO_ROWS: rows at s max_pages */
} p;

shared uvec4 sh[NSH];
shared int row_seq[BM], row_lo[BM], row_hi[BM];
shared float corr_s[BM];
shared int pass_s[6];   /* cur, jlo, jhi, hmin, lmax, mixed */
shared uint kbad_s[3];  /* bit k: key k of the block has a bad page id (block i at i % 3) */
#if EMU
shared float xch_s[WG]; /* the pair exchange of EMU */
#endif
#if EMU && CM2
shared float xch8_s[8u * WG]; /* EMU's accumulator -> A conversion */
#endif

#define NEG_INF uintBitsToFloat(0xff800000u)

/* ---- matrix operations: KHR, or their scalar emulation ------------------------------------ */
#if !EMU
#define UNROLL [[unroll]]
#define FA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ACC_ZERO ACC(0.0)
#define ACC_FILL(x_) ACC(x_)
#define LOAD_A(m_, o_, s_) coopMatLoad(m_, sh, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_BT(m_, o_, s_) coopMatLoad(m_, sh, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#define LOAD_B(m_, o_, s_) coopMatLoad(m_, sh, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define STORE_C(m_, o_, s_) coopMatStore(m_, sh, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define MMA(c_, a_, b_) c_ = coopMatMulAdd(a_, b_, c_)
#define ACC_MUL(a_, b_) ((a_) * (b_)) /* element by element */
#define EL(m_, i_) m_[i_]
#define NEL(m_) uint(m_.length())
#define SG_ALL(x_) subgroupAll(x_)
/* the subgroup's shared-memory writes visible to its other invocations */
#define SG_SYNC()                                                                                  \
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,                  \
                   gl_SemanticsAcquireRelease)
#else
/* loops kept rolled: unrolled, llvmpipe's compile of the scalar MMAs takes minutes */
#define UNROLL [[dont_unroll]]
struct FA { uvec4 a0, a1; };            /* this invocation's row (lane / 2) of 16 halves */
struct FB { uint off, ld, tr; };        /* where the matrix lies in sh; tr: column-major */
struct ACC { float e[8]; };             /* row lane / 2, columns 8 (lane % 2) + i */
ACC acc_fill(float x)
{
    ACC c;
    for (uint i = 0u; i < 8u; i++)
        c.e[i] = x;
    return c;
}
#define ACC_FILL(x_) acc_fill(x_)
#define ACC_ZERO acc_fill(0.0)
#define LOAD_A(m_, o_, s_) m_ = FA(sh[(o_) + (lane / 2u) * (s_)], sh[(o_) + (lane / 2u) * (s_) + 1u])
#define LOAD_BT(m_, o_, s_) m_ = FB(o_, s_, 1u)
#define LOAD_B(m_, o_, s_) m_ = FB(o_, s_, 0u)
#define STORE_C(m_, o_, s_) emu_store(m_, o_, s_, lane)
#define MMA(c_, a_, b_) c_ = emu_mma(a_, b_, c_, lane)
#define ACC_MUL(a_, b_) emu_mul(a_, b_)
#define EL(m_, i_) m_.e[i_]
#define NEL(m_) 8u
#define SG_ALL(x_) false
#define SG_SYNC() barrier()

/* half k of 16-byte word w */
float half_of(uvec4 w, uint k)
{
    return unpackHalf2x16(w[k / 2u])[k % 2u];
}

ACC emu_mma(FA a, FB b, ACC c, uint lane)
{
    UNROLL for (uint i = 0u; i < 8u; i++) {
        uint n = 8u * (lane % 2u) + i;
        float s = c.e[i];
        /* unrolled: llvmpipe stops an invocation's loops after 65535 iterations in all,
         * which EMU=2's precise calls reached at 8 blocks of keys with this loop rolled */
        for (uint k = 0u; k < 16u; k++) {
            float x = half_of(k < 8u ? a.a0 : a.a1, k % 8u);
            float y = b.tr != 0u ? half_of(sh[b.off + n * b.ld + k / 8u], k % 8u)
                                 : half_of(sh[b.off + k * b.ld + n / 8u], n % 8u);
            s += x * y;
        }
        c.e[i] = s;
    }
    return c;
}

ACC emu_mul(ACC a, ACC b)
{
    for (uint i = 0u; i < 8u; i++)
        a.e[i] *= b.e[i];
    return a;
}

void emu_store(ACC c, uint off, uint ld, uint lane)
{
    uint o = off + (lane / 2u) * ld + 2u * (lane % 2u);
    sh[o] = floatBitsToUint(vec4(c.e[0], c.e[1], c.e[2], c.e[3]));
    sh[o + 1u] = floatBitsToUint(vec4(c.e[4], c.e[5], c.e[6], c.e[7]));
}
#endif

/* x of the partner invocation (lane ^ 1) */
float partner(float x, uint t)
{
#if !EMU
    return subgroupShuffleXor(x, 1u);
#else
    xch_s[t] = x;
    barrier();
    float y = xch_s[t ^ 1u];
    barrier();
    return y;
#endif
}
#define pair_max(x_, t_) max(x_, partner(x_, t_))
#define pair_sum(x_, t_) ((x_) + partner(x_, t_))

#if CM2
/* ---- CM2: row reductions and the accumulator -> A conversion ---------------------------- */
#if !EMU
#define ACC16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
float red_max(const in float a, const in float b)
{
    return max(a, b);
}
float red_sum(const in float a, const in float b)
{
    return a + b;
}
/* m_ = every element the maximum (sum) of its row */
#define ROW_MAX(m_) coopMatReduceNV(m_, m_, gl_CooperativeMatrixReduceRowNV, red_max)
#define ROW_SUM(m_) coopMatReduceNV(m_, m_, gl_CooperativeMatrixReduceRowNV, red_sum)
/* x_ rounded to f16 as an A matrix */
#define TO_A(a_, x_) a_ = FA(ACC16(x_))
/* the row and column of element i_ of an accumulator: from rcm, a matrix of 16 row + column
 * loaded once (the same type, so the same element order) */
#define ROW_E(i_) (uint(rcm[i_]) / 16u)
#define COL_E(i_) (uint(rcm[i_]) % 16u)
#else
void emu_row(inout ACC m, uint t, bool is_max)
{
    float x = m.e[0];
    for (uint i = 1u; i < 8u; i++)
        x = is_max ? max(x, m.e[i]) : x + m.e[i];
    float y = partner(x, t);
    x = is_max ? max(x, y) : x + y;
    for (uint i = 0u; i < 8u; i++)
        m.e[i] = x;
}
#define ROW_MAX(m_) emu_row(m_, t, true)
#define ROW_SUM(m_) emu_row(m_, t, false)
/* the row lane / 2 of 16 halves from this invocation's 8 columns and its partner's */
FA emu_to_a(ACC x, uint t, uint lane)
{
    for (uint i = 0u; i < 8u; i++)
        xch8_s[8u * t + i] = x.e[i];
    barrier();
    float y[16];
    for (uint i = 0u; i < 8u; i++) {
        y[8u * (lane % 2u) + i] = x.e[i];
        y[8u * (1u - lane % 2u) + i] = xch8_s[8u * (t ^ 1u) + i];
    }
    barrier();
    FA a;
    for (uint k = 0u; k < 4u; k++) {
        a.a0[k] = packHalf2x16(vec2(y[2u * k], y[2u * k + 1u]));
        a.a1[k] = packHalf2x16(vec2(y[8u + 2u * k], y[8u + 2u * k + 1u]));
    }
    return a;
}
#define TO_A(a_, x_) a_ = emu_to_a(x_, t, lane)
#define ROW_E(i_) (lane / 2u)
#define COL_E(i_) (8u * (lane % 2u) + (i_))
#endif
#endif

/* x cut to 11 significant bits (f16's): exact in f16 within its normal range. The hi + lo
 * splits use it rather than an f16 round trip, which NVIDIA's compiler (driver 580) folds
 * away (lo = x - f16(x) came out 0: the precise modules gave the fast arithmetic's error). */
float cut11(float x)
{
    return uintBitsToFloat(floatBitsToUint(x) & 0xffffe000u);
}
vec2 cut11(vec2 x)
{
    return uintBitsToFloat(floatBitsToUint(x) & 0xffffe000u);
}

uint bf16x2_to_f16x2(uint x)
{
    return packHalf2x16(vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u)));
}

/* Two of the Q tile's halves from x = q * scale: rounded once, or (SPLIT 2) x * QSC as hi
 * (part 0: cut11, exact in f16) or the rest x - hi (part 1, exact in f32) rounded to f16. */
uint q_pack(vec2 x, uint part)
{
    if (SPLIT == 2u) {
        x *= QSC;
        vec2 hi = cut11(x);
        x = part == 0u ? hi : x - hi;
    }
    return packHalf2x16(x);
}

/* the page of key k_ and its slot there: a shift and a mask for pages of 2^PSL keys */
#define PG_OF(k_) (PSL < 32u ? (k_) >> (PSL & 31u) : (k_) / p.ps)
#define PG_IN(k_) (PSL < 32u ? (k_) & ((1u << (PSL & 31u)) - 1u) : (k_) % p.ps)

void main()
{
    const uint t = gl_LocalInvocationID.x, lane = t % 32u, warp = t / 32u;
    uint gid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (gid >= p.n_tiles * p.n_hc * p.n_kv)
        return;
    const uint g = gid % p.n_kv;
    const uint hc0 = (gid / p.n_kv) % p.n_hc * p.hh;
    const uint t0 = (p.n_tiles - 1u - gid / (p.n_kv * p.n_hc)) * p.tt; /* long tiles first */
    const uint rows = p.hh * p.tt;

    /* the rows' streams and key ranges (attention_decode.comp's checks);
     * row_seq -1: a query that sees no key, -2: padding */
    for (uint r = t; r < BM; r += WG) {
        uint tok = t0 + r / p.hh, hr = hc0 + r % p.hh;
        int s = -2, lo = 0, hi = 0;
        if (r < rows && tok < p.n_tok && hr < p.n_rep) {
            s = idx[p.ts_off + tok];
            int len = idx[p.kl_off + tok];
            bool ok = s >= 0 && uint(s) < p.n_streams && len >= 0;
            if (ok) {
                int sl = idx[p.sl_off + uint(s)];
                ok = len <= sl && (uint(sl) + p.ps - 1u) / p.ps <= p.max_pages;
            }
            if (ok) {
                hi = len;
                lo = p.window > 0 && len > p.window ? len - p.window : 0;
            } else {
                s = -1;
            }
        }
        row_seq[r] = s;
        row_lo[r] = lo;
        row_hi[r] = hi;
    }
    /* the Q tile (q_pack) staged over all of sh into qf, SPLIT 2's lo terms into ql */
    FA qf[DTL];
#if CM2
    FA ql[DTL];
#endif
    /* this invocation's NQ uvec4s of the tile as q * scale, all loads at once */
    vec4 qx[2u * NQ];
    UNROLL for (uint n = 0u; n < NQ; n++) {
        uint e = t + n * WG, r = e / DV, c = e % DV;
        uint tok = t0 + r / p.hh, hr = hc0 + r % p.hh;
        vec4 xa = vec4(0.0), xb = vec4(0.0);
        if (e < BM * DV && r < rows && tok < p.n_tok && hr < p.n_rep) {
            uint b = p.q_off + (tok * p.n_heads + g * p.n_rep + hr) * D + 8u * c;
            xa = vec4(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale;
            xb = vec4(q[b + 4u], q[b + 5u], q[b + 6u], q[b + 7u]) * p.scale;
        }
        qx[2u * n] = xa;
        qx[2u * n + 1u] = xb;
    }
    for (uint part = 0u; part < (CM2 != 0 ? SPLIT : 1u); part++) {
        UNROLL for (uint n = 0u; n < NQ; n++) {
            uint e = t + n * WG;
            if (e < BM * DV)
                sh[(e / DV) * LDK + e % DV] =
                    uvec4(q_pack(qx[2u * n].xy, part), q_pack(qx[2u * n].zw, part),
                          q_pack(qx[2u * n + 1u].xy, part), q_pack(qx[2u * n + 1u].zw, part));
        }
        barrier();
#if CM2
#define Q_LDA(k_)                                                                                  \
    if (part == 1u)                                                                                \
        LOAD_A(ql[k_], warp * 16u * LDK + 2u * (k_), LDK);                                         \
    else                                                                                           \
        LOAD_A(qf[k_], warp * 16u * LDK + 2u * (k_), LDK);
#else
#define Q_LDA(k_) LOAD_A(qf[k_], warp * 16u * LDK + 2u * (k_), LDK);
#endif
        DT_LOOP(Q_LDA)
        barrier();
    }
    /* rowm: element i of an accumulator lies in row EL(rowm, i) of its matrix */
    const uint sw = SB + warp * SPW; /* this subgroup's S / P */
#if CM2 && !EMU
    /* rcm: element i of an accumulator lies in row rcm[i] / 16, column rcm[i] % 16 */
    for (uint e = lane; e < 64u; e += 32u)
        sh[warp * 80u + (e / 4u) * 5u + e % 4u] =
            floatBitsToUint(vec4(float(e * 4u)) + vec4(0.0, 1.0, 2.0, 3.0));
    SG_SYNC();
    ACC rcm;
    coopMatLoad(rcm, sh, warp * 80u, 5u, gl_CooperativeMatrixLayoutRowMajor);
    barrier(); /* every subgroup's rcm read before the K / V tiles come */
#elif !EMU
    for (uint e = lane; e < 64u; e += 32u)
        sh[sw + (e / 4u) * SLD + e % 4u] = floatBitsToUint(vec4(float(e / 4u)));
    SG_SYNC();
    ACC rowm;
    coopMatLoad(rowm, sh, sw, SLD, gl_CooperativeMatrixLayoutRowMajor);
    SG_SYNC();
#define ROW_OF(i_) uint(rowm[i_])
#else
#define ROW_OF(i_) (lane / 2u)
#endif

    ACC o[DTL];
#define O_ZERO(j_) o[j_] = ACC_ZERO;
    DT_LOOP(O_ZERO)
    const uint rr = warp * 16u + lane / 2u; /* the row this invocation's softmax serves */
    const uint half_ = lane % 2u;           /* its 16 keys of a block */
#if !CM2
    float m_run = NEG_INF, l_run = 0.0;     /* the row's running max; this half's sum */
#else
    /* P is scaled by PSC = 2^15 before its split (SPLIT 2), so that its lo term stays clear of
     * f16's subnormals; the output is divided by it at the end */
    const float PSC = SPLIT == 2u ? 32768.0 : 1.0;
    ACC m_acc = ACC_FILL(NEG_INF), l_acc = ACC_ZERO;
#endif

    uvec4 ld[2u * NL2];
    uint kbm = 0u; /* bit u: slot u of the fetched block has a bad page id */
    int prev = -1;
    for (;;) {
        /* the next pass: the smallest stream above prev among the rows */
        barrier();
        if (t == 0u) {
            pass_s[0] = 0x7fffffff;
            pass_s[1] = 0x7fffffff;
            pass_s[2] = 0;
            pass_s[3] = 0x7fffffff;
            pass_s[4] = 0;
            pass_s[5] = 0;
        }
        barrier();
        for (uint r = t; r < BM; r += WG)
            if (row_seq[r] > prev)
                atomicMin(pass_s[0], row_seq[r]);
        barrier();
        const int cur = pass_s[0];
        if (cur == 0x7fffffff)
            break;
        for (uint r = t; r < BM; r += WG) {
            int sr = row_seq[r];
            if (sr != -2 && sr != cur)
                atomicOr(pass_s[5], 1);
            if (sr == cur) {
                int lo = row_lo[r], hi = row_hi[r];
                atomicMin(pass_s[3], hi);
                atomicMax(pass_s[4], lo);
                if (hi > lo) {
                    atomicMin(pass_s[1], lo);
                    atomicMax(pass_s[2], hi);
                }
            }
        }
        barrier();
        prev = cur;
        const int jlo = pass_s[1], jhi = pass_s[2], hmin = pass_s[3], lmax = pass_s[4];
        const bool mixed = pass_s[5] != 0;
        if (jlo >= jhi)
            continue;
        const uint pt =
            p.pt_off + (p.po_off != NO_ROWS ? uint(idx[p.po_off + uint(cur)]) : uint(cur) * p.max_pages);
        const int kb0 = jlo / int(BN) * int(BN);
        const int nblk = (jhi - kb0 + int(BN) - 1) / int(BN);
        /* this invocation's row bounds in the pass (masked blocks only) */
        const int rlo = row_lo[rr], rhi = row_seq[rr] == cur ? row_hi[rr] : 0;

        /* block i's K and V rows into ld (K in ld[u], V in ld[NL2 + u]; zeros outside
         * [jlo, jhi) and for bad page ids, whose slots u are kbm's bits) */
#define FETCH(i_)                                                                                  \
    UNROLL for (uint u = 0u; u < NL2; u++) {                                                   \
        uint f_ = t + u * WG;                                                                      \
        kbm = u == 0u ? 0u : kbm;                                                                  \
        int key_ = kb0 + (i_) * int(BN) + int(f_ / DV);                                            \
        uvec4 xk_ = uvec4(0u), xv_ = uvec4(0u);                                                    \
        if ((VAR & 16u) == 0u && key_ >= jlo && key_ < jhi) {                                      \
            int pg_ = idx[pt + PG_OF(uint(key_))];                                                 \
            if (pg_ >= 0 && uint(pg_) < p.n_pages) {                                               \
                uint a_ = ((uint(pg_) * p.ps + PG_IN(uint(key_))) * p.n_kv + g) * DV + f_ % DV;    \
                xk_ = kp[a_];                                                                      \
                xv_ = vp[a_];                                                                      \
            } else {                                                                               \
                kbm |= 1u << u;                                                                    \
            }                                                                                      \
        }                                                                                          \
        ld[u] = xk_;                                                                               \
        ld[NL2 + u] = xv_;                                                                         \
    }
        /* ld into the K / V tiles at base_ (bf16 converted); the block's keys with a bad page
         * id (kbm) into kbad_s[kbi_] */
#define STORE(i_, base_, kbi_)                                                                     \
    UNROLL for (uint u = 0u; u < NL2; u++) {                                                   \
        uint f_ = t + u * WG;                                                                      \
        if (f_ % DV == 0u && (kbm & (1u << u)) != 0u)                                              \
            atomicOr(kbad_s[kbi_], 1u << (f_ / DV));                                               \
        UNROLL for (uint w_ = 0u; w_ < 2u; w_++) {                                             \
            uvec4 x_ = ld[w_ * NL2 + u];                                                           \
            if (KV_DT == DT_BF16)                                                                  \
                x_ = uvec4(bf16x2_to_f16x2(x_.x), bf16x2_to_f16x2(x_.y), bf16x2_to_f16x2(x_.z),    \
                           bf16x2_to_f16x2(x_.w));                                                 \
            sh[(base_) + w_ * KVT + (f_ / DV) * LDK + f_ % DV] = x_;                               \
        }                                                                                          \
    }

#if !CM2
        if (t == 0u)
            kbad_s[0] = 0u;
        FETCH(0)
        barrier();
        STORE(0, 0u, 0)
        barrier();
        for (int i = 0; i < nblk; i++) {
            if (t == 0u)
                kbad_s[(i + 1) & 1] = 0u; /* read last in block i - 1, written in i + 1 */
            if (i + 1 < nblk)
                FETCH(i + 1)
            const int kb = kb0 + i * int(BN);
            const uint bad = kbad_s[i & 1];
            const bool edge = mixed || kb + int(BN) > hmin || kb < lmax || bad != 0u;

            /* (b) S = Q K^T */
            ACC s0 = ACC_ZERO, s1 = ACC_ZERO;
            UNROLL for (uint k = 0u; k < DT; k++) {
                FB b0, b1;
                LOAD_BT(b0, 2u * k, LDK);
                LOAD_BT(b1, 16u * LDK + 2u * k, LDK);
                MMA(s0, qf[k], b0);
                MMA(s1, qf[k], b1);
            }
            STORE_C(s0, sw, SLD);
            STORE_C(s1, sw + 4u, SLD);
            SG_SYNC();
            /* (c) the online softmax of row rr, keys 16 half_ .. + 16 */
            const uint so = sw + (lane / 2u) * SLD + 4u * half_;
            vec4 x[4];
            UNROLL for (uint c = 0u; c < 4u; c++)
                x[c] = uintBitsToFloat(sh[so + c]);
            float mx = NEG_INF;
            UNROLL for (uint c = 0u; c < 4u; c++)
                UNROLL for (uint e = 0u; e < 4u; e++) {
                    float y = x[c][e];
                    if (p.softcap > 0.0)
                        y = p.softcap * tanh(y / p.softcap);
                    if (edge) {
                        uint kc = 16u * half_ + 4u * c + e;
                        int j = kb + int(kc);
                        bool vis = j >= rlo && j < rhi && (bad & (1u << kc)) == 0u;
                        y = vis ? y : NEG_INF;
                    }
                    x[c][e] = y;
                    mx = max(mx, y);
                }
            mx = pair_max(mx, t);
            float m_new = max(m_run, mx);
            /* rows with no visible key so far keep m = -inf and p = 0 */
            float b = isinf(m_new) ? 0.0 : m_new;
            float corr = exp(m_run - b);
            m_run = m_new;
            float sum = 0.0;
            uvec4 pw[2];
            UNROLL for (uint c = 0u; c < 4u; c++) {
                vec4 pr = exp(x[c] - b);
                sum += pr.x + pr.y + pr.z + pr.w;
                pw[c / 2u][2u * (c % 2u)] = packHalf2x16(pr.xy);
                pw[c / 2u][2u * (c % 2u) + 1u] = packHalf2x16(pr.zw);
            }
            l_run = l_run * corr + sum;
            /* P's row 2 uvec4s into S's: half 0 writes uvec4s 2-3 (its floats 8-15), 1 4-5 */
            sh[so - 4u * half_ + POFF + 2u * half_] = pw[0];
            sh[so - 4u * half_ + POFF + 2u * half_ + 1u] = pw[1];
            if (half_ == 0u)
                corr_s[rr] = corr;
            SG_SYNC();
            /* (d) O = O diag(corr) + P V */
            for (uint i2 = 0u; i2 < NEL(o[0]); i2++) {
                float cf = corr_s[warp * 16u + ROW_OF(i2)];
                UNROLL for (uint j = 0u; j < DT; j++)
                    EL(o[j], i2) *= cf;
            }
            FA pa0, pa1;
            LOAD_A(pa0, sw + POFF, SLD);
            LOAD_A(pa1, sw + POFF + 2u, SLD);
            UNROLL for (uint j = 0u; j < DT; j++) {
                FB v0, v1;
                LOAD_B(v0, KVT + 2u * j, LDK);
                LOAD_B(v1, KVT + 16u * LDK + 2u * j, LDK);
                MMA(o[j], pa0, v0);
                MMA(o[j], pa1, v1);
            }
            barrier(); /* every subgroup is done with this block's K and V */
            if (i + 1 < nblk)
                STORE(i + 1, 0u, (i + 1) & 1)
            barrier();
        }
#else
        if (t == 0u) {
            kbad_s[0] = 0u;
            kbad_s[1] = 0u;
            kbad_s[2] = 0u;
        }
        FETCH(0)
        barrier();
        STORE(0, 0u, 0)
        barrier();
        for (int i = 0; i < nblk; i++) {
            /* block i's K at kt, V at kt + KVT; kbad_s[(i + 2) % 3] was read last in block
             * i - 1 and is written in block i + 1 */
            const uint kt = STAGES == 2u ? uint(i & 1) * 2u * KVT : 0u;
            if (t == 0u)
                kbad_s[uint(i + 2) % 3u] = 0u;
            if (i + 1 < nblk)
                FETCH(i + 1)
            const int kb = kb0 + i * int(BN);
            const uint bad = kbad_s[uint(i) % 3u];
            const bool edge = mixed || kb + int(BN) > hmin || kb < lmax || bad != 0u;

            /* (b) S = Q K^T: s0 keys 0-15 of the block, s1 keys 16-31 */
            ACC s0 = ACC_ZERO, s1 = ACC_ZERO;
            FB b0, b1;
#define S_STEP(k_)                                                                                 \
    {                                                                                              \
        if ((k_) == 0u || (VAR & 32u) == 0u) {                                                     \
            LOAD_BT(b0, kt + 2u * (k_), LDK);                                                      \
            LOAD_BT(b1, kt + 16u * LDK + 2u * (k_), LDK);                                          \
        }                                                                                          \
        MMA(s0, qf[k_], b0);                                                                       \
        MMA(s1, qf[k_], b1);                                                                       \
        if (SPLIT == 2u) {                                                                         \
            MMA(s0, ql[k_], b0);                                                                   \
            MMA(s1, ql[k_], b1);                                                                   \
        }                                                                                          \
    }
            DT_LOOP_MMA(S_STEP)
            /* (c) soft-cap and masks element by element; the rows' maxima */
            ACC tm = ACC_ZERO;
            UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++) {
                float y0 = EL(s0, i2) * QINV, y1 = EL(s1, i2) * QINV;
                if (p.softcap > 0.0) {
                    y0 = p.softcap * tanh(y0 / p.softcap);
                    y1 = p.softcap * tanh(y1 / p.softcap);
                }
                if (edge) {
                    uint r = warp * 16u + ROW_E(i2), c = COL_E(i2);
                    int lo = row_lo[r], hi = row_seq[r] == cur ? row_hi[r] : 0;
                    int j0 = kb + int(c), j1 = j0 + 16;
                    y0 = j0 >= lo && j0 < hi && (bad & (1u << c)) == 0u ? y0 : NEG_INF;
                    y1 = j1 >= lo && j1 < hi && (bad & (1u << (c + 16u))) == 0u ? y1 : NEG_INF;
                }
                EL(s0, i2) = y0;
                EL(s1, i2) = y1;
                EL(tm, i2) = max(y0, y1);
            }
            if ((VAR & 128u) == 0u)
                ROW_MAX(tm);
            /* the online softmax: m_acc / l_acc hold each row's running max / this element's
             * share of its sum; tm becomes the rows' rescale factors */
            UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++) {
                float mo = EL(m_acc, i2), mn = max(mo, EL(tm, i2));
                /* rows with no visible key so far keep m = -inf and p = 0 */
                float b = isinf(mn) ? 0.0 : mn;
                const bool nsm = (VAR & 128u) != 0u;
                float cf = nsm ? 1.0 : exp(mo - b);
                float p0 = nsm ? EL(s0, i2) : exp(EL(s0, i2) - b);
                float p1 = nsm ? EL(s1, i2) : exp(EL(s1, i2) - b);
                EL(m_acc, i2) = mn;
                EL(tm, i2) = cf;
                EL(l_acc, i2) = EL(l_acc, i2) * cf + (p0 + p1);
                EL(s0, i2) = p0 * PSC;
                EL(s1, i2) = p1 * PSC;
            }
            /* (d) O = O diag(corr) + P V, P in registers (accumulator -> A); VAR 2: no
             * rescale where the subgroup's factors are all 1 (its rows' maxima unchanged) */
            bool keep = (VAR & 2u) != 0u;
            if (keep) {
                UNROLL for (uint i2 = 0u; i2 < NEL(tm); i2++)
                    keep = keep && EL(tm, i2) == 1.0;
                keep = SG_ALL(keep);
            }
            if (!keep) {
                if (OUNR != 0u) {
#define O_SCALE(j_) o[j_] = ACC_MUL(o[j_], tm);
                    DT_STEPS(O_SCALE)
                } else {
                    UNROLL for (uint j = 0u; j < DT; j++)
                        UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++)
                            EL(o[j], i2) *= EL(tm, i2);
                }
            }
            FA pa0, pa1, pl0, pl1;
            if (SPLIT == 2u) {
                /* hi = P cut to 11 bits (tm, free again), lo = the rest (exact in f32) */
                UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++)
                    EL(tm, i2) = cut11(EL(s0, i2));
                TO_A(pa0, tm);
                UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++)
                    EL(s0, i2) -= EL(tm, i2);
                TO_A(pl0, s0);
                UNROLL for (uint i2 = 0u; i2 < NEL(s1); i2++)
                    EL(tm, i2) = cut11(EL(s1, i2));
                TO_A(pa1, tm);
                UNROLL for (uint i2 = 0u; i2 < NEL(s1); i2++)
                    EL(s1, i2) -= EL(tm, i2);
                TO_A(pl1, s1);
            } else {
                TO_A(pa0, s0);
                TO_A(pa1, s1);
            }
            FB v0, v1;
#define PV_STEP(j_)                                                                                \
    {                                                                                              \
        if ((j_) == 0u || (VAR & 64u) == 0u) {                                                     \
            LOAD_B(v0, kt + KVT + 2u * (j_), LDK);                                                 \
            LOAD_B(v1, kt + KVT + 16u * LDK + 2u * (j_), LDK);                                     \
        }                                                                                          \
        MMA(o[j_], pa0, v0);                                                                       \
        MMA(o[j_], pa1, v1);                                                                       \
        if (SPLIT == 2u) {                                                                         \
            MMA(o[j_], pl0, v0);                                                                   \
            MMA(o[j_], pl1, v1);                                                                   \
        }                                                                                          \
    }
            DT_LOOP_MMA(PV_STEP)
            if (STAGES == 2u) {
                /* the other stage was read last in block i - 1, before the barrier */
                if (i + 1 < nblk)
                    STORE(i + 1, uint((i + 1) & 1) * 2u * KVT, uint(i + 1) % 3u)
                barrier();
            } else {
                barrier(); /* every subgroup is done with this block's K and V */
                if (i + 1 < nblk)
                    STORE(i + 1, 0u, uint(i + 1) % 3u)
                barrier();
            }
        }
#endif
    }

#if CM2
    /* O / l (PSC undone), through 16 x 5 uvec4s of the subgroup, one matrix at a time */
    ROW_SUM(l_acc);
    UNROLL for (uint i2 = 0u; i2 < NEL(l_acc); i2++) {
        float l = EL(l_acc, i2);
        EL(l_acc, i2) = l > 0.0 ? 1.0 / (l * PSC) : 0.0;
    }
    if (OUNR != 0u) {
#define O_NORM(j_) o[j_] = ACC_MUL(o[j_], l_acc);
        DT_STEPS(O_NORM)
    } else {
        UNROLL for (uint j = 0u; j < DT; j++)
            UNROLL for (uint i2 = 0u; i2 < NEL(l_acc); i2++)
                EL(o[j], i2) *= EL(l_acc, i2);
    }
    {
        const uint tok = t0 + rr / p.hh, hr = hc0 + rr % p.hh;
        const bool out_ok = rr < rows && tok < p.n_tok && hr < p.n_rep;
        const uint ob = p.o_off + (tok * p.n_heads + g * p.n_rep + hr) * D;
        const uint so = warp * 80u + (lane / 2u) * 5u + 2u * half_;
#define O_OUT(j_)                                                                                  \
    {                                                                                              \
        STORE_C(o[j_], warp * 80u, 5u);                                                            \
        SG_SYNC();                                                                                 \
        if (out_ok) {                                                                              \
            UNROLL for (uint c = 0u; c < 2u; c++) {                                                \
                vec4 y = uintBitsToFloat(sh[so + c]);                                              \
                UNROLL for (uint e = 0u; e < 4u; e++)                                              \
                    res[ob + 16u * (j_) + 8u * half_ + 4u * c + e] = y[e];                         \
            }                                                                                      \
        }                                                                                          \
        SG_SYNC();                                                                                 \
    }
        DT_LOOP(O_OUT)
    }
#else
    /* O / l, through the subgroup's S region two matrices (32 columns) at a time */
    float l_tot = pair_sum(l_run, t);
    if (half_ == 0u)
        corr_s[rr] = l_tot > 0.0 ? 1.0 / l_tot : 0.0;
    SG_SYNC();
    for (uint i2 = 0u; i2 < NEL(o[0]); i2++) {
        float cf = corr_s[warp * 16u + ROW_OF(i2)];
        UNROLL for (uint j = 0u; j < DT; j++)
            EL(o[j], i2) *= cf;
    }
    const uint tok = t0 + rr / p.hh, hr = hc0 + rr % p.hh;
    const bool out_ok = rr < rows && tok < p.n_tok && hr < p.n_rep;
    const uint ob = p.o_off + (tok * p.n_heads + g * p.n_rep + hr) * D;
    UNROLL for (uint j = 0u; j < DT; j += 2u) {
        STORE_C(o[j], sw, SLD);
        STORE_C(o[j + 1u], sw + 4u, SLD);
        SG_SYNC();
        if (out_ok) {
            const uint so = sw + (lane / 2u) * SLD + 4u * half_;
            UNROLL for (uint c = 0u; c < 4u; c++) {
                vec4 y = uintBitsToFloat(sh[so + c]);
                UNROLL for (uint e = 0u; e < 4u; e++)
                    res[ob + 16u * (j + half_) + 4u * c + e] = y[e];
            }
        }
        SG_SYNC();
    }
#endif
}

#version 450
#extension GL_EXT_control_flow_attributes : require
/* Fast-mode prefill attention on VK_NV_cooperative_matrix2: FlashAttention-2's forward pass
 * (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
 * Alg. 1) over the paged KV cache (PagedAttention, Kwon et al. SOSP 2023), one pass a tile.
 * The arithmetic of attention_prefill_cm.comp's fast mode (q * scale and P rounded once to f16,
 * 16 x 16 x 16 multiply-adds into f32, running max and sum in f32), the same tiling and ring:
 * a workgroup of NW = WG / 32 subgroups takes BM = 16 NW rows, hh heads of one GQA group times
 * tt = BM / hh consecutive tokens; subgroup w holds rows [16 w, 16 w + 16) as D / 16 A matrices
 * of q * scale and D / 16 output accumulators; keys and values come in blocks of BN = 32
 * through two shared stages (the next block's 16-byte loads in registers during this one, one
 * workgroup barrier a block). S stays in two accumulators, the row maxima are one
 * coopMatReduceNV, m_acc / l_acc (running max, each element's share of its row's sum) are
 * accumulators of the same type, P reaches P V as an A matrix converted from the accumulator.
 *
 * What differs from attention_prefill_cm.comp's CM2 module, each for what it cost there at one
 * workgroup an SM (H200, docs/benchmarks.md, "Vulkan prefill attention: a probe of the block's
 * primitives, and a one-pass module"): one pass a tile (vk_ops_attn_pf.c routes ubatches whose tiles each hold one stream's
 * tokens; a row of another stream sees no key), its bounds from subgroup reductions (no
 * 128-way atomics on one word); the Q tile loaded and O stored as 16-byte vectors where their
 * offsets allow (VEC); masks by coopMatPerElementNV's row and column (no index matrix in
 * registers) on the blocks that cross a row's key range or hold a bad page id only; the
 * soft-cap compiled in only where asked (SOFTCAP); the ring's loads and stores unconditional
 * (the block past the last loads nothing: its keys lie outside the range); 256 invocations and
 * head dim 128 as literals (HD), so that no register array's size is a specialization
 * constant. Fast mode only.
 *
 * LAZY (LLMEM_VULKAN_ATTN_PF_FA bit 2; FlashAttention-4's lazy rescale, Zadouri et al. 2025):
 * a row keeps its reference max m while a block's max stays within LAZY_TH = 8 ln 2 of it, so
 * that P = exp(s - m) <= 256 (f16 rounds it with the same relative error; the f32 sums have
 * room) and its factor is exp(0) = 1: O and l are rescaled only where some row's max grew by
 * more (the subgroup's vote). The same O / l with another reference: the results move by
 * rounding, within the same bound against float64 (H200 bench shape: 3.03 ms against 3.52).
 * DIRECT (bit 4, f16 pools of pages of 2^k >= 16 keys): each subgroup loads its K and V
 * fragments from the pools by coopMatLoad (a 16-key group of a block lies in one page: rows
 * at the stride of a slot), with no ring, store nor barrier in the loop; V's rows past the pass
 * or on a bad page read as 0 (coopMatPerElementNV). Measuring only: 8.6 ms on the H200, the
 * fragments' loads from global memory cost far more than the ring
 * (docs/benchmarks.md, "Vulkan prefill attention: lazy rescale and direct K / V loads").
 * B64 (bit 8): blocks of 64 keys in one K / V stage (34 KiB; two stages would take 68 of the
 * H200's 48), S in four accumulators: the block's fixed work (row maxima, the rescale's vote,
 * the masks' tests) halved a key (the ring's barriers stay two a 64-key block). KV_SEP (bit
 * 16): one stage whose K and V halves are refilled apart, each after the barrier that ends its
 * reads (the next block's K fetched before S and stored before P V, its V fetched then and
 * stored after P V), so that half the ring's rows are in registers at a time and each store
 * overlaps the other half's math (docs/benchmarks.md, "Vulkan prefill attention: 64-key
 * blocks, a K / V ring refilled in halves, and O out of local memory").
 * VLATE (bit 32) fetches the next block's V rows after the softmax; QFIRST (bit 64) issues the
 * Q tile's loads before the row table's. OUNR (bit 128): O's rescale, normalization and store
 * written out matrix by matrix, as whole-matrix products: the driver kept one of those loops
 * rolled, so o[] (256 bytes an invocation) lived in local memory through the whole pass; H200
 * bench shape 1.70 ms against 2.84 (64-key blocks) and 1.79 (32-key blocks).
 *
 * EMU (-DEMU=1, attention_prefill_fa_emu, by glslangValidator): the same tiling, layout, masks
 * and softmax with scalar loops for the matrix operations, the reductions, the conversion and
 * the per-element operation (an accumulator: 8 elements an invocation, row lane / 2, columns
 * 8 (lane % 2) + i), any head dim that is a multiple of 16, one K / V stage where two do not
 * fit the device's shared memory, so that lavapipe checks the indexing against float64
 * (tests/test_vulkan_attn_pf.c).
 *
 * Self-contained (no common.glsl): shaders/khr/attention_prefill_fa.spv is embedded while its
 * recorded SHA-256 matches this file (shaders/shaders.cmake). */
#ifndef EMU
#define EMU 0
#endif
#if !EMU
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_vote : require
#define HD 128
#endif

#ifdef HD
/* the workgroup and head dim fixed: every register array sized by a literal */
layout(local_size_x = 256) in;
const uint WG = 256;
const uint D = HD;
#else
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;  /* 32 NW; EMU: 128 where 256 does not fit */
layout(constant_id = 1) const uint D = 128;   /* EMU: any multiple of 16 */
#endif
layout(constant_id = 2) const uint KV_DT = 1; /* 1 f16, 2 bf16 */
layout(constant_id = 3) const uint STAGES = 2;
/* 1: the soft-cap p.softcap tanh(s / p.softcap) (p.softcap > 0) */
layout(constant_id = 4) const uint SOFTCAP = 0;
/* log2 of a power-of-two page size (page ids by shift and mask), else 32 (division) */
layout(constant_id = 5) const uint PSL = 32;
/* 1: p.q_off and p.o_off are multiples of 4 floats: Q and O as 16-byte vectors */
layout(constant_id = 6) const uint VEC = 0;
/* the variant's bits (LLMEM_VULKAN_ATTN_PF_FA's, as vk_ops_attn_pf.c resolved them), each
 * constant below 0 or 1 */
layout(constant_id = 7) const uint FAV = 0;
/* lazy rescale: a row keeps its reference max while the block's max exceeds it by at most
 * LAZY_TH (P <= 256), and O, l are rescaled only for rows whose max grew by more */
const uint LAZY = (FAV >> 1u) & 1u;
/* K / V fragments straight from the pool (f16 pools, pages of 2^PSL >= 16 keys: a 16-key
 * group of a block lies in one page), no ring, no store and no barrier in the loop */
const uint DIRECT = (FAV >> 2u) & 1u;
/* blocks of 64 keys (one K / V stage: two do not fit 48 KiB), half the blocks' fixed work
 * (row maxima, the rescale's vote, the masks' tests) a key; not with DIRECT */
const uint B64 = (FAV >> 3u) & 1u;
/* one K / V stage whose K half and V half are refilled apart: the next block's K rows are
 * fetched before S and stored after the barrier that ends this block's reads of K, its V rows
 * fetched then and stored after the barrier that ends P V (the host passes STAGES 1) */
const uint KV_SEP = (FAV >> 4u) & 1u;
/* the next block's V rows fetched after this block's softmax (not with its K rows at the
 * block's start), from the addresses kept: no V rows in registers during S */
const uint VLATE = (FAV >> 5u) & 1u;
/* the Q tile's loads issued before the row table's and stored into sh before its first
 * barrier (their latencies overlapped, one barrier fewer) */
const uint QFIRST = (FAV >> 6u) & 1u;
/* O's rescale, normalization and store as eight written-out steps of whole-matrix products
 * (o[j] * tm), with no loop over O's matrices or their elements that the driver might keep
 * rolled (a rolled loop indexes o, which then lives in local memory) */
const uint OUNR = (FAV >> 7u) & 1u;
#define DT_BF16 2u

const uint BN = B64 != 0u ? 64u : 32u; /* keys a block */
const uint NW = WG / 32u;      /* subgroups */
const uint BM = 16u * NW;      /* rows a tile */
const uint DV = D / 8u;        /* uvec4s of a K / V / Q row */
const uint LDK = DV + 1u;      /* padded row of the K, V and Q tiles (uvec4s) */
const uint KVT = BN * LDK;     /* uvec4s of a K or V tile */
const uint NL2 = BN * DV / WG; /* K (and V) uvec4 loads an invocation a block */
#ifdef HD
const uint NLD = 64u * (HD / 8u) / 256u; /* ld's size: NL2 at most, a literal */
#else
const uint NLD = NL2;
#endif
/* the K / V stages, the Q tile once, the output through 16 x 5 uvec4s a subgroup at the end */
const uint NSH0 = STAGES * 2u * KVT > NW * 80u ? STAGES * 2u * KVT : NW * 80u;
const uint NSH = NSH0 > BM * LDK ? NSH0 : BM * LDK;
const uint DT = D / 16u;                  /* output matrices a subgroup */
const uint NQ = (BM * DV + WG - 1u) / WG; /* Q tile uvec4s an invocation */
const uint NO_ROWS = 0xffffffffu;
const float LAZY_TH = 5.5451774; /* 8 ln 2: exp(s - m_ref) <= 256 */
const int BIG = 0x7fffffff;

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(binding = 1) writeonly buffer O { float res[]; };
layout(binding = 1) writeonly buffer O4 { vec4 res4[]; };
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
/* the pass's key range [row_lo, row_hi) of each row (row_hi 0: no key) */
shared int row_lo[BM], row_hi[BM];
shared int pass_s[6];  /* stream, jlo (min), jhi (max), hmin (min), lmax (max), mixed */
/* bit k of word h: key 32 h + k of the block has a bad page id (block i at 2 (i % 3)) */
shared uint kbad_s[6];
#if EMU
shared float xch_s[WG];       /* the pair exchange of EMU */
shared float xch8_s[8u * WG]; /* EMU's accumulator -> A conversion */
#endif

#define NEG_INF uintBitsToFloat(0xff800000u)

/* ---- matrix operations: cooperative matrix 2, or their scalar emulation --------------------- */
#if !EMU
#define UNROLL [[unroll]]
#define FA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ACC16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ACC_FILL(x_) ACC(x_)
#define LOAD_A(m_, o_, s_) coopMatLoad(m_, sh, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_BT(m_, o_, s_) coopMatLoad(m_, sh, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#define LOAD_B(m_, o_, s_) coopMatLoad(m_, sh, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define STORE_C(m_, o_, s_) coopMatStore(m_, sh, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
/* the same from the K / V pools (DIRECT): o_, s_ in uvec4s */
#define LOADK_BT(m_, o_, s_) coopMatLoad(m_, kp, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#define LOADV_B(m_, o_, s_) coopMatLoad(m_, vp, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define MMA(c_, a_, b_) c_ = coopMatMulAdd(a_, b_, c_)
#define EL(m_, i_) m_[i_]
#define NEL(m_) uint(m_.length())
#define SG_ALL(x_) subgroupAll(x_)
#define SG_MIN(x_) subgroupMin(x_)
#define SG_MAX(x_) subgroupMax(x_)
#define SG_LEAD (lane == 0u)
/* the subgroup's shared-memory writes visible to its other invocations */
#define SG_SYNC()                                                                                  \
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,                  \
                   gl_SemanticsAcquireRelease)
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
/* keys outside their row's range [row_lo, row_hi) or on a bad page (bit col of bad) to -inf:
 * element (row, col) of the subgroup's rows 16 w.. is key kb + col of row 16 w + row */
float mask_el(const in uint row, const in uint col, const in float x, const in int kb,
              const in uint bad, const in uint r0)
{
    const int j = kb + int(col);
    const uint r = r0 + row;
    return j >= row_lo[r] && j < row_hi[r] && (bad & (1u << col)) == 0u ? x : NEG_INF;
}
#define MASK(m_, kb_, bad_) coopMatPerElementNV(m_, m_, mask_el, kb_, bad_, warp * 16u)
/* rows (keys) of a V fragment whose bit is set in z to 0 (slots past the pass or on a bad
 * page may hold anything, NaN included; their P is 0) */
float16_t vzero_el(const in uint row, const in uint col, const in float16_t x, const in uint z)
{
    return (z & (1u << row)) != 0u ? float16_t(0.0) : x;
}
#define VZERO(m_, z_) coopMatPerElementNV(m_, m_, vzero_el, z_)
#else
/* loops kept rolled: unrolled, llvmpipe's compile of the scalar MMAs takes minutes */
#define UNROLL [[dont_unroll]]
struct FA { uvec4 a0, a1; };     /* this invocation's row (lane / 2) of 16 halves */
/* where the matrix lies: src 0 sh, 1 kp, 2 vp; tr: column-major; z: rows (keys) read as 0 */
struct FB { uint off, ld, tr, src, z; };
struct ACC { float e[8]; };      /* row lane / 2, columns 8 (lane % 2) + i */
ACC acc_fill(float x)
{
    ACC c;
    for (uint i = 0u; i < 8u; i++)
        c.e[i] = x;
    return c;
}
#define ACC_FILL(x_) acc_fill(x_)
#define LOAD_A(m_, o_, s_) m_ = FA(sh[(o_) + (lane / 2u) * (s_)], sh[(o_) + (lane / 2u) * (s_) + 1u])
#define LOAD_BT(m_, o_, s_) m_ = FB(o_, s_, 1u, 0u, 0u)
#define LOAD_B(m_, o_, s_) m_ = FB(o_, s_, 0u, 0u, 0u)
#define LOADK_BT(m_, o_, s_) m_ = FB(o_, s_, 1u, 1u, 0u)
#define LOADV_B(m_, o_, s_) m_ = FB(o_, s_, 0u, 2u, 0u)
#define VZERO(m_, z_) m_.z = (z_)
#define STORE_C(m_, o_, s_) emu_store(m_, o_, s_, lane)
#define MMA(c_, a_, b_) c_ = emu_mma(a_, b_, c_, lane)
#define EL(m_, i_) m_.e[i_]
#define NEL(m_) 8u
#define SG_ALL(x_) false
/* every invocation takes part in the workgroup's atomics itself */
#define SG_MIN(x_) (x_)
#define SG_MAX(x_) (x_)
#define SG_LEAD true
#define SG_SYNC() barrier()

/* half k of 16-byte word w */
float half_of(uvec4 w, uint k)
{
    return unpackHalf2x16(w[k / 2u])[k % 2u];
}

/* 16-byte word w of B's buffer */
uvec4 fb_word(FB b, uint w)
{
    if (b.src == 1u)
        return kp[w];
    if (b.src == 2u)
        return vp[w];
    return sh[w];
}

ACC emu_mma(FA a, FB b, ACC c, uint lane)
{
    UNROLL for (uint i = 0u; i < 8u; i++) {
        uint n = 8u * (lane % 2u) + i;
        float s = c.e[i];
        /* unrolled: llvmpipe stops an invocation's loops after 65535 iterations in all */
        for (uint k = 0u; k < 16u; k++) {
            float x = half_of(k < 8u ? a.a0 : a.a1, k % 8u);
            float y = b.tr != 0u ? half_of(fb_word(b, b.off + n * b.ld + k / 8u), k % 8u)
                                 : half_of(fb_word(b, b.off + k * b.ld + n / 8u), n % 8u);
            if ((b.z & (1u << (b.tr != 0u ? n : k))) != 0u)
                y = 0.0;
            s += x * y;
        }
        c.e[i] = s;
    }
    return c;
}

void emu_store(ACC c, uint off, uint ld, uint lane)
{
    uint o = off + (lane / 2u) * ld + 2u * (lane % 2u);
    sh[o] = floatBitsToUint(vec4(c.e[0], c.e[1], c.e[2], c.e[3]));
    sh[o + 1u] = floatBitsToUint(vec4(c.e[4], c.e[5], c.e[6], c.e[7]));
}

/* x of the partner invocation (lane ^ 1) */
float partner(float x, uint t)
{
    xch_s[t] = x;
    barrier();
    float y = xch_s[t ^ 1u];
    barrier();
    return y;
}

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
void emu_mask(inout ACC m, int kb, uint bad, uint r, uint lane)
{
    for (uint i = 0u; i < 8u; i++) {
        const uint col = 8u * (lane % 2u) + i;
        const int j = kb + int(col);
        m.e[i] = j >= row_lo[r] && j < row_hi[r] && (bad & (1u << col)) == 0u ? m.e[i] : NEG_INF;
    }
}
#define MASK(m_, kb_, bad_) emu_mask(m_, kb_, bad_, warp * 16u + lane / 2u, lane)
#endif

uint bf16x2_to_f16x2(uint x)
{
    return packHalf2x16(vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u)));
}

#ifdef HD
/* m_(j) for each of O's DT = HD / 16 = 8 matrices, written out */
#define FOR_DT(m_) m_(0u) m_(1u) m_(2u) m_(3u) m_(4u) m_(5u) m_(6u) m_(7u)
#endif

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

    /* the Q tile's rows of this invocation (q * scale, f32), Q_LOAD's loads in flight */
    vec4 qx[2u * NQ];
#define Q_LOAD()                                                                                   \
    UNROLL for (uint n = 0u; n < NQ; n++) {                                                        \
        uint e = t + n * WG, r = e / DV, c = e % DV;                                               \
        uint tok = t0 + r / p.hh, hr = hc0 + r % p.hh;                                             \
        vec4 xa = vec4(0.0), xb = vec4(0.0);                                                       \
        if (e < BM * DV && r < rows && tok < p.n_tok && hr < p.n_rep) {                            \
            uint b = p.q_off + (tok * p.n_heads + g * p.n_rep + hr) * D + 8u * c;                  \
            if (VEC != 0u) {                                                                       \
                xa = q4[b / 4u];                                                                   \
                xb = q4[b / 4u + 1u];                                                              \
            } else {                                                                               \
                xa = vec4(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);                                  \
                xb = vec4(q[b + 4u], q[b + 5u], q[b + 6u], q[b + 7u]);                             \
            }                                                                                      \
        }                                                                                          \
        qx[2u * n] = xa;                                                                           \
        qx[2u * n + 1u] = xb;                                                                      \
    }
    /* qx * scale rounded to f16 into the Q tile in sh */
#define Q_STORE()                                                                                  \
    UNROLL for (uint n = 0u; n < NQ; n++) {                                                        \
        uint e = t + n * WG, r = e / DV, c = e % DV;                                               \
        vec4 xa = qx[2u * n] * p.scale, xb = qx[2u * n + 1u] * p.scale;                            \
        if (e < BM * DV)                                                                           \
            sh[r * LDK + c] = uvec4(packHalf2x16(xa.xy), packHalf2x16(xa.zw),                      \
                                    packHalf2x16(xb.xy), packHalf2x16(xb.zw));                     \
    }
    if (QFIRST != 0u)
        Q_LOAD()

    /* row t (t < BM): its stream and key range (attention_decode.comp's checks); s -1: a query
     * that sees no key, -2: padding */
    int s = -2, lo = 0, hi = 0;
    if (t < BM) {
        uint tok = t0 + t / p.hh, hr = hc0 + t % p.hh;
        if (t < rows && tok < p.n_tok && hr < p.n_rep) {
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
    }
    if (QFIRST != 0u)
        Q_STORE() /* read after the barriers below */
    if (t == 0u) {
        pass_s[0] = BIG;
        pass_s[1] = BIG;
        pass_s[2] = 0;
        pass_s[3] = BIG;
        pass_s[4] = 0;
        pass_s[5] = 0;
        UNROLL for (uint k = 0u; k < 6u; k++)
            kbad_s[k] = 0u;
    }
    barrier();
    /* the tile's stream: the smallest valid one among its rows */
    {
        int v = SG_MIN(s >= 0 ? s : BIG);
        if (SG_LEAD && v != BIG)
            atomicMin(pass_s[0], v);
    }
    barrier();
    const int cur = pass_s[0];
    /* the pass's range of this row: rows of another stream (or none) see no key */
    if (s != cur)
        hi = 0;
    if (t < BM) {
        row_lo[t] = lo;
        row_hi[t] = hi;
    }
    {
        const bool mine = s == cur && hi > lo;
        int vlo = SG_MIN(mine ? lo : BIG), vhi = SG_MAX(mine ? hi : 0);
        int vhm = SG_MIN(s == cur ? hi : BIG), vlm = SG_MAX(s == cur ? lo : 0);
        int vmx = SG_MAX(s != -2 && s != cur ? 1 : 0);
        if (SG_LEAD) {
            if (vlo != BIG)
                atomicMin(pass_s[1], vlo);
            if (vhi != 0)
                atomicMax(pass_s[2], vhi);
            if (vhm != BIG)
                atomicMin(pass_s[3], vhm);
            if (vlm != 0)
                atomicMax(pass_s[4], vlm);
            if (vmx != 0)
                atomicOr(pass_s[5], 1);
        }
    }

    /* the Q tile: q * scale rounded to f16, staged over all of sh, into qf */
    if (QFIRST == 0u) {
        Q_LOAD()
        Q_STORE()
        barrier();
    }
    FA qf[DT];
    UNROLL for (uint k = 0u; k < DT; k++)
        LOAD_A(qf[k], warp * 16u * LDK + 2u * k, LDK);
    barrier(); /* the Q tile read (and pass_s complete) before the K / V tiles come */

    ACC o[DT];
    UNROLL for (uint j = 0u; j < DT; j++)
        o[j] = ACC_FILL(0.0);
    ACC m_acc = ACC_FILL(NEG_INF), l_acc = ACC_FILL(0.0);
    const int jlo = pass_s[1], jhi = pass_s[2], hmin = pass_s[3], lmax = pass_s[4];
    const bool mixed = pass_s[5] != 0;
    if (jlo < jhi) {
        const uint pt = p.pt_off + (p.po_off != NO_ROWS ? uint(idx[p.po_off + uint(cur)])
                                                        : uint(cur) * p.max_pages);
        const int kb0 = jlo / int(BN) * int(BN);
        const int nblk = (jhi - kb0 + int(BN) - 1) / int(BN);
        uvec4 ld[2u * NLD];
        uint kbm = 0u;  /* bit u: slot u of the fetched block has a bad page id */
        uint fad[NLD];  /* the fetched slots' pool addresses (NO_ROWS: reads as 0) */

        /* block i's K rows into ld[u] (and with wv_ its V rows into ld[NL2 + u]; zeros
         * outside [jlo, jhi) and for bad page ids, whose slots u are kbm's bits), the slots'
         * addresses into fad */
#define FETCH(i_, wv_)                                                                             \
    kbm = 0u;                                                                                      \
    UNROLL for (uint u = 0u; u < NL2; u++) {                                                       \
        uint f_ = t + u * WG, a_ = NO_ROWS;                                                        \
        int key_ = kb0 + (i_) * int(BN) + int(f_ / DV);                                            \
        uvec4 xk_ = uvec4(0u), xv_ = uvec4(0u);                                                    \
        if (key_ >= jlo && key_ < jhi) {                                                           \
            int pg_ = idx[pt + PG_OF(uint(key_))];                                                 \
            if (pg_ >= 0 && uint(pg_) < p.n_pages) {                                               \
                a_ = ((uint(pg_) * p.ps + PG_IN(uint(key_))) * p.n_kv + g) * DV + f_ % DV;         \
                xk_ = kp[a_];                                                                      \
                if (wv_)                                                                           \
                    xv_ = vp[a_];                                                                  \
            } else {                                                                               \
                kbm |= 1u << u;                                                                    \
            }                                                                                      \
        }                                                                                          \
        ld[u] = xk_;                                                                               \
        if (wv_)                                                                                   \
            ld[NL2 + u] = xv_;                                                                     \
        fad[u] = a_;                                                                               \
    }
        /* the V rows of the slots FETCH found (KV_SEP, VLATE) */
#define FETCH_V()                                                                                  \
    UNROLL for (uint u = 0u; u < NL2; u++) {                                                       \
        uvec4 xv_ = uvec4(0u);                                                                     \
        if (fad[u] != NO_ROWS)                                                                     \
            xv_ = vp[fad[u]];                                                                      \
        ld[NL2 + u] = xv_;                                                                         \
    }
        /* ld's K (w0_ 0) and / or V (w1_ 1) rows into the tiles at base_ (bf16 converted);
         * with K, the block's keys with a bad page id (kbm) into kbad_s[2 kbi_..] */
#define STORE(base_, kbi_, w0_, w1_)                                                               \
    UNROLL for (uint u = 0u; u < NL2; u++) {                                                       \
        uint f_ = t + u * WG;                                                                      \
        if ((w0_) == 0u && f_ % DV == 0u && (kbm & (1u << u)) != 0u)                               \
            atomicOr(kbad_s[2u * (kbi_) + f_ / DV / 32u], 1u << (f_ / DV % 32u));                  \
        UNROLL for (uint w_ = (w0_); w_ <= (w1_); w_++) {                                          \
            uvec4 x_ = ld[w_ * NL2 + u];                                                           \
            if (KV_DT == DT_BF16)                                                                  \
                x_ = uvec4(bf16x2_to_f16x2(x_.x), bf16x2_to_f16x2(x_.y), bf16x2_to_f16x2(x_.z),    \
                           bf16x2_to_f16x2(x_.w));                                                 \
            sh[(base_) + w_ * KVT + (f_ / DV) * LDK + f_ % DV] = x_;                               \
        }                                                                                          \
    }

        const uint rs = p.n_kv * DV; /* uvec4s a pool slot (DIRECT) */
        if (DIRECT == 0u) {
            FETCH(0, true)
            STORE(0u, 0u, 0u, 1u)
            barrier();
        }
        for (int i = 0; i < nblk; i++) {
            const int kb = kb0 + i * int(BN);
            uint kt = 0u, bad = 0u, bad1 = 0u, ga0 = 0u, ga1 = 0u, z0 = 0u, z1 = 0u;
            if (DIRECT != 0u) {
                /* the block's two 16-key groups, each in one page: their first rows in the
                 * pools (ga0, ga1; page 0 for a group past the pass or on a bad page, whose
                 * keys are bad), and the rows of V read as 0 (z0, z1: keys >= jhi or bad) */
                UNROLL for (uint h = 0u; h < 2u; h++) {
                    const int k0 = kb + 16 * int(h);
                    const int pg = k0 < jhi ? idx[pt + PG_OF(uint(k0))] : -1;
                    const bool okp = pg >= 0 && uint(pg) < p.n_pages;
                    const uint a = ((okp ? uint(pg) : 0u) * p.ps + PG_IN(uint(k0))) * rs + g * DV;
                    const int nv = jhi - k0; /* keys of the group before jhi */
                    const uint z = !okp || nv <= 0 ? 0xffffu
                                   : nv >= 16   ? 0u
                                                : (0xffffu << uint(nv)) & 0xffffu;
                    if (h == 0u) {
                        ga0 = a;
                        z0 = z;
                    } else {
                        ga1 = a;
                        z1 = z;
                    }
                    if (!okp)
                        bad |= 0xffffu << (16u * h);
                }
            } else {
                /* block i's K at kt, V at kt + KVT; kbad_s[2 ((i + 2) % 3)..] were read last
                 * in block i - 1 and are written in block i + 1 */
                kt = STAGES == 2u ? uint(i & 1) * 2u * KVT : 0u;
                if (t < 2u)
                    kbad_s[2u * (uint(i + 2) % 3u) + t] = 0u;
                /* past the last block: keys >= jhi, no loads */
                FETCH(i + 1, KV_SEP == 0u && VLATE == 0u)
                bad = kbad_s[2u * (uint(i) % 3u)];
                if (BN == 64u)
                    bad1 = kbad_s[2u * (uint(i) % 3u) + 1u];
            }
            const bool edge =
                mixed || kb + int(BN) > hmin || kb < lmax || bad != 0u || bad1 != 0u;

            /* S = Q K^T: s0 keys 0-15 of the block, s1 keys 16-31 (64-key blocks: s2, s3 keys
             * 32-63) */
            ACC s0 = ACC_FILL(0.0), s1 = ACC_FILL(0.0), s2 = ACC_FILL(0.0), s3 = ACC_FILL(0.0);
            UNROLL for (uint k = 0u; k < DT; k++) {
                FB b0, b1;
                if (DIRECT != 0u) {
                    LOADK_BT(b0, ga0 + 2u * k, rs);
                    LOADK_BT(b1, ga1 + 2u * k, rs);
                } else {
                    LOAD_BT(b0, kt + 2u * k, LDK);
                    LOAD_BT(b1, kt + 16u * LDK + 2u * k, LDK);
                }
                MMA(s0, qf[k], b0);
                MMA(s1, qf[k], b1);
                if (BN == 64u) {
                    FB b2, b3;
                    LOAD_BT(b2, kt + 32u * LDK + 2u * k, LDK);
                    LOAD_BT(b3, kt + 48u * LDK + 2u * k, LDK);
                    MMA(s2, qf[k], b2);
                    MMA(s3, qf[k], b3);
                }
            }
            if (SOFTCAP != 0u)
                UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++) {
                    EL(s0, i2) = p.softcap * tanh(EL(s0, i2) / p.softcap);
                    EL(s1, i2) = p.softcap * tanh(EL(s1, i2) / p.softcap);
                    if (BN == 64u) {
                        EL(s2, i2) = p.softcap * tanh(EL(s2, i2) / p.softcap);
                        EL(s3, i2) = p.softcap * tanh(EL(s3, i2) / p.softcap);
                    }
                }
            if (edge) {
                MASK(s0, kb, bad);
                MASK(s1, kb + 16, bad >> 16u);
                if (BN == 64u) {
                    MASK(s2, kb + 32, bad1);
                    MASK(s3, kb + 48, bad1 >> 16u);
                }
            }
            /* the rows' maxima; the online softmax: tm becomes the rows' rescale factors */
            ACC tm;
            UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++) {
                EL(tm, i2) = max(EL(s0, i2), EL(s1, i2));
                if (BN == 64u)
                    EL(tm, i2) = max(EL(tm, i2), max(EL(s2, i2), EL(s3, i2)));
            }
            ROW_MAX(tm);
            UNROLL for (uint i2 = 0u; i2 < NEL(s0); i2++) {
                float mo = EL(m_acc, i2), mn = max(mo, EL(tm, i2));
                /* LAZY: the row keeps its reference while the max grew by at most LAZY_TH
                 * (its factor then exp(0) = 1, so the vote below skips O's rescale) */
                if (LAZY != 0u && !(mn > mo + LAZY_TH))
                    mn = mo;
                /* rows with no visible key so far keep m = -inf and p = 0 */
                float b = isinf(mn) ? 0.0 : mn;
                float cf = exp(mo - b), p0 = exp(EL(s0, i2) - b), p1 = exp(EL(s1, i2) - b);
                float ps = p0 + p1;
                if (BN == 64u) {
                    float p2 = exp(EL(s2, i2) - b), p3 = exp(EL(s3, i2) - b);
                    ps += p2 + p3;
                    EL(s2, i2) = p2;
                    EL(s3, i2) = p3;
                }
                EL(m_acc, i2) = mn;
                EL(tm, i2) = cf;
                EL(l_acc, i2) = EL(l_acc, i2) * cf + ps;
                EL(s0, i2) = p0;
                EL(s1, i2) = p1;
            }
            if (KV_SEP != 0u) {
                /* every subgroup is done with this block's K: the next block's K into it (the
                 * barrier at the block's end makes it visible), its V rows fetched */
                barrier();
                STORE(0u, uint(i + 1) % 3u, 0u, 0u)
                FETCH_V()
            } else if (VLATE != 0u && DIRECT == 0u) {
                FETCH_V() /* stored with K at the block's end */
            }
            /* O = O diag(corr) + P V; no rescale where the subgroup's factors are all 1 (its
             * rows' maxima unchanged: multiplying by 1 is exact) */
            bool keep = true;
            UNROLL for (uint i2 = 0u; i2 < NEL(tm); i2++)
                keep = keep && EL(tm, i2) == 1.0;
            if (!SG_ALL(keep)) {
#ifdef HD
#define O_SCALE(j_) o[j_] = o[j_] * tm;
                if (OUNR != 0u) {
                    FOR_DT(O_SCALE)
                } else
#endif
                    UNROLL for (uint j = 0u; j < DT; j++)
                        UNROLL for (uint i2 = 0u; i2 < NEL(tm); i2++)
                            EL(o[j], i2) *= EL(tm, i2);
            }
            FA pa0, pa1, pa2, pa3;
            TO_A(pa0, s0);
            TO_A(pa1, s1);
            if (BN == 64u) {
                TO_A(pa2, s2);
                TO_A(pa3, s3);
            }
            UNROLL for (uint j = 0u; j < DT; j++) {
                FB v0, v1;
                if (DIRECT != 0u) {
                    LOADV_B(v0, ga0 + 2u * j, rs);
                    LOADV_B(v1, ga1 + 2u * j, rs);
                    if ((z0 | z1) != 0u) {
                        VZERO(v0, z0);
                        VZERO(v1, z1);
                    }
                } else {
                    LOAD_B(v0, kt + KVT + 2u * j, LDK);
                    LOAD_B(v1, kt + KVT + 16u * LDK + 2u * j, LDK);
                }
                MMA(o[j], pa0, v0);
                MMA(o[j], pa1, v1);
                if (BN == 64u) {
                    FB v2, v3;
                    LOAD_B(v2, kt + KVT + 32u * LDK + 2u * j, LDK);
                    LOAD_B(v3, kt + KVT + 48u * LDK + 2u * j, LDK);
                    MMA(o[j], pa2, v2);
                    MMA(o[j], pa3, v3);
                }
            }
            if (DIRECT != 0u) {
                /* nothing shared in the loop */
            } else if (KV_SEP != 0u) {
                /* every subgroup is done with this block's V, the next block's K stored */
                barrier();
                STORE(0u, 0u, 1u, 1u)
            } else if (STAGES == 2u) {
                /* the other stage was read last in block i - 1, before the barrier */
                STORE(uint((i + 1) & 1) * 2u * KVT, uint(i + 1) % 3u, 0u, 1u)
                barrier();
            } else {
                barrier(); /* every subgroup is done with this block's K and V */
                STORE(0u, uint(i + 1) % 3u, 0u, 1u)
                barrier();
            }
        }
    }

    /* O / l, through 16 x 5 uvec4s of the subgroup, one matrix at a time */
    ROW_SUM(l_acc);
    UNROLL for (uint i2 = 0u; i2 < NEL(l_acc); i2++) {
        float l = EL(l_acc, i2);
        EL(l_acc, i2) = l > 0.0 ? 1.0 / l : 0.0;
    }
#ifdef HD
#define O_NORM(j_) o[j_] = o[j_] * l_acc;
    if (OUNR != 0u) {
        FOR_DT(O_NORM)
    } else
#endif
        UNROLL for (uint j = 0u; j < DT; j++)
            UNROLL for (uint i2 = 0u; i2 < NEL(l_acc); i2++)
                EL(o[j], i2) *= EL(l_acc, i2);
    const uint rr = warp * 16u + lane / 2u, half_ = lane % 2u; /* this invocation's row-half */
    const uint tok = t0 + rr / p.hh, hr = hc0 + rr % p.hh;
    const bool out_ok = rr < rows && tok < p.n_tok && hr < p.n_rep;
    const uint ob = p.o_off + (tok * p.n_heads + g * p.n_rep + hr) * D;
    const uint so = warp * 80u + (lane / 2u) * 5u + 2u * half_;
    /* O's matrix j_ through sh to the output rows */
#define O_OUT(j_)                                                                                  \
    {                                                                                              \
        STORE_C(o[j_], warp * 80u, 5u);                                                            \
        SG_SYNC();                                                                                 \
        if (out_ok) {                                                                              \
            UNROLL for (uint c = 0u; c < 2u; c++) {                                                \
                vec4 y = uintBitsToFloat(sh[so + c]);                                              \
                const uint at = ob + 16u * (j_) + 8u * half_ + 4u * c;                             \
                if (VEC != 0u) {                                                                   \
                    res4[at / 4u] = y;                                                             \
                } else {                                                                           \
                    UNROLL for (uint e = 0u; e < 4u; e++)                                          \
                        res[at + e] = y[e];                                                        \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        SG_SYNC();                                                                                 \
    }
#ifdef HD
    if (OUNR != 0u) {
        FOR_DT(O_OUT)
    } else
#endif
        UNROLL for (uint j = 0u; j < DT; j++)
            O_OUT(j)
}

#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_bfloat16 : require
/* A decode GEMM of 9-64 rows on bf16 cooperative matrices whose weights
 * go from the storage buffer straight into the matrices (tools/vk_cm_bench
 * only; docs/benchmarks.md, "Vulkan decode GEMM on bf16 cooperative
 * matrices"): out[M, N] = a[M, K] · w[N, K]ᵀ with bf16 w and bf16(a) in
 * 16 x 16 x 16 matrices (GL_EXT_bfloat16), f32 accumulators.
 *
 * Each subgroup loads its weight matrices with coopMatLoad from binding 0,
 * DEPTH K steps of BK ahead of their multiply-adds: no conversion, no
 * shared memory, no barrier on the weights' way. WT 0: w as B (column-
 * major, stride K: a column is one weight row's 16 contiguous bf16); WT 1:
 * the product transposed, outᵀ = w · aᵀ, w as A (row-major, stride K),
 * the activations as B, the accumulators stored column-major. Measured on
 * the H200 (driver 580): the weight stream alone (PROBE 1) runs at ~1.5
 * TB/s whatever the depth, workgroup or layout tried, against ~3.9 for
 * 16-byte register loads (matmul_dec.comp -DPROBE=1), so the plugin stages
 * the weights through registers and shared memory (matmul_dec.comp,
 * matmul_cm.comp with -DBF16=1) instead.
 *
 * a comes as cm_split.comp wrote it for fast mode (SPLIT 1): per row r an
 * exponent e_r and f16 terms hi; each is rounded to bf16 on its way into
 * shared memory. The output is matmul_cm.comp's raw epilogue (RAW 1):
 * unscaled partial tiles of each split-K slice, ldp floats a row.
 * matmul_dec.comp's interface and blocking (bindings, push constants,
 * specialization constants 0-10): a workgroup of WG = 32 NSG invocations
 * owns BM = 16 FM rows by BN = 16 FN NSG columns and one slice of
 * k_split; the activations of a chunk of KA sit in shared memory. Needs
 * K and k_split multiples of BK, N a multiple of 16 (matrices past N load
 * the last 16 columns again; their outputs land in the tiles' padding).
 * -DKCONST=K: K as a literal. -DPROBE=1: the weight stream and its multiply-adds with a constant
 * operand, nothing else. Compiled by a glslang with GL_EXT_bfloat16
 * (tools/glslang_khr.sh with LLMEM_GLSLANG_SUITE=sid; bf_build.sh). */
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

#ifndef WT
#define WT 0
#endif
#define CM_A coopmat<bfloat16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define CM_B coopmat<bfloat16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#if WT /* weights as A, activations as B */
#define CM_W CM_A
#define CM_X CM_B
#define LOAD_W(m_, a_, o_, s_) LOAD_ROW(m_, a_, o_, s_)
#define LOAD_X(m_, a_, o_, s_) LOAD_COL(m_, a_, o_, s_)
#define MMA_WX(w_, x_, c_) coopMatMulAdd(w_, x_, c_)
#define STORE_C(m_, a_, o_, s_) coopMatStore(m_, a_, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#else
#define CM_W CM_B
#define CM_X CM_A
#define LOAD_W(m_, a_, o_, s_) LOAD_COL(m_, a_, o_, s_)
#define LOAD_X(m_, a_, o_, s_) LOAD_ROW(m_, a_, o_, s_)
#define MMA_WX(w_, x_, c_) coopMatMulAdd(x_, w_, c_)
#define STORE_C(m_, a_, o_, s_) STORE_ROW(m_, a_, o_, s_)
#endif
#define CM_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROW(m_, a_, o_, s_) coopMatLoad(m_, a_, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COL(m_, a_, o_, s_) coopMatLoad(m_, a_, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROW(m_, a_, o_, s_) coopMatStore(m_, a_, o_, s_, gl_CooperativeMatrixLayoutRowMajor)

#ifndef KA_DEFAULT
#define KA_DEFAULT 256
#endif
#ifndef APF_DEFAULT
#define APF_DEFAULT 1
#endif
/* ids 1-10 as matmul_dec.comp's (W_DT bf16 and SPLIT 1 only, RAW 1 only) */
layout(constant_id = 1) const uint W_DT = 2;   /* (2: bf16) */
layout(constant_id = 2) const uint SGM = 1;    /* (1: the rows are one tile) */
layout(constant_id = 3) const uint FM = 1;     /* 16-row matrices: ceil(M / 16), 1 .. 4 */
layout(constant_id = 4) const uint FN = 1;     /* 16-column matrices per subgroup: 1 or 2 */
layout(constant_id = 5) const uint SPLIT = 1;  /* (1: one f16 term of a) */
layout(constant_id = 6) const uint BK = 64;    /* K step: 16, 32, 64 or 128 */
layout(constant_id = 7) const uint DEPTH = 2;  /* steps of weight matrices in flight: 1 .. 4 */
layout(constant_id = 8) const uint RAW = 1;    /* (1: raw tiles) */
layout(constant_id = 9) const uint KA = KA_DEFAULT; /* K of the activation chunk, a multiple of BK */
/* 1: the next chunk is loaded into registers during the current one; 0:
 * the host promises one chunk a slice (k_split <= KA) */
layout(constant_id = 10) const uint APF = APF_DEFAULT;

const uint NSG = WG / 32u;
const uint BM = 16u * FM, SN = 16u * FN, BN = SN * NSG;
const uint KF = BK / 16u;         /* K matrices a step */
const uint AV = KA / 8u;          /* uvec4s (8 bf16) of one activation row's chunk */
const uint LA = AV + 1u;          /* ... padded: rows on distinct bank groups */
const uint NAV = BM * AV;         /* uvec4s of a chunk */
const uint NA = (NAV + WG - 1u) / WG;

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) readonly buffer A { uvec4 ah[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform P {
    uint m, n, k;
    uint hi_off, lo_off; /* uvec4s of binding 1 (lo: unused) */
    uint w_off;          /* uvec4s */
    uint o_off;          /* floats */
    uint e_off;          /* (unused: sum_slices_cm.comp scales) */
    uint tiles_m, tiles_mn;
    uint k_split;        /* K per slice, a multiple of BK */
    uint slice_stride;   /* floats between two slices' partial tiles */
    uint n_groups;       /* tiles_mn * slices */
    uint ldp;            /* floats per row of the padded partial buffer */
} p;

#ifndef PROBE
#define PROBE 0
#endif
shared uvec4 sa[PROBE != 0 ? 1u : BM * LA]; /* the chunk's rows, bf16 */

/* Two f16 in a word to two bf16, each rounded to nearest, ties to even
 * (every f16 is finite here: cm_split.comp scales rows into range). */
uint f16x2_to_bf16x2(uint x)
{
    vec2 f = unpackHalf2x16(x);
    uvec2 u = floatBitsToUint(f);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return u.x | u.y << 16;
}

/* -DKCONST=K: the weights' row length as a literal (timing: whether a
 * known stride changes the loads); the shader then takes only that K */
#ifdef KCONST
#define WK uint(KCONST)
#else
#define WK p.k
#endif
/* the B matrices of step st (K matrices kk, column blocks jj) into F:
 * element offset of column c, K index k0: (c K + k0) / 8 uvec4s, stride
 * K / 8 */
#define FETCH(F, st)                                                                              \
    {                                                                                             \
        uint k0_ = k_begin + (st) * BK;                                                           \
        [[unroll]] for (uint kk = 0u; kk < KF; kk++)                                              \
            [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                          \
                LOAD_W(F[kk * FN + jj], w, p.w_off + (cb[jj] * WK + k0_ + 16u * kk) / 8u,         \
                       WK / 8u);                                                                  \
    }

/* Step j with matrix set F: a new activation chunk first where one starts
 * (workgroup barriers: uniform control flow, j is uniform), the
 * multiply-adds of the step, then the loads of step j + DEPTH into F. */
#define STEP(j, F)                                                                                \
    {                                                                                             \
        uint jc_ = (j) % spc;                                                                     \
        if (jc_ == 0u) {                                                                          \
            barrier();                                                                            \
            [[unroll]] for (uint i = 0u; i < NA; i++) {                                           \
                uint e_ = l + i * WG;                                                             \
                if (e_ < NAV)                                                                     \
                    sa[(e_ / AV) * LA + e_ % AV] = ra[i];                                         \
            }                                                                                     \
            barrier();                                                                            \
            if (APF != 0u && (j) + spc < ns)                                                      \
                fetch_chunk(ra, k_begin + ((j) + spc) * BK, k_end, l, m0);                        \
        }                                                                                         \
        [[unroll]] for (uint kk = 0u; kk < KF; kk++) {                                            \
            uint ac_ = jc_ * (BK / 8u) + 2u * kk;                                                 \
            [[unroll]] for (uint i = 0u; i < FM; i++) {                                           \
                CM_X ma;                                                                          \
                LOAD_X(ma, sa, 16u * i * LA + ac_, LA);                                           \
                [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                      \
                    acc[i * FN + jj] = MMA_WX(F[kk * FN + jj], ma, acc[i * FN + jj]);             \
            }                                                                                     \
        }                                                                                         \
        if ((j) + DEPTH < ns)                                                                     \
            FETCH(F, (j) + DEPTH)                                                                 \
    }

/* This invocation's share of the activations of rows [m0, m0 + BM), K
 * [kc, kc + KA), as bf16, into registers r (zeros past M and past k_end);
 * STEP stores them to sa at the chunk's first step. */
void fetch_chunk(inout uvec4 r[NA], uint kc, uint k_end, uint l, uint m0)
{
    [[unroll]] for (uint i = 0u; i < NA; i++) {
        uint e = l + i * WG, row = m0 + e / AV, gk = kc + 8u * (e % AV);
        uvec4 h = e < NAV && row < p.m && gk < k_end ? ah[p.hi_off + (row * p.k + gk) / 8u]
                                                      : uvec4(0u);
        r[i] = uvec4(f16x2_to_bf16x2(h.x), f16x2_to_bf16x2(h.y), f16x2_to_bf16x2(h.z),
                     f16x2_to_bf16x2(h.w));
    }
}

/* accumulator matrix q (row block q / FN, column block q % FN) to its
 * place in the slice's padded tile grid; a literal q (matmul_cm.comp's
 * EMIT says why) */
#define RAW_EMIT(q)                                                                               \
    if ((q) < FM * FN)                                                                            \
        STORE_C(acc[q], o,   base + 16u * ((q) / FN) * p.ldp + c0 + 16u * ((q) % FN), p.ldp);

void main()
{
    /* the host splits large grids over x and y */
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.n_groups)
        return;
    uint s = g / p.tiles_mn, t = g % p.tiles_mn;
    uint n0 = (t / p.tiles_m) * BN, m0 = (t % p.tiles_m) * BM;
    uint k_begin = s * p.k_split, k_end = min(p.k, k_begin + p.k_split);
    uint l = gl_LocalInvocationID.x, sg = l / 32u;
    uint c0 = n0 + sg * SN; /* this subgroup's first column */
    /* its column blocks' first weight rows, clamped to the last block of N */
    uint cb[FN];
    [[unroll]] for (uint jj = 0u; jj < FN; jj++)
        cb[jj] = min(c0 + 16u * jj, p.n - 16u);
    uint ns = k_end > k_begin ? (k_end - k_begin) / BK : 0u;
    uint spc = KA / BK; /* steps a chunk */

    CM_C acc[FM * FN];
    [[unroll]] for (uint i = 0u; i < FM * FN; i++)
        acc[i] = CM_C(0.0);

    CM_W f0[KF * FN], f1[KF * FN], f2[KF * FN], f3[KF * FN];
    uvec4 ra[NA];
#if PROBE
    /* the weight stream and its multiply-adds alone (timing probe) */
    CM_X one = CM_X(bfloat16_t(1.0));
#undef STEP
#define STEP(j, F)                                                                                \
    {                                                                                             \
        [[unroll]] for (uint kk = 0u; kk < KF; kk++)                                              \
            [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                          \
                acc[jj] = MMA_WX(F[kk * FN + jj], one, acc[jj]);                                  \
        if ((j) + DEPTH < ns)                                                                     \
            FETCH(F, (j) + DEPTH)                                                                 \
    }
#endif
    if (ns > 0u)
        FETCH(f0, 0u)
    if (DEPTH >= 2u && ns > 1u)
        FETCH(f1, 1u)
    if (DEPTH >= 3u && ns > 2u)
        FETCH(f2, 2u)
    if (DEPTH >= 4u && ns > 3u)
        FETCH(f3, 3u)
#if !PROBE
    fetch_chunk(ra, k_begin, k_end, l, m0);
#endif
    for (uint j = 0u; j < ns; j += DEPTH) {
        STEP(j, f0)
        if (DEPTH >= 2u && j + 1u < ns)
            STEP(j + 1u, f1)
        if (DEPTH >= 3u && j + 2u < ns)
            STEP(j + 2u, f2)
        if (DEPTH >= 4u && j + 3u < ns)
            STEP(j + 3u, f3)
    }

    uint base = p.o_off + s * p.slice_stride + m0 * p.ldp;
    RAW_EMIT(0u) RAW_EMIT(1u) RAW_EMIT(2u) RAW_EMIT(3u)
    RAW_EMIT(4u) RAW_EMIT(5u) RAW_EMIT(6u) RAW_EMIT(7u)
}

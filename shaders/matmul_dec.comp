#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
/* The decode GEMM of 9-64 rows: out[M, N] = a[M, K] · w[N, K]ᵀ on tensor
 * cores (16 x 16 x 16 cooperative matrices, f16 A and B, f32
 * accumulators), built to stream the weights, the only large operand at
 * these sizes, near copy bandwidth.
 *
 * a comes as cm_split.comp wrote it (matmul_cm.comp's input: per row r an
 * exponent e_r and f16 terms hi, and lo with SPLIT 2, a[r, k] = 2^e_r (hi
 * + lo)); w is bf16 (converted to f16 in registers: bf16x2_to_f16x2, exact
 * for |w| in [2^-14, 65504]) or f16. The output is matmul_cm.comp's raw
 * epilogue (RAW 1): each split-K slice stores its unscaled accumulators
 * into whole tiles of a padded partial buffer (ldp floats a row), and
 * sum_slices_cm.comp adds the slices in slice order and scales row r by
 * 2^e_r; so the results are those of matmul_cm's decode plans up to the
 * order of the f32 additions inside a slice.
 *
 * How it differs from matmul_cm.comp's decode plans (whose workgroup
 * walks K in lock step, a workgroup barrier at each 64-wide step, the
 * weights of all 8 subgroups staged through one shared slice): here each
 * subgroup streams its own 16 FN weight columns with 16-byte loads issued
 * DEPTH K steps ahead into registers, converts them, and stages them
 * through a shared area of its own under subgroup-scope barriers only; the
 * activations' terms of a K chunk of KA (for 9-16 rows: the whole slice)
 * sit in shared memory, stored by the workgroup behind two workgroup
 * barriers a chunk from registers loaded one chunk ahead (APF), so that
 * no step waits for a global load of the activations. So the weight loads
 * in flight do not wait for other subgroups, and several workgroups fit
 * an SM (bytes in flight: DEPTH x 16 FN x BK x 2 per subgroup). Design by
 * bytes in flight after Little's law (latency x bandwidth); the warp-level
 * tiling after CUTLASS's description. -DPROBE=1 (tools/vk_cm_bench only)
 * keeps the weight stream and drops everything else: its ceiling.
 *
 * Speed (H200, driver 580; docs/benchmarks.md, "A decode GEMM that streams
 * the weights"): 16 x 14336 x 4096 fast 0.053 ms against matmul_cm's
 * 0.056 (its loads alone: 0.030), 9B tg128 batch 16 fast 12.73 against
 * 13.12 ms; slower at 64 rows (0.081 against 0.068) and in precise mode.
 * Both GEMMs are held by the weight bytes in flight an SM, which here
 * live in registers; the L2 prefetch below (PFD) keeps more of them in
 * flight at one register per 32 bytes: 0.0454 ms at 16 x 14336 x 4096
 * fast, 9B tg128 batch 16 fast 11.41 ms against the old plans' 13.08
 * ("Vulkan decode GEMM: the weights into L2 ahead of the stream"), and
 * in precise mode with 64-byte segments 0.0540 against 0.0569 ("Vulkan
 * decode GEMM at 64 rows: row tiles"), so the host runs this with the
 * prefetch at 9-16 rows by default ($LLMEM_VULKAN_DEC, vk_dec_used), the
 * old plans elsewhere.
 *
 * Blocking: a workgroup of WG = 32 NSG invocations owns a BM x BN tile of
 * out (BM = 16 FM rows, BN = 16 FN NSG); K is split into slices of
 * k_split (host: vk_dec_plan_make). BM is all rows of a decode step, or
 * (tiles_m > 1, the host's VK_DEC_ROWS) a part of them: the tiles_m
 * workgroups of one column tile are neighbours in the grid, so they run
 * together and all but the first read the same weights from L2, each with
 * fewer registers for its accumulators and activations (64 rows as two
 * 32-row tiles: docs/benchmarks.md, "Vulkan decode GEMM at 64 rows: row
 * tiles"). Needs K % 8 == 0 and 16-byte aligned operands.
 *
 * One source for two modules like matmul_cm.comp: GL_NV_cooperative_matrix
 * (compiled at build time) and, with -DKHR, GL_KHR_cooperative_matrix
 * (shaders/khr/matmul_dec.spv, shaders/khr/update.sh). Self-contained (no
 * includes), so that the recorded hash covers this file alone.
 * With -DKHR -DBF16=1 (glslang 16: GL_EXT_bfloat16; shaders/khr/matmul_dec_bf.spv,
 * $LLMEM_VULKAN_BF16, vk_bf16_used: fast mode, bf16 weights only) the A
 * and B matrices are bf16: the weights are staged as they are (W_CVT) and
 * each f16 term of a is rounded to bf16 (A_CVT) on its way into shared
 * memory; docs/benchmarks.md, "Vulkan decode GEMM on bf16 cooperative
 * matrices". */
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
#define DT_BF16 2u

#ifndef BF16
#define BF16 0
#endif
#ifdef KHR
#extension GL_KHR_cooperative_matrix : require
#if BF16
#extension GL_EXT_bfloat16 : require
#define CM_A coopmat<bfloat16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define CM_B coopmat<bfloat16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#else
#define CM_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define CM_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#endif
#define CM_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROW(m_, a_, o_, s_) coopMatLoad(m_, a_, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COL(m_, a_, o_, s_) coopMatLoad(m_, a_, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROW(m_, a_, o_, s_) coopMatStore(m_, a_, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define MMA coopMatMulAdd
#else
#extension GL_NV_cooperative_matrix : require
#define CM_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define CM_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define CM_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_ROW(m_, a_, o_, s_) coopMatLoadNV(m_, a_, o_, s_, false)
#define LOAD_COL(m_, a_, o_, s_) coopMatLoadNV(m_, a_, o_, s_, true)
#define STORE_ROW(m_, a_, o_, s_) coopMatStoreNV(m_, a_, o_, s_, false)
#define MMA coopMatMulAddNV
#endif

#ifndef KA_DEFAULT
#define KA_DEFAULT 512
#endif
/* ids 1-8 as matmul_cm.comp's (SGM is 1 here, RAW 1 only), then KA */
layout(constant_id = 1) const uint W_DT = 2;   /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint SGM = 1;    /* (1: the rows are one tile) */
layout(constant_id = 3) const uint FM = 1;     /* 16-row matrices: ceil(M / 16) */
layout(constant_id = 4) const uint FN = 1;     /* 16-column matrices per subgroup */
layout(constant_id = 5) const uint SPLIT = 1;  /* f16 terms of a: 2 precise, 1 fast */
layout(constant_id = 6) const uint BK = 64;    /* K step of the weight stream: 32, 64 or 128 */
layout(constant_id = 7) const uint DEPTH = 3;  /* weight steps in flight: 1 .. 3 */
layout(constant_id = 8) const uint RAW = 1;    /* (1: raw tiles) */
layout(constant_id = 9) const uint KA = KA_DEFAULT; /* K of the activation chunk in shared memory */
#ifndef APF_DEFAULT
#define APF_DEFAULT 1
#endif
/* 1: the next chunk's terms are loaded into registers during the current
 * chunk; 0: the host promises one chunk a slice (k_split <= KA), so none
 * is (and their registers are free after the first step) */
layout(constant_id = 10) const uint APF = APF_DEFAULT;
/* L2 prefetch of the weights (PFD > 0; the host's VK_DEC_PF_*): at each
 * step j with j % PFL == 0 (uniform) every subgroup issues one 4-byte
 * load per PFS-byte segment of its SN weight rows for steps [j + PFD, j +
 * PFD + PFL) into registers pt, and folds the previous burst's into px
 * there, PFL steps after issuing it; px feeds a store that never runs
 * (p.m == 0 is never dispatched), so the loads stay and change nothing
 * else. They bring the weights into L2 (and L1) ahead of the 16-byte
 * loads of FETCH, which then wait for L2 instead of HBM: the weight
 * bytes in flight that the stream needs (Little's law) are held at 4
 * bytes of register per PFS bytes instead of 16 per 16. After vkl2's
 * PF in norm_matvec16_rows.comp, here inside one product.
 * -DPF_ATOMIC=1 (tools/vk_cm_bench only, measured slower): atomicAdd(..,
 * 0) instead, whose result is unused (no register, nothing to wait for;
 * it writes the weights' own bits back). */
#ifndef PFD_DEFAULT
#define PFD_DEFAULT 0
#endif
#ifndef PFL_DEFAULT
#define PFL_DEFAULT 2
#endif
#ifndef PFS_DEFAULT
#define PFS_DEFAULT 32
#endif
#ifndef PF_ATOMIC
#define PF_ATOMIC 0
#endif
/* PFD | PFL << 8 | PFS << 16 in one constant: the host's pipelines take 12 */
layout(constant_id = 11) const uint PFC = PFD_DEFAULT | PFL_DEFAULT << 8 | PFS_DEFAULT << 16;
const uint PFD = PFC & 0xffu;         /* steps ahead; 0 off */
const uint PFL = (PFC >> 8) & 0xffu;  /* steps a burst (and its lag), 1 or more */
const uint PFS = PFC >> 16;           /* bytes a touched segment: 16 .. 2 BK, 2^k */

const uint NSG = WG / 32u;
const uint BM = 16u * FM, SN = 16u * FN, BN = SN * NSG;
const uint RV = BK / 8u;          /* uvec4s of one weight row's step */
const uint LW = RV + 1u;          /* ... padded: rows on distinct bank groups */
const uint NW = SN * RV / 32u;    /* weight loads per lane and step */
const uint AV = KA / 8u;          /* uvec4s of one activation row's chunk */
const uint LA = AV + 1u;
const uint NAV = SPLIT * BM * AV; /* uvec4s of a chunk */
const uint NA = (NAV + WG - 1u) / WG;
const uint PSR = PFD == 0u ? 1u : 2u * BK / PFS;        /* segments of a row's step */
const uint NPE = SN * PSR * PFL;                         /* segments a subgroup's burst */
const uint NPT = PFD == 0u ? 1u : (NPE + 31u) / 32u;     /* loads per lane */

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) readonly buffer A { uvec4 ah[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
#if PF_ATOMIC
layout(binding = 0) buffer WA { uint wa[]; };
#endif

layout(push_constant) uniform P {
    uint m, n, k;
    uint hi_off, lo_off; /* uvec4s of binding 1 */
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
/* -DWG_SYNC=1 (tools/vk_cm_bench only): a workgroup barrier where the
 * staging takes a subgroup-scope one; 2-14% slower on the H200, so the
 * subgroup barrier does not wait for more than a workgroup one would
 * (docs/benchmarks.md, "A warp-specialized decode GEMM") */
#ifndef WG_SYNC
#define WG_SYNC 0
#endif
#if WG_SYNC
#define STAGE_SYNC() barrier()
#else
#define STAGE_SYNC()                                                                              \
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,                 \
                   gl_SemanticsAcquireRelease)
#endif
shared uvec4 sa[PROBE != 0 ? 1u : SPLIT * BM * LA]; /* the chunk's hi, lo rows */
shared uvec4 sw[PROBE != 0 ? 1u : NSG * SN * LW]; /* each subgroup's staged weights, f16 */

/* Two bf16 in a word to two f16 (matmul_cm.comp's conversion). */
uint bf16x2_to_f16x2(uint x)
{
    return packHalf2x16(vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u)));
}

/* The terms of a (f16) and the weights (W_DT) as the matrices take them.
 * BF16 0: a as is, bf16 weights converted to f16 (above). BF16 1 (the
 * fast-mode module on bf16 matrices, matmul_dec_bf; SPLIT 1 and bf16
 * weights only): the weights as is, each f16 term rounded to bf16 (to
 * nearest, ties to even: every f16 is exact in f32 and finite here). */
uint f16x2_to_bf16x2(uint x)
{
    uvec2 u = floatBitsToUint(unpackHalf2x16(x));
    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return u.x | u.y << 16;
}
uvec4 W_CVT(uvec4 u)
{
    if (BF16 != 0 || W_DT != DT_BF16)
        return u;
    return uvec4(bf16x2_to_f16x2(u.x), bf16x2_to_f16x2(u.y), bf16x2_to_f16x2(u.z),
                 bf16x2_to_f16x2(u.w));
}
uvec4 A_CVT(uvec4 u)
{
    if (BF16 == 0)
        return u;
    return uvec4(f16x2_to_bf16x2(u.x), f16x2_to_bf16x2(u.y), f16x2_to_bf16x2(u.z),
                 f16x2_to_bf16x2(u.w));
}

/* the weights of step st of this subgroup's columns into registers R (zeros
 * outside [0, N) and past k_end) */
#define FETCH(R, st)                                                                              \
    {                                                                                             \
        uint k0_ = k_begin + (st) * BK;                                                           \
        [[unroll]] for (uint i = 0u; i < NW; i++) {                                               \
            uint e_ = lane + 32u * i, gn_ = c0 + e_ / RV, gk_ = k0_ + 8u * (e_ % RV);             \
            R[i] = gn_ < p.n && gk_ < k_end ? w[p.w_off + (gn_ * p.k + gk_) / 8u] : uvec4(0u);    \
        }                                                                                         \
    }

/* the L2 prefetch burst of step j (uniform; see PFD) */
#if PF_ATOMIC
#define PF_TOUCH(i_, a_) atomicAdd(wa[4u * (a_)], 0u)
#else
#define PF_TOUCH(i_, a_) pt[i_] = w[a_].x
#endif
#define PF_BURST(j)                                                                               \
    if (PFD != 0u && (j) % PFL == 0u) {                                                           \
        [[unroll]] for (uint i = 0u; i < NPT; i++)                                                \
            px ^= pt[i];                                                                          \
        uint k0_ = k_begin + ((j) + PFD) * BK;                                                    \
        [[unroll]] for (uint i = 0u; i < NPT; i++) {                                              \
            uint e_ = lane + 32u * i, gn_ = c0 + e_ / (PSR * PFL);                                \
            uint gk_ = k0_ + (e_ % (PSR * PFL)) * (PFS / 2u);                                     \
            if (e_ < NPE && gn_ < p.n && gk_ < k_end)                                             \
                PF_TOUCH(i, p.w_off + (gn_ * p.k + gk_) / 8u);                                    \
        }                                                                                         \
    }

/* Step j with register set R: a new activation chunk first where one
 * starts (workgroup barriers: uniform control flow, j is uniform), R to
 * the subgroup's staging area, the loads of step j + DEPTH into R, then
 * the tensor-core work of the step. */
#define STEP(j, R)                                                                                \
    {                                                                                             \
        PF_BURST(j)                                                                               \
        uint jc_ = (j) % spc;                                                                     \
        if (jc_ == 0u) {                                                                          \
            barrier();                                                                            \
            [[unroll]] for (uint i = 0u; i < NA; i++) {                                           \
                uint e_ = l + i * WG;                                                             \
                if (e_ < NAV)                                                                     \
                    sa[(e_ / AV) * LA + e_ % AV] = A_CVT(ra[i]);                                  \
            }                                                                                     \
            barrier();                                                                            \
            if (APF != 0u && (j) + spc < ns)                                                      \
                fetch_chunk(ra, k_begin + ((j) + spc) * BK, k_end, l, m0);                        \
        }                                                                                         \
        [[unroll]] for (uint i = 0u; i < NW; i++) {                                               \
            uint e_ = lane + 32u * i;                                                             \
            sw[sb + (e_ / RV) * LW + e_ % RV] = W_CVT(R[i]);                                      \
        }                                                                                         \
        STAGE_SYNC();                                                                             \
        if ((j) + DEPTH < ns)                                                                     \
            FETCH(R, (j) + DEPTH)                                                                 \
        [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {                                      \
            CM_B mb[FN];                                                                          \
            [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                          \
                LOAD_COL(mb[jj], sw, sb + 16u * jj * LW + 2u * kk, LW);                           \
            uint ac_ = jc_ * RV + 2u * kk;                                                        \
            [[unroll]] for (uint i = 0u; i < FM; i++) {                                           \
                CM_A ma;                                                                          \
                LOAD_ROW(ma, sa, 16u * i * LA + ac_, LA);                                         \
                [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                      \
                    acc[i * FN + jj] = MMA(ma, mb[jj], acc[i * FN + jj]);                         \
                if (SPLIT == 2u) {                                                                \
                    LOAD_ROW(ma, sa, (BM + 16u * i) * LA + ac_, LA);                              \
                    [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                  \
                        acc[i * FN + jj] = MMA(ma, mb[jj], acc[i * FN + jj]);                     \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        STAGE_SYNC();                                                                             \
    }

/* This invocation's share of the activations' terms of rows [m0, m0 +
 * BM), K [kc, kc + KA) into registers r (zeros past M and past k_end);
 * STEP stores them to sa at the chunk's first step. */
void fetch_chunk(inout uvec4 r[NA], uint kc, uint k_end, uint l, uint m0)
{
    [[unroll]] for (uint i = 0u; i < NA; i++) {
        uint e = l + i * WG, t = e / (BM * AV), row = m0 + (e / AV) % BM, gk = kc + 8u * (e % AV);
        r[i] = e < NAV && row < p.m && gk < k_end
                   ? ah[(t == 0u ? p.hi_off : p.lo_off) + (row * p.k + gk) / 8u]
                   : uvec4(0u);
    }
}

/* accumulator matrix q (row block q / FN, column block q % FN) to its
 * place in the slice's padded tile grid; a literal q (matmul_cm.comp's
 * EMIT says why) */
#define RAW_EMIT(q)                                                                               \
    if ((q) < FM * FN)                                                                            \
        STORE_ROW(acc[q], o, base + 16u * ((q) / FN) * p.ldp + c0 + 16u * ((q) % FN), p.ldp);

void main()
{
    /* the host splits large grids over x and y */
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.n_groups)
        return;
    uint s = g / p.tiles_mn, t = g % p.tiles_mn;
    uint n0 = (t / p.tiles_m) * BN, m0 = (t % p.tiles_m) * BM;
    uint k_begin = s * p.k_split, k_end = min(p.k, k_begin + p.k_split);
    uint l = gl_LocalInvocationID.x, sg = l / 32u, lane = l % 32u;
    uint c0 = n0 + sg * SN;   /* this subgroup's first column */
    uint sb = sg * SN * LW;   /* its staging area */
    uint ns = k_end > k_begin ? (k_end - k_begin + BK - 1u) / BK : 0u;
    uint spc = KA / BK;       /* steps a chunk */

    CM_C acc[FM * FN];
    [[unroll]] for (uint i = 0u; i < FM * FN; i++)
        acc[i] = CM_C(0.0);

    uvec4 r0[NW], r1[NW], r2[NW], ra[NA];
    uint px = 0u, pt[NPT];
    [[unroll]] for (uint i = 0u; i < NPT; i++)
        pt[i] = 0u;
#if PROBE
    /* the weight stream alone (timing probe: no product) */
    uvec4 qx = uvec4(0u);
#undef STEP
#define STEP(j, R)                                                                                \
    {                                                                                             \
        [[unroll]] for (uint i = 0u; i < NW; i++)                                                 \
            qx ^= R[i];                                                                           \
        if ((j) + DEPTH < ns)                                                                     \
            FETCH(R, (j) + DEPTH)                                                                 \
    }
#endif
    FETCH(r0, 0u)
    if (DEPTH >= 2u)
        FETCH(r1, 1u)
    if (DEPTH >= 3u)
        FETCH(r2, 2u)
#if !PROBE
    fetch_chunk(ra, k_begin, k_end, l, m0);
#endif
    for (uint j = 0u; j < ns; j += DEPTH) {
        STEP(j, r0)
        if (DEPTH >= 2u && j + 1u < ns)
            STEP(j + 1u, r1)
        if (DEPTH >= 3u && j + 2u < ns)
            STEP(j + 2u, r2)
    }

#if PROBE
    if (qx.x == 0x9e3779b9u && qx.y == 0x7f4a7c15u)
        o[p.o_off] = 1.0;
    return;
#endif
    /* keeps the prefetch loads: a store that never runs (p.m == 0 is never dispatched) */
    if (PFD != 0u) {
        [[unroll]] for (uint i = 0u; i < NPT; i++)
            px ^= pt[i];
        if (px == 0x9e3779b9u && p.m == 0u)
            o[p.o_off] = 0.0;
    }
    uint base = p.o_off + s * p.slice_stride + m0 * p.ldp;
    RAW_EMIT(0u) RAW_EMIT(1u) RAW_EMIT(2u) RAW_EMIT(3u)
    RAW_EMIT(4u) RAW_EMIT(5u) RAW_EMIT(6u) RAW_EMIT(7u)
}

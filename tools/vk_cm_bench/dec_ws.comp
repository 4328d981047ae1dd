#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
/* A warp-specialized variant of shaders/matmul_dec.comp (tools/vk_cm_bench
 * only; docs/benchmarks.md, "A warp-specialized decode GEMM"): the decode
 * GEMM of 9-64 rows, out[M, N] = a[M, K] · w[N, K]ᵀ, with the same inputs,
 * outputs and raw split-K tiles as matmul_dec.comp (read its head comment),
 * but the two jobs of its subgroups split between subgroups:
 *
 * - NP producer subgroups only stream the weights: each lane keeps DEPTH
 *   K steps of 16-byte loads in flight in registers (no accumulators, no
 *   fragments: few other registers), converts a step's bf16 to f16 and
 *   stores it into one of two shared stages (a ring of 2);
 * - NC = WG / 32 - NP consumer subgroups only do the tensor-core work:
 *   each owns 16 CFN columns of the BN-wide tile (CFN = BN / 16 / NC) and
 *   multiplies the stage the producers filled in the previous iteration
 *   with the activations' terms of a K chunk of KA in shared memory.
 *
 * One workgroup barrier an iteration (a K step of BK) hands a stage from
 * the producers to the consumers and back; at the first step of each
 * activation chunk after the first, the workgroup stores the chunk, loaded
 * into registers one chunk ahead, behind one more barrier. So the weight
 * bytes in flight a workgroup are DEPTH x BN x BK x 2 and live in the
 * producers' registers only, where matmul_dec.comp holds them in the
 * registers of the subgroups that also hold accumulators and fragments
 * (its register count capped the bytes in flight an SM: docs/benchmarks.md,
 * "A decode GEMM that streams the weights"). The split after the
 * producer / consumer warp specialization CUTLASS describes for Hopper
 * GEMMs (there with TMA and mbarriers, here with plain loads and barriers).
 *
 * Blocking: a workgroup of WG = 32 NSG invocations owns a BM x BN tile of
 * out, BM = 16 FM, BN = 16 FN NSG (matmul_dec.comp's and the harness's
 * formula; FN only sizes the tile); needs (16 FN NSG) % (16 NC) == 0, KA a
 * multiple of BK, K % 8 == 0, 16-byte aligned operands, DEPTH 1-4.
 * -DEMU=1: the consumers' products in scalar f32 arithmetic (no
 * cooperative matrices), to check the indexing on devices without them
 * (lavapipe: right with one loop, wrong sums with -DSEP=1, whose role
 * loops' barriers lavapipe does not pair as the H200 does).
 *
 * Measured (H200, driver 580, docs/benchmarks.md): err 0 against float64
 * in every entry, but no faster than matmul_cm.comp's and matmul_dec.comp's
 * plans: 16 x 14336 x 4096 fast, best -DSEP=1 0.0562 ms against 0.0527
 * (matmul_dec) and 0.0564 (matmul_cm); one loop 0.0635 (150 registers:
 * both roles' values live at once); -DFLAGS=1 0.0685 at best. */
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
#define DT_BF16 2u

#ifndef EMU
#define EMU 0
#endif
#if !EMU
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_cooperative_matrix : require
#define CM_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define CM_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define CM_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROW(m_, a_, o_, s_) coopMatLoad(m_, a_, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COL(m_, a_, o_, s_) coopMatLoad(m_, a_, o_, s_, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROW(m_, a_, o_, s_) coopMatStore(m_, a_, o_, s_, gl_CooperativeMatrixLayoutRowMajor)
#define MMA coopMatMulAdd
#endif

#ifndef KA_DEFAULT
#define KA_DEFAULT 256
#endif
#ifndef NP_DEFAULT
#define NP_DEFAULT 4
#endif
layout(constant_id = 1) const uint W_DT = 2;   /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint SGM = 1;    /* (1: the rows are one tile) */
layout(constant_id = 3) const uint FM = 1;     /* 16-row matrices: ceil(M / 16) */
layout(constant_id = 4) const uint FN = 1;     /* BN = 16 FN (WG / 32) */
layout(constant_id = 5) const uint SPLIT = 1;  /* f16 terms of a: 2 precise, 1 fast */
layout(constant_id = 6) const uint BK = 64;    /* K step: 32, 64 or 128 */
layout(constant_id = 7) const uint DEPTH = 2;  /* weight steps in flight a producer: 1 .. 4 */
layout(constant_id = 8) const uint RAW = 1;    /* (1: raw tiles) */
layout(constant_id = 9) const uint NP = NP_DEFAULT;  /* producer subgroups */
layout(constant_id = 10) const uint KA = KA_DEFAULT; /* K of the activation chunk */

const uint NSG = WG / 32u, NC = NSG - NP;
const uint BM = 16u * FM, BN = 16u * FN * NSG;
const uint CFN = BN / 16u / NC;    /* 16-column matrices a consumer */
const uint RV = BK / 8u;           /* uvec4s of one weight row's step */
const uint LW = RV + 1u;           /* ... padded */
const uint NWT = BN * RV;          /* uvec4s of a stage */
const uint PL = 32u * NP;          /* producer lanes */
const uint NWP = (NWT + PL - 1u) / PL; /* weight loads a producer lane and step */
const uint AV = KA / 8u;
const uint LA = AV + 1u;
const uint NAV = SPLIT * BM * AV;
/* -DFLAGS=1 (implies SEP): a ring of NSTAGE stages handed over by counters
 * in shared memory instead of workgroup barriers: a producer subgroup
 * waits until every consumer released the stage's previous use (empty),
 * stores its share and counts it in full; a consumer waits until every
 * producer stored (full), multiplies and counts the stage in empty. So
 * producers run up to NSTAGE steps ahead of the consumers. One activation
 * chunk a slice only (k_split <= KA); spins give up after SPIN_MAX polls
 * (wrong sums rather than a hang). */
#ifndef FLAGS
#define FLAGS 0
#endif
#if FLAGS
#undef SEP
#define SEP 1
#endif
#ifndef NSTAGE
#define NSTAGE 3
#endif
#define SPIN_MAX 65536u
#ifndef SEP
#define SEP 0
#endif
/* activation loader lanes: the workgroup, or with SEP the consumers only */
const uint AL = SEP != 0 ? 32u * NC : WG;
const uint NA = (NAV + AL - 1u) / AL;

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) readonly buffer A { uvec4 ah[]; };
layout(binding = 2) writeonly buffer O { float o[]; };

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

shared uvec4 sa[SPLIT * BM * LA];  /* the chunk's hi, lo rows */
const uint RING = FLAGS != 0 ? NSTAGE : 2u;
shared uvec4 sw[RING * BN * LW];   /* the ring: RING stages of BN weight rows, f16 */
shared uint full_c[RING], empty_c[RING];

uint bf16x2_to_f16x2(uint x)
{
    return packHalf2x16(vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u)));
}

/* producer: the weights of step st into registers R (zeros outside [0, N)
 * and past k_end) */
#define FETCH(R, st)                                                                              \
    {                                                                                             \
        uint k0_ = k_begin + (st) * BK;                                                           \
        [[unroll]] for (uint i = 0u; i < NWP; i++) {                                              \
            uint e_ = pl + PL * i, gn_ = n0 + e_ / RV, gk_ = k0_ + 8u * (e_ % RV);                \
            R[i] = e_ < NWT && gn_ < p.n && gk_ < k_end ? w[p.w_off + (gn_ * p.k + gk_) / 8u]     \
                                                        : uvec4(0u);                              \
        }                                                                                         \
    }

/* this invocation's share of the terms of rows [0, BM), K [kc, kc + KA) */
void fetch_chunk(inout uvec4 r[NA], uint kc, uint k_end, uint l)
{
    [[unroll]] for (uint i = 0u; i < NA; i++) {
        uint e = l + i * AL, t = e / (BM * AV), row = (e / AV) % BM, gk = kc + 8u * (e % AV);
        r[i] = e < NAV && row < p.m && gk < k_end
                   ? ah[(t == 0u ? p.hi_off : p.lo_off) + (row * p.k + gk) / 8u]
                   : uvec4(0u);
    }
}

#if EMU
/* element e (f16) of row-padded uvec4 storage */
float sh_half(uint base_u4, uint e, bool weights)
{
    uvec4 u = weights ? sw[base_u4 + e / 8u] : sa[base_u4 + e / 8u];
    uint word = u[(e / 2u) % 4u];
    return unpackHalf2x16(word)[e % 2u];
}
#endif

/* Iteration t: at the first step of a chunk after the first, the chunk's
 * terms to sa (workgroup barrier: t is uniform); producers: step t from R
 * into stage t % 2, then the loads of step t + DEPTH into R; consumers:
 * the products of step t - 1 from stage (t - 1) % 2; a workgroup barrier.
 * -DSEP=1: producers and consumers each run a loop of their own (so that
 * the compiler sees their registers' live ranges apart), with the same
 * sequence of workgroup barriers; the consumers alone load and store the
 * activations. (Barriers in control flow that is uniform only per
 * subgroup: outside SPIR-V's rules, what CUTLASS's warp-specialized
 * kernels do with PTX's bar.sync; tools/vk_cm_bench only.) */
#define SWITCH_AT(t) ((t) >= 2u && ((t) - 1u) % spc == 0u)
#define CHUNK_SWITCH(t)                                                                           \
    {                                                                                             \
        [[unroll]] for (uint i = 0u; i < NA; i++) {                                               \
            uint e_ = al + i * AL;                                                                \
            if (e_ < NAV)                                                                         \
                sa[(e_ / AV) * LA + e_ % AV] = ra[i];                                             \
        }                                                                                         \
        barrier();                                                                                \
        if ((t) - 1u + spc < ns)                                                                  \
            fetch_chunk(ra, k_begin + ((t) - 1u + spc) * BK, k_end, al);                          \
    }
#define PROD_PART(t, R)                                                                           \
    if ((t) < ns) {                                                                               \
        uint sb_ = ((t) & 1u) * BN * LW;                                                          \
        [[unroll]] for (uint i = 0u; i < NWP; i++) {                                              \
            uint e_ = pl + PL * i;                                                                \
            uvec4 u_ = R[i];                                                                      \
            if (W_DT == DT_BF16)                                                                  \
                u_ = uvec4(bf16x2_to_f16x2(u_.x), bf16x2_to_f16x2(u_.y), bf16x2_to_f16x2(u_.z),   \
                           bf16x2_to_f16x2(u_.w));                                                \
            if (e_ < NWT)                                                                         \
                sw[sb_ + (e_ / RV) * LW + e_ % RV] = u_;                                          \
        }                                                                                         \
        if ((t) + DEPTH < ns)                                                                     \
            FETCH(R, (t) + DEPTH)                                                                 \
    }
#define CONS_PART(t)                                                                              \
    if ((t) >= 1u)                                                                                \
        compute((((t) - 1u) & 1u) * BN * LW + cs * 16u * CFN * LW, (((t) - 1u) % spc) * RV);
/* FLAGS: producer step t from R into stage t % RING once the consumers
 * released it, counted in full_c; then the loads of step t + DEPTH */
#define FSTEP_P(t, R)                                                                             \
    {                                                                                             \
        uint st_ = (t) % RING, it_ = 0u;                                                          \
        while (atomicLoad(empty_c[st_], gl_ScopeWorkgroup, gl_StorageSemanticsShared,             \
                          gl_SemanticsAcquire) < NC * ((t) / RING) && ++it_ < SPIN_MAX) {         \
        }                                                                                         \
        uint sb_ = st_ * BN * LW;                                                                 \
        [[unroll]] for (uint i = 0u; i < NWP; i++) {                                              \
            uint e_ = pl + PL * i;                                                                \
            uvec4 u_ = R[i];                                                                      \
            if (W_DT == DT_BF16)                                                                  \
                u_ = uvec4(bf16x2_to_f16x2(u_.x), bf16x2_to_f16x2(u_.y), bf16x2_to_f16x2(u_.z),   \
                           bf16x2_to_f16x2(u_.w));                                                \
            if (e_ < NWT)                                                                         \
                sw[sb_ + (e_ / RV) * LW + e_ % RV] = u_;                                          \
        }                                                                                         \
        controlBarrier(gl_ScopeSubgroup, gl_ScopeWorkgroup, gl_StorageSemanticsShared,            \
                       gl_SemanticsAcquireRelease);                                               \
        if (lane == 0u)                                                                           \
            atomicAdd(full_c[st_], 1u, gl_ScopeWorkgroup, gl_StorageSemanticsShared,              \
                      gl_SemanticsRelease);                                                       \
        if ((t) + DEPTH < ns)                                                                     \
            FETCH(R, (t) + DEPTH)                                                                 \
    }
#define IT(t, R)                                                                                  \
    {                                                                                             \
        if (SWITCH_AT(t))                                                                         \
            CHUNK_SWITCH(t)                                                                       \
        if (prod) {                                                                               \
            PROD_PART(t, R)                                                                       \
        } else {                                                                                  \
            CONS_PART(t)                                                                          \
        }                                                                                         \
        barrier();                                                                                \
    }
#define IT_P(t, R)                                                                                \
    {                                                                                             \
        if (SWITCH_AT(t))                                                                         \
            barrier();                                                                            \
        PROD_PART(t, R)                                                                           \
        barrier();                                                                                \
    }
#define IT_C(t)                                                                                   \
    {                                                                                             \
        if (SWITCH_AT(t))                                                                         \
            CHUNK_SWITCH(t)                                                                       \
        CONS_PART(t)                                                                              \
        barrier();                                                                                \
    }

#if EMU
float acc[FM * CFN * 8u]; /* lane's outputs q: element lane + 32 q of the BM x 16 CFN block */
uint lane_g;
void compute(uint rb, uint ac)
{
    [[unroll]] for (uint q = 0u; q < FM * CFN * 8u; q++) {
        uint idx = lane_g + 32u * q, r = idx / (16u * CFN), c = idx % (16u * CFN);
        float s = 0.0;
        for (uint kk = 0u; kk < BK; kk++) {
            float wv = sh_half(rb + c * LW, kk, true);
            float av = sh_half(r * LA + ac, kk, false);
            if (SPLIT == 2u)
                av += sh_half((BM + r) * LA + ac, kk, false);
            s += av * wv;
        }
        acc[q] += s;
    }
}
#else
CM_C acc[FM * CFN];
/* the products of one stage: rb its first uvec4 of this consumer's rows,
 * ac the step's first uvec4 in the chunk's rows */
void compute(uint rb, uint ac)
{
    [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {
        CM_B mb[CFN];
        [[unroll]] for (uint jj = 0u; jj < CFN; jj++)
            LOAD_COL(mb[jj], sw, rb + 16u * jj * LW + 2u * kk, LW);
        [[unroll]] for (uint i = 0u; i < FM; i++) {
            CM_A ma;
            LOAD_ROW(ma, sa, 16u * i * LA + ac + 2u * kk, LA);
            [[unroll]] for (uint jj = 0u; jj < CFN; jj++)
                acc[i * CFN + jj] = MMA(ma, mb[jj], acc[i * CFN + jj]);
            if (SPLIT == 2u) {
                LOAD_ROW(ma, sa, (BM + 16u * i) * LA + ac + 2u * kk, LA);
                [[unroll]] for (uint jj = 0u; jj < CFN; jj++)
                    acc[i * CFN + jj] = MMA(ma, mb[jj], acc[i * CFN + jj]);
            }
        }
    }
}
#endif

/* accumulator matrix q (row block q / CFN, column block q % CFN) to its
 * place in the slice's padded tile grid; a literal q */
#define RAW_EMIT(q)                                                                               \
    if ((q) < FM * CFN)                                                                           \
        STORE_ROW(acc[q], o, base + 16u * ((q) / CFN) * p.ldp + cc0 + 16u * ((q) % CFN), p.ldp);

void main()
{
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.n_groups)
        return;
    uint s = g / p.tiles_mn, t = g % p.tiles_mn;
    uint n0 = (t / p.tiles_m) * BN;
    uint k_begin = s * p.k_split, k_end = min(p.k, k_begin + p.k_split);
    uint l = gl_LocalInvocationID.x, sg = l / 32u, lane = l % 32u;
    bool prod = sg < NP;
    uint pl = l;                   /* producer lane (l < PL for producers) */
    uint cs = prod ? 0u : sg - NP; /* consumer index */
    uint cc0 = n0 + cs * 16u * CFN;
    uint al = SEP != 0 ? l - PL : l; /* activation loader lane (consumers with SEP) */
    uint ns = k_end > k_begin ? (k_end - k_begin + BK - 1u) / BK : 0u;
    uint spc = KA / BK;

#if EMU
    lane_g = lane;
    [[unroll]] for (uint i = 0u; i < FM * CFN * 8u; i++)
        acc[i] = 0.0;
#else
    [[unroll]] for (uint i = 0u; i < FM * CFN; i++)
        acc[i] = CM_C(0.0);
#endif

    uvec4 r0[NWP], r1[NWP], r2[NWP], r3[NWP], ra[NA];
    if (prod) {
        FETCH(r0, 0u)
        if (DEPTH >= 2u)
            FETCH(r1, 1u)
        if (DEPTH >= 3u)
            FETCH(r2, 2u)
        if (DEPTH >= 4u)
            FETCH(r3, 3u)
    }
    if (SEP == 0u || !prod) {
        fetch_chunk(ra, k_begin, k_end, al);
        [[unroll]] for (uint i = 0u; i < NA; i++) {
            uint e_ = al + i * AL;
            if (e_ < NAV)
                sa[(e_ / AV) * LA + e_ % AV] = ra[i];
        }
        if (spc < ns)
            fetch_chunk(ra, k_begin + spc * BK, k_end, al);
    }
#if FLAGS
    if (l < RING) {
        full_c[l] = 0u;
        empty_c[l] = 0u;
    }
    barrier(); /* the chunk and the counters (uniform: every invocation) */
    if (prod) {
        for (uint j = 0u; j < ns; j += DEPTH) {
            FSTEP_P(j, r0)
            if (DEPTH >= 2u && j + 1u < ns)
                FSTEP_P(j + 1u, r1)
            if (DEPTH >= 3u && j + 2u < ns)
                FSTEP_P(j + 2u, r2)
            if (DEPTH >= 4u && j + 3u < ns)
                FSTEP_P(j + 3u, r3)
        }
        return;
    }
    for (uint j = 0u; j < ns; j++) {
        uint st_ = j % RING, it_ = 0u;
        while (atomicLoad(full_c[st_], gl_ScopeWorkgroup, gl_StorageSemanticsShared,
                          gl_SemanticsAcquire) < NP * (j / RING + 1u) && ++it_ < SPIN_MAX) {
        }
        compute(st_ * BN * LW + cs * 16u * CFN * LW, (j % spc) * RV);
        controlBarrier(gl_ScopeSubgroup, gl_ScopeWorkgroup, gl_StorageSemanticsShared,
                       gl_SemanticsAcquireRelease);
        if (lane == 0u)
            atomicAdd(empty_c[st_], 1u, gl_ScopeWorkgroup, gl_StorageSemanticsShared,
                      gl_SemanticsRelease);
    }
#elif SEP
    if (prod) {
        for (uint j = 0u; j <= ns; j += DEPTH) {
            IT_P(j, r0)
            if (DEPTH >= 2u && j + 1u <= ns)
                IT_P(j + 1u, r1)
            if (DEPTH >= 3u && j + 2u <= ns)
                IT_P(j + 2u, r2)
            if (DEPTH >= 4u && j + 3u <= ns)
                IT_P(j + 3u, r3)
        }
        return;
    }
    for (uint j = 0u; j <= ns; j++)
        IT_C(j)
#else
    for (uint j = 0u; j <= ns; j += DEPTH) {
        IT(j, r0)
        if (DEPTH >= 2u && j + 1u <= ns)
            IT(j + 1u, r1)
        if (DEPTH >= 3u && j + 2u <= ns)
            IT(j + 2u, r2)
        if (DEPTH >= 4u && j + 3u <= ns)
            IT(j + 3u, r3)
    }
#endif
    if (prod)
        return;

    uint base = p.o_off + s * p.slice_stride + (t % p.tiles_m) * BM * p.ldp;
#if EMU
    [[unroll]] for (uint q = 0u; q < FM * CFN * 8u; q++) {
        uint idx = lane + 32u * q, r = idx / (16u * CFN), c = idx % (16u * CFN);
        o[base + r * p.ldp + cc0 + c] = acc[q];
    }
#else
    RAW_EMIT(0u) RAW_EMIT(1u) RAW_EMIT(2u) RAW_EMIT(3u)
    RAW_EMIT(4u) RAW_EMIT(5u) RAW_EMIT(6u) RAW_EMIT(7u)
    RAW_EMIT(8u) RAW_EMIT(9u) RAW_EMIT(10u) RAW_EMIT(11u)
    RAW_EMIT(12u) RAW_EMIT(13u) RAW_EMIT(14u) RAW_EMIT(15u)
#endif
}

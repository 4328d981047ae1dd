#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
/* out[M, N] = a[M, K] · w[N, K]ᵀ on tensor cores: 16 x 16 x 16 cooperative
 * matrices of f16 A and B with f32 accumulators (VK_NV_cooperative_matrix;
 * the host runs this only where the device lists that shape at subgroup
 * scope, with subgroups of 32).
 *
 * a comes as cm_split.comp wrote it: per row r an exponent e_r and f16
 * terms hi (and lo, SPLIT 2) with a[r, k] = 2^e_r (hi + lo). Each tile
 * product is hi · w (+ lo · w) into the same accumulator; the output row
 * is scaled by 2^e_r. w is f16 (used as is) or bf16, converted to f16 on
 * its way into shared memory (bf16x2_to_f16x2): exact for |w| in
 * [2^-14, 65504] (bf16 has 8 significant bits, f16 11).
 *
 * Speed (H200, driver 580, docs/benchmarks.md "Vulkan GEMM: the
 * accumulators in local memory"): 512 x 4096 x 4096 in 0.19 ms precise
 * (90 TFLOP/s), 0.14 ms fast, about 3x the f32 SIMT matmul_rt.comp, so
 * the host runs it from 9 rows up (vk_mm_pick). An MMA-only probe runs NV
 * 16x16x16 at 370-460 TFLOP/s; at 512 rows the global loads take about a
 * third of this loop's time, the barriers a sixth, the epilogue a tenth
 * (at 64 rows, with 8 split-K slices, the epilogue a third).
 *
 * Blocking: a workgroup of WG = 32 SGM SGN invocations owns a BM x BN tile
 * of out (BM = 16 FM SGM, BN = 16 FN SGN); subgroup (i, j) of the SGM x SGN
 * grid owns FM x FN accumulator matrices. K is walked in slices of BK (64
 * up to 64 rows, where it took 0.061 -> 0.048 ms at 64 x 4096 x 4096; 32
 * for the 128 x 128 tiles, whose 64-wide slices would not fit in 48 KiB):
 * 16-byte global loads of the next slice are issued into registers before
 * the tensor-core work on the current one (register double buffering),
 * and stored to shared memory after it; shared rows are BK + 8 halves (80
 * or 144 bytes) so the row starts of a 16 x 16 load fall on distinct bank
 * groups.
 * STAGES 2 .. 4 (up to 64 rows, vk_cm_plan_make, $LLMEM_VULKAN_CM_STAGES)
 * pipeline K deeper: a slice's global loads are issued STAGES steps
 * before its tensor-core work (1 above), into one of R = STAGES - 1
 * register sets, so R slices are in flight while one is computed; a ring
 * of two shared slices takes one barrier per step instead of two; the
 * epilogue matrices share the ring's memory, so that two slices of 64
 * (16 rows) or of 32 (up to 64 rows) fit in 48 KiB. Without asynchronous
 * copies in GLSL the depth lives in registers (20 per set at 16 rows),
 * not in more shared slices (depth 3 by default up to 16 rows,
 * vk_cm_stages_for).
 * Split-K (slices of k_split, partial tiles to out + s * slice_stride,
 * summed by sum_slices.comp) as in matmul_rt.comp. The epilogue (RAW 0)
 * goes through shared memory, one 16 x 16 matrix per subgroup at a time,
 * so rows and columns outside [M, N) are never written and each row gets
 * its scale. RAW 1 (the host's default, $LLMEM_VULKAN_CM_RAW,
 * vk_cm_raw_used) stores the raw accumulators with
 * coopMatStoreNV into whole tiles of a padded partial buffer (ldp floats
 * a row) and sum_slices_cm.comp adds the slices and scales the rows:
 * 64 x 4096 x 4096 precise 0.048 -> 0.032 ms, 16 rows 0.021 -> 0.017
 * (H200, docs/benchmarks.md, "Vulkan GEMM: raw split-K slices"). Blocking after the CUTLASS warp-tile hierarchy (written from its
 * description). Needs K % 8 == 0 and 16-byte aligned operands. */
/* One source for two modules: GL_NV_cooperative_matrix (VK_SH_MATMUL_CM,
 * compiled at build time) and, with -DKHR, GL_KHR_cooperative_matrix
 * (VK_SH_MATMUL_CM_KHR: glslang 15 or later, which Debian 12 lacks, so
 * shaders/khr/update.sh compiles it and the build embeds
 * shaders/khr/matmul_cm.spv while shaders/khr/matmul_cm.sha256 matches
 * this file; shaders/shaders.cmake). The host runs the KHR module for 9-64
 * rows where the device lists VK_KHR_cooperative_matrix
 * ($LLMEM_VULKAN_CM_KHR=0 keeps NV; vk_ops_matmul.c). Self-contained (no
 * common.glsl), so that the recorded hash covers this file alone.
 * With -DKHR -DBF16=1 (glslang 16: GL_EXT_bfloat16; shaders/khr/matmul_cm_bf.spv,
 * $LLMEM_VULKAN_BF16, vk_bf16_used: fast mode, bf16 weights only) the A
 * and B matrices are bf16: the weights are staged as they are (W_CVT) and
 * each f16 term of a is rounded to bf16 (A_CVT) on its way into shared
 * memory; docs/benchmarks.md, "Vulkan decode GEMM on bf16 cooperative
 * matrices". */
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
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

layout(constant_id = 1) const uint W_DT = 2;  /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint SGM = 2;   /* subgroups along M */
layout(constant_id = 3) const uint FM = 4;    /* 16-row matrices per subgroup */
layout(constant_id = 4) const uint FN = 2;    /* 16-column matrices per subgroup */
layout(constant_id = 5) const uint SPLIT = 2; /* f16 terms of a: 2 precise, 1 fast */
layout(constant_id = 6) const uint BK = 32;   /* K step: 32 or 64 (vk_cm_plan_make) */
layout(constant_id = 7) const uint STAGES = 1; /* 1: one shared slice; 2 .. 4: the ring below */
layout(constant_id = 8) const uint RAW = 0;    /* 1: raw accumulators to a padded partial buffer;
                                                * 2: the same, and the last slice of a tile sums */

#ifndef SETS_DEFAULT
#define SETS_DEFAULT 1
#endif
/* STAGES 1: register sets of global loads in flight (1 .. 3; the host's
 * vk_cm_plan.sets). With SETS > 1 the slice of step j + SETS is loaded
 * into the set that step j has just stored to the one shared slice, so
 * SETS steps of loads are in flight during each step's multiply-adds
 * instead of one: at 64 rows a step waits for a memory round trip
 * whatever its K step (BK 32 took 0.92 us a step against 1.05 for BK
 * 64), and the 16-subgroup layout (WG 512, SGM 2) holds a set in 12
 * registers (docs/benchmarks.md, "Vulkan decode GEMM at 32 and 64 rows:
 * fragment traffic"). */
layout(constant_id = 9) const uint SETS = SETS_DEFAULT;

const uint SGN = WG / 32u / SGM;
const uint BM = 16u * FM * SGM, BN = 16u * FN * SGN;
const uint LD = BK / 8u + 1u; /* uvec4s per shared row: BK halves + 8 of padding */
const uint RV = BK / 8u; /* uvec4s per row of a slice */
const uint NA = (SPLIT * BM * RV + WG - 1u) / WG; /* a loads per invocation */
const uint NW = (BN * RV + WG - 1u) / WG;         /* w loads per invocation */
const uint CS = 20u; /* floats per row of the epilogue matrix */

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) readonly buffer A { uvec4 ah[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(binding = 3) readonly buffer E { int ex[]; };
/* RAW 2: binding 2 (the partial buffer) again, coherent, so that the
 * slices' raw stores reach the workgroup that sums them; the final out;
 * one arrival counter per output tile (zero between dispatches). */
layout(binding = 2) coherent buffer OC { float oc[]; };
layout(binding = 2) coherent readonly buffer OC4 { vec4 oc4[]; };
layout(binding = 4) writeonly buffer F { float fo[]; };
layout(binding = 5) coherent buffer C { uint cnt[]; };

layout(push_constant) uniform P {
    uint m, n, k;
    uint hi_off, lo_off; /* uvec4s of binding 0 */
    uint w_off;          /* uvec4s */
    uint o_off;          /* floats */
    uint e_off;          /* ints of binding 3 */
    uint tiles_m, tiles_mn;
    uint k_split;        /* K per slice, a multiple of BK */
    uint slice_stride;   /* floats between two slices' outputs */
    uint n_groups;       /* tiles_mn * slices */
    uint ldp;            /* RAW 1, 2: floats per row of the padded partial buffer */
    uint fo_off;         /* RAW 2: floats of binding 4 */
    uint cnt_off;        /* RAW 2: counters of binding 5 (tiles_mn of them) */
} p;

/* STAGES 1: one slice in sa + sw, the epilogue in cs. STAGES 2 .. 4: a
 * ring of two slices (each: hi rows, lo rows, weight rows; STG uvec4s),
 * the epilogue aliased onto it (CSV uvec4s = CS floats per row); the
 * arrays of the other layout shrink to one element. */
const uint STG = (SPLIT * BM + BN) * LD;
const uint CSV = CS / 4u;
const uint R = STAGES > 1u ? STAGES - 1u : 1u; /* register sets of the ring */
const uint RING = STAGES == 1u ? 1u : 2u * STG;
const uint RING_SA = STAGES == 1u ? SPLIT * BM * LD : 1u;
const uint RING_SW = STAGES == 1u ? BN * LD : 1u;
/* (no epilogue matrices with SETS > 1: the host takes it with raw tiles only) */
const uint RING_CS = STAGES == 1u && SETS == 1u ? (WG / 32u) * 16u * CS : 1u;
shared uvec4 sa[RING_SA]; /* hi rows, then lo rows */
shared uvec4 sw[RING_SW];
shared float cs[RING_CS];
shared uvec4 ring[RING];

/* Two bf16 in a word to two f16 by the device's f32 -> f16 conversion
 * (packHalf2x16). Exact for magnitudes in [2^-14, 65504], whatever the
 * conversion's rounding mode; below, f16 subnormals (error at most 2^-24,
 * negligible beside a bf16 weight's own rounding); above 65504 (no real
 * checkpoint has such weights), inf or 65504 as the device converts:
 * $LLMEM_VULKAN_COOPMAT=0 keeps such a model on the f32 path. */
uint bf16x2_to_f16x2(uint x)
{
    return packHalf2x16(vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u)));
}

/* The terms of a (f16) and the weights (W_DT) as the matrices take them.
 * BF16 0: a as is, bf16 weights converted to f16 (above). BF16 1 (the
 * fast-mode module on bf16 matrices, matmul_cm_bf; SPLIT 1 and bf16
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

/* global -> registers RA, RW for the slice at k0 (zeros outside [M, N) and k_end) */
#define FETCH_TO(RA, RW, k0)                                                                      \
    [[unroll]] for (uint i = 0u; i < NA; i++) {                                                   \
        uint e_ = l + i * WG, row_ = (e_ / RV) % BM, c_ = e_ % RV, t_ = e_ / (RV * BM);           \
        uint gm_ = m0 + row_, gk_ = (k0) + 8u * c_;                                               \
        RA[i] = e_ < SPLIT * BM * RV && gm_ < p.m && gk_ < k_end                                  \
                    ? ah[(t_ == 0u ? p.hi_off : p.lo_off) + (gm_ * p.k + gk_) / 8u]               \
                    : uvec4(0u);                                                                  \
    }                                                                                             \
    [[unroll]] for (uint i = 0u; i < NW; i++) {                                                   \
        uint e_ = l + i * WG, col_ = e_ / RV, c_ = e_ % RV;                                       \
        uint gn_ = n0 + col_, gk_ = (k0) + 8u * c_;                                               \
        RW[i] = e_ < BN * RV && gn_ < p.n && gk_ < k_end                                          \
                    ? w[p.w_off + (gn_ * p.k + gk_) / 8u]                                         \
                    : uvec4(0u);                                                                  \
    }

#define FETCH(k0) FETCH_TO(ra, rw, k0)

/* ring (STAGES 2 .. 4): registers RA, RW -> stage st (weights converted to f16) */
#define STORE(RA, RW, st)                                                                         \
    {                                                                                             \
        uint b_ = (st) * STG;                                                                     \
        [[unroll]] for (uint i = 0u; i < NA; i++) {                                               \
            uint e_ = l + i * WG;                                                                 \
            if (e_ < SPLIT * BM * RV)                                                             \
                ring[b_ + (e_ / RV) * LD + e_ % RV] = A_CVT(RA[i]);                               \
        }                                                                                         \
        [[unroll]] for (uint i = 0u; i < NW; i++) {                                               \
            uint e_ = l + i * WG;                                                                 \
            if (e_ < BN * RV) {                                                                   \
                uvec4 u_ = RW[i];                                                                 \
                u_ = W_CVT(u_);                                                                   \
                ring[b_ + SPLIT * BM * LD + (e_ / RV) * LD + e_ % RV] = u_;                       \
            }                                                                                     \
        }                                                                                         \
    }

/* ring: the tensor-core work of the slice in stage st */
#define COMPUTE(st)                                                                               \
    {                                                                                             \
        uint b_ = (st) * STG, bw_ = b_ + SPLIT * BM * LD;                                         \
        [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {                                      \
            CM_B mb[FN];                                                                          \
            [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                          \
                LOAD_COL(mb[jj], ring, bw_ + (sn + 16u * jj) * LD + 2u * kk, LD);                 \
            [[unroll]] for (uint i = 0u; i < FM; i++) {                                           \
                CM_A ma;                                                                          \
                LOAD_ROW(ma, ring, b_ + (sm + 16u * i) * LD + 2u * kk, LD);                       \
                [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                      \
                    acc[i * FN + jj] = MMA(ma, mb[jj], acc[i * FN + jj]);                         \
                if (SPLIT == 2u) {                                                                \
                    LOAD_ROW(ma, ring, b_ + (BM + sm + 16u * i) * LD + 2u * kk, LD);              \
                    [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                  \
                        acc[i * FN + jj] = MMA(ma, mb[jj], acc[i * FN + jj]);                     \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }

/* ring: step j with register set RA, RW, the one holding slice j + 1 (see main) */
#define STEP(j, RA, RW)                                                                           \
    {                                                                                             \
        barrier();                                                                                \
        if ((j) + 1u < ns) {                                                                      \
            STORE(RA, RW, ((j) + 1u) % 2u)                                                        \
            if ((j) + 1u + R < ns) {                                                              \
                FETCH_TO(RA, RW, k_begin + ((j) + 1u + R) * BK)                                   \
            }                                                                                     \
        }                                                                                         \
        COMPUTE((j) % 2u)                                                                         \
    }

/* STAGES 1, SETS > 1: step j from register set RA, RW (holding slice j)
 * through the one shared slice; the set then loads slice j + SETS */
#define ONE(j, RA, RW)                                                                            \
    {                                                                                             \
        [[unroll]] for (uint i = 0u; i < NA; i++) {                                               \
            uint e_ = l + i * WG;                                                                 \
            if (e_ < SPLIT * BM * RV)                                                             \
                sa[(e_ / RV) * LD + e_ % RV] = A_CVT(RA[i]);                                      \
        }                                                                                         \
        [[unroll]] for (uint i = 0u; i < NW; i++) {                                               \
            uint e_ = l + i * WG;                                                                 \
            if (e_ < BN * RV) {                                                                   \
                uvec4 u_ = RW[i];                                                                 \
                u_ = W_CVT(u_);                                                                   \
                sw[(e_ / RV) * LD + e_ % RV] = u_;                                                \
            }                                                                                     \
        }                                                                                         \
        barrier();                                                                                \
        if ((j) + SETS < ns) {                                                                    \
            FETCH_TO(RA, RW, k_begin + ((j) + SETS) * BK)                                         \
        }                                                                                         \
        [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {                                      \
            CM_B mb[FN];                                                                          \
            [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                          \
                LOAD_COL(mb[jj], sw, (sn + 16u * jj) * LD + 2u * kk, LD);                         \
            [[unroll]] for (uint i = 0u; i < FM; i++) {                                           \
                CM_A ma;                                                                          \
                LOAD_ROW(ma, sa, (sm + 16u * i) * LD + 2u * kk, LD);                              \
                [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                      \
                    acc[i * FN + jj] = MMA(ma, mb[jj], acc[i * FN + jj]);                         \
                if (SPLIT == 2u) {                                                                \
                    LOAD_ROW(ma, sa, (BM + sm + 16u * i) * LD + 2u * kk, LD);                     \
                    [[unroll]] for (uint jj = 0u; jj < FN; jj++)                                  \
                        acc[i * FN + jj] = MMA(ma, mb[jj], acc[i * FN + jj]);                     \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        barrier();                                                                                \
    }

/* Epilogue: accumulator matrix q (row i = q / FN, column j = q % FN of
 * the subgroup's FM x FN) through the subgroup's 16 x 16 staging matrix
 * (STORE_Q(q) writes it, READ_RC(r, c) reads element r, c) to out, row
 * r scaled by 2^e_r, rows and columns outside [M, N) left alone. Spelled
 * out once per matrix with a literal q, not as loops over i and j: with
 * the loops, the driver (H200, 580.159) kept the whole accumulator array
 * in local memory for the 128 x 128 tiles (4 x 2 matrices per subgroup),
 * so every multiply-add of the K loop went through it: 0.585 -> 0.191 ms
 * at 512 x 4096 x 4096 fast (docs/benchmarks.md, "Vulkan GEMM: the
 * accumulators in local memory"). */
#define EMIT(q, STORE_Q, READ_RC)                                                                 \
    if ((q) < FM * FN) {                                                                          \
        STORE_Q(q);                                                                               \
        controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,             \
                       gl_SemanticsAcquireRelease);                                               \
        uint r_ = lane / 2u, gm_ = m0 + sm + 16u * ((q) / FN) + r_;                               \
        if (gm_ < p.m) {                                                                          \
            int e_ = ex[p.e_off + gm_];                                                           \
            [[unroll]] for (uint c8_ = 0u; c8_ < 8u; c8_++) {                                     \
                uint c_ = 8u * (lane % 2u) + c8_, gn_ = n0 + sn + 16u * ((q) % FN) + c_;          \
                if (gn_ < p.n)                                                                    \
                    o[base + gm_ * p.n + gn_] = ldexp(READ_RC(r_, c_), e_);                       \
            }                                                                                     \
        }                                                                                         \
        controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,             \
                       gl_SemanticsAcquireRelease);                                               \
    }
#define EMIT_ALL(STORE_Q, READ_RC)                                                                \
    EMIT(0u, STORE_Q, READ_RC) EMIT(1u, STORE_Q, READ_RC) EMIT(2u, STORE_Q, READ_RC)              \
    EMIT(3u, STORE_Q, READ_RC) EMIT(4u, STORE_Q, READ_RC) EMIT(5u, STORE_Q, READ_RC)              \
    EMIT(6u, STORE_Q, READ_RC) EMIT(7u, STORE_Q, READ_RC) EMIT(8u, STORE_Q, READ_RC)              \
    EMIT(9u, STORE_Q, READ_RC) EMIT(10u, STORE_Q, READ_RC) EMIT(11u, STORE_Q, READ_RC)            \
    EMIT(12u, STORE_Q, READ_RC) EMIT(13u, STORE_Q, READ_RC) EMIT(14u, STORE_Q, READ_RC)           \
    EMIT(15u, STORE_Q, READ_RC)

/* RAW 1: accumulator matrix q straight to its place in the slice's
 * padded tile grid (rows m0 + sm + 16 (q / FN), columns n0 + sn + 16 (q %
 * FN), ldp floats a row), unscaled; sum_slices_cm.comp adds the slices
 * and applies 2^e_r. No shared memory, no bounds: the buffer holds whole
 * tiles (vk_cm_raw_layout). A literal q for the reason given at EMIT. */
#define RAW_EMIT(q, BUF)                                                                          \
    if ((q) < FM * FN)                                                                            \
        STORE_ROW(acc[q], BUF,                                                                    \
                  base + (m0 + sm + 16u * ((q) / FN)) * p.ldp + n0 + sn + 16u * ((q) % FN),       \
                  p.ldp);
#define RAW_ALL_TO(B)                                                                             \
    RAW_EMIT(0u, B) RAW_EMIT(1u, B) RAW_EMIT(2u, B) RAW_EMIT(3u, B) RAW_EMIT(4u, B)               \
    RAW_EMIT(5u, B) RAW_EMIT(6u, B) RAW_EMIT(7u, B) RAW_EMIT(8u, B) RAW_EMIT(9u, B)               \
    RAW_EMIT(10u, B) RAW_EMIT(11u, B) RAW_EMIT(12u, B) RAW_EMIT(13u, B) RAW_EMIT(14u, B)          \
    RAW_EMIT(15u, B)
/* RAW 1: the raw tiles, summed by sum_slices_cm.comp. RAW 2: the raw tiles
 * through the coherent binding, then the tile's arrival counter; the
 * workgroup that arrives last (the one of one slice: at once) adds the
 * slices of the tile in slice order, scales row r by 2^e_r and writes out
 * (sum_slices_cm.comp's arithmetic, so the results are those of RAW 1 bit
 * for bit, whatever the arrival order), and puts the counter back to
 * zero for the next dispatch. The pattern of CUDA's threadFenceReduction
 * sample (written from its description): each invocation's stores, a
 * device-scope memory barrier, a workgroup barrier, one atomic. */
#define RAW_ALL                                                                                   \
    if (RAW == 1u) {                                                                              \
        RAW_ALL_TO(o)                                                                             \
    } else {                                                                                      \
        RAW_ALL_TO(oc)                                                                            \
        last_slice_sum(t, s, m0, n0, l);                                                          \
    }

shared uint last_sh;

/* RAW 2 (see RAW_ALL): called by every invocation of the workgroup of
 * tile t after its raw stores. The summing workgroup reads the tile as
 * vec4s (the host passes o_off, ldp and slice_stride as multiples of 4),
 * SV of them per invocation, every load issued before any store: with a
 * store to out between loads (a binding that might alias the partial
 * buffer), the loads of one vec4 waited for the store of the previous
 * one, and the sum took 26 us instead of the sum pass's 7 at 64 x 4096 x
 * 4096 in 4 slices (H200, docs/benchmarks.md, "Vulkan GEMM: the split-K
 * sum in the last slice"). */
const uint TV = BM * BN / 4u;         /* vec4s of a tile */
const uint SV = (TV + WG - 1u) / WG;  /* per invocation */
void last_slice_sum(uint t, uint s, uint m0, uint n0, uint l)
{
    uint ns = p.n_groups / p.tiles_mn;
    memoryBarrierBuffer();
    barrier();
    if (l == 0u) {
        uint before = ns > 1u ? atomicAdd(cnt[p.cnt_off + t], 1u) : 0u;
        if (ns > 1u && before == ns - 1u)
            atomicExchange(cnt[p.cnt_off + t], 0u);
        last_sh = before == ns - 1u ? 1u : 0u;
    }
    barrier();
    if (last_sh == 0u)
        return;
    memoryBarrierBuffer();
    vec4 sum[SV];
    uint at[SV];
    [[unroll]] for (uint i = 0u; i < SV; i++) {
        uint e = min(l + i * WG, TV - 1u);
        at[i] = (p.o_off + (m0 + e / (BN / 4u)) * p.ldp + n0 + 4u * (e % (BN / 4u))) / 4u;
        sum[i] = oc4[at[i]];
    }
    for (uint j = 1u; j < ns; j++) {
        uint d = j * (p.slice_stride / 4u);
        [[unroll]] for (uint i = 0u; i < SV; i++)
            sum[i] += oc4[at[i] + d];
    }
    [[unroll]] for (uint i = 0u; i < SV; i++) {
        uint e = l + i * WG, gm = m0 + e / (BN / 4u), gn = n0 + 4u * (e % (BN / 4u));
        if (e < TV && gm < p.m) {
            int x = ex[p.e_off + gm];
            uint o_ = p.fo_off + gm * p.n + gn;
            [[unroll]] for (uint c = 0u; c < 4u; c++)
                if (gn + c < p.n)
                    fo[o_ + c] = ldexp(sum[i][c], x);
        }
    }
}

void main()
{
    /* the host splits large grids over x and y (common.glsl's group_id) */
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.n_groups)
        return;
    uint s = g / p.tiles_mn, t = g % p.tiles_mn;
    uint m0 = (t % p.tiles_m) * BM, n0 = (t / p.tiles_m) * BN;
    uint k_begin = s * p.k_split, k_end = min(p.k, k_begin + p.k_split);
    uint l = gl_LocalInvocationID.x, sg = l / 32u, lane = l % 32u;
    uint sm = (sg % SGM) * FM * 16u, sn = (sg / SGM) * FN * 16u;

    CM_C acc[FM * FN];
    [[unroll]] for (uint i = 0u; i < FM * FN; i++)
        acc[i] = CM_C(0.0);

    if (STAGES == 1u && SETS > 1u) {
        /* the one-slice loop with SETS sets (slices 0 .. SETS - 1 loaded first; loads past
         * k_end give zeros); raw tiles only */
        uvec4 ra0[NA], rw0[NW], ra1[NA], rw1[NW], ra2[NA], rw2[NW];
        uint ns = k_end > k_begin ? (k_end - k_begin + BK - 1u) / BK : 0u;
        FETCH_TO(ra0, rw0, k_begin)
        FETCH_TO(ra1, rw1, k_begin + BK)
        if (SETS >= 3u) {
            FETCH_TO(ra2, rw2, k_begin + 2u * BK)
        }
        for (uint j = 0u; j < ns; j += SETS) {
            ONE(j, ra0, rw0)
            if (j + 1u < ns) {
                ONE(j + 1u, ra1, rw1)
            }
            if (SETS >= 3u && j + 2u < ns) {
                ONE(j + 2u, ra2, rw2)
            }
        }
        uint base = p.o_off + s * p.slice_stride;
        RAW_ALL
    } else if (STAGES == 1u) {
        uvec4 ra[NA], rw[NW];
        FETCH(k_begin)
        for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
            [[unroll]] for (uint i = 0u; i < NA; i++) {
                uint e_ = l + i * WG;
                if (e_ < SPLIT * BM * RV)
                    sa[(e_ / RV) * LD + e_ % RV] = A_CVT(ra[i]);
            }
            [[unroll]] for (uint i = 0u; i < NW; i++) {
                uint e_ = l + i * WG;
                if (e_ < BN * RV) {
                    uvec4 u = rw[i];
                    u = W_CVT(u);
                    sw[(e_ / RV) * LD + e_ % RV] = u;
                }
            }
            barrier();
            if (k0 + BK < k_end) {
                FETCH(k0 + BK)
            }
            [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {
                CM_B mb[FN];
                /* B[k][n] = w[n][k]: column-major in sw */
                [[unroll]] for (uint j = 0u; j < FN; j++)
                    LOAD_COL(mb[j], sw, (sn + 16u * j) * LD + 2u * kk, LD);
                [[unroll]] for (uint i = 0u; i < FM; i++) {
                    CM_A ma;
                    LOAD_ROW(ma, sa, (sm + 16u * i) * LD + 2u * kk, LD);
                    [[unroll]] for (uint j = 0u; j < FN; j++)
                        acc[i * FN + j] = MMA(ma, mb[j], acc[i * FN + j]);
                    if (SPLIT == 2u) {
                        LOAD_ROW(ma, sa, (BM + sm + 16u * i) * LD + 2u * kk, LD);
                        [[unroll]] for (uint j = 0u; j < FN; j++)
                            acc[i * FN + j] = MMA(ma, mb[j], acc[i * FN + j]);
                    }
                }
            }
            barrier();
        }

        uint base = p.o_off + s * p.slice_stride, cb = sg * 16u * CS;
        if (RAW >= 1u) {
            RAW_ALL
            return;
        }
#define CS_STORE(q) STORE_ROW(acc[q], cs, cb, CS)
#define CS_READ(r, c) cs[cb + (r) * CS + (c)]
        EMIT_ALL(CS_STORE, CS_READ)
#undef CS_STORE
#undef CS_READ
    } else {
        /* The ring (STAGES 2 .. 4): step j computes slice j from shared
         * slice j % 2 while slice j + 1 goes from register set j % R to
         * shared slice (j + 1) % 2 and the loads of slice j + 1 + R are
         * issued into that set: R = STAGES - 1 slices in flight during
         * each step's MMAs. One barrier per step suffices: the shared
         * slice written in step j was last read in step j - 1, before this
         * step's barrier, and is read in step j + 1, after the next.
         * tests/test_vulkan_pick.c simulates this schedule (ring_schedule)
         * against the barrier rules. */
        uvec4 ra0[NA], rw0[NW], ra1[NA], rw1[NW], ra2[NA], rw2[NW];
        uint ns = k_end > k_begin ? (k_end - k_begin + BK - 1u) / BK : 0u;

        /* prologue: slice 0 (through set R - 1) into shared slice 0, slices
         * 1 .. R into sets 0 .. R - 1 (loads past k_end give zeros) */
        if (R == 1u) {
            FETCH_TO(ra0, rw0, k_begin)
            STORE(ra0, rw0, 0u)
            FETCH_TO(ra0, rw0, k_begin + BK)
        } else if (R == 2u) {
            FETCH_TO(ra1, rw1, k_begin)
            FETCH_TO(ra0, rw0, k_begin + BK)
            STORE(ra1, rw1, 0u)
            FETCH_TO(ra1, rw1, k_begin + 2u * BK)
        } else {
            FETCH_TO(ra2, rw2, k_begin)
            FETCH_TO(ra0, rw0, k_begin + BK)
            FETCH_TO(ra1, rw1, k_begin + 2u * BK)
            STORE(ra2, rw2, 0u)
            FETCH_TO(ra2, rw2, k_begin + 3u * BK)
        }
        for (uint j = 0u; j < ns; j += R) {
            STEP(j, ra0, rw0)
            if (R >= 2u && j + 1u < ns) {
                STEP(j + 1u, ra1, rw1)
            }
            if (R >= 3u && j + 2u < ns) {
                STEP(j + 2u, ra2, rw2)
            }
        }

        uint base = p.o_off + s * p.slice_stride, cb = sg * 16u * CSV;
        if (RAW >= 1u) {
            RAW_ALL
            return;
        }
        /* epilogue through the ring, once every subgroup is done reading it */
        barrier();
#define RING_STORE(q) STORE_ROW(acc[q], ring, cb, CSV)
#define RING_READ(r, c) uintBitsToFloat(ring[cb + (r) * CSV + (c) / 4u][(c) % 4u])
        EMIT_ALL(RING_STORE, RING_READ)
#undef RING_STORE
#undef RING_READ
    }
}

#version 450
#extension GL_GOOGLE_include_directive : enable
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
/* Prefill GEMM on tensor cores, out[M, N] = a[M, K] · w[N, K]ᵀ, for more
 * than 64 activation rows: the arithmetic of matmul_cm.comp (16 x 16 x 16
 * VK_NV_cooperative_matrix, f16 A/B, f32 accumulators; a as cm_split.comp
 * wrote it, a[r, k] = 2^e_r (hi + lo), SPLIT 2 precise, 1 fast; w f16, or
 * bf16 converted to f16 on its way into shared memory, exact in [2^-14,
 * 65504]) with larger warp tiles: each subgroup owns FM x FN accumulator
 * matrices (4 x 4 = 64 x 64 outputs by default, matmul_cm's 4 x 2 above 64
 * rows), so each B fragment loaded from shared memory feeds 2 FM
 * multiply-adds (hi and lo share it) and each A fragment FN.
 *
 * Blocking: WG = 32 SGM SGN invocations, a BM x BN tile (BM = 16 FM SGM,
 * BN = 16 FN SGN), K in steps of BK. STAGES 1: one shared slice, the next
 * slice's 16-byte global loads issued into registers before this slice's
 * multiply-adds and stored after them (two barriers a step). STAGES 2: a
 * ring of two shared slices, the same register prefetch, one barrier a
 * step (the slice stored in step j was last read in step j - 1, before
 * this step's barrier). Shared rows are BK + 8 halves, so that the 16-byte
 * row pieces of a fragment load fall on distinct banks.
 *
 * Epilogue, RAW 1 (matmul_cm.comp's RAW 1): each matrix stored with
 * coopMatStore into whole tiles of a padded partial buffer (ldp floats a
 * row, slice s at s * slice_stride; vk_cm_raw_layout), and
 * sum_slices_cm.comp adds the slices in order and scales row r by 2^e_r.
 * So no shared memory beyond the slices, and no bounds on the stores.
 * The tail-column plan (vk_cmp_plan_tailcol; push constants head, ldt,
 * tail_stride): the first `head` workgroups are whole tiles of the first
 * column tiles in one slice of the whole K, the rest split K as above,
 * their later slices in a narrower grid after slice 0 (vk_cm_raw_tail),
 * so that the partly filled last wave runs in short pieces.
 * RAW 2 (compiled only with -DFINAL_EPI=1, for tools/vk_cm_bench; no sum
 * pass, see FINAL_ALL; uniform plans only, head 0): the workgroup of a one-slice tile scales and
 * writes out itself; with split-K every slice stores its raw tile as in
 * RAW 1 and the last to arrive at the tile's counter adds the slices (in
 * slice order, so bit for bit RAW 1's sum), scales and writes. Slower on
 * the H200 (driver 580): 512 x 4096 x 4096 in one slice 0.226 -> 0.714 ms,
 * 512 x 14336 x 4096 0.454 -> 0.516, its binary 248 KB against 15 KB;
 * 9B pp512 b1 97.5 -> 101.9 ms in the plugin (docs/benchmarks.md, "Vulkan
 * prefill: the sum and the split around each product").
 *
 * Interface: matmul_cm.comp's bindings 0-2 (0-5 with FINAL_EPI), push
 * constants and specialization constants 0-8 (RAW 1 and 2 as there), so
 * that tools/vk_cm_bench runs it as a "gemm" entry. LOADS 0
 * / BARS 0 (compile-time, timing only, results wrong): no global loads /
 * no barriers in the K loop; PF: the K-loop schedules tried (default 1).
 * Needs K % 8 == 0 and 16-byte aligned operands.
 *
 * Speed (H200, driver 580, raw tiles without the sum pass, precise; docs/
 * benchmarks.md, "Vulkan prefill GEMM with larger warp tiles"): compiled
 * as GL_KHR_cooperative_matrix (-DKHR, glslang 15: shaders/khr/), 128 x
 * 256 tiles (2 x 4 subgroups of 4 x 4), 512 x 4096 x 4096 in 2 split-K
 * slices 0.125 ms (matmul_cm.comp 0.173), 2048 x 4096 x 4096 0.456 (0.681),
 * 512 x 14336 x 4096 0.453 (0.679); as NV the same blocking takes 0.179 at
 * 512 rows and its best, 64 x 128 tiles (2 x 2 subgroups of 2 x 4), 0.159
 * precise but 0.137 fast against matmul_cm's 0.115, so the host runs only
 * the KHR module (vk_cmp_plan_make). The warp-tile hierarchy follows
 * CUTLASS's description (written from it, no code taken). */
/* Self-contained (no common.glsl): shaders/khr/matmul_cmp.spv, this file
 * compiled as KHR, is embedded while its recorded SHA-256 matches this
 * file alone (shaders/shaders.cmake). */
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
#define DT_BF16 2u

/* KHR (tools/vk_cm_bench only: glslang 15 or later, which Debian 12 lacks):
 * the same shader on GL_KHR_cooperative_matrix */
#ifdef KHR
#extension GL_KHR_cooperative_matrix : require
#define CM_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define CM_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
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

#ifndef LOADS
#define LOADS 1
#endif
#ifndef BARS
#define BARS 1
#endif
#ifndef FINAL_EPI
#define FINAL_EPI 0 /* 1: the RAW 2 epilogue (tools/vk_cm_bench only: slower, see RAW) */
#endif
#ifndef ADIRECT
#define ADIRECT 0 /* 1: a's fragments loaded from binding 1 straight into the matrices, shared
                   * memory for w only (tools/vk_cm_bench only: no bounds on a's rows and K) */
#endif
#ifndef CONV
#define CONV 1 /* 0: bf16 weights stored unconverted (timing only, results wrong) */
#endif
#if CONV
#define CONV_ON true
#else
#define CONV_ON false
#endif
#ifndef PF
#define PF 1 /* STAGES 1: 0 no register prefetch (each slice loaded and stored at the top of its
               * step), 3 the next slice's loads issued before the first barrier; STAGES 2:
               * the ring schedules below */
#endif

layout(constant_id = 1) const uint W_DT = 2;  /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint SGM = 2;   /* subgroups along M */
layout(constant_id = 3) const uint FM = 4;    /* 16-row matrices per subgroup */
layout(constant_id = 4) const uint FN = 4;    /* 16-column matrices per subgroup */
layout(constant_id = 5) const uint SPLIT = 2; /* f16 terms of a: 2 precise, 1 fast */
layout(constant_id = 6) const uint BK = 32;   /* K step: 16, 32 or 64 */
layout(constant_id = 7) const uint STAGES = 1; /* shared slices: 1 or 2 */
layout(constant_id = 8) const uint RAW = 1;    /* 1: raw tiles for sum_slices_cm.comp; 2 (with
                                                * FINAL_EPI): the sum and scale here */

const uint SGN = WG / 32u / SGM;
const uint BM = 16u * FM * SGM, BN = 16u * FN * SGN;
const uint LD = BK / 8u + 1u;     /* uvec4s per shared row: BK halves + 8 of padding */
const uint RV = BK / 8u;          /* uvec4s per row of a slice */
const uint AR = ADIRECT != 0 ? 0u : SPLIT * BM; /* a's rows in a shared slice */
const uint AV = AR * RV;          /* uvec4s of a's rows in a slice (hi, then lo) */
const uint WV = BN * RV;          /* uvec4s of w's rows */
const uint NA = (AV + WG - 1u) / WG; /* a loads per invocation */
const uint NW = (WV + WG - 1u) / WG; /* w loads per invocation */
const uint STG = (AR + BN) * LD; /* uvec4s of one shared slice */

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) readonly buffer A { uvec4 ah[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
#if FINAL_EPI
/* RAW 2: the row exponents e (cm_split.comp's); binding 2 again, coherent,
 * so that the slices' raw stores reach the workgroup that sums them; the
 * final out [M, N] (f32); one arrival counter per output tile (zero
 * between dispatches; bound but unused at one slice) */
layout(binding = 2) coherent buffer OC { float oc[]; };
layout(binding = 3) readonly buffer E { int ex[]; };
layout(binding = 4) writeonly buffer F { float fo[]; };
layout(binding = 4) writeonly buffer F4 { vec4 fo4[]; };
layout(binding = 5) coherent buffer C { uint cnt[]; };
#endif

layout(push_constant) uniform P {
    uint m, n, k;
    uint hi_off, lo_off; /* uvec4s of binding 1 */
    uint w_off;          /* uvec4s */
    uint o_off;          /* floats */
    uint e_off;          /* RAW 2: ints of binding 3 (RAW 1: sum_slices_cm.comp scales) */
    uint tiles_m, tiles_mn;
    uint k_split;        /* K per slice, a multiple of BK */
    uint slice_stride;   /* floats between two slices' tiles */
    uint n_groups;       /* tiles_mn * slices */
    uint ldp;            /* floats per row of the padded partial buffer */
    uint fo_off;         /* RAW 2: floats of binding 4 */
    uint cnt_off;        /* RAW 2: counters of binding 5 (tiles_mn of them) */
    /* the tail-column plan (RAW 1; vk_cmp_plan_tailcol, vk_cm_raw_tail): tiles [0, head)
     * (whole column tiles) one slice of the whole K, the rest n_groups - head workgroups
     * of k_split; slice s >= 1 of those at o_off + slice_stride + (s - 1) tail_stride,
     * ldt floats a row from the first split column. head 0, ldt = ldp, tail_stride =
     * slice_stride: every tile in slices of k_split, slice s at s slice_stride */
    uint head, ldt, tail_stride;
} p;

shared uvec4 sh[STAGES * STG]; /* per slice: hi rows, lo rows, w rows */

/* Two bf16 in a word to two f16 (packHalf2x16; see matmul_cm.comp). */
uint bf16x2_to_f16x2(uint x)
{
    return packHalf2x16(vec2(uintBitsToFloat(x << 16), uintBitsToFloat(x & 0xffff0000u)));
}

/* global -> registers ra, rw for the slice at k0 (zeros outside [M, N) and k_end) */
#define FETCH(k0)                                                                                  \
    [[unroll]] for (uint i = 0u; i < NA; i++) {                                                    \
        uint e_ = l + i * WG, row_ = (e_ / RV) % BM, c_ = e_ % RV;                                 \
        uint gm_ = m0 + row_, gk_ = (k0) + 8u * c_;                                                \
        ra[i] = (AV % WG == 0u || e_ < AV) && gm_ < p.m && gk_ < k_end                             \
                    ? ah[(e_ < BM * RV ? p.hi_off : p.lo_off) + (gm_ * p.k + gk_) / 8u]            \
                    : uvec4(0u);                                                                   \
    }                                                                                              \
    [[unroll]] for (uint i = 0u; i < NW; i++) {                                                    \
        uint e_ = l + i * WG, col_ = e_ / RV, c_ = e_ % RV;                                        \
        uint gn_ = n0 + col_, gk_ = (k0) + 8u * c_;                                                \
        rw[i] = (WV % WG == 0u || e_ < WV) && gn_ < p.n && gk_ < k_end                             \
                    ? w[p.w_off + (gn_ * p.k + gk_) / 8u]                                          \
                    : uvec4(0u);                                                                   \
    }

/* registers -> shared slice at b (weights converted to f16) */
#define STORE(b)                                                                                   \
    [[unroll]] for (uint i = 0u; i < NA; i++) {                                                    \
        uint e_ = l + i * WG;                                                                      \
        if (AV % WG == 0u || e_ < AV)                                                              \
            sh[(b) + (e_ / RV) * LD + e_ % RV] = ra[i];                                            \
    }                                                                                              \
    [[unroll]] for (uint i = 0u; i < NW; i++) {                                                    \
        uint e_ = l + i * WG;                                                                      \
        if (WV % WG == 0u || e_ < WV) {                                                            \
            uvec4 u_ = rw[i];                                                                      \
            if (W_DT == DT_BF16 && CONV_ON)                                                        \
                u_ = uvec4(bf16x2_to_f16x2(u_.x), bf16x2_to_f16x2(u_.y), bf16x2_to_f16x2(u_.z),    \
                           bf16x2_to_f16x2(u_.w));                                                 \
            sh[(b) + AR * LD + (e_ / RV) * LD + e_ % RV] = u_;                                     \
        }                                                                                          \
    }

/* a's fragment: from the shared slice at element sh_ (ADIRECT 0), or
 * from binding 1 (ADIRECT 1: the terms at off_, row block i_, K kc_ +
 * 16 kk_; sh_ unused) */
#if ADIRECT
#define LOAD_A(m_, off_, sh_)                                                                      \
    LOAD_ROW(m_, ah, (off_) + ((m0 + sm + 16u * i_) * p.k + kc_) / 8u + 2u * kk_, p.k / 8u)
#else
#define LOAD_A(m_, off_, sh_) LOAD_ROW(m_, sh, sh_, LD)
#endif

/* the multiply-adds of the shared slice at b: per 16-wide K sub-step, the
 * subgroup's FN B fragments once, then per row block the hi fragment and
 * its FN products, the lo fragment and its FN products */
#define COMPUTE(b)                                                                                 \
    [[unroll]] for (uint kk_ = 0u; kk_ < BK / 16u; kk_++) {                                        \
        CM_B mb[FN];                                                                               \
        [[unroll]] for (uint j_ = 0u; j_ < FN; j_++)                                               \
            LOAD_COL(mb[j_], sh, (b) + AR * LD + (sn + 16u * j_) * LD + 2u * kk_, LD);             \
                                                                                                   \
        [[unroll]] for (uint i_ = 0u; i_ < FM; i_++) {                                             \
            CM_A ma;                                                                               \
            LOAD_A(ma, p.hi_off, (b) + (sm + 16u * i_) * LD + 2u * kk_);                           \
            [[unroll]] for (uint j_ = 0u; j_ < FN; j_++)                                           \
                acc[i_ * FN + j_] = MMA(ma, mb[j_], acc[i_ * FN + j_]);                            \
            if (SPLIT == 2u) {                                                                     \
                LOAD_A(ma, p.lo_off, (b) + (BM + sm + 16u * i_) * LD + 2u * kk_);                  \
                [[unroll]] for (uint j_ = 0u; j_ < FN; j_++)                                       \
                    acc[i_ * FN + j_] = MMA(ma, mb[j_], acc[i_ * FN + j_]);                        \
            }                                                                                      \
        }                                                                                          \
    }

#if BARS
#define BAR() barrier()
#else
#define BAR()
#endif

/* Accumulator matrix q to its place in the slice's padded tile grid, with
 * a literal q: with loops over the matrix index the driver put the whole
 * accumulator array in local memory (matmul_cm.comp, EMIT). */
#define RAW_EMIT_TO(q, BUF)                                                                        \
    if ((q) < FM * FN)                                                                             \
        STORE_ROW(acc[q], BUF,                                                                     \
                  base + (m0 + sm + 16u * ((q) / FN)) * p.ldp + n0 + sn + 16u * ((q) % FN), p.ldp);
/* RAW 1: the same into the slice's place (base, ldq floats a row, column n0q of the tile) */
#define RAW_EMIT(q)                                                                                \
    if ((q) < FM * FN)                                                                             \
        STORE_ROW(acc[q], o,                                                                       \
                  base + (m0 + sm + 16u * ((q) / FN)) * ldq + n0q + sn + 16u * ((q) % FN), ldq);

#if FINAL_EPI
/* RAW 2: result matrix r (row block i, column block j of the subgroup)
 * through the subgroup's 16 x 16 staging matrix in shared memory (at st,
 * uvec4s of 5: 20 floats a row, so that rows fall on distinct banks) to
 * out, row r scaled by 2^e_r (ldexp, as sum_slices_cm.comp does),
 * rows and columns outside [M, N) left alone; each lane writes 8 floats
 * of one row, as two vec4s where the row's 16 floats lie inside N and
 * 16-byte aligned (vec4_ok, the same for the whole dispatch). */
void final_out(CM_C r, uint i, uint j, uint m0, uint n0, uint sm, uint sn, uint lane, uint st,
               bool vec4_ok)
{
    STORE_ROW(r, sh, st, 5u);
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,
                   gl_SemanticsAcquireRelease);
    uint rr = lane / 2u, gm = m0 + sm + 16u * i + rr;
    uint gn = n0 + sn + 16u * j + 8u * (lane % 2u);
    if (gm < p.m) {
        ivec4 sc = ivec4(ex[p.e_off + gm]);
        vec4 v0 = uintBitsToFloat(sh[st + 5u * rr + 2u * (lane % 2u)]);
        vec4 v1 = uintBitsToFloat(sh[st + 5u * rr + 2u * (lane % 2u) + 1u]);
        uint o_ = p.fo_off + gm * p.n + gn;
        if (vec4_ok && gn + 8u <= p.n) {
            fo4[o_ / 4u] = ldexp(v0, sc);
            fo4[o_ / 4u + 1u] = ldexp(v1, sc);
        } else {
            for (uint c = 0u; c < 8u && gn + c < p.n; c++)
                fo[o_ + c] = ldexp(c < 4u ? v0[c] : v1[c - 4u], sc.x);
        }
    }
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared,
                   gl_SemanticsAcquireRelease);
}

/* RAW 2, accumulator matrix q (literal, see RAW_EMIT): one slice, the
 * accumulator itself; two, it plus the other slice's raw matrix (f32
 * addition commutes, so this is slice 0 + slice 1 whichever arrived
 * last: RAW 1's sum bit for bit); more, the slices' raw matrices added in
 * slice order (this one's own included, read back). */
#define FINAL_EMIT(q)                                                                              \
    if ((q) < FM * FN) {                                                                           \
        uint at_ = p.o_off + (m0 + sm + 16u * ((q) / FN)) * p.ldp + n0 + sn + 16u * ((q) % FN);    \
        CM_C t_ = acc[q];                                                                          \
        if (ns_all == 2u) {                                                                        \
            CM_C u_;                                                                               \
            LOAD_ROW(u_, oc, at_ + (1u - s) * p.slice_stride, p.ldp);                              \
            t_ = t_ + u_;                                                                          \
        } else if (ns_all > 2u) {                                                                  \
            CM_C u_;                                                                               \
            LOAD_ROW(t_, oc, at_, p.ldp);                                                          \
            for (uint j_ = 1u; j_ < ns_all; j_++) {                                                \
                LOAD_ROW(u_, oc, at_ + j_ * p.slice_stride, p.ldp);                                \
                t_ = t_ + u_;                                                                      \
            }                                                                                      \
        }                                                                                          \
        final_out(t_, (q) / FN, (q) % FN, m0, n0, sm, sn, lane, st_, vec4_ok);                     \
    }

/* RAW 2, called by every invocation after the K loop: with split-K the
 * raw tile through the coherent binding, then the tile's counter (each
 * invocation's stores, a device-scope memory barrier, a workgroup
 * barrier, one atomic: the pattern of CUDA's threadFenceReduction sample,
 * written from its description, as in matmul_cm.comp's RAW 2); the
 * workgroup that arrives last (at once with one slice) puts the counter
 * back to zero and writes out. The staging matrices and the flag (the
 * last word: no shared memory beyond the slices, whose 48 KiB at STAGES 2
 * and BK 16 one more word would pass) reuse the K loop's shared slice,
 * after a barrier. */
#define FINAL_ALL                                                                                  \
    {                                                                                              \
        uint ns_all = p.n_groups / p.tiles_mn;                                                     \
        if (ns_all > 1u) {                                                                         \
            uint base = p.o_off + s * p.slice_stride;                                              \
            RAW_EMIT_TO(0u, oc) RAW_EMIT_TO(1u, oc) RAW_EMIT_TO(2u, oc) RAW_EMIT_TO(3u, oc)        \
            RAW_EMIT_TO(4u, oc) RAW_EMIT_TO(5u, oc) RAW_EMIT_TO(6u, oc) RAW_EMIT_TO(7u, oc)        \
            RAW_EMIT_TO(8u, oc) RAW_EMIT_TO(9u, oc) RAW_EMIT_TO(10u, oc) RAW_EMIT_TO(11u, oc)      \
            RAW_EMIT_TO(12u, oc) RAW_EMIT_TO(13u, oc) RAW_EMIT_TO(14u, oc) RAW_EMIT_TO(15u, oc)    \
            memoryBarrierBuffer();                                                                 \
        }                                                                                          \
        barrier();                                                                                 \
        if (l == 0u) {                                                                             \
            uint before = ns_all > 1u ? atomicAdd(cnt[p.cnt_off + t], 1u) : 0u;                    \
            if (ns_all > 1u && before == ns_all - 1u)                                              \
                atomicExchange(cnt[p.cnt_off + t], 0u);                                            \
            sh[STAGES * STG - 1u].x = before == ns_all - 1u ? 1u : 0u;                             \
        }                                                                                          \
        barrier();                                                                                 \
        if (sh[STAGES * STG - 1u].x != 0u) {                                                       \
            memoryBarrierBuffer();                                                                 \
            uint lane = l % 32u, st_ = sg * 80u;                                                   \
            bool vec4_ok = p.n % 4u == 0u && p.fo_off % 4u == 0u;                                  \
            FINAL_EMIT(0u) FINAL_EMIT(1u) FINAL_EMIT(2u) FINAL_EMIT(3u) FINAL_EMIT(4u)             \
            FINAL_EMIT(5u) FINAL_EMIT(6u) FINAL_EMIT(7u) FINAL_EMIT(8u) FINAL_EMIT(9u)             \
            FINAL_EMIT(10u) FINAL_EMIT(11u) FINAL_EMIT(12u) FINAL_EMIT(13u) FINAL_EMIT(14u)        \
            FINAL_EMIT(15u)                                                                        \
        }                                                                                          \
    }
#endif

void main()
{
    /* the host splits large grids over x and y (common.glsl's group_id) */
    uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.n_groups)
        return;
    /* the head's tiles in one slice, then the split tiles slice by slice */
    bool split = g >= p.head;
    uint j0 = g - p.head, tt = p.tiles_mn - p.head;
    uint s = split ? j0 / tt : 0u, t = split ? p.head + j0 % tt : g;
    uint m0 = (t % p.tiles_m) * BM, n0 = (t / p.tiles_m) * BN;
    uint k_begin = s * p.k_split, k_end = split ? min(p.k, k_begin + p.k_split) : p.k;
    uint l = gl_LocalInvocationID.x, sg = l / 32u;
    uint sm = (sg % SGM) * FM * 16u, sn = (sg / SGM) * FN * 16u;

    CM_C acc[FM * FN];
    [[unroll]] for (uint i = 0u; i < FM * FN; i++)
        acc[i] = CM_C(0.0);

    uvec4 ra[NA > 0u ? NA : 1u], rw[NW];
    uint kc_ = k_begin; /* K of the slice computed (ADIRECT) */
    uint ns = k_end > k_begin ? (k_end - k_begin + BK - 1u) / BK : 0u;
    FETCH(k_begin)
    if (STAGES == 1u && PF == 0) {
        for (uint j = 0u; j < ns; j++) {
            if (j > 0u) {
                FETCH(k_begin + j * BK)
            }
            STORE(0u)
            BAR();
            kc_ = k_begin + j * BK;
            COMPUTE(0u)
            BAR();
        }
#if PF == 3
    } else if (STAGES == 1u) {
        /* the next slice's loads issued as soon as this one is in shared
         * memory, before the barrier */
        for (uint j = 0u; j < ns; j++) {
            STORE(0u)
            if (j + 1u < ns) {
                FETCH(k_begin + (j + 1u) * BK)
            }
            BAR();
            kc_ = k_begin + j * BK;
            COMPUTE(0u)
            BAR();
        }
#else
    } else if (STAGES == 1u) {
        for (uint j = 0u; j < ns; j++) {
#if LOADS
            STORE(0u)
#else
            if (j == 0u) {
                STORE(0u)
            }
#endif
            BAR();
#if LOADS
            if (j + 1u < ns) {
                FETCH(k_begin + (j + 1u) * BK)
            }
#endif
            kc_ = k_begin + j * BK;
            COMPUTE(0u)
            BAR();
        }
#endif
    } else if (PF != 1) {
        /* ring, PF 2: step j issues the loads of slice j + 1, computes slice
         * j, then stores slice j + 1 into shared slice (j + 1) % 2 (its last
         * reader, step j - 1, finished before this step's barrier); PF 0:
         * the store right after the loads, before the compute */
        STORE(0u)
        for (uint j = 0u; j < ns; j++) {
            BAR();
            if (PF == 0 && j + 1u < ns) {
                FETCH(k_begin + (j + 1u) * BK)
                STORE(((j + 1u) & 1u) * STG)
            }
            if (PF == 2 && j + 1u < ns) {
                FETCH(k_begin + (j + 1u) * BK)
            }
            kc_ = k_begin + j * BK;
            COMPUTE((j & 1u) * STG)
            if (PF == 2 && j + 1u < ns) {
                STORE(((j + 1u) & 1u) * STG)
            }
        }
    } else {
        /* step j: slice j + 1 from the registers into shared slice (j + 1) % 2
         * and the loads of slice j + 2 issued, then slice j computed */
        STORE(0u)
        if (ns > 1u) {
            FETCH(k_begin + BK)
        }
        for (uint j = 0u; j < ns; j++) {
            BAR();
#if LOADS
            if (j + 1u < ns) {
                STORE(((j + 1u) & 1u) * STG)
                if (j + 2u < ns) {
                    FETCH(k_begin + (j + 2u) * BK)
                }
            }
#endif
            kc_ = k_begin + j * BK;
            COMPUTE((j & 1u) * STG)
        }
    }

#if FINAL_EPI
    if (RAW == 2u) {
        FINAL_ALL
        return;
    }
#endif
    /* slice 0 in the whole grid, the tail's later slices in theirs */
    uint base = s == 0u ? p.o_off : p.o_off + p.slice_stride + (s - 1u) * p.tail_stride;
    uint ldq = s == 0u ? p.ldp : p.ldt;
    uint n0q = s == 0u ? n0 : n0 - (p.head / p.tiles_m) * BN;
    RAW_EMIT(0u) RAW_EMIT(1u) RAW_EMIT(2u) RAW_EMIT(3u) RAW_EMIT(4u) RAW_EMIT(5u)
    RAW_EMIT(6u) RAW_EMIT(7u) RAW_EMIT(8u) RAW_EMIT(9u) RAW_EMIT(10u) RAW_EMIT(11u)
    RAW_EMIT(12u) RAW_EMIT(13u) RAW_EMIT(14u) RAW_EMIT(15u)
}

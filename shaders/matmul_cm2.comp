#version 450
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_buffer_reference : require
/* Prefill GEMM on VK_NV_cooperative_matrix2, out[M, N] = a[M, K] · w[N, K]ᵀ
 * for more than 64 activation rows: matmul_cmp.comp's arithmetic (a as
 * cm_split.comp wrote it, a[r, k] = 2^e_r (hi + lo) in f16 terms, SPLIT 2
 * precise, 1 fast; w f16, or bf16 converted to f16 exactly as
 * matmul_cmp.comp converts it (packHalf2x16: exact in [2^-14, 65504]);
 * f16 products into f32 accumulators), with one workgroup-scope
 * accumulator matrix per BM x BN output tile and its operands loaded by
 * coopMatLoadTensorNV, so that the driver stages the tiles through shared
 * memory itself (GL_NV_cooperative_matrix2, "workgroup scope matrices with
 * compiler-managed staging"): no hand-written global -> shared copies,
 * barriers or register prefetch as in matmul_cmp.comp, whose K loop lost
 * 30-45% to its global loads (docs/benchmarks.md, "Vulkan prefill: the
 * sum and the split around each product").
 *
 * Loads: a's hi (and lo) terms as BM x BK A matrices through a tensor
 * layout [M, k_end] with row stride K; w's rows as a BK x BN B matrix
 * through a layout [N, k_end] (row stride K) and a view that swaps its
 * two dimensions (w is [N, K] row-major, B wants K x N). bf16 weights are
 * loaded as f16 bit patterns and converted element by element
 * (coopMatPerElementNV: the bits to f32, to f16 by packHalf2x16; CONV 2),
 * or (CONV 1, 1.7x slower on the H200) through a decode function over
 * blocks of two elements (one 32-bit word each, no 16-bit storage).
 * Out-of-range rows, columns and K (partial tiles, the end of a split-K
 * slice, UNROLL's steps past it) load as zeros: the layouts clamp with the
 * constant 0 (CLAMP 1, the default; CLAMP 2: only tiles that reach past
 * M, N or k_end, the others without bounds: 1.2-2.7x slower on the H200,
 * the two K loops' code).
 *
 * Speed (H200, driver 580, tools/vk_cm_bench, raw tiles; docs/
 * benchmarks.md, "Vulkan prefill on VK_NV_cooperative_matrix2"): 512 x
 * 4096 x 4096 precise in 2 slices 0.18-0.23 ms against matmul_cmp.comp's
 * 0.126 (fast 0.133 against 0.086): the driver stages each tensor load
 * through 12-30 KiB of shared memory without overlapping the next K
 * step's loads (unrolling two steps helps 10-20%), at 241-255 registers.
 * So the host runs it only when asked ($LLMEM_VULKAN_CM2_PREFILL=1).
 *
 * Epilogue: matmul_cmp.comp's RAW 1 and nothing else: the accumulator is
 * stored with coopMatStoreTensorNV into whole tiles of the padded partial
 * buffer (ldp floats a row, slice s at s * slice_stride; vk_cm_raw_layout),
 * and sum_slices_cm.comp adds the slices in order and scales row r by
 * 2^e_r. So the results are those of matmul_cmp.comp's contract; only the
 * order in which the driver feeds each slice's products to the f32
 * accumulator may differ.
 *
 * Interface: matmul_cmp.comp's bindings 0-2, push constants and
 * specialization constants 0-8, read the same way: WG invocations, the
 * tile BM = 16 FM SGM rows by BN = 16 FN SGN columns (SGN = WG / 32 /
 * SGM; SGM, FM and FN only size the tile here: the driver splits the
 * workgroup's matrix among its subgroups), SPLIT, BK, STAGES unused, RAW
 * must be 1. So the host and tools/vk_cm_bench run it as matmul_cmp.
 * Needs K % 8 == 0, 16-byte aligned operands (hi_off, lo_off, w_off in
 * uvec4s) and o_off and slice_stride multiples of 4 floats; the device's
 * VK_NV_cooperative_matrix2 with workgroup scope, flexible dimensions,
 * tensor addressing and block loads (decode functions) at WG invocations
 * (vk_cm2.c), and bufferDeviceAddress (a decode function's first
 * parameter is a buffer reference).
 *
 * Compiled by glslang 15 only (Debian 12's 12 lacks the extension):
 * embedded from shaders/khr/matmul_cm2.spv while its SHA-256 matches this
 * file (shaders/shaders.cmake, LLMEM_VK_KHR_ONLY_SHADERS). Written from
 * the GL_NV_cooperative_matrix2 specification. */
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint W_DT = 2;  /* 1 f16, 2 bf16 */
layout(constant_id = 2) const uint SGM = 2;   /* tile rows: 16 FM SGM */
layout(constant_id = 3) const uint FM = 4;
layout(constant_id = 4) const uint FN = 4;    /* tile columns: 16 FN (WG / 32 / SGM) */
layout(constant_id = 5) const uint SPLIT = 2; /* f16 terms of a: 2 precise, 1 fast */
layout(constant_id = 6) const uint BK = 32;   /* K step */
layout(constant_id = 7) const uint STAGES = 1; /* (unused) */
layout(constant_id = 8) const uint RAW = 1;    /* (1 only) */
#define DT_BF16 2u

#ifndef CLAMP
#define CLAMP 1 /* 1: every load through clamping layouts; 2: only tiles that need it */
#endif
#ifndef CONV
#define CONV 2 /* bf16 weights: 2 loaded as raw f16 bits, then converted element by element
                * (coopMatPerElementNV); 1 through a decode function; 0 not converted (timing
                * only, results wrong) */
#endif
#ifndef UNROLL
#define UNROLL 2 /* K steps per trip of the K loop (H200, 256 invocations: 2 is 10-20% faster
                  * than 1 or 4; within the noise at 128) */
#endif

const uint BM = 16u * FM * SGM, BN = 16u * FN * (WG / 32u / SGM);

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) readonly buffer A { uvec4 ah[]; };
layout(binding = 2) writeonly buffer O { uvec4 o[]; };

layout(push_constant) uniform P {
    uint m, n, k;
    uint hi_off, lo_off; /* uvec4s of binding 1 */
    uint w_off;          /* uvec4s */
    uint o_off;          /* floats (a multiple of 4) */
    uint e_off;          /* (unused: sum_slices_cm.comp scales) */
    uint tiles_m, tiles_mn;
    uint k_split;        /* K per slice, a multiple of BK */
    uint slice_stride;   /* floats between two slices' tiles (a multiple of 4) */
    uint n_groups;       /* tiles_mn * slices */
    uint ldp;            /* floats per row of the padded partial buffer */
    uint fo_off, cnt_off; /* (unused) */
} p;

/* Two bf16 weights in one 32-bit word: a decode block of 1 x 2 elements. */
layout(buffer_reference, std430, buffer_reference_align = 4) buffer BF16X2 { uint v; };

/* The f16 value of the bf16 weight at element ib[1] of block b (bits
 * 0-15 the first, 16-31 the second; matmul_cmp.comp's bf16x2_to_f16x2,
 * one half at a time). */
float16_t bf16_to_f16(const in BF16X2 b, const in uint bc[2], const in uint ib[2])
{
    uint x = b.v;
    float f = uintBitsToFloat(ib[1] == 0u ? x << 16 : x & 0xffff0000u);
    return unpackFloat2x16(packHalf2x16(vec2(f, 0.0))).x;
}

/* The f16 value of the bf16 weight whose bits x holds (loaded as f16 bits:
 * the load moves bits, CONV 2); r, c unused. */
float16_t bf16_bits_to_f16(const in uint r, const in uint c, const in float16_t x)
{
    float f = uintBitsToFloat(packFloat2x16(f16vec2(x, float16_t(0.0))) << 16);
    return unpackFloat2x16(packHalf2x16(vec2(f, 0.0))).x;
}

#define CM_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define CM_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define CM_C coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>

/* One K step at k0 through layouts LA (a) and LW (w): B once, then the hi
 * product and, SPLIT 2, the lo one into acc. */
#define STEP(LA, LW, k0)                                                                           \
    {                                                                                              \
        CM_A ma_;                                                                                  \
        CM_B mb_;                                                                                  \
        if (W_DT == DT_BF16 && CONV == 1)                                                          \
            coopMatLoadTensorNV(mb_, w, p.w_off, sliceTensorLayoutNV(LW, n0, BN, (k0), BK), tr,    \
                                bf16_to_f16);                                                      \
        else                                                                                       \
            coopMatLoadTensorNV(mb_, w, p.w_off, sliceTensorLayoutNV(LW, n0, BN, (k0), BK), tr);   \
        if (W_DT == DT_BF16 && CONV == 2)                                                          \
            coopMatPerElementNV(mb_, mb_, bf16_bits_to_f16);                                       \
        coopMatLoadTensorNV(ma_, ah, p.hi_off, sliceTensorLayoutNV(LA, m0, BM, (k0), BK));         \
        acc = coopMatMulAdd(ma_, mb_, acc);                                                        \
        if (SPLIT == 2u) {                                                                         \
            coopMatLoadTensorNV(ma_, ah, p.lo_off, sliceTensorLayoutNV(LA, m0, BM, (k0), BK));     \
            acc = coopMatMulAdd(ma_, mb_, acc);                                                    \
        }                                                                                          \
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
    /* bf16: strides in blocks of two elements */
    uint wb = W_DT == DT_BF16 && CONV == 1 ? 2u : 1u;

    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);
    CM_C acc = CM_C(0.0);
    bool inside = m0 + BM <= p.m && n0 + BN <= p.n && (k_end - k_begin) % (BK * UNROLL) == 0;
    if (CLAMP == 2 && inside) {
        tensorLayoutNV<2> la = createTensorLayoutNV(2);
        la = setTensorLayoutDimensionNV(la, p.m, p.k);
        tensorLayoutNV<2> lw = createTensorLayoutNV(2);
        if (W_DT == DT_BF16 && CONV == 1)
            lw = setTensorLayoutBlockSizeNV(lw, 1, 2);
        lw = setTensorLayoutDimensionNV(lw, p.n, p.k);
        for (uint k0 = k_begin; k0 < k_end; k0 += BK * UNROLL) {
            [[unroll]] for (uint u = 0u; u < UNROLL; u++)
                STEP(la, lw, k0 + u * BK)
        }
    } else {
        /* (UNROLL steps a trip: a step past k_end loads zeros) */
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> la =
            createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
        la = setTensorLayoutDimensionNV(la, p.m, k_end);
        la = setTensorLayoutStrideNV(la, p.k, 1);
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> lw =
            createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
        if (W_DT == DT_BF16 && CONV == 1)
            lw = setTensorLayoutBlockSizeNV(lw, 1, 2);
        lw = setTensorLayoutDimensionNV(lw, p.n, k_end);
        lw = setTensorLayoutStrideNV(lw, p.k / wb, 1);
        for (uint k0 = k_begin; k0 < k_end; k0 += BK * UNROLL) {
            [[unroll]] for (uint u = 0u; u < UNROLL; u++)
                STEP(la, lw, k0 + u * BK)
        }
    }

    tensorLayoutNV<2> lo = createTensorLayoutNV(2);
    lo = setTensorLayoutDimensionNV(lo, p.tiles_m * BM, p.ldp);
    coopMatStoreTensorNV(acc, o, (p.o_off + s * p.slice_stride) / 4u,
                         sliceTensorLayoutNV(lo, m0, BM, n0, BN));
}

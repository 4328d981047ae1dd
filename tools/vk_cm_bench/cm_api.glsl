/* The cooperative-matrix API of the vk_cm_bench shaders: -DKHR for
 * GL_KHR_cooperative_matrix (glslang 15+), else GL_NV_cooperative_matrix.
 * MA, MB: TM x TK and TK x TN f16 operands (bf16 with -DKHR -DBF16=1); MC: the TM x TN accumulator
 * (f32, or f16 with CF16 1). */
#ifndef TM
#define TM 16
#define TN 16
#define TK 16
#endif
#ifndef CF16
#define CF16 0
#endif
#ifndef BF16
#define BF16 0
#endif
#ifdef KHR
#extension GL_KHR_cooperative_matrix : require
#if BF16 /* -DBF16=1: bf16 A and B (GL_EXT_bfloat16, glslang 16+), loaded from the same bits */
#extension GL_EXT_bfloat16 : require
#define MA coopmat<bfloat16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA>
#define MB coopmat<bfloat16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB>
#else
#define MA coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA>
#define MB coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB>
#endif
#if CF16
#define MC coopmat<float16_t, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>
#else
#define MC coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>
#endif
#define LOADR(m, arr, off, st) coopMatLoad(m, arr, off, st, gl_CooperativeMatrixLayoutRowMajor)
#define LOADC(m, arr, off, st) coopMatLoad(m, arr, off, st, gl_CooperativeMatrixLayoutColumnMajor)
#define STORER(m, arr, off, st) coopMatStore(m, arr, off, st, gl_CooperativeMatrixLayoutRowMajor)
#define MMA coopMatMulAdd
#else
#extension GL_NV_cooperative_matrix : require
#define MA fcoopmatNV<16, gl_ScopeSubgroup, TM, TK>
#define MB fcoopmatNV<16, gl_ScopeSubgroup, TK, TN>
#if CF16
#define MC fcoopmatNV<16, gl_ScopeSubgroup, TM, TN>
#else
#define MC fcoopmatNV<32, gl_ScopeSubgroup, TM, TN>
#endif
#define LOADR(m, arr, off, st) coopMatLoadNV(m, arr, off, st, false)
#define LOADC(m, arr, off, st) coopMatLoadNV(m, arr, off, st, true)
#define STORER(m, arr, off, st) coopMatStoreNV(m, arr, off, st, false)
#define MMA coopMatMulAddNV
#endif

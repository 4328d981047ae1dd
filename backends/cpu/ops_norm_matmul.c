/* llmem: CPU reference of the fused decode matmul (<llmem/ops_norm_matmul.h>,
 * issue 11): per input row, the RMS norm (Zhang & Sennrich 2019) or Mamba-2's
 * gated RMS norm (Dao & Gu 2024; transformers MambaRMSNormGated, one group)
 * with the arithmetic of ops_basic.c's norms (h * scale * w), then the row's
 * products with w (and w2), stored, added to out, or combined as SwiGLU
 * (Shazeer 2020), in f32 with f32 accumulation. Single-threaded: the op is
 * meant for decode rows, and models/forward.c uses it only on device
 * backends, so this is the reference the conformance suite checks them
 * against (tests/test_ops_norm_matmul.c checks it against float64).
 *
 * LLMEM_NORM_MATMUL_CPU_MAX_K=n (a test knob) makes this slot refuse rows
 * longer than n (K > n) with LLMEM_E_UNSUPPORTED before writing anything,
 * as the CUDA kernel refuses the shapes it does not take: with
 * LLMEM_NORM_MATMUL_CPU=1 it exercises models/forward.c's fallback to the
 * unfused ops on the CPU (ctest fused_fallback_*, tests/fused_fallback.sh).
 * The backend reads it when it opens (and at llmem_backend_reload_env),
 * not per call.
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_ops.h"
#include "llmem/ops_norm_matmul.h"

static llmem_status cpu_op_norm_matmul(llmem_backend *be, const llmem_norm_matmul_params *p,
                                       const llmem_tensor *x, const llmem_tensor *z,
                                       const llmem_tensor *nw, const llmem_tensor *w,
                                       const llmem_tensor *w2, const llmem_tensor *out)
{
    int64_t T = x->ne[0], K = x->ne[1], N = w->ne[0];
    int64_t max_k = cpu_norm_matmul_max_k(be);
    if (max_k >= 0 && K > max_k)
        return LLMEM_E_UNSUPPORTED;
    size_t es = llmem_dtype_size(w->dtype);
    float *a = malloc((size_t)K * 3 * sizeof *a);
    if (!a)
        return LLMEM_E_NO_MEMORY;
    float *wr = a + K, *nwf = a + 2 * K;
    if (nw)
        load_f32(tensor_data(nw), nw->dtype, K, nwf);
    const float *xs = tensor_data(x), *zs = z ? tensor_data(z) : NULL;
    const char *wd = tensor_data(w), *w2d = w2 ? tensor_data(w2) : NULL;
    float *o = tensor_data(out);
    for (int64_t t = 0; t < T; t++) {
        float ss = 0.0f;
        for (int64_t i = 0; i < K; i++) {
            float v = xs[t * K + i];
            if (zs) {
                float g = zs[t * K + i];
                v *= g / (1.0f + expf(-g));
            }
            a[i] = v;
            ss += v * v;
        }
        if (p->norm != LLMEM_NM_NORM_NONE) {
            float scale = 1.0f / sqrtf(ss / (float)K + p->eps);
            for (int64_t i = 0; i < K; i++)
                a[i] = nw ? a[i] * scale * nwf[i] : a[i] * scale;
        }
        for (int64_t n = 0; n < N; n++) {
            load_f32(wd + (size_t)(n * K) * es, w->dtype, K, wr);
            float s = dot_f32(a, wr, K);
            float *dst = o + t * N + n;
            if (p->epilogue == LLMEM_NM_SWIGLU) {
                load_f32(w2d + (size_t)(n * K) * es, w2->dtype, K, wr);
                float u = dot_f32(a, wr, K);
                *dst = s / (1.0f + expf(-s)) * u;
            } else if (p->epilogue == LLMEM_NM_ADD) {
                *dst = *dst + s;
            } else {
                *dst = s;
            }
        }
    }
    free(a);
    return LLMEM_OK;
}

LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_NORM_MATMUL, LLMEM_OP_NORM_MATMUL_LAYOUT,
              llmem_op_norm_matmul_fn, cpu_op_norm_matmul);

/* llmem: CPU matmul, out[M, N] = a[M, K] · w[N, K]ᵀ, f32 accumulation.
 *
 * The output is cut into tiles of MB activation rows x NB weight rows; a
 * tile is one work item of the thread pool. An f16/bf16 weight tile is
 * converted to f32 once per item into per-thread scratch and reused for
 * MB rows of a. The micro-kernel computes one activation row against four
 * weight rows with eight partial sums each (vectorizes without fast-math).
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"

#define NB 16 /* weight rows per tile */
#define MB 16 /* activation rows per tile */

typedef struct mm_ctx {
    const float *a;
    const char *w;
    llmem_dtype wt;
    float *out;
    int64_t m, n, k;
    int64_t m_tiles;
    float *scratch; /* [threads][NB * k] f32 weight tiles */
} mm_ctx;

/* out[0..4) = a · w0..w3 */
static void dot4(const float *restrict a, const float *restrict w0, const float *restrict w1,
                 const float *restrict w2, const float *restrict w3, int64_t k, float *out)
{
    float s0[8] = {0}, s1[8] = {0}, s2[8] = {0}, s3[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        for (int l = 0; l < 8; l++) {
            float av = a[i + l];
            s0[l] += av * w0[i + l];
            s1[l] += av * w1[i + l];
            s2[l] += av * w2[i + l];
            s3[l] += av * w3[i + l];
        }
    }
    float r[4];
    const float *s[4] = {s0, s1, s2, s3};
    for (int j = 0; j < 4; j++)
        r[j] = ((s[j][0] + s[j][4]) + (s[j][1] + s[j][5])) +
               ((s[j][2] + s[j][6]) + (s[j][3] + s[j][7]));
    for (; i < k; i++) {
        r[0] += a[i] * w0[i];
        r[1] += a[i] * w1[i];
        r[2] += a[i] * w2[i];
        r[3] += a[i] * w3[i];
    }
    for (int j = 0; j < 4; j++)
        out[j] = r[j];
}

static void mm_run(void *vctx, int64_t t0, int64_t t1, int32_t thread)
{
    const mm_ctx *c = vctx;
    int64_t k = c->k;
    size_t wes = llmem_dtype_size(c->wt);
    float *tile = c->scratch ? c->scratch + (size_t)thread * NB * (size_t)k : NULL;
    int64_t loaded = -1; /* weight tile now in `tile` */
    for (int64_t t = t0; t < t1; t++) {
        int64_t nt = t / c->m_tiles, mt = t % c->m_tiles;
        int64_t n0 = nt * NB, n1 = n0 + NB < c->n ? n0 + NB : c->n;
        int64_t m0 = mt * MB, m1 = m0 + MB < c->m ? m0 + MB : c->m;
        const float *w;
        if (c->wt == LLMEM_DTYPE_F32) {
            w = (const float *)(const void *)c->w + n0 * k;
        } else {
            if (loaded != nt) {
                load_f32(c->w + (size_t)n0 * (size_t)k * wes, c->wt, (n1 - n0) * k, tile);
                loaded = nt;
            }
            w = tile;
        }
        for (int64_t m = m0; m < m1; m++) {
            const float *a = c->a + m * k;
            float *o = c->out + m * c->n;
            int64_t j = n0;
            for (; j + 4 <= n1; j += 4) {
                const float *wj = w + (j - n0) * k;
                dot4(a, wj, wj + k, wj + 2 * k, wj + 3 * k, k, o + j);
            }
            for (; j < n1; j++)
                o[j] = dot_f32(a, w + (j - n0) * k, k);
        }
    }
}

static llmem_status matmul_rows(const float *a_data, llmem_ct *a, llmem_ct *w, llmem_ct *out);
static llmem_status matmul_into(const float *a_data, llmem_ct *a, llmem_ct *w, float *out_data);

llmem_status cpu_op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    (void)be;
    return matmul_rows(tensor_data(a), a, w, out);
}

/* FAST mode: the activations rounded to bf16 (as a bf16 tensor-core GEMM
 * sees them), then the same f32-accumulated product. */
llmem_status cpu_op_matmul_fast(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    (void)be;
    int64_t n = llmem_tensor_nelements(a);
    float *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    if (!r)
        return LLMEM_E_NO_MEMORY;
    const float *src = tensor_data(a);
    for (int64_t i = 0; i < n; i++)
        r[i] = bf16_to_f32(f32_to_bf16(src[i]));
    llmem_status st = matmul_rows(r, a, w, out);
    free(r);
    return st;
}

/* silu(a · gateᵀ) * (a · upᵀ): the two products (the up one into
 * scratch), then the gate, as llmem_op_swiglu computes it. */
llmem_status cpu_op_matmul_swiglu(llmem_backend *be, llmem_ct *a, llmem_ct *gate, llmem_ct *up,
                                  llmem_ct *out)
{
    (void)be;
    int64_t n = llmem_tensor_nelements(out);
    float *u = malloc((size_t)n * sizeof *u);
    if (!u)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = matmul_rows(tensor_data(a), a, gate, out);
    if (st == LLMEM_OK)
        st = matmul_into(tensor_data(a), a, up, u);
    float *o = tensor_data(out);
    for (int64_t i = 0; st == LLMEM_OK && i < n; i++)
        o[i] = o[i] / (1.0f + expf(-o[i])) * u[i];
    free(u);
    return st;
}

static llmem_status matmul_rows(const float *a_data, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    return matmul_into(a_data, a, w, tensor_data(out));
}

static llmem_status matmul_into(const float *a_data, llmem_ct *a, llmem_ct *w, float *out_data)
{
    mm_ctx c = {
        .a = a_data,
        .w = tensor_data(w),
        .wt = w->dtype,
        .out = out_data,
        .m = a->ne[0],
        .n = w->ne[0],
        .k = a->ne[1],
    };
    c.m_tiles = (c.m + MB - 1) / MB;
    int64_t tiles = c.m_tiles * ((c.n + NB - 1) / NB);
    int32_t nth = cpu_threads_for(c.m * c.n * (c.k > 0 ? c.k : 1));
    if (c.wt != LLMEM_DTYPE_F32) {
        c.scratch = malloc((size_t)nth * NB * (size_t)(c.k > 0 ? c.k : 1) * sizeof *c.scratch);
        if (!c.scratch)
            return LLMEM_E_NO_MEMORY;
    }
    /* Chunks of consecutive tiles share a weight tile (converted once), but
     * stay small enough to give every thread several. */
    int64_t grain = tiles / ((int64_t)nth * 4);
    grain = grain < 1 ? 1 : (grain > c.m_tiles ? c.m_tiles : grain);
    llmem_tp_run(nth, tiles, grain, mm_run, &c);
    free(c.scratch);
    return LLMEM_OK;
}

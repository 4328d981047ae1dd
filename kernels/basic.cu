/* llmem CUDA kernels, basic family: fill, element-wise ops and activations,
 * get_rows, RMS norms, log_softmax, argmax, dtype copies, RoPE and the
 * K-shift.
 *
 * These are memory-bound one-pass kernels: grid-stride loops over elements
 * or one block per row with block reductions. Formulas follow the CPU
 * reference (backends/cpu/ops_basic.c, ops_rope.c) operation by operation;
 * reductions run in f32 in a different order (tree instead of sequential),
 * which the conformance thresholds allow. RoPE angles are formed in double
 * as on the CPU, once per (token, pair) and shared by every head.
 */
#include <math.h>

#include "kernels/common.cuh"
#include "kernels/prefill.h"

/* ---- fill, element-wise ----------------------------------------------------------------- */

__global__ void fill32_kernel(uint32_t *dst, int64_t n, uint32_t pattern)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = pattern;
}

extern "C" cudaError_t cuk_fill32(void *dst, int64_t n_words, uint32_t pattern,
                                  cudaStream_t stream)
{
    fill32_kernel<<<cuk_grid(n_words, 256), 256, 0, stream>>>((uint32_t *)dst, n_words, pattern);
    return cudaGetLastError();
}

__device__ __forceinline__ float silu_f(float x)
{
    return x / (1.0f + expf(-x));
}

template <int KIND>
__global__ void ew_kernel(const float *a, const float *b, int64_t b_cols, float s, float *out,
                          int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = a[i], r;
        if (KIND == CUK_EW_ADD || KIND == CUK_EW_MUL || KIND == CUK_EW_SWIGLU) {
            float y = b[b_cols > 0 ? i % b_cols : i];
            r = KIND == CUK_EW_ADD ? x + y : KIND == CUK_EW_MUL ? x * y : silu_f(x) * y;
        } else if (KIND == CUK_EW_GEGLU) {
            /* torch gelu(approximate="tanh"); 0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z)),
             * no cancellation in the negative tail */
            r = x / (1.0f + expf(-1.5957691216f * (x + 0.044715f * x * x * x))) * b[i];
        } else if (KIND == CUK_EW_SOFTCAP) {
            r = s * tanhf(x / s);
        } else if (KIND == CUK_EW_SCALE) {
            r = x * s;
        } else if (KIND == CUK_EW_SILU) {
            r = silu_f(x);
        } else if (KIND == CUK_EW_RELU2) {
            float t = x > 0.0f ? x : 0.0f;
            r = t * t;
        } else {
            r = x > 20.0f ? x : log1pf(expf(x));
        }
        out[i] = r;
    }
}

extern "C" cudaError_t cuk_elementwise(cuk_ew_kind kind, const float *a, const float *b,
                                       int64_t b_cols, float s, float *out, int64_t n,
                                       cudaStream_t stream)
{
    unsigned g = cuk_grid(n, 256);
    switch (kind) {
    case CUK_EW_ADD: ew_kernel<CUK_EW_ADD><<<g, 256, 0, stream>>>(a, b, b_cols, s, out, n); break;
    case CUK_EW_MUL: ew_kernel<CUK_EW_MUL><<<g, 256, 0, stream>>>(a, b, b_cols, s, out, n); break;
    case CUK_EW_SCALE: ew_kernel<CUK_EW_SCALE><<<g, 256, 0, stream>>>(a, b, 0, s, out, n); break;
    case CUK_EW_SILU: ew_kernel<CUK_EW_SILU><<<g, 256, 0, stream>>>(a, b, 0, s, out, n); break;
    case CUK_EW_RELU2: ew_kernel<CUK_EW_RELU2><<<g, 256, 0, stream>>>(a, b, 0, s, out, n); break;
    case CUK_EW_SOFTPLUS:
        ew_kernel<CUK_EW_SOFTPLUS><<<g, 256, 0, stream>>>(a, b, 0, s, out, n);
        break;
    case CUK_EW_SWIGLU:
        ew_kernel<CUK_EW_SWIGLU><<<g, 256, 0, stream>>>(a, b, 0, s, out, n);
        break;
    case CUK_EW_GEGLU: ew_kernel<CUK_EW_GEGLU><<<g, 256, 0, stream>>>(a, b, 0, s, out, n); break;
    case CUK_EW_SOFTCAP:
        ew_kernel<CUK_EW_SOFTCAP><<<g, 256, 0, stream>>>(a, b, 0, s, out, n);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- get_rows ------------------------------------------------------------------------------ */

__global__ void get_rows_kernel(const void *src, int dt, int64_t rows, int64_t cols,
                                const int32_t *idx, int64_t n, float *out)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        int32_t r = idx[i];
        bool ok = r >= 0 && r < rows;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            out[i * cols + c] = ok ? cuk_load(src, dt, (int64_t)r * cols + c) : __int_as_float(0x7fc00000);
    }
}

extern "C" cudaError_t cuk_get_rows(const void *src, int dtype, int64_t rows, int64_t cols,
                                    const int32_t *idx, int64_t n, float *out, cudaStream_t stream)
{
    unsigned g = (unsigned)(n < 65536 * 8 ? n : 65536 * 8);
    get_rows_kernel<<<g, 256, 0, stream>>>(src, dtype, rows, cols, idx, n, out);
    return cudaGetLastError();
}

/* ---- norms --------------------------------------------------------------------------------- */

/* Rows of at most 16384 floats (cols % 4 == 0, 16-byte aligned rows) take
 * the register path (issue 11): each thread loads its NV float4s of the row
 * (and of the residual / gate) at once, so a row costs one memory latency
 * instead of one per loop trip (the loop below made the decode step's norms
 * 8-20 µs each, latency-bound with one block per row), keeps them in
 * registers through the block reduction, and writes from registers. The
 * thread count and the order of each thread's sum depend on cols only, so
 * rms_norm and add_rms_norm stay equal bit for bit. */
#define NORM_NV 4

struct norm_shape {
    int threads; /* 0: not the register path */
};

__host__ __forceinline__ norm_shape norm_reg_shape(int64_t cols, const void *a, const void *b,
                                                   const void *c)
{
    int64_t n4 = cols / 4;
    bool ok = cols % 4 == 0 && n4 >= 1 && n4 <= (int64_t)1024 * NORM_NV &&
              (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0;
    if (!ok)
        return {0};
    int64_t t = (n4 + NORM_NV - 1) / NORM_NV;
    t = (t + 31) / 32 * 32;
    return {(int)(t < 32 ? 32 : t)};
}

/* The weights of the 4 columns from c (cuk_load per element). */
__device__ __forceinline__ float4 norm_w4(const void *w, int wdt, int64_t c)
{
    return make_float4(cuk_load(w, wdt, c), cuk_load(w, wdt, c + 1), cuk_load(w, wdt, c + 2),
                       cuk_load(w, wdt, c + 3));
}

/* x (+ rsd, written back to x when rsd is given), RMS-normalized, times w,
 * into out; one block per row. */
__global__ void __launch_bounds__(1024)
    rms_norm_reg_kernel(float *x, const float *rsd, const void *w, int wdt, int64_t rows,
                        int64_t cols, float eps, float *out, uint16_t *o16)
{
    cuk_pdl_trigger(); /* a GEMV usually follows: let it fetch weights now */
    __shared__ float red[32];
    int64_t n4 = cols / 4;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float4 *xr = (float4 *)(x + r * cols);
        const float4 *rr = rsd ? (const float4 *)(rsd + r * cols) : nullptr;
        float4 v[NORM_NV], wv[NORM_NV];
#pragma unroll
        for (int j = 0; j < NORM_NV; j++) {
            int64_t i = threadIdx.x + (int64_t)j * blockDim.x;
            v[j] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (rr && i < n4) {
                float4 u = rr[i];
                v[j].x += u.x;
                v[j].y += u.y;
                v[j].z += u.z;
                v[j].w += u.w;
            }
            wv[j] = w && i < n4 ? norm_w4(w, wdt, 4 * i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_NV; j++)
            ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        ss = cuk_block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / (float)cols + eps);
        float4 *o = (float4 *)(out + r * cols);
#pragma unroll
        for (int j = 0; j < NORM_NV; j++) {
            int64_t i = threadIdx.x + (int64_t)j * blockDim.x;
            if (i >= n4)
                continue;
            if (rr)
                xr[i] = v[j];
            float4 y = w ? make_float4(v[j].x * scale * wv[j].x, v[j].y * scale * wv[j].y,
                                       v[j].z * scale * wv[j].z, v[j].w * scale * wv[j].w)
                         : make_float4(v[j].x * scale, v[j].y * scale, v[j].z * scale,
                                       v[j].w * scale);
            o[i] = y;
            if (o16)
                cuk_store_bf16x4(o16 + r * cols + 4 * i, y);
        }
    }
}

/* One block per row: sum of squares, then the scaled row. Every element is
 * read by the thread that writes it, after the reduction: in place is safe. */
__global__ void rms_norm_kernel(const float *x, const void *w, int wdt, int64_t rows, int64_t cols,
                                float eps, float *out)
{
    cuk_pdl_trigger(); /* a GEMV usually follows: let it fetch weights now */
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            ss += xr[c] * xr[c];
        ss = cuk_block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / (float)cols + eps);
        float *o = out + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            o[c] = w ? xr[c] * scale * cuk_load(w, wdt, c) : xr[c] * scale;
    }
}

extern "C" cudaError_t cuk_rms_norm(const float *x, const void *w, int wdt, int64_t rows,
                                    int64_t cols, float eps, float *out, cudaStream_t stream)
{
    norm_shape ns = norm_reg_shape(cols, x, out, nullptr);
    if (ns.threads && rows > 0) {
        unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
        rms_norm_reg_kernel<<<g, ns.threads, 0, stream>>>((float *)x, nullptr, w, wdt, rows, cols,
                                                          eps, out, nullptr);
        return cudaGetLastError();
    }
    int threads = cols >= 1024 ? 512 : cols >= 256 ? 256 : 128;
    unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
    rms_norm_kernel<<<g, threads, 0, stream>>>(x, w, wdt, rows, cols, eps, out);
    return cudaGetLastError();
}

/* x += r, then rms_norm_kernel's arithmetic on the new x (the same block
 * size and reduction order, so equal bit for bit to add then rms_norm).
 * Each element of x, r and out is read and written by one thread, r before
 * out: out may be r itself. */
__global__ void add_rms_norm_kernel(float *x, const float *rsd, const void *w, int wdt,
                                    int64_t rows, int64_t cols, float eps, float *out)
{
    cuk_pdl_trigger(); /* a GEMV usually follows: let it fetch weights now */
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *xr = x + r * cols;
        const float *rr = rsd + r * cols;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = xr[c] + rr[c];
            xr[c] = v;
            ss += v * v;
        }
        ss = cuk_block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / (float)cols + eps);
        float *o = out + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            o[c] = w ? xr[c] * scale * cuk_load(w, wdt, c) : xr[c] * scale;
    }
}

extern "C" cudaError_t cuk_add_rms_norm(float *x, const float *r, const void *w, int wdt,
                                        int64_t rows, int64_t cols, float eps, float *out,
                                        cudaStream_t stream)
{
    norm_shape ns = norm_reg_shape(cols, x, r, out);
    if (ns.threads && rows > 0) {
        unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
        rms_norm_reg_kernel<<<g, ns.threads, 0, stream>>>(x, r, w, wdt, rows, cols, eps, out,
                                                          nullptr);
        return cudaGetLastError();
    }
    int threads = cols >= 1024 ? 512 : cols >= 256 ? 256 : 128;
    unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
    add_rms_norm_kernel<<<g, threads, 0, stream>>>(x, r, w, wdt, rows, cols, eps, out);
    return cudaGetLastError();
}

/* One block per (row, group): h = y * silu(z), group RMS, times w. */
__global__ void rms_norm_gated_kernel(const float *y, const float *z, const void *w, int wdt,
                                      int64_t rows, int64_t cols, int64_t groups, float eps,
                                      float *out)
{
    cuk_pdl_trigger(); /* a GEMV usually follows: let it fetch weights now */
    __shared__ float red[32];
    int64_t gs = cols / groups;
    for (int64_t it = blockIdx.x; it < rows * groups; it += gridDim.x) {
        int64_t r = it / groups, g0 = (it % groups) * gs;
        const float *yr = y + r * cols + g0, *zr = z + r * cols + g0;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < gs; c += blockDim.x) {
            float h = yr[c] * silu_f(zr[c]);
            ss += h * h;
        }
        ss = cuk_block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / (float)gs + eps);
        float *o = out + r * cols + g0;
        for (int64_t c = threadIdx.x; c < gs; c += blockDim.x) {
            float h = yr[c] * silu_f(zr[c]);
            o[c] = h * scale * cuk_load(w, wdt, g0 + c);
        }
    }
}

/* rms_norm_gated_kernel's result on the register path (norm_reg_shape over
 * a group): h = y * silu(z) is formed once and kept in registers. */
__global__ void __launch_bounds__(1024)
    rms_norm_gated_reg_kernel(const float *y, const float *z, const void *w, int wdt,
                              int64_t rows, int64_t cols, int64_t groups, float eps, float *out,
                              uint16_t *o16)
{
    cuk_pdl_trigger(); /* a GEMV usually follows: let it fetch weights now */
    __shared__ float red[32];
    int64_t gs = cols / groups, n4 = gs / 4;
    for (int64_t it = blockIdx.x; it < rows * groups; it += gridDim.x) {
        int64_t r = it / groups, g0 = (it % groups) * gs;
        const float4 *yr = (const float4 *)(y + r * cols + g0);
        const float4 *zr = (const float4 *)(z + r * cols + g0);
        float4 h[NORM_NV], wv[NORM_NV];
#pragma unroll
        for (int j = 0; j < NORM_NV; j++) {
            int64_t i = threadIdx.x + (int64_t)j * blockDim.x;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
            wv[j] = a;
            if (i < n4) {
                a = yr[i];
                b = zr[i];
                wv[j] = norm_w4(w, wdt, g0 + 4 * i);
            }
            h[j] = make_float4(a.x * silu_f(b.x), a.y * silu_f(b.y), a.z * silu_f(b.z),
                               a.w * silu_f(b.w));
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_NV; j++)
            ss += h[j].x * h[j].x + h[j].y * h[j].y + h[j].z * h[j].z + h[j].w * h[j].w;
        ss = cuk_block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / (float)gs + eps);
        float4 *o = (float4 *)(out + r * cols + g0);
#pragma unroll
        for (int j = 0; j < NORM_NV; j++) {
            int64_t i = threadIdx.x + (int64_t)j * blockDim.x;
            if (i >= n4)
                continue;
            float4 v = make_float4(h[j].x * scale * wv[j].x, h[j].y * scale * wv[j].y,
                                   h[j].z * scale * wv[j].z, h[j].w * scale * wv[j].w);
            o[i] = v;
            if (o16)
                cuk_store_bf16x4(o16 + r * cols + g0 + 4 * i, v);
        }
    }
}

extern "C" cudaError_t cuk_rms_norm_gated(const float *y, const float *z, const void *w, int wdt,
                                          int64_t rows, int64_t cols, int64_t groups, float eps,
                                          float *out, cudaStream_t stream)
{
    int64_t gs = cols / groups;
    /* group starts stay 16-byte aligned when cols and gs are multiples of 4 */
    norm_shape ns = cols % 4 == 0 ? norm_reg_shape(gs, y, z, out) : norm_shape{0};
    if (ns.threads && rows * groups > 0) {
        int64_t items = rows * groups;
        unsigned g = (unsigned)(items < 65536 * 8 ? items : 65536 * 8);
        rms_norm_gated_reg_kernel<<<g, ns.threads, 0, stream>>>(y, z, w, wdt, rows, cols, groups,
                                                                eps, out, nullptr);
        return cudaGetLastError();
    }
    int threads = gs >= 1024 ? 512 : gs >= 256 ? 256 : gs >= 64 ? 64 : 32;
    int64_t items = rows * groups;
    unsigned g = (unsigned)(items < 65536 * 8 ? items : 65536 * 8);
    rms_norm_gated_kernel<<<g, threads, 0, stream>>>(y, z, w, wdt, rows, cols, groups, eps, out);
    return cudaGetLastError();
}

/* The register-path norms above with a bf16 copy of `out` (o16, the same
 * shape, cuk_f32_to_bf16 of each f32 result, 8-byte aligned) written beside
 * it, for fast-mode prefill GEMMs to read instead of rounding `out` again
 * (backends/cuda/cuda_ops.c, "bf16 shadow"). out is bit for bit what
 * cuk_rms_norm / cuk_add_rms_norm / cuk_rms_norm_gated write (same kernel,
 * block size and order). cudaErrorNotSupported when the register path does
 * not apply (column counts or alignment): the caller launches the plain
 * norm then. r may be NULL (no residual add); groups is used by the gated
 * norm only. */
extern "C" cudaError_t cuk_rms_norm_b16(float *x, const float *r, const void *w, int wdt,
                                        int64_t rows, int64_t cols, float eps, float *out,
                                        uint16_t *o16, cudaStream_t stream)
{
    norm_shape ns = norm_reg_shape(cols, x, r, out);
    if (!ns.threads || rows <= 0 || (uintptr_t)o16 % 8 != 0)
        return cudaErrorNotSupported;
    unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
    rms_norm_reg_kernel<<<g, ns.threads, 0, stream>>>(x, r, w, wdt, rows, cols, eps, out, o16);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_rms_norm_gated_b16(const float *y, const float *z, const void *w,
                                              int wdt, int64_t rows, int64_t cols,
                                              int64_t groups, float eps, float *out,
                                              uint16_t *o16, cudaStream_t stream)
{
    int64_t gs = cols / groups;
    norm_shape ns = cols % 4 == 0 ? norm_reg_shape(gs, y, z, out) : norm_shape{0};
    if (!ns.threads || rows * groups <= 0 || (uintptr_t)o16 % 8 != 0)
        return cudaErrorNotSupported;
    int64_t items = rows * groups;
    unsigned g = (unsigned)(items < 65536 * 8 ? items : 65536 * 8);
    rms_norm_gated_reg_kernel<<<g, ns.threads, 0, stream>>>(y, z, w, wdt, rows, cols, groups,
                                                            eps, out, o16);
    return cudaGetLastError();
}

/* ---- log_softmax, argmax ------------------------------------------------------------------ */

__global__ void log_softmax_kernel(const float *x, int64_t rows, int64_t cols, float *out)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols;
        float m = -INFINITY;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            m = fmaxf(m, xr[c]);
        m = cuk_block_max(m, red);
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            s += expf(xr[c] - m);
        s = cuk_block_sum(s, red);
        float lse = m + logf(s);
        float *o = out + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            o[c] = xr[c] - lse;
    }
}

extern "C" cudaError_t cuk_log_softmax(const float *x, int64_t rows, int64_t cols, float *out,
                                       cudaStream_t stream)
{
    int threads = cols >= 4096 ? 1024 : cols >= 256 ? 256 : 64;
    unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
    log_softmax_kernel<<<g, threads, 0, stream>>>(x, rows, cols, out);
    return cudaGetLastError();
}

/* (value, index) pairs: NaN never wins, larger value wins, then the lower
 * index; index -1 is "none". */
__device__ __forceinline__ void argmax_merge(float &v, int64_t &i, float v2, int64_t i2)
{
    if (i2 < 0)
        return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

#define ARGMAX_UNR 4

__global__ void argmax_kernel(const float *x, int64_t rows, int64_t cols, int32_t *out)
{
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_warps = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols;
        float bv = 0.0f;
        int64_t bi = -1;
        int64_t c0 = 0;
        if (cols % 4 == 0 && (uintptr_t)xr % 16 == 0) {
            /* 16-byte loads, ARGMAX_UNR of them in flight per thread: the
             * scalar loop waited for one 4-byte load per trip, 57 µs a
             * 128256-wide row (the greedy pick of every decode step) */
            const float4 *x4 = (const float4 *)xr;
            int64_t n4 = cols / 4;
            for (int64_t b = threadIdx.x; b < n4; b += (int64_t)blockDim.x * ARGMAX_UNR) {
                float4 v[ARGMAX_UNR];
#pragma unroll
                for (int u = 0; u < ARGMAX_UNR; u++) {
                    int64_t i = b + (int64_t)u * blockDim.x;
                    v[u] = i < n4 ? x4[i] : make_float4(NAN, NAN, NAN, NAN);
                }
#pragma unroll
                for (int u = 0; u < ARGMAX_UNR; u++) {
                    int64_t c = 4 * (b + (int64_t)u * blockDim.x);
                    float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        if (!isnan(e[q]))
                            argmax_merge(bv, bi, e[q], c + q);
                }
            }
            c0 = cols; /* done */
        }
        for (int64_t c = c0 + threadIdx.x; c < cols; c += blockDim.x) {
            float v = xr[c];
            if (!isnan(v))
                argmax_merge(bv, bi, v, c);
        }
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            int64_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            argmax_merge(bv, bi, v2, i2);
        }
        __syncthreads();
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < n_warps; w++)
                argmax_merge(bv, bi, sv[w], si[w]);
            out[r] = bi < 0 ? 0 : (int32_t)bi;
        }
    }
}

extern "C" cudaError_t cuk_argmax(const float *x, int64_t rows, int64_t cols, int32_t *out,
                                  cudaStream_t stream)
{
    int threads = cols >= 4096 ? 1024 : cols >= 256 ? 256 : 32;
    unsigned g = (unsigned)(rows < 65536 * 8 ? rows : 65536 * 8);
    argmax_kernel<<<g, threads, 0, stream>>>(x, rows, cols, out);
    return cudaGetLastError();
}

/* ---- copies ------------------------------------------------------------------------------------ */

__global__ void copy_kernel(const void *src, int sdt, int64_t src_cols, int64_t col0, void *dst,
                            int ddt, int64_t rows, int64_t cols)
{
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        int64_t si = r * src_cols + col0 + c;
        if (sdt == ddt) {
            if (sdt == CUK_F32)
                ((float *)dst)[i] = ((const float *)src)[si];
            else
                ((uint16_t *)dst)[i] = ((const uint16_t *)src)[si];
        } else {
            cuk_store(dst, ddt, i, cuk_load(src, sdt, si));
        }
    }
}

extern "C" cudaError_t cuk_copy(const void *src, int sdt, int64_t src_cols, int64_t col0,
                                void *dst, int ddt, int64_t rows, int64_t cols,
                                cudaStream_t stream)
{
    copy_kernel<<<cuk_grid(rows * cols, 256), 256, 0, stream>>>(src, sdt, src_cols, col0, dst,
                                                                 ddt, rows, cols);
    return cudaGetLastError();
}

/* ---- RoPE ------------------------------------------------------------------------------------- */

/* cos/sin of pos * freq_scale * theta^(-2i/n_rot), in double like the CPU. */
__device__ __forceinline__ void rope_cs(const cuk_rope_args &p, double pos, int i, float &c,
                                        float &s)
{
    double inv = (double)p.freq_scale * pow((double)p.theta_base, -2.0 * i / p.n_rot);
    double sn, cs;
    sincos(pos * inv, &sn, &cs);
    c = (float)cs;
    s = (float)sn;
}

__device__ __forceinline__ void rope_pair_index(const cuk_rope_args &p, int i, int &a, int &b)
{
    if (p.mode == 1) {
        a = i;
        b = i + p.n_rot / 2;
    } else {
        a = 2 * i;
        b = 2 * i + 1;
    }
}

/* Thread per (token, pair): the angle is shared by every head. Then the
 * untouched dimensions are copied when out is not x. */
__global__ void rope_kernel(cuk_rope_args p, const float *x, const int32_t *pos, float *out,
                            int64_t n_tok, int64_t n_heads, int64_t hd)
{
    int half = p.n_rot / 2;
    int64_t n = n_tok * half;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < n;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = it / half;
        int i = (int)(it - t * half);
        float c, s;
        rope_cs(p, (double)pos[t], i, c, s);
        int ia, ib;
        rope_pair_index(p, i, ia, ib);
        for (int64_t h = 0; h < n_heads; h++) {
            int64_t base = (t * n_heads + h) * hd;
            float x0 = x[base + ia], x1 = x[base + ib];
            out[base + ia] = x0 * c - x1 * s;
            out[base + ib] = x0 * s + x1 * c;
        }
    }
    if (out == x || p.n_rot == hd)
        return;
    int64_t rest = hd - p.n_rot;
    int64_t m = n_tok * n_heads * rest;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < m;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = it / rest, d = p.n_rot + (it - row * rest);
        out[row * hd + d] = x[row * hd + d];
    }
}

extern "C" cudaError_t cuk_rope(const cuk_rope_args *p, const float *x, const int32_t *pos,
                                float *out, int64_t n_tok, int64_t n_heads, int64_t head_dim,
                                cudaStream_t stream)
{
    int64_t n = n_tok * (p->n_rot / 2);
    int64_t m = n_tok * n_heads * (head_dim - p->n_rot);
    rope_kernel<<<cuk_grid(n > m ? n : m, 128), 128, 0, stream>>>(*p, x, pos, out, n_tok, n_heads,
                                                                   head_dim);
    return cudaGetLastError();
}

/* Thread per (shifted slot, pair); slots outside the pool are skipped. */
__global__ void rope_shift_kernel(cuk_rope_args p, void *pool, int dt, const int32_t *slot,
                                  const int32_t *delta, int64_t n, int64_t n_slots_total,
                                  int64_t n_kv, int64_t hd)
{
    int half = p.n_rot / 2;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < n * half;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = it / half;
        int i = (int)(it - j * half);
        int32_t sl = slot[j];
        if (sl < 0 || sl >= n_slots_total)
            continue;
        float c, s;
        rope_cs(p, (double)delta[j], i, c, s);
        int ia, ib;
        rope_pair_index(p, i, ia, ib);
        for (int64_t h = 0; h < n_kv; h++) {
            int64_t base = ((int64_t)sl * n_kv + h) * hd;
            float x0 = cuk_load(pool, dt, base + ia), x1 = cuk_load(pool, dt, base + ib);
            cuk_store(pool, dt, base + ia, x0 * c - x1 * s);
            cuk_store(pool, dt, base + ib, x0 * s + x1 * c);
        }
    }
}

extern "C" cudaError_t cuk_rope_shift(const cuk_rope_args *p, void *pool, int dtype,
                                      const int32_t *slot, const int32_t *delta, int64_t n,
                                      int64_t n_slots_total, int64_t n_kv_heads, int64_t head_dim,
                                      cudaStream_t stream)
{
    rope_shift_kernel<<<cuk_grid(n * (p->n_rot / 2), 128), 128, 0, stream>>>(
        *p, pool, dtype, slot, delta, n, n_slots_total, n_kv_heads, head_dim);
    return cudaGetLastError();
}

/* llmem CUDA kernels: the row-block GEMV of one activation row (issue 11,
 * batch-1 decode), out[j] = a · w[j] for the N rows of w [N, K].
 *
 * matmul.cu's GEMV gives each output row to one warp (or, for the
 * 4096-wide outputs, to 4 warps over K segments): at the Bamba-9B shape a
 * warp then holds 4-7 KiB of its row, finishes after one or two rounds of
 * loads, and the launch is two waves of short-lived warps whose ramp and
 * drain cost a quarter of the copy rate (docs/benchmarks.md, "CUDA decode
 * step"). Here a CTA of 256 or 512 threads owns a fixed slice of K: each
 * thread keeps its C 16-byte chunks' worth of the activation in registers
 * for the whole launch, and the CTA walks R weight rows at a time (the
 * grid is one wave, each CTA loops), every thread loading its chunks of
 * the R rows at once, so a whole row is in flight per step; the next rows'
 * loads are issued before this step's reduction (a shuffle tree per warp,
 * then the warps' partial sums added in a fixed order: runs give equal
 * results).
 *
 * Because a CTA sees the whole activation row, an RMS norm of it fuses in
 * for free (each CTA sums the squares of its registers once, Zhang &
 * Sennrich 2019, "Root Mean Square Layer Normalization"), as does the
 * gated norm of Mamba-2 (Dao & Gu 2024, y * silu(z) before the norm;
 * transformers MambaRMSNormGated), and the output can be added to a
 * residual row or be the SwiGLU of two weight rows (Shazeer 2020, "GLU
 * Variants Improve Transformer"). The element arithmetic is that of
 * basic.cu's norm kernels and matmul.cu's SwiGLU GEMV (h * scale * w,
 * g / (1 + e^-g) * u); only the summation order differs.
 */
#include <stdlib.h>

#include "kernels/common.cuh"
#include "kernels/gemv.h"

#define GR_MAX_WARPS 16

__device__ __forceinline__ float gr_silu(float x)
{
    return x / (1.0f + expf(-x));
}

template <bool HINT> __device__ __forceinline__ uint4 gr_load(const uint4 *p)
{
    if (HINT) {
        uint4 v;
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
        return v;
    }
    return __ldg(p);
}

/* This thread's chunks of weight rows [g R, g R + R) (rows past n re-read
 * row n - 1, never stored; chunks past K are zero, as is the activation
 * there). */
template <typename WT, int C, int R, int NW, bool HINT>
__device__ __forceinline__ void gr_fetch(uint4 (&wv)[NW][R][C], const cuk_gemv_rows &p,
                                         int64_t g, int64_t chunks)
{
#pragma unroll
    for (int q = 0; q < NW; q++) {
        const char *base = (const char *)(q ? p.w2 : p.w);
#pragma unroll
        for (int r = 0; r < R; r++) {
            int64_t row = g * R + r < p.n ? g * R + r : p.n - 1;
            const uint4 *wr = (const uint4 *)(base + row * (int64_t)p.k * sizeof(WT));
#pragma unroll
            for (int j = 0; j < C; j++) {
                int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
                wv[q][r][j] = c < chunks ? gr_load<HINT>(wr + c) : make_uint4(0, 0, 0, 0);
            }
        }
    }
}

/* This thread's norm weights (1 past K or without a weight): one 16-byte
 * load per chunk when the weight has the matrix's element size and is
 * 16-byte aligned, else element by element. */
template <typename WT, int C>
__device__ __forceinline__ void gr_norm_weight(const cuk_gemv_rows &p, int64_t chunks,
                                               float (&wn)[C][cuk_unpack16<WT>::n])
{
    constexpr int E = cuk_unpack16<WT>::n;
    bool same = p.nw && (uintptr_t)p.nw % 16 == 0 && p.nwdt == cuk_elem<WT>::code;
#pragma unroll
    for (int j = 0; j < C; j++) {
        int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
        if (same && c < chunks) {
            cuk_unpack16<WT>::run(__ldg((const uint4 *)p.nw + c), wn[j]);
            continue;
        }
#pragma unroll
        for (int e = 0; e < E; e++)
            wn[j][e] = p.nw && c < chunks ? cuk_load(p.nw, p.nwdt, c * E + e) : 1.0f;
    }
}

/* One step: the products of rows [g R, g R + R) with this thread's
 * activation, then (when gn < ngroups) the loads of step gn into wv, then
 * the block reduction through red and the epilogue. */
template <typename WT, int C, int R, int NW, bool HINT>
__device__ __forceinline__ void gr_step(uint4 (&wv)[NW][R][C],
                                        const float (&av)[C][cuk_unpack16<WT>::n],
                                        float (&red)[GR_MAX_WARPS][NW * R],
                                        const cuk_gemv_rows &p, int64_t g, int64_t gn,
                                        int64_t ngroups, int64_t chunks)
{
    constexpr int E = cuk_unpack16<WT>::n;
    /* the residual add's input, loaded now so that its latency hides
     * behind the products and the reduction */
    float prev = 0.0f;
    if (NW == 1 && p.epi == CUK_GE_ADD && threadIdx.x < R && g * R + threadIdx.x < p.n)
        prev = p.out[g * R + threadIdx.x];
    float acc[NW][R];
#pragma unroll
    for (int q = 0; q < NW; q++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[q][r] = 0.0f;
#pragma unroll
    for (int j = 0; j < C; j++)
#pragma unroll
        for (int q = 0; q < NW; q++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wf[E];
                cuk_unpack16<WT>::run(wv[q][r][j], wf);
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[q][r] = fmaf(av[j][e], wf[e], acc[q][r]);
            }
    if (gn < ngroups)
        gr_fetch<WT, C, R, NW, HINT>(wv, p, gn, chunks);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int q = 0; q < NW; q++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float s = cuk_warp_sum(acc[q][r]);
            if (lane == 0)
                red[warp][q * R + r] = s;
        }
    __syncthreads();
    if (threadIdx.x < R) {
        int64_t row = g * R + threadIdx.x;
        if (row < p.n) {
            int nw = blockDim.x >> 5;
            float s = 0.0f, u = 0.0f;
            for (int w = 0; w < nw; w++) {
                s += red[w][threadIdx.x];
                if (NW == 2)
                    u += red[w][R + threadIdx.x];
            }
            if (NW == 2)
                p.out[row] = s / (1.0f + expf(-s)) * u;
            else if (p.epi == CUK_GE_ADD)
                p.out[row] = prev + s;
            else
                p.out[row] = s;
        }
    }
}

template <typename WT, int C, int R, int NW, bool PIPE, bool HINT>
__global__ void __launch_bounds__(GR_MAX_WARPS * 32) gemv_rows_kernel(cuk_gemv_rows p)
{
    /* activation row blockIdx.y, on its own */
    p.x += (int64_t)blockIdx.y * p.k;
    if (p.z)
        p.z += (int64_t)blockIdx.y * p.k;
    p.out += (int64_t)blockIdx.y * p.n;
    constexpr int E = cuk_unpack16<WT>::n;
    __shared__ float red[2][GR_MAX_WARPS][NW * R];
    __shared__ float red0[32];
    int64_t chunks = p.k / E, ngroups = (p.n + R - 1) / R;
    int64_t g = blockIdx.x, G = gridDim.x;
    if (g >= ngroups)
        return;
    /* the first rows' weights stream while the activation row is formed */
    uint4 wa[NW][R][C];
    gr_fetch<WT, C, R, NW, HINT>(wa, p, g, chunks);
    /* under a programmatic launch (LLMEM_CUDA_GEMV_PDL=1) the weights above
     * stream while the kernel before finishes; x, z and out only after it */
    cuk_pdl_wait();
    float av[C][E];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < C; j++) {
        int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
#pragma unroll
        for (int e4 = 0; e4 < E / 4; e4++) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (c < chunks) {
                v = ((const float4 *)(p.x + c * E))[e4];
                if (p.norm == CUK_GN_GATED) {
                    float4 zv = ((const float4 *)(p.z + c * E))[e4];
                    v = make_float4(v.x * gr_silu(zv.x), v.y * gr_silu(zv.y),
                                    v.z * gr_silu(zv.z), v.w * gr_silu(zv.w));
                }
            }
            av[j][4 * e4] = v.x;
            av[j][4 * e4 + 1] = v.y;
            av[j][4 * e4 + 2] = v.z;
            av[j][4 * e4 + 3] = v.w;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    }
    if (p.norm != CUK_GN_NONE) {
        /* the norm weight loads are issued before the reduction waits */
        float wn[C][E];
        gr_norm_weight<WT, C>(p, chunks, wn);
        ss = cuk_block_sum(ss, red0);
        float scale = 1.0f / sqrtf(ss / (float)p.k + p.eps);
#pragma unroll
        for (int j = 0; j < C; j++)
#pragma unroll
            for (int e = 0; e < E; e++)
                av[j][e] = p.nw ? av[j][e] * scale * wn[j][e] : av[j][e] * scale;
    }
    int buf = 0;
    if (!PIPE) {
        for (;;) {
            if (g + G >= ngroups) /* the last step: the next kernel may start */
                cuk_pdl_trigger();
            gr_step<WT, C, R, NW, HINT>(wa, av, red[buf], p, g, g + G, ngroups, chunks);
            buf ^= 1;
            g += G;
            if (g >= ngroups)
                break;
        }
    } else {
        uint4 wb[NW][R][C];
        for (;;) {
            if (g + G < ngroups)
                gr_fetch<WT, C, R, NW, HINT>(wb, p, g + G, chunks);
            gr_step<WT, C, R, NW, HINT>(wa, av, red[buf], p, g, ngroups, ngroups, chunks);
            buf ^= 1;
            g += G;
            if (g >= ngroups)
                break;
            if (g + G < ngroups)
                gr_fetch<WT, C, R, NW, HINT>(wa, p, g + G, chunks);
            gr_step<WT, C, R, NW, HINT>(wb, av, red[buf], p, g, ngroups, ngroups, chunks);
            buf ^= 1;
            g += G;
            if (g >= ngroups)
                break;
        }
    }
}

static int gr_sm_count(void)
{
    static int n = 0;
    if (n == 0) {
        int dev = 0, c = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
            c > 0)
            n = c;
        else
            return 1;
    }
    return n;
}

/* Whether the row-block GEMV is launched as a programmatic dependent of
 * the kernel before it: $LLMEM_CUDA_GEMV_PDL=1 on a device of compute
 * capability 9.0 or later (default off). */
static bool gr_pdl_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_PDL");
        int dev = 0, major = 0;
        on = e && atoi(e) == 1 && cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                 cudaSuccess &&
             major >= 9;
    }
    return on == 1;
}

template <typename WT, int C, int R, int NW, bool PIPE, bool HINT>
static cudaError_t gr_launch(const cuk_gemv_rows *p, int threads, int per_sm,
                             cudaStream_t stream)
{
    auto kern = gemv_rows_kernel<WT, C, R, NW, PIPE, HINT>;
    static int occ_of[2]; /* CTAs per SM at 256 and 512 threads, asked once */
    int &occ_c = occ_of[threads == 512];
    if (occ_c == 0) {
        int o = 0;
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, threads, 0);
        if (e != cudaSuccess)
            return e;
        occ_c = o < 1 ? 1 : o;
    }
    int occ = occ_c;
    if (per_sm > 0 && per_sm < occ)
        occ = per_sm;
    int64_t ngroups = (p->n + R - 1) / R, grid = (int64_t)gr_sm_count() * occ;
    if (grid > ngroups)
        grid = ngroups;
    dim3 gd((unsigned)grid, (unsigned)(p->m > 1 ? p->m : 1));
    if (!gr_pdl_on()) {
        kern<<<gd, threads, 0, stream>>>(*p);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = gd;
    cfg.blockDim = dim3(threads);
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, *p);
}

/* The launch shapes this build instantiates: all of them for the tuning
 * harness (kernels/bench_gemv.cu, -DCUK_GEMV_ROWS_ALL), else the default
 * (1 or 2 rows per step, not pipelined, hinted loads; docs/benchmarks.md
 * "Batch-1 GEMV and fused norms"). */
#ifdef CUK_GEMV_ROWS_ALL
#define GR_R_LIST(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(4, __VA_ARGS__)
#else
#define GR_R_LIST(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__)
#endif

template <typename WT, int C, int NW>
static cudaError_t gr_pick(const cuk_gemv_rows *p, const cuk_gemv_rows_cfg *c, cudaStream_t s)
{
#ifdef CUK_GEMV_ROWS_ALL
#define GR_CASE(RR, ...)                                                                     \
    if (c->rows == RR) {                                                                     \
        if (c->pipe && c->hint)                                                              \
            return gr_launch<WT, C, RR, NW, true, true>(p, c->threads, c->ctas_per_sm, s);   \
        if (c->pipe)                                                                         \
            return gr_launch<WT, C, RR, NW, true, false>(p, c->threads, c->ctas_per_sm, s);  \
        if (c->hint)                                                                         \
            return gr_launch<WT, C, RR, NW, false, true>(p, c->threads, c->ctas_per_sm, s);  \
        return gr_launch<WT, C, RR, NW, false, false>(p, c->threads, c->ctas_per_sm, s);     \
    }
#else
#define GR_CASE(RR, ...)                                                                     \
    if (c->rows == RR && !c->pipe && c->hint)                                                \
        return gr_launch<WT, C, RR, NW, false, true>(p, c->threads, c->ctas_per_sm, s);
#endif
    GR_R_LIST(GR_CASE, 0)
#undef GR_CASE
    return cudaErrorNotSupported;
}

template <typename WT>
static cudaError_t gr_dispatch(const cuk_gemv_rows *p, const cuk_gemv_rows_cfg *cfg,
                               cudaStream_t s)
{
    constexpr int E = cuk_unpack16<WT>::n;
    int64_t chunks = p->k / E;
    int C = chunks <= 512 ? 1 : chunks <= 1024 ? 2 : 4;
    int threads = cfg->threads;
    if (threads == 0)
        threads = chunks <= (int64_t)C * 256 ? 256 : 512;
    if ((threads != 256 && threads != 512) || chunks > (int64_t)C * threads) {
        /* a 256-thread CTA for a slice that needs more chunks per thread */
        if (threads == 256 && chunks <= 4 * 256)
            C = chunks <= 512 ? 2 : 4;
        else
            return cudaErrorNotSupported;
    }
    cuk_gemv_rows_cfg c = *cfg;
    c.threads = threads;
    bool two = p->epi == CUK_GE_SWIGLU;
    if (C == 1)
        return two ? gr_pick<WT, 1, 2>(p, &c, s) : gr_pick<WT, 1, 1>(p, &c, s);
    if (C == 2)
        return two ? gr_pick<WT, 2, 2>(p, &c, s) : gr_pick<WT, 2, 1>(p, &c, s);
    return two ? gr_pick<WT, 4, 2>(p, &c, s) : gr_pick<WT, 4, 1>(p, &c, s);
}

extern "C" int cuk_gemv_rows_ok(const cuk_gemv_rows *p)
{
    if (!p || !p->x || !p->w || !p->out || p->n < 1 || p->k < 1 || p->m < 0 ||
        p->m > CUK_GEMV_MAX_M)
        return 0;
    if (p->wdt != CUK_F32 && p->wdt != CUK_F16 && p->wdt != CUK_BF16)
        return 0;
    int E = p->wdt == CUK_F32 ? 4 : 8;
    if (p->k % E || p->k / E > 4 * 512)
        return 0;
    if ((uintptr_t)p->x % 16 || (uintptr_t)p->w % 16)
        return 0;
    if (p->norm == CUK_GN_GATED && (!p->z || (uintptr_t)p->z % 16))
        return 0;
    if (p->norm < CUK_GN_NONE || p->norm > CUK_GN_GATED)
        return 0;
    if (p->epi == CUK_GE_SWIGLU && (!p->w2 || (uintptr_t)p->w2 % 16))
        return 0;
    return p->epi >= CUK_GE_STORE && p->epi <= CUK_GE_SWIGLU;
}

extern "C" cudaError_t cuk_gemv_rows_tuned(const cuk_gemv_rows *p, const cuk_gemv_rows_cfg *cfg,
                                           cudaStream_t stream)
{
    if (!cuk_gemv_rows_ok(p))
        return cudaErrorNotSupported;
    switch (p->wdt) {
    case CUK_F32: return gr_dispatch<float>(p, cfg, stream);
    case CUK_F16: return gr_dispatch<cuk_f16_t>(p, cfg, stream);
    default: return gr_dispatch<cuk_bf16_t>(p, cfg, stream);
    }
}

/* The default launch shape, from the H200 sweep (docs/benchmarks.md,
 * "Batch-1 GEMV and fused norms"): 2 rows per step, the threads that hold K in the
 * fewest chunks each, loads hinted, not pipelined (the pipelined loop
 * doubles the weight registers and lost up to 20 points of copy); the
 * vocabulary-sized outputs 1 row per step on 256 threads (lm_head 241.8
 * against 256.5 us). */
extern "C" cudaError_t cuk_gemv_rows_run(const cuk_gemv_rows *p, cudaStream_t stream)
{
    /* tuning overrides, read once: $LLMEM_CUDA_GEMV_THREADS (256 or 512) and
     * $LLMEM_CUDA_GEMV_R (1 or 2) for every shape */
    static int env_t = -1, env_r = -1;
    if (env_t < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_THREADS");
        int v = e ? atoi(e) : 0;
        env_t = v == 256 || v == 512 ? v : 0;
        e = getenv("LLMEM_CUDA_GEMV_R");
        v = e ? atoi(e) : 0;
        env_r = v == 1 || v == 2 ? v : 0;
    }
    cuk_gemv_rows_cfg c = {0, 2, 0, 0, 1};
    if (p && p->n >= 65536 && p->epi != CUK_GE_SWIGLU) {
        c.threads = 256;
        c.rows = 1;
    }
    if (env_t)
        c.threads = env_t;
    if (env_r)
        c.rows = env_r;
    cudaError_t e = cuk_gemv_rows_tuned(p, &c, stream);
    if (e == cudaErrorNotSupported && c.threads == 256) { /* K too long for 256 threads */
        c.threads = 0;
        e = cuk_gemv_rows_tuned(p, &c, stream);
    }
    return e;
}

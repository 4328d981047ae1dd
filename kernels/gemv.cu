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
 * for free (Zhang & Sennrich 2019, "Root Mean Square Layer
 * Normalization"), as does the gated norm of Mamba-2 (Dao & Gu 2024,
 * y * silu(z) before the norm; transformers MambaRMSNormGated): the norm
 * is one scalar r per row, so the products run on h * nw and r scales
 * each output in the epilogue, the sum of squares of h riding on the first
 * step's block reduction (no reduction before the first products). The
 * output can be added to a residual row or be the SwiGLU of two weight
 * rows (Shazeer 2020, "GLU Variants Improve Transformer"). The element
 * arithmetic is that of basic.cu's norm kernels and matmul.cu's SwiGLU
 * GEMV up to rounding (r (h * nw · w) for (h r nw) · w, g / (1 + e^-g) *
 * u); the summation order differs.
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

/* Whether the norm weight is read 16 bytes at a time: it has the
 * matrix's element size and is 16-byte aligned. */
template <typename WT> __device__ __forceinline__ bool gr_norm_fast(const cuk_gemv_rows &p)
{
    return p.nw && (uintptr_t)p.nw % 16 == 0 && p.nwdt == cuk_elem<WT>::code;
}

/* This thread's chunks of the norm weight, still packed, when
 * gr_norm_fast (issued with the first weight rows: it is read-only). */
template <typename WT, int C>
__device__ __forceinline__ void gr_norm_fetch(const cuk_gemv_rows &p, int64_t chunks,
                                              uint4 (&nr)[C])
{
    bool fast = gr_norm_fast<WT>(p);
#pragma unroll
    for (int j = 0; j < C; j++) {
        int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
        nr[j] = fast && c < chunks ? __ldg((const uint4 *)p.nw + c) : make_uint4(0, 0, 0, 0);
    }
}

/* av *= the norm weight (1 past K or without a weight): from nr when
 * gr_norm_fast, else element by element. */
template <typename WT, int C>
__device__ __forceinline__ void gr_norm_apply(const cuk_gemv_rows &p, int64_t chunks,
                                              const uint4 (&nr)[C],
                                              float (&av)[C][cuk_unpack16<WT>::n])
{
    constexpr int E = cuk_unpack16<WT>::n;
    bool fast = gr_norm_fast<WT>(p);
#pragma unroll
    for (int j = 0; j < C; j++) {
        int64_t c = threadIdx.x + (int64_t)j * blockDim.x;
        if (c >= chunks || !p.nw)
            continue;
        float wn[E];
        if (fast) {
            cuk_unpack16<WT>::run(nr[j], wn);
        } else {
#pragma unroll
            for (int e = 0; e < E; e++)
                wn[e] = cuk_load(p.nw, p.nwdt, c * E + e);
        }
#pragma unroll
        for (int e = 0; e < E; e++)
            av[j][e] *= wn[e];
    }
}

/* One step: the products of rows [g R, g R + R) with this thread's
 * activation, then (when gn < ngroups) the loads of step gn into wv, then
 * the block reduction through red and the epilogue. */
template <typename WT, int C, int R, int NW, bool HINT>
__device__ __forceinline__ void gr_step(uint4 (&wv)[NW][R][C],
                                        const float (&av)[C][cuk_unpack16<WT>::n],
                                        float (&red)[GR_MAX_WARPS][NW * R + 1],
                                        const cuk_gemv_rows &p, int64_t g, int64_t gn,
                                        int64_t ngroups, int64_t chunks, bool first, float ss,
                                        float &rs)
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
    /* the first step of a normed row also reduces the norm's sum of
     * squares (first is the same in every thread) */
    if (first) {
        ss = cuk_warp_sum(ss);
        if (lane == 0)
            red[warp][NW * R] = ss;
    }
    __syncthreads();
    if (threadIdx.x < R) {
        int nw = blockDim.x >> 5;
        if (first) {
            float t = 0.0f;
            for (int w = 0; w < nw; w++)
                t += red[w][NW * R];
            rs = 1.0f / sqrtf(t / (float)p.k + p.eps);
        }
        int64_t row = g * R + threadIdx.x;
        if (row < p.n) {
            float s = 0.0f, u = 0.0f;
            for (int w = 0; w < nw; w++) {
                s += red[w][threadIdx.x];
                if (NW == 2)
                    u += red[w][R + threadIdx.x];
            }
            s *= rs;
            u *= rs;
            if (NW == 2)
                p.out[row] = s / (1.0f + expf(-s)) * u;
            else if (p.epi == CUK_GE_ADD)
                p.out[row] = prev + s;
            else
                p.out[row] = s;
        }
    }
}

/* L2 prefetch of the weight rows of group g (w, and w2 when NW = 2), one
 * bulk prefetch per matrix issued by thread 0 (sm_90 and later; no
 * register, no fault, nothing past row n). */
template <typename WT, int R, int NW>
__device__ __forceinline__ void gr_prefetch(const cuk_gemv_rows &p, int64_t g)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0 || g * R >= p.n)
        return;
    int64_t rows = p.n - g * R < R ? p.n - g * R : R;
    uint32_t bytes = (uint32_t)(rows * p.k * (int64_t)sizeof(WT));
#pragma unroll
    for (int q = 0; q < NW; q++) {
        const char *row = (const char *)(q ? p.w2 : p.w) + g * R * p.k * (int64_t)sizeof(WT);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row), "r"(bytes)
                     : "memory");
    }
#endif
}

/* Registers: the one-chunk, one-matrix shapes (K up to 4096 bf16 on 256
 * threads: in_proj, attention, lm_head) are held to 40 registers, so 6
 * CTAs of 256 threads share an SM; at 48 (5 CTAs) in_proj ran 2 us
 * slower (docs/benchmarks.md, "Batch-1 step: norms in the epilogue"). The
 * other shapes' counts move with any edit of this file (out_proj's 64 at
 * 71 cost the batch-1 step 0.17 ms): tests/gemv_registers.sh checks the
 * decode shapes' CTAs per SM. */
#define GR_MIN_CTAS(C, NW) ((C) == 1 && (NW) == 1 ? 3 : 1)

template <typename WT, int C, int R, int NW, bool PIPE, bool HINT>
__global__ void __launch_bounds__(GR_MAX_WARPS * 32, GR_MIN_CTAS(C, NW))
    gemv_rows_kernel(cuk_gemv_rows p)
{
    /* activation row blockIdx.y, on its own */
    p.x += (int64_t)blockIdx.y * p.k;
    if (p.z)
        p.z += (int64_t)blockIdx.y * p.k;
    p.out += (int64_t)blockIdx.y * p.n;
    constexpr int E = cuk_unpack16<WT>::n;
    __shared__ float red[2][GR_MAX_WARPS][NW * R + 1];
    int64_t chunks = p.k / E, ngroups = (p.n + R - 1) / R;
    int64_t g = blockIdx.x, G = gridDim.x;
    if (g >= ngroups)
        return;
    /* the first rows' weights and the norm weight stream while the
     * activation row is formed */
    uint4 wa[NW][R][C];
    gr_fetch<WT, C, R, NW, HINT>(wa, p, g, chunks);
    /* and the rows of the next pf steps into L2 (bytes in flight beyond
     * what the registers hold) */
    for (int d = 1; d <= p.pf; d++)
        gr_prefetch<WT, R, NW>(p, g + d * G);
    uint4 nr[C];
    if (p.norm != CUK_GN_NONE)
        gr_norm_fetch<WT, C>(p, chunks, nr);
    /* under a programmatic launch the weights above stream while the
     * kernel before finishes; x, z and out only after it */
    cuk_pdl_wait();
    if (p.trig) /* early trigger: the next GEMV may fetch its weights now */
        cuk_pdl_trigger();
    /* The norm is one scalar per activation row, r = 1 / sqrt(mean(g²) +
     * eps): the products run on g * nw and r scales each output in the
     * epilogue, so no block reduction stands between the activation's
     * loads and the first products; the sum of squares rides on the first
     * step's reduction. */
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
    if (p.norm != CUK_GN_NONE)
        gr_norm_apply<WT, C>(p, chunks, nr, av);
    bool first = p.norm != CUK_GN_NONE; /* else r stays 1 */
    float rs = 1.0f;
    int buf = 0;
    if (!PIPE) {
        for (;;) {
            if (!p.trig && g + G >= ngroups) /* the last step: the next kernel may start */
                cuk_pdl_trigger();
            if (p.pf)
                gr_prefetch<WT, R, NW>(p, g + (p.pf + 1) * G);
            gr_step<WT, C, R, NW, HINT>(wa, av, red[buf], p, g, g + G, ngroups, chunks, first, ss,
                                        rs);
            first = false;
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
            gr_step<WT, C, R, NW, HINT>(wa, av, red[buf], p, g, ngroups, ngroups, chunks, first,
                                        ss, rs);
            first = false;
            buf ^= 1;
            g += G;
            if (g >= ngroups)
                break;
            if (g + G < ngroups)
                gr_fetch<WT, C, R, NW, HINT>(wa, p, g + G, chunks);
            gr_step<WT, C, R, NW, HINT>(wb, av, red[buf], p, g, ngroups, ngroups, chunks, false,
                                        ss, rs);
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

/* How the row-block GEMV is launched ($LLMEM_CUDA_GEMV_PDL, read once;
 * programmatic launches only on a device of compute capability 9.0 or
 * later, and only while the stream is being captured into a recorded
 * step): 1 (the default) as a programmatic dependent of the kernel before
 * it, so that its CTAs take the SMs as that kernel's CTAs leave and load
 * their first weight rows before they wait for it, each CTA letting the
 * next kernel launch at its last step; 2 the same, each CTA letting the
 * next kernel launch as soon as its own wait returns; 0 a plain launch.
 * On the H200 the Bamba-9B batch-1 step took 5.206 ms with 0, 5.161 with
 * 1, no less with 2 (docs/benchmarks.md, "Batch-1 step: norms in the
 * epilogue"). */
static int gr_pdl_mode(void)
{
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_PDL");
        int v = e ? atoi(e) : 1, dev = 0, major = 0;
        mode = (v == 1 || v == 2) && cudaGetDevice(&dev) == cudaSuccess &&
                       cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                           cudaSuccess &&
                       major >= 9
                   ? v
                   : 0;
    }
    return mode;
}

/* How many steps ahead of its loads each CTA prefetches its next weight
 * rows into L2 (one bulk prefetch per step): $LLMEM_CUDA_GEMV_PF (0-4,
 * read once; default 0, the only choice before compute capability 9.0).
 * On the H200 1-3 cost 10-15 points of copy (docs/benchmarks.md, "Batch-1
 * step: norms in the epilogue"); kept for other devices' tuning. */
static int gr_pf_steps(void)
{
    static int pf = -1;
    if (pf < 0) {
        const char *e = getenv("LLMEM_CUDA_GEMV_PF");
        int v = e ? atoi(e) : 0, dev = 0, major = 0;
        pf = v >= 1 && v <= 4 && cudaGetDevice(&dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                         cudaSuccess &&
                     major >= 9
                 ? v
                 : 0;
    }
    return pf;
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
    /* programmatic only while a step is recorded: the weights are read
     * before the wait, and a step's kernels write no weights, where an
     * eager caller's kernel just before might (a conversion, say) */
    int mode = gr_pdl_mode();
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (mode != 0 && cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError(); /* not a launch error: launch it plainly */
        cs = cudaStreamCaptureStatusNone;
    }
    if (cs != cudaStreamCaptureStatusActive)
        mode = 0;
    cuk_gemv_rows q = *p;
    q.trig = mode == 2;
    q.pf = gr_pf_steps();
    return cuk_launch_dep(kern, gd, (unsigned)threads, 0, stream, mode != 0, q);
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

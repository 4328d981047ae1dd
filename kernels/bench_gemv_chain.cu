/* Stand-alone timing of the row-block GEMV (kernels/gemv.cu) as the
 * Bamba-9B decode step runs it: a chain of Mamba-2 layers recorded in one
 * CUDA graph, each layer in_proj (16768 x 4096, RMS norm in), a stand-in
 * for the decode conv + scan (reads in_proj's output and a 4 MiB state,
 * writes the state and y), out_proj (4096 x 8192, gated norm in, residual
 * add), FFN gate/up (2 x 14336 x 4096, RMS norm in, SwiGLU) and down
 * (4096 x 14336, residual add), bf16 weights, M = 1 (not part of the
 * build; docs/benchmarks.md "Batch-1 step: norms in the epilogue"). Build:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. kernels/bench_gemv_chain.cu \
 *        kernels/gemv.cu -o bench_gemv_chain
 * Run: bench_gemv_chain [MIX] with MIX 0 (the stand-in is a plain launch),
 * 1 (a programmatic launch that triggers at its end) or 2 (one that
 * triggers as soon as its wait returns); the GEMVs' launch follows
 * $LLMEM_CUDA_GEMV_PDL and $LLMEM_CUDA_GEMV_PF (kernels/gemv.cu; the graph
 * is a recorded step, so the programmatic launches apply). Prints the median of
 * 10 replays per layer against the copy rate of the same process, and a
 * hash of the final residual row after one replay from a fixed start
 * (equal hashes across launch modes: no read ran before its producer). */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/gemv.h"

#include "kernels/bench_common.cuh"

enum { L = 8, H = 4096, DI = 8192, NP = 16768, FF = 14336, NH = 128, HD = 64, DS = 128 };

/* The conv + scan stand-in: CTA hd owns head hd's 64 x 128 f32 state;
 * 4 threads per state row, s = 0.9 s + 0.1 tanh(x), y = tanh(sum s / 16 +
 * x) (fixed-order sums: runs give equal results). */
__global__ void __launch_bounds__(256) mix_kernel(const float *zx, float *state, float *y, int trig)
{
    cuk_pdl_wait();
    if (trig)
        cuk_pdl_trigger();
    int hd = blockIdx.x, row = threadIdx.x >> 2, part = threadIdx.x & 3;
    float x = zx[DI + hd * HD + row];
    float *s = state + ((size_t)hd * HD + row) * DS + part * 32;
    float acc = 0.0f;
    for (int i = 0; i < 32; i += 4) {
        float4 v = *(float4 *)(s + i);
        float t = 0.1f * tanhf(x + 0.01f * i);
        v = make_float4(0.9f * v.x + t, 0.9f * v.y + t, 0.9f * v.z + t, 0.9f * v.w + t);
        *(float4 *)(s + i) = v;
        acc += v.x + v.y + v.z + v.w;
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    if (part == 0)
        y[hd * HD + row] = tanhf(acc / 16.0f + x);
}

int main(int argc, char **argv)
{
    int mix = argc > 1 ? atoi(argv[1]) : 0;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double copy_bw = bench_copy_bw(st, e0, e1);
    struct layer {
        uint16_t *nin, *win, *wout, *nout, *nff, *wg, *wu, *wd;
        float *state;
    } ly[L];
    size_t wbytes = 0;
    auto wt = [&](size_t n, uint32_t seed, float amp) {
        uint16_t *p;
        CK(cudaMalloc(&p, n * 2));
        bench_fill_bf16<<<1024, 256, 0, st>>>(p, n, seed, amp);
        return p;
    };
    for (int l = 0; l < L; l++) {
        uint32_t s = 1000u * l;
        ly[l].nin = wt(H, s + 1, 1.0f);
        ly[l].win = wt((size_t)NP * H, s + 2, 0.05f);
        ly[l].nout = wt(DI, s + 3, 1.0f);
        ly[l].wout = wt((size_t)H * DI, s + 4, 0.05f);
        ly[l].nff = wt(H, s + 5, 1.0f);
        ly[l].wg = wt((size_t)FF * H, s + 6, 0.05f);
        ly[l].wu = wt((size_t)FF * H, s + 7, 0.05f);
        ly[l].wd = wt((size_t)H * FF, s + 8, 0.05f);
        CK(cudaMalloc(&ly[l].state, (size_t)NH * HD * DS * 4));
        CK(cudaMemsetAsync(ly[l].state, 0, (size_t)NH * HD * DS * 4, st));
        wbytes += 2 * ((size_t)NP * H + (size_t)H * DI + 3 * (size_t)FF * H + H + DI + H);
    }
    float *h, *h0, *zx, *y, *act;
    CK(cudaMalloc(&h, H * 4));
    CK(cudaMalloc(&h0, H * 4));
    CK(cudaMalloc(&zx, NP * 4));
    CK(cudaMalloc(&y, DI * 4));
    CK(cudaMalloc(&act, FF * 4));
    std::vector<float> hh(H);
    for (int i = 0; i < H; i++)
        hh[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    CK(cudaMemcpy(h0, hh.data(), H * 4, cudaMemcpyHostToDevice));
    CK(cudaStreamSynchronize(st));

    auto gemv = [&](const float *x, const float *z, const uint16_t *nw, int norm, const uint16_t *w,
                    const uint16_t *w2, int epi, float *out, int n, int k) {
        cuk_gemv_rows p = {};
        p.x = x;
        p.z = z;
        p.nw = nw;
        p.nwdt = 2;
        p.norm = norm;
        p.eps = 1e-5f;
        p.w = w;
        p.w2 = w2;
        p.wdt = 2;
        p.epi = epi;
        p.out = out;
        p.m = 1;
        p.n = n;
        p.k = k;
        CK(cuk_gemv_rows_run(&p, st));
    };
    auto mix_launch = [&](float *state) {
        if (mix == 0) {
            mix_kernel<<<NH, 256, 0, st>>>(zx, state, y, 0);
            CK(cudaGetLastError());
            return;
        }
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(NH);
        cfg.blockDim = dim3(256);
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, mix_kernel, (const float *)zx, state, y, mix == 2 ? 1 : 0));
    };

    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < L; l++) {
        layer &a = ly[l];
        gemv(h, nullptr, a.nin, CUK_GN_RMS, a.win, nullptr, CUK_GE_STORE, zx, NP, H);
        mix_launch(a.state);
        gemv(y, zx, a.nout, CUK_GN_GATED, a.wout, nullptr, CUK_GE_ADD, h, H, DI);
        gemv(h, nullptr, a.nff, CUK_GN_RMS, a.wg, a.wu, CUK_GE_SWIGLU, act, FF, H);
        gemv(act, nullptr, nullptr, CUK_GN_NONE, a.wd, nullptr, CUK_GE_ADD, h, H, FF);
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));

    /* one replay from a fixed start, hashed */
    CK(cudaMemcpyAsync(h, h0, H * 4, cudaMemcpyDeviceToDevice, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(hh.data(), h, H * 4, cudaMemcpyDeviceToHost));
    uint64_t hash = 1469598103934665603ull;
    double sum = 0;
    for (int i = 0; i < H; i++) {
        uint32_t u;
        memcpy(&u, &hh[i], 4);
        hash = (hash ^ u) * 1099511628211ull;
        sum += fabs(hh[i]);
    }

    std::vector<float> t;
    for (int i = 0; i < 13; i++) {
        CK(cudaMemcpyAsync(h, h0, H * 4, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3)
            t.push_back(ms);
    }
    double us = bench_median(t) * 1e3 / L;
    const char *pdl = getenv("LLMEM_CUDA_GEMV_PDL"), *pf = getenv("LLMEM_CUDA_GEMV_PF");
    printf("chain pdl=%s pf=%s mix=%d: %.2f us per layer, weights %.1f%% of copy (%.0f GB/s), "
           "h sum|.| %.6f hash %016llx\n",
           pdl ? pdl : "-", pf ? pf : "-", mix, us, 100.0 * wbytes / L / (us * 1e-6) / copy_bw,
           copy_bw / 1e9, sum, (unsigned long long)hash);
    return 0;
}

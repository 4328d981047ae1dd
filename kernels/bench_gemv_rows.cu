/* Stand-alone tuning of the row-block GEMV (kernels/gemv.cu) at the matmul
 * shapes of the Bamba-9B decode step (M = 1), against matmul.cu's GEMV and
 * a device copy of the same bytes (not part of the build; docs/benchmarks.md
 * "Batch-1 GEMV and fused norms" has the figures). Build:
 *   nvcc -O3 -std=c++17 -arch=sm_90a -DCUK_GEMV_ROWS_ALL -I. \
 *        kernels/bench_gemv_rows.cu kernels/gemv.cu kernels/matmul.cu kernels/basic.cu \
 *        -o bench_gemv_rows
 * For every shape and launch shape: the mean of 20 back-to-back launches
 * (5 repeats, median), rotating over weight copies larger than the L2, as
 * a fraction of the copy bandwidth (bytes read + written per second), and
 * the largest error against a float64 product on the host (relative to
 * sum |a w| of the row). Then the fused variants (norm in, residual add or
 * SwiGLU out) at the default launch shape, checked the same way. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/gemv.h"

#include "kernels/bench_common.cuh"

static float bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double copy_bw;
static cudaStream_t st;
static cudaEvent_t e0, e1;

template <typename F> static double time_us(F launch)
{
    return bench_time_ms(st, e0, e1, 2, 5, 20, [&](int c) { CK(launch(c)); }) * 1e3;
}

/* float64 reference of one fused variant on copy 0 (host copies hw, hw2) */
static double check(const cuk_gemv_rows &p, const std::vector<uint16_t> &hw,
                    const std::vector<uint16_t> &hw2, const std::vector<float> &hx,
                    const std::vector<float> &hz, const std::vector<uint16_t> &hnw,
                    const std::vector<float> &out0, const float *dout)
{
    int n = p.n, k = p.k;
    std::vector<double> a(k);
    double ss = 0;
    for (int i = 0; i < k; i++) {
        double v = hx[i];
        if (p.norm == CUK_GN_GATED)
            v *= (double)hz[i] / (1.0 + exp(-(double)hz[i]));
        a[i] = v;
        ss += v * v;
    }
    if (p.norm != CUK_GN_NONE) {
        double r = 1.0 / sqrt(ss / k + p.eps);
        for (int i = 0; i < k; i++)
            a[i] *= r * bf2f(hnw[i]);
    }
    std::vector<float> got(n);
    CK(cudaMemcpy(got.data(), dout, n * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int j = 0; j < n; j++) {
        double s = 0, sa = 0, u = 0, ua = 0;
        for (int i = 0; i < k; i++) {
            double w = bf2f(hw[(size_t)j * k + i]);
            s += a[i] * w;
            sa += fabs(a[i] * w);
            if (p.epi == CUK_GE_SWIGLU) {
                double w2 = bf2f(hw2[(size_t)j * k + i]);
                u += a[i] * w2;
                ua += fabs(a[i] * w2);
            }
        }
        double ref = s, scale = sa + 1e-30;
        if (p.epi == CUK_GE_ADD)
            ref += out0[j], scale += fabs(out0[j]);
        if (p.epi == CUK_GE_SWIGLU) {
            double sg = s / (1.0 + exp(-s));
            ref = sg * u;
            scale = fabs(sg) * ua + sa * fabs(u) + 1e-30;
        }
        worst = std::max(worst, fabs(got[j] - ref) / scale);
    }
    return worst;
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    CK(cudaStreamCreate(&st));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    copy_bw = bench_copy_bw(st, e0, e1);
    printf("copy %.1f GB/s (read + written)\n", copy_bw / 1e9);
    struct shape {
        const char *name;
        int n, k;
    } shapes[] = {{"out_proj", 4096, 8192},  {"ffn_down", 4096, 14336}, {"attn_q/o", 4096, 4096},
                  {"in_proj", 16768, 4096},  {"ffn_gate", 14336, 4096}, {"attn_k/v", 1024, 4096},
                  {"lm_head", 128256, 4096}};
    float *x, *z, *out;
    uint16_t *nw;
    CK(cudaMalloc(&x, 16384 * 4));
    CK(cudaMalloc(&z, 16384 * 4));
    CK(cudaMalloc(&nw, 16384 * 2));
    CK(cudaMalloc(&out, 128256 * 4));
    std::vector<float> hx(16384), hz(16384), out0(128256);
    std::vector<uint16_t> hnw(16384);
    for (int i = 0; i < 16384; i++) {
        hx[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        hz[i] = (float)((i * 40503u + 7) % 3001) / 750.0f - 2.0f;
        float f = 0.5f + (float)(i % 17) / 16.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        hnw[i] = (uint16_t)(u >> 16);
    }
    for (int i = 0; i < 128256; i++)
        out0[i] = (float)(i % 13) - 6.0f;
    CK(cudaMemcpy(x, hx.data(), 16384 * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(z, hz.data(), 16384 * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(nw, hnw.data(), 16384 * 2, cudaMemcpyHostToDevice));
    printf("%-9s %6s %6s | %-28s %8s %7s %9s\n", "shape", "N", "K", "launch", "us", "copy%",
           "max err");
    for (const shape &sh : shapes) {
        size_t wel = (size_t)sh.n * sh.k, wbytes = wel * 2;
        int copies = (int)std::max<size_t>(2, (size_t)(256u << 20) / wbytes + 1);
        std::vector<uint16_t *> w(copies);
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&w[c], wbytes));
            bench_fill_bf16<<<1024, 256, 0, st>>>(w[c], wel, 77u + c, 0.05f);
        }
        CK(cudaStreamSynchronize(st));
        std::vector<uint16_t> hw(wel), hw2(wel);
        CK(cudaMemcpy(hw.data(), w[0], wbytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hw2.data(), w[1], wbytes, cudaMemcpyDeviceToHost));
        cuk_gemv_rows p = {};
        p.x = x;
        p.w = w[0];
        p.wdt = 2;
        p.out = out;
        p.n = sh.n;
        p.k = sh.k;
        p.eps = 1e-5f;
        p.nwdt = 2;
        /* matmul.cu's GEMV, the landed path */
        double tu = time_us([&](int j) { return cuk_gemv(x, w[j % copies], 2, out, 1, sh.n, sh.k, st); });
        CK(cuk_gemv(x, w[0], 2, out, 1, sh.n, sh.k, st));
        CK(cudaStreamSynchronize(st));
        double err = check(p, hw, hw2, hx, hz, hnw, out0, out);
        printf("%-9s %6d %6d | %-28s %8.1f %6.1f%% %9.2e\n", sh.name, sh.n, sh.k, "cuk_gemv (landed)",
               tu, 100.0 * wbytes / (tu * 1e-6) / copy_bw, err);
        double best = 1e30;
        cuk_gemv_rows_cfg bc = {};
        for (int th : {256, 512})
            for (int rows : {1, 2, 4})
                for (int pipe : {0, 1})
                    for (int hint : {0, 1})
                        for (int per : {0, 1, 2}) {
                            if (quick && (per || hint != 1))
                                continue;
                            cuk_gemv_rows_cfg c = {th, rows, per, pipe, hint};
                            cuk_gemv_rows q = p;
                            if (cuk_gemv_rows_tuned(&q, &c, st) != cudaSuccess) {
                                (void)cudaGetLastError();
                                continue;
                            }
                            double t = time_us([&](int j) {
                                q.w = w[j % copies];
                                return cuk_gemv_rows_tuned(&q, &c, st);
                            });
                            q.w = w[0];
                            CK(cudaMemset(out, 0xff, sh.n * 4));
                            CK(cuk_gemv_rows_tuned(&q, &c, st));
                            CK(cudaStreamSynchronize(st));
                            double e = check(q, hw, hw2, hx, hz, hnw, out0, out);
                            char nm[64];
                            snprintf(nm, sizeof nm, "rows t%d r%d pipe%d hint%d sm%d", th, rows,
                                     pipe, hint, per);
                            printf("%-9s %6d %6d | %-28s %8.1f %6.1f%% %9.2e%s\n", sh.name, sh.n,
                                   sh.k, nm, t, 100.0 * wbytes / (t * 1e-6) / copy_bw, e,
                                   e > 1e-5 ? "  WRONG" : "");
                            if (t < best)
                                best = t, bc = c;
                        }
        printf("%-9s best: t%d r%d pipe%d hint%d sm%d %.1f us %.1f%% (landed %.1f us)\n", sh.name,
               bc.threads, bc.rows, bc.pipe, bc.hint, bc.ctas_per_sm, best,
               100.0 * wbytes / (best * 1e-6) / copy_bw, tu);
        /* fused variants, default launch shape */
        struct var {
            const char *name;
            int norm, epi;
        } vars[] = {{"default plain", CUK_GN_NONE, CUK_GE_STORE},
                    {"default rms-norm in", CUK_GN_RMS, CUK_GE_STORE},
                    {"default gated-norm in", CUK_GN_GATED, CUK_GE_STORE},
                    {"default residual add", CUK_GN_NONE, CUK_GE_ADD},
                    {"default rms + swiglu (2 W)", CUK_GN_RMS, CUK_GE_SWIGLU}};
        for (const var &v : vars) {
            cuk_gemv_rows q = p;
            q.norm = v.norm;
            q.epi = v.epi;
            q.z = z;
            q.nw = nw;
            q.w2 = w[1];
            double mult = v.epi == CUK_GE_SWIGLU ? 2.0 : 1.0;
            double t = time_us([&](int j) {
                q.w = w[(2 * j) % copies];
                q.w2 = w[(2 * j + 1) % copies];
                return cuk_gemv_rows_run(&q, st);
            });
            q.w = w[0];
            q.w2 = w[1];
            CK(cudaMemcpy(out, out0.data(), sh.n * 4, cudaMemcpyHostToDevice));
            CK(cuk_gemv_rows_run(&q, st));
            CK(cudaStreamSynchronize(st));
            double e = check(q, hw, hw2, hx, hz, hnw, out0, out);
            printf("%-9s %6d %6d | %-28s %8.1f %6.1f%% %9.2e%s\n", sh.name, sh.n, sh.k, v.name, t,
                   100.0 * mult * wbytes / (t * 1e-6) / copy_bw, e, e > 1e-5 ? "  WRONG" : "");
        }
        for (int c = 0; c < copies; c++)
            CK(cudaFree(w[c]));
    }
    return 0;
}

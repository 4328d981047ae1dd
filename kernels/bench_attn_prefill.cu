/* Stand-alone harness for the paged prefill attention kernels (not part of
 * the build): a shared library that tools/bench_prefill_attn.py loads with
 * ctypes, so that llmem's kernels and PyTorch's SDPA backends are timed in
 * the same process (docs/benchmarks.md, "Prefill attention, fast mode").
 * Build:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared \
 *        -I. kernels/bench_attn_prefill.cu -o libbench_attn_prefill.so
 *
 * fattn_setup builds a whole-prompt prefill of n_seq streams x n_ctx tokens
 * (causal), random normal K/V in a paged pool whose pages are handed out in
 * a shuffled order, random normal f32 queries. fattn_time times one kernel
 * variant (CUDA events, median); fattn_check compares sampled output rows
 * with a float64 reference computed here on the host.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.cu"

namespace {

struct bench_state {
    cuk_attn_args a;
    int n_seq = 0, n_ctx = 0;
    std::vector<float> q;           /* [n_tok][H][D] */
    std::vector<uint16_t> kh, vh;   /* pool bits */
    std::vector<int32_t> pt;
    float *dq = nullptr, *dout = nullptr;
    void *dk = nullptr, *dv = nullptr;
    int32_t *dtab = nullptr;
    cudaStream_t s = nullptr;
} B;

double half_bits_to_double(uint16_t h, int dt)
{
    if (dt == CUK_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

uint16_t double_to_bits(double x, int dt)
{
    if (dt == CUK_BF16) {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, 4);
        u += 0x7fff + ((u >> 16) & 1);
        return (uint16_t)(u >> 16);
    }
    __half h = __float2half_rn((float)x);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

typedef cudaError_t (*launch_fn)(const cuk_attn_args *, cudaStream_t);

/* the variants checked at the other dtype / head dim: the old kernel,
 * the portable fast kernel, the wgmma default and its PIPE form */
template <typename T, int D> cudaError_t run_few(int v, const cuk_attn_args *a, cudaStream_t s)
{
    cuk_attn_args b = *a;
    switch (v) {
    case 0: b.precise = 1; return pf_launch<T, D>(&b, s);
    case 2: return ptc_launch_cap<T, D, ptc_cfg<8, 2, 64, 2, 1, 4>, false>(a, s);
    case 4: return pwg_launch_cap<T, D, pwg_cfg<2, 64, 2, false, 2>, false>(a, s);
    case 10: return pwg_launch_cap<T, D, pwg_cfg<3, 64, 3, true>, false>(a, s);
    case 11: return pwg_launch_cap<T, D, pwg_cfg<2, 64, 3, true>, false>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

/* variant v of the bf16/f16 kernels at head_dim D */
template <typename T, int D> cudaError_t run_variant(int v, const cuk_attn_args *a, cudaStream_t s)
{
    cuk_attn_args b = *a;
    switch (v) {
    case 0: b.precise = 1; return pf_launch<T, D>(&b, s);
    case 1: b.precise = 0; return pf_launch<T, D>(&b, s);
    case 2: return ptc_launch_cap<T, D, ptc_cfg<8, 2, 64, 2, 1, 4>, false>(a, s);
    case 3: return ptc_launch_cap<T, D, ptc_cfg<8, 1, 64, 2, 2, 4>, false>(a, s);
    case 4: return pwg_launch_cap<T, D, pwg_cfg<2, 64, 2, false, 2>, false>(a, s);
    case 5: return pwg_launch_cap<T, D, pwg_cfg<3, 128, 2, false>, false>(a, s);
    case 6: return pwg_launch_cap<T, D, pwg_cfg<4, 64, 2, false>, false>(a, s);
    case 7: return pwg_launch_cap<T, D, pwg_cfg<3, 64, 2, false>, false>(a, s);
    case 8: return pwg_launch_cap<T, D, pwg_cfg<3, 64, 3, false>, false>(a, s);
    case 9: return pwg_launch_cap<T, D, pwg_cfg<2, 128, 2, false>, false>(a, s);
    case 10: return pwg_launch_cap<T, D, pwg_cfg<3, 64, 3, true>, false>(a, s);
    case 11: return pwg_launch_cap<T, D, pwg_cfg<2, 64, 3, true>, false>(a, s);
    case 12: return pwg_launch_cap<T, D, pwg_cfg<2, 128, 3, true>, false>(a, s);
    case 13: return pwg_launch_cap<T, D, pwg_cfg<2, 128, 2, false, 1, true>, false>(a, s);
    default: return cudaErrorInvalidValue;
    }
}

const char *variant_names[] = {
    "old precise (4w x 16 rows, hi+lo)",
    "old fast (4w x 16 rows)",
    "tc 8w x 2mt bn64 ns2 minb1 lu4 (portable)",
    "tc 8w x 1mt bn64 ns2 minb2 lu4",
    "wg 2wg bn64 ns2 2 CTAs/SM (default)",
    "wg 3wg bn128 ns2",
    "wg 4wg bn64 ns2",
    "wg 3wg bn64 ns2",
    "wg 3wg bn64 ns3",
    "wg 2wg bn128 ns2",
    "wg 3wg bn64 ns3 PIPE",
    "wg 2wg bn64 ns3 PIPE",
    "wg 2wg bn128 ns3 PIPE",
    "wg 2wg bn128 ns2, V desc offsets swapped (wrong)",
};

cudaError_t dispatch(int v)
{
    const cuk_attn_args *a = &B.a;
    if (a->dtype == CUK_BF16) {
        if (a->head_dim == 128)
            return run_variant<cuk_bf16_t, 128>(v, a, B.s);
        if (a->head_dim == 64)
            return run_few<cuk_bf16_t, 64>(v, a, B.s);
    } else if (a->dtype == CUK_F16) {
        if (a->head_dim == 128)
            return run_few<cuk_f16_t, 128>(v, a, B.s);
    }
    return cudaErrorInvalidValue;
}

} // namespace

extern "C" int fattn_count(void) { return (int)(sizeof variant_names / sizeof variant_names[0]); }
extern "C" const char *fattn_name(int v) { return v >= 0 && v < fattn_count() ? variant_names[v] : "?"; }

extern "C" void fattn_free(void)
{
    cudaFree(B.dq);
    cudaFree(B.dout);
    cudaFree(B.dk);
    cudaFree(B.dv);
    cudaFree(B.dtab);
    B.dq = B.dout = nullptr;
    B.dk = B.dv = nullptr;
    B.dtab = nullptr;
}

/* dtype: 1 = f16, 2 = bf16 (CUK_*). Returns 0 or a cudaError_t. */
extern "C" int fattn_setup(int n_seq, int n_ctx, int page_size, int head_dim, int dtype,
                           int n_heads, int n_kv)
{
    fattn_free();
    if (!B.s && cudaStreamCreate(&B.s) != cudaSuccess)
        return -1;
    std::mt19937_64 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int64_t n_tok = (int64_t)n_seq * n_ctx;
    int32_t pages_per = (n_ctx + page_size - 1) / page_size;
    int32_t n_pages = n_seq * pages_per + 5;
    std::vector<int32_t> perm(n_pages);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    B.pt.assign((size_t)n_seq * pages_per, -1);
    for (int s = 0; s < n_seq; s++)
        for (int p = 0; p < pages_per; p++)
            B.pt[(size_t)s * pages_per + p] = perm[s * pages_per + p];
    int64_t pool = (int64_t)n_pages * page_size * n_kv * head_dim;
    B.kh.assign(pool, 0);
    B.vh.assign(pool, 0);
    for (int64_t i = 0; i < pool; i++) {
        B.kh[i] = double_to_bits(nd(rng), dtype);
        B.vh[i] = double_to_bits(nd(rng), dtype);
    }
    B.q.resize((size_t)n_tok * n_heads * head_dim);
    for (auto &x : B.q)
        x = nd(rng);
    std::vector<int32_t> tab;
    tab.insert(tab.end(), B.pt.begin(), B.pt.end());
    size_t o_seq = tab.size();
    for (int s = 0; s < n_seq; s++)
        tab.push_back(n_ctx);
    size_t o_len = tab.size();
    for (int s = 0; s < n_seq; s++)
        for (int j = 0; j < n_ctx; j++)
            tab.push_back(j + 1);
    size_t o_ts = tab.size();
    for (int s = 0; s < n_seq; s++)
        for (int j = 0; j < n_ctx; j++)
            tab.push_back(s);
    cudaError_t e;
    if ((e = cudaMalloc(&B.dq, B.q.size() * 4)) || (e = cudaMalloc(&B.dout, B.q.size() * 4)) ||
        (e = cudaMalloc(&B.dk, pool * 2)) || (e = cudaMalloc(&B.dv, pool * 2)) ||
        (e = cudaMalloc(&B.dtab, tab.size() * 4)))
        return (int)e;
    cudaMemcpy(B.dq, B.q.data(), B.q.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(B.dk, B.kh.data(), pool * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(B.dv, B.vh.data(), pool * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(B.dtab, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice);
    cuk_attn_args &a = B.a;
    memset(&a, 0, sizeof a);
    a.q = B.dq;
    a.out = B.dout;
    a.k = B.dk;
    a.v = B.dv;
    a.dtype = dtype;
    a.page_table = B.dtab;
    a.seq_len = B.dtab + o_seq;
    a.tok_kv_len = B.dtab + o_len;
    a.tok_seq = B.dtab + o_ts;
    a.page_off = nullptr;
    a.n_tok = (int32_t)n_tok;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv;
    a.head_dim = head_dim;
    a.n_streams = n_seq;
    a.max_pages = pages_per;
    a.page_size = page_size;
    a.n_pages = n_pages;
    a.scale = 1.0f / sqrtf((float)head_dim);
    B.n_seq = n_seq;
    B.n_ctx = n_ctx;
    return (int)cudaDeviceSynchronize();
}

/* Median ms of iters calls after 3 warm-ups; negative on error. */
extern "C" double fattn_time(int v, int iters)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int i = 0; i < iters + 3; i++) {
        cudaEventRecord(e0, B.s);
        cudaError_t e = dispatch(v);
        cudaEventRecord(e1, B.s);
        if (e != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess) {
            fprintf(stderr, "variant %d: %s\n", v, cudaGetErrorString(e ? e : cudaGetLastError()));
            return -1.0;
        }
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 3)
            t.push_back(ms);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* Runs variant v once on a poisoned output and compares `samples` random
 * (token, head) rows with a float64 reference over the pool's K/V:
 * writes max |out - ref| and sqrt(sum d^2 / sum ref^2). Returns 0 or -1. */
extern "C" int fattn_check(int v, int samples, double *max_abs, double *nerr)
{
    const cuk_attn_args &a = B.a;
    size_t n = B.q.size();
    cudaMemset(B.dout, 0xff, n * 4); /* NaN */
    if (dispatch(v) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        return -1;
    std::vector<float> out(n);
    cudaMemcpy(out.data(), B.dout, n * 4, cudaMemcpyDeviceToHost);
    std::mt19937_64 rng(99 + v);
    int D = a.head_dim, H = a.n_heads, rep = a.n_heads / a.n_kv_heads;
    double mx = 0, num = 0, den = 0;
    std::vector<double> sc, acc(D);
    for (int it = 0; it < samples; it++) {
        int64_t tok = it == 0 ? a.n_tok - 1 : (int64_t)(rng() % (uint64_t)a.n_tok);
        int h = (int)(rng() % (uint64_t)H), g = h / rep;
        int s = (int)(tok / B.n_ctx), len = (int)(tok % B.n_ctx) + 1;
        const float *q = &B.q[((size_t)tok * H + h) * D];
        sc.assign(len, 0.0);
        double m = -INFINITY;
        for (int j = 0; j < len; j++) {
            int64_t slot = (int64_t)B.pt[(size_t)s * a.max_pages + j / a.page_size] * a.page_size +
                           j % a.page_size;
            const uint16_t *k = &B.kh[((size_t)slot * a.n_kv_heads + g) * D];
            double d = 0;
            for (int e = 0; e < D; e++)
                d += (double)q[e] * half_bits_to_double(k[e], a.dtype);
            sc[j] = d * a.scale;
            m = std::max(m, sc[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double l = 0;
        for (int j = 0; j < len; j++) {
            int64_t slot = (int64_t)B.pt[(size_t)s * a.max_pages + j / a.page_size] * a.page_size +
                           j % a.page_size;
            const uint16_t *vv = &B.vh[((size_t)slot * a.n_kv_heads + g) * D];
            double p = exp(sc[j] - m);
            l += p;
            for (int e = 0; e < D; e++)
                acc[e] += p * half_bits_to_double(vv[e], a.dtype);
        }
        for (int e = 0; e < D; e++) {
            double ref = acc[e] / l, got = out[((size_t)tok * H + h) * D + e];
            double d = std::isfinite(got) ? got - ref : INFINITY;
            mx = std::max(mx, fabs(d));
            num += d * d;
            den += ref * ref;
        }
    }
    *max_abs = mx;
    *nerr = sqrt(num / den);
    return 0;
}

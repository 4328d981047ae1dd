/* llmem CUDA kernels, paged attention family: K/V store, split-K decode
 * attention, tensor-core prefill attention, and a generic fallback.
 *
 * Addressing is PagedAttention's (Kwon et al., SOSP 2023): key j of stream
 * s lives in slot page_table[s * max_pages + j / page_size] * page_size +
 * j % page_size of a [n_pages][page_size][n_kv_heads][head_dim] pool. Every
 * kernel visits only keys in [lo, tok_kv_len) of its query (lo from the
 * sliding window), and bounds-checks every table value it reads; a bad
 * value makes the query see no key (zeros) or skips the key, never a read
 * outside the pools.
 *
 * - decode on tensor cores (attention_decode_tc.cuh): f16/bf16 pools with
 *   head_dim 64 or 128; the same items, splits and merge as the next one.
 * - decode (flash-decoding; Dao et al. 2023, "Flash-Decoding for long-context
 *   inference"): one CTA per (query token, KV head, group of up to 4 query
 *   heads, key split). A "key group" of lanes reads one key row with 16-byte
 *   loads (4 keys per group in flight), so each K/V row is read once for all
 *   the GQA heads that share it; each group keeps its own online-softmax
 *   state (FlashAttention-2, Dao 2023, Alg. 1), merged in shared memory at
 *   the end, and splits are merged by a second kernel.
 * - prefill: FlashAttention-2 forward on mma.sync m16n8k16 (f16/bf16 inputs,
 *   f32 accumulation). A tile holds 16 rows per warp; the rows are (query
 *   token, query head) pairs of one GQA group, so a K/V block staged in
 *   shared memory (cp.async, double-buffered, XOR-swizzled for ldmatrix)
 *   serves every head of the group. The MMA operands must be f16/bf16: by
 *   default queries and probabilities are split into hi + lo pairs (two MMAs
 *   per product, error about 2^-16 relative for bf16, 2^-21 for f16), which
 *   keeps the result within f32 tolerance of the CPU reference; the fast
 *   mode rounds them once, as FlashAttention does.
 * - generic: one warp per (query token, query head), any head_dim and dtype.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>

#include "kernels/common.cuh"

#define LOG2E 1.4426950408889634f

/* ---- shared helpers ---------------------------------------------------------------------- */

/* Resolves query token i: stream, key range [lo, hi). Returns false (no
 * keys) when a table value is out of range. */
__device__ __forceinline__ bool attn_query_range(const cuk_attn_args &a, int64_t i, int32_t &s,
                                                 int32_t &lo, int32_t &hi)
{
    s = a.tok_seq[i];
    if (s < 0 || s >= a.n_streams)
        return false;
    int32_t len = a.tok_kv_len[i], sl = a.seq_len[s];
    if (len < 0 || sl < 0 || len > sl ||
        (int64_t)sl > (int64_t)a.max_pages * a.page_size)
        return false;
    hi = len;
    lo = a.window > 0 && len > a.window ? len - a.window : 0;
    return true;
}

/* First page-table element of stream s (see llmem_kv_view.page_off). */
__device__ __forceinline__ int64_t attn_row(const cuk_attn_args &a, int32_t s)
{
    return a.page_off ? (int64_t)a.page_off[s] : (int64_t)s * a.max_pages;
}

/* Slot of key j of stream s (< n_pages * page_size <= INT32_MAX), or -1 when
 * the page id is out of range. */
__device__ __forceinline__ int32_t attn_key_slot(const cuk_attn_args &a, int32_t s, int32_t j)
{
    int32_t page = a.page_table[attn_row(a, s) + j / a.page_size];
    if (page < 0 || page >= a.n_pages)
        return -1;
    return page * a.page_size + j % a.page_size;
}

/* Element offset of (key j of stream s, KV head g, dim 0), or -1. */
__device__ __forceinline__ int64_t attn_key_offset(const cuk_attn_args &a, int32_t s, int32_t j,
                                                   int32_t g)
{
    int32_t slot = attn_key_slot(a, s, j);
    return slot < 0 ? -1 : ((int64_t)slot * a.n_kv_heads + g) * a.head_dim;
}

__device__ __forceinline__ float attn_cap(float x, float cap)
{
    return cap > 0.0f ? cap * tanhf(x / cap) : x;
}

/* ---- K/V store ------------------------------------------------------------------------------- */

__global__ void kv_store_kernel(const float *k, const float *v, void *kp, void *vp, int dt,
                                const int32_t *tok, const int32_t *slot, int64_t n, int64_t n_tok,
                                int64_t n_slots_total, int64_t row)
{
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < n * row;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = it / row, e = it - j * row;
        int32_t t = tok[j], s = slot[j];
        if (t < 0 || t >= n_tok || s < 0 || s >= n_slots_total)
            continue;
        cuk_store(kp, dt, (int64_t)s * row + e, k[(int64_t)t * row + e]);
        cuk_store(vp, dt, (int64_t)s * row + e, v[(int64_t)t * row + e]);
    }
}

extern "C" cudaError_t cuk_kv_store(const float *k, const float *v, void *kp, void *vp, int dtype,
                                    const int32_t *tok, const int32_t *slot, int64_t n,
                                    int64_t n_tok, int64_t n_slots_total, int64_t row,
                                    cudaStream_t stream)
{
    kv_store_kernel<<<cuk_grid(n * row, 256), 256, 0, stream>>>(k, v, kp, vp, dtype, tok, slot, n,
                                                                n_tok, n_slots_total, row);
    return cudaGetLastError();
}

/* ---- decode: split-K, key groups ------------------------------------------------------------- */

#define DEC_WARPS 4
#define DEC_NR 4 /* query heads per CTA */

/* cp.async of 16 bytes (zeros when !valid); the K/V streams bypass L1. */
__device__ __forceinline__ uint32_t pf_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void pf_cp16(uint32_t dst, const void *src, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

__device__ __forceinline__ void pf_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void pf_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <typename T, int D> struct dec_shape {
    static constexpr int VE = 16 / (int)sizeof(T);          /* elements per 16-byte chunk */
    static constexpr int CH = D / VE;                        /* chunks per row */
    static constexpr int LG = CH < 32 ? CH : 32;             /* lanes per key group */
    static constexpr int CPL = CH / LG;                      /* chunks per lane */
    static constexpr int KPW = 32 / LG;                      /* key groups per warp */
    static constexpr int NG = KPW * DEC_WARPS;               /* key groups per CTA */
    static constexpr int EL = CPL * VE;                      /* elements per lane */
    static constexpr int KB = CPL >= 2 ? 2 : 4;              /* keys per group per step */
    static constexpr int KS = KPW * KB;                      /* keys per warp step */
    /* one pipeline stage of a warp: KB * CPL chunks of K, then of V, per lane (4 KiB) */
    static constexpr int STAGE = 2 * KB * CPL * 32;          /* uint4 */
};

/* Dynamic shared memory of the decode kernel with NS stages: the K/V ring,
 * which the final merge of the key groups reuses. */
template <typename T, int D, int NS> constexpr size_t dec_smem_bytes()
{
    using S = dec_shape<T, D>;
    size_t ring = (size_t)DEC_WARPS * NS * S::STAGE * 16;
    size_t merge = (size_t)S::NG * DEC_NR * (D + 2) * sizeof(float);
    return ring > merge ? ring : merge;
}

/* What one decode CTA works on: item x = blockIdx.x = ((tok * n_kv + g) *
 * n_hc + hc) covers query heads h0 .. h0 + nr - 1 (at most DEC_NR of kv
 * head g's group) of token tok; split sp = blockIdx.y of n_split covers
 * keys [k0, k1) of stream s's range (empty when the token has none). */
struct dec_item {
    int64_t x, tok;
    int32_t sp, g, h0, nr, s, k0, k1;
};

__device__ __forceinline__ dec_item dec_item_of(const cuk_attn_args &a, int32_t n_hc,
                                                int32_t n_split)
{
    dec_item it;
    it.x = blockIdx.x;
    it.sp = blockIdx.y;
    int32_t hc = (int32_t)(it.x % n_hc);
    it.g = (int32_t)((it.x / n_hc) % a.n_kv_heads);
    it.tok = it.x / ((int64_t)n_hc * a.n_kv_heads);
    int32_t n_rep = a.n_heads / a.n_kv_heads;
    it.h0 = it.g * n_rep + hc * DEC_NR;
    it.nr = n_rep - hc * DEC_NR < DEC_NR ? n_rep - hc * DEC_NR : DEC_NR;
    int32_t lo = 0, hi = 0;
    it.s = 0;
    if (!attn_query_range(a, it.tok, it.s, lo, hi))
        lo = hi = 0;
    int32_t per = (hi - lo + n_split - 1) / n_split;
    it.k0 = lo + it.sp * per;
    it.k1 = it.k0 + per < hi ? it.k0 + per : hi;
    return it;
}

/* The last step of a decode CTA: merges the NG partial softmax results in
 * shared memory (sm_o [NG][DEC_NR][D] unnormalized outputs, sm_m / sm_l
 * [NG][DEC_NR] log2-domain maxima and sums) of the item's nr heads from h0
 * on, and writes either the normalized rows of token tok (n_split == 1) or
 * split sp's partial (O, M, L) rows to part for attn_combine_kernel. Call
 * with every thread of the CTA after a barrier. */
template <int D, int NG>
__device__ __forceinline__ void dec_merge_groups(const cuk_attn_args &a, float *part,
                                                 const float *sm_o, const float *sm_m,
                                                 const float *sm_l, int32_t nr, int64_t tok,
                                                 int32_t h0, int64_t x, int32_t sp,
                                                 int32_t n_split)
{
    for (int idx = threadIdx.x; idx < nr * D; idx += blockDim.x) {
        int r = idx / D, d = idx % D;
        float M = -INFINITY;
        for (int q2 = 0; q2 < NG; q2++)
            M = fmaxf(M, sm_m[q2 * DEC_NR + r]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
            for (int q2 = 0; q2 < NG; q2++) {
                float w = exp2f(sm_m[q2 * DEC_NR + r] - M);
                L += sm_l[q2 * DEC_NR + r] * w;
                O += sm_o[(q2 * DEC_NR + r) * D + d] * w;
            }
        }
        if (n_split == 1) {
            a.out[(tok * a.n_heads + h0 + r) * D + d] = L > 0.0f ? O / L : 0.0f;
        } else {
            float *pp = part + ((x * n_split + sp) * DEC_NR + r) * (D + 2);
            pp[d] = O;
            if (d == 0) {
                pp[D] = M;
                pp[D + 1] = L;
            }
        }
    }
}

/* Work item x: ((token * n_kv + g) * n_hc + hc); blockIdx.y: split. With
 * one split the CTA writes out; otherwise part[(x * n_split + split)]
 * holds DEC_NR rows of (D unnormalized sums, max, sum of exps) in base 2.
 *
 * Each warp streams its keys through an NS-stage cp.async ring in shared
 * memory: the loads of steps i + 1 .. i + NS - 1 are in flight while step i
 * is computed, and every lane reads back only the chunks it copied itself
 * (no barrier inside the loop). The page of each key is resolved one stage
 * ahead of its copy, so page-table latency hides behind the ring too. */
template <typename T, int D, int NS>
__global__ void __launch_bounds__(DEC_WARPS * 32, 4)
    attn_decode_kernel(cuk_attn_args a, int32_t n_hc, int32_t n_split, float *part)
{
    using S = dec_shape<T, D>;
    static_assert(S::KS <= 32, "one lane per key of a step");
    static_assert(NS * S::KB <= 32, "validity bits of the ring fit in one word");
    extern __shared__ __align__(16) uint4 dec_ring[];
    cuk_pdl_trigger(); /* with one split, the output projection (a GEMV) follows */

    const dec_item it = dec_item_of(a, n_hc, n_split);
    const int64_t x = it.x, tok = it.tok;
    const int32_t sp = it.sp, g = it.g, h0 = it.h0, nr = it.nr, s = it.s, k0 = it.k0, k1 = it.k1;

    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gi = lane / S::LG, li = lane % S::LG; /* group within the warp, lane within it */
    int grp = warp * S::KPW + gi;

    /* Warp step i covers keys base0 + i * step + [0, KS); lane l < KS
     * resolves key l of a step. */
    const int32_t step = DEC_WARPS * S::KS;
    const int32_t base0 = k0 + warp * S::KS;
    const int32_t n_steps = base0 < k1 ? (k1 - base0 + step - 1) / step : 0;
    auto slot_of = [&](int32_t i) -> int32_t {
        int32_t j = base0 + i * step + lane;
        return lane < S::KS && i < n_steps && j < k1 ? attn_key_slot(a, s, j) : -1;
    };
    uint4 *ring = dec_ring + (size_t)warp * NS * S::STAGE;
    uint32_t valid = 0; /* bit (stage * KB + u): key u of the stage's step is visible */
    auto issue = [&](int32_t i, int32_t slots) {
        int st = i % NS;
        uint32_t bits = 0;
        if (i < n_steps) {
            uint4 *dst = ring + st * S::STAGE;
#pragma unroll
            for (int u = 0; u < S::KB; u++) {
                int32_t slot = __shfl_sync(0xffffffffu, slots, u * S::KPW + gi);
                bool ok = slot >= 0;
                bits |= (ok ? 1u : 0u) << u;
                int64_t off = ok ? ((int64_t)slot * a.n_kv_heads + g) * D : 0;
                const uint4 *kp = (const uint4 *)((const T *)a.k + off) + li * S::CPL;
                const uint4 *vp = (const uint4 *)((const T *)a.v + off) + li * S::CPL;
#pragma unroll
                for (int c = 0; c < S::CPL; c++) {
                    pf_cp16(pf_smem(dst + (u * S::CPL + c) * 32 + lane), kp + c, ok);
                    pf_cp16(pf_smem(dst + ((S::KB + u) * S::CPL + c) * 32 + lane), vp + c, ok);
                }
            }
        }
        valid = (valid & ~(((1u << S::KB) - 1u) << (st * S::KB))) | (bits << (st * S::KB));
        pf_commit(); /* possibly empty: one group per step keeps wait_group's count */
    };

    /* q chunk of this lane, scaled (and by log2 e when no softcap) */
    bool cap = a.softcap > 0.0f;
    float qs = cap ? a.scale : a.scale * LOG2E;
    float q[DEC_NR][S::EL];
#pragma unroll
    for (int r = 0; r < DEC_NR; r++)
#pragma unroll
        for (int c = 0; c < S::CPL; c++)
#pragma unroll
            for (int e = 0; e < S::VE; e++) {
                int d = (li * S::CPL + c) * S::VE + e;
                q[r][c * S::VE + e] =
                    r < nr ? a.q[(tok * a.n_heads + h0 + r) * D + d] * qs : 0.0f;
            }

    float m[DEC_NR], l[DEC_NR], acc[DEC_NR][S::EL];
#pragma unroll
    for (int r = 0; r < DEC_NR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < S::EL; e++)
            acc[r][e] = 0.0f;
    }

    int32_t nxt = slot_of(0);
#pragma unroll
    for (int32_t i = 0; i < NS - 1; i++) {
        int32_t cur = nxt;
        nxt = slot_of(i + 1);
        issue(i, cur);
    }
    for (int32_t i = 0; i < n_steps; i++) {
        int32_t cur = nxt;
        nxt = slot_of(i + NS);
        issue(i + NS - 1, cur);
        pf_wait<NS - 1>(); /* this lane's copies of step i have landed */
        const uint4 *src = ring + (i % NS) * S::STAGE;
        uint32_t ok = valid >> ((i % NS) * S::KB);
        float sc[S::KB][DEC_NR];
#pragma unroll
        for (int u = 0; u < S::KB; u++) {
#pragma unroll
            for (int r = 0; r < DEC_NR; r++)
                sc[u][r] = 0.0f;
#pragma unroll
            for (int c = 0; c < S::CPL; c++) {
                float kf[S::VE];
                cuk_unpack16<T>::run(src[(u * S::CPL + c) * 32 + lane], kf);
#pragma unroll
                for (int r = 0; r < DEC_NR; r++)
#pragma unroll
                    for (int e = 0; e < S::VE; e++)
                        sc[u][r] += q[r][c * S::VE + e] * kf[e];
            }
#pragma unroll
            for (int r = 0; r < DEC_NR; r++) {
#pragma unroll
                for (int o = S::LG / 2; o > 0; o >>= 1)
                    sc[u][r] += __shfl_xor_sync(0xffffffffu, sc[u][r], o);
                if (cap)
                    sc[u][r] = attn_cap(sc[u][r], a.softcap) * LOG2E;
                if (!((ok >> u) & 1u))
                    sc[u][r] = -INFINITY;
            }
        }
#pragma unroll
        for (int r = 0; r < DEC_NR; r++) {
            float mx = m[r];
#pragma unroll
            for (int u = 0; u < S::KB; u++)
                mx = fmaxf(mx, sc[u][r]);
            if (mx == -INFINITY)
                continue; /* no visible key yet */
            float corr = exp2f(m[r] - mx);
            m[r] = mx;
            l[r] *= corr;
#pragma unroll
            for (int e = 0; e < S::EL; e++)
                acc[r][e] *= corr;
#pragma unroll
            for (int u = 0; u < S::KB; u++) {
                float p = exp2f(sc[u][r] - mx);
                l[r] += p;
#pragma unroll
                for (int c = 0; c < S::CPL; c++) {
                    float vf[S::VE];
                    cuk_unpack16<T>::run(src[((S::KB + u) * S::CPL + c) * 32 + lane], vf);
#pragma unroll
                    for (int e = 0; e < S::VE; e++)
                        acc[r][c * S::VE + e] += p * vf[e];
                }
            }
        }
    }
    pf_wait<0>();
    __syncthreads(); /* the merge below reuses the ring */

    /* merge the key groups of the CTA */
    float *sm_o = (float *)dec_ring;                        /* [NG][DEC_NR][D] */
    float *sm_m = sm_o + (size_t)S::NG * DEC_NR * D;        /* [NG][DEC_NR] */
    float *sm_l = sm_m + (size_t)S::NG * DEC_NR;            /* [NG][DEC_NR] */
#pragma unroll
    for (int r = 0; r < DEC_NR; r++) {
        if (li == 0) {
            sm_m[grp * DEC_NR + r] = m[r];
            sm_l[grp * DEC_NR + r] = l[r];
        }
#pragma unroll
        for (int c = 0; c < S::CPL; c++)
#pragma unroll
            for (int e = 0; e < S::VE; e++)
                sm_o[(grp * DEC_NR + r) * D + (li * S::CPL + c) * S::VE + e] =
                    acc[r][c * S::VE + e];
    }
    __syncthreads();
    dec_merge_groups<D, S::NG>(a, part, sm_o, sm_m, sm_l, nr, tok, h0, x, sp, n_split);
}

/* Merges the splits of every work item: one thread per (item, head, dim). */
__global__ void attn_combine_kernel(cuk_attn_args a, int32_t n_hc, int32_t n_split,
                                    const float *part, int64_t n_items)
{
    cuk_pdl_trigger(); /* the output projection (a GEMV) follows */
    int32_t D = a.head_dim, n_rep = a.n_heads / a.n_kv_heads;
    int64_t total = n_items * DEC_NR * D;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < total;
         it += (int64_t)gridDim.x * blockDim.x) {
        int64_t x = it / (DEC_NR * D);
        int r = (int)((it / D) % DEC_NR), d = (int)(it % D);
        int32_t hc = (int32_t)(x % n_hc), g = (int32_t)((x / n_hc) % a.n_kv_heads);
        int64_t tok = x / ((int64_t)n_hc * a.n_kv_heads);
        if (hc * DEC_NR + r >= n_rep)
            continue;
        float M = -INFINITY;
        for (int32_t sp = 0; sp < n_split; sp++)
            M = fmaxf(M, part[((x * n_split + sp) * DEC_NR + r) * (D + 2) + D]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
            for (int32_t sp = 0; sp < n_split; sp++) {
                const float *pp = part + ((x * n_split + sp) * DEC_NR + r) * (D + 2);
                float w = exp2f(pp[D] - M);
                L += pp[D + 1] * w;
                O += pp[d] * w;
            }
        }
        int32_t h = g * n_rep + hc * DEC_NR + r;
        a.out[(tok * a.n_heads + h) * D + d] = L > 0.0f ? O / L : 0.0f;
    }
}

extern "C" int cuk_attn_decode_supported(int32_t head_dim, int32_t dtype)
{
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && dtype >= 0 && dtype <= 2;
}

static int32_t dec_n_hc(const cuk_attn_args *a)
{
    int32_t n_rep = a->n_heads / a->n_kv_heads;
    return (n_rep + DEC_NR - 1) / DEC_NR;
}

extern "C" size_t cuk_attn_decode_scratch(const cuk_attn_args *a, int32_t n_split)
{
    int64_t items = (int64_t)a->n_tok * a->n_kv_heads * dec_n_hc(a);
    return (size_t)items * (size_t)n_split * DEC_NR * (size_t)(a->head_dim + 2);
}

/* Pipeline depth of the decode kernel: 3 stages (LLMEM_CUDA_DEC_NS=2 picks 2). */
static int dec_stages()
{
    static int ns = 0;
    if (ns == 0) {
        const char *e = getenv("LLMEM_CUDA_DEC_NS");
        ns = e && atoi(e) == 2 ? 2 : 3;
    }
    return ns;
}

template <typename T, int D, int NS>
static cudaError_t dec_launch(const cuk_attn_args *a, int32_t n_split, float *part,
                              cudaStream_t stream)
{
    constexpr size_t smem = dec_smem_bytes<T, D, NS>();
    static_assert(smem <= 48 * 1024, "no opt-in for more dynamic shared memory");
    int32_t n_hc = dec_n_hc(a);
    int64_t items = (int64_t)a->n_tok * a->n_kv_heads * n_hc;
    dim3 grid((unsigned)items, (unsigned)n_split);
    attn_decode_kernel<T, D, NS><<<grid, DEC_WARPS * 32, smem, stream>>>(*a, n_hc, n_split, part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1)
        return e;
    attn_combine_kernel<<<cuk_grid(items * DEC_NR * D, 256), 256, 0, stream>>>(*a, n_hc, n_split,
                                                                                part, items);
    return cudaGetLastError();
}

template <typename T, int D>
static cudaError_t dec_stage_dispatch(const cuk_attn_args *a, int32_t n_split, float *part,
                                      cudaStream_t stream)
{
    return dec_stages() == 2 ? dec_launch<T, D, 2>(a, n_split, part, stream)
                             : dec_launch<T, D, 3>(a, n_split, part, stream);
}

/* The tensor-core decode kernel (attention_decode_tc.cuh): f16/bf16 pools,
 * head_dim 64 or 128; LLMEM_CUDA_DEC_TC=0 keeps the CUDA-core kernel. */
template <typename T, int D>
static cudaError_t dtc_launch(const cuk_attn_args *a, int32_t n_split, float *part,
                              cudaStream_t stream);

static bool dec_tc_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMEM_CUDA_DEC_TC");
        on = !(e && atoi(e) == 0);
    }
    return on == 1;
}

template <typename T>
static cudaError_t dec_dispatch(const cuk_attn_args *a, int32_t n_split, float *part,
                                cudaStream_t stream)
{
    if constexpr (sizeof(T) == 2) {
        if (dec_tc_on() && (uintptr_t)a->q % 16 == 0) {
            if (a->head_dim == 64)
                return dtc_launch<T, 64>(a, n_split, part, stream);
            if (a->head_dim == 128)
                return dtc_launch<T, 128>(a, n_split, part, stream);
        }
    }
    switch (a->head_dim) {
    case 64: return dec_stage_dispatch<T, 64>(a, n_split, part, stream);
    case 128: return dec_stage_dispatch<T, 128>(a, n_split, part, stream);
    case 256: return dec_stage_dispatch<T, 256>(a, n_split, part, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t cuk_attn_decode(const cuk_attn_args *a, int32_t n_split, int32_t max_kv,
                                       float *part, cudaStream_t stream)
{
    (void)max_kv;
    if (n_split < 1 || n_split > 65535 || (n_split > 1 && !part))
        return cudaErrorInvalidValue;
    /* Pools are addressed with 16-byte loads. */
    if ((uintptr_t)a->k % 16 || (uintptr_t)a->v % 16)
        return cudaErrorMisalignedAddress;
    switch (a->dtype) {
    case CUK_F32: return dec_dispatch<float>(a, n_split, part, stream);
    case CUK_F16: return dec_dispatch<cuk_f16_t>(a, n_split, part, stream);
    case CUK_BF16: return dec_dispatch<cuk_bf16_t>(a, n_split, part, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- generic fallback -------------------------------------------------------------------------- */

/* One warp per (token, query head); acc row in dynamic shared memory. */
__global__ void attn_generic_kernel(cuk_attn_args a)
{
    extern __shared__ float gen_acc[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t D = a.head_dim, n_rep = a.n_heads / a.n_kv_heads;
    float *acc = gen_acc + warp * D;
    int64_t n_items = (int64_t)a.n_tok * a.n_heads;
    for (int64_t it = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp; it < n_items;
         it += (int64_t)gridDim.x * (blockDim.x >> 5)) {
        int64_t tok = it / a.n_heads;
        int32_t h = (int32_t)(it % a.n_heads), g = h / n_rep;
        int32_t s = 0, lo = 0, hi = 0;
        if (!attn_query_range(a, tok, s, lo, hi))
            lo = hi = 0;
        const float *q = a.q + (tok * a.n_heads + h) * D;
        for (int d = lane; d < D; d += 32)
            acc[d] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        for (int32_t j = lo; j < hi; j++) {
            int64_t off = attn_key_offset(a, s, j, g);
            if (off < 0)
                continue;
            float dot = 0.0f;
            for (int d = lane; d < D; d += 32)
                dot += q[d] * cuk_load(a.k, a.dtype, off + d);
            dot = cuk_warp_sum(dot);
            float sc = attn_cap(dot * a.scale, a.softcap);
            float mn = fmaxf(m, sc);
            float corr = expf(m - mn), p = expf(sc - mn);
            l = l * corr + p;
            for (int d = lane; d < D; d += 32)
                acc[d] = acc[d] * corr + p * cuk_load(a.v, a.dtype, off + d);
            m = mn;
        }
        float *o = a.out + (tok * a.n_heads + h) * D;
        for (int d = lane; d < D; d += 32)
            o[d] = l > 0.0f ? acc[d] / l : 0.0f;
        __syncwarp();
    }
}

extern "C" cudaError_t cuk_attn_generic(const cuk_attn_args *a, cudaStream_t stream)
{
    size_t smem = (size_t)4 * a->head_dim * sizeof(float);
    if (smem > 48 * 1024)
        return cudaErrorInvalidValue;
    int64_t n_items = (int64_t)a->n_tok * a->n_heads;
    attn_generic_kernel<<<cuk_grid(n_items, 4), 128, smem, stream>>>(*a);
    return cudaGetLastError();
}

#include "kernels/attention_prefill.cuh"
#include "kernels/attention_prefill_tc.cuh"
#include "kernels/attention_prefill_wg.cuh"
#include "kernels/attention_decode_tc.cuh"

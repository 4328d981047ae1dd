/* llmem CUDA kernels: the fast-mode prefill attention (included by
 * attention.cu after attention_prefill.cuh, whose helpers it uses).
 *
 * FlashAttention-2 forward (Dao 2023, "FlashAttention-2: Faster Attention
 * with Better Parallelism and Work Partitioning", Alg. 1) on
 * mma.sync.m16n8k16 with one rounding: the scaled queries and the softmax
 * probabilities are rounded once to the pool dtype (f16 or bf16), products
 * are accumulated in f32, the running max and sum stay f32. This is the
 * arithmetic of FlashAttention-2 and of PyTorch's flash SDPA; the precise
 * mode keeps attention_prefill.cuh (hi + lo pairs, about f32 accuracy).
 *
 * Layout of a CTA (one GQA group, one tile of rows):
 * - BM = 16 * WARPS * MT rows of (query token, query head) pairs: HH heads
 *   of the group times TT = BM / HH consecutive query tokens, so every K/V
 *   block staged in shared memory serves all the heads that share it.
 * - Each warp owns MT m-tiles of 16 rows. With MT = 2 (FlashAttention-2's
 *   32 rows per warp) every K/V fragment read with ldmatrix feeds two MMAs;
 *   the Q fragments are re-read from shared memory at each k-step (held
 *   in registers they would not fit beside O and S).
 * - Keys come in blocks of BN through an NS-stage cp.async ring of
 *   XOR-swizzled [BN][D] tiles (ldmatrix for K, ldmatrix.trans for V);
 *   one barrier per block. Slots outside the rows' key range are
 *   zero-filled, never read from the pool.
 * - P stays in registers: the S accumulator fragments of two n-tiles are
 *   exactly the A fragment of one k16 step of the PV product.
 * - Causal tile skipping: a pass visits only the blocks between the lowest
 *   first key and the highest last key of its rows; only blocks that cross
 *   a row's window or causal edge are masked.
 * - Tokens of different streams in one tile (a SIMPLE ubatch) run one pass
 *   per stream with the other rows masked (as attention_prefill.cuh).
 */

template <typename T> struct ptc_pack;
template <> struct ptc_pack<cuk_f16_t> {
    __device__ __forceinline__ static uint32_t run(float x0, float x1)
    {
        __half2 h = __floats2half2_rn(x0, x1);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct ptc_pack<cuk_bf16_t> {
    __device__ __forceinline__ static uint32_t run(float x0, float x1)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};

/* The Q tile of a fast prefill CTA: row r (token t0 + r / hh, query head
 * g * n_rep + hc0 + r % hh) as q * scale in f32, rounded once to T, 16-byte
 * chunk ch stored at qs + off(r, ch); zeros for rows outside the tile.
 * NTH threads (the block) share the BM * D / 8 chunks. */
template <typename T, int D, int BM, int NTH, typename OFF>
__device__ __forceinline__ void ptc_load_q(const cuk_attn_args &a, unsigned char *qs, int64_t t0,
                                           int32_t hh, int32_t tt, int32_t hc0, int32_t n_rep,
                                           int32_t g, OFF off)
{
    constexpr int CH = D / 8;
#pragma unroll 4
    for (int c = threadIdx.x; c < BM * CH; c += NTH) {
        int r = c / CH, ch = c % CH;
        int64_t tok = t0 + r / hh;
        int32_t hr = hc0 + r % hh;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (r < hh * tt && tok < a.n_tok && hr < n_rep) {
            const float4 *s4 =
                (const float4 *)(a.q + (tok * a.n_heads + g * n_rep + hr) * D + ch * 8);
            float4 x0 = s4[0], x1 = s4[1];
            const float sc = a.scale;
            w.x = ptc_pack<T>::run(x0.x * sc, x0.y * sc);
            w.y = ptc_pack<T>::run(x0.z * sc, x0.w * sc);
            w.z = ptc_pack<T>::run(x1.x * sc, x1.y * sc);
            w.w = ptc_pack<T>::run(x1.z * sc, x1.w * sc);
        }
        *(uint4 *)(qs + off(r, ch)) = w;
    }
}

/* A compile-time bool for the generic lambdas below. */
template <bool B> struct cuk_bool {
    static constexpr bool value = B;
};

/* A kernel configuration: WARPS warps of MT m-tiles, key blocks of BN, an
 * NS-stage ring, at least MINB CTAs per SM (register cap), the block
 * loader's loop unrolled LU times (unrolled fully, its page lookups are
 * all hoisted and 32-row warps spill). PIPE defers block i's P V to block
 * i + 1, after that block's Q K^T, so that its MMAs can interleave with
 * the softmax of block i + 1 (FlashAttention-3's intra-warpgroup overlap,
 * Shah et al. 2024, Sec. 3.2); it needs NS >= 3 (V of block i stays). */
template <int WARPS_, int MT_, int BN_, int NS_, int MINB_, int LU_, bool PIPE_ = false>
struct ptc_cfg {
    static constexpr int WARPS = WARPS_, MT = MT_, BN = BN_, NS = NS_, MINB = MINB_, LU = LU_;
    static constexpr bool PIPE = PIPE_;
    static constexpr int BM = 16 * WARPS * MT;
};

/* Dynamic shared memory of a configuration: the Q tile and the ring. */
template <int D, typename C> constexpr size_t ptc_smem_bytes()
{
    return (size_t)C::BM * D * 2 + (size_t)C::NS * 2 * C::BN * D * 2;
}

/* One CTA per (tile of tt query tokens, chunk of hh query heads, KV head
 * blockIdx.z); tiles run longest first. CAP: a softcap is set. Writes the
 * normalized f32 rows of its valid (token, head) pairs, exact zeros for a
 * query that sees no key. */
template <typename T, int D, typename C, bool CAP>
__global__ void __launch_bounds__(C::WARPS * 32, C::MINB)
    attn_prefill_tc_kernel(cuk_attn_args a, int32_t hh, int32_t tt)
{
    constexpr int WARPS = C::WARPS, MT = C::MT, BN = C::BN, NS = C::NS, BM = C::BM;
    constexpr int CH = D / 8;  /* 16-byte chunks per row */
    constexpr int NT = BN / 8; /* key n-tiles per block */
    constexpr int DT = D / 8;  /* output n-tiles */
    constexpr int KT = D / 16; /* k-steps of Q K^T */
    constexpr uint32_t TILE = BN * D * 2; /* bytes of one K or V tile */
    static_assert(NS >= 2 && NT % 2 == 0 && DT % 2 == 0, "shape");
    static_assert(BN * CH % (WARPS * 32) == 0 && (WARPS * 32) % CH == 0, "whole chunks per thread");
    extern __shared__ __align__(128) unsigned char ptc_smem_raw[];
    unsigned char *qs = ptc_smem_raw;                          /* [BM][D] */
    const uint32_t ring = pf_smem(ptc_smem_raw + BM * D * 2); /* [NS][K, V][BN][D] */
    __shared__ int32_t row_seq[BM], row_lo[BM], row_hi[BM];
    __shared__ int32_t red[WARPS][6]; /* per-warp partials of a pass's reductions */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t n_rep = a.n_heads / a.n_kv_heads;
    const int32_t g = blockIdx.z;
    const int32_t ps_log2 = (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;
    const int32_t hc0 = blockIdx.y * hh;
    const int64_t t0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * tt; /* long tiles first */

    /* row r: token t0 + r / hh, head g * n_rep + hc0 + r % hh; row_seq is
     * the row's stream, -1 for a query that sees no key, -2 for padding */
    pf_tile_rows(a, BM, t0, hh, tt, hc0, n_rep, row_seq, row_lo, row_hi);
    /* Q tile: q * scale in f32, rounded once to T. Written after the first
     * pass has issued its first K/V copies, so both latencies overlap; the
     * barrier before the first block orders it before any ldmatrix. */
    auto load_q = [&]() {
        ptc_load_q<T, D, BM, WARPS * 32>(a, qs, t0, hh, tt, hc0, n_rep, g,
                                         [](int r, int ch) { return pf_off<D>(r, ch); });
    };
    bool q_done = false;

    int rr[MT][2];
    float o[MT][DT][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        rr[mt][0] = (warp * MT + mt) * 16 + (lane >> 2);
        rr[mt][1] = rr[mt][0] + 8;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int i = 0; i < DT; i++)
            o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    }

    int32_t prev = -1;
    for (;;) {
        const pf_pass ps = pf_next_pass<WARPS>(BM, prev, row_seq, row_lo, row_hi, red);
        const int32_t cur = ps.cur, jlo = ps.jlo, jhi = ps.jhi;
        /* blocks inside [lmax, hmin) of every row of a one-stream pass need
         * no mask (padding rows are never written out) */
        const int32_t hmin = ps.hmin, lmax = ps.lmax;
        const bool mixed = ps.mixed;
        if (cur == INT32_MAX)
            break;
        prev = cur;
        if (jlo >= jhi)
            continue;
        const int32_t *pt = a.page_table + attn_row(a, cur);
        const int32_t kb0 = jlo / BN * BN;
        const int32_t nblk = (jhi - kb0 + BN - 1) / BN;

        /* K and V rows of block i into ring stage i % NS; zeros outside
         * [jlo, jhi) and for bad page ids */
        auto load_block = [&](int32_t i) {
            const int32_t kb = kb0 + i * BN;
            const uint32_t st = ring + (uint32_t)(i % NS) * 2 * TILE;
            const int ch = tid % CH; /* fixed: WARPS * 32 is a multiple of CH */
#pragma unroll(C::LU)
            for (int it = 0; it < BN * CH / (WARPS * 32); it++) {
                const int row = tid / CH + it * (WARPS * 32 / CH);
                int64_t off = pf_kv_off<D>(a, pt, kb + row, jlo, jhi, ps_log2, g, ch);
                uint32_t so = st + pf_off<D>(row, ch);
                pf_cp_kv(so, so + TILE, a, off);
            }
        };

        /* One block: S = Q K^T, soft-cap, mask (EDGE), online softmax in
         * base 2, P rounded once to T in registers, O += P V. One straight
         * code path per (EDGE, CAP) case, so that the scheduler can
         * interleave the MMAs with the softmax. With PIPE the P V of the
         * previous block (PREV) runs between this block's softmax and the
         * rescale of O, independent of the softmax. */
        uint32_t pa[MT][BN / 16][4];  /* P of the current block */
        uint32_t pold[MT][BN / 16][4]; /* PIPE: P of the previous block */
        auto pv = [&](uint32_t vb, uint32_t (&pp)[MT][BN / 16][4]) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
                for (int dt = 0; dt < DT; dt += 2) {
                    int mi = lane >> 3;
                    int key = kk * 16 + (mi & 1) * 8 + (lane & 7);
                    uint32_t v0, v1, v2, v3;
                    pf_ldsm4t(vb + pf_off<D>(key, dt + (mi >> 1)), v0, v1, v2, v3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pf_type<T>::mma(o[mt][dt], pp[mt][kk], v0, v1);
                        pf_type<T>::mma(o[mt][dt + 1], pp[mt][kk], v2, v3);
                    }
                }
            }
        };
        auto step = [&](int32_t i, auto edge_tag, auto prev_tag) {
            constexpr bool EDGE = decltype(edge_tag)::value;
            constexpr bool PREV = decltype(prev_tag)::value;
            const int32_t kb = kb0 + i * BN;
            const uint32_t kbase = ring + (uint32_t)(i % NS) * 2 * TILE, vbase = kbase + TILE;
            float sc[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NT; n++)
                    sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KT; ks++) {
                uint32_t fa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int mi = lane >> 3;
                    int row = (warp * MT + mt) * 16 + (mi & 1) * 8 + (lane & 7);
                    pf_ldsm4(pf_smem(qs) + pf_off<D>(row, ks * 2 + (mi >> 1)), fa[mt][0],
                             fa[mt][1], fa[mt][2], fa[mt][3]);
                }
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    int mi = lane >> 3;
                    int key = n * 8 + (mi >> 1) * 8 + (lane & 7);
                    uint32_t b0, b1, b2, b3;
                    pf_ldsm4(kbase + pf_off<D>(key, ks * 2 + (mi & 1)), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pf_type<T>::mma(sc[mt][n], fa[mt], b0, b1);
                        pf_type<T>::mma(sc[mt][n + 1], fa[mt], b2, b3);
                    }
                }
            }
            float corr[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int32_t rlo0 = 0, rhi0 = 0, rlo1 = 0, rhi1 = 0;
                if (EDGE) {
                    int r0 = rr[mt][0], r1 = rr[mt][1];
                    rlo0 = row_lo[r0];
                    rhi0 = row_seq[r0] == cur ? row_hi[r0] : 0;
                    rlo1 = row_lo[r1];
                    rhi1 = row_seq[r1] == cur ? row_hi[r1] : 0;
                }
                float mx0 = m[mt][0], mx1 = m[mt][1];
#pragma unroll
                for (int n = 0; n < NT; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = sc[mt][n][e];
                        if (CAP)
                            x = attn_cap(x, a.softcap);
                        if (EDGE) {
                            int32_t j = kb + n * 8 + 2 * (lane & 3) + (e & 1);
                            bool vis = e < 2 ? j >= rlo0 && j < rhi0 : j >= rlo1 && j < rhi1;
                            x = vis ? x : -INFINITY;
                        }
                        sc[mt][n][e] = x;
                        if (e < 2)
                            mx0 = fmaxf(mx0, x);
                        else
                            mx1 = fmaxf(mx1, x);
                    }
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                /* rows with no visible key so far keep m = -inf and p = 0 */
                const float b0 = mx0 == -INFINITY ? 0.0f : mx0 * LOG2E;
                const float b1 = mx1 == -INFINITY ? 0.0f : mx1 * LOG2E;
                const float corr0 = pf_exp2(fmaf(m[mt][0], LOG2E, -b0));
                const float corr1 = pf_exp2(fmaf(m[mt][1], LOG2E, -b1));
                m[mt][0] = mx0;
                m[mt][1] = mx1;
                float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    float p0 = pf_exp2(fmaf(sc[mt][n][0], LOG2E, -b0));
                    float p1 = pf_exp2(fmaf(sc[mt][n][1], LOG2E, -b0));
                    float p2 = pf_exp2(fmaf(sc[mt][n][2], LOG2E, -b1));
                    float p3 = pf_exp2(fmaf(sc[mt][n][3], LOG2E, -b1));
                    sum0 += p0 + p1;
                    sum1 += p2 + p3;
                    pa[mt][n / 2][(n & 1) * 2] = ptc_pack<T>::run(p0, p1);
                    pa[mt][n / 2][(n & 1) * 2 + 1] = ptc_pack<T>::run(p2, p3);
                }
                l[mt][0] = l[mt][0] * corr0 + sum0;
                l[mt][1] = l[mt][1] * corr1 + sum1;
                corr[mt][0] = corr0;
                corr[mt][1] = corr1;
            }
            if (C::PIPE) {
                if (PREV)
                    pv(ring + (uint32_t)((i + NS - 1) % NS) * 2 * TILE + TILE, pold);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int i2 = 0; i2 < DT; i2++) {
                    o[mt][i2][0] *= corr[mt][0];
                    o[mt][i2][1] *= corr[mt][0];
                    o[mt][i2][2] *= corr[mt][1];
                    o[mt][i2][3] *= corr[mt][1];
                }
            if (C::PIPE) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            pold[mt][kk][e] = pa[mt][kk][e];
            } else {
                pv(vbase, pa);
            }
        };

        /* blocks ahead in the ring: NS - 1, or NS - 2 with PIPE (the
         * previous block's V stays for its deferred P V) */
        constexpr int AHEAD = C::PIPE ? NS - 2 : NS - 1;
        static_assert(AHEAD >= 1, "PIPE needs NS >= 3");
#pragma unroll
        for (int i = 0; i < AHEAD; i++) {
            if (i < nblk)
                load_block(i);
            pf_commit();
        }
        if (!q_done) {
            load_q();
            q_done = true;
        }
        for (int32_t i = 0; i < nblk; i++) {
            pf_wait<AHEAD - 1>(); /* block i has landed (this thread's copies) */
            __syncthreads();      /* ... everyone's; the stage it refills is free */
            if (i + AHEAD < nblk)
                load_block(i + AHEAD);
            pf_commit();
            const int32_t kb = kb0 + i * BN;
            const bool edge = mixed || kb + BN > hmin || kb < lmax;
            if (C::PIPE && i > 0) {
                if (edge)
                    step(i, cuk_bool<true>(), cuk_bool<true>());
                else
                    step(i, cuk_bool<false>(), cuk_bool<true>());
            } else {
                if (edge)
                    step(i, cuk_bool<true>(), cuk_bool<false>());
                else
                    step(i, cuk_bool<false>(), cuk_bool<false>());
            }
        }
        if (C::PIPE) /* the last block's P V */
            pv(ring + (uint32_t)((nblk - 1) % NS) * 2 * TILE + TILE, pold);
        pf_wait<0>();
    }

    pf_store<MT, DT, D>(a, o, l, rr, t0, hh, tt, hc0, n_rep, g, lane);
}

template <typename T, int D, typename C, bool CAP>
static cudaError_t ptc_launch_cap(const cuk_attn_args *a, cudaStream_t stream)
{
    constexpr size_t smem = ptc_smem_bytes<D, C>();
    static unsigned long long sized; /* devices whose limit is raised */
    cudaError_t e = cuk_smem_once(attn_prefill_tc_kernel<T, D, C, CAP>, (int)smem, &sized);
    if (e != cudaSuccess)
        return e;
    int32_t hh, tt;
    dim3 grid = pf_grid(a, C::BM, &hh, &tt);
    attn_prefill_tc_kernel<T, D, C, CAP><<<grid, C::WARPS * 32, smem, stream>>>(*a, hh, tt);
    return cudaGetLastError();
}

/* Launches one configuration: grid (token tiles, head chunks, KV heads);
 * the soft-capped variant only when a softcap is set. */
template <typename T, int D, typename C>
static cudaError_t ptc_launch(const cuk_attn_args *a, cudaStream_t stream)
{
    return a->softcap > 0.0f ? ptc_launch_cap<T, D, C, true>(a, stream)
                             : ptc_launch_cap<T, D, C, false>(a, stream);
}

/* The landed configuration (docs/benchmarks.md, "Prefill attention, fast
 * mode"), and the pipelined one that LLMEM_CUDA_PF_PIPE=1 picks (read once
 * per process). */
typedef ptc_cfg<8, 2, 64, 2, 1, 4> ptc_default;
typedef ptc_cfg<8, 2, 32, 3, 1, 2, true> ptc_pipe;

static bool ptc_pipe_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMEM_CUDA_PF_PIPE");
        on = e && atoi(e) == 1;
    }
    return on == 1;
}

template <typename T, int D>
static cudaError_t ptc_dispatch(const cuk_attn_args *a, cudaStream_t stream)
{
    return ptc_pipe_on() ? ptc_launch<T, D, ptc_pipe>(a, stream)
                         : ptc_launch<T, D, ptc_default>(a, stream);
}

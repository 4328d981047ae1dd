/* llmem CUDA kernels: the fast-mode prefill attention on Hopper's
 * warpgroup MMA (included by attention.cu after attention_prefill_tc.cuh,
 * whose helpers it uses).
 *
 * The same rows, passes, key ranges and arithmetic as attention_prefill_tc.cuh
 * (FlashAttention-2 forward, Dao 2023, Alg. 1: q * scale and the softmax
 * probabilities rounded once to the pool dtype, f32 accumulation and online
 * softmax), with the two products on wgmma.mma_async (sm_90a), as
 * FlashAttention-3 does (Shah et al. 2024, "FlashAttention-3: Fast and
 * Accurate Attention with Asynchrony and Low-precision", Sec. 3):
 * - A CTA of NWG warpgroups holds BM = 64 * NWG rows of (query token, query
 *   head) pairs of one GQA group; warpgroup w owns rows 64w .. 64w + 63.
 * - Q and each K/V block sit in shared memory in the 128-byte-swizzled
 *   layout wgmma reads: panels of 64 dims, [rows][64] each, 16-byte chunk c
 *   of row r at chunk position c ^ (r & 7). S = Q K^T reads both from
 *   shared memory (K-major); O += P V takes P from registers (the S
 *   accumulator fragments of two 8-key column groups are one 16-key A
 *   fragment, as with mma.sync) and V from shared memory (MN-major).
 * - K/V blocks of BN keys come through an NS-stage cp.async ring over the
 *   paged pool (pages of any size: no tensor-map copies), one barrier per
 *   block, slots outside the rows' key range zero-filled. A fence orders
 *   the copies (and the Q stores) before the tensor cores read them.
 * - PIPE: FlashAttention-3's intra-warpgroup overlap (Sec. 3.2): block
 *   i + 1's Q K^T and block i's P V are in flight together, and block
 *   i + 1's softmax runs while P V of block i is still on the tensor cores;
 *   O is rescaled after that product lands. Needs NS = 3.
 * Causal tile skipping, edge masking and stream passes are those of the
 * mma.sync kernel. The sm_90a instructions exist only in the device pass
 * for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); other passes get an empty kernel
 * that the host never launches (pwg_usable).
 */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PWG_ARCH 1
#else
#define PWG_ARCH 0
#endif

/* wgmma m64nNk16 with f32 accumulators: ssN (A and B from shared memory,
 * both K-major) and rsN (A from registers, B MN-major, i.e. transposed);
 * acc = 0 overwrites d instead of adding to it. Only the sm_90a pass
 * calls them. */
template <typename T> struct pwg_mma;
#define PWG_MMA(TY, AB)                                                                            \
template <> struct pwg_mma<TY> {                                                                   \
    __device__ __forceinline__ static void ss64(float *d, uint64_t da, uint64_t db, int acc)       \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " {"                  \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "                          \
                     "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "                \
                     "%24, %25, %26, %27, %28, %29, %30, %31"                                      \
                     "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                            \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),                 \
                       "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),                 \
                       "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),            \
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
                       "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),            \
                       "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
                       "+f"(d[30]), "+f"(d[31])                                                    \
                     : "l"(da), "l"(db), "r"(acc));                                                \
    }                                                                                              \
    __device__ __forceinline__ static void ss128(float *d, uint64_t da, uint64_t db, int acc)      \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." AB "." AB " {"                 \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "                          \
                     "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "                \
                     "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "                \
                     "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                \
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "                \
                     "%60, %61, %62, %63"                                                          \
                     "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                            \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),                 \
                       "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),                 \
                       "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),            \
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
                       "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),            \
                       "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
                       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),            \
                       "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),            \
                       "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),            \
                       "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),            \
                       "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),            \
                       "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),            \
                       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                          \
                     : "l"(da), "l"(db), "r"(acc));                                                \
    }                                                                                              \
    __device__ __forceinline__ static void rs64(float *d, const uint32_t *a,                       \
                                                uint64_t db, int acc)                              \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " {"                  \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "                          \
                     "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "                \
                     "%24, %25, %26, %27, %28, %29, %30, %31"                                      \
                     "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                              \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),                 \
                       "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),                 \
                       "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),            \
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
                       "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),            \
                       "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
                       "+f"(d[30]), "+f"(d[31])                                                    \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));             \
    }                                                                                              \
    __device__ __forceinline__ static void rs128(float *d, const uint32_t *a,                      \
                                                 uint64_t db, int acc)                             \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." AB "." AB " {"                 \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "                          \
                     "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "                \
                     "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "                \
                     "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                \
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "                \
                     "%60, %61, %62, %63"                                                          \
                     "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                              \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),                 \
                       "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),                 \
                       "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),            \
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
                       "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),            \
                       "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
                       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),            \
                       "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),            \
                       "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),            \
                       "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),            \
                       "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),            \
                       "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),            \
                       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));             \
    }                                                                                              \
};
PWG_MMA(cuk_f16_t, "f16")
PWG_MMA(cuk_bf16_t, "bf16")
#undef PWG_MMA

template <typename T, int N>
__device__ __forceinline__ void pwg_ss(float *d, uint64_t da, uint64_t db, int acc)
{
#if PWG_ARCH
    if constexpr (N == 64)
        pwg_mma<T>::ss64(d, da, db, acc);
    else
        pwg_mma<T>::ss128(d, da, db, acc);
#endif
}

template <typename T, int N>
__device__ __forceinline__ void pwg_rs(float *d, const uint32_t *a, uint64_t db, int acc)
{
#if PWG_ARCH
    if constexpr (N == 64)
        pwg_mma<T>::rs64(d, a, db, acc);
    else
        pwg_mma<T>::rs128(d, a, db, acc);
#endif
}

__device__ __forceinline__ void pwg_fence()
{
#if PWG_ARCH
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pwg_commit()
{
#if PWG_ARCH
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void pwg_wait()
{
#if PWG_ARCH
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/* Orders this thread's shared-memory writes (st.shared, cp.async) before
 * the async proxy's reads (wgmma); a barrier must follow. */
__device__ __forceinline__ void pwg_proxy_fence()
{
#if PWG_ARCH
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Keeps the compiler from moving uses of x across this point (after a
 * wgmma wait: the accumulators and A registers are the product's until
 * then). */
__device__ __forceinline__ void pwg_keep(float &x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pwg_keep(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }

/* Byte offset of (row, 16-byte chunk) in a 128-byte-swizzled tile of R
 * rows: panels of 64 dims ([R][128 bytes] each, R * 128 bytes apart). */
template <int R> __device__ __forceinline__ uint32_t pwg_off(int row, int ch)
{
    return (uint32_t)((ch >> 3) * (R * 128) + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
}

/* wgmma shared-memory descriptor: start address, leading and stride byte
 * offsets, 128-byte swizzle (PTX ISA, "Matrix Descriptor Format"). */
__device__ __forceinline__ uint64_t pwg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3ffffu) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

/* A configuration: NWG warpgroups, key blocks of BN, an NS-stage ring,
 * PIPE (FlashAttention-3's intra-warpgroup overlap; NS = 3), at least MINB
 * CTAs per SM (register cap), VSWAP (the V descriptor's two offsets
 * swapped: a wrong layout, kept in the bench harness as a check that the
 * float64 comparison catches one). */
template <int NWG_, int BN_, int NS_, bool PIPE_, int MINB_ = 1, bool VSWAP_ = false>
struct pwg_cfg {
    static constexpr int NWG = NWG_, BN = BN_, NS = NS_, BM = 64 * NWG_, MINB = MINB_;
    static constexpr bool PIPE = PIPE_, VSWAP = VSWAP_;
    static_assert(!PIPE_ || NS_ == 3, "PIPE runs a 3-stage ring");
};

/* Dynamic shared memory: 1024 bytes of alignment slack, the Q tile, the ring. */
template <int D, typename C> constexpr size_t pwg_smem_bytes()
{
    return 1024 + (size_t)C::BM * D * 2 + (size_t)C::NS * 2 * C::BN * D * 2;
}

/* One CTA per (tile of tt query tokens, chunk of hh query heads, KV head
 * blockIdx.z), long tiles first; writes what attn_prefill_tc_kernel writes. */
template <typename T, int D, typename C, bool CAP>
__global__ void __launch_bounds__(C::NWG * 128, C::MINB)
    attn_prefill_wg_kernel(cuk_attn_args a, int32_t hh, int32_t tt)
{
#if PWG_ARCH
    constexpr int WARPS = 4 * C::NWG, BN = C::BN, NS = C::NS, BM = C::BM;
    constexpr int CH = D / 8;  /* 16-byte chunks per row */
    constexpr int NT = BN / 8; /* key n-tiles per block */
    constexpr int DT = D / 8;  /* output n-tiles */
    constexpr int KT = D / 16; /* k-steps of Q K^T */
    constexpr uint32_t TILE = BN * D * 2;
    constexpr int LROWS = WARPS * 32 / CH; /* key rows a pass of the block's threads copies */
    static_assert((WARPS * 32) % CH == 0, "whole rows per pass");
    extern __shared__ unsigned char pwg_smem_raw[];
    const uint32_t raw = pf_smem(pwg_smem_raw);
    const uint32_t qs = (raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
    unsigned char *qp = pwg_smem_raw + (qs - raw);
    const uint32_t ring = qs + BM * D * 2; /* [NS][K, V][BN][D] */
    __shared__ int32_t row_seq[BM], row_lo[BM], row_hi[BM];
    __shared__ int32_t red[WARPS][6];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int32_t n_rep = a.n_heads / a.n_kv_heads;
    const int32_t g = blockIdx.z;
    const int32_t ps_log2 = (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;
    const int32_t hc0 = blockIdx.y * hh;
    const int64_t t0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * tt;

    pf_tile_rows(a, BM, t0, hh, tt, hc0, n_rep, row_seq, row_lo, row_hi);
    auto load_q = [&]() {
        ptc_load_q<T, D, BM, WARPS * 32>(a, qp, t0, hh, tt, hc0, n_rep, g,
                                         [](int r, int ch) { return pwg_off<BM>(r, ch); });
    };
    bool q_done = false;

    /* rows of this thread: warp * 16 + lane / 4 (+ 8), the wgmma
     * accumulator layout (each warp of a warpgroup holds 16 of its 64 rows) */
    int rr[1][2];
    rr[0][0] = warp * 16 + (lane >> 2);
    rr[0][1] = rr[0][0] + 8;
    float o[1][DT][4], m[1][2], l[1][2];
    m[0][0] = m[0][1] = -INFINITY;
    l[0][0] = l[0][1] = 0.0f;
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.0f;
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;

    int32_t prev = -1;
    for (;;) {
        const pf_pass ps = pf_next_pass<WARPS>(BM, prev, row_seq, row_lo, row_hi, red);
        const int32_t cur = ps.cur, jlo = ps.jlo, jhi = ps.jhi;
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

        auto load_block = [&](int32_t i) {
            const int32_t kb = kb0 + i * BN;
            const uint32_t st = ring + (uint32_t)(i % NS) * 2 * TILE;
            const int ch = tid % CH;
#pragma unroll 4
            for (int it = 0; it < (BN + LROWS - 1) / LROWS; it++) {
                const int row = tid / CH + it * LROWS;
                if (BN % LROWS != 0 && row >= BN)
                    break;
                int64_t off = pf_kv_off<D>(a, pt, kb + row, jlo, jhi, ps_log2, g, ch);
                uint32_t so = st + pwg_off<BN>(row, ch);
                pf_cp_kv(so, so + TILE, a, off);
            }
        };
        auto edge_of = [&](int32_t i) {
            const int32_t kb = kb0 + i * BN;
            return mixed || kb + BN > hmin || kb < lmax;
        };
        /* S = Q K^T of block i, issued (not waited for) */
        auto issue_s = [&](int32_t i) {
            const uint32_t kst = ring + (uint32_t)(i % NS) * 2 * TILE;
#pragma unroll
            for (int ks = 0; ks < KT; ks++) {
                uint64_t dq = pwg_desc(qs + (ks >> 2) * (BM * 128) + wg * 64 * 128 + (ks & 3) * 32,
                                       16, 1024);
                uint64_t dk = pwg_desc(kst + (ks >> 2) * (BN * 128) + (ks & 3) * 32, 16, 1024);
                pwg_ss<T, BN>(&s[0][0], dq, dk, ks > 0);
            }
        };
        /* O += P V of block i, issued */
        auto issue_pv = [&](int32_t i, const uint32_t (&pp)[BN / 16][4]) {
            const uint32_t vst = ring + (uint32_t)(i % NS) * 2 * TILE + TILE;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                pwg_rs<T, D>(&o[0][0][0], pp[kk],
                             C::VSWAP ? pwg_desc(vst + kk * 2048, 1024, BN * 128)
                                      : pwg_desc(vst + kk * 2048, BN * 128, 1024),
                             1);
        };
        /* soft-cap, mask (EDGE), online softmax in base 2 of block i's S;
         * P rounded once to T into pp, the rescale of O into corr */
        uint32_t pa[BN / 16][4], pn[BN / 16][4]; /* P in flight, P being made */
        float corr[2];
        auto softmax = [&](int32_t i, auto edge_tag) {
            constexpr bool EDGE = decltype(edge_tag)::value;
            const int32_t kb = kb0 + i * BN;
            int32_t rlo0 = 0, rhi0 = 0, rlo1 = 0, rhi1 = 0;
            if (EDGE) {
                int r0 = rr[0][0], r1 = rr[0][1];
                rlo0 = row_lo[r0];
                rhi0 = row_seq[r0] == cur ? row_hi[r0] : 0;
                rlo1 = row_lo[r1];
                rhi1 = row_seq[r1] == cur ? row_hi[r1] : 0;
            }
            /* the capped, masked scores go to x, not back to s: with PIPE
             * a P V product is in flight, and writing an accumulator of
             * the pipeline would make ptxas serialize every wgmma */
            float x[NT][4];
            float mx0 = m[0][0], mx1 = m[0][1];
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float xv = s[n][e];
                    if (CAP)
                        xv = attn_cap(xv, a.softcap);
                    if (EDGE) {
                        int32_t j = kb + n * 8 + 2 * (lane & 3) + (e & 1);
                        bool vis = e < 2 ? j >= rlo0 && j < rhi0 : j >= rlo1 && j < rhi1;
                        xv = vis ? xv : -INFINITY;
                    }
                    x[n][e] = xv;
                    if (e < 2)
                        mx0 = fmaxf(mx0, xv);
                    else
                        mx1 = fmaxf(mx1, xv);
                }
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            /* rows with no visible key so far keep m = -inf and p = 0 */
            const float b0 = mx0 == -INFINITY ? 0.0f : mx0 * LOG2E;
            const float b1 = mx1 == -INFINITY ? 0.0f : mx1 * LOG2E;
            corr[0] = pf_exp2(fmaf(m[0][0], LOG2E, -b0));
            corr[1] = pf_exp2(fmaf(m[0][1], LOG2E, -b1));
            m[0][0] = mx0;
            m[0][1] = mx1;
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                float p0 = pf_exp2(fmaf(x[n][0], LOG2E, -b0));
                float p1 = pf_exp2(fmaf(x[n][1], LOG2E, -b0));
                float p2 = pf_exp2(fmaf(x[n][2], LOG2E, -b1));
                float p3 = pf_exp2(fmaf(x[n][3], LOG2E, -b1));
                sum0 += p0 + p1;
                sum1 += p2 + p3;
                pn[n / 2][(n & 1) * 2] = ptc_pack<T>::run(p0, p1);
                pn[n / 2][(n & 1) * 2 + 1] = ptc_pack<T>::run(p2, p3);
            }
            l[0][0] = l[0][0] * corr[0] + sum0;
            l[0][1] = l[0][1] * corr[1] + sum1;
        };
        auto softmax_any = [&](int32_t i) {
            if (edge_of(i))
                softmax(i, cuk_bool<true>());
            else
                softmax(i, cuk_bool<false>());
        };
        auto rescale = [&]() {
#pragma unroll
            for (int i2 = 0; i2 < DT; i2++) {
                o[0][i2][0] *= corr[0];
                o[0][i2][1] *= corr[0];
                o[0][i2][2] *= corr[1];
                o[0][i2][3] *= corr[1];
            }
        };
        auto keep_s = [&]() {
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pwg_keep(s[n][e]);
        };
        auto keep_o = [&]() {
#pragma unroll
            for (int n = 0; n < DT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pwg_keep(o[0][n][e]);
        };
        auto keep_p = [&](uint32_t (&pp)[BN / 16][4]) {
#pragma unroll
            for (int n = 0; n < BN / 16; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pwg_keep(pp[n][e]);
        };

        if constexpr (!C::PIPE) {
#pragma unroll
            for (int i = 0; i < NS - 1; i++) {
                if (i < nblk)
                    load_block(i);
                pf_commit();
            }
            if (!q_done) {
                load_q();
                q_done = true;
            }
            for (int32_t i = 0; i < nblk; i++) {
                pf_wait<NS - 2>(); /* block i has landed (this thread's copies) */
                pwg_proxy_fence();
                __syncthreads(); /* ... everyone's; the stage it refills is free */
                if (i + NS - 1 < nblk)
                    load_block(i + NS - 1);
                pf_commit();
                pwg_fence();
                issue_s(i);
                pwg_commit();
                pwg_wait<0>();
                keep_s();
                softmax_any(i);
                rescale();
                pwg_fence();
                issue_pv(i, pn);
                pwg_commit();
                pwg_wait<0>();
                keep_o();
                keep_p(pn);
            }
        } else {
            load_block(0);
            pf_commit();
            if (nblk > 1)
                load_block(1);
            pf_commit();
            if (!q_done) {
                load_q();
                q_done = true;
            }
            pf_wait<1>();
            pwg_proxy_fence();
            __syncthreads();
            pwg_fence();
            issue_s(0);
            pwg_commit();
            pwg_wait<0>();
            keep_s();
            softmax_any(0);
            rescale();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    pa[kk][e] = pn[kk][e];
            for (int32_t i = 0; i < nblk; i++) {
                const bool more = i + 1 < nblk;
                if (more) {
                    pf_wait<0>(); /* block i + 1 */
                    pwg_proxy_fence();
                    __syncthreads(); /* and block i - 1's stage is free everywhere */
                    if (i + 2 < nblk)
                        load_block(i + 2);
                    pf_commit();
                }
                pwg_fence();
                if (more) {
                    issue_s(i + 1);
                    pwg_commit();
                }
                issue_pv(i, pa);
                pwg_commit();
                if (more) {
                    pwg_wait<1>(); /* S of block i + 1; P V of block i may still run */
                    keep_s();
                    softmax_any(i + 1);
                    pwg_wait<0>();
                    keep_o();
                    keep_p(pa);
                    rescale();
#pragma unroll
                    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            pa[kk][e] = pn[kk][e];
                } else {
                    pwg_wait<0>();
                    keep_o();
                    keep_p(pa);
                }
            }
        }
        pf_wait<0>();
    }

    pf_store<1, DT, D>(a, o, l, rr, t0, hh, tt, hc0, n_rep, g, lane);
#endif
}

template <typename T, int D, typename C, bool CAP>
static cudaError_t pwg_launch_cap(const cuk_attn_args *a, cudaStream_t stream)
{
    constexpr size_t smem = pwg_smem_bytes<D, C>();
    static unsigned long long sized; /* devices whose limit is raised */
    cudaError_t e = cuk_smem_once(attn_prefill_wg_kernel<T, D, C, CAP>, (int)smem, &sized);
    if (e != cudaSuccess)
        return e;
    int32_t hh, tt;
    dim3 grid = pf_grid(a, C::BM, &hh, &tt);
    attn_prefill_wg_kernel<T, D, C, CAP><<<grid, C::NWG * 128, smem, stream>>>(*a, hh, tt);
    return cudaGetLastError();
}

template <typename T, int D, typename C>
static cudaError_t pwg_launch(const cuk_attn_args *a, cudaStream_t stream)
{
    return a->softcap > 0.0f ? pwg_launch_cap<T, D, C, true>(a, stream)
                             : pwg_launch_cap<T, D, C, false>(a, stream);
}

/* The landed configuration (docs/benchmarks.md, "Prefill attention on
 * wgmma"). */
typedef pwg_cfg<2, 64, 2, false, 2> pwg_default;

/* Whether the wgmma kernel runs on the current device: the plugin was
 * built with sm_90a code (LLMEM_CUDA_SM90A, set by CMake when
 * LLMEM_CUDA_ARCHS names 90a), the device is compute capability 9.0, and
 * $LLMEM_CUDA_PF_WG is not 0 (read once per process). The answer is
 * cached per device (64 devices) in two bit sets updated atomically, so
 * threads of several ranks may ask at once. */
static bool pwg_usable(void)
{
#if defined(LLMEM_CUDA_SM90A)
    static int env = -1;
    static unsigned long long known, ok;
    int en = __atomic_load_n(&env, __ATOMIC_RELAXED);
    if (en < 0) {
        const char *e = getenv("LLMEM_CUDA_PF_WG");
        en = !(e && atoi(e) == 0);
        __atomic_store_n(&env, en, __ATOMIC_RELAXED);
    }
    if (!en)
        return false;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return false;
    const unsigned long long bit = 1ull << dev;
    if (__atomic_load_n(&known, __ATOMIC_ACQUIRE) & bit)
        return (__atomic_load_n(&ok, __ATOMIC_RELAXED) & bit) != 0;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    const bool yes = major == 9 && minor == 0;
    if (yes)
        __atomic_fetch_or(&ok, bit, __ATOMIC_RELAXED);
    __atomic_fetch_or(&known, bit, __ATOMIC_RELEASE);
    return yes;
#else
    return false;
#endif
}

template <typename T, int D> struct ptc_fast {
    static cudaError_t run(const cuk_attn_args *a, cudaStream_t stream)
    {
        if (pwg_usable())
            return pwg_launch<T, D, pwg_default>(a, stream);
        return ptc_dispatch<T, D>(a, stream);
    }
};

extern "C" cudaError_t cuk_attn_prefill_fast(const cuk_attn_args *a, cudaStream_t stream)
{
    return pf_dispatch<ptc_fast>(a, stream);
}

/* llmem CUDA kernels: tensor-core prefill attention (included by
 * attention.cu; see its comment).
 *
 * FlashAttention-2 forward (Dao 2023, Alg. 1) on mma.sync.m16n8k16 with
 * f16/bf16 operands and f32 accumulators. One CTA holds BM = 16 * WARPS rows
 * of (query token, query head) pairs of one GQA group: HH heads of the group
 * times TT = BM / HH consecutive query tokens. Keys come in blocks of 64,
 * staged with cp.async into a double-buffered, XOR-swizzled shared-memory
 * tile (zero-filled outside [lo, hi) so that masked rows never meet
 * unwritten pool contents), and read with ldmatrix (.trans for V).
 *
 * Tokens of one tile usually belong to one stream. When they do not (a
 * SIMPLE ubatch), the CTA runs one pass per distinct stream with the rows of
 * the other streams masked, which keeps every row's online softmax exact.
 */

#define PF_BN 64

/* 2^x in one MUFU instruction (inputs here are <= 0 or -inf; relative error
 * about 2^-22, far below the f32 threshold). */
__device__ __forceinline__ float pf_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void pf_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                         uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void pf_ldsm4t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                          uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

template <typename T> struct pf_type;
template <> struct pf_type<cuk_f16_t> {
    /* x = hi + lo, each rounded to f16; returns hi, lo in *lo_w */
    __device__ __forceinline__ static uint32_t split(float x0, float x1, uint32_t *lo_w)
    {
        __half2 h = __floats2half2_rn(x0, x1);
        float2 b = __half22float2(h);
        __half2 l = __floats2half2_rn(x0 - b.x, x1 - b.y);
        *lo_w = *reinterpret_cast<uint32_t *>(&l);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __device__ __forceinline__ static void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct pf_type<cuk_bf16_t> {
    __device__ __forceinline__ static uint32_t split(float x0, float x1, uint32_t *lo_w)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
        float2 b = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(x0 - b.x, x1 - b.y);
        *lo_w = *reinterpret_cast<uint32_t *>(&l);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __device__ __forceinline__ static void mma(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* One 16-byte chunk of a Q tile: the 8 floats at src (16-byte aligned)
 * times scale, each split as hi + lo in T; w[i] / wl[i] hold the hi / lo
 * halves of pair i. */
template <typename T>
__device__ __forceinline__ void pf_split8(const float *src, float scale, uint32_t w[4],
                                          uint32_t wl[4])
{
    const float4 *s4 = (const float4 *)src;
    float4 x0 = s4[0], x1 = s4[1];
    w[0] = pf_type<T>::split(x0.x * scale, x0.y * scale, &wl[0]);
    w[1] = pf_type<T>::split(x0.z * scale, x0.w * scale, &wl[1]);
    w[2] = pf_type<T>::split(x1.x * scale, x1.y * scale, &wl[2]);
    w[3] = pf_type<T>::split(x1.z * scale, x1.w * scale, &wl[3]);
}

/* Byte offset of (row, 16-byte chunk) in a swizzled [rows][D] 16-bit tile. */
template <int D> __device__ __forceinline__ uint32_t pf_off(int row, int chunk)
{
    return (uint32_t)(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}

/* Element offset of 16-byte chunk ch of key j's row (KV head g) in the
 * pool, or -1 for a key outside [jlo, jhi) or a page id out of range (its
 * slot is then zero-filled, never read). pt: the stream's page-table row;
 * ps_log2: log2 of the page size when it is a power of two, else -1. */
template <int D>
__device__ __forceinline__ int64_t pf_kv_off(const cuk_attn_args &a, const int32_t *pt, int32_t j,
                                             int32_t jlo, int32_t jhi, int32_t ps_log2, int32_t g,
                                             int ch)
{
    if (j < jlo || j >= jhi)
        return -1;
    int32_t pi = ps_log2 >= 0 ? j >> ps_log2 : j / a.page_size;
    int32_t po = ps_log2 >= 0 ? j & (a.page_size - 1) : j % a.page_size;
    int32_t page = pt[pi];
    if (page < 0 || page >= a.n_pages)
        return -1;
    return (((int64_t)page * a.page_size + po) * a.n_kv_heads + g) * D + ch * 8;
}

/* The K and V chunks at pool offset off (pf_kv_off) into shared memory at
 * ks and vs; zeros for off < 0. */
__device__ __forceinline__ void pf_cp_kv(uint32_t ks, uint32_t vs, const cuk_attn_args &a,
                                         int64_t off)
{
    const uint16_t *kp = (const uint16_t *)a.k + (off >= 0 ? off : 0);
    const uint16_t *vp = (const uint16_t *)a.v + (off >= 0 ? off : 0);
    pf_cp16(ks, kp, off >= 0);
    pf_cp16(vs, vp, off >= 0);
}

/* Rows of a prefill tile (both prefill kernels): row r is token t0 + r / hh
 * and query head g * n_rep + hc0 + r % hh. Fills row_seq (the row's
 * stream, -1 for a query that sees no key, -2 for padding), row_lo and
 * row_hi (its key range); the block's threads take rows tid, tid +
 * blockDim.x, ... */
__device__ __forceinline__ void pf_tile_rows(const cuk_attn_args &a, int bm, int64_t t0, int32_t hh,
                                             int32_t tt, int32_t hc0, int32_t n_rep,
                                             int32_t *row_seq, int32_t *row_lo, int32_t *row_hi)
{
    for (int r = threadIdx.x; r < bm; r += blockDim.x) {
        int64_t tok = t0 + r / hh;
        int32_t hr = hc0 + r % hh;
        int32_t s = -1, lo = 0, hi = 0;
        bool in = r < hh * tt && tok < a.n_tok && hr < n_rep;
        if (!in || !attn_query_range(a, tok, s, lo, hi)) {
            s = in ? -1 : -2;
            lo = hi = 0;
        }
        row_seq[r] = s;
        row_lo[r] = lo;
        row_hi[r] = hi;
    }
}

/* One pass of a prefill tile: the rows of stream cur, the smallest stream
 * id above prev (INT32_MAX: no pass left), their key range [jlo, jhi),
 * the smallest row end hmin and the largest row start lmax, and whether
 * the tile holds rows of other streams (mixed). Block reductions over the
 * BM rows of the tile (red: WARPS x 6 words of shared memory); every
 * thread of the block calls it and gets the same answer. */
struct pf_pass {
    int32_t cur, jlo, jhi, hmin, lmax;
    bool mixed;
};

template <int WARPS>
__device__ __forceinline__ pf_pass pf_next_pass(int bm, int32_t prev, const int32_t *row_seq,
                                                const int32_t *row_lo, const int32_t *row_hi,
                                                int32_t (*red)[6])
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __syncthreads();
    int32_t c = INT32_MAX;
    for (int r = tid; r < bm; r += WARPS * 32) {
        int32_t sr = row_seq[r];
        c = sr > prev && sr < c ? sr : c;
    }
    c = __reduce_min_sync(0xffffffffu, c);
    if (lane == 0)
        red[warp][0] = c;
    __syncthreads();
    c = INT32_MAX;
#pragma unroll
    for (int w = 0; w < WARPS; w++)
        c = min(c, red[w][0]);
    int32_t jlo = INT32_MAX, jhi = 0, hmin = INT32_MAX, lmax = 0, mixed = 0;
    for (int r = tid; r < bm; r += WARPS * 32) {
        int32_t sr = row_seq[r];
        mixed |= sr != -2 && sr != c;
        if (sr != c)
            continue;
        int32_t lo = row_lo[r], hi = row_hi[r];
        hmin = min(hmin, hi);
        lmax = max(lmax, lo);
        if (hi > lo) {
            jlo = min(jlo, lo);
            jhi = max(jhi, hi);
        }
    }
    jlo = __reduce_min_sync(0xffffffffu, jlo);
    jhi = __reduce_max_sync(0xffffffffu, jhi);
    hmin = __reduce_min_sync(0xffffffffu, hmin);
    lmax = __reduce_max_sync(0xffffffffu, lmax);
    mixed = (int32_t)__reduce_or_sync(0xffffffffu, (unsigned)mixed);
    if (lane == 0) {
        red[warp][1] = jlo;
        red[warp][2] = jhi;
        red[warp][3] = hmin;
        red[warp][4] = lmax;
        red[warp][5] = mixed;
    }
    __syncthreads();
    pf_pass p;
    p.cur = c;
    p.jlo = jlo;
    p.jhi = jhi;
    p.hmin = hmin;
    p.lmax = lmax;
    p.mixed = mixed != 0;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
        p.jlo = min(p.jlo, red[w][1]);
        p.jhi = max(p.jhi, red[w][2]);
        p.hmin = min(p.hmin, red[w][3]);
        p.lmax = max(p.lmax, red[w][4]);
        p.mixed |= red[w][5] != 0;
    }
    return p;
}

/* The epilogue of both prefill kernels: each row's sum of probabilities
 * gathered over its quad, then o / sum written as float2 pairs for the
 * tile's valid rows (rr: the warp's rows per m-tile and half). */
template <int MT, int DT, int D>
__device__ __forceinline__ void pf_store(const cuk_attn_args &a, const float (&o)[MT][DT][4],
                                         const float (&l)[MT][2], const int (&rr)[MT][2],
                                         int64_t t0, int32_t hh, int32_t tt, int32_t hc0,
                                         int32_t n_rep, int32_t g, int lane)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float lv = l[mt][hf];
            lv += __shfl_xor_sync(0xffffffffu, lv, 1);
            lv += __shfl_xor_sync(0xffffffffu, lv, 2);
            float inv = lv > 0.0f ? 1.0f / lv : 0.0f;
            int r = rr[mt][hf];
            int64_t tok = t0 + r / hh;
            int32_t hr = hc0 + r % hh;
            if (r >= hh * tt || tok >= a.n_tok || hr >= n_rep)
                continue;
            float *dst = a.out + (tok * a.n_heads + g * n_rep + hr) * D + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < DT; i++)
                *(float2 *)(dst + i * 8) =
                    make_float2(o[mt][i][hf * 2] * inv, o[mt][i][hf * 2 + 1] * inv);
        }
    }
}

/* Each warp owns MT m-tiles of 16 rows: with MT = 2 every K/V fragment read
 * from shared memory feeds two MMAs (FlashAttention-2's 32 rows per warp),
 * and the Q fragments are re-read from shared memory per k-step instead of
 * being held in registers. */
template <typename T, int D, int WARPS, int MT>
__global__ void __launch_bounds__(WARPS * 32)
    attn_prefill_kernel(cuk_attn_args a, int32_t hh, int32_t tt, int32_t precise)
{
    constexpr int BM = 16 * WARPS * MT;
    constexpr int CH = D / 8;     /* 16-byte chunks per row */
    constexpr int NT = PF_BN / 8; /* key n-tiles per block */
    constexpr int DT = D / 8;     /* output n-tiles */
    constexpr bool QREG = MT == 1; /* Q fragments held in registers */
    /* With QREG the Q tile is read into registers before the first K/V
     * block lands, so it shares its shared memory with the K/V buffers. */
    extern __shared__ __align__(128) unsigned char pf_smem_raw[];
    unsigned char *qs = pf_smem_raw;                             /* [2][BM][D]: hi, lo */
    unsigned char *ks = pf_smem_raw + (QREG ? 0 : 2 * BM * D * 2); /* [2][BN][D] */
    unsigned char *vs = ks + 2 * PF_BN * D * 2;                  /* [2][BN][D] */
    __shared__ int32_t row_seq[BM], row_lo[BM], row_hi[BM];
    __shared__ int32_t pass_info[6];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int32_t n_rep = a.n_heads / a.n_kv_heads;
    int32_t g = blockIdx.z;
    int32_t ps_log2 = (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;
    int32_t hc0 = blockIdx.y * hh;
    int64_t t0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * tt; /* long tiles first */

    /* rows: token t0 + r / hh, head g * n_rep + hc0 + r % hh; row_seq is the
     * row's stream, -1 for a query that sees no key, -2 for padding */
    pf_tile_rows(a, BM, t0, hh, tt, hc0, n_rep, row_seq, row_lo, row_hi);
    /* Q tile, scaled, as hi + lo in T */
    for (int c = tid; c < BM * CH; c += blockDim.x) {
        int r = c / CH, ch = c % CH;
        int64_t tok = t0 + r / hh;
        int32_t hr = hc0 + r % hh;
        uint32_t w[4] = {0, 0, 0, 0}, wl[4] = {0, 0, 0, 0};
        if (r < hh * tt && tok < a.n_tok && hr < n_rep) {
            pf_split8<T>(a.q + (tok * a.n_heads + g * n_rep + hr) * D + ch * 8, a.scale, w, wl);
        }
        *(uint4 *)(qs + pf_off<D>(r, ch)) = make_uint4(w[0], w[1], w[2], w[3]);
        *(uint4 *)(qs + BM * D * 2 + pf_off<D>(r, ch)) = make_uint4(wl[0], wl[1], wl[2], wl[3]);
    }
    __syncthreads();

    /* Q fragment (hi, or lo) of m-tile mt for k-step kstep */
    auto q_frag = [&](int mt, int kstep, bool lo_half, uint32_t *f) {
        int mi = lane >> 3;
        int row = (warp * MT + mt) * 16 + (mi & 1) * 8 + (lane & 7);
        uint32_t at = pf_smem(qs) + (lo_half ? BM * D * 2 : 0) + pf_off<D>(row, kstep * 2 + (mi >> 1));
        pf_ldsm4(at, f[0], f[1], f[2], f[3]);
    };
    uint32_t qa[QREG ? D / 16 : 1][4], qb[QREG ? D / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int k2 = 0; k2 < (QREG ? D / 16 : 1); k2++) {
            q_frag(0, k2, false, qa[k2]);
            q_frag(0, k2, true, qb[k2]);
        }
    }

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
    bool cap = a.softcap > 0.0f;

    int32_t prev = -1;
    for (;;) {
        /* next stream of this tile: the smallest stream id above prev */
        __syncthreads();
        if (tid == 0) {
            int32_t cur = INT32_MAX, jlo = INT32_MAX, jhi = 0, hmin = INT32_MAX, lmax = 0;
            int32_t mixed = 0;
            for (int r = 0; r < BM; r++)
                if (row_seq[r] > prev && row_seq[r] < cur)
                    cur = row_seq[r];
            for (int r = 0; r < BM; r++) {
                if (row_seq[r] != -2 && row_seq[r] != cur)
                    mixed = 1;
                if (row_seq[r] != cur)
                    continue;
                hmin = min(hmin, row_hi[r]);
                lmax = max(lmax, row_lo[r]);
                if (row_hi[r] > row_lo[r]) {
                    jlo = min(jlo, row_lo[r]);
                    jhi = max(jhi, row_hi[r]);
                }
            }
            pass_info[0] = cur;
            pass_info[1] = jlo;
            pass_info[2] = jhi;
            pass_info[3] = hmin;
            pass_info[4] = lmax;
            pass_info[5] = mixed;
        }
        __syncthreads();
        int32_t cur = pass_info[0], jlo = pass_info[1], jhi = pass_info[2];
        /* blocks inside [lmax, hmin) of every row of this pass, in a tile of
         * one stream, need no mask (padding rows are never written out) */
        int32_t hmin = pass_info[3], lmax = pass_info[4];
        bool mixed = pass_info[5] != 0;
        if (cur == INT32_MAX)
            break;
        prev = cur;
        if (jlo >= jhi)
            continue;
        int32_t rlo[MT][2], rhi[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int r = rr[mt][hf];
                rlo[mt][hf] = row_lo[r];
                rhi[mt][hf] = row_seq[r] == cur ? row_hi[r] : 0;
            }
        const int32_t *pt = a.page_table + attn_row(a, cur);

        auto load_block = [&](int32_t kb, int buf) {
            for (int c = tid; c < PF_BN * CH; c += blockDim.x) {
                int row = c / CH, ch = c % CH;
                int64_t off = pf_kv_off<D>(a, pt, kb + row, jlo, jhi, ps_log2, g, ch);
                uint32_t so = buf * PF_BN * D * 2 + pf_off<D>(row, ch);
                pf_cp_kv(pf_smem(ks) + so, pf_smem(vs) + so, a, off);
            }
        };

        int32_t kb0 = jlo / PF_BN * PF_BN;
        load_block(kb0, 0);
        pf_commit();
        int buf = 0;
        for (int32_t kb = kb0; kb < jhi; kb += PF_BN, buf ^= 1) {
            if (kb + PF_BN < jhi)
                load_block(kb + PF_BN, buf ^ 1);
            pf_commit();
            pf_wait<1>();
            __syncthreads();

            /* S = Q K^T for MT x 16 rows x 64 keys */
            float sc[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int i = 0; i < NT; i++)
                    sc[mt][i][0] = sc[mt][i][1] = sc[mt][i][2] = sc[mt][i][3] = 0.0f;
            uint32_t kbase = pf_smem(ks) + buf * PF_BN * D * 2;
#pragma unroll
            for (int ks_ = 0; ks_ < D / 16; ks_++) {
                uint32_t fa[MT][4], fb[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (QREG) {
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            fa[mt][i] = qa[QREG ? ks_ : 0][i];
                            fb[mt][i] = qb[QREG ? ks_ : 0][i];
                        }
                    } else {
                        q_frag(mt, ks_, false, fa[mt]);
                        if (precise)
                            q_frag(mt, ks_, true, fb[mt]);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    int mi = lane >> 3;
                    int key = nt * 8 + (mi >> 1) * 8 + (lane & 7);
                    uint32_t b0, b1, b2, b3;
                    pf_ldsm4(kbase + pf_off<D>(key, ks_ * 2 + (mi & 1)), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pf_type<T>::mma(sc[mt][nt], fa[mt], b0, b1);
                        pf_type<T>::mma(sc[mt][nt + 1], fa[mt], b2, b3);
                        if (precise) {
                            pf_type<T>::mma(sc[mt][nt], fb[mt], b0, b1);
                            pf_type<T>::mma(sc[mt][nt + 1], fb[mt], b2, b3);
                        }
                    }
                }
            }

            /* soft-cap, base-2 scaling, mask (edge blocks only), online softmax */
            bool edge = mixed || kb + PF_BN > hmin || kb < lmax;
            uint32_t pa[MT][NT / 2][4], pl[MT][NT / 2][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx0 = m[mt][0], mx1 = m[mt][1];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = sc[mt][nt][e];
                        if (cap)
                            x = attn_cap(x, a.softcap);
                        x *= LOG2E;
                        if (edge) {
                            int32_t j = kb + nt * 8 + 2 * (lane & 3) + (e & 1);
                            int hf = e >> 1;
                            bool vis = j >= rlo[mt][hf] && j < rhi[mt][hf];
                            x = vis ? x : -INFINITY;
                        }
                        sc[mt][nt][e] = x;
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
                float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
                float corr0 = pf_exp2(m[mt][0] - base0), corr1 = pf_exp2(m[mt][1] - base1);
                m[mt][0] = mx0;
                m[mt][1] = mx1;
                float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    float p0 = pf_exp2(sc[mt][nt][0] - base0), p1 = pf_exp2(sc[mt][nt][1] - base0);
                    float p2 = pf_exp2(sc[mt][nt][2] - base1), p3 = pf_exp2(sc[mt][nt][3] - base1);
                    sum0 += p0 + p1;
                    sum1 += p2 + p3;
                    pa[mt][nt / 2][(nt & 1) * 2] =
                        pf_type<T>::split(p0, p1, &pl[mt][nt / 2][(nt & 1) * 2]);
                    pa[mt][nt / 2][(nt & 1) * 2 + 1] =
                        pf_type<T>::split(p2, p3, &pl[mt][nt / 2][(nt & 1) * 2 + 1]);
                }
                l[mt][0] = l[mt][0] * corr0 + sum0;
                l[mt][1] = l[mt][1] * corr1 + sum1;
#pragma unroll
                for (int i = 0; i < DT; i++) {
                    o[mt][i][0] *= corr0;
                    o[mt][i][1] *= corr0;
                    o[mt][i][2] *= corr1;
                    o[mt][i][3] *= corr1;
                }
            }

            /* O += P V */
            uint32_t vbase = pf_smem(vs) + buf * PF_BN * D * 2;
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
#pragma unroll
                for (int dt = 0; dt < DT; dt += 2) {
                    int mi = lane >> 3;
                    int key = kk * 16 + (mi & 1) * 8 + (lane & 7);
                    uint32_t b0, b1, b2, b3;
                    pf_ldsm4t(vbase + pf_off<D>(key, dt + (mi >> 1)), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pf_type<T>::mma(o[mt][dt], pa[mt][kk], b0, b1);
                        pf_type<T>::mma(o[mt][dt + 1], pa[mt][kk], b2, b3);
                        if (precise) {
                            pf_type<T>::mma(o[mt][dt], pl[mt][kk], b0, b1);
                            pf_type<T>::mma(o[mt][dt + 1], pl[mt][kk], b2, b3);
                        }
                    }
                }
            }
            __syncthreads();
        }
        pf_wait<0>();
    }

    pf_store<MT, DT, D>(a, o, l, rr, t0, hh, tt, hc0, n_rep, g, lane);
}

extern "C" int cuk_attn_prefill_supported(int32_t head_dim, int32_t dtype)
{
    return (head_dim == 64 || head_dim == 128) && (dtype == CUK_F16 || dtype == CUK_BF16);
}

/* The grid of a prefill launch with tiles of bm rows: (token tiles, head
 * chunks, KV heads), a tile being *hh query heads of a GQA group times *tt
 * consecutive query tokens. */
static dim3 pf_grid(const cuk_attn_args *a, int32_t bm, int32_t *hh, int32_t *tt)
{
    int32_t n_rep = a->n_heads / a->n_kv_heads;
    *hh = n_rep < bm ? n_rep : bm;
    *tt = bm / *hh;
    return dim3((unsigned)((a->n_tok + *tt - 1) / *tt), (unsigned)((n_rep + *hh - 1) / *hh),
                (unsigned)a->n_kv_heads);
}

template <typename T, int D, int WARPS, int MT>
static cudaError_t pf_launch_w(const cuk_attn_args *a, cudaStream_t stream)
{
    constexpr int BM = 16 * WARPS * MT;
    size_t q_bytes = (size_t)2 * BM * D * 2, kv_bytes = (size_t)4 * PF_BN * D * 2;
    size_t smem = MT == 1 ? (q_bytes > kv_bytes ? q_bytes : kv_bytes) : q_bytes + kv_bytes;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<T, D, WARPS, MT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    int32_t hh, tt;
    dim3 grid = pf_grid(a, BM, &hh, &tt);
    attn_prefill_kernel<T, D, WARPS, MT><<<grid, WARPS * 32, smem, stream>>>(*a, hh, tt,
                                                                            a->precise);
    return cudaGetLastError();
}

/* 4 warps of 16 rows. (MT = 2, 32 rows per warp, ran 1.35x slower on the
 * H100: 255 registers with spills; docs/benchmarks.md, CUDA, version 3.) */
template <typename T, int D>
static cudaError_t pf_launch(const cuk_attn_args *a, cudaStream_t stream)
{
    return pf_launch_w<T, D, 4, 1>(a, stream);
}

/* The launch of either prefill kernel for the pool dtype and head dim of
 * a: L<T, D>::run(a, stream) with T f16 or bf16 and D 64 or 128, after the
 * alignment both need (q rows and pool rows are read in 16-byte pieces).
 * cudaErrorMisalignedAddress or cudaErrorInvalidValue (another dtype or
 * head dim) otherwise. */
template <template <typename, int> class L>
static cudaError_t pf_dispatch(const cuk_attn_args *a, cudaStream_t stream)
{
    if ((uintptr_t)a->q % 16 || (uintptr_t)a->k % 16 || (uintptr_t)a->v % 16 ||
        (uintptr_t)a->out % 8)
        return cudaErrorMisalignedAddress;
    if (a->dtype == CUK_F16) {
        if (a->head_dim == 64)
            return L<cuk_f16_t, 64>::run(a, stream);
        if (a->head_dim == 128)
            return L<cuk_f16_t, 128>::run(a, stream);
    } else if (a->dtype == CUK_BF16) {
        if (a->head_dim == 64)
            return L<cuk_bf16_t, 64>::run(a, stream);
        if (a->head_dim == 128)
            return L<cuk_bf16_t, 128>::run(a, stream);
    }
    return cudaErrorInvalidValue;
}

template <typename T, int D> struct pf_precise {
    static cudaError_t run(const cuk_attn_args *a, cudaStream_t stream)
    {
        return pf_launch<T, D>(a, stream);
    }
};

extern "C" cudaError_t cuk_attn_prefill(const cuk_attn_args *a, cudaStream_t stream)
{
    return pf_dispatch<pf_precise>(a, stream);
}

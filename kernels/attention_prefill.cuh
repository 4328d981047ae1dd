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

/* Byte offset of (row, 16-byte chunk) in a swizzled [rows][D] 16-bit tile. */
template <int D> __device__ __forceinline__ uint32_t pf_off(int row, int chunk)
{
    return (uint32_t)(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}

template <typename T, int D, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    attn_prefill_kernel(cuk_attn_args a, int32_t hh, int32_t tt, int32_t precise)
{
    constexpr int BM = 16 * WARPS;
    constexpr int CH = D / 8; /* 16-byte chunks per row */
    constexpr int NT = PF_BN / 8; /* key n-tiles per block */
    constexpr int DT = D / 8;    /* output n-tiles */
    extern __shared__ __align__(128) unsigned char pf_smem_raw[];
    unsigned char *qs = pf_smem_raw;         /* [2][BM][D]: hi, lo */
    unsigned char *ks = qs + 2 * BM * D * 2; /* [2][BN][D] */
    unsigned char *vs = ks + 2 * PF_BN * D * 2; /* [2][BN][D] */
    __shared__ int32_t row_seq[BM], row_lo[BM], row_hi[BM];
    __shared__ int32_t pass_info[3];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int32_t n_rep = a.n_heads / a.n_kv_heads;
    int32_t g = blockIdx.z;
    int32_t hc0 = blockIdx.y * hh;
    int64_t t0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * tt; /* long tiles first */

    /* rows: token t0 + r / hh, head g * n_rep + hc0 + r % hh */
    for (int r = tid; r < BM; r += blockDim.x) {
        int64_t tok = t0 + r / hh;
        int32_t hr = hc0 + r % hh;
        int32_t s = -1, lo = 0, hi = 0;
        bool in = r < hh * tt && tok < a.n_tok && hr < n_rep;
        if (!in || !attn_query_range(a, tok, s, lo, hi)) {
            s = -1;
            lo = hi = 0;
        }
        row_seq[r] = s;
        row_lo[r] = lo;
        row_hi[r] = hi;
    }
    /* Q tile, scaled, as hi + lo in T */
    for (int c = tid; c < BM * CH; c += blockDim.x) {
        int r = c / CH, ch = c % CH;
        int64_t tok = t0 + r / hh;
        int32_t hr = hc0 + r % hh;
        uint32_t w[4] = {0, 0, 0, 0}, wl[4] = {0, 0, 0, 0};
        if (r < hh * tt && tok < a.n_tok && hr < n_rep) {
            const float4 *src =
                (const float4 *)(a.q + (tok * a.n_heads + g * n_rep + hr) * D + ch * 8);
            float4 x0 = src[0], x1 = src[1];
            w[0] = pf_type<T>::split(x0.x * a.scale, x0.y * a.scale, &wl[0]);
            w[1] = pf_type<T>::split(x0.z * a.scale, x0.w * a.scale, &wl[1]);
            w[2] = pf_type<T>::split(x1.x * a.scale, x1.y * a.scale, &wl[2]);
            w[3] = pf_type<T>::split(x1.z * a.scale, x1.w * a.scale, &wl[3]);
        }
        *(uint4 *)(qs + pf_off<D>(r, ch)) = make_uint4(w[0], w[1], w[2], w[3]);
        *(uint4 *)(qs + BM * D * 2 + pf_off<D>(r, ch)) = make_uint4(wl[0], wl[1], wl[2], wl[3]);
    }
    __syncthreads();

    /* Q fragments of this warp's 16 rows */
    uint32_t qa[D / 16][4], qb[D / 16][4];
#pragma unroll
    for (int ks_ = 0; ks_ < D / 16; ks_++) {
        int mi = lane >> 3;
        int row = warp * 16 + (mi & 1) * 8 + (lane & 7);
        uint32_t at = pf_smem(qs) + pf_off<D>(row, ks_ * 2 + (mi >> 1));
        pf_ldsm4(at, qa[ks_][0], qa[ks_][1], qa[ks_][2], qa[ks_][3]);
        pf_ldsm4(at + BM * D * 2, qb[ks_][0], qb[ks_][1], qb[ks_][2], qb[ks_][3]);
    }

    int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    bool cap = a.softcap > 0.0f;

    int32_t prev = -1;
    for (;;) {
        /* next stream of this tile: the smallest stream id above prev */
        __syncthreads();
        if (tid == 0) {
            int32_t cur = INT32_MAX, jlo = INT32_MAX, jhi = 0;
            for (int r = 0; r < BM; r++)
                if (row_seq[r] > prev && row_seq[r] < cur)
                    cur = row_seq[r];
            for (int r = 0; r < BM; r++)
                if (row_seq[r] == cur && row_hi[r] > row_lo[r]) {
                    jlo = min(jlo, row_lo[r]);
                    jhi = max(jhi, row_hi[r]);
                }
            pass_info[0] = cur;
            pass_info[1] = jlo;
            pass_info[2] = jhi;
        }
        __syncthreads();
        int32_t cur = pass_info[0], jlo = pass_info[1], jhi = pass_info[2];
        if (cur == INT32_MAX)
            break;
        prev = cur;
        if (jlo >= jhi)
            continue;
        bool act0 = row_seq[r0] == cur, act1 = row_seq[r1] == cur;
        int32_t lo0 = row_lo[r0], hi0 = act0 ? row_hi[r0] : 0;
        int32_t lo1 = row_lo[r1], hi1 = act1 ? row_hi[r1] : 0;
        const int32_t *pt = a.page_table + (int64_t)cur * a.max_pages;

        auto load_block = [&](int32_t kb, int buf) {
            for (int c = tid; c < PF_BN * CH; c += blockDim.x) {
                int row = c / CH, ch = c % CH;
                int32_t j = kb + row;
                int64_t off = -1;
                if (j >= jlo && j < jhi) {
                    int32_t page = pt[j / a.page_size];
                    if (page >= 0 && page < a.n_pages)
                        off = (((int64_t)page * a.page_size + j % a.page_size) * a.n_kv_heads +
                               g) * D + ch * 8;
                }
                const uint16_t *kp = (const uint16_t *)a.k + (off >= 0 ? off : 0);
                const uint16_t *vp = (const uint16_t *)a.v + (off >= 0 ? off : 0);
                uint32_t so = buf * PF_BN * D * 2 + pf_off<D>(row, ch);
                pf_cp16(pf_smem(ks) + so, kp, off >= 0);
                pf_cp16(pf_smem(vs) + so, vp, off >= 0);
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

            /* S = Q K^T for 16 rows x 64 keys */
            float sc[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++)
                sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
            uint32_t kbase = pf_smem(ks) + buf * PF_BN * D * 2;
#pragma unroll
            for (int ks_ = 0; ks_ < D / 16; ks_++) {
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    int mi = lane >> 3;
                    int key = nt * 8 + (mi >> 1) * 8 + (lane & 7);
                    uint32_t b0, b1, b2, b3;
                    pf_ldsm4(kbase + pf_off<D>(key, ks_ * 2 + (mi & 1)), b0, b1, b2, b3);
                    pf_type<T>::mma(sc[nt], qa[ks_], b0, b1);
                    pf_type<T>::mma(sc[nt + 1], qa[ks_], b2, b3);
                    if (precise) {
                        pf_type<T>::mma(sc[nt], qb[ks_], b0, b1);
                        pf_type<T>::mma(sc[nt + 1], qb[ks_], b2, b3);
                    }
                }
            }

            /* mask, soft-cap, base-2 scaling, row max */
            float mx0 = m0, mx1 = m1;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int32_t j = kb + nt * 8 + 2 * (lane & 3) + (e & 1);
                    bool vis = e < 2 ? (j >= lo0 && j < hi0) : (j >= lo1 && j < hi1);
                    float x = sc[nt][e];
                    if (cap)
                        x = attn_cap(x, a.softcap);
                    x = vis ? x * LOG2E : -INFINITY;
                    sc[nt][e] = x;
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
            float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
            m0 = mx0;
            m1 = mx1;
            float sum0 = 0.0f, sum1 = 0.0f;
            uint32_t pa[NT / 2][4], pl[NT / 2][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float p0 = exp2f(sc[nt][0] - base0), p1 = exp2f(sc[nt][1] - base0);
                float p2 = exp2f(sc[nt][2] - base1), p3 = exp2f(sc[nt][3] - base1);
                sum0 += p0 + p1;
                sum1 += p2 + p3;
                pa[nt / 2][(nt & 1) * 2 + 0] = pf_type<T>::split(p0, p1, &pl[nt / 2][(nt & 1) * 2]);
                pa[nt / 2][(nt & 1) * 2 + 1] =
                    pf_type<T>::split(p2, p3, &pl[nt / 2][(nt & 1) * 2 + 1]);
            }
            l0 = l0 * corr0 + sum0;
            l1 = l1 * corr1 + sum1;
#pragma unroll
            for (int i = 0; i < DT; i++) {
                o[i][0] *= corr0;
                o[i][1] *= corr0;
                o[i][2] *= corr1;
                o[i][3] *= corr1;
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
                    pf_type<T>::mma(o[dt], pa[kk], b0, b1);
                    pf_type<T>::mma(o[dt + 1], pa[kk], b2, b3);
                    if (precise) {
                        pf_type<T>::mma(o[dt], pl[kk], b0, b1);
                        pf_type<T>::mma(o[dt + 1], pl[kk], b2, b3);
                    }
                }
            }
            __syncthreads();
        }
        pf_wait<0>();
    }

    /* normalize and write the valid rows */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int r = half ? r1 : r0;
        int64_t tok = t0 + r / hh;
        int32_t hr = hc0 + r % hh;
        if (r >= hh * tt || tok >= a.n_tok || hr >= n_rep)
            continue;
        float inv = half ? inv1 : inv0;
        float *dst = a.out + (tok * a.n_heads + g * n_rep + hr) * D + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < DT; i++)
            *(float2 *)(dst + i * 8) = make_float2(o[i][half * 2] * inv, o[i][half * 2 + 1] * inv);
    }
}

#define PF_WARPS 4

extern "C" int cuk_attn_prefill_supported(int32_t head_dim, int32_t dtype)
{
    return (head_dim == 64 || head_dim == 128) && (dtype == CUK_F16 || dtype == CUK_BF16);
}

template <typename T, int D>
static cudaError_t pf_launch(const cuk_attn_args *a, cudaStream_t stream)
{
    constexpr int BM = 16 * PF_WARPS;
    size_t smem = (size_t)2 * BM * D * 2 + (size_t)4 * PF_BN * D * 2;
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<T, D, PF_WARPS>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    int32_t n_rep = a->n_heads / a->n_kv_heads;
    int32_t hh = n_rep < BM ? n_rep : BM;
    int32_t tt = BM / hh;
    dim3 grid((unsigned)((a->n_tok + tt - 1) / tt), (unsigned)((n_rep + hh - 1) / hh),
              (unsigned)a->n_kv_heads);
    attn_prefill_kernel<T, D, PF_WARPS><<<grid, PF_WARPS * 32, smem, stream>>>(*a, hh, tt,
                                                                               a->precise);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attn_prefill(const cuk_attn_args *a, cudaStream_t stream)
{
    /* q rows and pool rows are read in 16-byte pieces */
    if ((uintptr_t)a->q % 16 || (uintptr_t)a->k % 16 || (uintptr_t)a->v % 16 ||
        (uintptr_t)a->out % 8)
        return cudaErrorMisalignedAddress;
    if (a->dtype == CUK_F16) {
        if (a->head_dim == 64)
            return pf_launch<cuk_f16_t, 64>(a, stream);
        if (a->head_dim == 128)
            return pf_launch<cuk_f16_t, 128>(a, stream);
    } else if (a->dtype == CUK_BF16) {
        if (a->head_dim == 64)
            return pf_launch<cuk_bf16_t, 64>(a, stream);
        if (a->head_dim == 128)
            return pf_launch<cuk_bf16_t, 128>(a, stream);
    }
    return cudaErrorInvalidValue;
}

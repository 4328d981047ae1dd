/* llmem CUDA kernels: split-K decode attention on tensor cores for f16 and
 * bf16 pools with head_dim 64 or 128 (included by attention.cu after the
 * prefill kernel, whose MMA helpers it uses; see attention.cu's comment).
 *
 * Same work items, splits, partial-result layout and merge kernel as the
 * CUDA-core decode kernel (flash-decoding; Dao et al. 2023), but each warp
 * computes S = Q K^T and O += P V for 16 keys at a time with
 * mma.sync.m16n8k16, the query heads of the item as rows 0..3 of the
 * 16-row tile (FlashAttention-2's register layout, Dao 2023, Alg. 1). On
 * the CUDA cores the dot products of a GQA group cost a warp reduction per
 * key and head, which bounded that kernel by instruction issue well below
 * the bandwidth; here a key costs a few MMAs and the kernel streams K/V.
 * Precision as the prefill kernel: queries and probabilities split into
 * hi + lo pairs unless the backend runs in fast mode.
 *
 * Each warp streams its keys through an NS-stage cp.async ring of
 * swizzled [16 keys][D] K and V tiles, pages resolved one stage ahead, with
 * no barrier in the loop; the warps' softmax states are merged in shared
 * memory at the end.
 */

#define DTC_KEYS 16 /* keys per warp step */

template <int D> struct dtc_shape {
    static constexpr int CH = D / 8;                          /* 16-byte chunks per row */
    static constexpr int TILE = DTC_KEYS * D * 2;             /* bytes of K (or V) per step */
    static constexpr int NS = D == 64 ? 4 : 3;                /* ring stages */
    static constexpr int RING = DEC_WARPS * NS * 2 * TILE;    /* bytes */
    static constexpr int QB = 2 * 16 * D * 2;                 /* Q hi and lo tiles */
    static constexpr int MERGE = DEC_WARPS * DEC_NR * (D + 2) * 4;
    static constexpr int SMEM = (RING > MERGE ? RING : MERGE) + QB;
};

template <typename T, int D>
__global__ void __launch_bounds__(DEC_WARPS * 32, 2)
    attn_decode_tc_kernel(cuk_attn_args a, int32_t n_hc, int32_t n_split, float *part)
{
    using Z = dtc_shape<D>;
    constexpr int NS = Z::NS, DT = D / 8;
    extern __shared__ __align__(128) unsigned char dtc_smem[];
    unsigned char *qs = dtc_smem + (Z::RING > Z::MERGE ? Z::RING : Z::MERGE);
    cuk_pdl_trigger(); /* with one split, the output projection (a GEMV) follows */

    const dec_item it = dec_item_of(a, n_hc, n_split);
    const int64_t x = it.x, tok = it.tok;
    const int32_t sp = it.sp, g = it.g, h0 = it.h0, nr = it.nr, s = it.s, k0 = it.k0, k1 = it.k1;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* Q tile: rows 0..nr-1 the item's heads, scaled; the rest zeros */
    for (int c = tid; c < 16 * Z::CH; c += blockDim.x) {
        int r = c / Z::CH, ch = c % Z::CH;
        uint32_t w[4] = {0, 0, 0, 0}, wl[4] = {0, 0, 0, 0};
        if (r < nr) {
            pf_split8<T>(a.q + (tok * a.n_heads + h0 + r) * D + ch * 8, a.scale, w, wl);
        }
        *(uint4 *)(qs + pf_off<D>(r, ch)) = make_uint4(w[0], w[1], w[2], w[3]);
        *(uint4 *)(qs + 16 * D * 2 + pf_off<D>(r, ch)) = make_uint4(wl[0], wl[1], wl[2], wl[3]);
    }
    __syncthreads();
    uint32_t qa[D / 16][4], qb[D / 16][4];
#pragma unroll
    for (int k2 = 0; k2 < D / 16; k2++) {
        int mi = lane >> 3, row = (mi & 1) * 8 + (lane & 7);
        uint32_t at = pf_smem(qs) + pf_off<D>(row, k2 * 2 + (mi >> 1));
        pf_ldsm4(at, qa[k2][0], qa[k2][1], qa[k2][2], qa[k2][3]);
        pf_ldsm4(at + 16 * D * 2, qb[k2][0], qb[k2][1], qb[k2][2], qb[k2][3]);
    }
    bool precise = a.precise != 0, cap = a.softcap > 0.0f;

    /* warp step i covers keys base0 + i * step + [0, 16); lane l < 16
     * resolves key l of a step */
    const int32_t step = DEC_WARPS * DTC_KEYS;
    const int32_t base0 = k0 + warp * DTC_KEYS;
    const int32_t n_steps = base0 < k1 ? (k1 - base0 + step - 1) / step : 0;
    auto slot_of = [&](int32_t i) -> int32_t {
        int32_t j = base0 + i * step + lane;
        return lane < DTC_KEYS && i < n_steps && j < k1 ? attn_key_slot(a, s, j) : -1;
    };
    unsigned char *ring = dtc_smem + (size_t)warp * NS * 2 * Z::TILE;
    uint64_t valid = 0; /* 16 bits per stage: key visible */
    auto issue = [&](int32_t i, int32_t slots) {
        int st = i % NS;
        uint32_t bits = __ballot_sync(0xffffffffu, lane < DTC_KEYS && slots >= 0) & 0xffffu;
        if (i < n_steps) {
            uint32_t kb = pf_smem(ring + st * 2 * Z::TILE), vb = kb + Z::TILE;
#pragma unroll
            for (int it = 0; it < DTC_KEYS * Z::CH / 32; it++) {
                int c = lane + 32 * it, key = c / Z::CH, ch = c % Z::CH;
                int32_t slot = __shfl_sync(0xffffffffu, slots, key);
                bool ok = slot >= 0;
                int64_t off = ok ? ((int64_t)slot * a.n_kv_heads + g) * D + ch * 8 : 0;
                pf_cp16(kb + pf_off<D>(key, ch), (const uint16_t *)a.k + off, ok);
                pf_cp16(vb + pf_off<D>(key, ch), (const uint16_t *)a.v + off, ok);
            }
        } else {
            bits = 0;
        }
        valid = (valid & ~(0xffffull << (16 * st))) | ((uint64_t)bits << (16 * st));
        pf_commit(); /* possibly empty: one group per step keeps wait_group's count */
    };

    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

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
        __syncwarp(); /* every lane is done with the stage issue() refills */
        issue(i + NS - 1, cur);
        pf_wait<NS - 1>();
        __syncwarp(); /* the tiles of step i were copied by every lane */
        int st = i % NS;
        uint32_t vis = (uint32_t)(valid >> (16 * st)) & 0xffffu;
        uint32_t kbase = pf_smem(ring + st * 2 * Z::TILE), vbase = kbase + Z::TILE;

        /* S = Q K^T: 16 rows x 16 keys */
        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int k2 = 0; k2 < D / 16; k2++) {
            int mi = lane >> 3, key = (mi >> 1) * 8 + (lane & 7);
            uint32_t b0, b1, b2, b3;
            pf_ldsm4(kbase + pf_off<D>(key, k2 * 2 + (mi & 1)), b0, b1, b2, b3);
            pf_type<T>::mma(sc[0], qa[k2], b0, b1);
            pf_type<T>::mma(sc[1], qa[k2], b2, b3);
            if (precise) {
                pf_type<T>::mma(sc[0], qb[k2], b0, b1);
                pf_type<T>::mma(sc[1], qb[k2], b2, b3);
            }
        }
        /* soft-cap, base 2, mask, online softmax (rows lane / 4 and + 8) */
        float mx0 = m[0], mx1 = m[1];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = sc[nt][e];
                if (cap)
                    v = attn_cap(v, a.softcap);
                v *= LOG2E;
                int kk = nt * 8 + 2 * (lane & 3) + (e & 1);
                v = (vis >> kk) & 1u ? v : -INFINITY;
                sc[nt][e] = v;
                if (e < 2)
                    mx0 = fmaxf(mx0, v);
                else
                    mx1 = fmaxf(mx1, v);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
        float corr0 = pf_exp2(m[0] - base0), corr1 = pf_exp2(m[1] - base1);
        m[0] = mx0;
        m[1] = mx1;
        uint32_t pa[4], pl[4];
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float p0 = pf_exp2(sc[nt][0] - base0), p1 = pf_exp2(sc[nt][1] - base0);
            float p2 = pf_exp2(sc[nt][2] - base1), p3 = pf_exp2(sc[nt][3] - base1);
            sum0 += p0 + p1;
            sum1 += p2 + p3;
            pa[nt * 2] = pf_type<T>::split(p0, p1, &pl[nt * 2]);
            pa[nt * 2 + 1] = pf_type<T>::split(p2, p3, &pl[nt * 2 + 1]);
        }
        l[0] = l[0] * corr0 + sum0;
        l[1] = l[1] * corr1 + sum1;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            o[d][0] *= corr0;
            o[d][1] *= corr0;
            o[d][2] *= corr1;
            o[d][3] *= corr1;
        }
        /* O += P V */
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
            int mi = lane >> 3, key = (mi & 1) * 8 + (lane & 7);
            uint32_t b0, b1, b2, b3;
            pf_ldsm4t(vbase + pf_off<D>(key, d + (mi >> 1)), b0, b1, b2, b3);
            pf_type<T>::mma(o[d], pa, b0, b1);
            pf_type<T>::mma(o[d + 1], pa, b2, b3);
            if (precise) {
                pf_type<T>::mma(o[d], pl, b0, b1);
                pf_type<T>::mma(o[d + 1], pl, b2, b3);
            }
        }
    }
    pf_wait<0>();
    __syncthreads(); /* the merge below reuses the ring */

    /* merge the warps: rows 0..3 live in lanes 0..15 (row lane / 4) */
    float *sm_o = (float *)dtc_smem;                       /* [WARPS][DEC_NR][D] */
    float *sm_m = sm_o + (size_t)DEC_WARPS * DEC_NR * D;   /* [WARPS][DEC_NR] */
    float *sm_l = sm_m + (size_t)DEC_WARPS * DEC_NR;       /* [WARPS][DEC_NR] */
    float lv = l[0];
    lv += __shfl_xor_sync(0xffffffffu, lv, 1);
    lv += __shfl_xor_sync(0xffffffffu, lv, 2);
    int r = lane >> 2;
    if (r < DEC_NR) {
        if ((lane & 3) == 0) {
            sm_m[warp * DEC_NR + r] = m[0];
            sm_l[warp * DEC_NR + r] = lv;
        }
#pragma unroll
        for (int d = 0; d < DT; d++) {
            float *dst = sm_o + (warp * DEC_NR + r) * D + d * 8 + 2 * (lane & 3);
            dst[0] = o[d][0];
            dst[1] = o[d][1];
        }
    }
    __syncthreads();
    dec_merge_groups<D, DEC_WARPS>(a, part, sm_o, sm_m, sm_l, nr, tok, h0, x, sp, n_split);
}

template <typename T, int D>
static cudaError_t dtc_launch(const cuk_attn_args *a, int32_t n_split, float *part,
                              cudaStream_t stream)
{
    using Z = dtc_shape<D>;
    /* the shared-memory attribute once per kernel and device */
    static unsigned long long sized = 0;
    cudaError_t e = cuk_smem_once(attn_decode_tc_kernel<T, D>, Z::SMEM, &sized);
    if (e != cudaSuccess)
        return e;
    int32_t n_hc = dec_n_hc(a);
    int64_t items = (int64_t)a->n_tok * a->n_kv_heads * n_hc;
    dim3 grid((unsigned)items, (unsigned)n_split);
    attn_decode_tc_kernel<T, D><<<grid, DEC_WARPS * 32, Z::SMEM, stream>>>(*a, n_hc, n_split,
                                                                            part);
    e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1)
        return e;
    attn_combine_kernel<<<cuk_grid(items * DEC_NR * D, 256), 256, 0, stream>>>(*a, n_hc, n_split,
                                                                                part, items);
    return cudaGetLastError();
}

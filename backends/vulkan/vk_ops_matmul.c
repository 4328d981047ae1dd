/* llmem Vulkan backend: matmul, out[M, N] = a[M, K] · w[N, K]ᵀ with f32
 * accumulation (a linear layer; w f32, f16 or bf16).
 *
 * Few activation rows (decode, M <= MV_MAX) use shaders/matvec.comp: one
 * workgroup per weight row, the weight read once and coalesced, which is
 * what bounds decode; f16/bf16 weights up to MV16_MAX rows use
 * matvec16.comp. Larger batches use the register-tiled matmul_rt.comp
 * (16-byte loads, split-K when the output tiles alone would leave SMs
 * idle), and shapes it cannot take (K not a multiple of 8, unaligned
 * rows) the plain shared-memory tiling of shaders/matmul.comp.
 */
#include <stdlib.h>

#include "vk_internal.h"

#define MV_MAX 8  /* activation rows handled by the matvec path */
#define MV_WG 128
#define MV16_WG 128
#define MV16_TPR 32 /* invocations per weight row */
/* one activation row: 128 invocations per weight row, 2 rows a workgroup
 * (H200, 9B Bamba projections: 74-91% of the CUDA copy, was 53-76% with 32;
 * docs/benchmarks.md, "Vulkan batch-1 GEMV") */
#define MV16_WG1 256
#define MV16_TPR1 128
#define MV16_ROWS 16 /* activation rows per matvec16 pass */
#define MV16_MAX 8 /* activation rows up to which matvec16 replaces matmul_rt (H200, 9B Bamba: at 16 and 32 rows matmul_rt takes 0.87x and 0.54x of matvec16's step) */
#define MM_BM 64
#define MM_BN 64
#define MM_BK 16
#define MM_TM 4
#define MM_TN 4
#define RT_WG 256
#define RT_BN 128
#define RT_BK 16
#define RT_GROUPS 264   /* workgroups split-K aims for: 2 per SM of the 132-SM H200 */
#define RT_MIN_SLICE 256 /* K per split-K slice, at least */
#define SUM_WG 256

static uint32_t env_u32(const char *name, uint32_t dflt, long lo, long hi)
{
    const char *e = getenv(name);
    long x = e ? strtol(e, NULL, 10) : (long)dflt;
    return x < lo || x > hi ? dflt : (uint32_t)x;
}

void vk_matmul_config(vk_backend *v)
{
    v->mm.mv16_max = env_u32("LLMEM_VULKAN_MV16_MAX", MV16_MAX, 0, 64);
    v->mm.mv16_rows = env_u32("LLMEM_VULKAN_MV16_ROWS", MV16_ROWS, 1, 32);
    v->mm.matvec_old = getenv("LLMEM_VULKAN_MATVEC_OLD") != NULL;
    v->mm.matmul_old = getenv("LLMEM_VULKAN_MATMUL_OLD") != NULL;
}

/* out = a · wᵀ (u NULL) or silu(a · wᵀ) * (a · uᵀ) through matvec16.comp,
 * when it applies (f16/bf16 weights, K % 8 == 0, up to MV16_MAX rows,
 * 16-byte aligned rows); *done says whether it did. 16-byte weight loads,
 * MV16_ROWS activation rows per pass: each pass reads the weights once,
 * which beats the tiled matmul up to MV16_MAX rows on a bandwidth-bound
 * decode. */
static llmem_status matvec16(vk_backend *v, llmem_ct *a, llmem_ct *w, llmem_ct *u, llmem_ct *out,
                             bool *done)
{
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1], n = (uint32_t)w->ne[0];
    *done = false;
    if (m > v->mm.mv16_max || (w->dtype != LLMEM_DTYPE_F16 && w->dtype != LLMEM_DTYPE_BF16) ||
        k % 8 != 0 || v->mm.matvec_old)
        return LLMEM_OK;
    llmem_status st = LLMEM_OK;
    uint32_t nr = m == 1 ? 1 : 4; /* weight rows per lane group */
    uint32_t rows = v->mm.mv16_rows;
    for (uint32_t m0 = 0; m0 < m && st == LLMEM_OK; m0 += rows) {
        uint32_t mr = m - m0 < rows ? m - m0 : rows;
        vk_op op;
        uint32_t wg = m == 1 ? MV16_WG1 : MV16_WG, tpr = m == 1 ? MV16_TPR1 : MV16_TPR;
        vk_op_init(&op, VK_SH_MATVEC16, wg);
        vk_op_spec(&op, (uint32_t)w->dtype);
        vk_op_spec(&op, mr);
        vk_op_spec(&op, tpr);
        vk_op_spec(&op, nr);
        vk_op_spec(&op, u != NULL);
        vk_op_spec(&op, 2); /* loads in flight per row and invocation */
        uint32_t ao = vk_op_tensor(v, &op, a, false);
        uint32_t wo = vk_op_tensor(v, &op, w, false);
        uint32_t oo = vk_op_tensor(v, &op, out, true);
        uint32_t uo = 0;
        if (u)
            uo = vk_op_tensor(v, &op, u, false);
        if (ao % 4 != 0 || wo % 8 != 0 || uo % 8 != 0) {
            vk_op_run(v, &op, 0); /* gives temporaries back */
            return LLMEM_OK;      /* unaligned (first pass): the general path */
        }
        vk_op_u32(&op, mr);
        vk_op_u32(&op, n);
        vk_op_u32(&op, k);
        vk_op_u32(&op, (ao + m0 * k) / 4);
        vk_op_u32(&op, wo / 8);
        vk_op_u32(&op, oo + m0 * n);
        vk_op_u32(&op, uo / 8);
        st = vk_op_run(v, &op, vk_div_up(n, wg / tpr * nr));
        *done = true;
    }
    return st;
}

/* out = a · wᵀ through matmul_rt.comp when it applies (K % 8 == 0,
 * 16-byte aligned rows and offsets); *done says whether it did. Output
 * tiles of BM x 128 (BM 64 up to 64 rows, else 128); when they number
 * fewer than RT_GROUPS, K is split into slices of at least RT_MIN_SLICE
 * whose partial outputs go to a scratch buffer and are summed in slice
 * order by sum_slices.comp. */
static llmem_status matmul_rt(llmem_backend *be, vk_backend *v, llmem_ct *a, llmem_ct *w,
                              llmem_ct *out, bool *done)
{
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1], n = (uint32_t)w->ne[0];
    uint32_t epv = w->dtype == LLMEM_DTYPE_F32 ? 4 : 8;
    *done = false;
    if (k % 8 != 0 || v->mm.matmul_old)
        return LLMEM_OK;
    uint32_t bm = m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : 128;
    uint64_t tiles_m = vk_div_up(m, bm), tiles_mn = tiles_m * vk_div_up(n, RT_BN);
    uint64_t slices = 1;
    if (tiles_mn < RT_GROUPS) {
        uint64_t most = k / RT_MIN_SLICE;
        slices = vk_div_up(RT_GROUPS, tiles_mn);
        slices = slices > most ? most : slices;
        slices = slices < 1 ? 1 : slices;
    }
    uint64_t k_split = vk_div_up(vk_div_up(k, slices), RT_BK) * RT_BK;
    slices = vk_div_up(k, k_split);
    vk_op op;
    vk_op_init(&op, VK_SH_MATMUL_RT, RT_WG);
    vk_op_spec(&op, (uint32_t)w->dtype);
    vk_op_spec(&op, bm);
    vk_op_spec(&op, bm / 16);
    uint32_t ao = vk_op_tensor(v, &op, a, false);
    uint32_t wo = vk_op_tensor(v, &op, w, false);
    if (ao % 4 != 0 || wo % epv != 0) {
        vk_op_run(v, &op, 0); /* gives temporaries back */
        return LLMEM_OK;
    }
    llmem_status st;
    llmem_buffer *part = NULL;
    size_t count = (size_t)m * n;
    llmem_tensor pt;
    if (slices > 1) {
        if ((st = vk_buffer_alloc(be, slices * count * 4, &part)) != LLMEM_OK) {
            vk_op_run(v, &op, 0);
            return st;
        }
        part->size = slices * count * 4;
        pt = llmem_tensor_2d(part, 0, LLMEM_DTYPE_F32, (int64_t)(slices * m), n);
    }
    uint32_t oo = vk_op_tensor(v, &op, slices > 1 ? &pt : out, true);
    vk_op_u32(&op, m);
    vk_op_u32(&op, n);
    vk_op_u32(&op, k);
    vk_op_u32(&op, ao / 4);
    vk_op_u32(&op, wo / epv);
    vk_op_u32(&op, oo);
    vk_op_u32(&op, (uint32_t)tiles_m);
    vk_op_u32(&op, (uint32_t)tiles_mn);
    vk_op_u32(&op, (uint32_t)k_split);
    vk_op_u32(&op, (uint32_t)count);
    vk_op_u32(&op, (uint32_t)(tiles_mn * slices));
    st = vk_op_run(v, &op, tiles_mn * slices);
    if (st == LLMEM_OK && slices > 1) {
        vk_op sum;
        vk_op_init(&sum, VK_SH_SUM_SLICES, SUM_WG);
        uint32_t po = vk_op_tensor(v, &sum, &pt, false);
        uint32_t so = vk_op_tensor(v, &sum, out, true);
        vk_op_u32(&sum, (uint32_t)count);
        vk_op_u32(&sum, (uint32_t)slices);
        vk_op_u32(&sum, po);
        vk_op_u32(&sum, so);
        st = vk_op_run(v, &sum, vk_div_up(count, SUM_WG));
    }
    if (part)
        vk_buffer_free(be, part);
    *done = st == LLMEM_OK;
    return st;
}

llmem_status vk_op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1], n = (uint32_t)w->ne[0];
    vk_op op;
    bool done;
    llmem_status st = matvec16(v, a, w, NULL, out, &done);
    if (done || st != LLMEM_OK)
        return st;
    if (m > MV_MAX) {
        st = matmul_rt(be, v, a, w, out, &done);
        if (done || st != LLMEM_OK)
            return st;
    }
    if (m <= MV_MAX) {
        vk_op_init(&op, v->subgroup ? VK_SH_MATVEC_SG : VK_SH_MATVEC, MV_WG);
        vk_op_spec(&op, (uint32_t)w->dtype);
        vk_op_spec(&op, m); /* rows per workgroup: all of them */
    } else {
        vk_op_init(&op, VK_SH_MATMUL, (MM_BM / MM_TM) * (MM_BN / MM_TN));
        vk_op_spec(&op, (uint32_t)w->dtype);
        vk_op_spec(&op, MM_BM);
        vk_op_spec(&op, MM_BN);
        vk_op_spec(&op, MM_BK);
        vk_op_spec(&op, MM_TM);
        vk_op_spec(&op, MM_TN);
    }
    uint32_t ao = vk_op_tensor(v, &op, a, false);
    uint32_t wo = vk_op_tensor(v, &op, w, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, m);
    vk_op_u32(&op, n);
    vk_op_u32(&op, k);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, wo);
    vk_op_u32(&op, oo);
    if (m <= MV_MAX) {
        vk_op_u32(&op, n);
        return vk_op_run(v, &op, n);
    }
    uint64_t tiles_m = vk_div_up(m, MM_BM), tiles = tiles_m * vk_div_up(n, MM_BN);
    vk_op_u32(&op, (uint32_t)tiles_m);
    vk_op_u32(&op, (uint32_t)tiles);
    return vk_op_run(v, &op, tiles);
}

llmem_status vk_op_matmul_swiglu(llmem_backend *be, llmem_ct *a, llmem_ct *gate, llmem_ct *up,
                                 llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    bool done;
    llmem_status st = matvec16(v, a, gate, up, out, &done);
    if (done || st != LLMEM_OK)
        return st;
    /* Other shapes and dtypes: two matmuls into a temporary, then SwiGLU
     * (the temporary may be freed with the work recorded: see vk_buffer_free). */
    size_t half = (size_t)a->ne[0] * (size_t)gate->ne[0] * 4;
    llmem_buffer *tmp = NULL;
    if ((st = vk_buffer_alloc(be, 2 * half, &tmp)) != LLMEM_OK)
        return st;
    tmp->size = 2 * half;
    llmem_tensor g = llmem_tensor_2d(tmp, 0, LLMEM_DTYPE_F32, a->ne[0], gate->ne[0]);
    llmem_tensor u = llmem_tensor_2d(tmp, half, LLMEM_DTYPE_F32, a->ne[0], gate->ne[0]);
    st = vk_op_matmul(be, a, gate, &g);
    if (st == LLMEM_OK)
        st = vk_op_matmul(be, a, up, &u);
    if (st == LLMEM_OK)
        st = vk_op_swiglu(be, &g, &u, out);
    vk_buffer_free(be, tmp);
    return st;
}

/* llmem Vulkan backend: matvec16.comp, out[M, N] = a[M, K] · w[N, K]ᵀ (or
 * its SwiGLU pair) for few activation rows and f16/bf16 weights, with
 * 16-byte weight loads (decode; vk_op_matmul and vk_op_matmul_swiglu in
 * vk_ops_matmul.c call it first). One row goes to the fused decode
 * matmul's GEMV (vk_gemv_rows) where that applies.
 */
#include "vk_internal.h"

#define MV16_WG 128
#define MV16_TPR 32 /* invocations per weight row */
/* one activation row: 128 invocations per weight row, 2 rows a workgroup
 * (H200, 9B Bamba projections: 74-91% of the CUDA copy, was 53-76% with 32;
 * docs/benchmarks.md, "Vulkan batch-1 GEMV") */
#define MV16_WG1 256
#define MV16_TPR1 128

/* A launch of matvec16.comp: workgroup, invocations per group of weight
 * rows, weight rows per group, 16-byte loads in flight per row and
 * invocation. */
typedef struct mv16_cfg {
    uint32_t wg, tpr, nr, unroll;
} mv16_cfg;

#define MV16_LOADS_MAX 32 /* uvec4 weight loads in registers per invocation (NR NW UNROLL) */
/* invocations an SM holds at once (NVIDIA since Ampere: 2048): a wave of the one-row launch
 * is n_sm x MV16_SM_INVOCATIONS / WG workgroups */
#define MV16_SM_INVOCATIONS 2048
/* weight rows per group of the one-row GEMV where one row per group would take more than
 * one wave and MV16_NR_WAVE rows per group at most one (a single matrix): the whole grid
 * resident at once, no partial last wave (H200, 4096 x 14336: 74.8 -> 79.2% of the CUDA
 * copy at 4 calls a sync, 78.6 -> 86.3 at 20; docs/benchmarks.md "Vulkan batch-1 GEMV:
 * whole waves") */
#define MV16_NR_WAVE 4

/* Bytes of matvec16.comp's shared sums an activation row: NW (nmat) NR WG
 * partials and their runs of up to 8. */
static size_t mv16_row_smem(const mv16_cfg *c, uint32_t nmat)
{
    return (size_t)nmat * c->nr * c->wg * 4 * 9 / 8;
}

/* The launch for m activation rows of nmat weight matrices over n weight
 * rows: several rows the fixed MV16_WG / MV16_TPR / NR 4 one; one row
 * MV16_WG1 / MV16_TPR1, NR 1 or MV16_NR_WAVE (above), then the knobs
 * $LLMEM_VULKAN_MV16_WG, _TPR, _NR, _UNROLL (docs/vulkan.md); a knob the
 * device or the other knobs do not allow is cut to what they do. */
static mv16_cfg mv16_pick(const vk_backend *v, uint32_t m, uint32_t n, uint32_t nmat)
{
    if (m > 1)
        return (mv16_cfg){MV16_WG, MV16_TPR, 4, 2};
    mv16_cfg c = {MV16_WG1, MV16_TPR1, 1, 2};
    uint32_t wg = (uint32_t)VK_KNOB(v, mv16_wg, c.wg);
    if (wg <= v->props.limits.maxComputeWorkGroupInvocations)
        c.wg = wg;
    c.tpr = (uint32_t)VK_KNOB(v, mv16_tpr, c.tpr);
    while (c.tpr > c.wg) /* at most one group a workgroup */
        c.tpr /= 2;
    uint64_t per = c.wg / c.tpr; /* groups a workgroup */
    uint64_t sms = v->mm.n_sm ? v->mm.n_sm : VK_SM_FALLBACK;
    uint64_t wave = sms * MV16_SM_INVOCATIONS / c.wg; /* workgroups resident at once */
    if (nmat == 1 && vk_div_up(n, per) > wave && vk_div_up(n, per * MV16_NR_WAVE) <= wave)
        c.nr = MV16_NR_WAVE;
    c.nr = (uint32_t)VK_KNOB(v, mv16_nr, c.nr);
    while (c.nr > 1 && mv16_row_smem(&c, nmat) > v->props.limits.maxComputeSharedMemorySize)
        c.nr /= 2;
    c.unroll = (uint32_t)VK_KNOB(v, mv16_unroll, c.unroll);
    while (c.unroll > 1 && c.unroll * c.nr * nmat > MV16_LOADS_MAX)
        c.unroll /= 2;
    return c;
}

/* out = a · wᵀ (u NULL) or silu(a · wᵀ) * (a · uᵀ) through matvec16.comp,
 * when it applies (f16/bf16 weights, K % 8 == 0, up to VK_MM_MV16_MAX rows,
 * 16-byte aligned rows); *done says whether it did. 16-byte weight loads,
 * VK_MM_MV16_ROWS activation rows per pass: each pass reads the weights once,
 * which beats the tiled matmul up to VK_MM_MV16_MAX rows on a bandwidth-bound
 * decode. */
llmem_status vk_matvec16(vk_backend *v, llmem_ct *a, llmem_ct *w, llmem_ct *u, llmem_ct *out,
                         bool *done)
{
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1], n = (uint32_t)w->ne[0];
    *done = false;
    if (vk_mm_pick(&v->mm, m, k, w->dtype) != VK_MM_MATVEC16)
        return LLMEM_OK;
    llmem_status st = m == 1 ? vk_gemv_rows(v, a, w, u, out) : LLMEM_E_UNSUPPORTED;
    if (st != LLMEM_E_UNSUPPORTED) { /* one row: the fused decode matmul's GEMV */
        *done = st == LLMEM_OK;
        return st;
    }
    st = LLMEM_OK;
    mv16_cfg c = mv16_pick(v, m, n, u ? 2 : 1);
    /* every activation row of a pass is summed through shared memory at once:
     * fewer rows a pass where they do not fit (none: the general path) */
    size_t fit = v->props.limits.maxComputeSharedMemorySize / mv16_row_smem(&c, u ? 2 : 1);
    uint32_t rows = fit < v->mv16_rows ? (uint32_t)fit : v->mv16_rows;
    if (rows == 0)
        return LLMEM_OK;
    for (uint32_t m0 = 0; m0 < m && st == LLMEM_OK; m0 += rows) {
        uint32_t mr = m - m0 < rows ? m - m0 : rows;
        vk_op op;
        vk_op_init(&op, VK_SH_MATVEC16, c.wg);
        vk_op_spec(&op, (uint32_t)w->dtype);
        vk_op_spec(&op, mr);
        vk_op_spec(&op, c.tpr);
        vk_op_spec(&op, c.nr);
        vk_op_spec(&op, u != NULL);
        vk_op_spec(&op, c.unroll); /* loads in flight per row and invocation */
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
        st = vk_op_run(v, &op, vk_div_up(n, c.wg / c.tpr * c.nr));
        *done = true;
    }
    return st;
}

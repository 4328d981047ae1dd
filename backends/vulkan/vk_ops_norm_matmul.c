/* llmem Vulkan backend: the fused decode matmul (<llmem/ops_norm_matmul.h>,
 * issue 12) for one activation row: out = epilogue(r * (g * nw) · wᵀ),
 * where the RMS norm's scale r, one scalar for the row, multiplies the
 * finished dot products, so nothing runs before the first weight load and
 * a decode projection is one dispatch instead of a norm, a matvec and an
 * add. Two kernels ($LLMEM_VULKAN_NM_MODE):
 *   0 (default) shaders/norm_matvec16_rows.comp, matvec16.comp's one-row
 *     layout (128 invocations per group of NR weight rows, a workgroup of
 *     256 per 2 NR rows), each group forming g * nw from x (z, nw) as it
 *     reads K and adding g² in the same pass; NR ($LLMEM_VULKAN_NM_NR, 1 2
 *     4 8; default 4, 2 where K or N is at most 2048 or for SwiGLU) rows share that work
 *     (the gate's silu above all); $LLMEM_VULKAN_NM_TPR (32 .. 1024) the
 *     invocations per group, $LLMEM_VULKAN_NM_UNROLL (1 .. 16; default 2,
 *     1 where K or N is at most 2048) the 16-byte loads per row and
 *     invocation issued before their FMAs (the same sums in the same order),
 *     $LLMEM_VULKAN_NM_RWG (64 .. 1024) the workgroup size (nm_rows_pick);
 *   1 shaders/norm_matvec16.comp, kernels/gemv.cu's persistent layout: each
 *     invocation keeps C = ceil(K / 8 / WG) 16-byte chunks of g * nw in
 *     registers, a workgroup walks R weight rows a step, at most NM_GROUPS_SM
 *     workgroups an SM; $LLMEM_VULKAN_NM_WG (64 .. 1024; default 256, 512 for the
 *     gated norm), $LLMEM_VULKAN_NM_R (1, 2, 4), $LLMEM_VULKAN_NM_GROUPS
 *     (1 .. 65535).
 * llmem_op_matmul's one-row f16/bf16 GEMV runs on the same kernel when
 * $LLMEM_VULKAN_GEMV_ROWS=1 (vk_gemv_rows; default NM_GEMV_ROWS). The
 * wrapper of backends/ops_norm_matmul.c has checked every argument. What a
 * kernel does not take gives LLMEM_E_UNSUPPORTED before anything is
 * recorded, and the caller (models/forward.c) runs the unfused ops: more
 * than one row, f32 weights, K not a multiple of 8 (mode 1: longer than
 * NM_C_MAX chunks per invocation), x / z / weight rows not 16-byte aligned
 * in their bindings, a device without subgroup arithmetic (or subgroups
 * under 4 invocations), and everything when $LLMEM_VULKAN_NORM_MATMUL=0 (a
 * switch for measuring the unfused path on the same model). Knobs are read
 * at each call (a recorded step keeps what it was recorded with).
 * $LLMEM_VULKAN_L2_PREFETCH (1 or 2; 0 by default: slower on the H200)
 * makes the rows kernel also read the first $LLMEM_VULKAN_L2_PREFETCH_KB
 * KiB of the weights of the product that followed this one the last time
 * (nm_pf_next), so that they are in L2 when it starts: an emulation of
 * CUDA's programmatic dependent launch (kernels/gemv.cu).
 * The decode conv in in_proj's epilogue (vk_internal.h, vk_nm_conv_take):
 * a one-row product with the RMS norm and a plain store is held back, and
 * a one-token Mamba-2 conv (HF Mamba2Mixer's causal conv1d; Dao & Gu 2024)
 * of a slice of its output runs in the same dispatch
 * (norm_matvec16_conv, the rows shader's CONV), one dependent dispatch
 * fewer a Mamba layer; $LLMEM_VULKAN_NM_CONV=0 turns it off.
 * Measurements: docs/benchmarks.md "Vulkan fused decode matmul, second
 * design", "Vulkan batch-1 step: the next weights into L2". Semantics
 * and the CPU reference: backends/cpu/ops_norm_matmul.c.
 */
#include <stdlib.h>

#include "llmem/ops_norm_matmul.h"
#include "vk_internal.h"
#include "vk_rs.h"
#include "vk_sum.h"

#define NM_MODE 0 /* $LLMEM_VULKAN_NM_MODE: 0 norm_matvec16_rows.comp, 1 norm_matvec16.comp */
#define NM_ROWS_WG 256
#define NM_ROWS_TPR 128 /* invocations per group of rows (matvec16's one-row choice) */
/* weight rows per group: 4 (H200, 9B Bamba batch-1 step 6.110 ms; 1 / 2 / 4 by norm 6.219,
 * 1 6.593; docs/benchmarks.md "Vulkan fused decode matmul, second design") */
#define NM_ROWS_NR 4
/* ... but 2 where K or N is at most NM_SHORT (the 2b Bamba shape, hidden 2048: gate+up
 * 0.040 -> 0.026 ms, every other product as fast or faster; docs/benchmarks.md "Vulkan
 * batch-1 GEMV at hidden 2048") */
#define NM_ROWS_NR_SHORT 2
/* ... and 2 for SwiGLU's two matrices: 4 rows of both held 100 registers, 2 WGs an SM, 2 hold
 * 58 (H200, 9B gate+up 14336 x 4096: 84.0 -> 87.9% of the CUDA copy, 9B b1 fast step 5.551
 * -> 5.476 ms; docs/benchmarks.md "Vulkan batch-1 GEMV: whole waves") */
#define NM_ROWS_NR_SWIGLU 2
#define NM_SHORT 2048
#define NM_ROWS_UNROLL 2 /* 16-byte loads per row and invocation in flight (4, 8: slower) */
/* ... but 1 where K or N is at most NM_SHORT (the 2b step's GPU time 2.318 -> 2.313 ms, the
 * same sums in the same order: docs/benchmarks.md "Vulkan batch-1 step: the host gap") */
#define NM_ROWS_UNROLL_SHORT 1
#define NM_WG 256
#define NM_R 2
#define NM_C_MAX 8     /* chunks per invocation: K <= 8 * NM_C_MAX * WG */
#define NM_LOADS_MAX 8 /* weight chunks in registers per invocation (C R NW) */
#define NM_GROUPS_SM 4 /* workgroups an SM (vk_mm_caps.n_sm; 528 on the H200) */
#define NM_GEMV_ROWS 0 /* whether llmem_op_matmul's one-row f16/bf16 GEMV runs here */
#define NM_PF 0         /* $LLMEM_VULKAN_L2_PREFETCH: 0 off, 1 at the end, 2 at the start */
#define NM_PF_KB 4096   /* $LLMEM_VULKAN_L2_PREFETCH_KB: bytes of the next weights touched */

/* Whether both shaders take the row x [1, K] and weights w: one row,
 * f16/bf16 weights, K a multiple of 8, K and N below 2^31, subgroups of 4+. */
static bool nm_takes(const vk_backend *v, const llmem_ct *x, const llmem_ct *w)
{
    int64_t K = x->ne[1], N = w->ne[0];
    bool w16 = w->dtype == LLMEM_DTYPE_F16 || w->dtype == LLMEM_DTYPE_BF16;
    return x->ne[0] == 1 && w16 && K % 8 == 0 && K <= UINT32_MAX / 2 && N <= UINT32_MAX / 2 &&
           v->subgroup && v->subgroup_size >= 4;
}

/* vk_op_init of `shader` with the specialization constants both shaders
 * start with: w's dtype, the norm, the epilogue, nw's dtype (3: none). */
static void nm_op_init(vk_op *op, vk_shader_id shader, uint32_t wg, int32_t norm, int32_t epi,
                       const llmem_ct *nw, const llmem_ct *w)
{
    vk_op_init(op, shader, wg);
    vk_op_spec(op, (uint32_t)w->dtype);
    vk_op_spec(op, (uint32_t)norm);
    vk_op_spec(op, (uint32_t)epi);
    vk_op_spec(op, nw ? (uint32_t)nw->dtype : 3u); /* DT_NONE */
}

#define NM_BINDINGS 6 /* x, z, nw, w, w2, out: both shaders' first bindings */

/* Binds x, z, nw, w, w2 and out to op in that order, their offsets (in
 * elements of each binding's view) to o[0..5]. false, with op's
 * temporaries given back, where x or z is not 16-byte aligned or w or w2
 * not 16-byte aligned as 8 halves (the shaders' vector loads). */
static bool nm_bind(vk_backend *v, vk_op *op, llmem_ct *x, llmem_ct *z, llmem_ct *nw, llmem_ct *w,
                    llmem_ct *w2, llmem_ct *out, uint32_t o[NM_BINDINGS])
{
    llmem_ct *t[NM_BINDINGS] = {x, z, nw, w, w2, out};
    for (int i = 0; i < NM_BINDINGS; i++)
        o[i] = vk_op_tensor(v, op, t[i], i == NM_BINDINGS - 1);
    if (o[0] % 4 != 0 || o[1] % 4 != 0 || o[3] % 8 != 0 || o[4] % 8 != 0) {
        vk_op_run(v, op, 0); /* gives temporaries back */
        return false;
    }
    return true;
}

/* Pushes the offsets of nm_bind (x and z in vec4s, nw as nw_word, w and
 * w2 in uvec4s, out in floats) and eps: the push words after N and K. */
static void nm_push(vk_op *op, const uint32_t o[NM_BINDINGS], uint32_t nw_word, float eps)
{
    vk_op_u32(op, o[0] / 4);
    vk_op_u32(op, o[1] / 4);
    vk_op_u32(op, nw_word);
    vk_op_u32(op, o[3] / 8);
    vk_op_u32(op, o[4] / 8);
    vk_op_u32(op, o[5]);
    vk_op_f32(op, eps);
}

/* The dispatch of norm_matvec16.comp for one row x [1, K] (norm, epilogue
 * and eps as llmem_norm_matmul_params; z, nw, w2 NULL where unused), or
 * LLMEM_E_UNSUPPORTED, with nothing recorded, where the shader does not
 * take the shapes, dtypes or offsets (see the top). */
static llmem_status nm_launch(vk_backend *v, int32_t norm, int32_t epi, float eps, llmem_ct *x,
                              llmem_ct *z, llmem_ct *nw, llmem_ct *w, llmem_ct *w2, llmem_ct *out)
{
    int64_t K = x->ne[1], N = w->ne[0];
    if (!nm_takes(v, x, w))
        return LLMEM_E_UNSUPPORTED;
    /* 512 for the gated norm: its activation (x, z, silu) is formed once per workgroup */
    uint32_t wg_dflt = norm == LLMEM_NM_NORM_GATED ? 2 * NM_WG : NM_WG;
    uint32_t wg = (uint32_t)VK_KNOB(v, nm_wg, wg_dflt);
    if (wg % v->subgroup_size != 0 || wg > v->props.limits.maxComputeWorkGroupInvocations)
        wg = 256; /* every device of this backend takes 256 (vk_plugin.c) */
    if (wg % v->subgroup_size != 0)
        return LLMEM_E_UNSUPPORTED;
    uint64_t kv = (uint64_t)K / 8, c = vk_div_up(kv, wg);
    if (c > NM_C_MAX)
        return LLMEM_E_UNSUPPORTED;
    uint32_t nmat = epi == LLMEM_NM_SWIGLU ? 2 : 1;
    long rr = VK_KNOB(v, nm_r, NM_R);
    uint32_t r = rr == 4 ? 4 : rr == 2 ? 2 : 1;
    while (r > 1 && c * r * nmat > NM_LOADS_MAX)
        r /= 2;
    vk_op op;
    nm_op_init(&op, VK_SH_NORM_MATVEC16, wg, norm, epi, nw, w);
    vk_op_spec(&op, (uint32_t)c);
    vk_op_spec(&op, r);
    uint32_t o[NM_BINDINGS];
    if (!nm_bind(v, &op, x, z, nw, w, w2, out, o))
        return LLMEM_E_UNSUPPORTED;
    uint64_t blocks = vk_div_up((uint64_t)N, r);
    uint64_t groups = (uint64_t)VK_KNOB(v, nm_groups, (uint64_t)NM_GROUPS_SM * v->mm.n_sm);
    groups = groups > blocks ? blocks : groups;
    vk_op_u32(&op, (uint32_t)N);
    vk_op_u32(&op, (uint32_t)K);
    nm_push(&op, o, o[2], eps);
    vk_op_u32(&op, (uint32_t)groups);
    return vk_op_run(v, &op, groups);
}

/* The launch of norm_matvec16_rows.comp: invocations per group of rows,
 * weight rows per group, 16-byte loads per row and invocation in flight,
 * workgroup size. */
typedef struct nm_rows_cfg {
    uint32_t tpr, nr, unroll, wg;
} nm_rows_cfg;

#define NM_ROWS_LOADS_MAX 32 /* uvec4 weight loads in registers per invocation (NR NW UNROLL) */

/* The default launch for N rows of K (nmat weight matrices), then the
 * knobs: $LLMEM_VULKAN_NM_TPR (32 .. 1024), _NR (1 2 4 8), _UNROLL (1 ..
 * 16), _RWG (64 .. 1024); a knob the device or the other knobs do not
 * allow keeps its default. */
static nm_rows_cfg nm_rows_pick(const vk_backend *v, int64_t K, int64_t N, uint32_t nmat)
{
    /* short rows or few of them: NR_SHORT rows per group, so twice the workgroups */
    bool short_rows = K <= NM_SHORT || N <= NM_SHORT;
    uint32_t nr = short_rows ? NM_ROWS_NR_SHORT : nmat == 2 ? NM_ROWS_NR_SWIGLU : NM_ROWS_NR;
    nm_rows_cfg c = {NM_ROWS_TPR, nr,
                     short_rows ? NM_ROWS_UNROLL_SHORT : NM_ROWS_UNROLL, NM_ROWS_WG};
    uint32_t wg = (uint32_t)VK_KNOB(v, nm_rwg, c.wg);
    if (wg % v->subgroup_size == 0 && wg <= v->props.limits.maxComputeWorkGroupInvocations)
        c.wg = wg;
    uint32_t tpr = (uint32_t)VK_KNOB(v, nm_tpr, c.tpr);
    if (tpr % v->subgroup_size == 0 && c.wg % tpr == 0)
        c.tpr = tpr;
    while (c.wg % c.tpr != 0 && c.tpr > v->subgroup_size)
        c.tpr /= 2;
    long nrr = VK_KNOB(v, nm_nr, c.nr);
    if (nrr == 1 || nrr == 2 || nrr == 4 || nrr == 8)
        c.nr = (uint32_t)nrr;
    c.unroll = (uint32_t)VK_KNOB(v, nm_unroll, c.unroll);
    while (c.unroll > 1 && c.unroll * c.nr * nmat > NM_ROWS_LOADS_MAX)
        c.unroll /= 2;
    return c;
}

void vk_nm_pf_forget(vk_backend *v, const llmem_buffer *buf)
{
    for (uint32_t i = 0; i < v->nm_pf_n;) {
        if (v->nm_pf[i].buf == buf || v->nm_pf[i].next.buf == buf)
            v->nm_pf[i] = v->nm_pf[--v->nm_pf_n];
        else
            i++;
    }
    if (v->nm_pf_prev.buf == buf)
        v->nm_pf_prev.buf = NULL;
}

/* Remembers that w followed the previous one-row product's weight, and
 * returns the weight that followed w the last time (buf NULL: none). The
 * decode step runs its products in the same order every step, so this is
 * the next product's weight from the second step on (a step is recorded
 * after one eager run: models/decode_graph.c). */
static llmem_tensor nm_pf_next(vk_backend *v, const llmem_tensor *w)
{
    llmem_tensor none = {0};
    llmem_tensor *prev = &v->nm_pf_prev, next = none;
    bool found_prev = prev->buf == NULL;
    for (uint32_t i = 0; i < v->nm_pf_n; i++) {
        struct vk_nm_pf *e = &v->nm_pf[i];
        if (e->buf == w->buf && e->off == w->offset)
            next = e->next;
        if (!found_prev && e->buf == prev->buf && e->off == prev->offset) {
            e->next = *w;
            found_prev = true;
        }
    }
    if (!found_prev && v->nm_pf_n < VK_NM_PF_MAX)
        v->nm_pf[v->nm_pf_n++] = (struct vk_nm_pf){prev->buf, prev->offset, *w};
    *prev = *w;
    return next;
}

/* Binds the first bytes of `next` (at most $LLMEM_VULKAN_L2_PREFETCH_KB KiB,
 * inside one chunk of its buffer, whole 32-byte sectors) as binding 7 of
 * op and sets the sectors to touch, in all and per workgroup of `groups`
 * (mode 2: at most 2 per invocation of a workgroup of wg); a dummy binding
 * and no sectors where there is nothing to prefetch. */
static void nm_pf_bind(vk_backend *v, vk_op *op, const llmem_tensor *next, uint32_t mode,
                       uint64_t groups, uint32_t wg, uint32_t pf[3])
{
    pf[0] = pf[1] = pf[2] = 0;
    size_t es = next->buf ? llmem_dtype_size(next->dtype) : 0;
    if (mode == 0 || es != 2 || groups == 0) {
        vk_op_dummy(v, op);
        return;
    }
    vk_buffer *b = vk_buf(next->buf);
    size_t bytes = llmem_tensor_nbytes(next);
    size_t cap = (size_t)VK_KNOB(v, l2_prefetch_kb, NM_PF_KB) * 1024;
    size_t room = (size_t)(b->chunk - next->offset % b->chunk);
    bytes = bytes < cap ? bytes : cap;
    bytes = (bytes < room ? bytes : room) / 32 * 32;
    if (bytes == 0) {
        vk_op_dummy(v, op);
        return;
    }
    llmem_tensor s = llmem_tensor_1d(next->buf, next->offset, next->dtype, (int32_t)(bytes / 2));
    uint32_t at = vk_op_tensor(v, op, &s, false);
    if (at % 8 != 0)
        return; /* bound, but no sectors: the shader reads none */
    uint64_t n = bytes / 32, per = vk_div_up(n, groups);
    if (mode == 2 && per > 2 * (uint64_t)wg) {
        per = 2 * (uint64_t)wg;
        n = per * groups < n ? per * groups : n;
    }
    pf[0] = at / 8;
    pf[1] = (uint32_t)n;
    pf[2] = (uint32_t)per;
}

/* What one fused product reads and writes (nm_launch's arguments). */
typedef struct nm_args {
    int32_t norm, epi;
    float eps;
    llmem_tensor x, z, nw, w, w2, out;
    bool has_z, has_nw, has_w2;
} nm_args;

static llmem_ct *opt(const llmem_tensor *t, bool has)
{
    return has ? t : NULL;
}

/* The decode conv whose input is a slice of the product's output
 * (norm_matvec16_conv, vk_nm_conv_take): its weight, bias, output, the
 * view's index buffer and conv state buffer, and the shader's words. */
typedef struct nm_conv {
    llmem_tensor w, b, out;
    bool has_b;
    llmem_buffer *idx, *state;
    uint32_t spec; /* norm_matvec16_rows.comp's CV */
    uint32_t c0, conv_dim, n_slots, src_word, dst_word;
} nm_conv;

/* Fills *op with the dispatch of norm_matvec16_rows.comp (matvec16.comp's
 * layout: TPR invocations per group of NR weight rows, WG / TPR groups a
 * workgroup), or of norm_matvec16_conv with the decode conv cv folded in
 * (cv non-NULL: no L2 prefetch), and *groups with its workgroups; records
 * nothing (vk_op_run records or, with 0 groups, drops it).
 * LLMEM_E_UNSUPPORTED, with nothing bound, where nm_launch refuses (but no
 * limit on K). */
static llmem_status nm_rows_build(vk_backend *v, const nm_args *a, const nm_conv *cv, vk_op *op,
                                  uint64_t *groups)
{
    llmem_ct *x = &a->x, *nw = opt(&a->nw, a->has_nw), *w = &a->w;
    int64_t K = x->ne[1], N = w->ne[0];
    if (!nm_takes(v, x, w))
        return LLMEM_E_UNSUPPORTED;
    nm_rows_cfg c = nm_rows_pick(v, K, N, a->epi == LLMEM_NM_SWIGLU ? 2 : 1);
    if (c.tpr % v->subgroup_size != 0 || c.wg % c.tpr != 0)
        return LLMEM_E_UNSUPPORTED;
    nm_op_init(op, cv ? VK_SH_NORM_MATVEC16_CONV : VK_SH_NORM_MATVEC16_ROWS, c.wg, a->norm,
               a->epi, nw, w);
    vk_op_spec(op, c.tpr);
    vk_op_spec(op, c.nr);
    uint32_t o[NM_BINDINGS];
    bool ok = nm_bind(v, op, x, opt(&a->z, a->has_z), nw, w, opt(&a->w2, a->has_w2), &a->out, o);
    uint32_t nwv = ok ? vk_op_tensor(v, op, nw, false) : 0; /* nw's bytes, read as uvec4 */
    /* elements per uvec4 of the norm weight; 0: read element by element */
    uint32_t per = !nw ? 0 : nw->dtype == LLMEM_DTYPE_F32 ? 4 : 8;
    bool vec = per && nwv % per == 0;
    if (!ok)
        return LLMEM_E_UNSUPPORTED;
    *groups = vk_div_up((uint64_t)N, (uint64_t)(c.wg / c.tpr) * c.nr);
    uint32_t mode = cv ? 0 : (uint32_t)VK_KNOB(v, l2_prefetch, NM_PF), pf[3];
    uint32_t cw = 0, cb = 0, co = 0;
    if (cv) { /* bindings 7-11 */
        cw = vk_op_tensor(v, op, &cv->w, false);
        cb = vk_op_tensor(v, op, opt(&cv->b, cv->has_b), false);
        vk_op_buffer(v, op, cv->idx, false);
        vk_op_buffer(v, op, cv->state, true);
        co = vk_op_tensor(v, op, &cv->out, true);
        pf[0] = pf[1] = pf[2] = 0;
    } else {
        llmem_tensor next = {0};
        if (mode != 0)
            next = nm_pf_next(v, w);
        nm_pf_bind(v, op, &next, mode, *groups, c.wg, pf);
    }
    vk_op_spec(op, vec);
    vk_op_spec(op, c.unroll);
    vk_op_spec(op, cv ? cv->spec : pf[1] ? mode : 0);
    vk_op_u32(op, (uint32_t)N);
    vk_op_u32(op, (uint32_t)K);
    nm_push(op, o, vec ? nwv / per : o[2], a->eps);
    for (int i = 0; i < 3; i++)
        vk_op_u32(op, pf[i]);
    if (cv) {
        uint32_t words[8] = {cv->c0, cv->conv_dim, cv->n_slots, cw, cb, co, cv->src_word,
                             cv->dst_word};
        for (int i = 0; i < 8; i++)
            vk_op_u32(op, words[i]);
    }
    return LLMEM_OK;
}

/* ---- the decode conv in in_proj's epilogue (vk_internal.h, vk_nm_conv_take) -------------- */

#define NM_CONV 1 /* $LLMEM_VULKAN_NM_CONV: hold one-row RMS-norm products for the conv */

/* The held product (v->nmc_pending): its dispatch alone and its arguments. */
struct vk_nm_hold {
    vk_op op;
    uint64_t groups;
    nm_args a;
};

llmem_status vk_nm_conv_flush(vk_backend *v)
{
    if (!v->nmc_pending)
        return LLMEM_OK;
    v->nmc_pending = false; /* first: recording it tracks, which calls back here */
    return vk_op_run(v, &v->nmc->op, v->nmc->groups);
}

void vk_nm_conv_finish(vk_backend *v)
{
    vk_nm_conv_flush(v); /* recorded; vk_cmd_finish submits it */
    free(v->nmc);
    v->nmc = NULL;
}

/* Whether a one-row product may be held for a conv: an RMS-normed product
 * stored as is (a Mamba-2 in_proj), $LLMEM_VULKAN_NM_CONV not 0. */
static bool nm_may_hold(const vk_backend *v, const nm_args *a)
{
    return a->norm == LLMEM_NM_NORM_RMS && a->epi == LLMEM_NM_STORE && !a->has_w2 &&
           VK_KNOB(v, nm_conv, NM_CONV) == 1;
}

/* Holds the product a (its dispatch built, not recorded) or records it
 * now where it may not be held or no room for the hold can be made. */
static llmem_status nm_rows(vk_backend *v, const nm_args *a)
{
    vk_op op;
    uint64_t groups = 0;
    llmem_status st;
    bool hold = nm_may_hold(v, a);
    if (hold) {
        /* what was held before goes first; an open command buffer keeps the
         * allocator from destroying a block the held dispatch binds
         * (vk_alloc_release trims only when nothing is recorded) */
        if ((st = vk_held_flush(v)) != LLMEM_OK || (st = vk_cmd_begin(v)) != LLMEM_OK)
            return st;
        if (!v->nmc && !(v->nmc = calloc(1, sizeof *v->nmc)))
            hold = false;
    }
    if ((st = nm_rows_build(v, a, NULL, hold ? &v->nmc->op : &op, &groups)) != LLMEM_OK)
        return st;
    if (!hold)
        return vk_op_run(v, &op, groups);
    v->nmc->groups = groups;
    v->nmc->a = *a;
    v->nmc_pending = true;
    return LLMEM_OK;
}

static bool dt_conv(llmem_dtype t)
{
    return t == LLMEM_DTYPE_F32 || t == LLMEM_DTYPE_F16 || t == LLMEM_DTYPE_BF16;
}

/* Whether the held product's dispatch may also do the conv (x -> out,
 * state `state` of view): x a whole f32 slice of the product's output
 * [1, N] at a float offset, one stream of one token without checkpoints,
 * dtypes and d_conv the shader carries, and nothing the conv writes (out,
 * the state buffer) read or written by the product; fills *cv. */
static bool nm_conv_matches(const vk_backend *v, const llmem_view *view, int32_t state,
                            llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out, nm_conv *cv)
{
    const nm_args *a = &v->nmc->a;
    const llmem_rs_view *rs = llmem_view_rs(view);
    const llmem_state_desc *d = &rs->desc[state];
    if (rs->n_seqs != 1 || rs->n_seq_tokens != 1 || rs->n_ckpt != 0 || d->n_dims != 2 ||
        d->shape[0] < 1 || d->shape[0] > 14 || !dt_conv(d->dtype) || !dt_conv(w->dtype) ||
        (b && !dt_conv(b->dtype)) || x->dtype != LLMEM_DTYPE_F32 ||
        out->dtype != LLMEM_DTYPE_F32 || a->out.dtype != LLMEM_DTYPE_F32)
        return false;
    uint64_t dc = (uint64_t)d->shape[0] + 1, cd = (uint64_t)d->shape[1];
    uint64_t n = (uint64_t)a->w.ne[0];
    if (x->buf != a->out.buf || x->offset < a->out.offset || (x->offset - a->out.offset) % 4 ||
        llmem_tensor_nbytes(x) < cd * 4 || llmem_tensor_nbytes(out) < cd * 4 ||
        (uint64_t)llmem_tensor_nelements(w) < cd * dc || (b && (uint64_t)llmem_tensor_nelements(b) < cd))
        return false;
    uint64_t c0 = (x->offset - a->out.offset) / 4;
    if (c0 + cd > n)
        return false;
    const llmem_tensor *rd[6] = {&a->x, &a->z, &a->nw, &a->w, &a->w2, &a->out};
    const bool has[6] = {true, a->has_z, a->has_nw, true, a->has_w2, true};
    for (int i = 0; i < 6; i++)
        if (has[i] && (vk_overlap(rd[i], out) || rd[i]->buf == rs->state[state]))
            return false;
    if (vk_overlap(&a->out, w) || vk_overlap(b, &a->out))
        return false;
    bool snap = true;
    if (vk_rs_needs_snapshot(rs, &snap) != LLMEM_OK || snap)
        return false;
    *cv = (nm_conv){.w = *w, .out = *out, .has_b = b != NULL, .idx = view->idx,
                    .state = rs->state[state], .c0 = (uint32_t)c0, .conv_dim = (uint32_t)cd,
                    .n_slots = (uint32_t)rs->n_slots, .src_word = vk_table_word(&rs->src_slot),
                    .dst_word = vk_table_word(&rs->dst_slot)};
    if (b)
        cv->b = *b;
    cv->spec = (uint32_t)dc | (uint32_t)w->dtype << 4 | (b ? (uint32_t)b->dtype : 3u) << 6 |
               (uint32_t)d->dtype << 8;
    return true;
}

llmem_status vk_nm_conv_take(vk_backend *v, const llmem_view *view, int32_t state, llmem_ct *x,
                             llmem_ct *w, llmem_ct *b, llmem_ct *out, bool *taken)
{
    *taken = false;
    if (!v->nmc_pending)
        return LLMEM_OK;
    nm_conv cv;
    if (!nm_conv_matches(v, view, state, x, w, b, out, &cv))
        return vk_nm_conv_flush(v);
    vk_op op;
    uint64_t groups = 0;
    if (nm_rows_build(v, &v->nmc->a, &cv, &op, &groups) != LLMEM_OK)
        return vk_nm_conv_flush(v); /* nothing bound: the product alone */
    v->nmc_pending = false;
    vk_op_run(v, &v->nmc->op, 0); /* gives its temporaries back */
    *taken = true;
    return vk_op_run(v, &op, groups);
}

llmem_status vk_held_flush(vk_backend *v)
{
    llmem_status st = vk_sum_flush(v);
    st = st != LLMEM_OK ? st : vk_rope_flush(v);
    st = st != LLMEM_OK ? st : vk_nm_conv_flush(v);
    return st != LLMEM_OK ? st : vk_conv_fold_flush(v);
}

/* The fused kernel of the mode $LLMEM_VULKAN_NM_MODE picks: 0 (default)
 * norm_matvec16_rows.comp, 1 the persistent norm_matvec16.comp. */
static llmem_status nm_run(vk_backend *v, int32_t norm, int32_t epi, float eps, llmem_ct *x,
                           llmem_ct *z, llmem_ct *nw, llmem_ct *w, llmem_ct *w2, llmem_ct *out)
{
    if (VK_KNOB(v, nm_mode, NM_MODE) == 1)
        return nm_launch(v, norm, epi, eps, x, z, nw, w, w2, out);
    nm_args a = {.norm = norm, .epi = epi, .eps = eps, .x = *x, .w = *w, .out = *out,
                 .has_z = z != NULL, .has_nw = nw != NULL, .has_w2 = w2 != NULL};
    if (z)
        a.z = *z;
    if (nw)
        a.nw = *nw;
    if (w2)
        a.w2 = *w2;
    return nm_rows(v, &a);
}

static llmem_status vk_op_norm_matmul(llmem_backend *be, const llmem_norm_matmul_params *p,
                                      llmem_ct *x, llmem_ct *z, llmem_ct *nw, llmem_ct *w,
                                      llmem_ct *w2, llmem_ct *out)
{
    if (VK_KNOB(vk_from(be), norm_matmul, 1) == 0)
        return LLMEM_E_UNSUPPORTED;
    return nm_run(vk_from(be), p->norm, p->epilogue, p->eps, x, z, nw, w, w2, out);
}

llmem_status vk_gemv_rows(vk_backend *v, llmem_ct *a, llmem_ct *w, llmem_ct *u, llmem_ct *out)
{
    if (VK_KNOB(v, gemv_rows, NM_GEMV_ROWS) == 0)
        return LLMEM_E_UNSUPPORTED;
    return nm_run(v, LLMEM_NM_NORM_NONE, u ? LLMEM_NM_SWIGLU : LLMEM_NM_STORE, 0.0f, a, NULL,
                  NULL, w, u, out);
}

/* Registered in the Vulkan backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_NORM_MATMUL, LLMEM_OP_NORM_MATMUL_LAYOUT,
              llmem_op_norm_matmul_fn, vk_op_norm_matmul);

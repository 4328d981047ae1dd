/* llmem Vulkan backend: get_rows, element-wise ops and activations, RMS
 * norms, log_softmax, argmax, copies, and the ops table.
 *
 * Each op binds its tensors, pushes their element offsets and sizes, and
 * records one dispatch (shaders/<op>.comp); row-wise ops run one workgroup
 * per row. Dtypes of weights are specialization constants, so each
 * pipeline reads its dtype without a branch. Semantics are those of the
 * CPU reference (backends/cpu/ops_basic.c).
 */
#include <stdlib.h>

#include "vk_internal.h"
#include "vk_presplit.h"
#include "vk_sum.h"

#define EW_WG 256
#define ROW_WG 256

static int64_t rows_of(const llmem_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i + 1 < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

static int64_t cols_of(const llmem_tensor *t)
{
    return t->ne[t->n_dims - 1];
}

/* ---- get_rows ----------------------------------------------------------------------------- */

llmem_status vk_op_get_rows(llmem_backend *be, llmem_ct *src, llmem_ct *idx, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    vk_op op;
    vk_op_init(&op, VK_SH_GET_ROWS, EW_WG);
    vk_op_spec(&op, (uint32_t)src->dtype);
    uint32_t so = vk_op_tensor(v, &op, src, false);
    uint32_t io = vk_op_tensor(v, &op, idx, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    uint64_t n = (uint64_t)idx->ne[0], cols = (uint64_t)src->ne[1];
    vk_op_u32(&op, (uint32_t)n);
    vk_op_u32(&op, (uint32_t)cols);
    vk_op_u32(&op, (uint32_t)src->ne[0]);
    vk_op_u32(&op, so);
    vk_op_u32(&op, io);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, vk_div_up(n * cols, EW_WG));
}

/* ---- element-wise ------------------------------------------------------------------------- */

static llmem_status binary(llmem_backend *be, uint32_t kind, llmem_ct *a, llmem_ct *b,
                           llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t n = llmem_tensor_nelements(a), nb = llmem_tensor_nelements(b);
    vk_op op;
    vk_op_init(&op, VK_SH_BINARY, EW_WG);
    vk_op_spec(&op, kind);
    uint32_t ao = vk_op_tensor(v, &op, a, false);
    uint32_t bo = vk_op_tensor(v, &op, b, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, (uint32_t)n);
    vk_op_u32(&op, nb == n ? 0u : (uint32_t)nb); /* a broadcast row */
    vk_op_u32(&op, ao);
    vk_op_u32(&op, bo);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n, EW_WG));
}

llmem_status vk_op_add(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out)
{
    return binary(be, 0, a, b, out);
}

llmem_status vk_op_mul(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out)
{
    return binary(be, 1, a, b, out);
}

/* At decode rows (vk_presplit_want) the SwiGLU also writes matmul_cm's
 * terms of out for the down projection (vk_swiglu_split). */
llmem_status vk_op_swiglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out)
{
    bool done = false;
    llmem_status st = vk_swiglu_split(be, vk_from(be), gate, up, out, &done);
    if (st != LLMEM_OK || done)
        return st;
    return binary(be, 2, gate, up, out);
}

static llmem_status unary(llmem_backend *be, uint32_t kind, llmem_ct *a, float s, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t n = llmem_tensor_nelements(a);
    vk_op op;
    vk_op_init(&op, VK_SH_UNARY, EW_WG);
    vk_op_spec(&op, kind);
    uint32_t ao = vk_op_tensor(v, &op, a, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, (uint32_t)n);
    vk_op_u32(&op, ao);
    vk_op_u32(&op, oo);
    vk_op_f32(&op, s);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n, EW_WG));
}

llmem_status vk_op_scale(llmem_backend *be, llmem_ct *a, float s, llmem_ct *out)
{
    return unary(be, 0, a, s, out);
}

llmem_status vk_op_silu(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return unary(be, 1, a, 0.0f, out);
}

llmem_status vk_op_relu2(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return unary(be, 2, a, 0.0f, out);
}

llmem_status vk_op_softplus(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return unary(be, 3, a, 0.0f, out);
}

llmem_status vk_op_softcap(llmem_backend *be, llmem_ct *a, float cap, llmem_ct *out)
{
    return unary(be, 4, a, cap, out);
}

llmem_status vk_op_geglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out)
{
    return binary(be, 3, gate, up, out);
}

/* ---- norms ------------------------------------------------------------------------------- */

/* Most elements per invocation the norms keep in registers (REG): 16 for
 * rms_norm (a 4096-wide row: 18.2 -> 14.8 us a call at batch 64 on the
 * H200), but the gated norm with 32 (Bamba-9B's 8192-wide groups) took
 * 28.2 us a call against the loop's 25.5 (docs/benchmarks.md, "The b64
 * decode step's scan and slot copies"), so it keeps 16 too. */
#define NORM_REG_MAX 16

/* Most elements a norm that also writes matmul_cm's terms (vk_presplit.c)
 * packs through shared memory (4 bytes each): 32 KiB. */
#define NORM_SPLIT_MAX 8192

/* The workgroup of a norm of `rows` rows of n elements:
 * $LLMEM_VULKAN_NORM_WG (64 .. 1024, a power of two) when set; at the
 * batched decode rows (VK_MM_MV_MAX < rows <= VK_PRESPLIT_ROWS) 1024 from
 * 2048 elements and 512 from 1024 (such a norm is 9-64 workgroups, so
 * wider ones put more loads in flight: H200, 9B b64 24.45 -> 22.72 ms with
 * the presplit, 2b 11.80 -> 10.74; docs/benchmarks.md "The batched decode
 * step: split activations, wider norms"); else ROW_WG (prefill and 1-8
 * rows: not measured wider). */
static uint32_t norm_wg(const vk_backend *v, int64_t rows, int64_t n)
{
    if (v->knobs.norm_wg > 0) /* $LLMEM_VULKAN_NORM_WG */
        return (uint32_t)v->knobs.norm_wg;
    if (rows <= VK_MM_MV_MAX || rows > (int64_t)VK_PRESPLIT_ROWS)
        return ROW_WG;
    return n >= 2048 ? 1024u : n >= 1024 ? 512u : ROW_WG;
}

/* The REG specialization constant of a norm over rows of n elements with
 * workgroups of wg: ceil(n / wg) when that is at most NORM_REG_MAX, else
 * 0 (the loop). */
static uint32_t norm_reg(const vk_backend *v, int64_t n, uint32_t wg)
{
    int64_t k = (n + wg - 1) / wg;
    return !v->scan.norm_loop && k >= 1 && k <= NORM_REG_MAX ? (uint32_t)k : 0u;
}

/* Most runs of 4 elements an invocation of the norms' V4 path keeps in
 * registers; the workgroup doubles from ROW_WG (up to 1024) until a row
 * needs at most this many. */
#define NORM_V4_MAX 4

/* Whether t's first element is 16-byte aligned (so its binding's element
 * offset is a multiple of 4 whatever the device's offset alignment, a
 * power of two). */
static bool aligned16(llmem_ct *t)
{
    return !t || t->offset % 16 == 0;
}

/* The V4 specialization constant (runs of 4 elements an invocation) of a
 * norm over rows of n elements above VK_CMP_ROWS rows (the prefill
 * ubatches; $LLMEM_VULKAN_PF_NORM=0: never), with *wg its workgroup
 * ($LLMEM_VULKAN_NORM_WG where set, else ROW_WG doubled while a row needs
 * more than NORM_V4_MAX runs an invocation), where n is a multiple of 4
 * and the tensors a[0..na) are 16-byte aligned; else 0 (*wg unchanged).
 * Each invocation then moves 16-byte vectors and a norm with terms writes
 * them without a pass through shared memory (rms_norm.comp). */
static uint32_t norm_v4(const vk_backend *v, int64_t rows, int64_t n, llmem_ct *const *a, int na,
                        uint32_t *wg)
{
    if (rows <= VK_CMP_ROWS || VK_KNOB(v, pf_norm, 1) == 0 || n % 4 != 0)
        return 0;
    for (int i = 0; i < na; i++)
        if (!aligned16(a[i]))
            return 0;
    int64_t n4 = n / 4;
    uint32_t g = v->knobs.norm_wg > 0 ? (uint32_t)v->knobs.norm_wg : ROW_WG;
    while (v->knobs.norm_wg <= 0 && g < 1024 && n4 > (int64_t)g * NORM_V4_MAX)
        g *= 2;
    if (g > v->props.limits.maxComputeWorkGroupInvocations)
        return 0;
    int64_t k = (n4 + g - 1) / g;
    if (k > 2 * NORM_V4_MAX) /* a workgroup set too narrow by the knob: the REG / loop path */
        return 0;
    *wg = g;
    return (uint32_t)k;
}

/* Most runs of 4 elements an invocation of cm_split.comp's V4 keeps (a
 * SwiGLU row of up to 16384 at 1024 invocations). */
#define SPLIT_V4_MAX 4
#define SPLIT_V4_WG 1024u

uint32_t vk_pf_split_v4(const vk_backend *v, uint32_t m, uint32_t k, uint32_t *wg)
{
    uint32_t n4 = k / 4, runs = (n4 + SPLIT_V4_WG - 1) / SPLIT_V4_WG;
    if (m <= VK_CMP_ROWS || VK_KNOB(v, pf_swiglu, 1) == 0 || k % 4 != 0 || runs > SPLIT_V4_MAX ||
        SPLIT_V4_WG > v->props.limits.maxComputeWorkGroupInvocations)
        return 0;
    *wg = SPLIT_V4_WG;
    return runs;
}

/* Workgroups a row at 9-16 decode rows (VK_MM_MV_MAX < rows <=
 * VK_ROW_SPLIT_ROWS): about vk_row_split_wgs in all, so that 16 rows fill the
 * SMs instead of 16 of them (H200, 128 workgroups on 132 SMs: 9B fast tg128
 * b16 10.11-10.15 -> 9.95-10.05 ms; at 64 rows, 2 a row lost: 9B b64 16.84
 * -> 16.95, 2b 8.78 -> 8.97; docs/benchmarks.md "Vulkan decode at 16 rows:
 * rows over several workgroups"). */

/* Each of the ns workgroups that share a row recomputes the whole row's
 * reduction (a row of a few thousand elements, read again from L2) and
 * writes units / ns of it; so ns is
 *   - $LLMEM_VULKAN_ROW_SPLIT where set (0 or 1: one workgroup a row), at
 *     any row count, at most units / 2;
 *   - else ceil(vk_row_split_wgs / rows) at 9-VK_ROW_SPLIT_ROWS rows, at most
 *     units / unit_min (each part at least unit_min units), and 1 at
 *     other rows. */
uint32_t vk_row_split(const vk_backend *v, int64_t rows, int64_t units, int64_t unit_min)
{
    int64_t ns, most = units / unit_min;
    if (v->knobs.row_split >= 0) {
        ns = v->knobs.row_split;
        most = units / 2;
    } else if (rows > VK_MM_MV_MAX && rows <= VK_ROW_SPLIT_ROWS) {
        ns = ((int64_t)vk_row_split_wgs(v->mm.n_sm) + rows - 1) / rows;
    } else {
        ns = 1;
    }
    ns = ns < most ? ns : most;
    return ns > 1 ? (uint32_t)ns : 1u;
}

bool vk_overlap(const llmem_tensor *t, const llmem_tensor *u)
{
    if (!t || !u || t->buf != u->buf)
        return false;
    size_t te = t->offset + llmem_tensor_nbytes(t), ue = u->offset + llmem_tensor_nbytes(u);
    return t->offset < ue && u->offset < te;
}

/* Columns (elements) a workgroup of a split norm writes at least. */
#define NORM_PART_MIN 256

/* Binds the presplit terms of out [rows, cols] (binding 4 of rms_norm.comp
 * and rms_norm_gated.comp) and pushes their word offsets hi, lo, e, when
 * the norm takes the REG path (reg elements an invocation of wg, packed
 * through shared memory beside the reductions' wg words: where that fits
 * the device) or the V4 path, with at most NORM_SPLIT_MAX elements a row,
 * and vk_presplit_want says so; else a dummy binding and zeros. Returns
 * the SPLIT specialization constant (1: written, 2: hi alone, where
 * vk_presplit_lo says so; 0: none). */
static uint32_t norm_split_bind(llmem_backend *be, vk_backend *v, vk_op *op, int64_t rows,
                                int64_t cols, uint32_t reg, uint32_t v4, uint32_t wg)
{
    llmem_tensor t;
    uint32_t so = 0;
    bool fits = v4 > 0 || (reg > 0 && ((uint64_t)reg * wg + wg) * 4 <=
                                          v->props.limits.maxComputeSharedMemorySize);
    bool on = fits && cols <= NORM_SPLIT_MAX && vk_presplit_want(v, rows, cols) &&
              vk_presplit_target(be, v, (uint32_t)rows, (uint32_t)cols, &t) == LLMEM_OK;
    if (on)
        so = vk_op_tensor(v, op, &t, true);
    else
        vk_op_dummy(v, op);
    size_t mk = (size_t)rows * (size_t)cols;
    vk_op_u32(op, on ? so : 0u);
    vk_op_u32(op, on ? (uint32_t)(so + mk / 2) : 0u);
    vk_op_u32(op, on ? (uint32_t)(so + mk) : 0u);
    return on ? (vk_presplit_lo(v, rows) ? 1u : 2u) : 0u;
}

/* The DN specialization constant of a norm of `rows` rows on the REG path
 * (rms_norm.comp, rms_norm_gated.comp): $LLMEM_VULKAN_DEC_NORM's
 * VK_DEC_NORM_LOADS, _MAX, _SUM and _WO bits (rms_norm.comp takes WO off) at the decode rows
 * (VK_MM_MV_MAX < rows <= VK_PRESPLIT_ROWS), else 0. */
static uint32_t norm_dn(const vk_backend *v, int64_t rows, uint32_t reg)
{
    if (reg == 0 || rows <= VK_MM_MV_MAX || rows > (int64_t)VK_PRESPLIT_ROWS)
        return 0;
    long bits = VK_DEC_NORM_LOADS | VK_DEC_NORM_MAX | VK_DEC_NORM_SUM | VK_DEC_NORM_WO;
    return (uint32_t)(vk_dec_norm_mode(v) & bits);
}

/* How a norm split over workgroups a row (ns > 1) treats x, the residual
 * r and the residual's copies (vk_sum.h): sets *xs (rms_norm.comp's XS),
 * *xa and *xb (the copies it reads and writes), may take r into x first
 * (*r NULL after) or set *ns to 1. With r: x's values from its copy where
 * one holds x and r is either the held sum that the norm then reads
 * itself (the fold) or a tensor clear of out and x; else the held sum adds
 * itself into x (vk_sum_add_into) and the norm reads x alone; else one
 * workgroup a row. */
static llmem_status split_plan(llmem_backend *be, vk_backend *v, llmem_ct *x, llmem_ct **r,
                               llmem_ct *out, bool terms, size_t terms_bytes, uint32_t *ns,
                               uint32_t *xs, llmem_tensor *xa, llmem_tensor *xb)
{
    *xs = 0;
    if (*ns <= 1)
        return LLMEM_OK;
    if (*r) {
        bool fold = vk_sum_norm_ok(v, x, *r, out, terms, terms_bytes, true);
        bool direct = !vk_overlap(*r, out) && !vk_overlap(*r, x);
        if ((fold || direct) && vk_resid_src(v, x, xa)) {
            *xs = 1;
        } else {
            bool added = false;
            llmem_status st = vk_sum_add_into(v, x, *r, out, &added);
            if (st != LLMEM_OK)
                return st;
            if (added)
                *r = NULL; /* x holds x + r now */
            else
                *ns = 1;
            *xs = added ? 2 : 0;
        }
    } else {
        *xs = 2;
    }
    if (*xs && vk_resid_dst(be, v, x, xb) != LLMEM_OK) {
        if (*xs == 1)
            *ns = 1; /* x read and written by one workgroup a row */
        *xs = 0;
    }
    return LLMEM_OK;
}

/* rms_norm.comp, with the residual r added into x first when r is given.
 * Split over vk_row_split workgroups a row (NS) where it takes the REG path
 * and out is clear of x, as split_plan says. */
static llmem_status rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *r, llmem_ct *w, float eps,
                             llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t rows = rows_of(x), cols = cols_of(x);
    uint32_t wg = norm_wg(v, rows, cols);
    llmem_ct *ts[] = {x, r, w, out};
    uint32_t v4 = norm_v4(v, rows, cols, ts, 4, &wg);
    uint32_t reg = v4 ? 0u : norm_reg(v, cols, wg);
    uint32_t ns = reg > 0 && !vk_overlap(out, x) ? vk_row_split(v, rows, cols, NORM_PART_MIN) : 1u;
    uint32_t fwgs = reg > 0 && !vk_overlap(out, x) ? vk_sum_norm_wgs(v, rows, r) : 0u;
    if (fwgs) { /* $LLMEM_VULKAN_NORM_FOLD_WGS: the folding norm's own split */
        int64_t n = (fwgs + rows - 1) / rows, most = cols / NORM_PART_MIN;
        ns = (uint32_t)(n < most ? n : most > 0 ? most : 1);
    }
    size_t terms_bytes = vk_presplit_bytes((uint32_t)rows, (uint32_t)cols);
    bool terms = (reg > 0 || v4 > 0) && cols <= NORM_SPLIT_MAX && vk_presplit_want(v, rows, cols);
    uint32_t xs = 0;
    llmem_tensor xa, xb;
    llmem_status st = split_plan(be, v, x, &r, out, terms, terms_bytes, &ns, &xs, &xa, &xb);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    vk_op_init(&op, v->subgroup ? VK_SH_RMS_NORM_SG : VK_SH_RMS_NORM, wg);
    vk_op_spec(&op, w ? (uint32_t)w->dtype : 3u);
    uint32_t add = r ? 1u : 0u; /* 2: r is a held split-K sum (vk_sum.c), set below */
    vk_op_spec(&op, add);
    vk_op_spec(&op, reg);
    uint32_t xo = vk_op_tensor(v, &op, x, r != NULL);
    uint32_t wo = vk_op_tensor(v, &op, w, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    uint32_t ro = vk_op_tensor(v, &op, r, false);
    vk_op_u32(&op, (uint32_t)rows);
    vk_op_u32(&op, (uint32_t)cols);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, wo);
    vk_op_u32(&op, oo);
    vk_op_f32(&op, eps);
    vk_op_u32(&op, ro);
    uint32_t split = norm_split_bind(be, v, &op, rows, cols, reg, v4, wg);
    vk_op_spec(&op, split);
    if (r && (!v4 || vk_sum_norm_vec4(v)) &&
        vk_sum_norm_bind(v, &op, x, r, out, split != 0, terms_bytes, ns > 1)) {
        op.spec[2] = add = 2;
    } else { /* bindings 5 and 6 and their five words: ADD 2 only */
        vk_op_dummy(v, &op);
        vk_op_dummy(v, &op);
        for (int i = 0; i < 5; i++)
            vk_op_u32(&op, 0);
    }
    if (xs == 1 && add != 2 && (vk_overlap(r, out) || vk_overlap(r, x))) {
        ns = 1; /* the fold split_plan counted on did not bind: one workgroup a row reads x */
        xs = 0;
    }
    vk_op_spec(&op, ns);
    vk_op_spec(&op, xs);
    uint32_t xao = 0, xbo = 0;
    if (xs == 1)
        xao = vk_op_tensor(v, &op, &xa, false);
    else
        vk_op_dummy(v, &op);
    if (xs)
        xbo = vk_op_tensor(v, &op, &xb, true);
    else
        vk_op_dummy(v, &op);
    vk_op_u32(&op, xao);
    vk_op_u32(&op, xbo);
    vk_op_spec(&op, v4);
    vk_op_spec(&op, add == 2 ? vk_sum_norm_slices(v) : 0u); /* SL: the slices unrolled */
    vk_op_spec(&op, norm_dn(v, rows, reg) & ~(uint32_t)VK_DEC_NORM_WO);
    st = vk_op_run(v, &op, (uint64_t)rows * ns);
    if (add == 2)
        vk_sum_taken(v);
    if (st == LLMEM_OK && split)
        vk_presplit_set(v, out, (uint32_t)rows, (uint32_t)cols, split == 1);
    if (st == LLMEM_OK && xs)
        vk_resid_set(v, x, &xb);
    return st;
}

llmem_status vk_op_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *w, float eps, llmem_ct *out)
{
    return rms_norm(be, x, NULL, w, eps, out);
}

/* x += r; out = rms_norm(x, w, eps): one dispatch instead of two and a
 * barrier (a pre-norm block's residual add; 2 per layer of a decode step). */
llmem_status vk_op_add_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *r, llmem_ct *w, float eps,
                                llmem_ct *out)
{
    return rms_norm(be, x, r, w, eps, out);
}

llmem_status vk_op_rms_norm_gated(llmem_backend *be, llmem_ct *y, llmem_ct *z, llmem_ct *w,
                                  int32_t n_groups, float eps, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t rows = rows_of(y), cols = cols_of(y);
    uint32_t wg = norm_wg(v, rows, cols / n_groups);
    llmem_ct *ts[] = {y, z, w, out};
    uint32_t v4 = cols % 4 == 0 ? norm_v4(v, rows, cols / n_groups, ts, 4, &wg) : 0u;
    uint32_t reg = v4 ? 0u : norm_reg(v, cols / n_groups, wg);
    /* several workgroups a (row, group) where out is clear of y and z: the
     * REG path (rms_norm_gated.comp's NS) */
    uint32_t ns = reg > 0 && !vk_overlap(out, y) && !vk_overlap(out, z)
                      ? vk_row_split(v, rows * n_groups, cols / n_groups, NORM_PART_MIN)
                      : 1u;
    vk_op op;
    vk_op_init(&op, v->subgroup ? VK_SH_RMS_NORM_GATED_SG : VK_SH_RMS_NORM_GATED, wg);
    vk_op_spec(&op, (uint32_t)w->dtype);
    vk_op_spec(&op, reg);
    uint32_t yo = vk_op_tensor(v, &op, y, false);
    uint32_t zo = vk_op_tensor(v, &op, z, false);
    uint32_t wo = vk_op_tensor(v, &op, w, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, (uint32_t)(rows * n_groups));
    vk_op_u32(&op, (uint32_t)cols);
    vk_op_u32(&op, (uint32_t)(cols / n_groups));
    vk_op_u32(&op, (uint32_t)n_groups);
    vk_op_u32(&op, yo);
    vk_op_u32(&op, zo);
    vk_op_u32(&op, wo);
    vk_op_u32(&op, oo);
    vk_op_f32(&op, eps);
    /* the terms span a row: one group only */
    uint32_t split = norm_split_bind(be, v, &op, rows, cols, n_groups == 1 ? reg : 0u,
                                     n_groups == 1 ? v4 : 0u, wg);
    vk_op_spec(&op, split);
    vk_op_spec(&op, ns);
    vk_op_spec(&op, v4);
    /* $LLMEM_VULKAN_PF_NORM=2: the runs wait in shared memory (SMEM), where
     * they fit beside the reductions' words */
    uint64_t smem = (uint64_t)v4 * wg * 16 + (uint64_t)wg * 4 + 4;
    vk_op_spec(&op, v4 && VK_KNOB(v, pf_norm, 1) == 2 &&
                            smem <= v->props.limits.maxComputeSharedMemorySize
                        ? 1u
                        : 0u);
    vk_op_spec(&op, norm_dn(v, rows, reg));
    llmem_status st = vk_op_run(v, &op, (uint64_t)(rows * n_groups) * ns);
    if (st == LLMEM_OK && split)
        vk_presplit_set(v, out, (uint32_t)rows, (uint32_t)cols, split == 1);
    return st;
}

/* ---- log_softmax, argmax --------------------------------------------------------------------- */

llmem_status vk_op_log_softmax(llmem_backend *be, llmem_ct *x, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t rows = rows_of(x);
    vk_op op;
    vk_op_init(&op, v->subgroup ? VK_SH_LOG_SOFTMAX_SG : VK_SH_LOG_SOFTMAX, ROW_WG);
    uint32_t xo = vk_op_tensor(v, &op, x, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    vk_op_u32(&op, (uint32_t)rows);
    vk_op_u32(&op, (uint32_t)cols_of(x));
    vk_op_u32(&op, xo);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, (uint64_t)rows);
}

/* argmax.comp, one workgroup per row: ARGMAX_WG invocations (256 where the
 * device allows fewer; $LLMEM_VULKAN_ARGMAX_WG 64 .. 1024, a power of two,
 * overrides), vec4 loads where the rows are 16-byte aligned
 * ($LLMEM_VULKAN_ARGMAX_VEC=0: scalar loads, the old kernel, for
 * comparison). At batch 1 one workgroup reads the whole 128K-entry row of
 * logits, so its loads in flight set the time. */
#define ARGMAX_WG 1024

llmem_status vk_op_argmax(llmem_backend *be, llmem_ct *x, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    int64_t rows = rows_of(x), cols = cols_of(x);
    uint32_t wg = (uint32_t)VK_KNOB(v, argmax_wg, ARGMAX_WG);
    if (wg > v->props.limits.maxComputeWorkGroupInvocations)
        wg = ROW_WG;
    bool vec_ok = v->knobs.argmax_vec != '0';
    vk_op op;
    vk_op_init(&op, VK_SH_ARGMAX, wg);
    uint32_t xo = vk_op_tensor(v, &op, x, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    uint32_t xv = vk_op_tensor(v, &op, x, false); /* the same bytes, read as vec4 */
    bool vec = vec_ok && xo % 4 == 0 && xv == xo && cols % 4 == 0;
    vk_op_spec(&op, vec);
    /* one long row: split over workgroups, the last one reduces (vk_ops_sample.c) */
    uint32_t split = vec && rows == 1 ? vk_argmax_split(be, v, (uint64_t)cols) : 0;
    if (split > 1) {
        op.spec[0] = VK_KNOB(v, argmax_wg, 0) > 0 ? wg : ARGMAX_SPLIT_WG;
        vk_op_spec(&op, split);
        vk_op_buffer(v, &op, v->argmax_part, true);
    }
    vk_op_u32(&op, (uint32_t)rows);
    vk_op_u32(&op, (uint32_t)cols);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, split > 1 ? split : (uint64_t)rows);
}

/* ---- copies ----------------------------------------------------------------------------------- */

llmem_status vk_op_copy(llmem_backend *be, llmem_ct *src, int32_t col0, llmem_ct *dst)
{
    vk_backend *v = vk_from(be);
    bool taken;
    llmem_status st = vk_sum_take_copy(v, src, col0, dst, &taken);
    if (st != LLMEM_OK || taken) /* the held sum of src writes dst too */
        return st;
    int64_t rows = rows_of(dst), cols = cols_of(dst), n = rows * cols;
    vk_op op;
    vk_op_init(&op, VK_SH_COPY, EW_WG);
    vk_op_spec(&op, (uint32_t)src->dtype);
    vk_op_spec(&op, (uint32_t)dst->dtype);
    uint32_t so = vk_op_tensor(v, &op, src, false);
    uint32_t d0 = vk_op_tensor(v, &op, dst, true);
    /* f32: one unit per element; 16-bit: one per destination word */
    uint64_t units = dst->dtype == LLMEM_DTYPE_F32
                         ? (uint64_t)n
                         : (((uint64_t)d0 + (uint64_t)n - 1) >> 1) - (d0 >> 1) + 1;
    vk_op_u32(&op, (uint32_t)rows);
    vk_op_u32(&op, (uint32_t)cols);
    vk_op_u32(&op, (uint32_t)cols_of(src));
    vk_op_u32(&op, (uint32_t)col0);
    vk_op_u32(&op, so);
    vk_op_u32(&op, d0);
    vk_op_u32(&op, (uint32_t)units);
    return vk_op_run(v, &op, vk_div_up(units, EW_WG));
}

/* ---- the table ----------------------------------------------------------------------------------- */

const struct llmem_ops_i vk_ops = {
    .struct_size = sizeof(struct llmem_ops_i),
    .matmul = vk_op_matmul,
    .matmul_fast = vk_op_matmul_fast,
    .get_rows = vk_op_get_rows,
    .add = vk_op_add,
    .mul = vk_op_mul,
    .scale = vk_op_scale,
    .silu = vk_op_silu,
    .relu2 = vk_op_relu2,
    .softplus = vk_op_softplus,
    .swiglu = vk_op_swiglu,
    .rms_norm = vk_op_rms_norm,
    .add_rms_norm = vk_op_add_rms_norm,
    .rms_norm_gated = vk_op_rms_norm_gated,
    .rope = vk_op_rope,
    .rope_shift = vk_op_rope_shift,
    .kv_store = vk_op_kv_store,
    .attention_paged = vk_op_attention_paged,
    .ssm_conv = vk_op_ssm_conv,
    .ssm_scan = vk_op_ssm_scan,
    .copy = vk_op_copy,
    .log_softmax = vk_op_log_softmax,
    .argmax = vk_op_argmax,
    .sample = vk_op_sample,
    .logprob_gather = vk_op_logprob_gather,
    .top_logprobs = vk_op_top_logprobs,
    .matmul_swiglu = vk_op_matmul_swiglu,
    .geglu = vk_op_geglu,
    .softcap = vk_op_softcap,
};

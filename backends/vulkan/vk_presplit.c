/* llmem Vulkan backend: activations split by the op that makes them
 * (issue 12, the batched decode step).
 *
 * matmul_cm.comp reads its activations a [m, k] (f32) as f16 terms, per
 * row r: 2^e_r (hi + lo) (cm_split.comp). At 16-64 rows that split was a
 * dispatch of its own before each of a decode step's 167 tensor-core
 * products (9B Bamba shape; 13.8 us a call profiled at 64 rows, for about
 * 1 MB moved; taking it off: 9B precise tg128 b64 24.45 -> 23.90 ms on the
 * H200, and -0.39 more with the SwiGLU's, docs/benchmarks.md "The batched
 * decode step"). But the op that made a is already a row-wise pass with the
 * row in registers: an RMS norm, the gated norm, the SwiGLU (llmem_op_swiglu
 * and matmul_swiglu's, vk_swiglu_split: cm_split.comp's SWIGLU pass). With
 * $LLMEM_VULKAN_PRESPLIT (default 1) such an op, when
 * its output is decode-sized (vk_presplit_want), also writes the terms of
 * that output, computed exactly as cm_split.comp does from the same f32
 * values (so the products are bit for bit those of the split pass), into
 * one backend-owned buffer, and remembers which device range they are of;
 * cm_split_run (vk_ops_matmul.c) then takes them (vk_presplit_take) instead
 * of recording cm_split.comp. The terms start at the buffer's first byte,
 * but for the SwiGLU that folds its inputs' split-K sums (vk_sum.h): it
 * reads the exponents the norm wrote there while it writes, so its terms
 * go past them (vk_presplit_target_at, presplit.off, which the products
 * taking them read). One entry is kept: each producer's output is
 * read by the next products (q, k, v; gate and up; in_proj; out_proj;
 * down; the LM head) before the next producer runs. Prefill-sized outputs
 * too (up to $LLMEM_VULKAN_PRESPLIT_ROWS rows, default 512, the pp512
 * ubatch; 64 keeps the decode rows only): matmul_cmp.comp reads the same
 * terms (9B pp512 b1 precise on the H200 95.65 -> 95.21 ms, greedy output
 * unchanged; docs/benchmarks.md, "Vulkan prefill: the sum and the split
 * around each product").
 *
 * Validity. The entry is dropped when any write tracked by vk_cmd_track
 * overlaps the range it is of (every device write of this backend is
 * tracked: dispatches, uploads, copies, fills), when a recorded step is
 * queued (its writes are not tracked on the host), when a recording starts
 * or ends, and at each submit. The terms buffer is never reallocated, so a
 * recorded step that reads it stays valid for the backend's life; the
 * hazard tracker orders a producer's writes of it after the earlier
 * products' reads.
 */
#include <stdlib.h>

#include "vk_internal.h"
#include "vk_presplit.h"
#include "vk_sum.h"

/* $LLMEM_VULKAN_PRESPLIT: 0 off (every product splits its own
 * activations), 1 (default) on where the device has cooperative matrices,
 * 2 the producers write terms even without them (nobody reads them then:
 * for testing the producers' shaders on lavapipe) */
static uint32_t presplit_mode(void)
{
    const char *e = getenv("LLMEM_VULKAN_PRESPLIT");
    int x = e ? atoi(e) : 1;
    return x >= 0 && x <= 2 ? (uint32_t)x : 1u;
}

/* The device range of tensor t (bytes [*begin, *end) of *vb); false when t
 * crosses a chunk of its buffer. */
static bool tensor_range(llmem_ct *t, VkBuffer *vb, VkDeviceSize *begin, VkDeviceSize *end)
{
    size_t bytes = llmem_tensor_nbytes(t);
    vk_buffer *b = vk_buf(t->buf);
    uint32_t ci = (uint32_t)(t->offset / b->chunk);
    VkDeviceSize local = t->offset - (VkDeviceSize)ci * b->chunk;
    if (bytes == 0 || local + bytes > b->chunk)
        return false;
    const vk_alloc *a = vk_chunk(b, ci);
    *vb = vk_alloc_buffer(a);
    *begin = a->offset + local;
    *end = *begin + bytes;
    return true;
}

void vk_kept_set(vk_kept_range *k, llmem_ct *t)
{
    k->valid = tensor_range(t, &k->vb, &k->begin, &k->end);
}

bool vk_kept_is(const vk_kept_range *k, llmem_ct *t)
{
    VkBuffer vb;
    VkDeviceSize begin, end;
    return k->valid && tensor_range(t, &vb, &begin, &end) && vb == k->vb && begin == k->begin &&
           end == k->end;
}

void vk_kept_written(vk_kept_range *k, const vk_access *acc, uint32_t n)
{
    for (uint32_t i = 0; i < n && k->valid; i++)
        if (acc[i].write && acc[i].buf == k->vb && acc[i].begin < k->end && k->begin < acc[i].end)
            k->valid = false;
}

bool vk_presplit_want(const vk_backend *v, int64_t rows, int64_t cols)
{
    return v->mm.presplit && (v->mm.coopmat || v->mm.presplit == 2) && !v->presplit.failed && rows > VK_MM_MV_MAX &&
           rows >= v->mm.cm_min && rows <= v->presplit.rows_max && cols >= 8 && cols % 8 == 0 &&
           vk_presplit_bytes((uint32_t)rows, (uint32_t)cols) <= v->presplit.bytes;
}

size_t vk_presplit_bytes(uint32_t m, uint32_t k)
{
    return (size_t)4 * m * k + (size_t)4 * m;
}

llmem_status vk_presplit_target(llmem_backend *be, vk_backend *v, uint32_t m, uint32_t k,
                                llmem_tensor *terms)
{
    return vk_presplit_target_at(be, v, m, k, 0, terms);
}

llmem_status vk_presplit_target_at(llmem_backend *be, vk_backend *v, uint32_t m, uint32_t k,
                                   size_t from, llmem_tensor *terms)
{
    size_t off = (from + 255) / 256 * 256;
    if (off > v->presplit.bytes || vk_presplit_bytes(m, k) > v->presplit.bytes - off)
        return LLMEM_E_UNSUPPORTED;
    if (!v->presplit.terms) {
        llmem_buffer *b = NULL;
        llmem_status st = vk_buffer_alloc(be, v->presplit.bytes, &b);
        if (st != LLMEM_OK) {
            v->presplit.failed = true;
            return st;
        }
        b->size = v->presplit.bytes;
        v->presplit.terms = b;
    }
    *terms = llmem_tensor_1d(v->presplit.terms, off, LLMEM_DTYPE_F32,
                             (int64_t)(vk_presplit_bytes(m, k) / 4));
    return LLMEM_OK;
}

void vk_presplit_set(vk_backend *v, llmem_ct *out, uint32_t m, uint32_t k, bool lo)
{
    vk_presplit_set_at(v, out, m, k, 0, lo);
}

void vk_presplit_set_at(vk_backend *v, llmem_ct *out, uint32_t m, uint32_t k, size_t off,
                        bool lo)
{
    vk_presplit *p = &v->presplit;
    vk_kept_set(&p->src, out);
    p->m = m;
    p->k = k;
    p->off = off;
    p->lo = lo;
}

bool vk_presplit_take(vk_backend *v, llmem_ct *a, uint32_t m, uint32_t k, uint32_t split)
{
    vk_presplit *p = &v->presplit;
    p->want_lo = split != 1;
    return v->mm.presplit && v->mm.coopmat && a->dtype == LLMEM_DTYPE_F32 && p->m == m &&
           p->k == k && (split == 1 || p->lo) && vk_kept_is(&p->src, a);
}

bool vk_presplit_lo(const vk_backend *v, int64_t rows)
{
    if (!(vk_dec_norm_mode(v) & VK_DEC_NORM_HI) || rows > (int64_t)VK_PRESPLIT_ROWS)
        return true;
    /* $LLMEM_VULKAN_PRESPLIT=2 without cooperative matrices: no product
     * reads the terms, hi alone is written for testing the shaders */
    return v->mm.coopmat ? v->presplit.want_lo : v->mm.presplit != 2;
}

void vk_presplit_drop(vk_backend *v)
{
    v->presplit.src.valid = false;
    vk_resid_drop(v); /* the residual's copy (vk_sum.c) follows the same rules */
}

void vk_presplit_written(vk_backend *v, const vk_access *acc, uint32_t n)
{
    vk_kept_written(&v->presplit.src, acc, n);
    vk_resid_written(v, acc, n);
}

void vk_presplit_config(vk_backend *v)
{
    v->mm.presplit = presplit_mode();
    v->presplit.want_lo = true; /* until a product says otherwise */
    /* $LLMEM_VULKAN_PRESPLIT_ROWS: producers of up to this many rows write
     * terms (default VK_PRESPLIT_ROWS_DEFAULT; 64 = VK_PRESPLIT_ROWS: the
     * decode rows only; VK_PRESPLIT_ROWS_PF: the pp512 ubatch); above 64, prefill products (matmul_cmp.comp) read them
     * too, and the terms buffer is VK_PRESPLIT_BYTES_PF */
    const char *e = getenv("LLMEM_VULKAN_PRESPLIT_ROWS");
    long r = e ? atol(e) : (long)VK_PRESPLIT_ROWS_DEFAULT;
    v->presplit.rows_max = r >= 1 && r <= 65536 ? (uint32_t)r : VK_PRESPLIT_ROWS_DEFAULT;
    v->presplit.bytes = v->presplit.rows_max > VK_PRESPLIT_ROWS ? VK_PRESPLIT_BYTES_PF
                                                                : VK_PRESPLIT_BYTES;
}

void vk_presplit_finish(llmem_backend *be, vk_backend *v)
{
    if (v->presplit.terms)
        vk_buffer_free(be, v->presplit.terms);
    v->presplit.terms = NULL;
    v->presplit.src.valid = false;
}

/* ---- the SwiGLU split (issue 12) --------------------------------------------------------------- */

/* Most slices of a folded product whose sum cm_split.comp unrolls (GS, US). */
#define FOLD_SLICES_UNROLLED 8u
/* cm_split.comp FOLD's runs of 4 an invocation of 1024 (*wg set) for a
 * row of k: the row in registers in each workgroup, up to 4 runs (16384
 * elements); 0 (*wg unchanged) where longer or the device's workgroups
 * are smaller. */
static uint32_t fold_v4(const vk_backend *v, uint32_t k, uint32_t *wg)
{
    uint32_t runs = (k / 4 + 1023) / 1024;
    if (runs > 4 || 1024 > v->props.limits.maxComputeWorkGroupInvocations ||
        1024 > v->props.limits.maxComputeWorkGroupSize[0])
        return 0;
    *wg = 1024;
    return runs;
}

/* The byte of the presplit buffer past s's exponents where they lie in
 * it (borrowed from a norm's terms), else 0. */
static size_t te_end(const vk_backend *v, const vk_cm_sum *s)
{
    return s->te.buf == v->presplit.terms ? s->te.offset + (size_t)4 * s->m : 0;
}

/* Whether out starts where t does (the SwiGLU in place on t). */
static bool same_start(llmem_ct *out, llmem_ct *t)
{
    return out->buf == t->buf && out->offset == t->offset;
}

/* Whether the held pair can be read by cm_split.comp FOLD: raw tiles in
 * runs of 4 (pitch, slice stride multiples of 4 floats), out the gate's or
 * up's output or clear of both. */
static bool fold_fits(const vk_cm_sum *gs, const vk_cm_sum *us, llmem_ct *g, llmem_ct *u,
                      llmem_ct *out)
{
    return gs->ldp % 4 == 0 && gs->pslice % 4 == 0 && us->ldp % 4 == 0 && us->pslice % 4 == 0 &&
           gs->n == us->n && (same_start(out, g) || !vk_overlap(out, g)) &&
           (same_start(out, u) || !vk_overlap(out, u));
}

llmem_status vk_swiglu_split(llmem_backend *be, vk_backend *v, llmem_ct *g, llmem_ct *u,
                             llmem_ct *out, bool *done)
{
    *done = false;
    if (g->n_dims != 2 || u->n_dims != 2 || out->n_dims != 2)
        return LLMEM_OK;
    uint32_t m = (uint32_t)g->ne[0], k = (uint32_t)g->ne[1];
    if (!vk_presplit_want(v, m, k))
        return LLMEM_OK;
    /* the held sums of g and u folded in (vk_sum.h): the terms go past the
     * exponents those sums read from the presplit buffer */
    vk_cm_sum gs, us;
    bool fold = vk_sum_swiglu_ok(v, g, u, &gs, &us) && fold_fits(&gs, &us, g, u, out);
    size_t from = fold ? (te_end(v, &gs) > te_end(v, &us) ? te_end(v, &gs) : te_end(v, &us)) : 0;
    llmem_tensor t;
    if (fold && vk_presplit_target_at(be, v, m, k, from, &t) != LLMEM_OK)
        fold = false;
    if (!fold && vk_presplit_target(be, v, m, k, &t) != LLMEM_OK)
        return LLMEM_OK;
    bool wg_g = fold && !same_start(out, g);
    bool wg_u = fold && !same_start(out, u);
    /* several workgroups a row where out is clear of what they read (the
     * whole row of g and u, or of the folded tiles) */
    uint32_t ns = !fold && (vk_overlap(out, g) || vk_overlap(out, u))
                      ? 1u
                      : vk_row_split(v, m, k / 8, VK_SPLIT_PART_MIN);
    long mode = vk_sum_fold_mode(v);
    uint32_t wide = (vk_fold_wide_wgs(v->mm.n_sm) + m - 1) / m, most = k / 8 / VK_SPLIT_PART_MIN;
    wide = wide < most ? wide : most;
    if (fold && (mode & VK_FOLD_WIDE) && m <= VK_PRESPLIT_ROWS && ns < wide)
        ns = wide;
    /* prefill rows: the row in registers, 1024 invocations (vk_pf_split_v4);
     * the fold too, each of a row's workgroups (mode 2: the two reads) */
    uint32_t wg = vk_split_wg(v, m, k), v4 = ns == 1 ? vk_pf_split_v4(v, m, k, &wg) : 0u;
    if (fold && (mode & 3) == 1)
        v4 = fold_v4(v, k, &wg);
    bool lo = vk_presplit_lo(v, m);
    vk_op sp;
    vk_op_init(&sp, VK_SH_CM_SPLIT, wg);
    vk_op_spec(&sp, lo ? 2u : 1u); /* 1: hi alone (vk_presplit_lo) */
    vk_op_spec(&sp, 1); /* SWIGLU */
    vk_op_spec(&sp, ns);
    vk_op_spec(&sp, v4);
    vk_op_spec(&sp, fold ? 1u | (wg_g ? 2u : 0u) | (wg_u ? 4u : 0u) : 0u); /* FOLD */
    /* GS, US: the slices unrolled where few */
    vk_op_spec(&sp, fold && gs.slices <= FOLD_SLICES_UNROLLED ? gs.slices : 0u);
    vk_op_spec(&sp, fold && us.slices <= FOLD_SLICES_UNROLLED ? us.slices : 0u);
    uint32_t go = vk_op_tensor(v, &sp, fold ? &gs.pt : g, false);
    uint32_t so = vk_op_tensor(v, &sp, &t, true);
    uint32_t uo = vk_op_tensor(v, &sp, fold ? &us.pt : u, false);
    uint32_t oo = vk_op_tensor(v, &sp, out, true);
    uint32_t ge = 0, ue = 0, gw = 0, uw = 0;
    if (fold) {
        ge = vk_op_tensor(v, &sp, &gs.te, false);
        ue = vk_op_tensor(v, &sp, &us.te, false);
        if (wg_g)
            gw = vk_op_tensor(v, &sp, g, true);
        else
            vk_op_dummy(v, &sp);
        if (wg_u)
            uw = vk_op_tensor(v, &sp, u, true);
    }
    if (go % 4 != 0 || so % 4 != 0 || uo % 4 != 0 || oo % 4 != 0 || gw % 4 != 0 || uw % 4 != 0) {
        vk_op_run(v, &sp, 0); /* gives temporaries back */
        return LLMEM_OK;      /* (a held pair is recorded by the element-wise swiglu) */
    }
    size_t mk = (size_t)m * k;
    vk_op_u32(&sp, m);
    vk_op_u32(&sp, k);
    vk_op_u32(&sp, go / 4);
    vk_op_u32(&sp, so);
    vk_op_u32(&sp, (uint32_t)(so + mk / 2));
    vk_op_u32(&sp, (uint32_t)(so + mk));
    vk_op_u32(&sp, uo / 4);
    vk_op_u32(&sp, oo / 4);
    if (fold) {
        vk_op_u32(&sp, gs.ldp / 4);
        vk_op_u32(&sp, gs.slices);
        vk_op_u32(&sp, gs.pslice / 4);
        vk_op_u32(&sp, ge);
        vk_op_u32(&sp, us.ldp / 4);
        vk_op_u32(&sp, us.slices);
        vk_op_u32(&sp, us.pslice / 4);
        vk_op_u32(&sp, ue);
        vk_op_u32(&sp, gw / 4);
        vk_op_u32(&sp, uw / 4);
        v->sum_pending = false; /* taken: recording the fold must not record the passes */
    }
    llmem_status st = vk_op_run(v, &sp, (uint64_t)m * ns);
    if (fold)
        vk_sum_taken(v); /* the hold's buffers, freed with the work recorded */
    if (st == LLMEM_OK) {
        vk_presplit_set_at(v, out, m, k, t.offset, lo);
        *done = true;
    }
    return st;
}

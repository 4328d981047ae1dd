/* llmem Vulkan backend: matmul, out[M, N] = a[M, K] · w[N, K]ᵀ with f32
 * accumulation (a linear layer; w f32, f16 or bf16).
 *
 * vk_mm_pick (vk_mm_pick.c) chooses the shader. Few activation rows
 * (decode, M <= VK_MM_MV_MAX) use shaders/matvec.comp: one workgroup per
 * weight row, the weight read once and coalesced, which is what bounds
 * decode; f16/bf16 weights up to VK_MM_MV16_MAX rows use matvec16.comp
 * (vk_ops_matvec16.c). Above
 * (prefill too, up to VK_MM_CM_MAX rows), f16/bf16 weights run on tensor
 * cores where the device has cooperative matrices (cm_split.comp +
 * matmul_cm.comp, below); otherwise the register-tiled matmul_rt.comp
 * (16-byte loads, split-K when the output tiles alone would leave SMs
 * idle), and shapes it cannot take (K not a multiple of 8, unaligned rows)
 * the plain shared-memory tiling of shaders/matmul.comp.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"
#include "vk_presplit.h"
#include "vk_sum.h"

#define MV_MAX VK_MM_MV_MAX
#define MV_WG 128
#define MM_BM 64
#define MM_BN 64
#define MM_BK 16
#define MM_TM 4
#define MM_TN 4
#define RT_WG 256
#define RT_BN 128
#define RT_BK 16
#define SPLIT_WG 256 /* cm_split.comp: one workgroup per row ($LLMEM_VULKAN_SPLIT_WG) */
#define SUM_WG 256

/* out = a · wᵀ through matmul_rt.comp when it applies (K % 8 == 0,
 * 16-byte aligned rows and offsets); *done says whether it did. Output
 * tiles of BM x 128 (BM 64 up to 64 rows, else 128); when they number
 * fewer than VK_MM_GROUPS_SM an SM, K is split (vk_mm_split_k) into slices of at
 * least VK_MM_MIN_SLICE whose partial outputs go to a scratch buffer and
 * are summed in slice order by sum_slices.comp. */
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
    uint32_t slices, k_split;
    vk_mm_split_k(tiles_mn, k, RT_BK, v->mm.n_sm, &slices, &k_split);
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

/* cm_split.comp's workgroup for m rows of k elements:
 * $LLMEM_VULKAN_SPLIT_WG when set, else 1024 at up to VK_PRESPLIT_ROWS
 * rows from 2048 elements (a decode split is 9-64 workgroups: more loads
 * in flight a row; H200, 9B b64 22.90 -> 22.76 ms, 2b 11.06 -> 10.97,
 * docs/benchmarks.md "The batched decode step"), else SPLIT_WG (prefill:
 * not measured wider). */
uint32_t vk_split_wg(const vk_backend *v, uint32_t m, uint32_t k)
{
    if (v->mm.split_wg)
        return v->mm.split_wg;
    return m <= VK_PRESPLIT_ROWS && k >= 2048 ? 1024u : SPLIT_WG;
}


/* The activations of matmul_cm.comp as cm_split.comp writes them: one
 * scratch buffer of hi [m, k] f16 (and lo, split 2) then e [m] i32. */
typedef struct cm_terms {
    llmem_buffer *buf;
    uint32_t m, k, split;
    size_t terms;  /* bytes of the f16 terms (hi, lo): where e starts */
    bool borrowed; /* buf is the backend's presplit buffer (vk_presplit.c), not ours */
    size_t base;   /* bytes into buf where hi starts (0 but for borrowed terms) */
} cm_terms;

static void cm_terms_free(llmem_backend *be, cm_terms *t)
{
    if (t->buf && !t->borrowed)
        vk_buffer_free(be, t->buf);
    t->buf = NULL;
}

/* a[m, k] (f32) split by cm_split.comp into t->buf (allocated here; the
 * caller frees it with cm_terms_free once the products are recorded), or,
 * when the op that made a wrote its terms (vk_presplit_take), those: no
 * dispatch (their lo terms are there too; split 1 reads hi only).
 * *done: false (and t->buf NULL) when a's offset is not 16-byte aligned.
 * LLMEM_E_NO_MEMORY when the scratch cannot be allocated. */
static llmem_status cm_split_run(llmem_backend *be, vk_backend *v, llmem_ct *a, uint32_t split,
                                 cm_terms *t, bool *done)
{
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1];
    *done = false;
    llmem_status st = vk_sum_flush_if(v, a); /* a held sum that writes a goes first */
    if (st != LLMEM_OK)
        return st;
    if (vk_presplit_take(v, a, m, k, split)) {
        *t = (cm_terms){v->presplit.terms, m, k, split, (size_t)4 * m * k, true, v->presplit.off};
        *done = true;
        return LLMEM_OK;
    }
    *t = (cm_terms){NULL, m, k, split, (size_t)split * m * k * 2, false, 0};
    st = vk_buffer_alloc(be, t->terms + (size_t)m * 4, &t->buf);
    if (st != LLMEM_OK) {
        t->buf = NULL;
        return st;
    }
    t->buf->size = t->terms + (size_t)m * 4;
    llmem_tensor tall = llmem_tensor_1d(t->buf, 0, LLMEM_DTYPE_F32, (int64_t)(t->terms / 4 + m));
    vk_op sp;
    uint32_t ns = vk_row_split(v, m, k / 8, VK_SPLIT_PART_MIN);
    vk_op_init(&sp, VK_SH_CM_SPLIT, vk_split_wg(v, m, k));
    vk_op_spec(&sp, split);
    vk_op_spec(&sp, 0); /* SWIGLU */
    vk_op_spec(&sp, ns);
    uint32_t ao = vk_op_tensor(v, &sp, a, false);
    uint32_t so = vk_op_tensor(v, &sp, &tall, true);
    if (ao % 4 != 0 || so % 4 != 0) {
        vk_op_run(v, &sp, 0); /* gives temporaries back */
        vk_buffer_free(be, t->buf);
        t->buf = NULL;
        return LLMEM_OK; /* not done: the next path */
    }
    vk_op_u32(&sp, m);
    vk_op_u32(&sp, k);
    vk_op_u32(&sp, ao / 4);
    vk_op_u32(&sp, so);
    vk_op_u32(&sp, (uint32_t)(so + (size_t)m * k / 2));
    vk_op_u32(&sp, (uint32_t)(so + t->terms / 4));
    vk_op_u32(&sp, 0); /* u_off, o_off: SWIGLU only */
    vk_op_u32(&sp, 0);
    st = vk_op_run(v, &sp, (uint64_t)m * ns);
    if (st != LLMEM_OK) {
        vk_buffer_free(be, t->buf);
        t->buf = NULL;
        return st;
    }
    *done = true;
    return LLMEM_OK;
}

/* The first of `tiles` arrival counters of VK_CM_RAW_FUSED; 0 for tiles
 * 0 (one slice: no counters needed). Makes and zeroes the backend's
 * counter buffer on the first call, whatever tiles is, so that the first
 * (eager) prefill makes it before a decode step is recorded (made inside
 * a recording, its zeroing would be replayed with the step: redundant,
 * not wrong, as the counters are zero between dispatches anyway).
 * UINT32_MAX when the call cannot have counters: more tiles than
 * VK_CM_CTR_SLOTS, or no memory for the buffer. */
static uint32_t cm_ctr_first(llmem_backend *be, vk_backend *v, uint64_t tiles)
{
    if (!v->cm_ctr) {
        llmem_buffer *b = NULL;
        if (vk_buffer_alloc(be, VK_CM_CTR_SLOTS * 4, &b) == LLMEM_OK) {
            b->size = VK_CM_CTR_SLOTS * 4;
            if (vk_buffer_fill(be, b, 0, b->size, 0) == LLMEM_OK)
                v->cm_ctr = b;
            else
                vk_buffer_free(be, b);
        }
    }
    if (tiles == 0)
        return 0;
    if (!v->cm_ctr)
        return UINT32_MAX;
    return vk_cm_ctr_take(&v->cm_ctr_next, tiles, VK_CM_CTR_SLOTS);
}

/* Whether matmul_cm.comp may run the layout cfg (WG, SGM, FN, BK, SETS of
 * vk_cm_plan_mid): more than one register set only with raw tiles
 * (RAW_ALL, RAW_FUSED), and a workgroup the device takes (Vulkan
 * guarantees only 128 invocations). */
static bool layout_runs(const vk_backend *v, const uint32_t cfg[5])
{
    return (cfg[4] == 1 || v->mm.cm_raw >= VK_CM_RAW_ALL) &&
           cfg[0] <= v->props.limits.maxComputeWorkGroupInvocations &&
           cfg[0] <= v->props.limits.maxComputeWorkGroupSize[0];
}

/* out = a · wᵀ on tensor cores from the terms of a (cm_split_run):
 * above 64 rows matmul_cm2.comp (CM_ALLOW_CM2 and vk_cm2_used; blocking
 * of vk_cm2_plan_make; when the partial buffer's offset is not 16-byte
 * aligned, matmul_cmp.comp instead; otherwise as matmul_cmp) or
 * matmul_cmp.comp (CM_ALLOW_CMP in allow and vk_cmp_used;
 * blocking of vk_cmp_plan_make, or of vk_cmp_plan_cfg at
 * $LLMEM_VULKAN_CMP_CFG, then K split by vk_cmp_plan_tailcol (the last
 * column tiles alone, vk_mm_caps.cmp_tailcol) or else by vk_cmp_plan_tail where
 * vk_cmp_tail_used; raw tiles + sum_slices_cm.comp; when its
 * partial buffer cannot be had, matmul_cm.comp as below); at 9-64 rows
 * matmul_dec.comp (CM_ALLOW_DEC and dec_plan; raw tiles +
 * sum_slices_cm.comp; without its partial buffer, matmul_cm.comp); else
 * matmul_cm.comp with the blocking of vk_cm_plan_mid (CM_ALLOW_MID and
 * vk_cm_mid_cfg: 33-64 rows by default; vk_cm_plan_narrow's layout for short
 * fast-mode products; with more than one register set
 * raw tiles only, and without its partial buffer the next plan) or of
 * vk_cm_plan_make, then, by the
 * epilogue (vk_cm_raw_used, $LLMEM_VULKAN_CM_RAW): sum_slices.comp when K
 * is split (scaled epilogue), sum_slices_cm.comp (raw tiles to a padded
 * partial buffer, slices added and rows scaled there), or nothing
 * (VK_CM_RAW_FUSED where K is split: the last slice of each tile sums in
 * matmul_cm.comp). With later non-NULL that pass is not recorded but
 * described in *later (caller-owned; it records it with vk_cm_sum_run once
 * it has recorded other independent work, which may then run beside this
 * product); tm->buf must stay allocated until then. *done says whether it
 * ran; it does not when w's offset is not 16-byte aligned (the caller
 * falls through to matmul_rt). CM_PAIR in allow: the second product of a
 * pair (vk_sum_park), whose matmul_cmp.comp plan splits K by
 * vk_cmp_plan_pair after the last matmul_cmp product (v->cmp_last) where
 * vk_mm_caps.cmp_pair. LLMEM_E_NO_MEMORY: no partial buffer. */
/* CM_PAIR_PLAN: one of the SwiGLU's pair planned into half the wave (vk_pair_plan) */
enum { CM_ALLOW_CMP = 1, CM_ALLOW_DEC = 2, CM_ALLOW_CM2 = 4, CM_ALLOW_MID = 8, CM_PAIR = 16,
       CM_PAIR_PLAN = 32 };

/* matmul_dec.comp's plan for an [m, k] x [n, k] product with `split`
 * terms (vk_dec_plan_make at $LLMEM_VULKAN_DEC_CFG or the default
 * blocking, its row tiles at $LLMEM_VULKAN_DEC_ROWS where set); false
 * where it does not apply. */
static bool dec_plan(const vk_backend *v, uint32_t m, uint32_t n, uint32_t k, uint32_t split,
                     vk_dec_plan *dp)
{
    vk_dec_cfg c;
    const uint32_t *d = v->mm.dec_cfg;
    if (v->mm.dec_cfg_set)
        c = (vk_dec_cfg){d[0], d[1], d[2], d[3], d[4], d[5], 0};
    else
        vk_dec_cfg_default(m, split, v->mm.n_sm, &c);
    c.rows = (uint32_t)VK_KNOB(v, dec_rows, c.rows);
    return vk_dec_used(&v->mm, m, split) && vk_dec_plan_make(m, n, k, split, &c, v->mm.smem, dp);
}

static llmem_status cm_product_as(llmem_backend *be, vk_backend *v, const cm_terms *tm, llmem_ct *w,
                                  llmem_ct *out, vk_cm_sum *later, int allow, bool *done)
{
    uint32_t m = tm->m, k = tm->k, n = (uint32_t)w->ne[0];
    *done = false;
    vk_cm_plan pl;
    /* matmul_cm2.comp, else matmul_cmp.comp: raw tiles only (their sum_slices_cm.comp pass
     * scales), the same interface (cmp stands for both below) */
    bool cm2 = (allow & CM_ALLOW_CMP) && (allow & CM_ALLOW_CM2) && vk_cm2_used(&v->mm, m) &&
               vk_cm2_plan_make(m, n, k, v->mm.cm2_wg, v->mm.cm2_bn, v->mm.cm2_bk,
                                v->mm.cm2_gran, v->mm.n_sm, &pl);
    bool cmp = cm2 || ((allow & CM_ALLOW_CMP) && vk_cmp_used(&v->mm, m) &&
                       (v->mm.cmp_cfg[0] != 0
                            ? vk_cmp_plan_cfg(m, n, k, v->mm.cmp_cfg, v->mm.smem,
                                              v->props.limits.maxComputeWorkGroupInvocations, &pl)
                            : vk_cmp_plan_make(m, n, k, v->mm.cmp == VK_CMP_KHR, v->mm.smem,
                                               v->mm.n_sm, &pl)));
    uint32_t cwave = !cmp || cm2                ? 0 /* the wave the plan split for */
                     : v->mm.cmp_cfg[0] != 0 ? v->mm.cmp_cfg[6]
                                             : vk_cmp_wave(v->mm.cmp == VK_CMP_KHR, v->mm.n_sm);
    /* the last column tiles alone split (not the second of a pair, whose plan follows the
     * first's idle SMs) */
    bool tailcol = cmp && !cm2 && !(allow & CM_PAIR) && v->mm.cmp_tailcol &&
                   vk_cmp_plan_tailcol(&pl, k, cwave, v->mm.cmp_tailcol);
    if (cmp && !cm2 && !tailcol && vk_cmp_tail_used(&v->mm, tm->split))
        vk_cmp_plan_tail(&pl, k, cwave);
    if (cmp && !cm2 && (allow & CM_PAIR) && v->mm.cmp_pair && v->cmp_last.m == m) {
        uint32_t wave = v->mm.cmp_cfg[0] != 0 ? v->mm.cmp_cfg[6]
                                              : vk_cmp_wave(v->mm.cmp == VK_CMP_KHR, v->mm.n_sm);
        vk_cmp_plan_pair(&pl, k, wave, v->cmp_last.tiles, v->cmp_last.slices);
    }
    /* matmul_dec.comp: raw tiles only as well */
    vk_dec_plan dp;
    bool dec = !cmp && (allow & CM_ALLOW_DEC) && dec_plan(v, m, n, k, tm->split, &dp);
    bool mid = false; /* vk_cm_plan_mid's plan, at mid_cfg */
    uint32_t mid_cfg[5] = {0, 0, 0, 0, 1};
    if (dec)
        pl = dp.cm;
    if (!cmp && !dec) {
        mid = (allow & CM_ALLOW_MID) && vk_cm_mid_cfg(&v->mm, m, tm->split, mid_cfg) &&
              layout_runs(v, mid_cfg) && vk_cm_plan_mid(m, n, k, tm->split, mid_cfg, v->mm.smem, &pl);
        if (!mid)
            vk_cm_plan_make_fn(m, n, k, v->mm.cm_bk, vk_cm_stages_for(v->mm.cm_stages, m),
                               v->mm.smem, v->mm.n_sm, v->mm.cm_fn, &pl);
        uint32_t wave = v->mm.cm_wave;
        uint64_t t0 = (uint64_t)pl.tiles_m * pl.tiles_n;
        if (v->mm.cm_wave_round && wave && t0 && t0 <= wave) /* round(wave / t0) slices */
            wave = (uint32_t)((wave + t0 / 2) / t0 * t0);
        vk_cm_plan_wave(&pl, k, wave);
        /* short fast-mode products: the narrow layout */
        uint32_t ncfg[5];
        vk_cm_plan np;
        if (mid && vk_cm_plan_narrow(&v->mm, m, n, k, tm->split, &pl, v->mm.smem, ncfg, &np) &&
            layout_runs(v, ncfg)) {
            pl = np;
            memcpy(mid_cfg, ncfg, sizeof ncfg);
        } else if (mid && (allow & CM_PAIR_PLAN)) {
            /* the wide tiles of one of the SwiGLU's two products: each in half the wave, so
             * that the pair, recorded with no barrier between, fills one wave of longer
             * workgroups instead of two of short ones */
            wave = v->mm.cm_wave / 2;
            if (v->mm.cm_wave_round && wave && t0 && t0 <= wave)
                wave = (uint32_t)((wave + t0 / 2) / t0 * t0);
            vk_cm_plan_wave(&pl, k, wave);
        }
    }
    size_t count = (size_t)m * n;
    uint64_t tiles = (uint64_t)pl.tiles_m * pl.tiles_n;
    bool raw = cmp || dec || vk_cm_raw_used(v->mm.cm_raw, &pl);
    uint32_t ldp = n, ldt = n;
    uint64_t pslice = count, tslice = count; /* floats per slice of the partial buffer */
    uint64_t pfloats = pl.slices * pslice;   /* ... and in all (vk_cm_raw_tail) */
    if (raw) {
        vk_cm_raw_layout(&pl, &ldp, &pslice);
        pfloats = vk_cm_raw_tail(&pl, &ldt, &tslice);
    }
    /* a plan that has only raw tiles (more than one register set: no epilogue matrices) */
    bool raw_only = cmp || dec || (mid && mid_cfg[4] > 1);
    if (raw && pfloats > UINT32_MAX) { /* the shaders index 32-bit */
        if (raw_only)
            return cm_product_as(be, v, tm, w, out, later, 0, done);
        raw = false;
        ldp = n;
        pslice = count;
        pfloats = pl.slices * pslice;
    }
    uint32_t ctr = UINT32_MAX; /* first counter: the fused sum */
    if (raw && !cmp && !dec && v->mm.cm_raw == VK_CM_RAW_FUSED) {
        /* (called at one slice too, so that the counters are made by the first prefill) */
        uint32_t c = cm_ctr_first(be, v, pl.slices > 1 ? tiles : 0);
        if (pl.slices > 1)
            ctr = c;
    }
    llmem_buffer *part = NULL;
    llmem_status st = LLMEM_OK;
    if (pl.slices > 1 || raw) {
        size_t bytes = (size_t)pfloats * 4;
        st = vk_buffer_alloc(be, bytes, &part);
        if (st == LLMEM_E_NO_MEMORY && raw_only) /* matmul_cm's plans, which may do without it */
            return cm_product_as(be, v, tm, w, out, later, 0, done);
        if (st == LLMEM_E_NO_MEMORY && raw && pl.slices == 1) {
            raw = false; /* one slice needs no partial buffer: the scaled epilogue */
            ldp = n;
            pslice = count;
            pfloats = count;
            st = LLMEM_OK;
        } else if (st != LLMEM_OK) {
            return st;
        } else {
            part->size = bytes;
        }
    }
    bool fused = raw && ctr != UINT32_MAX;
    vk_cm_sum sum = {VK_SUM_NONE, part,      {0}, {0}, *out, m, n, ldp, pl.slices, (uint32_t)pslice,
                     n,           pl.slices, ldp, (uint32_t)pslice};
    if (tailcol) { /* (raw: cmp) columns from the first split one add the slices, others 1 */
        sum.slices = 1;
        sum.tc0 = pl.head_tn * pl.bn;
        sum.tslices = pl.slices;
        sum.ldt = ldt;
        sum.tslice = (uint32_t)tslice;
    }
    sum.te = llmem_tensor_1d(tm->buf, tm->base + tm->terms, LLMEM_DTYPE_I32, m);
    sum.pt = part ? llmem_tensor_1d(part, 0, LLMEM_DTYPE_F32, (int64_t)pfloats) : *out;
    if (raw && !fused)
        sum.kind = VK_SUM_RAW;
    else if (part && !raw)
        sum.kind = VK_SUM_SCALED;
    llmem_tensor th = llmem_tensor_1d(tm->buf, tm->base, LLMEM_DTYPE_F32, (int64_t)(tm->terms / 4));
    vk_op mm;
    if (cm2)
        vk_op_init(&mm, VK_SH_MATMUL_CM2_KHR, 32 * pl.sgm * pl.sgn);
    else if (cmp)
        vk_op_init(&mm, v->mm.cmp == VK_CMP_KHR ? VK_SH_MATMUL_CMP_KHR : VK_SH_MATMUL_CMP,
                   32 * pl.sgm * pl.sgn);
    else if (dec) /* fast mode, bf16 weights: the bf16 module (vk_bf16_used), same interface */
        vk_op_init(&mm, v->mm.dec == VK_DEC_NV                                 ? VK_SH_MATMUL_DEC
                        : vk_bf16_used(&v->mm, m, tm->split, w->dtype, true) ? VK_SH_MATMUL_DEC_BF_KHR
                                                                              : VK_SH_MATMUL_DEC_KHR,
                   dp.wg);
    else
        vk_op_init(&mm, !vk_cm_khr_used(&v->mm, m)                            ? VK_SH_MATMUL_CM
                        : vk_bf16_used(&v->mm, m, tm->split, w->dtype, false) ? VK_SH_MATMUL_CM_BF_KHR
                                                                               : VK_SH_MATMUL_CM_KHR,
                   32 * pl.sgm * pl.sgn);
    vk_op_spec(&mm, (uint32_t)w->dtype);
    vk_op_spec(&mm, pl.sgm);
    vk_op_spec(&mm, pl.fm);
    vk_op_spec(&mm, pl.fn);
    vk_op_spec(&mm, tm->split);
    vk_op_spec(&mm, pl.bk);
    vk_op_spec(&mm, pl.stages);
    if (!cmp)
        vk_op_spec(&mm, fused ? 2 : raw);
    if (!cmp && !dec && !cm2)
        vk_op_spec(&mm, mid ? mid_cfg[4] : 1); /* matmul_cm's register sets */
    if (dec) {
        vk_op_spec(&mm, dp.ka);
        vk_op_spec(&mm, dp.apf);
        /* the L2 prefetch, PFD | PFL << 8 | PFS << 16 (a segment at most a row's step) */
        uint32_t seg = (uint32_t)VK_KNOB(v, dec_pf_seg,
                                         tm->split == 2 ? VK_DEC_PF_SEG_PRECISE : VK_DEC_PF_SEG);
        seg = seg < 2 * pl.bk ? seg : 2 * pl.bk;
        vk_op_spec(&mm, (uint32_t)VK_KNOB(v, dec_pf, VK_DEC_PF_DIST) |
                            (uint32_t)VK_KNOB(v, dec_pf_lag, VK_DEC_PF_LAG) << 8 | seg << 16);
    }
    uint32_t wo = vk_op_tensor(v, &mm, w, false);
    uint32_t ho = vk_op_tensor(v, &mm, &th, false);
    uint32_t oo = vk_op_tensor(v, &mm, &sum.pt, true);
    uint32_t eo = cmp ? 0 : vk_op_tensor(v, &mm, &sum.te, false); /* (matmul_cmp: the sum scales) */
    uint32_t fo = 0, co = 0;
    if (fused) {
        fo = vk_op_tensor(v, &mm, out, true);
        llmem_tensor tc =
            llmem_tensor_1d(v->cm_ctr, (size_t)ctr * 4, LLMEM_DTYPE_I32, (int64_t)tiles);
        co = vk_op_tensor(v, &mm, &tc, true);
    }
    /* (the fused sum reads the partial buffer as vec4s: oo is 0 for the
     * fresh 256-byte aligned allocation, so its check never fails in practice) */
    if (cm2 && oo % 4 != 0) { /* its tensor stores want a 16-byte aligned base: matmul_cmp */
        vk_op_run(v, &mm, 0);
        vk_cm_sum_run(be, v, &sum, false);
        return cm_product_as(be, v, tm, w, out, later, allow & ~CM_ALLOW_CM2, done);
    }
    if (wo % 8 != 0 || ho % 4 != 0 || (fused && oo % 4 != 0)) {
        vk_op_run(v, &mm, 0); /* gives temporaries back */
        vk_cm_sum_run(be, v, &sum, false);
        return LLMEM_OK; /* not done: the next path */
    }
    vk_op_u32(&mm, m);
    vk_op_u32(&mm, n);
    vk_op_u32(&mm, k);
    vk_op_u32(&mm, ho / 4);
    vk_op_u32(&mm, (uint32_t)((ho + (size_t)m * k / 2) / 4));
    vk_op_u32(&mm, wo / 8);
    vk_op_u32(&mm, oo);
    vk_op_u32(&mm, eo);
    vk_op_u32(&mm, pl.tiles_m);
    vk_op_u32(&mm, pl.tiles_m * pl.tiles_n);
    vk_op_u32(&mm, pl.k_split);
    vk_op_u32(&mm, (uint32_t)pslice);
    /* matmul_cmp.comp: the first `head` tiles in one slice, the rest in pl.slices */
    uint32_t head = tailcol ? pl.head_tn * pl.tiles_m : 0;
    uint64_t groups = head + (tiles - head) * pl.slices;
    vk_op_u32(&mm, (uint32_t)groups);
    vk_op_u32(&mm, ldp);
    vk_op_u32(&mm, fo);
    vk_op_u32(&mm, co);
    if (cmp && !cm2) { /* matmul_cmp.comp's tail words: head, ldt, tail_stride */
        vk_op_u32(&mm, head);
        vk_op_u32(&mm, ldt);
        vk_op_u32(&mm, (uint32_t)tslice);
    }
    st = vk_op_run(v, &mm, groups);
    /* (a tail-column plan's pieces are not the uniform ones vk_cmp_plan_pair models: no pair) */
    v->cmp_last = cmp && !cm2 && !tailcol && st == LLMEM_OK
                      ? (struct vk_cmp_last){m, pl.slices, (uint64_t)pl.tiles_m * pl.tiles_n}
                      : (struct vk_cmp_last){0, 0, 0};
    if (st == LLMEM_OK && later) {
        *later = sum; /* its pass and partial buffer go to the caller */
        *done = true;
        return LLMEM_OK;
    }
    llmem_status st2 = vk_cm_sum_run(be, v, &sum, st == LLMEM_OK);
    if (st == LLMEM_OK)
        st = st2;
    *done = st == LLMEM_OK;
    return st;
}

/* cm_product_as with matmul_cmp.comp allowed; pair: the second product
 * of a pair (CM_PAIR); plan: CM_PAIR_PLAN or 0. */
static llmem_status cm_product(llmem_backend *be, vk_backend *v, const cm_terms *tm, llmem_ct *w,
                               llmem_ct *out, vk_cm_sum *later, bool pair, int plan, bool *done)
{
    return cm_product_as(be, v, tm, w, out, later,
                         CM_ALLOW_CMP | CM_ALLOW_DEC | CM_ALLOW_CM2 | CM_ALLOW_MID |
                             (pair ? CM_PAIR : 0) | plan,
                         done);
}

/* out = a · wᵀ on tensor cores (vk_mm_pick said VK_MM_COOPMAT): the rows
 * of a as 2^e_r (hi + lo) f16 terms (split 2; split 1: hi only, the fast
 * mode) by cm_split_run, then cm_product. *done says whether it ran; it
 * does not when a's or w's offset is not 16-byte aligned (the caller
 * falls through to matmul_rt). */
static llmem_status matmul_cm(llmem_backend *be, vk_backend *v, llmem_ct *a, llmem_ct *w,
                              llmem_ct *out, uint32_t split, bool *done)
{
    cm_terms t;
    llmem_status st = cm_split_run(be, v, a, split, &t, done);
    if (st != LLMEM_OK || !*done)
        return st;
    /* the sum pass comes back (later) so that it may be held for the op
     * that reads out (vk_sum_hold, with the exponents' buffer when ours);
     * the previous product's held sum is set aside while this one records
     * where the two may pair for the SwiGLU (vk_sum_park) */
    vk_cm_sum sum = {.kind = VK_SUM_NONE};
    llmem_tensor tt = llmem_tensor_1d(t.buf, t.base, LLMEM_DTYPE_F32,
                                      (int64_t)(t.terms / 4 + t.m));
    llmem_ct *reads[] = {w, &tt};
    bool parked = vk_sum_park(v, t.m, out, reads, 2);
    struct vk_pair_w pw = {w->buf, w->offset, (uint32_t)w->ne[0], t.k};
    int plan = vk_pair_plan(v, &pw, t.m, split, parked) ? CM_PAIR_PLAN : 0;
    st = cm_product(be, v, &t, w, out, &sum, parked, plan, done);
    vk_sum_unpark(v, parked, st == LLMEM_OK && *done);
    if (st == LLMEM_OK && *done)
        vk_pair_learn(v, &pw, t.m, parked, plan != 0);
    if (st == LLMEM_OK && *done && vk_sum_hold(be, v, &sum, t.borrowed ? NULL : t.buf))
        t.buf = NULL; /* the hold frees it */
    else
        st = vk_cm_sum_run(be, v, &sum, st == LLMEM_OK);
    if (st != LLMEM_OK)
        *done = false;
    cm_terms_free(be, &t);
    return st;
}

llmem_status vk_op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1], n = (uint32_t)w->ne[0];
    vk_op op;
    bool done;
    llmem_status st = vk_matvec16(v, a, w, NULL, out, &done);
    if (done || st != LLMEM_OK)
        return st;
    if (m > MV_MAX && vk_mm_pick(&v->mm, m, k, w->dtype) == VK_MM_COOPMAT) {
        st = matmul_cm(be, v, a, w, out, 2, &done);
        if (done || st != LLMEM_OK)
            return st;
    }
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
    llmem_status st = vk_matvec16(v, a, gate, up, out, &done);
    if (done || st != LLMEM_OK)
        return st;
    /* Other shapes and dtypes: two matmuls into a temporary, then SwiGLU
     * (the temporary may be freed with the work recorded: see vk_buffer_free).
     * On tensor cores both products read one split of a (cm_split_run once:
     * $LLMEM_VULKAN_CM_SPLIT_ONCE), and their slice sums are recorded after
     * both products, so that nothing orders the two products (independent:
     * the hazard tracker puts no barrier between them); a product that
     * cannot take the split (w unaligned) goes the usual way. */
    size_t half = (size_t)a->ne[0] * (size_t)gate->ne[0] * 4;
    llmem_buffer *tmp = NULL;
    if ((st = vk_buffer_alloc(be, 2 * half, &tmp)) != LLMEM_OK)
        return st;
    tmp->size = 2 * half;
    llmem_tensor g = llmem_tensor_2d(tmp, 0, LLMEM_DTYPE_F32, a->ne[0], gate->ne[0]);
    llmem_tensor u = llmem_tensor_2d(tmp, half, LLMEM_DTYPE_F32, a->ne[0], gate->ne[0]);
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1];
    bool g_done = false, u_done = false;
    if (v->mm.cm_split_once && m > MV_MAX && gate->dtype == up->dtype &&
        vk_mm_pick(&v->mm, m, k, gate->dtype) == VK_MM_COOPMAT) {
        cm_terms t;
        st = cm_split_run(be, v, a, 2, &t, &done);
        if (st == LLMEM_OK && done) {
            vk_cm_sum sg = {.kind = VK_SUM_NONE}, su = {.kind = VK_SUM_NONE};
            st = cm_product(be, v, &t, gate, &g, &sg, false, 0, &g_done);
            if (st == LLMEM_OK)
                st = cm_product(be, v, &t, up, &u, &su, false, 0, &u_done);
            llmem_status s1 = vk_cm_sum_run(be, v, &sg, st == LLMEM_OK);
            llmem_status s2 = vk_cm_sum_run(be, v, &su, st == LLMEM_OK && s1 == LLMEM_OK);
            st = st != LLMEM_OK ? st : s1 != LLMEM_OK ? s1 : s2;
            cm_terms_free(be, &t);
        }
    }
    if (st == LLMEM_OK && !g_done)
        st = vk_op_matmul(be, a, gate, &g);
    if (st == LLMEM_OK && !u_done)
        st = vk_op_matmul(be, a, up, &u);
    if (st == LLMEM_OK) {
        bool split_done = false;
        st = vk_swiglu_split(be, v, &g, &u, out, &split_done);
        if (st == LLMEM_OK && !split_done)
            st = vk_op_swiglu(be, &g, &u, out);
    }
    vk_buffer_free(be, tmp);
    return st;
}

/* FAST mode (llmem_op_matmul_fast): where vk_mm_pick says VK_MM_COOPMAT,
 * the tensor-core product with one f16 term of a per element (2^e_r hi:
 * 11 significant bits, finer than the bf16 rounding the contract allows;
 * the per-row scale keeps every row inside f16's range); everything else
 * as vk_op_matmul, which the contract allows. Same shapes, dtypes and
 * statuses as vk_op_matmul; LLMEM_E_NO_MEMORY when the scratch of the
 * f16 terms cannot be allocated. */
llmem_status vk_op_matmul_fast(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    uint32_t m = (uint32_t)a->ne[0], k = (uint32_t)a->ne[1];
    if (vk_mm_pick(&v->mm, m, k, w->dtype) == VK_MM_COOPMAT) {
        bool done;
        llmem_status st = matmul_cm(be, v, a, w, out, 1, &done);
        if (done || st != LLMEM_OK)
            return st;
    }
    return vk_op_matmul(be, a, w, out);
}

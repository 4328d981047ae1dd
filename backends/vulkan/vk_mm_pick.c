/* llmem Vulkan backend: the matmul path and blocking choices
 * (vk_mm_pick.h). */
#include "vk_mm_pick.h"

vk_mm_path vk_mm_pick(const vk_mm_caps *c, uint32_t m, uint32_t k, llmem_dtype w_dt)
{
    bool w16 = w_dt == LLMEM_DTYPE_F16 || w_dt == LLMEM_DTYPE_BF16;
    if (w16 && k % 8 == 0 && m <= c->mv16_max && !c->matvec_old)
        return VK_MM_MATVEC16;
    /* tensor cores from cm_min rows, below VK_MM_MV_MAX too ($LLMEM_VULKAN_CM_MIN) */
    if (c->coopmat && w16 && k % 8 == 0 && m >= c->cm_min && m <= c->cm_max)
        return VK_MM_COOPMAT;
    if (m <= VK_MM_MV_MAX)
        return VK_MM_MATVEC;
    if (k % 8 == 0 && !c->matmul_old)
        return VK_MM_RT;
    return VK_MM_TILED;
}

static uint64_t div_up(uint64_t n, uint64_t d)
{
    return (n + d - 1) / d;
}

/* The compute units a plan sizes by: sms, or VK_SM_FALLBACK for 0. */
static uint32_t sm_or_fallback(uint32_t sms)
{
    return sms ? sms : VK_SM_FALLBACK;
}

uint32_t vk_sm_count(const vk_sm_info *q, const char **source)
{
    const char *from = "none";
    uint64_t n = 0;
    if (q->nv_sms) {
        n = q->nv_sms;
        from = "VK_NV_shader_sm_builtins";
    } else if (q->amd_active) {
        n = q->amd_active;
        from = "VK_AMD_shader_core_properties2";
    } else if (q->amd_engines && q->amd_arrays && q->amd_cus) {
        n = (uint64_t)q->amd_engines * q->amd_arrays * q->amd_cus;
        from = "VK_AMD_shader_core_properties";
    } else if (q->arm_cores) {
        n = q->arm_cores;
        from = "VK_ARM_shader_core_builtins";
    }
    if (source)
        *source = from;
    return (uint32_t)(n > VK_SM_MAX ? VK_SM_MAX : n);
}

uint32_t vk_sm_pick(int32_t knob, uint32_t device)
{
    if (knob >= 1 && knob <= VK_SM_MAX)
        return (uint32_t)knob;
    return device ? device : VK_SM_FALLBACK;
}

uint32_t vk_row_split_wgs(uint32_t sms)
{
    sms = sm_or_fallback(sms);
    return sms < VK_ROW_SPLIT_ROWS ? VK_ROW_SPLIT_ROWS : sms - sms % VK_ROW_SPLIT_ROWS;
}

uint32_t vk_scan_dec_wgs(uint32_t sms)
{
    return (uint32_t)div_up((uint64_t)VK_SCAN_DEC_WGS_REF * sm_or_fallback(sms), VK_SM_FALLBACK);
}

uint32_t vk_fold_wide_wgs(uint32_t sms)
{
    return (uint32_t)div_up((uint64_t)VK_FOLD_WIDE_WGS_REF * sm_or_fallback(sms), VK_SM_FALLBACK);
}

void vk_mm_split_k(uint64_t tiles, uint32_t k, uint32_t bk, uint32_t sms, uint32_t *slices,
                   uint32_t *k_split)
{
    uint64_t n = 1, groups = (uint64_t)VK_MM_GROUPS_SM * sm_or_fallback(sms);
    if (tiles < groups) {
        uint64_t most = k / VK_MM_MIN_SLICE;
        n = div_up(groups, tiles);
        n = n > most ? most : n;
        n = n < 1 ? 1 : n;
    }
    uint64_t ks = div_up(div_up(k, n), bk) * bk;
    if (ks == 0)
        ks = bk;
    *k_split = (uint32_t)ks;
    *slices = k == 0 ? 1 : (uint32_t)div_up(k, ks);
}

/* The K step of matmul_cm.comp's ring for a bm x bn tile: the widest
 * that small_bk allows whose two shared slices fit in smem bytes; 0 when
 * none does. */
static uint32_t ring_bk(uint32_t bm, uint32_t bn, uint32_t small_bk, uint32_t smem)
{
    if (small_bk != 32 && VK_CM_RING_SMEM(bm, bn, VK_CM_BK_SMALL) <= smem)
        return VK_CM_BK_SMALL;
    return VK_CM_RING_SMEM(bm, bn, 32u) <= smem ? 32 : 0;
}

void vk_cm_plan_make(uint32_t m, uint32_t n, uint32_t k, uint32_t small_bk, uint32_t stages,
                     uint32_t smem, uint32_t sms, vk_cm_plan *p)
{
    vk_cm_plan_make_fn(m, n, k, small_bk, stages, smem, sms, 1, p);
}

void vk_cm_plan_make_fn(uint32_t m, uint32_t n, uint32_t k, uint32_t small_bk, uint32_t stages,
                        uint32_t smem, uint32_t sms, uint32_t fn, vk_cm_plan *p)
{
    uint32_t sg = VK_CM_WG / 32;
    p->stages = 1;
    p->head_tn = 0;
    if (m <= 64) {
        p->sgm = 1;
        p->fm = m <= 16 ? 1 : (uint32_t)div_up(m, 16);
        p->fn = fn == 2 || fn == 4 ? fn : 1;
        p->bk = small_bk == 32 ? 32 : VK_CM_BK_SMALL;
        uint32_t bm = 16 * p->fm;
        while (p->fn > 1 && VK_CM_SMEM(bm, 16 * p->fn * sg, 32u) > smem)
            p->fn /= 2;
        if (p->fn > 1 && VK_CM_SMEM(bm, 16 * p->fn * sg, p->bk) > smem)
            p->bk = 32;
    } else {
        p->sgm = 2;
        p->fm = 4;
        p->fn = 2;
        p->bk = VK_CM_BK_BIG;
    }
    p->sgn = sg / p->sgm;
    p->bm = 16 * p->fm * p->sgm;
    p->bn = 16 * p->fn * p->sgn;
    uint32_t rbk = m <= 64 && stages >= 2 ? ring_bk(p->bm, p->bn, small_bk, smem) : 0;
    if (rbk) {
        p->stages = stages > VK_CM_STAGES_MAX ? VK_CM_STAGES_MAX : stages;
        p->bk = rbk;
    }
    p->tiles_m = (uint32_t)div_up(m, p->bm);
    p->tiles_n = (uint32_t)div_up(n, p->bn);
    uint64_t tiles = (uint64_t)p->tiles_m * p->tiles_n;
    if (m > 64 && tiles >= VK_CM_FULL_TILES(sm_or_fallback(sms))) {
        p->slices = 1;
        p->k_split = (uint32_t)(div_up(k ? k : 1, p->bk) * p->bk);
    } else {
        vk_mm_split_k(tiles, k, p->bk, sms, &p->slices, &p->k_split);
    }
}

bool vk_cm_plan_mid(uint32_t m, uint32_t n, uint32_t k, uint32_t split, const uint32_t cfg[5],
                    uint32_t smem, vk_cm_plan *p)
{
    uint32_t wg = cfg[0], sgm = cfg[1], fn = cfg[2], bk = cfg[3], sets = cfg[4];
    if (m < 17 || m > 64 || (split != 1 && split != 2) || sgm == 0 || wg < 64 || wg > 1024 || wg % (32 * sgm) != 0 ||
        (bk != 32 && bk != 64) || (fn != 1 && fn != 2 && fn != 4) || sets < 1 || sets > 3)
        return false;
    uint32_t sgn = wg / 32 / sgm, fm = (uint32_t)div_up(m, 16 * sgm);
    uint32_t bm = 16 * fm * sgm, bn = 16 * fn * sgn;
    uint64_t bytes = (uint64_t)(split * bm + bn) * (bk / 8 + 1) * 16 +
                     (sets == 1 ? (wg / 32) * 16 * 20 * 4 : 0) + 1024;
    if (bytes > smem)
        return false;
    *p = (vk_cm_plan){.sgm = sgm, .sgn = sgn, .fm = fm, .fn = fn, .bm = bm, .bn = bn, .bk = bk,
                      .stages = 1, .tiles_m = (uint32_t)div_up(m, bm),
                      .tiles_n = (uint32_t)div_up(n, bn), .slices = 1,
                      .k_split = (uint32_t)(div_up(k ? k : 1, bk) * bk)};
    return true;
}

bool vk_cm_mid_cfg(const vk_mm_caps *c, uint32_t m, uint32_t split, uint32_t cfg[5])
{
    static const uint32_t fast[5] = VK_CM_MID_FAST, precise[5] = VK_CM_MID_PRECISE;
    const uint32_t *src = split == 1 ? fast : precise;
    uint32_t from = VK_CM_MID_ROWS;
    if (c->cm_mid_set) {
        src = c->cm_mid;
        from = c->cm_mid_rows;
    }
    if (src[0] == 0 || m < from || m > 64)
        return false;
    for (int i = 0; i < 5; i++)
        cfg[i] = src[i];
    return true;
}

bool vk_cm_plan_narrow(const vk_mm_caps *c, uint32_t m, uint32_t n, uint32_t k, uint32_t split,
                       const vk_cm_plan *p, uint32_t smem, uint32_t cfg[5], vk_cm_plan *q)
{
    uint32_t def[7] = VK_CM_NARROW;
    def[6] = VK_CM_NARROW_WAVE_SM * sm_or_fallback(c->n_sm);
    const uint32_t *src = c->cm_narrow_set ? c->cm_narrow : def;
    if (split != 1 || c->cm_mid_set || src[0] == 0 || p->bk == 0 || p->k_split / p->bk >= src[5])
        return false;
    vk_cm_plan t;
    if (!vk_cm_plan_mid(m, n, k, split, src, smem, &t))
        return false;
    uint64_t tiles = (uint64_t)t.tiles_m * t.tiles_n;
    uint64_t wave = src[6] && tiles <= src[6] ? (src[6] + tiles / 2) / tiles * tiles : src[6];
    vk_cm_plan_wave(&t, k, (uint32_t)(wave < UINT32_MAX ? wave : UINT32_MAX));
    for (int i = 0; i < 5; i++)
        cfg[i] = src[i];
    *q = t;
    return true;
}

void vk_cm_plan_wave(vk_cm_plan *p, uint32_t k, uint32_t groups)
{
    uint64_t tiles = (uint64_t)p->tiles_m * p->tiles_n;
    if (groups == 0 || p->bm > 64 || tiles == 0)
        return;
    uint64_t n = groups / tiles, most = k / VK_MM_MIN_SLICE;
    n = n > most ? most : n;
    n = n < 1 ? 1 : n;
    uint64_t ks = div_up(div_up(k ? k : 1, n), p->bk) * p->bk;
    p->k_split = (uint32_t)ks;
    p->slices = k == 0 ? 1 : (uint32_t)div_up(k, ks);
}

uint32_t vk_cm_stages_for(uint32_t asked, uint32_t m)
{
    if (asked >= 1)
        return asked;
    return m <= VK_CM_STAGES_AUTO_ROWS ? VK_CM_STAGES_AUTO : 1;
}

bool vk_cm_raw_used(uint32_t raw, const vk_cm_plan *p)
{
    return raw == VK_CM_RAW_ALL || raw == VK_CM_RAW_FUSED ||
           (raw == VK_CM_RAW_SPLIT && p->slices > 1);
}

uint32_t vk_cm_ctr_take(uint32_t *next, uint64_t tiles, uint32_t slots)
{
    if (tiles == 0 || tiles > slots)
        return UINT32_MAX;
    uint32_t at = *next;
    if (at > slots || slots - at < tiles)
        at = 0;
    *next = at + (uint32_t)tiles;
    return at;
}

void vk_cm_raw_layout(const vk_cm_plan *p, uint32_t *ldp, uint64_t *slice_floats)
{
    *ldp = p->tiles_n * p->bn;
    *slice_floats = (uint64_t)p->tiles_m * p->bm * *ldp;
}

uint64_t vk_cm_raw_tail(const vk_cm_plan *p, uint32_t *ldt, uint64_t *tail_floats)
{
    uint32_t ldp;
    uint64_t slice;
    vk_cm_raw_layout(p, &ldp, &slice);
    bool head = p->head_tn > 0 && p->head_tn < p->tiles_n;
    *ldt = head ? (p->tiles_n - p->head_tn) * p->bn : ldp;
    *tail_floats = head ? (uint64_t)p->tiles_m * p->bm * *ldt : slice;
    uint32_t s = p->slices ? p->slices : 1;
    return slice + (s - 1) * *tail_floats;
}

bool vk_cm_usable(const vk_cm_shape *shapes, uint32_t n_shapes, uint32_t subgroup_size,
                  uint32_t shared_bytes)
{
    if (subgroup_size != 32 || shared_bytes < VK_CM_SHARED_BYTES)
        return false;
    for (uint32_t i = 0; i < n_shapes; i++)
        if (shapes[i].m == 16 && shapes[i].n == 16 && shapes[i].k == 16 && shapes[i].ab_f16 &&
            shapes[i].cd_f32 && shapes[i].subgroup_scope)
            return true;
    return false;
}

/* The tile grid of p (p->bm x p->bn tiles over m x n) and its split of
 * k: as many slices as fill one wave of `wave` workgroups, each at least
 * VK_MM_MIN_SLICE deep, slice depth a multiple of p->bk. */
static void wave_tiles(vk_cm_plan *p, uint32_t m, uint32_t n, uint32_t k, uint64_t wave)
{
    p->tiles_m = (uint32_t)div_up(m, p->bm);
    p->tiles_n = (uint32_t)div_up(n, p->bn);
    uint64_t tiles = (uint64_t)p->tiles_m * p->tiles_n;
    uint64_t s = tiles ? wave / tiles : 1;
    uint64_t most = k / VK_MM_MIN_SLICE;
    s = s > most ? most : s;
    s = s < 1 ? 1 : s;
    uint64_t ks = div_up(div_up(k ? k : 1, s), p->bk) * p->bk;
    p->k_split = (uint32_t)ks;
    p->slices = k == 0 ? 1 : (uint32_t)div_up(k, ks);
}

bool vk_cmp_used(const vk_mm_caps *c, uint32_t m)
{
    return c->coopmat && c->cmp != VK_CMP_OFF && m > VK_CMP_ROWS;
}

uint32_t vk_cmp_wave(bool khr, uint32_t sms)
{
    return (khr ? VK_CMP_WAVE_KHR_SM : VK_CMP_WAVE_NV_SM) * sm_or_fallback(sms);
}

bool vk_cmp_plan_make(uint32_t m, uint32_t n, uint32_t k, bool khr, uint32_t smem, uint32_t sms,
                      vk_cm_plan *p)
{
    *p = (vk_cm_plan){.sgm = 2, .sgn = khr ? 4 : 2, .fm = khr ? 4 : 2, .fn = 4, .bk = VK_CMP_BK,
                      .stages = 1};
    p->bm = 16 * p->fm * p->sgm;
    p->bn = 16 * p->fn * p->sgn;
    if (VK_CMP_SMEM(p->bm, p->bn, p->bk) > smem)
        return false;
    wave_tiles(p, m, n, k, vk_cmp_wave(khr, sms));
    return true;
}

bool vk_cmp_plan_cfg(uint32_t m, uint32_t n, uint32_t k, const uint32_t cfg[7], uint32_t smem,
                     uint32_t max_wg, vk_cm_plan *p)
{
    uint32_t wg = cfg[0], sgm = cfg[1], fm = cfg[2], fn = cfg[3], bk = cfg[4], stages = cfg[5];
    if (wg < 64 || wg > max_wg || sgm == 0 || wg % (32 * sgm) != 0 || fm == 0 || fn == 0 ||
        fm * fn > 16 || (bk != 16 && bk != 32 && bk != 64) || (stages != 1 && stages != 2))
        return false;
    *p = (vk_cm_plan){.sgm = sgm, .sgn = wg / 32 / sgm, .fm = fm, .fn = fn, .bk = bk,
                      .stages = stages};
    p->bm = 16 * p->fm * p->sgm;
    p->bn = 16 * p->fn * p->sgn;
    if ((uint64_t)stages * VK_CMP_SMEM(p->bm, p->bn, p->bk) > smem)
        return false;
    wave_tiles(p, m, n, k, cfg[6]);
    return true;
}

/* Splits p's K (k elements) into `slices` slices of whole BK steps (the
 * last one shorter), the way vk_cmp_plan_tail and vk_cmp_plan_pair apply
 * the count they chose. */
static void cmp_split_k(vk_cm_plan *p, uint32_t k, uint64_t slices)
{
    uint64_t ks = div_up(div_up(k ? k : 1, slices), p->bk) * p->bk;
    p->k_split = (uint32_t)ks;
    p->slices = k == 0 ? 1 : (uint32_t)div_up(k, ks);
}

void vk_cmp_plan_tail(vk_cm_plan *p, uint32_t k, uint32_t wave)
{
    uint64_t tiles = (uint64_t)p->tiles_m * p->tiles_n;
    if (wave == 0 || tiles <= wave || p->bk == 0)
        return;
    uint64_t most = k / VK_MM_MIN_SLICE, best = 1, best_cost = div_up(tiles, wave) * 1000;
    most = most < VK_CMP_TAIL_MAX ? most : VK_CMP_TAIL_MAX;
    for (uint64_t s = 2; s <= most; s++) {
        uint64_t cost = div_up(tiles * s, wave) * 1000 / s + VK_CMP_SLICE_COST * (s - 1);
        if (cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    cmp_split_k(p, k, best);
}

void vk_cmp_plan_pair(vk_cm_plan *p, uint32_t k, uint32_t wave, uint64_t first_tiles,
                      uint32_t first_slices)
{
    uint64_t tiles = (uint64_t)p->tiles_m * p->tiles_n;
    if (wave == 0 || first_tiles == 0 || first_slices == 0 || tiles <= wave || p->bk == 0)
        return;
    /* times in thousandths of a tile time */
    uint64_t pieces1 = first_tiles * first_slices, rounds1 = div_up(pieces1, wave);
    uint64_t idle = rounds1 * wave - pieces1, t1 = rounds1 * 1000 / first_slices;
    uint64_t most = k / VK_MM_MIN_SLICE, best = 1, best_cost = UINT64_MAX;
    most = most < VK_CMP_TAIL_MAX ? most : VK_CMP_TAIL_MAX;
    most = most > 1 ? most : 1;
    for (uint64_t s = 1; s <= most; s++) {
        uint64_t pieces = tiles * s, fill = idle * (s / first_slices);
        uint64_t rest = pieces > fill ? pieces - fill : 0;
        uint64_t cost = t1 + div_up(rest, wave) * 1000 / s + VK_CMP_SLICE_COST * (s - 1);
        if (cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    cmp_split_k(p, k, best);
}

bool vk_cmp_plan_tailcol(vk_cm_plan *p, uint32_t k, uint32_t wave, uint32_t max_slices)
{
    uint64_t tiles = (uint64_t)p->tiles_m * p->tiles_n;
    if (wave == 0 || tiles <= wave || p->bk == 0 || p->tiles_m == 0 || p->head_tn != 0)
        return false;
    uint64_t head_tn = tiles / wave * wave / p->tiles_m;
    uint64_t rest = tiles - head_tn * p->tiles_m;
    if (rest == 0 || rest * 2 > wave)
        return false;
    uint64_t s = k / VK_MM_MIN_SLICE;
    s = s < max_slices ? s : max_slices;
    s = s < wave / rest ? s : wave / rest;
    if (s < 2)
        return false;
    vk_cm_plan q = *p;
    cmp_split_k(&q, k, s);
    if (q.slices < 2)
        return false;
    q.head_tn = (uint32_t)head_tn;
    *p = q;
    return true;
}

bool vk_cmp_tail_used(const vk_mm_caps *c, uint32_t split)
{
    return c->cmp_tail == VK_CMP_TAIL_ALL || (c->cmp_tail == VK_CMP_TAIL_PRECISE && split == 2);
}

bool vk_cm_khr_used(const vk_mm_caps *c, uint32_t m)
{
    return c->coopmat && c->cm_khr && m <= VK_CMP_ROWS;
}

void vk_dec_cfg_default(uint32_t m, uint32_t split, uint32_t sms, vk_dec_cfg *c)
{
    uint32_t ka = m <= 16                                ? (split == 1 ? VK_DEC_KA_FAST : VK_DEC_KA_PRECISE)
                  : split == 1 && m <= VK_DEC_AUTO_FAST_ROWS ? VK_DEC_KA_FAST_MID
                                                             : 128;
    *c = (vk_dec_cfg){.wg = 256, .fn = 1, .bk = 64, .depth = 2, .ka = ka,
                      .groups = VK_DEC_GROUPS_SM * sm_or_fallback(sms)};
}

bool vk_dec_plan_make(uint32_t m, uint32_t n, uint32_t k, uint32_t split, const vk_dec_cfg *c,
                      uint32_t smem, vk_dec_plan *p)
{
    if (m == 0 || m > VK_CMP_ROWS || k == 0 || k % 8 != 0 || (split != 1 && split != 2))
        return false;
    if (c->wg < 64 || c->wg > 256 || c->wg % 32 != 0 || (c->fn != 1 && c->fn != 2) ||
        (c->bk != 32 && c->bk != 64 && c->bk != 128) || c->depth < 1 || c->depth > 3 ||
        c->ka < c->bk || c->ka % c->bk != 0 || c->groups == 0 || c->rows % 16 != 0)
        return false;
    uint32_t rows = c->rows && c->rows < m ? c->rows : m;
    vk_cm_plan *q = &p->cm;
    *q = (vk_cm_plan){.sgm = 1, .sgn = c->wg / 32, .fm = (uint32_t)div_up(rows, 16),
                      .fn = c->fn, .bk = c->bk, .stages = c->depth};
    q->bm = 16 * q->fm;
    q->tiles_m = (uint32_t)div_up(m, q->bm);
    q->bn = 16 * q->fn * q->sgn;
    q->tiles_n = (uint32_t)div_up(n, q->bn);
    uint64_t tiles = (uint64_t)q->tiles_n * q->tiles_m;
    tiles = tiles ? tiles : 1;
    uint64_t s = (c->groups + tiles / 2) / tiles, most = k / VK_MM_MIN_SLICE;
    s = s > most ? most : s;
    s = s < 1 ? 1 : s;
    q->k_split = (uint32_t)(div_up(div_up(k, s), q->bk) * q->bk);
    q->slices = (uint32_t)div_up(k, q->k_split);
    p->wg = c->wg;
    p->ka = c->ka < q->k_split ? c->ka : q->k_split; /* a multiple of bk either way */
    /* a smaller chunk where the shared memory would not hold it */
    while (p->ka > q->bk && VK_DEC_SMEM(split, q->bm, p->ka, c->wg, c->fn, c->bk) + 1024u > smem)
        p->ka = (p->ka / 2 + q->bk - 1) / q->bk * q->bk;
    p->apf = q->k_split > p->ka;
    return VK_DEC_SMEM(split, q->bm, p->ka, c->wg, c->fn, c->bk) + 1024u <= smem;
}

bool vk_dec_used(const vk_mm_caps *c, uint32_t m, uint32_t split)
{
    uint32_t least = c->cm_min ? c->cm_min : VK_MM_CM_MIN; /* rows; 0: unset */
    if (c->dec == VK_DEC_AUTO || c->dec == VK_DEC_AUTO_FAST) {
        uint32_t most = c->dec == VK_DEC_AUTO && split == 1
                            ? (c->dec_fast_rows ? c->dec_fast_rows : VK_DEC_AUTO_FAST_ROWS)
                            : VK_DEC_AUTO_ROWS;
        return c->coopmat && (split == 1 || c->dec == VK_DEC_AUTO) && m >= least && m <= most;
    }
    return c->coopmat && c->dec != VK_DEC_OFF && m >= least && m <= VK_CMP_ROWS;
}

bool vk_bf16_used(const vk_mm_caps *c, uint32_t m, uint32_t split, llmem_dtype w_dt, bool dec)
{
    return c->coopmat && (dec ? c->bf16_dec : c->bf16_cm) && split == 1 &&
           w_dt == LLMEM_DTYPE_BF16 && m <= VK_CMP_ROWS;
}

bool vk_cm2_used(const vk_mm_caps *c, uint32_t m)
{
    return c->coopmat && c->cm2 && m > VK_CMP_ROWS;
}

bool vk_cm2_plan_make(uint32_t m, uint32_t n, uint32_t k, uint32_t wg, uint32_t bn, uint32_t bk,
                      const uint32_t gran[3], uint32_t sms, vk_cm_plan *p)
{
    wg = wg == 128 ? 128 : 256;
    uint32_t bn_max = wg; /* fn <= 4 */
    if (bn != 64 && bn != 128 && bn != 256)
        bn = bn_max;
    bn = bn > bn_max ? bn_max : bn;
    bk = bk == 16 || bk == 32 || bk == 64 ? bk : VK_CM2_BK;
    *p = (vk_cm_plan){.sgm = 2, .sgn = wg / 64, .fm = 4, .bk = bk, .stages = 1};
    p->fn = bn / (16 * p->sgn);
    p->bm = 16 * p->fm * p->sgm;
    p->bn = 16 * p->fn * p->sgn;
    uint32_t dims[3] = {p->bm, p->bn, p->bk};
    for (int i = 0; i < 3; i++)
        if (gran[i] > 1 && dims[i] % gran[i] != 0)
            return false;
    wave_tiles(p, m, n, k, (uint64_t)VK_CM2_WAVE_SM * sm_or_fallback(sms) * (256 / wg));
    return true;
}

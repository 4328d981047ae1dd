/* llmem Vulkan backend: RoPE and the K-shift of cached keys.
 *
 * RoFormer (Su et al. 2021, eq. 34), pairs per mode (NORMAL (2i, 2i+1),
 * NEOX (i, i + n_rot/2)). The angle of pair i at position p is
 * p * f_i, f_i = freq_scale * theta^(-2i/n_rot) (formed in double, as on
 * the CPU). The host hands each shader f_i / (2 pi) as a 64-bit fraction
 * of a turn in a small staging table, so the shader reduces p * f_i
 * exactly with integer arithmetic (shaders/rope.glsl): positions of any
 * size keep f32 accuracy.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "vk_internal.h"

#define WG 256
#define TWO_PI 6.283185307179586476925

/* Table [n_rot/2] of (lo, hi) words of frac(f_i / 2pi) * 2^64. */
static llmem_status rope_table(vk_backend *v, const llmem_rope_params *p, vk_stage_ref *s)
{
    uint32_t half = (uint32_t)p->n_rot / 2;
    llmem_status st = vk_stage_get(v, (VkDeviceSize)half * 8, v->storage_align, s);
    if (st != LLMEM_OK)
        return st;
    uint32_t *t = s->ptr;
    for (uint32_t i = 0; i < half; i++) {
        double f = (double)p->freq_scale * pow((double)p->theta_base, -2.0 * i / p->n_rot);
        double turns = f / TWO_PI;
        double frac = turns - floor(turns); /* exact, in [0, 1) */
        uint64_t fx = (uint64_t)ldexp(frac, 64);
        t[2 * i] = (uint32_t)fx;
        t[2 * i + 1] = (uint32_t)(fx >> 32);
    }
    return LLMEM_OK;
}

/* Builds rope.comp's dispatch of x -> out (table tab); *groups its grid. */
static void rope_build(vk_backend *v, const llmem_rope_params *p, llmem_ct *x, llmem_ct *pos,
                       llmem_ct *out, const vk_stage_ref *tab, vk_op *op, uint64_t *groups)
{
    uint32_t n_rows = (uint32_t)(x->ne[0] * x->ne[1]), hd = (uint32_t)x->ne[2];
    uint32_t units = (uint32_t)p->n_rot / 2 + hd - (uint32_t)p->n_rot;
    vk_op_init(op, VK_SH_ROPE, WG);
    vk_op_spec(op, p->mode == LLMEM_ROPE_NEOX ? 1u : 0u);
    uint32_t xo = vk_op_tensor(v, op, x, false);
    uint32_t po = vk_op_tensor(v, op, pos, false);
    vk_op_stage(v, op, tab, (VkDeviceSize)p->n_rot * 4);
    uint32_t oo = vk_op_tensor(v, op, out, true);
    vk_op_u32(op, n_rows);
    vk_op_u32(op, (uint32_t)x->ne[1]);
    vk_op_u32(op, hd);
    vk_op_u32(op, (uint32_t)p->n_rot);
    vk_op_u32(op, xo);
    vk_op_u32(op, po);
    vk_op_u32(op, 0); /* table offset in its binding */
    vk_op_u32(op, oo);
    *groups = vk_div_up((uint64_t)n_rows * units, WG);
}

/* ---- rope of q and k with the store of k and v (vk_internal.h, vk_rope_store_take) -------- */

#define ROPE_STORE 1 /* $LLMEM_VULKAN_ROPE_STORE: hold one-token ropes for the kv store */
#define RS_WG 64     /* rope_store.comp: invocations per head */
#define RS_SMAX 512  /* rope_store.comp's SMAX: the largest head_dim */

/* The ropes held (v->rope_pending of them, in call order). */
struct vk_rope_held {
    vk_op op;
    uint64_t groups;
    llmem_rope_params p;
    llmem_tensor x, pos;
    vk_stage_ref tab;
};
struct vk_rope_hold {
    struct vk_rope_held r[2];
};

llmem_status vk_rope_flush(vk_backend *v)
{
    uint32_t n = v->rope_pending;
    v->rope_pending = 0; /* first: recording tracks, which calls back here */
    llmem_status st = LLMEM_OK;
    for (uint32_t i = 0; i < n; i++) {
        llmem_status s = vk_op_run(v, &v->rph->r[i].op, st == LLMEM_OK ? v->rph->r[i].groups : 0);
        st = st != LLMEM_OK ? st : s;
    }
    return st;
}

void vk_rope_finish(vk_backend *v)
{
    vk_rope_flush(v); /* recorded; vk_cmd_finish submits it */
    free(v->rph);
    v->rph = NULL;
}

/* Whether the bytes of t lie in one chunk of its buffer (so binding it
 * needs no temporary that a held dispatch would have to copy). */
static bool one_chunk(const llmem_tensor *t)
{
    vk_buffer *b = vk_buf(t->buf);
    return (t->offset % b->chunk) + llmem_tensor_nbytes(t) <= b->chunk;
}

static bool same_tensor(const llmem_tensor *a, const llmem_tensor *b)
{
    if (a->buf != b->buf || a->offset != b->offset || a->dtype != b->dtype || a->n_dims != b->n_dims)
        return false;
    for (int32_t d = 0; d < a->n_dims; d++)
        if (a->ne[d] != b->ne[d])
            return false;
    return true;
}

/* Whether a rope of x (params p, positions pos) may join the held one r:
 * the same angles and position, as many tokens, and different bytes (q,
 * then k). */
static bool rope_joins(const struct vk_rope_held *r, const llmem_rope_params *p,
                       const llmem_ct *x, const llmem_ct *pos)
{
    return r->p.mode == p->mode && r->p.n_rot == p->n_rot && r->p.theta_base == p->theta_base &&
           r->p.freq_scale == p->freq_scale && same_tensor(&r->pos, pos) &&
           r->x.ne[2] == x->ne[2] && !vk_overlap(&r->x, x);
}

/* A one-token rope in place on f32 [1, H, hd] (hd even, <= RS_SMAX) with an
 * i32 position, not turned off: it may wait for the kv store. */
static bool rope_may_hold(const vk_backend *v, const llmem_rope_params *p, llmem_ct *x,
                          llmem_ct *pos, llmem_ct *out)
{
    return VK_KNOB(v, rope_store, ROPE_STORE) == 1 && x->n_dims == 3 && x->ne[0] == 1 &&
           x->dtype == LLMEM_DTYPE_F32 && same_tensor(x, out) && x->ne[2] % 2 == 0 &&
           x->ne[2] <= RS_SMAX && p->n_rot % 2 == 0 && pos->dtype == LLMEM_DTYPE_I32 &&
           !vk_overlap(x, pos) && one_chunk(x) && one_chunk(pos);
}

llmem_status vk_op_rope(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x, llmem_ct *pos,
                        llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    vk_stage_ref tab;
    llmem_status st = rope_table(v, p, &tab);
    if (st != LLMEM_OK)
        return st;
    vk_op op;
    uint64_t groups = 0;
    if (!rope_may_hold(v, p, x, pos, out)) {
        rope_build(v, p, x, pos, out, &tab, &op, &groups);
        return vk_op_run(v, &op, groups);
    }
    /* a second rope joins the first where both use the same angles and
     * position and touch different bytes (q then k) */
    uint32_t i = 0;
    if (v->rope_pending == 1 && !v->nmc_pending && !v->fold_pending &&
        rope_joins(&v->rph->r[0], p, x, pos))
        i = 1;
    else if ((st = vk_held_flush(v)) != LLMEM_OK)
        return st;
    /* an open command buffer keeps the allocator from destroying a block
     * the held dispatch binds (vk_alloc_release trims only when nothing is
     * recorded) */
    if ((st = vk_cmd_begin(v)) != LLMEM_OK)
        return st;
    if (!v->rph && !(v->rph = calloc(1, sizeof *v->rph))) {
        rope_build(v, p, x, pos, out, &tab, &op, &groups);
        return vk_op_run(v, &op, groups);
    }
    rope_build(v, p, x, pos, out, &tab, &v->rph->r[i].op, &v->rph->r[i].groups);
    v->rph->r[i].p = *p;
    v->rph->r[i].x = *x;
    v->rph->r[i].pos = *pos;
    v->rph->r[i].tab = tab;
    v->rope_pending = i + 1;
    return LLMEM_OK;
}

llmem_status vk_rope_store_take(vk_backend *v, const llmem_view *view, llmem_ct *k, llmem_ct *vv,
                                bool *taken)
{
    *taken = false;
    if (v->rope_pending == 0)
        return LLMEM_OK;
    const struct vk_rope_hold *h = v->rph;
    const llmem_kv_view *kv = llmem_view_kv(view);
    uint32_t n = v->rope_pending;
    const llmem_tensor *last = &h->r[n - 1].x;
    int64_t hd = kv->head_dim, hk = kv->n_kv_heads;
    /* k: the held k itself (q held before it), or the tail of the one
     * rope held (q and k in one launch); v: like k, read only */
    bool ok = !vk_dtype_scaled(kv->dtype) && kv->dtype <= LLMEM_DTYPE_BF16 &&
              k->dtype == LLMEM_DTYPE_F32 && vv->dtype == LLMEM_DTYPE_F32 && k->n_dims == 3 &&
              vv->n_dims == 3 && k->ne[0] == 1 && k->ne[1] == hk && k->ne[2] == hd &&
              vv->ne[0] == 1 && vv->ne[1] == hk && vv->ne[2] == hd && last->ne[2] == hd &&
              last->ne[1] >= hk && k->buf == last->buf &&
              k->offset == last->offset + (size_t)(last->ne[1] - hk) * (size_t)hd * 4 &&
              (n == 1 || last->ne[1] == hk) && one_chunk(vv) && vk_buf(kv->k)->n_chunks == 1 &&
              vk_buf(kv->v)->n_chunks == 1 && kv->store_slot.n == kv->store_tok.n;
    for (uint32_t i = 0; ok && i < n; i++)
        ok = !vk_overlap(&h->r[i].x, vv);
    if (!ok)
        return vk_rope_flush(v);
    /* the q rows: the first rope held, or the head of the only one */
    llmem_tensor q = n == 2 ? h->r[0].x : *last;
    if (n == 1)
        q.ne[1] = last->ne[1] - hk;
    uint32_t n_q = (uint32_t)q.ne[1];
    const llmem_rope_params *p = &h->r[0].p;
    vk_op op;
    vk_op_init(&op, VK_SH_ROPE_STORE, RS_WG);
    vk_op_spec(&op, p->mode == LLMEM_ROPE_NEOX ? 1u : 0u);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    uint32_t qo = vk_op_tensor(v, &op, n_q > 0 ? &q : NULL, true);
    uint32_t ko = vk_op_tensor(v, &op, k, true);
    uint32_t vo = vk_op_tensor(v, &op, vv, false);
    uint32_t po = vk_op_tensor(v, &op, &h->r[0].pos, false);
    vk_op_stage(v, &op, &h->r[0].tab, (VkDeviceSize)p->n_rot * 4);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_buffer(v, &op, kv->k, true);
    vk_op_buffer(v, &op, kv->v, true);
    if (op.bad || op.n_tmp) {
        vk_op_run(v, &op, 0); /* gives its temporaries back */
        return vk_rope_flush(v);
    }
    vk_op_u32(&op, n_q);
    vk_op_u32(&op, (uint32_t)hk);
    vk_op_u32(&op, (uint32_t)hd);
    vk_op_u32(&op, (uint32_t)p->n_rot);
    vk_op_u32(&op, qo);
    vk_op_u32(&op, ko);
    vk_op_u32(&op, vo);
    vk_op_u32(&op, po);
    vk_op_u32(&op, (uint32_t)kv->store_slot.n);
    vk_op_u32(&op, (uint32_t)((int64_t)kv->n_pages * kv->page_size));
    vk_op_u32(&op, vk_table_word(&kv->store_tok));
    vk_op_u32(&op, vk_table_word(&kv->store_slot));
    v->rope_pending = 0;
    for (uint32_t i = 0; i < n; i++)
        vk_op_run(v, &v->rph->r[i].op, 0); /* gives their temporaries back */
    *taken = true;
    return vk_op_run(v, &op, (uint64_t)n_q + (uint64_t)hk);
}

llmem_status vk_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                              const llmem_view *view)
{
    vk_backend *v = vk_from(be);
    const llmem_kv_view *kv = llmem_view_kv(view);
    vk_stage_ref tab;
    llmem_status st = rope_table(v, p, &tab);
    if (st != LLMEM_OK)
        return st;
    uint32_t n = (uint32_t)kv->shift_slot.n;
    vk_op op;
    vk_op_init(&op, VK_SH_ROPE_SHIFT, WG);
    vk_op_spec(&op, p->mode == LLMEM_ROPE_NEOX ? 1u : 0u);
    vk_op_spec(&op, (uint32_t)kv->dtype);
    vk_op_buffer(v, &op, view->idx, false);
    vk_op_stage(v, &op, &tab, (VkDeviceSize)p->n_rot * 4);
    vk_op_buffer(v, &op, kv->k, true);
    vk_op_u32(&op, n);
    vk_op_u32(&op, (uint32_t)kv->n_kv_heads);
    vk_op_u32(&op, (uint32_t)kv->head_dim);
    vk_op_u32(&op, (uint32_t)p->n_rot);
    vk_op_u32(&op, (uint32_t)((int64_t)kv->n_pages * kv->page_size));
    vk_op_u32(&op, vk_table_word(&kv->shift_slot));
    vk_op_u32(&op, vk_table_word(&kv->shift_delta));
    vk_op_u32(&op, 0);
    return vk_op_run(v, &op, vk_div_up((uint64_t)n * kv->n_kv_heads * (p->n_rot / 2), WG));
}

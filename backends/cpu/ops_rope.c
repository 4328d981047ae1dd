/* llmem: CPU rotary position embedding and the K-shift of cached keys.
 *
 * RoFormer (Su et al. 2021, eq. 34) with the pair layouts of GPT-J
 * ("normal", (2i, 2i+1)) and GPT-NeoX / HF rotate_half ((i, i + n_rot/2)).
 * Angles pos * freq_scale * theta_base^(-2i/n_rot) are formed and their
 * cos/sin taken in double, once per token (or shifted slot), then applied
 * to every head in f32.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"

typedef struct rope_ctx {
    const llmem_rope_params *p;
    const double *inv_freq; /* [n_rot / 2] freq_scale * theta_base^(-2i/n_rot) */
    float *scratch;         /* [threads][n_rot (+ head_dim)]: cos | sin (| a head row) */
    /* rope */
    const float *x;
    const int32_t *pos;
    float *out;
    int64_t n_heads, head_dim;
    /* K-shift */
    char *pool;
    llmem_dtype dtype;
    const int32_t *slot, *delta;
    int64_t n_slots_total, n_kv_heads;
    atomic_int bad;
} rope_ctx;

static void rope_angles(const rope_ctx *c, double pos, float *cs, float *sn)
{
    int32_t half = c->p->n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        double a = pos * c->inv_freq[i];
        cs[i] = (float)cos(a);
        sn[i] = (float)sin(a);
    }
}

/* Rotates the first n_rot elements of one head: dst may equal src. */
static void rope_head(const llmem_rope_params *p, const float *cs, const float *sn,
                      const float *src, float *dst)
{
    int32_t half = p->n_rot / 2;
    if (p->mode == LLMEM_ROPE_NEOX) {
        for (int32_t i = 0; i < half; i++) {
            float x0 = src[i], x1 = src[i + half];
            dst[i] = x0 * cs[i] - x1 * sn[i];
            dst[i + half] = x0 * sn[i] + x1 * cs[i];
        }
    } else {
        for (int32_t i = 0; i < half; i++) {
            float x0 = src[2 * i], x1 = src[2 * i + 1];
            dst[2 * i] = x0 * cs[i] - x1 * sn[i];
            dst[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

static double *make_inv_freq(const llmem_rope_params *p)
{
    int32_t half = p->n_rot / 2;
    double *f = malloc((size_t)half * sizeof *f);
    if (!f)
        return NULL;
    for (int32_t i = 0; i < half; i++)
        f[i] = (double)p->freq_scale * pow((double)p->theta_base, -2.0 * i / p->n_rot);
    return f;
}

/* Runs fn over n items in grains of `grain` on nth threads, with c's
 * frequencies (make_inv_freq of c->p) and per_thread floats of scratch a
 * thread; both are freed before it returns. LLMEM_E_NO_MEMORY when they
 * cannot be allocated (nothing ran). */
static llmem_status rope_launch(rope_ctx *c, int32_t nth, size_t per_thread, int64_t n,
                                int64_t grain, llmem_tp_fn fn)
{
    double *inv_freq = make_inv_freq(c->p);
    c->scratch = malloc((size_t)nth * per_thread * sizeof *c->scratch);
    if (!inv_freq || !c->scratch) {
        free(inv_freq);
        free(c->scratch);
        return LLMEM_E_NO_MEMORY;
    }
    c->inv_freq = inv_freq;
    llmem_tp_run(nth, n, grain, fn, c);
    free(inv_freq);
    free(c->scratch);
    return LLMEM_OK;
}

static void rope_run(void *vctx, int64_t t0, int64_t t1, int32_t thread)
{
    const rope_ctx *c = vctx;
    int32_t n_rot = c->p->n_rot;
    float *cs = c->scratch + (size_t)thread * (size_t)n_rot, *sn = cs + n_rot / 2;
    for (int64_t t = t0; t < t1; t++) {
        rope_angles(c, (double)c->pos[t], cs, sn);
        for (int64_t h = 0; h < c->n_heads; h++) {
            const float *src = c->x + (t * c->n_heads + h) * c->head_dim;
            float *dst = c->out + (t * c->n_heads + h) * c->head_dim;
            rope_head(c->p, cs, sn, src, dst);
            if (dst != src)
                memcpy(dst + n_rot, src + n_rot, (size_t)(c->head_dim - n_rot) * sizeof *dst);
        }
    }
}

llmem_status cpu_op_rope(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x,
                         llmem_ct *pos, llmem_ct *out)
{
    rope_ctx c = {
        .p = p,
        .x = tensor_data(x),
        .pos = tensor_data(pos),
        .out = tensor_data(out),
        .n_heads = x->ne[1],
        .head_dim = x->ne[2],
    };
    int64_t n_tok = x->ne[0];
    int32_t nth = cpu_threads_for(llmem_tensor_nelements(x));
    return rope_launch(&c, nth, (size_t)p->n_rot, n_tok, 1, rope_run);
}

/* ---- K-shift ------------------------------------------------------------------------ */

static void shift_run(void *vctx, int64_t j0, int64_t j1, int32_t thread)
{
    rope_ctx *c = vctx;
    int32_t n_rot = c->p->n_rot;
    /* scratch per thread: cos | sin | one head row */
    float *cs = c->scratch + (size_t)thread * (size_t)(n_rot + c->head_dim);
    float *sn = cs + n_rot / 2, *row = cs + n_rot;
    size_t es = llmem_dtype_size(c->dtype);
    for (int64_t j = j0; j < j1; j++) {
        int32_t slot = c->slot[j];
        if (slot < 0 || slot >= c->n_slots_total) {
            atomic_store(&c->bad, 1);
            continue;
        }
        rope_angles(c, (double)c->delta[j], cs, sn);
        for (int64_t h = 0; h < c->n_kv_heads; h++) {
            char *k = c->pool + ((size_t)slot * (size_t)c->n_kv_heads + (size_t)h) *
                                    (size_t)c->head_dim * es;
            /* dims >= n_rot are left as stored */
            load_f32(k, c->dtype, n_rot, row);
            rope_head(c->p, cs, sn, row, row);
            store_f32(row, c->dtype, n_rot, k);
        }
    }
}

llmem_status cpu_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                               const llmem_view *view)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    rope_ctx c = {
        .p = p,
        .pool = llmem_buffer_host_ptr(kv->k),
        .dtype = kv->dtype,
        .slot = view_table(view, &kv->shift_slot),
        .delta = view_table(view, &kv->shift_delta),
        .n_slots_total = (int64_t)kv->n_pages * kv->page_size,
        .n_kv_heads = kv->n_kv_heads,
        .head_dim = kv->head_dim,
    };
    atomic_init(&c.bad, 0);
    int64_t n = kv->shift_slot.n;
    int32_t nth = cpu_threads_for(n * kv->n_kv_heads * kv->head_dim);
    llmem_status st = rope_launch(&c, nth, (size_t)(p->n_rot + kv->head_dim), n, 16, shift_run);
    if (st != LLMEM_OK)
        return st;
    return atomic_load(&c.bad) ? LLMEM_E_INVALID : LLMEM_OK;
}

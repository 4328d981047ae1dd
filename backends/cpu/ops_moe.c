/* llmem: CPU mixture-of-experts ops (the reference): top-k routing and the
 * grouped expert MLPs.
 *
 * moe_ffn groups the (token, choice) pairs by expert with a counting sort,
 * then runs two grouped GEMMs over work items of (expert, tile of NB weight
 * rows): each item converts its weight tile to f32 once and applies it to
 * every pair routed to that expert, so an expert no token chose is never
 * read. The weighted combine sums each token's k rows in choice order, so
 * results do not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"
#include "llmem/ops_moe.h"

#define NB 16 /* weight rows per work item */

/* ---- routing ------------------------------------------------------------------------ */

static llmem_status cpu_op_moe_route(llmem_backend *be, const llmem_moe_route_params *p,
                                     llmem_ct *logits, llmem_ct *bias, llmem_ct *ids,
                                     llmem_ct *weights)
{
    (void)be;
    int32_t E = p->n_expert, k = p->n_expert_used;
    int64_t T = logits->ne[0];
    int32_t G = p->n_group > 1 ? p->n_group : 1, gs = E / G;
    const float *b = NULL;
    float *b_owned = NULL;
    llmem_status st = cpu_param_f32(bias, &b, &b_owned);
    if (st != LLMEM_OK)
        return st;
    float *s = malloc((size_t)E * 2 * sizeof *s + (size_t)G * (sizeof(float) + 1));
    if (!s) {
        free(b_owned);
        return LLMEM_E_NO_MEMORY;
    }
    float *c = s + E, *gscore = c + E;
    unsigned char *gkeep = (unsigned char *)(gscore + G);
    const float *L = tensor_data(logits);
    int32_t *out_id = tensor_data(ids);
    float *out_w = tensor_data(weights);
    for (int64_t t = 0; t < T; t++) {
        const float *l = L + t * E;
        if (p->scoring == LLMEM_MOE_SOFTMAX) {
            float mx = -INFINITY;
            for (int32_t e = 0; e < E; e++)
                mx = l[e] > mx ? l[e] : mx;
            double sum = 0;
            for (int32_t e = 0; e < E; e++)
                sum += (s[e] = expf(l[e] - mx));
            for (int32_t e = 0; e < E; e++)
                s[e] = (float)(s[e] / sum);
        } else {
            for (int32_t e = 0; e < E; e++)
                s[e] = 1.0f / (1.0f + expf(-l[e]));
        }
        for (int32_t e = 0; e < E; e++)
            c[e] = s[e] + (b ? b[e] : 0.0f);
        for (int32_t g = 0; g < G; g++)
            gkeep[g] = 1;
        if (G > 1) {
            for (int32_t g = 0; g < G; g++) { /* sum of the group's two best */
                float m1 = -INFINITY, m2 = -INFINITY;
                for (int32_t e = g * gs; e < (g + 1) * gs; e++) {
                    if (c[e] > m1) {
                        m2 = m1;
                        m1 = c[e];
                    } else if (c[e] > m2) {
                        m2 = c[e];
                    }
                }
                gscore[g] = m1 + m2;
                gkeep[g] = 0;
            }
            for (int32_t n = 0; n < p->topk_group; n++) {
                int32_t best = -1;
                for (int32_t g = 0; g < G; g++)
                    if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best]))
                        best = g;
                gkeep[best] = 1;
            }
        }
        /* k passes of a selection: E * k is small (E <= a few hundred) */
        float wsum = 0;
        for (int32_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                if (!gkeep[e / gs] || c[e] == -INFINITY)
                    continue;
                if (best < 0 || c[e] > c[best])
                    best = e;
            }
            if (best < 0) /* NaN scores: fall back to the lowest unused expert */
                for (int32_t e = 0; e < E && best < 0; e++)
                    if (c[e] != -INFINITY)
                        best = e;
            out_id[t * k + j] = best;
            out_w[t * k + j] = s[best];
            wsum += s[best];
            c[best] = -INFINITY;
        }
        for (int32_t j = 0; j < k; j++) {
            if (p->norm_topk)
                out_w[t * k + j] /= wsum + 1e-20f;
            out_w[t * k + j] *= p->scale;
        }
    }
    free(s);
    free(b_owned);
    return LLMEM_OK;
}

/* ---- experts ------------------------------------------------------------------------- */

typedef struct moe_ctx {
    const llmem_moe_ffn_params *p;
    const float *x;      /* [T, D] */
    const char *w_up;    /* [E, I or 2I, D] */
    const char *w_down;  /* [E, D, I] */
    llmem_dtype wt;
    int64_t D, I, k;
    const int32_t *pair; /* pairs t * k + j sorted by expert */
    const int32_t *start; /* [E + 1] first sorted pair of each expert */
    const int32_t *item_e, *item_n0; /* work items: expert, first weight row */
    float *h;            /* [T * k, I] hidden rows, by pair */
    float *y;            /* [T * k, D] expert outputs, by pair */
    float *scratch;      /* [threads][2 * NB * max(D, I)] converted weight tiles */
    int64_t scratch_per;
} moe_ctx;

static float act(llmem_moe_act a, float v)
{
    if (a == LLMEM_MOE_ACT_RELU2)
        return v > 0 ? v * v : 0.0f;
    return v / (1.0f + expf(-v));
}

/* Weight rows [r0, r0 + n) of the matrix at w (row length len) as f32. */
static const float *rows_f32(const moe_ctx *c, const char *w, int64_t r0, int64_t n, int64_t len,
                             float *tile)
{
    size_t es = llmem_dtype_size(c->wt);
    if (c->wt == LLMEM_DTYPE_F32)
        return (const float *)(const void *)(w + (size_t)r0 * (size_t)len * es);
    load_f32(w + (size_t)r0 * (size_t)len * es, c->wt, n * len, tile);
    return tile;
}

/* h[pair, n0 .. n0+NB) for every pair of the item's expert. */
static void up_run(void *vctx, int64_t i0, int64_t i1, int32_t thread)
{
    const moe_ctx *c = vctx;
    int64_t D = c->D, I = c->I, rows_e = c->p->gated ? 2 * I : I;
    size_t es = llmem_dtype_size(c->wt);
    float *tile = c->scratch + (size_t)thread * (size_t)c->scratch_per;
    for (int64_t it = i0; it < i1; it++) {
        int32_t e = c->item_e[it];
        int64_t n0 = c->item_n0[it], n1 = n0 + NB < I ? n0 + NB : I, nn = n1 - n0;
        const char *we = c->w_up + (size_t)e * (size_t)rows_e * (size_t)D * es;
        const float *up = rows_f32(c, we, (c->p->gated ? I : 0) + n0, nn, D, tile);
        const float *gate = c->p->gated ? rows_f32(c, we, n0, nn, D, tile + NB * D) : NULL;
        for (int32_t q = c->start[e]; q < c->start[e + 1]; q++) {
            int32_t pr = c->pair[q];
            const float *xr = c->x + (pr / c->k) * D;
            float *hr = c->h + (int64_t)pr * I;
            for (int64_t n = 0; n < nn; n++) {
                float u = dot_f32(xr, up + n * D, D);
                hr[n0 + n] = gate ? act(c->p->act, dot_f32(xr, gate + n * D, D)) * u
                                  : act(c->p->act, u);
            }
        }
    }
}

/* y[pair, n0 .. n0+NB) = down[e] rows · h[pair]. */
static void down_run(void *vctx, int64_t i0, int64_t i1, int32_t thread)
{
    const moe_ctx *c = vctx;
    int64_t D = c->D, I = c->I;
    size_t es = llmem_dtype_size(c->wt);
    float *tile = c->scratch + (size_t)thread * (size_t)c->scratch_per;
    for (int64_t it = i0; it < i1; it++) {
        int32_t e = c->item_e[it];
        int64_t n0 = c->item_n0[it], n1 = n0 + NB < D ? n0 + NB : D, nn = n1 - n0;
        const char *we = c->w_down + (size_t)e * (size_t)D * (size_t)I * es;
        const float *dn = rows_f32(c, we, n0, nn, I, tile);
        for (int32_t q = c->start[e]; q < c->start[e + 1]; q++) {
            int32_t pr = c->pair[q];
            const float *hr = c->h + (int64_t)pr * I;
            float *yr = c->y + (int64_t)pr * D;
            for (int64_t n = 0; n < nn; n++)
                yr[n0 + n] = dot_f32(hr, dn + n * I, I);
        }
    }
}

/* Work items (expert with pairs, tile of rows) over `rows` weight rows. */
static int64_t make_items(const int32_t *start, int32_t E, int64_t rows, int32_t *item_e,
                          int32_t *item_n0)
{
    int64_t n = 0;
    for (int32_t e = 0; e < E; e++) {
        if (start[e + 1] == start[e])
            continue;
        for (int64_t r = 0; r < rows; r += NB) {
            item_e[n] = e;
            item_n0[n] = (int32_t)r;
            n++;
        }
    }
    return n;
}

static llmem_status cpu_op_moe_ffn(llmem_backend *be, const llmem_moe_ffn_params *p, llmem_ct *x,
                                   llmem_ct *ids, llmem_ct *weights, llmem_ct *w_up,
                                   llmem_ct *w_down, llmem_ct *out)
{
    (void)be;
    int64_t T = x->ne[0], D = x->ne[1], k = ids->ne[1], I = w_down->ne[2];
    int32_t E = w_up->ne[0];
    int64_t P = T * k;
    const int32_t *id = tensor_data(ids);
    for (int64_t q = 0; q < P; q++)
        if (id[q] < 0 || id[q] >= E)
            return LLMEM_E_INVALID;
    float *o = tensor_data(out);
    const float *wt = tensor_data(weights);
    if (I == 0) {
        for (int64_t i = 0; i < T * D; i++)
            o[i] = 0.0f;
        return LLMEM_OK;
    }
    int64_t tiles_max = ((I > D ? I : D) + NB - 1) / NB;
    int32_t nth = cpu_threads_for(P * D * I);
    int64_t per = 2 * NB * (I > D ? I : D);
    int32_t *start = calloc((size_t)E + 1, sizeof *start);
    int32_t *pair = malloc((size_t)P * sizeof *pair);
    int32_t *item_e = malloc((size_t)(E * tiles_max) * sizeof *item_e);
    int32_t *item_n0 = malloc((size_t)(E * tiles_max) * sizeof *item_n0);
    float *h = malloc((size_t)P * (size_t)I * sizeof *h);
    float *y = malloc((size_t)P * (size_t)D * sizeof *y);
    float *scratch = malloc((size_t)nth * (size_t)per * sizeof *scratch);
    llmem_status st = LLMEM_E_NO_MEMORY;
    if (!start || !pair || !item_e || !item_n0 || !h || !y || !scratch)
        goto done;
    /* counting sort of the pairs by expert, stable in token order */
    for (int64_t q = 0; q < P; q++)
        start[id[q] + 1]++;
    for (int32_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    int32_t *fill = item_e; /* borrowed as the per-expert cursor (E <= E * tiles) */
    for (int32_t e = 0; e < E; e++)
        fill[e] = start[e];
    for (int64_t q = 0; q < P; q++)
        pair[fill[id[q]]++] = (int32_t)q;
    moe_ctx c = {.p = p, .x = tensor_data(x), .w_up = tensor_data(w_up),
                 .w_down = tensor_data(w_down), .wt = w_up->dtype, .D = D, .I = I, .k = k,
                 .pair = pair, .start = start, .item_e = item_e, .item_n0 = item_n0, .h = h,
                 .y = y, .scratch = scratch, .scratch_per = per};
    int64_t n = make_items(start, E, I, item_e, item_n0);
    llmem_tp_run(nth, n, 1, up_run, &c);
    n = make_items(start, E, D, item_e, item_n0);
    llmem_tp_run(nth, n, 1, down_run, &c);
    for (int64_t t = 0; t < T; t++) {
        float *orow = o + t * D;
        for (int64_t d = 0; d < D; d++)
            orow[d] = 0.0f;
        for (int64_t j = 0; j < k; j++)
            axpy_f32(orow, y + (t * k + j) * D, wt[t * k + j], D);
    }
    st = LLMEM_OK;
done:
    free(start);
    free(pair);
    free(item_e);
    free(item_n0);
    free(h);
    free(y);
    free(scratch);
    return st;
}

/* Registered in the cpu backend's list of open ops (<llmem/backend_impl.h>). */
LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_MOE_ROUTE, LLMEM_OP_MOE_ROUTE_LAYOUT, llmem_op_moe_route_fn,
              cpu_op_moe_route);
LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_MOE_FFN, LLMEM_OP_MOE_FFN_LAYOUT, llmem_op_moe_ffn_fn,
              cpu_op_moe_ffn);

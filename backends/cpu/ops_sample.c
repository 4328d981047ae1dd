/* llmem: CPU ops, sampling family: sample (greedy, temperature, top-k,
 * top-p, min-p), logprob_gather and top_logprobs — the reference the
 * device backends are checked against (tests/test_ops_sample.c).
 *
 * The reference is written for clarity, not speed: a row that needs top-k
 * or top-p sorts its valid entries once (descending value, lower index
 * first) and walks groups of equal values, so ties are kept or dropped
 * together exactly as <llmem/ops.h> defines. Weights and running sums are
 * in double. Rows run in parallel on the thread pool.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"

typedef struct key {
    float v;
    int32_t i;
} key;

typedef struct sample_ctx {
    const llmem_sample_params *p;
    const float *x;
    const int32_t *ctr;
    int32_t *out;
    int64_t cols;
    key **keys;    /* per-thread scratch of cols (value, index) keys */
    double **w;    /* per-thread scratch of cols weights */
} sample_ctx;

static int cmp_key_desc(const void *a, const void *b)
{
    const key *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int32_t argmax_row(const float *x, int64_t n)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
            best = i;
    return best < 0 ? 0 : (int32_t)best;
}

/* Whether entry v can be chosen at all (weight > 0). */
static bool valid(float v)
{
    return !isnan(v) && v > -INFINITY;
}

static double weight(float v, float mx, double inv_t)
{
    if (!valid(v))
        return 0.0;
    if (v == mx) /* also covers +inf == +inf */
        return 1.0;
    return exp(((double)v - (double)mx) * inv_t);
}

/* Samples one row; w[] gets the kept weights (0 for dropped tokens). */
static int32_t sample_row(const llmem_sample_params *p, const float *x, int64_t n, uint32_t c,
                          double *w, key *keys)
{
    float mx = -INFINITY;
    int64_t n_valid = 0;
    for (int64_t i = 0; i < n; i++)
        if (valid(x[i])) {
            n_valid++;
            mx = x[i] > mx ? x[i] : mx;
        }
    if (n_valid == 0)
        return 0;
    double inv_t = 1.0 / (double)p->temperature;
    for (int64_t i = 0; i < n; i++)
        w[i] = weight(x[i], mx, inv_t);
    bool top_k = p->top_k > 0 && p->top_k < n_valid;
    bool top_p = p->top_p < 1.0f;
    if (top_k || top_p) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (valid(x[i]))
                keys[m++] = (key){x[i], (int32_t)i};
        qsort(keys, (size_t)m, sizeof *keys, cmp_key_desc);
        /* top-k: a group of equal values starting at sorted position g has g
         * strictly larger entries. */
        int64_t end_k = m;
        if (top_k) {
            for (int64_t g = 0; g < m; g++)
                if (g > 0 && keys[g].v != keys[g - 1].v && g >= p->top_k) {
                    end_k = g;
                    break;
                }
            for (int64_t s = end_k; s < m; s++)
                w[keys[s].i] = 0.0;
        }
        if (top_p) {
            double wk = 0.0;
            for (int64_t s = 0; s < end_k; s++)
                wk += w[keys[s].i];
            double limit = (double)p->top_p * wk, above = 0.0;
            int64_t s = 0;
            while (s < end_k) {
                int64_t e = s;
                double group = 0.0;
                while (e < end_k && keys[e].v == keys[s].v)
                    group += w[keys[e++].i];
                if (!(above < limit))
                    for (int64_t t = s; t < e; t++)
                        w[keys[t].i] = 0.0;
                above += group;
                s = e;
            }
        }
    }
    if (p->min_p > 0.0f)
        for (int64_t i = 0; i < n; i++)
            if (w[i] < (double)p->min_p)
                w[i] = 0.0;
    double total = 0.0;
    int64_t last = -1;
    for (int64_t i = 0; i < n; i++)
        if (w[i] > 0.0) {
            total += w[i];
            last = i;
        }
    if (last < 0)
        return argmax_row(x, n); /* unreachable: the max always survives */
    double target = (double)llmem_sample_uniform(p->seed, c) * total, run = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (w[i] <= 0.0)
            continue;
        run += w[i];
        if (run > target)
            return (int32_t)i;
    }
    return (int32_t)last;
}

static void sample_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    sample_ctx *c = vctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->cols;
        if (!(c->p->temperature > 0.0f)) {
            c->out[r] = argmax_row(x, c->cols);
            continue;
        }
        uint32_t ctr = c->ctr ? (uint32_t)c->ctr[r] : (uint32_t)r;
        c->out[r] = sample_row(c->p, x, c->cols, ctr, c->w[thread], c->keys[thread]);
    }
}

llmem_status cpu_op_sample(llmem_backend *be, const llmem_sample_params *p, llmem_ct *logits,
                           llmem_ct *ctr, llmem_ct *out)
{
    (void)be;
    int64_t rows = tensor_rows(logits), cols = tensor_cols(logits);
    int32_t nth = cpu_threads_for(rows * cols);
    if (nth > rows)
        nth = (int32_t)rows;
    if (nth < 1)
        nth = 1;
    sample_ctx c = {.p = p, .x = tensor_data(logits), .ctr = ctr ? tensor_data(ctr) : NULL,
                    .out = tensor_data(out), .cols = cols};
    llmem_status st = LLMEM_OK;
    if (p->temperature > 0.0f) {
        c.keys = calloc((size_t)nth, sizeof *c.keys);
        c.w = calloc((size_t)nth, sizeof *c.w);
        if (!c.keys || !c.w) {
            st = LLMEM_E_NO_MEMORY;
            goto done;
        }
        for (int32_t t = 0; t < nth; t++) {
            c.keys[t] = malloc((size_t)cols * sizeof(key));
            c.w[t] = malloc((size_t)cols * sizeof(double));
            if (!c.keys[t] || !c.w[t]) {
                st = LLMEM_E_NO_MEMORY;
                goto done;
            }
        }
    }
    llmem_tp_run(nth, rows, 1, sample_run, &c);
done:
    for (int32_t t = 0; t < nth; t++) {
        if (c.keys)
            free(c.keys[t]);
        if (c.w)
            free(c.w[t]);
    }
    free(c.keys);
    free(c.w);
    return st;
}

/* log(sum_j exp(x_j)) of a row, max-subtracted, summed in double. NaN
 * entries are skipped, as in sampling; an all-NaN or all -inf row gives
 * -inf. */
static double row_lse(const float *x, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && x[i] > mx)
            mx = x[i];
    if (mx == -INFINITY || mx == INFINITY)
        return (double)mx;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]))
            s += exp((double)x[i] - (double)mx);
    return (double)mx + log(s);
}

typedef struct gather_ctx {
    const float *x;
    const int32_t *ids;
    float *out;
    int32_t *top_ids;
    int64_t cols;
    int32_t n;
    atomic_int bad;
} gather_ctx;

static void gather_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    (void)thread;
    gather_ctx *c = vctx;
    for (int64_t r = r0; r < r1; r++) {
        int32_t id = c->ids[r];
        if (id < 0 || id >= c->cols) {
            atomic_store(&c->bad, 1);
            c->out[r] = NAN;
            continue;
        }
        const float *x = c->x + r * c->cols;
        c->out[r] = (float)((double)x[id] - row_lse(x, c->cols));
    }
}

llmem_status cpu_op_logprob_gather(llmem_backend *be, llmem_ct *logits, llmem_ct *ids,
                                   llmem_ct *out)
{
    (void)be;
    gather_ctx c = {.x = tensor_data(logits), .ids = tensor_data(ids), .out = tensor_data(out),
                    .cols = tensor_cols(logits)};
    int64_t rows = tensor_rows(logits);
    llmem_tp_run(cpu_threads_for(rows * c.cols), rows, 1, gather_run, &c);
    return atomic_load(&c.bad) ? LLMEM_E_INVALID : LLMEM_OK;
}

/* Whether entry a ranks before entry b: larger value, then lower index. */
static bool ranks_before(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

static void top_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    (void)thread;
    gather_ctx *c = vctx;
    int32_t n = c->n;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->cols;
        int32_t *ids = c->top_ids + r * n;
        float *lp = c->out + r * n;
        int32_t have = 0;
        /* insertion into a sorted list of the n best so far */
        for (int64_t i = 0; i < c->cols; i++) {
            if (isnan(x[i]))
                continue;
            if (have == n && !ranks_before(x[i], (int32_t)i, x[ids[n - 1]], ids[n - 1]))
                continue;
            int32_t k = have < n ? have++ : n - 1;
            while (k > 0 && ranks_before(x[i], (int32_t)i, x[ids[k - 1]], ids[k - 1])) {
                ids[k] = ids[k - 1];
                k--;
            }
            ids[k] = (int32_t)i;
        }
        /* a row with fewer than n non-NaN entries lists its NaN ones last */
        for (int64_t i = 0; have < n && i < c->cols; i++)
            if (isnan(x[i]))
                ids[have++] = (int32_t)i;
        double lse = row_lse(x, c->cols);
        for (int32_t k = 0; k < n; k++)
            lp[k] = (float)((double)x[ids[k]] - lse);
    }
}

llmem_status cpu_op_top_logprobs(llmem_backend *be, llmem_ct *logits, int32_t n,
                                 llmem_ct *top_ids, llmem_ct *top_lp)
{
    (void)be;
    gather_ctx c = {.x = tensor_data(logits), .out = tensor_data(top_lp),
                    .top_ids = tensor_data(top_ids), .cols = tensor_cols(logits), .n = n};
    int64_t rows = tensor_rows(logits);
    llmem_tp_run(cpu_threads_for(rows * c.cols), rows, 1, top_run, &c);
    return LLMEM_OK;
}

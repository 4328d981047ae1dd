/* llmem generate: sampling (temperature, top-k, top-p, min-p, repetition
 * penalty) and speculative verification. See sample.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/sample.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand;

int sampler_init(sampler *sp, int32_t V)
{
    sp->V = V;
    sp->row = malloc((size_t)V * sizeof *sp->row);
    sp->p = malloc((size_t)V * sizeof *sp->p);
    sp->cand = malloc((size_t)V * sizeof *sp->cand);
    sp->mark = calloc((size_t)V, sizeof *sp->mark);
    sp->epoch = 0;
    return !sp->row || !sp->p || !sp->cand || !sp->mark;
}

void sampler_free(sampler *sp)
{
    free(sp->row);
    free(sp->p);
    free(sp->cand);
    free(sp->mark);
}

static double rng_uniform(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static int cmp_cand(const void *a, const void *b)
{
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int32_t argmax(const float *logits, int32_t V)
{
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* The sampling distribution of one row: softmax(logits / temp) restricted
 * to the top-k tokens, then to those with at least min_p times the top
 * probability (min-p sampling, Nguyen et al. 2024), then to the smallest
 * prefix whose mass reaches top_p (nucleus sampling; Holtzman et al. 2020),
 * renormalized. sp->p[V] out. */
static void distribution(sampler *sp, const float *logits)
{
    int32_t V = sp->V;
    cand *buf = sp->cand;
    double *p = sp->p;
    for (int32_t i = 0; i < V; i++) {
        buf[i] = (cand){logits[i], i};
        p[i] = 0;
    }
    qsort(buf, (size_t)V, sizeof *buf, cmp_cand);
    int32_t n = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)(buf[i].logit - buf[0].logit) / sp->temp);
    double acc = 0, kept = 0;
    for (int32_t i = 0; i < n; i++) {
        double q = exp((double)(buf[i].logit - buf[0].logit) / sp->temp) / sum;
        if (i > 0 && q < sp->min_p * (1.0 / sum))
            break; /* the top token's probability is 1 / sum */
        p[buf[i].id] = q;
        kept += q;
        acc += q;
        if (acc >= sp->top_p)
            break;
    }
    for (int32_t i = 0; i < V; i++)
        p[i] /= kept;
}

static int32_t draw(const double *p, int32_t V, double total, uint64_t *rng)
{
    double r = rng_uniform(rng) * total;
    int32_t last_nz = 0;
    for (int32_t i = 0; i < V; i++) {
        if (p[i] <= 0)
            continue;
        last_nz = i;
        r -= p[i];
        if (r < 0)
            return i;
    }
    return last_nz;
}

int32_t lookup_draft(const int32_t *h, int32_t n_h, int32_t max_ngram, int32_t k, int32_t *draft)
{
    for (int32_t n = max_ngram; n >= 1; n--) {
        if (n >= n_h)
            continue;
        for (int32_t i = n_h - n - 1; i >= 0; i--) {
            if (memcmp(h + i, h + n_h - n, (size_t)n * sizeof *h) != 0)
                continue;
            int32_t m = 0;
            for (int32_t j = i + n; j < n_h && m < k; j++)
                draft[m++] = h[j];
            if (m > 0)
                return m;
        }
    }
    return 0;
}

/* The row after hist + draft[0..j), with the repetition penalty of the
 * CTRL paper (Keskar et al. 2019) as llama.cpp applies it: each distinct
 * token of the last repeat_last_n has its logit divided by the penalty
 * when positive, multiplied when negative. */
static const float *penalized(sampler *sp, const gen_seq *q, const float *row, int32_t j)
{
    if (sp->repeat_penalty == 1.0 || sp->repeat_last_n <= 0)
        return row;
    memcpy(sp->row, row, (size_t)sp->V * sizeof *row);
    if (++sp->epoch == 0) {
        memset(sp->mark, 0, (size_t)sp->V * sizeof *sp->mark);
        sp->epoch = 1;
    }
    int32_t n = q->n_hist + j, from = n > sp->repeat_last_n ? n - sp->repeat_last_n : 0;
    for (int32_t i = from; i < n; i++) {
        int32_t t = i < q->n_hist ? q->hist[i] : q->draft[i - q->n_hist];
        if (t < 0 || t >= sp->V || sp->mark[t] == sp->epoch)
            continue;
        sp->mark[t] = sp->epoch;
        float l = sp->row[t];
        sp->row[t] = l > 0 ? (float)(l / sp->repeat_penalty) : (float)(l * sp->repeat_penalty);
    }
    return sp->row;
}

int32_t verify(sampler *sp, gen_seq *q, const float *rows, int32_t *out)
{
    int32_t V = sp->V, j = 0;
    for (; j <= q->n_draft; j++) {
        const float *row = penalized(sp, q, rows + (size_t)j * (size_t)V, j);
        if (sp->temp <= 0) {
            int32_t t = argmax(row, V);
            out[j] = t;
            if (j == q->n_draft || t != q->draft[j])
                return j + 1;
            continue;
        }
        distribution(sp, row);
        if (j == q->n_draft) {
            out[j] = draw(sp->p, V, 1.0, &q->rng);
            return j + 1;
        }
        int32_t d = q->draft[j];
        if (rng_uniform(&q->rng) < sp->p[d]) {
            out[j] = d;
            continue;
        }
        double rest = 1.0 - sp->p[d];
        sp->p[d] = 0;
        out[j] = rest > 0 ? draw(sp->p, V, rest, &q->rng) : d;
        return j + 1;
    }
    return j;
}

int32_t verify_ids(const gen_seq *q, const int32_t *ids, int32_t *out)
{
    for (int32_t j = 0; j <= q->n_draft; j++) {
        out[j] = ids[j];
        if (j == q->n_draft || ids[j] != q->draft[j])
            return j + 1;
    }
    return q->n_draft + 1;
}

// ctest-labels: core
/* Op conformance suite, sampling family: sample (greedy, temperature,
 * top-k, top-p, min-p), logprob_gather and top_logprobs, on every backend
 * that opens ($LLMEM_TEST_BACKENDS, default "cpu,vulkan,cuda"; a device
 * backend whose ops table lacks these slots is skipped with a message).
 *
 * Every backend is checked against float64 brute force written here, not
 * against the CPU backend: the kept set of a row is recomputed from the
 * definitions of <llmem/ops.h> (counting larger entries and their mass for
 * every token, O(V^2)), the row's uniform number from the documented hash,
 * and the chosen token must be kept and hold u * W within rounding of its
 * running-sum interval. A statistical test checks the frequencies of 4096
 * draws against the probabilities; log-probabilities come from a float64
 * log-softmax; top lists from a float64 ranking.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define I32 LLMEM_DTYPE_I32

/* The row's uniform number, written out from the contract in <llmem/ops.h>
 * (lowbias32, C. Wellons 2018), independently of llmem_sample_uniform. */
static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static double uniform(uint64_t seed, uint32_t c)
{
    uint32_t h = mix(mix(mix(c) ^ (uint32_t)(seed & 0xffffffffu)) ^ (uint32_t)(seed >> 32));
    return (double)(h >> 8) / 16777216.0;
}

static bool valid(double v)
{
    return !isnan(v) && v > -INFINITY;
}

static const double *sort_row;

static int by_value_desc(const void *a, const void *b)
{
    double x = sort_row[*(const int32_t *)a], y = sort_row[*(const int32_t *)b];
    return (x < y) - (x > y);
}

/* ref_kept for large rows: w[] holds the unfiltered weights on entry; the
 * valid entries sorted by value give, per group of equal values, the count
 * and the mass of the strictly larger ones. */
static void ref_kept_sorted(const llmem_sample_params *p, const double *x, int32_t v, double *w)
{
    int32_t *ord = malloc((size_t)v * sizeof *ord), m = 0;
    double *keep = calloc((size_t)v, sizeof *keep);
    ck_assert(ord && keep);
    for (int32_t i = 0; i < v; i++)
        if (valid(x[i]))
            ord[m++] = i;
    sort_row = x;
    qsort(ord, (size_t)m, sizeof *ord, by_value_desc);
    int32_t end_k = m;
    for (int32_t g = 1; p->top_k > 0 && g < m; g++)
        if (x[ord[g]] != x[ord[g - 1]] && g >= p->top_k) {
            end_k = g;
            break;
        }
    double wk = 0.0, above = 0.0;
    for (int32_t s = 0; s < end_k; s++)
        wk += w[ord[s]];
    for (int32_t s = 0; s < end_k;) {
        int32_t e = s;
        double group = 0.0;
        while (e < end_k && x[ord[e]] == x[ord[s]])
            group += w[ord[e++]];
        for (int32_t t = s; t < e; t++) {
            double wi = w[ord[t]];
            bool ok = p->top_p >= 1.0f || above < (double)p->top_p * wk;
            if (p->min_p > 0.0f && wi < (double)p->min_p)
                ok = false;
            keep[ord[t]] = ok ? wi : 0.0;
        }
        above += group;
        s = e;
    }
    memcpy(w, keep, (size_t)v * sizeof *w);
    free(keep);
    free(ord);
}

/* Float64 kept weights of one row by the definitions (w[i] = 0: dropped).
 * Brute force: for each token, count and sum the strictly larger ones. */
static void ref_kept(const llmem_sample_params *p, const double *x, int32_t v, double *w)
{
    double mx = -INFINITY;
    int32_t n_valid = 0;
    for (int32_t i = 0; i < v; i++)
        if (valid(x[i])) {
            mx = x[i] > mx ? x[i] : mx;
            n_valid++;
        }
    for (int32_t i = 0; i < v; i++)
        w[i] = !valid(x[i]) ? 0.0 : x[i] == mx ? 1.0 : exp((x[i] - mx) / p->temperature);
    bool *k = calloc((size_t)v, sizeof *k);
    ck_assert_ptr_nonnull(k);
    double wk = 0.0;
    if (v > 4096) { /* real vocabularies: the same definitions, through a sort */
        ref_kept_sorted(p, x, v, w);
        free(k);
        return;
    }
    for (int32_t i = 0; i < v; i++) {
        if (!valid(x[i]))
            continue;
        int32_t larger = 0;
        for (int32_t j = 0; j < v; j++)
            larger += valid(x[j]) && x[j] > x[i];
        k[i] = p->top_k <= 0 || larger < p->top_k;
        if (k[i])
            wk += w[i];
    }
    double *keep = calloc((size_t)v, sizeof *keep);
    ck_assert_ptr_nonnull(keep);
    for (int32_t i = 0; i < v; i++) {
        if (!k[i])
            continue;
        bool ok = true;
        if (p->top_p < 1.0f) {
            double above = 0.0;
            for (int32_t j = 0; j < v; j++)
                if (k[j] && x[j] > x[i])
                    above += w[j];
            ok = above < (double)p->top_p * wk;
        }
        if (p->min_p > 0.0f && w[i] < (double)p->min_p)
            ok = false;
        keep[i] = ok ? w[i] : 0.0;
    }
    memcpy(w, keep, (size_t)v * sizeof *w);
    free(keep);
    free(k);
}

/* Asserts that `id` is a valid draw of row x with uniform u. */
static void expect_draw(const llmem_sample_params *p, const double *x, int32_t v, double u,
                        int32_t id, const char *what)
{
    ck_assert_msg(id >= 0 && id < v, "%s: id %d outside [0, %d)", what, id, v);
    double *w = malloc((size_t)v * sizeof *w);
    ck_assert_ptr_nonnull(w);
    ref_kept(p, x, v, w);
    double total = 0.0, before = 0.0;
    for (int32_t i = 0; i < v; i++) {
        total += w[i];
        if (i < id)
            before += w[i];
    }
    ck_assert_msg(w[id] > 0.0, "%s: token %d (logit %g) is not kept, seed %llu", what, id, x[id],
                  (unsigned long long)ref64_seed());
    double target = u * total, tol = 1e-5 * total;
    ck_assert_msg(before <= target + tol && before + w[id] >= target - tol,
                  "%s: token %d holds [%g, %g) of %g, u * W = %g, seed %llu", what, id, before,
                  before + w[id], total, target, (unsigned long long)ref64_seed());
    free(w);
}

/* Runs llmem_op_sample; returns false when a device backend lacks it. */
static bool run_sample(llmem_backend *be, int i, const llmem_sample_params *p, const double *x,
                       int32_t rows, int32_t v, const int32_t *ctr, int32_t *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor tx = th_input(&c, F32, 2, rows, v, 1, x);
    llmem_tensor tc = th_tensor(&c, I32, 1, rows, 1, 1);
    if (ctr)
        th_set_i32(&tc, ctr);
    llmem_tensor to = th_tensor(&c, I32, 1, rows, 1, 1);
    llmem_status st = llmem_op_sample(be, p, &tx, ctr ? &tc : NULL, &to);
    if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(i)) {
        printf("test_ops_sample: %s has no sample op, skipped\n", th_backend_name(i));
        th_end(&c);
        return false;
    }
    ck_assert_int_eq(st, LLMEM_OK);
    th_get_i32(&to, out);
    th_end(&c);
    return true;
}

/* Random logits; rows of odd index get values on a grid of 0.25 (ties),
 * and every row a few NaN and -inf entries. */
static void fill_logits(ref64_rng *r, double *x, int32_t rows, int32_t v, double spread)
{
    ref64_fill(r, x, (int64_t)rows * v, -spread, spread, F32);
    for (int32_t i = 0; i < rows; i++) {
        double *row = x + (int64_t)i * v;
        if (i % 2)
            for (int32_t j = 0; j < v; j++)
                row[j] = floor(row[j] * 4.0) / 4.0;
        if (v > 8) {
            row[ref64_int(r, 0, v - 1)] = NAN;
            row[ref64_int(r, 0, v - 1)] = -INFINITY;
        }
    }
}

START_TEST(test_sample_filters)
{
    static const llmem_sample_params ps[] = {
        {.temperature = 1.0f, .top_p = 1.0f},
        {.temperature = 0.7f, .top_k = 40, .top_p = 1.0f},
        {.temperature = 1.0f, .top_p = 0.9f},
        {.temperature = 1.3f, .top_p = 1.0f, .min_p = 0.05f},
        {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .min_p = 0.02f},
        {.temperature = 1.0f, .top_k = 1, .top_p = 1.0f},
        {.temperature = 2.0f, .top_k = 7, .top_p = 0.3f},
        {.temperature = 1.0f, .top_p = 0.02f},
    };
    static const int32_t shapes[][2] = {{6, 1}, {5, 37}, {8, 600}, {3, 2049}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int32_t rows = shapes[s][0], v = shapes[s][1];
        for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) {
            llmem_sample_params p = ps[q];
            p.seed = ((uint64_t)ref64_seed() << 20) ^ (uint64_t)(s * 131 + q);
            ref64_rng r = ref64_rng_make(ref64_seed(), 1000 + s * 64 + q);
            double *x = malloc((size_t)rows * v * sizeof *x);
            int32_t *ctr = malloc((size_t)rows * sizeof *ctr), *out = malloc((size_t)rows * 4);
            ck_assert(x && ctr && out);
            fill_logits(&r, x, rows, v, 6.0);
            for (int32_t i = 0; i < rows; i++)
                ctr[i] = ref64_int(&r, -1000000, 1000000);
            bool with_ctr = q % 2 == 0;
            if (!run_sample(be, _i, &p, x, rows, v, with_ctr ? ctr : NULL, out)) {
                free(x), free(ctr), free(out);
                llmem_backend_close(be);
                return;
            }
            for (int32_t i = 0; i < rows; i++) {
                char what[96];
                snprintf(what, sizeof what, "sample %zu row %d of %dx%d", q, i, rows, v);
                uint32_t c = with_ctr ? (uint32_t)ctr[i] : (uint32_t)i;
                expect_draw(&p, x + (int64_t)i * v, v, uniform(p.seed, c), out[i], what);
            }
            free(x), free(ctr), free(out);
        }
    }
    llmem_backend_close(be);
}
END_TEST

/* Greedy (temperature 0) is the argmax: first index on ties, NaN ignored;
 * the vocabulary of a real model. Same seed, same tokens; another seed,
 * other tokens. */
START_TEST(test_sample_greedy_repeat)
{
    llmem_backend *be = th_open(_i);
    int32_t rows = 4, v = 128256;
    ref64_rng r = ref64_rng_make(ref64_seed(), 2000);
    double *x = malloc((size_t)rows * v * sizeof *x);
    int32_t out[4], again[4], ref[4];
    ck_assert_ptr_nonnull(x);
    fill_logits(&r, x, rows, v, 8.0);
    for (int32_t i = 0; i < rows; i++) {
        double *row = x + (int64_t)i * v;
        int32_t a = ref64_int(&r, 0, v / 2), b = ref64_int(&r, v / 2 + 1, v - 1);
        row[a] = row[b] = 9.0;
        ref[i] = a;
    }
    llmem_sample_params g = {.temperature = 0.0f, .top_p = 1.0f};
    if (!run_sample(be, _i, &g, x, rows, v, NULL, out))
        goto out;
    for (int32_t i = 0; i < rows; i++)
        ck_assert_msg(out[i] == ref[i], "greedy row %d: %d, want %d", i, out[i], ref[i]);
    /* a real-size vocabulary through every filter */
    llmem_sample_params p = {.temperature = 0.9f, .top_k = 100, .top_p = 0.9f, .min_p = 0.01f,
                             .seed = 12345};
    for (int32_t i = 0; i < rows; i++) /* a peaked row so that the filters bite */
        for (int32_t j = 0; j < 300; j++)
            x[(int64_t)i * v + ref64_int(&r, 0, v - 1)] = ref64_uniform(&r, 8.0, 12.0);
    ck_assert(run_sample(be, _i, &p, x, rows, v, NULL, out));
    ck_assert(run_sample(be, _i, &p, x, rows, v, NULL, again));
    for (int32_t i = 0; i < rows; i++) {
        ck_assert_msg(out[i] == again[i], "row %d: %d then %d with one seed", i, out[i], again[i]);
        expect_draw(&p, x + (int64_t)i * v, v, uniform(p.seed, (uint32_t)i), out[i], "V=128256");
    }
out:
    free(x);
    llmem_backend_close(be);
}
END_TEST

/* 4096 draws of one row (counters 0..4095) follow its distribution after
 * the filters: every count within 5 standard deviations (+2) of R p_i, and
 * no dropped token drawn. */
START_TEST(test_sample_frequencies)
{
    llmem_backend *be = th_open(_i);
    enum { R = 4096, V = 12 };
    static const double row[V] = {2.0, 1.5, 1.5, 0.3, -0.5, 1.0, -2.0, 0.9, 2.2, -1.0, 0.0, -3.0};
    llmem_sample_params p = {.temperature = 0.9f, .top_k = 8, .top_p = 0.9f, .min_p = 0.05f,
                             .seed = 0x9e3779b97f4a7c15ull ^ ref64_seed()};
    double *x = malloc((size_t)R * V * sizeof *x);
    int32_t *ctr = malloc(R * sizeof *ctr), *out = malloc(R * sizeof *out);
    ck_assert(x && ctr && out);
    for (int32_t i = 0; i < R; i++) {
        memcpy(x + (int64_t)i * V, row, sizeof row);
        ctr[i] = i;
    }
    if (run_sample(be, _i, &p, x, R, V, ctr, out)) {
        double w[V], total = 0.0;
        ref_kept(&p, row, V, w);
        for (int32_t j = 0; j < V; j++)
            total += w[j];
        int32_t count[V] = {0};
        for (int32_t i = 0; i < R; i++) {
            ck_assert(out[i] >= 0 && out[i] < V);
            count[out[i]]++;
        }
        for (int32_t j = 0; j < V; j++) {
            double pj = w[j] / total, mean = R * pj, sd = sqrt(R * pj * (1 - pj));
            ck_assert_msg(fabs(count[j] - mean) <= 5 * sd + 2,
                          "token %d drawn %d times of %d, expected %.1f (p %.4f)", j, count[j], R,
                          mean, pj);
        }
    }
    free(x), free(ctr), free(out);
    llmem_backend_close(be);
}
END_TEST

/* llmem_op_logprob_gather of x [rows, v] (f32) at ids into out; false
 * when a non-cpu backend does not support it (the caller skips), any other
 * status fails the test. */
static bool run_gather(th_ctx *c, llmem_backend *be, bool may_skip, const double *x,
                       const int32_t *ids, int32_t rows, int32_t v, double *out)
{
    llmem_tensor tx = th_input(c, F32, 2, rows, v, 1, x);
    llmem_tensor ti = th_tensor(c, I32, 1, rows, 1, 1);
    th_set_i32(&ti, ids);
    llmem_tensor to = th_tensor(c, F32, 1, rows, 1, 1);
    llmem_status st = llmem_op_logprob_gather(be, &tx, &ti, &to);
    if (st == LLMEM_E_UNSUPPORTED && may_skip)
        return false;
    ck_assert_int_eq(st, LLMEM_OK);
    th_get(&to, out);
    return true;
}

START_TEST(test_logprob_gather)
{
    static const int32_t shapes[][2] = {{1, 1}, {5, 37}, {3, 32003}, {2, 128256}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int32_t rows = shapes[s][0], v = shapes[s][1];
        int64_t n = (int64_t)rows * v;
        ref64_rng r = ref64_rng_make(ref64_seed(), 3000 + s);
        th_ctx c;
        th_begin(&c, be);
        double *x = th_vec(&c, n), *lsm = th_vec(&c, v), *out = th_vec(&c, rows),
               *ref = th_vec(&c, rows);
        int32_t *ids = th_alloc(&c, (size_t)rows * sizeof *ids);
        ref64_fill(&r, x, n, -20, 20, F32);
        for (int32_t i = 0; i < rows; i++) {
            ids[i] = ref64_int(&r, 0, v - 1);
            ref64_log_softmax(x + (int64_t)i * v, v, lsm);
            ref[i] = lsm[ids[i]];
        }
        if (!run_gather(&c, be, !th_is_cpu(_i), x, ids, rows, v, out)) {
            th_end(&c);
            break;
        }
        for (int32_t i = 0; i < rows; i++)
            ck_assert_msg(fabs(out[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])),
                          "logprob_gather row %d of %dx%d: %.9g, want %.9g", i, rows, v, out[i],
                          ref[i]);
        th_end(&c);
    }
    llmem_backend_close(be);
}
END_TEST

/* logprob_gather over masked rows: -inf entries (a constraint mask) add
 * nothing to the sum and a masked id gives -inf; NaN entries are skipped
 * (as the CPU backend's row_lse does). V 4100 takes Vulkan's vec4 loads,
 * V 4099 the scalar ones. Expected: the log-sum-exp in double over the
 * finite entries, written here. */
START_TEST(test_logprob_gather_masked)
{
    static const int32_t vs[] = {4100, 4099};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof vs / sizeof vs[0]; s++) {
        int32_t rows = 4, v = vs[s];
        int64_t n = (int64_t)rows * v;
        ref64_rng r = ref64_rng_make(ref64_seed(), 3100 + s);
        th_ctx c;
        th_begin(&c, be);
        double *x = th_vec(&c, n), *out = th_vec(&c, rows), *ref = th_vec(&c, rows);
        int32_t *ids = th_alloc(&c, (size_t)rows * sizeof *ids);
        ref64_fill(&r, x, n, -20, 20, F32);
        for (int32_t i = 0; i < rows; i++) {
            double *row = x + (int64_t)i * v;
            /* rows 0, 1: a quarter masked; rows 2, 3: all but 3 entries masked */
            int32_t keep = i < 2 ? 3 * v / 4 : 3;
            for (int32_t j = 0; j < v; j++)
                if (ref64_int(&r, 0, v - 1) >= keep)
                    row[j] = -INFINITY;
            row[ref64_int(&r, 0, v - 1)] = NAN;
            row[v - 1] = 25.0; /* a finite maximum in every row */
            /* rows 0, 2: a kept id; rows 1, 3: a masked one. The id's entry
             * is set, not searched for: a row of 3 kept entries in 4,100
             * has none below v - 1 for ~5% of seeds. */
            int32_t id = ref64_int(&r, 0, v - 2);
            if (i % 2 == 1)
                row[id] = -INFINITY;
            else if (isinf(row[id]) || isnan(row[id]))
                row[id] = ref64_round(ref64_uniform(&r, -20, 20), F32);
            ids[i] = id;
            double mx = -INFINITY, sum = 0;
            for (int32_t j = 0; j < v; j++)
                if (!isnan(row[j]) && row[j] > mx)
                    mx = row[j];
            for (int32_t j = 0; j < v; j++)
                if (!isnan(row[j]) && !isinf(row[j]))
                    sum += exp(row[j] - mx);
            ref[i] = row[id] - (mx + log(sum));
        }
        if (!run_gather(&c, be, !th_is_cpu(_i), x, ids, rows, v, out)) {
            th_end(&c);
            break;
        }
        for (int32_t i = 0; i < rows; i++) {
            if (isinf(ref[i]))
                ck_assert_msg(out[i] == ref[i], "masked logprob_gather row %d of V %d: %g, want %g",
                              i, v, out[i], ref[i]);
            else
                ck_assert_msg(fabs(out[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])),
                              "masked logprob_gather row %d of V %d: %.9g, want %.9g", i, v,
                              out[i], ref[i]);
        }
        th_end(&c);
    }
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_top_logprobs)
{
    static const int32_t cases[][3] = {{1, 1, 1}, {4, 37, 5}, {3, 600, 64}, {2, 128256, 20},
                                       {3, 50, 50}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int32_t rows = cases[s][0], v = cases[s][1], k = cases[s][2];
        int64_t n = (int64_t)rows * v;
        ref64_rng r = ref64_rng_make(ref64_seed(), 4000 + s);
        th_ctx c;
        th_begin(&c, be);
        double *x = th_vec(&c, n), *lsm = th_vec(&c, v), *lp = th_vec(&c, (int64_t)rows * k);
        int32_t *ids = th_alloc(&c, (size_t)rows * k * sizeof *ids);
        ref64_fill(&r, x, n, -10, 10, F32);
        for (int32_t i = 0; i < rows; i++) /* ties on a grid in every other row */
            if (i % 2)
                for (int32_t j = 0; j < v; j++)
                    x[(int64_t)i * v + j] = floor(x[(int64_t)i * v + j]);
        llmem_tensor tx = th_input(&c, F32, 2, rows, v, 1, x);
        llmem_tensor ti = th_tensor(&c, I32, 2, rows, k, 1);
        llmem_tensor tl = th_tensor(&c, F32, 2, rows, k, 1);
        llmem_status st = llmem_op_top_logprobs(be, &tx, k, &ti, &tl);
        if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(_i)) {
            th_end(&c);
            break;
        }
        ck_assert_int_eq(st, LLMEM_OK);
        th_get_i32(&ti, ids);
        th_get(&tl, lp);
        for (int32_t i = 0; i < rows; i++) {
            const double *row = x + (int64_t)i * v;
            ref64_log_softmax(row, v, lsm);
            for (int32_t j = 0; j < k; j++) {
                int32_t id = ids[(int64_t)i * k + j];
                ck_assert_msg(id >= 0 && id < v, "top row %d rank %d: id %d", i, j, id);
                /* rank j: exactly j entries rank before it (larger, or equal
                 * with a lower index) */
                int32_t before = 0;
                for (int32_t t = 0; t < v; t++)
                    before += row[t] > row[id] || (row[t] == row[id] && t < id);
                ck_assert_msg(before == j, "top %dx%d row %d rank %d: id %d has %d before it", rows,
                              v, i, j, id, before);
                double got = lp[(int64_t)i * k + j];
                ck_assert_msg(fabs(got - lsm[id]) <= 1e-5 * (1 + fabs(lsm[id])),
                              "top row %d rank %d: %.9g, want %.9g", i, j, got, lsm[id]);
            }
        }
        th_end(&c);
    }
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_sample_arguments)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    double x[12] = {0};
    llmem_tensor tx = th_input(&c, F32, 2, 3, 4, 1, x);
    llmem_tensor to = th_tensor(&c, I32, 1, 3, 1, 1), t2 = th_tensor(&c, I32, 1, 2, 1, 1);
    llmem_tensor tf = th_tensor(&c, F32, 1, 3, 1, 1);
    llmem_tensor ids = th_tensor(&c, I32, 2, 3, 2, 1), lps = th_tensor(&c, F32, 2, 3, 2, 1);
    llmem_sample_params ok = {.temperature = 1.0f, .top_p = 1.0f};
    llmem_status st = llmem_op_sample(be, &ok, &tx, NULL, &to);
    if (st == LLMEM_E_UNSUPPORTED && !th_is_cpu(_i))
        goto out;
    ck_assert_int_eq(st, LLMEM_OK);
    llmem_sample_params bad = ok;
    bad.top_p = 0.0f;
    ck_assert_int_eq(llmem_op_sample(be, &bad, &tx, NULL, &to), LLMEM_E_INVALID);
    bad = ok;
    bad.min_p = 1.5f;
    ck_assert_int_eq(llmem_op_sample(be, &bad, &tx, NULL, &to), LLMEM_E_INVALID);
    bad = ok;
    bad.temperature = NAN;
    ck_assert_int_eq(llmem_op_sample(be, &bad, &tx, NULL, &to), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_sample(be, NULL, &tx, NULL, &to), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_sample(be, &ok, &tx, NULL, &t2), LLMEM_E_INVALID);  /* rows */
    ck_assert_int_eq(llmem_op_sample(be, &ok, &tx, &t2, &to), LLMEM_E_INVALID);   /* ctr rows */
    ck_assert_int_eq(llmem_op_sample(be, &ok, &tx, NULL, &tf), LLMEM_E_INVALID);  /* dtype */
    ck_assert_int_eq(llmem_op_sample(be, &ok, &tx, &to, &to), LLMEM_E_INVALID);   /* overlap */
    ck_assert_int_eq(llmem_op_logprob_gather(be, &tx, &tf, &tf), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_logprob_gather(be, &tx, &t2, &tf), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_top_logprobs(be, &tx, 0, &ids, &lps), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_top_logprobs(be, &tx, 3, &ids, &lps), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_top_logprobs(be, &tx, 5, &ids, &lps), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_top_logprobs(be, &tx, 2, &ids, &ids), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_top_logprobs(be, &tx, 2, &ids, &lps), LLMEM_OK);
    if (th_is_cpu(_i)) { /* an id outside the row is refused by the reference */
        int32_t bad_ids[3] = {0, 4, 1};
        th_set_i32(&to, bad_ids);
        ck_assert_int_eq(llmem_op_logprob_gather(be, &tx, &to, &tf), LLMEM_E_INVALID);
    }
out:
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

/* The FAST matmul (bf16 activations, one bf16 GEMM for bf16 weights)
 * against a float64 product: within bf16 rounding of a (2^-9 relative per
 * element, far less over a sum of random signs), at sizes that take the
 * GEMV (M <= 4) and the GEMM paths. */
START_TEST(test_matmul_fast)
{
    static const int32_t shapes[][3] = {{1, 256, 64}, {4, 512, 33}, {37, 1024, 96},
                                        {128, 2048, 64}};
    static const llmem_dtype wts[2] = {LLMEM_DTYPE_BF16, F32};
    llmem_backend *be = th_open(_i);
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
            ref64_rng r = ref64_rng_make(ref64_seed(), 5000 + d * 16 + s);
            th_ctx c;
            th_begin(&c, be);
            double *a = th_vec(&c, (int64_t)m * k), *w = th_vec(&c, (int64_t)n * k);
            double *out = th_vec(&c, (int64_t)m * n), *ref = th_vec(&c, (int64_t)m * n);
            ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
            ref64_fill(&r, w, (int64_t)n * k, -1, 1, wts[d]);
            ref64_matmul(a, w, m, k, n, ref);
            llmem_tensor ta = th_input(&c, F32, 2, m, k, 1, a);
            llmem_tensor tw = th_input(&c, wts[d], 2, n, k, 1, w);
            llmem_tensor to = th_tensor(&c, F32, 2, m, n, 1);
            ck_assert_int_eq(llmem_op_matmul_fast(be, &ta, &tw, &to), LLMEM_OK);
            th_get(&to, out);
            char what[96];
            snprintf(what, sizeof what, "matmul_fast M=%d K=%d N=%d w=%s", m, k, n,
                     llmem_dtype_name(wts[d]));
            th_expect_close(out, ref, (int64_t)m * n, 4e-3, what);
            th_end(&c);
        }
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_sample: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_sample");
    TCase *tc = tcase_create("ops_sample");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_sample_filters, 0, n);
    tcase_add_loop_test(tc, test_sample_greedy_repeat, 0, n);
    tcase_add_loop_test(tc, test_sample_frequencies, 0, n);
    tcase_add_loop_test(tc, test_logprob_gather, 0, n);
    tcase_add_loop_test(tc, test_logprob_gather_masked, 0, n);
    tcase_add_loop_test(tc, test_top_logprobs, 0, n);
    tcase_add_loop_test(tc, test_sample_arguments, 0, n);
    tcase_add_loop_test(tc, test_matmul_fast, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

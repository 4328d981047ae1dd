// ctest-labels: core
/* Op conformance suite, mixture of experts: moe_route (softmax and sigmoid
 * top-k, renormalization, group-limited selection, correction bias,
 * routed scaling) and moe_ffn (gated SiLU and plain relu² experts in f32,
 * f16 and bf16), on every available backend.
 *
 * References are float64 and written here from the definitions in
 * <llmem/ops.h> (transformers' NemotronHTopkRouter and
 * GraniteMoeHybridTopKRouter, the eager expert loops), not from the code
 * under test. Outputs start as NaN (the harness poisons every tensor), so
 * an element an op forgets to write fails the NaN check.
 *
 * Logits are drawn well apart (a random permutation of a 0.25 grid plus
 * small noise) and a token whose float64 selection margin is below 1e-4 is
 * drawn again, so a rounding difference cannot legitimately change which
 * experts are chosen: the ids must match exactly.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/ops_moe.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define I32 LLMEM_DTYPE_I32
#define MAXE 64

/* ---- float64 references ---------------------------------------------------------------- */

/* One token's routing; returns the smallest gap between a kept and a
 * dropped candidate (experts and groups), to reject near-ties. */
static double ref_route(const llmem_moe_route_params *p, const double *l, const double *bias,
                        int32_t *ids, double *w)
{
    int32_t E = p->n_expert, k = p->n_expert_used;
    int32_t G = p->n_group > 1 ? p->n_group : 1, gs = E / G;
    double s[MAXE], c[MAXE], gsc[MAXE];
    bool keep[MAXE], used[MAXE];
    double margin = INFINITY;
    if (p->scoring == LLMEM_MOE_SOFTMAX) {
        double mx = -INFINITY, sum = 0;
        for (int32_t e = 0; e < E; e++)
            mx = fmax(mx, l[e]);
        for (int32_t e = 0; e < E; e++)
            sum += exp(l[e] - mx);
        for (int32_t e = 0; e < E; e++)
            s[e] = exp(l[e] - mx) / sum;
    } else {
        for (int32_t e = 0; e < E; e++)
            s[e] = 1.0 / (1.0 + exp(-l[e]));
    }
    for (int32_t e = 0; e < E; e++) {
        c[e] = s[e] + (bias ? bias[e] : 0.0);
        used[e] = false;
    }
    for (int32_t g = 0; g < G; g++)
        keep[g] = G == 1;
    if (G > 1) {
        for (int32_t g = 0; g < G; g++) { /* top-2 sum, by sorting the group */
            double a = -INFINITY, b = -INFINITY;
            for (int32_t e = g * gs; e < (g + 1) * gs; e++) {
                if (c[e] > a) {
                    b = a;
                    a = c[e];
                } else if (c[e] > b) {
                    b = c[e];
                }
            }
            gsc[g] = a + b;
        }
        for (int32_t n = 0; n < p->topk_group; n++) {
            int32_t best = -1;
            for (int32_t g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gsc[g] > gsc[best]))
                    best = g;
            keep[best] = true;
        }
        for (int32_t g = 0; g < G; g++)
            for (int32_t h = 0; h < G; h++)
                if (keep[g] && !keep[h])
                    margin = fmin(margin, gsc[g] - gsc[h]);
    }
    double sum = 0;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++)
            if (keep[e / gs] && !used[e] && (best < 0 || c[e] > c[best]))
                best = e;
        used[best] = true;
        ids[j] = best;
        w[j] = s[best];
        sum += s[best];
    }
    for (int32_t a = 0; a < E; a++) /* kept experts vs. selectable dropped ones, and order */
        for (int32_t b = 0; b < E; b++)
            if (a != b && keep[a / gs] && keep[b / gs] && (used[a] || used[b]))
                margin = fmin(margin, fabs(c[a] - c[b]));
    for (int32_t j = 0; j < k; j++)
        w[j] = (p->norm_topk ? w[j] / (sum + 1e-20) : w[j]) * p->scale;
    return margin;
}

static double ref_act(llmem_moe_act a, double v)
{
    return a == LLMEM_MOE_ACT_RELU2 ? (v > 0 ? v * v : 0.0) : v / (1.0 + exp(-v));
}

/* out[t] = sum_j w[t,j] * down[e] · h(e, x[t]) in float64. */
static void ref_ffn(const llmem_moe_ffn_params *p, int32_t T, int32_t D, int32_t I, int32_t k,
                    const double *x, const int32_t *ids, const double *w, const double *up,
                    const double *down, double *out)
{
    int32_t rows = p->gated ? 2 * I : I;
    double *h = malloc((size_t)I * sizeof *h);
    for (int32_t t = 0; t < T; t++) {
        for (int32_t d = 0; d < D; d++)
            out[t * D + d] = 0;
        for (int32_t j = 0; j < k; j++) {
            int32_t e = ids[t * k + j];
            const double *ue = up + (size_t)e * rows * D, *de = down + (size_t)e * D * I;
            for (int32_t i = 0; i < I; i++) {
                double u = 0, g = 0;
                for (int32_t d = 0; d < D; d++) {
                    u += ue[(size_t)((p->gated ? I : 0) + i) * D + d] * x[t * D + d];
                    if (p->gated)
                        g += ue[(size_t)i * D + d] * x[t * D + d];
                }
                h[i] = p->gated ? ref_act(p->act, g) * u : ref_act(p->act, u);
            }
            for (int32_t d = 0; d < D; d++) {
                double y = 0;
                for (int32_t i = 0; i < I; i++)
                    y += de[(size_t)d * I + i] * h[i];
                out[t * D + d] += w[t * k + j] * y;
            }
        }
    }
    free(h);
}

/* ---- moe_route ------------------------------------------------------------------------------- */

static const llmem_moe_route_params route_cases[] = {
    /* Granite-MoE: softmax over the top-k logits */
    {.n_expert = 16, .n_expert_used = 4, .scoring = LLMEM_MOE_SOFTMAX, .norm_topk = true,
     .scale = 1.0f},
    /* Qwen2-MoE style: softmax, no renormalization, k = 1 */
    {.n_expert = 8, .n_expert_used = 1, .scoring = LLMEM_MOE_SOFTMAX, .scale = 1.0f},
    /* Nemotron-H / DeepSeek-V3: sigmoid, bias, 4 groups keep 2, renorm, scaling */
    {.n_expert = 32, .n_expert_used = 6, .scoring = LLMEM_MOE_SIGMOID, .norm_topk = true,
     .n_group = 4, .topk_group = 2, .scale = 2.5f},
    /* sigmoid without groups or renormalization, all experts kept */
    {.n_expert = 6, .n_expert_used = 6, .scoring = LLMEM_MOE_SIGMOID, .scale = 1.0f},
    /* one group kept of 8, groups of 2 */
    {.n_expert = 16, .n_expert_used = 2, .scoring = LLMEM_MOE_SIGMOID, .norm_topk = true,
     .n_group = 8, .topk_group = 1, .scale = 1.5f},
};

START_TEST(test_moe_route)
{
    llmem_backend *be = th_open(_i);
    int ncase = (int)(sizeof route_cases / sizeof route_cases[0]);
    for (int ci = 0; ci < ncase; ci++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const llmem_moe_route_params *p = &route_cases[ci];
            int32_t E = p->n_expert, k = p->n_expert_used, T = ci == 1 ? 1 : 37;
            ref64_rng r = ref64_rng_make(ref64_seed(), 700 + ci * 2 + with_bias);
            th_ctx h;
            th_begin(&h, be);
            double *l = th_vec(&h, (int64_t)T * E), *bias = th_vec(&h, E);
            double *wref = th_vec(&h, (int64_t)T * k), *wout = th_vec(&h, (int64_t)T * k);
            int32_t *idref = th_alloc(&h, (size_t)T * k * 4), *idout = th_alloc(&h, (size_t)T * k * 4);
            int32_t perm[MAXE];
            for (int32_t e = 0; e < E; e++) /* bias steps of 1/16: exact in bf16 */
                bias[e] = with_bias ? 0.0625 * ref64_int(&r, -4, 4) : 0.0;
            for (int32_t t = 0; t < T; t++) {
                for (int tries = 0;; tries++) {
                    for (int32_t e = 0; e < E; e++)
                        perm[e] = e;
                    ref64_shuffle(&r, perm, E);
                    for (int32_t e = 0; e < E; e++)
                        l[t * E + e] = ref64_round(0.25 * perm[e] - 0.125 * E +
                                                   ref64_uniform(&r, 0, 0.05), F32);
                    if (ref_route(p, l + t * E, with_bias ? bias : NULL, idref + t * k,
                                  wref + t * k) > 1e-4)
                        break;
                    ck_assert_int_lt(tries, 100);
                }
            }
            llmem_tensor tl = th_input(&h, F32, 2, T, E, 1, l);
            llmem_tensor tb = th_input(&h, BF16, 1, E, 1, 1, bias);
            llmem_tensor ti = th_tensor(&h, I32, 2, T, k, 1), tw = th_tensor(&h, F32, 2, T, k, 1);
            if (with_bias) { /* the reference uses the bf16 values of the bias */
                th_get(&tb, bias);
                for (int32_t t = 0; t < T; t++)
                    ck_assert(ref_route(p, l + t * E, bias, idref + t * k, wref + t * k) > 5e-5);
            }
            ck_assert_int_eq(llmem_op_moe_route(be, p, &tl, with_bias ? &tb : NULL, &ti, &tw),
                             LLMEM_OK);
            th_get_i32(&ti, idout);
            th_get(&tw, wout);
            for (int32_t q = 0; q < T * k; q++)
                ck_assert_msg(idout[q] == idref[q], "case %d bias %d: token %d choice %d: id %d, want %d",
                              ci, with_bias, q / k, q % k, idout[q], idref[q]);
            char what[64];
            snprintf(what, sizeof what, "moe_route case %d bias %d", ci, with_bias);
            th_expect_close(wout, wref, (int64_t)T * k, ref64_tol(F32, !th_is_cpu(_i)), what);
            th_end(&h);
        }
    }
    llmem_backend_close(be);
}
END_TEST

/* Bad parameters and shapes are LLMEM_E_INVALID and leave outputs alone. */
START_TEST(test_moe_route_invalid)
{
    llmem_backend *be = th_open(_i);
    th_ctx h;
    th_begin(&h, be);
    llmem_tensor tl = th_tensor(&h, F32, 2, 3, 8, 1), ti = th_tensor(&h, I32, 2, 3, 2, 1);
    llmem_tensor tw = th_tensor(&h, F32, 2, 3, 2, 1), tw3 = th_tensor(&h, F32, 2, 3, 3, 1);
    llmem_moe_route_params ok = {.n_expert = 8, .n_expert_used = 2, .scale = 1.0f};
    llmem_moe_route_params bad[] = {ok, ok, ok, ok, ok};
    bad[0].n_expert_used = 9;
    bad[1].n_group = 3; /* 8 % 3 != 0 */
    bad[2].n_group = 8; /* groups of one */
    bad[3].n_group = 4, bad[3].topk_group = 5;
    bad[4].scoring = (llmem_moe_scoring)7;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_int_eq(llmem_op_moe_route(be, &bad[i], &tl, NULL, &ti, &tw), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_moe_route(be, &ok, &tl, NULL, &ti, &tw3), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_moe_route(be, &ok, &tl, NULL, &tw, &tw), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_moe_route(be, NULL, &tl, NULL, &ti, &tw), LLMEM_E_INVALID);
    double out[6];
    th_get(&tw, out);
    for (int i = 0; i < 6; i++)
        ck_assert(isnan(out[i]));
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

/* ---- moe_ffn --------------------------------------------------------------------------------- */

START_TEST(test_moe_ffn)
{
    static const struct {
        int32_t T, D, I, E, k;
        bool gated;
        llmem_moe_act act;
    } cases[] = {
        {1, 24, 12, 6, 2, true, LLMEM_MOE_ACT_SILU},    /* decode */
        {7, 40, 20, 8, 3, true, LLMEM_MOE_ACT_SILU},    /* Granite-style */
        {5, 33, 17, 5, 2, false, LLMEM_MOE_ACT_RELU2},  /* Nemotron-H-style, odd sizes */
        {40, 64, 48, 16, 4, true, LLMEM_MOE_ACT_SILU},  /* prefill: many tokens per expert */
        {3, 16, 8, 1, 1, false, LLMEM_MOE_ACT_SILU},    /* a shared expert as E = 1 */
    };
    static const llmem_dtype types[] = {F32, F16, BF16};
    llmem_backend *be = th_open(_i);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        for (int d = 0; d < 3; d++) {
            int32_t T = cases[ci].T, D = cases[ci].D, I = cases[ci].I, E = cases[ci].E,
                    k = cases[ci].k;
            llmem_moe_ffn_params p = {.act = cases[ci].act, .gated = cases[ci].gated};
            int32_t rows = p.gated ? 2 * I : I;
            ref64_rng r = ref64_rng_make(ref64_seed(), 800 + ci * 3 + d);
            th_ctx h;
            th_begin(&h, be);
            double *x = th_vec(&h, (int64_t)T * D), *w = th_vec(&h, (int64_t)T * k);
            double *up = th_vec(&h, (int64_t)E * rows * D), *down = th_vec(&h, (int64_t)E * D * I);
            double *out = th_vec(&h, (int64_t)T * D), *ref = th_vec(&h, (int64_t)T * D);
            int32_t *ids = th_alloc(&h, (size_t)T * k * 4);
            ref64_fill(&r, x, (int64_t)T * D, -1, 1, F32);
            ref64_fill(&r, w, (int64_t)T * k, 0.05, 1, F32);
            ref64_fill(&r, up, (int64_t)E * rows * D, -0.5, 0.5, types[d]);
            ref64_fill(&r, down, (int64_t)E * D * I, -0.5, 0.5, types[d]);
            for (int32_t t = 0; t < T; t++) { /* k distinct experts per token */
                int32_t perm[MAXE];
                for (int32_t e = 0; e < E; e++)
                    perm[e] = e;
                ref64_shuffle(&r, perm, E);
                memcpy(ids + t * k, perm, (size_t)k * 4);
            }
            llmem_tensor tx = th_input(&h, F32, 2, T, D, 1, x);
            llmem_tensor tw = th_input(&h, F32, 2, T, k, 1, w);
            llmem_tensor ti = th_tensor(&h, I32, 2, T, k, 1);
            th_set_i32(&ti, ids);
            llmem_tensor tu = th_input(&h, types[d], 3, E, rows, D, up);
            llmem_tensor td = th_input(&h, types[d], 3, E, D, I, down);
            llmem_tensor to = th_tensor(&h, F32, 2, T, D, 1);
            ck_assert_int_eq(llmem_op_moe_ffn(be, &p, &tx, &ti, &tw, &tu, &td, &to), LLMEM_OK);
            th_get(&to, out);
            ref_ffn(&p, T, D, I, k, x, ids, w, up, down, ref);
            char what[96];
            snprintf(what, sizeof what, "moe_ffn T=%d D=%d I=%d E=%d k=%d w=%s", T, D, I, E, k,
                     llmem_dtype_name(types[d]));
            th_expect_close(out, ref, (int64_t)T * D, ref64_tol(F32, !th_is_cpu(_i)), what);
            th_end(&h);
        }
    }
    llmem_backend_close(be);
}
END_TEST

/* Shape errors are LLMEM_E_INVALID; on the CPU an id outside [0, E) is
 * LLMEM_E_INVALID too, and no backend writes past the output. */
START_TEST(test_moe_ffn_invalid)
{
    llmem_backend *be = th_open(_i);
    th_ctx h;
    th_begin(&h, be);
    int32_t T = 2, D = 8, I = 4, E = 3, k = 2;
    llmem_moe_ffn_params p = {.act = LLMEM_MOE_ACT_SILU, .gated = true};
    double x[16] = {0}, w[4] = {1, 1, 1, 1};
    llmem_tensor tx = th_input(&h, F32, 2, T, D, 1, x), tw = th_input(&h, F32, 2, T, k, 1, w);
    llmem_tensor ti = th_tensor(&h, I32, 2, T, k, 1);
    llmem_tensor tu = th_tensor(&h, F32, 3, E, 2 * I, D), td = th_tensor(&h, F32, 3, E, D, I);
    llmem_tensor tu1 = th_tensor(&h, F32, 3, E, I, D), td16 = th_tensor(&h, F16, 3, E, D, I);
    llmem_tensor to = th_tensor(&h, F32, 2, T, D, 1);
    ck_assert_int_eq(llmem_op_moe_ffn(be, &p, &tx, &ti, &tw, &tu1, &td, &to), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_moe_ffn(be, &p, &tx, &ti, &tw, &tu, &td16, &to), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_moe_ffn(be, &p, &tx, &ti, &tw, &tu, &td, &tx), LLMEM_E_INVALID);
    if (th_is_cpu(_i)) {
        int32_t bad_ids[4] = {0, 1, 3, 0};
        th_set_i32(&ti, bad_ids);
        ck_assert_int_eq(llmem_op_moe_ffn(be, &p, &tx, &ti, &tw, &tu, &td, &to), LLMEM_E_INVALID);
    }
    th_end(&h); /* guards intact */
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_moe: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_moe");
    TCase *tc = tcase_create("moe");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_moe_route, 0, n);
    tcase_add_loop_test(tc, test_moe_route_invalid, 0, n);
    tcase_add_loop_test(tc, test_moe_ffn, 0, n);
    tcase_add_loop_test(tc, test_moe_ffn_invalid, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

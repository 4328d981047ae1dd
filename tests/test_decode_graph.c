// ctest-labels: core
/* Recorded decode steps (models/decode_graph.c, issue 11 item 2), on every
 * backend that opens ($LLMEM_TEST_BACKENDS, default "cpu,vulkan,cuda"),
 * with the bamba (hybrid: KV + recurrent views) and llama fixtures.
 *
 * Two fresh models run the same schedule of greedy decode steps: one with
 * LLMEM_NO_GRAPHS=1 (every step eager), one with recorded steps. Sequences
 * join (a prompt in the same batch as other sequences' decode tokens) and
 * leave (llmem_memory_seq_rm) between steps, so the batch size changes and
 * recordings are made, replayed and skipped. The reference is the eager
 * model: every output row's logits must match it (bitwise on cpu, whose
 * replay re-runs the ops; within 1e-3 elsewhere) and so must the greedy
 * token chosen from them; the recorded model must have replayed steps.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/memory.h"
#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/ops_harness.h"

static const char *fixtures[] = {"bamba", "llama"};

enum { N_SEQ = 4, N_STEP = 14, PROMPT = 5, MAX_TOK = N_SEQ * PROMPT };

static llmem_model *load(llmem_backend *be, const char *fx)
{
    char dir[1024], err[256] = "";
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", test_source_dir(), fx);
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = N_SEQ;
    p.n_ctx = 256;
    p.precision = LLMEM_PRECISION_PRECISE;
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s: %s", fx,
                  err);
    return m;
}

/* Sequence s is active in steps [join[s], leave[s]); at its first step it
 * sends a PROMPT-token prompt, later its last greedy token. */
static const int32_t join[N_SEQ] = {0, 0, 3, 6};
static const int32_t leave[N_SEQ] = {N_STEP, 9, N_STEP, 12};

/* Runs the schedule; logits of every output row go to out (rows in step
 * order, [n_rows][v]), *n_rows counts them. */
static void run(llmem_model *m, float *out, int32_t *n_rows)
{
    int32_t v = llmem_model_n_vocab(m);
    int32_t last[N_SEQ] = {0}, npos[N_SEQ] = {0};
    int32_t tok[MAX_TOK], pos[MAX_TOK], seq[MAX_TOK];
    const int32_t *seqp[MAX_TOK];
    int8_t outf[MAX_TOK];
    int32_t row_seq[N_SEQ];
    float *logits = malloc((size_t)N_SEQ * v * sizeof *logits);
    ck_assert_ptr_nonnull(logits);
    char err[256] = "";
    *n_rows = 0;
    for (int32_t step = 0; step < N_STEP; step++) {
        int32_t n = 0, n_out = 0;
        for (int32_t s = 0; s < N_SEQ; s++) {
            if (step == leave[s])
                ck_assert_int_eq(llmem_memory_seq_rm(llmem_model_memory(m), s, -1, -1), LLMEM_OK);
            if (step < join[s] || step >= leave[s])
                continue;
            int32_t k = step == join[s] ? PROMPT : 1;
            for (int32_t j = 0; j < k; j++) {
                tok[n] = k > 1 ? (int32_t)((s * 977u + j * 31u + 7u) % (uint32_t)v) : last[s];
                seq[n] = s;
                seqp[n] = &seq[n];
                pos[n] = npos[s]++;
                outf[n] = j == k - 1;
                n++;
            }
            row_seq[n_out++] = s;
        }
        llmem_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = seqp, .output = outf};
        int32_t got = 0;
        ck_assert_msg(llmem_model_decode(m, &b, false, logits, N_SEQ, &got, err, sizeof err) ==
                          LLMEM_OK, "step %d: %s", step, err);
        ck_assert_int_eq(got, n_out);
        for (int32_t r = 0; r < n_out; r++) {
            const float *x = logits + (size_t)r * v;
            int32_t best = 0;
            for (int32_t j = 1; j < v; j++)
                best = x[j] > x[best] ? j : best;
            last[row_seq[r]] = best;
            memcpy(out + (size_t)(*n_rows)++ * v, x, (size_t)v * sizeof *x);
        }
    }
    free(logits);
}

START_TEST(test_recorded_equals_eager)
{
    llmem_backend *be = th_open(_i);
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        llmem_model *me = load(be, fixtures[f]), *mr = load(be, fixtures[f]);
        int32_t v = llmem_model_n_vocab(me), ne = 0, nr = 0;
        size_t cap = (size_t)N_STEP * N_SEQ * v;
        float *le = malloc(cap * sizeof *le), *lr = malloc(cap * sizeof *lr);
        ck_assert(le && lr);
        setenv("LLMEM_NO_GRAPHS", "1", 1); /* read at the model's first step */
        run(me, le, &ne);
        unsetenv("LLMEM_NO_GRAPHS");
        run(mr, lr, &nr);
        ck_assert_int_eq(ne, nr);
        double tol = th_is_cpu(_i) ? 0.0 : 1e-3;
        for (int32_t r = 0; r < ne; r++) {
            const float *a = le + (size_t)r * v, *b = lr + (size_t)r * v;
            int32_t ba = 0, bb = 0;
            for (int32_t j = 0; j < v; j++) {
                ck_assert_msg(fabs((double)a[j] - b[j]) <= tol * (1 + fabs(a[j])),
                              "%s %s row %d token %d: eager %g, recorded %g", fixtures[f],
                              th_backend_name(_i), r, j, a[j], b[j]);
                ba = a[j] > a[ba] ? j : ba;
                bb = b[j] > b[bb] ? j : bb;
            }
            ck_assert_int_eq(ba, bb);
        }
        llmem_model_stats se, sr;
        llmem_model_get_stats(me, &se);
        llmem_model_get_stats(mr, &sr);
        ck_assert_int_eq(se.n_replayed, 0);
        ck_assert_int_eq(se.n_recorded, 0);
        ck_assert_int_gt(sr.n_recorded, 1); /* several batch sizes */
        ck_assert_int_gt(sr.n_replayed, 3);
        ck_assert_int_eq(sr.n_ubatch, se.n_ubatch);
        printf("%s %s: %d rows equal, %lld recorded, %lld replayed of %lld ubatches\n",
               fixtures[f], th_backend_name(_i), ne, (long long)sr.n_recorded,
               (long long)sr.n_replayed, (long long)sr.n_ubatch);
        free(le);
        free(lr);
        llmem_model_free(me);
        llmem_model_free(mr);
    }
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    int n = th_backends_probe();
    Suite *s = suite_create("decode_graph");
    TCase *tc = tcase_create("decode_graph");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_recorded_equals_eager, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

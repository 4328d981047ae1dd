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
 *
 * test_recorded_fork_prefix covers the recorded step's snapshot path: with
 * the prefix cache on, fixture cases are fed one token a step (teacher
 * forcing); a sequence is forked (llmem_memory_seq_cp) mid-generation and
 * both continue (their first step reads one recurrent state for two
 * groups, and a shared partial KV page is copied before it is written),
 * recurrent snapshots and full pages are published while steps replay, and
 * a sequence joins whose prompt hits them. Every row must match the eager
 * model (as above) and the float64 transformers log-probabilities of
 * reference.jsonl (within 1e-4; precise f32 lands within ~1e-5).
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
#include "support/fixture_case.h"
#include "support/ops_harness.h"

static const char *fixtures[] = {"bamba", "llama"};

enum { N_SEQ = 4, N_STEP = 14, PROMPT = 5, MAX_TOK = N_SEQ * PROMPT };

static llmem_model *load(llmem_backend *be, const char *fx, int64_t prefix_cache_bytes)
{
    char dir[1024], err[256] = "";
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", test_source_dir(), fx);
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = N_SEQ;
    p.n_ctx = 256;
    p.precision = LLMEM_PRECISION_PRECISE;
    p.prefix_cache_bytes = prefix_cache_bytes;
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s: %s", fx,
                  err);
    return m;
}

/* Two fresh models of one fixture: eager (LLMEM_NO_GRAPHS=1, read when a
 * model is built) and recorded, with room for `rows` output rows of each. */
typedef struct pair {
    llmem_model *me, *mr;
    float *le, *lr;
    int32_t v;
} pair;

static pair pair_load(llmem_backend *be, const char *fx, int64_t prefix_cache_bytes, size_t rows)
{
    pair p;
    setenv("LLMEM_NO_GRAPHS", "1", 1);
    p.me = load(be, fx, prefix_cache_bytes);
    unsetenv("LLMEM_NO_GRAPHS");
    p.mr = load(be, fx, prefix_cache_bytes);
    p.v = llmem_model_n_vocab(p.me);
    p.le = malloc(rows * (size_t)p.v * sizeof *p.le);
    p.lr = malloc(rows * (size_t)p.v * sizeof *p.lr);
    ck_assert(p.le && p.lr);
    return p;
}

static void pair_free(pair *p)
{
    free(p->le);
    free(p->lr);
    llmem_model_free(p->me);
    llmem_model_free(p->mr);
}

/* Row r of both runs: equal bitwise on cpu (whose replay re-runs the ops),
 * within 1e-3 relative elsewhere. */
static void assert_row_equal(int i, const char *fx, const pair *p, int32_t r)
{
    double tol = th_is_cpu(i) ? 0.0 : 1e-3;
    const float *a = p->le + (size_t)r * p->v, *b = p->lr + (size_t)r * p->v;
    for (int32_t j = 0; j < p->v; j++)
        ck_assert_msg(fabs((double)a[j] - b[j]) <= tol * (1 + fabs(a[j])),
                      "%s %s row %d token %d: eager %g, recorded %g", fx, th_backend_name(i), r,
                      j, a[j], b[j]);
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
        pair p = pair_load(be, fixtures[f], 0, (size_t)N_STEP * N_SEQ);
        int32_t v = p.v, ne = 0, nr = 0;
        /* the variable counts when a model is built, not at its steps:
         * me (built with it) stays eager, mr (built without) records */
        run(p.me, p.le, &ne);
        setenv("LLMEM_NO_GRAPHS", "1", 1);
        run(p.mr, p.lr, &nr);
        unsetenv("LLMEM_NO_GRAPHS");
        ck_assert_int_eq(ne, nr);
        for (int32_t r = 0; r < ne; r++) {
            assert_row_equal(_i, fixtures[f], &p, r);
            const float *a = p.le + (size_t)r * v, *b = p.lr + (size_t)r * v;
            int32_t ba = 0, bb = 0;
            for (int32_t j = 0; j < v; j++) {
                ba = a[j] > a[ba] ? j : ba;
                bb = b[j] > b[bb] ? j : bb;
            }
            ck_assert_int_eq(ba, bb);
        }
        llmem_model_stats se, sr;
        llmem_model_get_stats(p.me, &se);
        llmem_model_get_stats(p.mr, &sr);
        ck_assert_int_eq(se.n_replayed, 0);
        ck_assert_int_eq(se.n_recorded, 0);
        ck_assert_int_gt(sr.n_recorded, 1); /* several batch sizes */
        ck_assert_int_gt(sr.n_replayed, 3);
        ck_assert_int_eq(sr.n_ubatch, se.n_ubatch);
        printf("%s %s: %d rows equal, %lld recorded, %lld replayed of %lld ubatches\n",
               fixtures[f], th_backend_name(_i), ne, (long long)sr.n_recorded,
               (long long)sr.n_replayed, (long long)sr.n_ubatch);
        pair_free(&p);
    }
    llmem_backend_close(be);
}
END_TEST

/* ---- forks and prefix-cache snapshots under recorded steps ---------------- */

enum { F_STEPS = 30, F_CAP = 160, F_ROWS = F_STEPS * N_SEQ };

/* One sequence of the fork schedule: it follows fixture case `id`, sends
 * tok[0..prompt) at step `join` (a prefix-cache hit for seq 2), then one
 * token a step until step `leave` or its case ends. Seq 1 is made at step
 * `join` by forking seq 0 (which then holds fork_at tokens), not by a
 * prompt. */
typedef struct fseq {
    const char *id;
    int32_t join, leave, prompt;
    int32_t n, tok[F_CAP];
    double ref[F_CAP];
} fseq;

enum { FORK_AT = 100 };

static void fork_cases(const char *fx, fseq *q)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", test_source_dir(), fx);
    /* prefix_a/b/c share their first 100 tokens; dup_a is unrelated */
    const fseq init[N_SEQ] = {
        {.id = "prefix_a", .join = 0, .leave = F_STEPS, .prompt = 88},
        {.id = "prefix_b", .join = 13, .leave = F_STEPS, .prompt = FORK_AT},
        {.id = "prefix_c", .join = 16, .leave = F_STEPS, .prompt = 110},
        {.id = "dup_a", .join = 0, .leave = 10, .prompt = 20},
    };
    for (int32_t s = 0; s < N_SEQ; s++) {
        q[s] = init[s];
        q[s].n = fx_case_load(dir, q[s].id, q[s].tok, q[s].ref, F_CAP);
        ck_assert_msg(q[s].n > q[s].prompt, "%s: case %s", fx, q[s].id);
    }
    /* seq 0 feeds position 87 + step at step >= 1: it holds FORK_AT tokens
     * after step FORK_AT - 88, so the fork comes right after that step */
    ck_assert_int_eq(q[1].join, FORK_AT - q[0].prompt + 1);
    for (int32_t i = 0; i < FORK_AT; i++)
        ck_assert_int_eq(q[0].tok[i], q[1].tok[i]);
}

/* Runs the fork schedule on m with log_softmax rows; rows go to out
 * ([n_rows][v], step order), the position and sequence of each to pos_out
 * and seq_out. */
static void run_fork(llmem_model *m, const fseq *q, float *out, int32_t *pos_out,
                     int32_t *seq_out, int32_t *n_rows)
{
    int32_t v = llmem_model_n_vocab(m);
    llmem_memory *mem = llmem_model_memory(m);
    int32_t npos[N_SEQ] = {0};
    int32_t tok[F_CAP * 2], pos[F_CAP * 2], seq[F_CAP * 2], row_seq[N_SEQ], row_pos[N_SEQ];
    const int32_t *seqp[F_CAP * 2];
    int8_t outf[F_CAP * 2];
    float *rows = malloc((size_t)N_SEQ * v * sizeof *rows);
    ck_assert_ptr_nonnull(rows);
    char err[256] = "";
    *n_rows = 0;
    for (int32_t step = 0; step < F_STEPS; step++) {
        int32_t n = 0, n_out = 0;
        if (step == q[1].join) { /* before seq 0 sends its next token */
            ck_assert_int_eq(npos[0], FORK_AT);
            ck_assert_int_eq(llmem_memory_seq_cp(mem, 0, 1, -1, -1), LLMEM_OK);
            npos[1] = FORK_AT;
        }
        for (int32_t s = 0; s < N_SEQ; s++) {
            if (step == q[s].leave || (step > q[s].join && npos[s] >= q[s].n)) {
                if (npos[s] > 0)
                    ck_assert_int_eq(llmem_memory_seq_rm(mem, s, -1, -1), LLMEM_OK);
                npos[s] = 0;
                continue;
            }
            if (step < q[s].join || step > q[s].leave || (step > q[s].join && npos[s] == 0))
                continue;
            int32_t k = step == q[s].join && s != 1 ? q[s].prompt : 1;
            for (int32_t j = 0; j < k; j++) {
                tok[n] = q[s].tok[npos[s]];
                seq[n] = s;
                seqp[n] = &seq[n];
                pos[n] = npos[s]++;
                outf[n] = j == k - 1;
                n++;
            }
            row_seq[n_out] = s;
            row_pos[n_out++] = npos[s] - 1;
        }
        llmem_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = seqp, .output = outf};
        int32_t got = 0;
        ck_assert_msg(llmem_model_decode(m, &b, true, rows, N_SEQ, &got, err, sizeof err) ==
                          LLMEM_OK, "step %d: %s", step, err);
        ck_assert_int_eq(got, n_out);
        for (int32_t r = 0; r < n_out; r++) {
            seq_out[*n_rows] = row_seq[r];
            pos_out[*n_rows] = row_pos[r];
            memcpy(out + (size_t)(*n_rows)++ * v, rows + (size_t)r * v, (size_t)v * sizeof *rows);
        }
    }
    free(rows);
}

START_TEST(test_recorded_fork_prefix)
{
    llmem_backend *be = th_open(_i);
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        fseq q[N_SEQ];
        fork_cases(fixtures[f], q);
        pair p = pair_load(be, fixtures[f], 4 << 20, F_ROWS);
        int32_t ne = 0, nr = 0, pe[F_ROWS], se[F_ROWS], pr[F_ROWS], sr[F_ROWS];
        run_fork(p.me, q, p.le, pe, se, &ne);
        run_fork(p.mr, q, p.lr, pr, sr, &nr);
        ck_assert_int_eq(ne, nr);
        double worst = 0;
        int32_t n_ref = 0, n_fork = 0;
        for (int32_t r = 0; r < ne; r++) {
            ck_assert_int_eq(pe[r], pr[r]);
            ck_assert_int_eq(se[r], sr[r]);
            assert_row_equal(_i, fixtures[f], &p, r);
            const float *b = p.lr + (size_t)r * p.v;
            const fseq *c = &q[se[r]];
            if (pe[r] + 1 >= c->n)
                continue;
            double want = c->ref[pe[r]], got = b[c->tok[pe[r] + 1]];
            worst = fmax(worst, fabs(got - want));
            ck_assert_msg(fabs(got - want) <= 1e-4,
                          "%s %s seq %d (%s) pos %d: log p %.6f, float64 reference %.6f",
                          fixtures[f], th_backend_name(_i), se[r], c->id, pe[r], got, want);
            n_ref++;
            n_fork += se[r] == 1;
        }
        ck_assert_int_gt(n_fork, 10);
        llmem_model_stats st;
        llmem_model_get_stats(p.mr, &st);
        ck_assert_int_gt(st.n_recorded, 1);
        ck_assert_int_gt(st.n_replayed, 10);
        llmem_memory_stats ms;
        ck_assert_int_eq(llmem_memory_get_stats(llmem_model_memory(p.mr), &ms), LLMEM_OK);
        /* seq 2's prompt took at least the 96 tokens seq 0 published in full
         * pages (and, in the hybrid, a snapshot at 96) during decode steps */
        ck_assert_int_ge(ms.prefix_hit_tokens, 96);
        ck_assert_int_gt(ms.cow_copies, 0); /* the fork's shared partial page */
        if (strcmp(fixtures[f], "bamba") == 0)
            ck_assert_int_ge(ms.snapshot_hit_tokens, 96);
        printf("%s %s fork: %d rows equal, %d within %.2g of float64 (%d of the fork), "
               "%lld recorded, %lld replayed, prefix hit %lld, snapshot hit %lld, %lld copied on write\n",
               fixtures[f], th_backend_name(_i), ne, n_ref, worst, n_fork,
               (long long)st.n_recorded, (long long)st.n_replayed,
               (long long)ms.prefix_hit_tokens, (long long)ms.snapshot_hit_tokens,
               (long long)ms.cow_copies);
        pair_free(&p);
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
    tcase_add_loop_test(tc, test_recorded_fork_prefix, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

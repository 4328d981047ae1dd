// ctest-labels: core
/* Recorded op sequences (llmem_backend_record, <llmem/backend.h>) on every
 * backend: a recorded step (matmul, RMS norm, add, SiLU) replayed with new
 * input contents equals the float64 definition of the step on those inputs
 * (so the replay really ran on the new contents) and, bit for bit, the same
 * ops run eagerly; the cpu backend re-runs the callback, CUDA replays a
 * graph, Vulkan a reusable command buffer; an unrecordable call
 * (synchronize) fails the recording on a backend that records natively;
 * arguments are checked.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend.h"
#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

enum { M = 3, K = 40, N = 24 };

typedef struct step {
    llmem_backend *be;
    llmem_tensor x, w, g, b, h, out;
    int calls;
} step;

static llmem_status run_step(void *ctx)
{
    step *s = ctx;
    s->calls++;
    llmem_status st = llmem_op_matmul(s->be, &s->x, &s->w, &s->h);
    if (st == LLMEM_OK)
        st = llmem_op_rms_norm(s->be, &s->h, &s->g, 1e-5f, &s->h);
    if (st == LLMEM_OK)
        st = llmem_op_add(s->be, &s->h, &s->b, &s->out);
    if (st == LLMEM_OK)
        st = llmem_op_silu(s->be, &s->out, &s->out);
    return st;
}

/* float64 definition: silu(rmsnorm(x · wᵀ) * g + b). */
static void ref_step(const double *x, const double *w, const double *g, const double *b,
                     double *out)
{
    for (int m = 0; m < M; m++) {
        double h[N], ss = 0;
        for (int n = 0; n < N; n++) {
            h[n] = 0;
            for (int k = 0; k < K; k++)
                h[n] += x[m * K + k] * w[n * K + k];
            ss += h[n] * h[n];
        }
        double r = 1.0 / sqrt(ss / N + 1e-5);
        for (int n = 0; n < N; n++) {
            double v = h[n] * r * g[n] + b[n];
            out[m * N + n] = v / (1.0 + exp(-v));
        }
    }
}

static llmem_status sync_only(void *ctx)
{
    return llmem_backend_synchronize(((step *)ctx)->be);
}

START_TEST(test_record_replay)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    ref64_rng rng = ref64_rng_make(ref64_seed(), 71);
    double *x = th_vec(&c, M * K), *w = th_vec(&c, N * K), *g = th_vec(&c, N),
           *b = th_vec(&c, N), *ref = th_vec(&c, M * N), *got = th_vec(&c, M * N),
           *eager = th_vec(&c, M * N);
    ref64_fill(&rng, w, N * K, -0.5, 0.5, LLMEM_DTYPE_F32);
    ref64_fill(&rng, g, N, 0.5, 1.5, LLMEM_DTYPE_F32);
    ref64_fill(&rng, b, N, -0.5, 0.5, LLMEM_DTYPE_F32);
    ref64_fill(&rng, x, M * K, -1, 1, LLMEM_DTYPE_F32);
    step s = {.be = be};
    s.x = th_input(&c, LLMEM_DTYPE_F32, 2, M, K, 0, x);
    s.w = th_input(&c, LLMEM_DTYPE_F32, 2, N, K, 0, w);
    s.g = th_input(&c, LLMEM_DTYPE_F32, 1, N, 0, 0, g);
    s.b = th_input(&c, LLMEM_DTYPE_F32, 1, N, 0, 0, b);
    s.h = th_tensor(&c, LLMEM_DTYPE_F32, 2, M, N, 0);
    s.out = th_tensor(&c, LLMEM_DTYPE_F32, 2, M, N, 0);
    /* warm-up: scratch grows eagerly, not under recording */
    ck_assert_int_eq(run_step(&s), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
    llmem_recording *r = NULL;
    int calls = s.calls;
    ck_assert_int_eq(llmem_backend_record(be, run_step, &s, &r), LLMEM_OK);
    ck_assert_ptr_nonnull(r);
    bool native = llmem_recording_is_native(r);
    /* native: fn ran once to be recorded; else it runs at each replay */
    ck_assert_int_eq(s.calls, calls + (native ? 1 : 0));
    if (th_is_cpu(_i))
        ck_assert(!native);
    else if (!strcmp(th_backend_name(_i), "cuda") || !strcmp(th_backend_name(_i), "vulkan"))
        ck_assert(native);
    printf("record: %s: %s\n", th_backend_name(_i), native ? "native graph" : "re-run");
    for (int rep = 0; rep < 3; rep++) {
        ref64_fill(&rng, x, M * K, -1, 1, LLMEM_DTYPE_F32);
        if (rep == 2)
            ref64_fill(&rng, w, N * K, -0.5, 0.5, LLMEM_DTYPE_F32);
        th_set(&s.x, x);
        th_set(&s.w, w);
        th_poison(&s.h);
        th_poison(&s.out);
        ck_assert_int_eq(llmem_recording_replay(r), LLMEM_OK);
        th_get(&s.out, got);
        ref_step(x, w, g, b, ref);
        for (int i = 0; i < M * N; i++)
            ck_assert_msg(fabs(got[i] - ref[i]) <= 1e-4 * (1 + fabs(ref[i])),
                          "%s replay %d [%d]: %.9g, float64 %.9g", th_backend_name(_i), rep, i,
                          got[i], ref[i]);
        th_poison(&s.out);
        ck_assert_int_eq(run_step(&s), LLMEM_OK);
        th_get(&s.out, eager);
        ck_assert_msg(!memcmp(got, eager, sizeof(double) * M * N),
                      "%s replay %d differs from the eager step", th_backend_name(_i), rep);
    }
    /* two replays with no wait between them (Vulkan: the second submits the
     * first before it queues itself again) */
    th_poison(&s.h);
    th_poison(&s.out);
    ck_assert_int_eq(llmem_recording_replay(r), LLMEM_OK);
    ck_assert_int_eq(llmem_recording_replay(r), LLMEM_OK);
    th_get(&s.out, got);
    ck_assert_msg(!memcmp(got, eager, sizeof(double) * M * N),
                  "%s: two replays in a row differ from the eager step", th_backend_name(_i));
    llmem_recording_free(r);
    /* a call that waits cannot be recorded natively; re-run recordings keep it */
    llmem_recording *r2 = NULL;
    llmem_status st = llmem_backend_record(be, sync_only, &s, &r2);
    if (native) {
        ck_assert_int_ne(st, LLMEM_OK);
        ck_assert_ptr_null(r2);
        /* the backend still works eagerly and records again afterwards */
        ck_assert_int_eq(run_step(&s), LLMEM_OK);
        ck_assert_int_eq(llmem_backend_record(be, run_step, &s, &r2), LLMEM_OK);
        ck_assert_int_eq(llmem_recording_replay(r2), LLMEM_OK);
        th_get(&s.out, got);
        ck_assert(!memcmp(got, eager, sizeof(double) * M * N));
    } else {
        ck_assert_int_eq(st, LLMEM_OK);
        ck_assert_int_eq(llmem_recording_replay(r2), LLMEM_OK);
    }
    llmem_recording_free(r2);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_record_arguments)
{
    llmem_backend *be = th_open_cpu();
    step s = {.be = be};
    llmem_recording *r = (llmem_recording *)&s;
    ck_assert_int_eq(llmem_backend_record(NULL, run_step, &s, &r), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_record(be, NULL, &s, &r), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_record(be, run_step, &s, NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_recording_replay(NULL), LLMEM_E_INVALID);
    ck_assert(!llmem_recording_is_native(NULL));
    llmem_recording_free(NULL);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    int n = th_backends_probe();
    Suite *s = suite_create("record");
    TCase *tc = tcase_create("record");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_record_replay, 0, n);
    tcase_add_test(tc, test_record_arguments);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// ctest-labels: core
/* Communicator conformance (<llmem/comm.h>) on the in-process CPU
 * communicator, 1 to 4 ranks, one thread each on its own CPU backend:
 * all-reduce against a float64 brute-force sum of every rank's data
 * (bf16: that sum rounded to bf16 by the test's own conversion),
 * all-gather (also of rows side by side) and broadcast byte for byte, and bad input: one rank's bad
 * argument, mismatched sizes or a different collective fail the call on
 * every rank, with every buffer unchanged and no rank left waiting; a rank
 * that aborts the group instead of joining a collective, or that never
 * joins it (the group timeout), releases the others with LLMEM_E_BACKEND,
 * their buffers unchanged. */
#include "support/run.h"
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmem/backend.h"
#include "llmem/comm.h"

#define MAXR 4
#define N 1000

typedef struct rank_ctx {
    int32_t r, n;
    llmem_comm *comm;
    llmem_backend *be;
    llmem_buffer *buf, *buf2;
    int scenario;
    llmem_status st[8];
    double wait_s; /* scenarios 3, 4: seconds in the collective */
} rank_ctx;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* rank r's value i: deterministic, so the test recomputes every rank's data */
static float val(int32_t r, int32_t i)
{
    uint64_t s = (uint64_t)(r * 100003 + i) * 2654435761u + 7;
    test_rand32(&s);
    return ((float)(test_rand32(&s) % 200001) - 100000.0f) * 1e-3f * (i % 7 == 0 ? 1e4f : 1.0f);
}

/* bf16 of f (round to nearest even), the test's own conversion */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    int32_t r = c->r;
    float x[N];
    uint16_t h[N];
    for (int32_t i = 0; i < N; i++) {
        x[i] = val(r, i);
        h[i] = to_bf16(val(r, i));
    }
    switch (c->scenario) {
    case 0: /* all-reduce f32 at an offset, bf16, all-gather, broadcast, barrier */
        llmem_buffer_upload(c->buf, 64, x, sizeof x);
        c->st[0] = llmem_comm_all_reduce(c->comm, c->buf, 64, N, LLMEM_DTYPE_F32);
        llmem_buffer_upload(c->buf2, 0, h, sizeof h);
        c->st[1] = llmem_comm_all_reduce(c->comm, c->buf2, 0, N, LLMEM_DTYPE_BF16);
        c->st[2] = llmem_comm_barrier(c->comm);
        break;
    case 1: /* all-gather of 100 floats each, then in place; broadcast from the last rank */
        llmem_buffer_upload(c->buf, 0, x, 100 * 4);
        c->st[0] = llmem_comm_all_gather(c->comm, c->buf, 0, c->buf2, 0, 100 * 4);
        llmem_buffer_upload(c->buf, (size_t)r * 400, x, 100 * 4);
        c->st[1] = llmem_comm_all_gather(c->comm, c->buf, (size_t)r * 400, c->buf, 0, 400);
        llmem_buffer_upload(c->buf2, 8000, x + 7, 40);
        c->st[2] = llmem_comm_broadcast(c->comm, c->buf2, 8000, 40, c->n - 1);
        c->st[3] = llmem_comm_all_reduce(c->comm, c->buf, 0, 0, LLMEM_DTYPE_F32); /* count 0 */
        /* rows side by side: 7 rows of 5 floats each, into [7][n * 5] at 8040 */
        llmem_buffer_upload(c->buf, (size_t)c->n * 400, x, 35 * 4);
        c->st[4] = llmem_comm_all_gather_rows(c->comm, c->buf, (size_t)c->n * 400, c->buf2, 8040,
                                              7, 20);
        break;
    case 2: /* bad input on the last rank only, then a good call still works */
        llmem_buffer_upload(c->buf, 0, x, sizeof x);
        c->st[0] = llmem_comm_all_reduce(c->comm, c->buf, r == c->n - 1 ? 8192 : 0, N,
                                         LLMEM_DTYPE_F32); /* past the end */
        c->st[1] = llmem_comm_all_reduce(c->comm, c->buf, 0, r == c->n - 1 ? N - 1 : N,
                                         LLMEM_DTYPE_F32); /* count differs */
        c->st[2] = r == 0 ? llmem_comm_barrier(c->comm)
                          : llmem_comm_all_reduce(c->comm, c->buf, 0, N, LLMEM_DTYPE_F32);
        c->st[3] = llmem_comm_all_reduce(c->comm, c->buf, 0, N, LLMEM_DTYPE_I32); /* dtype */
        c->st[4] = llmem_comm_broadcast(c->comm, c->buf, 0, 16, c->n); /* root out of range */
        c->st[5] = llmem_comm_all_gather(c->comm, c->buf, 4, c->buf, 0, 400); /* overlap */
        c->st[6] = llmem_comm_all_reduce(c->comm, r == 0 ? c->buf2 : c->buf, 0, N,
                                         LLMEM_DTYPE_F32); /* buf2 is too small on rank 0 */
        c->st[7] = llmem_comm_all_gather_rows(c->comm, c->buf, 0, c->buf, 40, 3,
                                              r == 1 ? 16 : 20); /* row size differs */
        break;
    case 3: /* the last rank aborts the group while the others wait in an all-reduce */
    case 4: /* the last rank never comes: the group's timeout ends the wait */
        llmem_buffer_upload(c->buf, 0, x, sizeof x);
        if (r == c->n - 1) {
            nanosleep(&(struct timespec){.tv_nsec = 200000000}, NULL); /* the others wait */
            c->st[0] = c->scenario == 3 ? llmem_comm_abort(c->comm) : LLMEM_E_BACKEND;
            if (c->scenario == 4) /* it comes back after the timeout */
                while (!llmem_comm_aborted(c->comm))
                    nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
        } else {
            double t0 = now_s();
            c->st[0] = llmem_comm_all_reduce(c->comm, c->buf, 0, N, LLMEM_DTYPE_F32);
            c->wait_s = now_s() - t0;
        }
        c->st[1] = llmem_comm_barrier(c->comm); /* the group stays aborted */
        c->st[2] = llmem_comm_aborted(c->comm) ? LLMEM_OK : LLMEM_E_STATE;
        c->st[3] = llmem_comm_abort(c->comm); /* idempotent */
        break;
    }
    return NULL;
}

typedef struct world {
    int32_t n;
    llmem_backend *be[MAXR];
    llmem_comm *comm[MAXR];
    rank_ctx ctx[MAXR];
} world;

static void world_run(world *w, int32_t n, int scenario, size_t b1, size_t b2)
{
    char err[256];
    memset(w, 0, sizeof *w);
    w->n = n;
    for (int32_t r = 0; r < n; r++)
        ck_assert_int_eq(llmem_backend_open("cpu", 0, &w->be[r], err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_comm_group_create(w->be, n, NULL, w->comm, err, sizeof err), LLMEM_OK);
    pthread_t th[MAXR];
    for (int32_t r = 0; r < n; r++) {
        ck_assert_str_eq(llmem_comm_name(w->comm[r]), "cpu");
        ck_assert_int_eq(llmem_comm_rank(w->comm[r]), r);
        ck_assert_int_eq(llmem_comm_size(w->comm[r]), n);
        rank_ctx *c = &w->ctx[r];
        *c = (rank_ctx){.r = r, .n = n, .comm = w->comm[r], .be = w->be[r], .scenario = scenario};
        ck_assert_int_eq(llmem_buffer_alloc(w->be[r], b1, &c->buf), LLMEM_OK);
        ck_assert_int_eq(llmem_buffer_alloc(w->be[r], b2, &c->buf2), LLMEM_OK);
    }
    for (int32_t r = 0; r < n; r++)
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &w->ctx[r]), 0);
    for (int32_t r = 0; r < n; r++)
        pthread_join(th[r], NULL);
}

static void world_free(world *w)
{
    for (int32_t r = 0; r < w->n; r++) {
        llmem_comm_destroy(w->comm[r]);
        llmem_buffer_free(w->ctx[r].buf);
        llmem_buffer_free(w->ctx[r].buf2);
        llmem_backend_close(w->be[r]);
    }
}

START_TEST(test_all_reduce)
{
    int32_t n = _i + 1;
    world w;
    world_run(&w, n, 0, 64 + N * 4, N * 2);
    for (int32_t r = 0; r < n; r++) {
        float got[N];
        uint16_t hb[N];
        ck_assert_int_eq(w.ctx[r].st[0], LLMEM_OK);
        ck_assert_int_eq(w.ctx[r].st[1], LLMEM_OK);
        ck_assert_int_eq(w.ctx[r].st[2], LLMEM_OK);
        llmem_buffer_download(w.ctx[r].buf, 64, got, sizeof got);
        llmem_buffer_download(w.ctx[r].buf2, 0, hb, sizeof hb);
        for (int32_t i = 0; i < N; i++) {
            double ref = 0, refh = 0, mag = 0;
            for (int32_t k = 0; k < n; k++) {
                ref += (double)val(k, i);
                mag += fabs((double)val(k, i));
                refh += (double)from_bf16(to_bf16(val(k, i)));
            }
            /* f32: within one rounding of the float64 sum */
            ck_assert_msg(fabs((double)got[i] - ref) <= mag * 0x1p-24,
                          "rank %d of %d, element %d: %.9g, float64 sum %.9g", r, n, i,
                          (double)got[i], ref);
            /* bf16: the float64 sum of the bf16 parts, rounded to bf16 (ties aside) */
            double e = fabs((double)from_bf16(hb[i]) - refh);
            ck_assert_msg(e <= fabs(refh) * 0x1p-8 + 1e-30, "bf16 element %d: %g vs %g", i,
                          (double)from_bf16(hb[i]), refh);
        }
        if (r > 0) { /* every rank holds the same bytes */
            float g0[N];
            llmem_buffer_download(w.ctx[0].buf, 64, g0, sizeof g0);
            ck_assert_int_eq(memcmp(g0, got, sizeof got), 0);
        }
    }
    world_free(&w);
}
END_TEST

START_TEST(test_gather_broadcast)
{
    int32_t n = _i + 1;
    world w;
    world_run(&w, n, 1, (size_t)n * 400 + 140, 8040 + (size_t)n * 140);
    for (int32_t r = 0; r < n; r++) {
        float got[MAXR * 100], in_place[MAXR * 100], bc[10];
        for (int32_t s = 0; s < 4; s++)
            ck_assert_int_eq(w.ctx[r].st[s], LLMEM_OK);
        llmem_buffer_download(w.ctx[r].buf2, 0, got, (size_t)n * 400);
        llmem_buffer_download(w.ctx[r].buf, 0, in_place, (size_t)n * 400);
        llmem_buffer_download(w.ctx[r].buf2, 8000, bc, 40);
        for (int32_t k = 0; k < n; k++)
            for (int32_t i = 0; i < 100; i++) {
                ck_assert_float_eq(got[k * 100 + i], val(k, i));
                ck_assert_float_eq(in_place[k * 100 + i], val(k, i));
            }
        for (int32_t i = 0; i < 10; i++)
            ck_assert_float_eq(bc[i], val(n - 1, 7 + i));
        ck_assert_int_eq(w.ctx[r].st[4], LLMEM_OK);
        float rows[7 * MAXR * 5];
        llmem_buffer_download(w.ctx[r].buf2, 8040, rows, (size_t)n * 140);
        for (int32_t t = 0; t < 7; t++) /* row t: rank k's row t at columns [5k, 5k + 5) */
            for (int32_t k = 0; k < n; k++)
                for (int32_t j = 0; j < 5; j++)
                    ck_assert_float_eq(rows[(t * n + k) * 5 + j], val(k, t * 5 + j));
    }
    world_free(&w);
}
END_TEST

START_TEST(test_bad_input)
{
    int32_t n = _i + 2;
    world w;
    world_run(&w, n, 2, N * 4, 400);
    for (int32_t r = 0; r < n; r++) {
        for (int32_t s = 0; s < 8; s++)
            ck_assert_msg(w.ctx[r].st[s] == LLMEM_E_INVALID, "rank %d call %d: %s", r, s,
                          llmem_status_str(w.ctx[r].st[s]));
        float got[N];
        llmem_buffer_download(w.ctx[r].buf, 0, got, sizeof got);
        for (int32_t i = 0; i < N; i++)
            ck_assert_float_eq(got[i], val(r, i)); /* untouched */
    }
    world_free(&w);
}
END_TEST

/* An abort (scenario 3) or the group timeout (4, LLMEM_COMM_TIMEOUT_S
 * 0.5) releases the ranks waiting in an all-reduce with LLMEM_E_BACKEND,
 * their data untouched; later collectives fail alike. */
START_TEST(test_abort_timeout)
{
    int32_t n = _i / 2 + 2, scenario = 3 + _i % 2;
    if (scenario == 4)
        setenv("LLMEM_COMM_TIMEOUT_S", "0.5", 1); /* read when the group is made */
    world w;
    world_run(&w, n, scenario, N * 4, 400);
    unsetenv("LLMEM_COMM_TIMEOUT_S");
    double longest = 0;
    for (int32_t r = 0; r < n; r++) {
        rank_ctx *c = &w.ctx[r];
        if (r < n - 1) {
            ck_assert_msg(c->st[0] == LLMEM_E_BACKEND, "rank %d: %s", r,
                          llmem_status_str(c->st[0]));
            /* released well before the default 300 s timeout */
            ck_assert_msg(c->wait_s <= 5.0, "rank %d waited %.3f s", r, c->wait_s);
            longest = c->wait_s > longest ? c->wait_s : longest;
        } else {
            ck_assert_int_eq(c->st[0], scenario == 3 ? LLMEM_OK : LLMEM_E_BACKEND);
        }
        ck_assert_int_eq(c->st[1], LLMEM_E_BACKEND);
        ck_assert_int_eq(c->st[2], LLMEM_OK);
        ck_assert_int_eq(c->st[3], LLMEM_OK);
        float got[N];
        llmem_buffer_download(c->buf, 0, got, sizeof got);
        for (int32_t i = 0; i < N; i++)
            ck_assert_float_eq(got[i], val(r, i)); /* untouched */
    }
    /* the abort comes 0.2 s after the last rank starts; the first rank to
     * wait 0.5 s times out and releases the others (who may have come
     * later) */
    ck_assert_msg(longest >= (scenario == 3 ? 0.15 : 0.45), "longest wait %.3f s", longest);
    world_free(&w);
}
END_TEST

START_TEST(test_group_errors)
{
    char err[256];
    llmem_backend *be[2] = {NULL, NULL};
    llmem_comm *c[2] = {NULL, NULL};
    ck_assert_int_eq(llmem_backend_open("cpu", 0, &be[0], err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_open("cpu", 0, &be[1], err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_comm_group_create(be, 0, NULL, c, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_comm_group_create(NULL, 2, NULL, c, err, sizeof err), LLMEM_E_INVALID);
    llmem_backend *same[2] = {be[0], be[0]};
    ck_assert_int_eq(llmem_comm_group_create(same, 2, NULL, c, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "share one backend"));
    ck_assert_int_eq(llmem_comm_group_create(be, 2, "mpi", c, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_comm_group_create(be, 2, "nccl", c, err, sizeof err),
                     LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_null(c[0]);
    ck_assert_ptr_null(c[1]);
    ck_assert_int_eq(llmem_comm_all_reduce(NULL, NULL, 0, 0, LLMEM_DTYPE_F32), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_comm_abort(NULL), LLMEM_E_INVALID);
    ck_assert(!llmem_comm_aborted(NULL));
    ck_assert_int_eq(llmem_comm_rank(NULL), -1);
    ck_assert_int_eq(llmem_comm_size(NULL), 0);
    llmem_comm_destroy(NULL);
    /* one rank: every collective is a local copy */
    ck_assert_int_eq(llmem_comm_group_create(be, 1, "cpu", c, err, sizeof err), LLMEM_OK);
    llmem_buffer *b = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be[0], 16, &b), LLMEM_OK);
    float x[4] = {1.5f, -2.0f, 3.25f, 0.0f}, y[4];
    llmem_buffer_upload(b, 0, x, 16);
    ck_assert_int_eq(llmem_comm_all_reduce(c[0], b, 0, 4, LLMEM_DTYPE_F32), LLMEM_OK);
    llmem_buffer_download(b, 0, y, 16);
    ck_assert_int_eq(memcmp(x, y, 16), 0);
    llmem_buffer_free(b);
    llmem_comm_destroy(c[0]);
    llmem_backend_close(be[0]);
    llmem_backend_close(be[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("cpu");
    tcase_add_loop_test(tc, test_all_reduce, 0, MAXR);
    tcase_add_loop_test(tc, test_gather_broadcast, 0, MAXR);
    tcase_add_loop_test(tc, test_bad_input, 0, MAXR - 1);
    tcase_add_loop_test(tc, test_abort_timeout, 0, 2 * (MAXR - 1));
    tcase_add_test(tc, test_group_errors);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

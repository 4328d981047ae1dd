// ctest-labels: core
/* Op conformance suite, the backends around the ops (split from
 * test_ops.c): a backend without an ops table refuses ops with
 * LLMEM_E_UNSUPPORTED and still copies blocks; the CPU backend's thread
 * pool gives the same bits at any thread count, from two threads with a
 * backend each, and in a forked child. Expected values: the single-threaded
 * run (each output element is computed by one thread in a fixed order).
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define BF16 LLMEM_DTYPE_BF16

/* A backend without ops gives LLMEM_E_UNSUPPORTED (the registry tests'
 * "testplug" plugin has no ops table). */
START_TEST(test_unsupported)
{
    setenv("LLMEM_BACKEND_PATH", LLMEM_BUILD_DIR "/tests/plugins", 1);
    llmem_backend *be = NULL;
    char err[256] = "";
    if (llmem_backend_open("testplug", -1, &be, err, sizeof err) != LLMEM_OK) {
        printf("ops: test_unsupported skipped: %s\n", err);
        return;
    }
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor a = th_tensor(&c, F32, 2, 2, 4, 1), w = th_tensor(&c, F32, 2, 3, 4, 1);
    llmem_tensor o = th_tensor(&c, F32, 2, 2, 3, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &a, &w, &o), LLMEM_E_UNSUPPORTED);
    ck_assert_int_eq(llmem_op_silu(be, &a, &a), LLMEM_E_UNSUPPORTED);
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 2), LLMEM_E_INVALID);
    /* copy_blocks falls back to buffer copies: a's data is blocks 16, 17 */
    double v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
    th_set(&a, v);
    int32_t s = TH_GUARD / 16, d = TH_GUARD / 16 + 1;
    ck_assert_int_eq(llmem_op_copy_blocks(be, a.buf, 16, 1, &s, &d), LLMEM_OK);
    th_get(&a, got);
    for (int i = 0; i < 8; i++)
        ck_assert(got[i] == v[i % 4]);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

/* CPU results do not depend on the thread count (each output element is
 * computed by one thread in a fixed order). */
START_TEST(test_cpu_threads)
{
    llmem_backend *be = th_open_cpu();
    ref64_rng r = ref64_rng_make(ref64_seed(), 1100);
    int32_t m = 37, k = 300, n = 129;
    th_ctx h;
    th_begin(&h, NULL);
    double *a = th_vec(&h, (int64_t)m * k), *w = th_vec(&h, (int64_t)n * k);
    double *o1 = th_vec(&h, (int64_t)m * n), *o3 = th_vec(&h, (int64_t)m * n);
    ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
    ref64_fill(&r, w, (int64_t)n * k, -1, 1, BF16);
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 1), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_cpu_threads(), 1);
    th_matmul(be, m, k, n, BF16, a, w, o1);
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 3), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_cpu_threads(), 3);
    th_matmul(be, m, k, n, BF16, a, w, o3);
    th_expect_same_bytes(o1, o3, (size_t)m * n * sizeof *o1, "matmul, 1 vs 3 threads");
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 0), LLMEM_OK);
    ck_assert_int_ge(llmem_backend_cpu_threads(), 1);
    th_end(&h);
    llmem_backend_close(be);
}
END_TEST

/* Two threads, each with its own CPU backend, share the process-wide pool:
 * one of them runs on its own thread while the other holds the pool. Both
 * must get the single-threaded result. */
typedef struct mm_job {
    int32_t m, k, n;
    const double *a, *w;
    double *out;
} mm_job;

static void *mm_thread(void *arg)
{
    mm_job *j = arg;
    llmem_backend *be = NULL;
    if (llmem_backend_open("cpu", -1, &be, NULL, 0) != LLMEM_OK)
        return NULL;
    for (int rep = 0; rep < 20; rep++) {
        llmem_buffer *buf = NULL;
        size_t na = (size_t)j->m * j->k, nw = (size_t)j->n * j->k, no = (size_t)j->m * j->n;
        if (llmem_buffer_alloc(be, (na + nw + no) * sizeof(float), &buf) != LLMEM_OK)
            break;
        float *h = llmem_buffer_host_ptr(buf);
        for (size_t i = 0; i < na; i++)
            h[i] = (float)j->a[i];
        for (size_t i = 0; i < nw; i++)
            h[na + i] = (float)j->w[i];
        llmem_tensor a = llmem_tensor_2d(buf, 0, F32, j->m, j->k);
        llmem_tensor w = llmem_tensor_2d(buf, na * 4, F32, j->n, j->k);
        llmem_tensor o = llmem_tensor_2d(buf, (na + nw) * 4, F32, j->m, j->n);
        llmem_status st = llmem_op_matmul(be, &a, &w, &o);
        for (size_t i = 0; i < no; i++)
            j->out[rep * no + i] = st == LLMEM_OK ? h[na + nw + i] : NAN;
        llmem_buffer_free(buf);
    }
    llmem_backend_close(be);
    return NULL;
}

START_TEST(test_cpu_two_threads)
{
    ref64_rng r = ref64_rng_make(ref64_seed(), 1200);
    th_ctx h;
    th_begin(&h, NULL);
    int32_t m = 9, k = 700, n = 200;
    double *a = th_vec(&h, (int64_t)m * k), *w = th_vec(&h, (int64_t)n * k);
    ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
    ref64_fill(&r, w, (int64_t)n * k, -1, 1, F32);
    mm_job jobs[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (mm_job){m, k, n, a, w, th_vec(&h, 20 * (int64_t)m * n)};
        ck_assert_int_eq(pthread_create(&t[i], NULL, mm_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    llmem_backend *be = th_open_cpu();
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 1), LLMEM_OK);
    double *one = th_vec(&h, (int64_t)m * n);
    th_matmul(be, m, k, n, F32, a, w, one);
    for (int i = 0; i < 2; i++)
        for (int rep = 0; rep < 20; rep++)
            th_expect_same_bytes(jobs[i].out + rep * (int64_t)m * n, one,
                                 (size_t)m * n * sizeof *one, "matmul from two threads");
    llmem_backend_close(be);
    th_end(&h);
}
END_TEST

/* After fork() the child gets a working pool of its own (the parent's
 * worker threads do not exist there). */
START_TEST(test_cpu_fork)
{
    ref64_rng r = ref64_rng_make(ref64_seed(), 1300);
    th_ctx h;
    th_begin(&h, NULL);
    int32_t m = 16, k = 512, n = 64;
    double *a = th_vec(&h, (int64_t)m * k), *w = th_vec(&h, (int64_t)n * k);
    double *before = th_vec(&h, (int64_t)m * n), *after = th_vec(&h, (int64_t)m * n);
    ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
    ref64_fill(&r, w, (int64_t)n * k, -1, 1, F32);
    llmem_backend *be = th_open_cpu();
    ck_assert_int_eq(llmem_backend_cpu_set_threads(be, 2), LLMEM_OK);
    th_matmul(be, m, k, n, F32, a, w, before); /* starts the pool here */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        llmem_backend *cb = NULL;
        if (llmem_backend_open("cpu", -1, &cb, NULL, 0) == LLMEM_OK) {
            llmem_buffer *buf = NULL;
            size_t na = (size_t)m * k, nw = (size_t)n * k, no = (size_t)m * n;
            if (llmem_buffer_alloc(cb, (na + nw + no) * sizeof(float), &buf) == LLMEM_OK) {
                float *hp = llmem_buffer_host_ptr(buf);
                for (size_t i = 0; i < na; i++)
                    hp[i] = (float)a[i];
                for (size_t i = 0; i < nw; i++)
                    hp[na + i] = (float)w[i];
                llmem_tensor ta = llmem_tensor_2d(buf, 0, F32, m, k);
                llmem_tensor tw = llmem_tensor_2d(buf, na * 4, F32, n, k);
                llmem_tensor to = llmem_tensor_2d(buf, (na + nw) * 4, F32, m, n);
                if (llmem_op_matmul(cb, &ta, &tw, &to) == LLMEM_OK &&
                    write(fds[1], hp + na + nw, no * sizeof(float)) == (ssize_t)(no * sizeof(float)))
                    _exit(0);
            }
        }
        _exit(1);
    }
    close(fds[1]);
    float got[16 * 64];
    size_t have = 0;
    ssize_t rd;
    while (have < sizeof got && (rd = read(fds[0], (char *)got + have, sizeof got - have)) > 0)
        have += (size_t)rd;
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_uint_eq(have, sizeof got);
    for (int i = 0; i < m * n; i++)
        after[i] = got[i];
    th_expect_same_bytes(after, before, (size_t)m * n * sizeof *after, "matmul in a forked child");
    llmem_backend_close(be);
    th_end(&h);
}
END_TEST

START_TEST(test_cpu_opens)
{
    llmem_backend_close(th_open_cpu());
}
END_TEST

int main(void)
{
    printf("test_ops_backend: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    Suite *s = suite_create("ops_backend");
    TCase *tc = tcase_create("ops_backend");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cpu_opens);
    tcase_add_test(tc, test_unsupported);
    tcase_add_test(tc, test_cpu_threads);
    tcase_add_test(tc, test_cpu_two_threads);
    tcase_add_test(tc, test_cpu_fork);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* Host out-of-memory while a model loads: the N-th host allocation
 * (support/host_faults.h interposes malloc, calloc, realloc and
 * aligned_alloc) fails, for N = 0, 1, 2, ... until llmem_model_load
 * succeeds, on fixtures of each memory layout: llama (one KV cache), mamba2
 * (a recurrent memory), bamba (a hybrid of both) and gemma3_text (two KV
 * caches, global and sliding window, in a hybrid). Every failed load must
 * return LLMEM_E_NO_MEMORY with a message and no model, and nothing may
 * crash. Then each host allocation of a prompt's decode and of the next
 * step fails in turn (decode_survives_every_host_allocation).
 * tests/support/load_faults.c does the same for device allocations
 * (lf_every_allocation_fails) at the same shape (lf_params).
 * The sweep found a KV cache whose creation failed between its K and V
 * tables crashing in its own destroy, and a recurrent memory returning
 * LLMEM_OK and no memory when a state's name found no memory (the model
 * then said it had "neither attention nor Mamba layers").
 *
 * Interposing malloc needs glibc and no sanitizer: elsewhere the suite
 * exits 77 (skipped). */
// ctest-labels: core
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/batch.h"
#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/host_faults.h"
#include "support/load_faults.h"
#include "support/run.h"

#ifdef HOST_FAULTS

static const char *const fixtures[] = {"llama", "mamba2", "bamba", "gemma3_text"};

START_TEST(every_host_allocation_fails)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", test_source_dir(), fixtures[_i]);
    llmem_backend *be = test_open("cpu");
    llmem_model_params p = lf_params();
    int64_t failures = 0;
    for (int64_t n = 0;; n++) {
        ck_assert_int_lt(n, 100000);
        llmem_model *m = (llmem_model *)1;
        strcpy(err, "stale");
        hf_arm(n);
        llmem_status s = llmem_model_load(dir, be, &p, &m, err, sizeof err);
        bool hit = hf_disarm();
        if (s == LLMEM_OK) {
            llmem_model_free(m);
            if (!hit)
                break; /* every allocation of the load has had its turn */
            continue;  /* the failed allocation had a fallback */
        }
        ck_assert_msg(s == LLMEM_E_NO_MEMORY, "%s, allocation %lld failing: %s (%s)",
                      fixtures[_i], (long long)n, llmem_status_str(s), err);
        ck_assert_ptr_null(m);
        ck_assert_msg(err[0] && strcmp(err, "stale"), "%s, allocation %lld: no message",
                      fixtures[_i], (long long)n);
        failures++;
    }
    ck_assert_int_gt(failures, 100); /* the loop reached the loader's allocations */
    llmem_backend_close(be);
}
END_TEST

/* A prompt of 6 tokens in sequence 0 (phase 0), or one more token after it
 * (phase 1), through llmem_model_decode; the last row's log-probabilities
 * into out[n_vocab]. */
static llmem_status decode_phase(llmem_model *m, llmem_batch_buf *b, int phase, float *out,
                                 char *err, size_t err_len)
{
    int32_t seq = 0, n_out = 0, pos0 = phase ? 6 : 0, n = phase ? 1 : 6;
    llmem_batch_buf_clear(b);
    for (int32_t i = 0; i < n; i++)
        llmem_batch_buf_add(b, 5 + pos0 + i, pos0 + i, &seq, 1, i == n - 1);
    return llmem_model_decode(m, llmem_batch_buf_get(b), true, out, 1, &n_out, err, err_len);
}

/* The N-th host allocation of a prompt's decode, or of the next step's,
 * fails: the call returns LLMEM_E_NO_MEMORY and leaves the model as it
 * was, so the same call again (nothing failing) gives the log-probabilities
 * of a run where nothing failed, bit for bit (the cpu backend is
 * deterministic); or the call succeeds with those. A hybrid's commit used
 * to fail after taking the prompt's tokens (a snapshot's bookkeeping, then
 * the overlap check of llmem_buffer_copy_ranges), so the retry was refused. */
START_TEST(decode_survives_every_host_allocation)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", test_source_dir(), fixtures[_i]);
    llmem_backend *be = test_open("cpu");
    llmem_model_params p = lf_params();
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(8, 1, &b), LLMEM_OK);
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    int32_t V = llmem_model_n_vocab(m);
    float *ref[2] = {malloc(sizeof(float) * (size_t)V), malloc(sizeof(float) * (size_t)V)};
    float *out = malloc(sizeof(float) * (size_t)V);
    ck_assert(ref[0] && ref[1] && out);
    for (int phase = 0; phase < 2; phase++)
        ck_assert_msg(decode_phase(m, b, phase, ref[phase], err, sizeof err) == LLMEM_OK, "%s",
                      err);
    llmem_model_free(m);
    for (int phase = 0; phase < 2; phase++) {
        int64_t failures = 0;
        for (int64_t n = 0;; n++) {
            ck_assert_int_lt(n, 100000);
            ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s",
                          err);
            if (phase == 1)
                ck_assert_int_eq(decode_phase(m, b, 0, out, err, sizeof err), LLMEM_OK);
            strcpy(err, "stale");
            hf_arm(n);
            llmem_status s = decode_phase(m, b, phase, out, err, sizeof err);
            bool hit = hf_disarm();
            if (s != LLMEM_OK) {
                ck_assert_msg(s == LLMEM_E_NO_MEMORY, "%s, phase %d, allocation %lld: %s (%s)",
                              fixtures[_i], phase, (long long)n, llmem_status_str(s), err);
                failures++;
                s = decode_phase(m, b, phase, out, err, sizeof err); /* nothing failing */
                ck_assert_msg(s == LLMEM_OK, "%s, phase %d, allocation %lld: the retry: %s",
                              fixtures[_i], phase, (long long)n, err);
            }
            ck_assert_msg(!memcmp(out, ref[phase], sizeof(float) * (size_t)V),
                          "%s, phase %d, allocation %lld: other log-probabilities", fixtures[_i],
                          phase, (long long)n);
            llmem_model_free(m);
            if (!hit)
                break;
        }
        ck_assert_int_gt(failures, 0);
    }
    free(ref[0]);
    free(ref[1]);
    free(out);
    llmem_batch_buf_destroy(b);
    llmem_backend_close(be);
}
END_TEST
#endif

int main(void)
{
#ifdef HOST_FAULTS
    Suite *s = suite_create("load_oom");
    TCase *tc = tcase_create("load_oom");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, every_host_allocation_fails, 0,
                        (int)(sizeof fixtures / sizeof *fixtures));
    tcase_add_loop_test(tc, decode_survives_every_host_allocation, 0,
                        (int)(sizeof fixtures / sizeof *fixtures));
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
#else
    puts("load_oom: needs glibc without a sanitizer (interposes malloc); skipped");
    return 77;
#endif
}

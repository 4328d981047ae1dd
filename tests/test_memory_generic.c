// ctest-labels: core
/* The generic randomized memory test (issue 16): random plans and sequence
 * operations on any memory, checked after every step against the
 * sequence-level reference of tests/support/seqref.c, which reaches the
 * memory through the public interface only. Each cache type joins by
 * declaring its semantics: the KV cache (any suffix can be cut, prefixes
 * copied), the recurrent memory (cuts only at checkpoints), the
 * out-of-tree running-sum state of tests/support/example_rsum.c (whole
 * sequences only, no shifts), and compositions of them (the strictest of
 * their children). The detailed page- and slot-level reference of the
 * built-in memories is tests/test_memory_model.c.
 */
#include "support/run.h"
#include <check.h>
#include <stdlib.h>

#include "llmem/llmem.h"
#include "support/example_rsum.h"
#include "support/memtest.h"
#include "support/seqref.h"

static const seqref_semantics KV_SEM = {SEQREF_CUT_ANY, true, true, true, 1, {LLMEM_VIEW_KV}};
static const seqref_semantics RS_SEM = {SEQREF_CUT_CHECKPOINT, false, true, false, 1,
                                        {LLMEM_VIEW_RECURRENT}};
static const seqref_semantics RSUM_SEM = {SEQREF_CUT_WHOLE, false, false, false, 1,
                                          {RSUM_VIEW_KIND}};

enum { N_SEQ = 4, STEPS = 400 };

static llmem_memory *rsum_mem(llmem_backend *be)
{
    llmem_memory *m = NULL;
    ck_assert_int_eq(rsum_create(be, 1, N_SEQ, 4, &m, NULL, 0), LLMEM_OK);
    return m;
}

static llmem_memory *hybrid2(llmem_memory *a, llmem_memory *b)
{
    llmem_memory *kids[2] = {a, b}, *h = NULL;
    const int32_t layer_child[2] = {0, 1};
    char err[256];
    ck_assert_msg(llmem_hybrid_create(kids, 2, layer_child, 2, &h, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    return h;
}

/* Runs STEPS random steps with seed `seed` (xor $LLMEM_SEQREF_SEED) and checks the steps covered
 * plans, cuts and copies. */
static void run(llmem_memory *mem, const seqref_semantics *sem, uint64_t seed)
{
    seqref *r = seqref_create(mem, sem);
    const char *e = getenv("LLMEM_SEQREF_SEED"); /* explore other seeds by hand */
    uint64_t rng = seed ^ (e ? strtoull(e, NULL, 0) : 0);
    for (int i = 0; i < STEPS; i++)
        seqref_step(r, &rng);
    seqref_counts c = seqref_get_counts(r);
    ck_assert_int_gt(c.plans_ok, STEPS / 4);
    ck_assert_int_gt(c.cuts_ok, 0);
    ck_assert_int_gt(c.copies, 0);
    if (sem->shift)
        ck_assert_int_gt(c.shifts, 0);
    if (sem->cut == SEQREF_CUT_WHOLE)
        ck_assert_int_gt(c.cuts_refused, 0); /* partial cuts were tried and refused */
    seqref_destroy(r);
}

START_TEST(test_kv_cache)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 24, N_SEQ, _i == 0, false);
    run(m, &KV_SEM, 0x1234 + (uint64_t)_i);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_recurrent)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, N_SEQ, _i);
    run(m, &RS_SEM, 0x5678 + (uint64_t)_i);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_rsum)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = rsum_mem(be);
    run(m, &RSUM_SEM, 0x9abc);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_hybrids)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *h = hybrid2(mt_kv(be, 4, 24, N_SEQ, true, false), mt_rs(be, N_SEQ, 2));
    seqref_semantics sem = seqref_combine(KV_SEM, RS_SEM);
    run(h, &sem, 0xdef0);
    llmem_memory_destroy(h);
    h = hybrid2(mt_kv(be, 4, 24, N_SEQ, true, false), rsum_mem(be));
    sem = seqref_combine(KV_SEM, RSUM_SEM);
    ck_assert_int_eq(sem.cut, SEQREF_CUT_WHOLE);
    ck_assert(!sem.shift && sem.may_fill && sem.n_kinds == 2);
    run(h, &sem, 0x4242);
    llmem_memory_destroy(h);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memory_generic");
    TCase *tc = tcase_create("memory_generic");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_kv_cache, 0, 2);
    tcase_add_loop_test(tc, test_recurrent, 0, 2);
    tcase_add_test(tc, test_rsum);
    tcase_add_test(tc, test_hybrids);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// ctest-labels: core
/* Fault injection: the N-th device buffer allocation fails
 * (llmem_backend_set_alloc_hook), for N = 0, 1, 2, ... until the operation
 * succeeds.
 *  - During llmem_kv_cache_create / llmem_recurrent_create: a clean
 *    LLMEM_E_NO_MEMORY, no memory returned, nothing leaked (ASan's leak
 *    checker runs these in CI).
 *  - During llmem_memory_plan (memories grow their index buffers at plan
 *    time): LLMEM_E_NO_MEMORY and the memory unchanged: every sequence,
 *    page table, recurrent slot, stat and the data in every slot, compared
 *    with the brute-force reference (tests/support/memref.c), and
 *    llmem_memory_check passes; the memory stays usable. For a hybrid whose
 *    second child fails, the first child must be unchanged as well.
 *  - Everything but plan allocates nothing: with every allocation failing,
 *    apply, view, commit, release, sequence operations and state I/O
 *    still work. */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memref.h"
#include "support/memtest.h"

typedef struct hook {
    int32_t calls;   /* allocations seen */
    int32_t fail_at; /* the one that fails; < 0: none */
    bool always;     /* every one fails */
} hook;

static bool hook_fn(size_t size, void *ctx)
{
    hook *h = ctx;
    (void)size;
    int32_t i = h->calls++;
    return !(h->always || i == h->fail_at);
}

/* --- creation ------------------------------------------------------------------------ */

static llmem_status create_kv(llmem_backend *be, llmem_memory **m, char *err, size_t n)
{
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 3;
    p.n_kv_heads = 2;
    p.head_dim = 8;
    p.page_size = 16;
    p.n_pages = 8;
    p.n_seq_max = 4;
    return llmem_kv_cache_create(be, &p, m, err, n);
}

static llmem_status create_rs(llmem_backend *be, llmem_memory **m, char *err, size_t n)
{
    llmem_state_desc d[2];
    llmem_recurrent_mamba2_states(4, 16, 1, 8, 2, 8, d);
    const llmem_state_desc *states[2] = {d, d};
    const int32_t n_states[2] = {2, 2};
    llmem_recurrent_params p = {.n_layers = 2, .n_states = n_states, .states = states,
                                .n_seq_max = 3, .n_ckpt = 2};
    return llmem_recurrent_create(be, &p, m, err, n);
}

typedef llmem_status (*create_fn)(llmem_backend *, llmem_memory **, char *, size_t);

static void create_under_faults(create_fn create, int32_t want_allocs)
{
    llmem_backend *be = mt_cpu();
    hook h = {.fail_at = -1};
    llmem_backend_set_alloc_hook(be, hook_fn, &h);
    llmem_memory *m = NULL;
    ck_assert_int_eq(create(be, &m, NULL, 0), LLMEM_OK);
    llmem_memory_destroy(m);
    ck_assert_int_eq(h.calls, want_allocs); /* one buffer per pool / state, counted by hand */
    for (int32_t n = 0; n < want_allocs; n++) {
        char err[256] = "";
        h = (hook){.fail_at = n};
        m = (llmem_memory *)&h; /* must be reset to NULL */
        ck_assert_int_eq(create(be, &m, err, sizeof err), LLMEM_E_NO_MEMORY);
        ck_assert_ptr_null(m);
        ck_assert_msg(err[0] != '\0', "allocation %d failed without a reason", n);
        ck_assert_int_eq(h.calls, n + 1); /* stops at the first failure */
    }
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    llmem_backend_close(be);
}

START_TEST(kv_create_faults)
{
    create_under_faults(create_kv, 2 * 3); /* K and V pool per layer */
}
END_TEST

START_TEST(rs_create_faults)
{
    create_under_faults(create_rs, 2 * 2); /* conv and ssm per layer */
}
END_TEST

/* --- plans --------------------------------------------------------------------------- */

typedef struct batch {
    int32_t n, tok[1024], pos[1024];
    int32_t ids[1024];
    const int32_t *idp[1024];
    llmem_batch b;
} batch;

static void add(batch *b, memref *r, int32_t seq, int32_t n, int32_t tok0)
{
    int32_t p = memref_pos_max(r, seq) + 1;
    for (int32_t j = 0; j < n; j++) {
        int32_t i = b->n++;
        b->tok[i] = tok0 + j;
        b->pos[i] = p + j;
        b->ids[i] = seq;
    }
}

static const llmem_batch *get(batch *b)
{
    for (int32_t i = 0; i < b->n; i++)
        b->idp[i] = &b->ids[i];
    b->b = (llmem_batch){.n_tokens = b->n, .token = b->tok, .pos = b->pos, .seq_id = b->idp};
    return &b->b;
}

static void check_ref(memref *r, const char *where)
{
    char err[512] = "";
    ck_assert_msg(memref_bind(r, err, sizeof err) && memref_compare(r, err, sizeof err) &&
                      memref_verify(r, err, sizeof err),
                  "%s: %s", where, err);
}

/* Applies, runs (the reference's forward) and commits every ubatch of
 * plan p, which the reference has planned and bound too, releases both
 * and checks them against each other (`where` names the step). */
static void run_plan(memref *r, llmem_memory *m, llmem_plan *p, const char *where)
{
    char err[512] = "";
    for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(m, p, u, &ub), LLMEM_OK);
        ck_assert_msg(memref_capture(r, ub, u, err, sizeof err), "%s", err);
        ck_assert_msg(memref_forward(r, ub, err, sizeof err), "%s", err);
        ck_assert_int_eq(llmem_memory_commit(m, p, u), LLMEM_OK);
        memref_commit(r, ub);
    }
    llmem_memory_release(m, p);
    memref_release(r, false);
    check_ref(r, where);
}

/* Applies and commits every ubatch of plan p (made from b), with the
 * reference. */
static void finish(memref *r, llmem_memory *m, llmem_plan *p, batch *b, int32_t n_ubatch)
{
    char err[512] = "";
    int32_t n_cached[MR_MAX_SEQ];
    ck_assert_int_eq(memref_plan(r, get(b), LLMEM_SPLIT_AUTO, n_ubatch, n_cached), LLMEM_OK);
    ck_assert_msg(memref_check_plan(r, p, err, sizeof err) && memref_bind(r, err, sizeof err),
                  "%s", err);
    run_plan(r, m, p, "after a plan");
}

static void drive(memref *r, llmem_memory *m, batch *b, int32_t n_ubatch)
{
    char err[512] = "";
    llmem_plan *p = NULL;
    ck_assert_msg(llmem_memory_plan(m, get(b), LLMEM_SPLIT_AUTO, n_ubatch, &p, err, sizeof err) ==
                      LLMEM_OK,
                  "%s", err);
    finish(r, m, p, b, n_ubatch);
}

/* Content for a memory: sequences with partial pages, one shared with a
 * copy (copy-on-write pending), then a plan that needs bigger index
 * buffers (one token per ubatch, 600 ubatches) appending to the copy. */
static void plan_under_faults(const mr_config *cfg)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = NULL;
    char err[256] = "";
    memref *r = memref_create(be, cfg, &m, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    batch b = {0};
    add(&b, r, 0, 21, 100);
    add(&b, r, 2, 5, 200);
    drive(r, m, &b, 512);
    ck_assert_int_eq(memref_seq_cp(r, 0, 1, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    check_ref(r, "after seq_cp");

    b.n = 0;
    add(&b, r, 1, 600, 300);
    hook h = {.fail_at = 0};
    int32_t injected = 0;
    for (;; h = (hook){.fail_at = h.fail_at + 1}) {
        llmem_plan *p = NULL;
        llmem_backend_set_alloc_hook(be, hook_fn, &h);
        llmem_status st = llmem_memory_plan(m, get(&b), LLMEM_SPLIT_AUTO, 1, &p, err, sizeof err);
        llmem_backend_set_alloc_hook(be, NULL, NULL);
        if (st == LLMEM_OK) {
            ck_assert_int_le(h.calls, h.fail_at); /* no allocation failed */
            finish(r, m, p, &b, 1); /* usable afterwards */
            break;
        }
        injected++;
        ck_assert_msg(st == LLMEM_E_NO_MEMORY, "allocation %d failed: plan returned %s (%s)",
                      h.fail_at, llmem_status_str(st), err);
        ck_assert_ptr_null(p);
        char where[64];
        snprintf(where, sizeof where, "plan with allocation %d failing", h.fail_at);
        check_ref(r, where);
    }
    ck_assert_msg(injected > 0, "the plan allocated nothing: the scenario tests nothing");
    memref_destroy(r);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}

START_TEST(kv_plan_faults)
{
    mr_config c = {.n_seq_max = 3, .n_children = 1};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = 2, .page_size = 16, .n_pages = 64,
                                   .prefix = true};
    plan_under_faults(&c);
}
END_TEST

START_TEST(rs_plan_faults)
{
    mr_config c = {.n_seq_max = 3, .n_children = 1};
    c.child[0] = (mr_child_config){.kv = false, .n_layers = 2, .n_ckpt = 2};
    plan_under_faults(&c);
}
END_TEST

/* The KV child reserves first (copy-on-write of the shared page, new
 * pages); the recurrent child's index allocation then fails. */
START_TEST(hybrid_kv_first_plan_faults)
{
    mr_config c = {.n_seq_max = 3, .n_children = 2, .n_layers = 3, .layer_child = {0, 1, 0}};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = 2, .page_size = 16, .n_pages = 64,
                                   .prefix = true};
    c.child[1] = (mr_child_config){.kv = false, .n_layers = 1, .n_ckpt = 1};
    plan_under_faults(&c);
}
END_TEST

START_TEST(hybrid_rs_first_plan_faults)
{
    mr_config c = {.n_seq_max = 3, .n_children = 2, .n_layers = 3, .layer_child = {0, 1, 1}};
    c.child[0] = (mr_child_config){.kv = false, .n_layers = 1, .n_ckpt = 1};
    c.child[1] = (mr_child_config){.kv = true, .n_layers = 2, .page_size = 16, .n_pages = 64,
                                   .prefix = true};
    plan_under_faults(&c);
}
END_TEST

/* The very first plan of a memory allocates its index buffer. */
START_TEST(first_plan_faults)
{
    llmem_backend *be = mt_cpu();
    create_fn makers[2] = {create_kv, create_rs};
    for (int32_t k = 0; k < 2; k++) {
        llmem_memory *m = NULL;
        ck_assert_int_eq(makers[k](be, &m, NULL, 0), LLMEM_OK);
        llmem_memory_stats fresh, now;
        llmem_memory_get_stats(m, &fresh);
        int32_t tok[3] = {1, 2, 3}, pos[3] = {0, 1, 2};
        llmem_batch b = {.n_tokens = 3, .token = tok, .pos = pos};
        hook h = {.fail_at = 0};
        llmem_plan *p = NULL;
        llmem_backend_set_alloc_hook(be, hook_fn, &h);
        ck_assert_int_eq(llmem_memory_plan(m, &b, LLMEM_SPLIT_AUTO, 512, &p, NULL, 0),
                         LLMEM_E_NO_MEMORY);
        llmem_backend_set_alloc_hook(be, NULL, NULL);
        ck_assert_ptr_null(p);
        ck_assert_int_eq(llmem_memory_seq_len(m, 0), 0);
        llmem_memory_get_stats(m, &now);
        ck_assert_int_eq(now.pages_used, fresh.pages_used);
        ck_assert_int_eq(now.pages_free, fresh.pages_free);
        ck_assert_int_eq(now.slots_used, fresh.slots_used);
        char err[256] = "";
        ck_assert_msg(llmem_memory_check(m, err, sizeof err) == LLMEM_OK, "%s", err);
        ck_assert_int_eq(llmem_memory_plan(m, &b, LLMEM_SPLIT_AUTO, 512, &p, NULL, 0), LLMEM_OK);
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
            ck_assert_int_eq(llmem_memory_apply(m, p, u, NULL), LLMEM_OK);
            ck_assert_int_eq(llmem_memory_commit(m, p, u), LLMEM_OK);
        }
        llmem_memory_release(m, p);
        ck_assert_int_eq(llmem_memory_seq_len(m, 0), 3);
        llmem_memory_destroy(m);
    }
    llmem_backend_close(be);
}
END_TEST

/* With every allocation failing after plan: apply/view/commit/release,
 * sequence operations and state I/O need no device allocation. */
START_TEST(only_plan_allocates)
{
    llmem_backend *be = mt_cpu();
    mr_config c = {.n_seq_max = 3, .n_children = 2, .n_layers = 2, .layer_child = {0, 1}};
    c.child[0] = (mr_child_config){.kv = true, .n_layers = 1, .page_size = 4, .n_pages = 32,
                                   .prefix = true};
    c.child[1] = (mr_child_config){.kv = false, .n_layers = 1, .n_ckpt = 2};
    llmem_memory *m = NULL;
    char err[256] = "";
    memref *r = memref_create(be, &c, &m, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    hook h = {.always = true};
    batch b = {0};
    add(&b, r, 0, 9, 10);
    int32_t n_cached[MR_MAX_SEQ];
    ck_assert_int_eq(memref_plan(r, get(&b), LLMEM_SPLIT_AUTO, 4, n_cached), LLMEM_OK);
    llmem_plan *p = NULL;
    ck_assert_int_eq(llmem_memory_plan(m, get(&b), LLMEM_SPLIT_AUTO, 4, &p, NULL, 0), LLMEM_OK);
    ck_assert_msg(memref_bind(r, err, sizeof err), "%s", err);
    llmem_backend_set_alloc_hook(be, hook_fn, &h);
    run_plan(r, m, p, "plan with allocations failing after planning");
    /* 9 tokens in pages of 4: a partial last page; the copy shares it */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), memref_seq_cp(r, 0, 1, -1, -1));
    ck_assert_int_eq(llmem_memory_seq_add(m, 1, 2, -1, 3), memref_seq_add(r, 1, 2, -1, 3));
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 8, -1), memref_seq_rm(r, 0, 8, -1));
    check_ref(r, "sequence operations with allocations failing");
    size_t size = 0, written = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, 1, &size), LLMEM_OK);
    uint8_t *buf = malloc(size);
    ck_assert_int_eq(llmem_memory_state_write(m, 1, buf, size, &written), LLMEM_OK);
    mr_saved *sv = memref_save(r, 1);
    ck_assert_int_eq(llmem_memory_state_read(m, 2, buf, size, NULL, 0), memref_load(r, 2, sv));
    check_ref(r, "state I/O with allocations failing");
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    ck_assert_int_eq(h.calls, 0); /* not even attempted */
    memref_saved_free(sv);
    free(buf);
    memref_destroy(r);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fault_injection");
    TCase *tc = tcase_create("create");
    tcase_add_test(tc, kv_create_faults);
    tcase_add_test(tc, rs_create_faults);
    suite_add_tcase(s, tc);
    tc = tcase_create("plan");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, first_plan_faults);
    tcase_add_test(tc, kv_plan_faults);
    tcase_add_test(tc, rs_plan_faults);
    tcase_add_test(tc, hybrid_rs_first_plan_faults);
    tcase_add_test(tc, hybrid_kv_first_plan_faults);
    tcase_add_test(tc, only_plan_allocates);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

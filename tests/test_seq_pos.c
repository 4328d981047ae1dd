// ctest-labels: core
/* A sequence's positions kept as a run while they are one (memory/seq_pos.h):
 * random appends (mostly consecutive, sometimes not), truncations, stores,
 * assignments and prefix copies, checked after every step against a plain
 * int32 array: every position, pos_min / pos_max, and the range queries of
 * seq_rm / seq_cp computed by brute force from their definitions. */
#include "support/run.h"
#include <stdint.h>
#include <stdlib.h>

#include "memory/seq_heap.h"
#include "memory/seq_pos.h"

#define CAP 300

typedef struct ref {
    int32_t v[CAP];
    int32_t n;
} ref;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Index of the first token with a position in [p0, p1) when those tokens
 * are exactly a suffix, n when there are none, else -1 (by definition). */
static int32_t ref_suffix(const ref *r, int32_t p0, int32_t p1)
{
    int32_t first = -1;
    for (int32_t j = 0; j < r->n; j++) {
        bool in = r->v[j] >= p0 && r->v[j] < p1;
        if (in && first < 0)
            first = j;
        if (!in && first >= 0)
            return -1;
    }
    return first < 0 ? r->n : first;
}

/* Number of leading tokens in [p0, p1) when they are all such tokens. */
static int32_t ref_prefix(const ref *r, int32_t p0, int32_t p1)
{
    int32_t k = 0;
    while (k < r->n && r->v[k] >= p0 && r->v[k] < p1)
        k++;
    for (int32_t j = k; j < r->n; j++)
        if (r->v[j] >= p0 && r->v[j] < p1)
            return -1;
    return k;
}

static void check(const seq_pos *p, const ref *r)
{
    ck_assert_int_eq(p->v.n, r->n);
    int32_t mn = -1, mx = -1, bad = -1, out[CAP];
    seq_pos_get(p, out, r->n);
    for (int32_t j = 0; j < r->n; j++) {
        if (bad < 0 && (seq_pos_at(p, j) != r->v[j] || out[j] != r->v[j]))
            bad = j;
        if (mn < 0 || r->v[j] < mn)
            mn = r->v[j];
        if (r->v[j] > mx)
            mx = r->v[j];
    }
    ck_assert_int_eq(bad, -1); /* the first token whose position differs */
    ck_assert_int_eq(p->pm.min, mn);
    ck_assert_int_eq(p->pm.max, mx);
    ck_assert(seq_pos_ok(p));
    for (int32_t t = 0; t < 6; t++) {
        int32_t p0 = (int32_t)rnd(CAP + 40) - 20, p1 = t == 0 ? INT32_MAX : p0 + (int32_t)rnd(CAP);
        int32_t ss = seq_pos_suffix_start(p, p0, p1), pl = seq_pos_prefix_len(p, p0, p1);
        /* the helpers of memory_impl.h answer -1 for unsorted positions
         * whose in-range tokens are not a suffix / prefix, as the
         * reference does; for sorted ones they binary-search */
        ck_assert_int_eq(ss, ref_suffix(r, p0, p1));
        ck_assert_int_eq(pl, ref_prefix(r, p0, p1));
    }
}

START_TEST(test_random_ops)
{
    seq_heap *h = seq_heap_create();
    ck_assert_ptr_nonnull(h);
    seq_pos a = {0}, b = {0};
    ref ra = {.n = 0}, rb = {.n = 0};
    ck_assert(seq_heap_attach(h, &a.v));
    ck_assert(seq_heap_attach(h, &b.v));
    seq_pos_clear(&a);
    seq_pos_clear(&b);
    int32_t runs = 0, stores = 0;
    for (int32_t step = 0; step < 2000; step++) {
        uint32_t op = rnd(100);
        if (op < 70 && ra.n < CAP) { /* append: next position, or not */
            int32_t x = ra.n == 0 ? (int32_t)rnd(50) : ra.v[ra.n - 1] + 1;
            if (rnd(40) == 0)
                x = (int32_t)rnd(CAP);
            ck_assert(seq_pos_push(&a, x));
            ra.v[ra.n++] = x;
        } else if (op < 80) { /* truncate (seq_rm of a suffix) */
            int32_t k = (int32_t)rnd((uint32_t)ra.n + 1);
            seq_pos_truncate(&a, k);
            ra.n = k;
        } else if (op < 85) { /* stored from now on (seq_add / seq_div) */
            ck_assert(seq_pos_store(&a, 0));
            ck_assert(a.stored);
            for (int32_t j = 0; j < ra.n; j++)
                if (ra.v[j] >= 10)
                    a.v.v[j] = ra.v[j] = ra.v[j] - (int32_t)rnd(3);
            seq_pos_meta_reset(&a);
            stores++;
        } else if (op < 92) { /* assign (state read): a run, or any positions */
            int32_t n = (int32_t)rnd(CAP), src[CAP], base = (int32_t)rnd(100);
            bool run = rnd(2);
            for (int32_t j = 0; j < n; j++)
                src[j] = run ? base + j : (int32_t)rnd(CAP);
            ck_assert(seq_pos_assign(&a, src, n));
            if (run)
                ck_assert(!a.stored); /* no storage for a run */
            for (int32_t j = 0; j < n; j++)
                ra.v[j] = src[j];
            ra.n = n;
            runs += !a.stored;
        } else { /* seq_cp of a prefix into b */
            int32_t k = (int32_t)rnd((uint32_t)ra.n + 1);
            if (a.stored)
                ck_assert(seq_pos_reserve(&b, k));
            ck_assert(seq_pos_copy_prefix(&b, &a, k));
            for (int32_t j = 0; j < k; j++)
                rb.v[j] = ra.v[j];
            rb.n = k;
            check(&b, &rb);
        }
        check(&a, &ra);
    }
    ck_assert_int_gt(runs, 0);
    ck_assert_int_gt(stores, 0);
    i32vec_free(&a.v);
    i32vec_free(&b.v);
    seq_heap_destroy(h);
}
END_TEST

/* A run's positions cost no storage, whatever its length: v stays at the
 * 4 entries attach gave it, and storing then holds every position. */
START_TEST(test_run_takes_no_room)
{
    seq_heap *h = seq_heap_create();
    ck_assert_ptr_nonnull(h);
    seq_pos a = {0};
    ck_assert(seq_heap_attach(h, &a.v));
    seq_pos_clear(&a);
    int32_t cap0 = a.v.cap;
    for (int32_t j = 0; j < 100000; j++)
        ck_assert(seq_pos_push(&a, 7 + j));
    ck_assert(!a.stored);
    ck_assert_int_eq(a.v.cap, cap0);
    ck_assert_int_eq(a.pm.min, 7);
    ck_assert_int_eq(a.pm.max, 7 + 99999);
    ck_assert(seq_pos_push(&a, 3)); /* out of order: stored from here */
    ck_assert(a.stored);
    ck_assert_int_eq(a.v.n, 100001);
    int32_t bad = -1;
    for (int32_t j = 0; j < 100000; j++)
        if (bad < 0 && a.v.v[j] != 7 + j)
            bad = j;
    ck_assert_int_eq(bad, -1);
    ck_assert_int_eq(a.v.v[100000], 3);
    ck_assert(a.pm.unsorted);
    ck_assert_int_eq(a.pm.min, 3);
    i32vec_free(&a.v);
    seq_heap_destroy(h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("seq_pos");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_random_ops);
    tcase_add_test(tc, test_run_takes_no_room);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

// ctest-labels: core
/* The seq heap (memory/seq_heap.h) behind per-sequence arrays: heap-backed
 * i32vecs grown and freed in random order keep exactly the entries a plain
 * reference array of each receives, freed blocks are reused by their size
 * class, and requests past the largest class fail with the vector intact. */
#define _DEFAULT_SOURCE /* mmap's MAP_ANONYMOUS, mincore, madvise */
#include "support/run.h"
#include <stdint.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "memory/seq_heap.h"

#define NV 96

typedef struct ref_vec {
    int32_t *v;
    int32_t n, cap;
} ref_vec;

static void ref_push(ref_vec *r, int32_t x)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = realloc(r->v, (size_t)r->cap * sizeof *r->v);
        ck_assert_ptr_nonnull(r->v);
    }
    r->v[r->n++] = x;
}

static void check_same(const i32vec *a, const ref_vec *r, int32_t k)
{
    ck_assert_int_eq(a->n, r->n);
    int32_t i = 0;
    while (i < r->n && a->v[i] == r->v[i])
        i++;
    ck_assert_msg(i == r->n, "vector %d entry %d: %d, reference %d", k, i, a->v[i], r->v[i]);
}

START_TEST(test_random_growth)
{
    uint64_t seed = 12345;
    seq_heap *h = seq_heap_create();
    ck_assert_ptr_nonnull(h);
    i32vec a[NV];
    ref_vec r[NV];
    memset(a, 0, sizeof a);
    memset(r, 0, sizeof r);
    for (int32_t k = 0; k < NV; k++) {
        ck_assert(seq_heap_attach(h, &a[k]));
        ck_assert(!seq_heap_attach(h, &a[k])); /* only an empty, unallocated vector */
    }
    for (int32_t step = 0; step < 3000; step++) {
        int32_t k = (int32_t)(test_rand32(&seed) % NV);
        uint32_t op = test_rand32(&seed) % 16;
        if (op == 0) { /* truncate (a sequence's seq_rm): keeps the block */
            int32_t n = r[k].n ? (int32_t)(test_rand32(&seed) % (uint32_t)r[k].n) : 0;
            a[k].n = r[k].n = n;
        } else if (op == 1) { /* free and attach again */
            i32vec_free(&a[k]);
            ck_assert_ptr_null(a[k].v);
            ck_assert_int_eq(a[k].n, 0);
            r[k].n = 0;
            ck_assert(seq_heap_attach(h, &a[k]));
        } else if (op == 2) { /* reserve ahead, then fill exactly */
            int32_t want = a[k].n + (int32_t)(test_rand32(&seed) % 5000);
            ck_assert(i32vec_reserve(&a[k], want));
            while (a[k].n < want) {
                int32_t x = (int32_t)test_rand32(&seed);
                a[k].v[a[k].n++] = x;
                ref_push(&r[k], x);
            }
        } else { /* pushes, as commit appends tokens */
            int32_t m = (int32_t)(test_rand32(&seed) % 300);
            for (int32_t j = 0; j < m; j++) {
                int32_t x = (int32_t)test_rand32(&seed);
                ck_assert(i32vec_push(&a[k], x));
                ref_push(&r[k], x);
            }
        }
        check_same(&a[k], &r[k], k);
    }
    for (int32_t k = 0; k < NV; k++)
        check_same(&a[k], &r[k], k);
    /* one vector past SEQ_HEAP_BIG bytes takes a block of its own */
    size_t before = seq_heap_bytes(h);
    int32_t big = (int32_t)(SEQ_HEAP_BIG / sizeof(int32_t)) + 1;
    ck_assert(i32vec_reserve(&a[0], big));
    ck_assert_uint_ge(seq_heap_bytes(h), before + SEQ_HEAP_BIG);
    for (int32_t i = a[0].n; i < big; i++) {
        a[0].v[i] = i;
        ref_push(&r[0], i);
    }
    a[0].n = big;
    check_same(&a[0], &r[0], 0);
    i32vec_free(&a[0]);
    ck_assert_uint_lt(seq_heap_bytes(h), before + SEQ_HEAP_BIG);
    for (int32_t k = 1; k < NV; k++)
        i32vec_free(&a[k]);
    for (int32_t k = 0; k < NV; k++)
        free(r[k].v);
    seq_heap_destroy(h);
}
END_TEST

START_TEST(test_reuse_and_limits)
{
    seq_heap *h = seq_heap_create();
    ck_assert_ptr_nonnull(h);
    i32vec a = {0}, b = {0};
    ck_assert(seq_heap_attach(h, &a));
    ck_assert(i32vec_reserve(&a, 1000));
    for (int32_t i = 0; i < 1000; i++)
        a.v[i] = 7 * i;
    a.n = 1000;
    int32_t *old = a.v;
    /* a class never exceeds 1 << 30 entries: refused, nothing changes */
    ck_assert(!i32vec_reserve(&a, (1 << 30) + 1));
    ck_assert_ptr_eq(a.v, old);
    ck_assert_int_eq(a.n, 1000);
    for (int32_t i = 0; i < 1000; i++)
        ck_assert_int_eq(a.v[i], 7 * i);
    /* a freed block is the next one of its class */
    size_t bytes = seq_heap_bytes(h);
    i32vec_free(&a);
    ck_assert(seq_heap_attach(h, &b));
    ck_assert(i32vec_reserve(&b, 1000));
    ck_assert_ptr_eq(b.v, old);
    ck_assert_uint_eq(seq_heap_bytes(h), bytes);
    i32vec_free(&b);
    i32vec_free(&b); /* freeing twice is a no-op on {NULL, 0, 0} */
    seq_heap_destroy(h);
    seq_heap_destroy(NULL);
}
END_TEST

/* A block larger than the next chunk gets a chunk of its own, whose
 * start the heap aligns to a cache line: the chunk must still hold the
 * whole block. It did not: a 128K-entry page table (the bench's 128K-token
 * prompt in pages of 1) overran its malloc'd chunk by up to 48 bytes. Each
 * round takes a fresh heap (so the block's chunk is sized exactly for it)
 * after a pad that moves the chunk's start within a cache line, then writes
 * an object right after the chunk: an overrun shows as changed entries. */
START_TEST(test_block_larger_than_chunk)
{
    enum { N = 1 << 17, NB = 4 }; /* 512 KiB blocks: more than the first 256 KiB chunk */
#if defined(__GLIBC__)
    /* chunks from the main heap, one after the other, not from mmap (whose
     * page slack would hide an overrun); this test runs in its own process */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
#endif
    seq_heap *h[NB];
    i32vec a[NB] = {{0}};
    char *pad[NB], *after[NB];
    for (int32_t k = 0; k < NB; k++) {
        pad[k] = malloc(16 * (size_t)(k + 1));
        ck_assert_ptr_nonnull(pad[k]);
        h[k] = seq_heap_create();
        ck_assert_ptr_nonnull(h[k]);
        ck_assert(seq_heap_attach(h[k], &a[k]));
        ck_assert(i32vec_reserve(&a[k], N));
        for (int32_t i = 0; i < N; i++)
            a[k].v[i] = i * NB + k;
        a[k].n = N;
        after[k] = malloc(256);
        ck_assert_ptr_nonnull(after[k]);
        memset(after[k], 0x55, 256);
    }
    for (int32_t k = 0; k < NB; k++) {
        int32_t bad = -1; /* the first changed entry (one assert: keeps it fast under ASan) */
        for (int32_t i = 0; i < N && bad < 0; i++)
            if (a[k].v[i] != i * NB + k)
                bad = i;
        ck_assert_int_eq(bad, -1);
        i32vec_free(&a[k]);
        seq_heap_destroy(h[k]);
        free(pad[k]);
        free(after[k]);
    }
}
END_TEST

/* Equally long arrays grown one after the other (sequences of one length,
 * the decode benchmark's case) keep their tails in different cache sets
 * across chunks: in a 2 MiB, 16-way cache of 64-byte lines (2,048 sets,
 * set = (byte address / 64) mod 2048) no set may hold more tails than a
 * set has ways. Blocks of 128 KiB + header: without the chunks' colours
 * every 2 MiB-aligned chunk put its tails into the same sets. Only
 * addresses are looked at: nothing is written past the headers. */
START_TEST(test_tails_spread_over_sets)
{
    enum { N = 1000, LEN = 32768 };
    seq_heap *h = seq_heap_create();
    ck_assert_ptr_nonnull(h);
    static i32vec v[N];
    static uint16_t per_set[2048];
    memset(v, 0, sizeof v);
    memset(per_set, 0, sizeof per_set);
    int32_t worst = 0;
    for (int32_t i = 0; i < N; i++) {
        ck_assert(seq_heap_attach(h, &v[i]));
        ck_assert(i32vec_reserve(&v[i], LEN));
        int32_t set = (int32_t)(((uintptr_t)(v[i].v + LEN - 1) / 64) % 2048);
        if (++per_set[set] > worst)
            worst = per_set[set];
    }
    ck_assert_msg(worst <= 16, "%d tails in one cache set", worst);
    for (int32_t i = 0; i < N; i++)
        i32vec_free(&v[i]);
    seq_heap_destroy(h);
}
END_TEST

/* seq_heap_prefault makes every 4 KiB page of the range resident (mincore
 * on an untouched anonymous mapping: none before, all after, the first and
 * last partly covered pages included) and changes no byte, in the range
 * or beside it; NULL and an empty range do nothing. */
START_TEST(test_prefault)
{
    seq_heap_prefault(NULL, 4096);
    seq_heap_prefault(&(char){7}, 0);
#if defined(__linux__)
    enum { PAGES = 64 };
    size_t len = (size_t)PAGES * 4096;
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    (void)madvise(m, len, MADV_NOHUGEPAGE); /* 4 KiB pages, counted one by one */
    unsigned char vec[PAGES];
    ck_assert_int_eq(mincore(m, len, vec), 0);
    int resident = 0;
    for (int i = 0; i < PAGES; i++)
        resident += vec[i] & 1;
    ck_assert_int_eq(resident, 0);
    /* the range starts 100 bytes into page 1 and ends 100 bytes into page
     * PAGES - 2; pages 0 and PAGES - 1, outside it, get a pattern */
    m[0] = 0x5a;
    m[len - 1] = 0xa5;
    seq_heap_prefault(m + 4096 + 100, (size_t)(PAGES - 3) * 4096);
    ck_assert_int_eq(mincore(m, len, vec), 0);
    for (int i = 0; i < PAGES; i++)
        ck_assert_msg(vec[i] & 1, "page %d not resident", i);
    for (size_t k = 1; k < len - 1; k++)
        ck_assert_msg(m[k] == 0, "byte %zu changed", k);
    ck_assert_int_eq(m[0], 0x5a);
    ck_assert_int_eq(m[len - 1], 0xa5);
    munmap(m, len);
#endif
}
END_TEST

int main(void)
{
    Suite *s = suite_create("seq_heap");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_random_growth);
    tcase_add_test(tc, test_reuse_and_limits);
    tcase_add_test(tc, test_block_larger_than_chunk);
    tcase_add_test(tc, test_tails_spread_over_sets);
    tcase_add_test(tc, test_prefault);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

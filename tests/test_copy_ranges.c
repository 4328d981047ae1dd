// ctest-labels: core vulkan
/* Batched device copies (llmem_buffer_copy_ranges, <llmem/backend.h>) on
 * every backend of $LLMEM_TEST_BACKENDS:
 *   - random batches of disjoint ranges (16-byte, 4-byte and odd
 *     alignments, empty ranges, ranges within one buffer, ranges of several
 *     MiB, thousands of small ranges: a range table larger than CUDA's
 *     64 KiB staged upload) against a brute-force byte copy on the host,
 *     through the backend's slot and through the fallback loop
 *     (LLMEM_COPY_RANGES=0), on Vulkan also with buffers of 64 KiB
 *     chunks; bytes outside every destination unchanged;
 *   - bad batches (a range past its buffer, an offset that overflows, a
 *     NULL buffer, overlaps of two destinations, of a destination and
 *     another range's source, of a range with itself, buffers of two
 *     backends, n < 0): LLMEM_E_INVALID and every buffer as it was, also
 *     when valid ranges come before the bad one;
 *   - a batch recorded into a step (llmem_backend_record) and replayed
 *     after the sources changed copies the new contents.
 */
#include "support/run.h"
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define OK(x) ck_assert_int_eq((x), LLMEM_OK)

enum { NB = 3 };
static const size_t buf_size[NB] = {(size_t)96 << 10, ((size_t)5 << 20) + 1000, 300001};

typedef struct bufs {
    llmem_buffer *b[NB];
    unsigned char *host[NB]; /* what each buffer holds (the reference) */
} bufs;

static void bufs_make(llmem_backend *be, bufs *s, ref64_rng *r)
{
    for (int i = 0; i < NB; i++) {
        OK(llmem_buffer_alloc(be, buf_size[i], &s->b[i]));
        s->host[i] = malloc(buf_size[i]);
        ck_assert_ptr_nonnull(s->host[i]);
        for (size_t k = 0; k < buf_size[i]; k++)
            s->host[i][k] = (unsigned char)(ref64_next(r) >> 56);
        OK(llmem_buffer_upload(s->b[i], 0, s->host[i], buf_size[i]));
    }
}

static void bufs_free(bufs *s)
{
    for (int i = 0; i < NB; i++) {
        llmem_buffer_free(s->b[i]);
        free(s->host[i]);
    }
}

/* Every buffer equals its host reference, byte for byte. */
static void bufs_check(const bufs *s, const char *be, const char *what)
{
    for (int i = 0; i < NB; i++) {
        unsigned char *got = malloc(buf_size[i]);
        ck_assert_ptr_nonnull(got);
        OK(llmem_buffer_download(s->b[i], 0, got, buf_size[i]));
        size_t bad = SIZE_MAX;
        for (size_t k = 0; k < buf_size[i] && bad == SIZE_MAX; k++)
            if (got[k] != s->host[i][k])
                bad = k;
        ck_assert_msg(bad == SIZE_MAX, "%s, %s: buffer %d byte %zu is %u, expected %u", be, what,
                      i, bad, bad == SIZE_MAX ? 0u : got[bad],
                      bad == SIZE_MAX ? 0u : s->host[i][bad]);
        free(got);
    }
}

/* Bytes marked in one buffer: 1 read by a range, 2 written. */
static bool span_free(const unsigned char *mark, size_t at, size_t n, unsigned char worst)
{
    for (size_t k = 0; k < n; k++)
        if (mark[at + k] > worst)
            return false;
    return true;
}

static size_t pick_size(ref64_rng *r, int kind, size_t cap)
{
    size_t n;
    switch (kind) {
    case 0: n = 16 * (size_t)ref64_int(r, 1, 64); break;       /* 16-byte units */
    case 1: n = 4 * (size_t)ref64_int(r, 1, 300); break;       /* words */
    case 2: n = (size_t)ref64_int(r, 1, 777); break;           /* bytes */
    case 3: n = 16 * (size_t)ref64_int(r, 4096, 40000); break; /* 64 KiB - 640 KiB */
    default: n = 0; break;                                     /* empty */
    }
    return n < cap ? n : cap;
}

/* Up to `want` random disjoint ranges over s (a destination touches no
 * other range; sources may share bytes); alignment of offsets follows the
 * size's kind. Returns how many were made. */
static int32_t make_ranges(ref64_rng *r, bufs *s, unsigned char **mark, llmem_copy_range *out,
                           int32_t want, bool small_only)
{
    int32_t n = 0;
    for (int32_t tries = 0; n < want && tries < want * 20; tries++) {
        int kind = small_only ? ref64_int(r, 0, 2) : ref64_int(r, 0, 4);
        if (!small_only && kind == 3 && ref64_int(r, 0, 3) != 0)
            kind = 0; /* keep the large ones few */
        int di = ref64_int(r, 0, NB - 1), si = ref64_int(r, 0, NB - 1);
        size_t align = kind == 0 || kind == 3 ? 16 : kind == 1 ? 4 : 1;
        size_t size = pick_size(r, kind, buf_size[di] < buf_size[si] ? buf_size[di] : buf_size[si]);
        size_t dmax = (buf_size[di] - size) / align, smax = (buf_size[si] - size) / align;
        size_t d_at = (size_t)ref64_uniform(r, 0, (double)dmax + 1) * align;
        size_t s_at = (size_t)ref64_uniform(r, 0, (double)smax + 1) * align;
        if (ref64_int(r, 0, 9) == 0) /* a range that ends at its buffer's end */
            d_at = buf_size[di] - size;
        if (d_at > buf_size[di] - size || s_at > buf_size[si] - size)
            continue;
        if (size > 0) {
            if (!span_free(mark[di], d_at, size, 0) || !span_free(mark[si], s_at, size, 1))
                continue;
            if (di == si && d_at < s_at + size && s_at < d_at + size)
                continue;
            memset(mark[si] + s_at, 1, size);
            memset(mark[di] + d_at, 2, size);
        }
        out[n++] = (llmem_copy_range){s->b[di], d_at, s->b[si], s_at, size};
    }
    return n;
}

/* Applies the batch to the host references: every source read before any
 * destination is written (the batch's contract). */
static void ref_apply(bufs *s, const llmem_copy_range *rg, int32_t n)
{
    unsigned char *before[NB];
    for (int i = 0; i < NB; i++) {
        before[i] = malloc(buf_size[i]);
        ck_assert_ptr_nonnull(before[i]);
        memcpy(before[i], s->host[i], buf_size[i]);
    }
    for (int32_t j = 0; j < n; j++) {
        int di = -1, si = -1;
        for (int i = 0; i < NB; i++) {
            if (rg[j].dst == s->b[i])
                di = i;
            if (rg[j].src == s->b[i])
                si = i;
        }
        ck_assert(di >= 0 && si >= 0);
        for (size_t k = 0; k < rg[j].size; k++)
            s->host[di][rg[j].dst_offset + k] = before[si][rg[j].src_offset + k];
    }
    for (int i = 0; i < NB; i++)
        free(before[i]);
}

/* _i: backend index * 3 + mode: 0 the backend's batch, 1 the fallback
 * loop, 2 Vulkan buffers of 64 KiB chunks (ranges cut at chunk ends; the
 * variable means nothing to the other backends). */
START_TEST(test_copy_ranges_random)
{
    int bi = _i / 3, mode = _i % 3;
    bool fallback = mode == 1;
    if (mode == 2)
        setenv("LLMEM_VULKAN_MAX_CHUNK", "64K", 1);
    llmem_backend *be = th_open(bi);
    const char *name = th_backend_name(bi);
    ref64_rng r = ref64_rng_make(ref64_seed(), (uint64_t)_i);
    if (fallback) {
        setenv("LLMEM_COPY_RANGES", "0", 1);
        ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK); /* read once otherwise */
    }
    bufs s;
    bufs_make(be, &s, &r);
    unsigned char *mark[NB];
    enum { MAXR = 6000 };
    llmem_copy_range *rg = malloc(MAXR * sizeof *rg);
    ck_assert_ptr_nonnull(rg);
    /* rounds: mixed sizes; then many small ranges (a large range table) */
    const int32_t want[] = {1, 7, 200, 5000};
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < NB; i++) {
            mark[i] = calloc(buf_size[i], 1);
            ck_assert_ptr_nonnull(mark[i]);
        }
        int32_t n = make_ranges(&r, &s, mark, rg, want[round], round == 3);
        ck_assert_int_ge(n, want[round] / 2);
        OK(llmem_buffer_copy_ranges(rg, n));
        ref_apply(&s, rg, n);
        char what[64];
        snprintf(what, sizeof what, "%s, round %d (%d ranges)",
                 fallback ? "fallback loop" : mode == 2 ? "batched, 64 KiB chunks" : "batched",
                 round, n);
        bufs_check(&s, name, what);
        for (int i = 0; i < NB; i++)
            free(mark[i]);
    }
    OK(llmem_buffer_copy_ranges(NULL, 0));
    OK(llmem_buffer_copy_ranges(rg, 0));
    free(rg);
    bufs_free(&s);
    if (fallback) {
        unsetenv("LLMEM_COPY_RANGES");
        ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
    }
    llmem_backend_close(be);
    if (mode == 2)
        unsetenv("LLMEM_VULKAN_MAX_CHUNK");
}
END_TEST

START_TEST(test_copy_ranges_invalid)
{
    llmem_backend *be = th_open(_i);
    const char *name = th_backend_name(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 100 + (uint64_t)_i);
    bufs s;
    bufs_make(be, &s, &r);
    llmem_buffer *a = s.b[0], *b = s.b[1];
    size_t na = buf_size[0];
    /* a valid first range: refused batches must not have run it */
    const llmem_copy_range good = {a, 0, b, 4096, 1024};
    struct {
        const char *what;
        llmem_copy_range bad;
    } cases[] = {
        {"destination past the end", {a, na - 100, b, 0, 101}},
        {"source past the end", {a, 8192, b, buf_size[1] - 8, 16}},
        {"offset that overflows", {a, SIZE_MAX - 8, b, 0, 16}},
        {"size that overflows", {a, 8192, b, 0, SIZE_MAX}},
        {"NULL destination", {NULL, 0, b, 0, 16}},
        {"NULL source", {a, 8192, NULL, 0, 16}},
        {"two destinations overlap", {a, 1000, b, 20000, 64}},
        {"a destination overlaps another's source", {b, 4096 + 1000, a, 50000, 64}},
        {"a range overlaps itself", {a, 9000, a, 9010, 64}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        llmem_copy_range batch[2] = {good, cases[k].bad};
        ck_assert_msg(llmem_buffer_copy_ranges(batch, 2) == LLMEM_E_INVALID, "%s: %s accepted",
                      name, cases[k].what);
        bufs_check(&s, name, cases[k].what);
    }
    llmem_copy_range one = good;
    ck_assert_int_eq(llmem_buffer_copy_ranges(&one, -1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy_ranges(NULL, 1), LLMEM_E_INVALID);
    /* buffers of two backends in one batch (the cpu one as the other) */
    llmem_backend *cpu = th_open_cpu();
    llmem_buffer *c = NULL;
    OK(llmem_buffer_alloc(cpu, 4096, &c));
    llmem_copy_range mixed[2] = {good, {c, 0, c, 2048, 16}};
    if (llmem_buffer_backend(c) != be) {
        ck_assert_int_eq(llmem_buffer_copy_ranges(mixed, 2), LLMEM_E_INVALID);
        llmem_copy_range cross = {a, 0, c, 0, 16};
        ck_assert_int_eq(llmem_buffer_copy_ranges(&cross, 1), LLMEM_E_INVALID);
    }
    bufs_check(&s, name, "ranges of two backends");
    llmem_buffer_free(c);
    llmem_backend_close(cpu);
    /* the good range alone goes through */
    OK(llmem_buffer_copy_ranges(&one, 1));
    ref_apply(&s, &one, 1);
    bufs_check(&s, name, "the valid range alone");
    bufs_free(&s);
    llmem_backend_close(be);
}
END_TEST

typedef struct rec_ctx {
    const llmem_copy_range *rg;
    int32_t n;
} rec_ctx;

static llmem_status rec_fn(void *ctx)
{
    rec_ctx *c = ctx;
    return llmem_buffer_copy_ranges(c->rg, c->n);
}

START_TEST(test_copy_ranges_recorded)
{
    llmem_backend *be = th_open(_i);
    const char *name = th_backend_name(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 200 + (uint64_t)_i);
    bufs s;
    bufs_make(be, &s, &r);
    llmem_buffer *a = s.b[0], *b = s.b[1];
    /* buffer 1's bytes [0, 64 KiB) into 3 places of buffer 0, 3 of them odd */
    llmem_copy_range rg[4] = {
        {a, 0, b, 0, 16384}, {a, 20000, b, 16384, 4000}, {a, 40001, b, 30001, 333},
        {a, 50000, b, 40000, 0}};
    rec_ctx ctx = {rg, 4};
    llmem_recording *rec = NULL;
    OK(llmem_backend_record(be, rec_fn, &ctx, &rec));
    for (int rep = 0; rep < 2; rep++) {
        for (size_t k = 0; k < 65536; k++)
            s.host[1][k] = (unsigned char)(ref64_next(&r) >> 56);
        OK(llmem_buffer_upload(b, 0, s.host[1], 65536));
        OK(llmem_recording_replay(rec));
        ref_apply(&s, rg, 4);
        bufs_check(&s, name, rep ? "second replay" : "first replay");
    }
    llmem_recording_free(rec);
    bufs_free(&s);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    int n = th_backends_probe();
    Suite *s = suite_create("copy_ranges");
    TCase *tc = tcase_create("copy_ranges");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_copy_ranges_random, 0, 3 * n);
    tcase_add_loop_test(tc, test_copy_ranges_invalid, 0, n);
    tcase_add_loop_test(tc, test_copy_ranges_recorded, 0, n);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

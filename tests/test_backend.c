// ctest-labels: core
/* Status names, dtypes and the buffer API (the registry and plugin
 * loading: test_backend_registry.c).
 *
 * Buffer tests run on the built-in "cpu" backend and on the "testplug"
 * plugin (tests/plugins/testplug.c, not host visible, loaded through
 * LLMEM_BACKEND_PATH), and compare every result with a host mirror the
 * test keeps itself. LLMEM_TEST_SEED=<n> changes the random seed (default
 * fixed).
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend.h"
#include "llmem/backend_impl.h"
#include "support/backend_test.h"

static const char *const backends_under_test[] = {"cpu", "testplug"};
#define N_BACKENDS ((int)(sizeof backends_under_test / sizeof backends_under_test[0]))

static llmem_backend *open_under_test(int i)
{
    use_test_plugins();
    rng_seed((uint64_t)i + 1);
    return test_open(backends_under_test[i]);
}

static void expect_contents(llmem_buffer *buf, const unsigned char *mirror, size_t size)
{
    unsigned char *got = malloc(size);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(llmem_buffer_download(buf, 0, got, size), LLMEM_OK);
    ck_assert_msg(memcmp(got, mirror, size) == 0, "buffer differs from the host mirror");
    free(got);
}

/* IEEE 754 binary16 -> double, written out from the format definition. */
static double half_to_double(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp((double)man, -24);
    else
        v = ldexp((double)(man | 0x400), exp - 25);
    return sign ? -v : v;
}

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Every element of dtype t in the 4 bytes at p is NaN (i32: the poison
 * value, which reads as an f32 NaN). */
static bool word_is_nan(const unsigned char *p, llmem_dtype t)
{
    uint32_t w;
    uint16_t h[2];
    memcpy(&w, p, 4);
    memcpy(h, p, 4);
    switch (t) {
    case LLMEM_DTYPE_F32:
    case LLMEM_DTYPE_I32:
    case LLMEM_DTYPE_I8: return isnan(bits_to_float(w)); /* no NaN code: the f32 pattern */
    case LLMEM_DTYPE_F8E4M3: /* E4M3 NaN: every bit but the sign set (OCP FP8 spec) */
        return (p[0] & 0x7f) == 0x7f && (p[1] & 0x7f) == 0x7f && (p[2] & 0x7f) == 0x7f &&
               (p[3] & 0x7f) == 0x7f;
    case LLMEM_DTYPE_F16: return isnan(half_to_double(h[0])) && isnan(half_to_double(h[1]));
    case LLMEM_DTYPE_BF16:
        return isnan(bits_to_float((uint32_t)h[0] << 16)) &&
               isnan(bits_to_float((uint32_t)h[1] << 16));
    default: return false;
    }
}

/* --- status and dtypes -------------------------------------------------------- */

START_TEST(test_status_names)
{
    const llmem_status all[] = {LLMEM_OK, LLMEM_E_INVALID, LLMEM_E_NO_MEMORY, LLMEM_E_NO_SPACE,
                                LLMEM_E_UNSUPPORTED, LLMEM_E_NOT_FOUND, LLMEM_E_ABI,
                                LLMEM_E_CORRUPT, LLMEM_E_BUSY, LLMEM_E_STATE, LLMEM_E_BACKEND,
                                LLMEM_E_IO};
    const int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) {
        const char *s = llmem_status_str(all[i]);
        ck_assert_ptr_nonnull(s);
        ck_assert_msg(strncmp(s, "LLMEM_", 6) == 0, "status %d: \"%s\"", (int)all[i], s);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(s, llmem_status_str(all[j]));
    }
    ck_assert_ptr_nonnull(strstr(llmem_status_str(LLMEM_E_NO_SPACE), "LLMEM_E_NO_SPACE"));
    ck_assert_str_eq(llmem_status_str((llmem_status)-100), "unknown status");
    ck_assert_str_eq(llmem_status_str((llmem_status)1), "unknown status");
}
END_TEST

START_TEST(test_dtypes)
{
    const struct {
        llmem_dtype t;
        const char *name;
        size_t size;
    } want[] = {{LLMEM_DTYPE_F32, "f32", sizeof(float)},
                {LLMEM_DTYPE_F16, "f16", sizeof(uint16_t)},
                {LLMEM_DTYPE_BF16, "bf16", sizeof(uint16_t)},
                {LLMEM_DTYPE_I32, "i32", sizeof(int32_t)}};
    for (int i = 0; i < 4; i++) {
        ck_assert_uint_eq(llmem_dtype_size(want[i].t), want[i].size);
        ck_assert_str_eq(llmem_dtype_name(want[i].t), want[i].name);
        llmem_dtype parsed = LLMEM_DTYPE_COUNT;
        ck_assert_int_eq(llmem_dtype_parse(want[i].name, &parsed), LLMEM_OK);
        ck_assert_int_eq(parsed, want[i].t);
    }
    llmem_dtype d = LLMEM_DTYPE_F16;
    ck_assert_int_eq(llmem_dtype_parse("F32", &d), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_dtype_parse("fp16", &d), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_dtype_parse("", &d), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_dtype_parse(NULL, &d), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_dtype_parse("f32", NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(d, LLMEM_DTYPE_F16); /* failed parses leave *out alone */
    ck_assert_uint_eq(llmem_dtype_size(LLMEM_DTYPE_COUNT), 0);
    ck_assert_uint_eq(llmem_dtype_size((llmem_dtype)-1), 0);
    ck_assert_str_eq(llmem_dtype_name((llmem_dtype)99), "?");
}
END_TEST

START_TEST(test_nan_patterns)
{
    for (int t = 0; t < LLMEM_DTYPE_COUNT; t++) {
        uint32_t p = llmem_nan_pattern((llmem_dtype)t);
        unsigned char bytes[4];
        memcpy(bytes, &p, 4);
        ck_assert_msg(word_is_nan(bytes, (llmem_dtype)t), "%s pattern 0x%08x is not NaN",
                      llmem_dtype_name((llmem_dtype)t), (unsigned)p);
    }
    /* Quiet NaNs: the top mantissa bit is set (IEEE 754-2008 6.2.1). */
    ck_assert_uint_ne(llmem_nan_pattern(LLMEM_DTYPE_F32) & (1u << 22), 0);
    ck_assert_uint_ne(llmem_nan_pattern(LLMEM_DTYPE_F16) & (1u << 9), 0);
    ck_assert_uint_ne(llmem_nan_pattern(LLMEM_DTYPE_BF16) & (1u << 6), 0);
}
END_TEST

/* --- buffers on every backend under test -------------------------------------- */

START_TEST(test_fill_nan)
{
    llmem_backend *be = open_under_test(_i);
    const size_t size = 1024;
    llmem_buffer *buf = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, size, &buf), LLMEM_OK);
    unsigned char *host = malloc(size);
    ck_assert_ptr_nonnull(host);
    for (int t = 0; t < LLMEM_DTYPE_COUNT; t++) {
        memset(host, 0, size);
        ck_assert_int_eq(llmem_buffer_upload(buf, 0, host, size), LLMEM_OK);
        /* Poison the middle only; the edges must keep their zeros. */
        ck_assert_int_eq(llmem_buffer_fill(buf, 64, size - 128,
                                           llmem_nan_pattern((llmem_dtype)t)),
                         LLMEM_OK);
        ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
        ck_assert_int_eq(llmem_buffer_download(buf, 0, host, size), LLMEM_OK);
        for (size_t i = 0; i < size; i += 4) {
            bool inside = i >= 64 && i < size - 64;
            if (inside)
                ck_assert_msg(word_is_nan(host + i, (llmem_dtype)t), "%s byte %zu not NaN",
                              llmem_dtype_name((llmem_dtype)t), i);
            else
                ck_assert_msg(!memcmp(host + i, "\0\0\0\0", 4), "fill wrote outside its range");
        }
    }
    free(host);
    llmem_buffer_free(buf);
    llmem_backend_close(be);
}
END_TEST

/* Random uploads, downloads, copies and fills over three buffers, checked
 * against a host mirror that applies the same operations with memcpy. */
START_TEST(test_random_round_trips)
{
    llmem_backend *be = open_under_test(_i);
    enum { NB = 3, STEPS = 3000 };
    llmem_buffer *buf[NB];
    unsigned char *mirror[NB];
    size_t size[NB];
    unsigned char *tmp = malloc(8192), *got = malloc(8192);
    ck_assert_ptr_nonnull(tmp);
    ck_assert_ptr_nonnull(got);
    for (int b = 0; b < NB; b++) {
        size[b] = 1 + rng_below(4096);
        ck_assert_int_eq(llmem_buffer_alloc(be, size[b], &buf[b]), LLMEM_OK);
        ck_assert_uint_eq(llmem_buffer_size(buf[b]), size[b]);
        ck_assert_ptr_eq(llmem_buffer_backend(buf[b]), be);
        mirror[b] = malloc(size[b]);
        ck_assert_ptr_nonnull(mirror[b]);
        rng_bytes(mirror[b], size[b]);
        ck_assert_int_eq(llmem_buffer_upload(buf[b], 0, mirror[b], size[b]), LLMEM_OK);
    }
    for (int step = 0; step < STEPS; step++) {
        int b = (int)rng_below(NB);
        size_t off = rng_below(size[b] + 1);
        size_t n = rng_below(size[b] - off + 1);
        switch (rng_below(4)) {
        case 0:
            rng_bytes(tmp, n);
            ck_assert_int_eq(llmem_buffer_upload(buf[b], off, tmp, n), LLMEM_OK);
            memcpy(mirror[b] + off, tmp, n);
            break;
        case 1:
            ck_assert_int_eq(llmem_buffer_download(buf[b], off, got, n), LLMEM_OK);
            ck_assert_msg(memcmp(got, mirror[b] + off, n) == 0, "step %d: download differs",
                          step);
            break;
        case 2: {
            int s = (int)rng_below(NB);
            size_t soff = rng_below(size[s] + 1);
            n = rng_below((size[s] - soff < size[b] - off ? size[s] - soff : size[b] - off) + 1);
            bool overlap = s == b && n > 0 && off < soff + n && soff < off + n;
            llmem_status st = llmem_buffer_copy(buf[b], off, buf[s], soff, n);
            ck_assert_int_eq(st, overlap ? LLMEM_E_INVALID : LLMEM_OK);
            if (!overlap)
                memmove(mirror[b] + off, mirror[s] + soff, n);
            break;
        }
        default: {
            uint32_t pattern = (uint32_t)rng_next();
            bool aligned = off % 4 == 0 && n % 4 == 0;
            ck_assert_int_eq(llmem_buffer_fill(buf[b], off, n, pattern),
                             aligned ? LLMEM_OK : LLMEM_E_INVALID);
            if (aligned)
                for (size_t i = 0; i < n; i += 4)
                    memcpy(mirror[b] + off + i, &pattern, 4);
            break;
        }
        }
    }
    ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
    for (int b = 0; b < NB; b++) {
        expect_contents(buf[b], mirror[b], size[b]);
        llmem_buffer_free(buf[b]);
        free(mirror[b]);
    }
    free(tmp);
    free(got);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_ranges)
{
    llmem_backend *be = open_under_test(_i);
    const size_t n = 100;
    unsigned char data[100], tmp[128] = {0};
    rng_bytes(data, n);
    llmem_buffer *a = NULL, *other = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, n, &a), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(a, 0, data, n), LLMEM_OK);

    const struct {
        size_t off, size;
        bool ok;
    } r[] = {{0, 100, true},      {100, 0, true},         {99, 1, true},     {0, 0, true},
             {101, 0, false},     {0, 101, false},        {50, 51, false},   {100, 1, false},
             {SIZE_MAX, 1, false}, {1, SIZE_MAX, false},  {SIZE_MAX, SIZE_MAX, false}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        /* Rejected ranges must fail before touching tmp (128 bytes). */
        llmem_status want = r[i].ok ? LLMEM_OK : LLMEM_E_INVALID;
        ck_assert_int_eq(llmem_buffer_download(a, r[i].off, tmp, r[i].size), want);
        if (r[i].ok)
            ck_assert_int_eq(memcmp(tmp, data + r[i].off, r[i].size), 0);
        else
            ck_assert_int_eq(llmem_buffer_upload(a, r[i].off, tmp, r[i].size), LLMEM_E_INVALID);
    }
    ck_assert_int_eq(llmem_buffer_upload(NULL, 0, data, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload(a, 0, NULL, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_download(a, 0, NULL, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_download(NULL, 0, tmp, 1), LLMEM_E_INVALID);

    /* Copies: ranges, overlap within one buffer, other backends. */
    ck_assert_int_eq(llmem_buffer_copy(a, 0, a, 5, 10), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(a, 5, a, 0, 10), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(a, 7, a, 7, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(a, 0, a, 90, 11), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(a, SIZE_MAX, a, 0, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(NULL, 0, a, 0, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(a, 0, NULL, 0, 1), LLMEM_E_INVALID);
    llmem_backend *be2 = test_open("cpu");
    ck_assert_int_eq(llmem_buffer_alloc(be2, n, &other), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_copy(other, 0, a, 0, 10), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_copy(a, 0, other, 0, 10), LLMEM_E_INVALID);

    /* Fills: 4-aligned offset and size, inside the buffer. */
    ck_assert_int_eq(llmem_buffer_fill(a, 2, 4, 0), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_fill(a, 0, 6, 0), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_fill(a, 96, 8, 0), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_fill(a, SIZE_MAX - 3, 4, 0), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_fill(NULL, 0, 4, 0), LLMEM_E_INVALID);

    /* Nothing above may have changed the contents. */
    expect_contents(a, data, n);

    /* The accepted edge cases act. */
    ck_assert_int_eq(llmem_buffer_copy(a, 0, a, 10, 10), LLMEM_OK); /* adjacent */
    memcpy(data, data + 10, 10);
    ck_assert_int_eq(llmem_buffer_fill(a, 96, 4, 0x01020304u), LLMEM_OK);
    uint32_t p = 0x01020304u;
    memcpy(data + 96, &p, 4);
    ck_assert_int_eq(llmem_buffer_fill(a, 100, 0, 0), LLMEM_OK);
    expect_contents(a, data, n);

    /* Allocation arguments and NULL handling. */
    llmem_buffer *z = (llmem_buffer *)(void *)&p;
    ck_assert_int_eq(llmem_buffer_alloc(be, 0, &z), LLMEM_E_INVALID);
    ck_assert_ptr_null(z);
    ck_assert_int_eq(llmem_buffer_alloc(be, 1, NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_alloc(NULL, 1, &z), LLMEM_E_INVALID);
    ck_assert_uint_eq(llmem_buffer_size(NULL), 0);
    ck_assert_ptr_null(llmem_buffer_backend(NULL));
    ck_assert_ptr_null(llmem_buffer_host_ptr(NULL));
    ck_assert_int_eq(llmem_backend_synchronize(NULL), LLMEM_E_INVALID);
    llmem_backend_info info;
    ck_assert_int_eq(llmem_backend_get_info(NULL, &info), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_get_info(be, NULL), LLMEM_E_INVALID);
    llmem_buffer_free(NULL);
    llmem_backend_close(NULL);
    llmem_backend_set_alloc_hook(NULL, NULL, NULL);

    llmem_buffer_free(other);
    llmem_buffer_free(a);
    llmem_backend_close(be2);
    llmem_backend_close(be);
}
END_TEST

typedef struct hook_log {
    int calls;
    size_t last_size;
    size_t limit;
} hook_log;

static bool limit_hook(size_t size, void *ctx)
{
    hook_log *h = ctx;
    h->calls++;
    h->last_size = size;
    return size <= h->limit;
}

/* llmem_buffer_upload_ranges against a host mirror updated by plain
 * memcpy: each range lands at its own offset, bytes outside the ranges keep
 * their old contents, a bad range anywhere in the list writes nothing. */
START_TEST(test_upload_ranges)
{
    llmem_backend *be = open_under_test(_i);
    enum { N = 4096 };
    unsigned char *mirror = malloc(N), *src = malloc(N);
    ck_assert_ptr_nonnull(mirror);
    ck_assert_ptr_nonnull(src);
    rng_bytes(mirror, N);
    llmem_buffer *a = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, N, &a), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(a, 0, mirror, N), LLMEM_OK);
    for (int round = 0; round < 20; round++) {
        rng_bytes(src, N);
        size_t off[64], len[64];
        int32_t n = (int32_t)(rng_next() % 64);
        for (int32_t j = 0; j < n; j++) {
            off[j] = (size_t)(rng_next() % N);
            len[j] = (size_t)(rng_next() % 80);
            if (len[j] > N - off[j])
                len[j] = N - off[j];
        }
        ck_assert_int_eq(llmem_buffer_upload_ranges(a, src, n, off, len), LLMEM_OK);
        for (int32_t j = 0; j < n; j++)
            memcpy(mirror + off[j], src + off[j], len[j]);
        expect_contents(a, mirror, N);
    }
    /* one range past the end: LLMEM_E_INVALID and nothing written */
    rng_bytes(src, N);
    size_t off[3] = {0, 100, N - 8}, len[3] = {16, 16, 9};
    uint64_t gen = a->write_gen;
    ck_assert_int_eq(llmem_buffer_upload_ranges(a, src, 3, off, len), LLMEM_E_INVALID);
    ck_assert_uint_eq(a->write_gen, gen);
    expect_contents(a, mirror, N);
    ck_assert_int_eq(llmem_buffer_upload_ranges(a, src, -1, off, len), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload_ranges(a, NULL, 3, off, len), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload_ranges(a, src, 3, NULL, len), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload_ranges(NULL, src, 0, off, len), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload_ranges(a, NULL, 0, NULL, NULL), LLMEM_OK);
    expect_contents(a, mirror, N);
    /* a write takes a new generation (view checks are cached per write) */
    len[2] = 8;
    ck_assert_int_eq(llmem_buffer_upload_ranges(a, src, 3, off, len), LLMEM_OK);
    ck_assert_uint_ne(a->write_gen, gen);
    for (int32_t j = 0; j < 3; j++)
        memcpy(mirror + off[j], src + off[j], len[j]);
    expect_contents(a, mirror, N);
    llmem_buffer_free(a);
    free(mirror);
    free(src);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_alloc_hook)
{
    llmem_backend *be = open_under_test(_i);
    hook_log log = {.limit = 1000};
    llmem_backend_set_alloc_hook(be, limit_hook, &log);
    ck_assert_int_eq(be->refcount, 1);

    llmem_buffer *big = (llmem_buffer *)(void *)&log, *small = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, 2000, &big), LLMEM_E_NO_MEMORY);
    ck_assert_ptr_null(big);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_uint_eq(log.last_size, 2000);
    ck_assert_int_eq(be->refcount, 1); /* a refused allocation holds nothing */

    ck_assert_int_eq(llmem_buffer_alloc(be, 1000, &small), LLMEM_OK);
    ck_assert_int_eq(log.calls, 2);
    ck_assert_uint_eq(log.last_size, 1000);
    ck_assert_int_eq(be->refcount, 2);

    llmem_backend_set_alloc_hook(be, NULL, NULL);
    ck_assert_int_eq(llmem_buffer_alloc(be, 2000, &big), LLMEM_OK);
    ck_assert_int_eq(log.calls, 2); /* removed hooks are not called */
    ck_assert_int_eq(be->refcount, 3);

    llmem_buffer_free(big);
    llmem_buffer_free(small);
    ck_assert_int_eq(be->refcount, 1);
    llmem_backend_close(be);
}
END_TEST

/* --- the CPU backend ---------------------------------------------------------- */

START_TEST(test_cpu_info)
{
    llmem_backend *be = test_open("cpu");
    ck_assert_str_eq(llmem_backend_name(be), "cpu");
    llmem_backend_info info;
    ck_assert_int_eq(llmem_backend_get_info(be, &info), LLMEM_OK);
    ck_assert_str_eq(info.backend, "cpu");
    ck_assert_int_eq(info.device, 0);
    ck_assert(info.host_visible);
    ck_assert_uint_gt(info.memory_total, 0);
    ck_assert_uint_le(info.memory_free, info.memory_total);
    ck_assert_ptr_nonnull(info.device_name);
    ck_assert_uint_gt(strlen(info.device_name), 0);
    /* The name is the first "model name" of /proc/cpuinfo when it has one. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        bool found = false;
        while (!found && fgets(line, sizeof line, f))
            found = strncmp(line, "model name", 10) == 0;
        fclose(f);
        if (found)
            ck_assert_msg(strstr(line, info.device_name) != NULL, "\"%s\" not in \"%s\"",
                          info.device_name, line);
        else
            ck_assert_str_eq(info.device_name, "cpu");
    }
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_cpu_host_ptr)
{
    llmem_backend *be = test_open("cpu");
    const size_t sizes[] = {1, 3, 255, 256, 257, 4096, 100000};
    rng_seed(7);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        llmem_buffer *buf = NULL;
        ck_assert_int_eq(llmem_buffer_alloc(be, n, &buf), LLMEM_OK);
        unsigned char *host = llmem_buffer_host_ptr(buf);
        ck_assert_ptr_nonnull(host);
        ck_assert_uint_eq((uintptr_t)host % 256, 0);
        unsigned char *data = malloc(n), *back = malloc(n);
        ck_assert_ptr_nonnull(data);
        ck_assert_ptr_nonnull(back);
        rng_bytes(data, n);
        ck_assert_int_eq(llmem_buffer_upload(buf, 0, data, n), LLMEM_OK);
        ck_assert_int_eq(memcmp(host, data, n), 0); /* upload lands in host memory */
        host[n - 1] ^= 0xff;                         /* and host writes are downloaded */
        data[n - 1] ^= 0xff;
        ck_assert_int_eq(llmem_buffer_download(buf, 0, back, n), LLMEM_OK);
        ck_assert_int_eq(memcmp(back, data, n), 0);
        free(data);
        free(back);
        llmem_buffer_free(buf);
    }
    llmem_backend_close(be);
}
END_TEST

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("status");
    tcase_add_test(tc, test_status_names);
    tcase_add_test(tc, test_dtypes);
    tcase_add_test(tc, test_nan_patterns);
    suite_add_tcase(s, tc);

    tc = tcase_create("buffers");
    tcase_add_loop_test(tc, test_fill_nan, 0, N_BACKENDS);
    tcase_add_loop_test(tc, test_random_round_trips, 0, N_BACKENDS);
    tcase_add_loop_test(tc, test_ranges, 0, N_BACKENDS);
    tcase_add_loop_test(tc, test_upload_ranges, 0, N_BACKENDS);
    tcase_add_loop_test(tc, test_alloc_hook, 0, N_BACKENDS);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("cpu");
    tcase_add_test(tc, test_cpu_info);
    tcase_add_test(tc, test_cpu_host_ptr);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    int failed = test_run_suite(backend_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ctest-labels: core
/* The safetensors loader: valid files, directories and indexes load with the
 * right dtypes, shapes and bytes; every kind of damaged file gets its exact
 * status and a message naming the problem; random damage never crashes. The
 * files are written here byte by byte, following the format's README. */
#include "support/run.h"
#include <check.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmem/model.h"

static char tmpdir[64];
static char err[512];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llmem_st_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    err[0] = '\0';
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char p[512];
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void teardown(void)
{
    rm_tree(tmpdir);
}

static const char *tpath(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static void write_raw(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* A safetensors file: u64 LE header length, the header padded with spaces to
 * a multiple of 8, then `data_len` bytes of data (byte i = i & 0xff when
 * data is NULL). Returns the file size. */
static size_t write_st(const char *path, const char *header, const void *data, size_t data_len)
{
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    size_t n = 8 + padded + data_len;
    unsigned char *buf = malloc(n);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + padded + i] = data ? ((const unsigned char *)data)[i] : (unsigned char)i;
    write_raw(path, buf, n);
    free(buf);
    return n;
}

static llmem_status open_st(const char *path, llmem_safetensors **st)
{
    err[0] = '\0';
    *st = (llmem_safetensors *)(uintptr_t)1; /* must be reset to NULL on failure */
    llmem_status s = llmem_safetensors_open(path, st, err, sizeof err);
    if (s != LLMEM_OK)
        ck_assert_ptr_null(*st);
    return s;
}

/* Opening `header` + `data_len` bytes fails with `want`, and the message
 * contains every one of the NULL-terminated strings. */
static void expect_fail(const char *header, size_t data_len, llmem_status want, ...)
{
    write_st(tpath("bad.safetensors"), header, NULL, data_len);
    llmem_safetensors *st;
    llmem_status s = open_st(tpath("bad.safetensors"), &st);
    ck_assert_msg(s == want, "status %d (%s), want %d; header %s", s, err, want, header);
    va_list ap;
    va_start(ap, want);
    for (const char *w; (w = va_arg(ap, const char *)) != NULL;)
        ck_assert_msg(strstr(err, w), "message '%s' lacks '%s'", err, w);
    va_end(ap);
}

#define HDR3                                                                                       \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                                       \
    "\"b.weight\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]},"                     \
    "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"                    \
    "\"c.norm\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[32,40]}}"

START_TEST(test_valid_file)
{
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
    unsigned char data[40];
    memcpy(data, a, sizeof a);
    for (int i = 24; i < 40; i++)
        data[i] = (unsigned char)(0xA0 + i);
    write_st(tpath("m.safetensors"), HDR3, data, sizeof data);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("m.safetensors"), &st), LLMEM_OK);
    ck_assert_int_eq(llmem_safetensors_count(st), 3);
    llmem_tensor_info ti;
    /* Name order. */
    const char *names[3] = {"a.weight", "b.weight", "c.norm"};
    for (int32_t i = 0; i < 3; i++) {
        ck_assert_int_eq(llmem_safetensors_get(st, i, &ti), LLMEM_OK);
        ck_assert_str_eq(ti.name, names[i]);
    }
    ck_assert_int_eq(llmem_safetensors_get(st, 3, &ti), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_safetensors_find(st, "a.weight", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(ti.dtype, LLMEM_DTYPE_F32);
    ck_assert_str_eq(ti.st_dtype, "F32");
    ck_assert_int_eq(ti.n_dims, 2);
    ck_assert_int_eq(ti.shape[0], 2);
    ck_assert_int_eq(ti.shape[1], 3);
    ck_assert_int_eq(ti.n_elements, 6);
    ck_assert_uint_eq(ti.n_bytes, 24);
    ck_assert_mem_eq(ti.data, a, sizeof a);
    ck_assert_int_eq(llmem_safetensors_find(st, "b.weight", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(ti.dtype, LLMEM_DTYPE_F16);
    ck_assert_uint_eq(ti.n_bytes, 8);
    ck_assert_mem_eq(ti.data, data + 24, 8);
    ck_assert_int_eq(llmem_safetensors_find(st, "c.norm", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(ti.dtype, LLMEM_DTYPE_BF16);
    ck_assert_int_eq(ti.n_elements, 4);
    ck_assert_mem_eq(ti.data, data + 32, 8);
    ck_assert_str_eq(ti.file, tpath("m.safetensors"));
    ck_assert_int_eq(llmem_safetensors_find(st, "nope", &ti, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "'nope'"));
    llmem_safetensors_close(st);
    llmem_safetensors_close(NULL);
}
END_TEST

START_TEST(test_scalar_empty_and_metadata_only)
{
    /* A scalar (shape []) has one element; a [0, 5] tensor has none and may
     * sit at the same offset as another tensor's start. */
    write_st(tpath("s.safetensors"),
             "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
             "\"z\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
             "\"t\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]}}", NULL, 8);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("s.safetensors"), &st), LLMEM_OK);
    llmem_tensor_info ti;
    ck_assert_int_eq(llmem_safetensors_find(st, "s", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(ti.n_dims, 0);
    ck_assert_int_eq(ti.n_elements, 1);
    ck_assert_int_eq(llmem_safetensors_find(st, "z", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(ti.n_elements, 0);
    ck_assert_uint_eq(ti.n_bytes, 0);
    llmem_safetensors_close(st);
    write_st(tpath("e.safetensors"), "{\"__metadata__\":{}}", NULL, 0);
    ck_assert_int_eq(open_st(tpath("e.safetensors"), &st), LLMEM_OK);
    ck_assert_int_eq(llmem_safetensors_count(st), 0);
    ck_assert_int_eq(llmem_safetensors_find(st, "x", &ti, err, sizeof err), LLMEM_E_NOT_FOUND);
    llmem_safetensors_close(st);
}
END_TEST

START_TEST(test_truncated_file)
{
    size_t n = write_st(tpath("m.safetensors"), HDR3, NULL, 40);
    FILE *f = fopen(tpath("m.safetensors"), "rb");
    unsigned char *buf = malloc(n);
    ck_assert_uint_eq(fread(buf, 1, n, f), n);
    fclose(f);
    /* Cut into the last tensor (c.norm ends at file byte n). */
    write_raw(tpath("cut.safetensors"), buf, n - 3);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("cut.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "'c.norm'"));
    ck_assert_ptr_nonnull(strstr(err, "past end of file"));
    char want[64];
    snprintf(want, sizeof want, "(%zu bytes)", n - 3);
    ck_assert_msg(strstr(err, want), "%s", err);
    /* Cut into the header. */
    write_raw(tpath("cut.safetensors"), buf, 20);
    ck_assert_int_eq(open_st(tpath("cut.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "header length"));
    /* Shorter than the length field, and empty. */
    write_raw(tpath("cut.safetensors"), buf, 5);
    ck_assert_int_eq(open_st(tpath("cut.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "too short"));
    write_raw(tpath("cut.safetensors"), buf, 0);
    ck_assert_int_eq(open_st(tpath("cut.safetensors"), &st), LLMEM_E_CORRUPT);
    free(buf);
}
END_TEST

START_TEST(test_header_length)
{
    unsigned char buf[100] = {0};
    buf[0] = 0xe8; /* 1000 */
    buf[1] = 0x03;
    memcpy(buf + 8, "{}", 2);
    write_raw(tpath("h.safetensors"), buf, sizeof buf);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("h.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "header length 1000 past end of file (100 bytes)"), "%s", err);
    memset(buf, 0xff, 8); /* 2^64 - 1: must not wrap around */
    write_raw(tpath("h.safetensors"), buf, sizeof buf);
    ck_assert_int_eq(open_st(tpath("h.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "past end of file"));
}
END_TEST

START_TEST(test_bad_json)
{
    expect_fail("{\"a\": {\"dtype\": ", 0, LLMEM_E_CORRUPT, "not valid JSON", NULL);
    expect_fail("[1, 2]", 0, LLMEM_E_CORRUPT, "not an object", NULL);
    expect_fail("{} trailing", 0, LLMEM_E_CORRUPT, "bytes after the JSON object", NULL);
    expect_fail("{\"a\": 3}", 0, LLMEM_E_CORRUPT, "'a'", "not an object", NULL);
    expect_fail("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, LLMEM_E_CORRUPT,
                "'a'", "dtype", NULL);
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                LLMEM_E_CORRUPT, "'a'", "shape[0]", NULL);
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                LLMEM_E_CORRUPT, "shape[0]", NULL);
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                LLMEM_E_CORRUPT, "data_offsets", NULL);
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", 4,
                LLMEM_E_CORRUPT, "data_offsets", NULL);
    expect_fail("{\"__metadata__\":{\"k\":1}}", 0, LLMEM_E_CORRUPT, "__metadata__", NULL);
    expect_fail("{\"__metadata__\":[]}", 0, LLMEM_E_CORRUPT, "__metadata__", NULL);
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2,3,4,5,6,7,8,9],"
                "\"data_offsets\":[0,4]}}", 4, LLMEM_E_UNSUPPORTED, "9 dimensions", NULL);
    /* cJSON cuts names at an escaped NUL: "a\u0000x" would be read as "a" */
    expect_fail("{\"a\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                LLMEM_E_CORRUPT, "\\u0000", NULL);
    /* an escaped backslash before u0000 is not one */
    write_st(tpath("ok.safetensors"),
             "{\"a\\\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 4);
    llmem_safetensors *st;
    ck_assert_msg(open_st(tpath("ok.safetensors"), &st) == LLMEM_OK, "%s", err);
    llmem_tensor_info ti;
    ck_assert_int_eq(llmem_safetensors_get(st, 0, &ti), LLMEM_OK);
    ck_assert_str_eq(ti.name, "a\\u0000x");
    llmem_safetensors_close(st);
}
END_TEST

START_TEST(test_bad_offsets)
{
    expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24,
                LLMEM_E_CORRUPT, "'y'", "overlap", "'x'", NULL);
    /* Overlap by containment, listed in the other order. */
    expect_fail("{\"in\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]},"
                "\"out\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
                LLMEM_E_CORRUPT, "overlap", NULL);
    expect_fail("{\"x.weight\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}",
                16, LLMEM_E_CORRUPT, "'x.weight'", "past end of file", NULL);
    expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
                LLMEM_E_CORRUPT, "'x'", "needs 24 bytes", "[0, 20)", NULL);
    expect_fail("{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                LLMEM_E_CORRUPT, "needs 4 bytes", NULL);
    expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                LLMEM_E_CORRUPT, "end before they begin", NULL);
    /* 2^32 * 2^32 * 2^32 elements: the size must not overflow into a match. */
    expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                "\"data_offsets\":[0,0]}}", 0, LLMEM_E_CORRUPT, "too large", NULL);
    expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                "\"data_offsets\":[0,0]}}", 0, LLMEM_E_CORRUPT, NULL);
    /* An offset past 2^53 cannot be a JSON-exact integer. */
    expect_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 4,
                LLMEM_E_CORRUPT, "data_offsets", NULL);
}
END_TEST

START_TEST(test_dtypes)
{
    expect_fail("{\"q\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                LLMEM_E_UNSUPPORTED, "'q'", "'Q4_K'", NULL);
    expect_fail("{\"q\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                LLMEM_E_CORRUPT, "'q'", NULL);
    /* A dtype of the format that llmem does not compute with: the file
     * loads, and finding the tensor names it and its dtype. */
    write_st(tpath("i.safetensors"),
             "{\"pos\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}}", NULL, 32);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("i.safetensors"), &st), LLMEM_OK);
    llmem_tensor_info ti;
    ck_assert_int_eq(llmem_safetensors_find(st, "pos", &ti, err, sizeof err), LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "'pos'"));
    ck_assert_ptr_nonnull(strstr(err, "I64"));
    ck_assert_int_eq(ti.dtype, LLMEM_DTYPE_COUNT);
    ck_assert_uint_eq(ti.n_bytes, 24);
    ck_assert_int_eq(llmem_safetensors_find(st, "w", &ti, err, sizeof err), LLMEM_OK);
    llmem_safetensors_close(st);
}
END_TEST

START_TEST(test_duplicate_names)
{
    expect_fail("{\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                LLMEM_E_CORRUPT, "'d'", "twice", NULL);
    /* The same key with the same offsets: a duplicate, not an overlap. */
    write_st(tpath("bad.safetensors"),
             "{\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             NULL, 4);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("bad.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "key 'd' appears twice") && !strstr(err, "overlap"),
                  "message '%s'", err);
    /* a field twice inside one entry: serde (the safetensors crate) refuses
     * it, cJSON's lookup would take the first dtype */
    expect_fail("{\"d\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],"
                "\"data_offsets\":[0,4]}}", 4, LLMEM_E_CORRUPT, "'dtype'", "twice", NULL);
}
END_TEST

/* A header nested deeper than the JSON parser allows is reported as too
 * deep, not as invalid JSON; a deep but allowed header is no parse error. */
START_TEST(test_too_deep_header)
{
    enum { DEPTH = 1100 };
    static char h[2 * DEPTH + 64];
    size_t k = 0;
    k += (size_t)snprintf(h + k, sizeof h - k, "{\"__metadata__\":{\"x\":");
    for (int i = 0; i < DEPTH; i++)
        h[k++] = '[';
    for (int i = 0; i < DEPTH; i++)
        h[k++] = ']';
    k += (size_t)snprintf(h + k, sizeof h - k, "}}");
    h[k] = '\0';
    write_st(tpath("deep.safetensors"), h, NULL, 0);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(tpath("deep.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "deeper than 1000 levels") && !strstr(err, "not valid JSON"),
                  "message '%s'", err);
    /* brackets inside a string do not count */
    k = (size_t)snprintf(h, sizeof h, "{\"__metadata__\":{\"x\":\"");
    for (int i = 0; i < DEPTH; i++)
        h[k++] = '[';
    k += (size_t)snprintf(h + k, sizeof h - k, "\"}");
    h[k] = '\0';
    write_st(tpath("deep.safetensors"), h, NULL, 0);
    ck_assert_int_eq(open_st(tpath("deep.safetensors"), &st), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "not valid JSON"), "message '%s'", err);
}
END_TEST

static const char *mkdir_in(const char *name)
{
    const char *p = tpath(name);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    return p;
}

START_TEST(test_directory)
{
    const char *dir = mkdir_in("ckpt");
    char p[512];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", NULL, 8);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_st(p, "{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", NULL, 6);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_raw(p, "{}", 2);
    llmem_safetensors *st;
    ck_assert_int_eq(open_st(dir, &st), LLMEM_OK);
    ck_assert_int_eq(llmem_safetensors_count(st), 2);
    llmem_tensor_info ti;
    ck_assert_int_eq(llmem_safetensors_find(st, "b", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_ptr_nonnull(strstr(ti.file, "00002-of-00002"));
    ck_assert_int_eq(llmem_safetensors_find(st, "a", &ti, err, sizeof err), LLMEM_OK);
    ck_assert_ptr_nonnull(strstr(ti.file, "00001-of-00002"));
    llmem_safetensors_close(st);

    /* The same name in two files. */
    snprintf(p, sizeof p, "%s/extra.safetensors", dir);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 4);
    ck_assert_int_eq(open_st(dir, &st), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "'a'"));
    ck_assert_ptr_nonnull(strstr(err, "extra.safetensors"));
    ck_assert_ptr_nonnull(strstr(err, "00001-of-00002"));
    /* One damaged file fails the set and names that file. */
    write_st(p, "{\"e\":{\"dtype\":\"F32\",\"shape\":[9],\"data_offsets\":[0,36]}}", NULL, 4);
    ck_assert_int_eq(open_st(dir, &st), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "extra.safetensors"));
    unlink(p);

    /* No safetensors file at all; no such path. */
    ck_assert_int_eq(open_st(mkdir_in("empty"), &st), LLMEM_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "no *.safetensors"));
    ck_assert_int_eq(open_st(tpath("missing"), &st), LLMEM_E_NOT_FOUND);
    ck_assert_int_eq(open_st(tpath("missing/x.safetensors"), &st), LLMEM_E_NOT_FOUND);
    ck_assert_int_eq(llmem_safetensors_open(NULL, &st, err, sizeof err), LLMEM_E_INVALID);
}
END_TEST

START_TEST(test_index)
{
    const char *dir = mkdir_in("sharded");
    char p[512], ip[512];
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 4);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    write_st(p, "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 4);
    /* Not in the index: ignored (a stray file must not be loaded). */
    snprintf(p, sizeof p, "%s/stray.safetensors", dir);
    write_raw(p, "garbage", 7);
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\":{\"total_size\":8},"
                      "\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}";
    write_raw(ip, idx, strlen(idx));
    llmem_safetensors *st;
    ck_assert_msg(open_st(dir, &st) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(llmem_safetensors_count(st), 2);
    llmem_safetensors_close(st);

    /* damaged indexes: the status and what the message must name */
    static const struct {
        const char *idx;
        llmem_status want;
        const char *why, *also;
    } bad[] = {
        {"{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s2.safetensors\"}}", LLMEM_E_CORRUPT,
         "'a'", "does not hold it"},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s3.safetensors\"}}",
         LLMEM_E_NOT_FOUND, "s3.safetensors", NULL},
        {"{\"weight_map\":{\"a\":\"../s1.safetensors\"}}", LLMEM_E_CORRUPT, "not a file name", NULL},
        {"{\"weight_map\": 3}", LLMEM_E_CORRUPT, "weight_map", NULL},
        /* one JSON text (RFC 8259), as json.loads reads it (found by
         * fuzz_safetensors) */
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}} ]",
         LLMEM_E_CORRUPT, "bytes after the JSON object", NULL},
        /* a tensor named twice (json.loads keeps the last file, cJSON the
         * first) and a name cut at \u0000 ("a\u0000x" would read as "a") */
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s2.safetensors\"}}", LLMEM_E_CORRUPT,
         "index.json", "key 'a' appears twice"},
        {"{\"weight_map\":{\"a\\u0000x\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}",
         LLMEM_E_CORRUPT, "holds \\u0000", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_raw(ip, bad[i].idx, strlen(bad[i].idx));
        ck_assert_msg(open_st(dir, &st) == bad[i].want, "index %zu: %s", i, err);
        ck_assert_msg(strstr(err, bad[i].why) && (!bad[i].also || strstr(err, bad[i].also)),
                      "index %zu: %s", i, err);
    }
    /* whitespace may follow the object */
    idx = "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}\n \t";
    write_raw(ip, idx, strlen(idx));
    ck_assert_msg(open_st(dir, &st) == LLMEM_OK, "%s", err);
    llmem_safetensors_close(st);
}
END_TEST

/* Random damage to a valid file: any status, never a crash, and whatever
 * opens has every tensor's bytes inside the file (they are all read). */
START_TEST(test_random_damage)
{
    unsigned char data[40];
    for (int i = 0; i < 40; i++)
        data[i] = (unsigned char)i;
    size_t n = write_st(tpath("m.safetensors"), HDR3, data, sizeof data);
    unsigned char *orig = malloc(n), *buf = malloc(n);
    FILE *f = fopen(tpath("m.safetensors"), "rb");
    ck_assert_uint_eq(fread(orig, 1, n, f), n);
    fclose(f);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int opened = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(buf, orig, n);
        size_t len = n;
        int kind = iter % 4;
        for (int k = 0; k < 1 + iter % 3; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t at = (size_t)(rng % n);
            if (kind == 0)
                buf[at] = (unsigned char)(rng >> 32);
            else if (kind == 1)
                buf[at] = (unsigned char)"0123456789[]{},:\" "[(rng >> 40) % 19];
            else if (kind == 2)
                len = at;
            else
                buf[at % 8] = (unsigned char)(rng >> 24);
        }
        write_raw(tpath("d.safetensors"), buf, len);
        llmem_safetensors *st;
        llmem_status s = open_st(tpath("d.safetensors"), &st);
        ck_assert(s == LLMEM_OK || s == LLMEM_E_CORRUPT || s == LLMEM_E_UNSUPPORTED);
        if (s != LLMEM_OK)
            continue;
        opened++;
        for (int32_t i = 0; i < llmem_safetensors_count(st); i++) {
            llmem_tensor_info ti;
            ck_assert_int_eq(llmem_safetensors_get(st, i, &ti), LLMEM_OK);
            unsigned sum = 0;
            for (size_t b = 0; b < ti.n_bytes; b++)
                sum += ((const unsigned char *)ti.data)[b];
            (void)sum;
            ck_assert_uint_le(ti.n_bytes, len);
        }
        llmem_safetensors_close(st);
    }
    ck_assert_int_gt(opened, 0); /* some damage (in data bytes) leaves a valid file */
    free(orig);
    free(buf);
}
END_TEST

/* The checkpoints transformers wrote: every byte after the header belongs to
 * exactly one tensor (the writer leaves no holes), so sizes add up. */
START_TEST(test_transformers_files)
{
    const char *files[] = {"tests/fixtures/llama/model.safetensors",
                           "tests/fixtures/bamba_bf16/model.safetensors",
                           "tests/fixtures/nemotron_h", "models/builtin"};
    const int32_t counts[] = {21, 47, 32, 73};
    for (int k = 0; k < 4; k++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", test_source_dir(), files[k]);
        llmem_safetensors *st;
        ck_assert_msg(open_st(p, &st) == LLMEM_OK, "%s", err);
        ck_assert_int_eq(llmem_safetensors_count(st), counts[k]);
        size_t total = 0;
        const char *file = NULL;
        for (int32_t i = 0; i < llmem_safetensors_count(st); i++) {
            llmem_tensor_info ti;
            ck_assert_int_eq(llmem_safetensors_get(st, i, &ti), LLMEM_OK);
            ck_assert_int_ne(ti.dtype, LLMEM_DTYPE_COUNT);
            if (k == 1 || k == 3)
                ck_assert_int_eq(ti.dtype, LLMEM_DTYPE_BF16);
            total += ti.n_bytes;
            file = ti.file;
        }
        struct stat sb;
        ck_assert_int_eq(stat(file, &sb), 0);
        FILE *f = fopen(file, "rb");
        unsigned char h[8];
        ck_assert_uint_eq(fread(h, 1, 8, f), 8);
        fclose(f);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = hl << 8 | h[i];
        ck_assert_uint_eq(8 + hl + total, (uint64_t)sb.st_size);
        llmem_safetensors_close(st);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_valid_file);
    tcase_add_test(tc, test_scalar_empty_and_metadata_only);
    tcase_add_test(tc, test_truncated_file);
    tcase_add_test(tc, test_header_length);
    tcase_add_test(tc, test_bad_json);
    tcase_add_test(tc, test_bad_offsets);
    tcase_add_test(tc, test_dtypes);
    tcase_add_test(tc, test_duplicate_names);
    tcase_add_test(tc, test_too_deep_header);
    tcase_add_test(tc, test_directory);
    tcase_add_test(tc, test_index);
    tcase_add_test(tc, test_random_damage);
    tcase_add_test(tc, test_transformers_files);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

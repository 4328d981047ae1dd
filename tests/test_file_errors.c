/* The small files of a checkpoint folder (config.json, tokenizer.json,
 * tokenizer_config.json, chat_template.jinja, model.safetensors.index.json)
 * are read by one reader (models/hf_file.c), so each fault gets one status
 * and a message naming the path wherever it happens: no such file ->
 * LLMEM_E_NOT_FOUND; a folder where the file should be -> LLMEM_E_IO ("is a
 * folder"); over the size a sound file of the kind holds -> LLMEM_E_CORRUPT.
 * The loaders used to differ: a folder named tokenizer.json read as "read
 * failed", one named chat_template.jinja failed with no message at all,
 * and config.json took a 16 MB buffer for every read. Expected statuses
 * are the ones include/llmem/model.h and tokenizer.h document. */
// ctest-labels: core
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmem/model.h"
#include "llmem/tokenizer.h"
#include "support/fixture_case.h"
#include "support/run.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/llmem_files_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

static void write_file(const char *name, const char *text, size_t pad_to)
{
    char p[256];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    size_t n = strlen(text);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    static char spaces[65536]; /* JSON whitespace after the value */
    memset(spaces, ' ', sizeof spaces);
    while (n < pad_to) {
        size_t k = pad_to - n < sizeof spaces ? pad_to - n : sizeof spaces;
        ck_assert_uint_eq(fwrite(spaces, 1, k, f), k);
        n += k;
    }
    ck_assert_int_eq(fclose(f), 0);
}

static void make_folder(const char *name)
{
    char p[256];
    path_in(p, sizeof p, name);
    ck_assert_int_eq(mkdir(p, 0700), 0);
}

static void copy_fixture(const char *from, const char *name)
{
    char src[1024], cmd[2048], p[256];
    snprintf(src, sizeof src, "%s/tests/fixtures/%s", test_source_dir(), from);
    path_in(p, sizeof p, name);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, p);
    ck_assert_int_eq(system(cmd), 0);
}

/* err must name the file and say `why` */
static void expect_err(const char *err, const char *name, const char *why)
{
    char p[256];
    path_in(p, sizeof p, name);
    ck_assert_msg(strstr(err, p), "'%s' does not name %s", err, p);
    ck_assert_msg(strstr(err, why), "'%s' does not say '%s'", err, why);
}

static llmem_status config_load(const char *name, char *err, size_t n)
{
    char p[256];
    static llmem_model_config cfg;
    path_in(p, sizeof p, name);
    return llmem_model_config_load(p, &cfg, err, n);
}

START_TEST(config_missing_folder_and_size)
{
    char err[512] = "";
    ck_assert_int_eq(config_load("", err, sizeof err), LLMEM_E_NOT_FOUND);
    expect_err(err, "/config.json", "no such file");
    ck_assert_int_eq(config_load("nothere/x.json", err, sizeof err), LLMEM_E_NOT_FOUND);
    expect_err(err, "nothere/x.json", "no such file");
    write_file("plain", "{}", 0); /* a file where a folder of the path should be: ENOTDIR */
    ck_assert_int_eq(config_load("plain/config.json", err, sizeof err), LLMEM_E_NOT_FOUND);
    expect_err(err, "plain/config.json", "no such file");
    make_folder("config.json");
    ck_assert_int_eq(config_load("", err, sizeof err), LLMEM_E_IO);
    expect_err(err, "/config.json", "is a folder");
    /* the llama fixture's config padded with whitespace to exactly 16 MiB
     * loads; one byte more is no config.json */
    char src[1024];
    snprintf(src, sizeof src, "%s/tests/fixtures/llama/config.json", test_source_dir());
    FILE *f = fopen(src, "rb");
    ck_assert_ptr_nonnull(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const size_t cap = (size_t)16 << 20;
    write_file("exact.json", text, cap);
    ck_assert_msg(config_load("exact.json", err, sizeof err) == LLMEM_OK, "%s", err);
    write_file("over.json", text, cap + 1);
    ck_assert_int_eq(config_load("over.json", err, sizeof err), LLMEM_E_CORRUPT);
    expect_err(err, "over.json", "larger than 16 MiB");
}
END_TEST

static llmem_status tok_load(char *err, size_t n)
{
    llmem_tokenizer *tok = NULL;
    llmem_status s = llmem_tokenizer_load(dir, &tok, err, n);
    ck_assert(s == LLMEM_OK ? tok != NULL : tok == NULL);
    llmem_tokenizer_destroy(tok);
    return s;
}

START_TEST(tokenizer_files)
{
    char err[512] = "";
    ck_assert_int_eq(tok_load(err, sizeof err), LLMEM_E_NOT_FOUND);
    expect_err(err, "tokenizer.json", "no such file");
    make_folder("tokenizer.json");
    ck_assert_int_eq(tok_load(err, sizeof err), LLMEM_E_IO);
    expect_err(err, "tokenizer.json", "is a folder");
    ck_assert_int_eq(rmdir(strcat(strcat(strcpy(err, dir), "/"), "tokenizer.json")), 0);
    copy_fixture("llama/tokenizer.json", "tokenizer.json");
    ck_assert_msg(tok_load(err, sizeof err) == LLMEM_OK, "%s", err); /* no config: fine */
    make_folder("tokenizer_config.json");
    ck_assert_int_eq(tok_load(err, sizeof err), LLMEM_E_IO);
    expect_err(err, "tokenizer_config.json", "is a folder");
    ck_assert_int_eq(rmdir(strcat(strcat(strcpy(err, dir), "/"), "tokenizer_config.json")), 0);
    make_folder("chat_template.jinja");
    ck_assert_int_eq(tok_load(err, sizeof err), LLMEM_E_IO);
    expect_err(err, "chat_template.jinja", "is a folder");
}
END_TEST

START_TEST(safetensors_index)
{
    char err[512] = "";
    llmem_safetensors *st = NULL;
    copy_fixture("llama/model.safetensors", "model.safetensors");
    make_folder("model.safetensors.index.json");
    ck_assert_int_eq(llmem_safetensors_open(dir, &st, err, sizeof err), LLMEM_E_IO);
    ck_assert_ptr_null(st);
    expect_err(err, "model.safetensors.index.json", "is a folder");
}
END_TEST

/* name in the test folder: a UTF-8 byte order mark, then fixture file
 * `from` (NULL: the text `text`) */
static void write_with_bom(const char *name, const char *from, const char *text)
{
    char p[256];
    size_t n = 0;
    char *body = NULL;
    if (from) {
        char src[1024];
        snprintf(src, sizeof src, "%s/tests/fixtures/%s", test_source_dir(), from);
        body = fx_read_file(src, &n);
    }
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite("\xEF\xBB\xBF", 1, 3, f), 3);
    if (!from)
        n = strlen(text);
    ck_assert_uint_eq(fwrite(from ? body : text, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
    free(body);
}

/* A JSON file that starts with a UTF-8 byte order mark is refused with
 * LLMEM_E_CORRUPT and a message naming it, as the Hugging Face readers
 * refuse it (checked with transformers 5.17, tokenizers 0.23.3 and
 * safetensors 0.8.0): transformers opens config.json and
 * tokenizer_config.json as UTF-8 text and json.loads fails ("Unexpected
 * UTF-8 BOM"), tokenizers' Tokenizer.from_file and safetensors' header
 * parser (serde_json) fail at "line 1 column 1". cJSON skipped the mark,
 * so these files used to load. */
START_TEST(byte_order_mark)
{
    char err[512] = "";
    const char *why = "byte order mark";
    write_with_bom("config.json", "llama/config.json", NULL);
    ck_assert_int_eq(config_load("config.json", err, sizeof err), LLMEM_E_CORRUPT);
    expect_err(err, "config.json", why);
    write_with_bom("tokenizer.json", "llama/tokenizer.json", NULL);
    ck_assert_int_eq(tok_load(err, sizeof err), LLMEM_E_CORRUPT);
    expect_err(err, "tokenizer.json", why);
    copy_fixture("llama/tokenizer.json", "tokenizer.json");
    write_with_bom("tokenizer_config.json", NULL, "{}");
    ck_assert_int_eq(tok_load(err, sizeof err), LLMEM_E_CORRUPT);
    expect_err(err, "tokenizer_config.json", why);
    write_file("tokenizer_config.json", "{}", 0);
    ck_assert_msg(tok_load(err, sizeof err) == LLMEM_OK, "%s", err); /* the same without it */
    /* the safetensors header: the mark before the JSON, the length field
     * counting it; the data (whose offsets start after the header) as it was */
    char src[1024], p[256];
    snprintf(src, sizeof src, "%s/tests/fixtures/llama/model.safetensors", test_source_dir());
    size_t n = 0;
    char *st_bytes = fx_read_file(src, &n);
    ck_assert_uint_gt(n, 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)st_bytes[i];
    ck_assert_uint_le(hlen, n - 8);
    uint64_t blen = hlen + 3;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(blen >> (8 * i));
    path_in(p, sizeof p, "model.safetensors");
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(le, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite("\xEF\xBB\xBF", 1, 3, f), 3);
    ck_assert_uint_eq(fwrite(st_bytes + 8, 1, n - 8, f), n - 8);
    ck_assert_int_eq(fclose(f), 0);
    free(st_bytes);
    llmem_safetensors *st = NULL;
    ck_assert_int_eq(llmem_safetensors_open(dir, &st, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_ptr_null(st);
    expect_err(err, "model.safetensors", why);
    copy_fixture("llama/model.safetensors", "model.safetensors");
    ck_assert_msg(llmem_safetensors_open(dir, &st, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_safetensors_close(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("file_errors");
    TCase *tc = tcase_create("file_errors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, config_missing_folder_and_size);
    tcase_add_test(tc, tokenizer_files);
    tcase_add_test(tc, safetensors_index);
    tcase_add_test(tc, byte_order_mark);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

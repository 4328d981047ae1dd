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
#undef _FORTIFY_SOURCE /* read is defined below; fortify would inline its own */
#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

/* ---- short reads ------------------------------------------------------------------------- */

#if defined(__linux__) && defined(__GLIBC__)
#include <sys/syscall.h>
#define READ_FAULTS 1
long syscall(long number, ...); /* glibc's (unistd.h declares it for _DEFAULT_SOURCE only) */

/* read(2) as libllmem calls it (models/hf_file.c), interposed: while armed,
 * the first `eintr` calls fail with EINTR, call `eio` fails with EIO, each
 * call hands out at most `max` bytes, and the file ends (0) after
 * `eof_after` bytes, as a file cut between fstat and read. */
typedef struct read_faults {
    bool armed;
    int eintr, eio, calls;
    size_t max, eof_after, given;
} read_faults;
static read_faults rf;

static void rf_arm(int eintr, int eio, size_t max, size_t eof_after)
{
    rf = (read_faults){.armed = true, .eintr = eintr, .eio = eio, .max = max,
                       .eof_after = eof_after};
}

ssize_t read(int fd, void *buf, size_t n)
{
    if (!rf.armed)
        return syscall(SYS_read, fd, buf, n);
    int call = rf.calls++;
    if (call < rf.eintr || call == rf.eio) {
        errno = call < rf.eintr ? EINTR : EIO;
        return -1;
    }
    if (rf.max && n > rf.max)
        n = rf.max;
    if (rf.given >= rf.eof_after)
        return 0;
    if (n > rf.eof_after - rf.given)
        n = rf.eof_after - rf.given;
    ssize_t r = syscall(SYS_read, fd, buf, n);
    if (r > 0)
        rf.given += (size_t)r;
    return r;
}
#endif

/* The llama fixture's config.json as cJSON reads it (the reference for a
 * config read in pieces): vocab_size, hidden_size, num_hidden_layers. */
static void config_fields(int32_t want[3])
{
    char src[1024];
    snprintf(src, sizeof src, "%s/tests/fixtures/llama/config.json", test_source_dir());
    char *text = fx_read_file(src, NULL);
    cJSON *c = cJSON_Parse(text);
    static const char *const keys[3] = {"vocab_size", "hidden_size", "num_hidden_layers"};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, keys[i]);
        ck_assert(cJSON_IsNumber(v));
        want[i] = (int32_t)v->valuedouble;
    }
    cJSON_Delete(c);
    free(text);
}

static void expect_config(const llmem_model_config *cfg, const int32_t want[3])
{
    ck_assert_int_eq(cfg->vocab_size, want[0]);
    ck_assert_int_eq(cfg->hidden_size, want[1]);
    ck_assert_int_eq(cfg->n_layers, want[2]);
}

/* The reader takes a file in as many pieces as read(2) hands out: through
 * a FIFO fed in 1,000-byte writes (no size to go by: the buffer grows from
 * 4 KiB to the 10,000 bytes of a padded config.json), and, with read
 * interposed, one 5 bytes at a time, after EINTR, and a file that ends
 * before fstat's size (cut while read: what was read is no JSON, so
 * LLMEM_E_CORRUPT naming it, nothing kept) or fails with EIO
 * (LLMEM_E_IO, "read error"). */
START_TEST(short_reads)
{
    int32_t want[3];
    config_fields(want);
    char src[1024], p[256], err[512] = "";
    snprintf(src, sizeof src, "%s/tests/fixtures/llama/config.json", test_source_dir());
    size_t n = 0;
    char *text = fx_read_file(src, &n);
    static llmem_model_config cfg;
    path_in(p, sizeof p, "fifo.json");
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    enum { PADDED = 10000, CHUNK = 1000 };
    ck_assert_uint_lt(n, PADDED);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        static char out[PADDED];
        memset(out, ' ', sizeof out);
        memcpy(out, text, n);
        int fd = open(p, O_WRONLY);
        for (size_t at = 0; fd >= 0 && at < PADDED; at += CHUNK) {
            if (write(fd, out + at, CHUNK) != CHUNK)
                _exit(1);
            nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
        }
        _exit(fd >= 0 && close(fd) == 0 ? 0 : 1);
    }
    llmem_status st = llmem_model_config_load(p, &cfg, err, sizeof err);
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_msg(st == LLMEM_OK, "%s", err);
    expect_config(&cfg, want);
#ifdef READ_FAULTS
    write_file("config.json", text, 0);
    rf_arm(2, -1, 5, SIZE_MAX);
    st = config_load("config.json", err, sizeof err);
    rf.armed = false;
    ck_assert_msg(st == LLMEM_OK, "%s", err);
    expect_config(&cfg, want);
    ck_assert_int_ge(rf.calls, 2 + (int)(n / 5)); /* every piece was a read of its own */
    rf_arm(0, -1, 0, n / 2);
    st = config_load("config.json", err, sizeof err);
    rf.armed = false;
    ck_assert_int_eq(st, LLMEM_E_CORRUPT);
    expect_err(err, "config.json", "not valid JSON");
    rf_arm(0, -1, 0, 0);
    st = config_load("config.json", err, sizeof err);
    rf.armed = false;
    ck_assert_int_eq(st, LLMEM_E_CORRUPT);
    expect_err(err, "config.json", "not valid JSON");
    rf_arm(0, 1, 64, SIZE_MAX);
    st = config_load("config.json", err, sizeof err);
    rf.armed = false;
    ck_assert_int_eq(st, LLMEM_E_IO);
    expect_err(err, "config.json", "read error");
#endif
    free(text);
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
    tcase_add_test(tc, short_reads);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Out of memory inside JSON parsing: cJSON_Parse answers NULL both for text
 * that is not JSON and for an allocation that failed, and every reader of
 * JSON from outside (models/hf_json.h's hf_json_read: config.json,
 * safetensors headers, tokenizer.json and tokenizer_config.json, the
 * request bodies of `llmem serve`) used to call both "not valid JSON":
 * LLMEM_E_CORRUPT for a file that is fine, 400 for a request that is fine.
 * Here the N-th host allocation fails (support/host_faults.h interposes
 * malloc), for N = 0, 1, 2, ... until the call succeeds, and every failure
 * must be LLMEM_E_NO_MEMORY (serve: 500 server_error), never a verdict on
 * the input. The inputs are the repository's fixtures, which
 * Hugging Face transformers and tokenizers load (tests/fixtures/README.md),
 * and request bodies Python's json.loads reads.
 *
 * Interposing malloc needs glibc and no sanitizer: elsewhere the suite
 * exits 77 (skipped). */
// ctest-labels: core serve
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/serve_api.h"
#include "llmem/chat_template.h"
#include "llmem/model.h"
#include "llmem/tokenizer.h"
#include "models/hf_json.h"
#include "support/host_faults.h"
#include "support/run.h"

#ifdef HOST_FAULTS

#define MAX_TRIES 200000 /* allocations one call may make before the test gives up */

/* A contract the call under test broke, asserted once allocations work
 * again: Check's assertions allocate even when they pass (the mark point
 * they send to the parent process), so none may run while armed. */
static const char *broken;

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond) && !broken)                                                                    \
            broken = #cond;                                                                        \
    } while (0)

/* Runs call(ctx) with allocation n failing, for n = 0, 1, ... until it
 * succeeds with no allocation failing; each failed run must have returned
 * `want` and broken no EXPECT. Returns how many runs failed. */
typedef int (*oom_call)(void *ctx, char *err, size_t err_len);
static int64_t every_allocation_fails(const char *what, oom_call call, void *ctx, int want)
{
    int64_t failures = 0;
    for (int64_t n = 0;; n++) {
        ck_assert_int_lt(n, MAX_TRIES);
        char err[512] = "";
        broken = NULL;
        hf_arm(n);
        int rc = call(ctx, err, sizeof err);
        bool hit = hf_disarm();
        ck_assert_msg(!broken, "%s, allocation %lld failing: %s", what, (long long)n, broken);
        if (!hit) {
            ck_assert_msg(rc == 0, "%s: %d (%s) with no allocation failing", what, rc, err);
            break;
        }
        if (rc == 0)
            continue; /* the failed allocation had a fallback */
        ck_assert_msg(rc == want, "%s, allocation %lld failing: %d, not %d (%s)", what,
                      (long long)n, rc, want, err);
        failures++;
    }
    ck_assert_int_gt(failures, 0); /* the call allocates: the loop tested something */
    return failures;
}

static char *slurp(const char *rel, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_source_dir(), rel);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ck_assert_int_ge(n, 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* ---- hf_json_read itself ------------------------------------------------------------------- */

typedef struct text_ctx {
    const char *text;
    size_t len;
} text_ctx;

static int read_text(void *ctx, char *err, size_t err_len)
{
    text_ctx *t = ctx;
    cJSON *root = NULL;
    hf_json_where w;
    hf_json_fault f = hf_json_read(t->text, t->len, &root, &w);
    hf_json_describe(f, &w, err, err_len);
    cJSON_Delete(root);
    return f == HF_JSON_OK ? 0 : (int)f;
}

START_TEST(read_fixture_config_and_tokenizer)
{
    static const char *const files[] = {"tests/fixtures/llama/config.json",
                                        "tests/fixtures/llama/tokenizer_config.json",
                                        "tests/fixtures/llama/tokenizer.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        text_ctx t;
        char *buf = slurp(files[i], &t.len);
        t.text = buf;
        every_allocation_fails(files[i], read_text, &t, HF_JSON_NO_MEMORY);
        free(buf);
    }
}
END_TEST

/* With the first allocation failing cJSON_Parse returns NULL at once, so
 * hf_json_read's verdict is its own reading of the text: NO_MEMORY exactly
 * when the text is JSON that cJSON parses. `valid`: Python 3's json.loads
 * reads the text (checked when this table was written), except where the
 * comment says cJSON refuses what json.loads takes. */
START_TEST(first_allocation_failing_tells_syntax_from_memory)
{
    static const struct {
        const char *text;
        bool valid;
    } cases[] = {
        {"{\"a\": [1, -0.5e+3, 0, 2E-7, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"]}", true},
        {"[]", true},
        {" { } ", true},
        {"\t1\r\n", true},
        {"\"s\\/\\\\\\\"\\b\\f\\r\\t\"", true},
        {"[[[[{\"k\": [{}]}]]]]", true},
        {"{\"a\": 1,}", false},
        {"[1,]", false},
        {"{\"a\" 1}", false},
        {"{1: 2}", false},
        {"[01]", false},
        {"[1.]", false},
        {"[.5]", false},
        {"[-]", false},
        {"[1e]", false},
        {"\"\\x\"", false},
        {"\"abc", false},
        {"[1 2]", false},
        {"{\"a\": 1}}", false},
        {"tru", false},
        {"nul", false},
        {"", false},
        {"   ", false},
        {"\"a\tb\"", false},      /* a raw tab inside a string */
        {"[1]\x0b", false},       /* vertical tab is not JSON whitespace */
        {"\"\\ud800\"", false},   /* json.loads takes a lone surrogate; cJSON does not */
        {"\"\\udc00x\"", false},  /* likewise a lone low surrogate */
        {"\"\\ud800\\u0041\"", false},
        {"\"\\u12G4\"", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *root = NULL;
        hf_json_where w;
        size_t len = strlen(cases[i].text);
        hf_arm(0);
        hf_json_fault f = hf_json_read(cases[i].text, len, &root, &w);
        ck_assert_msg(hf_disarm() || len == 0, "case %zu: cJSON did not allocate", i);
        ck_assert_ptr_null(root);
        ck_assert_msg(f == (cases[i].valid ? HF_JSON_NO_MEMORY : HF_JSON_SYNTAX),
                      "case %zu (%s): fault %d", i, cases[i].text, (int)f);
        ck_assert_int_eq(hf_json_valid(cases[i].text, len), cases[i].valid);
        /* and with memory, cJSON agrees on the text it refused */
        f = hf_json_read(cases[i].text, len, &root, &w);
        cJSON_Delete(root);
        if (!cases[i].valid)
            ck_assert_msg(f != HF_JSON_OK, "case %zu (%s) read", i, cases[i].text);
    }
    /* nested past cJSON's limit: too deep, not out of memory */
    static char deep[2 * HF_JSON_MAX_DEPTH + 4];
    memset(deep, '[', HF_JSON_MAX_DEPTH + 1);
    memset(deep + HF_JSON_MAX_DEPTH + 1, ']', HF_JSON_MAX_DEPTH + 1);
    cJSON *root = NULL;
    hf_json_where w;
    hf_arm(0);
    hf_json_fault f = hf_json_read(deep, strlen(deep), &root, &w);
    hf_disarm();
    ck_assert_int_eq(f, HF_JSON_TOO_DEEP);
    ck_assert(!hf_json_valid(deep, strlen(deep)));
    ck_assert(hf_json_valid(deep + 1, strlen(deep) - 2)); /* exactly the limit */
    /* a leading byte order mark: refused before cJSON (which would skip
     * it) allocates anything, where json.loads of a str and serde_json
     * refuse it too; the text after it reads */
    static const char bom[] = "\xEF\xBB\xBF{\"a\": 1}";
    hf_arm(0);
    f = hf_json_read(bom, strlen(bom), &root, &w);
    ck_assert(!hf_disarm());
    ck_assert_int_eq(f, HF_JSON_BOM);
    ck_assert_ptr_null(root);
    ck_assert_uint_eq(w.at, 0);
    ck_assert(!hf_json_valid(bom, strlen(bom)));
    char why[160];
    ck_assert_ptr_nonnull(strstr(hf_json_describe(f, &w, why, sizeof why), "byte order mark"));
    ck_assert_int_eq(hf_json_read(bom + 3, strlen(bom) - 3, &root, &w), HF_JSON_OK);
    cJSON_Delete(root);
}
END_TEST

/* hf_json_read's fault and offset for texts cJSON parses (offsets counted
 * by hand from the texts): a raw control character or \u0000 is named
 * wherever it stands, before a syntax fault earlier in the text that only
 * the strict scan finds (01); a sound text that holds \u0000 is caught by
 * the one scan a sound text gets. */
START_TEST(faults_and_offsets)
{
    static const struct {
        const char *text;
        hf_json_fault f;
        size_t at;
        unsigned char ctl;
    } cases[] = {
        {"{\"a\": \"x\\u0000\"}", HF_JSON_NUL, 8, '\\'},
        {"{\"x\\u0000\": 1}", HF_JSON_NUL, 3, '\\'},
        {"[01, \"\\u0000\"]", HF_JSON_NUL, 6, '\\'},
        {"[1, \"a\tb\"]", HF_JSON_CONTROL, 6, '\t'},
        {"[01, \"a\tb\"]", HF_JSON_CONTROL, 7, '\t'},
        {"[01]", HF_JSON_SYNTAX, 2, 0}, /* "0" is a number; "1" is no comma (json.loads: char 2) */
        {"[1, 2.]", HF_JSON_SYNTAX, 4, 0},
        {"{\"a\": \"\\u00001\"}", HF_JSON_NUL, 7, '\\'},
        {"{\"a\": \"\\u0001\"}", HF_JSON_OK, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *root = NULL;
        hf_json_where w;
        hf_json_fault f = hf_json_read(cases[i].text, strlen(cases[i].text), &root, &w);
        ck_assert_msg(f == cases[i].f, "case %zu (%s): fault %d", i, cases[i].text, (int)f);
        ck_assert(f == HF_JSON_OK ? root != NULL : root == NULL);
        cJSON_Delete(root);
        if (f == HF_JSON_OK)
            continue;
        ck_assert_msg(w.at == cases[i].at, "case %zu (%s): at %zu", i, cases[i].text, w.at);
        if (f == HF_JSON_CONTROL)
            ck_assert_uint_eq(w.ctl, cases[i].ctl);
    }
}
END_TEST

/* ---- the loaders --------------------------------------------------------------------------- */

/* What a loader of the llama fixture folder loads. */
typedef enum { LOAD_CONFIG, LOAD_SAFETENSORS, LOAD_TOKENIZER } load_kind;

static int fixture_load(void *ctx, char *err, size_t err_len)
{
    static llmem_model_config cfg;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/llama", test_source_dir());
    llmem_status s = LLMEM_E_INVALID;
    switch (*(const load_kind *)ctx) {
    case LOAD_CONFIG: s = llmem_model_config_load(dir, &cfg, err, err_len); break;
    case LOAD_SAFETENSORS: {
        llmem_safetensors *st = NULL;
        s = llmem_safetensors_open(dir, &st, err, err_len);
        EXPECT(s == LLMEM_OK ? st != NULL : st == NULL);
        llmem_safetensors_close(st);
        break;
    }
    case LOAD_TOKENIZER: {
        llmem_tokenizer *tok = NULL;
        s = llmem_tokenizer_load(dir, &tok, err, err_len);
        EXPECT(s == LLMEM_OK ? tok != NULL : tok == NULL);
        llmem_tokenizer_destroy(tok);
        break;
    }
    }
    return s;
}

/* config.json, the safetensors header, tokenizer.json and tokenizer_config.json */
START_TEST(loaders)
{
    static const load_kind kinds[] = {LOAD_CONFIG, LOAD_SAFETENSORS, LOAD_TOKENIZER};
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int k = 0; k < 3; k++)
        every_allocation_fails(names[k], fixture_load, (void *)&kinds[k], LLMEM_E_NO_MEMORY);
}
END_TEST

static int render_json(void *ctx, char *err, size_t err_len)
{
    const llmem_chat_template *t = ctx;
    char *out = NULL;
    llmem_status s = llmem_chat_template_render_json(
        t, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"x\": [1, 2, {}]}", &out,
        NULL, err, err_len);
    EXPECT(s == LLMEM_OK ? out && !strcmp(out, "user: hi") : out == NULL);
    free(out);
    return s;
}

START_TEST(chat_template_context)
{
    llmem_chat_template *t = NULL;
    char err[256] = "";
    ck_assert_int_eq(llmem_chat_template_create("{% for m in messages %}{{ m.role }}: "
                                                "{{ m.content }}{% endfor %}",
                                                &t, err, sizeof err),
                     LLMEM_OK);
    every_allocation_fails("render_json", render_json, t, LLMEM_E_NO_MEMORY);
    llmem_chat_template_destroy(t);
}
END_TEST

/* ---- llmem serve's request bodies ------------------------------------------------------------ */

typedef struct serve_ctx {
    api_server server;
    bool chat;
    const char *body;
} serve_ctx;

static int serve_parse(void *ctx, char *err, size_t err_len)
{
    serve_ctx *c = ctx;
    api_request r;
    char *err_json = NULL;
    int rc = api_parse(&c->server, c->chat, c->body, strlen(c->body), 1, &r, &err_json);
    snprintf(err, err_len, "%s", err_json ? err_json : "(no error body)");
    if (rc == 0) {
        EXPECT(!err_json && r.req);
        eng_req_release(NULL, r.req);
    } else {
        EXPECT(!r.req);
    }
    if (err_json && rc == 500) { /* the OpenAI error object, typed as the server's fault */
        cJSON *e = cJSON_Parse(err_json);
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "error");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
        /* (parsing it may itself have found no memory) */
        EXPECT(!e || (cJSON_IsString(type) && !strcmp(type->valuestring, "server_error")));
        cJSON_Delete(e);
    }
    free(err_json);
    return rc;
}

START_TEST(serve_request_bodies)
{
    char dir[1024], err[512] = "";
    snprintf(dir, sizeof dir, "%s/tests/fixtures/llama", test_source_dir());
    llmem_model_config *cfg = malloc(sizeof *cfg);
    ck_assert_ptr_nonnull(cfg);
    ck_assert_msg(llmem_model_config_load(dir, cfg, err, sizeof err) == LLMEM_OK, "%s", err);
    srv_text *text = NULL;
    ck_assert_msg(srv_text_open(dir, cfg->vocab_size, &text, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    serve_ctx c = {.server = {.text = text, .model_name = "m", .n_ctx = 64,
                              .n_vocab = cfg->vocab_size}};
    c.chat = false;
    c.body = "{\"model\": \"m\", \"prompt\": \"Hello there\", \"max_tokens\": 4, "
             "\"stop\": [\"a\", \"b\"], \"temperature\": 0.5}";
    every_allocation_fails("completion", serve_parse, &c, 500);
    c.chat = true;
    c.body = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
             "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}]}], "
             "\"max_tokens\": 3}";
    every_allocation_fails("chat completion", serve_parse, &c, 500);
    srv_text_close(text);
    free(cfg);
}
END_TEST
#endif

int main(void)
{
#ifdef HOST_FAULTS
    Suite *s = suite_create("json_oom");
    TCase *tc = tcase_create("json_oom");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, read_fixture_config_and_tokenizer);
    tcase_add_test(tc, first_allocation_failing_tells_syntax_from_memory);
    tcase_add_test(tc, faults_and_offsets);
    tcase_add_test(tc, loaders);
    tcase_add_test(tc, chat_template_context);
    tcase_add_test(tc, serve_request_bodies);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
#else
    puts("json_oom: needs glibc without a sanitizer (interposes malloc); skipped");
    return 77;
#endif
}

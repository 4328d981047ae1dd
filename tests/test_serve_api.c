/* llmem serve's request-body parser (examples/cli/serve_api.c, api_parse):
 * regressions of what tests/fuzz/fuzz_serve_api found. A body is one JSON
 * text (RFC 8259, section 2: a value with optional whitespace around it),
 * so bytes after the object are refused, not ignored; a string holding
 * U+0000 is refused instead of reaching the engine cut short at the NUL;
 * and a name twice in one object is refused instead of read as its first.
 * Prompts are checked on byte-level ids, where the expected ids are the
 * ASCII codes of the prompt's characters. */
// ctest-labels: core serve
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/serve_api.h"
#include "support/run.h"

static srv_text *text;
static api_server server;

static void setup(void)
{
    char err[256] = "";
    ck_assert_int_eq(srv_text_open("/nonexistent-model-dir", 256, &text, err, sizeof err),
                     LLMEM_OK);
    server = (api_server){.text = text, .model_name = "m", .n_ctx = 64, .n_vocab = 256};
}

static void teardown(void)
{
    srv_text_close(text);
    text = NULL;
}

/* api_parse on a NUL-terminated body; checks the 400 contract when refused
 * (an error object naming `code`, no request). */
static int parse(bool chat, const char *body, api_request *r, const char *code)
{
    char *err_json = NULL;
    int rc = api_parse(&server, chat, body, strlen(body), 1, r, &err_json);
    if (rc) {
        ck_assert_int_eq(rc, 400);
        ck_assert_ptr_null(r->req);
        ck_assert_ptr_nonnull(err_json);
        ck_assert_msg(strstr(err_json, code), "%s lacks %s", err_json, code);
    } else {
        ck_assert_ptr_null(err_json);
        ck_assert_ptr_nonnull(r->req);
    }
    free(err_json);
    return rc;
}

static void expect_prompt(const api_request *r, const char *want)
{
    size_t n = strlen(want);
    ck_assert_int_eq(r->req->n_prompt, (int32_t)n);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(r->req->prompt[i], (unsigned char)want[i]);
}

/* A request body and its route. */
typedef struct body {
    bool chat;
    const char *text;
} body;

/* Every body must get 400 with an error object naming `code`. */
static void refuse_all(const body *bodies, size_t n, const char *code)
{
    api_request r;
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(parse(bodies[i].chat, bodies[i].text, &r, code) == 400, "accepted %s",
                      bodies[i].text);
}

START_TEST(bytes_after_the_object_are_refused)
{
    static const body bad[] = {
        {false, "{\"prompt\": \"Hi\"} x"},
        {false, "{\"prompt\": \"Hi\"}{}"},
        {false, "{\"prompt\": \"Hi\"}\n]"},
        {false, "{\"prompt\": \"Hi\"} \"max_tokens\": 9"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}, 1"},
    };
    refuse_all(bad, sizeof bad / sizeof bad[0], "invalid_json");
}
END_TEST

START_TEST(whitespace_after_the_object_is_accepted)
{
    api_request r;
    ck_assert_int_eq(parse(false, " \t{\"prompt\": \"Hi\", \"max_tokens\": 2}\r\n \t", &r, NULL), 0);
    expect_prompt(&r, "Hi");
    ck_assert_int_eq(r.req->max_tokens, 2);
    eng_req_release(NULL, r.req);
}
END_TEST

START_TEST(nul_in_a_string_is_refused)
{
    static const body bad[] = {
        {false, "{\"prompt\": \"a\\u0000b\"}"},
        {false, "{\"prompt\": \"Hi\", \"stop\": [\"x\\u0000y\"]}"},
        {false, "{\"prompt\": \"Hi\", \"stop\": \"\\u0000\"}"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
               "\"text\": \"\\u0000\"}]}]}"},
    };
    refuse_all(bad, sizeof bad / sizeof bad[0], "invalid_value");
}
END_TEST

/* A name twice in one object (RFC 8259 leaves it to the reader; Python's
 * json keeps the last, cJSON's lookup the first) is refused, at any depth. */
START_TEST(duplicate_names_are_refused)
{
    static const body bad[] = {
        {false, "{\"prompt\": \"Hi\", \"max_tokens\": 1, \"max_tokens\": 9}"},
        {false, "{\"prompt\": \"Hi\", \"prompt\": \"Ho\"}"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"content\": \"b\"}]}"},
        {false, "{\"prompt\": \"Hi\", \"stream\": true, \"stream_options\": "
                "{\"include_usage\": true, \"include_usage\": false}}"},
    };
    refuse_all(bad, sizeof bad / sizeof bad[0], "appears twice");
    /* the same name in two objects is fine */
    api_request r;
    ck_assert_int_eq(parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                                 "{\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": "
                                 "\"user\", \"content\": \"c\"}], \"max_tokens\": 1}", &r, NULL), 0);
    eng_req_release(NULL, r.req);
}
END_TEST

START_TEST(escaped_backslash_before_u0000_is_text)
{
    /* "a\\u0000b" is the 8 characters a \ u 0 0 0 0 b, not a NUL */
    api_request r;
    ck_assert_int_eq(parse(false, "{\"prompt\": \"a\\\\u0000b\", \"max_tokens\": 1}", &r, NULL), 0);
    expect_prompt(&r, "a\\u0000b");
    eng_req_release(NULL, r.req);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve_api");
    TCase *tc = tcase_create("parse");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, bytes_after_the_object_are_refused);
    tcase_add_test(tc, whitespace_after_the_object_is_accepted);
    tcase_add_test(tc, nul_in_a_string_is_refused);
    tcase_add_test(tc, duplicate_names_are_refused);
    tcase_add_test(tc, escaped_backslash_before_u0000_is_text);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

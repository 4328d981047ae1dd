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
#include <cjson/cJSON.h>
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

/* A body that starts with a UTF-8 byte order mark is read as json.loads
 * reads the body's bytes (the OpenAI servers' Starlette Request.json): it
 * decodes them as utf-8-sig, so one leading mark is skipped; a second
 * mark, or one after whitespace, is a character where a value must be
 * (Python 3.11: "Expecting value"). Files are stricter (test_file_errors). */
START_TEST(a_leading_byte_order_mark_is_skipped)
{
    api_request r;
    ck_assert_int_eq(parse(false, "\xEF\xBB\xBF {\"prompt\": \"Hi\"}", &r, NULL), 0);
    expect_prompt(&r, "Hi");
    eng_req_release(NULL, r.req);
    static const body bad[] = {
        {false, "\xEF\xBB\xBF\xEF\xBB\xBF{\"prompt\": \"Hi\"}"},
        {false, " \xEF\xBB\xBF{\"prompt\": \"Hi\"}"},
        {true, "\xEF\xBB\xBF"},
    };
    refuse_all(bad, sizeof bad / sizeof bad[0], "invalid_json");
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
    /* control characters written raw, in a string or between tokens (json.loads
     * refuses them; cJSON kept a raw tab in a prompt and skipped a \f) */
    static const body raw[] = {
        {false, "{\"prompt\": \"a\tb\"}"},
        {false, "{\"prompt\": \"a\001b\"}"},
        {false, "{\"prompt\":\f\"ab\"}"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\nb\"}]}"},
    };
    refuse_all(raw, sizeof raw / sizeof raw[0], "control character");
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

/* Refused with 400 and an error object whose param and code are these
 * (param NULL: JSON null). */
static void refuse(bool chat, const char *req, const char *param, const char *code)
{
    char *err_json = NULL;
    api_request r;
    int rc = api_parse(&server, chat, req, strlen(req), 1, &r, &err_json);
    ck_assert_msg(rc == 400, "accepted %s", req);
    ck_assert_ptr_null(r.req);
    cJSON *root = cJSON_Parse(err_json);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    ck_assert_msg(e, "%s: no error object: %s", req, err_json);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "param");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
    ck_assert_msg(param ? cJSON_IsString(p) && !strcmp(p->valuestring, param) : cJSON_IsNull(p),
                  "%s: param in %s, want %s", req, err_json, param ? param : "null");
    ck_assert_msg(cJSON_IsString(c) && !strcmp(c->valuestring, code), "%s: code in %s, want %s",
                  req, err_json, code);
    cJSON_Delete(root);
    free(err_json);
}

/* Values the OpenAI API and vLLM refuse (vLLM's SamplingParams: max_tokens
 * >= 1, n >= 1, no empty stop string, logprobs >= 0, top_logprobs only
 * with logprobs; the OpenAI API: temperature in [0, 2], top_p in [0, 1],
 * penalties in [-2, 2], stream_options only when streaming) are 400s that
 * name the parameter; values llmem does not implement (penalties other
 * than 0, logprobs, best_of > 1) are 400 too instead of being ignored, as
 * penalties used to be and an empty stop string was, and max_tokens 0 was
 * accepted. */
START_TEST(parameter_ranges)
{
    static const struct {
        bool chat;
        const char *body, *param, *code;
    } bad[] = {
        {false, "{\"prompt\": \"Hi\", \"max_tokens\": 0}", "max_tokens", "invalid_value"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": 0}",
         "max_tokens", "invalid_value"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
               "\"max_completion_tokens\": 0}", "max_completion_tokens", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"max_tokens\": 1.5}", "max_tokens", "invalid_type"},
        {false, "{\"prompt\": \"Hi\", \"n\": 0}", "n", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"n\": 2}", "n", "unsupported_value"},
        {false, "{\"prompt\": \"Hi\", \"temperature\": -0.1}", "temperature", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"temperature\": 2.5}", "temperature", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"top_p\": 1.01}", "top_p", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"top_p\": -1}", "top_p", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"top_k\": -2}", "top_k", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"stop\": \"\"}", "stop", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"stop\": [\"x\", \"\"]}", "stop", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"stop\": [\"x\", 3]}", "stop", "invalid_type"},
        {false, "{\"prompt\": \"Hi\", \"logprobs\": -1}", "logprobs", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"logprobs\": \"2\"}", "logprobs", "invalid_type"},
        {false, "{\"prompt\": \"Hi\", \"logprobs\": 0}", "logprobs", "unsupported_parameter"},
        {false, "{\"prompt\": \"Hi\", \"logprobs\": 5}", "logprobs", "unsupported_parameter"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": 1}",
         "logprobs", "invalid_type"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": true}",
         "logprobs", "unsupported_parameter"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"top_logprobs\": 2}",
         "top_logprobs", "invalid_value"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": true, "
               "\"top_logprobs\": 21}", "top_logprobs", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"best_of\": 0}", "best_of", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"best_of\": 3}", "best_of", "unsupported_parameter"},
        {false, "{\"prompt\": \"Hi\", \"presence_penalty\": 0.5}", "presence_penalty",
         "unsupported_value"},
        {false, "{\"prompt\": \"Hi\", \"frequency_penalty\": -2.5}", "frequency_penalty",
         "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"stream_options\": {\"include_usage\": true}}",
         "stream_options", "invalid_value"},
        {false, "{\"prompt\": \"Hi\", \"echo\": true}", "echo", "unsupported_parameter"},
        /* vLLM's extensions that would change the text: only their default */
        {false, "{\"prompt\": \"Hi\", \"repetition_penalty\": 1.1}", "repetition_penalty",
         "unsupported_parameter"},
        {false, "{\"prompt\": \"Hi\", \"repetition_penalty\": \"1\"}", "repetition_penalty",
         "invalid_type"},
        {false, "{\"prompt\": \"Hi\", \"min_tokens\": 4}", "min_tokens", "unsupported_parameter"},
        {false, "{\"prompt\": \"Hi\", \"ignore_eos\": true}", "ignore_eos", "unsupported_parameter"},
        {false, "{\"prompt\": \"Hi\", \"skip_special_tokens\": false}", "skip_special_tokens",
         "unsupported_parameter"},
        {false, "{\"prompt\": \"Hi\", \"stop_token_ids\": [2]}", "stop_token_ids",
         "unsupported_parameter"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"guided_choice\": "
               "[\"yes\", \"no\"]}", "guided_choice", "unsupported_parameter"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tool_choice\": "
               "\"required\"}", "tool_choice", "unsupported_parameter"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refuse(bad[i].chat, bad[i].body, bad[i].param, bad[i].code);
    /* the neutral values pass, and top_k -1 (vLLM's "all tokens") is 0 */
    api_request r;
    ck_assert_int_eq(parse(false, "{\"prompt\": \"Hi\", \"max_tokens\": 1, \"n\": 1, \"top_k\": -1, "
                                  "\"stop\": [\"x\"], \"logprobs\": null, \"best_of\": 1, "
                                  "\"presence_penalty\": 0, \"frequency_penalty\": 0.0, "
                                  "\"echo\": false, \"top_p\": 0, \"temperature\": 2, "
                                  "\"repetition_penalty\": 1, \"min_tokens\": 0, "
                                  "\"skip_special_tokens\": true, \"stop_token_ids\": [], "
                                  "\"guided_json\": null, \"tool_choice\": \"none\", "
                                  "\"stream\": true, \"stream_options\": {\"include_usage\": true}}",
                           &r, NULL), 0);
    ck_assert_int_eq(r.req->max_tokens, 1);
    ck_assert_int_eq(r.req->sp.top_k, 0);
    ck_assert_int_eq(r.req->n_stop, 1);
    ck_assert_str_eq(r.req->stop[0], "x");
    ck_assert(r.stream && r.include_usage);
    eng_req_release(NULL, r.req);
    ck_assert_int_eq(parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                                 "\"logprobs\": false, \"stop\": []}", &r, NULL), 0);
    ck_assert_int_eq(r.req->n_stop, 0);
    eng_req_release(NULL, r.req);
    /* a chat prompt that fills the 64-token context exactly leaves no room
     * for the default max_tokens (it used to be accepted with 0); one
     * token less gets the one token left */
    ck_assert_int_eq(parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"\"}]}",
                           &r, NULL), 0);
    int32_t frame = r.req->n_prompt; /* the template's tokens around the content */
    eng_req_release(NULL, r.req);
    ck_assert_int_lt(frame, 60);
    char full[512];
    for (int extra = 1; extra >= 0; extra--) {
        int o = snprintf(full, sizeof full, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
        for (int i = 0; i < 64 - frame - extra; i++)
            full[o++] = 'a';
        snprintf(full + o, sizeof full - (size_t)o, "\"}]}");
        if (extra) {
            ck_assert_int_eq(parse(true, full, &r, NULL), 0);
            ck_assert_int_eq(r.req->n_prompt, 63);
            ck_assert_int_eq(r.req->max_tokens, 1);
            eng_req_release(NULL, r.req);
        }
    }
    refuse(true, full, "messages", "context_length_exceeded");
}
END_TEST

/* A prompt is a string, token ids, or a batch of one of those: a batch of
 * several is refused as a batch (a batch of two id lists was refused as
 * non-integer ids), an element of the ids that is not an integer as such
 * (a string there inside a batch of one was called a batch of strings). */
START_TEST(prompt_shapes)
{
    static const struct {
        const char *body, *code;
    } bad[] = {
        {"{\"prompt\": [[72, 105], [72, 105]]}", "unsupported_value"},
        {"{\"prompt\": [\"Hi\", \"Hi\"]}", "unsupported_value"},
        {"{\"prompt\": [\"Hi\", 72]}", "unsupported_value"},
        {"{\"prompt\": [[72, \"i\"]]}", "invalid_value"},
        {"{\"prompt\": [72, \"i\"]}", "invalid_value"},
        {"{\"prompt\": [72, [105]]}", "invalid_value"},
        {"{\"prompt\": [72, {\"id\": 105}]}", "invalid_value"},
        {"{\"prompt\": [72, 105.5]}", "invalid_value"},
        {"{\"prompt\": [[72, 256]]}", "invalid_value"},
        {"{\"prompt\": [[]]}", "invalid_type"},
        {"{\"prompt\": [[[72]]]}", "invalid_value"},
        {"{\"prompt\": {\"text\": \"Hi\"}}", "invalid_type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refuse(false, bad[i].body, "prompt", bad[i].code);
    static const char *const good[] = {"{\"prompt\": \"Hi\"}", "{\"prompt\": [\"Hi\"]}",
                                       "{\"prompt\": [72, 105]}", "{\"prompt\": [[72, 105]]}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        api_request r;
        ck_assert_int_eq(parse(false, good[i], &r, NULL), 0);
        expect_prompt(&r, "Hi");
        eng_req_release(NULL, r.req);
    }
}
END_TEST

/* A body is UTF-8 (RFC 8259, section 8.1; json.loads of other bytes is an
 * error): a stray byte, a sequence cut short, an overlong form and an
 * encoded surrogate are each refused as invalid JSON naming the byte,
 * where they used to reach the tokenizer; UTF-8 text passes. */
START_TEST(bodies_that_are_not_utf8_are_refused)
{
    static const body bad[] = {
        {false, "{\"prompt\": \"a\xff\"}"},
        {false, "{\"prompt\": \"a\xc3\"}"},
        {false, "{\"prompt\": \"\xc0\xaf\"}"},
        {false, "{\"prompt\": \"\xed\xa0\x80\"}"},
        {false, "{\"prompt\": \"Hi\", \"stop\": [\"\xf4\x90\x80\x80\"]}"},
        {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xfe\"}]}"},
        {false, "\xef\xbb\xbf{\"prompt\": \"\x80\"}"},
    };
    refuse_all(bad, sizeof bad / sizeof bad[0], "not UTF-8");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refuse(bad[i].chat, bad[i].text, NULL, "invalid_json");
    api_request r;
    ck_assert_int_eq(parse(false, "{\"prompt\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", &r,
                           NULL), 0);
    expect_prompt(&r, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
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
    tcase_add_test(tc, a_leading_byte_order_mark_is_skipped);
    tcase_add_test(tc, duplicate_names_are_refused);
    tcase_add_test(tc, escaped_backslash_before_u0000_is_text);
    tcase_add_test(tc, parameter_ranges);
    tcase_add_test(tc, prompt_shapes);
    tcase_add_test(tc, bodies_that_are_not_utf8_are_refused);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

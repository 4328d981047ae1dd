/* Chat template tests: llmem's Jinja2 subset against Python's jinja2 on the
 * chat templates of the families llmem runs (tests/fixtures/chat_templates,
 * cases.jsonl written by tests/tokenizer/chat_cases.py with jinja2 3.1 as
 * transformers configures it), plus whitespace control, errors and the
 * messages-array entry point. LLMEM_CHAT_CASES=FILE checks another cases
 * file (the live CI test writes fresh ones). */
// ctest-labels: core tokenizer
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/chat_template.h"
#include "support/run.h"
#include "support/fixture_case.h"

/* path of a file in the chat-template fixtures (run.h: test_source_dir) */
static const char *fixture(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/tests/fixtures/chat_templates/%s", test_source_dir(), name);
    return buf;
}

START_TEST(test_cases)
{
    const char *cases = getenv("LLMEM_CHAT_CASES");
    bool committed = !cases;
    char cases_path[1024];
    if (!cases)
        cases = fixture(cases_path, sizeof cases_path, "cases.jsonl");
    FILE *f = fopen(cases, "rb");
    ck_assert_ptr_nonnull(f);
    char *line = NULL, last[256] = "";
    size_t cap = 0;
    int n = 0, bad = 0, errors = 0;
    llmem_chat_template *t = NULL;
    while (getline(&line, &cap, f) > 0) {
        cJSON *c = cJSON_Parse(line);
        ck_assert_ptr_nonnull(c);
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        char err[512] = "";
        if (strcmp(name, last)) {
            llmem_chat_template_destroy(t);
            char path[1024];
            fixture(path, sizeof path, name);
            char *src = fx_read_file(path, NULL);
            llmem_status st = llmem_chat_template_create(src, &t, err, sizeof err);
            free(src);
            ck_assert_msg(st == LLMEM_OK, "%s: %s", name, err);
            snprintf(last, sizeof last, "%s", name);
        }
        char *ctx = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "context"));
        char *out = NULL;
        size_t len = 0;
        llmem_status st = llmem_chat_template_render_json(t, ctx, &out, &len, err, sizeof err);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "expected");
        const cJSON *werr = cJSON_GetObjectItemCaseSensitive(c, "error");
        if (werr) {
            errors++;
            if (st == LLMEM_OK || !strstr(err, werr->valuestring)) {
                if (bad++ < 5)
                    fprintf(stderr, "%s case %d: want error [%s], got %d [%s]\n", name, n, werr->valuestring, st, err);
            }
        } else if (st != LLMEM_OK) {
            if (bad++ < 5)
                fprintf(stderr, "%s case %d: %s\n", name, n, err);
        } else if (len != strlen(want->valuestring) || memcmp(out, want->valuestring, len)) {
            if (bad++ < 5)
                fprintf(stderr, "%s case %d (%s):\n--- want\n%s\n--- got\n%s\n---\n", name, n, ctx,
                        want->valuestring, out);
        }
        free(out);
        free(ctx);
        cJSON_Delete(c);
        n++;
    }
    llmem_chat_template_destroy(t);
    free(line);
    fclose(f);
    ck_assert_msg(bad == 0, "%d of %d cases differ from jinja2", bad, n);
    ck_assert_int_ge(n, 50);
    if (committed) /* the committed cases include templates that raise */
        ck_assert_int_ge(errors, 1);
}
END_TEST

static char *render(const char *src, const char *ctx, llmem_status *st, char *err, size_t err_len)
{
    llmem_chat_template *t = NULL;
    *st = llmem_chat_template_create(src, &t, err, err_len);
    if (*st)
        return NULL;
    char *out = NULL;
    *st = llmem_chat_template_render_json(t, ctx, &out, NULL, err, err_len);
    llmem_chat_template_destroy(t);
    return out;
}

/* expected strings below were rendered by jinja2 3.1.6 with trim_blocks and
 * lstrip_blocks (the environment of tests/tokenizer/chat_cases.py) */
START_TEST(test_constructs)
{
    static const struct {
        const char *src, *ctx, *want;
    } c[] = {
        {"a\n  {% if x %}\nyes\n  {% endif %}\nb", "{\"x\": true}", "a\nyes\nb"},
        {"{{- ' x ' -}}  \n {{ 'y' }}", "{}", " x y"},
        {"{% for m in xs %}{{ loop.index }}{{ m }}{% if not loop.last %},{% endif %}{% endfor %}",
         "{\"xs\": [\"a\", \"b\", \"c\"]}", "1a,2b,3c"},
        {"{% set ns = namespace(n=0) %}{% for x in xs if x > 1 %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
         "{\"xs\": [1, 2, 3]}", "5"},
        {"{{ xs | length }} {{ 'AbC' | lower }} {{ ' t ' | trim }} {{ none | default('d') }} {{ u | default('d') }}",
         "{\"xs\": [1, 2]}", "2 abc t None d"},
        {"{{ {'b': [1, 'x'], 'a': none} | tojson }}", "{}", "{\"b\": [1, \"x\"], \"a\": null}"},
        {"{{ xs[1:] }} {{ xs[::-1] }} {{ xs[-1] }}", "{\"xs\": [1, 2, 3]}", "[2, 3] [3, 2, 1] 3"},
        {"{% if 'b' in 'abc' and 2 not in [1] %}ok{% elif x %}no{% else %}no{% endif %}", "{}", "ok"},
        {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"x\": 1, \"y\": \"z\"}}", "x=1;y=z;"},
        {"{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f('A') }}{{ f('a', b='b') }}", "{}", "[AB][ab]"},
        {"{{ 7 // 2 }} {{ 7 % 3 }} {{ 1 + 2 * 3 }} {{ 'a' ~ 1 }} {{ 2.5 }} {{ -3 }}", "{}", "3 1 7 a1 2.5 -3"},
        {"{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
         "{% endfor %}", "{\"xs\": [1, 2, 3, 4, 5]}", "13"},
        {"{{ x is defined }} {{ y is not none }} {{ 3 is odd }} {{ 'a' is string }}", "{\"x\": 1, \"y\": null}",
         "True False True True"},
        {"{{ 'a,b'.split(',') }} {{ ' s '.strip() }} {{ 'abc'.startswith('ab') }}", "{}", "['a', 'b'] s True"},
        {"a{% raw %}{{ x }}{% if %}{% endraw %}b", "{\"x\": 1}", "a{{ x }}{% if %}b"},
        {"{{ {'k': [1, {'a': 'b'}]} | tojson(indent=2) }}", "{}", "{\n  \"k\": [\n    1,\n    {\n      \"a\": \"b\"\n    }\n  ]\n}"},
        {"{% for m in ms | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}|{{ ms | map(attribute='role') | join(',') }}",
         "{\"ms\": [{\"role\": \"user\", \"content\": \"A\"}, {\"role\": \"bot\", \"content\": \"B\"}]}", "A|user,bot"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char err[256] = "";
        llmem_status st;
        char *out = render(c[i].src, c[i].ctx, &st, err, sizeof err);
        ck_assert_msg(st == LLMEM_OK, "case %zu: %s", i, err);
        ck_assert_msg(!strcmp(out, c[i].want), "case %zu: want [%s] got [%s]", i, c[i].want, out);
        free(out);
    }
}
END_TEST

START_TEST(test_errors)
{
    char err[256] = "";
    llmem_status st;
    llmem_chat_template *t = NULL;
    ck_assert_int_eq(llmem_chat_template_create(NULL, &t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_chat_template_create("{% if x %}", &t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "endif"), "%s", err);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(llmem_chat_template_create("a\n{% include 'x' %}", &t, err, sizeof err), LLMEM_E_UNSUPPORTED);
    ck_assert_msg(strstr(err, "include") && strstr(err, "line 2"), "%s", err);
    ck_assert_int_eq(llmem_chat_template_create("{{ x", &t, err, sizeof err), LLMEM_E_INVALID);
    char *out = render("{{ x | wordwrap }}", "{\"x\": 1}", &st, err, sizeof err);
    ck_assert_int_eq(st, LLMEM_E_UNSUPPORTED);
    ck_assert_msg(strstr(err, "wordwrap"), "%s", err);
    ck_assert_ptr_null(out);
    out = render("{{ raise_exception('bad roles') }}", "{}", &st, err, sizeof err);
    ck_assert_int_eq(st, LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "bad roles"), "%s", err);
    out = render("x", "[1]", &st, err, sizeof err);
    ck_assert_int_eq(st, LLMEM_E_INVALID);
    /* contexts json.loads refuses (or reads otherwise): cJSON took each, the
     * second as its first "x" (json.loads keeps the last), the third cut
     * at the NUL */
    static const char *const bad_ctx[][2] = {{"{\"x\": 1} {}", "bytes after"},
                                             {"{\"x\": 1, \"x\": 2}", "'x' appears twice"},
                                             {"{\"x\": \"a\\u0000b\"}", "\\u0000"},
                                             {"{\"x\": 01}", "not valid JSON"}};
    for (size_t i = 0; i < sizeof bad_ctx / sizeof *bad_ctx; i++) {
        out = render("{{ x }}", bad_ctx[i][0], &st, err, sizeof err);
        ck_assert_int_eq(st, LLMEM_E_INVALID);
        ck_assert_ptr_null(out);
        ck_assert_msg(strstr(err, bad_ctx[i][1]), "%s: %s", bad_ctx[i][0], err);
    }
    /* deep nesting is refused, not a stack overflow */
    size_t deep = 100000;
    char *src = malloc(4 * deep + 16);
    strcpy(src, "{{ ");
    for (size_t i = 0; i < deep; i++)
        strcat(src + 3 + i, "(");
    strcat(src, "1 }}");
    ck_assert_int_eq(llmem_chat_template_create(src, &t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "too deep"), "%s", err);
    src[0] = 0;
    for (size_t i = 0; i < 20000; i++)
        memcpy(src + 12 * i, "{% if x %}  ", 13);
    ck_assert_int_eq(llmem_chat_template_create(src, &t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "too deep"), "%s", err);
    strcpy(src, "{{ ");
    for (size_t i = 0; i < deep; i++)
        memcpy(src + 3 + 4 * i, "not ", 5);
    strcat(src, "1 }}");
    ck_assert_int_eq(llmem_chat_template_create(src, &t, err, sizeof err), LLMEM_E_INVALID);
    free(src);
    /* runaway templates stop at the evaluation budget */
    out = render("{% set xs = range(5000) %}{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}", "{}", &st,
                 err, sizeof err);
    ck_assert_int_eq(st, LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "budget"), "%s", err);
    out = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}", &st, err,
                 sizeof err);
    ck_assert_int_ne(st, LLMEM_OK); /* the step or the memory budget, whichever comes first */
    ck_assert_ptr_null(out);
    out = render("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}", "{}", &st, err, sizeof err);
    ck_assert_int_ne(st, LLMEM_OK);
    ck_assert_ptr_null(out);
    out = render("{{ 'ab' * 1000000000 }}", "{}", &st, err, sizeof err);
    ck_assert_int_eq(st, LLMEM_E_INVALID);
    out = render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}{{ ns.s | length }}", "{}", &st, err, sizeof err);
    ck_assert_int_eq(st, LLMEM_E_NO_MEMORY);
    ck_assert_ptr_null(out);
    llmem_chat_template_destroy(NULL);
}
END_TEST

START_TEST(test_messages_api)
{
    char path[1024];
    char *src = fx_read_file(fixture(path, sizeof path, "Qwen-Qwen2.5-7B-Instruct.jinja"), NULL);
    char err[256] = "";
    llmem_chat_template *t = NULL;
    ck_assert_int_eq(llmem_chat_template_create(src, &t, err, sizeof err), LLMEM_OK);
    free(src);
    llmem_chat_message m[] = {{"system", "S"}, {"user", "Hi"}};
    char *out = NULL;
    size_t len = 0;
    ck_assert_int_eq(llmem_chat_template_render(t, m, 2, true, NULL, NULL, &out, &len, err, sizeof err), LLMEM_OK);
    /* the ChatML layout of the Qwen2.5 template */
    const char *want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(len, strlen(want));
    free(out);
    llmem_chat_template_destroy(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("chat_template");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_cases);
    tcase_add_test(tc, test_constructs);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_messages_api);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

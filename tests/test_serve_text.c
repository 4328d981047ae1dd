/* llmem serve's text side (examples/cli/serve_text.c): the byte-level
 * streaming detokenizer never emits a broken UTF-8 character and replaces
 * ill-formed bytes one U+FFFD per maximal subpart (expected values from The
 * Unicode Standard 15.0, section 3.9, Table 3-8 -- what Python's
 * bytes.decode("utf-8", "replace") gives), and the default chat template
 * documented in docs/serve.md. */
// ctest-labels: core serve
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/serve_text.h"
#include "support/run.h"

#define FFFD "\xEF\xBF\xBD"

static srv_text *bytes_text(void)
{
    srv_text *t = NULL;
    char err[256];
    ck_assert_int_eq(srv_text_open("/nonexistent-model-dir", 256, &t, err, sizeof err), LLMEM_OK);
    ck_assert_str_eq(srv_text_kind(t), "bytes");
    return t;
}

/* Pushes n bytes one by one; per push, the number of bytes that came out
 * goes to emitted[i]. Returns the whole output (after flush when asked). */
static char *push_all(srv_text *t, const char *in, size_t n, size_t *emitted, bool flush,
                      size_t *len)
{
    srv_detok *d = NULL;
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    ck_assert_int_eq(srv_detok_create(t, &d), LLMEM_OK);
    for (size_t i = 0; i < n; i++) {
        size_t before = *len;
        ck_assert_int_eq(srv_detok_push(d, (unsigned char)in[i], &buf, len, &cap), LLMEM_OK);
        if (emitted)
            emitted[i] = *len - before;
    }
    if (flush)
        ck_assert_int_eq(srv_detok_flush(d, &buf, len, &cap), LLMEM_OK);
    srv_detok_destroy(d);
    return buf;
}

START_TEST(split_characters_are_held)
{
    srv_text *t = bytes_text();
    /* "é" C3 A9, "€" E2 82 AC, U+1F600 F0 9F 98 80 */
    const char in[] = "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80!";
    size_t want[] = {0, 2, 0, 0, 3, 0, 0, 0, 4, 1}, got[10], len;
    char *out = push_all(t, in, 10, got, true, &len);
    for (int i = 0; i < 10; i++)
        ck_assert_uint_eq(got[i], want[i]);
    ck_assert_uint_eq(len, 10);
    ck_assert_mem_eq(out, in, 10);
    free(out);
    srv_text_close(t);
}
END_TEST

START_TEST(maximal_subparts_become_one_replacement_each)
{
    srv_text *t = bytes_text();
    /* Unicode 15.0 Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 */
    const char in[] = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
    const char want[] = "a" FFFD FFFD FFFD "b" FFFD "c" FFFD FFFD "d";
    size_t len;
    char *out = push_all(t, in, sizeof in - 1, NULL, true, &len);
    ck_assert_uint_eq(len, sizeof want - 1);
    ck_assert_mem_eq(out, want, len);
    free(out);
    /* surrogates and overlongs are ill-formed from their second byte */
    const char in2[] = "\xED\xA0\x80\xC0\xAF\xE0\x80\xAF";
    const char want2[] = FFFD FFFD FFFD FFFD FFFD FFFD FFFD FFFD;
    out = push_all(t, in2, sizeof in2 - 1, NULL, true, &len);
    ck_assert_uint_eq(len, sizeof want2 - 1);
    ck_assert_mem_eq(out, want2, len);
    free(out);
    srv_text_close(t);
}
END_TEST

START_TEST(flush_replaces_an_unfinished_character)
{
    srv_text *t = bytes_text();
    size_t got[4], len; /* one count per pushed byte (got[3] was written past) */
    char *out = push_all(t, "ab\xE2\x82", 4, got, false, &len);
    ck_assert_uint_eq(len, 2); /* the euro sign's first two bytes are held */
    ck_assert_uint_eq(got[0], 1);
    ck_assert_uint_eq(got[1], 1);
    ck_assert_uint_eq(got[2], 0);
    ck_assert_uint_eq(got[3], 0);
    free(out);
    out = push_all(t, "ab\xE2\x82", 4, NULL, true, &len);
    ck_assert_uint_eq(len, 5);
    ck_assert_mem_eq(out, "ab" FFFD, 5);
    free(out);
    srv_detok *d = NULL;
    char *buf = NULL;
    size_t cap = 0;
    len = 0;
    ck_assert_int_eq(srv_detok_create(t, &d), LLMEM_OK);
    ck_assert_int_eq(srv_detok_push(d, 256, &buf, &len, &cap), LLMEM_E_INVALID);
    ck_assert_int_eq(srv_detok_push(d, -1, &buf, &len, &cap), LLMEM_E_INVALID);
    ck_assert_uint_eq(len, 0);
    srv_detok_destroy(d);
    free(buf);
    srv_text_close(t);
}
END_TEST

START_TEST(valid_prefix)
{
    ck_assert_uint_eq(srv_utf8_valid_prefix("a\xC3", 2), 1);
    ck_assert_uint_eq(srv_utf8_valid_prefix("\xE2\x82\xAC", 3), 3);
    ck_assert_uint_eq(srv_utf8_valid_prefix("x\xED\xA0\x80", 4), 1);
    ck_assert_uint_eq(srv_utf8_valid_prefix("\xF4\x90\x80\x80", 4), 0); /* > U+10FFFF */
    ck_assert_uint_eq(srv_utf8_valid_prefix("", 0), 0);
}
END_TEST

START_TEST(default_chat_template)
{
    srv_text *t = bytes_text();
    srv_msg msgs[] = {{"system", "Speak verse."}, {"user", "Hello"}, {"assistant", NULL}};
    const char want[] = "SYSTEM:\nSpeak verse.\n\nUSER:\nHello\n\nASSISTANT:\n\n\nASSISTANT:\n";
    int32_t *ids = NULL, n = 0;
    char err[256];
    ck_assert_int_eq(srv_text_chat(t, msgs, 3, &ids, &n, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(n, (int32_t)strlen(want));
    for (int32_t i = 0; i < n; i++)
        ck_assert_int_eq(ids[i], (unsigned char)want[i]);
    free(ids);
    ck_assert(!srv_text_is_eog(t, 0));
    srv_text_close(t);
}
END_TEST

START_TEST(not_text_without_tokenizer)
{
    srv_text *t = (srv_text *)1;
    char err[256] = "";
    ck_assert_int_eq(srv_text_open("/nonexistent-model-dir", 32000, &t, err, sizeof err),
                     LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_null(t);
    ck_assert(strstr(err, "tokenizer") != NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve_text");
    TCase *tc = tcase_create("serve_text");
    tcase_add_test(tc, split_characters_are_held);
    tcase_add_test(tc, maximal_subparts_become_one_replacement_each);
    tcase_add_test(tc, flush_replaces_an_unfinished_character);
    tcase_add_test(tc, valid_prefix);
    tcase_add_test(tc, default_chat_template);
    tcase_add_test(tc, not_text_without_tokenizer);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

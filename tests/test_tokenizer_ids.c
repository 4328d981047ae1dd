/* Token ids of tokenizer.json as Hugging Face tokenizers 0.23.3 reads them
 * (Tokenizer.from_str, checked with the pip package when this was written):
 *
 * - A vocabulary giving two tokens one id ({"a": 0, "b": 0}) loads there,
 *   but id 0 decodes to whichever token its hash map yields last: "a" in
 *   one run, "b" in the next. llmem used to keep the first silently and
 *   lose the other from encoding; it now refuses the file
 *   (LLMEM_E_CORRUPT naming the id and both tokens).
 * - An added token's "id" is not read: tokenizers gives an added token the
 *   id an earlier added token of the same content has, else the
 *   vocabulary's id for it, else the next id after the vocabulary's
 *   entries and the added ids so far (AddedVocabulary::add_tokens). A file
 *   it wrote agrees; one whose ids have gaps, run past that, repeat or
 *   come out of order does not, and llmem, which used the file's ids,
 *   would encode other ids than tokenizers. llmem refuses such a file
 *   (LLMEM_E_CORRUPT naming the token, the file's id and tokenizers' id).
 *   Tokenizers skips an added token with empty content; llmem refuses it.
 *
 * The ids in `want` below are what tokenizers 0.23.3 assigned. */
// ctest-labels: core tokenizer
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/tokenizer.h"
#include "support/run.h"

static char dir[64], path[128];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/llmem_tokid_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

/* A BPE tokenizer.json with this vocabulary and added_tokens (JSON text). */
static void write_tokenizer(const char *vocab, const char *added)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"added_tokens\": [%s], \"model\": {\"type\": \"BPE\", \"vocab\": %s, "
               "\"merges\": []}}", added, vocab);
    ck_assert_int_eq(fclose(f), 0);
}

#define ADDED(content, id)                                                                         \
    "{\"id\": " #id ", \"content\": \"" content "\", \"special\": true, \"normalized\": false}"

START_TEST(refused)
{
    static const struct {
        const char *vocab, *added, *why;
    } cases[] = {
        {"{\"a\": 0, \"b\": 0}", "", "vocab tokens 'a' and 'b' both have id 0"},
        {"{\"a\": 0, \"b\": 1, \"c\": 1}", "", "vocab tokens 'b' and 'c' both have id 1"},
        /* a gap: tokenizers numbers <x> 2 */
        {"{\"a\": 0, \"b\": 1}", ADDED("<x>", 5), "'<x>' has id 5, but Hugging Face tokenizers "
                                                  "gives it id 2"},
        /* in the vocabulary: its id there */
        {"{\"a\": 0, \"b\": 1}", ADDED("b", 5), "'b' has id 5, but Hugging Face tokenizers gives "
                                                "it id 1"},
        /* out of order: the first listed gets 2 */
        {"{\"a\": 0, \"b\": 1}", ADDED("<y>", 3) ", " ADDED("<x>", 2),
         "'<y>' has id 3, but Hugging Face tokenizers gives it id 2"},
        /* two contents, one id: the second gets 3 */
        {"{\"a\": 0, \"b\": 1}", ADDED("<x>", 2) ", " ADDED("<y>", 2),
         "'<y>' has id 2, but Hugging Face tokenizers gives it id 3"},
        /* after a vocabulary with a hole: the count of its entries, 2 */
        {"{\"a\": 0, \"b\": 2}", ADDED("<x>", 3), "'<x>' has id 3, but Hugging Face tokenizers "
                                                  "gives it id 2"},
        {"{\"a\": 0, \"b\": 1}", ADDED("", 2), "added token id 2 has no content"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_tokenizer(cases[i].vocab, cases[i].added);
        char err[256] = "";
        llmem_tokenizer *tok = (llmem_tokenizer *)1;
        llmem_status s = llmem_tokenizer_load(path, &tok, err, sizeof err);
        ck_assert_msg(s == LLMEM_E_CORRUPT, "case %zu: %s (%s)", i, llmem_status_str(s), err);
        ck_assert_ptr_null(tok);
        ck_assert_msg(strstr(err, cases[i].why), "case %zu: '%s' lacks '%s'", i, err,
                      cases[i].why);
    }
}
END_TEST

static void expect_encode(const llmem_tokenizer *tok, const char *text, const int32_t *want,
                          int32_t n_want)
{
    int32_t *ids = NULL, n = 0;
    char err[256] = "";
    ck_assert_msg(llmem_tokenizer_encode(tok, text, strlen(text), false, true, &ids, &n, err,
                                         sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(n, n_want);
    for (int32_t i = 0; i < n; i++)
        ck_assert_int_eq(ids[i], want[i]);
    free(ids);
}

START_TEST(accepted)
{
    char err[256] = "";
    llmem_tokenizer *tok = NULL;
    /* ids as tokenizers gives them, an added token in the vocabulary, and
     * one listed twice alike: tokenizers encodes "a<x>b<y>" as [0, 2, 1, 3] */
    write_tokenizer("{\"a\": 0, \"b\": 1}",
                    ADDED("<x>", 2) ", " ADDED("<y>", 3) ", " ADDED("a", 0) ", " ADDED("<x>", 2));
    ck_assert_msg(llmem_tokenizer_load(path, &tok, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(llmem_tokenizer_n_vocab(tok), 4);
    expect_encode(tok, "a<x>b<y>", (const int32_t[]){0, 2, 1, 3}, 4);
    llmem_tokenizer_destroy(tok);
    /* a hole in the vocabulary loads in both: "ab" is [0, 2] */
    write_tokenizer("{\"a\": 0, \"b\": 2}", "");
    ck_assert_msg(llmem_tokenizer_load(path, &tok, err, sizeof err) == LLMEM_OK, "%s", err);
    expect_encode(tok, "ab", (const int32_t[]){0, 2}, 2);
    llmem_tokenizer_destroy(tok);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tokenizer_ids");
    TCase *tc = tcase_create("tokenizer_ids");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, refused);
    tcase_add_test(tc, accepted);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Tokenizer tests: llmem's encode/decode against the ids and strings Hugging
 * Face `tokenizers` gave for the committed fixtures (tests/fixtures/
 * tokenizers/<kind>/cases.jsonl, written by tools/make_tokenizer_fixtures.py;
 * the expected values come from `tokenizers`, never from llmem), the
 * streaming detokenizer against full decodes, and the error paths. */
// ctest-labels: core tokenizer
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/tokenizer.h"
#include "support/run.h"
#include "support/fixture_case.h"

/* format prefix of a path in the tokenizer fixtures; its %s is
 * test_source_dir() (run.h), so a carried build finds them too */
#define FIX "%s/tests/fixtures/tokenizers/"

static const char *kinds[] = {"gpt2", "llama3", "qwen2", "spm", "metaspace", "falcon", "words"};
#define N_KINDS (int)(sizeof kinds / sizeof kinds[0])

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* the case's bytes: "text" or "hex"; caller frees */
static char *case_bytes(const cJSON *c, size_t *n)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
    if (cJSON_IsString(t)) {
        *n = strlen(t->valuestring);
        char *p = malloc(*n + 1);
        memcpy(p, t->valuestring, *n + 1);
        return p;
    }
    const char *h = cJSON_GetObjectItemCaseSensitive(c, "hex")->valuestring;
    *n = strlen(h) / 2;
    char *p = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++)
        p[i] = (char)(hexval(h[2 * i]) * 16 + hexval(h[2 * i + 1]));
    p[*n] = 0;
    return p;
}

static bool ids_equal(const cJSON *want, const int32_t *got, int32_t n)
{
    if (cJSON_GetArraySize(want) != n)
        return false;
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, want) if (v->valueint != got[i++]) return false;
    return true;
}

static char *ids_str(const int32_t *ids, int32_t n)
{
    static char buf[4096];
    size_t o = 0;
    for (int32_t i = 0; i < n && o < sizeof buf - 16; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%d ", ids[i]);
    buf[o] = 0;
    return buf;
}

/* Decodes ids through the streaming detokenizer, one id at a time. */
static char *stream_decode(const llmem_tokenizer *tok, const int32_t *ids, int32_t n, bool keep, size_t *len)
{
    llmem_detok *d = NULL;
    ck_assert_int_eq(llmem_detok_create(tok, keep, &d), LLMEM_OK);
    size_t cap = 1 << 16, o = 0;
    char *out = malloc(cap);
    for (int32_t i = 0; i < n; i++) {
        size_t k;
        ck_assert_int_eq(llmem_detok_push(d, ids[i], out + o, cap - o, &k), LLMEM_OK);
        /* only complete UTF-8 leaves the detokenizer */
        for (size_t j = 0; j < k; j++) {
            unsigned char c = (unsigned char)out[o + j];
            if (j == k - 1)
                ck_assert_msg(c < 0xC0, "push emitted a truncated character");
        }
        o += k;
    }
    size_t k;
    ck_assert_int_eq(llmem_detok_flush(d, out + o, cap - o, &k), LLMEM_OK);
    o += k;
    llmem_detok_destroy(d);
    *len = o;
    return out;
}

static int run_kind(const char *kind, int *n_cases)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, FIX "%s", test_source_dir(), kind);
    llmem_tokenizer *tok = NULL;
    llmem_status st = llmem_tokenizer_load(path, &tok, err, sizeof err);
    ck_assert_msg(st == LLMEM_OK, "%s: %s", kind, err);
    snprintf(path, sizeof path, FIX "%s/cases.jsonl", test_source_dir(), kind);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    char *line = NULL;
    size_t cap = 0;
    int bad = 0, n = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *c = cJSON_Parse(line);
        ck_assert_ptr_nonnull(c);
        size_t len;
        char *text = case_bytes(c, &len);
        int32_t *ids = NULL, n_ids = 0;
        ck_assert_int_eq(llmem_tokenizer_encode(tok, text, len, true, true, &ids, &n_ids, err, sizeof err),
                         LLMEM_OK);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids");
        if (!ids_equal(want, ids, n_ids)) {
            if (bad++ < 5) {
                char *w = cJSON_PrintUnformatted(want);
                fprintf(stderr, "%s case %d encode: %s\n  want %s\n  got  %s\n", kind, n, line, w,
                        ids_str(ids, n_ids));
                free(w);
            }
        }
        /* decode the expected ids (so decode is tested even where encode differs) */
        int32_t nw = cJSON_GetArraySize(want), i = 0;
        int32_t *wids = malloc(sizeof *wids * (size_t)(nw + 1));
        const cJSON *v;
        cJSON_ArrayForEach(v, want) wids[i++] = v->valueint;
        for (int keep = 1; keep >= 0; keep--) {
            const cJSON *dw = cJSON_GetObjectItemCaseSensitive(c, keep ? "decoded" : "decoded_skip");
            if (!dw)
                dw = cJSON_GetObjectItemCaseSensitive(c, "decoded");
            char *dec = NULL;
            size_t dlen = 0;
            ck_assert_int_eq(llmem_tokenizer_decode(tok, wids, nw, keep, &dec, &dlen, err, sizeof err), LLMEM_OK);
            if (dlen != strlen(dw->valuestring) || memcmp(dec, dw->valuestring, dlen)) {
                if (bad++ < 5)
                    fprintf(stderr, "%s case %d decode(keep=%d): %s\n  want [%s]\n  got  [%s]\n", kind, n, keep,
                            line, dw->valuestring, dec);
            } else if (!strstr(dec, "\xEF\xBF\xBD")) {
                size_t sl;
                char *s = stream_decode(tok, wids, nw, keep, &sl);
                if (sl != dlen || memcmp(s, dec, dlen)) {
                    if (bad++ < 5)
                        fprintf(stderr, "%s case %d stream(keep=%d): want [%s] got [%.*s]\n", kind, n, keep, dec,
                                (int)sl, s);
                }
                free(s);
            }
            free(dec);
        }
        const cJSON *plain = cJSON_GetObjectItemCaseSensitive(c, "ids_plain");
        if (plain) {
            int32_t *p = NULL, np = 0;
            ck_assert_int_eq(llmem_tokenizer_encode(tok, text, len, false, false, &p, &np, err, sizeof err),
                             LLMEM_OK);
            if (!ids_equal(plain, p, np) && bad++ < 5)
                fprintf(stderr, "%s case %d encode(plain): %s  got %s\n", kind, n, line, ids_str(p, np));
            free(p);
        }
        free(wids);
        free(ids);
        free(text);
        cJSON_Delete(c);
        n++;
    }
    free(line);
    fclose(f);
    llmem_tokenizer_destroy(tok);
    *n_cases = n;
    if (bad)
        fprintf(stderr, "%s: %d mismatches over %d cases\n", kind, bad, n);
    return bad;
}

START_TEST(test_fixture_kind)
{
    int n = 0;
    int bad = run_kind(kinds[_i], &n);
    ck_assert_msg(bad == 0, "%s: %d mismatches with tokenizers", kinds[_i], bad);
    ck_assert_int_ge(n, 2000);
}
END_TEST

START_TEST(test_fixture_total)
{
    /* the committed cases total at least 10,000 strings */
    int total = 0;
    for (int k = 0; k < N_KINDS; k++) {
        char path[512];
        snprintf(path, sizeof path, FIX "%s/cases.jsonl", test_source_dir(), kinds[k]);
        FILE *f = fopen(path, "rb");
        ck_assert_ptr_nonnull(f);
        int c;
        while ((c = fgetc(f)) != EOF)
            total += c == '\n';
        fclose(f);
    }
    ck_assert_int_ge(total, 10000);
}
END_TEST

/* id of a token string according to the fixture's own JSON */
static int json_added_id(const char *kind, const char *content)
{
    char path[512];
    snprintf(path, sizeof path, FIX "%s/tokenizer.json", test_source_dir(), kind);
    char *s = fx_read_file(path, NULL);
    cJSON *root = cJSON_Parse(s);
    free(s);
    int id = -1;
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) {
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring, content))
            id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
    }
    cJSON_Delete(root);
    return id;
}

START_TEST(test_accessors)
{
    char err[256], path[1024];
    llmem_tokenizer *tok = NULL;
    snprintf(path, sizeof path, FIX "llama3/tokenizer.json", test_source_dir());
    ck_assert_int_eq(llmem_tokenizer_load(path, &tok, err, sizeof err), LLMEM_OK);
    int bos = json_added_id("llama3", "<|begin_of_text|>"), eot = json_added_id("llama3", "<|eot_id|>");
    ck_assert_int_ge(bos, 0);
    ck_assert_int_eq(llmem_tokenizer_bos(tok), bos);
    ck_assert_int_eq(llmem_tokenizer_eos(tok), eot);
    ck_assert(llmem_tokenizer_is_special(tok, bos));
    ck_assert(llmem_tokenizer_is_eog(tok, eot));
    ck_assert(!llmem_tokenizer_is_eog(tok, bos));
    ck_assert_str_eq(llmem_tokenizer_piece(tok, eot), "<|eot_id|>");
    ck_assert_int_eq(llmem_tokenizer_token_id(tok, "<|eot_id|>"), eot);
    ck_assert_int_eq(llmem_tokenizer_token_id(tok, "no such piece"), -1);
    ck_assert_ptr_null(llmem_tokenizer_piece(tok, -1));
    ck_assert_ptr_null(llmem_tokenizer_piece(tok, llmem_tokenizer_n_vocab(tok)));
    ck_assert_int_eq(llmem_tokenizer_n_vocab(tok), 1001);
    ck_assert_ptr_null(llmem_tokenizer_chat_template(tok));
    ck_assert_str_eq(llmem_tokenizer_bos_str(tok), "<|begin_of_text|>");
    llmem_tokenizer_destroy(tok);

    snprintf(path, sizeof path, FIX "qwen2", test_source_dir());

    ck_assert_int_eq(llmem_tokenizer_load(path, &tok, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_tokenizer_bos(tok), -1);
    ck_assert_int_eq(llmem_tokenizer_eos(tok), json_added_id("qwen2", "<|im_end|>"));
    ck_assert(llmem_tokenizer_is_eog(tok, json_added_id("qwen2", "<|endoftext|>")));
    ck_assert(!llmem_tokenizer_is_special(tok, json_added_id("qwen2", "<tool_call>")));
    llmem_tokenizer_destroy(tok);

    /* the fixture model folder: 256 ids as its config.json says, a chat template */
    snprintf(path, sizeof path, "%s/tests/fixtures/llama", test_source_dir());
    ck_assert_int_eq(llmem_tokenizer_load(path, &tok, err, sizeof err),
                     LLMEM_OK);
    ck_assert_int_eq(llmem_tokenizer_n_vocab(tok), 256);
    ck_assert_int_eq(llmem_tokenizer_bos(tok), 1);
    ck_assert_int_eq(llmem_tokenizer_eos(tok), 2);
    ck_assert_ptr_nonnull(llmem_tokenizer_chat_template(tok));
    llmem_tokenizer_destroy(tok);
}
END_TEST

START_TEST(test_stream_split_characters)
{
    char err[256], path[1024];
    llmem_tokenizer *tok = NULL;
    snprintf(path, sizeof path, FIX "gpt2", test_source_dir());
    ck_assert_int_eq(llmem_tokenizer_load(path, &tok, err, sizeof err), LLMEM_OK);
    /* "😀" is 4 bytes; the small vocabulary has no merge for it, so it is
     * byte tokens whose first pushes must emit nothing */
    const char *s = "a\xF0\x9F\x98\x80";
    int32_t *ids = NULL, n = 0;
    ck_assert_int_eq(llmem_tokenizer_encode(tok, s, strlen(s), false, true, &ids, &n, err, sizeof err), LLMEM_OK);
    ck_assert_int_ge(n, 3);
    llmem_detok *d = NULL;
    ck_assert_int_eq(llmem_detok_create(tok, true, &d), LLMEM_OK);
    char out[64];
    size_t k, total = 0;
    ck_assert_int_eq(llmem_detok_push(d, ids[0], out, sizeof out, &k), LLMEM_OK);
    ck_assert_int_eq(k, 1);
    ck_assert_int_eq(out[0], 'a');
    for (int32_t i = 1; i + 1 < n; i++) {
        ck_assert_int_eq(llmem_detok_push(d, ids[i], out, sizeof out, &k), LLMEM_OK);
        total += k;
    }
    ck_assert_int_eq(total, 0);
    /* too small a buffer: NO_SPACE, the needed size, nothing consumed */
    ck_assert_int_eq(llmem_detok_push(d, ids[n - 1], out, 2, &k), LLMEM_E_NO_SPACE);
    ck_assert_int_eq(k, 4);
    ck_assert_int_eq(llmem_detok_push(d, ids[n - 1], out, sizeof out, &k), LLMEM_OK);
    ck_assert_int_eq(k, 4);
    ck_assert(!memcmp(out, "\xF0\x9F\x98\x80", 4));
    /* a dangling lead byte becomes U+FFFD at flush */
    int32_t lead = ids[1];
    ck_assert_int_eq(llmem_detok_push(d, lead, out, sizeof out, &k), LLMEM_OK);
    ck_assert_int_eq(k, 0);
    ck_assert_int_eq(llmem_detok_flush(d, out, sizeof out, &k), LLMEM_OK);
    ck_assert_int_eq(k, 3);
    ck_assert(!memcmp(out, "\xEF\xBF\xBD", 3));
    ck_assert_int_eq(llmem_detok_push(d, -1, out, sizeof out, &k), LLMEM_E_INVALID);
    llmem_detok_destroy(d);
    llmem_detok_destroy(NULL);
    free(ids);
    llmem_tokenizer_destroy(tok);
}
END_TEST

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(s, f);
    fclose(f);
}

/* Loading `path` (json written there first, unless NULL) must fail with
 * `want`, leave no tokenizer and say each of why, also (may be NULL). */
static void expect_refused(const char *path, const char *json, llmem_status want, const char *why,
                           const char *also, size_t i)
{
    char err[256] = "";
    if (json)
        write_file(path, json);
    llmem_tokenizer *tok = (llmem_tokenizer *)1;
    ck_assert_msg(llmem_tokenizer_load(path, &tok, err, sizeof err) == want,
                  "case %zu: %s (want %s)", i, err, llmem_status_str(want));
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(err, why) && (!also || strstr(err, also)), "case %zu: %s", i, err);
}

/* The tokenizer json (written to path) must decode ids[0, n) to want, and
 * so must its streaming detokenizer fed one id at a time. */
static void expect_decode(const char *path, const char *json, const int32_t *ids, int32_t n,
                          const char *want, size_t i)
{
    char err[256] = "";
    write_file(path, json);
    llmem_tokenizer *tok = NULL;
    ck_assert_msg(llmem_tokenizer_load(path, &tok, err, sizeof err) == LLMEM_OK, "%s", err);
    char *text = NULL;
    size_t len = 0, slen = 0;
    ck_assert_int_eq(llmem_tokenizer_decode(tok, ids, n, true, &text, &len, err, sizeof err),
                     LLMEM_OK);
    ck_assert_msg(len == strlen(want) && !memcmp(text, want, len),
                  "case %zu: decode '%s', want '%s'", i, text, want);
    char *stream = stream_decode(tok, ids, n, true, &slen);
    ck_assert_msg(slen == len && !memcmp(stream, want, len), "case %zu: stream '%.*s', want '%s'",
                  i, (int)slen, stream, want);
    free(stream);
    free(text);
    llmem_tokenizer_destroy(tok);
}

START_TEST(test_errors)
{
    char err[256] = "";
    llmem_tokenizer *tok = (llmem_tokenizer *)1;
    ck_assert_int_eq(llmem_tokenizer_load(NULL, &tok, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(tok);
    ck_assert_int_eq(llmem_tokenizer_load("/nonexistent/x", &tok, err, sizeof err), LLMEM_E_NOT_FOUND);
    char dir[] = "/tmp/llmem_tok_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_NOT_FOUND);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, "{not json");
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_CORRUPT);
    write_file(path, "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}");
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_UNSUPPORTED);
    ck_assert_msg(strstr(err, "Unigram"), "%s", err);
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}");
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "merge 0"), "%s", err);
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]},"
                     "\"normalizer\": {\"type\": \"BertNormalizer\"}}");
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_UNSUPPORTED);
    ck_assert_msg(strstr(err, "BertNormalizer"), "%s", err);
    /* a minimal valid one: no pre-tokenizer, no decoder (tokens joined by " ") */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}");
    ck_assert_int_eq(llmem_tokenizer_load(path, &tok, err, sizeof err), LLMEM_OK);
    int32_t *ids = NULL, n = 0;
    ck_assert_int_eq(llmem_tokenizer_encode(tok, "abba", 4, true, true, &ids, &n, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(ids[0], 2);
    ck_assert_int_eq(ids[1], 1);
    ck_assert_int_eq(ids[2], 0);
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(llmem_tokenizer_decode(tok, ids, n, true, &text, &len, err, sizeof err), LLMEM_OK);
    ck_assert_str_eq(text, "ab b a");
    free(text);
    free(ids);
    int32_t badid = 3;
    ck_assert_int_eq(llmem_tokenizer_decode(tok, &badid, 1, true, &text, &len, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(text);
    ck_assert_int_eq(llmem_tokenizer_encode(tok, NULL, 3, true, true, &ids, &n, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_tokenizer_encode(tok, NULL, 0, true, true, &ids, &n, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(n, 0);
    free(ids);
    llmem_tokenizer_destroy(tok);
    llmem_tokenizer_destroy(NULL);
    /* one JSON text each (RFC 8259; serde_json and json.loads refuse the
     * rest): whitespace may follow, other bytes are damage, found by
     * fuzz_tokenizer_load; the tokenizer stays unloaded */
    static const char *const minimal =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}";
    char cpath[256], buf[512];
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    snprintf(buf, sizeof buf, "%s \n\t\r\n", minimal);
    write_file(path, buf);
    ck_assert_msg(llmem_tokenizer_load(dir, &tok, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_tokenizer_destroy(tok);
    snprintf(buf, sizeof buf, "%s}", minimal);
    write_file(path, buf);
    tok = (llmem_tokenizer *)1;
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(err, "bytes after"), "%s", err);
    write_file(path, minimal);
    write_file(cpath, "{\"add_bos_token\": true} {\"add_bos_token\": false}");
    ck_assert_int_eq(llmem_tokenizer_load(dir, &tok, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "tokenizer_config.json") && strstr(err, "bytes after"), "%s", err);
    unlink(cpath);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* A decoder chain of ByteFallback then Metaspace (prepend_scheme "first"),
 * byte fallback on, vocabulary <unk> 0, <0xE2> 1, <0x96> 2, <0x81> 3, a 4,
 * b 5, ▁ 6, a▁b 7, ▁▁ 8. Expected texts: huggingface tokenizers 0.23.3's
 * Tokenizer.decode on the same JSON (found by fuzz_tokenizer_load: the
 * stream left a "▁" spelled by byte tokens 1 2 3 alone, and decode dropped
 * only one leading space of the first string, where tokenizers drops every
 * "▁" of it). */
START_TEST(test_metaspace_after_byte_fallback)
{
    static const char *json =
        "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, "
        "\"vocab\": {\"<unk>\": 0, \"<0xE2>\": 1, \"<0x96>\": 2, \"<0x81>\": 3, \"a\": 4, \"b\": 5, "
        "\"\u2581\": 6, \"a\u2581b\": 7, \"\u2581\u2581\": 8}, \"merges\": []}, "
        "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, "
        "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"%s\", "
        "\"split\": true}]}}";
    static const struct {
        const char *scheme;
        int32_t ids[8];
        int32_t n;
        const char *want;
    } cases[] = {
        {"first", {1, 2, 3, 4, 1, 2, 3, 5}, 8, "a b"}, {"first", {4, 1, 2, 3, 5}, 5, "a b"},
        {"first", {1, 2, 3, 1, 2, 3, 4}, 7, "a"},       {"first", {6, 4, 1, 2, 3, 5}, 6, "a b"},
        {"first", {7, 4}, 2, "aba"},                    {"first", {8, 4}, 2, "a"},
        {"first", {4, 8, 4}, 3, "a  a"},                {"always", {1, 2, 3, 4}, 4, "a"},
        {"never", {7, 4}, 2, "a ba"},                   {"never", {8, 4}, 2, "  a"},
        {"never", {1, 2, 3, 4}, 4, " a"},
    };
    char dir[] = "/tmp/llmem_tok_XXXXXX", path[256], buf[1024];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(buf, sizeof buf, json, cases[i].scheme);
        expect_decode(path, buf, cases[i].ids, cases[i].n, cases[i].want, i);
    }
    unlink(path);
    rmdir(dir);
}
END_TEST

/* What the loader used to take (found by fuzz_tokenizer_load): bytes that
 * are not UTF-8 (serde_json refuses them; decode would hand them out), a
 * post-processor id with no token behind it (encode would emit it and
 * decode refuse it), a fractional id, and an id so far past the tokens
 * listed that the id-indexed tables would take gigabytes. Each fails with
 * a message and no tokenizer. */
START_TEST(test_damaged_tokenizer_json)
{
    static const char *const bad[] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\xff\": 0, \"b\": 1}, \"merges\": []}}",
        ("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []}, "
         "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
         "{\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": "
         "{\"ids\": [1]}}}}"),
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0.5}, \"merges\": []}}",
        /* ids past 2 x 3 listed + 1024 (one of 2^30 used to cost gigabytes) */
        ("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}, "
         "\"added_tokens\": [{\"id\": 1030, \"content\": \"<x>\"}]}"),
    };
    static const char *const why[] = {"not UTF-8", "'<s>' is not a token", "no valid id",
                                      "far past the 3 tokens"};
    static const llmem_status want[] = {LLMEM_E_CORRUPT, LLMEM_E_CORRUPT, LLMEM_E_CORRUPT,
                                        LLMEM_E_UNSUPPORTED};
    char dir[] = "/tmp/llmem_tok_XXXXXX", path[256], err[256] = "";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused(path, bad[i], want[i], why[i], NULL, i);
    /* the bound itself: 2 x 3 + 1024 - 1 is still an id (in the vocabulary:
     * an added token not in it gets the next id, test_tokenizer_ids.c) */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, "
                     "\"<x>\": 1029}, \"merges\": []}}");
    llmem_tokenizer *tok = NULL;
    ck_assert_msg(llmem_tokenizer_load(path, &tok, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(llmem_tokenizer_n_vocab(tok), 1030);
    llmem_tokenizer_destroy(tok);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* What loaded without a word before: a vocabulary that names a token twice
 * ({"a": 0, "b": 1, "a": 2}: Hugging Face tokenizers 0.23.3 keeps the last,
 * leaving id 0 without a token, cJSON's lookups the first), a field given
 * twice (tokenizers refuses "content" twice in an added token, takes the
 * last "model"), and strings holding U+0000 (tokenizers reads
 * {"a": 0, "a\u0000": 1} as two tokens; cJSON's C strings made both "a").
 * llmem refuses each with LLMEM_E_CORRUPT and says why, in tokenizer.json
 * and in tokenizer_config.json (a chat template cut at a NUL). */
START_TEST(test_nul_and_duplicate_names)
{
    static const char *const bad[] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"a\": 2}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"a\": 0}, \"merges\": []}}",
        ("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": "
         "[{\"id\": 1, \"content\": \"x\", \"content\": \"y\", \"special\": true}]}"),
        ("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": {\"b\": 0}, \"merges\": []}}"),
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\\u0000\": 1}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"\\u0000\": 1}, \"merges\": []}}",
        ("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": "
         "[{\"id\": 1, \"content\": \"<x\\u0000>\", \"special\": true}]}"),
    };
    static const char *const why[] = {"key 'a' appears twice", "key 'a' appears twice",
                                      "key 'content' appears twice", "key 'model' appears twice",
                                      "holds \\u0000 (at byte 46)", "holds \\u0000 (at byte 45)",
                                      "holds \\u0000"};
    char dir[] = "/tmp/llmem_tok_XXXXXX", path[256], cpath[256], err[256] = "";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused(path, bad[i], LLMEM_E_CORRUPT, "tokenizer.json", why[i], i);
    /* an escaped backslash before "u0000" is no NUL: the token is the 7
     * characters a\u0000 (as tokenizers reads it), distinct from "a" */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\\\\u0000\": 1}, "
                     "\"merges\": []}}");
    llmem_tokenizer *tok = NULL;
    ck_assert_msg(llmem_tokenizer_load(dir, &tok, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(llmem_tokenizer_token_id(tok, "a\\u0000"), 1);
    ck_assert_int_eq(llmem_tokenizer_token_id(tok, "a"), 0);
    llmem_tokenizer_destroy(tok);
    static const char *const bad_cfg[] = {
        "{\"chat_template\": \"{{ messages }}\\u0000{{ x }}\"}",
        "{\"add_bos_token\": true, \"add_bos_token\": false}",
    };
    for (size_t i = 0; i < sizeof bad_cfg / sizeof bad_cfg[0]; i++) {
        write_file(cpath, bad_cfg[i]);
        expect_refused(dir, NULL, LLMEM_E_CORRUPT, "tokenizer_config.json",
                       i ? "key 'add_bos_token' appears twice" : "holds \\u0000", i);
    }
    unlink(cpath);
    /* control characters written raw in a string (serde_json and json.loads
     * refuse them; cJSON kept them, and a raw NUL cut "a<NUL>b" to "a", read
     * then as "a" twice) */
    static const char raw[][80] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\0b\": 1}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\001b\": 1}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \f\"merges\": []}}",
    };
    static const char *const raw_why[] = {"control character 0x00 written raw (at byte 46",
                                          "control character 0x01 written raw (at byte 46",
                                          "control character 0x0C written raw (at byte 45"};
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        size_t n = 0;
        while (raw[i][n] != '}' || raw[i][n + 1] != '}' || raw[i][n + 2] != '\0')
            n++; /* the text ends with "}}"; raw[0] holds a NUL before */
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(raw[i], 1, n + 2, f), n + 2);
        fclose(f);
        expect_refused(path, NULL, LLMEM_E_CORRUPT, "tokenizer.json", raw_why[i], i);
    }
    /* chat_template.jinja: transformers reads UTF-8 text; a NUL would cut
     * llmem's copy of the template */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}");
    char jpath[256];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    static const char jinja[][16] = {"{{ x }}\0{{ y }}", "{{ x }}\xff{{ y }}"};
    static const char *const jinja_why[] = {"holds a NUL byte (byte 7)", "not UTF-8 (byte 7)"};
    for (size_t i = 0; i < 2; i++) {
        FILE *f = fopen(jpath, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(jinja[i], 1, 15, f), 15);
        fclose(f);
        expect_refused(dir, NULL, LLMEM_E_CORRUPT, "chat_template.jinja", jinja_why[i], i);
    }
    unlink(jpath);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* Decoder chains on which the stream used to part from decode (found by
 * running random chains of ByteLevel, ByteFallback, Fuse, Replace,
 * Metaspace and Strip on a 22-token vocabulary through both, with
 * tokenizers as the judge): a byte-token run that ends ill-formed (all its
 * bytes become U+FFFD in decode, also in the Llama 2 chain of case 0, where
 * the stream had handed out the run's first, well-formed characters), Strip
 * on each token or at the end of the text, Replace matching across tokens
 * after Fuse, ByteLevel or ByteFallback after the join; and decode made
 * an ill-formed run one string of U+FFFDs where tokenizers makes one
 * string per byte (case 10, seen by a later Replace). Expected texts:
 * tokenizers 0.23.3's Tokenizer.decode on the same JSON; decode and the
 * stream (pushed token by token, then flushed) must both give them. */
START_TEST(test_stream_decoder_chains)
{
    static const char *const pieces =
        "\"a\": 0, \"b\": 1, \" \": 2, \"\\u2581\": 3, \"\\u2581a\": 4, \"a\\u2581\": 5, "
        "\"\\u0120\": 6, \"\\u0120a\": 7, \"<0xE2>\": 8, \"<0x96>\": 9, \"<0x81>\": 10, "
        "\"<0x20>\": 11, \"<0x61>\": 12, \"<0xFF>\": 13, \"\\u00e9\": 14, \"ab\": 15, \"  \": 16, "
        "\"x y\": 17, \"\\u2581\\u2581\": 18, \"\\u00c3\": 19, \"\\u00a9\": 20, \"c\": 21";
    /* decoder stages, as tokenizers serializes them */
#define REPLACE(p, c) "{\"type\": \"Replace\", \"pattern\": {\"String\": \"" p "\"}, \"content\": \"" c "\"}"
#define METASPACE(s) \
    "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"" s "\", \"split\": true}"
#define STRIP(c, a, b) "{\"type\": \"Strip\", \"content\": \"" c "\", \"start\": " #a ", \"stop\": " #b "}"
#define BF "{\"type\": \"ByteFallback\"}"
#define FUSE "{\"type\": \"Fuse\"}"
#define BYTELEVEL \
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}"
    static const char *const chains[] = {
        /* 0: Llama 2's */ REPLACE("\\u2581", " ") ", " BF ", " FUSE ", " STRIP(" ", 1, 0),
        /* 1 */ REPLACE(" ", "X") ", " BF,
        /* 2 */ STRIP(" ", 2, 0),
        /* 3 */ STRIP("\\u2581", 0, 2) ", " FUSE ", " BYTELEVEL,
        /* 4 */ REPLACE("\\u2581", "X") ", " METASPACE("first") ", " FUSE ", " REPLACE("ab", "aa"),
        /* 5 */ METASPACE("never") ", " METASPACE("never") ", " FUSE ", " BF,
        /* 6 */ STRIP(" ", 1, 1) ", " FUSE ", " METASPACE("first") ", " REPLACE("\\u2581\\u2581", " "),
        /* 7 */ METASPACE("never") ", " BYTELEVEL ", " BF ", " REPLACE("a", "X"),
        /* 8 */ FUSE ", " STRIP(" ", 2, 2),
        /* 9 */ BF ", " METASPACE("first") ", " STRIP(" ", 0, 1),
        /* 10: one U+FFFD string per byte */ BF ", " REPLACE("\\ufffd\\ufffd", "X"),
    };
#undef REPLACE
#undef METASPACE
#undef STRIP
#undef BF
#undef FUSE
#undef BYTELEVEL
    static const struct {
        int chain;
        int32_t ids[8];
        int32_t n;
        const char *want;
    } cases[] = {
        {0, {11, 9, 20, 10, 2}, 5, "\xef\xbf\xbd\xef\xbf\xbd\xc2\xa9\xef\xbf\xbd "},
        {0, {8, 9, 10, 4, 8, 12, 5}, 7, "\xe2\x96\x81 a\xef\xbf\xbd\xef\xbf\xbd""a "},
        {0, {3, 8, 9, 10, 13}, 5, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {1, {11, 9, 20, 10, 2}, 5, "\xef\xbf\xbd\xef\xbf\xbd\xc2\xa9\xef\xbf\xbdX"},
        {2, {20, 17, 2, 14, 18}, 5, "\xc2\xa9x y\xc3\xa9\xe2\x96\x81\xe2\x96\x81"},
        {2, {16, 2, 0}, 3, "a"},
        {3, {5}, 1, "a"},
        {3, {4, 19, 5}, 3, "\xe2\x96\x81""a\xc3\x83""a"},
        {4, {4, 1}, 2, "Xaa"},
        {4, {0, 1, 15, 0}, 4, "aaaaa"},
        {5, {7, 16, 17, 8, 9}, 5, "\xc4\xa0""a  x y<0xE2><0x96>"},
        {5, {12}, 1, "a"},
        {6, {1, 10, 16, 14, 3, 9}, 6, "b<0x81>\xc3\xa9<0x96>"},
        {6, {16, 1, 16}, 3, "b"},
        {7, {20, 12, 18, 12}, 4, "\xef\xbf\xbd<0x61>  <0x61>"},
        {8, {2, 16, 0, 16, 2, 2}, 6, " a  "},
        {8, {2, 2, 16}, 3, ""},
        {9, {4, 8, 9, 10, 3, 12, 3}, 7, "aa"},
        {9, {8, 9, 10, 12}, 4, "a"},
        {10, {8, 12, 0}, 3, "\xef\xbf\xbd\xef\xbf\xbd""a"},
        {10, {8, 12, 13, 0}, 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd""a"},
    };
    char dir[] = "/tmp/llmem_tok_XXXXXX", path[256], buf[2048];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                 "\"vocab\": {%s}, \"merges\": []}, \"decoder\": {\"type\": \"Sequence\", "
                 "\"decoders\": [%s]}}", pieces, chains[cases[i].chain]);
        expect_decode(path, buf, cases[i].ids, cases[i].n, cases[i].want, i);
    }
    unlink(path);
    rmdir(dir);
}
END_TEST

/* Decoder settings tokenizers 0.23.3 refuses to load (Strip's content must
 * be one character and its start and stop whole numbers >= 0; Metaspace's
 * replacement one character and its prepend_scheme one of three) are
 * LLMEM_E_CORRUPT; a Replace with an empty pattern, which tokenizers reads
 * as "put content between all characters", is LLMEM_E_UNSUPPORTED (llmem
 * used to leave such text unchanged). */
START_TEST(test_decoder_settings)
{
    static const struct {
        const char *stage;
        llmem_status want;
        const char *why;
    } bad[] = {
        {"\"decoder\": {\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": 0}",
         LLMEM_E_CORRUPT, "Strip needs one character"},
        {"\"decoder\": {\"type\": \"Strip\", \"content\": \"\", \"start\": 1, \"stop\": 0}",
         LLMEM_E_CORRUPT, "Strip needs one character"},
        {"\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}",
         LLMEM_E_CORRUPT, "Strip needs one character"},
        {"\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1.5, \"stop\": 0}",
         LLMEM_E_CORRUPT, "Strip needs one character"},
        {"\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1}", LLMEM_E_CORRUPT,
         "Strip needs one character"},
        {"\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"ab\", \"prepend_scheme\": "
         "\"always\", \"split\": true}", LLMEM_E_CORRUPT, "Metaspace needs one character"},
        {"\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": "
         "\"sometimes\", \"split\": true}", LLMEM_E_CORRUPT, "prepend_scheme"},
        {"\"decoder\": {\"type\": \"Replace\", \"pattern\": {\"String\": \"\"}, \"content\": \"x\"}",
         LLMEM_E_UNSUPPORTED, "empty pattern"},
        {"\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \"\"}, \"content\": \"x\"}",
         LLMEM_E_UNSUPPORTED, "empty pattern"},
    };
    char dir[] = "/tmp/llmem_tok_XXXXXX", path[256], buf[1024];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
                 "\"merges\": []}, %s}", bad[i].stage);
        expect_refused(path, buf, bad[i].want, bad[i].why, NULL, i);
    }
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_fixture_kind, 0, N_KINDS);
    tcase_add_test(tc, test_fixture_total);
    tcase_add_test(tc, test_accessors);
    tcase_add_test(tc, test_stream_split_characters);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_metaspace_after_byte_fallback);
    tcase_add_test(tc, test_damaged_tokenizer_json);
    tcase_add_test(tc, test_nul_and_duplicate_names);
    tcase_add_test(tc, test_stream_decoder_chains);
    tcase_add_test(tc, test_decoder_settings);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

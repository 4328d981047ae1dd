/* libFuzzer harness: bytes -> api_parse, the request-body parser of
 * `llmem serve` (examples/cli/serve_api.c), without sockets.
 *
 * Input: byte 0 bit 0 picks the route (1: /v1/chat/completions, 0:
 * /v1/completions), bit 1 the model's text side (1: the llama fixture's
 * tokenizer.json and chat template, 0: byte-level ids as the built-in
 * model has); the rest is the request body. The server has a context of
 * 64 tokens, so the length checks are reached.
 *
 * Contract checked: no crash, leak or undefined behaviour; every body gets
 * either 0 and a request, or 400 and an OpenAI error object
 * {"error": {"message": string, ...}} and no request. An accepted request
 * has a whole JSON object as its body (nothing but whitespace after it,
 * as every JSON parser but a lenient one demands), no U+0000 escape in
 * any string (cJSON would cut the string there, so the prompt, a message
 * or a stop string would lose its tail without a word), 1 to 64 prompt ids
 * in [0, n_vocab), prompt plus max_tokens within the context, and sampling
 * values inside the ranges serve_api.c documents.
 *
 * Seeds: tests/fuzz/corpus/fuzz_serve_api (request bodies in the shapes
 * tests/serve/test_serve.py sends, tests/fuzz/make_corpus.py). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/serve_api.h"
#include "llmem/model.h"
#include "tests/support/run.h"

#define N_CTX 64

static api_server servers[2];

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_serve_api: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

static void open_server(api_server *s, const char *dir, int32_t n_vocab)
{
    srv_text *t = NULL;
    char err[512] = "";
    if (srv_text_open(dir, n_vocab, &t, err, sizeof err) != LLMEM_OK)
        die("srv_text_open failed", err);
    *s = (api_server){.text = t, .model_name = "m", .n_ctx = N_CTX, .n_vocab = n_vocab};
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[1024], err[512] = "";
    llmem_model_config *cfg = malloc(sizeof *cfg);
    snprintf(dir, sizeof dir, "%s/models/builtin", test_source_dir());
    open_server(&servers[0], dir, 256);
    snprintf(dir, sizeof dir, "%s/tests/fixtures/llama", test_source_dir());
    if (llmem_model_config_load(dir, cfg, err, sizeof err) != LLMEM_OK)
        die("cannot read the llama fixture's config.json", err);
    open_server(&servers[1], dir, cfg->vocab_size);
    free(cfg);
    return 0;
}

/* Whether a string of body[0, n) holds the escape \u0000 (the JSON text
 * scanned here, independently of cJSON). */
static bool has_nul_escape(const char *b, size_t n)
{
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_str) {
            in_str = b[i] == '"';
            continue;
        }
        if (b[i] == '"')
            in_str = false;
        else if (b[i] == '\\' && i + 1 < n) {
            if (b[i + 1] == 'u' && i + 5 < n && !strncmp(b + i + 2, "0000", 4))
                return true;
            i++;
        }
    }
    return false;
}

static void check_accepted(const api_server *s, const api_request *r, const char *body, size_t n)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, n, &end, 0);
    if (!cJSON_IsObject(root))
        die("accepted a body that is not a JSON object", NULL);
    for (const char *p = end; p < body + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            die("accepted a body with bytes after its JSON object", NULL);
    cJSON_Delete(root);
    if (has_nul_escape(body, n))
        die("accepted a body with \\u0000 in a string (cJSON cuts the string there)", NULL);
    const eng_req *q = r->req;
    if (!q || q->n_prompt < 1 || q->n_prompt > N_CTX || q->max_tokens < 0 ||
        q->n_prompt + q->max_tokens > N_CTX)
        die("an accepted request's prompt or max_tokens is out of range", NULL);
    for (int32_t i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= s->n_vocab)
            die("a prompt id out of range", NULL);
    if (!(q->sp.temperature >= 0 && q->sp.temperature <= 2) || !(q->sp.top_p >= 0 && q->sp.top_p <= 1) ||
        !(q->sp.min_p >= 0 && q->sp.min_p <= 1) || q->sp.top_k < 0)
        die("an accepted request's sampling values are out of range", NULL);
    for (int32_t i = 0; i < q->n_stop; i++)
        if (!q->stop[i] || !q->stop[i][0])
            die("an empty stop string", NULL);
    if (r->include_usage && !r->stream)
        die("include_usage without stream", NULL);
}

static void check_error(const char *err_json)
{
    cJSON *e = err_json ? cJSON_Parse(err_json) : NULL;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "error");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "message");
    if (!cJSON_IsString(m) || !m->valuestring[0])
        die("a refusal without an OpenAI error object", err_json);
    cJSON_Delete(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    bool chat = data[0] & 1;
    const api_server *s = &servers[(data[0] >> 1) & 1];
    size_t n = size - 1;
    char *body = malloc(n ? n : 1);
    memcpy(body, data + 1, n);
    api_request r;
    char *err_json = NULL;
    int rc = api_parse(s, chat, body, n, 7, &r, &err_json);
    if (rc == 0) {
        if (err_json)
            die("an accepted request with an error object", err_json);
        check_accepted(s, &r, body, n);
        eng_req_release(NULL, r.req);
    } else {
        if (rc != 400 || r.req)
            die("a refusal that is not a 400 without a request", NULL);
        check_error(err_json);
    }
    free(err_json);
    free(body);
    return 0;
}

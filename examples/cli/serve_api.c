/* llmem serve: the OpenAI API's JSON (see serve_api.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/serve_api.h"
#include "models/hf_json.h"

#define MAX_STOP 16

char *api_error_json(const char *msg, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    char *s = NULL;
    if (e && cJSON_AddStringToObject(e, "message", msg) &&
        cJSON_AddStringToObject(e, "type", type) &&
        (param ? cJSON_AddStringToObject(e, "param", param) : cJSON_AddNullToObject(e, "param")) &&
        (code ? cJSON_AddStringToObject(e, "code", code) : cJSON_AddNullToObject(e, "code")))
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A 400 invalid_request_error about param. */
static int bad(char **err_json, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(char **err_json, const char *param, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    llmem_verrf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *err_json = api_error_json(msg, "invalid_request_error", param, code);
    return 400;
}

/* A 500 server_error "out of memory": the server's fault, not the request's
 * (the OpenAI API answers 500 to its own failures; a client may retry). */
static int oom(char **err_json)
{
    *err_json = api_error_json("out of memory", "server_error", NULL, NULL);
    return 500;
}

/* A number field: absent or null leaves *out; else it must be a number in
 * [lo, hi] (and whole when integral). */
static bool num_field(const cJSON *root, const char *key, double lo, double hi, bool integral,
                      double *out, char **err_json)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j))
        return true;
    double v = j->valuedouble;
    if (!cJSON_IsNumber(j) || !isfinite(v) || (integral && v != floor(v))) {
        bad(err_json, key, "invalid_type", "'%s' must be %s", key,
            integral ? "an integer" : "a number");
        return false;
    }
    if (v < lo || v > hi) {
        bad(err_json, key, "invalid_value", "'%s' must be in [%g, %g], got %g", key, lo, hi, v);
        return false;
    }
    *out = v;
    return true;
}

static bool bool_field(const cJSON *root, const char *key, bool *out, char **err_json)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j))
        return true;
    if (!cJSON_IsBool(j)) {
        bad(err_json, key, "invalid_type", "'%s' must be a boolean", key);
        return false;
    }
    *out = cJSON_IsTrue(j);
    return true;
}

/* The prompt of a completion: a string, an array of token ids, or an array
 * holding one of those (a batch of one). A batch of several is refused as
 * such, and an element of the ids that is not an integer as that. */
static int parse_prompt(const api_server *s, const cJSON *p, int32_t **ids, int32_t *n,
                        char **err_json)
{
    char err[512] = "";
    if (cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child))) {
        if (cJSON_GetArraySize(p) > 1)
            return bad(err_json, "prompt", "unsupported_value",
                       "batched prompts (%d in one request) are not supported; send one "
                       "request per prompt", cJSON_GetArraySize(p));
        p = p->child;
    }
    if (cJSON_IsString(p)) {
        llmem_status st = srv_text_encode(s->text, p->valuestring, strlen(p->valuestring), true,
                                          ids, n, err, sizeof err);
        if (st == LLMEM_E_NO_MEMORY)
            return oom(err_json);
        if (st != LLMEM_OK)
            return bad(err_json, "prompt", NULL, "cannot encode the prompt: %s", err);
        return 0;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return bad(err_json, "prompt", "invalid_type",
                   cJSON_IsArray(p) ? "'prompt' is empty"
                                    : "'prompt' must be a string or an array of token ids");
    int32_t cnt = cJSON_GetArraySize(p);
    int32_t *v = malloc((size_t)cnt * sizeof *v);
    if (!v)
        return oom(err_json);
    int32_t k = 0;
    for (const cJSON *j = p->child; j; j = j->next) {
        double d = j->valuedouble;
        if (!cJSON_IsNumber(j) || d != floor(d) || d < 0 || d >= s->n_vocab) {
            free(v);
            return bad(err_json, "prompt", "invalid_value",
                       "'prompt' token ids must be integers in [0, %d)", s->n_vocab);
        }
        v[k++] = (int32_t)d;
    }
    *ids = v;
    *n = k;
    return 0;
}

/* The messages of a chat: [{role, content}], content a string, null, or an
 * array of {"type": "text", "text": ...} parts (concatenated). */
static int parse_messages(const api_server *s, const cJSON *m, int32_t **ids, int32_t *n,
                          char **err_json)
{
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
        return bad(err_json, "messages", cJSON_IsArray(m) ? "invalid_value" : "invalid_type",
                   "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    int32_t cnt = cJSON_GetArraySize(m);
    srv_msg *msgs = calloc((size_t)cnt, sizeof *msgs);
    char **owned = calloc((size_t)cnt, sizeof *owned);
    int rc = msgs && owned ? 0 : oom(err_json);
    int32_t k = 0;
    for (const cJSON *j = m->child; !rc && j; j = j->next, k++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(j, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsObject(j) || !cJSON_IsString(role)) {
            rc = bad(err_json, "messages", "invalid_type",
                     "messages[%d] must be an object with a string 'role'", k);
            break;
        }
        msgs[k].role = role->valuestring;
        if (!content || cJSON_IsNull(content)) {
            msgs[k].content = NULL;
        } else if (cJSON_IsString(content)) {
            msgs[k].content = content->valuestring;
        } else if (cJSON_IsArray(content)) {
            size_t len = 0;
            for (const cJSON *part = content->child; part; part = part->next) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
                    !cJSON_IsString(text)) {
                    rc = bad(err_json, "messages", "unsupported_value",
                             "messages[%d].content: only {\"type\": \"text\", \"text\": ...} "
                             "parts are supported", k);
                    break;
                }
                len += strlen(text->valuestring);
            }
            if (rc || !(owned[k] = malloc(len + 1))) {
                rc = rc ? rc : oom(err_json);
                break;
            }
            owned[k][0] = '\0';
            for (const cJSON *part = content->child; part; part = part->next)
                strcat(owned[k], cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
            msgs[k].content = owned[k];
        } else {
            rc = bad(err_json, "messages", "invalid_type",
                     "messages[%d].content must be a string, an array of text parts or null",
                     k);
        }
    }
    if (!rc) {
        char err[512] = "";
        llmem_status st = srv_text_chat(s->text, msgs, (size_t)cnt, ids, n, err, sizeof err);
        if (st != LLMEM_OK)
            rc = st == LLMEM_E_NO_MEMORY
                     ? oom(err_json)
                     : bad(err_json, "messages", "chat_template_error", "%s", err);
    }
    for (int32_t i = 0; owned && i < cnt; i++)
        free(owned[i]);
    free(owned);
    free(msgs);
    return rc;
}

/* Rejects features llmem does not implement instead of ignoring them: a
 * value that asks for one (true, a non-empty string, array or object, a
 * number other than the neutral one) is 400 unsupported_parameter; a
 * value of the wrong type or out of the API's range is invalid_type or
 * invalid_value first, as the OpenAI API and vLLM answer. */
static int unsupported(const cJSON *root, bool chat, char **err_json)
{
    static const char *const falsy[] = {"echo", "suffix", "tools", "functions", "logit_bias",
                                        "response_format"};
    for (size_t i = 0; i < sizeof falsy / sizeof *falsy; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, falsy[i]);
        bool empty = (cJSON_IsArray(j) || cJSON_IsObject(j)) && !j->child;
        if (j && !cJSON_IsNull(j) && !cJSON_IsFalse(j) && !empty)
            return bad(err_json, falsy[i], "unsupported_parameter",
                       "'%s' is not supported by llmem serve", falsy[i]);
    }
    /* logprobs: a count of alternatives per token in completions (OpenAI
     * allows 0-5, vLLM up to its --max-logprobs), a boolean in chat with
     * the count in top_logprobs (0-20, only with logprobs true) */
    double lp = -1, top = -1, best_of = 1;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (chat && l && !cJSON_IsNull(l) && !cJSON_IsBool(l))
        return bad(err_json, "logprobs", "invalid_type", "'logprobs' must be a boolean");
    if (!chat && cJSON_IsBool(l))
        lp = cJSON_IsTrue(l) ? 1 : -1;
    else if (!chat && !num_field(root, "logprobs", 0, 20, true, &lp, err_json))
        return 400;
    if (!num_field(root, "top_logprobs", 0, 20, true, &top, err_json) ||
        !num_field(root, "best_of", 1, 20, true, &best_of, err_json))
        return 400;
    if (top >= 0 && !cJSON_IsTrue(l))
        return bad(err_json, "top_logprobs", "invalid_value",
                   "'top_logprobs' requires 'logprobs': true");
    if (cJSON_IsTrue(l) || lp >= 0)
        return bad(err_json, "logprobs", "unsupported_parameter",
                   "'logprobs' is not supported by llmem serve");
    if (best_of > 1)
        return bad(err_json, "best_of", "unsupported_parameter",
                   "'best_of' > 1 is not supported by llmem serve");
    /* vLLM's extensions that change the output (SamplingParams): only their
     * neutral value (n: that number, b: that boolean, a: an empty array,
     * -: none at all) is implemented; a value of another type is invalid */
    static const struct {
        const char *key;
        char type;
        double neutral;
    } ext[] = {
        {"repetition_penalty", 'n', 1}, {"length_penalty", 'n', 1}, {"min_tokens", 'n', 0},
        {"ignore_eos", 'b', 0}, {"use_beam_search", 'b', 0},
        {"include_stop_str_in_output", 'b', 0}, {"skip_special_tokens", 'b', 1},
        {"stop_token_ids", 'a', 0}, {"allowed_token_ids", 'a', 0}, {"bad_words", 'a', 0},
        {"prompt_logprobs", '-', 0}, {"guided_json", '-', 0}, {"guided_regex", '-', 0},
        {"guided_choice", '-', 0}, {"guided_grammar", '-', 0}, {"logits_processors", '-', 0},
    };
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, ext[i].key);
        if (!j || cJSON_IsNull(j))
            continue;
        char t = ext[i].type;
        if ((t == 'n' && !cJSON_IsNumber(j)) || (t == 'b' && !cJSON_IsBool(j)) ||
            (t == 'a' && !cJSON_IsArray(j)))
            return bad(err_json, ext[i].key, "invalid_type", "'%s' must be %s", ext[i].key,
                       t == 'n' ? "a number" : t == 'b' ? "a boolean" : "an array");
        if (t == '-' || (t == 'n' && j->valuedouble != ext[i].neutral) ||
            (t == 'b' && cJSON_IsTrue(j) != (ext[i].neutral != 0)) || (t == 'a' && j->child))
            return bad(err_json, ext[i].key, "unsupported_parameter",
                       "'%s' is not supported by llmem serve (only its default)", ext[i].key);
    }
    /* without tools, tool_choice can only be "none" or "auto" */
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tc && !cJSON_IsNull(tc) &&
        !(cJSON_IsString(tc) && (!strcmp(tc->valuestring, "none") || !strcmp(tc->valuestring, "auto"))))
        return bad(err_json, "tool_choice", "unsupported_parameter",
                   "'tool_choice' other than \"none\" or \"auto\" is not supported by llmem serve");
    /* penalties: accepted in range, but only 0 (none) is implemented */
    static const char *const pen[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++) {
        double v = 0;
        if (!num_field(root, pen[i], -2, 2, false, &v, err_json))
            return 400;
        if (v != 0)
            return bad(err_json, pen[i], "unsupported_value",
                       "'%s' other than 0 is not supported by llmem serve", pen[i]);
    }
    return 0;
}

static int parse_stop(const cJSON *root, eng_req *r, char **err_json)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsString(j) && (!cJSON_IsArray(j) || cJSON_GetArraySize(j) > MAX_STOP))
        return bad(err_json, "stop", "invalid_type",
                   "'stop' must be a string or an array of at most %d strings", MAX_STOP);
    /* a string alone or each entry of the array; an empty one would match
     * everywhere (vLLM refuses it too) */
    for (const cJSON *s = cJSON_IsString(j) ? j : j->child; s; s = s == j ? NULL : s->next) {
        if (!cJSON_IsString(s))
            return bad(err_json, "stop", "invalid_type", "'stop' entries must be strings");
        if (!*s->valuestring)
            return bad(err_json, "stop", "invalid_value", "'stop' strings must not be empty");
        if (!eng_req_add_stop(r, s->valuestring))
            return oom(err_json);
    }
    return 0;
}

int api_parse(const api_server *s, bool chat, const char *body, size_t len,
              uint64_t seed_fallback, api_request *out, char **err_json)
{
    memset(out, 0, sizeof *out);
    out->chat = chat;
    *err_json = NULL;
    /* one JSON text as Python's json reads it (the OpenAI server's): no
     * bytes after the value, no name twice in one object, and no \u0000,
     * which cJSON would cut a prompt, message or stop string at. A
     * leading UTF-8 byte order mark is skipped: json.loads of the body's
     * bytes (Starlette's Request.json, under FastAPI servers) decodes them
     * as utf-8-sig */
    cJSON *root = NULL;
    hf_json_where w;
    size_t bom = hf_json_has_bom(body, len) ? 3 : 0;
    hf_json_fault jf = hf_json_read(body + bom, len - bom, &root, &w);
    w.at += bom; /* offsets into the body as sent */
    int32_t *ids = NULL, n_ids = 0;
    int rc = 0;
    /* JSON text is UTF-8 (RFC 8259, section 8.1), and json.loads of bytes
     * that are not is an error: here too, not bytes passed on to the
     * tokenizer (cJSON copies them into strings as they come) */
    size_t utf8 = bom + srv_utf8_valid_prefix(body + bom, len - bom);
    if (utf8 < len) {
        rc = bad(err_json, NULL, "invalid_json", "the request body is not UTF-8 (byte %zu)",
                 utf8);
        goto done;
    }
    if (jf != HF_JSON_OK) {
        char why[128];
        hf_json_describe(jf, &w, why, sizeof why);
        rc = jf == HF_JSON_NO_MEMORY ? oom(err_json)
             : jf == HF_JSON_NUL ? bad(err_json, NULL, "invalid_value", "the request body: %s; "
                                       "strings holding U+0000 are not supported", why)
                                 : bad(err_json, jf == HF_JSON_DUP ? w.key : NULL, "invalid_json",
                                       "the request body: %s", why);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        rc = bad(err_json, NULL, "invalid_json", "the request body must be a JSON object");
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) {
        rc = bad(err_json, "model", "invalid_type", "'model' must be a string");
        goto done;
    }
    if (cJSON_IsString(model) && strcmp(model->valuestring, s->model_name)) {
        rc = bad(err_json, "model", "model_not_found",
                 "the model '%s' does not exist; this server serves '%s'", model->valuestring,
                 s->model_name);
        goto done;
    }
    double max_tokens = -1, temperature = 1, top_p = 1, min_p = 0, top_k = 0, n = 1, seed = -1;
    double n_ctx = s->n_ctx;
    bool stream = false, include_usage = false;
    const char *max_key = chat && cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                              ? "max_completion_tokens" : "max_tokens";
    /* ranges: the OpenAI API's; max_tokens at least 1 (vLLM: "max_tokens
     * must be at least 1"), top_k -1 as vLLM's "all tokens", like 0 */
    if (!num_field(root, max_key, 1, n_ctx, true, &max_tokens, err_json) ||
        !num_field(root, "temperature", 0, 2, false, &temperature, err_json) ||
        !num_field(root, "top_p", 0, 1, false, &top_p, err_json) ||
        !num_field(root, "min_p", 0, 1, false, &min_p, err_json) ||
        !num_field(root, "top_k", -1, INT32_MAX, true, &top_k, err_json) ||
        !num_field(root, "n", 1, 128, true, &n, err_json) ||
        !num_field(root, "seed", -9.2e18, 9.2e18, true, &seed, err_json) ||
        !bool_field(root, "stream", &stream, err_json)) {
        rc = 400;
        goto done;
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so) &&
        (!cJSON_IsObject(so) || !bool_field(so, "include_usage", &include_usage, err_json))) {
        rc = *err_json ? 400 : bad(err_json, "stream_options", "invalid_type",
                                   "'stream_options' must be an object");
        goto done;
    }
    if (so && !cJSON_IsNull(so) && !stream) { /* as the OpenAI API and vLLM answer */
        rc = bad(err_json, "stream_options", "invalid_value",
                 "'stream_options' is only allowed when 'stream' is true");
        goto done;
    }
    if (n != 1) {
        rc = bad(err_json, "n", "unsupported_value", "only n=1 is supported");
        goto done;
    }
    if ((rc = unsupported(root, chat, err_json)))
        goto done;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, chat ? "messages" : "prompt");
    if (!p) {
        rc = bad(err_json, chat ? "messages" : "prompt", "missing_required_parameter",
                 "'%s' is required", chat ? "messages" : "prompt");
        goto done;
    }
    rc = chat ? parse_messages(s, p, &ids, &n_ids, err_json)
              : parse_prompt(s, p, &ids, &n_ids, err_json);
    if (rc)
        goto done;
    if (n_ids == 0) {
        rc = bad(err_json, "prompt", "invalid_value", "the prompt is empty (no tokens)");
        goto done;
    }
    /* OpenAI's defaults: 16 for completions, the rest of the context for
     * chat; a prompt that leaves no room for one token is refused */
    if (max_tokens < 0)
        max_tokens = chat ? (n_ids < s->n_ctx ? s->n_ctx - n_ids : 1) : 16;
    if ((double)n_ids + max_tokens > n_ctx) {
        rc = bad(err_json, chat ? "messages" : "prompt", "context_length_exceeded",
                 "this model's maximum context length is %d tokens, but %.0f were requested "
                 "(%d in the prompt, %.0f for the completion)", s->n_ctx, n_ids + max_tokens,
                 n_ids, max_tokens);
        goto done;
    }
    eng_sampling sp = {.temperature = temperature, .top_p = top_p, .min_p = min_p,
                       .top_k = top_k > 0 ? (int32_t)top_k : 0,
                       .seed = seed >= 0 || seed < -0.5 ? (uint64_t)(int64_t)seed
                                                        : seed_fallback};
    if (!(out->req = eng_req_create(ids, n_ids, (int32_t)max_tokens, &sp))) {
        rc = oom(err_json);
        goto done;
    }
    ids = NULL; /* the request owns them */
    if ((rc = parse_stop(root, out->req, err_json)))
        goto done;
    out->stream = stream;
    out->include_usage = stream && include_usage;
done:
    if (rc && out->req) {
        eng_req_release(NULL, out->req); /* never submitted */
        out->req = NULL;
    }
    free(ids);
    cJSON_Delete(root);
    return rc;
}

const char *api_finish_reason(eng_finish f)
{
    return f == ENG_LENGTH ? "length" : f == ENG_STOP ? "stop" : NULL;
}

static cJSON *envelope(const api_request *r, const char *id, long created, const char *model,
                       bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", r->chat ? (chunk ? "chat.completion.chunk"
                                                          : "chat.completion")
                                                 : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "system_fingerprint", "llmem");
    return o;
}

static void add_usage(cJSON *o, int32_t n_prompt, int32_t n_completion)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)n_prompt + n_completion);
}

/* A string of n bytes (not NUL-terminated) as a JSON string. */
static cJSON *bytes_string(const char *s, size_t n)
{
    char *z = malloc(n + 1);
    if (!z)
        return NULL;
    memcpy(z, s, n);
    z[n] = '\0';
    cJSON *j = cJSON_CreateString(z);
    free(z);
    return j;
}

static char *print(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

/* o's "choices": [{"index": 0}]; returns that choice, or NULL when out of
 * memory. */
static cJSON *add_choice(cJSON *o)
{
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    if (!cJSON_AddItemToArray(choices, c)) {
        cJSON_Delete(c);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", 0);
    return c;
}

char *api_response_json(const api_request *r, const char *id, long created, const char *model,
                        const char *text, size_t n_text, eng_finish f, int32_t n_prompt,
                        int32_t n_completion)
{
    cJSON *o = envelope(r, id, created, model, false);
    cJSON *c = add_choice(o);
    if (!c) {
        cJSON_Delete(o);
        return NULL;
    }
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddItemToObject(m, "content", bytes_string(text, n_text));
    } else {
        cJSON_AddItemToObject(c, "text", bytes_string(text, n_text));
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", api_finish_reason(f));
    add_usage(o, n_prompt, n_completion);
    return print(o);
}

static char *sse(cJSON *o)
{
    char *j = print(o), *s = NULL;
    if (j && (s = malloc(strlen(j) + 9)))
        sprintf(s, "data: %s\n\n", j);
    free(j);
    return s;
}

char *api_chunk_sse(const api_request *r, const char *id, long created, const char *model,
                    const char *text, size_t n_text, eng_finish f, bool first)
{
    cJSON *o = envelope(r, id, created, model, true);
    cJSON *c = add_choice(o);
    if (!c) {
        cJSON_Delete(o);
        return NULL;
    }
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (first || n_text)
            cJSON_AddItemToObject(d, "content", bytes_string(text, n_text));
    } else {
        cJSON_AddItemToObject(c, "text", bytes_string(text, n_text));
    }
    cJSON_AddNullToObject(c, "logprobs");
    const char *fr = api_finish_reason(f);
    if (fr)
        cJSON_AddStringToObject(c, "finish_reason", fr);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return sse(o);
}

char *api_usage_sse(const api_request *r, const char *id, long created, const char *model,
                    int32_t n_prompt, int32_t n_completion)
{
    cJSON *o = envelope(r, id, created, model, true);
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, n_prompt, n_completion);
    return sse(o);
}

char *api_models_json(const char *model, long created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(d, m);
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "llmem");
    return print(o);
}

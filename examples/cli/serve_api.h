/* llmem serve: the OpenAI API's JSON -- parsing completion and chat
 * completion requests into engine requests, and writing responses, stream
 * chunks and errors.
 *
 * Reference: the OpenAI API reference, "Completions" (legacy) and "Chat
 * Completions" (request body, response and chunk objects, error object
 * {"error": {"message", "type", "param", "code"}}). */
#ifndef LLMEM_CLI_SERVE_API_H
#define LLMEM_CLI_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "examples/cli/engine.h"
#include "examples/cli/serve_text.h"

/* What the parser needs to know of the server. */
typedef struct api_server {
    const srv_text *text;
    const char *model_name;
    int32_t n_ctx, n_vocab;
} api_server;

/* A parsed request. */
typedef struct api_request {
    bool chat, stream, include_usage;
    eng_req *req; /* not yet submitted; released by the caller */
} api_request;

/* Parses a request body (`len` bytes, need not be NUL-terminated; chat:
 * /v1/chat/completions, else /v1/completions) into *out. The body must be
 * one JSON object (RFC 8259: only whitespace after it) with no name twice
 * in one object, and no string in it may hold U+0000 (cJSON's strings end
 * there). Returns 0, or the HTTP
 * status of the error with *err_json a malloc'd OpenAI error object (NULL
 * when even that found no memory) and out->req NULL: 400
 * (invalid_request_error) for a bad request, 500 (server_error, "out of
 * memory") when parsing, encoding or rendering it ran out of memory.
 * seed_fallback seeds requests without "seed". */
int api_parse(const api_server *s, bool chat, const char *body, size_t len,
              uint64_t seed_fallback, api_request *out, char **err_json);

/* {"error": {"message", "type", "param", "code"}}; param and code may be
 * NULL (JSON null). malloc'd, NULL when out of memory. */
char *api_error_json(const char *msg, const char *type, const char *param, const char *code);

/* "length", "stop", or NULL while running. */
const char *api_finish_reason(eng_finish f);

/* The whole response of a finished request: text is the completion. */
char *api_response_json(const api_request *r, const char *id, long created, const char *model,
                        const char *text, size_t n_text, eng_finish f, int32_t n_prompt,
                        int32_t n_completion);

/* One SSE event "data: {chunk}\n\n" carrying text (n_text bytes, may be
 * 0), the finish reason (ENG_RUNNING: null) and, for chat, role when
 * first; or the usage chunk (usage: choices [] and the token counts). */
char *api_chunk_sse(const api_request *r, const char *id, long created, const char *model,
                    const char *text, size_t n_text, eng_finish f, bool first);
char *api_usage_sse(const api_request *r, const char *id, long created, const char *model,
                    int32_t n_prompt, int32_t n_completion);

/* {"object": "list", "data": [{"id": model, "object": "model", ...}]} */
char *api_models_json(const char *model, long created);

#endif

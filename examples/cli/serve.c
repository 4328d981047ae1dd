/* llmem serve: an OpenAI-compatible HTTP server (docs/serve.md).
 *
 * libmicrohttpd runs one thread per connection; every request is parsed
 * there (serve_api.c), queued on the engine (engine.c), which batches all
 * running requests on one thread, and answered as one JSON object or as a
 * stream of server-sent events ("data: {chunk}\n\n" ... "data: [DONE]\n\n").
 * A connection thread waiting for tokens polls its socket, so a client that
 * goes away is noticed within 100 ms and its sequence freed.
 *
 * References: the OpenAI API reference (Completions, Chat Completions,
 * Models; streaming); the WHATWG HTML standard, "Server-sent events";
 * the libmicrohttpd manual (thread-per-connection mode, callback
 * responses). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "examples/cli/cli.h"
#include "examples/cli/common.h"
#include "examples/cli/engine.h"
#include "examples/cli/serve_api.h"
#include "examples/cli/serve_text.h"

#define MAX_BODY (16u << 20) /* bytes of a request body */
#define POLL_MS 100

typedef struct server {
    engine *eng;
    api_server api;
    const char *api_key;
    char model_name[256];
    long started;
    pthread_mutex_t id_lock;
    uint64_t next_id;
} server;

/* One HTTP request: its body as it arrives. */
typedef struct conn {
    char *body;
    size_t len, cap;
    bool too_big;
} conn;

/* A streamed response: owned by the MHD response (freed by stream_free). */
typedef struct stream {
    server *s;
    api_request ar;
    char id[48];
    long created;
    int fd;
    size_t have;  /* text bytes sent */
    char *pend;   /* SSE bytes not yet handed to MHD */
    size_t pend_len, pend_off;
    bool first, done;
    double t0;
} stream;

static long now_s(void)
{
    return (long)time(NULL);
}

static uint64_t new_id(server *s)
{
    pthread_mutex_lock(&s->id_lock);
    uint64_t id = ++s->next_id;
    pthread_mutex_unlock(&s->id_lock);
    return id;
}

/* True when the peer of fd closed its side (read EOF) or the socket failed. */
static bool client_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
        return true;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Queues a JSON body (taken: freed by MHD) with the status. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    struct MHD_Response *r;
    if (json) {
        size_t n = strlen(json);
        r = MHD_create_response_from_buffer(n, json, MHD_RESPMEM_MUST_FREE);
    } else {
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *msg,
                                   const char *type, const char *param, const char *code)
{
    return reply(c, status, api_error_json(msg, type, param, code));
}

/* One line per request with -v (failures of the server's own always). */
static void log_line(const char *method, const char *url, unsigned status, int32_t n_prompt,
                     int32_t n_completion, double t0)
{
    cli_logf(status >= 500 ? CLI_LOG_WARN : CLI_LOG_INFO, "serve",
             "%s %s %u, prompt %d, completion %d tokens, %.3f s", method, url, status, n_prompt,
             n_completion, cli_now() - t0);
}

/* ---- streaming ------------------------------------------------------------------------------- */

static bool pend_add(stream *st, char *ev)
{
    if (!ev)
        return false;
    size_t n = strlen(ev), left = st->pend_len - st->pend_off;
    char *p = malloc(left + n + 1);
    if (!p) {
        free(ev);
        return false;
    }
    if (left)
        memcpy(p, st->pend + st->pend_off, left);
    memcpy(p + left, ev, n + 1);
    free(ev);
    free(st->pend);
    st->pend = p;
    st->pend_len = left + n;
    st->pend_off = 0;
    return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *st = cls;
    server *s = st->s;
    (void)pos;
    for (;;) {
        if (st->pend_off < st->pend_len) {
            size_t n = st->pend_len - st->pend_off;
            n = n < max ? n : max;
            memcpy(buf, st->pend + st->pend_off, n);
            st->pend_off += n;
            return (ssize_t)n;
        }
        if (st->done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->first && st->ar.chat) {
            st->first = false;
            if (!pend_add(st, api_chunk_sse(&st->ar, st->id, st->created, s->model_name, "", 0,
                                            ENG_RUNNING, true)))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        char *delta, err[256];
        size_t n_delta;
        int32_t n_completion;
        eng_finish f = eng_poll(s->eng, st->ar.req, st->have, POLL_MS, &delta, &n_delta,
                                &n_completion, err, sizeof err);
        bool ok = true;
        if (delta) {
            st->have += n_delta;
            ok = pend_add(st, api_chunk_sse(&st->ar, st->id, st->created, s->model_name, delta,
                                            n_delta, ENG_RUNNING, st->first));
            st->first = false;
            free(delta);
        }
        if (f == ENG_RUNNING) {
            if (!delta && client_gone(st->fd)) {
                eng_cancel(s->eng, st->ar.req);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        } else if (f == ENG_ERROR || f == ENG_CANCELLED) {
            char *e = api_error_json(f == ENG_ERROR ? err : "cancelled", "server_error", NULL,
                                     NULL);
            char *ev = e ? malloc(strlen(e) + 40) : NULL;
            if (ev)
                sprintf(ev, "data: %s\n\ndata: [DONE]\n\n", e);
            free(e);
            ok = pend_add(st, ev);
            st->done = true;
        } else {
            ok = ok && pend_add(st, api_chunk_sse(&st->ar, st->id, st->created, s->model_name, "",
                                                  0, f, false));
            if (ok && st->ar.include_usage)
                ok = pend_add(st, api_usage_sse(&st->ar, st->id, st->created, s->model_name,
                                                st->ar.req->n_prompt, n_completion));
            if (ok) {
                char *d = malloc(16);
                if (d)
                    strcpy(d, "data: [DONE]\n\n");
                ok = pend_add(st, d);
            }
            st->done = true;
            log_line("POST", st->ar.chat ? "/v1/chat/completions (stream)"
                                         : "/v1/completions (stream)",
                     200, st->ar.req->n_prompt, n_completion, st->t0);
        }
        if (!ok)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls)
{
    stream *st = cls;
    eng_cancel(st->s->eng, st->ar.req); /* no-op once finished */
    eng_req_release(st->s->eng, st->ar.req);
    free(st->pend);
    free(st);
}

/* ---- completions --------------------------------------------------------------------------- */

static enum MHD_Result completion(server *s, struct MHD_Connection *c, const char *url,
                                  bool chat, conn *k)
{
    double t0 = cli_now();
    api_request ar;
    char *err_json;
    uint64_t id = new_id(s);
    int status = api_parse(&s->api, chat, k->body ? k->body : "", k->len,
                           (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + id, &ar, &err_json);
    if (status) {
        log_line("POST", url, (unsigned)status, 0, 0, t0);
        return reply(c, (unsigned)status, err_json);
    }
    llmem_status st = eng_submit(s->eng, ar.req);
    if (st != LLMEM_OK) {
        eng_req_release(s->eng, ar.req);
        unsigned code = st == LLMEM_E_NO_SPACE ? 429 : st == LLMEM_E_INVALID ? 503 : 500;
        log_line("POST", url, code, 0, 0, t0);
        return reply_error(c, code,
                           st == LLMEM_E_NO_SPACE ? "the server is busy: the request queue is "
                                                    "full; retry later"
                           : st == LLMEM_E_INVALID ? "the server is shutting down"
                                                   : "out of memory",
                           st == LLMEM_E_NO_SPACE ? "rate_limit_error" : "server_error", NULL,
                           st == LLMEM_E_NO_SPACE ? "queue_full" : NULL);
    }
    char rid[48];
    snprintf(rid, sizeof rid, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)id);
    long created = now_s();
    if (ar.stream) {
        stream *sm = calloc(1, sizeof *sm);
        struct MHD_Response *r = NULL;
        if (sm) {
            *sm = (stream){.s = s, .ar = ar, .created = created, .fd = conn_fd(c), .first = true,
                           .t0 = t0};
            snprintf(sm->id, sizeof sm->id, "%s", rid);
            r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sm,
                                                  stream_free);
        }
        if (!r) {
            if (sm)
                stream_free(sm);
            else
                eng_req_release(s->eng, ar.req);
            return reply(c, 500, NULL);
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ok;
    }
    char *text = NULL, *delta, err[256] = "";
    size_t len = 0, n_delta;
    int32_t n_completion = 0;
    int fd = conn_fd(c);
    eng_finish f;
    for (;;) {
        f = eng_poll(s->eng, ar.req, len, POLL_MS, &delta, &n_delta, &n_completion, err,
                     sizeof err);
        if (delta) {
            char *nt = realloc(text, len + n_delta + 1);
            if (!nt) {
                free(delta);
                eng_cancel(s->eng, ar.req);
                f = ENG_ERROR;
                snprintf(err, sizeof err, "out of memory");
                break;
            }
            text = nt;
            memcpy(text + len, delta, n_delta + 1);
            len += n_delta;
            free(delta);
        }
        if (f != ENG_RUNNING)
            break;
        if (client_gone(fd)) {
            eng_cancel(s->eng, ar.req);
            eng_req_release(s->eng, ar.req);
            free(text);
            log_line("POST", url, 499, 0, 0, t0);
            return MHD_NO; /* closes the connection */
        }
    }
    int32_t n_prompt = ar.req->n_prompt;
    eng_req_release(s->eng, ar.req);
    enum MHD_Result ok;
    if (f == ENG_ERROR || f == ENG_CANCELLED) {
        log_line("POST", url, 500, n_prompt, n_completion, t0);
        ok = reply_error(c, 500, err[0] ? err : "cancelled", "server_error", NULL, NULL);
    } else {
        log_line("POST", url, 200, n_prompt, n_completion, t0);
        ok = reply(c, 200, api_response_json(&ar, rid, created, s->model_name, text ? text : "",
                                             len, f, n_prompt, n_completion));
    }
    free(text);
    return ok;
}

/* ---- routing ------------------------------------------------------------------------------- */

static char *health_json(server *s)
{
    eng_stats t;
    eng_get_stats(s->eng, &t);
    struct { const char *key; double v; } num[] = {
        {"requests_running", t.running},
        {"requests_waiting", t.waiting},
        {"requests_total", (double)t.requests},
        {"requests_finished", (double)t.finished},
        {"requests_cancelled", (double)t.cancelled},
        {"requests_rejected", (double)t.rejected},
        {"requests_failed", (double)t.errors},
        {"preemptions", (double)t.preemptions},
        {"deferrals", (double)t.deferrals},
        {"steps", (double)t.steps},
        {"prompt_tokens", (double)t.prompt_tokens},
        {"completion_tokens", (double)t.completion_tokens},
        {"tokens_computed", (double)t.tokens_computed},
        {"prefix_hit_tokens", (double)t.prefix_hit_tokens},
        {"seqs_live", t.seqs_live},
        {"pages_used", (double)t.pages_used},
        {"pages_total", (double)t.pages_total},
        {"prefix_cache_bytes", (double)t.prefix_cache_bytes},
        {"cached_kv_bytes", (double)t.cached_kv_bytes},
        {"snapshots", (double)t.snapshots},
        {"snapshot_bytes", (double)t.snapshot_bytes},
        {"prefix_evictions", (double)t.prefix_evictions},
        {"snapshot_evictions", (double)t.snapshot_evictions},
    };
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "model", s->model_name);
    for (size_t i = 0; i < sizeof num / sizeof *num; i++)
        cJSON_AddNumberToObject(o, num[i].key, num[i].v);
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return j;
}

static bool authorized(server *s, struct MHD_Connection *c)
{
    if (!s->api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    const char *got = h + 7;
    size_t n = strlen(s->api_key), m = strlen(got);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < m; i++) /* no early exit: the time does not tell the prefix */
        diff |= (unsigned char)(got[i] ^ s->api_key[i < n ? i : 0]);
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    server *s = cls;
    conn *k = *con_cls;
    (void)version;
    if (!k) {
        if (!(k = calloc(1, sizeof *k)))
            return MHD_NO;
        *con_cls = k;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (k->too_big || k->len + n > MAX_BODY) {
            k->too_big = true;
            return MHD_YES;
        }
        if (!srv_buf_reserve(&k->body, &k->cap, k->len + n + 1, 4096))
            return MHD_NO;
        memcpy(k->body + k->len, upload, n);
        k->len += n;
        k->body[k->len] = '\0';
        return MHD_YES;
    }
    const char *path = !strncmp(url, "/v1/", 4) ? url + 3 : url;
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get)
        return reply(c, 200, health_json(s));
    bool known = !strcmp(path, "/models") || !strcmp(path, "/completions") ||
                 !strcmp(path, "/chat/completions");
    if (!known)
        return reply_error(c, 404, "no such endpoint; llmem serves /v1/completions, "
                                   "/v1/chat/completions, /v1/models and /health",
                           "invalid_request_error", NULL, "not_found");
    if (!authorized(s, c))
        return reply_error(c, 401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                           "invalid_request_error", NULL, "invalid_api_key");
    if (!strcmp(path, "/models")) {
        if (!get)
            return reply_error(c, 405, "use GET", "invalid_request_error", NULL, NULL);
        return reply(c, 200, api_models_json(s->model_name, s->started));
    }
    if (!post)
        return reply_error(c, 405, "use POST", "invalid_request_error", NULL, NULL);
    if (k->too_big)
        return reply_error(c, 413, "the request body is larger than 16 MiB",
                           "invalid_request_error", NULL, NULL);
    return completion(s, c, url, !strcmp(path, "/chat/completions"), k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    conn *k = *con_cls;
    (void)cls;
    (void)c;
    (void)toe;
    if (k) {
        free(k->body);
        free(k);
        *con_cls = NULL;
    }
}

/* ---- the command ----------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem serve [options]\n"
            "\n"
            "An OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions\n"
            "(streaming with \"stream\": true), GET /v1/models and GET /health. Requests are\n"
            "batched continuously and share the prefix cache (docs/serve.md).\n"
            "\n"
            "options:\n"
            "  -m, --model DIR      checkpoint folder (config.json, *.safetensors and, for text,\n"
            "                       tokenizer.json); default: the built-in byte-level model\n"
            "  --host ADDR          address to listen on (default 127.0.0.1)\n"
            "  --port N             TCP port (default 8080; 0: any free port, printed)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/*\n"
            "  -c, --n-ctx N        tokens per sequence: prompt + completion (default 4096)\n"
            "  -np, --parallel N    requests decoded at once (default 4); the same as\n"
            "                       --n-seq-max, whose default is 4 here, not 8\n"
            "  --max-queue N        requests that may wait for a slot; more get HTTP 429\n"
            "                       (default 64)\n"
            "  --alias NAME         model name in the API (default: the folder's name, or\n"
            "                       'llmem-builtin')\n"
            "%s%s%s",
            cli_model_opts_help, cli_backend_opts_help, cli_log_opts_help);
}

typedef struct serve_opts {
    const char *host, *api_key, *alias;
    int32_t port, max_queue;
    int32_t parallel; /* -np/--parallel; 0: not given */
} serve_opts;

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, cli_model_opts *mo, serve_opts *o)
{
    enum { O_HOST = CLI_OPT_OWN, O_PORT, O_KEY, O_PARALLEL, O_QUEUE, O_ALIAS };
    static const struct option own[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"api-key", required_argument, NULL, O_KEY},
        {"parallel", required_argument, NULL, O_PARALLEL},
        {"max-queue", required_argument, NULL, O_QUEUE},
        {"alias", required_argument, NULL, O_ALIAS},
        {0},
    };
    /* llama-server's "-np" is one option: getopt would read it as -n p */
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av)
        return 1;
    for (int i = 0; i < argc; i++)
        av[i] = strcmp(argv[i], "-np") ? argv[i] : "--parallel";
    cli_parser p;
    cli_parser_init(&p, "serve", argc, av, own, "", CLI_GROUP_LOG | CLI_GROUP_BACKEND |
                                                    CLI_GROUP_MODEL);
    const char *v, *name = NULL;
    int rc = -1;
    for (int c; rc < 0 && (c = cli_next_own(&p, mo, &v)) != -1;) {
        if (c == '?') {
            rc = 2;
            break;
        }
        bool ok = true;
        switch (c) {
        case 'h': usage(stdout); rc = 0; break;
        case O_HOST: o->host = v; break;
        case O_KEY: o->api_key = *v ? v : NULL; break;
        case O_ALIAS: o->alias = v; break;
        case O_PORT: ok = cli_int(v, 0, 65535, &o->port); name = "--port"; break;
        case O_PARALLEL:
            ok = cli_int(v, 1, 1 << 16, &o->parallel);
            name = "-np/--parallel";
            break;
        case O_QUEUE: ok = cli_int(v, 0, 1 << 24, &o->max_queue); name = "--max-queue"; break;
        default: break;
        }
        if (!ok) {
            fprintf(stderr, "llmem serve: bad value '%s' for %s\n", v, name);
            rc = 2;
        }
    }
    free(av);
    if (rc < 0 && o->parallel > 0) {
        /* two names of one size: the same value, or a refusal (not the last
         * one silently winning) */
        if (cli_model_opt_given(mo, CLI_OPT_N_SEQ_MAX) && mo->params.n_seq_max != o->parallel) {
            fprintf(stderr, "llmem serve: -np/--parallel %d and --n-seq-max %d disagree (they "
                            "name the same size); give one\n", (int)o->parallel,
                    (int)mo->params.n_seq_max);
            rc = 2;
        }
        mo->params.n_seq_max = o->parallel;
    }
    return rc;
}

static void model_name(const serve_opts *o, const char *dir, char *out, size_t cap)
{
    if (o->alias) {
        snprintf(out, cap, "%s", o->alias);
        return;
    }
    if (!dir) {
        snprintf(out, cap, "llmem-builtin");
        return;
    }
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

int llmem_cli_serve(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.params.n_seq_max = 4;
    serve_opts o = {.host = "127.0.0.1", .port = 8080, .max_queue = 64};
    int rc = parse_args(argc, argv, &mo, &o);
    if (rc >= 0)
        return rc;
    server s = {.api_key = o.api_key, .started = now_s()};
    llmem_backend *be = NULL;
    llmem_model *m = NULL;
    srv_text *text = NULL;
    struct MHD_Daemon *d = NULL;
    struct addrinfo *ai = NULL;
    char err[512] = "";
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    /* every thread started from here on leaves SIGINT / SIGTERM to sigwait */
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    pthread_mutex_init(&s.id_lock, NULL);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    int gai = getaddrinfo(o.host, NULL, &hints, &ai);
    if (gai) {
        fprintf(stderr, "llmem serve: --host '%s': %s\n", o.host, gai_strerror(gai));
        rc = 2;
        goto done;
    }
    mo.precision = cli_precision_of(&mo, CLI_PRECISION_FAST); /* as generate */
    if ((rc = cli_open_model("serve", &mo, &be, &m)) != 0)
        goto done;
    const char *dir = mo.model ? mo.model : llmem_builtin_model_dir();
    llmem_status st = srv_text_open(dir, llmem_model_n_vocab(m), &text, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem serve: %s: %s\n", dir, err);
        rc = 1;
        goto done;
    }
    model_name(&o, mo.model, s.model_name, sizeof s.model_name);
    s.api = (api_server){.text = text, .model_name = s.model_name, .n_ctx = mo.params.n_ctx,
                         .n_vocab = llmem_model_n_vocab(m)};
    if (eng_create(m, text, mo.params.n_seq_max, mo.params.n_ubatch, mo.params.n_ctx, o.max_queue,
                   &s.eng) != LLMEM_OK) {
        fprintf(stderr, "llmem serve: cannot start the engine thread\n");
        rc = 1;
        goto done;
    }
    bool v6 = ai->ai_family == AF_INET6, bracket = strchr(o.host, ':') != NULL;
    if (v6)
        ((struct sockaddr_in6 *)ai->ai_addr)->sin6_port = htons((uint16_t)o.port);
    else
        ((struct sockaddr_in *)ai->ai_addr)->sin_port = htons((uint16_t)o.port);
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                             MHD_USE_POLL | (v6 ? MHD_USE_IPv6 : 0),
                         (uint16_t)o.port, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR,
                         ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                         MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "llmem serve: cannot listen on %s port %d (in use, or not an address of "
                        "this machine?)\n", o.host, o.port);
        rc = 1;
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : o.port;
    fprintf(stderr, "llmem serve: listening on http://%s%s%s:%d (model '%s', text %s, backend "
                    "%s, parallel %d, max queue %d%s)\n",
            bracket ? "[" : "", o.host, bracket ? "]" : "", port, s.model_name,
            srv_text_kind(text), llmem_backend_name(be), mo.params.n_seq_max, o.max_queue,
            o.api_key ? ", API key required" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "llmem serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    if (s.eng)
        eng_stop(s.eng); /* finishes every request, so connection threads return */
    if (d)
        MHD_stop_daemon(d);
    eng_destroy(s.eng);
    srv_text_close(text);
    llmem_model_free(m);
    llmem_backend_close(be);
    if (ai)
        freeaddrinfo(ai);
    pthread_mutex_destroy(&s.id_lock);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* llmem replay: serves a request trace (Azure LLM inference trace format)
 * through continuous batching and reports throughput and latency.
 *
 * Each trace row is a request: a prompt of ContextTokens tokens drawn from a
 * text (behind an optional shared system prefix) that generates
 * GeneratedTokens tokens greedily. Every step batches one token per decoding
 * request and prefill chunks of newly admitted ones (continuous batching,
 * Yu et al., "Orca", OSDI 2022; chunked prefill as in Sarathi, Agrawal et al.
 * 2023). The memory's plan decides admission: a request is admitted when a
 * sequence id is free and the step's plan fits; when a plan fails with
 * LLMEM_E_NO_SPACE, the most recently admitted request is preempted (its
 * sequence removed, recomputed later from its prompt and the tokens it
 * generated so far; vLLM's recompute preemption, Kwon et al., SOSP 2023). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "examples/cli/cli.h"
#include "examples/cli/common.h"

#define TRACE_NAME "azure_llm_inference_conv_2023.csv"
#define TEXT_NAME "tinyshakespeare.txt"
#define TRACE_HEADER "TIMESTAMP,ContextTokens,GeneratedTokens"
#define MAX_LEN (1 << 24) /* tokens of a prompt part or a generation */

typedef struct request {
    int32_t n_body, n_gen;        /* trace lengths after --scale and the caps */
    uint32_t offset;              /* start of the body in the text */
    double arrival;               /* seconds after the start */
    int32_t *gen;                 /* [n_gen] generated token ids */
    int32_t n_done;               /* tokens generated so far */
    int32_t n_fed;                /* tokens in the sequence (memory) */
    int32_t n_fed_max;            /* most tokens it ever held (more is recompute) */
    int32_t seq;                  /* sequence id, -1 when not running */
    double t_first, t_last;
} request;

typedef struct replay {
    request *req;
    int32_t *gen; /* generated tokens of every request */
    int32_t n_req, n_prefix, V;
    const unsigned char *text; /* shared prefix = text[0, n_prefix) */
    size_t text_len;
} replay;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem replay [--trace FILE.csv] [options]\n"
            "\n"
            "Serves a request trace (Azure LLM inference format: TIMESTAMP,ContextTokens,\n"
            "GeneratedTokens) through continuous batching, greedily, with prompts drawn from a\n"
            "text, and reports throughput, latency percentiles, page use and preemptions.\n"
            "\n"
            "options:\n"
            "  --trace FILE         the trace (default ../shared/data/" TRACE_NAME ")\n"
            "  --text FILE          prompt text (default ../shared/data/" TEXT_NAME ")\n"
            "  --limit N            replay only the first N requests\n"
            "  --scale F            multiply prompt and generation lengths by F (default 1)\n"
            "  --max-context N      cap a prompt's (scaled) ContextTokens at N tokens\n"
            "  --max-gen N          cap a request's (scaled) GeneratedTokens at N tokens\n"
            "  --system-prefix N    put the same N tokens before every prompt (default 0)\n"
            "  --seed S             seed of the prompt offsets (default 1)\n"
            "  --pace               submit requests at the trace's arrival times (default:\n"
            "                       all at once, served as fast as possible)\n"
            "  --pace-speedup X     with --pace, replay X times faster (default 1)\n"
            "  --progress           progress bar on stderr (default: when it is a terminal)\n"
            "  --json FILE          also write the report as JSON\n"
            "  --output FILE.jsonl  each request's generated tokens, one line each:\n"
            "                       {\"request\": i, \"tokens\": [...]}\n"
            "  --check              check the memory's invariants after every step (slow)\n"
            "%s",
            cli_model_opts_help);
}

/* ---- inputs -------------------------------------------------------------------------- */

/* The default data file: in $LLMEM_DATA_DIR, ../shared/data (from the
 * repository root), or the shared folder beside the built-in model's source
 * tree. */
static const char *data_path(const char *name, char *buf, size_t cap)
{
    const char *env = getenv("LLMEM_DATA_DIR"), *bdir = llmem_builtin_model_dir();
    const char *fmt[3] = {"%s/%s", "../shared/data%s/%s", "%s/../../../shared/data/%s"};
    const char *dir[3] = {env && *env ? env : NULL, "", bdir};
    for (int k = 0; k < 3; k++)
        if (dir[k] && (snprintf(buf, cap, fmt[k], dir[k], name), access(buf, R_OK) == 0))
            return buf;
    return NULL;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* One row "2023-11-16 18:15:46.6805900,374,44": the time in seconds since
 * 1970 (UTC, proleptic Gregorian; H. Hinnant's days_from_civil) and the
 * two lengths. */
static bool parse_row(const char *line, double *t, int32_t *ctx, int32_t *gen)
{
    int y, mo, d, h, mi, n = 0;
    long long c, g;
    double sec;
    int got = sscanf(line, "%d-%d-%d %d:%d:%lf,%lld,%lld %n", &y, &mo, &d, &h, &mi, &sec, &c, &g,
                     &n);
    if (got != 8 || line[n] != '\0' || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 ||
        mi < 0 || mi > 59 || !(sec >= 0 && sec < 61) || c < 0 || c > 1 << 30 || g < 0 ||
        g > 1 << 30)
        return false;
    y -= mo <= 2;
    long era = (y >= 0 ? y : y - 399) / 400, yoe = y - era * 400;
    long doy = (153 * (mo > 2 ? mo - 3 : mo + 9) + 2) / 5 + d - 1;
    long days = era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
    *t = (double)days * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
    *ctx = (int32_t)c;
    *gen = (int32_t)g;
    return true;
}

static int32_t scaled(int32_t n, double scale, int32_t cap)
{
    double v = floor((double)n * scale + 0.5);
    int32_t r = v < 1 ? 1 : v > MAX_LEN ? MAX_LEN : (int32_t)v;
    return cap > 0 && r > cap ? cap : r;
}

typedef struct trace_opts {
    int32_t limit, max_ctx, max_gen, seed;
    double scale, speedup;
} trace_opts;

static int read_trace(const char *path, const trace_opts *o, replay *rp)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llmem replay: cannot open trace '%s'\n", path);
        return 1;
    }
    char *line = NULL;
    size_t lcap = 0;
    int32_t cap = 0, line_no = 1;
    int64_t n_gen = 0;
    double t_first = 0;
    int rc = getline(&line, &lcap, f) < 0 || strncmp(line, TRACE_HEADER, strlen(TRACE_HEADER));
    if (rc)
        fprintf(stderr, "llmem replay: %s: expected the header " TRACE_HEADER "\n", path);
    while (!rc && (o->limit <= 0 || rp->n_req < o->limit) && getline(&line, &lcap, f) >= 0) {
        line_no++;
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue;
        int32_t ctx, gen;
        double t;
        if (!parse_row(line, &t, &ctx, &gen)) {
            fprintf(stderr, "llmem replay: %s:%d: expected " TRACE_HEADER "\n", path, line_no);
            rc = 1;
            break;
        }
        if (rp->n_req == cap) {
            cap = cap ? cap * 2 : 256;
            request *nr = realloc(rp->req, (size_t)cap * sizeof *nr);
            if (!nr) {
                rc = 1;
                break;
            }
            rp->req = nr;
        }
        request *r = &rp->req[rp->n_req];
        memset(r, 0, sizeof *r);
        if (rp->n_req == 0)
            t_first = t;
        r->n_body = scaled(ctx, o->scale, o->max_ctx);
        r->n_gen = scaled(gen, o->scale, o->max_gen);
        r->arrival = (t - t_first) / o->speedup;
        uint64_t h = splitmix64((uint64_t)o->seed * 0x100000001b3ull + (uint64_t)rp->n_req);
        r->offset = (uint32_t)(h % rp->text_len);
        r->seq = -1;
        rp->n_req++;
        n_gen += r->n_gen;
    }
    free(line);
    fclose(f);
    if (!rc && rp->n_req == 0) {
        fprintf(stderr, "llmem replay: %s has no requests\n", path);
        rc = 1;
    }
    if (!rc && !(rp->gen = malloc((size_t)n_gen * sizeof *rp->gen))) {
        fprintf(stderr, "llmem replay: out of memory\n");
        rc = 1;
    }
    for (size_t i = 0, at = 0; !rc && i < (size_t)rp->n_req; at += (size_t)rp->req[i++].n_gen)
        rp->req[i].gen = rp->gen + at;
    return rc;
}

static int load_text(const char *path, replay *rp, unsigned char **owned)
{
    FILE *f = path ? fopen(path, "rb") : NULL;
    long n = -1;
    unsigned char *buf = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n)) && fread(buf, 1, (size_t)n, f) != (size_t)n)
        n = -1;
    if (f)
        fclose(f);
    if (!buf || n <= 0) {
        fprintf(stderr, "llmem replay: %s%s%s\n", path ? "cannot read the text '" : "no text found",
                path ? path : "; pass --text FILE", path ? "' (or it is empty)" : "");
        free(buf);
        return 1;
    }
    *owned = buf;
    rp->text = buf;
    rp->text_len = (size_t)n;
    return 0;
}

static int32_t n_prompt(const replay *rp, const request *r)
{
    return rp->n_prefix + r->n_body;
}

/* Token j of the request's sequence: system prefix, body, then generated. */
static int32_t req_token(const replay *rp, const request *r, int32_t j)
{
    unsigned char b;
    if (j < rp->n_prefix)
        b = rp->text[(size_t)j % rp->text_len];
    else if (j < n_prompt(rp, r))
        b = rp->text[((size_t)r->offset + (size_t)(j - rp->n_prefix)) % rp->text_len];
    else
        return r->gen[j - n_prompt(rp, r)];
    return (int32_t)b % rp->V;
}

/* Tokens the request's sequence will hold at most (the last generated token
 * is never fed). */
static int64_t req_max_len(const replay *rp, const request *r)
{
    return (int64_t)n_prompt(rp, r) + r->n_gen - 1;
}

/* ---- statistics ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct dist {
    int32_t n;
    double p[3], mean; /* p50, p90, p99 */
} dist;

/* Sorts v[n]; percentiles linear between closest ranks (numpy's default). */
static dist summarize(double *v, int32_t n)
{
    static const double q[3] = {0.50, 0.90, 0.99};
    dist d = {.n = n, .mean = 0};
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int32_t i = 0; i < n; i++)
        d.mean += v[i] / n;
    for (int k = 0; k < 3 && n > 0; k++) {
        double pos = q[k] * (n - 1);
        int32_t lo = (int32_t)pos, hi = lo + 1 < n ? lo + 1 : lo;
        d.p[k] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
    return d;
}

typedef struct counters {
    int64_t prompt_tokens;     /* prompt tokens of the requests */
    int64_t gen_tokens;        /* tokens generated so far */
    int64_t recomputed_tokens; /* tokens submitted again after a preemption */
    int64_t preemptions, deferrals, steps;
    int32_t n_done;
} counters;

/* ---- the scheduler ------------------------------------------------------------------------ */

typedef struct sched {
    replay *rp;
    llmem_model *m;
    llmem_memory *mem;
    int32_t n_seq, n_ubatch;
    int32_t *running, n_running; /* request ids in admission order */
    int32_t *free_seq, n_free;
    int32_t *wait, wait_head, wait_n; /* ring buffer of request ids */
    int32_t *row_req;                 /* [n_seq] request of each output row */
    int32_t *chunk;                   /* [n_req] tokens of each request in the step */
    float *logits;                    /* [n_seq][V] */
    llmem_batch_buf *bb;
    counters c;
    bool check;
} sched;

static void wait_push_front(sched *s, int32_t r)
{
    s->wait_head = (s->wait_head + s->rp->n_req - 1) % s->rp->n_req;
    s->wait[s->wait_head] = r;
    s->wait_n++;
}

static int32_t wait_pop_front(sched *s)
{
    int32_t r = s->wait[s->wait_head];
    s->wait_head = (s->wait_head + 1) % s->rp->n_req;
    s->wait_n--;
    return r;
}

/* Frees the sequence of running[i] (finished or preempted) and drops it
 * from the running list, keeping the admission order. */
static int retire(sched *s, int32_t i)
{
    request *r = &s->rp->req[s->running[i]];
    llmem_status st = llmem_memory_seq_rm(s->mem, r->seq, -1, -1);
    if (st != LLMEM_OK)
        fprintf(stderr, "\nllmem replay: seq_rm(%d): %s\n", r->seq, llmem_status_str(st));
    s->free_seq[s->n_free++] = r->seq;
    r->seq = -1;
    r->n_fed = 0;
    s->n_running--;
    memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i) * sizeof *s->running);
    return st != LLMEM_OK;
}

/* Adds tokens [n_fed, n_fed + k) of request ri to the step; the last token
 * of its sequence so far needs an output row (the next token). */
static void add_chunk(sched *s, int32_t ri, int32_t k, int32_t *rows)
{
    request *r = &s->rp->req[ri];
    int32_t len = n_prompt(s->rp, r) + r->n_done;
    for (int32_t t = 0; t < k; t++) {
        int32_t p = r->n_fed + t;
        llmem_batch_buf_add(s->bb, req_token(s->rp, r, p), p, &r->seq, 1, p == len - 1);
    }
    if (r->n_fed + k == len)
        s->row_req[(*rows)++] = ri;
    s->chunk[ri] = k;
}

static int32_t left_of(const sched *s, const request *r)
{
    return n_prompt(s->rp, r) + r->n_done - r->n_fed;
}

/* Fills the step: one token per decoding request, then prefill chunks (in
 * admission order, then newly admitted requests) within n_ubatch tokens. */
static int32_t build(sched *s, bool admit, int32_t *admitted)
{
    int32_t budget = s->n_ubatch, rows = 0;
    llmem_batch_buf_clear(s->bb);
    for (int32_t i = 0; i < s->n_running; i++)
        s->chunk[s->running[i]] = 0;
    for (int32_t i = 0; i < s->n_running; i++)
        if (left_of(s, &s->rp->req[s->running[i]]) == 1) {
            add_chunk(s, s->running[i], 1, &rows);
            budget--;
        }
    for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
        int32_t left = left_of(s, &s->rp->req[s->running[i]]);
        if (left > 1) {
            int32_t k = left < budget ? left : budget;
            add_chunk(s, s->running[i], k, &rows);
            budget -= k;
        }
    }
    while (admit && budget > 0 && s->n_free > 0 && s->wait_n > 0) {
        int32_t ri = wait_pop_front(s);
        request *r = &s->rp->req[ri];
        r->seq = s->free_seq[--s->n_free];
        r->n_fed = 0;
        s->running[s->n_running++] = ri;
        (*admitted)++;
        int32_t left = left_of(s, r), k = left < budget ? left : budget;
        add_chunk(s, ri, k, &rows);
        budget -= k;
    }
    return rows;
}

static int32_t argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            return -1;
        if (v[i] > v[best])
            best = i;
    }
    return best;
}

/* Runs one step: builds it, and while its plan does not fit, takes the most
 * recently admitted request off (a deferral if it was admitted in this step
 * and holds nothing, else a preemption). Returns 0, or 1 after an error. */
static int step(sched *s, double t0)
{
    replay *rp = s->rp;
    int32_t admitted = 0, rows;
    bool admit = true;
    char err[512] = "";
    int32_t n_out = 0;
    llmem_status st;
    for (;;) {
        rows = build(s, admit, &admitted);
        if (s->n_running == 0)
            return 0;
        st = llmem_model_decode(s->m, llmem_batch_buf_get(s->bb), false, s->logits, s->n_seq,
                                &n_out, err, sizeof err);
        if (st != LLMEM_E_NO_SPACE || s->n_running == 1)
            break;
        if (admitted > 0) {
            admitted--;
            s->c.deferrals++;
        } else {
            s->c.preemptions++;
        }
        int32_t ri = s->running[s->n_running - 1];
        admit = false;
        if (retire(s, s->n_running - 1))
            return 1;
        wait_push_front(s, ri);
    }
    if (st != LLMEM_OK) { /* NO_SPACE here: one request alone does not fit */
        fprintf(stderr, "\nllmem replay: %s (%s)\n", err, llmem_status_str(st));
        return 1;
    }
    if (n_out != rows) {
        fprintf(stderr, "\nllmem replay: %d output rows, expected %d\n", n_out, rows);
        return 1;
    }
    s->c.steps++;
    double now = cli_now() - t0;
    for (int32_t i = 0; i < s->n_running; i++) {
        request *r = &rp->req[s->running[i]];
        int32_t lo = r->n_fed, hi = lo + s->chunk[s->running[i]];
        int32_t again = (hi < r->n_fed_max ? hi : r->n_fed_max) - lo;
        s->c.recomputed_tokens += again > 0 ? again : 0;
        r->n_fed = hi;
        r->n_fed_max = hi > r->n_fed_max ? hi : r->n_fed_max;
    }
    for (int32_t o = 0; o < rows; o++) {
        request *r = &rp->req[s->row_req[o]];
        int32_t t = argmax(s->logits + (size_t)o * (size_t)rp->V, rp->V);
        if (t < 0) {
            fprintf(stderr, "\nllmem replay: request %td: non-finite logits\n", r - rp->req);
            return 1;
        }
        r->gen[r->n_done++] = t;
        if (r->n_done == 1)
            r->t_first = now;
        r->t_last = now;
        s->c.gen_tokens++;
    }
    for (int32_t i = s->n_running - 1; i >= 0; i--) {
        request *r = &rp->req[s->running[i]];
        if (r->n_done < r->n_gen)
            continue;
        if (retire(s, i))
            return 1;
        s->c.n_done++;
    }
    if (s->check && (st = llmem_memory_check(s->mem, err, sizeof err)) != LLMEM_OK) {
        fprintf(stderr, "\nllmem replay: memory check after step %lld: %s\n", (long long)s->c.steps,
                err);
        return 1;
    }
    return 0;
}

static void progress(const sched *s, double elapsed, bool final)
{
    const counters *c = &s->c;
    int32_t n_req = s->rp->n_req;
    llmem_model_stats ms;
    llmem_model_get_stats(s->m, &ms);
    char bar[31] = {0};
    memset(bar, '.', 30);
    memset(bar, '#', (size_t)(30 * (int64_t)c->n_done / n_req));
    double dt = elapsed > 0 ? elapsed : 1e-9;
    fprintf(stderr, "\rreplay [%s] %d/%d requests  %.0f tok/s computed  %.0f tok/s out  %lld "
            "preempted%s", bar, c->n_done, n_req, (double)ms.n_tokens / dt,
            (double)c->gen_tokens / dt, (long long)c->preemptions, final ? "\n" : "");
    fflush(stderr);
}

/* Serves every request; fills s->c. Returns 0 or 1. */
static int serve(sched *s, bool pace, bool show, double *wall)
{
    replay *rp = s->rp;
    int32_t next = 0;
    double t0 = cli_now(), t_show = 0;
    for (int32_t i = 0; i < rp->n_req; i++)
        s->c.prompt_tokens += n_prompt(rp, &rp->req[i]);
    while (s->c.n_done < rp->n_req) {
        double now = cli_now() - t0;
        while (next < rp->n_req && (!pace || rp->req[next].arrival <= now))
            s->wait[(s->wait_head + s->wait_n++) % rp->n_req] = next++;
        if (s->n_running == 0 && s->wait_n == 0) {
            double dt = rp->req[next].arrival - now; /* idle until the next arrival */
            struct timespec ts = {(time_t)dt, (long)((dt - floor(dt)) * 1e9)};
            if (dt > 0)
                nanosleep(&ts, NULL);
            continue;
        }
        if (step(s, t0))
            return 1;
        now = cli_now() - t0;
        if (show && now - t_show > 0.2 && s->c.n_done < rp->n_req) {
            progress(s, now, false);
            t_show = now;
        }
    }
    *wall = cli_now() - t0;
    if (show)
        progress(s, *wall, true);
    return 0;
}

/* ---- report ------------------------------------------------------------------------------- */

typedef struct report {
    const char *backend, *model;
    bool pace;
    double speedup, wall, hit_rate;
    dist ttft, tpot; /* milliseconds */
    llmem_memory_stats ms;
    llmem_model_stats mst;
    llmem_model_params params;
} report;

static void summarize_all(const sched *s, report *rep, double *v)
{
    const replay *rp = s->rp;
    int32_t n = 0;
    for (int32_t i = 0; i < rp->n_req; i++)
        v[n++] = 1e3 * (rp->req[i].t_first - (rep->pace ? rp->req[i].arrival : 0));
    rep->ttft = summarize(v, n);
    n = 0;
    for (int32_t i = 0; i < rp->n_req; i++)
        if (rp->req[i].n_gen > 1)
            v[n++] = 1e3 * (rp->req[i].t_last - rp->req[i].t_first) / (rp->req[i].n_gen - 1);
    rep->tpot = summarize(v, n);
    int64_t fed = s->c.prompt_tokens + s->c.recomputed_tokens;
    rep->hit_rate = fed ? (double)rep->ms.prefix_hit_tokens / (double)fed : 0.0;
}

static void add_dist(cJSON *o, const char *name, const dist *d)
{
    cJSON *j = cJSON_AddObjectToObject(o, name);
    cJSON_AddNumberToObject(j, "n", d->n);
    if (d->n == 0)
        return;
    cJSON_AddNumberToObject(j, "p50", d->p[0]);
    cJSON_AddNumberToObject(j, "p90", d->p[1]);
    cJSON_AddNumberToObject(j, "p99", d->p[2]);
    cJSON_AddNumberToObject(j, "mean", d->mean);
}

static int write_json(const char *path, const sched *s, const report *r)
{
    const counters *c = &s->c;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "backend", r->backend);
    cJSON_AddStringToObject(o, "model", r->model);
    struct { const char *key; double v; } num[] = {
        {"requests", s->rp->n_req},
        {"prompt_tokens", (double)c->prompt_tokens},
        {"generated_tokens", (double)c->gen_tokens},
        {"computed_tokens", (double)r->mst.n_tokens},
        {"recomputed_tokens", (double)c->recomputed_tokens},
        {"wall_s", r->wall},
        {"prompt_tokens_per_s", (double)c->prompt_tokens / r->wall},
        {"generated_tokens_per_s", (double)c->gen_tokens / r->wall},
        {"pages_total", (double)r->ms.pages_total},
        {"pages_peak", (double)r->ms.pages_peak},
        {"page_size", r->params.page_size},
        {"prefix_hit_tokens", (double)r->ms.prefix_hit_tokens},
        {"prefix_hit_rate", r->hit_rate},
        {"preemptions", (double)c->preemptions},
        {"admission_deferrals", (double)c->deferrals},
        {"steps", (double)c->steps},
        {"ubatches", (double)r->mst.n_ubatch},
        {"n_seq_max", r->params.n_seq_max},
        {"n_ubatch", r->params.n_ubatch},
        {"pace_speedup", r->pace ? r->speedup : 0},
    };
    for (size_t k = 0; k < sizeof num / sizeof *num; k++)
        cJSON_AddNumberToObject(o, num[k].key, num[k].v);
    add_dist(o, "ttft_ms", &r->ttft);
    add_dist(o, "tpot_ms", &r->tpot);
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = txt ? fopen(path, "w") : NULL;
    int rc = !f || fprintf(f, "%s\n", txt) < 0;
    if (f && fclose(f))
        rc = 1;
    free(txt);
    if (rc)
        fprintf(stderr, "llmem replay: cannot write '%s'\n", path);
    return rc;
}

static int write_outputs(const char *path, const replay *rp)
{
    FILE *f = fopen(path, "w");
    for (int32_t i = 0; f && i < rp->n_req; i++) {
        fprintf(f, "{\"request\": %d, \"tokens\": [", i);
        for (int32_t k = 0; k < rp->req[i].n_done; k++)
            fprintf(f, "%s%d", k ? ", " : "", rp->req[i].gen[k]);
        fprintf(f, "]}\n");
    }
    if (!f || fclose(f)) {
        fprintf(stderr, "llmem replay: cannot write '%s'\n", path);
        return 1;
    }
    return 0;
}

static void print_dist(const char *name, const dist *d)
{
    if (d->n == 0)
        printf("%-24s (no samples)\n", name);
    else
        printf("%-24s p50 %9.2f  p90 %9.2f  p99 %9.2f  mean %9.2f  (%d requests)\n", name,
               d->p[0], d->p[1], d->p[2], d->mean, d->n);
}

static void print_report(const sched *s, const report *r)
{
    const counters *c = &s->c;
    printf("replay: %d requests on %s, model %s%s\n", s->rp->n_req, r->backend, r->model,
           r->pace ? " (paced)" : "");
    printf("%-24s %lld prompt, %lld generated; %lld computed (%lld recomputed after "
           "preemption, %lld prefix-cache hits)\n",
           "tokens", (long long)c->prompt_tokens, (long long)c->gen_tokens,
           (long long)r->mst.n_tokens, (long long)c->recomputed_tokens,
           (long long)r->ms.prefix_hit_tokens);
    printf("%-24s %.3f s, %lld steps, %lld ubatches\n", "wall time", r->wall, (long long)c->steps,
           (long long)r->mst.n_ubatch);
    printf("%-24s %.1f tokens/s in, %.1f tokens/s out\n", "throughput",
           (double)c->prompt_tokens / r->wall, (double)c->gen_tokens / r->wall);
    print_dist("time to first token ms", &r->ttft);
    print_dist("time per output token ms", &r->tpot);
    printf("%-24s peak %lld of %lld pages of %d tokens (%.1f%%)\n", "KV pages",
           (long long)r->ms.pages_peak, (long long)r->ms.pages_total, r->params.page_size,
           r->ms.pages_total ? 100.0 * (double)r->ms.pages_peak / (double)r->ms.pages_total : 0.0);
    printf("%-24s %.1f%% (%lld hit tokens / %lld prompt + recomputed tokens)\n",
           "prefix-cache hits", 100.0 * r->hit_rate, (long long)r->ms.prefix_hit_tokens,
           (long long)(c->prompt_tokens + c->recomputed_tokens));
    printf("%-24s %lld (and %lld admissions deferred)\n", "preemptions", (long long)c->preemptions,
           (long long)c->deferrals);
}

/* ---- main ------------------------------------------------------------------------------------ */

typedef struct replay_opts {
    trace_opts to;
    const char *trace, *text, *json, *output;
    int32_t n_prefix;
    bool pace, show, check;
} replay_opts;

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, cli_model_opts *mo, replay_opts *o)
{
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt(mo, "replay", argc, argv, &i);
        if (r != 0) {
            if (r < 0)
                return 2;
            continue;
        }
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--pace") || !strcmp(a, "--progress") || !strcmp(a, "--check")) {
            bool *flag = !strcmp(a, "--pace") ? &o->pace : !strcmp(a, "--check") ? &o->check
                                                                               : &o->show;
            *flag = true;
            continue;
        } else if (!v) {
            fprintf(stderr, "llmem replay: unknown option '%s' or missing value (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--trace") || !strcmp(a, "--text")) {
            *(a[3] == 'r' ? &o->trace : &o->text) = v;
        } else if (!strcmp(a, "--json") || !strcmp(a, "--output")) {
            *(a[2] == 'j' ? &o->json : &o->output) = v;
        } else if (!strcmp(a, "--limit") || !strcmp(a, "--seed")) {
            ok = cli_int(v, a[2] == 'l', INT32_MAX, a[2] == 'l' ? &o->to.limit : &o->to.seed);
        } else if (!strcmp(a, "--max-context") || !strcmp(a, "--max-gen")) {
            ok = cli_int(v, 1, MAX_LEN, a[6] == 'c' ? &o->to.max_ctx : &o->to.max_gen);
        } else if (!strcmp(a, "--system-prefix")) {
            ok = cli_int(v, 0, MAX_LEN, &o->n_prefix);
        } else if (!strcmp(a, "--scale") || !strcmp(a, "--pace-speedup")) {
            ok = cli_float(v, 1e-6, 1e9, a[2] == 's' ? &o->to.scale : &o->to.speedup);
        } else {
            fprintf(stderr, "llmem replay: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "llmem replay: bad value '%s' for %s\n", v, a);
            return 2;
        }
        i++;
    }
    return -1;
}

/* Every request must fit the KV pages alone, or preemption cannot help. */
static int check_fits(const replay *rp, llmem_memory *mem, int32_t page_size)
{
    llmem_memory_stats ms;
    llmem_memory_get_stats(mem, &ms);
    int64_t cap = ms.pages_total * page_size;
    for (int32_t i = 0; ms.pages_total > 0 && i < rp->n_req; i++)
        if (req_max_len(rp, &rp->req[i]) > cap) {
            fprintf(stderr, "llmem replay: request %d needs %lld tokens of KV cache, more than "
                            "the %lld its pages hold; raise --n-pages or lower --scale, "
                            "--max-context or --max-gen\n",
                    i, (long long)req_max_len(rp, &rp->req[i]), (long long)cap);
            return 1;
        }
    return 0;
}

int llmem_cli_replay(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    replay_opts o = {.to = {.seed = 1, .scale = 1.0, .speedup = 1.0}, .show = isatty(2) != 0};
    int rc = parse_args(argc, argv, &mo, &o);
    if (rc >= 0)
        return rc;
    char tbuf[4096], xbuf[4096];
    if (!o.trace && !(o.trace = data_path(TRACE_NAME, tbuf, sizeof tbuf))) {
        fprintf(stderr, "llmem replay: no trace found; pass --trace FILE.csv (format "
                        "TIMESTAMP,ContextTokens,GeneratedTokens)\n");
        return 2;
    }
    o.text = o.text ? o.text : data_path(TEXT_NAME, xbuf, sizeof xbuf);
    replay rp = {.n_prefix = o.n_prefix};
    unsigned char *text_buf = NULL;
    sched s = {.rp = &rp, .check = o.check};
    report rep = {.pace = o.pace, .speedup = o.to.speedup, .params = mo.params,
                  .model = mo.model ? mo.model : "built-in"};
    llmem_backend *be = NULL;
    llmem_model *m = NULL;
    double *v = NULL;
    rc = load_text(o.text, &rp, &text_buf);
    if (!rc)
        rc = read_trace(o.trace, &o.to, &rp);
    if (!rc)
        rc = cli_open_model("replay", &mo, &be, &m);
    if (rc)
        goto done;
    rp.V = llmem_model_n_vocab(m);
    s.m = m;
    s.mem = llmem_model_memory(m);
    s.n_seq = mo.params.n_seq_max;
    s.n_ubatch = mo.params.n_ubatch;
    rep.backend = llmem_backend_name(be);
    if ((rc = check_fits(&rp, s.mem, mo.params.page_size)))
        goto done;
    /* running, free_seq, row_req: [n_seq] each; wait, chunk: [n_req] each */
    s.running = calloc(3 * (size_t)s.n_seq + 2 * (size_t)rp.n_req, sizeof *s.running);
    s.logits = malloc((size_t)s.n_seq * (size_t)rp.V * sizeof *s.logits);
    v = malloc((size_t)rp.n_req * sizeof *v);
    if (!s.running || !s.logits || !v ||
        llmem_batch_buf_create(s.n_seq + s.n_ubatch, 1, &s.bb) != LLMEM_OK) {
        fprintf(stderr, "llmem replay: out of memory\n");
        rc = 1;
        goto done;
    }
    s.free_seq = s.running + s.n_seq;
    s.row_req = s.free_seq + s.n_seq;
    s.wait = s.row_req + s.n_seq;
    s.chunk = s.wait + rp.n_req;
    for (int32_t q = 0; q < s.n_seq; q++)
        s.free_seq[q] = s.n_seq - 1 - q; /* sequence 0 is handed out first */
    s.n_free = s.n_seq;
    if ((rc = serve(&s, o.pace, o.show, &rep.wall)))
        goto done;
    llmem_memory_get_stats(s.mem, &rep.ms);
    llmem_model_get_stats(m, &rep.mst);
    if (rep.ms.n_seqs_live != 0 || rep.ms.pages_used != 0) {
        fprintf(stderr, "llmem replay: the memory still holds %d sequences and %lld pages after "
                        "the last request\n", rep.ms.n_seqs_live, (long long)rep.ms.pages_used);
        rc = 1;
        goto done;
    }
    summarize_all(&s, &rep, v);
    print_report(&s, &rep);
    if (o.json)
        rc |= write_json(o.json, &s, &rep);
    if (o.output)
        rc |= write_outputs(o.output, &rp);
done:
    free(v);
    free(rp.gen);
    free(rp.req);
    free(text_buf);
    free(s.running);
    free(s.logits);
    llmem_batch_buf_destroy(s.bb);
    llmem_model_free(m);
    llmem_backend_close(be);
    return rc;
}

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
#include "examples/cli/replay.h"

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
            "  --trace FILE         the trace (default: " TRACE_NAME "\n"
            "                       in $LLMEM_DATA_DIR, else in ../shared/data, else in\n"
            "                       the shared/data beside the source tree)\n"
            "  --text FILE          prompt text (default " TEXT_NAME ", looked up alike)\n"
            "  --limit N            replay only the first N requests\n"
            "  --scale F            multiply prompt and generation lengths by F (default 1)\n"
            "  --max-context N      cap a prompt's (scaled) ContextTokens at N tokens\n"
            "  --max-gen N          cap a request's (scaled) GeneratedTokens at N tokens\n"
            "  --system-prefix N    put the same N tokens before every prompt (default 0)\n"
            "  --seed S             seed of the prompt offsets (default 1)\n"
            "  --turns K            multi-turn: every K consecutive rows are one conversation;\n"
            "                       a turn's prompt is the whole previous turn (prompt and\n"
            "                       generation) plus its own ContextTokens, and it starts\n"
            "                       when the previous turn is done (default 1)\n"
            "  --pace               submit requests at the trace's arrival times (default:\n"
            "                       all at once, served as fast as possible)\n"
            "  --pace-speedup X     with --pace, replay X times faster (default 1)\n"
            "  --progress           progress bar on stderr (default: when it is a terminal)\n"
            "  --json FILE          also write the report as JSON\n"
            "  --output FILE.jsonl  each request's generated tokens, one line each:\n"
            "                       {\"request\": i, \"tokens\": [...]}\n"
            "  --logprobs           with --output, each line also holds \"logprobs\": [...], each\n"
            "                       generated token's log-probability (natural log, the\n"
            "                       log-softmax of its row of logits in double)\n"
            "  --check              check the memory's invariants after every step (slow)\n"
            "%s%s%s",
            cli_log_opts_help, cli_model_opts_help, cli_backend_opts_help);
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
        {"host_tier_pages", (double)r->ms.host_tier_pages},
        {"host_tier_bytes", (double)r->ms.host_tier_bytes},
        {"host_tier_hits", (double)r->ms.host_tier_hits},
        {"snapshots", (double)r->ms.snapshots},
        {"snapshot_bytes", (double)r->ms.snapshot_bytes},
        {"snapshot_hit_tokens", (double)r->ms.snapshot_hit_tokens},
        {"host_tier_snapshots", (double)r->ms.host_tier_snapshots},
        {"host_tier_snapshot_bytes", (double)r->ms.host_tier_snapshot_bytes},
        {"host_tier_snapshot_hits", (double)r->ms.host_tier_snapshot_hits},
        {"prefix_cache_bytes", (double)r->ms.prefix_cache_bytes},
        {"cached_kv_bytes", (double)r->ms.cached_kv_bytes},
        {"prefix_evictions", (double)r->ms.prefix_evictions},
        {"snapshot_evictions", (double)r->ms.snapshot_evictions},
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
        fprintf(f, "]");
        if (rp->lp) {
            fprintf(f, ", \"logprobs\": [");
            for (int32_t k = 0; k < rp->req[i].n_done; k++)
                fprintf(f, "%s%.9g", k ? ", " : "", rp->req[i].lp[k]);
            fprintf(f, "]");
        }
        fprintf(f, "}\n");
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
    if (r->ms.host_tier_hits > 0 || r->ms.host_tier_pages > 0)
        printf("%-24s %lld pages restored on hits; %lld pages (%lld bytes) held now\n",
               "KV host tier", (long long)r->ms.host_tier_hits,
               (long long)r->ms.host_tier_pages, (long long)r->ms.host_tier_bytes);
    if (r->ms.snapshots > 0 || r->ms.host_tier_snapshots > 0)
        printf("%-24s %lld on the device (%lld bytes), %lld on the host (%lld bytes); "
               "%lld restored from the host on hits\n",
               "snapshots", (long long)r->ms.snapshots, (long long)r->ms.snapshot_bytes,
               (long long)r->ms.host_tier_snapshots, (long long)r->ms.host_tier_snapshot_bytes,
               (long long)r->ms.host_tier_snapshot_hits);
    if (r->ms.prefix_cache_bytes > 0 || r->ms.prefix_evictions > 0 ||
        r->ms.snapshot_evictions > 0)
        printf("%-24s %lld bytes: %lld in cached KV pages, %lld in snapshots; evicted %lld "
               "pages, %lld snapshots\n",
               "device prefix cache", (long long)r->ms.prefix_cache_bytes,
               (long long)r->ms.cached_kv_bytes, (long long)r->ms.snapshot_bytes,
               (long long)r->ms.prefix_evictions, (long long)r->ms.snapshot_evictions);
    printf("%-24s %lld (and %lld admissions deferred)\n", "preemptions", (long long)c->preemptions,
           (long long)c->deferrals);
}

/* ---- main ------------------------------------------------------------------------------------ */

typedef struct replay_opts {
    trace_opts to;
    const char *trace, *text, *json, *output;
    int32_t n_prefix;
    bool pace, show, check, logprobs;
} replay_opts;

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, cli_model_opts *mo, replay_opts *o)
{
    enum {
        O_TRACE = CLI_OPT_OWN, O_TEXT, O_LIMIT, O_SCALE, O_MAX_CTX, O_MAX_GEN, O_PREFIX, O_SEED,
        O_PACE, O_SPEEDUP, O_PROGRESS, O_JSON, O_OUTPUT, O_CHECK, O_TURNS, O_LOGPROBS,
    };
    static const struct option own[] = {
        {"trace", required_argument, NULL, O_TRACE},
        {"text", required_argument, NULL, O_TEXT},
        {"limit", required_argument, NULL, O_LIMIT},
        {"scale", required_argument, NULL, O_SCALE},
        {"max-context", required_argument, NULL, O_MAX_CTX},
        {"max-gen", required_argument, NULL, O_MAX_GEN},
        {"system-prefix", required_argument, NULL, O_PREFIX},
        {"seed", required_argument, NULL, O_SEED},
        {"turns", required_argument, NULL, O_TURNS},
        {"pace", no_argument, NULL, O_PACE},
        {"pace-speedup", required_argument, NULL, O_SPEEDUP},
        {"progress", no_argument, NULL, O_PROGRESS},
        {"json", required_argument, NULL, O_JSON},
        {"output", required_argument, NULL, O_OUTPUT},
        {"check", no_argument, NULL, O_CHECK},
        {"logprobs", no_argument, NULL, O_LOGPROBS},
        {0},
    };
    cli_parser p;
    cli_parser_init(&p, "replay", argc, argv, own, "",
                    CLI_GROUP_LOG | CLI_GROUP_BACKEND | CLI_GROUP_MODEL);
    const char *v;
    for (int c; (c = cli_next_own(&p, mo, &v)) != -1;) {
        if (c == '?')
            return 2;
        bool ok = true;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case O_PACE: o->pace = true; break;
        case O_CHECK: o->check = true; break;
        case O_LOGPROBS: o->logprobs = true; break;
        case O_PROGRESS: o->show = true; break;
        case O_TRACE: o->trace = v; break;
        case O_TEXT: o->text = v; break;
        case O_JSON: o->json = v; break;
        case O_OUTPUT: o->output = v; break;
        case O_LIMIT: ok = cli_int(v, 1, INT32_MAX, &o->to.limit); break;
        case O_SEED: ok = cli_int(v, 0, INT32_MAX, &o->to.seed); break;
        case O_MAX_CTX: ok = cli_int(v, 1, MAX_LEN, &o->to.max_ctx); break;
        case O_MAX_GEN: ok = cli_int(v, 1, MAX_LEN, &o->to.max_gen); break;
        case O_PREFIX: ok = cli_int(v, 0, MAX_LEN, &o->n_prefix); break;
        case O_SCALE: ok = cli_float(v, 1e-6, 1e9, &o->to.scale); break;
        case O_SPEEDUP: ok = cli_float(v, 1e-6, 1e9, &o->to.speedup); break;
        case O_TURNS: ok = cli_int(v, 1, 64, &o->to.turns); break;
        default: break;
        }
        if (!ok) {
            fprintf(stderr, "llmem replay: bad value '%s' for --%s\n", v, cli_opt_name(&p, c));
            return 2;
        }
    }
    if (o->logprobs && !o->output) {
        fprintf(stderr, "llmem replay: --logprobs goes with --output FILE.jsonl\n");
        return 2;
    }
    mo->precision = cli_precision_of(mo, CLI_PRECISION_FAST);
    return -1;
}

/* Every request must fit the KV pages alone, or preemption cannot help. */
static int check_fits(const replay *rp, llmem_memory *mem, int32_t page_size)
{
    llmem_memory_stats ms;
    llmem_memory_get_stats(mem, &ms);
    int64_t cap = ms.pages_total * page_size;
    for (int32_t i = 0; ms.pages_total > 0 && i < rp->n_req; i++)
        if (replay_req_max_len(rp, &rp->req[i]) > cap) {
            fprintf(stderr, "llmem replay: request %d needs %lld tokens of KV cache, more than "
                            "the %lld its pages hold; raise --n-pages or lower --scale, "
                            "--max-context or --max-gen\n",
                    i, (long long)replay_req_max_len(rp, &rp->req[i]), (long long)cap);
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
    if (!o.trace && !(o.trace = replay_data_path(TRACE_NAME, tbuf, sizeof tbuf))) {
        fprintf(stderr, "llmem replay: no trace found; pass --trace FILE.csv (format "
                        "TIMESTAMP,ContextTokens,GeneratedTokens)\n");
        return 2;
    }
    o.text = o.text ? o.text : replay_data_path(TEXT_NAME, xbuf, sizeof xbuf);
    replay rp = {.n_prefix = o.n_prefix};
    unsigned char *text_buf = NULL;
    sched s = {.rp = &rp, .check = o.check};
    report rep = {.pace = o.pace, .speedup = o.to.speedup, .params = mo.params,
                  .model = mo.model ? mo.model : "built-in"};
    llmem_backend *be = NULL;
    llmem_model *m = NULL;
    double *v = NULL;
    rc = replay_load_text(o.text, &rp, &text_buf);
    if (!rc)
        rc = replay_read_trace(o.trace, &o.to, &rp);
    if (!rc)
        rc = cli_open_model("replay", &mo, &be, &m);
    if (!rc && o.logprobs) {
        size_t n_gen = 0;
        for (int32_t i = 0; i < rp.n_req; i++)
            n_gen += (size_t)rp.req[i].n_gen;
        if (!(rp.lp = malloc((n_gen ? n_gen : 1) * sizeof *rp.lp))) {
            fprintf(stderr, "llmem replay: out of memory\n");
            rc = 1;
        }
        for (size_t i = 0, at = 0; !rc && i < (size_t)rp.n_req; at += (size_t)rp.req[i++].n_gen)
            rp.req[i].lp = rp.lp + at;
    }
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
    if (o.to.turns > 1)
        s.queued = calloc((size_t)rp.n_req, sizeof *s.queued);
    /* a first chunk may add its cached prefix to the step's budget */
    int64_t longest = 0;
    for (int32_t i = 0; i < rp.n_req; i++) {
        int64_t len = (int64_t)replay_n_prompt(&rp, &rp.req[i]) + rp.req[i].n_gen;
        longest = len > longest ? len : longest;
    }
    int64_t cap = (int64_t)s.n_seq + s.n_ubatch + (int64_t)s.n_seq * longest;
    if (cap > INT32_MAX || longest > INT32_MAX) {
        fprintf(stderr, "llmem replay: requests too long\n");
        rc = 1;
        goto done;
    }
    if (!s.running || !s.logits || !v || (o.to.turns > 1 && !s.queued) ||
        llmem_batch_buf_create((int32_t)cap, 1, &s.bb) != LLMEM_OK ||
        llmem_batch_buf_create((int32_t)(longest > 0 ? longest : 1), 1, &s.probe) != LLMEM_OK) {
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
    if ((rc = replay_serve(&s, o.pace, o.show, &rep.wall)))
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
    free(rp.lp);
    free(rp.req);
    free(text_buf);
    free(s.running);
    free(s.queued);
    free(s.logits);
    llmem_batch_buf_destroy(s.bb);
    llmem_batch_buf_destroy(s.probe);
    llmem_model_free(m);
    llmem_backend_close(be);
    return rc;
}

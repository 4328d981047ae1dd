/* llmem bench --bookkeeping: host-side cost of the memories' bookkeeping
 * (issue 10; DESIGN.md contract 9), no device work.
 *
 * Each configuration (memory, sequences N, cached tokens C, page size) fills
 * the memory once (one C-token prompt in sequence 0, then seq_cp to the
 * other N - 1 sequences: full pages are shared, every sequence holds C
 * tokens), then times decode steps of one token per sequence: plan,
 * apply + view (every layer), commit and release, each the median of
 * --reps steps after two warm-up steps. A last table times the plan of one
 * 128K-token prompt. Times are the thread's CPU time, so that other
 * processes sharing the cores do not count (--wall: wall-clock time).
 *
 * Host only: the CPU backend with a tiny geometry (one layer of one KV head
 * of 8 f16, one 8-float recurrent state) and no poison, so pools are
 * allocated but never touched (virtual memory only; LLMEM_POISON=1 would
 * touch them, unset it). The pool holds the shared prompt pages plus the
 * steps' own pages, not N * C tokens. Configurations whose host bookkeeping
 * (token ids, positions, page tables) would pass --max-gb are skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/cli/bench.h"
#include "llmem/hybrid.h"
#include "llmem/kv_cache.h"
#include "llmem/recurrent.h"

enum { BK_KV, BK_RS, BK_HY, BK_N };
static const char *const bk_names[BK_N] = {"kv_cache", "recurrent", "hybrid"};

typedef struct bk_opts {
    int32_t seqs[8], n_seqs, ctx[8], n_ctx, ps[8], n_ps;
    bool mem[BK_N], json, prompt;
    int32_t reps;
    int32_t seq_max; /* n_seq_max of the memories, at least the sequence count (0: equal) */
    double max_gb;
} bk_opts;

typedef struct bk_row {
    double plan, apply, commit, release, step; /* ms, medians */
    double step_mean, step_p99, step_max; /* ms, over the same steps (p99: nearest rank) */
} bk_row;

/* CPU time of this thread (default): what the bookkeeping costs, not
 * counting time other processes hold the cores; --wall: wall-clock time. */
static clockid_t bk_clock = CLOCK_THREAD_CPUTIME_ID;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(bk_clock, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int32_t n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int32_t div_up(int64_t a, int64_t b)
{
    return (int32_t)((a + b - 1) / b);
}

static llmem_status make_kv(llmem_backend *be, int32_t n_seq, int32_t n_pages, int32_t ps,
                            llmem_memory **out, char *err, size_t err_len)
{
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 8;
    p.page_size = ps;
    p.n_pages = n_pages;
    p.n_seq_max = n_seq;
    return llmem_kv_cache_create(be, &p, out, err, err_len);
}

static llmem_status make_rs(llmem_backend *be, int32_t n_seq, llmem_memory **out, char *err,
                            size_t err_len)
{
    static const llmem_state_desc d = {.name = "ssm", .n_dims = 1, .shape = {8},
                                       .dtype = LLMEM_DTYPE_F32};
    const llmem_state_desc *states[1] = {&d};
    const int32_t n_states[1] = {1};
    llmem_recurrent_params p = {.n_layers = 1, .n_states = n_states, .states = states,
                                .n_seq_max = n_seq, .n_ckpt = 1};
    return llmem_recurrent_create(be, &p, out, err, err_len);
}

/* Memory `kind` for n_seq sequences of up to `tokens` tokens each, of which
 * the first `shared` are one shared prompt; its n_seq_max is seq_max when
 * that is larger (the other ids stay empty). */
static llmem_status make_mem(llmem_backend *be, int kind, int32_t n_seq, int32_t seq_max,
                             int32_t shared, int32_t tokens, int32_t ps, llmem_memory **out)
{
    char err[256] = "";
    int64_t pages = (int64_t)div_up(shared, ps) + 1 +
                    (int64_t)n_seq * (div_up(tokens - shared, ps) + 2);
    if (pages > INT32_MAX / ps)
        return LLMEM_E_INVALID;
    llmem_memory *kv = NULL, *rs = NULL;
    llmem_status st = LLMEM_OK;
    int32_t nsm = seq_max > n_seq ? seq_max : n_seq;
    if (kind != BK_RS)
        st = make_kv(be, nsm, (int32_t)pages, ps, &kv, err, sizeof err);
    if (st == LLMEM_OK && kind != BK_KV)
        st = make_rs(be, nsm, &rs, err, sizeof err);
    if (st == LLMEM_OK && kind == BK_HY) {
        llmem_memory *children[2] = {kv, rs};
        const int32_t map[2] = {1, 0}; /* a Mamba layer, then an attention layer */
        st = llmem_hybrid_create(children, 2, map, 2, out, err, sizeof err);
        kv = rs = NULL; /* owned (or destroyed) by the hybrid */
    } else if (st == LLMEM_OK) {
        *out = kind == BK_KV ? kv : rs;
        return LLMEM_OK;
    }
    if (st != LLMEM_OK)
        fprintf(stderr, "llmem bench: %s\n", err);
    llmem_memory_destroy(kv);
    llmem_memory_destroy(rs);
    return st;
}

/* A batch of n tokens: token i in sequence seq0 + (one_seq ? 0 : i) at
 * position pos0 + (one_seq ? i : 0). */
typedef struct bk_batch {
    llmem_batch b;
    int32_t *tok, *pos, *ids, **ptr;
    int8_t *out;
} bk_batch;

static bool batch_init(bk_batch *x, int32_t n)
{
    memset(x, 0, sizeof *x);
    x->tok = malloc((size_t)n * sizeof *x->tok);
    x->pos = malloc((size_t)n * sizeof *x->pos);
    x->ids = malloc((size_t)n * sizeof *x->ids);
    x->ptr = malloc((size_t)n * sizeof *x->ptr);
    x->out = malloc((size_t)n);
    return x->tok && x->pos && x->ids && x->ptr && x->out;
}

static void batch_free(bk_batch *x)
{
    free(x->tok);
    free(x->pos);
    free(x->ids);
    free(x->ptr);
    free(x->out);
}

static const llmem_batch *batch_fill(bk_batch *x, int32_t n, bool one_seq, int32_t pos0,
                                     uint32_t salt)
{
    for (int32_t i = 0; i < n; i++) {
        x->tok[i] = (int32_t)((((uint32_t)i + salt) * 2654435761u) >> 17);
        x->pos[i] = pos0 + (one_seq ? i : 0);
        x->ids[i] = one_seq ? 0 : i;
        x->ptr[i] = &x->ids[i];
        x->out[i] = !one_seq || i == n - 1;
    }
    x->b = (llmem_batch){.n_tokens = n, .token = x->tok, .pos = x->pos,
                         .seq_id = (const int32_t *const *)x->ptr, .output = x->out};
    return &x->b;
}

/* One plan, every ubatch applied (views of every layer) and committed, then
 * released; adds the phases' times (ms) to t. */
static llmem_status run_plan(llmem_memory *mem, const llmem_batch *b, int32_t n_ubatch,
                             bool commit, bk_row *t)
{
    char err[256] = "";
    llmem_plan *plan = NULL;
    double t0 = now_ms();
    llmem_status st = llmem_memory_plan(mem, b, LLMEM_SPLIT_AUTO, n_ubatch, &plan, err, sizeof err);
    double t1 = now_ms();
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem bench: plan: %s (%s)\n", err, llmem_status_str(st));
        return st;
    }
    t->plan += t1 - t0;
    int32_t n_layers = llmem_memory_n_layers(mem);
    for (int32_t u = 0; commit && u < llmem_plan_n_ubatch(plan) && st == LLMEM_OK; u++) {
        const llmem_ubatch *ub;
        t0 = now_ms();
        st = llmem_memory_apply(mem, plan, u, &ub);
        for (int32_t il = 0; il < n_layers && st == LLMEM_OK; il++) {
            llmem_view v;
            st = llmem_memory_view(mem, il, &v);
        }
        t1 = now_ms();
        t->apply += t1 - t0;
        if (st == LLMEM_OK)
            st = llmem_memory_commit(mem, plan, u);
        t->commit += now_ms() - t1;
    }
    t0 = now_ms();
    llmem_memory_release(mem, plan);
    t->release += now_ms() - t0;
    return st;
}

/* Fills every sequence with ctx tokens, then times decode steps. */
static llmem_status bench_config(llmem_backend *be, int kind, int32_t n_seq, int32_t seq_max,
                                 int32_t ctx, int32_t ps, int32_t reps, bk_row *row)
{
    int32_t warm = 2, n_steps = warm + reps;
    llmem_memory *mem = NULL;
    llmem_status st = make_mem(be, kind, n_seq, seq_max, ctx, ctx + n_steps + 1, ps, &mem);
    if (st != LLMEM_OK)
        return st;
    int32_t chunk = 8192;
    bk_batch x;
    double *v[5] = {0};
    if (!batch_init(&x, chunk > n_seq ? chunk : n_seq))
        goto nomem;
    for (int i = 0; i < 5; i++)
        if (!(v[i] = malloc((size_t)reps * sizeof *v[i])))
            goto nomem;
    bk_row scratch = {0};
    for (int32_t p = 0; p < ctx && st == LLMEM_OK; p += chunk) {
        int32_t n = ctx - p < chunk ? ctx - p : chunk;
        st = run_plan(mem, batch_fill(&x, n, true, p, (uint32_t)p), chunk, true, &scratch);
    }
    for (int32_t s = 1; s < n_seq && st == LLMEM_OK; s++)
        st = llmem_memory_seq_cp(mem, 0, s, -1, -1);
    for (int32_t t = 0; t < n_steps && st == LLMEM_OK; t++) {
        bk_row r = {0};
        st = run_plan(mem, batch_fill(&x, n_seq, false, ctx + t, 7919u * (uint32_t)t), n_seq,
                      true, &r);
        if (t >= warm) {
            v[0][t - warm] = r.plan;
            v[1][t - warm] = r.apply;
            v[2][t - warm] = r.commit;
            v[3][t - warm] = r.release;
            v[4][t - warm] = r.plan + r.apply + r.commit + r.release;
        }
    }
    if (st == LLMEM_OK) {
        double sum = 0;
        for (int32_t i = 0; i < reps; i++)
            sum += v[4][i];
        /* median sorts v[4]: then its nearest-rank 99th percentile and max */
        *row = (bk_row){median(v[0], reps), median(v[1], reps), median(v[2], reps),
                        median(v[3], reps), median(v[4], reps), sum / reps,
                        v[4][(99 * reps + 99) / 100 - 1], v[4][reps - 1]};
    }
    goto out;
nomem:
    st = LLMEM_E_NO_MEMORY;
out:
    for (int i = 0; i < 5; i++)
        free(v[i]);
    batch_free(&x);
    llmem_memory_destroy(mem);
    return st;
}

/* Median plan time (ms) of one n-token prompt into an empty sequence. */
static llmem_status bench_prompt(llmem_backend *be, int kind, int32_t n, int32_t ps, int32_t reps,
                                 double *ms)
{
    llmem_memory *mem = NULL;
    llmem_status st = make_mem(be, kind, 1, 1, 0, n + 1, ps, &mem);
    if (st != LLMEM_OK)
        return st;
    bk_batch x;
    double *v = malloc((size_t)reps * sizeof *v);
    if (!v || !batch_init(&x, n)) {
        free(v);
        llmem_memory_destroy(mem);
        return LLMEM_E_NO_MEMORY;
    }
    const llmem_batch *b = batch_fill(&x, n, true, 0, 1);
    for (int32_t r = 0; r < reps && st == LLMEM_OK; r++) {
        bk_row t = {0};
        st = run_plan(mem, b, 2048, false, &t);
        v[r] = t.plan;
    }
    if (st == LLMEM_OK)
        *ms = median(v, reps);
    free(v);
    batch_free(&x);
    llmem_memory_destroy(mem);
    return st;
}

/* Host bytes the filled memory keeps: token ids per memory that keeps them
 * (the bench's positions are a run, which no memory stores: memory/seq_pos.h),
 * page-table entries (with the row slack). */
static double est_gb(int kind, int32_t n_seq, int32_t ctx, int32_t ps)
{
    double tok = (double)n_seq * ctx;
    double b = tok * 4.0 * (kind == BK_HY ? 2 : 1);
    if (kind != BK_RS)
        b += tok / ps * 4.0 * 3;
    return b / 1e9;
}

static bool parse_list(const char *s, int32_t *out, int32_t *n, int32_t lo, int32_t hi)
{
    *n = 0;
    while (*s && *n < 8) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            return false;
        if (*end == 'K' || *end == 'k') {
            v *= 1024;
            end++;
        }
        if (v < lo || v > hi || (*end && *end != ','))
            return false;
        out[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *n > 0 && !*s;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem bench --bookkeeping [--mem kv_cache,recurrent,hybrid] [--seqs LIST]\n"
            "                   [--ctx LIST] [--page LIST] [--reps N] [--max-gb X] [--no-prompt]\n"
            "                   [--seq-max N] [--wall] [--json]\n"
            "Host cost of plan / apply+view / commit / release per decode step (one token per\n"
            "sequence), medians of --reps steps (default 9); lists are comma-separated, K = 1024.\n"
            "Times are this thread's CPU time (--wall: wall-clock time). --json also gives each\n"
            "configuration's step_mean_ms, step_p99_ms (nearest rank) and step_max_ms over the\n"
            "same steps: a step that stands out (every sequence's token stage written at once)\n"
            "shows there, not in the medians. --seq-max N gives the memories n_seq_max N (when\n"
            "above the sequence count; the other ids stay empty): a step should cost the same\n"
            "at any n_seq_max.\n"
            "--mem takes kv_cache (or kv), recurrent (or rec) and hybrid, comma-separated.\n"
            "Defaults: --seqs 250,1000,4000 --ctx 1K,8K,64K,128K --page 1,16,64 --max-gb 6.\n");
}

/* --mem's comma-separated names, each a memory's name (kv_cache, recurrent,
 * hybrid) or its short form (kv, rec), exactly: sets mem[k] for the named
 * ones; false (with a message naming the item) for an empty item or any
 * other name. */
static bool parse_mems(const char *s, bool mem[BK_N])
{
    static const char *const short_names[BK_N] = {"kv", "rec", "hybrid"};
    memset(mem, 0, BK_N * sizeof *mem);
    for (const char *p = s;;) {
        size_t n = strcspn(p, ",");
        int hit = -1;
        for (int k = 0; k < BK_N && hit < 0; k++)
            if ((strlen(bk_names[k]) == n && !strncmp(p, bk_names[k], n)) ||
                (strlen(short_names[k]) == n && !strncmp(p, short_names[k], n)))
                hit = k;
        if (hit < 0) {
            fprintf(stderr,
                    "llmem bench: --mem: '%.*s' is not a memory (kv_cache or kv, recurrent or rec, "
                    "hybrid)\n",
                    (int)n, p);
            return false;
        }
        mem[hit] = true;
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static bool parse(int argc, char **argv, bk_opts *o)
{
    *o = (bk_opts){.seqs = {250, 1000, 4000}, .n_seqs = 3, .ctx = {1024, 8192, 65536, 131072},
                   .n_ctx = 4, .ps = {1, 16, 64}, .n_ps = 3, .mem = {true, true, true},
                   .prompt = true, .reps = 9, .max_gb = 6.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *nx = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "--bookkeeping"))
            continue;
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--wall")) {
            bk_clock = CLOCK_MONOTONIC;
        } else if (!strcmp(a, "--no-prompt")) {
            o->prompt = false;
        } else if (!strcmp(a, "--seqs") && nx) {
            ok = parse_list(argv[++i], o->seqs, &o->n_seqs, 1, 1 << 20);
        } else if (!strcmp(a, "--ctx") && nx) {
            ok = parse_list(argv[++i], o->ctx, &o->n_ctx, 1, 1 << 24);
        } else if (!strcmp(a, "--page") && nx) {
            ok = parse_list(argv[++i], o->ps, &o->n_ps, 1, 4096);
        } else if (!strcmp(a, "--seq-max") && nx) {
            int32_t n = 0;
            ok = parse_list(argv[++i], &o->seq_max, &n, 1, 1 << 20) && n == 1;
        } else if (!strcmp(a, "--reps") && nx) {
            int32_t n = 0;
            ok = parse_list(argv[++i], &o->reps, &n, 1, 1000) && n == 1;
        } else if (!strcmp(a, "--max-gb") && nx) {
            char *end;
            o->max_gb = strtod(argv[++i], &end);
            ok = *end == '\0' && o->max_gb > 0;
        } else if (!strcmp(a, "--mem") && nx) {
            ok = parse_mems(argv[++i], o->mem);
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "llmem bench: bad bookkeeping argument '%s'\n", a);
            usage(stderr);
            return false;
        }
    }
    return true;
}

int llmem_cli_bench_bookkeeping(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    bk_opts o;
    if (!parse(argc, argv, &o))
        return 2;
    llmem_backend *be = NULL;
    char err[256] = "";
    if (llmem_backend_open("cpu", -1, &be, err, sizeof err) != LLMEM_OK) {
        fprintf(stderr, "llmem bench: %s\n", err);
        return 1;
    }
    int total = 0, done = 0, rc = 0;
    for (int k = 0; k < BK_N; k++)
        total += o.mem[k] ? o.n_seqs * o.n_ctx * (k == BK_RS ? 1 : o.n_ps) : 0;
    if (o.json)
        printf("{\"steps\": [\n");
    else
        printf("%-9s %5s %7s %4s | %9s %9s %9s %9s | %9s %9s\n", "memory", "seqs", "ctx", "page",
               "plan ms", "apply ms", "commit ms", "rel ms", "step ms", "us/token");
    const char *sep = "";
    for (int k = 0; k < BK_N; k++)
        for (int32_t a = 0; o.mem[k] && a < o.n_ps; a++)
            for (int32_t c = 0; c < o.n_ctx; c++)
                for (int32_t s = 0; s < o.n_seqs; s++) {
                    int32_t n = o.seqs[s], ctx = o.ctx[c], ps = o.ps[a];
                    if (k == BK_RS && a > 0)
                        continue; /* no pages: page size does not apply */
                    fprintf(stderr, "\rbookkeeping [%d/%d] %s seqs %d ctx %d page %d ...   ",
                            ++done, total, bk_names[k], n, ctx, ps);
                    fflush(stderr);
                    bk_row r = {0};
                    double gb = est_gb(k, n, ctx, ps);
                    llmem_status st = gb > o.max_gb ? LLMEM_E_NO_SPACE
                                                    : bench_config(be, k, n, o.seq_max, ctx, ps,
                                                                   o.reps, &r);
                    if (st != LLMEM_OK && gb <= o.max_gb) {
                        fprintf(stderr, "\nllmem bench: %s seqs %d ctx %d page %d: %s\n",
                                bk_names[k], n, ctx, ps, llmem_status_str(st));
                        rc = 1;
                    }
                    if (o.json) {
                        if (st == LLMEM_OK)
                            printf("%s  {\"memory\": \"%s\", \"seqs\": %d, \"seq_max\": %d, "
                                   "\"ctx\": %d, \"page\": %d, \"plan_ms\": %.4f, "
                                   "\"apply_view_ms\": %.4f, \"commit_ms\": %.4f, "
                                   "\"release_ms\": %.4f, \"step_ms\": %.4f, \"us_per_token\": %.4f, "
                                   "\"step_mean_ms\": %.4f, \"step_p99_ms\": %.4f, "
                                   "\"step_max_ms\": %.4f}",
                                   sep, bk_names[k], n, n > o.seq_max ? n : o.seq_max, ctx, ps,
                                   r.plan, r.apply, r.commit, r.release, r.step, r.step * 1e3 / n,
                                   r.step_mean, r.step_p99, r.step_max);
                        else
                            printf("%s  {\"memory\": \"%s\", \"seqs\": %d, \"ctx\": %d, \"page\": %d, "
                                   "\"skipped\": \"%s\"}",
                                   sep, bk_names[k], n, ctx, ps,
                                   gb > o.max_gb ? "host memory over --max-gb" : "error");
                        sep = ",\n";
                    } else if (st == LLMEM_OK) {
                        printf("%-9s %5d %7d %4d | %9.3f %9.3f %9.3f %9.3f | %9.3f %9.3f\n",
                               bk_names[k], n, ctx, k == BK_RS ? 0 : ps, r.plan, r.apply,
                               r.commit, r.release, r.step, r.step * 1e3 / n);
                    } else {
                        printf("%-9s %5d %7d %4d | skipped (%s, ~%.1f GB host)\n", bk_names[k],
                               n, ctx, k == BK_RS ? 0 : ps,
                               gb > o.max_gb ? "over --max-gb" : "error", gb);
                    }
                    fflush(stdout);
                }
    if (o.json)
        printf("\n], \"prompt\": [\n");
    else if (o.prompt)
        printf("\nplan of one 131072-token prompt (n_ubatch 2048), ms:\n");
    sep = "";
    for (int k = 0; o.prompt && k < BK_N; k++)
        for (int32_t a = 0; o.mem[k] && a < o.n_ps; a++) {
            if (k == BK_RS && a > 0)
                continue;
            double ms = 0;
            fprintf(stderr, "\rbookkeeping: %s prompt plan, page %d ...               ", bk_names[k],
                    o.ps[a]);
            fflush(stderr);
            llmem_status st = bench_prompt(be, k, 131072, o.ps[a], 5, &ms);
            if (st != LLMEM_OK)
                rc = 1;
            if (o.json)
                printf("%s  {\"memory\": \"%s\", \"page\": %d, \"tokens\": 131072, \"plan_ms\": %.3f}",
                       sep, bk_names[k], o.ps[a], st == LLMEM_OK ? ms : -1.0);
            else
                printf("%-9s page %4d: %9.3f\n", bk_names[k], k == BK_RS ? 0 : o.ps[a],
                       st == LLMEM_OK ? ms : -1.0);
            sep = ",\n";
        }
    if (o.json)
        printf("\n]}\n");
    fprintf(stderr, "\rbookkeeping: done%60s\n", "");
    llmem_backend_close(be);
    return rc;
}

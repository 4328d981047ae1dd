/* llmem generate: streams text from a model. With --parallel N, N sequences
 * share the prompt's KV pages / state (evaluated once, then seq_cp) and
 * sample independently. Tokens are bytes for byte-level models (the
 * built-in one); other vocabularies print token ids. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/cli.h"
#include "examples/cli/common.h"
#include "llmem/model.h"

typedef struct sampler {
    double temp, top_p;
    int32_t top_k;
    uint64_t rng;
} sampler;

static double rng_uniform(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

static int cmp_cand(const void *a, const void *b)
{
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Greedy at temp 0; else top-k, then top-p (nucleus; Holtzman et al. 2020),
 * then sampling from the renormalized softmax(logits / temp). */
static int32_t sample(const sampler *sp, uint64_t *rng, const float *logits, int32_t V, cand *buf)
{
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (sp->temp <= 0)
        return best;
    for (int32_t i = 0; i < V; i++)
        buf[i] = (cand){logits[i], i};
    qsort(buf, (size_t)V, sizeof *buf, cmp_cand);
    int32_t n = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    double sum = 0, *p = malloc((size_t)n * sizeof *p);
    if (!p)
        return best;
    for (int32_t i = 0; i < n; i++)
        sum += p[i] = exp((double)(buf[i].logit - buf[0].logit) / sp->temp);
    double acc = 0;
    int32_t keep = n;
    for (int32_t i = 0; i < n; i++) {
        acc += p[i] / sum;
        if (acc >= sp->top_p) {
            keep = i + 1;
            break;
        }
    }
    double total = 0;
    for (int32_t i = 0; i < keep; i++)
        total += p[i];
    double r = rng_uniform(rng) * total;
    int32_t pick = buf[keep - 1].id;
    for (int32_t i = 0; i < keep; i++) {
        r -= p[i];
        if (r <= 0) {
            pick = buf[i].id;
            break;
        }
    }
    free(p);
    return pick;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem generate [options]\n"
            "\n"
            "Streams text from a model (default: the built-in byte-level Bamba model trained on\n"
            "Shakespeare). With --parallel N, N continuations of one prompt run at once; they\n"
            "share the prompt's KV pages and state, and each is printed when done.\n"
            "\n"
            "options:\n"
            "  --prompt TEXT        the prompt (default \"ROMEO:\\n\"); bytes for byte-level\n"
            "                       models, else a list of token ids like \"1 5 7\"\n"
            "  -n, --n-predict N    tokens to generate per sequence (default 200)\n"
            "  --parallel N         sequences generated at once (default 1)\n"
            "  --temp T             sampling temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K            keep the K most likely tokens, 0 = all (default 40)\n"
            "  --top-p P            nucleus sampling mass (default 0.95)\n"
            "  --seed S             random seed (default 42)\n"
            "  --stats              timing and memory statistics on stderr\n"
            "%s",
            cli_model_opts_help);
}

static void put_token(int32_t t, bool bytes, FILE *f)
{
    if (bytes)
        fputc(t, f);
    else
        fprintf(f, "%d ", t);
}

int llmem_cli_generate(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *prompt = "ROMEO:\n";
    int32_t n_predict = 200, parallel = 1, top_k = 40, seed = 42;
    double temp = 0.8, top_p = 0.95;
    bool stats = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt(&mo, "generate", argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--stats")) {
            stats = true;
            continue;
        } else if (!v) {
            fprintf(stderr, "llmem generate: unknown option '%s' or missing value (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--prompt")) {
            prompt = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            ok = cli_int(v, 0, 1 << 24, &n_predict);
        } else if (!strcmp(a, "--parallel")) {
            ok = cli_int(v, 1, 1 << 16, &parallel);
        } else if (!strcmp(a, "--top-k")) {
            ok = cli_int(v, 0, INT32_MAX, &top_k);
        } else if (!strcmp(a, "--seed")) {
            ok = cli_int(v, 0, INT32_MAX, &seed);
        } else if (!strcmp(a, "--temp")) {
            ok = cli_float(v, 0, 100, &temp);
        } else if (!strcmp(a, "--top-p")) {
            ok = cli_float(v, 0, 1, &top_p) && top_p > 0;
        } else {
            fprintf(stderr, "llmem generate: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "llmem generate: bad value '%s' for %s\n", v, a);
            return 2;
        }
        i++;
    }
    if (mo.params.n_seq_max < parallel)
        mo.params.n_seq_max = parallel;
    llmem_backend *be;
    llmem_model *m;
    if (cli_open_model("generate", &mo, &be, &m))
        return 1;
    int32_t V = llmem_model_n_vocab(m);
    bool bytes = V == 256;
    /* tokenize */
    int32_t n_prompt = 0, *ptok = malloc((strlen(prompt) + 1) * sizeof *ptok);
    int rc = 0;
    if (bytes) {
        for (const unsigned char *p = (const unsigned char *)prompt; *p; p++)
            ptok[n_prompt++] = *p;
    } else {
        for (char *s = (char *)prompt, *end; *s;) {
            long t = strtol(s, &end, 10);
            if (end == s)
                break;
            if (t < 0 || t >= V) {
                fprintf(stderr, "llmem generate: prompt token %ld outside [0, %d)\n", t, V);
                rc = 1;
                break;
            }
            ptok[n_prompt++] = (int32_t)t;
            s = end;
        }
    }
    if (!rc && n_prompt == 0) {
        fprintf(stderr, "llmem generate: empty prompt\n");
        rc = 1;
    }
    float *logits = malloc((size_t)parallel * (size_t)V * sizeof *logits);
    cand *cbuf = malloc((size_t)V * sizeof *cbuf);
    int32_t *last = malloc((size_t)parallel * sizeof *last);
    int32_t **out = calloc((size_t)parallel, sizeof *out);
    uint64_t *rng = malloc((size_t)parallel * sizeof *rng);
    llmem_batch_buf *bb = NULL;
    int32_t bcap = n_prompt > parallel ? n_prompt : parallel;
    if (!rc && (!logits || !cbuf || !last || !out || !rng ||
                llmem_batch_buf_create(bcap, 1, &bb) != LLMEM_OK)) {
        fprintf(stderr, "llmem generate: out of memory\n");
        rc = 1;
    }
    for (int32_t s = 0; !rc && s < parallel; s++) {
        out[s] = malloc((size_t)(n_predict > 0 ? n_predict : 1) * sizeof **out);
        rng[s] = (uint64_t)seed * 0x100000001b3ull + (uint64_t)s;
        if (!out[s])
            rc = 1;
    }
    sampler sp = {.temp = temp, .top_p = top_p, .top_k = top_k};
    llmem_memory *mem = llmem_model_memory(m);
    char err[512] = "";
    int32_t n_out = 0;
    double t0 = cli_now(), t_prompt = 0;
    if (!rc) {
        if (parallel == 1 && bytes)
            fputs(prompt, stdout);
        int32_t s0 = 0;
        for (int32_t i = 0; i < n_prompt; i++)
            llmem_batch_buf_add(bb, ptok[i], i, &s0, 1, i == n_prompt - 1);
        llmem_status st = llmem_model_decode(m, llmem_batch_buf_get(bb), false, logits, 1, &n_out,
                                             err, sizeof err);
        for (int32_t s = 1; st == LLMEM_OK && s < parallel; s++)
            st = llmem_memory_seq_cp(mem, 0, s, -1, -1); /* shares the prompt's pages */
        if (st != LLMEM_OK) {
            fprintf(stderr, "llmem generate: prompt: %s (%s)\n", err, llmem_status_str(st));
            rc = 1;
        }
        t_prompt = cli_now() - t0;
        for (int32_t s = 0; !rc && s < parallel && n_predict > 0; s++)
            last[s] = sample(&sp, &rng[s], logits, V, cbuf);
    }
    int32_t produced = 0;
    for (int32_t step = 0; !rc && step < n_predict; step++) {
        for (int32_t s = 0; s < parallel; s++)
            out[s][step] = last[s];
        produced = step + 1;
        if (parallel == 1) {
            put_token(last[0], bytes, stdout);
            fflush(stdout);
        }
        if (step + 1 == n_predict)
            break;
        llmem_batch_buf_clear(bb);
        for (int32_t s = 0; s < parallel; s++)
            llmem_batch_buf_add(bb, last[s], n_prompt + step, &s, 1, true);
        llmem_status st = llmem_model_decode(m, llmem_batch_buf_get(bb), false, logits, parallel,
                                             &n_out, err, sizeof err);
        if (st != LLMEM_OK) {
            fprintf(stderr, "\nllmem generate: step %d: %s (%s)\n", step, err, llmem_status_str(st));
            rc = 1;
            break;
        }
        for (int32_t s = 0; s < parallel; s++)
            last[s] = sample(&sp, &rng[s], logits + (size_t)s * (size_t)V, V, cbuf);
    }
    if (parallel == 1)
        putchar('\n');
    for (int32_t s = 0; parallel > 1 && s < parallel && !rc; s++) {
        printf("=== sequence %d ===\n", s);
        if (bytes)
            fputs(prompt, stdout);
        for (int32_t i = 0; i < produced; i++)
            put_token(out[s][i], bytes, stdout);
        printf("\n");
    }
    if (stats && !rc) {
        double dt = cli_now() - t0 - t_prompt;
        llmem_memory_stats ms;
        llmem_memory_get_stats(mem, &ms);
        fprintf(stderr,
                "prompt: %d tokens in %.3f s; generation: %d x %d tokens in %.3f s (%.1f tokens/s); "
                "KV pages used %lld (peak %lld) of %lld; backend %s\n",
                n_prompt, t_prompt, parallel, produced, dt,
                dt > 0 ? (double)parallel * produced / dt : 0.0, (long long)ms.pages_used,
                (long long)ms.pages_peak, (long long)ms.pages_total, llmem_backend_name(be));
    }
    for (int32_t s = 0; out && s < parallel; s++)
        free(out[s]);
    free(out);
    free(rng);
    free(last);
    free(cbuf);
    free(logits);
    free(ptok);
    llmem_batch_buf_destroy(bb);
    llmem_model_free(m);
    llmem_backend_close(be);
    return rc;
}

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

static int32_t argmax(const float *logits, int32_t V)
{
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* The sampling distribution of one row: softmax(logits / temp) restricted
 * to the top-k tokens, then to the smallest prefix whose mass reaches top_p
 * (nucleus sampling; Holtzman et al. 2020), renormalized. p[V] out. */
static void distribution(const sampler *sp, const float *logits, int32_t V, cand *buf, double *p)
{
    for (int32_t i = 0; i < V; i++) {
        buf[i] = (cand){logits[i], i};
        p[i] = 0;
    }
    qsort(buf, (size_t)V, sizeof *buf, cmp_cand);
    int32_t n = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)(buf[i].logit - buf[0].logit) / sp->temp);
    double acc = 0, kept = 0;
    for (int32_t i = 0; i < n; i++) {
        double q = exp((double)(buf[i].logit - buf[0].logit) / sp->temp) / sum;
        p[buf[i].id] = q;
        kept += q;
        acc += q;
        if (acc >= sp->top_p)
            break;
    }
    for (int32_t i = 0; i < V; i++)
        p[i] /= kept;
}

static int32_t draw(const double *p, int32_t V, double total, uint64_t *rng)
{
    double r = rng_uniform(rng) * total;
    int32_t last_nz = 0;
    for (int32_t i = 0; i < V; i++) {
        if (p[i] <= 0)
            continue;
        last_nz = i;
        r -= p[i];
        if (r < 0)
            return i;
    }
    return last_nz;
}

/* Prompt-lookup drafting (as in "prompt lookup decoding", Saxena 2023):
 * find the most recent earlier occurrence of the last n tokens (n from
 * max_ngram down to 1) and propose the tokens that followed it. Writes up to
 * k tokens to draft and returns how many were found. */
static int32_t lookup_draft(const int32_t *h, int32_t n_h, int32_t max_ngram, int32_t k,
                            int32_t *draft)
{
    for (int32_t n = max_ngram; n >= 1; n--) {
        if (n >= n_h)
            continue;
        for (int32_t i = n_h - n - 1; i >= 0; i--) {
            if (memcmp(h + i, h + n_h - n, (size_t)n * sizeof *h) != 0)
                continue;
            int32_t m = 0;
            for (int32_t j = i + n; j < n_h && m < k; j++)
                draft[m++] = h[j];
            if (m > 0)
                return m;
        }
    }
    return 0;
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
            "  --draft N            speculative decoding: verify N prompt-lookup draft tokens\n"
            "                       plus one per step, roll back the rejected ones (default 0;\n"
            "                       greedy output is identical to --draft 0)\n"
            "  --ngram K            longest n-gram the draft lookup matches (default 3)\n"
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

typedef struct gen_seq {
    int32_t *hist; /* prompt + every emitted token */
    int32_t n_hist;
    int32_t produced;  /* emitted tokens */
    int32_t pos_last;  /* position of hist[n_hist - 1] (not yet evaluated) */
    int32_t n_draft;   /* draft tokens in this step */
    int32_t draft[64];
    uint64_t rng;
    bool active;
} gen_seq;

typedef struct gen_stats {
    int64_t steps, drafted, accepted;
} gen_stats;

/* Verifies one sequence's step: rows[0..n_draft] are the logits after
 * [last, d1..dn]. Greedy: accept the longest prefix of drafts equal to the
 * argmax, then the argmax after it. Sampling: speculative rejection sampling
 * (Leviathan et al. 2023, Alg. 1; Chen et al. 2023) with a deterministic
 * draft: accept d_i with probability p_i(d_i), else sample from p_i with d_i
 * removed; if all are accepted, sample the bonus from p_n.
 * Writes the emitted tokens to out and returns how many (1 + accepted). */
static int32_t verify(const sampler *sp, gen_seq *q, const float *rows, int32_t V, cand *buf,
                      double *p, int32_t *out)
{
    int32_t j = 0;
    for (; j <= q->n_draft; j++) {
        const float *row = rows + (size_t)j * (size_t)V;
        if (sp->temp <= 0) {
            int32_t t = argmax(row, V);
            out[j] = t;
            if (j == q->n_draft || t != q->draft[j])
                return j + 1;
            continue;
        }
        distribution(sp, row, V, buf, p);
        if (j == q->n_draft) {
            out[j] = draw(p, V, 1.0, &q->rng);
            return j + 1;
        }
        int32_t d = q->draft[j];
        if (rng_uniform(&q->rng) < p[d]) {
            out[j] = d;
            continue;
        }
        double rest = 1.0 - p[d];
        p[d] = 0;
        out[j] = rest > 0 ? draw(p, V, rest, &q->rng) : d;
        return j + 1;
    }
    return j;
}

int llmem_cli_generate(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *prompt = "ROMEO:\n";
    int32_t n_predict = 200, parallel = 1, top_k = 40, seed = 42, n_draft = 0, ngram = 3;
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
        } else if (!strcmp(a, "--draft")) {
            ok = cli_int(v, 0, 64, &n_draft);
        } else if (!strcmp(a, "--ngram")) {
            ok = cli_int(v, 1, 64, &ngram);
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
    /* rollback needs a recurrent checkpoint after every draft token, and one
     * step of every sequence should fit one ubatch */
    mo.params.n_ckpt = n_draft;
    if (mo.params.n_ubatch < parallel * (n_draft + 1))
        mo.params.n_ubatch = parallel * (n_draft + 1);
    llmem_backend *be;
    llmem_model *m;
    if (cli_open_model("generate", &mo, &be, &m))
        return 1;
    int32_t V = llmem_model_n_vocab(m);
    bool bytes = V == 256;
    int32_t cap_hist = (int32_t)strlen(prompt) + n_predict + n_draft + 2;
    int32_t n_prompt = 0, *ptok = malloc((strlen(prompt) + 1) * sizeof *ptok);
    int rc = !ptok;
    if (bytes) {
        for (const unsigned char *c = (const unsigned char *)prompt; !rc && *c; c++)
            ptok[n_prompt++] = *c;
    } else {
        for (char *c = (char *)prompt, *end; !rc && *c;) {
            long t = strtol(c, &end, 10);
            if (end == c)
                break;
            if (t < 0 || t >= V) {
                fprintf(stderr, "llmem generate: prompt token %ld outside [0, %d)\n", t, V);
                rc = 1;
                break;
            }
            ptok[n_prompt++] = (int32_t)t;
            c = end;
        }
    }
    if (!rc && n_prompt == 0) {
        fprintf(stderr, "llmem generate: empty prompt\n");
        rc = 1;
    }
    int32_t rows_max = parallel * (n_draft + 1);
    float *logits = malloc((size_t)rows_max * (size_t)V * sizeof *logits);
    double *prob = malloc((size_t)V * sizeof *prob);
    cand *cbuf = malloc((size_t)V * sizeof *cbuf);
    int32_t *emit = malloc((size_t)(n_draft + 1) * sizeof *emit);
    gen_seq *seqs = calloc((size_t)parallel, sizeof *seqs);
    llmem_batch_buf *bb = NULL;
    int32_t bcap = n_prompt > rows_max ? n_prompt : rows_max;
    if (!rc && (!logits || !prob || !cbuf || !emit || !seqs ||
                llmem_batch_buf_create(bcap, 1, &bb) != LLMEM_OK))
        rc = 1;
    for (int32_t s = 0; !rc && s < parallel; s++) {
        gen_seq *q = &seqs[s];
        if (!(q->hist = malloc((size_t)cap_hist * sizeof *q->hist))) {
            rc = 1;
            break;
        }
        memcpy(q->hist, ptok, (size_t)n_prompt * sizeof *ptok);
        q->n_hist = n_prompt;
        q->rng = (uint64_t)seed * 0x100000001b3ull + (uint64_t)s;
        q->active = n_predict > 0;
    }
    sampler sp = {.temp = temp, .top_p = top_p, .top_k = top_k};
    llmem_memory *mem = llmem_model_memory(m);
    char err[512] = "";
    int32_t n_out = 0;
    gen_stats gs = {0};
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
        for (int32_t s = 0; !rc && s < parallel && n_predict > 0; s++) {
            gen_seq *q = &seqs[s];
            q->n_draft = 0;
            verify(&sp, q, logits, V, cbuf, prob, emit); /* the first token */
            q->hist[q->n_hist++] = emit[0];
            q->produced = 1;
            q->pos_last = n_prompt;
            q->active = q->produced < n_predict;
            if (parallel == 1)
                put_token(emit[0], bytes, stdout);
        }
    }
    for (;;) {
        if (rc)
            break;
        llmem_batch_buf_clear(bb);
        int32_t n_active = 0;
        for (int32_t s = 0; s < parallel; s++) {
            gen_seq *q = &seqs[s];
            if (!q->active)
                continue;
            n_active++;
            q->n_draft = n_draft ? lookup_draft(q->hist, q->n_hist, ngram, n_draft, q->draft) : 0;
            /* equal draft lengths keep one step of every sequence in one ubatch */
            for (int32_t k = q->n_draft; k < n_draft; k++)
                q->draft[k] = q->n_draft ? q->draft[q->n_draft - 1] : q->hist[q->n_hist - 1];
            gs.drafted += q->n_draft;
            q->n_draft = n_draft;
            llmem_batch_buf_add(bb, q->hist[q->n_hist - 1], q->pos_last, &s, 1, true);
            for (int32_t k = 0; k < n_draft; k++)
                llmem_batch_buf_add(bb, q->draft[k], q->pos_last + 1 + k, &s, 1, true);
        }
        if (n_active == 0)
            break;
        llmem_status st = llmem_model_decode(m, llmem_batch_buf_get(bb), false, logits, rows_max,
                                             &n_out, err, sizeof err);
        if (st != LLMEM_OK) {
            fprintf(stderr, "\nllmem generate: %s (%s)\n", err, llmem_status_str(st));
            rc = 1;
            break;
        }
        gs.steps++;
        int32_t row = 0;
        for (int32_t s = 0; s < parallel && !rc; s++) {
            gen_seq *q = &seqs[s];
            if (!q->active)
                continue;
            int32_t n_emit = verify(&sp, q, logits + (size_t)row * (size_t)V, V, cbuf, prob, emit);
            row += n_draft + 1;
            gs.accepted += n_emit - 1;
            /* keep [last, accepted drafts]; drop the rejected drafts' KV slots and
             * switch the recurrent state to the checkpoint after the last kept token */
            if (n_draft && (st = llmem_memory_seq_rm(mem, s, q->pos_last + n_emit, -1)) != LLMEM_OK) {
                fprintf(stderr, "\nllmem generate: rollback failed: %s\n", llmem_status_str(st));
                rc = 1;
                break;
            }
            q->pos_last += n_emit;
            for (int32_t k = 0; k < n_emit && q->produced < n_predict; k++) {
                q->hist[q->n_hist++] = emit[k];
                q->produced++;
                if (parallel == 1)
                    put_token(emit[k], bytes, stdout);
            }
            if (parallel == 1)
                fflush(stdout);
            q->active = q->produced < n_predict;
        }
    }
    if (parallel == 1 && !rc)
        putchar('\n');
    for (int32_t s = 0; parallel > 1 && s < parallel && !rc; s++) {
        printf("=== sequence %d ===\n", s);
        for (int32_t i = 0; i < seqs[s].n_hist; i++)
            put_token(seqs[s].hist[i], bytes, stdout);
        printf("\n");
    }
    if (stats && !rc) {
        double dt = cli_now() - t0 - t_prompt;
        int64_t total = 0;
        for (int32_t s = 0; s < parallel; s++)
            total += seqs[s].produced;
        llmem_memory_stats ms;
        llmem_memory_get_stats(mem, &ms);
        fprintf(stderr,
                "prompt: %d tokens in %.3f s; generation: %lld tokens in %.3f s, %.3f ms per token "
                "(%.1f tokens/s); %lld steps, %.2f tokens per sequence-step",
                n_prompt, t_prompt, (long long)total, dt, total ? 1e3 * dt / (double)total : 0.0,
                dt > 0 ? (double)total / dt : 0.0, (long long)gs.steps,
                gs.steps ? (double)(total - parallel) / (double)gs.steps / parallel : 0.0);
        if (n_draft)
            fprintf(stderr, "; draft %d: %lld drafted, %lld accepted (acceptance %.1f%%)", n_draft,
                    (long long)gs.drafted, (long long)gs.accepted,
                    gs.drafted ? 100.0 * (double)gs.accepted / (double)gs.drafted : 0.0);
        fprintf(stderr, "; KV pages peak %lld of %lld; backend %s\n", (long long)ms.pages_peak,
                (long long)ms.pages_total, llmem_backend_name(be));
    }
    for (int32_t s = 0; seqs && s < parallel; s++)
        free(seqs[s].hist);
    free(seqs);
    free(emit);
    free(cbuf);
    free(prob);
    free(logits);
    free(ptok);
    llmem_batch_buf_destroy(bb);
    llmem_model_free(m);
    llmem_backend_close(be);
    return rc;
}

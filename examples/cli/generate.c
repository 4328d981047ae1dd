/* llmem generate: streams text from a model. With --parallel N, N sequences
 * share the prompt's KV pages / state (evaluated once, then seq_cp) and
 * sample independently. Text goes through the model's tokenizer.json when
 * its folder has one, bytes for byte-level models (the built-in one), else
 * token ids (examples/cli/text.c).
 *
 * Admission: when a step does not fit the memory, the highest-numbered
 * running sequence is suspended (its sequence removed, its pages freed) and
 * the step retried; a suspended sequence is recomputed from its history
 * when another one finishes (vLLM's recompute preemption, Kwon et al.,
 * SOSP 2023). Only one sequence alone that does not fit is an error.
 *
 * A NaN or an infinity in a row of logits (broken weights, an overflow)
 * stops the run with an error, as score, replay and serve do: a sample
 * drawn from such a row is noise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/cli.h"
#include "examples/cli/common.h"
#include "examples/cli/sample.h"
#include "examples/cli/text.h"
#include "llmem/model.h"

#define MAX_STOPS 16

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
            "  -p, --prompt TEXT    the prompt (default \"ROMEO:\\n\"), read with the model's\n"
            "                       tokenizer.json, or as bytes by byte-level models\n"
            "  -f, --file FILE      read the prompt text from FILE ('-': stdin)\n"
            "  --prompt-ids IDS     the prompt as token ids, like \"1 5 7\"\n"
            "  -n, --n-predict N    tokens to generate per sequence (default 200)\n"
            "  --parallel N         sequences generated at once (default 1); --n-seq-max\n"
            "                       grows to N and --n-ubatch to N * (draft + 1) when not\n"
            "                       given; a smaller value given is refused\n"
            "  --temp T             sampling temperature, 0 = greedy (default 0.8);\n"
            "                       --temp 0 and --temp=0 both work\n"
            "  --top-k K            keep the K most likely tokens, 0 = all (default 40)\n"
            "  --top-p P            nucleus sampling mass (default 0.95)\n"
            "  --min-p P            drop tokens below P times the top one's probability\n"
            "                       (default 0 = off)\n"
            "  --repeat-penalty R   divide the logits of recent tokens by R (default 1 = off)\n"
            "  --repeat-last-n N    tokens of history the penalty looks at (default 64)\n"
            "  --host-sampling      download the logits and sample on the host (the default\n"
            "                       samples on the device and downloads only the token ids,\n"
            "                       unless --repeat-penalty is on)\n"
            "  --stop STR           end a sequence when its text reaches STR (not printed);\n"
            "                       repeatable. The tokenizer's end-of-generation tokens\n"
            "                       always end it\n"
            "  -s, --seed S         random seed (default 42)\n"
            "  --draft N            speculative decoding: verify N prompt-lookup draft tokens\n"
            "                       plus one per step, roll back the rejected ones (default 0;\n"
            "                       greedy output is identical to --draft 0; on a GPU up to a\n"
            "                       near-tie: tests/spec.sh)\n"
            "  --ngram K            longest n-gram the draft lookup matches (default 3)\n"
            "  --stats              timing and memory statistics on stderr\n"
            "  --context-shift      at the context limit, drop the older half of the text\n"
            "                       after the first page and go on (attention-only models;\n"
            "                       one sequence, no --draft), as llama.cpp does\n"
            "%s%s%s",
            cli_log_opts_help, cli_model_opts_help, cli_backend_opts_help);
}

typedef struct gen_opts {
    const char *prompt, *file, *ids;
    int32_t n_predict, parallel, seed, n_draft, ngram;
    const char *stops[MAX_STOPS];
    int n_stops;
    bool stats, host_sampling, context_shift;
    sampler sp;
} gen_opts;

/* Returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, cli_model_opts *mo, gen_opts *o)
{
    enum {
        O_PIDS = CLI_OPT_OWN, O_PARALLEL, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REPPEN, O_REPN,
        O_STOP, O_DRAFT, O_NGRAM, O_STATS, O_HOST, O_SHIFT,
    };
    static const struct option own[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"file", required_argument, NULL, 'f'},
        {"prompt-ids", required_argument, NULL, O_PIDS},
        {"n-predict", required_argument, NULL, 'n'},
        {"parallel", required_argument, NULL, O_PARALLEL},
        {"temp", required_argument, NULL, O_TEMP},
        {"top-k", required_argument, NULL, O_TOPK},
        {"top-p", required_argument, NULL, O_TOPP},
        {"min-p", required_argument, NULL, O_MINP},
        {"repeat-penalty", required_argument, NULL, O_REPPEN},
        {"repeat-last-n", required_argument, NULL, O_REPN},
        {"stop", required_argument, NULL, O_STOP},
        {"seed", required_argument, NULL, 's'},
        {"draft", required_argument, NULL, O_DRAFT},
        {"ngram", required_argument, NULL, O_NGRAM},
        {"stats", no_argument, NULL, O_STATS},
        {"host-sampling", no_argument, NULL, O_HOST},
        {"context-shift", no_argument, NULL, O_SHIFT},
        {0},
    };
    cli_parser p;
    cli_parser_init(&p, "generate", argc, argv, own, "p:f:n:s:",
                    CLI_GROUP_LOG | CLI_GROUP_BACKEND | CLI_GROUP_MODEL);
    const char *v, *name = NULL;
    for (int c; (c = cli_next_own(&p, mo, &v)) != -1;) {
        if (c == '?')
            return 2;
        bool ok = true;
        sampler *sp = &o->sp;
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'p': o->prompt = v; break;
        case 'f': o->file = v; break;
        case O_PIDS: o->ids = v; break;
        case O_STATS: o->stats = true; break;
        case O_HOST: o->host_sampling = true; break;
        case O_SHIFT: o->context_shift = true; break;
        case O_STOP:
            ok = o->n_stops < MAX_STOPS && v[0];
            if (ok)
                o->stops[o->n_stops++] = v;
            name = "--stop (at most 16, not empty)";
            break;
        case 'n': ok = cli_int(v, 0, 1 << 24, &o->n_predict); name = "-n/--n-predict"; break;
        case O_PARALLEL: ok = cli_int(v, 1, 1 << 16, &o->parallel); name = "--parallel"; break;
        case O_DRAFT: ok = cli_int(v, 0, 64, &o->n_draft); name = "--draft"; break;
        case O_NGRAM: ok = cli_int(v, 1, 64, &o->ngram); name = "--ngram"; break;
        case O_TOPK: ok = cli_int(v, 0, INT32_MAX, &sp->top_k); name = "--top-k"; break;
        case 's': ok = cli_int(v, 0, INT32_MAX, &o->seed); name = "-s/--seed"; break;
        case O_REPN: ok = cli_int(v, 0, 1 << 20, &sp->repeat_last_n); name = "--repeat-last-n"; break;
        case O_TEMP: ok = cli_float(v, 0, 100, &sp->temp); name = "--temp"; break;
        case O_TOPP: ok = cli_float(v, 0, 1, &sp->top_p) && sp->top_p > 0; name = "--top-p"; break;
        case O_MINP: ok = cli_float(v, 0, 1, &sp->min_p); name = "--min-p"; break;
        case O_REPPEN:
            ok = cli_float(v, 0, 100, &sp->repeat_penalty) && sp->repeat_penalty > 0;
            name = "--repeat-penalty";
            break;
        default: break;
        }
        if (!ok) {
            fprintf(stderr, "llmem generate: bad value '%s' for %s\n", v, name);
            return 2;
        }
    }
    if (!!o->prompt + !!o->file + !!o->ids > 1) {
        fprintf(stderr, "llmem generate: give one of --prompt, --file and --prompt-ids\n");
        return 2;
    }
    if (o->context_shift && (o->n_draft > 0 || o->parallel > 1)) {
        /* the shift would never run (one sequence, no drafts): say so now */
        fprintf(stderr, "llmem generate: --context-shift works with one sequence and no "
                        "--draft\n");
        return 2;
    }
    mo->precision = cli_precision_of(mo, CLI_PRECISION_FAST);
    return -1;
}

/* The prompt's token ids, from --prompt-ids, --file or --prompt. */
static int prompt_tokens(const gen_opts *o, const cli_text *tx, int32_t **ids, int32_t *n)
{
    if (o->ids)
        return cli_parse_ids("generate", o->ids, tx->n_vocab, ids, n);
    if (o->file) {
        size_t len = 0;
        char *text = cli_read_file("generate", "the prompt file", o->file, &len);
        if (!text)
            return 1;
        int rc = cli_text_encode("generate", tx, text, len, ids, n);
        free(text);
        return rc;
    }
    const char *p = o->prompt ? o->prompt : "ROMEO:\n";
    return cli_text_encode("generate", tx, p, strlen(p), ids, n);
}

/* Whether the n floats at x are all finite. */
static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}

/* The error for a non-finite row of sequence s after position pos. */
static void non_finite(int32_t s, int32_t pos)
{
    fprintf(stderr,
            "\nllmem generate: sequence %d: the logits after position %d are not finite (NaN "
            "or infinity); --check-tensors scans the weights for such values\n",
            (int)s, (int)pos);
}

typedef struct gen_stats {
    int64_t steps, drafted, accepted, suspensions;
} gen_stats;

/* Recomputes suspended sequences (their history but the last token) while
 * they fit. Returns 0, or 1 after an error message. */
static int resume(llmem_model *m, llmem_batch_buf *bb, gen_seq *seqs, int32_t parallel)
{
    char err[512] = "";
    for (int32_t s = 0; s < parallel; s++) {
        gen_seq *q = &seqs[s];
        if (!q->suspended)
            continue;
        llmem_batch_buf_clear(bb);
        for (int32_t i = 0; i < q->pos_last; i++)
            llmem_batch_buf_add(bb, q->hist[i], i, &s, 1, false);
        int32_t n_out = 0;
        llmem_status st = llmem_model_decode(m, llmem_batch_buf_get(bb), false, NULL, 0, &n_out,
                                             err, sizeof err);
        if (st == LLMEM_E_NO_SPACE)
            return 0; /* still no room: wait for the next sequence to finish */
        if (st != LLMEM_OK) {
            fprintf(stderr, "\nllmem generate: resuming sequence %d: %s (%s)\n", s, err,
                    llmem_status_str(st));
            return 1;
        }
        q->suspended = false;
        q->active = true;
    }
    return 0;
}

int llmem_cli_generate(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    gen_opts o = {.n_predict = 200, .parallel = 1, .seed = 42, .ngram = 3,
                  .sp = {.temp = 0.8, .top_p = 0.95, .top_k = 40, .repeat_penalty = 1.0,
                         .repeat_last_n = 64}};
    int rc = parse_args(argc, argv, &mo, &o);
    if (rc >= 0)
        return rc;
    int32_t parallel = o.parallel, n_draft = o.n_draft, n_predict = o.n_predict;
    /* rollback needs a recurrent checkpoint after every draft token, and one
     * step of every sequence should fit one ubatch; sizes the user chose
     * that cannot hold that are refused, defaults grow */
    int32_t step_rows = parallel * (n_draft + 1);
    if (mo.params.n_seq_max < parallel && cli_model_opt_given(&mo, CLI_OPT_N_SEQ_MAX)) {
        fprintf(stderr, "llmem generate: --n-seq-max %d is below --parallel %d (one sequence "
                        "each); raise it or leave it out\n", (int)mo.params.n_seq_max,
                (int)parallel);
        return 2;
    }
    if (mo.params.n_ubatch < step_rows && cli_model_opt_given(&mo, CLI_OPT_N_UBATCH)) {
        fprintf(stderr, "llmem generate: --n-ubatch %d is below --parallel * (--draft + 1) = %d "
                        "(one step of every sequence in one ubatch); raise it or leave it out\n",
                (int)mo.params.n_ubatch, (int)step_rows);
        return 2;
    }
    if (mo.params.n_seq_max < parallel)
        mo.params.n_seq_max = parallel;
    mo.params.n_ckpt = n_draft;
    if (mo.params.n_ubatch < step_rows)
        mo.params.n_ubatch = step_rows;
    llmem_backend *be;
    llmem_model *m;
    int orc = cli_open_model("generate", &mo, &be, &m);
    if (orc)
        return orc;
    int32_t V = llmem_model_n_vocab(m);
    cli_text tx = {0};
    int32_t n_prompt = 0, *ptok = NULL;
    rc = cli_text_open("generate", mo.model, V, &tx) || prompt_tokens(&o, &tx, &ptok, &n_prompt);
    if (!rc && n_prompt == 0) {
        fprintf(stderr, "llmem generate: empty prompt\n");
        rc = 1;
    }
    if (!rc)
        cli_logf(CLI_LOG_INFO, "generate", "prompt: %d tokens", (int)n_prompt);
    int32_t cap_hist = n_prompt + n_predict + n_draft + 2;
    int32_t rows_max = step_rows;
    /* device sampling (only the ids cross to the host) unless a host-only
     * feature is on; the prompt's first token is sampled on the host */
    bool dev = o.sp.repeat_penalty == 1.0 && !o.host_sampling;
    float *logits = malloc((size_t)(dev ? 1 : rows_max) * (size_t)V * sizeof *logits);
    int32_t *emit = malloc((size_t)(n_draft + 1) * sizeof *emit);
    int32_t *ids = malloc((size_t)rows_max * 2 * sizeof *ids), *ctr = ids ? ids + rows_max : NULL;
    float *lps = malloc((size_t)rows_max * sizeof *lps); /* NaN there: non-finite logits */
    llmem_model_sampling smp = {.params = {.temperature = (float)o.sp.temp, .top_k = o.sp.top_k,
                                           .top_p = (float)o.sp.top_p, .min_p = (float)o.sp.min_p,
                                           .seed = (uint64_t)o.seed},
                                .ctr = ctr, .ids = ids, .logprob = lps};
    gen_seq *seqs = calloc((size_t)parallel, sizeof *seqs);
    cli_out *outs = calloc((size_t)parallel, sizeof *outs);
    llmem_batch_buf *bb = NULL;
    int32_t bcap = cap_hist > rows_max ? cap_hist : rows_max;
    if (!rc && (!logits || !emit || !ids || !lps || !seqs || !outs || sampler_init(&o.sp, V) ||
                llmem_batch_buf_create(bcap, 1, &bb) != LLMEM_OK))
        rc = 1;
    for (int32_t s = 0; !rc && s < parallel; s++) {
        gen_seq *q = &seqs[s];
        if (!(q->hist = malloc((size_t)cap_hist * sizeof *q->hist)) ||
            cli_out_init(&outs[s], &tx, ptok, n_prompt, o.stops, o.n_stops,
                         parallel == 1 ? stdout : NULL)) {
            rc = 1;
            break;
        }
        memcpy(q->hist, ptok, (size_t)n_prompt * sizeof *ptok);
        q->n_hist = n_prompt;
        q->rng = (uint64_t)o.seed * 0x100000001b3ull + (uint64_t)s;
        q->active = n_predict > 0;
    }
    sampler *sp = &o.sp;
    llmem_memory *mem = llmem_model_memory(m);
    char err[512] = "";
    int32_t n_out = 0;
    gen_stats gs = {0};
    double t0 = cli_now(), t_prompt = 0;
    if (!rc) {
        int32_t s0 = 0;
        for (int32_t i = 0; i < n_prompt; i++)
            llmem_batch_buf_add(bb, ptok[i], i, &s0, 1, i == n_prompt - 1);
        llmem_status st = llmem_model_decode(m, llmem_batch_buf_get(bb), false, logits, 1, &n_out,
                                             err, sizeof err);
        for (int32_t s = 1; st == LLMEM_OK && s < parallel; s++)
            st = llmem_memory_seq_cp(mem, 0, s, -1, -1); /* shares the prompt's pages */
        if (st != LLMEM_OK) {
            fprintf(stderr, "llmem generate: prompt: %s (%s)%s\n", err, llmem_status_str(st),
                    st == LLMEM_E_NO_SPACE ? "; raise --n-pages or -c/--n-ctx" : "");
            rc = 1;
        }
        t_prompt = cli_now() - t0;
        if (!rc && n_predict > 0 && !all_finite(logits, (size_t)V)) {
            non_finite(0, n_prompt - 1);
            rc = 1;
        }
        for (int32_t s = 0; !rc && s < parallel && n_predict > 0; s++) {
            gen_seq *q = &seqs[s];
            q->n_draft = 0;
            verify(sp, q, logits, emit); /* the first token */
            q->hist[q->n_hist++] = emit[0];
            q->produced = 1;
            q->pos_last = n_prompt;
            bool stop = cli_out_push(&outs[s], emit[0]); /* printed even when -n is 1 */
            q->active = q->produced < n_predict && !stop;
        }
    }
    while (!rc) {
        llmem_batch_buf_clear(bb);
        int32_t n_active = 0, n_waiting = 0, last = -1;
        for (int32_t s = 0; s < parallel; s++) {
            gen_seq *q = &seqs[s];
            n_waiting += q->suspended;
            if (!q->active)
                continue;
            n_active++;
            last = s;
            q->n_draft = n_draft ? lookup_draft(q->hist, q->n_hist, o.ngram, n_draft, q->draft) : 0;
            gs.drafted += q->n_draft;
            /* equal draft lengths keep one step of every sequence in one ubatch */
            for (int32_t k = q->n_draft; k < n_draft; k++)
                q->draft[k] = q->n_draft ? q->draft[q->n_draft - 1] : q->hist[q->n_hist - 1];
            q->n_draft = n_draft;
            llmem_batch_buf_add(bb, q->hist[q->n_hist - 1], q->pos_last, &s, 1, true);
            for (int32_t k = 0; k < n_draft; k++)
                llmem_batch_buf_add(bb, q->draft[k], q->pos_last + 1 + k, &s, 1, true);
            /* the draw of a row depends on its sequence and predicted position only */
            for (int32_t k = 0; k <= n_draft; k++)
                ctr[(n_active - 1) * (n_draft + 1) + k] =
                    (int32_t)((uint32_t)(q->pos_last + 1 + k) * (uint32_t)parallel + (uint32_t)s);
        }
        if (n_active == 0 && n_waiting > 0) {
            fprintf(stderr, "\nllmem generate: a suspended sequence does not fit the memory "
                            "alone; raise --n-pages\n");
            rc = 1;
            break;
        }
        if (n_active == 0)
            break;
        llmem_status st =
            dev ? llmem_model_decode_sample(m, llmem_batch_buf_get(bb), &smp, rows_max, &n_out, err,
                                            sizeof err)
                : llmem_model_decode(m, llmem_batch_buf_get(bb), false, logits, rows_max, &n_out,
                                     err, sizeof err);
        if (st == LLMEM_E_NO_SPACE && o.context_shift && n_active == 1 && n_draft == 0) {
            /* context shift (issue 13): keep the first page, drop the
             * older half of the rest in whole pages, move the tail back
             * (the memory re-rotates its keys) and retry the step */
            gen_seq *q = &seqs[last];
            int32_t ps = mo.params.page_size, keep = ps;
            int32_t disc = (q->pos_last - keep) / 2 / ps * ps;
            st = disc > 0 ? llmem_memory_seq_rm(mem, last, keep, keep + disc) : LLMEM_E_NO_SPACE;
            if (st == LLMEM_OK)
                st = llmem_memory_seq_add(mem, last, keep + disc, -1, -disc);
            if (st == LLMEM_OK) {
                q->pos_last -= disc;
                cli_logf(CLI_LOG_INFO, "generate", "context shift: dropped %d tokens", (int)disc);
                continue;
            }
            fprintf(stderr, "\nllmem generate: context shift: %s%s\n", llmem_status_str(st),
                    st == LLMEM_E_STATE ? " (a model with recurrent layers cannot drop the middle "
                                          "of its history)" : "");
            rc = 1;
            break;
        }
        if (st == LLMEM_E_NO_SPACE && n_active > 1) {
            /* no room for every sequence's step: suspend the last one */
            gen_seq *q = &seqs[last];
            if ((st = llmem_memory_seq_rm(mem, last, -1, -1)) != LLMEM_OK) {
                fprintf(stderr, "\nllmem generate: seq_rm: %s\n", llmem_status_str(st));
                rc = 1;
                break;
            }
            q->active = false;
            q->suspended = true;
            gs.suspensions++;
            cli_logf(CLI_LOG_INFO, "generate", "no room for every sequence: suspended sequence %d",
                     (int)last);
            continue;
        }
        if (st != LLMEM_OK) {
            fprintf(stderr, "\nllmem generate: %s (%s)%s\n", err, llmem_status_str(st),
                    st == LLMEM_E_NO_SPACE ? "; raise --n-pages or -c/--n-ctx" : "");
            rc = 1;
            break;
        }
        gs.steps++;
        int32_t row = 0;
        bool finished = false;
        for (int32_t s = 0; s < parallel && !rc; s++) {
            gen_seq *q = &seqs[s];
            if (!q->active)
                continue;
            const float *rows = logits + (size_t)row * (size_t)V;
            if (dev ? !all_finite(lps + row, (size_t)n_draft + 1)
                    : !all_finite(rows, (size_t)(n_draft + 1) * (size_t)V)) {
                non_finite(s, q->pos_last);
                rc = 1;
                break;
            }
            int32_t n_emit = dev ? verify_ids(q, ids + row, emit) : verify(sp, q, rows, emit);
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
            bool stop = false;
            for (int32_t k = 0; k < n_emit && q->produced < n_predict && !stop; k++) {
                q->hist[q->n_hist++] = emit[k];
                q->produced++;
                stop = cli_out_push(&outs[s], emit[k]);
            }
            q->active = q->produced < n_predict && !stop;
            if (!q->active && parallel > 1) {
                finished = true; /* its pages can go to a suspended sequence */
                llmem_memory_seq_rm(mem, s, -1, -1);
            }
        }
        if (!rc && finished && gs.suspensions > 0)
            rc = resume(m, bb, seqs, parallel);
    }
    for (int32_t s = 0; s < parallel && !rc; s++) {
        if (parallel > 1)
            printf("=== sequence %d ===\n", s);
        cli_out_finish(&outs[s]);
        if (parallel > 1)
            fwrite(outs[s].buf, 1, outs[s].len, stdout);
        if (outs[s].len == 0 || outs[s].buf[outs[s].len - 1] != '\n')
            putchar('\n');
    }
    fflush(stdout);
    if (o.stats && !rc) {
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
        fprintf(stderr, "; KV pages peak %lld of %lld; %lld suspensions; backend %s\n",
                (long long)ms.pages_peak, (long long)ms.pages_total, (long long)gs.suspensions,
                llmem_backend_name(be));
    }
    for (int32_t s = 0; seqs && s < parallel; s++) {
        free(seqs[s].hist);
        if (outs)
            cli_out_free(&outs[s]);
    }
    free(seqs);
    free(outs);
    free(emit);
    free(ids);
    free(lps);
    free(logits);
    free(ptok);
    sampler_free(&o.sp);
    cli_text_close(&tx);
    llmem_batch_buf_destroy(bb);
    llmem_model_free(m);
    llmem_backend_close(be);
    return rc;
}

/* llmem score: log p(tokens[i+1] | tokens[0..i]) for every case of a JSONL
 * file, with every case in flight at once up to --n-seq-max sequences
 * (continuous batching: a finished case frees its sequence for the next). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/cli.h"
#include "examples/cli/common.h"
#include "models/hf_json.h"

typedef struct score_case {
    cJSON *id;
    int32_t *tok;
    int32_t n;
    double *lp;   /* [n - 1] */
    int32_t done; /* tokens submitted so far */
    bool finished;
} score_case;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem score --input FILE.jsonl [options]\n"
            "\n"
            "Reads one JSON object per line with \"id\" and \"tokens\" (a list of token ids;\n"
            "other fields are ignored) and prints, one line per case in input order,\n"
            "  {\"id\": <id>, \"logprobs\": [...]}\n"
            "where logprobs[i] = log p(tokens[i+1] | tokens[0..i]) (len(tokens) - 1 values).\n"
            "Cases run together, up to --n-seq-max sequences at a time.\n"
            "\n"
            "options:\n"
            "  -i, --input FILE     the cases (required; '-' reads stdin)\n"
            "  --stats              one JSON line of statistics on stderr at the end\n"
            "%s%s%s",
            cli_log_opts_help, cli_model_opts_help, cli_backend_opts_help);
}

static int read_cases(const char *path, score_case **out, int32_t *n_out, int32_t n_vocab)
{
    FILE *f = cli_open_input("score", "the input", path, true);
    if (!f)
        return 1;
    score_case *cases = NULL;
    int32_t n = 0, cap = 0, line_no = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &lcap, f)) >= 0 && !rc) {
        line_no++;
        bool blank = true;
        for (ssize_t k = 0; k < len && blank; k++)
            blank = line[k] == ' ' || line[k] == '\t' || line[k] == '\n' || line[k] == '\r';
        if (blank)
            continue;
        /* one JSON text as json.loads reads it: no bytes after the object, no
         * name twice ("tokens" twice: json.loads keeps the last, cJSON the first) */
        cJSON *j = NULL;
        hf_json_where w;
        hf_json_fault jf = hf_json_read(line, (size_t)len, &j, &w);
        if (jf != HF_JSON_OK) {
            char why[128];
            fprintf(stderr, "llmem score: %s:%d: %s\n", path, line_no,
                    hf_json_describe(jf, &w, why, sizeof why));
            rc = 1;
            break;
        }
        cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
        cJSON *toks = j ? cJSON_GetObjectItemCaseSensitive(j, "tokens") : NULL;
        if (!j || !cJSON_IsObject(j) || !id || !cJSON_IsArray(toks)) {
            fprintf(stderr, "llmem score: %s:%d: expected an object with \"id\" and a \"tokens\" list\n",
                    path, line_no);
            cJSON_Delete(j);
            rc = 1;
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            score_case *nc = realloc(cases, (size_t)cap * sizeof *nc);
            if (!nc) {
                cJSON_Delete(j);
                rc = 1;
                break;
            }
            cases = nc;
        }
        score_case *c = &cases[n];
        memset(c, 0, sizeof *c);
        c->n = cJSON_GetArraySize(toks);
        c->tok = malloc((size_t)(c->n > 0 ? c->n : 1) * sizeof *c->tok);
        c->lp = malloc((size_t)(c->n > 1 ? c->n - 1 : 1) * sizeof *c->lp);
        c->id = cJSON_Duplicate(id, 1);
        n++;
        int32_t k = 0;
        cJSON *t;
        cJSON_ArrayForEach(t, toks) {
            double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
            if (!cJSON_IsNumber(t) || v != (double)(int32_t)v || v < 0 || v >= n_vocab) {
                fprintf(stderr, "llmem score: %s:%d: tokens[%d] = %g is not an id in [0, %d)\n",
                        path, line_no, k, v, n_vocab);
                rc = 1;
                break;
            }
            c->tok[k++] = (int32_t)v;
        }
        cJSON_Delete(j);
    }
    free(line);
    if (f != stdin)
        fclose(f);
    *out = cases;
    *n_out = n;
    return rc;
}

static void free_cases(score_case *c, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        cJSON_Delete(c[i].id);
        free(c[i].tok);
        free(c[i].lp);
    }
    free(c);
}

static void print_case(const score_case *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "id", cJSON_Duplicate(c->id, 1));
    cJSON *a = cJSON_AddArrayToObject(o, "logprobs");
    for (int32_t i = 0; i + 1 < c->n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(c->lp[i]));
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

int llmem_cli_score(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *input = NULL;
    bool stats = false;
    enum { O_STATS = CLI_OPT_OWN };
    static const struct option own[] = {
        {"input", required_argument, NULL, 'i'},
        {"stats", no_argument, NULL, O_STATS},
        {0},
    };
    cli_parser pr;
    cli_parser_init(&pr, "score", argc, argv, own, "i:",
                    CLI_GROUP_LOG | CLI_GROUP_BACKEND | CLI_GROUP_MODEL);
    const char *arg;
    for (int c; (c = cli_next_own(&pr, &mo, &arg)) != -1;) {
        if (c == '?')
            return 2;
        if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (c == 'i') {
            input = arg;
        } else if (c == O_STATS) {
            stats = true;
        }
    }
    mo.precision = cli_precision_of(&mo, CLI_PRECISION_PRECISE);
    if (!input) {
        fprintf(stderr, "llmem score: --input FILE is required (see llmem score --help)\n");
        return 2;
    }
    llmem_backend *be;
    llmem_model *m;
    int orc = cli_open_model("score", &mo, &be, &m);
    if (orc)
        return orc;
    int32_t V = llmem_model_n_vocab(m), n_cases = 0;
    score_case *cases = NULL;
    int rc = read_cases(input, &cases, &n_cases, V);
    llmem_memory *mem = llmem_model_memory(m);
    int32_t n_seq = mo.params.n_seq_max, budget = mo.params.n_ubatch;
    int32_t *slot_case = malloc((size_t)n_seq * sizeof *slot_case);
    int64_t *slot_order = malloc((size_t)n_seq * sizeof *slot_order);
    int32_t *requeue = malloc((size_t)(n_cases > 0 ? n_cases : 1) * sizeof *requeue);
    int32_t *row_case = malloc((size_t)budget * sizeof *row_case);
    int32_t *row_pos = malloc((size_t)budget * sizeof *row_pos);
    float *out = malloc((size_t)budget * (size_t)V * sizeof *out);
    llmem_batch_buf *bb = NULL;
    if (!rc && (!slot_case || !slot_order || !requeue || !row_case || !row_pos || !out ||
                llmem_batch_buf_create(budget, 1, &bb) != LLMEM_OK)) {
        fprintf(stderr, "llmem score: out of memory\n");
        rc = 1;
    }
    for (int32_t s = 0; slot_case && s < n_seq; s++)
        slot_case[s] = -1;
    /* requeue: cases taken off their sequence to free pages, most recent on
     * top; they run again (from their start) before any new case */
    int32_t next = 0, printed = 0, active = 0, n_requeue = 0;
    int64_t admissions = 0, preemptions = 0;
    bool admit = true;
    double t0 = cli_now();
    int32_t step_budget = budget;
    while (!rc && (next < n_cases || active > 0 || n_requeue > 0)) {
        /* admit cases into free sequences, unless memory pressure paused that */
        for (int32_t s = 0; s < n_seq && admit; s++) {
            if (slot_case[s] >= 0)
                continue;
            while (next < n_cases && cases[next].n <= 1)
                cases[next++].finished = true; /* nothing to predict */
            if (n_requeue == 0 && next == n_cases)
                break;
            slot_case[s] = n_requeue > 0 ? requeue[--n_requeue] : next++;
            slot_order[s] = admissions++;
            active++;
        }
        if (active == 0 && n_requeue == 0)
            break;
        if (active == 0) {
            admit = true;
            continue;
        }
        /* a chunk of every active case, fairly, within the token budget */
        llmem_batch_buf_clear(bb);
        int32_t per = (step_budget + active - 1) / active, left = step_budget, rows = 0;
        for (int32_t s = 0; s < n_seq && left > 0; s++) {
            int32_t ci = slot_case[s];
            if (ci < 0)
                continue;
            score_case *c = &cases[ci];
            int32_t k = c->n - c->done;
            k = k < per ? k : per;
            k = k < left ? k : left;
            for (int32_t t = 0; t < k; t++) {
                int32_t p = c->done + t;
                bool o = p + 1 < c->n;
                llmem_batch_buf_add(bb, c->tok[p], p, &s, 1, o);
                if (o) {
                    row_case[rows] = ci;
                    row_pos[rows++] = p;
                }
            }
            left -= k;
        }
        char err[512] = "";
        int32_t n_out = 0;
        llmem_status st = llmem_model_decode(m, llmem_batch_buf_get(bb), true, out, budget, &n_out,
                                             err, sizeof err);
        if (st == LLMEM_E_NO_SPACE && step_budget > 1) {
            step_budget = (step_budget + 1) / 2; /* memory pressure: smaller steps */
            continue;
        }
        if (st == LLMEM_E_NO_SPACE && active > 1) {
            /* still no room: the most recently admitted case waits (its pages
             * freed, recomputed later) and no new case starts until one ends */
            int32_t victim = -1;
            for (int32_t s = 0; s < n_seq; s++)
                if (slot_case[s] >= 0 && (victim < 0 || slot_order[s] > slot_order[victim]))
                    victim = s;
            llmem_memory_seq_rm(mem, victim, -1, -1);
            cases[slot_case[victim]].done = 0;
            requeue[n_requeue++] = slot_case[victim];
            slot_case[victim] = -1;
            active--;
            preemptions++;
            admit = false;
            step_budget = budget;
            cli_logf(CLI_LOG_INFO, "score", "memory full: case %d waits for pages",
                     (int)requeue[n_requeue - 1]);
            continue;
        }
        if (st != LLMEM_OK) {
            fprintf(stderr, "llmem score: %s (%s)%s\n", err, llmem_status_str(st),
                    st == LLMEM_E_NO_SPACE ? "; one case alone does not fit: raise --n-pages" : "");
            rc = 1;
            break;
        }
        step_budget = budget;
        for (int32_t r = 0; r < n_out && !rc; r++) {
            score_case *c = &cases[row_case[r]];
            double lp = out[(size_t)r * (size_t)V + (size_t)c->tok[row_pos[r] + 1]];
            if (!isfinite(lp)) {
                char *id = cJSON_PrintUnformatted(c->id);
                fprintf(stderr, "llmem score: case %d (id %s): log-prob %d is %g, not finite; "
                                "the checkpoint's weights or config may be damaged\n",
                        (int)row_case[r] + 1, id ? id : "?", (int)row_pos[r], lp);
                free(id);
                rc = 1;
            }
            c->lp[row_pos[r]] = lp;
        }
        /* advance, finish, free sequences */
        const llmem_batch *b = llmem_batch_buf_get(bb);
        for (int32_t i = 0; i < b->n_tokens; i++) {
            int32_t s = b->seq_id[i][0];
            cases[slot_case[s]].done++;
        }
        for (int32_t s = 0; s < n_seq; s++) {
            int32_t ci = slot_case[s];
            if (ci < 0 || cases[ci].done < cases[ci].n)
                continue;
            cases[ci].finished = true;
            llmem_memory_seq_rm(mem, s, -1, -1);
            slot_case[s] = -1;
            active--;
            admit = true;
        }
        while (!rc && printed < n_cases && cases[printed].finished)
            print_case(&cases[printed++]);
        fflush(stdout);
    }
    while (!rc && printed < n_cases)
        print_case(&cases[printed++]);
    if (stats && !rc) {
        double dt = cli_now() - t0;
        llmem_memory_stats ms;
        llmem_model_stats st;
        llmem_memory_get_stats(mem, &ms);
        llmem_model_get_stats(m, &st);
        fprintf(stderr,
                "{\"pages_total\": %lld, \"pages_peak\": %lld, \"prefix_hit_tokens\": %lld, "
                "\"ubatches\": %lld, \"tokens\": %lld, \"tokens_per_second\": %.1f, "
                "\"preemptions\": %lld, \"backend\": \"%s\"}\n",
                (long long)ms.pages_total, (long long)ms.pages_peak,
                (long long)ms.prefix_hit_tokens, (long long)st.n_ubatch, (long long)st.n_tokens,
                dt > 0 ? (double)st.n_tokens / dt : 0.0, (long long)preemptions,
                llmem_backend_name(be));
    }
    llmem_batch_buf_destroy(bb);
    free(slot_case);
    free(slot_order);
    free(requeue);
    free(row_case);
    free(row_pos);
    free(out);
    free_cases(cases, n_cases);
    llmem_model_free(m);
    llmem_backend_close(be);
    return rc;
}

/* llmem tokenize: text to token ids and back with a Hugging Face
 * tokenizer.json.
 *
 *   llmem tokenize --tokenizer PATH --input FILE.jsonl   one {"text": ...} a line
 *   llmem tokenize --tokenizer PATH --text STR
 *
 * Writes one {"ids": [...], "decoded": "..."} line per input, in order;
 * "decoded" is the decode of ids with special tokens kept. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/common.h"
#include "models/hf_json.h"
#include "llmem/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem tokenize --tokenizer PATH (--input FILE.jsonl | --text STR) [options]\n"
            "\n"
            "  --tokenizer PATH   tokenizer.json, or a folder holding one (and tokenizer_config.json)\n"
            "  --input FILE       JSON lines {\"text\": ...}; '-' reads standard input\n"
            "  --text STR         one string\n"
            "  --no-add-special   do not add BOS/EOS (add_special_tokens=False)\n"
            "  --no-parse-special encode special tokens written in the text as plain text\n"
            "  --stats            print encode throughput (MB/s, encode calls only) to stderr\n"
            "  -h, --help         this text\n"
            "\n"
            "BOS/EOS are added and special tokens in the text parsed unless turned off.\n"
            "Writes one {\"ids\": [...], \"decoded\": \"...\"} line per input, in order.\n");
}

typedef struct opts {
    bool add_special, parse_special;
    double enc_s;
    size_t enc_bytes;
} opts;

static int one(const llmem_tokenizer *tok, const char *text, size_t len, opts *o)
{
    char err[512] = "";
    int32_t *ids = NULL, n = 0;
    char *dec = NULL;
    size_t dlen = 0;
    double t0 = cli_now();
    llmem_status st = llmem_tokenizer_encode(tok, text, len, o->add_special, o->parse_special, &ids, &n, err,
                                             sizeof err);
    o->enc_s += cli_now() - t0;
    o->enc_bytes += len;
    if (st == LLMEM_OK)
        st = llmem_tokenizer_decode(tok, ids, n, true, &dec, &dlen, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem tokenize: %s (%s)\n", err, llmem_status_str(st));
        free(ids);
        return 1;
    }
    cJSON *js = cJSON_CreateString(dec);
    char *s = js ? cJSON_PrintUnformatted(js) : NULL;
    fputs("{\"ids\": [", stdout);
    for (int32_t i = 0; i < n; i++)
        printf(i ? ", %d" : "%d", ids[i]);
    printf("], \"decoded\": %s}\n", s ? s : "null");
    free(s);
    cJSON_Delete(js);
    free(ids);
    free(dec);
    return 0;
}

int llmem_cli_tokenize(int argc, char **argv)
{
    enum { O_TOKENIZER = CLI_OPT_OWN, O_INPUT, O_TEXT, O_NO_ADD, O_NO_PARSE, O_STATS };
    static const struct option own[] = {
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"input", required_argument, NULL, O_INPUT},
        {"text", required_argument, NULL, O_TEXT},
        {"no-add-special", no_argument, NULL, O_NO_ADD},
        {"no-parse-special", no_argument, NULL, O_NO_PARSE},
        {"stats", no_argument, NULL, O_STATS},
        {0},
    };
    const char *path = NULL, *input = NULL, *text = NULL;
    bool stats = false;
    opts o = {.add_special = true, .parse_special = true};
    cli_parser p;
    cli_parser_init(&p, "tokenize", argc, argv, own, "", 0);
    const char *v;
    for (int c; (c = cli_next(&p, &v)) != -1;) {
        switch (c) {
        case O_TOKENIZER: path = v; break;
        case O_INPUT: input = v; break;
        case O_TEXT: text = v; break;
        case O_NO_ADD: o.add_special = false; break;
        case O_NO_PARSE: o.parse_special = false; break;
        case O_STATS: stats = true; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* cli_next said why */
        }
    }
    if (!path || (!input && !text) || (input && text)) {
        fprintf(stderr, "llmem tokenize: need --tokenizer and exactly one of --input or --text\n");
        usage(stderr);
        return 2;
    }
    char err[512] = "";
    llmem_tokenizer *tok = NULL;
    llmem_status st = llmem_tokenizer_load(path, &tok, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem tokenize: %s (%s)\n", err, llmem_status_str(st));
        return 1;
    }
    int rc = 0;
    if (text) {
        rc = one(tok, text, strlen(text), &o);
    } else {
        FILE *f = cli_open_input("tokenize", "the input", input, true);
        if (!f) { /* missing, a directory, ...: the message is out */
            llmem_tokenizer_destroy(tok);
            return 1;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        long lineno = 0;
        while (rc == 0 && (n = getline(&line, &cap, f)) != -1) {
            lineno++;
            if (n <= 1 && (n == 0 || line[0] == '\n'))
                continue;
            /* one JSON text as json.loads reads it; a "text" holding \u0000
             * would reach the tokenizer cut at the NUL */
            cJSON *js = NULL;
            hf_json_where w;
            hf_json_fault jf = hf_json_read(line, (size_t)n, &js, &w);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(js, "text");
            if (jf != HF_JSON_OK) {
                char why[128];
                fprintf(stderr, "llmem tokenize: %s line %ld: %s\n", input, lineno,
                        hf_json_describe(jf, &w, why, sizeof why));
                rc = 1;
            } else if (!cJSON_IsString(t)) {
                fprintf(stderr, "llmem tokenize: %s line %ld: expected {\"text\": string}\n", input, lineno);
                rc = 1;
            } else {
                rc = one(tok, t->valuestring, strlen(t->valuestring), &o);
            }
            cJSON_Delete(js);
        }
        free(line);
        if (rc == 0 && ferror(f)) {
            fprintf(stderr, "llmem tokenize: cannot read %s\n", input);
            rc = 1;
        }
        if (f != stdin)
            fclose(f);
    }
    if (stats && o.enc_s > 0)
        fprintf(stderr, "llmem tokenize: encoded %.3f MB in %.3f s: %.2f MB/s\n", (double)o.enc_bytes / 1e6,
                o.enc_s, (double)o.enc_bytes / 1e6 / o.enc_s);
    fflush(stdout);
    llmem_tokenizer_destroy(tok);
    return rc;
}

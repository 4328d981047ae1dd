/* llmem command line: text in and text out for one model (see text.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/cli/common.h"
#include "examples/cli/text.h"

int cli_text_open(const char *cmd, const char *model_dir, int32_t n_vocab, cli_text *t)
{
    memset(t, 0, sizeof *t);
    t->n_vocab = n_vocab;
    char path[4096];
    int n = model_dir ? snprintf(path, sizeof path, "%s/tokenizer.json", model_dir) : -1;
    if (n > 0 && (size_t)n < sizeof path && access(path, F_OK) == 0) {
        char err[512] = "";
        llmem_status st = llmem_tokenizer_load(model_dir, &t->tok, err, sizeof err);
        if (st != LLMEM_OK) {
            fprintf(stderr, "llmem %s: cannot load the tokenizer '%s': %s (%s)\n", cmd, path,
                    err[0] ? err : "no reason given", llmem_status_str(st));
            return 1;
        }
        int32_t tv = llmem_tokenizer_n_vocab(t->tok);
        if (tv > n_vocab) {
            fprintf(stderr, "llmem %s: the tokenizer '%s' has ids up to %d, more than the "
                            "model's vocabulary of %d\n", cmd, path, tv - 1, n_vocab);
            cli_text_close(t);
            return 1;
        }
        t->kind = CLI_TEXT_TOKENIZER;
        cli_logf(CLI_LOG_INFO, cmd, "text through '%s' (%d ids, BOS %d, EOS %d)", path, (int)tv,
                 (int)llmem_tokenizer_bos(t->tok), (int)llmem_tokenizer_eos(t->tok));
        return 0;
    }
    t->kind = n_vocab == 256 ? CLI_TEXT_BYTES : CLI_TEXT_IDS;
    cli_logf(CLI_LOG_INFO, cmd, "no tokenizer.json: text is %s",
             t->kind == CLI_TEXT_BYTES ? "bytes (a 256-entry vocabulary)" : "token ids");
    return 0;
}

void cli_text_close(cli_text *t)
{
    llmem_tokenizer_destroy(t->tok);
    t->tok = NULL;
}

int cli_parse_ids(const char *cmd, const char *s, int32_t n_vocab, int32_t **ids, int32_t *n)
{
    static const char sep[] = " \t\r\n,";
    size_t cap = strlen(s) / 2 + 1;
    int32_t *v = malloc(cap * sizeof *v), k = 0;
    if (!v) {
        fprintf(stderr, "llmem %s: out of memory\n", cmd);
        return 1;
    }
    for (const char *p = s + strspn(s, sep); *p; p += strspn(p, sep)) {
        size_t w = strcspn(p, sep);
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end != p + w || errno || x < 0 || x >= n_vocab || (*p != '+' && (*p < '0' || *p > '9'))) {
            fprintf(stderr, "llmem %s: token %d of the prompt ids, '%.*s', is not an id in "
                            "[0, %d)\n", cmd, (int)k + 1, (int)(w < 40 ? w : 40), p, n_vocab);
            free(v);
            return 1;
        }
        v[k++] = (int32_t)x;
        p += w;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cli_text_encode(const char *cmd, const cli_text *t, const char *text, size_t len,
                    int32_t **ids, int32_t *n)
{
    *ids = NULL;
    *n = 0;
    if (t->kind == CLI_TEXT_IDS) {
        fprintf(stderr, "llmem %s: the model has no tokenizer.json and a vocabulary of %d, so "
                        "it cannot read text; give token ids with --prompt-ids \"1 5 7\"\n",
                cmd, t->n_vocab);
        return 1;
    }
    if (t->kind == CLI_TEXT_BYTES) {
        int32_t *v = malloc((len ? len : 1) * sizeof *v);
        if (!v || len > INT32_MAX) {
            free(v);
            fprintf(stderr, "llmem %s: the prompt is too long\n", cmd);
            return 1;
        }
        for (size_t i = 0; i < len; i++)
            v[i] = (unsigned char)text[i];
        *ids = v;
        *n = (int32_t)len;
        return 0;
    }
    char err[512] = "";
    llmem_status st = llmem_tokenizer_encode(t->tok, text, len, true, true, ids, n, err,
                                             sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem %s: cannot tokenize the prompt: %s (%s)\n", cmd,
                err[0] ? err : "no reason given", llmem_status_str(st));
        return 1;
    }
    return 0;
}

static bool append(cli_out *o, const char *s, size_t n)
{
    if (o->len + n + 1 > o->cap) {
        size_t cap = (o->len + n + 1) * 2;
        char *b = realloc(o->buf, cap);
        if (!b)
            return false;
        o->buf = b;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
    return true;
}

/* Pushes id through the detokenizer (flushes it when id < 0) and appends
 * what comes out; a held byte run can be longer than the small buffer. */
static bool detok_step(cli_out *o, int32_t id)
{
    char small[256];
    size_t got = 0;
    llmem_status st = id >= 0 ? llmem_detok_push(o->detok, id, small, sizeof small, &got)
                              : llmem_detok_flush(o->detok, small, sizeof small, &got);
    if (st == LLMEM_E_NO_SPACE) {
        char *big = malloc(got);
        st = !big ? LLMEM_E_NO_MEMORY
             : id >= 0 ? llmem_detok_push(o->detok, id, big, got, &got)
                       : llmem_detok_flush(o->detok, big, got, &got);
        bool ok = st == LLMEM_OK && append(o, big, got);
        free(big);
        return ok;
    }
    return st == LLMEM_OK && append(o, small, got);
}

/* Appends the text of one token. */
static bool add_token(cli_out *o, int32_t id)
{
    if (o->t->kind == CLI_TEXT_BYTES) {
        char c = (char)(unsigned char)id;
        return append(o, &c, 1);
    }
    if (o->t->kind == CLI_TEXT_IDS) {
        char s[16];
        int k = snprintf(s, sizeof s, "%d ", (int)id);
        return append(o, s, (size_t)k);
    }
    return detok_step(o, id);
}

static void emit(cli_out *o, size_t upto)
{
    if (o->f && upto > o->printed) {
        fwrite(o->buf + o->printed, 1, upto - o->printed, o->f);
        fflush(o->f);
    }
    if (upto > o->printed)
        o->printed = upto;
}

int cli_out_init(cli_out *o, const cli_text *t, const int32_t *prompt, int32_t n_prompt,
                 const char *const *stops, int n_stops, FILE *f)
{
    memset(o, 0, sizeof *o);
    o->t = t;
    o->stops = stops;
    o->n_stops = n_stops;
    o->f = f;
    if (t->kind == CLI_TEXT_TOKENIZER && llmem_detok_create(t->tok, false, &o->detok) != LLMEM_OK)
        return 1;
    if (!append(o, "", 0))
        return 1;
    for (int32_t i = 0; i < n_prompt; i++)
        if (!add_token(o, prompt[i]))
            return 1;
    o->gen_start = o->len;
    emit(o, o->len);
    return 0;
}

bool cli_out_push(cli_out *o, int32_t id)
{
    if (o->stopped)
        return true;
    if (o->t->kind == CLI_TEXT_TOKENIZER && llmem_tokenizer_is_eog(o->t->tok, id)) {
        o->stopped = true;
        return true;
    }
    size_t before = o->len;
    if (!add_token(o, id)) {
        o->stopped = true; /* out of memory: end the text where it is */
        return true;
    }
    /* a stop string can only complete in text that ends in the new bytes */
    size_t held = o->len; /* where the printable text ends */
    for (int k = 0; k < o->n_stops; k++) {
        size_t m = strlen(o->stops[k]);
        if (m == 0)
            continue;
        size_t from = before >= o->gen_start + m ? before - m + 1 : o->gen_start;
        for (size_t i = from; i + m <= o->len; i++)
            if (!memcmp(o->buf + i, o->stops[k], m)) {
                o->len = i;
                o->buf[i] = '\0';
                o->stopped = true;
                emit(o, i);
                return true;
            }
        /* hold back the longest tail that may still become this stop string */
        for (size_t n = m - 1; n > 0; n--) {
            if (n > o->len - o->gen_start)
                continue;
            if (!memcmp(o->buf + o->len - n, o->stops[k], n)) {
                if (o->len - n < held)
                    held = o->len - n;
                break;
            }
        }
    }
    emit(o, held);
    return false;
}

void cli_out_finish(cli_out *o)
{
    if (o->detok && !o->stopped)
        detok_step(o, -1); /* what the detokenizer still holds (a byte run, a tail) */
    emit(o, o->len);
}

void cli_out_free(cli_out *o)
{
    llmem_detok_destroy(o->detok);
    free(o->buf);
    memset(o, 0, sizeof *o);
}

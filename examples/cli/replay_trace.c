/* llmem replay: reading the request trace (Azure LLM inference format) and
 * the prompt text, and the tokens of each request's sequence. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "examples/cli/common.h"
#include "examples/cli/replay.h"

const char *replay_data_path(const char *name, char *buf, size_t cap)
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

/* Reads 1 to max_digits decimal digits at *p as a value <= hi, advancing
 * *p; false on anything else. Bounded, so no conversion can overflow. */
static bool digits(const char **p, int max_digits, long long hi, long long *out)
{
    long long v = 0;
    int n = 0;
    for (; n < max_digits && **p >= '0' && **p <= '9'; n++, (*p)++)
        v = v * 10 + (**p - '0');
    *out = v;
    return n > 0 && v <= hi;
}

static bool expect(const char **p, char c)
{
    return **p == c ? (++*p, true) : false;
}

/* One row "2023-11-16 18:15:46.6805900,374,44": the time in seconds since
 * 1970 (UTC, proleptic Gregorian; H. Hinnant's days_from_civil) and the
 * two lengths. Years 0-9999 (so the day count cannot overflow), lengths up
 * to 2^30. */
static bool parse_row(const char *line, double *t, int32_t *ctx, int32_t *gen)
{
    long long y, mo, d, h, mi, s, c, g;
    const char *p = line;
    if (!digits(&p, 4, 9999, &y) || !expect(&p, '-') || !digits(&p, 2, 12, &mo) || mo < 1 ||
        !expect(&p, '-') || !digits(&p, 2, 31, &d) || d < 1 || !expect(&p, ' ') ||
        !digits(&p, 2, 23, &h) || !expect(&p, ':') || !digits(&p, 2, 59, &mi) ||
        !expect(&p, ':') || !digits(&p, 2, 60, &s))
        return false;
    double sec = (double)s, unit = 0.1;
    if (expect(&p, '.'))
        for (; *p >= '0' && *p <= '9'; p++, unit *= 0.1)
            sec += unit * (*p - '0');
    if (!expect(&p, ',') || !digits(&p, 10, 1 << 30, &c) || !expect(&p, ',') ||
        !digits(&p, 10, 1 << 30, &g) || p[strspn(p, " \t\r\n")] != '\0')
        return false;
    y -= mo <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400, yoe = y - era * 400;
    long long doy = (153 * (mo > 2 ? mo - 3 : mo + 9) + 2) / 5 + d - 1;
    long long days = era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
    *t = (double)days * 86400.0 + (double)(h * 3600 + mi * 60) + sec;
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


int replay_read_trace(const char *path, const trace_opts *o, replay *rp)
{
    FILE *f = cli_open_input("replay", "trace", path, false);
    if (!f)
        return 1;
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
    /* multi-turn: turn t > 0 of a conversation extends the whole previous
     * turn (prompt and generation) with its own body */
    int32_t turns = o->turns > 1 ? o->turns : 1;
    for (int32_t i = 0; !rc && i < rp->n_req; i++) {
        request *r = &rp->req[i];
        r->parent = i % turns ? i - 1 : -1;
        int64_t head = rp->n_prefix;
        if (r->parent >= 0) {
            const request *q = &rp->req[r->parent];
            head = (int64_t)q->n_head + q->n_body + q->n_gen;
        }
        if (head + r->n_body + r->n_gen > MAX_LEN) {
            fprintf(stderr, "llmem replay: request %d: conversation of %lld tokens is too long\n",
                    i, (long long)(head + r->n_body + r->n_gen));
            rc = 1;
        }
        r->n_head = (int32_t)head;
    }
    return rc;
}

int replay_load_text(const char *path, replay *rp, unsigned char **owned)
{
    if (!path) {
        fprintf(stderr, "llmem replay: no text found; pass --text FILE\n");
        return 1;
    }
    FILE *f = fopen(path, "rb");
    struct stat sb;
    const char *why = NULL;
    unsigned char *buf = NULL;
    /* size from fstat of a regular file: ftell on a directory answers
     * LONG_MAX on Linux, which once asked malloc for 8 EiB */
    if (!f || fstat(fileno(f), &sb) != 0)
        why = "cannot open it";
    else if (!S_ISREG(sb.st_mode))
        why = S_ISDIR(sb.st_mode) ? "it is a directory" : "it is not a regular file";
    else if (sb.st_size <= 0)
        why = "it is empty";
    else if ((uint64_t)sb.st_size > MAX_TEXT)
        why = "it is larger than 4 GiB";
    else if (!(buf = malloc((size_t)sb.st_size)))
        why = "out of memory";
    else if (fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size)
        why = "cannot read it";
    if (f)
        fclose(f);
    if (why) {
        fprintf(stderr, "llmem replay: text '%s': %s\n", path, why);
        free(buf);
        return 1;
    }
    *owned = buf;
    rp->text = buf;
    rp->text_len = (size_t)sb.st_size;
    return 0;
}

int32_t replay_n_prompt(const replay *rp, const request *r)
{
    (void)rp;
    return r->n_head + r->n_body;
}

/* Token j of the request's sequence: system prefix, body, then generated. */
int32_t replay_req_token(const replay *rp, const request *r, int32_t j)
{
    unsigned char b;
    if (j < r->n_head && r->parent >= 0)
        return replay_req_token(rp, &rp->req[r->parent], j); /* the previous turn */
    if (j < r->n_head)
        b = rp->text[(size_t)j % rp->text_len];
    else if (j < replay_n_prompt(rp, r))
        b = rp->text[((size_t)r->offset + (size_t)(j - r->n_head)) % rp->text_len];
    else
        return r->gen[j - replay_n_prompt(rp, r)];
    return (int32_t)b % rp->V;
}

/* Tokens the request's sequence will hold at most (the last generated token
 * is never fed). */
int64_t replay_req_max_len(const replay *rp, const request *r)
{
    return (int64_t)replay_n_prompt(rp, r) + r->n_gen - 1;
}

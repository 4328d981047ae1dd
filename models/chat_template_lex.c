/* llmem: chat templates -- the lexer of the Jinja2 subset: segments and tag tokens.
 *
 * Whitespace follows Jinja2 as transformers configures it (trim_blocks and
 * lstrip_blocks on): a block or comment tag drops the newline after it and
 * the spaces and tabs before it on its line; "-" in a tag strips all
 * whitespace on that side, "+" keeps it. Reference: Jinja2 3.1 "Template
 * Designer Documentation" and jinja2/lexer.py. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/chat_template_lex.h"

void ct_parser_fail(ct_parser *p, llmem_status st, const char *fmt, ...)
{
    if (p->st)
        return;
    p->st = st;
    if (p->err && p->err_len) {
        int k = snprintf(p->err, p->err_len, "chat template line %d: ", p->line);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < p->err_len)
            llmem_verrf(p->err + k, p->err_len - (size_t)k, fmt, ap);
        va_end(ap);
    }
}

static int count_lines(const char *a, const char *b)
{
    int n = 0;
    for (; a < b; a++)
        n += *a == '\n';
    return n;
}

static bool is_sp(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* the end of a tag, skipping quoted strings ("{{ '}}' }}") */
static const char *find_close(const char *s, const char *close)
{
    char q = 0;
    for (; *s; s++) {
        if (q) {
            if (*s == '\\' && s[1])
                s++;
            else if (*s == q)
                q = 0;
        } else if (*s == '\'' || *s == '"') {
            q = *s;
        } else if (s[0] == close[0] && s[1] == close[1]) {
            return s;
        }
    }
    return NULL;
}

bool ct_split_segments(ct_parser *p, const char *src)
{
    size_t cap = 64, n = 0;
    seg *v = malloc(cap * sizeof *v);
    if (!v)
        return false;
    const char *s = src;
    bool strip_next = false, trim_nl = false;
    while (*s) {
        const char *o = s;
        for (;;) {
            o = strchr(o, '{');
            if (!o || o[1] == '{' || o[1] == '%' || o[1] == '#')
                break;
            o++;
        }
        const char *text_end = o ? o : s + strlen(s);
        const char *ts = s;
        if (strip_next)
            while (ts < text_end && is_sp(*ts))
                ts++;
        else if (trim_nl) {
            if (ts < text_end && *ts == '\n')
                ts++;
            else if (ts + 1 < text_end && ts[0] == '\r' && ts[1] == '\n')
                ts += 2;
        }
        const char *te = text_end;
        if (o) {
            char mark = o[2];
            bool block = o[1] != '{';
            if (mark == '-') {
                while (te > ts && is_sp(te[-1]))
                    te--;
            } else if (block && mark != '+') {
                const char *q = te;
                while (q > ts && (q[-1] == ' ' || q[-1] == '\t'))
                    q--;
                if (q == src || q[-1] == '\n') /* the tag starts its line */
                    te = q;
            }
        }
        if (n + 2 > cap) {
            cap *= 2;
            seg *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                free(v);
                return false;
            }
            v = nv;
        }
        if (te > ts)
            v[n++] = (seg){S_TEXT, 1 + count_lines(src, ts), ts, (size_t)(te - ts)};
        if (!o)
            break;
        char open = o[1];
        const char *close = open == '{' ? "}}" : open == '%' ? "%}" : "#}";
        const char *in = o + 2;
        if (*in == '-' || *in == '+')
            in++;
        const char *c = open == '#' ? strstr(in, close) : find_close(in, close);
        if (!c) {
            p->line = 1 + count_lines(src, o);
            ct_parser_fail(p, LLMEM_E_INVALID, "unclosed tag '{%c'", open);
            free(v);
            return false;
        }
        const char *ie = c;
        strip_next = ie > in && ie[-1] == '-';
        if (strip_next || (ie > in && ie[-1] == '+'))
            ie--;
        trim_nl = open != '{';
        if (open != '#') {
            /* {% raw %} ... {% endraw %} */
            const char *w = in;
            while (w < ie && is_sp(*w))
                w++;
            if (open == '%' && ie - w >= 3 && !strncmp(w, "raw", 3) && (w + 3 == ie || is_sp(w[3]))) {
                const char *e = strstr(c + 2, "endraw");
                const char *tag = e;
                while (tag && tag > c && !(tag[0] == '{' && tag[1] == '%'))
                    tag--;
                const char *ec = e ? strstr(e, "%}") : NULL;
                if (!e || !ec) {
                    ct_parser_fail(p, LLMEM_E_INVALID, "{%% raw %%} without {%% endraw %%}");
                    free(v);
                    return false;
                }
                const char *rs = c + 2, *re = tag;
                if (re > rs && re[2] == '-')
                    while (re > rs && is_sp(re[-1]))
                        re--;
                if (re > rs)
                    v[n++] = (seg){S_TEXT, 1 + count_lines(src, rs), rs, (size_t)(re - rs)};
                strip_next = ec[-1] == '-';
                trim_nl = true;
                s = ec + 2;
                continue;
            }
            v[n++] = (seg){open == '{' ? S_OUT : S_STMT, 1 + count_lines(src, o), in, (size_t)(ie - in)};
        }
        s = c + 2;
    }
    p->seg = v;
    p->n_seg = n;
    return true;
}

/* ---- tag tokens ----------------------------------------------------------------- */

bool ct_tokenize(ct_parser *p, const seg *g)
{
    size_t cap = 16, n = 0;
    tok *v = ct_alloc(p->ar, cap * sizeof *v);
    const char *s = g->s, *e = g->s + g->n;
    p->line = g->line;
    while (v) {
        while (s < e && is_sp(*s))
            s++;
        if (n + 1 >= cap) {
            tok *nv = ct_alloc(p->ar, 2 * cap * sizeof *nv);
            if (!nv)
                return false;
            memcpy(nv, v, n * sizeof *v);
            v = nv;
            cap *= 2;
        }
        tok *t = &v[n];
        memset(t, 0, sizeof *t);
        if (s >= e) {
            t->kind = T_END;
            n++;
            break;
        }
        char c = *s;
        if (c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) {
            const char *b = s;
            while (s < e && (*s == '_' || ((*s | 0x20) >= 'a' && (*s | 0x20) <= 'z') || (*s >= '0' && *s <= '9')))
                s++;
            t->kind = T_NAME;
            t->s = b;
            t->n = (size_t)(s - b);
        } else if (c >= '0' && c <= '9') {
            char *end;
            const char *b = s;
            while (s < e && ((*s >= '0' && *s <= '9') || *s == '_'))
                s++;
            if (s + 1 < e && *s == '.' && s[1] >= '0' && s[1] <= '9') {
                t->kind = T_FLOAT;
                t->f = strtod(b, &end);
                s = end;
            } else {
                t->kind = T_INT;
                t->i = strtoll(b, NULL, 10);
            }
        } else if (c == '\'' || c == '"') {
            s++;
            ct_buf b = {0};
            while (s < e && *s != c) {
                if (*s == '\\' && s + 1 < e) {
                    s++;
                    char x = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s == 'r' ? '\r' : *s;
                    ct_put(&b, &x, 1);
                } else {
                    ct_put(&b, s, 1);
                }
                s++;
            }
            if (s >= e) {
                free(b.p);
                ct_parser_fail(p, LLMEM_E_INVALID, "unterminated string");
                return false;
            }
            s++;
            t->kind = T_STR;
            t->s = ct_strndup(p->ar, b.p ? b.p : "", b.n);
            t->n = b.n;
            free(b.p);
        } else {
            static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                        ">", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="};
            size_t k;
            for (k = 0; k < sizeof ops / sizeof ops[0]; k++) {
                size_t l = strlen(ops[k]);
                if ((size_t)(e - s) >= l && !memcmp(s, ops[k], l))
                    break;
            }
            if (k == sizeof ops / sizeof ops[0]) {
                ct_parser_fail(p, LLMEM_E_INVALID, "unexpected character '%c'", c);
                return false;
            }
            t->kind = T_OP;
            t->s = ops[k];
            t->n = strlen(ops[k]);
            s += t->n;
        }
        n++;
    }
    p->t = v;
    p->n_t = n;
    p->ti = 0;
    return v != NULL;
}

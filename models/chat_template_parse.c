/* llmem: chat templates -- the lexer and parser of the Jinja2 subset.
 *
 * Whitespace follows Jinja2 as transformers configures it (trim_blocks and
 * lstrip_blocks on): a block or comment tag drops the newline after it and
 * the spaces and tabs before it on its line; "-" in a tag strips all
 * whitespace on that side, "+" keeps it. Operator precedence follows
 * jinja2/parser.py (parse_or .. parse_unary, filters and tests bind
 * tighter than unary minus). Reference: Jinja2 3.1 "Template Designer
 * Documentation" and jinja2/lexer.py, jinja2/parser.py. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/chat_template_internal.h"

/* ---- segments ---------------------------------------------------------------- */

enum { S_TEXT, S_OUT, S_STMT };
typedef struct seg {
    int kind, line;
    const char *s;
    size_t n;
} seg;

enum { T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };
typedef struct tok {
    int kind;
    const char *s; /* name/op text, or decoded string */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    ct_arena *ar;
    seg *seg;
    size_t n_seg, si;
    tok *t; /* tokens of the current tag */
    size_t n_t, ti;
    int line;
    int depth; /* expression nesting, bounded so that the C stack is */
    char *err;
    size_t err_len;
    llmem_status st;
} parser;

static void fail(parser *p, llmem_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(parser *p, llmem_status st, const char *fmt, ...)
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

static bool split_segments(parser *p, const char *src)
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
            fail(p, LLMEM_E_INVALID, "unclosed tag '{%c'", open);
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
                    fail(p, LLMEM_E_INVALID, "{%% raw %%} without {%% endraw %%}");
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

static bool tokenize(parser *p, const seg *g)
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
                fail(p, LLMEM_E_INVALID, "unterminated string");
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
                fail(p, LLMEM_E_INVALID, "unexpected character '%c'", c);
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

static const tok *peek(parser *p) { return &p->t[p->ti]; }
static bool is_op(const tok *t, const char *op) { return t->kind == T_OP && !strcmp(t->s, op); }
static bool is_name(const tok *t, const char *w)
{
    return t->kind == T_NAME && t->n == strlen(w) && !memcmp(t->s, w, t->n);
}
static bool accept_op(parser *p, const char *op)
{
    if (!is_op(peek(p), op))
        return false;
    p->ti++;
    return true;
}
static bool accept_name(parser *p, const char *w)
{
    if (!is_name(peek(p), w))
        return false;
    p->ti++;
    return true;
}
static void expect_op(parser *p, const char *op)
{
    if (!accept_op(p, op))
        fail(p, LLMEM_E_INVALID, "expected '%s'", op);
}
static const char *expect_ident(parser *p)
{
    const tok *t = peek(p);
    if (t->kind != T_NAME) {
        fail(p, LLMEM_E_INVALID, "expected a name");
        return "";
    }
    p->ti++;
    return ct_strndup(p->ar, t->s, t->n);
}

/* ---- expressions -------------------------------------------------------------------- */

static ct_node *node(parser *p, ct_nkind k)
{
    ct_node *n = ct_alloc(p->ar, sizeof *n);
    if (n) {
        n->k = k;
        n->line = p->line;
    }
    return n;
}

static void nodes_push(parser *p, ct_nodes *v, ct_node *n)
{
    ct_node **a = ct_alloc(p->ar, (v->n + 1) * sizeof *a);
    if (!a)
        return;
    if (v->n)
        memcpy(a, v->p, v->n * sizeof *a);
    a[v->n++] = n;
    v->p = a;
}

static ct_node *parse_expr(parser *p);
static ct_node *parse_or(parser *p);
static ct_node *parse_unary(parser *p);

/* ( args ) with keywords; the "(" is consumed */
static void parse_args(parser *p, ct_node *n)
{
    const char **kw = NULL;
    while (!p->st && !accept_op(p, ")")) {
        if (n->args.n)
            expect_op(p, ",");
        if (accept_op(p, ")"))
            break;
        const char *k = NULL;
        if (peek(p)->kind == T_NAME && p->ti + 1 < p->n_t && is_op(&p->t[p->ti + 1], "=")) {
            k = expect_ident(p);
            p->ti++;
        }
        const char **nk = ct_alloc(p->ar, (n->args.n + 1) * sizeof *nk);
        if (!nk)
            return;
        if (n->args.n)
            memcpy(nk, kw, n->args.n * sizeof *nk);
        nk[n->args.n] = k;
        kw = nk;
        nodes_push(p, &n->args, parse_expr(p));
        if (peek(p)->kind == T_END) {
            fail(p, LLMEM_E_INVALID, "expected ')'");
            break;
        }
    }
    n->kw = kw;
}

static ct_node *parse_primary(parser *p)
{
    const tok *t = peek(p);
    ct_node *n = NULL;
    if (t->kind == T_STR) {
        ct_buf b = {0};
        while (peek(p)->kind == T_STR) { /* adjacent literals concatenate */
            ct_put(&b, peek(p)->s, peek(p)->n);
            p->ti++;
        }
        n = node(p, N_LIT);
        if (n)
            n->lit = ct_str(ct_strndup(p->ar, b.p ? b.p : "", b.n), b.n);
        free(b.p);
        return n;
    }
    p->ti++;
    if (t->kind == T_INT || t->kind == T_FLOAT) {
        n = node(p, N_LIT);
        if (n)
            n->lit = t->kind == T_INT ? (ct_value){V_INT, {.i = t->i}} : (ct_value){V_FLOAT, {.f = t->f}};
        return n;
    }
    if (t->kind == T_NAME) {
        n = node(p, N_LIT);
        if (!n)
            return NULL;
        if (is_name(t, "true") || is_name(t, "True"))
            n->lit = (ct_value){V_BOOL, {.b = true}};
        else if (is_name(t, "false") || is_name(t, "False"))
            n->lit = (ct_value){V_BOOL, {.b = false}};
        else if (is_name(t, "none") || is_name(t, "None"))
            n->lit = (ct_value){V_NONE, {0}};
        else {
            n->k = N_NAME;
            n->name = ct_strndup(p->ar, t->s, t->n);
        }
        return n;
    }
    if (is_op(t, "(")) {
        n = parse_expr(p);
        if (is_op(peek(p), ",")) { /* a tuple: a list here */
            ct_node *l = node(p, N_LIST);
            if (!l)
                return NULL;
            nodes_push(p, &l->args, n);
            while (accept_op(p, ",") && !is_op(peek(p), ")"))
                nodes_push(p, &l->args, parse_expr(p));
            n = l;
        }
        expect_op(p, ")");
        return n;
    }
    if (is_op(t, "[")) {
        n = node(p, N_LIST);
        while (n && !p->st && !accept_op(p, "]")) {
            if (n->args.n)
                expect_op(p, ",");
            if (accept_op(p, "]"))
                break;
            nodes_push(p, &n->args, parse_expr(p));
        }
        return n;
    }
    if (is_op(t, "{")) {
        n = node(p, N_DICT);
        while (n && !p->st && !accept_op(p, "}")) {
            if (n->args.n)
                expect_op(p, ",");
            if (accept_op(p, "}"))
                break;
            nodes_push(p, &n->args, parse_expr(p));
            expect_op(p, ":");
            nodes_push(p, &n->args, parse_expr(p));
        }
        return n;
    }
    p->ti--;
    fail(p, LLMEM_E_INVALID, "unexpected '%.*s'", (int)(t->n ? t->n : 3), t->n ? t->s : "end");
    return NULL;
}

static ct_node *parse_postfix(parser *p, ct_node *n)
{
    while (!p->st) {
        if (accept_op(p, ".")) {
            ct_node *a = node(p, N_ATTR);
            if (!a)
                return NULL;
            a->a = n;
            if (peek(p)->kind == T_INT) { /* x.0 */
                a->k = N_ITEM;
                a->b = node(p, N_LIT);
                if (a->b)
                    a->b->lit = (ct_value){V_INT, {.i = peek(p)->i}};
                p->ti++;
            } else {
                a->name = expect_ident(p);
            }
            n = a;
        } else if (accept_op(p, "[")) {
            ct_node *a = node(p, N_ITEM);
            if (!a)
                return NULL;
            a->a = n;
            ct_node *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            while (!p->st && !accept_op(p, "]")) {
                if (accept_op(p, ":")) {
                    slice = true;
                    if (++k > 2) {
                        fail(p, LLMEM_E_INVALID, "bad slice");
                        return NULL;
                    }
                    continue;
                }
                parts[k] = parse_expr(p);
            }
            if (slice) {
                a->k = N_SLICE;
                a->b = parts[0];
                a->c = parts[1];
                nodes_push(p, &a->args, parts[2]);
            } else {
                a->b = parts[0];
            }
            n = a;
        } else if (accept_op(p, "(")) {
            ct_node *c = node(p, N_CALL);
            if (!c)
                return NULL;
            c->a = n;
            parse_args(p, c);
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static bool starts_test_arg(const tok *t)
{
    if (t->kind == T_STR || t->kind == T_INT || t->kind == T_FLOAT)
        return true;
    return t->kind == T_NAME && !is_name(t, "and") && !is_name(t, "or") && !is_name(t, "else") &&
           !is_name(t, "if") && !is_name(t, "in") && !is_name(t, "is") && !is_name(t, "not");
}

static ct_node *parse_filters(parser *p, ct_node *n)
{
    while (!p->st) {
        if (accept_op(p, "|")) {
            ct_node *f = node(p, N_FILTER);
            if (!f)
                return NULL;
            f->a = n;
            f->name = expect_ident(p);
            if (accept_op(p, "("))
                parse_args(p, f);
            n = f;
        } else if (accept_name(p, "is")) {
            ct_node *t = node(p, N_TEST);
            if (!t)
                return NULL;
            t->a = n;
            t->negate = accept_name(p, "not");
            t->name = expect_ident(p);
            if (accept_op(p, "("))
                parse_args(p, t);
            else if (starts_test_arg(peek(p)))
                nodes_push(p, &t->args, parse_postfix(p, parse_primary(p)));
            n = t;
        } else {
            break;
        }
    }
    return n;
}

static ct_node *parse_unary(parser *p)
{
    if (p->depth >= 100) {
        fail(p, LLMEM_E_INVALID, "expressions nested too deep");
        return NULL;
    }
    if (accept_op(p, "-") || accept_op(p, "+")) {
        bool neg = p->t[p->ti - 1].s[0] == '-';
        ct_node *n = neg ? node(p, N_NEG) : NULL;
        p->depth++;
        ct_node *a = parse_unary(p);
        p->depth--;
        if (!neg)
            return a;
        if (n)
            n->a = a;
        return n;
    }
    return parse_filters(p, parse_postfix(p, parse_primary(p)));
}

static ct_node *bin(parser *p, const char *op, ct_node *a, ct_node *b)
{
    ct_node *n = node(p, N_BIN);
    if (n) {
        n->name = op;
        n->a = a;
        n->b = b;
    }
    return n;
}

static ct_node *parse_pow(parser *p)
{
    ct_node *n = parse_unary(p);
    while (!p->st && accept_op(p, "**"))
        n = bin(p, "**", n, parse_unary(p));
    return n;
}

static ct_node *parse_mul(parser *p)
{
    ct_node *n = parse_pow(p);
    for (;;) {
        const char *ops[] = {"*", "//", "/", "%"};
        int k;
        for (k = 0; k < 4 && !is_op(peek(p), ops[k]); k++)
            ;
        if (k == 4 || p->st)
            return n;
        p->ti++;
        n = bin(p, ops[k], n, parse_pow(p));
    }
}

static ct_node *parse_concat(parser *p)
{
    ct_node *n = parse_mul(p);
    while (!p->st && accept_op(p, "~"))
        n = bin(p, "~", n, parse_mul(p));
    return n;
}

static ct_node *parse_add(parser *p)
{
    ct_node *n = parse_concat(p);
    while (!p->st) {
        if (accept_op(p, "+"))
            n = bin(p, "+", n, parse_concat(p));
        else if (accept_op(p, "-"))
            n = bin(p, "-", n, parse_concat(p));
        else
            break;
    }
    return n;
}

static ct_node *parse_compare(parser *p)
{
    ct_node *n = parse_add(p);
    while (!p->st) {
        const char *ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        int k;
        for (k = 0; k < 6 && !is_op(peek(p), ops[k]); k++)
            ;
        if (k < 6) {
            p->ti++;
            n = bin(p, ops[k], n, parse_add(p));
        } else if (accept_name(p, "in")) {
            n = bin(p, "in", n, parse_add(p));
        } else if (is_name(peek(p), "not") && p->ti + 1 < p->n_t && is_name(&p->t[p->ti + 1], "in")) {
            p->ti += 2;
            n = bin(p, "in", n, parse_add(p));
            if (n)
                n->negate = true;
        } else {
            break;
        }
    }
    return n;
}

static ct_node *parse_not(parser *p)
{
    if (accept_name(p, "not")) {
        ct_node *n = node(p, N_NOT);
        if (n && p->depth < 100) {
            p->depth++;
            n->a = parse_not(p);
            p->depth--;
        } else {
            fail(p, LLMEM_E_INVALID, "expressions nested too deep");
        }
        return n;
    }
    return parse_compare(p);
}

static ct_node *parse_and(parser *p)
{
    ct_node *n = parse_not(p);
    while (!p->st && accept_name(p, "and"))
        n = bin(p, "and", n, parse_not(p));
    return n;
}

static ct_node *parse_or(parser *p)
{
    ct_node *n = parse_and(p);
    while (!p->st && accept_name(p, "or"))
        n = bin(p, "or", n, parse_and(p));
    return n;
}

static ct_node *parse_expr(parser *p)
{
    if (p->depth >= 100) {
        fail(p, LLMEM_E_INVALID, "expressions nested too deep");
        return NULL;
    }
    p->depth++;
    ct_node *n = parse_or(p);
    p->depth--;
    if (!p->st && accept_name(p, "if")) {
        ct_node *c = node(p, N_COND);
        if (!c)
            return NULL;
        c->a = n;
        c->c = parse_or(p);
        if (accept_name(p, "else"))
            c->b = parse_expr(p);
        n = c;
    }
    return n;
}

/* ---- statements ---------------------------------------------------------------------- */

static void end_of_tag(parser *p)
{
    if (!p->st && peek(p)->kind != T_END)
        fail(p, LLMEM_E_INVALID, "unexpected '%.*s' at the end of a tag", (int)peek(p)->n, peek(p)->s);
}

/* Parses statements into out until a tag whose first word is one of
 * stops[] (returns its index; the tag's tokens stay current) or the end
 * (returns -1). */
static int parse_body(parser *p, ct_nodes *out, const char *const *stops, int n_stops);

static void parse_stmt_inner(parser *p, ct_nodes *out);

static void parse_stmt(parser *p, ct_nodes *out)
{
    if (p->depth >= 100) {
        fail(p, LLMEM_E_INVALID, "statements nested too deep");
        return;
    }
    p->depth++;
    parse_stmt_inner(p, out);
    p->depth--;
}

static void parse_stmt_inner(parser *p, ct_nodes *out)
{
    const tok *t = peek(p);
    if (accept_name(p, "if")) {
        ct_node *n = node(p, N_IF);
        if (!n)
            return;
        nodes_push(p, &n->conds, parse_expr(p));
        end_of_tag(p);
        static const char *const stops[] = {"elif", "else", "endif"};
        for (;;) {
            ct_node *blk = node(p, N_BLOCK);
            if (!blk)
                return;
            int k = parse_body(p, &blk->body, stops, 3);
            if (p->st)
                return;
            nodes_push(p, &n->body, blk);
            if (k < 0) {
                fail(p, LLMEM_E_INVALID, "{%% if %%} without {%% endif %%}");
                return;
            }
            if (k == 0) {
                nodes_push(p, &n->conds, parse_expr(p));
                end_of_tag(p);
            } else if (k == 1) {
                end_of_tag(p);
                k = parse_body(p, &n->body2, stops + 2, 1);
                if (k < 0)
                    fail(p, LLMEM_E_INVALID, "{%% if %%} without {%% endif %%}");
                end_of_tag(p);
                break;
            } else {
                end_of_tag(p);
                break;
            }
        }
        nodes_push(p, out, n);
    } else if (accept_name(p, "for")) {
        ct_node *n = node(p, N_FOR);
        if (!n)
            return;
        n->name = expect_ident(p);
        if (accept_op(p, ","))
            n->name2 = expect_ident(p);
        if (!accept_name(p, "in"))
            fail(p, LLMEM_E_INVALID, "expected 'in' in {%% for %%}");
        n->a = parse_or(p); /* not parse_expr: "if" here filters */
        if (accept_name(p, "if"))
            n->c = parse_expr(p);
        if (accept_name(p, "recursive"))
            fail(p, LLMEM_E_UNSUPPORTED, "recursive loops are not supported");
        end_of_tag(p);
        static const char *const stops[] = {"else", "endfor"};
        int k = parse_body(p, &n->body, stops, 2);
        if (k == 0) {
            end_of_tag(p);
            k = parse_body(p, &n->body2, stops + 1, 1);
        }
        if (k < 0)
            fail(p, LLMEM_E_INVALID, "{%% for %%} without {%% endfor %%}");
        end_of_tag(p);
        nodes_push(p, out, n);
    } else if (accept_name(p, "set")) {
        ct_node *n = node(p, N_SET);
        if (!n)
            return;
        n->name = expect_ident(p);
        if (accept_op(p, "."))
            n->name2 = expect_ident(p);
        if (accept_op(p, "=")) {
            n->a = parse_expr(p);
            end_of_tag(p);
        } else { /* {% set x %}...{% endset %} */
            end_of_tag(p);
            static const char *const stops[] = {"endset"};
            if (parse_body(p, &n->body, stops, 1) < 0)
                fail(p, LLMEM_E_INVALID, "{%% set %%} without {%% endset %%}");
            end_of_tag(p);
        }
        nodes_push(p, out, n);
    } else if (accept_name(p, "macro")) {
        ct_node *n = node(p, N_MACRO);
        if (!n)
            return;
        n->name = expect_ident(p);
        expect_op(p, "(");
        /* parameters: names with optional defaults, kept as call args */
        ct_node *params = node(p, N_CALL);
        if (!params)
            return;
        parse_args(p, params);
        for (size_t i = 0; !p->st && i < params->args.n; i++) {
            if (!params->kw[i] && params->args.p[i]->k != N_NAME)
                fail(p, LLMEM_E_INVALID, "bad macro parameter");
        }
        n->a = params;
        end_of_tag(p);
        static const char *const stops[] = {"endmacro"};
        if (parse_body(p, &n->body, stops, 1) < 0)
            fail(p, LLMEM_E_INVALID, "{%% macro %%} without {%% endmacro %%}");
        end_of_tag(p);
        nodes_push(p, out, n);
    } else if (accept_name(p, "break") || accept_name(p, "continue")) {
        ct_node *n = node(p, is_name(&p->t[p->ti - 1], "break") ? N_BREAK : N_CONTINUE);
        end_of_tag(p);
        nodes_push(p, out, n);
    } else if (accept_name(p, "generation")) {
        /* transformers' AssistantTracker marks; renders its body as is */
        end_of_tag(p);
        static const char *const stops[] = {"endgeneration"};
        if (parse_body(p, out, stops, 1) < 0)
            fail(p, LLMEM_E_INVALID, "{%% generation %%} without {%% endgeneration %%}");
        end_of_tag(p);
    } else {
        fail(p, LLMEM_E_UNSUPPORTED, "statement '%.*s' is not supported", (int)t->n, t->s ? t->s : "");
    }
}

static int parse_body(parser *p, ct_nodes *out, const char *const *stops, int n_stops)
{
    while (!p->st && p->si < p->n_seg) {
        const seg *g = &p->seg[p->si++];
        p->line = g->line;
        if (g->kind == S_TEXT) {
            ct_node *n = node(p, N_TEXT);
            if (n)
                n->lit = ct_str(g->s, g->n);
            nodes_push(p, out, n);
            continue;
        }
        if (!tokenize(p, g))
            return -1;
        if (g->kind == S_OUT) {
            ct_node *n = node(p, N_OUT);
            if (n)
                n->a = parse_expr(p);
            end_of_tag(p);
            nodes_push(p, out, n);
            continue;
        }
        for (int k = 0; k < n_stops; k++)
            if (accept_name(p, stops[k]))
                return k;
        const tok *t = peek(p);
        if (t->kind == T_NAME && t->n > 3 && (!memcmp(t->s, "end", 3) || is_name(t, "elif") || is_name(t, "else"))) {
            fail(p, LLMEM_E_INVALID, "unexpected {%% %.*s %%}", (int)t->n, t->s);
            return -1;
        }
        parse_stmt(p, out);
    }
    return -1;
}

llmem_status ct_parse(llmem_chat_template *t, const char *src, char *err, size_t err_len)
{
    parser p = {.ar = &t->arena, .err = err, .err_len = err_len, .line = 1};
    /* the source is kept: text nodes point into it */
    size_t n = strlen(src);
    char *copy = ct_strndup(p.ar, src, n);
    if (!copy)
        return LLMEM_E_NO_MEMORY;
    if (!split_segments(&p, copy))
        return p.st ? p.st : LLMEM_E_NO_MEMORY;
    parse_body(&p, &t->root, NULL, 0);
    free(p.seg);
    if (!p.st && t->arena.oom)
        p.st = LLMEM_E_NO_MEMORY;
    return p.st;
}

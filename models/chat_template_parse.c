/* llmem: chat templates -- the parser of the Jinja2 subset (the lexer is
 * chat_template_lex.c). Operator precedence follows jinja2/parser.py
 * (parse_or .. parse_unary, filters and tests bind tighter than unary
 * minus). Reference: Jinja2 3.1 "Template Designer Documentation" and
 * jinja2/parser.py. */
#include <stdlib.h>
#include <string.h>

#include "models/chat_template_lex.h"

static const tok *peek(ct_parser *p) { return &p->t[p->ti]; }
static bool is_op(const tok *t, const char *op) { return t->kind == T_OP && !strcmp(t->s, op); }
static bool is_name(const tok *t, const char *w)
{
    return t->kind == T_NAME && t->n == strlen(w) && !memcmp(t->s, w, t->n);
}
static bool accept_op(ct_parser *p, const char *op)
{
    if (!is_op(peek(p), op))
        return false;
    p->ti++;
    return true;
}
static bool accept_name(ct_parser *p, const char *w)
{
    if (!is_name(peek(p), w))
        return false;
    p->ti++;
    return true;
}
static void expect_op(ct_parser *p, const char *op)
{
    if (!accept_op(p, op))
        ct_parser_fail(p, LLMEM_E_INVALID, "expected '%s'", op);
}
static const char *expect_ident(ct_parser *p)
{
    const tok *t = peek(p);
    if (t->kind != T_NAME) {
        ct_parser_fail(p, LLMEM_E_INVALID, "expected a name");
        return "";
    }
    p->ti++;
    return ct_strndup(p->ar, t->s, t->n);
}

/* ---- expressions -------------------------------------------------------------------- */

static ct_node *node(ct_parser *p, ct_nkind k)
{
    ct_node *n = ct_alloc(p->ar, sizeof *n);
    if (n) {
        n->k = k;
        n->line = p->line;
    }
    return n;
}

static void nodes_push(ct_parser *p, ct_nodes *v, ct_node *n)
{
    ct_node **a = ct_alloc(p->ar, (v->n + 1) * sizeof *a);
    if (!a)
        return;
    if (v->n)
        memcpy(a, v->p, v->n * sizeof *a);
    a[v->n++] = n;
    v->p = a;
}

static ct_node *parse_expr(ct_parser *p);
static ct_node *parse_or(ct_parser *p);
static ct_node *parse_unary(ct_parser *p);

/* ( args ) with keywords; the "(" is consumed */
static void parse_args(ct_parser *p, ct_node *n)
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
            ct_parser_fail(p, LLMEM_E_INVALID, "expected ')'");
            break;
        }
    }
    n->kw = kw;
}

static ct_node *parse_primary(ct_parser *p)
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
    ct_parser_fail(p, LLMEM_E_INVALID, "unexpected '%.*s'", (int)(t->n ? t->n : 3), t->n ? t->s : "end");
    return NULL;
}

static ct_node *parse_postfix(ct_parser *p, ct_node *n)
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
                        ct_parser_fail(p, LLMEM_E_INVALID, "bad slice");
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

static ct_node *parse_filters(ct_parser *p, ct_node *n)
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

static ct_node *parse_unary(ct_parser *p)
{
    if (p->depth >= 100) {
        ct_parser_fail(p, LLMEM_E_INVALID, "expressions nested too deep");
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

static ct_node *bin(ct_parser *p, const char *op, ct_node *a, ct_node *b)
{
    ct_node *n = node(p, N_BIN);
    if (n) {
        n->name = op;
        n->a = a;
        n->b = b;
    }
    return n;
}

static ct_node *parse_pow(ct_parser *p)
{
    ct_node *n = parse_unary(p);
    while (!p->st && accept_op(p, "**"))
        n = bin(p, "**", n, parse_unary(p));
    return n;
}

static ct_node *parse_mul(ct_parser *p)
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

static ct_node *parse_concat(ct_parser *p)
{
    ct_node *n = parse_mul(p);
    while (!p->st && accept_op(p, "~"))
        n = bin(p, "~", n, parse_mul(p));
    return n;
}

static ct_node *parse_add(ct_parser *p)
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

static ct_node *parse_compare(ct_parser *p)
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

static ct_node *parse_not(ct_parser *p)
{
    if (accept_name(p, "not")) {
        ct_node *n = node(p, N_NOT);
        if (n && p->depth < 100) {
            p->depth++;
            n->a = parse_not(p);
            p->depth--;
        } else {
            ct_parser_fail(p, LLMEM_E_INVALID, "expressions nested too deep");
        }
        return n;
    }
    return parse_compare(p);
}

static ct_node *parse_and(ct_parser *p)
{
    ct_node *n = parse_not(p);
    while (!p->st && accept_name(p, "and"))
        n = bin(p, "and", n, parse_not(p));
    return n;
}

static ct_node *parse_or(ct_parser *p)
{
    ct_node *n = parse_and(p);
    while (!p->st && accept_name(p, "or"))
        n = bin(p, "or", n, parse_and(p));
    return n;
}

static ct_node *parse_expr(ct_parser *p)
{
    if (p->depth >= 100) {
        ct_parser_fail(p, LLMEM_E_INVALID, "expressions nested too deep");
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

static void end_of_tag(ct_parser *p)
{
    if (!p->st && peek(p)->kind != T_END)
        ct_parser_fail(p, LLMEM_E_INVALID, "unexpected '%.*s' at the end of a tag", (int)peek(p)->n, peek(p)->s);
}

/* Parses statements into out until a tag whose first word is one of
 * stops[] (returns its index; the tag's tokens stay current) or the end
 * (returns -1). */
static int parse_body(ct_parser *p, ct_nodes *out, const char *const *stops, int n_stops);

static void parse_stmt_inner(ct_parser *p, ct_nodes *out);

static void parse_stmt(ct_parser *p, ct_nodes *out)
{
    if (p->depth >= 100) {
        ct_parser_fail(p, LLMEM_E_INVALID, "statements nested too deep");
        return;
    }
    p->depth++;
    parse_stmt_inner(p, out);
    p->depth--;
}

static void parse_stmt_inner(ct_parser *p, ct_nodes *out)
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
                ct_parser_fail(p, LLMEM_E_INVALID, "{%% if %%} without {%% endif %%}");
                return;
            }
            if (k == 0) {
                nodes_push(p, &n->conds, parse_expr(p));
                end_of_tag(p);
            } else if (k == 1) {
                end_of_tag(p);
                k = parse_body(p, &n->body2, stops + 2, 1);
                if (k < 0)
                    ct_parser_fail(p, LLMEM_E_INVALID, "{%% if %%} without {%% endif %%}");
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
            ct_parser_fail(p, LLMEM_E_INVALID, "expected 'in' in {%% for %%}");
        n->a = parse_or(p); /* not parse_expr: "if" here filters */
        if (accept_name(p, "if"))
            n->c = parse_expr(p);
        if (accept_name(p, "recursive"))
            ct_parser_fail(p, LLMEM_E_UNSUPPORTED, "recursive loops are not supported");
        end_of_tag(p);
        static const char *const stops[] = {"else", "endfor"};
        int k = parse_body(p, &n->body, stops, 2);
        if (k == 0) {
            end_of_tag(p);
            k = parse_body(p, &n->body2, stops + 1, 1);
        }
        if (k < 0)
            ct_parser_fail(p, LLMEM_E_INVALID, "{%% for %%} without {%% endfor %%}");
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
                ct_parser_fail(p, LLMEM_E_INVALID, "{%% set %%} without {%% endset %%}");
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
                ct_parser_fail(p, LLMEM_E_INVALID, "bad macro parameter");
        }
        n->a = params;
        end_of_tag(p);
        static const char *const stops[] = {"endmacro"};
        if (parse_body(p, &n->body, stops, 1) < 0)
            ct_parser_fail(p, LLMEM_E_INVALID, "{%% macro %%} without {%% endmacro %%}");
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
            ct_parser_fail(p, LLMEM_E_INVALID, "{%% generation %%} without {%% endgeneration %%}");
        end_of_tag(p);
    } else {
        ct_parser_fail(p, LLMEM_E_UNSUPPORTED, "statement '%.*s' is not supported", (int)t->n, t->s ? t->s : "");
    }
}

static int parse_body(ct_parser *p, ct_nodes *out, const char *const *stops, int n_stops)
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
        if (!ct_tokenize(p, g))
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
            ct_parser_fail(p, LLMEM_E_INVALID, "unexpected {%% %.*s %%}", (int)t->n, t->s);
            return -1;
        }
        parse_stmt(p, out);
    }
    return -1;
}

llmem_status ct_parse(llmem_chat_template *t, const char *src, char *err, size_t err_len)
{
    ct_parser p = {.ar = &t->arena, .err = err, .err_len = err_len, .line = 1};
    /* the source is kept: text nodes point into it */
    size_t n = strlen(src);
    char *copy = ct_strndup(p.ar, src, n);
    if (!copy)
        return LLMEM_E_NO_MEMORY;
    if (!ct_split_segments(&p, copy))
        return p.st ? p.st : LLMEM_E_NO_MEMORY;
    parse_body(&p, &t->root, NULL, 0);
    free(p.seg);
    if (!p.st && t->arena.oom)
        p.st = LLMEM_E_NO_MEMORY;
    return p.st;
}

/* llmem: chat templates -- values, evaluation, filters and the public API.
 *
 * Semantics follow Python's jinja2 as transformers' apply_chat_template
 * sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols; tojson = json.dumps(ensure_ascii=False); globals
 * raise_exception and strftime_now). Values are Python-like: strings print
 * as str(), lists and dicts are shared by reference, undefined prints as
 * "". Reference: Jinja2 3.1 documentation ("List of Builtin Filters",
 * "List of Builtin Tests", "Assignments", "Loop Controls"); transformers
 * utils/chat_template_utils.py. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/chat_template_internal.h"

ct_value ct_str(const char *s, size_t n) { return (ct_value){V_STR, {.s = {s, n}}}; }
static const ct_value UNDEF = {V_UNDEF, {0}};
static const ct_value NONE = {V_NONE, {0}};
static ct_value vbool(bool b) { return (ct_value){V_BOOL, {.b = b}}; }
static ct_value vint(int64_t i) { return (ct_value){V_INT, {.i = i}}; }

bool ct_list_push(ct_arena *a, ct_list *l, ct_value v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        ct_value *p = ct_alloc(a, cap * sizeof *p);
        if (!p)
            return false;
        if (l->n)
            memcpy(p, l->v, l->n * sizeof *p);
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

ct_value *ct_dict_get(const ct_dict *d, const char *k, size_t kn)
{
    for (size_t i = 0; d && i < d->n; i++)
        if (d->key_len[i] == kn && !memcmp(d->key[i], k, kn))
            return &d->v[i];
    return NULL;
}

bool ct_dict_set(ct_arena *a, ct_dict *d, const char *k, size_t kn, ct_value v)
{
    ct_value *o = ct_dict_get(d, k, kn);
    if (o) {
        *o = v;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        const char **nk = ct_alloc(a, cap * sizeof *nk);
        size_t *nl = ct_alloc(a, cap * sizeof *nl);
        ct_value *nv = ct_alloc(a, cap * sizeof *nv);
        if (!nk || !nl || !nv)
            return false;
        if (d->n) {
            memcpy(nk, d->key, d->n * sizeof *nk);
            memcpy(nl, d->key_len, d->n * sizeof *nl);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->key = nk;
        d->key_len = nl;
        d->v = nv;
        d->cap = cap;
    }
    d->key[d->n] = k;
    d->key_len[d->n] = kn;
    d->v[d->n++] = v;
    return true;
}

/* ---- evaluation state ------------------------------------------------------------- */

typedef struct ev {
    ct_arena *ar;
    ct_dict *frame[64];
    int n_frames;
    int ctl; /* 1 break, 2 continue */
    int depth;
    char *err;
    size_t err_len;
    llmem_status st;
} ev;

static void efail(ev *e, const ct_node *n, llmem_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void efail(ev *e, const ct_node *n, llmem_status st, const char *fmt, ...)
{
    if (e->st)
        return;
    e->st = st;
    if (e->err && e->err_len) {
        int k = snprintf(e->err, e->err_len, "chat template line %d: ", n ? n->line : 0);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < e->err_len)
            vsnprintf(e->err + k, e->err_len - (size_t)k, fmt, ap);
        va_end(ap);
    }
}

static bool truthy(ct_value v)
{
    switch (v.k) {
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n > 0;
    case V_LIST: return v.u.l->n > 0;
    case V_DICT: return v.u.d->n > 0 || v.u.d->ns;
    case V_MACRO: return true;
    default: return false;
    }
}

static void put_float(ct_buf *b, double f)
{
    char s[64];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, f);
        if (strtod(s, NULL) == f)
            break;
    }
    ct_put(b, s, strlen(s));
    if (!strpbrk(s, ".eEn"))
        ct_put(b, ".0", 2);
}

static void to_str(ct_buf *b, ct_value v, bool repr);

static void json_str(ct_buf *b, const char *s, size_t n)
{
    ct_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            ct_put(b, esc, 2);
        } else if (c < 0x20) {
            const char *m = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                            : c == '\f' ? "\\f" : NULL;
            if (m)
                ct_put(b, m, 2);
            else {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                ct_put(b, esc, 6);
            }
        } else {
            ct_put(b, (const char *)&s[i], 1);
        }
    }
    ct_put(b, "\"", 1);
}

static void put_indent(ct_buf *b, int indent, int level)
{
    ct_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        ct_put(b, " ", 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none) */
static void to_json(ct_buf *b, ct_value v, int indent, int level)
{
    switch (v.k) {
    case V_STR: json_str(b, v.u.s.p, v.u.s.n); break;
    case V_BOOL: ct_put(b, v.u.b ? "true" : "false", v.u.b ? 4 : 5); break;
    case V_INT:
    case V_FLOAT: to_str(b, v, false); break;
    case V_LIST:
        ct_put(b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                ct_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0)
                put_indent(b, indent, level + 1);
            to_json(b, v.u.l->v[i], indent, level + 1);
        }
        if (indent >= 0 && v.u.l->n)
            put_indent(b, indent, level);
        ct_put(b, "]", 1);
        break;
    case V_DICT:
        ct_put(b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                ct_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0)
                put_indent(b, indent, level + 1);
            json_str(b, v.u.d->key[i], v.u.d->key_len[i]);
            ct_put(b, ": ", 2);
            to_json(b, v.u.d->v[i], indent, level + 1);
        }
        if (indent >= 0 && v.u.d->n)
            put_indent(b, indent, level);
        ct_put(b, "}", 1);
        break;
    default: ct_put(b, "null", 4); break;
    }
}

/* str(v) (repr: the repr() inside containers) */
static void to_str(ct_buf *b, ct_value v, bool repr)
{
    char s[32];
    switch (v.k) {
    case V_UNDEF: break;
    case V_NONE: ct_put(b, "None", 4); break;
    case V_BOOL: ct_put(b, v.u.b ? "True" : "False", v.u.b ? 4 : 5); break;
    case V_INT:
        snprintf(s, sizeof s, "%lld", (long long)v.u.i);
        ct_put(b, s, strlen(s));
        break;
    case V_FLOAT: put_float(b, v.u.f); break;
    case V_STR:
        if (repr) {
            bool dq = memchr(v.u.s.p, '\'', v.u.s.n) && !memchr(v.u.s.p, '"', v.u.s.n);
            ct_put(b, dq ? "\"" : "'", 1);
            for (size_t i = 0; i < v.u.s.n; i++) {
                char c = v.u.s.p[i];
                if (c == '\\' || (!dq && c == '\''))
                    ct_put(b, "\\", 1);
                if (c == '\n')
                    ct_put(b, "\\n", 2);
                else if (c == '\t')
                    ct_put(b, "\\t", 2);
                else if (c == '\r')
                    ct_put(b, "\\r", 2);
                else
                    ct_put(b, &c, 1);
            }
            ct_put(b, dq ? "\"" : "'", 1);
        } else {
            ct_put(b, v.u.s.p, v.u.s.n);
        }
        break;
    case V_LIST:
        ct_put(b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                ct_put(b, ", ", 2);
            to_str(b, v.u.l->v[i], true);
        }
        ct_put(b, "]", 1);
        break;
    case V_DICT:
        ct_put(b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                ct_put(b, ", ", 2);
            to_str(b, ct_str(v.u.d->key[i], v.u.d->key_len[i]), true);
            ct_put(b, ": ", 2);
            to_str(b, v.u.d->v[i], true);
        }
        ct_put(b, "}", 1);
        break;
    case V_MACRO: ct_put(b, "<macro>", 7); break;
    }
}

static ct_value str_of(ev *e, ct_value v)
{
    if (v.k == V_STR)
        return v;
    ct_buf b = {0};
    to_str(&b, v, false);
    ct_value r = ct_str(ct_strndup(e->ar, b.p ? b.p : "", b.n), b.n);
    free(b.p);
    return r;
}

static bool equal(ct_value a, ct_value b)
{
    if ((a.k == V_INT || a.k == V_FLOAT || a.k == V_BOOL) && (b.k == V_INT || b.k == V_FLOAT || b.k == V_BOOL)) {
        double x = a.k == V_INT ? (double)a.u.i : a.k == V_FLOAT ? a.u.f : a.u.b;
        double y = b.k == V_INT ? (double)b.u.i : b.k == V_FLOAT ? b.u.f : b.u.b;
        return x == y;
    }
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case V_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case V_DICT: return a.u.d == b.u.d;
    default: return true;
    }
}

/* ---- expressions --------------------------------------------------------------------- */

static ct_value eval(ev *e, const ct_node *n);
static void exec_nodes(ev *e, const ct_nodes *body, ct_buf *out);

static bool is_builtin(const char *name)
{
    static const char *const names[] = {"raise_exception", "namespace", "dict", "range", "strftime_now"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i]))
            return true;
    return false;
}

/* variables, innermost scope first; a built-in function is a macro value
 * without a node (so that "strftime_now is defined" holds) */
static ct_value lookup(ev *e, const char *name)
{
    size_t n = strlen(name);
    for (int i = e->n_frames - 1; i >= 0; i--) {
        ct_value *v = ct_dict_get(e->frame[i], name, n);
        if (v)
            return *v;
    }
    return is_builtin(name) ? (ct_value){V_MACRO, {.m = NULL}} : UNDEF;
}

static ct_dict *new_dict(ev *e) { return ct_alloc(e->ar, sizeof(ct_dict)); }
static ct_list *new_list(ev *e) { return ct_alloc(e->ar, sizeof(ct_list)); }

static ct_value attr(ct_value o, const char *k, size_t kn)
{
    if (o.k == V_DICT) {
        ct_value *v = ct_dict_get(o.u.d, k, kn);
        return v ? *v : UNDEF;
    }
    return UNDEF;
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

static ct_value item(ev *e, ct_value o, ct_value k)
{
    if (o.k == V_DICT && k.k == V_STR)
        return attr(o, k.u.s.p, k.u.s.n);
    if ((o.k == V_LIST || o.k == V_STR) && k.k == V_INT) {
        size_t n = o.k == V_LIST ? o.u.l->n : o.u.s.n;
        int64_t i = norm_index(k.u.i, n);
        if (i < 0 || (size_t)i >= n)
            return UNDEF;
        return o.k == V_LIST ? o.u.l->v[i] : ct_str(o.u.s.p + i, 1);
    }
    (void)e;
    return UNDEF;
}

static ct_value slice(ev *e, const ct_node *n, ct_value o, ct_value a, ct_value b, ct_value c)
{
    int64_t step = c.k == V_INT ? c.u.i : 1;
    if (step == 0 || (o.k != V_LIST && o.k != V_STR)) {
        efail(e, n, LLMEM_E_INVALID, "bad slice");
        return UNDEF;
    }
    int64_t len = (int64_t)(o.k == V_LIST ? o.u.l->n : o.u.s.n);
    int64_t lo, hi;
    if (step > 0) {
        lo = a.k == V_INT ? norm_index(a.u.i, (size_t)len) : 0;
        hi = b.k == V_INT ? norm_index(b.u.i, (size_t)len) : len;
        lo = lo < 0 ? 0 : lo > len ? len : lo;
        hi = hi < 0 ? 0 : hi > len ? len : hi;
    } else {
        lo = a.k == V_INT ? norm_index(a.u.i, (size_t)len) : len - 1;
        hi = b.k == V_INT ? norm_index(b.u.i, (size_t)len) : -1;
        lo = lo < -1 ? -1 : lo >= len ? len - 1 : lo;
        hi = hi < -1 ? -1 : hi >= len ? len - 1 : hi;
    }
    ct_list *l = new_list(e);
    ct_buf sb = {0};
    for (int64_t i = lo; l && (step > 0 ? i < hi : i > hi); i += step) {
        if (o.k == V_LIST)
            ct_list_push(e->ar, l, o.u.l->v[i]);
        else
            ct_put(&sb, o.u.s.p + i, 1);
    }
    if (o.k == V_STR) {
        ct_value r = ct_str(ct_strndup(e->ar, sb.p ? sb.p : "", sb.n), sb.n);
        free(sb.p);
        return r;
    }
    return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
}

static bool contains(ct_value hay, ct_value x)
{
    if (hay.k == V_STR && x.k == V_STR) {
        if (!x.u.s.n)
            return true;
        for (size_t i = 0; i + x.u.s.n <= hay.u.s.n; i++)
            if (!memcmp(hay.u.s.p + i, x.u.s.p, x.u.s.n))
                return true;
        return false;
    }
    if (hay.k == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (equal(hay.u.l->v[i], x))
                return true;
        return false;
    }
    if (hay.k == V_DICT && x.k == V_STR)
        return ct_dict_get(hay.u.d, x.u.s.p, x.u.s.n) != NULL;
    return false;
}

static double num(ct_value v) { return v.k == V_INT ? (double)v.u.i : v.k == V_FLOAT ? v.u.f : v.k == V_BOOL ? v.u.b : 0; }
static bool is_num(ct_value v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }

static int compare(ct_value a, ct_value b, bool *ok)
{
    *ok = true;
    if (is_num(a) && is_num(b))
        return num(a) < num(b) ? -1 : num(a) > num(b);
    if (a.k == V_STR && b.k == V_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, m);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    *ok = false;
    return 0;
}

static ct_value binop(ev *e, const ct_node *n)
{
    const char *op = n->name;
    if (!strcmp(op, "and")) {
        ct_value a = eval(e, n->a);
        return truthy(a) ? eval(e, n->b) : a;
    }
    if (!strcmp(op, "or")) {
        ct_value a = eval(e, n->a);
        return truthy(a) ? a : eval(e, n->b);
    }
    ct_value a = eval(e, n->a), b = eval(e, n->b);
    if (e->st)
        return UNDEF;
    if (!strcmp(op, "~")) {
        ct_value x = str_of(e, a), y = str_of(e, b);
        char *p = ct_alloc(e->ar, x.u.s.n + y.u.s.n + 1);
        if (!p)
            return UNDEF;
        memcpy(p, x.u.s.p, x.u.s.n);
        memcpy(p + x.u.s.n, y.u.s.p, y.u.s.n);
        return ct_str(p, x.u.s.n + y.u.s.n);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!="))
        return vbool(equal(a, b) == (op[0] == '='));
    if (!strcmp(op, "in"))
        return vbool(contains(b, a) != n->negate);
    if (op[0] == '<' || op[0] == '>') {
        bool ok;
        int c = compare(a, b, &ok);
        if (!ok) {
            efail(e, n, LLMEM_E_INVALID, "cannot compare these values with '%s'", op);
            return UNDEF;
        }
        return vbool(!strcmp(op, "<") ? c < 0 : !strcmp(op, ">") ? c > 0 : !strcmp(op, "<=") ? c <= 0 : c >= 0);
    }
    if (!strcmp(op, "+") && a.k == V_STR && b.k == V_STR) {
        char *p = ct_alloc(e->ar, a.u.s.n + b.u.s.n + 1);
        if (!p)
            return UNDEF;
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        return ct_str(p, a.u.s.n + b.u.s.n);
    }
    if (!strcmp(op, "+") && a.k == V_LIST && b.k == V_LIST) {
        ct_list *l = new_list(e);
        for (size_t i = 0; l && i < a.u.l->n; i++)
            ct_list_push(e->ar, l, a.u.l->v[i]);
        for (size_t i = 0; l && i < b.u.l->n; i++)
            ct_list_push(e->ar, l, b.u.l->v[i]);
        return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
    }
    if (!strcmp(op, "*") && a.k == V_STR && b.k == V_INT) {
        ct_buf r = {0};
        for (int64_t i = 0; i < b.u.i; i++)
            ct_put(&r, a.u.s.p, a.u.s.n);
        ct_value v = ct_str(ct_strndup(e->ar, r.p ? r.p : "", r.n), r.n);
        free(r.p);
        return v;
    }
    if (!is_num(a) || !is_num(b)) {
        efail(e, n, LLMEM_E_INVALID, "unsupported operand types for '%s'", op);
        return UNDEF;
    }
    bool ints = a.k != V_FLOAT && b.k != V_FLOAT;
    int64_t x = a.k == V_INT ? a.u.i : (int64_t)num(a), y = b.k == V_INT ? b.u.i : (int64_t)num(b);
    if ((!strcmp(op, "/") || !strcmp(op, "//") || !strcmp(op, "%")) && num(b) == 0) {
        efail(e, n, LLMEM_E_INVALID, "division by zero");
        return UNDEF;
    }
    switch (op[0]) {
    case '+': return ints ? vint(x + y) : (ct_value){V_FLOAT, {.f = num(a) + num(b)}};
    case '-': return ints ? vint(x - y) : (ct_value){V_FLOAT, {.f = num(a) - num(b)}};
    case '*':
        if (op[1] == '*')
            return ints && y >= 0 ? vint((int64_t)pow((double)x, (double)y))
                                  : (ct_value){V_FLOAT, {.f = pow(num(a), num(b))}};
        return ints ? vint(x * y) : (ct_value){V_FLOAT, {.f = num(a) * num(b)}};
    case '/':
        if (op[1] == '/')
            return ints ? vint((x - (((x % y) + y) % y)) / y) : (ct_value){V_FLOAT, {.f = floor(num(a) / num(b))}};
        return (ct_value){V_FLOAT, {.f = num(a) / num(b)}};
    case '%': return ints ? vint(((x % y) + y) % y) : (ct_value){V_FLOAT, {.f = fmod(num(a), num(b))}};
    }
    efail(e, n, LLMEM_E_UNSUPPORTED, "operator '%s' is not supported", op);
    return UNDEF;
}

/* evaluated arguments of a call/filter/test: positional then keywords */
typedef struct args {
    ct_value v[8];
    const char *kw[8];
    int n;
} args;

static void eval_args(ev *e, const ct_node *n, args *a)
{
    a->n = 0;
    for (size_t i = 0; i < n->args.n && a->n < 8; i++) {
        a->kw[a->n] = n->kw ? n->kw[i] : NULL;
        a->v[a->n++] = eval(e, n->args.p[i]);
    }
    if (n->args.n > 8)
        efail(e, n, LLMEM_E_UNSUPPORTED, "more than 8 arguments");
}

/* positional i, or keyword name */
static ct_value arg(const args *a, int i, const char *name)
{
    int pos = 0;
    for (int k = 0; k < a->n; k++) {
        if (a->kw[k]) {
            if (name && !strcmp(a->kw[k], name))
                return a->v[k];
        } else if (pos++ == i) {
            return a->v[k];
        }
    }
    return UNDEF;
}

static ct_value new_str(ev *e, ct_buf *b)
{
    ct_value v = ct_str(ct_strndup(e->ar, b->p ? b->p : "", b->n), b->n);
    free(b->p);
    return v;
}

static ct_value strip(ct_value s, bool left, bool right, ct_value chars)
{
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    bool custom = chars.k == V_STR;
#define STRIPPABLE(c) (custom ? memchr(chars.u.s.p, (c), chars.u.s.n) != NULL : isspace((unsigned char)(c)))
    while (left && a < b && STRIPPABLE(p[a]))
        a++;
    while (right && b > a && STRIPPABLE(p[b - 1]))
        b--;
#undef STRIPPABLE
    return ct_str(p + a, b - a);
}

static ct_value case_map(ev *e, ct_value s, int mode) /* 0 lower 1 upper 2 title 3 capitalize */
{
    ct_buf b = {0};
    bool start = true;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.p[i];
        char o = (char)c;
        if (c < 0x80) {
            if (mode == 0 || (mode == 3 && i > 0) || (mode == 2 && !start))
                o = (char)tolower(c);
            else if (mode == 1 || start)
                o = (char)toupper(c);
            start = mode == 2 ? !isalnum(c) : false;
        }
        ct_put(&b, &o, 1);
    }
    return new_str(e, &b);
}

static ct_value replace(ev *e, ct_value s, ct_value a, ct_value b)
{
    if (s.k != V_STR || a.k != V_STR || b.k != V_STR || !a.u.s.n)
        return s;
    ct_buf r = {0};
    size_t run = 0;
    for (size_t i = 0; i + a.u.s.n <= s.u.s.n;) {
        if (!memcmp(s.u.s.p + i, a.u.s.p, a.u.s.n)) {
            ct_put(&r, s.u.s.p + run, i - run);
            ct_put(&r, b.u.s.p, b.u.s.n);
            i += a.u.s.n;
            run = i;
        } else {
            i++;
        }
    }
    ct_put(&r, s.u.s.p + run, s.u.s.n - run);
    return new_str(e, &r);
}

static ct_value split(ev *e, ct_value s, ct_value sep)
{
    ct_list *l = new_list(e);
    if (!l || s.k != V_STR)
        return UNDEF;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    if (sep.k != V_STR) { /* split on whitespace runs */
        while (i < n) {
            while (i < n && isspace((unsigned char)p[i]))
                i++;
            size_t st = i;
            while (i < n && !isspace((unsigned char)p[i]))
                i++;
            if (i > st)
                ct_list_push(e->ar, l, ct_str(p + st, i - st));
        }
    } else {
        size_t st = 0;
        for (i = 0; sep.u.s.n && i + sep.u.s.n <= n;) {
            if (!memcmp(p + i, sep.u.s.p, sep.u.s.n)) {
                ct_list_push(e->ar, l, ct_str(p + st, i - st));
                i += sep.u.s.n;
                st = i;
            } else {
                i++;
            }
        }
        ct_list_push(e->ar, l, ct_str(p + st, n - st));
    }
    return (ct_value){V_LIST, {.l = l}};
}

static bool run_test(ev *e, const ct_node *n, const char *name, ct_value v, const args *a)
{
    ct_value x = arg(a, 0, NULL);
    if (!strcmp(name, "defined"))
        return v.k != V_UNDEF;
    if (!strcmp(name, "undefined"))
        return v.k == V_UNDEF;
    if (!strcmp(name, "none"))
        return v.k == V_NONE;
    if (!strcmp(name, "string"))
        return v.k == V_STR;
    if (!strcmp(name, "number"))
        return v.k == V_INT || v.k == V_FLOAT;
    if (!strcmp(name, "integer"))
        return v.k == V_INT;
    if (!strcmp(name, "float"))
        return v.k == V_FLOAT;
    if (!strcmp(name, "boolean"))
        return v.k == V_BOOL;
    if (!strcmp(name, "true"))
        return v.k == V_BOOL && v.u.b;
    if (!strcmp(name, "false"))
        return v.k == V_BOOL && !v.u.b;
    if (!strcmp(name, "mapping"))
        return v.k == V_DICT;
    if (!strcmp(name, "sequence") || !strcmp(name, "iterable"))
        return v.k == V_LIST || v.k == V_STR || v.k == V_DICT;
    if (!strcmp(name, "callable"))
        return v.k == V_MACRO;
    if (!strcmp(name, "odd"))
        return v.k == V_INT && (v.u.i & 1);
    if (!strcmp(name, "even"))
        return v.k == V_INT && !(v.u.i & 1);
    if (!strcmp(name, "divisibleby"))
        return v.k == V_INT && x.k == V_INT && x.u.i && v.u.i % x.u.i == 0;
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
        return equal(v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return !equal(v, x);
    if (!strcmp(name, "sameas"))
        return v.k == x.k && equal(v, x);
    if (!strcmp(name, "in"))
        return contains(x, v);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.k != V_STR)
            return false;
        for (size_t i = 0; i < v.u.s.n; i++)
            if (name[0] == 'l' ? isupper((unsigned char)v.u.s.p[i]) : islower((unsigned char)v.u.s.p[i]))
                return false;
        return true;
    }
    efail(e, n, LLMEM_E_UNSUPPORTED, "test '%s' is not supported", name);
    return false;
}

static ct_value do_filter(ev *e, const ct_node *n, const char *f, ct_value v, const args *a);

/* select/reject(attr) by a test */
static ct_value select_attr(ev *e, const ct_node *n, ct_value v, const args *a, bool by_attr, bool keep)
{
    ct_list *l = new_list(e);
    if (!l || v.k != V_LIST)
        return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
    int off = by_attr ? 1 : 0;
    ct_value an = arg(a, 0, NULL), tn = arg(a, off, NULL);
    args ta = {.n = 0};
    for (int k = off + 1; k < a->n && ta.n < 8; k++)
        if (!a->kw[k])
            ta.v[ta.n++] = a->v[k];
    for (size_t i = 0; i < v.u.l->n && !e->st; i++) {
        ct_value x = v.u.l->v[i];
        if (by_attr)
            x = an.k == V_STR ? attr(x, an.u.s.p, an.u.s.n) : UNDEF;
        bool r;
        if (tn.k == V_STR) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)tn.u.s.n, tn.u.s.p);
            r = run_test(e, n, name, x, &ta);
        } else {
            r = truthy(x);
        }
        if (r == keep)
            ct_list_push(e->ar, l, v.u.l->v[i]);
    }
    return (ct_value){V_LIST, {.l = l}};
}

static ct_value do_filter(ev *e, const ct_node *n, const char *f, ct_value v, const args *a)
{
    ct_value a0 = arg(a, 0, NULL);
    if (!strcmp(f, "trim") || !strcmp(f, "strip"))
        return v.k == V_STR ? strip(v, true, true, a0) : v;
    if (!strcmp(f, "length") || !strcmp(f, "count"))
        return vint(v.k == V_STR ? (int64_t)v.u.s.n : v.k == V_LIST ? (int64_t)v.u.l->n
                    : v.k == V_DICT ? (int64_t)v.u.d->n : 0);
    if (!strcmp(f, "tojson")) {
        ct_value ind = arg(a, 0, "indent");
        ct_buf b = {0};
        to_json(&b, v, ind.k == V_INT ? (int)ind.u.i : -1, 0);
        return new_str(e, &b);
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        bool boolean = truthy(arg(a, 1, "boolean"));
        return (v.k == V_UNDEF || (boolean && !truthy(v))) ? (a0.k == V_UNDEF ? ct_str("", 0) : a0) : v;
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
        v = str_of(e, v);
        return case_map(e, v, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
    }
    if (!strcmp(f, "string"))
        return str_of(e, v);
    if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape"))
        return f[0] == 's' ? v : v; /* autoescape is off: escaping is not done */
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (v.k == V_LIST && v.u.l->n)
            return v.u.l->v[f[0] == 'f' ? 0 : v.u.l->n - 1];
        if (v.k == V_STR && v.u.s.n)
            return ct_str(v.u.s.p + (f[0] == 'f' ? 0 : v.u.s.n - 1), 1);
        return UNDEF;
    }
    if (!strcmp(f, "join")) {
        ct_value sep = a0.k == V_STR ? a0 : ct_str("", 0), at = arg(a, 1, "attribute");
        ct_buf b = {0};
        for (size_t i = 0; v.k == V_LIST && i < v.u.l->n; i++) {
            if (i)
                ct_put(&b, sep.u.s.p, sep.u.s.n);
            ct_value x = v.u.l->v[i];
            if (at.k == V_STR)
                x = attr(x, at.u.s.p, at.u.s.n);
            to_str(&b, x, false);
        }
        return new_str(e, &b);
    }
    if (!strcmp(f, "replace"))
        return replace(e, v, a0, arg(a, 1, NULL));
    if (!strcmp(f, "int")) {
        if (v.k == V_STR)
            return vint(strtoll(ct_strndup(e->ar, v.u.s.p, v.u.s.n), NULL, 10));
        return vint(is_num(v) ? (int64_t)num(v) : 0);
    }
    if (!strcmp(f, "float"))
        return (ct_value){V_FLOAT, {.f = v.k == V_STR ? strtod(ct_strndup(e->ar, v.u.s.p, v.u.s.n), NULL) : num(v)}};
    if (!strcmp(f, "abs"))
        return v.k == V_INT ? vint(v.u.i < 0 ? -v.u.i : v.u.i) : (ct_value){V_FLOAT, {.f = fabs(num(v))}};
    if (!strcmp(f, "list") || !strcmp(f, "reverse") || !strcmp(f, "unique")) {
        ct_list *l = new_list(e);
        if (!l)
            return UNDEF;
        if (v.k == V_STR && f[0] == 'r') {
            ct_buf b = {0};
            for (size_t i = v.u.s.n; i > 0; i--)
                ct_put(&b, v.u.s.p + i - 1, 1);
            return new_str(e, &b);
        }
        size_t m = v.k == V_LIST ? v.u.l->n : v.k == V_DICT ? v.u.d->n : v.k == V_STR ? v.u.s.n : 0;
        for (size_t i = 0; i < m; i++) {
            size_t j = f[0] == 'r' ? m - 1 - i : i;
            ct_value x = v.k == V_LIST ? v.u.l->v[j] : v.k == V_DICT ? ct_str(v.u.d->key[j], v.u.d->key_len[j])
                                                                      : ct_str(v.u.s.p + j, 1);
            if (f[0] != 'u' || !contains((ct_value){V_LIST, {.l = l}}, x))
                ct_list_push(e->ar, l, x);
        }
        return (ct_value){V_LIST, {.l = l}};
    }
    if (!strcmp(f, "items") || !strcmp(f, "dictsort")) {
        ct_list *l = new_list(e);
        for (size_t i = 0; l && v.k == V_DICT && i < v.u.d->n; i++) {
            ct_list *pr = new_list(e);
            if (!pr)
                return UNDEF;
            ct_list_push(e->ar, pr, ct_str(v.u.d->key[i], v.u.d->key_len[i]));
            ct_list_push(e->ar, pr, v.u.d->v[i]);
            ct_list_push(e->ar, l, (ct_value){V_LIST, {.l = pr}});
        }
        return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
    }
    if (!strcmp(f, "indent")) {
        int64_t w = arg(a, 0, "width").k == V_INT ? arg(a, 0, "width").u.i : 4;
        bool first = truthy(arg(a, 1, "first")), blank = truthy(arg(a, 2, "blank"));
        v = str_of(e, v);
        ct_buf b = {0};
        bool line_start = first;
        for (size_t i = 0; i < v.u.s.n; i++) {
            char c = v.u.s.p[i];
            if (line_start && (blank || c != '\n'))
                for (int64_t k = 0; k < w; k++)
                    ct_put(&b, " ", 1);
            line_start = false;
            ct_put(&b, &c, 1);
            if (c == '\n')
                line_start = true;
        }
        return new_str(e, &b);
    }
    if (!strcmp(f, "map")) {
        ct_value at = arg(a, 0, "attribute");
        ct_list *l = new_list(e);
        for (size_t i = 0; l && v.k == V_LIST && i < v.u.l->n && !e->st; i++) {
            ct_value x = v.u.l->v[i];
            if (arg(a, 0, "attribute").k == V_STR && a->kw[0])
                x = attr(x, at.u.s.p, at.u.s.n);
            else if (a0.k == V_STR) {
                char fn[64];
                snprintf(fn, sizeof fn, "%.*s", (int)a0.u.s.n, a0.u.s.p);
                args rest = *a;
                rest.n = 0;
                x = do_filter(e, n, fn, x, &rest);
            }
            ct_list_push(e->ar, l, x);
        }
        return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
        return select_attr(e, n, v, a, true, f[0] == 's');
    if (!strcmp(f, "select") || !strcmp(f, "reject"))
        return select_attr(e, n, v, a, false, f[0] == 's');
    efail(e, n, LLMEM_E_UNSUPPORTED, "filter '%s' is not supported", f);
    return UNDEF;
}

static ct_value call_macro(ev *e, const ct_node *call, const ct_node *m, const args *a)
{
    if (e->n_frames >= 63 || e->depth > 50) {
        efail(e, call, LLMEM_E_INVALID, "macro recursion too deep");
        return UNDEF;
    }
    ct_dict *f = new_dict(e);
    if (!f)
        return UNDEF;
    const ct_node *params = m->a;
    for (size_t i = 0; i < params->args.n; i++) {
        const char *pname = params->kw[i] ? params->kw[i] : params->args.p[i]->name;
        ct_value v = arg(a, (int)i, pname);
        if (v.k == V_UNDEF && params->kw[i])
            v = eval(e, params->args.p[i]);
        ct_dict_set(e->ar, f, pname, strlen(pname), v);
    }
    e->frame[e->n_frames++] = f;
    e->depth++;
    ct_buf b = {0};
    exec_nodes(e, &m->body, &b);
    e->depth--;
    e->n_frames--;
    return new_str(e, &b);
}

static ct_value call_method(ev *e, const ct_node *n, ct_value o, const char *m, const args *a)
{
    ct_value a0 = arg(a, 0, NULL);
    if (o.k == V_STR) {
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            return strip(o, m[0] != 'r', m[0] != 'l', a0);
        if (!strcmp(m, "split"))
            return split(e, o, a0);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            if (a0.k != V_STR || a0.u.s.n > o.u.s.n)
                return vbool(false);
            const char *p = m[0] == 's' ? o.u.s.p : o.u.s.p + o.u.s.n - a0.u.s.n;
            return vbool(!memcmp(p, a0.u.s.p, a0.u.s.n));
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize"))
            return do_filter(e, n, m, o, a);
        if (!strcmp(m, "replace"))
            return replace(e, o, a0, arg(a, 1, NULL));
        if (!strcmp(m, "find")) {
            for (size_t i = 0; a0.k == V_STR && i + a0.u.s.n <= o.u.s.n; i++)
                if (!memcmp(o.u.s.p + i, a0.u.s.p, a0.u.s.n))
                    return vint((int64_t)i);
            return vint(-1);
        }
    } else if (o.k == V_DICT) {
        if (!strcmp(m, "items"))
            return do_filter(e, n, "items", o, a);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            ct_list *l = new_list(e);
            for (size_t i = 0; l && i < o.u.d->n; i++)
                ct_list_push(e->ar, l, m[0] == 'k' ? ct_str(o.u.d->key[i], o.u.d->key_len[i]) : o.u.d->v[i]);
            return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
        }
        if (!strcmp(m, "get")) {
            ct_value v = a0.k == V_STR ? attr(o, a0.u.s.p, a0.u.s.n) : UNDEF;
            return v.k == V_UNDEF ? (a->n > 1 ? arg(a, 1, NULL) : NONE) : v;
        }
    } else if (o.k == V_LIST) {
        if (!strcmp(m, "append")) {
            ct_list_push(e->ar, o.u.l, a0);
            return NONE;
        }
    }
    efail(e, n, LLMEM_E_UNSUPPORTED, "method '%s' is not supported on this value", m);
    return UNDEF;
}

static ct_value call(ev *e, const ct_node *n)
{
    args a;
    eval_args(e, n, &a);
    if (e->st)
        return UNDEF;
    const ct_node *f = n->a;
    if (f->k == N_ATTR) {
        ct_value o = eval(e, f->a);
        ct_value v = attr(o, f->name, strlen(f->name));
        if (v.k == V_MACRO && v.u.m)
            return call_macro(e, n, v.u.m, &a);
        return call_method(e, n, o, f->name, &a);
    }
    if (f->k == N_NAME) {
        ct_value v = lookup(e, f->name);
        if (v.k == V_MACRO && v.u.m)
            return call_macro(e, n, v.u.m, &a);
        const char *name = f->name;
        if (!strcmp(name, "raise_exception")) {
            ct_value m = str_of(e, arg(&a, 0, NULL));
            efail(e, n, LLMEM_E_INVALID, "raise_exception: %.*s", (int)m.u.s.n, m.u.s.p);
            return UNDEF;
        }
        if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
            ct_dict *d = new_dict(e);
            if (!d)
                return UNDEF;
            d->ns = name[0] == 'n';
            for (int i = 0; i < a.n; i++)
                if (a.kw[i])
                    ct_dict_set(e->ar, d, a.kw[i], strlen(a.kw[i]), a.v[i]);
            return (ct_value){V_DICT, {.d = d}};
        }
        if (!strcmp(name, "range")) {
            int64_t lo = 0, hi, st = 1;
            if (a.n == 1)
                hi = (int64_t)num(a.v[0]);
            else {
                lo = (int64_t)num(a.v[0]);
                hi = (int64_t)num(a.v[1]);
                if (a.n > 2)
                    st = (int64_t)num(a.v[2]);
            }
            ct_list *l = new_list(e);
            if (!l || !st || (hi - lo) / st > 100000) {
                efail(e, n, LLMEM_E_INVALID, "bad range()");
                return UNDEF;
            }
            for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
                ct_list_push(e->ar, l, vint(i));
            return (ct_value){V_LIST, {.l = l}};
        }
        if (!strcmp(name, "strftime_now")) {
            char out[128] = "";
            time_t now = time(NULL);
            struct tm tm;
            ct_value fmt = str_of(e, arg(&a, 0, NULL));
            localtime_r(&now, &tm);
            size_t k = strftime(out, sizeof out, ct_strndup(e->ar, fmt.u.s.p, fmt.u.s.n), &tm);
            return ct_str(ct_strndup(e->ar, out, k), k);
        }
        efail(e, n, LLMEM_E_UNSUPPORTED, "function '%s' is not supported", name);
        return UNDEF;
    }
    efail(e, n, LLMEM_E_UNSUPPORTED, "this call is not supported");
    return UNDEF;
}

static ct_value eval(ev *e, const ct_node *n)
{
    if (e->st || !n)
        return UNDEF;
    switch (n->k) {
    case N_LIT: return n->lit;
    case N_NAME: return lookup(e, n->name);
    case N_ATTR: {
        ct_value o = eval(e, n->a);
        return attr(o, n->name, strlen(n->name));
    }
    case N_ITEM: {
        ct_value o = eval(e, n->a), k = eval(e, n->b);
        return item(e, o, k);
    }
    case N_SLICE: {
        ct_value o = eval(e, n->a), a = eval(e, n->b), b = eval(e, n->c);
        ct_value c = n->args.n && n->args.p[0] ? eval(e, n->args.p[0]) : UNDEF;
        return slice(e, n, o, a, b, c);
    }
    case N_CALL: return call(e, n);
    case N_FILTER: {
        ct_value v = eval(e, n->a);
        args a;
        eval_args(e, n, &a);
        return e->st ? UNDEF : do_filter(e, n, n->name, v, &a);
    }
    case N_TEST: {
        ct_value v = eval(e, n->a);
        args a;
        eval_args(e, n, &a);
        bool r = run_test(e, n, n->name, v, &a);
        return vbool(r != n->negate);
    }
    case N_BIN: return binop(e, n);
    case N_NOT: return vbool(!truthy(eval(e, n->a)));
    case N_NEG: {
        ct_value v = eval(e, n->a);
        return v.k == V_INT ? vint(-v.u.i) : (ct_value){V_FLOAT, {.f = -num(v)}};
    }
    case N_COND: return truthy(eval(e, n->c)) ? eval(e, n->a) : eval(e, n->b);
    case N_LIST: {
        ct_list *l = new_list(e);
        for (size_t i = 0; l && i < n->args.n; i++)
            ct_list_push(e->ar, l, eval(e, n->args.p[i]));
        return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
    }
    case N_DICT: {
        ct_dict *d = new_dict(e);
        for (size_t i = 0; d && i + 1 < n->args.n; i += 2) {
            ct_value k = str_of(e, eval(e, n->args.p[i]));
            ct_dict_set(e->ar, d, k.u.s.p, k.u.s.n, eval(e, n->args.p[i + 1]));
        }
        return d ? (ct_value){V_DICT, {.d = d}} : UNDEF;
    }
    default: efail(e, n, LLMEM_E_INVALID, "not an expression"); return UNDEF;
    }
}

/* ---- statements ------------------------------------------------------------------------ */

static void set_var(ev *e, const char *name, ct_value v)
{
    ct_dict_set(e->ar, e->frame[e->n_frames - 1], name, strlen(name), v);
}

static void exec_for(ev *e, const ct_node *n, ct_buf *out)
{
    ct_value it = eval(e, n->a);
    if (it.k == V_DICT) {
        ct_list *keys = new_list(e);
        for (size_t i = 0; keys && i < it.u.d->n; i++)
            ct_list_push(e->ar, keys, ct_str(it.u.d->key[i], it.u.d->key_len[i]));
        it = keys ? (ct_value){V_LIST, {.l = keys}} : UNDEF;
    } else if (it.k == V_STR) {
        it = do_filter(e, n, "list", it, &(args){.n = 0});
    }
    if (it.k != V_LIST) {
        if (it.k != V_UNDEF && it.k != V_NONE)
            efail(e, n, LLMEM_E_INVALID, "cannot loop over this value");
        if (!e->st)
            exec_nodes(e, &n->body2, out);
        return;
    }
    if (e->n_frames >= 63) {
        efail(e, n, LLMEM_E_INVALID, "loops nested too deep");
        return;
    }
    /* the "if" filter applies before loop.* counts */
    ct_list *items = new_list(e);
    ct_dict *f = new_dict(e);
    if (!items || !f)
        return;
    e->frame[e->n_frames++] = f;
    for (size_t i = 0; i < it.u.l->n && !e->st; i++) {
        ct_value x = it.u.l->v[i];
        if (n->c) {
            if (n->name2 && x.k == V_LIST && x.u.l->n == 2) {
                set_var(e, n->name, x.u.l->v[0]);
                set_var(e, n->name2, x.u.l->v[1]);
            } else {
                set_var(e, n->name, x);
            }
            if (!truthy(eval(e, n->c)))
                continue;
        }
        ct_list_push(e->ar, items, x);
    }
    e->n_frames--;
    size_t len = items->n;
    for (size_t i = 0; i < len && !e->st; i++) {
        ct_dict *fr = new_dict(e), *loop = new_dict(e);
        if (!fr || !loop)
            return;
        ct_value x = items->v[i];
        ct_dict_set(e->ar, loop, "index", 5, vint((int64_t)i + 1));
        ct_dict_set(e->ar, loop, "index0", 6, vint((int64_t)i));
        ct_dict_set(e->ar, loop, "revindex", 8, vint((int64_t)(len - i)));
        ct_dict_set(e->ar, loop, "revindex0", 9, vint((int64_t)(len - i - 1)));
        ct_dict_set(e->ar, loop, "first", 5, vbool(i == 0));
        ct_dict_set(e->ar, loop, "last", 4, vbool(i + 1 == len));
        ct_dict_set(e->ar, loop, "length", 6, vint((int64_t)len));
        ct_dict_set(e->ar, loop, "previtem", 8, i ? items->v[i - 1] : UNDEF);
        ct_dict_set(e->ar, loop, "nextitem", 8, i + 1 < len ? items->v[i + 1] : UNDEF);
        e->frame[e->n_frames++] = fr;
        set_var(e, "loop", (ct_value){V_DICT, {.d = loop}});
        if (n->name2) {
            if (x.k != V_LIST || x.u.l->n != 2) {
                efail(e, n, LLMEM_E_INVALID, "cannot unpack a loop item into two names");
                e->n_frames--;
                return;
            }
            set_var(e, n->name, x.u.l->v[0]);
            set_var(e, n->name2, x.u.l->v[1]);
        } else {
            set_var(e, n->name, x);
        }
        exec_nodes(e, &n->body, out);
        e->n_frames--;
        int ctl = e->ctl;
        e->ctl = 0;
        if (ctl == 1)
            break;
    }
    if (!len && !e->st)
        exec_nodes(e, &n->body2, out);
}

static void exec_nodes(ev *e, const ct_nodes *body, ct_buf *out)
{
    for (size_t i = 0; i < body->n && !e->st && !e->ctl; i++) {
        const ct_node *n = body->p[i];
        switch (n->k) {
        case N_TEXT: ct_put(out, n->lit.u.s.p, n->lit.u.s.n); break;
        case N_OUT: to_str(out, eval(e, n->a), false); break;
        case N_IF: {
            size_t k;
            for (k = 0; k < n->conds.n && !e->st; k++)
                if (truthy(eval(e, n->conds.p[k]))) {
                    exec_nodes(e, &n->body.p[k]->body, out);
                    break;
                }
            if (k == n->conds.n && !e->st)
                exec_nodes(e, &n->body2, out);
            break;
        }
        case N_FOR: exec_for(e, n, out); break;
        case N_SET: {
            ct_value v;
            if (n->a) {
                v = eval(e, n->a);
            } else {
                ct_buf b = {0};
                exec_nodes(e, &n->body, &b);
                v = new_str(e, &b);
            }
            if (n->name2) {
                ct_value ns = lookup(e, n->name);
                if (ns.k != V_DICT || !ns.u.d->ns) {
                    efail(e, n, LLMEM_E_INVALID, "'%s' is not a namespace", n->name);
                    break;
                }
                ct_dict_set(e->ar, ns.u.d, n->name2, strlen(n->name2), v);
            } else {
                set_var(e, n->name, v);
            }
            break;
        }
        case N_MACRO: set_var(e, n->name, (ct_value){V_MACRO, {.m = n}}); break;
        case N_BREAK: e->ctl = 1; break;
        case N_CONTINUE: e->ctl = 2; break;
        default: efail(e, n, LLMEM_E_INVALID, "bad statement"); break;
        }
        if (e->ar->oom || out->oom)
            e->st = LLMEM_E_NO_MEMORY;
    }
}

/* ---- public API ------------------------------------------------------------------------- */

llmem_status ct_render(const llmem_chat_template *t, ct_dict *globals, ct_arena *ar, ct_buf *out, char *err,
                       size_t err_len)
{
    ev e = {.ar = ar, .err = err, .err_len = err_len};
    ct_dict *top = ct_alloc(ar, sizeof *top);
    if (!top)
        return LLMEM_E_NO_MEMORY;
    e.frame[0] = globals;
    e.frame[1] = top;
    e.n_frames = 2;
    exec_nodes(&e, &t->root, out);
    if (!e.st && (out->oom || ar->oom))
        e.st = LLMEM_E_NO_MEMORY;
    return e.st;
}

llmem_status llmem_chat_template_create(const char *source, llmem_chat_template **out, char *err,
                                        size_t err_len)
{
    if (out)
        *out = NULL;
    if (!source || !out) {
        if (err && err_len)
            snprintf(err, err_len, "chat_template_create: NULL argument");
        return LLMEM_E_INVALID;
    }
    llmem_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = ct_parse(t, source, err, err_len);
    if (st) {
        llmem_chat_template_destroy(t);
        return st;
    }
    *out = t;
    return LLMEM_OK;
}

void llmem_chat_template_destroy(llmem_chat_template *tmpl)
{
    if (!tmpl)
        return;
    ct_arena_free(&tmpl->arena);
    free(tmpl);
}

static ct_value from_json(ct_arena *a, const cJSON *j)
{
    if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring);
        return ct_str(ct_strndup(a, j->valuestring, n), n);
    }
    if (cJSON_IsBool(j))
        return vbool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9e15)
            return vint((int64_t)d);
        return (ct_value){V_FLOAT, {.f = d}};
    }
    if (cJSON_IsArray(j)) {
        ct_list *l = ct_alloc(a, sizeof *l);
        const cJSON *x;
        cJSON_ArrayForEach(x, j) if (l) ct_list_push(a, l, from_json(a, x));
        return l ? (ct_value){V_LIST, {.l = l}} : UNDEF;
    }
    if (cJSON_IsObject(j)) {
        ct_dict *d = ct_alloc(a, sizeof *d);
        const cJSON *x;
        cJSON_ArrayForEach(x, j) if (d) {
            size_t n = strlen(x->string);
            ct_dict_set(a, d, ct_strndup(a, x->string, n), n, from_json(a, x));
        }
        return d ? (ct_value){V_DICT, {.d = d}} : UNDEF;
    }
    return NONE;
}

static llmem_status finish(llmem_status st, ct_buf *b, char **out, size_t *out_len)
{
    if (st || b->oom) {
        free(b->p);
        return st ? st : LLMEM_E_NO_MEMORY;
    }
    if (!b->p)
        ct_put(b, "", 0);
    if (b->oom)
        return LLMEM_E_NO_MEMORY;
    *out = b->p;
    if (out_len)
        *out_len = b->n;
    return LLMEM_OK;
}

llmem_status llmem_chat_template_render_json(const llmem_chat_template *tmpl, const char *context_json,
                                             char **out, size_t *out_len, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!tmpl || !context_json || !out) {
        if (err && err_len)
            snprintf(err, err_len, "chat_template_render: NULL argument");
        return LLMEM_E_INVALID;
    }
    cJSON *j = cJSON_Parse(context_json);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        if (err && err_len)
            snprintf(err, err_len, "chat_template_render: the context is not a JSON object");
        return LLMEM_E_INVALID;
    }
    ct_arena ar = {0};
    ct_value g = from_json(&ar, j);
    cJSON_Delete(j);
    ct_buf b = {0};
    llmem_status st = g.k == V_DICT ? ct_render(tmpl, g.u.d, &ar, &b, err, err_len) : LLMEM_E_NO_MEMORY;
    ct_arena_free(&ar);
    return finish(st, &b, out, out_len);
}

llmem_status llmem_chat_template_render(const llmem_chat_template *tmpl, const llmem_chat_message *msgs,
                                        size_t n_msgs, bool add_generation_prompt, const char *bos_token,
                                        const char *eos_token, char **out, size_t *out_len, char *err,
                                        size_t err_len)
{
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!tmpl || !out || (!msgs && n_msgs)) {
        if (err && err_len)
            snprintf(err, err_len, "chat_template_render: NULL argument");
        return LLMEM_E_INVALID;
    }
    ct_arena ar = {0};
    ct_dict *g = ct_alloc(&ar, sizeof *g);
    ct_list *l = ct_alloc(&ar, sizeof *l);
    llmem_status st = LLMEM_E_NO_MEMORY;
    ct_buf b = {0};
    if (!g || !l)
        goto done;
    for (size_t i = 0; i < n_msgs; i++) {
        ct_dict *m = ct_alloc(&ar, sizeof *m);
        if (!m)
            goto done;
        const char *r = msgs[i].role ? msgs[i].role : "user";
        ct_dict_set(&ar, m, "role", 4, ct_str(r, strlen(r)));
        ct_dict_set(&ar, m, "content", 7,
                    msgs[i].content ? ct_str(msgs[i].content, strlen(msgs[i].content)) : NONE);
        ct_list_push(&ar, l, (ct_value){V_DICT, {.d = m}});
    }
    ct_dict_set(&ar, g, "messages", 8, (ct_value){V_LIST, {.l = l}});
    ct_dict_set(&ar, g, "add_generation_prompt", 21, vbool(add_generation_prompt));
    ct_dict_set(&ar, g, "bos_token", 9, ct_str(bos_token ? bos_token : "", bos_token ? strlen(bos_token) : 0));
    ct_dict_set(&ar, g, "eos_token", 9, ct_str(eos_token ? eos_token : "", eos_token ? strlen(eos_token) : 0));
    if (!ar.oom)
        st = ct_render(tmpl, g, &ar, &b, err, err_len);
done:
    ct_arena_free(&ar);
    return finish(st, &b, out, out_len);
}

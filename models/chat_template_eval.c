/* llmem: chat templates -- evaluation of expressions and statements:
 * scopes (a for loop body is its own scope, as in Jinja2; namespace()
 * carries values out), loop variables, loop controls, macros and the
 * built-in functions raise_exception, namespace, range and strftime_now.
 * Reference: Jinja2 3.1 "Template Designer Documentation" (Assignments,
 * Loop Controls, Macros); transformers utils/chat_template_utils.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/chat_template_internal.h"

/* ---- expressions --------------------------------------------------------------------- */

static ct_value eval(ct_ev *e, const ct_node *n);
static void exec_nodes(ct_ev *e, const ct_nodes *body, ct_buf *out);

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
static ct_value lookup(ct_ev *e, const char *name)
{
    size_t n = strlen(name);
    for (int i = e->n_frames - 1; i >= 0; i--) {
        ct_value *v = ct_dict_get(e->frame[i], name, n);
        if (v)
            return *v;
    }
    return is_builtin(name) ? (ct_value){V_MACRO, {.m = NULL}} : CT_UNDEF;
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

static ct_value item(ct_ev *e, ct_value o, ct_value k)
{
    if (o.k == V_DICT && k.k == V_STR)
        return ct_attr(o, k.u.s.p, k.u.s.n);
    if ((o.k == V_LIST || o.k == V_STR) && k.k == V_INT) {
        size_t n = o.k == V_LIST ? o.u.l->n : o.u.s.n;
        int64_t i = norm_index(k.u.i, n);
        if (i < 0 || (size_t)i >= n)
            return CT_UNDEF;
        return o.k == V_LIST ? o.u.l->v[i] : ct_str(o.u.s.p + i, 1);
    }
    (void)e;
    return CT_UNDEF;
}

static ct_value slice(ct_ev *e, const ct_node *n, ct_value o, ct_value a, ct_value b, ct_value c)
{
    int64_t step = c.k == V_INT ? c.u.i : 1;
    if (step == 0 || (o.k != V_LIST && o.k != V_STR)) {
        ct_fail(e, n, LLMEM_E_INVALID, "bad slice");
        return CT_UNDEF;
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
    ct_list *l = ct_new_list(e);
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
    return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
}

static int compare(ct_value a, ct_value b, bool *ok)
{
    *ok = true;
    if (ct_is_num(a) && ct_is_num(b))
        return ct_num(a) < ct_num(b) ? -1 : ct_num(a) > ct_num(b);
    if (a.k == V_STR && b.k == V_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, m);
        return c ? c : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    *ok = false;
    return 0;
}

/* The strings x and y (V_STR) joined, in the render's arena; undefined when out of memory. */
static ct_value concat(ct_ev *e, ct_value x, ct_value y)
{
    char *p = ct_alloc(e->ar, x.u.s.n + y.u.s.n + 1);
    if (!p)
        return CT_UNDEF;
    memcpy(p, x.u.s.p, x.u.s.n);
    memcpy(p + x.u.s.n, y.u.s.p, y.u.s.n);
    return ct_str(p, x.u.s.n + y.u.s.n);
}

static ct_value binop(ct_ev *e, const ct_node *n)
{
    const char *op = n->name;
    if (!strcmp(op, "and")) {
        ct_value a = eval(e, n->a);
        return ct_truthy(a) ? eval(e, n->b) : a;
    }
    if (!strcmp(op, "or")) {
        ct_value a = eval(e, n->a);
        return ct_truthy(a) ? a : eval(e, n->b);
    }
    ct_value a = eval(e, n->a), b = eval(e, n->b);
    if (e->st)
        return CT_UNDEF;
    if (!strcmp(op, "~")) {
        ct_value x = ct_str_of(e, a), y = ct_str_of(e, b);
        return concat(e, x, y);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!="))
        return ct_bool(ct_equal(a, b) == (op[0] == '='));
    if (!strcmp(op, "in"))
        return ct_bool(ct_contains(b, a) != n->negate);
    if (op[0] == '<' || op[0] == '>') {
        bool ok;
        int c = compare(a, b, &ok);
        if (!ok) {
            ct_fail(e, n, LLMEM_E_INVALID, "cannot compare these values with '%s'", op);
            return CT_UNDEF;
        }
        return ct_bool(!strcmp(op, "<") ? c < 0 : !strcmp(op, ">") ? c > 0 : !strcmp(op, "<=") ? c <= 0 : c >= 0);
    }
    if (!strcmp(op, "+") && a.k == V_STR && b.k == V_STR) {
        return concat(e, a, b);
    }
    if (!strcmp(op, "+") && a.k == V_LIST && b.k == V_LIST) {
        ct_list *l = ct_new_list(e);
        for (size_t i = 0; l && i < a.u.l->n; i++)
            ct_list_push(e->ar, l, a.u.l->v[i]);
        for (size_t i = 0; l && i < b.u.l->n; i++)
            ct_list_push(e->ar, l, b.u.l->v[i]);
        return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
    }
    if (!strcmp(op, "*") && a.k == V_STR && b.k == V_INT) {
        if (b.u.i > 0 && a.u.s.n && (uint64_t)b.u.i > CT_MAX_OUTPUT / a.u.s.n) {
            ct_fail(e, n, LLMEM_E_INVALID, "string repeated past %zu bytes", CT_MAX_OUTPUT);
            return CT_UNDEF;
        }
        ct_buf r = {0};
        for (int64_t i = 0; i < b.u.i; i++)
            ct_put(&r, a.u.s.p, a.u.s.n);
        ct_value v = ct_str(ct_strndup(e->ar, r.p ? r.p : "", r.n), r.n);
        free(r.p);
        return v;
    }
    if (!ct_is_num(a) || !ct_is_num(b)) {
        ct_fail(e, n, LLMEM_E_INVALID, "unsupported operand types for '%s'", op);
        return CT_UNDEF;
    }
    bool ints = a.k != V_FLOAT && b.k != V_FLOAT;
    int64_t x = a.k == V_INT ? a.u.i : (int64_t)ct_num(a), y = b.k == V_INT ? b.u.i : (int64_t)ct_num(b);
    if ((!strcmp(op, "/") || !strcmp(op, "//") || !strcmp(op, "%")) && ct_num(b) == 0) {
        ct_fail(e, n, LLMEM_E_INVALID, "division by zero");
        return CT_UNDEF;
    }
    switch (op[0]) {
    case '+': return ints ? ct_int(x + y) : (ct_value){V_FLOAT, {.f = ct_num(a) + ct_num(b)}};
    case '-': return ints ? ct_int(x - y) : (ct_value){V_FLOAT, {.f = ct_num(a) - ct_num(b)}};
    case '*':
        if (op[1] == '*')
            return ints && y >= 0 ? ct_int((int64_t)pow((double)x, (double)y))
                                  : (ct_value){V_FLOAT, {.f = pow(ct_num(a), ct_num(b))}};
        return ints ? ct_int(x * y) : (ct_value){V_FLOAT, {.f = ct_num(a) * ct_num(b)}};
    case '/':
        if (op[1] == '/')
            return ints ? ct_int((x - (((x % y) + y) % y)) / y) : (ct_value){V_FLOAT, {.f = floor(ct_num(a) / ct_num(b))}};
        return (ct_value){V_FLOAT, {.f = ct_num(a) / ct_num(b)}};
    case '%': return ints ? ct_int(((x % y) + y) % y) : (ct_value){V_FLOAT, {.f = fmod(ct_num(a), ct_num(b))}};
    }
    ct_fail(e, n, LLMEM_E_UNSUPPORTED, "operator '%s' is not supported", op);
    return CT_UNDEF;
}

/* evaluated arguments of a call/filter/test: positional then keywords */
static void eval_args(ct_ev *e, const ct_node *n, ct_args *a)
{
    a->n = 0;
    for (size_t i = 0; i < n->args.n && a->n < 8; i++) {
        a->kw[a->n] = n->kw ? n->kw[i] : NULL;
        a->v[a->n++] = eval(e, n->args.p[i]);
    }
    if (n->args.n > 8)
        ct_fail(e, n, LLMEM_E_UNSUPPORTED, "more than 8 arguments");
}


static ct_value call_macro(ct_ev *e, const ct_node *call, const ct_node *m, const ct_args *a)
{
    if (e->n_frames >= 63 || e->depth > 50) {
        ct_fail(e, call, LLMEM_E_INVALID, "macro recursion too deep");
        return CT_UNDEF;
    }
    ct_dict *f = ct_new_dict(e);
    if (!f)
        return CT_UNDEF;
    const ct_node *params = m->a;
    for (size_t i = 0; i < params->args.n; i++) {
        const char *pname = params->kw[i] ? params->kw[i] : params->args.p[i]->name;
        ct_value v = ct_arg(a, (int)i, pname);
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
    return ct_new_str(e, &b);
}

static ct_value call(ct_ev *e, const ct_node *n)
{
    ct_args a;
    eval_args(e, n, &a);
    if (e->st)
        return CT_UNDEF;
    const ct_node *f = n->a;
    if (f->k == N_ATTR) {
        ct_value o = eval(e, f->a);
        ct_value v = ct_attr(o, f->name, strlen(f->name));
        if (v.k == V_MACRO && v.u.m)
            return call_macro(e, n, v.u.m, &a);
        return ct_method(e, n, o, f->name, &a);
    }
    if (f->k == N_NAME) {
        ct_value v = lookup(e, f->name);
        if (v.k == V_MACRO && v.u.m)
            return call_macro(e, n, v.u.m, &a);
        const char *name = f->name;
        if (!strcmp(name, "raise_exception")) {
            ct_value m = ct_str_of(e, ct_arg(&a, 0, NULL));
            ct_fail(e, n, LLMEM_E_INVALID, "raise_exception: %.*s", (int)m.u.s.n, m.u.s.p);
            return CT_UNDEF;
        }
        if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
            ct_dict *d = ct_new_dict(e);
            if (!d)
                return CT_UNDEF;
            d->ns = name[0] == 'n';
            for (int i = 0; i < a.n; i++)
                if (a.kw[i])
                    ct_dict_set(e->ar, d, a.kw[i], strlen(a.kw[i]), a.v[i]);
            return (ct_value){V_DICT, {.d = d}};
        }
        if (!strcmp(name, "range")) {
            int64_t lo = 0, hi, st = 1;
            if (a.n == 1)
                hi = (int64_t)ct_num(a.v[0]);
            else {
                lo = (int64_t)ct_num(a.v[0]);
                hi = (int64_t)ct_num(a.v[1]);
                if (a.n > 2)
                    st = (int64_t)ct_num(a.v[2]);
            }
            ct_list *l = ct_new_list(e);
            if (!l || !st || (hi - lo) / st > 100000) {
                ct_fail(e, n, LLMEM_E_INVALID, "bad range()");
                return CT_UNDEF;
            }
            for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
                ct_list_push(e->ar, l, ct_int(i));
            return (ct_value){V_LIST, {.l = l}};
        }
        if (!strcmp(name, "strftime_now")) {
            char out[128] = "";
            time_t now = time(NULL);
            struct tm tm;
            ct_value fmt = ct_str_of(e, ct_arg(&a, 0, NULL));
            localtime_r(&now, &tm);
            size_t k = strftime(out, sizeof out, ct_strndup(e->ar, fmt.u.s.p, fmt.u.s.n), &tm);
            return ct_str(ct_strndup(e->ar, out, k), k);
        }
        ct_fail(e, n, LLMEM_E_UNSUPPORTED, "function '%s' is not supported", name);
        return CT_UNDEF;
    }
    ct_fail(e, n, LLMEM_E_UNSUPPORTED, "this call is not supported");
    return CT_UNDEF;
}

static bool over_budget(ct_ev *e, const ct_node *n)
{
    if (++e->steps <= CT_MAX_STEPS)
        return false;
    ct_fail(e, n, LLMEM_E_INVALID, "the template ran past its budget of %u steps", CT_MAX_STEPS);
    return true;
}

static ct_value eval(ct_ev *e, const ct_node *n)
{
    if (e->st || !n || over_budget(e, n))
        return CT_UNDEF;
    switch (n->k) {
    case N_LIT: return n->lit;
    case N_NAME: return lookup(e, n->name);
    case N_ATTR: {
        ct_value o = eval(e, n->a);
        return ct_attr(o, n->name, strlen(n->name));
    }
    case N_ITEM: {
        ct_value o = eval(e, n->a), k = eval(e, n->b);
        return item(e, o, k);
    }
    case N_SLICE: {
        ct_value o = eval(e, n->a), a = eval(e, n->b), b = eval(e, n->c);
        ct_value c = n->args.n && n->args.p[0] ? eval(e, n->args.p[0]) : CT_UNDEF;
        return slice(e, n, o, a, b, c);
    }
    case N_CALL: return call(e, n);
    case N_FILTER: {
        ct_value v = eval(e, n->a);
        ct_args a;
        eval_args(e, n, &a);
        return e->st ? CT_UNDEF : ct_filter(e, n, n->name, v, &a);
    }
    case N_TEST: {
        ct_value v = eval(e, n->a);
        ct_args a;
        eval_args(e, n, &a);
        bool r = ct_test(e, n, n->name, v, &a);
        return ct_bool(r != n->negate);
    }
    case N_BIN: return binop(e, n);
    case N_NOT: return ct_bool(!ct_truthy(eval(e, n->a)));
    case N_NEG: {
        ct_value v = eval(e, n->a);
        return v.k == V_INT ? ct_int(-v.u.i) : (ct_value){V_FLOAT, {.f = -ct_num(v)}};
    }
    case N_COND: return ct_truthy(eval(e, n->c)) ? eval(e, n->a) : eval(e, n->b);
    case N_LIST: {
        ct_list *l = ct_new_list(e);
        for (size_t i = 0; l && i < n->args.n; i++)
            ct_list_push(e->ar, l, eval(e, n->args.p[i]));
        return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
    }
    case N_DICT: {
        ct_dict *d = ct_new_dict(e);
        for (size_t i = 0; d && i + 1 < n->args.n; i += 2) {
            ct_value k = ct_str_of(e, eval(e, n->args.p[i]));
            ct_dict_set(e->ar, d, k.u.s.p, k.u.s.n, eval(e, n->args.p[i + 1]));
        }
        return d ? (ct_value){V_DICT, {.d = d}} : CT_UNDEF;
    }
    default: ct_fail(e, n, LLMEM_E_INVALID, "not an expression"); return CT_UNDEF;
    }
}

/* ---- statements ------------------------------------------------------------------------ */

static void set_var(ct_ev *e, const char *name, ct_value v)
{
    ct_dict_set(e->ar, e->frame[e->n_frames - 1], name, strlen(name), v);
}

static void exec_for(ct_ev *e, const ct_node *n, ct_buf *out)
{
    ct_value it = eval(e, n->a);
    if (it.k == V_DICT) {
        ct_list *keys = ct_new_list(e);
        for (size_t i = 0; keys && i < it.u.d->n; i++)
            ct_list_push(e->ar, keys, ct_str(it.u.d->key[i], it.u.d->key_len[i]));
        it = keys ? (ct_value){V_LIST, {.l = keys}} : CT_UNDEF;
    } else if (it.k == V_STR) {
        it = ct_filter(e, n, "list", it, &(ct_args){.n = 0});
    }
    if (it.k != V_LIST) {
        if (it.k != V_UNDEF && it.k != V_NONE)
            ct_fail(e, n, LLMEM_E_INVALID, "cannot loop over this value");
        if (!e->st)
            exec_nodes(e, &n->body2, out);
        return;
    }
    if (e->n_frames >= 63) {
        ct_fail(e, n, LLMEM_E_INVALID, "loops nested too deep");
        return;
    }
    /* the "if" filter applies before loop.* counts; without one the list
     * itself is iterated (its length taken now, as Python would see a
     * copy) */
    ct_list *items = n->c ? ct_new_list(e) : it.u.l;
    ct_dict *f = ct_new_dict(e);
    if (!items || !f)
        return;
    e->frame[e->n_frames++] = f;
    for (size_t i = 0; n->c && i < it.u.l->n && !e->st; i++) {
        ct_value x = it.u.l->v[i];
        if (n->c) {
            if (n->name2 && x.k == V_LIST && x.u.l->n == 2) {
                set_var(e, n->name, x.u.l->v[0]);
                set_var(e, n->name2, x.u.l->v[1]);
            } else {
                set_var(e, n->name, x);
            }
            if (!ct_truthy(eval(e, n->c)))
                continue;
        }
        ct_list_push(e->ar, items, x);
    }
    e->n_frames--;
    size_t len = items->n;
    /* one loop object for the whole loop, as Jinja2's LoopContext; one
     * scope emptied at each iteration (a set in one iteration is not seen
     * by the next) */
    ct_dict *fr = ct_new_dict(e), *loop = ct_new_dict(e);
    if (!fr || !loop)
        return;
    for (size_t i = 0; i < len && !e->st && !over_budget(e, n); i++) {
        fr->n = 0;
        ct_value x = items->v[i];
        ct_dict_set(e->ar, loop, "index", 5, ct_int((int64_t)i + 1));
        ct_dict_set(e->ar, loop, "index0", 6, ct_int((int64_t)i));
        ct_dict_set(e->ar, loop, "revindex", 8, ct_int((int64_t)(len - i)));
        ct_dict_set(e->ar, loop, "revindex0", 9, ct_int((int64_t)(len - i - 1)));
        ct_dict_set(e->ar, loop, "first", 5, ct_bool(i == 0));
        ct_dict_set(e->ar, loop, "last", 4, ct_bool(i + 1 == len));
        ct_dict_set(e->ar, loop, "length", 6, ct_int((int64_t)len));
        ct_dict_set(e->ar, loop, "previtem", 8, i ? items->v[i - 1] : CT_UNDEF);
        ct_dict_set(e->ar, loop, "nextitem", 8, i + 1 < len ? items->v[i + 1] : CT_UNDEF);
        e->frame[e->n_frames++] = fr;
        set_var(e, "loop", (ct_value){V_DICT, {.d = loop}});
        if (n->name2) {
            if (x.k != V_LIST || x.u.l->n != 2) {
                ct_fail(e, n, LLMEM_E_INVALID, "cannot unpack a loop item into two names");
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

static void exec_nodes(ct_ev *e, const ct_nodes *body, ct_buf *out)
{
    for (size_t i = 0; i < body->n && !e->st && !e->ctl; i++) {
        const ct_node *n = body->p[i];
        if (over_budget(e, n))
            break;
        if (out->n > CT_MAX_OUTPUT) {
            ct_fail(e, n, LLMEM_E_INVALID, "the template's output passed %zu bytes", CT_MAX_OUTPUT);
            break;
        }
        switch (n->k) {
        case N_TEXT: ct_put(out, n->lit.u.s.p, n->lit.u.s.n); break;
        case N_OUT: ct_to_str(out, eval(e, n->a), false); break;
        case N_IF: {
            size_t k;
            for (k = 0; k < n->conds.n && !e->st; k++)
                if (ct_truthy(eval(e, n->conds.p[k]))) {
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
                v = ct_new_str(e, &b);
            }
            if (n->name2) {
                ct_value ns = lookup(e, n->name);
                if (ns.k != V_DICT || !ns.u.d->ns) {
                    ct_fail(e, n, LLMEM_E_INVALID, "'%s' is not a namespace", n->name);
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
        default: ct_fail(e, n, LLMEM_E_INVALID, "bad statement"); break;
        }
        if (e->ar->oom || out->oom)
            e->st = LLMEM_E_NO_MEMORY;
    }
}

llmem_status ct_render(const llmem_chat_template *t, ct_dict *globals, ct_arena *ar, ct_buf *out, char *err,
                       size_t err_len)
{
    ct_ev e = {.ar = ar, .err = err, .err_len = err_len};
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



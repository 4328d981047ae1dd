/* llmem: chat templates -- Jinja2 filters, tests and the str/dict/list
 * methods chat templates call. Reference: Jinja2 3.1 "List of Builtin
 * Filters" and "List of Builtin Tests"; Python's str methods. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/chat_template_internal.h"

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

static ct_value case_map(ct_ev *e, ct_value s, int mode) /* 0 lower 1 upper 2 title 3 capitalize */
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
    return ct_new_str(e, &b);
}

static ct_value replace(ct_ev *e, ct_value s, ct_value a, ct_value b)
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
    return ct_new_str(e, &r);
}

static ct_value split(ct_ev *e, ct_value s, ct_value sep)
{
    ct_list *l = ct_new_list(e);
    if (!l || s.k != V_STR)
        return CT_UNDEF;
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

bool ct_test(ct_ev *e, const ct_node *n, const char *name, ct_value v, const ct_args *a)
{
    ct_value x = ct_arg(a, 0, NULL);
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
        return ct_equal(v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return !ct_equal(v, x);
    if (!strcmp(name, "sameas"))
        return v.k == x.k && ct_equal(v, x);
    if (!strcmp(name, "in"))
        return ct_contains(x, v);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.k != V_STR)
            return false;
        for (size_t i = 0; i < v.u.s.n; i++)
            if (name[0] == 'l' ? isupper((unsigned char)v.u.s.p[i]) : islower((unsigned char)v.u.s.p[i]))
                return false;
        return true;
    }
    ct_fail(e, n, LLMEM_E_UNSUPPORTED, "test '%s' is not supported", name);
    return false;
}


/* select/reject(attr) by a test */
ct_value select_attr(ct_ev *e, const ct_node *n, ct_value v, const ct_args *a, bool by_attr, bool keep)
{
    ct_list *l = ct_new_list(e);
    if (!l || v.k != V_LIST)
        return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
    int off = by_attr ? 1 : 0;
    ct_value an = ct_arg(a, 0, NULL), tn = ct_arg(a, off, NULL);
    ct_args ta = {.n = 0};
    for (int k = off + 1; k < a->n && ta.n < 8; k++)
        if (!a->kw[k])
            ta.v[ta.n++] = a->v[k];
    for (size_t i = 0; i < v.u.l->n && !e->st; i++) {
        ct_value x = v.u.l->v[i];
        if (by_attr)
            x = an.k == V_STR ? ct_attr(x, an.u.s.p, an.u.s.n) : CT_UNDEF;
        bool r;
        if (tn.k == V_STR) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)tn.u.s.n, tn.u.s.p);
            r = ct_test(e, n, name, x, &ta);
        } else {
            r = ct_truthy(x);
        }
        if (r == keep)
            ct_list_push(e->ar, l, v.u.l->v[i]);
    }
    return (ct_value){V_LIST, {.l = l}};
}

ct_value ct_filter(ct_ev *e, const ct_node *n, const char *f, ct_value v, const ct_args *a)
{
    ct_value a0 = ct_arg(a, 0, NULL);
    if (!strcmp(f, "trim") || !strcmp(f, "strip"))
        return v.k == V_STR ? strip(v, true, true, a0) : v;
    if (!strcmp(f, "length") || !strcmp(f, "count"))
        return ct_int(v.k == V_STR ? (int64_t)v.u.s.n : v.k == V_LIST ? (int64_t)v.u.l->n
                    : v.k == V_DICT ? (int64_t)v.u.d->n : 0);
    if (!strcmp(f, "tojson")) {
        ct_value ind = ct_arg(a, 0, "indent");
        ct_buf b = {0};
        ct_to_json(&b, v, ind.k == V_INT ? (int)ind.u.i : -1, 0);
        return ct_new_str(e, &b);
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        bool boolean = ct_truthy(ct_arg(a, 1, "boolean"));
        return (v.k == V_UNDEF || (boolean && !ct_truthy(v))) ? (a0.k == V_UNDEF ? ct_str("", 0) : a0) : v;
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
        v = ct_str_of(e, v);
        return case_map(e, v, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
    }
    if (!strcmp(f, "string"))
        return ct_str_of(e, v);
    if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape"))
        return f[0] == 's' ? v : v; /* autoescape is off: escaping is not done */
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (v.k == V_LIST && v.u.l->n)
            return v.u.l->v[f[0] == 'f' ? 0 : v.u.l->n - 1];
        if (v.k == V_STR && v.u.s.n)
            return ct_str(v.u.s.p + (f[0] == 'f' ? 0 : v.u.s.n - 1), 1);
        return CT_UNDEF;
    }
    if (!strcmp(f, "join")) {
        ct_value sep = a0.k == V_STR ? a0 : ct_str("", 0), at = ct_arg(a, 1, "attribute");
        ct_buf b = {0};
        for (size_t i = 0; v.k == V_LIST && i < v.u.l->n; i++) {
            if (i)
                ct_put(&b, sep.u.s.p, sep.u.s.n);
            ct_value x = v.u.l->v[i];
            if (at.k == V_STR)
                x = ct_attr(x, at.u.s.p, at.u.s.n);
            ct_to_str(&b, x, false);
        }
        return ct_new_str(e, &b);
    }
    if (!strcmp(f, "replace"))
        return replace(e, v, a0, ct_arg(a, 1, NULL));
    if (!strcmp(f, "int")) {
        if (v.k == V_STR)
            return ct_int(strtoll(ct_strndup(e->ar, v.u.s.p, v.u.s.n), NULL, 10));
        return ct_int(ct_is_num(v) ? (int64_t)ct_num(v) : 0);
    }
    if (!strcmp(f, "float"))
        return (ct_value){V_FLOAT, {.f = v.k == V_STR ? strtod(ct_strndup(e->ar, v.u.s.p, v.u.s.n), NULL) : ct_num(v)}};
    if (!strcmp(f, "abs"))
        return v.k == V_INT ? ct_int(v.u.i < 0 ? -v.u.i : v.u.i) : (ct_value){V_FLOAT, {.f = fabs(ct_num(v))}};
    if (!strcmp(f, "list") || !strcmp(f, "reverse") || !strcmp(f, "unique")) {
        ct_list *l = ct_new_list(e);
        if (!l)
            return CT_UNDEF;
        if (v.k == V_STR && f[0] == 'r') {
            ct_buf b = {0};
            for (size_t i = v.u.s.n; i > 0; i--)
                ct_put(&b, v.u.s.p + i - 1, 1);
            return ct_new_str(e, &b);
        }
        size_t m = v.k == V_LIST ? v.u.l->n : v.k == V_DICT ? v.u.d->n : v.k == V_STR ? v.u.s.n : 0;
        for (size_t i = 0; i < m; i++) {
            size_t j = f[0] == 'r' ? m - 1 - i : i;
            ct_value x = v.k == V_LIST ? v.u.l->v[j] : v.k == V_DICT ? ct_str(v.u.d->key[j], v.u.d->key_len[j])
                                                                      : ct_str(v.u.s.p + j, 1);
            if (f[0] != 'u' || !ct_contains((ct_value){V_LIST, {.l = l}}, x))
                ct_list_push(e->ar, l, x);
        }
        return (ct_value){V_LIST, {.l = l}};
    }
    if (!strcmp(f, "items") || !strcmp(f, "dictsort")) {
        ct_list *l = ct_new_list(e);
        for (size_t i = 0; l && v.k == V_DICT && i < v.u.d->n; i++) {
            ct_list *pr = ct_new_list(e);
            if (!pr)
                return CT_UNDEF;
            ct_list_push(e->ar, pr, ct_str(v.u.d->key[i], v.u.d->key_len[i]));
            ct_list_push(e->ar, pr, v.u.d->v[i]);
            ct_list_push(e->ar, l, (ct_value){V_LIST, {.l = pr}});
        }
        return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
    }
    if (!strcmp(f, "indent")) {
        int64_t w = ct_arg(a, 0, "width").k == V_INT ? ct_arg(a, 0, "width").u.i : 4;
        bool first = ct_truthy(ct_arg(a, 1, "first")), blank = ct_truthy(ct_arg(a, 2, "blank"));
        v = ct_str_of(e, v);
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
        return ct_new_str(e, &b);
    }
    if (!strcmp(f, "map")) {
        ct_value at = ct_arg(a, 0, "attribute");
        ct_list *l = ct_new_list(e);
        for (size_t i = 0; l && v.k == V_LIST && i < v.u.l->n && !e->st; i++) {
            ct_value x = v.u.l->v[i];
            if (ct_arg(a, 0, "attribute").k == V_STR && a->kw[0])
                x = ct_attr(x, at.u.s.p, at.u.s.n);
            else if (a0.k == V_STR) {
                char fn[64];
                snprintf(fn, sizeof fn, "%.*s", (int)a0.u.s.n, a0.u.s.p);
                ct_args rest = *a;
                rest.n = 0;
                x = ct_filter(e, n, fn, x, &rest);
            }
            ct_list_push(e->ar, l, x);
        }
        return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
        return select_attr(e, n, v, a, true, f[0] == 's');
    if (!strcmp(f, "select") || !strcmp(f, "reject"))
        return select_attr(e, n, v, a, false, f[0] == 's');
    ct_fail(e, n, LLMEM_E_UNSUPPORTED, "filter '%s' is not supported", f);
    return CT_UNDEF;
}

ct_value ct_method(ct_ev *e, const ct_node *n, ct_value o, const char *m, const ct_args *a)
{
    ct_value a0 = ct_arg(a, 0, NULL);
    if (o.k == V_STR) {
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            return strip(o, m[0] != 'r', m[0] != 'l', a0);
        if (!strcmp(m, "split"))
            return split(e, o, a0);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            if (a0.k != V_STR || a0.u.s.n > o.u.s.n)
                return ct_bool(false);
            const char *p = m[0] == 's' ? o.u.s.p : o.u.s.p + o.u.s.n - a0.u.s.n;
            return ct_bool(!memcmp(p, a0.u.s.p, a0.u.s.n));
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize"))
            return ct_filter(e, n, m, o, a);
        if (!strcmp(m, "replace"))
            return replace(e, o, a0, ct_arg(a, 1, NULL));
        if (!strcmp(m, "find")) {
            for (size_t i = 0; a0.k == V_STR && i + a0.u.s.n <= o.u.s.n; i++)
                if (!memcmp(o.u.s.p + i, a0.u.s.p, a0.u.s.n))
                    return ct_int((int64_t)i);
            return ct_int(-1);
        }
    } else if (o.k == V_DICT) {
        if (!strcmp(m, "items"))
            return ct_filter(e, n, "items", o, a);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            ct_list *l = ct_new_list(e);
            for (size_t i = 0; l && i < o.u.d->n; i++)
                ct_list_push(e->ar, l, m[0] == 'k' ? ct_str(o.u.d->key[i], o.u.d->key_len[i]) : o.u.d->v[i]);
            return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
        }
        if (!strcmp(m, "get")) {
            ct_value v = a0.k == V_STR ? ct_attr(o, a0.u.s.p, a0.u.s.n) : CT_UNDEF;
            return v.k == V_UNDEF ? (a->n > 1 ? ct_arg(a, 1, NULL) : CT_NONE) : v;
        }
    } else if (o.k == V_LIST) {
        if (!strcmp(m, "append")) {
            ct_list_push(e->ar, o.u.l, a0);
            return CT_NONE;
        }
    }
    ct_fail(e, n, LLMEM_E_UNSUPPORTED, "method '%s' is not supported on this value", m);
    return CT_UNDEF;
}

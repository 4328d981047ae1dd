/* llmem: chat templates -- the public API, values and their printing
 * (str(), repr(), json.dumps); parsing is chat_template_parse.c, evaluation
 * chat_template_eval.c, filters chat_template_filters.c.
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
#include "models/hf_json.h"

/* ---- arena, buffers, values ---- */

void *ct_alloc(ct_arena *a, size_t n)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        void **p = realloc(a->p, cap * sizeof *p);
        if (!p) {
            a->oom = true;
            return NULL;
        }
        a->p = p;
        a->cap = cap;
    }
    if (a->limit && a->bytes + n > a->limit) {
        a->oom = true;
        return NULL;
    }
    a->bytes += n;
    void *m = calloc(1, n ? n : 1);
    if (!m) {
        a->oom = true;
        return NULL;
    }
    a->p[a->n++] = m;
    return m;
}

char *ct_strndup(ct_arena *a, const char *s, size_t n)
{
    char *p = ct_alloc(a, n + 1);
    if (p && n)
        memcpy(p, s, n);
    return p;
}

void ct_arena_free(ct_arena *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->p[i]);
    free(a->p);
    memset(a, 0, sizeof *a);
}

void ct_put(ct_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

ct_value ct_str(const char *s, size_t n) { return (ct_value){V_STR, {.s = {s, n}}}; }

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

void ct_fail(ct_ev *e, const ct_node *n, llmem_status st, const char *fmt, ...)
{
    if (e->st)
        return;
    e->st = st;
    if (e->err && e->err_len) {
        int k = snprintf(e->err, e->err_len, "chat template line %d: ", n ? n->line : 0);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < e->err_len)
            llmem_verrf(e->err + k, e->err_len - (size_t)k, fmt, ap);
        va_end(ap);
    }
}

bool ct_truthy(ct_value v)
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

/* What json.dumps writes before element i of a list or dict at level: ", " (or "," and a
 * new line and indent when indenting). */
static void json_sep(ct_buf *b, size_t i, int indent, int level)
{
    if (i)
        ct_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
    if (indent >= 0)
        put_indent(b, indent, level + 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none) */
void ct_to_json(ct_buf *b, ct_value v, int indent, int level)
{
    switch (v.k) {
    case V_STR: json_str(b, v.u.s.p, v.u.s.n); break;
    case V_BOOL: ct_put(b, v.u.b ? "true" : "false", v.u.b ? 4 : 5); break;
    case V_INT:
    case V_FLOAT: ct_to_str(b, v, false); break;
    case V_LIST:
        ct_put(b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            json_sep(b, i, indent, level);
            ct_to_json(b, v.u.l->v[i], indent, level + 1);
        }
        if (indent >= 0 && v.u.l->n)
            put_indent(b, indent, level);
        ct_put(b, "]", 1);
        break;
    case V_DICT:
        ct_put(b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            json_sep(b, i, indent, level);
            json_str(b, v.u.d->key[i], v.u.d->key_len[i]);
            ct_put(b, ": ", 2);
            ct_to_json(b, v.u.d->v[i], indent, level + 1);
        }
        if (indent >= 0 && v.u.d->n)
            put_indent(b, indent, level);
        ct_put(b, "}", 1);
        break;
    default: ct_put(b, "null", 4); break;
    }
}

/* str(v) (repr: the repr() inside containers) */
void ct_to_str(ct_buf *b, ct_value v, bool repr)
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
            ct_to_str(b, v.u.l->v[i], true);
        }
        ct_put(b, "]", 1);
        break;
    case V_DICT:
        ct_put(b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                ct_put(b, ", ", 2);
            ct_to_str(b, ct_str(v.u.d->key[i], v.u.d->key_len[i]), true);
            ct_put(b, ": ", 2);
            ct_to_str(b, v.u.d->v[i], true);
        }
        ct_put(b, "}", 1);
        break;
    case V_MACRO: ct_put(b, "<macro>", 7); break;
    }
}

ct_value ct_str_of(ct_ev *e, ct_value v)
{
    if (v.k == V_STR)
        return v;
    ct_buf b = {0};
    ct_to_str(&b, v, false);
    ct_value r = ct_str(ct_strndup(e->ar, b.p ? b.p : "", b.n), b.n);
    free(b.p);
    return r;
}

bool ct_equal(ct_value a, ct_value b)
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
            if (!ct_equal(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case V_DICT: return a.u.d == b.u.d;
    default: return true;
    }
}

ct_dict *ct_new_dict(ct_ev *e) { return ct_alloc(e->ar, sizeof(ct_dict)); }
ct_list *ct_new_list(ct_ev *e) { return ct_alloc(e->ar, sizeof(ct_list)); }

ct_value ct_attr(ct_value o, const char *k, size_t kn)
{
    if (o.k == V_DICT) {
        ct_value *v = ct_dict_get(o.u.d, k, kn);
        return v ? *v : CT_UNDEF;
    }
    return CT_UNDEF;
}

bool ct_contains(ct_value hay, ct_value x)
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
            if (ct_equal(hay.u.l->v[i], x))
                return true;
        return false;
    }
    if (hay.k == V_DICT && x.k == V_STR)
        return ct_dict_get(hay.u.d, x.u.s.p, x.u.s.n) != NULL;
    return false;
}

double ct_num(ct_value v) { return v.k == V_INT ? (double)v.u.i : v.k == V_FLOAT ? v.u.f : v.k == V_BOOL ? v.u.b : 0; }
bool ct_is_num(ct_value v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }

/* positional i, or keyword name */
ct_value ct_arg(const ct_args *a, int i, const char *name)
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
    return CT_UNDEF;
}

ct_value ct_new_str(ct_ev *e, ct_buf *b)
{
    ct_value v = ct_str(ct_strndup(e->ar, b->p ? b->p : "", b->n), b->n);
    free(b->p);
    return v;
}

/* ---- public API ------------------------------------------------------------------------- */

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
        return ct_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9e15)
            return ct_int((int64_t)d);
        return (ct_value){V_FLOAT, {.f = d}};
    }
    if (cJSON_IsArray(j)) {
        ct_list *l = ct_alloc(a, sizeof *l);
        const cJSON *x;
        cJSON_ArrayForEach(x, j) if (l) ct_list_push(a, l, from_json(a, x));
        return l ? (ct_value){V_LIST, {.l = l}} : CT_UNDEF;
    }
    if (cJSON_IsObject(j)) {
        ct_dict *d = ct_alloc(a, sizeof *d);
        const cJSON *x;
        cJSON_ArrayForEach(x, j) if (d) {
            size_t n = strlen(x->string);
            ct_dict_set(a, d, ct_strndup(a, x->string, n), n, from_json(a, x));
        }
        return d ? (ct_value){V_DICT, {.d = d}} : CT_UNDEF;
    }
    return CT_NONE;
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
    /* one JSON text as json.loads reads it (jinja2 callers build the
     * context there): no bytes after it, no key twice, no \u0000 */
    cJSON *j = NULL;
    hf_json_where w;
    hf_json_fault jf = hf_json_read(context_json, strlen(context_json), &j, &w);
    if (jf == HF_JSON_NO_MEMORY) {
        if (err && err_len)
            snprintf(err, err_len, "chat_template_render: out of memory");
        return LLMEM_E_NO_MEMORY;
    }
    if (jf != HF_JSON_OK || !cJSON_IsObject(j)) {
        char why[128];
        cJSON_Delete(j);
        if (err && err_len)
            snprintf(err, err_len, "chat_template_render: the context is not a JSON object%s%s",
                     jf != HF_JSON_OK ? ": " : "",
                     jf != HF_JSON_OK ? hf_json_describe(jf, &w, why, sizeof why) : "");
        return LLMEM_E_INVALID;
    }
    ct_arena ar = {.limit = CT_MAX_ARENA};
    ct_value g = from_json(&ar, j);
    cJSON_Delete(j);
    ct_buf b = {0};
    /* an allocation from_json lost leaves a NULL string or a short list */
    llmem_status st = g.k == V_DICT && !ar.oom ? ct_render(tmpl, g.u.d, &ar, &b, err, err_len)
                                               : LLMEM_E_NO_MEMORY;
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
    ct_arena ar = {.limit = CT_MAX_ARENA};
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
                    msgs[i].content ? ct_str(msgs[i].content, strlen(msgs[i].content)) : CT_NONE);
        ct_list_push(&ar, l, (ct_value){V_DICT, {.d = m}});
    }
    ct_dict_set(&ar, g, "messages", 8, (ct_value){V_LIST, {.l = l}});
    ct_dict_set(&ar, g, "add_generation_prompt", 21, ct_bool(add_generation_prompt));
    ct_dict_set(&ar, g, "bos_token", 9, ct_str(bos_token ? bos_token : "", bos_token ? strlen(bos_token) : 0));
    ct_dict_set(&ar, g, "eos_token", 9, ct_str(eos_token ? eos_token : "", eos_token ? strlen(eos_token) : 0));
    if (!ar.oom)
        st = ct_render(tmpl, g, &ar, &b, err, err_len);
done:
    ct_arena_free(&ar);
    return finish(st, &b, out, out_len);
}

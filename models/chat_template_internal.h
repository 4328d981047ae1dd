/* llmem: chat template internals shared by models/chat_template*.c. */
#ifndef LLMEM_CHAT_TEMPLATE_INTERNAL_H
#define LLMEM_CHAT_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/chat_template.h"

/* Everything allocated for a template or a render is freed at once. */
typedef struct ct_arena {
    void **p;
    size_t n, cap;
    size_t bytes, limit; /* bytes allocated; limit 0: none */
    bool oom;
} ct_arena;

void *ct_alloc(ct_arena *a, size_t n); /* zeroed; NULL sets a->oom */
char *ct_strndup(ct_arena *a, const char *s, size_t n);
void ct_arena_free(ct_arena *a);

typedef struct ct_buf {
    char *p;
    size_t n, cap;
    bool oom;
} ct_buf;
void ct_put(ct_buf *b, const char *s, size_t n);

/* ---- AST ---- */
typedef enum ct_nkind {
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_NOT, N_NEG, N_COND, N_LIST,
    N_DICT,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE, N_BLOCK
} ct_nkind;

typedef enum ct_vkind { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_MACRO } ct_vkind;

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_node ct_node;

typedef struct ct_value {
    ct_vkind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        ct_list *l;
        ct_dict *d;
        const ct_node *m; /* macro */
    } u;
} ct_value;

struct ct_list {
    ct_value *v;
    size_t n, cap;
};

struct ct_dict {
    const char **key;
    size_t *key_len;
    ct_value *v;
    size_t n, cap;
    bool ns; /* a namespace() object */
};

typedef struct ct_nodes {
    ct_node **p;
    size_t n;
} ct_nodes;

struct ct_node {
    ct_nkind k;
    int line;
    const char *name; /* name, attr, filter, test, op, set target, macro name */
    const char *name2; /* for: second target; set: namespace attribute */
    ct_value lit;
    ct_node *a, *b, *c; /* operands / cond / iter / slice parts */
    ct_nodes args;      /* call / filter / test args, list items, dict keys+values (pairs) */
    const char **kw;    /* keyword names of args (NULL entries for positional) */
    ct_nodes body, body2; /* if: bodies per branch in body (N_BLOCK), else in body2 */
    ct_nodes conds;       /* if: conditions */
    bool negate;          /* test: is not; bin "not in" */
};

struct llmem_chat_template {
    ct_arena arena;
    ct_nodes root;
};

llmem_status ct_parse(llmem_chat_template *t, const char *src, char *err, size_t err_len);
llmem_status ct_render(const llmem_chat_template *t, ct_dict *globals, ct_arena *ar, ct_buf *out, char *err,
                       size_t err_len);

/* values */
bool ct_list_push(ct_arena *a, ct_list *l, ct_value v);
bool ct_dict_set(ct_arena *a, ct_dict *d, const char *k, size_t kn, ct_value v);
ct_value *ct_dict_get(const ct_dict *d, const char *k, size_t kn);
ct_value ct_str(const char *s, size_t n);

/* ---- evaluation (chat_template_eval.c), shared with the filters ---- */

/* What one render may use: evaluation steps, bytes of values (the render
 * arena) and bytes of output. A template past them fails with
 * LLMEM_E_INVALID (steps, output) or LLMEM_E_NO_MEMORY (values) instead of
 * running for hours or exhausting memory. */
#define CT_MAX_STEPS 2000000u
#define CT_MAX_ARENA ((size_t)128 << 20)
#define CT_MAX_OUTPUT ((size_t)64 << 20)

static const ct_value CT_UNDEF = {V_UNDEF, {0}};
static const ct_value CT_NONE = {V_NONE, {0}};
static inline ct_value ct_bool(bool b) { return (ct_value){V_BOOL, {.b = b}}; }
static inline ct_value ct_int(int64_t i) { return (ct_value){V_INT, {.i = i}}; }

typedef struct ct_ev {
    ct_arena *ar;
    ct_dict *frame[64];
    int n_frames;
    int ctl; /* 1 break, 2 continue */
    int depth;
    uint64_t steps; /* expressions and statements evaluated */
    char *err;
    size_t err_len;
    llmem_status st;
} ct_ev;


typedef struct ct_args {
    ct_value v[8];
    const char *kw[8];
    int n;
} ct_args;


/* records the first error, "chat template line N: ..." */
void ct_fail(ct_ev *e, const ct_node *n, llmem_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool ct_truthy(ct_value v);
void ct_to_str(ct_buf *b, ct_value v, bool repr);                  /* str() / repr() */
void ct_to_json(ct_buf *b, ct_value v, int indent, int level);     /* json.dumps */
ct_value ct_str_of(ct_ev *e, ct_value v);
bool ct_equal(ct_value a, ct_value b);
bool ct_contains(ct_value hay, ct_value x);                         /* x in hay */
ct_dict *ct_new_dict(ct_ev *e);
ct_list *ct_new_list(ct_ev *e);
ct_value ct_new_str(ct_ev *e, ct_buf *b);                           /* takes b's memory */
ct_value ct_attr(ct_value o, const char *k, size_t kn);
double ct_num(ct_value v);
bool ct_is_num(ct_value v);
ct_value ct_arg(const ct_args *a, int i, const char *name);         /* positional i or keyword */
/* chat_template_filters.c */
bool ct_test(ct_ev *e, const ct_node *n, const char *name, ct_value v, const ct_args *a);
ct_value ct_filter(ct_ev *e, const ct_node *n, const char *f, ct_value v, const ct_args *a);
ct_value ct_method(ct_ev *e, const ct_node *n, ct_value o, const char *m, const ct_args *a);

#endif

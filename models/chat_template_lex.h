/* llmem: chat templates -- what the lexer (chat_template_lex.c) hands the
 * parser (chat_template_parse.c): a template cut into segments (text, {{ }}
 * and {% %}), and the tokens of one tag. Internal to models/chat_template*.c. */
#ifndef LLMEM_CHAT_TEMPLATE_LEX_H
#define LLMEM_CHAT_TEMPLATE_LEX_H

#include "models/chat_template_internal.h"

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

typedef struct ct_parser {
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
} ct_parser;

/* Records the first error (status and "chat template line N: ..." in p->err); later ones are
 * dropped. */
void ct_parser_fail(ct_parser *p, llmem_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Cuts src into p->seg (malloc'd; on success the caller frees it), applying Jinja2's
 * whitespace control. False on a malformed tag (p->st set) or out of memory (p->st may be 0). */
bool ct_split_segments(ct_parser *p, const char *src);

/* Tokenizes the tag segment g into p->t (arena memory), ending with a T_END token; sets p->line.
 * False on a bad token (p->st set) or out of memory. */
bool ct_tokenize(ct_parser *p, const seg *g);

#endif

/* llmem command line: text in and text out for one model. A model folder
 * with a tokenizer.json is read and written through its tokenizer; a model
 * with a 256-entry vocabulary and no tokenizer is byte-level (the built-in
 * one); any other model takes and prints token ids. */
#ifndef LLMEM_CLI_TEXT_H
#define LLMEM_CLI_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/tokenizer.h"

typedef enum cli_text_kind {
    CLI_TEXT_TOKENIZER, /* tokenizer.json of the model folder */
    CLI_TEXT_BYTES,     /* token id = byte value */
    CLI_TEXT_IDS,       /* no text: ids are read and printed as numbers */
} cli_text_kind;

typedef struct cli_text {
    cli_text_kind kind;
    llmem_tokenizer *tok; /* owned; CLI_TEXT_TOKENIZER only */
    int32_t n_vocab;      /* the model's */
} cli_text;

/* Chooses how text maps to the model's tokens: the tokenizer.json in
 * model_dir when there is one (loaded; its ids must fit n_vocab), else
 * bytes when n_vocab is 256, else ids. Returns 0, or 1 after a message. */
int cli_text_open(const char *cmd, const char *model_dir, int32_t n_vocab, cli_text *t);
void cli_text_close(cli_text *t);

/* Parses a list of token ids separated by spaces, tabs, newlines or commas
 * ("1 5 7"), strictly: anything that is not an id in [0, n_vocab) is an
 * error naming it (its position and text). *ids is malloc'd. Returns 0, or
 * 1 after a message. */
int cli_parse_ids(const char *cmd, const char *s, int32_t n_vocab, int32_t **ids, int32_t *n);

/* The token ids of a prompt given as text[len] (bytes or the tokenizer's
 * encoding, with its BOS when the tokenizer adds one). An ids-only model
 * gets an error that points at --prompt-ids. Returns 0, or 1 after a
 * message. */
int cli_text_encode(const char *cmd, const cli_text *t, const char *text, size_t len,
                    int32_t **ids, int32_t *n);

/* The text of one generated sequence, streamed as tokens come: complete
 * UTF-8 only (through the streaming detokenizer), and never the start of a
 * stop string until it is known not to be one. Writes to f when f is not
 * NULL; the whole text stays in buf either way. */
typedef struct cli_out {
    const cli_text *t;
    llmem_detok *detok;
    char *buf;
    size_t len, cap;
    size_t gen_start; /* where generated text starts (after the prompt) */
    size_t printed;   /* bytes of buf written to f */
    const char *const *stops;
    int n_stops;
    bool stopped; /* a stop string or end-of-generation token was seen */
    FILE *f;
} cli_out;

/* Starts an output over prompt[n_prompt] (echoed as text first). stops[n]
 * stay owned by the caller. Returns 0 or 1 (out of memory). */
int cli_out_init(cli_out *o, const cli_text *t, const int32_t *prompt, int32_t n_prompt,
                 const char *const *stops, int n_stops, FILE *f);
/* Adds a generated token. Returns true when generation must end: the
 * token ends generation (the tokenizer's EOS and friends; not printed), or
 * a stop string is complete (the text ends before it). */
bool cli_out_push(cli_out *o, int32_t id);
/* Writes what is held back (the end of the text). */
void cli_out_finish(cli_out *o);
void cli_out_free(cli_out *o);

#endif

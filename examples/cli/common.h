/* Shared helpers of the llmem command line. */
#ifndef LLMEM_CLI_COMMON_H
#define LLMEM_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/llmem.h"
#include "llmem/runtime.h"

/* Options every model command takes. */
typedef struct cli_model_opts {
    const char *model;   /* NULL: the built-in model */
    const char *backend; /* "auto" */
    int32_t device;
    llmem_model_params params;
    const char *kv_type;
} cli_model_opts;

void cli_model_opts_init(cli_model_opts *o);
/* Parses one model option at argv[*i] (advancing *i past its value).
 * Returns 1 if consumed, 0 if not a model option, -1 on a bad value
 * (message printed). */
int cli_model_opt(cli_model_opts *o, const char *cmd, int argc, char **argv, int *i);
/* Help text of the model options. */
extern const char *const cli_model_opts_help;
/* Opens the backend and loads the model; prints one clear error line. */
int cli_open_model(const char *cmd, cli_model_opts *o, llmem_backend **be, llmem_model **m);
/* Strict integer / float parsing; false on junk or out of range. */
bool cli_int(const char *s, int64_t lo, int64_t hi, int32_t *out);
bool cli_float(const char *s, double lo, double hi, double *out);
double cli_now(void);
/* fopen(path, "rb") of a regular file; for anything else (missing, a
 * directory, a device) prints "llmem <cmd>: cannot open <what> '<path>':
 * <why>" and returns NULL. "-" is stdin when allow_stdin. */
FILE *cli_open_input(const char *cmd, const char *what, const char *path, bool allow_stdin);

#endif

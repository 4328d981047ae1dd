/* Shared helpers of the llmem command line: option parsing (getopt_long
 * with the options every command shares), model loading, logging. */
#ifndef LLMEM_CLI_COMMON_H
#define LLMEM_CLI_COMMON_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/llmem.h"
#include "llmem/runtime.h"

/* How much the command line says on stderr besides errors. */
typedef enum cli_log_level {
    CLI_LOG_ERROR = 0,
    CLI_LOG_WARN = 1, /* default */
    CLI_LOG_INFO = 2, /* --verbose */
    CLI_LOG_DEBUG = 3,
} cli_log_level;

/* --precision: precise (f32 activations, the parity reference) or fast
 * (bf16 activations into tensor cores). DEFAULT leaves each command's own
 * default: precise for score, fast for generate, replay and bench. */
typedef enum cli_precision {
    CLI_PRECISION_DEFAULT = 0,
    CLI_PRECISION_PRECISE,
    CLI_PRECISION_FAST,
} cli_precision;

/* Options every model command takes. */
typedef struct cli_model_opts {
    const char *model;   /* NULL: the built-in model */
    const char *backend; /* "auto" */
    int32_t device;
    int32_t threads;     /* cpu backend threads; 0: LLMEM_THREADS or all cores */
    cli_precision precision;
    llmem_model_params params;
    uint32_t given;      /* the shared options given on the command line:
                          * cli_model_opt_given */
} cli_model_opts;

/* Which shared options a command accepts (cli_parser_init's groups). */
enum {
    CLI_GROUP_LOG = 1,     /* -v/--verbose, --log-level */
    CLI_GROUP_BACKEND = 2, /* --backend, --device, -t/--threads, --precision */
    CLI_GROUP_MODEL = 4,   /* -m/--model and the memory sizes */
};

/* Option codes of the shared options; a command's own long-only options
 * use codes from CLI_OPT_OWN up. */
enum {
    CLI_OPT_BACKEND = 1000,
    CLI_OPT_DEVICE,
    CLI_OPT_N_SEQ_MAX,
    CLI_OPT_N_UBATCH,
    CLI_OPT_PAGE_SIZE,
    CLI_OPT_N_PAGES,
    CLI_OPT_KV_TYPE,
    CLI_OPT_SSM_TYPE,
    CLI_OPT_NO_PREFIX_CACHE,
    CLI_OPT_POISON,
    CLI_OPT_CHECK_TENSORS,
    CLI_OPT_SNAPSHOTS,
    CLI_OPT_PRECISION,
    CLI_OPT_LOG_LEVEL,
    CLI_OPT_TP,
    CLI_OPT_PREFIX_CACHE_MB,
    CLI_OPT_OWN = 1100,
};

#define CLI_MAX_OPTS 64

/* A getopt_long loop over one command's arguments (argv[0] is the
 * command's name). */
typedef struct cli_parser {
    const char *cmd;
    int argc;
    char **argv;
    struct option opts[CLI_MAX_OPTS];
    char shortopts[CLI_MAX_OPTS];
} cli_parser;

/* Sets up a parser for the command's own options `own` (terminated by a
 * zeroed entry; short options of its own in `own_short`, getopt syntax)
 * plus the shared groups (CLI_GROUP_* bits); -h/--help is always known. */
void cli_parser_init(cli_parser *p, const char *cmd, int argc, char **argv,
                     const struct option *own, const char *own_short, int groups);

/* The next option's code (its short letter or long code), with its value
 * in *arg; -1 when the arguments are done; '?' after printing one line that
 * names the problem (unknown option, missing value, stray argument). */
int cli_next(cli_parser *p, const char **arg);
/* The long name of option code c in p's table (own and shared options),
 * "?" when none has it: for messages about a value read as a code. */
const char *cli_opt_name(const cli_parser *p, int c);

void cli_model_opts_init(cli_model_opts *o);
/* Applies a shared option (code and value from cli_next) to o. Returns 1
 * if it was one, 0 if not, -1 on a bad value (message printed). */
int cli_model_opt(cli_model_opts *o, const char *cmd, int code, const char *arg);
/* cli_next for a command that takes the shared options: those it applies to
 * o (cli_model_opt) and passes over. Returns the next option of the
 * command's own, -1 when the arguments are done, or '?' after one line that
 * names the problem (cli_next's, or a bad value of a shared option). */
int cli_next_own(cli_parser *p, cli_model_opts *o, const char **arg);
/* Whether the shared option `code` (a CLI_OPT_* code, or 'm', 'c', 't') was
 * given on the command line and applied by cli_model_opt: a command that
 * would raise a value it needs keeps the automatic choice when the option
 * was not given, and refuses an explicit value that cannot work. */
bool cli_model_opt_given(const cli_model_opts *o, int code);
/* Help text of the shared options: model, backend, log. */
extern const char *const cli_model_opts_help;
extern const char *const cli_backend_opts_help;
extern const char *const cli_log_opts_help;
/* The precision a command runs at: o->precision, else the command's
 * default. cli_open_model passes it to the model (llmem_model_params). */
cli_precision cli_precision_of(const cli_model_opts *o, cli_precision dflt);
/* Applies -t/--threads (before the backend opens). */
void cli_apply_threads(const cli_model_opts *o);
/* Opens the backend and loads the model; prints one clear error line.
 * Returns 0, 1 (the backend or the model failed) or 2 (options the model
 * cannot take: --ssm-type or --snapshots for a model without recurrent
 * state), the command's exit status. */
int cli_open_model(const char *cmd, cli_model_opts *o, llmem_backend **be, llmem_model **m);
/* Strict integer / float parsing; false on junk or out of range. */
bool cli_int(const char *s, int64_t lo, int64_t hi, int32_t *out);
bool cli_float(const char *s, double lo, double hi, double *out);
/* Monotonic seconds (CLOCK_MONOTONIC), for timing. */
double cli_now(void);
/* fopen(path, "rb") of a regular file; for anything else (missing, a
 * directory, a device) prints "llmem <cmd>: cannot open <what> '<path>':
 * <why>" and returns NULL. "-" is stdin when allow_stdin. */
FILE *cli_open_input(const char *cmd, const char *what, const char *path, bool allow_stdin);
/* Reads a whole input (cli_open_input's rules) into a NUL-terminated
 * malloc'd buffer; *len gets its length. NULL after a message. */
char *cli_read_file(const char *cmd, const char *what, const char *path, size_t *len);

/* The log level of this run (set by -v/--verbose and --log-level). */
extern cli_log_level cli_log;
/* Prints "llmem <cmd>: <message>" on stderr when level <= cli_log. */
void cli_logf(cli_log_level level, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

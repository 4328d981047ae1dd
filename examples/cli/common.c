/* Shared helpers of the llmem command line: option parsing, model options,
 * loading, logging. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "examples/cli/common.h"
#include "llmem/model.h"

const char *const cli_model_opts_help =
    "model options:\n"
    "  -m, --model DIR      Hugging Face checkpoint folder (config.json + *.safetensors,\n"
    "                       and tokenizer.json for text); default: the built-in\n"
    "                       byte-level Bamba model\n"
    "  --n-seq-max N        sequences in flight at once (default 8)\n"
    "  --n-ubatch N         tokens per ubatch (default 512)\n"
    "  -c, --n-ctx N        tokens per sequence the KV cache is sized for (default 4096)\n"
    "  --page-size N        KV cache page size in tokens (default 16)\n"
    "  --n-pages N          KV cache pages (default n-seq-max * n-ctx / page-size); work\n"
    "                       that does not fit waits for pages to free up\n"
    "  --kv-type T          f32 | f16 | bf16 | int8 | fp8 (default: f32 with --precision\n"
    "                       precise, bf16 with fast; int8/fp8: per-page, per-head scales)\n"
    "  --ssm-type T         recurrent state dtype (Mamba-2, Mamba-1, gated delta net):\n"
    "                       f32 | f16 | bf16 | int8 (default f32; int8: per-head scale,\n"
    "                       Mamba-2 only; conv states stay f32); refused, like\n"
    "                       --snapshots, for a model without recurrent state\n"
    "  --no-prefix-cache    disable reuse of cached prompt pages\n"
    "  --poison             fill free pages and state slots with NaN (debugging;\n"
    "                       results must not change)\n"
    "  --check-tensors      scan every weight at load; a NaN or infinity is an error\n"
    "                       that names the tensor and element\n"
    "  --snapshots N        hybrids: recurrent-state snapshots kept for prefix reuse\n"
    "                       (default max(n-seq-max, 16); 0 turns them off)\n"
    "  --tp N               tensor parallelism over N ranks (default 1): heads and\n"
    "                       widths split, rank r on device --device + r (cuda, NCCL)\n"
    "                       or another cpu instance (threads); docs/tp.md\n"
    "  --prefix-cache-mb X  device MiB that cached prefix data may hold: KV pages no\n"
    "                       sequence holds plus hybrids' snapshots, one LRU for both\n"
    "                       (default: no budget); without --snapshots, a hybrid gets as\n"
    "                       many snapshot slots as X MiB holds\n";

const char *const cli_backend_opts_help =
    "backend options:\n"
    "  --backend NAME       auto | cpu | cuda | vulkan (default auto: CUDA, then a\n"
    "                       discrete Vulkan GPU, then cpu)\n"
    "  --device N           device index within the backend (default: its first)\n"
    "  -t, --threads N      cpu backend threads (default: $LLMEM_THREADS, else every core)\n"
    "  --precision P        precise (f32 activations, the parity reference) or fast (bf16\n"
    "                       activations into tensor cores); default precise for score,\n"
    "                       fast for generate, replay, serve and bench\n";

const char *const cli_log_opts_help =
    "  -v, --verbose        say what is loaded and used on stderr (--log-level info)\n"
    "  --log-level L        error | warn | info | debug (default warn)\n"
    "  -h, --help           this text\n";

cli_log_level cli_log = CLI_LOG_WARN;

void cli_logf(cli_log_level level, const char *cmd, const char *fmt, ...)
{
    if (level > cli_log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llmem %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The shared options and the group each belongs to. */
static const struct {
    struct option opt;
    int group;
} shared_opts[] = {
    {{"verbose", no_argument, NULL, 'v'}, CLI_GROUP_LOG},
    {{"log-level", required_argument, NULL, CLI_OPT_LOG_LEVEL}, CLI_GROUP_LOG},
    {{"backend", required_argument, NULL, CLI_OPT_BACKEND}, CLI_GROUP_BACKEND},
    {{"device", required_argument, NULL, CLI_OPT_DEVICE}, CLI_GROUP_BACKEND},
    {{"threads", required_argument, NULL, 't'}, CLI_GROUP_BACKEND},
    {{"precision", required_argument, NULL, CLI_OPT_PRECISION}, CLI_GROUP_BACKEND},
    {{"model", required_argument, NULL, 'm'}, CLI_GROUP_MODEL},
    {{"n-seq-max", required_argument, NULL, CLI_OPT_N_SEQ_MAX}, CLI_GROUP_MODEL},
    {{"n-ubatch", required_argument, NULL, CLI_OPT_N_UBATCH}, CLI_GROUP_MODEL},
    {{"n-ctx", required_argument, NULL, 'c'}, CLI_GROUP_MODEL},
    {{"page-size", required_argument, NULL, CLI_OPT_PAGE_SIZE}, CLI_GROUP_MODEL},
    {{"n-pages", required_argument, NULL, CLI_OPT_N_PAGES}, CLI_GROUP_MODEL},
    {{"kv-type", required_argument, NULL, CLI_OPT_KV_TYPE}, CLI_GROUP_MODEL},
    {{"ssm-type", required_argument, NULL, CLI_OPT_SSM_TYPE}, CLI_GROUP_MODEL},
    {{"no-prefix-cache", no_argument, NULL, CLI_OPT_NO_PREFIX_CACHE}, CLI_GROUP_MODEL},
    {{"poison", no_argument, NULL, CLI_OPT_POISON}, CLI_GROUP_MODEL},
    {{"check-tensors", no_argument, NULL, CLI_OPT_CHECK_TENSORS}, CLI_GROUP_MODEL},
    {{"snapshots", required_argument, NULL, CLI_OPT_SNAPSHOTS}, CLI_GROUP_MODEL},
    {{"tp", required_argument, NULL, CLI_OPT_TP}, CLI_GROUP_MODEL},
    {{"prefix-cache-mb", required_argument, NULL, CLI_OPT_PREFIX_CACHE_MB}, CLI_GROUP_MODEL},
};

void cli_parser_init(cli_parser *p, const char *cmd, int argc, char **argv,
                     const struct option *own, const char *own_short, int groups)
{
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->argc = argc;
    p->argv = argv;
    int n = 0;
    /* room for help, every shared option and the {0} that ends the list */
    int room = CLI_MAX_OPTS - 2 - (int)(sizeof shared_opts / sizeof *shared_opts);
    for (; own && own[n].name && n < room; n++)
        p->opts[n] = own[n];
    p->opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
    for (size_t k = 0; k < sizeof shared_opts / sizeof *shared_opts; k++)
        if (shared_opts[k].group & groups)
            p->opts[n++] = shared_opts[k].opt;
    /* leading ':' : a missing value is reported as ':' rather than '?' */
    snprintf(p->shortopts, sizeof p->shortopts, ":h%s%s%s%s", own_short ? own_short : "",
             groups & CLI_GROUP_LOG ? "v" : "", groups & CLI_GROUP_BACKEND ? "t:" : "",
             groups & CLI_GROUP_MODEL ? "m:c:" : "");
    optind = 1;
    opterr = 0;
}

int cli_next(cli_parser *p, const char **arg)
{
    int prev = optind;
    int c = getopt_long(p->argc, p->argv, p->shortopts, p->opts, NULL);
    *arg = optarg;
    if (c == -1) {
        if (optind < p->argc) {
            fprintf(stderr, "llmem %s: unexpected argument '%s' (see llmem %s --help)\n", p->cmd,
                    p->argv[optind], p->cmd);
            return '?';
        }
        return -1;
    }
    /* the option just read: argv[optind - 1], or argv[prev] inside a group
     * of short options */
    const char *what = optind - 1 >= prev ? p->argv[optind - 1] : p->argv[prev];
    char shortname[3] = {'-', (char)optopt, 0};
    if (c == '?') {
        fprintf(stderr, "llmem %s: unknown option '%s' (see llmem %s --help)\n", p->cmd,
                optopt && what[1] != '-' ? shortname : what, p->cmd);
        return '?';
    }
    if (c == ':') {
        fprintf(stderr, "llmem %s: option %s needs a value\n", p->cmd,
                optopt && what[1] != '-' ? shortname : what);
        return '?';
    }
    if (c == 'v') {
        cli_log = cli_log > CLI_LOG_INFO ? cli_log : CLI_LOG_INFO;
        return cli_next(p, arg);
    }
    if (c == CLI_OPT_LOG_LEVEL) {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        for (int k = 0; k < 4; k++)
            if (!strcmp(optarg, names[k])) {
                cli_log = (cli_log_level)k;
                return cli_next(p, arg);
            }
        fprintf(stderr, "llmem %s: --log-level wants error, warn, info or debug, got '%s'\n",
                p->cmd, optarg);
        return '?';
    }
    return c;
}

const char *cli_opt_name(const cli_parser *p, int c)
{
    for (int k = 0; p->opts[k].name; k++)
        if (p->opts[k].val == c)
            return p->opts[k].name;
    return "?";
}

void cli_model_opts_init(cli_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->device = -1;
    o->params = llmem_model_default_params();
}

bool cli_int(const char *s, int64_t lo, int64_t hi, int32_t *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = (int32_t)v;
    return true;
}

bool cli_float(const char *s, double lo, double hi, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

FILE *cli_open_input(const char *cmd, const char *what, const char *path, bool allow_stdin)
{
    if (allow_stdin && !strcmp(path, "-"))
        return stdin;
    FILE *f = fopen(path, "rb");
    struct stat sb;
    const char *why = NULL;
    if (!f)
        why = strerror(errno);
    else if (fstat(fileno(f), &sb) != 0)
        why = "cannot stat it";
    else if (S_ISDIR(sb.st_mode))
        why = "it is a directory";
    else if (!S_ISREG(sb.st_mode) && !S_ISFIFO(sb.st_mode) && !S_ISCHR(sb.st_mode))
        why = "it is not a regular file";
    if (!why)
        return f;
    fprintf(stderr, "llmem %s: cannot open %s '%s': %s\n", cmd, what, path, why);
    if (f)
        fclose(f);
    return NULL;
}

/* The bit of cli_model_opts.given for a shared option code; 0 for others. */
static uint32_t given_bit(int code)
{
    if (code >= CLI_OPT_BACKEND && code < CLI_OPT_BACKEND + 29)
        return 1u << (code - CLI_OPT_BACKEND);
    return code == 'm' ? 1u << 29 : code == 'c' ? 1u << 30 : code == 't' ? 1u << 31 : 0;
}

bool cli_model_opt_given(const cli_model_opts *o, int code)
{
    return (o->given & given_bit(code)) != 0;
}

static int model_opt(cli_model_opts *o, const char *cmd, int code, const char *arg);

int cli_model_opt(cli_model_opts *o, const char *cmd, int code, const char *arg)
{
    int r = model_opt(o, cmd, code, arg);
    if (r > 0)
        o->given |= given_bit(code);
    return r;
}

int cli_next_own(cli_parser *p, cli_model_opts *o, const char **arg)
{
    for (;;) {
        int c = cli_next(p, arg);
        if (c == -1 || c == '?')
            return c;
        int r = cli_model_opt(o, p->cmd, c, *arg);
        if (r < 0)
            return '?';
        if (r == 0)
            return c;
    }
}

static int model_opt(cli_model_opts *o, const char *cmd, int code, const char *arg)
{
    static const struct {
        int code;
        const char *name;
        size_t field; /* offsetof in cli_model_opts */
        int64_t lo, hi;
    } ints[] = {
        {CLI_OPT_DEVICE, "--device", offsetof(cli_model_opts, device), 0, 1024},
        {'t', "--threads", offsetof(cli_model_opts, threads), 1, 512},
        {CLI_OPT_N_SEQ_MAX, "--n-seq-max", offsetof(cli_model_opts, params.n_seq_max), 1, 1 << 20},
        {CLI_OPT_N_UBATCH, "--n-ubatch", offsetof(cli_model_opts, params.n_ubatch), 1, 1 << 20},
        {'c', "--n-ctx", offsetof(cli_model_opts, params.n_ctx), 1, 1 << 26},
        {CLI_OPT_PAGE_SIZE, "--page-size", offsetof(cli_model_opts, params.page_size), 1, 1 << 16},
        {CLI_OPT_N_PAGES, "--n-pages", offsetof(cli_model_opts, params.n_pages), 1, INT32_MAX},
        {CLI_OPT_SNAPSHOTS, "--snapshots", offsetof(cli_model_opts, params.n_snapshots), 0, 1 << 20},
        {CLI_OPT_TP, "--tp", offsetof(cli_model_opts, params.tp), 1, 64},
    };
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
        if (code != ints[k].code)
            continue;
        if (!cli_int(arg, ints[k].lo, ints[k].hi, (int32_t *)((char *)o + ints[k].field))) {
            fprintf(stderr, "llmem %s: %s wants an integer in [%lld, %lld], got '%s'\n", cmd,
                    ints[k].name, (long long)ints[k].lo, (long long)ints[k].hi, arg);
            return -1;
        }
        return 1;
    }
    switch (code) {
    case 'm':
        o->model = arg;
        return 1;
    case CLI_OPT_BACKEND:
        o->backend = arg;
        return 1;
    case CLI_OPT_KV_TYPE:
    case CLI_OPT_SSM_TYPE: {
        llmem_dtype t;
        const char *name = code == CLI_OPT_KV_TYPE ? "--kv-type" : "--ssm-type";
        bool kv = code == CLI_OPT_KV_TYPE;
        if (llmem_dtype_parse(arg, &t) != LLMEM_OK || t == LLMEM_DTYPE_I32 ||
            (!kv && t == LLMEM_DTYPE_F8E4M3)) {
            fprintf(stderr, "llmem %s: %s wants f32, f16, bf16, int8%s, got '%s'\n", cmd, name,
                    kv ? " or fp8" : "", arg);
            return -1;
        }
        *(code == CLI_OPT_KV_TYPE ? &o->params.kv_dtype : &o->params.ssm_dtype) = t;
        return 1;
    }
    case CLI_OPT_PRECISION:
        if (!strcmp(arg, "precise") || !strcmp(arg, "fast")) {
            o->precision = arg[0] == 'p' ? CLI_PRECISION_PRECISE : CLI_PRECISION_FAST;
            return 1;
        }
        fprintf(stderr, "llmem %s: --precision wants precise or fast, got '%s'\n", cmd, arg);
        return -1;
    case CLI_OPT_NO_PREFIX_CACHE:
        o->params.no_prefix_cache = true;
        return 1;
    case CLI_OPT_POISON:
        o->params.poison = true;
        return 1;
    case CLI_OPT_CHECK_TENSORS:
        o->params.check_tensors = true;
        return 1;
    case CLI_OPT_PREFIX_CACHE_MB: {
        char *end = NULL;
        double mb = strtod(arg, &end);
        if (!end || end == arg || *end || !(mb > 0) || mb > 1048576.0 * 64) {
            fprintf(stderr, "llmem %s: --prefix-cache-mb wants MiB > 0 (e.g. 512 or 0.25), got '%s'\n",
                    cmd, arg);
            return -1;
        }
        o->params.prefix_cache_bytes = (int64_t)(mb * 1048576.0);
        return 1;
    }
    default:
        return 0;
    }
}

cli_precision cli_precision_of(const cli_model_opts *o, cli_precision dflt)
{
    return o->precision != CLI_PRECISION_DEFAULT ? o->precision : dflt;
}

void cli_apply_threads(const cli_model_opts *o)
{
    /* the cpu backend's thread pool reads LLMEM_THREADS when it starts */
    if (o->threads > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", (int)o->threads);
        setenv("LLMEM_THREADS", v, 1);
    }
}

char *cli_read_file(const char *cmd, const char *what, const char *path, size_t *len)
{
    FILE *f = cli_open_input(cmd, what, path, true);
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got = 1; buf && got > 0;) {
        if (n + 1 == cap) {
            char *nb = cap < ((size_t)1 << 40) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
    }
    bool bad = ferror(f) != 0;
    if (f != stdin)
        fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "llmem %s: cannot read %s '%s'%s\n", cmd, what, path,
                buf ? "" : ": out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* --ssm-type and --snapshots set the recurrent state: given to a model
 * without any (every layer attention or MLP), they would change nothing,
 * so they are refused (exit 2) rather than ignored. A config.json that
 * cannot be read is left to llmem_model_load, which names the problem. */
static int refuse_recurrent_opts(const char *cmd, const cli_model_opts *o, const char *dir)
{
    bool ssm = cli_model_opt_given(o, CLI_OPT_SSM_TYPE);
    bool snap = cli_model_opt_given(o, CLI_OPT_SNAPSHOTS);
    if (!ssm && !snap)
        return 0;
    llmem_model_config *cfg = malloc(sizeof *cfg);
    if (!cfg || llmem_model_config_load(dir, cfg, NULL, 0) != LLMEM_OK) {
        free(cfg);
        return 0;
    }
    bool recurrent = false;
    for (int32_t i = 0; i < cfg->n_layers && !recurrent; i++) {
        llmem_layer_kind k = cfg->layers[i].kind;
        recurrent = k != LLMEM_LAYER_ATTENTION && k != LLMEM_LAYER_MLP && k != LLMEM_LAYER_MOE;
    }
    free(cfg);
    if (recurrent)
        return 0;
    fprintf(stderr, "llmem %s: %s sets recurrent state, and '%s' has none (attention and MLP "
                    "layers only)\n", cmd, ssm ? "--ssm-type" : "--snapshots", dir);
    return 2;
}

int cli_open_model(const char *cmd, cli_model_opts *o, llmem_backend **be, llmem_model **m)
{
    char err[512] = "";
    *be = NULL;
    *m = NULL;
    const char *dir = o->model ? o->model : llmem_builtin_model_dir();
    if (!dir) {
        fprintf(stderr, "llmem %s: the built-in model was not found (set LLMEM_MODEL_DIR or pass "
                        "--model DIR)\n", cmd);
        return 1;
    }
    int rc = refuse_recurrent_opts(cmd, o, dir);
    if (rc != 0)
        return rc;
    cli_apply_threads(o);
    o->params.precision = o->precision == CLI_PRECISION_FAST ? LLMEM_PRECISION_FAST
                                                             : LLMEM_PRECISION_PRECISE;
    llmem_status st = llmem_backend_open(o->backend, o->device, be, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem %s: backend '%s': %s\n", cmd, o->backend, err);
        return 1;
    }
    cli_logf(CLI_LOG_INFO, cmd, "backend %s, loading model '%s'", llmem_backend_name(*be), dir);
    double t0 = cli_now();
    st = llmem_model_load(dir, *be, &o->params, m, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem %s: cannot load model '%s': %s (%s)\n", cmd, dir, err,
                llmem_status_str(st));
        llmem_backend_close(*be);
        *be = NULL;
        return 1;
    }
    cli_logf(CLI_LOG_INFO, cmd,
             "model loaded in %.2f s: vocabulary %d; precision %s; n_seq_max %d, n_ubatch %d, "
             "n_ctx %d, page size %d, n_pages %d",
             cli_now() - t0, (int)llmem_model_n_vocab(*m),
             llmem_precision_name(o->params.precision), (int)o->params.n_seq_max,
             (int)o->params.n_ubatch, (int)o->params.n_ctx, (int)o->params.page_size,
             (int)o->params.n_pages);
    return 0;
}

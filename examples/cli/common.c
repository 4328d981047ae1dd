/* Shared helpers of the llmem command line: model options, loading. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "examples/cli/common.h"

const char *const cli_model_opts_help =
    "model options:\n"
    "  --model DIR          Hugging Face checkpoint folder (config.json + *.safetensors);\n"
    "                       default: the built-in byte-level Bamba model\n"
    "  --backend NAME       auto | cpu | cuda | vulkan (default auto: CUDA, then a\n"
    "                       discrete Vulkan GPU, then cpu)\n"
    "  --device N           device index within the backend (default: its first)\n"
    "  --n-seq-max N        sequences in flight at once (default 8)\n"
    "  --n-ubatch N         tokens per ubatch (default 512)\n"
    "  --n-ctx N            tokens per sequence the KV cache is sized for (default 4096)\n"
    "  --page-size N        KV cache page size in tokens (default 16)\n"
    "  --n-pages N          KV cache pages (default n-seq-max * n-ctx / page-size)\n"
    "  --kv-type T          f32 | f16 | bf16 (default f32)\n"
    "  --no-prefix-cache    disable reuse of cached prompt pages\n"
    "  --poison             fill free pages and state slots with NaN (debugging;\n"
    "                       results must not change)\n";

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

static int need_value(const char *cmd, int argc, char **argv, int i)
{
    if (i + 1 >= argc) {
        fprintf(stderr, "llmem %s: option %s needs a value\n", cmd, argv[i]);
        return 0;
    }
    return 1;
}

int cli_model_opt(cli_model_opts *o, const char *cmd, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    struct { const char *name; int32_t *dst; int64_t lo, hi; } ints[] = {
        {"--device", &o->device, 0, 1024},
        {"--n-seq-max", &o->params.n_seq_max, 1, 1 << 20},
        {"--n-ubatch", &o->params.n_ubatch, 1, 1 << 20},
        {"--n-ctx", &o->params.n_ctx, 1, 1 << 26},
        {"--page-size", &o->params.page_size, 1, 1 << 16},
        {"--n-pages", &o->params.n_pages, 1, INT32_MAX},
    };
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
        if (strcmp(a, ints[k].name))
            continue;
        if (!need_value(cmd, argc, argv, *i))
            return -1;
        if (!cli_int(argv[*i + 1], ints[k].lo, ints[k].hi, ints[k].dst)) {
            fprintf(stderr, "llmem %s: %s wants an integer in [%lld, %lld], got '%s'\n", cmd, a,
                    (long long)ints[k].lo, (long long)ints[k].hi, argv[*i + 1]);
            return -1;
        }
        *i += 1;
        return 1;
    }
    if (!strcmp(a, "--model") || !strcmp(a, "--backend") || !strcmp(a, "--kv-type")) {
        if (!need_value(cmd, argc, argv, *i))
            return -1;
        const char *v = argv[++*i];
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--backend"))
            o->backend = v;
        else {
            llmem_dtype t;
            if (llmem_dtype_parse(v, &t) != LLMEM_OK || t == LLMEM_DTYPE_I32) {
                fprintf(stderr, "llmem %s: --kv-type wants f32, f16 or bf16, got '%s'\n", cmd, v);
                return -1;
            }
            o->params.kv_dtype = t;
        }
        return 1;
    }
    if (!strcmp(a, "--no-prefix-cache")) {
        o->params.no_prefix_cache = true;
        return 1;
    }
    if (!strcmp(a, "--poison")) {
        o->params.poison = true;
        return 1;
    }
    return 0;
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
    llmem_status st = llmem_backend_open(o->backend, o->device, be, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem %s: backend '%s': %s\n", cmd, o->backend, err);
        return 1;
    }
    st = llmem_model_load(dir, *be, &o->params, m, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem %s: cannot load model '%s': %s (%s)\n", cmd, dir, err,
                llmem_status_str(st));
        llmem_backend_close(*be);
        *be = NULL;
        return 1;
    }
    return 0;
}

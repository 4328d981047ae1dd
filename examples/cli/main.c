/* llmem: the command-line program (score, generate, bench, info). */
#include <stdio.h>
#include <string.h>

#include "examples/cli/cli.h"
#include "llmem/llmem.h"

int llmem_cli_tokenize(int argc, char **argv); /* examples/cli/tokenize.c */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem <command> [options]\n"
            "\n"
            "commands:\n"
            "  generate   stream text from a model (the built-in one by default)\n"
            "  score      log-probabilities of token sequences, one JSON line each\n"
            "  replay     serve a request trace (Azure LLM inference format) with continuous\n"
            "             batching and report throughput and latency percentiles\n"
            "  serve      an OpenAI-compatible HTTP server (continuous batching)\n"
            "  bench      memory-bandwidth benchmarks of the kernels on a backend\n"
            "  tokenize   text to token ids and back with a tokenizer.json\n"
            "  info       version, backends and devices\n"
            "\n"
            "`llmem <command> --help` describes each command's options;\n"
            "`llmem --version` prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("llmem %s\n", LLMEM_VERSION_STRING);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info"))
        return llmem_cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "score"))
        return llmem_cli_score(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate"))
        return llmem_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "replay"))
        return llmem_cli_replay(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize"))
        return llmem_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve"))
        return llmem_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench"))
        return llmem_cli_bench(argc - 1, argv + 1);
    fprintf(stderr, "llmem: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}

/* llmem info: version, backends (and why unavailable ones are missing),
 * devices and their memory. */
#include <stdio.h>
#include <string.h>

#include "examples/cli/cli.h"
#include "llmem/llmem.h"

static void print_line(const char *line, void *ctx)
{
    (void)ctx;
    printf("  %s\n", line);
}

int llmem_cli_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: llmem info\n\nPrints the llmem version, every backend the registry "
                   "knows (cpu, cuda, vulkan) with its devices and memory, and for each "
                   "unavailable backend the reason (no plugin, no driver, no device).\n"
                   "Plugins are searched in $LLMEM_BACKEND_PATH, the install folder and the "
                   "build tree.\n");
            return 0;
        }
        fprintf(stderr, "llmem info: unknown option '%s' (see llmem info --help)\n", argv[i]);
        return 2;
    }
    printf("llmem %s\nbackends:\n", LLMEM_VERSION_STRING);
    llmem_backend_list(print_line, NULL);
    return 0;
}

/* llmem generate: placeholder until the model runtime lands. */
#include <stdio.h>

#include "examples/cli/cli.h"

int llmem_cli_generate(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "llmem generate: not implemented yet\n");
    return 1;
}

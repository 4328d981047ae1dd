/* llmem score: placeholder until the model runtime lands. */
#include <stdio.h>

#include "examples/cli/cli.h"

int llmem_cli_score(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "llmem score: not implemented yet\n");
    return 1;
}

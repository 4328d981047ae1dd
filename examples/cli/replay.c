/* llmem replay: placeholder until the trace replay lands. */
#include <stdio.h>

#include "examples/cli/cli.h"

int llmem_cli_replay(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "llmem replay: not implemented yet\n");
    return 1;
}

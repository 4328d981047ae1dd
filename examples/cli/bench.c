/* llmem bench: placeholder until the CUDA/Vulkan benchmark lands. */
#include <stdio.h>

#include "examples/cli/cli.h"

int llmem_cli_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "llmem bench: not implemented yet\n");
    return 1;
}

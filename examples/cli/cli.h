/* llmem command line: one function per subcommand (examples/cli/<name>.c). */
#ifndef LLMEM_CLI_H
#define LLMEM_CLI_H

int llmem_cli_info(int argc, char **argv);
int llmem_cli_score(int argc, char **argv);
int llmem_cli_generate(int argc, char **argv);
int llmem_cli_bench(int argc, char **argv);
int llmem_cli_replay(int argc, char **argv);
int llmem_cli_serve(int argc, char **argv);

#endif

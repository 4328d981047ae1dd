/* llmem info: version, backends (and why unavailable ones are missing),
 * devices and their memory; --json for scripts. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/cli.h"
#include "examples/cli/common.h"
#include "llmem/llmem.h"

static void print_line(const char *line, void *ctx)
{
    (void)ctx;
    printf("  %s\n", line);
}

static void add_line(const char *line, void *ctx)
{
    cJSON_AddItemToArray((cJSON *)ctx, cJSON_CreateString(line));
}

/* {"version", "backends": [{"name", "available", "device", "device_name",
 * "memory_total", "memory_free", "reason"}], "details": [registry lines]} */
static int print_json(void)
{
    static const char *const names[] = {"cpu", "cuda", "vulkan"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", LLMEM_VERSION_STRING);
    cJSON *arr = cJSON_AddArrayToObject(o, "backends");
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, b);
        cJSON_AddStringToObject(b, "name", names[k]);
        llmem_backend *be = NULL;
        char err[512] = "";
        llmem_status st = llmem_backend_open(names[k], -1, &be, err, sizeof err);
        cJSON_AddBoolToObject(b, "available", st == LLMEM_OK);
        if (st != LLMEM_OK) {
            cJSON_AddStringToObject(b, "reason", err[0] ? err : llmem_status_str(st));
            continue;
        }
        llmem_backend_info info;
        if (llmem_backend_get_info(be, &info) == LLMEM_OK) {
            cJSON_AddNumberToObject(b, "device", info.device);
            cJSON_AddStringToObject(b, "device_name", info.device_name ? info.device_name : "");
            cJSON_AddNumberToObject(b, "memory_total", (double)info.memory_total);
            cJSON_AddNumberToObject(b, "memory_free", (double)info.memory_free);
            cJSON_AddBoolToObject(b, "host_visible", info.host_visible);
        }
        llmem_backend_close(be);
    }
    llmem_backend_list(add_line, cJSON_AddArrayToObject(o, "details"));
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) {
        fprintf(stderr, "llmem info: out of memory\n");
        return 1;
    }
    puts(s);
    free(s);
    return 0;
}

int llmem_cli_info(int argc, char **argv)
{
    enum { O_JSON = CLI_OPT_OWN };
    static const struct option own[] = {{"json", no_argument, NULL, O_JSON}, {0}};
    cli_parser p;
    cli_parser_init(&p, "info", argc, argv, own, "", CLI_GROUP_LOG);
    bool json = false;
    const char *v;
    for (int c; (c = cli_next(&p, &v)) != -1;) {
        if (c == '?')
            return 2;
        if (c == 'h') {
            printf("usage: llmem info [--json]\n\n"
                   "Prints the llmem version, every backend the registry knows (cpu, cuda,\n"
                   "vulkan) with its devices and memory, and for each unavailable backend the\n"
                   "reason (no plugin, no driver, no device).\n"
                   "Plugins are searched in $LLMEM_BACKEND_PATH, then the install folder\n"
                   "(<prefix>/lib/llmem, found relative to libllmem itself).\n\n"
                   "options:\n"
                   "  --json               one JSON object: version, backends (name, available,\n"
                   "                       device, device_name, memory_total, memory_free,\n"
                   "                       reason) and the registry's lines\n%s",
                   cli_log_opts_help);
            return 0;
        }
        if (c == O_JSON)
            json = true;
    }
    if (json)
        return print_json();
    printf("llmem %s\nbackends:\n", LLMEM_VERSION_STRING);
    llmem_backend_list(print_line, NULL);
    return 0;
}

/* libFuzzer harness: bytes -> llmem_chat_template_create and, when it
 * parses, llmem_chat_template_render_json. The input is a template; when it
 * holds a NUL byte, the bytes after the first one are the render context
 * (arbitrary JSON: messages, tools, any variable), else a fixed
 * conversation with tools is. Checked: no crash, leak, hang (the
 * evaluation budget) or undefined behaviour; a failure leaves *out NULL and
 * says why in err. The seeds are the chat templates of
 * tests/fixtures/chat_templates, alone and followed by a context. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/chat_template.h"
#include "tests/support/run.h"

static const char *ctx =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    "{\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"id\": \"abc123456\", \"type\": \"function\","
    "\"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}, {\"role\": \"tool\", \"content\": \"42\"},"
    "{\"role\": \"user\", \"content\": \"and?\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    "\"parameters\": {\"type\": \"object\"}}}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\","
    "\"eos_token\": \"</s>\", \"date_string\": \"26 Jul 2024\"}";

static void die(const char *what)
{
    fprintf(stderr, "fuzz_chat_template: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("LLMEM_FUZZ_SEED_DIR");
    char src[1024];
    snprintf(src, sizeof src, "%s/tests/fixtures/chat_templates", test_source_dir());
    DIR *d = dir ? opendir(src) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strstr(e->d_name, ".jinja"))
            continue;
        char in[2048], out[2048], buf[65536];
        snprintf(in, sizeof in, "%s/%s", src, e->d_name);
        snprintf(out, sizeof out, "%s/%s", dir, e->d_name);
        FILE *f = fopen(in, "rb"), *g = fopen(out, "wb");
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (g)
            fwrite(buf, 1, n, g);
        if (f)
            fclose(f);
        if (g)
            fclose(g);
        /* the same template with the context after a NUL, for mutation */
        snprintf(out, sizeof out, "%s/%s.ctx", dir, e->d_name);
        if ((g = fopen(out, "wb"))) {
            fwrite(buf, 1, n, g);
            fwrite("", 1, 1, g);
            fwrite(ctx, 1, strlen(ctx), g);
            fclose(g);
        }
    }
    if (d)
        closedir(d);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384)
        return 0;
    char *src = malloc(size + 1);
    memcpy(src, data, size);
    src[size] = 0;
    /* a NUL ends the template; what follows is the context */
    const char *context = strlen(src) < size ? src + strlen(src) + 1 : ctx;
    char err[256] = "";
    llmem_chat_template *t = NULL;
    llmem_status st = llmem_chat_template_create(src, &t, err, sizeof err);
    if (st != LLMEM_OK && (t || !err[0]))
        die("failed create without a message, or with an object");
    if (st == LLMEM_OK) {
        char *out = NULL;
        size_t len = 0;
        err[0] = 0;
        st = llmem_chat_template_render_json(t, context, &out, &len, err, sizeof err);
        if (st != LLMEM_OK && (out || !err[0]))
            die("failed render without a message, or with output");
        if (st == LLMEM_OK && (!out || strlen(out) > len))
            die("render output inconsistent");
        free(out);
        llmem_chat_template_destroy(t);
    }
    free(src);
    return 0;
}

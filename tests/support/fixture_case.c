/* llmem tests: reading one case of a transformers fixture (fixture_case.h). */
#include "support/fixture_case.h"

#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fills tok (tokens) or ref (logprobs) from the line of file whose "id" is
 * id; returns the count, -1 when the file or the case is missing. */
static int32_t read_array(const char *dir, const char *file, const char *id, const char *key,
                          int32_t *tok, double *ref, int32_t cap)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    char *line = NULL;
    size_t line_cap = 0;
    int32_t n = -1;
    while (n < 0 && getline(&line, &line_cap, f) > 0) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *jid = cJSON_GetObjectItemCaseSensitive(j, "id");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
        if (cJSON_IsString(jid) && strcmp(jid->valuestring, id) == 0 && cJSON_IsArray(a)) {
            n = 0;
            for (const cJSON *e = a->child; e && n < cap; e = e->next, n++) {
                if (tok)
                    tok[n] = (int32_t)e->valuedouble;
                else
                    ref[n] = e->valuedouble;
            }
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    return n;
}

int32_t fx_case_load(const char *dir, const char *id, int32_t *tok, double *ref, int32_t cap)
{
    int32_t n = read_array(dir, "cases.jsonl", id, "tokens", tok, NULL, cap);
    if (n < 0 || !ref)
        return n;
    return read_array(dir, "reference.jsonl", id, "logprobs", NULL, ref, cap > 0 ? cap - 1 : 0) < 0
               ? -1
               : n;
}

char *fx_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ck_assert_msg(n >= 0, "cannot size %s", path);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(s);
    ck_assert_msg(fread(s, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    s[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return s;
}

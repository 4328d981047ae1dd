/* llmem models/: helpers shared by the checkpoint loader files. */
#ifndef LLMEM_MODELS_HF_INTERNAL_H
#define LLMEM_MODELS_HF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "llmem/status.h" /* llmem_errf, the one error formatter */

/* Largest integer a JSON number (an IEEE double) holds exactly: 2^53. */
#define HF_JSON_INT_MAX 9007199254740992.0

/* Deepest nesting of arrays and objects cJSON parses (CJSON_NESTING_LIMIT);
 * a deeper text fails to parse although it may be valid JSON. */
#define HF_JSON_MAX_DEPTH CJSON_NESTING_LIMIT

/* Whether text[0, len) opens more than HF_JSON_MAX_DEPTH arrays or objects
 * at once (brackets inside strings do not count). Lets a loader name that
 * fault instead of "invalid JSON" when cJSON refuses the text. */
static inline bool hf_json_too_deep(const char *text, size_t len)
{
    long depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > HF_JSON_MAX_DEPTH)
                return true;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return false;
}

#endif

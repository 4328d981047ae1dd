/* llmem: the checks every JSON text from outside goes through, shared by
 * the checkpoint loaders (config.json, safetensors headers and index,
 * tokenizer.json, tokenizer_config.json) and the request bodies of
 * `llmem serve` (examples/cli/serve_api.c). Implemented in
 * models/hf_json.c, which libllmem builds with its functions hidden
 * (HF_JSON_API) and the command line and tests/test_json_oom.c build into
 * themselves, so they share them without libllmem exporting internals.
 * The functions keep no state: any thread may call them at once.
 *
 * Why: cJSON reads more than the readers the files are written for.
 * Python's json.loads (transformers, the OpenAI server) and serde_json
 * (Hugging Face tokenizers, safetensors) take one JSON text (RFC 8259,
 * section 2: a value with only whitespace around it); cJSON stops after
 * the value. JSON leaves a name given twice in one object to the reader
 * (RFC 8259, section 4): json.loads keeps the last, cJSON's lookups the
 * first. And cJSON's strings are C strings, so "a\u0000b" reads as "a".
 * cJSON skips a leading UTF-8 byte order mark; transformers opens
 * config.json and tokenizer_config.json as UTF-8 text and json.loads then
 * fails ("Unexpected UTF-8 BOM"), and serde_json (tokenizers 0.23,
 * safetensors 0.8) fails at line 1 column 1. Each of these would make
 * llmem read a file other than it was written, or one its writers' own
 * readers refuse; hf_json_read refuses them instead. */
#ifndef LLMEM_MODELS_HF_JSON_H
#define LLMEM_MODELS_HF_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "llmem/status.h"

#if defined(__GNUC__)
#define HF_JSON_API __attribute__((visibility("hidden")))
#else
#define HF_JSON_API
#endif

/* Largest integer a JSON number (an IEEE double) holds exactly: 2^53. */
#define HF_JSON_INT_MAX 9007199254740992.0

/* Deepest nesting of arrays and objects cJSON parses (CJSON_NESTING_LIMIT);
 * a deeper text fails to parse although it may be valid JSON. */
#define HF_JSON_MAX_DEPTH CJSON_NESTING_LIMIT

/* What hf_json_read found. */
typedef enum hf_json_fault {
    HF_JSON_OK = 0,
    HF_JSON_SYNTAX,    /* not JSON */
    HF_JSON_TRAILING,  /* a JSON value, then bytes other than whitespace */
    HF_JSON_TOO_DEEP,  /* nested deeper than HF_JSON_MAX_DEPTH */
    HF_JSON_NUL,       /* a string (or a name) holds the escape \u0000 */
    HF_JSON_CONTROL,   /* a control character written raw (not escaped, not whitespace) */
    HF_JSON_DUP,       /* one object holds a name twice */
    HF_JSON_NO_MEMORY, /* no memory to parse the text or to look for names given twice */
    HF_JSON_BOM,       /* starts with a UTF-8 byte order mark (EF BB BF) */
} hf_json_fault;

/* Where hf_json_read found its fault. */
typedef struct hf_json_where {
    size_t at;         /* byte offset: HF_JSON_SYNTAX, _TRAILING, _NUL, _CONTROL */
    bool object;       /* HF_JSON_TRAILING: the value before the bytes was an object */
    unsigned char ctl; /* HF_JSON_CONTROL: the character */
    char key[64];      /* HF_JSON_DUP: the name given twice (cut to 63 bytes) */
} hf_json_where;

/* Parses text[0, len) (need not be NUL-terminated) as one JSON text, as
 * json.loads of a str and serde_json read it, and refuses what cJSON would
 * read otherwise: a leading byte order mark (HF_JSON_BOM, at 0), bytes
 * after the value, a string or name holding \u0000, a raw control
 * character, a name given twice in one object (at any depth), and what
 * RFC 8259 does not allow but cJSON takes (hf_json_scan). Tells
 * a failed allocation inside cJSON (HF_JSON_NO_MEMORY) from bad text.
 * On HF_JSON_OK *root is the tree (the caller frees it with cJSON_Delete);
 * otherwise *root is NULL and *w says where (hf_json_describe words it).
 * O(len log len). */
HF_JSON_API hf_json_fault hf_json_read(const char *text, size_t len, cJSON **root,
                                       hf_json_where *w);

/* Words fault f of hf_json_read into buf (e.g. "a string holds \u0000
 * (at byte 12)"), without the file's name: callers prefix it. Returns buf. */
HF_JSON_API const char *hf_json_describe(hf_json_fault f, const hf_json_where *w, char *buf,
                                         size_t len);

/* Whether text[0, len) starts with a UTF-8 byte order mark. A reader that
 * takes one where Python's json.loads of bytes does (it decodes them as
 * utf-8-sig: a server's request bodies) skips it before hf_json_read. */
HF_JSON_API bool hf_json_has_bom(const char *text, size_t len);

/* Whether text[0, len) is one JSON text (RFC 8259: one value with only
 * whitespace around it, no byte order mark) that cJSON parses when memory
 * suffices (hf_json.c, hf_json_scan_nul, has the details): stricter than
 * cJSON, never more lenient. Allocates nothing; O(len). */
HF_JSON_API bool hf_json_valid(const char *text, size_t len);

#endif

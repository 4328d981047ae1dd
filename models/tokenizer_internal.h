/* llmem: tokenizer internals shared by models/tokenizer*.c. Not public. */
#ifndef LLMEM_TOKENIZER_INTERNAL_H
#define LLMEM_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/tokenizer.h"

/* growable byte string */
typedef struct tk_buf {
    char *p;
    size_t n, cap;
} tk_buf;

bool tk_buf_put(tk_buf *b, const void *s, size_t n);
bool tk_buf_reserve(tk_buf *b, size_t cap_needed); /* capacity in bytes, incl. the NUL */
static inline bool tk_buf_putc(tk_buf *b, char c) { return tk_buf_put(b, &c, 1); }
/* Appends s[0, n) to out with every occurrence of a replaced by b, left to right, not
 * overlapping (a == "": s unchanged). False when out of memory. */
bool tk_replace_all(tk_buf *out, const char *s, size_t n, const char *a, const char *b);

/* growable int32 array */
typedef struct tk_ids {
    int32_t *p;
    size_t n, cap;
} tk_ids;

bool tk_ids_push(tk_ids *v, int32_t id);

/* string -> id, open addressing; keys are the tokenizer's pieces */
typedef struct tk_map {
    uint32_t mask;   /* cap - 1, cap a power of two */
    int32_t *slot;   /* id, or -1 when empty */
    char **key;      /* key[id] */
    uint32_t *key_len;
} tk_map;

bool tk_map_init(tk_map *m, size_t n_expected, char **key, uint32_t *key_len);
void tk_map_finish(tk_map *m);
void tk_map_put(tk_map *m, int32_t id); /* the key is key[id] */
int32_t tk_map_get(const tk_map *m, const char *s, size_t n);

/* (left id, right id) -> (rank, merged id) */
typedef struct tk_merge_entry {
    uint64_t key; /* (left << 32) | right; UINT64_MAX when empty */
    int32_t rank, id;
} tk_merge_entry;

typedef struct tk_merges {
    uint32_t mask;
    tk_merge_entry *e;
} tk_merges;

enum tk_norm_kind { TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD, TK_NORM_PREPEND, TK_NORM_REPLACE };
typedef struct tk_norm {
    enum tk_norm_kind kind;
    char *a, *b; /* prepend: a; replace: a -> b */
} tk_norm;

enum tk_pre_kind { TK_PRE_SPLIT, TK_PRE_BYTELEVEL, TK_PRE_METASPACE };
enum tk_split_behavior { TK_SPLIT_ISOLATED, TK_SPLIT_REMOVED, TK_SPLIT_MERGED_PREV, TK_SPLIT_MERGED_NEXT,
                         TK_SPLIT_CONTIGUOUS };
typedef struct tk_pre {
    enum tk_pre_kind kind;
    pcre2_code *re;            /* split / byte-level regex (NULL: no regex) */
    enum tk_split_behavior behavior;
    bool invert;               /* the gaps are the matches */
    bool add_prefix_space;     /* byte-level */
    char replacement[8];       /* metaspace, UTF-8 */
    int prepend;               /* metaspace: 0 never, 1 first, 2 always */
    bool split;                /* metaspace */
} tk_pre;

enum tk_dec_kind { TK_DEC_BYTELEVEL, TK_DEC_METASPACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE, TK_DEC_STRIP,
                   TK_DEC_REPLACE };
typedef struct tk_dec {
    enum tk_dec_kind kind;
    char *a, *b;          /* replace a -> b; metaspace replacement a; strip content a */
    int start, stop;      /* strip */
    int prepend;          /* metaspace */
} tk_dec;

typedef struct tk_added {
    int32_t id;
    char *content;
    uint32_t len;
    char *norm;           /* normalized content (normalized tokens) */
    uint32_t norm_len;
    bool special, normalized, lstrip, rstrip, single_word;
} tk_added;

#define TK_MAX_STAGES 8

struct llmem_tokenizer {
    int32_t n_vocab;
    char **piece;          /* piece[id] as decode sees it (an added token's
                              content, else the vocabulary key); NULL when unused */
    uint32_t *piece_len;
    char **mpiece;         /* the BPE model's key of id, or NULL; equal
                              pointers share one allocation */
    uint32_t *mpiece_len;
    uint8_t *flags;        /* TK_F_* per id */
    tk_map model;          /* the BPE model's vocabulary */
    tk_map all;            /* model + added */
    tk_merges merges;
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_id[256];  /* <0xXX> ids, -1 when absent */

    tk_norm norm[TK_MAX_STAGES];
    int n_norm;
    tk_pre pre[TK_MAX_STAGES];
    int n_pre;
    bool byte_level;       /* some pre-tokenizer maps bytes to GPT-2 chars */
    tk_dec dec[TK_MAX_STAGES];
    int n_dec;
    bool has_decoder;

    tk_added *added;
    int n_added;
    /* added tokens by first byte, per pass (0: raw text, 1: normalized):
     * added_by_byte[p][added_byte_start[p][b] .. added_byte_start[p][b + 1]) */
    int32_t *added_by_byte[2];
    int32_t added_byte_start[2][257];

    int32_t *prefix, *suffix; /* ids add_special adds */
    int n_prefix, n_suffix;

    int32_t bos, eos;
    char *bos_str, *eos_str, *chat_template;
};

#define TK_F_SPECIAL 1u
#define TK_F_ADDED 2u
#define TK_F_EOG 4u

/* GPT-2 byte <-> unicode map (bytes_to_unicode of openai/gpt-2 encoder.py):
 * printable bytes map to themselves, the 68 others to U+0100.. in order. */
uint32_t tk_byte_cp(unsigned b);
int tk_cp_to_byte(uint32_t cp); /* -1 when cp is no mapped byte */

/* UTF-8 helpers. tk_utf8_next: length of the well-formed sequence at s
 * (1..4), or 0 when s[0..] starts an ill-formed one; *cp gets the code
 * point. tk_utf8_invalid_len: length of the maximal ill-formed subpart at s
 * (Unicode 3-7 / WHATWG), >= 1. */
int tk_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
size_t tk_utf8_invalid_len(const unsigned char *s, size_t n);
int tk_utf8_put(char *out, uint32_t cp);
/* Appends s with every maximal ill-formed subpart replaced by U+FFFD. */
bool tk_utf8_lossy(tk_buf *out, const unsigned char *s, size_t n);
/* Offset of the first byte of s[0, n) that is not well-formed UTF-8, or n. */
size_t tk_utf8_bad_at(const char *s, size_t n);
/* Whether the C string s is exactly one well-formed UTF-8 character. */
bool tk_utf8_one_char(const char *s);
/* The JSON object of a file's text txt[0, n) into *out: UTF-8, one JSON
 * text with no \u0000 and no name twice in one object (hf_json_read), an
 * object. The caller frees it with cJSON_Delete. Otherwise *out is NULL,
 * err names path, and the status is LLMEM_E_NO_MEMORY (cJSON or the check
 * for names given twice ran out of memory) or LLMEM_E_CORRUPT. */
llmem_status tk_parse_object(const char *path, const char *txt, size_t n, cJSON **out, char *err,
                             size_t err_len);

/* The encoder (tokenizer_encode.c) */
llmem_status tk_bpe_word(const llmem_tokenizer *tok, const char *s, size_t n, tk_ids *out,
                         void **scratch, size_t *scratch_cap);
void tk_merges_finish(tk_merges *m);
bool tk_merges_init(tk_merges *m, size_t n);
bool tk_merges_put(tk_merges *m, int32_t left, int32_t right, int32_t rank, int32_t id);

/* Normalizes s[0..n) through the normalizer chain into out (replacing its
 * contents). */
llmem_status tk_normalize(const llmem_tokenizer *tok, const char *s, size_t n, tk_buf *out);

void tk_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

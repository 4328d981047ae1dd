/* llmem models/: the JSON text checks of models/hf_json.h (what they
 * refuse and why: there). References: RFC 8259 (JSON), sections 2, 4, 6
 * and 7; cJSON 1.7's parser for what it takes beyond them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/hf_json.h"

/* Whether text[0, len) opens more than HF_JSON_MAX_DEPTH arrays or objects
 * at once (brackets inside strings do not count). Lets a loader name that
 * fault instead of "invalid JSON" when cJSON refuses the text. */
static bool hf_json_too_deep(const char *text, size_t len)
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

/* hf_json_valid's steps over text[0, len) from *i (each returns false
 * where the text stops being JSON; *i moves past what it read). */
static void hf_json_skip_ws(const unsigned char *s, size_t len, size_t *i)
{
    while (*i < len && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r'))
        (*i)++;
}

static bool hf_json_hex4(const unsigned char *s, size_t len, size_t at, unsigned *cp)
{
    *cp = 0;
    if (at + 4 > len)
        return false;
    for (size_t k = at; k < at + 4; k++) {
        unsigned char c = s[k];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16u)
            return false;
        *cp = *cp * 16 + d;
    }
    return true;
}

/* A string from its opening quote at *i (RFC 8259, section 7); a \u
 * escape of a UTF-16 surrogate only as a high-low pair, as cJSON demands.
 * Sets *nul when it holds the escape \u0000 (valid JSON that cJSON cuts
 * its C string at). */
static bool hf_json_scan_string(const unsigned char *s, size_t len, size_t *i, bool *nul)
{
    size_t k = *i + 1;
    while (k < len && s[k] != '"') {
        unsigned cp, lo;
        if (s[k] < 0x20)
            return false;
        if (s[k++] != '\\')
            continue;
        if (k >= len)
            return false;
        if (s[k] != 'u') {
            if (!memchr("\"\\/bfnrt", s[k], 8))
                return false;
            k++;
            continue;
        }
        if (!hf_json_hex4(s, len, k + 1, &cp) || (cp >= 0xDC00 && cp <= 0xDFFF))
            return false;
        *nul |= cp == 0;
        k += 5;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (k + 1 >= len || s[k] != '\\' || s[k + 1] != 'u' ||
                !hf_json_hex4(s, len, k + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return false;
            k += 6;
        }
    }
    if (k >= len)
        return false;
    *i = k + 1;
    return true;
}

/* How many digits 0-9 stand from *i (moved past them). */
static size_t hf_json_digits(const unsigned char *s, size_t len, size_t *i)
{
    size_t from = *i;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9')
        (*i)++;
    return *i - from;
}

/* A number (RFC 8259, section 6): -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)? */
static bool hf_json_scan_number(const unsigned char *s, size_t len, size_t *i)
{
    size_t k = *i;
    if (k < len && s[k] == '-')
        k++;
    if (k < len && s[k] == '0')
        k++;
    else if (!hf_json_digits(s, len, &k))
        return false;
    if (k < len && s[k] == '.' && (++k, !hf_json_digits(s, len, &k)))
        return false;
    if (k < len && (s[k] == 'e' || s[k] == 'E')) {
        k++;
        if (k < len && (s[k] == '+' || s[k] == '-'))
            k++;
        if (!hf_json_digits(s, len, &k))
            return false;
    }
    *i = k;
    return true;
}

/* A name and its colon, from the opening quote of the name at *i. */
static bool hf_json_scan_name(const unsigned char *s, size_t len, size_t *i, bool *nul)
{
    if (*i >= len || s[*i] != '"' || !hf_json_scan_string(s, len, i, nul))
        return false;
    hf_json_skip_ws(s, len, i);
    if (*i >= len || s[*i] != ':')
        return false;
    (*i)++;
    return true;
}

/* Whether text[0, len) is one JSON text (RFC 8259: one value with only
 * whitespace around it, no byte order mark) that cJSON parses when memory
 * suffices: nesting no deeper
 * than HF_JSON_MAX_DEPTH, and no lone UTF-16 surrogate escaped. It is
 * stricter than cJSON elsewhere (raw control characters, numbers such as
 * 01 or 1., whitespace other than space, tab, LF, CR, \u escapes of
 * other than four hex digits), never more lenient, so "valid here but
 * refused by cJSON" means cJSON ran out of memory. Where it is not, *at
 * is the byte offset where the text stops being JSON (at a string or
 * number: where that starts). *nul is set when a string or name holds the
 * escape \u0000 (hf_json_bad_at's other fault, so that a valid text
 * needs no second pass). Allocates nothing; iterative; O(len). */
static bool hf_json_scan_nul(const char *text, size_t len, size_t *at, bool *nul)
{
    const unsigned char *s = (const unsigned char *)text;
    unsigned char open[HF_JSON_MAX_DEPTH]; /* the closing bracket of each open container */
    size_t i = 0;
    int depth = 0;
    for (;;) {
        /* a value at i */
        hf_json_skip_ws(s, len, &i);
        if (i >= len)
            goto bad;
        unsigned char c = s[i];
        if (c == '[' || c == '{') {
            if (depth == HF_JSON_MAX_DEPTH)
                goto bad;
            open[depth++] = c == '[' ? ']' : '}';
            i++;
            hf_json_skip_ws(s, len, &i);
            if (i < len && s[i] == open[depth - 1]) {
                i++;
                depth--;
            } else {
                if (c == '{' && !hf_json_scan_name(s, len, &i, nul))
                    goto bad;
                continue; /* its first value */
            }
        } else if (c == '"') {
            if (!hf_json_scan_string(s, len, &i, nul))
                goto bad;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (!hf_json_scan_number(s, len, &i))
                goto bad;
        } else if (len - i >= 4 && (!memcmp(s + i, "true", 4) || !memcmp(s + i, "null", 4))) {
            i += 4;
        } else if (len - i >= 5 && !memcmp(s + i, "false", 5)) {
            i += 5;
        } else {
            goto bad;
        }
        /* after a value: close containers until a comma starts the next value */
        for (;;) {
            hf_json_skip_ws(s, len, &i);
            if (depth == 0) {
                if (i == len)
                    return true;
                goto bad;
            }
            if (i >= len)
                goto bad;
            if (s[i] == open[depth - 1]) {
                i++;
                depth--;
                continue;
            }
            if (s[i] != ',')
                goto bad;
            i++;
            if (open[depth - 1] == '}') {
                hf_json_skip_ws(s, len, &i);
                if (!hf_json_scan_name(s, len, &i, nul))
                    goto bad;
            }
            break;
        }
    }
bad:
    *at = i;
    return false;
}

/* hf_json_scan_nul without the \u0000 report. */
static bool hf_json_scan(const char *text, size_t len, size_t *at)
{
    bool nul = false;
    return hf_json_scan_nul(text, len, at, &nul);
}

/* hf_json_scan without the offset. */
bool hf_json_valid(const char *text, size_t len)
{
    size_t at;
    return hf_json_scan(text, len, &at);
}


/* Whether text[0, len) starts with a UTF-8 byte order mark. A reader that
 * takes one where Python's json.loads of bytes does (it decodes them as
 * utf-8-sig: a server's request bodies) skips it before hf_json_read. */
bool hf_json_has_bom(const char *text, size_t len)
{
    return len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3);
}

/* The first byte of text[0, len) that json.loads and serde_json refuse
 * but cJSON takes, or len when there is none: a control character
 * (U+0000..U+001F) written raw inside a string, or outside strings other
 * than the whitespace tab, LF and CR (RFC 8259, sections 2 and 7; cJSON
 * skips any byte up to 0x20 as whitespace and keeps raw ones in strings);
 * or the backslash of a \u0000 escape (*nul set: cJSON ends its C strings
 * there, so "llama\u0000x" would read as "llama"). */
static size_t hf_json_bad_at(const char *text, size_t len, bool *nul)
{
    bool in_str = false;
    *nul = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch < 0x20 && (in_str || (ch != '\t' && ch != '\n' && ch != '\r')))
            return i;
        if (!in_str) {
            in_str = ch == '"';
        } else if (ch == '"') {
            in_str = false;
        } else if (ch == '\\' && i + 1 < len) {
            i++; /* the escaped character (a control character there is no escape) */
            if ((unsigned char)text[i] < 0x20)
                return i;
            if (text[i] == 'u' && i + 4 < len && !memcmp(text + i + 1, "0000", 4)) {
                *nul = true;
                return i - 1;
            }
        }
    }
    return len;
}

static int hf_json_cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Looks for a name that one object of the tree v (at any depth) holds
 * twice. On LLMEM_OK *dup is that name (owned by the tree) or NULL when
 * there is none; LLMEM_E_NO_MEMORY otherwise. O(n log n) in the names of
 * each object; recursion no deeper than cJSON's nesting limit. */
static llmem_status hf_json_dup_key(const cJSON *v, const char **dup)
{
    *dup = NULL;
    if (cJSON_IsObject(v) && v->child && v->child->next) {
        size_t n = 0, i = 0;
        for (const cJSON *e = v->child; e; e = e->next)
            n++;
        const char **names = malloc(n * sizeof *names);
        if (!names)
            return LLMEM_E_NO_MEMORY;
        for (const cJSON *e = v->child; e; e = e->next)
            names[i++] = e->string;
        qsort(names, n, sizeof *names, hf_json_cmp_name);
        for (i = 1; i < n && !*dup; i++)
            if (!strcmp(names[i], names[i - 1]))
                *dup = names[i];
        free(names);
    }
    for (const cJSON *e = v ? v->child : NULL; e && !*dup; e = e->next) {
        llmem_status s = hf_json_dup_key(e, dup);
        if (s != LLMEM_OK)
            return s;
    }
    return LLMEM_OK;
}


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
hf_json_fault hf_json_read(const char *text, size_t len, cJSON **root, hf_json_where *w)
{
    memset(w, 0, sizeof *w);
    *root = NULL;
    if (hf_json_has_bom(text, len))
        return HF_JSON_BOM;
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    w->at = end && end >= text ? (size_t)(end - text) : 0;
    if (!*root) {
        /* cJSON_Parse says NULL both for bad text and for a failed
         * allocation; valid JSON it refuses means the allocation */
        if (hf_json_too_deep(text, len))
            return HF_JSON_TOO_DEEP;
        return hf_json_valid(text, len) ? HF_JSON_NO_MEMORY : HF_JSON_SYNTAX;
    }
    hf_json_fault f = HF_JSON_OK;
    const char *dup = NULL;
    bool nul = false;
    size_t syntax_at = 0;
    while (w->at < len && (text[w->at] == ' ' || text[w->at] == '\t' || text[w->at] == '\n' ||
                           text[w->at] == '\r'))
        w->at++;
    if (w->at < len) {
        f = HF_JSON_TRAILING;
        w->object = cJSON_IsObject(*root);
    } else if (!hf_json_scan_nul(text, len, &syntax_at, &nul) || nul) {
        /* one pass when the text is sound; on a fault, a raw control
         * character or \u0000 anywhere is named before a syntax fault
         * (hf_json_bad_at; the scan refuses every raw control character,
         * so a text it passes without \u0000 holds none), then what cJSON
         * takes and json.loads does not: 01, 1., "\uZZZZ" (read as
         * U+0000), whitespace such as a vertical tab. Before the names:
         * "a\u0000" and "a" are one name to cJSON */
        if ((w->at = hf_json_bad_at(text, len, &nul)) < len) {
            f = nul ? HF_JSON_NUL : HF_JSON_CONTROL;
            w->ctl = (unsigned char)text[w->at];
        } else {
            f = HF_JSON_SYNTAX;
            w->at = syntax_at;
        }
    } else if (hf_json_dup_key(*root, &dup) != LLMEM_OK) {
        f = HF_JSON_NO_MEMORY;
    } else if (dup) {
        snprintf(w->key, sizeof w->key, "%s", dup);
        f = HF_JSON_DUP;
    }
    if (f != HF_JSON_OK) {
        cJSON_Delete(*root);
        *root = NULL;
    }
    return f;
}

/* Words fault f of hf_json_read into buf (e.g. "a string holds \u0000
 * (at byte 12)"), without the file's name: callers prefix it. Returns buf. */
const char *hf_json_describe(hf_json_fault f, const hf_json_where *w, char *buf, size_t len)
{
    switch (f) {
    case HF_JSON_OK: snprintf(buf, len, "no fault"); break;
    case HF_JSON_SYNTAX: snprintf(buf, len, "not valid JSON (error near byte %zu)", w->at); break;
    case HF_JSON_TRAILING:
        snprintf(buf, len, "bytes after the JSON %s (at byte %zu)", w->object ? "object" : "value",
                 w->at);
        break;
    case HF_JSON_TOO_DEEP:
        snprintf(buf, len, "nests arrays or objects deeper than %d levels", HF_JSON_MAX_DEPTH);
        break;
    case HF_JSON_NUL: snprintf(buf, len, "a string holds \\u0000 (at byte %zu)", w->at); break;
    case HF_JSON_CONTROL:
        snprintf(buf, len, "control character 0x%02X written raw (at byte %zu; JSON needs it "
                 "escaped)", (unsigned)w->ctl, w->at);
        break;
    case HF_JSON_DUP:
        snprintf(buf, len, "key '%.60s' appears twice in one object", w->key);
        break;
    case HF_JSON_NO_MEMORY: snprintf(buf, len, "out of memory"); break;
    case HF_JSON_BOM:
        snprintf(buf, len, "starts with a UTF-8 byte order mark (json.loads and serde_json refuse "
                 "it; save the file as UTF-8 without one)");
        break;
    }
    return buf;
}

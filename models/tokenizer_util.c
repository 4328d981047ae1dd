/* llmem: tokenizer building blocks -- buffers, hash maps, UTF-8, the GPT-2
 * byte map and the normalizers (utf8proc).
 *
 * References: Unicode 15, section 3.9 (Table 3-7, well-formed UTF-8) and
 * "U+FFFD Substitution of Maximal Subparts"; openai/gpt-2 encoder.py
 * (bytes_to_unicode); huggingface/tokenizers normalizers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "models/hf_internal.h"
#include "models/tokenizer_internal.h"

void tk_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || !err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    llmem_verrf(err, err_len, fmt, ap);
    va_end(ap);
}

bool tk_buf_reserve(tk_buf *b, size_t cap_needed)
{
    if (cap_needed <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < cap_needed)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tk_buf_put(tk_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap && !tk_buf_reserve(b, b->n + n + 1))
        return false;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

bool tk_ids_push(tk_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return false;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return true;
}

/* ---- string map ---------------------------------------------------------- */

static uint32_t hash_str(const char *s, size_t n) { return (uint32_t)XXH3_64bits(s, n); }

bool tk_map_init(tk_map *m, size_t n_expected, char **key, uint32_t *key_len)
{
    size_t cap = 16;
    while (cap < n_expected * 2 + 16)
        cap *= 2;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot)
        return false;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = (uint32_t)(cap - 1);
    m->key = key;
    m->key_len = key_len;
    return true;
}

void tk_map_finish(tk_map *m)
{
    free(m->slot);
    m->slot = NULL;
}

void tk_map_put(tk_map *m, int32_t id)
{
    const char *s = m->key[id];
    size_t n = m->key_len[id];
    uint32_t i = hash_str(s, n) & m->mask;
    while (m->slot[i] >= 0) {
        int32_t o = m->slot[i];
        if (m->key_len[o] == n && !memcmp(m->key[o], s, n))
            return; /* first id wins, as a JSON object's last key would not
                       matter: vocab keys are unique */
        i = (i + 1) & m->mask;
    }
    m->slot[i] = id;
}

int32_t tk_map_get(const tk_map *m, const char *s, size_t n)
{
    uint32_t i = hash_str(s, n) & m->mask;
    while (m->slot[i] >= 0) {
        int32_t o = m->slot[i];
        if (m->key_len[o] == n && !memcmp(m->key[o], s, n))
            return o;
        i = (i + 1) & m->mask;
    }
    return -1;
}

/* ---- merge table ----------------------------------------------------------- */

static uint32_t hash_u64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

bool tk_merges_init(tk_merges *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2 + 16)
        cap *= 2;
    m->e = malloc(cap * sizeof *m->e);
    if (!m->e)
        return false;
    for (size_t i = 0; i < cap; i++)
        m->e[i].key = UINT64_MAX;
    m->mask = (uint32_t)(cap - 1);
    return true;
}

void tk_merges_finish(tk_merges *m)
{
    free(m->e);
    m->e = NULL;
}

bool tk_merges_put(tk_merges *m, int32_t left, int32_t right, int32_t rank, int32_t id)
{
    uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    uint32_t i = hash_u64(k) & m->mask;
    while (m->e[i].key != UINT64_MAX) {
        if (m->e[i].key == k)
            return false; /* duplicate: the first (lowest rank) stays */
        i = (i + 1) & m->mask;
    }
    m->e[i].key = k;
    m->e[i].rank = rank;
    m->e[i].id = id;
    return true;
}

/* ---- UTF-8 ----------------------------------------------------------------- */

int tk_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if ((size_t)len > n)
        return 0;
    for (int i = 1; i < len; i++) {
        unsigned d = s[i];
        if (d < lo || d > hi)
            return 0;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (d & 0x3F);
    }
    *cp = v;
    return len;
}

size_t tk_utf8_invalid_len(const unsigned char *s, size_t n)
{
    /* The maximal subpart: the longest prefix of a well-formed sequence
     * (at least one byte). */
    unsigned c = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 1;
    size_t i = 1;
    while (i < (size_t)len && i < n) {
        unsigned d = s[i];
        if (d < lo || d > hi)
            break;
        lo = 0x80;
        hi = 0xBF;
        i++;
    }
    return i;
}

int tk_utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tk_utf8_lossy(tk_buf *out, const unsigned char *s, size_t n)
{
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        int l = s[i] < 0x80 ? 1 : tk_utf8_next(s + i, n - i, &cp);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if (!tk_buf_put(out, s + run, i - run) || !tk_buf_put(out, "\xEF\xBF\xBD", 3))
            return false;
        i += tk_utf8_invalid_len(s + i, n - i);
        run = i;
    }
    return tk_buf_put(out, s + run, n - run);
}

/* ---- GPT-2 byte map ---------------------------------------------------------- */

uint32_t tk_byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    if (b <= 32)
        return 256 + b;
    if (b >= 127 && b <= 160)
        return 256 + 33 + (b - 127);
    return 256 + 67; /* 173 */
}

int tk_cp_to_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(cp - 289 + 127);
    if (cp == 323)
        return 173;
    return -1;
}

/* ---- normalizers ------------------------------------------------------------- */

bool tk_replace_all(tk_buf *out, const char *s, size_t n, const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), i = 0, run = 0;
    if (!la)
        return tk_buf_put(out, s, n);
    while (i + la <= n) {
        if (!memcmp(s + i, a, la)) {
            if (!tk_buf_put(out, s + run, i - run) || !tk_buf_put(out, b, lb))
                return false;
            i += la;
            run = i;
        } else {
            i++;
        }
    }
    return tk_buf_put(out, s + run, n - run);
}

llmem_status tk_normalize(const llmem_tokenizer *tok, const char *s, size_t n, tk_buf *out)
{
    tk_buf a = {0}, b = {0};
    out->n = 0;
    if (!tk_buf_put(&a, s, n))
        goto fail;
    for (int k = 0; k < tok->n_norm; k++) {
        const tk_norm *nm = &tok->norm[k];
        b.n = 0;
        if (!tk_buf_put(&b, "", 0))
            goto fail;
        switch (nm->kind) {
        case TK_NORM_PREPEND:
            if (a.n && (!tk_buf_put(&b, nm->a, strlen(nm->a)) || !tk_buf_put(&b, a.p, a.n)))
                goto fail;
            break;
        case TK_NORM_REPLACE:
            if (!tk_replace_all(&b, a.p, a.n, nm->a, nm->b))
                goto fail;
            break;
        default: {
            if (!a.n)
                break;
            int opt = UTF8PROC_STABLE;
            if (nm->kind == TK_NORM_NFC || nm->kind == TK_NORM_NFKC)
                opt |= UTF8PROC_COMPOSE;
            else
                opt |= UTF8PROC_DECOMPOSE;
            if (nm->kind == TK_NORM_NFKC || nm->kind == TK_NORM_NFKD)
                opt |= UTF8PROC_COMPAT;
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)a.p, (utf8proc_ssize_t)a.n,
                                              &dst, (utf8proc_option_t)opt);
            if (r < 0) {
                free(dst);
                /* input was sanitized to valid UTF-8; keep it as is */
                if (!tk_buf_put(&b, a.p, a.n))
                    goto fail;
                break;
            }
            bool ok = tk_buf_put(&b, dst, (size_t)r);
            free(dst);
            if (!ok)
                goto fail;
            break;
        }
        }
        tk_buf t = a;
        a = b;
        b = t;
    }
    free(b.p);
    free(out->p);
    *out = a;
    return LLMEM_OK;
fail:
    free(a.p);
    free(b.p);
    return LLMEM_E_NO_MEMORY;
}

/* ---- tokenizer.json and tokenizer_config.json text ---------------------------- */

/* Offset of the first byte of s[0, n) that is not well-formed UTF-8, or n.
 * tokenizer.json is UTF-8 (serde_json and json.loads refuse anything else),
 * and decode promises UTF-8 out, so a file with stray bytes is damaged. */
size_t tk_utf8_bad_at(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = (unsigned char)s[i] < 0x80 ? 1 : tk_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (l <= 0)
            return i;
        i += (size_t)l;
    }
    return n;
}

bool tk_utf8_one_char(const char *s)
{
    uint32_t cp;
    size_t n = strlen(s);
    return n && tk_utf8_next((const unsigned char *)s, n, &cp) == (int)n;
}

/* Parses a JSON object file text of n bytes (tokenizer_internal.h). */
llmem_status tk_parse_object(const char *path, const char *txt, size_t n, cJSON **out, char *err,
                             size_t err_len)
{
    *out = NULL;
    size_t at = tk_utf8_bad_at(txt, n);
    if (at < n) {
        tk_set_err(err, err_len, "%s: not UTF-8 (byte %zu)", path, at);
        return LLMEM_E_CORRUPT;
    }
    cJSON *root = NULL;
    hf_json_where w;
    hf_json_fault jf = hf_json_read(txt, n, &root, &w);
    if (jf != HF_JSON_OK) {
        char why[128];
        /* \u0000: cJSON would end the string there (a vocabulary entry
         * "a\u0000" would read as "a", which Hugging Face tokenizers keeps
         * apart); a name twice: tokenizers (serde) keeps the last vocab
         * entry and refuses some fields given twice, cJSON keeps the first */
        tk_set_err(err, err_len, "%s: %s%s", path, hf_json_describe(jf, &w, why, sizeof why),
                   jf == HF_JSON_NUL   ? "; llmem cannot hold NUL characters in tokenizer files"
                   : jf == HF_JSON_DUP ? "; readers disagree on which one counts"
                                       : "");
        return jf == HF_JSON_NO_MEMORY ? LLMEM_E_NO_MEMORY : LLMEM_E_CORRUPT;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        tk_set_err(err, err_len, "%s: not a JSON object", path);
        return LLMEM_E_CORRUPT;
    }
    *out = root;
    return LLMEM_OK;
}

/* The public accessors of a loaded tokenizer (include/llmem/tokenizer.h). */
int32_t llmem_tokenizer_n_vocab(const llmem_tokenizer *tok) { return tok ? tok->n_vocab : 0; }
int32_t llmem_tokenizer_bos(const llmem_tokenizer *tok) { return tok ? tok->bos : -1; }
int32_t llmem_tokenizer_eos(const llmem_tokenizer *tok) { return tok ? tok->eos : -1; }

const char *llmem_tokenizer_piece(const llmem_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_vocab ? tok->piece[id] : NULL;
}

int32_t llmem_tokenizer_token_id(const llmem_tokenizer *tok, const char *piece)
{
    return tok && piece ? tk_map_get(&tok->all, piece, strlen(piece)) : -1;
}

bool llmem_tokenizer_is_special(const llmem_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_vocab && (tok->flags[id] & TK_F_SPECIAL);
}

bool llmem_tokenizer_is_eog(const llmem_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_vocab && (tok->flags[id] & TK_F_EOG);
}

const char *llmem_tokenizer_chat_template(const llmem_tokenizer *tok) { return tok ? tok->chat_template : NULL; }
const char *llmem_tokenizer_bos_str(const llmem_tokenizer *tok) { return tok ? tok->bos_str : NULL; }
const char *llmem_tokenizer_eos_str(const llmem_tokenizer *tok) { return tok ? tok->eos_str : NULL; }

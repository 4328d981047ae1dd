/* llmem serve: text in and out (see serve_text.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/serve_text.h"
#include "llmem/chat_template.h"
#include "llmem/tokenizer.h"

struct srv_text {
    int32_t n_vocab;
    llmem_tokenizer *tok;       /* NULL: byte-level ids */
    llmem_chat_template *tmpl;  /* NULL: none, or it failed (tmpl_err) */
    char tmpl_err[400];
};

struct srv_detok {
    const srv_text *t;
    llmem_detok *d;        /* tokenizer models */
    unsigned char held[4]; /* bytes of an incomplete character (byte models) */
    int n_held;
};

static void set_err(char *err, size_t err_len, const char *msg)
{
    if (err && err_len)
        snprintf(err, err_len, "%s", msg);
}

llmem_status srv_text_open(const char *model_dir, int32_t n_vocab, srv_text **out, char *err,
                           size_t err_len)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        srv_text *t = calloc(1, sizeof *t);
        if (!t) {
            set_err(err, err_len, "out of memory");
            return LLMEM_E_NO_MEMORY;
        }
        t->n_vocab = n_vocab;
        llmem_status st = llmem_tokenizer_load(model_dir, &t->tok, err, err_len);
        if (st != LLMEM_OK) {
            free(t);
            return st;
        }
        if (llmem_tokenizer_n_vocab(t->tok) > n_vocab) {
            snprintf(err, err_len, "%s has %d ids, more than the model's %d", path,
                     llmem_tokenizer_n_vocab(t->tok), n_vocab);
            llmem_tokenizer_destroy(t->tok);
            free(t);
            return LLMEM_E_INVALID;
        }
        const char *src = llmem_tokenizer_chat_template(t->tok);
        char terr[300] = "";
        if (src && llmem_chat_template_create(src, &t->tmpl, terr, sizeof terr) != LLMEM_OK)
            snprintf(t->tmpl_err, sizeof t->tmpl_err,
                     "the model's chat template cannot be used: %s", terr);
        *out = t;
        return LLMEM_OK;
    }
    if (n_vocab != 256) {
        snprintf(err, err_len, "the model has %d ids and no tokenizer.json: text needs a "
                               "tokenizer (byte-level ids need exactly 256)", n_vocab);
        return LLMEM_E_UNSUPPORTED;
    }
    srv_text *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, err_len, "out of memory");
        return LLMEM_E_NO_MEMORY;
    }
    t->n_vocab = n_vocab;
    *out = t;
    return LLMEM_OK;
}

void srv_text_close(srv_text *t)
{
    if (!t)
        return;
    llmem_chat_template_destroy(t->tmpl);
    llmem_tokenizer_destroy(t->tok);
    free(t);
}

const char *srv_text_kind(const srv_text *t)
{
    return t->tok ? "tokenizer.json" : "bytes";
}

llmem_status srv_text_encode(const srv_text *t, const char *text, size_t len, bool add_special,
                             int32_t **ids, int32_t *n, char *err, size_t err_len)
{
    *ids = NULL;
    *n = 0;
    if (t->tok)
        return llmem_tokenizer_encode(t->tok, text, len, add_special, true, ids, n, err,
                                      err_len);
    if (len > INT32_MAX - 1) {
        set_err(err, err_len, "prompt too long");
        return LLMEM_E_INVALID;
    }
    int32_t *v = malloc((len ? len : 1) * sizeof *v);
    if (!v) {
        set_err(err, err_len, "out of memory");
        return LLMEM_E_NO_MEMORY;
    }
    for (size_t i = 0; i < len; i++)
        v[i] = (unsigned char)text[i];
    *ids = v;
    *n = (int32_t)len;
    return LLMEM_OK;
}

bool srv_buf_reserve(char **buf, size_t *cap, size_t need, size_t first)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : first;
    while (c < need)
        c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb)
        return false;
    *buf = nb;
    *cap = c;
    return true;
}

/* Appends n bytes to a growable buffer. */
static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (!srv_buf_reserve(buf, cap, *len + n + 1, 64))
        return false;
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* llmem's default chat template (docs/serve.md), for models without one. */
static llmem_status default_chat(const srv_msg *msgs, size_t n_msgs, char **out, size_t *out_len)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < n_msgs; i++) {
        for (const char *r = msgs[i].role; ok && *r; r++) {
            char c = (char)toupper((unsigned char)*r);
            ok = append(&buf, &len, &cap, &c, 1);
        }
        const char *c = msgs[i].content ? msgs[i].content : "";
        ok = ok && append(&buf, &len, &cap, ":\n", 2) && append(&buf, &len, &cap, c, strlen(c)) &&
             append(&buf, &len, &cap, "\n\n", 2);
    }
    ok = ok && append(&buf, &len, &cap, "ASSISTANT:\n", 11);
    if (!ok) {
        free(buf);
        return LLMEM_E_NO_MEMORY;
    }
    *out = buf;
    *out_len = len;
    return LLMEM_OK;
}

llmem_status srv_text_chat(const srv_text *t, const srv_msg *msgs, size_t n_msgs, int32_t **ids,
                           int32_t *n, char *err, size_t err_len)
{
    char *text = NULL;
    size_t len = 0;
    llmem_status st;
    *ids = NULL;
    *n = 0;
    if (t->tmpl_err[0]) {
        set_err(err, err_len, t->tmpl_err);
        return LLMEM_E_UNSUPPORTED;
    }
    if (t->tmpl) {
        llmem_chat_message *cm = calloc(n_msgs ? n_msgs : 1, sizeof *cm);
        if (!cm) {
            set_err(err, err_len, "out of memory");
            return LLMEM_E_NO_MEMORY;
        }
        for (size_t i = 0; i < n_msgs; i++)
            cm[i] = (llmem_chat_message){msgs[i].role, msgs[i].content};
        st = llmem_chat_template_render(t->tmpl, cm, n_msgs, true,
                                        llmem_tokenizer_bos_str(t->tok),
                                        llmem_tokenizer_eos_str(t->tok), &text, &len, err,
                                        err_len);
        free(cm);
    } else if ((st = default_chat(msgs, n_msgs, &text, &len)) != LLMEM_OK) {
        set_err(err, err_len, "out of memory");
    }
    if (st != LLMEM_OK)
        return st;
    /* a template writes BOS itself (apply_chat_template encodes without
     * special tokens); the default template does not */
    st = srv_text_encode(t, text, len, !t->tmpl, ids, n, err, err_len);
    free(text);
    return st;
}

bool srv_text_is_eog(const srv_text *t, int32_t id)
{
    return t->tok && llmem_tokenizer_is_eog(t->tok, id);
}

llmem_status srv_detok_create(const srv_text *t, srv_detok **out)
{
    srv_detok *d = calloc(1, sizeof *d);
    if (!d)
        return LLMEM_E_NO_MEMORY;
    d->t = t;
    if (t->tok && llmem_detok_create(t->tok, false, &d->d) != LLMEM_OK) {
        free(d);
        return LLMEM_E_NO_MEMORY;
    }
    *out = d;
    return LLMEM_OK;
}

void srv_detok_destroy(srv_detok *d)
{
    if (d)
        llmem_detok_destroy(d->d);
    free(d);
}

/* Pushes id (flush when id < 0) through the tokenizer's detokenizer,
 * growing the buffer when it asks for more room. */
static llmem_status tok_push(srv_detok *d, int32_t id, char **buf, size_t *len, size_t *cap)
{
    size_t room = 256;
    for (;;) {
        if (!srv_buf_reserve(buf, cap, *len + room + 1, 256))
            return LLMEM_E_NO_MEMORY;
        size_t n = 0, avail = *cap - *len - 1;
        llmem_status st = id >= 0 ? llmem_detok_push(d->d, id, *buf + *len, avail, &n)
                                  : llmem_detok_flush(d->d, *buf + *len, avail, &n);
        if (st == LLMEM_E_NO_SPACE && n > avail) {
            room = n;
            continue;
        }
        if (st != LLMEM_OK)
            return st;
        *len += n;
        (*buf)[*len] = '\0';
        return LLMEM_OK;
    }
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Bytes of the character that lead byte c starts (0: c cannot start one). */
static int utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
         : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* Whether b may follow s[0..k) (k >= 1) in a valid character: Unicode 15,
 * table 3-7 (no overlongs, no surrogates, nothing past U+10FFFF). */
static bool utf8_cont_ok(const unsigned char *s, int k, unsigned char b)
{
    if (k == 1) {
        switch (s[0]) {
        case 0xE0: return b >= 0xA0 && b <= 0xBF;
        case 0xED: return b >= 0x80 && b <= 0x9F;
        case 0xF0: return b >= 0x90 && b <= 0xBF;
        case 0xF4: return b >= 0x80 && b <= 0x8F;
        default: break;
        }
    }
    return b >= 0x80 && b <= 0xBF;
}

size_t srv_utf8_valid_prefix(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        int need = utf8_len(s[i]);
        if (need == 0 || i + (size_t)need > n)
            return i;
        for (int k = 1; k < need; k++)
            if (!utf8_cont_ok(s + i, k, s[i + (size_t)k]))
                return i;
        i += (size_t)need;
    }
    return i;
}

/* Emits every complete character of d->held; an invalid maximal subpart
 * becomes one U+FFFD (as Python's decode(errors="replace")). */
static bool drain(srv_detok *d, char **buf, size_t *len, size_t *cap)
{
    while (d->n_held > 0) {
        int need = utf8_len(d->held[0]), k = 1;
        while (need > 0 && k < d->n_held && k < need && utf8_cont_ok(d->held, k, d->held[k]))
            k++;
        int take;
        if (need == 0 || (k < need && k < d->n_held)) {
            take = need == 0 ? 1 : k; /* invalid: replace the maximal subpart */
            if (!append(buf, len, cap, REPLACEMENT, 3))
                return false;
        } else if (k == need) {
            take = need;
            if (!append(buf, len, cap, (const char *)d->held, (size_t)need))
                return false;
        } else {
            break; /* a valid but incomplete character: hold it */
        }
        memmove(d->held, d->held + take, (size_t)(d->n_held - take));
        d->n_held -= take;
    }
    return true;
}

llmem_status srv_detok_push(srv_detok *d, int32_t id, char **buf, size_t *len, size_t *cap)
{
    if (id < 0 || id >= d->t->n_vocab)
        return LLMEM_E_INVALID;
    if (d->d)
        return tok_push(d, id, buf, len, cap);
    d->held[d->n_held++] = (unsigned char)id;
    return drain(d, buf, len, cap) ? LLMEM_OK : LLMEM_E_NO_MEMORY;
}

llmem_status srv_detok_flush(srv_detok *d, char **buf, size_t *len, size_t *cap)
{
    if (d->d) {
        llmem_status st = tok_push(d, -1, buf, len, cap);
        if (st != LLMEM_OK || *buf)
            return st;
    }
    bool ok = true;
    if (d->n_held > 0)
        ok = append(buf, len, cap, REPLACEMENT, 3);
    d->n_held = 0;
    if (*buf == NULL)
        ok = ok && append(buf, len, cap, "", 0);
    return ok ? LLMEM_OK : LLMEM_E_NO_MEMORY;
}

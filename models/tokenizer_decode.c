/* llmem: decoding -- the decoder chain of tokenizer.json and the streaming
 * detokenizer.
 *
 * Reference: huggingface/tokenizers decoders (byte_level.rs, byte_fallback.rs,
 * fuse.rs, strip.rs, metaspace.rs, sequence.rs, normalizers/replace.rs).
 * Each decoder maps a list of strings to a list of strings; the result is
 * their concatenation. Without a decoder, tokens are joined with " ". */
#include <stdlib.h>
#include <string.h>

#include "models/tokenizer_internal.h"

typedef struct slist {
    tk_buf *s;
    size_t n, cap;
} slist;

static void slist_free(slist *l)
{
    for (size_t i = 0; i < l->cap; i++)
        free(l->s[i].p);
    free(l->s);
    memset(l, 0, sizeof *l);
}

static tk_buf *slist_add(slist *l)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        tk_buf *p = realloc(l->s, cap * sizeof *p);
        if (!p)
            return NULL;
        memset(p + l->cap, 0, (cap - l->cap) * sizeof *p);
        l->s = p;
        l->cap = cap;
    }
    tk_buf *b = &l->s[l->n++];
    b->n = 0;
    if (!tk_buf_put(b, "", 0))
        return NULL;
    return b;
}

static void slist_clear(slist *l) { l->n = 0; }

/* A token's bytes under the GPT-2 map, or its own bytes when one of its
 * characters is not in the map (tokenizers' ByteLevel::decode_chain). */
static bool bytelevel_bytes(const char *s, size_t n, tk_buf *out)
{
    size_t mark = out->n;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tk_utf8_next((const unsigned char *)s + i, n - i, &cp);
        int b = l > 0 ? tk_cp_to_byte(cp) : -1;
        if (b < 0) {
            out->n = mark;
            return tk_buf_put(out, s, n);
        }
        if (!tk_buf_putc(out, (char)b))
            return false;
        i += (size_t)l;
    }
    return true;
}

static int fallback_byte(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static bool run_decoder(const tk_dec *d, slist *in, slist *out)
{
    slist_clear(out);
    switch (d->kind) {
    case TK_DEC_BYTELEVEL: {
        tk_buf raw = {0};
        bool ok = true;
        for (size_t i = 0; ok && i < in->n; i++)
            ok = bytelevel_bytes(in->s[i].p, in->s[i].n, &raw);
        tk_buf *o = ok ? slist_add(out) : NULL;
        ok = o && tk_utf8_lossy(o, (const unsigned char *)(raw.p ? raw.p : ""), raw.n);
        free(raw.p);
        return ok;
    }
    case TK_DEC_BYTEFALLBACK: {
        tk_buf bytes = {0};
        bool ok = true;
        for (size_t i = 0; ok && i <= in->n; i++) {
            int b = i < in->n ? fallback_byte(in->s[i].p, in->s[i].n) : -1;
            if (b >= 0) {
                ok = tk_buf_putc(&bytes, (char)b);
                continue;
            }
            if (bytes.n) {
                tk_buf chk = {0};
                ok = tk_utf8_lossy(&chk, (const unsigned char *)bytes.p, bytes.n);
                bool valid = ok && chk.n == bytes.n && !memcmp(chk.p, bytes.p, bytes.n);
                free(chk.p);
                tk_buf *o = ok ? slist_add(out) : NULL;
                ok = o != NULL;
                if (ok && valid)
                    ok = tk_buf_put(o, bytes.p, bytes.n);
                for (size_t k = 0; ok && !valid && k < bytes.n; k++)
                    ok = tk_buf_put(o, "\xEF\xBF\xBD", 3);
                bytes.n = 0;
            }
            if (ok && i < in->n) {
                tk_buf *o = slist_add(out);
                ok = o && tk_buf_put(o, in->s[i].p, in->s[i].n);
            }
        }
        free(bytes.p);
        return ok;
    }
    case TK_DEC_FUSE: {
        tk_buf *o = slist_add(out);
        for (size_t i = 0; o && i < in->n; i++)
            if (!tk_buf_put(o, in->s[i].p, in->s[i].n))
                return false;
        return o != NULL;
    }
    case TK_DEC_REPLACE:
    case TK_DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            tk_buf *o = slist_add(out);
            if (!o)
                return false;
            if (d->kind == TK_DEC_REPLACE) {
                if (!tk_replace_all(o, in->s[i].p, in->s[i].n, d->a, d->b))
                    return false;
                continue;
            }
            /* tokenizers' Metaspace::decode_chain: in the first string every
             * replacement character goes (the space the encoder prepended,
             * and any other), elsewhere each becomes a space */
            if (!tk_replace_all(o, in->s[i].p, in->s[i].n, d->a,
                                i == 0 && d->prepend != 0 ? "" : " "))
                return false;
        }
        return true;
    case TK_DEC_STRIP: {
        size_t cl = strlen(d->a);
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->s[i].p;
            size_t a = 0, b = in->s[i].n;
            for (int k = 0; k < d->start && cl && b - a >= cl && !memcmp(s + a, d->a, cl); k++)
                a += cl;
            for (int k = 0; k < d->stop && cl && b - a >= cl && !memcmp(s + b - cl, d->a, cl); k++)
                b -= cl;
            tk_buf *o = slist_add(out);
            if (!o || !tk_buf_put(o, s + a, b - a))
                return false;
        }
        return true;
    }
    }
    return false;
}

static const char *id_piece(const llmem_tokenizer *tok, int32_t id, size_t *n)
{
    *n = tok->piece_len[id];
    return tok->piece[id];
}

llmem_status llmem_tokenizer_decode(const llmem_tokenizer *tok, const int32_t *ids, int32_t n_ids,
                                    bool keep_special, char **text, size_t *len, char *err,
                                    size_t err_len)
{
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!tok || !text || !len || (!ids && n_ids > 0) || n_ids < 0) {
        tk_set_err(err, err_len, "tokenizer_decode: NULL argument or negative count");
        return LLMEM_E_INVALID;
    }
    for (int32_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab || !tok->piece[ids[i]]) {
            tk_set_err(err, err_len, "tokenizer_decode: id %d at position %d is not in the vocabulary (%d ids)",
                       ids[i], i, tok->n_vocab);
            return LLMEM_E_INVALID;
        }
    }
    slist a = {0}, b = {0};
    tk_buf res = {0};
    llmem_status st = LLMEM_E_NO_MEMORY;
    for (int32_t i = 0; i < n_ids; i++) {
        if (!keep_special && (tok->flags[ids[i]] & TK_F_SPECIAL))
            continue;
        size_t n;
        const char *p = id_piece(tok, ids[i], &n);
        tk_buf *o = slist_add(&a);
        if (!o || !tk_buf_put(o, p, n))
            goto fail;
    }
    slist *in = &a, *out = &b;
    for (int k = 0; k < tok->n_dec; k++) {
        if (!run_decoder(&tok->dec[k], in, out))
            goto fail;
        slist *t = in;
        in = out;
        out = t;
    }
    if (!tk_buf_put(&res, "", 0))
        goto fail;
    for (size_t i = 0; i < in->n; i++) {
        if (!tok->has_decoder && i && !tk_buf_putc(&res, ' '))
            goto fail;
        if (!tk_buf_put(&res, in->s[i].p, in->s[i].n))
            goto fail;
    }
    *text = res.p;
    *len = res.n;
    res.p = NULL;
    st = LLMEM_OK;
fail:
    if (st)
        tk_set_err(err, err_len, "tokenizer_decode: out of memory");
    free(res.p);
    slist_free(&a);
    slist_free(&b);
    return st;
}

/* ---- streaming ------------------------------------------------------------------- */

/* The stream runs the decoder chain token by token. ByteFallback is the one
 * stage that joins tokens: decode turns a run of byte tokens (<0x..>) into
 * one string before the later stages see it, so a later Replace or
 * Metaspace can match a character spelled by several byte tokens ("\xE2\x96
 * \x81" is "▁"). The stream keeps such a run in `group` and hands it to the
 * later stages when it ends, or as soon as it holds whole characters when
 * every later stage works character by character (`group_local`). */
struct llmem_detok {
    const llmem_tokenizer *tok;
    bool keep_special;
    tk_buf held;     /* bytes of an incomplete character */
    size_t n_tokens; /* tokens seen (after skipping specials) */
    size_t n_items;  /* strings after the ByteFallback stage (a byte run is one) */
    int strip_left;  /* leading spaces a Strip decoder still removes */
    int fb;            /* index of the ByteFallback stage, -1 when none */
    bool group_local;  /* the stages after fb act on each character alone */
    tk_buf group;      /* bytes of the byte-token run not yet passed on */
    bool group_open;   /* a run is in progress (its item is counted) */
};

static int strip_start(const llmem_tokenizer *tok)
{
    for (int k = 0; k < tok->n_dec; k++)
        if (tok->dec[k].kind == TK_DEC_STRIP && !strcmp(tok->dec[k].a, " "))
            return tok->dec[k].start;
    return 0;
}

/* Whether s is exactly one UTF-8 character. */
static bool one_char(const char *s)
{
    uint32_t cp;
    size_t n = strlen(s);
    return n && tk_utf8_next((const unsigned char *)s, n, &cp) == (int)n;
}

llmem_status llmem_detok_create(const llmem_tokenizer *tok, bool keep_special, llmem_detok **out)
{
    if (out)
        *out = NULL;
    if (!tok || !out)
        return LLMEM_E_INVALID;
    llmem_detok *d = calloc(1, sizeof *d);
    if (!d)
        return LLMEM_E_NO_MEMORY;
    d->tok = tok;
    d->keep_special = keep_special;
    d->strip_left = strip_start(tok);
    d->fb = -1;
    for (int k = 0; k < tok->n_dec && d->fb < 0; k++)
        if (tok->dec[k].kind == TK_DEC_BYTEFALLBACK)
            d->fb = k;
    d->group_local = true;
    for (int k = d->fb + 1; d->fb >= 0 && k < tok->n_dec; k++) {
        const tk_dec *dc = &tok->dec[k];
        if (dc->kind == TK_DEC_REPLACE || dc->kind == TK_DEC_METASPACE)
            d->group_local &= one_char(dc->a);
        else if (dc->kind != TK_DEC_FUSE && dc->kind != TK_DEC_STRIP)
            d->group_local = false;
    }
    *out = d;
    return LLMEM_OK;
}

void llmem_detok_destroy(llmem_detok *d)
{
    if (!d)
        return;
    free(d->held.p);
    free(d->group.p);
    free(d);
}

/* Whether the string stage k of d's chain gets is the first of its list
 * (Metaspace drops every replacement character of that one): after a
 * ByteLevel or Fuse stage all is one string; after ByteFallback a string is
 * a byte-token run or a token (d->n_items counts them, the current one
 * included); before, a token (d->n_tokens counts those before it). */
static bool first_at(const llmem_detok *d, int k)
{
    for (int j = 0; j < k; j++)
        if (d->tok->dec[j].kind == TK_DEC_BYTELEVEL || d->tok->dec[j].kind == TK_DEC_FUSE)
            return true;
    return d->fb >= 0 && k > d->fb ? d->n_items == 1 : d->n_tokens == 0;
}

/* Runs decoder stages [from, to) of d's chain on one string t (replaced by
 * the result). A ByteFallback stage in the range maps a byte token to its
 * byte. */
static bool run_stages(const llmem_detok *d, int from, int to, tk_buf *t)
{
    bool ok = true;
    for (int k = from; ok && k < to; k++) {
        const tk_dec *dc = &d->tok->dec[k];
        tk_buf u = {0};
        switch (dc->kind) {
        case TK_DEC_BYTELEVEL:
            ok = tk_buf_put(&u, "", 0) && bytelevel_bytes(t->p, t->n, &u);
            break;
        case TK_DEC_BYTEFALLBACK: {
            int b = fallback_byte(t->p, t->n);
            ok = b >= 0 ? tk_buf_putc(&u, (char)b) : tk_buf_put(&u, t->p, t->n);
            break;
        }
        case TK_DEC_REPLACE:
            ok = tk_buf_put(&u, "", 0) && tk_replace_all(&u, t->p, t->n, dc->a, dc->b);
            break;
        case TK_DEC_METASPACE: /* as run_decoder */
            ok = tk_buf_put(&u, "", 0) &&
                 tk_replace_all(&u, t->p, t->n, dc->a, dc->prepend != 0 && first_at(d, k) ? "" : " ");
            break;
        default: /* Fuse, Strip: handled by the stream */
            ok = tk_buf_put(&u, t->p, t->n);
            break;
        }
        free(t->p);
        *t = u;
    }
    return ok;
}

/* Passes d->group[0, n) to the stages after ByteFallback (as decode does:
 * well-formed bytes as they are, else one U+FFFD per byte) and appends the
 * result to out. */
static bool pass_group(llmem_detok *d, size_t n, tk_buf *out)
{
    tk_buf t = {0}, chk = {0};
    bool ok = tk_utf8_lossy(&chk, (const unsigned char *)(d->group.p ? d->group.p : ""), n);
    bool valid = ok && chk.n == n && (!n || !memcmp(chk.p, d->group.p, n));
    free(chk.p);
    ok = ok && tk_buf_put(&t, "", 0);
    if (ok && valid)
        ok = tk_buf_put(&t, d->group.p ? d->group.p : "", n);
    for (size_t k = 0; ok && !valid && k < n; k++)
        ok = tk_buf_put(&t, "\xEF\xBF\xBD", 3);
    ok = ok && run_stages(d, d->fb + 1, d->tok->n_dec, &t) &&
         tk_buf_put(out, t.p ? t.p : "", t.n);
    free(t.p);
    if (ok) {
        memmove(d->group.p, d->group.p + n, d->group.n - n);
        d->group.n -= n;
    }
    return ok;
}

/* Ends the byte-token run, if any. */
static bool end_group(llmem_detok *d, tk_buf *out)
{
    if (!d->group_open)
        return true;
    if (!pass_group(d, d->group.n, out))
        return false;
    d->group_open = false;
    return true;
}

/* Length of the longest prefix of s[0, n) made of whole characters, or 0
 * when s holds a byte that can never be part of one (then decode's run is
 * ill-formed and the stream need not match it). */
static size_t whole_chars(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = tk_utf8_next(s + i, n - i, &cp);
        if (l <= 0)
            break;
        i += (size_t)l;
    }
    return i;
}

/* Feeds one token's string through the chain, appending what it completes
 * to out. */
static bool token_bytes(llmem_detok *d, int32_t id, tk_buf *out)
{
    const llmem_tokenizer *tok = d->tok;
    size_t n;
    const char *p = id_piece(tok, id, &n);
    tk_buf t = {0};
    int to = d->fb >= 0 ? d->fb : tok->n_dec;
    bool ok = tk_buf_put(&t, p, n) && run_stages(d, 0, to, &t);
    int b = ok && d->fb >= 0 ? fallback_byte(t.p, t.n) : -1;
    if (ok && b >= 0) { /* a byte token joins the run */
        if (!d->group_open) {
            d->group_open = true;
            d->n_items++;
        }
        ok = tk_buf_putc(&d->group, (char)b);
        size_t whole = ok ? whole_chars((const unsigned char *)d->group.p, d->group.n) : 0;
        if (ok && d->group_local && whole)
            ok = pass_group(d, whole, out);
    } else if (ok) {
        ok = end_group(d, out);
        if (ok && d->fb >= 0) {
            d->n_items++;
            ok = run_stages(d, d->fb + 1, tok->n_dec, &t);
        }
        ok = ok && tk_buf_put(out, t.p ? t.p : "", t.n);
    }
    free(t.p);
    return ok;
}

/* Moves the complete part of d->held to out; keeps a trailing incomplete
 * character unless `final`. */
static bool assemble(llmem_detok *d, tk_buf *out, bool final)
{
    const unsigned char *s = (const unsigned char *)d->held.p;
    size_t n = d->held.n, i = 0, keep = n;
    while (i < n) {
        uint32_t cp;
        int l = tk_utf8_next(s + i, n - i, &cp);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        size_t bad = tk_utf8_invalid_len(s + i, n - i);
        if (!final && i + bad == n) { /* may still complete */
            keep = i;
            break;
        }
        i += bad;
    }
    if (!tk_utf8_lossy(out, s, keep))
        return false;
    memmove(d->held.p, d->held.p + keep, n - keep);
    d->held.n = n - keep;
    return true;
}

static llmem_status emit(llmem_detok *d, tk_buf *text, char *out, size_t cap, size_t *n_out)
{
    size_t a = 0;
    while (d->strip_left > 0 && a < text->n && text->p[a] == ' ') {
        a++;
        d->strip_left--;
    }
    if (a < text->n)
        d->strip_left = 0;
    size_t n = text->n - a;
    *n_out = n;
    if (n > cap)
        return LLMEM_E_NO_SPACE;
    if (n)
        memcpy(out, text->p + a, n);
    return LLMEM_OK;
}

/* A copy of d whose buffers are its own (push and flush work on one, so
 * that a call that fails changes nothing). False when out of memory. */
static bool detok_copy(const llmem_detok *d, llmem_detok *c)
{
    *c = *d;
    c->held = (tk_buf){0};
    c->group = (tk_buf){0};
    if (tk_buf_put(&c->held, d->held.p ? d->held.p : "", d->held.n) &&
        tk_buf_put(&c->group, d->group.p ? d->group.p : "", d->group.n))
        return true;
    free(c->held.p);
    free(c->group.p);
    return false;
}

/* Makes c the state of d (freeing d's buffers), or drops c. */
static void detok_settle(llmem_detok *d, llmem_detok *c, bool keep)
{
    llmem_detok *gone = keep ? d : c;
    free(gone->held.p);
    free(gone->group.p);
    if (keep)
        *d = *c;
}

llmem_status llmem_detok_push(llmem_detok *d, int32_t id, char *out, size_t cap, size_t *n_out)
{
    if (n_out)
        *n_out = 0;
    if (!d || !n_out || (!out && cap) || id < 0 || id >= d->tok->n_vocab || !d->tok->piece[id])
        return LLMEM_E_INVALID;
    if (!d->keep_special && (d->tok->flags[id] & TK_F_SPECIAL))
        return LLMEM_OK;
    llmem_detok save;
    tk_buf text = {0};
    if (!detok_copy(d, &save))
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_E_NO_MEMORY;
    /* without a decoder, tokens are joined with spaces */
    if ((!d->tok->has_decoder && d->n_tokens && !tk_buf_putc(&save.held, ' ')) ||
        !token_bytes(&save, id, &save.held))
        goto done;
    if (!tk_buf_put(&text, "", 0) || !assemble(&save, &text, false))
        goto done;
    save.n_tokens++;
    st = emit(&save, &text, out, cap, n_out);
done:
    detok_settle(d, &save, st == LLMEM_OK);
    free(text.p);
    return st;
}

llmem_status llmem_detok_flush(llmem_detok *d, char *out, size_t cap, size_t *n_out)
{
    if (n_out)
        *n_out = 0;
    if (!d || !n_out || (!out && cap))
        return LLMEM_E_INVALID;
    llmem_detok save;
    tk_buf text = {0};
    if (!detok_copy(d, &save))
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_E_NO_MEMORY;
    if (!end_group(&save, &save.held) || !tk_buf_put(&text, "", 0) ||
        !assemble(&save, &text, true))
        goto done;
    st = emit(&save, &text, out, cap, n_out);
    if (st == LLMEM_OK) { /* a new stream */
        save.held.n = save.group.n = 0;
        save.n_tokens = save.n_items = 0;
        save.group_open = false;
        save.strip_left = strip_start(d->tok);
    }
done:
    detok_settle(d, &save, st == LLMEM_OK);
    free(text.p);
    return st;
}

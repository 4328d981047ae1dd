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

/* Appends a string holding s[0, n) to l. */
static bool list_add(void *l, const char *s, size_t n)
{
    tk_buf *o = slist_add(l);
    return o && tk_buf_put(o, s, n);
}

/* The strings tokenizers' ByteFallback makes of a run of n byte tokens'
 * bytes: the run as one string when it is UTF-8, else one U+FFFD string
 * per byte (nothing for an empty run), each handed to put. */
static bool run_strings(const char *bytes, size_t n, bool (*put)(void *, const char *, size_t),
                        void *ctx)
{
    if (n && tk_utf8_bad_at(bytes, n) == n)
        return put(ctx, bytes, n);
    for (size_t k = 0; k < n; k++)
        if (!put(ctx, "\xEF\xBF\xBD", 3))
            return false;
    return true;
}

/* tokenizers' Strip on s[0, n): up to d->start copies of the content at
 * the front, then up to d->stop at the back of what is left; the kept part
 * is s[*a, *b). */
static void strip_span(const tk_dec *d, const char *s, size_t n, size_t *a, size_t *b)
{
    size_t cl = strlen(d->a);
    *a = 0;
    *b = n;
    for (int k = 0; k < d->start && cl && *b - *a >= cl && !memcmp(s + *a, d->a, cl); k++)
        *a += cl;
    for (int k = 0; k < d->stop && cl && *b - *a >= cl && !memcmp(s + *b - cl, d->a, cl); k++)
        *b -= cl;
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
            ok = run_strings(bytes.p, bytes.n, list_add, out);
            bytes.n = 0;
            if (ok && i < in->n)
                ok = list_add(out, in->s[i].p, in->s[i].n);
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
    case TK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            size_t a, b;
            strip_span(d, in->s[i].p, in->s[i].n, &a, &b);
            if (!list_add(out, in->s[i].p + a, b - a))
                return false;
        }
        return true;
    }
    return false;
}

/* Runs decoder stages [from, n_dec) of tok on the strings in a (b is
 * scratch; both are left holding garbage) and appends their result to res
 * (NUL-terminated): concatenated, or joined with " " without a decoder. */
static bool run_chain(const llmem_tokenizer *tok, int from, slist *a, slist *b, tk_buf *res)
{
    slist *in = a, *out = b;
    for (int k = from; k < tok->n_dec; k++) {
        if (!run_decoder(&tok->dec[k], in, out))
            return false;
        slist *t = in;
        in = out;
        out = t;
    }
    if (!tk_buf_put(res, "", 0))
        return false;
    for (size_t i = 0; i < in->n; i++) {
        if (!tok->has_decoder && i && !tk_buf_putc(res, ' '))
            return false;
        if (!tk_buf_put(res, in->s[i].p, in->s[i].n))
            return false;
    }
    return true;
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
    if (!run_chain(tok, 0, &a, &b, &res))
        goto fail;
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

/* The stream runs decode's chain on a growing list of tokens and hands out
 * text once no later token can change it, so that what it hands out, joined,
 * is decode's text of the same ids. (tokenizers' DecodeStream stops with an
 * error where a later token rewrites earlier text; llmem holds such text
 * back instead.)
 *
 * Each decoder stage is a small transducer. Up to the first ByteLevel or
 * Fuse, decode has one string per token (after ByteFallback, one per run
 * of byte tokens, or one U+FFFD per byte of a run that is not UTF-8), and a
 * stage maps each finished string on: "list mode". ByteFallback holds a run
 * until the first token after it: a byte that ends the run ill-formed turns
 * its whole run into U+FFFDs. ByteLevel and Fuse join the strings into one,
 * which the stages after them see grow: "text mode". There ByteLevel holds
 * the bytes of an incomplete character, Replace the tail that may begin its
 * pattern, Strip the trailing copies of its content it may still remove;
 * Metaspace and Fuse hold nothing. A ByteLevel or ByteFallback in text mode
 * looks at the whole string at once (one character outside the byte map
 * keeps the whole string as it is; the string may be one byte token), so
 * from there on everything waits for flush ("hold all"). */
typedef struct ds_stage {
    bool text;      /* text mode */
    bool hold_all;  /* text-mode ByteLevel or ByteFallback */
    bool open;      /* list-mode ByteFallback: a run is in progress */
    size_t n_in;    /* list-mode Metaspace: strings taken (the first is special) */
    int strip_left; /* text-mode Strip: copies of the content it may still drop in front */
    tk_buf held;    /* run bytes, an incomplete character, a tail, or everything */
} ds_stage;

struct llmem_detok {
    const llmem_tokenizer *tok;
    bool keep_special;
    size_t n_out; /* strings out of the chain in list mode (joined with " " without a decoder) */
    ds_stage st[TK_MAX_STAGES];
};

static void detok_reset(llmem_detok *d)
{
    d->n_out = 0;
    for (int k = 0; k < d->tok->n_dec; k++) {
        ds_stage *g = &d->st[k];
        g->open = false;
        g->n_in = 0;
        g->held.n = 0;
        g->strip_left = d->tok->dec[k].kind == TK_DEC_STRIP ? d->tok->dec[k].start : 0;
    }
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
    bool text = false;
    for (int k = 0; k < tok->n_dec; k++) {
        enum tk_dec_kind kind = tok->dec[k].kind;
        d->st[k].text = text;
        d->st[k].hold_all = text && (kind == TK_DEC_BYTELEVEL || kind == TK_DEC_BYTEFALLBACK);
        text = text || kind == TK_DEC_BYTELEVEL || kind == TK_DEC_FUSE;
    }
    detok_reset(d);
    *out = d;
    return LLMEM_OK;
}

void llmem_detok_destroy(llmem_detok *d)
{
    if (!d)
        return;
    for (int k = 0; k < TK_MAX_STAGES; k++)
        free(d->st[k].held.p);
    free(d);
}

static bool list_in(llmem_detok *d, int k, const char *s, size_t n, tk_buf *out);
static bool text_in(llmem_detok *d, int k, const char *s, size_t n, tk_buf *out);

/* list_in of stage k + 1, as run_strings' put */
typedef struct ds_next {
    llmem_detok *d;
    int k;
    tk_buf *out;
} ds_next;

static bool next_in(void *ctx, const char *s, size_t n)
{
    ds_next *x = ctx;
    return list_in(x->d, x->k + 1, s, n, x->out);
}

/* Ends stage k's byte-token run, if any (list-mode ByteFallback). */
static bool end_run(llmem_detok *d, int k, tk_buf *out)
{
    ds_stage *g = &d->st[k];
    if (!g->open)
        return true;
    g->open = false;
    ds_next x = {d, k, out};
    bool ok = run_strings(g->held.p, g->held.n, next_in, &x);
    g->held.n = 0;
    return ok;
}

/* Passes the part of stage k's held bytes (list-mode ByteLevel) made of
 * whole characters on, as decode's lossy UTF-8 would read it; keeps a
 * trailing sequence that may still complete unless `final`. */
static bool pass_chars(llmem_detok *d, int k, bool final, tk_buf *out)
{
    tk_buf *h = &d->st[k].held;
    const unsigned char *s = (const unsigned char *)h->p;
    size_t n = h->n, i = 0, keep = n;
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
    tk_buf t = {0};
    bool ok = tk_buf_put(&t, "", 0) && tk_utf8_lossy(&t, s, keep) && text_in(d, k + 1, t.p, t.n, out);
    free(t.p);
    if (ok) {
        memmove(h->p, h->p + keep, n - keep);
        h->n = n - keep;
    }
    return ok;
}

/* Stage k (list mode) takes the finished string s[0, n). */
static bool list_in(llmem_detok *d, int k, const char *s, size_t n, tk_buf *out)
{
    const llmem_tokenizer *tok = d->tok;
    if (k == tok->n_dec) {
        if (!tok->has_decoder && d->n_out++ && !tk_buf_putc(out, ' '))
            return false;
        return tk_buf_put(out, s, n);
    }
    const tk_dec *dc = &tok->dec[k];
    ds_stage *g = &d->st[k];
    tk_buf u = {0};
    bool ok = tk_buf_put(&u, "", 0);
    switch (dc->kind) {
    case TK_DEC_BYTEFALLBACK: {
        int b = fallback_byte(s, n);
        if (b >= 0) {
            g->open = true;
            ok = ok && tk_buf_putc(&g->held, (char)b);
        } else {
            ok = ok && end_run(d, k, out) && list_in(d, k + 1, s, n, out);
        }
        break;
    }
    case TK_DEC_BYTELEVEL:
        ok = ok && bytelevel_bytes(s, n, &g->held) && pass_chars(d, k, false, out);
        break;
    case TK_DEC_FUSE:
        ok = ok && text_in(d, k + 1, s, n, out);
        break;
    case TK_DEC_REPLACE:
    case TK_DEC_METASPACE: { /* as run_decoder */
        const char *to = dc->kind == TK_DEC_REPLACE ? dc->b : g->n_in == 0 && dc->prepend ? "" : " ";
        g->n_in++;
        ok = ok && tk_replace_all(&u, s, n, dc->a, to) && list_in(d, k + 1, u.p, u.n, out);
        break;
    }
    case TK_DEC_STRIP: {
        size_t a, b;
        strip_span(dc, s, n, &a, &b);
        ok = ok && list_in(d, k + 1, s + a, b - a, out);
        break;
    }
    }
    free(u.p);
    return ok;
}

/* Text-mode Replace (a -> b): replaces in stage k's held text plus s[0, n)
 * and passes it on, but for a tail that may begin a (held). */
static bool replace_in(llmem_detok *d, int k, const char *s, size_t n, tk_buf *out)
{
    const tk_dec *dc = &d->tok->dec[k];
    tk_buf *h = &d->st[k].held;
    if (!tk_buf_put(h, s, n))
        return false;
    size_t m = h->n, pl = strlen(dc->a), i = 0, from = 0, keep = m;
    tk_buf u = {0};
    bool ok = tk_buf_put(&u, "", 0);
    while (ok && i < m) {
        if (m - i >= pl && !memcmp(h->p + i, dc->a, pl)) {
            ok = tk_buf_put(&u, h->p + from, i - from) && tk_buf_put(&u, dc->b, strlen(dc->b));
            i += pl;
            from = i;
        } else if (m - i < pl && !memcmp(h->p + i, dc->a, m - i)) {
            keep = i;
            break;
        } else {
            i++;
        }
    }
    ok = ok && tk_buf_put(&u, h->p + from, keep - from);
    if (ok) {
        memmove(h->p, h->p + keep, m - keep);
        h->n = m - keep;
        ok = text_in(d, k + 1, u.p, u.n, out);
    }
    free(u.p);
    return ok;
}

/* Text-mode Strip: drops up to `start` copies of the content at the front
 * of the whole text, passes the rest on but for up to `stop` trailing
 * copies (held: flush drops them, more text releases them). */
static bool strip_in(llmem_detok *d, int k, const char *s, size_t n, tk_buf *out)
{
    const tk_dec *dc = &d->tok->dec[k];
    ds_stage *g = &d->st[k];
    if (!tk_buf_put(&g->held, s, n))
        return false;
    size_t cl = strlen(dc->a), m = g->held.n, a = 0, e = m;
    const char *p = g->held.p;
    while (g->strip_left > 0 && a < m) {
        if (m - a >= cl && !memcmp(p + a, dc->a, cl)) {
            a += cl;
            g->strip_left--;
        } else {
            g->strip_left = 0;
        }
    }
    for (int t = 0; t < dc->stop && e - a >= cl && !memcmp(p + e - cl, dc->a, cl); t++)
        e -= cl;
    tk_buf u = {0};
    bool ok = tk_buf_put(&u, p + a, e - a);
    if (ok) {
        memmove(g->held.p, p + e, m - e);
        g->held.n = m - e;
        ok = text_in(d, k + 1, u.p ? u.p : "", u.n, out);
    }
    free(u.p);
    return ok;
}

/* Stage k (text mode) takes the next part s[0, n) of the one string. */
static bool text_in(llmem_detok *d, int k, const char *s, size_t n, tk_buf *out)
{
    const llmem_tokenizer *tok = d->tok;
    if (k == tok->n_dec)
        return tk_buf_put(out, s, n);
    const tk_dec *dc = &tok->dec[k];
    if (d->st[k].hold_all)
        return tk_buf_put(&d->st[k].held, s, n);
    switch (dc->kind) {
    case TK_DEC_REPLACE:
        return replace_in(d, k, s, n, out);
    case TK_DEC_STRIP:
        return strip_in(d, k, s, n, out);
    case TK_DEC_METASPACE: { /* the one string is the first (run_decoder) */
        tk_buf u = {0};
        bool ok = tk_buf_put(&u, "", 0) && tk_replace_all(&u, s, n, dc->a, dc->prepend ? "" : " ") &&
                  text_in(d, k + 1, u.p, u.n, out);
        free(u.p);
        return ok;
    }
    default: /* Fuse */
        return text_in(d, k + 1, s, n, out);
    }
}

/* Passes on what stage k holds at the end of the stream. */
static bool flush_stage(llmem_detok *d, int k, tk_buf *out)
{
    const tk_dec *dc = &d->tok->dec[k];
    ds_stage *g = &d->st[k];
    if (g->hold_all) { /* decode's chain from k on the one string */
        slist a = {0}, b = {0};
        tk_buf *o = slist_add(&a);
        tk_buf res = {0};
        bool ok = o && tk_buf_put(o, g->held.p ? g->held.p : "", g->held.n) &&
                  run_chain(d->tok, k, &a, &b, &res) && tk_buf_put(out, res.p, res.n);
        free(res.p);
        slist_free(&a);
        slist_free(&b);
        return ok;
    }
    if (dc->kind == TK_DEC_BYTEFALLBACK && !g->text)
        return end_run(d, k, out);
    if (dc->kind == TK_DEC_BYTELEVEL)
        return pass_chars(d, k, true, out);
    if (dc->kind == TK_DEC_REPLACE && g->text) { /* a tail shorter than the pattern */
        bool ok = text_in(d, k + 1, g->held.p ? g->held.p : "", g->held.n, out);
        g->held.n = 0;
        return ok;
    }
    return true; /* text-mode Strip: its held tail is what it strips */
}

/* A copy of d whose buffers are its own (push and flush work on one, so
 * that a call that fails changes nothing). False when out of memory. */
static bool detok_copy(const llmem_detok *d, llmem_detok *c)
{
    *c = *d;
    bool ok = true;
    for (int k = 0; k < TK_MAX_STAGES; k++) {
        c->st[k].held = (tk_buf){0};
        ok = ok && tk_buf_put(&c->st[k].held, d->st[k].held.p ? d->st[k].held.p : "",
                              d->st[k].held.n);
    }
    if (!ok)
        for (int k = 0; k < TK_MAX_STAGES; k++)
            free(c->st[k].held.p);
    return ok;
}

/* Makes c the state of d (freeing d's buffers), or drops c. */
static void detok_settle(llmem_detok *d, llmem_detok *c, bool keep)
{
    llmem_detok *gone = keep ? d : c;
    for (int k = 0; k < TK_MAX_STAGES; k++)
        free(gone->st[k].held.p);
    if (keep)
        *d = *c;
}

/* Copies text to out, or says how much room it needs. */
static llmem_status emit(const tk_buf *text, char *out, size_t cap, size_t *n_out)
{
    *n_out = text->n;
    if (text->n > cap)
        return LLMEM_E_NO_SPACE;
    if (text->n)
        memcpy(out, text->p, text->n);
    return LLMEM_OK;
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
    size_t n;
    const char *p = id_piece(d->tok, id, &n);
    llmem_status st = LLMEM_E_NO_MEMORY;
    if (tk_buf_put(&text, "", 0) && list_in(&save, 0, p, n, &text))
        st = emit(&text, out, cap, n_out);
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
    bool ok = tk_buf_put(&text, "", 0);
    for (int k = 0; ok && k < d->tok->n_dec; k++)
        ok = flush_stage(&save, k, &text);
    llmem_status st = ok ? emit(&text, out, cap, n_out) : LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK)
        detok_reset(&save); /* a new stream */
    detok_settle(d, &save, st == LLMEM_OK);
    free(text.p);
    return st;
}

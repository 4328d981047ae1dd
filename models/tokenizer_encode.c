/* llmem: encoding -- added-token split, normalization, pre-tokenization
 * (PCRE2 regexes, GPT-2 byte map, Metaspace) and the BPE merge loop.
 *
 * The merge loop follows huggingface/tokenizers models/bpe/word.rs: a
 * min-heap of (rank, position) candidate merges over a linked list of
 * symbols; a popped merge is applied only if the pair at that position
 * still merges to the same id. O(n log n) per pre-token. Reference:
 * Sennrich et al., ACL 2016; Radford et al. 2019 (byte-level BPE). */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "models/tokenizer_internal.h"

/* ---- BPE ------------------------------------------------------------------- */

typedef struct sym {
    int32_t id, prev, next;
} sym;

typedef struct cand {
    int32_t rank, pos, id;
} cand;

static bool cand_less(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        cand best = last;
        if (l < *n && cand_less(h[l], best)) {
            m = l;
            best = h[l];
        }
        if (r < *n && cand_less(h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n)
        h[i] = last;
    return top;
}

static const tk_merge_entry *merge_get(const tk_merges *m, int32_t a, int32_t b)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t x = k; /* the mixer of tk_merges_put (tokenizer_util.c) */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    uint32_t i = (uint32_t)x & m->mask;
    while (m->e[i].key != UINT64_MAX) {
        if (m->e[i].key == k)
            return &m->e[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}

llmem_status tk_bpe_word(const llmem_tokenizer *tok, const char *s, size_t n, tk_ids *out,
                         void **scratch, size_t *scratch_cap)
{
    if (!n)
        return LLMEM_OK;
    if (tok->ignore_merges) {
        int32_t id = tk_map_get(&tok->model, s, n);
        if (id >= 0)
            return tk_ids_push(out, id) ? LLMEM_OK : LLMEM_E_NO_MEMORY;
    }
    /* at most one symbol per byte; the heap holds the n - 1 first
     * candidates plus at most 2 per merge */
    size_t need = n * (sizeof(sym) + 3 * sizeof(cand)) + 64;
    if (*scratch_cap < need) {
        void *p = realloc(*scratch, need);
        if (!p)
            return LLMEM_E_NO_MEMORY;
        *scratch = p;
        *scratch_cap = need;
    }
    sym *w = *scratch;
    cand *heap = (cand *)(w + n);
    size_t nw = 0, nh = 0;
    int32_t unk_pending = -1;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tk_utf8_next(u + i, n - i, &cp);
        if (l <= 0)
            l = 1;
        int32_t id = tk_map_get(&tok->model, s + i, (size_t)l);
        if (id >= 0) {
            if (unk_pending >= 0) {
                w[nw++].id = unk_pending;
                unk_pending = -1;
            }
            w[nw++].id = id;
        } else {
            bool done = false;
            if (tok->byte_fallback) {
                bool all = true;
                for (int k = 0; k < l; k++)
                    all = all && tok->byte_id[u[i + k]] >= 0;
                if (all) {
                    if (unk_pending >= 0) {
                        w[nw++].id = unk_pending;
                        unk_pending = -1;
                    }
                    for (int k = 0; k < l; k++)
                        w[nw++].id = tok->byte_id[u[i + k]];
                    done = true;
                }
            }
            if (!done && tok->unk_id >= 0) {
                if (unk_pending >= 0 && !tok->fuse_unk)
                    w[nw++].id = unk_pending;
                unk_pending = tok->unk_id;
            }
            /* no unk token: the character is dropped, as tokenizers does */
        }
        i += (size_t)l;
    }
    if (unk_pending >= 0)
        w[nw++].id = unk_pending;
    for (size_t i = 0; i < nw; i++) {
        w[i].prev = (int32_t)i - 1;
        w[i].next = i + 1 < nw ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < nw; i++) {
        const tk_merge_entry *m = merge_get(&tok->merges, w[i].id, w[i + 1].id);
        if (m)
            heap_push(heap, &nh, (cand){m->rank, (int32_t)i, m->id});
    }
    while (nh) {
        cand c = heap_pop(heap, &nh);
        sym *a = &w[c.pos];
        if (a->id < 0 || a->next < 0)
            continue;
        sym *b = &w[a->next];
        const tk_merge_entry *m = merge_get(&tok->merges, a->id, b->id);
        if (!m || m->id != c.id)
            continue;
        a->id = c.id;
        b->id = -1;
        a->next = b->next;
        if (a->next >= 0)
            w[a->next].prev = c.pos;
        if (a->prev >= 0 && (m = merge_get(&tok->merges, w[a->prev].id, a->id)))
            heap_push(heap, &nh, (cand){m->rank, a->prev, m->id});
        if (a->next >= 0 && (m = merge_get(&tok->merges, a->id, w[a->next].id)))
            heap_push(heap, &nh, (cand){m->rank, c.pos, m->id});
    }
    for (int32_t i = nw ? 0 : -1; i >= 0; i = w[i].next)
        if (!tk_ids_push(out, w[i].id))
            return LLMEM_E_NO_MEMORY;
    return LLMEM_OK;
}

/* ---- added tokens ------------------------------------------------------------ */

typedef struct seg {
    size_t start, end;
    int32_t id; /* added token id, or -1 for text */
} seg;

typedef struct segs {
    seg *p;
    size_t n, cap;
} segs;

static bool segs_push(segs *v, size_t start, size_t end, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        seg *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return false;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (seg){start, end, id};
    return true;
}

/* Rust's char::is_whitespace (the White_Space property). */
static bool is_ws(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector
 * punctuation and the join controls (letters, marks, Nd, Nl, Pc here). */
static bool is_word_cp(uint32_t c)
{
    if (c < 0x80)
        return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    if (c == 0x200C || c == 0x200D)
        return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* is the character ending at s[end) (before) or starting at s[at] a word character */
static bool word_before(const char *s, size_t start, size_t end)
{
    if (end <= start)
        return false;
    size_t p = end - 1;
    while (p > start && ((unsigned char)s[p] & 0xC0) == 0x80)
        p--;
    uint32_t cp;
    return tk_utf8_next((const unsigned char *)s + p, end - p, &cp) > 0 && is_word_cp(cp);
}

static bool word_at(const char *s, size_t at, size_t n)
{
    uint32_t cp;
    return at < n && tk_utf8_next((const unsigned char *)s + at, n - at, &cp) > 0 && is_word_cp(cp);
}

/* Splits s[0..n) at added tokens: leftmost-longest matching (the
 * aho-corasick LeftmostLongest of tokenizers' AddedVocabulary) over the
 * tokens with normalized == `norm_pass`, skipping special ones unless
 * parse_special; lstrip/rstrip swallow neighbouring whitespace. */
static bool split_added(const llmem_tokenizer *tok, const char *s, size_t n, bool norm_pass,
                        bool parse_special, segs *out)
{
    size_t text_start = 0;
    for (size_t i = 0; i < n;) {
        int best = -1;
        size_t best_len = 0;
        /* only the added tokens whose text starts with this byte */
        const int32_t *by_byte = tok->added_by_byte[norm_pass];
        int32_t c0 = tok->added_byte_start[norm_pass][(unsigned char)s[i]];
        int32_t c1 = tok->added_byte_start[norm_pass][(unsigned char)s[i] + 1];
        for (int32_t ci = c0; ci < c1; ci++) {
            int k = by_byte[ci];
            const tk_added *a = &tok->added[k];
            if (a->special && !parse_special)
                continue;
            const char *c = norm_pass ? a->norm : a->content;
            size_t cl = norm_pass ? a->norm_len : a->len;
            if (!cl || cl <= best_len || cl > n - i || c[0] != s[i] || memcmp(c, s + i, cl))
                continue;
            best = k;
            best_len = cl;
        }
        if (best < 0) {
            i++;
            continue;
        }
        const tk_added *a = &tok->added[best];
        if (a->single_word && (word_before(s, 0, i) || word_at(s, i + best_len, n))) {
            /* a discarded match is skipped whole, as aho-corasick's
             * non-overlapping iteration in tokenizers does */
            i += best_len;
            continue;
        }
        size_t ms = i, me = i + best_len;
        if (a->lstrip) {
            while (ms > text_start) {
                /* step back one UTF-8 character */
                size_t p = ms - 1;
                while (p > text_start && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                uint32_t cp;
                if (tk_utf8_next((const unsigned char *)s + p, n - p, &cp) <= 0 || !is_ws(cp))
                    break;
                ms = p;
            }
        }
        if (a->rstrip) {
            while (me < n) {
                uint32_t cp;
                int l = tk_utf8_next((const unsigned char *)s + me, n - me, &cp);
                if (l <= 0 || !is_ws(cp))
                    break;
                me += (size_t)l;
            }
        }
        if (ms > text_start && !segs_push(out, text_start, ms, -1))
            return false;
        if (!segs_push(out, ms, me, a->id))
            return false;
        text_start = i = me;
    }
    if (n > text_start && !segs_push(out, text_start, n, -1))
        return false;
    return true;
}

/* ---- pre-tokenization ------------------------------------------------------------ */

/* A list of pieces, each a byte range of its own arena. */
typedef struct pieces {
    tk_buf arena;
    size_t *off, *len;
    bool *first; /* starts at offset 0 of the original text */
    size_t n, cap;
} pieces;

static bool pieces_add(pieces *p, const char *s, size_t n, bool first)
{
    if (!n)
        return true;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        size_t *o = realloc(p->off, cap * sizeof *o);
        if (!o)
            return false;
        p->off = o;
        size_t *l = realloc(p->len, cap * sizeof *l);
        if (!l)
            return false;
        p->len = l;
        bool *f = realloc(p->first, cap * sizeof *f);
        if (!f)
            return false;
        p->first = f;
        p->cap = cap;
    }
    p->off[p->n] = p->arena.n;
    p->len[p->n] = n;
    p->first[p->n] = first;
    p->n++;
    return tk_buf_put(&p->arena, s, n);
}

static void pieces_clear(pieces *p)
{
    p->n = 0;
    p->arena.n = 0;
}

static void pieces_free(pieces *p)
{
    free(p->arena.p);
    free(p->off);
    free(p->len);
    free(p->first);
}

/* Splits s by a regex into alternating gap and match segments (matches and
 * gaps swap roles when the pre-tokenizer says invert), then applies the
 * behavior as tokenizers' NormalizedString::split does. */
static bool regex_split(const tk_pre *pr, const char *s, size_t n, bool first, pcre2_match_data *md,
                        pieces *out)
{
    size_t pos = 0, gap = 0;
    size_t cur_s = 0, cur_e = 0; /* the segment being built (not yet added) */
    bool have = false, prev_match = false;
#define EMIT(a, b) \
    do { \
        if (!pieces_add(out, s + (a), (b) - (a), first && (a) == 0)) \
            return false; \
    } while (0)
    /* one segment (a, b, is_match) through the behavior */
#define SEGMENT(a, b, m) \
    do { \
        bool im_ = (m) != pr->invert; \
        switch (pr->behavior) { \
        case TK_SPLIT_REMOVED: \
            if (!im_) \
                EMIT(a, b); \
            break; \
        case TK_SPLIT_ISOLATED: EMIT(a, b); break; \
        case TK_SPLIT_MERGED_PREV: \
            if (im_ && !prev_match && have) { \
                cur_e = (b); \
            } else { \
                if (have) \
                    EMIT(cur_s, cur_e); \
                cur_s = (a), cur_e = (b), have = true; \
            } \
            break; \
        case TK_SPLIT_MERGED_NEXT: /* a match takes the gap after it */ \
            if (have && !im_) { \
                EMIT(cur_s, (b)); \
                have = false; \
            } else { \
                if (have) \
                    EMIT(cur_s, cur_e); \
                have = false; \
                if (im_) \
                    cur_s = (a), cur_e = (b), have = true; \
                else \
                    EMIT(a, b); \
            } \
            break; \
        case TK_SPLIT_CONTIGUOUS: \
            if (have && im_ == prev_match) { \
                cur_e = (b); \
            } else { \
                if (have) \
                    EMIT(cur_s, cur_e); \
                cur_s = (a), cur_e = (b), have = true; \
            } \
            break; \
        } \
        prev_match = im_; \
    } while (0)
    while (pos <= n) {
        int rc = pcre2_match(pr->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character */
            pos = ms + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            if (ms >= n)
                break;
            continue;
        }
        if (ms > gap)
            SEGMENT(gap, ms, false);
        SEGMENT(ms, me, true);
        gap = pos = me;
    }
    if (n > gap)
        SEGMENT(gap, n, false);
    if (have)
        EMIT(cur_s, cur_e);
#undef SEGMENT
#undef EMIT
    return true;
}

static bool byte_map(const char *s, size_t n, tk_buf *out)
{
    /* every byte maps to at most 2 UTF-8 bytes (code points < 0x800) */
    out->n = 0;
    if (!tk_buf_put(out, NULL, 0) || (out->cap < 2 * n + 1 && !tk_buf_reserve(out, 2 * n + 1)))
        return false;
    char *o = out->p;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = tk_byte_cp((unsigned char)s[i]);
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else {
            *o++ = (char)(0xC0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    out->n = (size_t)(o - out->p);
    out->p[out->n] = '\0';
    return true;
}

static bool run_pre(const llmem_tokenizer *tok, const tk_pre *pr, pieces *in, pieces *out,
                    pcre2_match_data *md, tk_buf *tmp)
{
    pieces_clear(out);
    for (size_t k = 0; k < in->n; k++) {
        const char *s = in->arena.p + in->off[k];
        size_t n = in->len[k];
        bool first = in->first[k];
        switch (pr->kind) {
        case TK_PRE_SPLIT:
            if (!regex_split(pr, s, n, first, md, out))
                return false;
            break;
        case TK_PRE_BYTELEVEL: {
            pieces sub = {0};
            tmp->n = 0;
            if (pr->add_prefix_space && s[0] != ' ' && !tk_buf_putc(tmp, ' '))
                return false;
            if (!tk_buf_put(tmp, s, n))
                return false;
            bool ok = pr->re ? regex_split(pr, tmp->p, tmp->n, first, md, &sub)
                             : pieces_add(&sub, tmp->p, tmp->n, first);
            tk_buf mapped = {0};
            for (size_t j = 0; ok && j < sub.n; j++) {
                ok = byte_map(sub.arena.p + sub.off[j], sub.len[j], &mapped) &&
                     pieces_add(out, mapped.p, mapped.n, sub.first[j]);
            }
            free(mapped.p);
            pieces_free(&sub);
            if (!ok)
                return false;
            break;
        }
        case TK_PRE_METASPACE: {
            tmp->n = 0;
            size_t rl = strlen(pr->replacement);
            /* spaces become the replacement first; then it is prepended
             * unless the piece already starts with one */
            bool starts = s[0] == ' ' || (n >= rl && !memcmp(s, pr->replacement, rl));
            if ((pr->prepend == 2 || (pr->prepend == 1 && first)) && !starts &&
                !tk_buf_put(tmp, pr->replacement, rl))
                return false;
            for (size_t i = 0; i < n; i++) {
                if (s[i] == ' ' ? !tk_buf_put(tmp, pr->replacement, rl) : !tk_buf_putc(tmp, s[i]))
                    return false;
            }
            if (!pr->split) {
                if (!pieces_add(out, tmp->p, tmp->n, first))
                    return false;
                break;
            }
            size_t st = 0;
            for (size_t i = 1; i + rl <= tmp->n; i++) {
                if (!memcmp(tmp->p + i, pr->replacement, rl)) {
                    if (!pieces_add(out, tmp->p + st, i - st, first && st == 0))
                        return false;
                    st = i;
                }
            }
            if (!pieces_add(out, tmp->p + st, tmp->n - st, first && st == 0))
                return false;
            break;
        }
        }
    }
    return true;
}

/* ---- encode -------------------------------------------------------------------- */

typedef struct enc_ctx {
    pieces a, b;
    tk_buf tmp, norm;
    segs s2;
    void *scratch;
    size_t scratch_cap;
    pcre2_match_data *md;
} enc_ctx;

static llmem_status encode_text(const llmem_tokenizer *tok, enc_ctx *c, const char *s, size_t n,
                                bool first, bool parse_special, tk_ids *out)
{
    llmem_status st = tk_normalize(tok, s, n, &c->norm);
    if (st)
        return st;
    c->s2.n = 0;
    if (!split_added(tok, c->norm.p, c->norm.n, true, parse_special, &c->s2))
        return LLMEM_E_NO_MEMORY;
    for (size_t k = 0; k < c->s2.n; k++) {
        seg g = c->s2.p[k];
        if (g.id >= 0) {
            if (!tk_ids_push(out, g.id))
                return LLMEM_E_NO_MEMORY;
            continue;
        }
        pieces_clear(&c->a);
        if (!pieces_add(&c->a, c->norm.p + g.start, g.end - g.start, first && g.start == 0))
            return LLMEM_E_NO_MEMORY;
        pieces *in = &c->a, *o = &c->b;
        for (int p = 0; p < tok->n_pre; p++) {
            if (!run_pre(tok, &tok->pre[p], in, o, c->md, &c->tmp))
                return LLMEM_E_NO_MEMORY;
            pieces *t = in;
            in = o;
            o = t;
        }
        for (size_t j = 0; j < in->n; j++) {
            st = tk_bpe_word(tok, in->arena.p + in->off[j], in->len[j], out, &c->scratch, &c->scratch_cap);
            if (st)
                return st;
        }
    }
    return LLMEM_OK;
}

llmem_status llmem_tokenizer_encode(const llmem_tokenizer *tok, const char *text, size_t len,
                                    bool add_special, bool parse_special, int32_t **ids,
                                    int32_t *n_ids, char *err, size_t err_len)
{
    if (ids)
        *ids = NULL;
    if (n_ids)
        *n_ids = 0;
    if (!tok || !ids || !n_ids || (!text && len)) {
        tk_set_err(err, err_len, "tokenizer_encode: NULL argument");
        return LLMEM_E_INVALID;
    }
    llmem_status st = LLMEM_E_NO_MEMORY;
    enc_ctx c = {0};
    tk_buf clean = {0};
    segs s1 = {0};
    tk_ids out = {0};
    c.md = pcre2_match_data_create(4, NULL);
    if (!c.md || !tk_utf8_lossy(&clean, (const unsigned char *)(text ? text : ""), len) ||
        !tk_buf_put(&clean, "", 0))
        goto fail;
    if (add_special)
        for (int i = 0; i < tok->n_prefix; i++)
            if (!tk_ids_push(&out, tok->prefix[i]))
                goto fail;
    if (!split_added(tok, clean.p, clean.n, false, parse_special, &s1))
        goto fail;
    for (size_t k = 0; k < s1.n; k++) {
        seg g = s1.p[k];
        if (g.id >= 0) {
            if (!tk_ids_push(&out, g.id))
                goto fail;
            continue;
        }
        st = encode_text(tok, &c, clean.p + g.start, g.end - g.start, g.start == 0, parse_special, &out);
        if (st)
            goto fail;
        st = LLMEM_E_NO_MEMORY;
    }
    if (add_special)
        for (int i = 0; i < tok->n_suffix; i++)
            if (!tk_ids_push(&out, tok->suffix[i]))
                goto fail;
    if (out.n > INT32_MAX) {
        st = LLMEM_E_INVALID;
        goto fail;
    }
    *ids = out.p;
    *n_ids = (int32_t)out.n;
    out.p = NULL;
    st = LLMEM_OK;
fail:
    if (st == LLMEM_E_NO_MEMORY)
        tk_set_err(err, err_len, "tokenizer_encode: out of memory");
    free(out.p);
    free(s1.p);
    free(clean.p);
    pieces_free(&c.a);
    pieces_free(&c.b);
    free(c.tmp.p);
    free(c.norm.p);
    free(c.s2.p);
    free(c.scratch);
    pcre2_match_data_free(c.md);
    return st;
}

/* llmem: loading tokenizer.json and tokenizer_config.json, and the
 * accessors. The encoder is tokenizer_encode.c, the decoder
 * tokenizer_decode.c.
 *
 * Reference: the serialization of huggingface/tokenizers (serde of
 * TokenizerImpl: "added_tokens", "normalizer", "pre_tokenizer", "model",
 * "post_processor", "decoder") and transformers' tokenizer_config.json. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "models/hf_internal.h"
#include "models/tokenizer_internal.h"

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static const char *jstr(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *key, bool dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* a token given as "x" or {"content": "x", ...} */
static const char *token_str(const cJSON *v)
{
    if (cJSON_IsString(v))
        return v->valuestring;
    if (cJSON_IsObject(v))
        return jstr(v, "content");
    return NULL;
}

typedef struct load_ctx {
    llmem_tokenizer *tok;
    char *err;
    size_t err_len;
} load_ctx;

static llmem_status unsupported(load_ctx *c, const char *what, const cJSON *o)
{
    const char *t = jstr(o, "type");
    tk_set_err(c->err, c->err_len, "tokenizer.json: %s type '%s' is not supported", what, t ? t : "?");
    return LLMEM_E_UNSUPPORTED;
}

/* o[key]: a whole number in [0, INT32_MAX]. */
static bool count_field(const cJSON *o, const char *key, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX ||
        v->valuedouble != (double)v->valueint)
        return false;
    *out = v->valueint;
    return true;
}

typedef llmem_status (*stage_add_fn)(load_ctx *c, const cJSON *o);

/* A "Sequence" stage lists its children under list_key; add each in order, first failure wins. */
static llmem_status add_each(load_ctx *c, const cJSON *o, const char *list_key, stage_add_fn add)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, list_key)) {
        llmem_status st = add(c, it);
        if (st)
            return st;
    }
    return LLMEM_OK;
}

static llmem_status add_norm(load_ctx *c, const cJSON *o)
{
    llmem_tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o))
        return LLMEM_OK;
    const char *t = jstr(o, "type");
    if (t && !strcmp(t, "Sequence"))
        return add_each(c, o, "normalizers", add_norm);
    if (!t)
        return unsupported(c, "normalizer", o);
    if (tok->n_norm == TK_MAX_STAGES)
        return unsupported(c, "normalizer (too many stages)", o);
    tk_norm *n = &tok->norm[tok->n_norm];
    memset(n, 0, sizeof *n);
    if (!strcmp(t, "NFC"))
        n->kind = TK_NORM_NFC;
    else if (!strcmp(t, "NFD"))
        n->kind = TK_NORM_NFD;
    else if (!strcmp(t, "NFKC"))
        n->kind = TK_NORM_NFKC;
    else if (!strcmp(t, "NFKD"))
        n->kind = TK_NORM_NFKD;
    else if (!strcmp(t, "Prepend") && jstr(o, "prepend")) {
        n->kind = TK_NORM_PREPEND;
        if (!(n->a = strdup(jstr(o, "prepend"))))
            return LLMEM_E_NO_MEMORY;
    } else if (!strcmp(t, "Replace")) {
        const char *pat = jstr(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String");
        const char *content = jstr(o, "content");
        if (!pat || !content)
            return unsupported(c, "normalizer Replace with a Regex pattern; normalizer", o);
        if (!*pat) /* tokenizers puts content between all characters */
            return unsupported(c, "normalizer Replace with an empty pattern; normalizer", o);
        n->kind = TK_NORM_REPLACE;
        n->a = strdup(pat);
        n->b = strdup(content);
        if (!n->a || !n->b) {
            free(n->a);
            free(n->b);
            return LLMEM_E_NO_MEMORY;
        }
    } else {
        return unsupported(c, "normalizer", o);
    }
    tok->n_norm++;
    return LLMEM_OK;
}

static llmem_status compile_re(load_ctx *c, const char *pat, bool literal, pcre2_code **out)
{
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    *out = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opt, &ec, &eo, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        tk_set_err(c->err, c->err_len, "tokenizer.json: pre-tokenizer regex at offset %zu: %s",
                   (size_t)eo, (const char *)msg);
        return LLMEM_E_UNSUPPORTED;
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    return LLMEM_OK;
}

static llmem_status add_pre(load_ctx *c, const cJSON *o)
{
    llmem_tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o))
        return LLMEM_OK;
    const char *t = jstr(o, "type");
    if (t && !strcmp(t, "Sequence"))
        return add_each(c, o, "pretokenizers", add_pre);
    if (!t)
        return unsupported(c, "pre-tokenizer", o);
    if (tok->n_pre == TK_MAX_STAGES)
        return unsupported(c, "pre-tokenizer (too many stages)", o);
    tk_pre *p = &tok->pre[tok->n_pre];
    memset(p, 0, sizeof *p);
    llmem_status st = LLMEM_OK;
    if (!strcmp(t, "ByteLevel")) {
        p->kind = TK_PRE_BYTELEVEL;
        p->add_prefix_space = jbool(o, "add_prefix_space", true);
        p->behavior = TK_SPLIT_ISOLATED;
        if (jbool(o, "use_regex", true))
            st = compile_re(c, GPT2_REGEX, false, &p->re);
        tok->byte_level = true;
    } else if (!strcmp(t, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        const char *beh = jstr(o, "behavior");
        p->kind = TK_PRE_SPLIT;
        if ((!re && !lit) || !beh)
            return unsupported(c, "pre-tokenizer Split without pattern; pre-tokenizer", o);
        p->invert = jbool(o, "invert", false);
        if (!strcmp(beh, "Isolated"))
            p->behavior = TK_SPLIT_ISOLATED;
        else if (!strcmp(beh, "Removed"))
            p->behavior = TK_SPLIT_REMOVED;
        else if (!strcmp(beh, "MergedWithPrevious"))
            p->behavior = TK_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext"))
            p->behavior = TK_SPLIT_MERGED_NEXT;
        else if (!strcmp(beh, "Contiguous"))
            p->behavior = TK_SPLIT_CONTIGUOUS;
        else {
            tk_set_err(c->err, c->err_len, "tokenizer.json: Split behavior '%s' is not supported", beh);
            return LLMEM_E_UNSUPPORTED;
        }
        st = compile_re(c, re ? re : lit, !re, &p->re);
    } else if (!strcmp(t, "Digits")) {
        /* char::is_numeric: Nd, Nl, No */
        p->kind = TK_PRE_SPLIT;
        p->behavior = jbool(o, "individual_digits", false) ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS;
        st = compile_re(c, "\\p{N}", false, &p->re);
    } else if (!strcmp(t, "Punctuation")) {
        /* is_ascii_punctuation or a P* category */
        const char *beh = jstr(o, "behavior");
        p->kind = TK_PRE_SPLIT;
        p->behavior = !beh || !strcmp(beh, "Isolated") ? TK_SPLIT_ISOLATED
                      : !strcmp(beh, "Contiguous") ? TK_SPLIT_CONTIGUOUS
                      : !strcmp(beh, "Removed") ? TK_SPLIT_REMOVED
                      : !strcmp(beh, "MergedWithPrevious") ? TK_SPLIT_MERGED_PREV : TK_SPLIT_MERGED_NEXT;
        st = compile_re(c, "[\\p{P}!-\\/:-@\\[-`{-~]", false, &p->re);
    } else if (!strcmp(t, "Whitespace")) {
        /* \w+|[^\w\s]+ kept, the rest removed; \w as Rust's regex has it */
        p->kind = TK_PRE_SPLIT;
        p->behavior = TK_SPLIT_REMOVED;
        p->invert = true;
        st = compile_re(c,
                        "[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
                        "[^\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\s]+",
                        false, &p->re);
    } else if (!strcmp(t, "WhitespaceSplit")) {
        p->kind = TK_PRE_SPLIT;
        p->behavior = TK_SPLIT_REMOVED;
        st = compile_re(c, "\\s+", false, &p->re);
    } else if (!strcmp(t, "Metaspace")) {
        const char *r = jstr(o, "replacement");
        const char *scheme = jstr(o, "prepend_scheme");
        p->kind = TK_PRE_METASPACE;
        snprintf(p->replacement, sizeof p->replacement, "%s", r ? r : "\xE2\x96\x81");
        if (scheme)
            p->prepend = !strcmp(scheme, "always") ? 2 : !strcmp(scheme, "first") ? 1 : 0;
        else
            p->prepend = jbool(o, "add_prefix_space", true) ? 2 : 0;
        p->split = jbool(o, "split", true);
    } else {
        return unsupported(c, "pre-tokenizer", o);
    }
    if (st)
        return st;
    tok->n_pre++;
    return LLMEM_OK;
}

static llmem_status add_dec(load_ctx *c, const cJSON *o)
{
    llmem_tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o))
        return LLMEM_OK;
    tok->has_decoder = true;
    const char *t = jstr(o, "type");
    if (t && !strcmp(t, "Sequence"))
        return add_each(c, o, "decoders", add_dec);
    if (!t)
        return unsupported(c, "decoder", o);
    if (tok->n_dec == TK_MAX_STAGES)
        return unsupported(c, "decoder (too many stages)", o);
    tk_dec *d = &tok->dec[tok->n_dec];
    memset(d, 0, sizeof *d);
    const char *a = NULL, *b = NULL;
    if (!strcmp(t, "ByteLevel")) {
        d->kind = TK_DEC_BYTELEVEL;
    } else if (!strcmp(t, "ByteFallback")) {
        d->kind = TK_DEC_BYTEFALLBACK;
    } else if (!strcmp(t, "Fuse")) {
        d->kind = TK_DEC_FUSE;
    } else if (!strcmp(t, "Strip")) {
        d->kind = TK_DEC_STRIP;
        a = jstr(o, "content");
        if (!a)
            return unsupported(c, "decoder Strip without content; decoder", o);
        /* tokenizers' Strip takes one character and two counts (a file
         * with other values does not load there) */
        if (!tk_utf8_one_char(a) || !count_field(o, "start", &d->start) || !count_field(o, "stop", &d->stop)) {
            tk_set_err(c->err, c->err_len, "tokenizer.json: decoder Strip needs one character as "
                       "content and whole numbers >= 0 as start and stop");
            return LLMEM_E_CORRUPT;
        }
    } else if (!strcmp(t, "Replace")) {
        d->kind = TK_DEC_REPLACE;
        a = jstr(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String");
        b = jstr(o, "content");
        if (!a || !b)
            return unsupported(c, "decoder Replace with a Regex pattern; decoder", o);
        if (!*a) /* tokenizers puts content between all characters */
            return unsupported(c, "decoder Replace with an empty pattern; decoder", o);
    } else if (!strcmp(t, "Metaspace")) {
        d->kind = TK_DEC_METASPACE;
        a = jstr(o, "replacement");
        if (!a)
            a = "\xE2\x96\x81";
        const char *scheme = jstr(o, "prepend_scheme");
        if (scheme)
            d->prepend = !strcmp(scheme, "always") ? 2 : !strcmp(scheme, "first") ? 1
                         : !strcmp(scheme, "never") ? 0 : -1;
        else
            d->prepend = jbool(o, "add_prefix_space", true) ? 2 : 0;
        if (!tk_utf8_one_char(a) || d->prepend < 0) { /* as tokenizers refuses them */
            tk_set_err(c->err, c->err_len, "tokenizer.json: decoder Metaspace needs one character "
                       "as replacement and prepend_scheme \"always\", \"first\" or \"never\"");
            return LLMEM_E_CORRUPT;
        }
    } else {
        return unsupported(c, "decoder", o);
    }
    if ((a && !(d->a = strdup(a))) || (b && !(d->b = strdup(b)))) {
        free(d->a);
        return LLMEM_E_NO_MEMORY;
    }
    tok->n_dec++;
    return LLMEM_OK;
}

static bool ids_append(int32_t **v, int *n, int32_t id)
{
    int32_t *p = realloc(*v, (size_t)(*n + 1) * sizeof *p);
    if (!p)
        return false;
    p[(*n)++] = id;
    *v = p;
    return true;
}

static llmem_status add_post(load_ctx *c, const cJSON *o)
{
    llmem_tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o))
        return LLMEM_OK;
    const char *t = jstr(o, "type");
    if (t && !strcmp(t, "Sequence"))
        return add_each(c, o, "processors", add_post);
    if (t && !strcmp(t, "ByteLevel"))
        return LLMEM_OK; /* offsets only */
    if (!t || strcmp(t, "TemplateProcessing"))
        return unsupported(c, "post-processor", o);
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
    const cJSON *it;
    bool after = false;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "single")) {
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = jstr(cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), "id");
        const cJSON *sp = name ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids");
        if (!cJSON_IsArray(ids)) {
            tk_set_err(c->err, c->err_len, "tokenizer.json: TemplateProcessing token '%s' has no ids",
                       name ? name : "?");
            return LLMEM_E_CORRUPT;
        }
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) {
            /* an id without a token would come out of encode and be refused by decode */
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= tok->n_vocab ||
                id->valuedouble != (double)id->valueint || !tok->piece[id->valueint]) {
                tk_set_err(c->err, c->err_len, "tokenizer.json: TemplateProcessing id of '%s' is not "
                           "a token of the vocabulary", name);
                return LLMEM_E_CORRUPT;
            }
            if (!(after ? ids_append(&tok->suffix, &tok->n_suffix, id->valueint)
                        : ids_append(&tok->prefix, &tok->n_prefix, id->valueint)))
                return LLMEM_E_NO_MEMORY;
        }
    }
    return LLMEM_OK;
}

/* The id Hugging Face tokenizers gives the added token `content` when it
 * loads tokenizer.json (AddedVocabulary::add_tokens, tokenizers 0.23):
 * an earlier added token's id for the same content, else the vocabulary's
 * id for it, else the next id after the vocabulary's n_vocab_entries
 * entries and after added_max, the largest added id so far (-1: none). It
 * does not read the id the file gives; serializing writes the ids it
 * assigned, so a file it wrote agrees with it. Before the vocabulary ids
 * join tok->all, that map holds the added tokens only. */
static int32_t added_id(const llmem_tokenizer *tok, const char *content, int n_vocab_entries,
                        int64_t added_max)
{
    size_t n = strlen(content);
    int32_t id = tk_map_get(&tok->all, content, n);
    if (id < 0)
        id = tk_map_get(&tok->model, content, n);
    if (id >= 0)
        return id;
    if (added_max < 0 || (added_max < n_vocab_entries && n_vocab_entries > 0))
        return n_vocab_entries;
    return (int32_t)(added_max + 1);
}

static llmem_status load_model(load_ctx *c, const cJSON *root)
{
    llmem_tokenizer *tok = c->tok;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *type = jstr(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type && strcmp(type, "BPE"))
        return unsupported(c, "model", model);
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        tk_set_err(c->err, c->err_len, "tokenizer.json: model.vocab (object) and model.merges (list) are required");
        return LLMEM_E_CORRUPT;
    }
    const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew)) {
        tk_set_err(c->err, c->err_len,
                   "tokenizer.json: BPE continuing_subword_prefix / end_of_word_suffix are not supported");
        return LLMEM_E_UNSUPPORTED;
    }
    /* ids: the vocabulary's and the added tokens' */
    int64_t max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX - 1 ||
            it->valuedouble != (double)it->valueint) {
            tk_set_err(c->err, c->err_len, "tokenizer.json: vocab entry '%s' has no valid id", it->string);
            return LLMEM_E_CORRUPT;
        }
        if (it->valueint > max_id)
            max_id = it->valueint;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1 ||
            id->valuedouble != (double)id->valueint || !jstr(it, "content")) {
            tk_set_err(c->err, c->err_len, "tokenizer.json: an added token has no valid id or content");
            return LLMEM_E_CORRUPT;
        }
        if (id->valueint > max_id)
            max_id = id->valueint;
    }
    /* Tables are indexed by id, so ids must be about as many as the tokens
     * listed: real files number them 0..n-1 (added tokens may leave a few
     * holes); one id of 2^30 in a tiny file would cost gigabytes. */
    int64_t n_listed = (int64_t)cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added);
    if (max_id >= 2 * n_listed + 1024) {
        tk_set_err(c->err, c->err_len, "tokenizer.json: token id %lld is far past the %lld tokens "
                   "listed (llmem needs ids numbered about densely from 0)", (long long)max_id,
                   (long long)n_listed);
        return LLMEM_E_UNSUPPORTED;
    }
    tok->n_vocab = (int32_t)(max_id + 1);
    size_t nv = (size_t)tok->n_vocab + 1;
    tok->piece = calloc(nv, sizeof *tok->piece);
    tok->piece_len = calloc(nv, sizeof *tok->piece_len);
    tok->mpiece = calloc(nv, sizeof *tok->mpiece);
    tok->mpiece_len = calloc(nv, sizeof *tok->mpiece_len);
    tok->flags = calloc(nv, 1);
    if (!tok->piece || !tok->piece_len || !tok->mpiece || !tok->mpiece_len || !tok->flags)
        return LLMEM_E_NO_MEMORY;
    int n_vocab_entries = cJSON_GetArraySize(vocab);
    if (!tk_map_init(&tok->model, (size_t)n_vocab_entries, tok->mpiece, tok->mpiece_len) ||
        !tk_map_init(&tok->all, nv, tok->piece, tok->piece_len))
        return LLMEM_E_NO_MEMORY;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = it->valueint;
        if (tok->mpiece[id]) {
            /* Hugging Face tokenizers loads this, but decodes the id to
             * whichever token its hash map yields last, which changes from
             * run to run: no answer to match */
            tk_set_err(c->err, c->err_len, "tokenizer.json: vocab tokens '%s' and '%s' both have id %d",
                       tok->mpiece[id], it->string, id);
            return LLMEM_E_CORRUPT;
        }
        if (!(tok->mpiece[id] = strdup(it->string)))
            return LLMEM_E_NO_MEMORY;
        tok->mpiece_len[id] = (uint32_t)strlen(it->string);
        tok->piece[id] = tok->mpiece[id];
        tok->piece_len[id] = tok->mpiece_len[id];
        tk_map_put(&tok->model, id);
    }
    /* added tokens: decode shows their content; token_id finds them first */
    int n_added = cJSON_GetArraySize(added);
    tok->added = calloc((size_t)n_added + 1, sizeof *tok->added);
    if (!tok->added)
        return LLMEM_E_NO_MEMORY;
    int64_t added_max = -1; /* the largest added-token id so far */
    cJSON_ArrayForEach(it, added) {
        tk_added *a = &tok->added[tok->n_added++];
        a->id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *content = jstr(it, "content");
        int32_t hf_id = added_id(tok, content, n_vocab_entries, added_max);
        if (!*content || a->id != hf_id) {
            if (*content)
                tk_set_err(c->err, c->err_len, "tokenizer.json: added token '%s' has id %d, but "
                           "Hugging Face tokenizers gives it id %d", content, a->id, hf_id);
            else
                tk_set_err(c->err, c->err_len, "tokenizer.json: added token id %d has no content "
                           "(Hugging Face tokenizers skips it)", a->id);
            return LLMEM_E_CORRUPT;
        }
        if (a->id > added_max)
            added_max = a->id;
        if (!(a->content = strdup(content)))
            return LLMEM_E_NO_MEMORY;
        a->len = (uint32_t)strlen(a->content);
        a->special = jbool(it, "special", false);
        a->normalized = jbool(it, "normalized", !a->special);
        a->lstrip = jbool(it, "lstrip", false);
        a->rstrip = jbool(it, "rstrip", false);
        a->single_word = jbool(it, "single_word", false);
        tok->flags[a->id] |= TK_F_ADDED | (a->special ? TK_F_SPECIAL : 0);
        if (!tok->piece[a->id] || strcmp(tok->piece[a->id], a->content)) {
            if (tok->piece[a->id] != tok->mpiece[a->id])
                free(tok->piece[a->id]);
            if (!(tok->piece[a->id] = strdup(a->content)))
                return LLMEM_E_NO_MEMORY;
            tok->piece_len[a->id] = a->len;
        }
        tk_map_put(&tok->all, a->id);
    }
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if (tok->piece[id])
            tk_map_put(&tok->all, id);
    /* merges: "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs */
    if (!tk_merges_init(&tok->merges, (size_t)cJSON_GetArraySize(merges)))
        return LLMEM_E_NO_MEMORY;
    tk_buf cat = {0};
    int32_t rank = 0;
    llmem_status st = LLMEM_OK;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (sp) {
                a = it->valuestring;
                la = (size_t)(sp - a);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        }
        int32_t ia = a ? tk_map_get(&tok->model, a, la) : -1;
        int32_t ib = b ? tk_map_get(&tok->model, b, lb) : -1;
        cat.n = 0;
        int32_t im = -1;
        if (ia >= 0 && ib >= 0) {
            if (!tk_buf_put(&cat, a, la) || !tk_buf_put(&cat, b, lb)) {
                st = LLMEM_E_NO_MEMORY;
                break;
            }
            im = tk_map_get(&tok->model, cat.p, cat.n);
        }
        if (im < 0) {
            tk_set_err(c->err, c->err_len, "tokenizer.json: merge %d has a piece missing from the vocabulary",
                       rank);
            st = LLMEM_E_CORRUPT;
            break;
        }
        tk_merges_put(&tok->merges, ia, ib, rank++, im);
    }
    free(cat.p);
    if (st)
        return st;
    tok->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk)
        tok->unk_id = tk_map_get(&tok->model, unk, strlen(unk));
    tok->byte_fallback = jbool(model, "byte_fallback", false);
    tok->fuse_unk = jbool(model, "fuse_unk", false);
    tok->ignore_merges = jbool(model, "ignore_merges", false);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_id[b] = tk_map_get(&tok->model, name, 6);
    }
    return LLMEM_OK;
}

static int32_t lookup(const llmem_tokenizer *tok, const char *s)
{
    return s ? tk_map_get(&tok->all, s, strlen(s)) : -1;
}

static llmem_status load_config(load_ctx *c, const char *dir, bool has_post)
{
    llmem_tokenizer *tok = c->tok;
    char path[4200];
    llmem_status st;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    size_t len = 0;
    char *txt = NULL;
    cJSON *cfg = NULL;
    bool add_bos = false, add_eos = false;
    st = hf_read_file(path, 0, NULL, &txt, &len, c->err, c->err_len);
    if (st == LLMEM_OK) {
        st = tk_parse_object(path, txt, len, &cfg, c->err, c->err_len);
        free(txt);
        if (st != LLMEM_OK)
            return st;
        const char *bos = token_str(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
        const char *eos = token_str(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
        if ((bos && !(tok->bos_str = strdup(bos))) || (eos && !(tok->eos_str = strdup(eos))))
            goto nomem;
        add_bos = jbool(cfg, "add_bos_token", false);
        add_eos = jbool(cfg, "add_eos_token", false);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
        const cJSON *e;
        if (cJSON_IsArray(ct))
            cJSON_ArrayForEach(e, ct) {
                const char *name = jstr(e, "name");
                if (name && !strcmp(name, "default"))
                    tmpl = jstr(e, "template");
            }
        if (tmpl && !(tok->chat_template = strdup(tmpl)))
            goto nomem;
        cJSON_Delete(cfg);
        cfg = NULL;
    } else if (st != LLMEM_E_NOT_FOUND) {
        return st; /* (err names the file and the fault) */
    }
    if (!tok->chat_template) { /* transformers >= 4.43 may write it apart */
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        size_t n = 0;
        st = hf_read_file(path, 0, NULL, &tok->chat_template, &n, c->err, c->err_len);
        if (st != LLMEM_OK && st != LLMEM_E_NOT_FOUND)
            return st;
        /* transformers reads it as UTF-8 text; a NUL would end llmem's copy */
        size_t bad = tok->chat_template ? tk_utf8_bad_at(tok->chat_template, n) : n;
        size_t nul = tok->chat_template ? strlen(tok->chat_template) : n;
        if (bad < n || nul < n) {
            tk_set_err(c->err, c->err_len, "%s: %s (byte %zu)", path,
                       nul < bad ? "holds a NUL byte" : "not UTF-8", nul < bad ? nul : bad);
            return LLMEM_E_CORRUPT;
        }
    }
    int32_t cfg_bos = lookup(tok, tok->bos_str), cfg_eos = lookup(tok, tok->eos_str);
    if (!has_post) {
        if (add_bos && cfg_bos >= 0 && !ids_append(&tok->prefix, &tok->n_prefix, cfg_bos))
            return LLMEM_E_NO_MEMORY;
        if (add_eos && cfg_eos >= 0 && !ids_append(&tok->suffix, &tok->n_suffix, cfg_eos))
            return LLMEM_E_NO_MEMORY;
    }
    tok->bos = tok->n_prefix ? tok->prefix[0] : cfg_bos;
    tok->eos = cfg_eos >= 0 ? cfg_eos : tok->n_suffix ? tok->suffix[tok->n_suffix - 1] : -1;
    return LLMEM_OK;
nomem:
    cJSON_Delete(cfg);
    return LLMEM_E_NO_MEMORY;
}

static bool eog_name(const char *s)
{
    static const char *names[] = {"<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>", "</s>",
                                  "<|end|>", "<|eom_id|>", "<|end_of_role|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i]))
            return strcmp(s, "<|end_of_role|>") != 0;
    return false;
}

llmem_status llmem_tokenizer_load(const char *path, llmem_tokenizer **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!path || !out) {
        tk_set_err(err, err_len, "tokenizer_load: NULL argument");
        return LLMEM_E_INVALID;
    }
    char file[4096], dir[4096];
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tk_set_err(err, err_len, "%s: no such file or folder", path);
        return LLMEM_E_NOT_FOUND;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
    }
    size_t len = 0;
    char *txt = NULL;
    llmem_status st = hf_read_file(file, 0, NULL, &txt, &len, err, err_len);
    if (st != LLMEM_OK)
        return st;
    cJSON *root = NULL;
    st = tk_parse_object(file, txt, len, &root, err, err_len);
    free(txt);
    if (st != LLMEM_OK)
        return st;
    llmem_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        cJSON_Delete(root);
        return LLMEM_E_NO_MEMORY;
    }
    load_ctx c = {tok, err, err_len};
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if ((st = load_model(&c, root)) || (st = add_norm(&c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) ||
        (st = add_pre(&c, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) ||
        (st = add_dec(&c, cJSON_GetObjectItemCaseSensitive(root, "decoder"))) || (st = add_post(&c, post)) ||
        (st = load_config(&c, dir, post && !cJSON_IsNull(post))))
        goto fail;
    /* normalized added tokens are matched on normalized text */
    for (int k = 0; k < tok->n_added; k++) {
        tk_added *a = &tok->added[k];
        if (!a->normalized)
            continue;
        tk_buf nb = {0};
        if ((st = tk_normalize(tok, a->content, a->len, &nb)))
            goto fail;
        a->norm = nb.p;
        a->norm_len = (uint32_t)nb.n;
    }
    for (int pass = 0; pass < 2; pass++) { /* index by first byte (counting sort) */
        int32_t *start = tok->added_byte_start[pass];
        tok->added_by_byte[pass] = malloc(sizeof(int32_t) * (size_t)(tok->n_added + 1));
        if (!tok->added_by_byte[pass]) {
            st = LLMEM_E_NO_MEMORY;
            goto fail;
        }
        int32_t count[257] = {0};
        for (int k = 0; k < tok->n_added; k++) {
            const tk_added *a = &tok->added[k];
            const char *first = pass ? a->norm : a->content;
            if (a->normalized == (pass == 1) && first && (pass ? a->norm_len : a->len))
                count[(unsigned char)first[0]]++;
        }
        start[0] = 0;
        for (int b = 0; b < 256; b++)
            start[b + 1] = start[b] + count[b];
        int32_t fill[256];
        memcpy(fill, start, sizeof fill);
        for (int k = 0; k < tok->n_added; k++) {
            const tk_added *a = &tok->added[k];
            const char *first = pass ? a->norm : a->content;
            if (a->normalized == (pass == 1) && first && (pass ? a->norm_len : a->len))
                tok->added_by_byte[pass][fill[(unsigned char)first[0]]++] = k;
        }
    }
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if (id == tok->eos || ((tok->flags[id] & TK_F_SPECIAL) && eog_name(tok->piece[id])))
            tok->flags[id] |= TK_F_EOG;
    cJSON_Delete(root);
    *out = tok;
    return LLMEM_OK;
fail:
    if (st == LLMEM_E_NO_MEMORY)
        tk_set_err(err, err_len, "%s: out of memory", file);
    cJSON_Delete(root);
    llmem_tokenizer_destroy(tok);
    return st;
}

void llmem_tokenizer_destroy(llmem_tokenizer *tok)
{
    if (!tok)
        return;
    /* a load that ran out of memory may have one of the two tables only */
    for (int32_t i = 0; (tok->piece || tok->mpiece) && i < tok->n_vocab; i++) {
        char *p = tok->piece ? tok->piece[i] : NULL, *mp = tok->mpiece ? tok->mpiece[i] : NULL;
        if (p != mp)
            free(p);
        free(mp);
    }
    free(tok->piece);
    free(tok->piece_len);
    free(tok->mpiece);
    free(tok->mpiece_len);
    free(tok->flags);
    tk_map_finish(&tok->model);
    tk_map_finish(&tok->all);
    tk_merges_finish(&tok->merges);
    for (int i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].a);
        free(tok->norm[i].b);
    }
    for (int i = 0; i < tok->n_pre; i++)
        pcre2_code_free(tok->pre[i].re);
    for (int i = 0; i < tok->n_dec; i++) {
        free(tok->dec[i].a);
        free(tok->dec[i].b);
    }
    for (int i = 0; tok->added && i < tok->n_added; i++) {
        free(tok->added[i].content);
        free(tok->added[i].norm);
    }
    free(tok->added);
    free(tok->added_by_byte[0]);
    free(tok->added_by_byte[1]);
    free(tok->prefix);
    free(tok->suffix);
    free(tok->bos_str);
    free(tok->eos_str);
    free(tok->chat_template);
    free(tok);
}

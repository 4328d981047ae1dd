/* libFuzzer harness: bytes -> llmem_tokenizer_load on an arbitrary
 * tokenizer.json and tokenizer_config.json, then encoding, decoding and
 * streaming detokenization of arbitrary text with what loaded.
 *
 * Input: split at its first two NUL bytes into tokenizer.json,
 * tokenizer_config.json (not written when that part is missing) and the
 * text; the text's first byte holds the flags (bit 0 add_special, bit 1
 * parse_special, bit 2 keep_special for decoding), the rest is encoded.
 * The files go to a scratch folder and are loaded from there.
 * (tests/tokenizer/fuzz_tokenizer.c fuzzes the text alone on the fixture
 * tokenizers.)
 *
 * Contract checked: nothing crashes, leaks, hangs or hits undefined
 * behaviour; a failed load returns a negative status with a message and no
 * tokenizer. A loaded tokenizer has BOS and EOS in [-1, n_vocab); each id's
 * piece maps back (token_id) to an id with the same piece; encode succeeds
 * with ids in [0, n_vocab); decode succeeds with well-formed UTF-8 (checked
 * by the harness's own UTF-8 reader); the streaming detokenizer's output
 * equals decode (tokenizer.h's promise), on encode's ids and on up to 64
 * ids taken from the text's bytes (runs of byte tokens that end
 * ill-formed, specials anywhere);
 * out-of-range ids are refused by decode and detok_push.
 *
 * Seeds: tests/fuzz/corpus/fuzz_tokenizer_load (the fixtures' tokenizers,
 * vocabularies cut to a few hundred entries, tests/fuzz/make_corpus.py). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_files.h"
#include "fuzz/fuzz_utf8.h"
#include "llmem/tokenizer.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_tokenizer_load: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    abort();
}

/* The detokenizer's whole output for ids, growing its buffer on NO_SPACE. */
static char *detok_all(const llmem_tokenizer *tok, bool keep, const int32_t *ids, int32_t n,
                       size_t *len)
{
    llmem_detok *d = NULL;
    if (llmem_detok_create(tok, keep, &d) != LLMEM_OK)
        die("detok_create failed", NULL);
    size_t cap = 16, total = 0;
    char *buf = malloc(cap), *all = NULL;
    for (int32_t i = 0; i <= n; i++) {
        size_t got = 0;
        llmem_status st;
        for (;;) {
            st = i < n ? llmem_detok_push(d, ids[i], buf, cap, &got)
                       : llmem_detok_flush(d, buf, cap, &got);
            if (st != LLMEM_E_NO_SPACE)
                break;
            if (got <= cap)
                die("detok said NO_SPACE but asked for no more room", NULL);
            cap = got;
            buf = realloc(buf, cap);
        }
        if (st != LLMEM_OK)
            die("detok_push or flush failed on an id in range", NULL);
        all = realloc(all, total + got + 1);
        memcpy(all + total, buf, got);
        total += got;
    }
    llmem_status st = llmem_detok_push(d, llmem_tokenizer_n_vocab(tok), buf, cap, &(size_t){0});
    if (st != LLMEM_E_INVALID)
        die("detok_push took an id out of range", NULL);
    free(buf);
    llmem_detok_destroy(d);
    *len = total;
    return all;
}

/* The detokenizer's whole output for ids must be decode's text dec. */
static void stream_equals_decode(const llmem_tokenizer *tok, bool keep, const int32_t *ids,
                                 int32_t n, const char *dec, size_t dlen, bool trace)
{
    size_t slen = 0;
    char *stream = detok_all(tok, keep, ids, n, &slen);
    if (trace)
        fprintf(stderr, "stream (%zu bytes) [%.*s]\n", slen, (int)slen, stream);
    if (slen != dlen || (dlen && memcmp(stream, dec, dlen)))
        die("the detokenizer's stream differs from decode", NULL);
    free(stream);
}

static void check_tokenizer(const llmem_tokenizer *tok, const uint8_t *text, size_t n)
{
    int32_t nv = llmem_tokenizer_n_vocab(tok);
    int32_t bos = llmem_tokenizer_bos(tok), eos = llmem_tokenizer_eos(tok);
    if (nv < 0 || bos < -1 || bos >= nv || eos < -1 || eos >= nv)
        die("n_vocab, BOS or EOS out of range", NULL);
    for (int32_t id = 0; id < nv && id < 4096; id++) {
        const char *p = llmem_tokenizer_piece(tok, id);
        int32_t back = p ? llmem_tokenizer_token_id(tok, p) : -1;
        if (p && (back < 0 || back >= nv || !llmem_tokenizer_piece(tok, back) ||
                  strcmp(llmem_tokenizer_piece(tok, back), p)))
            die("a piece does not map back to an id of the same piece", p);
    }
    uint8_t flags = n ? text[0] : 0;
    bool add = flags & 1, parse = flags & 2, keep = flags & 4;
    const char *s = n ? (const char *)text + 1 : "";
    size_t sn = n ? n - 1 : 0;
    int32_t *ids = NULL, n_ids = 0;
    char err[512] = "";
    if (llmem_tokenizer_encode(tok, s, sn, add, parse, &ids, &n_ids, err, sizeof err) != LLMEM_OK)
        die("encode failed", err);
    bool trace = getenv("LLMEM_FUZZ_TRACE") != NULL;
    for (int32_t i = 0; i < n_ids; i++) {
        if (trace)
            fprintf(stderr, "%d%s", ids[i], i + 1 < n_ids ? " " : "\n");
        if (ids[i] < 0 || ids[i] >= nv)
            die("encode gave an id out of range", NULL);
    }
    char *dec = NULL;
    size_t dlen = 0;
    if (llmem_tokenizer_decode(tok, ids, n_ids, keep, &dec, &dlen, err, sizeof err) != LLMEM_OK)
        die("decode failed on ids encode gave", err);
    if (trace)
        fprintf(stderr, "decode (%zu bytes) [%.*s]\n", dlen, (int)dlen, dec);
    uint8_t *scratch = malloc(3 * dlen + 4);
    if (strlen(dec) > dlen || !fz_utf8_valid((const uint8_t *)dec, dlen, scratch))
        die("decode is not well-formed UTF-8 of its stated length", NULL);
    free(scratch);
    stream_equals_decode(tok, keep, ids, n_ids, dec, dlen, trace);
    /* ids no encode gives: pairs of the text's bytes, in range */
    int32_t raw[64], n_raw = 0;
    for (size_t i = 0; nv > 0 && i + 1 < n && n_raw < 64; i += 2)
        raw[n_raw++] = (int32_t)(((unsigned)text[i] << 8 | text[i + 1]) % (unsigned)nv);
    char *rdec = NULL;
    size_t rlen = 0;
    llmem_status rs = llmem_tokenizer_decode(tok, raw, n_raw, keep, &rdec, &rlen, err, sizeof err);
    if (rs == LLMEM_OK)
        stream_equals_decode(tok, keep, raw, n_raw, rdec, rlen, trace);
    else if (rs != LLMEM_E_INVALID) /* an id without a piece (a hole) is refused */
        die("decode failed on ids in range", err);
    free(rdec);
    int32_t bad_id = nv;
    char *t2 = NULL;
    size_t l2 = 0;
    if (llmem_tokenizer_decode(tok, &bad_id, 1, true, &t2, &l2, err, sizeof err) != LLMEM_E_INVALID ||
        t2)
        die("decode took an id out of range", NULL);
    free(dec);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1 << 18))
        return 0;
    const uint8_t *part[3];
    size_t len[3];
    int np = fzf_split(data, size, 2, part, len);
    fzf_write("tokenizer.json", part[0], len[0]);
    if (np > 1)
        fzf_write("tokenizer_config.json", part[1], len[1]);
    char path[640], err[512] = "";
    fzf_path(path, sizeof path, "tokenizer.json");
    llmem_tokenizer *tok = (llmem_tokenizer *)&path; /* must be overwritten */
    llmem_status st = llmem_tokenizer_load(path, &tok, err, sizeof err);
    if (st != LLMEM_OK) {
        if (st > 0 || tok || !err[0])
            die("a failed load without a negative status, with a tokenizer or without a message",
                err);
    } else {
        check_tokenizer(tok, np > 2 ? part[2] : NULL, np > 2 ? len[2] : 0);
        llmem_tokenizer_destroy(tok);
    }
    fzf_remove("tokenizer.json");
    fzf_remove("tokenizer_config.json");
    return 0;
}

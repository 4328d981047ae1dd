/* libFuzzer harness: bytes -> llmem_tokenizer_encode / decode / the
 * streaming detokenizer on the fixture tokenizers (tests/fixtures/
 * tokenizers). The first byte picks the tokenizer and the flags; the rest
 * is the text. Checked: encode succeeds, ids are in range, decode is valid
 * UTF-8; for the byte-level gpt2 tokenizer without special-token parsing,
 * decode(encode(x)) equals x with ill-formed UTF-8 replaced by U+FFFD
 * (computed here, independently); the detokenizer's stream equals decode
 * when decode has no U+FFFD. A violation aborts (libFuzzer keeps the input). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmem/tokenizer.h"
#include "tests/fuzz/fuzz_utf8.h"
#include "tests/support/run.h"

static const char *kinds[] = {"gpt2", "llama3", "qwen2", "spm", "metaspace", "falcon", "words"};
static llmem_tokenizer *tok[7];

static void die(const char *what)
{
    fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int k = 0; k < 7; k++) {
        char path[1024], err[256];
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizers/%s", test_source_dir(), kinds[k]);
        if (llmem_tokenizer_load(path, &tok[k], err, sizeof err) != LLMEM_OK)
            die(err);
    }
    const char *dir = getenv("LLMEM_FUZZ_SEED_DIR");
    static const char *seeds[] = {"\x00Hello world, it's <|endoftext|> 123",
                                  "\x03  two  spaces\n\n\ttab \xF0\x9F\x98\x80",
                                  "\x19<s>[INST] x [/INST]\xC3",
                                  "\x0a\xE6\x97\xA5\xE6\x9C\xAC <mask>  <sep>  yes"};
    for (size_t i = 0; dir && i < sizeof seeds / sizeof seeds[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tok_seed_%zu", dir, i);
        FILE *f = fopen(path, "wb");
        if (f) {
            size_t len = strlen(seeds[i] + 1) + 1;
            fwrite(seeds[i], 1, len, f);
            fclose(f);
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    int k = data[0] % 7;
    bool parse = data[0] & 8, add = data[0] & 16;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    int32_t *ids = NULL, n_ids = 0;
    char err[256];
    if (llmem_tokenizer_encode(tok[k], text, n, add, parse, &ids, &n_ids, err, sizeof err) != LLMEM_OK)
        die(err);
    for (int32_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= llmem_tokenizer_n_vocab(tok[k]))
            die("id out of range");
    char *dec = NULL;
    size_t dlen = 0;
    if (llmem_tokenizer_decode(tok[k], ids, n_ids, true, &dec, &dlen, err, sizeof err) != LLMEM_OK)
        die(err);
    uint8_t *chk = malloc(3 * dlen + 4);
    if (!fz_utf8_valid((const uint8_t *)dec, dlen, chk))
        die("decode is not valid UTF-8");
    free(chk);
    if (k == 0 && !parse && !add) {
        uint8_t *want = malloc(3 * n + 4);
        size_t wl = fz_utf8_lossy((const uint8_t *)text, n, want);
        if (wl != dlen || memcmp(want, dec, dlen))
            die("gpt2 decode(encode(x)) != x");
        free(want);
    }
    /* the stream gives what decode gives (tokenizer.h), growing its buffer
     * when a push hands out a long held run */
    llmem_detok *d = NULL;
    if (llmem_detok_create(tok[k], true, &d) != LLMEM_OK)
        die("detok_create");
    char *s = malloc(dlen + 1), *buf = malloc(16);
    size_t o = 0, got, cap = 16;
    for (int32_t i = 0; i <= n_ids; i++) {
        llmem_status st;
        while ((st = i < n_ids ? llmem_detok_push(d, ids[i], buf, cap, &got)
                               : llmem_detok_flush(d, buf, cap, &got)) == LLMEM_E_NO_SPACE) {
            if (got <= cap)
                die("detok said NO_SPACE but asked for no more room");
            buf = realloc(buf, cap = got);
        }
        if (st != LLMEM_OK || o + got > dlen)
            die("detok output longer than decode");
        memcpy(s + o, buf, got);
        o += got;
    }
    if (o != dlen || memcmp(s, dec, dlen))
        die("detok stream != decode");
    free(s);
    free(buf);
    llmem_detok_destroy(d);
    free(dec);
    free(ids);
    return 0;
}

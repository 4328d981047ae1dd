/* UTF-8 helpers of the tokenizer fuzz harnesses (tests/tokenizer/
 * fuzz_tokenizer.c, tests/fuzz/fuzz_tokenizer_load.c), written from the
 * Unicode standard and independent of the tokenizer's own code. */
#ifndef LLMEM_FUZZ_UTF8_H
#define LLMEM_FUZZ_UTF8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* s[0, n) with each maximal ill-formed subsequence replaced by U+FFFD
 * (Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts"),
 * into out (room for 3 * n bytes); returns the bytes written. */
static inline size_t fz_utf8_lossy(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                     : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        size_t k = 1;
        if (len > 1) {
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            while (k < len && i + k < n && s[i + k] >= lo && s[i + k] <= hi) {
                k++;
                lo = 0x80;
                hi = 0xBF;
            }
        }
        if (len && k == len) {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += len ? k : 1;
        }
    }
    return o;
}

/* Whether s[0, n) is well-formed UTF-8 (out: scratch of 3 * n + 4 bytes). */
static inline int fz_utf8_valid(const uint8_t *s, size_t n, uint8_t *scratch)
{
    return fz_utf8_lossy(s, n, scratch) == n && memcmp(scratch, s, n) == 0;
}

#endif

/* llmem tests: little-endian 64-bit fields of state streams
 * (docs/state-format.md), read and written byte by byte so that tests and
 * fuzzers can patch lengths and checksums at any alignment. */
#ifndef LLMEM_TEST_LE64_H
#define LLMEM_TEST_LE64_H

#include <stdint.h>

static inline uint64_t le64_read(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

static inline void le64_write(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

#endif

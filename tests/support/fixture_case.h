/* llmem tests: one case of a transformers fixture folder (tests/fixtures/<name>:
 * cases.jsonl and reference.jsonl, written by tools/make_fixtures.py from a
 * float64 run of the Hugging Face model), shared by the suites that check
 * log-probabilities against it. */
#ifndef LLMEM_TEST_FIXTURE_CASE_H
#define LLMEM_TEST_FIXTURE_CASE_H

#include <stddef.h>
#include <stdint.h>

/* Reads case `id` of the fixture folder dir: its token ids (cases.jsonl
 * "tokens", at most cap into tok) and, when ref is not NULL, the reference
 * log-probabilities (reference.jsonl "logprobs": ref[i] = log p(tok[i + 1] |
 * tok[0..i]), float64, at most cap - 1 into ref). Returns the number of
 * tokens read, or -1 when a file cannot be read or holds no such case (a
 * Check failure is the caller's to raise). */
int32_t fx_case_load(const char *dir, const char *id, int32_t *tok, double *ref, int32_t cap);

/* The whole file at path, NUL-terminated (malloc'd; the caller frees it);
 * *len, when len is not NULL, gets its size in bytes. A file that cannot
 * be read is a Check failure naming it. */
char *fx_read_file(const char *path, size_t *len);

#endif

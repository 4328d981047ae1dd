/* libFuzzer harness: bytes -> llmem_memory_state_read.
 *
 * Input: byte 0 picks the memory (KV cache, recurrent memory, hybrid of
 * both), byte 1 the sequence to read into (-1 .. 2), byte 2 bit 0 asks the
 * harness to repair the section sizes and checksums (so that mutations
 * reach the payload parsers); the rest is the stream. Every memory starts
 * each input from the same content (several sequences, a shared partial
 * page, a pending K-shift, checkpoints).
 *
 * Contract checked: state_read never crashes; llmem_memory_check passes
 * afterwards; a failed read leaves the memory exactly as it was (stream of
 * every sequence and stats); after a successful read the memory writes a
 * stream that reads back, and still plans.
 *
 * Seeds: with LLMEM_FUZZ_SEED_DIR set, LLVMFuzzerInitialize writes valid
 * streams of every memory and sequence there (ctest does). */
#include <stdint.h>
#include <xxhash.h>

#include "fuzz/fuzz_common.h"
#include "support/le64.h"

#define N_SEQ 3

static llmem_memory *mems[3];
static uint8_t *base[3];
static size_t base_n[3];

static void put(llmem_batch_buf *b, int32_t seq, int32_t pos0, int32_t n, int32_t tok0)
{
    for (int32_t j = 0; j < n; j++)
        llmem_batch_buf_add(b, tok0 + j, pos0 + j, &seq, 1, j == n - 1);
}

static void populate(llmem_memory *m)
{
    llmem_batch_buf *b = NULL;
    llmem_batch_buf_create(64, 2, &b);
    put(b, 0, 0, 7, 10);
    put(b, 1, 0, 3, 40);
    if (fz_run(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 3, -1, 0) != LLMEM_OK)
        fz_die("populate: plan failed");
    llmem_batch_buf_clear(b);
    put(b, 0, 7, 2, 20);
    if (fz_run(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, -1, 0) != LLMEM_OK)
        fz_die("populate: plan failed");
    if (llmem_memory_seq_cp(m, 0, 2, -1, -1) != LLMEM_OK ||
        llmem_memory_seq_add(m, 1, 1, -1, 2) != LLMEM_OK)
        fz_die("populate: sequence operations failed");
    llmem_batch_buf_destroy(b);
    fz_check(m, "populate");
}

static uint8_t *write_stream(llmem_memory *m, int32_t seq, size_t *n)
{
    size_t got = 0;
    if (llmem_memory_state_size(m, seq, n) != LLMEM_OK)
        fz_die("state_size failed");
    uint8_t *buf = malloc(*n);
    if (!buf || llmem_memory_state_write(m, seq, buf, *n, &got) != LLMEM_OK || got != *n)
        fz_die("state_write failed");
    return buf;
}

static void setup(void)
{
    if (mems[0])
        return;
    mems[0] = fz_kv(4, 16, N_SEQ, 2);
    mems[1] = fz_rs(N_SEQ, 2, 2);
    mems[2] = fz_hybrid(fz_kv(4, 16, N_SEQ, 2), 2, fz_rs(N_SEQ, 1, 1));
    for (int32_t k = 0; k < 3; k++) {
        populate(mems[k]);
        base[k] = write_stream(mems[k], -1, &base_n[k]);
    }
}

/* Makes section sizes fit the stream and recomputes every checksum
 * (docs/state-format.md). */
static void repair(uint8_t *b, size_t n)
{
    if (n < 24)
        return;
    size_t end = n - 8, at = 16;
    uint32_t ns = (uint32_t)b[12] | (uint32_t)b[13] << 8;
    for (uint32_t i = 0; i < ns && i < 8 && at + 16 <= end; i++) {
        uint64_t len = le64_read(b + at);
        if (len > end - at - 16)
            len = end - at - 16;
        le64_write(b + at, len);
        le64_write(b + at + 8, XXH3_64bits(b + at + 16, (size_t)len));
        at += 16 + (size_t)len;
    }
    le64_write(b + end, XXH3_64bits(b, end));
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setup();
    const char *dir = getenv("LLMEM_FUZZ_SEED_DIR");
    for (int32_t k = 0; dir && k < 3; k++)
        for (int32_t seq = -1; seq < N_SEQ; seq++) {
            size_t n = 0;
            uint8_t *s = write_stream(mems[k], seq, &n);
            for (int mode = 0; mode < 2; mode++) {
                char path[4096];
                snprintf(path, sizeof path, "%s/k%d_s%d_m%d", dir, k, seq, mode);
                FILE *f = fopen(path, "wb");
                uint8_t head[3] = {(uint8_t)k, (uint8_t)(seq + 1), (uint8_t)mode};
                if (f) {
                    fwrite(head, 1, 3, f);
                    fwrite(s, 1, n, f);
                    fclose(f);
                }
            }
            free(s);
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    setup();
    llmem_memory *m = mems[data[0] % 3];
    int32_t seq = (int32_t)(data[1] % (N_SEQ + 1)) - 1;
    char err[256] = "";
    if (llmem_memory_state_read(m, -1, base[data[0] % 3], base_n[data[0] % 3], err,
                                sizeof err) != LLMEM_OK)
        fz_die("cannot restore the base state: %s", err);
    size_t n = size - 3;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 3, n);
    if (data[2] & 1)
        repair(buf, n);
    fz_snap before, after;
    fz_snapshot(m, &before);
    llmem_status st = llmem_memory_state_read(m, seq, buf, n, err, sizeof err);
    fz_check(m, "state_read");
    if (st != LLMEM_OK) {
        fz_snapshot(m, &after);
        fz_same(&before, &after, "a failed state_read");
        fz_snap_free(&after);
    } else {
        /* what was read writes back and reads again, identically */
        fz_snapshot(m, &after);
        if (llmem_memory_state_read(m, -1, after.state, after.n, err, sizeof err) != LLMEM_OK)
            fz_die("a stream just written does not read back: %s", err);
        fz_check(m, "state_read of a written stream");
        fz_snap again;
        fz_snapshot(m, &again);
        if (again.n != after.n || memcmp(again.state, after.state, after.n) != 0)
            fz_die("a written stream reads back differently");
        fz_snap_free(&again);
        fz_snap_free(&after);
        /* and the memory still plans: one token after sequence 0 */
        int32_t pm = llmem_memory_seq_pos_max(m, 0);
        int32_t tok = 5, pos = pm < INT32_MAX - 1 ? pm + 1 : 0, s0 = 0;
        const int32_t *ids = &s0;
        llmem_batch b = {.n_tokens = 1, .token = &tok, .pos = &pos, .seq_id = &ids};
        st = fz_run(m, &b, LLMEM_SPLIT_AUTO, 512, -1, 0);
        if (st != LLMEM_OK && st != LLMEM_E_NO_SPACE && !(st == LLMEM_E_INVALID && pos == 0))
            fz_die("plan after state_read: %s", llmem_status_str(st));
        fz_check(m, "plan after state_read");
    }
    fz_snap_free(&before);
    free(buf);
    return 0;
}

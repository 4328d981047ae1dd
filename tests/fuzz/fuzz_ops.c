/* libFuzzer harness: bytes -> operation sequences on a small hybrid.
 *
 * Byte 0 picks the memory: KV cache + recurrent, two KV caches of other
 * page sizes (prefix hits, copy-on-write in both), or recurrent + KV cache.
 * The rest decodes to up to 64 operations: plans of 1-3 groups of tokens
 * (mostly valid, sometimes perturbed; any split and ubatch size; some
 * ubatches left uncommitted or applied and never committed), seq_rm,
 * seq_cp, seq_keep, seq_add, seq_div, clear, state round trips and damaged
 * state reads.
 *
 * Contract checked after every operation: llmem_memory_check passes, and a
 * failed operation leaves the memory exactly as it was (stream of every
 * sequence and stats). A state round trip restores the sequence. */
#include <stdint.h>

#include "fuzz/fuzz_common.h"

#define N_SEQ 3

typedef struct cursor {
    const uint8_t *d;
    size_t n, i;
} cursor;

static uint8_t next(cursor *c)
{
    return c->i < c->n ? c->d[c->i++] : 0;
}

static llmem_memory *make(uint8_t kind)
{
    switch (kind % 3) {
    case 0: return fz_hybrid(fz_kv(3, 12, N_SEQ, 2), 2, fz_rs(N_SEQ, 2, 1));
    case 1: return fz_hybrid(fz_kv(2, 10, N_SEQ, 2), 2, fz_kv(4, 6, N_SEQ, 1));
    default: return fz_hybrid(fz_rs(N_SEQ, 1, 2), 2, fz_kv(3, 12, N_SEQ, 1));
    }
}

static void after(llmem_memory *m, llmem_status st, fz_snap *before, const char *what)
{
    fz_check(m, what);
    if (st != LLMEM_OK) {
        fz_snap now;
        fz_snapshot(m, &now);
        char where[96];
        snprintf(where, sizeof where, "a failed %s (%s)", what, llmem_status_str(st));
        fz_same(before, &now, where);
        fz_snap_free(&now);
    }
}

static llmem_status op_plan(llmem_memory *m, cursor *c, llmem_batch_buf *bb)
{
    llmem_batch_buf_clear(bb);
    int32_t ng = next(c) % 3 + 1;
    uint8_t flags = 0;
    for (int32_t g = 0; g < ng; g++) {
        flags = next(c);
        int32_t ids[2] = {next(c) % N_SEQ, 0}, n_ids = 1;
        if (flags & 1) {
            ids[1] = (ids[0] + 1 + next(c) % (N_SEQ - 1)) % N_SEQ;
            n_ids = 2;
        }
        int32_t n = next(c) % 10 + 1, pm = llmem_memory_seq_pos_max(m, ids[0]);
        int32_t pos0 = pm >= 0 ? pm + 1 : (flags & 2) ? 0 : next(c) % 8;
        int32_t tok0 = next(c) % 16, step = next(c) % 4;
        if (pos0 > INT32_MAX - 64)
            pos0 = 0;
        for (int32_t j = 0; j < n; j++) {
            int32_t pos = pos0 + j + ((flags & 4) && j == n / 2);
            bool out = (flags & 8) || (g == ng - 1 && j == n - 1);
            llmem_batch_buf_add(bb, (tok0 + j * step) % 32, pos, ids, n_ids, out);
        }
    }
    llmem_split split = (llmem_split)(next(c) % 4) - 1;
    int32_t n_ubatch = (flags & 16) ? 512 : next(c) % 6 + 1;
    int32_t n_commit = (flags & 32) ? next(c) % 4 : -1;
    if (getenv("LLMEM_FUZZ_TRACE")) {
        const llmem_batch *b = llmem_batch_buf_get(bb);
        for (int32_t i = 0; i < b->n_tokens; i++)
            fprintf(stderr, "  [%d] tok %d pos %d seqs %d%s%d\n", i, b->token[i], b->pos[i],
                    b->seq_id[i][0], b->n_seq_id[i] > 1 ? "," : " ",
                    b->n_seq_id[i] > 1 ? b->seq_id[i][1] : -1);
        fprintf(stderr, "  split %d n_ubatch %d commit %d apply_next %d\n", (int)split, n_ubatch,
                n_commit, flags & 64);
    }
    return fz_run(m, llmem_batch_buf_get(bb), split, n_ubatch, n_commit, flags & 64);
}

static llmem_status op_state(llmem_memory *m, cursor *c)
{
    int32_t seq = next(c) % (N_SEQ + 1) - 1, into = seq < 0 ? -1 : next(c) % N_SEQ;
    uint8_t how = next(c);
    size_t n = 0, got = 0;
    if (llmem_memory_state_size(m, seq, &n) != LLMEM_OK)
        fz_die("state_size failed");
    uint8_t *buf = malloc(n + 1);
    if (!buf || llmem_memory_state_write(m, seq, buf, n, &got) != LLMEM_OK || got != n)
        fz_die("state_write failed");
    int32_t len = seq >= 0 ? llmem_memory_seq_len(m, seq) : 0;
    llmem_status st;
    if (how % 3 == 0) { /* damaged: a flipped byte or a truncation must fail */
        size_t at = (size_t)next(c) << 8 | next(c);
        if (how & 4)
            buf[at % n] ^= (uint8_t)(1u << (how >> 5));
        else
            n = at % n;
        st = llmem_memory_state_read(m, into, buf, n, NULL, 0);
        if (st == LLMEM_OK)
            fz_die("state_read accepted a damaged stream");
    } else {
        st = llmem_memory_state_read(m, into, buf, n, NULL, 0);
        if (st != LLMEM_OK && st != LLMEM_E_NO_SPACE)
            fz_die("state_read of a stream just written: %s", llmem_status_str(st));
        if (st == LLMEM_OK && seq >= 0 && llmem_memory_seq_len(m, into) != len)
            fz_die("state round trip: %d tokens became %d", len, llmem_memory_seq_len(m, into));
    }
    free(buf);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static int trace = -1;
    if (trace < 0)
        trace = getenv("LLMEM_FUZZ_TRACE") != NULL;
    cursor c = {data, size, 1};
    llmem_memory *m = make(data[0]);
    llmem_batch_buf *bb = NULL;
    if (llmem_batch_buf_create(64, 2, &bb) != LLMEM_OK)
        fz_die("batch_buf_create failed");
    for (int32_t k = 0; k < 64 && c.i < c.n; k++) {
        fz_snap before;
        fz_snapshot(m, &before);
        uint8_t op = next(&c) % 11;
        int32_t s = next(&c) % (N_SEQ + 1) - 1, t = next(&c) % N_SEQ;
        int32_t p0 = next(&c) % 24 - 1, p1 = next(&c) % 28 - 1;
        llmem_status st;
        const char *what;
        switch (op) {
        case 0: case 1: case 2: st = op_plan(m, &c, bb); what = "plan"; break;
        case 3: st = llmem_memory_seq_rm(m, s, p0, p1); what = "seq_rm"; break;
        case 4: st = llmem_memory_seq_cp(m, s < 0 ? 0 : s, t, p0, p1); what = "seq_cp"; break;
        case 5: st = llmem_memory_seq_keep(m, t); what = "seq_keep"; break;
        case 6:
            st = llmem_memory_seq_add(m, t, p0, p1, (int8_t)next(&c));
            what = "seq_add";
            break;
        case 7: st = llmem_memory_seq_div(m, t, p0, p1, next(&c) % 4); what = "seq_div"; break;
        case 8:
            st = next(&c) % 4 ? LLMEM_OK : llmem_memory_clear(m, p0 & 1);
            what = "clear";
            break;
        default: st = op_state(m, &c); what = "state I/O"; break;
        }
        if (trace)
            fprintf(stderr, "op %d %s s=%d t=%d p0=%d p1=%d -> %s\n", k, what, s, t, p0, p1,
                    llmem_status_str(st));
        after(m, st, &before, what);
        fz_snap_free(&before);
    }
    llmem_batch_buf_destroy(bb);
    llmem_memory_destroy(m);
    return 0;
}

// ctest-labels: core
/* Batch splitting: simple / equal / seq, output ids back to batch order.
 * Each property is checked against the batch itself, token by token. */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "llmem/memory_impl.h"
#include "support/memtest.h"

static llmem_plan *plan_of(llmem_memory *m, const llmem_batch *b, llmem_split split, int32_t n_ub)
{
    llmem_plan *p = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, b, split, n_ub, &p, err, sizeof err) == LLMEM_OK, "%s", err);
    return p;
}

/* Every batch token appears exactly once, in position order per sequence,
 * and out_ids are exactly the tokens with output flags. */
static void check_cover(const llmem_plan *p, const llmem_batch *b, int32_t n_ub)
{
    int32_t *seen = calloc((size_t)b->n_tokens, sizeof *seen);
    int32_t *outs = calloc((size_t)b->n_tokens, sizeof *outs);
    int32_t last_pos[16];
    for (int k = 0; k < 16; k++)
        last_pos[k] = -1;
    for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
        const llmem_ubatch *ub = llmem_plan_ubatch(p, u);
        ck_assert_int_le(ub->n_tokens, n_ub);
        ck_assert_int_ge(ub->n_tokens, 1);
        for (int32_t k = 0; k < ub->n_tokens; k++) {
            int32_t i = ub->batch_idx[k];
            seen[i]++;
            ck_assert_int_eq(ub->token[k], b->token[i]);
            ck_assert_int_eq(ub->pos[k], b->pos[i]);
            int32_t seq = b->seq_id[i][0];
            ck_assert_int_eq(ub->seq_id[ub->seq[k]], seq);
            ck_assert_int_gt(ub->pos[k], last_pos[seq]);
            last_pos[seq] = ub->pos[k];
        }
        for (int32_t o = 0; o < ub->n_outputs; o++) {
            ck_assert_int_eq(ub->batch_idx[ub->out_rows[o]], ub->out_ids[o]);
            outs[ub->out_ids[o]]++;
        }
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        ck_assert_int_eq(seen[i], 1);
        int want = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
        ck_assert_int_eq(outs[i], want);
    }
    free(seen);
    free(outs);
}

/* interleaved batch: seq lengths 5, 2, 7 */
static llmem_batch_buf *interleaved(void)
{
    llmem_batch_buf *b = mt_batch(64, 2);
    const int32_t len[3] = {5, 2, 7};
    int32_t pos[3] = {0, 0, 0};
    for (int32_t round = 0; round < 7; round++)
        for (int32_t s = 0; s < 3; s++)
            if (pos[s] < len[s]) {
                ck_assert_int_eq(llmem_batch_buf_add(b, 10 * s + pos[s], pos[s], &s, 1,
                                                     pos[s] == len[s] - 1 || pos[s] == 1),
                                 LLMEM_OK);
                pos[s]++;
            }
    return b;
}

START_TEST(test_simple)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 32, 3, false, false);
    llmem_batch_buf *bb = interleaved();
    const llmem_batch *b = llmem_batch_buf_get(bb);
    for (int32_t n_ub = 1; n_ub <= 15; n_ub++) {
        llmem_plan *p = plan_of(m, b, LLMEM_SPLIT_SIMPLE, n_ub);
        ck_assert_int_eq(llmem_plan_n_ubatch(p), (14 + n_ub - 1) / n_ub);
        /* simple keeps batch order */
        int32_t next = 0;
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
            const llmem_ubatch *ub = llmem_plan_ubatch(p, u);
            for (int32_t k = 0; k < ub->n_tokens; k++)
                ck_assert_int_eq(ub->batch_idx[k], next++);
        }
        check_cover(p, b, n_ub);
        llmem_plan_info info;
        llmem_plan_get_info(p, &info);
        ck_assert_int_eq(info.n_outputs, 5); /* positions 1 and last: 2 + 1 + 2 */
        ck_assert_int_eq(info.n_tokens, 14);
        llmem_memory_release(m, p);
    }
    mt_free(m, bb, be);
}
END_TEST

START_TEST(test_equal_and_seq)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 32, 3, false, false);
    llmem_batch_buf *bb = interleaved();
    const llmem_batch *b = llmem_batch_buf_get(bb);
    for (int32_t n_ub = 1; n_ub <= 16; n_ub++) {
        llmem_plan *p = plan_of(m, b, LLMEM_SPLIT_EQUAL, n_ub);
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
            const llmem_ubatch *ub = llmem_plan_ubatch(p, u);
            ck_assert_int_eq(ub->n_seqs * ub->n_seq_tokens, ub->n_tokens);
            for (int32_t k = 0; k < ub->n_tokens; k++)
                ck_assert_int_eq(ub->seq[k], k / ub->n_seq_tokens); /* stream-major */
            for (int32_t s = 0; s < ub->n_seqs; s++)
                for (int32_t s2 = 0; s2 < s; s2++)
                    ck_assert_int_ne(ub->seq_id[s], ub->seq_id[s2]);
        }
        check_cover(p, b, n_ub);
        llmem_memory_release(m, p);
        p = plan_of(m, b, LLMEM_SPLIT_SEQ, n_ub);
        for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++)
            ck_assert_int_eq(llmem_plan_ubatch(p, u)->n_seqs, 1);
        ck_assert_int_ge(llmem_plan_n_ubatch(p), 3);
        check_cover(p, b, n_ub);
        llmem_memory_release(m, p);
    }
    /* with room for everything: equal needs 3 ubatches (2, then 3, then 2
     * tokens per stream for lengths 5, 2, 7 -> min-length groups) */
    llmem_plan *p = plan_of(m, b, LLMEM_SPLIT_EQUAL, 64);
    ck_assert_int_eq(llmem_plan_n_ubatch(p), 3);
    ck_assert_int_eq(llmem_plan_ubatch(p, 0)->n_seqs, 3);
    ck_assert_int_eq(llmem_plan_ubatch(p, 0)->n_seq_tokens, 2);
    ck_assert_int_eq(llmem_plan_ubatch(p, 1)->n_seqs, 2);
    ck_assert_int_eq(llmem_plan_ubatch(p, 1)->n_seq_tokens, 3);
    ck_assert_int_eq(llmem_plan_ubatch(p, 2)->n_seqs, 1);
    ck_assert_int_eq(llmem_plan_ubatch(p, 2)->n_seq_tokens, 2);
    llmem_memory_release(m, p);
    mt_free(m, bb, be);
}
END_TEST

START_TEST(test_default_output_and_embd)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_kv(be, 4, 8, 1, false, false);
    int32_t pos[3] = {0, 1, 2};
    float embd[3 * 2] = {1, 2, 3, 4, 5, 6};
    llmem_batch b = {.n_tokens = 3, .embd = embd, .n_embd = 2, .pos = pos};
    llmem_plan *p = plan_of(m, &b, LLMEM_SPLIT_AUTO, 2);
    ck_assert_int_eq(llmem_plan_n_ubatch(p), 2);
    const llmem_ubatch *u1 = llmem_plan_ubatch(p, 1);
    ck_assert_ptr_null(u1->token);
    ck_assert_int_eq(u1->n_outputs, 1);
    ck_assert_int_eq(u1->out_ids[0], 2);
    ck_assert_float_eq(u1->embd[0], 5.0f);
    ck_assert_int_eq(llmem_plan_ubatch(p, 0)->n_outputs, 0);
    llmem_memory_release(m, p);
    /* token ids and embeddings together are refused */
    int32_t tok[3] = {1, 2, 3};
    b.token = tok;
    char err[128];
    ck_assert_int_eq(llmem_memory_plan(m, &b, LLMEM_SPLIT_AUTO, 2, &p, err, sizeof err), LLMEM_E_INVALID);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* The plan's sequence list (llmem_plan.seqs) and its lookup at n_seq_max
 * 65,536 (a hash) and 1,024 (a table by id), for batches naming 300
 * scattered sequences out of order (some tokens in two of them), checked
 * against a dense per-id reference the test builds from the batch; then
 * three plans in flight at once (one per memory; a second on the same
 * memory is refused and changes nothing) whose ubatches are applied and
 * committed interleaved. */
enum { PS_MAX = 65536, PS_N = 300 };

typedef struct ps_ref {
    int32_t n_new[PS_MAX], first_pos[PS_MAX], tok[PS_MAX][8];
} ps_ref;

static uint32_t ps_rand(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* A batch of PS_N fresh sequences (ids scattered, tokens interleaved at
 * random; every 7th token of a pair of sequences also counts for the next
 * sequence in line, when both are at the same position). */
static void ps_batch(llmem_batch_buf *bb, ps_ref *r, const int32_t *ids, uint32_t seed)
{
    int32_t len[PS_N], at[PS_N] = {0};
    int32_t left = 0;
    memset(r->n_new, 0, sizeof r->n_new);
    for (int32_t k = 0; k < PS_MAX; k++)
        r->first_pos[k] = -1;
    for (int32_t k = 0; k < PS_N; k++)
        left += len[k] = 1 + (int32_t)(ps_rand(&seed) % 6);
    while (left > 0) {
        int32_t k = (int32_t)(ps_rand(&seed) % PS_N);
        if (at[k] == len[k])
            continue;
        int32_t set[2] = {ids[k], -1}, n = 1;
        if (k % 7 == 0 && k + 1 < PS_N && at[k + 1] == at[k] && at[k + 1] < len[k + 1]) {
            set[n++] = ids[k + 1];
            at[k + 1]++;
            left--;
        }
        int32_t tok = (int32_t)(ps_rand(&seed) % 50000), pos = at[k]++;
        left--;
        ck_assert_int_eq(llmem_batch_buf_add(bb, tok, pos, set, n, at[k] == len[k]), LLMEM_OK);
        for (int32_t j = 0; j < n; j++) {
            int32_t s = set[j];
            if (r->first_pos[s] < 0)
                r->first_pos[s] = pos;
            r->tok[s][r->n_new[s]++] = tok;
        }
    }
}

static void ps_check(const llmem_plan *p, const ps_ref *r)
{
    int32_t n = 0;
    for (int32_t s = 0; s < PS_MAX; s++) {
        const llmem_plan_seq *e = llmem_plan_seq_find(p, s);
        if (!r->n_new[s]) {
            ck_assert_ptr_null(e);
            continue;
        }
        n++;
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->id, s);
        ck_assert_int_eq(e->n_new, r->n_new[s]);
        ck_assert_int_eq(e->first_pos, r->first_pos[s]);
        ck_assert_int_eq(e->n_cached, 0);
        ck_assert_int_eq(llmem_plan_seq_index(p, s), (int32_t)(e - p->seqs));
        for (int32_t j = 0; j < e->n_new; j++)
            ck_assert_int_eq(p->seq_tokens[e - p->seqs][j], r->tok[s][j]);
    }
    ck_assert_int_eq(p->n_seqs, n);
    for (int32_t k = 1; k < p->n_seqs; k++)
        ck_assert_int_lt(p->seqs[k - 1].id, p->seqs[k].id);
    ck_assert_ptr_null(p->snap_at);
    ck_assert_ptr_null(llmem_plan_seq_find(p, -1));
    ck_assert_ptr_null(llmem_plan_seq_find(p, PS_MAX));
}

START_TEST(test_plan_seqs)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv = mt_kv(be, 4, 2048, PS_MAX, false, false);
    llmem_memory *rs = mt_rs(be, PS_MAX, 1);
    llmem_memory *kc = mt_kv(be, 4, 2048, 1024, false, false);
    ps_ref *ra = malloc(sizeof *ra), *rb = malloc(sizeof *rb), *rc = malloc(sizeof *rc);
    int32_t ids_a[PS_N], ids_b[PS_N], ids_c[PS_N];
    uint32_t x = 12345;
    for (int32_t k = 0; k < PS_N; k++) { /* distinct: k picks its own residue */
        ids_a[k] = (int32_t)((ps_rand(&x) % (PS_MAX / PS_N)) * PS_N + (uint32_t)k);
        ids_b[k] = PS_MAX - 1 - ids_a[k];
        ids_c[k] = (k * 7 + 500) % 1024;
    }
    llmem_batch_buf *ba, *bb, *bc;
    ck_assert_int_eq(llmem_batch_buf_create(4096, 2, &ba), LLMEM_OK);
    ck_assert_int_eq(llmem_batch_buf_create(4096, 2, &bb), LLMEM_OK);
    ck_assert_int_eq(llmem_batch_buf_create(4096, 2, &bc), LLMEM_OK);
    ps_batch(ba, ra, ids_a, 7);
    ps_batch(bb, rb, ids_b, 8);
    ps_batch(bc, rc, ids_c, 9);
    llmem_plan *pa = plan_of(kv, llmem_batch_buf_get(ba), LLMEM_SPLIT_SIMPLE, 64);
    ck_assert_int_gt(pa->seq_map_bits, 0);
    ps_check(pa, ra);
    llmem_plan *pc = plan_of(kc, llmem_batch_buf_get(bc), LLMEM_SPLIT_SIMPLE, 64);
    ck_assert_int_eq(pc->seq_map_bits, 0);
    ps_check(pc, rc);
    /* one plan per memory: a second is refused and leaves the first as it was */
    llmem_plan *px = NULL;
    char err[256] = "";
    ck_assert_int_eq(llmem_memory_plan(kv, llmem_batch_buf_get(bb), LLMEM_SPLIT_SIMPLE, 64, &px,
                                       err, sizeof err),
                     LLMEM_E_BUSY);
    ck_assert_ptr_null(px);
    ps_check(pa, ra);
    /* the recurrent memory needs one set per sequence (the equal split):
     * its batch has each sequence alone */
    llmem_batch_buf_clear(bb);
    for (int32_t k = PS_N - 1; k >= 0; k--)
        for (int32_t t = 0; t < 1 + k % 3; t++)
            ck_assert_int_eq(llmem_batch_buf_add(bb, k + t, t, &ids_b[k], 1, true), LLMEM_OK);
    memset(rb->n_new, 0, sizeof rb->n_new);
    for (int32_t k = 0; k < PS_N; k++) {
        rb->n_new[ids_b[k]] = 1 + k % 3;
        rb->first_pos[ids_b[k]] = 0;
        for (int32_t t = 0; t < 1 + k % 3; t++)
            rb->tok[ids_b[k]][t] = k + t;
    }
    llmem_plan *pb = plan_of(rs, llmem_batch_buf_get(bb), LLMEM_SPLIT_AUTO, 64);
    ps_check(pb, rb);
    ps_check(pa, ra);
    int32_t na = llmem_plan_n_ubatch(pa), nb = llmem_plan_n_ubatch(pb);
    int32_t nc = llmem_plan_n_ubatch(pc);
    for (int32_t u = 0; u < na || u < nb || u < nc; u++) {
        const llmem_ubatch *ub;
        if (u < nc) {
            ck_assert_int_eq(llmem_memory_apply(kc, pc, u, &ub), LLMEM_OK);
            ck_assert_int_eq(llmem_memory_commit(kc, pc, u), LLMEM_OK);
        }
        if (u < na) {
            ck_assert_int_eq(llmem_memory_apply(kv, pa, u, &ub), LLMEM_OK);
            ck_assert_int_eq(llmem_memory_commit(kv, pa, u), LLMEM_OK);
        }
        if (u < nb) {
            ck_assert_int_eq(llmem_memory_apply(rs, pb, u, &ub), LLMEM_OK);
            ck_assert_int_eq(llmem_memory_commit(rs, pb, u), LLMEM_OK);
        }
    }
    ps_check(pa, ra);
    ps_check(pc, rc);
    llmem_memory_release(rs, pb);
    llmem_memory_release(kv, pa);
    llmem_memory_release(kc, pc);
    for (int32_t s = 0; s < PS_MAX; s++) {
        ck_assert_int_eq(llmem_memory_seq_pos_max(kv, s), ra->n_new[s] - 1);
        ck_assert_int_eq(llmem_memory_seq_pos_max(rs, s), rb->n_new[s] - 1);
        if (s < 1024)
            ck_assert_int_eq(llmem_memory_seq_pos_max(kc, s), rc->n_new[s] - 1);
    }
    ck_assert_int_eq(llmem_memory_check(kv, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_check(rs, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_check(kc, err, sizeof err), LLMEM_OK);
    free(ra);
    free(rb);
    free(rc);
    llmem_batch_buf_destroy(ba);
    llmem_batch_buf_destroy(bb);
    llmem_batch_buf_destroy(bc);
    llmem_memory_destroy(kv);
    llmem_memory_destroy(rs);
    llmem_memory_destroy(kc);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_simple);
    tcase_add_test(tc, test_equal_and_seq);
    tcase_add_test(tc, test_default_output_and_embd);
    tcase_add_test(tc, test_plan_seqs);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}

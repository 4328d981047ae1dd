// ctest-labels: core
/* A plan abandoned after apply (plan, apply, forward pass, release with no
 * commit to a sequence) leaves that sequence as it was, also when its last
 * page is partly written and shared with another sequence, so that apply
 * made a private copy of it (copy-on-write): the copy is given back, the
 * shared page named again. Checked for the paged KV cache alone and inside
 * a hybrid, at page sizes 1, 16 and 5, for pages shared by seq_cp (a fork)
 * and by a prefix-cache hit: pages used, free and cached, every page table,
 * and the serialized state bytes must equal what they were before the
 * plan. The expected sharing (which entries two tables have in common, how
 * many pages a sequence holds) is derived by hand from the page size; a
 * committed append afterwards must change those same figures (the checks
 * can fail). */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "support/kv_test.h"
#include "support/memtest.h"

enum { N_SEQ = 3, MAX_PT = 64 };

static const int32_t page_sizes[] = {1, 16, 5};

/* What must survive an abandoned plan. */
typedef struct held {
    int32_t n_pt[N_SEQ], pt[N_SEQ][MAX_PT];
    int64_t used, free, cached, cows;
    unsigned char *state[N_SEQ + 1]; /* [0]: every sequence, [1 + s]: sequence s */
    size_t state_n[N_SEQ + 1];
} held;

static unsigned char *state_bytes(llmem_memory *m, int32_t seq, size_t *n)
{
    ck_assert_int_eq(llmem_memory_state_size(m, seq, n), LLMEM_OK);
    unsigned char *buf = malloc(*n ? *n : 1);
    ck_assert_ptr_nonnull(buf);
    size_t w = 0;
    ck_assert_int_eq(llmem_memory_state_write(m, seq, buf, *n, &w), LLMEM_OK);
    ck_assert_uint_eq(w, *n);
    return buf;
}

/* m: the memory planned on; kv: its KV cache (m itself or its child). */
static void hold(llmem_memory *m, llmem_memory *kv, held *h)
{
    memset(h, 0, sizeof *h);
    for (int32_t s = 0; s < N_SEQ; s++) {
        h->n_pt[s] = llmem_kv_cache_page_table(kv, s, h->pt[s], MAX_PT);
        ck_assert_int_le(h->n_pt[s], MAX_PT);
    }
    llmem_memory_stats st;
    ck_assert_int_eq(llmem_memory_get_stats(kv, &st), LLMEM_OK);
    h->used = st.pages_used;
    h->free = st.pages_free;
    h->cached = st.pages_cached;
    h->cows = st.cow_copies;
    for (int32_t s = -1; s < N_SEQ; s++)
        h->state[s + 1] = state_bytes(m, s, &h->state_n[s + 1]);
}

static void unhold(held *h)
{
    for (int32_t i = 0; i <= N_SEQ; i++)
        free(h->state[i]);
}

/* Sequences in `same` (a bit per sequence; bit N_SEQ: the whole state)
 * must be as in a; the page counts too when `pages`. */
static void assert_kept(const held *a, const held *b, unsigned same, bool pages, const char *what)
{
    if (pages) {
        ck_assert_msg(a->used == b->used && a->free == b->free && a->cached == b->cached &&
                          a->cows == b->cows,
                      "%s: pages used/free/cached, copies %lld/%lld/%lld, %lld before, "
                      "%lld/%lld/%lld, %lld after",
                      what, (long long)a->used, (long long)a->free, (long long)a->cached,
                      (long long)a->cows, (long long)b->used, (long long)b->free,
                      (long long)b->cached, (long long)b->cows);
    }
    for (int32_t s = 0; s < N_SEQ; s++) {
        if (!(same & (1u << s)))
            continue;
        ck_assert_msg(a->n_pt[s] == b->n_pt[s], "%s: sequence %d held %d pages, now %d", what, s,
                      a->n_pt[s], b->n_pt[s]);
        for (int32_t k = 0; k < a->n_pt[s]; k++)
            ck_assert_msg(a->pt[s][k] == b->pt[s][k], "%s: sequence %d entry %d: page %d, now %d",
                          what, s, k, a->pt[s][k], b->pt[s][k]);
        ck_assert_msg(a->state_n[s + 1] == b->state_n[s + 1] &&
                          memcmp(a->state[s + 1], b->state[s + 1], a->state_n[s + 1]) == 0,
                      "%s: sequence %d's serialized state changed", what, s);
    }
    if (same & (1u << N_SEQ))
        ck_assert_msg(a->state_n[0] == b->state_n[0] &&
                          memcmp(a->state[0], b->state[0], a->state_n[0]) == 0,
                      "%s: the serialized state changed", what);
}

/* Memory under test: a KV cache of page size ps (1 layer, f32, 256 pages,
 * prefix cache on, poisoned), alone or as layer 0 of a hybrid whose layer
 * 1 is a recurrent memory of one 4-float state per sequence. */
static llmem_memory *make(llmem_backend *be, int32_t ps, bool hybrid, llmem_memory **kv)
{
    *kv = mt_kv(be, ps, 256, N_SEQ, true, true);
    if (!hybrid)
        return *kv;
    llmem_memory *children[2] = {*kv, mt_rs(be, N_SEQ, 2)}, *h = NULL;
    const int32_t map[2] = {0, 1};
    char err[256] = "";
    ck_assert_msg(llmem_hybrid_create(children, 2, map, 2, &h, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    return h;
}

static int32_t pages_for(int32_t len, int32_t ps)
{
    return (len + ps - 1) / ps;
}

/* One abandoned step: b is planned in ubatches of n_ub tokens; ubatches
 * [0, n_commit) are applied, written and committed (each must hold only
 * sequence 0's tokens), then the next one (if any) is applied and
 * written; then the plan is released. */
static void abandon(llmem_memory *m, llmem_batch_buf *b, int32_t n_ub, int32_t n_commit)
{
    llmem_plan *plan = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, n_ub, &plan, err,
                                    sizeof err) == LLMEM_OK,
                  "%s", err);
    int32_t n = llmem_plan_n_ubatch(plan);
    for (int32_t i = 0; i <= n_commit && i < n; i++) {
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(m, plan, i, &ub), LLMEM_OK);
        write_tokens(m, ub, NULL);
        mt_assert_check(m);
        if (i < n_commit) {
            ck_assert_int_eq(ub->n_seqs, 1);
            ck_assert_int_eq(ub->seq_id[0], 0);
            ck_assert_int_eq(llmem_memory_commit(m, plan, i), LLMEM_OK);
        }
    }
    llmem_memory_release(m, plan);
    mt_assert_check(m);
}

static bool same_bytes(const held *a, const held *b, int32_t i)
{
    return a->state_n[i] == b->state_n[i] && memcmp(a->state[i], b->state[i], a->state_n[i]) == 0;
}

/* The abandoned steps on sequences 1 and 2, which hold len1 and len
 * tokens and share sequence 2's last page (partly written when len % ps
 * != 0); sequence 0 holds len0 tokens of its own. */
static void abandon_all(llmem_memory *m, llmem_memory *kv, llmem_batch_buf *b, int32_t ps,
                        int32_t len1, int32_t len, int32_t len0)
{
    held h0, h1;
    hold(m, kv, &h0);
    const unsigned all = (1u << N_SEQ) | 7u;
    /* one token onto sequence 2 */
    llmem_batch_buf_clear(b);
    mt_add(b, 2, len, 1, 500, true);
    abandon(m, b, 512, 0);
    hold(m, kv, &h1);
    assert_kept(&h0, &h1, all, true, "1 token");
    unhold(&h1);
    /* past the next page boundary, in one ubatch */
    llmem_batch_buf_clear(b);
    mt_add(b, 2, len, ps + 2, 600, true);
    abandon(m, b, 512, 0);
    hold(m, kv, &h1);
    assert_kept(&h0, &h1, all, true, "ps + 2 tokens");
    unhold(&h1);
    /* both sharers at once: two copies of one page */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, len1, 1, 700, true);
    mt_add(b, 2, len, 1, 710, true);
    abandon(m, b, 512, 0);
    hold(m, kv, &h1);
    assert_kept(&h0, &h1, all, true, "both sharers");
    unhold(&h1);
    /* a step whose first ubatch (sequence 0) commits and whose second
     * (sequence 2) is only applied: sequences 1 and 2 are as before,
     * sequence 0 one token longer (a page more when len0 filled its last) */
    llmem_batch_buf_clear(b);
    mt_add(b, 0, len0, 1, 800, true);
    mt_add(b, 2, len, 1, 810, true);
    abandon(m, b, 1, 1);
    hold(m, kv, &h1);
    assert_kept(&h0, &h1, 6u, false, "sequence 0 committed, 2 abandoned");
    ck_assert_int_eq(h1.n_pt[0], pages_for(len0 + 1, ps));
    ck_assert_int_eq(h1.used - h0.used, pages_for(len0 + 1, ps) - pages_for(len0, ps));
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), len0 + 1);
    ck_assert(!same_bytes(&h0, &h1, 1));
    unhold(&h1);
    unhold(&h0);
    /* the control: a committed append to sequence 2 does change its table
     * (a page of its own: the copy, or a new one when the last was full) */
    hold(m, kv, &h0);
    llmem_batch_buf_clear(b);
    mt_add(b, 2, len, 1, 900, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    hold(m, kv, &h1);
    ck_assert_int_eq(h1.used, h0.used + 1);
    ck_assert_int_eq(h1.n_pt[2], pages_for(len + 1, ps));
    ck_assert_int_ne(h1.pt[2][h1.n_pt[2] - 1], h0.pt[1][pages_for(len, ps) - 1]);
    ck_assert(!same_bytes(&h0, &h1, 0));
    ck_assert(same_bytes(&h0, &h1, 2)); /* sequence 1 */
    unhold(&h1);
    unhold(&h0);
    mt_assert_check(m);
}

/* Sequence 0 takes a prompt of len0 tokens of its own, sequence 1 a prompt
 * of len tokens, and sequence 2 is forked from 1 (seq_cp: every page
 * shared, the last partly written unless ps divides len). */
START_TEST(test_abandon_forked)
{
    int32_t ps = page_sizes[_i % 3];
    bool hybrid = _i >= 3;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *kv = NULL, *m = make(be, ps, hybrid, &kv);
    int32_t len = 2 * ps + (ps + 1) / 2, len0 = ps + 1;
    mt_add(b, 0, 0, len0, 300, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, len, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 1, 2, -1, -1), LLMEM_OK);
    int32_t a[MAX_PT], c[MAX_PT], n = pages_for(len, ps);
    ck_assert_int_eq(llmem_kv_cache_page_table(kv, 1, a, MAX_PT), n);
    ck_assert_int_eq(llmem_kv_cache_page_table(kv, 2, c, MAX_PT), n);
    for (int32_t k = 0; k < n; k++)
        ck_assert_int_eq(a[k], c[k]);
    llmem_memory_stats st;
    llmem_memory_get_stats(kv, &st);
    ck_assert_int_eq(st.pages_used, n + pages_for(len0, ps));
    abandon_all(m, kv, b, ps, len, len, len0);
    mt_free(m, b, be);
}
END_TEST

/* Sequence 2 gets sequence 1's 2 * ps published prompt tokens from the
 * prefix cache (one more token computed), then is cut back into the
 * middle of its second page (ps > 1), which stays shared with sequence 1
 * and published: the copy-on-write case of a prefix hit. KV cache alone (a
 * hybrid cuts its recurrent child only at checkpoints). */
START_TEST(test_abandon_prefix_hit)
{
    int32_t ps = page_sizes[_i];
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *kv = NULL, *m = make(be, ps, false, &kv);
    int32_t len1 = 2 * ps, len0 = ps + 1;
    mt_add(b, 0, 0, len0, 300, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, len1, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 2, 0, len1 + 1, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_tokens, NULL, NULL), LLMEM_OK);
    int32_t a[MAX_PT], c[MAX_PT];
    ck_assert_int_eq(llmem_kv_cache_page_table(kv, 1, a, MAX_PT), 2);
    ck_assert_int_eq(llmem_kv_cache_page_table(kv, 2, c, MAX_PT), 3);
    ck_assert_int_eq(c[0], a[0]);
    ck_assert_int_eq(c[1], a[1]);
    int32_t len = ps > 1 ? 2 * ps - 2 : 1;
    ck_assert_int_eq(llmem_memory_seq_rm(m, 2, len, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_kv_cache_page_table(kv, 2, c, MAX_PT), pages_for(len, ps));
    ck_assert_int_eq(c[pages_for(len, ps) - 1], a[pages_for(len, ps) - 1]);
    abandon_all(m, kv, b, ps, len1, len, len0);
    mt_free(m, b, be);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kv_abandon");
    TCase *tc = tcase_create("abandon");
    tcase_add_loop_test(tc, test_abandon_forked, 0, 6);
    tcase_add_loop_test(tc, test_abandon_prefix_hit, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run_suite(suite()) ? EXIT_FAILURE : EXIT_SUCCESS;
}

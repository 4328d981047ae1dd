// ctest-labels: core
/* A device copy that fails inside a commit (llmem_backend_set_copy_hook:
 * the CPU backend refuses a copy having written nothing, as a lost GPU
 * reports one).
 *  - A recurrent memory's stream copies (the state a stream computed,
 *    copied to the other sequences that share its tokens) run before the
 *    commit changes anything (commit_prepare), on every child of a hybrid
 *    before any child commits: the commit returns LLMEM_E_BACKEND and the
 *    memory is as it was (every sequence's tokens and positions, the
 *    stats, the serialized state of every sequence, i.e. the bytes of the
 *    states it holds, and llmem_memory_check), before and after the plan's
 *    release; the same batch then commits. The hybrid used to commit its
 *    KV child first, which kept the tokens of a step whose recurrent child
 *    then failed; a second recurrent child failing after the first copied
 *    must not leave the first one's copies over a state a sequence holds.
 *  - A snapshot copy (the state after a prompt, published for prefix
 *    reuse) that fails drops the snapshot (a cache entry), the commit
 *    stands, and stats.snapshot_copy_failures counts it; the next prompt
 *    publishes again and a later request reuses it.
 * States are checked by value: the test's forward pass writes a
 * sequence's state as {tokens, sum of its token ids, layer + 1}, and a
 * probe (a planned, applied, released decode step) reads the state a
 * sequence's next step would start from. */
#include "support/memtest.h"
#include "support/run.h"
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/hybrid.h"
#include "llmem/recurrent.h"

#define N_SEQ 4

typedef struct hook {
    int32_t calls;   /* copies seen */
    int32_t fail_at; /* the first that fails; < 0: none */
    int32_t failed;  /* copies refused */
} hook;

static bool hook_fn(size_t size, void *ctx)
{
    hook *h = ctx;
    (void)size;
    bool ok = h->fail_at < 0 || h->calls < h->fail_at;
    h->calls++;
    h->failed += !ok;
    return ok;
}

static llmem_memory *rs_make(llmem_backend *be, int32_t n_snapshots)
{
    llmem_recurrent_params p = mt_rs_params(N_SEQ, 1);
    p.n_snapshots = n_snapshots;
    p.poison = true;
    return mt_rs_create(be, &p);
}

/* kinds: 'k' a KV cache (pages of 4), 'r' a recurrent memory; one layer
 * each, in that order. */
static llmem_memory *make(llmem_backend *be, const char *kinds, int32_t n_snapshots)
{
    int32_t n = (int32_t)strlen(kinds);
    if (n == 1)
        return kinds[0] == 'r' ? rs_make(be, n_snapshots) : mt_kv(be, 4, 64, N_SEQ, true, true);
    llmem_memory *children[4];
    int32_t map[4];
    for (int32_t c = 0; c < n; c++) {
        children[c] =
            kinds[c] == 'r' ? rs_make(be, n_snapshots) : mt_kv(be, 4, 64, N_SEQ, true, true);
        map[c] = c;
    }
    llmem_memory *h = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_hybrid_create(children, n, map, n, &h, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    return h;
}

/* The forward pass of every recurrent layer: the state after L tokens of
 * a history with token-id sum S is {L, S, layer + 1, 0}, from the state
 * the view's src slot holds (zero for -1), checkpoints included. */
static void forward(llmem_memory *mem, const llmem_ubatch *ub, void *ctx)
{
    (void)ctx;
    for (int32_t il = 0; il < llmem_memory_n_layers(mem); il++) {
        llmem_view v;
        ck_assert_int_eq(llmem_memory_view(mem, il, &v), LLMEM_OK);
        const llmem_rs_view *r = llmem_view_rs(&v);
        if (!r)
            continue;
        int32_t T = r->n_seq_tokens, nc = r->n_ckpt > 0 ? r->n_ckpt - 1 : 0;
        for (int32_t s = 0; s < r->n_seqs; s++) {
            float f[4] = {0};
            int32_t src = r->src_slot.host[s];
            if (src >= 0)
                ck_assert_int_eq(llmem_buffer_download(r->state[0], (size_t)src * 16, f, 16),
                                 LLMEM_OK);
            for (int32_t t = 1; t <= T; t++) {
                f[0] += 1.0f;
                f[1] += (float)ub->token[s * T + t - 1];
                f[2] = (float)(il + 1);
                int32_t slot = t == T ? r->dst_slot.host[s]
                               : t >= T - nc ? r->ckpt_slot.host[s * r->n_ckpt + t - (T - nc)]
                                             : -1;
                if (slot >= 0)
                    ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)slot * 16, f, 16),
                                     LLMEM_OK);
            }
        }
    }
}

/* Asserts that the state seq's next step starts from, in every recurrent
 * layer, is {len, sum, layer + 1}: plans a one-token step, applies it,
 * reads the src slots, and releases it (nothing committed). */
static void probe(llmem_memory *m, int32_t seq, int32_t len, float sum)
{
    llmem_batch_buf *b = mt_batch_new();
    mt_add(b, seq, len, 1, 9999, true);
    llmem_plan *plan = NULL;
    const llmem_ubatch *ub = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan, err,
                                    sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(llmem_memory_apply(m, plan, 0, &ub), LLMEM_OK);
    for (int32_t il = 0; il < llmem_memory_n_layers(m); il++) {
        llmem_view v;
        ck_assert_int_eq(llmem_memory_view(m, il, &v), LLMEM_OK);
        const llmem_rs_view *r = llmem_view_rs(&v);
        if (!r)
            continue;
        ck_assert_int_eq(r->n_seqs, 1);
        float f[4];
        mt_rs_src_state(r, 0, false, f);
        ck_assert_msg(f[0] == (float)len && f[1] == sum && f[2] == (float)(il + 1),
                      "sequence %d layer %d: state {%g, %g, %g}, expected {%d, %g, %d}", seq, il,
                      (double)f[0], (double)f[1], (double)f[2], len, (double)sum, il + 1);
    }
    llmem_memory_release(m, plan);
    llmem_batch_buf_destroy(b);
}

/* Everything a sequence reader sees, plus the serialized state and the
 * page and slot counts (not while a plan is in flight: state I/O waits for
 * its release, and its reservations count as used). */
typedef struct seen {
    mt_snap snap;
    unsigned char *state;
    size_t n_state;
} seen;

static void see(llmem_memory *m, seen *s, bool state)
{
    mt_snapshot(m, &s->snap);
    s->state = NULL;
    s->n_state = 0;
    if (!state)
        return;
    ck_assert_int_eq(llmem_memory_state_size(m, -1, &s->n_state), LLMEM_OK);
    s->state = malloc(s->n_state);
    ck_assert_ptr_nonnull(s->state);
    ck_assert_int_eq(llmem_memory_state_write(m, -1, s->state, s->n_state, NULL), LLMEM_OK);
}

static void assert_unchanged(llmem_memory *m, const seen *before, bool state)
{
    seen now;
    see(m, &now, state);
    for (int32_t q = 0; q < N_SEQ; q++) {
        ck_assert_int_eq(now.snap.len[q], before->snap.len[q]);
        ck_assert_int_eq(now.snap.pmin[q], before->snap.pmin[q]);
        ck_assert_int_eq(now.snap.pmax[q], before->snap.pmax[q]);
        ck_assert_mem_eq(now.snap.tok[q], before->snap.tok[q], sizeof now.snap.tok[q]);
    }
    ck_assert_int_eq(now.snap.stats.snapshots, before->snap.stats.snapshots);
    ck_assert_int_eq(now.snap.stats.prefix_hit_tokens, before->snap.stats.prefix_hit_tokens);
    ck_assert_int_eq(now.snap.stats.n_seqs_live, before->snap.stats.n_seqs_live);
    if (state) {
        /* the plan's reservations are gone */
        mt_assert_same(&before->snap, &now.snap);
        ck_assert_uint_eq(now.n_state, before->n_state);
        ck_assert_msg(memcmp(now.state, before->state, now.n_state) == 0,
                      "the serialized state changed (%zu bytes)", now.n_state);
    }
    free(now.state);
    mt_assert_check(m);
}

/* Sequences 0 and 1 hold the same 8 tokens (100..107; 1 by seq_cp: two
 * whole pages, so that the step copies no page on write), 2 and 3 are
 * empty. The step: token 200 for 0 and 1 (one stream: 1 gets a
 * copy of 0's new state), token 300 for 2 and 3 (a new stream). The
 * fail_at-th copy of its commit fails (0: the first). */
static void stream_copy_fails(const char *kinds, int32_t fail_at)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = make(be, kinds, 0);
    llmem_batch_buf *b = mt_batch_new();
    mt_add(b, 0, 0, 8, 100, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, forward, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    llmem_batch_buf_clear(b);
    const int32_t s01[2] = {0, 1}, s23[2] = {2, 3};
    ck_assert_int_eq(llmem_batch_buf_add(b, 200, 8, s01, 2, true), LLMEM_OK);
    ck_assert_int_eq(llmem_batch_buf_add(b, 300, 0, s23, 2, true), LLMEM_OK);
    seen before;
    see(m, &before, true);

    llmem_plan *plan = NULL;
    const llmem_ubatch *ub = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan, err,
                                    sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(llmem_plan_n_ubatch(plan), 1);
    ck_assert_int_eq(llmem_memory_apply(m, plan, 0, &ub), LLMEM_OK);
    forward(m, ub, NULL);
    hook h = {.fail_at = fail_at};
    ck_assert_int_eq(llmem_backend_set_copy_hook(be, hook_fn, &h), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_commit(m, plan, 0), LLMEM_E_BACKEND);
    ck_assert_int_eq(llmem_backend_set_copy_hook(be, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(h.failed, 1); /* nothing tried again after the failure */
    assert_unchanged(m, &before, false);
    llmem_memory_release(m, plan);
    assert_unchanged(m, &before, true);
    probe(m, 0, 8, 828.0f);
    probe(m, 1, 8, 828.0f);

    /* the memory goes on: the same step commits */
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, forward, NULL, NULL), LLMEM_OK);
    const int32_t t01[9] = {100, 101, 102, 103, 104, 105, 106, 107, 200}, t23[1] = {300};
    mt_expect_tokens(m, 0, t01, 9);
    mt_expect_tokens(m, 1, t01, 9);
    mt_expect_tokens(m, 2, t23, 1);
    mt_expect_tokens(m, 3, t23, 1);
    mt_assert_check(m);
    probe(m, 0, 9, 1028.0f);
    probe(m, 1, 9, 1028.0f);
    probe(m, 2, 1, 300.0f);
    probe(m, 3, 1, 300.0f);
    free(before.state);
    mt_free(m, b, be);
}

START_TEST(test_recurrent_stream_copy)
{
    stream_copy_fails("r", 0);
}
END_TEST

/* the KV cache commits first in the hybrid's order */
START_TEST(test_hybrid_stream_copy)
{
    stream_copy_fails("kr", 0);
}
END_TEST

/* the first recurrent child's copies succeed, the second's fail */
START_TEST(test_hybrid_second_child_fails)
{
    stream_copy_fails("rrk", 1);
}
END_TEST

/* A prompt of 8 tokens publishes its end state as a snapshot at commit;
 * with every copy failing the snapshot is dropped and the commit stands. */
static void snapshot_copy_fails(const char *kinds)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = make(be, kinds, 4);
    llmem_batch_buf *b = mt_batch_new();
    mt_add(b, 0, 0, 8, 100, true);
    hook h = {.fail_at = 0};
    ck_assert_int_eq(llmem_backend_set_copy_hook(be, hook_fn, &h), LLMEM_OK);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, forward, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_set_copy_hook(be, NULL, NULL), LLMEM_OK);
    ck_assert_int_ge(h.failed, 1);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.snapshots, 0);
    ck_assert_int_eq(st.snapshot_copy_failures, 1);
    const int32_t t0[8] = {100, 101, 102, 103, 104, 105, 106, 107};
    mt_expect_tokens(m, 0, t0, 8);
    mt_assert_check(m);
    probe(m, 0, 8, 828.0f);

    /* no snapshot to reuse: the same prompt on 1 computes every token */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 8, 100, true);
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, forward, NULL, &info), LLMEM_OK);
    ck_assert_int_eq(info.n_tokens_cached, 0);
    llmem_memory_get_stats(m, &st);
    ck_assert_int_ge(st.snapshots, 1); /* its copies ran */
    ck_assert_int_eq(st.snapshot_copy_failures, 1);
    mt_expect_tokens(m, 1, t0, 8);
    /* ... and a third request reuses the state 1 published at its end */
    llmem_batch_buf_clear(b);
    mt_add(b, 2, 0, 8, 100, false);
    mt_add(b, 2, 8, 1, 400, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, forward, NULL, &info), LLMEM_OK);
    ck_assert_int_eq(info.n_tokens_cached, 8);
    mt_assert_check(m);
    probe(m, 1, 8, 828.0f);
    probe(m, 2, 9, 1228.0f);
    mt_free(m, b, be);
}

START_TEST(test_recurrent_snapshot_copy)
{
    snapshot_copy_fails("r");
}
END_TEST

START_TEST(test_hybrid_snapshot_copy)
{
    snapshot_copy_fails("kr");
}
END_TEST

START_TEST(test_hook_args)
{
    ck_assert_int_eq(llmem_backend_set_copy_hook(NULL, NULL, NULL), LLMEM_E_INVALID);
    llmem_backend *be = mt_cpu();
    llmem_buffer *a = NULL, *c = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, 64, &a), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_alloc(be, 64, &c), LLMEM_OK);
    unsigned char x[64], y[64];
    for (int32_t i = 0; i < 64; i++)
        x[i] = (unsigned char)i;
    memset(y, 0xee, sizeof y);
    ck_assert_int_eq(llmem_buffer_upload(a, 0, x, 64), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(c, 0, y, 64), LLMEM_OK);
    hook h = {.fail_at = 1};
    ck_assert_int_eq(llmem_backend_set_copy_hook(be, hook_fn, &h), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_copy(c, 0, a, 0, 16), LLMEM_OK); /* copy 0 passes */
    ck_assert_int_eq(llmem_buffer_copy(c, 16, a, 16, 16), LLMEM_E_BACKEND);
    llmem_copy_range r[2] = {{c, 32, a, 32, 8}, {c, 48, a, 48, 8}};
    ck_assert_int_eq(llmem_buffer_copy_ranges(r, 2), LLMEM_E_BACKEND);
    ck_assert_int_eq(llmem_backend_set_copy_hook(be, NULL, NULL), LLMEM_OK);
    unsigned char got[64];
    ck_assert_int_eq(llmem_buffer_download(c, 0, got, 64), LLMEM_OK);
    ck_assert_mem_eq(got, x, 16);         /* the copy that passed */
    ck_assert_mem_eq(got + 16, y, 48);    /* the refused ones wrote nothing */
    ck_assert_int_eq(llmem_buffer_copy_ranges(r, 2), LLMEM_OK); /* hook removed */
    ck_assert_int_eq(llmem_buffer_download(c, 0, got, 64), LLMEM_OK);
    ck_assert_mem_eq(got + 32, x + 32, 8);
    ck_assert_mem_eq(got + 48, x + 48, 8);
    llmem_buffer_free(a);
    llmem_buffer_free(c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("copy_faults");
    TCase *tc = tcase_create("commit");
    tcase_add_test(tc, test_hook_args);
    tcase_add_test(tc, test_recurrent_stream_copy);
    tcase_add_test(tc, test_hybrid_stream_copy);
    tcase_add_test(tc, test_hybrid_second_child_fails);
    tcase_add_test(tc, test_recurrent_snapshot_copy);
    tcase_add_test(tc, test_hybrid_snapshot_copy);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}

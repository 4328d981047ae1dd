// ctest-labels: core
/* Regression tests: minimal reproductions of the memory-module bugs the
 * model-based test (test_memory_model.c), the fault-injection test and the
 * fuzzers found. Each case states the contract it checks and what went
 * wrong; expected values follow from the contract by hand, never from the
 * code under test. */
#include "support/run.h"
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "llmem/llmem.h"
#include "support/le64.h"
#include "support/memtest.h"

/* The KV cache of these cases: 1 layer, 1 head of head_dim 4, f32. */
static llmem_memory *kv(llmem_backend *be, int32_t ps, int32_t n_pages, int32_t n_seq)
{
    llmem_kv_cache_params p = mt_kv_params(ps, n_pages, n_seq);
    p.head_dim = 4;
    p.poison = false;
    return mt_kv_create(be, &p);
}

/* A batch: token i is toks[i] at pos[i] in sequences ids[i][0..nids[i]). */
typedef struct tb {
    int32_t n, tok[64], pos[64], nseq[64], ids[64][2];
    const int32_t *idp[64];
    llmem_batch b;
} tb;

static void tb_add(tb *t, int32_t tok, int32_t pos, int32_t s0, int32_t s1)
{
    int32_t i = t->n++;
    t->tok[i] = tok;
    t->pos[i] = pos;
    t->ids[i][0] = s0;
    t->ids[i][1] = s1;
    t->nseq[i] = s1 >= 0 ? 2 : 1;
}

/* Appends n tokens of seq alone: ids tok0, tok0 + 1, ... at positions pos0, pos0 + 1, ... */
static void tb_seq(tb *t, int32_t tok0, int32_t pos0, int32_t n, int32_t seq)
{
    for (int32_t j = 0; j < n; j++)
        tb_add(t, tok0 + j, pos0 + j, seq, -1);
}

static const llmem_batch *tb_get(tb *t)
{
    for (int32_t i = 0; i < t->n; i++)
        t->idp[i] = t->ids[i];
    t->b = (llmem_batch){.n_tokens = t->n, .token = t->tok, .pos = t->pos, .n_seq_id = t->nseq,
                         .seq_id = t->idp};
    return &t->b;
}

/* Plans, applies and commits every ubatch; returns the plan status. */
static llmem_status run_all(llmem_memory *m, tb *t, int32_t n_ubatch)
{
    llmem_plan *p = NULL;
    char err[256] = "";
    llmem_status st =
        llmem_memory_plan(m, tb_get(t), LLMEM_SPLIT_AUTO, n_ubatch, &p, err, sizeof err);
    if (st != LLMEM_OK)
        return st;
    for (int32_t u = 0; u < llmem_plan_n_ubatch(p); u++) {
        ck_assert_int_eq(llmem_memory_apply(m, p, u, NULL), LLMEM_OK);
        ck_assert_int_eq(llmem_memory_commit(m, p, u), LLMEM_OK);
    }
    llmem_memory_release(m, p);
    return LLMEM_OK;
}

/* Plans t in ubatches of 512, which must succeed (the library's message
 * otherwise); the caller releases the plan. */
static llmem_plan *plan_ok(llmem_memory *m, tb *t)
{
    llmem_plan *p = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(m, tb_get(t), LLMEM_SPLIT_AUTO, 512, &p, err, sizeof err) ==
                      LLMEM_OK,
                  "%s", err);
    return p;
}

static void assert_check(llmem_memory *m)
{
    char err[256] = "";
    ck_assert_msg(llmem_memory_check(m, err, sizeof err) == LLMEM_OK, "llmem_memory_check: %s",
                  err);
}

/* A hybrid of the n children kids (child i serves layer i), which must be
 * created; it owns them. */
static llmem_memory *hybrid_of(llmem_memory **kids, int32_t n)
{
    int32_t map[2] = {0, 1};
    llmem_memory *m = NULL;
    ck_assert_int_le(n, 2);
    ck_assert_int_eq(llmem_hybrid_create(kids, n, map, n, &m, NULL, 0), LLMEM_OK);
    return m;
}

/* The end of most cases: the invariant checker passes, then everything is
 * freed. */
static void check_and_free(llmem_memory *m, llmem_backend *be)
{
    assert_check(m);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}

/* KV cache: a page that was hashed (full, canonical) but lost the race to
 * publish (an equal page was published first) is shared by seq_cp of a
 * prefix ending inside it; once its other holder is gone, the copy writes
 * into it in place. The page kept its old hash: llmem_memory_check
 * reported "hashed tokens differ" and the page was never published.
 * Contract: a page written to is re-hashed when it becomes full again. */
START_TEST(kv_page_written_in_place_keeps_stale_hash)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 16, 4);
    tb t = {0};
    for (int32_t j = 0; j < 4; j++) { /* seq 0 and seq 1: the same page, one batch */
        tb_add(&t, 1 + j, j, 0, -1);
        tb_add(&t, 1 + j, j, 1, -1);
    }
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 1, 2, 0, 2), LLMEM_OK); /* seq 2 = [1 2] */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, -1, -1), LLMEM_OK);
    t.n = 0;
    tb_add(&t, 7, 2, 2, -1);
    tb_add(&t, 8, 3, 2, -1); /* seq 2 = [1 2 7 8] */
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    assert_check(m);
    /* [1 2 7 8] is a full canonical page: a new request for it hits */
    t.n = 0;
    int32_t want[5] = {1, 2, 7, 8, 9};
    for (int32_t j = 0; j < 5; j++)
        tb_add(&t, want[j], j, 3, -1);
    llmem_plan *p = plan_ok(m, &t);
    ck_assert_int_eq(llmem_plan_n_cached(p, 3), 4);
    llmem_memory_release(m, p);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* Recurrent memory: in one ubatch, sequence 0's current state is dropped
 * from the reservation (only the newest 1 + n_ckpt states are kept) and
 * its slot was handed to sequence 1 as destination. When the ubatch was
 * then released without commit (the forward pass failed), release took the
 * slot away from sequence 0: it held a token but no state.
 * Contract (recurrent.h): on release of an applied, uncommitted ubatch a
 * sequence keeps its current state. */
START_TEST(rs_release_after_apply_keeps_current_state)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 2, 0);
    tb t = {0};
    tb_add(&t, 1, 0, 0, -1);
    tb_add(&t, 2, 0, 1, -1);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    t.n = 0;
    tb_add(&t, 3, 1, 0, -1);
    tb_add(&t, 4, 1, 1, -1);
    llmem_plan *p = plan_ok(m, &t);
    ck_assert_int_eq(llmem_memory_apply(m, p, 0, NULL), LLMEM_OK);
    llmem_memory_release(m, p);
    for (int32_t s = 0; s < 2; s++) {
        ck_assert_int_eq(llmem_memory_seq_len(m, s), 1);
        ck_assert_msg(llmem_recurrent_seq_slot(m, s) >= 0, "sequence %d lost its state", s);
    }
    check_and_free(m, be);
}
END_TEST

/* Recurrent memory: a token shared by a sequence of 3 tokens and an empty
 * one (valid: an empty sequence may start anywhere) gave the empty one a
 * state labelled "after 4 tokens" while it held 1 token: it had no current
 * state and llmem_memory_check failed. Contract: plan either refuses the
 * batch (LLMEM_E_INVALID, nothing changes) or every sequence ends with a
 * state for the tokens it holds. */
START_TEST(rs_shared_token_over_different_lengths)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = mt_rs(be, 2, 0);
    tb t = {0};
    tb_seq(&t, 1, 0, 3, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    t.n = 0;
    tb_add(&t, 9, 3, 0, 1);
    llmem_status st = run_all(m, &t, 512);
    if (st == LLMEM_OK) {
        ck_assert_int_eq(llmem_memory_seq_len(m, 1), 1);
        ck_assert_msg(llmem_recurrent_seq_slot(m, 1) >= 0, "sequence 1 has no state");
    } else {
        ck_assert_int_eq(st, LLMEM_E_INVALID);
        ck_assert_int_eq(llmem_memory_seq_len(m, 1), 0);
    }
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), st == LLMEM_OK ? 4 : 3);
    check_and_free(m, be);
}
END_TEST

/* Hybrid: llmem_memory_check while a plan is in flight reported the KV
 * child's reserved pages as a violation ("sequence 0: 0 tokens, 0
 * positions, 2 pages"): the child did not know a plan was in flight (its
 * own base.plan was NULL). The same check on a plain KV cache passes. */
START_TEST(hybrid_check_during_plan)
{
    llmem_backend *be = mt_cpu();
    for (int32_t hybrid = 0; hybrid < 2; hybrid++) {
        llmem_memory *m = kv(be, 4, 8, 2);
        if (hybrid)
            m = hybrid_of(&m, 1);
        tb t = {0};
        tb_seq(&t, 1, 0, 6, 0);
        llmem_plan *p = NULL;
        ck_assert_int_eq(llmem_memory_plan(m, tb_get(&t), LLMEM_SPLIT_AUTO, 2, &p, NULL, 0),
                         LLMEM_OK);
        assert_check(m);
        ck_assert_int_eq(llmem_memory_apply(m, p, 0, NULL), LLMEM_OK);
        ck_assert_int_eq(llmem_memory_commit(m, p, 0), LLMEM_OK);
        assert_check(m);
        llmem_memory_release(m, p);
        assert_check(m);
        llmem_memory_destroy(m);
    }
    llmem_backend_close(be);
}
END_TEST

/* Hybrid of two KV caches: the first child reserved (copy-on-write of a
 * shared partial page, new pages) before the second found it had no
 * space; the plan failed with LLMEM_E_NO_SPACE but the first child kept
 * the private copy: its pages_used and cow_copies changed.
 * Contract (DESIGN.md 1, hybrid.h): a composition plans all of its
 * children or none; a failed plan leaves the memory unchanged. */
START_TEST(hybrid_failed_plan_changes_first_child)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kids[2] = {kv(be, 4, 16, 2), kv(be, 4, 2, 2)};
    llmem_memory *m = hybrid_of(kids, 2);
    tb t = {0};
    tb_seq(&t, 1, 0, 3, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK); /* shared partial page */
    llmem_memory_stats before[2], after[2];
    int32_t pt_before[4], pt_after[4];
    for (int32_t c = 0; c < 2; c++)
        llmem_memory_get_stats(llmem_memory_child(m, c), &before[c]);
    ck_assert_int_eq(llmem_kv_cache_page_table(llmem_memory_child(m, 0), 1, pt_before, 4), 1);
    /* seq 1 + 6 tokens: copy-on-write + 2 pages in each child; child 1 has 1 free page */
    t.n = 0;
    tb_seq(&t, 13, 3, 6, 1);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_E_NO_SPACE);
    for (int32_t c = 0; c < 2; c++) {
        llmem_memory_get_stats(llmem_memory_child(m, c), &after[c]);
        ck_assert_msg(after[c].pages_used == before[c].pages_used &&
                          after[c].pages_free == before[c].pages_free &&
                          after[c].cow_copies == before[c].cow_copies,
                      "child %d: pages used %lld -> %lld, free %lld -> %lld, copies %lld -> %lld",
                      c, (long long)before[c].pages_used, (long long)after[c].pages_used,
                      (long long)before[c].pages_free, (long long)after[c].pages_free,
                      (long long)before[c].cow_copies, (long long)after[c].cow_copies);
    }
    ck_assert_int_eq(llmem_kv_cache_page_table(llmem_memory_child(m, 0), 1, pt_after, 4), 1);
    ck_assert_int_eq(pt_after[0], pt_before[0]);
    check_and_free(m, be);
}
END_TEST

/* Hybrid of two KV caches: the first child made room for its pages by
 * evicting prefix-cache pages; the second child had no space; the plan
 * failed, but the first child's cached prefix was gone (pages_cached
 * dropped, prefix_evictions grew, a later request no longer hit). Contract: a
 * failed plan changes nothing (DESIGN.md 1), so a composition must check
 * every child's space before any child evicts. */
START_TEST(hybrid_failed_plan_evicts_in_first_child)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kids[2] = {kv(be, 4, 4, 2), kv(be, 4, 2, 2)};
    llmem_memory *m = hybrid_of(kids, 2);
    tb t = {0};
    tb_seq(&t, 1, 0, 8, 0); /* two full pages in each child, published */
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK); /* now cached */
    llmem_memory_stats before, after;
    llmem_memory_get_stats(llmem_memory_child(m, 0), &before);
    ck_assert_int_eq(before.pages_cached, 2);
    /* 12 other tokens: child 0 takes 2 free pages and evicts 1; child 1 has 2 pages */
    t.n = 0;
    tb_seq(&t, 100, 0, 12, 1);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_E_NO_SPACE);
    llmem_memory_get_stats(llmem_memory_child(m, 0), &after);
    ck_assert_msg(after.pages_cached == before.pages_cached &&
                      after.prefix_evictions == before.prefix_evictions,
                  "child 0: cached pages %lld -> %lld, evictions %lld -> %lld",
                  (long long)before.pages_cached, (long long)after.pages_cached,
                  (long long)before.prefix_evictions, (long long)after.prefix_evictions);
    check_and_free(m, be);
}
END_TEST

/* KV cache: a copy-on-write made at apply (deferred from plan) copies a
 * page whose keys still wait for a K-shift. The view's shift list was
 * built at plan time from the pages that had pending shifts then, so it
 * named only the original page's slots: the copy's keys were never
 * re-rotated, and the commit of ubatch 0 forgot their pending shift.
 * Contract (memory.h, llmem_kv_view): every slot a stream may read that
 * waits for a K-shift is in shift_slot of the first ubatch, once. */
START_TEST(kv_deferred_copy_misses_pending_kshift)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 8, 2);
    tb t = {0};
    tb_seq(&t, 1, 0, 3, 0); /* a partial page */
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, -1, -1, 2), LLMEM_OK); /* pending: +2 */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);  /* page shared */
    t.n = 0;
    tb_add(&t, 9, 5, 1, -1); /* seq 1 appends: copy-on-write of the shared page */
    llmem_plan *p = plan_ok(m, &t);
    ck_assert_int_eq(llmem_memory_apply(m, p, 0, NULL), LLMEM_OK);
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(m, 0, &v), LLMEM_OK);
    int32_t pt[2][2];
    for (int32_t s = 0; s < 2; s++)
        ck_assert_int_eq(llmem_kv_cache_page_table(m, s, pt[s], 2), 1);
    ck_assert_int_ne(pt[0][0], pt[1][0]); /* the copy was made */
    for (int32_t s = 0; s < 2; s++)
        for (int32_t j = 0; j < 3; j++) {
            int32_t slot = pt[s][0] * 4 + j, hits = 0;
            for (int32_t k = 0; k < llmem_view_kv(&v)->shift_slot.n; k++)
                hits += llmem_view_kv(&v)->shift_slot.host[k] == slot && llmem_view_kv(&v)->shift_delta.host[k] == 2;
            ck_assert_msg(hits == 1, "seq %d key %d (slot %d): shift listed %d times", s, j, slot,
                          hits);
        }
    ck_assert_int_eq(llmem_memory_commit(m, p, 0), LLMEM_OK);
    llmem_memory_release(m, p);
    check_and_free(m, be);
}
END_TEST

static uint8_t *stream(llmem_memory *m, int32_t seq, size_t *n)
{
    size_t got = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, seq, n), LLMEM_OK);
    uint8_t *b = malloc(*n);
    ck_assert_int_eq(llmem_memory_state_write(m, seq, b, *n, &got), LLMEM_OK);
    return b;
}

/* Hybrid state I/O: every section is valid on its own, but the KV section
 * says the sequence holds 5 tokens and the recurrent one 3. The stream was
 * accepted and the children disagreed (llmem_memory_check: "sequence 1
 * differs between child 0 and child 1"). Contract (state read, DESIGN.md
 * 7): a mismatched stream is refused and the memory is left as it was. */
START_TEST(hybrid_state_read_sections_disagree)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kids[2] = {kv(be, 4, 16, 2), mt_rs(be, 2, 1)};
    llmem_memory *m = hybrid_of(kids, 2);
    tb t = {0};
    tb_seq(&t, 1, 0, 5, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    size_t na = 0, nb = 0;
    uint8_t *a = stream(m, 0, &na);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    t.n = 0;
    tb_seq(&t, 1, 0, 3, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    uint8_t *b = stream(m, 0, &nb);
    /* a: header, KV section (5 tokens), recurrent section, trailer;
     * splice a's KV section with b's recurrent section */
    size_t kv_end = 16 + 16 + (size_t)le64_read(a + 16), b_kv_end = 16 + 16 + (size_t)le64_read(b + 16);
    size_t rs_len = nb - 8 - b_kv_end, n = kv_end + rs_len + 8;
    uint8_t *x = malloc(n);
    memcpy(x, a, kv_end);
    memcpy(x + kv_end, b + b_kv_end, rs_len);
    le64_write(x + n - 8, XXH3_64bits(x, n - 8));
    llmem_status st = llmem_memory_state_read(m, 1, x, n, NULL, 0);
    ck_assert_msg(st != LLMEM_OK, "a stream whose sections disagree was accepted");
    ck_assert_int_eq(llmem_memory_seq_len(m, 1), 0);
    assert_check(m);
    free(a);
    free(b);
    free(x);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST


/* A state stream of every sequence written by a memory with n_seq_max 4
 * (sequence 3 in use) read into one with n_seq_max 2: other geometry, so
 * LLMEM_E_INVALID as llmem_memory_state_read documents (it said CORRUPT),
 * with a reason, and the memory unchanged. KV cache and recurrent. */
START_TEST(state_n_seq_max_mismatch_is_invalid)
{
    llmem_backend *be = mt_cpu();
    for (int kind = 0; kind < 2; kind++) {
        llmem_memory *big = kind ? mt_rs(be, 4, 1) : kv(be, 4, 8, 4);
        llmem_memory *small = kind ? mt_rs(be, 2, 1) : kv(be, 4, 8, 2);
        tb t = {0};
        for (int32_t i = 0; i < 3; i++)
            tb_add(&t, 7 + i, i, 3, -1);
        ck_assert_int_eq(run_all(big, &t, 8), LLMEM_OK);
        tb t2 = {0};
        tb_add(&t2, 9, 0, 1, -1);
        ck_assert_int_eq(run_all(small, &t2, 8), LLMEM_OK);
        size_t n;
        uint8_t *buf = stream(big, -1, &n);
        char err[256] = "";
        ck_assert_int_eq(llmem_memory_state_read(small, -1, buf, n, err, sizeof err),
                         LLMEM_E_INVALID);
        ck_assert_ptr_nonnull(strstr(err, "n_seq_max"));
        ck_assert_int_eq(llmem_memory_seq_len(small, 1), 1); /* unchanged */
        ck_assert_int_eq(llmem_memory_seq_pos_max(small, 1), 0);
        assert_check(small);
        free(buf);
        llmem_memory_destroy(big);
        llmem_memory_destroy(small);
    }
    llmem_backend_close(be);
}
END_TEST

/* Positions are int32 and the next token of a sequence goes at
 * pos_max + 1: a token at INT32_MAX leaves no next position. plan computed
 * next_pos[s]++ / pm + 1 in int32 (memory/plan.c validate): signed
 * overflow, undefined behaviour (UBSan reports it in the sanitizer build;
 * found by fuzz_state_read). seq_add refuses positions above
 * INT32_MAX - 1; plan and state_read must too (LLMEM_E_INVALID /
 * LLMEM_E_CORRUPT). */
START_TEST(position_int32_max)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 8, 2);
    tb t = {0};
    tb_add(&t, 1, INT32_MAX, 0, -1);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 0);
    /* the same position through a state stream */
    t.n = 0;
    tb_add(&t, 1, 5, 0, -1);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    size_t n = 0;
    uint8_t *s = stream(m, 0, &n);
    /* KV payload after the 32-byte framing: 5 i32, seq, len, token, pos */
    size_t at = 16 + 16 + 20 + 8 + 4;
    int32_t big = INT32_MAX;
    memcpy(s + at, &big, 4);
    le64_write(s + 24, XXH3_64bits(s + 32, (size_t)le64_read(s + 16)));
    le64_write(s + n - 8, XXH3_64bits(s, n - 8));
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    llmem_status st = llmem_memory_state_read(m, 0, s, n, NULL, 0);
    if (st == LLMEM_OK) /* then the next plan must not overflow */
        ck_assert_int_eq(run_all(m, &t, 512), LLMEM_E_INVALID);
    free(s);
    check_and_free(m, be);
}
END_TEST

/* Hybrid of two KV caches with page sizes 3 and 4: the reusable prefix is
 * the shortest the children agree on, but hy_prefix_match took the
 * minimum in one pass: child 0 (pages of 3) matched 6 tokens, child 1
 * (pages of 4) then 4 of those 6, and 4 is not a whole number of child 0's
 * pages: child 0's reserve failed with LLMEM_E_STATE ("prefix pages
 * changed during planning") and the plan was refused. Contract: the
 * plan succeeds, with a prefix made of whole pages in every child (here
 * 0: no common multiple of 3 and 4 fits in 8 tokens). */
START_TEST(hybrid_prefix_whole_pages_in_every_child)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kids[2] = {kv(be, 3, 16, 2), kv(be, 4, 16, 2)};
    llmem_memory *m = hybrid_of(kids, 2);
    tb t = {0};
    tb_seq(&t, 1, 0, 9, 0); /* child 0 publishes 3 pages, child 1 2 pages */
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    t.n = 0;
    tb_seq(&t, 1, 0, 8, 1); /* 8 equal tokens, then a new one */
    tb_add(&t, 50, 8, 1, -1);
    llmem_plan *p = plan_ok(m, &t);
    int32_t c = llmem_plan_n_cached(p, 1);
    ck_assert_msg(c % 3 == 0 && c % 4 == 0, "%d cached tokens are not whole pages of 3 and 4", c);
    llmem_memory_release(m, p);
    check_and_free(m, be);
}
END_TEST

/* Plans t and returns how many tokens of seq the prefix cache serves; the
 * plan is released unrun. */
static int32_t cached_of(llmem_memory *m, tb *t, int32_t seq)
{
    llmem_plan *p = plan_ok(m, t);
    int32_t c = llmem_plan_n_cached(p, seq);
    llmem_memory_release(m, p);
    return c;
}

/* KV cache, issue 13 defect 1: a prefix computed twice in one batch (seq 0:
 * tokens 1..8, seq 1: tokens 1..12, page size 4). The second copy's pages 0
 * and 1 duplicate seq 0's and were never published, and lookups followed
 * parents by page id, so its page 2 (tokens 9..12) was unreachable: a
 * follow-up hit 8 tokens where 12 are cached. Contract: the chain is keyed
 * by content, every copy is findable; 12 tokens of 1..12 are held in whole
 * pages, and the follow-up 1..12,13 may skip all but its last token. */
START_TEST(kv_duplicate_prefix_chain_by_content)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 16, 4);
    tb t = {0};
    for (int32_t j = 0; j < 12; j++) {
        if (j < 8)
            tb_add(&t, 1 + j, j, 0, -1);
        tb_add(&t, 1 + j, j, 1, -1);
    }
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    t.n = 0;
    tb_seq(&t, 1, 0, 13, 2);
    ck_assert_int_eq(cached_of(m, &t, 2), 12);
    check_and_free(m, be);
}
END_TEST

/* KV cache, issue 13 defect 1: the same 8-token prefix computed by seq 0
 * and seq 1 in one batch; seq 0 is removed and its (cached) pages are
 * evicted. The duplicate seq 1 still holds was invisible: 0 hits where 8
 * are cached. Contract: the held copy is found (8 = two whole pages of 4). */
START_TEST(kv_duplicate_prefix_found_after_eviction)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 8, 4);
    tb t = {0};
    for (int32_t j = 0; j < 8; j++) {
        tb_add(&t, 1 + j, j, 0, -1);
        tb_add(&t, 1 + j, j, 1, -1);
    }
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    t.n = 0;
    tb_seq(&t, 100, 0, 24, 2); /* 6 pages: the 4 free ones and seq 0's 2 cached */
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    llmem_memory_stats st;
    ck_assert_int_eq(llmem_memory_get_stats(m, &st), LLMEM_OK);
    ck_assert_int_eq(st.prefix_evictions, 2);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 2, -1, -1), LLMEM_OK);
    t.n = 0;
    tb_seq(&t, 1, 0, 9, 3);
    ck_assert_int_eq(cached_of(m, &t, 3), 8);
    check_and_free(m, be);
}
END_TEST

/* KV cache, issue 13 defect 2: a sequence fills both pages of a 2-page
 * cache (tokens 1..8, page size 4, both published), rolls back to 6 tokens
 * (a rejected draft), and appends 2 new tokens. They fit exactly in the
 * page it holds alone, but the page stayed published, so the append wanted
 * a copy and failed with LLMEM_E_NO_SPACE. Contract: a published page no
 * one else holds is unpublished by the rollback and written in place (no
 * copy), and its old content is no longer found. */
START_TEST(kv_exact_fit_after_rollback)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 2, 2);
    tb t = {0};
    tb_seq(&t, 1, 0, 8, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 6, -1), LLMEM_OK);
    t.n = 0;
    tb_add(&t, 70, 6, 0, -1);
    tb_add(&t, 71, 7, 0, -1);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    llmem_memory_stats st;
    ck_assert_int_eq(llmem_memory_get_stats(m, &st), LLMEM_OK);
    ck_assert_int_eq(st.cow_copies, 0);
    assert_check(m);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    t.n = 0; /* the old tail 7, 8 is gone from the index: only page 0 hits */
    tb_seq(&t, 1, 0, 6, 1);
    tb_add(&t, 7, 6, 1, -1);
    tb_add(&t, 8, 7, 1, -1);
    ck_assert_int_eq(cached_of(m, &t, 1), 4);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* KV cache, issue 13 item 6: four sequences sharing 4 pages (seq_cp of a
 * 16-token sequence, pages of 4, 8 pages in all) wrote a stream that did
 * not read back into the same memory ("KV state needs 16 pages, 8
 * available"): sharing was lost. Contract: the stream keeps page sharing —
 * it reads back, the four sequences again hold the same 4 pages (4 used),
 * with their tokens. */
START_TEST(kv_state_stream_keeps_sharing)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 8, 4);
    tb t = {0};
    tb_seq(&t, 1, 0, 16, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    for (int32_t s = 1; s < 4; s++)
        ck_assert_int_eq(llmem_memory_seq_cp(m, 0, s, -1, -1), LLMEM_OK);
    size_t n = 0;
    uint8_t *buf = stream(m, -1, &n);
    char err[256] = "";
    ck_assert_msg(llmem_memory_state_read(m, -1, buf, n, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_memory_stats st;
    ck_assert_int_eq(llmem_memory_get_stats(m, &st), LLMEM_OK);
    ck_assert_int_eq(st.pages_used, 4);
    for (int32_t s = 0; s < 4; s++) {
        int32_t tok[16];
        ck_assert_int_eq(llmem_memory_seq_tokens(m, s, tok, 16), 16);
        ck_assert_int_eq(tok[0], 1);
        ck_assert_int_eq(tok[15], 16);
    }
    assert_check(m);
    free(buf);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* KV cache, issue 13 item 4: a sequence that fills the cache (12 tokens,
 * 3 pages of 4) could only lose a suffix, so generation stopped with "no
 * space". Context shift, as llama.cpp does it: keep the first 4 tokens,
 * drop the next 4 (seq_rm of whole pages in the middle), shift the rest
 * back by 4 (seq_add, a pending K-shift); then 4 more tokens fit at
 * positions 8..11. A hybrid refuses (a recurrent state cannot lose the
 * middle of its history) and changes nothing. */
START_TEST(kv_context_shift)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *m = kv(be, 4, 3, 1);
    tb t = {0};
    tb_seq(&t, 1, 0, 12, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 4, 6), LLMEM_E_STATE); /* inside a page */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 4, 8), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_add(m, 0, 8, -1, -4), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 8);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), 7);
    int32_t tok[16];
    ck_assert_int_eq(llmem_memory_seq_tokens(m, 0, tok, 16), 8);
    ck_assert_int_eq(tok[3], 4);
    ck_assert_int_eq(tok[4], 9); /* tokens 5..8 are gone */
    assert_check(m);
    t.n = 0;
    tb_seq(&t, 58, 8, 4, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_pos_max(m, 0), 11);
    assert_check(m);
    llmem_memory_destroy(m);

    llmem_memory *kids[2] = {kv(be, 4, 8, 1), mt_rs(be, 1, 1)};
    m = hybrid_of(kids, 2);
    t.n = 0;
    tb_seq(&t, 1, 0, 12, 0);
    ck_assert_int_eq(run_all(m, &t, 512), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, 4, 8), LLMEM_E_STATE);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 12);
    ck_assert_int_eq(llmem_memory_seq_len(kids[0], 0), 12);
    check_and_free(m, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memory_regressions");
    TCase *tc = tcase_create("regressions");
    tcase_add_test(tc, kv_page_written_in_place_keeps_stale_hash);
    tcase_add_test(tc, rs_release_after_apply_keeps_current_state);
    tcase_add_test(tc, rs_shared_token_over_different_lengths);
    tcase_add_test(tc, hybrid_check_during_plan);
    tcase_add_test(tc, hybrid_failed_plan_changes_first_child);
    tcase_add_test(tc, hybrid_failed_plan_evicts_in_first_child);
    tcase_add_test(tc, kv_deferred_copy_misses_pending_kshift);
    tcase_add_test(tc, hybrid_state_read_sections_disagree);
    tcase_add_test(tc, position_int32_max);
    tcase_add_test(tc, state_n_seq_max_mismatch_is_invalid);
    tcase_add_test(tc, hybrid_prefix_whole_pages_in_every_child);
    tcase_add_test(tc, kv_duplicate_prefix_chain_by_content);
    tcase_add_test(tc, kv_duplicate_prefix_found_after_eviction);
    tcase_add_test(tc, kv_exact_fit_after_rollback);
    tcase_add_test(tc, kv_state_stream_keeps_sharing);
    tcase_add_test(tc, kv_context_shift);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

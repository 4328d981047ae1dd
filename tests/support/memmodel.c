/* The random-operation engine of the model-based memory test
 * (tests/test_memory_model.c, which holds the configurations): random
 * plans with random batches applied and committed ubatch by ubatch, early
 * releases, plans that must fail, seq_rm / seq_cp / seq_keep / seq_add /
 * seq_div, clear, state round trips with corrupted streams, prefix hits by
 * re-submitting earlier prompts, each checked after every step against the
 * brute-force reference (memref.h). A failure prints the seed, the
 * operation and the last 32 operations (LLMEM_TEST_TRACE=1: every one). */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memmodel.h"

/* --- run context --------------------------------------------------------------------- */

typedef struct prompt {
    int32_t n;
    int32_t tok[320];
} prompt;

typedef struct run {
    const char *name;
    uint64_t base_seed, seed, rng;
    bool trace;
    int64_t op;
    memref *ref;
    llmem_memory *mem;
    llmem_backend *be;
    const mr_config *cfg;
    int32_t n_seq;
    bool has_rs, has_kv;
    int32_t max_len;
    char log[32][200]; /* the last 32 notes */
    int64_t n_notes;
    prompt prompts[24];
    int32_t n_prompts;
    /* batch being built */
    int32_t bn, btok[1024], bpos[1024], bnseq[1024], bids[1024][4];
    const int32_t *bidp[1024];
    int8_t bout[1024];
    bool bout_null;
    int32_t kn, kpos[1024], knseq[1024], kids[1024][4]; /* the batch before a mutation */
    int64_t n_plans, n_plans_ok, n_hits, n_nospace, n_rollback, n_rollback_ok;
} run;

static uint64_t rnd(run *R)
{
    uint64_t z = (R->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t rn(run *R, int32_t n) /* [0, n) */
{
    return n > 0 ? (int32_t)(rnd(R) % (uint64_t)n) : 0;
}

static bool chance(run *R, int32_t pct)
{
    return rn(R, 100) < pct;
}

static void note(run *R, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *line = R->log[R->n_notes++ % 32];
    int k = snprintf(line, 200, "#%lld ", (long long)R->op);
    vsnprintf(line + k, (size_t)(200 - k), fmt, ap);
    va_end(ap);
    if (R->trace)
        fprintf(stderr, "%s\n", line);
}

static void die(run *R, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s: FAILED at operation %lld (LLMEM_TEST_SEED=%llu reproduces)\n  %s\n"
                    "  last operations:\n",
            R->name, (long long)R->op, (unsigned long long)R->base_seed, msg);
    for (int64_t i = R->n_notes - 32; i < R->n_notes; i++)
        if (i >= 0)
            fprintf(stderr, "    %s\n", R->log[i % 32]);
    ck_abort_msg("%s: LLMEM_TEST_SEED=%llu, operation %lld: %s", R->name,
                 (unsigned long long)R->base_seed, (long long)R->op, msg);
}

static void expect_status(run *R, const char *what, llmem_status got, llmem_status want)
{
    if (got != want)
        die(R, "%s returned %s, the reference predicts %s", what, llmem_status_str(got),
            llmem_status_str(want));
}

static void trace_state(run *R)
{
    for (int32_t s = 0; s < R->n_seq; s++) {
        int32_t len[80], n = R->has_rs ? memref_rs_lengths(R->ref, s, len, 80) : 0;
        fprintf(stderr, "      seq %d: %d tokens, pos [%d, %d]", s, memref_seq_len(R->ref, s),
                memref_pos_min(R->ref, s), memref_pos_max(R->ref, s));
        for (int32_t i = 0; i < n && i < 80; i++)
            fprintf(stderr, "%s%d", i ? "," : " states ", len[i]);
        fprintf(stderr, "\n");
    }
}

/* Every check after a step. */
static void check_all(run *R, const char *where)
{
    char err[512] = "";
    if (R->trace)
        trace_state(R);
    if (!memref_bind(R->ref, err, sizeof err) || !memref_compare(R->ref, err, sizeof err) ||
        !memref_verify(R->ref, err, sizeof err))
        die(R, "after %s: %s", where, err);
}

/* --- batches ------------------------------------------------------------------------- */

static const llmem_batch *batch_get(run *R, llmem_batch *b)
{
    for (int32_t i = 0; i < R->bn; i++)
        R->bidp[i] = R->bids[i];
    *b = (llmem_batch){.n_tokens = R->bn, .token = R->btok, .pos = R->bpos,
                       .n_seq_id = R->bnseq, .seq_id = R->bidp,
                       .output = R->bout_null ? NULL : R->bout};
    return b;
}

static bool same_history(run *R, int32_t a, int32_t b)
{
    int32_t n = memref_seq_len(R->ref, a);
    if (n != memref_seq_len(R->ref, b) || memref_pos_max(R->ref, a) != memref_pos_max(R->ref, b))
        return false;
    const mr_tok *x = memref_seq_tok(R->ref, a), *y = memref_seq_tok(R->ref, b);
    for (int32_t j = 0; j < n; j++)
        if (x[j].token != y[j].token)
            return false;
    return true;
}

static int32_t rand_len(run *R, int32_t ps)
{
    int32_t k = rn(R, 100);
    if (k < 30)
        return 1;
    if (k < 70)
        return 2 + rn(R, 7);
    if (k < 92)
        return 1 + rn(R, 2 * ps + 2);
    return 1 + rn(R, 3 * ps + 40);
}

typedef struct group {
    int32_t ids[4], n_ids;
    int32_t n, tok[400], pos0;
} group;

/* Tokens for a group: an earlier prompt (prefix hits) or random ids. */
static void group_tokens(run *R, group *g, int32_t ps)
{
    int32_t s = g->ids[0];
    g->n = rand_len(R, ps);
    bool fresh = memref_seq_len(R->ref, s) == 0;
    g->pos0 = fresh ? (chance(R, 85) ? 0 : rn(R, 20)) : memref_pos_max(R->ref, s) + 1;
    int32_t k = 0;
    if (fresh && g->pos0 == 0 && R->n_prompts && chance(R, 60)) {
        const prompt *p = &R->prompts[rn(R, R->n_prompts)];
        int32_t take = chance(R, 50) ? p->n : 1 + rn(R, p->n);
        for (; k < take && k < 380; k++)
            g->tok[k] = p->tok[k];
        g->n = k + (chance(R, 50) ? rn(R, ps + 2) : 1);
    }
    if (g->n > 380)
        g->n = 380;
    for (; k < g->n; k++)
        g->tok[k] = 1 + rn(R, 400);
}

/* A valid batch (when possible) over random groups of sequences. */
static void gen_batch(run *R, bool equal)
{
    const mr_config *cfg = R->cfg;
    int32_t ps = cfg->child[0].kv ? cfg->child[0].page_size : 8;
    group g[6];
    int32_t ng = 0;
    bool used[16] = {0};
    int32_t want = 1 + rn(R, 3);
    for (int32_t tries = 0; tries < 12 && ng < want; tries++) {
        int32_t s = rn(R, R->n_seq);
        if (used[s] || memref_seq_len(R->ref, s) > R->max_len)
            continue;
        group *x = &g[ng];
        x->ids[0] = s;
        x->n_ids = 1;
        if (chance(R, 25)) /* shared tokens: sequences with the same history */
            for (int32_t t = 0; t < R->n_seq && x->n_ids < 3; t++)
                if (t != s && !used[t] && same_history(R, s, t) && chance(R, 60))
                    x->ids[x->n_ids++] = t;
        for (int32_t j = 0; j < x->n_ids; j++)
            used[x->ids[j]] = true;
        group_tokens(R, x, ps);
        ng++;
        /* simple split: a shared sequence may continue alone in the same batch */
        if (!equal && x->n_ids > 1 && ng < 6 && chance(R, 30)) {
            group *y = &g[ng++];
            y->ids[0] = x->ids[0];
            y->n_ids = 1;
            y->n = 1 + rn(R, 6);
            y->pos0 = x->pos0 + x->n;
            for (int32_t k = 0; k < y->n; k++)
                y->tok[k] = 1 + rn(R, 400);
        }
    }
    /* merge: groups' tokens interleaved, each group in order; a solo
     * continuation after its shared group */
    R->bn = 0;
    int32_t at[6] = {0};
    for (;;) {
        int32_t live[6], nl = 0;
        for (int32_t i = 0; i < ng; i++) {
            bool blocked = false;
            for (int32_t k = 0; k < i; k++)
                blocked |= g[k].n_ids > 1 && g[i].n_ids == 1 && g[k].ids[0] == g[i].ids[0] &&
                           at[k] < g[k].n;
            if (at[i] < g[i].n && !blocked)
                live[nl++] = i;
        }
        if (!nl || R->bn >= 1000)
            break;
        int32_t i = live[rn(R, nl)];
        int32_t b = R->bn++;
        R->btok[b] = g[i].tok[at[i]];
        R->bpos[b] = g[i].pos0 + at[i];
        R->bnseq[b] = g[i].n_ids;
        memcpy(R->bids[b], g[i].ids, (size_t)g[i].n_ids * sizeof(int32_t));
        at[i]++;
    }
    R->bout_null = chance(R, 60);
    for (int32_t i = 0; i < R->bn; i++)
        R->bout[i] = i == R->bn - 1 || chance(R, 8);
}

/* Breaks the batch in one of the ways validation must catch (or not:
 * the reference decides). */
static void mutate_batch(run *R)
{
    if (R->bn == 0)
        return;
    int32_t i = rn(R, R->bn);
    switch (rn(R, 6)) {
    case 0: R->bpos[i] += chance(R, 50) ? 1 : -1; break;
    case 1: R->bids[i][0] = chance(R, 50) ? R->n_seq : -1; break;
    case 2: R->bnseq[i] = 2; R->bids[i][1] = R->bids[i][0]; break;
    case 3: R->bn = 0; break;
    case 4: R->bpos[i] = -1 - rn(R, 3); break;
    default:
        if (R->bnseq[i] == 1) {
            R->bnseq[i] = 2;
            R->bids[i][1] = (R->bids[i][0] + 1) % R->n_seq;
        }
        break;
    }
}

/* Whether every token listed in several sequences is shared by sequences
 * with the same history: the forward pass computes such a token once, in
 * the context of its first sequence, which is right only then (the
 * reference's data tags assume it). A mutated batch may break this. */
static bool shared_ok(run *R)
{
    uint64_t h[16];
    for (int32_t s = 0; s < R->n_seq; s++) {
        h[s] = MR_H0 ^ (uint64_t)(uint32_t)memref_pos_max(R->ref, s);
        for (int32_t j = 0; j < memref_seq_len(R->ref, s); j++)
            h[s] = memref_mix(h[s], memref_seq_tok(R->ref, s)[j].token);
    }
    for (int32_t i = 0; i < R->bn; i++) {
        for (int32_t j = 0; j < R->bnseq[i]; j++) {
            int32_t q = R->bids[i][j];
            if (q < 0 || q >= R->n_seq)
                return true; /* invalid anyway */
            if (h[q] != h[R->bids[i][0]])
                return false;
        }
        for (int32_t j = 0; j < R->bnseq[i]; j++)
            h[R->bids[i][j]] = memref_mix(h[R->bids[i][j]], R->btok[i]);
    }
    return true;
}

static void remember_prompts(run *R)
{
    for (int32_t s = 0; s < R->n_seq; s++) {
        int32_t n = memref_seq_len(R->ref, s);
        const mr_tok *t = memref_seq_tok(R->ref, s);
        if (n < 2 || n > 320 || !chance(R, 30))
            continue;
        bool canon = true;
        for (int32_t j = 0; j < n && canon; j++)
            canon = t[j].pos == j;
        if (!canon)
            continue;
        prompt *p = &R->prompts[R->n_prompts < 24 ? R->n_prompts++ : rn(R, 24)];
        p->n = n;
        for (int32_t j = 0; j < n; j++)
            p->tok[j] = t[j].token;
    }
}

/* --- plans --------------------------------------------------------------------------- */

static void busy_probe(run *R)
{
    llmem_plan *p2 = NULL;
    llmem_batch b;
    size_t sz = 0;
    uint8_t byte = 0;
    llmem_status st[] = {
        llmem_memory_seq_rm(R->mem, 0, -1, -1),
        llmem_memory_seq_cp(R->mem, 0, 1 % R->n_seq, -1, -1),
        llmem_memory_seq_keep(R->mem, 0), llmem_memory_seq_add(R->mem, 0, -1, -1, 1),
        llmem_memory_clear(R->mem, false), llmem_memory_state_size(R->mem, -1, &sz),
        llmem_memory_state_read(R->mem, -1, &byte, 1, NULL, 0),
        llmem_memory_plan(R->mem, batch_get(R, &b), LLMEM_SPLIT_AUTO, 8, &p2, NULL, 0)};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        if (st[i] != LLMEM_E_BUSY)
            die(R, "operation %zu during a plan returned %s, not LLMEM_E_BUSY", i,
                llmem_status_str(st[i]));
}

/* New requests: one or two emptied sequences get an earlier prompt (whole
 * or a prefix of it, plus a few new tokens), each in its own tokens, so
 * that they are served by the prefix cache or race to publish the same
 * pages. */
static bool gen_request(run *R)
{
    const mr_config *cfg = R->cfg;
    int32_t ps = cfg->child[0].kv ? cfg->child[0].page_size : 8;
    if (!R->n_prompts)
        return false;
    const prompt *p = &R->prompts[rn(R, R->n_prompts)];
    for (int32_t t = 0; t < 4 && p->n <= ps; t++)
        p = &R->prompts[rn(R, R->n_prompts)];
    int32_t n_req = chance(R, 30) ? 2 : 1, seqs[2];
    seqs[0] = rn(R, R->n_seq);
    seqs[1] = (seqs[0] + 1 + rn(R, R->n_seq - 1)) % R->n_seq;
    R->bn = 0;
    for (int32_t q = 0; q < n_req; q++) {
        int32_t s = seqs[q];
        note(R, "seq_rm(%d) for a new request", s);
        expect_status(R, "seq_rm", llmem_memory_seq_rm(R->mem, s, -1, -1),
                      memref_seq_rm(R->ref, s, -1, -1));
        int32_t take = chance(R, 60) ? p->n : 1 + rn(R, p->n);
        int32_t n = take + (chance(R, 70) ? 1 + rn(R, ps) : 0);
        for (int32_t j = 0; j < n && R->bn < 1000; j++) {
            int32_t b = R->bn++;
            R->btok[b] = j < take ? p->tok[j] : 1 + rn(R, 400);
            R->bpos[b] = j;
            R->bnseq[b] = 1;
            R->bids[b][0] = s;
            R->bout[b] = j == n - 1 || chance(R, 2);
        }
    }
    check_all(R, "seq_rm for a new request");
    R->bout_null = false;
    return true;
}

static void op_plan(run *R, bool request)
{
    char err[512] = "";
    llmem_split split = LLMEM_SPLIT_AUTO;
    int32_t k = rn(R, 100);
    if (R->has_rs)
        split = k < 70 ? LLMEM_SPLIT_AUTO : k < 85 ? LLMEM_SPLIT_EQUAL
                                      : k < 95 ? LLMEM_SPLIT_SEQ : LLMEM_SPLIT_SIMPLE;
    else
        split = k < 60 ? LLMEM_SPLIT_AUTO : k < 75 ? LLMEM_SPLIT_SIMPLE
                                      : k < 90 ? LLMEM_SPLIT_EQUAL : LLMEM_SPLIT_SEQ;
    bool equal = R->has_rs || (split != LLMEM_SPLIT_AUTO && split != LLMEM_SPLIT_SIMPLE);
    if (!request || !gen_request(R))
        gen_batch(R, equal && chance(R, 90));
    bool broken = !request && chance(R, 8);
    if (broken) {
        R->kn = R->bn;
        memcpy(R->kpos, R->bpos, sizeof R->kpos);
        memcpy(R->knseq, R->bnseq, sizeof R->knseq);
        memcpy(R->kids, R->bids, sizeof R->kids);
        mutate_batch(R);
        if (!shared_ok(R)) { /* keep the batch as it was */
            broken = false;
            R->bn = R->kn;
            memcpy(R->bpos, R->kpos, sizeof R->kpos);
            memcpy(R->bnseq, R->knseq, sizeof R->knseq);
            memcpy(R->bids, R->kids, sizeof R->kids);
        }
    }
    k = rn(R, 100);
    int32_t n_ubatch = k < 45 ? 512 : k < 75 ? 1 + rn(R, 8) : 1 + rn(R, R->bn + 2);
    if (chance(R, 1))
        n_ubatch = 0;
    llmem_batch b;
    batch_get(R, &b);
    for (int32_t i = 0; R->trace && i < R->bn; i++)
        fprintf(stderr, "      [%d] tok %d pos %d seqs %d%s%s%s\n", i, R->btok[i], R->bpos[i],
                R->bids[i][0], R->bnseq[i] > 1 ? "+" : "", R->bnseq[i] > 2 ? "+" : "",
                (R->bout_null ? i == R->bn - 1 : R->bout[i]) ? " out" : "");
    note(R, "plan %d tokens (first seq %d pos %d, %d seqs/token) split %d n_ubatch %d%s", R->bn,
         R->bn ? R->bids[0][0] : -1, R->bn ? R->bpos[0] : -1, R->bn ? R->bnseq[0] : 0,
         (int)split, n_ubatch, broken ? " (mutated)" : "");
    int32_t n_cached[16] = {0};
    llmem_status want = memref_plan(R->ref, &b, split, n_ubatch, n_cached);
    llmem_plan *plan = NULL;
    llmem_status got = llmem_memory_plan(R->mem, &b, split, n_ubatch, &plan, err, sizeof err);
    R->n_plans++;
    if (got != want)
        die(R, "plan returned %s (%s), the reference predicts %s", llmem_status_str(got), err,
            llmem_status_str(want));
    if (got != LLMEM_OK) {
        R->n_nospace += got == LLMEM_E_NO_SPACE;
        if (plan)
            die(R, "a failed plan returned a plan");
        check_all(R, "failed plan");
        return;
    }
    R->n_plans_ok++;
    for (int32_t s = 0; s < R->n_seq; s++) {
        if (llmem_plan_n_cached(plan, s) != n_cached[s])
            die(R, "seq %d: %d tokens from the prefix cache, the reference predicts %d", s,
                llmem_plan_n_cached(plan, s), n_cached[s]);
        R->n_hits += n_cached[s] > 0;
    }
    if (!memref_check_plan(R->ref, plan, err, sizeof err) || !memref_bind(R->ref, err, sizeof err))
        die(R, "after plan: %s", err);
    int32_t n_ub = llmem_plan_n_ubatch(plan), stop = n_ub;
    bool apply_last = false;
    if (chance(R, 15)) {
        stop = rn(R, n_ub);
        apply_last = chance(R, 50);
    }
    for (int32_t u = 0; u < n_ub && (u < stop || (u == stop && apply_last)); u++) {
        const llmem_ubatch *ub = NULL;
        expect_status(R, "apply", llmem_memory_apply(R->mem, plan, u, &ub), LLMEM_OK);
        if (ub != llmem_plan_ubatch(plan, u))
            die(R, "apply returned another ubatch");
        if (!memref_capture(R->ref, ub, u, err, sizeof err))
            die(R, "ubatch %d of %d: %s", u, n_ub, err);
        if (chance(R, 3))
            busy_probe(R);
        if (u == stop)
            break; /* applied, never committed */
        if (!memref_forward(R->ref, ub, err, sizeof err))
            die(R, "ubatch %d forward: %s", u, err);
        expect_status(R, "commit", llmem_memory_commit(R->mem, plan, u), LLMEM_OK);
        memref_commit(R->ref, ub);
        if (chance(R, 10)) {
            if (!memref_bind(R->ref, err, sizeof err) || !memref_compare(R->ref, err, sizeof err))
                die(R, "after commit %d: %s", u, err);
        }
    }
    llmem_memory_release(R->mem, plan);
    memref_release(R->ref, apply_last && stop < n_ub);
    note(R, "plan %d tokens: %d ubatches, committed %d%s", R->bn, n_ub, stop,
         apply_last && stop < n_ub ? " (+1 applied)" : "");
    check_all(R, "plan");
    remember_prompts(R);
}

/* --- sequence operations ------------------------------------------------------------- */

static int32_t pick_seq(run *R, bool nonempty)
{
    for (int32_t t = 0; t < 8; t++) {
        int32_t s = rn(R, R->n_seq);
        if (!nonempty || memref_seq_len(R->ref, s))
            return s;
    }
    return rn(R, R->n_seq);
}

/* A position of seq: token j's, or one past the end. */
static int32_t pos_of(run *R, int32_t s, int32_t j)
{
    int32_t n = memref_seq_len(R->ref, s);
    return j < n ? memref_seq_tok(R->ref, s)[j].pos : memref_pos_max(R->ref, s) + 1;
}

static int32_t pick_cut(run *R, int32_t s)
{
    int32_t n = memref_seq_len(R->ref, s);
    int32_t len[128];
    int32_t nh = R->has_rs ? memref_rs_lengths(R->ref, s, len, 128) : 0;
    if (nh > 0 && chance(R, 70))
        return len[rn(R, nh < 128 ? nh : 128)];
    return rn(R, n + 1);
}

static void op_seq(run *R)
{
    char what[160];
    llmem_status want, got;
    int32_t k = rn(R, 100);
    int32_t s = pick_seq(R, true), n = memref_seq_len(R->ref, s);
    if (k < 40 || n > R->max_len) {
        int32_t p0, p1 = -1, mode = n > R->max_len ? 0 : rn(R, 10);
        if (mode == 0) {
            p0 = chance(R, 50) ? -1 : 0;
        } else if (mode < 7) {
            p0 = pos_of(R, s, pick_cut(R, s));
            R->n_rollback++;
        } else if (mode < 9 && n > 2) {
            int32_t a = rn(R, n - 1);
            p0 = pos_of(R, s, a);
            p1 = pos_of(R, s, a + 1 + rn(R, n - a - 1)); /* a hole: must fail */
        } else {
            p0 = rn(R, pos_of(R, s, n) + 3);
            p1 = chance(R, 50) ? -1 : p0 + rn(R, 20);
        }
        if (chance(R, 4))
            s = -1;
        snprintf(what, sizeof what, "seq_rm(%d, %d, %d)", s, p0, p1);
        note(R, "%s", what);
        want = memref_seq_rm(R->ref, s, p0, p1);
        got = llmem_memory_seq_rm(R->mem, s, p0, p1);
    } else if (k < 62) {
        int32_t dst = chance(R, 10) ? s : rn(R, R->n_seq), p0 = -1, p1 = -1;
        int32_t mode = rn(R, 10);
        if (mode >= 5 && mode < 8)
            p1 = pos_of(R, s, pick_cut(R, s));
        else if (mode >= 8) {
            p0 = rn(R, 4) - 1;
            p1 = rn(R, pos_of(R, s, n) + 2);
        }
        snprintf(what, sizeof what, "seq_cp(%d -> %d, %d, %d)", s, dst, p0, p1);
        note(R, "%s", what);
        want = memref_seq_cp(R->ref, s, dst, p0, p1);
        got = llmem_memory_seq_cp(R->mem, s, dst, p0, p1);
    } else if (k < 65) {
        snprintf(what, sizeof what, "seq_keep(%d)", s);
        note(R, "%s", what);
        want = memref_seq_keep(R->ref, s);
        got = llmem_memory_seq_keep(R->mem, s);
    } else if (k < 85) {
        int32_t p0 = chance(R, 30) ? -1 : pos_of(R, s, rn(R, n + 1));
        int32_t p1 = chance(R, 50) ? -1 : p0 + rn(R, 30);
        int32_t delta = chance(R, 5) ? -1000 : rn(R, 17) - 8;
        snprintf(what, sizeof what, "seq_add(%d, %d, %d, %+d)", s, p0, p1, delta);
        note(R, "%s", what);
        want = memref_seq_add(R->ref, s, p0, p1, delta);
        got = llmem_memory_seq_add(R->mem, s, p0, p1, delta);
    } else if (k < 95) {
        int32_t p0 = chance(R, 30) ? -1 : pos_of(R, s, rn(R, n + 1));
        int32_t p1 = chance(R, 50) ? -1 : p0 + rn(R, 30), d = rn(R, 5);
        snprintf(what, sizeof what, "seq_div(%d, %d, %d, /%d)", s, p0, p1, d);
        note(R, "%s", what);
        want = memref_seq_div(R->ref, s, p0, p1, d);
        got = llmem_memory_seq_div(R->mem, s, p0, p1, d);
    } else {
        bool data = chance(R, 50);
        snprintf(what, sizeof what, "clear(%d)", data);
        note(R, "%s", what);
        memref_clear(R->ref);
        want = LLMEM_OK;
        got = llmem_memory_clear(R->mem, data);
        R->n_prompts = chance(R, 50) ? 0 : R->n_prompts;
    }
    expect_status(R, what, got, want);
    if (got == LLMEM_OK && R->has_rs && k < 40 && s >= 0 && memref_seq_len(R->ref, s) > 0 &&
        memref_seq_len(R->ref, s) < n)
        R->n_rollback_ok++;
    check_all(R, what);
}

/* --- state I/O ----------------------------------------------------------------------- */

static void op_state(run *R)
{
    char err[256] = "", what[96];
    int32_t s = chance(R, 20) ? -1 : pick_seq(R, true);
    size_t size = 0, written = 0;
    expect_status(R, "state_size", llmem_memory_state_size(R->mem, s, &size), LLMEM_OK);
    uint8_t *buf = malloc(size + 16), *bad = malloc(size + 16);
    if (!buf || !bad)
        die(R, "out of memory");
    if (size > 0)
        expect_status(R, "state_write (short buffer)",
                      llmem_memory_state_write(R->mem, s, buf, size - 1, &written),
                      LLMEM_E_NO_SPACE);
    expect_status(R, "state_write", llmem_memory_state_write(R->mem, s, buf, size, &written),
                  LLMEM_OK);
    if (written != size)
        die(R, "state_write wrote %zu bytes, state_size said %zu", written, size);
    mr_saved *sv = memref_save(R->ref, s);
    /* damaged streams: one flipped byte, a truncation, a trailing byte */
    for (int32_t t = 0; t < 3; t++) {
        size_t n = size;
        memcpy(bad, buf, size);
        int32_t mode = rn(R, 3);
        if (mode == 0)
            bad[rn(R, (int32_t)size)] ^= (uint8_t)(1u << rn(R, 8));
        else if (mode == 1)
            n = (size_t)rn(R, (int32_t)size);
        else
            bad[n++] = (uint8_t)rn(R, 256);
        int32_t into = s < 0 ? -1 : rn(R, R->n_seq);
        note(R, "state_read(%d) of a damaged stream of seq %d (mode %d)", into, s, mode);
        llmem_status st = llmem_memory_state_read(R->mem, into, bad, n, err, sizeof err);
        if (st == LLMEM_OK)
            die(R, "state_read accepted a damaged stream (mode %d, %zu of %zu bytes)", mode, n,
                size);
        check_all(R, "damaged state_read");
    }
    int32_t into = s;
    if (s >= 0) {
        int32_t mode = rn(R, 3);
        if (mode == 0) {
            note(R, "seq_rm(%d) before reading it back", s);
            expect_status(R, "seq_rm", llmem_memory_seq_rm(R->mem, s, -1, -1),
                          memref_seq_rm(R->ref, s, -1, -1));
        } else if (mode == 1) {
            for (int32_t q = 0; q < R->n_seq; q++)
                if (memref_seq_len(R->ref, q) == 0)
                    into = q;
        } else {
            into = rn(R, R->n_seq);
        }
    } else {
        note(R, "clear before reading every sequence back");
        memref_clear(R->ref);
        expect_status(R, "clear", llmem_memory_clear(R->mem, chance(R, 50)), LLMEM_OK);
    }
    snprintf(what, sizeof what, "state_read(%d) of seq %d (%zu bytes)", into, s, size);
    note(R, "%s", what);
    llmem_status want = memref_load(R->ref, into, sv);
    llmem_status got = llmem_memory_state_read(R->mem, into, buf, size, err, sizeof err);
    if (got != want)
        die(R, "%s returned %s (%s), the reference predicts %s", what, llmem_status_str(got), err,
            llmem_status_str(want));
    check_all(R, what);
    memref_saved_free(sv);
    free(buf);
    free(bad);
}

/* --- a run ------------------------------------------------------------------------------ */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

void memmodel_run(const char *name, const mr_config *cfg, int32_t default_iters, uint64_t salt)
{
    run *R = calloc(1, sizeof *R);
    ck_assert_ptr_nonnull(R);
    R->name = name;
    R->base_seed = env_u64("LLMEM_TEST_SEED", 20240611);
    R->seed = R->base_seed * 1000003ull + salt;
    R->trace = getenv("LLMEM_TEST_TRACE") != NULL;
    R->rng = R->seed;
    R->cfg = cfg;
    R->n_seq = cfg->n_seq_max;
    for (int32_t c = 0; c < cfg->n_children; c++) {
        R->has_rs |= !cfg->child[c].kv;
        R->has_kv |= cfg->child[c].kv;
    }
    R->max_len = R->has_rs && !R->has_kv ? 300 : 500;
    char err[256] = "";
    ck_assert_msg(llmem_backend_open("cpu", -1, &R->be, err, sizeof err) == LLMEM_OK, "%s", err);
    R->ref = memref_create(R->be, cfg, &R->mem, err, sizeof err);
    ck_assert_msg(R->ref != NULL, "%s", err);
    int64_t iters = (int64_t)env_u64("LLMEM_TEST_ITERS", (uint64_t)default_iters);
    note(R, "start");
    check_all(R, "create");
    for (R->op = 1; R->op <= iters; R->op++) {
        int32_t k = rn(R, 100);
        if (k < 45)
            op_plan(R, false);
        else if (k < 55)
            op_plan(R, true);
        else if (k < 92)
            op_seq(R);
        else
            op_state(R);
    }
    printf("%s: %lld operations (seed %llu): %lld plans, %lld ok, %lld NO_SPACE, %lld prefix "
           "hits, %lld evictions, %lld cuts tried, %lld recurrent rollbacks\n",
           name, (long long)iters, (unsigned long long)R->base_seed, (long long)R->n_plans,
           (long long)R->n_plans_ok, (long long)R->n_nospace, (long long)R->n_hits,
           (long long)memref_evictions(R->ref), (long long)R->n_rollback,
           (long long)R->n_rollback_ok);
    /* snapshots and the prefix budget covered ground (issue 13) */
    llmem_memory_stats ms;
    memref_stats(R->ref, &ms);
    bool snaps = false, budget = false;
    for (int32_t c = 0; c < cfg->n_children; c++) {
        snaps |= !cfg->child[c].kv && cfg->child[c].n_snap > 0;
        budget |= cfg->child[c].budget > 0;
    }
    if (snaps) {
        printf("%s: %lld snapshot hit tokens, %lld snapshots evicted\n", name,
               (long long)ms.snapshot_hit_tokens, (long long)ms.snapshot_evictions);
        ck_assert_int_gt(ms.snapshot_hit_tokens, 0);
        ck_assert_int_gt(ms.snapshot_evictions, 0);
    }
    if (budget && R->has_kv)
        ck_assert_int_gt(memref_evictions(R->ref), 0);
    memref_destroy(R->ref);
    llmem_memory_destroy(R->mem);
    llmem_backend_close(R->be);
    free(R);
}

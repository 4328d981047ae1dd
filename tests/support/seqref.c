/* The generic sequence-level reference (seqref.h). Plain arrays and
 * linear scans: each rule is the contract of <llmem/memory.h> as the
 * memory's declared semantics specialise it. */
#include "support/seqref.h"
#include "support/run.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#define SR_MAX_SEQ 16
#define SR_MAX_TOK 160

typedef struct sr_seq {
    int32_t n;
    int32_t tok[SR_MAX_TOK], pos[SR_MAX_TOK];
} sr_seq;

struct seqref {
    llmem_memory *mem;
    seqref_semantics sem;
    int32_t n_seq;
    sr_seq seq[SR_MAX_SEQ];
    seqref_counts counts;
    const char *step; /* the step being checked, for messages */
    seqref_state_fn state_fn;
    void *state_ctx;
};

void seqref_set_state_check(seqref *r, seqref_state_fn fn, void *ctx)
{
    r->state_fn = fn;
    r->state_ctx = ctx;
}

seqref_semantics seqref_combine(seqref_semantics a, seqref_semantics b)
{
    seqref_semantics c = a;
    c.cut = a.cut > b.cut ? a.cut : b.cut;
    c.copy_prefix = a.copy_prefix && b.copy_prefix;
    c.shift = a.shift && b.shift;
    c.may_fill = a.may_fill || b.may_fill;
    c.state_tags = a.state_tags || b.state_tags;
    for (int32_t i = 0; i < b.n_kinds && c.n_kinds < 4; i++) {
        bool have = false;
        for (int32_t j = 0; j < c.n_kinds; j++)
            have |= c.kinds[j] == b.kinds[i];
        if (!have)
            c.kinds[c.n_kinds++] = b.kinds[i];
    }
    return c;
}

seqref *seqref_create(llmem_memory *mem, const seqref_semantics *sem)
{
    seqref *r = calloc(1, sizeof *r);
    ck_assert_ptr_nonnull(r);
    r->mem = mem;
    r->sem = *sem;
    r->n_seq = llmem_memory_n_seq_max(mem);
    ck_assert_int_le(r->n_seq, SR_MAX_SEQ);
    return r;
}

void seqref_destroy(seqref *r)
{
    free(r);
}

seqref_counts seqref_get_counts(const seqref *r)
{
    return r->counts;
}

static uint32_t rnd(uint64_t *s, uint32_t n)
{
    uint32_t v = test_rand32(s);
    return n ? v % n : 0;
}

static int32_t pos_min(const sr_seq *q)
{
    int32_t m = -1;
    for (int32_t i = 0; i < q->n; i++)
        m = m < 0 || q->pos[i] < m ? q->pos[i] : m;
    return m;
}

static int32_t pos_max(const sr_seq *q)
{
    int32_t m = -1;
    for (int32_t i = 0; i < q->n; i++)
        m = q->pos[i] > m ? q->pos[i] : m;
    return m;
}

/* Every sequence as the memory reports it, and its invariant checker. */
static void compare(seqref *r)
{
    int32_t got[SR_MAX_TOK + 1];
    for (int32_t s = 0; s < r->n_seq; s++) {
        const sr_seq *q = &r->seq[s];
        int32_t n = llmem_memory_seq_tokens(r->mem, s, got, SR_MAX_TOK + 1);
        ck_assert_msg(n == q->n, "%s: seq %d holds %d tokens, reference %d", r->step, s, n, q->n);
        for (int32_t i = 0; i < n; i++)
            ck_assert_msg(got[i] == q->tok[i], "%s: seq %d token %d: %d vs %d", r->step, s, i,
                          got[i], q->tok[i]);
        ck_assert_int_eq(llmem_memory_seq_len(r->mem, s), q->n);
        ck_assert_msg(llmem_memory_seq_pos_min(r->mem, s) == pos_min(q) &&
                          llmem_memory_seq_pos_max(r->mem, s) == pos_max(q),
                      "%s: seq %d positions [%d, %d] vs [%d, %d]", r->step, s,
                      llmem_memory_seq_pos_min(r->mem, s), llmem_memory_seq_pos_max(r->mem, s),
                      pos_min(q), pos_max(q));
    }
    char err[256] = "";
    ck_assert_msg(llmem_memory_check(r->mem, err, sizeof err) == LLMEM_OK, "%s: %s", r->step, err);
}

static void append(sr_seq *q, int32_t tok, int32_t pos)
{
    ck_assert_int_lt(q->n, SR_MAX_TOK);
    q->tok[q->n] = tok;
    q->pos[q->n] = pos;
    q->n++;
}

/* Token ids follow positions mostly, so new sequences share prefixes
 * (prefix caching) and sometimes not. */
static int32_t token_at(uint64_t *rng, int32_t pos)
{
    return rnd(rng, 8) == 0 ? 1000 + (int32_t)rnd(rng, 50) : (pos * 7) % 53;
}

/* Tag of a token prefix: 0 when empty, else in [1, 999983], exact in f32. */
static float tag_of(const int32_t *tok, int32_t n)
{
    uint32_t h = 0;
    for (int32_t i = 0; i < n; i++)
        h = (h * 131u + (uint32_t)tok[i] + 7u) % 999983u + 1u;
    return (float)h;
}

static void tag_io(llmem_buffer *buf, size_t slot_bytes, int32_t slot, float *v, bool put)
{
    size_t off[2] = {(size_t)slot * slot_bytes, (size_t)slot * slot_bytes + slot_bytes - 4};
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(put ? llmem_buffer_upload(buf, off[k], &v[k], 4)
                             : llmem_buffer_download(buf, off[k], &v[k], 4),
                         LLMEM_OK);
}

/* The state_tags check of one recurrent view (seqref_semantics): add[s]
 * holds the plan's new tokens of sequence s, after r->seq[s]. */
/* Token ids sequence s holds before ubatch position p0: what the
 * reference held before the plan, then the plan's tokens at positions
 * before p0 (ubatches skipped by a prefix hit included). Returns the count. */
static int32_t prefix_before(const seqref *r, const sr_seq *add, int32_t s, int32_t p0,
                             int32_t *hist)
{
    int32_t n = 0;
    for (int32_t i = 0; i < r->seq[s].n; i++)
        hist[n++] = r->seq[s].tok[i];
    for (int32_t i = 0; i < add[s].n && add[s].pos[i] < p0; i++)
        hist[n++] = add[s].tok[i];
    return n;
}

static int32_t group_first(const llmem_ubatch *ub, int32_t g)
{
    for (int32_t t = 0; t < ub->n_tokens; t++)
        if (ub->seq[t] == g)
            return t;
    ck_abort_msg("ubatch group %d has no token", g);
    return -1;
}

/* The seqref_state_fn call of one recurrent view. */
static void call_state_fn(seqref *r, const llmem_ubatch *ub, const llmem_view *v,
                          const sr_seq *add, int32_t il)
{
    static int32_t hist[SR_MAX_SEQ][SR_MAX_TOK];
    const int32_t *pre[SR_MAX_SEQ];
    int32_t n[SR_MAX_SEQ];
    ck_assert_int_le(ub->n_seqs, SR_MAX_SEQ);
    for (int32_t g = 0; g < ub->n_seqs; g++) {
        n[g] = prefix_before(r, add, ub->seq_id[g], ub->pos[group_first(ub, g)], hist[g]);
        pre[g] = hist[g];
    }
    r->state_fn(r->state_ctx, ub, v, il, pre, n);
}

static void check_tags(seqref *r, const llmem_ubatch *ub, const llmem_rs_view *rv,
                       const sr_seq *add, int32_t il)
{
    int32_t T = ub->n_seq_tokens;
    ck_assert_msg(T > 0 && ub->n_tokens == ub->n_seqs * T, "recurrent ubatch is not equal-split");
    ck_assert_int_eq(rv->n_seqs, ub->n_seqs);
    int32_t nc = rv->n_ckpt;
    float *want = calloc((size_t)ub->n_seqs * (size_t)(T + 1), sizeof *want);
    int32_t hist[2 * SR_MAX_TOK];
    ck_assert_ptr_nonnull(want);
    for (int32_t g = 0; g < ub->n_seqs; g++) {
        int32_t n = prefix_before(r, add, ub->seq_id[g], ub->pos[group_first(ub, g)], hist);
        want[g * (T + 1)] = tag_of(hist, n); /* before the group */
        for (int32_t t = 0, j = 0; t < ub->n_tokens; t++)
            if (ub->seq[t] == g) {
                hist[n++] = ub->token[t];
                want[g * (T + 1) + ++j] = tag_of(hist, n);
            }
    }
    for (int32_t k = 0; k < rv->n_states; k++) {
        if (rv->desc[k].dtype != LLMEM_DTYPE_F32)
            continue;
        size_t sb = llmem_state_slot_bytes(&rv->desc[k]);
        /* every src is read before any dst or checkpoint is written: they may alias */
        for (int32_t g = 0; g < ub->n_seqs; g++) {
            float got[2] = {0, 0}, w = want[g * (T + 1)];
            int32_t src = rv->src_slot.host[g];
            if (src >= 0)
                tag_io(rv->state[k], sb, src, got, false);
            ck_assert_msg(got[0] == w && got[1] == w,
                          "%s: layer %d state %s of seq %d (src slot %d) holds tags %.0f/%.0f, "
                          "the reference %.0f",
                          r->step, il, rv->desc[k].name, ub->seq_id[g], src, got[0], got[1], w);
            r->counts.states_checked += src >= 0;
        }
        for (int32_t g = 0; g < ub->n_seqs; g++) {
            float v[2];
            for (int32_t j = 0; j < nc; j++) {
                int32_t slot = rv->ckpt_slot.host ? rv->ckpt_slot.host[g * nc + j] : -1;
                int32_t after = T - nc + j; /* 0-based token index */
                if (slot < 0 || after < 0)
                    continue;
                v[0] = v[1] = want[g * (T + 1) + after + 1];
                tag_io(rv->state[k], sb, slot, v, true);
            }
            v[0] = v[1] = want[g * (T + 1) + T];
            tag_io(rv->state[k], sb, rv->dst_slot.host[g], v, true);
        }
    }
    free(want);
}

static void step_plan(seqref *r, uint64_t *rng)
{
    r->step = "plan";
    llmem_batch_buf *b;
    ck_assert_int_eq(llmem_batch_buf_create(64, 1, &b), LLMEM_OK);
    sr_seq add[SR_MAX_SEQ];
    memset(add, 0, sizeof add);
    int32_t n_pick = 1 + (int32_t)rnd(rng, 3), any = 0;
    for (int32_t k = 0; k < n_pick; k++) {
        int32_t s = (int32_t)rnd(rng, (uint32_t)r->n_seq);
        if (add[s].n)
            continue;
        int32_t n = 1 + (int32_t)rnd(rng, 6), p0 = pos_max(&r->seq[s]) + 1;
        if (r->seq[s].n + n > SR_MAX_TOK - 8)
            continue;
        for (int32_t i = 0; i < n; i++) {
            int32_t tok = token_at(rng, p0 + i);
            ck_assert_int_eq(llmem_batch_buf_add(b, tok, p0 + i, &s, 1, i == n - 1), LLMEM_OK);
            append(&add[s], tok, p0 + i);
            any++;
        }
    }
    if (!any) {
        llmem_batch_buf_destroy(b);
        return;
    }
    llmem_plan *plan = NULL;
    char err[256] = "";
    llmem_status st = llmem_memory_plan(r->mem, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO,
                                        1 + (int32_t)rnd(rng, 8), &plan, err, sizeof err);
    if (st == LLMEM_E_NO_SPACE && r->sem.may_fill) {
        r->counts.plans_full++; /* refused: nothing changed (compare) */
    } else {
        ck_assert_msg(st == LLMEM_OK, "plan: %s (%s)", llmem_status_str(st), err);
        int32_t n_layers = llmem_memory_n_layers(r->mem);
        for (int32_t i = 0; i < llmem_plan_n_ubatch(plan); i++) {
            const llmem_ubatch *ub = NULL;
            ck_assert_int_eq(llmem_memory_apply(r->mem, plan, i, &ub), LLMEM_OK);
            for (int32_t il = 0; il < n_layers; il++) {
                llmem_view v;
                ck_assert_int_eq(llmem_memory_view(r->mem, il, &v), LLMEM_OK);
                bool declared = false;
                for (int32_t k = 0; k < r->sem.n_kinds; k++)
                    declared |= v.kind == r->sem.kinds[k];
                char name[12];
                ck_assert_msg(declared, "layer %d shows an undeclared view kind %s", il,
                              llmem_view_kind_name(v.kind, name));
                if (r->sem.state_tags && v.kind == LLMEM_VIEW_RECURRENT)
                    check_tags(r, ub, llmem_view_rs(&v), add, il);
                if (r->state_fn && v.kind == LLMEM_VIEW_RECURRENT)
                    call_state_fn(r, ub, &v, add, il);
            }
            ck_assert_int_eq(llmem_memory_commit(r->mem, plan, i), LLMEM_OK);
        }
        llmem_memory_release(r->mem, plan);
        for (int32_t s = 0; s < r->n_seq; s++)
            for (int32_t i = 0; i < add[s].n; i++)
                append(&r->seq[s], add[s].tok[i], add[s].pos[i]);
        r->counts.plans_ok++;
    }
    llmem_batch_buf_destroy(b);
}

/* Removes the tokens at index >= k of q. */
static void cut_at(sr_seq *q, int32_t k)
{
    q->n = k;
}

static void step_rm(seqref *r, uint64_t *rng)
{
    r->step = "seq_rm";
    int32_t s = (int32_t)rnd(rng, (uint32_t)r->n_seq);
    sr_seq *q = &r->seq[s];
    if (q->n == 0 || rnd(rng, 4) == 0) { /* the whole sequence */
        ck_assert_int_eq(llmem_memory_seq_rm(r->mem, s, -1, -1), LLMEM_OK);
        cut_at(q, 0);
        r->counts.cuts_ok++;
        return;
    }
    int32_t k = (int32_t)rnd(rng, (uint32_t)q->n); /* first removed token */
    /* positions are nondecreasing (appends, whole-sequence shifts), so
     * [pos[k], end) is the suffix from the first token at pos[k] */
    while (k > 0 && q->pos[k - 1] == q->pos[k])
        k--;
    llmem_status st = llmem_memory_seq_rm(r->mem, s, q->pos[k], -1);
    bool must_ok = r->sem.cut == SEQREF_CUT_ANY || k == 0;
    bool must_refuse = r->sem.cut == SEQREF_CUT_WHOLE && k > 0;
    if (st == LLMEM_OK) {
        ck_assert_msg(!must_refuse, "seq_rm: a cut at token %d of %d was accepted", k, q->n);
        cut_at(q, k);
        r->counts.cuts_ok++;
    } else {
        ck_assert_msg(st == LLMEM_E_STATE && !must_ok, "seq_rm of seq %d from %d: %s", s, k,
                      llmem_status_str(st));
        r->counts.cuts_refused++;
    }
}

static void step_cp(seqref *r, uint64_t *rng)
{
    r->step = "seq_cp";
    int32_t src = (int32_t)rnd(rng, (uint32_t)r->n_seq), dst = (int32_t)rnd(rng, (uint32_t)r->n_seq);
    sr_seq *a = &r->seq[src];
    if (src == dst || a->n == 0)
        return;
    int32_t k = a->n, p1 = -1;
    if (r->sem.copy_prefix && rnd(rng, 2)) {
        k = 1 + (int32_t)rnd(rng, (uint32_t)a->n); /* tokens copied */
        while (k < a->n && a->pos[k] == a->pos[k - 1])
            k++;
        p1 = k < a->n ? a->pos[k] : -1;
    }
    llmem_status st = llmem_memory_seq_cp(r->mem, src, dst, -1, p1);
    if (st == LLMEM_E_NO_SPACE && r->sem.may_fill)
        return;
    ck_assert_msg(st == LLMEM_OK, "seq_cp %d -> %d (%d tokens): %s", src, dst, k,
                  llmem_status_str(st));
    sr_seq *b = &r->seq[dst];
    memcpy(b->tok, a->tok, (size_t)k * sizeof *b->tok);
    memcpy(b->pos, a->pos, (size_t)k * sizeof *b->pos);
    b->n = k;
    r->counts.copies++;
}

static void step_shift(seqref *r, uint64_t *rng, bool div)
{
    r->step = div ? "seq_div" : "seq_add";
    int32_t s = (int32_t)rnd(rng, (uint32_t)r->n_seq);
    sr_seq *q = &r->seq[s];
    if (q->n == 0)
        return;
    int32_t delta = (int32_t)rnd(rng, 6) - pos_min(q) / 2; /* keeps positions >= 0 */
    llmem_status st = div ? llmem_memory_seq_div(r->mem, s, -1, -1, 2)
                          : llmem_memory_seq_add(r->mem, s, -1, -1, delta);
    if (!r->sem.shift) {
        ck_assert_int_eq(st, LLMEM_E_UNSUPPORTED);
        return;
    }
    /* a KV cache copies shared pages before re-rotating their keys */
    if (st == LLMEM_E_NO_SPACE && r->sem.may_fill)
        return;
    ck_assert_msg(st == LLMEM_OK, "%s: %s", r->step, llmem_status_str(st));
    for (int32_t i = 0; i < q->n; i++)
        q->pos[i] = div ? q->pos[i] / 2 : q->pos[i] + delta;
    r->counts.shifts++;
}

void seqref_step(seqref *r, uint64_t *rng)
{
    uint32_t x = rnd(rng, 100);
    if (x < 50) {
        step_plan(r, rng);
    } else if (x < 66) {
        step_rm(r, rng);
    } else if (x < 78) {
        step_cp(r, rng);
    } else if (x < 82) {
        r->step = "seq_keep";
        int32_t s = (int32_t)rnd(rng, (uint32_t)r->n_seq);
        ck_assert_int_eq(llmem_memory_seq_keep(r->mem, s), LLMEM_OK);
        for (int32_t q = 0; q < r->n_seq; q++)
            if (q != s)
                r->seq[q].n = 0;
    } else if (x < 92) {
        step_shift(r, rng, false);
    } else if (x < 95) {
        step_shift(r, rng, true);
    } else {
        r->step = "clear";
        ck_assert_int_eq(llmem_memory_clear(r->mem, false), LLMEM_OK);
        for (int32_t q = 0; q < r->n_seq; q++)
            r->seq[q].n = 0;
    }
    compare(r);
}

/* llmem memory/: the prefix-cache skips of a plan being built (how many
 * leading tokens of each new sequence the cache serves, and where a
 * composition asks for a ubatch end to publish state: prefix_cut).
 * O(the batch's pairs + its sequences log its new sequences). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "memory/plan_build.h"

/* In-batch shared prefixes (for prefix_cut): sequences whose batch tokens
 * are idx[first[s], first[s+1]) are sorted by their token ids (merge sort,
 * O(tokens log sequences)); each one's longest prefix shared with another
 * new sequence is its LCP with a neighbour in that order. */
typedef struct lcp_ctx {
    const llmem_batch *b;
    const int32_t *idx, *first;
} lcp_ctx;

static int32_t lcp(const lcp_ctx *c, int32_t s, int32_t t)
{
    int32_t na = c->first[s + 1] - c->first[s], nb = c->first[t + 1] - c->first[t];
    const int32_t *a = c->idx + c->first[s], *bb = c->idx + c->first[t];
    int32_t k = 0;
    while (k < na && k < nb && c->b->token[a[k]] == c->b->token[bb[k]])
        k++;
    return k;
}

static bool seq_less(const lcp_ctx *c, int32_t s, int32_t t)
{
    int32_t k = lcp(c, s, t);
    int32_t na = c->first[s + 1] - c->first[s], nb = c->first[t + 1] - c->first[t];
    if (k == na || k == nb)
        return na < nb;
    return c->b->token[c->idx[c->first[s] + k]] < c->b->token[c->idx[c->first[t] + k]];
}

static void merge_sort(const lcp_ctx *c, int32_t *v, int32_t *tmp, int32_t n)
{
    if (n < 2)
        return;
    int32_t h = n / 2;
    merge_sort(c, v, tmp, h);
    merge_sort(c, v + h, tmp, n - h);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = seq_less(c, v[j], v[i]) ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

/* shared[s] for every candidate (cand[0, n)); false on allocation failure. */
static bool shared_prefixes(const lcp_ctx *c, int32_t *cand, int32_t n, int32_t *shared)
{
    int32_t *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    if (!tmp)
        return false;
    merge_sort(c, cand, tmp, n);
    for (int32_t k = 0; k < n; k++) {
        int32_t a = k > 0 ? lcp(c, cand[k], cand[k - 1]) : 0;
        int32_t z = k + 1 < n ? lcp(c, cand[k], cand[k + 1]) : 0;
        shared[cand[k]] = a > z ? a : z;
    }
    free(tmp);
    return true;
}

/* Whether the prefix cache may serve sequence k of the plan: new (empty,
 * starting at position 0) with at least two tokens. */
static bool skip_candidate(llmem_memory *mem, const llmem_plan_seq *e)
{
    return e->n_new >= 2 && e->first_pos == 0 && mem->iface->seq_pos_max(mem, e->id) < 0;
}

llmem_status plan_prefix_skips(llmem_memory *mem, plan_build *pb, llmem_plan *p)
{
    const llmem_batch *b = pb->b;
    if (!b->token)
        return LLMEM_OK;
    int32_t nk = pb->n_seqs;
    bool any = false; /* (none when every sequence has one pair) */
    for (int32_t k = 0; k < nk && !any && pb->n_pairs > nk; k++)
        any = skip_candidate(mem, &pb->seqs[k]);
    if (!any)
        return LLMEM_OK;
    bool has_cut = mem->iface->struct_size > offsetof(llmem_memory_i, prefix_cut) &&
                   LLMEM_MEMORY_SLOT(mem, prefix_cut);
    /* each sequence's batch tokens, in order (counting sort of the
     * (token, sequence) pairs: O(pairs), not O(sequences x tokens)) */
    int32_t pairs = pb->n_pairs;
    const int32_t *pk = pb->pair_k;
    llmem_status st = LLMEM_E_NO_MEMORY; /* until the end */
    int32_t *shared_len = NULL; /* with a cut: prefix shared with another new sequence */
    int32_t *toks = malloc((size_t)b->n_tokens * sizeof *toks);
    int32_t *idx = malloc((size_t)pairs * sizeof *idx);
    int32_t *first = calloc((size_t)nk + 1, sizeof *first);
    if (!toks || !idx || !first)
        goto out;
    for (int32_t q = 0; q < pairs; q++)
        first[pk[q] + 1]++;
    for (int32_t k = 0; k < nk; k++)
        first[k + 1] += first[k];
    for (int32_t i = 0, q = 0; i < b->n_tokens; i++)
        for (int32_t j = 0; j < tok_nseq(b, i); j++, q++)
            idx[first[pk[q]]++] = i;
    for (int32_t k = nk; k > 0; k--)
        first[k] = first[k - 1];
    first[0] = 0;
    if (has_cut) {
        int32_t *cand = malloc((size_t)nk * sizeof *cand), nc = 0;
        shared_len = calloc((size_t)nk, sizeof *shared_len);
        bool ok = cand && shared_len;
        for (int32_t k = 0; ok && k < nk; k++)
            if (skip_candidate(mem, &pb->seqs[k]))
                cand[nc++] = k;
        lcp_ctx lc = {b, idx, first};
        ok = ok && shared_prefixes(&lc, cand, nc, shared_len);
        free(cand);
        if (!ok)
            goto out;
    }
    for (int32_t k = 0; k < nk; k++) {
        llmem_plan_seq *e = &pb->seqs[k];
        if (!skip_candidate(mem, e))
            continue;
        int32_t n = 0, limit = -1;
        bool shared = false;
        const int32_t *list = idx + first[k];
        for (int32_t q = 0; q < first[k + 1] - first[k] && !shared; q++) {
            int32_t i = list[q];
            shared = tok_nseq(b, i) > 1;
            if (pb->out[i] && limit < 0)
                limit = n;
            toks[n++] = b->token[i];
        }
        if (shared)
            continue;
        if (limit < 0 || limit > n - 1)
            limit = n - 1;
        int32_t m = limit > 0 ? mem->iface->prefix_match(mem, toks, limit) : 0;
        if (m > limit)
            m = limit;
        if (m < 0)
            m = 0;
        int32_t every = 0;
        int32_t cut =
            has_cut ? LLMEM_MEMORY_SLOT(mem, prefix_cut)(mem, toks, limit, m, shared_len[k], &every) : 0;
        if (cut > m && cut < n) {
            if (!pb->snap_at) { /* the plan owns it from here on */
                p->snap_at = pb->snap_at = calloc((size_t)nk, sizeof *pb->snap_at);
                if (!pb->snap_at)
                    goto out;
            }
            pb->snap_at[k] = cut;
            if (every >= 0) { /* -1: written inside a ubatch, no cut */
                if (!pb->cuts && !(pb->cuts = calloc((size_t)nk, sizeof *pb->cuts)))
                    goto out;
                pb->cuts[k] = (seq_cut){cut - m, m, every};
            }
        }
        if (m <= 0)
            continue;
        e->n_cached = m;
        p->info.n_tokens_cached += m;
        for (int32_t q = 0; q < m; q++)
            pb->skip[list[q]] = true;
    }
    st = LLMEM_OK;
out:
    free(shared_len);
    free(toks);
    free(idx);
    free(first);
    return st;
}

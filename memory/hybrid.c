/* llmem memory/: hybrid — any number of child memories, one per model
 * layer. Plans and sequence operations are all-or-nothing across children
 * (dry run on every child, then act); the split is the strictest child's;
 * the reusable prefix is the shortest the children agree on.
 * Reference: llama.cpp llama_memory_hybrid (two children). */
#include <stdlib.h>
#include <string.h>

#include "llmem/hybrid.h"
#include "memory/internal.h"
#include "memory/kv_internal.h"
#include "memory/prefix_budget.h"
#include "memory/rs_internal.h"

typedef struct hybrid {
    llmem_memory base;
    int32_t n_children;
    llmem_memory **child;
    int32_t *layer_child, *layer_local; /* [n_layers] */
    bool ranks; /* tensor-parallel ranks (llmem_hybrid_create_ranks), not layer kinds */
} hybrid;

typedef struct hy_res {
    void **res; /* [n_children] */
} hy_res;

extern const llmem_memory_i hybrid_iface;

static hybrid *hy_of(llmem_memory *mem)
{
    return LLMEM_MEMORY_CAST(hybrid, mem, &hybrid_iface);
}

static int32_t hy_prefix_match(llmem_memory *mem, const int32_t *tokens, int32_t n)
{
    hybrid *h = hy_of(mem);
    /* the longest prefix every child holds in whole units of its own (pages
     * of different sizes): shrink until no child shortens it further */
    int32_t m = n, prev = -1;
    while (m > 0 && m != prev) {
        prev = m;
        for (int32_t c = 0; c < h->n_children && m > 0; c++) {
            llmem_memory *ch = h->child[c];
            int32_t k = ch->iface->prefix_match ? ch->iface->prefix_match(ch, tokens, m) : 0;
            m = k < m ? k : m;
        }
    }
    return m;
}

/* Where a plan should end a ubatch of a new sequence so that a recurrent
 * child publishes a snapshot there: the prefix every attention child holds
 * (whole units of each), or the prefix another new sequence of the batch
 * shares (down to a multiple of the snapshot interval), when it exceeds
 * the agreed hit m and some recurrent child keeps snapshots; else the last
 * multiple of the interval in the prompt. A later request then agrees on
 * it —
 * SGLang's Mamba radix cache splits prefill at the matched node the same
 * way (sglang#31648). */
/* Intervals a prompt's last snapshot boundary must reach for the plan to
 * end a ubatch there when nothing else asks for a cut. */
#define SNAP_CUT_MIN 4

static int32_t hy_prefix_cut(llmem_memory *mem, const int32_t *tokens, int32_t n, int32_t m,
                             int32_t shared, int32_t *every)
{
    hybrid *h = hy_of(mem);
    if (h->ranks) { /* every rank decides as rank 0 does */
        llmem_memory *c0 = h->child[0];
        return LLMEM_MEMORY_SLOT(c0, prefix_cut)
                   ? LLMEM_MEMORY_SLOT(c0, prefix_cut)(c0, tokens, n, m, shared, every)
                   : 0;
    }
    int32_t align = 0; /* a shared prefix is cut at a multiple of the snapshot interval */
    bool inside = true; /* every child with snapshots writes them inside ubatches */
    for (int32_t c = 0; c < h->n_children; c++)
        if (h->child[c]->iface == &recurrent_iface && rs_of(h->child[c])->n_snap > 0) {
            int32_t a = rs_of(h->child[c])->snap_interval;
            align = a > align ? a : align > 0 ? align : 1;
            inside = inside && rs_of(h->child[c])->snap_in_ubatch;
        }
    if (align == 0)
        return 0;
    *every = align > 1 ? align : 0;
    if (shared > n)
        shared = n;
    shared -= shared % align;
    int32_t k = n, prev = -1;
    while (k > m && k != prev) {
        prev = k;
        for (int32_t c = 0; c < h->n_children && k > 0; c++) {
            llmem_memory *ch = h->child[c];
            if (ch->iface == &recurrent_iface)
                continue;
            int32_t j = ch->iface->prefix_match ? ch->iface->prefix_match(ch, tokens, k) : 0;
            k = j < k ? j : k;
        }
    }
    if (shared > k)
        k = shared;
    if (k > m)
        return k;
    /* otherwise end the prompt's prefill at its last snapshot boundary, so
     * the state there is published (a later turn extending this prompt or
     * conversation agrees on whole pages up to it) — for prompts of at
     * least SNAP_CUT_MIN intervals only: the cut costs a ubatch (weights
     * read once more), which at 0% hits made short prompts about 3% dearer
     * on the cpu (docs/benchmarks.md, issue 13); a short prefix is cheap to
     * recompute, and decode steps still publish at every interval. Where
     * the recurrent children write snapshots inside ubatches
     * (snap_in_ubatch), the plan only records the length (*every -1) and
     * the prefill stays whole ubatches */
    *every = inside ? -1 : 0;
    k = align > 1 ? n / align * align : 0;
    return k > m && k >= SNAP_CUT_MIN * align ? k : 0;
}

static llmem_status hy_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                       size_t err_len)
{
    hybrid *h = hy_of(mem);
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_memory *ch = h->child[c];
        llmem_status st = LLMEM_MEMORY_SLOT(ch, reserve_prepare)
                              ? LLMEM_MEMORY_SLOT(ch, reserve_prepare)(ch, plan, err, err_len)
                              : LLMEM_OK;
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

static llmem_status hy_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                               size_t err_len)
{
    hybrid *h = hy_of(mem);
    hy_res *r = calloc(1, sizeof *r);
    if (!r || !(r->res = calloc((size_t)h->n_children, sizeof *r->res))) {
        free(r);
        return LLMEM_E_NO_MEMORY;
    }
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_memory *ch = h->child[c];
        llmem_status st = ch->iface->reserve(ch, plan, &r->res[c], err, err_len);
        if (st != LLMEM_OK) {
            while (--c >= 0)
                h->child[c]->iface->release(h->child[c], plan, r->res[c]);
            free(r->res);
            free(r);
            return st;
        }
    }
    /* children know a plan is in flight (their checks and sequence
     * operations depend on it) */
    for (int32_t c = 0; c < h->n_children; c++)
        h->child[c]->plan = (llmem_plan *)plan;
    *out = r;
    return LLMEM_OK;
}

static llmem_status hy_apply(llmem_memory *mem, const llmem_plan *plan, void *res, int32_t i)
{
    hybrid *h = hy_of(mem);
    hy_res *r = res;
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_status st = h->child[c]->iface->apply(h->child[c], plan, r->res[c], i);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

static llmem_status hy_view(llmem_memory *mem, void *res, int32_t il, llmem_view *view)
{
    hybrid *h = hy_of(mem);
    int32_t c = h->layer_child[il];
    llmem_memory *ch = h->child[c];
    return ch->iface->view(ch, ((hy_res *)res)->res[c], h->layer_local[il], view);
}

/* Every child's fallible device work before any child commits: a child
 * whose copies fail leaves every child as it was (all or nothing). */
static llmem_status hy_commit_prepare(llmem_memory *mem, const llmem_plan *plan, void *res,
                                      int32_t i)
{
    hybrid *h = hy_of(mem);
    hy_res *r = res;
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_memory *ch = h->child[c];
        llmem_status st = LLMEM_MEMORY_SLOT(ch, commit_prepare)
                              ? LLMEM_MEMORY_SLOT(ch, commit_prepare)(ch, plan, r->res[c], i)
                              : LLMEM_OK;
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

/* After hy_commit_prepare, no child's commit fails (commit_prepare's
 * contract, memory_impl.h), so none is left half committed. */
static llmem_status hy_commit(llmem_memory *mem, const llmem_plan *plan, void *res, int32_t i)
{
    hybrid *h = hy_of(mem);
    hy_res *r = res;
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_status st = h->child[c]->iface->commit(h->child[c], plan, r->res[c], i);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

static void hy_release(llmem_memory *mem, const llmem_plan *plan, void *res)
{
    hybrid *h = hy_of(mem);
    hy_res *r = res;
    for (int32_t c = 0; c < h->n_children; c++) {
        h->child[c]->iface->release(h->child[c], plan, r->res[c]);
        h->child[c]->plan = NULL;
    }
    free(r->res);
    free(r);
}

/* pass 0 = dry run on all children; pass 1 = act. A dry call runs pass 0 only. */
static llmem_status hy_seq_rm(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, bool dry)
{
    hybrid *h = hy_of(mem);
    for (int32_t pass = 0; pass < (dry ? 1 : 2); pass++)
        for (int32_t c = 0; c < h->n_children; c++) {
            llmem_status st = h->child[c]->iface->seq_rm(h->child[c], seq, p0, p1, pass == 0);
            if (st != LLMEM_OK)
                return st;
        }
    return LLMEM_OK;
}

static llmem_status hy_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                              int32_t p1, bool dry)
{
    hybrid *h = hy_of(mem);
    for (int32_t pass = 0; pass < (dry ? 1 : 2); pass++)
        for (int32_t c = 0; c < h->n_children; c++) {
            llmem_status st = h->child[c]->iface->seq_cp(h->child[c], src, dst, p0, p1, pass == 0);
            if (st != LLMEM_OK)
                return st;
        }
    return LLMEM_OK;
}

static llmem_status hy_seq_keep(llmem_memory *mem, int32_t seq, bool dry)
{
    hybrid *h = hy_of(mem);
    for (int32_t pass = 0; pass < (dry ? 1 : 2); pass++)
        for (int32_t c = 0; c < h->n_children; c++) {
            llmem_status st = h->child[c]->iface->seq_keep(h->child[c], seq, pass == 0);
            if (st != LLMEM_OK)
                return st;
        }
    return LLMEM_OK;
}

static llmem_status hy_seq_add(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1,
                               int32_t delta, bool dry)
{
    hybrid *h = hy_of(mem);
    for (int32_t pass = 0; pass < (dry ? 1 : 2); pass++)
        for (int32_t c = 0; c < h->n_children; c++) {
            llmem_status st =
                h->child[c]->iface->seq_add(h->child[c], seq, p0, p1, delta, pass == 0);
            if (st != LLMEM_OK)
                return st;
        }
    return LLMEM_OK;
}

static llmem_status hy_seq_div(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, int32_t d,
                               bool dry)
{
    hybrid *h = hy_of(mem);
    for (int32_t pass = 0; pass < (dry ? 1 : 2); pass++)
        for (int32_t c = 0; c < h->n_children; c++) {
            llmem_status st = h->child[c]->iface->seq_div(h->child[c], seq, p0, p1, d, pass == 0);
            if (st != LLMEM_OK)
                return st;
        }
    return LLMEM_OK;
}

static int32_t hy_pos_min(llmem_memory *mem, int32_t seq)
{
    llmem_memory *ch = hy_of(mem)->child[0];
    return ch->iface->seq_pos_min(ch, seq);
}

static int32_t hy_pos_max(llmem_memory *mem, int32_t seq)
{
    llmem_memory *ch = hy_of(mem)->child[0];
    return ch->iface->seq_pos_max(ch, seq);
}

static int32_t hy_seq_tokens(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap)
{
    llmem_memory *ch = hy_of(mem)->child[0];
    return ch->iface->seq_tokens(ch, seq, out, cap);
}

static llmem_status hy_clear(llmem_memory *mem, bool data)
{
    hybrid *h = hy_of(mem);
    llmem_status st = LLMEM_OK;
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_status s = h->child[c]->iface->clear(h->child[c], data);
        st = st == LLMEM_OK ? s : st;
    }
    return st;
}

/* Tensor-parallel ranks: every rank holds the same pages, slots, hits and
 * snapshots (one plan for all), so the counts are rank 0's; the bytes,
 * each rank holding its heads' share, are summed. */
static void ranks_get_stats(hybrid *h, llmem_memory_stats *st)
{
    h->child[0]->iface->get_stats(h->child[0], st);
    for (int32_t c = 1; c < h->n_children; c++) {
        llmem_memory_stats s = {0};
        h->child[c]->iface->get_stats(h->child[c], &s);
        st->bytes_device += s.bytes_device;
        st->snapshot_bytes += s.snapshot_bytes;
        st->snapshot_copy_failures += s.snapshot_copy_failures;
        st->host_tier_bytes += s.host_tier_bytes;
        st->host_tier_snapshot_bytes += s.host_tier_snapshot_bytes;
        st->prefix_cache_bytes += s.prefix_cache_bytes;
        st->cached_kv_bytes += s.cached_kv_bytes;
    }
    st->type = "tp";
}

static void hy_get_stats(llmem_memory *mem, llmem_memory_stats *st)
{
    hybrid *h = hy_of(mem);
    if (h->ranks) {
        ranks_get_stats(h, st);
        return;
    }
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_memory_stats s = {0};
        h->child[c]->iface->get_stats(h->child[c], &s);
        st->pages_total += s.pages_total;
        st->pages_used += s.pages_used;
        st->pages_free += s.pages_free;
        st->pages_cached += s.pages_cached;
        st->pages_peak += s.pages_peak;
        st->slots_total += s.slots_total;
        st->slots_used += s.slots_used;
        st->prefix_hit_tokens += s.prefix_hit_tokens;
        st->prefix_evictions += s.prefix_evictions;
        st->cow_copies += s.cow_copies;
        st->bytes_device += s.bytes_device;
        st->snapshots += s.snapshots;
        st->snapshot_bytes += s.snapshot_bytes;
        st->snapshot_hit_tokens += s.snapshot_hit_tokens;
        st->host_tier_pages += s.host_tier_pages;
        st->host_tier_bytes += s.host_tier_bytes;
        st->host_tier_hits += s.host_tier_hits;
        st->host_tier_snapshots += s.host_tier_snapshots;
        st->host_tier_snapshot_bytes += s.host_tier_snapshot_bytes;
        st->host_tier_snapshot_hits += s.host_tier_snapshot_hits;
        st->cached_kv_bytes += s.cached_kv_bytes;
        st->snapshot_evictions += s.snapshot_evictions;
        st->snapshot_copy_failures += s.snapshot_copy_failures;
        if (s.prefix_cache_bytes > st->prefix_cache_bytes) /* shared: one budget */
            st->prefix_cache_bytes = s.prefix_cache_bytes;
        if (s.n_seqs_live > st->n_seqs_live)
            st->n_seqs_live = s.n_seqs_live;
    }
    st->type = "hybrid";
}

static llmem_status hy_check(llmem_memory *mem, char *err, size_t err_len)
{
    hybrid *h = hy_of(mem);
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_memory *ch = h->child[c];
        llmem_status st = ch->iface->check ? ch->iface->check(ch, err, err_len) : LLMEM_OK;
        if (st != LLMEM_OK)
            return st;
        for (int32_t s = 0; s < mem->n_seq_max && c > 0; s++) {
            llmem_memory *c0 = h->child[0];
            if (ch->iface->seq_pos_max(ch, s) != c0->iface->seq_pos_max(c0, s) ||
                ch->iface->seq_pos_min(ch, s) != c0->iface->seq_pos_min(c0, s) ||
                ch->iface->seq_tokens(ch, s, NULL, 0) != c0->iface->seq_tokens(c0, s, NULL, 0)) {
                llmem_errf(err, err_len, "sequence %d differs between child 0 and child %d", s, c);
                return LLMEM_E_STATE;
            }
        }
    }
    return LLMEM_OK;
}

/* --- state I/O: one section per child (docs/state-format.md) --------------- */

static llmem_status hy_state_write_sections(llmem_memory *mem, int32_t seq,
                                            llmem_state_writer *w, int32_t *n_sections)
{
    hybrid *h = hy_of(mem);
    *n_sections = h->n_children;
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_status st = llmem_state_write_section(h->child[c], seq, w);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

/* Whether every child's section holds the same sequences, token ids and
 * positions as child 0's. */
static bool sections_agree(hybrid *h, int32_t seq, void **tmp, char *err, size_t err_len)
{
    int32_t q0 = seq < 0 ? 0 : -1, q1 = seq < 0 ? h->base.n_seq_max : 0;
    for (int32_t q = q0; q < q1; q++) {
        int32_t len0 = -1;
        const void *tok0 = NULL, *pos0 = NULL;
        for (int32_t k = 0; k < h->n_children; k++) {
            llmem_memory *m = h->child[k];
            int32_t len = -1;
            const void *tok = NULL, *p = NULL;
            if (!LLMEM_MEMORY_SLOT(m, state_read_seq) || !LLMEM_MEMORY_SLOT(m, state_read_seq)(m, tmp[k], q, &len, &tok, &p))
                len = -1;
            if (k == 0) {
                len0 = len;
                tok0 = tok;
                pos0 = p;
            } else if (len != len0 || (len > 0 && (memcmp(tok, tok0, (size_t)len * 4) ||
                                                   memcmp(p, pos0, (size_t)len * 4)))) {
                llmem_errf(err, err_len, "sections 0 and %d disagree on sequence %d", k, q);
                return false;
            }
        }
    }
    return true;
}

/* Prepares every child's section, checks that they agree, then applies
 * them all (none when any fails). */
static llmem_status hy_state_read_sections(llmem_memory *mem, int32_t seq,
                                           const llmem_state_section *sec, int32_t n_sections,
                                           char *err, size_t err_len)
{
    hybrid *h = hy_of(mem);
    if (n_sections != h->n_children) {
        llmem_errf(err, err_len, "stream has %d sections, this memory has %d", n_sections,
                   h->n_children);
        return LLMEM_E_INVALID;
    }
    void **tmp = calloc((size_t)h->n_children, sizeof *tmp);
    if (!tmp)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_OK;
    for (int32_t c = 0; c < h->n_children && st == LLMEM_OK; c++)
        st = llmem_state_prepare_section(h->child[c], seq, &sec[c], c, &tmp[c], err, err_len);
    if (st == LLMEM_OK && !sections_agree(h, seq, tmp, err, err_len))
        st = LLMEM_E_CORRUPT;
    if (st != LLMEM_OK) {
        for (int32_t c = 0; c < h->n_children; c++)
            if (tmp[c])
                h->child[c]->iface->state_read_abort(h->child[c], tmp[c]);
        free(tmp);
        return st;
    }
    for (int32_t c = 0; c < h->n_children; c++) {
        llmem_memory *m = h->child[c];
        llmem_status s2 = m->iface->state_read_apply(m, seq, tmp[c]);
        if (s2 != LLMEM_OK && st == LLMEM_OK)
            st = s2; /* device upload failure after validation: reported, not undone */
    }
    free(tmp);
    return st;
}

static int32_t hy_n_children(llmem_memory *mem)
{
    return hy_of(mem)->n_children;
}

static llmem_memory *hy_child(llmem_memory *mem, int32_t i)
{
    return hy_of(mem)->child[i];
}

static void hy_destroy(llmem_memory *mem)
{
    hybrid *h = hy_of(mem);
    for (int32_t c = 0; c < h->n_children; c++) {
        if (!h->child[c])
            continue;
        h->child[c]->is_child = false;
        llmem_memory_destroy(h->child[c]);
    }
    free(h->child);
    free(h->layer_child);
    free(h->layer_local);
    free(h);
}

const llmem_memory_i hybrid_iface = {
    .struct_size = sizeof(llmem_memory_i),
    .type = "hybrid",
    .destroy = hy_destroy,
    .state_write_sections = hy_state_write_sections,
    .state_read_sections = hy_state_read_sections,
    .prefix_match = hy_prefix_match,
    .prefix_cut = hy_prefix_cut,
    .reserve = hy_reserve,
    .reserve_prepare = hy_reserve_prepare,
    .apply = hy_apply,
    .view = hy_view,
    .commit = hy_commit,
    .commit_prepare = hy_commit_prepare,
    .release = hy_release,
    .seq_rm = hy_seq_rm,
    .seq_cp = hy_seq_cp,
    .seq_keep = hy_seq_keep,
    .seq_add = hy_seq_add,
    .seq_div = hy_seq_div,
    .seq_pos_min = hy_pos_min,
    .seq_pos_max = hy_pos_max,
    .seq_tokens = hy_seq_tokens,
    .clear = hy_clear,
    .get_stats = hy_get_stats,
    .check = hy_check,
    .n_children = hy_n_children,
    .child = hy_child,
};

/* The host tier of a KV cache or recurrent child (NULL for other kinds). */
static host_tier **child_tier(llmem_memory *m)
{
    if (m->iface == &kv_cache_iface)
        return &kv_of(m)->host;
    if (m->iface == &recurrent_iface)
        return &rs_of(m)->host;
    return NULL;
}

/* One host tier for all children (issue 13 item 1): the one of the largest
 * budget among those the children made (all empty yet), so that KV pages
 * and snapshots are evicted least recently used together under one byte
 * budget. Recurrent children with snapshots join it even without a tier
 * of their own; KV caches only with one (a KV cache without prefix cache
 * has none). */
static void share_host_tier(hybrid *h)
{
    host_tier *big = NULL;
    for (int32_t c = 0; c < h->n_children; c++) {
        host_tier **t = child_tier(h->child[c]);
        if (t && *t && (!big || (*t)->budget > big->budget))
            big = *t;
    }
    if (!big)
        return;
    for (int32_t c = 0; c < h->n_children; c++) {
        host_tier **t = child_tier(h->child[c]);
        bool join = t && (*t || (h->child[c]->iface == &recurrent_iface &&
                                 rs_of(h->child[c])->n_snap > 0));
        if (!join || *t == big)
            continue;
        host_tier_unref(*t);
        host_tier_ref(big);
        *t = big;
    }
}

/* The prefix budget slot of a KV cache with a prefix cache or a recurrent
 * memory with snapshots (the children that cache prefix data); NULL for
 * others. */
static prefix_budget **child_budget(llmem_memory *m)
{
    if (m->iface == &kv_cache_iface && !kv_of(m)->p.no_prefix_cache)
        return &kv_of(m)->budget;
    if (m->iface == &recurrent_iface && rs_of(m)->n_snap > 0)
        return &rs_of(m)->budget;
    return NULL;
}

/* Device bytes of the smallest entry each caching child publishes. */
static int64_t child_entry_bytes(llmem_memory *m)
{
    return m->iface == &kv_cache_iface ? kv_entry_bytes(kv_of(m))
                                       : (int64_t)rs_slot_bytes(rs_of(m));
}

/* The largest prefix budget among the children, NULL when none has one. */
static prefix_budget *largest_budget(llmem_memory *const *children, int32_t n)
{
    prefix_budget *big = NULL;
    for (int32_t c = 0; c < n; c++) {
        prefix_budget **b = child_budget(children[c]);
        if (b && *b && (!big || (*b)->bytes > big->bytes))
            big = *b;
    }
    return big;
}

/* Whether one shared budget can serve the caching children: a hybrid hit
 * needs a page of every KV cache and a snapshot cached at once. */
static bool budget_fits(llmem_memory *const *children, int32_t n, char *err, size_t err_len)
{
    prefix_budget *big = largest_budget(children, n);
    if (!big)
        return true;
    int64_t need = 0;
    int32_t members = 0;
    for (int32_t c = 0; c < n; c++)
        if (child_budget(children[c])) {
            need += child_entry_bytes(children[c]);
            members++;
        }
    if (members > PREFIX_BUDGET_MAX_MEMBERS) {
        llmem_errf(err, err_len, "hybrid: %d children cache prefixes; one budget serves at most %d",
                   members, PREFIX_BUDGET_MAX_MEMBERS);
        return false;
    }
    if (big->bytes < need) {
        llmem_errf(err, err_len,
                   "hybrid: prefix_cache_bytes %lld cannot hold what one hit needs: a page of "
                   "every KV cache and a snapshot, %lld bytes",
                   (long long)big->bytes, (long long)need);
        return false;
    }
    return true;
}

/* One prefix budget for all children (issue 13 item 1): the largest among
 * those the children made, which every child caching prefix data joins,
 * so that cached KV pages and snapshots share one byte budget and one LRU.
 * budget_fits has checked it. */
static void share_prefix_budget(hybrid *h)
{
    prefix_budget *big = largest_budget(h->child, h->n_children);
    if (!big)
        return;
    for (int32_t c = 0; c < h->n_children; c++) {
        prefix_budget **b = child_budget(h->child[c]);
        if (!b || *b == big)
            continue;
        prefix_budget_leave(*b, h->child[c]);
        *b = NULL;
        if (prefix_budget_join(big, h->child[c]))
            *b = big;
    }
    prefix_budget_make_room(big, 0);
}

static llmem_status create(llmem_memory *const *children, int32_t n_children,
                           const int32_t *layer_child, int32_t n_layers, bool ranks,
                           llmem_memory **out, char *err, size_t err_len)
{
    llmem_status st = LLMEM_E_INVALID;
    hybrid *h = NULL;
    if (out)
        *out = NULL;
    if (!children || n_children < 1 || !layer_child || n_layers < 1 || !out) {
        llmem_errf(err, err_len, "hybrid: need children, a layer map and n_layers >= 1");
        goto fail;
    }
    for (int32_t c = 0; c < n_children; c++) {
        if (!children[c] || children[c]->is_child || children[c]->plan) {
            llmem_errf(err, err_len, "hybrid: child %d is NULL, already composed or planning", c);
            goto fail;
        }
        if (children[c]->n_seq_max != children[0]->n_seq_max) {
            llmem_errf(err, err_len, "hybrid: child %d has n_seq_max %d, child 0 has %d", c,
                       children[c]->n_seq_max, children[0]->n_seq_max);
            goto fail;
        }
        for (int32_t k = 0; k < c; k++)
            if (children[k] == children[c]) {
                llmem_errf(err, err_len, "hybrid: child %d listed twice", c);
                goto fail;
            }
    }
    if (!ranks && !budget_fits(children, n_children, err, err_len))
        goto fail;
    st = LLMEM_E_NO_MEMORY;
    h = calloc(1, sizeof *h);
    if (!h)
        goto fail;
    h->child = calloc((size_t)n_children, sizeof *h->child);
    h->layer_child = malloc((size_t)n_layers * sizeof *h->layer_child);
    h->layer_local = malloc((size_t)n_layers * sizeof *h->layer_local);
    int32_t *count = calloc((size_t)n_children, sizeof *count);
    if (!h->child || !h->layer_child || !h->layer_local || !count) {
        free(count);
        goto fail_h;
    }
    st = LLMEM_E_INVALID;
    for (int32_t il = 0; il < n_layers; il++) {
        int32_t c = layer_child[il];
        if (c < 0 || c >= n_children) {
            llmem_errf(err, err_len, "hybrid: layer %d maps to child %d (have %d)", il, c,
                       n_children);
            free(count);
            goto fail_h;
        }
        h->layer_child[il] = c;
        h->layer_local[il] = count[c]++;
    }
    for (int32_t c = 0; c < n_children; c++)
        if (count[c] != children[c]->n_layers) {
            llmem_errf(err, err_len, "hybrid: %d layers map to child %d, which has %d", count[c],
                       c, children[c]->n_layers);
            free(count);
            goto fail_h;
        }
    free(count);
    llmem_split split = LLMEM_SPLIT_SIMPLE;
    bool can_shift = true;
    for (int32_t c = 0; c < n_children; c++) {
        split = children[c]->split > split ? children[c]->split : split;
        can_shift = can_shift && children[c]->can_shift;
    }
    if ((st = llmem_memory_init(&h->base, &hybrid_iface, children[0]->backend, n_layers,
                                children[0]->n_seq_max, split, can_shift)) != LLMEM_OK) {
        llmem_memory_iface_check(&hybrid_iface, err, err_len);
        goto fail_h;
    }
    h->n_children = n_children;
    for (int32_t c = 0; c < n_children; c++) {
        h->child[c] = children[c];
        children[c]->is_child = true;
    }
    h->ranks = ranks;
    if (!ranks) { /* a rank's pages hold other heads than the same page of rank 0 */
        share_host_tier(h);
        share_prefix_budget(h);
    }
    *out = &h->base;
    return LLMEM_OK;
fail_h:
    free(h->child);
    free(h->layer_child);
    free(h->layer_local);
    free(h);
fail:
    /* ownership of the children was transferred: destroy them */
    for (int32_t c = 0; children && c < n_children; c++) {
        bool dup = false;
        for (int32_t k = 0; k < c; k++)
            dup |= children[k] == children[c];
        if (children[c] && !dup && !children[c]->is_child)
            llmem_memory_destroy(children[c]);
    }
    return st;
}

llmem_status llmem_hybrid_create(llmem_memory *const *children, int32_t n_children,
                                 const int32_t *layer_child, int32_t n_layers,
                                 llmem_memory **out, char *err, size_t err_len)
{
    return create(children, n_children, layer_child, n_layers, false, out, err, err_len);
}

llmem_status llmem_hybrid_create_ranks(llmem_memory *const *ranks, int32_t n_ranks,
                                       llmem_memory **out, char *err, size_t err_len)
{
    int32_t L = ranks && n_ranks >= 1 && ranks[0] ? ranks[0]->n_layers : 0;
    int32_t *map = NULL;
    llmem_status st = LLMEM_OK;
    if (L < 1 || (int64_t)L * n_ranks > INT32_MAX) {
        llmem_errf(err, err_len, "tp memory: need n_ranks >= 1 memories");
        st = LLMEM_E_INVALID;
    }
    for (int32_t r = 1; st == LLMEM_OK && r < n_ranks; r++)
        if (!ranks[r] || ranks[r]->n_layers != L || ranks[r]->split != ranks[0]->split ||
            ranks[r]->iface != ranks[0]->iface) {
            llmem_errf(err, err_len, "tp memory: rank %d's memory differs from rank 0's (type, "
                                     "layers or split)", r);
            st = LLMEM_E_INVALID;
        }
    if (st == LLMEM_OK && !(map = malloc((size_t)L * (size_t)n_ranks * sizeof *map))) {
        llmem_errf(err, err_len, "tp memory: out of memory");
        st = LLMEM_E_NO_MEMORY;
    }
    if (st != LLMEM_OK) {
        if (out)
            *out = NULL;
        for (int32_t r = 0; ranks && r < n_ranks; r++) /* ownership was transferred */
            llmem_memory_destroy(ranks[r]);
        return st;
    }
    for (int32_t r = 0; r < n_ranks; r++)
        for (int32_t l = 0; l < L; l++)
            map[r * L + l] = r;
    st = create(ranks, n_ranks, map, L * n_ranks, true, out, err, err_len);
    free(map);
    return st;
}

/* llmem memory/: the paged unified KV cache — pages, copy-on-write, prefix
 * reuse, sequence operations, creation. Planning (reserve / apply / commit
 * / release) is in kv_plan.c; state I/O and the invariant checker in
 * kv_state.c; spilling to and restoring from the host tier in kv_host.c.
 * References: PagedAttention (Kwon et al., SOSP 2023); vLLM block manager
 * and automatic prefix caching; llama.cpp llama_kv_cache (seq_* semantics,
 * K-shift after seq_add). */
#include <stdlib.h>
#include <string.h>

#include "memory/kv_internal.h"
#include "memory/prefix_budget.h"

static void poison_page(kv_cache *kv, int32_t p)
{
    uint32_t nan = llmem_nan_pattern(kv->p.dtype);
    for (int32_t il = 0; il < kv->p.n_layers; il++) {
        llmem_buffer_fill(kv->k[il], (size_t)p * kv->page_bytes, kv->page_bytes, nan);
        llmem_buffer_fill(kv->v[il], (size_t)p * kv->page_bytes, kv->page_bytes, nan);
    }
}

void clear_page_shift(kv_cache *kv, int32_t p)
{
    if (!kv->page_shift[p])
        return;
    memset(kv->shift + (size_t)p * (size_t)kv->p.page_size, 0,
           (size_t)kv->p.page_size * sizeof *kv->shift);
    kv->page_shift[p] = 0;
}

static void kv_mag_drain_all(kv_cache *kv);

int32_t kv_alloc_page(kv_cache *kv)
{
    /* empty pages in magazines go back before any cached page is evicted */
    if (kv->pool.n_free == 0 && kv->mag_total > 0)
        kv_mag_drain_all(kv);
    bool was_cached = false;
    int32_t p = page_pool_alloc(&kv->pool, &was_cached);
    if (p < 0)
        return -1;
    if (was_cached && kv->host)
        kv_host_spill(kv, p);
    clear_page_shift(kv, p);
    if (kv->p.poison)
        poison_page(kv, p);
    return p;
}

void kv_unref_page(kv_cache *kv, int32_t p)
{
    if (page_pool_unref(&kv->pool, p)) {
        clear_page_shift(kv, p);
        if (kv->p.poison)
            poison_page(kv, p);
    } else if (kv->budget && kv->pool.ref[p] == 0) {
        /* it became cached: the least recently used cached data of any
         * kind goes until the budget holds it (at worst this page) */
        prefix_budget_make_room(kv->budget, 0);
    }
}

/* --- page magazines (kv_internal.h kv_cache.mag) ------------------------- */

void kv_mag_drain(kv_cache *kv, kv_seq *s)
{
    for (int32_t k = s->mag_at; k < s->mag_end; k++) /* refcount 1 -> free (never published) */
        kv_unref_page(kv, *kv_mag_at(kv, (int32_t)(s - kv->seqs), k));
    kv->mag_total -= s->mag_end - s->mag_at;
    s->mag_at = s->mag_end = 0;
}

static void kv_mag_drain_all(kv_cache *kv)
{
    for (int32_t s = 0; s < kv->base.n_seq_max && kv->mag_total > 0; s++)
        if (kv->seqs[s].mag_at < kv->seqs[s].mag_end)
            kv_mag_drain(kv, &kv->seqs[s]);
}

int32_t kv_mag_quota(const kv_cache *kv, int32_t n_seqs)
{
    if (kv->mag_cap == 0 || n_seqs <= 0 || kv->shift_pending)
        return 0;
    int64_t spare = (int64_t)kv->pool.n_free - kv->mag_floor, q = spare / n_seqs;
    q = q < kv->mag_cap ? q : kv->mag_cap;
    return q >= 2 ? (int32_t)q : 0; /* one page is the plain path's */
}

/* Fills the empty magazines of the plan's sequences that decode one token
 * into a new page (each up to quota pages, as many as its row holds past
 * its table), before the attach pass pops this step's page from them. The
 * pages are dealt round by round, one to each filling sequence in plan
 * order, so that the pages of one later step lie side by side as a
 * plain step's would (the pool's per-page arrays that the commit writes
 * stay dense); then each filler's ids go into its row in one run. */
void kv_mag_fill_plan(kv_cache *kv, const llmem_plan *plan, int32_t quota)
{
    page_pool *pp = &kv->pool;
    int32_t n = 0, *fill = kv->mag_fill;
    for (int32_t e = 0; e < plan->n_seqs; e++) {
        int32_t s = plan->seqs[e].id;
        const kv_seq *q = &kv->seqs[s];
        if (kv->need[s] != 1 || kv->tail[s] >= 0 || q->mag_at < q->mag_end ||
            plan->seqs[e].n_cached > 0 || q->row < 0)
            continue;
        int32_t c = q->row_cap - q->pages.n;
        c = c < quota ? c : quota;
        if (c >= 2)
            fill[n++] = s << 5 | c; /* c <= 16 */
    }
    for (int32_t k = 0; k < quota; k++)
        for (int32_t i = 0; i < n; i++)
            if ((fill[i] & 31) > k) /* the peak counts them when popped (kv_mag_pop) */
                *kv_mag_at(kv, fill[i] >> 5, k) = page_pool_pop_free(pp);
    for (int32_t i = 0; i < n; i++) {
        int32_t s = fill[i] >> 5, c = fill[i] & 31;
        kv_seq *q = &kv->seqs[s];
        for (int32_t k = 0; k < c; k++)
            kv_pt_set(kv, q, q->pages.n + k, *kv_mag_at(kv, s, k));
        q->mag_at = 0;
        q->mag_end = (int16_t)c;
        kv->mag_total += c;
    }
}

/* The prefix budget evicts this cache's least recently used cached page
 * (kv_budget_bytes and kv_budget_oldest are in prefix_budget.c). */
void kv_budget_evict(llmem_memory *mem)
{
    kv_cache *kv = kv_of(mem);
    int32_t p = kv->pool.lru_head;
    if (p < 0)
        return;
    if (kv->host)
        kv_host_spill(kv, p); /* still published: its K/V and chain key are valid */
    page_pool_evict(&kv->pool);
    clear_page_shift(kv, p);
    if (kv->p.poison)
        poison_page(kv, p);
}

/* Copies page `old` into page `p` (every layer's K and V, pending shifts):
 * batches of up to 32 layers' copies (llmem_buffer_copy_ranges), not one
 * device copy per layer and pool. */
llmem_status copy_page(kv_cache *kv, int32_t p, int32_t old)
{
    enum { LAYERS_PER_CALL = 32 };
    llmem_copy_range r[2 * LAYERS_PER_CALL];
    size_t to = (size_t)p * kv->page_bytes, from = (size_t)old * kv->page_bytes;
    for (int32_t l0 = 0; l0 < kv->p.n_layers; l0 += LAYERS_PER_CALL) {
        int32_t n = 0;
        for (int32_t il = l0; il < kv->p.n_layers && il < l0 + LAYERS_PER_CALL; il++) {
            r[n++] = (llmem_copy_range){kv->k[il], to, kv->k[il], from, kv->page_bytes};
            r[n++] = (llmem_copy_range){kv->v[il], to, kv->v[il], from, kv->page_bytes};
        }
        llmem_status st = llmem_buffer_copy_ranges(r, n);
        if (st != LLMEM_OK)
            return st;
    }
    if (kv->page_shift[old]) {
        size_t ps = (size_t)kv->p.page_size;
        memcpy(kv->shift + (size_t)p * ps, kv->shift + (size_t)old * ps, ps * sizeof *kv->shift);
        kv->page_shift[p] = 1;
    }
    kv->cow_copies++;
    return LLMEM_OK;
}

/* Replaces page table entry i of s by a private copy. */
static llmem_status cow_page(kv_cache *kv, kv_seq *s, int32_t i)
{
    int32_t old = s->pages.v[i];
    int32_t p = kv_alloc_page(kv);
    if (p < 0)
        return LLMEM_E_NO_SPACE;
    llmem_status st = copy_page(kv, p, old);
    if (st != LLMEM_OK) {
        kv_unref_page(kv, p);
        return st;
    }
    kv_pt_set(kv, s, i, p);
    kv_last_sync(s);
    kv_unref_page(kv, old);
    return LLMEM_OK;
}

/* --- prefix cache --------------------------------------------------------- */

int32_t kv_prefix_pages(kv_cache *kv, const int32_t *tokens, int32_t n, int32_t *out)
{
    int32_t ps = kv->p.page_size, k = 0;
    uint64_t h = PAGE_HASH_SEED;
    for (; (int64_t)(k + 1) * ps <= n; k++) {
        uint64_t parent = h;
        h = page_hash(h, tokens + (size_t)k * (size_t)ps, ps);
        int32_t p = page_pool_lookup(&kv->pool, h, parent, tokens + (size_t)k * (size_t)ps);
        if (p < 0) {
            int32_t e = host_tier_lookup(kv->host, kv, h, parent, tokens + (size_t)k * (size_t)ps, ps);
            if (e < 0)
                break;
            p = KV_HOST_MARK(e);
        }
        if (out)
            out[k] = p;
    }
    return k;
}

static int32_t kv_prefix_match(llmem_memory *mem, const int32_t *tokens, int32_t n)
{
    kv_cache *kv = kv_of(mem);
    if (kv->p.no_prefix_cache)
        return 0;
    return kv_prefix_pages(kv, tokens, n, NULL) * kv->p.page_size;
}

/* Pages ahead whose bucket publish_flush requests: 32 rather than 8 took
 * the commit of a 4,000-sequence step in pages of 1 down 5-10% (1K and
 * 64K tokens, kv and hybrid, four alternated rounds on a 2-core VM) and
 * the 1,000-sequence one 2-4% (docs/benchmarks.md, "Final check of the
 * twelfth session"): each bucket is a TLB miss as well as a cache miss. */
#define PUBLISH_PREFETCH 32

void publish_flush(kv_cache *kv)
{
    page_pool *pp = &kv->pool;
    const int32_t *q = kv->pub_pending.v;
    int32_t n = kv->pub_pending.n;
    for (int32_t i = 0; i < n; i++) {
#if defined(__GNUC__)
        /* a decode step in pages of 1 publishes a page per sequence, each
         * into a random bucket of a table the size of the pool */
        if (i + PUBLISH_PREFETCH < n)
            __builtin_prefetch(&pp->bucket[pp->hash[q[i + PUBLISH_PREFETCH]] &
                                           (uint64_t)(pp->n_buckets - 1)],
                               0, 0);
#endif
        page_pool_publish(pp, q[i]);
    }
    kv->pub_pending.n = 0;
}

/* --- sequences ------------------------------------------------------------------ */

/* seq_rm of a range that is not a suffix (context shift, issue 13): allowed
 * when its tokens are one run of whole pages, which leave the page table;
 * the tokens after it keep their positions (seq_add shifts them, with a
 * K-shift, as llama.cpp's context shift does). O(length). */
static llmem_status rm_pages(kv_cache *kv, kv_seq *s, int32_t p0, int32_t p1, bool dry)
{
    int32_t n = s->tokens.n, ps = kv->p.page_size, a = -1, cnt = 0;
    kv_tokens_sync(kv, s);
    if (kv->p.window > 0)
        return LLMEM_E_STATE; /* a hole would move keys into the window */
    for (int32_t j = 0; j < n; j++)
        if (pos_in_range(seq_pos_at(&s->pos, j), p0, p1)) {
            if (a < 0)
                a = j;
            cnt++;
        }
    int32_t b = a + cnt;
    for (int32_t j = a; j < b; j++)
        if (!pos_in_range(seq_pos_at(&s->pos, j), p0, p1))
            return LLMEM_E_STATE; /* not one run */
    if (a < 0 || a % ps || b % ps)
        return LLMEM_E_STATE; /* a hole inside a page */
    /* the positions left are no longer one run: stored now (in the dry
     * run too, so that the real one cannot fail) */
    if (!seq_pos_store(&s->pos, 0))
        return LLMEM_E_NO_MEMORY;
    if (dry)
        return LLMEM_OK;
    int32_t pa = a / ps, pb = b / ps;
    kv_mag_drain(kv, s); /* the entries past the table move */
    for (int32_t k = pa; k < pb; k++)
        kv_unref_page(kv, s->pages.v[k]);
    memmove(s->pages.v + pa, s->pages.v + pb, (size_t)(s->pages.n - pb) * sizeof *s->pages.v);
    s->pages.n -= pb - pa;
    memmove(s->tokens.v + a, s->tokens.v + b, (size_t)(n - b) * sizeof *s->tokens.v);
    memmove(s->pos.v.v + a, s->pos.v.v + b, (size_t)(n - b) * sizeof *s->pos.v.v);
    s->tokens.n = s->pos.v.n = n - cnt;
    seq_pos_meta_reset(&s->pos);
    kv_pt_note(kv, s, pa, s->pages.n - pa);
    kv_last_sync(s);
    return LLMEM_OK;
}

static llmem_status kv_seq_rm(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, bool dry)
{
    kv_cache *kv = kv_of(mem);
    kv_seq *s = &kv->seqs[seq];
    /* O(log n + pages removed) while positions are in order */
    int32_t n = s->tokens.n, first = seq_pos_suffix_start(&s->pos, p0, p1);
    if (first < 0)
        return rm_pages(kv, s, p0, p1, dry);
    if (first == n)
        return LLMEM_OK;
    if (!swa_cut_ok(kv, s, first))
        return LLMEM_E_STATE; /* a rollback past window + window_slack */
    if (dry)
        return LLMEM_OK;
    kv_tokens_sync(kv, s);
    kv_drop_pages_from(kv, s, n_pages_for_len(kv, first));
    if (s->lost > first) /* a window of 1 may cut into what it lost */
        s->lost = first;
    s->tokens.n = first;
    seq_pos_truncate(&s->pos, first);
    if (first % kv->p.page_size) {
        /* its tail will be overwritten: a page no one else holds leaves the
         * index and is written in place (no copy, so an append that fits
         * exactly still fits); a shared one is copied on the next write */
        int32_t last = s->pages.v[s->pages.n - 1];
        if (kv->pool.ref[last] == 1) {
            page_pool_unpublish(&kv->pool, last);
            kv->pool.hashed[last] = 0;
        }
    }
    return LLMEM_OK;
}

static llmem_status kv_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                              int32_t p1, bool dry)
{
    kv_cache *kv = kv_of(mem);
    kv_seq *a = &kv->seqs[src], *b = &kv->seqs[dst];
    int32_t k = seq_pos_prefix_len(&a->pos, p0, p1);
    if (k < 0 || !swa_cut_ok(kv, a, k))
        return LLMEM_E_STATE; /* only a prefix of src that still holds its window */
    int32_t np = n_pages_for_len(kv, k);
    if (dry)
        return LLMEM_OK;
    /* b's row is made room in (or moved, entries kept) before anything
     * changes: a failure leaves b as it was */
    if ((np > 0 && !kv_pt_fit(kv, b, np)) || !i32vec_reserve(&b->tokens, k) ||
        (a->pos.stored && !seq_pos_reserve(&b->pos, k)))
        return LLMEM_E_NO_MEMORY;
    kv_drop_pages(kv, b, 0, np == 0);
    b->tokens.n = 0;
    kv->stage[dst].n = 0;
    seq_pos_clear(&b->pos);
    for (int32_t j = 0; j < np; j++) {
        b->pages.v[j] = a->pages.v[j];
        if (a->pages.v[j] >= 0)
            page_pool_ref(&kv->pool, a->pages.v[j]);
    }
    b->pages.n = np;
    kv_pt_note(kv, b, 0, np);
    b->dropped = a->dropped < np ? a->dropped : np;
    b->lost = a->lost < k ? a->lost : k;
    kv_last_sync(b);
    kv_tokens_sync(kv, a);
    i32_copy(b->tokens.v, a->tokens.v, k);
    b->tokens.n = k;
    (void)seq_pos_copy_prefix(&b->pos, &a->pos, k); /* room reserved above */
    return LLMEM_OK;
}

static llmem_status kv_seq_keep(llmem_memory *mem, int32_t seq, bool dry)
{
    kv_cache *kv = kv_of(mem);
    if (dry)
        return LLMEM_OK;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        if (s != seq)
            kv_seq_drop(kv, &kv->seqs[s], false);
    return LLMEM_OK;
}

/* seq_add (div == 0) or seq_div (div > 0) over [p0, p1). */
static llmem_status shift_positions(kv_cache *kv, int32_t seq, int32_t p0, int32_t p1,
                                    int32_t delta, int32_t div, bool dry)
{
    kv_seq *s = &kv->seqs[seq];
    int32_t ps = kv->p.page_size, n_cow = 0, last_page = -1;
    for (int32_t j = 0; j < s->tokens.n; j++) {
        int32_t pos = seq_pos_at(&s->pos, j);
        if (!pos_in_range(pos, p0, p1))
            continue;
        int64_t np = div ? pos / div : (int64_t)pos + delta;
        if (np < 0 || np > INT32_MAX - 1)
            return LLMEM_E_INVALID;
        if (j / ps != last_page) {
            last_page = j / ps;
            n_cow += kv->pool.ref[s->pages.v[last_page]] > 1;
        }
    }
    if (n_cow > kv_available(kv))
        return LLMEM_E_NO_SPACE;
    /* shifted positions are stored (in the dry run too, so that the real
     * one cannot fail for it) */
    if (!seq_pos_store(&s->pos, 0))
        return LLMEM_E_NO_MEMORY;
    if (dry)
        return LLMEM_OK;
    last_page = -1;
    for (int32_t j = 0; j < s->tokens.n; j++) {
        int32_t pos = s->pos.v.v[j];
        if (!pos_in_range(pos, p0, p1))
            continue;
        if (j / ps != last_page) {
            last_page = j / ps;
            int32_t p = s->pages.v[last_page];
            if (kv->pool.ref[p] > 1) {
                llmem_status st = cow_page(kv, s, last_page);
                if (st != LLMEM_OK)
                    return st;
            } else {
                page_pool_unpublish(&kv->pool, p);
            }
            kv->pool.hashed[s->pages.v[last_page]] = 0;
        }
        int32_t np = div ? pos / div : pos + delta;
        int32_t slot = kv_slot(kv, s, j);
        kv->shift[slot] += np - pos;
        kv->page_shift[slot / ps] = 1;
        kv->shift_pending = true;
        s->pos.v.v[j] = np;
    }
    seq_pos_meta_reset(&s->pos);
    return LLMEM_OK;
}

static llmem_status kv_seq_add(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1,
                               int32_t delta, bool dry)
{
    return shift_positions(kv_of(mem), seq, p0, p1, delta, 0, dry);
}

static llmem_status kv_seq_div(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, int32_t d,
                               bool dry)
{
    return shift_positions(kv_of(mem), seq, p0, p1, 0, d, dry);
}

static int32_t kv_pos_min(llmem_memory *mem, int32_t seq)
{
    return kv_of(mem)->seqs[seq].pos.pm.min;
}

static int32_t kv_pos_max(llmem_memory *mem, int32_t seq)
{
    return kv_of(mem)->seqs[seq].pos.pm.max;
}

static int32_t kv_seq_tokens(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap)
{
    kv_cache *kv = kv_of(mem);
    kv_tokens_sync(kv, &kv->seqs[seq]);
    return seq_copy_tokens(&kv->seqs[seq].tokens, out, cap);
}

static void fill_pools(kv_cache *kv, uint32_t pattern)
{
    for (int32_t il = 0; il < kv->p.n_layers; il++) {
        llmem_buffer_fill(kv->k[il], 0, llmem_buffer_size(kv->k[il]), pattern);
        llmem_buffer_fill(kv->v[il], 0, llmem_buffer_size(kv->v[il]), pattern);
    }
}

static llmem_status kv_clear(llmem_memory *mem, bool data)
{
    kv_cache *kv = kv_of(mem);
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        kv_seq *q = &kv->seqs[s];
        q->pages.n = q->tokens.n = 0;
        kv->stage[s].n = 0;
        q->pages.v = NULL;
        q->last = q->prev = -1;
        seq_pos_clear(&q->pos);
        q->row = -1;
        q->row_cap = q->dropped = q->lost = 0;
        q->mag_at = q->mag_end = 0;
    }
    kv->mag_total = 0; /* the pool's reset frees their pages */
    page_rows_reset(&kv->rows);
    page_pool_reset(&kv->pool);
    host_tier_drop_owner(kv->host, kv);
    memset(kv->shift, 0, (size_t)kv->p.n_pages * (size_t)kv->p.page_size * sizeof *kv->shift);
    memset(kv->page_shift, 0, (size_t)kv->p.n_pages);
    kv->shift_pending = false;
    if (data || kv->p.poison)
        fill_pools(kv, kv->p.poison ? llmem_nan_pattern(kv->p.dtype) : 0);
    return LLMEM_OK;
}

static void kv_get_stats(llmem_memory *mem, llmem_memory_stats *st)
{
    kv_cache *kv = kv_of(mem);
    st->type = "kv_cache";
    st->pages_total = kv->p.n_pages;
    st->pages_free = kv->pool.n_free + kv->mag_total; /* magazines hold empty pages */
    st->pages_cached = kv->pool.n_cached;
    st->pages_used = page_pool_used(&kv->pool) - kv->mag_total;
    st->pages_peak = kv->pool.n_used_peak;
    st->prefix_hit_tokens = kv->prefix_hits;
    st->prefix_evictions = kv->pool.n_evictions;
    st->cow_copies = kv->cow_copies;
    host_tier_usage(kv->host, kv, &st->host_tier_pages, &st->host_tier_bytes, NULL);
    st->host_tier_hits = kv->host_restores;
    st->cached_kv_bytes = kv_budget_bytes(mem);
    st->prefix_cache_bytes = kv->budget ? kv->budget->bytes : 0;
    st->bytes_device = (int64_t)(2 * (size_t)kv->p.n_layers * (size_t)kv->p.n_pages * kv->page_bytes);
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        st->n_seqs_live += kv->seqs[s].tokens.n > 0;
}

static void kv_destroy(llmem_memory *mem)
{
    kv_cache *kv = kv_of(mem);
    host_tier_unref(kv->host); /* first: it may wait for copies into its blocks */
    prefix_budget_leave(kv->budget, mem);
    for (int32_t il = 0; kv->k && kv->v && il < kv->p.n_layers; il++) {
        llmem_buffer_free(kv->k[il]);
        llmem_buffer_free(kv->v[il]);
    }
    free(kv->k);
    free(kv->views);
    free(kv->v);
    for (int32_t s = 0; kv->seqs && s < mem->n_seq_max; s++) {
        i32vec_free(&kv->seqs[s].tokens);
        i32vec_free(&kv->seqs[s].pos.v);
    }
    seq_heap_destroy(kv->heap);
    free(kv->seqs);
    free(kv->need);
    free(kv->len0);
    free(kv->cow);
    free(kv->tail);
    free(kv->tail_at);
    free(kv->mag);
    free(kv->mag_fill);
    free(kv->stage);
    i32vec_free(&kv->pub_pending);
    i32vec_free(&kv->row_defer);
    free(kv->shift);
    free(kv->page_shift);
    llmem_buffer_free(kv->idx);
    page_rows_finish(&kv->rows);
    i32vec_free(&kv->ib.data);
    page_pool_finish(&kv->pool);
    free(kv);
}

const llmem_memory_i kv_cache_iface = {
    .struct_size = sizeof(llmem_memory_i),
    .type = "kv_cache",
    .destroy = kv_destroy,
    .prefix_match = kv_prefix_match,
    .reserve = kv_reserve,
    .reserve_prepare = kv_reserve_prepare,
    .apply = kv_apply,
    .view = kv_view,
    .commit = kv_commit,
    .release = kv_release,
    .seq_rm = kv_seq_rm,
    .seq_cp = kv_seq_cp,
    .seq_keep = kv_seq_keep,
    .seq_add = kv_seq_add,
    .seq_div = kv_seq_div,
    .seq_pos_min = kv_pos_min,
    .seq_pos_max = kv_pos_max,
    .seq_tokens = kv_seq_tokens,
    .clear = kv_clear,
    .state_write = kv_state_write,
    .state_read_prepare = kv_state_read_prepare,
    .state_read_apply = kv_state_read_apply,
    .state_read_abort = kv_state_read_abort,
    .get_stats = kv_get_stats,
    .state_read_seq = kv_state_read_seq,
    .check = kv_check,
};

llmem_kv_cache_params llmem_kv_cache_default_params(void)
{
    llmem_kv_cache_params p = {0};
    p.dtype = LLMEM_DTYPE_F16;
    p.page_size = 16;
    p.n_seq_max = 1;
    return p;
}

llmem_status llmem_kv_cache_create(llmem_backend *be, const llmem_kv_cache_params *params,
                                   llmem_memory **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!be || !params || !out) {
        llmem_errf(err, err_len, "NULL argument");
        return LLMEM_E_INVALID;
    }
    const llmem_kv_cache_params *p = params;
    const char *bad = NULL;
    if (p->n_layers < 1) bad = "n_layers must be >= 1";
    else if (p->n_kv_heads < 1) bad = "n_kv_heads must be >= 1";
    else if (p->head_dim < 1) bad = "head_dim must be >= 1";
    else if (p->page_size < 1) bad = "page_size must be >= 1";
    else if (p->n_pages < 1) bad = "n_pages must be >= 1";
    else if (p->n_seq_max < 1) bad = "n_seq_max must be >= 1";
    else if (p->dtype != LLMEM_DTYPE_F32 && p->dtype != LLMEM_DTYPE_F16 &&
             p->dtype != LLMEM_DTYPE_BF16 && !llmem_dtype_is_scaled(p->dtype))
        bad = "dtype must be f32, f16, bf16, int8 or fp8";
    else if (llmem_dtype_is_scaled(p->dtype) && p->head_dim % 4 != 0)
        bad = "int8 and fp8 need head_dim a multiple of 4";
    else if (p->host_tier_bytes < 0) bad = "host_tier_bytes must be >= 0";
    else if (p->prefix_cache_bytes < 0) bad = "prefix_cache_bytes must be >= 0";
    else if (p->window < 0) bad = "window must be >= 0";
    else if (p->window_slack < 0 || (p->window == 0 && p->window_slack != 0)) bad = "window_slack must be >= 0, and 0 without a window";
    else if ((int64_t)p->n_pages * p->page_size > INT32_MAX) bad = "n_pages * page_size exceeds int32 slot ids";
    if (bad) {
        llmem_errf(err, err_len, "KV cache: %s", bad);
        return LLMEM_E_INVALID;
    }
    size_t row = (size_t)p->n_kv_heads * (size_t)p->head_dim * llmem_dtype_size(p->dtype);
    if (row / llmem_dtype_size(p->dtype) / (size_t)p->n_kv_heads != (size_t)p->head_dim ||
        row > SIZE_MAX / (size_t)p->page_size ||
        row * (size_t)p->page_size > SIZE_MAX / (size_t)p->n_pages / 2 ||
        llmem_kv_page_bytes(p->dtype, p->page_size, p->n_kv_heads, p->head_dim) >
            SIZE_MAX / (size_t)p->n_pages) {
        llmem_errf(err, err_len, "KV cache: pool size overflows");
        return LLMEM_E_INVALID;
    }
    kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) {
        llmem_errf(err, err_len, "KV cache: out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    llmem_status st = llmem_memory_init(&kv->base, &kv_cache_iface, be, p->n_layers,
                                        p->n_seq_max, LLMEM_SPLIT_SIMPLE, p->window == 0);
    if (st != LLMEM_OK) {
        llmem_memory_iface_check(&kv_cache_iface, err, err_len);
        free(kv);
        return st;
    }
    kv->p = *p;
    kv->ps_shift = -1;
    for (int32_t sh = 0; sh < 31; sh++)
        if (p->page_size == (int32_t)1 << sh)
            kv->ps_shift = sh;
    kv->p.poison = p->poison || llmem_env_poison();
    kv->stage_spread = tok_stage_spread_env();
    const char *pf = getenv("LLMEM_KV_PUBLISH_PREFETCH"); /* unset: on */
    kv->publish_prefetch = !pf || !*pf || strcmp(pf, "0") != 0;
    kv->row_bytes = row;
    kv->page_bytes = llmem_kv_page_bytes(p->dtype, p->page_size, p->n_kv_heads, p->head_dim);
    st = LLMEM_E_NO_MEMORY;
    kv->seqs = calloc((size_t)p->n_seq_max, sizeof *kv->seqs);
    kv->k = calloc((size_t)p->n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)p->n_layers, sizeof *kv->v);
    kv->views = calloc((size_t)p->n_layers, sizeof *kv->views);
    kv->shift = calloc((size_t)p->n_pages * (size_t)p->page_size, sizeof *kv->shift);
    kv->page_shift = calloc((size_t)p->n_pages, 1);
    kv->need = calloc((size_t)p->n_seq_max, sizeof *kv->need);
    kv->len0 = calloc((size_t)p->n_seq_max, sizeof *kv->len0);
    kv->cow = calloc((size_t)p->n_seq_max, 1);
    kv->tail = calloc((size_t)p->n_seq_max, sizeof *kv->tail);
    kv->tail_at = calloc((size_t)p->n_seq_max, sizeof *kv->tail_at);
    kv->stage = aligned_alloc(64, (size_t)p->n_seq_max * sizeof *kv->stage);
    if (kv->stage)
        memset(kv->stage, 0, (size_t)p->n_seq_max * sizeof *kv->stage);
    if (!kv->seqs || !kv->k || !kv->v || !kv->views || !kv->shift || !kv->page_shift ||
        !kv->need || !kv->len0 || !kv->cow || !kv->tail || !kv->tail_at || !kv->stage ||
        !page_pool_init(&kv->pool, p->n_pages, p->page_size)) {
        llmem_errf(err, err_len,
                   "KV cache: out of host memory for the bookkeeping of %d pages and %d "
                   "sequences",
                   p->n_pages, p->n_seq_max);
        goto fail;
    }
    kv_rows_setup(kv);
    /* page magazines: pages of fewer than 16 tokens take 16 tokens' worth
     * at a time (a page of 16 leaves as many slots unwritten); not with a
     * sliding window or poisoning (each page through kv_alloc_page) */
    const char *mg = getenv("LLMEM_KV_MAGAZINE"); /* unset: on */
    if (p->page_size < 16 && p->window == 0 && !kv->p.poison &&
        !(mg && strcmp(mg, "0") == 0) && 16 / p->page_size >= 2) {
        kv->mag_cap = 16 / p->page_size;
        kv->mag_floor = p->n_pages / 16;
        kv->mag = malloc((size_t)p->n_seq_max * (size_t)kv->mag_cap * sizeof *kv->mag);
        kv->mag_fill = malloc((size_t)p->n_seq_max * sizeof *kv->mag_fill);
        if (!kv->mag || !kv->mag_fill || p->n_seq_max > (1 << 26))
            kv->mag_cap = 0; /* only a speed-up */
    }
    int64_t host_bytes = p->host_tier_bytes;
    const char *mb = getenv("LLMEM_HOST_TIER_MB");
    if (host_bytes <= 0 && mb && atoll(mb) > 0)
        host_bytes = atoll(mb) * 1048576;
    if (host_bytes > 0 && !p->no_prefix_cache &&
        !(kv->host = host_tier_create((size_t)host_bytes, be))) {
        llmem_errf(err, err_len, "KV cache: out of host memory for a %lld-byte host tier",
                   (long long)host_bytes);
        goto fail;
    }
    if (p->prefix_cache_bytes > 0 && !p->no_prefix_cache) {
        if (p->prefix_cache_bytes < kv_entry_bytes(kv)) {
            llmem_errf(err, err_len,
                       "KV cache: prefix_cache_bytes %lld cannot hold one cached page (%lld "
                       "bytes: %d layers of K and V, %d tokens each)",
                       (long long)p->prefix_cache_bytes, (long long)kv_entry_bytes(kv),
                       p->n_layers, p->page_size);
            st = LLMEM_E_INVALID;
            goto fail;
        }
        if (!(kv->budget = prefix_budget_create(p->prefix_cache_bytes)) ||
            !prefix_budget_join(kv->budget, &kv->base)) {
            llmem_errf(err, err_len, "KV cache: out of host memory");
            goto fail;
        }
        prefix_budget_unref(kv->budget); /* the member's reference remains */
    }
    kv->heap = seq_heap_create();
    for (int32_t s = 0; s < p->n_seq_max; s++) {
        kv_seq *q = &kv->seqs[s];
        seq_pos_clear(&q->pos);
        q->row = -1;
        q->last = q->prev = -1;
        if (!seq_heap_attach(kv->heap, &q->tokens) ||
            !seq_heap_attach(kv->heap, &q->pos.v)) {
            llmem_errf(err, err_len, "KV cache: out of host memory for %d sequences",
                       p->n_seq_max);
            goto fail;
        }
    }
    size_t pool_bytes = kv->page_bytes * (size_t)p->n_pages;
    for (int32_t il = 0; il < p->n_layers; il++) {
        if ((st = llmem_buffer_alloc(be, pool_bytes, &kv->k[il])) != LLMEM_OK ||
            (st = llmem_buffer_alloc(be, pool_bytes, &kv->v[il])) != LLMEM_OK) {
            /* the status itself is the caller's to print */
            llmem_errf(err, err_len,
                       "KV cache: cannot allocate a %zu-byte pool for layer %d (%d pages of %zu bytes)",
                       pool_bytes, il, (int)p->n_pages, kv->page_bytes);
            goto fail;
        }
    }
    if (kv->p.poison)
        fill_pools(kv, llmem_nan_pattern(p->dtype));
    *out = &kv->base;
    return LLMEM_OK;
fail:
    kv_destroy(&kv->base);
    return st;
}

int32_t llmem_kv_cache_page_table(llmem_memory *mem, int32_t seq_id, int32_t *out, int32_t cap)
{
    kv_cache *kv = kv_of(mem);
    if (!kv || seq_id < 0 || seq_id >= mem->n_seq_max)
        return -1;
    const kv_seq *s = &kv->seqs[seq_id];
    int32_t n = s->pages.n < cap ? s->pages.n : cap;
    if (out && cap > 0)
        i32_copy(out, s->pages.v, n);
    /* a copy-on-write target shows once apply has copied into it; until
     * then the entry names the page it copies (kv_cow) */
    for (int32_t c = 0; out && kv->res && c < kv->res->n_cow; c++) {
        const kv_cow *w = &kv->res->cow[c];
        if (w->seq == seq_id && w->page >= 0 && !w->copied && w->index < n)
            out[w->index] = w->page;
    }
    return s->pages.n;
}

/* llmem memory/: planning of the paged KV cache — reservation (pages,
 * copy-on-write, prefix pages), index tables of the views, apply, commit
 * and release. The page tables the views show are the persistent rows of
 * memory/page_rows.h: a plan writes and uploads only the entries that
 * changed (llmem_kv_view.page_off). References: PagedAttention (Kwon et
 * al., SOSP 2023); vLLM block manager and automatic prefix caching. */
#include <stdlib.h>
#include <string.h>

#include "memory/kv_internal.h"
#include "memory/kv_prefetch.h"

/* --- planning ----------------------------------------------------------------- */

/* Settles the copy-on-writes of a plan that is released or failed: an
 * entry whose copy holds committed tokens (apply copied it and a commit
 * appended to the sequence) keeps the copy, and the old page loses the
 * plan's reference; every other entry gets its old page again and the
 * copy is freed, so the sharing is as before the plan (kv_cow), and so is
 * stats.cow_copies (a copy given back is not counted). */
static void finish_cows(kv_cache *kv, kv_res *res)
{
    for (int32_t c = 0; res && c < res->n_cow; c++) {
        kv_cow *w = &res->cow[c];
        if (w->page < 0)
            continue;
        kv_seq *q = &kv->seqs[w->seq];
        if (w->copied && q->tokens.n != w->len0) {
            kv_unref_page(kv, w->page);
        } else {
            int32_t copy = q->pages.v[w->index];
            kv_pt_set(kv, q, w->index, w->page);
            kv_last_sync(q);
            kv_unref_page(kv, copy);
            if (w->copied) /* copy_page counted it */
                kv->cow_copies--;
        }
        w->page = -1;
    }
}

static void release_reservations(kv_cache *kv, const llmem_plan *plan)
{
    for (int32_t k = 0; k < plan->n_seqs; k++) {
        kv_seq *q = &kv->seqs[plan->seqs[k].id];
        int32_t keep = n_pages_for_len(kv, q->tokens.n);
        /* nothing reserved is left after a decode step's commit: no call */
        if (keep > 0 && q->pages.n <= keep && q->dropped <= keep)
            continue;
        kv_drop_pages_from(kv, q, keep);
    }
}

static int32_t stream_n(const llmem_plan *plan, int32_t u, int32_t s)
{
    return plan->group_off[u][s + 1] - plan->group_off[u][s];
}

static int32_t stream_seq(const llmem_plan *plan, int32_t u, int32_t s, int32_t j)
{
    return plan->group_ids[u][plan->group_off[u][s] + j];
}

static int32_t count_shift(const kv_cache *kv)
{
    int32_t n = 0, ps = kv->p.page_size;
    if (!kv->shift_pending)
        return 0;
    for (int32_t p = 0; p < kv->p.n_pages; p++)
        if (kv->page_shift[p] && kv->pool.ref[p] > 0)
            for (int32_t j = 0; j < ps; j++)
                n += kv->shift[(size_t)p * (size_t)ps + (size_t)j] != 0;
    return n;
}

/* Builds every ubatch's index tables (host side) with the page tables as
 * reserved. len_sim holds each sequence's length before the plan. */
static llmem_status build_tables(kv_cache *kv, const llmem_plan *plan, kv_res *res,
                                 int32_t *len_sim, int32_t n_shift)
{
    int32_t ps = kv->p.page_size;
    idx_builder *ib = &kv->ib;
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        kv_ub *t = &res->ub[u];
        t->n_tokens = ub->n_tokens;
        t->n_seqs = ub->n_seqs;
        t->n_store = 0;
        for (int32_t k = 0; k < ub->n_tokens; k++)
            t->n_store += stream_n(plan, u, ub->seq[k]);
        t->store_tok = idx_append(ib, NULL, t->n_store, 0);
        t->store_slot = idx_append(ib, NULL, t->n_store, 0);
        t->tok_kv_len = idx_append(ib, NULL, ub->n_tokens, 0);
        t->tok_seq = idx_append(ib, ub->seq, ub->n_tokens, 0);
        t->seq_len = idx_append(ib, NULL, ub->n_seqs, 0);
        if (t->store_tok < 0 || t->store_slot < 0 || t->tok_kv_len < 0 || t->tok_seq < 0 ||
            t->seq_len < 0)
            return LLMEM_E_NO_MEMORY;
        int32_t j = 0;
        for (int32_t k = 0; k < ub->n_tokens; k++) {
            int32_t s = ub->seq[k];
            for (int32_t m = 0; m < stream_n(plan, u, s); m++) {
                int32_t q = stream_seq(plan, u, s, m);
                ib->data.v[t->store_tok + j] = k;
                int32_t at = len_sim[q]++, e = kv_ps_div(kv, at);
                int32_t page = kv->tail[q] >= 0 && kv->tail_at[q] == e ? kv->tail[q]
                                                                        : kv->seqs[q].pages.v[e];
                ib->data.v[t->store_slot + j] = page * ps + kv_ps_mod(kv, at);
                j++;
            }
            /* a sliding window's dropped pages are not shown (swa.c) */
            const kv_seq *first = &kv->seqs[ub->seq_id[s]];
            ib->data.v[t->tok_kv_len + k] = len_sim[ub->seq_id[s]] - swa_skip(kv, first);
        }
        /* stream s reads the persistent row of its first sequence */
        t->max_pages = 0;
        t->page_off = idx_append(ib, NULL, ub->n_seqs, -1);
        if (t->page_off < 0)
            return LLMEM_E_NO_MEMORY;
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            const kv_seq *first = &kv->seqs[ub->seq_id[s]];
            int32_t len = len_sim[ub->seq_id[s]] - swa_skip(kv, first);
            ib->data.v[t->seq_len + s] = len;
            ib->data.v[t->page_off + s] = first->row + first->dropped;
            if (n_pages_for_len(kv, len) > t->max_pages)
                t->max_pages = n_pages_for_len(kv, len);
        }
        t->n_shift = u == 0 ? n_shift : 0;
        t->shift_slot = idx_append(ib, NULL, t->n_shift, 0);
        t->shift_delta = idx_append(ib, NULL, t->n_shift, 0);
        if (t->n_shift > 0) {
            int32_t m = 0;
            for (int32_t p = 0; p < kv->p.n_pages; p++) {
                if (!kv->page_shift[p] || kv->pool.ref[p] == 0)
                    continue;
                for (int32_t o = 0; o < ps; o++) {
                    int32_t slot = p * ps + o;
                    if (kv->shift[slot] == 0)
                        continue;
                    ib->data.v[t->shift_slot + m] = slot;
                    ib->data.v[t->shift_delta + m] = kv->shift[slot];
                    m++;
                }
            }
        }
    }
    return LLMEM_OK;
}

/* int32 elements of every ubatch's index tables (build_tables). */
static int64_t index_elems(const kv_cache *kv, const llmem_plan *plan)
{
    int64_t elems = 2 * (int64_t)count_shift(kv);
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        for (int32_t k = 0; k < ub->n_tokens; k++)
            elems += 2 * (int64_t)stream_n(plan, u, ub->seq[k]);
        elems += 2 * (int64_t)ub->n_tokens + 2 * (int64_t)ub->n_seqs;
    }
    return elems;
}

/* Page-table entries planned sequence e holds once reserved. */
static int32_t pages_after(const kv_cache *kv, const llmem_plan_seq *e, const int32_t *need)
{
    return kv->seqs[e->id].pages.n + kv_ps_div(kv, e->n_cached) + need[e->id];
}

/* Replaces the device index buffer by one whose first r entries hold the
 * rows and the next `plan` the plan's tables. Allocated before the old one is
 * freed: failure changes nothing. A mirrored table is uploaded whole at
 * the next upload; a shared one (page_rows_share) moves into the new
 * buffer with its entries, the new ones -1, and every page table is
 * re-pointed. */
static llmem_status idx_alloc(kv_cache *kv, int64_t r, int64_t plan)
{
    if (kv->rows.share_grow && r < kv->rows.cap) /* shared rows never shrink */
        r = kv->rows.cap;
    int64_t want = r + plan;
    if (want > INT32_MAX || plan < 0)
        return LLMEM_E_INVALID;
    llmem_buffer *nb = NULL;
    llmem_status st = llmem_buffer_alloc(kv->base.backend, (size_t)want * sizeof(int32_t), &nb);
    if (st != LLMEM_OK)
        return st;
    int32_t *host = llmem_buffer_host_ptr(nb);
    /* host-visible (the cpu backend): rows are written at scattered
     * offsets every step, better on huge pages (advice only) */
    seq_heap_advise(host, (size_t)want * sizeof(int32_t));
    page_rows *pr = &kv->rows;
    if (pr->share_grow) {
        if (!host) {
            llmem_buffer_free(nb);
            return LLMEM_E_STATE;
        }
        if (pr->cap > 0)
            memcpy(host, pr->v, (size_t)pr->cap * sizeof *host);
        for (int64_t i = pr->cap; i < r; i++)
            host[i] = -1;
        pr->v = host;
        pr->cap = (int32_t)r;
        kv_pt_repoint(kv);
    } else {
        pr->full = true;
    }
    llmem_buffer_free(kv->idx);
    kv->idx = nb;
    kv->idx_rows = (int32_t)r;
    return LLMEM_OK;
}

/* Makes the device index buffer hold the rows (rows_n entries) and then
 * elems plan entries (idx_alloc when it does not). */
static llmem_status idx_fit(kv_cache *kv, int64_t rows_n, int64_t elems)
{
    size_t have = kv->idx ? llmem_buffer_size(kv->idx) / sizeof(int32_t) : 0;
    if (kv->idx && rows_n <= kv->idx_rows && (size_t)(kv->idx_rows + elems) <= have)
        return LLMEM_OK;
    int64_t r = rows_n <= kv->idx_rows ? kv->idx_rows : rows_n + rows_n / 4 + 1024;
    return idx_alloc(kv, r, elems + elems / 2 + 1024);
}

bool kv_rows_grow(void *ctx, page_rows *r, int64_t cap)
{
    kv_cache *kv = ctx;
    (void)r; /* &kv->rows */
    /* the plan tables' room stays as it was */
    int64_t plan = kv->idx ? (int64_t)(llmem_buffer_size(kv->idx) / sizeof(int32_t)) - kv->idx_rows
                           : 1024;
    return idx_alloc(kv, cap, plan) == LLMEM_OK;
}

/* Writes the (row entry, page) pairs the attach pass deferred into the
 * rows (recorded for the next upload), before a failed reserve releases
 * them; a reserve that succeeds writes them at its upload
 * (page_rows_write_upload). Why they wait: in pages of 1 each sequence's
 * row is a 4 KiB page or more of its own (it holds ~the sequence's
 * context), and this VM's TLB holds ~2,000 pages, so at 4,000 sequences
 * every row store waits for a page walk; the attach pass, ~100
 * instructions a sequence, kept one or two walks in flight, a loop of
 * stores keeps the walkers busy. */
static void rows_write_deferred(kv_cache *kv)
{
    const int32_t *d = kv->row_defer.v;
    for (int32_t i = 0; i < kv->row_defer.n; i += 2)
        page_rows_write1(&kv->rows, d[i], d[i + 1]);
    kv->row_defer.n = 0;
}

/* kv->cow[s]: what reserve does to the partly written last page the
 * plan appends to. */
enum { KV_TAIL_COPY = 1,   /* shared or published: copy-on-write */
       KV_TAIL_UNHASH = 2  /* written in place: its stale hash flag is cleared */ };

/* Pages the plan needs beyond the prefix pages it attaches, in one pass
 * over the planned sequences (at thousands of sequences every pass over
 * their page-table tails is a cache miss each): per planned sequence s kv->need[s]
 * new pages and kv->cow[s] (above), kv->len0[s] = length once the prefix
 * is attached. Returns the total; *n_cow gets the copies and,
 * when rows is not NULL, *rows the page-row entries the table would use
 * once the plan's rows have grown (an upper bound: grown rows taken fresh)
 * and *n_grow the sequences whose row must grow. */
static int64_t pages_needed(kv_cache *kv, const llmem_plan *plan, int32_t *n_cow, int64_t *rows,
                            int32_t *n_grow)
{
    int32_t *need = kv->need, *len0 = kv->len0;
    uint8_t *cow = kv->cow;
    int64_t total = 0, nr = kv->rows.n;
    int32_t nc = 0, ng = 0;
    for (int32_t k = 0; k < plan->n_seqs; k++) {
        const llmem_plan_seq *e = &plan->seqs[k];
        int32_t s = e->id;
        const kv_seq *q = &kv->seqs[s];
        kv_prefetch_ahead(kv, plan, k);
        need[s] = 0;
        cow[s] = 0;
        kv->tail[s] = -1;
        int32_t c = e->n_cached;
        len0[s] = c > 0 ? c : q->tokens.n;
        int32_t nn = e->n_new - c;
        need[s] = kv_pages_for(kv, len0[s], nn);
        if (c == 0 && nn > 0 && kv_ps_mod(kv, len0[s])) {
            int32_t at = kv_ps_div(kv, len0[s]);
            int32_t p = at == q->pages.n - 1 ? q->last : q->pages.v[at];
            cow[s] = !page_writable(kv, p) ? KV_TAIL_COPY : kv->pool.hashed[p] ? KV_TAIL_UNHASH : 0;
            if (cow[s] != KV_TAIL_COPY) { /* a copy replaces the entry */
                kv->tail[s] = p;
                kv->tail_at[s] = at;
            }
        }
        total += need[s] + (cow[s] == KV_TAIL_COPY);
        nc += cow[s] == KV_TAIL_COPY;
        int32_t np = pages_after(kv, e, need);
        if (rows && np > 0 && (q->row < 0 || np > q->row_cap)) {
            nr += page_rows_cost(np);
            ng++;
        }
    }
    *n_cow = nc;
    if (rows)
        *rows = nr;
    if (n_grow)
        *n_grow = ng;
    return total;
}

/* The NO_SPACE message of a batch needing `total` pages, of the cached ones
 * `pinned` about to be pinned by it (magazine pages count as free). */
static void no_space(const kv_cache *kv, int64_t total, int32_t pinned, char *err, size_t err_len)
{
    llmem_errf(err, err_len, "KV cache: the batch needs %lld pages, %lld free + %d evictable",
               (long long)total, (long long)(kv->pool.n_free + kv->mag_total),
               kv->pool.n_cached - pinned);
}

llmem_status kv_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                       size_t err_len)
{
    kv_cache *kv = kv_of(mem);
    int32_t ps = kv->p.page_size;
    llmem_status st = LLMEM_E_NO_MEMORY;
    i32vec pages = {0}; /* cached (unreferenced) prefix pages the plan would pin */
    kv->prep_plan = NULL;
    /* (a plan without prefix-cache tokens skips the pass) */
    for (int32_t e = 0; plan->info.n_tokens_cached > 0 && e < plan->n_seqs; e++) {
        int32_t c = plan->seqs[e].n_cached, s = plan->seqs[e].id;
        if (c == 0)
            continue;
        int32_t np = c / ps, at = pages.n;
        if (c % ps || kv->seqs[s].tokens.n || !i32vec_reserve(&pages, pages.n + np) ||
            kv_prefix_pages(kv, plan->seq_tokens[e], c, pages.v + at) != np) {
            llmem_errf(err, err_len, "sequence %d: prefix pages changed during planning", s);
            st = LLMEM_E_STATE;
            goto out;
        }
        for (int32_t k = 0; k < np; k++) {
            int32_t p = pages.v[at + k]; /* a host-tier mark needs a free page too */
            bool dup = p >= 0 && kv->pool.ref[p] > 0;
            for (int32_t j = 0; j < pages.n && !dup; j++)
                dup = pages.v[j] == p;
            if (!dup)
                pages.v[pages.n++] = p;
        }
    }
    int32_t n_cow = 0, n_grow = 0;
    int64_t rows = 0;
    int64_t total = pages_needed(kv, plan, &n_cow, &rows, &n_grow);
    if (total > kv_available(kv) - pages.n) {
        no_space(kv, total, pages.n, err, err_len);
        st = LLMEM_E_NO_SPACE;
        goto out;
    }
    int64_t elems = index_elems(kv, plan);
    if (elems > INT32_MAX / 2) {
        llmem_errf(err, err_len, "KV cache: the plan's index tables exceed int32 offsets");
        st = LLMEM_E_INVALID;
        goto out;
    }
    st = idx_fit(kv, rows, elems);
    if (st != LLMEM_OK) {
        llmem_errf(err, err_len, "KV cache: index buffer allocation failed (%s)",
                   llmem_status_str(st));
        goto out;
    }
    kv->prep_plan = plan;
    kv->prep_total = total;
    kv->prep_cows = n_cow;
    kv->prep_grow = n_grow;
out:
    i32vec_free(&pages);
    return st;
}

static llmem_i32_table plan_table(const idx_builder *b, int32_t base, int32_t off, int32_t n);

/* Tells the op checks that the rows just uploaded hold valid pages for
 * every group of every ubatch (llmem_view_vouch_rows): the rows are written
 * only from the pages the pool handed out (kv_pt_set, copies included) and
 * llmem_memory_check verifies them; ops then skip re-reading whole rows
 * each ubatch. On allocation failure nothing is vouched (full checks). */
static void vouch_rows(const kv_cache *kv, const kv_res *res)
{
    llmem_i32_table *t = malloc((size_t)(2 * res->n_ub + 1) * sizeof *t);
    if (!t)
        return;
    for (int32_t u = 0; u < res->n_ub; u++) {
        t[u] = plan_table(&kv->ib, kv->idx_rows, res->ub[u].page_off, res->ub[u].n_seqs);
        t[res->n_ub + u] =
            plan_table(&kv->ib, kv->idx_rows, res->ub[u].seq_len, res->ub[u].n_seqs);
    }
    llmem_i32_table rows = {.host = kv->rows.v, .offset = 0, .n = kv->rows.n};
    llmem_view_vouch_rows(kv->idx, &rows, kv->p.n_pages, kv->p.page_size, t, t + res->n_ub,
                          res->n_ub);
    free(t);
}

llmem_status kv_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                               size_t err_len)
{
    kv_cache *kv = kv_of(mem);
    int32_t ps = kv->p.page_size;
    llmem_status st = LLMEM_E_NO_MEMORY;
    kv_res *res = calloc(1, sizeof *res);
    int32_t *need = kv->need, *len0 = kv->len0;
    uint8_t *cow = kv->cow;
    const llmem_plan *prep = kv->prep_plan;
    kv->prep_plan = NULL;
    i32vec pinned = {0};
    bool attached = false;
    int32_t pin_at = 0;
    if (!res)
        goto fail;
    res->cur = -1;
    res->n_ub = plan->n_ubatch;
    res->ub = calloc((size_t)plan->n_ubatch, sizeof *res->ub);
    if (!res->ub)
        goto fail;
    int64_t total = 0;
    for (int32_t e = 0; plan->info.n_tokens_cached > 0 && e < plan->n_seqs; e++) {
        int32_t s = plan->seqs[e].id;
        kv_seq *q = &kv->seqs[s];
        int32_t c = plan->seqs[e].n_cached;
        if (c > 0) {
            int32_t np = c / ps;
            int32_t at = pinned.n;
            if (c % ps || q->tokens.n || !i32vec_reserve(&pinned, pinned.n + np) ||
                kv_prefix_pages(kv, plan->seq_tokens[e], c, pinned.v + at) != np) {
                llmem_errf(err, err_len, "sequence %d: prefix pages changed during planning", s);
                st = LLMEM_E_STATE;
                goto fail;
            }
            for (int32_t k = 0; k < np; k++) {
                int32_t p = pinned.v[at + k];
                if (p >= 0)
                    page_pool_ref(&kv->pool, p);
                else /* spills while restoring must not evict it */
                    host_tier_pin(kv->host, -2 - p);
            }
            pinned.n += np;
        }
    }
    /* host-tier hits come back to the device now (prepare counted their
     * pages); the restored pages are published and pinned like cached ones */
    st = kv_host_restore(kv, pinned.v, pinned.n);
    if (st != LLMEM_OK) {
        llmem_errf(err, err_len, "KV cache: restoring host-tier pages failed (%s)",
                   llmem_status_str(st));
        goto fail;
    }
    st = LLMEM_E_NO_MEMORY;
    /* without prefix pages nothing changed since reserve_prepare counted
     * (restoring and pinning are what can change a tail's writability) */
    int32_t n_cow = 0;
    if (prep == plan && pinned.n == 0) {
        total = kv->prep_total;
        n_cow = kv->prep_cows;
    } else {
        total = pages_needed(kv, plan, &n_cow, NULL, NULL);
    }
    if (total > kv_available(kv)) {
        no_space(kv, total, 0, err, err_len);
        st = LLMEM_E_NO_SPACE;
        goto fail;
    }
    /* index size and rows, made before anything irreversible (a row that
     * moves changes nothing a caller sees) */
    int64_t elems = index_elems(kv, plan);
    if (elems > INT32_MAX / 2) {
        llmem_errf(err, err_len, "KV cache: the plan's index tables exceed int32 offsets");
        st = LLMEM_E_INVALID;
        goto fail;
    }
    kv->ib.data.n = 0;
    res->cow = malloc((size_t)(n_cow > 0 ? n_cow : 1) * sizeof *res->cow);
    if (!res->cow || !i32vec_reserve(&kv->ib.data, (int32_t)elems))
        goto fail;
    /* prepare counted the rows that must grow for this plan (the counts
     * do not depend on the prefix pages pinned since) */
    for (int32_t e = 0; (prep != plan || kv->prep_grow > 0) && e < plan->n_seqs; e++) {
        int32_t s = plan->seqs[e].id;
        int32_t np = pages_after(kv, &plan->seqs[e], need);
        if (np > 0 && !kv_pt_fit(kv, &kv->seqs[s], np)) {
            llmem_errf(err, err_len, "KV cache: out of host memory for page tables");
            goto fail;
        }
    }
    st = idx_fit(kv, kv->rows.n, elems);
    if (st != LLMEM_OK) {
        llmem_errf(err, err_len, "KV cache: index buffer allocation failed (%s)",
                   llmem_status_str(st));
        goto fail;
    }
    /* a decode step's new row entries are written at the upload (when the
     * pair list has room for one a sequence: else at once) */
    bool defer = plan->n_seqs <= INT32_MAX / 2 && i32vec_reserve(&kv->row_defer, 2 * plan->n_seqs);
    kv->row_defer.n = 0;
    /* a decode step's page comes from the sequence's magazine, filled
     * (its ids written into the row in one run) every `quota` steps or so:
     * no row write in between (kv_internal.h kv_cache.mag) */
    int32_t quota = kv_mag_quota(kv, plan->n_seqs);
    if (quota > 0)
        kv_mag_fill_plan(kv, plan, quota);
    /* from here on, reservations live in the page tables; release undoes them */
    attached = true;
    for (int32_t e = 0; e < plan->n_seqs; e++) {
        const llmem_plan_seq *pe = &plan->seqs[e];
        int32_t s = pe->id;
        kv_prefetch_append(kv, plan, e);
        kv_seq *q = &kv->seqs[s];
        /* room for the ids and positions the commits append, taken now so
         * that a commit needs no host memory: a hybrid cannot undo a child
         * that committed before another failed (release undoes the
         * sequences attached so far, as for a failure below) */
        if (!tok_stage_reserve(&q->tokens, pe->n_new) ||
            !seq_pos_reserve_push(&q->pos, pe->n_new, pe->first_pos)) {
            llmem_errf(err, err_len, "KV cache: out of host memory for sequence %d's tokens", s);
            st = LLMEM_E_NO_MEMORY;
            goto fail;
        }
        int32_t np = kv_ps_div(kv, pe->n_cached);
        /* the table's last two entries as they will be, kept in registers:
         * reading the tail back right after the store that misses on it
         * would wait for the line (kv_last_sync reads it) */
        int32_t last = q->last, prev = q->prev;
        /* a decode step's one new page: from the magazine, or deferred */
        bool one_new = need[s] == 1 && kv->tail[s] < 0;
        /* entries past the table are written below (a prefill, prefix
         * pages): the magazine's go back first */
        if (q->mag_at < q->mag_end && (np > 0 || (need[s] > 0 && !one_new)))
            kv_mag_drain(kv, q);
        for (int32_t k = 0; k < np; k++) {
            prev = last;
            last = pinned.v[pin_at++];
            kv_pt_set(kv, q, q->pages.n++, last);
        }
        if (cow[s] == KV_TAIL_COPY) {
            /* the entry shows the copy from now on (the index tables and
             * the row the views read); the copy itself waits for apply
             * (kv_apply), and the old page stays held by the plan until
             * release (finish_cows drops it or puts it back) */
            kv_cow *w = &res->cow[res->n_cow++];
            int32_t p = kv_alloc_page(kv), at = len0[s] / ps;
            int32_t old = q->pages.v[at];
            *w = (kv_cow){.seq = s, .index = at, .page = old, .len0 = q->tokens.n};
            if (kv->page_shift[old]) { /* the K-shift tables must list the copy's slots */
                memcpy(kv->shift + (size_t)p * (size_t)ps, kv->shift + (size_t)old * (size_t)ps,
                       (size_t)ps * sizeof *kv->shift);
                kv->page_shift[p] = 1;
            }
            kv_pt_set(kv, q, at, p);
            if (at == q->pages.n - 1)
                last = p;
            else if (at == q->pages.n - 2)
                prev = p;
        } else if (cow[s] == KV_TAIL_UNHASH) {
            /* written in place: its hash no longer describes it */
            kv->pool.hashed[q->pages.v[len0[s] / ps]] = 0;
        }
        /* one new page, which kv->tail then holds (below), so that
         * build_tables does not read it from the row: its entry waits for
         * the upload (page_rows_write_upload); a prefill's pages go into
         * the row at once */
        if (one_new && q->mag_at < q->mag_end) {
            prev = last;
            last = kv_mag_pop(kv, q); /* already the row's entry pages.n */
            q->pages.n++;
        } else if (defer && one_new) {
            prev = last;
            last = kv_alloc_page_fast(kv);
            kv->row_defer.v[kv->row_defer.n++] = q->row + q->pages.n++;
            kv->row_defer.v[kv->row_defer.n++] = last;
        } else {
            for (int32_t k = 0; k < need[s]; k++) {
                prev = last;
                last = kv_alloc_page_fast(kv);
                kv_pt_set(kv, q, q->pages.n++, last);
            }
        }
        q->last = last;
        q->prev = prev;
        if (need[s] > 0 && kv->tail[s] < 0) { /* the index tables take it from here */
            kv->tail[s] = q->last;
            kv->tail_at[s] = q->pages.n - 1;
        }
    }
    st = build_tables(kv, plan, res, len0, count_shift(kv));
    if (st == LLMEM_OK && kv->ib.data.n > 0)
        st = llmem_buffer_upload(kv->idx, (size_t)kv->idx_rows * sizeof(int32_t), kv->ib.data.v,
                                 (size_t)kv->ib.data.n * sizeof(int32_t));
    if (st == LLMEM_OK)
        st = page_rows_upload(&kv->rows, kv->idx);
    /* a decode step's new entries: written into the rows and uploaded
     * together (page_rows_write_upload) */
    if (st == LLMEM_OK && kv->row_defer.n > 0) {
        st = page_rows_write_upload(&kv->rows, kv->idx, kv->row_defer.v, kv->row_defer.n / 2);
        kv->row_defer.n = 0;
    }
    if (st != LLMEM_OK)
        goto fail;
    vouch_rows(kv, res);
    i32vec_free(&pinned);
    kv->res = res;
    *out = res;
    return LLMEM_OK;
fail:
    if (kv->row_defer.n > 0) /* release_reservations reads them back */
        rows_write_deferred(kv);
    /* pinned pages not yet attached to a page table still hold a reference */
    for (int32_t k = pin_at; k < pinned.n; k++)
        if (pinned.v[k] >= 0)
            kv_unref_page(kv, pinned.v[k]);
    kv_host_unpin(kv, pinned.v + pin_at, pinned.n - pin_at);
    finish_cows(kv, res);
    if (attached)
        release_reservations(kv, plan);
    if (res) {
        free(res->ub);
        free(res->cow);
    }
    free(res);
    i32vec_free(&pinned);
    return st;
}

llmem_status kv_apply(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    kv_cache *kv = kv_of(mem);
    kv_res *res = r;
    if (!res->cow_done) {
        for (int32_t c = 0; c < res->n_cow; c++) {
            kv_cow *w = &res->cow[c];
            if (w->copied)
                continue; /* copied by an earlier, partly failed apply */
            llmem_status st = copy_page(kv, kv->seqs[w->seq].pages.v[w->index], w->page);
            if (st != LLMEM_OK)
                return st; /* the old page is still held; release puts it back */
            w->copied = true; /* the old page stays held until release */
        }
        res->cow_done = true;
    }
    res->cur = i;
    return LLMEM_OK;
}

/* A plan table of the view: element off of the built index, which sits at
 * element base of the device buffer (after the rows). */
static llmem_i32_table plan_table(const idx_builder *b, int32_t base, int32_t off, int32_t n)
{
    llmem_i32_table t = idx_table(b, off, n);
    if (n > 0)
        t.offset += (size_t)base * sizeof(int32_t);
    return t;
}

llmem_status kv_view(llmem_memory *mem, void *r, int32_t il, llmem_view *view)
{
    kv_cache *kv = kv_of(mem);
    kv_res *res = r;
    const kv_ub *t = &res->ub[res->cur];
    const idx_builder *ib = &kv->ib;
    /* the description lives in the memory, one per layer, so the views of
     * several layers of one ubatch stay valid together */
    llmem_kv_view *v = &kv->views[il];
    *view = llmem_view_make(LLMEM_VIEW_KV, v, sizeof *v, kv->idx);
    v->k = kv->k[il];
    v->v = kv->v[il];
    v->dtype = kv->p.dtype;
    v->n_pages = kv->p.n_pages;
    v->page_size = kv->p.page_size;
    v->n_kv_heads = kv->p.n_kv_heads;
    v->head_dim = kv->p.head_dim;
    int32_t base = kv->idx_rows;
    v->store_tok = plan_table(ib, base, t->store_tok, t->n_store);
    v->store_slot = plan_table(ib, base, t->store_slot, t->n_store);
    v->max_pages = t->max_pages;
    v->page_table = (llmem_i32_table){.host = kv->rows.v, .offset = 0, .n = kv->rows.n};
    v->page_off = plan_table(ib, base, t->page_off, t->n_seqs);
    v->seq_len = plan_table(ib, base, t->seq_len, t->n_seqs);
    v->tok_kv_len = plan_table(ib, base, t->tok_kv_len, t->n_tokens);
    v->tok_seq = plan_table(ib, base, t->tok_seq, t->n_tokens);
    v->shift_slot = plan_table(ib, base, t->shift_slot, t->n_shift);
    v->shift_delta = plan_table(ib, base, t->shift_delta, t->n_shift);
    return LLMEM_OK;
}

llmem_status kv_commit(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    kv_cache *kv = kv_of(mem);
    const llmem_ubatch *ub = &plan->ubatch[i];
    /* loop invariants in locals: the loop stores bytes (the pool's hash
     * flags), which the compiler must assume alias anything, so it
     * reloaded them every token (with pos_meta_push inline, the commit of
     * a 4,000-sequence step in pages of 16 -20%) */
    const int32_t *ids = plan->group_ids[i], *off = plan->group_off[i];
    const int32_t *tok = ub->token, *pos = ub->pos;
    kv_seq *seqs = kv->seqs;
    tok_stage *stage = kv->stage;
    const bool cached = plan->info.n_tokens_cached > 0, pub_pf = kv->publish_prefetch;
    const bool spread = kv->stage_spread;
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        int32_t s = ub->seq[k];
        if (k + 8 < ub->n_tokens) { /* decode: a sequence per token, tails far apart */
            int32_t qa = ids[off[ub->seq[k + 8]]];
            const kv_seq *ahead = &seqs[qa];
#if defined(__GNUC__)
            __builtin_prefetch(&stage[qa], 1, 1);
#endif
            if (ahead->pos.stored)
                i32vec_prefetch_tail(&ahead->pos.v);
            if (pub_pf)
                kv_prefetch_publish(kv, ahead);
        }
        for (int32_t m = off[s]; m < off[s + 1]; m++) {
            int32_t q = ids[m];
            kv_seq *sq = &seqs[q];
            /* an empty sequence may start with prefix-cache tokens: its
             * entry is looked up only when the plan has some (a decode
             * step's commit does not read the sequence's token array) */
            int32_t pk = cached && sq->tokens.n == 0
                             ? llmem_plan_seq_index(plan, q)
                             : -1;
            int32_t c = pk >= 0 ? plan->seqs[pk].n_cached : 0;
            if (c > 0) {
                if (!i32vec_reserve(&sq->tokens, c)) {
                    publish_flush(kv);
                    return LLMEM_E_NO_MEMORY;
                }
                for (int32_t j = 0; j < c; j++)
                    sq->tokens.v[j] = plan->seq_tokens[pk][j];
                sq->tokens.n = c;
                seq_pos_set_run(&sq->pos, c, 0);
                kv->prefix_hits += c;
            }
            /* kv_reserve made room for the token and its position, so
             * these checks only guard */
            tok_stage *g = &stage[q];
            if (!tok_stage_push(g, &sq->tokens, tok ? tok[k] : -1, spread ? q : -1)) {
                publish_flush(kv);
                return LLMEM_E_NO_MEMORY;
            }
            if (!seq_pos_push(&sq->pos, pos[k])) {
                tok_stage_pop(g, &sq->tokens); /* token and position go together */
                publish_flush(kv);
                return LLMEM_E_NO_MEMORY;
            }
            if (kv_ps_mod(kv, sq->tokens.n) == 0)
                publish_pages(kv, sq, kv_ps_div(kv, sq->tokens.n) - 1, true);
        }
    }
    publish_flush(kv); /* before the window slide can unreference a hashed page */
    if (kv->p.window > 0) /* pages that left every window of the ubatch's sequences */
        for (int32_t s = 0; s < ub->n_seqs; s++)
            for (int32_t m = 0; m < stream_n(plan, i, s); m++)
                swa_slide(kv, &kv->seqs[stream_seq(plan, i, s, m)]);
    if (i == 0 && kv->shift_pending) {
        for (int32_t p = 0; p < kv->p.n_pages; p++)
            clear_page_shift(kv, p);
        kv->shift_pending = false;
    }
    return LLMEM_OK;
}

void kv_release(llmem_memory *mem, const llmem_plan *plan, void *r)
{
    kv_cache *kv = kv_of(mem);
    kv_res *res = r;
    kv->res = NULL;
    finish_cows(kv, res);
    release_reservations(kv, plan);
    if (res) {
        free(res->ub);
        free(res->cow);
    }
    free(res);
}


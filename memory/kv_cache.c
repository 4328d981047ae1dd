/* llmem memory/: the paged unified KV cache — planning (reserve / apply /
 * commit / release), copy-on-write, prefix reuse and sequence operations.
 * State I/O and the invariant checker are in kv_state.c.
 * References: PagedAttention (Kwon et al., SOSP 2023); vLLM block manager
 * and automatic prefix caching; llama.cpp llama_kv_cache (seq_* semantics,
 * K-shift after seq_add). */
#include <stdlib.h>
#include <string.h>

#include "memory/kv_internal.h"

static void poison_page(kv_cache *kv, int32_t p)
{
    uint32_t nan = llmem_nan_pattern(kv->p.dtype);
    for (int32_t il = 0; il < kv->p.n_layers; il++) {
        llmem_buffer_fill(kv->k[il], (size_t)p * kv->page_bytes, kv->page_bytes, nan);
        llmem_buffer_fill(kv->v[il], (size_t)p * kv->page_bytes, kv->page_bytes, nan);
    }
}

static void clear_page_shift(kv_cache *kv, int32_t p)
{
    if (!kv->page_shift[p])
        return;
    memset(kv->shift + (size_t)p * (size_t)kv->p.page_size, 0,
           (size_t)kv->p.page_size * sizeof *kv->shift);
    kv->page_shift[p] = 0;
}

int32_t kv_alloc_page(kv_cache *kv)
{
    int32_t p = page_pool_alloc(&kv->pool, NULL);
    if (p < 0)
        return -1;
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
    }
}

void kv_drop_pages_from(kv_cache *kv, kv_seq *s, int32_t keep)
{
    for (int32_t i = s->pages.n - 1; i >= keep; i--)
        kv_unref_page(kv, s->pages.v[i]);
    if (s->pages.n > keep)
        s->pages.n = keep;
}

void kv_seq_drop(kv_cache *kv, kv_seq *s)
{
    kv_drop_pages_from(kv, s, 0);
    s->tokens.n = s->pos.n = 0;
}

static bool page_writable(const kv_cache *kv, int32_t p)
{
    return kv->pool.ref[p] == 1 && !kv->pool.published[p];
}

static int32_t n_pages_for_len(const kv_cache *kv, int32_t len)
{
    return (int32_t)(((int64_t)len + kv->p.page_size - 1) / kv->p.page_size);
}

/* Copies page `old` into page `p` (every layer's K and V, pending shifts). */
static llmem_status copy_page(kv_cache *kv, int32_t p, int32_t old)
{
    for (int32_t il = 0; il < kv->p.n_layers; il++) {
        llmem_status st = llmem_buffer_copy(kv->k[il], (size_t)p * kv->page_bytes, kv->k[il],
                                            (size_t)old * kv->page_bytes, kv->page_bytes);
        if (st == LLMEM_OK)
            st = llmem_buffer_copy(kv->v[il], (size_t)p * kv->page_bytes, kv->v[il],
                                   (size_t)old * kv->page_bytes, kv->page_bytes);
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
    s->pages.v[i] = p;
    kv_unref_page(kv, old);
    return LLMEM_OK;
}

/* --- prefix cache --------------------------------------------------------- */

static int32_t kv_prefix_pages(kv_cache *kv, const int32_t *tokens, int32_t n, int32_t *out)
{
    int32_t ps = kv->p.page_size, k = 0, parent = -1;
    uint64_t h = PAGE_HASH_SEED;
    for (; (int64_t)(k + 1) * ps <= n; k++) {
        h = page_hash(h, tokens + (size_t)k * (size_t)ps, ps);
        int32_t p = page_pool_lookup(&kv->pool, h, parent, tokens + (size_t)k * (size_t)ps);
        if (p < 0)
            break;
        if (out)
            out[k] = p;
        parent = p;
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

/* Hashes and publishes the full pages of s in [from_page, len / page_size). */
static void publish_pages(kv_cache *kv, kv_seq *s, int32_t from_page)
{
    if (kv->p.no_prefix_cache)
        return;
    int32_t ps = kv->p.page_size;
    page_pool *pp = &kv->pool;
    for (int32_t k = from_page; (int64_t)(k + 1) * ps <= s->tokens.n; k++) {
        int32_t p = s->pages.v[k];
        if (pp->hashed[p])
            continue;
        int32_t prev = k > 0 ? s->pages.v[k - 1] : -1;
        if (prev >= 0 && !pp->hashed[prev])
            return; /* the chain is broken below this page */
        const int32_t *tok = s->tokens.v + (size_t)k * (size_t)ps;
        for (int32_t j = 0; j < ps; j++)
            if (s->pos.v[k * ps + j] != k * ps + j || tok[j] < 0 || kv->page_shift[p])
                return; /* shifted positions or embeddings: not reusable */
        pp->hash[p] = page_hash(prev >= 0 ? pp->hash[prev] : PAGE_HASH_SEED, tok, ps);
        pp->parent[p] = prev;
        memcpy(pp->tokens + (size_t)p * (size_t)ps, tok, (size_t)ps * sizeof *tok);
        pp->hashed[p] = 1;
        page_pool_publish(pp, p);
    }
}

/* --- planning ----------------------------------------------------------------- */

static void release_reservations(kv_cache *kv, const llmem_plan *plan)
{
    for (int32_t s = 0; s < kv->base.n_seq_max; s++)
        if (plan->n_new[s] > 0)
            kv_drop_pages_from(kv, &kv->seqs[s], n_pages_for_len(kv, kv->seqs[s].tokens.n));
}

static int32_t stream_n(const llmem_plan *plan, int32_t u, int32_t s)
{
    return plan->stream_off[u][s + 1] - plan->stream_off[u][s];
}

static int32_t stream_seq(const llmem_plan *plan, int32_t u, int32_t s, int32_t j)
{
    return plan->stream_ids[u][plan->stream_off[u][s] + j];
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
                ib->data.v[t->store_slot + j] = kv_slot(kv, &kv->seqs[q], len_sim[q]++);
                j++;
            }
            ib->data.v[t->tok_kv_len + k] = len_sim[ub->seq_id[s]];
        }
        t->max_pages = 0;
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            int32_t len = len_sim[ub->seq_id[s]];
            ib->data.v[t->seq_len + s] = len;
            if (n_pages_for_len(kv, len) > t->max_pages)
                t->max_pages = n_pages_for_len(kv, len);
        }
        t->page_table = idx_append(ib, NULL, ub->n_seqs * t->max_pages, -1);
        if (t->page_table < 0)
            return LLMEM_E_NO_MEMORY;
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            const kv_seq *q = &kv->seqs[ub->seq_id[s]];
            int32_t np = n_pages_for_len(kv, ib->data.v[t->seq_len + s]);
            for (int32_t k = 0; k < np; k++)
                ib->data.v[t->page_table + s * t->max_pages + k] = q->pages.v[k];
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

/* int32 elements of every ubatch's index tables (build_tables), given each
 * sequence's length before the plan; -1 when out of host memory. */
static int64_t index_elems(const kv_cache *kv, const llmem_plan *plan, const int32_t *len0)
{
    int32_t nsm = kv->base.n_seq_max;
    int32_t *len = malloc((size_t)nsm * sizeof *len);
    if (!len)
        return -1;
    memcpy(len, len0, (size_t)nsm * sizeof *len);
    int64_t elems = 2 * (int64_t)count_shift(kv);
    for (int32_t u = 0; u < plan->n_ubatch; u++) {
        const llmem_ubatch *ub = &plan->ubatch[u];
        int32_t max_pages = 0;
        for (int32_t k = 0; k < ub->n_tokens; k++)
            for (int32_t m = 0; m < stream_n(plan, u, ub->seq[k]); m++) {
                len[stream_seq(plan, u, ub->seq[k], m)]++;
                elems += 2;
            }
        for (int32_t s = 0; s < ub->n_seqs; s++) {
            int32_t np = n_pages_for_len(kv, len[ub->seq_id[s]]);
            max_pages = np > max_pages ? np : max_pages;
        }
        elems += 2 * (int64_t)ub->n_tokens + ub->n_seqs + (int64_t)ub->n_seqs * max_pages;
    }
    free(len);
    return elems;
}

/* Pages the plan needs beyond the prefix pages it attaches: per sequence
 * need[s] new pages and cow[s] copies; len0[s] = length once the prefix is
 * attached. */
static int64_t pages_needed(const kv_cache *kv, const llmem_plan *plan, int32_t *need,
                            int32_t *len0, uint8_t *cow)
{
    int32_t ps = kv->p.page_size;
    int64_t total = 0;
    for (int32_t s = 0; s < kv->base.n_seq_max; s++) {
        need[s] = 0;
        cow[s] = 0;
        len0[s] = kv->seqs[s].tokens.n;
        if (plan->n_new[s] == 0)
            continue;
        const kv_seq *q = &kv->seqs[s];
        int32_t c = plan->n_cached[s];
        len0[s] = c > 0 ? c : q->tokens.n;
        int32_t nn = plan->n_new[s] - c;
        need[s] = llmem_pages_for(len0[s], nn, ps);
        if (c == 0 && nn > 0 && len0[s] % ps && !page_writable(kv, q->pages.v[len0[s] / ps]))
            cow[s] = 1;
        total += need[s] + cow[s];
    }
    return total;
}

static llmem_status kv_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                       size_t err_len)
{
    kv_cache *kv = kv_of(mem);
    int32_t nsm = mem->n_seq_max, ps = kv->p.page_size;
    llmem_status st = LLMEM_E_NO_MEMORY;
    int32_t *need = calloc((size_t)nsm, sizeof *need);
    int32_t *len0 = calloc((size_t)nsm, sizeof *len0);
    uint8_t *cow = calloc((size_t)nsm, 1);
    i32vec pages = {0}; /* cached (unreferenced) prefix pages the plan would pin */
    if (!need || !len0 || !cow)
        goto out;
    for (int32_t s = 0; s < nsm; s++) {
        int32_t c = plan->n_cached[s];
        if (plan->n_new[s] == 0 || c == 0)
            continue;
        int32_t np = c / ps, at = pages.n;
        if (c % ps || kv->seqs[s].tokens.n || !i32vec_reserve(&pages, pages.n + np) ||
            kv_prefix_pages(kv, plan->seq_tokens[s], c, pages.v + at) != np) {
            llmem_errf(err, err_len, "sequence %d: prefix pages changed during planning", s);
            st = LLMEM_E_STATE;
            goto out;
        }
        for (int32_t k = 0; k < np; k++) {
            int32_t p = pages.v[at + k];
            bool dup = kv->pool.ref[p] > 0;
            for (int32_t j = 0; j < pages.n && !dup; j++)
                dup = pages.v[j] == p;
            if (!dup)
                pages.v[pages.n++] = p;
        }
    }
    int64_t total = pages_needed(kv, plan, need, len0, cow);
    if (total > page_pool_available(&kv->pool) - pages.n) {
        llmem_errf(err, err_len, "KV cache: the batch needs %lld pages, %d free + %d evictable",
                   (long long)total, kv->pool.n_free, kv->pool.n_cached - pages.n);
        st = LLMEM_E_NO_SPACE;
        goto out;
    }
    int64_t elems = index_elems(kv, plan, len0);
    if (elems < 0)
        goto out;
    if (elems > INT32_MAX / 2) {
        st = LLMEM_E_INVALID;
        goto out;
    }
    st = idx_ensure(mem->backend, &kv->idx, (int32_t)elems);
    if (st != LLMEM_OK)
        llmem_errf(err, err_len, "KV cache: index buffer allocation failed");
out:
    free(need);
    free(len0);
    free(cow);
    i32vec_free(&pages);
    return st;
}

static llmem_status kv_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                               size_t err_len)
{
    kv_cache *kv = kv_of(mem);
    int32_t nsm = mem->n_seq_max, ps = kv->p.page_size;
    llmem_status st = LLMEM_E_NO_MEMORY;
    kv_res *res = calloc(1, sizeof *res);
    int32_t *need = calloc((size_t)nsm, sizeof *need);
    int32_t *len0 = calloc((size_t)nsm, sizeof *len0);
    uint8_t *cow = calloc((size_t)nsm, 1);
    i32vec pinned = {0};
    bool attached = false;
    int32_t pin_at = 0;
    if (!res || !need || !len0 || !cow)
        goto fail;
    res->cur = -1;
    res->n_ub = plan->n_ubatch;
    res->ub = calloc((size_t)plan->n_ubatch, sizeof *res->ub);
    res->cow = calloc((size_t)nsm, sizeof *res->cow);
    if (!res->ub || !res->cow)
        goto fail;
    int64_t total = 0;
    for (int32_t s = 0; s < nsm; s++) {
        if (plan->n_new[s] == 0)
            continue;
        kv_seq *q = &kv->seqs[s];
        int32_t c = plan->n_cached[s];
        if (c > 0) {
            int32_t np = c / ps;
            int32_t at = pinned.n;
            if (c % ps || q->tokens.n || !i32vec_reserve(&pinned, pinned.n + np) ||
                kv_prefix_pages(kv, plan->seq_tokens[s], c, pinned.v + at) != np) {
                llmem_errf(err, err_len, "sequence %d: prefix pages changed during planning", s);
                st = LLMEM_E_STATE;
                goto fail;
            }
            for (int32_t k = 0; k < np; k++)
                page_pool_ref(&kv->pool, pinned.v[at + k]);
            pinned.n += np;
        }
    }
    total = pages_needed(kv, plan, need, len0, cow);
    if (total > page_pool_available(&kv->pool)) {
        llmem_errf(err, err_len, "KV cache: the batch needs %lld pages, %d free + %d evictable",
                   (long long)total, kv->pool.n_free, kv->pool.n_cached);
        st = LLMEM_E_NO_SPACE;
        goto fail;
    }
    /* index size, computed before anything irreversible */
    int64_t elems = index_elems(kv, plan, len0);
    if (elems < 0)
        goto fail;
    if (elems > INT32_MAX / 2) {
        st = LLMEM_E_INVALID;
        goto fail;
    }
    kv->ib.data.n = 0;
    if (!i32vec_reserve(&kv->ib.data, (int32_t)elems))
        goto fail;
    st = idx_ensure(mem->backend, &kv->idx, (int32_t)elems);
    if (st != LLMEM_OK) {
        llmem_errf(err, err_len, "KV cache: index buffer allocation failed");
        goto fail;
    }
    /* from here on, reservations live in the page tables; release undoes them */
    attached = true;
    for (int32_t s = 0; s < nsm; s++) {
        if (plan->n_new[s] == 0)
            continue;
        kv_seq *q = &kv->seqs[s];
        int32_t np = plan->n_cached[s] / ps;
        if (!i32vec_reserve(&q->pages, q->pages.n + np + need[s]))
            goto fail;
        for (int32_t k = 0; k < np; k++)
            q->pages.v[q->pages.n++] = pinned.v[pin_at++];
        if (cow[s]) {
            /* the copy itself waits for apply (kv_apply), the page is taken now */
            kv_cow *w = &res->cow[res->n_cow++];
            *w = (kv_cow){.seq = s, .index = len0[s] / ps, .page = kv_alloc_page(kv)};
            int32_t old = q->pages.v[w->index];
            if (kv->page_shift[old]) { /* the K-shift tables must list the copy's slots */
                memcpy(kv->shift + (size_t)w->page * (size_t)ps,
                       kv->shift + (size_t)old * (size_t)ps, (size_t)ps * sizeof *kv->shift);
                kv->page_shift[w->page] = 1;
            }
        } else if (len0[s] % ps && q->pages.n > len0[s] / ps) {
            /* written in place: its hash, if any, no longer describes it */
            kv->pool.hashed[q->pages.v[len0[s] / ps]] = 0;
        }
        for (int32_t k = 0; k < need[s]; k++)
            q->pages.v[q->pages.n++] = kv_alloc_page(kv);
    }
    for (int32_t c = 0; c < res->n_cow; c++) { /* tables see the copies */
        int32_t *e = &kv->seqs[res->cow[c].seq].pages.v[res->cow[c].index];
        int32_t t = *e;
        *e = res->cow[c].page;
        res->cow[c].page = t;
    }
    st = build_tables(kv, plan, res, len0, count_shift(kv));
    for (int32_t c = 0; c < res->n_cow; c++) {
        int32_t *e = &kv->seqs[res->cow[c].seq].pages.v[res->cow[c].index];
        int32_t t = *e;
        *e = res->cow[c].page;
        res->cow[c].page = t;
    }
    if (st == LLMEM_OK)
        st = idx_upload(kv->idx, &kv->ib);
    if (st != LLMEM_OK)
        goto fail;
    free(need);
    free(len0);
    free(cow);
    i32vec_free(&pinned);
    kv->res = res;
    *out = res;
    return LLMEM_OK;
fail:
    /* pinned pages not yet attached to a page table still hold a reference */
    for (int32_t k = pin_at; k < pinned.n; k++)
        kv_unref_page(kv, pinned.v[k]);
    if (attached)
        release_reservations(kv, plan);
    for (int32_t c = 0; res && c < res->n_cow; c++)
        kv_unref_page(kv, res->cow[c].page);
    if (res) {
        free(res->ub);
        free(res->cow);
    }
    free(res);
    free(need);
    free(len0);
    free(cow);
    i32vec_free(&pinned);
    return st;
}

static llmem_status kv_apply(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    kv_cache *kv = kv_of(mem);
    kv_res *res = r;
    if (!res->cow_done) {
        for (int32_t c = 0; c < res->n_cow; c++) {
            kv_cow *w = &res->cow[c];
            int32_t *e = &kv->seqs[w->seq].pages.v[w->index];
            llmem_status st = copy_page(kv, w->page, *e);
            if (st != LLMEM_OK)
                return st; /* nothing switched yet for this one; release frees it */
            kv_unref_page(kv, *e);
            *e = w->page;
            w->page = -1;
        }
        res->cow_done = true;
    }
    res->cur = i;
    return LLMEM_OK;
}

static llmem_status kv_view(llmem_memory *mem, void *r, int32_t il, llmem_view *view)
{
    kv_cache *kv = kv_of(mem);
    kv_res *res = r;
    const kv_ub *t = &res->ub[res->cur];
    const idx_builder *ib = &kv->ib;
    llmem_kv_view *v = &view->u.kv;
    view->kind = LLMEM_VIEW_KV;
    view->idx = kv->idx;
    v->k = kv->k[il];
    v->v = kv->v[il];
    v->dtype = kv->p.dtype;
    v->n_pages = kv->p.n_pages;
    v->page_size = kv->p.page_size;
    v->n_kv_heads = kv->p.n_kv_heads;
    v->head_dim = kv->p.head_dim;
    v->store_tok = idx_table(ib, t->store_tok, t->n_store);
    v->store_slot = idx_table(ib, t->store_slot, t->n_store);
    v->max_pages = t->max_pages;
    v->page_table = idx_table(ib, t->page_table, t->n_seqs * t->max_pages);
    v->seq_len = idx_table(ib, t->seq_len, t->n_seqs);
    v->tok_kv_len = idx_table(ib, t->tok_kv_len, t->n_tokens);
    v->tok_seq = idx_table(ib, t->tok_seq, t->n_tokens);
    v->shift_slot = idx_table(ib, t->shift_slot, t->n_shift);
    v->shift_delta = idx_table(ib, t->shift_delta, t->n_shift);
    return LLMEM_OK;
}

static llmem_status kv_commit(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i)
{
    kv_cache *kv = kv_of(mem);
    const llmem_ubatch *ub = &plan->ubatch[i];
    int32_t ps = kv->p.page_size;
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        int32_t s = ub->seq[k];
        for (int32_t m = 0; m < stream_n(plan, i, s); m++) {
            int32_t q = stream_seq(plan, i, s, m);
            kv_seq *sq = &kv->seqs[q];
            int32_t c = plan->n_cached[q];
            if (c > 0 && sq->tokens.n == 0) {
                if (!i32vec_reserve(&sq->tokens, c) || !i32vec_reserve(&sq->pos, c))
                    return LLMEM_E_NO_MEMORY;
                for (int32_t j = 0; j < c; j++) {
                    sq->tokens.v[j] = plan->seq_tokens[q][j];
                    sq->pos.v[j] = j;
                }
                sq->tokens.n = sq->pos.n = c;
                kv->prefix_hits += c;
            }
            if (!i32vec_push(&sq->tokens, ub->token ? ub->token[k] : -1) ||
                !i32vec_push(&sq->pos, ub->pos[k]))
                return LLMEM_E_NO_MEMORY;
            if (sq->tokens.n % ps == 0)
                publish_pages(kv, sq, sq->tokens.n / ps - 1);
        }
    }
    if (i == 0 && kv->shift_pending) {
        for (int32_t p = 0; p < kv->p.n_pages; p++)
            clear_page_shift(kv, p);
        kv->shift_pending = false;
    }
    return LLMEM_OK;
}

static void kv_release(llmem_memory *mem, const llmem_plan *plan, void *r)
{
    kv_cache *kv = kv_of(mem);
    kv_res *res = r;
    kv->res = NULL;
    release_reservations(kv, plan);
    for (int32_t c = 0; res && c < res->n_cow; c++)
        if (res->cow[c].page >= 0)
            kv_unref_page(kv, res->cow[c].page);
    if (res) {
        free(res->ub);
        free(res->cow);
    }
    free(res);
}

/* --- sequences ------------------------------------------------------------------ */

static llmem_status kv_seq_rm(llmem_memory *mem, int32_t seq, int32_t p0, int32_t p1, bool dry)
{
    kv_cache *kv = kv_of(mem);
    kv_seq *s = &kv->seqs[seq];
    int32_t n = s->tokens.n, first = n;
    for (int32_t j = 0; j < n && first == n; j++)
        if (pos_in_range(s->pos.v[j], p0, p1))
            first = j;
    if (first == n)
        return LLMEM_OK;
    for (int32_t j = first; j < n; j++)
        if (!pos_in_range(s->pos.v[j], p0, p1))
            return LLMEM_E_STATE; /* a hole in the middle of a page table */
    if (dry)
        return LLMEM_OK;
    kv_drop_pages_from(kv, s, n_pages_for_len(kv, first));
    s->tokens.n = s->pos.n = first;
    if (first % kv->p.page_size) {
        int32_t last = s->pages.v[s->pages.n - 1];
        if (page_writable(kv, last))
            kv->pool.hashed[last] = 0; /* its tail will be overwritten */
    }
    return LLMEM_OK;
}

static llmem_status kv_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                              int32_t p1, bool dry)
{
    kv_cache *kv = kv_of(mem);
    kv_seq *a = &kv->seqs[src], *b = &kv->seqs[dst];
    int32_t n = a->tokens.n, k = 0;
    while (k < n && pos_in_range(a->pos.v[k], p0, p1))
        k++;
    for (int32_t j = k; j < n; j++)
        if (pos_in_range(a->pos.v[j], p0, p1))
            return LLMEM_E_STATE; /* only a prefix of src can be shared */
    int32_t np = n_pages_for_len(kv, k);
    if (dry)
        return LLMEM_OK;
    if (!i32vec_reserve(&b->pages, np) || !i32vec_reserve(&b->tokens, k) ||
        !i32vec_reserve(&b->pos, k))
        return LLMEM_E_NO_MEMORY;
    kv_seq_drop(kv, b);
    for (int32_t j = 0; j < np; j++) {
        b->pages.v[j] = a->pages.v[j];
        page_pool_ref(&kv->pool, a->pages.v[j]);
    }
    b->pages.n = np;
    i32_copy(b->tokens.v, a->tokens.v, k);
    i32_copy(b->pos.v, a->pos.v, k);
    b->tokens.n = b->pos.n = k;
    return LLMEM_OK;
}

static llmem_status kv_seq_keep(llmem_memory *mem, int32_t seq, bool dry)
{
    kv_cache *kv = kv_of(mem);
    if (dry)
        return LLMEM_OK;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        if (s != seq)
            kv_seq_drop(kv, &kv->seqs[s]);
    return LLMEM_OK;
}

/* seq_add (div == 0) or seq_div (div > 0) over [p0, p1). */
static llmem_status shift_positions(kv_cache *kv, int32_t seq, int32_t p0, int32_t p1,
                                    int32_t delta, int32_t div, bool dry)
{
    kv_seq *s = &kv->seqs[seq];
    int32_t ps = kv->p.page_size, n_cow = 0, last_page = -1;
    for (int32_t j = 0; j < s->tokens.n; j++) {
        int32_t pos = s->pos.v[j];
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
    if (n_cow > page_pool_available(&kv->pool))
        return LLMEM_E_NO_SPACE;
    if (dry)
        return LLMEM_OK;
    last_page = -1;
    for (int32_t j = 0; j < s->tokens.n; j++) {
        int32_t pos = s->pos.v[j];
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
        s->pos.v[j] = np;
    }
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
    return seq_pos_min(&kv_of(mem)->seqs[seq].pos);
}

static int32_t kv_pos_max(llmem_memory *mem, int32_t seq)
{
    return seq_pos_max(&kv_of(mem)->seqs[seq].pos);
}

static int32_t kv_seq_tokens(llmem_memory *mem, int32_t seq, int32_t *out, int32_t cap)
{
    return seq_copy_tokens(&kv_of(mem)->seqs[seq].tokens, out, cap);
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
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        kv->seqs[s].pages.n = kv->seqs[s].tokens.n = kv->seqs[s].pos.n = 0;
    page_pool_reset(&kv->pool);
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
    st->pages_free = kv->pool.n_free;
    st->pages_cached = kv->pool.n_cached;
    st->pages_used = page_pool_used(&kv->pool);
    st->pages_peak = kv->pool.n_used_peak;
    st->prefix_hit_tokens = kv->prefix_hits;
    st->prefix_evictions = kv->pool.n_evictions;
    st->cow_copies = kv->cow_copies;
    st->bytes_device = (int64_t)(2 * (size_t)kv->p.n_layers * (size_t)kv->p.n_pages * kv->page_bytes);
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        st->n_seqs_live += kv->seqs[s].tokens.n > 0;
}

static void kv_destroy(llmem_memory *mem)
{
    kv_cache *kv = kv_of(mem);
    for (int32_t il = 0; kv->k && il < kv->p.n_layers; il++) {
        llmem_buffer_free(kv->k[il]);
        llmem_buffer_free(kv->v[il]);
    }
    free(kv->k);
    free(kv->v);
    for (int32_t s = 0; kv->seqs && s < mem->n_seq_max; s++) {
        i32vec_free(&kv->seqs[s].pages);
        i32vec_free(&kv->seqs[s].tokens);
        i32vec_free(&kv->seqs[s].pos);
    }
    free(kv->seqs);
    free(kv->shift);
    free(kv->page_shift);
    llmem_buffer_free(kv->idx);
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
             p->dtype != LLMEM_DTYPE_BF16) bad = "dtype must be f32, f16 or bf16";
    else if ((int64_t)p->n_pages * p->page_size > INT32_MAX) bad = "n_pages * page_size exceeds int32 slot ids";
    if (bad) {
        llmem_errf(err, err_len, "KV cache: %s", bad);
        return LLMEM_E_INVALID;
    }
    size_t row = (size_t)p->n_kv_heads * (size_t)p->head_dim * llmem_dtype_size(p->dtype);
    if (row / llmem_dtype_size(p->dtype) / (size_t)p->n_kv_heads != (size_t)p->head_dim ||
        row > SIZE_MAX / (size_t)p->page_size ||
        row * (size_t)p->page_size > SIZE_MAX / (size_t)p->n_pages) {
        llmem_errf(err, err_len, "KV cache: pool size overflows");
        return LLMEM_E_INVALID;
    }
    kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return LLMEM_E_NO_MEMORY;
    llmem_memory_init(&kv->base, &kv_cache_iface, be, p->n_layers, p->n_seq_max,
                      LLMEM_SPLIT_SIMPLE, true);
    kv->p = *p;
    kv->p.poison = p->poison || llmem_env_poison();
    kv->row_bytes = row;
    kv->page_bytes = row * (size_t)p->page_size;
    llmem_status st = LLMEM_E_NO_MEMORY;
    kv->seqs = calloc((size_t)p->n_seq_max, sizeof *kv->seqs);
    kv->k = calloc((size_t)p->n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)p->n_layers, sizeof *kv->v);
    kv->shift = calloc((size_t)p->n_pages * (size_t)p->page_size, sizeof *kv->shift);
    kv->page_shift = calloc((size_t)p->n_pages, 1);
    if (!kv->seqs || !kv->k || !kv->v || !kv->shift || !kv->page_shift ||
        !page_pool_init(&kv->pool, p->n_pages, p->page_size))
        goto fail;
    size_t pool_bytes = kv->page_bytes * (size_t)p->n_pages;
    for (int32_t il = 0; il < p->n_layers; il++) {
        if ((st = llmem_buffer_alloc(be, pool_bytes, &kv->k[il])) != LLMEM_OK ||
            (st = llmem_buffer_alloc(be, pool_bytes, &kv->v[il])) != LLMEM_OK) {
            llmem_errf(err, err_len, "KV cache: cannot allocate %zu-byte pool for layer %d: %s",
                       pool_bytes, il, llmem_status_str(st));
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
    if (out && cap > 0)
        i32_copy(out, s->pages.v, s->pages.n < cap ? s->pages.n : cap);
    return s->pages.n;
}

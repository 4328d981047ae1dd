/* llmem memory/: KV cache state I/O (section payload, framed by
 * memory.c) and the invariant checker.
 *
 * Payload: i32 n_layers, n_kv_heads, head_dim, dtype, n_entries; then per
 * entry: i32 seq_id, len, share_from, shared_len (format 2: the entry's
 * first shared_len tokens live in the same pages as those of the earlier
 * entry share_from, -1 none — sequences that share pages through seq_cp or
 * prefix hits read back sharing them), tokens[len], pos[len], shift[len]
 * (pending K-shift of each slot), then for every layer the
 * K rows then the V rows of its len slots (row = n_kv_heads * head_dim
 * elements of dtype). Page size is not part of the format: a stream loads
 * into a cache of any page size. A windowed cache (swa.c) marks the rows it
 * no longer holds (a prefix: shift KV_ROW_LOST, zero K/V), and reads back
 * only the pages its window keeps; a full cache refuses such a state. Except for the scaled dtypes (int8, fp8),
 * whose scales belong to pages: their header has an i32 page_size after
 * dtype (a stream loads only into a cache of that page size), and the rows
 * of each page are followed by its n_kv_heads f32 scales. */
#include <stdlib.h>
#include <string.h>

#include "memory/kv_internal.h"
#include "memory/prefix_budget.h"

/* Bytes of K/V data of an entry of len tokens (all layers). */
static size_t entry_data_bytes(const kv_cache *kv, int32_t len)
{
    size_t b = (size_t)len * kv->row_bytes;
    if (llmem_dtype_is_scaled(kv->p.dtype))
        b += (size_t)n_pages_for_len(kv, len) * (size_t)kv->p.n_kv_heads * sizeof(float);
    return b * 2 * (size_t)kv->p.n_layers;
}

static size_t scale_offset(const kv_cache *kv)
{
    return llmem_kv_scale_offset(kv->p.dtype, kv->p.page_size, kv->p.n_kv_heads,
                                 kv->p.head_dim);
}

static llmem_status write_seq(kv_cache *kv, int32_t id, int32_t share_from, int32_t shared_len,
                              llmem_state_writer *w)
{
    const kv_seq *s = &kv->seqs[id];
    int32_t n = s->tokens.n, ps = kv->p.page_size;
    llmem_state_put_i32(w, id);
    llmem_state_put_i32(w, n);
    llmem_state_put_i32(w, share_from);
    llmem_state_put_i32(w, shared_len);
    kv_tokens_sync(kv, s);
    llmem_state_put(w, s->tokens.v, (size_t)n * sizeof(int32_t));
    seq_pos_put(&s->pos, w, n);
    int32_t skip = swa_skip(kv, s); /* tokens whose pages left the window */
    for (int32_t j = 0; j < n; j++) /* pending K-shift of each slot; lost rows marked */
        llmem_state_put_i32(w, j < s->lost ? KV_ROW_LOST : kv->shift[kv_slot(kv, s, j)]);
    for (int32_t il = 0; il < kv->p.n_layers; il++)
        for (int32_t kvi = 0; kvi < 2; kvi++) {
            llmem_buffer *pool = kvi ? kv->v[il] : kv->k[il];
            for (int32_t j = 0; j < n; j += ps) {
                int32_t m = n - j < ps ? n - j : ps;
                size_t bytes = (size_t)m * kv->row_bytes;
                size_t page = (size_t)s->pages.v[j / ps] * kv->page_bytes;
                void *dst = llmem_state_reserve(w, bytes);
                if (j < skip) { /* pages that left the window: zero rows and scales */
                    if (dst)
                        memset(dst, 0, bytes);
                    if (llmem_dtype_is_scaled(kv->p.dtype) &&
                        (dst = llmem_state_reserve(w, (size_t)kv->p.n_kv_heads * 4)))
                        memset(dst, 0, (size_t)kv->p.n_kv_heads * sizeof(float));
                    continue;
                }
                llmem_status st = LLMEM_OK;
                if (dst && (st = llmem_buffer_download(pool, page, dst, bytes)) != LLMEM_OK)
                    return st;
                if (!llmem_dtype_is_scaled(kv->p.dtype))
                    continue;
                size_t sb = (size_t)kv->p.n_kv_heads * sizeof(float); /* the page's scales */
                if ((dst = llmem_state_reserve(w, sb)) &&
                    (st = llmem_buffer_download(pool, page + scale_offset(kv), dst, sb)) !=
                        LLMEM_OK)
                    return st;
            }
        }
    return LLMEM_OK;
}

llmem_status kv_state_write(llmem_memory *mem, int32_t seq, llmem_state_writer *w)
{
    kv_cache *kv = kv_of(mem);
    int32_t n_entries = 0;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        n_entries += seq >= 0 ? s == seq : kv->seqs[s].tokens.n > 0;
    llmem_state_put_i32(w, kv->p.n_layers);
    llmem_state_put_i32(w, kv->p.n_kv_heads);
    llmem_state_put_i32(w, kv->p.head_dim);
    llmem_state_put_i32(w, (int32_t)kv->p.dtype);
    if (llmem_dtype_is_scaled(kv->p.dtype))
        llmem_state_put_i32(w, kv->p.page_size);
    llmem_state_put_i32(w, n_entries);
    /* sharing: an entry shares with the first earlier entry whose first
     * page is its own first page, for their common run of pages */
    int32_t *first = NULL, *seq_of = NULL;
    if (seq < 0 && n_entries > 1) {
        first = malloc((size_t)kv->p.n_pages * sizeof *first);
        seq_of = malloc((size_t)n_entries * sizeof *seq_of);
        if (!first || !seq_of) {
            free(first);
            free(seq_of);
            return LLMEM_E_NO_MEMORY;
        }
        memset(first, 0xff, (size_t)kv->p.n_pages * sizeof *first);
    }
    llmem_status st = LLMEM_OK;
    for (int32_t s = 0, e = 0; s < mem->n_seq_max && st == LLMEM_OK; s++) {
        if (seq >= 0 ? s != seq : kv->seqs[s].tokens.n == 0)
            continue;
        const kv_seq *q = &kv->seqs[s];
        int32_t from = -1, shared = 0;
        if (first && q->tokens.n > 0 && q->dropped == 0) {
            int32_t p0 = q->pages.v[0];
            if (first[p0] >= 0) {
                from = first[p0];
                const kv_seq *o = &kv->seqs[seq_of[from]];
                int32_t k = 0, np = n_pages_for_len(kv, q->tokens.n);
                int32_t no = n_pages_for_len(kv, o->tokens.n);
                while (k < np && k < no && q->pages.v[k] == o->pages.v[k])
                    k++;
                int64_t l = (int64_t)k * kv->p.page_size;
                shared = (int32_t)(l < q->tokens.n ? l : q->tokens.n);
                shared = shared < o->tokens.n ? shared : o->tokens.n;
            } else {
                first[p0] = e;
            }
            seq_of[e] = s;
        }
        st = write_seq(kv, s, from, shared, w);
        e++;
    }
    free(first);
    free(seq_of);
    return st;
}

/* Pages of the reader shared with the entry's share_from: whole pages of
 * the shared tokens, or every page when the entry lies within them. */
static int32_t shared_pages(const kv_cache *kv, int32_t len, int32_t shared_len)
{
    return shared_len >= len ? n_pages_for_len(kv, len) : shared_len / kv->p.page_size;
}

typedef struct kv_entry {
    int32_t seq, len, share_from, shared_len;
    int32_t lost;    /* leading rows marked KV_ROW_LOST */
    int32_t dropped; /* pages a windowed reader does not take */
    const int32_t *tokens, *pos, *shift; /* unaligned-safe copies below */
    const uint8_t *data;         /* [n_layers][2][len rows] */
} kv_entry;

typedef struct kv_tmp {
    int32_t n;
    kv_entry *e;
    int32_t *ints; /* tokens and positions, copied out of the stream */
} kv_tmp;

void kv_state_read_abort(llmem_memory *mem, void *tmp)
{
    kv_tmp *t = tmp;
    if (!t)
        return;
    free(t->e);
    free(t->ints);
    free(t);
}

/* The host room kv_state_read_apply takes, taken here, before it drops
 * anything (host memory is not what prepare checks space for): every
 * entry's token and position capacity, and its page-table row. One
 * sequence (seq >= 0) keeps its row, grown to its entry's pages with its
 * entries kept; a whole-cache read (seq -1) reserves the row table's room
 * for every entry's row after the clear. Capacity only: the cache reads
 * the same afterwards. false when out of host memory. */
static bool kv_state_read_reserve(kv_cache *kv, int32_t seq, const kv_tmp *t)
{
    int64_t rows = 0;
    for (int32_t i = 0; i < t->n; i++) {
        const kv_entry *e = &t->e[i];
        kv_seq *s = &kv->seqs[seq >= 0 ? seq : e->seq];
        int32_t np = llmem_pages_for(0, e->len, kv->p.page_size);
        if (!i32vec_reserve(&s->tokens, e->len) || !seq_pos_reserve(&s->pos, e->len))
            return false;
        if (np == 0)
            continue;
        if (seq >= 0 && !kv_pt_fit(kv, s, np > s->pages.n ? np : s->pages.n))
            return false;
        rows += page_rows_cost(np);
    }
    if (seq >= 0)
        return true;
    const int32_t *old = kv->rows.v;
    if (!page_rows_reserve(&kv->rows, rows))
        return false;
    if (kv->rows.v != old) /* the table moved: the page tables live in it */
        kv_pt_repoint(kv);
    return true;
}

llmem_status kv_state_read_prepare(llmem_memory *mem, int32_t seq, llmem_state_reader *r,
                                   void **out, char *err, size_t err_len)
{
    kv_cache *kv = kv_of(mem);
    int32_t g[5], ps = kv->p.page_size;
    for (int k = 0; k < 4; k++)
        if (!llmem_state_get_i32(r, &g[k]))
            return LLMEM_E_CORRUPT;
    if (g[3] == (int32_t)kv->p.dtype && llmem_dtype_is_scaled(kv->p.dtype) &&
        !llmem_state_get_i32(r, &ps))
        return LLMEM_E_CORRUPT;
    if (!llmem_state_get_i32(r, &g[4]))
        return LLMEM_E_CORRUPT;
    if (g[0] != kv->p.n_layers || g[1] != kv->p.n_kv_heads || g[2] != kv->p.head_dim ||
        g[3] != (int32_t)kv->p.dtype) {
        llmem_errf(err, err_len,
                   "KV state is for %d layers x %d heads x %d dims (dtype %d); this cache has "
                   "%d x %d x %d (dtype %d)",
                   g[0], g[1], g[2], g[3], kv->p.n_layers, kv->p.n_kv_heads, kv->p.head_dim,
                   (int)kv->p.dtype);
        return LLMEM_E_INVALID;
    }
    if (ps != kv->p.page_size) {
        llmem_errf(err, err_len, "KV state (%s) is for page size %d; this cache has %d",
                   llmem_dtype_name(kv->p.dtype), ps, kv->p.page_size);
        return LLMEM_E_INVALID;
    }
    int32_t n = g[4];
    if (n < 0 || (seq >= 0 && n != 1)) {
        llmem_errf(err, err_len, "KV state holds %d sequences", n);
        return LLMEM_E_CORRUPT;
    }
    if (n > mem->n_seq_max) { /* written by a cache with a larger n_seq_max */
        llmem_errf(err, err_len, "KV state holds %d sequences; this cache has n_seq_max %d", n,
                   mem->n_seq_max);
        return LLMEM_E_INVALID;
    }
    kv_tmp *t = calloc(1, sizeof *t);
    if (!t)
        return LLMEM_E_NO_MEMORY;
    t->n = n;
    t->e = calloc((size_t)(n > 0 ? n : 1), sizeof *t->e);
    uint8_t *seen = calloc((size_t)mem->n_seq_max, 1); /* duplicates in O(n) */
    if (!t->e || !seen) {
        free(seen);
        goto nomem;
    }
    int64_t pages = 0, ints = 0;
    size_t at = r->pos;
    for (int32_t i = 0; i < n; i++) {
        kv_entry *e = &t->e[i];
        if (!llmem_state_get_i32(r, &e->seq) || !llmem_state_get_i32(r, &e->len) ||
            !llmem_state_get_i32(r, &e->share_from) || !llmem_state_get_i32(r, &e->shared_len) ||
            e->len < 0 || e->seq < 0 || e->share_from < -1 || e->share_from >= i ||
            e->shared_len < 0 || e->shared_len > e->len ||
            (e->share_from >= 0 ? e->shared_len > t->e[e->share_from].len
                                : e->shared_len != 0)) {
            llmem_errf(err, err_len, "KV state entry %d: bad sequence id or length", i);
            free(seen);
            goto corrupt;
        }
        if (e->seq >= mem->n_seq_max) { /* another geometry, not damage */
            llmem_errf(err, err_len, "KV state: sequence id %d, this cache has n_seq_max %d",
                       e->seq, mem->n_seq_max);
            free(seen);
            kv_state_read_abort(mem, t);
            return LLMEM_E_INVALID;
        }
        if (seen[e->seq]++) {
            llmem_errf(err, err_len, "KV state: sequence %d appears twice", e->seq);
            free(seen);
            goto corrupt;
        }
        size_t ib = (size_t)e->len * sizeof(int32_t);
        size_t db = entry_data_bytes(kv, e->len);
        if ((size_t)e->len > r->len / sizeof(int32_t) || !llmem_state_peek(r, 3 * ib) ||
            !(e->data = llmem_state_peek(r, db))) {
            llmem_errf(err, err_len, "KV state entry %d: truncated", i);
            free(seen);
            goto corrupt;
        }
        ints += 3 * (int64_t)e->len;
    }
    free(seen);
    /* second pass: copy tokens/positions out (the stream may be unaligned) */
    t->ints = malloc((size_t)(ints > 0 ? ints : 1) * sizeof(int32_t));
    if (!t->ints)
        goto nomem;
    llmem_state_reader r2 = {.buf = r->buf, .len = r->len, .pos = at};
    int32_t *dst = t->ints;
    for (int32_t i = 0; i < n; i++) {
        kv_entry *e = &t->e[i];
        llmem_state_get(&r2, NULL, 16);
        llmem_state_get(&r2, dst, (size_t)e->len * sizeof(int32_t));
        e->tokens = dst;
        dst += e->len;
        llmem_state_get(&r2, dst, (size_t)e->len * sizeof(int32_t));
        e->pos = dst;
        for (int32_t j = 0; j < e->len; j++)
            if (dst[j] < 0 || dst[j] == INT32_MAX) {
                llmem_errf(err, err_len, "KV state entry %d: position outside [0, 2^31 - 1)", i);
                goto corrupt;
            }
        dst += e->len;
        llmem_state_get(&r2, dst, (size_t)e->len * sizeof(int32_t));
        e->shift = dst;
        dst += e->len;
        llmem_state_get(&r2, NULL, entry_data_bytes(kv, e->len));
        /* rows the writer no longer held (left its sliding window): a prefix */
        while (e->lost < e->len && e->shift[e->lost] == KV_ROW_LOST)
            e->lost++;
        for (int32_t j = e->lost; j < e->len; j++)
            if (e->shift[j] == KV_ROW_LOST) {
                llmem_errf(err, err_len, "KV state entry %d: a lost row after a held one", i);
                goto corrupt;
            }
        int64_t lo = (int64_t)e->len + 1 - kv->p.window;
        if (e->lost > 0 && (kv->p.window == 0 || e->lost > (lo > 0 ? lo : 0))) {
            llmem_errf(err, err_len,
                       "KV state entry %d: its first %d tokens left a sliding window; this "
                       "cache %s", i, e->lost,
                       kv->p.window ? "has a wider window" : "keeps every key");
            kv_state_read_abort(mem, t);
            return LLMEM_E_INVALID;
        }
        /* a windowed cache shares nothing on read and keeps only its window */
        e->dropped = kv->p.window > 0 ? swa_keep_from(kv, e->len) : 0;
        e->dropped = (e->lost > e->dropped ? e->lost : e->dropped) / kv->p.page_size;
        pages += n_pages_for_len(kv, e->len) -
                 (kv->p.window > 0 ? e->dropped
                  : e->share_from >= 0 ? shared_pages(kv, e->len, e->shared_len) : 0);
    }
    /* space: what is obtainable once the replaced sequences are dropped */
    int64_t avail = kv_available(kv);
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        if (seq >= 0 && s != seq)
            continue;
        const kv_seq *q = &kv->seqs[s];
        for (int32_t k = q->dropped; k < q->pages.n; k++)
            avail += kv->pool.ref[q->pages.v[k]] == 1;
    }
    if (seq < 0)
        avail = kv->p.n_pages;
    if (pages > avail) {
        llmem_errf(err, err_len, "KV state needs %lld pages, %lld available", (long long)pages,
                   (long long)avail);
        kv_state_read_abort(mem, t);
        return LLMEM_E_NO_SPACE;
    }
    if (!kv_state_read_reserve(kv, seq, t)) {
        llmem_errf(err, err_len, "KV state: out of host memory for its page tables and tokens");
        goto nomem;
    }
    *out = t;
    return LLMEM_OK;
corrupt:
    kv_state_read_abort(mem, t);
    return LLMEM_E_CORRUPT;
nomem:
    kv_state_read_abort(mem, t);
    return LLMEM_E_NO_MEMORY;
}

llmem_status kv_state_read_apply(llmem_memory *mem, int32_t seq, void *tmp)
{
    kv_cache *kv = kv_of(mem);
    kv_tmp *t = tmp;
    llmem_status st = LLMEM_OK;
    /* host room was taken by kv_state_read_reserve: one sequence keeps its
     * row through the drop, and the fits and reserves below take nothing */
    if (seq < 0)
        mem->iface->clear(mem, false);
    else
        kv_seq_drop(kv, &kv->seqs[seq], true);
    int32_t ps = kv->p.page_size;
    for (int32_t i = 0; i < t->n && st == LLMEM_OK; i++) {
        const kv_entry *e = &t->e[i];
        kv_seq *s = &kv->seqs[seq >= 0 ? seq : e->seq];
        int32_t np = llmem_pages_for(0, e->len, ps);
        if ((np > 0 && !kv_pt_fit(kv, s, np)) || !i32vec_reserve(&s->tokens, e->len) ||
            !seq_pos_reserve(&s->pos, e->len)) {
            st = LLMEM_E_NO_MEMORY;
            break;
        }
        int32_t nsh = e->share_from >= 0 && kv->p.window == 0
                          ? shared_pages(kv, e->len, e->shared_len) : 0;
        const kv_seq *o = nsh > 0 ? &kv->seqs[seq >= 0 ? seq : t->e[e->share_from].seq] : NULL;
        for (int32_t k = 0; k < nsh; k++) { /* the same pages as the earlier entry */
            s->pages.v[s->pages.n++] = o->pages.v[k];
            page_pool_ref(&kv->pool, o->pages.v[k]);
        }
        /* a windowed cache takes no page for tokens outside its window */
        s->dropped = e->dropped;
        s->lost = e->lost > s->dropped * ps ? e->lost : s->dropped * ps;
        for (int32_t k = nsh; k < s->dropped; k++)
            s->pages.v[s->pages.n++] = -1;
        for (int32_t k = nsh > s->dropped ? nsh : s->dropped; k < np; k++)
            s->pages.v[s->pages.n++] = kv_alloc_page(kv);
        kv_pt_note(kv, s, 0, s->pages.n);
        kv_last_sync(s);
        i32_copy(s->tokens.v, e->tokens, e->len);
        (void)seq_pos_assign(&s->pos, e->pos, e->len); /* room reserved above */
        s->tokens.n = e->len;
        for (int32_t j = (nsh > s->dropped ? nsh : s->dropped) * ps; j < e->len; j++) {
            if (e->shift[j] == 0 || j < s->lost)
                continue;
            int32_t slot = kv_slot(kv, s, j);
            kv->shift[slot] = e->shift[j];
            kv->page_shift[slot / ps] = 1;
            kv->shift_pending = true;
        }
        const uint8_t *src = e->data;
        for (int32_t il = 0; il < kv->p.n_layers && st == LLMEM_OK; il++)
            for (int32_t kvi = 0; kvi < 2 && st == LLMEM_OK; kvi++) {
                llmem_buffer *pool = kvi ? kv->v[il] : kv->k[il];
                for (int32_t j = 0; j < e->len && st == LLMEM_OK; j += ps) {
                    int32_t m = e->len - j < ps ? e->len - j : ps;
                    size_t bytes = (size_t)m * kv->row_bytes;
                    size_t page = (size_t)s->pages.v[j / ps] * kv->page_bytes;
                    /* shared pages hold the earlier entry's data; dropped ones left the window */
                    bool mine = j / ps >= nsh && j / ps >= s->dropped;
                    if (mine)
                        st = llmem_buffer_upload(pool, page, src, bytes);
                    src += bytes;
                    if (!llmem_dtype_is_scaled(kv->p.dtype))
                        continue;
                    size_t sb = (size_t)kv->p.n_kv_heads * sizeof(float);
                    if (mine && st == LLMEM_OK)
                        st = llmem_buffer_upload(pool, page + scale_offset(kv), src, sb);
                    src += sb;
                }
            }
    }
    kv_state_read_abort(mem, t);
    return st;
}

/* The page table of sequence s lives in its row: a row of the table's
 * class, inside the row table, pages.v pointing at it; s->last / s->prev
 * equal the table's last two entries; during a plan, the entries a planned
 * sequence's views read are uploaded. */
static bool check_row(const kv_cache *kv, int32_t s, char *err, size_t err_len)
{
    const kv_seq *q = &kv->seqs[s];
    if ((q->pages.n > 0 && q->row < 0) ||
        (q->row >= 0 && (q->row_cap < q->pages.n || q->row + q->row_cap > kv->rows.n ||
                         q->pages.v != kv->rows.v + q->row)) ||
        (q->row < 0 && q->pages.v != NULL)) {
        llmem_errf(err, err_len, "sequence %d: row %d cap %d of %d pages, not its page table", s,
                   q->row, q->row_cap, q->pages.n);
        return false;
    }
    if (q->pages.n > 0 && q->last != q->pages.v[q->pages.n - 1]) {
        llmem_errf(err, err_len, "sequence %d: last page %d but the table ends with %d", s,
                   q->last, q->pages.v[q->pages.n - 1]);
        return false;
    }
    if (q->prev != (q->pages.n > 1 ? q->pages.v[q->pages.n - 2] : -1)) {
        llmem_errf(err, err_len, "sequence %d: previous page %d, the table holds %d entries", s,
                   q->prev, q->pages.n);
        return false;
    }
    const llmem_plan *plan = kv->base.plan;
    if (plan && kv->res && llmem_plan_seq_find(plan, s) && q->pages.n > q->dropped &&
        page_rows_pending_in(&kv->rows, q->row + q->dropped, q->row + q->pages.n)) {
        llmem_errf(err, err_len, "sequence %d: planned but its row is not uploaded", s);
        return false;
    }
    return true;
}

/* s's page magazine (kv_internal.h kv_cache.mag): in bounds, within its
 * row past the table, each entry the row's; its pages counted into ref
 * (each must end up with refcount 1: held by nothing else) and never
 * published. */
static bool check_mag(const kv_cache *kv, int32_t s, int32_t *ref, int64_t *in_mags, char *err,
                      size_t err_len)
{
    const kv_seq *q = &kv->seqs[s];
    int32_t n = q->mag_end - q->mag_at;
    if (n == 0)
        return true;
    if (q->mag_at < 0 || n < 0 || q->mag_end > kv->mag_cap || q->row < 0 ||
        q->pages.n + n > q->row_cap) {
        llmem_errf(err, err_len, "sequence %d: magazine [%d, %d) of %d, %d of %d row entries", s,
                   q->mag_at, q->mag_end, kv->mag_cap, q->pages.n, q->row_cap);
        return false;
    }
    for (int32_t k = 0; k < n; k++) {
        int32_t p = *kv_mag_at(kv, s, q->mag_at + k);
        if (p < 0 || p >= kv->p.n_pages || q->pages.v[q->pages.n + k] != p ||
            kv->pool.published[p]) {
            llmem_errf(err, err_len, "sequence %d: magazine page %d (row entry %d holds %d)", s,
                       p, q->pages.n + k, q->pages.v[q->pages.n + k]);
            return false;
        }
        ref[p]++;
    }
    *in_mags += n;
    return true;
}

/* No two sequences' rows overlap (each row is a distinct page table). */
static bool check_rows_disjoint(const kv_cache *kv, char *err, size_t err_len)
{
    uint8_t *used = calloc((size_t)kv->rows.n + 1, 1);
    if (!used)
        return true; /* cannot check without memory; not a violation */
    bool ok = true;
    for (int32_t s = 0; s < kv->base.n_seq_max && ok; s++) {
        const kv_seq *q = &kv->seqs[s];
        for (int32_t k = 0; q->row >= 0 && k < q->row_cap && ok; k++) {
            if (used[q->row + k]) {
                llmem_errf(err, err_len, "sequence %d: row entry %d also holds another row", s,
                           q->row + k);
                ok = false;
            }
            used[q->row + k] = 1;
        }
    }
    free(used);
    return ok;
}

llmem_status kv_check(llmem_memory *mem, char *err, size_t err_len)
{
    kv_cache *kv = kv_of(mem);
    int32_t *ref = calloc((size_t)kv->p.n_pages, sizeof *ref);
    if (!ref)
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_E_STATE;
    int32_t ps = kv->p.page_size;
    int64_t in_mags = 0;
    if (kv->row_defer.n != 0) { /* rows_write_deferred empties it inside kv_reserve */
        llmem_errf(err, err_len, "%d row entries wait for rows_write_deferred",
                   kv->row_defer.n / 2);
        goto out;
    }
    for (int32_t p = 0; p < kv->p.n_pages && !kv->shift_pending; p++)
        if (kv->page_shift[p]) { /* kv_page_shifted relies on it */
            llmem_errf(err, err_len, "page %d has a pending K-shift, none is pending", p);
            goto out;
        }
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        const kv_seq *q = &kv->seqs[s];
        int32_t want = llmem_pages_for(0, q->tokens.n, ps);
        if (q->tokens.n != q->pos.v.n || (mem->plan == NULL && q->pages.n != want) ||
            q->pages.n < want) {
            llmem_errf(err, err_len, "sequence %d: %d tokens, %d positions, %d pages", s,
                       q->tokens.n, q->pos.v.n, q->pages.n);
            goto out;
        }
        if (q->dropped < 0 || q->dropped > q->pages.n ||
            (kv->p.window == 0 && (q->dropped != 0 || q->lost != 0)) ||
            !swa_cut_ok(kv, q, q->tokens.n) || q->lost < q->dropped * ps ||
            q->lost > q->tokens.n || (q->tokens.n == 0 && q->dropped != 0)) {
            llmem_errf(err, err_len,
                       "sequence %d: %d pages left the window of %d, %d tokens, %d pages", s,
                       q->dropped, kv->p.window, q->tokens.n, q->pages.n);
            goto out;
        }
        for (int32_t k = 0; k < q->dropped; k++)
            if (q->pages.v[k] != -1) {
                llmem_errf(err, err_len, "sequence %d: dropped page entry %d is %d", s, k,
                           q->pages.v[k]);
                goto out;
            }
        for (int32_t k = q->dropped; k < q->pages.n; k++) {
            int32_t p = q->pages.v[k];
            if (p < 0 || p >= kv->p.n_pages) {
                llmem_errf(err, err_len, "sequence %d: page id %d out of range", s, p);
                goto out;
            }
            ref[p]++;
        }
        if (!seq_pos_ok(&q->pos)) {
            llmem_errf(err, err_len, "sequence %d: positions (min/max %d/%d, %s) inconsistent", s,
                       q->pos.pm.min, q->pos.pm.max, q->pos.stored ? "stored" : "a run");
            goto out;
        }
        if (!check_row(kv, s, err, err_len) || !check_mag(kv, s, ref, &in_mags, err, err_len))
            goto out;
    }
    if (in_mags != kv->mag_total) {
        llmem_errf(err, err_len, "magazines hold %lld pages, counted %lld", (long long)in_mags,
                   (long long)kv->mag_total);
        goto out;
    }
    if (!check_rows_disjoint(kv, err, err_len) ||
        !page_rows_check_device_upto(&kv->rows, kv->idx, kv->idx_rows, err, err_len))
        goto out;
    for (int32_t c = 0; kv->res && c < kv->res->n_cow; c++)
        if (kv->res->cow[c].page >= 0)
            ref[kv->res->cow[c].page]++; /* copy-on-write source held by the plan */
    if (!host_tier_check(kv->host, err, err_len))
        goto out;
    int32_t host_pins = 0;
    host_tier_usage(kv->host, kv, NULL, NULL, &host_pins);
    if (host_pins > 0) { /* pins live only inside kv_reserve */
        llmem_errf(err, err_len, "host tier: %d of the KV cache's entries pinned", host_pins);
        goto out;
    }
    if (!page_pool_check(&kv->pool, ref, err, err_len) ||
        !prefix_budget_check(kv->budget, mem, err, err_len))
        goto out;
    /* every published page must still hold what its hash says */
    for (int32_t s = 0; s < mem->n_seq_max; s++) {
        const kv_seq *q = &kv->seqs[s];
        const tok_stage *g = &kv->stage[s];
        if (!tok_stage_ok(g, &q->tokens)) {
            llmem_errf(err, err_len, "sequence %d: %d staged tokens of %d", s, g->n, q->tokens.n);
            goto out;
        }
        for (int32_t k = q->dropped; (k + 1) * ps <= q->tokens.n; k++) {
            int32_t p = q->pages.v[k];
            for (int32_t j = 0; kv->pool.hashed[p] && j < ps; j++)
                if (kv->pool.tokens[(size_t)p * (size_t)ps + (size_t)j] !=
                    tok_stage_at(g, &q->tokens, k * ps + j)) {
                    llmem_errf(err, err_len, "sequence %d page %d: hashed tokens differ", s, k);
                    goto out;
                }
        }
    }
    st = LLMEM_OK;
out:
    free(ref);
    return st;
}

bool kv_state_read_seq(llmem_memory *mem, void *tmp, int32_t seq, int32_t *len,
                       const void **tokens, const void **pos)
{
    const kv_tmp *t = tmp;
    for (int32_t i = 0; i < t->n; i++)
        if (t->e[i].seq == seq || (seq < 0 && i == 0)) {
            *len = t->e[i].len;
            *tokens = t->e[i].tokens;
            *pos = t->e[i].pos;
            return true;
        }
    return false;
}

/* llmem memory/: internal structure of the paged KV cache, shared by
 * kv_cache.c (pages, prefix cache, sequences), kv_plan.c (planning) and
 * kv_state.c (state I/O, checks). */
#ifndef LLMEM_KV_INTERNAL_H
#define LLMEM_KV_INTERNAL_H

#include <string.h>

#include "llmem/kv_cache.h"
#include "memory/host_tier.h"
#include "memory/internal.h"
#include "memory/page_pool.h"
#include "memory/page_rows.h"
#include "memory/seq_heap.h"
#include "memory/seq_pos.h"
#include "memory/tok_stage.h"

/* A sequence's page table. It lives in the sequence's row of kv->rows
 * (page_rows.h), the host copy of the device page table, so the table and
 * the row are one array (a decode step stores its new page once, one cache
 * line, not one in the table and one in the row): v == rows.v + row while
 * row >= 0 (kv_pt_fit; kv_pt_repoint after the row table moves), NULL
 * otherwise. Every write goes through kv_pt_set or page_rows_note so that
 * the device copy follows at the next plan's upload. */
typedef struct kv_pt {
    int32_t *v;
    int32_t n; /* entries past ceil(len / page_size) are plan reservations */
} kv_pt;

typedef struct kv_seq {
    kv_pt pages;   /* page table (in its row) */
    i32vec tokens; /* committed token ids (-1 for embeddings) */
    seq_pos pos;   /* committed positions (a run while they are one) */
    /* The page table's persistent row (page_rows.h) and its capacity
     * (entries), -1 / 0 while the sequence holds no row. */
    int32_t row, row_cap;
    /* Sliding window (memory/swa.c): page table entries [0, dropped) left
     * the window and read -1 (views start at row + dropped). 0 in a full
     * cache. */
    int32_t dropped;
    /* Leading tokens whose K/V the sequence no longer holds (>= dropped *
     * page_size; more after a state read whose rows left the writer's
     * window inside a page this cache keeps). 0 in a full cache. */
    int32_t lost;
    /* pages.v[pages.n - 1] when pages.n > 0 (kv_last_sync after every
     * change to the table): a decode step's counting pass reads the page
     * it appends to from here, not from the table's tail, a cache miss per
     * sequence at thousands of sequences. */
    int32_t last;
    /* pages.v[pages.n - 2] when pages.n > 1, else -1 (kv_last_sync): the
     * page a commit in pages of 1 chains the hash of the page it
     * publishes to, read from here for the same reason */
    int32_t prev;
    /* The sequence's page magazine (kv_cache.mag): entries [at, end) of its
     * kv_mag_at, pages taken from the pool (refcount 1) whose ids are already
     * in the row at entries [pages.n, pages.n + end - at), in order. Empty
     * (at == end) unless the cache keeps magazines. */
    int16_t mag_at, mag_end;
} kv_seq;

/* Element offsets of one ubatch's tables in the plan's index. */
typedef struct kv_ub {
    int32_t store_tok, store_slot, n_store;
    int32_t page_off, max_pages, seq_len, n_seqs;
    int32_t tok_kv_len, tok_seq, n_tokens;
    int32_t shift_slot, shift_delta, n_shift;
} kv_ub;

/* A copy-on-write reserved by a plan and done when ubatch 0 is applied.
 * Reserve points page table entry `index` of `seq` at a new page at once
 * (the views and index tables show it) and keeps the old page, still
 * referenced, in `page`; apply copies it into the new one (`copied`) and
 * the plan keeps holding the old page until release. Release (kv_plan.c
 * finish_cows) drops the old page when a commit appended to the sequence
 * (its length is no longer `len0`, the committed length at reserve), and
 * otherwise puts the old page back and frees the copy, so that a plan
 * released or failed without a commit to the sequence changes nothing:
 * not the page table, the sharing nor the pages used. */
typedef struct kv_cow {
    int32_t seq, index, page, len0;
    bool copied;
} kv_cow;

typedef struct kv_res {
    kv_ub *ub;
    int32_t n_ub;
    int32_t cur; /* applied ubatch, -1 none */
    kv_cow *cow;
    int32_t n_cow;
    bool cow_done;
} kv_res;

typedef struct kv_cache {
    llmem_memory base;
    llmem_kv_cache_params p;
    page_pool pool;
    host_tier *host;       /* evicted published pages in host memory (NULL: off);
                            * shared with the other children of a hybrid */
    int64_t host_restores; /* pages copied back from the host tier */
    /* the device byte budget of cached pages (NULL: none), shared with the
     * other children of a hybrid (prefix_budget.h) */
    struct prefix_budget *budget;
    kv_seq *seqs;          /* [n_seq_max] */
    /* [n_seq_max], 64-byte aligned: each sequence's staged token appends
     * (memory/tok_stage.h; kv_tokens_sync before reading token values) */
    tok_stage *stage;
    bool stage_spread; /* LLMEM_TOK_STAGE_SPREAD (tok_stage.h) */
    bool publish_prefetch; /* LLMEM_KV_PUBLISH_PREFETCH (kv_prefetch_publish) */
    seq_heap *heap;        /* the sequences' pages, tokens and pos arrays */
    llmem_buffer **k, **v; /* [n_layers] pools */
    llmem_kv_view *views;  /* [n_layers] what kv_view last described of each layer */
    size_t row_bytes;      /* one slot of one layer's K (or V) */
    size_t page_bytes;     /* one page of one layer's K (or V) */
    int32_t *shift;        /* [n_pages * page_size] pending K-shift per slot */
    uint8_t *page_shift;   /* [n_pages] page has a pending shift (all 0 while
                            * !shift_pending: kv_page_shifted) */
    bool shift_pending;
    /* Device index buffer: the page rows at element 0, then the plan's
     * tables from element idx_rows (idx_rows >= rows.n). On a host-visible
     * backend the rows are its memory (page_rows_share, kv_rows_grow):
     * rows.v points into it and rows.cap == idx_rows. */
    llmem_buffer *idx;
    int32_t idx_rows;
    page_rows rows;
    idx_builder ib;
    kv_res *res; /* reservation of the plan in flight, or NULL */
    /* A plan's page counts, [n_seq_max] each (kv_plan.c pages_needed):
     * reserve_prepare computes them and reserve reuses them for the same
     * plan when it pins no prefix pages (a decode step), instead of a
     * second pass over every sequence's page-table tail. */
    int32_t *need, *len0;
    uint8_t *cow;
    /* page pages_needed read at entry tail_at[s] of the page table (the
     * partly written page a step appends to), -1 none: the index tables
     * take it from here instead of a second miss on the table's tail */
    int32_t *tail, *tail_at;
    /* pages kv_commit hashed whose prefix-index insertion is deferred to
     * the end of its token loop (publish_pages with defer), so the
     * scattered bucket heads can be prefetched a few pages ahead */
    i32vec pub_pending;
    /* (row entry, page) pairs of the one new page each sequence of a
     * decode step takes, written into the rows at kv_reserve's upload in
     * a pass of their own (page_rows_write_upload; kv_plan.c
     * rows_write_deferred); room for 2 * n_seq_max; empty outside
     * kv_reserve (llmem_memory_check). */
    i32vec row_defer;
    const llmem_plan *prep_plan; /* plan the counts are for, or NULL */
    int64_t prep_total;
    int32_t prep_cows;
    /* planned sequences whose row must grow (reserve_prepare's count):
     * none, the usual decode step, and reserve skips its pass over every
     * sequence's row capacity */
    int32_t prep_grow;
    /* log2(page_size) when the page size is a power of two, else -1: the
     * divisions by the page size a decode step makes per sequence (about a
     * dozen, several of them 64-bit, in pages_needed, the index tables,
     * commit and release) become shifts and masks (kv_ps_div, kv_ps_mod,
     * kv_pages_for) */
    int32_t ps_shift;
    int64_t prefix_hits, cow_copies;
    /* Page magazines (pages of fewer than 16 tokens; kv_mag_fill_plan):
     * entries kv_mag_at(kv, s, k), k < mag_cap, hold the ids of pages
     * sequence s took from the pool ahead of its decode steps and already wrote
     * into its row, so that a decode step in pages of 1 writes its row
     * once every 16 steps, not every step (each row write there is one
     * 4 KiB page of the table per sequence: past ~2,000 sequences a TLB
     * miss each). mag_cap 0: none. mag_total pages sit in magazines; they
     * count as free (kv_available, stats) and go back to the pool before
     * any cached page is evicted (kv_alloc_page) and whenever the table
     * around them changes (kv_mag_drain). Fills leave mag_floor pages
     * free. */
    int32_t *mag; /* [mag_cap][n_seq_max]: one step's pops of sequences in step read one run */
    int32_t *mag_fill; /* [n_seq_max] scratch of kv_mag_fill_plan */
    int32_t mag_cap, mag_floor;
    int64_t mag_total;
} kv_cache;

extern const llmem_memory_i kv_cache_iface;

static inline kv_cache *kv_of(llmem_memory *mem)
{
    return LLMEM_MEMORY_CAST(kv_cache, mem, &kv_cache_iface);
}

/* x / page_size and x % page_size for x >= 0 (token counts and indices). */
static inline int32_t kv_ps_div(const kv_cache *kv, int32_t x)
{
    return kv->ps_shift >= 0 ? x >> kv->ps_shift : x / kv->p.page_size;
}

static inline int32_t kv_ps_mod(const kv_cache *kv, int32_t x)
{
    return kv->ps_shift >= 0 ? x & (kv->p.page_size - 1) : x % kv->p.page_size;
}

/* llmem_pages_for(len, n, page_size) (view.h), with a shift for a page
 * size that is a power of two. */
static inline int32_t kv_pages_for(const kv_cache *kv, int32_t len, int32_t n)
{
    if (len < 0 || n <= 0)
        return 0;
    if (kv->ps_shift < 0)
        return llmem_pages_for(len, n, kv->p.page_size);
    int64_t r = kv->p.page_size - 1, have = ((int64_t)len + r) >> kv->ps_shift;
    return (int32_t)((((int64_t)len + n + r) >> kv->ps_shift) - have);
}

static inline int32_t kv_slot(const kv_cache *kv, const kv_seq *s, int32_t i)
{
    return s->pages.v[kv_ps_div(kv, i)] * kv->p.page_size + kv_ps_mod(kv, i);
}

/* Refreshes s->last and s->prev from the page table. */
static inline void kv_last_sync(kv_seq *s)
{
    s->last = s->pages.n > 0 ? s->pages.v[s->pages.n - 1] : -1;
    s->prev = s->pages.n > 1 ? s->pages.v[s->pages.n - 2] : -1;
}

static inline tok_stage *kv_stage_of(kv_cache *kv, const kv_seq *s)
{
    return &kv->stage[s - kv->seqs];
}

/* Writes s's staged token appends into its token array (tok_stage.h). */
static inline void kv_tokens_sync(kv_cache *kv, const kv_seq *s)
{
    tok_stage_sync(kv_stage_of(kv, s), &s->tokens);
}

/* Entry k of the page table, from s->last / s->prev for the last two
 * (no read of the table's tail). */
static inline int32_t kv_page_at(const kv_seq *s, int32_t k)
{
    return k == s->pages.n - 1 ? s->last : k == s->pages.n - 2 ? s->prev : s->pages.v[k];
}

/* Entry k of s's page table becomes p (recorded for the next upload). */
static inline void kv_pt_set(kv_cache *kv, kv_seq *s, int32_t k, int32_t p)
{
    page_rows_write1(&kv->rows, s->row + k, p);
}

/* Entries [k, k + n) of s's page table, written in place, are recorded for
 * the next upload. */
static inline void kv_pt_note(kv_cache *kv, const kv_seq *s, int32_t k, int32_t n)
{
    if (n > 0)
        page_rows_note(&kv->rows, s->row + k, n);
}

/* Whether page p has a pending K-shift. Without a pending shift no page
 * has one (llmem_memory_check verifies it), so the common case reads no
 * per-page byte: a decode step in pages of 1 asks for every page it
 * takes and publishes. */
static inline bool kv_page_shifted(const kv_cache *kv, int32_t p)
{
    return kv->shift_pending && kv->page_shift[p];
}

/* kv_table.c: at creation, puts the rows into the index buffer itself
 * (page_rows_share, kv_rows_grow) when the backend's buffers are host
 * memory: the views then read the entries a step writes, with no host copy
 * and no upload (one scattered line per sequence and step fewer in pages
 * of 1). */
void kv_rows_setup(kv_cache *kv);
/* kv_table.c: gives s's page table room for n entries (its row grows:
 * entries kept, every table re-pointed if the row table moved). Returns
 * false on host allocation failure, with nothing changed. */
bool kv_pt_fit(kv_cache *kv, kv_seq *s, int32_t n);
/* kv_table.c: points every sequence's page table at its row (after rows.v
 * moved). */
void kv_pt_repoint(kv_cache *kv);
/* kv_cache.c */
int32_t kv_alloc_page(kv_cache *kv);
/* kv_alloc_page, with its common case inline: a free page with no pending
 * K-shift, no poison (reserve takes a page per sequence per decode step in
 * pages of 1). */
static inline int32_t kv_alloc_page_fast(kv_cache *kv)
{
    page_pool *pp = &kv->pool;
    if (pp->n_free > 0 && !kv->p.poison && !kv_page_shifted(kv, pp->free_stack[pp->n_free - 1]))
        return page_pool_take_free(pp);
    return kv_alloc_page(kv);
}
void kv_unref_page(kv_cache *kv, int32_t p);
/* Pages obtainable now: free, evictable, or in a magazine. */
static inline int64_t kv_available(const kv_cache *kv)
{
    return (int64_t)page_pool_available(&kv->pool) + kv->mag_total;
}
/* kv_cache.c: gives s's magazine back to the pool (its row entries past
 * pages.n stay, unspecified as before); nothing when it is empty. */
void kv_mag_drain(kv_cache *kv, kv_seq *s);
/* kv_cache.c: how many pages each of n_seqs sequences decoding one token
 * may take into its magazine this step (0: none), leaving mag_floor pages
 * free. */
int32_t kv_mag_quota(const kv_cache *kv, int32_t n_seqs);
/* Entry k of sequence s's magazine. */
static inline int32_t *kv_mag_at(const kv_cache *kv, int32_t s, int32_t k)
{
    return kv->mag + (size_t)k * (size_t)kv->base.n_seq_max + (size_t)s;
}
/* kv_cache.c: fills the empty magazines of the plan's sequences that
 * decode one token into a new page (each up to quota pages, as many as
 * its row holds past its table; quota from kv_mag_quota), before
 * kv_reserve's attach pass pops this step's page from them. */
void kv_mag_fill_plan(kv_cache *kv, const llmem_plan *plan, int32_t quota);
/* The next page of s's non-empty magazine: its id is already in the row
 * at entry pages.n, which the caller then counts (pages.n++). */
static inline int32_t kv_mag_pop(kv_cache *kv, kv_seq *s)
{
    int32_t p = *kv_mag_at(kv, (int32_t)(s - kv->seqs), s->mag_at++);
    kv->mag_total--;
    page_pool_note_peak(&kv->pool, kv->mag_total);
    return p;
}
/* kv_table.c: drops the page table entries of s from keep on (unreferencing
 * their pages; no entry is written: entries past pages.n are never read,
 * on the host or the device); with free_row, an emptied sequence gives its
 * row back. kv_drop_pages_from frees the row. */
void kv_drop_pages(kv_cache *kv, kv_seq *s, int32_t keep, bool free_row);
void kv_drop_pages_from(kv_cache *kv, kv_seq *s, int32_t keep);
/* kv_table.c: drops every page, token and position of s; the row goes back
 * unless keep_row (a state read refills it in place, with no allocation). */
void kv_seq_drop(kv_cache *kv, kv_seq *s, bool keep_row);
/* Whether page p can be written in place: held by one page table only and
 * not published (inline: the counting pass asks it for every sequence
 * whose last page is partly written, 15 decode steps in 16 in pages of
 * 16). */
static inline bool page_writable(const kv_cache *kv, int32_t p)
{
    return kv->pool.ref[p] == 1 && !kv->pool.published[p];
}
/* Pages that hold len tokens (inline: release calls it for every
 * sequence after every step). */
static inline int32_t n_pages_for_len(const kv_cache *kv, int32_t len)
{
    return kv_pages_for(kv, 0, len);
}
llmem_status copy_page(kv_cache *kv, int32_t p, int32_t old);
int32_t kv_prefix_pages(kv_cache *kv, const int32_t *tokens, int32_t n, int32_t *out);
/* Hashes and publishes the full pages of s in [from_page, len / page_size).
 * With defer, the hashed pages join kv->pub_pending and enter the index at
 * publish_flush (falls back to publishing at once when the list cannot
 * grow); the caller flushes before anything can unreference them. Inline:
 * a decode step in pages of 1 calls it for every token. */
static inline void publish_pages(kv_cache *kv, kv_seq *s, int32_t from_page, bool defer)
{
    if (kv->p.no_prefix_cache)
        return;
    int32_t ps = kv->p.page_size;
    page_pool *pp = &kv->pool;
    for (int32_t k = from_page; (int64_t)(k + 1) * ps <= s->tokens.n; k++) {
        int32_t p = kv_page_at(s, k);
        if (p < 0)
            continue; /* left the sliding window */
        if (pp->hashed[p])
            continue;
        int32_t prev = k > 0 ? kv_page_at(s, k - 1) : -1;
        if (k > 0 && (prev < 0 || !pp->hashed[prev]))
            return; /* the chain is broken (or left the window) below this page */
        /* the page's ids: in the stage when it holds them all (a decode
         * step in pages of 1), else in the array */
        tok_stage *g = kv_stage_of(kv, s);
        int32_t staged = s->tokens.n - g->n;
        const int32_t *tok;
        if (k * ps >= staged) {
            tok = g->tok + (k * ps - staged);
        } else {
            if ((k + 1) * ps > staged)
                tok_stage_sync(g, &s->tokens);
            tok = s->tokens.v + (size_t)k * (size_t)ps;
        }
        for (int32_t j = 0; j < ps; j++)
            if (seq_pos_at(&s->pos, k * ps + j) != k * ps + j || tok[j] < 0 || kv_page_shifted(kv, p))
                return; /* shifted positions or embeddings: not reusable */
        pp->parent_hash[p] = prev >= 0 ? pp->hash[prev] : PAGE_HASH_SEED;
        pp->hash[p] = page_hash(pp->parent_hash[p], tok, ps);
        if (ps == 1) /* a decode step in pages of 1 publishes a page per token */
            pp->tokens[p] = tok[0];
        else
            memcpy(pp->tokens + (size_t)p * (size_t)ps, tok, (size_t)ps * sizeof *tok);
        pp->hashed[p] = 1;
        i32vec *q = &kv->pub_pending;
        if (defer && q->cap >= 0 && q->n < q->cap)
            q->v[q->n++] = p;
        else if (!defer || !i32vec_push(q, p))
            page_pool_publish(pp, p);
    }
}

/* Inserts the pages publish_pages deferred into the prefix index, in the
 * order they were hashed (so lookups still find the newest copy first). */
void publish_flush(kv_cache *kv);
/* Device bytes one page holds over every layer (K and V): what a cached
 * page costs in a prefix budget. */
static inline int64_t kv_entry_bytes(const kv_cache *kv)
{
    return 2 * (int64_t)kv->p.n_layers * (int64_t)kv->page_bytes;
}
void clear_page_shift(kv_cache *kv, int32_t p);
/* kv_host.c: copies evicted page p (still published) into the host tier
 * unless it holds it already (queued downloads). */
void kv_host_spill(kv_cache *kv, int32_t p);
llmem_status kv_host_restore(kv_cache *kv, int32_t *pages, int32_t n);
void kv_host_unpin(kv_cache *kv, const int32_t *pages, int32_t n);
/* Prefix page entries below -1 name host-tier entries: -2 - entry. */
#define KV_HOST_MARK(e) (-2 - (e))

/* swa.c: the sliding window of a windowed KV cache (params.window > 0) */
/* First token index a sequence of len tokens must keep: the next token
 * (index len) reads from len + 1 - window; window_slack more for rollback. */
int32_t swa_keep_from(const kv_cache *kv, int32_t len);
/* Drops the pages of s wholly before swa_keep_from(its length). */
void swa_slide(kv_cache *kv, kv_seq *s);
/* Whether the first k tokens of s still hold every key the token after
 * them reads, and the page it writes into when that page holds earlier
 * tokens (k == 0, or nothing lost at or after index k + 1 - window). */
bool swa_cut_ok(const kv_cache *kv, const kv_seq *s, int32_t k);
/* The shift value a serialized KV state gives a row it does not hold (it
 * left a sliding window): such rows are a prefix of the entry. */
#define KV_ROW_LOST INT32_MIN
/* Tokens the views of s skip: its dropped pages. */
static inline int32_t swa_skip(const kv_cache *kv, const kv_seq *s)
{
    return s->dropped * kv->p.page_size;
}

/* kv_plan.c */
/* page_rows.share_grow of a KV cache whose rows live in its host-visible
 * index buffer (ctx: the kv_cache): a new buffer with room for cap rows. */
bool kv_rows_grow(void *ctx, page_rows *r, int64_t cap);
llmem_status kv_reserve_prepare(llmem_memory *mem, const llmem_plan *plan, char *err,
                                size_t err_len);
llmem_status kv_reserve(llmem_memory *mem, const llmem_plan *plan, void **out, char *err,
                        size_t err_len);
llmem_status kv_apply(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i);
llmem_status kv_view(llmem_memory *mem, void *r, int32_t il, llmem_view *view);
llmem_status kv_commit(llmem_memory *mem, const llmem_plan *plan, void *r, int32_t i);
void kv_release(llmem_memory *mem, const llmem_plan *plan, void *r);

/* kv_state.c */
llmem_status kv_state_write(llmem_memory *mem, int32_t seq, llmem_state_writer *w);
llmem_status kv_state_read_prepare(llmem_memory *mem, int32_t seq, llmem_state_reader *r,
                                   void **tmp, char *err, size_t err_len);
llmem_status kv_state_read_apply(llmem_memory *mem, int32_t seq, void *tmp);
void kv_state_read_abort(llmem_memory *mem, void *tmp);
bool kv_state_read_seq(llmem_memory *mem, void *tmp, int32_t seq, int32_t *len,
                       const void **tokens, const void **pos);
llmem_status kv_check(llmem_memory *mem, char *err, size_t err_len);

#endif

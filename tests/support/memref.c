/* The memory reference: what each sequence holds, the KV pages (sharing,
 * copy-on-write, prefix cache with LRU eviction), the recurrent states
 * (checkpoints), predicted from the contract with brute-force lists.
 * Views, data tags and comparisons are in memref_data.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memref_impl.h"

/* --- small containers ------------------------------------------------------------ */

bool mr_ilist_push(mr_ilist *l, int32_t x)
{
    if (l->n == l->cap) {
        int32_t nc = l->cap ? 2 * l->cap : 16;
        int32_t *nv = realloc(l->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return false;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
    return true;
}

bool mr_seqv_push(mr_seqv *s, mr_tok t)
{
    if (s->n == s->cap) {
        int32_t nc = s->cap ? 2 * s->cap : 32;
        mr_tok *nv = realloc(s->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return false;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = t;
    return true;
}

uint64_t memref_mix(uint64_t h, int32_t token)
{
    uint64_t z = h ^ ((uint64_t)(uint32_t)token * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t last_h(const mr_seqv *s)
{
    return s->n ? s->v[s->n - 1].h : MR_H0;
}

/* --- KV pages ------------------------------------------------------------------------ */

int32_t mr_kv_used(const mr_kv *kv)
{
    int32_t n = 0;
    for (int32_t a = 0; a < kv->n_pg; a++)
        n += kv->pg[a].live && kv->pg[a].ref > 0;
    return n;
}

int32_t mr_kv_cached(const mr_kv *kv)
{
    int32_t n = 0;
    for (int32_t a = 0; a < kv->n_pg; a++)
        n += kv->pg[a].live && kv->pg[a].ref == 0 && kv->pg[a].pub;
    return n;
}

int32_t mr_phys(const mr_kv *kv, int32_t seq, int32_t idx)
{
    return kv->pg[kv->tab[seq].v[idx]].phys;
}

static int32_t kv_new(mr_kv *kv)
{
    int32_t a = 0;
    while (a < kv->n_pg && kv->pg[a].live)
        a++;
    if (a == kv->n_pg) {
        if (kv->n_pg == kv->cap_pg) {
            int32_t nc = kv->cap_pg ? 2 * kv->cap_pg : 64;
            mr_page *np = realloc(kv->pg, (size_t)nc * sizeof *np);
            if (!np)
                abort();
            memset(np + kv->cap_pg, 0, (size_t)(nc - kv->cap_pg) * sizeof *np);
            kv->pg = np;
            kv->cap_pg = nc;
        }
        kv->n_pg++;
    }
    mr_page *p = &kv->pg[a];
    mr_ilist keep = p->prefix;
    memset(p, 0, sizeof *p);
    p->prefix = keep;
    p->prefix.n = 0;
    p->live = true;
    p->ref = 1;
    p->phys = -1;
    p->parent = -1;
    return a;
}

static void kv_die(mr_kv *kv, int32_t a)
{
    kv->pg[a].live = false;
    kv->pg[a].pub = false;
    kv->pg[a].hashed = false;
}

/* A new page: a free one, else the least recently cached one is evicted.
 * -1 when neither exists (the caller checked the space before). */
static int32_t kv_alloc(mr_kv *kv)
{
    if (kv->n_pages - mr_kv_used(kv) - mr_kv_cached(kv) <= 0) {
        int32_t best = -1;
        for (int32_t a = 0; a < kv->n_pg; a++) {
            const mr_page *p = &kv->pg[a];
            if (p->live && p->ref == 0 && p->pub && (best < 0 || p->lru < kv->pg[best].lru))
                best = a;
        }
        if (best < 0)
            return -1;
        kv_die(kv, best);
        kv->evictions++;
    }
    return kv_new(kv);
}

static void kv_ref(mr_kv *kv, int32_t a)
{
    kv->pg[a].ref++;
}

static void kv_unref(mr_kv *kv, int32_t a)
{
    mr_page *p = &kv->pg[a];
    if (--p->ref > 0)
        return;
    if (p->pub)
        p->lru = ++kv->clock;
    else
        kv_die(kv, a);
}

/* Drops page table entries [keep, n) of seq, last first. */
static void kv_drop_from(mr_kv *kv, int32_t seq, int32_t keep)
{
    mr_ilist *t = &kv->tab[seq];
    for (int32_t i = t->n - 1; i >= keep; i--)
        kv_unref(kv, t->v[i]);
    if (t->n > keep)
        t->n = keep;
}

static bool kv_writable(const mr_kv *kv, int32_t a)
{
    return kv->pg[a].ref == 1 && !kv->pg[a].pub;
}

static int32_t div_up(int32_t a, int32_t b)
{
    return (int32_t)(((int64_t)a + b - 1) / b);
}

/* Published pages matching tokens[0, n) page by page from the first,
 * keyed by (physical parent, whole token prefix). */
static int32_t kv_match(const mr_kv *kv, const int32_t *tokens, int32_t n, int32_t *out)
{
    int32_t ps = kv->ps, k = 0, parent = -1;
    for (; (int64_t)(k + 1) * ps <= n; k++) {
        int32_t found = -1, len = (k + 1) * ps;
        for (int32_t a = 0; a < kv->n_pg && found < 0; a++) {
            const mr_page *p = &kv->pg[a];
            if (p->live && p->pub && p->parent == parent && p->prefix.n == len &&
                memcmp(p->prefix.v, tokens, (size_t)len * sizeof *tokens) == 0)
                found = a;
        }
        if (found < 0)
            break;
        if (out)
            out[k] = found;
        parent = kv->pg[found].phys;
    }
    return k;
}

/* Page k of seq just became full at commit: publish it when the contract
 * says so (canonical positions, known tokens, no pending K-shift, the
 * previous page part of a chain, no equal page published already). */
static void kv_publish(mr_kv *kv, const mr_seqv *s, int32_t seq, int32_t k)
{
    int32_t ps = kv->ps;
    const mr_ilist *t = &kv->tab[seq];
    mr_page *p = &kv->pg[t->v[k]];
    if (!kv->prefix || p->hashed || p->shift)
        return;
    if (k > 0 && !kv->pg[t->v[k - 1]].hashed)
        return;
    for (int32_t j = k * ps; j < (k + 1) * ps; j++)
        if (s->v[j].pos != j || s->v[j].token < 0)
            return;
    p->hashed = true;
    p->parent = k > 0 ? kv->pg[t->v[k - 1]].phys : -1;
    p->prefix.n = 0;
    for (int32_t j = 0; j < (k + 1) * ps; j++)
        mr_ilist_push(&p->prefix, s->v[j].token);
    int32_t self = t->v[k];
    for (int32_t a = 0; a < kv->n_pg; a++) {
        const mr_page *q = &kv->pg[a];
        if (a != self && q->live && q->pub && q->parent == p->parent &&
            q->prefix.n == p->prefix.n &&
            memcmp(q->prefix.v, p->prefix.v, (size_t)p->prefix.n * sizeof(int32_t)) == 0)
            return; /* an equal page is published: this one stays private */
    }
    p->pub = true;
}

/* --- recurrent states ------------------------------------------------------------------- */

static int32_t rs_find(const mr_rs *rs, int32_t seq, int32_t len)
{
    for (int32_t i = 0; i < rs->nh[seq]; i++)
        if (rs->h[seq][i].len == len)
            return i;
    return -1;
}

int32_t mr_rs_after(const mr_rs *rs, int32_t seq, const mr_hold *add, int32_t n_add, mr_hold *out)
{
    mr_hold all[2 * MR_MAX_HOLD];
    int32_t n = 0;
    for (int32_t i = 0; i < rs->nh[seq]; i++)
        all[n++] = rs->h[seq][i];
    for (int32_t i = 0; i < n_add; i++)
        all[n++] = add[i];
    /* newest first, keep 1 + n_ckpt */
    for (int32_t i = 1; i < n; i++)
        for (int32_t j = i; j > 0 && all[j].len > all[j - 1].len; j--) {
            mr_hold t = all[j];
            all[j] = all[j - 1];
            all[j - 1] = t;
        }
    if (n > 1 + rs->n_ckpt)
        n = 1 + rs->n_ckpt;
    memcpy(out, all, (size_t)n * sizeof *out);
    return n;
}

/* --- creation ---------------------------------------------------------------------------- */

static const llmem_state_desc rs_desc[2] = {
    {.name = "conv", .n_dims = 2, .shape = {2, 4}, .dtype = LLMEM_DTYPE_F32},
    {.name = "ssm", .n_dims = 1, .shape = {4}, .dtype = LLMEM_DTYPE_F32},
};

static llmem_memory *make_child(llmem_backend *be, const mr_child_config *c, int32_t n_seq,
                                char *err, size_t err_len)
{
    llmem_memory *m = NULL;
    if (c->kv) {
        llmem_kv_cache_params p = llmem_kv_cache_default_params();
        p.n_layers = c->n_layers;
        p.n_kv_heads = 1;
        p.head_dim = 4;
        p.dtype = LLMEM_DTYPE_F32;
        p.page_size = c->page_size;
        p.n_pages = c->n_pages;
        p.n_seq_max = n_seq;
        p.no_prefix_cache = !c->prefix;
        p.poison = c->poison;
        llmem_kv_cache_create(be, &p, &m, err, err_len);
    } else {
        const llmem_state_desc *states[MR_MAX_LAYERS];
        int32_t n_states[MR_MAX_LAYERS];
        for (int32_t il = 0; il < c->n_layers; il++) {
            states[il] = rs_desc;
            n_states[il] = 2;
        }
        llmem_recurrent_params p = {.n_layers = c->n_layers, .n_states = n_states,
                                    .states = states, .n_seq_max = n_seq, .n_ckpt = c->n_ckpt,
                                    .poison = c->poison};
        llmem_recurrent_create(be, &p, &m, err, err_len);
    }
    return m;
}

/* Learns the pool buffers through one throw-away plan (applied, never
 * committed: nothing changes). */
static bool learn_buffers(memref *r, char *err, size_t err_len)
{
    int32_t tok = 1, pos = 0, seq = 0;
    const int32_t *ids = &seq;
    llmem_batch b = {.n_tokens = 1, .token = &tok, .pos = &pos, .seq_id = &ids};
    llmem_plan *plan = NULL;
    if (llmem_memory_plan(r->mem, &b, LLMEM_SPLIT_AUTO, 1, &plan, err, err_len) != LLMEM_OK)
        return false;
    bool ok = llmem_memory_apply(r->mem, plan, 0, NULL) == LLMEM_OK;
    for (int32_t il = 0; ok && il < r->cfg.n_layers; il++) {
        llmem_view v;
        mr_child *c = &r->ch[r->layer_child[il]];
        int32_t li = r->layer_local[il];
        ok = llmem_memory_view(r->mem, il, &v) == LLMEM_OK;
        if (ok && c->cfg.kv) {
            c->kv.k[li] = v.u.kv.k;
            c->kv.v[li] = v.u.kv.v;
            c->kv.row_bytes = (size_t)v.u.kv.n_kv_heads * (size_t)v.u.kv.head_dim *
                              llmem_dtype_size(v.u.kv.dtype);
        } else if (ok) {
            ok = v.kind == LLMEM_VIEW_RECURRENT && v.u.rs.n_states == 2;
            for (int32_t j = 0; ok && j < 2; j++) {
                c->rs.buf[li][j] = v.u.rs.state[j];
                c->rs.bytes[j] = llmem_buffer_size(v.u.rs.state[j]) / (size_t)c->rs.n_slots;
            }
        }
    }
    llmem_memory_release(r->mem, plan);
    if (!ok)
        snprintf(err, err_len, "memref: cannot read the views of a fresh memory");
    return ok;
}

memref *memref_create(llmem_backend *be, const mr_config *cfg, llmem_memory **mem, char *err,
                      size_t err_len)
{
    *mem = NULL;
    if (cfg->n_children < 1 || cfg->n_children > MR_MAX_CHILD || cfg->n_seq_max > MR_MAX_SEQ)
        return NULL;
    memref *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->cfg = *cfg;
    r->n_seq = cfg->n_seq_max;
    r->n_ch = cfg->n_children;
    llmem_memory *kids[MR_MAX_CHILD] = {0};
    for (int32_t c = 0; c < r->n_ch; c++) {
        r->ch[c].cfg = cfg->child[c];
        kids[c] = make_child(be, &cfg->child[c], cfg->n_seq_max, err, err_len);
        if (!kids[c]) {
            for (int32_t k = 0; k < c; k++)
                llmem_memory_destroy(kids[k]);
            free(r);
            return NULL;
        }
    }
    bool hybrid = cfg->hybrid || r->n_ch > 1;
    if (hybrid) {
        if (llmem_hybrid_create(kids, r->n_ch, cfg->layer_child, cfg->n_layers, &r->mem, err,
                                err_len) != LLMEM_OK) {
            free(r);
            return NULL;
        }
    } else {
        r->mem = kids[0];
        r->cfg.n_layers = cfg->child[0].n_layers;
        for (int32_t il = 0; il < r->cfg.n_layers; il++)
            r->cfg.layer_child[il] = 0;
    }
    for (int32_t il = 0; il < r->cfg.n_layers; il++) {
        mr_child *c = &r->ch[r->cfg.layer_child[il]];
        r->layer_child[il] = r->cfg.layer_child[il];
        r->layer_local[il] = c->n_layers;
        c->layer[c->n_layers++] = il;
    }
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        ch->mem = hybrid ? llmem_memory_child(r->mem, c) : r->mem;
        ch->kv.ps = ch->cfg.page_size;
        ch->kv.n_pages = ch->cfg.n_pages;
        ch->kv.prefix = ch->cfg.prefix;
        ch->rs.n_ckpt = ch->cfg.n_ckpt;
        ch->rs.n_slots = cfg->n_seq_max * (2 + ch->cfg.n_ckpt);
    }
    if (!learn_buffers(r, err, err_len)) {
        llmem_memory_destroy(r->mem);
        free(r);
        return NULL;
    }
    *mem = r->mem;
    return r;
}

void memref_destroy(memref *r)
{
    if (!r)
        return;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        for (int32_t a = 0; a < ch->kv.cap_pg; a++)
            free(ch->kv.pg[a].prefix.v);
        free(ch->kv.pg);
        for (int32_t s = 0; s < MR_MAX_SEQ; s++)
            free(ch->kv.tab[s].v);
        free(ch->st);
        free(ch->shift_slot);
        free(ch->shift_delta);
        free(ch->str);
    }
    for (int32_t s = 0; s < MR_MAX_SEQ; s++) {
        free(r->seq[s].v);
        free(r->plan.cached[s].v);
    }
    free(r->plan.token.v);
    free(r->plan.pos.v);
    free(r->plan.nseq.v);
    free(r->plan.out.v);
    free(r);
}

/* --- queries ------------------------------------------------------------------------------ */

int32_t memref_seq_len(const memref *r, int32_t seq)
{
    return r->seq[seq].n;
}

const mr_tok *memref_seq_tok(const memref *r, int32_t seq)
{
    return r->seq[seq].v;
}

int32_t memref_pos_max(const memref *r, int32_t seq)
{
    int32_t m = -1;
    for (int32_t j = 0; j < r->seq[seq].n; j++)
        m = r->seq[seq].v[j].pos > m ? r->seq[seq].v[j].pos : m;
    return m;
}

int32_t memref_pos_min(const memref *r, int32_t seq)
{
    int32_t m = -1;
    for (int32_t j = 0; j < r->seq[seq].n; j++)
        if (m < 0 || r->seq[seq].v[j].pos < m)
            m = r->seq[seq].v[j].pos;
    return m;
}

bool memref_seq_shift_pending(const memref *r, int32_t seq)
{
    for (int32_t j = 0; j < r->seq[seq].n; j++)
        if (r->seq[seq].v[j].pos != r->seq[seq].v[j].kpos)
            return true;
    return false;
}

llmem_split memref_split(const memref *r)
{
    for (int32_t c = 0; c < r->n_ch; c++)
        if (!r->ch[c].cfg.kv)
            return LLMEM_SPLIT_EQUAL;
    return LLMEM_SPLIT_SIMPLE;
}

const mr_config *memref_config(const memref *r)
{
    return &r->cfg;
}

llmem_memory *memref_child_mem(const memref *r, int32_t c)
{
    return r->ch[c].mem;
}

int32_t memref_rs_lengths(const memref *r, int32_t seq, int32_t *len, int32_t cap)
{
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_rs *rs = &r->ch[c].rs;
        if (r->ch[c].cfg.kv)
            continue;
        int32_t n = 0;
        for (int32_t i = 0; i < rs->nh[seq]; i++) {
            int32_t l = rs->h[seq][i].len, k = n;
            while (k > 0 && len[k - 1] > l) {
                if (k < cap)
                    len[k] = len[k - 1];
                k--;
            }
            if (k < cap)
                len[k] = l;
            n++;
        }
        return n;
    }
    return 0;
}

void memref_set_quirks(memref *r, unsigned quirks)
{
    r->quirks = quirks;
}

int64_t memref_evictions(const memref *r)
{
    int64_t n = 0;
    for (int32_t c = 0; c < r->n_ch; c++)
        n += r->ch[c].kv.evictions;
    return n;
}

bool memref_plan_active(const memref *r)
{
    return r->plan.active;
}

void mr_seq_head(const memref *r, int32_t seq, int32_t *len, uint64_t *h)
{
    const mr_seqv *s = &r->seq[seq];
    *len = s->n;
    *h = last_h(s);
    if (r->plan.active && r->plan.n_cached[seq] > 0 && !r->plan.cached_done[seq]) {
        *len = r->plan.n_cached[seq];
        *h = last_h(&r->plan.cached[seq]);
    }
}

int32_t mr_plan_ids(const memref *r, int32_t i, const int32_t **ids)
{
    *ids = r->plan.ids[i];
    return r->plan.nseq.v[i];
}

/* --- plans ---------------------------------------------------------------------------------- */

static bool has(const int32_t *v, int32_t n, int32_t x)
{
    for (int32_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

static bool same_set(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    if (na != nb)
        return false;
    for (int32_t i = 0; i < na; i++)
        if (!has(b, nb, a[i]))
            return false;
    return true;
}

static llmem_status validate(const memref *r, const llmem_batch *b, llmem_split split,
                             int32_t n_ubatch)
{
    if (n_ubatch < 1 || split < memref_split(r) || split > LLMEM_SPLIT_SEQ)
        return LLMEM_E_INVALID;
    if (b->n_tokens < 1 || b->n_tokens > 1024 || !b->pos || !b->token)
        return LLMEM_E_INVALID;
    int32_t next[MR_MAX_SEQ], set_tok[MR_MAX_SEQ];
    for (int32_t s = 0; s < r->n_seq; s++) {
        next[s] = r->seq[s].n ? memref_pos_max(r, s) + 1 : -1;
        set_tok[s] = -1;
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t ns = b->n_seq_id ? b->n_seq_id[i] : 1;
        if (ns < 1 || ns > MR_MAX_TOK_SEQ || b->pos[i] < 0)
            return LLMEM_E_INVALID;
        const int32_t *ids = b->seq_id[i];
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = ids[j];
            if (s < 0 || s >= r->n_seq || has(ids, j, s))
                return LLMEM_E_INVALID;
            if (next[s] < 0)
                next[s] = b->pos[i];
            if (b->pos[i] != next[s])
                return LLMEM_E_INVALID;
            next[s]++;
            if (split != LLMEM_SPLIT_SIMPLE && set_tok[s] >= 0) {
                int32_t k = set_tok[s];
                int32_t nk = b->n_seq_id ? b->n_seq_id[k] : 1;
                if (!same_set(ids, ns, b->seq_id[k], nk))
                    return LLMEM_E_INVALID;
            }
            set_tok[s] = i;
        }
    }
    return LLMEM_OK;
}

/* Pages and copy-on-write a KV child needs for the plan in r->plan. */
static int64_t kv_need(const mr_kv *kv, const memref *r, int32_t *need, bool *cow)
{
    int64_t total = 0;
    for (int32_t s = 0; s < r->n_seq; s++) {
        need[s] = 0;
        cow[s] = false;
        if (!r->plan.n_new[s])
            continue;
        int32_t c = r->plan.n_cached[s];
        int32_t len0 = c > 0 ? c : r->seq[s].n, nn = r->plan.n_new[s] - c;
        need[s] = div_up(len0 + nn, kv->ps) - div_up(len0, kv->ps);
        cow[s] = c == 0 && nn > 0 && len0 % kv->ps && !kv_writable(kv, kv->tab[s].v[len0 / kv->ps]);
        total += need[s] + cow[s];
    }
    return total;
}

static void plan_reset(memref *r)
{
    mr_plan *p = &r->plan;
    p->active = false;
    p->n_tokens = 0;
    p->token.n = p->pos.n = p->nseq.n = p->out.n = 0;
    for (int32_t s = 0; s < MR_MAX_SEQ; s++) {
        p->n_new[s] = p->n_cached[s] = 0;
        p->cached_done[s] = false;
        p->cached[s].n = 0;
    }
    p->n_committed = 0;
    p->captured = false;
}

llmem_status memref_plan(memref *r, const llmem_batch *b, llmem_split split, int32_t n_ubatch,
                         int32_t *n_cached)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (split == LLMEM_SPLIT_AUTO)
        split = memref_split(r);
    llmem_status st = validate(r, b, split, n_ubatch);
    if (st != LLMEM_OK)
        return st;
    plan_reset(r);
    mr_plan *p = &r->plan;
    p->n_tokens = b->n_tokens;
    int32_t *toks[MR_MAX_SEQ] = {0};
    bool shared[MR_MAX_SEQ] = {0};
    int32_t first_out[MR_MAX_SEQ], first_pos[MR_MAX_SEQ];
    for (int32_t s = 0; s < r->n_seq; s++) {
        first_out[s] = -1;
        first_pos[s] = -1;
        toks[s] = malloc((size_t)b->n_tokens * sizeof(int32_t));
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t ns = b->n_seq_id ? b->n_seq_id[i] : 1;
        bool out = b->output ? b->output[i] != 0 : i == b->n_tokens - 1;
        mr_ilist_push(&p->token, b->token[i]);
        mr_ilist_push(&p->pos, b->pos[i]);
        mr_ilist_push(&p->nseq, ns);
        mr_ilist_push(&p->out, out);
        for (int32_t j = 0; j < ns; j++) {
            int32_t s = b->seq_id[i][j];
            p->ids[i][j] = s;
            if (first_pos[s] < 0)
                first_pos[s] = b->pos[i];
            if (out && first_out[s] < 0)
                first_out[s] = p->n_new[s];
            shared[s] |= ns > 1;
            toks[s][p->n_new[s]++] = b->token[i];
        }
    }
    /* prefix cache: empty sequences starting at 0, no shared tokens; never
     * the last token or one that needs an output; whole pages only; the
     * shortest prefix every child agrees on */
    for (int32_t s = 0; s < r->n_seq; s++) {
        int32_t n = p->n_new[s];
        if (n < 2 || first_pos[s] != 0 || r->seq[s].n || shared[s])
            continue;
        int32_t limit = first_out[s] >= 0 && first_out[s] < n - 1 ? first_out[s] : n - 1;
        int32_t m = limit;
        for (int32_t c = 0; c < r->n_ch; c++) {
            const mr_kv *kv = &r->ch[c].kv;
            int32_t k = r->ch[c].cfg.kv && kv->prefix ? kv_match(kv, toks[s], limit, NULL) * kv->ps
                                                      : 0;
            m = k < m ? k : m;
        }
        p->n_cached[s] = m > 0 ? m : 0;
        uint64_t h = MR_H0;
        for (int32_t j = 0; j < p->n_cached[s]; j++) {
            h = memref_mix(h, toks[s][j]);
            mr_seqv_push(&p->cached[s], (mr_tok){toks[s][j], j, j, h});
        }
    }
    /* every KV child: pin the prefix pages, then check the space */
    int32_t pins[MR_MAX_CHILD][1024], n_pin[MR_MAX_CHILD] = {0};
    int32_t need[MR_MAX_CHILD][MR_MAX_SEQ];
    bool cow[MR_MAX_CHILD][MR_MAX_SEQ];
    st = LLMEM_OK;
    for (int32_t c = 0; c < r->n_ch && st == LLMEM_OK; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        for (int32_t s = 0; s < r->n_seq; s++) {
            if (!p->n_cached[s])
                continue;
            int32_t np = kv_match(kv, toks[s], p->n_cached[s], pins[c] + n_pin[c]);
            for (int32_t k = 0; k < np; k++)
                kv_ref(kv, pins[c][n_pin[c] + k]);
            n_pin[c] += np;
        }
        int64_t total = kv_need(kv, r, need[c], cow[c]);
        if (total > kv->n_pages - mr_kv_used(kv)) {
            st = LLMEM_E_NO_SPACE;
            for (int32_t k = 0; k < n_pin[c]; k++)
                kv_unref(kv, pins[c][k]);
            /* earlier children give their pins back as release does */
            for (int32_t c2 = 0; c2 < c; c2++)
                for (int32_t k = n_pin[c2] - 1; k >= 0; k--)
                    kv_unref(&r->ch[c2].kv, pins[c2][k]);
        }
    }
    for (int32_t s = 0; s < r->n_seq; s++)
        free(toks[s]);
    if (st != LLMEM_OK) {
        plan_reset(r);
        return st;
    }
    /* reservations, in the order the cache makes them */
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int32_t at = 0;
        for (int32_t s = 0; s < r->n_seq; s++) {
            if (!p->n_new[s])
                continue;
            mr_ilist *t = &kv->tab[s];
            for (int32_t k = 0; k < p->n_cached[s] / kv->ps; k++)
                mr_ilist_push(t, pins[c][at++]);
            if (cow[c][s]) {
                int32_t i = r->seq[s].n / kv->ps, old = t->v[i];
                bool sh = kv->pg[old].shift;
                int32_t a = kv_alloc(kv);
                kv->pg[a].shift = sh;
                t->v[i] = a;
                kv_unref(kv, old);
                kv->cows++;
            }
            for (int32_t k = 0; k < need[c][s]; k++)
                mr_ilist_push(t, kv_alloc(kv));
        }
    }
    for (int32_t s = 0; s < r->n_seq; s++)
        n_cached[s] = p->n_cached[s];
    p->active = true;
    return LLMEM_OK;
}

/* Appends a token to seq in every child (the cache's commit). */
static void push_token(memref *r, int32_t seq, mr_tok t)
{
    mr_seqv *s = &r->seq[seq];
    mr_seqv_push(s, t);
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        mr_page *pg = &kv->pg[kv->tab[seq].v[(s->n - 1) / kv->ps]];
        if (!(r->quirks & MR_QUIRK_STALE_HASH))
            pg->hashed = false; /* a page written to is no longer what it was hashed as */
        if (s->n % kv->ps == 0)
            kv_publish(kv, s, seq, s->n / kv->ps - 1);
    }
}

void memref_commit(memref *r, const llmem_ubatch *ub)
{
    mr_plan *p = &r->plan;
    /* recurrent children: the states after this ubatch */
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv)
            continue;
        for (int32_t k = 0; k < ch->n_str; k++) {
            const mr_stream *x = &ch->str[k];
            mr_hold add[MR_MAX_HOLD], out[2 * MR_MAX_HOLD];
            int32_t n_add = 0;
            for (int32_t j = 0; j < x->c; j++)
                add[n_add++] = (mr_hold){x->L + x->T - x->c + j, x->ckpt[j]};
            add[n_add++] = (mr_hold){x->L + x->T, x->dst};
            int32_t n = mr_rs_after(&ch->rs, x->primary, add, n_add, out);
            memcpy(ch->rs.h[x->primary], out, (size_t)n * sizeof *out);
            ch->rs.nh[x->primary] = n;
            for (int32_t m = 0; m < x->n_ids; m++) {
                int32_t b = x->ids[m];
                if (b == x->primary)
                    continue;
                /* a copy of the primary's final state, in a slot of its own */
                ch->rs.h[b][0] = (mr_hold){r->seq[b].n + x->T,
                                           llmem_recurrent_seq_slot(ch->mem, b)};
                ch->rs.nh[b] = 1;
            }
        }
    }
    for (int32_t k = 0; k < ub->n_tokens; k++) {
        int32_t i = ub->batch_idx[k];
        for (int32_t j = 0; j < p->nseq.v[i]; j++) {
            int32_t q = p->ids[i][j];
            if (p->n_cached[q] > 0 && !p->cached_done[q]) {
                for (int32_t m = 0; m < p->cached[q].n; m++)
                    mr_seqv_push(&r->seq[q], p->cached[q].v[m]);
                for (int32_t c = 0; c < r->n_ch; c++)
                    if (r->ch[c].cfg.kv)
                        r->ch[c].kv.hits += p->n_cached[q];
                p->cached_done[q] = true;
            }
            mr_tok t = {p->token.v[i], p->pos.v[i], p->pos.v[i],
                        memref_mix(last_h(&r->seq[q]), p->token.v[i])};
            push_token(r, q, t);
        }
    }
    if (p->n_committed == 0) {
        /* every pending K-shift was applied by this ubatch */
        for (int32_t s = 0; s < r->n_seq; s++)
            for (int32_t j = 0; j < r->seq[s].n; j++)
                r->seq[s].v[j].kpos = r->seq[s].v[j].pos;
        for (int32_t c = 0; c < r->n_ch; c++)
            for (int32_t a = 0; a < r->ch[c].kv.n_pg; a++)
                r->ch[c].kv.pg[a].shift = false;
    }
    p->n_committed++;
    p->captured = false;
}

void memref_release(memref *r, bool applied)
{
    mr_plan *p = &r->plan;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            for (int32_t s = 0; s < r->n_seq; s++)
                if (p->n_new[s])
                    kv_drop_from(&ch->kv, s, div_up(r->seq[s].n, ch->kv.ps));
            continue;
        }
        if (!applied || !p->captured)
            continue;
        /* states whose slots the applied ubatch writes are gone; the
         * current state of every sequence stays */
        for (int32_t s = 0; s < r->n_seq; s++) {
            mr_rs *rs = &ch->rs;
            int32_t n = 0;
            for (int32_t i = 0; i < rs->nh[s]; i++) {
                const mr_hold *h = &rs->h[s][i];
                bool written = false;
                for (int32_t k = 0; k < ch->n_str && !written; k++) {
                    written = ch->str[k].dst == h->slot;
                    for (int32_t j = 0; j < ch->str[k].c && !written; j++)
                        written = ch->str[k].ckpt[j] == h->slot;
                }
                if (!written || h->len == r->seq[s].n)
                    rs->h[s][n++] = *h;
            }
            rs->nh[s] = n;
        }
    }
    plan_reset(r);
}

/* --- sequence operations ------------------------------------------------------------------------ */

static void norm(int32_t *p0, int32_t *p1)
{
    if (*p0 < 0)
        *p0 = 0;
    if (*p1 < 0)
        *p1 = INT32_MAX;
}

static bool in(int32_t pos, int32_t p0, int32_t p1)
{
    return pos >= p0 && pos < p1;
}

/* First index of the suffix [p0, p1) covers; -1 when it is not a suffix. */
static int32_t suffix(const mr_seqv *s, int32_t p0, int32_t p1)
{
    int32_t first = s->n;
    for (int32_t j = 0; j < s->n && first == s->n; j++)
        if (in(s->v[j].pos, p0, p1))
            first = j;
    for (int32_t j = first; j < s->n; j++)
        if (!in(s->v[j].pos, p0, p1))
            return -1;
    return first;
}

static void drop_seq(memref *r, int32_t s, int32_t keep)
{
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            kv_drop_from(&ch->kv, s, div_up(keep, ch->kv.ps));
            if (keep % ch->kv.ps) {
                int32_t a = ch->kv.tab[s].v[ch->kv.tab[s].n - 1];
                if (kv_writable(&ch->kv, a))
                    ch->kv.pg[a].hashed = false;
            }
        } else {
            mr_rs *rs = &ch->rs;
            int32_t n = 0;
            for (int32_t i = 0; i < rs->nh[s]; i++)
                if (keep > 0 && rs->h[s][i].len <= keep)
                    rs->h[s][n++] = rs->h[s][i];
            rs->nh[s] = n;
        }
    }
    r->seq[s].n = keep;
}

static llmem_status rm_check(const memref *r, int32_t s, int32_t p0, int32_t p1, int32_t *k)
{
    *k = suffix(&r->seq[s], p0, p1);
    if (*k < 0)
        return LLMEM_E_STATE;
    if (*k == r->seq[s].n || *k == 0)
        return LLMEM_OK;
    for (int32_t c = 0; c < r->n_ch; c++)
        if (!r->ch[c].cfg.kv && rs_find(&r->ch[c].rs, s, *k) < 0)
            return LLMEM_E_STATE;
    return LLMEM_OK;
}

llmem_status memref_seq_rm(memref *r, int32_t seq, int32_t p0, int32_t p1)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < -1 || seq >= r->n_seq)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    int32_t k[MR_MAX_SEQ];
    int32_t s0 = seq < 0 ? 0 : seq, s1 = seq < 0 ? r->n_seq : seq + 1;
    for (int32_t s = s0; s < s1; s++) {
        llmem_status st = rm_check(r, s, p0, p1, &k[s]);
        if (st != LLMEM_OK)
            return st;
    }
    for (int32_t s = s0; s < s1; s++)
        if (k[s] < r->seq[s].n)
            drop_seq(r, s, k[s]);
    return LLMEM_OK;
}

llmem_status memref_seq_cp(memref *r, int32_t src, int32_t dst, int32_t p0, int32_t p1)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (src < 0 || src >= r->n_seq || dst < 0 || dst >= r->n_seq)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    if (src == dst)
        return LLMEM_OK;
    const mr_seqv *a = &r->seq[src];
    int32_t k = 0;
    while (k < a->n && in(a->v[k].pos, p0, p1))
        k++;
    for (int32_t j = k; j < a->n; j++)
        if (in(a->v[j].pos, p0, p1))
            return LLMEM_E_STATE;
    for (int32_t c = 0; c < r->n_ch; c++)
        if (!r->ch[c].cfg.kv && k > 0 && rs_find(&r->ch[c].rs, src, k) < 0)
            return LLMEM_E_STATE;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            kv_drop_from(&ch->kv, dst, 0);
            for (int32_t i = 0; i < div_up(k, ch->kv.ps); i++) {
                kv_ref(&ch->kv, ch->kv.tab[src].v[i]);
                mr_ilist_push(&ch->kv.tab[dst], ch->kv.tab[src].v[i]);
            }
        } else {
            ch->rs.nh[dst] = 0;
            if (k > 0)
                ch->rs.h[dst][ch->rs.nh[dst]++] = (mr_hold){k, -1};
        }
    }
    r->seq[dst].n = 0;
    for (int32_t j = 0; j < k; j++)
        mr_seqv_push(&r->seq[dst], a->v[j]);
    return LLMEM_OK;
}

llmem_status memref_seq_keep(memref *r, int32_t seq)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < 0 || seq >= r->n_seq)
        return LLMEM_E_INVALID;
    for (int32_t s = 0; s < r->n_seq; s++)
        if (s != seq)
            drop_seq(r, s, 0);
    return LLMEM_OK;
}

/* seq_add (d == 0) or seq_div (d > 0). */
static llmem_status shift(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t delta,
                          int32_t d)
{
    mr_seqv *s = &r->seq[seq];
    for (int32_t j = 0; j < s->n; j++) {
        int64_t np = d ? s->v[j].pos / d : (int64_t)s->v[j].pos + delta;
        if (in(s->v[j].pos, p0, p1) && (np < 0 || np > INT32_MAX - 1))
            return LLMEM_E_INVALID;
    }
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int32_t n_cow = 0, last = -1;
        for (int32_t j = 0; j < s->n; j++)
            if (in(s->v[j].pos, p0, p1) && j / kv->ps != last) {
                last = j / kv->ps;
                n_cow += kv->pg[kv->tab[seq].v[last]].ref > 1;
            }
        if (n_cow > kv->n_pages - mr_kv_used(kv))
            return LLMEM_E_NO_SPACE;
    }
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int32_t last = -1;
        for (int32_t j = 0; j < s->n; j++) {
            if (!in(s->v[j].pos, p0, p1) || j / kv->ps == last)
                continue;
            last = j / kv->ps;
            int32_t a = kv->tab[seq].v[last];
            if (kv->pg[a].ref > 1) {
                bool sh = kv->pg[a].shift;
                int32_t b = kv_alloc(kv);
                kv->pg[b].shift = sh;
                kv->tab[seq].v[last] = b;
                kv_unref(kv, a);
                kv->cows++;
                a = b;
            }
            kv->pg[a].pub = false;
            kv->pg[a].hashed = false;
            kv->pg[a].shift = true;
        }
    }
    for (int32_t j = 0; j < s->n; j++)
        if (in(s->v[j].pos, p0, p1))
            s->v[j].pos = d ? s->v[j].pos / d : s->v[j].pos + delta;
    return LLMEM_OK;
}

llmem_status memref_seq_add(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t delta)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < 0 || seq >= r->n_seq)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    if (delta == 0 || p0 >= p1)
        return LLMEM_OK;
    return shift(r, seq, p0, p1, delta, 0);
}

llmem_status memref_seq_div(memref *r, int32_t seq, int32_t p0, int32_t p1, int32_t d)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < 0 || seq >= r->n_seq || d <= 0)
        return LLMEM_E_INVALID;
    norm(&p0, &p1);
    if (d == 1 || p0 >= p1)
        return LLMEM_OK;
    return shift(r, seq, p0, p1, 0, d);
}

void memref_clear(memref *r)
{
    for (int32_t s = 0; s < r->n_seq; s++)
        r->seq[s].n = 0;
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        for (int32_t a = 0; a < ch->kv.n_pg; a++)
            kv_die(&ch->kv, a);
        for (int32_t s = 0; s < r->n_seq; s++) {
            ch->kv.tab[s].n = 0;
            ch->rs.nh[s] = 0;
        }
    }
}

/* --- state I/O ------------------------------------------------------------------------------------ */

mr_saved *memref_save(const memref *r, int32_t seq)
{
    mr_saved *sv = calloc(1, sizeof *sv);
    if (!sv)
        return NULL;
    sv->all = seq < 0;
    for (int32_t s = 0; s < r->n_seq; s++) {
        if (seq >= 0 ? s != seq : r->seq[s].n == 0)
            continue;
        sv->seq[sv->n] = s;
        for (int32_t j = 0; j < r->seq[s].n; j++)
            mr_seqv_push(&sv->tok[sv->n], r->seq[s].v[j]);
        sv->n++;
    }
    return sv;
}

void memref_saved_free(mr_saved *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < MR_MAX_SEQ; i++)
        free(s->tok[i].v);
    free(s);
}

llmem_status memref_load(memref *r, int32_t seq, const mr_saved *sv)
{
    if (r->plan.active)
        return LLMEM_E_BUSY;
    if (seq < -1 || seq >= r->n_seq || sv->all != (seq < 0))
        return LLMEM_E_INVALID;
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_kv *kv = &r->ch[c].kv;
        if (!r->ch[c].cfg.kv)
            continue;
        int64_t need = 0, avail = kv->n_pages;
        for (int32_t i = 0; i < sv->n; i++)
            need += div_up(sv->tok[i].n, kv->ps);
        if (seq >= 0) {
            avail = kv->n_pages - mr_kv_used(kv);
            for (int32_t k = 0; k < kv->tab[seq].n; k++)
                avail += kv->pg[kv->tab[seq].v[k]].ref == 1;
        }
        if (need > avail)
            return LLMEM_E_NO_SPACE;
    }
    if (seq < 0)
        memref_clear(r);
    else
        drop_seq(r, seq, 0);
    for (int32_t i = 0; i < sv->n; i++) {
        int32_t s = seq >= 0 ? seq : sv->seq[i];
        for (int32_t j = 0; j < sv->tok[i].n; j++)
            mr_seqv_push(&r->seq[s], sv->tok[i].v[j]);
        int32_t n = r->seq[s].n;
        for (int32_t c = 0; c < r->n_ch; c++) {
            mr_child *ch = &r->ch[c];
            if (ch->cfg.kv) {
                for (int32_t k = 0; k < div_up(n, ch->kv.ps); k++)
                    mr_ilist_push(&ch->kv.tab[s], kv_alloc(&ch->kv));
                /* pending K-shifts come back with the stream */
                for (int32_t j = 0; j < n; j++)
                    if (r->seq[s].v[j].pos != r->seq[s].v[j].kpos)
                        ch->kv.pg[ch->kv.tab[s].v[j / ch->kv.ps]].shift = true;
            } else if (n > 0) {
                ch->rs.h[s][0] = (mr_hold){n, -1};
                ch->rs.nh[s] = 1;
            }
        }
    }
    return LLMEM_OK;
}

void memref_stats(const memref *r, llmem_memory_stats *st)
{
    memset(st, 0, sizeof *st);
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            int32_t used = mr_kv_used(&ch->kv), cached = mr_kv_cached(&ch->kv);
            st->pages_total += ch->kv.n_pages;
            st->pages_used += used;
            st->pages_cached += cached;
            st->pages_free += ch->kv.n_pages - used - cached;
            st->prefix_hit_tokens += ch->kv.hits;
            st->prefix_evictions += ch->kv.evictions;
            st->cow_copies += ch->kv.cows;
        } else {
            st->slots_total += ch->rs.n_slots;
            for (int32_t s = 0; s < r->n_seq; s++)
                st->slots_used += ch->rs.nh[s];
        }
    }
    for (int32_t s = 0; s < r->n_seq; s++)
        st->n_seqs_live += r->seq[s].n > 0;
}

/* The memory reference, part 1: what each sequence holds, the KV pages
 * (sharing, copy-on-write, prefix cache with LRU eviction) and the
 * recurrent states (checkpoints), kept in brute-force lists; creation and
 * queries. Plans are in memref_ops.c, sequence operations in memref_seq.c,
 * data tags and comparisons in memref_data.c, views in memref_views.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memref_impl.h"

/* --- small containers ---------------------------------------------------------------- */

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

uint64_t mr_last_h(const mr_seqv *s)
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

static int32_t mr_kv_new(mr_kv *kv)
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
    return a;
}

void mr_kv_die(mr_kv *kv, int32_t a)
{
    kv->pg[a].live = false;
    kv->pg[a].pub = false;
    kv->pg[a].hashed = false;
}

/* A new page: a free one, else the least recently cached one is evicted.
 * -1 when neither exists (the caller checked the space before). */
int32_t mr_kv_alloc(mr_kv *kv)
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
        mr_kv_die(kv, best);
        kv->evictions++;
    }
    return mr_kv_new(kv);
}

void mr_kv_ref(mr_kv *kv, int32_t a)
{
    kv->pg[a].ref++;
}

void mr_kv_unref(mr_kv *kv, int32_t a)
{
    mr_page *p = &kv->pg[a];
    if (--p->ref > 0)
        return;
    if (p->pub) {
        p->lru = ++*kv->clock;
        mr_budget_room(kv->owner, 0); /* it became cached: at worst it goes itself */
    } else {
        mr_kv_die(kv, a);
    }
}

/* Drops page table entries [keep, n) of seq, last first. */
void mr_kv_drop_from(mr_kv *kv, int32_t seq, int32_t keep)
{
    mr_ilist *t = &kv->tab[seq];
    for (int32_t i = t->n - 1; i >= keep; i--)
        mr_kv_unref(kv, t->v[i]);
    if (t->n > keep)
        t->n = keep;
}

bool mr_kv_writable(const mr_kv *kv, int32_t a)
{
    return kv->pg[a].ref == 1 && !kv->pg[a].pub;
}

int32_t mr_div_up(int32_t a, int32_t b)
{
    return (int32_t)(((int64_t)a + b - 1) / b);
}

/* Published pages matching tokens[0, n) page by page from the first,
 * keyed by the whole token prefix (content, never page ids: every copy of a
 * prefix is findable); among equal pages the most recently published. */
int32_t mr_kv_match(const mr_kv *kv, const int32_t *tokens, int32_t n, int32_t *out)
{
    int32_t ps = kv->ps, k = 0;
    for (; (int64_t)(k + 1) * ps <= n; k++) {
        int32_t found = -1, len = (k + 1) * ps;
        for (int32_t a = 0; a < kv->n_pg; a++) {
            const mr_page *p = &kv->pg[a];
            if (p->live && p->pub && p->prefix.n == len &&
                (found < 0 || p->pubstamp > kv->pg[found].pubstamp) &&
                memcmp(p->prefix.v, tokens, (size_t)len * sizeof *tokens) == 0)
                found = a;
        }
        if (found < 0)
            break;
        if (out)
            out[k] = found;
    }
    return k;
}

/* Page k of seq just became full at commit: publish it when the contract
 * says so (canonical positions, known tokens, no pending K-shift, the
 * previous page part of a chain), equal published pages or not. */
void mr_kv_publish(mr_kv *kv, const mr_seqv *s, int32_t seq, int32_t k)
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
    p->prefix.n = 0;
    for (int32_t j = 0; j < (k + 1) * ps; j++)
        mr_ilist_push(&p->prefix, s->v[j].token);
    p->pub = true;
    p->pubstamp = ++kv->pubclock;
}

/* --- the prefix budget and snapshots -------------------------------------------------- */

/* Device bytes of one cached page of a KV child: K and V of every layer,
 * page_size rows of 1 head x 4 f32. */
static int64_t page_entry_bytes(const mr_child *ch)
{
    return 2 * (int64_t)ch->cfg.n_layers * ch->kv.ps * 16;
}

static int64_t budget_used(const memref *r)
{
    int64_t used = 0;
    for (int32_t c = 0; c < r->n_ch; c++) {
        const mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            used += mr_kv_cached(&ch->kv) * page_entry_bytes(ch);
            continue;
        }
        for (int32_t i = 0; i < ch->rs.n_snap; i++)
            used += ch->rs.snap[i].live ? (int64_t)ch->rs.slot_bytes : 0;
    }
    return used;
}

bool mr_budget_room(memref *r, int64_t extra)
{
    if (!r || r->budget <= 0)
        return true;
    while (budget_used(r) + extra > r->budget) {
        /* the oldest unpinned entry of any child, page or snapshot */
        int32_t vc = -1, vi = -1;
        uint64_t oldest = 0;
        for (int32_t c = 0; c < r->n_ch; c++) {
            const mr_child *ch = &r->ch[c];
            if (ch->cfg.kv) {
                for (int32_t a = 0; a < ch->kv.n_pg; a++) {
                    const mr_page *p = &ch->kv.pg[a];
                    if (p->live && p->ref == 0 && p->pub && (vc < 0 || p->lru < oldest)) {
                        vc = c;
                        vi = a;
                        oldest = p->lru;
                    }
                }
                continue;
            }
            for (int32_t i = 0; i < ch->rs.n_snap; i++) {
                const mr_snap *q = &ch->rs.snap[i];
                if (q->live && q->ref == 0 && (vc < 0 || q->lru < oldest)) {
                    vc = c;
                    vi = i;
                    oldest = q->lru;
                }
            }
        }
        if (vc < 0)
            return false;
        mr_child *ch = &r->ch[vc];
        if (ch->cfg.kv) {
            mr_kv_die(&ch->kv, vi);
            ch->kv.evictions++;
        } else {
            ch->rs.snap[vi].live = false;
            ch->rs.snap_evictions++;
        }
    }
    return true;
}

int32_t mr_snap_find(const mr_rs *rs, const int32_t *tokens, int32_t len)
{
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const mr_snap *q = &rs->snap[i];
        if (q->live && q->prefix.n == len &&
            memcmp(q->prefix.v, tokens, (size_t)len * sizeof *tokens) == 0)
            return i;
    }
    return -1;
}

int32_t mr_snap_longest(const mr_rs *rs, const int32_t *tokens, int32_t m)
{
    int32_t best = -1;
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const mr_snap *q = &rs->snap[i];
        if (q->live && q->prefix.n <= m && (best < 0 || q->prefix.n > rs->snap[best].prefix.n) &&
            memcmp(q->prefix.v, tokens, (size_t)q->prefix.n * sizeof *tokens) == 0)
            best = i;
    }
    return best;
}

/* The rule of rs_snap.c, from the contract: the first len tokens of a
 * sequence whose positions are in order (no decrease anywhere) and run
 * 0..len-1, all token ids; an equal snapshot is only touched; else a
 * free slot (making room in the budget first) or the least recently used
 * unpinned snapshot's; nothing when every slot is pinned. */
void mr_snap_publish(memref *r, mr_rs *rs, int32_t seq, int32_t len)
{
    const mr_seqv *s = &r->seq[seq];
    if (rs->n_snap == 0 || len <= 0 || len > s->n)
        return;
    for (int32_t j = 1; j < s->n; j++)
        if (s->v[j].pos < s->v[j - 1].pos)
            return;
    if (s->v[0].pos != 0 || s->v[len - 1].pos != len - 1)
        return;
    int32_t tok[1024];
    if (len > 1024)
        abort();
    for (int32_t j = 0; j < len; j++) {
        if (s->v[j].token < 0)
            return;
        tok[j] = s->v[j].token;
    }
    int32_t eq = mr_snap_find(rs, tok, len);
    if (eq >= 0) {
        rs->snap[eq].lru = ++r->clock;
        return;
    }
    int32_t free_i = -1, lru_i = -1;
    for (int32_t i = 0; i < rs->n_snap; i++) {
        const mr_snap *q = &rs->snap[i];
        if (!q->live && free_i < 0)
            free_i = i;
        if (q->live && q->ref == 0 && (lru_i < 0 || q->lru < rs->snap[lru_i].lru))
            lru_i = i;
    }
    int32_t v = free_i >= 0 ? free_i : lru_i;
    if (v < 0)
        return;
    if (free_i >= 0 && r->budget > 0) {
        if (!mr_budget_room(r, (int64_t)rs->slot_bytes))
            return;
        for (v = 0; v < rs->n_snap && rs->snap[v].live; v++)
            ;
    } else if (free_i < 0) {
        rs->snap_evictions++; /* its slot goes to the new one */
    }
    mr_snap *q = &rs->snap[v];
    q->live = true;
    q->ref = 0;
    q->slot = -1;
    q->h = s->v[len - 1].h;
    q->lru = ++r->clock;
    q->prefix.n = 0;
    for (int32_t j = 0; j < len; j++)
        mr_ilist_push(&q->prefix, tok[j]);
}

/* --- recurrent states ---------------------------------------------------------------- */

int32_t mr_rs_find(const mr_rs *rs, int32_t seq, int32_t len)
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

/* --- creation ------------------------------------------------------------------------ */

/* [mr_rs_layout] (memref.h) */
static const llmem_state_desc rs_desc[4][2] = {
    {{"conv", 2, {2, 4}, LLMEM_DTYPE_F32}, {"ssm", 1, {4}, LLMEM_DTYPE_F32}},
    {{"conv", 2, {3, 16}, LLMEM_DTYPE_F32}, {"delta", 3, {2, 4, 4}, LLMEM_DTYPE_F32}},
    {{"conv", 2, {2, 8}, LLMEM_DTYPE_F32}, {0}},
    {{"conv", 2, {3, 8}, LLMEM_DTYPE_F32}, {"ssm", 2, {8, 4}, LLMEM_DTYPE_F32}},
};

static int32_t rs_n_states(int32_t layout)
{
    return layout == MR_RS_SHORTCONV ? 1 : 2;
}

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
        p.prefix_cache_bytes = c->budget;
        llmem_kv_cache_create(be, &p, &m, err, err_len);
    } else {
        const llmem_state_desc *states[MR_MAX_LAYERS];
        int32_t n_states[MR_MAX_LAYERS];
        for (int32_t il = 0; il < c->n_layers; il++) {
            states[il] = rs_desc[c->layout];
            n_states[il] = rs_n_states(c->layout);
        }
        llmem_recurrent_params p = {.n_layers = c->n_layers, .n_states = n_states,
                                    .states = states, .n_seq_max = n_seq, .n_ckpt = c->n_ckpt,
                                    .poison = c->poison, .n_snapshots = c->n_snap,
                                    .snap_interval = c->n_snap > 0 ? 1 : 0,
                                    .prefix_cache_bytes = c->budget};
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
            c->kv.k[li] = llmem_view_kv(&v)->k;
            c->kv.v[li] = llmem_view_kv(&v)->v;
            c->kv.row_bytes = (size_t)llmem_view_kv(&v)->n_kv_heads * (size_t)llmem_view_kv(&v)->head_dim *
                              llmem_dtype_size(llmem_view_kv(&v)->dtype);
        } else if (ok) {
            ok = v.kind == LLMEM_VIEW_RECURRENT && llmem_view_rs(&v)->n_states == c->rs.n_states;
            for (int32_t j = 0; ok && j < c->rs.n_states; j++) {
                c->rs.buf[li][j] = llmem_view_rs(&v)->state[j];
                c->rs.bytes[j] = llmem_buffer_size(llmem_view_rs(&v)->state[j]) / (size_t)c->rs.n_slots;
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
    for (int32_t c = 0; c < cfg->n_children; c++)
        if (cfg->child[c].n_snap > MR_MAX_SNAP || (cfg->child[c].n_snap > 0 && cfg->child[c].n_ckpt))
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
        ch->kv.owner = ch->rs.owner = r;
        ch->kv.clock = &r->clock;
        ch->kv.ps = ch->cfg.page_size;
        ch->kv.n_pages = ch->cfg.n_pages;
        ch->kv.prefix = ch->cfg.prefix;
        ch->rs.n_ckpt = ch->cfg.n_ckpt;
        ch->rs.n_seq_slots = cfg->n_seq_max * (2 + ch->cfg.n_ckpt);
        ch->rs.n_snap = ch->cfg.kv ? 0 : ch->cfg.n_snap;
        ch->rs.n_slots = ch->rs.n_seq_slots + ch->rs.n_snap;
        ch->rs.n_states = rs_n_states(ch->cfg.layout);
        for (int32_t j = 0; j < ch->rs.n_states; j++) {
            size_t e = 4;
            for (int32_t d = 0; d < rs_desc[ch->cfg.layout][j].n_dims; d++)
                e *= (size_t)rs_desc[ch->cfg.layout][j].shape[d];
            ch->rs.slot_bytes += e * (size_t)ch->cfg.n_layers;
        }
        /* the budget: a KV child's counts only with its prefix cache, a
         * recurrent child's only with snapshots; a hybrid shares the largest */
        if ((ch->cfg.kv ? ch->cfg.prefix : ch->cfg.n_snap > 0) && ch->cfg.budget > r->budget)
            r->budget = ch->cfg.budget;
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
        for (int32_t i = 0; i < MR_MAX_SNAP; i++)
            free(ch->rs.snap[i].prefix.v);
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

/* --- queries ------------------------------------------------------------------------- */

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
    *h = mr_last_h(s);
    if (r->plan.active && r->plan.n_cached[seq] > 0 && !r->plan.cached_done[seq]) {
        *len = r->plan.n_cached[seq];
        *h = mr_last_h(&r->plan.cached[seq]);
    }
}

int32_t mr_plan_ids(const memref *r, int32_t i, const int32_t **ids)
{
    *ids = r->plan.ids[i];
    return r->plan.nseq.v[i];
}

/* --- state I/O ----------------------------------------------------------------------- */

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
        for (int32_t c = 0; c < r->n_ch; c++) {
            const mr_kv *kv = &r->ch[c].kv;
            sv->share_from[c][sv->n] = -1;
            sv->share_len[c][sv->n] = 0;
            if (!r->ch[c].cfg.kv || seq >= 0 || r->seq[s].n == 0)
                continue;
            for (int32_t i = 0; i < sv->n; i++) {
                const mr_ilist *a = &kv->tab[s], *o = &kv->tab[sv->seq[i]];
                if (o->n == 0 || a->v[0] != o->v[0])
                    continue;
                int32_t k = 0;
                while (k < a->n && k < o->n && a->v[k] == o->v[k])
                    k++;
                int32_t l = k * kv->ps;
                l = l < r->seq[s].n ? l : r->seq[s].n;
                l = l < r->seq[sv->seq[i]].n ? l : r->seq[sv->seq[i]].n;
                sv->share_from[c][sv->n] = i;
                sv->share_len[c][sv->n] = l;
                break;
            }
        }
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
            st->cached_kv_bytes += mr_kv_cached(&ch->kv) * page_entry_bytes(ch);
        } else {
            st->slots_total += ch->rs.n_seq_slots;
            for (int32_t s = 0; s < r->n_seq; s++)
                st->slots_used += ch->rs.nh[s];
            for (int32_t i = 0; i < ch->rs.n_snap; i++)
                st->snapshots += ch->rs.snap[i].live;
            st->snapshot_bytes += st->snapshots * (int64_t)ch->rs.slot_bytes;
            st->snapshot_evictions += ch->rs.snap_evictions;
            st->snapshot_hit_tokens += ch->rs.snap_hits;
        }
    }
    st->prefix_cache_bytes = r->budget;
    for (int32_t s = 0; s < r->n_seq; s++)
        st->n_seqs_live += r->seq[s].n > 0;
}

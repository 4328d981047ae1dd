/* llmem models/: recorded decode steps (issue 11 item 2; docs/cuda.md,
 * "Recorded op sequences").
 *
 * A decode ubatch (one token per sequence group) runs its forward ops
 * through a recording (llmem_backend_record: a CUDA graph on CUDA, a
 * reusable command buffer on Vulkan, the callback again on cpu) made for exactly its shape, so a step costs one
 * graph launch instead of hundreds of kernel launches, as vLLM's captured
 * decode steps do. Token ids, positions and output rows are uploaded by
 * the caller before, to fixed scratch offsets.
 *
 * A recording freezes everything its ops took from the host: tensor shapes
 * and offsets, the views' buffers, table offsets and sizes (of the page
 * rows only whether there are any, and max_pages only without them: with
 * page rows the CUDA and Vulkan kernels index them through page_off and
 * read neither, so a recording is not made again at every page boundary),
 * and the launch
 * choices the backend made from host tables (CUDA: the decode attention's
 * split count from the longest key range, the prefill/decode choice from
 * the runs of same-group tokens, the recurrent snapshot from src/dst slot aliasing). So
 * the key of a recording holds all of them: the scratch, n_tokens,
 * n_outputs, and per memory layer the view's buffers, sizes, table
 * (offset, n) pairs, the host contents of the tables that steer launch
 * choices (tok_seq; for recurrent slots only whether sources alias other
 * groups' destinations) and the longest key range in 256-key
 * buckets (the split count's unit, backends/cuda/cuda_ops.c). A step whose
 * key has no recording runs eagerly and is then recorded for the next one;
 * a pending K-shift runs eagerly, and so does a step whose recurrent views
 * carry snapshot tables (hf_graph_view_recordable: the key holds none of
 * them). LLMEM_NO_GRAPHS=1 when the model is built (hf_fused_setup) runs
 * every step eagerly.
 */
#include <stdlib.h>
#include <string.h>

#include "llmem/memory.h"
#include "models/model_internal.h"

enum { N_GRAPHS = 16, KV_BUCKET = 256 };

typedef struct step_ctx {
    llmem_model *m;
    int32_t n_tokens, n_outputs, n_vocab;
} step_ctx;

typedef struct graph {
    unsigned char *key; /* NULL: free slot */
    size_t key_len;
    llmem_recording *rec; /* NULL with failed: the backend refused to record */
    bool failed;
    uint64_t last_use;
    step_ctx ctx; /* read by the cpu backend's replays */
} graph;

struct hf_graphs {
    bool off; /* LLMEM_NO_GRAPHS=1 (llmem_model.no_graphs) */
    uint64_t clock;
    graph g[N_GRAPHS];
    unsigned char *kb; /* the key being built */
    size_t kn, kcap;
    bool oom;
    int32_t *own; /* [own_cap] slot -> writing group, -1 (needs_snapshot) */
    size_t own_cap;
};

static void put(struct hf_graphs *g, const void *p, size_t n)
{
    if (g->oom)
        return;
    if (g->kn + n > g->kcap) {
        size_t cap = g->kcap ? g->kcap * 2 : 1024;
        while (cap < g->kn + n)
            cap *= 2;
        unsigned char *kb = realloc(g->kb, cap);
        if (!kb) {
            g->oom = true;
            return;
        }
        g->kb = kb;
        g->kcap = cap;
    }
    memcpy(g->kb + g->kn, p, n);
    g->kn += n;
}

#define PUT(g, x) put((g), &(x), sizeof(x))

static void put_table(struct hf_graphs *g, const llmem_i32_table *t, bool contents)
{
    PUT(g, t->offset);
    PUT(g, t->n);
    if (contents && t->n > 0 && t->host)
        put(g, t->host, (size_t)t->n * sizeof *t->host);
}

/* Whether a group reads its initial state from a slot another group
 * writes: the CUDA recurrent ops then snapshot the sources first, a launch
 * choice taken from the host tables. The slots themselves change between
 * steps (they are read on the device) and are not part of the key. One
 * pass over the groups with a slot -> writer map (g->own, all -1 between
 * calls), not a pass per pair: this runs for every recurrent layer of
 * every decode step (29 layers x 64 x 64 pairs at batch 64). */
static bool needs_snapshot(struct hf_graphs *g, const llmem_rs_view *rs)
{
    if (!rs->src_slot.host || rs->n_slots <= 0)
        return false;
    if ((size_t)rs->n_slots > g->own_cap) {
        int32_t *own = realloc(g->own, (size_t)rs->n_slots * sizeof *own);
        if (!own) {
            g->oom = true;
            return false;
        }
        for (size_t i = g->own_cap; i < (size_t)rs->n_slots; i++)
            own[i] = -1;
        g->own = own;
        g->own_cap = (size_t)rs->n_slots;
    }
    int32_t *own = g->own;
    int32_t n = rs->n_seqs, nc = rs->n_ckpt;
    const int32_t *dst = rs->dst_slot.host, *ck = rs->ckpt_slot.host;
    /* a slot written by two groups (which the view check refuses) keeps
     * its first writer; a source aliasing it then counts for both */
    bool two = false;
    for (int32_t o = 0; o < n; o++) {
        for (int32_t c = -1; c < (ck ? nc : 0); c++) {
            int32_t sl = c < 0 ? (dst ? dst[o] : -1) : ck[(int64_t)o * nc + c];
            if (sl < 0 || sl >= rs->n_slots)
                continue;
            if (own[sl] >= 0 && own[sl] != o)
                two = true;
            else
                own[sl] = o;
        }
    }
    bool snap = two;
    for (int32_t s = 0; s < n && !snap; s++) {
        int32_t src = rs->src_slot.host[s];
        snap = src >= 0 && src < rs->n_slots && own[src] >= 0 && own[src] != s;
    }
    for (int32_t o = 0; o < n; o++) /* back to all -1 */
        for (int32_t c = -1; c < (ck ? nc : 0); c++) {
            int32_t sl = c < 0 ? (dst ? dst[o] : -1) : ck[(int64_t)o * nc + c];
            if (sl >= 0 && sl < rs->n_slots)
                own[sl] = -1;
        }
    return snap;
}

bool hf_graph_view_recordable(const llmem_view *v)
{
    const llmem_kv_view *kv = llmem_view_kv(v);
    if (kv && kv->shift_slot.n > 0)
        return false;
    /* Snapshot tables (even with every slot -1) pick kernel instances and
     * push words from host contents the key does not hold; one-token views
     * carry none today, so running such a step eagerly costs nothing. */
    return llmem_rs_view_snap(v) == NULL;
}

/* Appends what the ops of one view capture; false when the view's layer
 * must run eagerly (hf_graph_view_recordable). */
static bool put_view(struct hf_graphs *g, const llmem_view *v)
{
    if (!hf_graph_view_recordable(v))
        return false;
    PUT(g, v->kind);
    PUT(g, v->idx);
    size_t idx_size = v->idx ? llmem_buffer_size(v->idx) : 0;
    PUT(g, idx_size);
    if (v->kind == LLMEM_VIEW_KV) {
        const llmem_kv_view *kv = llmem_view_kv(v);
        PUT(g, kv->k);
        PUT(g, kv->v);
        PUT(g, kv->dtype);
        PUT(g, kv->n_pages);
        PUT(g, kv->page_size);
        PUT(g, kv->n_kv_heads);
        PUT(g, kv->head_dim);
        if (kv->page_off.n == 0) /* the rows' stride; unread with page rows */
            PUT(g, kv->max_pages);
        put_table(g, &kv->store_tok, false);
        put_table(g, &kv->store_slot, false);
        /* the persistent page rows: their high-water count grows as rows
         * move, and the kernels read it for nothing but presence */
        PUT(g, kv->page_table.offset);
        bool rows = kv->page_table.n > 0;
        PUT(g, rows);
        put_table(g, &kv->seq_len, false);
        put_table(g, &kv->tok_kv_len, false);
        put_table(g, &kv->tok_seq, true);
        put_table(g, &kv->page_off, false);
        int32_t longest = 0;
        for (int32_t i = 0; kv->tok_kv_len.host && i < kv->tok_kv_len.n; i++)
            longest = kv->tok_kv_len.host[i] > longest ? kv->tok_kv_len.host[i] : longest;
        int32_t bucket = (longest + KV_BUCKET - 1) / KV_BUCKET;
        PUT(g, bucket);
    } else if (v->kind == LLMEM_VIEW_RECURRENT) {
        const llmem_rs_view *rs = llmem_view_rs(v);
        PUT(g, rs->n_states);
        PUT(g, rs->desc);
        for (int32_t j = 0; j < rs->n_states; j++)
            PUT(g, rs->state[j]);
        PUT(g, rs->n_slots);
        PUT(g, rs->n_seqs);
        PUT(g, rs->n_seq_tokens);
        PUT(g, rs->n_ckpt);
        put_table(g, &rs->src_slot, false);
        put_table(g, &rs->dst_slot, false);
        put_table(g, &rs->ckpt_slot, false);
        bool snap = needs_snapshot(g, rs);
        PUT(g, snap);
    }
    return true;
}

/* Builds the key of ub's step into g->kb; false when it must run eagerly. */
static bool build_key(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab, llmem_status *st)
{
    struct hf_graphs *g = m->graphs;
    g->kn = 0;
    g->oom = false;
    PUT(g, m->scratch);
    PUT(g, ub->n_tokens);
    PUT(g, ub->n_outputs);
    PUT(g, n_vocab);
    for (int32_t il = 0; il < m->cfg.n_layers; il++) {
        const layer_w *L = &m->layers[il];
        int32_t ml[2] = {L->mem_layer, L->mem_layer2};
        for (int k = 0; k < 2; k++) {
            if (ml[k] < 0)
                continue;
            llmem_view v = {0};
            if ((*st = llmem_memory_view(m->mem, ml[k], &v)) != LLMEM_OK)
                return false;
            if (!put_view(g, &v))
                return false;
        }
    }
    return !g->oom;
}

static llmem_status step_fn(void *vctx)
{
    const step_ctx *c = vctx;
    return hf_forward_ops(c->m, c->n_tokens, c->n_outputs, c->n_vocab);
}

static void drop(graph *s)
{
    llmem_recording_free(s->rec);
    free(s->key);
    memset(s, 0, sizeof *s);
}

void hf_graphs_free(struct hf_graphs *g)
{
    if (!g)
        return;
    for (int i = 0; i < N_GRAPHS; i++)
        drop(&g->g[i]);
    free(g->kb);
    free(g->own);
    free(g);
}

/* The slot holding the current key, or a fresh slot for it (free, else the
 * least recently used one); NULL on allocation failure. */
static graph *slot_for_key(struct hf_graphs *g)
{
    graph *lru = &g->g[0];
    for (int i = 0; i < N_GRAPHS; i++) {
        graph *s = &g->g[i];
        if (s->key && s->key_len == g->kn && memcmp(s->key, g->kb, g->kn) == 0)
            return s;
        if (!s->key || (lru->key && s->last_use < lru->last_use))
            lru = s;
    }
    drop(lru);
    lru->key = malloc(g->kn);
    if (!lru->key)
        return NULL;
    memcpy(lru->key, g->kb, g->kn);
    lru->key_len = g->kn;
    return lru;
}

llmem_status hf_graph_forward(llmem_model *m, const llmem_ubatch *ub, int32_t n_vocab)
{
    int32_t T = ub->n_tokens, n_out = ub->n_outputs;
    if (!m->graphs) {
        m->graphs = calloc(1, sizeof *m->graphs);
        if (!m->graphs)
            return hf_forward_ops(m, T, n_out, n_vocab);
        m->graphs->off = m->no_graphs; /* read at the model's build (hf_fused_setup) */
    }
    struct hf_graphs *g = m->graphs;
    bool decode = T > 0 && ub->n_seqs == T && (ub->n_seq_tokens <= 1);
    llmem_status st = LLMEM_OK;
    if (g->off || !decode || !build_key(m, ub, n_vocab, &st))
        return st != LLMEM_OK ? st : hf_forward_ops(m, T, n_out, n_vocab);
    graph *s = slot_for_key(g);
    if (!s)
        return hf_forward_ops(m, T, n_out, n_vocab);
    s->last_use = ++g->clock;
    if (s->rec) {
        st = llmem_recording_replay(s->rec);
        if (st == LLMEM_OK) {
            m->stats.n_replayed++;
            return LLMEM_OK;
        }
        if (st != LLMEM_E_STATE)
            return st;
        llmem_recording_free(s->rec); /* the op scratch moved: record again */
        s->rec = NULL;
    }
    /* eager (also the warm-up that sizes the op scratch), then record */
    if ((st = hf_forward_ops(m, T, n_out, n_vocab)) != LLMEM_OK || s->failed)
        return st;
    s->ctx = (step_ctx){.m = m, .n_tokens = T, .n_outputs = n_out, .n_vocab = n_vocab};
    if (llmem_backend_record(m->be, step_fn, &s->ctx, &s->rec) == LLMEM_OK)
        m->stats.n_recorded++;
    else
        s->failed = true, s->rec = NULL;
    return LLMEM_OK;
}

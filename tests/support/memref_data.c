/* The memory reference, part 3: the emulated forward pass that writes a
 * tag into every slot it stores (K/V rows, recurrent states), and the
 * checks after every step (page tables, slots, tokens, positions, stats,
 * checkpoints, data). The views of a ubatch are checked in part 4,
 * memref_views.c.
 *
 * Tag of a K row: (history hash of the token, the position its key was
 * rotated for, salt of child/layer/K); V row: (hash ^ V_XOR, 0, salt);
 * recurrent state: (history hash after `len` tokens, len, salt of
 * child/layer/state). A K-shift in a view adds its delta to the position
 * field, the way RoPE re-rotation moves a key. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/memref_impl.h"

#define V_XOR 0x5bd1e9955bd1e995ull
#define TAG_BYTES 16

bool mr_fail(char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return false;
}

static uint32_t salt_kv(int32_t c, int32_t li, int32_t is_v)
{
    return 0x4b000000u | (uint32_t)c << 12 | (uint32_t)li << 4 | (uint32_t)is_v;
}

static uint32_t salt_rs(int32_t c, int32_t li, int32_t j)
{
    return 0x53000000u | (uint32_t)c << 12 | (uint32_t)li << 4 | (uint32_t)j;
}

static void tag_put(uint8_t *row, uint64_t h, int32_t a, uint32_t salt)
{
    memcpy(row, &h, 8);
    memcpy(row + 8, &a, 4);
    memcpy(row + 12, &salt, 4);
}

static bool tag_eq(const uint8_t *row, uint64_t h, int32_t a, uint32_t salt)
{
    uint8_t want[TAG_BYTES];
    tag_put(want, h, a, salt);
    return memcmp(row, want, TAG_BYTES) == 0;
}

static void tag_get(const uint8_t *row, uint64_t *h, int32_t *a, uint32_t *salt)
{
    memcpy(h, row, 8);
    memcpy(a, row + 8, 4);
    memcpy(salt, row + 12, 4);
}

static uint64_t h_at(const memref *r, int32_t seq, int32_t len)
{
    return len > 0 ? r->seq[seq].v[len - 1].h : MR_H0;
}

/* --- the forward pass ---------------------------------------------------------------- */

static bool put_row(llmem_buffer *b, size_t off, uint64_t h, int32_t a, uint32_t salt)
{
    uint8_t row[TAG_BYTES];
    tag_put(row, h, a, salt);
    return llmem_buffer_upload(b, off, row, sizeof row) == LLMEM_OK;
}

bool memref_forward(memref *r, const llmem_ubatch *ub, char *err, size_t n)
{
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            size_t rb = ch->kv.row_bytes;
            for (int32_t li = 0; li < ch->n_layers; li++) {
                llmem_buffer *K = ch->kv.k[li], *V = ch->kv.v[li];
                for (int32_t m = 0; m < ch->n_shift; m++) {
                    uint8_t row[TAG_BYTES];
                    uint64_t h;
                    int32_t a;
                    uint32_t salt;
                    size_t off = (size_t)ch->shift_slot[m] * rb;
                    if (llmem_buffer_download(K, off, row, sizeof row) != LLMEM_OK)
                        return mr_fail(err, n, "download failed");
                    tag_get(row, &h, &a, &salt);
                    if (!put_row(K, off, h, a + ch->shift_delta[m], salt))
                        return mr_fail(err, n, "upload failed");
                }
                for (int32_t j = 0; j < ch->n_st; j++) {
                    const mr_store *x = &ch->st[j];
                    size_t off = (size_t)x->slot * rb;
                    if (!put_row(K, off, x->h, x->pos, salt_kv(c, li, 0)) ||
                        !put_row(V, off, x->h ^ V_XOR, 0, salt_kv(c, li, 1)))
                        return mr_fail(err, n, "upload failed");
                }
            }
            continue;
        }
        mr_rs *rs = &ch->rs;
        for (int32_t li = 0; li < ch->n_layers; li++)
            for (int32_t j = 0; j < rs->n_states; j++) {
                llmem_buffer *B = rs->buf[li][j];
                size_t sb = rs->bytes[j];
                /* every source is read before anything is written */
                for (int32_t s = 0; s < ch->n_str; s++) {
                    const mr_stream *x = &ch->str[s];
                    uint8_t row[TAG_BYTES];
                    if (x->src < 0)
                        continue;
                    if (llmem_buffer_download(B, (size_t)x->src * sb, row, sizeof row) != LLMEM_OK)
                        return mr_fail(err, n, "download failed");
                    if (!tag_eq(row, x->h0, x->L, salt_rs(c, li, j)))
                        return mr_fail(err, n, "child %d layer %d: source slot %d of sequence %d "
                                               "does not hold its state after %d tokens",
                                       c, li, x->src, x->primary, x->L);
                }
                for (int32_t s = 0; s < ch->n_str; s++) {
                    const mr_stream *x = &ch->str[s];
                    uint64_t h = x->h0;
                    for (int32_t t = 0; t < x->T; t++) {
                        h = memref_mix(h, ub->token[s * x->T + t]);
                        int32_t len = x->L + t + 1, k = len - (x->L + x->T - x->c);
                        int32_t slot = len == x->L + x->T ? x->dst : k >= 0 ? x->ckpt[k] : -1;
                        if (slot >= 0 && !put_row(B, (size_t)slot * sb, h, len, salt_rs(c, li, j)))
                            return mr_fail(err, n, "upload failed");
                    }
                }
            }
    }
    return true;
}

/* --- after every step ---------------------------------------------------------------- */

bool memref_bind(memref *r, char *err, size_t n)
{
    int32_t buf[4096];
    for (int32_t c = 0; c < r->n_ch; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            mr_kv *kv = &ch->kv;
            for (int32_t s = 0; s < r->n_seq; s++) {
                int32_t np = llmem_kv_cache_page_table(ch->mem, s, buf, 4096);
                if (np != kv->tab[s].n)
                    return mr_fail(err, n, "child %d seq %d: %d pages, expected %d", c, s, np,
                                   kv->tab[s].n);
                for (int32_t k = 0; k < np; k++) {
                    mr_page *p = &kv->pg[kv->tab[s].v[k]];
                    if (buf[k] < 0 || buf[k] >= kv->n_pages)
                        return mr_fail(err, n, "child %d seq %d: page id %d", c, s, buf[k]);
                    if (p->phys < 0) {
                        for (int32_t a = 0; a < kv->n_pg; a++)
                            if (kv->pg[a].live && kv->pg[a].phys == buf[k])
                                return mr_fail(err, n, "child %d seq %d page %d: new page %d is "
                                                       "still %s in the reference",
                                               c, s, k, buf[k],
                                               kv->pg[a].ref ? "held" : "cached (wrong eviction?)");
                        p->phys = buf[k];
                    } else if (p->phys != buf[k]) {
                        return mr_fail(err, n, "child %d seq %d page %d: page %d, expected %d "
                                               "(sharing or copy-on-write differs)",
                                       c, s, k, buf[k], p->phys);
                    }
                }
            }
            for (int32_t a = 0; a < kv->n_pg; a++)
                for (int32_t b = 0; b < a; b++)
                    if (kv->pg[a].live && kv->pg[b].live && kv->pg[a].phys >= 0 &&
                        kv->pg[a].phys == kv->pg[b].phys)
                        return mr_fail(err, n, "child %d: page %d stands for two reference pages",
                                       c, kv->pg[a].phys);
            continue;
        }
        mr_rs *rs = &ch->rs;
        for (int32_t s = 0; s < r->n_seq; s++) {
            int32_t len = r->seq[s].n, cur = llmem_recurrent_seq_slot(ch->mem, s);
            for (int32_t i = 0; i < rs->nh[s]; i++) {
                mr_hold *h = &rs->h[s][i];
                if (h->slot < 0 && h->len == len)
                    h->slot = cur;
                if (h->slot < 0)
                    return mr_fail(err, n, "child %d seq %d: state after %d tokens has no slot", c,
                                   s, h->len);
                if (h->len == len && h->slot != cur)
                    return mr_fail(err, n, "child %d seq %d: current slot %d, expected %d", c, s,
                                   cur, h->slot);
            }
            if (len == 0 && cur != -1)
                return mr_fail(err, n, "child %d seq %d: empty but slot %d", c, s, cur);
            for (int32_t i = 0; i < rs->nh[s]; i++)
                for (int32_t q = 0; q <= s; q++)
                    for (int32_t k = 0; k < (q == s ? i : rs->nh[q]); k++)
                        if (rs->h[q][k].slot == rs->h[s][i].slot)
                            return mr_fail(err, n, "child %d: slot %d held twice", c,
                                           rs->h[s][i].slot);
        }
    }
    return true;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* A bounded reader over one section of a state stream. */
typedef struct rdr {
    const uint8_t *p, *end;
    bool bad;
} rdr;

static const uint8_t *take(rdr *x, size_t k)
{
    if (x->bad || k > (size_t)(x->end - x->p)) {
        x->bad = true;
        return NULL;
    }
    const uint8_t *q = x->p;
    x->p += k;
    return q;
}

static int32_t take32(rdr *x)
{
    const uint8_t *q = take(x, 4);
    return q ? (int32_t)rd32(q) : 0;
}

/* Positions are visible only through the state stream: parse every
 * section's entries and compare (docs/state-format.md). */
static bool compare_stream(memref *r, char *err, size_t n)
{
    size_t size = 0, got = 0;
    if (llmem_memory_state_size(r->mem, -1, &size) != LLMEM_OK || size < 24)
        return mr_fail(err, n, "state_size failed");
    uint8_t *b = malloc(size);
    if (!b || llmem_memory_state_write(r->mem, -1, b, size, &got) != LLMEM_OK || got != size) {
        free(b);
        return mr_fail(err, n, "state_write failed or wrote %zu of %zu bytes", got, size);
    }
    bool ok = rd32(b + 12) == (uint32_t)r->n_ch || mr_fail(err, n, "state stream: section count");
    size_t at = 16;
    for (int32_t c = 0; ok && c < r->n_ch; c++) {
        const mr_child *ch = &r->ch[c];
        uint64_t len = at + 16 <= size - 8 ? rd64(b + at) : UINT64_MAX;
        if (len > size - 8 - at - 16) {
            ok = mr_fail(err, n, "state stream: section %d does not fit", c);
            break;
        }
        rdr x = {b + at + 16, b + at + 16 + len, false};
        at += 16 + (size_t)len;
        if (ch->cfg.kv) {
            take(&x, 16);
        } else {
            int32_t nl = take32(&x);
            for (int32_t il = 0; il < nl && !x.bad; il++) {
                int32_t ns = take32(&x);
                for (int32_t j = 0; j < ns && !x.bad; j++) {
                    take32(&x);
                    take(&x, 4 * (size_t)(uint32_t)take32(&x));
                }
            }
        }
        int32_t ne = take32(&x), live = 0;
        for (int32_t s = 0; s < r->n_seq; s++)
            live += r->seq[s].n > 0;
        if (ne != live) {
            ok = mr_fail(err, n, "child %d: state stream has %d sequences, expected %d", c, ne,
                         live);
            break;
        }
        for (int32_t e = 0; ok && e < ne; e++) {
            int32_t s = take32(&x), l = take32(&x);
            if (x.bad || s < 0 || s >= r->n_seq || l != r->seq[s].n) {
                ok = mr_fail(err, n, "child %d: stream entry %d: seq %d len %d", c, e, s, l);
                break;
            }
            if (ch->cfg.kv) { /* page sharing: the rule of memref_save, from the tables */
                int32_t from = take32(&x), shared = take32(&x), wf = -1, ws = 0;
                const mr_ilist *a = &ch->kv.tab[s];
                for (int32_t s2 = 0, i = 0; s2 < s && l > 0 && wf < 0; s2++) {
                    const mr_ilist *o = &ch->kv.tab[s2];
                    if (r->seq[s2].n == 0)
                        continue;
                    if (o->n > 0 && a->n > 0 && o->v[0] == a->v[0]) {
                        int32_t k = 0;
                        while (k < a->n && k < o->n && a->v[k] == o->v[k])
                            k++;
                        ws = k * ch->kv.ps < l ? k * ch->kv.ps : l;
                        ws = ws < r->seq[s2].n ? ws : r->seq[s2].n;
                        wf = i;
                    }
                    i++;
                }
                if (!x.bad && (from != wf || shared != ws)) {
                    ok = mr_fail(err, n, "child %d seq %d: stream shares %d tokens with entry %d, "
                                         "expected %d with %d", c, s, shared, from, ws, wf);
                    break;
                }
            }
            const uint8_t *q = take(&x, (ch->cfg.kv ? 12 : 8) * (size_t)l);
            for (int32_t j = 0; q && ok && j < l; j++) {
                const mr_tok *t = &r->seq[s].v[j];
                int32_t tok = (int32_t)rd32(q + 4 * (size_t)j);
                int32_t pos = (int32_t)rd32(q + 4 * ((size_t)l + (size_t)j));
                int32_t sh = ch->cfg.kv ? (int32_t)rd32(q + 4 * (2 * (size_t)l + (size_t)j))
                                        : t->pos - t->kpos;
                if (tok != t->token || pos != t->pos || sh != t->pos - t->kpos)
                    ok = mr_fail(err, n, "child %d seq %d token %d: (%d @ %d, pending shift %d), "
                                         "expected (%d @ %d, %d)",
                                 c, s, j, tok, pos, sh, t->token, t->pos, t->pos - t->kpos);
            }
            if (ch->cfg.kv)
                take(&x, (size_t)l * ch->kv.row_bytes * 2 * (size_t)ch->n_layers);
            else if (l > 0)
                take(&x, (ch->rs.bytes[0] + (ch->rs.n_states > 1 ? ch->rs.bytes[1] : 0)) *
                             (size_t)ch->n_layers);
        }
        if (ok && (x.bad || x.p != x.end))
            ok = mr_fail(err, n, "child %d: state section is %s than its entries", c,
                         x.bad ? "shorter" : "longer");
    }
    free(b);
    return ok;
}

bool memref_compare(memref *r, char *err, size_t n)
{
    int32_t buf[4096];
    for (int32_t s = 0; s < r->n_seq; s++) {
        const mr_seqv *q = &r->seq[s];
        int32_t len = llmem_memory_seq_tokens(r->mem, s, buf, 4096);
        if (len != q->n || llmem_memory_seq_len(r->mem, s) != q->n)
            return mr_fail(err, n, "seq %d: %d tokens, expected %d", s, len, q->n);
        for (int32_t j = 0; j < len; j++)
            if (buf[j] != q->v[j].token)
                return mr_fail(err, n, "seq %d token %d: id %d, expected %d", s, j, buf[j],
                               q->v[j].token);
        if (llmem_memory_seq_pos_min(r->mem, s) != memref_pos_min(r, s) ||
            llmem_memory_seq_pos_max(r->mem, s) != memref_pos_max(r, s))
            return mr_fail(err, n, "seq %d: positions [%d, %d], expected [%d, %d]", s,
                           llmem_memory_seq_pos_min(r->mem, s), llmem_memory_seq_pos_max(r->mem, s),
                           memref_pos_min(r, s), memref_pos_max(r, s));
        for (int32_t c = 0; c < r->n_ch; c++) {
            const mr_child *ch = &r->ch[c];
            if (ch->cfg.kv)
                continue;
            int32_t want[MR_MAX_HOLD], nw = 0;
            for (int32_t i = 0; i < ch->rs.nh[s]; i++)
                if (ch->rs.h[s][i].len != q->n)
                    want[nw++] = q->v[ch->rs.h[s][i].len - 1].pos;
            int32_t nc = llmem_recurrent_checkpoints(ch->mem, s, buf, 4096);
            if (nc != nw)
                return mr_fail(err, n, "seq %d: %d checkpoints, expected %d", s, nc, nw);
            for (int32_t i = 0; i < nw; i++) {
                bool found = false;
                for (int32_t k = 0; k < nc && !found; k++)
                    if (buf[k] == want[i]) {
                        found = true;
                        buf[k] = INT32_MIN;
                    }
                if (!found)
                    return mr_fail(err, n, "seq %d: no checkpoint at position %d", s, want[i]);
            }
        }
    }
    llmem_memory_stats a, b;
    if (llmem_memory_get_stats(r->mem, &a) != LLMEM_OK)
        return mr_fail(err, n, "get_stats failed");
    memref_stats(r, &b);
    if (a.pages_total != b.pages_total || a.pages_used != b.pages_used ||
        a.pages_free != b.pages_free || a.pages_cached != b.pages_cached ||
        a.slots_total != b.slots_total || a.slots_used != b.slots_used ||
        a.prefix_hit_tokens != b.prefix_hit_tokens || a.prefix_evictions != b.prefix_evictions ||
        a.cow_copies != b.cow_copies || a.n_seqs_live != b.n_seqs_live)
        return mr_fail(err, n,
                       "stats: pages total/used/free/cached %lld/%lld/%lld/%lld slots %lld/%lld "
                       "hits %lld evictions %lld copies %lld live %d; expected %lld/%lld/%lld/%lld "
                       "slots %lld/%lld hits %lld evictions %lld copies %lld live %d",
                       (long long)a.pages_total, (long long)a.pages_used, (long long)a.pages_free,
                       (long long)a.pages_cached, (long long)a.slots_total, (long long)a.slots_used,
                       (long long)a.prefix_hit_tokens, (long long)a.prefix_evictions,
                       (long long)a.cow_copies, a.n_seqs_live, (long long)b.pages_total,
                       (long long)b.pages_used, (long long)b.pages_free, (long long)b.pages_cached,
                       (long long)b.slots_total, (long long)b.slots_used,
                       (long long)b.prefix_hit_tokens, (long long)b.prefix_evictions,
                       (long long)b.cow_copies, b.n_seqs_live);
    if (a.snapshots != b.snapshots || a.snapshot_bytes != b.snapshot_bytes ||
        a.snapshot_evictions != b.snapshot_evictions ||
        a.snapshot_hit_tokens != b.snapshot_hit_tokens ||
        a.cached_kv_bytes != b.cached_kv_bytes || a.prefix_cache_bytes != b.prefix_cache_bytes)
        return mr_fail(err, n,
                       "stats: snapshots %lld (%lld bytes, %lld evicted, %lld hit tokens), cached "
                       "KV %lld bytes, budget %lld; expected %lld (%lld, %lld, %lld), %lld, %lld",
                       (long long)a.snapshots, (long long)a.snapshot_bytes,
                       (long long)a.snapshot_evictions, (long long)a.snapshot_hit_tokens,
                       (long long)a.cached_kv_bytes, (long long)a.prefix_cache_bytes,
                       (long long)b.snapshots, (long long)b.snapshot_bytes,
                       (long long)b.snapshot_evictions, (long long)b.snapshot_hit_tokens,
                       (long long)b.cached_kv_bytes, (long long)b.prefix_cache_bytes);
    if (b.prefix_cache_bytes > 0 && b.cached_kv_bytes + b.snapshot_bytes > b.prefix_cache_bytes &&
        !r->plan.active)
        return mr_fail(err, n,
                       "%lld cached page bytes + %lld snapshot bytes exceed the budget of %lld",
                       (long long)b.cached_kv_bytes, (long long)b.snapshot_bytes,
                       (long long)b.prefix_cache_bytes);
    char cerr[256] = "";
    if (llmem_memory_check(r->mem, cerr, sizeof cerr) != LLMEM_OK)
        return mr_fail(err, n, "llmem_memory_check: %s", cerr);
    if (!r->plan.active && !compare_stream(r, err, n))
        return false;
    return true;
}

bool memref_verify(memref *r, char *err, size_t n)
{
    bool ok = true;
    for (int32_t c = 0; c < r->n_ch && ok; c++) {
        mr_child *ch = &r->ch[c];
        if (ch->cfg.kv) {
            mr_kv *kv = &ch->kv;
            size_t rb = kv->row_bytes, size = llmem_buffer_size(kv->k[0]);
            uint8_t *K = malloc(size), *V = malloc(size);
            for (int32_t li = 0; ok && li < ch->n_layers; li++) {
                if (!K || !V || llmem_buffer_download(kv->k[li], 0, K, size) != LLMEM_OK ||
                    llmem_buffer_download(kv->v[li], 0, V, size) != LLMEM_OK) {
                    ok = mr_fail(err, n, "download failed");
                    break;
                }
                for (int32_t s = 0; ok && s < r->n_seq; s++)
                    for (int32_t j = 0; ok && j < r->seq[s].n; j++) {
                        const mr_tok *t = &r->seq[s].v[j];
                        size_t slot = (size_t)mr_phys(kv, s, j / kv->ps) * (size_t)kv->ps +
                                      (size_t)(j % kv->ps);
                        const uint8_t *kr = K + slot * rb, *vr = V + slot * rb;
                        if (!tag_eq(kr, t->h, t->kpos, salt_kv(c, li, 0)) ||
                            !tag_eq(vr, t->h ^ V_XOR, 0, salt_kv(c, li, 1))) {
                            uint64_t h;
                            int32_t a;
                            uint32_t salt;
                            tag_get(kr, &h, &a, &salt);
                            ok = mr_fail(err, n,
                                         "child %d layer %d seq %d token %d (slot %zu): K/V "
                                         "data is not its own (key pos %d salt %x, "
                                         "expected %d %x%s)",
                                         c, li, s, j, slot, a, salt, t->kpos, salt_kv(c, li, 0),
                                         h == t->h ? "" : ", other token");
                        }
                    }
            }
            free(K);
            free(V);
            continue;
        }
        mr_rs *rs = &ch->rs;
        for (int32_t li = 0; ok && li < ch->n_layers; li++)
            for (int32_t j = 0; ok && j < rs->n_states; j++) {
                size_t size = llmem_buffer_size(rs->buf[li][j]);
                uint8_t *B = malloc(size);
                if (!B || llmem_buffer_download(rs->buf[li][j], 0, B, size) != LLMEM_OK)
                    ok = mr_fail(err, n, "download failed");
                for (int32_t s = 0; ok && s < r->n_seq; s++)
                    for (int32_t i = 0; ok && i < rs->nh[s]; i++) {
                        const mr_hold *h = &rs->h[s][i];
                        if (!tag_eq(B + (size_t)h->slot * rs->bytes[j], h_at(r, s, h->len), h->len,
                                    salt_rs(c, li, j))) {
                            uint64_t hh;
                            int32_t a;
                            uint32_t salt;
                            tag_get(B + (size_t)h->slot * rs->bytes[j], &hh, &a, &salt);
                            ok = mr_fail(err, n, "child %d layer %d state %d: slot %d of seq %d "
                                                 "should hold the state after %d tokens (holds "
                                                 "%d tokens, salt %x)",
                                         c, li, j, h->slot, s, h->len, a, salt);
                        }
                    }
                /* every snapshot whose slot a hit showed holds its prefix's state */
                for (int32_t i = 0; ok && i < rs->n_snap; i++) {
                    const mr_snap *q = &rs->snap[i];
                    if (q->live && q->slot >= 0 &&
                        !tag_eq(B + (size_t)q->slot * rs->bytes[j], q->h, q->prefix.n,
                                salt_rs(c, li, j)))
                        ok = mr_fail(err, n, "child %d layer %d state %d: snapshot slot %d should "
                                             "hold the state after its %d tokens",
                                     c, li, j, q->slot, q->prefix.n);
                }
                free(B);
            }
    }
    return ok;
}

/* llmem memory/: small shared helpers (growable arrays, index tables,
 * state stream primitives). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory/internal.h"
#include "memory/seq_heap.h"

bool i32vec_reserve(i32vec *a, int32_t cap)
{
    if (a->cap < 0) /* heap-backed (seq_heap.h) */
        return seq_heap_grow(a, cap);
    if (cap <= a->cap)
        return true;
    int32_t ncap = a->cap ? a->cap : 8;
    while (ncap < cap)
        ncap = ncap > INT32_MAX / 2 ? cap : ncap * 2;
    int32_t *nv = realloc(a->v, (size_t)ncap * sizeof *nv);
    if (!nv)
        return false;
    a->v = nv;
    a->cap = ncap;
    return true;
}

void i32_copy(int32_t *dst, const int32_t *src, int32_t n)
{
    if (n > 0)
        memcpy(dst, src, (size_t)n * sizeof *dst);
}

bool llmem_i32vec_push(i32vec *a, int32_t x)
{
    if (!i32vec_reserve(a, a->n + 1))
        return false;
    a->v[a->n++] = x;
    return true;
}

void i32vec_free(i32vec *a)
{
    if (!a)
        return;
    if (a->cap < 0) {
        seq_heap_release(a);
        return;
    }
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

int32_t idx_append(idx_builder *b, const int32_t *vals, int32_t n, int32_t fill)
{
    int32_t off = b->data.n;
    if (n <= 0)
        return off;
    if (!i32vec_reserve(&b->data, b->data.n + n))
        return -1;
    for (int32_t i = 0; i < n; i++)
        b->data.v[off + i] = vals ? vals[i] : fill;
    b->data.n += n;
    return off;
}

llmem_status idx_ensure(llmem_backend *be, llmem_buffer **buf, int32_t n)
{
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(int32_t);
    if (*buf && llmem_buffer_size(*buf) >= bytes)
        return LLMEM_OK;
    llmem_buffer *nb = NULL;
    /* grow geometrically so steady-state plans never allocate */
    size_t want = bytes < 4096 ? 4096 : bytes + bytes / 2;
    llmem_status st = llmem_buffer_alloc(be, want, &nb);
    if (st != LLMEM_OK)
        return st;
    llmem_buffer_free(*buf);
    *buf = nb;
    return LLMEM_OK;
}

llmem_status idx_upload(llmem_buffer *buf, const idx_builder *b)
{
    if (b->data.n == 0)
        return LLMEM_OK;
    return llmem_buffer_upload(buf, 0, b->data.v, (size_t)b->data.n * sizeof(int32_t));
}

llmem_i32_table idx_table(const idx_builder *b, int32_t off, int32_t n)
{
    llmem_i32_table t = {0};
    if (n <= 0)
        return t;
    t.host = b->data.v + off;
    t.offset = (size_t)off * sizeof(int32_t);
    t.n = n;
    return t;
}

bool llmem_env_poison(void)
{
    const char *s = getenv("LLMEM_POISON");
    return s && *s && strcmp(s, "0") != 0;
}

void llmem_state_put(llmem_state_writer *w, const void *data, size_t n)
{
    if (w->buf && w->len + n <= w->cap && n)
        memcpy(w->buf + w->len, data, n);
    w->len += n;
}

void llmem_state_put_i32(llmem_state_writer *w, int32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)((uint32_t)v >> 8), (uint8_t)((uint32_t)v >> 16),
                    (uint8_t)((uint32_t)v >> 24)};
    llmem_state_put(w, b, 4);
}

bool llmem_state_get(llmem_state_reader *r, void *data, size_t n)
{
    if (r->failed || n > r->len - r->pos) {
        r->failed = true;
        return false;
    }
    if (data && n)
        memcpy(data, r->buf + r->pos, n);
    r->pos += n;
    return true;
}

bool llmem_state_get_i32(llmem_state_reader *r, int32_t *v)
{
    uint8_t b[4];
    if (!llmem_state_get(r, b, 4))
        return false;
    *v = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                   (uint32_t)b[3] << 24);
    return true;
}

void *llmem_state_reserve(llmem_state_writer *w, size_t n)
{
    void *p = (w->buf && w->len + n <= w->cap) ? w->buf + w->len : NULL;
    w->len += n;
    return p;
}

const void *llmem_state_peek(llmem_state_reader *r, size_t n)
{
    if (r->failed || n > r->len - r->pos) {
        r->failed = true;
        return NULL;
    }
    const void *p = r->buf + r->pos;
    r->pos += n;
    return p;
}

void pos_meta_reset(pos_meta *m, const i32vec *pos)
{
    *m = (pos_meta){-1, -1, false};
    for (int32_t j = 0; j < pos->n; j++) {
        int32_t p = pos->v[j];
        if (j > 0 && p < pos->v[j - 1])
            m->unsorted = true;
        if (m->min < 0 || p < m->min)
            m->min = p;
        if (p > m->max)
            m->max = p;
    }
}

void llmem_pos_meta_push(llmem_pos_meta *m, int32_t pos)
{
    pos_meta_push(m, pos);
}

void pos_meta_truncated(pos_meta *m, const i32vec *pos)
{
    if (pos->n == 0)
        *m = (pos_meta){-1, -1, false};
    else if (!m->unsorted)
        *m = (pos_meta){pos->v[0], pos->v[pos->n - 1], false};
    else
        pos_meta_reset(m, pos);
}

/* First index with pos->v[i] >= x (positions in order). */
static int32_t lower_bound(const i32vec *pos, int32_t x)
{
    int32_t lo = 0, hi = pos->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (pos->v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int32_t pos_suffix_start(const i32vec *pos, const pos_meta *m, int32_t p0, int32_t p1)
{
    int32_t n = pos->n, first = n;
    if (!m->unsorted) {
        int32_t lo = lower_bound(pos, p0), hi = lower_bound(pos, p1);
        return hi <= lo ? n : hi == n ? lo : -1;
    }
    for (int32_t j = 0; j < n && first == n; j++)
        if (pos_in_range(pos->v[j], p0, p1))
            first = j;
    for (int32_t j = first; j < n; j++)
        if (!pos_in_range(pos->v[j], p0, p1))
            return -1;
    return first;
}

int32_t pos_prefix_len(const i32vec *pos, const pos_meta *m, int32_t p0, int32_t p1)
{
    int32_t n = pos->n, k = 0;
    if (!m->unsorted) {
        int32_t lo = lower_bound(pos, p0), hi = lower_bound(pos, p1);
        return hi <= lo ? 0 : lo == 0 ? hi : -1;
    }
    while (k < n && pos_in_range(pos->v[k], p0, p1))
        k++;
    for (int32_t j = k; j < n; j++)
        if (pos_in_range(pos->v[j], p0, p1))
            return -1;
    return k;
}

bool pos_meta_ok(const pos_meta *m, const i32vec *pos)
{
    pos_meta t;
    pos_meta_reset(&t, pos);
    /* unsorted may stay set after positions came back in order */
    return t.min == m->min && t.max == m->max && (m->unsorted || !t.unsorted);
}

int32_t seq_copy_tokens(const i32vec *tokens, int32_t *out, int32_t cap)
{
    if (out)
        i32_copy(out, tokens->v, tokens->n < cap ? tokens->n : cap);
    return tokens->n;
}

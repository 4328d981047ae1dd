/* llmem memory/: small shared helpers (growable arrays, index tables,
 * state stream primitives). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory/internal.h"

bool i32vec_reserve(i32vec *a, int32_t cap)
{
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

bool i32vec_push(i32vec *a, int32_t x)
{
    if (!i32vec_reserve(a, a->n + 1))
        return false;
    a->v[a->n++] = x;
    return true;
}

void i32vec_free(i32vec *a)
{
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

int32_t llmem_pages_for(int32_t len, int32_t n, int32_t page_size)
{
    if (len < 0 || n <= 0 || page_size <= 0)
        return 0;
    int64_t have = ((int64_t)len + page_size - 1) / page_size;
    int64_t need = ((int64_t)len + n + page_size - 1) / page_size;
    return (int32_t)(need - have);
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

int32_t seq_pos_min(const i32vec *pos)
{
    int32_t m = -1;
    for (int32_t j = 0; j < pos->n; j++)
        if (m < 0 || pos->v[j] < m)
            m = pos->v[j];
    return m;
}

int32_t seq_pos_max(const i32vec *pos)
{
    int32_t m = -1;
    for (int32_t j = 0; j < pos->n; j++)
        if (pos->v[j] > m)
            m = pos->v[j];
    return m;
}

int32_t seq_copy_tokens(const i32vec *tokens, int32_t *out, int32_t cap)
{
    if (out)
        i32_copy(out, tokens->v, tokens->n < cap ? tokens->n : cap);
    return tokens->n;
}

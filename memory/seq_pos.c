/* llmem memory/: a sequence's positions, kept as a run while they are one
 * (seq_pos.h). */
#include "memory/seq_pos.h"

bool seq_pos_store(seq_pos *p, int32_t extra)
{
    if (p->stored)
        return true;
    int32_t n = p->v.n;
    /* v holds none of the n positions: grow it as an empty vector (a
     * heap-backed one copies v.n entries when it moves) */
    p->v.n = 0;
    if ((int64_t)n + extra > INT32_MAX || !i32vec_reserve(&p->v, n + extra)) {
        p->v.n = n;
        return false;
    }
    for (int32_t j = 0; j < n; j++)
        p->v.v[j] = p->pm.min + j;
    p->v.n = n;
    p->stored = true;
    return true;
}

bool seq_pos_reserve(seq_pos *p, int32_t cap)
{
    if (p->stored)
        return i32vec_reserve(&p->v, cap);
    int32_t n = p->v.n;
    p->v.n = 0;
    bool ok = i32vec_reserve(&p->v, cap);
    p->v.n = n;
    return ok;
}

void seq_pos_truncate(seq_pos *p, int32_t k)
{
    if (!p->stored) {
        seq_pos_set_run(p, k, p->pm.min);
        return;
    }
    p->v.n = k;
    pos_meta_truncated(&p->pm, &p->v);
}

/* Whether src[0, n) is first, first + 1, ... */
static bool is_run(const int32_t *src, int32_t n)
{
    for (int32_t j = 1; j < n; j++)
        if (src[j] != src[0] + j)
            return false;
    return true;
}

bool seq_pos_assign(seq_pos *p, const int32_t *src, int32_t n)
{
    if (n == 0 || is_run(src, n)) {
        seq_pos_set_run(p, n, n > 0 ? src[0] : 0);
        return true;
    }
    if (!seq_pos_reserve(p, n))
        return false;
    i32_copy(p->v.v, src, n);
    p->v.n = n;
    p->stored = true;
    pos_meta_reset(&p->pm, &p->v);
    return true;
}

void seq_pos_written(seq_pos *p, int32_t n)
{
    if (n == 0 || is_run(p->v.v, n)) {
        seq_pos_set_run(p, n, n > 0 ? p->v.v[0] : 0);
        return;
    }
    p->v.n = n;
    p->stored = true;
    pos_meta_reset(&p->pm, &p->v);
}

bool seq_pos_copy_prefix(seq_pos *dst, const seq_pos *src, int32_t k)
{
    if (!src->stored) {
        seq_pos_set_run(dst, k, src->pm.min);
        return true;
    }
    return seq_pos_assign(dst, src->v.v, k);
}

void seq_pos_get(const seq_pos *p, int32_t *out, int32_t n)
{
    if (p->stored) {
        i32_copy(out, p->v.v, n);
        return;
    }
    for (int32_t j = 0; j < n; j++)
        out[j] = p->pm.min + j;
}

void seq_pos_put(const seq_pos *p, llmem_state_writer *w, int32_t n)
{
    if (p->stored) {
        llmem_state_put(w, p->v.v, (size_t)n * sizeof(int32_t));
        return;
    }
    int32_t buf[256];
    for (int32_t j = 0; j < n; j += 256) {
        int32_t m = n - j < 256 ? n - j : 256;
        for (int32_t i = 0; i < m; i++)
            buf[i] = p->pm.min + j + i;
        llmem_state_put(w, buf, (size_t)m * sizeof(int32_t));
    }
}

/* Indices [*lo, *hi) of a run's tokens with a position in [p0, p1). */
static void run_range(const seq_pos *p, int32_t p0, int32_t p1, int32_t *lo, int32_t *hi)
{
    int64_t n = p->v.n, a = (int64_t)p0 - p->pm.min, b = (int64_t)p1 - p->pm.min;
    *lo = (int32_t)(a < 0 ? 0 : a > n ? n : a);
    *hi = (int32_t)(b < 0 ? 0 : b > n ? n : b);
}

int32_t seq_pos_suffix_start(const seq_pos *p, int32_t p0, int32_t p1)
{
    if (p->stored)
        return pos_suffix_start(&p->v, &p->pm, p0, p1);
    int32_t lo, hi, n = p->v.n;
    run_range(p, p0, p1, &lo, &hi);
    return hi <= lo ? n : hi == n ? lo : -1;
}

int32_t seq_pos_prefix_len(const seq_pos *p, int32_t p0, int32_t p1)
{
    if (p->stored)
        return pos_prefix_len(&p->v, &p->pm, p0, p1);
    int32_t lo, hi;
    run_range(p, p0, p1, &lo, &hi);
    return hi <= lo ? 0 : lo == 0 ? hi : -1;
}

void seq_pos_meta_reset(seq_pos *p)
{
    if (p->stored)
        pos_meta_reset(&p->pm, &p->v);
}

bool seq_pos_ok(const seq_pos *p)
{
    if (p->stored) {
        for (int32_t j = 0; j < p->v.n; j++)
            if (p->v.v[j] < 0)
                return false;
        return pos_meta_ok(&p->pm, &p->v);
    }
    if (p->v.n == 0)
        return p->pm.min == -1 && p->pm.max == -1;
    return p->pm.min >= 0 && !p->pm.unsorted && (int64_t)p->pm.max == (int64_t)p->pm.min + p->v.n - 1;
}

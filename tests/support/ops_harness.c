/* llmem tests: helpers of the op conformance suites (see ops_harness.h). */
#include "support/ops_harness.h"
#include "support/run.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- backends ------------------------------------------------------------------------- */

static char g_names[TH_MAX_BACKENDS][32];
static int g_n_names = -1;

int th_backends_probe(void)
{
    if (g_n_names >= 0)
        return g_n_names;
    g_n_names = 0;
    const char *env = getenv("LLMEM_TEST_BACKENDS");
    char list[256];
    snprintf(list, sizeof list, "%s", env && *env ? env : "cpu,vulkan,cuda");
    for (char *tok = list, *end; tok && *tok && g_n_names < TH_MAX_BACKENDS; tok = end) {
        end = strchr(tok, ',');
        if (end)
            *end++ = '\0';
        if (!*tok)
            continue;
        if (strlen(tok) >= sizeof g_names[0]) {
            printf("ops: skipping backend %s: name longer than %zu bytes\n", tok,
                   sizeof g_names[0] - 1);
            continue;
        }
        char err[256] = "";
        llmem_backend *be = NULL;
        llmem_status st = llmem_backend_open(tok, -1, &be, err, sizeof err);
        if (st != LLMEM_OK) {
            printf("ops: skipping backend %s: %s (%s)\n", tok, err[0] ? err : "no reason given",
                   llmem_status_str(st));
            continue;
        }
        llmem_backend_close(be);
        memcpy(g_names[g_n_names++], tok, strlen(tok) + 1); /* fits: checked above */
        printf("ops: testing backend %s\n", tok);
    }
    fflush(stdout);
    return g_n_names;
}

int th_backends_count(void)
{
    return g_n_names < 0 ? 0 : g_n_names;
}

const char *th_backend_name(int i)
{
    ck_assert(i >= 0 && i < th_backends_count());
    return g_names[i];
}

bool th_is_cpu(int i)
{
    return strcmp(th_backend_name(i), "cpu") == 0;
}

llmem_backend *th_open(int i)
{
    return test_open(th_backend_name(i));
}

llmem_backend *th_open_cpu(void)
{
    return test_open("cpu");
}

/* ---- buffers -------------------------------------------------------------------------- */

void th_begin(th_ctx *c, llmem_backend *be)
{
    memset(c, 0, sizeof *c);
    c->be = be;
}

void *th_keep(th_ctx *c, void *p)
{
    ck_assert_int_lt(c->n_keep, TH_MAX_BUFS);
    c->keep[c->n_keep++] = p;
    return p;
}

void *th_alloc(th_ctx *c, size_t bytes)
{
    void *p = calloc(1, bytes > 0 ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    return th_keep(c, p);
}

double *th_vec(th_ctx *c, int64_t n)
{
    return th_alloc(c, (size_t)(n > 0 ? n : 1) * sizeof(double));
}

double *th_rand(th_ctx *c, ref64_rng *r, int64_t n, double lo, double hi, llmem_dtype t)
{
    double *v = th_vec(c, n);
    ref64_fill(r, v, n, lo, hi, t);
    return v;
}

static size_t round4(size_t n)
{
    return (n + 3) / 4 * 4;
}

static llmem_buffer *new_buffer(th_ctx *c, size_t data_off, size_t data_bytes, size_t size,
                                llmem_dtype t)
{
    ck_assert_int_lt(c->n, TH_MAX_BUFS);
    llmem_buffer *buf = NULL;
    llmem_status st = llmem_buffer_alloc(c->be, size, &buf);
    ck_assert_msg(st == LLMEM_OK, "buffer of %zu bytes: %s", size, llmem_status_str(st));
    uint32_t pattern = llmem_nan_pattern(t == LLMEM_DTYPE_I32 ? LLMEM_DTYPE_F32 : t);
    ck_assert_int_eq(llmem_buffer_fill(buf, 0, size, pattern), LLMEM_OK);
    c->b[c->n].buf = buf;
    c->b[c->n].data_off = data_off;
    c->b[c->n].data_bytes = data_bytes;
    c->b[c->n].size = size;
    c->b[c->n].pattern = pattern;
    c->n++;
    return buf;
}

llmem_tensor th_tensor(th_ctx *c, llmem_dtype t, int n_dims, int32_t n0, int32_t n1, int32_t n2)
{
    llmem_tensor x = {0};
    x.dtype = t;
    x.n_dims = n_dims;
    x.ne[0] = n0;
    x.ne[1] = n1;
    x.ne[2] = n2;
    x.ne[3] = 1;
    for (int i = n_dims; i < LLMEM_TENSOR_MAX_DIMS; i++)
        x.ne[i] = 1;
    size_t bytes = llmem_tensor_nbytes(&x);
    x.offset = TH_GUARD;
    x.buf = new_buffer(c, TH_GUARD, bytes, TH_GUARD + round4(bytes) + TH_GUARD, t);
    return x;
}

llmem_buffer *th_pool(th_ctx *c, size_t bytes, llmem_dtype t)
{
    size_t size = round4(bytes);
    return new_buffer(c, 0, size, size, t);
}

void th_end(th_ctx *c)
{
    for (int i = 0; i < c->n; i++) {
        size_t size = c->b[i].size;
        unsigned char *h = malloc(size);
        ck_assert_ptr_nonnull(h);
        ck_assert_int_eq(llmem_buffer_download(c->b[i].buf, 0, h, size), LLMEM_OK);
        unsigned char pat[4];
        memcpy(pat, &c->b[i].pattern, 4);
        size_t lo = c->b[i].data_off, hi = lo + c->b[i].data_bytes;
        /* (Check records every passing assertion: test first, assert on failure.) */
        for (size_t j = 0; j < size; j++)
            if ((j < lo || j >= hi) && h[j] != pat[j % 4])
                ck_abort_msg("buffer %d: guard byte %zu changed (data [%zu, %zu)), seed %llu", i, j,
                             lo, hi, (unsigned long long)ref64_seed());
        free(h);
        llmem_buffer_free(c->b[i].buf);
    }
    for (int i = 0; i < c->n_keep; i++)
        free(c->keep[i]);
    c->n = c->n_keep = 0;
}

void th_set(const llmem_tensor *t, const double *v)
{
    int64_t n = llmem_tensor_nelements(t);
    size_t es = llmem_dtype_size(t->dtype);
    unsigned char *h = malloc((size_t)(n > 0 ? n : 1) * es);
    ck_assert_ptr_nonnull(h);
    for (int64_t i = 0; i < n; i++)
        ref64_encode(v[i], t->dtype, h + (size_t)i * es);
    if (n > 0)
        ck_assert_int_eq(llmem_buffer_upload(t->buf, t->offset, h, (size_t)n * es), LLMEM_OK);
    free(h);
}

llmem_tensor th_input(th_ctx *c, llmem_dtype t, int n_dims, int32_t n0, int32_t n1, int32_t n2,
                      const double *v)
{
    llmem_tensor x = th_tensor(c, t, n_dims, n0, n1, n2);
    th_set(&x, v);
    return x;
}

void th_set_i32(const llmem_tensor *t, const int32_t *v)
{
    size_t bytes = llmem_tensor_nbytes(t);
    if (bytes > 0)
        ck_assert_int_eq(llmem_buffer_upload(t->buf, t->offset, v, bytes), LLMEM_OK);
}

void th_get(const llmem_tensor *t, double *v)
{
    int64_t n = llmem_tensor_nelements(t);
    size_t es = llmem_dtype_size(t->dtype);
    unsigned char *h = malloc((size_t)(n > 0 ? n : 1) * es);
    ck_assert_ptr_nonnull(h);
    if (n > 0)
        ck_assert_int_eq(llmem_buffer_download(t->buf, t->offset, h, (size_t)n * es), LLMEM_OK);
    for (int64_t i = 0; i < n; i++)
        v[i] = ref64_decode(h + (size_t)i * es, t->dtype);
    free(h);
}

void th_get_i32(const llmem_tensor *t, int32_t *v)
{
    size_t bytes = llmem_tensor_nbytes(t);
    if (bytes > 0)
        ck_assert_int_eq(llmem_buffer_download(t->buf, t->offset, v, bytes), LLMEM_OK);
}

void th_poison(const llmem_tensor *t)
{
    size_t bytes = round4(llmem_tensor_nbytes(t));
    if (bytes > 0)
        ck_assert_int_eq(llmem_buffer_fill(t->buf, t->offset, bytes, llmem_nan_pattern(t->dtype)),
                         LLMEM_OK);
}

unsigned char *th_snapshot(th_ctx *c, llmem_buffer *buf)
{
    size_t size = llmem_buffer_size(buf);
    unsigned char *h = th_alloc(c, size);
    ck_assert_int_eq(llmem_buffer_download(buf, 0, h, size), LLMEM_OK);
    return h;
}

/* ---- index tables ----------------------------------------------------------------------- */

static void idx_push(th_idx *b, int32_t v)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->v = realloc(b->v, (size_t)b->cap * sizeof *b->v);
        ck_assert_ptr_nonnull(b->v);
    }
    b->v[b->n++] = v;
}

llmem_i32_table th_idx_add(th_idx *b, const int32_t *vals, int32_t n)
{
    /* Junk a kernel reading outside the table would trip on. */
    static const int32_t junk[] = {INT32_MAX, -7, INT32_MIN, 1 << 30};
    int32_t n_junk = 1 + (int32_t)(b->junk++ % 3);
    for (int32_t i = 0; i < n_junk; i++)
        idx_push(b, junk[(b->junk + (uint64_t)i) % 4]);
    llmem_i32_table t = {NULL, (size_t)b->n * 4, n};
    for (int32_t i = 0; i < n; i++)
        idx_push(b, vals[i]);
    return t;
}

llmem_buffer *th_idx_finish(th_ctx *c, th_idx *b, llmem_i32_table *const *tabs, int n_tabs)
{
    idx_push(b, INT32_MIN); /* trailing junk */
    size_t bytes = (size_t)b->n * 4;
    llmem_buffer *buf = new_buffer(c, 0, round4(bytes), round4(bytes), LLMEM_DTYPE_I32);
    ck_assert_int_eq(llmem_buffer_upload(buf, 0, b->v, bytes), LLMEM_OK);
    th_keep(c, b->v);
    for (int i = 0; i < n_tabs; i++)
        tabs[i]->host = tabs[i]->n > 0 ? b->v + tabs[i]->offset / 4 : NULL;
    b->v = NULL;
    b->n = b->cap = 0;
    return buf;
}

/* ---- checks -------------------------------------------------------------------------------- */

void th_expect_close(const double *out, const double *ref, int64_t n, double tol,
                     const char *what)
{
    int64_t bad = ref64_first_nonfinite(out, n);
    ck_assert_msg(bad < 0, "%s: element %lld is %g (NaN/inf or unwritten), seed %llu", what,
                  (long long)bad, bad >= 0 ? out[bad] : 0.0, (unsigned long long)ref64_seed());
    bad = ref64_first_nonfinite(ref, n);
    ck_assert_msg(bad < 0, "%s: reference element %lld is not finite, seed %llu", what,
                  (long long)bad, (unsigned long long)ref64_seed());
    double e = ref64_nerr(out, ref, n);
    if (getenv("LLMEM_TEST_VERBOSE"))
        printf("%s: normalized error %.3g (threshold %.3g)\n", what, e, tol);
    ck_assert_msg(e <= tol, "%s: normalized error %.3g > %.3g, seed %llu", what, e, tol,
                  (unsigned long long)ref64_seed());
}

void th_expect_close_elem(const double *out, const double *ref, int64_t n, double rtol,
                          const char *what)
{
    int64_t bad = ref64_first_nonfinite(out, n);
    ck_assert_msg(bad < 0, "%s: element %lld is %g (NaN/inf or unwritten), seed %llu", what,
                  (long long)bad, bad >= 0 ? out[bad] : 0.0, (unsigned long long)ref64_seed());
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(out[i] - ref[i]) <= rtol * fabs(ref[i])))
            ck_abort_msg("%s: element %lld is %.9g, reference %.9g (rtol %.2g), seed %llu", what,
                         (long long)i, out[i], ref[i], rtol, (unsigned long long)ref64_seed());
}

void th_expect_same_bytes(const void *a, const void *b, size_t n, const char *what)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            ck_abort_msg("%s: byte %zu differs (%02x vs %02x), seed %llu", what, i, x[i], y[i],
                         (unsigned long long)ref64_seed());
}

void th_matmul(llmem_backend *be, int32_t m, int32_t k, int32_t n, llmem_dtype wt,
               const double *a, const double *w, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ta = th_input(&c, LLMEM_DTYPE_F32, 2, m, k, 1, a);
    llmem_tensor tw = th_input(&c, wt, 2, n, k, 1, w);
    llmem_tensor to = th_tensor(&c, LLMEM_DTYPE_F32, 2, m, n, 1);
    ck_assert_int_eq(llmem_op_matmul(be, &ta, &tw, &to), LLMEM_OK);
    th_get(&to, out);
    th_end(&c);
}

void th_pages_make(th_ctx *h, ref64_rng *r, int32_t n_streams, const int32_t *len,
                   int32_t page_size, int32_t spare, bool rows, th_pages *p)
{
    int32_t used = 0;
    p->page_size = page_size;
    p->rows = rows;
    p->max_pages = 0;
    for (int32_t s = 0; s < n_streams; s++) {
        int32_t pages = llmem_pages_for(0, len[s], page_size);
        used += pages;
        p->max_pages = pages + spare > p->max_pages ? pages + spare : p->max_pages;
    }
    p->n_pages = used + 3;
    int32_t *perm = th_alloc(h, (size_t)p->n_pages * sizeof *perm);
    ref64_shuffle(r, perm, p->n_pages);
    p->n_pt = n_streams * p->max_pages;
    p->page_off = th_alloc(h, (size_t)n_streams * sizeof(int32_t));
    if (rows) {
        p->n_pt = 1;
        for (int32_t s = n_streams - 1; s >= 0; s--) {
            p->page_off[s] = p->n_pt + 2;
            p->n_pt += 2 + llmem_pages_for(0, len[s], page_size);
        }
    }
    p->page_table = th_alloc(h, (size_t)p->n_pt * sizeof(int32_t));
    for (int32_t e = 0; e < p->n_pt; e++)
        p->page_table[e] = -1;
    for (int32_t s = 0, next = 0; s < n_streams; s++) {
        int32_t row = rows ? p->page_off[s] : s * p->max_pages;
        for (int32_t j = 0; j < llmem_pages_for(0, len[s], page_size); j++)
            p->page_table[row + j] = perm[next++];
    }
}

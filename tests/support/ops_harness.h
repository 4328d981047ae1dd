/* llmem tests: helpers of the op conformance suites (tests/test_ops*.c).
 *
 * - Which backends to test: every name in $LLMEM_TEST_BACKENDS (comma
 *   separated; default "cpu,vulkan,cuda") that opens; the others are
 *   skipped with the reason printed.
 * - Guarded tensors: each tensor gets its own buffer laid out as
 *   [256 guard bytes | data | 256 guard bytes], all filled with the dtype's
 *   NaN pattern. th_end() checks that no guard byte changed (no write
 *   outside an output) and frees everything. Inputs sit between NaN
 *   guards, so an op that reads past them produces NaN.
 * - Index tables: built into one host array with junk entries between
 *   tables, uploaded to one idx buffer, as a memory view would be.
 */
#ifndef LLMEM_TEST_OPS_HARNESS_H
#define LLMEM_TEST_OPS_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/ops.h"
#include "support/ref64.h"

#define TH_GUARD 256
#define TH_MAX_BUFS 96
#define TH_MAX_BACKENDS 8

/* Probes the backends once (prints a line per skipped one); returns how
 * many opened. Call from main before building the suite. */
int th_backends_probe(void);
int th_backends_count(void);
const char *th_backend_name(int i);
/* Opens backend i of the probe (asserts). */
llmem_backend *th_open(int i);
/* Opens "cpu" (asserts). */
llmem_backend *th_open_cpu(void);

/* Whether backend i of the probe is "cpu" (compared with float64) or not
 * (compared with cpu). */
bool th_is_cpu(int i);

typedef struct th_ctx {
    llmem_backend *be;
    int n;
    struct {
        llmem_buffer *buf;
        size_t data_off, data_bytes, size;
        uint32_t pattern;
    } b[TH_MAX_BUFS];
    int n_keep;
    void *keep[TH_MAX_BUFS];
} th_ctx;

void th_begin(th_ctx *c, llmem_backend *be);
/* Checks every guard, frees every buffer and kept host array. */
void th_end(th_ctx *c);
/* Frees p at th_end; returns p. */
void *th_keep(th_ctx *c, void *p);
/* calloc that asserts, freed at th_end. */
void *th_alloc(th_ctx *c, size_t bytes);

/* n doubles (at least one), zeroed, freed at th_end. */
double *th_vec(th_ctx *c, int64_t n);
/* n doubles (at least one) freed at th_end, filled by ref64_fill(r, ., n,
 * lo, hi, t): uniform in [lo, hi), each exact in dtype t. */
double *th_rand(th_ctx *c, ref64_rng *r, int64_t n, double lo, double hi, llmem_dtype t);

/* A shuffled paged layout of the attention suites' KV pool: n_streams
 * streams of len[s] keys in pages of page_size. Stream s's pages are
 * distinct pages of the pool, in the order of a shuffle drawn from r; the
 * pool has 3 pages more than the streams own (unowned: tests leave them
 * NaN). Page-table entries are -1 where no page is owned. Dense layout
 * (rows false): stream s's row starts at s * max_pages, max_pages = the
 * largest page count + spare. Rows (rows true): stream s's row starts at
 * page_off[s], after stream s + 1's row (the last stream first) and two
 * -1 entries, unlike the dense s * max_pages. page_table [n_pt] and
 * page_off [n_streams] are allocated in h (freed at th_end). */
typedef struct th_pages {
    int32_t page_size, max_pages, n_pages, n_pt;
    bool rows;
    int32_t *page_table, *page_off;
} th_pages;
void th_pages_make(th_ctx *h, ref64_rng *r, int32_t n_streams, const int32_t *len,
                   int32_t page_size, int32_t spare, bool rows, th_pages *p);
/* The pool slot (page * page_size + offset) of key j of stream s in p. */
static inline int32_t th_pages_slot(const th_pages *p, int32_t s, int32_t j)
{
    int32_t row = p->rows ? p->page_off[s] : s * p->max_pages;
    return p->page_table[row + j / p->page_size] * p->page_size + j % p->page_size;
}

/* A guarded tensor (poisoned with NaN). ne outermost first. */
llmem_tensor th_tensor(th_ctx *c, llmem_dtype t, int n_dims, int32_t n0, int32_t n1, int32_t n2);
/* A raw buffer of `bytes` (rounded up to 4) filled with the NaN pattern of
 * t, for KV pools and state buffers (views address whole buffers, so it has
 * no guards: tests compare snapshots to find unexpected writes). */
llmem_buffer *th_pool(th_ctx *c, size_t bytes, llmem_dtype t);

/* th_tensor + th_set. */
llmem_tensor th_input(th_ctx *c, llmem_dtype t, int n_dims, int32_t n0, int32_t n1, int32_t n2,
                      const double *v);
/* Values v[nelements] encoded to t's dtype and uploaded. */
void th_set(const llmem_tensor *t, const double *v);
void th_set_i32(const llmem_tensor *t, const int32_t *v);
/* Downloads and decodes into v[nelements]. */
void th_get(const llmem_tensor *t, double *v);
void th_get_i32(const llmem_tensor *t, int32_t *v);
/* Fills the data of t with NaN again. */
void th_poison(const llmem_tensor *t);
/* Downloads a whole buffer into a new th_keep'd host copy. */
unsigned char *th_snapshot(th_ctx *c, llmem_buffer *buf);

/* Index tables of a view. */
typedef struct th_idx {
    int32_t *v;
    int32_t n, cap;
    uint64_t junk;
} th_idx;

/* Appends a table (with a few junk entries before it). The table's host
 * pointer is set by th_idx_finish. */
llmem_i32_table th_idx_add(th_idx *b, const int32_t *vals, int32_t n);
/* Uploads the tables into a new idx buffer and points each table's host
 * at the builder's array (kept until th_end). */
llmem_buffer *th_idx_finish(th_ctx *c, th_idx *b, llmem_i32_table *const *tabs, int n_tabs);

/* Asserts that out has no NaN/inf and ‖out − ref‖/‖ref‖ <= tol
 * ($LLMEM_TEST_VERBOSE prints every error with its threshold). */
void th_expect_close(const double *out, const double *ref, int64_t n, double tol,
                     const char *what);
/* Element-wise bound for element-wise ops: |out - ref| <= rtol * |ref|
 * for every element (after the NaN/inf check). */
void th_expect_close_elem(const double *out, const double *ref, int64_t n, double rtol,
                          const char *what);
/* Asserts that n bytes of a and b are equal (what names the check). */
void th_expect_same_bytes(const void *a, const void *b, size_t n, const char *what);

/* out[m, n] = a[m, k] · w[n, k]ᵀ on be through llmem_op_matmul: a uploaded
 * as f32, w as dtype wt (values rounded to it), out read back (asserts the
 * op succeeds). */
void th_matmul(llmem_backend *be, int32_t m, int32_t k, int32_t n, llmem_dtype wt,
               const double *a, const double *w, double *out);

#endif

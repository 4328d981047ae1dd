// ctest-labels: core
/* Persistent page-table rows (memory/page_rows.h): rows taken, moved and
 * freed, entries written in random, ascending and descending orders, one
 * at a time (page_rows_write1, a decode step) or in runs; after every
 * upload the device buffer equals a plain reference array the test writes
 * itself, and the device check skips exactly the entries not yet
 * uploaded (a stale device entry outside them is reported). */
#include "support/run.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend.h"
#include "memory/page_rows.h"

#define NROW 64

typedef struct fixture {
    llmem_backend *be;
    llmem_buffer *buf;
    page_rows r;
    int32_t *ref; /* what the table must hold: -1 where no entry was written */
    int32_t ref_n;
    int32_t row[NROW], cap[NROW];
} fixture;

static void fx_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    char err[128];
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &f->be, err, sizeof err), LLMEM_OK);
    f->r.full = true;
    for (int32_t i = 0; i < NROW; i++)
        f->row[i] = -1;
}

static void fx_finish(fixture *f)
{
    llmem_buffer_free(f->buf);
    page_rows_finish(&f->r);
    free(f->ref);
    llmem_backend_close(f->be);
}

/* The device buffer holds the whole table (a new buffer gets everything). */
static void fx_fit_buffer(fixture *f)
{
    size_t need = (size_t)(f->r.n > 0 ? f->r.n : 1) * sizeof(int32_t);
    if (f->buf && llmem_buffer_size(f->buf) >= need)
        return;
    llmem_buffer_free(f->buf);
    f->buf = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(f->be, 2 * need, &f->buf), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(f->buf, 0, 2 * need, 0x7f7f7f7fu), LLMEM_OK);
    f->r.full = true;
}

static void ref_grow(fixture *f)
{
    if (f->r.n <= f->ref_n)
        return;
    f->ref = realloc(f->ref, (size_t)f->r.n * sizeof *f->ref);
    ck_assert_ptr_nonnull(f->ref);
    for (int32_t i = f->ref_n; i < f->r.n; i++)
        f->ref[i] = -1; /* fresh rows read -1 */
    f->ref_n = f->r.n;
}

static void upload_and_compare(fixture *f)
{
    fx_fit_buffer(f);
    ck_assert_int_eq(page_rows_upload(&f->r, f->buf), LLMEM_OK);
    ck_assert(!page_rows_pending(&f->r));
    int32_t *dev = malloc((size_t)f->r.n * sizeof *dev);
    ck_assert_ptr_nonnull(dev);
    ck_assert_int_eq(llmem_buffer_download(f->buf, 0, dev, (size_t)f->r.n * sizeof *dev),
                     LLMEM_OK);
    int32_t bad = -1; /* one assertion, not one per entry (Check logs each) */
    for (int32_t i = 0; i < f->r.n && bad < 0; i++)
        if (dev[i] != f->ref[i])
            bad = i;
    ck_assert_msg(bad < 0, "device entry %d is %d, expected %d", bad, bad >= 0 ? dev[bad] : 0,
                  bad >= 0 ? f->ref[bad] : 0);
    free(dev);
    char err[256] = "";
    ck_assert_msg(page_rows_check_device(&f->r, f->buf, err, sizeof err), "%s", err);
}

/* Writes entry k of row i (k < cap) with v, in the table and the reference. */
static void put(fixture *f, int32_t i, int32_t k, int32_t v, bool one)
{
    if (one)
        page_rows_write1(&f->r, f->row[i] + k, v);
    else
        page_rows_write(&f->r, f->row[i] + k, &v, 1);
    f->ref[f->row[i] + k] = v;
}

/* Random rows and writes; mode 0: random order of rows, 1: ascending,
 * 2: descending (the orders a decode step's writes can come in). */
START_TEST(test_random_writes)
{
    int mode = _i;
    fixture f;
    fx_init(&f);
    uint64_t seed = 0x5eed0000u + (uint64_t)mode;
    int32_t len[NROW] = {0};
    for (int32_t step = 0; step < 300; step++) {
        /* some rows grow (and may move to a larger class: contents rewritten) */
        int32_t order[NROW];
        for (int32_t i = 0; i < NROW; i++)
            order[i] = mode == 2 ? NROW - 1 - i : i;
        if (mode == 0)
            for (int32_t i = NROW - 1; i > 0; i--) {
                int32_t j = (int32_t)(test_rand32(&seed) % (uint32_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        for (int32_t o = 0; o < NROW; o++) {
            int32_t i = order[o];
            uint32_t what = test_rand32(&seed) % 16;
            if (what == 0 && f.row[i] >= 0) { /* the sequence empties */
                page_rows_free(&f.r, &f.row[i], &f.cap[i]);
                len[i] = 0;
                continue;
            }
            int32_t add = what < 12 ? 1 : (int32_t)(test_rand32(&seed) % 40);
            int32_t old_row = f.row[i];
            if (!page_rows_fit(&f.r, &f.row[i], &f.cap[i], len[i] + add))
                ck_abort_msg("page_rows_fit failed");
            ref_grow(&f);
            if (f.row[i] != old_row) { /* moved: the caller rewrites its entries */
                int32_t *v = malloc((size_t)(len[i] > 0 ? len[i] : 1) * sizeof *v);
                ck_assert_ptr_nonnull(v);
                for (int32_t k = 0; k < len[i]; k++)
                    v[k] = i * 100000 + k;
                page_rows_write(&f.r, f.row[i], v, len[i]);
                for (int32_t k = 0; k < len[i]; k++)
                    f.ref[f.row[i] + k] = v[k];
                free(v);
            }
            for (int32_t k = 0; k < add; k++)
                put(&f, i, len[i] + k, i * 100000 + len[i] + k, add == 1);
            len[i] += add;
        }
        if (step % 3 == 0) {
            /* before the upload the check skips exactly what is pending */
            fx_fit_buffer(&f);
            char err[256] = "";
            ck_assert_msg(page_rows_check_device(&f.r, f.buf, err, sizeof err), "%s", err);
            upload_and_compare(&f);
        }
    }
    upload_and_compare(&f);
    fx_finish(&f);
}
END_TEST

/* One entry per row, rows far apart (no two writes in one run), written in
 * ascending, descending (a reversal) and shuffled (a sort) order of their
 * place in the table: each decode step's entries all reach the device. */
START_TEST(test_write_orders)
{
    fixture f;
    fx_init(&f);
    for (int32_t i = 0; i < 16; i++) { /* fresh rows: ascending places, 64 apart */
        ck_assert(page_rows_fit(&f.r, &f.row[i], &f.cap[i], 40));
        ref_grow(&f);
    }
    for (int32_t i = 1; i < 16; i++)
        ck_assert_int_gt(f.row[i] - f.row[i - 1], PAGE_ROWS_GAP);
    upload_and_compare(&f);
    uint64_t seed = 99;
    for (int32_t step = 0; step < 30; step++) {
        int32_t order[16];
        for (int32_t i = 0; i < 16; i++)
            order[i] = step % 3 == 0 ? i : 15 - i;
        if (step % 3 == 2)
            for (int32_t i = 15; i > 0; i--) {
                int32_t j = (int32_t)(test_rand32(&seed) % (uint32_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        for (int32_t o = 0; o < 16; o++)
            put(&f, order[o], step, 1000 * order[o] + step, true);
        upload_and_compare(&f);
    }
    fx_finish(&f);
}
END_TEST

/* A stale device entry that no pending write covers is reported; the same
 * entry written again (pending) is not, and the upload repairs it. */
START_TEST(test_check_reports_stale_entry)
{
    fixture f;
    fx_init(&f);
    ck_assert(page_rows_fit(&f.r, &f.row[0], &f.cap[0], 10));
    ref_grow(&f);
    for (int32_t k = 0; k < 10; k++)
        put(&f, 0, k, 500 + k, true);
    upload_and_compare(&f);
    int32_t bad = 12345, at = f.row[0] + 3;
    ck_assert_int_eq(llmem_buffer_upload(f.buf, (size_t)at * sizeof bad, &bad, sizeof bad),
                     LLMEM_OK);
    char err[256] = "";
    ck_assert(!page_rows_check_device(&f.r, f.buf, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "device entry"));
    put(&f, 0, 3, 777, true);
    ck_assert(page_rows_check_device(&f.r, f.buf, err, sizeof err));
    upload_and_compare(&f);
    fx_finish(&f);
}
END_TEST

/* A row that moves keeps its first `keep` entries (page_rows_fit_keep),
 * and the copies reach the device; page_rows_pending_in sees exactly the
 * entries written since the last upload; the device check over the first
 * n_dev entries ignores rows taken past them. */
START_TEST(test_fit_keep_and_pending)
{
    fixture f;
    fx_init(&f);
    ck_assert(page_rows_fit(&f.r, &f.row[0], &f.cap[0], 8));
    ck_assert(page_rows_fit(&f.r, &f.row[1], &f.cap[1], 8));
    ref_grow(&f);
    for (int32_t k = 0; k < 8; k++) {
        put(&f, 0, k, 100 + k, true);
        put(&f, 1, k, 200 + k, false);
    }
    upload_and_compare(&f);
    ck_assert(!page_rows_pending_in(&f.r, 0, f.r.n));
    int32_t old_row = f.row[0];
    ck_assert(page_rows_fit_keep(&f.r, &f.row[0], &f.cap[0], 300, 6));
    ck_assert_int_ne(f.row[0], old_row);
    ck_assert_int_ge(f.cap[0], 300);
    ref_grow(&f);
    for (int32_t k = 0; k < 6; k++) /* kept: the values written above */
        f.ref[f.row[0] + k] = 100 + k;
    ck_assert(page_rows_pending_in(&f.r, f.row[0], f.row[0] + 6));
    ck_assert(!page_rows_pending_in(&f.r, f.row[1], f.row[1] + f.cap[1]));
    for (int32_t k = 0; k < 6; k++)
        ck_assert_int_eq(f.r.v[f.row[0] + k], 100 + k);
    /* the device buffer predates the moved row: a check over the entries
     * it holds passes, the full check reports the short buffer */
    char err[256] = "";
    size_t held = llmem_buffer_size(f.buf) / sizeof(int32_t);
    if (held < (size_t)f.r.n) {
        ck_assert(!page_rows_check_device(&f.r, f.buf, err, sizeof err));
        ck_assert(page_rows_check_device_upto(&f.r, f.buf, (int32_t)held, err, sizeof err));
    }
    ck_assert(page_rows_check_device_upto(&f.r, NULL, f.r.n, err, sizeof err));
    upload_and_compare(&f);
    ck_assert(!page_rows_pending_in(&f.r, 0, f.r.n));
    /* an entry written in place through v and noted is pending, then uploaded */
    f.r.v[f.row[1] + 2] = 999;
    f.ref[f.row[1] + 2] = 999;
    page_rows_note(&f.r, f.row[1] + 2, 1);
    ck_assert(page_rows_pending_in(&f.r, f.row[1] + 2, f.row[1] + 3));
    ck_assert(!page_rows_pending_in(&f.r, f.row[1] + 3, f.row[1] + 8));
    upload_and_compare(&f);
    fx_finish(&f);
}
END_TEST

/* Equally long rows taken one after the other (sequences of one length,
 * the decode benchmark's case) put their last entries into many distinct
 * cache sets: a 2 MiB, 16-way cache of 64-byte lines has 2,048 sets of
 * set index (byte address / 64) mod 2048. With rows of an even number of
 * lines, the rows of 128K-token page tables all shared one set. */
START_TEST(test_row_tails_spread_over_sets)
{
    static const int32_t lens[] = {1100, 8300, 131100}, counts[] = {1000, 300, 24};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        page_rows r = {0};
        int32_t N = counts[li], row[1000], cap[1000];
        static uint8_t seen[2048];
        memset(seen, 0, sizeof seen);
        int32_t distinct = 0;
        for (int32_t i = 0; i < N; i++) {
            row[i] = -1;
            ck_assert(page_rows_fit(&r, &row[i], &cap[i], lens[li]));
            int64_t byte = ((int64_t)row[i] + lens[li] - 1) * 4;
            int32_t set = (int32_t)((byte / 64) % 2048);
            distinct += !seen[set];
            seen[set] = 1;
        }
        /* N tails spread at random over 2,048 sets would hit ~0.8 N or more */
        ck_assert_msg(distinct >= N * 7 / 10, "%d rows of %d entries: tails in %d sets", N,
                      lens[li], distinct);
        page_rows_finish(&r);
    }
}
END_TEST

/* Shared storage (page_rows_share): the table lives in a cpu buffer that
 * the grow callback replaces (entries kept, the new ones -1); writes are
 * recorded nowhere, the buffer's memory equals a reference array the test
 * writes itself after every step, the upload sends nothing and accepts
 * only that buffer, a callback that fails changes nothing. */
typedef struct shared_fx {
    llmem_backend *be;
    llmem_buffer *buf;
    int32_t grows;
    bool fail;
} shared_fx;

/* page_rows_write_upload (a decode step's new entries, written and
 * uploaded together): rows in shuffled order, one entry each or a run of
 * several (a prefill; merged into one range), more pairs than one chunk of
 * a host-visible buffer; the device and the host table equal a reference
 * written from the pairs, nothing stays pending; every other call writes
 * the pairs, and merges the runs, backwards. Then an upload that fails
 * (a buffer smaller than the table) returns its status with every entry
 * written on the host, and the next upload sends the whole table. */
START_TEST(test_write_upload)
{
    fixture f;
    fx_init(&f);
    for (int32_t i = 0; i < NROW; i++) {
        ck_assert(page_rows_fit(&f.r, &f.row[i], &f.cap[i], 400));
        ref_grow(&f);
    }
    upload_and_compare(&f);
    int32_t len[NROW] = {0}, pairs[2 * NROW * 8];
    uint64_t seed = 7;
    for (int32_t step = 0; step < 12; step++) {
        int32_t order[NROW], n = 0;
        for (int32_t i = 0; i < NROW; i++)
            order[i] = i;
        for (int32_t i = NROW - 1; i > 0; i--) {
            int32_t j = (int32_t)(test_rand32(&seed) % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int32_t o = 0; o < NROW; o++) {
            int32_t i = order[o], add = 1 + (int32_t)(test_rand32(&seed) % 8);
            for (int32_t k = 0; k < add; k++, len[i]++) {
                pairs[2 * n] = f.row[i] + len[i];
                pairs[2 * n + 1] = 1000 * i + len[i] + 7 * step;
                f.ref[f.row[i] + len[i]] = pairs[2 * n + 1];
                n++;
            }
        }
        ck_assert_int_gt(n, PAGE_ROWS_CHUNK);
        ck_assert_int_eq(page_rows_write_upload(&f.r, f.buf, pairs, n), LLMEM_OK);
        ck_assert(f.r.back == (step % 2 == 0)); /* the odd calls ran backwards */
        ck_assert(!page_rows_pending(&f.r));
        for (int32_t e = 0; e < f.r.n; e++)
            ck_assert_int_eq(f.r.v[e], f.ref[e]);
        upload_and_compare(&f); /* nothing pending: the device already equals ref */
    }
    /* a failing upload: entries on the host, the whole table next time */
    llmem_buffer *small = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(f.be, 64, &small), LLMEM_OK);
    int32_t i = 5;
    pairs[0] = f.row[i] + len[i];
    pairs[1] = 424242;
    f.ref[pairs[0]] = pairs[1];
    pairs[2] = f.row[NROW - 1] + len[NROW - 1];
    pairs[3] = 434343;
    f.ref[pairs[2]] = pairs[3];
    ck_assert_int_eq(page_rows_write_upload(&f.r, small, pairs, 2), LLMEM_E_INVALID);
    ck_assert_int_eq(f.r.v[pairs[0]], 424242);
    ck_assert_int_eq(f.r.v[pairs[2]], 434343);
    ck_assert(f.r.full);
    llmem_buffer_free(small);
    upload_and_compare(&f);
    fx_finish(&f);
}
END_TEST

static bool shared_grow(void *ctx, page_rows *r, int64_t cap)
{
    shared_fx *x = ctx;
    llmem_buffer *nb = NULL;
    if (x->fail || llmem_buffer_alloc(x->be, (size_t)cap * sizeof(int32_t), &nb) != LLMEM_OK)
        return false;
    int32_t *h = llmem_buffer_host_ptr(nb);
    for (int64_t i = 0; i < cap; i++)
        h[i] = i < r->cap ? r->v[i] : -1;
    llmem_buffer_free(x->buf);
    x->buf = nb;
    r->v = h;
    r->cap = (int32_t)cap;
    x->grows++;
    return true;
}

START_TEST(test_shared_storage)
{
    shared_fx x = {0};
    char err[256] = "";
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &x.be, err, sizeof err), LLMEM_OK);
    page_rows r = {0};
    page_rows_share(&r, shared_grow, &x);
    int32_t row[NROW], cap[NROW], *ref = NULL, ref_n = 0;
    for (int32_t i = 0; i < NROW; i++)
        row[i] = -1;
    uint64_t seed = 7;
    for (int32_t step = 0; step < 400; step++) {
        int32_t i = (int32_t)(test_rand32(&seed) % NROW), op = (int32_t)(test_rand32(&seed) % 8);
        if (op == 0 && row[i] >= 0) { /* free: the reference keeps what was written */
            page_rows_free(&r, &row[i], &cap[i]);
        } else if (op <= 2 || row[i] < 0) { /* take or move (first 3 entries kept) */
            int32_t old = row[i], oldcap = cap[i];
            int32_t n = 1 + (int32_t)(test_rand32(&seed) % 300);
            int32_t keep[3] = {0};
            for (int32_t k = 0; old >= 0 && k < 3 && k < oldcap; k++)
                keep[k] = ref[old + k];
            ck_assert(page_rows_fit_keep(&r, &row[i], &cap[i], n, 3));
            ck_assert_int_ge(cap[i], n);
            if (r.n > ref_n) {
                ref = realloc(ref, (size_t)r.n * sizeof *ref);
                ck_assert_ptr_nonnull(ref);
                for (int32_t k = ref_n; k < r.n; k++)
                    ref[k] = -1;
                ref_n = r.n;
            }
            for (int32_t k = 0; old >= 0 && row[i] != old && k < 3 && k < oldcap; k++)
                ref[row[i] + k] = keep[k];
        } else if (op == 7) { /* a decode step's pairs, one entry of every live row */
            int32_t pairs[2 * NROW], n = 0;
            bool back = r.back;
            for (int32_t q = 0; q < NROW; q++)
                if (row[q] >= 0) {
                    pairs[2 * n] = row[q] + (int32_t)(test_rand32(&seed) % (uint32_t)cap[q]);
                    pairs[2 * n + 1] = (int32_t)(test_rand32(&seed) % 1000);
                    ref[pairs[2 * n]] = pairs[2 * n + 1];
                    n++;
                }
            ck_assert_int_eq(page_rows_write_upload(&r, x.buf, pairs, n), LLMEM_OK);
            ck_assert(n == 0 || r.back != back); /* every other call backwards */
        } else { /* writes, one entry (a decode step) or a run */
            int32_t k = (int32_t)(test_rand32(&seed) % (uint32_t)cap[i]), v = (int32_t)(test_rand32(&seed) % 1000);
            if (op & 1)
                page_rows_write1(&r, row[i] + k, v);
            else
                page_rows_write(&r, row[i] + k, &v, 1);
            ref[row[i] + k] = v;
        }
        ck_assert(!page_rows_pending(&r));
        ck_assert(!page_rows_pending_in(&r, 0, r.n));
        ck_assert_ptr_eq(llmem_buffer_host_ptr(x.buf), r.v);
        ck_assert_int_ge(llmem_buffer_size(x.buf), (size_t)r.n * sizeof(int32_t));
        int32_t *dev = malloc((size_t)r.n * sizeof *dev);
        ck_assert_ptr_nonnull(dev);
        ck_assert_int_eq(llmem_buffer_download(x.buf, 0, dev, (size_t)r.n * sizeof *dev),
                         LLMEM_OK);
        int32_t bad = -1;
        for (int32_t k = 0; k < r.n && bad < 0; k++)
            if (dev[k] != ref[k])
                bad = k;
        ck_assert_msg(bad < 0, "step %d: entry %d is %d, expected %d", step, bad,
                      bad >= 0 ? dev[bad] : 0, bad >= 0 ? ref[bad] : 0);
        free(dev);
    }
    ck_assert_int_gt(x.grows, 1);
    /* the upload and the check accept only the buffer that is the table */
    ck_assert_int_eq(page_rows_upload(&r, x.buf), LLMEM_OK);
    ck_assert(page_rows_check_device(&r, x.buf, err, sizeof err));
    llmem_buffer *other = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(x.be, (size_t)r.cap * sizeof(int32_t), &other), LLMEM_OK);
    ck_assert_int_eq(page_rows_upload(&r, other), LLMEM_E_STATE);
    int32_t pair[2] = {0, r.v[0]}; /* the same value: the table stays as the reference */
    ck_assert_int_eq(page_rows_write_upload(&r, other, pair, 1), LLMEM_E_STATE);
    ck_assert(!page_rows_check_device(&r, other, err, sizeof err));
    ck_assert(!page_rows_check_device_upto(&r, NULL, r.n, err, sizeof err));
    llmem_buffer_free(other);
    /* a growth that fails changes nothing */
    x.fail = true;
    int32_t *v0 = r.v, n0 = r.n, cap0 = r.cap, nr = -1, nc = 0;
    ck_assert(!page_rows_fit(&r, &nr, &nc, r.cap + 1));
    ck_assert(!page_rows_reserve(&r, (int64_t)r.cap + 1));
    ck_assert_ptr_eq(r.v, v0);
    ck_assert_int_eq(r.n, n0);
    ck_assert_int_eq(r.cap, cap0);
    ck_assert_int_eq(nr, -1);
    page_rows_finish(&r); /* the storage is the buffer's: not freed here */
    ck_assert_ptr_eq(llmem_buffer_host_ptr(x.buf), v0);
    llmem_buffer_free(x.buf);
    free(ref);
    llmem_backend_close(x.be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("page_rows");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_random_writes, 0, 3);
    tcase_add_test(tc, test_write_orders);
    tcase_add_test(tc, test_check_reports_stale_entry);
    tcase_add_test(tc, test_fit_keep_and_pending);
    tcase_add_test(tc, test_row_tails_spread_over_sets);
    tcase_add_test(tc, test_shared_storage);
    tcase_add_test(tc, test_write_upload);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

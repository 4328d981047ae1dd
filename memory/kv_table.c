/* llmem memory/: the KV cache's page tables, which live in their rows of
 * the page-row table (kv_internal.h kv_pt, memory/page_rows.h): growing a
 * table (its row), re-pointing the tables when the row table moves, and
 * dropping entries. */
#include <stdlib.h>
#include <string.h>

#include "memory/kv_internal.h"

void kv_rows_setup(kv_cache *kv)
{
    /* Except with a sliding window, whose commit writes -1 into entries
     * that the plan's later ubatches may still show (a mirror keeps them
     * from the device until the next plan), and with LLMEM_KV_ROW_MIRROR=1
     * (a host copy and uploads, as on a GPU: lets the cpu backend test
     * that path). */
    llmem_backend_info bi;
    const char *mirror = getenv("LLMEM_KV_ROW_MIRROR");
    if (kv->p.window == 0 && !(mirror && strcmp(mirror, "1") == 0) &&
        llmem_backend_get_info(kv->base.backend, &bi) == LLMEM_OK && bi.host_visible)
        page_rows_share(&kv->rows, kv_rows_grow, kv);
}

bool kv_pt_fit(kv_cache *kv, kv_seq *s, int32_t n)
{
    if (s->row >= 0 && n <= s->row_cap)
        return true;
    kv_mag_drain(kv, s); /* a moved row keeps only the table's entries */
    const int32_t *old = kv->rows.v;
    if (!page_rows_fit_keep(&kv->rows, &s->row, &s->row_cap, n, s->pages.n))
        return false;
    if (kv->rows.v != old)
        kv_pt_repoint(kv);
    else
        s->pages.v = kv->rows.v + s->row;
    return true;
}

void kv_pt_repoint(kv_cache *kv)
{
    for (int32_t s = 0; s < kv->base.n_seq_max; s++) {
        kv_seq *q = &kv->seqs[s];
        q->pages.v = q->row >= 0 ? kv->rows.v + q->row : NULL;
    }
}

void kv_drop_pages(kv_cache *kv, kv_seq *s, int32_t keep, bool free_row)
{
    bool cut = s->pages.n > keep;
    kv_mag_drain(kv, s); /* its entries follow the table's end */
    for (int32_t i = s->pages.n - 1; i >= keep; i--)
        if (s->pages.v[i] >= 0) /* -1: left the sliding window */
            kv_unref_page(kv, s->pages.v[i]);
    if (s->pages.n > keep)
        s->pages.n = keep;
    if (s->dropped > keep)
        s->dropped = keep;
    if (keep == 0)
        s->lost = 0;
    if (cut) /* a release after every decode step: keep it off the table's tail */
        kv_last_sync(s);
    if (free_row && keep == 0 && s->row >= 0) { /* an empty sequence gives its row back */
        page_rows_free(&kv->rows, &s->row, &s->row_cap);
        s->pages.v = NULL;
    }
}

void kv_drop_pages_from(kv_cache *kv, kv_seq *s, int32_t keep)
{
    kv_drop_pages(kv, s, keep, true);
}

void kv_seq_drop(kv_cache *kv, kv_seq *s, bool keep_row)
{
    kv_drop_pages(kv, s, 0, !keep_row);
    s->tokens.n = 0;
    kv_stage_of(kv, s)->n = 0;
    seq_pos_clear(&s->pos);
}

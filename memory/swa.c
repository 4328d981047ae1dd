/* llmem memory/: the sliding window of the paged KV cache (issue 17).
 *
 * A windowed KV cache (llmem_kv_cache_params.window = W > 0) serves layers
 * whose queries see only their last W keys, their own included. Query
 * index i of a sequence reads keys [i + 1 - W, i + 1) (transformers'
 * sliding-window mask for Gemma-3 / Mistral: key j visible when
 * i - j < W). After a commit that leaves a sequence with len tokens, the
 * next token reads from len + 1 - W; a rollback of up to window_slack
 * tokens moves that back by as many, so every page wholly before
 * len + 1 - W - window_slack leaves the page table (vLLM's sliding-window
 * block freeing, and llama.cpp's iSWA cache, keep the same bound). A
 * dropped page is unreferenced: freed, or back on the prefix cache's LRU
 * when published, and kept as long as another sequence (seq_cp, a prefix
 * hit) still holds it. Page table entries of dropped pages read -1; the
 * page index of every other token is unchanged, so slots, copy-on-write
 * and the prefix chain work as in a full cache.
 *
 * Views show a sequence from its first kept page: page_off moves past the
 * dropped entries and seq_len and tok_kv_len shrink by the dropped tokens.
 * The attention op computes its window from tok_kv_len, so the keys it
 * reads are the same as in a full cache, and it never sees a dropped page
 * (kv_plan.c, build_tables).
 */
#include "memory/kv_internal.h"

int32_t swa_keep_from(const kv_cache *kv, int32_t len)
{
    if (kv->p.window <= 0)
        return 0;
    int64_t k = (int64_t)len + 1 - kv->p.window - kv->p.window_slack;
    return k > 0 ? (int32_t)k : 0;
}

void swa_slide(kv_cache *kv, kv_seq *s)
{
    if (kv->p.window <= 0 || s->tokens.n == 0)
        return;
    int32_t upto = swa_keep_from(kv, s->tokens.n) / kv->p.page_size;
    /* views start past these entries; the -1 reaches the device copy with
     * the next upload (host work stays O(pages dropped)) */
    for (; s->dropped < upto; s->dropped++) {
        kv_unref_page(kv, s->pages.v[s->dropped]);
        kv_pt_set(kv, s, s->dropped, -1);
    }
    kv_last_sync(s);
    if (s->lost < s->dropped * kv->p.page_size)
        s->lost = s->dropped * kv->p.page_size;
}

bool swa_cut_ok(const kv_cache *kv, const kv_seq *s, int32_t k)
{
    int64_t ps = kv->p.page_size, gone = (int64_t)s->dropped * ps;
    gone = s->lost > gone ? s->lost : gone;
    if (k == 0 || gone == 0)
        return true;
    if (kv->p.window == 1) /* the next query sees only its own key: it needs
                              only the page it writes into, if that holds
                              earlier tokens */
        return k % ps == 0 || (int64_t)s->dropped * ps <= k;
    /* keys [k + 1 - window, k) held (the page written into follows) */
    int64_t lo = (int64_t)k + 1 - kv->p.window;
    return gone <= (lo > 0 ? lo : 0);
}

int32_t llmem_kv_cache_window(llmem_memory *mem)
{
    kv_cache *kv = kv_of(mem);
    return kv ? kv->p.window : -1;
}

/* swa_memory: KV memory a Gemma-3 shaped model holds at long context, with
 * its sliding-window layers in a windowed KV cache (memory/swa.c) against
 * every layer in a full one (docs/benchmarks.md, "Sliding-window KV").
 *
 *   swa_memory [context_tokens] [n_seqs]     (defaults 32768, 1)
 *
 * Shape of Gemma-3 1B (google/gemma-3-1b-pt config.json): 26 layers, every
 * 6th global (4 full-attention layers, 22 sliding), sliding_window 512,
 * 1 KV head of 256, bf16 K/V, pages of 16 tokens; window_slack 16 (the
 * runtime's rollback room). The prompt is planned in chunks of 512 tokens
 * (as `llmem serve` admits prompts), so the windowed pool only needs the
 * window plus one chunk per sequence. Only the memory runs (no forward
 * pass): it counts pages. Figures are pages held after the last commit
 * times the bytes of a page over the cache's layers (K and V), read from
 * llmem_memory_get_stats, and the device bytes each pool allocated.
 */
#include <stdio.h>
#include <stdlib.h>

#include "llmem/llmem.h"

#define N_LAYERS 26
#define N_GLOBAL 4
#define WINDOW 512
#define SLACK 16
#define PAGE 16
#define CHUNK 512

static int fail(const char *what, llmem_status st, const char *err)
{
    fprintf(stderr, "swa_memory: %s: %s %s\n", what, llmem_status_str(st), err ? err : "");
    return 1;
}

int main(int argc, char **argv)
{
    int32_t ctx = argc > 1 ? atoi(argv[1]) : 32768, n_seqs = argc > 2 ? atoi(argv[2]) : 1;
    if (ctx < 1 || n_seqs < 1 || n_seqs > 64) {
        fprintf(stderr, "usage: swa_memory [context_tokens >= 1] [n_seqs 1..64]\n");
        return 2;
    }
    char err[256] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open("cpu", -1, &be, err, sizeof err);
    if (st != LLMEM_OK)
        return fail("cpu backend", st, err);
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_kv_heads = 1;
    p.head_dim = 256;
    p.dtype = LLMEM_DTYPE_BF16;
    p.page_size = PAGE;
    p.n_seq_max = n_seqs;
    p.no_prefix_cache = true;
    int32_t pages_ctx = (ctx + PAGE - 1) / PAGE;
    llmem_memory *ch[2] = {NULL, NULL}, *h = NULL;
    p.n_layers = N_LAYERS - N_GLOBAL; /* sliding layers: window + slack + one chunk */
    p.window = WINDOW;
    p.window_slack = SLACK;
    p.n_pages = n_seqs * ((WINDOW + SLACK + CHUNK) / PAGE + 2);
    if ((st = llmem_kv_cache_create(be, &p, &ch[0], err, sizeof err)) != LLMEM_OK)
        return fail("windowed cache", st, err);
    p.n_layers = N_GLOBAL;
    p.window = p.window_slack = 0;
    p.n_pages = n_seqs * pages_ctx;
    if ((st = llmem_kv_cache_create(be, &p, &ch[1], err, sizeof err)) != LLMEM_OK)
        return fail("full cache", st, err);
    int32_t map[N_LAYERS];
    for (int32_t il = 0; il < N_LAYERS; il++)
        map[il] = (il + 1) % 6 == 0 ? 1 : 0; /* Gemma-3: every 6th layer global */
    if ((st = llmem_hybrid_create(ch, 2, map, N_LAYERS, &h, err, sizeof err)) != LLMEM_OK)
        return fail("hybrid", st, err);
    llmem_batch_buf *b = NULL;
    if ((st = llmem_batch_buf_create(CHUNK * n_seqs, 1, &b)) != LLMEM_OK)
        return fail("batch", st, NULL);
    for (int32_t at = 0; at < ctx; at += CHUNK) {
        llmem_batch_buf_clear(b);
        int32_t n = ctx - at < CHUNK ? ctx - at : CHUNK;
        for (int32_t s = 0; s < n_seqs; s++)
            for (int32_t i = 0; i < n; i++)
                llmem_batch_buf_add(b, (at + i) % 1000, at + i, &s, 1, i == n - 1);
        llmem_plan *plan = NULL;
        st = llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, CHUNK, &plan, err,
                               sizeof err);
        for (int32_t u = 0; st == LLMEM_OK && u < llmem_plan_n_ubatch(plan); u++) {
            const llmem_ubatch *ub;
            st = llmem_memory_apply(h, plan, u, &ub);
            if (st == LLMEM_OK)
                st = llmem_memory_commit(h, plan, u);
        }
        llmem_memory_release(h, plan);
        if (st != LLMEM_OK)
            return fail("plan", st, err);
    }
    if ((st = llmem_memory_check(h, err, sizeof err)) != LLMEM_OK)
        return fail("invariants", st, err);
    llmem_memory_stats sw, sf;
    llmem_memory_get_stats(ch[0], &sw);
    llmem_memory_get_stats(ch[1], &sf);
    /* bytes of one page over all of a cache's layers, K and V */
    double page_w = (double)sw.bytes_device / (double)sw.pages_total;
    double page_f = (double)sf.bytes_device / (double)sf.pages_total;
    double held_w = (double)sw.pages_used * page_w, held_f = (double)sf.pages_used * page_f;
    /* every layer full: the full cache's bytes per layer times 26 */
    double all_full = held_f / N_GLOBAL * N_LAYERS;
    const double mib = 1048576.0;
    printf("context %d tokens x %d sequence(s), Gemma-3 1B shape (26 layers: 22 sliding "
           "window %d + 4 global; 1 KV head x 256, bf16, page %d)\n",
           ctx, n_seqs, WINDOW, PAGE);
    printf("sliding layers: %lld pages held (peak %lld) = %.2f MiB; pool %.2f MiB\n",
           (long long)sw.pages_used, (long long)sw.pages_peak, held_w / mib,
           (double)sw.bytes_device / mib);
    printf("global layers:  %lld pages held = %.2f MiB; pool %.2f MiB\n",
           (long long)sf.pages_used, held_f / mib, (double)sf.bytes_device / mib);
    printf("KV held: %.2f MiB with the window, %.2f MiB with every layer full (%.2fx less)\n",
           (held_w + held_f) / mib, all_full / mib, all_full / (held_w + held_f));
    llmem_batch_buf_destroy(b);
    llmem_memory_destroy(h);
    llmem_backend_close(be);
    return 0;
}

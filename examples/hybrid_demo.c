/* hybrid_demo: plans and applies a multi-sequence batch on a hybrid memory
 * (a paged KV cache for attention layers + Mamba-2 recurrent state for the
 * others, as in Bamba / Granite-4.0-H) and prints what the memory did.
 * Run: build/bin/hybrid_demo [backend]   (default "cpu") */
#include <stdio.h>
#include <string.h>

#include "llmem/llmem.h"

static void print_view(const llmem_view *v, int32_t il)
{
    if (v->kind == LLMEM_VIEW_KV) {
        const llmem_kv_view *kv = llmem_view_kv(v);
        printf("    layer %d (attention): %d K/V stores, slots", il, kv->store_slot.n);
        for (int32_t j = 0; j < kv->store_slot.n && j < 8; j++)
            printf(" %d", kv->store_slot.host[j]);
        printf("%s; %d streams, seq_len", kv->store_slot.n > 8 ? " ..." : "", kv->seq_len.n);
        for (int32_t s = 0; s < kv->seq_len.n; s++)
            printf(" %d", kv->seq_len.host[s]);
        printf("\n");
    } else if (v->kind == LLMEM_VIEW_RECURRENT) {
        const llmem_rs_view *rs = llmem_view_rs(v);
        printf("    layer %d (mamba2): %d streams x %d tokens, src/dst slots", il, rs->n_seqs,
               rs->n_seq_tokens);
        for (int32_t s = 0; s < rs->n_seqs; s++)
            printf(" %d->%d", rs->src_slot.host[s], rs->dst_slot.host[s]);
        printf(", %d checkpoints each\n", rs->n_ckpt);
    }
}

static int run_batch(llmem_memory *mem, llmem_batch_buf *bb, const char *what)
{
    char err[256] = "";
    llmem_plan *plan = NULL;
    llmem_status st = llmem_memory_plan(mem, llmem_batch_buf_get(bb), LLMEM_SPLIT_AUTO, 8, &plan,
                                        err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "plan failed: %s: %s\n", llmem_status_str(st), err);
        return 1;
    }
    llmem_plan_info info;
    llmem_plan_get_info(plan, &info);
    printf("%s: %d tokens -> %d ubatches (split %s), %d output rows\n", what,
           llmem_batch_buf_get(bb)->n_tokens, info.n_ubatch, llmem_split_name(info.split),
           info.n_outputs);
    for (int32_t i = 0; i < info.n_ubatch; i++) {
        const llmem_ubatch *ub;
        if ((st = llmem_memory_apply(mem, plan, i, &ub)) != LLMEM_OK)
            break;
        printf("  ubatch %d: %d tokens, sequences", i, ub->n_tokens);
        for (int32_t s = 0; s < ub->n_seqs; s++)
            printf(" %d", ub->seq_id[s]);
        printf("\n");
        for (int32_t il = 0; il < llmem_memory_n_layers(mem); il++) {
            llmem_view v;
            if ((st = llmem_memory_view(mem, il, &v)) != LLMEM_OK)
                break;
            /* a model's forward pass would run its kernels here */
            print_view(&v, il);
        }
        if (st == LLMEM_OK)
            st = llmem_memory_commit(mem, plan, i);
        if (st != LLMEM_OK)
            break;
    }
    llmem_memory_release(mem, plan);
    if (st != LLMEM_OK) {
        fprintf(stderr, "ubatch failed: %s\n", llmem_status_str(st));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cpu";
    char err[256] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open(name, -1, &be, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "cannot open backend '%s': %s\n", name, err);
        return 1;
    }
    /* 4 layers: mamba2, attention, mamba2, attention */
    enum { N_LAYERS = 4, N_SEQ = 3 };
    const int32_t layer_child[N_LAYERS] = {1, 0, 1, 0};
    llmem_kv_cache_params kp = llmem_kv_cache_default_params();
    kp.n_layers = 2;
    kp.n_kv_heads = 2;
    kp.head_dim = 16;
    kp.page_size = 4;
    kp.n_pages = 32;
    kp.n_seq_max = N_SEQ;
    llmem_state_desc m2[2];
    llmem_recurrent_mamba2_states(4, 64, 1, 16, 4, 16, m2);
    const llmem_state_desc *states[2] = {m2, m2};
    const int32_t n_states[2] = {2, 2};
    llmem_recurrent_params rp = {.n_layers = 2, .n_states = n_states, .states = states,
                                 .n_seq_max = N_SEQ, .n_ckpt = 2};
    llmem_memory *children[2] = {NULL, NULL}, *mem = NULL;
    if ((st = llmem_kv_cache_create(be, &kp, &children[0], err, sizeof err)) != LLMEM_OK ||
        (st = llmem_recurrent_create(be, &rp, &children[1], err, sizeof err)) != LLMEM_OK) {
        fprintf(stderr, "create failed: %s\n", err);
        llmem_memory_destroy(children[0]);
        llmem_backend_close(be);
        return 1;
    }
    if ((st = llmem_hybrid_create(children, 2, layer_child, N_LAYERS, &mem, err, sizeof err))) {
        fprintf(stderr, "hybrid failed: %s\n", err);
        llmem_backend_close(be);
        return 1;
    }
    printf("hybrid memory on %s: %d layers, split %s, %d sequences max\n", llmem_backend_name(be),
           llmem_memory_n_layers(mem), llmem_split_name(llmem_memory_split(mem)), N_SEQ);

    llmem_batch_buf *bb = NULL;
    llmem_batch_buf_create(64, 1, &bb);
    /* prompts of 6, 3 and 9 tokens for sequences 0, 1, 2 */
    const int32_t lens[N_SEQ] = {6, 3, 9};
    for (int32_t s = 0; s < N_SEQ; s++)
        for (int32_t t = 0; t < lens[s]; t++)
            llmem_batch_buf_add(bb, 100 * s + t, t, &s, 1, t == lens[s] - 1);
    int rc = run_batch(mem, bb, "prefill");
    /* one speculative step: 1 + 2 draft tokens per sequence */
    llmem_batch_buf_clear(bb);
    for (int32_t s = 0; s < N_SEQ && !rc; s++)
        for (int32_t t = 0; t < 3; t++)
            llmem_batch_buf_add(bb, 7, lens[s] + t, &s, 1, true);
    if (!rc)
        rc = run_batch(mem, bb, "decode with 2 draft tokens");
    if (!rc) {
        /* sequence 1 rejects both drafts: roll back to its first new token */
        st = llmem_memory_seq_rm(mem, 1, lens[1] + 1, -1);
        printf("rollback of sequence 1 to position %d: %s (state slot now %d)\n", lens[1],
               llmem_status_str(st), llmem_recurrent_seq_slot(children[1], 1));
        st = llmem_memory_seq_cp(mem, 2, 0, -1, -1);
        printf("seq_cp 2 -> 0: %s\n", llmem_status_str(st));
        llmem_memory_stats ms;
        llmem_memory_get_stats(children[0], &ms);
        printf("KV cache: %lld pages used, %lld free, %lld cached, peak %lld, %lld CoW copies\n",
               (long long)ms.pages_used, (long long)ms.pages_free, (long long)ms.pages_cached,
               (long long)ms.pages_peak, (long long)ms.cow_copies);
        llmem_memory_get_stats(children[1], &ms);
        printf("recurrent: %lld of %lld state slots used\n", (long long)ms.slots_used,
               (long long)ms.slots_total);
        for (int32_t s = 0; s < N_SEQ; s++)
            printf("sequence %d: positions [%d, %d]\n", s, llmem_memory_seq_pos_min(mem, s),
                   llmem_memory_seq_pos_max(mem, s));
        if (llmem_memory_check(mem, err, sizeof err) != LLMEM_OK) {
            fprintf(stderr, "invariant violated: %s\n", err);
            rc = 1;
        }
    }
    llmem_batch_buf_destroy(bb);
    llmem_memory_destroy(mem);
    llmem_backend_close(be);
    return rc;
}

// ctest-labels: core
/* Tensor parallelism through the model API (issue 19; docs/tp.md), on the
 * cpu backend and communicator:
 *  - each rank's memory holds only its heads: a rank's device bytes are the
 *    single-rank model's minus the KV (llama) or state (bamba) bytes of the
 *    heads it does not hold, computed here from config.json's sizes;
 *  - one plan for every rank: after decoding, every rank holds the same
 *    sequences (llmem_memory_check compares them), a seq_rm that a rank's
 *    recurrent memory refuses changes no rank;
 *  - decode logits equal the single-rank model's within 2e-5 (log-probs),
 *    also from recorded decode steps replayed with the collectives inside;
 *  - llmem_hybrid_create_ranks composes alike memories and refuses others;
 *  - bad parameters fail with a reason and leave the backend usable;
 *    every failed device allocation of either rank during a --tp 2 load returns
 *    LLMEM_E_NO_MEMORY with a reason and no model.
 * Greedy tokens and log-probs against transformers are in tests/tp.sh. */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/hybrid.h"
#include "llmem/kv_cache.h"
#include "llmem/model.h"
#include "llmem/recurrent.h"
#include "llmem/runtime.h"
#include "support/load_faults.h"

static llmem_model_params params(int32_t tp)
{
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = 2;
    p.n_ctx = 64;
    p.n_ubatch = 16;
    p.tp = tp;
    p.n_snapshots = 0;
    return p;
}

static llmem_model *load(const char *name, llmem_backend *be, int32_t tp)
{
    char err[512];
    llmem_model *m = NULL;
    llmem_model_params p = params(tp);
    ck_assert_msg(llmem_model_load(test_fixture(name), be, &p, &m, err, sizeof err) == LLMEM_OK,
                  "%s --tp %d: %s", name, tp, err);
    return m;
}

static int64_t bytes_of(llmem_memory *mem)
{
    llmem_memory_stats st = {0};
    ck_assert_int_eq(llmem_memory_get_stats(mem, &st), LLMEM_OK);
    return st.bytes_device;
}

START_TEST(test_rank_memories_hold_their_heads)
{
    llmem_backend *be = test_open("cpu");
    /* llama: 2 attention layers' KV pools, f32, pages [n_pages][16][Hk][Dh] */
    llmem_model *m1 = load("llama", be, 1), *m2 = load("llama", be, 2), *m4 = load("llama", be, 4);
    const llmem_model_config *c = llmem_model_get_config(m1);
    int64_t n_pages = 2 * 64 / 16, per_head = (int64_t)n_pages * 16 * c->head_dim * 4 * 2 *
                                              c->n_attention_layers;
    llmem_memory *mem2 = llmem_model_memory(m2), *mem4 = llmem_model_memory(m4);
    ck_assert_int_eq(llmem_memory_n_children(mem2), 2);
    ck_assert_int_eq(llmem_memory_n_children(mem4), 4);
    int64_t b1 = bytes_of(llmem_model_memory(m1));
    for (int32_t r = 0; r < 2; r++) /* Hk 2 over 2 ranks: one KV head each */
        ck_assert_int_eq(bytes_of(llmem_memory_child(mem2, r)),
                         b1 - per_head * (c->n_kv_heads - c->n_kv_heads / 2));
    for (int32_t r = 0; r < 4; r++) /* Hk 2 over 4 ranks: one (replicated) KV head each */
        ck_assert_int_eq(bytes_of(llmem_memory_child(mem4, r)),
                         b1 - per_head * (c->n_kv_heads - 1));
    llmem_model_free(m1);
    llmem_model_free(m2);
    llmem_model_free(m4);
    /* bamba: the Mamba-2 state of a rank is its heads' (conv channels of x,
     * B, C; ssm [heads, head_dim, d_state]), per sequence slot and layer */
    m1 = load("bamba", be, 1);
    m2 = load("bamba", be, 2);
    c = llmem_model_get_config(m1);
    int64_t g2 = c->ssm_n_groups >= 2 ? c->ssm_n_groups / 2 : 1;
    int64_t conv1 = (int64_t)(c->ssm_d_conv - 1) * c->ssm_conv_dim,
            conv2 = (int64_t)(c->ssm_d_conv - 1) * (c->ssm_d_inner / 2 + 2 * g2 * c->ssm_d_state);
    int64_t ssm1 = (int64_t)c->ssm_n_heads * c->ssm_head_dim * c->ssm_d_state;
    int64_t state_diff = (conv1 - conv2 + ssm1 / 2) * 4 * c->n_mamba_layers;
    int64_t kv_diff = (int64_t)n_pages * 16 * c->head_dim * 4 * 2 * c->n_attention_layers *
                      (c->n_kv_heads / 2);
    int64_t b1b = bytes_of(llmem_model_memory(m1));
    mem2 = llmem_model_memory(m2);
    for (int32_t r = 0; r < 2; r++) {
        llmem_memory *rank = llmem_memory_child(mem2, r);
        llmem_memory_stats st = {0};
        ck_assert_int_eq(llmem_memory_get_stats(rank, &st), LLMEM_OK);
        ck_assert_int_gt(st.slots_total, 0);
        ck_assert_int_eq(b1b - bytes_of(rank), kv_diff + st.slots_total * state_diff);
    }
    llmem_model_free(m1);
    llmem_model_free(m2);
    llmem_backend_close(be);
}
END_TEST

/* Decodes two sequences sharing a prefix, then one more token each;
 * returns the log-probs of the last rows [2][V]. */
static void run(llmem_model *m, float *out)
{
    char err[256];
    int32_t tok[12], pos[12], seq[12];
    const int32_t *seqp[12];
    int8_t outf[12];
    for (int32_t i = 0; i < 12; i++) {
        tok[i] = (i * 37 + 11) % 200;
        pos[i] = i % 6;
        seq[i] = i / 6;
        seqp[i] = &seq[i];
        outf[i] = i % 6 == 5;
    }
    tok[6] = tok[0];
    tok[7] = tok[1]; /* shared prefix */
    int32_t n_seq_id[12];
    for (int32_t i = 0; i < 12; i++)
        n_seq_id[i] = 1;
    llmem_batch b = {.n_tokens = 12, .token = tok, .pos = pos, .n_seq_id = n_seq_id,
                     .seq_id = seqp, .output = outf};
    int32_t n_out = 0;
    ck_assert_msg(llmem_model_decode(m, &b, true, out, 2, &n_out, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(n_out, 2);
}

START_TEST(test_one_plan_for_every_rank)
{
    const char *name = _i == 0 ? "llama" : "bamba";
    char err[256];
    llmem_backend *be = test_open("cpu");
    llmem_model *m1 = load(name, be, 1), *m2 = load(name, be, 2);
    int32_t V = llmem_model_n_vocab(m1);
    float *a = malloc((size_t)V * 2 * sizeof *a), *b = malloc((size_t)V * 2 * sizeof *b);
    run(m1, a);
    run(m2, b);
    for (int32_t i = 0; i < 2 * V; i++)
        ck_assert_msg(fabsf(a[i] - b[i]) < 2e-5f, "%s row %d token %d: %g vs %g", name, i / V,
                      i % V, (double)a[i], (double)b[i]);
    /* three decode steps (one token per sequence): recorded, then replayed
     * with the collectives inside, still equal */
    for (int32_t step = 0; step < 3; step++) {
        int32_t tok[2] = {17 + step, 90 + step}, pos[2] = {6 + step, 6 + step}, sq[2] = {0, 1};
        const int32_t *sp[2] = {&sq[0], &sq[1]};
        int8_t o[2] = {1, 1};
        llmem_batch d = {.n_tokens = 2, .token = tok, .pos = pos, .seq_id = sp, .output = o};
        int32_t n1 = 0, n2 = 0;
        ck_assert_int_eq(llmem_model_decode(m1, &d, true, a, 2, &n1, err, sizeof err), LLMEM_OK);
        ck_assert_int_eq(llmem_model_decode(m2, &d, true, b, 2, &n2, err, sizeof err), LLMEM_OK);
        for (int32_t i = 0; i < 2 * V; i++)
            ck_assert_msg(fabsf(a[i] - b[i]) < 2e-5f, "%s step %d row %d token %d: %g vs %g",
                          name, step, i / V, i % V, (double)a[i], (double)b[i]);
    }
    llmem_model_stats ms = {0};
    llmem_model_get_stats(m2, &ms);
    ck_assert_int_ge(ms.n_replayed, 1);
    llmem_memory *mem = llmem_model_memory(m2);
    ck_assert_int_eq(llmem_memory_check(mem, err, sizeof err), LLMEM_OK);
    for (int32_t r = 0; r < 2; r++) {
        llmem_memory *rank = llmem_memory_child(mem, r);
        ck_assert_int_eq(llmem_memory_seq_pos_max(rank, 0), 8);
        ck_assert_int_eq(llmem_memory_seq_pos_max(rank, 1), 8);
    }
    if (_i == 1) { /* a recurrent rank cannot cut to position 3 (no checkpoint): none does */
        ck_assert_int_ne(llmem_memory_seq_rm(mem, 0, 3, -1), LLMEM_OK);
        for (int32_t r = 0; r < 2; r++)
            ck_assert_int_eq(llmem_memory_seq_pos_max(llmem_memory_child(mem, r), 0), 8);
    }
    ck_assert_int_eq(llmem_memory_seq_rm(mem, 1, -1, -1), LLMEM_OK); /* all ranks or none */
    for (int32_t r = 0; r < 2; r++)
        ck_assert_int_eq(llmem_memory_seq_pos_max(llmem_memory_child(mem, r), 1), -1);
    ck_assert_int_eq(llmem_memory_check(mem, err, sizeof err), LLMEM_OK);
    free(a);
    free(b);
    llmem_model_free(m1);
    llmem_model_free(m2);
    llmem_backend_close(be);
}
END_TEST

static llmem_memory *kv_of_layers(llmem_backend *be, int32_t n_layers)
{
    char err[256];
    llmem_kv_cache_params kp = llmem_kv_cache_default_params();
    kp.n_layers = n_layers;
    kp.n_kv_heads = 1;
    kp.head_dim = 2;
    kp.dtype = LLMEM_DTYPE_F32;
    kp.page_size = 4;
    kp.n_pages = 8;
    kp.n_seq_max = 2;
    llmem_memory *m = NULL;
    ck_assert_msg(llmem_kv_cache_create(be, &kp, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    return m;
}

/* llmem_hybrid_create_ranks: layers r * L + l, and memories that are not
 * alike refused with a reason (the composition owns them either way: the
 * sanitizer build checks that none leaks). */
START_TEST(test_ranks_composition)
{
    char err[256];
    llmem_backend *be = test_open("cpu");
    llmem_memory *r3[3] = {kv_of_layers(be, 2), kv_of_layers(be, 2), kv_of_layers(be, 2)};
    llmem_memory *tp = NULL;
    ck_assert_int_eq(llmem_hybrid_create_ranks(r3, 3, &tp, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_n_layers(tp), 6);
    ck_assert_int_eq(llmem_memory_n_children(tp), 3);
    for (int32_t r = 0; r < 3; r++)
        ck_assert_ptr_eq(llmem_memory_child(tp, r), r3[r]);
    llmem_memory_stats st = {0};
    ck_assert_int_eq(llmem_memory_get_stats(tp, &st), LLMEM_OK);
    ck_assert_str_eq(st.type, "tp");
    ck_assert_int_eq(st.pages_total, 8); /* rank 0's count, not 3 x 8 */
    llmem_memory_destroy(tp);
    llmem_memory *bad[2] = {kv_of_layers(be, 2), kv_of_layers(be, 3)};
    ck_assert_int_eq(llmem_hybrid_create_ranks(bad, 2, &tp, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(tp);
    ck_assert_msg(strstr(err, "rank 1"), "%s", err);
    llmem_state_desc d = {.name = "s", .n_dims = 1, .shape = {4}, .dtype = LLMEM_DTYPE_F32};
    const llmem_state_desc *states[2] = {&d, &d};
    int32_t n_states[2] = {1, 1};
    llmem_recurrent_params rp = {.n_layers = 2, .n_states = n_states, .states = states,
                                 .n_seq_max = 2};
    llmem_memory *mixed[2] = {kv_of_layers(be, 2), NULL};
    ck_assert_int_eq(llmem_recurrent_create(be, &rp, &mixed[1], err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_hybrid_create_ranks(mixed, 2, &tp, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_hybrid_create_ranks(NULL, 2, &tp, err, sizeof err), LLMEM_E_INVALID);
    llmem_memory *one[1] = {kv_of_layers(be, 1)};
    ck_assert_int_eq(llmem_hybrid_create_ranks(one, 0, &tp, err, sizeof err), LLMEM_E_INVALID);
    llmem_memory_destroy(one[0]); /* n_ranks 0 took nothing */
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_bad_input)
{
    char err[512];
    llmem_backend *be = NULL;
    llmem_model *m = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, err, sizeof err), LLMEM_OK);
    llmem_model_params p = params(-1);
    ck_assert_int_eq(llmem_model_load(test_fixture("llama"), be, &p, &m, err, sizeof err),
                     LLMEM_E_INVALID);
    p.tp = 65;
    ck_assert_int_eq(llmem_model_load(test_fixture("llama"), be, &p, &m, err, sizeof err),
                     LLMEM_E_INVALID);
    p.tp = 3;
    ck_assert_int_eq(llmem_model_load(test_fixture("llama"), be, &p, &m, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "num_attention_heads") && strstr(err, "--tp 3"), "%s", err);
    ck_assert_ptr_null(m);
    p.tp = 2;
    ck_assert_int_eq(llmem_model_load(test_fixture("jamba"), be, &p, &m, err, sizeof err),
                     LLMEM_E_UNSUPPORTED);
    ck_assert_msg(strstr(err, "not split yet"), "%s", err);
    /* every device allocation of a --tp 2 load failing in turn (be's hook
     * reaches rank 1's backend too) */
    lf_hook h = {0, -1};
    llmem_backend_set_alloc_hook(be, lf_alloc, &h);
    m = load("bamba", be, 1);
    llmem_model_free(m);
    int64_t one = h.calls;
    h.calls = 0;
    m = load("bamba", be, 2);
    llmem_model_free(m);
    int64_t total = h.calls;
    ck_assert_int_gt(total, one + 10); /* rank 1's allocations reach the hook too */
    for (int64_t k = 0; k < total; k++) {
        h.calls = 0;
        h.fail_at = k;
        m = NULL;
        strcpy(err, "stale");
        llmem_status s = llmem_model_load(test_fixture("bamba"), be, &p, &m, err, sizeof err);
        ck_assert_msg(s == LLMEM_E_NO_MEMORY, "allocation %lld: %s (%s)", (long long)k,
                      llmem_status_str(s), err);
        ck_assert_ptr_null(m);
        ck_assert_msg(err[0] && strcmp(err, "stale"), "allocation %lld: no reason", (long long)k);
    }
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    /* the backend handed in still works */
    m = load("llama", be, 1);
    llmem_model_free(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tp");
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_rank_memories_hold_their_heads);
    tcase_add_loop_test(tc, test_one_plan_for_every_rank, 0, 2);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_ranks_composition);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

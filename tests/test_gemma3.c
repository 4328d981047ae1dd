// ctest-labels: core
/* gemma3_text (models/gemma3.c): config.json read as transformers'
 * Gemma3TextConfig reads it, and the per-layer memory the runtime builds
 * for the fixture (tests/fixtures/gemma3_text): the sliding layers in a
 * windowed KV cache with the layers' own window, the global layer in a
 * full one. Expected windows, RoPE bases and page counts come from the
 * config text and a brute force over the sliding-window mask, never from
 * the code under test. Parity of the model itself: tests/parity.sh. */
#include "support/run.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/memtest.h"

/* ---- gemma3_text: config and per-layer memory ----------------------------------- */

static llmem_status parse(const char *json, llmem_model_config *c, char *err, size_t n)
{
    return llmem_model_config_parse(json, strlen(json), c, err, n);
}

/* Layer types, windows and per-type RoPE as transformers' Gemma3TextConfig
 * reads them: explicit layer_types; else every sliding_window_pattern-th
 * layer global; classic rope_theta (global) / rope_local_base_freq. */
START_TEST(test_gemma3_config)
{
    llmem_model_config c;
    char err[256] = "";
    const char *base = "{\"model_type\": \"gemma3_text\", \"vocab_size\": 32, "
                       "\"hidden_size\": 8, \"intermediate_size\": 16, "
                       "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                       "\"head_dim\": 4, \"query_pre_attn_scalar\": 4, ";
    char json[1024];
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 4, \"sliding_window\": 5, "
             "\"layer_types\": [\"sliding_attention\", \"full_attention\", "
             "\"sliding_attention\", \"full_attention\"], \"final_logit_softcapping\": 30.0, "
             "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", "
             "\"factor\": 8.0, \"rope_theta\": 1000000.0}, \"sliding_attention\": "
             "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}}}", base);
    ck_assert_msg(parse(json, &c, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(c.arch, LLMEM_ARCH_GEMMA3_TEXT);
    const int32_t want_w[4] = {5, 0, 5, 0};
    for (int32_t i = 0; i < 4; i++) {
        ck_assert_int_eq(c.layers[i].sliding_window, want_w[i]);
        ck_assert(c.layers[i].rope_theta == (want_w[i] ? 10000.0 : 1000000.0));
        ck_assert(c.layers[i].rope_freq_scale == (want_w[i] ? 1.0 : 0.125));
    }
    ck_assert(fabs(c.attention_scale - 0.5) < 1e-15); /* 4^-0.5 */
    ck_assert(c.final_softcap == 30.0 && c.attn_softcap == 0.0);
    ck_assert(c.tie_word_embeddings && c.gemma_norms && c.ffn_act == LLMEM_ACT_GELU_TANH);
    /* no layer_types: pattern 3 makes layers 2, 5 global; classic RoPE keys */
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 6, \"sliding_window_pattern\": 3, "
             "\"rope_theta\": 500000.0, \"rope_local_base_freq\": 20000.0}", base);
    ck_assert_msg(parse(json, &c, err, sizeof err) == LLMEM_OK, "%s", err);
    for (int32_t i = 0; i < 6; i++) {
        ck_assert_int_eq(c.layers[i].sliding_window, (i + 1) % 3 ? 4096 : 0);
        ck_assert(c.layers[i].rope_theta == ((i + 1) % 3 ? 20000.0 : 500000.0));
    }
    /* bad input: a named reason, nothing half-parsed */
    /* a layer type gemma3 does not define (Llama 4's chunked attention) is
     * unsupported, as in every family (hf_cfg_layer_names); a list of the
     * wrong length is damage */
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 2, \"layer_types\": "
             "[\"sliding_attention\", \"chunked_attention\"]}", base);
    ck_assert_int_eq(parse(json, &c, err, sizeof err), LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "layer 1 has type 'chunked_attention'"));
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 2, \"layer_types\": "
             "[\"sliding_attention\"]}", base);
    ck_assert_int_eq(parse(json, &c, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "'layer_types' must be an array of num_hidden_layers (2)"));
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 2, \"hidden_activation\": \"relu\"}",
             base);
    ck_assert_int_eq(parse(json, &c, err, sizeof err), LLMEM_E_UNSUPPORTED);
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 2, \"attn_logit_softcapping\": -1}",
             base);
    ck_assert_int_eq(parse(json, &c, err, sizeof err), LLMEM_E_CORRUPT);
    snprintf(json, sizeof json, "%s\"num_hidden_layers\": 2, \"rope_parameters\": "
             "{\"full_attention\": {\"rope_type\": \"yarn\"}}}", base);
    ck_assert_int_eq(parse(json, &c, err, sizeof err), LLMEM_E_UNSUPPORTED);
}
END_TEST

/* The fixture's memory: the sliding layers 0, 1, 3 in a cache with the
 * config's window, the global layer 2 in a full one, composed by the
 * hybrid; after a long prompt the windowed child holds only its window. */
START_TEST(test_gemma3_memory)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/gemma3_text", test_source_dir());
    llmem_backend *be = mt_cpu();
    llmem_model_params p = llmem_model_default_params();
    p.page_size = 8;
    p.n_seq_max = 1;
    p.n_ctx = 256;
    llmem_model *m = NULL;
    char err[512] = "";
    ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    const llmem_model_config *c = llmem_model_get_config(m);
    ck_assert_int_eq(c->layers[0].sliding_window, 20);
    ck_assert_int_eq(c->layers[2].sliding_window, 0);
    llmem_memory *mem = llmem_model_memory(m);
    ck_assert_int_eq(llmem_memory_n_children(mem), 2);
    llmem_memory *w = llmem_memory_child(mem, 0), *f = llmem_memory_child(mem, 1);
    ck_assert_int_eq(llmem_kv_cache_window(w), 20);
    ck_assert_int_eq(llmem_memory_n_layers(w), 3);
    ck_assert_int_eq(llmem_kv_cache_window(f), 0);
    ck_assert_int_eq(llmem_memory_n_layers(f), 1);
    llmem_batch_buf *b = mt_batch_new();
    for (int32_t i = 0; i < 150; i++)
        ck_assert_int_eq(llmem_batch_buf_add(b, (i * 7) % 256, i, &(int32_t){0}, 1, i == 149),
                         LLMEM_OK);
    float *logits = malloc((size_t)llmem_model_n_vocab(m) * sizeof *logits);
    int32_t n_out = 0;
    ck_assert_msg(llmem_model_decode(m, llmem_batch_buf_get(b), true, logits, 1, &n_out, err,
                                     sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(n_out, 1);
    /* window 20 + the runtime's rollback slack of 16 tokens */
    ck_assert_int_eq(mt_held_pages(w, 0), mt_window_pages_needed(150, 8, 20, 16));
    ck_assert_int_eq(mt_held_pages(f, 0), (150 + 7) / 8);
    mt_assert_check(mem);
    free(logits);
    llmem_batch_buf_destroy(b);
    llmem_model_free(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gemma3");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_gemma3_config);
    tcase_add_test(tc, test_gemma3_memory);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}

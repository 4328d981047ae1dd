// ctest-labels: core
/* config.json and tensor names of lfm2 and jamba (issue 16). The fixtures
 * were written by transformers 5.17 (tools/make_fixtures.py) from known
 * constructor arguments: those arguments and the saved tensor names are the
 * independent reference. Inline configs check the derived sizes against
 * transformers' formulas worked by hand (Lfm2MLP's adjusted width,
 * JambaConfig's dt_rank "auto" and layer periods) and the error paths. */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "support/config_fixture.h"
#include "llmem/runtime.h"

static char err[512];

static llmem_status parse(const char *json, llmem_model_config *m)
{
    err[0] = '\0';
    return llmem_model_config_parse(json, strlen(json), m, err, sizeof err);
}

static void expect_weight(const llmem_model_config *m, llmem_weight w, int32_t layer,
                          const char *want, int64_t d0, int64_t d1)
{
    char name[256];
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS] = {0};
    int32_t nd = 0;
    bool has = llmem_model_weight(m, w, layer, name, sizeof name, shape, &nd);
    if (!want) {
        ck_assert_msg(!has, "weight %d of layer %d should not exist, got '%s'", w, layer, name);
        return;
    }
    ck_assert_msg(has, "weight %d of layer %d missing (want '%s')", w, layer, want);
    ck_assert_str_eq(name, want);
    ck_assert_int_eq(shape[0], d0);
    if (nd > 1)
        ck_assert_int_eq(shape[1], d1);
}

START_TEST(test_fixture_lfm2)
{
    llmem_model_config m;
    cfg_check_fixture(test_fixture("lfm2"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_LFM2);
    ck_assert_str_eq(llmem_arch_name(m.arch), "lfm2");
    const llmem_layer_kind want[4] = {LLMEM_LAYER_SHORTCONV, LLMEM_LAYER_SHORTCONV,
                                      LLMEM_LAYER_ATTENTION, LLMEM_LAYER_SHORTCONV};
    for (int i = 0; i < 4; i++)
        ck_assert(m.layers[i].kind == want[i] && m.layers[i].has_ffn);
    ck_assert_int_eq(m.n_mamba_layers, 3);
    ck_assert_int_eq(m.n_attention_layers, 1);
    ck_assert_int_eq(m.intermediate_size, 128); /* block_auto_adjust_ff_dim false */
    ck_assert_int_eq(m.ssm_d_conv, 3);
    ck_assert_int_eq(m.head_dim, 16);
    ck_assert(m.tie_word_embeddings && !m.ssm_conv_bias && m.use_rope && m.rope_theta == 5000.0);
    expect_weight(&m, LLMEM_W_ATTN_Q_NORM, 2, "model.layers.2.self_attn.q_layernorm.weight", 16, 0);
    expect_weight(&m, LLMEM_W_ATTN_O, 2, "model.layers.2.self_attn.out_proj.weight", 64, 64);
    expect_weight(&m, LLMEM_W_SSM_IN, 0, "model.layers.0.conv.in_proj.weight", 192, 64);
    expect_weight(&m, LLMEM_W_SSM_IN, 2, NULL, 0, 0);
    expect_weight(&m, LLMEM_W_ATTN_K_NORM, 1, NULL, 0, 0);
    expect_weight(&m, LLMEM_W_FINAL_NORM, 0, "model.embedding_norm.weight", 64, 0);
    expect_weight(&m, LLMEM_W_LM_HEAD, 0, NULL, 0, 0);
}
END_TEST

START_TEST(test_fixture_jamba)
{
    llmem_model_config m;
    cfg_check_fixture(test_fixture("jamba"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_JAMBA);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(m.layers[i].kind, i % 2 ? LLMEM_LAYER_ATTENTION : LLMEM_LAYER_MAMBA1);
        ck_assert(m.layers[i].ffn_moe == (i % 2 == 1));
    }
    ck_assert_int_eq(m.n_mamba_layers, 2);
    ck_assert(m.ssm_d_inner == 128 && m.ssm_d_state == 16 && m.ssm_d_conv == 4);
    ck_assert_int_eq(m.ssm_dt_rank, 4);
    ck_assert(m.ssm_conv_bias && !m.ssm_proj_bias && !m.use_rope);
    ck_assert(m.n_expert == 4 && m.n_expert_used == 2 && m.moe_intermediate_size == 96);
    ck_assert(m.moe_gated && !m.moe_sigmoid && !m.moe_norm_topk && m.moe_split_experts);
    ck_assert(!m.tie_word_embeddings && m.norm_eps == 1e-6);
    expect_weight(&m, LLMEM_W_SSM_X_PROJ, 0, "model.layers.0.mamba.x_proj.weight", 36, 128);
    expect_weight(&m, LLMEM_W_SSM_A_LOG, 2, "model.layers.2.mamba.A_log", 128, 16);
    expect_weight(&m, LLMEM_W_SSM_DT_BIAS, 0, "model.layers.0.mamba.dt_proj.bias", 128, 0);
    expect_weight(&m, LLMEM_W_SSM_X_PROJ, 1, NULL, 0, 0);
    expect_weight(&m, LLMEM_W_FFN_GATE, 1, NULL, 0, 0);
    expect_weight(&m, LLMEM_W_FFN_GATE, 0, "model.layers.0.feed_forward.gate_proj.weight", 96, 64);
    expect_weight(&m, LLMEM_W_MOE_ROUTER, 3, "model.layers.3.feed_forward.router.weight", 4, 64);
    expect_weight(&m, LLMEM_W_MOE_ROUTER, 0, NULL, 0, 0);
    expect_weight(&m, LLMEM_W_ATTN_O, 1, "model.layers.1.self_attn.o_proj.weight", 64, 64);
}
END_TEST

START_TEST(test_lfm2_inline)
{
    llmem_model_config m;
    const char *base = "{\"model_type\": \"lfm2\", \"vocab_size\": 32, \"hidden_size\": 16, "
                       "\"num_hidden_layers\": 3, \"num_attention_heads\": 2, %s}";
    char json[1024];
    /* Lfm2MLP: int(2 * 12288 / 3) = 8192; int(1.5 * 8192) = 12288, a multiple of 256 */
    snprintf(json, sizeof json, base, "\"intermediate_size\": 12288, "
             "\"block_ffn_dim_multiplier\": 1.5, \"full_attn_idxs\": [1]");
    ck_assert_msg(parse(json, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.intermediate_size, 12288);
    ck_assert(m.layers[0].kind == LLMEM_LAYER_SHORTCONV && m.layers[1].kind == LLMEM_LAYER_ATTENTION);
    ck_assert(m.tie_word_embeddings); /* Lfm2Config's default */
    ck_assert_int_eq(m.ssm_d_conv, 3);
    /* int(2 * 1000 / 3) = 666; times 1.0, rounded up to 256: 768 */
    snprintf(json, sizeof json, base, "\"intermediate_size\": 1000, "
             "\"block_ffn_dim_multiplier\": 1.0");
    ck_assert_msg(parse(json, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.intermediate_size, 768);
    /* no multiplier: only the 2/3 */
    snprintf(json, sizeof json, base, "\"intermediate_size\": 1000, "
             "\"block_ffn_dim_multiplier\": null, \"conv_L_cache\": 4, \"conv_bias\": true");
    ck_assert_msg(parse(json, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.intermediate_size, 666);
    ck_assert(m.ssm_d_conv == 4 && m.ssm_conv_bias && m.ssm_proj_bias);
    snprintf(json, sizeof json, base, "\"layer_types\": [\"conv\", \"mamba\", \"conv\"]");
    ck_assert_int_eq(parse(json, &m), LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "mamba"));
    snprintf(json, sizeof json, base, "\"layer_types\": [\"conv\"]");
    ck_assert_int_eq(parse(json, &m), LLMEM_E_CORRUPT);
    snprintf(json, sizeof json, base, "\"conv_L_cache\": 1");
    ck_assert_int_eq(parse(json, &m), LLMEM_E_CORRUPT);
}
END_TEST

START_TEST(test_jamba_inline)
{
    llmem_model_config m;
    const char *base = "{\"model_type\": \"jamba\", \"vocab_size\": 32, \"hidden_size\": 100, "
                       "\"num_hidden_layers\": 6, \"num_attention_heads\": 4, "
                       "\"intermediate_size\": 40, %s}";
    char json[1024];
    /* dt_rank "auto": ceil(100 / 16) = 7; attention at 3 (period 3, offset 0 -> 0, 3) */
    snprintf(json, sizeof json, base, "\"mamba_dt_rank\": \"auto\", \"attn_layer_period\": 3, "
             "\"attn_layer_offset\": 0, \"num_experts\": 1");
    ck_assert_msg(parse(json, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.ssm_dt_rank, 7);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(m.layers[i].kind, i % 3 == 0 ? LLMEM_LAYER_ATTENTION : LLMEM_LAYER_MAMBA1);
        ck_assert(!m.layers[i].ffn_moe);
    }
    ck_assert_int_eq(m.n_expert, 0);
    ck_assert_int_eq(m.ssm_d_inner, 200); /* mamba_expand 2 */
    snprintf(json, sizeof json, base, "\"mamba_dt_rank\": 12, \"expert_layer_period\": 3, "
             "\"expert_layer_offset\": 2");
    ck_assert_msg(parse(json, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.ssm_dt_rank, 12);
    ck_assert(m.layers[2].ffn_moe && m.layers[5].ffn_moe && !m.layers[1].ffn_moe);
    ck_assert_int_eq(m.n_expert, 16); /* JambaConfig's default */
    snprintf(json, sizeof json, base, "\"attn_layer_period\": 2, \"attn_layer_offset\": 2");
    ck_assert_int_eq(parse(json, &m), LLMEM_E_CORRUPT);
    snprintf(json, sizeof json, base, "\"num_experts\": 2, \"num_experts_per_tok\": 3");
    ck_assert_int_eq(parse(json, &m), LLMEM_E_CORRUPT);
}
END_TEST

/* A Mamba-1 state of a dtype ssm_scan1 does not take (int8) is refused when
 * the model loads, naming the op and the layer, not in the forward pass. */
START_TEST(test_jamba_int8_state_refused)
{
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, NULL, 0), LLMEM_OK);
    llmem_model_params p = llmem_model_default_params();
    p.ssm_dtype = LLMEM_DTYPE_I8;
    llmem_model *m = NULL;
    err[0] = '\0';
    ck_assert_int_eq(llmem_model_load(test_fixture("jamba"), be, &p, &m, err, sizeof err),
                     LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, "ssm_scan1") && strstr(err, "layer 0"), "%s", err);
    p.ssm_dtype = LLMEM_DTYPE_BF16; /* a float state loads */
    ck_assert_msg(llmem_model_load(test_fixture("jamba"), be, &p, &m, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    llmem_model_free(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config_ssm1");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, test_fixture_lfm2);
    tcase_add_test(tc, test_fixture_jamba);
    tcase_add_test(tc, test_lfm2_inline);
    tcase_add_test(tc, test_jamba_inline);
    tcase_add_test(tc, test_jamba_int8_state_refused);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

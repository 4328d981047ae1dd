// ctest-labels: core
/* config.json parsing and the tensor check. The fixtures under
 * tests/fixtures/ were written by transformers 5.17 (tools/make_fixtures.py)
 * from known constructor arguments, so their config.json files and tensor
 * names are the independent reference: the expected sizes below are those
 * arguments, and the tensor names and shapes are what transformers saved.
 * Inline configs cover the classic (transformers 4) spellings and every
 * error path. */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/model.h"
#include "support/config_fixture.h"

static char err[512];

static llmem_status parse(const char *json, llmem_model_config *m)
{
    err[0] = '\0';
    return llmem_model_config_parse(json, strlen(json), m, err, sizeof err);
}

static void load_ok(const char *dir, llmem_model_config *m)
{
    err[0] = '\0';
    ck_assert_msg(llmem_model_config_load(dir, m, err, sizeof err) == LLMEM_OK, "%s", err);
}

START_TEST(test_fixture_llama)
{
    llmem_model_config m;
    cfg_check_fixture(test_fixture("llama"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_LLAMA);
    ck_assert_int_eq(m.vocab_size, 256);
    ck_assert_int_eq(m.hidden_size, 64);
    ck_assert_int_eq(m.n_layers, 2);
    ck_assert_int_eq(m.n_heads, 4);
    ck_assert_int_eq(m.n_kv_heads, 2);
    ck_assert_int_eq(m.head_dim, 16);
    ck_assert_int_eq(m.intermediate_size, 128);
    ck_assert(m.ffn_gated && m.ffn_act == LLMEM_ACT_SILU);
    ck_assert(m.use_rope);
    ck_assert_double_eq(m.rope_theta, 5000.0); /* rope_parameters, transformers 5 */
    ck_assert_int_eq(m.rope_dim, 16);
    ck_assert_double_eq_tol(m.norm_eps, 1e-5, 1e-12);
    ck_assert(!m.tie_word_embeddings);
    ck_assert_int_eq(m.n_attention_layers, 2);
    for (int32_t l = 0; l < 2; l++)
        ck_assert(m.layers[l].kind == LLMEM_LAYER_ATTENTION && m.layers[l].has_ffn);
}
END_TEST

START_TEST(test_fixture_mamba2)
{
    llmem_model_config m;
    cfg_check_fixture(test_fixture("mamba2"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_MAMBA2);
    ck_assert_int_eq(m.n_layers, 2);
    ck_assert_int_eq(m.n_mamba_layers, 2);
    ck_assert(!m.layers[0].has_ffn && !m.layers[1].has_ffn);
    ck_assert_int_eq(m.ssm_n_heads, 8);
    ck_assert_int_eq(m.ssm_head_dim, 16);
    ck_assert_int_eq(m.ssm_d_inner, 128);
    ck_assert_int_eq(m.ssm_d_state, 16);
    ck_assert_int_eq(m.ssm_n_groups, 2);
    ck_assert_int_eq(m.ssm_d_conv, 4);
    ck_assert_int_eq(m.ssm_chunk_size, 16);
    ck_assert_int_eq(m.ssm_conv_dim, 128 + 2 * 2 * 16);
    ck_assert_int_eq(m.ssm_in_proj_dim, 128 + 192 + 8);
    ck_assert_int_eq(m.ssm_norm_group_size, 128);
    ck_assert(m.ssm_conv_bias && !m.ssm_proj_bias);
    ck_assert(m.tie_word_embeddings); /* so no lm_head.weight in the file */
    ck_assert_double_eq(m.time_step_limit[0], 0.0);
    ck_assert(isinf(m.time_step_limit[1]) && m.time_step_limit[1] > 0);
    ck_assert_str_eq(m.tensor_prefix, "backbone.");
}
END_TEST

START_TEST(test_fixture_bamba)
{
    const char *names[2] = {"bamba", "bamba_bf16"};
    for (int k = 0; k < 2; k++) {
        llmem_model_config m;
        cfg_check_fixture(test_fixture(names[k]), &m);
        ck_assert_int_eq(m.arch, LLMEM_ARCH_BAMBA);
        ck_assert_int_eq(m.n_layers, 4);
        const llmem_layer_kind want[4] = {LLMEM_LAYER_MAMBA2, LLMEM_LAYER_ATTENTION,
                                          LLMEM_LAYER_MAMBA2, LLMEM_LAYER_ATTENTION};
        for (int32_t l = 0; l < 4; l++) {
            ck_assert_int_eq(m.layers[l].kind, want[l]);
            ck_assert(m.layers[l].has_ffn);
        }
        ck_assert_int_eq(m.n_attention_layers, 2);
        ck_assert_int_eq(m.n_mamba_layers, 2);
        ck_assert_int_eq(m.ssm_d_inner, 128);
        ck_assert_int_eq(m.ssm_n_groups, 1);
        ck_assert_int_eq(m.ssm_conv_dim, 160);
        ck_assert_int_eq(m.ssm_in_proj_dim, 296);
        ck_assert_int_eq(m.head_dim, 16);
        ck_assert_double_eq(m.partial_rotary_factor, 0.5);
        ck_assert_int_eq(m.rope_dim, 8);
        ck_assert_double_eq(m.rope_theta, 5000.0);
        ck_assert(m.ffn_gated);
    }
}
END_TEST

/* MoE and Granite fixtures: the values make_fixtures.py passed to the
 * transformers configs, read back from what save_pretrained wrote; every
 * saved tensor (one per expert for nemotron_h) is named by llmem. */
START_TEST(test_fixture_moe)
{
    llmem_model_config m;
    cfg_check_fixture(test_fixture("nemotron_h_moe"), &m);
    ck_assert_int_eq(m.n_layers, 5);
    ck_assert_int_eq(m.layers[1].kind, LLMEM_LAYER_MOE);
    ck_assert_int_eq(m.layers[4].kind, LLMEM_LAYER_MOE);
    ck_assert_int_eq(m.n_expert, 8);
    ck_assert_int_eq(m.n_expert_used, 2);
    ck_assert_int_eq(m.moe_intermediate_size, 32);
    ck_assert_int_eq(m.moe_shared_intermediate_size, 48);
    ck_assert(m.moe_sigmoid && m.moe_norm_topk && m.moe_router_bias && m.moe_split_experts);
    ck_assert_int_eq(m.moe_n_group, 4);
    ck_assert_int_eq(m.moe_topk_group, 2);
    ck_assert(m.moe_routed_scale == 2.5);

    cfg_check_fixture(test_fixture("granite_moe"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_GRANITEMOEHYBRID);
    ck_assert_int_eq(m.layers[0].kind, LLMEM_LAYER_MAMBA2);
    ck_assert_int_eq(m.layers[1].kind, LLMEM_LAYER_ATTENTION);
    ck_assert(m.layers[0].has_ffn && m.layers[1].has_ffn);
    ck_assert(m.use_rope && m.rope_dim == m.head_dim);
    ck_assert_int_eq(m.n_expert, 8);
    ck_assert_int_eq(m.n_expert_used, 3);
    ck_assert(m.moe_gated && !m.moe_sigmoid && m.moe_norm_topk && !m.moe_split_experts);
    ck_assert(m.embedding_multiplier == 6.0 && m.residual_multiplier == 0.5);
    ck_assert(m.attention_scale == 0.2 && m.logits_scaling == 0.8);
    ck_assert(m.tie_word_embeddings);

    cfg_check_fixture(test_fixture("falcon_h1"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_FALCON_H1);
    ck_assert_int_eq(m.layers[0].kind, LLMEM_LAYER_PARALLEL);
    ck_assert_int_eq(m.n_attention_layers, 3);
    ck_assert_int_eq(m.n_mamba_layers, 3);
    ck_assert(m.ssm_gate_only && m.ssm_d_inner == 128);
    ck_assert(m.ssm_multipliers[4] == 1.4 && m.key_multiplier == 0.8);
    ck_assert(m.mlp_gate_multiplier == 1.3 && m.mlp_down_multiplier == 0.6);

    cfg_check_fixture(test_fixture("granite_dense_nope"), &m);
    ck_assert_int_eq(m.n_expert, 0);
    ck_assert(!m.use_rope);
    ck_assert_int_eq(m.moe_shared_intermediate_size, 96);
}
END_TEST

START_TEST(test_fixture_nemotron_h)
{
    llmem_model_config m;
    cfg_check_fixture(test_fixture("nemotron_h"), &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_NEMOTRON_H);
    /* Written from hybrid_override_pattern "M-M*-"; transformers 5 stores it
     * as layers_block_type with its new names and no num_hidden_layers. */
    ck_assert_int_eq(m.n_layers, 5);
    const llmem_layer_kind want[5] = {LLMEM_LAYER_MAMBA2, LLMEM_LAYER_MLP, LLMEM_LAYER_MAMBA2,
                                      LLMEM_LAYER_ATTENTION, LLMEM_LAYER_MLP};
    for (int32_t l = 0; l < 5; l++) {
        ck_assert_int_eq(m.layers[l].kind, want[l]);
        ck_assert(!m.layers[l].has_ffn);
    }
    ck_assert_int_eq(m.n_mlp_layers, 2);
    ck_assert(!m.ffn_gated && m.ffn_act == LLMEM_ACT_RELU2);
    ck_assert(!m.use_rope);
    ck_assert_int_eq(m.ssm_d_inner, 128);
    ck_assert_int_eq(m.ssm_n_groups, 2);
    ck_assert_int_eq(m.ssm_norm_group_size, 64);
    ck_assert_int_eq(m.ssm_in_proj_dim, 128 + 192 + 8);
    ck_assert_str_eq(m.tensor_prefix, "backbone.");
}
END_TEST

START_TEST(test_builtin_model)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/builtin", test_source_dir());
    llmem_model_config m;
    cfg_check_fixture(dir, &m);
    ck_assert_int_eq(m.arch, LLMEM_ARCH_BAMBA);
    ck_assert_int_eq(m.vocab_size, 256);
    ck_assert_int_eq(m.n_layers, 6);
    ck_assert_int_eq(m.layers[2].kind, LLMEM_LAYER_ATTENTION);
    ck_assert_int_eq(m.layers[5].kind, LLMEM_LAYER_ATTENTION);
    ck_assert_int_eq(m.n_mamba_layers, 4);
}
END_TEST

START_TEST(test_weight_names)
{
    llmem_model_config m;
    load_ok(test_fixture("bamba"), &m);
    char name[128];
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS];
    int32_t nd;
    ck_assert(llmem_model_weight(&m, LLMEM_W_SSM_CONV, 0, name, sizeof name, shape, &nd));
    ck_assert_str_eq(name, "model.layers.0.mamba.conv1d.weight");
    ck_assert_int_eq(nd, 3);
    ck_assert(shape[0] == 160 && shape[1] == 1 && shape[2] == 4);
    ck_assert(!llmem_model_weight(&m, LLMEM_W_ATTN_Q, 0, name, sizeof name, shape, &nd));
    ck_assert_str_eq(name, "");
    ck_assert(llmem_model_weight(&m, LLMEM_W_ATTN_K, 1, name, sizeof name, shape, &nd));
    ck_assert_str_eq(name, "model.layers.1.self_attn.k_proj.weight");
    ck_assert(shape[0] == 32 && shape[1] == 64);
    ck_assert(llmem_model_weight(&m, LLMEM_W_FFN_NORM, 1, name, sizeof name, shape, &nd));
    ck_assert_str_eq(name, "model.layers.1.pre_ff_layernorm.weight");
    ck_assert(!llmem_model_weight(&m, LLMEM_W_SSM_IN_BIAS, 0, name, sizeof name, shape, &nd));
    ck_assert(!llmem_model_weight(&m, LLMEM_W_SSM_IN, 4, name, sizeof name, shape, &nd));
    ck_assert(!llmem_model_weight(&m, LLMEM_W_SSM_IN, 0, name, 10, shape, &nd)); /* too short */
    ck_assert(llmem_model_weight(&m, LLMEM_W_FINAL_NORM, 0, name, sizeof name, shape, &nd));
    ck_assert_str_eq(name, "model.final_layernorm.weight");
    ck_assert_str_eq(llmem_arch_name(m.arch), "bamba");
    ck_assert_str_eq(llmem_layer_kind_name(LLMEM_LAYER_MLP), "mlp");
    ck_assert_str_eq(llmem_arch_name((llmem_arch)99), "?");
}
END_TEST

/* A config that does not match the checkpoint: the first missing or
 * misshaped tensor is named. */
START_TEST(test_check_tensors_mismatch)
{
    llmem_safetensors *st = NULL;
    ck_assert_int_eq(llmem_safetensors_open(test_fixture("bamba"), &st, err, sizeof err), LLMEM_OK);
    llmem_model_config m;
    load_ok(test_fixture("bamba"), &m);
    m.layers[2].kind = LLMEM_LAYER_ATTENTION; /* as if attn_layer_indices were [1, 2, 3] */
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_msg(strstr(err, "'model.layers.2.self_attn.q_proj.weight'") &&
                  strstr(err, "layer 2, attention"), "%s", err);
    load_ok(test_fixture("bamba"), &m);
    m.ssm_d_state = 32; /* in_proj and conv1d shapes change */
    m.ssm_conv_dim = 128 + 2 * 32;
    m.ssm_in_proj_dim = 128 + m.ssm_conv_dim + 8;
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "'model.layers.0.mamba.in_proj.weight'") &&
                  strstr(err, "[296, 64]") && strstr(err, "[328, 64]"), "%s", err);
    load_ok(test_fixture("bamba"), &m);
    m.mlp_bias = true;
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "'model.layers.0.feed_forward.gate_proj.bias'"));
    llmem_safetensors_close(st);

    /* mamba2 is tied; claiming it is not asks for an lm_head it lacks. */
    ck_assert_int_eq(llmem_safetensors_open(test_fixture("mamba2"), &st, err, sizeof err), LLMEM_OK);
    load_ok(test_fixture("mamba2"), &m);
    m.tie_word_embeddings = false;
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_msg(strstr(err, "'lm_head.weight'") && strstr(err, "tie_word_embeddings"), "%s",
                  err);
    /* A llama config against mamba2 tensors: the embedding is the first miss. */
    load_ok(test_fixture("llama"), &m);
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "'model.embed_tokens.weight'"));
    ck_assert_int_eq(llmem_model_config_check_tensors(NULL, st, err, sizeof err), LLMEM_E_INVALID);
    llmem_safetensors_close(st);
}
END_TEST

START_TEST(test_llama_classic_keys)
{
    /* transformers 4: rope_theta at the top, no head_dim, rope_scaling null. */
    const char *j = "{\"model_type\":\"llama\",\"vocab_size\":32000,\"hidden_size\":4096,"
                    "\"intermediate_size\":11008,\"num_hidden_layers\":32,"
                    "\"num_attention_heads\":32,\"num_key_value_heads\":8,"
                    "\"rms_norm_eps\":1e-06,\"rope_theta\":500000.0,\"rope_scaling\":null,"
                    "\"attention_bias\":true,\"tie_word_embeddings\":true}";
    llmem_model_config m;
    ck_assert_msg(parse(j, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.head_dim, 128);
    ck_assert_double_eq(m.rope_theta, 500000.0);
    ck_assert_int_eq(m.rope_dim, 128);
    ck_assert(m.attention_bias && m.tie_word_embeddings);
    ck_assert_int_eq(m.n_layers, 32);
    char name[128];
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS];
    int32_t nd;
    ck_assert(llmem_model_weight(&m, LLMEM_W_ATTN_O_BIAS, 31, name, sizeof name, shape, &nd));
    ck_assert_str_eq(name, "model.layers.31.self_attn.o_proj.bias");
    ck_assert(!llmem_model_weight(&m, LLMEM_W_LM_HEAD, 0, name, sizeof name, shape, &nd));
    /* Defaults: no num_key_value_heads means MHA; partial rotary in
     * rope_parameters; rope_theta default 10000. */
    j = "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,"
        "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
        "\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.25}}";
    ck_assert_msg(parse(j, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.n_kv_heads, 4);
    ck_assert_double_eq(m.rope_theta, 10000.0);
    ck_assert_int_eq(m.rope_dim, 4);
}
END_TEST

START_TEST(test_time_step_limit_forms)
{
    const char *base = "{\"model_type\":\"mamba2\",\"vocab_size\":16,\"hidden_size\":8,"
                       "\"num_hidden_layers\":1,\"num_heads\":4,\"head_dim\":4,"
                       "\"state_size\":4,\"n_groups\":1%s}";
    struct {
        const char *extra;
        llmem_status want;
        double lo, hi;
    } cases[] = {
        {"", LLMEM_OK, 0.0, INFINITY},
        {",\"time_step_limit\":[0.0,{\"__float__\":\"Infinity\"}]", LLMEM_OK, 0.0, INFINITY},
        {",\"time_step_limit\":[0.001, 100]", LLMEM_OK, 0.001, 100.0},
        {",\"time_step_limit\":null", LLMEM_OK, 0.0, INFINITY},
        {",\"time_step_limit\":[{\"__float__\":\"-Infinity\"},1]", LLMEM_E_CORRUPT, 0, 0},
        {",\"time_step_limit\":[0,{\"__float__\":\"Huge\"}]", LLMEM_E_CORRUPT, 0, 0},
        {",\"time_step_limit\":[0]", LLMEM_E_CORRUPT, 0, 0},
        {",\"time_step_limit\":[2,1]", LLMEM_E_CORRUPT, 0, 0},
        {",\"time_step_limit\":\"inf\"", LLMEM_E_CORRUPT, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char j[1024];
        snprintf(j, sizeof j, base, cases[i].extra);
        llmem_model_config m;
        llmem_status s = parse(j, &m);
        ck_assert_msg(s == cases[i].want, "case %zu: %d %s", i, s, err);
        if (s == LLMEM_OK) {
            ck_assert_double_eq(m.time_step_limit[0], cases[i].lo);
            ck_assert_double_eq(m.time_step_limit[1], cases[i].hi);
        } else {
            ck_assert_ptr_nonnull(strstr(err, "time_step_limit"));
        }
    }
}
END_TEST

/* dt initialisation values must be finite: an infinite time_step_min
 * becomes nemotron_h's lower dt clamp and poisons every output. */
START_TEST(test_nonfinite_config_values)
{
    const char *base = "{\"model_type\":\"%s\",\"vocab_size\":16,\"hidden_size\":8,"
                       "\"num_hidden_layers\":1,\"num_heads\":4,\"head_dim\":4,"
                       "\"state_size\":4,\"n_groups\":1,\"%s\":%s}";
    static const char *keys[] = {"time_step_min", "time_step_max", "time_step_floor"};
    static const char *bad[] = {"{\"__float__\":\"Infinity\"}", "{\"__float__\":\"NaN\"}",
                                "{\"__float__\":\"-Infinity\"}", "1e999", "-0.5"};
    for (size_t k = 0; k < 3; k++) {
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            char j[1024];
            snprintf(j, sizeof j, base, "mamba2", keys[k], bad[b]);
            llmem_model_config m;
            ck_assert_msg(parse(j, &m) == LLMEM_E_CORRUPT, "%s = %s accepted", keys[k], bad[b]);
            ck_assert_msg(strstr(err, keys[k]) && strstr(err, "finite"), "%s", err);
        }
        char j[1024];
        snprintf(j, sizeof j, base, "mamba2", keys[k], "0.01");
        llmem_model_config m;
        ck_assert_msg(parse(j, &m) == LLMEM_OK, "%s", err);
    }
    /* the lower end of time_step_limit must be finite too */
    char j[1024];
    snprintf(j, sizeof j, base, "mamba2", "time_step_limit",
             "[{\"__float__\":\"Infinity\"},{\"__float__\":\"Infinity\"}]");
    llmem_model_config m;
    ck_assert_int_eq(parse(j, &m), LLMEM_E_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "time_step_limit"));
}
END_TEST

/* A config.json with fewer layers than the checkpoint must not load: the
 * tensors it leaves unused are named. The llama fixture has 2 layers of 9
 * tensors each (transformers' LlamaDecoderLayer). */
START_TEST(test_unused_tensors)
{
    llmem_safetensors *st = NULL;
    ck_assert_int_eq(llmem_safetensors_open(test_fixture("llama"), &st, err, sizeof err), LLMEM_OK);
    llmem_model_config m;
    load_ok(test_fixture("llama"), &m);
    ck_assert_int_eq(m.n_layers, 2);
    m.n_layers = 1;
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_msg(strstr(err, "9 checkpoint tensors are not used by config.json") &&
                  strstr(err, "'model.layers.1.") && strstr(err, "1 layers"), "%s", err);
    /* the real config uses every tensor of the checkpoint */
    load_ok(test_fixture("llama"), &m);
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_OK);
    llmem_safetensors_close(st);
}
END_TEST

static void copy_file(const char *from, const char *to, unsigned char **data, size_t *len)
{
    FILE *f = fopen(from, "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ck_assert_int_gt(n, 8);
    rewind(f);
    unsigned char *d = malloc((size_t)n);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(fread(d, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (data) {
        *data = d;
        *len = (size_t)n;
        return;
    }
    FILE *o = fopen(to, "wb");
    ck_assert_ptr_nonnull(o);
    ck_assert_uint_eq(fwrite(d, 1, (size_t)n, o), (size_t)n);
    fclose(o);
    free(d);
}

/* llmem_model_check_weights_finite (`--check-tensors`): a NaN or an
 * infinity planted in a copy of a fixture is found and named; the fixture
 * itself passes. */
START_TEST(test_check_weights_finite)
{
    llmem_model_config m;
    load_ok(test_fixture("llama"), &m);
    llmem_safetensors *st = NULL;
    ck_assert_int_eq(llmem_safetensors_open(test_fixture("llama"), &st, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_OK);
    ck_assert_msg(llmem_model_check_weights_finite(&m, st, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_tensor_info ti;
    ck_assert_int_eq(llmem_safetensors_find(st, "model.layers.1.mlp.up_proj.weight", &ti, NULL, 0),
                     LLMEM_OK);
    size_t esize = ti.n_bytes / (size_t)ti.n_elements;
    llmem_safetensors_close(st);

    char dir[] = "/tmp/llmem_nan_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char cfg[512], path[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    copy_file(test_fixture("llama/config.json"), cfg, NULL, NULL);
    unsigned char *d;
    size_t len;
    char src[600];
    snprintf(src, sizeof src, "%s/model.safetensors", test_fixture("llama"));
    copy_file(src, NULL, &d, &len);
    /* the tensor's data offset from the file's own header (format spec:
     * u64 little-endian header length, JSON header, data) */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | d[i];
    const char *key = "\"model.layers.1.mlp.up_proj.weight\"";
    char *h = malloc((size_t)hlen + 1);
    memcpy(h, d + 8, (size_t)hlen);
    h[hlen] = '\0';
    char *at = strstr(h, key);
    ck_assert_ptr_nonnull(at);
    char *offs = strstr(at, "\"data_offsets\"");
    ck_assert_ptr_nonnull(offs);
    unsigned long long begin = strtoull(strchr(offs, '[') + 1, NULL, 10);
    free(h);
    size_t elem = 37;
    unsigned char *e = d + 8 + hlen + begin + elem * esize;
    for (int v = 0; v < 2; v++) {
        /* a quiet NaN, then +infinity, in the tensor's dtype (little-endian) */
        if (esize == 4) {
            uint32_t u = v == 0 ? 0x7fc00000u : 0x7f800000u;
            for (int b = 0; b < 4; b++)
                e[b] = (unsigned char)(u >> (8 * b));
        } else {
            uint16_t u = ti.dtype == LLMEM_DTYPE_F16 ? (v == 0 ? 0x7e00u : 0x7c00u)
                                                    : (v == 0 ? 0x7fc0u : 0x7f80u);
            e[0] = (unsigned char)u;
            e[1] = (unsigned char)(u >> 8);
        }
        FILE *o = fopen(path, "wb");
        ck_assert_ptr_nonnull(o);
        ck_assert_uint_eq(fwrite(d, 1, len, o), len);
        fclose(o);
        ck_assert_int_eq(llmem_safetensors_open(dir, &st, err, sizeof err), LLMEM_OK);
        ck_assert_int_eq(llmem_model_config_check_tensors(&m, st, err, sizeof err), LLMEM_OK);
        ck_assert_int_eq(llmem_model_check_weights_finite(&m, st, err, sizeof err),
                         LLMEM_E_CORRUPT);
        ck_assert_msg(strstr(err, "'model.layers.1.mlp.up_proj.weight'") &&
                      strstr(err, "non-finite") && strstr(err, "element 37 of"), "%s", err);
        llmem_safetensors_close(st);
    }
    free(d);
    unlink(path);
    unlink(cfg);
    rmdir(dir);
}
END_TEST

START_TEST(test_bamba_and_nemotron_spellings)
{
    /* mamba_d_head "auto"; no attn_layer_indices means all Mamba layers. */
    const char *j = "{\"model_type\":\"bamba\",\"vocab_size\":100,\"hidden_size\":32,"
                    "\"intermediate_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
                    "\"mamba_n_heads\":4,\"mamba_d_head\":\"auto\",\"mamba_d_state\":8,"
                    "\"rope_theta\":1000.0}";
    llmem_model_config m;
    ck_assert_msg(parse(j, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.ssm_head_dim, 16); /* 2 * 32 / 4 */
    ck_assert_int_eq(m.n_mamba_layers, 3);
    ck_assert_int_eq(m.ssm_chunk_size, 256);
    ck_assert_double_eq(m.rope_theta, 1000.0);
    ck_assert_int_eq(m.rope_dim, 4); /* Bamba's fixed partial_rotary_factor 0.5 of 8 */

    /* Legacy nemotron_h: hybrid_override_pattern and mamba_* names. */
    j = "{\"model_type\":\"nemotron_h\",\"vocab_size\":100,\"hidden_size\":32,"
        "\"intermediate_size\":48,\"num_hidden_layers\":99,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":1,\"head_dim\":8,\"hybrid_override_pattern\":\"M*-M\","
        "\"mamba_num_heads\":4,\"mamba_head_dim\":8,\"ssm_state_size\":8,\"mamba_n_groups\":2,"
        "\"mamba_d_conv\":3,\"mamba_chunk_size\":32,\"mamba_conv_bias\":false,"
        "\"use_bias\":true,\"mamba_dt_limit\":[0.0,5.0],\"mlp_hidden_act\":\"relu2\"}";
    ck_assert_msg(parse(j, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.n_layers, 4);
    ck_assert_int_eq(m.layers[0].kind, LLMEM_LAYER_MAMBA2);
    ck_assert_int_eq(m.layers[1].kind, LLMEM_LAYER_ATTENTION);
    ck_assert_int_eq(m.layers[2].kind, LLMEM_LAYER_MLP);
    ck_assert_int_eq(m.ssm_n_groups, 2);
    ck_assert_int_eq(m.ssm_d_conv, 3);
    ck_assert_int_eq(m.ssm_chunk_size, 32);
    ck_assert(!m.ssm_conv_bias && m.ssm_proj_bias);
    /* transformers 5 clamps nemotron_h's dt to (time_step_min, inf), whatever
     * the config's limit says (NemotronHMamba2Mixer.__init__); default min 0.001 */
    ck_assert_double_eq(m.time_step_limit[0], 0.001);
    ck_assert(isinf(m.time_step_limit[1]));
    ck_assert_int_eq(m.ssm_d_inner, 32);
    ck_assert_int_eq(m.ssm_norm_group_size, 16);
    /* Legacy layers_block_type names. */
    j = "{\"model_type\":\"nemotron_h\",\"vocab_size\":100,\"hidden_size\":32,"
        "\"intermediate_size\":48,\"num_attention_heads\":4,\"head_dim\":8,"
        "\"layers_block_type\":[\"mamba\",\"attention\",\"mlp\"],\"n_groups\":2,"
        "\"mamba_num_heads\":4,\"mamba_head_dim\":8,\"ssm_state_size\":8}";
    ck_assert_msg(parse(j, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.n_layers, 3);
    ck_assert_int_eq(m.layers[1].kind, LLMEM_LAYER_ATTENTION);
    ck_assert_int_eq(m.layers[2].kind, LLMEM_LAYER_MLP);
    ck_assert_int_eq(m.ssm_n_groups, 2);
    ck_assert_int_eq(m.ssm_chunk_size, 128); /* NemotronHConfig's default */
}
END_TEST

/* Each bad config fails with the status and a message naming the problem. */
START_TEST(test_bad_configs)
{
#define LLAMA(extra)                                                                               \
    "{\"model_type\":\"llama\",\"vocab_size\":10,\"intermediate_size\":8,"                         \
    "\"num_hidden_layers\":2,\"num_attention_heads\":4" extra "}"
#define BAMBA(extra)                                                                               \
    "{\"model_type\":\"bamba\",\"vocab_size\":10,\"hidden_size\":32,\"intermediate_size\":8,"    \
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"mamba_n_heads\":4," extra "}"
#define NEMO(extra)                                                                                \
    "{\"model_type\":\"nemotron_h\",\"vocab_size\":10,\"hidden_size\":32,"                        \
    "\"intermediate_size\":8,\"num_attention_heads\":4,\"mamba_num_heads\":4,"                   \
    "\"mamba_head_dim\":8,\"ssm_state_size\":8" extra "}"
    struct {
        const char *json;
        llmem_status want;
        const char *msg;
    } cases[] = {
        {"{\"model_type\": \"llama\", ", LLMEM_E_CORRUPT, "not valid JSON"},
        {"[]", LLMEM_E_CORRUPT, "not a JSON object"},
        {"{\"vocab_size\": 10}", LLMEM_E_CORRUPT, "missing key 'model_type'"},
        {"{\"model_type\": \"gpt2\"}", LLMEM_E_UNSUPPORTED, "'gpt2'"},
        {"{\"model_type\": 3}", LLMEM_E_CORRUPT, "'model_type' must be a string"},
        {LLAMA(""), LLMEM_E_CORRUPT, "missing key 'hidden_size'"},
        {LLAMA(",\"hidden_size\":\"64\""), LLMEM_E_CORRUPT, "'hidden_size' must be an integer"},
        {LLAMA(",\"hidden_size\":64.5"), LLMEM_E_CORRUPT, "'hidden_size' must be an integer"},
        {LLAMA(",\"hidden_size\":-64"), LLMEM_E_CORRUPT, "'hidden_size' is -64"},
        {LLAMA(",\"hidden_size\":64,\"num_key_value_heads\":3"), LLMEM_E_CORRUPT,
         "multiple of num_key_value_heads"},
        {LLAMA(",\"hidden_size\":66"), LLMEM_E_CORRUPT, "head_dim"},
        {LLAMA(",\"hidden_size\":64,\"tie_word_embeddings\":\"yes\""), LLMEM_E_CORRUPT,
         "'tie_word_embeddings' must be true or false"},
        {LLAMA(",\"hidden_size\":64,\"rms_norm_eps\":-1"), LLMEM_E_CORRUPT, "rms_norm_eps"},
        {LLAMA(",\"hidden_size\":64,\"rope_parameters\":{\"rope_type\":\"llama3\"}"),
         LLMEM_E_UNSUPPORTED, "rope_type 'llama3'"},
        {LLAMA(",\"hidden_size\":64,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}"),
         LLMEM_E_UNSUPPORTED, "rope_type 'linear'"},
        {LLAMA(",\"hidden_size\":64,\"rope_parameters\":[1]"), LLMEM_E_CORRUPT,
         "'rope_parameters' must be an object"},
        {LLAMA(",\"hidden_size\":64,\"rope_theta\":\"big\""), LLMEM_E_CORRUPT,
         "'rope_theta' must be a number"},
        {LLAMA(",\"hidden_size\":64,\"partial_rotary_factor\":0.1"), LLMEM_E_CORRUPT,
         "rotary dimensions"},
        /* found by fuzz_config: head_dim x 1e30 was cast to int32 (undefined
         * behaviour; the UBSan stage of CI fails on the old code) */
        {LLAMA(",\"hidden_size\":64,\"partial_rotary_factor\":1e30"), LLMEM_E_CORRUPT,
         "rotary dimensions"},
        /* f32 (the forward pass) makes 1e305 infinity and 1e-300 zero */
        {LLAMA(",\"hidden_size\":64,\"rms_norm_eps\":1e305"), LLMEM_E_CORRUPT,
         "'rms_norm_eps' must be a positive number in f32's range"},
        {LLAMA(",\"hidden_size\":64,\"rms_norm_eps\":1e-300"), LLMEM_E_CORRUPT,
         "'rms_norm_eps' must be a positive number in f32's range"},
        {LLAMA(",\"hidden_size\":64,\"rope_theta\":1e39"), LLMEM_E_CORRUPT, "'rope_theta'"},
        /* cJSON ends strings at an escaped NUL: "silu\u0000x" would read as "silu" */
        /* a control character written raw (json.loads refuses it; cJSON kept it) */
        {LLAMA(",\"hidden_size\":64,\"hidden_act\":\"si\001lu\""), LLMEM_E_CORRUPT,
         "control character 0x01 written raw"},
        {LLAMA(",\"hidden_size\":64,\"hidden_act\":\"silu\\u0000x\""), LLMEM_E_CORRUPT,
         "holds \\u0000"},
        /* a name twice: json.loads keeps the last, cJSON's lookup the first */
        {LLAMA(",\"hidden_size\":64,\"hidden_size\":128"), LLMEM_E_CORRUPT,
         "key 'hidden_size' appears twice"},
        {LLAMA(",\"hidden_size\":64,\"rope_parameters\":{\"rope_theta\":1e4,\"rope_theta\":5e5}"),
         LLMEM_E_CORRUPT, "key 'rope_theta' appears twice"},
        /* one JSON text (RFC 8259), as transformers' json.loads demands */
        {LLAMA(",\"hidden_size\":64") "x", LLMEM_E_CORRUPT, "bytes after the JSON object"},
        {LLAMA(",\"hidden_size\":64") " {}", LLMEM_E_CORRUPT, "(at byte "},
        {LLAMA(",\"hidden_size\":64,\"hidden_act\":\"gelu\""), LLMEM_E_UNSUPPORTED, "'gelu'"},
        {"{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_hidden_layers\":100000,\"num_attention_heads\":4}", LLMEM_E_UNSUPPORTED,
         "at most"},
        {BAMBA("\"mamba_d_state\":8,\"attn_layer_indices\":[1,2]"), LLMEM_E_CORRUPT,
         "attn_layer_indices"},
        {BAMBA("\"mamba_d_head\":8,\"mamba_d_state\":8"), LLMEM_E_CORRUPT, "expand x hidden_size"},
        {BAMBA("\"mamba_d_state\":8,\"mamba_n_groups\":3"), LLMEM_E_CORRUPT,
         "multiple of its group"},
        {"{\"model_type\":\"mamba2\",\"vocab_size\":10,\"hidden_size\":32,"
         "\"num_hidden_layers\":2,\"num_heads\":4,\"head_dim\":16}", LLMEM_E_CORRUPT,
         "missing key 'state_size'"},
        {NEMO(",\"hybrid_override_pattern\":\"M*E\","
         "\"n_groups\":2,\"moe_latent_size\":16"),
         LLMEM_E_UNSUPPORTED, "'moe_latent_size'"},
        {NEMO(","
         "\"layers_block_type\":[\"linear_attention\",\"moe\"],\"n_groups\":2,\"n_group\":3"),
         LLMEM_E_CORRUPT, "n_group / topk_group"},
        {NEMO(",\"hybrid_override_pattern\":\"M?\""),
         LLMEM_E_CORRUPT, "'?' at layer 1"},
        {NEMO(",\"layers_block_type\":[\"sliding\"]"),
         LLMEM_E_UNSUPPORTED, "'sliding'"},
        {NEMO(""), LLMEM_E_CORRUPT,
         "missing key 'layers_block_type' (or 'hybrid_override_pattern')"},
        {NEMO(",\"hybrid_override_pattern\":\"M\","
         "\"mlp_hidden_act\":\"gelu\""), LLMEM_E_UNSUPPORTED, "'gelu'"},
    };
#undef NEMO
#undef BAMBA
#undef LLAMA
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmem_model_config m;
        memset(&m, 0x5a, sizeof m);
        llmem_status s = parse(cases[i].json, &m);
        ck_assert_msg(s == cases[i].want, "case %zu: status %d, want %d (%s)", i, s,
                      cases[i].want, err);
        ck_assert_msg(strstr(err, cases[i].msg), "case %zu: '%s' lacks '%s'", i, err,
                      cases[i].msg);
        ck_assert_msg(strncmp(err, "config.json: ", 13) == 0, "case %zu: %s", i, err);
        /* *out is untouched on failure. */
        ck_assert_int_eq(((unsigned char *)&m)[0], 0x5a);
        ck_assert_int_eq(((unsigned char *)&m)[sizeof m - 1], 0x5a);
    }
}
END_TEST

/* falcon_h1's muP multipliers are scale factors of any sign, but f32 must
 * hold them: NaN, infinity ({"__float__": ...}, as transformers writes
 * them) and 1e39 are refused (found by fuzz_config). The fixture's
 * config.json with one value swapped. */
START_TEST(test_multipliers_in_f32_range)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", test_fixture("falcon_h1"));
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    static const struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"\"key_multiplier\": 0.8", "\"key_multiplier\": {\"__float__\": \"NaN\"}", "'key_multiplier'"},
        {"\"ssm_in_multiplier\": 0.7", "\"ssm_in_multiplier\": -1e39", "'ssm_in_multiplier'"},
        {"\"embedding_multiplier\": 2.0", "\"embedding_multiplier\": {\"__float__\": \"Infinity\"}",
         "'embedding_multiplier'"},
        {"    1.3,\n    0.6\n", "    1.3,\n    -1e39\n", "multiplier lists"}, /* mlp_multipliers */
    };
    llmem_model_config m;
    ck_assert_msg(parse(text, &m) == LLMEM_OK, "%s", err);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *at = strstr(text, cases[i].from), edited[8400];
        ck_assert_ptr_nonnull(at);
        snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - text), text, cases[i].to,
                 at + strlen(cases[i].from));
        llmem_status st = parse(edited, &m);
        ck_assert_msg(st == LLMEM_E_CORRUPT && strstr(err, cases[i].msg), "case %zu: %d %s", i, st,
                      err);
    }
}
END_TEST

START_TEST(test_whitespace_after_the_object)
{
    llmem_model_config m;
    const char *json = "{\"model_type\":\"llama\",\"vocab_size\":10,\"intermediate_size\":8,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"hidden_size\":64}"
                       " \n\t\r\n";
    ck_assert_msg(parse(json, &m) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(m.hidden_size, 64);
    ck_assert_int_eq(m.n_layers, 2);
}
END_TEST

START_TEST(test_load_errors)
{
    llmem_model_config m;
    ck_assert_int_eq(llmem_model_config_load("/nonexistent/dir", &m, err, sizeof err),
                     LLMEM_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/dir/config.json"));
    ck_assert_int_eq(llmem_model_config_load(NULL, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_model_config_parse(NULL, 0, &m, err, sizeof err), LLMEM_E_INVALID);
    /* A path to the file itself works too, and messages carry the path. */
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", test_fixture("llama"));
    load_ok(p, &m);
    char tmp[] = "/tmp/llmem_cfg_XXXXXX";
    int fd = mkstemp(tmp);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model_type\":\"mamba\"}", f);
    fclose(f);
    char jpath[64];
    snprintf(jpath, sizeof jpath, "%s.json", tmp);
    ck_assert_int_eq(rename(tmp, jpath), 0);
    ck_assert_int_eq(llmem_model_config_load(jpath, &m, err, sizeof err), LLMEM_E_UNSUPPORTED);
    ck_assert_msg(strstr(err, jpath) && strstr(err, "'mamba'"), "%s", err);
    unlink(jpath);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_fixture_llama);
    tcase_add_test(tc, test_fixture_moe);
    tcase_add_test(tc, test_fixture_mamba2);
    tcase_add_test(tc, test_fixture_bamba);
    tcase_add_test(tc, test_fixture_nemotron_h);
    tcase_add_test(tc, test_builtin_model);
    tcase_add_test(tc, test_weight_names);
    tcase_add_test(tc, test_check_tensors_mismatch);
    tcase_add_test(tc, test_llama_classic_keys);
    tcase_add_test(tc, test_time_step_limit_forms);
    tcase_add_test(tc, test_nonfinite_config_values);
    tcase_add_test(tc, test_unused_tensors);
    tcase_add_test(tc, test_check_weights_finite);
    tcase_add_test(tc, test_bamba_and_nemotron_spellings);
    tcase_add_test(tc, test_bad_configs);
    tcase_add_test(tc, test_multipliers_in_f32_range);
    tcase_add_test(tc, test_whitespace_after_the_object);
    tcase_add_test(tc, test_load_errors);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

// ctest-labels: core
/* qwen3_next (models/qwen3_next.c) on the cpu backend, with the
 * transformers fixture tests/fixtures/qwen3_next:
 *   - config.json is read as written (values compared with the file);
 *   - bad configurations fail with a status and a message, nothing loaded;
 *   - every device allocation failure of a load has a reason and leaks
 *     nothing (fault injection through the backend's alloc hook);
 *   - a NaN in a layer weight is refused by --check-tensors, naming it;
 *   - speculative-decoding rollback: rejected draft tokens are removed with
 *     seq_rm (the recurrent state goes back to a checkpoint) and the
 *     accepted continuation still matches transformers' float64
 *     log-probabilities (reference.jsonl) within 2e-3.
 */
#include "support/run.h"
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/memory.h"
#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/fixture_case.h"
#include "support/load_faults.h"

static const char *fixture(void)
{
    return test_fixture("qwen3_next");
}

static char *read_file(const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", fixture(), name);
    return fx_read_file(path, NULL);
}

static int json_int(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    ck_assert_msg(cJSON_IsNumber(v), "config.json: no number '%s'", k);
    return v->valueint;
}

START_TEST(test_config)
{
    char *text = read_file("config.json");
    cJSON *j = cJSON_Parse(text);
    ck_assert_ptr_nonnull(j);
    llmem_model_config c;
    char err[512] = "";
    ck_assert_msg(llmem_model_config_parse(text, strlen(text), &c, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(c.arch, LLMEM_ARCH_QWEN3_NEXT);
    ck_assert_str_eq(llmem_arch_name(c.arch), "qwen3_next");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    ck_assert_int_eq(c.n_layers, cJSON_GetArraySize(lt));
    for (int32_t i = 0; i < c.n_layers; i++) {
        bool full = strcmp(cJSON_GetArrayItem(lt, i)->valuestring, "full_attention") == 0;
        ck_assert_int_eq(c.layers[i].kind, full ? LLMEM_LAYER_ATTENTION : LLMEM_LAYER_GDN);
    }
    int hk = json_int(j, "linear_num_key_heads"), hv = json_int(j, "linear_num_value_heads");
    int dk = json_int(j, "linear_key_head_dim"), dv = json_int(j, "linear_value_head_dim");
    ck_assert_int_eq(c.ssm_n_groups, hk);
    ck_assert_int_eq(c.ssm_n_heads, hv);
    ck_assert_int_eq(c.ssm_d_state, dk);
    ck_assert_int_eq(c.ssm_head_dim, dv);
    ck_assert_int_eq(c.ssm_d_conv, json_int(j, "linear_conv_kernel_dim"));
    ck_assert_int_eq(c.ssm_conv_dim, 2 * hk * dk + hv * dv);
    ck_assert_int_eq(c.n_expert, json_int(j, "num_experts"));
    ck_assert_int_eq(c.n_expert_used, json_int(j, "num_experts_per_tok"));
    ck_assert_int_eq(c.moe_intermediate_size, json_int(j, "moe_intermediate_size"));
    ck_assert_int_eq(c.moe_shared_intermediate_size, json_int(j, "shared_expert_intermediate_size"));
    double prf = cJSON_GetObjectItemCaseSensitive(
                     cJSON_GetObjectItemCaseSensitive(j, "rope_parameters"), "partial_rotary_factor")
                     ->valuedouble;
    ck_assert_int_eq(c.rope_dim, (int)(json_int(j, "head_dim") * prf));
    cJSON_Delete(j);
    free(text);
}
END_TEST

/* The fixture's config.json with `from` replaced by `to` must fail with
 * status `want` and a message. */
static void expect_bad(const char *from, const char *to, llmem_status want)
{
    char *text = read_file("config.json");
    char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "'%s' not in config.json", from);
    size_t n = strlen(text) - strlen(from) + strlen(to);
    char *bad = malloc(n + 1);
    ck_assert_ptr_nonnull(bad);
    snprintf(bad, n + 1, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    llmem_model_config c;
    char err[512] = "";
    llmem_status s = llmem_model_config_parse(bad, strlen(bad), &c, err, sizeof err);
    ck_assert_msg(s == want, "'%s' -> '%s': status %d, want %d (%s)", from, to, (int)s, (int)want,
                  err);
    ck_assert_msg(err[0] != '\0', "'%s' -> '%s': no message", from, to);
    free(bad);
    free(text);
}

START_TEST(test_config_errors)
{
    expect_bad("\"mlp_only_layers\": []", "\"mlp_only_layers\": [1]", LLMEM_E_UNSUPPORTED);
    expect_bad("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2", LLMEM_E_UNSUPPORTED);
    /* a layer type qwen3_next does not define: unsupported, as in every
     * family (hf_cfg_layer_names) */
    expect_bad("\"full_attention\"", "\"mamba\"", LLMEM_E_UNSUPPORTED);
    expect_bad("\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 3", LLMEM_E_CORRUPT);
    expect_bad("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3", LLMEM_E_CORRUPT);
    expect_bad("\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu2\"", LLMEM_E_UNSUPPORTED);
}
END_TEST

START_TEST(test_load_failures)
{
    lf_every_allocation_fails(fixture(), 50); /* every tensor in a buffer of its own */
}
END_TEST

/* Tokens and reference log-probs of case `id` (reference[i] = log p(tok[i+1])). */
static int32_t load_case(const char *id, int32_t *tok, double *ref, int32_t cap)
{
    int32_t n = fx_case_load(fixture(), id, tok, ref, cap);
    ck_assert_msg(n > 0, "%s: no case '%s'", fixture(), id);
    return n;
}

/* Decodes tokens [p0, p1) of seq 0 with an output row each; lp[i] gets
 * log p(next[p0 + i]) at position p0 + i. */
static void run(llmem_model *m, const int32_t *tok, const int32_t *next, int32_t p0, int32_t p1,
                int32_t V, double *lp)
{
    int32_t n = p1 - p0, pos[64], seq0 = 0, n_out = 0;
    const int32_t *ids[64];
    int8_t out[64];
    for (int32_t i = 0; i < n; i++) {
        pos[i] = p0 + i;
        ids[i] = &seq0;
        out[i] = 1;
    }
    llmem_batch b = {.n_tokens = n, .token = tok + p0, .pos = pos, .seq_id = ids, .output = out};
    float *logp = malloc((size_t)n * (size_t)V * sizeof *logp);
    char err[512] = "";
    ck_assert_msg(llmem_model_decode(m, &b, true, logp, n, &n_out, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(n_out, n);
    for (int32_t i = 0; i < n; i++)
        lp[i] = logp[(size_t)i * (size_t)V + (size_t)next[p0 + i]];
    free(logp);
}

START_TEST(test_rollback_matches_reference)
{
    char err[512];
    llmem_backend *be = test_open("cpu");
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = 1;
    p.n_ctx = 64;
    p.n_ckpt = 4;
    llmem_model *m = NULL;
    ck_assert_msg(llmem_model_load(fixture(), be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    int32_t V = llmem_model_n_vocab(m);
    int32_t tok[64], n = 0;
    double ref[64], lp[64];
    n = load_case("len15", tok, ref, 64);
    ck_assert_int_eq(n, 15);
    /* prompt: tokens 0..7 (a chunked prefill) */
    run(m, tok, tok + 1, 0, 8, V, lp);
    for (int32_t i = 0; i < 8; i++)
        ck_assert_msg(fabs(lp[i] - ref[i]) <= 2e-3, "prompt token %d: %.6f vs %.6f", i, lp[i],
                      ref[i]);
    /* a verification ubatch of 4 tokens at positions 8..11: the first two
     * are accepted, the last two (wrong drafts) are rejected and removed,
     * so the recurrent state must come back from the checkpoint after
     * position 9 */
    int32_t draft[64];
    memcpy(draft, tok, sizeof draft);
    for (int32_t i = 10; i < 12; i++)
        draft[i] = (tok[i] + 17) % V;
    run(m, draft, draft + 1, 8, 12, V, lp + 8);
    ck_assert_msg(fabs(lp[8] - ref[8]) <= 2e-3, "draft ubatch token 8: %.6f vs %.6f", lp[8],
                  ref[8]);
    ck_assert_int_eq(llmem_memory_seq_rm(llmem_model_memory(m), 0, 10, -1), LLMEM_OK);
    /* a cut where no checkpoint exists fails and changes nothing */
    ck_assert_int_ne(llmem_memory_seq_rm(llmem_model_memory(m), 0, 3, -1), LLMEM_OK);
    /* the accepted continuation: one token at a time (recurrent form) */
    for (int32_t i = 10; i < n - 1; i++) {
        run(m, tok, tok + 1, i, i + 1, V, lp + i);
        ck_assert_msg(fabs(lp[i] - ref[i]) <= 2e-3, "token %d after rollback: %.6f vs %.6f", i,
                      lp[i], ref[i]);
    }
    llmem_model_free(m);
    llmem_backend_close(be);
}
END_TEST

/* A copy of the fixture in a fresh folder whose tensor `name` has a NaN
 * at element 5; with check_tensors the load fails, naming the tensor, and
 * without it the load succeeds (the check is opt-in). */
START_TEST(test_nan_weight_refused)
{
    const char *name = "model.layers.1.linear_attn.in_proj_qkvz.weight";
    char dir[] = "/tmp/llmem_q3n_XXXXXX", path[600], err[512];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *cfg = read_file("config.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(cfg, f);
    fclose(f);
    free(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", fixture());
    f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *st = malloc((size_t)n);
    ck_assert_int_eq(fread(st, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    /* safetensors: u64 header length, JSON header, then the data */
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | st[i];
    char *hdr = strndup((const char *)st + 8, (size_t)hl);
    cJSON *j = cJSON_Parse(hdr);
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, name), "data_offsets");
    ck_assert(cJSON_IsArray(offs));
    size_t at = 8 + (size_t)hl + (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble + 5 * 4;
    const uint32_t nan = 0x7fc00000u;
    memcpy(st + at, &nan, 4);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(st, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    llmem_backend *be = test_open("cpu");
    llmem_model_params p = llmem_model_default_params();
    p.check_tensors = true;
    llmem_model *m = NULL;
    err[0] = '\0';
    ck_assert_int_eq(llmem_model_load(dir, be, &p, &m, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, name) && strstr(err, "element 5"), "message: %s", err);
    p.check_tensors = false;
    ck_assert_msg(llmem_model_load(dir, be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    llmem_model_free(m);
    llmem_backend_close(be);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    cJSON_Delete(j);
    free(hdr);
    free(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("qwen3_next");
    TCase *tc = tcase_create("qwen3_next");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_load_failures);
    tcase_add_test(tc, test_nan_weight_refused);
    tcase_add_test(tc, test_rollback_matches_reference);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

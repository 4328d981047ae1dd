// ctest-labels: core
/* The attention layers' q, k and v projections packed into one weight
 * buffer at load (models/runtime.c, pack_qkv) and run as one fused
 * norm + matmul in one-token steps (models/forward.c, qkv_decode), on every
 * backend that opens ($LLMEM_TEST_BACKENDS), with the llama, bamba and
 * bamba_bf16 fixtures. The CPU takes the fused path here too
 * (LLMEM_NORM_MATMUL_CPU=1, set by main), and so does Vulkan's q/k/v
 * (LLMEM_NM_QKV=2, its default elsewhere, also set by main).
 *
 * Each fixture is loaded three ways, counting the buffer allocations
 * (llmem_backend_set_alloc_hook):
 *   unpacked  LLMEM_NO_QKV_PACK=1: q, k, v in buffers of their own
 *   packed    the default: one buffer of (Nq + 2 Nk) x hidden elements per
 *             attention layer instead of three
 *   refused   the first packed allocation fails: the load fails with
 *             LLMEM_E_NO_MEMORY and a reason, as for any other allocation
 *             (test_model_errors)
 * The expected counts come from config.json (heads, KV heads, head size,
 * attention layers), read here with cJSON. Then the packed and unpacked
 * models score the fixture's case "len15" one token per step (every step
 * takes the fused path: packed q/k/v in one call, unpacked in three) and
 * must match transformers' float64 log-probabilities (reference.jsonl)
 * within 1e-3, as tests/parity.sh; on the CPU the two must agree bit for
 * bit (its fused op computes each output row alone, so one call over the
 * packed rows equals three calls).
 */
#include "support/run.h"
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/fixture_case.h"
#include "support/ops_harness.h"

static const char *fixtures[] = {"llama", "bamba", "bamba_bf16"};

enum { MAX_ALLOCS = 4096, MAX_TOK = 64 };

typedef struct hook {
    int32_t calls, fail_at;
    size_t size[MAX_ALLOCS];
} hook;

static bool hook_fn(size_t size, void *ctx)
{
    hook *h = ctx;
    int32_t i = h->calls++;
    if (i < MAX_ALLOCS)
        h->size[i] = size;
    return i != h->fail_at;
}

/* What config.json says about the attention projections. */
typedef struct qkv_shape {
    int64_t hidden, nq, nk, esize;
    int32_t n_attn;
} qkv_shape;

static int64_t json_int(const cJSON *c, const char *key, int64_t dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : dflt;
}

static qkv_shape read_shape(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = fx_read_file(path, NULL);
    cJSON *c = cJSON_Parse(text);
    ck_assert_ptr_nonnull(c);
    qkv_shape s = {.hidden = json_int(c, "hidden_size", 0)};
    int64_t heads = json_int(c, "num_attention_heads", 0);
    int64_t hd = json_int(c, "head_dim", s.hidden / heads);
    s.nq = heads * hd;
    s.nk = json_int(c, "num_key_value_heads", heads) * hd;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(c, "dtype");
    s.esize = cJSON_IsString(dt) && strcmp(dt->valuestring, "float32") != 0 ? 2 : 4;
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(c, "attn_layer_indices");
    s.n_attn = cJSON_IsArray(idx) ? cJSON_GetArraySize(idx)
                                  : (int32_t)json_int(c, "num_hidden_layers", 0);
    ck_assert(s.hidden > 0 && s.nq > 0 && s.nk > 0 && s.n_attn > 0);
    cJSON_Delete(c);
    free(text);
    return s;
}

static llmem_status load(llmem_backend *be, const char *dir, bool pack, hook *h,
                         llmem_model **m, char *err, size_t err_len)
{
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = 1;
    p.n_ctx = 128;
    p.precision = LLMEM_PRECISION_PRECISE;
    if (pack)
        unsetenv("LLMEM_NO_QKV_PACK");
    else
        setenv("LLMEM_NO_QKV_PACK", "1", 1);
    *m = NULL;
    err[0] = 0;
    llmem_backend_set_alloc_hook(be, hook_fn, h);
    llmem_status st = llmem_model_load(dir, be, &p, m, err, err_len);
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    unsetenv("LLMEM_NO_QKV_PACK");
    ck_assert_int_lt(h->calls, MAX_ALLOCS);
    return st;
}

static int32_t count_size(const hook *h, size_t size)
{
    int32_t n = 0;
    for (int32_t i = 0; i < h->calls; i++)
        n += h->size[i] == size;
    return n;
}

/* log p(tok[i + 1] | tok[0..i]) for the case's tokens, one token a step. */
static int32_t score(llmem_model *m, const int32_t *tok, int32_t n, double *lp)
{
    int32_t v = llmem_model_n_vocab(m), seq = 0, got = 0;
    const int32_t *seqp = &seq;
    int8_t out = 1;
    float *row = malloc((size_t)v * sizeof *row);
    ck_assert_ptr_nonnull(row);
    char err[256] = "";
    for (int32_t i = 0; i + 1 < n; i++) {
        llmem_batch b = {.n_tokens = 1, .token = &tok[i], .pos = &i, .seq_id = &seqp,
                         .output = &out};
        ck_assert_msg(llmem_model_decode(m, &b, true, row, 1, &got, err, sizeof err) == LLMEM_OK,
                      "step %d: %s", i, err);
        ck_assert_int_eq(got, 1);
        lp[i] = row[tok[i + 1]];
    }
    free(row);
    return n - 1;
}

START_TEST(test_qkv_pack)
{
    llmem_backend *be = th_open(_i);
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", test_fixture(fixtures[f]));
        qkv_shape s = read_shape(dir);
        size_t packed = (size_t)((s.nq + 2 * s.nk) * s.hidden * s.esize);
        size_t kv = (size_t)(s.nk * s.hidden * s.esize);
        static hook hu, hp, hr;
        hu = (hook){.fail_at = -1};
        hp = (hook){.fail_at = -1};
        llmem_model *mu = NULL, *mp = NULL, *mr = NULL;
        char err[256];
        ck_assert_msg(load(be, dir, false, &hu, &mu, err, sizeof err) == LLMEM_OK, "%s", err);
        ck_assert_msg(load(be, dir, true, &hp, &mp, err, sizeof err) == LLMEM_OK, "%s", err);
        /* one buffer instead of three per attention layer */
        ck_assert_int_eq(hu.calls - hp.calls, 2 * s.n_attn);
        ck_assert_int_eq(count_size(&hp, packed) - count_size(&hu, packed), s.n_attn);
        ck_assert_int_eq(count_size(&hu, kv) - count_size(&hp, kv),
                         (s.nq == s.nk ? 3 : 2) * s.n_attn);
        int32_t first = 0; /* the first packed allocation: where the two runs part */
        while (first < hp.calls && hp.size[first] == hu.size[first])
            first++;
        ck_assert_int_lt(first, hp.calls);
        ck_assert_uint_eq(hp.size[first], packed);
        hr = (hook){.fail_at = first};
        ck_assert_int_eq(load(be, dir, true, &hr, &mr, err, sizeof err), LLMEM_E_NO_MEMORY);
        ck_assert_ptr_null(mr);
        ck_assert_msg(strstr(err, "q/k/v") != NULL, "reason: '%s'", err);
        ck_assert_int_eq(hr.calls, first + 1); /* nothing allocated after the failure */

        int32_t tok[MAX_TOK];
        double ref[MAX_TOK], lp[2][MAX_TOK];
        int32_t n = fx_case_load(dir, "len15", tok, ref, MAX_TOK);
        ck_assert_int_gt(n, 2);
        llmem_model *ms[2] = {mu, mp};
        const char *names[2] = {"unpacked", "packed"};
        double worst = 0;
        for (int k = 0; k < 2; k++) {
            int32_t nl = score(ms[k], tok, n, lp[k]);
            for (int32_t i = 0; i < nl; i++) {
                double d = fabs(lp[k][i] - ref[i]);
                worst = d > worst ? d : worst;
                ck_assert_msg(d <= 1e-3, "%s %s %s token %d: %.8g, float64 %.8g", fixtures[f],
                              th_backend_name(_i), names[k], i, lp[k][i], ref[i]);
                if (th_is_cpu(_i))
                    ck_assert_msg(lp[k][i] == lp[0][i], "%s cpu %s token %d: %.9g, unpacked %.9g",
                                  fixtures[f], names[k], i, lp[k][i], lp[0][i]);
            }
        }
        printf("%s %s: %d attention layers packed (%d allocations fewer), a refused pack "
               "fails the load; max |dlp| vs float64 %.3g\n", fixtures[f], th_backend_name(_i),
               s.n_attn, hu.calls - hp.calls, worst);
        for (int k = 0; k < 2; k++)
            llmem_model_free(ms[k]);
    }
    llmem_backend_close(be);
}
END_TEST

/* The fused path's settings (LLMEM_NORM_MATMUL_CPU, LLMEM_NM_QKV:
 * models/forward.c) are read when the model loads, not at its steps: for
 * each of three settings that give different bits on the CPU (unfused;
 * fused with one packed q/k/v matmul; fused with a norm launch and plain
 * q/k/v matmuls), a model loaded under it and scored after the variables
 * changed to the next setting gives the bits of a model scored under its
 * own. CPU only (elsewhere the fused path does not depend on the first). */
START_TEST(test_fused_settings_at_load)
{
    if (!th_is_cpu(_i))
        return;
    static const char *const cpu[3] = {NULL, "1", "1"}, *const qkv[3] = {NULL, "2", "0"};
    llmem_backend *be = th_open(_i);
    char dir[1024], err[256];
    snprintf(dir, sizeof dir, "%s", test_fixture("llama"));
    int32_t tok[MAX_TOK];
    int32_t n = fx_case_load(dir, "len15", tok, NULL, MAX_TOK);
    ck_assert_int_gt(n, 2);
    double own[3][MAX_TOK], moved[3][MAX_TOK];
    for (int k = 0; k < 3; k++)
        for (int changed = 0; changed < 2; changed++) {
            cpu[k] ? setenv("LLMEM_NORM_MATMUL_CPU", cpu[k], 1) : unsetenv("LLMEM_NORM_MATMUL_CPU");
            qkv[k] ? setenv("LLMEM_NM_QKV", qkv[k], 1) : unsetenv("LLMEM_NM_QKV");
            static hook h;
            h = (hook){.fail_at = -1};
            llmem_model *m = NULL;
            ck_assert_msg(load(be, dir, true, &h, &m, err, sizeof err) == LLMEM_OK, "%s", err);
            if (changed) {
                int j = (k + 1) % 3;
                cpu[j] ? setenv("LLMEM_NORM_MATMUL_CPU", cpu[j], 1)
                       : unsetenv("LLMEM_NORM_MATMUL_CPU");
                qkv[j] ? setenv("LLMEM_NM_QKV", qkv[j], 1) : unsetenv("LLMEM_NM_QKV");
            }
            score(m, tok, n, changed ? moved[k] : own[k]);
            llmem_model_free(m);
        }
    for (int k = 0; k < 3; k++) {
        bool differs = false; /* so that the comparison below can fail */
        for (int32_t i = 0; i + 1 < n; i++) {
            differs |= own[k][i] != own[(k + 1) % 3][i];
            ck_assert_msg(moved[k][i] == own[k][i],
                          "setting %d, token %d: %.9g after the variables changed, %.9g without",
                          k, i, moved[k][i], own[k][i]);
        }
        ck_assert_msg(differs, "settings %d and %d give the same bits", k, (k + 1) % 3);
    }
    setenv("LLMEM_NORM_MATMUL_CPU", "1", 1); /* as main set them */
    setenv("LLMEM_NM_QKV", "2", 1);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    setenv("LLMEM_NORM_MATMUL_CPU", "1", 1);
    setenv("LLMEM_NM_QKV", "2", 1);
    int n = th_backends_probe();
    Suite *s = suite_create("qkv_pack");
    TCase *tc = tcase_create("qkv_pack");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_qkv_pack, 0, n);
    tcase_add_loop_test(tc, test_fused_settings_at_load, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

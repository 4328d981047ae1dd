/* libFuzzer harness: bytes -> llmem_model_config_parse (config.json).
 *
 * Input: the whole text of a config.json (not NUL-terminated; the harness
 * copies it into a buffer of exactly that size, so a read past its end is
 * an ASan report).
 *
 * Contract checked: parse never crashes, leaks or hits undefined behaviour
 * (float-to-int casts of huge numbers included); a failure leaves *out
 * byte for byte as it was and says why in err; a success gives a
 * configuration from a text that is one JSON object with nothing but
 * whitespace after it (RFC 8259; cJSON's own lenient parse is the
 * reference for where the object ends), that keeps the promises of
 * include/llmem/model.h (layer
 * count in [1, LLMEM_MODEL_MAX_LAYERS], scales f32 holds (the forward pass
 * computes in f32), layer counts that match the layer
 * kinds, n_heads a multiple of n_kv_heads, an even rope_dim <= head_dim,
 * the Mamba-2 sizes derived as the header says), parses the same way
 * twice, and names every weight with a positive shape through
 * llmem_model_weight.
 *
 * Seeds: tests/fuzz/corpus/fuzz_config (the config.json files of
 * tests/fixtures and models/builtin, tests/fuzz/make_corpus.py). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "llmem/model.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_config: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* The promises of llmem_model_config that do not depend on the architecture. */
static void check_config(const llmem_model_config *m)
{
    if ((unsigned)m->arch >= LLMEM_ARCH_COUNT)
        die("arch out of range", NULL);
    if (m->n_layers < 1 || m->n_layers > LLMEM_MODEL_MAX_LAYERS)
        die("n_layers out of [1, LLMEM_MODEL_MAX_LAYERS]", NULL);
    if (m->vocab_size < 1 || m->hidden_size < 1)
        die("vocab_size or hidden_size < 1", NULL);
    /* the forward pass computes in f32: every scale must be a number it holds */
    const double f32[] = {m->norm_eps, m->rope_theta, m->attention_scale, m->embedding_multiplier,
                          m->residual_multiplier, m->logits_scaling, m->attention_in_multiplier,
                          m->attention_out_multiplier, m->key_multiplier, m->ssm_in_multiplier,
                          m->ssm_out_multiplier, m->ssm_multipliers[0], m->ssm_multipliers[1],
                          m->ssm_multipliers[2], m->ssm_multipliers[3], m->ssm_multipliers[4],
                          m->mlp_gate_multiplier, m->mlp_down_multiplier, m->moe_routed_scale,
                          m->attn_softcap, m->final_softcap};
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
        if (!(fabs(f32[i]) <= FLT_MAX))
            die("a scale f32 does not hold (NaN, infinite or beyond FLT_MAX)", NULL);
    if (!(m->norm_eps >= FLT_MIN))
        die("norm_eps is not a positive normal f32 number", NULL);
    int32_t n_attn = 0, n_ssm = 0, n_mlp = 0;
    for (int32_t i = 0; i < m->n_layers; i++) {
        llmem_layer_kind k = m->layers[i].kind;
        if ((unsigned)k >= LLMEM_LAYER_KIND_COUNT)
            die("layer kind out of range", NULL);
        n_attn += k == LLMEM_LAYER_ATTENTION || k == LLMEM_LAYER_PARALLEL;
        n_ssm += k == LLMEM_LAYER_MAMBA2 || k == LLMEM_LAYER_PARALLEL ||
                 k == LLMEM_LAYER_SHORTCONV || k == LLMEM_LAYER_MAMBA1;
        n_mlp += k == LLMEM_LAYER_MLP;
    }
    if (n_attn != m->n_attention_layers || n_ssm != m->n_mamba_layers || n_mlp != m->n_mlp_layers)
        die("layer counts do not match the layer kinds", NULL);
    if (n_attn) {
        if (m->n_heads < 1 || m->n_kv_heads < 1 || m->head_dim < 1)
            die("an attention size < 1", NULL);
        if (m->n_heads % m->n_kv_heads)
            die("n_heads is not a multiple of n_kv_heads", NULL);
        if (m->use_rope && (m->rope_dim < 2 || m->rope_dim % 2 || m->rope_dim > m->head_dim))
            die("rope_dim is not even, >= 2 and <= head_dim", NULL);
        if (m->use_rope && !(m->rope_theta > 0))
            die("rope_theta <= 0", NULL);
    }
    for (int32_t i = 0; i < m->n_layers; i++) {
        if (m->layers[i].kind != LLMEM_LAYER_MAMBA2 && m->layers[i].kind != LLMEM_LAYER_PARALLEL)
            continue;
        int64_t inner = (int64_t)m->ssm_n_heads * m->ssm_head_dim;
        if (m->ssm_n_heads < 1 || m->ssm_head_dim < 1 || m->ssm_d_state < 1 ||
            m->ssm_n_groups < 1 || m->ssm_d_conv < 1)
            die("a Mamba-2 size < 1", NULL);
        if (m->ssm_d_inner != inner || m->ssm_n_heads % m->ssm_n_groups ||
            m->ssm_conv_dim != inner + 2 * (int64_t)m->ssm_n_groups * m->ssm_d_state ||
            m->ssm_in_proj_dim != inner + m->ssm_conv_dim + m->ssm_n_heads)
            die("Mamba-2 sizes not derived as model.h says", NULL);
        break;
    }
    if (m->n_expert && (m->n_expert_used < 1 || m->n_expert_used > m->n_expert))
        die("n_expert_used out of [1, n_expert]", NULL);
}

/* Every weight the architecture names has a name and a positive shape. */
static void check_weights(const llmem_model_config *m)
{
    for (int32_t w = 0; w < LLMEM_W_COUNT; w++) {
        for (int32_t il = 0; il < m->n_layers; il++) {
            char name[256];
            int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS];
            int32_t nd = 0;
            if (!llmem_model_weight(m, (llmem_weight)w, il, name, sizeof name, shape, &nd))
                continue;
            if (!name[0] || nd < 1 || nd > LLMEM_SAFETENSORS_MAX_DIMS)
                die("a weight without a name or with a bad rank", name);
            for (int32_t d = 0; d < nd; d++)
                if (shape[d] < 1)
                    die("a weight dimension < 1", name);
            if (w <= LLMEM_W_LM_HEAD)
                break; /* global weights: once */
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    char *text = malloc(size ? size : 1);
    memcpy(text, data, size);
    llmem_model_config *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    llmem_model_config *before = malloc(sizeof *before);
    memset(a, 0xA5, sizeof *a);
    memcpy(before, a, sizeof *a);
    char err[512] = "";
    llmem_status st = llmem_model_config_parse(text, size, a, err, sizeof err);
    if (st != LLMEM_OK) {
        if (st > 0 || !err[0])
            die("a failed parse without a negative status and a message", err);
        if (memcmp(a, before, sizeof *a))
            die("a failed parse changed *out", err);
    } else {
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithLengthOpts(text, size, &end, 0);
        if (!cJSON_IsObject(root))
            die("accepted a text that is not a JSON object", NULL);
        for (; end < text + size; end++)
            if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')
                die("accepted a text with bytes after its JSON object", NULL);
        cJSON_Delete(root);
        check_config(a);
        check_weights(a);
        memset(b, 0x5A, sizeof *b);
        if (llmem_model_config_parse(text, size, b, err, sizeof err) != LLMEM_OK)
            die("a second parse of the same text failed", err);
        if (a->arch != b->arch || a->n_layers != b->n_layers || a->hidden_size != b->hidden_size)
            die("two parses of the same text differ", NULL);
        for (int32_t i = 0; i < a->n_layers; i++)
            if (a->layers[i].kind != b->layers[i].kind || a->layers[i].has_ffn != b->layers[i].has_ffn)
                die("two parses of the same text differ in a layer", NULL);
    }
    free(before);
    free(b);
    free(a);
    free(text);
    return 0;
}

/* llmem tests: the fixture check of the config suites (see config_fixture.h). */
#include "support/config_fixture.h"

#include <check.h>
#include <stdbool.h>

void cfg_check_fixture(const char *dir, llmem_model_config *m)
{
    char err[512] = "";
    ck_assert_msg(llmem_model_config_load(dir, m, err, sizeof err) == LLMEM_OK, "%s: %s", dir,
                  err);
    llmem_safetensors *st = NULL;
    ck_assert_msg(llmem_safetensors_open(dir, &st, err, sizeof err) == LLMEM_OK, "%s: %s", dir,
                  err);
    ck_assert_msg(llmem_model_config_check_tensors(m, st, err, sizeof err) == LLMEM_OK, "%s: %s",
                  dir, err);
    int32_t named = 0, nd;
    char name[256];
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS];
    for (int w = LLMEM_W_EMBED; w <= LLMEM_W_LM_HEAD; w++)
        named += llmem_model_weight(m, (llmem_weight)w, 0, name, sizeof name, shape, &nd);
    for (int32_t l = 0; l < m->n_layers; l++)
        for (int w = LLMEM_W_MIXER_NORM; w < LLMEM_W_COUNT; w++) {
            bool split = m->moe_split_experts && (w == LLMEM_W_MOE_UP || w == LLMEM_W_MOE_DOWN);
            int32_t parts = w == LLMEM_W_MOE_UP && m->moe_gated ? 2 : 1;
            if (llmem_model_weight(m, (llmem_weight)w, l, name, sizeof name, shape, &nd))
                named += split ? parts * m->n_expert : 1;
        }
    ck_assert_int_eq(named, llmem_safetensors_count(st));
    llmem_safetensors_close(st);
}

/* llmem tests: the fixture check shared by the config suites
 * (tests/test_config.c, tests/test_config_ssm1.c). */
#ifndef LLMEM_TEST_CONFIG_FIXTURE_H
#define LLMEM_TEST_CONFIG_FIXTURE_H

#include "llmem/model.h"

/* Loads the config of checkpoint folder dir into *m
 * (llmem_model_config_load), opens its safetensors, checks the tensors
 * against the config (llmem_model_config_check_tensors), and asserts that
 * every stored tensor is one llmem_model_weight names: nothing
 * transformers saved is left unused. Split experts (nemotron_h, jamba)
 * count once per stored tensor: n_expert each, twice that for a gated up
 * (gate_proj + up_proj). Failures are Check assertions naming dir and the
 * library's message. *m is the caller's; the safetensors are closed. */
void cfg_check_fixture(const char *dir, llmem_model_config *m);

#endif

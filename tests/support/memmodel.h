/* The random-operation engine of the model-based memory test
 * (tests/test_memory_model.c; docs/testing.md, "The model-based
 * randomized test"). */
#ifndef LLMEM_TEST_MEMMODEL_H
#define LLMEM_TEST_MEMMODEL_H

#include <stdint.h>

#include "support/memref.h"

/* Creates the memory cfg describes (cpu backend) beside its reference and
 * runs $LLMEM_TEST_ITERS random operations (default default_iters) with
 * seed $LLMEM_TEST_SEED (default fixed) mixed with salt, checking the
 * memory against the reference after every one; prints the counts of
 * plans, NO_SPACE, prefix hits, evictions and rollbacks. Configurations
 * with snapshots or a prefix budget must have hit and evicted. Fails the
 * running Check test (ck_abort) at the first difference. */
void memmodel_run(const char *name, const mr_config *cfg, int32_t default_iters, uint64_t salt);

#endif

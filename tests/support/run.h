/* Runs a Check suite (fork mode, CK_NORMAL output) and returns the number
 * of failed tests; the runner is freed. Every tests/test_*.c main uses it. */
#ifndef LLMEM_TEST_RUN_H
#define LLMEM_TEST_RUN_H

#include <check.h>

int test_run_suite(Suite *s);

#endif

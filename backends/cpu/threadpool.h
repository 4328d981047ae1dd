/* llmem: the CPU backend's thread pool (internal).
 *
 * One process-wide pool of worker threads. An op splits its work into n
 * items and calls llmem_tp_run; the calling thread works too, as thread 0.
 * Items are handed out in chunks of `grain` from an atomic counter, so
 * uneven items (attention rows of different lengths) balance themselves.
 * When another thread is already running work on the pool (two CPU
 * backends used from two threads), the call runs on the caller alone.
 * After fork() the child builds a new pool on first use.
 */
#ifndef LLMEM_CPU_THREADPOOL_H
#define LLMEM_CPU_THREADPOOL_H

#include <stdint.h>

/* Work function: items [begin, end), run by thread `thread` in [0, nth). */
typedef void (*llmem_tp_fn)(void *ctx, int64_t begin, int64_t end, int32_t thread);

/* Threads a run uses now (>= 1): llmem_tp_set_threads's value, else
 * $LLMEM_THREADS, else the online cores. Size per-thread scratch by it. */
int32_t llmem_tp_threads(void);

/* Sets the thread count (n >= 1), or restores the default (n == 0). */
void llmem_tp_set_threads(int32_t n);

/* Runs fn over items [0, n) on at most nth threads (nth >= 1; thread ids
 * stay below nth) and returns when all are done. grain >= 1. */
void llmem_tp_run(int32_t nth, int64_t n, int64_t grain, llmem_tp_fn fn, void *ctx);

#endif

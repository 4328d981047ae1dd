/* llmem: the CPU backend's thread pool (see threadpool.h).
 *
 * Workers sleep on a condition variable and wake for each run (a
 * generation number tells a new run from a spurious wake-up). A run hands
 * out chunks of items from one atomic counter; the caller works as thread
 * 0 and then waits until every participating worker has finished. Workers
 * are started on demand and live as long as the process; a smaller thread
 * count just leaves some idle.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "backends/cpu/threadpool.h"

#define MAX_THREADS 512

typedef struct pool pool;

typedef struct worker {
    pool *p;
    int32_t id;    /* thread index, 1.. */
    uint64_t seen; /* last generation this worker looked at */
    pthread_t thread;
} worker;

struct pool {
    pthread_mutex_t run_lock; /* held for the whole of one run */
    pthread_mutex_t mu;       /* guards the fields below */
    pthread_cond_t wake, done;
    int32_t n_workers; /* threads besides the caller */
    worker *workers;
    uint64_t generation;
    int32_t pending; /* participating workers not finished with this run */
    /* The current run. */
    llmem_tp_fn fn;
    void *ctx;
    int64_t n, grain;
    int32_t nth;
    atomic_int_fast64_t next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* guards g_* below */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pool *g_pool;
static pid_t g_pid;
static int32_t g_threads; /* 0: default */
/* Pools left behind by fork() (their threads exist only in the parent);
 * kept reachable so leak checkers stay quiet. */
static pool *g_abandoned[8];
static int g_n_abandoned;

static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void fork_child(void) { pthread_mutex_unlock(&g_lock); }

static void register_fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static int32_t default_threads(void)
{
    const char *env = getenv("LLMEM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1)
            return v > MAX_THREADS ? MAX_THREADS : (int32_t)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    return n > MAX_THREADS ? MAX_THREADS : (int32_t)n;
}

static void work(pool *p, int32_t id)
{
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->grain);
        if (b >= p->n)
            return;
        int64_t e = b + p->grain < p->n ? b + p->grain : p->n;
        p->fn(p->ctx, b, e, id);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    pool *p = w->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == w->seen)
            pthread_cond_wait(&p->wake, &p->mu);
        w->seen = p->generation;
        if (w->id >= p->nth)
            continue; /* not needed for this run */
        pthread_mutex_unlock(&p->mu);
        work(p, w->id);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    return NULL; /* not reached: workers live as long as the process */
}

/* The pool of this process, with an empty worker array (allocated once,
 * never freed: workers are only ever added). NULL when out of memory. */
static pool *pool_create(void)
{
    pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->workers = calloc(MAX_THREADS, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    return p;
}

/* Starts workers until the pool has n_threads - 1 (or thread creation
 * fails). Called with run_lock held, so no run is in flight. */
static void pool_grow(pool *p, int32_t n_threads)
{
    while (p->n_workers < n_threads - 1 && p->n_workers < MAX_THREADS) {
        worker *w = &p->workers[p->n_workers];
        w->p = p;
        w->id = p->n_workers + 1;
        pthread_mutex_lock(&p->mu);
        w->seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
            return;
        p->n_workers++;
    }
}

/* The pool of the current process (created on demand). */
static pool *get_pool(void)
{
    pthread_once(&g_once, register_fork_handlers);
    pthread_mutex_lock(&g_lock);
    pid_t pid = getpid();
    if (g_pool && g_pid != pid) {
        if (g_n_abandoned < (int)(sizeof g_abandoned / sizeof g_abandoned[0]))
            g_abandoned[g_n_abandoned++] = g_pool;
        g_pool = NULL;
    }
    if (!g_pool) {
        g_pool = pool_create();
        g_pid = pid;
    }
    pool *p = g_pool;
    pthread_mutex_unlock(&g_lock);
    return p;
}

int32_t llmem_tp_threads(void)
{
    pthread_mutex_lock(&g_lock);
    int32_t n = g_threads;
    pthread_mutex_unlock(&g_lock);
    return n > 0 ? n : default_threads();
}

void llmem_tp_set_threads(int32_t n)
{
    pthread_mutex_lock(&g_lock);
    g_threads = n < 0 ? 0 : (n > MAX_THREADS ? MAX_THREADS : n);
    pthread_mutex_unlock(&g_lock);
}

void llmem_tp_run(int32_t nth, int64_t n, int64_t grain, llmem_tp_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t chunks = (n + grain - 1) / grain;
    if (nth > 1 && chunks > 1) {
        pool *p = get_pool();
        if (p && pthread_mutex_trylock(&p->run_lock) == 0) {
            pool_grow(p, nth);
            int32_t use = nth < p->n_workers + 1 ? nth : p->n_workers + 1;
            if (chunks < use)
                use = (int32_t)chunks;
            if (use < 2) {
                pthread_mutex_unlock(&p->run_lock);
                fn(ctx, 0, n, 0);
                return;
            }
            pthread_mutex_lock(&p->mu);
            p->fn = fn;
            p->ctx = ctx;
            p->n = n;
            p->grain = grain;
            p->nth = use;
            atomic_store(&p->next, 0);
            p->pending = use - 1;
            p->generation++;
            pthread_cond_broadcast(&p->wake);
            pthread_mutex_unlock(&p->mu);
            work(p, 0);
            pthread_mutex_lock(&p->mu);
            while (p->pending > 0)
                pthread_cond_wait(&p->done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            pthread_mutex_unlock(&p->run_lock);
            return;
        }
    }
    fn(ctx, 0, n, 0);
}

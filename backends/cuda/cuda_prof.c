/* llmem cuda plugin: GPU time per kernel ($LLMEM_CUDA_PROFILE=1).
 *
 * The CUPTI activity API (CUDA Toolkit, "CUPTI": Activity API,
 * CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) hands back one record per kernel
 * execution with its device start and end times, grid and, for a kernel that
 * ran as a node of a CUDA graph, the graph's id; the kernels of one graph
 * launch share the launch's correlation id. So the recorded decode steps
 * (models/decode_graph.c) are timed as they run, inside their graphs, with
 * nothing added to the graphs. libcupti is opened with dlopen only when the
 * variable is set: the plugin does not link it, and without it the profile
 * is off with a message.
 *
 * When the backend closes, a table goes to stderr for each graph (one per
 * recorded batch shape) and one for the kernels launched outside graphs
 * (prefill, first eager steps): per kernel name and grid, µs per graph
 * launch (per call outside graphs), share of the kernel time, calls, and
 * per graph the kernels' time and the span of a launch (first start to last
 * end), whose difference is the time the GPU spent between kernels. A
 * profiled run is slower than an unprofiled one (CUPTI's per-kernel work).
 * One profile per process: a second backend opened while one profiles runs
 * unprofiled.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"

#ifndef LLMEM_HAVE_CUPTI
/* Built without cupti.h (backends/cuda/CMakeLists.txt looks for it). */
void cuda_prof_init(cuda_backend *cb)
{
    (void)cb;
    const char *e = getenv("LLMEM_CUDA_PROFILE");
    if (e && *e && strcmp(e, "0") != 0)
        fprintf(stderr, "llmem cuda: profile off: the plugin was built without cupti.h\n");
}

void cuda_prof_finish(cuda_backend *cb)
{
    (void)cb;
}
#else
#include <cupti.h>

#define PROF_BUF_BYTES ((size_t)8 << 20)
/* kernels listed per group, slowest first; the rest summed:
 * $LLMEM_CUDA_PROFILE_ROWS (1..10000) or 28 */
static size_t prof_rows(void)
{
    const char *e = getenv("LLMEM_CUDA_PROFILE_ROWS");
    long n = e ? strtol(e, NULL, 10) : 0;
    return n >= 1 && n <= 10000 ? (size_t)n : 28;
}

typedef struct prof_kernel {
    uint32_t graph; /* 0: launched outside graphs */
    int32_t gx, gy, gz, bx;
    const char *raw_ptr; /* CUPTI's name pointer of the first record */
    char *raw;           /* its text (mangled) */
    char *name;          /* shortened, demangled */
    double ns;
    uint64_t calls;
} prof_kernel;

typedef struct prof_graph {
    uint32_t graph;
    uint64_t launches;
    double busy_ns, span_ns;
    uint32_t corr; /* the launch being summed */
    uint64_t t0, t1;
} prof_graph;

typedef CUptiResult (*fn_register)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*fn_kind)(CUpti_ActivityKind);
typedef CUptiResult (*fn_flush)(uint32_t);
typedef CUptiResult (*fn_next)(uint8_t *, size_t, CUpti_Activity **);
typedef char *(*fn_demangle)(const char *, char *, size_t *, int *);

static struct {
    pthread_mutex_t mu;
    const cuda_backend *owner; /* the backend whose close prints */
    void *lib;
    fn_kind disable;
    fn_flush flush;
    fn_next next;
    fn_demangle demangle;
    prof_kernel *k;
    size_t nk, capk;
    prof_graph *g;
    size_t ng, capg;
    uint64_t dropped;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records)
{
    /* CUPTI wants 8-byte aligned buffers; malloc's are */
    *buf = malloc(PROF_BUF_BYTES);
    *size = *buf ? PROF_BUF_BYTES : 0;
    *max_records = 0;
}

/* A short readable name: demangled when the C++ runtime offers it, without
 * the parameter list. Owned by the caller. */
static char *kernel_name(const char *mangled)
{
    char *d = NULL;
    int status = -1;
    if (P.demangle && mangled)
        d = P.demangle(mangled, NULL, NULL, &status);
    const char *s = d && status == 0 ? d : mangled ? mangled : "?";
    size_t n = strlen(s);
    const char *paren = strchr(s, '(');
    if (paren && d)
        n = (size_t)(paren - s);
    if (n > 72)
        n = 72;
    char *out = malloc(n + 1);
    if (out) {
        memcpy(out, s, n);
        out[n] = 0;
    }
    free(d);
    return out;
}

static prof_kernel *kernel_slot(uint32_t graph, const CUpti_ActivityKernel10 *r)
{
    const char *raw = r->name ? r->name : "?";
    for (size_t i = 0; i < P.nk; i++) {
        prof_kernel *k = &P.k[i];
        if (k->graph == graph && k->gx == r->gridX && k->gy == r->gridY && k->gz == r->gridZ &&
            k->bx == r->blockX && (k->raw_ptr == raw || strcmp(k->raw, raw) == 0))
            return k;
    }
    if (P.nk == P.capk) {
        size_t cap = P.capk ? 2 * P.capk : 256;
        prof_kernel *nk = realloc(P.k, cap * sizeof *nk);
        if (!nk)
            return NULL;
        P.k = nk;
        P.capk = cap;
    }
    prof_kernel *k = &P.k[P.nk];
    *k = (prof_kernel){.graph = graph, .gx = r->gridX, .gy = r->gridY, .gz = r->gridZ,
                       .bx = r->blockX, .raw_ptr = raw, .raw = strdup(raw),
                       .name = kernel_name(raw)};
    if (!k->name || !k->raw) {
        free(k->name);
        free(k->raw);
        return NULL;
    }
    P.nk++;
    return k;
}

static prof_graph *graph_slot(uint32_t graph)
{
    for (size_t i = 0; i < P.ng; i++)
        if (P.g[i].graph == graph)
            return &P.g[i];
    if (P.ng == P.capg) {
        size_t cap = P.capg ? 2 * P.capg : 16;
        prof_graph *ng = realloc(P.g, cap * sizeof *ng);
        if (!ng)
            return NULL;
        P.g = ng;
        P.capg = cap;
    }
    P.g[P.ng] = (prof_graph){.graph = graph};
    return &P.g[P.ng++];
}

static void close_launch(prof_graph *g)
{
    if (g->launches > 0 && g->t1 > g->t0)
        g->span_ns += (double)(g->t1 - g->t0);
}

static void take(const CUpti_ActivityKernel10 *r)
{
    uint32_t graph = r->graphId;
    double ns = r->end > r->start ? (double)(r->end - r->start) : 0.0;
    prof_kernel *k = kernel_slot(graph, r);
    prof_graph *g = graph_slot(graph);
    if (!k || !g) {
        P.dropped++;
        return;
    }
    k->ns += ns;
    k->calls++;
    g->busy_ns += ns;
    if (graph == 0) { /* outside graphs: every kernel is its own launch */
        g->launches++;
        g->span_ns += ns;
        return;
    }
    if (g->launches == 0 || r->correlationId != g->corr) {
        close_launch(g);
        g->launches++;
        g->corr = r->correlationId;
        g->t0 = r->start;
        g->t1 = r->end;
    }
    g->t0 = r->start < g->t0 ? r->start : g->t0;
    g->t1 = r->end > g->t1 ? r->end : g->t1;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                  size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&P.mu);
    while (P.next && P.next(buf, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            take((const CUpti_ActivityKernel10 *)(const void *)rec);
    pthread_mutex_unlock(&P.mu);
    free(buf);
}

/* dlsym into a function pointer of type F at fp (ISO C has no cast between
 * object and function pointers; POSIX guarantees the representation). */
#define SYM(fp, lib, name)                                                                        \
    do {                                                                                          \
        void *p_ = (lib) ? dlsym((lib), (name)) : NULL;                                           \
        memcpy(&(fp), &p_, sizeof(fp));                                                           \
    } while (0)

void cuda_prof_init(cuda_backend *cb)
{
    const char *e = getenv("LLMEM_CUDA_PROFILE");
    if (!e || !*e || strcmp(e, "0") == 0)
        return;
    pthread_mutex_lock(&P.mu);
    bool busy = P.owner != NULL;
    pthread_mutex_unlock(&P.mu);
    if (busy)
        return;
    void *lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "llmem cuda: profile off: cannot load libcupti (%s)\n", dlerror());
        return;
    }
    fn_register reg;
    fn_kind enable, disable;
    fn_flush flush;
    fn_next next;
    SYM(reg, lib, "cuptiActivityRegisterCallbacks");
    SYM(enable, lib, "cuptiActivityEnable");
    SYM(disable, lib, "cuptiActivityDisable");
    SYM(flush, lib, "cuptiActivityFlushAll");
    SYM(next, lib, "cuptiActivityGetNextRecord");
    if (!reg || !enable || !disable || !flush || !next) {
        fprintf(stderr, "llmem cuda: profile off: libcupti lacks the activity API\n");
        dlclose(lib);
        return;
    }
    pthread_mutex_lock(&P.mu);
    P.lib = lib;
    P.disable = disable;
    P.flush = flush;
    P.next = next;
    void *cxx = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_LOCAL); /* stays loaded */
    SYM(P.demangle, cxx, "__cxa_demangle");
    P.owner = cb;
    pthread_mutex_unlock(&P.mu);
    if (reg(buf_request, buf_complete) != CUPTI_SUCCESS ||
        enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "llmem cuda: profile off: CUPTI refused kernel tracing\n");
        pthread_mutex_lock(&P.mu);
        P.owner = NULL;
        P.next = NULL;
        pthread_mutex_unlock(&P.mu);
    }
}

static int by_time(const void *a, const void *b)
{
    double x = ((const prof_kernel *)a)->ns, y = ((const prof_kernel *)b)->ns;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void print_group(const cuda_backend *cb, const prof_graph *g)
{
    double per = g->graph && g->launches ? 1.0 / (double)g->launches : 1.0;
    if (g->graph)
        fprintf(stderr,
                "cuda profile (%s), graph %u: %llu launches; per launch %.3f ms in kernels, "
                "%.3f ms from first start to last end\n",
                cb->device_name, g->graph, (unsigned long long)g->launches,
                g->busy_ns * per * 1e-6, g->launches ? g->span_ns * per * 1e-6 : 0.0);
    else
        fprintf(stderr, "cuda profile (%s), kernels outside graphs: %.3f ms in all\n",
                cb->device_name, g->busy_ns * 1e-6);
    fprintf(stderr, "  %10s %6s %10s  %-s\n", g->graph ? "us/launch" : "us", "share",
            g->graph ? "calls/l" : "calls", "kernel <<<grid, block>>>");
    size_t shown = 0, rows = prof_rows();
    double rest = 0;
    uint64_t rest_calls = 0;
    for (size_t i = 0; i < P.nk; i++) {
        const prof_kernel *k = &P.k[i];
        if (k->graph != g->graph)
            continue;
        if (shown++ >= rows) {
            rest += k->ns;
            rest_calls += k->calls;
            continue;
        }
        fprintf(stderr, "  %10.2f %5.1f%% %10.2f  %s <<<(%d,%d,%d), %d>>>\n", k->ns * per * 1e-3,
                g->busy_ns > 0 ? 100.0 * k->ns / g->busy_ns : 0.0, (double)k->calls * per,
                k->name, k->gx, k->gy, k->gz, k->bx);
    }
    if (rest_calls)
        fprintf(stderr, "  %10.2f %5.1f%% %10.2f  (%zu other kernels)\n", rest * per * 1e-3,
                g->busy_ns > 0 ? 100.0 * rest / g->busy_ns : 0.0, (double)rest_calls * per,
                shown - rows);
}

void cuda_prof_finish(cuda_backend *cb)
{
    pthread_mutex_lock(&P.mu);
    bool mine = P.owner == cb && P.next;
    pthread_mutex_unlock(&P.mu);
    if (!mine)
        return;
    P.flush(1); /* delivers the last buffers through buf_complete */
    P.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    pthread_mutex_lock(&P.mu);
    for (size_t i = 0; i < P.ng; i++)
        close_launch(&P.g[i]);
    qsort(P.k, P.nk, sizeof *P.k, by_time);
    for (size_t i = 0; i < P.ng; i++)
        print_group(cb, &P.g[i]);
    if (P.dropped)
        fprintf(stderr, "cuda profile: %llu kernel records dropped (no host memory)\n",
                (unsigned long long)P.dropped);
    for (size_t i = 0; i < P.nk; i++) {
        free(P.k[i].name);
        free(P.k[i].raw);
    }
    free(P.k);
    free(P.g);
    P.k = NULL;
    P.g = NULL;
    P.nk = P.capk = P.ng = P.capg = 0;
    P.dropped = 0;
    P.next = NULL;
    P.owner = NULL;
    pthread_mutex_unlock(&P.mu);
    /* libcupti stays loaded: its worker thread may outlive the flush */
}
#endif

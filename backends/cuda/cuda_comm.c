/* llmem cuda plugin: the NCCL communicator (<llmem/comm.h>, "nccl"),
 * issue 19.
 *
 * libnccl.so.2 is loaded at run time with dlopen ($LLMEM_NCCL_LIB first,
 * then the loader's search path), so the plugin neither links nor needs
 * NCCL; a machine without it gets LLMEM_E_NOT_FOUND and a message saying
 * where PyTorch keeps a copy. Only the handful of entry points called
 * here are declared, from NCCL's public C API (nccl.h: ncclResult_t 0 is
 * success; ncclFloat32 7, ncclBfloat16 9, ncclUint8 1; ncclSum 0;
 * ncclCommInitAll, ncclCommDestroy, ncclAllReduce, ncclAllGather,
 * ncclBroadcast, ncclGetErrorString, ncclGetVersion).
 *
 * The group is made at once by ncclCommInitAll over the ranks' devices
 * (one process, one thread per rank afterwards). Each collective runs on
 * its rank's stream, in order with the backend's ops, and returns once
 * queued (NCCL's semantics); barrier also waits for the stream. NCCL
 * cannot share a verdict on bad arguments: a rank that refuses its
 * arguments returns LLMEM_E_INVALID at once while the others wait.
 * Leave NVLink multicast off on the lent H200s (NCCL_NVLS_ENABLE=0).
 *
 * A rank that stops (<llmem/comm.h>): abort calls ncclCommAbort on every
 * rank's communicator of the group (all are in this process), which ends
 * the collectives queued on the devices, as PyTorch's NCCL watchdog does;
 * a barrier polls its stream instead of blocking in it, watching
 * ncclCommGetAsyncError and the group timeout, and aborts the group when
 * either fires. Both entry points are optional (dlsym): without them the
 * group can only be marked aborted. The group mutex orders abort against
 * the calls that read a communicator handle outside its rank's enqueue.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_backend.h"
#include "llmem/comm_impl.h"

typedef void *nccl_comm_t; /* ncclComm_t: an opaque pointer */

typedef struct nccl_api {
    void *lib;
    int version;
    int (*get_version)(int *version);
    const char *(*error_string)(int result);
    int (*init_all)(nccl_comm_t *comms, int ndev, const int *devlist);
    int (*destroy)(nccl_comm_t comm);
    int (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                      nccl_comm_t comm, cudaStream_t stream);
    int (*all_gather)(const void *send, void *recv, size_t send_count, int dtype,
                      nccl_comm_t comm, cudaStream_t stream);
    int (*broadcast)(const void *send, void *recv, size_t count, int dtype, int root,
                     nccl_comm_t comm, cudaStream_t stream);
    int (*abort)(nccl_comm_t comm);                         /* optional: ncclCommAbort */
    int (*get_async_error)(nccl_comm_t comm, int *result); /* optional */
} nccl_api;

enum { NCCL_UINT8 = 1, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9, NCCL_SUM = 0 };
enum { NCCL_IN_PROGRESS = 7 }; /* ncclInProgress: not an error */

typedef struct nccl_group {
    nccl_api api;
    int live; /* communicators left; the last one unloads the library */
    pthread_mutex_t mu;  /* guards aborted and the handles' lifetime after an abort */
    bool aborted;        /* no collective runs any more */
    bool handles_gone;   /* ncclCommAbort freed every handle: destroy must not */
    int32_t n;
    nccl_comm_t handles[LLMEM_COMM_MAX_RANKS];
    int64_t timeout_ms;  /* 0: none */
} nccl_group;

typedef struct nccl_comm {
    llmem_comm base;
    nccl_group *g;
    nccl_comm_t comm;
    float *flag; /* one device float for barrier */
    void *tmp;   /* all_gather_rows staging [size][n_rows][row_bytes], grown on demand */
    size_t tmp_size;
} nccl_comm;

static const llmem_comm_i nccl_comm_iface;

static nccl_comm *nc_of(llmem_comm *c)
{
    return (nccl_comm *)(void *)c;
}

static llmem_status nccl_load(nccl_api *a, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    const char *path = getenv("LLMEM_NCCL_LIB");
    a->lib = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        const char *why = dlerror();
        llmem_errf(err, err_len,
                   "cuda: NCCL not found (%s); install libnccl2 or set LLMEM_NCCL_LIB to a "
                   "libnccl.so.2, e.g. PyTorch's site-packages/nvidia/nccl/lib/libnccl.so.2",
                   why ? why : "dlopen failed");
        return LLMEM_E_NOT_FOUND;
    }
#define SYM(field, name)                                                                  \
    do {                                                                                  \
        *(void **)&a->field = dlsym(a->lib, name);                                        \
        if (!a->field) {                                                                  \
            llmem_errf(err, err_len, "cuda: %s lacks %s", path && *path ? path : "libnccl.so.2", \
                       name);                                                             \
            dlclose(a->lib);                                                              \
            a->lib = NULL;                                                                \
            return LLMEM_E_NOT_FOUND;                                                     \
        }                                                                                 \
    } while (0)
    SYM(get_version, "ncclGetVersion");
    SYM(error_string, "ncclGetErrorString");
    SYM(init_all, "ncclCommInitAll");
    SYM(destroy, "ncclCommDestroy");
    SYM(all_reduce, "ncclAllReduce");
    SYM(all_gather, "ncclAllGather");
    SYM(broadcast, "ncclBroadcast");
#undef SYM
    *(void **)&a->abort = dlsym(a->lib, "ncclCommAbort");
    *(void **)&a->get_async_error = dlsym(a->lib, "ncclCommGetAsyncError");
    a->get_version(&a->version);
    return LLMEM_OK;
}

/* Maps an NCCL result; LLMEM_CUDA_DEBUG names the failing call on stderr. */
static llmem_status nccl_status(nccl_comm *c, int r, const char *what)
{
    if (r == 0)
        return LLMEM_OK;
    cuda_backend *cb = cuda_from(c->base.backend);
    if (cb->debug)
        fprintf(stderr, "llmem cuda: %s failed: %s\n", what, c->g->api.error_string(r));
    return r == 4 || r == 5 ? LLMEM_E_INVALID : LLMEM_E_BACKEND; /* invalid argument / usage */
}

static bool group_aborted(nccl_group *g)
{
    pthread_mutex_lock(&g->mu);
    bool a = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return a;
}

/* Aborts the group; g->mu held. */
static void abort_locked(nccl_group *g)
{
    if (g->aborted)
        return;
    g->aborted = true;
    if (!g->api.abort)
        return;
    for (int32_t k = 0; k < g->n; k++)
        if (g->handles[k])
            g->api.abort(g->handles[k]);
    g->handles_gone = true;
}

static void nc_abort(llmem_comm *comm)
{
    nccl_group *g = nc_of(comm)->g;
    pthread_mutex_lock(&g->mu);
    abort_locked(g);
    pthread_mutex_unlock(&g->mu);
}

static bool nc_aborted(const llmem_comm *comm)
{
    return group_aborted(((const nccl_comm *)(const void *)comm)->g);
}

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* Waits for this rank's stream by polling it, so that an abort, an NCCL
 * asynchronous error or the group timeout ends the wait (the last two
 * abort the group). Returns LLMEM_OK or LLMEM_E_BACKEND. */
static llmem_status nc_wait(nccl_comm *c, cuda_backend *cb)
{
    nccl_group *g = c->g;
    double deadline = g->timeout_ms > 0 ? mono_ms() + (double)g->timeout_ms : 0.0;
    for (;;) {
        cudaError_t q = cudaStreamQuery(cb->stream);
        if (q == cudaSuccess)
            return group_aborted(g) ? LLMEM_E_BACKEND : LLMEM_OK;
        if (q != cudaErrorNotReady)
            return cuda_check(cb, q, "cudaStreamQuery");
        const char *why = NULL;
        pthread_mutex_lock(&g->mu);
        int ae = 0;
        if (g->aborted)
            why = "aborted";
        else if (g->api.get_async_error && g->api.get_async_error(c->comm, &ae) == 0 &&
                 ae != 0 && ae != NCCL_IN_PROGRESS)
            why = g->api.error_string(ae);
        else if (deadline > 0.0 && mono_ms() > deadline)
            why = "timed out (LLMEM_COMM_TIMEOUT_S)";
        if (why)
            abort_locked(g);
        pthread_mutex_unlock(&g->mu);
        if (why) {
            if (cb->debug)
                fprintf(stderr, "llmem cuda: NCCL rank %d of %d: %s; the group is aborted\n",
                        c->base.rank, c->base.size, why);
            return LLMEM_E_BACKEND;
        }
        nanosleep(&(struct timespec){.tv_nsec = 50000}, NULL);
    }
}

static llmem_status nc_all_reduce(llmem_comm *comm, llmem_buffer *buf, size_t off, int64_t count,
                                  llmem_dtype dt)
{
    nccl_comm *c = nc_of(comm);
    cuda_backend *cb = cuda_from(comm->backend);
    size_t es = dt == LLMEM_DTYPE_F32 ? 4 : dt == LLMEM_DTYPE_BF16 ? 2 : 0;
    if (es == 0 || count < 0 ||
        (count > 0 && !llmem_comm_range_ok(buf, comm->backend, off, (size_t)count * es)))
        return LLMEM_E_INVALID;
    if (group_aborted(c->g))
        return LLMEM_E_BACKEND;
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK || count == 0)
        return st;
    void *p = (char *)cuda_dev(buf) + off;
    return nccl_status(c, c->g->api.all_reduce(p, p, (size_t)count,
                                               es == 4 ? NCCL_FLOAT32 : NCCL_BFLOAT16, NCCL_SUM,
                                               c->comm, cb->stream),
                       "ncclAllReduce");
}

static llmem_status nc_all_gather(llmem_comm *comm, llmem_buffer *src, size_t src_off,
                                  llmem_buffer *dst, size_t dst_off, size_t bytes)
{
    nccl_comm *c = nc_of(comm);
    cuda_backend *cb = cuda_from(comm->backend);
    size_t n = (size_t)comm->size;
    if (bytes > SIZE_MAX / n ||
        (bytes > 0 && (!llmem_comm_range_ok(src, comm->backend, src_off, bytes) ||
                       !llmem_comm_range_ok(dst, comm->backend, dst_off, bytes * n))))
        return LLMEM_E_INVALID;
    if (bytes > 0 && src == dst && src_off != dst_off + (size_t)comm->rank * bytes &&
        !(src_off + bytes <= dst_off || dst_off + bytes * n <= src_off))
        return LLMEM_E_INVALID; /* overlapping, not in place */
    if (group_aborted(c->g))
        return LLMEM_E_BACKEND;
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK || bytes == 0)
        return st;
    return nccl_status(c, c->g->api.all_gather((char *)cuda_dev(src) + src_off,
                                               (char *)cuda_dev(dst) + dst_off, bytes, NCCL_UINT8,
                                               c->comm, cb->stream),
                       "ncclAllGather");
}

/* One all-gather into the staging area ([rank][row]), then one 2-D copy
 * per rank puts its rows at their column block. */
static llmem_status nc_all_gather_rows(llmem_comm *comm, llmem_buffer *src, size_t src_off,
                                       llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                       size_t row_bytes)
{
    nccl_comm *c = nc_of(comm);
    cuda_backend *cb = cuda_from(comm->backend);
    size_t n = (size_t)comm->size;
    if (!llmem_comm_rows_ok(src, src_off, dst, dst_off, n_rows, row_bytes, comm->size,
                            comm->backend))
        return LLMEM_E_INVALID;
    size_t part = (size_t)n_rows * row_bytes;
    if (group_aborted(c->g))
        return LLMEM_E_BACKEND;
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK || part == 0)
        return st;
    if (c->tmp_size < part * n) {
        /* queued collectives may still read the old staging area */
        if ((st = cuda_check(cb, cudaStreamSynchronize(cb->stream), "cudaStreamSynchronize")) !=
            LLMEM_OK)
            return st;
        void *p = NULL;
        if (cudaMalloc(&p, part * n) != cudaSuccess)
            return LLMEM_E_NO_MEMORY;
        cudaFree(c->tmp);
        c->tmp = p;
        c->tmp_size = part * n;
    }
    st = nccl_status(c, c->g->api.all_gather((char *)cuda_dev(src) + src_off, c->tmp, part,
                                             NCCL_UINT8, c->comm, cb->stream),
                     "ncclAllGather (rows)");
    for (size_t r = 0; r < n && st == LLMEM_OK; r++)
        st = cuda_check(cb, cudaMemcpy2DAsync((char *)cuda_dev(dst) + dst_off + r * row_bytes,
                                              n * row_bytes, (char *)c->tmp + r * part, row_bytes,
                                              row_bytes, (size_t)n_rows,
                                              cudaMemcpyDeviceToDevice, cb->stream),
                        "cudaMemcpy2DAsync");
    return st;
}

static llmem_status nc_broadcast(llmem_comm *comm, llmem_buffer *buf, size_t off, size_t bytes,
                                 int32_t root)
{
    nccl_comm *c = nc_of(comm);
    cuda_backend *cb = cuda_from(comm->backend);
    if (root < 0 || root >= comm->size ||
        (bytes > 0 && !llmem_comm_range_ok(buf, comm->backend, off, bytes)))
        return LLMEM_E_INVALID;
    if (group_aborted(c->g))
        return LLMEM_E_BACKEND;
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK || bytes == 0)
        return st;
    void *p = (char *)cuda_dev(buf) + off;
    return nccl_status(c, c->g->api.broadcast(p, p, bytes, NCCL_UINT8, root, c->comm, cb->stream),
                       "ncclBroadcast");
}

static llmem_status nc_barrier(llmem_comm *comm)
{
    nccl_comm *c = nc_of(comm);
    cuda_backend *cb = cuda_from(comm->backend);
    if (group_aborted(c->g))
        return LLMEM_E_BACKEND;
    llmem_status st = cuda_enter(cb);
    if (st == LLMEM_OK)
        st = nccl_status(c, c->g->api.all_reduce(c->flag, c->flag, 1, NCCL_FLOAT32, NCCL_SUM,
                                                 c->comm, cb->stream),
                         "ncclAllReduce (barrier)");
    if (st == LLMEM_OK)
        st = nc_wait(c, cb);
    return st;
}

static void group_unref(nccl_group *g)
{
    if (--g->live > 0) /* destroy runs on the thread that owns the model: no race */
        return;
    if (g->api.lib)
        dlclose(g->api.lib);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void nc_destroy(llmem_comm *comm)
{
    nccl_comm *c = nc_of(comm);
    if (!c)
        return;
    cuda_enter(cuda_from(comm->backend));
    if (c->comm && !c->g->handles_gone) /* an abort freed it */
        c->g->api.destroy(c->comm);
    cudaFree(c->flag);
    cudaFree(c->tmp);
    group_unref(c->g);
    free(c);
}

static const llmem_comm_i nccl_comm_iface = {
    .struct_size = sizeof(llmem_comm_i),
    .name = "nccl",
    .destroy = nc_destroy,
    .all_reduce = nc_all_reduce,
    .all_gather = nc_all_gather,
    .broadcast = nc_broadcast,
    .barrier = nc_barrier,
    .all_gather_rows = nc_all_gather_rows,
    .abort = nc_abort,
    .aborted = nc_aborted,
};

llmem_status cuda_comm_group(llmem_backend *const *bes, int32_t n, llmem_comm **comms, char *err,
                             size_t err_len)
{
    int devs[LLMEM_COMM_MAX_RANKS];
    nccl_comm_t handles[LLMEM_COMM_MAX_RANKS] = {0};
    for (int32_t r = 0; r < n; r++) {
        devs[r] = cuda_from(bes[r])->device;
        for (int32_t k = 0; k < r; k++)
            if (devs[k] == devs[r]) {
                llmem_errf(err, err_len, "cuda: NCCL needs one device per rank; ranks %d and %d "
                                         "are both on device %d", k, r, devs[r]);
                return LLMEM_E_INVALID;
            }
    }
    nccl_group *g = calloc(1, sizeof *g);
    if (!g)
        return LLMEM_E_NO_MEMORY;
    pthread_mutex_init(&g->mu, NULL);
    g->n = n;
    g->timeout_ms = llmem_comm_timeout_ms();
    llmem_status st = nccl_load(&g->api, err, err_len);
    if (st != LLMEM_OK) {
        pthread_mutex_destroy(&g->mu);
        free(g);
        return st;
    }
    int r0 = g->api.init_all(handles, n, devs);
    if (r0 != 0) {
        llmem_errf(err, err_len, "cuda: ncclCommInitAll over %d devices failed: %s (NCCL %d)", n,
                   g->api.error_string(r0), g->api.version);
        dlclose(g->api.lib);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return LLMEM_E_BACKEND;
    }
    memcpy(g->handles, handles, (size_t)n * sizeof *handles);
    st = LLMEM_OK;
    for (int32_t r = 0; r < n; r++) {
        nccl_comm *c = calloc(1, sizeof *c);
        cuda_backend *cb = cuda_from(bes[r]);
        if (c && (cuda_enter(cb) != LLMEM_OK ||
                  cudaMalloc((void **)&c->flag, sizeof(float)) != cudaSuccess)) {
            free(c);
            c = NULL;
        }
        if (!c) { /* this rank and the ones after it: their NCCL handles go now */
            for (int32_t k = r; k < n; k++) {
                cuda_enter(cuda_from(bes[k]));
                g->api.destroy(handles[k]);
            }
            st = LLMEM_E_NO_MEMORY;
            break;
        }
        c->base = (llmem_comm){.iface = &nccl_comm_iface, .rank = r, .size = n,
                               .backend = bes[r]};
        c->g = g;
        c->comm = handles[r];
        g->live++;
        comms[r] = &c->base;
    }
    if (st != LLMEM_OK) {
        llmem_errf(err, err_len, "cuda: out of memory creating %d NCCL communicators", n);
        bool none = g->live == 0;
        for (int32_t r = 0; r < n && comms[r]; r++) {
            nc_destroy(comms[r]);
            comms[r] = NULL;
        }
        if (none) {
            dlclose(g->api.lib);
            pthread_mutex_destroy(&g->mu);
            free(g);
        }
    }
    return st;
}

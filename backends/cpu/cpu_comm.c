/* llmem backends/cpu/: the in-process communicator (<llmem/comm.h>, "cpu").
 *
 * One thread per rank. Each collective is two barriers: every rank posts
 * its call (kind, sizes, its own verdict on its arguments) and its part
 * (downloaded into its host staging slot), barrier; every rank then checks
 * all posts alike and, when they agree, builds the result from every
 * slot in rank order and uploads it; barrier, so that no slot is
 * overwritten while another rank still reads it. Every rank reaches the
 * same verdict, so a bad argument on one rank fails the call on all of
 * them instead of leaving some waiting. Works over buffers of any backend
 * (download / upload); the sums are computed the same way on every rank,
 * so replicated activations stay bit-identical across ranks.
 * Reference: the MPI / NCCL collective definitions (ncclAllReduce,
 * ncclAllGather, ncclBroadcast).
 *
 * The barrier is the group's own (a mutex, a condition variable and a
 * generation count) rather than a pthread_barrier_t, so that a wait can
 * end early: llmem_comm_abort, or a wait past the group's timeout (which
 * aborts the group), wakes every waiting rank with LLMEM_E_BACKEND.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_ops.h"
#include "llmem/comm_impl.h"

enum { OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER, OP_ALL_GATHER_ROWS };

typedef struct post {
    int32_t op;
    int32_t dtype, root;
    int64_t count;
    size_t bytes;
    llmem_status st; /* this rank's verdict on its own arguments and copies */
} post;

typedef struct group {
    int32_t n;
    pthread_mutex_t mu; /* guards arrived, gen, aborted and live */
    pthread_cond_t cv;  /* on CLOCK_MONOTONIC */
    int32_t arrived;    /* ranks in the current barrier */
    uint64_t gen;       /* barriers completed */
    bool aborted;
    int64_t timeout_ms; /* 0: none */
    int32_t live; /* communicators not yet destroyed */
    post posts[LLMEM_COMM_MAX_RANKS];
    uint8_t *stage[LLMEM_COMM_MAX_RANKS]; /* rank r writes only stage[r] */
    size_t stage_cap[LLMEM_COMM_MAX_RANKS];
} group;

typedef struct cpu_comm {
    llmem_comm base;
    group *g;
    uint8_t *res; /* this rank's result before upload */
    size_t res_cap;
} cpu_comm;

static const llmem_comm_i cpu_comm_iface;

static cpu_comm *cc_of(llmem_comm *c)
{
    return c && c->iface == &cpu_comm_iface ? (cpu_comm *)(void *)c : NULL;
}

static bool grow(uint8_t **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return true;
    uint8_t *q = realloc(*p, n);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

/* Waits until every rank of g has arrived. Returns LLMEM_OK, or
 * LLMEM_E_BACKEND when the group is or gets aborted, or when the wait
 * outlasts the group's timeout (which aborts it: a rank that never comes
 * must not hold the others for ever). */
static llmem_status wait_all(group *g)
{
    struct timespec dl;
    if (g->timeout_ms > 0) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += (time_t)(g->timeout_ms / 1000);
        dl.tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&g->mu);
    uint64_t gen = g->gen;
    if (!g->aborted && ++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    }
    while (g->gen == gen && !g->aborted) {
        int rc = g->timeout_ms > 0 ? pthread_cond_timedwait(&g->cv, &g->mu, &dl)
                                   : pthread_cond_wait(&g->cv, &g->mu);
        if (rc == ETIMEDOUT && g->gen == gen) {
            g->aborted = true;
            pthread_cond_broadcast(&g->cv);
        }
    }
    llmem_status st = g->gen != gen ? LLMEM_OK : LLMEM_E_BACKEND;
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* Posts p, waits for every rank, and returns the group's verdict: the
 * status of the lowest rank that failed its own checks, else
 * LLMEM_E_INVALID when the posts differ, else LLMEM_OK (LLMEM_E_BACKEND
 * when the group is aborted). */
static llmem_status exchange(cpu_comm *c, const post *p)
{
    group *g = c->g;
    g->posts[c->base.rank] = *p;
    llmem_status w = wait_all(g);
    if (w != LLMEM_OK)
        return w;
    for (int32_t r = 0; r < g->n; r++)
        if (g->posts[r].st != LLMEM_OK)
            return g->posts[r].st;
    for (int32_t r = 1; r < g->n; r++) {
        const post *a = &g->posts[0], *b = &g->posts[r];
        if (a->op != b->op || a->dtype != b->dtype || a->root != b->root ||
            a->count != b->count || a->bytes != b->bytes)
            return LLMEM_E_INVALID;
    }
    return LLMEM_OK;
}

/* Ends a collective: no rank leaves before every rank is done reading
 * (an abort ends the wait: the group is then not used again). */
static llmem_status finish(cpu_comm *c, llmem_status st)
{
    llmem_status w = wait_all(c->g);
    return st != LLMEM_OK ? st : w;
}

/* Downloads [off, off + bytes) of buf into this rank's staging slot. */
static llmem_status stage_in(cpu_comm *c, llmem_buffer *buf, size_t off, size_t bytes)
{
    group *g = c->g;
    int32_t r = c->base.rank;
    if (bytes == 0)
        return LLMEM_OK;
    if (!grow(&g->stage[r], &g->stage_cap[r], bytes))
        return LLMEM_E_NO_MEMORY;
    return llmem_buffer_download(buf, off, g->stage[r], bytes) == LLMEM_OK ? LLMEM_OK
                                                                            : LLMEM_E_BACKEND;
}

static llmem_status cc_all_reduce(llmem_comm *comm, llmem_buffer *buf, size_t off, int64_t count,
                                  llmem_dtype dt)
{
    cpu_comm *c = cc_of(comm);
    group *g = c->g;
    size_t es = dt == LLMEM_DTYPE_F32 ? 4 : dt == LLMEM_DTYPE_BF16 ? 2 : 0;
    post p = {.op = OP_ALL_REDUCE, .dtype = (int32_t)dt, .count = count};
    if (es == 0 || count < 0 || (uint64_t)count > SIZE_MAX / 8 ||
        (count > 0 && !llmem_comm_range_ok(buf, comm->backend, off, (size_t)count * es)))
        p.st = LLMEM_E_INVALID;
    else if (!grow(&c->res, &c->res_cap, (size_t)count * es))
        p.st = LLMEM_E_NO_MEMORY;
    else
        p.st = stage_in(c, buf, off, (size_t)count * es);
    llmem_status st = exchange(c, &p);
    if (st != LLMEM_OK || count == 0)
        return finish(c, st);
    for (int64_t i = 0; i < count; i++) {
        double acc = 0.0; /* rank order, one rounding: the same bytes on every rank */
        for (int32_t r = 0; r < g->n; r++) {
            if (es == 4) {
                float v;
                memcpy(&v, g->stage[r] + (size_t)i * 4, 4);
                acc += (double)v;
            } else {
                uint16_t h;
                memcpy(&h, g->stage[r] + (size_t)i * 2, 2);
                acc += (double)bf16_to_f32(h);
            }
        }
        if (es == 4) {
            float v = (float)acc;
            memcpy(c->res + (size_t)i * 4, &v, 4);
        } else {
            uint16_t h = f32_to_bf16((float)acc);
            memcpy(c->res + (size_t)i * 2, &h, 2);
        }
    }
    st = llmem_buffer_upload(buf, off, c->res, (size_t)count * es) == LLMEM_OK ? LLMEM_OK
                                                                                : LLMEM_E_BACKEND;
    return finish(c, st);
}

static llmem_status cc_all_gather(llmem_comm *comm, llmem_buffer *src, size_t src_off,
                                  llmem_buffer *dst, size_t dst_off, size_t bytes)
{
    cpu_comm *c = cc_of(comm);
    group *g = c->g;
    int32_t n = g->n, rank = comm->rank;
    post p = {.op = OP_ALL_GATHER, .bytes = bytes};
    bool ok = bytes <= SIZE_MAX / (size_t)n &&
              (bytes == 0 || (llmem_comm_range_ok(src, comm->backend, src_off, bytes) &&
                              llmem_comm_range_ok(dst, comm->backend, dst_off, bytes * (size_t)n)));
    if (ok && bytes > 0 && src == dst) { /* the same buffer: in place, or disjoint */
        bool in_place = src_off == dst_off + (size_t)rank * bytes;
        bool disjoint = src_off + bytes <= dst_off || dst_off + bytes * (size_t)n <= src_off;
        ok = in_place || disjoint;
    }
    p.st = ok ? stage_in(c, src, src_off, bytes) : LLMEM_E_INVALID;
    llmem_status st = exchange(c, &p);
    if (st != LLMEM_OK || bytes == 0)
        return finish(c, st);
    for (int32_t r = 0; r < n && st == LLMEM_OK; r++)
        if (llmem_buffer_upload(dst, dst_off + (size_t)r * bytes, g->stage[r], bytes) != LLMEM_OK)
            st = LLMEM_E_BACKEND;
    return finish(c, st);
}

static llmem_status cc_all_gather_rows(llmem_comm *comm, llmem_buffer *src, size_t src_off,
                                       llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                       size_t row_bytes)
{
    cpu_comm *c = cc_of(comm);
    group *g = c->g;
    int32_t n = g->n;
    post p = {.op = OP_ALL_GATHER_ROWS, .count = n_rows, .bytes = row_bytes};
    size_t part = 0;
    if (!llmem_comm_rows_ok(src, src_off, dst, dst_off, n_rows, row_bytes, n, comm->backend))
        p.st = LLMEM_E_INVALID;
    else if (!grow(&c->res, &c->res_cap, (part = (size_t)n_rows * row_bytes) * (size_t)n))
        p.st = LLMEM_E_NO_MEMORY;
    else
        p.st = stage_in(c, src, src_off, part);
    llmem_status st = exchange(c, &p);
    if (st != LLMEM_OK || part == 0)
        return finish(c, st);
    /* the whole result on the host, then one upload */
    for (int64_t t = 0; t < n_rows; t++)
        for (int32_t r = 0; r < n; r++)
            memcpy(c->res + ((size_t)t * (size_t)n + (size_t)r) * row_bytes,
                   g->stage[r] + (size_t)t * row_bytes, row_bytes);
    st = llmem_buffer_upload(dst, dst_off, c->res, part * (size_t)n) == LLMEM_OK ? LLMEM_OK
                                                                                : LLMEM_E_BACKEND;
    return finish(c, st);
}

static llmem_status cc_broadcast(llmem_comm *comm, llmem_buffer *buf, size_t off, size_t bytes,
                                 int32_t root)
{
    cpu_comm *c = cc_of(comm);
    group *g = c->g;
    post p = {.op = OP_BROADCAST, .bytes = bytes, .root = root};
    if (root < 0 || root >= g->n ||
        (bytes > 0 && !llmem_comm_range_ok(buf, comm->backend, off, bytes)))
        p.st = LLMEM_E_INVALID;
    else if (comm->rank == root)
        p.st = stage_in(c, buf, off, bytes);
    llmem_status st = exchange(c, &p);
    if (st == LLMEM_OK && bytes > 0 && comm->rank != root &&
        llmem_buffer_upload(buf, off, g->stage[root], bytes) != LLMEM_OK)
        st = LLMEM_E_BACKEND;
    return finish(c, st);
}

static llmem_status cc_barrier(llmem_comm *comm)
{
    cpu_comm *c = cc_of(comm);
    post p = {.op = OP_BARRIER};
    llmem_status st = llmem_backend_synchronize(comm->backend);
    p.st = st == LLMEM_OK ? LLMEM_OK : LLMEM_E_BACKEND;
    return finish(c, exchange(c, &p));
}

static void cc_abort(llmem_comm *comm)
{
    group *g = cc_of(comm)->g;
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static bool cc_aborted(const llmem_comm *comm)
{
    group *g = ((const cpu_comm *)(const void *)comm)->g;
    pthread_mutex_lock(&g->mu);
    bool a = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return a;
}

static void group_free(group *g)
{
    for (int32_t r = 0; r < g->n; r++)
        free(g->stage[r]);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void group_unref(group *g)
{
    pthread_mutex_lock(&g->mu);
    bool last = --g->live == 0;
    pthread_mutex_unlock(&g->mu);
    if (last)
        group_free(g);
}

static void cc_destroy(llmem_comm *comm)
{
    cpu_comm *c = cc_of(comm);
    if (!c)
        return;
    group_unref(c->g);
    free(c->res);
    free(c);
}

static const llmem_comm_i cpu_comm_iface = {
    .struct_size = sizeof(llmem_comm_i),
    .name = "cpu",
    .destroy = cc_destroy,
    .all_reduce = cc_all_reduce,
    .all_gather = cc_all_gather,
    .broadcast = cc_broadcast,
    .barrier = cc_barrier,
    .all_gather_rows = cc_all_gather_rows,
    .abort = cc_abort,
    .aborted = cc_aborted,
};

/* Called by llmem_comm_group_create (base/comm.c), which has checked the
 * arguments (n in range, distinct backends of one kind). */
llmem_status llmem_cpu_comm_group(llmem_backend *const *bes, int32_t n, llmem_comm **comms,
                                  char *err, size_t err_len);

llmem_status llmem_cpu_comm_group(llmem_backend *const *bes, int32_t n, llmem_comm **comms,
                                  char *err, size_t err_len)
{
    group *g = calloc(1, sizeof *g);
    if (!g)
        goto oom;
    pthread_condattr_t ca;
    bool cv_ok = pthread_condattr_init(&ca) == 0;
    if (cv_ok) {
        cv_ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                pthread_cond_init(&g->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!cv_ok) {
        free(g);
        goto oom;
    }
    pthread_mutex_init(&g->mu, NULL);
    g->n = n;
    g->timeout_ms = llmem_comm_timeout_ms();
    for (int32_t r = 0; r < n; r++) {
        cpu_comm *c = calloc(1, sizeof *c);
        if (!c) {
            if (r == 0) /* no communicator holds the group yet */
                group_free(g);
            while (--r >= 0) { /* the last one frees the group */
                cc_destroy(comms[r]);
                comms[r] = NULL;
            }
            goto oom;
        }
        c->base = (llmem_comm){.iface = &cpu_comm_iface, .rank = r, .size = n, .backend = bes[r]};
        c->g = g;
        g->live++;
        comms[r] = &c->base;
    }
    return LLMEM_OK;
oom:
    llmem_errf(err, err_len, "cannot allocate a %d-rank communicator group", n);
    return LLMEM_E_NO_MEMORY;
}

/* llmem base/: communicator wrappers and group creation (<llmem/comm.h>).
 * The wrappers check the communicator and its vtable slot; the
 * implementations (backends/cpu/cpu_comm.c, the CUDA plugin's NCCL one)
 * validate their arguments. */
#include <stdlib.h>
#include <string.h>

#include "llmem/comm_impl.h"

/* backends/cpu/cpu_comm.c */
llmem_status llmem_cpu_comm_group(llmem_backend *const *bes, int32_t n, llmem_comm **comms,
                                  char *err, size_t err_len);

static bool has_comm_group(const llmem_backend *be)
{
    const llmem_backend_i *bi = be->iface;
    return bi->struct_size >= offsetof(llmem_backend_i, comm_group) + sizeof(bi->comm_group) &&
           bi->comm_group;
}

llmem_status llmem_comm_group_create(llmem_backend *const *bes, int32_t n, const char *kind,
                                     llmem_comm **comms, char *err, size_t err_len)
{
    if (!bes || !comms || n < 1 || n > LLMEM_COMM_MAX_RANKS) {
        llmem_errf(err, err_len, "communicator group: need %s",
                   n < 1 || n > LLMEM_COMM_MAX_RANKS ? "1 to 64 ranks" : "backends and an output array");
        return LLMEM_E_INVALID;
    }
    for (int32_t r = 0; r < n; r++)
        comms[r] = NULL;
    for (int32_t r = 0; r < n; r++) {
        if (!bes[r]) {
            llmem_errf(err, err_len, "communicator group: backend of rank %d is NULL", r);
            return LLMEM_E_INVALID;
        }
        if (bes[r]->iface != bes[0]->iface) {
            llmem_errf(err, err_len, "communicator group: rank %d runs on %s, rank 0 on %s", r,
                       llmem_backend_name(bes[r]), llmem_backend_name(bes[0]));
            return LLMEM_E_INVALID;
        }
        for (int32_t k = 0; k < r; k++)
            if (bes[k] == bes[r]) {
                llmem_errf(err, err_len, "communicator group: ranks %d and %d share one backend "
                                         "instance (each rank needs its own)", k, r);
                return LLMEM_E_INVALID;
            }
    }
    bool own = has_comm_group(bes[0]);
    if (!kind || !strcmp(kind, "auto"))
        kind = own ? "nccl" : "cpu";
    if (!strcmp(kind, "cpu"))
        return llmem_cpu_comm_group(bes, n, comms, err, err_len);
    if (strcmp(kind, "nccl") != 0) {
        llmem_errf(err, err_len, "unknown communicator '%s' (cpu, nccl or auto)", kind);
        return LLMEM_E_INVALID;
    }
    if (!own) {
        llmem_errf(err, err_len, "the %s backend has no NCCL communicator (cuda has)",
                   llmem_backend_name(bes[0]));
        return LLMEM_E_UNSUPPORTED;
    }
    llmem_status st = bes[0]->iface->comm_group(bes, n, comms, err, err_len);
    if (st != LLMEM_OK)
        for (int32_t r = 0; r < n; r++)
            comms[r] = NULL;
    return st;
}

void llmem_comm_destroy(llmem_comm *c)
{
    if (c && c->iface && c->iface->destroy)
        c->iface->destroy(c);
}

int32_t llmem_comm_rank(const llmem_comm *c)
{
    return c ? c->rank : -1;
}

int32_t llmem_comm_size(const llmem_comm *c)
{
    return c ? c->size : 0;
}

const char *llmem_comm_name(const llmem_comm *c)
{
    return c && c->iface && c->iface->name ? c->iface->name : "?";
}

llmem_backend *llmem_comm_backend(const llmem_comm *c)
{
    return c ? c->backend : NULL;
}

/* The slot `name` of c's table, NULL when c, its table or the slot is missing. */
#define COMM_SLOT(c, name)                                                           \
    ((c) && (c)->iface &&                                                            \
             (c)->iface->struct_size >= offsetof(llmem_comm_i, name) +               \
                                            sizeof(((llmem_comm_i *)0)->name)        \
         ? (c)->iface->name                                                          \
         : NULL)

llmem_status llmem_comm_all_reduce(llmem_comm *c, llmem_buffer *buf, size_t offset,
                                   int64_t count, llmem_dtype dt)
{
    if (!c)
        return LLMEM_E_INVALID;
    if (!COMM_SLOT(c, all_reduce))
        return LLMEM_E_UNSUPPORTED;
    return c->iface->all_reduce(c, buf, offset, count, dt);
}

llmem_status llmem_comm_all_gather(llmem_comm *c, llmem_buffer *src, size_t src_off,
                                   llmem_buffer *dst, size_t dst_off, size_t bytes)
{
    if (!c)
        return LLMEM_E_INVALID;
    if (!COMM_SLOT(c, all_gather))
        return LLMEM_E_UNSUPPORTED;
    return c->iface->all_gather(c, src, src_off, dst, dst_off, bytes);
}

llmem_status llmem_comm_all_gather_rows(llmem_comm *c, llmem_buffer *src, size_t src_off,
                                        llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                        size_t row_bytes)
{
    if (!c)
        return LLMEM_E_INVALID;
    if (!COMM_SLOT(c, all_gather_rows))
        return LLMEM_E_UNSUPPORTED;
    return c->iface->all_gather_rows(c, src, src_off, dst, dst_off, n_rows, row_bytes);
}

llmem_status llmem_comm_broadcast(llmem_comm *c, llmem_buffer *buf, size_t offset, size_t bytes,
                                  int32_t root)
{
    if (!c)
        return LLMEM_E_INVALID;
    if (!COMM_SLOT(c, broadcast))
        return LLMEM_E_UNSUPPORTED;
    return c->iface->broadcast(c, buf, offset, bytes, root);
}

llmem_status llmem_comm_barrier(llmem_comm *c)
{
    if (!c)
        return LLMEM_E_INVALID;
    if (!COMM_SLOT(c, barrier))
        return LLMEM_E_UNSUPPORTED;
    return c->iface->barrier(c);
}

llmem_status llmem_comm_abort(llmem_comm *c)
{
    if (!c)
        return LLMEM_E_INVALID;
    if (!COMM_SLOT(c, abort))
        return LLMEM_E_UNSUPPORTED;
    c->iface->abort(c);
    return LLMEM_OK;
}

bool llmem_comm_aborted(const llmem_comm *c)
{
    return COMM_SLOT(c, aborted) && c->iface->aborted(c);
}

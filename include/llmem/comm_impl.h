/* llmem: the interface a communicator implements (<llmem/comm.h>), for
 * backend plugins that bring their own (the CUDA plugin's NCCL one).
 *
 * Vtable rules as every llmem vtable (STYLE.md): const, designated
 * initialisers, grows only by appending, struct_size set. The base object
 * is the first member of the implementation's struct. The core's public
 * wrappers check the communicator and the vtable slot only; each
 * implementation validates its arguments as <llmem/comm.h> describes.
 * A plugin creates its group through llmem_backend_i.comm_group.
 */
#ifndef LLMEM_COMM_IMPL_H
#define LLMEM_COMM_IMPL_H

#include <stdlib.h>

#include "llmem/backend_impl.h"
#include "llmem/comm.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef struct llmem_comm_i {
    size_t struct_size; /* sizeof(llmem_comm_i) the implementation was built with */
    const char *name;   /* "cpu", "nccl", ... */
    void (*destroy)(llmem_comm *c);
    llmem_status (*all_reduce)(llmem_comm *c, llmem_buffer *buf, size_t offset, int64_t count,
                               llmem_dtype dt);
    llmem_status (*all_gather)(llmem_comm *c, llmem_buffer *src, size_t src_off,
                               llmem_buffer *dst, size_t dst_off, size_t bytes);
    llmem_status (*broadcast)(llmem_comm *c, llmem_buffer *buf, size_t offset, size_t bytes,
                              int32_t root);
    llmem_status (*barrier)(llmem_comm *c);
    llmem_status (*all_gather_rows)(llmem_comm *c, llmem_buffer *src, size_t src_off,
                                    llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                    size_t row_bytes);
    /* Appended (optional): abort the group (<llmem/comm.h> llmem_comm_abort;
     * any thread) and tell whether it is aborted. */
    void (*abort)(llmem_comm *c);
    bool (*aborted)(const llmem_comm *c);
} llmem_comm_i;

/* The group timeout of <llmem/comm.h> in milliseconds: $LLMEM_COMM_TIMEOUT_S
 * (seconds, a decimal; 0: none); 300 s when it is unset or not a number
 * in [0, 1e9]. */
static inline int64_t llmem_comm_timeout_ms(void)
{
    const char *e = getenv("LLMEM_COMM_TIMEOUT_S");
    if (!e || !*e)
        return 300000;
    char *end = NULL;
    double s = strtod(e, &end);
    if (end == e || *end || !(s >= 0) || s > 1e9)
        return 300000;
    return (int64_t)(s * 1000.0 + 0.5);
}

/* The base object, struct llmem_comm, is in <llmem/backend_impl.h> beside
 * the other base objects (its layout is in LLMEM_BACKEND_ABI_LAYOUT). */

/* Checks of llmem_comm_all_gather_rows' ranges for a group of n ranks:
 * both inside their buffers, on be, not overlapping. */
static inline int llmem_comm_rows_ok(const llmem_buffer *src, size_t src_off,
                                     const llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                     size_t row_bytes, int32_t n, const llmem_backend *be);

/* Whether [off, off + bytes) lies inside buf and buf belongs to be (for
 * implementations' argument checks). */
static inline int llmem_comm_range_ok(const llmem_buffer *buf, const llmem_backend *be,
                                      size_t off, size_t bytes)
{
    return buf && buf->backend == be && off <= buf->size && bytes <= buf->size - off;
}

static inline int llmem_comm_rows_ok(const llmem_buffer *src, size_t src_off,
                                     const llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                     size_t row_bytes, int32_t n, const llmem_backend *be)
{
    if (n_rows < 0 || n < 1 || (row_bytes > 0 && (uint64_t)n_rows > SIZE_MAX / row_bytes / (size_t)n))
        return 0;
    size_t part = (size_t)n_rows * row_bytes, all = part * (size_t)n;
    if (part == 0)
        return 1;
    if (!llmem_comm_range_ok(src, be, src_off, part) || !llmem_comm_range_ok(dst, be, dst_off, all))
        return 0;
    return src != dst || src_off + part <= dst_off || dst_off + all <= src_off;
}

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

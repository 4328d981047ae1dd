/* llmem: recorded op sequences (<llmem/backend.h>, llmem_backend_record).
 *
 * With the backend's record slots (<llmem/backend_impl.h>) a recording is
 * the backend's graph (CUDA: stream capture into a CUDA graph, then one
 * cudaGraphLaunch per replay, as vLLM's captured decode steps); without
 * them it is the callback itself, run again at each replay (cpu: an op
 * costs far more than its call, so there is nothing to save).
 */
#include <stdlib.h>

#include "base/base_internal.h"

struct llmem_recording {
    llmem_backend *be;
    void *graph; /* the backend's object, or NULL: re-run fn */
    llmem_record_fn fn;
    void *ctx;
};

/* Whether be's vtable is long enough to hold the record slots and fills all four. */
static bool has_record(const llmem_backend *be)
{
    const llmem_backend_i *i = be->iface;
    if (i->struct_size < offsetof(llmem_backend_i, graph_free) + sizeof(i->graph_free))
        return false;
    return i->record_begin && i->record_end && i->graph_replay && i->graph_free;
}

llmem_status llmem_backend_record(llmem_backend *be, llmem_record_fn fn, void *ctx,
                                  llmem_recording **out)
{
    if (!be || !fn || !out)
        return LLMEM_E_INVALID;
    *out = NULL;
    llmem_recording *r = calloc(1, sizeof *r);
    if (!r)
        return LLMEM_E_NO_MEMORY;
    r->be = be;
    r->fn = fn;
    r->ctx = ctx;
    llmem_status st = LLMEM_OK;
    if (has_record(be)) {
        st = be->iface->record_begin(be);
        if (st != LLMEM_OK)
            goto fail;
        llmem_status st_fn = fn(ctx);
        st = be->iface->record_end(be, &r->graph);
        if (st == LLMEM_OK && st_fn != LLMEM_OK) {
            be->iface->graph_free(be, r->graph);
            st = st_fn;
        }
        if (st != LLMEM_OK)
            goto fail;
    }
    *out = r;
    return LLMEM_OK;
fail:
    free(r);
    return st;
}

llmem_status llmem_recording_replay(llmem_recording *r)
{
    if (!r)
        return LLMEM_E_INVALID;
    if (!r->graph)
        return r->fn(r->ctx);
    return r->be->iface->graph_replay(r->be, r->graph);
}

bool llmem_recording_is_native(const llmem_recording *r)
{
    return r && r->graph;
}

void llmem_recording_free(llmem_recording *r)
{
    if (!r)
        return;
    if (r->graph)
        r->be->iface->graph_free(r->be, r->graph);
    free(r);
}

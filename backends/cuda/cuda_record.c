/* llmem cuda plugin: recorded op sequences (the record slots of
 * <llmem/backend_impl.h>, llmem_backend_record).
 *
 * Stream capture (CUDA Programming Guide, "CUDA Graphs": stream capture)
 * turns the kernels, cuBLAS calls and device copies queued on the backend's
 * stream into a graph, instantiated once; a replay is one cudaGraphLaunch
 * instead of one launch (and its host work) per op. The capture mode is
 * thread-local: other threads' unrelated CUDA calls stay legal. A call that
 * must wait (a scratch that has to grow, an upload, a synchronize)
 * invalidates the capture, and record_end reports it. The graph holds the
 * scratch's address: a replay after the scratch moved returns LLMEM_E_STATE.
 */
#include <stdlib.h>

#include "backends/cuda/cuda_backend.h"

typedef struct cuda_graph {
    cudaGraphExec_t exec;
    unsigned scratch_gen; /* cb->scratch_gen when recorded */
} cuda_graph;

llmem_status cuda_record_begin(llmem_backend *be)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (cb->recording)
        return LLMEM_E_STATE;
    st = cuda_check(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture");
    if (st == LLMEM_OK)
        cb->recording = true;
    return st;
}

llmem_status cuda_record_end(llmem_backend *be, void **graph)
{
    cuda_backend *cb = cuda_from(be);
    *graph = NULL;
    if (!cb->recording)
        return LLMEM_E_STATE;
    cb->recording = false;
    cudaGraph_t g = NULL;
    llmem_status st = cuda_check(cb, cudaStreamEndCapture(cb->stream, &g), "cudaStreamEndCapture");
    if (st == LLMEM_OK && !g)
        st = LLMEM_E_BACKEND;
    cuda_graph *cg = NULL;
    if (st == LLMEM_OK && !(cg = calloc(1, sizeof *cg)))
        st = LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK)
        st = cuda_check(cb, cudaGraphInstantiate(&cg->exec, g, 0), "cudaGraphInstantiate");
    if (g)
        cudaGraphDestroy(g);
    if (st != LLMEM_OK) {
        free(cg);
        return st;
    }
    cg->scratch_gen = cb->scratch_gen;
    *graph = cg;
    return LLMEM_OK;
}

llmem_status cuda_graph_replay(llmem_backend *be, void *graph)
{
    cuda_backend *cb = cuda_from(be);
    cuda_graph *cg = graph;
    if (cg->scratch_gen != cb->scratch_gen)
        return LLMEM_E_STATE;
    llmem_status st = cuda_enter(cb);
    if (st == LLMEM_OK)
        st = cuda_check(cb, cudaGraphLaunch(cg->exec, cb->stream), "cudaGraphLaunch");
    if (st == LLMEM_OK && cb->sync_each_op)
        st = cuda_check(cb, cudaStreamSynchronize(cb->stream), "cudaGraphLaunch (sync)");
    return st;
}

void cuda_graph_free(llmem_backend *be, void *graph)
{
    cuda_backend *cb = cuda_from(be);
    cuda_graph *cg = graph;
    if (cuda_enter(cb) == LLMEM_OK)
        cudaGraphExecDestroy(cg->exec);
    free(cg);
}

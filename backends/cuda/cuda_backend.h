/* llmem cuda plugin: the backend object, its buffers and shared helpers
 * (internal to backends/cuda/).
 *
 * One backend is one CUDA device plus one non-blocking stream and one
 * cuBLAS handle bound to it. Buffers are cudaMalloc allocations (256-byte
 * aligned). Every CUDA and cuBLAS status is checked; failures become
 * LLMEM_E_NO_MEMORY (allocation) or LLMEM_E_BACKEND (anything else).
 */
#ifndef LLMEM_CUDA_BACKEND_H
#define LLMEM_CUDA_BACKEND_H

#include <stdbool.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/kernels.h"
#include "llmem/plugin.h" /* llmem calls go through the host table */

typedef struct cuda_backend {
    llmem_backend base;
    int device;
    int n_sms;
    cudaStream_t stream;
    cublasHandle_t blas;
    char device_name[256];
    bool sync_each_op; /* $LLMEM_CUDA_SYNC=1: synchronize after every op */
    bool debug;        /* $LLMEM_CUDA_DEBUG=1: print failing CUDA calls to stderr */
    bool attn_fast;    /* $LLMEM_CUDA_ATTN_FAST=1: single-rounding tensor-core prefill */
    int dec_ctas;      /* decode attention: CTAs per SM the key splits aim for
                          ($LLMEM_CUDA_DEC_CTAS, default 2) */
    int gdn_split;     /* gated delta net: rows of a state column per thread, 32 (default)
                          or 16 (kernels/gdn.cu gdn_split_kernel), 0 a column per thread
                          ($LLMEM_CUDA_GDN_E; read again on llmem_backend_reload_env) */
    void *scratch;     /* device scratch for ops, grown on demand */
    size_t scratch_size;
    unsigned scratch_gen; /* bumped when scratch moves (recorded graphs hold its address) */
    bool recording;       /* the stream is being captured (cuda_record.c) */
    /* staged uploads: small uploads are copied into this page-locked ring
     * and queued, instead of each waiting for the stream (cuda_backend.c) */
    unsigned char *stage;
    size_t stage_pos;
    bool stage_off; /* $LLMEM_CUDA_SYNC_UPLOAD=1, or the allocation failed */
    /* batched copies (buffer_copy_ranges): the device range table, grown on
     * demand; $LLMEM_CUDA_COPY_RANGES=loop / =api picks a loop of
     * cudaMemcpyAsync / cudaMemcpyBatchAsync instead of the kernel */
    void *copy_tab;
    size_t copy_tab_size;
    int copy_mode; /* 0 kernel, 1 loop, 2 cudaMemcpyBatchAsync */
    /* bf16 shadow (cuda_ops.c): a prefill op (norm, swiglu) also writes its
     * f32 output rounded to bf16 here, and the fast-mode GEMM that reads
     * that output next takes it instead of rounding it again. b16_key is
     * cleared by cuda_enter and cuda_op_done, i.e. by every later buffer
     * call or op; only the producer and op_matmul_fast set it. */
    void *b16;            /* device buffer, grown on demand */
    size_t b16_size;      /* its bytes */
    const void *b16_key;  /* device address of the f32 tensor it mirrors; NULL: none */
    int64_t b16_n;        /* that tensor's element count */
    bool b16_want;        /* a fast-mode GEMM of more than CUK_GEMV_MAX_M rows has run */
    bool b16_off;         /* $LLMEM_CUDA_B16_SHADOW=0 */
} cuda_backend;

typedef struct cuda_buffer {
    llmem_buffer base;
    void *dev;
} cuda_buffer;

/* The ops table (cuda_ops.c): a constant object, so the backend vtable
 * that points at it is a constant too (no rewrite at open). */
extern const struct llmem_ops_i cuda_ops;
/* &cuda_ops. */
const struct llmem_ops_i *cuda_ops_table(void);

/* The backend behind be (never NULL for a backend this plugin made). */
static inline cuda_backend *cuda_from(llmem_backend *be)
{
    return (cuda_backend *)(void *)be;
}

static inline void *cuda_dev(const llmem_buffer *buf)
{
    return ((const cuda_buffer *)(const void *)buf)->dev;
}

/* The device address of tensor t's first byte; NULL for a NULL t (an
 * absent optional operand). */
static inline void *cuda_tensor_ptr(const llmem_tensor *t)
{
    return t ? (char *)cuda_dev(t->buf) + t->offset : NULL;
}

/* Maps a CUDA status to an llmem status (clearing a non-sticky error);
 * `what` names the call for $LLMEM_CUDA_DEBUG. */
llmem_status cuda_check(cuda_backend *cb, cudaError_t e, const char *what);
llmem_status cuda_check_blas(cuda_backend *cb, cublasStatus_t s, const char *what);

/* The status of an op's launch (launch status e, mapped by cuda_check);
 * with $LLMEM_CUDA_SYNC (sync_each_op) also of its execution, except while
 * the stream is being recorded (a capturing stream cannot synchronize).
 * `what` names the op for $LLMEM_CUDA_DEBUG (cuda_ops.c). */
llmem_status cuda_op_done(cuda_backend *cb, cudaError_t e, const char *what);

/* At least `bytes` of device scratch, valid until the next call; waits for
 * queued work before it replaces a smaller allocation. */
llmem_status cuda_scratch(cuda_backend *cb, size_t bytes, void **out);

/* Recorded op sequences (cuda_record.c; the record slots of
 * <llmem/backend_impl.h>): stream capture into a CUDA graph. */
llmem_status cuda_record_begin(llmem_backend *be);
llmem_status cuda_record_end(llmem_backend *be, void **graph);
llmem_status cuda_graph_replay(llmem_backend *be, void *graph);
void cuda_graph_free(llmem_backend *be, void *graph);

/* GPU time per kernel, $LLMEM_CUDA_PROFILE=1 (cuda_prof.c, CUPTI loaded
 * with dlopen): init at open starts kernel tracing (a message and no
 * profile when libcupti is missing, or another backend already profiles);
 * finish at close prints the tables to stderr and stops tracing. */
void cuda_prof_init(cuda_backend *cb);
void cuda_prof_finish(cuda_backend *cb);

/* Makes the backend's device current for this thread. */
llmem_status cuda_enter(cuda_backend *cb);

/* The device address of view table t (NULL when it is empty); the table
 * lives in v->idx. */
static inline const int32_t *cuda_view_table(const llmem_view *v, const llmem_i32_table *t)
{
    return t->n > 0 ? (const int32_t *)(const void *)((const char *)cuda_dev(v->idx) + t->offset)
                    : NULL;
}

/* The ssm_conv and ssm_scan slots of the ops table (cuda_ops_mamba2.c);
 * signatures and statuses as llmem_ops_i's. */
llmem_status cuda_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                              llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out);
llmem_status cuda_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p,
                              const llmem_view *view, int32_t state, llmem_ct *xbc,
                              llmem_ct *dt, llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias,
                              llmem_ct *y);

/* Fills the kernel arguments of state `state` of a recurrent view (with
 * the tables of its snapshot inside the ubatch, if any) and, when
 * some stream reads a slot another stream writes, snapshots every source
 * into backend scratch first (cuda_ops_mamba2.c; shared by every recurrent op). */
llmem_status cuda_rs_prepare(cuda_backend *cb, const llmem_view *view, int32_t state,
                             cuk_rs_args *rs);

/* llmem_backend_i.comm_group: n NCCL communicators over the devices of
 * bes (cuda_comm.c; libnccl.so.2 loaded at run time). Statuses as
 * llmem_comm_group_create. */
struct llmem_comm;
llmem_status cuda_comm_group(llmem_backend *const *bes, int32_t n, struct llmem_comm **comms,
                             char *err, size_t err_len);

#endif

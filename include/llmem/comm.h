/* llmem: communicators — the collectives of tensor parallelism (issue 19).
 *
 * A communicator group joins n ranks, each with a backend instance of its
 * own (rank r on bes[r]: the CPU, or CUDA device r). Every rank calls the
 * same collectives in the same order, each from its own thread, on
 * buffers of its own backend; a collective returns once this rank's part
 * is done (the data is in the rank's buffer, in order with the backend's
 * queue).
 *
 * Two implementations:
 *   "cpu"  in-process, threads: each rank downloads its part to a shared
 *          host staging area, a barrier, then every rank computes the
 *          result from all parts in rank order (the same bytes on every
 *          rank) and uploads it. Works over buffers of any backend; CI
 *          tests the tensor-parallel model with it.
 *   "nccl" the CUDA plugin's, through libnccl.so.2 loaded at run time
 *          (one communicator per device, ncclCommInitAll; the backends'
 *          streams).
 *
 * Collectives follow the MPI / NCCL definitions (NCCL's ncclAllReduce,
 * ncclAllGather, ncclBroadcast): all-reduce sums element-wise over ranks
 * in place; all-gather concatenates every rank's part in rank order;
 * broadcast copies the root's bytes to every rank.
 *
 * Bad input. The CPU communicator validates inside the collective: when
 * any rank's arguments are invalid (out of range, dtype, mismatched sizes
 * or a different collective), EVERY rank returns LLMEM_E_INVALID and no
 * buffer changes, so no rank is left waiting. NCCL cannot exchange that
 * verdict: there a rank that refuses its arguments returns at once and the
 * others wait in the collective; callers keep their arguments identical.
 *
 * A rank that stops. When a rank fails outside a collective (its op
 * failed) or never calls the one the others are in, they would wait for
 * ever. llmem_comm_abort ends that: the group is aborted, every rank
 * waiting in a collective returns LLMEM_E_BACKEND at once, and so does
 * every later collective of the group; only destroy remains. A collective
 * that waits longer than the group's timeout aborts the group itself
 * ($LLMEM_COMM_TIMEOUT_S, read when the group is created: seconds, default
 * 300, 0 = no limit; NCCL: checked while a rank waits in a barrier, which
 * also watches NCCL's asynchronous errors). After an abort the buffers of
 * the collectives that failed are undefined.
 *
 * Threading: a communicator is used by one thread at a time (its rank's);
 * llmem_comm_abort may be called from any thread, on any rank's
 * communicator, at any time.
 */
#ifndef LLMEM_COMM_H
#define LLMEM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

typedef struct llmem_comm llmem_comm;

/* Largest group (ranks) a communicator joins. */
#define LLMEM_COMM_MAX_RANKS 64

/* Creates n communicators, comms[r] for rank r over backend bes[r]
 * (borrowed; they must outlive the communicators). kind: "cpu" (the
 * in-process one, any backends), "nccl" (every bes[r] a CUDA backend of a
 * distinct device), or NULL / "auto": the backends' own communicator when
 * their plugin has one (NCCL for cuda), else "cpu". On failure no
 * communicator is left and comms[0..n) are NULL.
 * Returns LLMEM_OK; LLMEM_E_INVALID (NULL arguments, n outside
 * [1, LLMEM_COMM_MAX_RANKS], an unknown kind, backends of different kinds);
 * LLMEM_E_UNSUPPORTED (kind "nccl" on backends without it);
 * LLMEM_E_NOT_FOUND (libnccl.so.2 missing: err says so); LLMEM_E_NO_MEMORY;
 * LLMEM_E_BACKEND (NCCL refused). err gets one line naming the problem. */
llmem_status llmem_comm_group_create(llmem_backend *const *bes, int32_t n, const char *kind,
                                     llmem_comm **comms, char *err, size_t err_len);

/* Destroys a communicator (NULL is a no-op). Every rank destroys its own;
 * the group's shared state goes with the last one. */
void llmem_comm_destroy(llmem_comm *c);

int32_t llmem_comm_rank(const llmem_comm *c); /* 0..size-1; -1 for NULL */
int32_t llmem_comm_size(const llmem_comm *c); /* ranks in the group; 0 for NULL */
const char *llmem_comm_name(const llmem_comm *c); /* "cpu", "nccl"; "?" for NULL */
llmem_backend *llmem_comm_backend(const llmem_comm *c); /* this rank's backend */

/* In place: buf[offset, offset + count elements) of dtype dt (F32 or BF16)
 * becomes the element-wise sum over ranks. The CPU communicator adds in
 * double in rank order and rounds once (f32: round to nearest; bf16: to
 * nearest even), so every rank gets the same bytes. count 0 is a no-op
 * collective (still a synchronization point).
 * Returns LLMEM_OK; LLMEM_E_INVALID (NULL buffer with count > 0, a range
 * outside the buffer, dtype not F32/BF16, a buffer of another backend,
 * count differing between ranks); LLMEM_E_BACKEND (a copy failed on some
 * rank); LLMEM_E_NO_MEMORY. */
llmem_status llmem_comm_all_reduce(llmem_comm *c, llmem_buffer *buf, size_t offset,
                                   int64_t count, llmem_dtype dt);

/* dst[dst_off + r * bytes, + bytes) = rank r's src[src_off, + bytes), for
 * every r, on every rank (dst holds size * bytes). src and dst may be the
 * same buffer when rank r's part already sits at its slot
 * (src_off == dst_off + rank * bytes: in place, NCCL's convention).
 * Returns as llmem_comm_all_reduce (bytes differing between ranks,
 * ranges outside the buffers or overlapping other than in place:
 * LLMEM_E_INVALID). */
llmem_status llmem_comm_all_gather(llmem_comm *c, llmem_buffer *src, size_t src_off,
                                   llmem_buffer *dst, size_t dst_off, size_t bytes);

/* Rows side by side: each rank contributes n_rows rows of row_bytes at
 * src[src_off, + n_rows * row_bytes); on every rank, row t of dst (at
 * dst_off + t * size * row_bytes) becomes rank 0's row t, rank 1's row t,
 * ... — the column blocks of a matrix whose columns are split over ranks
 * (tensor parallelism's gathered activations or logits). For n_rows 1
 * this is llmem_comm_all_gather. src and dst must not overlap.
 * Returns as llmem_comm_all_gather. */
llmem_status llmem_comm_all_gather_rows(llmem_comm *c, llmem_buffer *src, size_t src_off,
                                        llmem_buffer *dst, size_t dst_off, int64_t n_rows,
                                        size_t row_bytes);

/* buf[offset, + bytes) of rank root is copied to every rank's buf.
 * Returns as llmem_comm_all_reduce (root outside [0, size) or differing
 * between ranks: LLMEM_E_INVALID). */
llmem_status llmem_comm_broadcast(llmem_comm *c, llmem_buffer *buf, size_t offset, size_t bytes,
                                  int32_t root);

/* Returns once every rank has called it (and, NCCL, its queued work
 * before it has run). Returns LLMEM_OK, LLMEM_E_INVALID (another
 * collective on some rank), LLMEM_E_BACKEND. */
llmem_status llmem_comm_barrier(llmem_comm *c);

/* Aborts c's whole group (see "A rank that stops" above): ranks waiting in
 * a collective return LLMEM_E_BACKEND at once, later collectives too.
 * NCCL: ncclCommAbort on every rank's communicator, which also ends the
 * collectives already queued on the devices. Idempotent; callable from
 * any thread. The communicators must still be destroyed.
 * Returns LLMEM_OK; LLMEM_E_INVALID (c NULL); LLMEM_E_UNSUPPORTED (a
 * communicator built without an abort, e.g. an older plugin's). */
llmem_status llmem_comm_abort(llmem_comm *c);

/* Whether c's group has been aborted (false for NULL). */
bool llmem_comm_aborted(const llmem_comm *c);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

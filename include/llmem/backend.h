/* llmem: compute backends and their buffers.
 *
 * A backend is a device (CPU, a CUDA GPU, a Vulkan device) plus one stream
 * of work on it. Backends are opened by name at run time; "cpu" is built in,
 * "cuda" and "vulkan" are plugins loaded with dlopen (see DESIGN.md,
 * "Backends"). Memory modules own device storage only through buffers made
 * here. Ops (matmul, attention, scans) are declared in <llmem/ops.h>.
 *
 * Threading: a backend and its buffers are used by one thread at a time.
 */
#ifndef LLMEM_BACKEND_H
#define LLMEM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Element types of tensors and buffers. */
typedef enum llmem_dtype {
    LLMEM_DTYPE_F32 = 0,
    LLMEM_DTYPE_F16 = 1,  /* IEEE 754 binary16 */
    LLMEM_DTYPE_BF16 = 2, /* bfloat16: the top 16 bits of an f32 */
    LLMEM_DTYPE_I32 = 3,
    /* Scaled 8-bit codes, for KV pools and recurrent states only (docs/memory.md,
     * "Quantized KV and state"): a value is code * scale, with f32 scales
     * stored beside the codes (llmem_kv_page_bytes, llmem_state_slot_bytes
     * in <llmem/view.h>). */
    LLMEM_DTYPE_I8 = 4,      /* int8 code in [-127, 127]; scale = amax / 127 */
    LLMEM_DTYPE_F8E4M3 = 5,  /* OCP FP8 E4M3 ("e4m3fn": bias 7, max 448, no inf,
                                NaN 0x7f/0xff); scale = amax / 448 */
    LLMEM_DTYPE_COUNT
} llmem_dtype;

/* Bytes per element of a dtype (4, 2, 2, 4, 1, 1; for I8 and F8E4M3 the
 * code alone, scales not counted); 0 for an invalid value. */
size_t llmem_dtype_size(llmem_dtype t);
/* "f32", "f16", "bf16", "i32", "int8", "fp8"; "?" for an invalid value. */
const char *llmem_dtype_name(llmem_dtype t);
/* Parses "f32" | "f16" | "bf16" | "i32" | "int8" (or "i8") | "fp8" (or
 * "f8e4m3"). Returns LLMEM_E_INVALID otherwise. */
llmem_status llmem_dtype_parse(const char *name, llmem_dtype *out);
/* True for the scaled 8-bit dtypes (I8, F8E4M3). Inline: backend plugins
 * call llmem only through their host table (<llmem/plugin.h>). */
static inline bool llmem_dtype_is_scaled(llmem_dtype t)
{
    return t == LLMEM_DTYPE_I8 || t == LLMEM_DTYPE_F8E4M3;
}
/* The largest code magnitude of a scaled dtype: 127 (I8), 448 (F8E4M3);
 * 0 otherwise. A block's scale is amax / this (docs/memory.md). */
float llmem_dtype_code_max(llmem_dtype t);

/* FP8 E4M3 (OCP 8-bit floating point spec v1.0, 2023, "E4M3"): x rounded to
 * nearest even, saturated to +-448 (as CUDA's __nv_cvt_float_to_fp8 with
 * __NV_SATFINITE, __NV_E4M3); NaN gives 0x7f (sign kept). Bit-exact with
 * the CUDA conversion for every f32 input; pure, any thread. */
uint8_t llmem_f32_to_e4m3(float x);
/* The value of an E4M3 code (exact in f32); 0x7f / 0xff give NaN. */
float llmem_e4m3_to_f32(uint8_t c);
/* int8 code of x / scale: round to nearest even, clamped to [-127, 127];
 * 0 when scale is 0 or the quotient NaN. scale >= 0. */
int8_t llmem_f32_to_i8(float x, float scale);

typedef struct llmem_backend llmem_backend;
typedef struct llmem_buffer llmem_buffer;

/* What a backend reports about its device. Strings are owned by the
 * backend and live as long as it. */
typedef struct llmem_backend_info {
    const char *backend;     /* "cpu", "cuda", "vulkan" */
    const char *device_name; /* e.g. "NVIDIA H100 80GB HBM3", "llvmpipe" */
    int32_t device;          /* device index within the backend */
    uint64_t memory_total;   /* bytes; 0 when unknown */
    uint64_t memory_free;    /* bytes; 0 when unknown */
    bool host_visible;       /* buffers are plain host memory (llmem_buffer_host_ptr works) */
} llmem_backend_info;

/* Opens a backend.
 *   name:   "auto" (CUDA, then a discrete Vulkan GPU, then "cpu"), "cpu",
 *           "cuda", "vulkan", or the name of any plugin libllmem-<name>.so.
 *   device: device index within the backend (>= 0); -1 picks the default.
 *   out:    receives the backend; the caller owns it (llmem_backend_close).
 *   err:    optional buffer for a one-line reason on failure, e.g.
 *           "vulkan: no Vulkan driver found (vkCreateInstance: -9)".
 * Plugins are searched in $LLMEM_BACKEND_PATH (':'-separated folders), the
 * install folder, then the build tree; the plugin's ABI version must equal
 * LLMEM_BACKEND_ABI_VERSION (<llmem/backend_impl.h>).
 * Returns LLMEM_OK; LLMEM_E_INVALID (NULL out, unknown name syntax, device
 * < -1); LLMEM_E_NOT_FOUND (no plugin, no driver, no such device);
 * LLMEM_E_ABI (plugin built for another ABI); LLMEM_E_NO_MEMORY;
 * LLMEM_E_BACKEND (driver error while opening). */
llmem_status llmem_backend_open(const char *name, int32_t device, llmem_backend **out,
                                char *err, size_t err_len);

/* Closes a backend. Buffers still alive keep the backend (and its plugin)
 * loaded until they are freed. Accepts NULL. */
void llmem_backend_close(llmem_backend *be);

/* Fills *info. Returns LLMEM_E_INVALID for NULL arguments. */
llmem_status llmem_backend_get_info(llmem_backend *be, llmem_backend_info *info);

/* Backend name ("cpu", ...). Never NULL for a valid backend. */
const char *llmem_backend_name(const llmem_backend *be);

/* Describes, one line per entry, every backend the registry knows and why
 * an unavailable one is missing; calls fn(line, ctx) for each. Used by
 * `llmem info`. Never fails. */
void llmem_backend_list(void (*fn)(const char *line, void *ctx), void *ctx);

/* Fault injection for tests: when set, every buffer allocation on be first
 * calls hook(size in bytes, ctx) and fails with LLMEM_E_NO_MEMORY when it
 * returns false. Pass hook NULL to remove it. The caller keeps ctx alive
 * while the hook is set. be NULL: does nothing. Not thread-safe against
 * allocations on be. */
typedef bool (*llmem_alloc_hook)(size_t size, void *ctx);
void llmem_backend_set_alloc_hook(llmem_backend *be, llmem_alloc_hook hook, void *ctx);

/* Fault injection for tests (the CPU backend only): when set, every
 * device-to-device copy the backend runs, one call per llmem_buffer_copy
 * and one per batch of llmem_buffer_copy_ranges (one per range with
 * LLMEM_COPY_RANGES=0), first calls hook(bytes of the call, ctx) and, when
 * it returns false, fails with LLMEM_E_BACKEND having written nothing: a
 * device copy that failed, as a lost GPU reports one. Uploads, downloads
 * and fills are not hooked. Pass hook NULL to remove it; the caller keeps
 * ctx alive while it is set. Not thread-safe against copies on be.
 * Returns LLMEM_OK; LLMEM_E_INVALID (be NULL); LLMEM_E_UNSUPPORTED (be is
 * not the CPU backend). */
typedef bool (*llmem_copy_hook)(size_t size, void *ctx);
llmem_status llmem_backend_set_copy_hook(llmem_backend *be, llmem_copy_hook hook, void *ctx);

/* Allocates a device buffer of `size` bytes (> 0), aligned to at least 256
 * bytes. Contents are undefined. The caller owns it (llmem_buffer_free).
 * Returns LLMEM_OK; LLMEM_E_INVALID (size 0, NULL out); LLMEM_E_NO_MEMORY. */
llmem_status llmem_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out);

/* Frees a buffer. Accepts NULL. */
void llmem_buffer_free(llmem_buffer *buf);

/* Size in bytes; backend that made it. */
size_t llmem_buffer_size(const llmem_buffer *buf);
llmem_backend *llmem_buffer_backend(const llmem_buffer *buf);

/* Host pointer to a host-visible buffer (CPU backend), else NULL. */
void *llmem_buffer_host_ptr(llmem_buffer *buf);

/* Copies `size` bytes host -> device at byte `offset`. Synchronous with
 * respect to the host memory: `src` may be reused on return.
 * Returns LLMEM_E_INVALID when [offset, offset+size) is outside the buffer;
 * LLMEM_E_BACKEND on a device error. */
llmem_status llmem_buffer_upload(llmem_buffer *dst, size_t offset, const void *src, size_t size);

/* Copies n byte ranges host -> device, each to the same offset it has in
 * `src`: range j is bytes [offset[j], offset[j] + size[j]) of both, `src`
 * being a host mirror of (a prefix of) the buffer. One call instead of n
 * llmem_buffer_upload calls for the scattered small ranges of an
 * incrementally updated table (a decode step in pages of 1 changes one
 * 64-byte block of every sequence's page-table row): the buffer's write
 * generation is taken once. Synchronous like llmem_buffer_upload. offset
 * and size: [n] arrays, caller-owned, read only. Every range is checked
 * before anything is written: LLMEM_E_INVALID (nothing written) when a
 * range lies outside the buffer, n < 0, or a pointer is NULL with n > 0;
 * LLMEM_E_BACKEND on a device error (ranges before the failing one may
 * have been written). n == 0 and empty ranges are no-ops. */
llmem_status llmem_buffer_upload_ranges(llmem_buffer *dst, const void *src, int32_t n,
                                        const size_t *offset, const size_t *size);

/* Copies `size` bytes device -> host; waits for pending work on the buffer.
 * Errors as llmem_buffer_upload. */
llmem_status llmem_buffer_download(llmem_buffer *src, size_t offset, void *dst, size_t size);

/* Device-to-device copy of `size` bytes; both buffers on the same backend.
 * Overlapping ranges of one buffer are LLMEM_E_INVALID. Errors as upload. */
llmem_status llmem_buffer_copy(llmem_buffer *dst, size_t dst_offset, llmem_buffer *src,
                               size_t src_offset, size_t size);

/* One device-to-device copy of a batch (llmem_buffer_copy_ranges): `size`
 * bytes from byte `src_offset` of `src` to byte `dst_offset` of `dst`. */
typedef struct llmem_copy_range {
    llmem_buffer *dst;
    size_t dst_offset; /* bytes */
    llmem_buffer *src;
    size_t src_offset; /* bytes */
    size_t size;       /* bytes; 0: nothing */
} llmem_copy_range;

/* Copies n byte ranges device -> device as one batch, queued on the
 * backend's queue in order with ops and other copies (asynchronous as
 * llmem_buffer_copy is). The batch behaves as if every range were read
 * before any is written, so no destination may overlap another range's
 * destination or any range's source (sources may overlap each other).
 * Meant for the many small copies of one commit (a recurrent memory's
 * snapshots: every state of every layer of every sequence that publishes),
 * which a backend with the buffer_copy_ranges slot (<llmem/backend_impl.h>)
 * runs in one launch: CUDA one kernel over a range table (as vLLM's
 * copy_blocks kernel batches its block copies), Vulkan one dispatch per
 * 11 buffers. Without the slot, or with the environment variable
 * LLMEM_COPY_RANGES=0, it is a loop of llmem_buffer_copy. `ranges`: [n],
 * caller-owned, read only, may be reused on return. Every range is checked
 * before anything is queued: LLMEM_E_INVALID (nothing written) when n < 0,
 * ranges is NULL with n > 0, a buffer is NULL, the buffers are not all of
 * one backend, a range lies outside its buffer, or two ranges overlap as
 * above; LLMEM_E_BACKEND on a device error (some ranges may have been
 * copied); the backend slot's own LLMEM_E_NO_MEMORY. n == 0 and empty
 * ranges are no-ops. Cost on the host: O(n) (the overlap check
 * radix-sorts the ranges' 2n byte spans; about 60 us for 3,712 ranges on
 * one core); up to 16 ranges, or when the sort finds no host memory, it
 * compares every pair instead (O(n^2), allocating nothing), so the check
 * never fails a commit for want of memory. */
llmem_status llmem_buffer_copy_ranges(const llmem_copy_range *ranges, int32_t n);

/* Fills `size` bytes (a multiple of 4, offset 4-aligned) with a repeated
 * 32-bit pattern, e.g. 0x7fc00000 (f32 NaN) or 0x7e007e00 (f16/bf16 NaN
 * pairs... see llmem_nan_pattern). Errors as upload. */
llmem_status llmem_buffer_fill(llmem_buffer *dst, size_t offset, size_t size, uint32_t pattern);

/* 32-bit pattern that is NaN in every element of dtype t (two elements for
 * 16-bit types). Used by poison mode. */
uint32_t llmem_nan_pattern(llmem_dtype t);

/* ---- host memory for device copies (the prefix cache's host tier, issue 13) ----
 * Host memory from llmem_backend_host_alloc is what the device copies to
 * and from directly: page-locked (pinned) on CUDA (cudaHostAlloc, as
 * SGLang's HiCache and vLLM's CPU offload allocate theirs), so copies
 * between it and device buffers can run asynchronously on the backend's
 * queue. Backends without the slot (cpu, vulkan) give malloc'd memory and
 * copy synchronously; the calls below behave the same for the caller. */

/* Allocates `size` > 0 bytes of host memory into *out; free it with
 * llmem_backend_host_free on the same backend. be NULL: malloc.
 * Returns LLMEM_OK; LLMEM_E_INVALID (size 0, out NULL); LLMEM_E_NO_MEMORY. */
llmem_status llmem_backend_host_alloc(llmem_backend *be, size_t size, void **out);

/* Frees memory from llmem_backend_host_alloc(be, ...). Waits for the
 * backend's queue first when it may copy asynchronously (copies queued on
 * the memory must not outlive it). Accepts NULL ptr. */
void llmem_backend_host_free(llmem_backend *be, void *ptr);

/* Queues a copy of `size` bytes host -> device at byte `offset` (upload)
 * or device -> host (download) on the backend's queue, in order with ops
 * and the other copies, and returns. The host memory (best from
 * llmem_backend_host_alloc) must stay untouched until
 * llmem_backend_synchronize returns, which is the fence; device work queued
 * later sees the copy done. Backends that cannot copy asynchronously
 * (cpu, vulkan) copy before returning, as llmem_buffer_upload / download.
 * Returns LLMEM_OK; LLMEM_E_INVALID (range outside the buffer, NULL
 * pointers); LLMEM_E_BACKEND (device error). */
llmem_status llmem_buffer_upload_async(llmem_buffer *dst, size_t offset, const void *src,
                                       size_t size);
llmem_status llmem_buffer_download_async(llmem_buffer *src, size_t offset, void *dst,
                                         size_t size);

/* Whether llmem_buffer_*_async copies run asynchronously on be (its
 * backend has the slots), i.e. host memory given to them must wait for
 * llmem_backend_synchronize. */
bool llmem_backend_async_copies(const llmem_backend *be);

/* Reads again the LLMEM_* variables that tune be's ops and that be read
 * into its state when it opened, so that one process can time several
 * settings (setenv, then this; `llmem bench`'s LLMEM_BENCH_GEMV_SETS):
 * the Vulkan backend's per-op kernel choices (docs/vulkan.md, the ones
 * "read when the backend opens"), the CUDA backend's LLMEM_CUDA_GDN_E,
 * LLMEM_VIEW_CHECK of the view checks and
 * LLMEM_COPY_RANGES (process-wide: llmem_buffer_copy_ranges).
 * Steps recorded before keep the settings they were recorded with. Not
 * thread-safe against ops on be, nor against setenv in another thread
 * (getenv is not). Returns LLMEM_OK (also for a backend with nothing to
 * read again); LLMEM_E_INVALID (be NULL). */
llmem_status llmem_backend_reload_env(llmem_backend *be);

/* Waits until all work queued on the backend has finished.
 * Returns LLMEM_E_BACKEND if the device reported an error. */
llmem_status llmem_backend_synchronize(llmem_backend *be);

/* ---- recorded op sequences (as CUDA graphs; vLLM's captured decode steps) ----
 * A recording is a sequence of ops issued by fn(ctx), kept so that it can be
 * run again cheaply with new buffer contents. Ops take their buffers,
 * offsets, shapes and host parameters as they were when recorded; only the
 * contents of the buffers change between replays. So fn must issue only
 * ops, buffer copies and fills (no upload, download or synchronize, no
 * reading of results on the host), on buffers that outlive the recording;
 * and an op that needs to grow its scratch must have run once eagerly with
 * the same shapes first (a warm-up), or recording fails. */
typedef struct llmem_recording llmem_recording;
typedef llmem_status (*llmem_record_fn)(void *ctx);

/* Records fn(ctx) on be. With backend support (the record slots of
 * <llmem/backend_impl.h>: CUDA stream capture into a CUDA graph) fn runs
 * once now, recorded and not executed; without it (cpu) fn is not called
 * now and each replay calls fn(ctx) again, so ctx must stay valid until
 * llmem_recording_free. *out is owned by the caller (llmem_recording_free).
 * Returns LLMEM_OK; LLMEM_E_INVALID for a NULL argument; LLMEM_E_NO_MEMORY;
 * fn's own error or the backend's (LLMEM_E_BACKEND or LLMEM_E_UNSUPPORTED:
 * an op that cannot be recorded); then nothing is kept and the caller runs
 * fn eagerly instead. */
llmem_status llmem_backend_record(llmem_backend *be, llmem_record_fn fn, void *ctx,
                                  llmem_recording **out);

/* Runs a recording's ops again (queued like ops; llmem_backend_synchronize
 * or a download waits for them). Returns LLMEM_OK; LLMEM_E_INVALID for
 * NULL; LLMEM_E_STATE when the backend's captured scratch has moved since
 * (record again); fn's or the backend's error. */
llmem_status llmem_recording_replay(llmem_recording *r);

/* Whether the backend holds r natively (true: CUDA graph) or r re-runs fn
 * (false). */
bool llmem_recording_is_native(const llmem_recording *r);

/* Frees a recording (NULL is a no-op). The backend must still be open. */
void llmem_recording_free(llmem_recording *r);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif

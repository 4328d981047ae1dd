/* llmem CUDA kernels: batched device copies (copy.cu), for the cuda
 * plugin's buffer_copy_ranges slot (<llmem/backend_impl.h>). Rules as
 * kernels/kernels.h. */
#ifndef LLMEM_CUDA_KERNELS_COPY_H
#define LLMEM_CUDA_KERNELS_COPY_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a range one CTA copies at a time (a multiple of 16). */
#define CUK_COPY_CHUNK 32768

/* One range of a batch, as the kernel reads it from device memory. */
typedef struct cuk_copy_range {
    uint64_t src, dst; /* device addresses */
    uint64_t size;     /* bytes, > 0 */
    uint64_t first;    /* the batch's chunks before this range (sum of
                          ceil(size / CUK_COPY_CHUNK) over earlier ranges) */
} cuk_copy_range;

/* Copies ranges[0..n) (a device table, n >= 1, `first` ascending as
 * above; n_chunks = the total) in one launch: CTAs take CUK_COPY_CHUNK-byte
 * chunks in a grid-stride loop, find their range by binary search on
 * `first`, and move 16-byte vectors when both addresses are 16-aligned
 * (4-byte words when 4-aligned, else bytes). The ranges must not overlap
 * each other's destinations (the core checked that). n_sms: the device's
 * SM count (sizes the grid). */
cudaError_t cuk_copy_ranges(const cuk_copy_range *ranges, int32_t n, uint64_t n_chunks,
                            int n_sms, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

/* llmem CUDA kernels: shared device helpers (internal).
 *
 * Conversions between f32 and f16/bf16 are the bit-exact ones of the CPU
 * reference (backends/cpu/cpu_ops.h): round to nearest even, overflow to
 * inf, subnormals kept, NaN kept quiet with its sign. Loads and stores of
 * "any float dtype" take the llmem_dtype code at run time (0 f32, 1 f16,
 * 2 bf16); hot kernels are templated on the storage type instead.
 */
#ifndef LLMEM_CUDA_COMMON_CUH
#define LLMEM_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/kernels.h"

#define CUK_F32 0
#define CUK_F16 1
#define CUK_BF16 2

/* ---- scalar conversions ------------------------------------------------------------ */

__device__ __forceinline__ float cuk_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t cuk_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bf16 of 4 consecutive values (cuk_f32_to_bf16 each) in one 8-byte store;
 * dst 8-byte aligned. */
__device__ __forceinline__ void cuk_store_bf16x4(uint16_t *dst, float4 v)
{
    uint2 p;
    p.x = (uint32_t)cuk_f32_to_bf16(v.x) | ((uint32_t)cuk_f32_to_bf16(v.y) << 16);
    p.y = (uint32_t)cuk_f32_to_bf16(v.z) | ((uint32_t)cuk_f32_to_bf16(v.w) << 16);
    *(uint2 *)dst = p;
}

__device__ __forceinline__ float cuk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u)
        return __uint_as_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u)
        return __uint_as_float(sign | ((em + (112u << 10)) << 13));
    float f = (float)em * 5.9604644775390625e-08f; /* 2^-24, exact */
    return __uint_as_float(__float_as_uint(f) | sign);
}

__device__ __forceinline__ uint16_t cuk_f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    /* The add must round to nearest even in f32: __fadd_rn is never
     * contracted into an FMA. */
    float t = __fadd_rn(__uint_as_float(a), 0.5f);
    return (uint16_t)(sign | (__float_as_uint(t) - 0x3f000000u));
}

/* ---- typed element access ------------------------------------------------------------- */

/* Storage types for templates: the element is a uint16_t for f16/bf16. */
struct cuk_f16_t {
    uint16_t v;
};
struct cuk_bf16_t {
    uint16_t v;
};

template <typename T> struct cuk_elem;
template <> struct cuk_elem<float> {
    static constexpr int code = CUK_F32;
    __device__ __forceinline__ static float load(const void *p, int64_t i)
    {
        return ((const float *)p)[i];
    }
    __device__ __forceinline__ static void store(void *p, int64_t i, float x)
    {
        ((float *)p)[i] = x;
    }
};
template <> struct cuk_elem<cuk_f16_t> {
    static constexpr int code = CUK_F16;
    __device__ __forceinline__ static float load(const void *p, int64_t i)
    {
        return cuk_f16_to_f32(((const uint16_t *)p)[i]);
    }
    __device__ __forceinline__ static void store(void *p, int64_t i, float x)
    {
        ((uint16_t *)p)[i] = cuk_f32_to_f16(x);
    }
};
template <> struct cuk_elem<cuk_bf16_t> {
    static constexpr int code = CUK_BF16;
    __device__ __forceinline__ static float load(const void *p, int64_t i)
    {
        return cuk_bf16_to_f32(((const uint16_t *)p)[i]);
    }
    __device__ __forceinline__ static void store(void *p, int64_t i, float x)
    {
        ((uint16_t *)p)[i] = cuk_f32_to_bf16(x);
    }
};

/* Element i of a float tensor of run-time dtype dt. */
__device__ __forceinline__ float cuk_load(const void *p, int dt, int64_t i)
{
    if (dt == CUK_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == CUK_F16 ? cuk_f16_to_f32(h) : cuk_bf16_to_f32(h);
}

__device__ __forceinline__ void cuk_store(void *p, int dt, int64_t i, float x)
{
    if (dt == CUK_F32)
        ((float *)p)[i] = x;
    else if (dt == CUK_F16)
        ((uint16_t *)p)[i] = cuk_f32_to_f16(x);
    else
        ((uint16_t *)p)[i] = cuk_f32_to_bf16(x);
}

/* Optional parameter vector (NULL: `dflt`). */
__device__ __forceinline__ float cuk_param(const void *p, int dt, int64_t i, float dflt)
{
    return p ? cuk_load(p, dt, i) : dflt;
}

/* ---- reductions ------------------------------------------------------------------------ */

__device__ __forceinline__ float cuk_warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float cuk_warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Block-wide sum (every thread gets it); `red` holds 32 floats of shared
 * memory. Must be called by every thread of the block. */
__device__ __forceinline__ float cuk_block_sum(float x, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_warps = (blockDim.x + 31) >> 5;
    x = cuk_warp_sum(x);
    __syncthreads(); /* red may still be read by a previous reduction */
    if (lane == 0)
        red[warp] = x;
    __syncthreads();
    x = lane < n_warps ? red[lane] : 0.0f;
    return cuk_warp_sum(x);
}

__device__ __forceinline__ float cuk_block_max(float x, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n_warps = (blockDim.x + 31) >> 5;
    x = cuk_warp_max(x);
    __syncthreads();
    if (lane == 0)
        red[warp] = x;
    __syncthreads();
    x = lane < n_warps ? red[lane] : -INFINITY;
    return cuk_warp_max(x);
}

/* ---- programmatic dependent launch (sm_90 and later) ----------------------------------- */

/* A kernel launched with cuk_launch_pdl may start while the kernel before
 * it in the stream is still running, once every block of that kernel has
 * called cuk_pdl_trigger (or exited). It must call cuk_pdl_wait before it
 * touches memory an earlier kernel writes or reads: only its read-only
 * inputs (weights) may be touched before. The GEMVs use this to fetch their
 * first weight chunks while the kernel before them drains. Both are no-ops
 * without such a launch and before sm_90. */
__device__ __forceinline__ void cuk_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void cuk_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Whether launches use programmatic stream serialization: LLMEM_CUDA_PDL=1
 * and a device of compute capability 9.0 or later. Off by default: on the
 * H200 it made back-to-back GEMVs 4-8 points of copy faster, but not the
 * recorded Bamba-9B decode step (docs/benchmarks.md, helper cudaperf). */
static inline bool cuk_pdl_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LLMEM_CUDA_PDL");
        int dev = 0, major = 0;
        on = e && atoi(e) == 1 && cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                 cudaSuccess &&
             major >= 9;
    }
    return on == 1;
}

/* kern<<<grid, block, smem, stream>>>(args...), as a programmatic
 * dependent launch when pdl (kern must then follow the rule above). */
template <typename... KArgs, typename... Args>
static inline cudaError_t cuk_launch_dep(void (*kern)(KArgs...), dim3 grid, unsigned block,
                                         size_t smem, cudaStream_t stream, bool pdl,
                                         Args... args)
{
    if (!pdl) {
        kern<<<grid, block, smem, stream>>>(args...);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}

/* kern<<<grid, block, 0, stream>>>(args...), as a programmatic dependent
 * launch when cuk_pdl_enabled() (kern must then follow the rule above). */
template <typename... KArgs, typename... Args>
static inline cudaError_t cuk_launch_pdl(void (*kern)(KArgs...), unsigned grid, unsigned block,
                                         cudaStream_t stream, Args... args)
{
    if (!cuk_pdl_enabled()) {
        kern<<<grid, block, 0, stream>>>(args...);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
}

/* L2 prefetch of the 16-byte chunk at p (no register, no fault). */
__device__ __forceinline__ void cuk_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned cuk_grid(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    if (b > 65536 * 8)
        b = 65536 * 8;
    return (unsigned)b;
}

/* Widens one 16-byte load (uint4) of f32, bf16 or f16 elements to f32:
 * n elements (4 or 8) into f. Shared by the GEMV and decode-attention
 * kernels. */
template <typename T> struct cuk_unpack16;
template <> struct cuk_unpack16<float> {
    static constexpr int n = 4;
    __device__ __forceinline__ static void run(const uint4 &v, float *f)
    {
        f[0] = __uint_as_float(v.x);
        f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z);
        f[3] = __uint_as_float(v.w);
    }
};
template <> struct cuk_unpack16<cuk_bf16_t> {
    static constexpr int n = 8;
    __device__ __forceinline__ static void run(const uint4 &v, float *f)
    {
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};
template <> struct cuk_unpack16<cuk_f16_t> {
    static constexpr int n = 8;
    __device__ __forceinline__ static void run(const uint4 &v, float *f)
    {
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 x = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
            f[2 * i] = x.x;
            f[2 * i + 1] = x.y;
        }
    }
};

/* Where stream s of a recurrent view's op reads its initial state: the
 * snapshot scratch the host made (when one stream reads a slot another
 * writes), else its source slot; NULL (start from zeros) for a slot outside
 * [0, n_slots). base receives the element offset of the stream's state.
 * Shared by the Mamba-2, chunked SSD, Mamba-1 and gated delta net kernels. */
__device__ __forceinline__ const void *cuk_rs_source(const cuk_rs_args &rs, int64_t s, int64_t &base)
{
    if (rs.snap) {
        base = s * rs.elems;
        return rs.snap;
    }
    int32_t sl = rs.src[s];
    if (sl < 0 || sl >= rs.n_slots)
        return nullptr;
    base = (int64_t)sl * rs.elems;
    return rs.state;
}

/* The slot receiving stream s's snapshot inside the ubatch (cuk_rs_args
 * snap_tok / snap_slot), with its token in tok; -1 when the view has none,
 * the stream's entry is -1, or the entry is out of range (slot outside
 * [0, n_slots) or token outside [0, n_seq_tokens - 1): the host checked
 * the tables, the kernels still do not write outside the state). */
__device__ __forceinline__ int32_t cuk_rs_snap(const cuk_rs_args &rs, int64_t s, int32_t &tok)
{
    tok = -1;
    if (!rs.snap_slot)
        return -1;
    int32_t sl = rs.snap_slot[s], t = rs.snap_tok[s];
    if (sl < 0 || sl >= rs.n_slots || t < 0 || t >= rs.n_seq_tokens - 1)
        return -1;
    tok = t;
    return sl;
}

/* ---- per-device kernel attributes ------------------------------------------------------ */

/* Raises kern's dynamic shared-memory limit to smem bytes on the current
 * device, once per device: *sized is the caller's bit set for kern (bit
 * d for device d < 64; devices from 64 on are set at every call). Tensor
 * parallelism launches from one thread per device, so the set is read and
 * updated atomically; two threads that both find a bit clear both set the
 * attribute, which is harmless (the same value). Returns the CUDA error. */
template <typename K>
static inline cudaError_t cuk_smem_once(K *kern, int smem, unsigned long long *sized)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0ull;
    if (bit && (__atomic_load_n(sized, __ATOMIC_ACQUIRE) & bit))
        return cudaSuccess;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess && bit)
        __atomic_fetch_or(sized, bit, __ATOMIC_RELEASE);
    return e;
}

#endif

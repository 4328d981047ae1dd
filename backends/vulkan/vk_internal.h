/* llmem Vulkan backend: declarations shared by the plugin's files
 * (internal; docs/vulkan.md describes the design).
 *
 *   vk_plugin.c   device listing and selection, open/close
 *   vk_instance.c the Vulkan loader and the instances (kept on NVIDIA's driver)
 *   vk_alloc.c    sub-allocator over large device allocations
 *   vk_cmd.c      lazy command recording: barriers, staging, submit
 *   vk_op.c       dispatches: bindings, descriptors, pipelines
 *   vk_buffer.c   the buffer slots of llmem_backend_i
 *   vk_record.c   the record slots: recorded steps as reusable command buffers
 *   vk_cm2.c      cooperative-matrix extension queries (vk_cm2.h)
 *   vk_ops_*.c    the ops, one file per family (shaders in shaders/)
 */
#ifndef LLMEM_VK_INTERNAL_H
#define LLMEM_VK_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <volk.h>

#include "llmem/plugin.h" /* llmem calls go through the host table */
#include "vk_cm2.h"
#include "vk_knobs.h"
#include "vk_mm_pick.h"
#include "vk_spirv.h"
#include "vk_shader_ids.h"

#define VK_NM_PF_MAX 1024 /* weights whose successor vk_ops_norm_matmul.c remembers */
#define VK_PAIR_FIRST_MAX 256 /* weights vk_ops_matmul.c remembers as the first of a SwiGLU pair */
/* VK_MAX_BINDINGS, VK_MAX_SPEC, VK_MAX_PUSH: vk_spirv.h */
#define VK_ALIGN 256        /* alignment of every sub-allocation (bytes) */

/* ---- sub-allocator (vk_alloc.c) ---------------------------------------------------- */

typedef struct vk_range {
    VkDeviceSize offset, size;
} vk_range;

/* One device allocation with one VkBuffer over all of it. Sub-allocations
 * are carved from a free list kept sorted by offset (first fit, merged on
 * free). A request larger than half the block size gets its own block. */
typedef struct vk_block {
    VkDeviceMemory mem;
    VkBuffer buf;
    VkDeviceSize size;
    VkDeviceSize used;
    vk_range *free;
    uint32_t n_free, cap_free;
    uint32_t n_live; /* sub-allocations in use */
    bool dedicated;
    struct vk_block *next;
} vk_block;

typedef struct vk_alloc {
    vk_block *block;
    VkDeviceSize offset, size; /* size rounded up to VK_ALIGN */
} vk_alloc;

/* ---- staging (vk_cmd.c) -------------------------------------------------------------- */

/* Host-visible memory for uploads, downloads and small per-op tables; a
 * chunk is reused once the work that read it has completed. */
typedef struct vk_stage {
    VkDeviceMemory mem;
    VkBuffer buf;
    VkDeviceSize size, used;
    void *map;
    struct vk_stage *next;
} vk_stage;

typedef struct vk_stage_ref {
    VkBuffer buf;
    VkDeviceSize offset;
    void *ptr;
} vk_stage_ref;

/* A pending host copy out of a readback region, done after the submit. */
typedef struct vk_readback {
    const void *src;
    void *dst;
    size_t size;
} vk_readback;

/* ---- the backend ------------------------------------------------------------------------ */

typedef struct vk_access {
    VkBuffer buf;
    VkDeviceSize begin, end; /* bytes, widened to whole 32-bit words */
    bool write;
} vk_access;

typedef struct vk_pipeline {
    vk_shader_id shader;
    uint32_t n_spec;
    uint32_t spec[VK_MAX_SPEC];
    VkPipeline pipe;
} vk_pipeline;

typedef struct vk_prof vk_prof; /* vk_prof.c */
typedef struct vk_steptime vk_steptime; /* vk_steptime.c */

/* A recorded step (vk_record.c): a command buffer replayed as is. */
typedef struct vk_graph vk_graph;

/* The f16 terms of matmul_cm.comp's activations (cm_split.comp's layout:
 * hi [m, k] f16, lo [m, k] f16, then e [m] i32) written by the op that
 * made a decode-sized activation tensor (an RMS norm, the gated norm, the
 * SwiGLU of matmul_swiglu), so that the matmul that reads that tensor next
 * needs no cm_split.comp pass (vk_presplit.c). `valid` while the device
 * range [begin, end) of VkBuffer `vb`, the f32 [m, k] tensor the terms
 * are of, has not been written since; any tracked write overlapping it,
 * a replayed step, a recording's start or end and a submit clear it. */
/* A tensor's device range, kept until a tracked write overlaps it or it is
 * dropped (vk_presplit.c): what the presplit terms and the residual's copy
 * (vk_sum.c) were made from, whose contents hold only while it is
 * unwritten. */
typedef struct vk_kept_range {
    bool valid;
    VkBuffer vb;
    VkDeviceSize begin, end;
} vk_kept_range;

typedef struct vk_presplit {
    llmem_buffer *terms; /* backend-owned, VK_PRESPLIT_BYTES, made on first use */
    vk_kept_range src;   /* the tensor the terms are of */
    bool failed;         /* the terms buffer could not be made: never try again */
    uint32_t m, k;
    bool lo;             /* the terms held include lo (else hi alone: fast products only) */
    bool want_lo;        /* the last product that looked for terms read lo (precise) */
    size_t off;          /* where in the buffer the terms start (bytes; the folded
                          * SwiGLU's lie past the exponents it reads: vk_presplit_target) */
    uint32_t rows_max;   /* rows up to which producers write terms ($LLMEM_VULKAN_PRESPLIT_ROWS,
                          * default VK_PRESPLIT_ROWS_DEFAULT) */
    size_t bytes;        /* the terms buffer's size: VK_PRESPLIT_BYTES, or VK_PRESPLIT_BYTES_PF
                          * when rows_max exceeds VK_PRESPLIT_ROWS */
} vk_presplit;


typedef struct vk_backend {
    llmem_backend base;

    /* instance and device */
    VkInstance instance;
    bool instance_owned; /* destroyed with the backend, else kept for later opens (vk_instance.c) */
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem_props;
    VkDevice dev;
    struct VolkDeviceTable vk;
    VkQueue queue;
    uint32_t queue_family;
    int32_t device_index;
    char device_name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE + 64];
    bool has_budget;     /* VK_EXT_memory_budget */
    bool pstats;         /* VK_KHR_pipeline_executable_properties enabled for
                          * $LLMEM_VULKAN_PIPELINE_STATS (vk_pstats.c) */
    bool subgroup;       /* subgroup arithmetic in compute shaders is used */
    uint32_t subgroup_size;
    bool sg_shuffle;     /* subgroupShuffleXor in compute shaders (attention_prefill_cm.comp) */
    bool coopmat;        /* VK_NV_cooperative_matrix enabled for matmul_cm.comp (vk_plugin.c) */
    bool coopmat_khr;    /* VK_KHR_cooperative_matrix enabled too, for the KHR modules of
                          * matmul_cmp.comp and matmul_cm.comp */
    bool coopmat_bf16;   /* VK_KHR_shader_bfloat16 enabled too (bf16 types and matrices), for
                          * the bf16 modules of matmul_dec.comp and matmul_cm.comp
                          * (vk_khr_bf16_usable; $LLMEM_VULKAN_BF16=0 turns it off) */
    bool coopmat2;       /* VK_NV_cooperative_matrix2 enabled (with VK_KHR_cooperative_matrix
                          * and bufferDeviceAddress): workgroup-scope matrices, tensor loads and
                          * stores, decode functions; $LLMEM_VULKAN_CM2=0 turns it off (vk_cm2.c) */
    vk_cm2_caps cm2;     /* its properties (valid while coopmat2) */
    uint32_t sm_device;  /* compute units the device reports (vk_sm_query; 0: none), whatever
                          * $LLMEM_VULKAN_SM_COUNT says; the plans use mm.n_sm */
    const char *sm_source; /* the extension sm_device came from, or "none" (static string) */
    uint32_t max_groups; /* per grid dimension */
    uint32_t mem_type_device, mem_type_host;
    VkDeviceSize storage_align; /* minStorageBufferOffsetAlignment (>= 4) */
    VkDeviceSize max_range;     /* maxStorageBufferRange */
    VkDeviceSize max_alloc;     /* maxMemoryAllocationSize */
    VkDeviceSize block_size;
    VkDeviceSize chunk_max;     /* largest chunk of one buffer: a power of two (vk_alloc_limits) */
    VkDeviceSize spare_max;     /* largest emptied dedicated block kept for reuse ($LLMEM_VULKAN_SPARE_MAX) */
    bool transfer_copy;         /* $LLMEM_VULKAN_TRANSFER_COPY: vkCmdCopyBuffer/FillBuffer only */
    vk_mm_caps mm;              /* matmul path choices, read at open (vk_matmul_config; the
                                 * SM count and what follows it, vk_sm_config, also on
                                 * reload_env) */
    vk_knobs knobs;             /* per-op tuning variables, read at open (vk_knobs.h) */
    uint32_t mv16_rows;         /* activation rows per matvec16 pass */
    llmem_buffer *cm_ctr;       /* matmul_cm's arrival counters (VK_CM_RAW_FUSED), made on first
                                 * use; VK_CM_CTR_SLOTS words, zero between dispatches */
    uint32_t cm_ctr_next;       /* the next of them to take (vk_cm_ctr_take) */
    llmem_buffer *argmax_part;  /* argmax.comp's SPLIT counter and partial results (vk_argmax_split),
                                 * made on first use; the counter is zero between dispatches */
    vk_presplit presplit;       /* the f16 terms a norm wrote for the next matmul (vk_presplit.c) */
    struct {                    /* Mamba-2 scan path choices, read once (vk_scan_config) */
        bool old;               /* $LLMEM_VULKAN_SCAN_OLD: no ssm_scan_decode.comp */
        uint32_t rpi;           /* $LLMEM_VULKAN_SCAN_RPI: state rows per item */
        uint32_t ipg, wgs, wg;  /* $LLMEM_VULKAN_SCAN_{IPG,WGS,WG} (vk_ops_mamba.c); wgs 0:
                                 * unset, vk_scan_dec_wgs of mm.n_sm at each scan */
        bool norm_loop;         /* $LLMEM_VULKAN_NORM_LOOP: RMS norms without REG (vk_ops_basic.c) */
        bool pre;               /* ssm_scan_pre.comp for prefill ($LLMEM_VULKAN_SCAN_PRE != 0) */
        uint32_t pre_rpl, pre_t;  /* $LLMEM_VULKAN_SCAN_PRE_{RPL,T}, 0 when unset (by length) */
        uint32_t pre_wg;        /* $LLMEM_VULKAN_SCAN_PRE_WG, 0 when unset (by the grid) */
        bool pre_wide;          /* $LLMEM_VULKAN_SCAN_PRE_WIDE != 0: the wide layout where
                                 * the default's grid is under one workgroup an SM
                                 * (vk_ops_scan_pre.c) */
        vk_shader_id pre_shader; /* its variant ($LLMEM_VULKAN_SCAN_PRE_VAR) */
    } scan;
    /* A one-token Mamba-2 conv held back for the decode scan that reads its
     * output (vk_ops_mamba.c, vk_conv_fold_flush); NULL: the fold is off */
    struct vk_conv_fold *fold;
    bool fold_pending;          /* fold holds a conv not yet recorded */
    /* A one-row RMS-normed product held back for the decode conv that
     * reads its output (vk_ops_norm_matmul.c, vk_nm_conv_take); NULL until
     * the first one */
    struct vk_nm_hold *nmc;
    bool nmc_pending;           /* nmc holds a product not yet recorded */
    /* One-token ropes held back for the kv store that reads k
     * (vk_ops_rope.c, vk_rope_store_take); NULL until the first one */
    struct vk_rope_hold *rph;
    uint32_t rope_pending;      /* ropes held in rph, not yet recorded (0-2) */
    /* A decode-sized product's split-K sum held back for the op that reads
     * its output (vk_sum.c, vk_sum_flush); NULL until the first one */
    struct vk_sum_hold *sumh;
    bool sum_pending;           /* sumh holds a sum not yet recorded */
    /* The last matmul_cmp.comp product recorded: its rows, tiles and K
     * slices (vk_cmp_plan_pair, for the product that pairs with it) */
    struct vk_cmp_last {
        uint32_t m, slices;
        uint64_t tiles;
    } cmp_last;
    /* The SwiGLU's pair at 33-64 rows planned as one wave ($LLMEM_VULKAN_PAIR_PLAN,
     * vk_ops_matmul.c pair_plan): the weights of products a second one paired with
     * (vk_sum_park) before (entries naming a freed buffer are dropped, vk_pair_forget),
     * and the last tensor-core product recorded */
    struct vk_pair_w {
        const llmem_buffer *buf;
        size_t off;
        uint32_t n, k;
    } pair_first[VK_PAIR_FIRST_MAX];
    uint32_t pair_n;
    struct vk_pair_last {
        struct vk_pair_w w;
        uint32_t m;
        bool planned; /* planned as the first of a pair */
    } pair_last;
    struct vk_resid *resid;     /* the residual's copies (vk_sum.c); NULL until used */
    /* The order of the one-row fused matmuls (vk_ops_norm_matmul.c,
     * $LLMEM_VULKAN_L2_PREFETCH): the weight at (buf, off) was last followed
     * by `next`; entries naming a freed buffer are dropped (vk_nm_pf_forget) */
    struct vk_nm_pf {
        llmem_buffer *buf;
        size_t off;
        llmem_tensor next;
    } nm_pf[VK_NM_PF_MAX];
    uint32_t nm_pf_n;
    llmem_tensor nm_pf_prev; /* the last one's weight; buf NULL: none */
    VkDeviceSize bytes_device;  /* in device blocks */

    /* sub-allocator */
    vk_block *blocks;
    vk_alloc dummy; /* bound to unused descriptor slots */

    /* recording */
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    bool recording;
    uint32_t n_dispatch, n_transfer, n_barrier; /* in the current command buffer */
    uint64_t n_submits;
    /* ended command buffers of the next submit, in order, and the recorded
     * step of each (NULL: a lazy command buffer) */
    VkCommandBuffer *seg_cmd;
    vk_graph **seg_graph;
    uint32_t n_segs, cap_seg_cmd, cap_seg_graph;
    VkCommandBuffer *spare;  /* ended lazy command buffers, reset, for reuse */
    uint32_t n_spare, cap_spare;
    vk_graph *capture;       /* between record_begin and record_end */
    bool after_graph;        /* the next lazy command buffer starts with a barrier */
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipe_layout;
    VkPipelineCache pipe_cache;
    VkDescriptorPool *desc_pools;
    uint32_t n_desc_pools, cur_desc_pool;
    VkShaderModule modules[VK_SH_COUNT];
    /* a dispatch of the shader was refused for asking more arguments than
     * the layout takes: reported on stderr once (vk_op.c) */
    bool args_reported[VK_SH_COUNT];
    vk_pipeline *pipes;
    uint32_t n_pipes, cap_pipes;
    vk_access *acc; /* accesses since the last barrier */
    uint32_t n_acc, cap_acc;
    vk_stage *stages;
    VkDeviceSize stage_total;
    vk_readback *rb;
    uint32_t n_rb, cap_rb;

    llmem_status error; /* sticky: a device error makes every later call fail */

    /* diagnostics ($LLMEM_VULKAN_LOG, validation messenger, $LLMEM_VULKAN_PROFILE) */
    vk_prof *prof; /* NULL unless profiling */
    vk_steptime *steptime; /* NULL unless $LLMEM_VULKAN_STEP_TIMES=1 */
    FILE *log;
    uint32_t validation_errors;
    bool validation_fatal;
} vk_backend;

/* A buffer of at most v->chunk_max bytes is one sub-allocation (chunk 0,
 * `a`). A larger one is n_chunks sub-allocations of `chunk` bytes each (the
 * last one shorter): byte x of the buffer is byte x % chunk of chunk
 * x / chunk. Transfers are split at chunk boundaries; a shader binds one
 * chunk per tensor (vk_op_tensor), or all chunks of a pool
 * (vk_op_buffer_chunks). */
typedef struct vk_buffer {
    llmem_buffer base;
    vk_alloc a;         /* chunk 0 */
    vk_alloc *more;     /* chunks 1 .. n_chunks - 1 */
    uint32_t n_chunks;  /* >= 1 */
    VkDeviceSize chunk; /* bytes per chunk (a power of two when n_chunks > 1) */
} vk_buffer;

/* Chunk i of a buffer (i < n_chunks). */
static inline const vk_alloc *vk_chunk(const vk_buffer *b, uint32_t i)
{
    return i == 0 ? &b->a : &b->more[i - 1];
}

/* The part of [offset, offset + size) of a buffer that lies in one chunk:
 * the chunk's VkBuffer, the part's offset there and its length (> 0 when
 * size > 0). */
typedef struct vk_piece {
    VkBuffer buf;
    VkDeviceSize at, n;
} vk_piece;

static inline vk_piece vk_piece_at(const vk_buffer *b, VkDeviceSize offset, VkDeviceSize size)
{
    uint32_t i = (uint32_t)(offset / b->chunk);
    const vk_alloc *a = i == 0 ? &b->a : &b->more[i - 1];
    VkDeviceSize local = offset - (VkDeviceSize)i * b->chunk;
    VkDeviceSize n = b->chunk - local < size ? b->chunk - local : size;
    return (vk_piece){a->block ? a->block->buf : VK_NULL_HANDLE, a->offset + local, n};
}

/* Bytes of chunk i that the buffer uses. */
static inline VkDeviceSize vk_chunk_bytes(const vk_buffer *b, uint32_t i)
{
    VkDeviceSize begin = (VkDeviceSize)i * b->chunk, size = b->base.size;
    return size - begin < b->chunk ? size - begin : b->chunk;
}

extern const llmem_backend_i vk_iface;

static inline vk_backend *vk_from(llmem_backend *be)
{
    return LLMEM_BACKEND_CAST(vk_backend, be, &vk_iface);
}

static inline vk_buffer *vk_buf(llmem_buffer *b)
{
    return (vk_buffer *)(void *)b;
}

/* Maps a VkResult to a status (out-of-memory results to LLMEM_E_NO_MEMORY). */
llmem_status vk_status(VkResult r);
/* Appends a line to $LLMEM_VULKAN_LOG, when set. */
void vk_log(vk_backend *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- vk_instance.c ------------------------------------------------------------------------- */

/* Devices listed or opened at most. */
#define VK_MAX_DEVICES 16

/* Opens the loader (once a process) and creates or reuses the instance,
 * for backend v (which then also gets its validation messenger, when a
 * layer is active) or for a listing (v NULL). *out the instance, *owned
 * whether the caller destroys it (else it is kept for later opens with
 * the same settings: $LLMEM_VULKAN_KEEP_INSTANCE, by default on NVIDIA's
 * driver, which refuses the ~30th instance of a process). Safe from
 * several threads. Errors, with a one-line reason in why[len]:
 * LLMEM_E_NOT_FOUND (no loader, another loader than the process's, no
 * driver; in a fork() child of a process that kept an instance, the
 * reason says so), the vk_status of another vkCreateInstance failure. */
llmem_status vk_instance_open(vk_backend *v, VkInstance *out, bool *owned, char *why,
                              size_t len);
/* The Vulkan version instances ask for (VK_API_VERSION_1_3 where the
 * loader has it and $LLMEM_VULKAN_CM2 is not 0, else 1_2); the loader must
 * be open (vk_instance_open). */
uint32_t vk_instance_api(void);

/* ---- vk_alloc.c ---------------------------------------------------------------------------- */

/* Sets block_size and chunk_max from the device limits (maxMemoryAllocationSize,
 * maxStorageBufferRange, the heap size) and $LLMEM_VULKAN_MAX_CHUNK (bytes,
 * with an optional K/M/G suffix), which only lowers them (tests use it to
 * make small buffers span several chunks). */
void vk_alloc_limits(vk_backend *v);
llmem_status vk_alloc_make(vk_backend *v, VkDeviceSize size, vk_alloc *out);
/* Returns a sub-allocation; an emptied block is destroyed once no recorded
 * work can use it (vk_alloc_trim). */
void vk_alloc_release(vk_backend *v, vk_alloc *a);
/* Destroys empty blocks; with keep_spare, keeps one spare shared block and
 * one spare dedicated block of at most v->spare_max bytes. Only with no
 * work in flight or recorded. */
void vk_alloc_trim(vk_backend *v, bool keep_spare);
VkBuffer vk_alloc_buffer(const vk_alloc *a);

/* ---- vk_cmd.c ------------------------------------------------------------------------------- */

llmem_status vk_cmd_init(vk_backend *v);
/* Grows *arr (of elem bytes) to hold at least n + 1 entries; false when
 * out of host memory (the array is unchanged). */
bool vk_grow(void **arr, uint32_t *cap, uint32_t n, size_t elem);
void vk_cmd_finish(vk_backend *v);

/* GPU time per shader, $LLMEM_VULKAN_PROFILE=1 (vk_prof.c): init after the
 * device exists (does nothing unless the variable is set and the queue has
 * timestamps); begin when a command buffer begins; before/after around
 * each dispatch; collect after a submit's fence; finish prints the table to
 * stderr and frees. All are no-ops while v->prof is NULL. */
void vk_prof_init(vk_backend *v);
/* Reads the matmul path variables of docs/vulkan.md (LLMEM_VULKAN_MV16_MAX,
 * _MV16_ROWS, _MATVEC_OLD, _MATMUL_OLD, _CM_MIN, _CM_MAX) into v->mm, with
 * v->coopmat, once at open (vk_ops_matmul.c). */
void vk_matmul_config(vk_backend *v);
/* The compute units of v->phys (VK_NV_shader_sm_builtins, VK_AMD_shader_core_properties and
 * _properties2, VK_ARM_shader_core_builtins, where listed: only queried through
 * vkGetPhysicalDeviceProperties2, nothing enabled) into v->sm_device and v->sm_source
 * (vk_sm_count; 0 and "none" without them or without Vulkan 1.1). Needs v->props. Never
 * fails (vk_plugin.c). */
void vk_sm_query(vk_backend *v);
/* $LLMEM_VULKAN_PIPELINE_STATS (vk_pstats.c): whether it is set (not "0") and pd can give
 * pipeline statistics (Vulkan 1.1, VK_KHR_pipeline_executable_properties listed, the
 * pipelineExecutableInfo feature); *f is then the feature structure to chain into
 * VkDeviceCreateInfo (pNext NULL), and the extension is to be enabled. Where it is set
 * but pd cannot, *why says why (static string). Never fails. */
bool vk_pstats_query(VkPhysicalDevice pd, VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR *f,
                     const char **why);
/* After the device is made: says in the log (and, when refused, on stderr) whether the
 * statistics are on; nothing when the variable is unset. */
void vk_pstats_report_open(vk_backend *v, const char *why);
/* With v->pstats: one line per executable of pipe (the driver's statistics, name = value)
 * to stderr and the log, headed by the shader's name and its n_spec specialization
 * constants. Nothing otherwise; never fails. */
void vk_pstats_print(vk_backend *v, VkPipeline pipe, const char *name, const uint32_t *spec,
                     uint32_t n_spec);
/* What follows the SM count into v->mm: n_sm (vk_sm_pick of $LLMEM_VULKAN_SM_COUNT, read into
 * v->knobs, and v->sm_device; a set value outside 1..VK_SM_MAX is reported on stderr and in
 * the log and ignored), the defaults by SM of $LLMEM_VULKAN_CM_WAVE and _CM_NARROW's WAVE, and
 * matmul_cmp's layout and tail split ($LLMEM_VULKAN_CMP_CFG, _CMP_TAIL): by vk_matmul_config
 * and again on llmem_backend_reload_env, after v->knobs (vk_reload_env; vk_mm_config.c). */
void vk_sm_config(vk_backend *v);
void vk_scan_config(vk_backend *v);
/* llmem_backend_i.reload_env: reads v->knobs and what follows the SM count (vk_sm_config)
 * again (vk_knobs.c). */
void vk_reload_env(llmem_backend *be);
void vk_prof_begin(vk_backend *v);
void vk_prof_before(vk_backend *v, uint32_t shader);
void vk_prof_after(vk_backend *v);
void vk_prof_collect(vk_backend *v);
void vk_prof_finish(vk_backend *v);

/* Where a recorded step's wall time goes, $LLMEM_VULKAN_STEP_TIMES=1
 * (vk_steptime.c): init after vk_cmd_init (does nothing unless the
 * variable is set); vk_cmd_flush calls submit with the command buffers of
 * a submit (one_step: they are lazy, recorded step, lazy) and submits the
 * array it returns (the same one, or one with timestamps between them;
 * *n_cmds updated), submitted after vkQueueSubmit, waited after the fence
 * wait (ok: the wait succeeded); finish prints the means to stderr and
 * frees. All are no-ops while v->steptime is NULL. */
void vk_steptime_init(vk_backend *v);
const VkCommandBuffer *vk_steptime_submit(vk_backend *v, const VkCommandBuffer *cmds,
                                          uint32_t *n_cmds, bool one_step);
void vk_steptime_submitted(vk_backend *v);
void vk_steptime_waited(vk_backend *v, bool ok);
void vk_steptime_finish(vk_backend *v);

/* Whether the byte ranges of t and u share a buffer and overlap (NULL: no). */
bool vk_overlap(const llmem_tensor *t, const llmem_tensor *u);

/* Waits for v->fence (the last submit): polls vkGetFenceStatus for up to
 * $LLMEM_VULKAN_SPIN_US microseconds (default 20000 on a GPU, 0 on a CPU
 * device), then blocks in vkWaitForFences. Polling trades a host core for
 * the wake-up latency of a blocking wait at the end of each submit (~0.1
 * ms on the H200; CUDA's default spin-wait synchronization does the same).
 * The VkResult of the fence: VK_SUCCESS, or VK_ERROR_DEVICE_LOST and the
 * like from the driver. */
VkResult vk_fence_wait(vk_backend *v);
/* The monotonic clock (CLOCK_MONOTONIC) in milliseconds: vk_fence_wait's
 * polling, vk_steptime.c's host times. */
double vk_now_ms(void);

/* Makes sure a command buffer is recording. */
llmem_status vk_cmd_begin(vk_backend *v);
/* Declares the accesses of the next command; records a barrier first when
 * one of them conflicts with an access since the last barrier. */
llmem_status vk_cmd_track(vk_backend *v, const vk_access *acc, uint32_t n);
/* Submits what was recorded, waits, completes readbacks and releases the
 * epoch's staging and descriptors. */
llmem_status vk_cmd_flush(vk_backend *v);
/* Host-visible staging of `size` bytes, valid until the next flush (which
 * may happen inside this call when the staging budget is spent). */
llmem_status vk_stage_get(vk_backend *v, VkDeviceSize size, VkDeviceSize align, vk_stage_ref *out);
/* Queues a host copy from a readback staging region, done at the flush. */
llmem_status vk_readback_add(vk_backend *v, const void *src, void *dst, size_t size);
/* A full memory barrier (compute + transfer, both ways) in the current
 * command buffer; forgets the tracked accesses. */
void vk_cmd_barrier(vk_backend *v);
/* Appends a recorded step's command buffer to the next submit, after what
 * is recorded so far (which ends its command buffer); later work goes into
 * a fresh lazy command buffer that starts with a barrier. */
llmem_status vk_cmd_queue_graph(vk_backend *v, VkCommandBuffer cmd, vk_graph *g);
/* Destroys a list of staging chunks. */
void vk_stage_destroy(vk_backend *v, vk_stage *list);

/* ---- vk_record.c: the record slots of llmem_backend_i -------------------------------- */

llmem_status vk_record_begin(llmem_backend *be);
llmem_status vk_record_end(llmem_backend *be, void **graph);
llmem_status vk_graph_replay(llmem_backend *be, void *graph);
void vk_graph_free(llmem_backend *be, void *graph);
/* While a step is captured: keeps a released sub-allocation alive for the
 * recording's life (true), or marks the capture failed (false: release it). */
bool vk_capture_keep(vk_backend *v, const vk_alloc *a);
/* Marks the capture failed because of `what` (an upload, a wait);
 * returns LLMEM_E_UNSUPPORTED. */
llmem_status vk_capture_refuse(vk_backend *v, const char *what);
/* Called after the submit that ran g: it may be queued again. */
void vk_graph_done(vk_graph *g);

/* ---- vk_op.c: dispatches --------------------------------------------------------------------- */

/* A compute dispatch being put together: bindings in order, accesses,
 * push constants and specialization constants (constant 0 is the
 * workgroup size). */
typedef struct vk_op {
    vk_shader_id shader;
    uint32_t n_spec;
    uint32_t spec[VK_MAX_SPEC];
    uint32_t n_bind;
    VkDescriptorBufferInfo bind[VK_MAX_BINDINGS];
    uint32_t n_acc;
    vk_access acc[VK_MAX_BINDINGS];
    uint32_t n_push;
    uint32_t push[VK_MAX_PUSH / 4];
    /* what the op's code tried to add, counted past the limits: a dispatch
     * that asked for more is refused with the counts (vk_op_args_check) */
    vk_op_asked asked;
    /* a binding could not be made (refused at dispatch): a tensor larger
     * than maxStorageBufferRange (bad_range, its bytes), or a temporary for
     * a binding that crosses chunks, or too many chunks; or too many
     * arguments (asked) */
    bool bad;
    VkDeviceSize bad_range;
    /* Ranges that cross a chunk boundary, bound through a contiguous
     * temporary: copied in before the dispatch, and out after it when the
     * op writes them (vk_op.c). */
    uint32_t n_tmp;
    struct vk_op_tmp {
        vk_alloc tmp;
        const vk_buffer *b;
        VkDeviceSize lo, hi; /* bytes of b, whole words */
        bool write;
    } tmp[VK_MAX_BINDINGS];
} vk_op;

void vk_op_init(vk_op *op, vk_shader_id shader, uint32_t wg);
void vk_op_spec(vk_op *op, uint32_t value);
void vk_op_u32(vk_op *op, uint32_t value);
void vk_op_i32(vk_op *op, int32_t value);
void vk_op_f32(vk_op *op, float value);
/* Binds the tensor's bytes; returns its offset in elements from the start
 * of the binding. A NULL or empty tensor binds the dummy buffer. */
uint32_t vk_op_tensor(vk_backend *v, vk_op *op, const llmem_tensor *t, bool write);
/* Binds a whole llmem buffer (pools, state buffers, view index buffers);
 * one that spans several chunks marks the op bad (LLMEM_E_UNSUPPORTED). */
void vk_op_buffer(vk_backend *v, vk_op *op, llmem_buffer *buf, bool write);
/* Binds chunk i of a buffer (the dummy buffer past its last chunk). */
void vk_op_chunk(vk_backend *v, vk_op *op, llmem_buffer *buf, uint32_t i, bool write);
/* Binds the chunks of a buffer to n_slot consecutive bindings (dummies
 * past the last chunk); returns the chunk size in bytes (the buffer's size
 * when it is one chunk). More chunks than slots mark the op bad. */
VkDeviceSize vk_op_buffer_chunks(vk_backend *v, vk_op *op, llmem_buffer *buf, bool write,
                                 uint32_t n_slot);
/* Binds bytes [at, at + n) of a VkBuffer (at a multiple of `unit`, which
 * divides VK_ALIGN); returns `at`'s offset in units from the binding. */
uint32_t vk_op_raw(vk_backend *v, vk_op *op, VkBuffer buf, VkDeviceSize at, VkDeviceSize n,
                   VkDeviceSize unit, bool write);
/* Binds a device sub-allocation (scratch). */
void vk_op_alloc(vk_backend *v, vk_op *op, const vk_alloc *a, bool write);
/* Binds a staging region (small host-written tables). */
void vk_op_stage(vk_backend *v, vk_op *op, const vk_stage_ref *s, VkDeviceSize size);
void vk_op_dummy(vk_backend *v, vk_op *op);
/* Records the dispatch of n_groups workgroups (split over x and y). */
llmem_status vk_op_run(vk_backend *v, vk_op *op, uint64_t n_groups);

/* Workgroups for n items of `per` each. */
static inline uint64_t vk_div_up(uint64_t n, uint64_t per)
{
    return (n + per - 1) / per;
}

/* ---- vk_buffer.c --------------------------------------------------------------------------- */

llmem_status vk_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out);
void vk_buffer_free(llmem_backend *be, llmem_buffer *buf);
llmem_status vk_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset, const void *src,
                              size_t size);
llmem_status vk_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset, void *dst,
                                size_t size);
llmem_status vk_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                            llmem_buffer *src, size_t src_offset, size_t size);
llmem_status vk_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset, size_t size,
                            uint32_t pattern);
llmem_status vk_buffer_copy_ranges(llmem_backend *be, const llmem_copy_range *ranges, int32_t n);
llmem_status vk_synchronize(llmem_backend *be);

/* ---- ops (vk_ops_*.c) ----------------------------------------------------------------------- */

extern const struct llmem_ops_i vk_ops;

/* Byte offset of a view index table in words (tables are 4-aligned). */
static inline uint32_t vk_table_word(const llmem_i32_table *t)
{
    return (uint32_t)(t->offset / 4);
}

llmem_status vk_op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out);
llmem_status vk_op_matmul_fast(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out);
/* out [1, N] = a · wᵀ (u NULL) or silu(a · wᵀ) * (a · uᵀ) for one f32 row a
 * [1, K] and f16/bf16 w, u [N, K] through the fused decode matmul's shader
 * (vk_ops_norm_matmul.c, no norm); LLMEM_E_UNSUPPORTED, with nothing
 * recorded, where it does not apply or $LLMEM_VULKAN_GEMV_ROWS says 0. */
llmem_status vk_gemv_rows(vk_backend *v, llmem_ct *a, llmem_ct *w, llmem_ct *u, llmem_ct *out);
/* out = a · wᵀ (u NULL) or silu(a · wᵀ) * (a · uᵀ), a [M, K] f32, w and u
 * [N, K] f16/bf16, out [M, N] f32, through matvec16.comp (vk_ops_matvec16.c)
 * where vk_mm_pick takes that path (up to VK_MM_MV16_MAX rows, K % 8 == 0)
 * and the rows are 16-byte aligned; *done says whether it ran (false: the
 * caller's general path, nothing recorded). The backend's errors. */
llmem_status vk_matvec16(vk_backend *v, llmem_ct *a, llmem_ct *w, llmem_ct *u, llmem_ct *out,
                         bool *done);
llmem_status vk_op_matmul_swiglu(llmem_backend *be, llmem_ct *a, llmem_ct *gate, llmem_ct *up,
                                 llmem_ct *out);
llmem_status vk_op_get_rows(llmem_backend *be, llmem_ct *src, llmem_ct *idx, llmem_ct *out);
llmem_status vk_op_add(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out);
llmem_status vk_op_mul(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out);
llmem_status vk_op_scale(llmem_backend *be, llmem_ct *a, float s, llmem_ct *out);
llmem_status vk_op_silu(llmem_backend *be, llmem_ct *a, llmem_ct *out);
llmem_status vk_op_relu2(llmem_backend *be, llmem_ct *a, llmem_ct *out);
llmem_status vk_op_softplus(llmem_backend *be, llmem_ct *a, llmem_ct *out);
llmem_status vk_op_swiglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out);
llmem_status vk_op_geglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out);
llmem_status vk_op_softcap(llmem_backend *be, llmem_ct *a, float cap, llmem_ct *out);
llmem_status vk_op_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *w, float eps, llmem_ct *out);
llmem_status vk_op_add_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *r, llmem_ct *w, float eps,
                                llmem_ct *out);
llmem_status vk_op_rms_norm_gated(llmem_backend *be, llmem_ct *y, llmem_ct *z, llmem_ct *w,
                                  int32_t n_groups, float eps, llmem_ct *out);
llmem_status vk_op_rope(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x, llmem_ct *pos,
                        llmem_ct *out);
llmem_status vk_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                              const llmem_view *view);
llmem_status vk_op_kv_store(llmem_backend *be, const llmem_view *view, llmem_ct *k, llmem_ct *v);
/* int8 / fp8 pools (vk_ops_quant.c); called by the two ops above. The
 * plugin links no core library function: this is llmem_dtype_is_scaled. */
static inline bool vk_dtype_scaled(llmem_dtype t)
{
    return t == LLMEM_DTYPE_I8 || t == LLMEM_DTYPE_F8E4M3;
}
llmem_status vk_op_kv_store_q(llmem_backend *be, const llmem_view *view, llmem_ct *k, llmem_ct *v);
llmem_status vk_op_attention_q(llmem_backend *be, const llmem_attn_params *p,
                               const llmem_view *view, llmem_ct *q, llmem_ct *out);
/* The ssm_scan slot for an I8 state (vk_ops_quant.c), called by vk_op_ssm_scan. */
llmem_status vk_op_ssm_scan_q(llmem_backend *be, const llmem_ssm_params *p,
                              const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                              llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);
llmem_status vk_op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                   const llmem_view *view, llmem_ct *q, llmem_ct *out);
/* The prefill attention on cooperative matrices (vk_ops_attn_pf.c), called by
 * vk_op_attention_paged with its arguments (f16 / bf16 / f32 pools; q and out
 * [n_tok, n_heads, head_dim] f32): *taken is true where it recorded the call
 * (the status is then the call's: LLMEM_ERR_* of vk_op_run), false where the
 * shape, dtype, device or LLMEM_VULKAN_ATTN_PF leaves the call to the caller
 * (nothing recorded, LLMEM_OK). */
llmem_status vk_attn_pf(vk_backend *v, const llmem_attn_params *p, const llmem_view *view,
                        llmem_ct *q, llmem_ct *out, bool *taken);
/* The push words every paged attention shader (attention_decode.comp,
 * attention.comp, attention_prefill_cm.comp, attention_q.comp) reads in
 * this order after its own leading words: the page-table bound (none with
 * page rows: llmem_view_check_attention checked seq_len on the host, so a
 * recorded step, models/decode_graph.c, stays valid while sequences grow),
 * page_size, n_pages, the stream count, window, scale, softcap, the
 * query's and output's element offsets qo / oo (vk_op_tensor), then the
 * index-buffer words of page_table, seq_len, tok_kv_len and tok_seq
 * (vk_ops_attention.c). */
void vk_attn_push_kv(vk_op *op, const llmem_kv_view *kv, const llmem_attn_params *p, uint32_t qo,
                     uint32_t oo);
/* Binds a paged attention shader's first five bindings: q (0) and out (1, written) as
 * tensors, the view's index buffer (2) and the K and V pools (3, 4) whole (vk_op_buffer:
 * pools of several chunks through a copy); *qo, *oo get q's and out's element offsets for
 * vk_attn_push_kv (vk_ops_attention.c). */
void vk_attn_bind(vk_backend *v, vk_op *op, const llmem_view *view, llmem_ct *q,
                  llmem_ct *out, uint32_t *qo, uint32_t *oo);
llmem_status vk_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state, llmem_ct *x,
                            llmem_ct *w, llmem_ct *b, llmem_ct *out);
llmem_status vk_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p, const llmem_view *view,
                            int32_t state, llmem_ct *xbc, llmem_ct *dt, llmem_ct *a_log,
                            llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);
/* The decode conv folded into the decode scan (vk_ops_mamba.c). A
 * one-token vk_op_ssm_conv without checkpoints or snapshots is held back
 * in v->fold (not recorded); the next vk_op_ssm_scan that reads its output
 * on the decode path runs ssm_scan_decode.comp with the conv folded in
 * (one dispatch instead of two, the same memory effects). Anything else
 * recorded first records the conv alone: vk_conv_fold_flush, called by
 * vk_cmd_track, vk_cmd_flush, vk_cmd_queue_graph and vk_record_end, so
 * every command stays in the order the ops were called. Errors: those of
 * vk_op_run (the conv's). vk_conv_fold_config reads $LLMEM_VULKAN_CONV_FOLD
 * (1: on; off by default, slower on the H200) at open; vk_conv_fold_finish
 * records a held conv (vk_cmd_finish submits it) and frees the fold (at
 * close, before vk_cmd_finish). */
llmem_status vk_conv_fold_flush(vk_backend *v);
/* The decode conv in the epilogue of the product that makes its input
 * (vk_ops_norm_matmul.c; shaders/norm_matvec16_rows.comp's CONV). A
 * one-row llmem_op_norm_matmul with the RMS norm and a plain store (a
 * Mamba-2 in_proj) is held back in v->nmc (not recorded) unless
 * $LLMEM_VULKAN_NM_CONV=0; vk_nm_conv_take, called first by
 * vk_op_ssm_conv, runs it as norm_matvec16_conv with the conv folded in
 * (*taken true: one dispatch instead of two, the same memory effects)
 * where the conv is one token of one stream without checkpoints and reads
 * a slice of the held output, and else records the product alone
 * (vk_nm_conv_flush) for the caller to go on. Anything else recorded first
 * records it alone: vk_held_flush (this flush, then vk_conv_fold_flush),
 * called by vk_cmd_track, vk_cmd_flush, vk_cmd_queue_graph and
 * vk_record_end, so every command stays in the order the ops were called.
 * Errors: those of vk_op_run. vk_nm_conv_finish records a held product
 * and frees the hold (at close, before vk_cmd_finish). Measurements:
 * docs/benchmarks.md "Vulkan batch-1 step: the decode conv in in_proj". */
llmem_status vk_nm_conv_take(vk_backend *v, const llmem_view *view, int32_t state, llmem_ct *x,
                             llmem_ct *w, llmem_ct *b, llmem_ct *out, bool *taken);
llmem_status vk_nm_conv_flush(vk_backend *v);
llmem_status vk_held_flush(vk_backend *v);
/* Whether an op is held back (a conv for the decode scan, a one-row
 * product for its conv, ropes for the kv store, a product's split-K sum
 * for its reader): the test before every
 * vk_held_flush on the recording paths. A new kind of hold joins here. */
static inline bool vk_held_any(const vk_backend *v)
{
    return v->fold_pending || v->nmc_pending || v->rope_pending || v->sum_pending;
}
/* RoPE of q and k with the store of k and v in one dispatch (vk_ops_rope.c;
 * shaders/rope_store.comp). A one-token vk_op_rope in place on f32
 * [1, H, head_dim] (head_dim even, <= 512) is held back in v->rph (not
 * recorded) unless $LLMEM_VULKAN_ROPE_STORE=0; a second one with the same
 * angles and position joins it (q, then k). vk_rope_store_take, called
 * first by vk_op_kv_store, runs them and the store as one rope_store
 * dispatch (*taken true; the same memory effects, bit for bit) where k is
 * the last rope's tensor (or the tail of the one rope held, q and k in one
 * launch), v is [1, n_kv_heads, head_dim] f32 apart from them, and the
 * pools are f32/f16/bf16 of one chunk; else it records the ropes alone
 * (vk_rope_flush) for the caller to go on. Anything else recorded first
 * records them alone (vk_held_flush, which calls vk_rope_flush first), so
 * every command keeps the order of the calls. Errors: those of
 * vk_op_run. vk_rope_finish records held ropes and frees the hold (at
 * close, before vk_cmd_finish). Measurements: docs/benchmarks.md "Vulkan
 * batch-1 step: rope with the kv store, a split argmax". */
llmem_status vk_rope_store_take(vk_backend *v, const llmem_view *view, llmem_ct *k, llmem_ct *vv,
                                bool *taken);
llmem_status vk_rope_flush(vk_backend *v);
void vk_rope_finish(vk_backend *v);
/* argmax of one long row split over workgroups (vk_ops_sample.c;
 * shaders/argmax.comp's SPLIT): the workgroup count for a row of `cols`
 * f32 ($LLMEM_VULKAN_ARGMAX_SPLIT, default 64; 0 or 1: one workgroup),
 * or 0 where the row is short (< 16384 columns) or v->argmax_part (made
 * here on first use, zeroed) cannot be made. The last workgroup to arrive
 * reduces the parts, so the id is the single workgroup's, ties included. */
#define VK_ARGMAX_SPLIT_MAX 256
#define ARGMAX_SPLIT_WG 256 /* invocations per part unless $LLMEM_VULKAN_ARGMAX_WG is set */
uint32_t vk_argmax_split(llmem_backend *be, vk_backend *v, uint64_t cols);
void vk_nm_conv_finish(vk_backend *v);
/* Drops what vk_ops_norm_matmul.c remembers of `buf` (vk_buffer_free). */
void vk_nm_pf_forget(vk_backend *v, const llmem_buffer *buf);
/* Drops what the pair plans remember of buf (vk_sum.c vk_pair_learn; vk_buffer_free). */
void vk_pair_forget(vk_backend *v, const llmem_buffer *buf);
void vk_conv_fold_config(vk_backend *v);
void vk_conv_fold_finish(llmem_backend *be, vk_backend *v);
llmem_status vk_op_copy(llmem_backend *be, llmem_ct *src, int32_t col0, llmem_ct *dst);
llmem_status vk_op_log_softmax(llmem_backend *be, llmem_ct *x, llmem_ct *out);
llmem_status vk_op_argmax(llmem_backend *be, llmem_ct *x, llmem_ct *out);
llmem_status vk_op_sample(llmem_backend *be, const llmem_sample_params *p, llmem_ct *logits,
                          llmem_ct *ctr, llmem_ct *out);
llmem_status vk_op_logprob_gather(llmem_backend *be, llmem_ct *logits, llmem_ct *ids,
                                  llmem_ct *out);
llmem_status vk_op_top_logprobs(llmem_backend *be, llmem_ct *logits, int32_t n, llmem_ct *top_ids,
                                llmem_ct *top_lp);

#endif

/* llmem Vulkan backend: compute dispatches (vk_op): bindings of tensors,
 * buffers, chunks and staging, push and specialization constants,
 * temporaries for bindings that cross a buffer's chunks, pipelines and
 * descriptor sets; each dispatch declares its accesses to the hazard
 * tracker of vk_cmd.c and is recorded into the current command buffer.
 *
 * Descriptors. One set layout of VK_MAX_BINDINGS storage buffers and one
 * pipeline layout with 128 bytes of push constants (vk_cmd_init) serve
 * every shader. Sets come from descriptor pools that are reset after each
 * submit (a recorded step keeps pools of its own, vk_record.c).
 *
 * Pipelines are created on first use per (shader, specialization
 * constants) and cached for the backend's life (plus a VkPipelineCache).
 */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

#define DESC_POOL_SETS 256

/* ---- dispatches ------------------------------------------------------------------------------------ */

void vk_op_init(vk_op *op, vk_shader_id shader, uint32_t wg)
{
    memset(op, 0, sizeof *op);
    op->shader = shader;
    op->spec[op->n_spec++] = wg;
    op->asked.n_spec = 1;
}

void vk_op_spec(vk_op *op, uint32_t value)
{
    op->asked.n_spec++;
    if (op->n_spec < VK_MAX_SPEC)
        op->spec[op->n_spec++] = value;
    else
        op->bad = true;
}

void vk_op_u32(vk_op *op, uint32_t value)
{
    op->asked.push_bytes += 4;
    if (op->n_push < VK_MAX_PUSH / 4)
        op->push[op->n_push++] = value;
    else
        op->bad = true;
}

void vk_op_i32(vk_op *op, int32_t value)
{
    vk_op_u32(op, (uint32_t)value);
}

void vk_op_f32(vk_op *op, float value)
{
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    vk_op_u32(op, u);
}

static void op_bind(vk_backend *v, vk_op *op, VkBuffer buf, VkDeviceSize offset, VkDeviceSize range)
{
    op->asked.n_bind++;
    if (range > v->max_range && range > op->bad_range)
        op->bad_range = range;
    if (op->n_bind >= VK_MAX_BINDINGS || range > v->max_range) {
        op->bad = true;
        return;
    }
    op->bind[op->n_bind++] = (VkDescriptorBufferInfo){buf, offset, range};
}

static void op_access(vk_op *op, VkBuffer buf, VkDeviceSize begin, VkDeviceSize end, bool write)
{
    if (op->n_acc < VK_MAX_BINDINGS)
        op->acc[op->n_acc++] = (vk_access){buf, begin / 4 * 4, (end + 3) / 4 * 4, write};
}

void vk_op_dummy(vk_backend *v, vk_op *op)
{
    op_bind(v, op, vk_alloc_buffer(&v->dummy), v->dummy.offset, v->dummy.size);
}

/* Copies bytes [lo, hi) of b into tmp (in) or back (out), one region per
 * chunk piece. */
static llmem_status tmp_copy(vk_backend *v, const struct vk_op_tmp *t, bool out)
{
    VkBuffer tb = vk_alloc_buffer(&t->tmp);
    for (VkDeviceSize x = t->lo; x < t->hi;) {
        vk_piece p = vk_piece_at(t->b, x, t->hi - x);
        VkDeviceSize at = t->tmp.offset + (x - t->lo);
        vk_access a[2] = {{p.buf, p.at, p.at + p.n, out}, {tb, at, at + p.n, !out}};
        llmem_status st = vk_cmd_track(v, a, 2);
        if (st != LLMEM_OK)
            return st;
        VkBufferCopy r = out ? (VkBufferCopy){at, p.at, p.n} : (VkBufferCopy){p.at, at, p.n};
        v->vk.vkCmdCopyBuffer(v->cmd, out ? tb : p.buf, out ? p.buf : tb, 1, &r);
        v->n_transfer++;
        x += p.n;
    }
    return LLMEM_OK;
}

/* Binds bytes [start, end) of a buffer of several chunks that they cross
 * through a contiguous temporary (bytes [start & ~3, end rounded up to 4)
 * are copied, so 16-bit halves keep their word positions); returns the
 * binding's offset of `start` in bytes. Rare by construction: pools and
 * weights are placed so that bindings stay inside a chunk
 * (docs/vulkan.md); it keeps any other binding correct. */
static VkDeviceSize op_bind_tmp(vk_backend *v, vk_op *op, const vk_buffer *b, VkDeviceSize start,
                                VkDeviceSize end, bool write)
{
    if (op->n_tmp >= VK_MAX_BINDINGS) {
        op->bad = true;
        return 0;
    }
    struct vk_op_tmp *t = &op->tmp[op->n_tmp];
    t->b = b;
    t->lo = start / 4 * 4;
    t->hi = (end + 3) / 4 * 4;
    t->write = write;
    if (t->hi - t->lo > v->max_range || vk_alloc_make(v, t->hi - t->lo, &t->tmp) != LLMEM_OK) {
        op->bad = true;
        return 0;
    }
    op->n_tmp++;
    if (tmp_copy(v, t, false) != LLMEM_OK) {
        op->bad = true;
        return 0;
    }
    VkBuffer tb = vk_alloc_buffer(&t->tmp);
    op_bind(v, op, tb, t->tmp.offset, t->hi - t->lo);
    op_access(op, tb, t->tmp.offset, t->tmp.offset + (t->hi - t->lo), write);
    return start - t->lo;
}

uint32_t vk_op_tensor(vk_backend *v, vk_op *op, const llmem_tensor *t, bool write)
{
    size_t bytes = t ? llmem_tensor_nbytes(t) : 0;
    if (bytes == 0) {
        vk_op_dummy(v, op);
        return 0;
    }
    vk_buffer *b = vk_buf(t->buf);
    uint32_t ci = (uint32_t)(t->offset / b->chunk);
    VkDeviceSize local = t->offset - (VkDeviceSize)ci * b->chunk;
    if (local + bytes > b->chunk) {
        VkDeviceSize at = op_bind_tmp(v, op, b, t->offset, t->offset + bytes, write);
        return (uint32_t)(at / llmem_dtype_size(t->dtype));
    }
    const vk_alloc *a = vk_chunk(b, ci);
    VkDeviceSize start = a->offset + local, end = start + bytes;
    VkDeviceSize bstart = start / v->storage_align * v->storage_align;
    VkDeviceSize range = (end - bstart + 3) / 4 * 4;
    VkBuffer buf = vk_alloc_buffer(a);
    op_bind(v, op, buf, bstart, range);
    op_access(op, buf, start, end, write);
    return (uint32_t)((start - bstart) / llmem_dtype_size(t->dtype));
}

void vk_op_buffer(vk_backend *v, vk_op *op, llmem_buffer *buf, bool write)
{
    vk_buffer *b = vk_buf(buf);
    if (b->n_chunks > 1) {
        vk_log(v, "%s: a buffer of %zu bytes spans %u chunks: bound through a copy",
               vk_shader_codes[op->shader].name, buf->size, b->n_chunks);
        op_bind_tmp(v, op, b, 0, buf->size, write);
        return;
    }
    VkBuffer vb = vk_alloc_buffer(&b->a);
    op_bind(v, op, vb, b->a.offset, (buf->size + 3) / 4 * 4);
    op_access(op, vb, b->a.offset, b->a.offset + buf->size, write);
}

void vk_op_chunk(vk_backend *v, vk_op *op, llmem_buffer *buf, uint32_t i, bool write)
{
    vk_buffer *b = vk_buf(buf);
    if (i >= b->n_chunks) {
        vk_op_dummy(v, op);
        return;
    }
    const vk_alloc *a = vk_chunk(b, i);
    VkDeviceSize n = vk_chunk_bytes(b, i);
    VkBuffer vb = vk_alloc_buffer(a);
    op_bind(v, op, vb, a->offset, (n + 3) / 4 * 4);
    op_access(op, vb, a->offset, a->offset + n, write);
}

VkDeviceSize vk_op_buffer_chunks(vk_backend *v, vk_op *op, llmem_buffer *buf, bool write,
                                 uint32_t n_slot)
{
    vk_buffer *b = vk_buf(buf);
    if (b->n_chunks > n_slot) {
        vk_log(v, "%s: a buffer of %zu bytes spans %u chunks, more than %u",
               vk_shader_codes[op->shader].name, buf->size, b->n_chunks, n_slot);
        op->bad = true;
    }
    for (uint32_t i = 0; i < n_slot; i++) {
        if (i >= b->n_chunks) {
            vk_op_dummy(v, op);
            continue;
        }
        const vk_alloc *a = vk_chunk(b, i);
        VkDeviceSize n = vk_chunk_bytes(b, i);
        VkBuffer vb = vk_alloc_buffer(a);
        op_bind(v, op, vb, a->offset, (n + 3) / 4 * 4);
        op_access(op, vb, a->offset, a->offset + n, write);
    }
    return b->n_chunks > 1 ? b->chunk : buf->size;
}

uint32_t vk_op_raw(vk_backend *v, vk_op *op, VkBuffer buf, VkDeviceSize at, VkDeviceSize n,
                   VkDeviceSize unit, bool write)
{
    VkDeviceSize b0 = at / v->storage_align * v->storage_align;
    op_bind(v, op, buf, b0, (at + n - b0 + 3) / 4 * 4);
    op_access(op, buf, at, at + n, write);
    return (uint32_t)((at - b0) / unit);
}

void vk_op_alloc(vk_backend *v, vk_op *op, const vk_alloc *a, bool write)
{
    VkBuffer vb = vk_alloc_buffer(a);
    op_bind(v, op, vb, a->offset, a->size);
    op_access(op, vb, a->offset, a->offset + a->size, write);
}

void vk_op_stage(vk_backend *v, vk_op *op, const vk_stage_ref *s, VkDeviceSize size)
{
    /* Host-written before the submit: no device hazard to track. */
    op_bind(v, op, s->buf, s->offset, (size + 3) / 4 * 4);
}

/* Refuses a dispatch whose arguments overflow the layout (vk_op_args_check):
 * llmem's bug, the same on every device, so loud: on stderr (once per
 * shader) as well as in $LLMEM_VULKAN_LOG. */
static llmem_status args_refuse(vk_backend *v, const vk_op *op, const char *why)
{
    if (!v->args_reported[op->shader]) {
        v->args_reported[op->shader] = true;
        fprintf(stderr, "vulkan: %s\n", why);
    }
    vk_log(v, "%s", why);
    return LLMEM_E_INVALID;
}

static llmem_status pipeline_get(vk_backend *v, const vk_op *op, VkPipeline *out)
{
    for (uint32_t i = 0; i < v->n_pipes; i++) {
        const vk_pipeline *p = &v->pipes[i];
        if (p->shader == op->shader && p->n_spec == op->n_spec &&
            memcmp(p->spec, op->spec, op->n_spec * sizeof op->spec[0]) == 0) {
            *out = p->pipe;
            return LLMEM_OK;
        }
    }
    VkResult r;
    if (!v->modules[op->shader]) {
        const vk_shader_code *c = &vk_shader_codes[op->shader];
        VkShaderModuleCreateInfo mi = {
            .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            .codeSize = c->size,
            .pCode = c->code,
        };
        if ((r = v->vk.vkCreateShaderModule(v->dev, &mi, NULL, &v->modules[op->shader])) !=
            VK_SUCCESS)
            return vk_status(r);
    }
    if (!vk_grow((void **)&v->pipes, &v->cap_pipes, v->n_pipes, sizeof *v->pipes))
        return LLMEM_E_NO_MEMORY;
    /* what the module declares, checked before the driver sees it: a
     * specialization constant id or a push-constant block beyond the
     * layout is llmem's bug, on any device (vk_spirv.c) */
    vk_spirv_info info;
    char why[256];
    const vk_shader_code *sc = &vk_shader_codes[op->shader];
    if (!vk_spirv_inspect(sc->code, sc->size, &info, why, sizeof why)) {
        vk_log(v, "pipeline %s: %s", sc->name, why);
    } else if (vk_op_args_check(sc->name, &info, &op->asked, why, sizeof why) != LLMEM_OK) {
        return args_refuse(v, op, why);
    }
    VkSpecializationMapEntry map[VK_MAX_SPEC];
    for (uint32_t i = 0; i < op->n_spec; i++)
        map[i] = (VkSpecializationMapEntry){i, i * 4, 4};
    VkSpecializationInfo si = {
        .mapEntryCount = op->n_spec,
        .pMapEntries = map,
        .dataSize = op->n_spec * 4,
        .pData = op->spec,
    };
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage =
            {
                .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = v->modules[op->shader],
                .pName = "main",
                .pSpecializationInfo = &si,
            },
        .layout = v->pipe_layout,
    };
    if (v->pstats)
        ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    vk_pipeline *p = &v->pipes[v->n_pipes];
    r = v->vk.vkCreateComputePipelines(v->dev, v->pipe_cache, 1, &ci, NULL, &p->pipe);
    if (r != VK_SUCCESS) {
        vk_log(v, "pipeline %s: vkCreateComputePipelines failed (VkResult %d)",
               vk_shader_codes[op->shader].name, (int)r);
        return vk_status(r);
    }
    p->shader = op->shader;
    p->n_spec = op->n_spec;
    memcpy(p->spec, op->spec, sizeof p->spec);
    v->n_pipes++;
    vk_log(v, "pipeline %s created (%u specialization constants)",
           vk_shader_codes[op->shader].name, op->n_spec);
    vk_pstats_print(v, p->pipe, vk_shader_codes[op->shader].name, op->spec, op->n_spec);
    *out = p->pipe;
    return LLMEM_OK;
}

static llmem_status desc_alloc(vk_backend *v, VkDescriptorSet *out)
{
    for (;;) {
        bool fresh = false;
        if (v->cur_desc_pool == v->n_desc_pools) {
            VkDescriptorPool *pools =
                realloc(v->desc_pools, (v->n_desc_pools + 1) * sizeof *pools);
            if (!pools)
                return LLMEM_E_NO_MEMORY;
            v->desc_pools = pools;
            VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       DESC_POOL_SETS * VK_MAX_BINDINGS};
            VkDescriptorPoolCreateInfo ci = {
                .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                .maxSets = DESC_POOL_SETS,
                .poolSizeCount = 1,
                .pPoolSizes = &ps,
            };
            VkResult r = v->vk.vkCreateDescriptorPool(v->dev, &ci, NULL,
                                                      &v->desc_pools[v->n_desc_pools]);
            if (r != VK_SUCCESS)
                return vk_status(r);
            v->n_desc_pools++;
            fresh = true;
        }
        VkDescriptorSetAllocateInfo ai = {
            .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
            .descriptorPool = v->desc_pools[v->cur_desc_pool],
            .descriptorSetCount = 1,
            .pSetLayouts = &v->set_layout,
        };
        VkResult r = v->vk.vkAllocateDescriptorSets(v->dev, &ai, out);
        if (r == VK_SUCCESS)
            return LLMEM_OK;
        /* A full pool moves on to the next; a fresh one failing is an error. */
        if (fresh || (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL))
            return vk_status(r);
        v->cur_desc_pool++;
    }
}

/* Copies written temporaries back, then returns every temporary (safe
 * with recorded work still using it: a later user of the range conflicts
 * with these accesses and gets a barrier). */
static llmem_status op_tmp_finish(vk_backend *v, vk_op *op, bool ran)
{
    llmem_status st = LLMEM_OK;
    for (uint32_t i = 0; i < op->n_tmp; i++) {
        if (ran && op->tmp[i].write && st == LLMEM_OK)
            st = tmp_copy(v, &op->tmp[i], true);
        vk_alloc_release(v, &op->tmp[i].tmp);
    }
    op->n_tmp = 0;
    return st;
}

static llmem_status op_dispatch(vk_backend *v, vk_op *op, uint64_t n_groups)
{
    if (v->error != LLMEM_OK)
        return v->error;
    const char *name = vk_shader_codes[op->shader].name;
    char why[256];
    if (vk_op_args_check(name, NULL, &op->asked, why, sizeof why) != LLMEM_OK)
        return args_refuse(v, op, why);
    if (op->bad) {
        if (op->bad_range)
            vk_log(v, "shader %s: a binding of %llu bytes exceeds this device's "
                      "maxStorageBufferRange (%llu bytes)",
                   name, (unsigned long long)op->bad_range, (unsigned long long)v->max_range);
        else
            vk_log(v, "shader %s: a binding could not be made (a temporary for a tensor that "
                      "crosses chunks, or a buffer of more chunks than the shader takes)",
                   name);
        return LLMEM_E_UNSUPPORTED;
    }
    if (n_groups == 0)
        return LLMEM_OK;
    /* a grid over x and y past max_groups launches up to gx - 1 workgroups
     * more than asked: every shader takes one flat id (common.glsl
     * group_id) and returns past its own count (docs/vulkan.md) */
    uint64_t gx = n_groups < v->max_groups ? n_groups : v->max_groups;
    uint64_t gy = vk_div_up(n_groups, gx);
    if (gy > v->max_groups)
        return LLMEM_E_UNSUPPORTED;
    VkPipeline pipe = VK_NULL_HANDLE;
    llmem_status st = pipeline_get(v, op, &pipe);
    if (st != LLMEM_OK)
        return st;
    if ((st = vk_cmd_track(v, op->acc, op->n_acc)) != LLMEM_OK)
        return st;
    VkDescriptorSet set;
    if ((st = desc_alloc(v, &set)) != LLMEM_OK)
        return st;
    while (op->n_bind < VK_MAX_BINDINGS)
        vk_op_dummy(v, op);
    VkWriteDescriptorSet w = {
        .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
        .dstSet = set,
        .dstBinding = 0,
        .descriptorCount = VK_MAX_BINDINGS,
        .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        .pBufferInfo = op->bind,
    };
    v->vk.vkUpdateDescriptorSets(v->dev, 1, &w, 0, NULL);
    v->vk.vkCmdBindPipeline(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    v->vk.vkCmdBindDescriptorSets(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, v->pipe_layout, 0, 1, &set,
                                  0, NULL);
    if (op->n_push)
        v->vk.vkCmdPushConstants(v->cmd, v->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                 op->n_push * 4, op->push);
    vk_prof_before(v, (uint32_t)op->shader);
    v->vk.vkCmdDispatch(v->cmd, (uint32_t)gx, (uint32_t)gy, 1);
    vk_prof_after(v);
    v->n_dispatch++;
    return LLMEM_OK;
}

llmem_status vk_op_run(vk_backend *v, vk_op *op, uint64_t n_groups)
{
    llmem_status st = op_dispatch(v, op, n_groups);
    llmem_status st2 = op_tmp_finish(v, op, st == LLMEM_OK);
    return st != LLMEM_OK ? st : st2;
}

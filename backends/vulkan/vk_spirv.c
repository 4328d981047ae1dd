/* llmem Vulkan backend: a SPIR-V module's specialization constants and
 * push-constant block, and the check of a dispatch's arguments against
 * them and the pipeline layout (vk_spirv.h). Reference: the SPIR-V
 * specification 1.6 (Khronos), sections 2.3 (physical layout), 3.20
 * (decorations), 3.7 (storage classes) and the type instructions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_spirv.h"

enum {
    SPV_MAGIC = 0x07230203u,
    OP_TYPE_INT = 21,
    OP_TYPE_FLOAT = 22,
    OP_TYPE_VECTOR = 23,
    OP_TYPE_MATRIX = 24,
    OP_TYPE_ARRAY = 28,
    OP_TYPE_STRUCT = 30,
    OP_TYPE_POINTER = 32,
    OP_CONSTANT = 43,
    OP_VARIABLE = 59,
    OP_DECORATE = 71,
    OP_MEMBER_DECORATE = 72,
    DEC_SPEC_ID = 1,
    DEC_ARRAY_STRIDE = 6,
    DEC_OFFSET = 35,
    SC_PUSH_CONSTANT = 9,
    SC_PHYSICAL_STORAGE_BUFFER = 5349,
    MAX_DEPTH = 8, /* nesting of push-constant types followed */
};

typedef struct module {
    const uint32_t *w;
    size_t n;       /* words */
    uint32_t bound; /* ids are < bound */
    uint32_t *def;  /* [bound] word index of the instruction defining each id (0: none) */
} module;

/* The byte size of type `id` laid out in a block; false when it cannot
 * be told (why set). */
static bool type_size(const module *m, uint32_t id, int depth, uint64_t *out, char *why,
                      size_t why_len)
{
    if (id >= m->bound || !m->def[id] || depth > MAX_DEPTH) {
        snprintf(why, why_len, "push constants: type %%%u is not defined or nested too deep", id);
        return false;
    }
    const uint32_t *ins = m->w + m->def[id];
    uint32_t op = ins[0] & 0xffffu, len = ins[0] >> 16;
    uint64_t elem = 0;
    switch (op) {
    case OP_TYPE_INT:
    case OP_TYPE_FLOAT:
        *out = ins[2] / 8u;
        return true;
    case OP_TYPE_VECTOR:
    case OP_TYPE_MATRIX:
        if (!type_size(m, ins[2], depth + 1, &elem, why, why_len))
            return false;
        *out = elem * ins[3];
        return true;
    case OP_TYPE_POINTER:
        if (ins[2] == SC_PHYSICAL_STORAGE_BUFFER) {
            *out = 8;
            return true;
        }
        break;
    case OP_TYPE_ARRAY: {
        uint32_t c = ins[3];
        const uint32_t *k = c < m->bound && m->def[c] ? m->w + m->def[c] : NULL;
        if (!k || (k[0] & 0xffffu) != OP_CONSTANT || (k[0] >> 16) < 4) {
            snprintf(why, why_len, "push constants: array %%%u has no constant length", id);
            return false;
        }
        uint64_t stride = 0;
        for (size_t i = 5; i < m->n;) { /* its ArrayStride decoration, if any */
            uint32_t l = m->w[i] >> 16;
            if ((m->w[i] & 0xffffu) == OP_DECORATE && l >= 4 && m->w[i + 1] == id &&
                m->w[i + 2] == DEC_ARRAY_STRIDE)
                stride = m->w[i + 3];
            i += l;
        }
        if (!type_size(m, ins[2], depth + 1, &elem, why, why_len))
            return false;
        *out = (stride ? stride : elem) * k[3];
        return true;
    }
    case OP_TYPE_STRUCT: {
        uint64_t end = 0;
        for (uint32_t mi = 0; mi + 2 < len; mi++) {
            uint64_t off = 0, sz = 0;
            for (size_t i = 5; i < m->n;) {
                uint32_t l = m->w[i] >> 16;
                if ((m->w[i] & 0xffffu) == OP_MEMBER_DECORATE && l >= 5 && m->w[i + 1] == id &&
                    m->w[i + 2] == mi && m->w[i + 3] == DEC_OFFSET)
                    off = m->w[i + 4];
                i += l;
            }
            if (!type_size(m, ins[2 + mi], depth + 1, &sz, why, why_len))
                return false;
            end = off + sz > end ? off + sz : end;
        }
        *out = end;
        return true;
    }
    default:
        break;
    }
    snprintf(why, why_len, "push constants: type %%%u (opcode %u) cannot be sized", id, op);
    return false;
}

bool vk_spirv_inspect(const uint32_t *code, size_t size, vk_spirv_info *info, char *why,
                      size_t why_len)
{
    memset(info, 0, sizeof *info);
    if (!code || size % 4 != 0 || size < 20 || code[0] != SPV_MAGIC) {
        snprintf(why, why_len, "not a SPIR-V module (%zu bytes)", size);
        return false;
    }
    module m = {.w = code, .n = size / 4, .bound = code[3]};
    if (m.bound == 0 || m.bound > (1u << 22)) {
        snprintf(why, why_len, "SPIR-V id bound %u out of range", m.bound);
        return false;
    }
    m.def = calloc(m.bound, sizeof *m.def);
    if (!m.def) {
        snprintf(why, why_len, "out of host memory");
        return false;
    }
    bool ok = true;
    uint32_t push_type = 0; /* the pointee of the PushConstant variable's pointer type */
    for (size_t i = 5; i < m.n;) {
        uint32_t op = m.w[i] & 0xffffu, len = m.w[i] >> 16;
        if (len == 0 || i + len > m.n) {
            snprintf(why, why_len, "SPIR-V instruction at word %zu runs past the module", i);
            ok = false;
            goto out;
        }
        if ((op == OP_TYPE_INT || op == OP_TYPE_FLOAT || op == OP_TYPE_VECTOR ||
             op == OP_TYPE_MATRIX || op == OP_TYPE_ARRAY || op == OP_TYPE_STRUCT ||
             op == OP_TYPE_POINTER) &&
            len >= 2 && m.w[i + 1] < m.bound)
            m.def[m.w[i + 1]] = (uint32_t)i;
        if (op == OP_CONSTANT && len >= 4 && m.w[i + 2] < m.bound)
            m.def[m.w[i + 2]] = (uint32_t)i;
        if (op == OP_DECORATE && len >= 4 && m.w[i + 2] == DEC_SPEC_ID &&
            (int64_t)m.w[i + 3] + 1 > info->n_spec)
            info->n_spec = m.w[i + 3] >= INT32_MAX ? INT32_MAX : (int32_t)m.w[i + 3] + 1;
        if (op == OP_VARIABLE && len >= 4 && m.w[i + 3] == SC_PUSH_CONSTANT) {
            uint32_t pt = m.w[i + 1];
            const uint32_t *p = pt < m.bound && m.def[pt] ? m.w + m.def[pt] : NULL;
            if (!p || (p[0] & 0xffffu) != OP_TYPE_POINTER) {
                snprintf(why, why_len, "push-constant variable of an undefined pointer type %%%u",
                         pt);
                ok = false;
                goto out;
            }
            push_type = p[3];
        }
        i += len;
    }
    if (push_type) {
        uint64_t bytes = 0;
        if (!(ok = type_size(&m, push_type, 0, &bytes, why, why_len)))
            goto out;
        info->push_bytes = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
    }
out:
    free(m.def);
    return ok;
}

llmem_status vk_op_args_check(const char *name, const vk_spirv_info *info,
                              const vk_op_asked *asked, char *why, size_t why_len)
{
    const char *bug = "a bug of llmem's vulkan backend, not a device limit";
    if (asked->n_spec > VK_MAX_SPEC) {
        snprintf(why, why_len,
                 "shader %s: the op asks for %u specialization constants, a pipeline takes at "
                 "most %d (VK_MAX_SPEC): %s",
                 name, asked->n_spec, VK_MAX_SPEC, bug);
        return LLMEM_E_INVALID;
    }
    if (asked->push_bytes > VK_MAX_PUSH) {
        snprintf(why, why_len,
                 "shader %s: the op asks for %u bytes of push constants, the pipeline layout "
                 "has %d (VK_MAX_PUSH): %s",
                 name, asked->push_bytes, VK_MAX_PUSH, bug);
        return LLMEM_E_INVALID;
    }
    if (asked->n_bind > VK_MAX_BINDINGS) {
        snprintf(why, why_len,
                 "shader %s: the op asks for %u storage-buffer bindings, the set layout has "
                 "%d (VK_MAX_BINDINGS): %s",
                 name, asked->n_bind, VK_MAX_BINDINGS, bug);
        return LLMEM_E_INVALID;
    }
    if (info && info->n_spec > VK_MAX_SPEC) {
        snprintf(why, why_len,
                 "shader %s declares specialization constant id %d, a pipeline sets ids below "
                 "%d (VK_MAX_SPEC): %s",
                 name, info->n_spec - 1, VK_MAX_SPEC, bug);
        return LLMEM_E_INVALID;
    }
    if (info && info->push_bytes > VK_MAX_PUSH) {
        snprintf(why, why_len,
                 "shader %s declares %u bytes of push constants, the pipeline layout has %d "
                 "(VK_MAX_PUSH): %s",
                 name, info->push_bytes, VK_MAX_PUSH, bug);
        return LLMEM_E_INVALID;
    }
    return LLMEM_OK;
}

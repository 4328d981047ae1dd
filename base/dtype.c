/* llmem base: dtype sizes and names, and NaN poison patterns. */
#include <string.h>

#include "llmem/backend.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[LLMEM_DTYPE_COUNT] = {
    [LLMEM_DTYPE_F32] = {"f32", 4},
    [LLMEM_DTYPE_F16] = {"f16", 2},
    [LLMEM_DTYPE_BF16] = {"bf16", 2},
    [LLMEM_DTYPE_I32] = {"i32", 4},
};

static int dtype_valid(llmem_dtype t)
{
    /* The enum's underlying type may be unsigned; compare through int. */
    return (int)t >= 0 && (int)t < (int)LLMEM_DTYPE_COUNT;
}

size_t llmem_dtype_size(llmem_dtype t)
{
    return dtype_valid(t) ? dtypes[t].size : 0;
}

const char *llmem_dtype_name(llmem_dtype t)
{
    return dtype_valid(t) ? dtypes[t].name : "?";
}

llmem_status llmem_dtype_parse(const char *name, llmem_dtype *out)
{
    if (!name || !out)
        return LLMEM_E_INVALID;
    for (int i = 0; i < (int)LLMEM_DTYPE_COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (llmem_dtype)i;
            return LLMEM_OK;
        }
    }
    return LLMEM_E_INVALID;
}

/* f32: the canonical quiet NaN. f16: two quiet NaNs 0x7e00 (exponent all
 * ones, top mantissa bit). bf16: two quiet NaNs 0x7fc0, the top half of the
 * f32 quiet NaN. i32 has no NaN; it gets the f32 pattern as a recognisable
 * poison value (2143289344), so poisoned index tables stand out. */
uint32_t llmem_nan_pattern(llmem_dtype t)
{
    switch (t) {
    case LLMEM_DTYPE_F16: return 0x7e007e00u;
    case LLMEM_DTYPE_BF16: return 0x7fc07fc0u;
    case LLMEM_DTYPE_F32:
    case LLMEM_DTYPE_I32:
    default: return 0x7fc00000u;
    }
}

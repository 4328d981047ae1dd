/* llmem base: dtype sizes and names, NaN poison patterns, and the scalar
 * conversions of the scaled 8-bit dtypes (int8, FP8 E4M3). */
#include <math.h>
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
    [LLMEM_DTYPE_I8] = {"int8", 1},
    [LLMEM_DTYPE_F8E4M3] = {"fp8", 1},
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
    if (strcmp(name, "i8") == 0 || strcmp(name, "f8e4m3") == 0) {
        *out = name[0] == 'i' ? LLMEM_DTYPE_I8 : LLMEM_DTYPE_F8E4M3;
        return LLMEM_OK;
    }
    return LLMEM_E_INVALID;
}

float llmem_dtype_code_max(llmem_dtype t)
{
    return t == LLMEM_DTYPE_I8 ? 127.0f : t == LLMEM_DTYPE_F8E4M3 ? 448.0f : 0.0f;
}

uint8_t llmem_f32_to_e4m3(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a > 0x43e00000u) /* > 448 (and inf): saturate */
        return (uint8_t)(sign | 0x7eu);
    if (a < 0x3c800000u) { /* < 2^-6: subnormal codes m * 2^-9, m in 0..8 */
        float f;
        memcpy(&f, &a, 4);
        return (uint8_t)(sign | (uint8_t)rintf(f * 512.0f));
    }
    /* Normal: keep 3 mantissa bits, round to nearest even on the 20 dropped
     * bits (a carry moves into the exponent, as it should); rebias 127 -> 7. */
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return (uint8_t)(sign | (uint8_t)(r - (120u << 3)));
}

float llmem_e4m3_to_f32(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), e - 10);
    return (c & 0x80u) ? -v : v;
}

int8_t llmem_f32_to_i8(float x, float scale)
{
    if (!(scale > 0.0f))
        return 0;
    float q = rintf(x / scale);
    if (q != q)
        return 0;
    return (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}

/* f32: the canonical quiet NaN. f16: two quiet NaNs 0x7e00 (exponent all
 * ones, top mantissa bit). bf16: two quiet NaNs 0x7fc0, the top half of the
 * f32 quiet NaN. fp8: four E4M3 NaNs 0x7f. i32 and int8 have no NaN; it gets the f32 pattern as a recognisable
 * poison value (2143289344), so poisoned index tables stand out. */
uint32_t llmem_nan_pattern(llmem_dtype t)
{
    switch (t) {
    case LLMEM_DTYPE_F16: return 0x7e007e00u;
    case LLMEM_DTYPE_BF16: return 0x7fc07fc0u;
    case LLMEM_DTYPE_F8E4M3: return 0x7f7f7f7fu;
    case LLMEM_DTYPE_F32:
    case LLMEM_DTYPE_I32:
    default: return 0x7fc00000u;
    }
}

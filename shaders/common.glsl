/* llmem Vulkan shaders: shared helpers (included by every *.comp).
 *
 * Storage. Every buffer is bound as an array of 32-bit words, whatever the
 * dtype, so no shader needs the 16-bit storage features: an f16/bf16
 * element e is the low (e even) or high (e odd) half of word e >> 1
 * (little endian, as on the host). Offsets pushed by the host are in
 * elements of the tensor's dtype, relative to the start of its binding.
 *
 * Conversions are done with integer operations so that they round to
 * nearest even (as the CPU reference) on every driver: GLSL's packHalf2x16
 * leaves the rounding mode to the implementation.
 *
 * 16-bit stores. Two invocations may own the two halves of one word; a
 * half is then written with atomicAnd + atomicOr, which touch only its own
 * bits. Shaders write whole words with plain stores where one invocation
 * owns both halves.
 *
 * Dtype codes (specialization constants) are llmem_dtype values:
 * 0 f32, 1 f16, 2 bf16; DT_NONE (3) marks an absent optional tensor.
 */
#ifndef USE_SUBGROUP
#define USE_SUBGROUP 0
#endif
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif

#define DT_F32 0u
#define DT_F16 1u
#define DT_BF16 2u
#define DT_NONE 3u

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

/* Linear id of this workgroup: the host splits large grids over x and y
 * (maxComputeWorkGroupCount is often 65535 per dimension). */
uint group_id(void)
{
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

uint global_id(void)
{
    return group_id() * WG + gl_LocalInvocationID.x;
}

float f16_to_f32(uint h)
{
    uint sign = (h & 0x8000u) << 16;
    uint em = h & 0x7fffu;
    if (em >= 0x7c00u) /* inf, NaN */
        return uintBitsToFloat(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) /* normal: rebias the exponent by 127 - 15 */
        return uintBitsToFloat(sign | ((em + (112u << 10)) << 13));
    /* zero or subnormal: em * 2^-24 is a normal f32, exact */
    float f = float(em) * (1.0 / 16777216.0);
    return uintBitsToFloat(floatBitsToUint(f) | sign);
}

uint f32_to_f16(float f)
{
    uint u = floatBitsToUint(f);
    uint sign = (u >> 16) & 0x8000u;
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* normal f16 */
        uint r = a + 0x0fffu + ((a >> 13) & 1u);
        return sign | ((r - 0x38000000u) >> 13);
    }
    /* f16 subnormal or zero: the value in units of 2^-24, rounded to
     * nearest even from the integer mantissa. */
    uint e = a >> 23;
    uint shift = 126u - e; /* >= 14 */
    if (shift >= 25u)
        return sign;
    uint mant = (a & 0x7fffffu) | 0x800000u;
    uint q = mant >> shift;
    uint rem = mant & ((1u << shift) - 1u);
    uint half_ = 1u << (shift - 1u);
    if (rem > half_ || (rem == half_ && (q & 1u) != 0u))
        q += 1u;
    return sign | q;
}

float bf16_to_f32(uint h)
{
    return uintBitsToFloat(h << 16);
}

uint f32_to_bf16(float f)
{
    uint u = floatBitsToUint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u; /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

float half_to_f32(uint h, uint dt)
{
    return dt == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

uint f32_to_half(float f, uint dt)
{
    return dt == DT_F16 ? f32_to_f16(f) : f32_to_bf16(f);
}

/* Element e of a word array `arr` holding dtype dt, as f32. */
#define LOAD_F(arr, e, dt)                                                            \
    ((dt) == DT_F32 ? uintBitsToFloat(arr[(e)])                                      \
                    : half_to_f32((arr[(e) >> 1] >> (((e) & 1u) * 16u)) & 0xffffu, (dt)))

/* Stores f32 v as element e of dtype dt; 16-bit halves by atomics, so
 * neighbouring invocations may write the other half of the word. */
#define STORE_F(arr, e, dt, v)                                                        \
    {                                                                                 \
        uint e_ = (e);                                                                \
        if ((dt) == DT_F32) {                                                         \
            arr[e_] = floatBitsToUint(v);                                             \
        } else {                                                                      \
            uint sh_ = (e_ & 1u) * 16u;                                               \
            atomicAnd(arr[e_ >> 1], ~(0xffffu << sh_));                               \
            atomicOr(arr[e_ >> 1], f32_to_half((v), (dt)) << sh_);                    \
        }                                                                             \
    }

float silu(float x)
{
    return x / (1.0 + exp(-x));
}

/* log(1 + y) for y in [0, 1] by the series 2 atanh(t) = 2 (t + t^3/3 +
 * ... + t^17/17), t = y / (2 + y) <= 1/3 (truncation below 2e-9
 * relative). It needs no log() of a value near 1, where drivers may give
 * only an absolute accuracy (the Vulkan spec allows 2^-21 in [0.5, 2]). */
float log1p_01(float y)
{
    float t = y / (2.0 + y);
    float t2 = t * t;
    float s = 1.0 / 17.0;
    s = 1.0 / 15.0 + t2 * s;
    s = 1.0 / 13.0 + t2 * s;
    s = 1.0 / 11.0 + t2 * s;
    s = 1.0 / 9.0 + t2 * s;
    s = 1.0 / 7.0 + t2 * s;
    s = 1.0 / 5.0 + t2 * s;
    s = 1.0 / 3.0 + t2 * s;
    s = 1.0 + t2 * s;
    return 2.0 * t * s;
}

/* softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|); x above 20
 * returns x (torch's threshold, as the CPU reference). */
float softplus(float x)
{
    if (x > 20.0)
        return x;
    return max(x, 0.0) + log1p_01(exp(-abs(x)));
}

/* tanh without overflow for large |x| (GLSL's tanh may give NaN there),
 * and without cancellation near 0 (odd series below |x| = 0.125, whose
 * truncation is under 1e-8 relative). */
float tanh_safe(float x)
{
    float a = abs(x);
    if (a < 0.125) {
        float x2 = x * x;
        return x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
    }
    float e = exp(-2.0 * a);
    return sign(x) * ((1.0 - e) / (1.0 + e));
}

/* ---- workgroup reductions ----------------------------------------------------------- */
/* Every invocation of the workgroup must call these (they hold barriers).
 * With USE_SUBGROUP the subgroup reduces first, then one value per
 * subgroup goes through shared memory; otherwise a shared-memory tree. */

shared float red_f[WG];

float wg_sum(float v)
{
#if USE_SUBGROUP
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect())
        red_f[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++)
        t += red_f[i];
    return t;
#else
    uint l = gl_LocalInvocationID.x;
    barrier();
    red_f[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s)
            red_f[l] += red_f[l + s];
        barrier();
    }
    return red_f[0];
#endif
}

float wg_max(float v)
{
#if USE_SUBGROUP
    v = subgroupMax(v);
    barrier();
    if (subgroupElect())
        red_f[gl_SubgroupID] = v;
    barrier();
    float t = red_f[0];
    for (uint i = 1; i < gl_NumSubgroups; i++)
        t = max(t, red_f[i]);
    return t;
#else
    uint l = gl_LocalInvocationID.x;
    barrier();
    red_f[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (l < s)
            red_f[l] = max(red_f[l], red_f[l + s]);
        barrier();
    }
    return red_f[0];
#endif
}

/* wg_sum with the subgroups' sums added by each subgroup (strided over
 * its invocations, then subgroupAdd) instead of one after another by
 * every invocation: the same sum in another order (within f32 rounding),
 * one round of shared-memory reads instead of gl_NumSubgroups. Without
 * subgroups: wg_sum. */
float wg_sum_sg(float v)
{
#if USE_SUBGROUP
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect())
        red_f[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize)
        t += red_f[i];
    return subgroupAdd(t);
#else
    return wg_sum(v);
#endif
}

/* wg_max with the subgroups' maxima reduced by each subgroup (strided
 * over its invocations, then subgroupMax) instead of one after another by
 * every invocation: the same value, max being exact and order-free, where
 * no NaN is among them. Without subgroups: wg_max. */
float wg_max_sg(float v)
{
#if USE_SUBGROUP
    v = subgroupMax(v);
    barrier();
    if (subgroupElect())
        red_f[gl_SubgroupID] = v;
    barrier();
    float t = red_f[0];
    for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize)
        t = max(t, red_f[i]);
    return subgroupMax(t);
#else
    return wg_max(v);
#endif
}

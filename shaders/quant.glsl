/* Scaled 8-bit codes of KV pools (int8, OCP FP8 E4M3; issue 17), shared by
 * kv_store_q.comp and attention_q.comp. A pool is an array of 32-bit words;
 * byte b is bits 8 * (b & 3) .. of word b >> 2. Same arithmetic as the cpu
 * backend (backends/cpu/cpu_ops.h, base/dtype.c): value = code * scale,
 * code = Q(x / scale). */
#define QDT_I8 4u
#define QDT_F8 5u

float q_value(uint c, uint dt)
{
    if (dt == QDT_I8)
        return float(int(c << 24) >> 24);
    uint e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if (e == 0u)
        v = float(m) * (1.0 / 512.0);
    else if (e == 15u && m == 7u)
        v = uintBitsToFloat(0x7fc00000u);
    else
        v = uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    return (c & 0x80u) != 0u ? -v : v;
}

/* E4M3, round to nearest even, saturating to +-448 (llmem_f32_to_e4m3). */
uint q_e4m3(float x)
{
    uint u = floatBitsToUint(x);
    uint sign = (u >> 24) & 0x80u;
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7fu;
    if (a > 0x43e00000u)
        return sign | 0x7eu;
    if (a < 0x3c800000u)
        return sign | uint(roundEven(uintBitsToFloat(a) * 512.0));
    uint r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return sign | ((r - (120u << 3)) & 0x7fu);
}

uint q_code(float x, float scale, uint dt)
{
    if (!(scale > 0.0))
        return 0u;
    float y = x / scale;
    if (dt == QDT_F8)
        return q_e4m3(y);
    float r = roundEven(y);
    if (isnan(r))
        return 0u;
    return uint(int(clamp(r, -127.0, 127.0))) & 0xffu;
}

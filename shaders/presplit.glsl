/* llmem Vulkan shaders: matmul_cm.comp's f16 terms of an activation row,
 * written by the op that makes the row (backends/vulkan/vk_presplit.c),
 * with cm_split.comp's arithmetic, so that the terms are bit for bit those
 * that cm_split.comp would compute from the same f32 row:
 *   e   = the exponent that brings the row's max |x| into [2^14, 2^15)
 *         (frexp's exponent - 15, clamped to [-100, 100]; 0 for a row of
 *         zeros, infinities or NaN),
 *   hi  = f16(x 2^-e), lo = f16(x 2^-e - hi), both rounded to nearest even
 *         by common.glsl's integer conversions (no driver conversion that a
 *         compiler could fold: hi's f32 value is exact, so x 2^-e - hi is
 *         too).
 * Included after common.glsl. */

int presplit_exp(float mx)
{
    int e = 0;
    if (mx > 0.0 && mx <= 3.4028234e38) { /* finite, non-zero (NaN fails both) */
        frexp(mx, e);
        e = clamp(e - 15, -100, 100);
    }
    return e;
}

/* hi | lo << 16 of element x of a row of exponent e */
uint presplit_terms(float x, int e)
{
    float s = ldexp(x, -e);
    uint h = f32_to_f16(s);
    return h | (f32_to_f16(s - f16_to_f32(h)) << 16);
}

/* hi alone (fast mode's products read no lo): presplit_terms' low half */
uint presplit_hi(float x, int e)
{
    return f32_to_f16(ldexp(x, -e));
}

/* The terms of words [j0, j1) of one row (elements 2 j0 .. 2 j1 - 1),
 * element c's hi | lo << 16 in pk[c] (shared, written by the workgroup
 * before a barrier), to word j of the row's hi and lo halves (pairs 2j,
 * 2j + 1), spread over the WG invocations; lo only where with_lo (_T).
 * PRESPLIT_STORE: the whole row of n (even) elements. */
#define PRESPLIT_STORE_WORDS_T(pk, j0, j1, s, hi_at, lo_at, with_lo)                              \
    for (uint j_ = (j0) + gl_LocalInvocationID.x; j_ < (j1); j_ += WG) {                          \
        uint a0_ = pk[2u * j_], a1_ = pk[2u * j_ + 1u];                                           \
        s[(hi_at) + j_] = (a0_ & 0xffffu) | (a1_ << 16);                                          \
        if (with_lo)                                                                              \
            s[(lo_at) + j_] = (a0_ >> 16) | (a1_ & 0xffff0000u);                                  \
    }
#define PRESPLIT_STORE_WORDS(pk, j0, j1, s, hi_at, lo_at)                                         \
    PRESPLIT_STORE_WORDS_T(pk, j0, j1, s, hi_at, lo_at, true)
#define PRESPLIT_STORE(pk, n, s, hi_at, lo_at) PRESPLIT_STORE_WORDS(pk, 0u, (n) / 2u, s, hi_at, lo_at)

/* The terms of 4 consecutive outputs (vec4 v, the first at an even word
 * of the row's halves) of a row of exponent e: hi to 8-byte unit hi2 of
 * s2 (a uvec2 view of the terms' binding), lo to unit lo2 where with_lo
 * (fast mode's split writes hi only); the words PRESPLIT_STORE would
 * write for those elements. */
#define PRESPLIT_STORE4_TERMS(v, e, s2, hi2, lo2, with_lo)                                        \
    {                                                                                             \
        uint a0_ = presplit_terms((v).x, (e)), a1_ = presplit_terms((v).y, (e));                  \
        uint a2_ = presplit_terms((v).z, (e)), a3_ = presplit_terms((v).w, (e));                  \
        s2[(hi2)] = uvec2((a0_ & 0xffffu) | (a1_ << 16), (a2_ & 0xffffu) | (a3_ << 16));          \
        if (with_lo)                                                                              \
            s2[(lo2)] =                                                                           \
                uvec2((a0_ >> 16) | (a1_ & 0xffff0000u), (a2_ >> 16) | (a3_ & 0xffff0000u));      \
    }
#define PRESPLIT_STORE4(v, e, s2, hi2, lo2) PRESPLIT_STORE4_TERMS(v, e, s2, hi2, lo2, true)

/* The columns [*c0, *c1) that workgroup `part` of the ns that share a row
 * of n elements writes: parts of ceil(n / ns) rounded up to even (whole
 * words of the f16 terms); the last ones may be short or empty. */
void row_part(uint n, uint ns, uint part, out uint c0, out uint c1)
{
    uint ch = ((n + ns - 1u) / ns + 1u) & ~1u;
    c0 = min(part * ch, n);
    c1 = min(c0 + ch, n);
}

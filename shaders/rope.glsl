/* RoPE angles without floating-point range reduction error.
 *
 * The angle of pair i at position pos is pos * f_i radians. The host
 * passes u_i = f_i / (2 pi) as a 64-bit binary fraction of a turn (the
 * integer part of u_i adds whole turns and is dropped). pos * u_i mod 1 is
 * then exact in integer arithmetic; its top two bits give the quadrant and
 * the rest a remainder in [-1/8, 1/8) turn, i.e. r in [-pi/4, pi/4), whose
 * sine and cosine come from Taylor polynomials accurate to f32 rounding
 * there. So large positions (2^24 and beyond) stay as accurate as the CPU
 * reference, which forms the angle in double. */

/* cos and sin of pos * f for the fraction (lo, hi) of a turn. */
vec2 rope_cos_sin(int pos, uint lo, uint hi)
{
    uint ap = pos < 0 ? uint(-(pos + 1)) + 1u : uint(pos);
    uint plo, phi;
    umulExtended(ap, lo, phi, plo);
    uint fhi = phi + ap * hi; /* (ap * u) mod 2^64 = (fhi, plo) */
    uint flo = plo;
    if (pos < 0) { /* negate mod 2^64 */
        flo = ~plo + 1u;
        fhi = ~fhi + (plo == 0u ? 1u : 0u);
    }
    uint q = fhi >> 30;
    int rhi = int(fhi & 0x3fffffffu);
    if (rhi >= 0x20000000) { /* remainder >= 1/8 turn: next quadrant */
        rhi -= 0x40000000;
        q += 1u;
    }
    /* remainder in turns = (rhi * 2^32 + flo) * 2^-64 */
    float turns = (float(rhi) + float(flo) * (1.0 / 4294967296.0)) * (1.0 / 4294967296.0);
    float r = turns * 6.2831853071795864769;
    float r2 = r * r;
    float s = r * (1.0 + r2 * (-1.0 / 6.0 + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0 +
              r2 * (1.0 / 362880.0 + r2 * (-1.0 / 39916800.0))))));
    float c = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24.0 + r2 * (-1.0 / 720.0 + r2 * (1.0 / 40320.0 +
              r2 * (-1.0 / 3628800.0 + r2 * (1.0 / 479001600.0))))));
    q &= 3u;
    if (q == 0u)
        return vec2(c, s);
    if (q == 1u)
        return vec2(-s, c);
    if (q == 2u)
        return vec2(-c, -s);
    return vec2(s, -c);
}

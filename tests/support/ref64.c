/* llmem tests: float64 references and comparison helpers (see ref64.h). */
#include "support/ref64.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- random numbers ---------------------------------------------------------------------- */

ref64_rng ref64_rng_make(uint64_t seed, uint64_t stream)
{
    ref64_rng r = {seed ^ (stream * 0xd1b54a32d192ed03ull) ^ 0x8badf00dull};
    ref64_next(&r);
    return r;
}

uint64_t ref64_next(ref64_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double ref64_uniform(ref64_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(ref64_next(r) >> 11) * 0x1p-53);
}

int32_t ref64_int(ref64_rng *r, int32_t lo, int32_t hi)
{
    uint64_t span = (uint64_t)((int64_t)hi - lo) + 1;
    return (int32_t)(lo + (int64_t)(ref64_next(r) % span));
}

void ref64_fill(ref64_rng *r, double *v, int64_t n, double lo, double hi, llmem_dtype t)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = ref64_round(ref64_uniform(r, lo, hi), t);
}

void ref64_shuffle(ref64_rng *r, int32_t *v, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        v[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = ref64_int(r, 0, i);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

uint64_t ref64_seed(void)
{
    static uint64_t seed;
    static bool set;
    if (!set) {
        const char *env = getenv("LLMEM_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts = {0};
            timespec_get(&ts, TIME_UTC);
            seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        }
        set = true;
    }
    return seed;
}

/* ---- dtypes -------------------------------------------------------------------------------- */

/* Rounds to a binary format with `mant` fraction bits, smallest normal
 * exponent emin and largest finite value max_finite, ties to even. */
static double round_format(double x, int mant, int emin, double max_finite)
{
    if (isnan(x) || isinf(x) || x == 0.0)
        return x;
    double a = fabs(x);
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int exp2 = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, exp2 - mant); /* spacing of representable values */
    double r = nearbyint(a / q) * q;    /* default rounding mode: ties to even */
    if (r > max_finite)
        r = INFINITY;
    return copysign(r, x);
}

double ref64_round(double x, llmem_dtype t)
{
    switch (t) {
    case LLMEM_DTYPE_F16:
        return round_format(x, 10, -14, 65504.0);
    case LLMEM_DTYPE_BF16:
        return round_format(x, 7, -126, ldexp(255.0 / 128.0, 127));
    default:
        return round_format(x, 23, -126, (double)FLT_MAX);
    }
}

static uint16_t encode_f16(double x)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0u;
    if (isnan(x))
        return 0x7e00u;
    double a = fabs(x);
    if (isinf(a))
        return (uint16_t)(sign | 0x7c00u);
    if (a == 0.0)
        return sign;
    int e;
    frexp(a, &e);
    int exp2 = e - 1;
    if (exp2 < -14) /* subnormal: a multiple of 2^-24 */
        return (uint16_t)(sign | (uint16_t)ldexp(a, 24));
    uint16_t frac = (uint16_t)((ldexp(a, -exp2) - 1.0) * 1024.0);
    return (uint16_t)(sign | (uint16_t)((exp2 + 15) << 10) | frac);
}

void ref64_encode(double x, llmem_dtype t, void *dst)
{
    switch (t) {
    case LLMEM_DTYPE_F16: {
        uint16_t h = encode_f16(x);
        memcpy(dst, &h, 2);
        break;
    }
    case LLMEM_DTYPE_BF16: {
        float f = (float)x; /* exact: x is representable in bf16 */
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t h = (uint16_t)(u >> 16);
        memcpy(dst, &h, 2);
        break;
    }
    case LLMEM_DTYPE_I32: {
        int32_t i = (int32_t)x;
        memcpy(dst, &i, 4);
        break;
    }
    default: {
        float f = (float)x;
        memcpy(dst, &f, 4);
        break;
    }
    }
}

double ref64_decode(const void *src, llmem_dtype t)
{
    switch (t) {
    case LLMEM_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, src, 2);
        int e = (h >> 10) & 31, m = h & 1023;
        double v;
        if (e == 0)
            v = ldexp((double)m, -24);
        else if (e == 31)
            v = m ? NAN : INFINITY;
        else
            v = ldexp(1.0 + m / 1024.0, e - 15);
        return (h & 0x8000u) ? -v : v;
    }
    case LLMEM_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, src, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case LLMEM_DTYPE_I32: {
        int32_t i;
        memcpy(&i, src, 4);
        return i;
    }
    default: {
        float f;
        memcpy(&f, src, 4);
        return f;
    }
    }
}

/* ---- comparison ------------------------------------------------------------------------------- */

double ref64_nerr(const double *out, const double *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(out[i]))
            return INFINITY;
        double d = out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

int64_t ref64_first_nonfinite(const double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return -1;
}

double ref64_tol(llmem_dtype t, bool vs_cpu)
{
    /* f32: about 25 f32 ulps (2^-23) of accumulated rounding; 16-bit
     * outputs: one rounding of the dtype (2^-11, 2^-8 relative) with 2x
     * slack. Against cpu, other backends may reorder sums (tiles, tensor
     * cores), hence the wider bounds. */
    switch (t) {
    case LLMEM_DTYPE_F16:
        return vs_cpu ? 2e-3 : 1e-3;
    case LLMEM_DTYPE_BF16:
        return vs_cpu ? 1.6e-2 : 8e-3;
    default:
        return vs_cpu ? 1e-4 : 3e-6;
    }
}

/* ---- op references ------------------------------------------------------------------------------ */

double ref64_silu(double x)
{
    return x / (1.0 + exp(-x));
}

double ref64_softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

void ref64_matmul(const double *a, const double *w, int64_t m, int64_t k, int64_t n, double *out)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t x = 0; x < k; x++)
                s += a[i * k + x] * w[j * k + x];
            out[i * n + j] = s;
        }
}

void ref64_rms_norm(const double *x, const double *w, int64_t rows, int64_t d, double eps,
                    double *out)
{
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++)
            ss += x[r * d + i] * x[r * d + i];
        double s = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t i = 0; i < d; i++)
            out[r * d + i] = x[r * d + i] * s * (w ? w[i] : 1.0);
    }
}

void ref64_rms_norm_gated(const double *y, const double *z, const double *w, int64_t rows,
                          int64_t d, int64_t groups, double eps, double *out)
{
    int64_t gs = d / groups;
    double *h = malloc((size_t)(d > 0 ? d : 1) * sizeof *h);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < d; i++)
            h[i] = y[r * d + i] * ref64_silu(z[r * d + i]);
        for (int64_t g = 0; g < groups; g++) {
            double ss = 0.0;
            for (int64_t i = g * gs; i < (g + 1) * gs; i++)
                ss += h[i] * h[i];
            double s = 1.0 / sqrt(ss / (double)gs + eps);
            for (int64_t i = g * gs; i < (g + 1) * gs; i++)
                out[r * d + i] = h[i] * s * w[i];
        }
    }
    free(h);
}

void ref64_rope(const llmem_rope_params *p, int64_t head_dim, double pos, const double *x,
                double *out)
{
    int64_t half = p->n_rot / 2;
    for (int64_t i = 0; i < head_dim; i++)
        out[i] = x[i];
    for (int64_t i = 0; i < half; i++) {
        double theta = pos * (double)p->freq_scale *
                       pow((double)p->theta_base, -2.0 * (double)i / (double)p->n_rot);
        double c = cos(theta), s = sin(theta);
        int64_t a = p->mode == LLMEM_ROPE_NEOX ? i : 2 * i;
        int64_t b = p->mode == LLMEM_ROPE_NEOX ? i + half : 2 * i + 1;
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[a] * s + x[b] * c;
    }
}

void ref64_log_softmax(const double *x, int64_t n, double *out)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += exp(x[i] - m);
    double lse = m + log(s);
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] - lse;
}

void ref64_attention(const double *q, const double *k, const double *v, int64_t n, int64_t d,
                     double scale, double softcap, double *out)
{
    for (int64_t i = 0; i < d; i++)
        out[i] = 0.0;
    if (n == 0)
        return;
    double *s = malloc((size_t)n * sizeof *s);
    double m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        double x = 0.0;
        for (int64_t i = 0; i < d; i++)
            x += q[i] * k[j * d + i];
        x *= scale;
        if (softcap > 0.0)
            x = softcap * tanh(x / softcap);
        s[j] = x;
        m = x > m ? x : m;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        s[j] = exp(s[j] - m);
        sum += s[j];
    }
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < d; i++)
            out[i] += s[j] / sum * v[j * d + i];
    free(s);
}

void ref64_conv_token(double *state, const double *x, const double *w, const double *b,
                      int64_t c, int64_t d_conv, double *out)
{
    for (int64_t ch = 0; ch < c; ch++) {
        double acc = b ? b[ch] : 0.0;
        for (int64_t k = 0; k < d_conv - 1; k++)
            acc += w[ch * d_conv + k] * state[k * c + ch];
        acc += w[ch * d_conv + d_conv - 1] * x[ch];
        out[ch] = ref64_silu(acc);
    }
    for (int64_t k = 0; k + 1 < d_conv - 1; k++)
        for (int64_t ch = 0; ch < c; ch++)
            state[k * c + ch] = state[(k + 1) * c + ch];
    for (int64_t ch = 0; ch < c; ch++)
        state[(d_conv - 2) * c + ch] = x[ch];
}

void ref64_ssm_token(double *S, const double *xbc, const double *dt, const double *a_log,
                     const double *d, const double *dt_bias, const llmem_ssm_params *p,
                     double *y)
{
    int64_t H = p->n_heads, P = p->head_dim, N = p->d_state, G = p->n_groups;
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / (H / G);
        const double *x = xbc + h * P;
        const double *B = xbc + H * P + g * N;
        const double *C = xbc + H * P + G * N + g * N;
        double dtv = ref64_softplus(dt[h] + (dt_bias ? dt_bias[h] : 0.0));
        dtv = fmin(fmax(dtv, (double)p->dt_min), (double)p->dt_max);
        double dA = exp(dtv * -exp(a_log[h]));
        for (int64_t pp = 0; pp < P; pp++) {
            double *Sp = S + (h * P + pp) * N;
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++) {
                Sp[n] = Sp[n] * dA + dtv * x[pp] * B[n];
                acc += Sp[n] * C[n];
            }
            y[h * P + pp] = acc + (d ? d[h] : 0.0) * x[pp];
        }
    }
}

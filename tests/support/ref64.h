/* llmem tests: float64 references for the backend ops, dtype rounding done
 * independently of the library (frexp/ldexp arithmetic, not bit tricks),
 * a seeded random generator, and comparison helpers.
 *
 * Every reference follows the definition given in <llmem/ops.h> and the
 * paper or reference implementation named there, evaluated in double.
 */
#ifndef LLMEM_TEST_REF64_H
#define LLMEM_TEST_REF64_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/backend.h"
#include "llmem/ops.h"

/* ---- random numbers (splitmix64) ------------------------------------------------------ */

typedef struct ref64_rng {
    uint64_t s;
} ref64_rng;

/* A generator for (seed, stream): distinct streams give unrelated numbers. */
ref64_rng ref64_rng_make(uint64_t seed, uint64_t stream);
uint64_t ref64_next(ref64_rng *r);
/* Uniform in [lo, hi). */
double ref64_uniform(ref64_rng *r, double lo, double hi);
/* Uniform integer in [lo, hi] (hi >= lo). */
int32_t ref64_int(ref64_rng *r, int32_t lo, int32_t hi);
/* n values uniform in [lo, hi), each rounded to dtype t. */
void ref64_fill(ref64_rng *r, double *v, int64_t n, double lo, double hi, llmem_dtype t);
/* Random permutation of [0, n). */
void ref64_shuffle(ref64_rng *r, int32_t *v, int32_t n);

/* The seed of this test run: $LLMEM_TEST_SEED when set, else from the clock;
 * fixed at the first call, so every forked test sees the same one. */
uint64_t ref64_seed(void);

/* ---- dtypes ---------------------------------------------------------------------------- */

/* x rounded to the nearest value of dtype t (ties to even), as a double;
 * overflow gives +-inf, NaN stays NaN. I32 and F32 round to float. */
double ref64_round(double x, llmem_dtype t);
/* Writes the encoding of x (already representable in t) at dst. */
void ref64_encode(double x, llmem_dtype t, void *dst);
/* Value of the element of dtype t at src. */
double ref64_decode(const void *src, llmem_dtype t);

/* ---- comparison -------------------------------------------------------------------------- */

/* ||out - ref|| / ||ref|| (2-norms); ||out - ref|| when ||ref|| is 0;
 * +inf when out has a NaN or inf. */
double ref64_nerr(const double *out, const double *ref, int64_t n);
/* Index of the first non-finite value, or -1. */
int64_t ref64_first_nonfinite(const double *v, int64_t n);

/* Normalized-error threshold for an output of dtype t: against the float64
 * reference (cpu backend), or against the cpu backend (other backends). */
double ref64_tol(llmem_dtype t, bool vs_cpu);

/* ---- op references (row-major, shapes as in <llmem/ops.h>) ------------------------------ */

double ref64_silu(double x);
double ref64_softplus(double x); /* log(1 + e^x), x above 20 */

/* out[M, N] = a[M, K] · w[N, K]ᵀ */
void ref64_matmul(const double *a, const double *w, int64_t m, int64_t k, int64_t n, double *out);
/* rows of d: out = x / sqrt(mean(x^2) + eps) * w (w NULL: 1) */
void ref64_rms_norm(const double *x, const double *w, int64_t rows, int64_t d, double eps,
                    double *out);
/* MambaRMSNormGated: h = y * silu(z), RMS norm per group of d / groups, * w */
void ref64_rms_norm_gated(const double *y, const double *z, const double *w, int64_t rows,
                          int64_t d, int64_t groups, double eps, double *out);
/* RoPE of one head row x[head_dim] at position pos (RoFormer eq. 34). */
void ref64_rope(const llmem_rope_params *p, int64_t head_dim, double pos, const double *x,
                double *out);
/* log_softmax of one row. */
void ref64_log_softmax(const double *x, int64_t n, double *out);

/* One query head against keys/values [n][d] (the visible ones only):
 * softmax(softcap(scale * q·k)) · v; zeros when n == 0. */
void ref64_attention(const double *q, const double *k, const double *v, int64_t n, int64_t d,
                     double scale, double softcap, double *out);

/* One token of the Mamba-2 conv: state [d_conv - 1][c] (oldest first) is
 * updated in place; out[c] = silu(b + sum_k w[c][k] * u[k]). b may be NULL. */
void ref64_conv_token(double *state, const double *x, const double *w, const double *b,
                      int64_t c, int64_t d_conv, double *out);

/* One token of the Mamba-2 selective scan (HF torch_forward cached step):
 * S [H][P][N] updated in place; y[H * P]. d, dt_bias may be NULL. */
void ref64_ssm_token(double *S, const double *xbc, const double *dt, const double *a_log,
                     const double *d, const double *dt_bias, const llmem_ssm_params *p,
                     double *y);

#endif

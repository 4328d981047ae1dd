/* llmem tests: recurrent-state helpers shared by the op conformance suites
 * of the recurrent ops (tests/test_ops_mamba.c: Mamba-2 conv and scan;
 * tests/test_ops_ssm1.c: LFM2 short conv and Mamba-1 scan).
 *
 * A test describes one EQUAL ubatch as an rs_setup (streams, tokens per
 * stream, checkpoints, slots; each stream's source, destination and
 * checkpoint slots), builds a recurrent view over state buffers holding
 * given slot images (free slots hold the dtype's NaN), runs a float64
 * reference recurrence over the ubatch (rs_reference_ubatch with a
 * per-token step function) and checks every slot after the op
 * (rs_check_slots: written slots against the reference, the others keep
 * their bytes). Sources are read before any write, so a source may be
 * -1 (zero state), the stream's own destination (in place), another
 * stream's destination (copy-on-write) or a checkpoint (rollback), as
 * in <llmem/recurrent.h>.
 */
#ifndef LLMEM_TEST_RS_HARNESS_H
#define LLMEM_TEST_RS_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

/* The most streams an rs_setup holds (checkpoints: 4 per stream). */
#define RS_MAXS 8

typedef struct rs_setup {
  int32_t n_seqs, n_tok, n_ckpt, n_slots;
  int32_t src[RS_MAXS], dst[RS_MAXS],
      ckpt[RS_MAXS * 4]; /* -1: none (src: zero state) */
  /* a snapshot inside the ubatch (llmem_rs_view.snap_tok / snap_slot):
   * stream s's state after its token snap_tok[s] into slot snap_slot[s]
   * (-1: none), when `snap` */
  bool snap;
  int32_t snap_tok[RS_MAXS], snap_slot[RS_MAXS];
} rs_setup;

/* The ubatch token (0-based, within a stream) after which checkpoint c is
 * taken; -1: the state before the first token. */
int32_t rs_ckpt_token(const rs_setup *rs, int32_t c);

/* Elements of one slot of state d (the product of its shape). */
int64_t rs_desc_elems(const llmem_state_desc *d);

/* Fills *view as a recurrent view over the caller's description v (which
 * must outlive the view, as must desc and bufs) of n_states states of rs:
 * bufs[j] becomes a th_pool buffer of rs->n_slots slots of desc[j], holding
 * the raw bytes init[j]; the src/dst/ckpt tables go to one index buffer.
 * Buffers are freed at th_end(c). Asserts (Check) on upload failure. */
void rs_build(th_ctx *c, llmem_view *view, llmem_rs_view *v, const rs_setup *rs,
              int32_t n_states, const llmem_state_desc *desc,
              llmem_buffer **bufs, const unsigned char *const *init);

/* A host slot image of state d (n_slots slots, freed at th_end(h)): the
 * dtype's NaN pattern everywhere, values uniform in [lo, hi) rounded to
 * d->dtype in the slots s with live[s]. */
unsigned char *rs_state_image(th_ctx *h, ref64_rng *r,
                              const llmem_state_desc *d, int32_t n_slots,
                              const bool *live, double lo, double hi);

/* rs_state_image with live = the source slots of rs (src[s] >= 0):
 * the state a ubatch starts from, NaN in every other slot. */
unsigned char *rs_source_image(th_ctx *h, ref64_rng *r, const llmem_state_desc *d,
                               const rs_setup *rs, double lo, double hi);

/* Decodes slot `slot` of image img (state d) into out [elems] doubles. */
void rs_decode_slot(const unsigned char *img, const llmem_state_desc *d,
                    int32_t slot, double *out);

/* One float64 reference token: advances state [elems] by ubatch row tok,
 * writing that row's output to out_row. */
typedef void (*rs_step_fn)(void *ctx, double *state, int32_t tok,
                           double *out_row);

/* Runs step over every stream of rs from the slot image init (state d):
 * out gets [n_seqs * n_tok, out_cols] outputs, want_slots [n_slots, elems]
 * the states the ubatch must leave in the slots it writes (checkpoints and
 * destinations), written[s] whether slot s is written. */
void rs_reference_ubatch(const rs_setup *rs, const llmem_state_desc *d,
                         const unsigned char *init, rs_step_fn step, void *ctx,
                         int64_t out_cols, double *out, double *want_slots,
                         bool *written);

/* Checks the state image `got` after the op: written slots against want
 * (exact bytes of want rounded to the dtype when `exact`, else within
 * ref64_tol(dtype, vs_cpu)), other slots byte-equal to init. Failures are
 * Check assertions naming `what` and the slot. */
void rs_check_slots(const rs_setup *rs, const llmem_state_desc *d,
                    const unsigned char *init, const unsigned char *got,
                    const double *want, const bool *written, bool exact,
                    bool vs_cpu, const char *what);

/* The most slots the case buffers below track (rs_setup.n_slots). */
#define RS_MAX_SLOTS 32

/* The buffers one recurrent-op case fills, from h's arena (freed at
 * th_end(h)): n_out doubles each for the output of the backend under test
 * (out), of the float64 reference (ref) and of a CPU backend (ref_cpu);
 * the slot images after the op on that backend and on the CPU (after,
 * after_cpu: rs->n_slots slots of d and 4 bytes more, as the state
 * buffer's size may be rounded up to 4 bytes); the states the reference
 * wants in the slots (want, [n_slots, elems]) and which slots it writes
 * (written). Asserts that rs->n_slots <= RS_MAX_SLOTS. */
typedef struct rs_case_bufs {
  double *out, *ref, *ref_cpu, *want;
  unsigned char *after, *after_cpu;
  size_t img_bytes; /* of after and after_cpu each */
  bool written[RS_MAX_SLOTS];
} rs_case_bufs;

void rs_case_bufs_make(th_ctx *h, const rs_setup *rs, const llmem_state_desc *d,
                       int64_t n_out, rs_case_bufs *b);

/* The inputs of one Mamba-2 scan over an rs_setup's ubatch (rs_ssm_scan_run,
 * rs_ssm_scan_step): xbc [tokens, rs_ssm_conv_dim(&p)] and dt [tokens,
 * p.n_heads] in token order (stream-major), a_log, d and dt_bias
 * [p.n_heads] held on the device in pt (d, dt_bias may be NULL: none). */
typedef struct rs_scan_in {
  llmem_ssm_params p;
  llmem_dtype pt;
  const double *xbc, *dt, *a_log, *d, *dt_bias;
} rs_scan_in;

/* Columns of the Mamba-2 conv / scan input xBC: heads x head_dim + 2 x
 * groups x d_state. */
int64_t rs_ssm_conv_dim(const llmem_ssm_params *p);

/* rs_step_fn of the scan (ctx: a const rs_scan_in *): one token of
 * ref64_ssm_token. */
void rs_ssm_scan_step(void *ctx, double *state, int32_t tok, double *out_row);

/* Runs llmem_op_ssm_scan on be over rs's view of one state buffer holding
 * init (d's layout): y [tokens, heads x head_dim] as doubles and the
 * buffer's bytes after into state_after. Check assertions on failure. */
void rs_ssm_scan_run(llmem_backend *be, const rs_setup *rs,
                     const llmem_state_desc *d, const rs_scan_in *in,
                     const unsigned char *init, double *y,
                     unsigned char *state_after);

#endif

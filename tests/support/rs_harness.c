/* llmem tests: recurrent-state helpers of the op conformance suites (see
 * rs_harness.h). */
#include "support/rs_harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ubatch token after which checkpoint c is taken (-1: before the first). */
int32_t rs_ckpt_token(const rs_setup *rs, int32_t c) {
  return rs->n_tok - rs->n_ckpt + c;
}

int64_t rs_desc_elems(const llmem_state_desc *d) {
  int64_t n = 1;
  for (int32_t i = 0; i < d->n_dims; i++)
    n *= d->shape[i];
  return n;
}

/* A recurrent view of n_states states; buffers get the images init[j]
 * (n_slots slots of raw bytes). desc and bufs must outlive the view. */
void rs_build(th_ctx *c, llmem_view *view, llmem_rs_view *v, const rs_setup *rs,
              int32_t n_states, const llmem_state_desc *desc,
              llmem_buffer **bufs, const unsigned char *const *init) {
  memset(v, 0, sizeof *v);
  *view = llmem_view_make(LLMEM_VIEW_RECURRENT, v, sizeof *v, NULL);
  for (int32_t j = 0; j < n_states; j++) {
    size_t bytes = (size_t)(rs_desc_elems(&desc[j]) * rs->n_slots) *
                   llmem_dtype_size(desc[j].dtype);
    bufs[j] = th_pool(c, bytes, desc[j].dtype);
    ck_assert_int_eq(llmem_buffer_upload(bufs[j], 0, init[j], bytes), LLMEM_OK);
  }
  v->n_states = n_states;
  v->desc = desc;
  v->state = bufs;
  v->n_slots = rs->n_slots;
  v->n_seqs = rs->n_seqs;
  v->n_seq_tokens = rs->n_tok;
  v->n_ckpt = rs->n_ckpt;
  th_idx b = {0};
  v->src_slot = th_idx_add(&b, rs->src, rs->n_seqs);
  v->dst_slot = th_idx_add(&b, rs->dst, rs->n_seqs);
  v->ckpt_slot = th_idx_add(&b, rs->ckpt, rs->n_seqs * rs->n_ckpt);
  if (rs->snap) {
    v->snap_tok = th_idx_add(&b, rs->snap_tok, rs->n_seqs);
    v->snap_slot = th_idx_add(&b, rs->snap_slot, rs->n_seqs);
  }
  llmem_i32_table *tabs[] = {&v->src_slot, &v->dst_slot, &v->ckpt_slot, &v->snap_tok,
                             &v->snap_slot};
  view->idx = th_idx_finish(c, &b, tabs, rs->snap ? 5 : 3);
}

/* A state image: NaN everywhere, random values (rounded to t) in `live` slots.
 */
unsigned char *rs_state_image(th_ctx *h, ref64_rng *r,
                              const llmem_state_desc *d, int32_t n_slots,
                              const bool *live, double lo, double hi) {
  int64_t e = rs_desc_elems(d);
  size_t es = llmem_dtype_size(d->dtype);
  unsigned char *img = th_alloc(h, (size_t)(e * n_slots) * es + 4);
  uint32_t nan = llmem_nan_pattern(d->dtype);
  for (size_t i = 0; i < (size_t)(e * n_slots) * es; i += 4)
    memcpy(img + i, &nan, 4);
  for (int32_t s = 0; s < n_slots; s++)
    if (live[s])
      for (int64_t i = 0; i < e; i++)
        ref64_encode(ref64_round(ref64_uniform(r, lo, hi), d->dtype), d->dtype,
                     img + (size_t)(s * e + i) * es);
  return img;
}

unsigned char *rs_source_image(th_ctx *h, ref64_rng *r, const llmem_state_desc *d,
                               const rs_setup *rs, double lo, double hi)
{
    bool live[RS_MAXS * 6] = {0};
    ck_assert_int_le(rs->n_slots, RS_MAXS * 6);
    for (int32_t s = 0; s < rs->n_seqs; s++)
        if (rs->src[s] >= 0)
            live[rs->src[s]] = true;
    return rs_state_image(h, r, d, rs->n_slots, live, lo, hi);
}

void rs_decode_slot(const unsigned char *img, const llmem_state_desc *d,
                    int32_t slot, double *out) {
  int64_t e = rs_desc_elems(d);
  size_t es = llmem_dtype_size(d->dtype);
  for (int64_t i = 0; i < e; i++)
    out[i] = ref64_decode(img + (size_t)(slot * e + i) * es, d->dtype);
}

/* ---- references over a ubatch
 * ------------------------------------------------------------- */

/* The slot image the ubatch must leave, and which slots it writes; `states`
 * gets (n_seqs x (n_ckpt + 1)) states [elems] written: ckpts then dst. */
typedef void (*rs_step_fn)(void *ctx, double *state, int32_t tok,
                           double *out_row);

void rs_reference_ubatch(const rs_setup *rs, const llmem_state_desc *d,
                         const unsigned char *init, rs_step_fn step, void *ctx,
                         int64_t out_cols, double *out, double *want_slots,
                         bool *written) {
  int64_t e = rs_desc_elems(d);
  double *st = malloc((size_t)e * sizeof *st);
  for (int32_t s = 0; s < rs->n_slots; s++)
    written[s] = false;
  for (int32_t s = 0; s < rs->n_seqs; s++) {
    if (rs->src[s] >= 0)
      rs_decode_slot(init, d, rs->src[s],
                     st); /* sources read before any write */
    else
      memset(st, 0, (size_t)e * sizeof *st);
    for (int32_t c = 0; c < rs->n_ckpt; c++)
      if (rs_ckpt_token(rs, c) == -1 && rs->ckpt[s * rs->n_ckpt + c] >= 0) {
        memcpy(want_slots + rs->ckpt[s * rs->n_ckpt + c] * e, st,
               (size_t)e * sizeof *st);
        written[rs->ckpt[s * rs->n_ckpt + c]] = true;
      }
    for (int32_t t = 0; t < rs->n_tok; t++) {
      int32_t tok = s * rs->n_tok + t;
      step(ctx, st, tok, out + tok * out_cols);
      for (int32_t c = 0; c < rs->n_ckpt; c++)
        if (rs_ckpt_token(rs, c) == t && rs->ckpt[s * rs->n_ckpt + c] >= 0) {
          memcpy(want_slots + rs->ckpt[s * rs->n_ckpt + c] * e, st,
                 (size_t)e * sizeof *st);
          written[rs->ckpt[s * rs->n_ckpt + c]] = true;
        }
      if (rs->snap && rs->snap_slot[s] >= 0 && rs->snap_tok[s] == t) {
        memcpy(want_slots + rs->snap_slot[s] * e, st, (size_t)e * sizeof *st);
        written[rs->snap_slot[s]] = true;
      }
    }
    if (rs->dst[s] >= 0) {
      memcpy(want_slots + rs->dst[s] * e, st, (size_t)e * sizeof *st);
      written[rs->dst[s]] = true;
    }
  }
  free(st);
}

/* Checks a state buffer after the op: written slots against the reference
 * (exact bytes when `exact`, else the dtype's threshold), other slots
 * unchanged. */
void rs_check_slots(const rs_setup *rs, const llmem_state_desc *d,
                    const unsigned char *init, const unsigned char *got,
                    const double *want, const bool *written, bool exact,
                    bool vs_cpu, const char *what) {
  int64_t e = rs_desc_elems(d);
  size_t es = llmem_dtype_size(d->dtype);
  double *g = malloc((size_t)e * sizeof *g);
  unsigned char *enc = malloc((size_t)e * es);
  char msg[128];
  for (int32_t s = 0; s < rs->n_slots; s++) {
    const unsigned char *gs = got + (size_t)(s * e) * es;
    snprintf(msg, sizeof msg, "%s: slot %d", what, s);
    if (!written[s]) {
      th_expect_same_bytes(gs, init + (size_t)(s * e) * es, (size_t)e * es,
                           msg);
      continue;
    }
    if (exact) {
      for (int64_t i = 0; i < e; i++)
        ref64_encode(ref64_round(want[s * e + i], d->dtype), d->dtype,
                     enc + i * es);
      th_expect_same_bytes(gs, enc, (size_t)e * es, msg);
    } else {
      rs_decode_slot(got, d, s, g);
      th_expect_close(g, want + s * e, e, ref64_tol(d->dtype, vs_cpu), msg);
    }
  }
  free(enc);
  free(g);
}

int64_t rs_ssm_conv_dim(const llmem_ssm_params *p) {
  return (int64_t)p->n_heads * p->head_dim +
         2 * (int64_t)p->n_groups * p->d_state;
}

void rs_ssm_scan_step(void *ctx, double *state, int32_t tok, double *out_row) {
  const rs_scan_in *in = ctx;
  ref64_ssm_token(state, in->xbc + tok * rs_ssm_conv_dim(&in->p),
                  in->dt + (int64_t)tok * in->p.n_heads, in->a_log, in->d,
                  in->dt_bias, &in->p, out_row);
}

void rs_case_bufs_make(th_ctx *h, const rs_setup *rs, const llmem_state_desc *d,
                       int64_t n_out, rs_case_bufs *b) {
  ck_assert_int_le(rs->n_slots, RS_MAX_SLOTS);
  int64_t e = rs_desc_elems(d);
  b->out = th_vec(h, n_out);
  b->ref = th_vec(h, n_out);
  b->ref_cpu = th_vec(h, n_out);
  b->want = th_vec(h, e * rs->n_slots);
  b->img_bytes = (size_t)(e * rs->n_slots) * llmem_dtype_size(d->dtype) + 4;
  b->after = th_alloc(h, b->img_bytes);
  b->after_cpu = th_alloc(h, b->img_bytes);
  memset(b->written, 0, sizeof b->written);
}

void rs_ssm_scan_run(llmem_backend *be, const rs_setup *rs,
                     const llmem_state_desc *d, const rs_scan_in *in,
                     const unsigned char *init, double *y,
                     unsigned char *state_after) {
  th_ctx c;
  th_begin(&c, be);
  llmem_view view;
  llmem_rs_view rsd;
  llmem_buffer *bufs[1];
  rs_build(&c, &view, &rsd, rs, 1, d, bufs, &init);
  int32_t n_tok = rs->n_seqs * rs->n_tok, H = in->p.n_heads;
  llmem_tensor xbc = th_tensor(&c, LLMEM_DTYPE_F32, 2, n_tok,
                               (int32_t)rs_ssm_conv_dim(&in->p), 1);
  llmem_tensor dt = th_tensor(&c, LLMEM_DTYPE_F32, 2, n_tok, H, 1);
  llmem_tensor a = th_tensor(&c, in->pt, 1, H, 1, 1),
               dd = th_tensor(&c, in->pt, 1, H, 1, 1);
  llmem_tensor bias = th_tensor(&c, in->pt, 1, H, 1, 1);
  llmem_tensor yt = th_tensor(&c, LLMEM_DTYPE_F32, 3, n_tok, H, in->p.head_dim);
  th_set(&xbc, in->xbc);
  th_set(&dt, in->dt);
  th_set(&a, in->a_log);
  if (in->d)
    th_set(&dd, in->d);
  if (in->dt_bias)
    th_set(&bias, in->dt_bias);
  ck_assert_int_eq(llmem_op_ssm_scan(be, &in->p, &view, 0, &xbc, &dt, &a,
                                     in->d ? &dd : NULL,
                                     in->dt_bias ? &bias : NULL, &yt),
                   LLMEM_OK);
  th_get(&yt, y);
  ck_assert_int_eq(llmem_buffer_download(bufs[0], 0, state_after,
                                         llmem_buffer_size(bufs[0])),
                   LLMEM_OK);
  th_end(&c);
}

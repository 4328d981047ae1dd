/* llmem generate: sampling and speculative verification of one sequence's
 * step (examples/cli/sample.c). */
#ifndef LLMEM_CLI_SAMPLE_H
#define LLMEM_CLI_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sampler {
    double temp, top_p, min_p; /* temp 0: greedy */
    int32_t top_k;
    double repeat_penalty;     /* 1: off */
    int32_t repeat_last_n;     /* tokens of history the penalty looks at */
    int32_t V;
    /* scratch, [V] each */
    float *row;
    double *p;
    struct cand *cand;
    uint32_t *mark, epoch;
} sampler;

/* One sequence of `llmem generate`. */
typedef struct gen_seq {
    int32_t *hist; /* prompt + every emitted token */
    int32_t n_hist;
    int32_t produced;  /* emitted tokens */
    int32_t pos_last;  /* position of hist[n_hist - 1] (not yet evaluated) */
    int32_t n_draft;   /* draft tokens in this step */
    int32_t draft[64];
    uint64_t rng;
    bool active;    /* still generating */
    bool suspended; /* its sequence was removed to free pages; recomputed later */
} gen_seq;

/* Allocates the scratch of a sampler over V tokens. Returns 0 or 1. */
int sampler_init(sampler *sp, int32_t V);
void sampler_free(sampler *sp);

/* Prompt-lookup drafting (as in "prompt lookup decoding", Saxena 2023):
 * find the most recent earlier occurrence of the last n tokens (n from
 * max_ngram down to 1) and propose the tokens that followed it. Writes up to
 * k tokens to draft and returns how many were found. */
int32_t lookup_draft(const int32_t *h, int32_t n_h, int32_t max_ngram, int32_t k, int32_t *draft);

/* Verifies one sequence's step: rows[0..n_draft] are the logits after
 * [last, d1..dn]. Greedy: accept the longest prefix of drafts equal to the
 * argmax, then the argmax after it. Sampling: speculative rejection sampling
 * (Leviathan et al. 2023, Alg. 1; Chen et al. 2023) with a deterministic
 * draft: accept d_i with probability p_i(d_i), else sample from p_i with d_i
 * removed; if all are accepted, sample the bonus from p_n. Each row first
 * gets the repetition penalty over the history it follows.
 * Writes the emitted tokens to out and returns how many (1 + accepted). */
int32_t verify(sampler *sp, gen_seq *q, const float *rows, int32_t *out);

/* verify() over tokens already chosen on the device (llmem_model_decode_sample):
 * ids[0..n_draft] are the tokens drawn from the rows after [last, d1..dn].
 * Emits ids[j] for each j up to and including the first j with ids[j] !=
 * d_{j+1} (or j = n_draft). Greedy: the same as verify(). Sampling with a
 * deterministic draft this is speculative sampling too: a draw x ~ p_j equals
 * d with probability p_j(d) (accept), and otherwise is a draw from p_j with d
 * removed, renormalized (the residual of Leviathan et al. 2023, Alg. 1).
 * Writes the emitted tokens to out and returns how many (1 + accepted). */
int32_t verify_ids(const gen_seq *q, const int32_t *ids, int32_t *out);

#endif

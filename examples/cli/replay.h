/* llmem replay: the trace and prompt text (replay_trace.c), the continuous
 * batching scheduler (replay_sched.c), and the command with its report
 * (replay.c). */
#ifndef LLMEM_CLI_REPLAY_H
#define LLMEM_CLI_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/llmem.h"
#include "llmem/runtime.h"

#define TRACE_NAME "azure_llm_inference_conv_2023.csv"
#define TEXT_NAME "tinyshakespeare.txt"
#define TRACE_HEADER "TIMESTAMP,ContextTokens,GeneratedTokens"
#define MAX_LEN (1 << 24) /* tokens of a prompt part or a generation */
#define MAX_TEXT ((size_t)1 << 32) /* bytes of the prompt text (offsets are uint32) */

typedef struct request {
    int32_t n_body, n_gen;        /* trace lengths after --scale and the caps */
    int32_t parent;               /* --turns: the previous turn of its conversation, -1 none */
    int32_t n_head;               /* tokens before the body: the system prefix, or the
                                     whole previous turn (its prompt and generation) */
    uint32_t offset;              /* start of the body in the text */
    double arrival;               /* seconds after the start */
    int32_t *gen;                 /* [n_gen] generated token ids */
    double *lp;                   /* [n_gen] their log-probabilities (--logprobs), or NULL */
    int32_t n_done;               /* tokens generated so far */
    int32_t n_fed;                /* tokens in the sequence (memory) */
    int32_t n_fed_max;            /* most tokens it ever held (more is recompute) */
    int32_t seq;                  /* sequence id, -1 when not running */
    double t_first, t_last;
} request;

typedef struct replay {
    request *req;
    int32_t *gen; /* generated tokens of every request */
    double *lp;   /* their log-probabilities (--logprobs), or NULL */
    int32_t n_req, n_prefix, V;
    const unsigned char *text; /* shared prefix = text[0, n_prefix) */
    size_t text_len;
} replay;

/* How trace rows become requests. */
typedef struct trace_opts {
    int32_t limit, max_ctx, max_gen, seed;
    int32_t turns; /* consecutive rows form conversations of this many turns (1: none) */
    double scale, speedup;
} trace_opts;

typedef struct counters {
    int64_t prompt_tokens;     /* prompt tokens of the requests */
    int64_t gen_tokens;        /* tokens generated so far */
    int64_t recomputed_tokens; /* tokens submitted again after a preemption */
    int64_t preemptions, deferrals, steps;
    int32_t n_done;
} counters;

/* The scheduler's state: which requests run on which sequences. */
typedef struct sched {
    replay *rp;
    llmem_model *m;
    llmem_memory *mem;
    int32_t n_seq, n_ubatch;
    int32_t *running, n_running; /* request ids in admission order */
    int32_t *free_seq, n_free;
    int32_t *wait, wait_head, wait_n; /* ring buffer of request ids */
    int32_t *row_req;                 /* [n_seq] request of each output row */
    int32_t *chunk;                   /* [n_req] tokens of each request in the step */
    float *logits;                    /* [n_seq][V] */
    llmem_batch_buf *bb;
    llmem_batch_buf *probe; /* a new request's prompt, to ask the prefix cache (NULL: off) */
    counters c;
    bool check;
    bool *queued; /* [n_req] --turns: in the wait queue already */
} sched;

/* The default data file `name`: in $LLMEM_DATA_DIR, ../shared/data (from the
 * repository root), or the shared folder beside the built-in model's source
 * tree. Returns buf, or NULL when none is readable. */
const char *replay_data_path(const char *name, char *buf, size_t cap);
/* Reads the regular file `path` as the prompt text into *owned (freed by
 * the caller) and points rp->text at it. Returns 0, or 1 after a message. */
int replay_load_text(const char *path, replay *rp, unsigned char **owned);
/* Reads the trace CSV into rp->req (after the text is loaded). Returns 0,
 * or 1 after a message naming the file and line. */
int replay_read_trace(const char *path, const trace_opts *o, replay *rp);
/* Prompt length (system prefix or previous turn, + body) in tokens. */
int32_t replay_n_prompt(const replay *rp, const request *r);
/* Token j of the request's sequence: system prefix, body, then generated. */
int32_t replay_req_token(const replay *rp, const request *r, int32_t j);
/* Tokens the request's sequence will hold at most (the last generated token
 * is never fed). */
int64_t replay_req_max_len(const replay *rp, const request *r);

/* Serves every request of s->rp (at their arrival times when pace); fills
 * s->c and *wall (seconds). Progress on stderr when show. Returns 0 or 1. */
int replay_serve(sched *s, bool pace, bool show, double *wall);

#endif

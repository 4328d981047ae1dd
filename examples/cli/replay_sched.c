/* llmem replay: the continuous batching scheduler. Every step batches one
 * token per decoding request and prefill chunks of newly admitted ones; the
 * memory's plan decides admission, and a plan that does not fit defers the
 * newest admission or preempts the most recently admitted request (see
 * replay.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/cli/common.h"
#include "examples/cli/prefix_probe.h"
#include "examples/cli/replay.h"

/* ---- the scheduler ------------------------------------------------------------------------ */


static void wait_push_front(sched *s, int32_t r)
{
    s->wait_head = (s->wait_head + s->rp->n_req - 1) % s->rp->n_req;
    s->wait[s->wait_head] = r;
    s->wait_n++;
}

static int32_t wait_pop_front(sched *s)
{
    int32_t r = s->wait[s->wait_head];
    s->wait_head = (s->wait_head + 1) % s->rp->n_req;
    s->wait_n--;
    return r;
}

/* Frees the sequence of running[i] (finished or preempted) and drops it
 * from the running list, keeping the admission order. */
static int retire(sched *s, int32_t i)
{
    request *r = &s->rp->req[s->running[i]];
    llmem_status st = llmem_memory_seq_rm(s->mem, r->seq, -1, -1);
    if (st != LLMEM_OK)
        fprintf(stderr, "\nllmem replay: seq_rm(%d): %s\n", r->seq, llmem_status_str(st));
    s->free_seq[s->n_free++] = r->seq;
    r->seq = -1;
    r->n_fed = 0;
    s->n_running--;
    memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i) * sizeof *s->running);
    return st != LLMEM_OK;
}

/* Adds tokens [n_fed, n_fed + k) of request ri to the step; the last token
 * of its sequence so far needs an output row (the next token). */
static void add_chunk(sched *s, int32_t ri, int32_t k, int32_t *rows)
{
    request *r = &s->rp->req[ri];
    int32_t len = replay_n_prompt(s->rp, r) + r->n_done;
    for (int32_t t = 0; t < k; t++) {
        int32_t p = r->n_fed + t;
        llmem_batch_buf_add(s->bb, replay_req_token(s->rp, r, p), p, &r->seq, 1, p == len - 1);
    }
    if (r->n_fed + k == len)
        s->row_req[(*rows)++] = ri;
    s->chunk[ri] = k;
}

static int32_t left_of(const sched *s, const request *r)
{
    return replay_n_prompt(s->rp, r) + r->n_done - r->n_fed;
}

/* probe_token_fn over a replay request */
typedef struct req_ref {
    const replay *rp;
    const request *r;
} req_ref;

static int32_t ref_token(const void *ctx, int32_t p)
{
    const req_ref *q = ctx;
    return replay_req_token(q->rp, q->r, p);
}

/* Fills the step: one token per decoding request, then prefill chunks (in
 * admission order, then newly admitted requests) within n_ubatch tokens. */
static int32_t build(sched *s, bool admit, int32_t *admitted)
{
    int32_t budget = s->n_ubatch, rows = 0;
    llmem_batch_buf_clear(s->bb);
    for (int32_t i = 0; i < s->n_running; i++)
        s->chunk[s->running[i]] = 0;
    for (int32_t i = 0; i < s->n_running; i++)
        if (left_of(s, &s->rp->req[s->running[i]]) == 1) {
            add_chunk(s, s->running[i], 1, &rows);
            budget--;
        }
    for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
        int32_t left = left_of(s, &s->rp->req[s->running[i]]);
        if (left > 1) {
            int32_t k = left < budget ? left : budget;
            add_chunk(s, s->running[i], k, &rows);
            budget -= k;
        }
    }
    while (admit && budget > 0 && s->n_free > 0 && s->wait_n > 0) {
        int32_t ri = wait_pop_front(s);
        request *r = &s->rp->req[ri];
        r->seq = s->free_seq[--s->n_free];
        r->n_fed = 0;
        s->running[s->n_running++] = ri;
        (*admitted)++;
        /* the first chunk covers the cached prefix plus the budget */
        req_ref q = {s->rp, r};
        int32_t cost, k = prefix_first_chunk(s->mem, s->probe, s->n_ubatch, r->seq,
                                             left_of(s, r), budget, ref_token, &q, &cost);
        add_chunk(s, ri, k, &rows);
        budget -= cost;
    }
    return rows;
}

static int32_t argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            return -1;
        if (v[i] > v[best])
            best = i;
    }
    return best;
}

/* log-softmax(v)[t] in double: v[t] - max - log(sum exp(v - max)). */
static double log_prob(const float *v, int32_t n, int32_t t)
{
    double m = v[0], sum = 0;
    for (int32_t i = 1; i < n; i++)
        m = v[i] > m ? v[i] : m;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)v[i] - m);
    return (double)v[t] - m - log(sum);
}

/* Runs one step: builds it, and while its plan does not fit, takes the most
 * recently admitted request off (a deferral if it was admitted in this step
 * and holds nothing, else a preemption). Returns 0, or 1 after an error. */
static int step(sched *s, double t0)
{
    replay *rp = s->rp;
    int32_t admitted = 0, rows;
    bool admit = true;
    char err[512] = "";
    int32_t n_out = 0;
    llmem_status st;
    for (;;) {
        rows = build(s, admit, &admitted);
        if (s->n_running == 0)
            return 0;
        st = llmem_model_decode(s->m, llmem_batch_buf_get(s->bb), false, s->logits, s->n_seq,
                                &n_out, err, sizeof err);
        if (st != LLMEM_E_NO_SPACE || s->n_running == 1)
            break;
        if (admitted > 0) {
            admitted--;
            s->c.deferrals++;
        } else {
            s->c.preemptions++;
        }
        int32_t ri = s->running[s->n_running - 1];
        admit = false;
        if (retire(s, s->n_running - 1))
            return 1;
        wait_push_front(s, ri);
    }
    if (st != LLMEM_OK) { /* NO_SPACE here: one request alone does not fit */
        fprintf(stderr, "\nllmem replay: %s (%s)\n", err, llmem_status_str(st));
        return 1;
    }
    if (n_out != rows) {
        fprintf(stderr, "\nllmem replay: %d output rows, expected %d\n", n_out, rows);
        return 1;
    }
    s->c.steps++;
    double now = cli_now() - t0;
    for (int32_t i = 0; i < s->n_running; i++) {
        request *r = &rp->req[s->running[i]];
        int32_t lo = r->n_fed, hi = lo + s->chunk[s->running[i]];
        int32_t again = (hi < r->n_fed_max ? hi : r->n_fed_max) - lo;
        s->c.recomputed_tokens += again > 0 ? again : 0;
        r->n_fed = hi;
        r->n_fed_max = hi > r->n_fed_max ? hi : r->n_fed_max;
    }
    for (int32_t o = 0; o < rows; o++) {
        request *r = &rp->req[s->row_req[o]];
        int32_t t = argmax(s->logits + (size_t)o * (size_t)rp->V, rp->V);
        if (t < 0) {
            fprintf(stderr, "\nllmem replay: request %td: non-finite logits\n", r - rp->req);
            return 1;
        }
        if (r->lp)
            r->lp[r->n_done] = log_prob(s->logits + (size_t)o * (size_t)rp->V, rp->V, t);
        r->gen[r->n_done++] = t;
        if (r->n_done == 1)
            r->t_first = now;
        r->t_last = now;
        s->c.gen_tokens++;
    }
    for (int32_t i = s->n_running - 1; i >= 0; i--) {
        request *r = &rp->req[s->running[i]];
        if (r->n_done < r->n_gen)
            continue;
        if (retire(s, i))
            return 1;
        s->c.n_done++;
    }
    if (s->check && (st = llmem_memory_check(s->mem, err, sizeof err)) != LLMEM_OK) {
        fprintf(stderr, "\nllmem replay: memory check after step %lld: %s\n", (long long)s->c.steps,
                err);
        return 1;
    }
    return 0;
}

static void progress(const sched *s, double elapsed, bool final)
{
    const counters *c = &s->c;
    int32_t n_req = s->rp->n_req;
    llmem_model_stats ms;
    llmem_model_get_stats(s->m, &ms);
    char bar[31] = {0};
    memset(bar, '.', 30);
    memset(bar, '#', (size_t)(30 * (int64_t)c->n_done / n_req));
    double dt = elapsed > 0 ? elapsed : 1e-9;
    fprintf(stderr, "\rreplay [%s] %d/%d requests  %.0f tok/s computed  %.0f tok/s out  %lld "
            "preempted%s", bar, c->n_done, n_req, (double)ms.n_tokens / dt,
            (double)c->gen_tokens / dt, (long long)c->preemptions, final ? "\n" : "");
    fflush(stderr);
}

/* Serves every request; fills s->c. Returns 0 or 1. */
int replay_serve(sched *s, bool pace, bool show, double *wall)
{
    replay *rp = s->rp;
    int32_t next = 0;
    double t0 = cli_now(), t_show = 0;
    for (int32_t i = 0; i < rp->n_req; i++)
        s->c.prompt_tokens += replay_n_prompt(rp, &rp->req[i]);
    while (s->c.n_done < rp->n_req) {
        double now = cli_now() - t0;
        while (next < rp->n_req && (!pace || rp->req[next].arrival <= now) && !s->queued)
            s->wait[(s->wait_head + s->wait_n++) % rp->n_req] = next++;
        /* --turns: a turn is queued once it arrived and its previous turn
         * is done (later conversations do not wait behind it) */
        for (int32_t i = next; s->queued && i < rp->n_req && (!pace || rp->req[i].arrival <= now);
             i++) {
            const request *r = &rp->req[i];
            const request *q = r->parent >= 0 ? &rp->req[r->parent] : NULL;
            if (s->queued[i] || (q && (q->n_done < q->n_gen || q->seq >= 0)))
                continue;
            s->queued[i] = true;
            s->wait[(s->wait_head + s->wait_n++) % rp->n_req] = i;
            if (i == next)
                next++;
        }
        while (s->queued && next < rp->n_req && s->queued[next])
            next++;
        if (s->n_running == 0 && s->wait_n == 0) {
            double dt = rp->req[next].arrival - now; /* idle until the next arrival */
            struct timespec ts = {(time_t)dt, (long)((dt - floor(dt)) * 1e9)};
            if (dt > 0)
                nanosleep(&ts, NULL);
            continue;
        }
        if (step(s, t0))
            return 1;
        now = cli_now() - t0;
        if (show && now - t_show > 0.2 && s->c.n_done < rp->n_req) {
            progress(s, now, false);
            t_show = now;
        }
    }
    *wall = cli_now() - t0;
    if (show)
        progress(s, *wall, true);
    return 0;
}

// rounds.c - one round of the scheduler: every stepping slot drafts
// (sd_gen_step_begin, its tree capped by the draft budget), every planned
// prompt chunk joins, ONE sd_batcher_forward evaluates them all, then every
// slot verifies, commits and emits (sd_gen_step_end). On a pipeline's rank 0
// (serve --pp R), groups of slots in flight round the ranks instead
// (micro-batches, below), and a pipeline's fault answers every request.
// Only the scheduler thread (sched.c) calls these.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/sched.h"
#include "serve/split.h"

// ---------------------------------------------------------------- passes

// Contract in sched.h.
// Swaps entries a and b of the round's pass arrays.
static void swap_pass(sv_server *s, int a, int b) {
    sv_slot *sl = s->pass_sl[a];
    sd_session *ss = s->pass_ss[a];
    sd_batch bs = s->pass_bs[a];
    s->pass_sl[a] = s->pass_sl[b], s->pass_ss[a] = s->pass_ss[b], s->pass_bs[a] = s->pass_bs[b];
    s->pass_sl[b] = sl, s->pass_ss[b] = ss, s->pass_bs[b] = bs;
}

void sv_forward_many(sv_server *s, int n, char (*errs)[256], int step) {
    long passes = 0, rows = 0, slots = 0, fallbacks = 0;
    double t0 = sd_time_ms();
    int i = 0;
    while (i < n) {
        int j = i, total = 0;
        while (j < n && (j == i || total + s->pass_bs[j].n <= s->batcher_nodes)) total += s->pass_bs[j++].n;
        if (j - i > 1 && s->batcher) {
            int rc = s->forward_many
                         ? s->forward_many(s->batcher, s->pass_ss + i, s->pass_bs + i, j - i, errs[i], sizeof errs[i])
                         : sd_batcher_forward(s->batcher, s->pass_ss + i, s->pass_bs + i, j - i, errs[i], sizeof errs[i]);
            const int f = rc < 0 ? sd_batcher_failed_batch(s->batcher) : -1;
            if (f >= 0) {   // that batch alone is bad (nothing was written): it fails, the others go again
                char msg[256];
                snprintf(msg, sizeof msg, "%s", errs[i]);
                swap_pass(s, i + f, n - 1);
                snprintf(errs[n - 1], sizeof errs[n - 1], "%s", msg);
                s->pass_ok[n - 1] = 0;
                n--;
                continue;
            }
            if (rc == 0) {
                for (int k = i; k < j; k++) s->pass_ok[k] = 1;
                passes++;
                rows += total;
                slots += j - i;
                i = j;
                continue;
            }
            fallbacks++;   // the call as a whole failed: each batch alone
        }
        for (int k = i; k < j; k++) {
            s->pass_ok[k] = sd_session_forward(s->pass_ss[k], &s->pass_bs[k], errs[k], sizeof errs[k]) == 0;
            passes++;
        }
        rows += total;
        slots += j - i;
        i = j;
    }
    double dt = sd_time_ms() - t0;
    pthread_mutex_lock(&s->mu);
    if (step) s->m.pass_ms += dt;
    else s->m.prefill_ms += dt;
    if (step) {
        s->m.pass_forwards += passes;
        s->m.pass_rows += rows;
        s->m.pass_slots += slots;
    }
    s->m.pass_fallbacks += fallbacks;
    pthread_mutex_unlock(&s->mu);
}


// The draft budget of this round (budget.h): caps on the trees of the slots
// that step, when they share the pass with other rows; a slot alone drafts
// its method's full shape.
static int slot_steps(const sv_slot *sl) { return sl->state == SV_SLOT_STEPPING; }

// mask: the slots of this pass (a group in flight), or NULL for all.
static void plan_budget(sv_server *s, const char *mask) {
    if (!s->budget_caps) return;
    int n = 0, base = 0, cut = 0;
    const sv_accept **acc = s->budget_acc;
    for (int i = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        if (mask && !mask[i]) continue;
        if (sl->state == SV_SLOT_PROMPT && s->o->fast_prompt) base += s->pf_len[i];
        if (!slot_steps(sl)) continue;
        acc[n] = &sl->acc;
        s->budget_max[n++] = sl->max_nodes;
        base++;
    }
    if (n == 0) return;
    if (base > 1) sv_budget_plan(s->cost, base, n, acc, &s->budget_pool, s->budget_max, s->budget_scratch, s->budget_caps);
    for (int i = 0, k = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        if (!slot_steps(sl) || (mask && !mask[i])) continue;
        const int cap = base > 1 ? s->budget_caps[k] : 0;
        k++;
        sd_gen_set_step_limit(sl->g, cap);
        if (cap > 0 && cap < sl->max_nodes) cut += sl->max_nodes - cap;
    }
    pthread_mutex_lock(&s->mu);
    s->m.budget_cut += cut;
    pthread_mutex_unlock(&s->mu);
}

// Verifies, commits and emits the step of slot sl (its batch evaluated, or
// none needed): sd_gen_step_end. Returns the tokens emitted.
static long step_end(sv_server *s, sv_slot *sl) {
    char err[256];
    sd_step st;
    sl->in_step = 0;
    if (sd_gen_step_end(sl->g, &st, err, sizeof err) < 0 || sv_slot_emit(s, sl, &st, err, sizeof err) < 0) {
        sv_slot_finish(s, sl, err, 500);
        return 0;
    }
    sv_accept_observe(&sl->acc, &s->budget_pool, sd_gen_get_stats(sl->g), &st);
    if (sd_gen_finished(sl->g) != SD_FINISH_NONE) sv_slot_finish(s, sl, NULL, 0);
    return st.n_tokens;
}

// The round's figures: tokens emitted, its time, the live rate.
static void round_done(sv_server *s, long emitted, double t_round) {
    double now = sd_time_ms();
    pthread_mutex_lock(&s->mu);
    s->m.emitted_tokens += emitted;
    s->m.round_ms += now - t_round;
    s->m.tps_tokens += emitted;
    if (s->m.tps_t0 == 0) s->m.tps_t0 = now;
    if (now - s->m.tps_t0 >= 1000.0) {
        s->m.tps = s->m.tps_tokens * 1000.0 / (now - s->m.tps_t0);
        s->m.tps_t0 = now;
        s->m.tps_tokens = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

// ---------------------------------------------------------------- micro-batches in flight
//
// A pipeline's rank 0 (serve --pp R, docs/mpi.md) splits the slots into
// groups and keeps up to n_groups of their passes in flight: a group's
// round begins (draft, rank 0's layers, the message sent down the ring,
// s->group_begin) while earlier groups' are still in the ring, and ends
// (the answer, the output layer, verify, commit, emit: s->group_end) when
// its answer is back, oldest first. While rank k works on one group, rank
// k-1 works on the next. Each slot's batch is evaluated by the same kernels
// on the same rows as in a round of all slots (the batcher gives every
// session's rows the bits of its own forward), so a group's make-up never
// changes a slot's text. Only the scheduler thread runs these.

typedef struct sv_flight {
    int n;                 // slots in it (entries of sl)
    sv_slot **sl;          // (n_slots) its slots, in pass order
    int n_tickets;         // passes (a group larger than the batcher goes as several)
    int *ticket, *lo;      // (n_slots) each pass's ticket and first entry (lo[n_tickets] = n)
    double ms;             // time rank 0 spent beginning and ending it (ms)
    long rows;             // nodes in all
} sv_flight;

typedef struct sv_pipe {
    sv_flight *fl;         // (G) a FIFO of the groups in flight
    int head, count;
    int slots_out;         // slots in flight
    char *mask;            // (n_slots) the slots of the group being begun
} sv_pipe;

static sv_pipe *pipe_new(sv_server *s) {
    const int G = s->n_groups, N = s->n_slots;
    sv_pipe *p = calloc(1, sizeof *p);
    if (!p || !(p->fl = calloc((size_t)G, sizeof *p->fl)) || !(p->mask = calloc((size_t)N, 1))) goto oom;
    for (int g = 0; g < G; g++) {
        sv_flight *f = &p->fl[g];
        f->sl = calloc((size_t)N, sizeof *f->sl);
        f->ticket = calloc((size_t)N, sizeof *f->ticket);
        f->lo = calloc((size_t)N + 1, sizeof *f->lo);
        if (!f->sl || !f->ticket || !f->lo) goto oom;
    }
    return p;
oom:
    sv_pipe_free(p, G);
    return NULL;
}

void sv_pipe_free(sv_pipe *p, int n_groups) {
    if (!p) return;
    for (int g = 0; p->fl && g < n_groups; g++) {
        free(p->fl[g].sl);
        free(p->fl[g].ticket);
        free(p->fl[g].lo);
    }
    free(p->fl);
    free(p->mask);
    free(p);
}

// A slot that can join the next group: not in flight, and stepping or
// with prompt tokens left (8-bit prompts ride in the passes; float ones go
// through sv_prefill_round's own passes).
static int pipe_ready(const sv_server *s, const sv_slot *sl) {
    if (sl->flight) return 0;
    if (sl->state == SV_SLOT_STEPPING) return 1;
    return sl->state == SV_SLOT_PROMPT && s->o->fast_prompt && sd_gen_prompt_left(sl->g) > 0;
}

// An entry of the pass arrays failed before its pass: it ends.
static void pipe_fail(sv_server *s, sv_slot *sl, const char *err) {
    sl->flight = 0;
    if (sl->state == SV_SLOT_PROMPT) {
        sv_prefill_end(s, sl, 0, err);
    } else {
        sl->in_step = 0;
        sv_slot_finish(s, sl, err, 500);
    }
}

// Begins the next group: the ready slots, as many as an even share of the
// slots at work over the groups. Returns 1 when slots changed state (a group
// sent, or steps that needed no forward ended), 0 when none was ready.
static int pipe_begin(sv_server *s, long *emitted) {
    sv_pipe *p = s->pipe;
    char err[256];
    int ready = 0;
    for (int i = 0; i < s->n_slots; i++) ready += pipe_ready(s, &s->slots[i]);
    if (!ready) return 0;
    const int share = (ready + p->slots_out + s->n_groups - 1) / s->n_groups;
    int take = SD_MIN(ready, SD_MAX(share, 1)), budget = SV_PREFILL_BUDGET;
    for (int i = 0; i < s->n_slots; i++) {   // the group, and its prompt chunks (the oldest requests first is
        sv_slot *sl = &s->slots[i];           // what the slot order gives, roughly)
        s->pf_len[i] = 0;
        p->mask[i] = take > 0 && pipe_ready(s, sl);
        if (!p->mask[i]) continue;
        take--;
        if (sl->state == SV_SLOT_PROMPT) {
            s->pf_len[i] = SD_MIN(SD_MIN(SV_PREFILL_CHUNK, sd_gen_prompt_left(sl->g)), budget);
            budget -= s->pf_len[i];
            if (!s->pf_len[i]) p->mask[i] = 0;
        }
    }
    plan_budget(s, p->mask);
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) {   // draft (begin)
        sv_slot *sl = &s->slots[i];
        if (!p->mask[i]) continue;
        sl->in_step = 0;
        if (sl->state == SV_SLOT_PROMPT) {
            n = sv_prefill_join(s, sl, s->pf_len[i], n);
            continue;
        }
        if (sd_gen_step_begin(sl->g, &sl->b, err, sizeof err) < 0) {
            sv_slot_finish(s, sl, err, 500);
            continue;
        }
        sl->in_step = 1;
        if (sl->b.n == 0) {   // nothing to evaluate: the step ends at once
            *emitted += step_end(s, sl);
            continue;
        }
        s->pass_sl[n] = sl;
        s->pass_ss[n] = sl->s;
        s->pass_bs[n] = sl->b;
        n++;
    }
    if (n == 0) return 1;
    sv_flight *f = &p->fl[(p->head + p->count) % s->n_groups];
    const double t0 = sd_time_ms();
    f->n = f->n_tickets = 0;
    f->rows = 0;
    int i = 0;
    while (i < n) {   // passes of at most the batcher's nodes
        int j = i, total = 0;
        while (j < n && (j == i || total + s->pass_bs[j].n <= s->batcher_nodes)) total += s->pass_bs[j++].n;
        const int t = s->group_begin(s->batcher, s->pass_ss + i, s->pass_bs + i, j - i, err, sizeof err);
        if (t < 0) {   // nothing was sent: a refused batch fails alone, else the whole pass
            const int bad = sd_batcher_failed_batch(s->batcher);
            for (int k = i; k < j; k++) {
                if (bad >= 0 && k != i + bad) continue;
                pipe_fail(s, s->pass_sl[k], err);
                s->pass_sl[k] = NULL;
            }
            int w = i;   // keep the others, in order
            for (int k = i; k < n; k++)
                if (s->pass_sl[k]) s->pass_sl[w] = s->pass_sl[k], s->pass_ss[w] = s->pass_ss[k], s->pass_bs[w++] = s->pass_bs[k];
            n = w;
            continue;
        }
        f->lo[f->n_tickets] = f->n;
        f->ticket[f->n_tickets++] = t;
        for (int k = i; k < j; k++) {
            s->pass_sl[k]->flight = 1;
            f->sl[f->n++] = s->pass_sl[k];
        }
        f->rows += total;
        i = j;
    }
    f->lo[f->n_tickets] = f->n;
    f->ms = sd_time_ms() - t0;
    if (f->n) {
        p->count++;
        p->slots_out += f->n;
    }
    return 1;
}

// Ends the oldest group in flight: its answers, then every slot's step.
static void pipe_end(sv_server *s, long *emitted) {
    sv_pipe *p = s->pipe;
    sv_flight *f = &p->fl[p->head];
    const double t0 = sd_time_ms();
    for (int t = 0; t < f->n_tickets; t++) {
        char err[256];
        const int ok = s->group_end(s->batcher, f->ticket[t], err, sizeof err) == 0;
        for (int k = f->lo[t]; k < f->lo[t + 1]; k++) {
            sv_slot *sl = f->sl[k];
            if (!ok) {
                pipe_fail(s, sl, err);
                continue;
            }
            sl->flight = 0;
            if (sl->state == SV_SLOT_PROMPT) sv_prefill_end(s, sl, 1, "");
            else *emitted += step_end(s, sl);
        }
    }
    const double ms = f->ms + sd_time_ms() - t0;
    p->head = (p->head + 1) % s->n_groups;
    p->count--;
    p->slots_out -= f->n;
    pthread_mutex_lock(&s->mu);
    s->m.pass_ms += ms;
    s->m.pass_forwards += f->n_tickets;
    s->m.pass_rows += f->rows;
    s->m.pass_slots += f->n;
    pthread_mutex_unlock(&s->mu);
}

// One turn of the scheduler with groups in flight: begin a group when fewer
// than n_groups are out and a slot is ready, else end the oldest. Returns 0
// when the classic round must run instead (the split generations' work, or
// no memory): the groups in flight end first.
static int pipe_round(sv_server *s) {
    if (!s->pipe && !(s->pipe = pipe_new(s))) return 0;
    sv_pipe *p = s->pipe;
    long emitted = 0;
    const double t0 = sd_time_ms();
    pthread_mutex_lock(&s->mu);
    const int split = sv_split_has_work(s);
    pthread_mutex_unlock(&s->mu);
    if (split) {
        while (p->count) pipe_end(s, &emitted);
        round_done(s, emitted, t0);
        return 0;
    }
    if (!(p->count < s->n_groups && pipe_begin(s, &emitted)) && p->count) pipe_end(s, &emitted);
    round_done(s, emitted, t0);
    return 1;
}

// ---------------------------------------------------------------- a pipeline's fault

void sv_pipe_fault(void *arg, const char *msg) {
    sv_server *s = arg;
    char why[256];
    snprintf(why, sizeof why, "%.200s; the server stops", msg);
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;   // new requests get 503
    sv_req *rs[SV_FAULT_MAX];
    int n = 0;
    while (s->q_len > 0 && n < SV_FAULT_MAX) {   // the queue
        rs[n++] = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; s->slots && i < s->n_slots && n < SV_FAULT_MAX; i++)   // the requests in the slots
        if (s->slots[i].r) rs[n++] = s->slots[i].r;
    for (int i = 0; i < n; i++) {   // every one answered with the error (503), not a closed connection
        sv_req *r = rs[i];
        pthread_mutex_lock(&r->mu);
        if (!r->done) {
            r->done = 1;
            r->err_status = 503;
            snprintf(r->error, sizeof r->error, "%s", why);
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
    }
    sv_split_fail_all(s, why);
    fprintf(stderr, "specdec serve: %s: answered %d requests in flight with the error\n", msg, n);
    // the connection threads send the answers: wait for them (SV_FAULT_DRAIN_MS at most)
    for (int waited = 0; atomic_load(&s->requests_open) > 0 && waited < SV_FAULT_DRAIN_MS; waited += 10) {
        const struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

// One round: a step of every active slot that has its prompt. Every slot
// drafts (begin), then the batches of all slots that need a forward are
// evaluated together in one sd_batcher_forward (each slot's nodes attend
// only to its own cache; bit-identical to separate forwards), then every
// slot verifies, commits and emits (end). With a pipeline's groups in flight
// (s->n_groups > 1) a round is one turn of pipe_round instead.
void sv_round_step(sv_server *s) {
    char err[256];
    if (s->n_groups > 1 && s->group_begin && pipe_round(s)) return;   // micro-batches in flight (above)
    double t_round = sd_time_ms();
    int n = 0;
    if (s->o->fast_prompt) sv_prefill_plan(s, s->pf_len);
    plan_budget(s, NULL);
    for (int i = 0; i < s->n_slots; i++) {   // 1. draft (begin)
        sv_slot *sl = &s->slots[i];
        sl->in_step = 0;
        if (sl->state == SV_SLOT_PROMPT) {   // with --fast-prompt, a planned prompt chunk rides along
            if (s->o->fast_prompt && s->pf_len[i]) n = sv_prefill_join(s, sl, s->pf_len[i], n);
            continue;
        }
        if (sl->state != SV_SLOT_STEPPING) continue;
        if (sd_gen_step_begin(sl->g, &sl->b, err, sizeof err) < 0) {
            sv_slot_finish(s, sl, err, 500);
            continue;
        }
        sl->in_step = 1;
        if (sl->b.n > 0) {
            s->pass_sl[n] = sl;
            s->pass_ss[n] = sl->s;
            s->pass_bs[n] = sl->b;
            n++;
        }
    }
    n = sv_split_join(s, n);   // the split generations' trees and prompt chunks (split.c)
    if (n > 0) {   // 2. the target: one pass over every slot's batch
        char(*errs)[256] = s->pass_err;
        sv_forward_many(s, n, errs, 1);
        for (int k = 0; k < n; k++) {
            sv_slot *sl = s->pass_sl[k];
            if (sl->split) continue;   // sv_split_end
            if (sl->state == SV_SLOT_PROMPT) {   // a folded prompt chunk
                sv_prefill_end(s, sl, s->pass_ok[k], errs[k]);
            } else if (!s->pass_ok[k]) {
                sl->in_step = 0;
                sv_slot_finish(s, sl, errs[k], 500);
            }
        }
    }
    sv_split_end(s, n);
    long emitted = 0;
    for (int i = 0; i < s->n_slots; i++)   // 3. verify, commit, emit (end)
        if (s->slots[i].in_step) emitted += step_end(s, &s->slots[i]);
    round_done(s, emitted, t_round);
}

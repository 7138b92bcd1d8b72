// sched.c - the scheduler thread and its queue: N slots on one model and
// one thread pool, a bounded FIFO of waiting requests assigned to free slots
// (the longest shared prefix first), start-up and shutdown. A slot's life is
// slots.c, a round rounds.c, the prompt chunks prefill.c.
//
// A slot is a session (its own KV cache on the shared pool), the tokens that
// cache holds, a drafter kept between requests (rebuilt when a request asks
// for another method), and while it serves a request: a sampler and an
// sd_gen. Only this thread touches slots; connection threads see requests
// (sv_req) and the queue, under the server's and the request's mutexes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "utf8.h"
#include "serve/sched.h"
#include "serve/split.h"

// ---------------------------------------------------------------- the thread

// The draft budget's state, and the target's cost curve when no automatic
// method measured it: on slot 0's session, still empty.
static int budget_start(sv_server *s, char *err, size_t errlen) {
    s->budget_scratch = malloc(sv_budget_scratch_size(s->n_slots));
    s->budget_caps = calloc((size_t)s->n_slots, sizeof *s->budget_caps);
    s->budget_max = calloc((size_t)s->n_slots, sizeof *s->budget_max);
    s->budget_acc = calloc((size_t)s->n_slots, sizeof *s->budget_acc);
    if (!s->budget_scratch || !s->budget_caps || !s->budget_max || !s->budget_acc) return snprintf(err, errlen, "out of memory"), -1;
    for (int i = 0; i < s->n_slots; i++) sv_accept_init(&s->slots[i].acc);
    sv_accept_init(&s->budget_pool);
    if (!s->cost) {
        const double t0 = sd_time_ms();
        if (sd_cost_curve_new(&s->cost, s->slots[0].s, 32, err, errlen) < 0) return -1;
        char desc[128];
        sd_cost_curve_describe(s->cost, desc, sizeof desc);
        fprintf(stderr, "specdec serve: draft budget: the target's forward costs %s (measured in %.1f s)\n", desc,
                (sd_time_ms() - t0) / 1000.0);
    }
    return 0;
}

// Moves queued requests to free slots (under s->mu): the oldest request
// first, to the free slot whose cache shares the longest prefix with its
// prompt (least recently used on ties). Cancelled requests are dropped.
static void assign(sv_server *s) {
    while (s->q_len > 0) {
        sv_req *r = s->queue[s->q_head];
        if (r->cancelled) {
            s->q_head = (s->q_head + 1) % s->q_cap;
            s->q_len--;
            s->m.requests_error++;
            pthread_mutex_lock(&r->mu);
            r->done = 1;
            snprintf(r->error, sizeof r->error, "cancelled");
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            sv_req_unref(r);
            continue;
        }
        sv_slot *best = NULL;
        int best_lcp = -1;
        for (int i = 0; i < s->n_slots; i++) {
            sv_slot *sl = &s->slots[i];
            if (sl->state != SV_SLOT_FREE) continue;
            int lcp = sv_common_prefix(sl->cache, sl->n_cache, r->prompt, r->n_prompt);
            if (lcp > best_lcp || (lcp == best_lcp && sl->last_used < best->last_used)) {
                best = sl;
                best_lcp = lcp;
            }
        }
        if (!best) return;
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        best->r = r;
        best->state = SV_SLOT_STARTING;
        s->m.busy_slots++;
    }
}

static int n_active(const sv_server *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].state != SV_SLOT_FREE;
    return n;
}

// Fails every queued request (shutdown).
static void drain_queue(sv_server *s) {
    while (s->q_len > 0) {
        sv_req *r = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->q_cap;
        s->q_len--;
        pthread_mutex_lock(&r->mu);
        r->done = 1;
        r->err_status = 503;
        snprintf(r->error, sizeof r->error, "the server is shutting down");
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        sv_req_unref(r);
    }
}

static void *sched_main(void *arg) {
    sv_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->q_len == 0 && n_active(s) == 0 && !sv_split_has_work(s)) {
            if (!s->on_idle) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            struct timespec ts;   // idle with a pipeline: its keep-alive every 2 s or so
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 2;
            if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0) {
                pthread_mutex_unlock(&s->mu);
                s->on_idle();
                pthread_mutex_lock(&s->mu);
            }
        }
        int stopping = s->stopping;
        if (stopping) drain_queue(s);
        else assign(s);
        int split_work = sv_split_has_work(s);
        pthread_mutex_unlock(&s->mu);
        if (stopping && split_work) sv_split_fail_all(s, "the server is shutting down");
        for (int i = 0; i < s->n_slots; i++) {
            sv_slot *sl = &s->slots[i];
            if (stopping && sl->state == SV_SLOT_STARTING) {
                sv_slot_finish(s, sl, "the server is shutting down", 503);
                continue;
            }
            if (sl->state == SV_SLOT_STARTING) sv_slot_start(s, sl);
            if (stopping && sl->state == SV_SLOT_STEPPING) sd_gen_stop(sl->g);   // streams end cleanly with what they have
        }
        sv_prefill_round(s, stopping);
        if (n_active(s) > 0 || (split_work && !stopping)) sv_round_step(s);
        if (stopping && n_active(s) == 0) break;
    }
    return NULL;
}

int sv_submit(sv_server *s, sv_req *r, char *err, size_t errlen) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return snprintf(err, errlen, "the server is shutting down"), -1;
    }
    // Free slots take requests at once; the queue holds the rest.
    int free_slots = s->n_slots - s->m.busy_slots;
    if (s->q_len >= s->q_cap || s->q_len >= free_slots + s->o->n_queue) {
        s->m.rejected_queue_full++;
        int busy = s->m.busy_slots, q = s->q_len;
        pthread_mutex_unlock(&s->mu);
        return snprintf(err, errlen, "the server is busy: %d of %d slots busy and %d requests queued (--queue %d); "
                        "retry later", busy, s->n_slots, q, s->o->n_queue), -1;
    }
    sv_req_ref(r);
    r->t_enqueue = sd_time_ms();
    s->queue[(s->q_head + s->q_len) % s->q_cap] = r;
    s->q_len++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sv_metrics_get(sv_server *s, sv_metrics *m) {
    pthread_mutex_lock(&s->mu);
    *m = s->m;
    m->queued = s->q_len;
    m->n_slots = s->n_slots;
    double now = sd_time_ms();   // idle: the window's rate decays towards 0
    if (m->tps_t0 > 0 && now - m->tps_t0 >= 2000.0) m->tps = m->tps_tokens * 1000.0 / (now - m->tps_t0);
    pthread_mutex_unlock(&s->mu);
}

int sv_sched_start(sv_server *s, char *err, size_t errlen) {
    const sv_opts *o = s->o;
    s->n_slots = o->n_slots;
    s->q_cap = o->n_queue + o->n_slots;
    s->queue = calloc((size_t)s->q_cap, sizeof *s->queue);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    if (!s->queue || !s->slots) return snprintf(err, errlen, "out of memory"), -1;
    for (int i = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        sl->id = i;
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = o->n_ctx;
        sp.n_batch = SV_N_BATCH;
        sp.pool = s->pool;
        if (sd_session_new(&sl->s, s->model, &sp, err, errlen) < 0) return -1;
        if (s->on_session && s->on_session(sl->s, err, errlen) < 0) return -1;
        s->n_ctx = sd_session_n_ctx(sl->s);
        sl->cache = malloc(sizeof(int32_t) * (size_t)s->n_ctx);
        sl->ends = malloc(sizeof(size_t) * (SV_N_BATCH + 2));
        if (!sl->cache || !sl->ends) return snprintf(err, errlen, "out of memory"), -1;
    }
    s->m.n_slots = s->n_slots;
    if (sv_split_init(s, o->split_max, o->split_idle, err, errlen) < 0) return -1;
    const int n_split = s->split ? s->split->n : 0;
    // One batcher for the scheduler's passes: room for every slot's tree and
    // auxiliary nodes of the default method (a request asking for a larger
    // tree, or a round beyond that, is split into several passes).
    int per_slot = 1;
    if (s->def_plan.spec) per_slot = SD_MIN(s->def_plan.step_rows, SV_N_BATCH);
    per_slot = SD_MAX(per_slot, SV_PREFILL_CHUNK / 4);
    s->batcher_nodes = SD_MIN(SD_MAX(s->n_slots * per_slot, SV_PREFILL_CHUNK), SV_PASS_MAX_NODES);
    s->pass_sl = calloc((size_t)(s->n_slots + n_split), sizeof *s->pass_sl);
    s->pass_ss = calloc((size_t)(s->n_slots + n_split), sizeof *s->pass_ss);
    s->pass_bs = calloc((size_t)(s->n_slots + n_split), sizeof *s->pass_bs);
    s->pass_ok = calloc((size_t)(s->n_slots + n_split), sizeof *s->pass_ok);
    s->pass_err = calloc((size_t)(s->n_slots + n_split), sizeof *s->pass_err);
    s->pf_len = calloc((size_t)s->n_slots, sizeof *s->pf_len);
    if (!s->pass_sl || !s->pass_ss || !s->pass_bs || !s->pass_ok || !s->pass_err || !s->pf_len) return snprintf(err, errlen, "out of memory"), -1;
    if (s->n_slots + n_split > 1 && sd_batcher_new(&s->batcher, s->model, s->pool, s->batcher_nodes, err, errlen) < 0) return -1;
    if (o->draft_budget && s->n_slots > 1 && budget_start(s, err, errlen) < 0) return -1;
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0)
        return snprintf(err, errlen, "cannot start the scheduler thread"), -1;
    s->thread_started = 1;
    return 0;
}

void sv_sched_stop(sv_server *s) {
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        s->thread_started = 0;
    }
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        sd_gen_free(sl->g);
        sd_sampler_free(sl->smp);
        sd_drafter_free(sl->d);
        sd_session_free(sl->s);
        free(sl->cache);
        free(sl->ends);
        free(sl->text);
        free(sl->kind);
    }
    sv_pipe_free(s->pipe, s->n_groups);
    s->pipe = NULL;
    sd_batcher_free(s->batcher);
    s->batcher = NULL;
    free(s->pass_sl);
    free(s->pass_ss);
    free(s->pass_bs);
    free(s->pass_ok);
    free(s->pass_err);
    free(s->pf_len);
    free(s->budget_scratch);
    free(s->budget_caps);
    free(s->budget_max);
    free(s->budget_acc);
    s->budget_acc = NULL;
    s->budget_scratch = NULL;
    s->budget_caps = s->budget_max = NULL;
    s->pf_len = NULL;
    s->pass_sl = NULL;
    s->pass_ss = NULL;
    s->pass_bs = NULL;
    s->pass_ok = NULL;
    free(s->slots);
    free(s->queue);
    s->slots = NULL;
    s->queue = NULL;
}

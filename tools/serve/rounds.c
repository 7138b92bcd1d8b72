// rounds.c - one round of the scheduler: every stepping slot drafts
// (sd_gen_step_begin, its tree capped by the draft budget), every planned
// prompt chunk joins, ONE sd_batcher_forward evaluates them all, then every
// slot verifies, commits and emits (sd_gen_step_end). Only the scheduler
// thread (sched.c) calls these.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void plan_budget(sv_server *s) {
    if (!s->budget_caps) return;
    int n = 0, base = 0, cut = 0;
    const sv_accept **acc = s->budget_acc;
    for (int i = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
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
        if (!slot_steps(sl)) continue;
        const int cap = base > 1 ? s->budget_caps[k] : 0;
        k++;
        sd_gen_set_step_limit(sl->g, cap);
        if (cap > 0 && cap < sl->max_nodes) cut += sl->max_nodes - cap;
    }
    pthread_mutex_lock(&s->mu);
    s->m.budget_cut += cut;
    pthread_mutex_unlock(&s->mu);
}

// One round: a step of every active slot that has its prompt. Every slot
// drafts (begin), then the batches of all slots that need a forward are
// evaluated together in one sd_batcher_forward (each slot's nodes attend
// only to its own cache; bit-identical to separate forwards), then every
// slot verifies, commits and emits (end).
void sv_round_step(sv_server *s) {
    char err[256];
    double t_round = sd_time_ms();
    int n = 0;
    if (s->o->fast_prompt) sv_prefill_plan(s, s->pf_len);
    plan_budget(s);
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
    for (int i = 0; i < s->n_slots; i++) {   // 3. verify, commit, emit (end)
        sv_slot *sl = &s->slots[i];
        if (!sl->in_step) continue;
        sd_step st;
        if (sd_gen_step_end(sl->g, &st, err, sizeof err) < 0 || sv_slot_emit(s, sl, &st, err, sizeof err) < 0) {
            sv_slot_finish(s, sl, err, 500);
            continue;
        }
        sv_accept_observe(&sl->acc, &s->budget_pool, sd_gen_get_stats(sl->g), &st);
        emitted += st.n_tokens;
        if (sd_gen_finished(sl->g) != SD_FINISH_NONE) sv_slot_finish(s, sl, NULL, 0);
    }
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

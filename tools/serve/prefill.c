// prefill.c - new prompts, evaluated by their generations' own prompt steps
// (sd_gen_set_prompt: begin / forward / end, as decoding) within the
// scheduler's rounds (house rule 14): a bounded number of tokens per round,
// the oldest request first. With 8-bit prompts (the default) the chunks ride
// in the round's step pass beside the other slots' trees; with
// --precise-prompt they go through a float pass of their own before the
// round (a pass cannot mix the two).
#include <stdlib.h>
#include <string.h>

#include "serve/sched.h"

// The slot's prompt failed: its committed rows are prompt rows.
static void prefill_fail(sv_server *s, sv_slot *sl, const char *err) {
    sv_req *r = sl->r;
    int n_past = SD_MIN(sd_session_n_past(sl->s), r->n_prompt);
    pthread_mutex_lock(&r->mu);   // first out of the request's reach (sv_req_cancel), then freed
    r->gen = NULL;
    pthread_mutex_unlock(&r->mu);
    sd_gen_free(sl->g);
    sl->g = NULL;
    memcpy(sl->cache, r->prompt, sizeof(int32_t) * (size_t)n_past);
    sl->n_cache = n_past;
    sv_slot_finish(s, sl, err, 500);
}

// Plans this round's prompt chunks: pf_len[i] tokens of slot i's prompt
// (SV_PREFILL_CHUNK at most per slot), the oldest requests first,
// SV_PREFILL_BUDGET(_PRECISE) tokens in all, so that a burst of new requests
// does not stall the running streams for long. Returns the number of slots
// with a chunk.
int sv_prefill_plan(sv_server *s, int *pf_len) {
    int n = 0, budget = SV_PREFILL_BUDGET, generating = 0;
    for (int i = 0; i < s->n_slots; i++) generating |= s->slots[i].state == SV_SLOT_STEPPING;
    if (!s->o->fast_prompt && generating) budget = SV_PREFILL_BUDGET_PRECISE;
    for (int i = 0; i < s->n_slots; i++) pf_len[i] = 0;
    while (budget > 0) {
        int best = -1;
        for (int i = 0; i < s->n_slots; i++) {
            sv_slot *sl = &s->slots[i];
            if (sl->state != SV_SLOT_PROMPT || pf_len[i] || sd_gen_prompt_left(sl->g) <= 0) continue;
            if (best < 0 || sl->r->t_enqueue < s->slots[best].r->t_enqueue) best = i;
        }
        if (best < 0) break;
        sv_slot *sl = &s->slots[best];
        pf_len[best] = SD_MIN(SD_MIN(SV_PREFILL_CHUNK, sd_gen_prompt_left(sl->g)), budget);
        budget -= pf_len[best];
        n++;
    }
    return n;
}


void sv_prefill_end(sv_server *s, sv_slot *sl, int ok, const char *ferr) {
    char err[320];
    if (!ok) {
        snprintf(err, sizeof err, "prompt evaluation failed: %s", ferr);
        prefill_fail(s, sl, err);
        return;
    }
    sd_step st;
    if (sd_gen_step_end(sl->g, &st, err, sizeof err) < 0) {
        prefill_fail(s, sl, err);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->m.prefill_chunks++;
    pthread_mutex_unlock(&s->mu);
    if (sd_gen_finished(sl->g) != SD_FINISH_NONE) {   // stopped during its prompt
        sv_slot_finish(s, sl, NULL, 0);
    } else if (sd_gen_prompt_left(sl->g) == 0) {      // the prompt is in the cache: the slot steps
        sd_gen_set_step_limit(sl->g, 0);
        sl->state = SV_SLOT_STEPPING;
    }
}

int sv_prefill_join(sv_server *s, sv_slot *sl, int len, int n) {
    char err[256];
    sd_batch *b = &s->pass_bs[n];
    sd_gen_set_step_limit(sl->g, len);
    if (sd_gen_step_begin(sl->g, b, err, sizeof err) < 0) {
        prefill_fail(s, sl, err);
        return n;
    }
    if (b->n == 0) {   // nothing to evaluate (stopped): the step ends at once
        sv_prefill_end(s, sl, 1, "");
        return n;
    }
    s->pass_sl[n] = sl;
    s->pass_ss[n] = sl->s;
    return n + 1;
}

void sv_prefill_round(sv_server *s, int stopping) {
    for (int i = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        if (sl->state != SV_SLOT_PROMPT || sl->flight) continue;   // (a chunk in flight ends first: rounds.c)
        pthread_mutex_lock(&sl->r->mu);
        int cancelled = sl->r->cancelled;
        pthread_mutex_unlock(&sl->r->mu);
        if (stopping || cancelled) sv_slot_finish(s, sl, NULL, 0);   // the stream ends cleanly, like a stopped one
    }
    if (s->o->fast_prompt || !sv_prefill_plan(s, s->pf_len)) return;
    int n = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (s->pf_len[i]) n = sv_prefill_join(s, &s->slots[i], s->pf_len[i], n);
    char(*errs)[256] = s->pass_err;   // (allocated once, n_slots entries)
    sv_forward_many(s, n, errs, 0);
    for (int k = 0; k < n; k++) sv_prefill_end(s, s->pass_sl[k], s->pass_ok[k], errs[k]);
}

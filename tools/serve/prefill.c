// prefill.c - new prompts evaluated between the scheduler's rounds (house
// rule 14): a bounded number of tokens per round in chunks, the oldest
// request first, all but the prompt's last token in one pass (a precise pass
// of their own, or with --fast-prompt the round's step pass), the last token
// by sd_gen_prefill_cached, whose logits give the first token.
#include <stdlib.h>
#include <string.h>

#include "serve/sched.h"

// A prompt chunk asks for no logits (the prompt's last token, which gives
// the first token's, is evaluated by sd_gen_prefill_cached).
static const uint8_t no_logits[SV_PREFILL_CHUNK];

// The slot's prompt failed: its committed rows are prompt rows.
static void prefill_fail(sv_server *s, sv_slot *sl, const char *err) {
    sv_req *r = sl->r;
    int n_past = SD_MIN(sd_session_n_past(sl->s), r->n_prompt);
    sd_gen_free(sl->g);
    sl->g = NULL;
    pthread_mutex_lock(&r->mu);
    r->gen = NULL;
    pthread_mutex_unlock(&r->mu);
    memcpy(sl->cache, r->prompt, sizeof(int32_t) * (size_t)n_past);
    sl->n_cache = n_past;
    sv_slot_finish(s, sl, err, 500);
}

// The prompt's last token: sd_gen_prefill_cached evaluates it alone over
// the chunks before it.
void sv_prefill_final(sv_server *s, sv_slot *sl) {
    char err[256];
    double t0 = sd_time_ms();
    int rc = sd_gen_prefill_cached(sl->g, sl->r->prompt, sl->r->n_prompt, sl->pf_next, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    s->m.prefill_ms += sd_time_ms() - t0;
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) {
        prefill_fail(s, sl, err);
        return;
    }
    sl->state = SV_SLOT_STEPPING;
}

// Plans this round's prompt chunks: pf_len[i] tokens of slot i's prompt
// (all but its last token, SV_PREFILL_CHUNK at most per slot), the oldest
// requests first, SV_PREFILL_BUDGET(_PRECISE) tokens in all, so that a burst of new
// requests does not stall the running streams for long. Returns the number
// of slots with a chunk.
int sv_prefill_plan(sv_server *s, int *pf_len) {
    int n = 0, budget = SV_PREFILL_BUDGET, generating = 0;
    for (int i = 0; i < s->n_slots; i++) generating |= s->slots[i].state == SV_SLOT_STEPPING;
    if (!s->o->fast_prompt && generating) budget = SV_PREFILL_BUDGET_PRECISE;
    for (int i = 0; i < s->n_slots; i++) pf_len[i] = 0;
    while (budget > 0) {
        int best = -1;
        for (int i = 0; i < s->n_slots; i++) {
            sv_slot *sl = &s->slots[i];
            if (sl->state != SV_SLOT_PROMPT || pf_len[i] || sl->r->n_prompt - 1 - sl->pf_next <= 0) continue;
            if (best < 0 || sl->r->t_enqueue < s->slots[best].r->t_enqueue) best = i;
        }
        if (best < 0) break;
        sv_slot *sl = &s->slots[best];
        pf_len[best] = SD_MIN(SD_MIN(SV_PREFILL_CHUNK, sl->r->n_prompt - 1 - sl->pf_next), budget);
        budget -= pf_len[best];
        n++;
    }
    return n;
}

int sv_prefill_rows_setup(const sv_server *s, sv_slot *sl, char *err, size_t errlen) {
    sl->n_hid = sd_drafter_hidden_layers(sl->d, sl->hid_layers);
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    size_t need = (size_t)SV_PREFILL_CHUNK * (size_t)sl->n_hid * (size_t)info.n_embd;
    if (need <= sl->hid_cap) return 0;
    float *p = realloc(sl->hid, sizeof(float) * need);
    if (!p) {
        sd_drafter_free(sl->d);
        sl->d = NULL;
        sl->n_hid = 0;
        return snprintf(err, errlen, "out of memory (the drafter's prompt rows)"), -1;
    }
    sl->hid = p;
    sl->hid_cap = need;
    return 0;
}

sd_batch sv_prefill_batch(const sv_server *s, sv_slot *sl, int len) {
    sd_batch b = {.n = len, .tokens = sl->r->prompt + sl->pf_next, .logits = no_logits, .precise = !s->o->fast_prompt};
    if (sl->n_hid > 0) {   // a head reads the prompt's states (gen.c's prefill asks for them likewise)
        b.hidden_layers = sl->hid_layers;
        b.n_hidden_layers = sl->n_hid;
        b.hidden_out = sl->hid;
    }
    return b;
}

// After a pass: commits the chunk, and with final_now evaluates the
// prompt's last token when only that is left.
void sv_prefill_commit(sv_server *s, sv_slot *sl, int len, int ok, char *err, size_t errlen, int final_now) {
    if (!ok || sd_session_commit(sl->s, NULL, 0, err, errlen) < 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "prompt evaluation failed: %s", err);
        prefill_fail(s, sl, msg);
        return;
    }
    // The rows of prompt tokens pf_next.. go to the drafter at their index in
    // the prompt, which is the generation's text (as sd_gen_prefill_cached
    // hands over its own chunks).
    char derr[256];
    if (sl->n_hid > 0 && sd_drafter_prompt_rows(sl->d, sl->r->prompt, sl->pf_next, len, sl->hid, derr, sizeof derr) < 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "drafter '%s': %s", sd_drafter_name(sl->d), derr);
        prefill_fail(s, sl, msg);
        return;
    }
    sl->pf_next += len;
    pthread_mutex_lock(&s->mu);
    s->m.prefill_chunks++;
    pthread_mutex_unlock(&s->mu);
    if (final_now && sl->r->n_prompt - sl->pf_next == 1) sv_prefill_final(s, sl);
}

// Prompts between rounds: cancelled or shut-down requests end here; a prompt
// whose last token alone is left gets it evaluated; with float-activation
// prompts (the default) the planned chunks of all prefilling slots go
// through one precise pass (never mixed with step batches); with
// --fast-prompt they ride in round_step's pass instead.
void sv_prefill_round(sv_server *s, int stopping) {
    for (int i = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        if (sl->state != SV_SLOT_PROMPT) continue;
        pthread_mutex_lock(&sl->r->mu);
        int cancelled = sl->r->cancelled;
        pthread_mutex_unlock(&sl->r->mu);
        if (stopping || cancelled) sv_slot_finish(s, sl, NULL, 0);   // the stream ends cleanly, like a stopped one
        else if (sl->r->n_prompt - sl->pf_next == 1) sv_prefill_final(s, sl);
    }
    if (s->o->fast_prompt || !sv_prefill_plan(s, s->pf_len)) return;
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) {
        sv_slot *sl = &s->slots[i];
        if (!s->pf_len[i]) continue;
        s->pass_sl[n] = sl;
        s->pass_ss[n] = sl->s;
        s->pass_bs[n] = sv_prefill_batch(s, sl, s->pf_len[i]);
        n++;
    }
    char(*errs)[256] = s->pass_err;   // (allocated once, n_slots entries)
    sv_forward_many(s, n, errs, 0);
    for (int k = 0; k < n; k++)
        sv_prefill_commit(s, s->pass_sl[k], s->pass_bs[k].n, s->pass_ok[k], errs[k], sizeof errs[k], 1);
}

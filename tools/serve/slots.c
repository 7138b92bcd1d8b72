// slots.c - a slot's life: the method a request asks for checked and its
// drafter built (kept between requests), the request started (prefix reuse,
// sampler, generation, its prompt given), each step's tokens emitted (stop
// strings, UTF-8 boundaries) and the request finished (statistics, the cache
// kept for the next one). Only the scheduler thread (sched.c) calls these.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "serve/sched.h"

// ---------------------------------------------------------------- methods

// What the server can load for a missing prerequisite of m, for messages.
static const char *serve_hint(const sd_method *m) {
    return m->needs_draft_model        ? "start the server with --draft D.gguf"
           : m->needs_head == SD_HEAD_EAGLE3 ? "start the server with --head H.gguf (or --head auto)"
           : m->needs_head == SD_HEAD_MEDUSA ? "start the server with --head M.gguf"
           : m->needs_head == SD_HEAD_MOA    ? "start the server with --head MOA.gguf"
                                                : "";
}

int sv_method_check(sv_server *s, const char *name, sd_method *m, sd_method_plan *pl, char *err, size_t errlen) {
    if (!strcmp(name, "off") || !strcmp(name, "none")) name = "ar";
    if (!strcmp(name, s->def_method.name)) {
        *m = s->def_method;
        *pl = s->def_plan;
        return 0;
    }
    if (sd_method_parse(name, m, err, errlen) < 0) return -1;
    char perr[384];
    int prc = sd_method_plan_make(m, &s->have, pl, perr, sizeof perr);
    if (prc == SD_ERR_NO_ROOM)
        return snprintf(err, errlen, "speculation method '%s' evaluates %d nodes per step, more than %d", name,
                        SD_MAX(pl->model_nodes, pl->step_rows), SV_N_BATCH), -1;
    if (prc < 0) return snprintf(err, errlen, "speculation %s: %s", perr, serve_hint(m)), -1;
    if (m->uses_cost_curve && !s->cost)
        return snprintf(err, errlen, "speculation method '%s' needs the target's cost curve, measured at start-up: "
                        "start the server with --method %s", name, name), -1;
    if (strstr(name, "skip:auto"))
        return snprintf(err, errlen, "'skip:auto' searches its layer set once at start-up: start the server with "
                        "--method skip:auto, or give the layers (skip:L1-L2-...)"), -1;
    return 0;
}

sd_method_env sv_method_env(const sv_server *s) {
    sd_method_env env = sd_method_env_default(s->model);
    env.head_eagle3 = s->head_eagle3;
    env.head_medusa = s->head_medusa;
    env.head_moa = s->head_moa;
    env.drafts = (const sd_model *const *)s->drafts;
    env.n_drafts = s->o->n_drafts;
    env.n_ctx = s->n_ctx;
    env.pool = s->pool;
    env.cost = s->cost;
    env.head_online.on = s->o->head_online;
    env.head_bits = s->o->head_bits;
    env.datastore = s->o->datastore;
    env.datastore_loaded = s->datastore;
    env.head_online.lr = s->o->online_lr;
    return env;
}

// Makes sure the slot's drafter is the one of method m (kept when it is):
// 0 kept, 1 made now, <0 error.
static int slot_drafter(sv_server *s, sv_slot *sl, const sd_method *m, char *err, size_t errlen) {
    if (sl->d_name[0] && !strcmp(sl->d_name, m->name)) return 0;
    sd_drafter_free(sl->d);
    sl->d = NULL;
    sl->d_name[0] = 0;
    sd_method_env env = sv_method_env(s);
    sv_accept_init(&sl->acc);   // another drafter: nothing measured yet
    if (sd_method_make(m, &env, &sl->d, err, errlen) < 0) return -1;
    snprintf(sl->d_name, sizeof sl->d_name, "%s", m->name);
    return 1;
}

// ---------------------------------------------------------------- finishing

static const char *finish_reason(int finish) {
    return finish == SD_FINISH_LENGTH || finish == SD_FINISH_CTX ? "length" : "stop";
}

// Hands text[released..upto) to the client.
static void release(sv_slot *sl, size_t upto) {
    sv_req *r = sl->r;
    if (upto <= sl->released) return;
    pthread_mutex_lock(&r->mu);
    // kinds first: readers take out_len bytes of both
    if (sv_buf_add(&r->how, &r->how_len, &r->how_cap, sl->kind + sl->released, upto - sl->released) < 0 ||
        sv_buf_add(&r->out, &r->out_len, &r->out_cap, sl->text + sl->released, upto - sl->released) < 0)
        snprintf(r->error, sizeof r->error, "out of memory");
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    sl->released = upto;
}

// Contract in sched.h.
void sv_slot_finish(sv_server *s, sv_slot *sl, const char *error, int status) {
    sv_req *r = sl->r;
    const sd_gen_stats *gs = sl->g ? sd_gen_get_stats(sl->g) : NULL;
    if (sl->g && sl->state == SV_SLOT_PROMPT) {   // the committed rows are prompt rows
        int n_past = SD_MIN(sd_session_n_past(sl->s), r->n_prompt);
        memcpy(sl->cache, r->prompt, sizeof(int32_t) * (size_t)n_past);
        sl->n_cache = n_past;
        sd_session_truncate(sl->s, n_past, NULL, 0);
    } else if (sl->g) {   // the cache holds the text's first n_past tokens
        int n_text = 0;
        const int32_t *text = sd_gen_tokens(sl->g, &n_text);
        int n_past = sd_session_n_past(sl->s);
        if (n_past <= n_text) {
            memcpy(sl->cache, text, sizeof(int32_t) * (size_t)n_past);
            sl->n_cache = n_past;
        } else {
            sl->n_cache = 0;   // unknown contents: never reuse
            sd_session_truncate(sl->s, 0, NULL, 0);
        }
    }
    if (!error) release(sl, sl->text_len);
    // The accepted draft tokens of the text delivered (usage and /metrics):
    // the generation's count also holds drafts verified past a stop string or
    // max_tokens, never emitted. r->how grows only on this thread (release).
    int n_acc = 0;
    for (size_t i = 0; i < r->how_len; i++) n_acc += r->how[i] == 'A';
    pthread_mutex_lock(&s->mu);
    int cancelled = r->cancelled;
    if (error || cancelled) s->m.requests_error++;
    else s->m.requests_ok++;
    if (gs) {
        s->m.prompt_tokens += r->n_prompt;
        s->m.prompt_tokens_cached += r->n_cached;
        s->m.generated_tokens += gs->n_generated;
        s->m.drafted += gs->n_draft_nodes;
        s->m.accepted += n_acc;
        s->m.forwards += gs->n_target_forwards;
        s->m.step_tokens += gs->mean_accepted * gs->n_target_forwards;
    }
    if (r->ttft_ms > 0) {
        s->m.ttft_ring[s->m.ttft_count % SV_TTFT_RING] = r->ttft_ms;
        s->m.ttft_count++;
        s->m.ttft_sum_ms += r->ttft_ms;
    }
    s->m.busy_slots--;
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&r->mu);
    r->gen = NULL;
    if (gs) {
        r->n_gen = gs->n_generated;
        r->n_drafted = gs->n_draft_nodes;
        r->n_accepted = n_acc;
        r->n_forwards = gs->n_target_forwards;
        r->tau = gs->mean_accepted;
        snprintf(r->finish, sizeof r->finish, "%s", finish_reason(gs->finish));
    }
    if (error) {
        snprintf(r->error, sizeof r->error, "%s", error);
        r->err_status = status;
    }
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);

    sd_gen_free(sl->g);
    sd_sampler_free(sl->smp);
    sl->g = NULL;
    sl->smp = NULL;
    sl->r = NULL;
    sl->state = SV_SLOT_FREE;
    sl->last_used = sd_time_ms();
    sv_req_unref(r);
}

// ---------------------------------------------------------------- starting

int sv_common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

// Prepares the slot for its new request: keeps the longest common prefix of
// its cache and the prompt (at least one prompt token is evaluated, for the
// first token's logits), then prefills the rest.
void sv_slot_start(sv_server *s, sv_slot *sl) {
    sv_req *r = sl->r;
    char err[256];
    sl->text_len = sl->kind_len = sl->released = 0;
    sl->max_stop = 0;
    for (int i = 0; i < r->n_stop; i++) sl->max_stop = SD_MAX(sl->max_stop, (int)strlen(r->stop[i]));
    int keep = sv_common_prefix(sl->cache, sl->n_cache, r->prompt, r->n_prompt);
    if (keep >= r->n_prompt) keep = r->n_prompt - 1;
    if (sd_session_truncate(sl->s, keep, err, sizeof err) < 0) {
        sl->n_cache = 0;
        sd_session_truncate(sl->s, 0, NULL, 0);
        keep = 0;
    } else {
        sl->n_cache = keep;
    }
    r->n_cached = keep;

    sd_method m;
    sd_method_plan pl;
    int made = -1;
    if (sv_method_check(s, r->method, &m, &pl, err, sizeof err) < 0 || (made = slot_drafter(s, sl, &m, err, sizeof err)) < 0) {
        char msg[300];   // the field at fault, as the parse-time errors of api.c say it
        snprintf(msg, sizeof msg, "'speculation': %s", err);
        sv_slot_finish(s, sl, msg, 400);
        return;
    }
    // A drafter made now that reads the target's states (EAGLE-3, an MoA drafter with --ca-hidden) has none
    // of the kept prefix: the whole prompt is evaluated again, its states handed to the drafter.
    int32_t hl[SD_MAX_HIDDEN_LAYERS];
    if (made == 1 && keep > 0 && sd_drafter_hidden_layers(sl->d, hl) > 0) {
        sd_session_truncate(sl->s, 0, NULL, 0);
        sl->n_cache = keep = r->n_cached = 0;
    }
    // Greedy text, and sampled text with the race draw (the default), do not
    // depend on the drafts, so a drafter keeps what it learnt from earlier
    // requests. With the rejection draw the drafts steer which sample a seed
    // gives, so the drafter starts fresh and a seed gives the same text every
    // time; an adapting head (--head-online) keeps what it learnt even then
    // (its drafts depend on when its training thread ran).
    r->sp.draw = s->o->draw;
    sd_head_online_stats hs;
    if (sl->d && r->sp.temp > 0.0f && r->sp.draw == SD_DRAW_REJECTION && !sd_drafter_online_stats(sl->d, &hs))
        sd_drafter_reset(sl->d);
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    if (sd_sampler_new(&sl->smp, &r->sp, info.n_vocab, err, sizeof err) < 0) {
        sv_slot_finish(s, sl, err, 500);
        return;
    }
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = r->n_predict;
    gp.fast_prompt = s->o->fast_prompt;
    gp.max_nodes = sl->d ? pl.max_nodes : 1;
    if (sd_gen_new(&sl->g, sl->s, sl->smp, sl->d, &gp, err, sizeof err) < 0) {
        sv_slot_finish(s, sl, err, 500);
        return;
    }
    sl->max_nodes = gp.max_nodes;
    sv_accept_new_gen(&sl->acc);
    pthread_mutex_lock(&r->mu);
    r->gen = sl->g;
    if (r->cancelled) sd_gen_stop(sl->g);
    pthread_mutex_unlock(&r->mu);
    // The prompt is evaluated by the generation's own prompt steps, a chunk
    // per round (prefill.c), beside the other slots' steps.
    if (sd_gen_set_prompt(sl->g, r->prompt, r->n_prompt, keep, err, sizeof err) < 0) {
        sv_slot_finish(s, sl, err, 500);
        return;
    }
    sl->state = SV_SLOT_PROMPT;
}

// ---------------------------------------------------------------- steps

// Where the earliest stop string match starts in text[from..len) (its end
// in *end), or -1.
static long find_stop(const sv_req *r, const char *text, size_t len, size_t from, size_t *end) {
    long best = -1;
    for (int i = 0; i < r->n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        for (size_t p = from; p + L <= len; p++) {
            if (best >= 0 && (long)p > best) break;
            if (memcmp(text + p, r->stop[i], L) == 0) {
                if (best < 0 || (long)p < best || p + L < *end) {
                    best = (long)p;
                    *end = p + L;
                }
                break;
            }
        }
    }
    return best;
}

// Bytes at the end of text that begin some stop string (held back: the next
// token may complete it).
static size_t stop_prefix_hold(const sv_req *r, const char *text, size_t len) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        for (size_t k = SD_MIN(L - 1, len); k > hold; k--)
            if (memcmp(text + len - k, r->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

// The tokens of one step: their text, stop strings (the generation is cut
// after the token that completes one, as plain decoding would have stopped),
// and the text released to the client. Returns -1 on an error (in err).
int sv_slot_emit(sv_server *s, sv_slot *sl, const sd_step *st, char *err, size_t errlen) {
    sv_req *r = sl->r;
    size_t prev = sl->text_len;
    char piece[256];
    for (int k = 0; k < st->n_tokens; k++) {
        int n = sd_token_to_piece(s->tok, st->tokens[k], 0, piece, sizeof piece);
        if (n > (int)sizeof piece) n = (int)sizeof piece;
        if (n > 0 && sv_buf_add(&sl->text, &sl->text_len, &sl->text_cap, piece, (size_t)n) < 0)
            return snprintf(err, errlen, "out of memory"), -1;
        for (int b = 0; b < n; b++) {   // accepted drafts come first, then the target's own token
            char kc = k < st->n_accepted ? 'A' : 'T';
            if (b) kc = (char)(kc - 'A' + 'a');
            if (sv_buf_add(&sl->kind, &sl->kind_len, &sl->kind_cap, &kc, 1) < 0)
                return snprintf(err, errlen, "out of memory"), -1;
        }
        sl->ends[k] = sl->text_len;
    }
    if (st->n_tokens > 0 && r->ttft_ms == 0) r->ttft_ms = sd_time_ms() - r->t_enqueue;
    size_t end = 0;
    size_t from = prev > (size_t)sl->max_stop ? prev - (size_t)sl->max_stop + 1 : 0;
    long p = r->n_stop ? find_stop(r, sl->text, sl->text_len, from, &end) : -1;
    if (p >= 0) {
        int keep = 0;
        while (keep < st->n_tokens && sl->ends[keep] < end) keep++;
        if (sd_gen_cut(sl->g, SD_MIN(keep + 1, st->n_tokens), err, errlen) < 0) return -1;
        sl->text_len = sl->kind_len = (size_t)p;
        return 0;
    }
    if (sd_gen_finished(sl->g) != SD_FINISH_NONE) return 0;   // slot_finish releases the rest
    size_t upto = sl->text_len - stop_prefix_hold(r, sl->text, sl->text_len);
    release(sl, utf8_complete(sl->text, upto));
    return 0;
}

// sched.c - the scheduler thread: N slots on one model and one thread pool,
// a bounded queue, prefix reuse, and rounds that step every active slot
// (new prompts between the rounds: prefill.c).
//
// A slot is a session (its own KV cache on the shared pool), the tokens that
// cache holds, a drafter kept between requests (rebuilt when a request asks
// for another method), and while it serves a request: a sampler and an
// sd_gen. Only this thread touches slots; connection threads see requests
// (sv_req) and the queue, under the server's and the request's mutexes.
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
    env.drafts = (const sd_model *const *)s->drafts;
    env.n_drafts = s->o->n_drafts;
    env.n_ctx = s->n_ctx;
    env.pool = s->pool;
    env.cost = s->cost;
    env.head_online.on = s->o->head_online;
    env.head_bits = s->o->head_bits;
    env.datastore = s->o->datastore;
    env.head_online.lr = s->o->online_lr;
    return env;
}

// Makes sure the slot's drafter is the one of method m (kept when it is).
static int slot_drafter(sv_server *s, sv_slot *sl, const sd_method *m, char *err, size_t errlen) {
    if (sl->d_name[0] && !strcmp(sl->d_name, m->name)) return 0;
    sd_drafter_free(sl->d);
    sl->d = NULL;
    sl->d_name[0] = 0;
    sd_method_env env = sv_method_env(s);
    sv_accept_init(&sl->acc);   // another drafter: nothing measured yet
    if (sd_method_make(m, &env, &sl->d, err, errlen) < 0) return -1;
    snprintf(sl->d_name, sizeof sl->d_name, "%s", m->name);
    return 0;
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

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

// Prepares the slot for its new request: keeps the longest common prefix of
// its cache and the prompt (at least one prompt token is evaluated, for the
// first token's logits), then prefills the rest.
static void slot_start(sv_server *s, sv_slot *sl) {
    sv_req *r = sl->r;
    char err[256];
    sl->text_len = sl->kind_len = sl->released = 0;
    sl->max_stop = 0;
    for (int i = 0; i < r->n_stop; i++) sl->max_stop = SD_MAX(sl->max_stop, (int)strlen(r->stop[i]));
    int keep = common_prefix(sl->cache, sl->n_cache, r->prompt, r->n_prompt);
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
    if (sv_method_check(s, r->method, &m, &pl, err, sizeof err) < 0 || slot_drafter(s, sl, &m, err, sizeof err) < 0) {
        char msg[300];   // the field at fault, as the parse-time errors of api.c say it
        snprintf(msg, sizeof msg, "'speculation': %s", err);
        sv_slot_finish(s, sl, msg, 400);
        return;
    }
    // Greedy text, and sampled text with the race draw (the default), do not
    // depend on the drafts, so a drafter keeps what it learnt from earlier
    // requests. With the rejection draw the drafts steer which sample a seed
    // gives, so the drafter starts fresh and a seed gives the same text every
    // time; an adapting head (--head-online) keeps what it learnt even then
    // (its drafts depend on when its training thread ran).
    sd_head_online_stats hs;
    if (sl->d && r->sp.temp > 0.0f && r->sp.draw == SD_DRAW_REJECTION && !sd_drafter_online_stats(sl->d, &hs))
        sd_drafter_reset(sl->d);
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    r->sp.draw = s->o->draw;
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
static int slot_emit(sv_server *s, sv_slot *sl, const sd_step *st, char *err, size_t errlen) {
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
            int rc = sd_batcher_forward(s->batcher, s->pass_ss + i, s->pass_bs + i, j - i, errs[i], sizeof errs[i]);
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
static void round_step(sv_server *s) {
    char err[256];
    double t_round = sd_time_ms();
    int n = 0;
    if (s->o->fast_prompt) sv_prefill_plan(s, s->pf_len);
    plan_budget(s);
    for (int i = 0; i < s->n_slots; i++) {   // 1. draft (begin)
        sv_slot *sl = &s->slots[i];
        sl->in_step = 0;
        if (sl->state == SV_SLOT_PROMPT) {   // with --fast-prompt, a planned prompt chunk rides along
            if (s->o->fast_prompt && s->pf_len[i] && sv_prefill_begin(s, sl, s->pf_len[i], &s->pass_bs[n]) == 0) {
                if (s->pass_bs[n].n == 0) {   // nothing to evaluate (stopped)
                    sv_prefill_end(s, sl, 1, "");
                } else {
                    s->pass_sl[n] = sl;
                    s->pass_ss[n] = sl->s;
                    n++;
                }
            }
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
    if (n > 0) {   // 2. the target: one pass over every slot's batch
        char(*errs)[256] = s->pass_err;
        sv_forward_many(s, n, errs, 1);
        for (int k = 0; k < n; k++) {
            sv_slot *sl = s->pass_sl[k];
            if (sl->state == SV_SLOT_PROMPT) {   // a folded prompt chunk
                sv_prefill_end(s, sl, s->pass_ok[k], errs[k]);
            } else if (!s->pass_ok[k]) {
                sl->in_step = 0;
                sv_slot_finish(s, sl, errs[k], 500);
            }
        }
    }
    long emitted = 0;
    for (int i = 0; i < s->n_slots; i++) {   // 3. verify, commit, emit (end)
        sv_slot *sl = &s->slots[i];
        if (!sl->in_step) continue;
        sd_step st;
        if (sd_gen_step_end(sl->g, &st, err, sizeof err) < 0 || slot_emit(s, sl, &st, err, sizeof err) < 0) {
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
            int lcp = common_prefix(sl->cache, sl->n_cache, r->prompt, r->n_prompt);
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
        while (!s->stopping && s->q_len == 0 && n_active(s) == 0) pthread_cond_wait(&s->cv, &s->mu);
        int stopping = s->stopping;
        if (stopping) drain_queue(s);
        else assign(s);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_slots; i++) {
            sv_slot *sl = &s->slots[i];
            if (stopping && sl->state == SV_SLOT_STARTING) {
                sv_slot_finish(s, sl, "the server is shutting down", 503);
                continue;
            }
            if (sl->state == SV_SLOT_STARTING) slot_start(s, sl);
            if (stopping && sl->state == SV_SLOT_STEPPING) sd_gen_stop(sl->g);   // streams end cleanly with what they have
        }
        sv_prefill_round(s, stopping);
        if (n_active(s) > 0) round_step(s);
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
        s->n_ctx = sd_session_n_ctx(sl->s);
        sl->cache = malloc(sizeof(int32_t) * (size_t)s->n_ctx);
        sl->ends = malloc(sizeof(size_t) * (SV_N_BATCH + 2));
        if (!sl->cache || !sl->ends) return snprintf(err, errlen, "out of memory"), -1;
    }
    s->m.n_slots = s->n_slots;
    // One batcher for the scheduler's passes: room for every slot's tree and
    // auxiliary nodes of the default method (a request asking for a larger
    // tree, or a round beyond that, is split into several passes).
    int per_slot = 1;
    if (s->def_plan.spec) per_slot = SD_MIN(s->def_plan.step_rows, SV_N_BATCH);
    per_slot = SD_MAX(per_slot, SV_PREFILL_CHUNK / 4);
    s->batcher_nodes = SD_MIN(SD_MAX(s->n_slots * per_slot, SV_PREFILL_CHUNK), SV_PASS_MAX_NODES);
    s->pass_sl = calloc((size_t)s->n_slots, sizeof *s->pass_sl);
    s->pass_ss = calloc((size_t)s->n_slots, sizeof *s->pass_ss);
    s->pass_bs = calloc((size_t)s->n_slots, sizeof *s->pass_bs);
    s->pass_ok = calloc((size_t)s->n_slots, sizeof *s->pass_ok);
    s->pass_err = calloc((size_t)s->n_slots, sizeof *s->pass_err);
    s->pf_len = calloc((size_t)s->n_slots, sizeof *s->pf_len);
    if (!s->pass_sl || !s->pass_ss || !s->pass_bs || !s->pass_ok || !s->pass_err || !s->pf_len) return snprintf(err, errlen, "out of memory"), -1;
    if (s->n_slots > 1 && sd_batcher_new(&s->batcher, s->model, s->pool, s->batcher_nodes, err, errlen) < 0) return -1;
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

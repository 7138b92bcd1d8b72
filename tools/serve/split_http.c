// split_http.c - the verification API's requests (split.h, docs/split.md),
// on the connection threads: POST /v1/split/open (JSON), /v1/split/round
// (binary) and /v1/split/close. Each checks its input, hands the work to the
// scheduler under s->mu and waits for the reply.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"
#include "serve/split.h"

int sv_split_make(sv_server *s, sv_split *e, const int32_t *prompt, int n_prompt, int n_predict,
                  const sd_sampler_params *sp, char *err, size_t errlen);

static int error_out(int status, const char *code, const char *msg, char **out, size_t *out_len, const char **ctype) {
    *out = sv_error_json(status, code, msg);
    *out_len = *out ? strlen(*out) : 0;
    *ctype = "application/json";
    return status;
}

// The generation named id, or NULL with the reason in msg (unknown, expired);
// under s->mu. An expired one is freed.
static sv_split *find(sv_server *s, const char *id, char *msg, size_t len) {
    sv_splits *t = s->split;
    if (!id || !*id) return snprintf(msg, len, "no generation id (?id=...)"), NULL;
    for (int i = 0; i < t->n; i++) {
        sv_split *e = &t->e[i];
        if (e->state == SPL_FREE || strcmp(e->id, id)) continue;
        if (e->state == SPL_READY && e->waiters == 0 && sd_time_ms() - e->last_used > t->idle_s * 1000.0) {
            e->state = SPL_FREE;
            snprintf(msg, len, "split generation '%s' expired (idle more than %d s); open a new one", id, t->idle_s);
            return NULL;
        }
        return e;
    }
    snprintf(msg, len, "no split generation '%.64s' (closed, expired after %d s idle, or the server restarted)", id,
             t->idle_s);
    return NULL;
}

// Waits until e's work is done (state leaves `busy`); under s->mu.
static void wait_done(sv_server *s, sv_split *e, int busy) {
    e->waiters++;
    while (e->state == busy) pthread_cond_wait(&s->split->cv, &s->mu);
    e->waiters--;
}

static int copy_reply(sv_split *e, char **out, size_t *out_len, const char **ctype) {
    *out = malloc(e->reply_len ? e->reply_len : 1);
    if (!*out) return error_out(500, NULL, "out of memory", out, out_len, ctype);
    memcpy(*out, e->reply, e->reply_len);
    *out_len = e->reply_len;
    *ctype = e->reply_status == 200 && e->reply_len >= 4 && e->reply[0] == 'S' ? "application/octet-stream"
                                                                                : "application/json";
    return e->reply_status;
}

static int do_open(sv_server *s, const char *body, size_t len, char **out, size_t *out_len, const char **ctype) {
    sv_api_err ae = {{0}, {0}};
    json_t *o = sv_parse_body(body, len, &ae);
    if (!o) return error_out(400, ae.code, ae.msg, out, out_len, ctype);
    char msg[320];
    const json_t *pr = json_object_get(o, "prompt"), *np = json_object_get(o, "n_predict");
    const json_t *ws = json_object_get(o, "states");
    int n = json_is_array(pr) ? (int)json_array_size(pr) : 0;
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    int n_predict = np ? (int)json_integer_value(np) : 256;
    if (!json_is_array(pr) || n < 1 || n >= s->n_ctx) {
        json_decref(o);
        snprintf(msg, sizeof msg, "'prompt' must be an array of 1..%d token ids", s->n_ctx - 1);
        return error_out(400, "invalid_prompt", msg, out, out_len, ctype);
    }
    if ((np && !json_is_integer(np)) || n_predict < 1 || n_predict > s->n_ctx) {
        json_decref(o);
        snprintf(msg, sizeof msg, "'n_predict' must be an integer in 1..%d", s->n_ctx);
        return error_out(400, "invalid_n_predict", msg, out, out_len, ctype);
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) {
        json_decref(o);
        return error_out(500, NULL, "out of memory", out, out_len, ctype);
    }
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(pr, (size_t)i);
        long long x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x >= info.n_vocab) {
            free(ids);
            json_decref(o);
            snprintf(msg, sizeof msg, "prompt[%d] is not a token id in 0..%d", i, info.n_vocab - 1);
            return error_out(400, "invalid_prompt", msg, out, out_len, ctype);
        }
        ids[i] = (int32_t)x;
    }
    // states: true (the default: fused rows when the server has an EAGLE-3 head), false, "fused", "kv"
    int kind = !ws || json_is_true(ws) ? (s->split->n_extract > 0 ? SV_KIND_FUSED : SV_KIND_NONE) : SV_KIND_NONE;
    const char *wk = json_string_value(ws);
    const char *dfp = json_string_value(json_object_get(o, "drafter"));
    char fp[24];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)s->split->moa_fp);
    if (wk && !strcmp(wk, "lsa") && (!s->split->lsa || !dfp || strcmp(dfp, fp))) {
        free(ids);
        json_decref(o);
        snprintf(msg, sizeof msg, "%s: ask for \"kv\" states (the client runs LSA)",
                 !s->split->lsa ? "'states': \"lsa\" needs the server to hold an MoA drafter with LSA (serve --head)"
                                : "'states': \"lsa\": the client's MoA drafter ('drafter' fingerprint) is not the server's");
        return error_out(400, "invalid_states", msg, out, out_len, ctype);
    }
    if (wk && !strcmp(wk, "lsa")) kind = SV_KIND_LSA;
    else if (wk && !strcmp(wk, "kv")) kind = SV_KIND_KV;
    else if (wk && !strcmp(wk, "mean")) kind = SV_KIND_MEAN;
    else if (wk && !strcmp(wk, "fused") && s->split->n_extract > 0) kind = SV_KIND_FUSED;
    else if ((wk && strcmp(wk, "none")) || (ws && !wk && !json_is_boolean(ws))) {
        free(ids);
        json_decref(o);
        snprintf(msg, sizeof msg, "'states' is true, false, \"kv\" (every layer's K,V rows: an MoA client), \"mean\" "
                 "(their mean over layers: an MoA client without LSA)%s",
                 s->split->n_extract > 0 ? " or \"fused\"" : "; \"fused\" needs an EAGLE-3 head (serve --head)");
        return error_out(400, "invalid_states", msg, out, out_len, ctype);
    }
    // hidden_layer: an MoA drafter that reads the target's states (--ca-hidden, --sa-hidden) asks for them
    // at one layer (sd_batch.hidden_layers: the stream after block l, or SD_HIDDEN_NORM, -1, the final
    // normed state); each position's rows end with its state
    // tli ("mean" states): the last tli layers' K,V rows follow each position's mean (the drafter's TLI layers)
    const json_t *tj = json_object_get(o, "tli");
    const long long tli = json_is_integer(tj) ? json_integer_value(tj) : tj ? -1 : 0;
    if (kind == SV_KIND_MEAN ? tli < 0 || tli > info.n_layer : tj != NULL) {
        free(ids);
        json_decref(o);
        snprintf(msg, sizeof msg, "'tli' goes with \"mean\" states: the drafter's TLI, 0..%d", info.n_layer);
        return error_out(400, "invalid_tli", msg, out, out_len, ctype);
    }
    const json_t *hj = json_object_get(o, "hidden_layer");
    const int has_hidden = hj && !json_is_null(hj);
    const long long hidden_layer = json_is_integer(hj) ? json_integer_value(hj) : -2;
    if (has_hidden && (kind < SV_KIND_KV ? 1
                       : hidden_layer != SD_HIDDEN_NORM && (hidden_layer < 0 || hidden_layer >= info.n_layer))) {
        free(ids);
        json_decref(o);
        if (kind < SV_KIND_KV)
            snprintf(msg, sizeof msg, "'hidden_layer' goes with \"kv\", \"mean\" or \"lsa\" states (an MoA client)");
        else
            snprintf(msg, sizeof msg, "'hidden_layer' is %d (the final normed state) or a layer in 0..%d (the state "
                     "after that block)", SD_HIDDEN_NORM, info.n_layer - 1);
        return error_out(400, "invalid_hidden_layer", msg, out, out_len, ctype);
    }
    // sampling: the target's distribution (the race draw: the text plain sampling gives for the seed)
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = 0.0f;
    const json_t *v;
    int bad = 0;
    if ((v = json_object_get(o, "temperature"))) bad |= !json_is_number(v), sp.temp = (float)json_number_value(v);
    if ((v = json_object_get(o, "top_k"))) bad |= !json_is_integer(v), sp.top_k = (int)json_integer_value(v);
    if ((v = json_object_get(o, "top_p"))) bad |= !json_is_number(v), sp.top_p = (float)json_number_value(v);
    if ((v = json_object_get(o, "min_p"))) bad |= !json_is_number(v), sp.min_p = (float)json_number_value(v);
    if ((v = json_object_get(o, "seed"))) bad |= !json_is_integer(v), sp.seed = (uint64_t)json_integer_value(v);
    if (bad || sp.temp < 0 || sp.temp > 100 || sp.top_p < 0 || sp.top_p > 1 || sp.min_p < 0 || sp.min_p > 1) {
        free(ids);
        json_decref(o);
        return error_out(400, "invalid_sampling",
                         "temperature (0..100), top_k (integer), top_p and min_p (0..1) and seed (integer) are numbers",
                         out, out_len, ctype);
    }
    sp.draw = s->o->draw;
    // stop strings: a string or an array (as the OpenAI API's "stop")
    char *stops[SV_MAX_STOP];
    int n_stop = 0;
    const json_t *so = json_object_get(o, "stop");
    if (so && !json_is_null(so)) {
        const size_t ns = json_is_string(so) ? 1 : json_is_array(so) ? json_array_size(so) : (size_t)-1;
        const char *why = ns == (size_t)-1 ? "'stop' is a string or an array of strings"
                          : ns > SV_MAX_STOP ? "'stop' has too many strings" : NULL;
        for (size_t i = 0; !why && i < ns; i++) {
            const json_t *v = json_is_string(so) ? so : json_array_get(so, i);
            if (!json_is_string(v)) why = "'stop' is a string or an array of strings";
            else if (json_string_length(v) > SV_STOP_MAX_LEN) why = "a 'stop' string is too long";
            else if (json_string_length(v) > 0 && !(stops[n_stop++] = strdup(json_string_value(v)))) why = "out of memory";
        }
        if (why) {
            for (int i = 0; i < n_stop; i++) free(stops[i]);
            free(ids);
            json_decref(o);
            snprintf(msg, sizeof msg, "%s (at most %d, of 1..%d bytes each)", why, SV_MAX_STOP, SV_STOP_MAX_LEN);
            return error_out(400, "invalid_stop", msg, out, out_len, ctype);
        }
    }
    json_decref(o);
    sv_splits *t = s->split;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(ids);
        for (int i = 0; i < n_stop; i++) free(stops[i]);
        return error_out(503, "stopping", "the server is shutting down", out, out_len, ctype);
    }
    sv_split *e = NULL;
    double now = sd_time_ms();
    for (int i = 0; i < t->n && !e; i++) {   // a free entry, or one idle past its time
        sv_split *c = &t->e[i];
        if (c->state == SPL_FAILED && c->waiters == 0) c->state = SPL_FREE;
        if (c->state == SPL_READY && c->waiters == 0 && now - c->last_used > t->idle_s * 1000.0) c->state = SPL_FREE;
        if (c->state == SPL_FREE) e = c;
    }
    if (!e) {   // full: the one idle longest, when idle SV_SPLIT_EVICT_S or more, makes room (its client opens it again)
        for (int i = 0; i < t->n; i++) {
            sv_split *c = &t->e[i];
            if (c->state == SPL_READY && c->waiters == 0 && now - c->last_used >= SV_SPLIT_EVICT_S * 1000.0 &&
                (!e || c->last_used < e->last_used))
                e = c;
        }
    }
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        free(ids);
        for (int i = 0; i < n_stop; i++) free(stops[i]);
        snprintf(msg, sizeof msg, "all %d split generations are in use (--split); retry later or close one", t->n);
        return error_out(503, "split_full", msg, out, out_len, ctype);
    }
    e->state = SPL_FAILED;   // reserved: nobody else takes it, nobody finds it (no id yet)
    e->waiters++;
    snprintf(e->id, sizeof e->id, "g%lx%08lx", ++t->next, (unsigned long)((uint64_t)(now * 1000.0) & 0xffffffffu));
    pthread_mutex_unlock(&s->mu);
    char err[256];
    e->kind = kind;
    e->want_states = kind != SV_KIND_NONE;
    e->has_hidden = has_hidden;
    e->tli = (int)tli;
    e->hidden_layer = has_hidden ? (int)hidden_layer : 0;
    int rc = sv_split_make(s, e, ids, n, n_predict, &sp, err, sizeof err);
    free(ids);
    for (int i = 0; i < n_stop; i++) {   // the generation's now (gen_drop frees them)
        if (rc < 0) {
            free(stops[i]);
            continue;
        }
        e->stop[e->n_stop++] = stops[i];
        e->max_stop = SD_MAX(e->max_stop, (int)strlen(stops[i]));
    }
    pthread_mutex_lock(&s->mu);
    e->waiters--;
    if (rc < 0 || s->stopping) {   // (stopping: the scheduler may be gone already)
        e->state = SPL_FREE;
        pthread_mutex_unlock(&s->mu);
        if (rc >= 0) return error_out(503, "stopping", "the server is shutting down", out, out_len, ctype);
        return error_out(500, NULL, err, out, out_len, ctype);
    }
    e->seq_done = e->seq_work = 0;
    e->n_rounds = e->n_tokens = 0;
    e->state = SPL_OPENING;
    pthread_cond_broadcast(&s->cv);
    wait_done(s, e, SPL_OPENING);
    int status = copy_reply(e, out, out_len, ctype);
    if (e->state == SPL_FAILED && e->waiters == 0) e->state = SPL_FREE;
    pthread_mutex_unlock(&s->mu);
    return status;
}

static uint32_t get_u32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int do_round(sv_server *s, const char *id, const char *body, size_t len, char **out, size_t *out_len,
                    const char **ctype) {
    char msg[320];
    // magic u32, seq u32, n u16, flags u16, n x i32 tokens, n x i16 parents
    if (len < 12 || get_u32(body) != SV_SPLIT_MAGIC_REQ)
        return error_out(400, "bad_round", "a round body starts with \"SDR1\", seq, nodes, flags (docs/split.md)", out,
                         out_len, ctype);
    uint32_t seq = get_u32(body + 4);
    uint16_t n, flags;
    memcpy(&n, body + 8, 2);
    memcpy(&flags, body + 10, 2);
    if (n < 1 || n > SV_SPLIT_MAX_NODES) {
        snprintf(msg, sizeof msg, "a round's tree has 1..%d nodes (root included), got %u", SV_SPLIT_MAX_NODES, n);
        return error_out(400, "bad_tree", msg, out, out_len, ctype);
    }
    if (len != 12 + 6 * (size_t)n) {
        snprintf(msg, sizeof msg, "a round of %u nodes is %zu bytes, got %zu", n, 12 + 6 * (size_t)n, len);
        return error_out(400, "bad_round", msg, out, out_len, ctype);
    }
    int32_t tok[SV_SPLIT_MAX_NODES];
    int16_t par[SV_SPLIT_MAX_NODES];
    memcpy(tok, body + 12, 4 * (size_t)n);
    memcpy(par, body + 12 + 4 * (size_t)n, 2 * (size_t)n);
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    for (int i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= info.n_vocab) {
            snprintf(msg, sizeof msg, "node %d: token %d is not in 0..%d", i, tok[i], info.n_vocab - 1);
            return error_out(400, "bad_tree", msg, out, out_len, ctype);
        }
        if (i == 0 ? par[i] != -1 : (par[i] < 0 || par[i] >= i)) {
            snprintf(msg, sizeof msg, "node %d: parent %d (the root's is -1, another node's an earlier node)", i,
                     par[i]);
            return error_out(400, "bad_tree", msg, out, out_len, ctype);
        }
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return error_out(503, "stopping", "the server is shutting down", out, out_len, ctype);
    }
    sv_split *e = find(s, id, msg, sizeof msg);
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        return error_out(404, "unknown_generation", msg, out, out_len, ctype);
    }
    e->last_used = sd_time_ms();
    if (e->state == SPL_ROUND && seq == e->seq_work) {   // a retry of the round in work: its answer
        wait_done(s, e, SPL_ROUND);
        int status = copy_reply(e, out, out_len, ctype);
        pthread_mutex_unlock(&s->mu);
        return status;
    }
    if (e->state != SPL_READY) {
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, sizeof msg, "split generation '%s' is busy with round %u", e->id, e->seq_work);
        return error_out(409, "busy", msg, out, out_len, ctype);
    }
    if (seq == e->seq_done && seq > 0 && e->reply_status == 200) {   // a retry of the last round: the same bytes
        int status = copy_reply(e, out, out_len, ctype);
        pthread_mutex_unlock(&s->mu);
        return status;
    }
    if (seq != e->seq_done + 1) {
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, sizeof msg, "round %u is out of order: the next round is %u (or %u again, a retry)", seq,
                 e->seq_done + 1, e->seq_done);
        return error_out(409, "out_of_order", msg, out, out_len, ctype);
    }
    if (sd_gen_finished(e->g) != SD_FINISH_NONE) {
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, sizeof msg, "split generation '%s' has ended (%s)", e->id, sd_finish_name(sd_gen_finished(e->g)));
        return error_out(409, "finished", msg, out, out_len, ctype);
    }
    int nt;
    const int32_t *text = sd_gen_tokens(e->g, &nt);
    if (nt < 1 || text[nt - 1] != tok[0]) {
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, sizeof msg, "the tree's root %d is not the generation's last token %d (position %d)", tok[0],
                 nt > 0 ? text[nt - 1] : -1, nt - 1);
        return error_out(409, "bad_root", msg, out, out_len, ctype);
    }
    memcpy(e->tree_tok, tok, 4 * (size_t)n);
    memcpy(e->tree_par, par, 2 * (size_t)n);
    e->tree_n = n;
    e->want_states = (flags & 1) && e->kind != SV_KIND_NONE;
    e->root_pos = nt - 1;
    e->seq_work = seq;
    e->state = SPL_ROUND;
    pthread_cond_broadcast(&s->cv);
    wait_done(s, e, SPL_ROUND);
    int status = copy_reply(e, out, out_len, ctype);
    pthread_mutex_unlock(&s->mu);
    return status;
}

static int do_close(sv_server *s, const char *id, char **out, size_t *out_len, const char **ctype) {
    char msg[320];
    pthread_mutex_lock(&s->mu);
    sv_split *e = find(s, id, msg, sizeof msg);
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        return error_out(404, "unknown_generation", msg, out, out_len, ctype);
    }
    if (e->state != SPL_READY || e->waiters) {
        pthread_mutex_unlock(&s->mu);
        return error_out(409, "busy", "the generation is busy with a round", out, out_len, ctype);
    }
    long rounds = e->n_rounds, tokens = e->n_tokens;
    e->state = SPL_FREE;
    pthread_mutex_unlock(&s->mu);
    *out = malloc(160);
    if (*out) snprintf(*out, 160, "{\"closed\":\"%s\",\"rounds\":%ld,\"tokens\":%ld}", id, rounds, tokens);
    *out_len = *out ? strlen(*out) : 0;
    *ctype = "application/json";
    return 200;
}

int sv_split_request(sv_server *s, int which, const char *id, const char *body, size_t len, char **out,
                     size_t *out_len, const char **ctype) {
    if (!s->split)
        return error_out(404, "not_found", "the verification API is off (specdec serve --split N)", out, out_len, ctype);
    switch (which) {
    case 0: return do_open(s, body, len, out, out_len, ctype);
    case 1: return do_round(s, id, body, len, out, out_len, ctype);
    default: return do_close(s, id, out, out_len, ctype);
    }
}

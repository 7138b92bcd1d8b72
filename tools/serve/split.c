// split.c - the scheduler's side of the verification API (split.h): the
// table of split generations, their steps in the round's pass, and the
// replies (the accepted path, the bonus token and the fused states of the
// path's positions, int8 with a scale per row: docs/split.md).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/split.h"

// ---------------------------------------------------------------- fused rows

size_t sv_split_row_bytes(const sv_splits *t, const sv_split *e) {
    const int kind = e->kind;
    const size_t qb = 4 + (size_t)t->kvd, hb = e->has_hidden && kind >= SV_KIND_KV ? 4 + (size_t)t->d : 0;
    return kind == SV_KIND_FUSED ? 4 + (size_t)t->d
           : kind == SV_KIND_KV   ? 2 * (size_t)t->n_layer * qb + hb
           : kind == SV_KIND_LSA  ? 4 + (size_t)t->d + 2 * (size_t)t->tli * qb + hb
           : kind == SV_KIND_MEAN ? 2 * (size_t)(1 + e->tli) * qb + hb
                                  : 0;
}

// Keeps the target's states (n, d) of positions pos0 .. pos0+n-1 (has_hidden).
static int keep_states(sv_split *e, int d, int pos0, const float *rows, int n) {
    if (pos0 < 0 || n <= 0) return 0;
    if (pos0 + n > e->cap_hid) {
        int cap = SD_MAX(pos0 + n, 2 * e->cap_hid);
        float *h = realloc(e->hid, sizeof(float) * (size_t)cap * (size_t)d);
        if (!h) return -1;
        e->hid = h;
        e->cap_hid = cap;
    }
    memcpy(e->hid + (size_t)pos0 * d, rows, sizeof(float) * (size_t)n * (size_t)d);
    return 0;
}

// Room for n more positions in e->rows (rb bytes each; a generation's kind sets rb, the buffer outlives it).
static int rows_room(sv_split *e, size_t rb, int n) {
    const size_t need = rb * (size_t)(e->n_rows + n);
    if (need <= e->cap_rows) return 0;
    size_t cap = SD_MAX(need, 2 * e->cap_rows);
    uint8_t *r = realloc(e->rows, cap);
    if (!r) return -1;
    e->rows = r;
    e->cap_rows = cap;
    return 0;
}

// One row x (w) as int8 with a float scale: o (4 + w bytes).
static void quant_row(uint8_t *o, const float *x, int w) {
    float mx = 0.0f;
    for (int j = 0; j < w; j++) mx = fmaxf(mx, fabsf(x[j]));
    float sc = mx > 0 ? mx / 127.0f : 1.0f;
    memcpy(o, &sc, 4);
    for (int j = 0; j < w; j++) {
        long q = lrintf(x[j] / sc);
        o[4 + j] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
    }
}

// Fuses n target rows (n, 3, d) into e's int8 rows.
static int fuse_rows(sv_server *s, sv_split *e, const float *hidden, int n, char *err, size_t errlen) {
    const int d = s->split->d;
    const size_t rb = 4 + (size_t)d;
    for (int i = 0; i < n; i += SV_SPLIT_MAX_NODES) {
        int c = SD_MIN(SV_SPLIT_MAX_NODES, n - i);
        if (sd_head_fuse(s->head_eagle3, hidden + (size_t)i * 3 * d, c, e->fbuf, err, errlen) < 0) return -1;
        if (rows_room(e, rb, c) < 0) return snprintf(err, errlen, "out of memory"), -1;
        for (int j = 0; j < c; j++) quant_row(e->rows + rb * (size_t)(e->n_rows + j), e->fbuf + (size_t)j * d, d);
        e->n_rows += c;
    }
    return 0;
}

// The client's MoA drafter's rows of positions pos .. pos+n-1 into e's int8
// rows (docs/split.md): SV_KIND_KV every layer's committed K and V rows;
// SV_KIND_LSA LSA's output (the server's drafter) then the last tli layers';
// SV_KIND_MEAN the layers' mean K and V rows then the last tli layers';
// has_hidden: then the position's state.
static int kv_rows(sv_server *s, sv_split *e, int pos, int n, char *err, size_t errlen) {
    sv_splits *t = s->split;
    const int L = t->n_layer, w = t->kvd, lsa = e->kind == SV_KIND_LSA, mean = e->kind == SV_KIND_MEAN, d = t->d;
    const size_t rb = sv_split_row_bytes(t, e), qb = 4 + (size_t)w;
    if (e->has_hidden && pos + n > e->cap_hid)
        return snprintf(err, errlen, "the target's states of positions %d..%d are missing", pos, pos + n - 1), -1;
    const size_t head = lsa ? 4 + (size_t)d : mean ? 2 * qb : 0;   // a position's bytes before its first K,V row
    const int l0 = lsa ? L - t->tli : mean ? L - e->tli : 0;       // the first layer sent
    if (n <= 0) return 0;
    if (rows_room(e, rb, n) < 0) return snprintf(err, errlen, "out of memory"), -1;
    for (int i = 0; i < n; i += SV_SPLIT_MAX_NODES) {
        const int c = SD_MIN(SV_SPLIT_MAX_NODES, n - i);
        if (mean) memset(e->mk, 0, sizeof(float) * (size_t)c * w), memset(e->mv, 0, sizeof(float) * (size_t)c * w);
        for (int l = 0; l < L; l++) {
            if (sd_session_kv_read(e->ss, l, pos + i, c, e->kbuf, e->vbuf, err, errlen) < 0) return -1;
            for (int j = 0; j < c; j++) {
                const float *kr = e->kbuf + (size_t)j * w, *vr = e->vbuf + (size_t)j * w;
                for (int q = 0; mean && q < w; q++)   // (as the drafter's own mean: a sum, then / L)
                    e->mk[(size_t)j * w + q] += kr[q], e->mv[(size_t)j * w + q] += vr[q];
                if (lsa) {
                    float *f = t->kvf + ((size_t)j * L + l) * 2 * w;
                    memcpy(f, kr, sizeof(float) * (size_t)w);
                    memcpy(f + w, vr, sizeof(float) * (size_t)w);
                }
                if (l < l0) continue;
                uint8_t *o = e->rows + rb * (size_t)(e->n_rows + i + j) + head + 2 * (size_t)(l - l0) * qb;
                quant_row(o, kr, w);
                quant_row(o + qb, vr, w);
            }
        }
        if (lsa) {
            if (sd_moa_lsa_run(t->lsa, t->kvf, c, t->cf, err, errlen) < 0) return -1;
            for (int j = 0; j < c; j++) quant_row(e->rows + rb * (size_t)(e->n_rows + i + j), t->cf + (size_t)j * d, d);
        }
        for (int j = 0; mean && j < c; j++) {
            float *mk = e->mk + (size_t)j * w, *mv = e->mv + (size_t)j * w;
            for (int q = 0; q < w; q++) mk[q] /= (float)L, mv[q] /= (float)L;
            uint8_t *o = e->rows + rb * (size_t)(e->n_rows + i + j);
            quant_row(o, mk, w);
            quant_row(o + qb, mv, w);
        }
        for (int j = 0; e->has_hidden && j < c; j++)   // the state: the row's last (4 + d) bytes
            quant_row(e->rows + rb * (size_t)(e->n_rows + i + j + 1) - (4 + (size_t)d),
                      e->hid + (size_t)(pos + i + j) * d, d);
    }
    e->n_rows += n;
    return 0;
}

// ---------------------------------------------------------------- the drafter: the client's tree
typedef struct cb_user {
    sv_server *s;
    sv_split *e;
} cb_user;

static int cb_propose(void *user, const sd_draft_request *req, sd_tree *tree, char *err, size_t errlen) {
    sv_split *e = ((cb_user *)user)->e;
    (void)req;
    for (int i = 1; i < e->tree_n; i++)
        if (sd_tree_add(tree, e->tree_par[i], e->tree_tok[i], 1.0f) != i)
            return snprintf(err, errlen, "the tree of %d nodes does not fit this step", e->tree_n), -1;
    return 0;
}

static int cb_step(void *user, const sd_draft_result *res, char *err, size_t errlen) {
    cb_user *u = user;
    if (!res->hidden || !u->e->want_states) return 0;
    if (u->e->has_hidden)   // the path's states: root_pos .. root_pos + n_accepted
        return keep_states(u->e, u->s->split->d, u->e->root_pos, res->hidden, 1 + res->n_accepted) < 0
                   ? (snprintf(err, errlen, "out of memory"), -1)
                   : 0;
    if (u->e->kind != SV_KIND_FUSED) return 0;
    return fuse_rows(u->s, u->e, res->hidden, 1 + res->n_accepted, err, errlen);
}

static int cb_prompt(void *user, const int32_t *tokens, int pos0, int n, const float *hidden, char *err,
                     size_t errlen) {
    cb_user *u = user;
    (void)tokens;
    if (!hidden || !u->e->want_states) return 0;
    if (u->e->has_hidden)
        return keep_states(u->e, u->s->split->d, pos0, hidden, n) < 0 ? (snprintf(err, errlen, "out of memory"), -1)
                                                                      : 0;
    if (u->e->kind != SV_KIND_FUSED) return 0;
    return fuse_rows(u->s, u->e, hidden, n, err, errlen);
}

static void cb_free(void *user) { free(user); }

// ---------------------------------------------------------------- the table
int sv_split_init(sv_server *s, int n, int idle_s, char *err, size_t errlen) {
    if (n <= 0) return 0;
    sv_splits *t = calloc(1, sizeof *t);
    if (!t || !(t->e = calloc((size_t)n, sizeof *t->e))) {
        free(t);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    t->n = n;
    t->idle_s = idle_s > 0 ? idle_s : SV_SPLIT_DEFAULT_IDLE;
    pthread_cond_init(&t->cv, NULL);
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    t->d = info.n_embd;
    t->n_layer = info.n_layer;
    t->kvd = info.n_head_kv * info.head_dim;
    if (s->head_eagle3) {   // the layers the head reads: from a drafter made once
        sd_method m;
        sd_drafter *d = NULL;
        sd_method_env env = sv_method_env(s);
        env.n_ctx = 16;
        if (sd_method_parse("eagle3:chain:1", &m, err, errlen) < 0 || sd_method_make(&m, &env, &d, err, errlen) < 0) {
            free(t->e);
            free(t);
            return -1;
        }
        int32_t ly[SD_MAX_HIDDEN_LAYERS];
        t->n_extract = sd_drafter_hidden_layers(d, ly);
        for (int i = 0; i < t->n_extract && i < 3; i++) t->extract[i] = ly[i];
        sd_drafter_free(d);
    }
    if (s->head_moa && sd_moa_lsa_new(&t->lsa, s->head_moa, s->model, err, errlen) == 0) {   // "lsa" states
        t->tli = sd_head_moa_tli(s->head_moa);
        t->moa_fp = sd_head_fingerprint(s->head_moa);
        t->kvf = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->n_layer * 2 * (size_t)t->kvd);
        t->cf = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->d);
        if (!t->kvf || !t->cf) {
            s->split = t;
            sv_split_free(s);
            return snprintf(err, errlen, "out of memory"), -1;
        }
    }
    err[0] = 0;   // (an MoA drafter without LSA: no "lsa" states, not an error)
    for (int i = 0; i < n; i++) {
        sv_split *e = &t->e[i];
        e->sl.id = -1 - i;
        e->sl.split = e;
        e->kbuf = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->kvd);
        e->vbuf = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->kvd);
        e->mk = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->kvd);
        e->mv = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->kvd);
        if (!(e->fbuf = malloc(sizeof(float) * SV_SPLIT_MAX_NODES * (size_t)t->d)) || !e->kbuf || !e->vbuf || !e->mk ||
            !e->mv) {
            s->split = t;
            sv_split_free(s);
            return snprintf(err, errlen, "out of memory"), -1;
        }
    }
    s->split = t;
    return 0;
}

static void gen_drop(sv_split *e) {
    for (int i = 0; i < e->n_stop; i++) free(e->stop[i]);
    e->n_stop = e->max_stop = 0;
    e->text_len = 0;
    sd_gen_free(e->g);
    sd_drafter_free(e->d);
    sd_sampler_free(e->smp);
    e->g = NULL, e->d = NULL, e->smp = NULL;
}

void sv_split_free(sv_server *s) {
    sv_splits *t = s->split;
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        sv_split *e = &t->e[i];
        gen_drop(e);
        sd_session_free(e->ss);
        free(e->rows);
        free(e->hid);
        free(e->text);
        free(e->fbuf);
        free(e->kbuf);
        free(e->vbuf);
        free(e->mk);
        free(e->mv);
        free(e->reply);
    }
    pthread_cond_destroy(&t->cv);
    sd_moa_lsa_free(t->lsa);
    free(t->kvf);
    free(t->cf);
    free(t->e);
    free(t);
    s->split = NULL;
}

int sv_split_has_work(const sv_server *s) {
    const sv_splits *t = s->split;
    if (!t) return 0;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].state == SPL_OPENING || t->e[i].state == SPL_ROUND) return 1;
    return 0;
}

// Sets e's reply (takes body) and wakes its waiters; under s->mu.
static void answer(sv_server *s, sv_split *e, int status, uint8_t *body, size_t len, int state) {
    free(e->reply);
    e->reply = body;
    e->reply_len = len;
    e->reply_status = status;
    e->state = state;
    e->last_used = sd_time_ms();
    pthread_cond_broadcast(&s->split->cv);
}

static void fail(sv_server *s, sv_split *e, const char *msg) {
    char *b = malloc(600);
    if (b) snprintf(b, 600, "{\"error\":{\"message\":\"split generation %s: %.400s\",\"type\":\"server_error\"}}",
                    e->id, msg);
    pthread_mutex_lock(&s->mu);
    // an open that fails frees the generation; a round that fails leaves it as it was, for a retry
    if (e->state == SPL_OPENING) gen_drop(e);
    answer(s, e, 500, (uint8_t *)b, b ? strlen(b) : 0, e->state == SPL_OPENING ? SPL_FAILED : SPL_READY);
    pthread_mutex_unlock(&s->mu);
}

void sv_split_fail_all(sv_server *s, const char *why) {
    sv_splits *t = s->split;
    if (!t) return;
    for (int i = 0; i < t->n; i++)
        if (t->e[i].state == SPL_OPENING || t->e[i].state == SPL_ROUND) fail(s, &t->e[i], why);
}

int sv_split_join(sv_server *s, int n) {
    sv_splits *t = s->split;
    if (!t) return n;
    char err[256];
    for (int i = 0; i < t->n; i++) {
        sv_split *e = &t->e[i];
        e->in_step = 0;
        pthread_mutex_lock(&s->mu);
        int st = e->state;
        pthread_mutex_unlock(&s->mu);
        if (st != SPL_OPENING && st != SPL_ROUND) continue;
        if (st == SPL_ROUND) e->n_rows = 0;
        if (sd_gen_step_begin(e->g, &e->sl.b, err, sizeof err) < 0) {
            fail(s, e, err);
            continue;
        }
        e->in_step = 1;
        if (e->sl.b.n > 0) {
            s->pass_sl[n] = &e->sl;
            s->pass_ss[n] = e->ss;
            s->pass_bs[n] = e->sl.b;
            n++;
        }
    }
    return n;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

// The round's reply: magic, seq, finish, quant, n_acc, bonus, n_rows, d,
// accepted tokens, rows (docs/split.md).
static void answer_round(sv_server *s, sv_split *e, const sd_step *st) {
    // a step cut short (n_predict, a stop) may end inside its accepted drafts: its last token then stands
    // for the bonus; an ended generation's step has none (bonus -1)
    const int na = SD_MAX(0, SD_MIN(st->n_accepted, st->n_tokens - 1));
    if (e->kind >= SV_KIND_KV && e->want_states) {   // the path's rows, as committed
        char err[256];
        e->n_rows = 0;
        const int n = SD_MIN(na + 1, sd_session_n_past(e->ss) - e->root_pos);
        if (kv_rows(s, e, e->root_pos, n, err, sizeof err) < 0) {
            fail(s, e, err);
            return;
        }
    }
    if (e->n_rows > na + 1) e->n_rows = na + 1;
    const size_t rb = sv_split_row_bytes(s->split, e);
    const int w = e->kind == SV_KIND_KV || e->kind == SV_KIND_MEAN ? s->split->kvd : s->split->d;   // LSA: the output's width (TLI rows: kvd)
    const size_t len = 20 + 4 * (size_t)na + rb * (size_t)e->n_rows;
    uint8_t *b = malloc(len);
    if (!b) {
        fail(s, e, "out of memory");
        return;
    }
    put_u32(b, SV_SPLIT_MAGIC_REP);
    put_u32(b + 4, e->seq_work);
    b[8] = (uint8_t)(st->finish == SD_FINISH_NONE ? 0 : st->finish + 1);
    b[9] = (uint8_t)(e->kind >= SV_KIND_KV ? e->kind : 1);   // int8 rows: 1 fused, 2 K,V, 3 LSA, 4 the layers' mean
    put_u16(b + 10, (uint16_t)na);
    int32_t bonus = st->n_tokens > na ? st->tokens[na] : -1;
    memcpy(b + 12, &bonus, 4);
    put_u16(b + 16, (uint16_t)e->n_rows);
    put_u16(b + 18, (uint16_t)w);
    memcpy(b + 20, st->tokens, 4 * (size_t)na);
    if (e->n_rows) memcpy(b + 20 + 4 * (size_t)na, e->rows, rb * (size_t)e->n_rows);
    pthread_mutex_lock(&s->mu);
    e->seq_done = e->seq_work;
    e->n_rounds++;
    e->n_tokens += st->n_tokens;
    s->m.generated_tokens += st->n_tokens;
    s->m.forwards++;
    s->m.drafted += st->n_drafted;
    s->m.accepted += na;
    answer(s, e, 200, b, len, SPL_READY);
    pthread_mutex_unlock(&s->mu);
}

// The open's reply (JSON): id, first token, sizes, the prompt's states (base64 of the int8 rows).
static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static void answer_open(sv_server *s, sv_split *e, int first, int finish) {
    const int d = s->split->d;
    if (e->kind >= SV_KIND_KV && e->want_states) {   // every prompt position's rows
        char err[256];
        e->n_rows = 0;
        if (kv_rows(s, e, 0, sd_session_n_past(e->ss), err, sizeof err) < 0) {
            fail(s, e, err);
            return;
        }
    }
    const size_t raw = sv_split_row_bytes(s->split, e) * (size_t)e->n_rows;
    char hl[16] = "null";   // the layer whose states end each position's rows
    if (e->has_hidden) snprintf(hl, sizeof hl, "%d", e->hidden_layer);
    const size_t len = 512 + (raw + 2) / 3 * 4;
    char *b = malloc(len);
    if (!b) {
        fail(s, e, "out of memory");
        return;
    }
    int o = snprintf(b, len,
                     "{\"id\":\"%s\",\"first_token\":%d,\"finish\":%d,\"n_ctx\":%d,\"max_nodes\":%d,\"idle_s\":%d,"
                     "\"n_embd\":%d,\"layers\":[%d,%d,%d],\"draw\":\"%s\",\"state_kind\":\"%s\",\"n_layer\":%d,\"kv_width\":%d,"
                     "\"hidden_layer\":%s,\"n_states\":%d,\"states\":\"",
                     e->id, first, finish, sd_session_n_ctx(e->ss), SV_SPLIT_MAX_NODES, s->split->idle_s, d,
                     s->split->extract[0], s->split->extract[1], s->split->extract[2],
                     s->o->draw == SD_DRAW_RACE ? "race" : "rejection", e->kind == SV_KIND_KV ? "kv" : e->kind == SV_KIND_LSA ? "lsa" : e->kind == SV_KIND_MEAN ? "mean" : e->kind == SV_KIND_FUSED ? "fused" : "none", s->split->n_layer,
                     s->split->kvd, hl, e->n_rows);
    const uint8_t *p = e->rows;
    size_t i = 0;
    for (; i + 3 <= raw; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        b[o++] = B64[v >> 18], b[o++] = B64[(v >> 12) & 63], b[o++] = B64[(v >> 6) & 63], b[o++] = B64[v & 63];
    }
    if (i < raw) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < raw ? (uint32_t)p[i + 1] << 8 : 0);
        b[o++] = B64[v >> 18], b[o++] = B64[(v >> 12) & 63];
        b[o++] = i + 1 < raw ? B64[(v >> 6) & 63] : '=';
        b[o++] = '=';
    }
    o += snprintf(b + o, len - (size_t)o, "\"}");
    pthread_mutex_lock(&s->mu);
    e->seq_done = 0;
    answer(s, e, 200, (uint8_t *)b, (size_t)o, SPL_READY);
    pthread_mutex_unlock(&s->mu);
}

// Stop strings over the step's tokens: appends their text; when one matches
// (its start at or after the text before them, less the longest stop + 1),
// cuts the generation after the token completing it (sd_gen_cut) and st
// with it. 0, or -1 with err.
static int split_stop(sv_server *s, sv_split *e, sd_step *st, char *err, size_t errlen) {
    if (e->n_stop == 0 || st->n_tokens < 1) return 0;
    const size_t prev = e->text_len;
    size_t ends[SV_SPLIT_MAX_NODES + 1];
    char piece[256];
    const int nt = SD_MIN(st->n_tokens, SV_SPLIT_MAX_NODES + 1);
    for (int k = 0; k < nt; k++) {
        int n = sd_token_to_piece(s->tok, st->tokens[k], 0, piece, sizeof piece);
        if (n < 0) n = 0;
        if (n > (int)sizeof piece) n = (int)sizeof piece;
        if (sv_buf_add(&e->text, &e->text_len, &e->text_cap, piece, (size_t)n) < 0)
            return snprintf(err, errlen, "out of memory"), -1;
        ends[k] = e->text_len;
    }
    const size_t from = prev > (size_t)e->max_stop ? prev - (size_t)e->max_stop + 1 : 0;
    long best = -1;
    size_t end = 0;
    for (int i = 0; i < e->n_stop; i++) {
        const size_t L = strlen(e->stop[i]);
        for (size_t p = from; p + L <= e->text_len && (best < 0 || (long)p <= best); p++)
            if (!memcmp(e->text + p, e->stop[i], L)) {
                if (best < 0 || (long)p < best || p + L < end) best = (long)p, end = p + L;
                break;
            }
    }
    if (best < 0) return 0;
    int keep = 0;
    while (keep < nt && ends[keep] < end) keep++;
    keep = SD_MIN(keep + 1, st->n_tokens);
    if (sd_gen_cut(e->g, keep, err, errlen) < 0) return -1;
    st->n_tokens = keep;
    st->finish = SD_FINISH_STOPPED;
    e->text_len = (size_t)best;
    return 0;
}

void sv_split_end(sv_server *s, int n) {
    sv_splits *t = s->split;
    if (!t) return;
    char err[256];
    for (int i = 0; i < t->n; i++) {
        sv_split *e = &t->e[i];
        if (!e->in_step) continue;
        e->in_step = 0;
        if (e->sl.b.n > 0) {   // was it evaluated?
            int k = 0;
            while (k < n && s->pass_sl[k] != &e->sl) k++;
            if (k == n || !s->pass_ok[k]) {
                fail(s, e, k < n ? s->pass_err[k] : "not evaluated");
                continue;
            }
        }
        sd_step st;
        if (sd_gen_step_end(e->g, &st, err, sizeof err) < 0 ||
            (e->state == SPL_ROUND && split_stop(s, e, &st, err, sizeof err) < 0)) {
            fail(s, e, err);
            continue;
        }
        if (e->state == SPL_ROUND) {
            answer_round(s, e, &st);
            continue;
        }
        if (sd_gen_prompt_left(e->g) > 0) continue;   // the next chunk next round
        // the prompt is in: the first token comes without a forward
        sd_batch b;
        if (sd_gen_step_begin(e->g, &b, err, sizeof err) < 0 || b.n != 0 ||
            sd_gen_step_end(e->g, &st, err, sizeof err) < 0 || st.n_tokens < 1) {
            fail(s, e, b.n != 0 ? "the first token needs no forward" : err);
            continue;
        }
        if (split_stop(s, e, &st, err, sizeof err) < 0) {
            fail(s, e, err);
            continue;
        }
        answer_open(s, e, st.tokens[0], st.finish == SD_FINISH_NONE ? 0 : st.finish + 1);
    }
}

// Used by split_http.c: makes e's generation for prompt (under no lock; e is
// the caller's, state SPL_OPENING not yet published). 0 or -1 with err.
int sv_split_make(sv_server *s, sv_split *e, const int32_t *prompt, int n_prompt, int n_predict,
                  const sd_sampler_params *sp, char *err, size_t errlen);
int sv_split_make(sv_server *s, sv_split *e, const int32_t *prompt, int n_prompt, int n_predict,
                  const sd_sampler_params *sp, char *err, size_t errlen) {
    if (!e->ss) {
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = s->n_ctx;
        sp.n_batch = SV_N_BATCH;
        sp.pool = s->pool;
        if (sd_session_new(&e->ss, s->model, &sp, err, errlen) < 0) return -1;
    }
    gen_drop(e);
    sd_session_truncate(e->ss, 0, NULL, 0);
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    if (sd_sampler_new(&e->smp, sp, info.n_vocab, err, errlen) < 0) return -1;
    cb_user *u = malloc(sizeof *u);
    if (!u) return snprintf(err, errlen, "out of memory"), -1;
    u->s = s, u->e = e;
    // the target's states: the head's layers to fuse, or the one an MoA drafter reads
    const int nh = e->kind == SV_KIND_FUSED ? s->split->n_extract : e->has_hidden ? 1 : 0;
    sd_drafter_callbacks cb = {.name = "split-client", .user = u, .propose = cb_propose, .step = cb_step,
                               .prompt = cb_prompt, .free = cb_free, .n_hidden_layers = nh};
    for (int i = 0; i < nh; i++) cb.hidden_layers[i] = e->has_hidden ? e->hidden_layer : s->split->extract[i];
    if (sd_drafter_from_callbacks(&e->d, &cb, err, errlen) < 0) {
        free(u);
        gen_drop(e);
        return -1;
    }
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n_predict;
    gp.fast_prompt = s->o->fast_prompt;
    gp.max_nodes = SV_SPLIT_MAX_NODES;
    gp.n_batch = SV_PREFILL_CHUNK;
    e->n_rows = 0;
    if (sd_gen_new(&e->g, e->ss, e->smp, e->d, &gp, err, errlen) < 0 ||
        sd_gen_set_prompt(e->g, prompt, n_prompt, 0, err, errlen) < 0) {
        gen_drop(e);
        return -1;
    }
    e->n_predict = n_predict;
    return 0;
}

// client.c - the client's loop (client.h, docs/split.md). The text is
// text[0 .. n_text): the prompt, then every token emitted; text[0 .. nv) is
// verified, text[nv - 1] being the token the server's generation ends with
// (the root of the next tree, not yet in its cache), and text[nv .. n_text)
// the tokens drafted offline, unverified. Online, every round sends a tree
// rooted at text[nv - 1] and appends the accepted path and the bonus token.
// Offline, the drafter's best chain is emitted unverified, the head fed its
// own predicted states; when the server answers again the round in flight
// is sent again (same sequence number: the server answers it once), then
// the unverified tokens as chains: what the target agrees with is kept, the
// rest replaced by its tokens.
#include "client/client.h"
#include "stoptext.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAGIC_REQ 0x31524453u
#define MAGIC_REP 0x31414453u
#define MAX_NODES 64
#ifndef SD_MIN
#define SD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SD_MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

struct cl_client {
    cl_opts o;
    const sd_model *m;
    const sd_tokenizer *tok;
    sd_drafter *d;
    sd_tree *tree;
    cl_net *net;
    int n_vocab, d_embd, n_ctx;
    int32_t *text;
    int n_text, nv, n_prompt;
    int n_priv;          // text[0 .. n_priv): the private prefix, never sent (the server's positions start after it)
    float *st;           // (n_ctx, d) the target's fused states known per position
    uint8_t *st_ok;      // (n_ctx)
    char id[64];
    int server_max_nodes;
    uint32_t seq_done;
    int pending;         // a round sent without an answer
    uint8_t pbody[12 + 6 * MAX_NODES];
    size_t plen;
    int32_t ptok[MAX_NODES];   // its tree
    int16_t ppar[MAX_NODES];
    int pn;
    int online, finished;
    const tx_sink *sink;
    cl_stats *s;
    float *rowbuf;       // (MAX_NODES, d) fused rows
    int n_layer, kvd;    // kv (MoA): the target's layers and K (or V) width; a position's rows (n_layer, 2 kvd)
    float *kvbuf;        // (MAX_NODES, n_layer, 2 kvd) K,V rows
    double t0;
    double stuck_since;  // offline with nothing to draft since (ms), 0: not stuck
    tx_text *tx;         // the text's bytes, stop strings, what was emitted (text.h)
    int offline_end;     // the text was ended offline (an end token, a stop string in unverified text)
    int sampled;         // drafts are the drafter's samples under the target's race noise (sd_drafter_draft_sampled)
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void note(cl_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(cl_client *c, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->sink && c->sink->note) c->sink->note(c->sink->user, line);
}

int cl_client_new(cl_client **out, const cl_opts *o, const sd_model *model, sd_drafter *d, char *err, size_t errlen) {
    *out = NULL;
    cl_client *c = calloc(1, sizeof *c);
    if (!c) return snprintf(err, errlen, "out of memory"), -1;
    c->o = *o;
    c->m = model;
    c->tok = sd_model_tokenizer(model);
    c->d = d;
    sd_model_info info;
    sd_model_get_info(model, &info);
    c->n_vocab = info.n_vocab;
    c->d_embd = info.n_embd;
    c->n_ctx = 4096;
    c->n_layer = info.n_layer;
    c->kvd = info.n_head_kv * info.head_dim;
    const size_t ld = SD_MAX((size_t)c->n_layer, (size_t)(o->tli > 0 ? o->tli : 0) + 1) * 2 * (size_t)c->kvd +
                      2 * (size_t)c->d_embd;   // floats a position: either kind, and a state
    if (o->kv && !(c->kvbuf = malloc(sizeof(float) * MAX_NODES * ld))) {
        free(c);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    c->text = malloc(sizeof(int32_t) * (size_t)c->n_ctx);
    c->st = malloc(sizeof(float) * (size_t)c->n_ctx * (size_t)c->d_embd);
    c->st_ok = calloc((size_t)c->n_ctx, 1);
    c->rowbuf = malloc(sizeof(float) * MAX_NODES * (size_t)c->d_embd);
    if (!c->text || !c->st || !c->st_ok || !c->rowbuf ||
        tx_text_new(&c->tx, c->tok, c->n_ctx, o->stop, o->n_stop, err, errlen) < 0 ||
        sd_tree_new(&c->tree, MAX_NODES, c->n_vocab, err, errlen) < 0 ||
        cl_net_new(&c->net, o->server, o->timeout_ms, o->api_key, err, errlen) < 0) {
        if (!err[0]) snprintf(err, errlen, "out of memory");
        cl_client_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void cl_client_free(cl_client *c) {
    if (!c) return;
    cl_net_free(c->net);
    tx_text_free(c->tx);
    sd_tree_destroy(c->tree);
    free(c->text);
    free(c->st);
    free(c->st_ok);
    free(c->rowbuf);
    free(c->kvbuf);
    free(c);
}

const int32_t *cl_client_tokens(const cl_client *c, int *n) {
    *n = c->n_text - c->n_prompt;
    return c->text + c->n_prompt;
}

static void count_net(cl_client *c) {
    int64_t calls;
    cl_net_counts(c->net, &c->s->bytes_sent, &c->s->bytes_recv, &calls);
    cl_net_body_counts(c->net, &c->s->body_sent, &c->s->body_recv);
    c->s->calls = (long)calls;
}

// After the text grew: emits what is safe (all with final); a stop string
// ends the text after the token completing it.
static void after_change(cl_client *c, int final) {
    const int out0 = tx_text_n_out(c->tx);
    int stopped = 0;
    const int keep = tx_text_sync(c->tx, c->text, c->n_text, c->nv, final, c->sink, &stopped);
    if (tx_text_n_out(c->tx) > out0 && c->s->ttft_ms <= 0) c->s->ttft_ms = now_ms() - c->t0;
    if (!stopped) return;
    c->n_text = keep;
    if (c->nv > keep) c->nv = keep;
    c->offline_end = c->nv < keep;   // matched in unverified text: the server may still disagree
    c->finished = 1;
    snprintf(c->s->finish, sizeof c->s->finish, "stopped");
}

// Cuts the text to n tokens (the emitted ones beyond are retracted).
static void cut_to(cl_client *c, int n, const char *why) {
    c->n_text = n;
    if (c->nv > n) c->nv = n;
    tx_text_cut(c->tx, n, why, c->sink);
}

static int gen_left(const cl_client *c) { return c->o.n_predict - (c->n_text - c->n_prompt); }

// Puts the int8 rows (n, 4 + d) of positions pos0.. into the state table.
static void take_rows(cl_client *c, const uint8_t *rows, int n, int pos0, float *out) {
    const int d = c->d_embd;
    for (int i = 0; i < n; i++) {
        const uint8_t *r = rows + (size_t)i * (4 + (size_t)d);
        float sc;
        memcpy(&sc, r, 4);
        float *o = out + (size_t)i * d;
        for (int j = 0; j < d; j++) o[j] = sc * (float)(int8_t)r[4 + j];
        int p = pos0 + i;
        if (p >= 0 && p < c->n_ctx) {
            memcpy(c->st + (size_t)p * d, o, sizeof(float) * (size_t)d);
            c->st_ok[p] = 1;
        }
    }
}

// Bytes of one position's states in a reply.
static size_t row_bytes(const cl_client *c) {
    const size_t qb = 4 + (size_t)c->kvd, hb = c->o.kv && c->o.has_hidden ? 4 + (size_t)c->d_embd : 0;
    return c->o.kv == 2   ? 4 + (size_t)c->d_embd + 2 * (size_t)c->o.tli * qb + hb
           : c->o.kv == 3 ? 2 * (size_t)(1 + c->o.tli) * qb + hb
           : c->o.kv      ? 2 * (size_t)c->n_layer * qb + hb
                          : 4 + (size_t)c->d_embd;
}

static void dequant(const uint8_t *r, int w, float *o) {
    float sc;
    memcpy(&sc, r, 4);
    for (int j = 0; j < w; j++) o[j] = sc * (float)(int8_t)r[4 + j];
}

// kv: n positions' int8 rows into c->kvbuf as the drafter takes them: K,V
// rows (n, 2 L, 4 + kvd) into (n, L, 2 kvd) floats, [K | V] a layer; lsa:
// (4 + d) then (2 tli, 4 + kvd) into (n, d + tli 2 kvd); mean: as K,V rows
// of 1 + tli layers; has_hidden: each position's state (4 + d) last, into
// (n, d) after all n positions' rows.
static void kv_floats(cl_client *c, const uint8_t *rows, int n) {
    const int w = c->kvd, lsa = c->o.kv == 2, d = c->d_embd;
    const int nr = 2 * (lsa ? c->o.tli : c->o.kv == 3 ? 1 + c->o.tli : c->n_layer);
    const size_t rb = row_bytes(c), ld = (lsa ? (size_t)d : 0) + (size_t)nr * w;
    for (int p = 0; p < n; p++) {
        const uint8_t *r = rows + rb * (size_t)p;
        float *o = c->kvbuf + ld * (size_t)p;
        if (lsa) {
            dequant(r, d, o);
            r += 4 + (size_t)d, o += d;
        }
        for (int i = 0; i < nr; i++) dequant(r + (size_t)i * (4 + (size_t)w), w, o + (size_t)i * w);
        if (c->o.has_hidden) dequant(rows + rb * (size_t)(p + 1) - (4 + (size_t)d), d, c->kvbuf + ld * (size_t)n + (size_t)p * d);
    }
}

// kv: the drafter hears the K,V rows (n positions) of positions pos0.. of the text.
static int kv_tell(cl_client *c, const uint8_t *rows, int pos0, int n, char *err, size_t errlen) {
    const size_t rb = row_bytes(c);
    for (int i = 0; i < n; i += MAX_NODES) {
        const int k = SD_MIN(MAX_NODES, n - i);
        kv_floats(c, rows + rb * (size_t)i, k);
        if (sd_drafter_tell_prompt(c->d, c->text, pos0 + i, k, c->kvbuf, err, errlen) < 0) return -1;
    }
    return 0;
}

// The drafter forgets and hears the verified text again with every state known.
// (kv: the MoA drafter follows the text by position and heard every verified
// position's rows as they came: nothing to do.)
static int refeed(cl_client *c, char *err, size_t errlen) {
    if (c->o.kv) return 0;
    sd_drafter_reset(c->d);
    int p = 0;
    while (p < c->nv) {
        while (p < c->nv && !c->st_ok[p]) p++;
        int q = p;
        while (q < c->nv && c->st_ok[q]) q++;
        if (q > p && sd_drafter_tell_prompt(c->d, c->text, p, q - p, c->st + (size_t)p * c->d_embd, err, errlen) < 0)
            return -1;
        p = q;
    }
    return 0;
}

// The target's tokens V[0..m) at positions base.. (text[base - 1] the root):
// keeps what the text agrees with, replaces the rest. Returns how many were replaced.
static int reconcile(cl_client *c, const int32_t *V, int m, int base) {
    int j = 0;
    while (j < m && base + j < c->n_text && c->text[base + j] == V[j]) j++;
    for (int k = 0; k < j; k++)
        if (base + k >= c->nv) c->s->confirmed++;
    int replaced = 0;
    if (j < m && base + j < c->n_text) {
        replaced = c->n_text - (base + j);
        c->s->replaced += replaced;
        char why[160];
        snprintf(why, sizeof why, "the server verified %d of the unverified tokens and replaced the next %d",
                 c->s->confirmed > 0 ? (int)c->s->confirmed : 0, replaced);
        cut_to(c, base + j, why);
        if (c->offline_end) {   // the end decided offline went with them: generate on
            c->offline_end = 0;
            c->finished = 0;
            snprintf(c->s->finish, sizeof c->s->finish, "length");
        }
    }
    const int lim = SD_MIN(c->n_ctx, c->n_prompt + c->o.n_predict);
    for (int k = j; k < m && c->n_text < lim; k++) c->text[c->n_text++] = V[k];
    if (c->nv < base + m) c->nv = base + m;
    if (c->nv > c->n_text) c->nv = c->n_text;
    if (c->nv >= c->n_prompt + c->o.n_predict) c->finished = 1;   // the verified text is complete
    after_change(c, 0);
    return replaced;
}

// ---------------------------------------------------------------- calls

static int parse_finish(int f) { return f; }

static void set_finish(cl_client *c, int f) {
    static const char *names[] = {"none", "length", "eog", "ctx", "stopped", "ended"};
    if (f >= 1 && f <= 5) {
        snprintf(c->s->finish, sizeof c->s->finish, "%s", names[f]);
        c->finished = 1;
    }
}

static int b64val(int ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

// The open's "states" for an MoA drafter (o.kv).
static const char *kv_kind(const cl_client *c) { return c->o.kv == 2 ? "lsa" : c->o.kv == 3 ? "mean" : "kv"; }

// Opens the generation over text[0 .. nv - 1) (its first token checked
// against text[nv - 1] when there is one). 1: opened; 0: no reply (offline);
// -1: refused (err).
static int do_open(cl_client *c, char *err, size_t errlen) {
    const int base = c->nv > 0 ? c->nv - 1 : c->n_text;   // the prompt of the open: text[n_priv .. base)
    json_t *ids = json_array();
    for (int i = c->n_priv; i < base; i++) json_array_append_new(ids, json_integer(c->text[i]));
    int left = c->o.n_predict - (base - c->n_prompt);
    const sd_sampler_params *sp = &c->o.sp;
    json_t *o = json_pack("{s:o, s:i, s:o, s:f, s:i, s:f, s:f, s:I}", "prompt", ids, "n_predict", left > 0 ? left : 1,
                          "states", c->o.states && c->o.kv ? json_string(kv_kind(c))
                                                           : json_boolean(c->o.states), "temperature", (double)sp->temp, "top_k", sp->top_k, "top_p",
                          (double)sp->top_p, "min_p", (double)sp->min_p, "seed", (json_int_t)sp->seed);
    if (o && c->o.states && c->o.kv == 3) json_object_set_new(o, "tli", json_integer(c->o.tli));   // after the mean
    if (o && c->o.states && c->o.kv && c->o.has_hidden)   // the drafter reads the target's states at this layer
        json_object_set_new(o, "hidden_layer", json_integer(c->o.hidden_layer));
    if (o && c->o.kv == 2) {   // the server runs LSA with its own drafter: it must be ours
        char fp[24];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)c->o.drafter_fp);
        json_object_set_new(o, "drafter", json_string(fp));
    }
    if (o && c->o.n_stop > 0) {   // the server stops its generation at them too
        json_t *sa = json_array();
        for (int i = 0; i < c->o.n_stop; i++) json_array_append_new(sa, json_string(c->o.stop[i]));
        json_object_set_new(o, "stop", sa);
    }
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!body) return snprintf(err, errlen, "out of memory"), -1;
    cl_reply r;
    int rc = cl_net_post(c->net, "/v1/split/open", body, strlen(body), "application/json", 1, &r);
    free(body);
    count_net(c);
    if (rc < 0 || r.status >= 500) {
        snprintf(c->s->last_error, sizeof c->s->last_error, "open: %.200s", rc < 0 ? r.err : r.body);
        return 0;
    }
    json_error_t je;
    json_t *a = json_loadb(r.body, r.len, 0, &je);
    if (r.status != 200) {
        const char *m = a ? json_string_value(json_object_get(json_object_get(a, "error"), "message")) : NULL;
        snprintf(err, errlen, "the server refused the generation (HTTP %d): %s%s", r.status, m ? m : r.body,
                 c->o.kv == 3 && c->o.states && r.status == 400 && strstr(r.body, "invalid_states")
                     ? " (a server from before 2026-11-29 sends no layers' mean: --kv-rows asks for every layer's rows)"
                     : "");
        json_decref(a);
        return -1;
    }
    const char *id = a ? json_string_value(json_object_get(a, "id")) : NULL;
    json_t *ft = a ? json_object_get(a, "first_token") : NULL;
    if (!id || !json_is_integer(ft)) {
        json_decref(a);
        return snprintf(err, errlen, "the server's open reply is not understood"), -1;
    }
    snprintf(c->id, sizeof c->id, "%s", id);
    c->server_max_nodes = (int)json_integer_value(json_object_get(a, "max_nodes"));
    int n_states = (int)json_integer_value(json_object_get(a, "n_states"));
    const char *b64 = json_string_value(json_object_get(a, "states"));
    const char *kind = json_string_value(json_object_get(a, "state_kind"));
    const int kv_ok = !c->o.kv || (kind && !strcmp(kind, kv_kind(c)) &&
                                   (int)json_integer_value(json_object_get(a, "n_layer")) == c->n_layer &&
                                   (int)json_integer_value(json_object_get(a, "kv_width")) == c->kvd);
    if (c->o.kv && c->o.states && !kv_ok) {
        json_decref(a);
        return snprintf(err, errlen, "the server sends no K,V rows for this model (an MoA client needs a server of "
                                     "the same target)"), -1;
    }
    const json_t *hl = json_object_get(a, "hidden_layer");
    if (c->o.kv && c->o.states && c->o.has_hidden && (!json_is_integer(hl) || json_integer_value(hl) != c->o.hidden_layer)) {
        json_decref(a);
        return snprintf(err, errlen, "the server does not send the target's states this MoA drafter reads (trained "
                                     "with --ca-hidden or --sa-hidden): a specdec server from before 2026-11-29?"), -1;
    }
    if (b64 && n_states > 0 && (int)json_integer_value(json_object_get(a, "n_embd")) == c->d_embd) {
        size_t L = strlen(b64), o2 = 0;
        uint8_t *raw = malloc(L / 4 * 3 + 3);
        for (size_t i = 0; raw && i + 4 <= L; i += 4) {
            int v0 = b64val(b64[i]), v1 = b64val(b64[i + 1]), v2 = b64val(b64[i + 2]), v3 = b64val(b64[i + 3]);
            uint32_t v = (uint32_t)(v0 & 63) << 18 | (uint32_t)(v1 & 63) << 12 | (uint32_t)(v2 < 0 ? 0 : v2) << 6 |
                         (uint32_t)(v3 < 0 ? 0 : v3);
            raw[o2++] = (uint8_t)(v >> 16);
            if (v2 >= 0) raw[o2++] = (uint8_t)(v >> 8);
            if (v3 >= 0) raw[o2++] = (uint8_t)v;
        }
        const size_t rb = row_bytes(c);
        if (raw && o2 >= rb * (size_t)n_states && c->o.kv) {
            if (kv_tell(c, raw, c->n_priv, SD_MIN(n_states, base - c->n_priv), err, errlen) < 0) {
                free(raw);
                json_decref(a);
                return -1;
            }
        } else if (raw && o2 >= rb * (size_t)n_states) {
            float *tmp = malloc(sizeof(float) * (size_t)c->d_embd);
            for (int i = 0; tmp && i < n_states && c->n_priv + i < base; i++)
                take_rows(c, raw + rb * (size_t)i, 1, c->n_priv + i, tmp);
            free(tmp);
        }
        free(raw);
    }
    const char *draw = json_string_value(json_object_get(a, "draw"));
    c->sampled = c->o.sp.temp > 0 && !c->o.greedy_drafts && c->o.sp.draw == SD_DRAW_RACE && draw && !strcmp(draw, "race");
    int first = (int)json_integer_value(ft);
    int fin = (int)json_integer_value(json_object_get(a, "finish"));
    json_decref(a);
    c->seq_done = 0;
    c->pending = 0;
    c->s->open_ms += r.ms;
    int32_t V = first;
    reconcile(c, &V, 1, base);
    if (base == c->n_prompt && c->s->n_prompt == 0) c->s->n_prompt = c->n_prompt;
    set_finish(c, parse_finish(fin));
    return 1;
}

// Sends the pending round. 1 answered (applied), 0 no reply, 2 the generation
// is gone (reopen), -1 refused (err).
static int send_pending(cl_client *c, char *err, size_t errlen) {
    char url[128];
    snprintf(url, sizeof url, "/v1/split/round?id=%s", c->id);
    cl_reply r;
    int rc = cl_net_post(c->net, url, c->pbody, c->plen, "application/octet-stream", 0, &r);
    count_net(c);
    if (rc < 0 || r.status >= 500) {
        snprintf(c->s->last_error, sizeof c->s->last_error, "round: %.200s",
                 rc < 0 ? r.err : r.status == 503 ? "server busy (503)" : r.body);
        return 0;
    }
    if (r.status == 404) return 2;
    if (r.status != 200 || r.len < 20) {
        snprintf(err, errlen, "round refused (HTTP %d): %.300s", r.status, r.body);
        return r.status == 409 ? 2 : -1;   // out of step with the server: open again from the verified text
    }
    const uint8_t *b = (const uint8_t *)r.body;
    uint32_t magic, seq;
    uint16_t na, nr, d;
    int32_t bonus;
    memcpy(&magic, b, 4);
    memcpy(&seq, b + 4, 4);
    memcpy(&na, b + 10, 2);
    memcpy(&bonus, b + 12, 4);
    memcpy(&nr, b + 16, 2);
    memcpy(&d, b + 18, 2);
    const int fin = b[8];
    uint32_t want;
    memcpy(&want, c->pbody + 4, 4);
    const int want_type = c->o.kv ? c->o.kv + 1 : 1, want_w = c->o.kv == 1 || c->o.kv == 3 ? c->kvd : c->d_embd;
    if (magic != MAGIC_REP || seq != want || na >= c->pn || (nr && (b[9] != want_type || d != want_w)) ||
        r.len != 20 + 4 * (size_t)na + (size_t)nr * (nr ? row_bytes(c) : 0) || nr > na + 1)
        return snprintf(err, errlen, "the server's round reply is not understood"), -1;
    c->s->round_ms_sum += r.ms;
    if (r.ms > c->s->round_ms_max) c->s->round_ms_max = r.ms;
    if (c->s->rounds >= c->s->round_ms_cap) {
        long cap = c->s->round_ms_cap ? 2 * c->s->round_ms_cap : 256;
        double *p = realloc(c->s->round_ms, sizeof(double) * (size_t)cap);
        if (p) c->s->round_ms = p, c->s->round_ms_cap = cap;
    }
    if (c->s->rounds < c->s->round_ms_cap) c->s->round_ms[c->s->rounds] = r.ms;
    c->s->rounds++;
    c->s->draft_nodes += c->pn - 1;
    c->s->accepted += na;
    c->seq_done = seq;
    c->pending = 0;
    int32_t V[MAX_NODES + 1];
    memcpy(V, b + 20, 4 * (size_t)na);
    V[na] = bonus;
    const int nV = na + (bonus >= 0);   // no bonus: the server's generation had ended
    const int base = c->nv;   // the tree's root is text[nv - 1]
    // the path in the tree, for the drafter (when the text was not drafted offline meanwhile)
    int32_t path[MAX_NODES];
    int np = 1, node = 0, ok = 1;
    path[0] = 0;
    for (int k = 0; k < na && ok; k++) {
        int next = -1;
        for (int i = node + 1; i < c->pn; i++)
            if (c->ppar[i] == node && c->ptok[i] == V[k]) {
                next = i;
                break;
            }
        if (next < 0) ok = 0;
        else path[np++] = node = next;
    }
    if (!ok) return snprintf(err, errlen, "the server accepted a path that is not in the tree"), -1;
    const uint8_t *rows = b + 20 + 4 * (size_t)na;
    if (!c->o.kv) take_rows(c, rows, nr, base - 1, c->rowbuf);
    const int was_online = c->n_text == c->nv;
    reconcile(c, V, nV, base);
    if (c->o.kv) {   // MoA: the path's K,V rows; online, with the step's outcome
        const int n = SD_MIN(nr, c->n_text - (base - 1));
        if (was_online && bonus >= 0 && n == np) {
            kv_floats(c, rows, n);
            if (sd_drafter_tell(c->d, c->tree, path, np, bonus, c->kvbuf, err, errlen) < 0) return -1;
        } else {
            if (was_online && bonus >= 0 && sd_drafter_tell(c->d, c->tree, path, np, bonus, NULL, err, errlen) < 0)
                return -1;
            if (n > 0 && kv_tell(c, rows, base - 1, n, err, errlen) < 0) return -1;
        }
        set_finish(c, bonus < 0 ? (fin ? fin : 5) : fin);
        return 1;
    }
    if (bonus < 0) {
        set_finish(c, fin ? fin : 5);
        return 1;
    }
    if (was_online && nr == na + 1 &&
        sd_drafter_tell(c->d, c->tree, path, np, bonus, c->rowbuf, err, errlen) < 0)
        return -1;
    if (was_online && nr != na + 1 && sd_drafter_tell(c->d, c->tree, path, np, bonus, NULL, err, errlen) < 0)
        return -1;
    set_finish(c, fin);
    return 1;
}

// Makes the pending round from a tree (tok, par, n).
static void make_round(cl_client *c, const int32_t *tok, const int16_t *par, int n) {
    uint32_t magic = MAGIC_REQ, seq = c->seq_done + 1;
    uint16_t nn = (uint16_t)n, flags = (uint16_t)(c->o.states ? 1 : 0);
    memcpy(c->pbody, &magic, 4);
    memcpy(c->pbody + 4, &seq, 4);
    memcpy(c->pbody + 8, &nn, 2);
    memcpy(c->pbody + 10, &flags, 2);
    memcpy(c->pbody + 12, tok, 4 * (size_t)n);
    memcpy(c->pbody + 12 + 4 * (size_t)n, par, 2 * (size_t)n);
    c->plen = 12 + 6 * (size_t)n;
    memcpy(c->ptok, tok, 4 * (size_t)n);
    memcpy(c->ppar, par, 2 * (size_t)n);
    c->pn = n;
    c->pending = 1;
}

static void go_offline(cl_client *c) {
    if (!c->online) return;
    c->online = 0;
    c->s->offline_periods++;
    note(c, "server unreachable (%s): drafting on alone, tokens unverified", c->s->last_error);
    cl_net_probe_start(c->net, c->o.retry_ms);
}

// Back online: the round in flight, then the unverified tokens as chains.
// 1 when everything is verified, 0 still offline, -1 error.
static int resync(cl_client *c, char *err, size_t errlen) {
    const long conf0 = c->s->confirmed, rep0 = c->s->replaced;
    const int unver0 = c->n_text - c->nv;
    for (int guard = 0; guard < 10000; guard++) {
        int rc;
        if (c->pending) rc = send_pending(c, err, errlen);
        else if (!c->id[0]) rc = 2;
        else if (c->n_text > c->nv && !c->finished) {   // the next chain of unverified tokens
            int32_t tok[MAX_NODES];
            int16_t par[MAX_NODES];
            int cap = SD_MIN(c->o.max_nodes, c->server_max_nodes > 0 ? c->server_max_nodes : MAX_NODES);
            int n = 1 + SD_MIN(cap - 1, c->n_text - c->nv);
            for (int i = 0; i < n; i++) tok[i] = c->text[c->nv - 1 + i], par[i] = (int16_t)(i - 1);
            make_round(c, tok, par, n);
            continue;
        } else break;
        if (rc == 0) return 0;
        if (rc < 0) return -1;
        if (rc == 2) {   // lost (expired, restarted): open again from the verified text
            c->id[0] = 0;
            c->pending = 0;
            c->finished = 0;
            int o = do_open(c, err, errlen);
            if (o <= 0) return o;
            c->s->reopened++;
            note(c, "the server had lost the generation: opened it again from the %d verified tokens", c->nv);
        }
    }
    if (c->n_text > c->nv && c->finished) {   // the server's generation ended before the text did
        int cut = c->n_text - c->nv;
        c->s->replaced += cut;
        cut_to(c, c->nv, "the target's generation ended before them");
    }
    if (unver0 > 0)
        note(c, "server back: %ld of %d unverified tokens verified as they were, %ld replaced by the target's", 
             c->s->confirmed - conf0, unver0, c->s->replaced - rep0);
    if (refeed(c, err, errlen) < 0) return -1;
    c->online = 1;
    cl_net_probe_stop(c->net);
    return 1;
}

// The drafter's tree for the text: its samples under the target's noise when
// the server samples with the race draw, else its most likely tokens.
static int draft(cl_client *c, int max_nodes, char *err, size_t errlen) {
    if (c->sampled)
        return sd_drafter_draft_sampled(c->d, c->text, c->n_text, max_nodes, &c->o.sp, -(int64_t)c->n_priv, c->tree,
                                        err, errlen);
    return sd_drafter_draft(c->d, c->text, c->n_text, max_nodes, c->tree, err, errlen);
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL); }

// One offline step: the drafter's best chain, emitted unverified. 0, or -1.
static int offline_step(cl_client *c, char *err, size_t errlen) {
    const int room = SD_MIN(gen_left(c), c->n_ctx - c->n_text);
    if (room <= 0) return 0;
    int nodes = 1 + SD_MIN(c->o.offline_depth, room);
    if (draft(c, SD_MAX(nodes, c->o.max_nodes), err, errlen) < 0)
        return -1;
    int32_t path[MAX_NODES];
    int np = 1, node = 0;
    path[0] = 0;
    const int n = sd_tree_size(c->tree);
    while (np < nodes) {   // the most probable child (sampled: the first, the drafter's draw), depth by depth
        int best = -1;
        float bp = -1.0f;
        for (int i = node + 1; i < n && !(c->sampled && best >= 0); i++)
            if (sd_tree_parent(c->tree, i) == node && sd_tree_p(c->tree, i) > bp) bp = sd_tree_p(c->tree, i), best = i;
        if (best < 0) break;
        path[np++] = node = best;
    }
    if (np < 2) {   // nothing to draft from (no states: --no-states): wait for the server
        if (c->stuck_since <= 0) c->stuck_since = now_ms();
        if (now_ms() - c->stuck_since > c->o.final_wait_ms) {
            c->finished = 1;
            snprintf(c->s->finish, sizeof c->s->finish, "offline");
            note(c, "offline: the drafter proposes nothing from here; stopping (the server is still unreachable)");
        }
        sleep_ms(c->o.retry_ms);
        return 0;
    }
    c->stuck_since = 0;
    const int from = c->n_text;
    for (int k = 1; k < np; k++) c->text[c->n_text++] = sd_tree_token(c->tree, path[k]);
    // the last token becomes the next root; the path's states are the head's own
    if (sd_drafter_tell(c->d, c->tree, path, np - 1, sd_tree_token(c->tree, path[np - 1]), NULL, err, errlen) < 0)
        return -1;
    for (int k = from; k < c->n_text; k++)
        if (sd_token_is_eog(c->tok, c->text[k])) {   // the drafter ended the text: stop there
            cut_to(c, k + 1, "after an end token");
            c->finished = 1;
            c->offline_end = 1;
            snprintf(c->s->finish, sizeof c->s->finish, "eog");
            break;
        }
    c->s->unverified_emitted += c->n_text - from;   // (what an end token cut off was never emitted)
    after_change(c, 0);
    return 0;
}


int cl_client_run(cl_client *c, const int32_t *prompt, int n_prompt, int n_private, const tx_sink *sink, cl_stats *st,
                  char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    snprintf(st->finish, sizeof st->finish, "length");
    st->stop_bytes = -1;
    c->s = st;
    c->sink = sink;
    c->t0 = now_ms();
    if (n_prompt < 1 || n_prompt + c->o.n_predict + 1 > c->n_ctx)
        return snprintf(err, errlen, "the prompt (%d tokens) and -n %d do not fit the client's %d positions", n_prompt,
                        c->o.n_predict, c->n_ctx), -1;
    memcpy(c->text, prompt, sizeof(int32_t) * (size_t)n_prompt);
    c->n_text = c->n_prompt = n_prompt;
    tx_text_reset(c->tx, n_prompt);
    c->offline_end = 0;
    c->n_priv = n_private >= 0 && n_private < n_prompt ? n_private : 0;
    c->nv = 0;
    st->n_prompt = n_prompt;
    sd_drafter_reset(c->d);
    int o = do_open(c, err, errlen);
    if (o == 0) return snprintf(err, errlen, "cannot reach the server at %s (%s)", c->o.server, st->last_error), -1;
    if (o < 0) return -1;
    if (refeed(c, err, errlen) < 0) return -1;
    c->online = 1;
    while (!c->finished && gen_left(c) > 0) {
        if (c->online) {
            int cap = SD_MIN(c->o.max_nodes, c->server_max_nodes > 0 ? c->server_max_nodes : MAX_NODES);
            if (draft(c, cap, err, errlen) < 0) return -1;
            int32_t tok[MAX_NODES];
            int16_t par[MAX_NODES];
            int n = sd_tree_size(c->tree);
            for (int i = 0; i < n; i++) tok[i] = sd_tree_token(c->tree, i), par[i] = (int16_t)sd_tree_parent(c->tree, i);
            make_round(c, tok, par, n);
            int rc = send_pending(c, err, errlen);
            if (rc < 0) return -1;
            if (rc == 0) go_offline(c);
            if (rc == 2 && resync(c, err, errlen) < 0) return -1;
        } else {
            if (offline_step(c, err, errlen) < 0) return -1;
            if (cl_net_up(c->net)) {
                int rc = resync(c, err, errlen);
                if (rc < 0) return -1;
            }
        }
    }
    // Ended with unverified tokens: give the server a last chance to verify them.
    for (double t_end = now_ms() + c->o.final_wait_ms; !c->online && now_ms() < t_end;) {
        if (cl_net_up(c->net)) {
            int rc = resync(c, err, errlen);
            if (rc < 0) return -1;
            if (rc == 1) {   // some replaced: generate the rest online
                while (!c->finished && gen_left(c) > 0 && c->online) {
                    int cap = SD_MIN(c->o.max_nodes, c->server_max_nodes > 0 ? c->server_max_nodes : MAX_NODES);
                    if (draft(c, cap, err, errlen) < 0) return -1;
                    int32_t tok[MAX_NODES];
                    int16_t par[MAX_NODES];
                    int n = sd_tree_size(c->tree);
                    for (int i = 0; i < n; i++)
                        tok[i] = sd_tree_token(c->tree, i), par[i] = (int16_t)sd_tree_parent(c->tree, i);
                    make_round(c, tok, par, n);
                    int r2 = send_pending(c, err, errlen);
                    if (r2 < 0) return -1;
                    if (r2 != 1) go_offline(c);
                }
                break;
            }
        }
        sleep_ms(50);
    }
    cl_net_probe_stop(c->net);
    if (c->n_text - c->n_prompt > c->o.n_predict)   // a step past -n: cut (never emitted: nothing to retract)
        cut_to(c, c->n_prompt + c->o.n_predict, "past -n");
    after_change(c, 1);   // what was held back for a stop string that never came
    st->stop_bytes = tx_text_stop_bytes(c->tx);
    st->never_verified = c->n_text - c->nv;
    st->n_generated = c->n_text - c->n_prompt;
    if (c->online && c->id[0]) {   // done with it: the server frees it
        char path[128];
        snprintf(path, sizeof path, "/v1/split/close?id=%s", c->id);
        cl_reply r;
        cl_net_post(c->net, path, "", 0, "application/json", 0, &r);
    }
    count_net(c);
    st->total_ms = now_ms() - c->t0;
    return 0;
}

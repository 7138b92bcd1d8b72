// skip_search.c - the skip-set search: the target's greedy continuations of
// the calibration prompts, teacher-forced scoring of candidate skip sets by
// simulated chain speculation, and the greedy search over sets. See
// sd_skip_search in skip_search.h for the method.
#include "draft/skip_search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model/model.h"
#include "runtime/session.h"

#define SKIP_SEARCH_M 4          // candidates tried per greedy round
#define SKIP_SEARCH_PATIENCE 3   // rounds without a new best before the search stops

sd_skip_search_params sd_skip_search_default_params(void) {
    sd_skip_search_params p;
    memset(&p, 0, sizeof p);
    p.n_predict = 32;
    p.max_seconds = 120.0;
    p.max_skip = 0;
    p.n_threads = 0;
    p.pool = NULL;
    p.dp = sd_draft_skip_default_params();
    p.progress = NULL;
    p.user = NULL;
    return p;
}

typedef struct {
    const sd_model *m;
    sd_session *s;
    int n_prompts;
    const int32_t *const *prompts;
    const int *n_prompt;
    int n_pred;
    int32_t **text;       // (n_prompts) prompt + target continuation (n_prompt[i] + n_pred)
    uint8_t *match;       // (n_pred) scratch: draft argmax == continuation token
    float *topp;          // (n_pred) scratch: draft top probability
    uint8_t *want;        // (n_batch) logits flags
    double *layer_bytes;  // (n_layer)
    double head_bytes, all_bytes;
    double v;             // extra target cost per tree node
    const sd_draft_model_params *dp;
} search_ctx;

static double tensor_bytes(const sd_tensor *t) {
    return t ? (double)sd_row_size(t->type, t->ne[0]) * (double)t->ne[1] : 0.0;
}

static int argmax_top(const float *lg, int n, float *top) {
    int b = 0;
    float mx = lg[0];
    for (int v = 1; v < n; v++)
        if (lg[v] > mx) mx = lg[v], b = v;
    double s = 0.0;
    for (int v = 0; v < n; v++) s += exp((double)(lg[v] - mx));
    *top = (float)(1.0 / s);
    return b;
}

// Greedy target continuation of every prompt (full model, one token per forward).
static int search_targets(search_ctx *c, char *err, size_t errlen) {
    const int nb = c->s->n_batch, nv = c->m->hp.n_vocab;
    for (int i = 0; i < c->n_prompts; i++) {
        int32_t *t = c->text[i];
        const int np = c->n_prompt[i];
        memcpy(t, c->prompts[i], sizeof(int32_t) * (size_t)np);
        if (sd_session_truncate(c->s, 0, err, errlen) < 0) return -1;
        for (int a = 0; a < np; a += nb) {
            int k = SD_MIN(nb, np - a);
            memset(c->want, 0, (size_t)k);
            c->want[k - 1] = 1;
            sd_batch b = {.n = k, .tokens = t + a, .logits = c->want};
            if (sd_session_forward(c->s, &b, err, errlen) < 0 || sd_session_commit(c->s, NULL, 0, err, errlen) < 0)
                return -1;
        }
        float top;
        int last = SD_MIN(nb, np - (np - 1) / nb * nb) - 1;
        for (int j = 0; j < c->n_pred; j++) {
            const float *lg = sd_session_logits(c->s, j == 0 ? last : 0);
            t[np + j] = argmax_top(lg, nv, &top);
            if (j + 1 == c->n_pred) break;
            sd_batch b = {.n = 1, .tokens = t + np + j};
            if (sd_session_forward(c->s, &b, err, errlen) < 0 || sd_session_commit(c->s, NULL, 0, err, errlen) < 0)
                return -1;
        }
    }
    return 0;
}

// Times one-token and 9-token forwards of the full model after prompt 0;
// sets c->v, the extra cost of one tree node relative to a one-token forward.
static int search_time(search_ctx *c, char *err, size_t errlen) {
    const int np = SD_MIN(c->n_prompt[0], c->s->n_batch);
    if (sd_session_truncate(c->s, 0, err, errlen) < 0) return -1;
    sd_batch b = {.n = np, .tokens = c->text[0], .logits = c->want};
    memset(c->want, 0, (size_t)np);
    if (sd_session_forward(c->s, &b, err, errlen) < 0 || sd_session_commit(c->s, NULL, 0, err, errlen) < 0)
        return -1;
    double t1 = 1e30, t9 = 1e30;
    int32_t toks[9];
    uint8_t w[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int k = 0; k < 9; k++) toks[k] = c->text[0][np + k < c->n_prompt[0] + c->n_pred ? np + k : 0];
    for (int r = 0; r < 3; r++) {
        double t0 = sd_time_ms();
        sd_batch b1 = {.n = 1, .tokens = toks, .logits = w};
        if (sd_session_forward(c->s, &b1, err, errlen) < 0) return -1;
        double ta = sd_time_ms();
        sd_batch b9 = {.n = SD_MIN(9, c->s->n_batch), .tokens = toks, .logits = w};
        if (sd_session_forward(c->s, &b9, err, errlen) < 0) return -1;
        double tb = sd_time_ms();
        t1 = SD_MIN(t1, ta - t0);
        t9 = SD_MIN(t9, tb - ta);
    }
    c->v = t1 > 0 ? (t9 / t1 - 1.0) / 8.0 : 0.0;
    if (c->v < 0) c->v = 0;
    if (c->v > 1) c->v = 1;
    return 0;
}

// Scores the skip set: simulated greedy chain speculation on every prompt.
// Returns the estimated speedup (>= 0) and the mean accepted length, or <0 on error.
static double search_eval(search_ctx *c, const uint8_t *skip, double *accept_len, char *err, size_t errlen) {
    const sd_hparams *hp = &c->m->hp;
    const int nb = c->s->n_batch, nv = hp->n_vocab, N = c->n_pred;
    if (sd_session_set_layer_skip(c->s, skip, err, errlen) < 0) return -1;
    double kept = c->head_bytes;
    for (int l = 0; l < hp->n_layer; l++)
        if (!skip || !skip[l]) kept += c->layer_bytes[l];
    const double cost_d = kept / c->all_bytes;
    double tokens = 0, time = 0, steps = 0;
    for (int i = 0; i < c->n_prompts; i++) {
        const int np = c->n_prompt[i], T = np + N - 1;   // the last token is never an input
        const int32_t *t = c->text[i];
        if (sd_session_truncate(c->s, 0, err, errlen) < 0) return -1;
        for (int a = 0; a < T; a += nb) {
            int k = SD_MIN(nb, T - a);
            for (int q = 0; q < k; q++) c->want[q] = a + q >= np;   // predicts continuation token a+q+1-np >= 1
            sd_batch b = {.n = k, .tokens = t + a, .logits = c->want};
            if (sd_session_forward(c->s, &b, err, errlen) < 0 || sd_session_commit(c->s, NULL, 0, err, errlen) < 0)
                return -1;
            for (int q = 0; q < k; q++) {
                if (a + q < np) continue;
                int j = a + q + 1 - np;   // continuation index predicted
                int am = argmax_top(sd_session_logits(c->s, q), nv, &c->topp[j]);
                c->match[j] = am == t[np + j];
            }
        }
        // Simulation: cont[0] comes from the prompt's logits; root index r.
        float pm = c->dp->p_min;
        const int K = c->dp->k;
        int r = 0;
        while (r < N - 1) {
            int P = 0, acc = 0, ok = 1;
            for (int d = 1; d <= K; d++) {
                int j = r + d;
                if (j > N - 1) break;
                if (pm > 0.0f && c->topp[j] < pm) break;   // the node at depth d-1 gets no child
                P++;
                if (ok && c->match[j]) acc++;
                else ok = 0;
            }
            // Draft forwards: one to catch up with the text, one per drafted
            // node whose children were asked for (all but a full chain's last).
            double dfw = 1 + (P < K ? P : K - 1);
            time += (1.0 + c->v * P) + dfw * cost_d;
            steps += 1;
            tokens += acc + 1;
            r += acc + 1;
            if (c->dp->adapt) pm = sd_draft_adapt_p_min(pm, P, acc, c->dp);
        }
    }
    if (sd_session_set_layer_skip(c->s, NULL, err, errlen) < 0) return -1;
    *accept_len = steps > 0 ? tokens / steps : 0.0;
    return time > 0 ? tokens / time : 0.0;
}

// One search: the sets on the greedy path, the single-layer scores and the
// best set so far (reported through p->progress).
typedef struct {
    const sd_skip_search_params *p;
    double t_start;               // sd_time_ms at the start of the search
    int nl;                       // layers of the model
    int max_skip;                 // most layers skipped
    uint8_t *cur, *best, *cand;   // (nl) the set on the greedy path, the best set, the candidate
    double *single, *single_acc;  // (nl) phase 1: score and accepted length of each single layer
    int *order;                   // (nl) layers by single-layer score, best first
    sd_skip_progress pr;          // the progress report; pr.best points to best
    double best_score, best_acc;  // of the best set (over non-empty sets)
    int timed_out;                // 1 once the time budget ran out
} search_run;

// Checks the calibration prompts and the parameters; sets *max_len, the
// longest prompt + continuation. Returns 0 or <0 with a message.
static int search_check(const sd_model *m, const int32_t *const *prompts, const int *n_prompt, int n_prompts,
                        const sd_skip_search_params *p, int *max_len_out, char *err, size_t errlen) {
    const sd_hparams *hp = &m->hp;
    const int nl = hp->n_layer;
    if (n_prompts < 1 || !prompts || !n_prompt) return sd_err(err, errlen, "skip search: no calibration prompts");
    if (p->n_predict < 2 || p->n_predict > 2048)
        return sd_err(err, errlen, "skip search: n_predict %d out of range 2..2048", p->n_predict);
    if (p->dp.k < 1 || p->dp.k > 256) return sd_err(err, errlen, "skip search: chain length %d out of range", p->dp.k);
    if (nl < 2) return sd_err(err, errlen, "skip search: the model has %d layer(s), nothing to skip", nl);
    if (m->layer_lo != 0 || m->layer_hi != nl || !m->has_output)   // it weighs and times every layer here
        return sd_err(err, errlen,
                      "skip search: the model holds layers [%d, %d) of %d only (a pipeline's part): search in one "
                      "process (--draft-skip auto --save-skip FILE) and give the set (--load-skip FILE, or the "
                      "layers: skip:L1-L2-...)", m->layer_lo, m->layer_hi, nl);
    int max_len = 0;
    for (int i = 0; i < n_prompts; i++) {
        if (!prompts[i] || n_prompt[i] < 1) return sd_err(err, errlen, "skip search: calibration prompt %d is empty", i);
        for (int k = 0; k < n_prompt[i]; k++)
            if (prompts[i][k] < 0 || prompts[i][k] >= hp->n_vocab)
                return sd_err(err, errlen, "skip search: prompt %d token %d out of range", i, k);
        max_len = SD_MAX(max_len, n_prompt[i] + p->n_predict);
    }
    if (max_len > 4096) return sd_err(err, errlen, "skip search: prompt + n_predict = %d tokens > 4096", max_len);
    *max_len_out = max_len;
    return 0;
}

// Allocates the sets of r and the scratch of c, opens the search session,
// weighs the layers, then computes the target continuations and the cost of
// a tree node. Returns 0 or <0 with a message; search_free frees what was
// allocated either way.
static int search_setup(search_run *r, search_ctx *c, const sd_model *m, const int32_t *const *prompts,
                        const int *n_prompt, int n_prompts, int max_len, char *err, size_t errlen) {
    const sd_skip_search_params *p = r->p;
    const int nl = r->nl;
    memset(c, 0, sizeof *c);
    c->m = m;
    c->n_prompts = n_prompts;
    c->prompts = prompts;
    c->n_prompt = n_prompt;
    c->n_pred = p->n_predict;
    c->dp = &p->dp;
    r->cur = calloc((size_t)nl, 1), r->best = calloc((size_t)nl, 1), r->cand = calloc((size_t)nl, 1);
    r->single = calloc((size_t)nl, sizeof(double)), r->single_acc = calloc((size_t)nl, sizeof(double));
    r->order = malloc(sizeof(int) * (size_t)nl);
    c->text = calloc((size_t)n_prompts, sizeof *c->text);
    c->match = calloc((size_t)p->n_predict + 1, 1);
    c->topp = calloc((size_t)p->n_predict + 1, sizeof(float));
    c->layer_bytes = calloc((size_t)nl, sizeof(double));
    int bad = !r->cur || !r->best || !r->cand || !r->single || !r->single_acc || !r->order || !c->text ||
              !c->match || !c->topp || !c->layer_bytes;
    for (int i = 0; !bad && i < n_prompts; i++) bad = !(c->text[i] = malloc(sizeof(int32_t) * ((size_t)n_prompt[i] + (size_t)p->n_predict)));
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = max_len + 16;
    sp.n_batch = SD_MIN(128, sp.n_ctx);
    sp.n_threads = p->n_threads;
    sp.pool = p->pool;
    if (!bad && sd_session_new(&c->s, m, &sp, err, errlen) < 0) return -1;
    if (!bad) bad = !(c->want = malloc((size_t)c->s->n_batch));
    if (bad) return sd_err(err, errlen, "skip search: out of memory");
    c->head_bytes = tensor_bytes(m->output);
    c->all_bytes = c->head_bytes;
    for (int l = 0; l < nl; l++) {
        const sd_layer *L = &m->layers[l];
        const sd_tensor *ts[7] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int k = 0; k < 7; k++) c->layer_bytes[l] += tensor_bytes(ts[k]);
        c->all_bytes += c->layer_bytes[l];
    }
    if (search_targets(c, err, errlen) < 0 || search_time(c, err, errlen) < 0) return -1;
    return 0;
}

static void search_free(search_run *r, search_ctx *c) {
    sd_session_free(c->s);
    if (c->text)
        for (int i = 0; i < c->n_prompts; i++) free(c->text[i]);
    free(c->text);
    free(c->match);
    free(c->topp);
    free(c->want);
    free(c->layer_bytes);
    free(r->cur);
    free(r->best);
    free(r->cand);
    free(r->single);
    free(r->single_acc);
    free(r->order);
}

// Reports one evaluated candidate (phase, layer tried, kept, its score and
// accepted length) with the best score so far.
static void search_report(search_run *r, int phase, int layer, int kept, double score, double accept_len) {
    sd_skip_progress *pr = &r->pr;
    pr->phase = phase, pr->layer = layer, pr->kept = kept, pr->score = score;
    pr->accept_len = accept_len, pr->best_score = r->best_score;
    pr->elapsed_s = (sd_time_ms() - r->t_start) / 1000.0;
    if (r->p->progress) r->p->progress(r->p->user, pr);
}

// Phase 1: every single layer. Returns 0 or <0 with a message.
static int search_singles(search_run *r, search_ctx *c, char *err, size_t errlen) {
    const int nl = r->nl;
    double acc_len = 0;
    for (int l = 0; l < nl && !r->timed_out; l++) {
        if ((sd_time_ms() - r->t_start) / 1000.0 > r->p->max_seconds) {
            r->timed_out = 1;
            break;
        }
        memset(r->cand, 0, (size_t)nl);
        r->cand[l] = 1;
        double sc = search_eval(c, r->cand, &acc_len, err, errlen);
        if (sc < 0) return -1;
        r->single[l] = sc;
        r->single_acc[l] = acc_len;
        r->pr.n_eval++;
        if (sc > r->best_score) {
            r->best_score = sc, r->best_acc = acc_len;
            memcpy(r->best, r->cand, (size_t)nl);
            r->pr.best_n_skip = 1;
        }
        search_report(r, 1, l, 0, sc, acc_len);
    }
    return 0;
}

// Phase 2: greedy additions in order of the single-layer scores. Returns 0
// or <0 with a message.
static int search_greedy(search_run *r, search_ctx *c, char *err, size_t errlen) {
    const int nl = r->nl;
    int *order = r->order;
    double acc_len = 0;
    for (int l = 0; l < nl; l++) order[l] = l;
    for (int a = 1; a < nl; a++)   // insertion sort, best first
        for (int b = a; b > 0 && r->single[order[b]] > r->single[order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    // Greedy path: each round tries the SKIP_SEARCH_M best-ranked layers not
    // yet in the set and adds the best of them, even when the score drops
    // (one layer alone rarely pays; the gain comes from the cost of many);
    // the best set on the path is kept. Stops after SKIP_SEARCH_PATIENCE
    // rounds without a new best, at max_skip or when the time runs out.
    int n_cur = 0, stale = 0;
    while (!r->timed_out && n_cur < r->max_skip && stale < SKIP_SEARCH_PATIENCE) {
        int best_l = -1, tried = 0;
        double round_score = -1.0, round_acc = 0.0;
        for (int oi = 0; oi < nl && tried < SKIP_SEARCH_M; oi++) {
            const int l = order[oi];
            if (r->cur[l]) continue;
            if ((sd_time_ms() - r->t_start) / 1000.0 > r->p->max_seconds) {
                r->timed_out = 1;
                break;
            }
            memcpy(r->cand, r->cur, (size_t)nl);
            r->cand[l] = 1;
            double sc;
            tried++;
            if (n_cur == 0) {   // single layers were measured in phase 1
                sc = r->single[l];
                acc_len = r->single_acc[l];
            } else {
                sc = search_eval(c, r->cand, &acc_len, err, errlen);
                if (sc < 0) return -1;
                r->pr.n_eval++;
            }
            if (sc > round_score) round_score = sc, round_acc = acc_len, best_l = l;
            search_report(r, 2, l, 0, sc, acc_len);
        }
        if (best_l < 0) break;
        r->cur[best_l] = 1;
        n_cur++;
        if (round_score > r->best_score || n_cur == 1) {
            r->best_score = round_score, r->best_acc = round_acc;
            memcpy(r->best, r->cur, (size_t)nl);
            r->pr.best_n_skip = n_cur;
            stale = 0;
        } else {
            stale++;
        }
        search_report(r, 2, best_l, 1, round_score, round_acc);
    }
    return 0;
}

int sd_skip_search(const sd_model *m, const int32_t *const *prompts, const int *n_prompt, int n_prompts,
                   const sd_skip_search_params *p, uint8_t *skip, sd_skip_search_result *res, char *err,
                   size_t errlen) {
    const double t_start = sd_time_ms();
    sd_skip_search_params dp = sd_skip_search_default_params();
    if (!p) p = &dp;
    const int nl = m->hp.n_layer;
    int max_len = 0;
    if (search_check(m, prompts, n_prompt, n_prompts, p, &max_len, err, errlen) < 0) return -1;

    search_ctx c;
    search_run r;
    memset(&r, 0, sizeof r);
    r.p = p;
    r.t_start = t_start;
    r.nl = nl;
    r.max_skip = p->max_skip > 0 ? SD_MIN(p->max_skip, nl - 1) : nl - 1;
    int rc = -1;
    if (search_setup(&r, &c, m, prompts, n_prompt, n_prompts, max_len, err, errlen) < 0) goto out;
    r.pr.n_layer = nl;
    r.pr.best = r.best;
    double acc_len = 0;
    double base = search_eval(&c, NULL, &acc_len, err, errlen);
    if (base < 0) goto out;
    r.pr.n_eval = 1;
    search_report(&r, 0, -1, 0, base, acc_len);
    if (search_singles(&r, &c, err, errlen) < 0 || search_greedy(&r, &c, err, errlen) < 0) goto out;
    memcpy(skip, r.best, (size_t)nl);
    rc = 0;
    for (int l = 0; l < nl; l++) rc += r.best[l] != 0;
    if (res) {
        memset(res, 0, sizeof *res);
        res->n_skip = rc;
        res->speedup = r.best_score;
        res->accept_len = r.best_acc;
        double kept = c.head_bytes;
        for (int l = 0; l < nl; l++)
            if (!r.best[l]) kept += c.layer_bytes[l];
        res->draft_cost = kept / c.all_bytes;
        res->verify_node_cost = c.v;
        res->base_speedup = base;
        res->n_eval = r.pr.n_eval;
        res->seconds = (sd_time_ms() - t_start) / 1000.0;
        res->timed_out = r.timed_out;
    }
out:
    search_free(&r, &c);
    return rc;
}

static const char *const g_calib[] = {
    "Write a short note inviting the neighbours to a garden party on Saturday afternoon.",
    "Write a Python function that counts how many times each word appears in a string.",
    "A bus leaves at 9:40 and the trip takes 1 hour and 35 minutes. When does it arrive? Explain.",
    "What are the main differences between a lake and a sea?",
};

int sd_skip_search_texts(const sd_model *m, const char *const *texts, int n_texts, int chat,
                         const sd_skip_search_params *p, uint8_t *skip, sd_skip_search_result *res, char *err,
                         size_t errlen) {
    if (!texts) texts = g_calib, n_texts = (int)(sizeof g_calib / sizeof *g_calib);
    if (n_texts < 1) return sd_err(err, errlen, "skip search: no calibration texts");
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    int32_t **ids = calloc((size_t)n_texts, sizeof *ids);
    int *n_ids = calloc((size_t)n_texts, sizeof *n_ids);
    char *buf = NULL;
    int rc = -1;
    if (!ids || !n_ids) {
        sd_err(err, errlen, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_texts; i++) {
        const char *t = texts[i];
        size_t len = strlen(t);
        char cerr[256];
        if (chat) {
            size_t cap = len + 4096;
            free(buf);
            buf = malloc(cap);
            if (!buf) {
                sd_err(err, errlen, "out of memory");
                goto out;
            }
            int n = sd_chat_format(tok, NULL, t, buf, cap, cerr, sizeof cerr);
            if (n >= 0) t = buf, len = (size_t)n;   // no known template: plain text
        }
        int n = sd_tokenize(tok, t, len, 1, chat, NULL, 0);
        if (n < 1) {
            sd_err(err, errlen, "skip search: calibration text %d gives no tokens", i);
            goto out;
        }
        ids[i] = malloc(sizeof(int32_t) * (size_t)n);
        if (!ids[i]) {
            sd_err(err, errlen, "out of memory");
            goto out;
        }
        n_ids[i] = sd_tokenize(tok, t, len, 1, chat, ids[i], n);
    }
    rc = sd_skip_search(m, (const int32_t *const *)ids, n_ids, n_texts, p, skip, res, err, errlen);
out:
    if (ids)
        for (int i = 0; i < n_texts; i++) free(ids[i]);
    free(ids);
    free(n_ids);
    free(buf);
    return rc;
}

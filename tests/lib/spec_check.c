// spec_check.c - see spec_check.h.
#include "spec_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int sc_collect_cb(int32_t t, void *user) {
    sc_tokens *c = user;
    if (c->n < SC_MAXTOK) c->tok[c->n++] = t;
    return 0;
}

int sc_run_plain(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt, int n_predict,
                 sc_tokens *out, sd_gen_stats *st, char *err, size_t errlen) {
    sd_session_truncate(s, 0, NULL, 0);
    out->n = 0;
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n_predict;
    gp.n_batch = 64;
    return sd_generate(s, smp, NULL, prompt, n_prompt, &gp, sc_collect_cb, out, st, err, errlen);
}

int sc_run_spec(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                int n_predict, int max_nodes, sc_tokens *out, sd_gen_stats *st, char *err, size_t errlen) {
    sd_session_truncate(s, 0, NULL, 0);
    sd_drafter_reset(d);
    out->n = 0;
    sd_gen_params sp = sd_gen_default_params();
    sp.n_predict = n_predict;
    sp.n_batch = 64;
    sp.max_nodes = max_nodes;
    return sd_generate(s, smp, d, prompt, n_prompt, &sp, sc_collect_cb, out, st, err, errlen);
}

int sc_same_tokens(const sc_tokens *a, const sc_tokens *b) {
    return a->n == b->n && !memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)a->n);
}

sd_session *sc_new_session(const sd_model *m, int n_ctx, int n_threads, char *err, size_t errlen) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = 64;
    sp.n_threads = n_threads;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, err, errlen) < 0) return NULL;
    return s;
}

sd_sampler *sc_new_sampler(int n_vocab, float temp, float penalty, char *err, size_t errlen) {
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = temp;
    sp.repeat_penalty = penalty;
    sd_sampler *s = NULL;
    if (sd_sampler_new(&s, &sp, n_vocab, err, errlen) < 0) return NULL;
    return s;
}

sd_sampler *sc_topk4_sampler(int n_vocab, char *err, size_t errlen) {
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = 1.3f;
    sp.top_k = 4;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.3f;
    sd_sampler *s = NULL;
    if (sd_sampler_new(&s, &sp, n_vocab, err, errlen) < 0) return NULL;
    return s;
}

// First (up to) 4 tokens of p > 0; returns how many there are in all.
static int support4(const float *probs, int n_vocab, int32_t *t, double *p) {
    int n = 0;
    for (int v = 0; v < n_vocab; v++)
        if (probs[v] > 0) {
            if (n < 4) t[n] = v, p[n] = probs[v];
            n++;
        }
    return n;
}

int sc_seq3_enumerate(sc_seq3 *e, sc_probs_fn probs_fn, void *ud, const int32_t *prompt, int n_prompt,
                      int n_vocab) {
    e->n_seq = 0;
    e->n_support1 = 0;
    float *probs = malloc(sizeof(float) * (size_t)n_vocab);
    int32_t *pre = malloc(sizeof(int32_t) * (size_t)(n_prompt + 3));
    if (!probs || !pre) {
        free(probs), free(pre);
        return -1;
    }
    memcpy(pre, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int32_t t1[4], t2[4];
    double p1[4], p2[4];
    probs_fn(ud, pre, n_prompt, probs);
    e->n_support1 = support4(probs, n_vocab, t1, p1);
    int n1 = e->n_support1 < 4 ? e->n_support1 : 4;
    for (int i = 0; i < n1; i++) {
        pre[n_prompt] = t1[i];
        probs_fn(ud, pre, n_prompt + 1, probs);
        int n2 = support4(probs, n_vocab, t2, p2);
        if (n2 > 4) n2 = 4;
        for (int j = 0; j < n2; j++) {
            pre[n_prompt + 1] = t2[j];
            probs_fn(ud, pre, n_prompt + 2, probs);
            for (int v = 0; v < n_vocab; v++) {
                if (!(probs[v] > 0) || e->n_seq >= SC_SEQ3_MAX) continue;
                int k = e->n_seq++;
                e->seqs[k][0] = t1[i], e->seqs[k][1] = t2[j], e->seqs[k][2] = v;
                e->pexact[k] = p1[i] * p2[j] * probs[v];
            }
        }
    }
    free(probs), free(pre);
    return 0;
}

int sc_seq3_find(const sc_seq3 *e, const int32_t *tok) {
    for (int k = 0; k < e->n_seq; k++)
        if (memcmp(e->seqs[k], tok, sizeof e->seqs[k]) == 0) return k;
    return -1;
}

void sc_seq3_tally(const sc_seq3 *e, const int32_t *tok, double *cnt, int *n_other) {
    int k = sc_seq3_find(e, tok);
    if (k >= 0) cnt[k]++;
    else (*n_other)++;
}

double sc_seq3_chi2(const sc_seq3 *e, const double *cnt, int n_run) {
    double chi = 0;
    for (int k = 0; k < e->n_seq; k++) {
        double ex = e->pexact[k] * n_run;
        chi += (cnt[k] - ex) * (cnt[k] - ex) / ex;
    }
    return chi;
}

void sc_fwd_probs_fn(void *ud, const int32_t *seq, int n, float *probs) {
    sc_fwd_probs *f = ud;
    sd_session_truncate(f->ref, 0, NULL, 0);
    sd_batch b = {.n = n, .tokens = seq};
    sd_session_forward(f->ref, &b, f->err, f->errlen);
    sd_sampler_probs(f->smp, sd_session_logits(f->ref, n - 1), seq, n, probs);
}

sd_model *sc_synth_model(const synth_params *p, const char *test, const char *tag, char *err, size_t errlen) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_%s_%d_%s.gguf", test, (int)getpid(), tag);
    sd_model *m = NULL;
    if (synth_write(path, p, err, errlen) < 0 || sd_model_load(&m, path, err, errlen) < 0) m = NULL;
    remove(path);
    return m;
}

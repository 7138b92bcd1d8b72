// learner.c - online adaptation of an EAGLE-3 head (learner.h): windows of
// verified positions, the training thread, the hand-over of parameters.
#include "train/learner.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "common.h"
#include "model/model.h"
#include "train/train.h"

#define L_TOPK 8      // target distribution kept per position (softmax over the top 8 logits)
#define L_NWIN 4      // window buffers: one filling, one training, the rest queued or free
#define L_NAGREE 8    // windows the agreement figure covers

enum { BACK_FREE, BACK_WRITING, BACK_READY };

// A window of consecutive positions of one text.
typedef struct l_win {
    int n;            // positions filled
    int32_t *tok;     // (T)
    float *feat;      // (T, 3d)
    int32_t *ids;     // (T, L_TOPK) the target's top ids after each position
    float *p;         // (T, L_TOPK) their probabilities (softmax over the top L_TOPK)
} l_win;

struct sd_learner {
    sd_head_online_params p;
    const sd_head *src;      // the head given (never written)
    const sd_model *target;  // the model it drafts for (its tokenizer goes into a saved head)
    int d, nv, T;
    sd_head *th;             // the parameters being trained (the training thread's)
    sd_trainer *tr;
    sd_adamw opt;
    float *grad;             // (th->n_w)
    sd_e3_pack *back;        // the next parameters (back_state says who may touch it)
    l_win win[L_NWIN];
    // the drafter's side
    int fill;                // window being filled
    int next_pos;            // position a continuing add has; -1: the next add starts a run
    int fill_new;            // positions of win[fill] not trained yet (the shared first one excluded)
    // shared, under mu
    pthread_mutex_t mu;
    pthread_cond_t cv;       // queued work, or the thread went idle
    int ready[L_NWIN], n_ready; // windows to train, oldest first
    int freew[L_NWIN], n_free;
    int busy;                // the thread is training a window
    int back_state;          // BACK_*
    int stop;
    sd_head_online_stats st;
    int64_t ag_n[L_NAGREE], ag_k[L_NAGREE]; // scored rows and agreements of the last windows (ring)
    char fail[200];          // the first training error ("" none): training stops
    int64_t n_pos;           // positions added (the drafter's thread only)
    int has_sync;            // mu and cv exist
    pthread_t thread;
    int has_thread;
};

sd_head_online_params sd_head_online_default_params(void) {
    return (sd_head_online_params){.on = 0, .lr = 1e-4f, .window = 64, .min_window = 16, .ttt_steps = 3,
                                   .steps_per_window = 1, .nice = 10, .deterministic = 0};
}

// ---------------------------------------------------------------- training
// One window: steps_per_window AdamW steps on the trained head, then the
// spare pack filled from it. Runs on the training thread (or inside add,
// deterministic). Returns 0, or <0 with l->fail set.
static int train_window(sd_learner *l, const l_win *w) {
    const double t0 = sd_time_ms();
    sd_train_seq seq = {w->n, w->tok, w->feat, w->ids, w->p, L_TOPK, 0, NULL};
    sd_train_stats ts;
    double loss0 = 0;
    char err[200];
    for (int s = 0; s < l->p.steps_per_window; s++) {
        memset(l->grad, 0, sizeof(float) * l->th->n_w);
        double loss = sd_trainer_loss(l->tr, &seq, l->grad, s == 0 ? &ts : NULL, err, sizeof err);
        if (loss < 0) {
            pthread_mutex_lock(&l->mu);
            snprintf(l->fail, sizeof l->fail, "%s", err);
            pthread_mutex_unlock(&l->mu);
            return -1;
        }
        if (s == 0) loss0 = loss;
        sd_adamw_step(&l->opt, l->th, l->grad);
    }
    pthread_mutex_lock(&l->mu);
    l->back_state = BACK_WRITING;   // (FREE or READY before: the drafter has not taken it, or took the last)
    pthread_mutex_unlock(&l->mu);
    sd_e3_pack_fill(l->back, l->th);
    pthread_mutex_lock(&l->mu);
    l->back_state = BACK_READY;
    const int64_t k = l->st.n_windows % L_NAGREE;
    l->ag_n[k] = ts.n[0];
    l->ag_k[k] = ts.agree[0];
    l->st.n_windows++;
    l->st.last_loss = loss0;
    l->st.train_ms += sd_time_ms() - t0;
    pthread_mutex_unlock(&l->mu);
    return 0;
}

static void *thread_main(void *arg) {
    sd_learner *l = arg;
#if defined(__linux__)
    if (l->p.nice > 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), l->p.nice);   // this thread only
#endif
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->n_ready == 0) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        const int wi = l->ready[0];
        l->n_ready--;
        memmove(l->ready, l->ready + 1, sizeof(int) * (size_t)l->n_ready);
        l->busy = 1;
        const int failed = l->fail[0] != 0;
        pthread_mutex_unlock(&l->mu);
        if (!failed) train_window(l, &l->win[wi]);
        pthread_mutex_lock(&l->mu);
        l->freew[l->n_free++] = wi;
        l->busy = 0;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

// Waits (under mu) until the thread trains nothing and nothing is queued
// (or training stopped on an error).
static void wait_idle(sd_learner *l) {
    while (l->busy || (l->n_ready > 0 && !l->fail[0] && l->has_thread)) pthread_cond_wait(&l->cv, &l->mu);
}

// ---------------------------------------------------------------- windows
static void copy_pos(sd_learner *l, l_win *dst, int i, const l_win *src, int j) {
    const size_t d3 = 3 * (size_t)l->d;
    dst->tok[i] = src->tok[j];
    memcpy(dst->feat + i * d3, src->feat + j * d3, sizeof(float) * d3);
    memcpy(dst->ids + i * L_TOPK, src->ids + j * L_TOPK, sizeof(int32_t) * L_TOPK);
    memcpy(dst->p + i * L_TOPK, src->p + j * L_TOPK, sizeof(float) * L_TOPK);
}

// Hands win[fill] to training; the next window starts with its last
// position when keep_last (a run that goes on), empty otherwise.
static int submit(sd_learner *l, int keep_last, char *err, size_t errlen) {
    l_win *w = &l->win[l->fill];
    l->fill_new = 0;
    if (l->p.deterministic) {
        if (!l->fail[0] && train_window(l, w) < 0) return sd_err(err, errlen, "online training: %s", l->fail);
        if (keep_last) copy_pos(l, w, 0, w, w->n - 1);
        w->n = keep_last;
        return 0;
    }
    pthread_mutex_lock(&l->mu);
    l->ready[l->n_ready++] = l->fill;
    int nf;
    if (l->n_free > 0) {
        nf = l->freew[--l->n_free];
    } else {   // training fell behind: the oldest queued window makes room (never the one just queued)
        nf = l->ready[0];
        l->n_ready--;
        memmove(l->ready, l->ready + 1, sizeof(int) * (size_t)l->n_ready);
        l->st.n_dropped++;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    // (the thread only reads win[fill] from now on, as this does)
    if (keep_last) copy_pos(l, &l->win[nf], 0, w, w->n - 1);
    l->win[nf].n = keep_last;
    l->fill = nf;
    return 0;
}

int sd_learner_break(sd_learner *l, char *err, size_t errlen) {
    int rc = 0;
    if (l->fill_new >= 1 && l->win[l->fill].n >= l->p.min_window) rc = submit(l, 0, err, errlen);
    l->win[l->fill].n = 0;
    l->fill_new = 0;
    l->next_pos = -1;
    return rc;
}

int sd_learner_cut(sd_learner *l, int L, char *err, size_t errlen) {
    return l->next_pos > L ? sd_learner_break(l, err, errlen) : 0;
}

// The top L_TOPK of n logits, softmax over them.
static void top_dist(const float *lg, int n, int32_t *ids, float *p) {
    float v[L_TOPK];
    for (int i = 0; i < L_TOPK; i++) v[i] = -INFINITY, ids[i] = -1;
    for (int t = 0; t < n; t++) {
        const float x = lg[t];
        if (!(x > v[L_TOPK - 1])) continue;   // (NaN never enters)
        int i = L_TOPK - 1;
        while (i > 0 && x > v[i - 1]) {
            v[i] = v[i - 1], ids[i] = ids[i - 1];
            i--;
        }
        v[i] = x, ids[i] = t;
    }
    double sum = 0;
    for (int i = 0; i < L_TOPK; i++) sum += ids[i] >= 0 ? exp((double)v[i] - v[0]) : 0.0;
    for (int i = 0; i < L_TOPK; i++) p[i] = ids[i] >= 0 ? (float)(exp((double)v[i] - v[0]) / sum) : 0.0f;
}

int sd_learner_add(sd_learner *l, int pos, int32_t tok, const float *feat, const float *logits, char *err,
                   size_t errlen) {
    if (pos != l->next_pos && sd_learner_break(l, err, errlen) < 0) return -1;
    l_win *w = &l->win[l->fill];
    const int i = w->n;
    const size_t d3 = 3 * (size_t)l->d;
    w->tok[i] = tok;
    memcpy(w->feat + i * d3, feat, sizeof(float) * d3);
    top_dist(logits, l->nv, w->ids + i * L_TOPK, w->p + i * L_TOPK);
    w->n++;
    if (i > 0) l->fill_new++;   // (a run's first position is context only: no head row predicts from before it)
    l->next_pos = pos + 1;
    l->n_pos++;
    if (w->n == l->T) return submit(l, 1, err, errlen);
    return 0;
}

// ---------------------------------------------------------------- the drafter's calls
int sd_learner_swap(sd_learner *l, sd_e3 *e) {
    if (pthread_mutex_trylock(&l->mu) != 0) return 0;
    int r = 0;
    if (l->back_state == BACK_READY) {
        l->back = sd_e3_swap_pack(e, l->back);
        l->back_state = BACK_FREE;
        l->st.n_updates++;
        r = 1;
    }
    pthread_mutex_unlock(&l->mu);
    return r;
}

static void stats_locked(const sd_learner *l, sd_head_online_stats *st) {
    *st = l->st;
    st->n_positions = l->n_pos;   // (stats are read on the drafter's thread, the one that adds)
    int64_t n = 0, k = 0;
    for (int i = 0; i < L_NAGREE; i++) n += l->ag_n[i], k += l->ag_k[i];
    st->agree = n > 0 ? (double)k / (double)n : 0.0;
}

void sd_learner_stats(sd_learner *l, sd_head_online_stats *st) {
    pthread_mutex_lock(&l->mu);
    stats_locked(l, st);
    pthread_mutex_unlock(&l->mu);
}

void sd_learner_note(sd_learner *l, char *buf, size_t len) {
    sd_head_online_stats st;
    pthread_mutex_lock(&l->mu);
    stats_locked(l, &st);
    const int failed = l->fail[0] != 0;
    char fail[sizeof l->fail];
    memcpy(fail, l->fail, sizeof fail);
    pthread_mutex_unlock(&l->mu);
    if (failed) snprintf(buf, len, "online training stopped: %s", fail);
    else if (st.n_windows == 0) snprintf(buf, len, "online: %lld positions, no window trained yet", (long long)st.n_positions);
    else
        snprintf(buf, len, "online: %lld windows trained (%lld dropped, %lld updates taken), loss %.3f, agreement %.2f, %.1f s training",
                 (long long)st.n_windows, (long long)st.n_dropped, (long long)st.n_updates, st.last_loss, st.agree,
                 st.train_ms / 1000.0);
}

int sd_learner_drain(sd_learner *l, char *err, size_t errlen) {
    if (sd_learner_break(l, err, errlen) < 0) return -1;
    pthread_mutex_lock(&l->mu);
    wait_idle(l);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

int sd_learner_save(sd_learner *l, const char *path, char *err, size_t errlen) {
    if (sd_learner_break(l, err, errlen) < 0) return -1;
    pthread_mutex_lock(&l->mu);
    wait_idle(l);   // (the thread cannot start another window while this holds mu)
    sd_head_online_stats st;
    stats_locked(l, &st);
    char note[sizeof l->th->note];
    int n = snprintf(note, sizeof note, "%s", l->src->note);
    if (n > 0 && (size_t)n < sizeof note && note[n - 1] != '\n') note[n++] = '\n', note[n] = 0;
    if (n >= 0 && (size_t)n < sizeof note)
        snprintf(note + n, sizeof note - (size_t)n,
                 "online.windows=%lld\nonline.positions=%lld\nonline.lr=%g\nonline.window=%d\nonline.loss=%.4f\n"
                 "online.agree=%.3f\n",
                 (long long)st.n_windows, (long long)st.n_positions, (double)l->p.lr, l->T, st.last_loss, st.agree);
    memcpy(l->th->note, note, sizeof note);
    int rc = sd_head_save_for(l->th, l->target, path, SD_TYPE_Q8_0, err, errlen);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void sd_learner_reset(sd_learner *l, sd_e3 *e) {
    pthread_mutex_lock(&l->mu);
    while (l->n_ready > 0) l->freew[l->n_free++] = l->ready[--l->n_ready];   // queued windows: dropped
    while (l->busy) pthread_cond_wait(&l->cv, &l->mu);
    memcpy(l->th->w, l->src->w, sizeof(float) * l->src->n_w);
    memset(l->opt.m, 0, 2 * sizeof(float) * l->th->n_w);   // (m and v: one allocation)
    l->opt.t = 0;
    sd_e3_pack_fill(l->back, l->src);
    l->back = sd_e3_swap_pack(e, l->back);
    l->back_state = BACK_FREE;
    memset(&l->st, 0, sizeof l->st);
    l->n_pos = 0;
    memset(l->ag_n, 0, sizeof l->ag_n);
    memset(l->ag_k, 0, sizeof l->ag_k);
    l->fail[0] = 0;
    pthread_mutex_unlock(&l->mu);
    l->win[l->fill].n = 0;
    l->fill_new = 0;
    l->next_pos = -1;
}

// ---------------------------------------------------------------- life
static int check_params(const sd_head_online_params *p, char *err, size_t errlen) {
    if (!(p->lr > 0.0f && p->lr <= 1.0f)) return sd_err(err, errlen, "online: learning rate %g (0 < lr <= 1)", (double)p->lr);
    if (p->window < 8 || p->window > 512) return sd_err(err, errlen, "online: window of %d positions (8..512)", p->window);
    if (p->min_window < 2 || p->min_window > p->window)
        return sd_err(err, errlen, "online: shortest window %d (2..window = %d)", p->min_window, p->window);
    if (p->ttt_steps < 1 || p->ttt_steps > 8) return sd_err(err, errlen, "online: %d training-time-test steps (1..8)", p->ttt_steps);
    if (p->steps_per_window < 1 || p->steps_per_window > 16)
        return sd_err(err, errlen, "online: %d steps per window (1..16)", p->steps_per_window);
    if (p->nice < 0 || p->nice > 19) return sd_err(err, errlen, "online: niceness %d (0..19)", p->nice);
    return 0;
}

void sd_learner_free(sd_learner *l) {
    if (!l) return;
    if (l->has_thread) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    if (l->has_sync) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    for (int i = 0; i < L_NWIN; i++) {
        free(l->win[i].tok);
        free(l->win[i].feat);
        free(l->win[i].ids);
        free(l->win[i].p);
    }
    sd_e3_pack_free(l->back);
    free(l->grad);
    sd_adamw_free(&l->opt);
    sd_trainer_free(l->tr);
    sd_head_free(l->th);
    free(l);
}

int sd_learner_new(sd_learner **out, const sd_head *h, const sd_model *target, int wtype,
                   const sd_head_online_params *p, char *err, size_t errlen) {
    *out = NULL;
    if (h->hp.type != SD_HEAD_EAGLE3) return sd_err(err, errlen, "online: adaptation needs an EAGLE-3 head");
    if (check_params(p, err, errlen) < 0) return -1;
    sd_learner *l = calloc(1, sizeof *l);
    if (!l) return sd_err(err, errlen, "online: out of memory");
    l->p = *p;
    l->src = h;
    l->target = target;
    l->d = h->hp.n_embd;
    l->nv = target->hp.n_vocab;
    l->T = p->window;
    l->next_pos = -1;
    if (sd_head_copy(&l->th, h, err, errlen) < 0 || sd_adamw_init(&l->opt, h->n_w, err, errlen) < 0 ||
        sd_trainer_new(&l->tr, l->th, target, l->T, p->ttt_steps, NULL, err, errlen) < 0 ||
        sd_e3_pack_new(&l->back, h, wtype, err, errlen) < 0) {
        sd_learner_free(l);
        return -1;
    }
    l->opt.lr = p->lr;   // constant: no warm-up, no decay (the head is already trained)
    l->grad = malloc(sizeof(float) * h->n_w);
    const size_t T = (size_t)l->T, d3 = 3 * (size_t)l->d;
    int ok = l->grad != NULL;
    for (int i = 0; i < L_NWIN && ok; i++) {
        l_win *w = &l->win[i];
        w->tok = malloc(sizeof(int32_t) * T);
        w->feat = malloc(sizeof(float) * T * d3);
        w->ids = malloc(sizeof(int32_t) * T * L_TOPK);
        w->p = malloc(sizeof(float) * T * L_TOPK);
        ok = w->tok && w->feat && w->ids && w->p;
    }
    if (!ok) {
        sd_learner_free(l);
        return sd_err(err, errlen, "online: out of memory");
    }
    l->fill = 0;
    for (int i = L_NWIN - 1; i >= 1; i--) l->freew[l->n_free++] = i;
    l->back_state = BACK_FREE;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->has_sync = 1;
    if (!p->deterministic) {
        if (pthread_create(&l->thread, NULL, thread_main, l) != 0) {
            sd_learner_free(l);
            return sd_err(err, errlen, "online: cannot start the training thread");
        }
        l->has_thread = 1;
    }
    *out = l;
    return 0;
}

// ---------------------------------------------------------------- the drafter's hook
static int hk_create(void **l, const sd_head *h, const sd_model *target, int wtype, const sd_head_online_params *p,
                     char *err, size_t errlen) {
    sd_learner *x = NULL;
    int rc = sd_learner_new(&x, h, target, wtype, p, err, errlen);
    *l = x;
    return rc;
}
static void hk_free(void *l) { sd_learner_free(l); }
static int hk_add(void *l, int pos, int32_t tok, const float *feat, const float *logits, char *err, size_t errlen) {
    return sd_learner_add(l, pos, tok, feat, logits, err, errlen);
}
static int hk_brk(void *l, char *err, size_t errlen) { return sd_learner_break(l, err, errlen); }
static int hk_cut(void *l, int L, char *err, size_t errlen) { return sd_learner_cut(l, L, err, errlen); }
static int hk_swap(void *l, sd_e3 *e) { return sd_learner_swap(l, e); }
static int hk_drain(void *l, char *err, size_t errlen) { return sd_learner_drain(l, err, errlen); }
static int hk_save(void *l, const char *path, char *err, size_t errlen) { return sd_learner_save(l, path, err, errlen); }
static void hk_reset(void *l, sd_e3 *e) { sd_learner_reset(l, e); }
static void hk_stats(void *l, sd_head_online_stats *st) { sd_learner_stats(l, st); }
static void hk_note(void *l, char *buf, size_t len) { sd_learner_note(l, buf, len); }

const sd_e3_online_hook sd_learner_hook = {hk_create, hk_free, hk_add,  hk_brk,   hk_cut, hk_swap,
                                           hk_drain,  hk_save, hk_reset, hk_stats, hk_note};

// test_online_adaptation.c - online adaptation of an EAGLE-3 head (docs/heads.md,
// "Online adaptation"; src/train/learner.c): on a synthetic target, a head
// trained only briefly drafts a stream of greedy generations from one kind
// of prompt while it keeps training on what the verification forwards
// computed. Its acceptance rises over the stream (deterministic mode: every
// window trained inside the step that completes it), the output stays plain
// decoding's, the saved head reproduces what was learnt, sampled output
// stays distributed as the target's while the drafts change under it, and
// the training thread runs, hands parameters over and stops at free.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "draft/draft_eagle3.h"
#include "head/head.h"
#include "kernels/quant.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"
#include "train/learner.h"
#include "train/train.h"

#define NV 320
#define TOPK 8
#define SEQ_T 48
#define N_SEQ 16
#define N_GEN 24      // generations in a stream
#define GEN_N 64      // tokens per generation
#define N_CTX 160

static char g_err[512];
static sd_model *g_m;
static sd_head *g_head;   // the briefly trained head every test starts from

// The stream's prompts: one kind (the same six tokens, then two that vary).
// A random synthetic target's continuations share nothing but runs of a
// repeated token, so "one kind" recurs: the stream cycles through N_KIND
// prompts (a workload whose requests come back), and what a drafter can
// learn from the stream is their continuations. Prompts q >= 1000 are
// others, for the initial training.
#define N_KIND 3
static void prompt_of(int q, int32_t *p) {
    static const int32_t base[6] = {5, 99, 14, 200, 31, 77};
    memcpy(p, base, sizeof base);
    if (q < 1000) q %= N_KIND;
    p[6] = 3 + (q * 37) % (NV - 3);
    p[7] = 3 + (q * 101 + 7) % (NV - 3);
}

// Training data for the brief initial training: greedy texts of the stream's kind (other prompts than the stream's).
static int train_briefly(sd_head *h, int steps) {
    const int d = g_m->hp.n_embd;
    static int32_t tok[N_SEQ][SEQ_T], ids[N_SEQ][SEQ_T][TOPK];
    static float pr[N_SEQ][SEQ_T][TOPK];
    float *feat = malloc(sizeof(float) * N_SEQ * SEQ_T * 3 * (size_t)d), *hid = malloc(sizeof(float) * SEQ_T * 3 * (size_t)d);
    sd_session *s = sc_new_session(g_m, 128, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(NV, 0.0f, 1.0f, g_err, sizeof g_err);
    int rc = s && smp && feat && hid ? 0 : -1;
    int32_t layers[3] = {h->hp.extract[0], h->hp.extract[1], h->hp.extract[2]};
    for (int q = 0; q < N_SEQ && rc == 0; q++) {
        prompt_of(1000 + q, tok[q]);
        sd_session_truncate(s, 0, NULL, 0);
        for (int t = 0; t < SEQ_T - 1 && rc == 0; t++) {
            sd_batch b = {.n = 1, .tokens = &tok[q][t]};
            rc = sd_session_forward(s, &b, g_err, sizeof g_err);
            if (rc == 0) rc = sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
            if (rc == 0 && t >= 7) tok[q][t + 1] = sd_sampler_sample(smp, sd_session_logits(s, 0), NULL, 0);
        }
        sd_session_truncate(s, 0, NULL, 0);
        sd_batch b = {.n = SEQ_T, .tokens = tok[q], .hidden_layers = layers, .n_hidden_layers = 3, .hidden_out = hid};
        if (rc == 0) rc = sd_session_forward(s, &b, g_err, sizeof g_err);
        for (int t = 0; t < SEQ_T && rc == 0; t++) {
            memcpy(feat + ((size_t)q * SEQ_T + t) * 3 * d, hid + (size_t)t * 3 * d, sizeof(float) * 3 * (size_t)d);
            const float *lg = sd_session_logits(s, t);
            int used[TOPK];
            double z = 0;
            for (int k = 0; k < TOPK; k++) {
                int best = -1;
                for (int v = 0; v < NV; v++) {
                    int u = 0;
                    for (int j = 0; j < k; j++) u |= used[j] == v;
                    if (!u && (best < 0 || lg[v] > lg[best])) best = v;
                }
                used[k] = best;
                ids[q][t][k] = best;
                z += exp(lg[best] - lg[used[0]]);
            }
            for (int k = 0; k < TOPK; k++) pr[q][t][k] = (float)(exp(lg[used[k]] - lg[used[0]]) / z);
        }
    }
    sd_trainer *tr = NULL;
    sd_adamw o;
    float *grad = calloc(h->n_w, sizeof(float));
    if (rc == 0 && (sd_trainer_new(&tr, h, g_m, SEQ_T, 3, NULL, g_err, sizeof g_err) < 0 ||
                    sd_adamw_init(&o, h->n_w, g_err, sizeof g_err) < 0))
        rc = -1;
    if (rc == 0) o.lr = 1e-2f;
    for (int it = 0; it < steps && rc == 0; it++) {
        int q = it % N_SEQ;
        memset(grad, 0, sizeof(float) * h->n_w);
        sd_train_seq seq = {SEQ_T, tok[q], feat + (size_t)q * SEQ_T * 3 * d, &ids[q][0][0], &pr[q][0][0], TOPK, 0, NULL};
        if (sd_trainer_loss(tr, &seq, grad, NULL, g_err, sizeof g_err) < 0) rc = -1;
        else sd_adamw_step(&o, h, grad);
    }
    if (tr) sd_adamw_free(&o);
    sd_trainer_free(tr);
    free(grad);
    free(feat);
    free(hid);
    sd_sampler_free(smp);
    sd_session_free(s);
    return rc;
}

static int setup(void) {
    if (g_m) return g_head != NULL;
    synth_params p = synth_default_params();
    p.n_layer = 4;
    p.n_vocab = NV;
    g_m = sc_synth_model(&p, "head_online", "t", g_err, sizeof g_err);
    if (!g_m) return 0;
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = NV;
    if (sd_head_new(&g_head, &hp, g_err, sizeof g_err) < 0) return 0;
    sd_head_init(g_head, 7);
    if (train_briefly(g_head, 20) < 0) {
        sd_head_free(g_head);
        g_head = NULL;
        return 0;
    }
    return 1;
}

static sd_head_online_params online_params(int deterministic, float lr) {
    sd_head_online_params op = sd_head_online_default_params();
    op.on = 1;
    op.lr = lr;
    op.window = 32;
    op.min_window = 8;
    op.deterministic = deterministic;
    op.nice = 0;
    return op;
}

static sd_drafter *new_drafter(const sd_head *h, const sd_head_online_params *op) {
    sd_draft_model_params dp = sd_draft_model_default_params();
    dp.shape = SD_DRAFT_CHAIN;
    dp.k = 4;
    dp.n_ctx = N_CTX;
    sd_drafter *d = NULL;
    if (sd_draft_eagle3_new(&d, h, g_m, &dp, SD_TYPE_Q8_0, op, &sd_learner_hook, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

// Generations q0 .. q0+n-1 of the stream with drafter d (kept across them),
// greedy, each compared with plain decoding (ref: its tokens, or NULL to
// compute them). tau[i]: generation i's tokens per target forward. Returns
// the number of generations whose output differs from plain decoding, or -1.
static int run_stream(sd_drafter *d, int q0, int n, double *tau) {
    sd_session *s = sc_new_session(g_m, N_CTX, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(NV, 0.0f, 1.0f, g_err, sizeof g_err);
    int bad = s && smp ? 0 : -1;
    static sc_tokens a, b;
    for (int i = 0; i < n && bad >= 0; i++) {
        int32_t prompt[8];
        prompt_of(q0 + i, prompt);
        sd_gen_stats st;
        if (sc_run_plain(s, smp, prompt, 8, GEN_N, &a, &st, g_err, sizeof g_err) < 0) bad = -1;
        sd_gen_params gp = sd_gen_default_params();
        gp.n_predict = GEN_N;
        gp.max_nodes = 16;
        gp.seed = 1 + (uint64_t)i;
        b.n = 0;
        if (bad >= 0) sd_session_truncate(s, 0, NULL, 0);
        if (bad >= 0 && sd_generate(s, smp, d, prompt, 8, &gp, sc_collect_cb, &b, &st, g_err, sizeof g_err) < 0) bad = -1;
        if (bad >= 0) {
            bad += !sc_same_tokens(&a, &b);
            tau[i] = st.mean_accepted;
        }
    }
    sd_sampler_free(smp);
    sd_session_free(s);
    return bad;
}

static double mean(const double *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s / n;
}

static void print_taus(const char *what, const double *tau, int n) {
    printf("  %-22s tau:", what);
    for (int i = 0; i < n; i++) printf(" %.2f", tau[i]);
    printf("\n");
}

// Deterministic online adaptation: acceptance rises over the stream, the
// output is plain decoding's, the saved head drafts as the adapted drafter does.
// Saves what drafter d learnt to a temporary file named by tag, loads it back
// (checked: both succeed) and removes the file: the loaded head, or NULL.
static sd_head *save_and_load(sd_drafter *d, const char *tag) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_head_online%s_%d.gguf", tag, (int)getpid());
    CHECK(sd_drafter_save_head(d, path, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_head *h = NULL;
    CHECK(sd_head_load(&h, path, g_m, g_err, sizeof g_err) == 0, "%s", g_err);
    unlink(path);
    return h;
}

static void test_online_acceptance_rises(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    static double t_static[N_GEN], t_online[N_GEN], t_saved[N_GEN];
    sd_drafter *d0 = new_drafter(g_head, NULL);
    CHECK(d0 && run_stream(d0, 0, N_GEN, t_static) == 0, "static head: %s", g_err);
    sd_drafter_free(d0);
    sd_head_online_params op = online_params(1, 3e-3f);
    sd_drafter *d = new_drafter(g_head, &op);
    CHECK(d != NULL, "%s", g_err);
    if (!d) return;
    float *w0 = malloc(sizeof(float) * g_head->n_w);
    memcpy(w0, g_head->w, sizeof(float) * g_head->n_w);
    int bad = run_stream(d, 0, N_GEN, t_online);
    CHECK(bad == 0, "online: %d generations differ from plain decoding (%s)", bad, g_err);
    CHECK(!memcmp(w0, g_head->w, sizeof(float) * g_head->n_w), "the head given to the online drafter was modified");
    free(w0);
    sd_head_online_stats os;
    CHECK(sd_drafter_online_stats(d, &os) == 1, "an online drafter reports no online statistics");
    printf("  %s\n", sd_drafter_note(d));
    print_taus("static head", t_static, N_GEN);
    print_taus("online (deterministic)", t_online, N_GEN);
    const double s_late = mean(t_static + N_GEN / 2, N_GEN / 2), o_late = mean(t_online + N_GEN / 2, N_GEN / 2);
    const double o_early = mean(t_online, 4);
    printf("  mean tau: static %.2f (second half), online %.2f (first 4) -> %.2f (second half)\n", s_late, o_early,
           o_late);
    CHECK(os.n_windows >= N_GEN && os.n_updates >= N_GEN - 1, "%lld windows trained, %lld updates taken",
          (long long)os.n_windows, (long long)os.n_updates);
    // Measured (lr 3e-3, windows of 32): static 1.04, online 1.15 over the first 4 generations and
    // 2.07 over the second half; the bars leave half of each gain as margin.
    CHECK(o_late > s_late + 0.5, "online adaptation did not raise acceptance: %.2f against %.2f", o_late, s_late);
    CHECK(o_late > o_early + 0.45, "acceptance did not rise over the stream: %.2f -> %.2f", o_early, o_late);
    // The saved head drafts the second half as the adapted drafter did.
    sd_head *h2 = save_and_load(d, "");
    if (h2) {
        CHECK(strstr(h2->note, "online.windows=") != NULL, "the saved head's note lacks the online lines: '%s'", h2->note);
        sd_drafter *d2 = new_drafter(h2, NULL);
        CHECK(d2 && run_stream(d2, N_GEN / 2, N_GEN / 2, t_saved) == 0, "saved head: %s", g_err);
        print_taus("saved head, 2nd half", t_saved, N_GEN / 2);
        // Measured: 2.42 over the second half (the final parameters: above the online
        // drafter's 2.07 there), 2.42 against 2.40 over the last round of the N_KIND prompts.
        const double sv = mean(t_saved, N_GEN / 2), sv_last = mean(t_saved + N_GEN / 2 - N_KIND, N_KIND);
        const double o_last = mean(t_online + N_GEN - N_KIND, N_KIND);
        printf("  saved head: mean tau %.2f on the second half (static %.2f, online %.2f), last round %.2f (online %.2f)\n",
               sv, s_late, o_late, sv_last, o_last);
        CHECK(sv > s_late + 0.5, "the saved head did not keep what was learnt: tau %.2f against %.2f", sv, s_late);
        CHECK(fabs(sv_last - o_last) < 0.3, "the saved head drafts the last round at tau %.2f, the online drafter did at %.2f",
              sv_last, o_last);
        sd_drafter_free(d2);
        sd_head_free(h2);
    }
    // reset forgets it all: the head as given
    sd_drafter_reset(d);
    CHECK(sd_drafter_online_stats(d, &os) == 1 && os.n_windows == 0 && os.n_positions == 0,
          "reset kept %lld windows", (long long)os.n_windows);
    sd_drafter_free(d);
}

// The training thread: windows are trained and taken up while generating,
// the output stays plain decoding's, and free stops the thread (also while
// windows are still queued).
static void test_online_thread(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    static double t_online[N_GEN];
    sd_head_online_params op = online_params(0, 3e-3f);
    sd_drafter *d = new_drafter(g_head, &op);
    CHECK(d != NULL, "%s", g_err);
    if (!d) return;
    int bad = run_stream(d, 0, N_GEN, t_online);
    CHECK(bad == 0, "online (thread): %d generations differ from plain decoding (%s)", bad, g_err);
    // wait for the queue: every generation's windows trained (or dropped, when training fell behind)
    CHECK(sd_drafter_online_wait(d, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_head_online_stats os;
    sd_drafter_online_stats(d, &os);
    printf("  %s\n", sd_drafter_note(d));
    print_taus("online (thread)", t_online, N_GEN);
    CHECK(os.n_windows + os.n_dropped >= 2 * N_GEN, "after the wait: %lld windows trained, %lld dropped",
          (long long)os.n_windows, (long long)os.n_dropped);
    CHECK(os.n_positions > N_GEN * GEN_N / 2, "%lld positions collected", (long long)os.n_positions);
    CHECK(os.n_windows >= 1 && os.n_updates >= 1, "no window trained or taken up: %lld trained, %lld dropped, %lld taken",
          (long long)os.n_windows, (long long)os.n_dropped, (long long)os.n_updates);
    // The thread's schedule varies, so only averages: measured as the deterministic run
    // (1.15 over the first 4, 2.07 over the second half) when the thread keeps up.
    const double early = mean(t_online, 4), late = mean(t_online + N_GEN / 2, N_GEN / 2);
    printf("  mean tau: %.2f (first 4) -> %.2f (second half)\n", early, late);
    // On a host too busy for the thread to keep up, windows are dropped and the
    // rise comes later: then only no fall is required (the deterministic test
    // above checks the rise itself, independent of the host's speed).
    if (os.n_dropped * 4 <= os.n_windows)
        CHECK(late > early + 0.3, "acceptance did not rise with the training thread: %.2f -> %.2f", early, late);
    else
        CHECK(late >= early - 0.05, "acceptance fell with the training thread (%lld windows dropped): %.2f -> %.2f",
              (long long)os.n_dropped, early, late);
    // Save waits for the window in training; the file loads.
    sd_head_free(save_and_load(d, "_t"));
    sd_drafter_free(d);
    // Free right after a burst of windows: the thread stops after the one it trains.
    for (int r = 0; r < 3; r++) {
        d = new_drafter(g_head, &op);
        CHECK(d && run_stream(d, 100 + r * 4, 4, t_online) == 0, "%s", g_err);
        double t0 = sd_time_ms();
        sd_drafter_free(d);
        CHECK(sd_time_ms() - t0 < 5000, "free took %.0f ms", sd_time_ms() - t0);
    }
}

// Sampled output stays the target's distribution while the drafts change:
// the chi-square of test_methods_lossless.c over 3-token continuations, with a drafter
// that trains a window after every generation (deterministic).
static void test_online_sampled_distribution(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_head_online_params op = online_params(1, 3e-3f);
    op.window = 8;
    op.min_window = 2;
    sd_drafter *d = new_drafter(g_head, &op);
    sd_session *s = sc_new_session(g_m, 64, 2, g_err, sizeof g_err), *ref = sc_new_session(g_m, 64, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_topk4_sampler(NV, g_err, sizeof g_err);
    CHECK(d && s && ref && smp, "%s", g_err);
    if (d && s && ref && smp) {
        int32_t prompt[6] = {12, 250, 7, 88, 140, 33};
        static sc_seq3 e;
        sc_fwd_probs fp = {ref, smp, g_err, sizeof g_err};
        CHECK(sc_seq3_enumerate(&e, sc_fwd_probs_fn, &fp, prompt, 6, NV) == 0 && e.n_seq == 64, "enumeration");
        static double cnt[64];
        int n_other = 0, n_run = 2000;
        double fwd = 0;
        sd_sampler_reseed(smp, 78);
        static sc_tokens o;
        for (int r = 0; r < n_run; r++) {
            sd_gen_params gp = sd_gen_default_params();
            gp.n_predict = 3;
            gp.max_nodes = 16;
            sd_gen_stats st;
            o.n = 0;
            sd_session_truncate(s, 0, NULL, 0);
            if (sd_generate(s, smp, d, prompt, 6, &gp, sc_collect_cb, &o, &st, g_err, sizeof g_err) < 0 || o.n != 3) {
                CHECK(0, "run %d: %s", r, g_err);
                break;
            }
            fwd += st.mean_accepted;
            sc_seq3_tally(&e, o.tok, cnt, &n_other);
        }
        double chi = n_other ? 1e9 : sc_seq3_chi2(&e, cnt, n_run);
        sd_head_online_stats os;
        sd_drafter_online_stats(d, &os);
        printf("  online sampled: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward, %lld windows trained\n", chi,
               fwd / n_run, (long long)os.n_windows);
        CHECK(chi < 125.0, "sampled output with online adaptation is not the target's distribution (chi2 %.1f)", chi);
        CHECK(os.n_windows > n_run / 4, "the drafts hardly changed: %lld windows trained", (long long)os.n_windows);
    }
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_session_free(ref);
    sd_drafter_free(d);
}

// Bad settings and drafters without a head.
static void test_online_errors(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_head_online_params op = online_params(1, 1e-3f);
    op.window = 4;
    CHECK(new_drafter(g_head, &op) == NULL && strstr(g_err, "window"), "window 4 accepted: %s", g_err);
    op = online_params(1, 0.0f);
    CHECK(new_drafter(g_head, &op) == NULL && strstr(g_err, "learning rate"), "lr 0 accepted: %s", g_err);
    op = online_params(1, 1e-3f);
    op.min_window = 64;
    CHECK(new_drafter(g_head, &op) == NULL && strstr(g_err, "shortest window"), "min_window > window accepted: %s", g_err);
    // through the method registry; a drafter without a head cannot save one
    sd_method me;
    CHECK(sd_method_parse("ngram:3-8", &me, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_method_env env = sd_method_env_default(g_m);
    env.head_online = online_params(0, 1e-3f);
    sd_drafter *d = NULL;
    CHECK(sd_method_make(&me, &env, &d, g_err, sizeof g_err) == 0 && d, "%s", g_err);
    sd_head_online_stats os;
    CHECK(sd_drafter_online_stats(d, &os) == 0, "an n-gram drafter reports online statistics");
    CHECK(sd_drafter_save_head(d, "/tmp/none.gguf", g_err, sizeof g_err) < 0 && strstr(g_err, "no head"),
          "an n-gram drafter saved a head: %s", g_err);
    sd_drafter_free(d);
    CHECK(sd_method_parse("eagle3:chain:3", &me, g_err, sizeof g_err) == 0, "%s", g_err);
    env.head_eagle3 = g_head;
    d = NULL;
    CHECK(sd_method_make(&me, &env, &d, g_err, sizeof g_err) == 0 && d, "%s", g_err);
    CHECK(d && sd_drafter_online_stats(d, &os) == 1, "eagle3 with env.head_online.on is not online");
    sd_drafter_free(d);
}

int main(void) {
    T_RUN(test_online_acceptance_rises);
    T_RUN(test_online_thread);
    T_RUN(test_online_sampled_distribution);
    T_RUN(test_online_errors);
    sd_head_free(g_head);
    sd_model_free(g_m);
    T_EXIT();
}

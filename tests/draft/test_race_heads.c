// test_race_heads.c - reproducible sampling with trained-head drafters: with
// the race draw (the default), sampled text equals plain sampling's with the
// same seed, token for token, for EAGLE-3 methods (chain, widths, dynamic,
// automatic trees, the n-gram fallback) and Medusa, on a synthetic model with
// random heads and on the default model with its shipped head (step limits
// that change every step included); the shipped head's drafts share the
// target's noise, so they are accepted as often as with rejection sampling.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "head/head.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "spec/cost_curve.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

// The drafter of method for target m (heads e3 / md, may be NULL); a method
// with an automatic tree gets a fixed cost curve (1 ms + 0.05 ms a node).
static sd_drafter *make(const sd_model *m, const sd_head *e3, const sd_head *md, const char *method, sd_session *s,
                        sd_cost_curve **cc) {
    sd_method me;
    sd_drafter *d = NULL;
    *cc = NULL;
    if (sd_method_parse(method, &me, g_err, sizeof g_err) < 0) return NULL;
    sd_method_env env = sd_method_env_default(m);
    env.head_eagle3 = e3;
    env.head_medusa = md;
    env.pool = sd_session_pool(s);
    if (me.uses_cost_curve) {
        if (sd_cost_curve_new(cc, s, 16, g_err, sizeof g_err) < 0) return NULL;
        for (int k = 1; k <= 16; k++) sd_cost_curve_set(*cc, k, 1.0 + 0.05 * (k - 1));
        env.cost = *cc;
    }
    if (sd_method_make(&me, &env, &d, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

// Runs d (NULL: plain) with smp reseeded to seed; vary: a step limit that
// changes every step. 0 or -1.
static int run(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int np, int n, uint64_t seed,
               int vary, sc_tokens *out, sd_gen_stats *st) {
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n;
    gp.max_nodes = 32;
    sd_gen *g = NULL;
    out->n = 0;
    sd_sampler_reseed(smp, seed);
    if (d) sd_drafter_reset(d);
    if (sd_session_truncate(s, 0, g_err, sizeof g_err) < 0 || sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) < 0)
        return -1;
    int rc = sd_gen_prefill(g, prompt, np, g_err, sizeof g_err);
    for (int k = 0; rc == 0 && sd_gen_finished(g) == SD_FINISH_NONE; k++) {
        if (vary) sd_gen_set_step_limit(g, 2 + (k * 5) % 12);
        sd_step one;
        rc = sd_gen_step(g, &one, g_err, sizeof g_err);
        for (int i = 0; rc == 0 && i < one.n_tokens && out->n < SC_MAXTOK; i++) out->tok[out->n++] = one.tokens[i];
    }
    if (st) *st = *sd_gen_get_stats(g);
    sd_gen_free(g);
    return rc;
}

// Every method against plain sampling on prompt, for two seeds (the second
// with varying step limits). acc/fwd/tok: totals per method (may be NULL).
static void check_methods(const sd_model *m, const sd_head *e3, const sd_head *md, const char *const *methods, int nm,
                          const int32_t *prompt, int np, int n, float temp, int draw, int compare, double *tau) {
    sd_session *s = sc_new_session(m, 256, 2, g_err, sizeof g_err);
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = temp;
    sp.draw = draw;
    sd_sampler *smp = NULL;
    if (s) sd_sampler_new(&smp, &sp, m->hp.n_vocab, g_err, sizeof g_err);
    CHECK(s && smp, "setup: %s", g_err);
    for (int i = 0; s && smp && i < nm; i++) {
        sd_cost_curve *cc = NULL;
        sd_drafter *d = make(m, e3, md, methods[i], s, &cc);
        CHECK(d, "%s: %s", methods[i], g_err);
        long f = 0, t = 0;
        for (uint64_t seed = 1; d && seed <= 2; seed++) {
            static sc_tokens a, b;
            sd_gen_stats st;
            memset(&st, 0, sizeof st);
            int rc = compare ? run(s, smp, NULL, prompt, np, n, seed, 0, &a, NULL) : 0;
            CHECK(rc == 0, "plain: %s", g_err);
            rc = run(s, smp, d, prompt, np, n, seed, seed == 2, &b, &st);
            CHECK(rc == 0, "%s: %s", methods[i], g_err);
            if (compare)
                CHECK(rc != 0 || sc_same_tokens(&a, &b), "%s, seed %d%s: differs from plain sampling", methods[i],
                      (int)seed, seed == 2 ? " (varying step limits)" : "");
            f += st.n_target_forwards;
            t += b.n;
        }
        if (tau) tau[i] = f ? (double)t / f : 0.0;
        sd_drafter_free(d);
        sd_cost_curve_free(cc);
    }
    sd_sampler_free(smp);
    sd_session_free(s);
}

static void test_random_heads(void) {
    synth_params p = synth_default_params();
    p.n_layer = 6;
    sd_model *m = sc_synth_model(&p, "race_head", "t", g_err, sizeof g_err);
    if (!m) SKIP("synthetic model: %.200s", g_err);
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = 200;
    sd_head *e3 = NULL, *md = NULL;
    CHECK(sd_head_new(&e3, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    hp = sd_head_default_hp(m, SD_HEAD_MEDUSA);
    hp.n_draft_vocab = 150;
    CHECK(sd_head_new(&md, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (e3 && md) {
        sd_head_init(e3, 5);
        sd_head_init(md, 21);
        int32_t prompt[20];
        for (int i = 0; i < 20; i++) prompt[i] = 3 + (i * 37) % 300;
        static const char *const methods[] = {"eagle3:chain:4", "eagle3:tree:3-2-1", "eagle3:dyn:3-4-10",
                                              "eagle3:auto",    "ngram:2-4/eagle3:auto", "medusa:3-2-2-1"};
        double tau[6];
        check_methods(m, e3, md, methods, 6, prompt, 20, 48, 0.9f, SD_DRAW_RACE, 1, tau);
        for (int i = 0; i < 6; i++) printf("  synthetic %-22s %.2f tokens per forward\n", methods[i], tau[i]);
    }
    sd_head_free(e3);
    sd_head_free(md);
    sd_model_free(m);
}

static void test_shipped_head(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    char path[1024];
    sd_head *h = NULL;
    int rc = sd_head_find(m, "heads", path, sizeof path, g_err, sizeof g_err);
    if (rc != 1) {
        sd_model_free(m);
        SKIP("no head in heads/ for %s", DEFAULT_MODEL);
    }
    CHECK(sd_head_load(&h, path, m, g_err, sizeof g_err) == 0, "%s", g_err);
    if (h) {
        const char *text = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n";
        int32_t prompt[128];
        int np = sd_tokenize(sd_model_tokenizer(m), text, strlen(text), 1, 1, prompt, 128);
        static const char *const methods[] = {"eagle3:auto", "ngram:3-8/eagle3:auto", "eagle3:chain:3"};
        double tr[3], tj[3];
        check_methods(m, h, NULL, methods, 3, prompt, np, 40, 0.8f, SD_DRAW_RACE, 1, tr);
        check_methods(m, h, NULL, methods, 3, prompt, np, 40, 0.8f, SD_DRAW_REJECTION, 0, tj);
        for (int i = 0; i < 3; i++) {
            printf("  shipped head %-22s race %.2f, rejection %.2f tokens per forward\n", methods[i], tr[i], tj[i]);
            CHECK(tr[i] > 1.05, "%s: the shared noise hardly gets drafts accepted (tau %.2f)", methods[i], tr[i]);
        }
    }
    sd_head_free(h);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_random_heads);
    T_RUN(test_shipped_head);
    T_EXIT();
}

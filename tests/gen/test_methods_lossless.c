// test_methods_lossless.c - the speculative loop against plain decoding: greedy output
// must be token-for-token identical (chain, width tree, dynamic tree, merged
// drafters, several prompts, n_predict cuts, full context, repetition
// penalty); a model drafting for itself must have every draft accepted; the
// draft model's KV cache must stay in step; and the same on the default
// model when present. Sampling with the race draw (the default) must give
// plain sampling's text for the same seed, token for token, with every
// method and any step size; sampled output follows the target's
// distribution with both draws.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "draft/draft_model.h"
#include "draft/draft_merge.h"
#include "specdec_spec.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

typedef sc_tokens collect_t;

static sd_model *synth_model(uint64_t seed, int n_layer, int n_embd, int n_vocab, const char *tag) {
    synth_params p = synth_default_params();
    p.seed = seed;
    p.n_layer = n_layer;
    p.n_embd = n_embd;
    p.n_vocab = n_vocab;
    return sc_synth_model(&p, "spec", tag, g_err, sizeof g_err);
}

static int g_threads = 1;   // tiny models: one thread is fastest
static sd_session *new_session(const sd_model *m, int n_ctx) {
    return sc_new_session(m, n_ctx, g_threads, g_err, sizeof g_err);
}

static sd_sampler *greedy_sampler(int n_vocab, float penalty) {
    return sc_new_sampler(n_vocab, 0.0f, penalty, g_err, sizeof g_err);
}

// Plain greedy reference; leaves the session's n_past in *n_past.
static int run_plain(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt, int n_predict,
                     collect_t *out, int *finish, int *n_past) {
    sd_gen_stats st;
    int rc = sc_run_plain(s, smp, prompt, n_prompt, n_predict, out, &st, g_err, sizeof g_err);
    *finish = st.finish;
    *n_past = sd_session_n_past(s);
    return rc;
}

static int run_spec(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                    int n_predict, int max_nodes, collect_t *out, sd_gen_stats *st) {
    return sc_run_spec(s, smp, d, prompt, n_prompt, n_predict, max_nodes, out, st, g_err, sizeof g_err);
}

static int same_tokens(const collect_t *a, const collect_t *b) { return sc_same_tokens(a, b); }

static void make_prompt(int32_t *p, int n, uint64_t seed, int n_vocab) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 3 + (int32_t)((seed >> 33) % (uint64_t)(n_vocab - 3));
    }
}

// Shared fixtures: target (2 layers), a different draft (1 layer, other seed).
static sd_model *g_tgt, *g_dft, *g_dft2, *g_near;

static sd_drafter *new_dm(const sd_model *draft, int shape, int k) {
    sd_draft_model_params dp = sd_draft_model_default_params();
    dp.shape = shape;
    dp.k = k;
    dp.n_ctx = 512;
    dp.n_threads = 1;
    dp.n_widths = 3;
    dp.widths[0] = 3, dp.widths[1] = 2, dp.widths[2] = 1;
    dp.dyn_b = 3, dp.dyn_d = 4, dp.dyn_m = 12;
    sd_drafter *d = NULL;
    if (sd_draft_model_new(&d, draft, g_tgt, &dp, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

// Greedy equality of one drafter over several prompts and lengths.
static void check_equal(sd_drafter *d, const char *name, float penalty, int self_draft) {
    sd_session *s = new_session(g_tgt, 512);
    sd_sampler *smp = greedy_sampler(320, penalty);
    CHECK(s && smp && (d || !strcmp(name, "no drafter")), "%s: setup: %s", name, g_err);
    if (!s || !smp || (!d && strcmp(name, "no drafter"))) goto out;
    static collect_t a, b;
    int n_fwd = 0, n_tok = 0;
    for (int pr = 0; pr < 4; pr++) {
        int32_t prompt[40];
        int np = 5 + pr * 9;
        make_prompt(prompt, np, 77 + (uint64_t)pr, 320);
        int fa, npa;
        CHECK(run_plain(s, smp, prompt, np, 48, &a, &fa, &npa) == 0, "plain: %s", g_err);
        sd_gen_stats st;
        int rc = run_spec(s, smp, d, prompt, np, 48, 16, &b, &st);
        CHECK(rc == 0, "%s: %s", name, g_err);
        CHECK(same_tokens(&a, &b), "%s prompt %d: speculative output differs from plain greedy (%d vs %d tokens)", name,
              pr, b.n, a.n);
        CHECK(st.finish == fa && sd_session_n_past(s) == npa, "%s: finish %d/%d n_past %d/%d", name,
              st.finish, fa, sd_session_n_past(s), npa);
        n_fwd += st.n_target_forwards;
        n_tok += b.n;
        if (self_draft) {
            for (int k = 1; k <= st.max_depth; k++)
                CHECK(st.n_depth_accepted[k] == st.n_depth_proposed[k], "%s: self-draft rejected at depth %d (%d of %d)",
                      name, k, st.n_depth_accepted[k], st.n_depth_proposed[k]);
        }
    }
    printf("  %-26s %4d tokens in %4d target forwards (%.2f per forward)\n", name, n_tok, n_fwd,
           n_fwd ? (double)n_tok / n_fwd : 0.0);
out:
    sd_sampler_free(smp);
    sd_session_free(s);
}

static int need_models(void) {
    if (!g_tgt) g_tgt = synth_model(1234, 2, 64, 320, "tgt");
    if (!g_dft) g_dft = synth_model(99, 1, 64, 320, "dft");
    if (!g_dft2) g_dft2 = synth_model(555, 1, 64, 320, "dft2");
    // Same seed, one layer less: distributions close to the target's.
    if (!g_near) g_near = synth_model(1234, 1, 64, 320, "near");
    return g_tgt && g_dft && g_dft2 && g_near;
}

static void test_vocab_check(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_model *big = synth_model(1, 1, 64, 384, "big");
    CHECK(big != NULL, "%s", g_err);
    if (!big) return;
    char err[256] = "";
    CHECK(sd_draft_vocab_check(g_dft, big, err, sizeof err) == 0, "padded target accepted: %s", err);
    CHECK(sd_draft_vocab_check(big, g_tgt, err, sizeof err) < 0 && strstr(err, "larger"), "larger draft refused: %s", err);
    sd_model *real = NULL;
    if (access(DEFAULT_MODEL, R_OK) == 0 && sd_model_load(&real, DEFAULT_MODEL, g_err, sizeof g_err) == 0) {
        CHECK(sd_draft_vocab_check(g_dft, real, err, sizeof err) < 0 && strstr(err, "id 0"), "mismatch named: %s", err);
        printf("  mismatch message: %s\n", err);
        sd_model_free(real);
    }
    sd_model_free(big);
}

static void test_greedy_chain(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_dft, SD_DRAFT_CHAIN, 4);
    check_equal(d, "chain k=4", 1.0f, 0);
    sd_drafter_free(d);
}
static void test_greedy_widths(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_dft, SD_DRAFT_WIDTHS, 0);
    check_equal(d, "widths {3,2,1}", 1.0f, 0);
    sd_drafter_free(d);
}
static void test_greedy_dynamic(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_dft, SD_DRAFT_DYNAMIC, 0);
    check_equal(d, "dynamic B3 D4 M12", 1.0f, 0);
    sd_drafter_free(d);
}
static void test_greedy_merged(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *subs[3] = {new_dm(g_dft, SD_DRAFT_CHAIN, 4), new_dm(g_dft2, SD_DRAFT_WIDTHS, 0),
                           new_dm(g_tgt, SD_DRAFT_CHAIN, 3)};
    CHECK(subs[0] && subs[1] && subs[2], "sub-drafters: %s", g_err);
    sd_drafter *d = NULL;
    CHECK(sd_draft_merge_new(&d, subs, 3, 320, g_err, sizeof g_err) == 0, "%s", g_err);
    check_equal(d, "merged (2 drafts + self)", 1.0f, 0);
    sd_drafter_free(d);
}
static void test_greedy_penalty(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_dft, SD_DRAFT_WIDTHS, 0);
    check_equal(d, "widths, repeat penalty 1.5", 1.5f, 0);
    sd_drafter_free(d);
}
static void test_self_draft_chain(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_tgt, SD_DRAFT_CHAIN, 5);
    check_equal(d, "self-draft chain k=5", 1.0f, 1);
    sd_drafter_free(d);
}
static void test_self_draft_widths(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_tgt, SD_DRAFT_WIDTHS, 0);
    check_equal(d, "self-draft widths", 1.0f, 1);
    sd_drafter_free(d);
}
static void test_no_drafter(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    check_equal(NULL, "no drafter", 1.0f, 0);
}

// n_predict cuts inside accepted paths, and a context that fills up.
static void test_limits(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_tgt, SD_DRAFT_CHAIN, 5);
    sd_session *s = new_session(g_tgt, 48);
    sd_sampler *smp = greedy_sampler(320, 1.0f);
    CHECK(d && s && smp, "setup: %s", g_err);
    if (!d || !s || !smp) goto out;
    static collect_t a, b;
    int32_t prompt[8];
    make_prompt(prompt, 8, 5, 320);
    for (int n = 1; n <= 12; n++) {
        int fa, npa;
        sd_gen_stats st;
        run_plain(s, smp, prompt, 8, n, &a, &fa, &npa);
        CHECK(run_spec(s, smp, d, prompt, 8, n, 16, &b, &st) == 0, "%s", g_err);
        CHECK(same_tokens(&a, &b) && b.n == n, "n_predict %d: %d tokens", n, b.n);
        CHECK(sd_session_n_past(s) == npa, "n_predict %d: n_past %d, plain %d", n, sd_session_n_past(s), npa);
    }
    // Until the context (48) is full.
    int fa, npa;
    sd_gen_stats st;
    run_plain(s, smp, prompt, 8, 0, &a, &fa, &npa);
    CHECK(run_spec(s, smp, d, prompt, 8, 0, 16, &b, &st) == 0, "%s", g_err);
    CHECK(same_tokens(&a, &b) && st.finish == fa && fa == SD_FINISH_CTX, "full context: %d vs %d tokens, finish %d/%d",
          b.n, a.n, st.finish, fa);
    CHECK(sd_session_n_past(s) == npa, "full context: n_past %d, plain %d", sd_session_n_past(s), npa);
out:
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
}

// An EOG token inside an accepted path ends generation there: find prompts
// whose plain greedy output ends with EOS and compare (self-draft, so the EOS
// is usually inside a long accepted chain).
static void test_eog_in_path(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_dm(g_tgt, SD_DRAFT_CHAIN, 6);
    sd_session *s = new_session(g_tgt, 256);
    sd_sampler *smp = greedy_sampler(320, 1.0f);
    CHECK(d && s && smp, "setup: %s", g_err);
    int found = 0;
    if (d && s && smp) {
        static collect_t a, b;
        for (uint64_t seed = 0; seed < 400 && found < 3; seed++) {
            int32_t prompt[4];
            make_prompt(prompt, 4, 1000 + seed, 320);
            int fa, npa;
            run_plain(s, smp, prompt, 4, 96, &a, &fa, &npa);
            if (fa != SD_FINISH_EOG) continue;
            found++;
            sd_gen_stats st;
            CHECK(run_spec(s, smp, d, prompt, 4, 96, 16, &b, &st) == 0, "%s", g_err);
            CHECK(same_tokens(&a, &b) && st.finish == SD_FINISH_EOG, "EOG prompt %d: %d vs %d tokens, finish %d",
                  (int)seed, b.n, a.n, st.finish);
            CHECK(sd_session_n_past(s) == npa, "EOG: n_past %d, plain %d", sd_session_n_past(s), npa);
        }
    }
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    if (!found && !t_case_failed) SKIP("no prompt among 400 makes the synthetic model emit EOS");
    printf("  %d prompts ending in EOS compared\n", found);
}

// Sampling: runs, reproducible with a seed, self-draft accepts (nearly) all.
static void test_stochastic_smoke(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_session *s = new_session(g_tgt, 512);
    sd_drafter *d = new_dm(g_tgt, SD_DRAFT_CHAIN, 4);
    sd_drafter *d2 = new_dm(g_dft, SD_DRAFT_WIDTHS, 0);
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = 0.9f;
    sd_sampler *smp = NULL;
    sd_sampler_new(&smp, &sp, 320, g_err, sizeof g_err);
    CHECK(s && d && d2 && smp, "setup: %s", g_err);
    if (!s || !d || !d2 || !smp) goto out;
    static collect_t a, b;
    int32_t prompt[6];
    make_prompt(prompt, 6, 9, 320);
    sd_gen_stats st;
    sd_sampler_reseed(smp, 42);
    CHECK(run_spec(s, smp, d, prompt, 6, 64, 16, &a, &st) == 0, "%s", g_err);
    CHECK(st.n_draft_accepted >= st.n_draft_nodes * 98 / 100, "self-draft sampling accepted %d of %d", st.n_draft_accepted,
          st.n_draft_nodes);
    sd_sampler_reseed(smp, 42);
    CHECK(run_spec(s, smp, d, prompt, 6, 64, 16, &b, &st) == 0, "%s", g_err);
    CHECK(same_tokens(&a, &b), "same seed, same output");
    CHECK(run_spec(s, smp, d2, prompt, 6, 64, 16, &b, &st) == 0 && b.n == 64, "width tree sampling: %s", g_err);
    printf("  sampled, other draft: %.2f tokens per forward\n", st.mean_accepted);
out:
    sd_drafter_free(d);
    sd_drafter_free(d2);
    sd_sampler_free(smp);
    sd_session_free(s);
}

// End-to-end losslessness of sampling on real (synthetic) models: with top-k
// 4 each step has 4 candidates, so the first 3 generated tokens have 64
// possible values whose exact probabilities come from plain target forwards
// (with the repetition penalty on, so the per-node history matters). The
// speculative loop's empirical distribution must pass a chi-square test.
static void check_sampled_distribution(sd_drafter *d, const char *name, int n_run, int draw) {
    sd_session *s = new_session(g_tgt, 64), *ref = new_session(g_tgt, 64);
    sd_sampler *smp = sc_topk4_sampler(320, g_err, sizeof g_err);
    if (smp) {   // the same settings with the given draw
        sd_sampler_params sp = *sd_sampler_get_params(smp);
        sp.draw = draw;
        sd_sampler_free(smp);
        smp = NULL;
        sd_sampler_new(&smp, &sp, 320, g_err, sizeof g_err);
    }
    CHECK(s && ref && smp && d, "%s: setup: %s", name, g_err);
    if (!s || !ref || !smp || !d) goto out;
    int32_t prompt[6 + 3];
    make_prompt(prompt, 6, 31, 320);
    // Exact distribution: enumerate the (at most 4) candidates per step.
    static sc_seq3 e;
    sc_fwd_probs fp = {ref, smp, g_err, sizeof g_err};
    CHECK(sc_seq3_enumerate(&e, sc_fwd_probs_fn, &fp, prompt, 6, 320) == 0, "out of memory");
    CHECK(e.n_support1 == 4, "top-k support %d", e.n_support1);
    CHECK(e.n_seq == 64, "enumerated %d sequences", e.n_seq);
    static double cnt[64];
    memset(cnt, 0, sizeof cnt);
    int n_other = 0;
    sd_sampler_reseed(smp, 2024);
    static collect_t out;
    double fwd = 0;
    for (int r = 0; r < n_run; r++) {
        sd_gen_stats st;
        if (run_spec(s, smp, d, prompt, 6, 3, 16, &out, &st) < 0 || out.n != 3) {
            CHECK(0, "%s: run %d: %s", name, r, g_err);
            break;
        }
        fwd += st.mean_accepted;
        sc_seq3_tally(&e, out.tok, cnt, &n_other);
    }
    double chi = sc_seq3_chi2(&e, cnt, n_run);
    // df = 63: mean 63, sd 11.2; 125 is more than 5 sd out.
    printf("  %-26s %-9s chi2 = %.1f (df 63, limit 125), %.2f tokens per forward\n", name,
           draw == SD_DRAW_RACE ? "race" : "rejection", chi, fwd / n_run);
    CHECK(n_other == 0, "%s: %d sequences outside the target's support", name, n_other);
    CHECK(chi < 125.0, "%s: chi2 %.1f: sampled output is not distributed as the target", name, chi);
out:
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_session_free(ref);
}

static void test_sampled_distribution(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    for (int draw = SD_DRAW_RACE; draw <= SD_DRAW_REJECTION; draw++) {
        sd_drafter *d = new_dm(g_near, SD_DRAFT_CHAIN, 3);
        check_sampled_distribution(d, "sampled chain", 2000, draw);
        sd_drafter_free(d);
        d = new_dm(g_near, SD_DRAFT_WIDTHS, 0);
        check_sampled_distribution(d, "sampled widths {3,2,1}", 2000, draw);
        sd_drafter_free(d);
        sd_drafter *subs[3] = {new_dm(g_dft2, SD_DRAFT_CHAIN, 3), new_dm(g_near, SD_DRAFT_DYNAMIC, 0),
                               new_dm(g_near, SD_DRAFT_CHAIN, 2)};
        CHECK(sd_draft_merge_new(&d, subs, 3, 320, g_err, sizeof g_err) == 0, "%s", g_err);
        check_sampled_distribution(d, "sampled merged", 2000, draw);
        sd_drafter_free(d);
    }
}

// ---------------------------------------------------------------- the race draw
// Runs d (NULL: plain decoding) after reseeding smp with seed; vary: the
// step's node limit changes every step (2..16 nodes, a server's budget under
// changing load). Tokens in out; 0 or -1.
static int run_seeded(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int np, int n,
                      uint64_t seed, int vary, collect_t *out, sd_gen_stats *st) {
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n;
    gp.max_nodes = 16;
    sd_gen *g = NULL;
    out->n = 0;
    sd_sampler_reseed(smp, seed);
    if (d) sd_drafter_reset(d);
    if (sd_session_truncate(s, 0, g_err, sizeof g_err) < 0 || sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) < 0)
        return -1;
    int rc = sd_gen_prefill(g, prompt, np, g_err, sizeof g_err);
    for (int k = 0; rc == 0 && sd_gen_finished(g) == SD_FINISH_NONE; k++) {
        if (vary) sd_gen_set_step_limit(g, 2 + (int)((seed * 7 + (uint64_t)k * 13) % 15));
        sd_step st1;
        rc = sd_gen_step(g, &st1, g_err, sizeof g_err);
        for (int i = 0; rc == 0 && i < st1.n_tokens && out->n < SC_MAXTOK; i++) out->tok[out->n++] = st1.tokens[i];
    }
    if (st) *st = *sd_gen_get_stats(g);
    sd_gen_free(g);
    return rc;
}

static sd_drafter *method_drafter(const char *method, const sd_model *draft) {
    sd_method m;
    sd_drafter *d = NULL;
    sd_method_env env = sd_method_env_default(g_tgt);
    const sd_model *drafts[1] = {draft};
    env.drafts = drafts;
    env.n_drafts = 1;
    env.n_ctx = 512;
    env.n_threads = 1;
    if (sd_method_parse(method, &m, g_err, sizeof g_err) < 0 || sd_method_make(&m, &env, &d, g_err, sizeof g_err) < 0)
        return NULL;
    return d;
}

// Sampled text with the race draw equals plain sampling's with the same
// seed, token for token: draft models close to the target and far from it
// (chain, widths, dynamic trees, merged with prompt lookup), prompt lookup,
// a fallback method, lookahead and a self-draft (every draft accepted), over
// prompts, seeds, a repetition penalty and step limits that change every
// step.
static void test_race_equals_plain(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    static const struct { const char *method; int near; } ms[] = {
        {"chain:4", 1}, {"tree:3-2-1", 1}, {"dyn:3-4-12", 0}, {"chain:3+ngram:2-4", 1},
        {"ngram:2-4", 1}, {"ngram:2-4/chain:3", 0}, {"lookahead:4-3-4", 1}, {"chain:5", 2},
    };
    enum { NM = sizeof ms / sizeof *ms };
    sd_drafter *d[NM];
    for (int i = 0; i < (int)NM; i++) {
        d[i] = method_drafter(ms[i].method, ms[i].near == 2 ? g_tgt : ms[i].near ? g_near : g_dft);
        CHECK(d[i], "%s: %s", ms[i].method, g_err);
    }
    sd_session *s = new_session(g_tgt, 512);
    int64_t acc[NM] = {0}, fwd[NM] = {0}, tok[NM] = {0};
    for (int pen = 0; pen < 2; pen++) {
        sd_sampler *smp = sc_new_sampler(320, 0.9f, pen ? 1.3f : 1.0f, g_err, sizeof g_err);
        CHECK(s && smp && sd_sampler_get_params(smp)->draw == SD_DRAW_RACE, "setup: %s", g_err);
        for (int pr = 0; s && smp && pr < 3; pr++) {
            int32_t prompt[40];
            int np = 6 + pr * 11;
            make_prompt(prompt, np, 300 + (uint64_t)pr, 320);
            if (pr == 2)   // a repetitive prompt, for prompt lookup
                for (int i = 8; i < np; i++) prompt[i] = prompt[i % 8];
            for (uint64_t seed = 1; seed <= 2; seed++) {
                static collect_t a, b;
                sd_gen_stats st;
                memset(&st, 0, sizeof st);
                CHECK(run_seeded(s, smp, NULL, prompt, np, 40, seed, 0, &a, &st) == 0 && a.n == 40, "plain: %s",
                      g_err);
                for (int i = 0; i < (int)NM; i++) {
                    if (!d[i]) continue;
                    int vary = (int)(seed + (uint64_t)pr + (uint64_t)i) % 2;
                    CHECK(run_seeded(s, smp, d[i], prompt, np, 40, seed, vary, &b, &st) == 0, "%s: %s", ms[i].method,
                          g_err);
                    CHECK(same_tokens(&a, &b), "%s, penalty %d, prompt %d, seed %d%s: differs from plain sampling",
                          ms[i].method, pen, pr, (int)seed, vary ? ", varying step limits" : "");
                    acc[i] += st.n_draft_accepted, fwd[i] += st.n_target_forwards, tok[i] += b.n;
                    if (ms[i].near == 2)
                        CHECK(st.n_draft_accepted == st.n_draft_nodes, "self-draft: %d of %d drafts accepted",
                              st.n_draft_accepted, st.n_draft_nodes);
                }
            }
        }
        sd_sampler_free(smp);
    }
    for (int i = 0; i < (int)NM; i++) {
        printf("  %-20s %-5s %lld drafts accepted, %.2f tokens per forward\n", ms[i].method,
               ms[i].near == 2 ? "self" : ms[i].near ? "near" : "far", (long long)acc[i],
               fwd[i] ? (double)tok[i] / fwd[i] : 0.0);
        CHECK(ms[i].near != 1 || acc[i] > 0, "%s: no draft accepted", ms[i].method);
        sd_drafter_free(d[i]);
    }
    sd_session_free(s);
}

static void test_default_model(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    sd_session_params spp = sd_session_default_params();
    spp.n_ctx = 256;
    spp.n_batch = 64;
    spp.n_threads = 2;
    sd_session *s = NULL;
    sd_session_new(&s, m, &spp, g_err, sizeof g_err);
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_sampler *smp = greedy_sampler(info.n_vocab, 1.0f);
    sd_draft_model_params dp = sd_draft_model_default_params();
    dp.k = 4;
    dp.n_ctx = 256;
    dp.n_threads = 2;
    sd_drafter *d = NULL;
    sd_draft_model_new(&d, m, m, &dp, g_err, sizeof g_err);
    CHECK(s && smp && d, "setup: %s", g_err);
    if (s && smp && d) {
        const char *texts[] = {"The capital of France is", "Once upon a time, a little robot"};
        for (int i = 0; i < 2; i++) {
            int32_t prompt[64];
            int np = sd_tokenize(sd_model_tokenizer(m), texts[i], strlen(texts[i]), 1, 0, prompt, 64);
            static collect_t a, b;
            int fa, npa;
            sd_gen_stats st;
            run_plain(s, smp, prompt, np, 24, &a, &fa, &npa);
            CHECK(run_spec(s, smp, d, prompt, np, 24, 8, &b, &st) == 0, "%s", g_err);
            CHECK(same_tokens(&a, &b), "prompt %d: speculative output differs from plain greedy", i);
            printf("  SmolLM2 self-draft: %d tokens, %.2f per forward, accepted %d of %d drafts\n", b.n,
                   st.mean_accepted, st.n_draft_accepted, st.n_draft_nodes);
        }
    }
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_vocab_check);
    T_RUN(test_no_drafter);
    T_RUN(test_greedy_chain);
    T_RUN(test_greedy_widths);
    T_RUN(test_greedy_dynamic);
    T_RUN(test_greedy_merged);
    T_RUN(test_greedy_penalty);
    T_RUN(test_self_draft_chain);
    T_RUN(test_self_draft_widths);
    T_RUN(test_limits);
    T_RUN(test_eog_in_path);
    T_RUN(test_stochastic_smoke);
    T_RUN(test_sampled_distribution);
    T_RUN(test_race_equals_plain);
    T_RUN(test_default_model);
    sd_model_free(g_tgt);
    sd_model_free(g_dft);
    sd_model_free(g_dft2);
    sd_model_free(g_near);
    T_EXIT();
}

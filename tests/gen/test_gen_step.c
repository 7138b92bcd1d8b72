// test_gen_step.c - the public step API (include/specdec_spec.h) and the method
// registry: a generation stepped by hand equals sd_generate and plain
// decoding; begin / forward / end equals sd_gen_step; sd_gen_cut and
// sd_gen_stop leave the text and the cache as plain decoding would; two
// generations sharing one model and one thread pool, stepped in turns, give
// the texts they give alone; misuse gets clear errors; method strings parse,
// merge and fail as documented. Synthetic models (tests/lib/synth).
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "draft/drafter.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

static char g_err[512];
static sd_model *g_tgt;

static int need_model(void) {
    if (!g_tgt) {
        synth_params p = synth_default_params();
        p.seed = 1234;
        p.n_layer = 2;
        g_tgt = sc_synth_model(&p, "gen", "tgt", g_err, sizeof g_err);
    }
    return g_tgt != NULL;
}

// A prompt whose second half repeats its first (prompt lookup finds matches).
static void make_prompt(int32_t *p, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        if (i >= n / 2) {
            p[i] = p[i - n / 2];
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 3 + (int32_t)((seed >> 33) % 317u);
    }
}

static sd_drafter *make_drafter(const char *method) {
    sd_method m;
    sd_drafter *d = NULL;
    sd_method_env env = sd_method_env_default(g_tgt);
    const sd_model *self[1] = {g_tgt};   // draft-model methods: the target drafts for itself
    env.drafts = self;
    env.n_drafts = 1;
    if (sd_method_parse(method, &m, g_err, sizeof g_err) < 0 || sd_method_make(&m, &env, &d, g_err, sizeof g_err) < 0)
        return NULL;
    return d;
}

// Steps a generation by hand, collecting its tokens; 0 or -1.
static int run_steps(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int np, int n_predict,
                     sc_tokens *out, int phases, sd_gen_stats *st) {
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n_predict;
    sd_gen *g;
    out->n = 0;
    if (sd_session_truncate(s, 0, g_err, sizeof g_err) < 0) return -1;
    if (sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) < 0) return -1;
    int rc = sd_gen_prefill(g, prompt, np, g_err, sizeof g_err);
    while (rc == 0 && sd_gen_finished(g) == SD_FINISH_NONE) {
        sd_step step;
        if (phases) {   // the scheduler's way: begin, the caller's forward, end
            sd_batch b;
            rc = sd_gen_step_begin(g, &b, g_err, sizeof g_err);
            if (rc == 0 && b.n > 0) rc = sd_session_forward(s, &b, g_err, sizeof g_err);
            if (rc == 0) rc = sd_gen_step_end(g, &step, g_err, sizeof g_err);
        } else {
            rc = sd_gen_step(g, &step, g_err, sizeof g_err);
        }
        for (int k = 0; rc == 0 && k < step.n_tokens && out->n < (int)(SC_MAXTOK); k++)
            out->tok[out->n++] = step.tokens[k];
        if (rc == 0 && (step.n_tokens > step.n_accepted + 1 ||
                        (step.finish == SD_FINISH_NONE && step.n_tokens != step.n_accepted + 1))) {
            snprintf(g_err, sizeof g_err, "step emitted %d tokens for %d accepted", step.n_tokens, step.n_accepted);
            rc = -1;
        }
    }
    if (st) *st = *sd_gen_get_stats(g);
    sd_gen_free(g);
    return rc;
}

static void test_steps_equal_plain(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = sc_new_session(g_tgt, 256, 1, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(320, 0.0f, 1.0f, g_err, sizeof g_err);
    sd_drafter *d = make_drafter("ngram:3-8");
    CHECK(s && smp && d, "setup: %s", g_err);
    if (!s || !smp || !d) goto out;
    static sc_tokens plain, a, b, c;
    for (int pr = 0; pr < 4; pr++) {
        int32_t prompt[40];
        make_prompt(prompt, 12 + 8 * pr, 50 + (uint64_t)pr);
        int np = 12 + 8 * pr;
        sd_gen_stats ps, st;
        CHECK(sc_run_plain(s, smp, prompt, np, 60, &plain, &ps, g_err, sizeof g_err) == 0, "plain: %s", g_err);
        int np_plain = sd_session_n_past(s);
        CHECK(run_steps(s, smp, d, prompt, np, 60, &a, 0, &st) == 0, "steps: %s", g_err);
        CHECK(sc_same_tokens(&plain, &a), "prompt %d: stepped ngram output differs from plain (%d vs %d tokens)", pr,
              a.n, plain.n);
        CHECK(sd_session_n_past(s) == np_plain && st.finish == ps.finish, "prompt %d: n_past %d/%d finish %d/%d", pr,
              sd_session_n_past(s), np_plain, st.finish, ps.finish);
        CHECK(st.n_generated == a.n, "stats count %d tokens, steps emitted %d", st.n_generated, a.n);
        CHECK(run_steps(s, smp, d, prompt, np, 60, &b, 1, NULL) == 0, "phases: %s", g_err);
        CHECK(sc_same_tokens(&a, &b), "prompt %d: begin/forward/end differs from sd_gen_step", pr);
        CHECK(run_steps(s, smp, NULL, prompt, np, 60, &c, 0, NULL) == 0, "no drafter: %s", g_err);
        CHECK(sc_same_tokens(&plain, &c), "prompt %d: stepping without a drafter differs from plain", pr);
    }
out:
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
}

// sd_gen_prefill_cached: a prompt whose prefix the session already holds
// (a server slot's prefix reuse) gives the same tokens as a fresh prefill,
// the drafter sees the whole prompt, and the misuses fail with messages.
static void test_prefill_cached(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = sc_new_session(g_tgt, 256, 1, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(320, 0.0f, 1.0f, g_err, sizeof g_err);
    sd_drafter *d = make_drafter("ngram:3-8");
    CHECK(s && smp && d, "setup: %s", g_err);
    if (!s || !smp || !d) goto out;
    static sc_tokens fresh, reused;
    int32_t prompt[40];
    make_prompt(prompt, 40, 77);
    CHECK(run_steps(s, smp, d, prompt, 40, 30, &fresh, 0, NULL) == 0, "fresh: %s", g_err);
    for (int keep = 1; keep < 40; keep += 13) {
        sd_gen *g = NULL;
        sd_gen_params gp = sd_gen_default_params();
        gp.n_predict = 30;
        // the session holds a different text after prompt[0..keep): truncate to the prefix
        int rc = sd_session_truncate(s, keep, g_err, sizeof g_err);
        if (rc == 0) rc = sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err);
        if (rc == 0) rc = sd_gen_prefill_cached(g, prompt, 40, keep, g_err, sizeof g_err);
        reused.n = 0;
        while (rc == 0 && sd_gen_finished(g) == SD_FINISH_NONE) {
            sd_step st;
            rc = sd_gen_step(g, &st, g_err, sizeof g_err);
            for (int k = 0; rc == 0 && k < st.n_tokens && reused.n < (int)SC_MAXTOK; k++)
                reused.tok[reused.n++] = st.tokens[k];
        }
        CHECK(rc == 0, "keep %d: %s", keep, g_err);
        CHECK(sc_same_tokens(&fresh, &reused), "keep %d: output differs from a fresh prefill", keep);
        int n_text = 0;
        const int32_t *text = g ? sd_gen_tokens(g, &n_text) : NULL;
        CHECK(text && n_text == 40 + reused.n && !memcmp(text, prompt, sizeof prompt), "keep %d: text has %d tokens",
              keep, n_text);
        CHECK(g && sd_gen_get_stats(g)->n_prompt_tokens == 40 - keep, "keep %d: evaluated %d prompt tokens", keep,
              g ? sd_gen_get_stats(g)->n_prompt_tokens : -1);
        sd_gen_free(g);
    }
    // Misuse: nothing left to evaluate, and a cached count the session does not hold.
    sd_gen *g = NULL;
    sd_gen_params gp = sd_gen_default_params();
    CHECK(sd_session_truncate(s, 10, g_err, sizeof g_err) == 0 && sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) == 0,
          "setup: %s", g_err);
    if (g) {
        g_err[0] = 0;
        CHECK(sd_gen_prefill_cached(g, prompt, 10, 10, g_err, sizeof g_err) < 0 && g_err[0], "all cached accepted");
        g_err[0] = 0;
        CHECK(sd_gen_prefill_cached(g, prompt, 20, 5, g_err, sizeof g_err) < 0 && strstr(g_err, "holds"),
              "wrong cached count accepted: %s", g_err);
        sd_gen_free(g);
    }
out:
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
}

// Cutting a step after k tokens leaves text and cache as plain decoding
// stopped after the same token, and a stop request ends with no token.
static void test_cut_and_stop(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = sc_new_session(g_tgt, 256, 1, g_err, sizeof g_err);
    sd_session *ref = sc_new_session(g_tgt, 256, 1, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(320, 0.0f, 1.0f, g_err, sizeof g_err);
    sd_drafter *d = make_drafter("chain:4");
    CHECK(s && ref && smp && d, "setup: %s", g_err);
    if (!s || !ref || !smp || !d) goto out;
    int32_t prompt[32];
    make_prompt(prompt, 32, 7);
    int cut_checked = 0;
    for (int target_step = 1; target_step < 12 && !cut_checked; target_step++) {
        sd_session_truncate(s, 0, g_err, sizeof g_err);
        sd_gen *g;
        sd_gen_params gp = sd_gen_default_params();
        gp.n_predict = 80;
        CHECK(sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_gen_prefill(g, prompt, 32, g_err, sizeof g_err) == 0, "%s", g_err);
        sd_step st = {0};
        for (int i = 0; i < target_step && sd_gen_finished(g) == SD_FINISH_NONE; i++)
            CHECK(sd_gen_step(g, &st, g_err, sizeof g_err) == 0, "%s", g_err);
        if (st.n_tokens >= 3 && sd_gen_finished(g) == SD_FINISH_NONE) {   // a step with accepted drafts: cut inside
            int n_all;
            sd_gen_tokens(g, &n_all);
            int keep = 1;
            CHECK(sd_gen_cut(g, keep, g_err, sizeof g_err) == 0, "cut: %s", g_err);
            int n_text;
            const int32_t *text = sd_gen_tokens(g, &n_text);
            CHECK(n_text == n_all - (st.n_tokens - keep), "cut text %d tokens, expected %d", n_text,
                  n_all - (st.n_tokens - keep));
            CHECK(sd_gen_finished(g) == SD_FINISH_STOPPED, "finish %d after cut", sd_gen_finished(g));
            // plain decoding of the same text: the cache holds every token but the last
            int n_gen = n_text - 32;
            static sc_tokens plain;
            sd_gen_stats ps;
            CHECK(sc_run_plain(ref, smp, prompt, 32, n_gen, &plain, &ps, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(plain.n == n_gen && !memcmp(plain.tok, text + 32, sizeof(int32_t) * (size_t)n_gen),
                  "cut text differs from plain");
            CHECK(sd_session_n_past(s) == sd_session_n_past(ref), "cache after cut %d rows, plain %d",
                  sd_session_n_past(s), sd_session_n_past(ref));
            CHECK(sd_gen_get_stats(g)->n_generated == n_gen, "stats %d, kept %d", sd_gen_get_stats(g)->n_generated,
                  n_gen);
            sd_step after;
            CHECK(sd_gen_step(g, &after, g_err, sizeof g_err) == 0 && after.n_tokens == 0,
                  "a step after the end emitted %d tokens", after.n_tokens);
            CHECK(sd_gen_cut(g, 5, g_err, sizeof g_err) < 0, "cut beyond the last step accepted");
            cut_checked = 1;
        }
        sd_gen_free(g);
    }
    CHECK(cut_checked, "no step accepted 2+ drafts: the cut inside a step was not exercised");
    // stop
    sd_session_truncate(s, 0, g_err, sizeof g_err);
    sd_gen *g;
    CHECK(sd_gen_new(&g, s, smp, d, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_gen_prefill(g, prompt, 32, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_step st;
    CHECK(sd_gen_step(g, &st, g_err, sizeof g_err) == 0 && st.n_tokens == 1, "first step %d tokens", st.n_tokens);
    int n_before = sd_session_n_past(s);
    sd_gen_stop(g);
    CHECK(sd_gen_step(g, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(st.n_tokens == 0 && st.finish == SD_FINISH_STOPPED, "stopped step: %d tokens, finish %d", st.n_tokens,
          st.finish);
    CHECK(sd_session_n_past(s) == n_before, "stop ran a forward");
    sd_gen_free(g);
out:
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(ref);
    sd_session_free(s);
}

// Two generations on one model and one pool, stepped in turns, give the
// texts each gives alone.
static void test_interleaved(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_threadpool *pool = NULL;
    sd_session *s[2] = {0};
    sd_sampler *smp[2] = {0};
    sd_drafter *d[2] = {0};
    sd_gen *g[2] = {0};
    CHECK(sd_threadpool_new(&pool, 2, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 256;
    sp.n_batch = 64;
    sp.pool = pool;
    const char *methods[2] = {"ngram:3-8", "ar"};
    for (int i = 0; i < 2; i++) {
        CHECK(sd_session_new(&s[i], g_tgt, &sp, g_err, sizeof g_err) == 0, "%s", g_err);
        smp[i] = sc_new_sampler(320, i ? 0.9f : 0.0f, 1.0f, g_err, sizeof g_err);
        d[i] = i ? NULL : make_drafter(methods[i]);
    }
    sd_threadpool_free(pool);   // the sessions keep it alive
    if (!s[0] || !s[1] || !smp[0] || !smp[1] || !d[0]) goto out;
    int32_t prompt[2][24];
    make_prompt(prompt[0], 24, 11);
    make_prompt(prompt[1], 24, 12);
    static sc_tokens alone[2], both[2];
    for (int i = 0; i < 2; i++) {
        sd_sampler_reseed(smp[i], 99);
        CHECK(run_steps(s[i], smp[i], d[i], prompt[i], 24, 50, &alone[i], 0, NULL) == 0, "%s", g_err);
        sd_session_truncate(s[i], 0, g_err, sizeof g_err);
        sd_sampler_reseed(smp[i], 99);
        sd_gen_params gp = sd_gen_default_params();
        gp.n_predict = 50;
        CHECK(sd_gen_new(&g[i], s[i], smp[i], d[i], &gp, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_gen_prefill(g[i], prompt[i], 24, g_err, sizeof g_err) == 0, "%s", g_err);
        both[i].n = 0;
    }
    for (int round = 0; round < 200; round++) {
        int active = 0;
        for (int i = 0; i < 2; i++) {
            if (sd_gen_finished(g[i]) != SD_FINISH_NONE) continue;
            active++;
            sd_step st;
            CHECK(sd_gen_step(g[i], &st, g_err, sizeof g_err) == 0, "%s", g_err);
            for (int k = 0; k < st.n_tokens; k++) both[i].tok[both[i].n++] = st.tokens[k];
        }
        if (!active) break;
    }
    for (int i = 0; i < 2; i++)
        CHECK(sc_same_tokens(&alone[i], &both[i]), "generation %d (%s): interleaved %d tokens differ from alone (%d)", i,
              methods[i], both[i].n, alone[i].n);
out:
    for (int i = 0; i < 2; i++) {
        sd_gen_free(g[i]);
        sd_drafter_free(d[i]);
        sd_sampler_free(smp[i]);
        sd_session_free(s[i]);
    }
}

// A drafter that knows the greedy text ahead (oracle): it proposes a wrong
// first child of the root, then beside it the next 3 tokens right and a 4th
// wrong, and records the hidden rows accept() gets
// for each accepted path node, in order: one row pair per emitted token but
// the last.
typedef struct hid_rec {
    float rows[64][2][64];   // [token][layer][n_embd <= 64]
    int n;
    int bad;                 // a record without rows
    const int32_t *future;   // (n_future) the greedy continuation of the prompt
    int n_future, n_prompt;
} hid_rec;
static int hid_propose(sd_drafter *d, const sd_draft_ctx *ctx, sd_tree *tree, char *err, size_t errlen) {
    (void)err, (void)errlen;
    hid_rec *h = d->impl;
    int at = ctx->n_tokens - h->n_prompt, parent = 0;   // future[at] follows the root
    if (at < h->n_future && tree->n < ctx->max_nodes)   // a wrong first child: the path is not 0, 1, 2, ...
        sd_tree_add(tree, 0, (h->future[at] + 7) % 300 + 3, 1.0f);
    for (int k = 0; k < 4 && at + k < h->n_future && tree->n < ctx->max_nodes; k++)
        parent = sd_tree_add(tree, parent, k < 3 ? h->future[at + k] : (h->future[at + k] + 1) % 300 + 3, 1.0f);
    return 0;
}
static int hid_accept(sd_drafter *d, const sd_step_record *rec, char *err, size_t errlen) {
    (void)err, (void)errlen;
    hid_rec *h = d->impl;
    if (!rec->hidden) h->bad++;
    for (int k = 0; rec->hidden && k < rec->n_path && h->n < 64; k++)
        memcpy(h->rows[h->n++], rec->hidden + (size_t)k * sizeof h->rows[0] / sizeof(float), sizeof h->rows[0]);
    return 0;
}
static void hid_reset(sd_drafter *d) { (void)d; }
static void hid_free(sd_drafter *d) { free(d); }
static const sd_drafter_vt hid_vt = {
    .name = "hidden-recorder", .propose = hid_propose, .accept = hid_accept, .reset = hid_reset, .free = hid_free};

// accept() gets the hidden rows of the accepted path, equal to those a
// forward of the same text asks for itself.
static void test_hidden_rows_to_drafter(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_model_info info;
    sd_model_get_info(g_tgt, &info);
    if (info.n_embd > 64) SKIP("synthetic model n_embd %d > 64", info.n_embd);
    static hid_rec h;
    memset(&h, 0, sizeof h);
    sd_drafter *d = sd_drafter_alloc(&hid_vt, &h);
    sd_session *s = sc_new_session(g_tgt, 128, 1, g_err, sizeof g_err);
    sd_session *ref = sc_new_session(g_tgt, 128, 1, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(320, 0.0f, 1.0f, g_err, sizeof g_err);
    CHECK(d && s && ref && smp, "setup: %s", g_err);
    if (!d || !s || !ref || !smp) goto out;
    d->n_hidden_layers = 2;
    d->hidden_layers[0] = 0;
    d->hidden_layers[1] = SD_HIDDEN_NORM;
    int32_t prompt[10];
    make_prompt(prompt, 10, 5);
    static sc_tokens a, plain;
    sd_gen_stats st;
    CHECK(sc_run_plain(s, smp, prompt, 10, 24, &plain, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    h.future = plain.tok, h.n_future = plain.n, h.n_prompt = 10;
    CHECK(sc_run_spec(s, smp, d, prompt, 10, 24, 8, &a, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sc_same_tokens(&a, &plain), "the oracle's speculative text differs from plain");
    CHECK(st.n_draft_accepted >= a.n / 2, "only %d drafts accepted for %d tokens", st.n_draft_accepted, a.n);
    CHECK(h.bad == 0 && h.n >= a.n - 4, "%d row records (%d without rows) for %d tokens", h.n, h.bad, a.n);
    // the reference: the prompt as prefill does it (8-bit activations, the default), then each root token alone
    sd_batch pb = {.n = 10, .tokens = prompt, .precise = !sd_gen_default_params().fast_prompt};
    CHECK(sd_session_forward(ref, &pb, g_err, sizeof g_err) == 0 && sd_session_commit(ref, NULL, 0, g_err, sizeof g_err) == 0,
          "%s", g_err);
    int32_t layers[2] = {0, SD_HIDDEN_NORM};
    float want[2][64];
    int n_bad = 0;
    for (int k = 0; k < h.n; k++) {
        sd_batch b = {.n = 1, .tokens = &a.tok[k], .hidden_layers = layers, .n_hidden_layers = 2, .hidden_out = &want[0][0]};
        if (sd_session_forward(ref, &b, g_err, sizeof g_err) < 0 || sd_session_commit(ref, NULL, 0, g_err, sizeof g_err) < 0) {
            CHECK(0, "%s", g_err);
            break;
        }
        for (int l = 0; l < 2; l++)
            if (memcmp(want[l], h.rows[k][l], sizeof(float) * (size_t)info.n_embd)) n_bad++;
    }
    CHECK(n_bad == 0, "%d of %d rows differ from the reference forward's", n_bad, 2 * h.n);
out:
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(ref);
    sd_session_free(s);
}

static void test_misuse(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = sc_new_session(g_tgt, 32, 1, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(320, 0.0f, 1.0f, g_err, sizeof g_err);
    if (!s || !smp) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    sd_gen *g;
    CHECK(sd_gen_new(&g, NULL, smp, NULL, NULL, g_err, sizeof g_err) < 0, "no session accepted");
    CHECK(sd_gen_new(&g, s, smp, NULL, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_step st;
    CHECK(sd_gen_step(g, &st, g_err, sizeof g_err) < 0 && strstr(g_err, "prefill"), "step before prefill: '%s'", g_err);
    int32_t prompt[40];
    make_prompt(prompt, 40, 3);
    CHECK(sd_gen_prefill(g, prompt, 0, g_err, sizeof g_err) < 0 && strstr(g_err, "empty"), "empty prompt: '%s'", g_err);
    CHECK(sd_gen_prefill(g, prompt, 40, g_err, sizeof g_err) < 0 && strstr(g_err, "40 tokens") && strstr(g_err, "32"),
          "long prompt: '%s'", g_err);
    CHECK(sd_gen_prefill(g, prompt, 8, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_gen_prefill(g, prompt, 8, g_err, sizeof g_err) < 0, "second prefill accepted");
    sd_batch b;
    CHECK(sd_gen_step_begin(g, &b, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sd_gen_step_begin(g, &b, g_err, sizeof g_err) < 0, "begin twice accepted");
    CHECK(sd_gen_step_end(g, &st, g_err, sizeof g_err) == 0 && st.n_tokens == 1, "%s", g_err);
    CHECK(sd_gen_step_end(g, &st, g_err, sizeof g_err) < 0, "end without begin accepted");
    // the context fills: finish ctx, as plain decoding
    while (sd_gen_finished(g) == SD_FINISH_NONE)
        if (sd_gen_step(g, &st, g_err, sizeof g_err) < 0) break;
    CHECK(sd_gen_finished(g) == SD_FINISH_CTX || sd_gen_finished(g) == SD_FINISH_EOG, "finish %s",
          sd_finish_name(sd_gen_finished(g)));
    sd_gen_free(g);
out:
    sd_sampler_free(smp);
    sd_session_free(s);
}

static void test_method_strings(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    static const struct {
        const char *s;
        int ok, kind, nodes;
    } cases[] = {
        {"ar", 1, SD_METHOD_AR, 1},
        {"chain:4", 1, SD_METHOD_MODEL, 5},
        {"tree:2-2", 1, SD_METHOD_MODEL, 7},
        {"dyn:3-4-12", 1, SD_METHOD_MODEL, 12},
        {"ngram:3-8", 1, SD_METHOD_NGRAM, 33},
        {"ngram:3-8:auto", 1, SD_METHOD_NGRAM, 33},
        {"lookahead:4-3-4", 1, SD_METHOD_LOOKAHEAD, 9},
        {"chain:4+ngram:3-8", 1, SD_METHOD_MERGE, 37},
        {"chain:x", 0, 0, 0},
        {"chain", 0, 0, 0},
        {"nope:1", 0, 0, 0},
        {"chain:4+", 0, 0, 0},
        {"ar+ngram:3-8", 0, 0, 0},
        {"lookahead:4-3-4+ngram:3-8", 0, 0, 0},
        {"ngram:3-8:fast", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sd_method m;
        g_err[0] = 0;
        int rc = sd_method_parse(cases[i].s, &m, g_err, sizeof g_err);
        CHECK((rc == 0) == cases[i].ok, "'%s': rc %d (%s)", cases[i].s, rc, g_err);
        if (rc < 0) {
            CHECK(g_err[0] && strstr(g_err, "method"), "'%s': unclear message '%s'", cases[i].s, g_err);
            continue;
        }
        CHECK((int)m.kind == cases[i].kind && m.tree_nodes == cases[i].nodes, "'%s': kind %d nodes %d, want %d %d",
              cases[i].s, (int)m.kind, m.tree_nodes, cases[i].kind, cases[i].nodes);
    }
    sd_method m;
    CHECK(sd_method_parse("chain:4+ngram:3-8", &m, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(m.needs_draft_model && sd_method_default_nodes(&m, 2) == 1 + 8 + 32, "merge nodes %d",
          sd_method_default_nodes(&m, 2));
    sd_method_env env = sd_method_env_default(g_tgt);
    sd_drafter *d = NULL;
    CHECK(sd_method_make(&m, &env, &d, g_err, sizeof g_err) < 0 && strstr(g_err, "draft model"),
          "draft-model method without a draft: '%s'", g_err);
    CHECK(sd_method_parse("ngram:3-8:auto", &m, g_err, sizeof g_err) == 0 && m.uses_cost_curve, "auto ngram");
    CHECK(sd_method_make(&m, &env, &d, g_err, sizeof g_err) < 0 && strstr(g_err, "cost curve"),
          "automatic tree without a cost curve: '%s'", g_err);
    sd_method ms[8];
    int n = sd_methods_parse("ngram:3-8,chain:2", ms, 8, g_err, sizeof g_err);
    CHECK(n == 3 && ms[0].kind == SD_METHOD_AR, "list: %d methods, first kind %d", n, n > 0 ? (int)ms[0].kind : -1);
    CHECK(sd_methods_parse("ngram:3-8,ngram:3-8", ms, 8, g_err, sizeof g_err) < 0 && strstr(g_err, "twice"),
          "duplicate: '%s'", g_err);
}

int main(void) {
    T_RUN(test_steps_equal_plain);
    T_RUN(test_prefill_cached);
    T_RUN(test_cut_and_stop);
    T_RUN(test_interleaved);
    T_RUN(test_hidden_rows_to_drafter);
    T_RUN(test_misuse);
    T_RUN(test_method_strings);
    sd_model_free(g_tgt);
    T_EXIT();
}

// test_moa_drafter.c - the Mixture of Attentions drafter (docs/moa.md) end to
// end on synthetic targets: greedy output is plain decoding's for random
// drafters (TLI 0 and 1, with and without LSA; chains, trees, dynamic
// trees); a drafter whose SA and CA are zero and whose TLI runs every target
// layer is the target itself, so its drafts are (nearly) all accepted --
// which checks the reading of the target's cache, RoPE and biases of the TLI
// path (llama and qwen2 targets); sampled output keeps the target's
// distribution, and a deliberately wrong variant is rejected; full-text SA
// (sa_full) keeps its verified rows through cuts; files
// round-trip, are found by --head auto, and are refused for another target.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "draft/draft_moa.h"
#include "head/head.h"
#include "head/moa.h"
#include "kernels/quant.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

#define NV 320

static char g_err[512];
static sd_model *g_m, *g_q;   // llama and qwen2 synthetic targets

static sd_model *synth(const char *arch, int n_layer, const char *tag) {
    synth_params p = synth_default_params();
    p.arch = arch;
    p.n_layer = n_layer;
    p.n_vocab = NV;
    return sc_synth_model(&p, "moa", tag, g_err, sizeof g_err);
}

static int setup(void) {
    if (!g_m) g_m = synth("llama", 2, "l");
    if (!g_q) g_q = synth("qwen2", 2, "q");
    return g_m && g_q;
}

// A drafter file for m: random (seed), or with zero SA and CA matrices
// (the residual carries the token embedding through) when zero_sa_ca.
static sd_head *new_moa_h(const sd_model *m, int tli, int no_lsa, int ca_hidden, int zero_sa_ca, uint64_t seed) {
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_MOA);
    hp.n_draft_vocab = NV;
    hp.moa_tli = tli;
    hp.moa_no_lsa = no_lsa;
    hp.moa_ca_hidden = ca_hidden & 1;   // bit 1: sa_hidden
    hp.moa_sa_hidden = ca_hidden >> 1 & 1;
    hp.moa_sa_full = ca_hidden >> 2 & 1;   // bit 2: SA sees the whole text (sa_full)
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    sd_head_init(h, seed);
    if (zero_sa_ca)
        for (int i = 0; i < 2 * SD_MOA_PER_LAYER; i++)
            if (!h->t[i].is_norm) memset(sd_head_w(h, i), 0, sizeof(float) * (size_t)(h->t[i].ne0 * h->t[i].ne1));
    return h;
}

static sd_head *new_moa(const sd_model *m, int tli, int no_lsa, int zero_sa_ca, uint64_t seed) {
    return new_moa_h(m, tli, no_lsa, 0, zero_sa_ca, seed);
}

static sd_drafter *new_drafter(const sd_head *h, const sd_model *m, const char *shape, int k) {
    sd_draft_model_params dp = sd_draft_model_default_params();
    if (!strcmp(shape, "chain")) dp.shape = SD_DRAFT_CHAIN, dp.k = k;
    else if (!strcmp(shape, "dyn")) dp.shape = SD_DRAFT_DYNAMIC, dp.dyn_b = 3, dp.dyn_d = 4, dp.dyn_m = 12;
    else dp.shape = SD_DRAFT_WIDTHS, dp.n_widths = 3, dp.widths[0] = 3, dp.widths[1] = 2, dp.widths[2] = 1;
    dp.n_ctx = 128;
    sd_drafter *d = NULL;
    if (sd_draft_moa_new(&d, h, m, &dp, SD_TYPE_F32, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

// A ca_hidden drafter kept, for every position of the text it drafted from,
// the target's state there: the rows equal a plain forward's over the text
// (prompt and output) at the layer the drafter asked for.
static void states_check(const sd_model *m, const sd_drafter *d, const int32_t *prompt, int np, const sc_tokens *out,
                         const char *what) {
    int n_ok = 0;
    const int32_t *txt = NULL;
    const float *rows = sd_draft_moa_test_states(d, &n_ok, &txt);
    if (!rows) return;
    const int E = m->hp.n_embd, n = np + out->n;
    int32_t text[128], layer[8];
    memcpy(text, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(text + np, out->tok, sizeof(int32_t) * (size_t)out->n);
    CHECK(sd_drafter_hidden_layers(d, layer) == 1, "%s: the drafter asks for one state", what);
    // (the last accepted path may run past the output's end: the generation stops at n_predict)
    const int nc = SD_MIN(n_ok, n);
    CHECK(n_ok >= n - 6 && !memcmp(txt, text, sizeof(int32_t) * (size_t)nc),
          "%s: the drafter kept states of %d positions of another text (the text has %d)", what, n_ok, n);
    sd_session *s = sc_new_session(m, 128, 2, g_err, sizeof g_err);
    float *ref = malloc(sizeof(float) * (size_t)n * (size_t)E);
    int ok = s && ref;
    for (int p = 0; ok && p < n; p += 64) {   // (the session's batch: 64)
        sd_batch b = {.n = SD_MIN(64, n - p), .tokens = text + p, .hidden_layers = layer, .n_hidden_layers = 1,
                      .hidden_out = ref + (size_t)p * E};
        ok = sd_session_forward(s, &b, g_err, sizeof g_err) == 0 && sd_session_commit(s, NULL, 0, g_err, sizeof g_err) == 0;
    }
    double worst = 0, scale = 0;
    if (ok) {
        for (size_t i = 0; i < (size_t)nc * (size_t)E; i++) {
            worst = fmax(worst, fabs(rows[i] - ref[i]));
            scale = fmax(scale, fabs(ref[i]));
        }
        CHECK(worst <= 0.05 * scale, "%s: the kept states differ from the target's: %.3g of %.3g", what, worst, scale);
    } else CHECK(0, "%s: reference forward: %s", what, g_err);
    free(ref);
    sd_session_free(s);
}

// Greedy output of m with d against plain decoding; returns tau (or -1).
static double greedy_check(const sd_model *m, sd_drafter *d, const char *what) {
    sd_session *s = sc_new_session(m, 128, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(NV, 0.0f, 1.0f, g_err, sizeof g_err);
    static const int32_t prompt[8] = {5, 99, 14, 200, 31, 77, 150, 9};
    static sc_tokens a, b;
    sd_gen_stats st;
    double tau = -1;
    if (!s || !smp || !d) goto out;
    CHECK(sc_run_plain(s, smp, prompt, 8, 64, &a, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    // twice: the second run starts from a reset drafter
    for (int rep = 0; rep < 2; rep++) {
        CHECK(sc_run_spec(s, smp, d, prompt, 8, 64, 16, &b, &st, g_err, sizeof g_err) == 0, "%s: %s", what, g_err);
        CHECK(sc_same_tokens(&a, &b), "%s: output differs from plain greedy decoding", what);
    }
    tau = st.mean_accepted;
    printf("  %-28s greedy: tau %.2f, %d of %d drafts accepted\n", what, tau, st.n_draft_accepted, st.n_draft_nodes);
    states_check(m, d, prompt, 8, &a, what);
    CHECK(st.n_draft_nodes >= 32 && !strstr(sd_drafter_note(d), "without"), "%s: it drafted %d nodes (%s)", what,
          st.n_draft_nodes, sd_drafter_note(d));
out:
    sd_sampler_free(smp);
    sd_session_free(s);
    return tau;
}

static void test_moa_greedy_lossless(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    // ca-hidden: CA also reads the target's states, which the generation hands in (prompt, accepted paths)
    // (ca_hidden 3: SA's input also adds the last verified position's state, sa_hidden; 4: SA sees the whole
    // text, sa_full)
    static const struct { int tli, no_lsa, ca_hidden; } cfg[9] = {{0, 0, 0}, {1, 0, 0}, {1, 1, 0}, {0, 1, 1}, {1, 1, 1},
                                                                  {0, 1, 3}, {0, 0, 4}, {1, 1, 4}, {0, 1, 5}};
    const char *shapes[3] = {"chain", "widths", "dyn"};
    for (int c = 0; c < 9; c++) {
        sd_head *h = new_moa_h(g_m, cfg[c].tli, cfg[c].no_lsa, cfg[c].ca_hidden, 0, 7 + (uint64_t)c);
        CHECK(h != NULL, "%s", g_err);
        for (int k = 0; h && k < 3; k++) {
            char what[64];
            const int ch = cfg[c].ca_hidden & 3;
            snprintf(what, sizeof what, "TLI %d%s%s%s %s", cfg[c].tli, cfg[c].no_lsa ? " no-LSA" : "",
                     ch == 3 ? " ca+sa-hidden" : ch ? " ca-hidden" : "", cfg[c].ca_hidden & 4 ? " sa-full" : "",
                     shapes[k]);
            sd_drafter *d = new_drafter(h, g_m, shapes[k], 4);
            CHECK(d != NULL, "%s: %s", what, g_err);
            CHECK(greedy_check(g_m, d, what) >= 1.0, "%s: no run", what);
            sd_drafter_free(d);
        }
        sd_head_free(h);
    }
}

// A step without a propose (a scheduler's step limit of 1: nothing drafted)
// still hands the drafter its accepted row: the drafter keeps following the
// text and drafts again on the next steps (a ca_hidden drafter that lost its
// place stops drafting: "without the target's states").
static void test_moa_ca_hidden_step_limit(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_head *h = new_moa_h(g_m, 0, 1, 1, 0, 21);
    sd_drafter *d = h ? new_drafter(h, g_m, "chain", 3) : NULL;
    sd_session *s = sc_new_session(g_m, 128, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(NV, 0.0f, 1.0f, g_err, sizeof g_err);
    static const int32_t prompt[8] = {5, 99, 14, 200, 31, 77, 150, 9};
    static sc_tokens a, b;
    sd_gen *g = NULL;
    sd_gen_stats st;
    if (!d || !s || !smp) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    CHECK(sc_run_plain(s, smp, prompt, 8, 48, &a, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_session_truncate(s, 0, NULL, 0);
    sd_drafter_reset(d);
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = 48, gp.n_batch = 64, gp.max_nodes = 4;
    if (sd_gen_new(&g, s, smp, d, &gp, g_err, sizeof g_err) < 0 || sd_gen_prefill(g, prompt, 8, g_err, sizeof g_err) < 0) {
        CHECK(0, "generation: %s", g_err);
        goto out;
    }
    int drafted_late = 0;
    b.n = 0;
    for (int i = 0; i < 200 && sd_gen_finished(g) == SD_FINISH_NONE; i++) {
        sd_gen_set_step_limit(g, i % 3 == 1 ? 1 : 0);   // every third step drafts nothing
        sd_step stp;
        if (sd_gen_step(g, &stp, g_err, sizeof g_err) < 0) {
            CHECK(0, "step %d: %s", i, g_err);
            goto out;
        }
        for (int k = 0; k < stp.n_tokens && b.n < SC_MAXTOK; k++) b.tok[b.n++] = stp.tokens[k];
        if (i >= 6 && i % 3 != 1) drafted_late += stp.n_drafted;
    }
    CHECK(sc_same_tokens(&a, &b), "output differs from plain greedy decoding (%d tokens vs %d; %d %d vs %d %d)", b.n, a.n, b.tok[0], b.tok[1], a.tok[0], a.tok[1]);
    CHECK(drafted_late > 0 && !strstr(sd_drafter_note(d), "without"),
          "after steps without a propose the drafter stopped drafting (%d drafted late; %s)", drafted_late,
          sd_drafter_note(d));
    printf("  every third step undrafted: %d nodes drafted after the first steps; %s\n", drafted_late,
           sd_drafter_note(d));
    states_check(g_m, d, prompt, 8, &b, "step limit 1");
out:
    sd_gen_free(g);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_drafter_free(d);
    sd_head_free(h);
}

// SA = CA = identity, TLI = every layer: the drafter computes the target's
// own next-token choice (up to the fp16 cache), so greedy chains are accepted.
static void test_moa_exact_drafter_is_accepted(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    const sd_model *ms[2] = {g_m, g_q};
    const char *names[2] = {"llama", "qwen2 (biases, NEOX RoPE)"};
    for (int i = 0; i < 2; i++) {
        sd_head *h = new_moa(ms[i], ms[i]->hp.n_layer, 0, 1, 3);
        CHECK(h != NULL, "%s", g_err);
        sd_drafter *d = h ? new_drafter(h, ms[i], "chain", 4) : NULL;
        char what[64];
        snprintf(what, sizeof what, "exact drafter, %s", names[i]);
        double tau = greedy_check(ms[i], d, what);
        CHECK(tau > 4.0, "%s: the target's own layers as the drafter should be accepted: tau %.2f", names[i], tau);
        sd_drafter_free(d);
        sd_head_free(h);
    }
}

// The chi-square of test_head_lossless.c on the MoA drafter.
static const int32_t k_prompt[6] = {12, 250, 7, 88, 140, 33};
static double chi2_of(sd_drafter *d, int n_run, double *tau) {
    sd_session *s = sc_new_session(g_m, 64, 2, g_err, sizeof g_err), *ref = sc_new_session(g_m, 64, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_topk4_sampler(NV, g_err, sizeof g_err);
    if (smp) {
        sd_sampler_params sp = *sd_sampler_get_params(smp);
        sp.draw = SD_DRAW_REJECTION;
        sd_sampler_free(smp);
        smp = NULL;
        sd_sampler_new(&smp, &sp, NV, g_err, sizeof g_err);
    }
    double chi = -1;
    if (!s || !ref || !smp || !d) goto out;
    static sc_seq3 e;
    sc_fwd_probs fp = {ref, smp, g_err, sizeof g_err};
    if (sc_seq3_enumerate(&e, sc_fwd_probs_fn, &fp, k_prompt, 6, NV) < 0 || e.n_seq != 64) goto out;
    static double cnt[64];
    memset(cnt, 0, sizeof cnt);
    int n_other = 0;
    double fwd = 0;
    sd_sampler_reseed(smp, 77);
    static sc_tokens o;
    for (int r = 0; r < n_run; r++) {
        sd_gen_stats st;
        if (sc_run_spec(s, smp, d, k_prompt, 6, 3, 16, &o, &st, g_err, sizeof g_err) < 0 || o.n != 3) goto out;
        fwd += st.mean_accepted;
        sc_seq3_tally(&e, o.tok, cnt, &n_other);
    }
    chi = n_other ? 1e9 : sc_seq3_chi2(&e, cnt, n_run);
    *tau = fwd / n_run;
out:
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_session_free(ref);
    return chi;
}

static void test_moa_sampled_distribution(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_head *hx = new_moa(g_m, g_m->hp.n_layer, 0, 1, 3), *hr = new_moa(g_m, 1, 0, 0, 11);
    CHECK(hx && hr, "%s", g_err);
    if (!hx || !hr) goto out;
    const char *shapes[2] = {"chain", "widths"};
    for (int i = 0; i < 2; i++) {
        sd_drafter *d = new_drafter(hx, g_m, shapes[i], 3);
        double tau = 0, chi = chi2_of(d, 2000, &tau);
        printf("  exact drafter %-6s sampled: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward\n", shapes[i],
               chi, tau);
        CHECK(chi >= 0 && chi < 125.0, "%s: sampled output is not distributed as the target (chi2 %.1f): %s",
              shapes[i], chi, g_err);
        CHECK(tau > 1.3, "%s: the test needs accepted drafts to mean something (tau %.2f)", shapes[i], tau);
        sd_drafter_free(d);
    }
    sd_drafter *d = new_drafter(hr, g_m, "chain", 3);
    double tau = 0, chi = chi2_of(d, 2000, &tau);
    printf("  random TLI 1 chain sampled: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward\n", chi, tau);
    CHECK(chi >= 0 && chi < 125.0, "random drafter: sampled output is not distributed as the target (chi2 %.1f): %s",
          chi, g_err);
    sd_drafter_free(d);
    // The wrong variant: the same drafts, their distributions misreported.
    d = new_drafter(hx, g_m, "chain", 3);
    if (d) sd_draft_moa_test_fault(d, 1);
    chi = chi2_of(d, 2000, &tau);
    printf("  exact drafter chain, misreported q: chi2 = %.1f (must exceed 125)\n", chi);
    CHECK(chi > 125.0, "the distribution test did not catch misreported draft distributions (chi2 %.1f)", chi);
    sd_drafter_free(d);
out:
    sd_head_free(hx);
    sd_head_free(hr);
}

// Save, load back (same parameters), find with --head auto, refuse another target.
static void test_moa_file(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "/tmp/specdec_test_moa_%d", (int)getpid());
    snprintf(path, sizeof path, "%s/moa.gguf", dir);
    CHECK(mkdir(dir, 0700) == 0, "cannot make %s", dir);
    for (int no_lsa = 0; no_lsa < 2; no_lsa++) {
        sd_head *h = new_moa(g_m, 1, no_lsa, 0, 5), *b = NULL;
        CHECK(h && sd_head_save(h, path, SD_TYPE_F32, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_head_load(&b, path, g_m, g_err, sizeof g_err) == 0, "%s", g_err);
        if (h && b) {
            CHECK(b->hp.type == SD_HEAD_MOA && b->hp.moa_tli == 1 && b->hp.moa_no_lsa == no_lsa &&
                      b->hp.moa_kv_width == h->hp.moa_kv_width && b->hp.moa_lsa_n_head == h->hp.moa_lsa_n_head &&
                      b->n_t == h->n_t && b->n_w == h->n_w,
                  "the loaded drafter's shape differs");
            CHECK(b->n_w == h->n_w && !memcmp(b->w, h->w, sizeof(float) * h->n_w), "the loaded parameters differ");
            CHECK(!strcmp(sd_head_type_name(b), "moa") && sd_head_get_type(b) == SD_HEAD_MOA, "type %s",
                  sd_head_type_name(b));
        }
        char found[512];
        CHECK(sd_head_find(g_m, dir, found, sizeof found, g_err, sizeof g_err) == 1 && !strcmp(found, path),
              "--head auto did not find the MoA drafter");
        CHECK(sd_head_find_type(g_m, dir, SD_HEAD_MOA, found, sizeof found, g_err, sizeof g_err) == 1 &&
                  !strcmp(found, path) &&
                  sd_head_find_type(g_m, dir, SD_HEAD_EAGLE3, found, sizeof found, g_err, sizeof g_err) == 0,
              "looked for by kind: the MoA drafter is one, not an EAGLE-3 head");
        // another target: three layers (its K,V rows have another count), or qwen2's vocabulary fingerprint
        sd_model *m3 = synth("llama", 3, "l3");
        sd_head *c = NULL;
        CHECK(m3 && sd_head_load(&c, path, m3, g_err, sizeof g_err) < 0 && strstr(g_err, "MoA drafter") &&
                  strstr(g_err, "layers"),
              "a drafter for 2 layers loaded for a 3-layer target: %s", g_err);
        printf("  refused for another target: %s\n", g_err);
        sd_head_free(c);
        sd_model_free(m3);
        sd_head_free(h);
        sd_head_free(b);
    }
    // ca_hidden: the key and the tensor round-trip; the drafter asks for the state CA reads; the split takes it
    for (int tli = 0; tli < 2; tli++) {
        sd_head *h = new_moa_h(g_m, tli, 1, tli ? 3 : 1, 0, 6), *b = NULL;   // TLI 1: sa_hidden too
        CHECK(h && sd_head_save(h, path, SD_TYPE_F32, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_head_load(&b, path, g_m, g_err, sizeof g_err) == 0, "%s", g_err);
        if (h && b) {
            CHECK(b->hp.moa_ca_hidden == 1 && b->hp.moa_sa_hidden == tli && b->n_t == h->n_t && b->n_w == h->n_w &&
                      !strcmp(b->t[sd_moa_hidden_t(&b->hp)].name, "ca.hidden.weight") &&
                      (!tli || !strcmp(b->t[sd_moa_sa_hidden_t(&b->hp)].name, "sa.hidden.weight")) &&
                      !memcmp(b->w, h->w, sizeof(float) * h->n_w),
                  "TLI %d: the ca_hidden drafter did not round-trip", tli);
            sd_drafter *d = new_drafter(b, g_m, "chain", 3);
            int32_t layers[8] = {0};
            const int nl = d ? sd_drafter_hidden_layers(d, layers) : -1;
            const int want = tli ? g_m->hp.n_layer - 2 : SD_HIDDEN_NORM;
            CHECK(nl == 1 && layers[0] == want, "TLI %d: the drafter asks for %d states (%d), expected layer %d", tli,
                  nl, layers[0], want);
            CHECK(d && sd_drafter_remote(d, g_err, sizeof g_err) == 0,   // the split sends the states too
                  "the split refused a ca_hidden drafter: %s", g_err);
            sd_drafter_free(d);
        }
        sd_head_free(h);
        sd_head_free(b);
    }
    {   // sa_full: the key round-trips (no tensor of its own), the fingerprint tells it apart, the description says it
        sd_head *h = new_moa_h(g_m, 1, 1, 4, 0, 8), *b = NULL;
        CHECK(h && sd_head_save(h, path, SD_TYPE_F32, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_head_load(&b, path, g_m, g_err, sizeof g_err) == 0, "%s", g_err);
        if (h && b) {
            char desc[256];
            sd_head_describe(b, desc, sizeof desc);
            const uint64_t f1 = sd_head_fingerprint(b);
            b->hp.moa_sa_full = 0;
            const uint64_t f0 = sd_head_fingerprint(b);
            b->hp.moa_sa_full = 1;
            CHECK(b->n_t == h->n_t && b->n_w == h->n_w && !memcmp(b->w, h->w, sizeof(float) * h->n_w) && f0 != f1 &&
                      strstr(desc, "full-text SA"),
                  "the sa_full drafter did not round-trip (fingerprints %llx %llx; %s)", (unsigned long long)f0,
                  (unsigned long long)f1, desc);
            printf("  sa_full: %s\n", desc);
        }
        sd_head_free(h);
        sd_head_free(b);
    }
    // a no-LSA file with an LSA tensor table of the other kind: the keys say one thing, the tensors another
    sd_head *h = new_moa(g_m, 0, 0, 0, 5), *b = NULL;
    if (h) {
        h->hp.moa_no_lsa = 1;   // keys say no LSA; the table still holds the LSA layer's tensors
        CHECK(sd_head_save(h, path, SD_TYPE_F32, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_head_load(&b, path, g_m, g_err, sizeof g_err) < 0 && strstr(g_err, "not part of an MoA drafter"),
              "a file whose tensors do not match its keys loaded: %s", g_err);
        printf("  refused: %s\n", g_err);
        sd_head_free(b);
        sd_head_free(h);
    }
    unlink(path);
    rmdir(dir);
}

// Full-text SA's verified rows in the runner: a context of 40 positions cut
// to 25 and followed by 15 others gives the logits of a fresh runner told the
// 25 and the 15, bit for bit (F32); without the tokens the context call is
// refused; the same weights with the bit cleared give other logits.
static void test_moa_sa_full_runner(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_head *h = new_moa_h(g_m, 1, 1, 4, 0, 31);
    const int L = g_m->hp.n_layer, ekv = h ? h->hp.moa_kv_width : 0, V = NV;
    float *kv = malloc(sizeof(float) * 80 * (size_t)L * (size_t)ekv), *lg[3];
    int32_t tok[80];
    sd_rng rng;
    sd_rng_seed(&rng, 3);
    for (int i = 0; i < 3; i++) lg[i] = malloc(sizeof(float) * 2 * V);
    sd_moa_run *r[3] = {NULL, NULL, NULL};
    if (!h || !kv || !lg[0] || !lg[1] || !lg[2]) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    for (size_t i = 0; i < 80 * (size_t)L * (size_t)ekv; i++) kv[i] = (float)(2 * sd_rng_uniform(&rng) - 1);
    for (int i = 0; i < 80; i++) tok[i] = (int32_t)(sd_rng_next(&rng) % NV);
    const size_t row = (size_t)L * ekv;
    // runner 0: positions 0..39 (tokens 0..39), cut to 25, then 15 others (tokens and rows 40..54)
    // runner 1: fresh, told 0..24 and then 40..54; runner 2: the bit cleared, the same as runner 1
    for (int k = 0; k < 3; k++) {
        h->hp.moa_sa_full = k < 2;
        if (sd_moa_run_new(&r[k], h, g_m, 128, 64, SD_TYPE_F32, 0, NULL, g_err, sizeof g_err) < 0) {
            CHECK(0, "runner: %s", g_err);
            goto out;
        }
    }
    h->hp.moa_sa_full = 1;
    int rc = sd_moa_run_context(r[0], kv, NULL, NULL, 4, g_err, sizeof g_err);
    CHECK(rc < 0 && strstr(g_err, "tokens"), "context without tokens: %d (%s)", rc, g_err);
    rc = sd_moa_run_context(r[0], kv, NULL, tok, 40, g_err, sizeof g_err);
    sd_moa_run_truncate(r[0], 25);
    rc |= sd_moa_run_context(r[0], kv + 40 * row, NULL, tok + 40, 15, g_err, sizeof g_err);
    for (int k = 1; k < 3; k++) {
        rc |= sd_moa_run_context(r[k], kv, NULL, tok, 25, g_err, sizeof g_err);
        rc |= sd_moa_run_context(r[k], kv + 40 * row, NULL, tok + 40, 15, g_err, sizeof g_err);
    }
    CHECK(rc == 0, "context: %s", g_err);
    const int32_t dt[2] = {tok[60], tok[61]}, pos[2] = {40, 41}, par[2] = {-1, 0};
    for (int k = 0; k < 3; k++) rc |= sd_moa_run_eval(r[k], dt, pos, par, 2, lg[k], NULL, g_err, sizeof g_err);
    CHECK(rc == 0, "eval: %s", g_err);
    CHECK(!memcmp(lg[0], lg[1], sizeof(float) * 2 * V), "a cut and refilled context drafts other logits");
    double diff = 0;
    for (int i = 0; i < 2 * V; i++) diff = fmax(diff, fabs(lg[1][i] - lg[2][i]));
    printf("  sa_full: cut and refilled = fresh, bit for bit; max |logit difference| with the bit cleared %.3g\n",
           diff);
    CHECK(diff > 1e-3, "the bit cleared gives the same logits (%.3g)", diff);
out:
    for (int i = 0; i < 3; i++) sd_moa_run_free(r[i]), free(lg[i]);
    free(kv);
    sd_head_free(h);
}

// Runners of one head share its parameters (made by the first that asks,
// freed with the head): they compute what a runner with parameters of its
// own computes, bit for bit, also after the first runner is freed; a
// runner of another type makes its own.
static void test_moa_shared_parameters(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_head *h = new_moa(g_m, 1, 0, 0, 41);
    const int L = g_m->hp.n_layer, ekv = h ? h->hp.moa_kv_width : 0, V = NV;
    enum { NR = 4, NT = 20 };
    const int types[NR] = {SD_TYPE_F32, SD_TYPE_F32, SD_TYPE_F32, SD_TYPE_Q8_0};
    const int share[NR] = {1, 1, 0, 1};
    sd_moa_run *r[NR] = {NULL};
    float *kv = malloc(sizeof(float) * NT * (size_t)L * (size_t)ekv), *lg[NR + 1] = {NULL};
    int32_t tok[NT];
    sd_rng rng;
    sd_rng_seed(&rng, 9);
    int ok = h && kv;
    for (int i = 0; ok && i <= NR; i++) ok = (lg[i] = malloc(sizeof(float) * 2 * V)) != NULL;
    for (size_t i = 0; ok && i < NT * (size_t)L * (size_t)ekv; i++) kv[i] = (float)(2 * sd_rng_uniform(&rng) - 1);
    for (int i = 0; i < NT; i++) tok[i] = (int32_t)(sd_rng_next(&rng) % NV);
    for (int k = 0; ok && k < NR; k++) {
        ok = sd_moa_run_new(&r[k], h, g_m, 64, 64, types[k], share[k], NULL, g_err, sizeof g_err) == 0;
        if (k == 0) CHECK(!ok || h->moa_shared, "the first sharing runner made no shared parameters");
    }
    const int32_t dt[2] = {tok[3], tok[4]}, pos[2] = {NT, NT + 1}, par[2] = {-1, 0};
    for (int k = 0; ok && k < NR; k++)
        ok = sd_moa_run_context(r[k], kv, NULL, tok, NT, g_err, sizeof g_err) == 0 &&
             sd_moa_run_eval(r[k], dt, pos, par, 2, lg[k], NULL, g_err, sizeof g_err) == 0;
    CHECK(ok, "%s", g_err);
    if (ok) {
        CHECK(!memcmp(lg[0], lg[2], sizeof(float) * 2 * V) && !memcmp(lg[1], lg[2], sizeof(float) * 2 * V),
              "runners with shared parameters draft other logits than one with its own");
        double diff = 0;
        for (int i = 0; i < 2 * V; i++) diff = fmax(diff, fabs(lg[3][i] - lg[2][i]));
        CHECK(diff > 0 && diff < 0.5, "the Q8_0 runner: max |logit difference| %.3g (its own parameters)", diff);
        sd_moa_run_free(r[0]);
        r[0] = NULL;
        sd_moa_run_drop_pending(r[1]);
        ok = sd_moa_run_eval(r[1], dt, pos, par, 2, lg[NR], NULL, g_err, sizeof g_err) == 0;
        CHECK(ok && !memcmp(lg[NR], lg[2], sizeof(float) * 2 * V), "after the first runner is freed: %s", g_err);
    }
    for (int k = 0; k < NR; k++) sd_moa_run_free(r[k]);
    for (int i = 0; i <= NR; i++) free(lg[i]);
    free(kv);
    sd_head_free(h);
}

int main(void) {
    T_RUN(test_moa_file);
    T_RUN(test_moa_greedy_lossless);
    T_RUN(test_moa_sa_full_runner);
    T_RUN(test_moa_shared_parameters);
    T_RUN(test_moa_exact_drafter_is_accepted);
    T_RUN(test_moa_ca_hidden_step_limit);
    T_RUN(test_moa_sampled_distribution);
    sd_model_free(g_m);
    sd_model_free(g_q);
    T_EXIT();
}

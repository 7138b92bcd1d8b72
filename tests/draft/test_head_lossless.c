// test_head_lossless.c - trained heads as drafters, end to end: an EAGLE-3 head
// and a Medusa head trained for a moment (src/train/) on a synthetic target's
// own text get their drafts accepted (training and inference compute the
// same function), greedy output stays plain decoding's, and sampled output
// with the EAGLE-3 head is distributed as the target's (chi-square over the
// 64 possible 3-token continuations; alone, as prompt lookup's fallback and
// merged with it), while a deliberately wrong variant
// (draft distributions misreported after the draws) is rejected by the same
// test.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft_eagle3.h"
#include "draft/draft_merge.h"
#include "draft/draft_ngram.h"
#include "draft/draft_medusa.h"
#include "head/head.h"
#include "kernels/quant.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"
#include "train/train.h"

#define NV 320
#define TOPK 8
#define SEQ_T 48
#define N_SEQ 48

static char g_err[512];
static sd_model *g_m;
static sd_head *g_e3, *g_md;

// Training data: N_SEQ texts the target samples itself, with its states and
// its next-token distributions.
typedef struct data {
    int32_t tok[N_SEQ][SEQ_T];
    float *feat_e3;   // (N_SEQ, SEQ_T, 3d)
    float *feat_md;   // (N_SEQ, SEQ_T, d)
    int32_t ids[N_SEQ][SEQ_T][TOPK];
    float pr[N_SEQ][SEQ_T][TOPK];
} data;

static int make_data(data *D, const sd_head_hp *hp) {
    const int d = g_m->hp.n_embd;
    D->feat_e3 = malloc(sizeof(float) * N_SEQ * SEQ_T * 3 * (size_t)d);
    D->feat_md = malloc(sizeof(float) * N_SEQ * SEQ_T * (size_t)d);
    sd_session *s = sc_new_session(g_m, 128, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(NV, 0.7f, 1.3f, g_err, sizeof g_err);
    sd_sampler *gsm = sc_new_sampler(NV, 0.0f, 1.0f, g_err, sizeof g_err);
    if (!s || !smp || !gsm || !D->feat_e3 || !D->feat_md) return -1;
    float *hid = malloc(sizeof(float) * SEQ_T * 4 * (size_t)d);
    float *pb = malloc(sizeof(float) * NV);
    int32_t layers[4] = {hp->extract[0], hp->extract[1], hp->extract[2], SD_HIDDEN_NORM};
    int rc = 0;
    // Texts the tests run on: their prompts, continued by the target's own samples.
    static const int32_t prompts[2][8] = {{12, 250, 7, 88, 140, 33, 0, 0}, {5, 99, 14, 200, 31, 77, 150, 9}};
    static const int plen[2] = {6, 8};
    for (int q = 0; q < N_SEQ && rc == 0; q++) {
        sd_sampler_reseed(smp, 100 + (uint64_t)q);
        int w = q % 2, L = plen[w];
        memcpy(D->tok[q], prompts[w], sizeof(int32_t) * (size_t)L);
        sd_session_truncate(s, 0, NULL, 0);
        for (int t = 0; t < SEQ_T - 1 && rc == 0; t++) {
            sd_batch b = {.n = 1, .tokens = &D->tok[q][t]};
            rc = sd_session_forward(s, &b, g_err, sizeof g_err);
            if (rc == 0) rc = sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
            if (rc == 0 && t >= L - 1)   // every fourth text greedy (what the greedy test generates), the others sampled
                D->tok[q][t + 1] = q % 4 == 3 ? sd_sampler_sample(gsm, sd_session_logits(s, 0), NULL, 0)
                                              : sd_sampler_sample(smp, sd_session_logits(s, 0), D->tok[q], t + 1);
        }
        if (rc) break;
        // states and distributions of the whole text in one forward
        sd_session_truncate(s, 0, NULL, 0);
        sd_batch b = {.n = SEQ_T, .tokens = D->tok[q], .hidden_layers = layers, .n_hidden_layers = 4,
                      .hidden_out = hid};
        rc = sd_session_forward(s, &b, g_err, sizeof g_err);
        for (int t = 0; t < SEQ_T && rc == 0; t++) {
            const float *h = hid + (size_t)t * 4 * d;
            memcpy(D->feat_e3 + ((size_t)q * SEQ_T + t) * 3 * d, h, sizeof(float) * 3 * (size_t)d);
            memcpy(D->feat_md + ((size_t)q * SEQ_T + t) * d, h + 3 * d, sizeof(float) * (size_t)d);
            const float *lg = sd_session_logits(s, t);
            float mx = lg[0];
            for (int v = 1; v < NV; v++) mx = lg[v] > mx ? lg[v] : mx;
            double sum = 0;
            for (int v = 0; v < NV; v++) sum += pb[v] = expf(lg[v] - mx);
            // top-k by selection
            double kept = 0;
            for (int k = 0; k < TOPK; k++) {
                int best = -1;
                for (int v = 0; v < NV; v++) {
                    int used = 0;
                    for (int j = 0; j < k; j++) used |= D->ids[q][t][j] == v;
                    if (!used && (best < 0 || pb[v] > pb[best])) best = v;
                }
                D->ids[q][t][k] = best;
                D->pr[q][t][k] = (float)(pb[best] / sum);
                kept += pb[best] / sum;
            }
            for (int k = 0; k < TOPK; k++) D->pr[q][t][k] = (float)(D->pr[q][t][k] / kept);
        }
    }
    free(hid);
    free(pb);
    sd_sampler_free(smp);
    sd_sampler_free(gsm);
    sd_session_free(s);
    return rc;
}

// Trains h for `steps` AdamW steps over the data (bars: measured 0.46 and
// 0.44 agreement, greedy tau 2.1 and 2.25); returns the mean top-1
// agreement of the first step (or head) on the last 8 sequences (held out).
static double train(sd_head *h, const data *D, int steps, float lr) {
    sd_trainer *tr = NULL;
    if (sd_trainer_new(&tr, h, g_m, SEQ_T, 3, NULL, g_err, sizeof g_err) < 0) return -1;
    sd_adamw o = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .warmup = 10, .total = steps};
    if (sd_adamw_init(&o, h->n_w, g_err, sizeof g_err) < 0) return -1;
    float *grad = calloc(h->n_w, sizeof(float));
    const int d = h->hp.n_embd, nf = h->hp.type == SD_HEAD_EAGLE3 ? 3 * d : d;
    const float *feat = h->hp.type == SD_HEAD_EAGLE3 ? D->feat_e3 : D->feat_md;
    for (int it = 0; it < steps; it++) {
        memset(grad, 0, sizeof(float) * h->n_w);
        for (int b = 0; b < 4; b++) {
            int q = (it * 4 + b) % (N_SEQ - 8);
            sd_train_seq seq = {SEQ_T, D->tok[q], feat + (size_t)q * SEQ_T * nf, &D->ids[q][0][0], &D->pr[q][0][0], TOPK, 0, NULL};
            if (sd_trainer_loss(tr, &seq, grad, NULL, g_err, sizeof g_err) < 0) return -1;
        }
        for (size_t i = 0; i < h->n_w; i++) grad[i] *= 0.25f;
        sd_adamw_step(&o, h, grad);
    }
    sd_train_stats st;
    memset(&st, 0, sizeof st);
    for (int q = N_SEQ - 8; q < N_SEQ; q++) {
        sd_train_seq seq = {SEQ_T, D->tok[q], feat + (size_t)q * SEQ_T * nf, &D->ids[q][0][0], &D->pr[q][0][0], TOPK, 0, NULL};
        sd_train_stats s1;
        if (sd_trainer_loss(tr, &seq, NULL, &s1, g_err, sizeof g_err) < 0) return -1;
        st.n[0] += s1.n[0], st.agree[0] += s1.agree[0];
    }
    free(grad);
    sd_adamw_free(&o);
    sd_trainer_free(tr);
    return st.n[0] ? (double)st.agree[0] / (double)st.n[0] : 0.0;
}

static int setup(void) {
    if (g_m) return g_e3 && g_md;
    synth_params p = synth_default_params();
    p.n_layer = 2;
    p.n_vocab = NV;
    g_m = sc_synth_model(&p, "head_spec", "t", g_err, sizeof g_err);
    if (!g_m) return 0;
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = NV;   // the whole vocabulary: the chi-square sees every candidate
    sd_head_hp hm = sd_head_default_hp(g_m, SD_HEAD_MEDUSA);
    hm.n_draft_vocab = NV;
    hm.n_medusa = 3;
    static data D;
    if (make_data(&D, &hp) < 0) return 0;
    if (sd_head_new(&g_e3, &hp, g_err, sizeof g_err) < 0 || sd_head_new(&g_md, &hm, g_err, sizeof g_err) < 0) return 0;
    sd_head_init(g_e3, 1);
    sd_head_init(g_md, 2);
    double a0 = train(g_e3, &D, 0, 1e-3f);
    double t0 = sd_time_ms();
    double a1 = train(g_e3, &D, 400, 1e-2f);
    double a2 = train(g_md, &D, 400, 1e-2f);
    printf("  EAGLE-3 head: held-out agreement %.2f before, %.2f after 400 steps; Medusa head 0: %.2f (%.1f s)\n",
           a0, a1, a2, (sd_time_ms() - t0) / 1000.0);
    free(D.feat_e3);
    free(D.feat_md);
    if (a1 < 0 || a2 < 0) return 0;
    CHECK(a1 > 0.3, "the trained EAGLE-3 head agrees with the target on only %.2f of held-out positions", a1);
    return 1;
}

static sd_drafter *new_e3(const char *shape_kind, int k) {
    sd_draft_model_params dp = sd_draft_model_default_params();
    if (!strcmp(shape_kind, "chain")) dp.shape = SD_DRAFT_CHAIN, dp.k = k;
    else dp.shape = SD_DRAFT_WIDTHS, dp.n_widths = 3, dp.widths[0] = 3, dp.widths[1] = 2, dp.widths[2] = 1;
    dp.n_ctx = 128;
    sd_drafter *d = NULL;
    if (sd_draft_eagle3_new(&d, g_e3, g_m, &dp, SD_TYPE_F32, NULL, NULL, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

// Greedy: drafts are accepted and the output is plain decoding's.
static void test_trained_heads_greedy(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    sd_session *s = sc_new_session(g_m, 128, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(NV, 0.0f, 1.0f, g_err, sizeof g_err);
    int32_t prompt[8] = {5, 99, 14, 200, 31, 77, 150, 9};
    static sc_tokens a, b;
    sd_gen_stats st;
    CHECK(sc_run_plain(s, smp, prompt, 8, 64, &a, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_drafter *d = new_e3("chain", 4);
    CHECK(d && sc_run_spec(s, smp, d, prompt, 8, 64, 16, &b, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sc_same_tokens(&a, &b), "EAGLE-3 chain: output differs from plain greedy");
    printf("  EAGLE-3 chain:4 greedy: tau %.2f, accepted %d of %d drafts; %s\n", st.mean_accepted, st.n_draft_accepted,
           st.n_draft_nodes, d ? sd_drafter_note(d) : "");
    CHECK(st.mean_accepted > 1.5, "a trained EAGLE-3 head should get drafts accepted: tau %.2f", st.mean_accepted);
    sd_drafter_free(d);
    int w[3] = {2, 2, 1};
    d = NULL;
    CHECK(sd_draft_medusa_new(&d, g_md, g_m, w, 3, 0.0f, NULL, SD_TYPE_F32, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(d && sc_run_spec(s, smp, d, prompt, 8, 64, 16, &b, &st, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(sc_same_tokens(&a, &b), "Medusa: output differs from plain greedy");
    printf("  Medusa 2-2-1 greedy: tau %.2f, accepted %d of %d drafts\n", st.mean_accepted, st.n_draft_accepted,
           st.n_draft_nodes);
    CHECK(st.mean_accepted > 1.2, "a trained Medusa head should get drafts accepted: tau %.2f", st.mean_accepted);
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
}

// The chi-square of test_methods_lossless.c's sampled-distribution test, on the EAGLE-3 drafter.
static const int32_t k_prompt[6] = {12, 250, 7, 88, 140, 33};
// Holds the likeliest first tokens, so that prompt lookup drafts after them
// (the head, trained on texts after k_prompt, hardly gets drafts accepted here).
static const int32_t k_prompt_rep[6] = {12, 90, 7, 172, 140, 33};
static long g_drafted;   // draft nodes of chi2_of's runs
// draw: SD_DRAW_REJECTION tests the drafts' recorded distributions (rejection
// sampling reads them); SD_DRAW_RACE the shared noise.
static double chi2_of(sd_drafter *d, const int32_t *prompt, int n_run, double *tau, int draw) {
    sd_session *s = sc_new_session(g_m, 64, 2, g_err, sizeof g_err), *ref = sc_new_session(g_m, 64, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_topk4_sampler(NV, g_err, sizeof g_err);
    if (smp) {
        sd_sampler_params sp = *sd_sampler_get_params(smp);
        sp.draw = draw;
        sd_sampler_free(smp);
        smp = NULL;
        sd_sampler_new(&smp, &sp, NV, g_err, sizeof g_err);
    }
    double chi = -1;
    if (!s || !ref || !smp) goto out;
    static sc_seq3 e;
    sc_fwd_probs fp = {ref, smp, g_err, sizeof g_err};
    if (sc_seq3_enumerate(&e, sc_fwd_probs_fn, &fp, prompt, 6, NV) < 0 || e.n_seq != 64) goto out;
    static double cnt[64];
    memset(cnt, 0, sizeof cnt);
    int n_other = 0;
    double fwd = 0;
    sd_sampler_reseed(smp, 77);
    static sc_tokens o;
    for (int r = 0; r < n_run; r++) {
        sd_gen_stats st;
        if (sc_run_spec(s, smp, d, prompt, 6, 3, 16, &o, &st, g_err, sizeof g_err) < 0 || o.n != 3) goto out;
        fwd += st.mean_accepted;
        g_drafted += st.n_draft_nodes;
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

// Prompt lookup (1-3) with the trained head drafting chains of 3: the head as
// its fallback ("ngram:1-3/eagle3:chain:3"), or their trees merged ("+").
static sd_drafter *lookup_and_head(int merge) {
    sd_drafter *subs[2] = {NULL, new_e3("chain", 3)}, *d = NULL;
    sd_draft_ngram_params np = sd_draft_ngram_default_params();
    np.n_max = 1, np.k_max = 3;
    if (subs[1] && sd_draft_ngram_new(&subs[0], &np, NULL, g_err, sizeof g_err) == 0)
        (merge ? sd_draft_merge_new : sd_draft_first_new)(&d, subs, 2, NV, g_err, sizeof g_err);
    else
        sd_drafter_free(subs[1]);
    return d;
}

static void test_trained_eagle3_sampled_distribution(void) {
    if (!setup()) SKIP("setup failed: %.200s", g_err);
    const char *kinds[2] = {"chain", "widths"};
    for (int i = 0; i < 2; i++) {
        sd_drafter *d = new_e3(kinds[i], 3);
        double tau = 0, chi = d ? chi2_of(d, k_prompt, 2000, &tau, SD_DRAW_REJECTION) : -1;
        printf("  EAGLE-3 %-6s sampled: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward\n", kinds[i], chi, tau);
        CHECK(chi >= 0 && chi < 125.0, "EAGLE-3 %s: sampled output is not distributed as the target (chi2 %.1f): %s",
              kinds[i], chi, g_err);
        CHECK(tau > 1.3, "EAGLE-3 %s: the test needs accepted drafts to mean something (tau %.2f)", kinds[i], tau);
        sd_drafter_free(d);
    }
    // Prompt lookup first, the head where it finds nothing (method "ngram:1-3/eagle3:chain:3").
    sd_drafter *fb = lookup_and_head(0);
    g_drafted = 0;
    double tau_fb = 0, chi_fb = fb ? chi2_of(fb, k_prompt_rep, 2000, &tau_fb, SD_DRAW_REJECTION) : -1;
    const long fb_drafted = g_drafted;
    sd_drafter *solo = new_e3("chain", 3);   // the head alone drafts 3 nodes a step
    g_drafted = 0;
    double tau_solo = 0, chi_solo = solo ? chi2_of(solo, k_prompt_rep, 2000, &tau_solo, SD_DRAW_REJECTION) : -1;
    sd_drafter_free(solo);
    printf("  ngram:1-3/eagle3:chain:3 sampled: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward, %ld draft "
           "nodes (the head alone: %ld, chi2 %.1f)\n",
           chi_fb, tau_fb, fb_drafted, g_drafted, chi_solo);
    CHECK(chi_fb >= 0 && chi_fb < 125.0, "fallback: sampled output is not distributed as the target (chi2 %.1f): %s",
          chi_fb, g_err);
    CHECK(fb_drafted != g_drafted, "prompt lookup never drafted in the fallback's runs (%ld nodes both)", fb_drafted);
    sd_drafter_free(fb);
    // Prompt lookup's tree and the head's merged (method "ngram:1-3+eagle3:chain:3"): both draft at every step.
    sd_drafter *mg = lookup_and_head(1);
    g_drafted = 0;
    double tau_mg = 0, chi_mg = mg ? chi2_of(mg, k_prompt_rep, 2000, &tau_mg, SD_DRAW_REJECTION) : -1;
    printf("  ngram:1-3+eagle3:chain:3 sampled: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward, %ld draft "
           "nodes\n",
           chi_mg, tau_mg, g_drafted);
    CHECK(chi_mg >= 0 && chi_mg < 125.0, "merge: sampled output is not distributed as the target (chi2 %.1f): %s",
          chi_mg, g_err);
    CHECK(g_drafted > fb_drafted, "the merge drafted no more than the fallback (%ld and %ld nodes)", g_drafted,
          fb_drafted);
    sd_drafter_free(mg);
    // The wrong variant: the same drafts, their distributions misreported.
    sd_drafter *d = new_e3("chain", 3);
    if (d) sd_draft_eagle3_test_fault(d, 1);
    double tau = 0, chi = d ? chi2_of(d, k_prompt, 2000, &tau, SD_DRAW_REJECTION) : -1;
    printf("  EAGLE-3 chain, misreported q: chi2 = %.1f (must exceed 125)\n", chi);
    CHECK(chi > 125.0, "the distribution test did not catch misreported draft distributions (chi2 %.1f)", chi);
    sd_drafter_free(d);
    // The race draw (the default): the trained head drafts under the target's noise.
    d = new_e3("chain", 3);
    tau = 0;
    chi = d ? chi2_of(d, k_prompt, 2000, &tau, SD_DRAW_RACE) : -1;
    printf("  EAGLE-3 chain, race draw: chi2 = %.1f (df 63, limit 125), %.2f tokens per forward\n", chi, tau);
    CHECK(chi >= 0 && chi < 125.0, "race: sampled output is not distributed as the target (chi2 %.1f): %s", chi, g_err);
    CHECK(tau > 1.3, "race: the trained head's drafts are hardly accepted (tau %.2f)", tau);
    sd_drafter_free(d);
}

int main(void) {
    T_RUN(test_trained_heads_greedy);
    T_RUN(test_trained_eagle3_sampled_distribution);
    sd_head_free(g_e3);
    sd_head_free(g_md);
    sd_model_free(g_m);
    T_EXIT();
}

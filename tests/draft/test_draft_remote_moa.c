// test_draft_remote_moa.c - the MoA drafter driven by hand (the split
// client's side, docs/split.md), on a synthetic target: made remote
// (sd_drafter_remote) and told every layer's K,V rows of the verified
// positions (sd_session_kv_read of the target's session, as a split server
// sends them), it proposes the very trees the in-process drafter proposes
// reading the same session (TLI 0 and 1); with unverified text after the
// last told position it still drafts (an SA chain), and once those
// positions are verified and told, its trees are the in-process ones again;
// the rows of uncommitted positions are refused. Told LSA's outputs computed
// elsewhere (sd_moa_lsa_run, the split server's "lsa" states) and the TLI
// layers' rows instead, it proposes the trees it proposes from the K,V rows.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft_moa.h"
#include "draft/drafter.h"
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
static sd_model *g_m;

static sd_drafter *new_drafter_w(const sd_head *h, int remote, int wtype) {
    sd_draft_model_params dp = sd_draft_model_default_params();
    dp.shape = SD_DRAFT_DYNAMIC, dp.dyn_b = 3, dp.dyn_d = 4, dp.dyn_m = 12;
    dp.n_ctx = 128;
    sd_drafter *d = NULL;
    if (sd_draft_moa_new(&d, h, g_m, &dp, wtype, g_err, sizeof g_err) < 0) return NULL;
    if (remote && (remote == 2 ? sd_drafter_remote_lsa(d, g_err, sizeof g_err)
                               : sd_drafter_remote(d, g_err, sizeof g_err)) < 0) {
        sd_drafter_free(d);
        return NULL;
    }
    return d;
}

static sd_drafter *new_drafter(const sd_head *h, int remote) { return new_drafter_w(h, remote, SD_TYPE_F32); }

// The session's committed K,V rows of positions pos0 .. pos0+n-1, (n, L, 2 kvd) floats.
static float *kv_rows(const sd_session *s, int pos0, int n) {
    const sd_hparams *hp = &g_m->hp;
    const int L = hp->n_layer, w = hp->n_head_kv * hp->head_dim;
    float *out = malloc(sizeof(float) * (size_t)n * L * 2 * w), *k = malloc(sizeof(float) * (size_t)n * w),
          *v = malloc(sizeof(float) * (size_t)n * w);
    for (int l = 0; out && k && v && l < L; l++) {
        if (sd_session_kv_read(s, l, pos0, n, k, v, g_err, sizeof g_err) < 0) {
            free(out);
            out = NULL;
            break;
        }
        for (int i = 0; i < n; i++) {
            memcpy(out + ((size_t)i * L + l) * 2 * w, k + (size_t)i * w, sizeof(float) * (size_t)w);
            memcpy(out + ((size_t)i * L + l) * 2 * w + w, v + (size_t)i * w, sizeof(float) * (size_t)w);
        }
    }
    free(k);
    free(v);
    return out;
}

// Evaluates text[n_past .. n) in s and commits it.
static int extend(sd_session *s, const int32_t *text, int n) {
    const int p0 = sd_session_n_past(s), m = n - p0;
    int32_t pos[64];
    for (int i = 0; i < m; i++) pos[i] = p0 + i;
    sd_batch b = {0};
    b.n = m, b.tokens = text + p0, b.pos = pos;
    return sd_session_forward(s, &b, g_err, sizeof g_err) < 0 ? -1 : sd_session_commit(s, NULL, m, g_err, sizeof g_err);
}

static int same_tree(const sd_tree *a, const sd_tree *b) {
    if (sd_tree_size(a) != sd_tree_size(b)) return 0;
    for (int i = 0; i < sd_tree_size(a); i++)
        if (sd_tree_token(a, i) != sd_tree_token(b, i) || sd_tree_parent(a, i) != sd_tree_parent(b, i)) return 0;
    return 1;
}

// The in-process drafter's tree for text (its session s holds text but the root).
static int local_tree(sd_drafter *d, const sd_session *s, const int32_t *text, int n, sd_tree *t) {
    sd_tree_clear(t, text[n - 1]);
    const sd_draft_ctx ctx = {.tokens = text, .n_tokens = n, .max_nodes = 16, .rng = &d->rng, .target = s};
    return d->vt->propose(d, &ctx, t, g_err, sizeof g_err);
}

static void run(int tli, int sa_full) {
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_MOA);
    hp.n_draft_vocab = NV;
    hp.moa_tli = tli;
    hp.moa_sa_full = sa_full;   // SA sees the whole text: the verified positions' rows from their tokens
    sd_head *h = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!h) return;
    sd_head_init(h, 11 + (uint64_t)tli);
    sd_drafter *dl = new_drafter(h, 0), *dr = new_drafter(h, 1);
    sd_session *s = sc_new_session(g_m, 128, 1, g_err, sizeof g_err);
    sd_tree *t1 = NULL, *t2 = NULL;
    sd_tree_new(&t1, 16, NV, g_err, sizeof g_err);
    sd_tree_new(&t2, 16, NV, g_err, sizeof g_err);
    int32_t text[40];
    for (int i = 0; i < 40; i++) text[i] = (int32_t)((i * 37 + 11) % NV);
    CHECK(dl && dr && s && t1 && t2, "%s", g_err);
    if (!dl || !dr || !s || !t1 || !t2) goto out;
    // verified: text[0 .. 20) in the target's cache; the root text[20]
    CHECK(extend(s, text, 20) == 0, "%s", g_err);
    float *kv = kv_rows(s, 0, 20);
    CHECK(kv && sd_drafter_tell_prompt(dr, text, 0, 20, kv, g_err, sizeof g_err) == 0, "%s", g_err);
    free(kv);
    CHECK(local_tree(dl, s, text, 21, t1) == 0 && sd_drafter_draft(dr, text, 21, 16, t2, g_err, sizeof g_err) == 0,
          "%s", g_err);
    CHECK(sd_tree_size(t1) > 1 && same_tree(t1, t2), "TLI %d%s: the remote tree differs (%d vs %d nodes)", tli,
          sa_full ? " sa_full" : "", sd_tree_size(t1), sd_tree_size(t2));
    // unverified text after the told positions: it drafts on (an SA chain), twice (the chain kept)
    for (int n = 25; n <= 27; n += 2) {
        CHECK(sd_drafter_draft(dr, text, n, 16, t2, g_err, sizeof g_err) == 0 && sd_tree_size(t2) > 1 &&
                  sd_tree_token(t2, 0) == text[n - 1],
              "TLI %d: nothing drafted after %d unverified tokens: %s", tli, n - 21, g_err);
    }
    // verified and told: the in-process trees again
    CHECK(extend(s, text, 30) == 0, "%s", g_err);
    kv = kv_rows(s, 20, 10);
    CHECK(kv && sd_drafter_tell_prompt(dr, text, 20, 10, kv, g_err, sizeof g_err) == 0, "%s", g_err);
    free(kv);
    CHECK(local_tree(dl, s, text, 31, t1) == 0 && sd_drafter_draft(dr, text, 31, 16, t2, g_err, sizeof g_err) == 0,
          "%s", g_err);
    CHECK(sd_tree_size(t1) > 1 && same_tree(t1, t2), "TLI %d%s: after the chain was verified, trees differ", tli,
          sa_full ? " sa_full" : "");
    // rows of positions not committed
    float k[64 * 64], v[64 * 64];
    CHECK(sd_session_kv_read(s, 0, 28, 4, k, v, g_err, sizeof g_err) == SD_ERR_INPUT, "uncommitted rows read");
    CHECK(sd_session_kv_read(s, 99, 0, 1, k, v, g_err, sizeof g_err) == SD_ERR_INPUT, "a layer out of range read");
out:
    sd_tree_destroy(t1);
    sd_tree_destroy(t2);
    sd_session_free(s);
    sd_drafter_free(dl);
    sd_drafter_free(dr);
    sd_head_free(h);
}

// kv (n, L, 2w) -> LSA outputs and the last N layers' rows (n, E + N 2w).
static float *lsa_rows(sd_moa_lsa *x, const float *kv, int n, int tli) {
    const sd_hparams *hp = &g_m->hp;
    const int L = hp->n_layer, ekv = 2 * hp->n_head_kv * hp->head_dim, E = hp->n_embd;
    const size_t ld = (size_t)E + (size_t)tli * ekv;
    float *c = malloc(sizeof(float) * (size_t)n * E), *out = malloc(sizeof(float) * (size_t)n * ld);
    if (!c || !out || sd_moa_lsa_run(x, kv, n, c, g_err, sizeof g_err) < 0) {
        free(c);
        free(out);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        memcpy(out + i * ld, c + (size_t)i * E, sizeof(float) * (size_t)E);
        memcpy(out + i * ld + E, kv + ((size_t)i * L + (L - tli)) * ekv, sizeof(float) * (size_t)tli * ekv);
    }
    free(c);
    return out;
}

static void lsa_outputs(int sa_full) {
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_MOA);
    hp.n_draft_vocab = NV;
    hp.moa_tli = 1;
    hp.moa_sa_full = sa_full;
    sd_head *h = NULL, *h2 = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0 && sd_head_new(&h2, &hp, g_err, sizeof g_err) == 0, "%s",
          g_err);
    if (!h || !h2) goto done;
    sd_head_init(h, 21);
    sd_head_init(h2, 22);
    CHECK(sd_head_fingerprint(h) != sd_head_fingerprint(h2) && sd_head_moa_tli(h) == 1, "fingerprints");
    sd_moa_lsa *x = NULL;
    CHECK(sd_moa_lsa_new(&x, h, g_m, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_drafter *dk = new_drafter_w(h, 1, SD_TYPE_Q8_0), *dl = new_drafter_w(h, 2, SD_TYPE_Q8_0);
    sd_session *s = sc_new_session(g_m, 128, 1, g_err, sizeof g_err);
    sd_tree *t1 = NULL, *t2 = NULL;
    sd_tree_new(&t1, 16, NV, g_err, sizeof g_err);
    sd_tree_new(&t2, 16, NV, g_err, sizeof g_err);
    int32_t text[40];
    for (int i = 0; i < 40; i++) text[i] = (int32_t)((i * 53 + 7) % NV);
    if (x && dk && dl && s && t1 && t2 && extend(s, text, 30) == 0) {
        for (int p0 = 0; p0 < 30; p0 += 15) {   // two tells, as rounds would
            float *kv = kv_rows(s, p0, 15), *lr = kv ? lsa_rows(x, kv, 15, 1) : NULL;
            CHECK(kv && lr && sd_drafter_tell_prompt(dk, text, p0, 15, kv, g_err, sizeof g_err) == 0 &&
                      sd_drafter_tell_prompt(dl, text, p0, 15, lr, g_err, sizeof g_err) == 0,
                  "%s", g_err);
            free(kv);
            free(lr);
        }
        CHECK(sd_drafter_draft(dk, text, 31, 16, t1, g_err, sizeof g_err) == 0 &&
                  sd_drafter_draft(dl, text, 31, 16, t2, g_err, sizeof g_err) == 0,
              "%s", g_err);
        CHECK(sd_tree_size(t1) > 1 && same_tree(t1, t2), "LSA outputs%s: trees differ (%d vs %d nodes)",
              sa_full ? " (sa_full)" : "", sd_tree_size(t1), sd_tree_size(t2));
    } else CHECK(0, "setup: %s", g_err);
    sd_drafter *ng = NULL;
    CHECK(sd_drafter_remote_lsa(ng, g_err, sizeof g_err) == SD_ERR_INPUT, "no drafter made remote");
    sd_tree_destroy(t1);
    sd_tree_destroy(t2);
    sd_session_free(s);
    sd_drafter_free(dk);
    sd_drafter_free(dl);
    sd_moa_lsa_free(x);
done:
    sd_head_free(h);
    sd_head_free(h2);
}

static void test_remote_moa_lsa_outputs(void) {
    if (!g_m) SKIP("no synthetic model: %.200s", g_err);
    lsa_outputs(0);
    lsa_outputs(1);   // SA sees the whole text (sa_full): the client makes its rows from the text
}

// Evaluates text[n_past .. n) in s, commits it, and writes the target's
// states at layer into out (n - n_past, E).
static int extend_states(sd_session *s, const int32_t *text, int n, int32_t layer, float *out) {
    const int p0 = sd_session_n_past(s), m = n - p0;
    int32_t pos[64];
    for (int i = 0; i < m; i++) pos[i] = p0 + i;
    sd_batch b = {.n = m, .tokens = text + p0, .pos = pos, .hidden_layers = &layer, .n_hidden_layers = 1,
                  .hidden_out = out};
    return sd_session_forward(s, &b, g_err, sizeof g_err) < 0 ? -1 : sd_session_commit(s, NULL, m, g_err, sizeof g_err);
}

// rows (n, ld) then states (n, E): what a remote drafter reading states is told.
static float *with_states(const float *rows, size_t ld, const float *st, int n) {
    const size_t E = (size_t)g_m->hp.n_embd;
    float *o = rows ? malloc(sizeof(float) * (size_t)n * (ld + E)) : NULL;
    if (!o) return NULL;
    memcpy(o, rows, sizeof(float) * (size_t)n * ld);
    memcpy(o + (size_t)n * ld, st, sizeof(float) * (size_t)n * E);
    return o;
}

// A drafter reading the target's states (ca_hidden and sa_hidden), TLI tli:
// remote, told every layer's K,V rows and then the states (as a split server
// sends them), and remote on LSA's outputs computed elsewhere with the states,
// it proposes the in-process drafter's trees; told the states of the wrong
// positions (shifted by one), another tree.
static void run_states(int tli) {
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_MOA);
    hp.n_draft_vocab = NV;
    hp.moa_tli = tli;
    hp.moa_ca_hidden = hp.moa_sa_hidden = 1;
    sd_head *h = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!h) return;
    sd_head_init(h, 31 + (uint64_t)tli);
    const sd_hparams *mh = &g_m->hp;
    const int L = mh->n_layer, ekv = 2 * mh->n_head_kv * mh->head_dim, E = mh->n_embd;
    sd_drafter *dl = new_drafter(h, 0), *dr = new_drafter(h, 1), *dw = new_drafter(h, 1);
    // the server's LSA runs the drafter in 8 bits, as a client holds it: compared with a K,V client in 8 bits
    sd_drafter *da = new_drafter_w(h, 2, SD_TYPE_Q8_0), *dq = new_drafter_w(h, 1, SD_TYPE_Q8_0);
    sd_moa_lsa *x = NULL;
    CHECK(sd_moa_lsa_new(&x, h, g_m, g_err, sizeof g_err) == 0, "LSA for a drafter reading states: %s", g_err);
    sd_session *s = sc_new_session(g_m, 128, 1, g_err, sizeof g_err);
    sd_tree *t1 = NULL, *t2 = NULL;
    sd_tree_new(&t1, 16, NV, g_err, sizeof g_err);
    sd_tree_new(&t2, 16, NV, g_err, sizeof g_err);
    int32_t text[40], layer[SD_MAX_HIDDEN_LAYERS];
    for (int i = 0; i < 40; i++) text[i] = (int32_t)((i * 41 + 3) % NV);
    float *st = malloc(sizeof(float) * 40 * (size_t)E), *kv = NULL, *all = NULL, *wrong = NULL, *lr = NULL;
    CHECK(dl && dr && dw && da && dq && x && s && t1 && t2 && st, "%s", g_err);
    if (!dl || !dr || !dw || !da || !dq || !x || !s || !t1 || !t2 || !st) goto out;
    CHECK(sd_drafter_hidden_layers(dl, layer) == 1 && layer[0] == (tli ? L - tli - 1 : SD_HIDDEN_NORM),
          "TLI %d: the drafter asks for one state, at %d", tli, layer[0]);
    // verified: text[0 .. 20), the root text[20]; two tells, as an open and a round would
    for (int p0 = 0, n = 12; p0 < 20; p0 += n, n = 20 - p0) {
        CHECK(extend_states(s, text, p0 + n, layer[0], st + (size_t)p0 * E) == 0, "%s", g_err);
        kv = kv_rows(s, p0, n);
        all = with_states(kv, (size_t)L * ekv, st + (size_t)p0 * E, n);
        // the states of the positions one before (the first: its own)
        wrong = with_states(kv, (size_t)L * ekv, st + (size_t)(p0 > 0 ? p0 - 1 : 0) * E, n);
        lr = kv ? lsa_rows(x, kv, n, tli) : NULL;
        float *lra = with_states(lr, (size_t)E + (size_t)tli * ekv, st + (size_t)p0 * E, n);
        CHECK(all && wrong && lra && sd_drafter_tell_prompt(dl, text, p0, n, st + (size_t)p0 * E, g_err, sizeof g_err) == 0 &&
                  sd_drafter_tell_prompt(dr, text, p0, n, all, g_err, sizeof g_err) == 0 &&
                  sd_drafter_tell_prompt(dq, text, p0, n, all, g_err, sizeof g_err) == 0 &&
                  sd_drafter_tell_prompt(dw, text, p0, n, wrong, g_err, sizeof g_err) == 0 &&
                  sd_drafter_tell_prompt(da, text, p0, n, lra, g_err, sizeof g_err) == 0,
              "TLI %d: tell: %s", tli, g_err);
        free(kv), free(all), free(wrong), free(lr), free(lra);
        kv = all = wrong = lr = NULL;
    }
    CHECK(local_tree(dl, s, text, 21, t1) == 0 && sd_tree_size(t1) > 1, "TLI %d: in-process: %s", tli, g_err);
    CHECK(sd_drafter_draft(dr, text, 21, 16, t2, g_err, sizeof g_err) == 0 && same_tree(t1, t2),
          "TLI %d: told K,V rows and states, the remote tree differs (%d vs %d nodes) %s", tli, sd_tree_size(t1),
          sd_tree_size(t2), g_err);
    CHECK(sd_drafter_draft(dw, text, 21, 16, t2, g_err, sizeof g_err) == 0 && !same_tree(t1, t2),
          "TLI %d: told the states of other positions, the remote tree is the same: the states are not read", tli);
    CHECK(sd_drafter_draft(dq, text, 21, 16, t1, g_err, sizeof g_err) == 0 &&
              sd_drafter_draft(da, text, 21, 16, t2, g_err, sizeof g_err) == 0 && sd_tree_size(t1) > 1 &&
              same_tree(t1, t2),
          "TLI %d: told LSA's outputs and states, the remote tree differs from the K,V client's (%d vs %d nodes) %s",
          tli, sd_tree_size(t1), sd_tree_size(t2), g_err);
out:
    free(st);
    sd_tree_destroy(t1);
    sd_tree_destroy(t2);
    sd_session_free(s);
    sd_moa_lsa_free(x);
    sd_drafter_free(dl);
    sd_drafter_free(dr);
    sd_drafter_free(dw);
    sd_drafter_free(da);
    sd_drafter_free(dq);
    sd_head_free(h);
}

static void test_remote_moa_states_tli0(void) {
    if (!g_m) SKIP("no synthetic model: %.200s", g_err);
    run_states(0);
}

static void test_remote_moa_states_tli1(void) {
    if (!g_m) SKIP("no synthetic model: %.200s", g_err);
    run_states(1);
}

// kv (n, L, 2w) -> the mean over layers and the last N layers' rows (n, (1 + N) 2w).
static float *mean_rows(const float *kv, int n, int tli) {
    const sd_hparams *hp = &g_m->hp;
    const int L = hp->n_layer, ekv = 2 * hp->n_head_kv * hp->head_dim;
    const size_t ld = (size_t)(1 + tli) * ekv;
    float *out = kv ? calloc((size_t)n * ld, sizeof(float)) : NULL;
    for (int i = 0; out && i < n; i++) {
        for (int l = 0; l < L; l++)
            for (int j = 0; j < ekv; j++) out[i * ld + j] += kv[((size_t)i * L + l) * ekv + j] / (float)L;
        memcpy(out + i * ld + ekv, kv + ((size_t)i * L + (L - tli)) * ekv, sizeof(float) * (size_t)tli * ekv);
    }
    return out;
}

// A drafter without LSA made remote on the layers' mean (sd_drafter_remote_mean),
// told each position's mean K,V and the TLI layers' rows (and, ca/sa_hidden, the
// states), proposes the in-process drafter's trees, as it does made remote on
// "LSA" outputs a server computed for it (sd_moa_lsa_run: the projection of the
// mean); an LSA drafter refuses the mean.
static void run_mean(int tli, int hidden, int sa_full) {
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_MOA);
    hp.n_draft_vocab = NV;
    hp.moa_tli = tli;
    hp.moa_no_lsa = 1;
    hp.moa_ca_hidden = hidden;
    hp.moa_sa_hidden = hidden && !sa_full;   // (sa_full: not with sa_hidden)
    hp.moa_sa_full = sa_full;
    sd_head *h = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!h) return;
    sd_head_init(h, 41 + (uint64_t)tli);
    const int E = g_m->hp.n_embd, ekv = 2 * g_m->hp.n_head_kv * g_m->hp.head_dim;
    sd_drafter *dl = new_drafter(h, 0), *dm = new_drafter(h, 0);
    // the server's LSA runs the drafter in 8 bits, as a client holds it: compared with a K,V client in 8 bits
    sd_drafter *da = new_drafter_w(h, 2, SD_TYPE_Q8_0), *dq = new_drafter_w(h, 1, SD_TYPE_Q8_0);
    CHECK(dm && sd_drafter_remote_mean(dm, g_err, sizeof g_err) == 0, "TLI %d: remote mean: %s", tli, g_err);
    sd_moa_lsa *x = NULL;   // a server's "LSA" for a drafter without it: the projection of the layers' mean
    CHECK(da && sd_moa_lsa_new(&x, h, g_m, g_err, sizeof g_err) == 0, "TLI %d: LSA outputs without LSA: %s", tli,
          g_err);
    sd_session *s = sc_new_session(g_m, 128, 1, g_err, sizeof g_err);
    sd_tree *t1 = NULL, *t2 = NULL;
    sd_tree_new(&t1, 16, NV, g_err, sizeof g_err);
    sd_tree_new(&t2, 16, NV, g_err, sizeof g_err);
    int32_t text[40], layer[SD_MAX_HIDDEN_LAYERS] = {SD_HIDDEN_NORM};
    for (int i = 0; i < 40; i++) text[i] = (int32_t)((i * 29 + 5) % NV);
    float *st = malloc(sizeof(float) * 40 * (size_t)E);
    if (!dl || !dm || !da || !dq || !x || !s || !t1 || !t2 || !st) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    if (hidden) CHECK(sd_drafter_hidden_layers(dl, layer) == 1, "the drafter reads one state");
    for (int p0 = 0, n = 9; p0 < 20; p0 += n, n = 20 - p0) {
        CHECK(extend_states(s, text, p0 + n, layer[0], st + (size_t)p0 * E) == 0, "%s", g_err);
        float *kv = kv_rows(s, p0, n), *mr = mean_rows(kv, n, tli), *lr = kv ? lsa_rows(x, kv, n, tli) : NULL;
        float *told = hidden ? with_states(mr, (size_t)(1 + tli) * ekv, st + (size_t)p0 * E, n) : mr;
        float *tola = hidden ? with_states(lr, (size_t)E + (size_t)tli * ekv, st + (size_t)p0 * E, n) : lr;
        float *tolk = hidden ? with_states(kv, (size_t)g_m->hp.n_layer * ekv, st + (size_t)p0 * E, n) : kv;
        CHECK(told && tola && (!hidden || sd_drafter_tell_prompt(dl, text, p0, n, st + (size_t)p0 * E, g_err, sizeof g_err) == 0) &&
                  sd_drafter_tell_prompt(dm, text, p0, n, told, g_err, sizeof g_err) == 0 &&
                  sd_drafter_tell_prompt(da, text, p0, n, tola, g_err, sizeof g_err) == 0 &&
                  tolk && sd_drafter_tell_prompt(dq, text, p0, n, tolk, g_err, sizeof g_err) == 0,
              "TLI %d: tell: %s", tli, g_err);
        if (told != mr) free(told);
        if (tola != lr) free(tola);
        if (tolk != kv) free(tolk);
        free(mr);
        free(lr);
        free(kv);
    }
    CHECK(local_tree(dl, s, text, 21, t1) == 0 && sd_tree_size(t1) > 1, "TLI %d: in-process: %s", tli, g_err);
    CHECK(sd_drafter_draft(dm, text, 21, 16, t2, g_err, sizeof g_err) == 0 && same_tree(t1, t2),
          "TLI %d%s: told the layers' mean, the remote tree differs (%d vs %d nodes) %s", tli, hidden ? " hidden" : "",
          sd_tree_size(t1), sd_tree_size(t2), g_err);
    CHECK(sd_drafter_draft(dq, text, 21, 16, t1, g_err, sizeof g_err) == 0 &&
              sd_drafter_draft(da, text, 21, 16, t2, g_err, sizeof g_err) == 0 && sd_tree_size(t1) > 1 &&
              same_tree(t1, t2),
          "TLI %d%s: told the server's LSA outputs of a drafter without LSA, the remote tree differs from the K,V "
          "client's (%d vs %d nodes) %s", tli, hidden ? " hidden" : "", sd_tree_size(t1), sd_tree_size(t2), g_err);
    {   // an MoA drafter with LSA reads every layer's rows, not their mean
        sd_head_hp hl = hp;
        hl.moa_no_lsa = 0;
        sd_head *h2 = NULL;
        sd_drafter *d2 = NULL;
        if (sd_head_new(&h2, &hl, g_err, sizeof g_err) == 0) sd_head_init(h2, 3), d2 = new_drafter(h2, 0);
        CHECK(d2 && sd_drafter_remote_mean(d2, g_err, sizeof g_err) == SD_ERR_INPUT && strstr(g_err, "without LSA"),
              "an LSA drafter took the layers' mean: %s", g_err);
        sd_drafter_free(d2);
        sd_head_free(h2);
    }
out:
    free(st);
    sd_tree_destroy(t1);
    sd_tree_destroy(t2);
    sd_session_free(s);
    sd_drafter_free(dl);
    sd_drafter_free(dm);
    sd_drafter_free(da);
    sd_drafter_free(dq);
    sd_moa_lsa_free(x);
    sd_head_free(h);
}

static void test_remote_moa_mean(void) {
    if (!g_m) SKIP("no synthetic model: %.200s", g_err);
    run_mean(0, 1, 0);
    run_mean(1, 0, 0);
    run_mean(0, 1, 1);   // SA sees the whole text (sa_full): the client has the text, the wire is unchanged
    run_mean(1, 0, 1);
}

static void test_remote_moa_tli0(void) {
    if (!g_m) SKIP("no synthetic model: %.200s", g_err);
    run(0, 0);
    run(0, 1);
}

static void test_remote_moa_tli1(void) {
    if (!g_m) SKIP("no synthetic model: %.200s", g_err);
    run(1, 0);
    run(1, 1);
}

int main(void) {
    synth_params p = synth_default_params();
    p.arch = "llama";
    p.n_layer = 2;
    p.n_vocab = NV;
    g_m = sc_synth_model(&p, "remote_moa", "l", g_err, sizeof g_err);
    T_RUN(test_remote_moa_tli0);
    T_RUN(test_remote_moa_tli1);
    T_RUN(test_remote_moa_lsa_outputs);
    T_RUN(test_remote_moa_states_tli0);
    T_RUN(test_remote_moa_states_tli1);
    T_RUN(test_remote_moa_mean);
    sd_model_free(g_m);
    T_EXIT();
}

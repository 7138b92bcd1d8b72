// test_eagle3_drafter.c - the EAGLE-3 head at inference and its drafter: the head's
// rows (chain and tree, against its own KV cache) equal a double-precision
// reference written from docs/heads.md; greedy output with the drafter
// (chain, widths, dynamic and automatic trees, as prompt lookup's fallback
// and merged with it, through the method registry) equals plain decoding on
// synthetic and real models; the prompt's hidden rows reach the drafter; bad
// method strings and missing heads give messages.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "draft/draft_eagle3.h"
#include "head/eagle3.h"
#include "head/head.h"
#include "spec/cost_curve.h"
#include "kernels/quant.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

static sd_model *synth(void) {
    synth_params p = synth_default_params();
    p.n_layer = 6;
    return sc_synth_model(&p, "eagle3", "t", g_err, sizeof g_err);
}

static sd_head *random_head(const sd_model *m, int nv_draft, uint64_t seed) {
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = nv_draft;
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    sd_head_init(h, seed);
    sd_rng r;
    sd_rng_seed(&r, seed + 1);
    for (int i = 0; i < h->n_t; i++)   // gains away from 1, so that a missing gain shows
        if (h->t[i].is_norm)
            for (int64_t j = 0; j < h->t[i].ne0; j++) sd_head_w(h, i)[j] = (float)(0.5 + sd_rng_uniform(&r));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)nv_draft);
    for (int i = 0; i < nv_draft; i++) ids[i] = (int32_t)((i * 7 + 3) % m->hp.n_vocab);
    int rc = sd_head_set_vocab(h, ids, nv_draft, g_err, sizeof g_err);
    free(ids);
    if (rc < 0) {
        sd_head_free(h);
        return NULL;
    }
    return h;
}

// ---------------------------------------------------------------- reference (double)

typedef struct ref_row { int tok, pos, parent; const float *c; } ref_row;

static void ref_rms(double *out, const double *x, const float *w, int n, double eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double sc = 1.0 / sqrt(s / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * w[i];
}

static void ref_mv(const float *W, int n_in, int n_out, const double *x, double *y) {
    for (int r = 0; r < n_out; r++) {
        double s = 0;
        for (int k = 0; k < n_in; k++) s += (double)W[(size_t)r * n_in + k] * x[k];
        y[r] = s;
    }
}

static void ref_rope(double *v, int nh, int hd, int pos, double base) {
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd / 2; i++) {
            double th = pos * pow(base, -2.0 * i / hd), c = cos(th), s = sin(th);
            double a = v[h * hd + 2 * i], b = v[h * hd + 2 * i + 1];
            v[h * hd + 2 * i] = a * c - b * s;
            v[h * hd + 2 * i + 1] = a * s + b * c;
        }
}

// Rows evaluated in order; rows[i].parent: -1 = a committed-chain row (sees
// every earlier committed row), else the index of its parent row (sees the
// committed rows before the first non-committed row, its ancestors, itself).
static void ref_eval(const sd_head *h, const sd_model *m, const ref_row *rows, int n, double *h_out, double *lg_out) {
    const sd_head_hp *hp = &h->hp;
    const int d = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int qd = nh * hd, kd = nkv * hd;
    double *K = calloc((size_t)n * kd, sizeof(double)), *Vv = calloc((size_t)n * kd, sizeof(double));
    double *u = malloc(sizeof(double) * 2 * d), *x = malloc(sizeof(double) * d), *q = malloc(sizeof(double) * qd);
    double *att = malloc(sizeof(double) * qd), *o = malloc(sizeof(double) * d), *r = malloc(sizeof(double) * d);
    double *mm = malloc(sizeof(double) * d), *ga = malloc(sizeof(double) * hp->n_ff), *up = malloc(sizeof(double) * hp->n_ff);
    double *f = malloc(sizeof(double) * d), *hn = malloc(sizeof(double) * d), *sc = malloc(sizeof(double) * n);
    float *e = malloc(sizeof(float) * d);
    int n_committed = 0;
    while (n_committed < n && rows[n_committed].parent == -1) n_committed++;
    for (int i = 0; i < n; i++) {
        sd_model_token_embd(m, rows[i].tok, e, NULL, 0);
        for (int j = 0; j < d; j++) x[j] = e[j];
        ref_rms(u, x, sd_head_w(h, SD_E3_ATTN_NORM), d, hp->rms_eps);
        for (int j = 0; j < d; j++) x[j] = rows[i].c[j];
        ref_rms(u + d, x, sd_head_w(h, SD_E3_HIDDEN_NORM), d, hp->rms_eps);
        ref_mv(sd_head_w(h, SD_E3_WQ), 2 * d, qd, u, q);
        ref_mv(sd_head_w(h, SD_E3_WK), 2 * d, kd, u, K + (size_t)i * kd);
        ref_mv(sd_head_w(h, SD_E3_WV), 2 * d, kd, u, Vv + (size_t)i * kd);
        ref_rope(q, nh, hd, rows[i].pos, hp->rope_base);
        ref_rope(K + (size_t)i * kd, nkv, hd, rows[i].pos, hp->rope_base);
        // visible rows
        int vis[256], nv = 0;
        if (rows[i].parent == -1) {
            for (int j = 0; j <= i; j++) vis[nv++] = j;
        } else {
            for (int j = 0; j < n_committed; j++) vis[nv++] = j;
            int chain[64], nc = 0;
            for (int a = i; a >= n_committed; a = rows[a].parent) chain[nc++] = a;
            for (int j = nc - 1; j >= 0; j--) vis[nv++] = chain[j];
        }
        for (int hh = 0; hh < nh; hh++) {
            int kh = hh / (nh / nkv);
            double mx = -1e300, sum = 0;
            for (int j = 0; j < nv; j++) {
                double s = 0;
                for (int t = 0; t < hd; t++) s += q[hh * hd + t] * K[(size_t)vis[j] * kd + kh * hd + t];
                sc[j] = s / sqrt((double)hd);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < nv; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int t = 0; t < hd; t++) {
                double a = 0;
                for (int j = 0; j < nv; j++) a += sc[j] / sum * Vv[(size_t)vis[j] * kd + kh * hd + t];
                att[hh * hd + t] = a;
            }
        }
        ref_mv(sd_head_w(h, SD_E3_WO), qd, d, att, o);
        for (int j = 0; j < d; j++) r[j] = (hp->norm_before_residual ? u[d + j] : rows[i].c[j]) + o[j];
        ref_rms(mm, r, sd_head_w(h, SD_E3_FFN_NORM), d, hp->rms_eps);
        ref_mv(sd_head_w(h, SD_E3_GATE), d, hp->n_ff, mm, ga);
        ref_mv(sd_head_w(h, SD_E3_UP), d, hp->n_ff, mm, up);
        for (int j = 0; j < hp->n_ff; j++) ga[j] = ga[j] / (1 + exp(-ga[j])) * up[j];
        ref_mv(sd_head_w(h, SD_E3_DOWN), hp->n_ff, d, ga, f);
        for (int j = 0; j < d; j++) h_out[(size_t)i * d + j] = f[j] + r[j];
        ref_rms(hn, h_out + (size_t)i * d, sd_head_w(h, SD_E3_OUT_NORM), d, hp->rms_eps);
        ref_mv(sd_head_w(h, SD_E3_OUT), d, hp->n_draft_vocab, hn, lg_out + (size_t)i * hp->n_draft_vocab);
    }
    free(K), free(Vv), free(u), free(x), free(q), free(att), free(o), free(r), free(mm), free(ga), free(up);
    free(f), free(hn), free(sc), free(e);
}

// A synthetic model and a random head of nv_draft tokens for it; 0 (both
// freed, the failure reported) when either cannot be made.
static int synth_with_head(sd_model **m, sd_head **h, int nv_draft, uint64_t seed) {
    *h = NULL;
    *m = synth();
    CHECK(*m, "%s", g_err);
    if (!*m) return 0;
    *h = random_head(*m, nv_draft, seed);
    CHECK(*h, "%s", g_err);
    if (*h) return 1;
    sd_model_free(*m);
    *m = NULL;
    return 0;
}

// Chain rows committed in two calls, then a tree of pending rows in two calls:
// every output state and logit equals the reference.
static void check_forward(int norm_before_residual) {
    sd_model *m;
    sd_head *h;
    if (!synth_with_head(&m, &h, 50, 11)) return;
    h->hp.norm_before_residual = norm_before_residual;
    const int d = h->hp.n_embd, V = h->hp.n_draft_vocab;
    enum { NR = 10 };
    // rows 0..4: committed chain at positions 1..5; rows 5..9: a tree below
    // (5 and 6 children of the committed rows, 7 child of 5, 8 child of 7, 9 child of 6)
    static const int tok[NR] = {5, 17, 260, 33, 2, 40, 41, 300, 7, 19};
    static const int par_ref[NR] = {-1, -1, -1, -1, -1, 4, 4, 5, 7, 6};
    static const int pos[NR] = {1, 2, 3, 4, 5, 6, 6, 7, 8, 7};
    float *c = malloc(sizeof(float) * NR * (size_t)d);
    sd_rng r;
    sd_rng_seed(&r, 5);
    for (int i = 0; i < NR * d; i++) c[i] = (float)(3.0 * (sd_rng_uniform(&r) - 0.5));
    ref_row rr[NR];
    for (int i = 0; i < NR; i++) rr[i] = (ref_row){tok[i], pos[i], par_ref[i] == 4 ? 4 : par_ref[i], c + (size_t)i * d};
    // in the reference, rows 5 and 6 hang below the committed chain: parent index 4 is committed,
    // so mark them as tree rows whose chain ends in the committed part
    double *h_ref = malloc(sizeof(double) * NR * d), *lg_ref = malloc(sizeof(double) * NR * V);
    // reference: committed rows have parent -1; tree rows' parents inside the tree, rows 5, 6 -> committed
    ref_row rr2[NR];
    memcpy(rr2, rr, sizeof rr);
    rr2[5].parent = 4, rr2[6].parent = 4;   // parents below n_committed end the ancestor walk
    ref_eval(h, m, rr2, NR, h_ref, lg_ref);
    sd_e3 *e = NULL;
    CHECK(sd_e3_new(&e, h, m, 64, 8, 16, SD_TYPE_F32, 0, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    float *ho = malloc(sizeof(float) * NR * d), *lo = malloc(sizeof(float) * NR * V);
    if (e) {
        int32_t t32[NR], p32[NR], par[NR];
        for (int i = 0; i < NR; i++) t32[i] = tok[i], p32[i] = pos[i];
        // committed chain: rows 0-2 then 3-4
        int32_t ch[3] = {-1, 0, 1}, sl[3] = {0, 1, 2};
        CHECK(sd_e3_eval(e, t32, c, p32, ch, 3, ho, lo, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_e3_commit(e, sl, 3, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_e3_eval(e, t32 + 3, c + 3 * d, p32 + 3, ch, 2, ho + 3 * d, lo + 3 * V, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_e3_commit(e, sl, 2, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_e3_n_cached(e) == 5, "cached %d", sd_e3_n_cached(e));
        // tree: rows 5, 6 (slots 0, 1), then 7 (slot 2, parent slot 0), 8 (slot 3, parent 2), 9 (slot 4, parent 1)
        par[0] = -1, par[1] = -1;
        CHECK(sd_e3_eval(e, t32 + 5, c + 5 * d, p32 + 5, par, 2, ho + 5 * d, lo + 5 * V, g_err, sizeof g_err) == 0, "%s", g_err);
        int32_t par2[3] = {0, 2, 1};
        // rows 7, 8 and 9 in one call: 8's parent (slot 2) is row 7 of the same call
        CHECK(sd_e3_eval(e, t32 + 7, c + 7 * d, p32 + 7, par2, 3, ho + 7 * d, lo + 7 * V, g_err, sizeof g_err) == 0, "%s", g_err);
        double worst = 0, scale = 1e-9;
        for (int i = 0; i < NR * V; i++) scale = fmax(scale, fabs(lg_ref[i]));
        for (int i = 0; i < NR * V; i++) worst = fmax(worst, fabs(lo[i] - lg_ref[i]) / scale);
        double worst_h = 0, sh = 1e-9;
        for (int i = 0; i < NR * d; i++) sh = fmax(sh, fabs(h_ref[i]));
        for (int i = 0; i < NR * d; i++) worst_h = fmax(worst_h, fabs(ho[i] - h_ref[i]) / sh);
        printf("  norm_before_residual %d: logits max rel diff %.2e, states %.2e\n", norm_before_residual, worst, worst_h);
        CHECK(worst < 1e-4 && worst_h < 1e-4, "head rows differ from the reference: %g %g", worst, worst_h);
        // A parent slot that does not exist yet is refused.
        int32_t badp = 9;
        CHECK(sd_e3_eval(e, t32, c, p32, &badp, 1, NULL, NULL, g_err, sizeof g_err) < 0, "bad parent accepted");
        int32_t notchain[2] = {0, 1};   // slot 1 hangs off the committed rows, not off slot 0
        CHECK(sd_e3_commit(e, notchain, 2, g_err, sizeof g_err) < 0, "commit of a non-chain accepted");
    }
    free(c), free(h_ref), free(lg_ref), free(ho), free(lo);
    sd_e3_free(e);
    sd_head_free(h);
    sd_model_free(m);
}

// A catch-up's rows with the last one's outputs only (sd_e3_eval_last) leave
// the same keys and values, and give the last row the same output state and
// logits, bit for bit, as sd_e3_eval of every row: the rows drafted after
// them see no difference. For the 8-bit and the float matrices.
static void test_eval_last_same_bits(void) {
    sd_model *m;
    sd_head *h;
    if (!synth_with_head(&m, &h, 50, 13)) return;
    const int d = h->hp.n_embd, V = h->hp.n_draft_vocab;
    enum { NC = 7, NT = 3 };
    static const int32_t tok[NC + NT] = {5, 17, 260, 33, 2, 40, 41, 300, 7, 19};
    int32_t pos[NC + NT], chain[NC], slots[NC];
    for (int i = 0; i < NC; i++) pos[i] = i + 1, chain[i] = i - 1, slots[i] = i;
    pos[NC] = pos[NC + 1] = NC + 1, pos[NC + 2] = NC + 2;
    const int32_t tpar[NT] = {-1, -1, 0};
    float *c = malloc(sizeof(float) * (NC + NT) * (size_t)d);
    sd_rng r;
    sd_rng_seed(&r, 9);
    for (int i = 0; i < (NC + NT) * d; i++) c[i] = (float)(3.0 * (sd_rng_uniform(&r) - 0.5));
    float *ho[2], *lo[2], *th[2], *tl[2];
    for (int k = 0; k < 2; k++) {
        ho[k] = malloc(sizeof(float) * NC * (size_t)d), lo[k] = malloc(sizeof(float) * NC * (size_t)V);
        th[k] = malloc(sizeof(float) * NT * (size_t)d), tl[k] = malloc(sizeof(float) * NT * (size_t)V);
    }
    static const int wt[2] = {SD_TYPE_Q8_0, SD_TYPE_F32};
    for (int w = 0; w < 2; w++) {
        sd_e3 *e[2] = {NULL, NULL};
        int ok = 1;
        for (int k = 0; k < 2; k++) {
            ok &= sd_e3_new(&e[k], h, m, 64, 16, 32, wt[w], 0, NULL, g_err, sizeof g_err) == 0;
            CHECK(ok, "%s", g_err);
        }
        if (ok) {
            CHECK(sd_e3_eval(e[0], tok, c, pos, chain, NC, ho[0], lo[0], g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_e3_eval_last(e[1], tok, c, pos, chain, NC, ho[1], lo[1], g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_e3_n_pending(e[1]) == NC, "eval_last left %d pending rows, not %d", sd_e3_n_pending(e[1]), NC);
            for (int k = 0; k < 2; k++)
                CHECK(sd_e3_commit(e[k], slots, NC, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(memcmp(ho[0] + (size_t)(NC - 1) * d, ho[1], sizeof(float) * (size_t)d) == 0,
                  "wtype %d: the last row's state differs", wt[w]);
            CHECK(memcmp(lo[0] + (size_t)(NC - 1) * V, lo[1], sizeof(float) * (size_t)V) == 0,
                  "wtype %d: the last row's logits differ", wt[w]);
            for (int k = 0; k < 2; k++)
                CHECK(sd_e3_eval(e[k], tok + NC, c + (size_t)NC * d, pos + NC, tpar, NT, th[k], tl[k], g_err,
                                 sizeof g_err) == 0, "%s", g_err);
            CHECK(memcmp(th[0], th[1], sizeof(float) * NT * (size_t)d) == 0 &&
                      memcmp(tl[0], tl[1], sizeof(float) * NT * (size_t)V) == 0,
                  "wtype %d: rows drafted after the catch-up differ (keys or values not the same)", wt[w]);
            // one row: the same as sd_e3_eval
            sd_e3_drop_pending(e[0]), sd_e3_drop_pending(e[1]);
            CHECK(sd_e3_eval(e[0], tok + NC, c + (size_t)NC * d, pos + NC, tpar, 1, th[0], tl[0], g_err, sizeof g_err) == 0 &&
                      sd_e3_eval_last(e[1], tok + NC, c + (size_t)NC * d, pos + NC, tpar, 1, th[1], tl[1], g_err, sizeof g_err) == 0,
                  "%s", g_err);
            CHECK(memcmp(th[0], th[1], sizeof(float) * (size_t)d) == 0 && memcmp(tl[0], tl[1], sizeof(float) * (size_t)V) == 0,
                  "wtype %d: one row differs", wt[w]);
        }
        sd_e3_free(e[0]), sd_e3_free(e[1]);
    }
    for (int k = 0; k < 2; k++) free(ho[k]), free(lo[k]), free(th[k]), free(tl[k]);
    free(c);
    sd_head_free(h);
    sd_model_free(m);
}

static void test_forward_reference(void) { check_forward(0); }
static void test_forward_norm_before_residual(void) { check_forward(1); }

// ---------------------------------------------------------------- greedy losslessness

static const sd_head *g_medusa;   // the Medusa head of the run_method calls, or NULL
static int g_bits = 5;            // the heads' bits per weight in memory (sd_method_env.head_bits)

// The drafter of `method` over session s in *d (NULL for ar), its cost curve
// in *cc when the method needs one: measured, or with fixed_step_ms > 0 a
// fixed one (fixed_step_ms + 1 ms a further node) so that a test does not
// hang on this machine's timings. Returns 0 or -1 (g_err).
static int make_drafter(const sd_model *m, const sd_head *h, const char *method, sd_session *s, double fixed_step_ms,
                        sd_method_report_fn report, void *user, sd_cost_curve **cc, sd_drafter **d) {
    sd_method me;
    if (sd_method_parse(method, &me, g_err, sizeof g_err) < 0) return -1;
    sd_method_env env = sd_method_env_default(m);
    env.head_eagle3 = h;
    env.head_medusa = g_medusa;
    env.head_bits = g_bits;
    env.pool = s ? sd_session_pool(s) : NULL;
    env.report = report;
    env.user = user;
    if (me.uses_cost_curve) {
        if (sd_cost_curve_new(cc, s, 16, g_err, sizeof g_err) < 0) return -1;
        for (int k = 1; fixed_step_ms > 0 && k <= 16; k++) sd_cost_curve_set(*cc, k, fixed_step_ms + 1.0 * (k - 1));
        env.cost = *cc;
    }
    return sd_method_make(&me, &env, d, g_err, sizeof g_err) < 0 ? -1 : 0;
}

static int run_method(const sd_model *m, const sd_head *h, const char *method, const int32_t *prompt, int np, int n,
                      sc_tokens *out, sd_gen_stats *st) {
    sd_session *s = sc_new_session(m, 256, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(m->hp.n_vocab, 0.0f, 1.0f, g_err, sizeof g_err);
    int rc = -1;
    sd_cost_curve *cc = NULL;
    sd_drafter *d = NULL;
    if (s && smp && make_drafter(m, h, method, s, 0.0, NULL, NULL, &cc, &d) == 0)
        rc = d ? sc_run_spec(s, smp, d, prompt, np, n, 32, out, st, g_err, sizeof g_err)
               : sc_run_plain(s, smp, prompt, np, n, out, st, g_err, sizeof g_err);
    sd_drafter_free(d);
    sd_cost_curve_free(cc);
    sd_sampler_free(smp);
    sd_session_free(s);
    return rc;
}

// The target's rows of the steps where the drafter drafts nothing (a server's
// budget gave it no room) wait unfused and are fused together at the next
// draft: that draft must equal the one of a drafter that drafted (and so
// fused) at every step, the text rewound on the way included.
static void test_followed_steps_fuse_later(void) {
    sd_model *m = synth();
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = random_head(m, 48, 11);
    CHECK(h, "%s", g_err);
    const int d = m->hp.n_embd, nv = m->hp.n_vocab, row = 3 * d;
    enum { NP = 300, STEPS = 30, CAP = 16 };   // (a prompt of more rows than wait unfused at most)
    sd_drafter *dr[2] = {NULL, NULL};
    sd_tree *t[2] = {NULL, NULL};
    for (int k = 0; k < 2 && h; k++) {
        CHECK(make_drafter(m, h, "eagle3:dyn:2-3-12", NULL, 0.0, NULL, NULL, NULL, &dr[k]) == 0, "%s", g_err);
        CHECK(sd_tree_new(&t[k], CAP, nv, g_err, sizeof g_err) == 0, "%s", g_err);
    }
    int32_t text[NP + STEPS];
    float *rows = malloc(sizeof(float) * (size_t)row * (NP + STEPS));
    sd_rng r;
    sd_rng_seed(&r, 5);
    for (int i = 0; i < (NP + STEPS) * row && rows; i++) rows[i] = (float)(sd_rng_uniform(&r) * 2.0 - 1.0);
    for (int i = 0; i < NP + STEPS; i++) text[i] = (int32_t)(sd_rng_uniform(&r) * nv) % nv;
    int ok = dr[0] && dr[1] && t[0] && t[1] && rows, n = NP, compared = 0;
    for (int k = 0; k < 2 && ok; k++)
        ok = sd_drafter_tell_prompt(dr[k], text, 0, NP - 1, rows, g_err, sizeof g_err) == 0;
    for (int step = 0; ok && step < STEPS - 1; step++) {
        if (step == 12) n -= 3;   // the text rewinds: the last rows are rewritten
        const int last = step % 5 == 4 || step == STEPS - 2;   // drafter 0 drafts only now and then
        for (int k = 0; k < 2 && ok; k++) {
            const int room = k == 1 || last ? CAP : 1;
            ok = sd_drafter_draft(dr[k], text, n, room, t[k], g_err, sizeof g_err) == 0;
        }
        if (ok && last) {
            int same = sd_tree_size(t[0]) == sd_tree_size(t[1]) && sd_tree_size(t[0]) > 1;
            for (int i = 0; same && i < sd_tree_size(t[0]); i++)
                same = sd_tree_token(t[0], i) == sd_tree_token(t[1], i) &&
                       sd_tree_parent(t[0], i) == sd_tree_parent(t[1], i) &&
                       fabsf(sd_tree_p(t[0], i) - sd_tree_p(t[1], i)) <= 1e-5f;
            CHECK(same, "step %d: the draft after steps without drafting differs (%d and %d nodes)", step,
                  sd_tree_size(t[0]), sd_tree_size(t[1]));
            compared++;
        }
        const int32_t path[1] = {0};
        for (int k = 0; k < 2 && ok; k++)
            ok = sd_drafter_tell(dr[k], t[k], path, 1, text[n], rows + (size_t)(n - 1) * row, g_err, sizeof g_err) == 0;
        n++;
    }
    CHECK(ok, "%s", g_err);
    CHECK(compared == 6, "drafts compared: %d", compared);
    // (the two drafters computed with the head's one shared pack, which outlives them)
    CHECK(h && h->e3_shared, "the drafters made no shared pack of the head's matrices");
    if (ok) {
        sd_drafter_free(dr[0]);
        dr[0] = NULL;
        CHECK(sd_drafter_draft(dr[1], text, n, CAP, t[1], g_err, sizeof g_err) == 0 && sd_tree_size(t[1]) > 1,
              "a drafter after the other is freed: %s", g_err);
    }
    for (int k = 0; k < 2; k++) {
        sd_drafter_free(dr[k]);
        sd_tree_destroy(t[k]);
    }
    free(rows);
    sd_head_free(h);
    sd_model_free(m);
}

static void check_lossless(const sd_model *m, const sd_head *h, const int32_t *prompt, int np, int n, const char *tag) {
    static const char *methods[] = {"eagle3:chain:4",        "eagle3:tree:3-2-1",          "eagle3:dyn:3-4-10",
                                    "eagle3:auto",           "auto",                       "ngram:2-4/eagle3:auto",
                                    "ngram:2-4+eagle3:auto", "eagle3:tree:3-2-1+ngram:1-3"};
    static sc_tokens ref, got;
    sd_gen_stats st;
    CHECK(run_method(m, h, "ar", prompt, np, n, &ref, &st) == 0, "%s", g_err);
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        int rc = run_method(m, h, methods[i], prompt, np, n, &got, &st);
        CHECK(rc == 0, "%s %s: %s", tag, methods[i], g_err);
        CHECK(rc != 0 || sc_same_tokens(&ref, &got), "%s %s: output differs from plain greedy", tag, methods[i]);
        if (rc == 0)
            printf("  %s %-18s %d tokens, drafted %d, accepted %d\n", tag, methods[i], got.n, st.n_draft_nodes,
                   st.n_draft_accepted);
    }
}

// The head's matrices in memory at 8, 5 and 4 bits per weight: every width
// drafts (the heads are small enough to agree with the target now and then)
// and stays lossless; another width is refused with the accepted ones named.
static void check_head_bits(const sd_model *m, const sd_head *h, const int32_t *prompt, int np) {
    static sc_tokens ref, got;
    sd_gen_stats st;
    CHECK(run_method(m, h, "ar", prompt, np, 60, &ref, &st) == 0, "%s", g_err);
    static const int bits[] = {8, 5, 4};
    for (int i = 0; i < 3; i++) {
        g_bits = bits[i];
        int rc = run_method(m, h, "eagle3:tree:3-2-1", prompt, np, 60, &got, &st);
        CHECK(rc == 0, "%d bits: %s", bits[i], g_err);
        CHECK(rc != 0 || sc_same_tokens(&ref, &got), "%d bits: output differs from plain greedy", bits[i]);
        CHECK(rc != 0 || st.n_draft_nodes > 0, "%d bits: nothing drafted", bits[i]);
        printf("  %d bits: drafted %d, accepted %d\n", bits[i], st.n_draft_nodes, st.n_draft_accepted);
    }
    g_bits = 6;
    int rc = run_method(m, h, "eagle3:chain:2", prompt, np, 8, &got, &st);
    CHECK(rc < 0 && strstr(g_err, "8, 5 or 4"), "6 bits: rc %d, '%s'", rc, g_err);
    g_bits = 5;
}

static void test_greedy_lossless_synthetic(void) {
    sd_model *m = synth();
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = random_head(m, 120, 3);
    CHECK(h, "%s", g_err);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 3 + (i * 37) % 300;
    if (h) check_lossless(m, h, prompt, 20, 60, "synthetic");
    if (h) check_head_bits(m, h, prompt, 20);
    sd_head_free(h);
    sd_model_free(m);
}

// The draft-vocabulary coverage counts every verified position once (the
// generated tokens after the first, which the prompt's forward chose) and
// counts those whose token the head's vocabulary holds.
static void test_vocab_coverage(void) {
    sd_model *m = synth();
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = random_head(m, 120, 3);
    sd_session *s = sc_new_session(m, 256, 2, g_err, sizeof g_err);
    sd_sampler *smp = sc_new_sampler(m->hp.n_vocab, 0.0f, 1.0f, g_err, sizeof g_err);
    sd_cost_curve *cc = NULL;
    sd_drafter *d = NULL;
    static sc_tokens got;
    sd_gen_stats st;
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 3 + (i * 37) % 300;
    // The head alone, then as the fallback of prompt lookup (which drafts at
    // some steps of this text): the head follows every step's full path either way.
    static const char *methods[] = {"eagle3:chain:3", "ngram:1-4/eagle3:chain:3"};
    for (int k = 0; k < 2; k++) {
        int rc = h && s && smp ? make_drafter(m, h, methods[k], s, 0.0, NULL, NULL, &cc, &d) : -1;
        CHECK(rc == 0 && d, "%s: %s", methods[k], g_err);
        if (rc != 0 || !d) break;
        sd_session_truncate(s, 0, g_err, sizeof g_err);
        CHECK(sc_run_spec(s, smp, d, prompt, 20, 60, 32, &got, &st, g_err, sizeof g_err) == 0, "%s", g_err);
        int64_t n_checked = -1, n_in = -1, want_in = 0;
        CHECK(sd_drafter_vocab_coverage(d, &n_checked, &n_in) == 1, "%s reports coverage", methods[k]);
        for (int i = 1; i < got.n; i++) want_in += h->t2d[got.tok[i]] >= 0;
        printf("  %s: coverage %lld of %lld positions (expected %lld of %d), %d forwards\n", methods[k],
               (long long)n_in, (long long)n_checked, (long long)want_in, got.n - 1, st.n_target_forwards);
        CHECK(n_checked == got.n - 1 && n_in == want_in, "%s: coverage %lld/%lld, expected %lld/%d", methods[k],
              (long long)n_in, (long long)n_checked, (long long)want_in, got.n - 1);
        CHECK(want_in > 0 && want_in < got.n - 1, "the test needs tokens both in and out of the draft vocabulary");
        sd_drafter_free(d);
        d = NULL;
    }
    // prompt lookup does draft on this text (so the fallback above had steps of both kinds)
    if (s && smp && make_drafter(m, h, "ngram:1-4", s, 0.0, NULL, NULL, &cc, &d) == 0 && d) {
        sd_session_truncate(s, 0, g_err, sizeof g_err);
        CHECK(sc_run_spec(s, smp, d, prompt, 20, 60, 32, &got, &st, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(st.n_draft_nodes > 0 && st.n_draft_accepted > 0, "prompt lookup drafted %d, accepted %d",
              st.n_draft_nodes, st.n_draft_accepted);
    }
    int64_t a = 1, b = 1;
    CHECK(sd_drafter_vocab_coverage(NULL, &a, &b) == 0 && a == 0 && b == 0, "no drafter: no coverage");
    sd_drafter_free(d);
    sd_cost_curve_free(cc);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_head_free(h);
    sd_model_free(m);
}

static void test_greedy_lossless_default_model(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = 2048;
    sd_head *h = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (h) {
        sd_head_init(h, 9);
        const char *text = "The three primary colours are";
        int32_t prompt[64];
        int np = sd_tokenize(sd_model_tokenizer(m), text, strlen(text), 1, 0, prompt, 64);
        check_lossless(m, h, prompt, np, 24, "SmolLM2");
    }
    sd_head_free(h);
    sd_model_free(m);
}

// eagle3:auto starts from the head's recorded held-back agreement: a head
// that agreed 2% of the time starts by not drafting, one that agreed 98% of
// the time starts by drafting (same head weights, same cost).
static void on_report(void *user, const char *line) {
    int *n = user;
    const char *k = strstr(line, "tree auto");
    if (k && (k = strstr(k, "n=")) && *n < 0) *n = atoi(k + 2);   // the first shape
}

static int first_auto_nodes(const sd_model *m, sd_head *h, const char *agree) {
    snprintf(h->note, sizeof h->note, "steps=10\neval_agree=%s\n", agree);
    sd_session *s = sc_new_session(m, 256, 2, g_err, sizeof g_err);
    sd_cost_curve *cc = NULL;
    sd_drafter *d = NULL;
    int n = -1;
    // a memory-bound-like target, 10 ms a step: the head's own timed cost is a small fraction of it
    if (s && make_drafter(m, h, "eagle3:auto", s, 10.0, on_report, &n, &cc, &d) < 0) n = -2;
    sd_drafter_free(d);
    sd_cost_curve_free(cc);
    sd_session_free(s);
    return n;
}

static void test_auto_prior_from_head(void) {
    sd_model *m = synth();
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head *h = random_head(m, 120, 5);
    CHECK(h, "%s", g_err);
    if (h) {
        const int lo = first_auto_nodes(m, h, "0.0200,0.0100,0.0100");
        const int hi = first_auto_nodes(m, h, "0.9800,0.9500,0.9500");
        printf("  first automatic tree: %d nodes at agreement 0.02, %d at 0.98\n", lo, hi);
        CHECK(lo == 1, "a head that rarely agrees starts without drafting (n=%d): %s", lo, g_err);
        CHECK(hi >= 2, "a head that nearly always agrees starts by drafting (n=%d): %s", hi, g_err);
    }
    sd_head_free(h);
    sd_model_free(m);
}

// Medusa: random heads draft, the output stays plain greedy's.
static void test_medusa_greedy_lossless(void) {
    sd_model *m = synth();
    CHECK(m, "%s", g_err);
    if (!m) return;
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_MEDUSA);
    hp.n_draft_vocab = 150;
    sd_head *h = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (h) {
        sd_head_init(h, 21);
        int32_t prompt[16];
        for (int i = 0; i < 16; i++) prompt[i] = 5 + (i * 53) % 300;
        g_medusa = h;
        static sc_tokens ref, got;
        sd_gen_stats st;
        CHECK(run_method(m, NULL, "ar", prompt, 16, 50, &ref, &st) == 0, "%s", g_err);
        const char *methods[] = {"medusa:3-2-2-1", "medusa:1-1-1-1", "medusa:4"};
        for (int i = 0; i < 3; i++) {
            int rc = run_method(m, NULL, methods[i], prompt, 16, 50, &got, &st);
            CHECK(rc == 0 && sc_same_tokens(&ref, &got), "%s: %s", methods[i], rc ? g_err : "output differs");
            printf("  %-16s drafted %d, accepted %d\n", methods[i], st.n_draft_nodes, st.n_draft_accepted);
            CHECK(rc != 0 || st.n_draft_nodes > 0, "%s drafted nothing", methods[i]);
        }
        g_medusa = NULL;
        sd_method me;
        CHECK(sd_method_parse("medusa:2-2-2-2-2-2-2-2-2", &me, g_err, sizeof g_err) < 0, "9 widths accepted");
        CHECK(sd_method_parse("medusa:3-2", &me, g_err, sizeof g_err) == 0 && me.needs_head == SD_HEAD_MEDUSA, "%s", g_err);
        sd_method_env env = sd_method_env_default(m);
        sd_drafter *d = NULL;
        CHECK(sd_method_make(&me, &env, &d, g_err, sizeof g_err) < 0 && strstr(g_err, "Medusa head"), "%s", g_err);
        env.head_medusa = h;
        CHECK(sd_method_parse("medusa:2-2-2-2-2", &me, g_err, sizeof g_err) == 0, "%s", g_err);
        CHECK(sd_method_make(&me, &env, &d, g_err, sizeof g_err) < 0 && strstr(g_err, "4 heads"), "5 depths, 4 heads: %s", g_err);
    }
    sd_head_free(h);
    sd_model_free(m);
}

// The head shipped in heads/ for the default model: found by sd_head_find,
// lossless with every shape, and its drafts are accepted.
static void test_shipped_head(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "%s", g_err);
        return;
    }
    char path[1024];
    int rc = sd_head_find(m, "heads", path, sizeof path, g_err, sizeof g_err);
    CHECK(rc == 1, "no head in heads/ for %s (rc %d: %s)", DEFAULT_MODEL, rc, g_err);
    sd_head *h = NULL;
    if (rc == 1) CHECK(sd_head_load(&h, path, m, g_err, sizeof g_err) == 0, "%s", g_err);
    if (h) {
        char desc[512];
        sd_head_describe(h, desc, sizeof desc);
        printf("  %s: %s\n", path, desc);
        const char *text = "<|im_start|>user\nExplain what a Python list comprehension is.<|im_end|>\n<|im_start|>assistant\n";
        int32_t prompt[128];
        int np = sd_tokenize(sd_model_tokenizer(m), text, strlen(text), 1, 1, prompt, 128);
        check_lossless(m, h, prompt, np, 40, "shipped");
        static sc_tokens got;
        sd_gen_stats st;
        CHECK(run_method(m, h, "eagle3:chain:3", prompt, np, 40, &got, &st) == 0, "%s", g_err);
        CHECK(st.n_draft_accepted > 0 && st.mean_accepted > 1.1,
              "the shipped head's drafts are hardly accepted: tau %.2f (%d of %d)", st.mean_accepted,
              st.n_draft_accepted, st.n_draft_nodes);
    }
    sd_head_free(h);
    sd_model_free(m);
}

// Method strings and missing heads.
static void test_method_errors(void) {
    sd_method me;
    CHECK(sd_method_parse("eagle3:chain:4", &me, g_err, sizeof g_err) == 0 && me.kind == SD_METHOD_EAGLE3 &&
              me.needs_head == SD_HEAD_EAGLE3 && !me.needs_draft_model && me.tree_nodes == 5,
          "eagle3:chain:4: %s", g_err);
    CHECK(sd_method_parse("eagle3:auto", &me, g_err, sizeof g_err) == 0 && me.uses_cost_curve, "eagle3:auto");
    CHECK(sd_method_parse("eagle3:wide", &me, g_err, sizeof g_err) < 0 && strstr(g_err, "eagle3:SHAPE"), "%s", g_err);
    CHECK(sd_method_parse("eagle3", &me, g_err, sizeof g_err) < 0 && strstr(g_err, "needs arguments"), "%s", g_err);
    CHECK(sd_method_parse("eagle3:chain:4+ngram:3-8", &me, g_err, sizeof g_err) == 0 && me.kind == SD_METHOD_MERGE &&
              me.needs_head == SD_HEAD_EAGLE3,
          "merge with a head: %s", g_err);
    CHECK(sd_method_parse("auto+eagle3:chain:2", &me, g_err, sizeof g_err) < 0 && strstr(g_err, "merged"), "%s", g_err);
    CHECK(sd_method_parse("ngram:3-8/eagle3:chain:2", &me, g_err, sizeof g_err) == 0 && me.kind == SD_METHOD_FIRST &&
              me.needs_head == SD_HEAD_EAGLE3 && me.tree_nodes == 33,
          "fallback: %s (kind %d, %d nodes)", g_err, me.kind, me.tree_nodes);
    CHECK(sd_method_parse("eagle3:chain:2/ngram:3-8", &me, g_err, sizeof g_err) < 0 && strstr(g_err, "last"), "%s",
          g_err);
    CHECK(sd_method_parse("ngram:3-8/eagle3:chain:2/medusa:2-2", &me, g_err, sizeof g_err) < 0 &&
              strstr(g_err, "one head"),
          "%s", g_err);
    CHECK(sd_method_parse("ngram:3-8/chain:2+ngram:2-4", &me, g_err, sizeof g_err) < 0 && strstr(g_err, "not both"),
          "%s", g_err);
    sd_model *m = synth();
    if (!m) return;
    CHECK(sd_method_parse("eagle3:chain:4", &me, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_method_env env = sd_method_env_default(m);
    sd_drafter *d = NULL;
    CHECK(sd_method_make(&me, &env, &d, g_err, sizeof g_err) < 0 && strstr(g_err, "--head"), "no head: %s", g_err);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_forward_reference);
    T_RUN(test_forward_norm_before_residual);
    T_RUN(test_eval_last_same_bits);
    T_RUN(test_method_errors);
    T_RUN(test_greedy_lossless_synthetic);
    T_RUN(test_followed_steps_fuse_later);
    T_RUN(test_vocab_coverage);
    T_RUN(test_auto_prior_from_head);
    T_RUN(test_medusa_greedy_lossless);
    T_RUN(test_greedy_lossless_default_model);
    T_RUN(test_shipped_head);
    T_EXIT();
}

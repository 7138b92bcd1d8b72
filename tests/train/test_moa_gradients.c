// test_moa_gradients.c - the MoA drafter's gradient (src/train/moa_train.c):
// the gradient sd_trainer_loss adds for an MoA head against central finite
// differences of the loss, for random entries of EVERY tensor (LSA, its
// projection, SA, CA), with TLI 0, TLI 1 (the backward passes through a
// frozen target layer; also on a qwen2 target, through NEOX RoPE and the
// q/k/v biases) and without LSA; a deliberately wrong backward (every
// layer's attention residual gradient dropped) that the same check rejects;
// the gradient is added (not stored) and has the same bits for 1 and 2
// threads; the loss falls when the drafter learns a planted pattern; TLI > 0
// on a target with a scaled RoPE is refused with the reason; full-text SA
// (sa_full) through the same checks.
//
// Tiny shapes on a synthetic target (d = 16, 2 layers, 2 heads of 8, one KV
// head: K,V rows of 16 floats a layer), T = 24 (two or more blocks: k is
// 6..15), V' = 24. Features (the K,V rows and target states) are random.
// Error bars as test_gradients.c: an entry passes when |fd - grad| <= 1e-3
// max|grad of its tensor| + 1e-2 |grad| + 1e-5 (eps 1e-2; 1e-5: the float loss's noise).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "head/head.h"
#include "head/moa.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "t.h"
#include "train/moa_train.h"
#include "train/train.h"
#include "train/train_impl.h"

#define T_SEQ 24
#define NT 4

static char g_err[512];
static sd_rng g_rng;
static sd_model *g_m, *g_mq;   // llama and qwen2 (NEOX RoPE, q/k/v biases) targets

static float urand(void) { return (float)(2.0 * sd_rng_uniform(&g_rng) - 1.0); }

// The tiny target of these tests (arch "llama" or "qwen2"), written and loaded;
// rope_scaling: a linear-scaled RoPE (factor 4) or none.
static sd_model *synth_target(const char *arch, int rope_scaling) {
    synth_params p = synth_default_params();
    p.arch = arch;
    p.n_embd = 16;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 32;
    if (rope_scaling) p.rope_scaling_type = "linear", p.rope_scaling_factor = 4.0f;
    char path[128];
    snprintf(path, sizeof path, "/tmp/specdec_test_moa_grad_%d.gguf", (int)getpid());
    sd_model *m = NULL;
    if (synth_write(path, &p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

static sd_head *make_head(const sd_model *m, int tli, int no_lsa, int ca_hidden) {
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_MOA);
    hp.n_ff = 32;
    hp.n_draft_vocab = 24;
    hp.moa_tli = tli;
    hp.moa_no_lsa = no_lsa;
    hp.moa_ca_hidden = ca_hidden & 1;   // bit 1: SA reads the state too (sa_hidden)
    hp.moa_sa_hidden = ca_hidden >> 1 & 1;
    hp.moa_sa_full = ca_hidden >> 2 & 1;   // bit 2: SA sees the whole text (sa_full)
    hp.moa_lsa_n_ff = 24;
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    for (int i = 0; i < h->n_t; i++) {
        float *w = sd_head_w(h, i);
        const size_t n = (size_t)(h->t[i].ne0 * h->t[i].ne1);
        const float a = h->t[i].is_norm ? 0.3f : 1.0f / sqrtf((float)h->t[i].ne0);
        // LSA's path to the loss is long (mean over layers, projection, CA's keys): a larger projection and
        // larger CA keys and values keep its gradients well above the finite differences' float noise
        const float big = i == SD_MOA_PROJ || i == SD_MOA_CA + SD_MOA_K || i == SD_MOA_CA + SD_MOA_V ? 4.0f : 1.0f;
        for (size_t j = 0; j < n; j++) w[j] = h->t[i].is_norm ? 1.0f + a * urand() : big * a * urand();
    }
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (7 * i + 3) % 320;
    if (sd_head_set_vocab(h, ids, 24, g_err, sizeof g_err) < 0) {
        sd_head_free(h);
        return NULL;
    }
    return h;
}

typedef struct seq_buf {
    int32_t tok[T_SEQ], ids[T_SEQ * NT];
    float *feats, p[T_SEQ * NT];
    sd_train_seq seq;
} seq_buf;

static int make_seq(seq_buf *b, const sd_head *h) {
    const int nf = sd_moa_n_feat(h);
    b->feats = malloc(sizeof(float) * T_SEQ * (size_t)nf);
    if (!b->feats) return -1;
    for (int t = 0; t < T_SEQ; t++) {
        b->tok[t] = h->d2t[sd_rng_next(&g_rng) % 24];
        for (int i = 0; i < nf; i++) b->feats[t * nf + i] = 1.5f * urand();
        double s = 0;
        for (int i = 0; i < NT; i++) {
            const uint64_t r = sd_rng_next(&g_rng);
            b->ids[t * NT + i] = r % 5 == 0 ? (int32_t)(r % 320) : h->d2t[r % 24];
            b->p[t * NT + i] = (float)(0.1 + sd_rng_uniform(&g_rng));
            s += b->p[t * NT + i];
        }
        for (int i = 0; i < NT; i++) b->p[t * NT + i] = (float)(b->p[t * NT + i] / s);
    }
    b->seq = (sd_train_seq){.T = T_SEQ, .tokens = b->tok, .feats = b->feats, .top_ids = b->ids, .top_p = b->p,
                            .topk = NT};
    return 0;
}

// Worst |fd - grad| / bar over n_pick random entries of every tensor.
static double fd_head(sd_trainer *tr, sd_head *h, const sd_train_seq *seq, const float *grad, int n_pick,
                      int verbose, const char **worst_t) {
    double worst = 0;
    for (int ti = 0; ti < h->n_t; ti++) {
        float *w = sd_head_w(h, ti);
        const float *g = grad + h->t[ti].off;
        const int n = (int)(h->t[ti].ne0 * h->t[ti].ne1);
        double gmax = 0, tw = 0;
        for (int i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
        for (int t = 0; t < n_pick; t++) {
            const int i = (int)(sd_rng_next(&g_rng) % (uint64_t)n);
            const float p0 = w[i];
            w[i] = p0 + 1e-2f;
            const double hp = (double)w[i] - p0, lp = sd_trainer_loss(tr, seq, NULL, NULL, g_err, sizeof g_err);
            w[i] = p0 - 1e-2f;
            const double hm = p0 - (double)w[i], lm = sd_trainer_loss(tr, seq, NULL, NULL, g_err, sizeof g_err);
            w[i] = p0;
            const double fd = (lp - lm) / (hp + hm);
            // (+ 1e-5: the differences' own noise, the float loss's rounding (~1e-7) over 2 eps, for a
            // tensor whose gradient is tiny everywhere)
            const double r = fabs(fd - g[i]) / (1e-3 * gmax + 1e-2 * fabs(g[i]) + 1e-5);
            if (!(r <= tw)) tw = r;
        }
        if (verbose) printf("  info: %-26s max|grad| %.3g  worst |fd - grad| / bar %.3g\n", h->t[ti].name, gmax, tw);
        if (!(tw <= worst)) {
            worst = tw;
            *worst_t = h->t[ti].name;
        }
    }
    return worst;
}

static double check(sd_model *m, int tli, int no_lsa, int ca_hidden, int fault, int verbose) {
    sd_head *h = make_head(m, tli, no_lsa, ca_hidden);
    sd_trainer *tr = NULL;
    seq_buf sb = {0};
    float *grad = NULL;
    double w = NAN;
    if (!h || sd_trainer_new(&tr, h, m, T_SEQ, 1, NULL, g_err, sizeof g_err) < 0 || make_seq(&sb, h) < 0 ||
        !(grad = calloc(h->n_w, sizeof(float)))) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    sd_trainer_set_fault(tr, fault);
    sd_trainer_set_moa_sa_full(tr, 1.0f, 0);   // (sa_full: every sequence sees the whole text)
    sd_train_stats st;
    const double loss = sd_trainer_loss(tr, &sb.seq, grad, &st, g_err, sizeof g_err);
    CHECK(loss > 0 && isfinite(loss), "loss %g: %s", loss, g_err);
    CHECK(st.n[0] > 0 && st.n[1] > 0, "rows at depths 0 and 1 are scored (%lld, %lld)", (long long)st.n[0],
          (long long)st.n[1]);
    const char *wt = "?";
    w = fd_head(tr, h, &sb.seq, grad, 6, verbose, &wt);
    printf("  %s, TLI %d%s%s%s%s%s: loss %.4f, worst ratio %.3g (%s)\n", m == g_mq ? "qwen2" : "llama", tli,
           no_lsa ? " no-LSA" : "", ca_hidden & 1 ? " ca-hidden" : "", ca_hidden & 2 ? " sa-hidden" : "",
           ca_hidden & 4 ? " sa-full" : "", fault ? " (residual gradient dropped)" : "", loss, w, wt);
out:
    free(grad);
    free(sb.feats);
    sd_trainer_free(tr);
    sd_head_free(h);
    return w;
}

static void test_moa_grad(void) {
    if (!g_m || !g_mq) SKIP("no target: %.200s", g_err);
    // TLI 1 on the qwen2 target: the backward turns through NEOX RoPE and the q/k/v biases
    // no LSA: the reduced features (the mean row, the TLI layer's rows; tli 1 also on qwen2)
    // ca-hidden: CA's keys and values also read the target's state (TLI 0: the final normed one; TLI 1: the
    // state entering the last layer), through ca.hidden.weight
    // (column 3: 1 ca-hidden, 2 sa-hidden: SA's input adds the last verified position's state; 3 both)
    static const int cfg[11][4] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {1, 0, 1, 0}, {1, 1, 0, 0}, {1, 1, 1, 0},
                                   {0, 1, 0, 1}, {1, 1, 1, 1}, {1, 0, 0, 1}, {0, 1, 0, 2}, {1, 1, 1, 3}};
    for (int c = 0; c < 11; c++) {
        const double w = check(cfg[c][2] ? g_mq : g_m, cfg[c][0], cfg[c][1], cfg[c][3], 0, c == 1);
        CHECK(w <= 1.0,
              "%s TLI %d no-LSA %d ca-hidden %d: the gradient disagrees with finite differences (worst ratio %.3g)",
              cfg[c][2] ? "qwen2" : "llama", cfg[c][0], cfg[c][1], cfg[c][3], w);
    }
}

static void test_moa_grad_catches_fault(void) {
    if (!g_m) SKIP("no target: %.200s", g_err);
    const double w = check(g_m, 1, 0, 0, SD_TR_FAULT_NO_RESID, 0);
    CHECK(w > 10.0, "a backward without the residual gradient passed the check (worst ratio %.3g)", w);
}

// Added, not stored; same bits with 1 and 2 threads.
static void test_moa_grad_contract(void) {
    if (!g_m) SKIP("no target: %.200s", g_err);
    sd_head *h = make_head(g_m, 1, 0, 0);
    seq_buf sb = {0};
    sd_pool *pool = NULL;
    sd_trainer *t1 = NULL, *t2 = NULL;
    float *g1 = NULL, *g2 = NULL;
    if (!h || make_seq(&sb, h) < 0 || !(pool = sd_pool_new(2)) ||
        sd_trainer_new(&t1, h, g_m, T_SEQ, 1, NULL, g_err, sizeof g_err) < 0 ||
        sd_trainer_new(&t2, h, g_m, T_SEQ, 1, pool, g_err, sizeof g_err) < 0) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    g1 = calloc(h->n_w, sizeof(float));
    g2 = calloc(h->n_w, sizeof(float));
    const double l1 = sd_trainer_loss(t1, &sb.seq, g1, NULL, g_err, sizeof g_err);
    const double l2 = sd_trainer_loss(t2, &sb.seq, g2, NULL, g_err, sizeof g_err);
    CHECK(l1 == l2 && !memcmp(g1, g2, sizeof(float) * h->n_w), "1 and 2 threads differ (loss %.9g vs %.9g)", l1, l2);
    sd_trainer_loss(t1, &sb.seq, g1, NULL, g_err, sizeof g_err);
    int twice = 1;
    for (size_t i = 0; i < h->n_w; i++) twice &= fabsf(g1[i] - 2 * g2[i]) <= 1e-5f * (1 + fabsf(g2[i]));
    CHECK(twice, "a second call did not add the same gradient again");
    const double l0 = sd_trainer_loss(t1, &sb.seq, NULL, NULL, g_err, sizeof g_err);
    CHECK(l0 == l1, "the loss without the gradient differs (%.9g vs %.9g)", l0, l1);
out:
    free(g1);
    free(g2);
    sd_trainer_free(t1);
    sd_trainer_free(t2);
    sd_pool_free(pool);
    free(sb.feats);
    sd_head_free(h);
}

// The target's K rows of a TLI layer sit at positions pos0.. (the MoA cache
// keeps a window's rows as the target cached them): rows turned by a further
// D positions with pos0 = D give the loss and gradient of the unturned rows
// at pos0 = 0 (RoPE sees only relative positions); the turned rows read at
// pos0 = 0, as a trainer that ignored pos0 would, give another loss.
static void pos0_case(sd_model *m) {
    sd_head *h = make_head(m, 1, 1, 0);
    sd_trainer *tr = NULL;
    seq_buf sb = {0};
    float *g0 = NULL, *g1 = NULL, *turned = NULL, *cs = NULL, *row = NULL;
    if (!h || sd_trainer_new(&tr, h, m, T_SEQ, 1, NULL, g_err, sizeof g_err) < 0 || make_seq(&sb, h) < 0) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    const int nf = sd_moa_n_feat(h), ekv = h->hp.moa_kv_width, hd = m->hp.head_dim, nkv = m->hp.n_head_kv, D = 37;
    g0 = calloc(h->n_w, sizeof(float));
    g1 = calloc(h->n_w, sizeof(float));
    turned = malloc(sizeof(float) * T_SEQ * (size_t)nf);
    cs = malloc(sizeof(float) * (size_t)(D + 1) * (size_t)hd);
    row = malloc(sizeof(float) * (size_t)nkv * (size_t)hd);
    if (!g0 || !g1 || !turned || !cs || !row) goto out;
    memcpy(turned, sb.feats, sizeof(float) * T_SEQ * (size_t)nf);
    sd_tr_rope_table(cs, D + 1, hd, m->hp.rope_base);
    const int32_t posD = D;
    for (int t = 0; t < T_SEQ; t++) {   // the TLI layer's K: slot 1 of the K,V part
        float *k = turned + (size_t)t * nf + ekv;
        memcpy(row, k, sizeof(float) * (size_t)nkv * hd);
        sd_tr_rope(1, nkv, hd, &posD, cs, row, 0, m->hp.rope_type == SD_ROPE_NEOX);
        memcpy(k, row, sizeof(float) * (size_t)nkv * hd);
    }
    const double l0 = sd_trainer_loss(tr, &sb.seq, g0, NULL, g_err, sizeof g_err);
    sd_train_seq sq = sb.seq;
    sq.feats = turned;
    sq.pos0 = D;
    const double l1 = sd_trainer_loss(tr, &sq, g1, NULL, g_err, sizeof g_err);
    sq.pos0 = 0;
    const double lw = sd_trainer_loss(tr, &sq, NULL, NULL, g_err, sizeof g_err);
    double gd = 0, gm = 0;
    for (size_t i = 0; i < h->n_w; i++) gd = fmax(gd, fabs(g0[i] - g1[i])), gm = fmax(gm, fabs(g0[i]));
    printf("  %s: loss %.6f at pos0 0, %.6f turned by %d at pos0 %d, %.6f turned at pos0 0; gradient max diff %.2g of %.2g\n",
           m == g_mq ? "qwen2" : "llama", l0, l1, D, D, lw, gd, gm);
    CHECK(fabs(l1 - l0) <= 1e-5 * fabs(l0) && gd <= 1e-4 * gm, "pos0 %d: loss %.9g vs %.9g, gradient diff %.3g", D,
          l1, l0, gd);
    CHECK(fabs(lw - l0) > 2e-4 * fabs(l0), "turned rows at pos0 0 should change the loss (%.9g vs %.9g)", lw, l0);
out:
    free(g0);
    free(g1);
    free(turned);
    free(cs);
    free(row);
    free(sb.feats);
    sd_trainer_free(tr);
    sd_head_free(h);
}

static void test_moa_tli_pos0(void) {
    if (!g_m || !g_mq) SKIP("no target: %.200s", g_err);
    pos0_case(g_m);
    pos0_case(g_mq);
}

// Full-text SA (sa_full): the gradient against finite differences with every
// sequence seeing the whole text (LSA TLI 0 and 1, qwen2 TLI 1 without LSA,
// no LSA with ca_hidden); the wrong backward still caught; at p = 0 the loss
// and gradient are those of the bit cleared, at p = 1 another loss; the
// curriculum's draw: about p of the sequences, the same for the same salt;
// sa_full with sa_hidden refused with the reason. (Run last: the earlier
// tests' random draws stay as they were.)
static void test_moa_grad_sa_full(void) {
    if (!g_m || !g_mq) SKIP("no target: %.200s", g_err);
    static const int cfg[4][4] = {{0, 0, 0, 4}, {1, 0, 0, 4}, {1, 1, 1, 4}, {0, 1, 0, 5}};
    for (int c = 0; c < 4; c++) {
        const double w = check(cfg[c][2] ? g_mq : g_m, cfg[c][0], cfg[c][1], cfg[c][3], 0, 0);
        CHECK(w <= 1.0, "sa_full %s TLI %d no-LSA %d: the gradient disagrees with finite differences (worst %.3g)",
              cfg[c][2] ? "qwen2" : "llama", cfg[c][0], cfg[c][1], w);
    }
    const double wf = check(g_m, 1, 0, 4, SD_TR_FAULT_NO_RESID, 0);
    CHECK(wf > 10.0, "sa_full: a backward without the residual gradient passed (worst ratio %.3g)", wf);
    // p = 0: the bit cleared's loss and gradient, bit for bit; p = 1: another loss
    sd_head *h = make_head(g_m, 1, 1, 4);
    sd_trainer *tr = NULL;
    seq_buf sb = {0};
    float *g0 = NULL, *g1 = NULL;
    if (!h || make_seq(&sb, h) < 0 || sd_trainer_new(&tr, h, g_m, T_SEQ, 1, NULL, g_err, sizeof g_err) < 0 ||
        !(g0 = calloc(h->n_w, sizeof(float))) || !(g1 = calloc(h->n_w, sizeof(float)))) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    const double lp0 = sd_trainer_loss(tr, &sb.seq, g0, NULL, g_err, sizeof g_err);
    h->hp.moa_sa_full = 0;
    const double loff = sd_trainer_loss(tr, &sb.seq, g1, NULL, g_err, sizeof g_err);
    h->hp.moa_sa_full = 1;
    CHECK(lp0 == loff && !memcmp(g0, g1, sizeof(float) * h->n_w), "p 0: loss %.9g, the bit cleared %.9g", lp0, loff);
    sd_trainer_set_moa_sa_full(tr, 1.0f, 0);
    const double lp1 = sd_trainer_loss(tr, &sb.seq, NULL, NULL, g_err, sizeof g_err);
    printf("  sa_full: loss %.6f at p 0 (= %.6f without it), %.6f at p 1\n", lp0, loff, lp1);
    CHECK(fabs(lp1 - lp0) > 1e-4 * fabs(lp0), "p 1 should change the loss (%.9g vs %.9g)", lp1, lp0);
    // the draw
    int n_in = 0, same = 1, n_other = 0;
    for (int s = 0; s < 200; s++) {
        int32_t tok[8];
        for (int i = 0; i < 8; i++) tok[i] = (int32_t)(sd_rng_next(&g_rng) % 320);
        const int d = sd_moa_sa_full_draw(tok, 8, 17, 0.5f);
        n_in += d;
        same &= d == sd_moa_sa_full_draw(tok, 8, 17, 0.5f);
        n_other += d != sd_moa_sa_full_draw(tok, 8, 18, 0.5f);
        same &= sd_moa_sa_full_draw(tok, 8, 17, 1.0f) == 1 && sd_moa_sa_full_draw(tok, 8, 17, 0.0f) == 0;
    }
    printf("  sa_full draw at p 0.5: %d of 200; %d differ with another salt\n", n_in, n_other);
    CHECK(n_in >= 70 && n_in <= 130 && same && n_other >= 60, "draw: %d of 200 at p 0.5, repeatable %d, %d differ",
          n_in, same, n_other);
    // with sa_hidden: refused
    sd_head_hp hp = sd_head_default_hp(g_m, SD_HEAD_MOA);
    hp.n_draft_vocab = 24;
    hp.moa_sa_hidden = hp.moa_sa_full = 1;
    sd_head *bad = NULL;
    g_err[0] = 0;
    const int rb = sd_head_new(&bad, &hp, g_err, sizeof g_err);
    CHECK(rb < 0 && strstr(g_err, "sa_hidden"), "sa_full with sa_hidden: %d (%s)", rb, g_err);
    sd_head_free(bad);
out:
    free(g0);
    free(g1);
    free(sb.feats);
    sd_trainer_free(tr);
    sd_head_free(h);
}

// TLI > 0 through a scaled RoPE is refused with the reason (TLI 0 trains).
static void test_moa_refuses_scaled_rope(void) {
    sd_model *m = synth_target("llama", 1);
    if (!m) SKIP("no scaled target: %.200s", g_err);
    sd_trainer *tr = NULL;
    sd_head *h1 = make_head(m, 1, 0, 0), *h0 = make_head(m, 0, 0, 0);
    g_err[0] = 0;
    const int r1 = h1 ? sd_trainer_new(&tr, h1, m, T_SEQ, 1, NULL, g_err, sizeof g_err) : 0;
    CHECK(h1 && r1 < 0 && strstr(g_err, "scale") && strstr(g_err, "TLI 0"), "TLI 1: %d (%s)", r1, g_err);
    sd_trainer_free(tr);
    tr = NULL;
    const int r0 = h0 ? sd_trainer_new(&tr, h0, m, T_SEQ, 1, NULL, g_err, sizeof g_err) : -1;
    CHECK(r0 == 0, "TLI 0 on the scaled target: %s", g_err);
    sd_trainer_free(tr);
    sd_head_free(h1);
    sd_head_free(h0);
    sd_model_free(m);
}

int main(void) {
    sd_rng_seed(&g_rng, 5);
    g_m = synth_target("llama", 0);
    g_mq = synth_target("qwen2", 0);
    T_RUN(test_moa_grad);
    T_RUN(test_moa_grad_catches_fault);
    T_RUN(test_moa_grad_contract);
    T_RUN(test_moa_refuses_scaled_rope);
    T_RUN(test_moa_tli_pos0);
    T_RUN(test_moa_grad_sa_full);
    sd_model_free(g_m);
    sd_model_free(g_mq);
    T_EXIT();
}

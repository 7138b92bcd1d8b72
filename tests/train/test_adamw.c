// test_adamw.c - AdamW over a head's parameters (src/train/train.h,
// adamw.c): the learning-rate schedule (linear warm-up, cosine to lr/10),
// one step against a double-precision computation of the formula, weight
// decay on matrices only (not on norm gains nor biases), global-norm
// clipping, the AVX2 update against its scalar reference (same bits), and
// a run stopped and resumed from its state giving the same bits as one
// run straight through.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/head.h"
#include "t.h"
#include "train/train.h"
#include "train/train_impl.h"

static char g_err[256];
static sd_rng g_rng;

static float urand(void) { return (float)(2.0 * sd_rng_uniform(&g_rng) - 1.0); }

// A head built from hyper-parameters alone (no target model needed).
static sd_head *tiny_head(int type) {
    sd_head_hp hp;
    memset(&hp, 0, sizeof hp);
    hp.type = type;
    hp.n_embd = 8;
    hp.n_head = 2;
    hp.n_head_kv = 1;
    hp.head_dim = 4;
    hp.n_ff = 12;
    hp.n_medusa = 2;
    hp.n_draft_vocab = 10;
    hp.rms_eps = 1e-5f;
    hp.rope_base = 10000.0f;
    hp.extract[0] = 0, hp.extract[1] = 1, hp.extract[2] = 2;
    hp.target_n_vocab = 20;
    hp.target_n_embd = 8;
    hp.target_n_layer = 4;
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    sd_head_init(h, 5);
    for (int i = 0; i < h->n_t; i++)   // biases non-zero, so that decay on them would show
        if (!h->t[i].is_norm && h->t[i].ne1 == 1)
            for (int64_t j = 0; j < h->t[i].ne0; j++) sd_head_w(h, i)[j] = 0.5f + 0.1f * urand();
    return h;
}

static void test_lr_schedule(void) {
    sd_adamw o;
    CHECK(sd_adamw_init(&o, 4, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(o.beta1 == 0.9f && o.beta2 == 0.95f && o.eps == 1e-8f && o.weight_decay == 0.0f && o.t == 0,
          "defaults");
    o.lr = 2e-3f;
    o.warmup = 10;
    o.total = 110;
    CHECK(fabsf(sd_adamw_lr(&o, 0) - 2e-4f) < 1e-9f, "lr(0) = %g", sd_adamw_lr(&o, 0));
    CHECK(fabsf(sd_adamw_lr(&o, 4) - 1e-3f) < 1e-9f, "lr(4) = %g", sd_adamw_lr(&o, 4));
    CHECK(fabsf(sd_adamw_lr(&o, 9) - 2e-3f) < 1e-9f, "lr(9) = %g", sd_adamw_lr(&o, 9));
    CHECK(fabsf(sd_adamw_lr(&o, 10) - 2e-3f) < 1e-9f, "lr(10) = %g", sd_adamw_lr(&o, 10));
    CHECK(fabsf(sd_adamw_lr(&o, 60) - 1.1e-3f) < 1e-8f, "lr(60) = %g (half-way: (lr + lr/10) / 2)",
          sd_adamw_lr(&o, 60));
    CHECK(fabsf(sd_adamw_lr(&o, 110) - 2e-4f) < 1e-9f && fabsf(sd_adamw_lr(&o, 500) - 2e-4f) < 1e-9f,
          "lr at and after total: %g %g", sd_adamw_lr(&o, 110), sd_adamw_lr(&o, 500));
    int mono = 1;
    for (int t = 10; t < 120; t++) mono &= sd_adamw_lr(&o, t + 1) <= sd_adamw_lr(&o, t);
    CHECK(mono, "the decay is not monotone");
    o.total = 0;
    CHECK(sd_adamw_lr(&o, 1000) == 2e-3f, "no decay when total <= warmup");
    sd_adamw_free(&o);
}

// Three steps of random gradients against the formula in double; matrices
// decay, gains and biases do not (with zero gradient a gain or bias stays
// put, a matrix shrinks by exactly the factor (1 - lr wd)).
static void test_step_formula_and_decay(void) {
    const int types[2] = {SD_HEAD_EAGLE3, SD_HEAD_MEDUSA};
    for (int ty = 0; ty < 2; ty++) {
        sd_head *h = tiny_head(types[ty]);
        CHECK(h, "head: %s", g_err);
        if (!h) return;
        const size_t n = h->n_w;
        sd_adamw o;
        sd_adamw_init(&o, n, g_err, sizeof g_err);
        o.lr = 1e-2f;
        o.weight_decay = 0.1f;
        o.clip = 0;
        double *w = malloc(n * sizeof(double)), *m = calloc(n, sizeof(double)), *v = calloc(n, sizeof(double));
        float *g = calloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++) w[i] = h->w[i];
        double worst = 0;
        for (int t = 1; t <= 3; t++) {
            for (size_t i = 0; i < n; i++) g[i] = urand();
            sd_adamw_step(&o, h, g);
            for (int ti = 0; ti < h->n_t; ti++) {
                const sd_head_tensor *tt = &h->t[ti];
                const double wd = !tt->is_norm && tt->ne1 > 1 ? 0.1 : 0.0;
                for (size_t j = tt->off; j < tt->off + (size_t)(tt->ne0 * tt->ne1); j++) {
                    m[j] = 0.9 * m[j] + 0.1 * g[j];
                    v[j] = 0.95 * v[j] + 0.05 * (double)g[j] * g[j];
                    const double mh = m[j] / (1 - pow(0.9, t)), vh = v[j] / (1 - pow(0.95, t));
                    w[j] -= 1e-2 * (mh / (sqrt(vh) + 1e-8) + wd * w[j]);
                    worst = fmax(worst, fabs(w[j] - h->w[j]));
                }
            }
        }
        CHECK(worst < 1e-6, "type %d: parameters off the formula by %g", types[ty], worst);
        // Decay alone.
        memset(g, 0, n * sizeof(float));
        float *before = malloc(n * sizeof(float));
        memcpy(before, h->w, n * sizeof(float));
        sd_adamw o2;
        sd_adamw_init(&o2, n, g_err, sizeof g_err);
        o2.lr = 1e-2f;
        o2.weight_decay = 0.5f;
        sd_adamw_step(&o2, h, g);
        int bad_fixed = 0, bad_decay = 0;
        for (int ti = 0; ti < h->n_t; ti++) {
            const sd_head_tensor *tt = &h->t[ti];
            for (size_t j = tt->off; j < tt->off + (size_t)(tt->ne0 * tt->ne1); j++) {
                if (tt->is_norm || tt->ne1 == 1)
                    bad_fixed += h->w[j] != before[j];
                else
                    bad_decay += fabs(h->w[j] - before[j] * (1.0 - 5e-3)) > 1e-7 * fabs(before[j]) + 1e-12;
            }
        }
        CHECK(bad_fixed == 0, "type %d: %d gains or biases decayed", types[ty], bad_fixed);
        CHECK(bad_decay == 0, "type %d: %d matrix entries not decayed by 1 - lr wd", types[ty], bad_decay);
        sd_adamw_free(&o);
        sd_adamw_free(&o2);
        free(w), free(m), free(v), free(g), free(before);
        sd_head_free(h);
    }
}

// A gradient of norm 10 with clip 1: the returned norm is 10 and the step is
// bit for bit the step of the gradient scaled by 1/10 without clipping.
static void test_clip(void) {
    sd_head *a = tiny_head(SD_HEAD_EAGLE3), *b = tiny_head(SD_HEAD_EAGLE3);
    CHECK(a && b, "heads: %s", g_err);
    if (!a || !b) return;
    const size_t n = a->n_w;
    float *g = calloc(n, sizeof(float)), *gs = calloc(n, sizeof(float));
    double ss = 0;
    for (int ti = 0; ti < a->n_t; ti++)
        for (size_t j = a->t[ti].off; j < a->t[ti].off + (size_t)(a->t[ti].ne0 * a->t[ti].ne1); j++) {
            g[j] = urand();
            ss += (double)g[j] * g[j];
        }
    for (size_t j = 0; j < n; j++) g[j] = (float)(g[j] * (10.0 / sqrt(ss)));
    sd_adamw oa, ob;
    sd_adamw_init(&oa, n, g_err, sizeof g_err);
    sd_adamw_init(&ob, n, g_err, sizeof g_err);
    oa.clip = 1.0f;
    ob.clip = 0.0f;
    double ns = 0;
    for (size_t j = 0; j < n; j++) ns += (double)g[j] * g[j];
    const float sc = (float)(1.0 / sqrt(ns));
    for (size_t j = 0; j < n; j++) gs[j] = g[j] * sc;
    const double na = sd_adamw_step(&oa, a, g), nb = sd_adamw_step(&ob, b, gs);
    CHECK(fabs(na - 10.0) < 1e-4, "norm before clipping %g, want 10", na);
    CHECK(fabs(nb - 1.0) < 1e-5, "norm of the scaled gradient %g", nb);
    CHECK(!memcmp(a->w, b->w, n * sizeof(float)) && !memcmp(oa.m, ob.m, n * sizeof(float)) &&
              !memcmp(oa.v, ob.v, n * sizeof(float)),
          "the clipped step differs from the step of the scaled gradient");
    sd_adamw_free(&oa);
    sd_adamw_free(&ob);
    free(g), free(gs);
    sd_head_free(a);
    sd_head_free(b);
}

// The vector loop against the scalar reference, on a length with a tail.
static void test_update_vs_ref(void) {
    const size_t n = 1003;
    float *w[2], *m[2], *v[2], *g = malloc(n * sizeof(float));
    for (int k = 0; k < 2; k++) {
        w[k] = malloc(n * sizeof(float)), m[k] = malloc(n * sizeof(float)), v[k] = malloc(n * sizeof(float));
    }
    for (size_t i = 0; i < n; i++) {
        w[0][i] = w[1][i] = urand();
        m[0][i] = m[1][i] = 0.1f * urand();
        v[0][i] = v[1][i] = 0.01f * (1.0f + urand());
        g[i] = urand();
    }
    sd_adamw_coef c = {.gscale = 0.7f, .b1 = 0.9f, .nb1 = 0.1f, .b2 = 0.95f, .nb2 = 0.05f, .ibc1 = 3.1f,
                       .ibc2 = 7.4f, .eps = 1e-8f, .lr = 3e-3f, .wd = 0.05f};
    sd_adamw_update(w[0], m[0], v[0], g, n, &c);
    sd_adamw_update_ref(w[1], m[1], v[1], g, n, &c);
    CHECK(!memcmp(w[0], w[1], n * sizeof(float)) && !memcmp(m[0], m[1], n * sizeof(float)) &&
              !memcmp(v[0], v[1], n * sizeof(float)),
          "the vector update differs from the scalar reference");
    for (int k = 0; k < 2; k++) free(w[k]), free(m[k]), free(v[k]);
    free(g);
}

// 6 steps straight, against 3 steps, the state (parameters, moments, t)
// copied into a fresh optimiser and head, 3 more: the same bits.
static void test_resume(void) {
    sd_head *a = tiny_head(SD_HEAD_MEDUSA), *b = tiny_head(SD_HEAD_MEDUSA);
    CHECK(a && b, "heads: %s", g_err);
    if (!a || !b) return;
    const size_t n = a->n_w;
    memcpy(b->w, a->w, n * sizeof(float));   // (tiny_head draws its biases)
    float *gs = malloc(6 * n * sizeof(float));
    for (size_t i = 0; i < 6 * n; i++) gs[i] = urand();
    sd_adamw oa, ob, oc;
    sd_adamw_init(&oa, n, g_err, sizeof g_err);
    sd_adamw_init(&ob, n, g_err, sizeof g_err);
    oa.warmup = ob.warmup = 2;
    oa.total = ob.total = 6;
    oa.weight_decay = ob.weight_decay = 0.01f;
    for (int t = 0; t < 6; t++) sd_adamw_step(&oa, a, gs + t * n);
    for (int t = 0; t < 3; t++) sd_adamw_step(&ob, b, gs + t * n);
    sd_adamw_init(&oc, n, g_err, sizeof g_err);
    float *m = oc.m, *v = oc.v;
    oc = ob;   // hyper-parameters and t
    oc.m = m, oc.v = v;
    memcpy(oc.m, ob.m, n * sizeof(float));
    memcpy(oc.v, ob.v, n * sizeof(float));
    sd_head *c = tiny_head(SD_HEAD_MEDUSA);
    memcpy(c->w, b->w, n * sizeof(float));
    for (int t = 3; t < 6; t++) sd_adamw_step(&oc, c, gs + t * n);
    CHECK(oc.t == 6 && !memcmp(a->w, c->w, n * sizeof(float)), "the resumed run differs");
    sd_adamw_free(&oa);
    sd_adamw_free(&ob);
    sd_adamw_free(&oc);
    free(gs);
    sd_head_free(a);
    sd_head_free(b);
    sd_head_free(c);
}

int main(void) {
    sd_rng_seed(&g_rng, 77);
    T_RUN(test_lr_schedule);
    T_RUN(test_step_formula_and_decay);
    T_RUN(test_clip);
    T_RUN(test_update_vs_ref);
    T_RUN(test_resume);
    T_EXIT();
}

// test_gradients.c - the whole heads' gradients (src/train/train.h): the
// gradient sd_trainer_loss adds for an EAGLE-3 head (training-time test of
// K steps) and a Medusa head, against central finite differences of the
// loss, for random entries of EVERY tensor; two deliberately wrong
// backwards (the attention's residual gradient dropped; the 0.8^k weights
// left out of the gradient) that the same check must reject; the gradient
// is added (not stored), has the same bits for 1, 2 and 3 threads, the loss
// with and without the gradient is the same; the statistics count the
// scored rows; bad sequences get an error, not a crash; and the loss is
// the one the inference head (src/head/eagle3.c) gives when it evaluates
// the same rows as it drafts.
//
// The heads are tiny (EAGLE-3: d = 16, 2 heads, 1 KV head, head size 8,
// n_ff 32, V' = 24, T = 6, K = 3; and a second shape with sizes that are
// not multiples of the vector width, head size 6 != d / n_head,
// norm_before_residual and K = 2; Medusa: d = 16, 3 heads, V' = 24) on a
// synthetic target (tests/lib/synth.h) whose token embedding the EAGLE-3
// head reads. Target states are random, target distributions random top-4
// lists with entries outside the draft vocabulary and one position with no
// mass in it. Gains and biases are randomised so that no derivative sits
// at a special point.
//
// Error bars. Each checked entry is perturbed by +-eps = 1e-2 (parameters
// are of order 0.1..1), the loss evaluated in float and differenced in
// double. The loss is 5..8 (a sum of K means of ~5 rows) with float rounding
// ~1e-7 relative, so the difference carries ~5e-5 absolute noise; truncation is
// ~eps^2 = 1e-4 relative. An entry passes when |fd - grad| <= 1e-3
// max|grad of its tensor| + 1e-2 |grad|. Measured worst ratios (printed as
// info) are well below 1, and the wrong backwards exceed it many times.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "head/eagle3.h"
#include "head/head.h"
#include "kernels/quant.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "t.h"
#include "train/train.h"
#include "train/train_impl.h"

static char g_err[512];
static sd_rng g_rng;

static float urand(void) { return (float)(2.0 * sd_rng_uniform(&g_rng) - 1.0); }

static sd_model *synth_target(int n_embd, int n_head, int n_kv, int n_ff) {
    synth_params p = synth_default_params();
    p.n_embd = n_embd;
    p.n_head = n_head;
    p.n_head_kv = n_kv;
    p.n_ff = n_ff;
    char path[128];
    snprintf(path, sizeof path, "/tmp/specdec_test_train_grad_%d.gguf", (int)getpid());
    sd_model *m = NULL;
    if (synth_write(path, &p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

typedef struct shape {
    const char *name;
    int type, d, n_head, n_kv, hd, n_ff, V, T, K, nbr, n_medusa;
} shape;

// A head of shape s for target m: random parameters, gains 1 +- 0.3,
// biases and Medusa matrices random too, draft vocabulary every 7th id
// (mod 320).
static sd_head *make_head(const sd_model *m, const shape *s) {
    sd_head_hp hp = sd_head_default_hp(m, s->type);
    hp.n_head = s->n_head;
    hp.n_head_kv = s->n_kv;
    hp.head_dim = s->hd;
    hp.n_ff = s->n_ff;
    hp.n_draft_vocab = s->V;
    hp.norm_before_residual = s->nbr;
    hp.n_medusa = s->n_medusa;
    sd_head *h = NULL;
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0) return NULL;
    sd_head_init(h, 11);
    for (int i = 0; i < h->n_t; i++) {
        float *w = sd_head_w(h, i);
        const size_t n = (size_t)(h->t[i].ne0 * h->t[i].ne1);
        const float a = h->t[i].is_norm ? 0.3f : 1.0f / sqrtf((float)h->t[i].ne0);
        for (size_t j = 0; j < n; j++) w[j] = h->t[i].is_norm ? 1.0f + a * urand() : a * urand();
    }
    int32_t ids[256];
    for (int i = 0; i < s->V; i++) ids[i] = (7 * i + 3) % 320;   // distinct: 7 and 320 are coprime
    if (sd_head_set_vocab(h, ids, s->V, g_err, sizeof g_err) < 0) {
        sd_head_free(h);
        return NULL;
    }
    return h;
}

// A random sequence: tokens in the draft vocabulary mostly, states of
// n_feat floats, top-4 targets with some entries outside the draft
// vocabulary or unused, and position 2 with no mass in the vocabulary.
typedef struct seq_buf {
    int32_t tok[64], ids[64 * 4];
    float feats[64 * 192], p[64 * 4];
    sd_train_seq seq;
} seq_buf;

static void make_seq(seq_buf *b, const sd_head *h, int T, int n_feat) {
    const int nt = 4;
    for (int t = 0; t < T; t++) {
        b->tok[t] = t % 3 == 2 ? (int32_t)(sd_rng_next(&g_rng) % 320) : h->d2t[sd_rng_next(&g_rng) % h->hp.n_draft_vocab];
        for (int i = 0; i < n_feat; i++) b->feats[t * n_feat + i] = 1.5f * urand();
        double s = 0;
        for (int i = 0; i < nt; i++) {
            const uint64_t r = sd_rng_next(&g_rng);
            b->ids[t * nt + i] = r % 5 == 0 ? (int32_t)(r % 320) : r % 7 == 1 && i == 3 ? -1
                                                                  : h->d2t[r % h->hp.n_draft_vocab];
            b->p[t * nt + i] = (float)(0.1 + sd_rng_uniform(&g_rng));
            s += b->p[t * nt + i];
        }
        for (int i = 0; i < nt; i++) b->p[t * nt + i] = (float)(b->p[t * nt + i] / s);
        if (t == 2)
            for (int i = 0; i < nt; i++) b->ids[t * nt + i] = i == 0 ? 1 : -1;   // 1 is not a draft id
    }
    b->seq = (sd_train_seq){.T = T, .tokens = b->tok, .feats = b->feats, .top_ids = b->ids, .top_p = b->p, .topk = nt};
}

// Worst |fd - grad| / bar over n_pick random entries of every tensor;
// *worst_t names the tensor.
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
            const double r = fabs(fd - g[i]) / (1e-3 * gmax + 1e-2 * fabs(g[i]) + 1e-30);
            if (!(r <= tw)) tw = r;
        }
        if (verbose) printf("  info: %-28s max|grad| %.3g  worst |fd - grad| / bar %.3g\n", h->t[ti].name, gmax, tw);
        if (!(tw <= worst)) {
            worst = tw;
            *worst_t = h->t[ti].name;
        }
    }
    return worst;
}

static const shape E3_A = {"eagle3 d16", SD_HEAD_EAGLE3, 16, 2, 1, 8, 32, 24, 6, 3, 0, 0};
static const shape E3_B = {"eagle3 d12 odd", SD_HEAD_EAGLE3, 12, 3, 1, 6, 20, 19, 7, 2, 1, 0};
static const shape MD_A = {"medusa d16", SD_HEAD_MEDUSA, 16, 0, 0, 0, 0, 24, 6, 0, 0, 3};
// Shapes big enough for the ops to hand their work to the pool.
static const shape E3_M = {"eagle3 d64", SD_HEAD_EAGLE3, 64, 4, 2, 16, 128, 96, 48, 3, 0, 0};
static const shape MD_M = {"medusa d64", SD_HEAD_MEDUSA, 64, 0, 0, 0, 0, 96, 48, 0, 0, 3};

// Sets up target, head, trainer and a sequence for shape s (fault applied).
typedef struct rig {
    sd_model *m;
    sd_head *h;
    sd_trainer *tr;
    seq_buf sb;
    float *grad;
} rig;

static int rig_new(rig *r, const shape *s, sd_pool *pool) {
    memset(r, 0, sizeof *r);
    r->m = synth_target(s->d, s->type == SD_HEAD_EAGLE3 ? 2 : 4, 1, 32);
    if (!r->m) return -1;
    r->h = make_head(r->m, s);
    if (!r->h) return -1;
    if (sd_trainer_new(&r->tr, r->h, r->m, s->T, s->K, pool, g_err, sizeof g_err) < 0) return -1;
    make_seq(&r->sb, r->h, s->T, s->type == SD_HEAD_EAGLE3 ? 3 * s->d : s->d);
    r->grad = calloc(r->h->n_w, sizeof(float));
    return r->grad ? 0 : -1;
}

static void rig_free(rig *r) {
    sd_trainer_free(r->tr);
    sd_head_free(r->h);
    sd_model_free(r->m);
    free(r->grad);
}

// The check of shape s with fault: returns the worst ratio.
static double check_shape(const shape *s, int fault, int verbose) {
    rig r;
    if (rig_new(&r, s, NULL) < 0) {
        CHECK(0, "%s: setup: %s", s->name, g_err);
        rig_free(&r);
        return NAN;
    }
    sd_trainer_set_fault(r.tr, fault);
    sd_train_stats st;
    const double loss = sd_trainer_loss(r.tr, &r.sb.seq, r.grad, &st, g_err, sizeof g_err);
    CHECK(loss > 0 && isfinite(loss), "%s: loss %g: %s", s->name, loss, g_err);
    const char *wt = "?";
    const double w = fd_head(r.tr, r.h, &r.sb.seq, r.grad, 8, verbose, &wt);
    if (verbose) printf("  info: %s: loss %.4f, worst ratio %.3g (%s)\n", s->name, loss, w, wt);
    rig_free(&r);
    return w;
}

static void test_grad_eagle3(void) {
    const double w = check_shape(&E3_A, SD_TR_FAULT_NONE, 1);
    CHECK(w <= 1.0, "EAGLE-3 gradient off finite differences: worst ratio %.3g", w);
}

static void test_grad_eagle3_odd_shape(void) {
    const double w = check_shape(&E3_B, SD_TR_FAULT_NONE, 1);
    CHECK(w <= 1.0, "EAGLE-3 (odd shape) gradient off finite differences: worst ratio %.3g", w);
}

static void test_grad_medusa(void) {
    const double w = check_shape(&MD_A, SD_TR_FAULT_NONE, 1);
    CHECK(w <= 1.0, "Medusa gradient off finite differences: worst ratio %.3g", w);
}

// The deliberately wrong backwards: the same check rejects each.
static void test_grad_catches_faults(void) {
    const double a = check_shape(&E3_A, SD_TR_FAULT_NO_RESID, 0);
    const double b = check_shape(&E3_B, SD_TR_FAULT_NO_RESID, 0);
    const double c = check_shape(&E3_A, SD_TR_FAULT_NO_WEIGHT, 0);
    const double d = check_shape(&MD_A, SD_TR_FAULT_NO_WEIGHT, 0);
    printf("  info: worst ratios with faults: no residual gradient %.3g, %.3g; no 0.8^k in the gradient %.3g "
           "(EAGLE-3), %.3g (Medusa)\n",
           a, b, c, d);
    CHECK(a > 10 && b > 10, "a backward without the residual gradient passed (%.3g, %.3g)", a, b);
    // (heads 1 and 2 off by 25% and 56%: many times the 1% bar)
    CHECK(c > 10 && d > 10, "a backward without the loss weights passed (%.3g, %.3g)", c, d);
}

// Added, not stored; the loss does not depend on asking for the gradient;
// bits equal for 1, 2 and 3 threads (the tiny shapes run on one thread
// whatever the pool; the d = 64 shapes hand their products, attention and
// cross-entropy to the pool); stats count the scored rows.
static void test_grad_contract(void) {
    const shape *shapes[4] = {&E3_A, &MD_A, &E3_M, &MD_M};
    for (int si = 0; si < 4; si++) {
        const shape *s = shapes[si];
        sd_pool *pools[3] = {NULL, sd_pool_new(2), sd_pool_new(3)};
        float *g[3] = {0};
        double loss[3] = {0};
        for (int pi = 0; pi < 3; pi++) {
            sd_rng_seed(&g_rng, 99);   // the same head and sequence each time
            rig r;
            if (rig_new(&r, s, pools[pi]) < 0) {
                CHECK(0, "%s: setup: %s", s->name, g_err);
                rig_free(&r);
                continue;
            }
            sd_train_stats st;
            loss[pi] = sd_trainer_loss(r.tr, &r.sb.seq, r.grad, &st, g_err, sizeof g_err);
            if (pi == 0) {
                float *g1 = malloc(r.h->n_w * sizeof(float));
                memcpy(g1, r.grad, r.h->n_w * sizeof(float));
                const double l2 = sd_trainer_loss(r.tr, &r.sb.seq, r.grad, NULL, g_err, sizeof g_err);
                const double l3 = sd_trainer_loss(r.tr, &r.sb.seq, NULL, NULL, g_err, sizeof g_err);
                int bad = 0;
                // (within rounding: the products add block by block into what is there,
                // so an entry that is a small difference of large blocks moves by the
                // rounding of the blocks: the bar is relative to the largest entry)
                float gmax = 0;
                for (size_t i = 0; i < r.h->n_w; i++) gmax = fmaxf(gmax, fabsf(g1[i]));
                for (size_t i = 0; i < r.h->n_w; i++) bad += !(fabsf(r.grad[i] - 2.0f * g1[i]) <= 1e-5f * (fabsf(g1[i]) + gmax));
                CHECK(bad == 0, "%s: a second call did not add the same gradient (%d entries)", s->name, bad);
                CHECK(l2 == loss[0] && l3 == loss[0], "%s: losses %.9g, %.9g, %.9g differ", s->name, loss[0], l2, l3);
                memcpy(r.grad, g1, r.h->n_w * sizeof(float));
                free(g1);
                // T = 6, position 2 has no mass: step/head k scores the rows whose target
                // position (1+k .. 5) is not 2.
                const int K = s->type == SD_HEAD_EAGLE3 ? s->K : s->n_medusa;
                for (int k = 0; k < K; k++) {
                    const int want = (s->T - 1 - k) - (2 >= 1 + k);
                    CHECK(st.n[k] == want, "%s: step %d scored %lld rows, want %d", s->name, k, (long long)st.n[k],
                          want);
                    CHECK(st.agree[k] >= 0 && st.agree[k] <= st.n[k], "%s: agree %lld", s->name,
                          (long long)st.agree[k]);
                }
                CHECK(st.loss == loss[0], "%s: stats loss %g", s->name, st.loss);
            }
            g[pi] = malloc(r.h->n_w * sizeof(float));
            memcpy(g[pi], r.grad, r.h->n_w * sizeof(float));
            const size_t nw = r.h->n_w;
            rig_free(&r);
            if (pi > 0 && g[0]) {
                CHECK(!memcmp(g[0], g[pi], nw * sizeof(float)) && loss[pi] == loss[0],
                      "%s: %d threads give other bits than one", s->name, pi + 1);
            }
        }
        for (int pi = 0; pi < 3; pi++) {
            free(g[pi]);
            sd_pool_free(pools[pi]);
        }
    }
}

static void test_bad_input(void) {
    rig r;
    if (rig_new(&r, &E3_A, NULL) < 0) {
        CHECK(0, "setup: %s", g_err);
        rig_free(&r);
        return;
    }
    sd_train_seq s = r.sb.seq;
    s.T = E3_A.T + 1;
    g_err[0] = 0;
    CHECK(sd_trainer_loss(r.tr, &s, r.grad, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "T_max"),
          "T > T_max: '%s'", g_err);
    s.T = 1;
    CHECK(sd_trainer_loss(r.tr, &s, r.grad, NULL, g_err, sizeof g_err) < 0, "T = 1 accepted");
    s = r.sb.seq;
    s.topk = 0;
    CHECK(sd_trainer_loss(r.tr, &s, r.grad, NULL, g_err, sizeof g_err) < 0, "top-k 0 accepted");
    s = r.sb.seq;
    s.feats = NULL;
    CHECK(sd_trainer_loss(r.tr, &s, r.grad, NULL, g_err, sizeof g_err) < 0, "no states accepted");
    r.sb.tok[3] = 320;
    CHECK(sd_trainer_loss(r.tr, &r.sb.seq, r.grad, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "token"),
          "token outside the vocabulary: '%s'", g_err);
    r.sb.tok[3] = 5;
    r.sb.ids[5] = 999;
    CHECK(sd_trainer_loss(r.tr, &r.sb.seq, r.grad, NULL, g_err, sizeof g_err) < 0, "target id 999 accepted");
    r.sb.ids[5] = 3;
    CHECK(sd_trainer_loss(r.tr, &r.sb.seq, r.grad, NULL, g_err, sizeof g_err) >= 0, "a good sequence fails: %s",
          g_err);
    sd_trainer *t2 = NULL;
    CHECK(sd_trainer_new(&t2, r.h, NULL, 8, 3, NULL, g_err, sizeof g_err) < 0 && !t2,
          "an EAGLE-3 trainer without the target was made");
    CHECK(sd_trainer_new(&t2, r.h, r.m, 1, 3, NULL, g_err, sizeof g_err) < 0 && !t2, "T_max 1 accepted");
    CHECK(sd_trainer_new(&t2, r.h, r.m, 8, 0, NULL, g_err, sizeof g_err) < 0 && !t2, "K = 0 accepted");
    rig_free(&r);
}

// The training forward is the drafter's forward: the loss computed from
// the inference head (src/head/eagle3.c, float weights) evaluating the rows
// as drafting does (step 0 row j against the committed rows 1..j-1, then
// the draft chain of steps 1..K-1 hanging off it as pending rows, then
// only step 0's row committed) equals sd_trainer_loss's, within float
// rounding (1e-5 relative; measured ~1e-7).
static double infer_loss(const rig *r, const shape *s) {
    const sd_head *h = r->h;
    const sd_train_seq *q = &r->sb.seq;
    const int d = s->d, T = s->T, V = s->V, nt = q->topk;
    sd_e3 *e = NULL;
    if (sd_e3_new(&e, h, r->m, T, 1, s->K + 1, SD_TYPE_F32, 0, NULL, g_err, sizeof g_err) < 0) return NAN;
    float g[64 * 16], hs[8][16], lg[8][64];
    sd_e3_fuse(e, q->feats, T - 1, g);
    double sum[8] = {0};
    int cnt[8] = {0};
    for (int j = 1; j < T; j++) {
        for (int k = 0; k < s->K && j + k < T; k++) {
            const int32_t tok = q->tokens[j + k], pos = j + k, par = k - 1;
            const float *c = k == 0 ? g + (size_t)(j - 1) * d : hs[k - 1];
            if (sd_e3_eval(e, &tok, c, &pos, &par, 1, hs[k], lg[k], g_err, sizeof g_err) < 0) {
                sd_e3_free(e);
                return NAN;
            }
            // softxent against the target at j + k restricted to the draft vocabulary
            double mass = 0, dot = 0, mx = -1e300, z = 0;
            for (int i = 0; i < nt; i++) {
                const int32_t t = q->top_ids[(j + k) * nt + i], di = t >= 0 ? h->t2d[t] : -1;
                if (di >= 0) mass += q->top_p[(j + k) * nt + i], dot += q->top_p[(j + k) * nt + i] * lg[k][di];
            }
            if (!(mass > 0)) continue;
            for (int v = 0; v < V; v++) mx = fmax(mx, lg[k][v]);
            for (int v = 0; v < V; v++) z += exp(lg[k][v] - mx);
            sum[k] += mx + log(z) - dot / mass;
            cnt[k]++;
        }
        const int32_t slot = 0;
        sd_e3_commit(e, &slot, 1, g_err, sizeof g_err);
    }
    sd_e3_free(e);
    double loss = 0;
    for (int k = 0; k < s->K; k++)
        if (cnt[k]) loss += pow(0.8, k) * sum[k] / cnt[k];
    return loss;
}

static void test_loss_matches_inference(void) {
    const shape *shapes[2] = {&E3_A, &E3_B};
    for (int si = 0; si < 2; si++) {
        rig r;
        if (rig_new(&r, shapes[si], NULL) < 0) {
            CHECK(0, "%s: setup: %s", shapes[si]->name, g_err);
            rig_free(&r);
            continue;
        }
        const double lt = sd_trainer_loss(r.tr, &r.sb.seq, NULL, NULL, g_err, sizeof g_err);
        const double li = infer_loss(&r, shapes[si]);
        printf("  info: %s: training loss %.7f, inference loss %.7f\n", shapes[si]->name, lt, li);
        CHECK(fabs(lt - li) <= 1e-5 * fabs(li), "%s: training loss %.7f, the drafter's forward gives %.7f (%s)",
              shapes[si]->name, lt, li, g_err);
        rig_free(&r);
    }
}

int main(void) {
    sd_rng_seed(&g_rng, 424242);
    T_RUN(test_loss_matches_inference);
    T_RUN(test_grad_eagle3);
    T_RUN(test_grad_eagle3_odd_shape);
    T_RUN(test_grad_medusa);
    T_RUN(test_grad_catches_faults);
    T_RUN(test_grad_contract);
    T_RUN(test_bad_input);
    T_EXIT();
}

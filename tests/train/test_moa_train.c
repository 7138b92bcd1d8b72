// test_moa_train.c - training the MoA drafter (docs/moa.md): the loop
// (sd_train_head with SD_HEAD_MOA) stops with a checkpoint and resumes to
// the same parameters bit for bit, writes a file the drafter loads, and
// refuses a resume with another TLI; the drafter learns a planted pattern;
// and the inference runner (src/head/moa_run.c) computes what training
// computed: its top-1 agreement on held-out rows, drafted as the drafter
// drafts them, matches the trainer's (TLI 0 on a llama target; TLI 1 on a
// qwen2 one, whose frozen target layer turns NEOX pairs).
//
// The planted pattern (as test_learns_pattern.c): texts cycle through 16
// word tokens in a fixed random order from a random phase; a synthetic
// 2-layer target runs over each text (its K,V cache rows, its final normed
// states and its top-8 next-token distributions are the data, in memory).
// 24 training texts of 48 positions, 250 AdamW steps, 4 held out.
// Bars: held-out agreement at depth 0 and 1 > 50% after training (untrained:
// < 10%), the held-out loss falls by a third; the runner's agreement within
// 5 points of the trainer's.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "head/head.h"
#include "head/moa.h"
#include "kernels/quant.h"
#include "lib/synth.h"
#include "lib/train_fixture.h"
#include "model/model.h"
#include "runtime/session.h"
#include "specdec.h"
#include "specdec_train.h"
#include "t.h"
#include "train/ckpt.h"
#include "train/moa_train.h"
#include "train/train.h"

static char g_err[1024];
static const char *g_data[1];

// ---------------------------------------------------------------- the loop

typedef struct watch {
    volatile sig_atomic_t flag;
    int64_t stop_at;
    int n_steps_seen;
} watch;

static void on_progress(void *user, const sd_train_progress *p) {
    watch *w = user;
    if (p->phase == SD_TRAIN_PHASE_STEP) {
        w->n_steps_seen++;
        if (w->stop_at >= 0 && p->step == w->stop_at) w->flag = 1;
    }
}

static int g_sa_full;   // small_run's sa_full (full-text SA, its curriculum)

static sd_train_head_params small_run(const sd_model *m, const char *tag, int tli, int no_lsa, watch *w) {
    static char out[4][512], ckpt[4][512], cache[2][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(out[k], sizeof out[k], "%s/%s.gguf", tf_dir(), tag);
    snprintf(ckpt[k], sizeof ckpt[k], "%s/%s.ckpt", tf_dir(), tag);
    tf_path(cache[no_lsa], sizeof cache[no_lsa], no_lsa ? "moa-nolsa.cache" : "moa.cache");   // Medusa / MoA cache
    sd_train_head_params p = sd_train_head_default_params();
    p.model = m;
    p.type = SD_HEAD_MOA;
    p.moa_tli = tli;
    p.moa_no_lsa = no_lsa;
    p.moa_sa_full = g_sa_full;
    p.data_paths = g_data;
    p.n_data = 1;
    p.cache_dir = cache[no_lsa];
    p.out_path = out[k];
    p.ckpt_path = ckpt[k];
    p.out_type = SD_TRAIN_OUT_F32;
    p.draft_vocab = 64;
    p.seq_len = 16;
    p.batch = 2;
    p.tokens = 16 * 2 * 6;
    p.lr = 1e-2f;
    p.warmup = 2;
    p.n_threads = 2;
    p.ckpt_minutes = 0;
    p.heldout = 0.2;
    p.eval_every = 3;
    p.topk = 4;
    p.n_ctx = 32;
    p.n_batch = 16;
    p.stop = &w->flag;
    p.progress = on_progress;
    p.user = w;
    return p;
}

static sd_head *load_head(const char *path, const sd_model *m) {
    sd_head *h = NULL;
    if (sd_head_load(&h, path, m, g_err, sizeof g_err) < 0) return NULL;
    return h;
}

// Stop at half way, resume: the parameters of an uninterrupted run (TLI 0
// and 1; TLI 1 without LSA reads the MoA cache, its second chunks at pos0 16;
// TLI 0 without LSA with full-text SA: its curriculum resumes as it was).
static void test_moa_resume_bit_identical(void) {
    sd_model *m = tf_synth_model(64, 2, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    for (int c = 0; c < 4; c++) {
        const int tli = c == 1 || c == 2, nl = c >= 2;
        g_sa_full = c == 3;
        char tw[16], th[16];
        snprintf(tw, sizeof tw, "whole%d", c);
        snprintf(th, sizeof th, "halves%d", c);
        watch w0 = {.stop_at = -1};
        sd_train_head_params pa = small_run(m, tw, tli, nl, &w0);
        sd_train_head_result ra;
        int r = sd_train_head(&pa, &ra, g_err, sizeof g_err);
        CHECK(r == 0 && ra.step == ra.n_steps && ra.n_steps >= 6 && ra.n_agree == 4, "TLI %d: %d step %lld of %lld %s",
              tli, r, (long long)ra.step, (long long)ra.n_steps, g_err);
        watch w1 = {.stop_at = 3};
        sd_train_head_params pb = small_run(m, th, tli, nl, &w1);
        sd_train_head_result rb;
        r = sd_train_head(&pb, &rb, g_err, sizeof g_err);
        CHECK(r == 1 && rb.step == 3 && tf_file_len(pb.out_path) < 0, "TLI %d stopped: %d step %lld %s", tli, r,
              (long long)rb.step, g_err);
        // another TLI is refused when resuming
        watch wx = {.stop_at = -1};
        sd_train_head_params px = small_run(m, th, 1 - tli, nl, &wx);
        px.resume = 1;
        CHECK(sd_train_head(&px, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "TLI"),
              "a resume with another TLI was not refused: %s", g_err);
        // and with or without full-text SA (--sa-full)
        g_sa_full = !g_sa_full;
        px = small_run(m, th, tli, nl, &wx);
        g_sa_full = !g_sa_full;
        px.resume = 1;
        CHECK(sd_train_head(&px, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--sa-full"),
              "a resume with another --sa-full was not refused: %s", g_err);
        // and another block range (--moa-block)
        px = small_run(m, th, tli, nl, &wx);
        px.resume = 1;
        px.moa_block_min = 2, px.moa_block_max = 5;
        CHECK(sd_train_head(&px, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--moa-block 6-15") &&
                  strstr(g_err, "2-5"),
              "a resume with another block range was not refused: %s", g_err);
        watch w2 = {.stop_at = -1};
        sd_train_head_params pc = small_run(m, th, tli, nl, &w2);
        pc.resume = 1;
        r = sd_train_head(&pc, &rb, g_err, sizeof g_err);
        CHECK(r == 0 && rb.step == ra.n_steps, "TLI %d resumed: %d %s", tli, r, g_err);
        sd_head *ha = load_head(pa.out_path, m), *hb = load_head(pc.out_path, m);
        CHECK(ha && hb && ha->hp.type == SD_HEAD_MOA && ha->hp.moa_tli == tli && ha->hp.moa_no_lsa == nl &&
                  ha->hp.moa_sa_full == g_sa_full,
              "MoA files load: %s", g_err);
        CHECK(ha && hb && ha->n_w == hb->n_w && !memcmp(ha->w, hb->w, sizeof(float) * ha->n_w),
              "TLI %d: resumed parameters differ from the uninterrupted run's", tli);
        sd_head_free(ha);
        sd_head_free(hb);
        unlink(pb.ckpt_path);
    }
    g_sa_full = 0;
    sd_model_free(m);
}

// ---------------------------------------------------------------- the planted pattern

#define T_SEQ 48
#define N_TRAIN 24
#define N_HELD 4
#define TOPK 8

typedef struct data {
    int32_t tok[N_TRAIN + N_HELD][T_SEQ];
    float *feats;   // (N, T, nf) the full layout, as the inference runner reads the target's rows
    float *red;     // (N, T, nfr) no LSA: the trainer's reduced features (mean row, TLI rows, states), or NULL
    int nfr;
    int32_t ids[N_TRAIN + N_HELD][T_SEQ][TOPK];
    float pr[N_TRAIN + N_HELD][T_SEQ][TOPK];
    int nf;
} data;

static int make_data(data *D, const sd_model *m, const sd_head *h) {
    const int L = m->hp.n_layer, E = m->hp.n_embd, ekv = h->hp.moa_kv_width, kvd = ekv / 2, NV = m->hp.n_vocab;
    D->nf = L * ekv + 2 * E;
    D->feats = calloc((size_t)(N_TRAIN + N_HELD) * T_SEQ * (size_t)D->nf, sizeof(float));
    D->nfr = sd_moa_n_feat(h);
    D->red = h->hp.moa_no_lsa ? calloc((size_t)(N_TRAIN + N_HELD) * T_SEQ * (size_t)D->nfr, sizeof(float)) : NULL;
    if (h->hp.moa_no_lsa && !D->red) return -1;
    float *hid = malloc(sizeof(float) * T_SEQ * 2 * (size_t)E), *kb = malloc(sizeof(float) * T_SEQ * (size_t)kvd),
          *vb = malloc(sizeof(float) * T_SEQ * (size_t)kvd), *pb = malloc(sizeof(float) * (size_t)NV);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = T_SEQ, sp.n_batch = T_SEQ, sp.n_threads = 2;
    sd_session *s = NULL;
    if (!D->feats || !hid || !kb || !vb || !pb || sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return -1;
    sd_rng rng;
    sd_rng_seed(&rng, 9);
    int32_t cycle[16];
    for (int i = 0; i < 16; i++) cycle[i] = 263 + i * 3;   // word pieces
    for (int i = 15; i > 0; i--) {
        int j = (int)(sd_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = cycle[i];
        cycle[i] = cycle[j], cycle[j] = t;
    }
    // the state entering layer L-N (N > 0: the stream after block L-N-1) and the final normed state
    const int N = h->hp.moa_tli;
    int32_t layers[2] = {N > 0 ? L - N - 1 : SD_HIDDEN_NORM, SD_HIDDEN_NORM};
    int rc = 0;
    for (int q = 0; q < N_TRAIN + N_HELD && rc == 0; q++) {
        const int ph = (int)(sd_rng_next(&rng) % 16);
        for (int t = 0; t < T_SEQ; t++) D->tok[q][t] = cycle[(ph + t) % 16];
        sd_session_truncate(s, 0, NULL, 0);
        sd_batch b = {.n = T_SEQ, .tokens = D->tok[q], .hidden_layers = layers, .n_hidden_layers = 2,
                      .hidden_out = hid};
        rc = sd_session_forward(s, &b, g_err, sizeof g_err);
        if (rc == 0) rc = sd_session_commit(s, NULL, 0, g_err, sizeof g_err);
        float *F = D->feats + (size_t)q * T_SEQ * D->nf;
        for (int l = 0; l < L && rc == 0; l++) {
            rc = sd_session_kv_rows(s, l, 0, T_SEQ, kb, vb);
            for (int t = 0; t < T_SEQ; t++) {
                memcpy(F + (size_t)t * D->nf + (size_t)l * ekv, kb + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
                memcpy(F + (size_t)t * D->nf + (size_t)l * ekv + kvd, vb + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
            }
        }
        for (int t = 0; t < T_SEQ && rc == 0; t++) {
            if (N > 0) memcpy(F + (size_t)t * D->nf + (size_t)L * ekv, hid + (size_t)t * 2 * E, sizeof(float) * (size_t)E);
            memcpy(F + (size_t)t * D->nf + (size_t)L * ekv + E, hid + (size_t)t * 2 * E + E, sizeof(float) * (size_t)E);
            const float *lg = sd_session_logits(s, t);
            float mx = lg[0];
            for (int v = 1; v < NV; v++) mx = lg[v] > mx ? lg[v] : mx;
            double sum = 0;
            for (int v = 0; v < NV; v++) sum += pb[v] = expf(lg[v] - mx);
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
            if (!D->red) continue;
            // reduced: the layers' mean row, the last N layers' rows, the two states
            float *o = D->red + ((size_t)q * T_SEQ + t) * D->nfr;
            const float *f = F + (size_t)t * D->nf;
            for (int l = 0; l < L; l++)
                for (int j = 0; j < ekv; j++) o[j] += f[(size_t)l * ekv + j] / (float)L;
            memcpy(o + ekv, f + (size_t)(L - N) * ekv, sizeof(float) * (size_t)N * ekv);
            memcpy(o + (size_t)(1 + N) * ekv, f + (size_t)L * ekv, sizeof(float) * 2 * (size_t)E);
        }
    }
    free(hid);
    free(kb);
    free(vb);
    free(pb);
    sd_session_free(s);
    return rc;
}

static sd_train_seq seq_of(const data *D, int q) {
    const float *f = D->red ? D->red + (size_t)q * T_SEQ * D->nfr : D->feats + (size_t)q * T_SEQ * D->nf;
    return (sd_train_seq){T_SEQ, D->tok[q], f, &D->ids[q][0][0], &D->pr[q][0][0], TOPK, 0, NULL};
}

// Held-out loss and agreement at depths 0 and 1 (the trainer's).
static double held_out(sd_trainer *tr, const data *D, double agree[2]) {
    sd_train_stats sum = {0};
    double loss = 0;
    for (int q = N_TRAIN; q < N_TRAIN + N_HELD; q++) {
        sd_train_seq s = seq_of(D, q);
        sd_train_stats st;
        loss += sd_trainer_loss(tr, &s, NULL, &st, g_err, sizeof g_err);
        for (int k = 0; k < 2; k++) sum.n[k] += st.n[k], sum.agree[k] += st.agree[k];
    }
    for (int k = 0; k < 2; k++) agree[k] = sum.n[k] ? (double)sum.agree[k] / (double)sum.n[k] : 0;
    return loss / N_HELD;
}

// The runner's agreement on the same held-out rows at depths 0 and 1: for
// each block start r (the sequence's k), the context is positions 0..r-1,
// the root row is token r, the next row token r+1 (teacher forcing, as training).
static void runner_agree(const sd_head *h, const sd_model *m, const data *D, double agree[2]) {
    sd_moa_run *r = NULL;
    long n[2] = {0}, a[2] = {0};
    float *lg = malloc(sizeof(float) * 2 * (size_t)h->hp.n_draft_vocab);
    // the state a ca_hidden drafter reads: entering layer L-N, or (TLI 0) the final normed one
    const size_t hid_off = (size_t)m->hp.n_layer * h->hp.moa_kv_width + (h->hp.moa_tli > 0 ? 0 : (size_t)h->hp.n_embd);
    if (!lg || sd_moa_run_new(&r, h, m, T_SEQ, 64, SD_TYPE_F32, 0, NULL, g_err, sizeof g_err) < 0) goto out;
    for (int q = N_TRAIN; q < N_TRAIN + N_HELD; q++) {
        const int k = sd_moa_block(D->tok[q], T_SEQ, SD_MOA_BLOCK_MIN, SD_MOA_BLOCK_MAX);
        const float *F = D->feats + (size_t)q * T_SEQ * D->nf;
        for (int b0 = 0; b0 + 1 < T_SEQ - 1; b0 += k) {
            sd_moa_run_truncate(r, 0);
            for (int p = 0; p < b0; p++)   // context rows one at a time (the features' stride is nf)
                if (sd_moa_run_context(r, F + (size_t)p * D->nf, F + (size_t)p * D->nf + hid_off, &D->tok[q][p], 1,
                                       g_err, sizeof g_err) < 0)
                    goto out;
            int32_t tok[2] = {D->tok[q][b0], D->tok[q][b0 + 1]}, pos[2] = {b0, b0 + 1}, par[2] = {-1, 0};
            const int nr = k > 1 ? 2 : 1;
            if (sd_moa_run_eval(r, tok, pos, par, nr, lg, NULL, g_err, sizeof g_err) < 0) goto out;
            for (int d = 0; d < nr; d++) {
                const float *row = lg + (size_t)d * h->hp.n_draft_vocab;
                int best = 0;
                for (int v = 1; v < h->hp.n_draft_vocab; v++) best = row[v] > row[best] ? v : best;
                const int32_t want = D->ids[q][b0 + d][0];
                if (want < 0 || h->t2d[want] < 0) continue;   // not scored by the trainer either
                n[d]++;
                a[d] += h->d2t[best] == want;
            }
        }
    }
out:
    for (int d = 0; d < 2; d++) agree[d] = n[d] ? (double)a[d] / (double)n[d] : -1;
    free(lg);
    sd_moa_run_free(r);
}

// A 2-layer llama target (RoPE pairs (2i, 2i+1)) with TLI 0, or a qwen2 one
// (NEOX pairs (i, i + hd/2), q/k/v biases) with TLI 1: the trainer's frozen
// target layer must turn its rows as the inference runner does. Without
// LSA the trainer reads the reduced features (the MoA cache's form), the
// runner the target's rows of every layer: both must take the same mean.
static void learns_pattern(const char *arch, int tli, int no_lsa, int ca_hidden) {
    synth_params sp = synth_default_params();
    sp.arch = arch;
    sp.n_embd = 64, sp.n_ff = 128, sp.seed = 3;
    char path[600];
    tf_path(path, sizeof path, "moa_target.gguf");
    sd_model *m = NULL;
    if (synth_write(path, &sp, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    CHECK(m, "synthetic %s model: %s", arch, g_err);
    if (!m) return;
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_MOA);
    hp.n_draft_vocab = m->hp.n_vocab;
    hp.moa_tli = tli;
    hp.moa_no_lsa = no_lsa;
    hp.moa_ca_hidden = ca_hidden & 1;   // bit 1: sa_hidden
    hp.moa_sa_hidden = ca_hidden >> 1 & 1;
    hp.moa_sa_full = ca_hidden >> 2 & 1;   // bit 2: SA sees the whole text (trained so throughout)
    sd_head *h = NULL;
    static data D;
    sd_trainer *tr = NULL;
    float *grad = NULL;
    sd_adamw o = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .warmup = 20, .total = 250};
    if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0 || make_data(&D, m, h) < 0 ||
        sd_trainer_new(&tr, h, m, T_SEQ, 1, NULL, g_err, sizeof g_err) < 0 ||
        sd_adamw_init(&o, h->n_w, g_err, sizeof g_err) < 0 || !(grad = calloc(h->n_w, sizeof(float)))) {
        CHECK(0, "setup: %s", g_err);
        goto out;
    }
    sd_head_init(h, 4);
    sd_trainer_set_moa_sa_full(tr, 1.0f, 0);
    double a0[2], a1[2], ra[2];
    const double l0 = held_out(tr, &D, a0);
    const double t0 = sd_time_ms();
    for (int it = 0; it < 250; it++) {
        memset(grad, 0, sizeof(float) * h->n_w);
        sd_train_seq s = seq_of(&D, it % N_TRAIN);
        if (sd_trainer_loss(tr, &s, grad, NULL, g_err, sizeof g_err) < 0) {
            CHECK(0, "step %d: %s", it, g_err);
            goto out;
        }
        sd_adamw_step(&o, h, grad);
    }
    const double l1 = held_out(tr, &D, a1);
    runner_agree(h, m, &D, ra);
    printf("  info: %s, TLI %d%s%s: held-out loss %.3f -> %.3f, agreement depth 0 %.2f -> %.2f, depth 1 %.2f -> %.2f (%.1f s); "
           "the runner's: %.2f, %.2f\n",
           arch, tli, no_lsa ? " no-LSA" : "",
           (ca_hidden & 3) == 3 ? " ca+sa-hidden" : ca_hidden & 3 ? " ca-hidden" : ca_hidden & 4 ? " sa-full" : "", l0, l1,
           a0[0], a1[0], a0[1], a1[1], (sd_time_ms() - t0) / 1000, ra[0], ra[1]);
    CHECK(a0[0] < 0.1 && a1[0] > 0.5 && a1[1] > 0.5, "the pattern was not learnt (depth 0 %.2f -> %.2f, depth 1 %.2f)",
          a0[0], a1[0], a1[1]);
    CHECK(l1 < 0.67 * l0, "held-out loss %.3f -> %.3f", l0, l1);
    CHECK(fabs(ra[0] - a1[0]) < 0.05 && fabs(ra[1] - a1[1]) < 0.05,
          "the inference runner disagrees with training: %.2f/%.2f vs %.2f/%.2f (%s)", ra[0], ra[1], a1[0], a1[1],
          g_err);
    // the block range reaches the loss: rows at depth d exist only for d < k (the longest block: one of T_SEQ)
    for (int c = 0; c < 3; c++) {
        const int kmin = c == 1 ? 2 : c == 2 ? SD_TRAIN_MOA_MAX_BLOCK : SD_MOA_BLOCK_MIN;
        const int kmax = c == 1 ? 2 : c == 2 ? SD_TRAIN_MOA_MAX_BLOCK : SD_MOA_BLOCK_MAX;
        sd_trainer_set_moa_block(tr, kmin, kmax);
        sd_train_seq s = seq_of(&D, N_TRAIN);
        sd_train_stats st;
        const int k = sd_moa_block(D.tok[N_TRAIN], T_SEQ, kmin, kmax);
        const double l = sd_trainer_loss(tr, &s, NULL, &st, g_err, sizeof g_err);
        CHECK(l >= 0 && isfinite(l) && st.n[0] > 0 && st.n[SD_MIN(k, SD_HEAD_MAX_MEDUSA) - 1] > 0 &&
                  (k >= SD_HEAD_MAX_MEDUSA || st.n[k] == 0),
              "block %d-%d (k %d): rows by depth %lld %lld %lld ... (%s)", kmin, kmax, k, (long long)st.n[0],
              (long long)st.n[1], (long long)st.n[2], g_err);
    }
out:
    free(grad);
    if (o.m) sd_adamw_free(&o);
    sd_trainer_free(tr);
    free(D.feats);
    free(D.red);
    D.feats = D.red = NULL;
    sd_head_free(h);
    sd_model_free(m);
}

static void test_moa_learns_pattern(void) { learns_pattern("llama", 0, 0, 0); }

// sd_moa_block draws every k of its range, and only those.
static void test_moa_block_range(void) {
    const int range[3][2] = {{SD_MOA_BLOCK_MIN, SD_MOA_BLOCK_MAX}, {2, 5}, {3, 3}};
    for (int c = 0; c < 3; c++) {
        int seen[SD_TRAIN_MOA_MAX_BLOCK + 1] = {0}, bad = 0;
        uint32_t x = 12345;
        for (int i = 0; i < 2000; i++) {
            int32_t t[24];
            for (int j = 0; j < 24; j++) t[j] = (int32_t)((x = x * 1664525u + 1013904223u) >> 16);
            const int k = sd_moa_block(t, 24, range[c][0], range[c][1]);
            if (k < range[c][0] || k > range[c][1]) bad++;
            else seen[k]++;
        }
        int missing = 0;
        for (int k = range[c][0]; k <= range[c][1]; k++) missing += seen[k] < 2000 / (range[c][1] - range[c][0] + 1) / 2;
        CHECK(!bad && !missing, "range %d-%d: %d draws outside, %d values drawn rarely", range[c][0], range[c][1], bad,
              missing);
    }
}
static void test_moa_tli_neox_learns_pattern(void) { learns_pattern("qwen2", 1, 0, 0); }
static void test_moa_nolsa_learns_pattern(void) { learns_pattern("qwen2", 1, 1, 0); }
// CA also reads the target's states (ca_hidden): TLI 0 the final normed state, TLI 1 the one entering the last layer
static void test_moa_ca_hidden_learns_pattern(void) {
    learns_pattern("llama", 0, 1, 1);
    learns_pattern("qwen2", 1, 1, 1);
    learns_pattern("llama", 0, 1, 3);   // and SA's input adds the last verified position's state (sa_hidden)
}

// Full-text SA (sa_full) learns what only the whole text holds: each text
// opens with one of 8 secret tokens, then 47 fillers of 2 others; rows 16..46
// must name the secret (rows 0..15 are not scored, so no scored row's block,
// k <= 15, reaches position 0). CA is blinded (TLI 0, no LSA, every K,V row
// and state zero: CA reads a constant), so only SA can carry the secret.
// 32 training texts, 8 held out (one per secret: a constant guess scores
// 1/8), 500 steps, the share of full-text sequences rising to 1 over the
// first 250 (the curriculum; with 16 kinds of filler it learns too, but
// slowly: 0.74 after 1,000 steps). Eleven seeds gave 0.93-1.00. Bars: full-text SA >= 0.8 held out, the bit
// cleared <= 0.25; the runner (the context's zero rows and tokens, then the
// root row) within 5 points of the trainer.
#define S_N 40
#define S_TRAIN 32
static void test_moa_sa_full_secret(void) {
    sd_model *m = tf_synth_model(64, 2, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    static int32_t tok[S_N][T_SEQ], ids[S_N][T_SEQ];
    static float pr[S_N][T_SEQ];
    sd_rng rng;
    sd_rng_seed(&rng, 11);
    for (int q = 0; q < S_N; q++) {
        const int32_t secret = 100 + 7 * (q % 8);
        tok[q][0] = secret;
        for (int t = 1; t < T_SEQ; t++) tok[q][t] = 200 + (int32_t)(sd_rng_next(&rng) % 2);
        for (int t = 0; t < T_SEQ; t++) ids[q][t] = t >= 16 && t < T_SEQ - 1 ? secret : -1, pr[q][t] = 1.0f;
    }
    double res[2] = {-1, -1}, run_agree = -1, d0 = -1;
    for (int full = 1; full >= 0; full--) {
        sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_MOA);
        hp.n_draft_vocab = m->hp.n_vocab;
        hp.moa_no_lsa = 1;
        hp.moa_sa_full = full;
        sd_head *h = NULL;
        sd_trainer *tr = NULL;
        sd_moa_run *r = NULL;
        float *grad = NULL, *feats = NULL, *kv = NULL, *lg = NULL;
        sd_adamw o = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .clip = 1.0f, .warmup = 20, .total = 500};
        if (sd_head_new(&h, &hp, g_err, sizeof g_err) < 0 ||
            sd_trainer_new(&tr, h, m, T_SEQ, 1, NULL, g_err, sizeof g_err) < 0 ||
            sd_adamw_init(&o, h->n_w, g_err, sizeof g_err) < 0 || !(grad = calloc(h->n_w, sizeof(float))) ||
            !(feats = calloc((size_t)T_SEQ * (size_t)sd_moa_n_feat(h), sizeof(float)))) {
            CHECK(0, "setup: %s", g_err);
            goto next;
        }
        sd_head_init(h, 5);
        for (int it = 0; it < 500; it++) {
            sd_trainer_set_moa_sa_full(tr, it >= 250 ? 1.0f : (float)it / 250.0f, (uint64_t)it);
            memset(grad, 0, sizeof(float) * h->n_w);
            const int q = it % S_TRAIN;
            sd_train_seq s = {T_SEQ, tok[q], feats, ids[q], pr[q], 1, 0, NULL};
            if (sd_trainer_loss(tr, &s, grad, NULL, g_err, sizeof g_err) < 0) {
                CHECK(0, "step %d: %s", it, g_err);
                goto next;
            }
            sd_adamw_step(&o, h, grad);
        }
        sd_trainer_set_moa_sa_full(tr, 1.0f, 0);
        int64_t n = 0, a = 0, n0 = 0, a0 = 0;
        for (int q = S_TRAIN; q < S_N; q++) {
            sd_train_seq s = {T_SEQ, tok[q], feats, ids[q], pr[q], 1, 0, NULL};
            sd_train_stats st;
            sd_trainer_loss(tr, &s, NULL, &st, g_err, sizeof g_err);
            for (int d = 0; d < SD_HEAD_MAX_MEDUSA; d++) n += st.n[d], a += st.agree[d];
            n0 += st.n[0], a0 += st.agree[0];
        }
        res[full] = n ? (double)a / (double)n : -1;
        if (full) d0 = n0 ? (double)a0 / (double)n0 : -1;   // (depth 0: the rows at block starts, as the runner's)
        if (full) {   // the runner: depth 0 at every block start from 16 on
            const size_t row = (size_t)m->hp.n_layer * h->hp.moa_kv_width + 2 * (size_t)h->hp.n_embd;
            kv = calloc(SD_MOA_ROWS * row, sizeof(float));
            lg = malloc(sizeof(float) * (size_t)h->hp.n_draft_vocab);
            if (!kv || !lg || sd_moa_run_new(&r, h, m, T_SEQ, 64, SD_TYPE_F32, 0, NULL, g_err, sizeof g_err) < 0) {
                CHECK(0, "runner: %s", g_err);
                goto next;
            }
            int64_t rn = 0, ran = 0;
            for (int q = S_TRAIN; q < S_N; q++) {
                const int k = sd_moa_block(tok[q], T_SEQ, SD_MOA_BLOCK_MIN, SD_MOA_BLOCK_MAX);
                for (int b0 = (16 + k - 1) / k * k; b0 < T_SEQ - 1; b0 += k) {
                    sd_moa_run_truncate(r, 0);
                    if (sd_moa_run_context(r, kv, NULL, tok[q], b0, g_err, sizeof g_err) < 0) {
                        CHECK(0, "runner context: %s", g_err);
                        goto next;
                    }
                    const int32_t pos = b0, par = -1;
                    if (sd_moa_run_eval(r, &tok[q][b0], &pos, &par, 1, lg, NULL, g_err, sizeof g_err) < 0) {
                        CHECK(0, "runner eval: %s", g_err);
                        goto next;
                    }
                    int best = 0;
                    for (int v = 1; v < h->hp.n_draft_vocab; v++) best = lg[v] > lg[best] ? v : best;
                    rn++;
                    ran += h->d2t[best] == ids[q][b0];
                }
            }
            run_agree = rn ? (double)ran / (double)rn : -1;
        }
    next:
        free(grad);
        free(feats);
        free(kv);
        free(lg);
        if (o.m) sd_adamw_free(&o);
        sd_moa_run_free(r);
        sd_trainer_free(tr);
        sd_head_free(h);
    }
    printf("  info: the secret at position 0, CA blinded: held-out agreement %.2f with full-text SA (at block "
           "starts %.2f, the runner's %.2f), %.2f without\n", res[1], d0, run_agree, res[0]);
    CHECK(res[1] >= 0.8, "full-text SA did not learn the secret (%.2f)", res[1]);
    CHECK(res[0] >= 0 && res[0] <= 0.25, "without full-text SA the secret was learnt (%.2f): the test cannot tell",
          res[0]);
    CHECK(run_agree >= 0 && fabs(run_agree - d0) <= 0.05, "the runner's agreement %.2f, the trainer's %.2f", run_agree,
          d0);
    sd_model_free(m);
}

// Full-text SA on the planted pattern, trained with every sequence seeing the
// whole text: TLI 0 with LSA (llama), TLI 1 without (qwen2); the runner agrees.
static void test_moa_sa_full_learns_pattern(void) {
    learns_pattern("llama", 0, 0, 4);
    learns_pattern("qwen2", 1, 1, 4);
}

int main(void) {
    tf_init("test_moa_train");
    static char data[512];
    tf_path(data, sizeof data, "moa.jsonl");
    tf_write_corpus(data, 24, 30, 5, 0);
    g_data[0] = data;
    T_RUN(test_moa_block_range);
    T_RUN(test_moa_learns_pattern);
    T_RUN(test_moa_tli_neox_learns_pattern);
    T_RUN(test_moa_nolsa_learns_pattern);
    T_RUN(test_moa_ca_hidden_learns_pattern);
    T_RUN(test_moa_sa_full_learns_pattern);
    T_RUN(test_moa_sa_full_secret);
    T_RUN(test_moa_resume_bit_identical);
    tf_done();
    T_EXIT();
}

// test_answers.c - train-head --score answers (src/train/answers.c, the
// trainer's mask): in a ChatML conversation exactly the positions whose next
// token the assistant wrote (its end-of-turn token included) are marked,
// across two exchanges, none in a text record; a model without a chat
// template is refused with the reason; and in the trainer a position the
// mask leaves out contributes nothing: the loss and gradient equal those of
// the same sequence with that position's target distribution removed, and
// differ from the unmasked ones.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/head.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "specdec.h"
#include "t.h"
#include "train/answers.h"
#include "train/train.h"

#define NV 320
#define SEQ_T 24
#define TOPK 4

static char g_err[512];

static sd_model *chatml_model(int chatml) {
    synth_params p = synth_default_params();
    p.n_vocab = NV;
    p.chatml = chatml;
    return sc_synth_model(&p, "answers", chatml ? "chatml" : "plain", g_err, sizeof g_err);
}

static int chat_ids(const sd_tokenizer *t, const char *const *roles, const char *const *contents, int n, int32_t *out,
                    int max) {
    return sd_chat_tokenize_messages(t, roles, contents, n, out, max, g_err, sizeof g_err);
}

// Two exchanges: the expected marks from the template's own prefixes (the
// conversation up to each reply ends with the header the reply follows).
static void test_marks_chatml(void) {
    sd_model *m = chatml_model(1);
    CHECK(m, "synthetic ChatML model: %s", g_err);
    if (!m) return;
    const sd_tokenizer *t = sd_model_tokenizer(m);
    sd_answers a;
    CHECK(sd_answers_init(&a, t, g_err, sizeof g_err) == 0, "init: %s", g_err);
    int has_start = 0;   // (this vocabulary spells the newline and "assistant" in byte tokens around it)
    for (int i = 0; i < a.n_hdr; i++) has_start |= a.hdr[i] == NV - 2;
    CHECK(a.eot == NV - 1 && a.n_hdr >= 2 && has_start, "eot %d, header of %d tokens", a.eot, a.n_hdr);
    const char *roles[4] = {"user", "assistant", "user", "assistant"};
    const char *contents[4] = {"w1 w2 w3", "w4 w5 w6 w7 w8", "w9", "w10 w11"};
    int32_t ids[512], p1[512], p2[512];
    const int n = chat_ids(t, roles, contents, 4, ids, 512);
    const int n1 = chat_ids(t, roles, contents, 1, p1, 512), n2 = chat_ids(t, roles, contents, 3, p2, 512);
    CHECK(n > n2 && n2 > n1 && n1 > 0 && n <= 512, "lengths %d %d %d: %s", n1, n2, n, g_err);
    if (!(n > n2 && n2 > n1 && n1 > 0 && n <= 512)) goto done;
    CHECK(!memcmp(ids, p1, sizeof(int32_t) * (size_t)n1) && !memcmp(ids, p2, sizeof(int32_t) * (size_t)n2),
          "the conversation starts with its prefixes");
    int e1 = n1, e2 = n2;   // each reply's end-of-turn token
    while (e1 < n && ids[e1] != a.eot) e1++;
    while (e2 < n && ids[e2] != a.eot) e2++;
    CHECK(e1 > n1 + 2 && e2 > n2 + 1 && e2 < n, "replies at %d..%d and %d..%d of %d", n1, e1, n2, e2, n);
    sd_answers_state s = {0};
    int bad = -1, n_in = 0;
    for (int p = 0; p < n; p++) {
        sd_answers_feed(&a, &s, ids[p]);
        // the token after p is the assistant's (or p ends the trailing header a reply would follow)
        const int want = (p + 1 >= n1 && p + 1 <= e1) || (p + 1 >= n2 && p + 1 <= e2) || p == n - 1;
        if (s.in != want && bad < 0) bad = p;
        n_in += s.in;
    }
    CHECK(bad < 0, "position %d of %d marked %d (replies %d..%d, %d..%d)", bad, n, !(bad >= 0), n1, e1, n2, e2);
    CHECK(s.chat && n_in == (e1 - n1 + 1) + (e2 - n2 + 1) + 1, "%d positions marked", n_in);
    // A text record has no end-of-turn token and nothing marked.
    int32_t tx[64];
    const int nt = sd_tokenize(t, "w1 w2 assistant w3", 18, 1, 0, tx, 64);
    sd_answers_state u = {0};
    int any = 0;
    for (int p = 0; p < nt; p++) sd_answers_feed(&a, &u, tx[p]), any |= u.in;
    CHECK(nt > 0 && !u.chat && !any, "text record: chat %d, marked %d", u.chat, any);
done:
    sd_model_free(m);
}

static void test_no_template(void) {
    sd_model *m = chatml_model(0);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    sd_answers a;
    g_err[0] = 0;
    CHECK(sd_answers_init(&a, sd_model_tokenizer(m), g_err, sizeof g_err) < 0 && strstr(g_err, "chat template"),
          "refused with the reason: %s", g_err);
    sd_model_free(m);
}

// The trainer with a mask equals the trainer on the sequence whose masked
// positions have no target distribution (same bits), and not the unmasked.
static void test_trainer_mask(void) {
    sd_model *m = chatml_model(1);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    sd_head_hp hp = sd_head_default_hp(m, SD_HEAD_EAGLE3);
    hp.n_draft_vocab = NV;
    sd_head *h = NULL;
    sd_trainer *tr = NULL;
    CHECK(sd_head_new(&h, &hp, g_err, sizeof g_err) == 0, "head: %s", g_err);
    if (!h) goto done;
    sd_head_init(h, 3);
    CHECK(sd_trainer_new(&tr, h, m, SEQ_T, 3, NULL, g_err, sizeof g_err) == 0, "trainer: %s", g_err);
    if (!tr) goto done;
    const int nf = 3 * m->hp.n_embd;
    static int32_t tok[SEQ_T], ids[SEQ_T * TOPK], ids_cut[SEQ_T * TOPK];
    static float pr[SEQ_T * TOPK];
    static uint8_t score[SEQ_T];
    float *feat = malloc(sizeof(float) * SEQ_T * (size_t)nf);
    float *g[3] = {calloc(h->n_w, sizeof(float)), calloc(h->n_w, sizeof(float)), calloc(h->n_w, sizeof(float))};
    sd_rng r;
    sd_rng_seed(&r, 5);
    for (int p = 0; p < SEQ_T; p++) {
        tok[p] = 259 + (int)(sd_rng_next(&r) % 50);
        score[p] = (uint8_t)(p % 3 != 0 && p != 7);
        for (int k = 0; k < TOPK; k++) {
            ids[p * TOPK + k] = 259 + (int)(sd_rng_next(&r) % 50);
            pr[p * TOPK + k] = (float)(TOPK - k) / (TOPK * (TOPK + 1) / 2);
            ids_cut[p * TOPK + k] = score[p] ? ids[p * TOPK + k] : -1;
        }
    }
    for (int i = 0; feat && i < SEQ_T * nf; i++) feat[i] = (float)(2.0 * sd_rng_uniform(&r) - 1.0);
    if (!feat || !g[0] || !g[1] || !g[2]) goto free_all;
    const sd_train_seq masked = {SEQ_T, tok, feat, ids, pr, TOPK, 0, score};
    const sd_train_seq cut = {SEQ_T, tok, feat, ids_cut, pr, TOPK, 0, NULL};
    const sd_train_seq full = {SEQ_T, tok, feat, ids, pr, TOPK, 0, NULL};
    sd_train_stats st[3];
    memset(st, 0, sizeof st);
    const double l0 = sd_trainer_loss(tr, &masked, g[0], &st[0], g_err, sizeof g_err);
    const double l1 = sd_trainer_loss(tr, &cut, g[1], &st[1], g_err, sizeof g_err);
    const double l2 = sd_trainer_loss(tr, &full, g[2], &st[2], g_err, sizeof g_err);
    CHECK(l0 >= 0 && l1 >= 0 && l2 >= 0 && isfinite(l0), "losses %g %g %g: %s", l0, l1, l2, g_err);
    CHECK(l0 == l1 && !memcmp(g[0], g[1], sizeof(float) * h->n_w), "masked %g against cut %g: gradients %s", l0, l1,
          memcmp(g[0], g[1], sizeof(float) * h->n_w) ? "differ" : "equal");
    CHECK(st[0].n[0] == st[1].n[0] && st[0].n[0] < st[2].n[0] && st[0].n[0] > 0, "scored rows %lld %lld %lld",
          (long long)st[0].n[0], (long long)st[1].n[0], (long long)st[2].n[0]);
    CHECK(l0 != l2 && memcmp(g[0], g[2], sizeof(float) * h->n_w), "the mask changes the loss (%g against %g)", l0, l2);
free_all:
    free(feat);
    for (int i = 0; i < 3; i++) free(g[i]);
done:
    sd_trainer_free(tr);
    sd_head_free(h);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_marks_chatml);
    T_RUN(test_no_template);
    T_RUN(test_trainer_mask);
    T_EXIT();
}

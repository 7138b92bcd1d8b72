// test_answers.c - train-head --score answers (src/train/answers.c, the
// trainer's mask): in a ChatML conversation exactly the positions whose next
// token the assistant wrote (its end-of-turn token included) are marked,
// across two exchanges, none in a text record; a model without a chat
// template is refused with the reason; and in the trainer a position the
// mask leaves out contributes nothing: the loss and gradient equal those of
// the same sequence with that position's target distribution removed, and
// differ from the unmasked ones.
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "head/head.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "lib/train_fixture.h"
#include "model/model.h"
#include "specdec.h"
#include "specdec_train.h"
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

typedef struct stopper {
    volatile sig_atomic_t flag;
    int64_t stop_at;
} stopper;

static void on_progress(void *user, const sd_train_progress *p) {
    stopper *w = user;
    if (p->phase == SD_TRAIN_PHASE_STEP && p->step == w->stop_at) w->flag = 1;
}

// A training run with --score answers on chat records: it stops and resumes
// (the mode is in the checkpoint: resuming with --score all is refused), and
// its draft vocabulary is counted over other positions than a run scoring
// every position (another coverage). On a corpus of text records (scored in
// full either way) the two modes train the same bits.
static void test_run(void) {
    sd_model *m = chatml_model(1);
    CHECK(m, "synthetic ChatML model: %s", g_err);
    if (!m) return;
    char data[512], cache[512], out[512], ckpt[512];
    tf_path(data, sizeof data, "chat.jsonl");
    tf_path(cache, sizeof cache, "chat.cache");
    tf_path(out, sizeof out, "chat.gguf");
    tf_path(ckpt, sizeof ckpt, "chat.ckpt");
    FILE *f = fopen(data, "wb");
    sd_rng r;
    sd_rng_seed(&r, 9);
    for (int i = 0; f && i < 40; i++) {
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
        for (int w = 0; w < 6 + i % 5; w++) fprintf(f, "%sw%d", w ? " " : "", (int)(sd_rng_next(&r) % 50));
        fprintf(f, "\"}, {\"role\": \"assistant\", \"content\": \"");
        for (int w = 0; w < 4 + i % 3; w++) fprintf(f, "%sw%d", w ? " " : "", (int)(sd_rng_next(&r) % 50));
        fprintf(f, "\"}]}\n");
    }
    if (f) fclose(f);
    const char *paths[1] = {data};
    stopper w = {.flag = 0, .stop_at = 2};
    sd_train_head_params p = tf_run_params(m, paths, cache, out, ckpt);
    p.seq_len = 32;
    p.batch = 2;
    p.tokens = 6 * 2 * 32;
    p.draft_vocab = 64;
    p.heldout = 0.2;
    p.n_threads = 1;
    p.score_answers = 1;
    p.stop = &w.flag;
    p.progress = on_progress;
    p.user = &w;
    sd_train_head_result res, all;
    CHECK(sd_train_head(&p, &res, g_err, sizeof g_err) == 1, "a stopped run: %s", g_err);
    sd_train_head_params q = p;
    q.resume = 1;
    q.score_answers = 0;
    w.flag = 0;
    w.stop_at = -1;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--score answers") &&
              strstr(g_err, "--score all"),
          "resumed with another --score: %s", g_err);
    q.score_answers = 1;
    CHECK(sd_train_head(&q, &res, g_err, sizeof g_err) == 0 && res.eval_tokens > 0, "resumed: %s", g_err);
    q = p;
    q.score_answers = 0;
    q.stop = NULL;
    tf_path(ckpt, sizeof ckpt, "chat-all.ckpt");
    q.ckpt_path = ckpt;
    CHECK(sd_train_head(&q, &all, g_err, sizeof g_err) == 0, "scoring every position: %s", g_err);
    CHECK(res.eval_tokens == all.eval_tokens, "the same held-back split: %lld, %lld positions",
          (long long)res.eval_tokens, (long long)all.eval_tokens);
    CHECK(res.coverage > 0 && all.coverage > 0 && res.coverage != all.coverage,
          "the vocabulary's coverage counts other positions: %.4f, %.4f", res.coverage, all.coverage);
    // text records only
    tf_path(data, sizeof data, "text.jsonl");
    tf_write_corpus(data, 30, 9, 4, 0);
    tf_path(cache, sizeof cache, "text.cache");
    sd_train_head_result tx[2];
    for (int k = 0; k < 2; k++) {
        q = p;
        q.score_answers = k;
        q.stop = NULL;
        char name[64];
        snprintf(name, sizeof name, "text-%d.ckpt", k);
        tf_path(ckpt, sizeof ckpt, name);
        q.ckpt_path = ckpt;
        CHECK(sd_train_head(&q, &tx[k], g_err, sizeof g_err) == 0, "text corpus, --score %s: %s",
              k ? "answers" : "all", g_err);
    }
    CHECK(tx[0].loss == tx[1].loss && tx[0].eval_loss == tx[1].eval_loss && tx[0].coverage == tx[1].coverage,
          "text records scored in full: loss %g / %g, held back %g / %g", tx[0].loss, tx[1].loss, tx[0].eval_loss,
          tx[1].eval_loss);
    sd_model_free(m);
}

int main(void) {
    tf_init("answers");
    T_RUN(test_marks_chatml);
    T_RUN(test_no_template);
    T_RUN(test_trainer_mask);
    T_RUN(test_run);
    tf_done();
    T_EXIT();
}

// test_train_loop.c - the training loop of `specdec train-head`
// (src/train/loop.c, loop_data.c, ckpt.c; include/specdec_train.h) and the
// command (tools/cmd_train_head.c) on tiny synthetic models and a real one
// (tf_real_target: stories260K, else the default model): a stopped and
// resumed run ends with the same parameters, bit for bit, as one never
// interrupted; a full disk keeps the previous checkpoint; foreign or
// mismatched checkpoints, an existing checkpoint without --resume and missing
// data are refused; a short run on the real model raises the held-back
// agreement; Medusa runs; a head's vocabulary grows with --init; the
// command's help, errors, a run and Ctrl-C.
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "specdec.h"
#include "specdec_train.h"
#include "head/head.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/model.h"
#include "lib/cli_run.h"
#include "lib/train_fixture.h"
#include "t.h"
#include "train/ckpt.h"

static char g_err[1024];

// ---------------------------------------------------------------- the loop
typedef struct watch {
    volatile sig_atomic_t flag;
    int64_t stop_at;          // set the stop flag after this step (-1: never)
    int64_t limit_after_ckpt; // lower RLIMIT_FSIZE once the checkpoint of this step is written (-1: never)
    int saw_stop_note, saw_fail_note, n_steps_seen;
    long ckpt_bytes;
} watch;

static void on_progress(void *user, const sd_train_progress *p) {
    watch *w = user;
    if (p->phase == SD_TRAIN_PHASE_STEP) {
        w->n_steps_seen++;
        if (w->stop_at >= 0 && p->step == w->stop_at) w->flag = 1;
    }
    if (p->phase != SD_TRAIN_PHASE_NOTE) return;
    if (strstr(p->note, "stopped at step")) w->saw_stop_note = 1;
    if (strstr(p->note, "failed") && strstr(p->note, "training goes on")) w->saw_fail_note = 1;
    char want[64];
    snprintf(want, sizeof want, "written at step %lld", (long long)w->limit_after_ckpt);
    if (w->limit_after_ckpt >= 0 && strstr(p->note, want)) {
        struct rlimit rl = {.rlim_cur = 4096, .rlim_max = 4096};
        signal(SIGXFSZ, SIG_IGN);   // a write past the limit then fails with EFBIG instead of killing
        setrlimit(RLIMIT_FSIZE, &rl);
    }
}

static const char *g_data[1];

static sd_train_head_params small_run(const sd_model *m, const char *tag, watch *w) {
    static char out[8][512], ckpt[8][512], cache[512];
    static int k;
    k = (k + 1) % 8;
    snprintf(out[k], sizeof out[k], "%s/%s.gguf", tf_dir(), tag);
    snprintf(ckpt[k], sizeof ckpt[k], "%s/%s.ckpt", tf_dir(), tag);
    tf_path(cache, sizeof cache, "loop.cache");
    sd_train_head_params p = sd_train_head_default_params();
    p.model = m;
    p.data_paths = g_data;
    p.n_data = 1;
    p.cache_dir = cache;
    p.out_path = out[k];
    p.ckpt_path = ckpt[k];
    p.out_type = SD_TRAIN_OUT_F32;
    p.draft_vocab = 64;
    p.ttt_steps = 2;
    p.seq_len = 8;
    p.batch = 2;
    p.tokens = 8 * 2 * 8;   // 8 steps or a few more (sequences at the ends of records are shorter)
    p.lr = 1e-2f;
    p.warmup = 2;
    p.n_threads = 2;
    p.ckpt_minutes = 0;
    p.heldout = 0.2;
    p.eval_every = 3;
    p.topk = 4;
    p.n_ctx = 16;
    p.n_batch = 8;
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

static int same_params(const sd_head *a, const sd_head *b) {
    return a && b && a->n_w == b->n_w && !memcmp(a->w, b->w, a->n_w * sizeof(float)) &&
           a->hp.n_draft_vocab == b->hp.n_draft_vocab &&
           !memcmp(a->d2t, b->d2t, sizeof(int32_t) * (size_t)a->hp.n_draft_vocab);
}

// N steps in one run give the same parameters, bit for bit, as N/2 steps,
// a stop (the flag: a checkpoint is written, no head), and a resumed run of
// the rest; another seed gives other parameters.
static void test_resume_bit_identical(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w0 = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params pa = small_run(m, "whole", &w0);
    sd_train_head_result ra;
    int r = sd_train_head(&pa, &ra, g_err, sizeof g_err);
    CHECK(r == 0 && !ra.stopped && ra.n_steps >= 8 && ra.step == ra.n_steps && w0.n_steps_seen == ra.n_steps,
          "uninterrupted: %d step %lld of %lld %s", r, (long long)ra.step, (long long)ra.n_steps, g_err);
    CHECK(ra.draft_vocab == 64 && ra.coverage > 0 && ra.coverage <= 1, "vocabulary %d coverage %g", ra.draft_vocab,
          ra.coverage);
    CHECK(ra.eval_tokens > 0, "the held-back split was evaluated");

    watch w1 = {.stop_at = 4, .limit_after_ckpt = -1};
    sd_train_head_params pb = small_run(m, "halves", &w1);
    sd_train_head_result rb;
    r = sd_train_head(&pb, &rb, g_err, sizeof g_err);
    CHECK(r == 1 && rb.stopped && rb.step == 4, "stopped: %d step %lld %s", r, (long long)rb.step, g_err);
    CHECK(w1.saw_stop_note, "the stop is reported");
    CHECK(tf_file_len(pb.out_path) < 0, "no head is written at a stop");
    sd_head *hc = NULL;
    sd_adamw oc;
    sd_ckpt_recipe rc;
    sd_ckpt_state sc;
    CHECK(sd_ckpt_load(pb.ckpt_path, m, &hc, &oc, &rc, &sc, g_err, sizeof g_err) == 0 && sc.step == 4 && oc.t == 4,
          "the checkpoint holds step 4: %s", g_err);
    if (hc) {
        sd_head_free(hc);
        sd_adamw_free(&oc);
    }
    watch w2 = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params pc = small_run(m, "halves", &w2);
    pc.resume = 1;
    r = sd_train_head(&pc, &rb, g_err, sizeof g_err);
    CHECK(r == 0 && rb.step == ra.n_steps && w2.n_steps_seen == ra.n_steps - 4,
          "resumed: %d step %lld (%d steps run) %s", r, (long long)rb.step, w2.n_steps_seen, g_err);
    sd_head *ha = load_head(pa.out_path, m), *hb = load_head(pc.out_path, m);
    CHECK(ha && hb, "heads load: %s", g_err);
    CHECK(same_params(ha, hb), "resumed parameters differ from the uninterrupted run's");
    char steps[32];
    snprintf(steps, sizeof steps, "steps=%lld\n", (long long)ra.n_steps);
    CHECK(ha && strstr(ha->note, steps) && strstr(ha->note, "seed=42"), "the recipe note: %s", ha ? ha->note : "");

    watch w3 = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params pd = small_run(m, "seed43", &w3);
    pd.seed = 43;
    CHECK(sd_train_head(&pd, NULL, g_err, sizeof g_err) == 0, "seed 43: %s", g_err);
    sd_head *hd = load_head(pd.out_path, m);
    CHECK(hd && !same_params(ha, hd), "another seed gives other parameters (the comparison means something)");
    sd_head_free(ha);
    sd_head_free(hb);
    sd_head_free(hd);
    sd_model_free(m);
}

// A full disk (a file size limit) while writing a checkpoint keeps the
// previous one intact and leaves no temporary; training goes on, and the
// final head, which cannot be written either, is an error.
static void test_full_disk_keeps_checkpoint(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = 2};
    sd_train_head_params p = small_run(m, "fulldisk", &w);
    p.ckpt_every = 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int r = sd_train_head(&p, NULL, g_err, sizeof g_err);
        int ok = r < 0 && w.saw_fail_note && (strstr(g_err, "File too large") || strstr(g_err, "write"));
        if (!ok) printf("  child: r %d, fail note %d, '%s'\n", r, w.saw_fail_note, g_err);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw the checkpoint fail and the head save fail");
    sd_head *h = NULL;
    sd_adamw o;
    sd_ckpt_recipe rc;
    sd_ckpt_state sc;
    CHECK(sd_ckpt_load(p.ckpt_path, m, &h, &o, &rc, &sc, g_err, sizeof g_err) == 0 && sc.step == 2,
          "the checkpoint of step 2 is intact: %s (step %lld)", g_err, h ? (long long)sc.step : -1);
    if (h) {
        sd_head_free(h);
        sd_adamw_free(&o);
    }
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", p.ckpt_path);
    CHECK(tf_file_len(tmp) < 0, "no checkpoint temporary is left behind");
    snprintf(tmp, sizeof tmp, "%s.tmp", p.out_path);
    CHECK(tf_file_len(tmp) < 0 && tf_file_len(p.out_path) < 0, "no head file nor temporary");
    sd_model_free(m);
}

// Checkpoints and runs that do not fit are refused with a message: another
// target, other settings, --score answers on a model without a chat
// template, an existing checkpoint without --resume, --resume without one,
// a missing data file.
static void test_refusals(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err), *m2 = tf_synth_model(32, 4, 1, g_err, sizeof g_err);
    CHECK(m && m2, "synthetic models: %s", g_err);
    if (!m || !m2) {
        sd_model_free(m);
        sd_model_free(m2);
        return;
    }
    watch w = {.stop_at = 2, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "refuse", &w);
    CHECK(sd_train_head(&p, NULL, g_err, sizeof g_err) == 1, "a stopped run: %s", g_err);
    w.stop_at = -1;
    w.flag = 0;
    sd_train_head_params q = p;
    q.resume = 1;
    q.model = m2;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "belongs to another target") &&
              strstr(g_err, "hidden size"),
          "another target: %s", g_err);
    q = p;
    q.resume = 1;
    q.seq_len = 16;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--seq-len 8") && strstr(g_err, "16"),
          "other settings: %s", g_err);
    q = p;
    q.resume = 1;
    q.score_answers = 1;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--score answers") &&
              strstr(g_err, "chat template"),
          "--score answers without a chat template: %s", g_err);
    q = p;
    q.resume = 1;
    q.type = SD_HEAD_MEDUSA;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "EAGLE-3"), "other type: %s", g_err);
    q = p;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "exists") && strstr(g_err, "--resume"),
          "an existing checkpoint: %s", g_err);
    q = small_run(m, "nockpt", &w);
    q.resume = 1;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "no checkpoint"), "nothing to resume: %s",
          g_err);
    q = small_run(m, "nodata", &w);
    const char *absent[1] = {"/nonexistent/dir/data.jsonl"};
    q.data_paths = absent;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "not found") &&
              strstr(g_err, "/nonexistent/dir/data.jsonl"),
          "missing data: %s", g_err);
    // --init: a file that is not a head, a head of another target, a head of this one
    q = small_run(m2, "init", &w);
    q.init_path = p.ckpt_path;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--init"), "not a head: %s", g_err);
    sd_train_head_params h = small_run(m, "inithead", &w);
    CHECK(sd_train_head(&h, NULL, g_err, sizeof g_err) == 0, "a head to start from: %s", g_err);
    q = small_run(m2, "init2", &w);
    q.init_path = h.out_path;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--init") && strstr(g_err, "hidden size"),
          "a head of another target: %s", g_err);
    q = small_run(m, "init3", &w);
    q.init_path = h.out_path;
    sd_train_head_result ri;
    CHECK(sd_train_head(&q, &ri, g_err, sizeof g_err) == 0 && ri.draft_vocab == 64, "a head of this target: %s",
          g_err);
    sd_model_free(m);
    sd_model_free(m2);
}

// --init with a larger --draft-vocab: the head's tokens and parameters are
// kept (a learning rate of 1e-30 leaves every weight as it was), the added
// tokens' output rows are the target's, all scaled by one factor: the median
// ratio of the head's row norms to the target's rows of its tokens; the
// coverage does not fall; a smaller vocabulary is refused.
static float row_norm(const float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)v[i] * v[i];
    return (float)sqrt(s);
}
static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static int near(float a, float b, float rel) { return fabsf(a - b) <= rel * fabsf(b) + 1e-20f; }

static void test_grow_vocab(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "grow0", &w);
    sd_train_head_result r0, r1;
    CHECK(sd_train_head(&p, &r0, g_err, sizeof g_err) == 0 && r0.draft_vocab == 64, "a 64-token head: %s", g_err);
    sd_train_head_params q = small_run(m, "grow1", &w);
    q.init_path = p.out_path;
    q.draft_vocab = 96;
    q.lr = 1e-30f;
    CHECK(sd_train_head(&q, &r1, g_err, sizeof g_err) == 0 && r1.draft_vocab == 96, "grown to 96: %s", g_err);
    CHECK(r1.coverage >= r0.coverage, "coverage %.3f -> %.3f", r0.coverage, r1.coverage);
    sd_head *a = load_head(p.out_path, m), *b = load_head(q.out_path, m);
    CHECK(a && b && b->hp.n_draft_vocab == 96 && b->n_t == a->n_t, "both heads load: %s", g_err);
    if (a && b && b->n_t == a->n_t) {
        const int d = a->hp.n_embd;
        int same = 1, kept = 1, n_new = 0, prop = 1;
        for (int i = 0; i < a->n_t; i++)
            if (i != SD_E3_OUT)
                for (int64_t j = 0; j < a->t[i].ne0 * a->t[i].ne1; j++)
                    same &= near(sd_head_w(b, i)[j], sd_head_w(a, i)[j], 1e-6f);
        const sd_tensor *ot = sd_model_file_tensor(m, m->output);
        const sd_type_traits *tt = sd_type_get(ot->type);
        const size_t rb = sd_row_size(ot->type, d);
        float trow[64], ratio[64], scale = -1;
        for (int k = 0; k < 64; k++) {   // the scale as the head's rows against the target's
            tt->to_float((const uint8_t *)ot->data + (size_t)a->d2t[k] * rb, trow, d);
            ratio[k] = row_norm(sd_head_w(a, SD_E3_OUT) + (size_t)k * d, d) / row_norm(trow, d);
        }
        qsort(ratio, 64, sizeof *ratio, cmp_f);
        for (int k = 0; k < 96; k++) {
            const float *br = sd_head_w(b, SD_E3_OUT) + (size_t)k * d;
            const int old = a->t2d[b->d2t[k]];
            if (old >= 0) {
                for (int c = 0; c < d; c++) kept &= near(br[c], sd_head_w(a, SD_E3_OUT)[(size_t)old * d + c], 1e-6f);
                continue;
            }
            n_new++;
            tt->to_float((const uint8_t *)ot->data + (size_t)b->d2t[k] * rb, trow, d);
            for (int c = 0; c < d; c++) prop &= near(br[c], trow[c] * ratio[32], 1e-5f);
            if (scale < 0) scale = ratio[32];
        }
        int all_old = 1;
        for (int k = 0; k < 64; k++) all_old &= b->t2d[a->d2t[k]] >= 0;
        CHECK(all_old && n_new == 32, "the head's 64 tokens kept, 32 added (%d)", n_new);
        CHECK(same, "every other parameter kept");
        CHECK(kept, "the kept tokens' output rows are the head's");
        CHECK(prop && scale > 0, "the added rows are the target's times the median norm ratio %.3f", scale);
    }
    sd_head_free(a);
    sd_head_free(b);
    sd_train_head_params s = small_run(m, "grow2", &w);
    s.init_path = p.out_path;
    s.draft_vocab = 32;
    CHECK(sd_train_head(&s, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "not shrink") && strstr(g_err, "64"),
          "a smaller vocabulary is refused: %s", g_err);
    sd_model_free(m);
}

// --ff: a narrower feed-forward layer than the target's is trained, saved
// and loaded with that width; a checkpoint of another width is refused.
static void test_head_ff(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "ff40", &w);
    p.head_ff = 40;
    const int target_ff = sd_head_default_hp(m, SD_HEAD_EAGLE3).n_ff;
    CHECK(target_ff != 40, "the target's width (%d) differs from the head's", target_ff);
    CHECK(sd_train_head(&p, NULL, g_err, sizeof g_err) == 0, "--ff 40: %s", g_err);
    sd_head *h = load_head(p.out_path, m);
    CHECK(h && h->hp.n_ff == 40 && h->t[SD_E3_DOWN].ne0 == 40, "a head of width 40: %s", g_err);
    sd_head_free(h);
    w.stop_at = 2;
    sd_train_head_params q = small_run(m, "ff40stop", &w);
    q.head_ff = 40;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) == 1, "a stopped run: %s", g_err);
    w.stop_at = -1;
    w.flag = 0;
    q.resume = 1;
    q.head_ff = 48;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "feed-forward width of 40"),
          "another width on resume: %s", g_err);
    q.resume = 0;
    q.type = SD_HEAD_MEDUSA;
    CHECK(sd_train_head(&q, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "--ff 48"), "--ff for Medusa: %s", g_err);
    sd_model_free(m);
}

// Evaluations seen by a run.
typedef struct evals {
    int n;
    double loss[64], agree0[64];
} evals;

static void on_eval(void *user, const sd_train_progress *p) {
    evals *e = user;
    if (p->phase == SD_TRAIN_PHASE_EVAL && e->n < 64) {
        e->loss[e->n] = p->eval_loss;
        e->agree0[e->n++] = p->eval_agree[0];
    }
}

// A real model learns (stories260K, else the default model: a random
// synthetic target does not reach these bars in 40 steps): over 40 steps the
// held-back loss falls and the top-1 agreement of the first
// training-time-test step rises well above where it started (the loop feeds
// the trainer the cache's aligned data and applies its gradients).
static void test_learns_stories(void) {
    char why[256], data[512], cache[512], out[512], ckpt[512];
    const char *gguf = tf_real_target(t_shared_dir(), why, sizeof why);
    if (!gguf) SKIP("%s", why);
    sd_model *m = NULL;
    sd_model_load(&m, gguf, g_err, sizeof g_err);
    CHECK(m, "%s: %s", gguf, g_err);
    if (!m) return;
    tf_path(data, sizeof data, "learn.jsonl");
    tf_path(cache, sizeof cache, "learn.cache");
    tf_path(out, sizeof out, "learn.gguf");
    tf_path(ckpt, sizeof ckpt, "learn.ckpt");
    tf_stories_corpus(data, 16);
    const char *paths[1] = {data};
    evals ev = {0};
    sd_train_head_params p = tf_run_params(m, paths, cache, out, ckpt);
    p.seq_len = 32;
    p.batch = 4;
    p.tokens = 40 * 4 * 25;
    p.lr = 3e-3f;
    p.draft_vocab = 512;   // stories260K's whole vocabulary; a third less work on the default model
    p.heldout = 0.1;
    p.eval_every = 5;
    p.n_threads = 2;
    p.progress = on_eval;
    p.user = &ev;
    sd_train_head_result r;
    CHECK(sd_train_head(&p, &r, g_err, sizeof g_err) == 0, "run: %s", g_err);
    CHECK(ev.n >= 5, "%d evaluations", ev.n);
    if (ev.n >= 5) {
        CHECK(ev.loss[ev.n - 1] < 0.7 * ev.loss[0], "held-back loss %.3f -> %.3f", ev.loss[0], ev.loss[ev.n - 1]);
        CHECK(ev.agree0[ev.n - 1] > ev.agree0[0] + 0.2, "agreement %.3f -> %.3f", ev.agree0[0], ev.agree0[ev.n - 1]);
    }
    CHECK(r.tokens > 3000 && r.tokens < 5000, "about the positions asked for: %lld", (long long)r.tokens);
    sd_model_free(m);
}

// A Medusa run goes through and writes a Medusa head.
static void test_medusa_run(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "medusa", &w);
    char cache[512];
    tf_path(cache, sizeof cache, "medusa.cache");
    p.cache_dir = cache;
    p.type = SD_HEAD_MEDUSA;
    p.n_medusa = 2;
    p.out_type = SD_TRAIN_OUT_Q8_0;
    sd_train_head_result r;
    CHECK(sd_train_head(&p, &r, g_err, sizeof g_err) == 0 && r.n_agree == 2, "medusa: %s", g_err);
    sd_head *h = load_head(p.out_path, m);
    CHECK(h && h->hp.type == SD_HEAD_MEDUSA && h->hp.n_medusa == 2, "a Medusa head of 2: %s", g_err);
    sd_head_free(h);
    sd_model_free(m);
}

// --out-type q5_0: every matrix is written as Q5_0 and loads as the float
// head's weights rounded through Q5_0 (bit for bit); gains stay f32; the file
// is smaller than the Q8_0 one.
static void test_out_q5_0(void) {
    sd_model *m = tf_synth_model(64, 4, 1, g_err, sizeof g_err);
    CHECK(m, "synthetic model: %s", g_err);
    if (!m) return;
    watch w = {.stop_at = -1, .limit_after_ckpt = -1};
    sd_train_head_params p = small_run(m, "q5_0", &w);
    p.out_type = SD_TRAIN_OUT_Q5_0;
    sd_train_head_result r;
    CHECK(sd_train_head(&p, &r, g_err, sizeof g_err) == 0, "a q5_0 run: %s", g_err);
    sd_head *h5 = load_head(p.out_path, m);
    CHECK(h5, "the q5_0 head loads: %s", g_err);
    sd_gguf *g = NULL;
    int n_q5 = 0, n_other = 0;
    if (sd_gguf_open(&g, p.out_path, g_err, sizeof g_err) == 0) {
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const sd_tensor *t = &g->tensors[i];
            if (t->n_dims == 2) t->type == SD_TYPE_Q5_0 ? n_q5++ : n_other++;
            else if (t->type != SD_TYPE_F32 && !sd_str_eq(t->name, "d2t")) n_other++;   // d2t: integers
        }
        sd_gguf_close(g);
    }
    CHECK(n_q5 > 0 && n_other == 0, "matrices in Q5_0: %d, other types: %d", n_q5, n_other);
    // The same head written from floats: the f32 copy of h5 is what Q5_0 keeps, so
    // writing it as Q5_0 again and loading it gives the same weights (rounding is
    // idempotent), and as Q8_0 a larger file.
    char p5[512], p8[512];
    tf_path(p5, sizeof p5, "q5_0-again.gguf");
    tf_path(p8, sizeof p8, "q5_0-as-q8.gguf");
    struct stat s5, s8;
    int ok = h5 && sd_head_save_for(h5, m, p5, SD_TYPE_Q5_0, g_err, sizeof g_err) == 0 &&
             sd_head_save_for(h5, m, p8, SD_TYPE_Q8_0, g_err, sizeof g_err) == 0;
    CHECK(ok, "saving: %s", g_err);
    sd_head *again = ok ? load_head(p5, m) : NULL;
    CHECK(same_params(h5, again), "Q5_0 written again loads the same weights");
    CHECK(ok && stat(p5, &s5) == 0 && stat(p8, &s8) == 0 && s5.st_size < s8.st_size,
          "the Q5_0 file is smaller: %lld against %lld bytes", (long long)s5.st_size, (long long)s8.st_size);
    // The same run in f32 (training does not depend on the output type): its
    // matrices rounded through Q5_0 are the q5_0 file's, bit for bit, and some
    // weight moved; the one-row tensors (gains) are the same floats.
    sd_head *h32 = NULL;
    p = small_run(m, "q5_0-f32", &w);
    if (sd_train_head(&p, &r, g_err, sizeof g_err) == 0) h32 = load_head(p.out_path, m);
    const sd_type_traits *q5 = sd_type_get(SD_TYPE_Q5_0);
    int same = h32 && h5 && h32->n_t == h5->n_t && h32->n_w == h5->n_w, moved = 0;
    for (int i = 0; same && i < h5->n_t; i++) {
        const sd_head_tensor *t = &h5->t[i];
        const float *a = sd_head_w(h32, i), *b = sd_head_w(h5, i);
        float back[4096];
        uint8_t blk[4096];
        for (int64_t row = 0; same && row < t->ne1; row++) {
            const float *x = a + row * t->ne0, *y = b + row * t->ne0;
            if (t->ne1 > 1 && t->ne0 % 32 == 0 && t->ne0 <= 4096) {
                q5->from_float(x, blk, t->ne0);
                q5->to_float(blk, back, t->ne0);
                x = back;
            }
            same = !memcmp(x, y, (size_t)t->ne0 * sizeof(float));
            moved |= memcmp(a + row * t->ne0, y, (size_t)t->ne0 * sizeof(float)) != 0;
        }
    }
    CHECK(same && moved, "the f32 run's weights rounded through Q5_0 are the file's (same %d, moved %d): %s", same,
          moved, g_err);
    sd_head_free(h32);
    sd_head_free(again);
    sd_head_free(h5);
    sd_model_free(m);
}

// ---------------------------------------------------------------- the command
// SPECDEC_BIN overrides the program under test.
static const char *specdec_bin(void) {
    const char *e = getenv("SPECDEC_BIN");
    return e && *e ? e : "./build/specdec";
}

static char g_out[1 << 16];

// --help documents every option; missing or bad data gets a clear message
// naming the file (and line); a run trains and writes a head that loads.
static void test_cli(void) {
    char why[256], data[512], bad[512], out[512], args[4096];
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) SKIP("%s is missing: build it with make", specdec_bin());
    char gguf[512];
    tf_path(gguf, sizeof gguf, "cli_target.gguf");
    if (tf_synth_gguf(gguf, 64, 4, 1, why, sizeof why) < 0) SKIP("synthetic model: %.200s", why);
    int rc = cli_run(specdec_bin(), "train-head --help", 1, g_out, sizeof g_out);
    CHECK(rc == 0, "--help: exit %d", rc);
    const char *opts[] = {"--model", "--type", "--data", "--out", "--out-type", "--threads", "--seed", "--draft-vocab",
                          "--ttt", "--medusa-heads", "--init", "--tokens", "--epochs", "--seq-len", "--batch", "--lr",
                          "--warmup", "--weight-decay", "--clip", "--heldout", "--eval-every", "--eval-tokens",
                          "--ckpt", "--ckpt-minutes", "--ckpt-every", "--resume", "--cache", "--cache-only", "--topk",
                          "--ctx", "--cache-batch", "(default 8192;", "(default 3)", "(default 0.0003)"};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        CHECK(strstr(g_out, opts[i]), "--help mentions %s", opts[i]);
    tf_path(data, sizeof data, "cli.jsonl");
    tf_path(bad, sizeof bad, "cli_bad.jsonl");
    tf_path(out, sizeof out, "cli_head.gguf");
    snprintf(args, sizeof args, "train-head -m %s --data %s/absent.jsonl --out %s", gguf, tf_dir(), out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "data file") && strstr(g_out, "absent.jsonl' not found"), "missing data: %d %s", rc,
          g_out);
    tf_write_file(bad, "{\"text\": \"Once upon a time\"}\n{\"text\": \"Lily\" \"x\"}\n");
    snprintf(args, sizeof args, "train-head -m %s --data %s --out %s", gguf, bad, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "cli_bad.jsonl:2: expected ',' or '}' at column 17"), "bad line: %d %s", rc, g_out);
    snprintf(args, sizeof args, "train-head -m %s --out %s", gguf, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "--data"), "no data: %d %s", rc, g_out);
    tf_stories_corpus(data, 8);
    snprintf(args, sizeof args,
             "train-head -m %s --data %s --out %s --seq-len 16 --batch 2 --tokens 640 --draft-vocab 128 -t 2 "
             "--eval-every 5 --heldout 0.1",
             gguf, data, out);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    const char *last = NULL;
    for (const char *q = strstr(g_out, "\nstep "); q; q = strstr(q + 1, "\nstep ")) last = q;
    long a = -1, b = -2;
    if (last) sscanf(last, "\nstep %ld/%ld", &a, &b);
    CHECK(rc == 0 && a == b && a >= 20 && strstr(g_out, "tok/s") && strstr(g_out, "agree") && strstr(g_out, "ETA") &&
              strstr(g_out, "wrote"),
          "a run to its last step: %d %s", rc, g_out);
    sd_model *m = NULL;
    sd_model_load(&m, gguf, g_err, sizeof g_err);
    sd_head *h = m ? load_head(out, m) : NULL;
    CHECK(h && h->hp.n_draft_vocab == 128 && strstr(h->note, "command=specdec train-head"), "the head: %s", g_err);
    sd_head_free(h);
    sd_model_free(m);
    rc = cli_run(specdec_bin(), args, 1, g_out, sizeof g_out);
    CHECK(rc == 1 && strstr(g_out, "exists") && strstr(g_out, "--resume"), "a second run: %d %s", rc, g_out);
}

// Ctrl-C while training: a checkpoint is written, the exit status is 130.
static void test_cli_sigint(void) {
    char why[256], data[512], out[512], log[512], ckpt[600];
    struct stat st;
    if (stat(specdec_bin(), &st) != 0) SKIP("%s is missing: build it with make", specdec_bin());
    char gguf[512];
    tf_path(gguf, sizeof gguf, "cli_target.gguf");
    if (tf_synth_gguf(gguf, 64, 4, 1, why, sizeof why) < 0) SKIP("synthetic model: %.200s", why);
    tf_path(data, sizeof data, "sigint.jsonl");
    tf_path(out, sizeof out, "sigint.gguf");
    tf_path(log, sizeof log, "sigint.log");
    snprintf(ckpt, sizeof ckpt, "%s.ckpt", out);
    tf_stories_corpus(data, 4);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(specdec_bin(), specdec_bin(), "train-head", "-m", gguf, "--data", data, "--out", out, "--seq-len", "16",
              "--batch", "2", "--tokens", "1000000000", "-t", "1", (char *)NULL);
        _exit(127);
    }
    // wait for the first step, then interrupt
    int started = 0;
    for (int i = 0; i < 1500 && !started; i++) {
        usleep(20000);
        FILE *f = fopen(log, "rb");
        if (!f) continue;
        size_t n = fread(g_out, 1, sizeof g_out - 1, f);
        g_out[n] = 0;
        fclose(f);
        started = strstr(g_out, "step 1/") != NULL;
    }
    CHECK(started, "training started: %s", g_out);
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    FILE *f = fopen(log, "rb");
    size_t n = f ? fread(g_out, 1, sizeof g_out - 1, f) : 0;
    g_out[n] = 0;
    if (f) fclose(f);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 130, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(strstr(g_out, "stopped at step") && strstr(g_out, "--resume"), "the stop is reported: %s", g_out);
    CHECK(tf_file_len(ckpt) > 0 && tf_file_len(out) < 0, "a checkpoint and no head");
}

int main(void) {
    tf_init("test_train_loop");
    static char data[512];
    tf_path(data, sizeof data, "loop.jsonl");
    tf_write_corpus(data, 24, 30, 5, 0);
    g_data[0] = data;
    T_RUN(test_resume_bit_identical);
    T_RUN(test_full_disk_keeps_checkpoint);
    T_RUN(test_refusals);
    T_RUN(test_learns_stories);
    T_RUN(test_medusa_run);
    T_RUN(test_head_ff);
    T_RUN(test_grow_vocab);
    T_RUN(test_out_q5_0);
    T_RUN(test_cli);
    T_RUN(test_cli_sigint);
    tf_done();
    T_EXIT();
}

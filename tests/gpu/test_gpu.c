// test_gpu.c - the CUDA path on a device: every kernel against host code
// (sd_cu_selftest), the whole forward's logits against the CPU engine's
// (float activations) on synthetic models of both architectures and three
// weight types, for a prompt chain, a tree and the decoding after a commit,
// and greedy speculative decoding on the GPU (draft model: chain, SpecInfer
// widths, EAGLE-2 dynamic tree) equal to plain decoding on the GPU token for
// token, and several sessions in one batched pass bit for bit as each alone.
// Without a CUDA build or a device every case says so and skips.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "draft/draft_model.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "model/model.h"
#include "runtime/gpu.h"
#include "specdec.h"
#include "specdec_spec.h"
#include "t.h"

static char g_err[512];
static char g_why[256];
static int g_have;

static sd_session *session(const sd_model *m, int gpu) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 512;
    sp.n_batch = 64;
    sp.n_threads = 2;
    sp.gpu = gpu;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    return s;
}

// Largest |gpu - cpu| over a row, in units of the CPU row's standard deviation;
// *same_top: whether both argmaxes agree.
static double row_err(const float *a, const float *b, int n, int *same_top) {
    double mean = 0, var = 0, mx = 0;
    int ta = 0, tb = 0;
    for (int i = 0; i < n; i++) mean += a[i];
    mean /= n;
    for (int i = 0; i < n; i++) {
        var += (a[i] - mean) * (a[i] - mean);
        mx = fmax(mx, fabs(a[i] - b[i]));
        if (a[i] > a[ta]) ta = i;
        if (b[i] > b[tb]) tb = i;
    }
    *same_top = ta == tb;
    return mx / sqrt(var / n + 1e-30);
}

// Tolerance of the logits: the weights are rounded to bf16 (2^-9 relative) on
// the device, and the activations the GEMMs read too.
#define LOGIT_TOL 0.08

static void compare_pass(sd_session *c, sd_session *g, const sd_batch *b, const char *what, double *worst, int *agree,
                         int *rows) {
    sd_batch bc = *b;
    bc.precise = 1;
    int rc1 = sd_session_forward(c, &bc, g_err, sizeof g_err);
    CHECK(rc1 == 0, "%s: cpu forward: %s", what, g_err);
    int rc2 = sd_session_forward(g, b, g_err, sizeof g_err);
    CHECK(rc2 == 0, "%s: gpu forward: %s", what, g_err);
    if (rc1 || rc2) return;
    const int V = sd_session_model(c)->hp.n_vocab;
    for (int i = 0; i < b->n; i++) {
        const float *lc = sd_session_logits(c, i), *lg = sd_session_logits(g, i);
        if (!lc || !lg) continue;
        int same;
        *worst = fmax(*worst, row_err(lc, lg, V, &same));
        *agree += same;
        (*rows)++;
    }
}

static void forward_matches_cpu(void) {
    if (!g_have) SKIP("%s", g_why);
    struct { const char *arch; int wtype, embd; } cfg[] = {
        {"llama", 0 /* F32 */, 64}, {"qwen2", 8 /* Q8_0 */, 64}, {"llama", 12 /* Q4_K */, 256}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        synth_params p = synth_default_params();
        p.arch = cfg[k].arch;
        p.wtype = cfg[k].wtype;
        p.n_embd = cfg[k].embd;
        p.n_ff = cfg[k].embd == 256 ? 512 : 128;
        sd_model *m = sc_synth_model(&p, "gpu", cfg[k].arch, g_err, sizeof g_err);
        CHECK(m, "model: %s", g_err);
        if (!m) continue;
        sd_session *c = session(m, -1), *g = session(m, 1);
        CHECK(c && g, "sessions: %s", g_err);
        double worst = 0;
        int agree = 0, rows = 0;
        if (c && g) {
            int32_t tok[40];
            for (int i = 0; i < 40; i++) tok[i] = 3 + (i * 37) % 300;
            sd_batch b = {0};
            b.n = 40;
            b.tokens = tok;
            compare_pass(c, g, &b, "prompt", &worst, &agree, &rows);
            sd_session_commit(c, NULL, 0, g_err, sizeof g_err);
            CHECK(sd_session_commit(g, NULL, 0, g_err, sizeof g_err) == 0, "commit: %s", g_err);
            // a tree of 16 nodes, then the path 0 -> 2 -> 5 committed
            int32_t tt[16], par[16];
            for (int i = 0; i < 16; i++) {
                tt[i] = 3 + (i * 53) % 300;
                par[i] = i == 0 ? -1 : (i - 1) / 2;
            }
            sd_batch t = {0};
            t.n = 16;
            t.tokens = tt;
            t.parent = par;
            compare_pass(c, g, &t, "tree", &worst, &agree, &rows);
            int32_t path[3] = {0, 2, 6};
            sd_session_commit(c, path, 3, g_err, sizeof g_err);
            CHECK(sd_session_commit(g, path, 3, g_err, sizeof g_err) == 0, "commit path: %s", g_err);
            int32_t one = 42;
            sd_batch d = {0};
            d.n = 1;
            d.tokens = &one;
            compare_pass(c, g, &d, "decode", &worst, &agree, &rows);
        }
        printf("  %s %s: %d rows, worst |gpu - cpu| %.4f std, argmax agrees on %d\n", cfg[k].arch,
               k == 0 ? "F32" : k == 1 ? "Q8_0" : "Q4_K", rows, worst, agree);
        CHECK(rows == 57 && worst < LOGIT_TOL && agree >= rows - 2, "%s: %d rows, error %.4f, agree %d", cfg[k].arch, rows,
              worst, agree);
        sd_session_free(c);
        sd_session_free(g);
        sd_model_free(m);
    }
}

// The synthetic qwen2 model with Q8_0 weights the last two cases share.
static sd_model *qwen_q8(const char *name) {
    synth_params p = synth_default_params();
    p.arch = "qwen2";
    p.wtype = 8; // Q8_0
    return sc_synth_model(&p, "gpu", name, g_err, sizeof g_err);
}

// A pass with more logit rows than a session pins (SD_GPU_PIN_ROWS, 64):
// the rows beyond come through pageable memory, in a copy of their own, and
// must match the CPU engine's as the pinned ones do.
static void logits_beyond_pinned_rows(void) {
    if (!g_have) SKIP("%s", g_why);
    sd_model *m = qwen_q8("long");
    CHECK(m, "model: %s", g_err);
    if (!m) return;
    sd_session *ss[2] = {0};
    for (int k = 0; k < 2; k++) {
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = 256;
        sp.n_batch = 128;
        sp.n_threads = 2;
        sp.gpu = k ? 1 : -1;
        CHECK(sd_session_new(&ss[k], m, &sp, g_err, sizeof g_err) == 0, "session: %s", g_err);
    }
    double worst = 0;
    int agree = 0, rows = 0;
    if (ss[0] && ss[1]) {
        int32_t tok[100];
        for (int i = 0; i < 100; i++) tok[i] = 3 + (i * 43) % 300;
        sd_batch b = {0};
        b.n = 100;
        b.tokens = tok;
        compare_pass(ss[0], ss[1], &b, "100-row prompt", &worst, &agree, &rows);
    }
    printf("  100 logit rows (64 pinned): worst |gpu - cpu| %.4f std, argmax agrees on %d of %d\n", worst, agree, rows);
    CHECK(rows == 100 && worst < LOGIT_TOL && agree >= rows * 9 / 10, "%d rows, error %.4f, agree %d", rows, worst, agree);
    sd_session_free(ss[0]);
    sd_session_free(ss[1]);
    sd_model_free(m);
}

static void greedy_spec_equals_plain(void) {
    if (!g_have) SKIP("%s", g_why);
    CHECK(sd_gpu_enable(1, g_err, sizeof g_err) == 0, "%s", g_err);
    synth_params p = synth_default_params();
    sd_model *tgt = sc_synth_model(&p, "gpu", "tgt", g_err, sizeof g_err);
    p.seed = 99;
    p.n_layer = 1;
    sd_model *dft = sc_synth_model(&p, "gpu", "dft", g_err, sizeof g_err);
    CHECK(tgt && dft, "models: %s", g_err);
    const int shapes[3] = {SD_DRAFT_CHAIN, SD_DRAFT_WIDTHS, SD_DRAFT_DYNAMIC};
    for (int k = 0; tgt && dft && k < 3; k++) {
        sd_draft_model_params dp = sd_draft_model_default_params();
        dp.shape = shapes[k];
        dp.k = 4;
        dp.n_ctx = 512;
        dp.n_threads = 1;
        dp.n_widths = 3;
        dp.widths[0] = 3, dp.widths[1] = 2, dp.widths[2] = 1;
        dp.dyn_b = 3, dp.dyn_d = 4, dp.dyn_m = 12;
        sd_drafter *d = NULL;
        sd_session *s = sc_new_session(tgt, 512, 1, g_err, sizeof g_err);
        sd_sampler *smp = sc_new_sampler(320, 0.0f, 1.0f, g_err, sizeof g_err);
        CHECK(s && smp && sd_draft_model_new(&d, dft, tgt, &dp, g_err, sizeof g_err) == 0, "setup: %s", g_err);
        for (int pr = 0; d && pr < 3; pr++) {
            int32_t prompt[30];
            for (int i = 0; i < 30; i++) prompt[i] = 3 + (i * 31 + pr * 7) % 300;
            static sc_tokens a, b;
            sd_gen_stats st1, st2;
            int r1 = sc_run_plain(s, smp, prompt, 10 + pr * 10, 64, &a, &st1, g_err, sizeof g_err);
            int r2 = sc_run_spec(s, smp, d, prompt, 10 + pr * 10, 64, 16, &b, &st2, g_err, sizeof g_err);
            CHECK(r1 >= 0 && r2 >= 0, "runs: %s", g_err);
            CHECK(sc_same_tokens(&a, &b), "shape %d prompt %d: speculative output differs from plain on the GPU", k, pr);
        }
        sd_drafter_free(d);
        sd_sampler_free(smp);
        sd_session_free(s);
    }
    sd_gpu_enable(0, g_err, sizeof g_err);
    sd_model_free(tgt);
    sd_model_free(dft);
}

// Several GPU sessions in one sd_batcher_forward (a server's users): every
// logit row has the same bits as each session's own forward of the same batch
// (house rule 18; passes of up to 64 rows share one GEMM shape). Three
// sessions with different committed prompts: a chain of 5, a tree of 8, one token.
static void batched_equals_single(void) {
    if (!g_have) SKIP("%s", g_why);
    sd_model *m = qwen_q8("batch");
    sd_threadpool *pool = NULL;
    CHECK(m && sd_threadpool_new(&pool, 2, g_err, sizeof g_err) == 0, "setup: %s", g_err);
    sd_session *ss[3] = {0};
    sd_batcher *bat = NULL;
    for (int k = 0; m && pool && k < 3; k++) {
        sd_session_params sp = sd_session_default_params();
        sp.n_ctx = 256;
        sp.n_batch = 64;
        sp.pool = pool;
        sp.gpu = 1;
        CHECK(sd_session_new(&ss[k], m, &sp, g_err, sizeof g_err) == 0, "session %d: %s", k, g_err);
    }
    if (ss[0] && ss[1] && ss[2])
        CHECK(sd_batcher_new(&bat, m, pool, 64, g_err, sizeof g_err) == 0, "batcher: %s", g_err);
    if (!bat) goto out;
    const int V = m->hp.n_vocab, nb[3] = {5, 8, 1};
    int32_t tok[3][8], par[3][8];
    sd_batch bs[3];
    for (int k = 0; k < 3; k++) {
        int32_t prompt[24];
        const int np = 8 + 6 * k;
        for (int i = 0; i < np; i++) prompt[i] = 3 + (i * 29 + k * 11) % 300;
        sd_batch b = {0};
        b.n = np;
        b.tokens = prompt;
        CHECK(sd_session_forward(ss[k], &b, g_err, sizeof g_err) == 0 &&
                  sd_session_commit(ss[k], NULL, 0, g_err, sizeof g_err) == 0,
              "prompt %d: %s", k, g_err);
        for (int i = 0; i < nb[k]; i++) {
            tok[k][i] = 3 + (i * 41 + k * 17) % 300;
            par[k][i] = k == 1 ? (i == 0 ? -1 : (i - 1) / 2) : i - 1;
        }
        bs[k] = (sd_batch){0};
        bs[k].n = nb[k];
        bs[k].tokens = tok[k];
        bs[k].parent = k == 1 ? par[k] : NULL;
    }
    static float batched[14][4096];
    CHECK(V <= 4096, "vocabulary %d over the test's buffer", V);
    int rc = sd_batcher_forward(bat, ss, bs, 3, g_err, sizeof g_err);
    CHECK(rc == 0, "batched forward: %s", g_err);
    int r = 0, differ = 0, rows = 0;
    for (int k = 0; rc == 0 && k < 3; k++)
        for (int i = 0; i < nb[k]; i++) memcpy(batched[r++], sd_session_logits(ss[k], i), sizeof(float) * V);
    r = 0;
    for (int k = 0; rc == 0 && k < 3; k++) {
        CHECK(sd_session_forward(ss[k], &bs[k], g_err, sizeof g_err) == 0, "single forward %d: %s", k, g_err);
        for (int i = 0; i < nb[k]; i++, r++, rows++)
            differ += memcmp(batched[r], sd_session_logits(ss[k], i), sizeof(float) * V) != 0;
    }
    printf("  3 sessions, %d rows in one pass: %d rows differ from the sessions' own passes\n", rows, differ);
    CHECK(rows == 14 && differ == 0, "%d of %d rows differ", differ, rows);
out:
    sd_batcher_free(bat);
    for (int k = 0; k < 3; k++) sd_session_free(ss[k]);
    sd_threadpool_free(pool);
    sd_model_free(m);
}

static void gpu_absent_is_clear(void) {
    if (g_have) SKIP("a device is present");
    sd_model *m = NULL;
    synth_params p = synth_default_params();
    m = sc_synth_model(&p, "gpu", "absent", g_err, sizeof g_err);
    CHECK(m, "%s", g_err);
    if (!m) return;
    CHECK(sd_gpu_enable(1, g_err, sizeof g_err) < 0 && strstr(g_err, "--gpu"), "sd_gpu_enable: '%s'", g_err);
    sd_session *s = session(m, 1);
    CHECK(!s && (strstr(g_err, "CUDA") || strstr(g_err, "device")), "a GPU session without a device: '%s'", g_err);
    sd_session_free(s);
    sd_model_free(m);
}

int main(void) {
    g_have = sd_gpu_available(g_why, sizeof g_why) == 0;
    if (g_have) printf("  device: %s\n", g_why);
    const int f = sd_cu_selftest(0);
    T_RUN(gpu_absent_is_clear);
    T_RUN(forward_matches_cpu);
    T_RUN(logits_beyond_pinned_rows);
    T_RUN(greedy_spec_equals_plain);
    T_RUN(batched_equals_single);
    return f ? 1 : t_n_fail ? 1 : 0;
}

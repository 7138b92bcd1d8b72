// test_batcher.c - several sessions in one forward (sd_batcher): every logit
// row and every hidden row of a multi-session pass has the same bits as the
// session's own sd_session_forward (house rule 18), for 1..4 sessions with
// different contexts (0, some, many committed tokens), chains and trees of
// 1..16 nodes, logits for some or all nodes, hidden rows on some sessions,
// token and embedding-row inputs, precise and normal passes; the pending rows
// are the session's own (commits of different paths, truncations, and later
// passes agree with twin sessions); a greedy generation of 3 sessions
// stepped together through the step API emits the same tokens as each
// alone; bad calls fail with a message before anything is written.
// Synthetic models always (tests/lib/synth.h), the default model when present.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "specdec_spec.h"
#include "kernels/threadpool.h"
#include "lib/synth.h"
#include "model/model.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define MAXS 4   // sessions per pass in these tests
#define MAXN 16  // nodes per session's batch
#define NHID 3   // hidden layers asked

static char g_err[512];
static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;

static uint32_t rnd(uint32_t n) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(g_rng >> 33) % n;
}

static sd_model *load_synth(const synth_params *p, const char *tag) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_batcher_%d_%s.gguf", (int)getpid(), tag);
    sd_model *m = NULL;
    if (synth_write(path, p, g_err, sizeof g_err) == 0) sd_model_load(&m, path, g_err, sizeof g_err);
    remove(path);
    return m;
}

static sd_session *new_session(const sd_model *m, sd_threadpool *pool, int n_ctx, int n_batch) {
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.pool = pool;
    sd_session *s = NULL;
    if (sd_session_new(&s, m, &sp, g_err, sizeof g_err) < 0) return NULL;
    return s;
}

// ---------------------------------------------------------------- a batch and its twin

// One session's batch of a round, built twice over the same arrays except
// the hidden rows' buffers (one for the batcher's session, one for its twin).
typedef struct {
    int n;
    int32_t tok[MAXN], par[MAXN];
    uint8_t want[MAXN], hid_want[MAXN];
    int chain, all_logits, all_hid, n_hid, use_embd, precise;
    int32_t hid_layers[NHID];
    float *embd;          // (n, n_embd) when use_embd
    float *hid_a, *hid_b; // (n, NHID, n_embd)
    int n_hid_rows;       // nodes whose hidden rows are wanted
} tbatch;

static void tbatch_free(tbatch *t) {
    free(t->embd);
    free(t->hid_a);
    free(t->hid_b);
    memset(t, 0, sizeof *t);
}

// A random batch of n nodes: a chain or a tree (parents anywhere before,
// several roots possible), logits for all nodes or a random subset, hidden
// rows (with_hid) of three layers for all or some nodes, token or
// embedding-row input.
static int tbatch_make(tbatch *t, const sd_model *m, int n, int precise, int with_hid, int use_embd) {
    const int V = m->hp.n_vocab, E = m->hp.n_embd, L = m->hp.n_layer;
    memset(t, 0, sizeof *t);
    t->n = n;
    t->precise = precise;
    t->chain = rnd(3) == 0;
    t->all_logits = rnd(2) == 0;
    for (int i = 0; i < n; i++) {
        t->tok[i] = (int32_t)rnd((uint32_t)V);
        t->par[i] = t->chain ? i - 1 : (int32_t)rnd((uint32_t)i + 1) - 1 + (i > 0 && rnd(4) != 0);
        if (t->par[i] >= i) t->par[i] = i - 1;
        t->want[i] = rnd(2);
    }
    if (!t->all_logits) t->want[n - 1] = 1;
    if (with_hid) {
        t->n_hid = NHID;
        t->hid_layers[0] = 0;
        t->hid_layers[1] = L - 1;
        t->hid_layers[2] = SD_HIDDEN_NORM;
        t->all_hid = rnd(2) == 0;
        for (int i = 0; i < n; i++) {
            t->hid_want[i] = t->all_hid || rnd(2);
            t->n_hid_rows += t->hid_want[i] != 0;
        }
        const size_t sz = (size_t)n * NHID * E * sizeof(float);
        t->hid_a = malloc(sz);
        t->hid_b = malloc(sz);
        if (!t->hid_a || !t->hid_b) return -1;
        memset(t->hid_a, 0xA5, sz); // different garbage: rows left unwritten would differ
        memset(t->hid_b, 0x5A, sz);
    }
    t->use_embd = use_embd;
    if (use_embd) {
        t->embd = malloc((size_t)n * E * sizeof(float));
        if (!t->embd) return -1;
        for (int i = 0; i < n; i++)
            if (sd_model_token_embd(m, t->tok[i], t->embd + (size_t)i * E, g_err, sizeof g_err) < 0) return -1;
    }
    return 0;
}

// The sd_batch of t; twin: the one whose hidden rows go to hid_b.
static sd_batch tbatch_view(const tbatch *t, int twin) {
    sd_batch b = {.n = t->n, .tokens = t->use_embd ? NULL : t->tok, .embd = t->use_embd ? t->embd : NULL,
                  .parent = t->chain ? NULL : t->par, .logits = t->all_logits ? NULL : t->want,
                  .precise = t->precise};
    if (t->n_hid) {
        b.n_hidden_layers = t->n_hid;
        b.hidden_layers = t->hid_layers;
        b.hidden = t->all_hid ? NULL : t->hid_want;
        b.hidden_out = twin ? t->hid_b : t->hid_a;
    }
    return b;
}

// Compares every logit row of the last forward of a and b (the same batch t)
// bitwise, and the hidden rows. Returns the number of rows that differ.
static int compare(const sd_session *a, const sd_session *b, const tbatch *t, const sd_model *m, const char *what) {
    const int V = m->hp.n_vocab, E = m->hp.n_embd;
    int bad = 0;
    for (int i = 0; i < t->n; i++) {
        const float *la = sd_session_logits(a, i), *lb = sd_session_logits(b, i);
        const int wanted = t->all_logits || t->want[i];
        if (!la != !lb || !la != !wanted) {
            CHECK(0, "%s: node %d: logits %s in the pass, %s alone (wanted %d)", what, i, la ? "present" : "absent",
                  lb ? "present" : "absent", wanted);
            bad++;
        } else if (la && memcmp(la, lb, (size_t)V * sizeof(float)) != 0) {
            CHECK(0, "%s: node %d: logits differ from the session's own forward", what, i);
            bad++;
        }
    }
    for (int r = 0; r < t->n_hid_rows; r++)
        if (memcmp(t->hid_a + (size_t)r * NHID * E, t->hid_b + (size_t)r * NHID * E, (size_t)NHID * E * sizeof(float))) {
            CHECK(0, "%s: hidden rows of wanted node %d differ", what, r);
            bad++;
        }
    return bad;
}

// Feeds n committed tokens to s in chunks of its n_batch.
static int feed(sd_session *s, const int32_t *toks, int n, int n_batch) {
    for (int d = 0; d < n; d += n_batch) {
        sd_batch b = {.n = n - d < n_batch ? n - d : n_batch, .tokens = toks + d};
        if (sd_session_forward(s, &b, g_err, sizeof g_err) < 0) return -1;
        if (sd_session_commit(s, NULL, 0, g_err, sizeof g_err) < 0) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- rounds against twins

typedef struct {
    const sd_model *m;
    sd_threadpool *pool;
    sd_batcher *bat;
    int k;                    // sessions
    sd_session *a[MAXS];      // evaluated together by the batcher
    sd_session *b[MAXS];      // their twins, evaluated one by one
    const char *what;
} twins;

// One round: a random batch per session (n_max nodes at most), one batcher
// pass over the a sessions and a forward of each twin, every row compared;
// then each pair commits the same random root-to-node path (different in
// every pair), and some pairs truncate. Returns the rows that differed.
static int round_once(twins *tw, int n_max, int precise, int round) {
    tbatch t[MAXS];
    sd_batch ba[MAXS];
    char what[128];
    int bad = 0;
    memset(t, 0, sizeof t);
    for (int i = 0; i < tw->k; i++) {
        const int room = sd_session_n_ctx(tw->a[i]) - sd_session_n_past(tw->a[i]);
        int n = 1 + (int)rnd((uint32_t)n_max);
        if (n > room) n = room;
        if (tbatch_make(&t[i], tw->m, n, precise, (i + round) % 2 == 0, (i + round) % 3 == 2) < 0) {
            CHECK(0, "batch: %s", g_err);
            goto out;
        }
        ba[i] = tbatch_view(&t[i], 0);
    }
    if (sd_batcher_forward(tw->bat, tw->a, ba, tw->k, g_err, sizeof g_err) < 0) {
        CHECK(0, "%s: batcher forward: %s", tw->what, g_err);
        bad++;
        goto out;
    }
    for (int i = 0; i < tw->k; i++) {
        sd_batch bb = tbatch_view(&t[i], 1);
        if (sd_session_forward(tw->b[i], &bb, g_err, sizeof g_err) < 0) {
            CHECK(0, "twin forward: %s", g_err);
            bad++;
            continue;
        }
        snprintf(what, sizeof what, "%s: round %d, session %d of %d (n_past %d, %d nodes, %s%s%s%s)", tw->what,
                 round, i, tw->k, sd_session_n_past(tw->a[i]), t[i].n, t[i].chain ? "chain" : "tree",
                 t[i].precise ? ", precise" : "", t[i].n_hid ? ", hidden rows" : "", t[i].use_embd ? ", embd" : "");
        bad += compare(tw->a[i], tw->b[i], &t[i], tw->m, what);
        // the same random path in both: a node and its ancestors
        int32_t path[MAXN], tmp[MAXN], np = 0;
        for (int v = (int)rnd((uint32_t)t[i].n); v >= 0; v = t[i].chain ? v - 1 : t[i].par[v]) tmp[np++] = v;
        for (int k = 0; k < np; k++) path[k] = tmp[np - 1 - k];
        CHECK(sd_session_commit(tw->a[i], path, np, g_err, sizeof g_err) == 0, "commit: %s", g_err);
        CHECK(sd_session_commit(tw->b[i], path, np, g_err, sizeof g_err) == 0, "commit twin: %s", g_err);
        if (rnd(4) == 0 && sd_session_n_past(tw->a[i]) > 2) {
            const int to = sd_session_n_past(tw->a[i]) - 1 - (int)rnd(3);
            CHECK(sd_session_truncate(tw->a[i], to, g_err, sizeof g_err) == 0, "%s", g_err);
            CHECK(sd_session_truncate(tw->b[i], to, g_err, sizeof g_err) == 0, "%s", g_err);
        }
        CHECK(sd_session_n_past(tw->a[i]) == sd_session_n_past(tw->b[i]), "n_past %d vs twin %d",
              sd_session_n_past(tw->a[i]), sd_session_n_past(tw->b[i]));
    }
out:
    for (int i = 0; i < tw->k; i++) tbatch_free(&t[i]);
    return bad;
}

// k pairs of sessions whose contexts are n_past[i] random tokens, then
// `rounds` rounds (the last one precise when precise_last).
static int run_twins(const sd_model *m, sd_threadpool *pool, sd_batcher *bat, int k, const int *n_past, int n_ctx,
                     int rounds, int precise_last, const uint8_t *skip, const char *what) {
    twins tw = {.m = m, .pool = pool, .bat = bat, .k = k, .what = what};
    int bad = 0, ok = 1;
    int32_t *toks = malloc((size_t)n_ctx * sizeof(int32_t));
    ok = toks != NULL;
    for (int i = 0; i < k && ok; i++) {
        tw.a[i] = new_session(m, pool, n_ctx, MAXN);
        tw.b[i] = new_session(m, pool, n_ctx, MAXN);
        ok = tw.a[i] && tw.b[i];
        if (ok && skip) {
            ok = sd_session_set_layer_skip(tw.a[i], skip, g_err, sizeof g_err) >= 0 &&
                 sd_session_set_layer_skip(tw.b[i], skip, g_err, sizeof g_err) >= 0;
        }
        for (int j = 0; ok && j < n_past[i]; j++) toks[j] = (int32_t)rnd((uint32_t)m->hp.n_vocab);
        ok = ok && feed(tw.a[i], toks, n_past[i], MAXN) == 0 && feed(tw.b[i], toks, n_past[i], MAXN) == 0;
    }
    CHECK(ok, "%s: setup: %s", what, g_err);
    for (int r = 0; ok && r < rounds; r++) bad += round_once(&tw, MAXN, precise_last && r == rounds - 1, r);
    for (int i = 0; i < k; i++) {
        sd_session_free(tw.a[i]);
        sd_session_free(tw.b[i]);
    }
    free(toks);
    return bad;
}

// 1..4 sessions with contexts of 0, some and many tokens, several rounds.
static void twins_model(const sd_model *m, const char *what, int rounds, const uint8_t *skip) {
    sd_threadpool *pool = NULL;
    sd_batcher *bat = NULL;
    CHECK(sd_threadpool_new(&pool, 2, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(pool && sd_batcher_new(&bat, m, pool, MAXS * MAXN, g_err, sizeof g_err) == 0, "%s", g_err);
    if (!bat) goto out;
    static const int n_past[4][MAXS] = {{0}, {0, 130}, {5, 300, 0}, {17, 0, 260, 41}};
    int bad = 0, passes = 0;
    for (int k = 1; k <= MAXS; k++) {
        bad += run_twins(m, pool, bat, k, n_past[k - 1], 400, rounds, 1, skip, what);
        passes += rounds;
    }
    printf("  info: %s: %d passes of 1..4 sessions, every logit and hidden row bit-identical to separate "
           "forwards: %s\n",
           what, passes, bad ? "NO" : "yes");
out:
    sd_batcher_free(bat);
    sd_threadpool_free(pool);
}

static void test_batcher_bits_synth(void) {
    struct {
        const char *arch;
        int wtype, mix, n_embd, n_ff, n_head_kv, tied;
        const char *what;
    } cases[] = {
        {"llama", SD_TYPE_Q4_1, -1, 64, 128, 2, 1, "llama/Q4_1"},
        {"qwen2", SD_TYPE_F16, -1, 64, 128, 2, 0, "qwen2/F16 (NEOX RoPE, biases)"},
        {"llama", SD_TYPE_Q4_K, SD_TYPE_Q6_K, 256, 512, 1, 0, "llama/Q4_K+Q6_K (mixed types, GQA 4:1)"},
        {"llama", SD_TYPE_Q8_0, -1, 64, 128, 4, 1, "llama/Q8_0 (no GQA)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        synth_params p = synth_default_params();
        p.arch = cases[c].arch;
        p.wtype = cases[c].wtype;
        p.mix_type = cases[c].mix;
        p.n_embd = cases[c].n_embd;
        p.n_ff = cases[c].n_ff;
        p.n_head_kv = cases[c].n_head_kv;
        p.tied = cases[c].tied;
        p.n_layer = 3;
        p.seed = 77 + c;
        sd_model *m = load_synth(&p, "bits");
        CHECK(m != NULL, "%s: %s", cases[c].what, g_err);
        if (!m) continue;
        twins_model(m, cases[c].what, 3, NULL);
        if (c == 0) { // a layer-skip mask common to all sessions
            const uint8_t skip[3] = {0, 1, 0};
            twins_model(m, "llama/Q4_1 with layer 1 skipped", 2, skip);
        }
        sd_model_free(m);
    }
}

static void test_batcher_bits_default(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s absent (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    sd_threadpool *pool = NULL;
    sd_batcher *bat = NULL;
    CHECK(sd_threadpool_new(&pool, 2, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(pool && sd_batcher_new(&bat, m, pool, MAXS * MAXN, g_err, sizeof g_err) == 0, "%s", g_err);
    if (bat) {
        const int n_past[3] = {0, 20, 200};
        const int bad = run_twins(m, pool, bat, 3, n_past, 320, 2, 1, NULL, "SmolLM2");
        const int n_past4[4] = {40, 0, 9, 100};
        const int bad4 = run_twins(m, pool, bat, 4, n_past4, 160, 1, 0, NULL, "SmolLM2, 4 sessions");
        printf("  info: SmolLM2: 3 sessions x 2 passes (the second precise), 4 sessions x 1 pass: every row "
               "bit-identical: %s\n",
               bad + bad4 ? "NO" : "yes");
    }
    sd_batcher_free(bat);
    sd_threadpool_free(pool);
    sd_model_free(m);
}

// ---------------------------------------------------------------- generation

// Greedy generation of n_gen prompts: each alone (sd_generate on its own
// session), then all together, stepped by hand (sd_gen_step_begin on each,
// one sd_batcher_forward, sd_gen_step_end on each); the texts must match.
static void gen_together(const sd_model *m, const int32_t *const *prompts, const int *n_prompt, int n_gen,
                         const char *method, int n_predict, const char *what) {
    enum { G = 3 };
    sd_threadpool *pool = NULL;
    sd_batcher *bat = NULL;
    sd_session *s[G] = {0};
    sd_sampler *smp[G] = {0};
    sd_drafter *d[G] = {0};
    sd_gen *g[G] = {0};
    int32_t *alone[G] = {0};
    int n_alone[G] = {0}, steps = 0, passes = 0;
    if (n_gen > G) n_gen = G;
    sd_sampler_params sprm = sd_sampler_default_params();
    sprm.temp = 0;
    sd_gen_params gp = sd_gen_default_params();
    gp.n_predict = n_predict;
    sd_method meth;
    sd_method_env env = sd_method_env_default(m);
    int ok = sd_threadpool_new(&pool, 2, g_err, sizeof g_err) == 0 &&
             sd_batcher_new(&bat, m, pool, G * 16, g_err, sizeof g_err) == 0 &&
             (!method || sd_method_parse(method, &meth, g_err, sizeof g_err) == 0);
    // Each alone.
    for (int i = 0; ok && i < n_gen; i++) {
        sd_session *s1 = new_session(m, pool, 256, 64);
        sd_sampler *sm1 = NULL;
        sd_drafter *d1 = NULL;
        sd_gen *g1 = NULL;
        ok = s1 && sd_sampler_new(&sm1, &sprm, m->hp.n_vocab, g_err, sizeof g_err) == 0 &&
             (!method || sd_method_make(&meth, &env, &d1, g_err, sizeof g_err) == 0) &&
             sd_gen_new(&g1, s1, sm1, d1, &gp, g_err, sizeof g_err) == 0 &&
             sd_gen_prefill(g1, prompts[i], n_prompt[i], g_err, sizeof g_err) == 0;
        sd_step st;
        do ok = ok && sd_gen_step(g1, &st, g_err, sizeof g_err) == 0;
        while (ok && st.finish == SD_FINISH_NONE);
        const int32_t *tk = ok ? sd_gen_tokens(g1, &n_alone[i]) : NULL;
        if (tk && (alone[i] = malloc((size_t)n_alone[i] * sizeof(int32_t)))) memcpy(alone[i], tk, (size_t)n_alone[i] * 4);
        sd_gen_free(g1);
        sd_drafter_free(d1);
        sd_sampler_free(sm1);
        sd_session_free(s1);
    }
    // Together.
    for (int i = 0; ok && i < n_gen; i++) {
        s[i] = new_session(m, pool, 256, 64);
        ok = s[i] && sd_sampler_new(&smp[i], &sprm, m->hp.n_vocab, g_err, sizeof g_err) == 0 &&
             (!method || sd_method_make(&meth, &env, &d[i], g_err, sizeof g_err) == 0) &&
             sd_gen_new(&g[i], s[i], smp[i], d[i], &gp, g_err, sizeof g_err) == 0 &&
             sd_gen_prefill(g[i], prompts[i], n_prompt[i], g_err, sizeof g_err) == 0;
    }
    int active = n_gen;
    while (ok && active > 0) {
        sd_session *ss[G];
        sd_batch bs[G];
        int k = 0;
        for (int i = 0; ok && i < n_gen; i++) {
            sd_batch b;
            if (sd_gen_finished(g[i]) != SD_FINISH_NONE) continue;
            ok = sd_gen_step_begin(g[i], &b, g_err, sizeof g_err) == 0;
            if (ok && b.n > 0) {
                ss[k] = s[i];
                bs[k++] = b;
            }
        }
        ok = ok && sd_batcher_forward(bat, ss, bs, k, g_err, sizeof g_err) == 0;
        passes += k > 1;
        active = 0;
        for (int i = 0; ok && i < n_gen; i++) {
            if (sd_gen_finished(g[i]) != SD_FINISH_NONE) continue;
            sd_step st;
            ok = sd_gen_step_end(g[i], &st, g_err, sizeof g_err) == 0;
            active += ok && st.finish == SD_FINISH_NONE;
        }
        steps++;
    }
    CHECK(ok, "%s: %s", what, g_err);
    int same = 0;
    for (int i = 0; ok && i < n_gen; i++) {
        int n;
        const int32_t *tk = sd_gen_tokens(g[i], &n);
        const int eq = alone[i] && n == n_alone[i] && memcmp(tk, alone[i], (size_t)n * sizeof(int32_t)) == 0;
        CHECK(eq, "%s: generation %d: %d tokens together, %d alone, texts %s", what, i, n, n_alone[i],
              eq ? "equal" : "differ");
        same += eq;
    }
    printf("  info: %s (%s): %d of %d generations equal to each alone; %d steps, %d of them one pass over "
           "several sessions\n",
           what, method ? method : "plain", same, n_gen, steps, passes);
    for (int i = 0; i < n_gen; i++) {
        sd_gen_free(g[i]);
        sd_drafter_free(d[i]);
        sd_sampler_free(smp[i]);
        sd_session_free(s[i]);
        free(alone[i]);
    }
    sd_batcher_free(bat);
    sd_threadpool_free(pool);
}

static void test_batcher_generation_synth(void) {
    synth_params p = synth_default_params();
    p.wtype = SD_TYPE_Q8_0;
    p.n_layer = 3;
    sd_model *m = load_synth(&p, "gen");
    CHECK(m != NULL, "%s", g_err);
    if (!m) return;
    const int32_t p0[5] = {1, 270, 33, 301, 280}, p1[2] = {1, 260}, p2[9] = {1, 300, 301, 302, 300, 301, 302, 300, 301};
    const int32_t *prompts[3] = {p0, p1, p2};
    const int n_prompt[3] = {5, 2, 9};
    gen_together(m, prompts, n_prompt, 3, NULL, 24, "synthetic llama/Q8_0");
    gen_together(m, prompts, n_prompt, 3, "ngram:2-4", 24, "synthetic llama/Q8_0");
    sd_model_free(m);
}

static void test_batcher_generation_default(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s absent (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    const char *texts[3] = {"The capital of France is", "Once upon a time, in a small village by the sea,",
                            "def fibonacci(n):\n    if n < 2:\n        return n\n    return"};
    int32_t ids[3][64];
    const int32_t *prompts[3];
    int n_prompt[3];
    for (int i = 0; i < 3; i++) {
        n_prompt[i] = sd_tokenize(sd_model_tokenizer(m), texts[i], strlen(texts[i]), 1, 0, ids[i], 64);
        prompts[i] = ids[i];
        CHECK(n_prompt[i] > 0 && n_prompt[i] <= 64, "tokenize %d", n_prompt[i]);
    }
    gen_together(m, prompts, n_prompt, 3, NULL, 24, "SmolLM2");
    gen_together(m, prompts, n_prompt, 3, "ngram:3-8", 24, "SmolLM2");
    sd_model_free(m);
}

// ---------------------------------------------------------------- errors

// A failing call must leave s exactly as its last forward left it: the
// logits of node 0 (a copy in keep) and the pending chain of n rows.
static void check_untouched(sd_session *s, const float *keep, int V, int n_past, const char *what) {
    const float *lg = sd_session_logits(s, 0);
    CHECK(lg && memcmp(lg, keep, (size_t)V * sizeof(float)) == 0, "%s: the session's logits changed", what);
    CHECK(sd_session_n_past(s) == n_past, "%s: n_past changed", what);
}

static void test_batcher_errors(void) {
    synth_params p = synth_default_params();
    sd_model *m = load_synth(&p, "err"), *m2 = load_synth(&p, "err2");
    sd_threadpool *pool = NULL, *pool2 = NULL;
    sd_batcher *bat = NULL;
    sd_session *a = NULL, *b = NULL, *c = NULL, *other_m = NULL, *other_p = NULL, *small = NULL;
    float *keep = NULL;
    int ok = m && m2 && sd_threadpool_new(&pool, 2, g_err, sizeof g_err) == 0 &&
             sd_threadpool_new(&pool2, 2, g_err, sizeof g_err) == 0 &&
             sd_batcher_new(&bat, m, pool, 12, g_err, sizeof g_err) == 0;
    CHECK(ok, "setup: %s", g_err);
    if (!ok) goto out;
    CHECK(sd_batcher_n_nodes(bat) == 12, "n_nodes %d", sd_batcher_n_nodes(bat));
    sd_batcher *bad = NULL;
    CHECK(sd_batcher_new(&bad, m, pool, 0, g_err, sizeof g_err) < 0 && !bad && strstr(g_err, "n_nodes"), "n_nodes 0: %s",
          g_err);
    CHECK(sd_batcher_new(&bad, m, NULL, 8, g_err, sizeof g_err) < 0 && !bad, "no pool accepted");
    a = new_session(m, pool, 64, 8);
    b = new_session(m, pool, 64, 8);
    c = new_session(m, pool, 64, 8);
    other_m = new_session(m2, pool, 64, 8);
    other_p = new_session(m, pool2, 64, 8);
    small = new_session(m, pool, 16, 8);
    keep = malloc((size_t)m->hp.n_vocab * sizeof(float));
    CHECK(a && b && c && other_m && other_p && small && keep, "sessions: %s", g_err);
    if (!a || !b || !c || !other_m || !other_p || !small || !keep) goto out;
    const int32_t toks[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    CHECK(feed(small, toks, 8, 8) == 0 && feed(small, toks, 6, 8) == 0, "%s", g_err);
    // a: a pending forward whose state every failing call must keep
    sd_batch b3 = {.n = 3, .tokens = toks};
    CHECK(sd_session_forward(a, &b3, g_err, sizeof g_err) == 0, "%s", g_err);
    memcpy(keep, sd_session_logits(a, 0), (size_t)m->hp.n_vocab * sizeof(float));
    const sd_batch b4 = {.n = 4, .tokens = toks}, b5 = {.n = 5, .tokens = toks};
    struct {
        sd_session *ss[3];
        sd_batch bs[3];
        int n;
        const char *needle, *what;
        int failed;   // the batch sd_batcher_failed_batch names, -1: the call as a whole
    } cases[] = {
        {{a, other_m}, {b4, b4}, 2, "another model", "model", 1},
        {{a, other_p}, {b4, b4}, 2, "another thread pool", "pool", 1},
        {{a, b, a}, {b4, b4, b4}, 3, "listed twice", "twice", 2},
        {{a, b, c}, {b4, b4, b5}, 3, "13 nodes in all", "too many nodes", -1},
        {{a, small}, {b4, b4}, 2, "context full", "context overflow", 1},
        {{a, b}, {b4, {.n = 9, .tokens = toks}}, 2, "n_batch", "batch larger than n_batch", 1},
        {{a, b}, {b4, {.n = 2, .tokens = toks, .precise = 1}}, 2, "cannot mix precise", "mixed precise", 1},
        {{a, NULL}, {b4, b4}, 2, "NULL", "NULL session", 1},
        {{a, b}, {b4, b4}, -1, "sessions", "negative count", -1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        g_err[0] = 0;
        const int r = sd_batcher_forward(bat, cases[k].ss, cases[k].bs, cases[k].n, g_err, sizeof g_err);
        CHECK(r < 0 && strstr(g_err, cases[k].needle), "%s: returned %d, message '%s' lacks '%s'", cases[k].what, r,
              g_err, cases[k].needle);
        CHECK(sd_batcher_failed_batch(bat) == cases[k].failed, "%s: failed batch %d, want %d", cases[k].what,
              sd_batcher_failed_batch(bat), cases[k].failed);
        check_untouched(a, keep, m->hp.n_vocab, 0, cases[k].what);
        printf("  info: %s -> %s\n", cases[k].what, g_err);
    }
    // different layer-skip masks
    const uint8_t skip[2] = {1, 0};
    CHECK(sd_session_set_layer_skip(b, skip, g_err, sizeof g_err) == 1, "%s", g_err);
    sd_session *sk[2] = {a, b};
    sd_batch bk[2] = {b4, b4};
    g_err[0] = 0;
    CHECK(sd_batcher_forward(bat, sk, bk, 2, g_err, sizeof g_err) < 0 && strstr(g_err, "skips"), "skip masks: '%s'",
          g_err);
    check_untouched(a, keep, m->hp.n_vocab, 0, "skip masks");
    CHECK(sd_session_set_layer_skip(b, NULL, g_err, sizeof g_err) == 0, "%s", g_err);
    // a pool held by someone else: the pass refuses, deterministically
    CHECK(sd_pool_try_acquire(pool) == 1, "could not take the pool");
    g_err[0] = 0;
    CHECK(sd_batcher_forward(bat, sk, bk, 2, g_err, sizeof g_err) == SD_ERR_BUSY && strstr(g_err, "in use") &&
              sd_batcher_failed_batch(bat) == -1,
          "busy pool: '%s'", g_err);
    sd_pool_release(pool);
    check_untouched(a, keep, m->hp.n_vocab, 0, "busy pool");
    // nothing to do
    CHECK(sd_batcher_forward(bat, NULL, NULL, 0, g_err, sizeof g_err) == 0, "n = 0: %s", g_err);
    check_untouched(a, keep, m->hp.n_vocab, 0, "n = 0");
    // and the pending chain of a's last forward can still be committed
    CHECK(sd_session_commit(a, NULL, 0, g_err, sizeof g_err) == 0 && sd_session_n_past(a) == 3, "commit after errors: %s",
          g_err);
    // a pass that works after all that
    CHECK(sd_batcher_forward(bat, sk, bk, 2, g_err, sizeof g_err) == 0 && sd_batcher_failed_batch(bat) == -1, "%s",
          g_err);
out:
    free(keep);
    sd_session_free(a);
    sd_session_free(b);
    sd_session_free(c);
    sd_session_free(other_m);
    sd_session_free(other_p);
    sd_session_free(small);
    sd_batcher_free(bat);
    sd_threadpool_free(pool);
    sd_threadpool_free(pool2);
    sd_model_free(m);
    sd_model_free(m2);
}

int main(void) {
    T_RUN(test_batcher_errors);
    T_RUN(test_batcher_bits_synth);
    T_RUN(test_batcher_generation_synth);
    T_RUN(test_batcher_bits_default);
    T_RUN(test_batcher_generation_default);
    T_EXIT();
}

// test_lookahead.c - lookahead decoding (src/draft/draft_lookahead.c and the
// aux/observe support of the speculative loop): the Jacobi window and the
// n-gram pool as units (layout of the lookahead branch, window shift,
// harvested n-grams, per-key ring, key eviction, candidate trie), then
// greedy losslessness through sd_spec_generate on synthetic models (with
// accepted n-grams), sampled reproducibility and a chi-square check of the
// sampled distribution, and greedy equality on the default model.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "draft/draft_lookahead.h"
#include "specdec_spec.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];

typedef sc_tokens collect_t;

static sd_drafter *new_la(int W, int N, int G, int per_key, int pool_keys, int text, int nv) {
    sd_draft_lookahead_params p = sd_draft_lookahead_default_params();
    p.W = W, p.N = N, p.G = G, p.per_key = per_key, p.pool_keys = pool_keys, p.text_ngrams = text;
    sd_drafter *d = NULL;
    if (sd_draft_lookahead_new(&d, &p, nv, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

// ---------------------------------------------------------------- units
#define UNV 16
typedef struct {
    float rows[64][UNV];   // logits by batch index
    int have[64];
} fake_logits;
static const float *fake_get(void *st, int i) {
    fake_logits *f = st;
    return i >= 0 && i < 64 && f->have[i] ? f->rows[i] : NULL;
}
static void fake_set(fake_logits *f, int i, int32_t argmax) {
    for (int v = 0; v < UNV; v++) f->rows[i][v] = (float)(v % 3) * 0.1f;
    f->rows[i][argmax] = 5.0f;
    f->have[i] = 1;
}

// One lookahead step by hand: aux with a tree of n_tree nodes, then accept
// with the last level's argmaxes next[0..W) as the target's logits.
static int unit_step(sd_drafter *d, sd_tree *tree, sd_aux_nodes *aux, const int32_t *next, int W, int L) {
    int32_t ctx_tok[4] = {1, 2, 3, 4};
    sd_draft_ctx ctx = {ctx_tok, 4, 16, 0, NULL, &d->rng, NULL, NULL};
    aux->n = 0;
    if (d->vt->aux(d, &ctx, tree, aux, g_err, sizeof g_err) < 0) return -1;
    static fake_logits f;
    memset(&f, 0, sizeof f);
    for (int i = 0; i < W; i++) fake_set(&f, tree->n + (L - 1) * W + i, next[i]);
    int32_t path[1] = {0};
    sd_step_record rec = {.tree = tree, .path = path, .n_path = 1, .bonus = next[0], .aux = aux,
                          .draft_ms = -1.0, .verify_ms = -1.0, .logits = fake_get, .lstate = &f};
    return d->vt->accept(d, &rec, g_err, sizeof g_err);
}

static void test_window_layout_and_update(void) {
    const int W = 3, N = 4, L = N - 1;
    sd_drafter *d = new_la(W, N, 4, 0, 64, 0, UNV);
    CHECK(d != NULL, "%s", g_err);
    if (!d) return;
    sd_tree tree;
    CHECK(sd_tree_init(&tree, 8, UNV, 0) == 0, "tree");
    sd_tree_reset(&tree, 7);
    sd_tree_add(&tree, 0, 9, 1.0f);   // a verification node: aux nodes start at batch index 2
    int32_t tok[64], par[64];
    uint8_t lg[64];
    sd_aux_nodes aux = {64, 0, tok, par, lg};
    // Window: level j, column i = 10*j + i (tokens < UNV not needed for the window).
    int32_t win[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};   // level 0: 1 2 3, level 1: 4 5 6, level 2: 7 8 9
    sd_draft_lookahead_set_window(d, win, 0);
    int32_t next[3] = {11, 12, 13};
    CHECK(unit_step(d, &tree, &aux, next, W, L) == 0, "%s", g_err);
    // Layout: trunk chain off the root, each column a chain off its trunk node.
    CHECK(aux.n == W * L, "aux nodes %d", aux.n);
    int ok = 1;
    for (int j = 0; j < L; j++)
        for (int i = 0; i < W; i++) {
            int k = j * W + i;
            int want_par = j == 0 ? (i == 0 ? 0 : 2 + i - 1) : 2 + (j - 1) * W + i;
            ok &= aux.token[k] == win[j * W + i] && aux.parent[k] == want_par && aux.logits[k] == (j == L - 1);
        }
    CHECK(ok, "lookahead branch layout");
    // Positions the engine derives (depth): trunk i -> 1 + i, (j, i) -> 1 + i + j.
    // Window shifted: level j <- level j+1, last level <- argmax.
    int32_t want1[9] = {4, 5, 6, 7, 8, 9, 11, 12, 13};
    ok = 1;
    for (int k = 0; k < 9; k++) ok &= sd_draft_lookahead_window(d, k / W, k % W) == want1[k];
    CHECK(ok, "window after one Jacobi step");
    // n_updates was 0 < N-2: nothing harvested yet.
    CHECK(sd_draft_lookahead_n_harvested(d) == 0 && sd_draft_lookahead_pool_keys(d) == 0, "no harvest in warm-up");
    int32_t next2[3] = {14, 15, 11};
    CHECK(unit_step(d, &tree, &aux, next2, W, L) == 0, "%s", g_err);
    CHECK(sd_draft_lookahead_n_harvested(d) == 0, "still warm-up after 1 update (N-2 = 2)");
    int32_t next3[3] = {1, 2, 3};
    CHECK(unit_step(d, &tree, &aux, next3, W, L) == 0, "%s", g_err);
    // Before this step the window was levels {7 8 9}, {11 12 13}, {14 15 11}:
    // columns give the 4-grams 7 11 14 1, 8 12 15 2, 9 13 11 3.
    CHECK(sd_draft_lookahead_n_harvested(d) == 3 && sd_draft_lookahead_pool_keys(d) == 3, "harvested %ld, keys %d",
          sd_draft_lookahead_n_harvested(d), sd_draft_lookahead_pool_keys(d));
    int32_t g[3 * 4];
    CHECK(sd_draft_lookahead_pool_get(d, 7, g, 4) == 1 && g[0] == 11 && g[1] == 14 && g[2] == 1, "gram 7");
    CHECK(sd_draft_lookahead_pool_get(d, 8, g, 4) == 1 && g[0] == 12 && g[1] == 15 && g[2] == 2, "gram 8");
    CHECK(sd_draft_lookahead_pool_get(d, 9, g, 4) == 1 && g[0] == 13 && g[1] == 11 && g[2] == 3, "gram 9");
    // A small aux capacity shrinks the window to the columns that fit.
    aux.cap = 2 * L + 1;
    int32_t next4[3] = {5, 5, 5};
    CHECK(unit_step(d, &tree, &aux, next4, 2, L) == 0 && aux.n == 2 * L, "reduced window: %d nodes", aux.n);
    CHECK(sd_draft_lookahead_window(d, L - 1, 0) == 5 && sd_draft_lookahead_window(d, L - 1, 2) == 3,
          "only the placed columns move");
    // The verification branch: candidates for the root merged by prefix.
    sd_tree_reset(&tree, 9);
    int32_t ctx_tok[2] = {0, 9};
    sd_draft_ctx ctx = {ctx_tok, 2, 8, 0, NULL, NULL, NULL, NULL};
    CHECK(d->vt->propose(d, &ctx, &tree, g_err, sizeof g_err) == 0 && tree.n == 4, "trie of one 4-gram: %d nodes",
          tree.n);
    CHECK(tree.token[1] == 13 && tree.parent[2] == 1 && tree.token[3] == 3, "candidate path");
    sd_tree_free(&tree);
    sd_drafter_free(d);
}

// Pool: per-key ring (newest first, oldest replaced, duplicates refreshed),
// least-recently-updated key evicted when the key table is full; the
// candidate trie shares prefixes and respects G and the node budget.
static void test_pool_eviction(void) {
    const int W = 1, N = 3, L = 2;
    sd_drafter *d = new_la(W, N, 3, 2, 2, 0, UNV);   // per_key 2, 2 keys, G 3
    CHECK(d != NULL, "%s", g_err);
    if (!d) return;
    sd_tree tree;
    sd_tree_init(&tree, 8, UNV, 0);
    sd_tree_reset(&tree, 0);
    int32_t tok[8], par[8];
    uint8_t lg[8];
    sd_aux_nodes aux = {8, 0, tok, par, lg};
    // Each step: set the window (a, b) and observe c: harvests (a b c).
    int32_t grams[][3] = {{1, 2, 3}, {1, 4, 5}, {1, 2, 6}, {1, 4, 5}, {2, 2, 2}, {3, 1, 1}};
    for (int s = 0; s < 6; s++) {
        sd_draft_lookahead_set_window(d, grams[s], 5);
        CHECK(unit_step(d, &tree, &aux, &grams[s][2], W, L) == 0, "%s", g_err);
        int32_t g[2 * 4];
        if (s == 2) {   // ring of 2: (2 3) dropped
            CHECK(sd_draft_lookahead_pool_get(d, 1, g, 4) == 2 && g[0] == 2 && g[1] == 6 && g[2] == 4 && g[3] == 5,
                  "ring after 3 inserts");
        }
        if (s == 3) {   // duplicate (4 5) becomes the newest, no growth
            CHECK(sd_draft_lookahead_pool_get(d, 1, g, 4) == 2 && g[0] == 4 && g[1] == 5 && g[2] == 2 && g[3] == 6,
                  "duplicate refreshed");
        }
    }
    // Keys: 1 (updated at step 3), 2 (step 4), then 3 evicted key 1.
    CHECK(sd_draft_lookahead_pool_keys(d) == 2, "keys %d", sd_draft_lookahead_pool_keys(d));
    CHECK(sd_draft_lookahead_pool_get(d, 1, NULL, 0) == 0, "least recent key evicted");
    CHECK(sd_draft_lookahead_pool_get(d, 2, NULL, 0) == 1 && sd_draft_lookahead_pool_get(d, 3, NULL, 0) == 1,
          "recent keys kept");
    // Trie: grams (5 6) (5 7) (8 9) for key 4 with G 3 -> 5 nodes below the root share "5".
    sd_drafter_free(d);
    d = new_la(1, 3, 2, 3, 8, 0, UNV);   // G 2 of 3 kept
    int32_t g3[][3] = {{4, 8, 9}, {4, 5, 7}, {4, 5, 6}};
    for (int s = 0; s < 3; s++) {
        sd_draft_lookahead_set_window(d, g3[s], 5);
        CHECK(unit_step(d, &tree, &aux, &g3[s][2], W, L) == 0, "%s", g_err);
    }
    sd_tree_reset(&tree, 4);
    int32_t ctx_tok[1] = {4};
    sd_draft_ctx ctx = {ctx_tok, 1, 8, 0, NULL, NULL, NULL, NULL};
    CHECK(d->vt->propose(d, &ctx, &tree, g_err, sizeof g_err) == 0, "%s", g_err);
    CHECK(tree.n == 4 && tree.token[1] == 5 && tree.token[2] == 6 && tree.token[3] == 7 && tree.parent[3] == 1,
          "G=2 newest grams share the prefix 5: %d nodes", tree.n);
    CHECK(tree.mode[0] == SD_CHILDREN_ANY && tree.mode[1] == SD_CHILDREN_ANY, "deterministic children");
    sd_tree_reset(&tree, 4);
    ctx.max_nodes = 2;
    CHECK(d->vt->propose(d, &ctx, &tree, g_err, sizeof g_err) == 0 && tree.n == 2, "budget: %d nodes", tree.n);
    // Text n-grams option: the committed text feeds the pool.
    sd_drafter_free(d);
    d = new_la(1, 3, 2, 0, 8, 1, UNV);
    int32_t text[6] = {1, 2, 3, 1, 2, 9};
    sd_tree_reset(&tree, 1);
    ctx.tokens = text, ctx.n_tokens = 6, ctx.max_nodes = 8;
    CHECK(d->vt->propose(d, &ctx, &tree, g_err, sizeof g_err) == 0, "%s", g_err);
    int32_t g[4];
    CHECK(sd_draft_lookahead_pool_get(d, 1, g, 2) == 2 && g[0] == 2 && g[1] == 9 && g[2] == 2 && g[3] == 3,
          "text n-grams (1 2 9) newest, (1 2 3)");
    CHECK(tree.n == 4, "text candidates: %d nodes", tree.n);
    d->vt->reset(d);
    CHECK(sd_draft_lookahead_pool_keys(d) == 0 && sd_draft_lookahead_window(d, 0, 0) == -1, "reset clears");
    sd_tree_free(&tree);
    sd_drafter_free(d);
    // Parameter checks.
    CHECK(new_la(0, 3, 1, 0, 8, 0, UNV) == NULL && strstr(g_err, "W=0"), "W=0 refused: %s", g_err);
    CHECK(new_la(2, 1, 1, 0, 8, 0, UNV) == NULL && strstr(g_err, "N=1"), "N=1 refused: %s", g_err);
}

// ---------------------------------------------------------------- end to end
static sd_model *g_tgt;
static int need_model(void) {
    if (g_tgt) return 1;
    synth_params p = synth_default_params();
    char path[256];
    snprintf(path, sizeof path, "/tmp/specdec_test_lookahead_%d.gguf", (int)getpid());
    if (synth_write(path, &p, g_err, sizeof g_err) < 0 || sd_model_load(&g_tgt, path, g_err, sizeof g_err) < 0)
        g_tgt = NULL;
    remove(path);
    return g_tgt != NULL;
}

static sd_session *new_session(const sd_model *m, int n_ctx, int n_threads) {
    return sc_new_session(m, n_ctx, n_threads, g_err, sizeof g_err);
}

static sd_sampler *new_sampler(int nv, float temp, float penalty) {
    return sc_new_sampler(nv, temp, penalty, g_err, sizeof g_err);
}

static int run_plain(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt, int n_predict,
                     collect_t *out, int *finish) {
    sd_gen_stats st;
    int rc = sc_run_plain(s, smp, prompt, n_prompt, n_predict, out, &st, g_err, sizeof g_err);
    *finish = st.finish;
    return rc;
}

static int run_spec(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                    int n_predict, int max_nodes, collect_t *out, sd_gen_stats *st) {
    return sc_run_spec(s, smp, d, prompt, n_prompt, n_predict, max_nodes, out, st, g_err, sizeof g_err);
}

static int same_tokens(const collect_t *a, const collect_t *b) { return sc_same_tokens(a, b); }

// Prompt: a random pattern of period `period` repeated (period 0: random).
static int make_prompt(int32_t *p, int n, uint64_t seed, int period) {
    for (int i = 0; i < n; i++) {
        if (period > 0 && i >= period) {
            p[i] = p[i - period];
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 3 + (int32_t)((seed >> 33) % 317u);
    }
    return n;
}

static void check_greedy(int W, int N, int G, int text, float penalty, int n_ctx, int n_predict, int *accepted) {
    sd_session *s = new_session(g_tgt, n_ctx, 1);
    sd_sampler *smp = new_sampler(320, 0.0f, penalty);
    sd_drafter *d = new_la(W, N, G, 0, 4096, text, 320);
    CHECK(s && smp && d, "setup: %s", g_err);
    if (s && smp && d) {
        static collect_t a, b;
        int n_fwd = 0, n_tok = 0, n_acc = 0;
        for (int pr = 0; pr < 5; pr++) {
            int32_t prompt[48];
            int np = make_prompt(prompt, 6 + 8 * pr, 500 + (uint64_t)pr, pr % 2 ? 5 + pr : 0);
            int fa;
            CHECK(run_plain(s, smp, prompt, np, n_predict, &a, &fa) == 0, "plain: %s", g_err);
            int np_plain = sd_session_n_past(s);
            sd_gen_stats st;
            CHECK(run_spec(s, smp, d, prompt, np, n_predict, 16, &b, &st) == 0, "lookahead: %s", g_err);
            CHECK(same_tokens(&a, &b), "W%d N%d G%d text %d prompt %d: output differs from plain greedy (%d vs %d)", W,
                  N, G, text, pr, b.n, a.n);
            CHECK(st.finish == fa && sd_session_n_past(s) == np_plain, "finish %d/%d, n_past %d/%d", st.finish,
                  fa, sd_session_n_past(s), np_plain);
            n_fwd += st.n_target_forwards;
            n_tok += b.n;
            n_acc += st.n_draft_accepted;
        }
        printf("  W%d N%d G%d text %d pen %.1f: %4d tokens in %4d forwards (%.2f per forward), %d n-gram tokens accepted\n",
               W, N, G, text, penalty, n_tok, n_fwd, n_fwd ? (double)n_tok / n_fwd : 0.0, n_acc);
        *accepted = n_acc;
    }
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
}

static void test_greedy_synthetic(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    int acc = 0;
    check_greedy(4, 3, 4, 0, 1.0f, 512, 96, &acc);
    CHECK(acc > 0, "the Jacobi harvest never produced an accepted n-gram");
    check_greedy(5, 4, 3, 0, 1.0f, 512, 96, &acc);
    check_greedy(3, 2, 2, 0, 1.0f, 512, 96, &acc);
    check_greedy(4, 3, 4, 1, 1.0f, 512, 96, &acc);
    CHECK(acc > 0, "text n-grams: nothing accepted");
    check_greedy(4, 3, 4, 0, 1.3f, 512, 96, &acc);
    // Small context: the window shrinks as the context fills, n_predict unbounded.
    check_greedy(6, 4, 4, 1, 1.0f, 80, 0, &acc);
}

static void test_stochastic(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = new_session(g_tgt, 512, 1);
    sd_sampler *smp = new_sampler(320, 0.9f, 1.0f);
    sd_drafter *d = new_la(4, 3, 4, 0, 4096, 1, 320);
    CHECK(s && smp && d, "setup: %s", g_err);
    if (s && smp && d) {
        static collect_t a, b;
        int32_t prompt[30];
        make_prompt(prompt, 30, 7, 6);
        sd_gen_stats st;
        sd_sampler_reseed(smp, 42);
        CHECK(run_spec(s, smp, d, prompt, 30, 96, 16, &a, &st) == 0 && a.n > 0, "%s", g_err);
        int acc = st.n_draft_accepted;
        sd_sampler_reseed(smp, 42);
        CHECK(run_spec(s, smp, d, prompt, 30, 96, 16, &b, &st) == 0, "%s", g_err);
        CHECK(same_tokens(&a, &b), "same seed, same output");
        sd_sampler_reseed(smp, 43);
        CHECK(run_spec(s, smp, d, prompt, 30, 96, 16, &b, &st) == 0, "%s", g_err);
        CHECK(!same_tokens(&a, &b), "another seed, another output");
        printf("  sampled: %d n-gram tokens accepted, %.2f tokens per forward\n", acc, st.mean_accepted);
    }
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
}

// Chi-square of the first 3 sampled tokens (top-k 4: 64 sequences with exact
// probabilities from plain forwards), as in test_methods_lossless.c, with a repetitive
// prompt and text n-grams. The drafter is NOT reset between runs, so its
// pool holds the n-grams of earlier runs' outputs and proposes the likely
// continuations of the first token; that keeps every run exact (the pool
// depends only on earlier, independent runs, never on the verifier's
// randomness of the current step).
static void test_sampled_distribution(void) {
    if (!need_model()) SKIP("synthetic model: %.200s", g_err);
    sd_session *s = new_session(g_tgt, 64, 1), *ref = new_session(g_tgt, 64, 1);
    sd_sampler *smp = sc_topk4_sampler(320, g_err, sizeof g_err);
    sd_drafter *d = new_la(3, 3, 4, 0, 256, 1, 320);
    CHECK(s && ref && smp && d, "setup: %s", g_err);
    if (!s || !ref || !smp || !d) goto out;
    enum { NP = 9 };
    int32_t prompt[NP];
    make_prompt(prompt, NP, 31, 3);
    static sc_seq3 e;
    sc_fwd_probs fp = {ref, smp, g_err, sizeof g_err};
    CHECK(sc_seq3_enumerate(&e, sc_fwd_probs_fn, &fp, prompt, NP, 320) == 0, "out of memory");
    CHECK(e.n_seq == 64, "enumerated %d sequences", e.n_seq);
    static double cnt[64];
    memset(cnt, 0, sizeof cnt);
    int n_other = 0, n_run = 2000;
    long n_acc = 0;
    sd_sampler_reseed(smp, 2024);
    static collect_t o;
    for (int r = 0; r < n_run; r++) {
        sd_gen_stats st;
        sd_session_truncate(s, 0, NULL, 0);
        o.n = 0;
        sd_gen_params ps = sd_gen_default_params();
        ps.n_predict = 3;
        ps.max_nodes = 16;
        if (sd_generate(s, smp, d, prompt, NP, &ps, sc_collect_cb, &o, &st, g_err, sizeof g_err) < 0 || o.n != 3) {
            CHECK(0, "run %d: %s", r, g_err);
            break;
        }
        n_acc += st.n_draft_accepted;
        sc_seq3_tally(&e, o.tok, cnt, &n_other);
    }
    double chi = sc_seq3_chi2(&e, cnt, n_run);
    printf("  lookahead sampled: chi2 = %.1f (df 63, limit 125), %ld n-gram tokens accepted in %d runs\n", chi, n_acc,
           n_run);
    CHECK(n_other == 0, "%d sequences outside the target's support", n_other);
    CHECK(chi < 125.0, "chi2 %.1f: sampled output is not distributed as the target", chi);
    CHECK(n_acc > 0, "no n-gram was ever accepted: the test does not exercise verification");
out:
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_session_free(ref);
}

static void test_default_model(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_session *s = new_session(m, 256, 2);
    sd_sampler *smp = new_sampler(info.n_vocab, 0.0f, 1.0f);
    sd_drafter *d = new_la(4, 3, 4, 0, 4096, 0, info.n_vocab);
    CHECK(s && smp && d, "setup: %s", g_err);
    if (s && smp && d) {
        const char *texts[] = {"The capital of France is", "Count from one to twenty: one, two, three,"};
        for (int i = 0; i < 2; i++) {
            int32_t prompt[64];
            int np = sd_tokenize(sd_model_tokenizer(m), texts[i], strlen(texts[i]), 1, 0, prompt, 64);
            static collect_t a, b;
            int fa;
            sd_gen_stats st;
            run_plain(s, smp, prompt, np, 32, &a, &fa);
            CHECK(run_spec(s, smp, d, prompt, np, 32, 16, &b, &st) == 0, "%s", g_err);
            CHECK(same_tokens(&a, &b), "prompt %d: lookahead output differs from plain greedy", i);
            printf("  SmolLM2 lookahead W4 N3 G4: %d tokens, %.2f per forward, accepted %d of %d proposed\n", b.n,
                   st.mean_accepted, st.n_draft_accepted, st.n_draft_nodes);
        }
    }
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_window_layout_and_update);
    T_RUN(test_pool_eviction);
    T_RUN(test_greedy_synthetic);
    T_RUN(test_stochastic);
    T_RUN(test_sampled_distribution);
    T_RUN(test_default_model);
    sd_model_free(g_tgt);
    T_EXIT();
}

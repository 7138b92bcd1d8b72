// test_ngram_lookup.c - the prompt-lookup / retrieval drafter: the n-gram index
// (longest n wins, frequency ranking, tree shape and caps, incremental
// updates), the per-step sizing (no draft without a match, long chains for
// long copies, periodic continuations, cost-aware sizes, learning from
// rejections), corpus candidates in the tree, and losslessness through
// sd_spec_generate on synthetic models (greedy equality, sampled
// distribution) and on the default model when present. The suffix index it
// searches is tested by test_suffix_index.c.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "specdec.h"
#include "common.h"
#include "draft/draft_model.h"
#include "draft/draft_merge.h"
#include "draft/draft_ngram.h"
#include "specdec_spec.h"
#include "lib/spec_check.h"
#include "lib/synth.h"
#include "draft/suffix.h"
#include "t.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char g_err[512];
static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

// ------------------------------------------------------------ models
static sd_model *g_tgt, *g_other;
static sd_model *synth_model(uint64_t seed, int n_layer, int n_vocab, const char *tag) {
    synth_params p = synth_default_params();
    p.seed = seed;
    p.n_layer = n_layer;
    p.n_vocab = n_vocab;
    return sc_synth_model(&p, "ngram", tag, g_err, sizeof g_err);
}
static int need_models(void) {
    if (!g_tgt) g_tgt = synth_model(1234, 2, 320, "tgt");
    if (!g_other) g_other = synth_model(1, 1, 384, "other");
    return g_tgt && g_other;
}

// A corpus of synthetic-vocabulary words ("w<k>" pieces) with repeated phrases.
static void write_corpus(const char *path, uint64_t seed, int n_words) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint64_t r = seed;
    for (int i = 0; i < n_words; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int w = (int)((r >> 33) % 50);
        if (w < 10) fprintf(f, "w5 w6 w7 w8 w9 ");   // a frequent phrase
        else fprintf(f, "w%d ", w);
        if (i % 20 == 19) fprintf(f, "\n");
    }
    fclose(f);
}

// ------------------------------------------------------------ n-gram index
static sd_tree g_tree;
static int propose(sd_drafter *d, const int32_t *text, int n, int max_nodes) {
    sd_draft_ctx ctx = {text, n, max_nodes, 0, NULL, NULL, NULL, NULL};
    sd_tree_reset(&g_tree, text[n - 1]);
    return d->vt->propose(d, &ctx, &g_tree, g_err, sizeof g_err);
}
// Tokens of the tree's first-child chain from the root.
static int first_chain(int32_t *out) {
    int n = 0, cur = 0;
    for (;;) {
        int c = -1;
        for (int j = cur + 1; j < g_tree.n && c < 0; j++)
            if (g_tree.parent[j] == cur) c = j;
        if (c < 0) return n;
        out[n++] = g_tree.token[c];
        cur = c;
    }
}
static int root_children(int32_t *out) {
    int n = 0;
    for (int j = 1; j < g_tree.n; j++)
        if (g_tree.parent[j] == 0) out[n++] = g_tree.token[j];
    return n;
}
static int tree_valid(void) {
    for (int i = 1; i < g_tree.n; i++)
        if (g_tree.parent[i] < 0 || g_tree.parent[i] >= i || g_tree.mode[g_tree.parent[i]] != SD_CHILDREN_ANY ||
            g_tree.depth[i] != g_tree.depth[g_tree.parent[i]] + 1)
            return 0;
    return 1;
}

// The fill sizing (every step fills max_branches x K): the tree-structure tests.
static sd_drafter *new_ngram(int N, int K, int branches, int matches) {
    sd_draft_ngram_params p = sd_draft_ngram_default_params();
    p.n_max = N, p.k_max = K, p.max_branches = branches, p.max_matches = matches;
    p.n_ctx = 16;   // small: exercises the growth path
    p.sizing = SD_NGRAM_FILL;
    sd_drafter *d = NULL;
    if (sd_draft_ngram_new(&d, &p, NULL, g_err, sizeof g_err) < 0) return NULL;
    return d;
}
// The default per-step sizing; cost: NULL = the built-in relative curve.
static sd_drafter *new_sized(int N, int K, int branches, const sd_cost_curve *cost) {
    sd_draft_ngram_params p = sd_draft_ngram_default_params();
    p.n_max = N, p.k_max = K, p.max_branches = branches;
    p.n_ctx = 16;
    if (cost) {
        p.tree_auto.on = 1;
        p.tree_auto.cost = cost;
        p.tree_auto.max_nodes = 64;
        p.tree_auto.max_depth = K;
    }
    sd_drafter *d = NULL;
    if (sd_draft_ngram_new(&d, &p, NULL, g_err, sizeof g_err) < 0) return NULL;
    return d;
}

static void test_ngram_lookup(void) {
    if (sd_tree_init(&g_tree, 64, 320, 0) < 0) SKIP("oom");
    sd_drafter *d = new_ngram(3, 4, 4, 16);
    CHECK(d != NULL, "%s", g_err);
    if (!d) return;
    int32_t ch[64], rc[16];
    int nm, nc, nd;
    // Trigram (70 20 30) unseen; bigram (20 30) seen twice: two continuations.
    int32_t t1[] = {10, 20, 30, 40, 50, 20, 30, 60, 70, 20, 30};
    CHECK(propose(d, t1, 11, 64) == 0, "%s", g_err);
    sd_draft_ngram_last(d, &nm, &nc, &nd);
    CHECK(nm == 2 && nc == 2 && nd == 0, "bigram match: n %d, %d matches", nm, nc);
    int n = root_children(rc);
    CHECK(n == 2 && rc[0] == 60 && rc[1] == 40, "two branches, most recent first: %d [%d %d]", n, rc[0], rc[1]);
    n = first_chain(ch);
    CHECK(n == 4 && ch[0] == 60 && ch[1] == 70 && ch[2] == 20 && ch[3] == 30, "continuation of K=4: %d", n);
    CHECK(g_tree.n == 9 && tree_valid(), "tree of %d nodes", g_tree.n);
    // The longest n wins: the trigram (1 2 3) occurred; the bigram's other continuation is not used.
    d->vt->reset(d);
    int32_t t2[] = {1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3};
    CHECK(propose(d, t2, 11, 64) == 0, "%s", g_err);
    sd_draft_ngram_last(d, &nm, &nc, &nd);
    n = root_children(rc);
    CHECK(nm == 3 && nc == 1 && n == 1 && rc[0] == 4, "trigram wins: n %d, %d matches, %d children", nm, nc, n);
    // Unigram only, and nothing at all.
    d->vt->reset(d);
    int32_t t3[] = {8, 1, 2, 3, 8};
    CHECK(propose(d, t3, 5, 64) == 0 && (sd_draft_ngram_last(d, &nm, &nc, &nd), nm == 1) && g_tree.n == 5,
          "unigram: n %d, %d nodes", nm, g_tree.n);
    int32_t t4[] = {8, 1, 2, 3, 9};
    CHECK(propose(d, t4, 5, 64) == 0 && g_tree.n == 1, "no match: %d nodes", g_tree.n);
    CHECK(propose(d, t4, 1, 64) == 0 && g_tree.n == 1, "one token: %d nodes", g_tree.n);
    // Frequency: (7 8) is followed by 1 three times and by 2 once (N = 2: the
    // trigram (0 7 8) would only see the 1s).
    sd_drafter_free(d);
    d = new_ngram(2, 4, 4, 16);
    int32_t t5[] = {7, 8, 2, 0, 7, 8, 1, 0, 7, 8, 1, 0, 7, 8, 1, 0, 7, 8};
    CHECK(propose(d, t5, 18, 64) == 0, "%s", g_err);
    n = root_children(rc);
    CHECK(n == 2 && rc[0] == 1 && rc[1] == 2 && g_tree.token[1] == 1 && fabsf(g_tree.p[1] - 0.75f) < 1e-6f,
          "ranked by frequency: %d children, first %d p %.3f", n, rc[0], g_tree.p[1]);
    // Caps: node limit, branch limit.
    CHECK(propose(d, t5, 18, 5) == 0 && g_tree.n == 5 && tree_valid(), "node cap: %d", g_tree.n);
    sd_drafter_free(d);
    d = new_ngram(2, 4, 1, 16);
    CHECK(propose(d, t5, 18, 64) == 0 && g_tree.n == 5, "one branch: %d nodes", g_tree.n);
    for (int i = 0; i < g_tree.n; i++) CHECK(sd_tree_n_children(&g_tree, i) <= 1, "chain at node %d", i);
    CHECK(g_tree.token[1] == 1, "the chain is the most frequent continuation");
    sd_drafter_free(d);
    // max_branches 2 on a text with 3 continuations of (5 6): the 2 most frequent.
    d = new_ngram(2, 3, 2, 16);
    int32_t t6[] = {5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6, 3, 5, 6, 2, 5, 6, 3, 5, 6};
    CHECK(propose(d, t6, 20, 64) == 0, "%s", g_err);
    n = root_children(rc);
    CHECK(n == 2 && rc[0] == 3 && rc[1] == 2, "top 2 of 3 branches: %d [%d %d]", n, rc[0], rc[1]);
    int leaves = 0;
    for (int i = 1; i < g_tree.n; i++) leaves += sd_tree_n_children(&g_tree, i) == 0;
    CHECK(leaves <= 2 && tree_valid(), "%d leaves", leaves);
    sd_drafter_free(d);
    sd_tree_free(&g_tree);
}

// accept() feeds the index: tokens generated after the prompt are found, and
// the drafter's tree equals that of a fresh drafter given the whole text.
static void test_ngram_incremental(void) {
    if (sd_tree_init(&g_tree, 64, 320, 0) < 0) SKIP("oom");
    sd_drafter *d = new_ngram(3, 5, 3, 16), *fresh = new_ngram(3, 5, 3, 16);
    CHECK(d && fresh, "%s", g_err);
    if (!d || !fresh) return;
    static int32_t text[4000];
    int n = 0;
    int32_t init[] = {5, 6, 7, 8, 9, 5, 6};
    memcpy(text, init, sizeof init);
    n = 7;
    CHECK(propose(d, text, n, 16) == 0 && g_tree.n == 6, "first proposal %d nodes", g_tree.n);
    // Accept 2 drafts (7 8) and bonus 42.
    int32_t path[3] = {0, 1, 2};
    CHECK(g_tree.token[1] == 7 && g_tree.token[2] == 8, "chain 7 8");
    CHECK(sd_drafter_accept_path(d, &g_tree, path, 3, 42, g_err, sizeof g_err) == 0, "%s", g_err);
    text[n++] = 7, text[n++] = 8, text[n++] = 42;
    CHECK(propose(d, text, n, 16) == 0 && g_tree.n == 1, "42 unseen: %d nodes", g_tree.n);
    CHECK(sd_drafter_accept_path(d, &g_tree, path, 1, 5, g_err, sizeof g_err) == 0, "%s", g_err);
    text[n++] = 5;
    CHECK(propose(d, text, n, 16) == 0, "%s", g_err);
    int32_t ch[64];
    int nc = first_chain(ch);
    CHECK(nc == 5 && ch[0] == 6 && ch[3] == 42 && ch[4] == 5, "continuation holds the generated 42: %d [%d %d %d %d]",
          nc, ch[0], ch[1], ch[2], ch[3]);
    // A long random walk of steps over a small alphabet (so matches abound),
    // well past the initial index size; compared with a fresh drafter each step.
    int mism = 0, steps = 0, nonempty = 0;
    static sd_tree t2;
    sd_tree_init(&t2, 64, 320, 0);
    while (n < 3000) {
        CHECK(propose(d, text, n, 12) == 0, "%s", g_err);
        fresh->vt->reset(fresh);
        sd_draft_ctx ctx = {text, n, 12, 0, NULL, NULL, NULL, NULL};
        sd_tree_reset(&t2, text[n - 1]);
        fresh->vt->propose(fresh, &ctx, &t2, g_err, sizeof g_err);
        if (t2.n != g_tree.n || memcmp(t2.token, g_tree.token, sizeof(int32_t) * (size_t)t2.n) ||
            memcmp(t2.parent, g_tree.parent, sizeof(int32_t) * (size_t)t2.n))
            mism++;
        nonempty += g_tree.n > 1;
        // Accept a random prefix of the first chain, then a bonus.
        int32_t p[64];
        int np = 1;
        p[0] = 0;
        int cur = 0;
        while ((int)(rnd() % 3) != 0) {
            int c = -1;
            for (int j = cur + 1; j < g_tree.n && c < 0; j++)
                if (g_tree.parent[j] == cur) c = j;
            if (c < 0) break;
            p[np++] = c;
            cur = c;
        }
        for (int k = 1; k < np; k++) text[n++] = g_tree.token[p[k]];
        int32_t bonus = (int32_t)(rnd() % 6);
        text[n++] = bonus;
        CHECK(sd_drafter_accept_path(d, &g_tree, p, np, bonus, g_err, sizeof g_err) == 0, "%s", g_err);
        steps++;
    }
    CHECK(mism == 0, "%d of %d steps differ from a fresh drafter", mism, steps);
    CHECK(nonempty > steps / 2, "only %d of %d steps proposed", nonempty, steps);
    // A different text without reset is detected and re-indexed.
    int32_t t4[] = {1, 2, 3, 1, 2};
    CHECK(propose(d, t4, 5, 16) == 0 && g_tree.n == 4 && g_tree.token[1] == 3 && g_tree.token[3] == 2, "resync on a new text: %d nodes",
          g_tree.n);
    printf("  %d steps, %d tokens, identical to re-indexing from scratch\n", steps, n);
    sd_tree_free(&t2);
    sd_drafter_free(d);
    sd_drafter_free(fresh);
    sd_tree_free(&g_tree);
}

// ------------------------------------------------------------ per-step sizing
static void curve3(sd_cost_curve *c, double c2, double c32) {   // 1 node = 1 ms
    sd_cost_curve_init(c);
    sd_cost_curve_set(c, 1, 1.0);
    sd_cost_curve_set(c, 2, c2);
    sd_cost_curve_set(c, 32, c32);
}
static int g_reports;
static struct {
    int n, depth;
} g_report;
// "tree auto: n=9 depth=8 ...": the shape's size and depth.
static void on_report(void *user, const char *line) {
    (void)user;
    g_reports++;
    if (sscanf(line, "tree auto: n=%d depth=%d", &g_report.n, &g_report.depth) != 2) g_report.n = g_report.depth = -1;
}

static void test_ngram_sized(void) {
    if (sd_tree_init(&g_tree, 64, 320, 0) < 0) SKIP("oom");
    int32_t ch[64];
    static int32_t text[4096];
    // 40 distinct tokens, then the first 20 again: a 20-token copy.
    for (int i = 0; i < 40; i++) text[i] = 100 + 7 * i;
    for (int i = 0; i < 20; i++) text[40 + i] = text[i];
    sd_drafter *d = new_sized(3, 16, 4, NULL);
    CHECK(d != NULL, "%s", g_err);
    if (!d) return;
    int32_t none[] = {1, 2, 3, 4, 5};
    CHECK(propose(d, none, 5, 64) == 0 && g_tree.n == 1, "no match, no draft: %d nodes", g_tree.n);
    d->vt->reset(d);
    CHECK(propose(d, text, 60, 64) == 0, "%s", g_err);
    int nc = first_chain(ch), ok = nc >= 12 && g_tree.n == nc + 1;
    for (int j = 0; j < nc && ok; j++) ok = ch[j] == text[20 + j];
    CHECK(ok, "a 20-token copy gets a long chain of the copied text: %d of %d nodes", nc, g_tree.n - 1);
    int long_chain = nc;
    // Only a 1-token match (text[5] after text[39]): a short draft.
    d->vt->reset(d);
    text[40] = text[5];
    CHECK(propose(d, text, 41, 64) == 0, "%s", g_err);
    nc = first_chain(ch);
    CHECK(nc >= 1 && nc <= 3 && ch[0] == text[6], "1-token match: %d nodes (long copy: %d)", nc, long_chain);
    sd_drafter_free(d);
    // Periodic text: the continuation goes on with the period.
    d = new_sized(3, 8, 4, NULL);
    int32_t per[] = {1, 2, 3, 1, 2, 3, 1, 2};
    CHECK(d && propose(d, per, 8, 64) == 0, "%s", g_err);
    nc = first_chain(ch);
    ok = nc >= 4;
    for (int j = 0; j < nc && ok; j++) ok = ch[j] == 1 + (j + 2) % 3;
    CHECK(ok, "periodic continuation 3 1 2 3 ...: %d tokens", nc);
    sd_drafter_free(d);

    // The target's cost curve decides: a 1-token match is not worth a 50%
    // dearer forward, but is worth a free one; a long copy is worth it even then.
    sd_cost_curve steep, flat;
    curve3(&steep, 1.5, 20.0);
    curve3(&flat, 1.0, 1.0);
    sd_drafter *ds = new_sized(3, 16, 4, &steep), *df = new_sized(3, 16, 4, &flat);
    CHECK(ds && df, "%s", g_err);
    if (ds && df) {
        CHECK(propose(ds, text, 41, 64) == 0 && g_tree.n == 1, "steep curve, 1-token match: %d nodes", g_tree.n);
        CHECK(propose(df, text, 41, 64) == 0 && g_tree.n > 1, "flat curve, 1-token match: %d nodes", g_tree.n);
        text[40] = text[0];
        int nsteep = 0, nflat = 0;
        CHECK(propose(ds, text, 60, 64) == 0 && (nsteep = g_tree.n - 1) >= 2, "steep curve, copy: %d nodes",
              g_tree.n - 1);
        CHECK(propose(df, text, 60, 64) == 0 && (nflat = g_tree.n - 1) == 16, "flat curve, copy: %d nodes",
              g_tree.n - 1);
        printf("  20-token copy: %d nodes on the relative curve, %d on a steep one, %d on a flat one\n", long_chain,
               nsteep, nflat);
    }
    sd_drafter_free(ds);
    sd_drafter_free(df);

    // Learning: 1-token matches that are always rejected stop being drafted
    // (a node costs 15% of a forward: worth it at the prior 25%, not at the
    // learnt acceptance).
    sd_cost_curve mid;
    curve3(&mid, 1.15, 20.0);
    d = new_sized(3, 8, 4, &mid);
    int n = 0;
    for (int i = 0; i < 200; i++) text[n++] = 10 + i;   // each token once, followed by the next
    int first = 0, last = 0, steps = 300;
    for (int st = 0; st < steps && d; st++) {
        text[n] = 10 + (int32_t)(rnd() % 200);   // an earlier token, so there is a match
        n++;
        if (propose(d, text, n, 64) < 0) break;
        if (st < 10) first += g_tree.n - 1;
        if (st >= steps - 50) last += g_tree.n - 1;
        int32_t path[1] = {0};
        int32_t bonus = 10 + (int32_t)(rnd() % 200);
        if (g_tree.n > 1 && bonus == g_tree.token[1]) bonus = 10 + (bonus - 10 + 1) % 200;   // always rejected
        if (sd_drafter_accept_path(d, &g_tree, path, 1, bonus, g_err, sizeof g_err) < 0) break;
        text[n++] = bonus;
    }
    CHECK(first >= 3 && last <= 5, "drafted %d nodes in the first 10 steps, %d in the last 50", first, last);
    printf("  always rejected: %d draft nodes in the first 10 steps, %d in the last 50\n", first, last);
    // reset forgets what was learnt: the same tree as a fresh drafter.
    sd_drafter *fresh = new_sized(3, 8, 4, &mid);
    if (d && fresh) {
        d->vt->reset(d);
        CHECK(propose(fresh, text, 201, 64) == 0, "%s", g_err);
        int fn = g_tree.n;
        int32_t ft[64];
        memcpy(ft, g_tree.token, sizeof(int32_t) * (size_t)fn);
        CHECK(propose(d, text, 201, 64) == 0 && g_tree.n == fn && fn > 1 &&
                  !memcmp(ft, g_tree.token, sizeof(int32_t) * (size_t)fn),
              "after reset: %d nodes, fresh drafter %d", g_tree.n, fn);
    }
    sd_drafter_free(fresh);
    sd_drafter_free(d);

    // The automatic variant reports its representative choice once, at creation.
    sd_draft_ngram_params p = sd_draft_ngram_default_params();
    p.tree_auto.on = 1;
    p.tree_auto.cost = &steep;
    p.tree_auto.max_nodes = 32;
    p.tree_auto.max_depth = 8;
    p.tree_auto.report = on_report;
    g_reports = 0;
    d = NULL;
    CHECK(sd_draft_ngram_new(&d, &p, NULL, g_err, sizeof g_err) == 0 && g_reports == 1, "%d reports: %s", g_reports,
          g_err);
    int n_steep = g_report.n;
    sd_drafter_free(d);
    p.tree_auto.cost = &flat;
    d = NULL;
    CHECK(sd_draft_ngram_new(&d, &p, NULL, g_err, sizeof g_err) == 0 && g_reports == 2, "%d reports: %s", g_reports,
          g_err);
    CHECK(g_report.n == 9 && g_report.depth == 8 && n_steep < g_report.n,
          "reported chains: %d nodes (steep), %d (flat)", n_steep, g_report.n);
    sd_drafter_free(d);
    p.tree_auto.cost = NULL;
    d = NULL;
    CHECK(sd_draft_ngram_new(&d, &p, NULL, g_err, sizeof g_err) < 0 && !d, "no cost curve refused: %s", g_err);
    sd_tree_free(&g_tree);
}

// Datastore candidates join the tree.
static void test_ngram_datastore_tree(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    char corpus[256], idx[300];
    snprintf(corpus, sizeof corpus, "/tmp/specdec_test_ngram_%d_ds.txt", (int)getpid());
    snprintf(idx, sizeof idx, "%s.sdsa", corpus);
    write_corpus(corpus, 11, 3000);
    const sd_tokenizer *tok = sd_model_tokenizer(g_tgt);
    sd_draft_ngram_params p = sd_draft_ngram_default_params();
    p.datastore = corpus;
    p.k_max = 6;
    p.sizing = SD_NGRAM_FILL;
    sd_drafter *d = NULL;
    CHECK(sd_draft_ngram_new(&d, &p, tok, g_err, sizeof g_err) == 0, "%s", g_err);
    sd_tree_init(&g_tree, 32, 320, 0);
    if (d) {
        printf("  %s\n", sd_draft_ngram_note(d));
        int32_t text[64];
        int n = sd_tokenize(tok, "w1 w2 w3 w5 w6", strlen("w1 w2 w3 w5 w6"), 1, 0, text, 64);
        CHECK(n > 3 && propose(d, text, n, 32) == 0, "%s", g_err);
        int nm, nc, nd;
        sd_draft_ngram_last(d, &nm, &nc, &nd);
        int32_t ch[64], w7[64];
        int nch = first_chain(ch);
        int nw = sd_tokenize(tok, "w7 w8 w9", strlen("w7 w8 w9"), 0, 0, w7, 8);   // the phrase's continuation
        CHECK(nc == 0 && nd > 0 && nch == 6 && nw >= 6 && !memcmp(ch, w7, sizeof(int32_t) * 6),
              "corpus continuation 'w7 w8 w9': %d ctx, %d corpus matches, chain of %d", nc, nd, nch);
        CHECK(tree_valid() && g_tree.n <= 32, "tree");
        // The per-step sizing drafts a prefix of the same continuation.
        sd_drafter_free(d);
        d = NULL;
        p.sizing = SD_NGRAM_SIZED;
        CHECK(sd_draft_ngram_new(&d, &p, tok, g_err, sizeof g_err) == 0, "%s", g_err);
        if (d) {
            CHECK(propose(d, text, n, 32) == 0, "%s", g_err);
            nch = first_chain(ch);
            CHECK(nch >= 1 && !memcmp(ch, w7, sizeof(int32_t) * (size_t)nch) && tree_valid(),
                  "sized: corpus continuation prefix of %d tokens", nch);
        }
        p.sizing = SD_NGRAM_FILL;
    }
    sd_drafter_free(d);
    d = NULL;
    p.datastore = "/nonexistent/x.txt";
    CHECK(sd_draft_ngram_new(&d, &p, tok, g_err, sizeof g_err) < 0 && !d, "bad datastore refused: %s", g_err);
    p.datastore = NULL;
    p.n_max = 0;
    CHECK(sd_draft_ngram_new(&d, &p, NULL, g_err, sizeof g_err) < 0 && strstr(g_err, "N must"), "N=0: %s", g_err);
    sd_tree_free(&g_tree);
    remove(idx);
    remove(corpus);
}

// ------------------------------------------------------------ losslessness
typedef sc_tokens collect_t;
static sd_session *new_session(const sd_model *m, int n_ctx, int n_threads) {
    return sc_new_session(m, n_ctx, n_threads, g_err, sizeof g_err);
}
static sd_sampler *greedy_sampler(int n_vocab) { return sc_new_sampler(n_vocab, 0.0f, 1.0f, g_err, sizeof g_err); }
static int run_plain(sd_session *s, sd_sampler *smp, const int32_t *prompt, int n_prompt, int n_predict,
                     collect_t *out, sd_gen_stats *st) {
    return sc_run_plain(s, smp, prompt, n_prompt, n_predict, out, st, g_err, sizeof g_err);
}
static int run_spec(sd_session *s, sd_sampler *smp, sd_drafter *d, const int32_t *prompt, int n_prompt,
                    int n_predict, int max_nodes, collect_t *out, sd_gen_stats *st) {
    return sc_run_spec(s, smp, d, prompt, n_prompt, n_predict, max_nodes, out, st, g_err, sizeof g_err);
}
static int same_tokens(const collect_t *a, const collect_t *b) { return sc_same_tokens(a, b); }
static void make_prompt(int32_t *p, int n, uint64_t seed, int n_vocab, int period) {
    for (int i = 0; i < n; i++) {
        if (period && i >= period) {
            p[i] = p[i - period];
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = 3 + (int32_t)((seed >> 33) % (uint64_t)(n_vocab - 3));
    }
}

static void check_greedy(sd_drafter *d, const char *name) {
    sd_session *s = new_session(g_tgt, 512, 1);
    sd_sampler *smp = greedy_sampler(320);
    CHECK(s && smp && d, "%s: setup: %s", name, g_err);
    if (!s || !smp || !d) goto out;
    static collect_t a, b;
    int acc = 0, nodes = 0, fwd = 0, tok = 0;
    for (int pr = 0; pr < 6; pr++) {
        int32_t prompt[64];
        int np = 8 + pr * 9, period = pr % 2 ? 5 + pr : 0;   // odd prompts repeat a phrase
        make_prompt(prompt, np, 300 + (uint64_t)pr, 320, period);
        sd_gen_stats gs;
        sd_gen_stats st;
        CHECK(run_plain(s, smp, prompt, np, 80, &a, &gs) == 0, "plain: %s", g_err);
        int np_plain = sd_session_n_past(s);
        CHECK(run_spec(s, smp, d, prompt, np, 80, 16, &b, &st) == 0, "%s: %s", name, g_err);
        CHECK(same_tokens(&a, &b), "%s prompt %d: speculative output differs from plain greedy (%d vs %d tokens)",
              name, pr, b.n, a.n);
        CHECK(st.finish == gs.finish && sd_session_n_past(s) == np_plain, "%s: finish %d/%d n_past %d/%d", name,
              st.finish, gs.finish, sd_session_n_past(s), np_plain);
        acc += st.n_draft_accepted;
        nodes += st.n_draft_nodes;
        fwd += st.n_target_forwards;
        tok += b.n;
    }
    printf("  %-22s %d tokens in %d forwards (%.2f per forward), accepted %d of %d drafts\n", name, tok, fwd,
           fwd ? (double)tok / fwd : 0.0, acc, nodes);
    CHECK(acc > 0, "%s: no draft accepted", name);
out:
    sd_sampler_free(smp);
    sd_session_free(s);
}

static void test_greedy_lossless(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_drafter *d = new_ngram(3, 8, 4, 16);
    check_greedy(d, "ngram 3,8 fill");
    sd_drafter_free(d);
    d = new_sized(3, 8, 4, NULL);
    check_greedy(d, "ngram 3,8 sized");
    sd_drafter_free(d);
    sd_cost_curve cc;   // a measured-looking curve: the automatic variant
    sd_cost_curve_init(&cc);
    sd_cost_curve_set(&cc, 1, 2.0);
    sd_cost_curve_set(&cc, 4, 3.0);
    sd_cost_curve_set(&cc, 32, 12.0);
    d = new_sized(3, 16, 4, &cc);
    check_greedy(d, "ngram 3,16 sized+curve");
    sd_drafter_free(d);
    d = new_ngram(1, 4, 1, 4);
    check_greedy(d, "ngram 1,4 chain");
    sd_drafter_free(d);
    // Inside the merging drafter, beside a draft model: it hears only its part
    // of the accepted path and must catch up from the committed text.
    sd_model *dft = synth_model(99, 1, 320, "dft");
    sd_draft_model_params dp = sd_draft_model_default_params();
    dp.k = 3;
    dp.n_ctx = 512;
    dp.n_threads = 1;
    sd_drafter *subs[2] = {new_sized(3, 6, 2, NULL), NULL};
    d = NULL;
    CHECK(dft && subs[0] && sd_draft_model_new(&subs[1], dft, g_tgt, &dp, g_err, sizeof g_err) == 0, "%s", g_err);
    if (subs[0] && subs[1]) {
        CHECK(sd_draft_merge_new(&d, subs, 2, 320, g_err, sizeof g_err) == 0, "%s", g_err);
        check_greedy(d, "merged ngram + model");
    } else {
        sd_drafter_free(subs[0]);
        sd_drafter_free(subs[1]);
    }
    sd_drafter_free(d);
    sd_model_free(dft);
    // With a datastore whose text is the synthetic vocabulary's words.
    char corpus[256], idx[300];
    snprintf(corpus, sizeof corpus, "/tmp/specdec_test_ngram_%d_gl.txt", (int)getpid());
    snprintf(idx, sizeof idx, "%s.sdsa", corpus);
    write_corpus(corpus, 3, 4000);
    sd_draft_ngram_params p = sd_draft_ngram_default_params();
    p.datastore = corpus;
    d = NULL;
    CHECK(sd_draft_ngram_new(&d, &p, sd_model_tokenizer(g_tgt), g_err, sizeof g_err) == 0, "%s", g_err);
    check_greedy(d, "ngram 3,8 + datastore");
    sd_drafter_free(d);
    p.sizing = SD_NGRAM_FILL;
    d = NULL;
    CHECK(sd_draft_ngram_new(&d, &p, sd_model_tokenizer(g_tgt), g_err, sizeof g_err) == 0, "%s", g_err);
    check_greedy(d, "ngram 3,8 fill + datastore");
    sd_drafter_free(d);
    remove(idx);
    remove(corpus);
}

// The sampler's distribution after seq[0..n) from a fresh evaluation (in chunks of the session's batch).
static void ref_probs(sd_session *ref, sd_sampler *smp, const int32_t *seq, int n, float *probs) {
    static uint8_t want[64];
    const float *lg = NULL;
    sd_session_truncate(ref, 0, NULL, 0);
    for (int i = 0; i < n; i += 64) {
        int c = SD_MIN(64, n - i);
        memset(want, 0, sizeof want);
        want[c - 1] = i + c == n;
        sd_batch b = {.n = c, .tokens = seq + i, .parent = NULL, .pos = NULL, .logits = want};
        if (sd_session_forward(ref, &b, g_err, sizeof g_err) < 0 || sd_session_commit(ref, NULL, 0, g_err, sizeof g_err) < 0)
            break;
        if (i + c == n) lg = sd_session_logits(ref, c - 1);
    }
    if (lg) sd_sampler_probs(smp, lg, seq, n, probs);
    else memset(probs, 0, sizeof(float) * 320);
}

typedef struct {
    sd_session *ref;
    sd_sampler *smp;
} ref_probs_ud;
static void ref_probs_fn(void *ud, const int32_t *seq, int n, float *probs) {
    ref_probs_ud *r = ud;
    ref_probs(r->ref, r->smp, seq, n, probs);
}

// Sampling: runs, reproducible with a seed; and the chi-square check of
// test_methods_lossless.c: the first 3 sampled tokens (top-k 4: 64 outcomes) are
// distributed as the target's, with a repetitive prompt so that drafts are
// proposed from the first step.
static void test_sampled(void) {
    if (!need_models()) SKIP("synthetic models: %.200s", g_err);
    sd_session *s = new_session(g_tgt, 512, 1), *ref = new_session(g_tgt, 512, 1);
    sd_drafter *d = new_sized(2, 4, 3, NULL), *d1 = new_ngram(1, 3, 2, 4);
    sd_sampler_params sp = sd_sampler_default_params();
    sp.temp = 0.9f;
    sd_sampler *smp = NULL, *smp2 = NULL;
    sd_sampler_new(&smp, &sp, 320, g_err, sizeof g_err);
    smp2 = sc_topk4_sampler(320, g_err, sizeof g_err);
    CHECK(s && ref && d && d1 && smp && smp2, "setup: %s", g_err);
    if (!s || !ref || !d || !d1 || !smp || !smp2) goto out;
    static collect_t a, b;
    int32_t prompt[24];
    make_prompt(prompt, 24, 9, 320, 4);
    sd_gen_stats st;
    sd_sampler_reseed(smp, 42);
    CHECK(run_spec(s, smp, d, prompt, 24, 96, 16, &a, &st) == 0 && a.n == 96, "%s", g_err);
    int nodes = st.n_draft_nodes;
    sd_sampler_reseed(smp, 42);
    CHECK(run_spec(s, smp, d, prompt, 24, 96, 16, &b, &st) == 0, "%s", g_err);
    CHECK(same_tokens(&a, &b), "same seed, same output");
    printf("  sampled: %.2f tokens per forward, %d draft nodes\n", st.mean_accepted, nodes);
    CHECK(nodes > 0, "no drafts proposed");

    // Exact distribution of 3 tokens after a prompt that holds every token
    // once (a shuffled vocabulary) then 6 random ones: with N = 1 every
    // sampled token has occurred, so every step drafts.
    enum { NP = 317 + 6 };
    static int32_t pr[NP + 3];
    for (int i = 0; i < 317; i++) pr[i] = 3 + i;
    for (int i = 316; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1));
        int32_t t = pr[i];
        pr[i] = pr[j], pr[j] = t;
    }
    make_prompt(pr + 317, 6, 31, 320, 0);
    static sc_seq3 e;
    ref_probs_ud rp = {ref, smp2};
    CHECK(sc_seq3_enumerate(&e, ref_probs_fn, &rp, pr, NP, 320) == 0, "out of memory");
    int n_seq = e.n_seq;
    CHECK(n_seq == 64, "enumerated %d sequences", n_seq);
    static double cnt[64];
    memset(cnt, 0, sizeof cnt);
    int n_other = 0, n_run = 2000;
    long drafted = 0;
    sd_sampler_reseed(smp2, 2024);
    for (int r = 0; r < n_run && n_seq == 64; r++) {
        if (run_spec(s, smp2, d1, pr, NP, 3, 16, &b, &st) < 0 || b.n != 3) {
            CHECK(0, "run %d: %s", r, g_err);
            break;
        }
        drafted += st.n_draft_nodes;
        sc_seq3_tally(&e, b.tok, cnt, &n_other);
    }
    double chi = sc_seq3_chi2(&e, cnt, n_run);
    printf("  sampled distribution: chi2 = %.1f (df 63, limit 125), %.1f draft nodes per run\n", chi,
           (double)drafted / n_run);
    CHECK(drafted > n_run, "drafts were proposed (%ld)", drafted);
    CHECK(n_other == 0, "%d sequences outside the target's support", n_other);
    CHECK(chi < 125.0, "chi2 %.1f: sampled output is not distributed as the target", chi);
out:
    sd_drafter_free(d);
    sd_drafter_free(d1);
    sd_sampler_free(smp);
    sd_sampler_free(smp2);
    sd_session_free(s);
    sd_session_free(ref);
}

static const char *k_paragraph =
    "The city council voted on Tuesday to expand the bicycle lane network by forty kilometres over the next "
    "three years. The plan, which will cost an estimated twelve million euros, connects the northern suburbs "
    "to the central station and the university campus. Supporters say the new lanes will reduce traffic "
    "congestion and air pollution, while some shop owners worry that removing parking spaces will hurt their "
    "business. Construction of the first section is expected to begin next spring.";

static void test_default_model(void) {
    if (access(DEFAULT_MODEL, R_OK) != 0) SKIP("%s not present (run scripts/fetch-models.sh)", DEFAULT_MODEL);
    sd_model *m = NULL;
    if (sd_model_load(&m, DEFAULT_MODEL, g_err, sizeof g_err) < 0) {
        CHECK(0, "load: %s", g_err);
        return;
    }
    const sd_tokenizer *tok = sd_model_tokenizer(m);
    sd_model_info info;
    sd_model_get_info(m, &info);
    sd_session *s = new_session(m, 512, 2);
    sd_sampler *smp = greedy_sampler(info.n_vocab);
    sd_drafter *d = new_ngram(3, 8, 4, 16);
    static char user[2048], chat[4096];
    snprintf(user, sizeof user, "Summarize the following paragraph in two sentences, reusing its wording:\n\n%s",
             k_paragraph);
    int cl = sd_chat_format(tok, NULL, user, chat, sizeof chat, g_err, sizeof g_err);
    CHECK(s && smp && d && cl > 0, "setup: %s", g_err);
    if (s && smp && d && cl > 0) {
        static int32_t prompt[1024];
        int np = sd_tokenize(tok, chat, (size_t)cl, 1, 1, prompt, 1024);
        static collect_t a, b;
        sd_gen_stats gs;
        sd_gen_stats st;
        CHECK(run_plain(s, smp, prompt, np, 64, &a, &gs) == 0, "plain: %s", g_err);
        CHECK(run_spec(s, smp, d, prompt, np, 64, 16, &b, &st) == 0, "%s", g_err);
        CHECK(same_tokens(&a, &b), "speculative output differs from plain greedy (%d vs %d tokens)", b.n, a.n);
        printf("  SmolLM2 summary: %d prompt tokens, %d generated; plain %.1f tok/s, n-gram %.1f tok/s, "
               "mean_accepted %.2f (%d of %d drafts)\n",
               np, b.n, gs.tokens_per_second, st.tokens_per_second, st.mean_accepted, st.n_draft_accepted,
               st.n_draft_nodes);
        CHECK(st.mean_accepted > 1.3, "mean_accepted %.2f <= 1.3", st.mean_accepted);
        // The per-step sizing: the same text, about as many tokens per
        // forward from far fewer verified nodes.
        sd_drafter *z = new_sized(3, 16, 4, NULL);
        sd_gen_stats sz;
        CHECK(z && run_spec(s, smp, z, prompt, np, 64, 32, &b, &sz) == 0, "%s", g_err);
        CHECK(same_tokens(&a, &b), "sized: speculative output differs from plain greedy (%d vs %d tokens)", b.n, a.n);
        printf("  sized: n-gram %.1f tok/s, mean_accepted %.2f (%d of %d drafts, %.2f nodes per forward vs %.2f)\n",
               sz.tokens_per_second, sz.mean_accepted, sz.n_draft_accepted, sz.n_draft_nodes,
               1.0 + (double)sz.n_draft_nodes / SD_MAX(1, sz.n_target_forwards),
               1.0 + (double)st.n_draft_nodes / SD_MAX(1, st.n_target_forwards));
        CHECK(sz.mean_accepted > 1.3 && sz.n_draft_nodes < st.n_draft_nodes,
              "sized: mean_accepted %.2f, %d draft nodes (fill: %d)", sz.mean_accepted, sz.n_draft_nodes,
              st.n_draft_nodes);
        sd_drafter_free(z);
    }
    sd_drafter_free(d);
    sd_sampler_free(smp);
    sd_session_free(s);
    sd_model_free(m);
}

int main(void) {
    T_RUN(test_ngram_lookup);
    T_RUN(test_ngram_incremental);
    T_RUN(test_ngram_sized);
    T_RUN(test_ngram_datastore_tree);
    T_RUN(test_greedy_lossless);
    T_RUN(test_sampled);
    T_RUN(test_default_model);
    sd_model_free(g_tgt);
    sd_model_free(g_other);
    T_EXIT();
}

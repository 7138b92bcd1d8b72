// test_race_verify.c - reproducible speculative sampling without a model: a toy
// target and draft (distributions that are functions of the context) drive
// the tree builders and sd_verify_race the way a generation does, and the
// text must equal plain race sampling token for token, for every drafter:
// children ranked under the target's shared noise (chain, widths, dynamic),
// a drafter that does not share the noise (drawn from its own generator,
// top-k, noise of the wrong positions, arbitrary tokens) and any step size.
// A verifier that takes its noise from the node's depth in the tree instead
// of its position in the text must fail the same comparison. Also: the
// race's ranking (the drafter's side) and its agreement with the target.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/race.h"
#include "spec/tree.h"
#include "spec/verify.h"
#include "t.h"

#define NV 16
#define MAXLEN 200

// ------------------------------------------------------------ toy models
static uint64_t hash_ctx(const int32_t *c, int n, uint64_t salt) {
    uint64_t h = 1469598103934665603ull ^ salt;
    for (int i = n > 3 ? n - 3 : 0; i < n; i++) h = (h ^ (uint64_t)(c[i] + 1)) * 1099511628211ull;
    return sd_race_mix(h);
}
// The target after context c: a peaked distribution over NV tokens.
static void toy_target(const int32_t *c, int n, float *p) {
    uint64_t h = hash_ctx(c, n, 7);
    double w[NV], s = 0;
    for (int v = 0; v < NV; v++) {
        double x = (double)((h >> (4 * v)) & 0xf) / 3.0;
        w[v] = exp(x), s += w[v];
    }
    for (int v = 0; v < NV; v++) p[v] = (float)(w[v] / s);
}
// The draft: the target mixed with another function (and a hole), so close
// but not equal.
static void toy_draft(const int32_t *c, int n, float *q) {
    float p[NV];
    toy_target(c, n, p);
    uint64_t h = hash_ctx(c, n, 99);
    double s = 0;
    for (int v = 0; v < NV; v++) {
        double o = (double)((h >> (4 * v)) & 0xf) / 15.0;
        q[v] = (float)(0.7 * p[v] + 0.3 * o / NV * 2.0);
        if (v == (int)(h >> 60)) q[v] = 0.0f;
        s += q[v];
    }
    for (int v = 0; v < NV; v++) q[v] = (float)(q[v] / s);
}

// ------------------------------------------------------------ the loop
enum { D_SHARED_CHAIN, D_SHARED_WIDTHS, D_SHARED_DYN, D_OWN_RNG, D_TOPK, D_DEPTH_NOISE, D_ARBITRARY, N_DRAFTERS };
static const char *k_names[N_DRAFTERS] = {"shared noise, chain", "shared noise, widths", "shared noise, dynamic",
                                          "own generator (WOR)", "top-k",  "noise of the depth",
                                          "arbitrary tokens"};

typedef struct loop_t {
    int32_t text[MAXLEN + 64];
    int n;                // tokens so far
    uint64_t key;
    const sd_tree *tree;
    int depth_verifier;   // 1: the WRONG verifier (noise of the node's depth)
    uint64_t rng;         // the drafter's own generator
} loop_t;

static int node_ctx(const loop_t *L, const sd_tree *t, int node, int32_t *c) {
    int32_t path[64];
    int np = sd_tree_path(t, node, path);
    memcpy(c, L->text, sizeof(int32_t) * (size_t)L->n);
    for (int i = 1; i < np; i++) c[L->n + i - 1] = t->token[path[i]];
    return L->n + np - 1;
}
static int toy_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows, char *err,
                    size_t errlen) {
    (void)err, (void)errlen;
    for (int j = 0; j < n_nodes; j++) {
        int32_t c[MAXLEN + 64];
        toy_draft(c, node_ctx(ud, t, nodes[j], c), rows[j]);
    }
    return 0;
}
static double own_uniform(void *st) {
    loop_t *L = st;
    L->rng = sd_race_mix(L->rng + 0x9E3779B97F4A7C15ull);
    return (double)(L->rng >> 11) * (1.0 / 9007199254740992.0);
}
// The target's draw after node i: position = the text's length + the node's depth.
static int32_t target_draw(void *st, int node) {
    loop_t *L = st;
    int32_t c[MAXLEN + 64];
    float p[NV];
    int n = node_ctx(L, L->tree, node, c);
    toy_target(c, n, p);
    int64_t pos = L->depth_verifier ? L->tree->depth[node] : n;
    return sd_race_draw_row(L->key, pos, p, NV);
}

// Plain race sampling of len tokens after prompt.
static void plain(uint64_t key, const int32_t *prompt, int np, int len, int32_t *out) {
    int32_t c[MAXLEN + 64];
    memcpy(c, prompt, sizeof(int32_t) * (size_t)np);
    for (int n = np; n < np + len; n++) {
        float p[NV];
        toy_target(c, n, p);
        c[n] = sd_race_draw_row(key, n, p, NV);
    }
    memcpy(out, c + np, sizeof(int32_t) * (size_t)len);
}

// Speculative race sampling with drafter kind; step sizes from 1 to 16 nodes
// (a server under changing load). Returns the tokens per step (tau).
static double spec(int kind, int depth_verifier, uint64_t key, const int32_t *prompt, int np, int len, int32_t *out,
                   sd_tree *t, sd_tree *work) {
    static loop_t L;
    memset(&L, 0, sizeof L);
    memcpy(L.text, prompt, sizeof(int32_t) * (size_t)np);
    L.n = np;
    L.key = key;
    L.tree = t;
    L.depth_verifier = depth_verifier;
    L.rng = key ^ 0x1234;
    int steps = 0;
    char err[128];
    while (L.n < np + len) {
        steps++;
        int max_nodes = 1 + (int)((sd_race_mix(key + (uint64_t)steps) >> 40) % 16);
        sd_tree_reset(t, L.text[L.n - 1]);
        sd_tree_race rk = {key, L.n};
        sd_tree_race rk_depth = {key, 1};   // the drafter's noise of the tree depth: wrong, yet lossless
        sd_tree_grow g = {toy_dist, &L, 0, 0.0f, max_nodes, own_uniform, &L, NULL, 0, &rk};
        static const int widths[4] = {3, 2, 2, 1};
        int rc = 0;
        switch (kind) {
        case D_SHARED_CHAIN: rc = sd_tree_grow_chain(t, 5, &g, err, sizeof err); break;
        case D_SHARED_WIDTHS: rc = sd_tree_grow_widths(t, widths, 4, &g, err, sizeof err); break;
        case D_SHARED_DYN: rc = sd_tree_grow_dynamic(t, work, 3, 4, max_nodes, &g, err, sizeof err); break;
        case D_OWN_RNG:
            g.race = NULL, g.sample = 1;
            rc = sd_tree_grow_widths(t, widths, 4, &g, err, sizeof err);
            break;
        case D_TOPK:
            g.race = NULL;
            rc = sd_tree_grow_widths(t, widths, 4, &g, err, sizeof err);
            break;
        case D_DEPTH_NOISE:
            g.race = &rk_depth;
            rc = sd_tree_grow_widths(t, widths, 4, &g, err, sizeof err);
            break;
        case D_ARBITRARY:   // a chain of tokens from the drafter's generator, a sibling beside each
            for (int u = 0; t->n + 2 <= max_nodes;) {
                int a = sd_tree_add(t, u, (int32_t)(own_uniform(&L) * NV), 0.5f);
                sd_tree_add(t, u, (int32_t)(own_uniform(&L) * NV), 0.5f);
                u = a;
            }
            break;
        }
        CHECK(rc == 0, "%s: %s", k_names[kind], err);
        if (rc != 0) return 0;
        int32_t path[64], bonus;
        int n_path;
        CHECK(sd_verify_race(t, target_draw, &L, path, &n_path, &bonus) == 0, "verify");
        for (int k = 1; k < n_path; k++) L.text[L.n++] = t->token[path[k]];
        L.text[L.n++] = bonus;
    }
    memcpy(out, L.text + np, sizeof(int32_t) * (size_t)len);
    return (double)(L.n - np) / steps;
}

static void test_equal_to_plain(void) {
    sd_tree t, work;
    CHECK(sd_tree_init(&t, 64, NV, 64) == 0 && sd_tree_init(&work, 64, NV, 64) == 0, "trees");
    double tau[N_DRAFTERS] = {0};
    int n_runs = 0;
    for (int run = 0; run < 12; run++) {
        uint64_t key = sd_race_key(500 + (uint64_t)run, 0);
        int32_t prompt[8];
        for (int i = 0; i < 8; i++) prompt[i] = (int32_t)((run * 5 + i * 3) % NV);
        int np = 3 + run % 6;
        int32_t ref[MAXLEN], got[MAXLEN + 64];
        plain(key, prompt, np, MAXLEN, ref);
        for (int k = 0; k < N_DRAFTERS; k++) {
            tau[k] += spec(k, 0, key, prompt, np, MAXLEN, got, &t, &work);
            int first = -1;
            for (int i = 0; i < MAXLEN && first < 0; i++)
                if (got[i] != ref[i]) first = i;
            CHECK(first < 0, "%s, run %d: token %d differs from plain race sampling", k_names[k], run, first);
        }
        n_runs++;
    }
    for (int k = 0; k < N_DRAFTERS; k++) printf("  %-24s %.2f tokens per step\n", k_names[k], tau[k] / n_runs);
    // sharing the noise is what makes the drafts agree with the target's draws
    CHECK(tau[D_SHARED_WIDTHS] > tau[D_OWN_RNG] + 0.3 * n_runs, "shared noise %.2f, own generator %.2f",
          tau[D_SHARED_WIDTHS] / n_runs, tau[D_OWN_RNG] / n_runs);
    CHECK(tau[D_SHARED_WIDTHS] > tau[D_DEPTH_NOISE] + 0.3 * n_runs, "shared noise %.2f, noise of the depth %.2f",
          tau[D_SHARED_WIDTHS] / n_runs, tau[D_DEPTH_NOISE] / n_runs);
    sd_tree_free(&t);
    sd_tree_free(&work);
}

// The comparison with plain sampling catches a verifier whose noise follows
// the node's depth in the tree rather than its position in the text.
static void test_depth_noise_detected(void) {
    sd_tree t, work;
    CHECK(sd_tree_init(&t, 64, NV, 64) == 0 && sd_tree_init(&work, 64, NV, 64) == 0, "trees");
    int differ = 0;
    for (int run = 0; run < 4; run++) {
        uint64_t key = sd_race_key(900 + (uint64_t)run, 0);
        int32_t prompt[4] = {1, 2, 3, (int32_t)run};
        int32_t ref[MAXLEN], got[MAXLEN + 64];
        plain(key, prompt, 4, 60, ref);
        spec(D_SHARED_WIDTHS, 1, key, prompt, 4, 60, got, &t, &work);
        differ += memcmp(ref, got, sizeof(int32_t) * 60) != 0;
    }
    printf("  WRONG verifier (noise of the depth): %d of 4 texts differ from plain sampling\n", differ);
    CHECK(differ == 4, "the comparison missed a verifier with noise of the tree depth (%d of 4)", differ);
    sd_tree_free(&t);
    sd_tree_free(&work);
}

// The drafter's ranking: its first is the row's race draw, scores ascend,
// support rows give the same order, and with q == p the draft's first child
// is always the target's draw, with q close to p mostly, with independent
// noise only at the chance rate sum p q.
static void test_rank(void) {
    float p[NV], q[NV];
    int32_t c[3] = {1, 5, 9};
    toy_target(c, 3, p);
    toy_draft(c, 3, q);
    int agree_same = 0, agree_close = 0, agree_indep = 0, ok_order = 1, ok_support = 1;
    enum { N = 20000 };
    const int32_t sup[4] = {2, 5, 6, 11};
    float sp[NV] = {0};
    for (int i = 0; i < 4; i++) sp[sup[i]] = 0.25f * (float)(i + 1);
    for (int i = 0; i < N; i++) {
        uint64_t key = sd_race_key(3, (uint64_t)i);
        int32_t y = sd_race_draw_row(key, 40, p, NV), r[8];
        int m = sd_race_rank(key, 40, p, NULL, NV, 8, r);
        agree_same += m == 8 && r[0] == y;
        const uint64_t pk = sd_race_pos_key(key, 40);
        for (int j = 1; j < m; j++) ok_order &= sd_race_exp(pk, r[j - 1]) / p[r[j - 1]] <= sd_race_exp(pk, r[j]) / p[r[j]];
        agree_close += sd_race_draw_row(key, 40, q, NV) == y;
        agree_indep += sd_race_draw_row(key ^ 1, 40, q, NV) == y;
        int32_t a[4], b[4];
        int ma = sd_race_rank(key, 7, sp, sup, 4, 4, a), mb = sd_race_rank(key, 7, sp, NULL, NV, 4, b);
        ok_support &= ma == 4 && mb == 4 && !memcmp(a, b, sizeof a);
    }
    double chance = 0;
    for (int v = 0; v < NV; v++) chance += (double)p[v] * q[v];
    printf("  first child = target's draw: q = p %.3f, q close %.3f, independent noise %.3f (chance %.3f)\n",
           (double)agree_same / N, (double)agree_close / N, (double)agree_indep / N, chance);
    CHECK(agree_same == N, "q = p: the ranking's first is not the draw (%d of %d)", agree_same, N);
    CHECK(ok_order, "race scores not ascending");
    CHECK(ok_support, "a support list changes the ranking");
    CHECK(agree_close > agree_indep + N / 10, "shared noise %d, independent %d", agree_close, agree_indep);
    CHECK(fabs((double)agree_indep / N - chance) < 0.02, "independent noise agrees %.3f, chance %.3f",
          (double)agree_indep / N, chance);
    int32_t r[4];
    float zero[NV] = {0};
    CHECK(sd_race_rank(1, 1, zero, NULL, NV, 4, r) == 0 && sd_race_draw_row(1, 1, zero, NV) == -1, "empty row");
}

int main(void) {
    T_RUN(test_rank);
    T_RUN(test_equal_to_plain);
    T_RUN(test_depth_noise_detected);
    T_EXIT();
}

// test_verify.c - token trees and verification without a model: exact
// greedy paths, exact acceptance probabilities with scripted randomness, and
// the statistical losslessness test (with deliberately wrong verifiers that
// the same test must reject).
#include <stdint.h>
#include <string.h>

#include "t.h"
#include "spec/tree.h"
#include "spec/verify.h"

// ------------------------------------------------------------ randomness
typedef struct { uint64_t s; } rng_t;
static double rng_uniform(void *st) {
    rng_t *r = st;
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) * (1.0 / 9007199254740992.0);
}
// Scripted uniforms for exact tests.
typedef struct { const double *u; int n, i; } script_t;
static double script_uniform(void *st) {
    script_t *s = st;
    return s->i < s->n ? s->u[s->i++] : 0.5;
}

// ------------------------------------------------------------ fixed rows
#define NV 5
typedef struct { float rows[16][NV]; } rows_t;   // p after node i
static float *rows_get(void *st, int node) { return ((rows_t *)st)->rows[node]; }
static void setrow(float *r, float a, float b, float c, float d, float e) {
    r[0] = a, r[1] = b, r[2] = c, r[3] = d, r[4] = e;
}

static void test_greedy_paths(void) {
    sd_tree t;
    CHECK(sd_tree_init(&t, 16, NV, 0) == 0, "init");
    sd_tree_reset(&t, 0);
    int n1 = sd_tree_add(&t, 0, 1, .5f);   // 1
    int n2 = sd_tree_add(&t, 0, 2, .3f);   // 2
    int n3 = sd_tree_add(&t, n1, 3, .5f);  // 3
    int n4 = sd_tree_add(&t, n1, 4, .5f);  // 4
    sd_tree_add(&t, n2, 3, .5f);           // 5
    int n6 = sd_tree_add(&t, n3, 1, .5f);  // 6
    CHECK(n6 == 6 && t.depth[n6] == 3, "structure");
    int32_t tg[16] = {0}, path[8], bonus;
    int np;
    tg[0] = 1, tg[1] = 4, tg[4] = 0;
    sd_verify_greedy(&t, tg, path, &np, &bonus);
    CHECK(np == 3 && path[0] == 0 && path[1] == n1 && path[2] == n4 && bonus == 0, "np=%d bonus=%d", np, bonus);
    tg[0] = 3;
    sd_verify_greedy(&t, tg, path, &np, &bonus);
    CHECK(np == 1 && bonus == 3, "reject at root: np=%d bonus=%d", np, bonus);
    tg[0] = 1, tg[1] = 3, tg[3] = 1, tg[6] = 2;
    sd_verify_greedy(&t, tg, path, &np, &bonus);
    CHECK(np == 4 && path[3] == n6 && bonus == 2, "deep: np=%d bonus=%d", np, bonus);
    tg[0] = 2, tg[2] = 3, tg[5] = 4;
    sd_verify_greedy(&t, tg, path, &np, &bonus);
    CHECK(np == 3 && path[1] == n2 && path[2] == 5 && bonus == 4, "second branch: np=%d bonus=%d", np, bonus);
    sd_tree_free(&t);
}

// Runs one stochastic verification with scripted uniforms.
static int run_script(const sd_tree *t, rows_t *rows, const double *u, int nu, int32_t *path, int *np,
                      int32_t *bonus) {
    script_t sc = {u, nu, 0};
    float q[NV];
    char err[128];
    rows_t copy = *rows;   // the verifier overwrites rows
    return sd_verify_stochastic(t, rows_get, &copy, script_uniform, &sc, q, path, np, bonus, err, sizeof err);
}

static void test_stochastic_exact(void) {
    sd_tree t;
    CHECK(sd_tree_init(&t, 16, NV, 4) == 0, "init");
    rows_t rows;
    int32_t path[8], bonus;
    int np;
    // Chain (IID, one child): accept 1 with min(1, .3/.6) = .5; residual max(0, p-q) = token 0.
    sd_tree_reset(&t, 0);
    setrow(sd_tree_dist_for(&t, 0), .2f, .6f, .2f, 0, 0);
    t.mode[0] = SD_CHILDREN_IID;
    sd_tree_add(&t, 0, 1, .6f);
    setrow(rows.rows[0], .5f, .3f, .2f, 0, 0);
    setrow(rows.rows[1], 0, 0, 0, 1, 0);
    double a1[] = {0.49, 0.3};
    CHECK(run_script(&t, &rows, a1, 2, path, &np, &bonus) == 0 && np == 2 && bonus == 3, "accept: np=%d bonus=%d", np, bonus);
    double a2[] = {0.51, 0.99};
    CHECK(run_script(&t, &rows, a2, 2, path, &np, &bonus) == 0 && np == 1 && bonus == 0, "reject: np=%d bonus=%d", np, bonus);

    // ANY (top-k style) children 2 then 0, p = (.5 .3 .2): accept 2 w.p. .2;
    // then p' = (.625 .375 0): accept 0 w.p. .625; else token 1.
    sd_tree_reset(&t, 0);
    sd_tree_add(&t, 0, 2, .5f);
    sd_tree_add(&t, 0, 0, .4f);
    setrow(rows.rows[0], .5f, .3f, .2f, 0, 0);
    setrow(rows.rows[1], 0, 0, 0, 0, 1);
    setrow(rows.rows[2], 0, 0, 0, 1, 0);
    double b1[] = {0.19, 0.5};
    CHECK(run_script(&t, &rows, b1, 2, path, &np, &bonus) == 0 && np == 2 && path[1] == 1 && bonus == 4, "any1");
    double b2[] = {0.21, 0.62, 0.5};
    CHECK(run_script(&t, &rows, b2, 3, path, &np, &bonus) == 0 && np == 2 && path[1] == 2 && bonus == 3, "any2");
    double b3[] = {0.21, 0.63, 0.1};
    CHECK(run_script(&t, &rows, b3, 3, path, &np, &bonus) == 0 && np == 1 && bonus == 1, "any3 np=%d bonus=%d", np, bonus);

    // WOR: q = (.5 .25 .25), p = (.1 .5 .4), children 0 then 2.
    // Step 1: accept 0 w.p. .1/.5 = .2. p2 = norm(max(0, p - q)) = (0 .625 .375).
    // Step 2: q2 = (0 .5 .5): accept 2 w.p. .375/.5 = .75. p3 = (0 1 0).
    sd_tree_reset(&t, 0);
    setrow(sd_tree_dist_for(&t, 0), .5f, .25f, .25f, 0, 0);
    t.mode[0] = SD_CHILDREN_WOR;
    sd_tree_add(&t, 0, 0, .5f);
    sd_tree_add(&t, 0, 2, .25f);
    setrow(rows.rows[0], .1f, .5f, .4f, 0, 0);
    double c1[] = {0.19, 0.5};
    CHECK(run_script(&t, &rows, c1, 2, path, &np, &bonus) == 0 && np == 2 && path[1] == 1, "wor1");
    double c2[] = {0.21, 0.74, 0.5};
    CHECK(run_script(&t, &rows, c2, 3, path, &np, &bonus) == 0 && np == 2 && path[1] == 2 && bonus == 3, "wor2");
    double c3[] = {0.21, 0.76, 0.01};
    CHECK(run_script(&t, &rows, c3, 3, path, &np, &bonus) == 0 && np == 1 && bonus == 1, "wor3 np=%d bonus=%d", np, bonus);
    // The same tree read as IID (wrong for these children): step 2 would use q = (.5 .25 .25)
    // and accept 2 w.p. min(1, .375/.25) = 1.
    t.mode[0] = SD_CHILDREN_IID;
    CHECK(run_script(&t, &rows, c3, 3, path, &np, &bonus) == 0 && np == 2 && path[1] == 2, "iid reading differs");
    sd_tree_free(&t);
}

// ------------------------------------------------------------ toy models
// Target and draft: functions from the context (tokens generated so far) to
// a distribution over NV tokens; deliberately different.
static uint64_t hash_ctx(const int32_t *c, int n, uint64_t salt) {
    uint64_t h = 1469598103934665603ull ^ salt;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(c[i] + 1)) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}
static void toy_target(const int32_t *c, int n, float *p) {
    uint64_t h = hash_ctx(c, n, 7);
    double w[NV], s = 0;
    for (int v = 0; v < NV; v++) w[v] = 1.0 + (double)((h >> (8 * v)) & 0xff) / 32.0, s += w[v];
    for (int v = 0; v < NV; v++) p[v] = (float)(0.06 + 0.70 * w[v] / s);
}
static void toy_draft(const int32_t *c, int n, float *q) {
    uint64_t h = hash_ctx(c, n, 99);
    double w[NV], s = 0;
    for (int v = 0; v < NV; v++) {
        w[v] = (double)((h >> (8 * v)) & 0xff) / 16.0;
        w[v] = w[v] * w[v];
        if (v == (int)(h >> 60) % NV) w[v] = 0.0;   // a hole in the draft's support
        s += w[v];
    }
    for (int v = 0; v < NV; v++) q[v] = (float)(w[v] / s);
}

#define LEN 3
typedef struct {
    int32_t seq[LEN + 16];
    int n_seq;
    float prow[64][NV];
} toyctx_t;

// Context of node i: the generated tokens followed by the path below the root.
static int node_ctx(const toyctx_t *tc, const sd_tree *t, int node, int32_t *c) {
    int32_t path[64];
    int np = sd_tree_path(t, node, path);
    int n = 0;
    for (int i = 0; i < tc->n_seq; i++) c[n++] = tc->seq[i];
    for (int i = 1; i < np; i++) c[n++] = t->token[path[i]];
    return n;
}
static int toy_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows,
                    char *err, size_t errlen) {
    (void)err, (void)errlen;
    for (int j = 0; j < n_nodes; j++) {
        int32_t c[64];
        int n = node_ctx(ud, t, nodes[j], c);
        toy_draft(c, n, rows[j]);
    }
    return 0;
}
static const sd_tree *g_cur_tree;
static float *toy_p(void *st, int node) {
    toyctx_t *tc = st;
    int32_t c[64];
    int n = node_ctx(tc, g_cur_tree, node, c);
    toy_target(c, n, tc->prow[node]);
    return tc->prow[node];
}

enum { M_CHAIN, M_IID, M_WOR, M_TOPK, M_DYN, M_MERGE, W_CHAIN_NORESID, W_WOR_AS_IID, W_TOPK_AS_Q };

// Children drawn i.i.d. (with replacement) from the draft: widths per depth.
static void grow_iid(sd_tree *t, toyctx_t *tc, const int *w, int nd, rng_t *r) {
    int lo = 0, hi = 1;
    for (int d = 0; d < nd; d++) {
        int nhi = t->n;
        for (int u = lo; u < hi; u++) {
            float *q = sd_tree_dist_for(t, u);
            int32_t nu = u;
            toy_dist(tc, t, &nu, 1, &q, NULL, 0);
            t->mode[u] = SD_CHILDREN_IID;
            for (int k = 0; k < w[d]; k++) {
                int32_t x = sd_draw_row(q, NV, rng_uniform(r));
                sd_tree_add(t, u, x, q[x]);
            }
        }
        lo = hi, hi = t->n;
        (void)nhi;
    }
}

// Generates LEN tokens with the complete draft -> verify -> accept loop.
static void gen_one(int method, rng_t *r, sd_tree *t, sd_tree *t2, sd_tree *work, int32_t *out) {
    toyctx_t tc;
    tc.n_seq = 0;
    char err[128];
    float q[NV];
    while (tc.n_seq < LEN) {
        sd_tree_reset(t, tc.n_seq ? tc.seq[tc.n_seq - 1] : 0);
        sd_tree_grow g = {toy_dist, &tc, 1, 0.0f, 0, rng_uniform, r, NULL, 0, NULL};
        static const int w32[] = {3, 2}, w22[] = {2, 2}, w1[] = {2, 3};
        switch (method) {
        case M_CHAIN: case W_CHAIN_NORESID: sd_tree_grow_chain(t, 3, &g, err, sizeof err); break;
        case M_IID: grow_iid(t, &tc, w1, 2, r); break;
        case M_WOR: case W_WOR_AS_IID: sd_tree_grow_widths(t, w32, 2, &g, err, sizeof err); break;
        case M_TOPK: case W_TOPK_AS_Q: g.sample = 0; sd_tree_grow_widths(t, w22, 2, &g, err, sizeof err); break;
        case M_DYN: sd_tree_grow_dynamic(t, work, 2, 3, 6, &g, err, sizeof err); break;
        case M_MERGE:
            sd_tree_grow_chain(t, 3, &g, err, sizeof err);
            sd_tree_reset(t2, t->token[0]);
            g.sample = 0;
            sd_tree_grow_widths(t2, w22, 2, &g, err, sizeof err);
            sd_tree_merge(t, t2, NULL);
            break;
        }
        if (method == W_WOR_AS_IID || method == W_TOPK_AS_Q)
            for (int i = 0; i < t->n; i++)
                if (t->dist_row[i] >= 0) t->mode[i] = SD_CHILDREN_IID;
        int32_t path[16], bonus;
        int np;
        g_cur_tree = t;
        if (method == W_CHAIN_NORESID) {
            // Wrong: on rejection, resample from p itself instead of norm(max(0, p - q)).
            int u = 0;
            np = 1;
            for (;;) {
                float *p = toy_p(&tc, u);
                int c = u + 1 < t->n ? u + 1 : -1;
                if (c >= 0) {
                    const float *qq = sd_tree_dist(t, u);
                    int32_t x = t->token[c];
                    if (rng_uniform(r) * qq[x] < p[x]) {
                        u = c;
                        path[np++] = c;
                        continue;
                    }
                }
                bonus = sd_draw_row(p, NV, rng_uniform(r));
                break;
            }
        } else {
            int rc = sd_verify_stochastic(t, toy_p, &tc, rng_uniform, r, q, path, &np, &bonus, err, sizeof err);
            if (rc < 0) {
                printf("  verify failed: %s\n", err);
                exit(1);
            }
        }
        for (int i = 1; i < np && tc.n_seq < LEN; i++) tc.seq[tc.n_seq++] = t->token[path[i]];
        if (tc.n_seq < LEN) tc.seq[tc.n_seq++] = bonus;
    }
    for (int i = 0; i < LEN; i++) out[i] = tc.seq[i];
}

// Chi-square statistic of n_run generated sequences against the exact target
// distribution over all NV^LEN sequences (df = 124).
static double chi_square(int method, int n_run, uint64_t seed, double *tv) {
    enum { NS = NV * NV * NV };
    static double cnt[NS];
    memset(cnt, 0, sizeof cnt);
    sd_tree t, t2, work;
    sd_tree_init(&t, 32, NV, 32);
    sd_tree_init(&t2, 32, NV, 32);
    sd_tree_init(&work, 64, NV, 16);
    rng_t r = {seed};
    for (int k = 0; k < n_run; k++) {
        int32_t s[LEN];
        gen_one(method, &r, &t, &t2, &work, s);
        cnt[(s[0] * NV + s[1]) * NV + s[2]] += 1;
    }
    double chi = 0.0;
    *tv = 0.0;
    for (int a = 0; a < NV; a++)
        for (int b = 0; b < NV; b++)
            for (int c = 0; c < NV; c++) {
                float p0[NV], p1[NV], p2[NV];
                int32_t ctx[2] = {a, b};
                toy_target(ctx, 0, p0);
                toy_target(ctx, 1, p1);
                toy_target(ctx, 2, p2);
                double e = (double)p0[a] * p1[b] * p2[c] * n_run;
                double o = cnt[(a * NV + b) * NV + c];
                chi += (o - e) * (o - e) / e;
                *tv += fabs(o - e) / n_run / 2;
            }
    sd_tree_free(&t);
    sd_tree_free(&t2);
    sd_tree_free(&work);
    return chi;
}

// df = 124: mean 124, sd 15.7; 210 is about 5 sd out (p < 1e-6).
#define CHI_LIMIT 210.0
#define N_RUN 30000

static void check_lossless(int method, const char *name) {
    double tv, chi = chi_square(method, N_RUN, 0x1234567ull + (uint64_t)method, &tv);
    printf("  %-22s chi2 = %8.1f  tv = %.4f  (limit %.0f)\n", name, chi, tv, CHI_LIMIT);
    CHECK(chi < CHI_LIMIT, "%s: chi2 %.1f >= %.0f: output is not distributed as the target", name, chi, CHI_LIMIT);
}
static void check_detected(int method, const char *name) {
    double tv, chi = chi_square(method, N_RUN, 0x7654321ull + (uint64_t)method, &tv);
    printf("  %-22s chi2 = %8.1f  tv = %.4f  (must exceed %.0f)\n", name, chi, tv, CHI_LIMIT);
    CHECK(chi > CHI_LIMIT, "%s: the wrong verifier was not detected (chi2 %.1f)", name, chi);
}

static void test_lossless_chain(void) { check_lossless(M_CHAIN, "chain (iid)"); }
static void test_lossless_tree_iid(void) { check_lossless(M_IID, "tree, iid children"); }
static void test_lossless_tree_wor(void) { check_lossless(M_WOR, "tree, without repl."); }
static void test_lossless_tree_topk(void) { check_lossless(M_TOPK, "tree, top-k"); }
static void test_lossless_dynamic(void) { check_lossless(M_DYN, "dynamic tree"); }
static void test_lossless_merged(void) { check_lossless(M_MERGE, "merged trees"); }
static void test_wrong_no_residual(void) { check_detected(W_CHAIN_NORESID, "WRONG: resample from p"); }
static void test_wrong_wor_as_iid(void) { check_detected(W_WOR_AS_IID, "WRONG: q not renorm."); }
static void test_wrong_topk_as_q(void) { check_detected(W_TOPK_AS_Q, "WRONG: top-k with q"); }

// ------------------------------------------------------------ trees
typedef struct { int calls, nodes; } cnt_t;
// Deterministic draft for shape tests: q(v) = (v + 1 + depth) / sum.
static int shape_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows,
                      char *err, size_t errlen) {
    (void)err, (void)errlen;
    cnt_t *c = ud;
    c->calls++;
    c->nodes += n_nodes;
    for (int j = 0; j < n_nodes; j++) {
        CHECK(t->depth[nodes[j]] == t->depth[nodes[0]], "one depth per call");
        float s = 0;
        for (int v = 0; v < NV; v++) s += rows[j][v] = (float)(v + 1 + t->token[nodes[j]]);
        for (int v = 0; v < NV; v++) rows[j][v] /= s;
    }
    return 0;
}

static void test_tree_builders(void) {
    sd_tree t, w, m;
    char err[128];
    CHECK(sd_tree_init(&t, 64, NV, 64) == 0 && sd_tree_init(&w, 128, NV, 64) == 0 && sd_tree_init(&m, 64, NV, 64) == 0, "init");
    cnt_t c = {0, 0};
    sd_tree_grow g = {shape_dist, &c, 0, 0.0f, 0, NULL, NULL, NULL, 0, NULL};
    // Width vector {3, 2, 1}: 1 + 3 + 6 + 6 nodes, one call per depth.
    sd_tree_reset(&t, 0);
    CHECK(sd_tree_grow_widths(&t, (const int[]){3, 2, 1}, 3, &g, err, sizeof err) == 0, "%s", err);
    CHECK(t.n == 16 && c.calls == 3 && sd_tree_max_depth(&t) == 3, "n=%d calls=%d", t.n, c.calls);
    CHECK(t.token[1] == 4 && t.token[2] == 3 && t.token[3] == 2, "top-k order");
    for (int i = 1; i < t.n; i++) CHECK(t.parent[i] < i, "topological");
    // Capacity: max_nodes 8 cuts the tree.
    g.max_nodes = 8;
    sd_tree_reset(&t, 0);
    sd_tree_grow_widths(&t, (const int[]){3, 2, 1}, 3, &g, err, sizeof err);
    CHECK(t.n == 8, "capped n=%d", t.n);
    g.max_nodes = 0;
    // Chain with p_min: the top probability is 5/15 = .33 at the root, (4+5)/... later.
    sd_tree_reset(&t, 0);
    g.p_min = 0.34f;
    sd_tree_grow_chain(&t, 4, &g, err, sizeof err);
    CHECK(t.n == 1, "p_min stops at the root: n=%d", t.n);
    g.p_min = 0.0f;
    sd_tree_reset(&t, 0);
    sd_tree_grow_chain(&t, 4, &g, err, sizeof err);
    CHECK(t.n == 5 && t.depth[4] == 4, "chain n=%d", t.n);
    // Dynamic tree B=2, D=3, M=6: closed under ancestors, 6 nodes, joints sorted.
    sd_tree_reset(&t, 0);
    c.calls = 0;
    CHECK(sd_tree_grow_dynamic(&t, &w, 2, 3, 6, &g, err, sizeof err) == 0, "%s", err);
    CHECK(t.n == 6 && c.calls == 3 && w.n == 1 + 2 + 4 + 4, "dyn n=%d calls=%d work=%d", t.n, c.calls, w.n);
    for (int i = 1; i < t.n; i++) CHECK(t.parent[i] >= 0 && t.parent[i] < i, "closure");
    // Every dropped work node has a joint <= every kept node's joint... checked via min kept >= max dropped.
    double minkept = 1, maxdrop = 0;
    for (int i = 1; i < t.n; i++) minkept = fmin(minkept, sd_tree_joint(&t, i));
    for (int i = 1; i < w.n; i++) {
        int32_t path[16];
        int np = sd_tree_path(&w, i, path), found = 0;
        for (int j = 1; j < t.n && !found; j++) {
            int32_t pj[16];
            if (sd_tree_path(&t, j, pj) != np) continue;
            found = 1;
            for (int k = 1; k < np; k++) found &= t.token[pj[k]] == w.token[path[k]];
        }
        if (!found) maxdrop = fmax(maxdrop, sd_tree_joint(&w, i));
    }
    CHECK(minkept >= maxdrop, "prune kept the best: %g < %g", minkept, maxdrop);
    // Merge: chain 4-3-2 (wait: top-1 of each) and a width tree share the first branch.
    sd_tree_reset(&t, 0);
    sd_tree_grow_chain(&t, 2, &g, err, sizeof err);          // 0 -> 4 -> 4
    sd_tree_reset(&m, 0);
    sd_tree_add(&m, 0, 4, .5f);
    sd_tree_add(&m, 1, 1, .5f);
    sd_tree_add(&m, 0, 2, .5f);
    int32_t map[8];
    CHECK(sd_tree_merge(&t, &m, map) == 0, "merge");
    CHECK(t.n == 5 && map[1] == 1 && map[2] == 3 && map[3] == 4, "union by path: n=%d", t.n);
    CHECK(t.parent[3] == 1 && t.token[3] == 1 && t.parent[4] == 0, "merged shape");
    sd_tree_reset(&m, 1);
    CHECK(sd_tree_merge(&t, &m, NULL) < 0, "different roots refused");
    sd_tree_free(&t);
    sd_tree_free(&w);
    sd_tree_free(&m);
}

// Rows with mass on a subset of ids only (ties included): growing with that
// subset as g.support gives the same trees as scanning whole rows.
static const int32_t k_sup[] = {1, 2, 4, 7, 8, 11, 13, 14};
static int sparse_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows,
                       char *err, size_t errlen) {
    (void)ud, (void)err, (void)errlen;
    const int ns = (int)(sizeof k_sup / sizeof *k_sup);
    for (int j = 0; j < n_nodes; j++) {
        memset(rows[j], 0, sizeof(float) * (size_t)t->n_vocab);
        float s = 0;
        for (int i = 0; i < ns; i++) s += rows[j][k_sup[i]] = (float)(1 + (i * 5 + t->token[nodes[j]]) % 4);
        for (int i = 0; i < ns; i++) rows[j][k_sup[i]] /= s;
    }
    return 0;
}

static void test_tree_support(void) {
    const int nv = 16;   // the support's largest id is 14
    sd_tree a, b, wa, wb;
    char err[128];
    CHECK(sd_tree_init(&a, 64, nv, 64) == 0 && sd_tree_init(&b, 64, nv, 64) == 0 && sd_tree_init(&wa, 128, nv, 64) == 0 &&
              sd_tree_init(&wb, 128, nv, 64) == 0,
          "init");
    for (int mode = 0; mode < 4; mode++) {
        rng_t ra = {7}, rb = {7};
        sd_tree_grow g = {sparse_dist, NULL, mode == 3, mode == 1 ? 0.2f : 0.0f, 0, rng_uniform, &ra, NULL, 0, NULL};
        sd_tree_grow h = g;
        h.ustate = &rb;
        h.support = k_sup;
        h.n_support = (int)(sizeof k_sup / sizeof *k_sup);
        sd_tree_reset(&a, 3);
        sd_tree_reset(&b, 3);
        int ra_ = mode == 2 ? sd_tree_grow_dynamic(&a, &wa, 3, 3, 10, &g, err, sizeof err)
                            : sd_tree_grow_widths(&a, (const int[]){3, 2, 2}, 3, &g, err, sizeof err);
        int rb_ = mode == 2 ? sd_tree_grow_dynamic(&b, &wb, 3, 3, 10, &h, err, sizeof err)
                            : sd_tree_grow_widths(&b, (const int[]){3, 2, 2}, 3, &h, err, sizeof err);
        CHECK(ra_ == 0 && rb_ == 0, "mode %d: %s", mode, err);
        CHECK(a.n == b.n && a.n > 4, "mode %d: %d vs %d nodes", mode, a.n, b.n);
        for (int i = 0; i < a.n && i < b.n; i++)
            CHECK(a.token[i] == b.token[i] && a.parent[i] == b.parent[i] && a.mode[i] == b.mode[i],
                  "mode %d node %d: token %d/%d parent %d/%d", mode, i, a.token[i], b.token[i], a.parent[i], b.parent[i]);
    }
    sd_tree_free(&a);
    sd_tree_free(&b);
    sd_tree_free(&wa);
    sd_tree_free(&wb);
}

int main(void) {
    T_RUN(test_greedy_paths);
    T_RUN(test_stochastic_exact);
    T_RUN(test_tree_builders);
    T_RUN(test_tree_support);
    T_RUN(test_lossless_chain);
    T_RUN(test_lossless_tree_iid);
    T_RUN(test_lossless_tree_wor);
    T_RUN(test_lossless_tree_topk);
    T_RUN(test_lossless_dynamic);
    T_RUN(test_lossless_merged);
    T_RUN(test_wrong_no_residual);
    T_RUN(test_wrong_wor_as_iid);
    T_RUN(test_wrong_topk_as_q);
    T_EXIT();
}

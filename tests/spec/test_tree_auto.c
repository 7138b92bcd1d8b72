// test_tree_auto.c - acceptance statistics, cost curve, the Sequoia tree
// optimiser and the per-step sizer (src/spec/cost_curve.c, tree_opt.c,
// tree_sizer.c) on cases whose answer is known.
#include <stdint.h>

#include "t.h"
#include "spec/cost_curve.h"
#include "spec/tree_opt.h"
#include "spec/tree_sizer.h"

static sd_tree_opt_ws *ws;

static void flat_curve(sd_cost_curve *c, double ms) {
    sd_cost_curve_init(c);
    sd_cost_curve_set(c, 1, ms);
    sd_cost_curve_set(c, 128, ms);
}

// ---------------------------------------------------------------- brute force
typedef struct {
    const sd_accept_table *t;
    const sd_cost_curve *c;
    int L;
    int32_t parent[8];
    double best_rate;      // over all trees
    double best_value[8];  // per node count, over trees of depth <= L
} brute;

// Value (sum of path probabilities) and depth of the tree parent[0..n).
static double tree_value(const sd_accept_table *t, const int32_t *parent, int n, int *depth_out) {
    double f[8];
    int depth[8], md = 0;
    double v = 1.0;
    f[0] = 1.0;
    depth[0] = 0;
    for (int i = 1; i < n; i++) {
        int rank = 0;
        for (int j = 1; j < i; j++)
            if (parent[j] == parent[i]) rank++;
        depth[i] = depth[parent[i]] + 1;
        f[i] = f[parent[i]] * sd_accept_table_p(t, depth[i], rank);
        v += f[i];
        if (depth[i] > md) md = depth[i];
    }
    *depth_out = md;
    return v;
}

// Enumerates every parent array with parent[i] < i (every ordered tree
// appears, siblings ranked by index).
static void enumerate(brute *b, int i, int n) {
    if (i == n) {
        int depth;
        double v = tree_value(b->t, b->parent, n, &depth);
        if (depth > b->L) return;
        if (v > b->best_value[n]) b->best_value[n] = v;
        double cost = sd_cost_curve_verify_ms(b->c, n) + sd_cost_curve_draft_ms(b->c, n, depth);
        if (v / cost > b->best_rate) b->best_rate = v / cost;
        return;
    }
    for (int p = 0; p < i; p++) {
        b->parent[i] = p;
        enumerate(b, i + 1, n);
    }
}

static void check_against_brute(const sd_accept_table *t, const sd_cost_curve *c, int N, int L, const char *what) {
    brute b;
    memset(&b, 0, sizeof b);
    b.t = t;
    b.c = c;
    b.L = L;
    b.parent[0] = -1;
    for (int n = 1; n <= N; n++) enumerate(&b, 1, n);
    sd_tree_opt_params op = {.max_nodes = N, .max_depth = L, .max_width = SD_TA_MAX_RANK};
    sd_tree_shape s;
    char err[256];
    int rc = sd_tree_opt(ws, t, c, &op, &s, err, sizeof err);
    CHECK(rc == 0, "%s: %s", what, err);
    double rate = s.tokens_per_s / 1000.0;
    CHECK(fabs(rate - b.best_rate) < 1e-9 * b.best_rate, "%s: optimiser rate %.9f, brute force %.9f", what, rate,
          b.best_rate);
    // the reported tree is what it claims to be
    int depth;
    double v = tree_value(t, s.parent, s.n, &depth);
    CHECK(fabs(v - s.expected_tokens) < 1e-12 && depth == s.depth, "%s: shape value %.6f vs %.6f", what, v,
          s.expected_tokens);
    double values[SD_TA_MAX_NODES + 1];
    CHECK(sd_tree_opt_values(ws, t, N, L, SD_TA_MAX_RANK, values) == 0, "%s: values", what);
    for (int n = 1; n <= N; n++)
        CHECK(fabs(values[n] - b.best_value[n]) < 1e-12, "%s: n=%d DP value %.9f, brute force %.9f", what, n,
              values[n], b.best_value[n]);
}

// ---------------------------------------------------------------- cases

static void test_flat_cost_biggest_tree(void) {
    sd_accept_table t;
    double p[] = {0.9, 0.05, 0.02, 0.01};
    sd_accept_table_const(&t, p, 4);
    sd_cost_curve c;
    flat_curve(&c, 10.0);
    sd_tree_opt_params op = {.max_nodes = 24, .max_depth = 30, .max_width = 4};
    sd_tree_shape s;
    char err[256], buf[512];
    CHECK(sd_tree_opt(ws, &t, &c, &op, &s, err, sizeof err) == 0, "%s", err);
    CHECK(s.n == 24, "flat cost should fill the budget, got n=%d", s.n);
    sd_tree_shape_format(&s, buf, sizeof buf);
    printf("  flat cost, p=[0.9,0.05,0.02,0.01], 24 nodes: %s\n", buf);
    // a chain-only table gives the longest chain allowed
    double pc[] = {0.9};
    sd_accept_table_const(&t, pc, 1);
    op.max_depth = 10;
    CHECK(sd_tree_opt(ws, &t, &c, &op, &s, err, sizeof err) == 0, "%s", err);
    int w[SD_TA_MAX_DEPTH], nw = 0;
    CHECK(s.n == 11 && s.depth == 10, "chain: n=%d depth=%d", s.n, s.depth);
    CHECK(sd_tree_shape_widths(&s, w, SD_TA_MAX_DEPTH, &nw) == 1 && nw == 10 && w[0] == 1 && w[9] == 1,
          "chain widths");
    double e = (1 - pow(0.9, 11)) / (1 - 0.9);
    CHECK(fabs(s.expected_tokens - e) < 1e-9, "chain E %.6f, expected %.6f", s.expected_tokens, e);
}

static void test_steep_cost_small_tree(void) {
    sd_accept_table t;
    double p[] = {0.7, 0.15, 0.05};
    sd_accept_table_const(&t, p, 3);
    sd_cost_curve c;
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 10.0);
    sd_cost_curve_set(&c, 64, 640.0); // linear: 10 ms per node, verification saves nothing
    sd_tree_opt_params op = sd_tree_opt_default_params();
    sd_tree_shape s;
    char err[256];
    CHECK(sd_tree_opt(ws, &t, &c, &op, &s, err, sizeof err) == 0, "%s", err);
    CHECK(s.n == 1, "linear cost: no drafting pays, got n=%d", s.n);
    CHECK(fabs(s.speedup - 1.0) < 1e-12, "speedup %.3f", s.speedup);
    // mildly sub-linear: 10 ms + 4 ms per extra node -> a small tree
    sd_cost_curve_set(&c, 64, 10.0 + 4.0 * 63);
    CHECK(sd_tree_opt(ws, &t, &c, &op, &s, err, sizeof err) == 0, "%s", err);
    CHECK(s.n >= 2 && s.n <= 4, "steep cost: small tree expected, got n=%d", s.n);
    // draft cost per depth penalises depth: same curve, flat verification, costly levels
    flat_curve(&c, 10.0);
    sd_cost_curve_set_draft(&c, 0.0, 5.0, 0.0);
    CHECK(sd_tree_opt(ws, &t, &c, &op, &s, err, sizeof err) == 0, "%s", err);
    CHECK(s.depth <= 3, "costly draft levels: shallow tree expected, got depth %d", s.depth);
    char buf[512];
    sd_tree_shape_format(&s, buf, sizeof buf);
    printf("  flat verify, 5 ms per draft level: %s\n", buf);
}

static void test_brute_force(void) {
    sd_accept_table t;
    double p1[] = {0.7, 0.15, 0.05};
    sd_accept_table_const(&t, p1, 3);
    sd_cost_curve c;
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 10.0);
    sd_cost_curve_set(&c, 2, 10.5);
    sd_cost_curve_set(&c, 4, 11.0);
    sd_cost_curve_set(&c, 6, 14.0);
    check_against_brute(&t, &c, 6, 5, "p=[.7,.15,.05]");
    sd_cost_curve_set_draft(&c, 0.5, 0.8, 0.1);
    check_against_brute(&t, &c, 6, 5, "p=[.7,.15,.05] + draft cost");
    check_against_brute(&t, &c, 6, 2, "depth limit 2");
    // depth-dependent table, odd (non-decreasing) ranks
    memset(&t, 0, sizeof t);
    t.n_rank = 3;
    t.n_depth = 3;
    double rows[3][3] = {{0.5, 0.3, 0.1}, {0.2, 0.6, 0.1}, {0.9, 0.05, 0.0}};
    for (int d = 0; d < 3; d++)
        for (int r = 0; r < 3; r++) t.p[d][r] = rows[d][r];
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 5.0);
    sd_cost_curve_set(&c, 3, 5.2);
    sd_cost_curve_set(&c, 5, 7.5);
    sd_cost_curve_set(&c, 7, 8.0);
    check_against_brute(&t, &c, 7, 6, "depth-dependent table");
    flat_curve(&c, 1.0);
    check_against_brute(&t, &c, 7, 6, "depth-dependent, flat");
}

// Sequoia's acceptance model on a shape: at an accepted node, the child of
// rank r is accepted with probability p(depth+1, r) (mutually exclusive), else stop.
static double simulate(const sd_accept_table *t, const sd_tree_shape *s, int trials, uint64_t seed) {
    uint64_t x = seed;
    long total = 0;
    for (int k = 0; k < trials; k++) {
        int u = 0;
        total++;
        for (;;) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            double r = (double)(x >> 11) / 9007199254740992.0;
            int next = -1;
            double acc = 0.0;
            for (int c = u + 1; c < s->n; c++) {
                if (s->parent[c] != u) continue;
                acc += sd_accept_table_p(t, s->depth_of[c], s->rank[c]);
                if (r < acc) {
                    next = c;
                    break;
                }
            }
            if (next < 0) break;
            total++;
            u = next;
        }
    }
    return (double)total / trials;
}

static void test_monte_carlo(void) {
    sd_accept_table t;
    double p[] = {0.6, 0.2, 0.08, 0.04};
    sd_accept_table_const(&t, p, 4);
    sd_tree_shape s;
    char err[256];
    CHECK(sd_tree_opt_fixed(ws, &t, 20, 8, 4, &s, err, sizeof err) == 0, "%s", err);
    int trials = 400000;
    double mc = simulate(&t, &s, trials, 0x9E3779B97F4A7C15ull);
    // the accepted length is at most depth + 1: variance <= (depth+1)^2 / 4
    double tol = 5.0 * (s.depth + 1) / 2.0 / sqrt((double)trials);
    CHECK(fabs(mc - s.expected_tokens) < tol, "Monte Carlo %.4f vs DP %.4f (tol %.4f)", mc, s.expected_tokens, tol);
    printf("  20 nodes, p=[.6,.2,.08,.04]: DP E=%.4f, Monte Carlo %.4f\n", s.expected_tokens, mc);
}

static void test_stats(void) {
    sd_accept_stats st;
    sd_accept_stats_init(&st, 3, 4, 1.0);
    double pr[SD_TA_MAX_RANK];
    sd_accept_stats_probs(&st, 1, pr);
    CHECK(fabs(pr[0] - 0.6) < 1e-12 && fabs(pr[1] - 0.12) < 1e-12 && pr[3] == 0.0, "prior %.3f %.3f", pr[0], pr[1]);
    // root 0 -> {1, 2}, 1 -> {3, 4}, 3 -> {5}; accepted 0 1 4
    int32_t parent[] = {-1, 0, 0, 1, 1, 3};
    int32_t path[] = {0, 1, 4};
    CHECK(sd_accept_stats_update(&st, parent, NULL, 6, path, 3) == 0, "update");
    CHECK(st.tried[0][0] == 1 && st.tried[0][1] == 1 && st.acc[0][0] == 1 && st.acc[0][1] == 0, "depth 1 counts");
    CHECK(st.tried[1][0] == 1 && st.tried[1][1] == 1 && st.acc[1][0] == 0 && st.acc[1][1] == 1, "depth 2 counts");
    CHECK(st.tried[2][0] == 0, "node 4 has no children: nothing at depth 3");
    CHECK(st.tried_all[0] == 2 && st.acc_all[0] == 1 && st.acc_all[1] == 1, "pooled counts");
    // pooled rank 0: (1 + 4 * 0.6) / (2 + 4); depth 1 row: (1 + 8 * pooled) / (1 + 8)
    double pooled0 = (1 + 4 * 0.6) / 6.0, want = (1 + 8 * pooled0) / 9.0;
    sd_accept_stats_probs(&st, 1, pr);
    CHECK(fabs(pr[0] - want) < 1e-12, "estimate %.6f, want %.6f", pr[0], want);
    // bad path: 2 is not a child of 1
    int32_t bad[] = {0, 1, 2};
    CHECK(sd_accept_stats_update(&st, parent, NULL, 6, bad, 3) < 0, "bad path accepted");
    CHECK(st.n_updates == 1, "bad path recorded");

    // decay: two updates with decay 0.5 -> the first counts half
    // (one depth row: the children of node 1 count at rank 0 too, rejected)
    sd_accept_stats_init(&st, 2, 1, 0.5);
    int32_t p1[] = {0, 1};
    int32_t p0[] = {0};
    sd_accept_stats_update(&st, parent, NULL, 6, p1, 2); // rank 0 accepted at depth 1, then 3 and 4 rejected
    sd_accept_stats_update(&st, parent, NULL, 6, p0, 1); // nothing accepted
    CHECK(fabs(st.tried_all[0] - 2.0) < 1e-12 && fabs(st.acc_all[0] - 0.5) < 1e-12, "decay: tried %.3f acc %.3f",
          st.tried_all[0], st.acc_all[0]);
    // many rejections drive the estimate towards 0, many acceptances towards 1
    int32_t star[] = {-1, 0, 0}; // root with two leaf children
    sd_accept_stats_init(&st, 2, 1, 0.95);
    for (int i = 0; i < 400; i++) sd_accept_stats_update(&st, star, NULL, 3, p0, 1);
    sd_accept_stats_probs(&st, 1, pr);
    CHECK(pr[0] < 0.15, "after rejections p0 = %.3f", pr[0]);
    for (int i = 0; i < 400; i++) sd_accept_stats_update(&st, star, NULL, 3, p1, 2);
    sd_accept_stats_probs(&st, 1, pr);
    CHECK(pr[0] > 0.85 && pr[0] + pr[1] <= 1.0 + 1e-12, "after acceptances p0 = %.3f p1 = %.3f", pr[0], pr[1]);

    // rank by p: children added in increasing probability
    sd_accept_stats_init(&st, 2, 1, 1.0);
    st.rank_by_p = 1;
    float pp[] = {1.0f, 0.1f, 0.7f, 0.5f, 0.5f, 0.5f};
    int32_t p2[] = {0, 2};
    sd_accept_stats_update(&st, parent, pp, 6, p2, 2);
    CHECK(st.acc_all[0] == 1 && st.acc_all[1] == 0, "rank by p: node 2 (p .7) is rank 0");

    // the tree wrapper and the table
    sd_tree tr;
    CHECK(sd_tree_init(&tr, 8, 16, 0) == 0, "tree init");
    sd_tree_reset(&tr, 5);
    sd_tree_add(&tr, 0, 1, 0.5f);
    sd_tree_add(&tr, 0, 2, 0.3f);
    sd_tree_add(&tr, 2, 3, 0.9f);
    sd_accept_stats_init(&st, 2, 2, 1.0);
    int32_t p3[] = {0, 2, 3};
    CHECK(sd_accept_stats_update_tree(&st, &tr, p3, 3) == 0, "tree update");
    CHECK(st.acc[0][1] == 1 && st.acc[1][0] == 1, "tree update counts");
    sd_accept_table t;
    sd_accept_stats_table(&st, &t);
    CHECK(t.n_rank == 2 && t.n_depth == 2 && sd_accept_table_p(&t, 5, 0) == t.p[1][0], "table rows");
    sd_tree_free(&tr);
}

static void test_cost_curve(void) {
    sd_cost_curve c;
    sd_cost_curve_init(&c);
    CHECK(sd_cost_curve_verify_ms(&c, 4) == 0.0, "empty curve");
    sd_cost_curve_set(&c, 4, 20.0);
    CHECK(fabs(sd_cost_curve_verify_ms(&c, 8) - 40.0) < 1e-12, "one point scales");
    sd_cost_curve_set(&c, 1, 10.0);
    sd_cost_curve_set(&c, 8, 24.0);
    CHECK(c.n_points == 3 && c.n[0] == 1 && c.n[1] == 4 && c.n[2] == 8, "sorted insert");
    CHECK(fabs(sd_cost_curve_verify_ms(&c, 2) - (10.0 + 10.0 / 3)) < 1e-12, "interpolation");
    CHECK(fabs(sd_cost_curve_verify_ms(&c, 6) - 22.0) < 1e-12, "interpolation 2");
    CHECK(fabs(sd_cost_curve_verify_ms(&c, 12) - 28.0) < 1e-12, "extrapolation");
    CHECK(sd_cost_curve_set(&c, 0, 1.0) < 0, "n = 0 rejected");
    sd_cost_curve_set_draft(&c, 1.0, 2.0, 0.5);
    CHECK(sd_cost_curve_draft_ms(&c, 1, 0) == 0.0 && fabs(sd_cost_curve_draft_ms(&c, 5, 3) - 9.0) < 1e-12,
          "draft cost");
    c.online_weight = 0.1;
    c.n_obs = SD_CC_FAST_OBS;             // past the running mean of the first observations
    sd_cost_curve_observe(&c, 4, 3000.0); // an outlier scales the curve by 10% only
    CHECK(fabs(c.ms[1] - 22.0) < 1e-12 && fabs(c.ms[0] - 11.0) < 1e-12 && fabs(c.ms[2] - 26.4) < 1e-12,
          "observe scales every point: %.3f %.3f %.3f", c.ms[0], c.ms[1], c.ms[2]);
    sd_cost_curve_observe(&c, 6, 1.0);
    CHECK(fabs(c.ms[1] - 19.8) < 1e-12 && c.n_points == 3, "observe scales down, adds no point: %.3f", c.ms[1]);
    // The machine got faster while the sizes in use (2 nodes) were observed
    // and 1 node never was: the cost of drafting one node (verify(2) -
    // verify(1)) keeps its measured share. When only the observed point moved
    // (and the points were then pooled to stay non-decreasing) it became 0.
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 4.45);
    sd_cost_curve_set(&c, 2, 4.90);
    sd_cost_curve_set(&c, 4, 6.40);
    for (int i = 0; i < 400; i++) sd_cost_curve_observe(&c, 2, 3.6);
    const double v1 = sd_cost_curve_verify_ms(&c, 1), v2 = sd_cost_curve_verify_ms(&c, 2);
    CHECK(fabs(v2 - 3.6) < 0.1 && fabs(v2 / v1 - 4.90 / 4.45) < 1e-9, "drift tracked, shape kept: %.3f %.3f", v1, v2);
    // The first observations: a running geometric mean. A drafter timed at a
    // quarter of its real cost is within 20% of it after 8 steps (sign steps
    // of 2% would have taken 70), and one preempted step moves it 2x at most.
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 4.0);
    sd_cost_curve_set_draft(&c, 0.0, 0.2, 0.05);
    for (int i = 0; i < SD_CC_FAST_OBS; i++) sd_cost_curve_observe_draft(&c, 3, 2, 4 * 0.5);
    const double d32 = sd_cost_curve_draft_ms(&c, 3, 2);
    CHECK(d32 > 0.8 * 2.0 && d32 < 2.0 && fabs(c.draft_ms_per_node / c.draft_ms_per_depth - 0.25) < 1e-12,
          "draft cost from 0.5 towards 2.0 ms in %d steps: %.3f", SD_CC_FAST_OBS, d32);
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 4.0);
    sd_cost_curve_observe(&c, 1, 400.0);
    CHECK(fabs(c.ms[0] - 8.0) < 1e-9, "a 100x outlier first: 2x at most: %.3f", c.ms[0]);
    for (int i = 1; i < SD_CC_FAST_OBS; i++) sd_cost_curve_observe(&c, 1, 4.0);
    CHECK(c.ms[0] < 4.8, "and the next observations take it back within 20%%: %.3f", c.ms[0]);
    // the median of noisy observations is tracked despite outliers
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 8, 10.0);
    c.online_weight = 0.02;
    uint64_t x = 12345;
    for (int i = 0; i < 4000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(x >> 11) / 9007199254740992.0;
        sd_cost_curve_observe(&c, 8, u < 0.3 ? 1000.0 : 20.0 + 4.0 * u); // 30% huge outliers, median ~ 21.7
    }
    CHECK(c.ms[0] > 19.0 && c.ms[0] < 25.0, "robust tracking: %.3f", c.ms[0]);
    // pool adjacent violators
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 12.0);
    sd_cost_curve_set(&c, 2, 13.0);
    sd_cost_curve_set(&c, 3, 11.0);
    sd_cost_curve_set(&c, 4, 14.0);
    sd_cost_curve_monotone(&c);
    CHECK(fabs(c.ms[1] - 12.0) < 1e-12 && fabs(c.ms[2] - 12.0) < 1e-12 && c.ms[3] == 14.0, "monotone %.2f %.2f",
          c.ms[1], c.ms[2]);
    // drafter model refinement: proportions kept, scale follows
    sd_cost_curve_init(&c);
    sd_cost_curve_observe_draft(&c, 5, 4, 8.0);
    CHECK(fabs(c.draft_ms_per_depth - 2.0) < 1e-12, "first draft observation: %.3f", c.draft_ms_per_depth);
    sd_cost_curve_set_draft(&c, 1.0, 2.0, 0.5);
    c.online_weight = 0.1;
    c.n_draft_obs = SD_CC_FAST_OBS;
    sd_cost_curve_observe_draft(&c, 5, 3, 100.0);
    CHECK(fabs(c.draft_ms_fixed - 1.1) < 1e-12 && fabs(c.draft_ms_per_depth - 2.2) < 1e-12, "draft scale up");
    sd_cost_curve_observe_draft(&c, 1, 0, 100.0);
    CHECK(fabs(c.draft_ms_fixed - 1.1) < 1e-12, "no drafting: ignored");
    const char *json = "{\"model\": \"x\", \"batches\": [{\"n\": 1, \"ms\": 15.5}, {\"n\": 2, \"ms\": 16.25}, "
                       "{\"n\": 32, \"ms\": 60}], \"ratio_2_over_1\": 1.04}";
    sd_cost_curve_init(&c);
    CHECK(sd_cost_curve_from_json(&c, json) == 3 && c.n[2] == 32 && fabs(c.ms[1] - 16.25) < 1e-12, "json");
    CHECK(sd_cost_curve_from_json(&c, "{}") < 0, "json without batches");
}

static void test_shape_helpers(void) {
    sd_accept_table t;
    double p[] = {0.8, 0.1};
    sd_accept_table_const(&t, p, 2);
    sd_tree_shape s;
    char err[256], buf[512];
    CHECK(sd_tree_opt_fixed(ws, &t, 7, 3, 2, &s, err, sizeof err) == 0, "%s", err);
    for (int i = 1; i < s.n; i++) {
        CHECK(s.parent[i] < i && s.depth_of[i] == s.depth_of[s.parent[i]] + 1, "topological, node %d", i);
        CHECK(i == 1 || s.depth_of[i] >= s.depth_of[i - 1], "breadth-first, node %d", i);
    }
    int n = sd_tree_shape_format(&s, buf, sizeof buf);
    CHECK(n == (int)strlen(buf), "format length");
    printf("  best 7-node tree, p=[.8,.1], depth<=3: %s\n", buf);
    // a complete tree: widths 2,2 on p=[.5,.5] with 7 nodes
    double pe[] = {0.5, 0.45};
    sd_accept_table_const(&t, pe, 2);
    CHECK(sd_tree_opt_fixed(ws, &t, 7, 2, 2, &s, err, sizeof err) == 0, "%s", err);
    int w[SD_TA_MAX_DEPTH], nw;
    CHECK(sd_tree_shape_widths(&s, w, SD_TA_MAX_DEPTH, &nw) == 1 && nw == 2 && w[0] == 2 && w[1] == 2,
          "complete binary tree of depth 2");
    sd_tree_shape_format(&s, buf, sizeof buf);
    CHECK(strstr(buf, "widths 2,2") != NULL, "format: %s", buf);
    CHECK(sd_tree_shape_format(&s, NULL, 0) == (int)strlen(buf), "format size query");
}

// A fake drafter: the distribution over the children of any node puts
// decreasing mass on tokens 10, 11, 12, ... (depends on nothing).
static int fake_dist(void *ud, const sd_tree *t, const int32_t *nodes, int n_nodes, float *const *rows, char *err,
                     size_t errlen) {
    (void)ud;
    (void)nodes;
    (void)err;
    (void)errlen;
    for (int j = 0; j < n_nodes; j++) {
        for (int v = 0; v < t->n_vocab; v++) rows[j][v] = 0.0f;
        rows[j][12] = 0.1f;
        rows[j][10] = 0.5f;
        rows[j][11] = 0.3f;
        rows[j][13] = 0.1f;
        if (ud) rows[j][20] = 0.9f;   // outside the support given with it: a builder must not read it
    }
    return 0;
}

static void test_grow_shape(void) {
    sd_accept_table t;
    double p[] = {0.6, 0.25, 0.1};
    sd_accept_table_const(&t, p, 3);
    sd_tree_shape s;
    char err[256];
    CHECK(sd_tree_opt_fixed(ws, &t, 12, 4, 3, &s, err, sizeof err) == 0, "%s", err);
    sd_tree tr;
    CHECK(sd_tree_init(&tr, 32, 32, 32) == 0, "tree init");
    sd_tree_reset(&tr, 1);
    sd_tree_grow g = {.dist = fake_dist};
    CHECK(sd_tree_grow_shape(&tr, &s, &g, err, sizeof err) == 0, "%s", err);
    CHECK(tr.n == s.n, "grown %d nodes, shape %d", tr.n, s.n);
    for (int i = 1; i < tr.n && i < s.n; i++) {
        CHECK(tr.parent[i] == s.parent[i], "node %d parent %d vs %d", i, tr.parent[i], s.parent[i]);
        CHECK(tr.token[i] == 10 + s.rank[i], "node %d token %d rank %d", i, tr.token[i], s.rank[i]);
    }
    // With a support (a head's draft vocabulary) only its entries are read: the same tree, although
    // the row has its largest entry elsewhere; without it that entry is everyone's first child.
    static const int32_t sup[] = {10, 11, 12, 13};
    int poison = 1;
    sd_tree_grow gs = {.dist = fake_dist, .ud = &poison, .support = sup, .n_support = 4};
    sd_tree_reset(&tr, 1);
    CHECK(sd_tree_grow_shape(&tr, &s, &gs, err, sizeof err) == 0, "%s", err);
    int same = tr.n == s.n;
    for (int i = 1; i < tr.n && i < s.n; i++) same &= tr.token[i] == 10 + s.rank[i];
    CHECK(same, "grow on a support: the tree differs (%d nodes)", tr.n);
    gs.support = NULL;
    sd_tree_reset(&tr, 1);
    CHECK(sd_tree_grow_shape(&tr, &s, &gs, err, sizeof err) == 0 && tr.n > 1 && tr.token[1] == 20,
          "grow without a support reads every entry");
    sd_tree_free(&tr);
}

static void test_bundle(void) {
    sd_tree_auto_params ap = sd_tree_auto_default_params();
    ap.reopt_every = 4;
    sd_tree_auto *a;
    char err[256];
    CHECK(sd_tree_auto_new(&a, &ap, err, sizeof err) == 0, "%s", err);
    CHECK(a->shape.n == 5, "initial chain of 4 drafts, got n=%d", a->shape.n);
    sd_cost_curve_set(&a->cost, 1, 10.0);
    sd_cost_curve_set(&a->cost, 64, 12.0);
    sd_tree tr;
    sd_tree_init(&tr, 8, 16, 0);
    sd_tree_reset(&tr, 1);
    sd_tree_add(&tr, 0, 2, 0.9f);
    sd_tree_add(&tr, 1, 3, 0.9f);
    int32_t path[] = {0, 1, 2};
    int changed = 0;
    for (int i = 0; i < 40; i++) {
        int rc = sd_tree_auto_observe(a, &tr, path, 3, 0.0, 10.5, err, sizeof err);
        CHECK(rc >= 0, "%s", err);
        if (rc > 0) changed = 1;
    }
    CHECK(changed && a->shape.n > 5, "near-flat cost and high acceptance should grow the tree: n=%d", a->shape.n);
    CHECK(a->cost.n_points == 2 && fabs(a->cost.ms[1] / a->cost.ms[0] - 1.2) < 1e-9 && a->cost.ms[0] > 10.0,
          "observed cost of 3 nodes scales the curve (%d points, %.3f %.3f)", a->cost.n_points, a->cost.ms[0],
          a->cost.ms[1]);
    char buf[512];
    sd_tree_shape_format(&a->shape, buf, sizeof buf);
    printf("  bundle after 40 fully accepted chain steps: %s\n", buf);
    sd_tree_free(&tr);
    sd_tree_auto_free(a);
}

// A short text: with a steep cost curve (a tree costs much more than a
// token) and every drafted token rejected, the default bundle (re-chosen
// every 16 steps) stops drafting within the first 8 steps, not at the 16th.
static void test_bundle_early_reopt(void) {
    sd_tree_auto *a;
    char err[256];
    CHECK(sd_tree_auto_new(&a, NULL, err, sizeof err) == 0, "%s", err);
    for (int n = 1; n <= 32; n *= 2) sd_cost_curve_set(&a->cost, n, 10.0 + 3.0 * (n - 1));
    CHECK(sd_tree_auto_optimise(a, err, sizeof err) == 0 && a->shape.n > 1,
          "the prior (0.6 at depth 1) should draft at first: n=%d %s", a->shape.n, err);
    sd_tree tr;
    sd_tree_init(&tr, SD_TA_MAX_NODES, 16, 0);
    int32_t path[] = {0};
    int stopped_at = 0;
    for (int step = 1; step <= 16 && !stopped_at; step++) {
        sd_tree_reset(&tr, 1);
        for (int i = 1; i < a->shape.n; i++) sd_tree_add(&tr, a->shape.parent[i], 2 + i, 0.5f);
        CHECK(sd_tree_auto_observe(a, &tr, path, 1, 0.0, 0.0, err, sizeof err) >= 0, "%s", err);
        if (a->shape.n == 1) stopped_at = step;
    }
    CHECK(stopped_at > 0 && stopped_at <= 8, "every draft rejected: still drafting after step %d (n=%d)",
          stopped_at ? stopped_at : 16, a->shape.n);
    printf("  every draft rejected: no drafting from step %d\n", stopped_at);
    sd_tree_free(&tr);
    sd_tree_auto_free(a);
}

// End to end: acceptance drawn from a known positional vector on the
// bundle's own trees; the estimates converge and the chosen tree is (nearly)
// as fast under the true vector as the true optimum.
static void test_bundle_converges(void) {
    double truth[] = {0.7, 0.15, 0.05};
    sd_accept_table tt;
    sd_accept_table_const(&tt, truth, 3);
    sd_tree_auto_params ap = sd_tree_auto_default_params();
    ap.n_rank = 3;
    ap.n_depth = 1;
    ap.decay = 0.998;
    ap.opt.max_nodes = 32;
    sd_tree_auto *a;
    char err[256];
    CHECK(sd_tree_auto_new(&a, &ap, err, sizeof err) == 0, "%s", err);
    const int cn[] = {1, 4, 8, 16, 32};
    const double cm[] = {10.0, 10.5, 12.0, 16.0, 30.0};
    for (int i = 0; i < 5; i++) sd_cost_curve_set(&a->cost, cn[i], cm[i]);
    CHECK(sd_tree_auto_optimise(a, err, sizeof err) == 0, "%s", err);
    sd_tree tr;
    sd_tree_init(&tr, SD_TA_MAX_NODES, 16, 0);
    uint64_t x = 777;
    int32_t path[SD_TA_MAX_NODES];
    for (int step = 0; step < 3000; step++) {
        const sd_tree_shape *sh = &a->shape;
        sd_tree_reset(&tr, 1);
        for (int i = 1; i < sh->n; i++) sd_tree_add(&tr, sh->parent[i], 2 + i, 0.5f);
        int n_path = 0, u = 0;
        path[n_path++] = 0;
        for (;;) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            double r = (double)(x >> 11) / 9007199254740992.0, acc = 0.0;
            int next = -1;
            for (int c = u + 1; c < sh->n; c++) {
                if (sh->parent[c] != u) continue;
                acc += sd_accept_table_p(&tt, sh->depth_of[c], sh->rank[c]);
                if (r < acc) {
                    next = c;
                    break;
                }
            }
            if (next < 0) break;
            path[n_path++] = next;
            u = next;
        }
        CHECK(sd_tree_auto_observe(a, &tr, path, n_path, 0.0, 0.0, err, sizeof err) >= 0, "%s", err);
    }
    double pr[SD_TA_MAX_RANK];
    sd_accept_stats_probs(&a->stats, 1, pr);
    CHECK(fabs(pr[0] - 0.7) < 0.06, "p0 estimate %.3f", pr[0]);
    sd_tree_shape best;
    sd_tree_opt_params op = ap.opt;
    CHECK(sd_tree_opt(ws, &tt, &a->cost, &op, &best, err, sizeof err) == 0, "%s", err);
    int depth;
    double v = tree_value(&tt, a->shape.parent, a->shape.n, &depth);
    double rate = v / (sd_cost_curve_verify_ms(&a->cost, a->shape.n) + sd_cost_curve_draft_ms(&a->cost, a->shape.n, depth));
    CHECK(rate * 1000.0 > 0.95 * best.tokens_per_s, "learned tree %.1f tok/s, true optimum %.1f", rate * 1000.0,
          best.tokens_per_s);
    char b1[1024], b2[1024];
    sd_tree_shape_format(&a->shape, b1, sizeof b1);
    sd_tree_shape_format(&best, b2, sizeof b2);
    printf("  learned p=[%.3f,%.3f,%.3f]: %s\n  true optimum: %s\n", pr[0], pr[1], pr[2], b1, b2);
    sd_tree_free(&tr);
    sd_tree_auto_free(a);
}

static void test_measure(void) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    FILE *f = fopen(path, "rb");
    if (!f) SKIP("%s not found (run from the repository root)", path);
    fclose(f);
    sd_model *m = NULL;
    sd_session *s = NULL;
    char err[256];
    if (sd_model_load(&m, path, err, sizeof err) < 0) SKIP("cannot load the model: %.120s", err);
    sd_session_params sp = sd_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 12;
    sp.n_threads = 2;
    CHECK(sd_session_new(&s, m, &sp, err, sizeof err) == 0, "%s", err);
    if (s) {
        sd_cost_curve c;
        sd_cost_curve_init(&c);
        int ns[] = {1, 4, 16}; // 16 exceeds the batch limit (12): skipped
        int rc = sd_cost_curve_measure(&c, s, ns, 3, 1, 0.5, err, sizeof err);
        CHECK(rc == 2 && c.n_points == 2 && c.ms[0] > 0 && c.ms[1] > 0, "measure: rc %d %s", rc, rc < 0 ? err : "");
        CHECK(sd_session_n_past(s) == 0, "measure left rows in the cache");
        printf("  measured: n=1 %.2f ms, n=4 %.2f ms\n", c.ms[0], c.ms[1]);
        sd_cost_curve_init(&c);   // in rounds: 3, then more while under 40 ms, 5 at most
        const double t0 = sd_time_ms();
        rc = sd_cost_curve_measure_rounds(&c, s, ns, 3, 3, 5, 40.0, 0.0, err, sizeof err);
        CHECK(rc == 2 && c.ms[0] > 0 && c.ms[1] >= c.ms[0] && sd_session_n_past(s) == 0, "rounds: rc %d %s", rc,
              rc < 0 ? err : "");
        printf("  in rounds: n=1 %.2f ms, n=4 %.2f ms (%.0f ms in all)\n", c.ms[0], c.ms[1], sd_time_ms() - t0);
        // a size above 8 is timed in the first round only: 3 rounds of 1 and 4, one of 12
        int ns2[] = {1, 4, 12};
        sd_cost_curve_init(&c);
        rc = sd_cost_curve_measure_rounds(&c, s, ns2, 3, 3, 3, 0.0, 0.0, err, sizeof err);
        CHECK(rc == 3 && c.n_timed == 7 && c.ms[2] >= c.ms[1] && c.ms[1] >= c.ms[0] && sd_session_n_past(s) == 0,
              "a large size once: rc %d, %d forwards timed, %.2f / %.2f / %.2f ms %s", rc, c.n_timed, c.ms[0],
              c.ms[1], c.ms[2], rc < 0 ? err : "");
    }
    sd_session_free(s);
    sd_model_free(m);
}

// ---------------------------------------------------------------- per-step sizing
static double brute_choose(const sd_cost_curve *c, double rate, const double *f, int m) {
    double best = 1.0 - rate * sd_cost_curve_verify_ms(c, 1), sum = 1.0;
    int bk = 0;
    for (int k = 1; k <= m; k++) {
        sum += f[k - 1];
        double v = sum - rate * sd_cost_curve_verify_ms(c, k + 1);
        if (v > best + 1e-12) best = v, bk = k;
    }
    return bk;
}

static void test_step_sizer(void) {
    sd_cost_curve c;
    sd_step_sizer z;
    // A known optimum: 1 + sum f - (ms of k + 1 nodes) at rate 1 is 0, 0.8,
    // 1.4, 1.9, 1.825, 1.55 for k = 0..5.
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 1.0);
    sd_cost_curve_set(&c, 2, 1.1);
    sd_cost_curve_set(&c, 4, 1.5);
    sd_cost_curve_set(&c, 8, 3.0);
    sd_step_sizer_init(&z, &c);
    double f[] = {0.9, 0.8, 0.7, 0.3, 0.1}, gain = 0;
    CHECK(fabs(sd_step_sizer_rate(&z) - 1.0) < 1e-12, "initial rate %.4f = plain decoding", sd_step_sizer_rate(&z));
    int k = sd_step_sizer_choose(&z, f, 5, &gain);
    CHECK(k == 3 && fabs(gain - 1.9) < 1e-9, "known optimum: k=%d gain %.4f (expected 3, 1.9)", k, gain);
    CHECK(sd_step_sizer_choose(&z, f, 0, NULL) == 0, "no candidates");
    // Flat for small n (2 and 3 nodes cost what 1 does): even weak nodes are
    // taken while free, and not beyond.
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 1.0);
    sd_cost_curve_set(&c, 3, 1.0);
    sd_cost_curve_set(&c, 4, 2.0);
    sd_step_sizer_init(&z, &c);
    double weak[] = {0.05, 0.03, 0.01};
    k = sd_step_sizer_choose(&z, weak, 3, NULL);
    CHECK(k == 2, "flat start: %d weak nodes taken (expected 2)", k);
    // ... and when the second node costs 30% more, a 25% node is not worth it,
    // a 40% one is.
    sd_cost_curve_set(&c, 2, 1.3);
    sd_cost_curve_set(&c, 3, 1.5);
    sd_step_sizer_init(&z, &c);
    double q25[] = {0.25}, q40[] = {0.4};
    CHECK(sd_step_sizer_choose(&z, q25, 1, NULL) == 0 && sd_step_sizer_choose(&z, q40, 1, NULL) == 1,
          "steeper start: 25%% node refused, 40%% taken");
    // Brute force on random curves and candidate lists.
    uint64_t r = 12345;
    int bad = 0;
    for (int it = 0; it < 2000; it++) {
        sd_cost_curve_init(&c);
        double ms = 1.0 + (double)(r % 100) / 50.0;
        for (int n = 1; n <= 32; n *= 2) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ms += (double)((r >> 33) % 1000) / 400.0 * (n > 1);
            sd_cost_curve_set(&c, n, ms);
        }
        sd_step_sizer_init(&z, &c);
        int m = (int)((r >> 20) % 31);
        double ff[32], prev = 1.0;
        for (int i = 0; i < m; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            prev *= (double)((r >> 33) % 1000) / 1000.0;
            ff[i] = prev;
        }
        for (int s = 0; s < (int)(it % 5); s++) sd_step_sizer_observe(&z, 1 + (int)(r >> 40) % 8, 1 + s, -1);
        if (sd_step_sizer_choose(&z, ff, m, NULL) != brute_choose(&z.cost, sd_step_sizer_rate(&z), ff, m)) bad++;
    }
    CHECK(bad == 0, "%d of 2000 random cases differ from brute force", bad);
    // The rate follows what the steps achieve, charged at the curve's ms.
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 2.0);
    sd_cost_curve_set(&c, 4, 3.0);
    sd_cost_curve_set(&c, 32, 10.0);
    sd_step_sizer_init(&z, &c);
    for (int i = 0; i < 400; i++) sd_step_sizer_observe(&z, 4, 3, -1);
    CHECK(fabs(sd_step_sizer_rate(&z) - 1.0) < 1e-6, "rate %.4f tokens/ms (3 tokens per 3 ms)", sd_step_sizer_rate(&z));
    // A measured curve is refined by plausible timings only; the relative curve never.
    for (int i = 0; i < 200; i++) sd_step_sizer_observe(&z, 4, 1, 6.0);
    double c4 = sd_cost_curve_verify_ms(&z.cost, 4);
    CHECK(c4 > 5.0 && c4 < 6.5, "refined towards 6 ms: %.3f", c4);
    for (int i = 0; i < 200; i++) sd_step_sizer_observe(&z, 4, 1, 0.001);
    CHECK(fabs(sd_cost_curve_verify_ms(&z.cost, 4) - c4) < 1e-12, "implausibly fast timings ignored");
    sd_step_sizer_init(&z, NULL);
    CHECK(z.relative && sd_cost_curve_verify_ms(&z.cost, 1) == 1.0 && sd_cost_curve_verify_ms(&z.cost, 2) > 1.0,
          "relative curve");
    for (int i = 0; i < 50; i++) sd_step_sizer_observe(&z, 2, 1, 50.0);
    CHECK(sd_cost_curve_verify_ms(&z.cost, 2) < 2.0, "the relative curve is not refined");

    // Sequoia's optimiser on the same flat-start curve: a free node pays at 25%.
    sd_accept_table t;
    double p25[] = {0.25};
    sd_accept_table_const(&t, p25, 1);
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 4.7);
    sd_cost_curve_set(&c, 2, 4.9);
    sd_cost_curve_set(&c, 4, 5.9);
    sd_cost_curve_set(&c, 8, 8.6);
    sd_tree_opt_params op = sd_tree_opt_default_params();
    sd_tree_shape sh;
    char err[256];
    CHECK(sd_tree_opt(ws, &t, &c, &op, &sh, err, sizeof err) == 0 && sh.n >= 2, "Sequoia, flat start: n=%d", sh.n);
    sd_cost_curve_set(&c, 2, 4.7 * 1.3);
    sd_cost_curve_set(&c, 4, 4.7 * 1.6);
    CHECK(sd_tree_opt(ws, &t, &c, &op, &sh, err, sizeof err) == 0 && sh.n == 1, "Sequoia, +30%% per node: n=%d", sh.n);
}

static void test_class_stats(void) {
    sd_class_stats s;
    double prior[3] = {0.25, 0.6, 0.9};
    sd_class_stats_init(&s, 3, prior, 4.0, 0.9);
    CHECK(fabs(sd_class_stats_p(&s, 0) - 0.25) < 1e-12 && fabs(sd_class_stats_p(&s, 2) - 0.9) < 1e-12,
          "prior at the start");
    CHECK(sd_class_stats_p(&s, 3) == 0.0 && sd_class_stats_p(&s, -1) == 0.0, "unknown class: 0");
    for (int i = 0; i < 200; i++) {   // class 0 always rejected, class 1 accepted 80% at share 0.5
        sd_class_stats_step(&s);
        sd_class_stats_add(&s, 0, 1.0, 0);
        sd_class_stats_add(&s, 1, 0.5, i % 5 != 0);
    }
    double p0 = sd_class_stats_p(&s, 0), p1 = sd_class_stats_p(&s, 1);
    // decay 0.9: 10 effective observations against 4 pseudo-observations
    CHECK(p0 > 0.05 && p0 < 0.09, "always rejected: p %.3f (expected 1/14 = 0.071)", p0);
    CHECK(p1 > 0.99 && p1 <= 0.995, "per unit share: 0.8 / 0.5 capped below 1: %.3f", p1);
    CHECK(fabs(sd_class_stats_p(&s, 2) - 0.9) < 1e-12, "unobserved class keeps its prior");
    sd_class_stats_reset(&s);
    CHECK(fabs(sd_class_stats_p(&s, 0) - 0.25) < 1e-12, "reset");
}

int main(void) {
    char err[256];
    if (sd_tree_opt_ws_new(&ws, err, sizeof err) < 0) {
        printf("FAIL setup: %s\n", err);
        return 1;
    }
    T_RUN(test_flat_cost_biggest_tree);
    T_RUN(test_steep_cost_small_tree);
    T_RUN(test_brute_force);
    T_RUN(test_monte_carlo);
    T_RUN(test_stats);
    T_RUN(test_cost_curve);
    T_RUN(test_shape_helpers);
    T_RUN(test_grow_shape);
    T_RUN(test_bundle);
    T_RUN(test_bundle_converges);
    T_RUN(test_bundle_early_reopt);
    T_RUN(test_measure);
    T_RUN(test_step_sizer);
    T_RUN(test_class_stats);
    sd_tree_opt_ws_free(ws);
    T_EXIT();
}

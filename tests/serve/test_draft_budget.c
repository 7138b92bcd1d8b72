// test_draft_budget.c - the server's draft budget (tools/serve/budget.c): the
// acceptance estimates it keeps per slot, and which draft nodes a round keeps
// on cost curves whose answer is known.
#include <stdint.h>

#include "t.h"
#include "spec/cost_curve.h"
#include "serve/budget.h"

// A CPU-like curve: up to `knee` rows cost what one row costs (the weights
// are read once), then `slope` ms per row.
static void knee_curve(sd_cost_curve *c, double base, int knee, double slope) {
    sd_cost_curve_init(c);
    sd_cost_curve_set(c, 1, base);
    sd_cost_curve_set(c, knee, base);
    sd_cost_curve_set(c, 128, base + slope * (128 - knee));
}

// An estimate that has seen `steps` drafting steps of depth `depth`, which
// accepted depth d in a share p[d - 1] of them (counts, not random draws).
static void feed(sv_accept *a, sv_accept *pool, int steps, int depth, const double *p) {
    sd_gen_stats st;
    memset(&st, 0, sizeof st);
    sv_accept_new_gen(a);
    for (int k = 0; k < steps; k++) {
        for (int d = 1; d <= depth; d++) {
            st.n_depth_proposed[d]++;
            // accepted in a share p of the steps, spread evenly
            if ((int)((k + 1) * p[d - 1] + 1e-9) > (int)(k * p[d - 1] + 1e-9)) st.n_depth_accepted[d]++;
        }
        const sd_step step = {.n_drafted = depth, .draft_ms = 0.01 * depth};
        sv_accept_observe(a, pool, &st, &step);
    }
}

static void test_estimates(void) {
    sv_accept a;
    sv_accept_init(&a);
    // the prior: 0.5 at depth 1, 0.7 times less per level
    CHECK(fabs(sv_accept_estimate(&a, NULL, 1) - 0.5) < 1e-12, "prior %g", sv_accept_estimate(&a, NULL, 1));
    CHECK(fabs(sv_accept_estimate(&a, NULL, 3) - 0.5 * 0.49) < 1e-12, "prior d3 %g", sv_accept_estimate(&a, NULL, 3));
    CHECK(sv_accept_estimate(&a, NULL, 0) == 0 && sv_accept_estimate(&a, NULL, SV_BUDGET_DEPTH + 1) == 0, "out of range");
    const double p[3] = {1.0, 0.5, 0.0};
    feed(&a, NULL, 200, 3, p);
    CHECK(sv_accept_estimate(&a, NULL, 1) > 0.97, "always accepted: %g", sv_accept_estimate(&a, NULL, 1));
    CHECK(fabs(sv_accept_estimate(&a, NULL, 2) - 0.5) < 0.15, "half: %g", sv_accept_estimate(&a, NULL, 2));
    CHECK(sv_accept_estimate(&a, NULL, 3) < 0.05, "never accepted: %g", sv_accept_estimate(&a, NULL, 3));
    CHECK(fabs(a.draft_ms_node - 0.01) < 1e-9, "draft ms per node %g", a.draft_ms_node);
    // a new generation's counters start at 0: what was learnt stays
    sv_accept_new_gen(&a);
    sd_gen_stats st;
    memset(&st, 0, sizeof st);
    const sd_step none = {0};
    sv_accept_observe(&a, NULL, &st, &none);
    CHECK(sv_accept_estimate(&a, NULL, 1) > 0.97, "kept across generations: %g", sv_accept_estimate(&a, NULL, 1));
    // steps that drafted nothing (capped) change nothing
    for (int k = 0; k < 100; k++) sv_accept_observe(&a, NULL, &st, &none);
    CHECK(sv_accept_estimate(&a, NULL, 1) > 0.97, "no drafting, no change: %g", sv_accept_estimate(&a, NULL, 1));
}

static int total(const int *caps, int n) {
    int t = 0;
    for (int i = 0; i < n; i++) t += caps[i];
    return t;
}

static void test_plan(void) {
    enum { N = 16 };
    sd_cost_curve c;
    knee_curve(&c, 4.0, 8, 1.0);
    sv_accept good, poor, sure;
    sv_accept_init(&good);
    sv_accept_init(&poor);
    sv_accept_init(&sure);
    const double pg[4] = {0.7, 0.5, 0.35, 0.25}, pp[4] = {0.3, 0.1, 0.05, 0.02}, ps[4] = {1.0, 1.0, 1.0, 1.0};
    feed(&good, NULL, 300, 4, pg);
    feed(&poor, NULL, 300, 4, pp);
    feed(&sure, NULL, 300, 4, ps);
    const sv_accept *acc[N];
    int max_nodes[N], caps[N];
    void *scratch = malloc(sv_budget_scratch_size(N));
    CHECK(scratch != NULL, "scratch");
    if (!scratch) return;

    // one slot on the flat stretch of the curve (8 rows cost what 1 row
    // costs): it drafts up to the knee, its measured depths and then the
    // prior's (0.12, 0.08, 0.06 at depths 5-7); the 8th draft would cost a
    // whole ms for 0.04 tokens
    acc[0] = &good;
    max_nodes[0] = 12;
    int kept = sv_budget_plan(&c, 1, 1, acc, NULL, max_nodes, scratch, caps);
    CHECK(kept == 7 && caps[0] == 8, "one slot: kept %d, cap %d", kept, caps[0]);

    // sixteen slots, compute-bound (16 rows: 12 ms, 1 ms a row): 1.33 tokens
    // per ms without drafts; a 0.7 node brings 0.7 tokens for 1 ms: none pays
    for (int i = 0; i < N; i++) acc[i] = &good, max_nodes[i] = 5;
    kept = sv_budget_plan(&c, N, N, acc, NULL, max_nodes, scratch, caps);
    CHECK(kept == 0 && total(caps, N) == N, "sixteen good slots: kept %d", kept);

    // four slots (4 rows of the 8 free ones): the sure slot's 4 drafts fill
    // the knee; the poor slots' (0.3) would cost 1 ms each beyond it
    for (int i = 0; i < 4; i++) acc[i] = i == 2 ? &sure : &poor, max_nodes[i] = 5;
    kept = sv_budget_plan(&c, 4, 4, acc, NULL, max_nodes, scratch, caps);
    CHECK(caps[0] == 1 && caps[1] == 1 && caps[3] == 1, "poor slots drafted: %d %d %d", caps[0], caps[1], caps[3]);
    CHECK(caps[2] == 5 && kept == 4, "the sure slot: cap %d, kept %d", caps[2], kept);

    // the caps never exceed a method's nodes; a slot without a drafter gets 1
    max_nodes[2] = 3;
    max_nodes[1] = 1;
    kept = sv_budget_plan(&c, 4, 4, acc, NULL, max_nodes, scratch, caps);
    CHECK(caps[2] <= 3 && caps[1] == 1, "caps %d %d", caps[2], caps[1]);

    // 64 prompt rows riding along put the pass beyond the knee: two slots'
    // steps alone would cost 4 ms (0.5 tokens per ms), every draft now costs
    // 1 ms; the sure slot's (1.0) pay, the good slot's 0.7 after them does
    // not (the prompt rows' 62 ms are not counted against the drafts: with
    // them the 0.7 node would look like 0.7 tokens per ms against 0.03)
    acc[0] = &good;
    acc[1] = &sure;
    max_nodes[0] = max_nodes[1] = 5;
    kept = sv_budget_plan(&c, 2 + 64, 2, acc, NULL, max_nodes, scratch, caps);
    CHECK(caps[0] == 1 && caps[1] == 5, "with 64 prompt rows: caps %d %d", caps[0], caps[1]);

    // no curve: no caps (-1, every cap 0 = the method's own shape)
    sd_cost_curve empty;
    sd_cost_curve_init(&empty);
    kept = sv_budget_plan(&empty, 4, 4, acc, NULL, max_nodes, scratch, caps);
    CHECK(kept == -1 && caps[0] == 0 && caps[3] == 0, "no curve: kept %d caps %d", kept, caps[0]);
    free(scratch);
}

// A slot's few lucky steps do not outrank the pool: 5 steps all accepted,
// among slots whose drafts are accepted 30% of the time.
static void test_pool_shrinks(void) {
    sv_accept pool, lucky, alone;
    sv_accept_init(&pool);
    sv_accept_init(&lucky);
    sv_accept_init(&alone);
    const double p30[1] = {0.3}, p100[1] = {1.0};
    for (int i = 0; i < 8; i++) {
        sv_accept other;
        sv_accept_init(&other);
        feed(&other, &pool, 50, 1, p30);
    }
    feed(&lucky, &pool, 5, 1, p100);
    feed(&alone, NULL, 5, 1, p100);
    const double e_pool = sv_accept_estimate(&pool, NULL, 1), e = sv_accept_estimate(&lucky, &pool, 1);
    const double e_alone = sv_accept_estimate(&alone, NULL, 1);
    CHECK(fabs(e_pool - 0.3) < 0.05, "pool %g", e_pool);
    CHECK(e_alone > 0.8, "alone %g", e_alone);
    CHECK(e > 0.35 && e < 0.55, "shrunk towards the pool: %g (alone %g, pool %g)", e, e_alone, e_pool);
    // a long run of its own does outrank it
    feed(&lucky, &pool, 200, 1, p100);
    CHECK(sv_accept_estimate(&lucky, &pool, 1) > 0.8, "after a long run: %g", sv_accept_estimate(&lucky, &pool, 1));
}

// Drafting that would make the round only ~3% better is not worth the risk:
// one slot, a draft row that costs 0.14 ms on a 4 ms pass, accepted 6-7%.
static void test_margin(void) {
    sd_cost_curve c;
    sd_cost_curve_init(&c);
    sd_cost_curve_set(&c, 1, 4.0);
    sd_cost_curve_set(&c, 2, 4.14);
    sd_cost_curve_set(&c, 128, 4.14 + 126.0);
    sv_accept a;
    sv_accept_init(&a);
    const double p[1] = {0.06};
    feed(&a, NULL, 300, 1, p);
    const sv_accept *acc[1] = {&a};
    int max_nodes[1] = {2}, caps[1];
    void *scratch = malloc(sv_budget_scratch_size(1));
    CHECK(scratch != NULL, "scratch");
    if (!scratch) return;
    const double e = sv_accept_estimate(&a, NULL, 1), gain = (1 + e) / (4.14 + a.draft_ms_node) / (1 / 4.0);
    CHECK(gain > 1.0 && gain < 1.05, "the case: gain %g", gain);
    int kept = sv_budget_plan(&c, 1, 1, acc, NULL, max_nodes, scratch, caps);
    CHECK(kept == 0 && caps[0] == 1, "a %.1f%% gain was taken: kept %d", (gain - 1) * 100, kept);
    // at 30% acceptance the same row pays clearly
    const double p3[1] = {0.3};
    feed(&a, NULL, 300, 1, p3);
    kept = sv_budget_plan(&c, 1, 1, acc, NULL, max_nodes, scratch, caps);
    CHECK(kept == 1 && caps[0] == 2, "30%%: kept %d", kept);
    free(scratch);
}

int main(void) {
    T_RUN(test_estimates);
    T_RUN(test_pool_shrinks);
    T_RUN(test_margin);
    T_RUN(test_plan);
    T_EXIT();
}

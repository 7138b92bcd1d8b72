// budget.c - the draft budget of a round. See budget.h.
#include "serve/budget.h"

#include <stdlib.h>
#include <string.h>

// Each step that drafted weighs its depths' earlier counts by this: about the
// last 100 drafting steps count.
#define SV_ACCEPT_DECAY 0.99
// The prior: SV_ACCEPT_PRIOR_N steps at 0.5 * 0.7^(d - 1).
#define SV_ACCEPT_PRIOR_N 2.0
// A slot's estimate counts the pool's (all slots of the server) as this many
// steps: a slot ranks above the others only after a run of its own that
// says so, not after a lucky few (the best of many noisy estimates is too
// high: measured, per-slot estimates let ngram drafts in whose acceptance
// was half what was expected).
#define SV_ACCEPT_POOL_N 16.0
// Drafting at all must make the round's rate at least this much better:
// the estimates are of the past, the drafts of the future.
#define SV_BUDGET_MARGIN 1.05
// Moving-average weight of a step's drafting time per node.
#define SV_DRAFT_MS_WEIGHT 0.1

void sv_accept_init(sv_accept *a) { memset(a, 0, sizeof *a); }

void sv_accept_new_gen(sv_accept *a) {
    memset(a->seen_prop, 0, sizeof a->seen_prop);
    memset(a->seen_acc, 0, sizeof a->seen_acc);
}

static void add_step(sv_accept *a, const double *dp, const double *da) {
    for (int d = 1; d <= SV_BUDGET_DEPTH; d++) {
        a->prop[d] = a->prop[d] * SV_ACCEPT_DECAY + dp[d];
        a->acc[d] = a->acc[d] * SV_ACCEPT_DECAY + da[d];
    }
}

static void add_draft_ms(sv_accept *a, double per_node) {
    a->draft_ms_node = a->draft_ms_node > 0 ? a->draft_ms_node + SV_DRAFT_MS_WEIGHT * (per_node - a->draft_ms_node)
                                            : per_node;
}

void sv_accept_observe(sv_accept *a, sv_accept *pool, const sd_gen_stats *st, const sd_step *step) {
    if (step->n_drafted > 0) add_draft_ms(a, step->draft_ms / step->n_drafted);
    double dp[SV_BUDGET_DEPTH + 1], da[SV_BUDGET_DEPTH + 1];
    int drafted = 0;
    for (int d = 1; d <= SV_BUDGET_DEPTH; d++) {
        dp[d] = st->n_depth_proposed[d] - a->seen_prop[d];
        da[d] = st->n_depth_accepted[d] - a->seen_acc[d];
        drafted |= dp[d] != 0;
        a->seen_prop[d] = st->n_depth_proposed[d];
        a->seen_acc[d] = st->n_depth_accepted[d];
    }
    if (!drafted) return;
    add_step(a, dp, da);
    if (pool) add_step(pool, dp, da);
}

static double prior(int d) {
    double p = 0.5;
    for (int k = 1; k < d; k++) p *= 0.7;
    return p;
}

double sv_accept_estimate(const sv_accept *a, const sv_accept *pool, int d) {
    if (d < 1 || d > SV_BUDGET_DEPTH) return 0.0;
    const double base = pool ? sv_accept_estimate(pool, NULL, d) : prior(d);
    const double n0 = pool ? SV_ACCEPT_POOL_N : SV_ACCEPT_PRIOR_N;
    return (a->acc[d] + n0 * base) / (a->prop[d] + n0);
}

typedef struct {
    double v;    // expected accepted tokens of the node (non-increasing along a slot's depths)
    double ms;   // its drafting time
    int slot, depth;
} cand;

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    if (a->depth != b->depth) return a->depth - b->depth;
    return a->slot - b->slot;
}

size_t sv_budget_scratch_size(int n) { return (size_t)(n > 0 ? n : 1) * SV_BUDGET_DEPTH * sizeof(cand); }

int sv_budget_plan(const sd_cost_curve *c, int base_rows, int n, const sv_accept *const *acc, const sv_accept *pool,
                   const int *max_nodes, void *scratch, int *caps) {
    cand *cs = scratch;
    int m = 0;
    if (!c || !(sd_cost_curve_ms(c, base_rows) > 0)) { // no curve: the methods' own shapes
        for (int i = 0; i < n; i++) caps[i] = 0;
        return -1;
    }
    for (int i = 0; i < n; i++) {
        caps[i] = 1;
        double run = 1.0;
        const int depth = max_nodes[i] - 1 < SV_BUDGET_DEPTH ? max_nodes[i] - 1 : SV_BUDGET_DEPTH;
        for (int d = 1; d <= depth; d++) {
            const double e = sv_accept_estimate(acc[i], pool, d);
            if (e < run) run = e;   // a node is only reached through its parent
            cs[m++] = (cand){run, acc[i]->draft_ms_node, i, d};
        }
    }
    qsort(cs, (size_t)m, sizeof *cs, cand_cmp);
    // The prefix of the ranking with the most tokens per ms of the slots'
    // work: the prompt rows riding along cost what they cost with or without
    // drafts (counting them would make any draft look cheap beside them), so
    // the rate is taken over the steps' own share, C(n), plus what the drafts
    // add on top of the whole pass.
    const double c_base = sd_cost_curve_ms(c, base_rows), c_steps = sd_cost_curve_ms(c, n);
    double tokens = n, draft_ms = 0, best = tokens / c_steps;
    const double r0 = best;
    int keep = 0;
    for (int k = 0; k < m; k++) {
        tokens += cs[k].v;
        draft_ms += cs[k].ms;
        const double rate = tokens / (c_steps + draft_ms + sd_cost_curve_ms(c, base_rows + k + 1) - c_base);
        if (rate > best) best = rate, keep = k + 1;
    }
    if (best < r0 * SV_BUDGET_MARGIN) keep = 0;
    for (int k = 0; k < keep; k++) caps[cs[k].slot]++;
    return keep;
}

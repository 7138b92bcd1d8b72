// bench_agg.h - the results of `specdec bench`: one method's run on one
// prompt (run_res), their sums over a set of runs (agg), and the figures
// bench reports from those sums (tokens/s, tau, the drafter's cost,
// acceptance by depth), as numbers or JSON.
#ifndef SD_BENCH_AGG_H
#define SD_BENCH_AGG_H

#include <jansson.h>

#define BENCH_DEPTHS 16   // acceptance by depth is kept to this depth

// Result of one method on one prompt.
typedef struct run_res {
    int n_tokens;       // tokens generated
    int n_forwards;     // target forwards after the prompt (spec); n_tokens - 1 for ar
    int n_step_tokens;  // tokens those forwards produced (n_tokens - 1)
    double gen_ms;      // generation time, prompt excluded
    int equal;          // 1: same tokens as ar (greedy only)
    double draft_ms;    // time in the drafter
    int n_draft, n_accepted;                  // draft nodes proposed, accepted
    int dp[BENCH_DEPTHS + 1], da[BENCH_DEPTHS + 1]; // steps reaching / accepting at depth d
} run_res;

// Sums over a set of runs.
typedef struct agg {
    long n_tokens, n_forwards, n_step_tokens;
    double ms, draft_ms;
    long n_draft, n_accepted, dp[BENCH_DEPTHS + 1], da[BENCH_DEPTHS + 1];
    int n_runs, n_equal;
} agg;

void agg_add(agg *a, const run_res *r);
// The drafter's time per drafted node as a fraction of a one-token target
// forward (ar's time per token in the same run); 0 without drafts.
double agg_draft_cost(const agg *a, const agg *ar);
double agg_tps(const agg *a);   // generated tokens per second
double agg_tau(const agg *a);   // tokens per target forward (1 without forwards)
// One aggregate against ar's over the same runs, as JSON; NULL when out of memory.
json_t *agg_json(const agg *a, const agg *ar, int greedy);

#endif

// bench_agg.c - sums of bench runs and the figures reported from them (bench_agg.h).
#include "bench_agg.h"

#include "cli_common.h"

void agg_add(agg *a, const run_res *r) {
    a->n_tokens += r->n_tokens;
    a->n_forwards += r->n_forwards;
    a->n_step_tokens += r->n_step_tokens;
    a->ms += r->gen_ms;
    a->n_runs++;
    a->n_equal += r->equal;
    a->draft_ms += r->draft_ms;
    a->n_draft += r->n_draft;
    a->n_accepted += r->n_accepted;
    for (int d = 1; d <= BENCH_DEPTHS; d++) a->dp[d] += r->dp[d], a->da[d] += r->da[d];
}

double agg_draft_cost(const agg *a, const agg *ar) {
    if (a->n_draft <= 0 || ar->n_tokens <= 0 || ar->ms <= 0) return 0.0;
    return (a->draft_ms / (double)a->n_draft) / (ar->ms / (double)ar->n_tokens);
}

// Acceptance at depth d (accepted / proposed), as a JSON array for d = 1.. the deepest proposed.
static json_t *agg_depth_json(const agg *a) {
    json_t *arr = json_array();
    for (int d = 1; arr && d <= BENCH_DEPTHS && a->dp[d] > 0; d++)
        json_array_append_new(arr, cli_json_num((double)a->da[d] / (double)a->dp[d], 4));
    return arr;
}

double agg_tps(const agg *a) { return a->ms > 0 ? a->n_tokens * 1000.0 / a->ms : 0.0; }
double agg_tau(const agg *a) { return a->n_forwards > 0 ? (double)a->n_step_tokens / a->n_forwards : 1.0; }

json_t *agg_json(const agg *a, const agg *ar, int greedy) {
    const double tps = agg_tps(a), tar = agg_tps(ar);
    return json_pack("{s:o, s:o, s:o, s:o, s:I, s:o, s:I, s:i, s:I, s:I, s:o, s:o, s:o}", "tokens_per_s",
                     cli_json_num(tps, 3), "speedup", cli_json_num(tar > 0 ? tps / tar : 0.0, 4), "tau",
                     cli_json_num(agg_tau(a), 4), "equal_to_ar",
                     greedy ? json_boolean(a->n_equal == a->n_runs) : json_null(), "n_tokens", (json_int_t)a->n_tokens,
                     "time_ms", cli_json_num(a->ms, 3), "n_target_forwards", (json_int_t)a->n_forwards, "n_prompts",
                     a->n_runs, "n_draft_nodes", (json_int_t)a->n_draft, "n_draft_accepted", (json_int_t)a->n_accepted,
                     "draft_ms", cli_json_num(a->draft_ms, 3), "draft_ms_per_node_vs_forward",
                     cli_json_num(agg_draft_cost(a, ar), 4), "acceptance_by_depth", agg_depth_json(a));
}

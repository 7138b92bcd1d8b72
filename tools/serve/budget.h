// budget.h - the draft budget of a round (--draft-budget auto): how many tree
// nodes each slot may draft when several slots share one target pass.
//
// One client alone: a pass of a few rows costs about what one row costs (the
// weights are read once), so drafts are nearly free and the method's own
// shape is used. Many clients: the pass is already compute-bound, every
// draft row costs its share of the pass, and a draft that is rejected slows
// every stream. Each round the scheduler therefore ranks every slot's
// possible draft nodes by their expected accepted tokens (the slot's measured
// acceptance at that depth) and keeps the first m that maximise
//     (n stepping slots + sum of the kept nodes' expectations)
//   / (C(n) + C(base rows + m) - C(base rows) + the nodes' drafting time),
// the tokens per millisecond of the slots' steps (C: the target's cost curve;
// prompt rows in the pass cost the same with or without drafts), provided
// that rate is at least 5% better than without drafts. Lossless either way: a cap only
// limits what the drafter may propose (sd_gen_set_step_limit).
#ifndef SV_BUDGET_H
#define SV_BUDGET_H

#include "specdec_spec.h"

#define SV_BUDGET_DEPTH 32   // deepest draft node ranked (deeper ones are never kept)

// A slot's measured acceptance: decayed counts by depth of the steps that
// drafted, kept across its requests (reset when its drafter changes).
typedef struct sv_accept {
    double prop[SV_BUDGET_DEPTH + 1];   // steps whose tree reached depth d (decayed)
    double acc[SV_BUDGET_DEPTH + 1];    // of those, steps that accepted depth d
    int seen_prop[SV_BUDGET_DEPTH + 1]; // the generation's counters already counted
    int seen_acc[SV_BUDGET_DEPTH + 1];
    double draft_ms_node;               // drafting time per drafted node (moving average), ms
} sv_accept;

// A fresh estimate (a drafter of its own: nothing measured yet).
void sv_accept_init(sv_accept *a);
// A new generation on the slot: its statistics counters start again at 0.
void sv_accept_new_gen(sv_accept *a);
// After a step: the generation's totals st and the step's own figures; the
// step's acceptance also counts in pool (all slots together), unless it is
// NULL (the drafting time stays the slot's own).
void sv_accept_observe(sv_accept *a, sv_accept *pool, const sd_gen_stats *st, const sd_step *step);
// Probability that a draft at depth d (1..SV_BUDGET_DEPTH) is accepted: a's
// decayed counts with the pool's estimate counted as 16 steps (pool NULL: a
// prior of 2 steps at 0.5 * 0.7^(d - 1), which is also the pool's own).
double sv_accept_estimate(const sv_accept *a, const sv_accept *pool, int d);

// Caps (nodes, root included; 1 = no drafting) for the n slots that step
// this round: acc[i] their estimates (with pool's, sv_accept_estimate),
// max_nodes[i] their method's nodes per
// step; base_rows: the pass's rows without drafts (the stepping slots' roots
// and the prompt rows riding along). scratch: room for n * SV_BUDGET_DEPTH
// candidates (sv_budget_scratch_size bytes). Returns the draft nodes kept,
// or -1 (every cap 0: no limit) when c is NULL or has no points.
size_t sv_budget_scratch_size(int n);
int sv_budget_plan(const sd_cost_curve *c, int base_rows, int n, const sv_accept *const *acc, const sv_accept *pool,
                   const int *max_nodes, void *scratch, int *caps);

#endif

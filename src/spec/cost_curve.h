// cost_curve.h - the cost side of tree sizing: ms per target forward against
// the number of tree nodes, interpolated from measured points (measured on a
// session at start-up, given from outside, refined online from timed
// verification forwards), plus a linear model of the drafter's cost. The
// tree optimiser (tree_opt.h) and the per-step sizer (tree_sizer.h) weigh
// expected tokens against it.
//
// None of these functions allocate; none print.
#ifndef SD_COST_CURVE_H
#define SD_COST_CURVE_H

#include <stddef.h>

#include "specdec.h"

#define SD_TA_MAX_NODES 128   // nodes of an optimised tree, root included (and the largest
                              // forward sd_cost_curve_measure times)
#define SD_TA_MAX_POINTS 32   // measured points of a cost curve

typedef struct sd_cost_curve {
    int n_points;                  // measured points in use
    int n[SD_TA_MAX_POINTS];       // node counts (root included), strictly ascending, >= 1
    double ms[SD_TA_MAX_POINTS];   // ms per target forward of n[i] nodes (logits for all)
    double draft_ms_fixed;         // drafter cost per step that drafts anything, ms
    double draft_ms_per_depth;     // drafter cost per tree level (one batched draft forward each), ms
    double draft_ms_per_node;      // drafter cost per draft node, ms
    double online_weight;          // relative step of sd_cost_curve_observe, in [0, 1]; default 0.02
    int n_obs;                     // verification forwards observed (sd_cost_curve_observe)
    int n_draft_obs;               // drafting steps observed (sd_cost_curve_observe_draft)
    int n_timed;                   // forwards timed by the last measurement (warm-up excluded)
} sd_cost_curve;

#define SD_CC_FAST_OBS 8   // observations tracked by a running mean before the sign steps

// An empty curve, drafter costs 0, online_weight 0.02, nothing observed.
void sd_cost_curve_init(sd_cost_curve *c);
// Sets (replaces) the cost of n nodes. Returns 0, or <0 if n < 1, ms < 0 or the curve is full.
int sd_cost_curve_set(sd_cost_curve *c, int n, double ms);
// Sets the drafter's linear cost model (ms).
void sd_cost_curve_set_draft(sd_cost_curve *c, double fixed, double per_depth, double per_node);
// Target ms for a forward of n nodes: piecewise-linear interpolation between
// points; below the first point its value; beyond the last the line through
// the last two points (slope >= 0), or the last point's ms scaled by n /
// n_last when there is one point. 0 for an empty curve.
double sd_cost_curve_verify_ms(const sd_cost_curve *c, int n);
// Drafter ms for a tree of n nodes (root included) and depth: 0 if n <= 1,
// else fixed + per_depth * depth + per_node * (n - 1).
double sd_cost_curve_draft_ms(const sd_cost_curve *c, int n, int depth);
// Online refinement from one timed verification forward of n nodes: the
// whole curve is scaled towards the observation. The first SD_CC_FAST_OBS
// observations make a running geometric mean (the curve's estimate for n
// counting as one; each ratio clamped to [1/4, 4]); after them the step is
// (1 +- online_weight) when the forward took longer / shorter than the curve
// says for n (a sign step: it tracks the median of the observed times, and an
// outlier -- a preempted forward can take 100x longer on a loaded machine --
// moves it by online_weight at most). The curve's shape, the cost of n nodes relative to
// one, stays as measured: the machine's speed drifts by tens of per cent over
// seconds, and moving only the points of the sizes in use (a tree of 2-4
// nodes) made them inconsistent with the size never observed while drafting
// (1 node, not drafting), so that drafting looked free. Nothing happens on an
// empty curve.
void sd_cost_curve_observe(sd_cost_curve *c, int n, double ms);
// Online refinement of the drafter model from one timed drafting step that
// built a tree of n nodes and depth: the three coefficients are scaled
// together towards the observation, as sd_cost_curve_observe scales the curve
// (a running mean over the first SD_CC_FAST_OBS steps, then sign steps; the
// proportions given by sd_cost_curve_set_draft stay). If
// all three are 0, the first observation sets draft_ms_per_depth = ms / depth.
// Steps that drafted nothing (n <= 1) are ignored.
void sd_cost_curve_observe_draft(sd_cost_curve *c, int n, int depth, double ms);
// Measures the curve on session s: after untimed one-token forwards (at
// least 3, until 100 ms have passed: an idle machine's first forwards are
// slow), reps rounds, each timing one forward of a chain of ns[i] arbitrary
// tokens for every ns[i] in turn (values above the session's batch limit, its
// context room or SD_TA_MAX_NODES are skipped), after the committed cache, so
// measure after a typical context. The first size's point is the quantile q
// of its rounds (0.5 = the median; 0 = the minimum, the robust choice on a
// machine shared with other work, where preemption only ever adds time);
// every other size's point is that times the median over rounds of its
// ratio to the first size's time in the same round, which the machine's
// drifting speed hardly moves. The points are then made non-decreasing
// (sd_cost_curve_monotone). Pending rows are dropped (n_past is unchanged)
// but the session's logits are overwritten: call it before evaluating the
// prompt or after its logits were used. ns == NULL uses {1, 2, 3, 4, 6, 8,
// 12, 16, 24, 32}. Returns the number of points set, or <0 with a message.
int sd_cost_curve_measure(sd_cost_curve *c, sd_session *s, const int *ns, int n_ns, int reps, double q,
                          char *err, size_t errlen);
// The same with min_rounds..max_rounds rounds (at most 64): rounds go on after
// min_rounds while the rounds have taken less than budget_ms. Sizes above 8
// (but the first) are timed in the first round only, against the first
// size's median time.
int sd_cost_curve_measure_rounds(sd_cost_curve *c, sd_session *s, const int *ns, int n_ns, int min_rounds,
                                 int max_rounds, double budget_ms, double q, char *err, size_t errlen);
// Makes the points non-decreasing in n (pool-adjacent-violators: a run of
// points that decreases is replaced by its mean), since a forward of more
// nodes never costs less and timing noise must not look like a free lunch.
void sd_cost_curve_monotone(sd_cost_curve *c);
// Parses the JSON that `specdec bench-forward --json` prints (the "batches"
// array of {"n": N, "ms": MS}) and sets its points. Returns the number set, or <0.
int sd_cost_curve_from_json(sd_cost_curve *c, const char *json);

#endif

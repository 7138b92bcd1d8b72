// tree_auto.h - hardware-aware tree sizing (after Sequoia, arXiv 2402.12374).
//
// Three parts, usable separately or through the sd_tree_auto bundle below
// (and a fourth, the per-step sizer, for drafters whose evidence varies from
// step to step; see "4. per-step sizing"):
//
//  1. sd_accept_stats: how often the child of sibling rank r at depth d was
//     accepted given that its parent was accepted (Sequoia's positional
//     acceptance vector p_r, here optionally per depth), with Beta-style
//     pseudo-counts so early estimates are sane and exponential decay so the
//     estimate follows the text.
//  2. sd_cost_curve: ms per target forward against the number of tree nodes,
//     interpolated from measured points (measured on a session at start-up,
//     given from outside, refined online from timed verification forwards),
//     plus a linear model of the drafter's cost.
//  3. sd_tree_opt: Sequoia's dynamic program. Under the positional-acceptance
//     assumption the expected number of tokens a step emits (accepted drafts +
//     the bonus token) is the sum over the tree's nodes of the probability that
//     the root-to-node path is accepted = the product of p[depth][rank] along
//     the path (the root counts 1). For every node budget n and depth limit L
//     the DP finds the tree of greatest expected length; the optimiser returns
//     the (n, L) tree maximising expected tokens per second,
//     E[tokens] / (draft_ms(tree) + verify_ms(n)).
//
// Sibling rank. A node's children are ranked in the order they were added to
// the tree (lower index = lower rank). This assumes drafters add children in
// decreasing draft probability, which holds for the top-k builders of tree.c
// (top_k sorts descending) and, in Sequoia's sense, for children drawn one
// after another without replacement (rank = draw order). Merged trees
// (sd_tree_merge) do not satisfy it; for them set rank_by_p, which ranks
// siblings by their draft probability p (descending, ties by index).
//
// None of these functions allocate except sd_tree_auto_new and
// sd_tree_opt_ws_new; none print.
//
// Usage (the bundle):
//
//   sd_tree_auto *ta;  sd_tree_auto_params tp = sd_tree_auto_default_params();
//   tp.opt.max_nodes = max_nodes;                       // <= session n_batch and tree cap
//   sd_tree_auto_new(&ta, &tp, err, sizeof err);
//   sd_cost_curve_measure(&ta->cost, target_session, NULL, 0, 5, 0.5, err, sizeof err); // ~0.5 s
//   sd_cost_curve_set_draft(&ta->cost, fixed_ms, ms_per_level, ms_per_node);
//   sd_tree_auto_optimise(ta, err, sizeof err);       // ta->shape = the tree to draft
//   loop:  drafter: sd_tree_grow_shape(tree, &ta->shape, &grow, err, sizeof err);
//          target forward of tree->n nodes, timed -> verify_ms; verify -> path
//          sd_tree_auto_observe(ta, tree, path, n_path, draft_ms, verify_ms, err, sizeof err);
//   sd_tree_auto_free(ta);
#ifndef SD_TREE_AUTO_H
#define SD_TREE_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "spec/tree.h"

#define SD_TA_MAX_RANK 8      // sibling ranks tracked / used by the optimiser
#define SD_TA_MAX_DEPTH 32    // draft depths (root excluded) tracked / searched
#define SD_TA_MAX_NODES 128   // nodes of an optimised tree, root included
#define SD_TA_MAX_POINTS 32   // measured points of a cost curve

// ---------------------------------------------------------------- 1. acceptance statistics
typedef struct sd_accept_stats {
    int n_rank;         // ranks tracked, 1..SD_TA_MAX_RANK; children of rank >= n_rank are ignored
    int n_depth;        // depth rows, 1..SD_TA_MAX_DEPTH; row d-1 holds depth d, depths >= n_depth share
                        // the last row; 1 = one positional vector for all depths (Sequoia's assumption)
    int rank_by_p;      // 0: rank = order of addition among siblings; 1: rank by draft probability p
    double decay;       // factor applied to all counts before each update, in (0, 1]; 1 = no forgetting
                        // (effective window ~ 1 / (1 - decay) verification steps)
    double prior_mean[SD_TA_MAX_RANK];  // prior acceptance probability per rank
    double prior_strength;              // pseudo-observations behind prior_mean (Beta(a, b) with
                                        // a + b = prior_strength) for the pooled estimate
    double depth_strength;              // pseudo-observations pulling a depth row towards the pooled
                                        // estimate (hierarchical prior)
    double tried[SD_TA_MAX_DEPTH][SD_TA_MAX_RANK];  // decayed count: child (depth, rank) present below an accepted parent
    double acc[SD_TA_MAX_DEPTH][SD_TA_MAX_RANK];    // decayed count: ... and it was the accepted child
    double tried_all[SD_TA_MAX_RANK];               // the same pooled over depths
    double acc_all[SD_TA_MAX_RANK];
    long n_updates;     // update calls since init/reset
} sd_accept_stats;

// Defaults: n_rank 4, n_depth 8, order ranks, decay 0.99, prior means
// 0.6, 0.12, 0.05, 0.02 (then 0.01), prior_strength 4, depth_strength 8.
// n_rank / n_depth outside their ranges are clamped.
void sd_accept_stats_init(sd_accept_stats *st, int n_rank, int n_depth, double decay);
// Clears the counts (keeps the configuration and the prior).
void sd_accept_stats_reset(sd_accept_stats *st);
// Records one verification step. parent (n entries, parent[0] = -1, parent[i]
// < i) is the verified tree; p its draft probabilities (only read when
// rank_by_p; may be NULL otherwise); path[0..n_path) the accepted node
// indices, path[0] == 0 (the root), each the child of the previous. For
// every path node, each of its children counts as tried at (its depth, its
// rank), and the next path node as accepted. Returns 0, or <0 (nothing
// recorded) if the path is not a root-to-node chain of the tree.
int sd_accept_stats_update(sd_accept_stats *st, const int32_t *parent, const float *p, int n,
                           const int32_t *path, int n_path);
// The same from an sd_tree (parent = t->parent, p = t->p).
int sd_accept_stats_update_tree(sd_accept_stats *st, const sd_tree *t, const int32_t *path, int n_path);
// Estimated p for the children of rank 0..n_rank-1 at depth (>= 1) into
// out[SD_TA_MAX_RANK] (entries >= n_rank are 0). The estimates of one depth
// are scaled down if they sum above 1 (at most one sibling is accepted).
void sd_accept_stats_probs(const sd_accept_stats *st, int depth, double *out);

// The acceptance table the optimiser reads.
typedef struct sd_accept_table {
    int n_rank;                                 // ranks used, 1..SD_TA_MAX_RANK
    int n_depth;                                // rows, 1..SD_TA_MAX_DEPTH; depths beyond use the last row
    double p[SD_TA_MAX_DEPTH][SD_TA_MAX_RANK];  // p[d-1][r]: P(child of rank r at depth d accepted | parent accepted)
} sd_accept_table;

// Fills a one-row table from a positional vector p[0..n_rank).
void sd_accept_table_const(sd_accept_table *t, const double *p, int n_rank);
// Fills t from the statistics' current estimates.
void sd_accept_stats_table(const sd_accept_stats *st, sd_accept_table *t);
// p of (depth >= 1, rank) with the clamping rules above (0 beyond n_rank).
double sd_accept_table_p(const sd_accept_table *t, int depth, int rank);

// ---------------------------------------------------------------- 2. cost model
typedef struct sd_cost_curve {
    int n_points;                  // measured points in use
    int n[SD_TA_MAX_POINTS];       // node counts (root included), strictly ascending, >= 1
    double ms[SD_TA_MAX_POINTS];   // ms per target forward of n[i] nodes (logits for all)
    double draft_ms_fixed;         // drafter cost per step that drafts anything, ms
    double draft_ms_per_depth;     // drafter cost per tree level (one batched draft forward each), ms
    double draft_ms_per_node;      // drafter cost per draft node, ms
    double online_weight;          // relative step of sd_cost_curve_observe, in [0, 1]; default 0.02
} sd_cost_curve;

// An empty curve, drafter costs 0, online_weight 0.02.
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
// Online refinement from one timed verification forward of n nodes. The
// update is robust to outliers (a preempted forward can take 100x longer on a
// loaded machine): the estimate moves by online_weight * estimate towards the
// observation (a sign step, which tracks the median of the observed times,
// each step at most online_weight relative). A measured n moves its own
// point; an unmeasured n becomes a new point (its observation as the value)
// while there is room, otherwise its two bracketing points move, split by
// the interpolation weights. The points are then made non-decreasing.
void sd_cost_curve_observe(sd_cost_curve *c, int n, double ms);
// Online refinement of the drafter model from one timed drafting step that
// built a tree of n nodes and depth: the three coefficients are scaled
// together by (1 +- online_weight) towards the observation (a sign step, robust
// to outliers; the proportions given by sd_cost_curve_set_draft stay). If
// all three are 0, the first observation sets draft_ms_per_depth = ms / depth.
// Steps that drafted nothing (n <= 1) are ignored.
void sd_cost_curve_observe_draft(sd_cost_curve *c, int n, int depth, double ms);
// Measures the curve on session s: for each ns[i] (any order; values above
// the session's batch limit, its context room or SD_TA_MAX_NODES are
// skipped) one warm-up and reps timed forwards of a chain of ns[i] arbitrary
// tokens after the committed cache (so measure after a typical context);
// the quantile q of the reps becomes the point (0.5 = the median; 0 = the
// minimum, the robust choice on a machine shared with other work, where
// preemption only ever adds time). The points are then made non-decreasing
// (sd_cost_curve_monotone). Pending rows are dropped (n_past is unchanged)
// but the session's logits are overwritten: call it before evaluating the
// prompt or after its logits were used. ns == NULL uses {1, 2, 3, 4, 6, 8,
// 12, 16, 24, 32}. Returns the number of points set, or <0 with a message.
int sd_cost_curve_measure(sd_cost_curve *c, sd_session *s, const int *ns, int n_ns, int reps, double q,
                          char *err, size_t errlen);
// Makes the points non-decreasing in n (pool-adjacent-violators: a run of
// points that decreases is replaced by its mean), since a forward of more
// nodes never costs less and timing noise must not look like a free lunch.
void sd_cost_curve_monotone(sd_cost_curve *c);
// Parses the JSON that `specdec bench-forward --json` prints (the "batches"
// array of {"n": N, "ms": MS}) and sets its points. Returns the number set, or <0.
int sd_cost_curve_from_json(sd_cost_curve *c, const char *json);

// ---------------------------------------------------------------- 3. optimiser
typedef struct sd_tree_shape {
    int n;                              // nodes, root included (1 = no drafting)
    int depth;                          // deepest node's depth
    int32_t parent[SD_TA_MAX_NODES];    // (n) parent node, -1 for the root; breadth-first order:
                                        // by depth, then parent, then rank (so parent[i] < i)
    int32_t rank[SD_TA_MAX_NODES];      // (n) sibling rank (0 = the drafter's top choice), 0 for the root
    int32_t depth_of[SD_TA_MAX_NODES];  // (n) depth, 0 for the root
    double f[SD_TA_MAX_NODES];          // (n) probability that the path to node i is accepted
    double expected_tokens;             // sum of f: E[accepted drafts] + 1 (the bonus)
    double cost_ms;                     // draft_ms + verify_ms of this tree
    double tokens_per_s;                // expected_tokens / cost_ms * 1000
    double speedup;                     // tokens_per_s over plain decoding (1 / verify_ms(1))
} sd_tree_shape;

typedef struct sd_tree_opt_params {
    int max_nodes;   // most nodes, root included, 1..SD_TA_MAX_NODES; default 64
    int max_depth;   // most draft depth, 0..SD_TA_MAX_DEPTH; default 12
    int max_width;   // most children per node, 1..SD_TA_MAX_RANK (and <= the table's n_rank); default 8
} sd_tree_opt_params;

sd_tree_opt_params sd_tree_opt_default_params(void);

typedef struct sd_tree_opt_ws sd_tree_opt_ws;  // DP tables, sized for the SD_TA_MAX_* limits (~0.5 MB)
int sd_tree_opt_ws_new(sd_tree_opt_ws **out, char *err, size_t errlen);
void sd_tree_opt_ws_free(sd_tree_opt_ws *ws);

// Best expected length per node budget: for the depth limit L, fills
// value[n] (n = 0..max_nodes, value[0] = 0) with the largest expected number
// of tokens (sum of path probabilities, root = 1) of a tree of at most n
// nodes and depth <= L under table t. Returns 0 or <0 on bad parameters.
int sd_tree_opt_values(sd_tree_opt_ws *ws, const sd_accept_table *t, int max_nodes, int L, int max_width,
                       double *value);
// The optimiser: over every depth limit L <= max_depth and budget n <=
// max_nodes, the tree maximising expected tokens per second under the cost
// curve (verify_ms + draft_ms of the tree actually built, which may use
// fewer than n nodes when extra nodes add nothing). Ties go to the smaller
// tree. The curve must have at least one point. Cost: about max_depth *
// width * max_nodes^2 / 2 multiply-adds for a one-row (depth-independent)
// table, max_depth times that for a per-depth table (width = min(max_width,
// table n_rank)); ~1 ms at the defaults. Returns 0 (out filled) or <0 with a
// message.
int sd_tree_opt(sd_tree_opt_ws *ws, const sd_accept_table *t, const sd_cost_curve *c,
                const sd_tree_opt_params *p, sd_tree_shape *out, char *err, size_t errlen);
// The best tree for a fixed budget n and depth limit L (no cost model;
// cost_ms, tokens_per_s and speedup are 0).
int sd_tree_opt_fixed(sd_tree_opt_ws *ws, const sd_accept_table *t, int n, int L, int max_width,
                      sd_tree_shape *out, char *err, size_t errlen);

// Width vector of a shape: widths[d] = the most children of a node at depth
// d, for d < depth (*n_widths = depth). Returns 1 if the shape is exactly
// "complete-like" (every node at depth d < depth has widths[d] children, so
// sd_tree_grow_widths(widths) builds this shape), 0 if the widths only
// bound it (grow with widths and max_nodes = shape->n: the capacity cut then
// drops the least likely nodes of the deepest levels, approximately the
// shape). max: room in widths (>= depth, else <0).
int sd_tree_shape_widths(const sd_tree_shape *s, int *widths, int max, int *n_widths);
// Compact text: "n=12 depth=5 E=3.41 tok/s=201.3 widths 3,2,1,1,1" for a
// complete-like shape, else "n=12 depth=5 ... parents 0,0,0,1,1,2,...". Returns
// the length that was needed (as snprintf).
int sd_tree_shape_format(const sd_tree_shape *s, char *buf, size_t len);

// Builds the shape with a drafter's distributions (sd_tree_grow's dist
// callback, ud; g->sample, p_min and max_nodes are ignored): level by level,
// one dist call per depth for the nodes that have children in the shape;
// each gets the top-k tokens of its distribution (descending, so tree order
// = rank order), k = its children in the shape. The tree must hold only the
// root and have room for the shape's nodes and a dist row per expanded node.
// Nodes whose distribution has fewer than k positive tokens get fewer
// children (and their missing subtrees are skipped). Children are
// SD_CHILDREN_ANY. Returns 0 or <0 with a message.
int sd_tree_grow_shape(sd_tree *t, const sd_tree_shape *s, const sd_tree_grow *g, char *err, size_t errlen);

// ---------------------------------------------------------------- 4. per-step sizing
// Sequoia's tree (part 3) is one shape for every step, right when every step
// has about the same evidence (a draft model's distribution). A drafter whose
// evidence varies from step to step (n-gram lookup: a 20-token copy of the
// prompt in one step, a single 1-gram hit in the next) does better to size
// each step's tree itself: it scores every candidate node with the
// probability f that the path to it is accepted, and the sizer keeps the
// k best (f descending, a list closed under ancestors) where k maximises
//
//     1 + f_1 + ... + f_k  -  rate * verify_ms(k + 1)
//
// rate being the running tokens per ms of the generation itself. This is the
// per-step form of "maximise E[tokens] / E[ms]": a node is worth verifying
// when its expected tokens pay for its extra forward time at the rate the
// generation achieves anyway (renewal-reward: the long-run optimum of the
// ratio makes every step maximise tokens - rate * ms). Both inputs are
// measured: the target's cost curve (part 2; flat parts such as verify_ms(2)
// ~ verify_ms(1) make small drafts almost free, and the rule takes them) and
// the acceptance of each kind of evidence (sd_class_stats below).

#define SD_SZ_MAX_CLASS 32   // evidence classes of sd_class_stats

// Acceptance per evidence class: the drafter puts each proposed node in a
// class (for n-gram lookup: the length of the matched context) and predicts
// P(accepted | parent accepted) = p(class) * share, share in (0, 1] being the
// node's part of the evidence among its siblings. After verification every
// child of an accepted node is an observation: tried += share, acc += 1 if
// it was the accepted child, so p(class) estimates acceptance per unit of
// share. Beta-style prior per class, exponential forgetting.
typedef struct sd_class_stats {
    int n_class;                          // classes in use, 1..SD_SZ_MAX_CLASS
    double prior_mean[SD_SZ_MAX_CLASS];   // prior acceptance per class, in [0, 1)
    double prior_strength;                // pseudo-observations behind prior_mean (> 0)
    double decay;                         // factor applied to the counts before each step's update, (0, 1]
    double tried[SD_SZ_MAX_CLASS];        // decayed sum of shares of the observed nodes
    double acc[SD_SZ_MAX_CLASS];          // decayed count of accepted observed nodes
} sd_class_stats;

// n_class clamped to 1..SD_SZ_MAX_CLASS; prior_mean (n_class entries; NULL = 0.5
// each) clamped to [0, 0.99]; strength <= 0 -> 4; decay outside (0, 1] -> 1.
void sd_class_stats_init(sd_class_stats *s, int n_class, const double *prior_mean, double strength,
                         double decay);
// Clears the observations (keeps the prior).
void sd_class_stats_reset(sd_class_stats *s);
// Estimated acceptance per unit share of class c (0 for c outside the
// classes); always < 1.
double sd_class_stats_p(const sd_class_stats *s, int c);
// Applies the decay once (call once per verified step, before its observations).
void sd_class_stats_step(sd_class_stats *s);
// One observation: a node of class c with share in (0, 1] was tried below an
// accepted parent; accepted = 1 if it was the accepted child.
void sd_class_stats_add(sd_class_stats *s, int c, double share, int accepted);

typedef struct sd_step_sizer {
    sd_cost_curve cost;  // the target's ms per forward against nodes (a copy); when relative,
                         // a typical shape in units of one plain forward
    int relative;        // 1: cost is the built-in relative curve (no measured curve was given;
                         // never refined from timings, whose units differ)
    double decay;        // forgetting of the rate sums per step, (0, 1]; default 0.95
    double tok_sum;      // decayed tokens emitted (accepted drafts + bonus), prior included
    double ms_sum;       // decayed cost-curve ms spent for them, prior included
    long n_steps;        // observed steps
} sd_step_sizer;

// c: the target's measured curve (>= 1 point; copied), or NULL for the
// built-in relative curve (1 node = 1; 2: 1.15, 4: 1.4, 8: 2, 16: 3.5, 32:
// 6.5: between the shapes measured for a 135M model on 2 cores, where a
// second node cost 4% to 30% of a forward). The rate starts at plain
// decoding's, 1 / verify_ms(1), worth 4 steps.
void sd_step_sizer_init(sd_step_sizer *z, const sd_cost_curve *c);
// Forgets the rate (back to plain decoding's); keeps the curve.
void sd_step_sizer_reset(sd_step_sizer *z);
// Tokens per ms that the objective charges (the running rate).
double sd_step_sizer_rate(const sd_step_sizer *z);
// f[0..m): path probabilities of the candidates in the order they would be
// taken (descending, each after its parent). Returns k in 0..m, the number
// to take; *gain (may be NULL) gets the objective's value of k minus that of 0.
// Ties go to the smaller k.
int sd_step_sizer_choose(const sd_step_sizer *z, const double *f, int m, double *gain);
// After a verified step of n_nodes nodes (root included) that emitted
// n_tokens tokens: updates the rate (charged at verify_ms(n_nodes) of the
// curve, so timing noise does not reach it) and, with a measured curve,
// refines the curve with the timed forward ms (see sd_cost_curve_observe;
// ms <= 0, not timed, and ms below half the curve's estimate, which cannot be
// a forward of the measured target, are ignored).
void sd_step_sizer_observe(sd_step_sizer *z, int n_nodes, int n_tokens, double ms);

// ---------------------------------------------------------------- the bundle
typedef struct sd_tree_auto_params {
    sd_tree_opt_params opt;  // search limits
    int n_rank, n_depth;     // statistics shape (see sd_accept_stats_init); default 4, 8
    double decay;            // statistics decay; default 0.99
    int reopt_every;         // re-optimise after this many observed steps; default 16 (0 = never)
    int refine_cost;         // 1: refine the cost curve from observed verification times; default 1
} sd_tree_auto_params;

sd_tree_auto_params sd_tree_auto_default_params(void);

typedef struct sd_tree_auto {
    sd_tree_auto_params p;   // as given to sd_tree_auto_new
    sd_accept_stats stats;   // acceptance by (depth, rank), updated by sd_tree_auto_observe
    sd_cost_curve cost;      // fill it (measure / set / from_json, set_draft) before optimising
    sd_accept_table table;   // the table of the last optimisation
    sd_tree_shape shape;     // the current choice
    sd_tree_opt_ws *ws;      // owned DP tables
    int steps_since_opt;     // observed steps since the last optimisation
} sd_tree_auto;

// Allocates the bundle (the only allocation); p == NULL uses the defaults.
// The shape starts as a chain of min(4, max_depth, max_nodes - 1) draft
// tokens until the cost curve is set and sd_tree_auto_optimise runs.
int sd_tree_auto_new(sd_tree_auto **out, const sd_tree_auto_params *p, char *err, size_t errlen);
void sd_tree_auto_free(sd_tree_auto *a);
// Re-runs the optimiser on the current statistics and cost curve.
int sd_tree_auto_optimise(sd_tree_auto *a, char *err, size_t errlen);
// After each verification step: records the accepted path (path[0..n_path),
// path[0] == 0, as the verifier returns it), refines the cost model with
// draft_ms (the drafter's propose time for this tree) and verify_ms (the timed
// target forward of tree->n nodes) when refine_cost (either <= 0: not
// used), and re-optimises every reopt_every steps. Returns 1 if the shape
// changed, 0 if not, <0 on error (a path that is not a chain of the tree).
int sd_tree_auto_observe(sd_tree_auto *a, const sd_tree *tree, const int32_t *path, int n_path,
                         double draft_ms, double verify_ms, char *err, size_t errlen);

#endif

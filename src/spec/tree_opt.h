// tree_opt.h - hardware-aware tree shapes (after Sequoia, arXiv 2402.12374).
//
// Two parts, usable separately or through the sd_tree_auto bundle below,
// which ties them to the target's cost curve (cost_curve.h). Drafters whose
// evidence varies from step to step size each step's tree instead
// (tree_sizer.h).
//
//  1. sd_accept_stats: how often the child of sibling rank r at depth d was
//     accepted given that its parent was accepted (Sequoia's positional
//     acceptance vector p_r, here optionally per depth), with Beta-style
//     pseudo-counts so early estimates are sane and exponential decay so the
//     estimate follows the text.
//  2. sd_tree_opt: Sequoia's dynamic program. Under the positional-acceptance
//     assumption the expected number of tokens a step emits (accepted drafts +
//     the bonus token) is the sum over the tree's nodes of the probability that
//     the root-to-node path is accepted = the product of p[depth][rank] along
//     the path (the root counts 1). For every node budget n and depth limit L
//     the DP finds the tree of greatest expected length; the optimiser returns
//     the (n, L) tree maximising expected tokens per second,
//     E[tokens] / (draft_ms(tree) + verify_ms(n)) under the cost curve of
//     cost_curve.h.
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
#ifndef SD_TREE_OPT_H
#define SD_TREE_OPT_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "spec/cost_curve.h"
#include "spec/tree.h"

#define SD_TA_MAX_RANK 8      // sibling ranks tracked / used by the optimiser
#define SD_TA_MAX_DEPTH 32    // draft depths (root excluded) tracked / searched

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

// ---------------------------------------------------------------- 2. optimiser
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
// = rank order; with g->race the k best by race score, tree.h; only the
// entries of g->support are read when it is given), k = its children in
// the shape. The tree must hold only the
// root and have room for the shape's nodes and a dist row per expanded node.
// Nodes whose distribution has fewer than k positive tokens get fewer
// children (and their missing subtrees are skipped). Children are
// SD_CHILDREN_ANY. Returns 0 or <0 with a message.
int sd_tree_grow_shape(sd_tree *t, const sd_tree_shape *s, const sd_tree_grow *g, char *err, size_t errlen);

// ---------------------------------------------------------------- the bundle
typedef struct sd_tree_auto_params {
    sd_tree_opt_params opt;  // search limits
    int n_rank, n_depth;     // statistics shape (see sd_accept_stats_init); default 4, 8
    double decay;            // statistics decay; default 0.99
    int reopt_every;         // re-optimise after this many observed steps; default 16 (0 = never); also
                             // after the bundle's steps 4 and 8 (a short text is over before the 16th)
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
    long steps;              // observed steps in all
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

// tree_sizer.h - per-step tree sizing.
//
// Sequoia's tree (tree_opt.h) is one shape for every step, right when every step
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
// measured: the target's cost curve (cost_curve.h; flat parts such as verify_ms(2)
// ~ verify_ms(1) make small drafts almost free, and the rule takes them) and
// the acceptance of each kind of evidence (sd_class_stats below).
//
// None of these functions allocate; none print.
#ifndef SD_TREE_SIZER_H
#define SD_TREE_SIZER_H

#include "spec/cost_curve.h"

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

#endif

// draft_model.h - drafters built on a smaller language model (its own
// sd_session), and a drafter that merges the trees of several drafters.
#ifndef SD_DRAFT_MODEL_H
#define SD_DRAFT_MODEL_H

#include "draft/drafter.h"
#include "spec/tree_opt.h"

enum sd_draft_shape {
    SD_DRAFT_CHAIN = 0,    // up to k tokens in a row
    SD_DRAFT_WIDTHS = 1,   // SpecInfer expansion: widths[d] children per node at depth d
    SD_DRAFT_DYNAMIC = 2,  // EAGLE-2: expand the dyn_b best nodes per depth for dyn_d depths, keep dyn_m nodes
    SD_DRAFT_AUTO = 3,     // hardware-aware tree (tree_opt.h): the shape follows the measured
                           // acceptance and cost; needs tree_auto.on and tree_auto.cost
};

// Called when an automatically sized tree is chosen for the first time and
// whenever the choice changes (the library never prints; tools do).
typedef void (*sd_tree_auto_report_fn)(void *user, const sd_tree_shape *shape);

// Automatic tree sizing for a drafter (tree_opt.h): the drafter keeps its own
// sd_tree_auto bundle (statistics of its accepted paths, a copy of the
// target's cost curve refined online) and drafts the tree the optimiser
// chooses. Timing: the drafter's propose is timed (draft_ms); the target's
// verification time is the wall time between the end of propose and the
// start of accept (the target forward plus verification).
typedef struct sd_draft_auto_params {
    int on;                         // 1: size trees automatically; default 0
    const sd_cost_curve *cost;      // the target's cost curve, at least one point (copied at creation);
                                    // required when on
    int max_nodes;                  // most tree nodes, root included, 2..SD_TA_MAX_NODES; default 32
    int max_depth;                  // most draft depth, 1..SD_TA_MAX_DEPTH; default 12
    int reopt_every;                // re-optimise after this many steps; default 16
    sd_tree_auto_report_fn report;  // or NULL
    void *user;                     // for report
    double draft_ms_per_depth;      // the drafter's cost model to start from (sd_cost_curve's
    double draft_ms_per_node;       // fields, ms); both 0 (default): learnt online from 0
} sd_draft_auto_params;

sd_draft_auto_params sd_draft_auto_default_params(void);

// The sizing state a drafter embeds (used by draft_model.c and draft_ngram.c).
typedef struct sd_draft_auto sd_draft_auto;
// Creates it (the only allocation): optimises the first shape from the
// statistics' prior and the cost curve and reports it. Returns 0 or <0.
int sd_draft_auto_new(sd_draft_auto **out, const sd_draft_auto_params *p, char *err, size_t errlen);
void sd_draft_auto_free(sd_draft_auto *a);
// At the start of propose: the shape to draft now (records the time). While
// the choice is not to draft (n == 1), every 8th step drafts one token (a
// probe) so that changed acceptance can change the choice.
const sd_tree_shape *sd_draft_auto_begin(sd_draft_auto *a);
// At the end of propose (records the time: draft_ms).
void sd_draft_auto_end(sd_draft_auto *a);
// At the start of accept: observes the verified path (verify_ms = now - end
// of propose), re-optimises when due and reports a changed shape. Returns 0
// or <0 with a message (a path that is not a chain of the tree).
int sd_draft_auto_accept(sd_draft_auto *a, const sd_tree *tree, const int32_t *path, int n_path, char *err,
                         size_t errlen);
// New sequence: forgets a pending timing (statistics and cost model are kept:
// they describe the model pair and the machine, not one text).
void sd_draft_auto_reset(sd_draft_auto *a);
// The current shape (for tools and tests).
const sd_tree_shape *sd_draft_auto_shape(const sd_draft_auto *a);

#define SD_DRAFT_MAX_WIDTHS 16

typedef struct sd_draft_model_params {
    int shape;                        // enum sd_draft_shape; default SD_DRAFT_CHAIN
    int k;                            // chain: most draft tokens; default 5
    float p_min;                      // chain/widths: a node whose top draft probability is below
                                      // p_min gets no children; default 0 (off)
    int widths[SD_DRAFT_MAX_WIDTHS];  // widths: children per node at depth d; default {2, 2, 1, 1}
    int n_widths;                     // entries of widths used; default 4
    int dyn_b, dyn_d, dyn_m;          // dynamic: expanded nodes per depth, depths, nodes kept
                                      // (root included); default 4, 5, 16
    int n_ctx;                        // draft KV cache in tokens; 0 = the session default
                                      // (min(n_ctx_train, 4096)). Text beyond it is not drafted for
    int n_threads;                    // 0 = number of online cores (ignored with share_threads)
    const sd_session *share_threads;  // run on this session's worker threads (the target's: the two
                                      // take turns); NULL = own threads. Default NULL
    // Adaptive drafting (chain and widths trees): p_min follows the running
    // acceptance (sd_draft_adapt_p_min below). p_min is the starting value.
    int adapt;                        // 1: adapt p_min after every step; default 0 (fixed p_min)
    float p_min_lo, p_min_hi;         // bounds of the adapted p_min; default 0.05, 0.95
    float p_min_up, p_min_down;       // raise after a rejection / lower after full acceptance;
                                      // default 0.05, 0.02
    // Self-speculation: the draft session skips these layers of the draft
    // model (usually the target itself, sharing its weights). NULL = none.
    const uint8_t *layer_skip;        // (draft n_layer) nonzero = skipped; copied at creation
    // SD_DRAFT_AUTO: the automatic tree's settings (tree_auto.on is implied by the shape).
    sd_draft_auto_params tree_auto;
} sd_draft_model_params;

// The adaptation rule of p_min (params.adapt), applied after each verified
// step in which the drafter proposed a tree of depth n_proposed and the
// verifier accepted n_accepted draft tokens:
//   - n_proposed > 0 and n_accepted < n_proposed (a draft token was rejected):
//     p_min += p_min_up: drafting stops earlier, fewer wasted draft forwards;
//   - otherwise (everything proposed was accepted, or nothing was proposed
//     because the first top probability was already below p_min):
//     p_min -= p_min_down: drafting continues further next time;
//   then clamped to [p_min_lo, p_min_hi]. In equilibrium a fraction
//   down / (up + down) of the steps sees a rejection (2/7 with the defaults).
// Shared by the drafter and the layer-skip search's simulation.
static inline float sd_draft_adapt_p_min(float p_min, int n_proposed, int n_accepted, const sd_draft_model_params *p) {
    if (n_proposed > 0 && n_accepted < n_proposed) p_min += p->p_min_up;
    else p_min -= p->p_min_down;
    if (p_min < p->p_min_lo) p_min = p->p_min_lo;
    if (p_min > p->p_min_hi) p_min = p->p_min_hi;
    return p_min;
}

sd_draft_model_params sd_draft_model_default_params(void);

// Checks that the draft's vocabulary agrees with the target's: the token
// strings of every id the draft knows must be equal; a target vocabulary that
// is merely longer (padded) is accepted. Returns 0, or <0 with a message
// naming the first differing id and both strings.
int sd_draft_vocab_check(const sd_model *draft, const sd_model *target, char *err, size_t errlen);

// Creates a drafter that runs the model draft (shared, not owned; it must
// outlive the drafter) in a session of its own, whose KV cache follows the
// accepted text: accepted draft rows are committed, the others dropped, and
// only text it has not seen is evaluated. In stochastic mode its tree nodes
// are sampled from the draft's distribution after the same sampler transform
// as the target's (chain and width trees); the dynamic tree always uses
// top-k children. Fails on a vocabulary mismatch (sd_draft_vocab_check).
int sd_draft_model_new(sd_drafter **out, const sd_model *draft, const sd_model *target,
                       const sd_draft_model_params *p, char *err, size_t errlen);

// Creates a drafter that asks each of subs[0..n_subs) for a tree and merges
// them (union by token path, SpecInfer). Takes ownership of the sub-drafters
// (freed with it, also when creation fails). n_vocab: the target's.
int sd_draft_merge_new(sd_drafter **out, sd_drafter **subs, int n_subs, int n_vocab, char *err,
                       size_t errlen);

#endif

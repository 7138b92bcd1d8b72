// draft_model.h - the drafter built on a smaller language model (its own
// sd_session); its trees are chains, SpecInfer widths, EAGLE-2 dynamic trees
// or automatically sized ones (draft_auto.h). Several drafters' trees are
// merged by draft_merge.h.
#ifndef SD_DRAFT_MODEL_H
#define SD_DRAFT_MODEL_H

#include "draft/drafter.h"
#include "draft/draft_auto.h"

enum sd_draft_shape {
    SD_DRAFT_CHAIN = 0,    // up to k tokens in a row
    SD_DRAFT_WIDTHS = 1,   // SpecInfer expansion: widths[d] children per node at depth d
    SD_DRAFT_DYNAMIC = 2,  // EAGLE-2: expand the dyn_b best nodes per depth for dyn_d depths, keep dyn_m nodes
    SD_DRAFT_AUTO = 3,     // hardware-aware tree (draft_auto.h): the shape follows the measured
                           // acceptance and cost; needs tree_auto.on and tree_auto.cost
};

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
    int n_threads;                    // 0 = number of online cores (ignored with pool)
    sd_threadpool *pool;              // run on this pool (the target's: the two
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

// Grows tree from its root by p's shape (chain of p->k, widths, EAGLE-2
// dynamic with work as scratch, or the automatic tree's shape) with g's
// distributions, within max_nodes (already in g); who names the drafter in
// the message of an unknown shape. Shared by the drafters that take
// sd_draft_model_params (draft models, EAGLE-3 and MoA heads).
int sd_draft_grow(sd_tree *tree, const sd_draft_model_params *p, sd_tree *work, const sd_tree_shape *shape,
                  const sd_tree_grow *g, const char *who, char *err, size_t errlen);

#endif

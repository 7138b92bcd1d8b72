// draft_model.h - drafters built on a smaller language model (its own
// sd_session), and a drafter that merges the trees of several drafters.
#ifndef SD_DRAFT_MODEL_H
#define SD_DRAFT_MODEL_H

#include "../drafter.h"

enum sd_draft_shape {
    SD_DRAFT_CHAIN = 0,    // up to k tokens in a row
    SD_DRAFT_WIDTHS = 1,   // SpecInfer expansion: widths[d] children per node at depth d
    SD_DRAFT_DYNAMIC = 2,  // EAGLE-2: expand the dyn_b best nodes per depth for dyn_d depths, keep dyn_m nodes
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
    int n_threads;                    // 0 = number of online cores
} sd_draft_model_params;

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

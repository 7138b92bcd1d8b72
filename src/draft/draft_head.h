// draft_head.h - the pieces the head drafters (EAGLE-3, MoA) share: their
// parameters checked and the context sized, a draft-vocabulary logit row made
// a distribution over the target's vocabulary, and a tree node's history.
#ifndef SD_DRAFT_HEAD_H
#define SD_DRAFT_HEAD_H

#include "draft/draft_model.h"
#include "head/head.h"

// p (NULL: the defaults) checked for a head drafter whose trees hold at most
// tree_max nodes, into *dp; *n_ctx = p's context, else the target's training
// context capped at 4096. who names the drafter in the message. 0, or <0.
int sd_draft_head_params(const char *who, const sd_draft_model_params *p, const sd_model *target, int tree_max,
                         sd_draft_model_params *dp, int *n_ctx, char *err, size_t errlen);

// The distribution row (nv floats) of draft logits lg (h's draft vocabulary):
// through the sampler's transforms over the history when stochastic and smp
// is set (in time for the draft vocabulary, not nv), else the head's greedy
// mapping.
void sd_draft_head_dist(const sd_head *h, sd_sampler *smp, int stochastic, const float *lg, int nv,
                        const int32_t *hist, int n_hist, float *row);

// The text up to tree node `node` (the context's tokens, then the node's
// ancestors and itself) into hist; returns its length.
int sd_draft_node_hist(const sd_draft_ctx *ctx, const sd_tree *t, int node, int32_t *hist);

#endif
